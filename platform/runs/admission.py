"""The site's side of admission and confinement: the operator's settings as the engine's
`Confinement` and `Limits`, and the one check a config passes before it is stored and
again before it reaches Ray.

At launch (web process) a config is checked against the paths the operator allows, the
operator's limits and the cluster's capacity as last seen (`ClusterCapacity`); before its
driver starts (Celery worker) against the cluster as Ray reports it now. Either way the
user reads which field to change and the limit it ran into.
"""

from __future__ import annotations

from django.conf import settings

from runs.models import ClusterCapacity
from workers.admission import Capacity, Limits, admission_errors
from workers.config import RunConfig
from workers.paths import Confinement, remove_scratch


def confinement() -> Confinement:
    return Confinement.from_lists(
        settings.ROLLWAY_MODEL_ROOTS,
        settings.ROLLWAY_SYNC_ROOTS,
        settings.ROLLWAY_SCRATCH_DIR,
        settings.ROLLWAY_EXPORT_DIR,
        settings.ROLLWAY_DATA_ROOTS,
        checkpoint_root=settings.ROLLWAY_CHECKPOINT_ROOT,
    )


def limits() -> Limits:
    return Limits(
        max_steps=settings.ROLLWAY_MAX_STEPS,
        max_minutes=settings.ROLLWAY_MAX_MINUTES,
        max_workers=settings.ROLLWAY_MAX_WORKERS,
        max_model_params=settings.ROLLWAY_MAX_MODEL_PARAMS,
    )


def config_errors(cfg: RunConfig, capacity: Capacity | None = None) -> dict[str, str]:
    """{dotted field: message} for every reason `cfg` may never run here: a path outside
    its allowed roots, an operator limit, more than the cluster has (`capacity`, or the
    last capacity seen when None). Empty: it may be queued."""
    errors = confinement().errors(cfg)
    if errors:
        return errors  # sizing a model that cannot be read would only add noise
    return admission_errors(cfg, limits(), capacity if capacity is not None else ClusterCapacity.latest())


def remove_run_scratch(run_id: int) -> bool:
    """Remove run `run_id`'s scratch directory (its driver removes it itself when it can;
    this covers a driver that was killed or lost). True if there was one."""
    return remove_scratch(confinement().scratch_dir(run_id))
