"""The league table (compare/league.py): a comparison's configurations one row each, their
runs' figures measured here and their simulated runs' at 7B and 32B on 64 and 512 GPUs,
each cell linking to the runs behind it."""

from __future__ import annotations

import json

import pytest

from compare import league
from compare.models import Comparison, ComparisonRun, ComparisonSimulation
from runs.models import MetricPoint, Run
from teams.models import Membership
from tests.platform.conftest import _user
from workers.config.presets import PRESETS, build


def post(client, url, body=None):
    return client.post(url, json.dumps(body or {}), content_type="application/json")


def finished_run(comparison: Comparison, configuration: str, seed: int, series: dict[str, list[float]]) -> Run:
    """A succeeded run of `configuration` in `comparison`, its series one point a step
    (step 1 first, a second apart)."""
    run = Run.objects.create(
        experiment=comparison.experiment,
        name=f"{configuration} · seed {seed}",
        preset=configuration,
        config=build(configuration, {"seed": seed}).model_dump(mode="json"),
        status=Run.Status.SUCCEEDED,
    )
    points = [
        (name, step, float(v), 1000.0 + step) for name, values in series.items() for step, v in enumerate(values, 1)
    ]
    MetricPoint.objects.upsert(run.pk, points)
    ComparisonRun.objects.create(comparison=comparison, run=run, configuration=configuration)
    return run


@pytest.fixture
def comparison(team, experiment, owner):
    return Comparison.objects.create(
        team=team, experiment=experiment, name="styles", configurations=["async", "sync"], seeds=[0, 1]
    )


def test_each_configuration_is_a_row_of_its_runs_means_each_cell_linking_to_them(client_for, owner, comparison):
    # async: two seeds; sync: one, slower, staler-free, evaluated once only (no gain).
    a0 = finished_run(
        comparison,
        "async",
        0,
        {
            "samples/per_s": [10, 14],
            "reward/mean": [0.9] * 5,
            "staleness/mean": [1, 1],
            "trainer/idle_frac": [0.2, 0.4],
            "sync/bytes": [2e6, 2e6],
            "eval/pass@1": [0.2, 0.3],
        },
    )
    a1 = finished_run(comparison, "async", 1, {"samples/per_s": [16, 16], "eval/pass@1": [0.1, 0.3, 0.4]})
    s0 = finished_run(comparison, "sync", 0, {"samples/per_s": [5, 5], "staleness/mean": [0, 0], "eval/pass@1": [0.5]})
    Run.objects.create(  # a run still going is left out until it ends
        experiment=comparison.experiment, name="going", preset="sync", config={}, status=Run.Status.RUNNING
    )

    got = client_for(owner).get(f"/api/comparisons/{comparison.pk}/league?target=0.8").json()

    rows = {row["configuration"]: row for row in got["rows"]}
    assert [r["configuration"] for r in got["rows"]] == ["async", "sync"]
    a, s = rows["async"]["cells"], rows["sync"]["cells"]
    assert a["samples_per_s"]["value"] == pytest.approx((12 + 16) / 2) and a["samples_per_s"]["n"] == 2
    assert s["samples_per_s"]["value"] == 5
    # pass@1 gain per 1k samples: (last − first) ÷ samples seen (steps × B × G) × 1000.
    per_step = build("async").trainer.batch_groups * build("async").trainer.group_size
    gains = [(0.3 - 0.2) / (5 * per_step) * 1000, (0.4 - 0.1) / (3 * per_step) * 1000]
    assert a["pass_gain_per_ksample"]["value"] == pytest.approx(sum(gains) / 2)
    assert s["pass_gain_per_ksample"]["value"] is None  # one eval: no gain to read
    assert a["trainer_idle"]["value"] == pytest.approx(0.3) and a["sync_bytes"]["value"] == 2e6
    assert a["time_to_target_s"]["value"] == pytest.approx(4.0)  # the 5th point: the first 5-point mean
    assert a["time_to_target_s"]["text"] == "4 (1 of 2 runs)"  # a1 has no reward: it never got there
    assert a["samples_per_s"]["text"] == "14" and (a["samples_per_s"]["n"], a["samples_per_s"]["of"]) == (2, 2)
    assert s["time_to_target_s"]["value"] is None
    assert a["samples_per_s"]["url"].endswith(f"runs={a0.pk},{a1.pk}")
    assert s["staleness_mean"]["url"].endswith(f"runs={s0.pk}")
    assert rows["async"]["runs"] == [a0.pk, a1.pk]
    assert got["best"]["samples_per_s"] == ["async"] and got["best"]["staleness_mean"] == ["sync"]
    # Nothing simulated yet: every simulated cell empty and unlinked.
    empty = {"value": None, "text": "—", "n": 0, "of": 1, "url": ""}
    assert all(a[f"{s.key}:samples_per_s"] == empty for s in league.SCALES)


def test_a_cell_not_every_seed_gave_says_so_and_is_never_the_best(client_for, owner, comparison):
    # async reaches the target sooner, but on one seed of two; sync later, on its only seed.
    finished_run(comparison, "async", 0, {"reward/mean": [0.9] * 5})
    finished_run(comparison, "async", 1, {"reward/mean": [0.1] * 8})
    finished_run(comparison, "sync", 0, {"reward/mean": [0.1, 0.1] + [0.9] * 5})

    got = client_for(owner).get(f"/api/comparisons/{comparison.pk}/league?target=0.8").json()

    cells = {row["configuration"]: row["cells"]["time_to_target_s"] for row in got["rows"]}
    assert (cells["async"]["value"], cells["async"]["text"]) == (pytest.approx(4.0), "4 (1 of 2 runs)")
    assert (cells["sync"]["value"], cells["sync"]["text"]) == (pytest.approx(6.0), "6")
    assert got["best"]["time_to_target_s"] == ["sync"]


def test_rows_that_read_the_same_are_both_the_best(client_for, owner, comparison):
    finished_run(comparison, "async", 0, {"trainer/idle_frac": [0.031, 0.031]})
    finished_run(comparison, "sync", 0, {"trainer/idle_frac": [0.034, 0.034]})

    got = client_for(owner).get(f"/api/comparisons/{comparison.pk}/league").json()

    assert [row["cells"]["trainer_idle"]["text"] for row in got["rows"]] == ["3%", "3%"]
    assert got["best"]["trainer_idle"] == ["async", "sync"]


def test_simulating_fills_each_scale_with_a_simulated_run_the_cell_links_to(client_for, owner, comparison):
    client = client_for(owner)
    response = post(client, f"/api/comparisons/{comparison.pk}/league/simulate")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["errors"] == {} and len(body["simulated"]) == 2 * len(league.SCALES)
    made = Run.objects.filter(pk__in=body["simulated"])
    assert all(r.simulated and r.status == Run.Status.SUCCEEDED for r in made)
    links = ComparisonSimulation.objects.filter(comparison=comparison)
    assert {(link.configuration, link.model, link.gpus) for link in links} == {
        (c, s.model, s.gpus) for c in ("async", "sync") for s in league.SCALES
    }
    for link in links:  # each scale's cluster and batch, as the league lays it out
        cluster, config = link.run.simulation["cluster"], link.run.config
        assert (cluster["model"], cluster["gpus"], cluster["tp"]) == (
            link.model,
            link.gpus,
            4 if link.model == "32B" else 1,
        )
        assert config["trainer"]["batch_groups"] == max(32, min(512, link.gpus))
        assert link.run.preset == link.configuration
    rows = {row["configuration"]: row["cells"] for row in body["league"]["rows"]}
    for configuration, cells in rows.items():
        for scale in league.SCALES:
            cell = cells[f"{scale.key}:samples_per_s"]
            run = links.get(configuration=configuration, model=scale.model, gpus=scale.gpus).run
            assert cell["value"] == pytest.approx(run.simulation["summary"]["samples_per_s"]) and cell["value"] > 0
            assert cell["url"] == run.get_absolute_url()
            idle = cells[f"{scale.key}:trainer_idle"]["value"]
            assert idle == pytest.approx(1 - run.simulation["summary"]["trainer_busy"]) and 0 <= idle <= 1
    # Simulating again adds runs; the league shows each cell's newest.
    again = post(client, f"/api/comparisons/{comparison.pk}/league/simulate").json()
    newest = again["league"]["rows"][0]["cells"][f"{league.SCALES[0].key}:samples_per_s"]["url"]
    assert newest == Run.objects.get(pk=again["simulated"][0]).get_absolute_url()
    assert ComparisonSimulation.objects.filter(comparison=comparison).count() == 4 * len(league.SCALES)
    assert not comparison.runs.filter(simulated=True).exists()  # not among the runs it compares


def test_a_viewer_may_read_the_league_but_not_simulate_and_outsiders_see_nothing(
    client_for, team, owner, outsider, comparison
):
    viewer = _user("vera")
    Membership.objects.create(team=team, user=viewer, role=Membership.Role.VIEWER)
    assert client_for(viewer).get(f"/api/comparisons/{comparison.pk}/league").status_code == 200
    refused = post(client_for(viewer), f"/api/comparisons/{comparison.pk}/league/simulate")
    assert refused.status_code == 403
    assert not Run.objects.exists() and not ComparisonSimulation.objects.exists()
    for url in (f"/api/comparisons/{comparison.pk}/league", f"/comparisons/{comparison.pk}/league/"):
        assert client_for(outsider).get(url).status_code == 404
    assert post(client_for(outsider), f"/api/comparisons/{comparison.pk}/league/simulate").status_code == 404
    bad = client_for(owner).get(f"/api/comparisons/{comparison.pk}/league?target=high")
    assert bad.status_code == 400 and "target" in bad.json()["errors"]


def test_a_preset_row_says_what_it_only_approximates_of_its_library():
    assert league.approximation("prime-rl").startswith("Approximates: PRIME-RL masks a token")
    assert "Cannot reproduce: dropping in-flight work" in league.approximation("prime-rl")
    assert league.approximation("slime").startswith("Cannot reproduce: OPSM")
    assert league.approximation("async") == "" and league.approximation("saved:3") == ""
    # Every preset naming what it approximates or cannot reproduce has it in its row.
    for name, preset in PRESETS.items():
        said = league.approximation(name)
        for word in ("Approximates:", "Cannot reproduce:"):
            assert (word in preset["description"]) == (word in said), name


def test_the_page_draws_a_row_per_configuration_and_the_comparison_links_to_it(client_for, owner, comparison):
    finished_run(comparison, "async", 0, {"samples/per_s": [3, 3]})
    client = client_for(owner)
    page = client.get(f"/comparisons/{comparison.pk}/league/").content.decode()
    assert page.count('<tr data-configuration="') == 2 and 'id="simulate-scales"' in page
    assert (
        f'href="/comparisons/{comparison.pk}/league/"' in client.get(f"/comparisons/{comparison.pk}/").content.decode()
    )
    response = client.post(f"/comparisons/{comparison.pk}/league/simulate/", follow=True)
    assert f"Simulated {2 * len(league.SCALES)} runs" in response.content.decode()
    assert ComparisonSimulation.objects.filter(comparison=comparison).count() == 2 * len(league.SCALES)
