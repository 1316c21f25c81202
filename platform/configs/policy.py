"""What a run config may ask for on this site: the check every config passes where it
comes in (a launch, a saved configuration, a retry, a resume), so each refusal names the
field to change and the limit it ran into.

The engine validates the config itself (`workers.config.presets.build`, its own model, values
only) and resolves its task, task options and reward functions (`check_runnable`). Here it
is then held to the operator's settings — the paths it may read and write (the engine's
`Confinement`) and how much one run may ask for (`Limits`) — and to the cluster as last
seen (`ClusterCapacity`: the web process never asks Ray). Before its driver starts, the
Celery worker holds it once more to the cluster as Ray reports it then (runs/in_ray.py).
"""

from __future__ import annotations

import dataclasses
import logging

from django.conf import settings
from pydantic import ValidationError

from configs.models import ClusterCapacity
from foundation.errors import Unavailable, field_errors
from workers.config.capabilities import unread
from workers.config.presets import UnknownPreset, build
from workers.config.run_config import RunConfig
from workers.core.hub import HubUnavailable
from workers.model.fitting import checkpoint_fits
from workers.model.loading import hub_metadata_dir
from workers.run.admission import Capacity, Limits, admission_errors
from workers.run.paths import Confinement
from workers.run.runnable import check_runnable

log = logging.getLogger(__name__)


def confinement() -> Confinement:
    return Confinement.from_lists(
        settings.ROLLWAY_MODEL_ROOTS,
        settings.ROLLWAY_SYNC_ROOTS,
        settings.ROLLWAY_SCRATCH_DIR,
        settings.ROLLWAY_EXPORT_DIR,
        settings.ROLLWAY_DATA_ROOTS,
        checkpoint_root=settings.ROLLWAY_CHECKPOINT_ROOT,
        log_root=settings.ROLLWAY_RUN_LOG_DIR,
        hub_owners=settings.ROLLWAY_HUB_OWNERS,
    )


def limits() -> Limits:
    return Limits(
        max_steps=settings.ROLLWAY_MAX_STEPS,
        max_minutes=settings.ROLLWAY_MAX_MINUTES,
        max_workers=settings.ROLLWAY_MAX_WORKERS,
        max_model_params=settings.ROLLWAY_MAX_MODEL_PARAMS,
    )


def config_errors(cfg: RunConfig, capacity: Capacity | None = None) -> dict[str, str]:
    """{dotted field: message} for every reason `cfg` may never run here: a task, task
    options or reward functions that do not resolve or do not fit the config, a path
    outside its allowed roots, an operator limit, more than the cluster has (`capacity`,
    or the last capacity seen when None). Empty: it may be queued. Unavailable (a 503)
    when the Hugging Face Hub does not answer about a repository the config names."""
    try:
        check_runnable(cfg)
    except ValidationError as exc:
        return field_errors(exc, model=RunConfig, root="config")  # nothing else can be sized without the task
    try:
        errors = confinement().errors(cfg)
    except HubUnavailable as exc:
        raise Unavailable({exc.field: exc.message}) from None
    if errors:
        return errors  # sizing a model that cannot be read would only add noise
    capacity = capacity if capacity is not None else ClusterCapacity.latest()
    if capacity is not None and settings.ROLLWAY_GPU_MEMORY_GB:
        # The operator knows the GPUs better than their type's name (an A100 has 40 or 80 GB).
        capacity = dataclasses.replace(capacity, gpu_memory_bytes=int(settings.ROLLWAY_GPU_MEMORY_GB * 2**30))
    return admission_errors(cfg, limits(), capacity)


def check_config(preset: str, overrides: dict) -> tuple[RunConfig | None, dict[str, str]]:
    """The config `preset` + `overrides` stand for, and every field error that keeps it
    from running here: the engine's own validation (`presets.build`), then this site's
    (`config_errors`). A launch and a saved configuration both check through here, so
    both refuse with the same messages."""
    try:
        config = build(preset, overrides)
    except UnknownPreset as exc:
        return None, {"preset": str(exc)}
    except ValidationError as exc:
        return None, field_errors(exc, model=RunConfig, root="config")
    return config, config_errors(config)


def unread_settings(config: RunConfig) -> list[dict]:
    """The settings of a launched config that its run will not read and does not need
    (workers/config/capabilities.py `unread`), each {field, message}: what a launch
    answers beside the run, and the launch form shows. The ones the run would need are
    refused before this (`config_errors`)."""
    return [{"field": field, "message": message} for field, message in unread(config).items()]


def settings_that_fit(config: RunConfig) -> list[dict]:
    """The settings of a launched config that do not suit its checkpoint's size, each with
    the value that does and why (workers/model/fitting.py): what a launch answers beside
    the run. None for the tiny model. The checkpoint's config and tokenizer are what the
    launch check read already (a path under the model roots, a Hub model's metadata)."""
    if config.model.source == "tiny":
        return []
    try:
        model_dir = config.model.path if config.model.source == "path" else hub_metadata_dir(config.model.hub_id or "")
        return [fit.as_dict() for fit in checkpoint_fits(config, model_dir or "")]
    except Exception:  # advice only: a launch that passed its checks is answered without it
        log.warning("no settings advice for the launch's checkpoint", exc_info=True)
        return []
