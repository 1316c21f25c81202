"""The league table: a comparison's configurations side by side, one row each.

A row holds what the configuration's runs measured here (the mean over their seeds) and
what its simulated runs (runs/simulation.py) predict at scale: 7B and 32B models on 64 and
512 GPUs. Every cell links to the runs behind it: a measured cell to the compare page of
the configuration's runs, a simulated cell to its simulated run. A built-in preset's row
also says where the preset only approximates its library, from the preset's own
description ("Approximates: …", "Cannot reproduce: …"), so a row is never read as the
library itself.

Measured figures (each run's, then the mean over seeds; compare/analysis.py reads them):
- samples/s: mean of samples/per_s;
- time to target: the first wall time the 5-point mean reward reaches the target, the
  mean over the seeds that reached it (the cell says how many did);
- pass@1 gain per 1k samples: (last − first held-out eval/pass@1) ÷ samples seen × 1000,
  how much each sample trained moved the held-out score (None without an eval);
- staleness: mean of staleness/mean; trainer idle: mean of trainer/idle_frac;
- sync bytes: mean of sync/bytes (bytes a weight sync moved).
Simulated figures, per scale: samples/s and the trainer's idle fraction (1 − its busy
share), from the simulated run's summary.
A column's best is marked among the cells every run of their row gave.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from django.urls import reverse

from compare.analysis import run_figures
from compare.models import SAVED_PREFIX, Comparison, ComparisonSimulation
from foundation.errors import ActionError
from runs.models import MetricPoint, Run
from runs.simulation import check_simulated_launch, do_simulate_run
from workers.config.presets import PRESETS

EVAL = "eval/pass@1"


@dataclass(frozen=True)
class Scale:
    """A simulated cluster: `model` (a built-in shape) on `gpus` H100s, its inference
    workers `tp` GPUs each."""

    model: str
    gpus: int

    @property
    def key(self) -> str:
        return f"{self.model}@{self.gpus}"

    @property
    def label(self) -> str:
        return f"{self.model} on {self.gpus} GPUs"

    @property
    def tp(self) -> int:
        return 4 if self.model == "32B" else 1  # a 32B model's weights do not fit one GPU's memory


SCALES = (Scale("7B", 64), Scale("7B", 512), Scale("32B", 64), Scale("32B", 512))
# The simulated workload: completions lognormal with median 2,048 tokens and p90 4,915, cut
# at 8,192 (long reasoning traces), 512-token prompts; 16 completions per prompt and one
# prompt per GPU a step (at least 32), as bench/simulate_presets.py lays out its rows.
WORKLOAD = {"median_tokens": 2048, "p90_tokens": 4915, "max_tokens": 8192, "prompt_tokens": 512}
GROUP_SIZE = 16
SIMULATED_STEPS = 20


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    better: str  # "higher" or "lower": the best row's cell is marked
    help: str
    group: str = "measured here"  # the heading over it: measured, or the simulated scale


MEASURED = (
    Column("samples_per_s", "samples/s", "higher", "mean of samples/per_s over the run, then over seeds"),
    Column("time_to_target_s", "time to target (s)", "lower", "first wall time the 5-point mean reward ≥ target"),
    Column(
        "pass_gain_per_ksample", "pass@1 gain / 1k samples", "higher", "(last − first held-out pass@1) per 1k samples"
    ),
    Column("staleness_mean", "staleness", "lower", "mean of staleness/mean (versions)"),
    Column("trainer_idle", "trainer idle", "lower", "mean of trainer/idle_frac"),
    Column("sync_bytes", "sync bytes", "lower", "mean of sync/bytes: what one weight sync moved"),
)
SIMULATED = tuple(
    column
    for scale in SCALES
    for column in (
        Column(f"{scale.key}:samples_per_s", "samples/s", "higher", "simulated samples/s", f"simulated: {scale.label}"),
        Column(
            f"{scale.key}:trainer_idle",
            "trainer idle",
            "lower",
            "simulated trainer idle fraction",
            f"simulated: {scale.label}",
        ),
    )
)


def approximation(configuration: str) -> str:
    """What a built-in preset's description says it only approximates or cannot reproduce
    of its library ("" when it reproduces everything it names, or for a saved config)."""
    preset = PRESETS.get(configuration)
    if preset is None:
        return ""
    parts = re.findall(
        r"((?:Approximates|Cannot reproduce): .*?)(?= Approximates: | Cannot reproduce: |$)", preset["description"]
    )
    return " ".join(parts)


def _scale_config(scale: Scale) -> dict:
    return {"trainer": {"batch_groups": max(32, min(512, scale.gpus)), "group_size": GROUP_SIZE}}


def simulate(user, comparison: Comparison, configuration: Any, scale: Scale) -> Run:
    """Simulate one of the comparison's configurations at `scale` and link the simulated
    run to it: the cell's newest simulation is the one the league shows. The user needs
    the role that launches in the comparison's team (check_launch says so)."""
    if configuration not in comparison.configurations:
        raise ActionError(
            {"configuration": f"not one of the comparison's configurations ({', '.join(comparison.configurations)})"}
        )
    saved = configuration.removeprefix(SAVED_PREFIX) if configuration.startswith(SAVED_PREFIX) else None
    launch, sim = check_simulated_launch(
        user,
        cluster={"gpus": scale.gpus, "model": scale.model, "tp": scale.tp},
        workload=WORKLOAD,
        steps=SIMULATED_STEPS,
        # Its experiment, or its team's default one (as its runs were launched).
        experiment=comparison.experiment_id,
        team=None if comparison.experiment_id else comparison.team_id,
        name=f"{comparison.name}: {configuration} at {scale.label}"[:100],
        preset="" if saved else configuration,
        saved_config=saved,
        overrides=_scale_config(scale),
    )
    # Not one transaction with the run's: do_simulate_run simulates before it opens its
    # own, so that no lock is held for the seconds the simulator takes.
    run = do_simulate_run(user, launch, sim)
    ComparisonSimulation.objects.create(
        comparison=comparison, run=run, configuration=configuration, model=scale.model, gpus=scale.gpus
    )
    return run


def simulate_all(user, comparison: Comparison) -> tuple[list[Run], dict[str, str]]:
    """Every configuration of the comparison at every scale (80 simulated runs for the 20
    built-in presets take seconds): the runs made, and {"<configuration> at <scale>": why}
    for a cell the simulator could not lay out (the others are still made). A refusal of
    the user's role (or any other not about the cell) stops it at the first cell."""
    made, errors = [], {}
    for configuration in comparison.configurations:
        for scale in SCALES:
            try:
                made.append(simulate(user, comparison, configuration, scale))
            except ActionError as exc:
                if exc.http_status != 400:  # the role, the team's state: the same for every cell
                    raise
                errors[f"{configuration} at {scale.label}"] = exc.message
    return made, errors


def _pass_gains(runs: list[Run], figures: dict[int, dict]) -> dict[int, float | None]:
    """{run id: held-out pass@1 gain per 1k samples seen} (None without two evals)."""
    points: dict[int, list[float]] = {}
    for run_id, value in (
        MetricPoint.objects.filter(run__in=runs, series=EVAL).order_by("run_id", "step").values_list("run_id", "value")
    ):
        points.setdefault(run_id, []).append(value)
    out: dict[int, float | None] = {}
    for run in runs:
        values, samples = points.get(run.pk, []), figures[run.pk]["samples"]
        out[run.pk] = (values[-1] - values[0]) / samples * 1000 if len(values) >= 2 and samples > 0 else None
    return out


def text(key: str, value: float | None) -> str:
    """A cell as the page and bench/league.py show it: fractions as percentages, bytes in
    MB, three significant digits below 1,000."""
    if value is None:
        return "—"
    if key.endswith("trainer_idle"):
        return f"{100 * value:.0f}%"
    if key == "sync_bytes":
        return f"{value / 1e6:.2f} MB"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _cell(key: str, values: list[float], url: str, runs: int) -> dict:
    """The mean of `values`, from `runs` runs; where fewer runs gave a value (a seed that
    never reached the target, a run without two evals), the text says how many did: a
    mean over the seeds that got there reads better than the configuration did."""
    value = fmean(values) if values else None
    shown = text(key, value)
    if 0 < len(values) < runs:
        shown += f" ({len(values)} of {runs} runs)"
    return {"value": value, "text": shown, "n": len(values), "of": runs, "url": url}


def table(comparison: Comparison, *, target: float) -> dict:
    """{"columns", "scales", "rows": [{configuration, approximates, runs, cells:
    {column key: {value, text, n, of, url}}}], "best": {column key: [configuration]}}: the league of
    `comparison`'s finished runs (runs still going are left out until they end). A cell's
    `n` of its row's `of` runs gave it a figure."""
    runs = list(
        comparison.runs.filter(simulated=False, status=Run.Status.SUCCEEDED)
        .select_related("experiment__team")
        .order_by("pk")
    )
    configuration_of = dict(comparison.members.values_list("run_id", "configuration"))
    figures = run_figures(runs, target=target, budget_s=0) if runs else {}
    gains = _pass_gains(runs, figures) if runs else {}
    for run in runs:
        figures[run.pk]["pass_gain_per_ksample"] = gains[run.pk]
        busy = figures[run.pk]["trainer_busy"]
        figures[run.pk]["trainer_idle"] = None if busy is None else 1.0 - busy
    simulated: dict[tuple[str, str], Run] = {}
    for link in comparison.simulations.select_related("run").order_by("pk"):
        simulated[(link.configuration, f"{link.model}@{link.gpus}")] = link.run  # the newest wins

    rows = []
    for configuration in comparison.configurations:
        mine = [r for r in runs if configuration_of.get(r.pk) == configuration]
        compare_url = f"{reverse('compare:page')}?runs={','.join(str(r.pk) for r in mine)}" if mine else ""
        cells = {
            col.key: _cell(
                col.key, [v for r in mine if (v := figures[r.pk][col.key]) is not None], compare_url, len(mine)
            )
            for col in MEASURED
        }
        for scale in SCALES:
            run = simulated.get((configuration, scale.key))
            summary = (run.simulation or {}).get("summary", {}) if run else {}
            url = run.get_absolute_url() if run else ""
            busy = summary.get("trainer_busy")
            for name, value in (
                ("samples_per_s", summary.get("samples_per_s")),
                ("trainer_idle", None if busy is None else 1.0 - busy),
            ):
                key = f"{scale.key}:{name}"
                n = int(value is not None)
                cells[key] = {"value": value, "text": text(key, value), "n": n, "of": 1, "url": url}
        rows.append(
            {
                "configuration": configuration,
                "approximates": approximation(configuration),
                "runs": [r.pk for r in mine],
                "cells": cells,
            }
        )
    best: dict[str, list[str]] = {}
    for col in MEASURED + SIMULATED:
        # A best needs two rows with a figure, and only a cell every run of its row gave
        # can be it: a preset that reached the target on one seed of three is not the
        # fastest to it.
        filled = [(row["cells"][col.key], row["configuration"]) for row in rows if row["cells"][col.key]["n"]]
        values = [(cell["value"], c) for cell, c in filled if cell["n"] == cell["of"]]
        if len(filled) < 2 or not values:
            best[col.key] = []
            continue
        top = (max if col.better == "higher" else min)(v for v, _ in values)
        # Ties as shown: two rows that both read "3%" are both the best, whichever is
        # ahead in a digit the table does not show.
        best[col.key] = [c for v, c in values if text(col.key, v) == text(col.key, top)]
    return {
        "comparison": comparison.pk,
        "target": target,
        "columns": [col.__dict__ for col in MEASURED + SIMULATED],
        "scales": [{"key": s.key, "model": s.model, "gpus": s.gpus, "tp": s.tp} for s in SCALES],
        "workload": WORKLOAD | {"group_size": GROUP_SIZE, "steps": SIMULATED_STEPS},
        "rows": rows,
        "best": best,
    }
