"""Simulated runs: a launch's config run through workers/simulate on a cluster and a
workload that the user describes, instead of on this machine's GPUs.

`check_simulation` validates the cluster and the workload (pydantic, errors named by
their dotted field); `do_simulate_run` runs the simulator in the request (seconds for
hundreds of steps) and stores the result as a finished run marked `simulated`, its
series as metric points under the engine's names, so the run and compare pages chart it
as they chart any run. `do_plan` searches the settings the simulated run's advice names
(workers/simulate/planner.py) and stores two simulated runs: the config as given and the
best setting found, the latter holding the ranked table; `do_simulate_plan_row`
simulates any other row of that table on demand, one click from the planned run's page.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pydantic
from django.db import transaction
from pydantic import BaseModel, ConfigDict, Field, model_validator

from configs import policy
from foundation.errors import ActionError, Unavailable, errors_by_field
from foundation.ids import ID_TEXT
from runs import events
from runs.actions import RUN_NAME_MAX, LaunchRequest, check_launch, check_run_access, create_run
from runs.models import MetricPoint, Run
from teams import audit
from workers.config.run_config import RunConfig
from workers.core.hub import HubRefused, HubUnavailable
from workers.core.merge import deep_merge
from workers.run.paths import PathNotAllowed
from workers.simulate import MODELS, Cluster, Workload, simulate
from workers.simulate.advice import advice
from workers.simulate.costs import H100, LINKS, ModelShape, shape_of
from workers.simulate.planner import Candidate, candidates, plan, staleness_caveat

logger = logging.getLogger(__name__)

# The simulator's GPU kinds (workers/simulate/costs.py): one today.
DEVICES = {H100.name: H100}
# The links between nodes a cluster may have (workers/simulate/costs.py LINKS).
LINK_CHOICES = ("InfiniBand", "Ethernet", "NVLink")
# Steps one request may simulate, and GPUs × steps: the simulator's time grows with
# both (1,024 GPUs × 200 steps ≈ 1 s, 16,384 GPUs × 50 steps ≈ 3.5 s on a shared core),
# and it runs inside the request.
MAX_STEPS = 2000
MAX_GPU_STEPS = 1024 * 1024
# A plan simulates every candidate setting (60 for an async config) for at most this many
# steps: the ranking settles within tens of steps, and the request stays within seconds.
PLAN_STEPS = 30
# GPUs × steps over all of a plan's candidates: four single simulations' worth.
MAX_PLAN_GPU_STEPS = 4 * MAX_GPU_STEPS
# The candidates a planned run keeps, best first (its page's table).
PLAN_ROWS = 10


class ClusterIn(BaseModel):
    """The simulated cluster: `model` is a built-in shape (7B, 32B) or a Hugging Face
    model (a directory under ROLLWAY_MODEL_ROOTS or a Hub id) whose shape is read from its config."""

    model_config = ConfigDict(extra="forbid")
    gpus: int = Field(ge=1, le=65_536)
    gpu: Literal["H100"] = "H100"
    model: str = "7B"
    inference_share: float = Field(0.5, gt=0, lt=1)
    tp: int = Field(1, ge=1, le=64)
    link: Literal["InfiniBand", "Ethernet", "NVLink"] = "InfiniBand"


class WorkloadIn(BaseModel):
    """Completion lengths (lognormal, median and p90, cut at max_tokens) and prompts."""

    model_config = ConfigDict(extra="forbid")
    median_tokens: int = Field(2048, ge=1)
    p90_tokens: int | None = Field(None, ge=1)  # None: the median (every completion as long)
    max_tokens: int = Field(32768, ge=1)
    prompt_tokens: int = Field(512, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> WorkloadIn:
        p90 = self.p90_tokens or self.median_tokens
        if p90 < self.median_tokens:
            raise ValueError(f"p90_tokens ({p90}) must be ≥ median_tokens ({self.median_tokens})")
        if self.max_tokens < p90:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be ≥ p90_tokens ({p90})")
        return self


@dataclass(frozen=True)
class SimulationRequest:
    cluster: Cluster
    workload: Workload
    steps: int
    described: dict  # what the user asked for, as stored on the run


def check_simulation(cluster: Any, workload: Any, steps: Any = None, *, max_steps: int) -> SimulationRequest:
    """Validate the cluster and workload of a simulation; raise ActionError naming every
    bad field ("cluster.gpus", "workload.p90_tokens"). `steps` defaults to the config's
    stop.max_steps (`max_steps`), at most MAX_STEPS."""
    errors: dict[str, str] = {}
    cl = _parse(ClusterIn, "cluster", cluster, errors)
    wl = _parse(WorkloadIn, "workload", workload, errors)
    n = max_steps if steps in (None, "") else steps
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_STEPS:
        errors["steps"] = f"a whole number from 1 to {MAX_STEPS} (got {n!r}); lower stop.max_steps or give steps"
    if cl is not None and "steps" not in errors and cl.gpus * n > MAX_GPU_STEPS:
        errors["steps"] = (
            f"cluster.gpus × steps must be ≤ {MAX_GPU_STEPS:,} for one request (got {cl.gpus} × {n}): "
            f"simulate at most {MAX_GPU_STEPS // cl.gpus} steps on {cl.gpus} GPUs"
        )
    shape = None
    if cl is not None:
        try:
            shape = model_shape(cl.model)
        except ValueError as exc:
            errors["cluster.model"] = str(exc)
    if errors:
        raise ActionError(errors)
    assert cl is not None and wl is not None and shape is not None
    try:
        built_cluster = Cluster(
            gpus=cl.gpus,
            inference_share=cl.inference_share,
            tp=cl.tp,
            device=DEVICES[cl.gpu],
            inter_node=LINKS[cl.link],
        )
        built_workload = Workload(
            shape,
            prompt_tokens=wl.prompt_tokens,
            median_tokens=wl.median_tokens,
            p90_tokens=wl.p90_tokens or wl.median_tokens,
            max_tokens=wl.max_tokens,
        )
    except ValueError as exc:
        raise ActionError({"cluster": str(exc)}) from exc
    described = {
        "cluster": cl.model_dump(),
        "workload": wl.model_dump() | {"p90_tokens": wl.p90_tokens or wl.median_tokens},
        "model": {"name": shape.name, "params": shape.params, "layers": shape.layers},
        "steps": n,
    }
    return SimulationRequest(built_cluster, built_workload, n, described)


def check_simulated_launch(
    user, *, cluster: Any = None, workload: Any = None, steps: Any = None, **launch: Any
) -> tuple[LaunchRequest, SimulationRequest]:
    """A launch's fields (`check_launch`, whose role check refuses at once) and the
    simulation's, every field error of both in one ActionError."""
    errors: dict[str, str] = {}
    request = sim = None
    with field_errors(errors):
        request = check_launch(user, queued=False, **launch)  # stored finished: it takes no place in the queue
    max_steps = request.config.stop.max_steps if request is not None else MAX_STEPS
    with field_errors(errors):
        sim = check_simulation(cluster, workload, steps, max_steps=max_steps)
    if errors:
        raise ActionError(errors)
    assert request is not None and sim is not None
    return request, sim


@contextlib.contextmanager
def field_errors(errors: dict[str, str]) -> Iterator[None]:
    """Gather a refusal's field errors into `errors` (to answer every refused field at
    once); any other ActionError (a 403, a 404) goes through."""
    try:
        yield
    except ActionError as exc:
        if exc.http_status != ActionError.http_status:
            raise
        errors.update(exc.errors)


def _parse(model: type[BaseModel], field: str, value: Any, errors: dict[str, str]) -> Any:
    try:
        return model.model_validate(value if value is not None else {})
    except pydantic.ValidationError as exc:
        errors.update(errors_by_field([{**e, "loc": (field, *e["loc"])} for e in exc.errors()]))
        return None


def model_shape(model: str) -> ModelShape:
    """A built-in shape by name, else a Hugging Face model's: its config (from a
    directory under the model roots, or only the config.json of a Hub model of an owner
    the site allows: the engine's one confinement, workers/run/paths.py) read by
    transformers, and its parameters built on the meta device (no weights loaded).
    Nothing is read for a value the confinement refuses."""
    if model in MODELS:
        return MODELS[model]
    try:
        source = policy.confinement().shape_source(model, "cluster.model")
    except (PathNotAllowed, HubRefused) as exc:
        raise ValueError(f"{exc.message}; or give a built-in shape ({', '.join(MODELS)})") from None
    except HubUnavailable as exc:
        raise Unavailable({exc.field: exc.message}) from None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"{model!r} is neither a built-in shape ({', '.join(MODELS)}) nor a model whose config "
            f"transformers can read: {str(exc).splitlines()[0]}"
        ) from exc
    try:
        with torch.device("meta"):
            built = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"{model!r} is not a causal language model transformers can build: {exc}") from exc
    return shape_of(built)


def do_simulate_run(user, launch: LaunchRequest, sim: SimulationRequest, *, plan: dict | None = None) -> Run:
    """Simulate the launch's config and store it as a succeeded, simulated run with the
    simulator's series; the simulator runs before the transaction opens (seconds), so
    no row lock is held meanwhile. A ValueError of the simulator (a layout the cluster
    cannot hold) is a 400 on `cluster`. `plan`: the planner's table (`do_plan`), kept
    on the run."""
    t0 = time.time()
    try:
        result = simulate(launch.config, sim.cluster, sim.workload, steps=sim.steps)
    except ValueError as exc:
        raise ActionError({"cluster": str(exc)}) from exc
    # A simulated run's points carry the time they were stored: a simulated step has no
    # wall clock of this world. A value the simulator could not measure (NaN: no sync
    # happened) is left out, as the ingest leaves out a driver's.
    points = [
        (name, step, float(value), t0)
        for name, pts in result.series.items()
        for step, value in pts
        if math.isfinite(value)
    ]
    summary = {key: (value if math.isfinite(value) else None) for key, value in result.summary.items()}
    said = advice(result.summary, launch.config, sim.cluster)
    with transaction.atomic():
        stored = {**sim.described, "summary": summary, "advice": said} | ({"plan": plan} if plan else {})
        run = create_run(user, launch, simulated=True, simulation=stored)
        MetricPoint.objects.upsert(run.pk, points)
        # Straight to succeeded: a simulation never queues or runs on a worker.
        Run.objects.filter(pk=run.pk).update(
            status=Run.Status.SUCCEEDED,
            launched_at=run.created_at,
            started_at=run.created_at,
            finished_at=run.created_at,
        )
        run = Run.objects.select_related("experiment__team").get(pk=run.pk)
        audit.record(
            user, launch.team, audit.Action.LAUNCH, f"run {run.pk}", name=run.name, preset=run.preset, simulated=True
        )
        transaction.on_commit(lambda: events.send_status(run))
    logger.info(
        "run %s simulated by %s (%s steps, %s points, %.1f s)",
        run.pk,
        user,
        sim.steps,
        len(points),
        time.time() - t0,
        extra={"run_id": run.pk},
    )
    return run


@dataclass(frozen=True)
class Plan:
    """What `do_plan` stored: the best setting's simulated run, the as-given config's,
    and every candidate the search simulated, best first."""

    best: Run
    baseline: Run
    ranked: list[Candidate]


def candidate_row(candidate: Candidate) -> dict:
    """A candidate as JSON stores it: a figure the simulator could not measure (NaN) is None."""
    return {
        key: None if isinstance(value, float) and not math.isfinite(value) else value
        for key, value in dataclasses.asdict(candidate).items()
    }


def check_goal(value: Any) -> int | None:
    """A plan's `goal_samples`: a whole number of trained samples ≥ 1, or None (rank by
    samples/s). A form sends text."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str) and ID_TEXT.fullmatch(value.strip()):
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ActionError(
            {"goal_samples": f"a whole number of trained samples ≥ 1, or empty to rank by samples/s (got {value!r})"}
        )
    return value


def check_plan(user, *, goal_samples: Any = None, **fields: Any) -> tuple[LaunchRequest, SimulationRequest, int | None]:
    """A plan's fields: a simulated launch's (`check_simulated_launch`) and its goal,
    every field error of both in one ActionError."""
    errors: dict[str, str] = {}
    goal = checked = None
    with field_errors(errors):
        goal = check_goal(goal_samples)
    with field_errors(errors):
        checked = check_simulated_launch(user, **fields)
    if errors:
        raise ActionError(errors)
    assert checked is not None
    return (*checked, goal)


def do_plan(user, launch: LaunchRequest, sim: SimulationRequest, goal_samples: int | None = None) -> Plan:
    """Search the inference:trainer split, the staleness bound, the buffer depth and the
    sync protocol for `launch`'s config on `sim`'s cluster (workers/simulate/planner.py,
    each candidate `min(steps, PLAN_STEPS)` steps), then simulate the config as given
    and the best candidate for `sim.steps` each, stored as two simulated runs. The best
    one's `simulation["plan"]` holds the goal, the top PLAN_ROWS candidates and the
    as-given run's id. ActionError on `cluster.gpus` where the search would exceed
    MAX_PLAN_GPU_STEPS, on `cluster` where the cluster holds no candidate."""
    steps = min(sim.steps, PLAN_STEPS)
    tried = len(candidates(launch.config))
    if sim.cluster.gpus * steps * tried > MAX_PLAN_GPU_STEPS:
        raise ActionError(
            {
                "cluster.gpus": f"a plan simulates {tried} settings × {steps} steps: at most "
                f"{MAX_PLAN_GPU_STEPS // (steps * tried):,} GPUs in one request (got {sim.cluster.gpus:,}); "
                "simulate this cluster with Simulate instead"
            }
        )
    ranked = plan(launch.config, sim.cluster, sim.workload, steps=steps, goal_samples=goal_samples)
    if not ranked:
        raise ActionError({"cluster": "the cluster holds none of the settings the planner tries; give it more GPUs"})
    best = ranked[0]
    baseline = do_simulate_run(user, launch, sim)
    config = RunConfig.model_validate(deep_merge(launch.config.model_dump(mode="json"), best.overrides()))
    best_launch = dataclasses.replace(
        launch,
        # The suffix is cut, not the name, where the name is already at its longest.
        name=f"{launch.name} (planned)".strip()[:RUN_NAME_MAX] if len(launch.name) < RUN_NAME_MAX else launch.name,
        overrides=deep_merge(launch.overrides, best.overrides()),
        config=config,
    )
    best_sim = dataclasses.replace(
        sim,
        cluster=dataclasses.replace(sim.cluster, inference_share=best.inference_share),
        described={**sim.described, "cluster": {**sim.described["cluster"], "inference_share": best.inference_share}},
    )
    table = {
        "goal_samples": goal_samples,
        "steps": steps,
        "searched": len(ranked),
        "baseline_run": baseline.pk,
        "candidates": [candidate_row(c) for c in ranked[:PLAN_ROWS]],
        "staleness_caveat": staleness_caveat(launch.config, best),
    }
    return Plan(do_simulate_run(user, best_launch, best_sim, plan=table), baseline, ranked)


def _planned_name(planned: Run, row: int) -> str:
    base = planned.name.removesuffix(" (planned)")
    return f"{base} (plan row {row})"[:RUN_NAME_MAX]


def check_plan_row(user, run_id: int, row: int) -> tuple[Run, int, LaunchRequest, SimulationRequest]:
    """Row `row` of a planned run's table (1 is the best: the planned run itself), to
    simulate as the planned run was: its preset and overrides with the row's settings,
    its cluster at the row's split, its workload and steps. NotFound where the user
    cannot see the run; ActionError on `run` for a run that holds no plan, on `row` for
    a row the table lacks; the launch checked as any (the role to launch in the run's
    experiment), a row already simulated too: asking for one is a launch."""
    planned = check_run_access(user, run_id)
    table = planned.simulation.get("plan") if planned.simulated and planned.simulation else None
    if not table:
        raise ActionError({"run": f"run #{planned.pk} holds no plan: plan a run with Plan on the launch page"})
    rows = table["candidates"]
    if not 1 <= row <= len(rows):
        raise ActionError({"row": f"a row of the plan's table, 1 to {len(rows)} (got {row!r})"})
    candidate = Candidate(**{f.name: rows[row - 1][f.name] for f in dataclasses.fields(Candidate)})
    launch = check_launch(
        user,
        experiment=planned.experiment_id,
        name=_planned_name(planned, row),
        preset=planned.preset,
        # As a clone launches: the run's preset and its whole overrides.
        overrides=deep_merge(planned.overrides, candidate.overrides()),
        queued=False,
    )
    described = planned.simulation
    sim = check_simulation(
        {**described["cluster"], "inference_share": candidate.inference_share},
        described["workload"],
        described["steps"],
        max_steps=MAX_STEPS,
    )
    return planned, row, launch, sim


def _row_run(stored: dict) -> Run | None:
    """The run a row was simulated as, where it still exists."""
    pk = stored.get("run")
    return Run.objects.filter(pk=pk).first() if pk else None


def do_simulate_plan_row(
    user, planned: Run, row: int, launch: LaunchRequest, sim: SimulationRequest
) -> tuple[Run, bool]:
    """The checked row as a simulated run (`check_plan_row`), and whether it is new: the
    planned run for the first row, the run a row was simulated as before, else a new
    one, whose id the planned run's table keeps for the next visit."""
    if row == 1:
        return planned, False
    done = _row_run(planned.simulation["plan"]["candidates"][row - 1])
    if done is not None:
        return done, False
    made = do_simulate_run(user, launch, sim)
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=planned.pk)
        locked.simulation["plan"]["candidates"][row - 1]["run"] = made.pk
        locked.save(update_fields=["simulation"])
    return made, True
