"""Saved configurations: a team's named, versioned run configs, stored as data; and the
cluster's capacity as last seen, which every config is checked against (configs/policy.py).

A saved configuration is what a launch is made of — a built-in preset
(workers/config/presets.py) and JSON overrides on top — under a name the team chose. Rows are
never edited: editing a configuration saves version n+1 beside version n, so a run that
ran version n (`Run.saved_config`) still points at exactly what it ran.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Max
from django.utils import timezone

from teams.models import Team, TeamOwnedQuerySet
from workers.config.presets import build
from workers.config.run_config import RunConfig
from workers.run.admission import Capacity


class SavedConfigQuerySet(TeamOwnedQuerySet):
    def latest_versions(self) -> SavedConfigQuerySet:
        """The newest version of each (team, name)."""
        newest = (
            SavedConfig.objects.filter(team=models.OuterRef("team"), name=models.OuterRef("name"))
            .order_by("-version")
            .values("version")[:1]
        )
        return self.filter(version=models.Subquery(newest))


class SavedConfig(models.Model):
    """One version of a team's named configuration; the effective run config is
    `workers.config.presets.build(base_preset, overrides)`."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="saved_configs")
    name = models.CharField(max_length=100)
    version = models.PositiveIntegerField(default=1)
    description = models.TextField(blank=True)
    base_preset = models.CharField(max_length=50, help_text="A built-in preset (workers/config/presets.py).")
    overrides = models.JSONField(default=dict, blank=True, help_text="Merged onto the base preset.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SavedConfigQuerySet.as_manager()

    class Meta:
        ordering = ["team__name", "name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name", "version"], name="unique_saved_config_version"),
            models.CheckConstraint(condition=models.Q(version__gte=1), name="saved_config_version_from_1"),
        ]

    def __str__(self) -> str:
        return f"{self.team} / {self.name} v{self.version}"

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version}"

    def effective_config(self) -> RunConfig:
        """The run config this version stands for (raises pydantic's ValidationError if
        the engine no longer accepts it)."""
        return build(self.base_preset, self.overrides)

    def newest_version(self) -> int:
        found = SavedConfig.objects.filter(team_id=self.team_id, name=self.name).aggregate(n=Max("version"))["n"]
        return found or self.version

    def as_dict(self) -> dict:
        """What the API and the launch form show of a saved configuration."""
        return {
            "kind": "saved",
            "id": self.pk,
            "read_only": False,
            "team": {"id": self.team_id, "slug": self.team.slug, "name": self.team.name},
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "base_preset": self.base_preset,
            "overrides": self.overrides,
            "config": self.effective_config().model_dump(mode="json"),
            "created_by": self.created_by.get_username() if self.created_by else None,
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }


class ClusterCapacity(models.Model):
    """What the Ray cluster has in total, as last seen by the Celery worker (one row).

    The web process never talks to Ray, yet a config that could never fit must be refused
    there, with the field to change (configs/policy.py): it checks against this row. The
    worker records it each time it asks Ray (before a run starts, and on reconcile)."""

    cpus = models.FloatField()
    memory_bytes = models.BigIntegerField()
    gpus = models.FloatField(default=0.0)
    # One GPU's memory from the type Ray names its GPUs by (0: not known).
    gpu_memory_bytes = models.BigIntegerField(default=0)
    seen_at = models.DateTimeField()

    SINGLETON = 1

    def __str__(self) -> str:
        memory = self.memory_bytes / 2**30
        return f"{self.cpus:g} CPUs, {memory:.1f} GiB, {self.gpus:g} GPUs at {self.seen_at:%Y-%m-%d %H:%M}"

    @classmethod
    def record(cls, capacity: Capacity) -> None:
        """Store `capacity` as the latest seen."""
        cls.objects.update_or_create(
            pk=cls.SINGLETON,
            defaults={
                "cpus": capacity.cpus,
                "memory_bytes": capacity.memory_bytes,
                "gpus": capacity.gpus,
                "gpu_memory_bytes": capacity.gpu_memory_bytes,
                "seen_at": timezone.now(),
            },
        )

    @classmethod
    def latest(cls) -> Capacity | None:
        """The last capacity seen, or None before any."""
        row = cls.objects.filter(pk=cls.SINGLETON).first()
        if row is None:
            return None
        return Capacity(
            cpus=row.cpus, memory_bytes=row.memory_bytes, gpus=row.gpus, gpu_memory_bytes=row.gpu_memory_bytes
        )
