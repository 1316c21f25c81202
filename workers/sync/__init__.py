"""Weight sync protocols behind one interface (workers.sync.base), chosen by name.

    protocol       moves                     path                                 module
    object_store   full state dict           Ray object store (zero-copy views)   object_store.py
    collective     full parameters           torch.distributed broadcast          collective.py
                                             (gloo on CPU, NCCL on GPU), per
                                             tensor or packed in buckets
    filesystem     full state dict           safetensors file per version         filesystem.py
                                             + notice
    lora           LoRA adapter only         object store; the worker merges or   lora.py
                                             registers a versioned adapter

Usage (trainer and workers in different processes; see each class for the lifecycle):

    sender = make_sender("collective", num_receivers=2, mode="packed", bucket_mb=32)
    sender.attach(trainer.model); endpoint = sender.endpoint()
    # concurrently: sender.connect() and receiver_i.connect(endpoint, rank=i + 1)
    report = sender.send(version, notify=lambda n: [w.update_weights.remote(n) for w in workers])
    # on a worker: staged = receiver.receive(notice); later receiver.apply(backend, staged)
"""

from __future__ import annotations

from typing import Any

from workers.sync.base import Notice, SyncReport, WeightReceiver, WeightSender, state_checksum

PROTOCOLS = ("object_store", "collective", "filesystem", "lora")
# The walking skeleton's name for the object-store full reload.
ALIASES = {"full_reload": "object_store"}

__all__ = [
    "ALIASES", "PROTOCOLS", "Notice", "SyncReport", "WeightReceiver", "WeightSender",
    "make_receiver", "make_sender", "receiver_for", "sender_for", "state_checksum",
]


def _resolve(protocol: str) -> str:
    name = ALIASES.get(protocol, protocol)
    if name not in PROTOCOLS:
        raise ValueError(f"unknown sync.protocol {protocol!r}; choose one of {PROTOCOLS}")
    return name


def make_sender(
    protocol: str,
    *,
    num_receivers: int = 1,
    store: Any | None = None,
    mode: str = "packed",
    bucket_mb: float | None = None,
    flat_params: bool = True,
    directory: str | None = None,
    keep_versions: int | None = None,
    timeout_s: float | None = None,
) -> WeightSender:
    """The trainer's half of `protocol`. `store` replaces the Ray object store (tests);
    `mode`/`bucket_mb`/`flat_params`/`timeout_s` are the collective's; `directory`/
    `keep_versions` the filesystem's."""
    name = _resolve(protocol)
    if name == "object_store":
        from workers.sync.object_store import ObjectStoreSender

        return ObjectStoreSender(store)
    if name == "collective":
        from workers.sync import collective

        return collective.CollectiveSender(
            num_receivers, mode, bucket_mb or collective.BUCKET_MB, flat_params,
            timeout_s=timeout_s or collective.TIMEOUT_S,
        )
    if name == "filesystem":
        from workers.sync import filesystem

        return filesystem.FilesystemSender(directory, keep_versions or filesystem.KEEP_VERSIONS)
    from workers.sync.lora import LoRASender

    return LoRASender(store)


def make_receiver(protocol: str, *, model_dir: str | None = None, store: Any | None = None) -> WeightReceiver:
    """A worker's half of `protocol`. `model_dir` (the directory the worker's backend was
    built from) is needed by "lora", whose workers keep the base themselves."""
    name = _resolve(protocol)
    if name == "object_store":
        from workers.sync.object_store import ObjectStoreReceiver

        return ObjectStoreReceiver(store)
    if name == "collective":
        from workers.sync.collective import CollectiveReceiver

        return CollectiveReceiver()
    if name == "filesystem":
        from workers.sync.filesystem import FilesystemReceiver

        return FilesystemReceiver()
    if model_dir is None:
        raise ValueError("sync.protocol 'lora' needs the worker's model_dir (its base weights)")
    from workers.sync.lora import LoRAReceiver

    return LoRAReceiver(model_dir, store)


def sender_for(sync_cfg: Any, num_receivers: int) -> WeightSender:
    """`make_sender` from a config section (RunConfig.sync). Fields a section lacks take
    their defaults, so this works before and after the section grows."""
    return make_sender(
        sync_cfg.protocol,
        num_receivers=num_receivers,
        mode="packed" if getattr(sync_cfg, "packed", True) else "per_tensor",
        bucket_mb=getattr(sync_cfg, "bucket_mb", None),
        flat_params=getattr(sync_cfg, "flat_params", True),
        directory=getattr(sync_cfg, "directory", None),
        keep_versions=getattr(sync_cfg, "keep_versions", None),
        timeout_s=getattr(sync_cfg, "timeout_s", None),
    )


def receiver_for(sync_cfg: Any, model_dir: str) -> WeightReceiver:
    """`make_receiver` from a config section (RunConfig.sync)."""
    return make_receiver(sync_cfg.protocol, model_dir=model_dir)
