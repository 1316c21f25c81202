"""Every page a user reaches, walked in Debian's Chromium (driven by Playwright) at 1280 px
wide against daphne, and judged by what is visible rather than by the DOM: no template
syntax in the page's text, no visible button for an action the run's state refuses, no
console error, no horizontal scroll, and on every chart card the card's title, Plotly's
legend and the axis titles clear of each other and inside the card.

The runs are rows made here in each state, with points stored; no engine runs. One run
is launched from the form and then driven through the driver's own ingest API (running,
then succeeded), so the run page is also judged as its run ends live; another fails
before its page first loads, with its "queued" flash still waiting. A full-page
screenshot of each page goes to tests/.artifacts/page-walk/ for a person to look at.

The second test keeps a run page open while more points arrive than a chart may hold."""

from __future__ import annotations

import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from compare.models import Comparison, ComparisonRun
from configs.models import SavedConfig
from runs.actions import check_launch
from runs.lineage import ENDED
from runs.models import Checkpoint, Experiment, MetricPoint, Run
from runs.simulation import check_simulation, do_simulate_run
from teams.models import Membership, Team
from tests.browser import PASSWORD, launch, log_in, skip_without_chromium, wait_for_value
from workers.config.presets import build
from workers.core.metric_names import DASHBOARD_CHARTS, PER_RANK, agent_series, rank_series

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = Path(__file__).resolve().parents[1] / ".artifacts" / "page-walk"
# `make docs-images` sets ROLLWAY_DOCS_IMAGES=1: the pages the README shows are saved
# again, as a reader's window sees them (the viewport, not the whole page), under docs/img/.
DOCS_IMAGES = {"run-running": "run-page.png", "compare": "compare.png"}
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
VIEWPORT = {"width": 1280, "height": 1000}
T0 = 1_700_000_000.0
STEPS = 60
TEMPLATE_SYNTAX = ("{#", "#}", "{%", "%}", "{{")
EVAL_SERIES = ("eval/pass@1", "eval/pass@k", "eval/reward_mean")
# The run page's action buttons; `allowed_actions` says which a run in a status may take
# (models.py's transitions, lineage.py's retry and resume, a succeeded run's export).
ACTIONS = {
    "cancel": "#cancel-button",
    "retry": "#retry-button",
    "resume": "#resume-button",
    "download": "#download-model",
    "clone": "#clone-button",
}


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height, from its IHDR chunk (bytes 16-24)."""
    head = path.read_bytes()[:24]
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def allowed_actions(status: str, *, checkpoints: bool) -> set[str]:
    allowed = {"clone"}
    if status in Run.ALLOWED_FROM[Run.Status.CANCELLING]:
        allowed.add("cancel")
    if status in ENDED:
        allowed.add("retry")
        if checkpoints:
            allowed.add("resume")
    if status == Run.Status.SUCCEEDED:
        allowed.add("download")
    return allowed


def points(run: Run, *, with_eval: bool) -> None:
    """STEPS steps of every charted series (eval's only when `with_eval`) and of
    policy/version, whose times the run page measures progress with; each run's lines
    apart from another's on the compare page."""
    trainer = run.config["trainer"]
    ranks = trainer["num_ranks"] if trainer["backend"] != "single" else 0
    names = [
        rank_series(name, r) if name in PER_RANK else name
        for _, series in DASHBOARD_CHARTS
        for name in series
        if with_eval or name not in EVAL_SERIES
        for r in (range(ranks) if name in PER_RANK else [0])
    ]
    if run.config["task"]["name"] == "propose_solve":  # a multi-agent run's own charts
        names += [agent_series(a, q) for a in ("proposer", "solver") for q in ("reward_mean", "p50_s", "p90_s")]
        names += ["episode/p50_s", "episode/p90_s", "buffer/late_groups"]
    lift = 0.05 * run.config["seed"]
    rows = [(name, s, lift + plausible(name, s, i), T0 + 2.0 * s) for i, name in enumerate(names) for s in range(STEPS)]
    rows += [("policy/version", s, float(s), T0 + 2.0 * s) for s in range(STEPS)]
    MetricPoint.objects.upsert(run.pk, rows)


def plausible(name: str, step: int, i: int) -> float:
    """A value of the kind the series holds (the README shows these pages): a reward that
    climbs and levels off, fractions within [0, 1], a loss that falls, rates and times that
    wobble about a level. Deterministic."""
    wobble = math.sin(step / 7.0 + i)
    if "reward" in name or "pass@" in name:
        return min(1.0, 0.16 + 0.66 * (1 - math.exp(-step / 15)) + 0.03 * wobble)
    if name.endswith(("_frac", "busy_frac")) or "/busy" in name or "/idle" in name or "ratio" in name:
        return 0.55 + 0.3 * wobble if "ratio" not in name else 1.0 + 0.02 * wobble
    if "staleness" in name:
        return 0.6 + 0.3 * wobble + (1.0 if name.endswith("max") else 0.0)
    if "loss" in name:
        return 0.4 * math.exp(-step / 25) + 0.03 * wobble
    if "per_s" in name:
        return 1500.0 + 200.0 * wobble + 5.0 * step + 10.0 * i
    if name.endswith(("_ms", "_s")):
        return 20.0 + 4.0 * wobble + 0.1 * i
    if name.startswith("buffer/"):
        return 8.0 if name.endswith("capacity") else 5.0 + 2.0 * wobble
    return 1.0 + 0.1 * i + 0.01 * step


POOL = {
    "trainer": {"backend": "fsdp2", "num_ranks": 3},
    "placement": {"devices": "gpu", "inference_node": "pool=rollout", "trainer_node": "pool=train"},
}
MULTI_AGENT = {"task": {"name": "propose_solve"}, "buffer": {"unit": "episode"}}
PLACEMENT = [
    {
        "actor": actor,
        "node_id": node * 28,
        "node_ip": ip,
        "labels": {"pool": pool, "ray.zone": "us-east1-b"},
        "gpu_ids": gpus,
        "cuda_visible_devices": ",".join(gpus),
        "pid": 1000 + k,
    }
    for k, (actor, node, ip, pool, gpus) in enumerate(
        [
            ("driver", "aa", "10.0.0.4", "rollout", []),
            ("trainer rank 0", "bb", "10.0.0.5", "train", ["0"]),
            ("trainer rank 1", "bb", "10.0.0.5", "train", ["1"]),
            ("trainer rank 2", "bb", "10.0.0.5", "train", ["2"]),
            ("inference worker 0", "aa", "10.0.0.4", "rollout", ["0"]),
            ("buffer", "aa", "10.0.0.4", "rollout", []),
        ]
    )
]


def seed(user) -> dict:
    """A team with a run in each state, a saved configuration and a comparison."""
    team = Team.objects.create(name="Walk")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    experiment = Experiment.objects.create(team=team, name="page walk", created_by=user)

    def make(status: str, name: str, *, eval_every: int = 0, seed_: int = 1, pool: dict | None = None, **fields) -> Run:
        overrides = {"seed": seed_, **({"eval": {"every_steps": eval_every}} if eval_every else {}), **(pool or {})}
        config = build("async", overrides).model_dump(mode="json")
        return Run.objects.create(
            experiment=experiment,
            name=name,
            preset="async",
            overrides=overrides,
            config=config,
            status=status,
            launched_by=user,
            **fields,
        )

    S = Run.Status
    runs = {
        "queued": make(S.QUEUED, "waiting its turn", phase=Run.QUEUE_WAITING, phase_detail="2 runs are active"),
        # A trainer pool on GPUs of two nodes: a line per rank, and where each actor runs.
        "running": make(
            S.RUNNING,
            "stepping now",
            eval_every=10,
            phase="stepping",
            phase_detail="step 59",
            pool=POOL,
            placement=PLACEMENT,
        ),
        # A run that ended keeps the phase its driver last reported.
        "succeeded": make(S.SUCCEEDED, "reached max steps", seed_=2, phase="stepping"),
        "failed": make(
            S.FAILED,
            "ran out of memory",
            eval_every=10,
            seed_=3,
            phase="stepping",
            error="The trainer ran out of memory at step 59.",
            error_detail="Traceback (most recent call last):\n  ...\nMemoryError",
        ),
        # A multi-agent task scheduled by episode: a chart per agent's reward and times.
        "cancelled": make(S.CANCELLED, "stopped by hand", phase="stepping", pool=MULTI_AGENT),
    }
    # A simulated run, through the simulator as the Simulate button runs it: its page has
    # the engine's series and no driver, so of the actions only Clone….
    launch = check_launch(user, experiment=experiment.pk, preset="async", name="simulated at 64 GPUs")
    sim = check_simulation({"gpus": 64}, {"median_tokens": 1024, "p90_tokens": 4096}, STEPS, max_steps=STEPS)
    runs["simulated"] = do_simulate_run(user, launch, sim)
    points(runs["running"], with_eval=True)
    points(runs["succeeded"], with_eval=False)
    points(runs["failed"], with_eval=True)
    points(runs["cancelled"], with_eval=False)
    # A replay of the succeeded run that trained the same: its page compares the two.
    replayed = {"parent": runs["succeeded"], "origin": Run.Origin.REPLAY}
    runs["replay"] = make(S.SUCCEEDED, "replay of max steps", seed_=2, phase="stepping", **replayed)
    points(runs["replay"], with_eval=False)
    Checkpoint.objects.create(run=runs["succeeded"], step=50, location="ckpt/50", bytes=2**20, sha256="ab" * 32)

    SavedConfig.objects.create(
        team=team,
        name="small buffer",
        base_preset="async",
        overrides={"buffer": {"capacity": 2}},
        description="async with a buffer of 2",
        created_by=user,
    )
    comparison = Comparison.objects.create(
        team=team, experiment=experiment, name="seeds", configurations=["async"], seeds=[2, 3], created_by=user
    )
    for key in ("succeeded", "failed"):
        ComparisonRun.objects.create(comparison=comparison, run=runs[key], configuration="async")
    return {"runs": runs, "experiment": experiment, "comparison": comparison}


def orm(fn):
    """`fn()` on a thread of its own: Playwright's sync API runs an event loop in the
    test's thread, where Django refuses database calls."""

    def call():
        from django.db import connection

        try:
            return fn()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


# The box of each chart card's title, Plotly legend and axis titles, in page pixels.
CHART_BOXES = """() => [...document.querySelectorAll("figure.chart-card")].map((card) => {
  const box = (el) => { const r = el.getBoundingClientRect();
    return { x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height }; };
  const parts = [];
  const caption = card.querySelector("figcaption");
  if (caption) parts.push(["title", box(caption)]);
  for (const sel of [".legend", ".xtitle", ".ytitle", ".gtitle"]) {
    card.querySelectorAll(sel).forEach((el) => {
      const b = box(el);
      if (b.w > 0 && b.h > 0) parts.push([sel.slice(1), b]);
    });
  }
  const chart = card.querySelector(".chart");
  const points = chart ? Number(chart.dataset.points || 0) : 0;
  return { name: caption ? caption.textContent.trim() : "?", card: box(card), parts: parts, points: points };
})"""
SCROLL = "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
TOLERANCE = 1.0  # px: boxes that merely touch do not overlap


def _overlap(a: dict, b: dict) -> bool:
    dx = min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"])
    dy = min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"])
    return dx > TOLERANCE and dy > TOLERANCE


def _inside(inner: dict, outer: dict) -> bool:
    return (
        inner["x"] >= outer["x"] - TOLERANCE
        and inner["y"] >= outer["y"] - TOLERANCE
        and inner["x"] + inner["w"] <= outer["x"] + outer["w"] + TOLERANCE
        and inner["y"] + inner["h"] <= outer["y"] + outer["h"] + TOLERANCE
    )


def chart_problems(page) -> list[str]:
    found = []
    for card in page.evaluate(CHART_BOXES):
        parts = card["parts"]
        if card["points"] and not any(kind == "legend" for kind, _ in parts):
            found.append(f"chart {card['name']!r}: no legend drawn")
        for i, (kind, box) in enumerate(parts):
            if not _inside(box, card["card"]):
                found.append(f"chart {card['name']!r}: {kind} sticks out of its card")
            for other, other_box in parts[i + 1 :]:
                if _overlap(box, other_box):
                    found.append(f"chart {card['name']!r}: {kind} overlaps {other}")
    return found


class Walk:
    """The walk's one page, what its console said, and what each page got wrong."""

    def __init__(self, page, base: str):
        self.page = page
        self.base = base
        self.console: list[str] = []
        self.problems: dict[str, list[str]] = {}
        page.on("console", lambda msg: self.console.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: self.console.append(f"uncaught: {exc}"))
        SHOTS.mkdir(parents=True, exist_ok=True)

    def look(self, name: str, extra: list[str] = ()) -> None:
        """Judge the page as it is now, save its screenshot, and start a fresh console."""
        page = self.page
        found = list(extra)
        text = page.inner_text("body")
        found += [f"template syntax {token!r} shown" for token in TEMPLATE_SYNTAX if token in text]
        width, client = page.evaluate(SCROLL)
        if width > client:
            found.append(f"scrolls sideways: {width} px of content in {client} px")
        found += chart_problems(page)
        found += [f"console: {line}" for line in self.console]
        self.console.clear()
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
        if name in DOCS_IMAGES:
            window = SHOTS / f"{name}-window.png"
            page.screenshot(path=str(window))
            if os.environ.get("ROLLWAY_DOCS_IMAGES") == "1":
                DOCS_IMG.mkdir(parents=True, exist_ok=True)
                (DOCS_IMG / DOCS_IMAGES[name]).write_bytes(window.read_bytes())
            shown = DOCS_IMG / DOCS_IMAGES[name]
            if not shown.is_file() or png_size(shown) != png_size(window):
                found.append(
                    f"the README's picture of this page, docs/img/{DOCS_IMAGES[name]}, is missing or not this "
                    f"walk's {png_size(window)} window: `make docs-images` takes it again"
                )
        if found:
            self.problems[name] = found

    def run_page(self, name: str, run_id: int, *, status: str, checkpoints: bool = False, phase: bool = False) -> None:
        """A run's page once its charts are drawn: its visible actions are the ones its
        status allows; the phase and progress show while it runs only; no flash says it
        is queued, and the line under its charts says it is final, once it has ended."""
        page = self.page
        page.goto(f"{self.base}/runs/{run_id}/")
        self.wait_for_charts()
        self.look(name, self.run_state(status, checkpoints=checkpoints, phase=phase))

    def run_state(self, status: str, *, checkpoints: bool, phase: bool) -> list[str]:
        page = self.page
        found = []
        shown = {action for action, sel in ACTIONS.items() if page.is_visible(sel)}
        want = allowed_actions(status, checkpoints=checkpoints)
        if shown != want:
            found.append(f"{status} run shows actions {sorted(shown)}, not {sorted(want)}")
        if page.is_visible("#run-phase") != phase:
            found.append(f"{status} run: phase {'hidden' if phase else 'shown'}")
        if page.is_visible("#run-progress") != phase:
            found.append(f"{status} run: progress bar {'hidden' if phase else 'shown'}")
        if status in ENDED and page.locator(".messages li", has_text="queued").is_visible():
            found.append(f"{status} run: the flash still says it is queued")
        said = page.get_attribute("#live-state", "data-state")
        if (said == "final") != (status in ENDED):  # an ended run is final, never "live"
            found.append(f"{status} run: the line under its charts is {said!r}")
        if not page.is_visible("#driver-log"):
            found.append(f"{status} run: no visible link to its driver log")
        return found

    def wait_for_charts(self) -> None:
        wait_for_value(
            self.page,
            """() => [...document.querySelectorAll(".chart")].every((c) => c.querySelector(".main-svg"))""",
            bool,
            timeout_s=30,
        )


@pytest.fixture
def run_logs(settings, tmp_path):
    """Where the runs' driver logs are (set before daphne forks)."""
    settings.ROLLWAY_RUN_LOG_DIR = str(tmp_path / "logs")
    (tmp_path / "logs").mkdir()
    return tmp_path / "logs"


def test_every_page_a_user_reaches_shows_only_what_applies_and_lays_out_cleanly(run_logs, daphne_url):
    skip_without_chromium()
    from django.contrib.auth import get_user_model
    from playwright.sync_api import expect, sync_playwright

    user = get_user_model().objects.create_user("walt", password=PASSWORD)
    seeded = seed(user)
    runs, experiment = seeded["runs"], seeded["experiment"]
    log_lines = [
        f"2026-01-02 03:04:05,{i:03d} INFO workers.run.driver: run {runs['running'].pk}: line {i}" for i in range(400)
    ]
    (run_logs / f"run-{runs['running'].pk}.log").write_text("\n".join(log_lines) + "\n")
    for old in SHOTS.glob("*.png"):
        old.unlink()
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(30_000)
            base = daphne_url
            walk = Walk(page, base)

            page.goto(f"{base}/accounts/login/")
            walk.look("login")
            page.fill("#id_username", "walt")
            page.fill("#id_password", PASSWORD)
            page.click("form button[type=submit]")
            expect(page).not_to_have_url(re.compile(r"/accounts/login/"))

            page.goto(f"{base}/")
            expect(page.locator(f'tr[data-run-id="{runs["queued"].pk}"]')).to_be_visible()
            walk.look("run-list")

            page.goto(f"{base}/runs/new/")
            expect(page.locator("#config-controls")).to_be_visible()  # launch.js built the controls
            walk.look("launch-form")

            walk.run_page("run-queued", runs["queued"].pk, status="queued")
            walk.run_page("run-running", runs["running"].pk, status="running", phase=True)
            expect(page.locator("#placement tbody tr")).to_have_count(len(PLACEMENT))
            expect(page.locator("#placement")).to_be_visible()
            lines = page.locator("#chart-trainer-ranks-busy-fraction .scatterlayer .trace").count()
            if lines != 3:
                walk.problems.setdefault("run-running", []).append(f"{lines} lines on the per-rank busy chart, not 3")
            # Its driver log, from the link on its page: the end of the file, and the download.
            page.click("#driver-log")
            page.wait_for_url(f"{base}/runs/{runs['running'].pk}/log/")
            expect(page.locator("#run-log")).to_contain_text(log_lines[-1])
            expect(page.locator("#download-log")).to_be_visible()
            walk.look("run-log")
            answer = page.goto(f"{base}/runs/{runs['queued'].pk}/log/")
            assert answer is not None and answer.status == 404
            expect(page.locator("#log-missing")).to_contain_text("its driver has not started, so there is no log yet")
            # Chromium reports the page's own 404 on the console: the one line expected here.
            walk.console.remove("Failed to load resource: the server responded with a status of 404 (Not Found)")
            walk.look("run-log-missing")
            walk.run_page("run-succeeded", runs["succeeded"].pk, status="succeeded", checkpoints=True)
            eval_note = page.locator("#chart-eval-held-out-prompts .annotation-text").all_text_contents()
            if not any("eval is off" in text for text in eval_note):
                walk.problems.setdefault("run-succeeded", []).append(f"eval chart with eval off says {eval_note}")
            walk.run_page("run-replay", runs["replay"].pk, status="succeeded")
            replay_found = [] if page.is_visible("#replay-comparison") else ["the replay's comparison is not shown"]
            verdict = page.inner_text("#replay-verdict") if page.is_visible("#replay-verdict") else "(hidden)"
            if "bit for bit" not in verdict or page.locator("#replay-comparison tbody tr").count() < 2:
                replay_found.append(f"the replay's verdict says {verdict!r}")
            if page.evaluate("() => getComputedStyle(document.querySelector('#replay-verdict')).color") == (
                page.evaluate("() => getComputedStyle(document.querySelector('#run-error')).color")
            ):
                replay_found.append("a bit-for-bit replay's verdict is drawn in the error colour")
            if replay_found:
                walk.problems.setdefault("run-replay", []).extend(replay_found)
            walk.run_page("run-failed", runs["failed"].pk, status="failed")
            if not page.is_visible("#run-error"):
                walk.problems.setdefault("run-failed", []).append("the failure's reason is not shown")
            walk.run_page("run-cancelled", runs["cancelled"].pk, status="cancelled")
            # The multi-agent run: a line per agent, the episode's tail and its late groups, drawn.
            for chart, lines in (
                ("agents-reward", 2),
                ("agents-completion-time-s", 4),
                ("episode-completion-time-s", 2),
                ("late-groups-cumulative", 1),
            ):
                drawn = page.locator(f"#chart-{chart} .scatterlayer .trace").count()
                if not page.is_visible(f"#chart-{chart} .main-svg") or drawn != lines:
                    walk.problems.setdefault("run-cancelled", []).append(f"chart {chart}: {drawn} lines of {lines}")
            page.goto(f"{base}/runs/{runs['simulated'].pk}/")
            walk.wait_for_charts()
            sim_found = [
                f"simulated run shows {sel}"
                for sel in ACTIONS.values()
                if sel != "#clone-button" and page.is_visible(sel)
            ]
            sim_found += [] if page.is_visible("#simulated-mark") else ["the simulated mark is not shown"]
            sim_found += [] if page.is_visible("#clone-button") else ["no Clone… on a simulated run"]
            walk.look("run-simulated", sim_found)

            page.goto(f"{base}/configs/")
            expect(page.get_by_text("small buffer").first).to_be_visible()
            walk.look("configurations")

            page.goto(f"{base}/comparisons/")
            expect(page.get_by_text("seeds").first).to_be_visible()
            walk.look("comparisons")

            page.goto(f"{base}/comparisons/new/")
            walk.look("comparison-new")

            # The compare page draws a chart as it scrolls into view: scroll to each.
            page.goto(f"{base}{seeded['comparison'].get_absolute_url()}")
            expect(page.locator('[data-metric="reward/mean"]')).to_have_attribute("data-state", "drawn")
            for chart in page.locator("#charts .chart").all():
                chart.scroll_into_view_if_needed()
                expect(chart).to_have_attribute("data-state", "drawn")
            page.evaluate("() => window.scrollTo(0, 0)")
            walk.look("compare")

            # Its league table: one row per configuration, the wide table scrolling in its box.
            page.click("#league-link")
            expect(page.locator("#league-table tbody tr")).to_have_count(1)
            walk.look("league")

            page.goto(f"{base}/teams/")
            walk.look("teams")

            page.goto(f"{base}/api/docs")
            expect(page.locator(".swagger-ui .info .title")).to_contain_text("Rollway API")
            walk.look("api-docs")

            # Launched from the form: the run page says it is queued, until the run ends.
            page.goto(f"{base}/runs/new/")
            page.select_option("#id_experiment", str(experiment.pk))
            page.fill("#id_name", "launched from the form")
            page.click("#launch-form button[type=submit]")
            page.wait_for_url(re.compile(r"/runs/\d+/$"))
            launched = int(re.search(r"/runs/(\d+)/$", page.url).group(1))
            expect(page.locator(".messages li", has_text=f"Run #{launched} queued.")).to_be_visible()
            expect(page.locator("#live-state")).to_have_attribute("data-state", "live")
            walk.wait_for_charts()
            walk.look("launched-queued", walk.run_state("queued", checkpoints=False, phase=False))

            # Its driver reports in, steps and finishes: the page follows over its socket.
            def report(run_id: int, path: str, body: dict) -> None:
                token = orm(lambda: Run.objects.get(pk=run_id).issue_ingest_token())
                answer = page.request.post(
                    f"{base}/api/runs/{run_id}/{path}",
                    data=json.dumps(body),
                    headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                )
                assert answer.ok, answer.text()

            report(launched, "status", {"status": "running", "phase": "stepping", "phase_detail": "step 9"})
            steps = [
                {"series": series, "step": s, "value": 0.1 * s, "time": T0 + s}
                for series in ("policy/version", "reward/mean")
                for s in range(10)
            ]
            report(launched, "metrics", {"points": steps})
            expect(page.locator("[data-role=status]")).to_have_text("running")
            expect(page.locator("#run-progress")).to_be_visible()
            walk.look("launched-running", walk.run_state("running", checkpoints=False, phase=True))
            report(launched, "status", {"status": "succeeded"})
            expect(page.locator("[data-role=status]")).to_have_text("succeeded")
            walk.look("launched-succeeded", walk.run_state("succeeded", checkpoints=False, phase=False))

            # Launched, and failed before its page first loads: the flash waiting for that
            # page says "queued" no more. The form is posted without following its redirect.
            page.goto(f"{base}/runs/new/")
            form = {
                "csrfmiddlewaretoken": page.input_value("input[name=csrfmiddlewaretoken]"),
                "experiment": str(experiment.pk),
                "name": "failed at once",
                "preset": "async",
                "overrides": "{}",
                "priority": "0",
            }
            answer = page.request.post(f"{base}/runs/new/", form=form, max_redirects=0)
            assert answer.status == 302, answer.text()
            failed = int(re.search(r"/runs/(\d+)/$", answer.headers["location"]).group(1))
            report(failed, "status", {"status": "failed", "error": "The model would not load."})
            walk.run_page("launched-failed-at-once", failed, status="failed")
        finally:
            browser.close()

    assert walk.problems == {}, json.dumps(walk.problems, indent=2)


@pytest.fixture
def small_reads(settings):
    """The metrics API downsamples each series to 10 points (set before daphne forks)."""
    settings.ROLLWAY_MAX_POINTS_PER_SERIES = 10
    return 10


# The reward chart's x values as drawn (null before its first trace).
REWARD_STEPS = "() => { const t = document.getElementById('chart-reward').data; return t && t[0].x; }"


@contextmanager
def running_run_page(daphne_url: str, username: str):
    """(page, run): a seeded running run's page, open in Chromium for a user of its own."""
    skip_without_chromium()
    from django.contrib.auth import get_user_model
    from playwright.sync_api import sync_playwright

    user = get_user_model().objects.create_user(username, password=PASSWORD)
    run = seed(user)["runs"]["running"]
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = log_in(browser, daphne_url, username)
            page.goto(f"{daphne_url}/runs/{run.pk}/")
            yield page, run
        finally:
            browser.close()


def test_a_run_page_left_open_holds_a_bounded_trace_that_still_starts_at_step_0(small_reads, daphne_url):
    with running_run_page(daphne_url, "lena") as (page, run):
        first = wait_for_value(page, REWARD_STEPS, lambda x: bool(x))
        assert len(first) <= small_reads and first[0] == 0
        wait_for_value(page, "() => document.getElementById('live-state').dataset.state", "live".__eq__)
        # Five reads' worth of steps, live: more than the trace may hold (twice a read).
        live = [
            {"series": "reward/mean", "step": s, "value": 0.01 * s, "time": T0 + 2.0 * s}
            for s in range(STEPS, STEPS + 5 * small_reads)
        ]
        answer = page.request.post(
            f"{daphne_url}/api/runs/{run.pk}/metrics",
            data=json.dumps({"points": live}),
            headers={"Authorization": f"Bearer {run.ingest_token}", "Content-Type": "application/json"},
        )
        assert answer.ok, answer.text()
        last = STEPS + 5 * small_reads - 1
        # Drawn, capped, then read again whole: the run from its first step to its last.
        steps = wait_for_value(page, REWARD_STEPS, lambda x: x[-1] == last and x[0] == 0 and len(x) <= small_reads)
        assert steps == sorted(steps)


def test_zooming_in_reads_the_steps_in_view_in_detail_and_zooming_out_the_whole_run(small_reads, daphne_url):
    with running_run_page(daphne_url, "zoe") as (page, _run):
        whole = wait_for_value(page, REWARD_STEPS, lambda x: bool(x))
        assert len(whole) <= small_reads and whole[0] == 0  # the run downsampled
        # A drag over steps 20–27 (as Plotly reports it): every step in view, in detail.
        page.evaluate("() => Plotly.relayout('chart-reward', {'xaxis.range[0]': 19.6, 'xaxis.range[1]': 27.2})")
        detail = wait_for_value(page, REWARD_STEPS, lambda x: x and x[0] >= 19 and x[-1] <= 28)
        assert detail == list(range(19, 29)), detail
        assert page.evaluate("() => document.getElementById('chart-reward').dataset.zoom") == "19-28"
        # A double click resets the axes: the whole run again, downsampled.
        page.evaluate("() => Plotly.relayout('chart-reward', {'xaxis.autorange': true})")
        again = wait_for_value(page, REWARD_STEPS, lambda x: x and x[0] == 0 and x[-1] == STEPS - 1)
        assert len(again) <= small_reads
