"""Protocol "filesystem": a safetensors checkpoint per version in a directory, plus a notice.

The trainer writes `<directory>/v<version>/model.safetensors` (into a temporary name,
then an atomic rename, so a reader never sees half a file) and notifies the workers with
the version and the path; each worker reads the file and loads it. This is PRIME-RL's
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

from workers.lora import effective_state_dict
from workers.sync.base import (
    Notice,
    Notify,
    Stopwatch,
    SyncReport,
    WeightReceiver,
    WeightSender,
)
from workers.sync.object_store import StagedWeights, apply_full

if TYPE_CHECKING:
    from workers.config import SyncConfig

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
        self._written: list[str] = []

    def endpoint(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "directory": self.directory}

    def send(self, version: int, notify: Notify) -> SyncReport:
        model = self._require_model()
        sent_at, clock = time.time(), Stopwatch()
        state = effective_state_dict(model)
        final = version_dir(self.directory, version)
        staging = tempfile.mkdtemp(prefix=f".v{version:08d}-", dir=self.directory)
        save_file(state, os.path.join(staging, WEIGHTS_FILE), metadata={"version": str(version)})
        if os.path.exists(final):  # the same version sent twice (a resumed run)
            shutil.rmtree(final)
        os.rename(staging, final)
        path = os.path.join(final, WEIGHTS_FILE)
        nbytes = os.path.getsize(path)
        self._written.append(final)
        while len(self._written) > self.keep_versions:
            shutil.rmtree(self._written.pop(0), ignore_errors=True)
        notify(Notice(self.protocol, version, self._next_seq(), nbytes, sent_at, {"path": path}))
        return SyncReport(self.protocol, version, nbytes, trainer_ms=clock.ms(), tensors=len(state), messages=1)

    def close(self) -> None:
        for path in self._written:
            shutil.rmtree(path, ignore_errors=True)
        self._written.clear()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)


class FilesystemReceiver(WeightReceiver):
    protocol = "filesystem"

    def receive(self, notice: Notice) -> StagedWeights:
        path = notice.payload["path"]
        clock = Stopwatch()
        try:
            weights = load_file(path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"weights of version {notice.version} are gone from {path}: the trainer keeps only "
                f"the newest sync.keep_versions checkpoints; raise it if workers fall that far behind"
            ) from None
        return StagedWeights(notice, weights, clock.ms(), len(weights), 1)

    def apply(self, backend: Any, staged: StagedWeights) -> SyncReport:
        return apply_full(self.protocol, backend, staged)
