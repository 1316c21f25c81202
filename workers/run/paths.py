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
(`workers.model.loading.model_dir_problem`: weights, a causal LM, a tokenizer that fits it), and
a Hub model must be reachable: refused here, at launch, rather than minutes into a run.

This is the one check of every path and Hub id a config names (`model.path`,
`model.hub_id`, `rewards.model_path`, `task.dataset.path` and `eval_path`,
`sync.directory`; a simulation's `cluster.model` through `shape_source`; a resume's
checkpoint through workers/run/checkpoints.py's `check_resume`, under `checkpoint_root`). A
relative path is refused, never resolved against the process's working directory; an
`owner/name` value of a field that takes a Hub id is the Hub's, its owner held to
`hub_owners`, and the web process asks the Hub for metadata only (workers/core/hub.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workers.core.hub import HubRefused, is_repo_id, metadata_dir, owner_problem, repo_info
from workers.model.loading import hub_problem, model_dir_problem
from workers.rollout.task_data import dataset_errors, hub_metadata_errors, is_hub_id

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig


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
    naming the config `field` and the operator `setting` that lists the roots.

    A relative path is refused, never resolved against the process's working directory.
    A refusal says the same of a path that exists and of one that does not, and never
    where a path outside the roots resolves to: it tells nothing about the host."""
    roots = [r for r in roots if r]
    if not roots:
        raise PathNotAllowed(
            field,
            f"{path!r} is not allowed: no directory is allowed here on this site ({setting} is empty); "
            f"ask the operator to add a root to {setting}, or leave {field} unset",
        )
    listed = ", ".join(sorted(real(r) for r in roots))
    if not os.path.isabs(os.path.expanduser(path)):
        raise PathNotAllowed(
            field, f"{path!r} is not an absolute path: give the full path of a directory under {setting} ({listed})"
        )
    resolved = real(path)
    if not any(is_under(resolved, root) for root in roots):
        raise PathNotAllowed(field, f"{path!r} is outside the allowed roots ({setting}: {listed})")
    return resolved


def names_hub_repo(value: str) -> bool:
    """Whether a field that takes a local path or a Hub id (`rewards.model_path`,
    `cluster.model`) names a Hub repository: `owner/name`, not absolute, not `~` or `.`-led."""
    return not value.startswith(("/", "~", ".")) and is_repo_id(value)


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
    cluster (empty: runs write none; workers/run/checkpoints.py). `log_root`: where each
    run's driver appends its log, run-<id>.log (empty: only Ray's logs hold it).
    `hub_owners`: the Hugging Face Hub owners whose models, reward models and datasets
    a run may name (ROLLWAY_HUB_OWNERS; empty: any)."""

    model_roots: tuple[str, ...] = ()
    sync_roots: tuple[str, ...] = ()
    scratch_root: str = field(default="")
    export_root: str = field(default="")
    data_roots: tuple[str, ...] = ()
    checkpoint_root: str = field(default="")
    log_root: str = field(default="")
    hub_owners: tuple[str, ...] = ()

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
        hub_owners: Sequence[str] = (),
    ) -> Confinement:
        return cls(
            tuple(model_roots),
            tuple(sync_roots),
            scratch_root,
            export_root,
            tuple(data_roots),
            checkpoint_root,
            log_root,
            tuple(hub_owners),
        )

    def errors(self, cfg: RunConfig, *, read_data: bool = False) -> dict[str, str]:
        """{dotted field: message} for each path or Hub id in `cfg` that escapes its
        roots or the Hub owners allowed, a model directory a run cannot use, or a Hub
        repository that cannot serve it. Nothing outside the roots is opened, and no Hub
        repository of an owner not allowed is asked about. A Hub dataset is checked by
        its metadata only, unless `read_data` (a run's driver, reading within the Hub
        bounds). A Hub that does not answer raises workers.core.hub.HubUnavailable."""
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
            problem = owner_problem(cfg.model.hub_id, self.hub_owners, "model.hub_id") or hub_problem(cfg.model.hub_id)
            if problem:
                errors["model.hub_id"] = problem
        if cfg.rewards.model_path is not None:
            problem = self.reward_model_problem(cfg.rewards.model_path)
            if problem:
                errors["rewards.model_path"] = problem
        if cfg.sync.directory is not None:
            try:
                confine(cfg.sync.directory, self.sync_roots, "sync.directory", "ROLLWAY_SYNC_ROOTS")
            except PathNotAllowed as exc:
                errors[exc.field] = exc.message
        # The rows are checked against the model (its tokenizer, the split it was trained
        # on): a refused model is never read for that, so only the dataset's paths are.
        model_refused = "model.path" in errors or "model.hub_id" in errors
        errors.update(self.dataset_errors(cfg, read_data=read_data, read_model=not model_refused))
        return errors

    def reward_model_problem(self, value: str) -> str | None:
        """Why `rewards.model_path` cannot be the run's reward model, or None: a Hub id
        of an owner allowed that the Hub knows as a model with a config (metadata only),
        or a directory under the model roots holding one."""
        field = "rewards.model_path"
        if names_hub_repo(value):
            problem = owner_problem(value, self.hub_owners, field)
            if problem:
                return problem
            try:
                info = repo_info(value, field)
            except HubRefused as exc:
                return exc.message
            if "config.json" not in [s.rfilename for s in info.siblings or []]:
                return f"{value!r} on the Hub is not a Hugging Face model (no config.json in it)"
            return None
        try:
            path = confine(value, self.model_roots, field, "ROLLWAY_MODEL_ROOTS")
        except PathNotAllowed as exc:
            return exc.message
        if not os.path.isfile(os.path.join(path, "config.json")):
            return f"{value!r} is not a Hugging Face model directory (no config.json in it)"
        return None

    def shape_source(self, value: str, field: str) -> str:
        """A local directory holding the config.json of the model `value` names (a Hub
        id of an owner allowed, only its config fetched; or a directory under the model
        roots), for reading a model's shape; PathNotAllowed or HubRefused naming `field`
        otherwise, HubUnavailable when the Hub does not answer."""
        if names_hub_repo(value):
            problem = owner_problem(value, self.hub_owners, field)
            if problem:
                raise HubRefused(field, problem)
            return metadata_dir(value, field, files=("config.json",))
        return confine(value, self.model_roots, field, "ROLLWAY_MODEL_ROOTS")

    def dataset_errors(self, cfg: RunConfig, *, read_data: bool = False, read_model: bool = True) -> dict[str, str]:
        """{field: message} for a dataset path outside the data roots, a Hub dataset of
        an owner not allowed, or (once every path is allowed) data the run cannot use:
        unreadable, a missing column or split, rows the model cannot take. A Hub
        dataset's columns and splits are those its metadata declares, unless `read_data`."""
        ds = cfg.task.dataset
        if ds is None:
            return {}

        errors: dict[str, str] = {}
        for name, path in (("task.dataset.path", ds.path), ("task.dataset.eval_path", ds.eval_path)):
            if path is None:
                continue
            if name == "task.dataset.path" and is_hub_id(path):
                problem = owner_problem(path, self.hub_owners, name)
                if problem:
                    errors[name] = problem
                continue  # read from the Hub, never from a local directory of that name
            try:
                confine(path, self.data_roots, name, "ROLLWAY_DATA_ROOTS")
            except PathNotAllowed as exc:
                errors[exc.field] = exc.message
        if errors or not read_model:
            return errors  # never open a file outside the roots, nor ask the Hub about a refused owner

        if is_hub_id(ds.path) and not read_data:
            return hub_metadata_errors(cfg)
        return dataset_errors(cfg)

    def check(self, cfg: RunConfig) -> None:
        """Raise PathNotAllowed for the first path of `cfg` that is not allowed (a run's
        driver: a Hub dataset is read, within the Hub bounds, to be checked)."""
        for name, message in self.errors(cfg, read_data=True).items():
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
