"""Protocol "filesystem": a safetensors checkpoint per version in a directory, plus a notice.

The trainer writes `<directory>/v<version>/model.safetensors` (into a temporary name,
then an atomic rename, so a reader never sees half a file) and notifies the workers with
the version and the path; each worker reads the file and loads it. A sharded trainer
writes one file per gathered bucket (`model-00001-of-00004.safetensors`, …,
workers/sync/weights.py) and the notice lists them. This is PRIME-RL's
and AReaL's path: it works across any topology that shares a filesystem (NFS, a
Kubernetes volume) and leaves every version on disk for inspection or resumption, at
the price of a write and a read per sync (page cache on one host).

Old versions are deleted once `keep_versions` newer ones exist: a slow worker may
still be opening the previous file when the next one lands.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Any

from safetensors.torch import load_file, save_file

from workers.core.sync_messages import Notice, Notify, SyncReport
from workers.sync.base import Stopwatch, WeightReceiver, WeightSender
from workers.sync.object_store import StagedWeights, apply_full
from workers.sync.weights import state_buckets

if TYPE_CHECKING:
    from workers.config.run_config import SyncConfig

WEIGHTS_FILE = "model.safetensors"


def version_dir(directory: str, version: int) -> str:
    return os.path.join(directory, f"v{version:08d}")


class FilesystemSender(WeightSender):
    protocol = "filesystem"

    def __init__(self, sync: SyncConfig, scratch_dir: str | None = None) -> None:
        """`sync.directory`: where checkpoints go (must be visible to every worker); None →
        `<scratch_dir>/sync` (the run's scratch), or a fresh temporary directory without
        one; a directory this sender made is removed on close. `sync.keep_versions`: how
        many versions stay on disk. The versions it wrote are removed on close either way:
        they are a transport, not the run's output."""
        super().__init__()
        self._owns_directory = sync.directory is None
        if sync.directory is not None:
            self.directory = sync.directory
        elif scratch_dir is not None:
            self.directory = os.path.join(scratch_dir, "sync")
        else:
            self.directory = tempfile.mkdtemp(prefix="rollway-sync-")
        os.makedirs(self.directory, exist_ok=True)
        self.keep_versions = sync.keep_versions
        self.bucket_mb = sync.bucket_mb  # a sharded trainer's files: one per gathered bucket
        self._written: list[str] = []

    def endpoint(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "directory": self.directory}

    def send(self, version: int, notify: Notify) -> SyncReport:
        model = self._require_model()
        sent_at, clock = time.time(), Stopwatch()
        final = version_dir(self.directory, version)
        staging = tempfile.mkdtemp(prefix=f".v{version:08d}-", dir=self.directory)
        names, tensors = [], 0
        for k, bucket in enumerate(state_buckets(model, self.bucket_mb)):
            name = f"model-{k + 1:05d}.safetensors"
            save_file(bucket, os.path.join(staging, name), metadata={"version": str(version)})
            names.append(name)
            tensors += len(bucket)
        # One file keeps the name every Hugging Face loader knows; several say how many.
        renamed = (
            [WEIGHTS_FILE]
            if len(names) == 1
            else [f"model-{k + 1:05d}-of-{len(names):05d}.safetensors" for k in range(len(names))]
        )
        for old, new in zip(names, renamed, strict=True):
            os.rename(os.path.join(staging, old), os.path.join(staging, new))
        if os.path.exists(final):  # the same version sent twice (a resumed run)
            shutil.rmtree(final)
        os.rename(staging, final)
        paths = [os.path.join(final, name) for name in renamed]
        nbytes = sum(os.path.getsize(path) for path in paths)
        self._written.append(final)
        while len(self._written) > self.keep_versions:
            shutil.rmtree(self._written.pop(0), ignore_errors=True)
        notify(Notice(self.protocol, version, self._next_seq(), nbytes, sent_at, {"paths": paths}))
        return SyncReport(self.protocol, version, nbytes, trainer_ms=clock.ms(), tensors=tensors, messages=len(paths))

    def close(self) -> None:
        for path in self._written:
            shutil.rmtree(path, ignore_errors=True)
        self._written.clear()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)


class FilesystemReceiver(WeightReceiver):
    protocol = "filesystem"

    def receive(self, notice: Notice) -> StagedWeights:
        paths = notice.payload["paths"]
        clock = Stopwatch()
        weights = {}
        for path in paths:
            try:
                weights.update(load_file(path))
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"weights of version {notice.version} are gone from {path}: the trainer keeps only "
                    f"the newest sync.keep_versions checkpoints; raise it if workers fall that far behind"
                ) from None
        return StagedWeights(notice, weights, clock.ms(), len(weights), len(paths))

    def apply(self, backend: Any, staged: StagedWeights) -> SyncReport:
        return apply_full(self.protocol, backend, staged)
