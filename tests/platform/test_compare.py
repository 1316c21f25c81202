"""The compare page's numbers, checked against the stored MetricPoints themselves."""

from __future__ import annotations

import csv
import io
import json
import random
from statistics import fmean

import pytest

from runs import rollups
from runs.metrics import read_many, read_series
from runs.models import MetricPoint, Run

T0 = 1_700_000_000.0
STEPS = 40


def store(run: Run, series: str, values: list[float], *, dt: float = 2.0, start: float = T0) -> None:
    MetricPoint.objects.upsert(run.pk, [(series, step, v, start + step * dt) for step, v in enumerate(values)])


@pytest.fixture
def grid(make_run):
    """2 configurations × 2 seeds, each with a few series, seeded so every run differs."""
    runs = {}
    for label, overrides in (("base", {}), ("fast-lr", {"trainer": {"lr": 3e-5}})):
        for seed in (1, 2):
            run = make_run(status=Run.Status.SUCCEEDED, name=f"{label}-{seed}", overrides={**overrides, "seed": seed})
            trainer = {**run.config["trainer"], **overrides.get("trainer", {})}
            run.config = {**run.config, "seed": seed, "trainer": trainer}
            run.save(update_fields=["config"])
            rng = random.Random(f"{label}{seed}")
            speed = 0.03 if label == "base" else 0.05
            store(run, "reward/mean", [min(1.0, speed * s + rng.uniform(-0.05, 0.05)) for s in range(STEPS)])
            store(run, "staleness/mean", [rng.uniform(0, 2) for _ in range(STEPS)], start=T0 - 1.0)
            store(run, "staleness/max", [rng.choice([1.0, 2.0, 5.0]) for _ in range(STEPS)])
            store(run, "samples/per_s", [rng.uniform(10, 20) for _ in range(STEPS)])
            store(run, "trainer/idle_frac", [rng.uniform(0, 0.5) for _ in range(STEPS)])
            store(run, "buffer/dropped_stale", [float(s // 4) for s in range(STEPS)])
            runs[(label, seed)] = run
    return runs


def ids(runs) -> str:
    return ",".join(str(r.pk) for r in runs)


def points(run: Run, series: str) -> list[MetricPoint]:
    return list(MetricPoint.objects.filter(run=run, series=series).order_by("step"))


def expected_figures(run: Run, target: float, budget: float) -> dict:
    t0 = min(p.time for p in MetricPoint.objects.filter(run=run))
    reward = points(run, "reward/mean")
    reached = None
    for i in range(4, len(reward)):
        if fmean(p.value for p in reward[i - 4 : i + 1]) >= target:
            reached = reward[i].time - t0
            break
    within = [p for p in reward if p.time - t0 <= budget]
    per_step = run.config["trainer"]["batch_groups"] * run.config["trainer"]["group_size"]
    last_step = max(p.step for p in MetricPoint.objects.filter(run=run))
    dropped = points(run, "buffer/dropped_stale")[-1].value
    return {
        "time_to_target_s": reached,
        "reward_at_budget": within[-1].value if within else None,
        "samples_per_s": fmean(p.value for p in points(run, "samples/per_s")),
        "trainer_busy": 1 - fmean(p.value for p in points(run, "trainer/idle_frac")),
        "staleness_mean": fmean(p.value for p in points(run, "staleness/mean")),
        "staleness_max": max(p.value for p in points(run, "staleness/max")),
        "dropped_frac": dropped * run.config["trainer"]["group_size"] / (last_step * per_step),
        "tokens_per_s": None,
    }


def test_runs_with_the_same_overrides_but_for_seed_form_one_configuration(client_for, owner, grid):
    body = client_for(owner).get(f"/api/compare?runs={ids(grid.values())}").json()
    groups = {c["label"]: sorted(c["runs"]) for c in body["configurations"]}
    assert len(groups) == 2
    assert sorted(groups.values()) == sorted(
        [sorted([grid["base", 1].pk, grid["base", 2].pk]), sorted([grid["fast-lr", 1].pk, grid["fast-lr", 2].pk])]
    )
    differing = {row["key"] for row in body["config_table"] if row["differs"]}
    assert differing == {"trainer.lr"}


@pytest.mark.parametrize("target, budget", [(0.8, 60.0), (0.5, 25.0), (2.0, 1000.0)])
def test_the_summary_equals_figures_computed_from_the_stored_points(client_for, owner, grid, target, budget):
    body = client_for(owner).get(f"/api/compare?runs={ids(grid.values())}&target={target}&budget={budget}").json()
    by_id = {r["id"]: r for r in body["runs"]}
    for run in grid.values():
        want = expected_figures(run, target, budget)
        got = by_id[run.pk]["figures"]
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-9) if value is not None else got[key] is None, key
    rows = {row["configuration"]: row["cells"] for row in body["summary"]["rows"]}
    for c in body["configurations"]:
        values = [by_id[r]["figures"]["reward_at_budget"] for r in c["runs"]]
        cell = rows[c["id"]]["reward_at_budget"]
        assert cell["mean"] == pytest.approx(fmean(values))
        assert cell["spread"] == pytest.approx((max(values) - min(values)) / 2)
    for key, pick in (("staleness_mean", min), ("samples_per_s", max)):  # lower, higher is better
        means = {cid: cells[key]["mean"] for cid, cells in rows.items()}
        assert body["summary"]["best"][key] == [cid for cid, m in means.items() if m == pick(means.values())]


def test_a_trainer_pools_figures_come_from_its_ranks_series(client_for, owner, make_run):
    pool, single = make_run(status=Run.Status.SUCCEEDED), make_run(status=Run.Status.SUCCEEDED)
    rng = random.Random(3)
    ranks = {}
    for r in range(2):
        ranks[r] = {
            "busy": [rng.uniform(0.5, 1) for _ in range(10)],
            "comm": [rng.uniform(0, 0.1) for _ in range(10)],
            "compute": [rng.uniform(0.1, 0.3) for _ in range(10)],
            "bytes": [rng.uniform(1e6, 2e6) for _ in range(10)],
        }
        store(pool, f"trainer/rank_busy_frac/{r}", ranks[r]["busy"])
        store(pool, f"trainer/rank_comm_s/{r}", ranks[r]["comm"])
        store(pool, f"trainer/rank_compute_s/{r}", ranks[r]["compute"])
        store(pool, f"trainer/rank_comm_bytes/{r}", ranks[r]["bytes"])
    store(single, "reward/mean", [0.1] * 10)
    body = client_for(owner).get(f"/api/compare?runs={pool.pk},{single.pk}").json()
    got = {r["id"]: r["figures"] for r in body["runs"]}
    want_share = fmean(fmean(ranks[r]["comm"]) / (fmean(ranks[r]["comm"]) + fmean(ranks[r]["compute"])) for r in ranks)
    assert got[pool.pk]["rank_busy_min"] == pytest.approx(min(fmean(ranks[r]["busy"]) for r in ranks))
    assert got[pool.pk]["rank_comm_share"] == pytest.approx(want_share)
    assert got[pool.pk]["rank_comm_bytes"] == pytest.approx(fmean(fmean(ranks[r]["bytes"]) for r in ranks))
    assert {got[single.pk][k] for k in ("rank_busy_min", "rank_comm_share", "rank_comm_bytes")} == {None}
    assert "trainer/rank_busy_frac" not in [
        m["name"] for m in body["metrics"]
    ]  # a series per rank: no chart of its own


def test_replay_on_and_off_show_their_mismatch_side_by_side(client_for, owner, make_run):
    """2 seeds with correction.keep_routing and keep_sampling_mask on, 2 with them off:
    the summary's mismatch columns are the means of the stored series, and the best is
    the lower KL and clipped share, the IS ratio nearer 1 and the higher agreement."""
    series = {}
    runs = []
    for on in (True, False):
        for seed in (1, 2):
            overrides = {"correction": {"keep_routing": on, "keep_sampling_mask": on}, "seed": seed}
            run = make_run(status=Run.Status.SUCCEEDED, overrides=overrides)
            rng = random.Random(f"{on}{seed}")
            series[run.pk] = {
                "mismatch/kl": [rng.uniform(0, 1e-6) if on else rng.uniform(1e-3, 5e-3) for _ in range(10)],
                # below 1 but nearer it than the other's above 1: the nearer one is best, not the higher
                "is/ratio_mean": [rng.uniform(0.995, 0.999) if on else rng.uniform(1.05, 1.1) for _ in range(10)],
                "is/clipped_frac": [0.0 if on else rng.uniform(0.01, 0.1) for _ in range(10)],
            }
            if on:  # the series exists only where keep_routing is on
                series[run.pk]["routing/agreement"] = [rng.uniform(0.8, 0.95) for _ in range(10)]
            for name, values in series[run.pk].items():
                store(run, name, values)
            runs.append(run)
    body = client_for(owner).get(f"/api/compare?runs={ids(runs)}").json()
    columns = {
        "mismatch_kl": "mismatch/kl",
        "is_ratio_mean": "is/ratio_mean",
        "is_clipped_frac": "is/clipped_frac",
        "routing_agreement": "routing/agreement",
    }
    got = {r["id"]: r["figures"] for r in body["runs"]}
    for run in runs:
        for key, name in columns.items():
            want = series[run.pk].get(name)
            assert got[run.pk][key] == (pytest.approx(fmean(want)) if want else None), key
    on, off = body["configurations"]
    assert on["label"].count("true") == 2 and off["label"].count("false") == 2
    rows = {row["configuration"]: row["cells"] for row in body["summary"]["rows"]}
    for key, name in columns.items():
        means = [
            fmean(fmean(series[r][name]) for r in c["runs"]) if name in series[c["runs"][0]] else None
            for c in (on, off)
        ]
        want = [None if m is None else pytest.approx(m) for m in means]
        assert [rows[c["id"]][key]["mean"] for c in (on, off)] == want
        assert body["summary"]["best"][key] == ([on["id"]] if key != "routing_agreement" else [])
    header = {c["key"]: c for c in body["summary"]["columns"]}
    assert header["is_ratio_mean"]["better"] == "closer to 1"


def test_time_to_target_needs_five_points_whose_mean_reaches_it(client_for, owner, make_run):
    run = make_run(status=Run.Status.SUCCEEDED)
    store(run, "reward/mean", [0.9, 0.9, 0.9, 0.9, 0.0, 0.9, 0.9, 0.9, 0.9, 0.9], dt=1.0)
    figures = client_for(owner).get(f"/api/compare?runs={run.pk}").json()["runs"][0]["figures"]
    assert figures["time_to_target_s"] == 9.0  # the first window of five without the dip ends at step 9
    assert figures["reward_at_budget"] == 0.9


def test_seed_bands_are_the_mean_min_and_max_over_seeds_at_each_step(client_for, owner, grid):
    body = client_for(owner).get(f"/api/compare?runs={ids(grid.values())}").json()
    for c in body["configurations"]:
        band = body["bands"][c["id"]]["reward/mean"]
        seeds = [points(Run.objects.get(pk=r), "reward/mean") for r in c["runs"]]
        assert band["steps"] == list(range(STEPS))
        for i in range(STEPS):
            values = [seed[i].value for seed in seeds]
            assert band["mean"][i] == pytest.approx(fmean(values))
            assert band["min"][i] == min(values) and band["max"][i] == max(values)


def test_a_band_of_long_series_comes_from_blocks_of_the_stored_points(client_for, owner, make_run):
    runs = []
    for seed, (n, offset) in enumerate([(3000, 0.0), (2500, 0.3), (3200, -0.2)]):
        run = make_run(status=Run.Status.SUCCEEDED, overrides={"seed": seed})
        rng = random.Random(seed)
        store(run, "reward/mean", [offset + rng.random() for _ in range(n)], dt=1.0 + seed, start=T0 + seed)
        runs.append(run)
    body = client_for(owner).get(f"/api/compare?runs={ids(runs)}&max_points=101&what=charts&series=reward/mean").json()
    [band] = [b["reward/mean"] for b in body["bands"].values()]
    assert all("reward/mean" not in s for s in body["series"].values())  # the band stands for the seeds

    keep = 50
    seeds = {r.pk: points(r, "reward/mean") for r in runs}
    t0 = {r.pk: min(p.time for p in MetricPoint.objects.filter(run=r)) for r in runs}
    width = next(w for w in rollups.WIDTHS if -(-3200 // w) <= 4 * keep)
    blocks = sorted({p.step // width for ps in seeds.values() for p in ps})
    size = -(-len(blocks) // keep)
    want = {"steps": [], "mean": [], "min": [], "max": [], "wall": []}
    for start in range(0, len(blocks), size):
        group = set(blocks[start : start + size])
        inside = {r: [p for p in ps if p.step // width in group] for r, ps in seeds.items()}
        inside = {r: ps for r, ps in inside.items() if ps}
        want["steps"].append(max(ps[-1].step for ps in inside.values()))
        want["mean"].append(fmean(fmean(p.value for p in ps) for ps in inside.values()))
        want["min"].append(min(p.value for ps in inside.values() for p in ps))
        want["max"].append(max(p.value for ps in inside.values() for p in ps))
        want["wall"].append(fmean(ps[-1].time - t0[r] for r, ps in inside.items()))
    assert band["steps"] == want["steps"] and band["min"] == want["min"] and band["max"] == want["max"]
    assert band["mean"] == pytest.approx(want["mean"]) and band["wall"] == pytest.approx(want["wall"])
    assert len(band["steps"]) <= keep


def test_a_configuration_with_one_seed_has_no_band_and_its_run_keeps_its_own_series(client_for, owner, grid):
    one = grid["base", 1]
    body = client_for(owner).get(f"/api/compare?runs={one.pk}").json()
    assert body["bands"] == {}
    series = body["runs"][0]["series"]["reward/mean"]
    stored = points(one, "reward/mean")
    assert series["values"] == [p.value for p in stored]
    assert series["wall"] == [p.time - (T0 - 1.0) for p in stored]  # staleness/mean came first


def test_the_summary_exports_as_csv_with_the_same_numbers(client_for, owner, grid):
    r = client_for(owner).get(f"/api/compare?runs={ids(grid.values())}&format=csv&what=summary")
    assert r.status_code == 200 and r["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.content.decode())))
    body = client_for(owner).get(f"/api/compare?runs={ids(grid.values())}").json()
    for row in rows:
        cell = next(x for x in body["summary"]["rows"] if x["configuration"] == row["configuration"])["cells"]
        want = cell[row["column"]]["mean"]
        assert (float(row["mean"]) if row["mean"] else None) == want


def test_the_series_export_has_every_stored_point(client_for, owner, grid):
    run = grid["fast-lr", 2]
    r = client_for(owner).get(f"/api/compare?runs={run.pk}&format=csv&what=series")
    rows = list(csv.DictReader(io.StringIO(b"".join(r.streaming_content).decode())))
    assert len(rows) == MetricPoint.objects.filter(run=run).count()
    per_step = run.config["trainer"]["batch_groups"] * run.config["trainer"]["group_size"]
    reward = [row for row in rows if row["series"] == "reward/mean"]
    assert [float(row["value"]) for row in reward] == [p.value for p in points(run, "reward/mean")]
    assert [int(row["samples"]) for row in reward] == [s * per_step for s in range(STEPS)]
    as_json = client_for(owner).get(f"/api/compare?runs={run.pk}&format=json&what=series")
    assert len(json.loads(b"".join(as_json.streaming_content))["rows"]) == len(rows)


# --- access and bad input -------------------------------------------------------------


def test_an_outsider_gets_a_404_naming_the_run(client_for, outsider, grid):
    run = grid["base", 1]
    r = client_for(outsider).get(f"/api/compare?runs={run.pk}")
    assert r.status_code == 404 and r.json() == {"errors": {"runs": f"run {run.pk} not found"}}
    assert client_for(outsider).get(f"/compare/?runs={run.pk}").status_code == 404


def test_one_foreign_run_among_visible_ones_is_a_404_naming_it(client_for, owner, outsider, grid):
    from runs.models import Experiment
    from workers.config.presets import build

    theirs = Run.objects.create(
        experiment=Experiment.objects.get(name="theirs"), name="x", preset="async", config=build("async").model_dump()
    )
    r = client_for(owner).get(f"/api/compare?runs={grid['base', 1].pk},{theirs.pk}")
    assert r.status_code == 404 and f"run {theirs.pk} not found" in r.json()["errors"]["runs"]


def test_a_reward_functions_series_can_be_asked_for_by_name(client_for, owner, grid):
    run = grid["base", 1]
    MetricPoint.objects.upsert(
        run.pk, [("rewards/accuracy/mean", 1, 0.5, 1.0), ("rewards/accuracy/mean", 2, 0.75, 2.0)]
    )
    url = f"/api/compare?runs={ids(grid.values())}&what=charts&series=rewards/accuracy/mean"
    body = client_for(owner).get(url).json()
    assert body["series"][str(run.pk)]["rewards/accuracy/mean"]
    r = client_for(owner).get(f"/api/compare?runs={ids(grid.values())}&what=charts&series=rewards/accuracy/median")
    assert r.status_code == 400 and "unknown metric 'rewards/accuracy/median'" in r.json()["errors"]["series"]


def test_an_agents_series_can_be_asked_for_and_episodes_have_their_columns(client_for, owner, grid):
    run = grid["base", 1]
    MetricPoint.objects.upsert(
        run.pk,
        [
            ("agent/solver/p90_s", 1, 2.5, 1.0),
            ("episode/p90_s", 1, 4.0, 1.0),
            ("episode/p90_s", 2, 6.0, 2.0),
            ("buffer/late_groups", 2, 3.0, 2.0),
        ],
    )
    url = f"/api/compare?runs={ids(grid.values())}&what=charts&series=agent/solver/p90_s"
    assert client_for(owner).get(url).json()["series"][str(run.pk)]["agent/solver/p90_s"]
    r = client_for(owner).get(f"/api/compare?runs={ids(grid.values())}&what=charts&series=agent/solver/p99_s")
    assert r.status_code == 400 and "unknown metric 'agent/solver/p99_s'" in r.json()["errors"]["series"]
    from compare.analysis import run_figures

    figures = run_figures([run], target=0.8, budget_s=60.0)[run.pk]
    assert figures["episode_p90_s"] == 5.0
    assert figures["late_per_step"] == pytest.approx(3.0 / figures["last_step"])


def test_a_chart_asks_only_for_its_own_series(client_for, owner, grid):
    c = client_for(owner)
    url = f"/api/compare?runs={ids(grid.values())}"
    everything = c.get(url).json()
    tables_only = c.get(url + "&series=").json()
    assert tables_only["summary"] == everything["summary"]
    assert all(r["series"] == {} for r in tables_only["runs"]) and tables_only["bands"] == {}
    assert tables_only["metrics"][0]["name"] == "reward/mean"  # the headline charts come first

    one = c.get(url + "&what=charts&series=staleness/max").json()
    assert set(one) == {"series", "bands"}
    for r in everything["runs"]:
        assert one["series"][str(r["id"])] == {"staleness/max": r["series"]["staleness/max"]}
    assert one["bands"] == {cid: {"staleness/max": b["staleness/max"]} for cid, b in everything["bands"].items()}


@pytest.mark.parametrize(
    "query, field",
    [
        ("runs=", "runs"),
        ("runs=a,b", "runs"),
        ("runs=9223372036854775808", "runs"),
        ("runs=0", "runs"),
        ("runs={id}&target=x", "target"),
        ("runs={id}&format=xml", "format"),
        ("runs={id}&what=everything", "what"),
        ("runs={id}&budget=nan", "budget"),
        ("runs={id}&format=csv&what=all", "what"),
        ("runs={id}&format=csv&what=charts", "what"),
        ("runs={id}&series=reward/mean,no/such", "series"),
    ],
)
def test_bad_compare_parameters_are_400s_naming_the_field(client_for, owner, grid, query, field):
    r = client_for(owner).get("/api/compare?" + query.format(id=grid["base", 1].pk))
    assert r.status_code == 400
    assert field in r.json()["errors"]


def test_the_page_needs_a_login_and_shows_the_runs(client, client_for, owner, grid):
    run = grid["base", 1]
    assert client.get(f"/compare/?runs={run.pk}").status_code == 302
    page = client_for(owner).get(f"/compare/?runs={run.pk}")
    assert page.status_code == 200 and f'data-runs="{run.pk}"' in page.content.decode()


# --- downsampling in the database ---------------------------------------------------------


def expected_decimation(values: list[float], max_points: int, after: int = -1) -> list[int]:
    """The steps min-max decimation keeps, from the points themselves: steps cut into
    blocks of the narrowest rollup width with at most 4× the wanted buckets, consecutive
    blocks merged into groups of equal count, each group's first min and first max, and
    the last step (steps > after only); every step when they are few enough."""
    keep = (max_points - 1) // 2
    steps = [s for s in range(len(values)) if s > after]
    if len(steps) <= max_points:
        return steps
    span = steps[-1] - steps[0] + 1
    width = next((w for w in rollups.WIDTHS if -(-span // w) <= 4 * keep), rollups.WIDTHS[-1])
    blocks = sorted({s // width for s in range(len(values)) if s // width >= max(after, 0) // width})
    size = -(-len(blocks) // keep)
    want = set()
    for start in range(0, len(blocks), size):
        group = set(blocks[start : start + size])
        members = [s for s in range(len(values)) if s // width in group]
        want.add(min(members, key=lambda s: (values[s], s)))
        want.add(min(members, key=lambda s: (-values[s], s)))
    want.add(len(values) - 1)
    return sorted(s for s in want if s > after)


@pytest.mark.parametrize("n, max_points", [(5000, 101), (100_000, 501), (3000, 2999)])
def test_downsampling_keeps_each_groups_min_max_and_the_last_point(run, n, max_points):
    rng = random.Random(7)
    values = [rng.gauss(0, 1) for _ in range(n)]
    store(run, "staleness/max", values, dt=0.5)
    got = read_series(run, max_points=max_points)["staleness/max"]
    assert got["steps"] == expected_decimation(values, max_points)
    assert got["values"] == [values[s] for s in got["steps"]]
    assert got["times"] == [T0 + 0.5 * s for s in got["steps"]]
    assert len(got["steps"]) <= max_points and got["total"] == n and got["downsampled"]
    assert got["last_step"] == n - 1
    # live refreshes ask for what is newer than the last step they have
    newer = read_series(run, max_points=max_points, after_step=n - 2000)["staleness/max"]
    assert newer["steps"] == expected_decimation(values, max_points, after=n - 2000)


def test_a_read_holds_a_few_series_rows_at_a_time_not_every_series(run):
    # A long run's level is up to FAN_OUT × keep rows per series; holding all series'
    # rows at once made the run page's read peak grow with the run and its series.
    import tracemalloc

    names = [f"bench/extra-{i:03d}" for i in range(24)]
    MetricPoint.objects.upsert(run.pk, [(name, st, st % 97 / 97, T0 + st) for name in names for st in range(3000)])

    def held(series: list[str]) -> tuple[int, dict]:
        """What the read held at its peak beyond the answer it keeps."""
        tracemalloc.start()
        try:
            got = read_series(run, series, max_points=100)
            current, peak = tracemalloc.get_traced_memory()
            return peak - current, got
        finally:
            tracemalloc.stop()

    few, _ = held(names[:4])
    every, got = held(names)
    assert len(got) == 24 and all(s["downsampled"] and len(s["steps"]) <= 100 for s in got.values())
    # Six times the series: the answer grows six-fold, the rows held on the way to it
    # do not (every series' rows at once would hold six times the 4-series read's).
    assert every < 2.5 * few, (every, few)


def test_a_short_series_comes_back_whole_and_after_step_cuts_it(run):
    store(run, "loss", [float(s) for s in range(30)])
    whole = read_series(run, ["loss"], max_points=100)["loss"]
    assert whole["steps"] == list(range(30)) and not whole["downsampled"]
    assert read_series(run, ["loss"], after_step=25)["loss"]["steps"] == [26, 27, 28, 29]


def test_one_query_reads_many_runs_series_apart(grid):
    a, b = grid["base", 1], grid["fast-lr", 2]
    got = read_many([a.pk, b.pk], ["reward/mean"], max_points=11)
    for run in (a, b):
        stored = points(run, "reward/mean")
        s = got[run.pk]["reward/mean"]
        assert len(s["steps"]) <= 11 and s["steps"][-1] == STEPS - 1
        assert max(s["values"]) == max(p.value for p in stored)
        assert min(s["values"]) == min(p.value for p in stored)
