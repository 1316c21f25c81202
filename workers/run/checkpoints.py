"""Checkpoints: a run's whole training state in one directory per step, and resume.

A checkpoint of run `id` at step k lives in `<checkpoint_root>/run-<id>/step-<k:08d>/`,
which is also a Hugging Face model directory (`AutoModelForCausalLM.from_pretrained`
loads it; the resume reads the weights back the same way):

    config.json, generation_config.json, model.safetensors (or shards and
    model.safetensors.index.json), tokenizer.json, tokenizer_config.json
                    the policy the trainer computes, as `save_pretrained` writes it (a
                    tied weight once; with LoRA the adapter merged into the base)
    base/           with LoRA only: the frozen base, a model directory of its own
    adapter/        with LoRA only: the adapter in peft's format, its
                    `base_model_name_or_path` the base/ beside it
                    (`PeftModel.from_pretrained(base, "<step>/adapter")`); the resume
                    reads base/ and adapter/
    optimizer.pt    the AdamW state (a single trainer's or a ddp pool's)
    sharded/        an fsdp2 pool's model and AdamW state instead: torch.distributed
                    .checkpoint's directory (`.metadata`, and `__<rank>_0.distcp` as each
                    rank wrote its own shards), which any number of ranks, or a single
                    trainer, reads back (DCP reshards on load)
    trainer.pt      the trainer's progress (TrainerProgress.state_dict: policy version
                    k, its step-plan RNG, the torch RNG states) and its cumulative
                    starved seconds
    inference.json  each inference worker's state_dict: its prompt-sampler RNG, call
                    counter (it seeds sampling), policy version, last eval pass,
                    partial-rollout counts, for a dataset its row order and position,
                    and its part of the prompt ledger (rows drawn, rows in flight)
    buffer.json     the RolloutBuffer's state_dict: the groups waiting (the trainer's
                    prefetched batch first), stale groups awaiting regeneration, the
                    counters behind the buffer metrics
    rollway_split.json  for a dataset: the split the run trained on (workers/rollout/task_data.py);
                    a resume that would hold out other rows of the same data is refused
    meta.json       {run_id, step, created, bytes, sha256, files, model_files}: written
                    last, so a directory without it is incomplete and never listed or
                    resumed; `model_files` names the model directory's files

A checkpoint written before the weights were a model directory holds them in model.pt
(the model's state_dict through torch.save); it still resumes.

Each stateful part says what its state is (`state_dict` / `load_state_dict`); this module
composes them into files, and holds the trainer's weights and optimizer state: a ddp
pool's rank 0 holds them whole and writes them (`training_state`); an fsdp2 pool's
ranks each write their shards, and rank 0 the model files streamed a safetensors shard
at a time (`write_shards`), so no rank holds the whole model. A local checkpoint root
is then one filesystem every rank of the pool writes to; to an object store each rank
uploads its own files.

`checkpoint_root` is a local directory or an fsspec URL (`s3://bucket/prefix`,
`memory://…` in tests): everything goes through fsspec. Locally the step is written
under a temporary name and renamed, so a crash leaves no directory that looks whole;
an object store has no rename, and there meta.json last is what marks it complete.
`sha256` digests the manifest (each file's name, size and sha256, by name): equal
digests mean identical checkpoints, and a resume checks every file it reads against it.

Consistency. In sync mode the trainer writes after step k and before it publishes
version k's weights: every inference worker has then generated all it was admitted and
waits for version k (its RNG and call counter still), the buffer is empty, and the
trainer's prefetched `get` is settled first, so a resumed run repeats the uninterrupted
one step for step. In async mode the inference workers are generating when the trainer
writes: the rows of the groups they are generating (or putting) are in their states, in
flight (workers/run/ledger.py), and a resumed worker generates them before it draws new
ones, so no row is skipped. The resumed buffer's admission count is set from the groups
the checkpoint holds; the rows carried are admitted again as they are generated.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, cast

import fsspec
from fsspec.implementations.local import LocalFileSystem

from workers.model.loading import load_model, untied
from workers.model.tokenizer import load_tokenizer
from workers.rollout.task_data import SPLIT_FILE, load_splits, split_refusal
from workers.run.paths import PathNotAllowed, is_under, real

if TYPE_CHECKING:
    import torch

    from workers.config.run_config import RunConfig
    from workers.train.trainer import Trainer

log = logging.getLogger(__name__)

META = "meta.json"
OPTIMIZER, TRAINER, INFERENCE, BUFFER = "optimizer.pt", "trainer.pt", "inference.json", "buffer.json"
# The part that is the step directory's Hugging Face model files (a `PolicyFiles`).
POLICY = "policy"
ADAPTER = "adapter"
# With LoRA: the frozen base the adapter applies to, a model directory of its own.
BASE = "base"
# Where the weights were before the step directory was a model directory.
LEGACY_MODEL = "model.pt"
# An fsdp2 pool's model and optimizer state: torch.distributed.checkpoint's directory,
# each rank's shards in files of its own plus the global `.metadata`.
SHARDED = "sharded"
STEP_DIR = re.compile(r"^step-(\d{8,})$")
# Read and hash in pieces of this size: a multi-GB weights file never sits twice in memory.
CHUNK = 16 << 20


# The object stores a checkpoint root may name: fsspec's protocol → (the package that is
# its filesystem, the extra of pyproject.toml that installs it).
STORES = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs")}


class StoreNotInstalled(RuntimeError):
    """A checkpoint location in an object store whose fsspec filesystem this process lacks."""


def store_problem(location: str) -> str | None:
    """Why this process cannot read or write checkpoints at `location`, or None: an
    object store whose filesystem package is not installed (the message names the extra
    that installs it), or a protocol fsspec does not know."""
    if not is_url(location):
        return None
    protocol = location.partition("://")[0]
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError:
        package, extra = STORES.get(protocol, (f"fsspec's {protocol} filesystem", ""))
        fix = (
            f"pip install 'rollway[{extra}]' ('.[cpu,{extra}]' in a checkout; the image: "
            f"docker build --build-arg EXTRAS={extra})"
            if extra
            else "install it"
        )
        return f"checkpoint location {location!r} needs {package}, which is not installed: {fix}"
    except ValueError:
        return f"checkpoint location {location!r}: fsspec knows no protocol {protocol!r} (s3://, gs://, a local path)"
    return None


class CheckpointRefused(PathNotAllowed):
    """A `resume_from` that is outside the checkpoint root, incomplete or damaged."""

    def __init__(self, message: str) -> None:
        super().__init__("resume_from", message)


@dataclass(frozen=True)
class CheckpointTarget:
    """Where and when a run writes checkpoints: `root` (a directory or fsspec URL),
    the run's id, every `every_steps` steps (0: none periodic), `keep_last` kept."""

    root: str
    run_id: int
    every_steps: int = 0
    keep_last: int = 2

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0


@dataclass
class CheckpointRecord:
    """A completed checkpoint, as the site is told of it (`MetricsReporter.post_checkpoint`):
    `pruned` lists the locations of the run's older checkpoints deleted after it."""

    step: int
    location: str
    bytes: int
    sha256: str
    pruned: list[str] = field(default_factory=list)


# -- locations -------------------------------------------------------------------------


def is_url(location: str) -> bool:
    return "://" in location


def _join(base: str, *parts: str) -> str:
    if is_url(base):
        return "/".join([base.rstrip("/"), *parts])
    return os.path.join(base, *parts)


def _fs(location: str) -> tuple[fsspec.AbstractFileSystem, str]:
    problem = store_problem(location)
    if problem:
        raise StoreNotInstalled(problem)
    return fsspec.core.url_to_fs(location)


def run_dir(root: str, run_id: int) -> str:
    return _join(root, f"run-{int(run_id)}")


def step_dir(root: str, run_id: int, step: int) -> str:
    return _join(run_dir(root, run_id), f"step-{int(step):08d}")


def _normal(location: str) -> str:
    """A URL with `..` and repeated slashes resolved (no symlinks on an object store),
    or a local path resolved as the OS would follow it."""
    if not is_url(location):
        return real(location)
    protocol, _, path = location.partition("://")
    return f"{protocol}://{posixpath.normpath('/' + path).lstrip('/')}"


def check_resume(location: str, checkpoint_root: str) -> str:
    """The normalised `location` if it is a complete checkpoint under `checkpoint_root`;
    CheckpointRefused saying why not (no root, outside it, no meta.json)."""
    if not checkpoint_root:
        raise CheckpointRefused(
            f"{location!r} cannot be resumed: this site keeps no checkpoints (ROLLWAY_CHECKPOINT_ROOT is empty)"
        )
    if is_url(location) != is_url(checkpoint_root):
        raise CheckpointRefused(f"{location!r} is outside the checkpoint root {checkpoint_root!r}")
    if is_url(location):
        loc, root = _normal(location), _normal(checkpoint_root).rstrip("/")
        inside = loc == root or loc.startswith(root + "/")
    else:
        loc, inside = real(location), is_under(location, checkpoint_root)
    if not inside:
        # Where it resolves to is not said: a refusal tells nothing of the host beyond the root.
        raise CheckpointRefused(f"{location!r} is outside the checkpoint root {checkpoint_root!r}")
    fs, path = _fs(loc)
    if not fs.exists(posixpath.join(path, META)):
        raise CheckpointRefused(f"{location!r} is not a complete checkpoint (it has no {META})")
    return loc


# -- writing ---------------------------------------------------------------------------


class _HashingWriter:
    """A write-only file that hashes and counts what goes through it (torch.save streams
    into it, so the weights are hashed without being read back)."""

    def __init__(self, f) -> None:
        self.f, self.sha, self.bytes = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        self.sha.update(data)
        self.bytes += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


@dataclass
class PolicyFiles:
    """The trainer's weights as the step directory's Hugging Face model files: `state` is
    the model's whole state dict under its live names (gathered, for a pool), `model` the
    trainer's model (its peft wrapping and tied weights name the files' tensors),
    `model_dir` the policy directory the run started from (config, tokenizer)."""

    state: dict[str, torch.Tensor]
    model: torch.nn.Module
    model_dir: str

    def write(self, out_dir: str, location: str) -> None:
        """Write the files into the existing directory `out_dir`; `location` is where the
        checkpoint will be (the adapter's base is its base/ there)."""
        # Imported here (torch): the site's settings import this module, in processes
        # that never read weights.
        from workers.model.lora import (
            adapter_config,
            effective_live_state,
            is_peft,
            split_live_state,
            write_adapter_dir,
        )
        from workers.train.export import write_model_dir

        tokenizer = load_tokenizer(self.model_dir)
        # The policy the model computes (with LoRA: base and adapter merged), so that
        # `from_pretrained(<step>)` loads the trained model, never the untrained base.
        write_model_dir(effective_live_state(self.state, self.model), self.model_dir, tokenizer, out_dir)
        if not is_peft(self.model):
            return
        base, adapter = split_live_state(self.state)
        write_model_dir(untied(base, self.model), self.model_dir, tokenizer, os.path.join(out_dir, BASE))
        config = adapter_config(self.model)
        config["base_model_name_or_path"] = _join(location, BASE)
        write_adapter_dir(os.path.join(out_dir, ADAPTER), adapter, config)


def _file_digest(path: str) -> tuple[int, str]:
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest()


def _write_policy(fs: fsspec.AbstractFileSystem, path: str, policy: PolicyFiles, location: str) -> list[dict]:
    """Write `policy`'s files into the step directory at `path` on `fs` (locally in place,
    before any other part; elsewhere from a local temporary directory, file by file);
    their manifest entries."""
    local = isinstance(fs, LocalFileSystem)
    staging = path if local else tempfile.mkdtemp(prefix=".rollway-checkpoint-")
    try:
        policy.write(staging, location)
        files = []
        for here, _, names in os.walk(staging):
            for name in names:
                full = os.path.join(here, name)
                rel = os.path.relpath(full, staging).replace(os.sep, "/")
                size, sha = _file_digest(full)
                if not local:
                    fs.put_file(full, posixpath.join(path, rel))
                files.append({"name": rel, "bytes": size, "sha256": sha})
        return files
    finally:
        if not local:
            shutil.rmtree(staging, ignore_errors=True)


def _place_staged(fs: fsspec.AbstractFileSystem, staging: str, path: str) -> list[dict]:
    """Move every file under the local directory `staging` to the same relative name
    under `path` on `fs` (a rename locally, an upload elsewhere); their manifest entries."""
    local = isinstance(fs, LocalFileSystem)
    files = []
    for here, _, names in os.walk(staging):
        for name in names:
            full = os.path.join(here, name)
            rel = os.path.relpath(full, staging).replace(os.sep, "/")
            size, sha = _file_digest(full)
            dest = posixpath.join(path, rel)
            if local:
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                os.replace(full, dest)
            else:
                fs.put_file(full, dest)
            files.append({"name": rel, "bytes": size, "sha256": sha})
    return files


@contextmanager
def _staging(fs: fsspec.AbstractFileSystem, path: str, tag: str) -> Iterator[str]:
    """A local directory to write into before `_place_staged`: beside the files (the
    same filesystem, so placing them is a rename) or, for an object store, a temporary one."""
    staging = (
        posixpath.join(path, f".{tag}-{uuid.uuid4().hex[:8]}")
        if isinstance(fs, LocalFileSystem)
        else tempfile.mkdtemp(prefix=f".rollway-{tag}-")
    )
    os.makedirs(staging, exist_ok=True)
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_shards(trainer: Trainer, location: str, path: str) -> list[dict]:
    """Every rank of a sharded (fsdp2) pool, together: this rank's part of the step
    directory being written at `path` (for the checkpoint at `location`). Returns the
    manifest entries of the files this rank wrote.

    The model and optimizer state go through torch.distributed.checkpoint (DCP): each
    rank writes the shards it holds (`get_state_dict`'s sharded form, DTensors keyed by
    parameter name) and rank 0 the global metadata, so no rank gathers the state and a
    pool of another size reads it back (`load_shards`: DCP reshards on load). Then the
    step directory's Hugging Face model files, which only rank 0 writes: gathered a
    module at a time and written a safetensors shard at a time, the other ranks joining
    the gathers (workers/sync/weights.py)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    fs, _ = _fs(location)
    rank = dist.get_rank()
    model, optimizer = get_state_dict(trainer.model, trainer.optimizer)
    with _staging(fs, path, f"{SHARDED}-rank{rank}") as staging:
        # A directory per rank: what a rank placed is exactly what it wrote.
        dcp.save({"model": model, "optimizer": optimizer}, storage_writer=dcp.FileSystemWriter(staging))
        files = _place_staged(fs, staging, posixpath.join(path, SHARDED))
    for f in files:
        f["name"] = f"{SHARDED}/{f['name']}"
    if rank != 0:
        _follow_model_files(trainer)
        return files
    with _staging(fs, path, "model") as staging:
        _write_model_files(trainer, staging, location)
        return files + _place_staged(fs, staging, path)


def _write_model_files(trainer: Trainer, out_dir: str, location: str) -> None:
    """Rank 0 of a sharded pool: what `PolicyFiles.write` writes, streamed."""
    # Imported here (torch): the site's settings import this module, in processes
    # that never read weights.
    from workers.model.lora import adapter_config, is_peft, write_adapter_dir
    from workers.sync.weights import adapter_tensors, base_stream, effective_stream
    from workers.train.export import write_streamed_model_dir

    tokenizer, shard_mb = load_tokenizer(trainer.model_dir), trainer.cfg.sync.bucket_mb
    model = trainer.model
    write_streamed_model_dir(effective_stream(model), trainer.model_dir, tokenizer, out_dir, shard_mb)
    if not is_peft(model):
        return
    base_dir = os.path.join(out_dir, BASE)
    os.makedirs(base_dir)
    write_streamed_model_dir(base_stream(model), trainer.model_dir, tokenizer, base_dir, shard_mb)
    config = adapter_config(model)
    config["base_model_name_or_path"] = _join(location, BASE)
    write_adapter_dir(os.path.join(out_dir, ADAPTER), adapter_tensors(model), config)


def _follow_model_files(trainer: Trainer) -> None:
    """Ranks 1..: join `_write_model_files`'s gathers, in its order."""
    # Imported here (torch), as in `_write_model_files`.
    from workers.model.lora import is_peft
    from workers.sync.weights import base_stream, drain, effective_stream, follow

    drain(effective_stream(trainer.model))
    if not is_peft(trainer.model):
        return
    drain(base_stream(trainer.model))
    follow(trainer.model, "adapter")


@dataclass
class ShardedPolicy:
    """An fsdp2 pool's weights and optimizer as checkpoint files (`write_shards`), rank
    0's part. `others(location, path)` starts ranks 1..'s part and returns what waits
    for it (their files' manifest entries)."""

    trainer: Trainer
    others: Callable[[str, str], Callable[[], list[dict]]] | None = None

    def write(self, path: str, location: str) -> list[dict]:
        wait = self.others(location, path) if self.others is not None else list
        mine = write_shards(self.trainer, location, path)
        return mine + wait()


def _manifest_digest(files: list[dict]) -> str:
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f["name"]):
        h.update(f"{f['name']}\0{f['bytes']}\0{f['sha256']}\n".encode())
    return h.hexdigest()


def write_checkpoint(target: CheckpointTarget, step: int, parts: dict[str, Any]) -> CheckpointRecord | None:
    """Write `parts` ({file name: object}; `.pt` through torch.save, `.json` as JSON, a
    `PolicyFiles` as the directory's model files) as
    the checkpoint of `target.run_id` at `step`, then prune the run's older ones. None
    if a complete checkpoint of that step is there already (the run's last periodic one
    is also its end)."""
    import torch

    final = step_dir(target.root, target.run_id, step)
    fs, final_path = _fs(final)
    local = isinstance(fs, LocalFileSystem)
    if fs.exists(posixpath.join(final_path, META)):
        return None
    # Locally: a temporary sibling, renamed when whole. Elsewhere: in place, meta.json last.
    path = f"{final_path}.tmp-{uuid.uuid4().hex[:8]}" if local else final_path
    fs.makedirs(path, exist_ok=True)
    files = []
    # The policy first: locally its files are whatever the directory then holds.
    policies = (PolicyFiles, ShardedPolicy)
    for name, obj in sorted(parts.items(), key=lambda part: not isinstance(part[1], policies)):
        if isinstance(obj, PolicyFiles):
            files.extend(_write_policy(fs, path, obj, final))
            continue
        if isinstance(obj, ShardedPolicy):
            files.extend(obj.write(path, final))
            continue
        with fs.open(posixpath.join(path, name), "wb") as f:
            out = _HashingWriter(f)
            if name.endswith(".pt"):
                # torch.save writes to anything with write(), whatever its signature says.
                torch.save(obj, cast(IO[bytes], out))
            else:
                out.write(json.dumps(obj).encode())
        files.append({"name": name, "bytes": out.bytes, "sha256": out.sha.hexdigest()})
    meta: dict[str, Any] = {
        "run_id": int(target.run_id),
        "step": int(step),
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
        "bytes": sum(f["bytes"] for f in files),
        "sha256": _manifest_digest(files),
        "files": files,
        # The files that are the model directory (`Checkpoint.load_policy` reads them).
        "model_files": sorted(
            f["name"] for f in files if f["name"] not in parts and not f["name"].startswith(SHARDED + "/")
        ),
    }
    with fs.open(posixpath.join(path, META), "w") as f:
        f.write(json.dumps(meta, indent=1))
    if local:
        os.replace(path, final_path)
    pruned = prune(target.root, target.run_id, target.keep_last)
    log.info("run %s: checkpoint of step %s at %s (%s bytes)", target.run_id, step, final, meta["bytes"])
    return CheckpointRecord(step, final, meta["bytes"], meta["sha256"], pruned)


def prune(root: str, run_id: int, keep_last: int) -> list[str]:
    """Delete the run's complete checkpoints older than its `keep_last` newest, and any
    leftover of an unfinished write older than those; returns the complete ones deleted."""
    keep = list_checkpoints(root, run_id)[-keep_last:]
    if not keep:
        return []
    oldest_kept = keep[0]["step"]
    fs, base = _fs(run_dir(root, run_id))
    pruned = []
    for entry in fs.ls(base, detail=False):
        name = posixpath.basename(entry.rstrip("/"))
        m = STEP_DIR.match(name.split(".tmp-")[0])
        if not m or int(m.group(1)) >= oldest_kept:
            continue
        complete = ".tmp-" not in name and fs.exists(posixpath.join(entry, META))
        fs.rm(entry, recursive=True)
        if complete:
            pruned.append(step_dir(root, run_id, int(m.group(1))))
    return pruned


# -- reading ---------------------------------------------------------------------------


def list_checkpoints(root: str, run_id: int) -> list[dict]:
    """The complete checkpoints of run `run_id` under `root`, oldest first: each its
    meta.json plus `location` (the step directory). A step directory without meta.json
    (being written, or left by a crash) is not listed."""
    if not root:
        return []
    fs, base = _fs(run_dir(root, run_id))
    if not fs.isdir(base):
        return []
    found = []
    for entry in fs.ls(base, detail=False):
        m = STEP_DIR.match(posixpath.basename(entry.rstrip("/")))
        if not m:
            continue
        try:
            with fs.open(posixpath.join(entry, META), "r") as f:
                meta = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        found.append({**meta, "location": step_dir(root, run_id, int(m.group(1)))})
    return sorted(found, key=lambda meta: meta["step"])


def latest_checkpoint(root: str, run_id: int) -> dict | None:
    """The newest complete checkpoint of run `run_id` (as `list_checkpoints` gives it), or None."""
    found = list_checkpoints(root, run_id)
    return found[-1] if found else None


class Checkpoint:
    """One complete checkpoint opened for reading; each file is checked against the
    manifest as it is read."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.fs, self.path = _fs(location)
        try:
            with self.fs.open(posixpath.join(self.path, META), "r") as f:
                self.meta = json.load(f)
        except FileNotFoundError:
            raise CheckpointRefused(f"{location!r} is not a complete checkpoint (it has no {META})") from None
        self.step = int(self.meta["step"])
        self._files = {f["name"]: f for f in self.meta["files"]}

    def read(self, name: str) -> bytes:
        expected = self._files.get(name)
        if expected is None:
            raise CheckpointRefused(f"{self.location!r} holds no {name}")
        sha, chunks = hashlib.sha256(), []
        with self.fs.open(posixpath.join(self.path, name), "rb") as f:
            while chunk := f.read(CHUNK):
                sha.update(chunk)
                chunks.append(chunk)
        data = b"".join(chunks)
        if len(data) != expected["bytes"] or sha.hexdigest() != expected["sha256"]:
            raise CheckpointRefused(f"{self.location!r}: {name} does not match its sha256 in {META} (damaged)")
        return data

    def _check(self, name: str, local_path: str) -> None:
        size, sha = _file_digest(local_path)
        expected = self._files[name]
        if size != expected["bytes"] or sha != expected["sha256"]:
            raise CheckpointRefused(f"{self.location!r}: {name} does not match its sha256 in {META} (damaged)")

    @contextmanager
    def _local(self, names: list[str]) -> Iterator[str]:
        """A local directory holding `names`, each checked against the manifest: the step
        directory itself, or a temporary copy of them from an object store."""
        if isinstance(self.fs, LocalFileSystem):
            for name in names:
                self._check(name, posixpath.join(self.path, name))
            yield self.path
            return
        tmp = tempfile.mkdtemp(prefix=".rollway-resume-")
        try:
            for name in names:
                dest = os.path.join(tmp, *name.split("/"))
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                self.fs.get_file(posixpath.join(self.path, name), dest)
                self._check(name, dest)
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def load_policy(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The checkpoint's weights as `model`'s whole state dict (its live names, a tied
        weight under each of its names): the model directory read by transformers, as a
        user's `from_pretrained` reads it, and with LoRA the adapter beside it."""
        if LEGACY_MODEL in self._files:
            return self.load_torch(LEGACY_MODEL)
        # Imported here (torch): the site's settings import this module, in processes
        # that never read weights.
        from safetensors.torch import load_file

        from workers.model.lora import is_peft, split_live_state

        names = self.meta.get("model_files") or []
        has_adapter = any(name.startswith(ADAPTER + "/") for name in names)
        if not names:
            raise CheckpointRefused(f"{self.location!r} holds no model weights")
        if has_adapter != is_peft(model):
            held, wanted = ("a LoRA adapter", "on") if has_adapter else ("full weights, no LoRA adapter", "off")
            raise CheckpointRefused(f"{self.location!r} holds {held}: resume it with lora.enabled {wanted}")
        # A LoRA checkpoint's base is in base/; before it was, the top level held it.
        in_base = has_adapter and any(name.startswith(BASE + "/") for name in names)
        if in_base:  # the merged top level is for users: not fetched, not read
            names = [name for name in names if name.startswith((BASE + "/", ADAPTER + "/"))]
        with self._local(names) as local:
            weights = load_model(os.path.join(local, BASE) if in_base else local).state_dict()
            adapter = load_file(os.path.join(local, ADAPTER, "adapter_model.safetensors")) if has_adapter else {}
        live = {name: name for name in model.state_dict()}
        base_names, adapter_names = split_live_state(live) if has_adapter else (live, {})
        missing = [n for n in base_names if n not in weights] + [n for n in adapter_names if n not in adapter]
        if missing:
            raise CheckpointRefused(f"{self.location!r} has no weight for {missing[:5]}: not this run's model")
        return {live_name: weights[name] for name, live_name in base_names.items()} | {
            live_name: adapter[name] for name, live_name in adapter_names.items()
        }

    def load_torch(self, name: str) -> Any:
        import torch

        return torch.load(io.BytesIO(self.read(name)), map_location="cpu", weights_only=True)

    def load_json(self, name: str) -> Any:
        return json.loads(self.read(name))


# -- the trainer -----------------------------------------------------------------------


def _optimizer_by_index(state: dict) -> dict:
    """An optimizer state dict keyed by parameter name (torch.distributed.checkpoint's
    form) in torch's own form, keyed 0, 1, … in the optimizer's parameter order: one
    checkpoint format whatever the trainer backend, so any backend resumes any."""
    ids: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        named = dict(group)
        named["params"] = [ids.setdefault(name, len(ids)) for name in group["params"]]
        groups.append(named)
    return {"state": {ids[name]: value for name, value in state["state"].items()}, "param_groups": groups}


def _optimizer_by_name(state: dict, names: list[str]) -> dict:
    """The inverse of `_optimizer_by_index`: `names` are the optimizer's parameters' names
    in its order."""
    groups = []
    for group in state["param_groups"]:
        named = dict(group)
        named["params"] = [names[i] for i in group["params"]]
        groups.append(named)
    return {"state": {names[i]: value for i, value in state["state"].items()}, "param_groups": groups}


def _trainable_names(trainer: Trainer) -> list[str]:
    """The optimizer's parameters by name, in its order (the trainer builds it from the
    trainable parameters in model order)."""
    return [name for name, p in trainer.model.named_parameters() if p.requires_grad]


def training_state(trainer: Trainer) -> tuple[dict, dict]:
    """(model state dict, optimizer state dict) of the trainer, whole, on the CPU: the
    files of a single trainer's or a ddp pool's checkpoint (rank 0's replica). For a
    sharded pool a collective every rank calls, which gathers the whole state on rank 0
    (the others get empty dicts): its checkpoints write shards instead (`write_shards`)."""
    if trainer.pool is None:
        return {k: t.detach().cpu() for k, t in trainer.model.state_dict().items()}, trainer.optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model, optimizer = get_state_dict(
        trainer.model, trainer.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return model, (_optimizer_by_index(optimizer) if optimizer else {})


def restore_training_state(trainer: Trainer, state: tuple[dict, dict] | None) -> None:
    """Put a checkpoint's model and optimizer state into `trainer`, in place (a weight
    sender's view of the parameters stays valid). For a pool, every rank calls it and
    rank 0, which alone passes `state`, broadcasts it to the others."""
    if trainer.pool is None:
        if state is None:
            raise ValueError("a trainer that is not in a pool restores from a state of its own")
        model, optimizer = state
        trainer.model.load_state_dict(model, strict=True)
        trainer.optimizer.load_state_dict(optimizer)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    model, optimizer = state if state is not None else ({}, {})
    if optimizer:
        optimizer = _optimizer_by_name(optimizer, _trainable_names(trainer))
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    # One call each: set_state_dict with the other ranks' empty model dict would take them
    # for an optimizer-only load and skip the model's broadcast rank 0 makes.
    set_model_state_dict(trainer.model, model, options=options)
    set_optimizer_state_dict(trainer.model, trainer.optimizer, optimizer, options=options)


def trainer_parts(
    trainer: Trainer, starved_s: float, others: Callable[[str, str], Callable[[], list[dict]]] | None = None
) -> dict[str, Any]:
    """The trainer's files: weights, optimizer, version and RNG states. In a pool, rank
    0's: a ddp pool's others join `training_state`; a sharded pool's write their own
    shards (`write_shards`), started by `others` once the step directory is there."""
    progress = {**trainer.progress.state_dict(), "starved_s": float(starved_s)}
    parts: dict[str, Any]
    if trainer.sharded:
        parts = {POLICY: ShardedPolicy(trainer, others), TRAINER: progress}
    else:
        model, optimizer = training_state(trainer)
        parts = {
            POLICY: PolicyFiles(model, trainer.model, trainer.model_dir),
            OPTIMIZER: optimizer,
            TRAINER: progress,
        }
    if trainer.cfg.task.dataset is not None:  # the step directory is a model directory too
        parts[SPLIT_FILE] = load_splits(trainer.cfg).record
    return parts


def recorded_split(location: str) -> dict | None:
    """The dataset split the checkpoint at `location` trained on (None: none recorded)."""
    ckpt = Checkpoint(location)
    return ckpt.load_json(SPLIT_FILE) if any(f["name"] == SPLIT_FILE for f in ckpt.meta["files"]) else None


def check_resume_split(location: str, cfg: RunConfig) -> None:
    """CheckpointRefused if the checkpoint at `location` trained on another split of
    `cfg`'s dataset than the one `cfg` holds out (its held-out rows would be trained ones)."""
    if cfg.task.dataset is None:
        return

    refused = split_refusal(recorded_split(location), load_splits(cfg).record, f"the checkpoint {location!r}")
    if refused:
        raise CheckpointRefused(refused)


def read_version(ckpt: Checkpoint) -> int:
    """The policy version a checkpoint holds."""
    return int(ckpt.meta["step"])


def has_shards(ckpt: Checkpoint) -> bool:
    """Whether the checkpoint holds its model and optimizer state as DCP shards (an
    fsdp2 pool wrote it) rather than whole (model files and optimizer.pt)."""
    return any(f["name"].startswith(SHARDED + "/") for f in ckpt.meta["files"])


def load_shards(trainer: Trainer, ckpt: Checkpoint) -> None:
    """Put a sharded checkpoint's model and optimizer state into `trainer`, in place,
    whatever the number of ranks that wrote it: torch.distributed.checkpoint reads into
    the form `trainer` holds them in (`get_state_dict`: this rank's shards for an fsdp2
    pool, every rank calling; the whole state for a single trainer or a ddp rank, each
    reading it alone), so it reshards on load. Every file is checked against the
    manifest first."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    names = [f["name"] for f in ckpt.meta["files"] if f["name"].startswith(SHARDED + "/")]
    with ckpt._local(names) as local:
        model, optimizer = get_state_dict(trainer.model, trainer.optimizer)
        state: dict[str, Any] = {"model": model, "optimizer": optimizer}
        reader = dcp.FileSystemReader(os.path.join(local, SHARDED))
        dcp.load(state, storage_reader=reader, no_dist=not trainer.sharded)
    set_state_dict(
        trainer.model, trainer.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def restore_trainer(trainer: Trainer, ckpt: Checkpoint) -> float:
    """Put the checkpoint's weights, optimizer, RNG states and version into `trainer`
    (in place: a weight sender's view of the parameters stays valid); returns the
    trainer's starved seconds so far. In a pool this is rank 0's part: meanwhile the
    others call `load_shards` (a sharded checkpoint) or `restore_training_state(trainer,
    None)` (a whole one, which rank 0 broadcasts)."""
    if has_shards(ckpt):
        load_shards(trainer, ckpt)
    else:
        restore_training_state(trainer, (ckpt.load_policy(trainer.model), ckpt.load_torch(OPTIMIZER)))
    state = ckpt.load_torch(TRAINER)
    trainer.progress.load_state_dict(state)
    return float(state["starved_s"])
