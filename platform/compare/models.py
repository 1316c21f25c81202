"""Comparison experiments: M configurations × N seeds launched as one.

A comparison records what it was asked to compare (its configurations, seeds and the
overrides every run shares) and the runs it launched. Runs belong to it through a
through table in this app, so the runs app (and its migrations) know nothing of
comparisons; launching again adds runs beside the ones it has, never replacing them.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.urls import reverse

from runs.models import Experiment, Run
from teams.models import Team, TeamOwnedQuerySet

SAVED_PREFIX = "saved:"  # a configuration that names a saved configuration version, as the launch form's values do


class Comparison(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="comparisons")
    experiment = models.ForeignKey(
        Experiment, null=True, blank=True, on_delete=models.SET_NULL, related_name="comparisons"
    )
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    overrides = models.JSONField(default=dict, blank=True, help_text="Shared by every run (task, model, …).")
    configurations = models.JSONField(
        default=list, help_text='Built-in preset names and "saved:<id>" saved configuration versions.'
    )
    seeds = models.JSONField(default=list, help_text="Every seed launched so far, in order.")
    runs = models.ManyToManyField(Run, through="ComparisonRun", related_name="comparisons", blank=True)

    objects = TeamOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.team} / {self.name}"

    def get_absolute_url(self) -> str:
        return reverse("compare:comparison", args=[self.pk])

    def compare_url(self) -> str:
        ids = ",".join(str(pk) for pk in self.run_ids())
        return f"{reverse('compare:page')}?runs={ids}"

    def run_ids(self) -> list[int]:
        return list(self.members.order_by("pk").values_list("run_id", flat=True))

    def as_dict(self, *, with_runs: bool = False) -> dict:
        out = {
            "id": self.pk,
            "team": {"id": self.team_id, "slug": self.team.slug, "name": self.team.name},
            "experiment": self.experiment_id,
            "name": self.name,
            "description": self.description,
            "overrides": self.overrides,
            "configurations": self.configurations,
            "seeds": self.seeds,
            "created_by": self.created_by.get_username() if self.created_by else None,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "url": self.get_absolute_url(),
            "compare_url": self.compare_url(),
        }
        if with_runs:
            runs = Run.objects.filter(comparison_links__comparison=self).select_related("experiment__team")
            out["runs"] = [{**run.summary(), "seed": (run.config or {}).get("seed")} for run in runs.order_by("pk")]
        else:
            out["run_count"] = self.members.count()
        return out


class ComparisonRun(models.Model):
    """One run a comparison launched."""

    comparison = models.ForeignKey(Comparison, on_delete=models.CASCADE, related_name="members")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="comparison_links")
    configuration = models.CharField(max_length=120, help_text="The entry of `configurations` it ran.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["comparison", "run"], name="unique_comparison_run")]


class ComparisonSimulation(models.Model):
    """One simulated run of a comparison's configuration at a scale of the league table
    (compare/league.py): the run is a simulated run like any (runs/simulation.py); the
    newest per configuration and scale is the one the league shows."""

    comparison = models.ForeignKey(Comparison, on_delete=models.CASCADE, related_name="simulations")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="league_links")
    configuration = models.CharField(max_length=120, help_text="The entry of `configurations` it simulated.")
    model = models.CharField(max_length=20, help_text="The simulated model shape (7B, 32B).")
    gpus = models.IntegerField(help_text="The simulated cluster's GPUs.")
