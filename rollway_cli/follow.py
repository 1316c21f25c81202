"""Following a run by polling the API: its detail (status, phase, stop condition) and
its newest metric points (`after_step`, so each poll reads only what is new), folded
into Snapshots for a view (followview.py) to draw.

Progress is toward the run's stop condition as the engine applies it: stop.max_steps
trained steps or stop.max_minutes of wall time, whichever comes first, so the binding
one is the one further along.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from rollway_cli.client import Api
from rollway_cli.errors import OK, RUN_CANCELLED, RUN_FAILED, UNREACHABLE, CliError

STEPS, REWARD, LOSS, SAMPLES = "policy/version", "reward/mean", "loss", "samples/per_s"
SERIES = (STEPS, REWARD, LOSS, SAMPLES)
# The API's smallest page of points; after_step keeps a poll to the few new steps anyway.
MAX_POINTS = 10
EXIT_CODES = {"succeeded": OK, "failed": RUN_FAILED, "cancelled": RUN_CANCELLED}


@dataclass(frozen=True)
class Progress:
    done: float
    total: float
    unit: str  # "steps" or "minutes"

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0


@dataclass(frozen=True)
class Snapshot:
    run: int
    name: str
    status: str
    is_terminal: bool
    phase: str
    phase_detail: str
    waiting_for: str | None
    error: str
    url: str
    steps: int | None
    max_steps: int | None
    max_minutes: float | None
    elapsed_s: float | None
    reward: float | None
    loss: float | None
    samples_per_s: float | None

    @property
    def progress(self) -> Progress | None:
        """Toward the binding stop condition; None while the run has no clock yet."""
        candidates = []
        if self.max_steps:
            candidates.append(Progress(float(self.steps or 0), float(self.max_steps), "steps"))
        if self.max_minutes and self.elapsed_s is not None:
            candidates.append(Progress(self.elapsed_s / 60, float(self.max_minutes), "minutes"))
        if not candidates:
            return None
        return max(candidates, key=lambda p: p.fraction)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.status, RUN_FAILED)

    def as_json(self) -> dict:
        progress = self.progress
        return {**asdict(self), "progress": asdict(progress) | {"fraction": progress.fraction} if progress else None}


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def elapsed(detail: dict, now: datetime) -> float | None:
    """Seconds since the driver reported in, to the end for a finished run."""
    started = _time(detail.get("started_at"))
    if started is None:
        return None
    end = _time(detail.get("finished_at")) or now
    return max(0.0, (end - started).total_seconds())


class Watcher:
    """The run's state, brought up to date by `poll`."""

    def __init__(self, api: Api, run_id: int):
        self.api = api
        self.run_id = run_id
        self.latest: dict[str, tuple[int, float]] = {}  # series → (step, value) of its newest point

    def _after_step(self) -> int | None:
        # Each step's metrics arrive together, but read from the least advanced series so
        # none can miss a point that landed between two reads.
        return min((step for step, _ in self.latest.values()), default=None)

    def poll(self, now: datetime | None = None) -> Snapshot:
        # Detail first: when it says the run ended, the metrics read after it are complete.
        detail = self.api.get(f"/api/runs/{self.run_id}")
        series = self.api.get(
            f"/api/runs/{self.run_id}/metrics",
            series=",".join(SERIES),
            after_step=self._after_step(),
            max_points=MAX_POINTS,
        )["series"]
        for name, points in series.items():
            if points.get("steps"):
                self.latest[name] = (points["steps"][-1], points["values"][-1])
        stop = (detail.get("config") or {}).get("stop") or {}
        value = {name: v for name, (_, v) in self.latest.items()}
        steps = value.get(STEPS)
        return Snapshot(
            run=detail["id"],
            name=detail.get("name", ""),
            status=detail["status"],
            is_terminal=bool(detail.get("is_terminal")),
            phase=detail.get("phase") or "",
            phase_detail=detail.get("phase_detail") or "",
            waiting_for=detail.get("waiting_for"),
            error=detail.get("error") or "",
            url=self.api.page_url(detail.get("url") or f"/runs/{self.run_id}/"),
            steps=int(steps) if steps is not None else None,
            max_steps=stop.get("max_steps"),
            max_minutes=stop.get("max_minutes"),
            elapsed_s=elapsed(detail, now or datetime.now(UTC)),
            reward=value.get(REWARD),
            loss=value.get(LOSS),
            samples_per_s=value.get(SAMPLES),
        )


def watch(
    api: Api,
    run_id: int,
    *,
    interval_s: float = 2.0,
    patience_s: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[CliError], None] | None = None,
) -> Iterator[Snapshot]:
    """Snapshots every `interval_s` until the run ends (the last one is terminal). A site
    that stops answering (a restart) is retried for `patience_s` before giving up; any
    other error (the run is not found, the token revoked) ends the watch at once."""
    watcher = Watcher(api, run_id)
    failing_since: float | None = None
    while True:
        try:
            snapshot = watcher.poll()
        except CliError as exc:
            if exc.exit_code != UNREACHABLE:
                raise
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > patience_s:
                raise
            if on_retry:
                on_retry(exc)
            sleep(interval_s)
            continue
        failing_since = None
        yield snapshot
        if snapshot.is_terminal:
            return
        sleep(interval_s)
