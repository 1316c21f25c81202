"""Confinement: every path a run's config names resolves under a root the operator allowed.

A run config is hostile input: whoever can launch a run could otherwise make the
cluster read any directory it can see (`model.path`, `task.dataset.path`) or write into any it can write
(`sync.directory`). So a path is resolved the way the OS will follow it — symlinks and
`..` included, `os.path.realpath` — and must then lie under one of the roots the
operator allowed for that field. The platform checks at launch (the user gets a 400
naming the field); the driver checks again before it uses a path, since a symlink can
change between the two.

A run's own temporary files (filesystem-sync versions, vLLM's weight staging, LoRA
adapter directories) all go under one scratch directory per run,
`<scratch_root>/run-<id>`, which the driver creates and removes however the run ends;
the platform's reconcile removes it for a run whose driver died. What a run leaves for
people, its exported model, goes to `<export_root>/run-<id>` and stays.

A model directory under an allowed root must also be one a run can use
(`workers.model.model_dir_problem`: weights, a causal LM, a tokenizer that fits it), and
a Hub model must be reachable: refused here, at launch, rather than minutes into a run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workers.model import hub_problem, model_dir_problem

if TYPE_CHECKING:
    from workers.config import RunConfig


class PathNotAllowed(ValueError):
    """A config path outside its allowed roots; `field` is its dotted config name."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def real(path: str) -> str:
    """`path` as the OS resolves it: absolute, symlinks followed, `..` removed."""
    return os.path.realpath(os.path.expanduser(path))


def is_under(path: str, root: str) -> bool:
    """Whether real `path` is `root` or inside it (both resolved)."""
    path, root = real(path), real(root)
    return os.path.commonpath([path, root]) == root


def confine(path: str, roots: Iterable[str], field: str, setting: str) -> str:
    """The resolved `path` if it lies under one of `roots`; PathNotAllowed otherwise,
    naming the config `field` and the operator `setting` that lists the roots."""
    roots = [r for r in roots if r]
    if not roots:
        raise PathNotAllowed(
            field,
            f"{path!r} is not allowed: no directory is allowed here on this site ({setting} is empty); "
            f"ask the operator to add a root to {setting}, or leave {field} unset",
        )
    resolved = real(path)
    if not any(is_under(resolved, root) for root in roots):
        listed = ", ".join(sorted(real(r) for r in roots))
        raise PathNotAllowed(
            field, f"{path!r} resolves to {resolved!r}, outside the allowed roots ({setting}: {listed})"
        )
    return resolved


@dataclass(frozen=True)
class Confinement:
    """Where a run may read and write, as the operator set it up.

    `model_roots`: directories under which `model.path` may point (a Hugging Face model
    directory). `sync_roots`: directories under which `sync.directory` may point (empty:
    the field must stay unset, and filesystem sync writes into the run's scratch).
    `scratch_root`: where each run's scratch directory is made. `export_root`: where
    each successful run's model is exported (empty: runs export nothing). `data_roots`:
    directories under which `task.dataset.path` and `eval_path` may point.
    `checkpoint_root`: where runs write their checkpoints and the only place a run may
    be resumed from, a directory or an fsspec URL such as `s3://bucket/prefix` for a
    cluster (empty: runs write none; workers/checkpoints.py). `log_root`: where each
    run's driver appends its log, run-<id>.log (empty: only Ray's logs hold it)."""

    model_roots: tuple[str, ...] = ()
    sync_roots: tuple[str, ...] = ()
    scratch_root: str = field(default="")
    export_root: str = field(default="")
    data_roots: tuple[str, ...] = ()
    checkpoint_root: str = field(default="")
    log_root: str = field(default="")

    @classmethod
    def from_lists(
        cls,
        model_roots: Sequence[str],
        sync_roots: Sequence[str],
        scratch_root: str,
        export_root: str = "",
        data_roots: Sequence[str] = (),
        checkpoint_root: str = "",
        log_root: str = "",
    ) -> Confinement:
        return cls(
            tuple(model_roots),
            tuple(sync_roots),
            scratch_root,
            export_root,
            tuple(data_roots),
            checkpoint_root,
            log_root,
        )

    def errors(self, cfg: RunConfig) -> dict[str, str]:
        """{dotted field: message} for each path in `cfg` that escapes its roots, a
        model directory a run cannot use, or a Hub model that cannot be fetched."""
        errors: dict[str, str] = {}
        if cfg.model.source == "path" and cfg.model.path:
            try:
                path = confine(cfg.model.path, self.model_roots, "model.path", "ROLLWAY_MODEL_ROOTS")
            except PathNotAllowed as exc:
                errors[exc.field] = exc.message
            else:
                problem = model_dir_problem(path)
                if problem:
                    errors["model.path"] = f"{cfg.model.path!r} {problem}"
        if cfg.model.source == "hub" and cfg.model.hub_id:
            problem = hub_problem(cfg.model.hub_id)
            if problem:
                errors["model.hub_id"] = problem
        if cfg.sync.directory is not None:
            try:
                confine(cfg.sync.directory, self.sync_roots, "sync.directory", "ROLLWAY_SYNC_ROOTS")
            except PathNotAllowed as exc:
                errors[exc.field] = exc.message
        errors.update(self.dataset_errors(cfg))
        return errors

    def dataset_errors(self, cfg: RunConfig) -> dict[str, str]:
        """{field: message} for a dataset path outside the data roots, or (once every
        path is allowed) a file the run cannot use: unreadable, a missing column, rows
        the model cannot take."""
        ds = cfg.task.dataset
        if ds is None:
            return {}
        from workers.task_data import is_hub_id

        errors: dict[str, str] = {}
        for name, path in (("task.dataset.path", ds.path), ("task.dataset.eval_path", ds.eval_path)):
            if path is None or (name == "task.dataset.path" and is_hub_id(path)):
                continue  # a Hub dataset is read from the Hub or the datasets cache, no local path
            try:
                confine(path, self.data_roots, name, "ROLLWAY_DATA_ROOTS")
            except PathNotAllowed as exc:
                errors[exc.field] = exc.message
        if errors:
            return errors  # never open a file outside the roots
        from workers.task_data import dataset_errors

        return dataset_errors(cfg)

    def check(self, cfg: RunConfig) -> None:
        """Raise PathNotAllowed for the first path of `cfg` that is not allowed."""
        for name, message in self.errors(cfg).items():
            raise PathNotAllowed(name, message)

    def scratch_dir(self, run_id: int) -> str:
        """The run's scratch directory (not created here)."""
        if not self.scratch_root:
            raise ValueError("Confinement.scratch_root is not set: a run needs a scratch directory")
        return os.path.join(self.scratch_root, f"run-{run_id}")

    def export_dir(self, run_id: int) -> str | None:
        """Where the run's final model is exported (not created here); None when this
        site keeps no exports."""
        if not self.export_root:
            return None
        return os.path.join(self.export_root, f"run-{int(run_id)}")

    def log_file(self, run_id: int) -> str | None:
        """The file the run's driver appends its log to; None when this site keeps none."""
        if not self.log_root:
            return None
        return os.path.join(self.log_root, f"run-{int(run_id)}.log")


def make_scratch(path: str) -> str:
    """Create a run's scratch directory (owner-only) and return it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def remove_scratch(path: str) -> bool:
    """Remove a run's scratch directory and everything in it; True if it existed."""
    if not os.path.isdir(path):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.exists(path)
