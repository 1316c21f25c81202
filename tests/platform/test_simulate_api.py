"""Simulating a run from the API: the launch's config on a described cluster and
workload, stored as a succeeded run marked simulated whose series the run page reads;
errors name the field; who may launch may simulate."""

from __future__ import annotations

import json

from runs.models import Run
from teams.models import Membership

URL = "/api/simulations"
CLUSTER = {"gpus": 16, "inference_share": 0.5}
WORKLOAD = {"median_tokens": 1024, "p90_tokens": 4096}


def post_json(client, body):
    return client.post(URL, data=json.dumps(body), content_type="application/json")


def body(experiment, **fields):
    return {
        "experiment": experiment.pk,
        "preset": "async",
        "cluster": CLUSTER,
        "workload": WORKLOAD,
        "steps": 12,
    } | fields


def test_it_stores_a_simulated_run_that_succeeded_with_the_engines_series(client_for, teammate, experiment, enqueued):
    client = client_for(teammate)
    r = post_json(client, body(experiment, name="async on 16"))
    assert r.status_code == 201, r.content
    run = Run.objects.get()
    assert (run.status, run.simulated, run.name, run.launched_by) == ("succeeded", True, "async on 16", teammate)
    assert r.json()["simulated"] is True
    assert run.simulation["cluster"]["gpus"] == 16 and run.simulation["workload"]["p90_tokens"] == 4096
    assert run.simulation["summary"]["samples_per_s"] > 0
    # Nothing queued: a simulation never reaches a worker.
    assert enqueued == []
    assert {"samples/per_s", "staleness/max", "trainer/idle_frac"} <= set(r.json()["series"])
    metrics = client.get(f"/api/runs/{run.pk}/metrics", {"series": "samples/per_s"})
    assert metrics.status_code == 200, metrics.content
    assert metrics.json()["series"]["samples/per_s"]["steps"] == list(range(1, 13))


def test_a_simulated_run_cannot_be_retried_or_resumed_but_can_be_cloned(client_for, owner, experiment, enqueued):
    client = client_for(owner)
    sim = post_json(client, body(experiment)).json()["id"]
    for action in ("retry", "resume"):
        r = client.post(f"/api/runs/{sim}/{action}", content_type="application/json")
        assert r.status_code == 409
        assert "was simulated" in r.json()["errors"]["simulated"]
    r = client.post(f"/api/runs/{sim}/clone", data="{}", content_type="application/json")
    assert r.status_code == 201, r.content
    assert Run.objects.get(pk=r.json()["id"]).simulated is False


def test_it_names_the_cluster_and_workload_fields_it_rejects(client_for, owner, experiment):
    r = post_json(
        client_for(owner),
        body(
            experiment,
            cluster={"gpus": 0, "link": "carrier pigeon"},
            workload={"median_tokens": 900, "p90_tokens": 100},
        ),
    )
    assert r.status_code == 400
    errors = r.json()["errors"]
    assert "greater than or equal to 1" in errors["cluster.gpus"]
    assert "InfiniBand" in errors["cluster.link"]
    assert "p90_tokens (100) must be ≥ median_tokens (900)" in errors["workload"]
    assert not Run.objects.exists()


def test_it_refuses_a_cluster_split_that_leaves_a_pool_empty(client_for, owner, experiment):
    r = post_json(client_for(owner), body(experiment, cluster={"gpus": 2, "tp": 2}))
    assert r.status_code == 400
    assert "each pool needs at least one" in r.json()["errors"]["cluster"]
    assert not Run.objects.exists()


def test_it_refuses_more_gpu_steps_than_one_request_may_simulate(client_for, owner, experiment):
    r = post_json(client_for(owner), body(experiment, cluster={"gpus": 4096}, steps=500))
    assert r.status_code == 400
    assert "simulate at most 256 steps on 4096 GPUs" in r.json()["errors"]["steps"]


def test_it_refuses_a_model_it_cannot_read(client_for, owner, experiment, tmp_path, settings):
    settings.ROLLWAY_MODEL_ROOTS = [str(tmp_path)]
    r = post_json(client_for(owner), body(experiment, cluster={"gpus": 8, "model": str(tmp_path / "nothing")}))
    assert r.status_code == 400
    assert "neither a built-in shape" in r.json()["errors"]["cluster.model"]


def test_it_reads_a_models_shape_from_its_transformers_config(client_for, owner, experiment, tmp_path, settings):
    settings.ROLLWAY_MODEL_ROOTS = [str(tmp_path)]
    from transformers import Qwen2Config

    Qwen2Config(
        hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2
    ).save_pretrained(tmp_path)
    r = post_json(client_for(owner), body(experiment, cluster={"gpus": 8, "model": str(tmp_path)}))
    assert r.status_code == 201, r.content
    model = Run.objects.get().simulation["model"]
    assert model["layers"] == 3 and 1e6 < model["params"] < 1e8


def test_an_outsider_cannot_simulate_in_the_team(client_for, outsider, experiment):
    r = post_json(client_for(outsider), body(experiment))
    assert r.status_code == 400
    assert "no experiment" in r.json()["errors"]["experiment"]
    assert not Run.objects.exists()


def test_a_viewer_may_not_simulate(client_for, teammate, experiment):
    Membership.objects.filter(user=teammate).update(role=Membership.Role.VIEWER)
    r = post_json(client_for(teammate), body(experiment))
    assert r.status_code == 403
    assert not Run.objects.exists()


# --- the launch form's Simulate button ---------------------------------------------------

FORM = "/runs/new/"


def form_post(experiment, **fields):
    return {
        "experiment": str(experiment.pk),
        "name": "form sim",
        "preset": "async",
        "overrides": "{}",
        "priority": "0",
        "action": "simulate",
        "cluster.gpus": "16",
        "cluster.gpu": "H100",
        "cluster.model": "7B",
        "cluster.inference_share": "0.5",
        "cluster.tp": "1",
        "cluster.link": "InfiniBand",
        "workload.median_tokens": "1024",
        "workload.p90_tokens": "4096",
        "workload.max_tokens": "32768",
        "workload.prompt_tokens": "512",
        "steps": "8",
    } | fields


def test_the_forms_simulate_button_stores_a_simulated_run_and_opens_its_page(
    client_for, teammate, experiment, enqueued
):
    client = client_for(teammate)
    r = client.post(FORM, form_post(experiment), follow=True)
    run = Run.objects.get()
    assert r.redirect_chain == [(run.get_absolute_url(), 302)]
    assert (run.simulated, run.status, run.name) == (True, "succeeded", "form sim")
    assert enqueued == []
    page = r.content.decode()
    assert 'id="simulated-mark"' in page and "16 × H100" in page
    listing = client.get("/").content.decode()
    assert listing.count('class="simulated-mark"') == 1


def test_the_form_shows_each_simulation_error_beside_its_field(client_for, owner, experiment):
    r = client_for(owner).post(FORM, form_post(experiment, **{"cluster.gpus": "0", "workload.p90_tokens": "10"}))
    assert r.status_code == 400
    page = r.content.decode()
    assert 'data-field="cluster.gpus"' in page and 'data-field="workload"' in page
    assert 'value="0"' in page  # the form comes back as it was sent
    assert not Run.objects.exists()


def test_a_launch_from_the_form_is_not_simulated(client_for, owner, experiment):
    client_for(owner).post(FORM, form_post(experiment, action="launch"))
    assert Run.objects.get().simulated is False


def test_a_comparison_keeps_a_simulated_run_apart_from_real_runs_of_its_config(client_for, owner, experiment, make_run):
    from compare.analysis import group_runs

    real = make_run(status=Run.Status.SUCCEEDED, preset="async")
    sim = Run.objects.get(pk=post_json(client_for(owner), body(experiment)).json()["id"])
    groups = group_runs([real, sim])
    assert [g["runs"] for g in groups] == [[real.pk], [sim.pk]]
    assert [g["simulated"] for g in groups] == [False, True] and groups[1]["label"].endswith("[simulated]")


PLAN_URL = "/api/simulations/plan"


def post_plan(client, payload):
    return client.post(PLAN_URL, data=json.dumps(payload), content_type="application/json")


def test_a_plan_stores_the_best_setting_beside_the_config_as_given(client_for, teammate, experiment, enqueued):
    client = client_for(teammate)
    # 64 GPUs, 7B, long-tailed completions: at the default split one pool starves.
    payload = body(
        experiment, name="7B on 64", cluster={"gpus": 64}, workload={"median_tokens": 2048, "p90_tokens": 8192}
    )
    r = post_plan(client, payload | {"steps": 30})
    assert r.status_code == 201, r.content
    answer = r.json()
    best, baseline = Run.objects.get(pk=answer["id"]), Run.objects.get(pk=answer["baseline"]["id"])
    assert (best.simulated, baseline.simulated, enqueued) == (True, True, [])
    assert (best.name, baseline.name) == ("7B on 64 (planned)", "7B on 64")
    ranked = answer["ranked"]
    assert len(ranked) == 60  # 5 splits × 3 staleness bounds × 2 capacities × 2 protocols
    assert [c["samples_per_s"] for c in ranked] == sorted((c["samples_per_s"] for c in ranked), reverse=True)
    top = ranked[0]
    # The stored run is the top setting: its split on the cluster, its knobs in the config.
    assert best.simulation["cluster"]["inference_share"] == top["inference_share"]
    assert best.config["buffer"]["max_staleness"] == top["max_staleness"]
    assert best.config["buffer"]["capacity"] == top["capacity"]
    assert best.config["sync"]["protocol"] == top["protocol"] == best.overrides["sync"]["protocol"]
    # It beats the config as given, as both runs' own summaries say.
    assert best.simulation["summary"]["samples_per_s"] > 1.1 * baseline.simulation["summary"]["samples_per_s"]
    plan = best.simulation["plan"]
    assert plan["baseline_run"] == baseline.pk and plan["searched"] == 60 and plan["goal_samples"] is None
    assert plan["candidates"] == ranked[:10]
    assert "plan" not in baseline.simulation
    # The simulator counts a looser staleness bound as speed only: the plan says so.
    given = baseline.config["buffer"]["max_staleness"]
    assert top["max_staleness"] > given  # at this scale the search loosens it
    assert plan["staleness_caveat"].startswith(f"This plan raises buffer.max_staleness from {given} to ")
    page = client.get(f"/runs/{best.pk}/").content.decode()
    assert 'id="plan-staleness"' in page and "can learn less per sample" in page


def test_a_plan_of_a_run_whose_name_is_at_its_longest_keeps_the_name(client_for, owner, experiment):
    name = "n" * 200
    r = post_plan(client_for(owner), body(experiment, name=name, steps=5))
    assert r.status_code == 201, r.content
    assert r.json()["name"] == name and r.json()["baseline"]["name"] == name
    r = post_plan(client_for(owner), body(experiment, name="n" * 195, steps=5))
    assert r.json()["name"] == "n" * 195 + " (pla"


def test_a_plans_goal_ranks_by_the_time_to_train_that_many_samples(client_for, owner, experiment):
    r = post_plan(client_for(owner), body(experiment, steps=10, goal_samples=256))
    assert r.status_code == 201, r.content
    reached = [c["seconds_to_goal"] for c in r.json()["ranked"] if c["seconds_to_goal"] is not None]
    assert reached and reached == sorted(reached)
    assert Run.objects.get(pk=r.json()["id"]).simulation["plan"]["goal_samples"] == 256


def test_a_plan_names_the_field_it_refuses_and_stores_nothing(client_for, owner, experiment):
    client = client_for(owner)
    for fields, field in (
        ({"goal_samples": 0}, "goal_samples"),
        ({"goal_samples": "many"}, "goal_samples"),
        ({"goal_samples": "²"}, "goal_samples"),  # a digit to str.isdigit(), not to int()
        ({"cluster": {"gpus": 60_000}}, "cluster.gpus"),
        ({"cluster": {"gpus": 0}}, "cluster.gpus"),
    ):
        r = post_plan(client, body(experiment, **fields))
        assert r.status_code == 400, (fields, r.content)
        assert field in r.json()["errors"], (fields, r.json())
    both = post_plan(client, body(experiment, goal_samples=0, cluster={"gpus": 0})).json()["errors"]
    assert {"goal_samples", "cluster.gpus"} <= set(both)  # every refused field at once
    assert (
        "simulate this cluster with Simulate"
        in post_plan(client, body(experiment, cluster={"gpus": 60_000})).json()["errors"]["cluster.gpus"]
    )
    assert Run.objects.count() == 0


def test_a_viewer_may_not_plan(client_for, teammate, experiment):
    Membership.objects.filter(user=teammate).update(role=Membership.Role.VIEWER)
    r = post_plan(client_for(teammate), body(experiment))
    assert r.status_code == 403
    assert Run.objects.count() == 0


def test_the_forms_plan_button_opens_the_best_settings_run_with_its_table(client_for, teammate, experiment):
    client = client_for(teammate)
    fields = {"action": "plan", "cluster.gpus": "64", "workload.median_tokens": "2048", "workload.p90_tokens": "8192"}
    r = client.post(FORM, form_post(experiment, steps="30", **fields), follow=True)
    best = Run.objects.get(name="form sim (planned)")
    baseline = Run.objects.get(name="form sim")
    assert r.redirect_chain == [(best.get_absolute_url(), 302)]
    page = r.content.decode()
    assert 'id="simulation-plan"' in page and f'href="/runs/{baseline.pk}/"' in page
    assert 'class="chosen"' in page
    assert f"the best of 60 settings; the config as given is run #{baseline.pk}" in page
    # A bad goal comes back beside its field, and nothing is stored.
    r = client.post(FORM, form_post(experiment, action="plan", goal_samples="-3"))
    assert r.status_code == 400 and 'data-field="goal_samples"' in r.content.decode()
    assert Run.objects.count() == 2


def test_a_row_of_a_plan_is_one_request_from_its_simulated_run(client_for, teammate, owner, experiment, enqueued):
    client = client_for(teammate)
    payload = body(
        experiment, name="7B on 64", cluster={"gpus": 64}, workload={"median_tokens": 2048, "p90_tokens": 8192}
    )
    best = Run.objects.get(pk=post_plan(client, payload | {"steps": 30}).json()["id"])
    rows = best.simulation["plan"]["candidates"]
    third = rows[2]
    # The first row is the planned run itself.
    r = client.post(f"/api/runs/{best.pk}/plan/1")
    assert (r.status_code, r.json()["id"]) == (200, best.pk)
    r = client.post(f"/api/runs/{best.pk}/plan/3")
    assert r.status_code == 201, r.content
    made = Run.objects.get(pk=r.json()["id"])
    assert (made.simulated, made.status, made.name, enqueued) == (True, "succeeded", "7B on 64 (plan row 3)", [])
    # Simulated as the planned run was, at the row's settings.
    assert made.simulation["cluster"] == best.simulation["cluster"] | {"inference_share": third["inference_share"]}
    assert (made.simulation["workload"], made.simulation["steps"]) == (best.simulation["workload"], 30)
    assert made.config["buffer"]["max_staleness"] == third["max_staleness"]
    assert made.config["buffer"]["capacity"] == third["capacity"]
    assert made.config["sync"]["protocol"] == third["protocol"]
    assert made.simulation["summary"]["samples_per_s"] > 0
    # The table keeps the row's run: asked again, the same run, and nothing new stored.
    best.refresh_from_db()
    assert best.simulation["plan"]["candidates"][2]["run"] == made.pk
    count = Run.objects.count()
    r = client.post(f"/api/runs/{best.pk}/plan/3")
    assert (r.status_code, r.json()["id"], Run.objects.count()) == (200, made.pk, count)
    page = client.get(f"/runs/{best.pk}/").content.decode()
    assert f'href="/runs/{made.pk}/" class="plan-row-run"' in page
    assert f'action="/runs/{best.pk}/plan/2/"' in page and f'action="/runs/{best.pk}/plan/3/"' not in page
    # A row the table lacks, and a run without a plan, are refused by name.
    r = client.post(f"/api/runs/{best.pk}/plan/11")
    assert r.status_code == 400 and "1 to 10" in r.json()["errors"]["row"]
    baseline = best.simulation["plan"]["baseline_run"]
    r = client.post(f"/api/runs/{baseline}/plan/2")
    assert r.status_code == 400 and "holds no plan" in r.json()["errors"]["run"]
    assert Run.objects.count() == count


def test_the_pages_simulate_button_on_a_plans_row_opens_its_run(client_for, teammate, experiment):
    client = client_for(teammate)
    fields = {"action": "plan", "cluster.gpus": "64", "workload.median_tokens": "2048", "workload.p90_tokens": "8192"}
    client.post(FORM, form_post(experiment, steps="20", **fields))
    best = Run.objects.get(name="form sim (planned)")
    r = client.post(f"/runs/{best.pk}/plan/2/", follow=True)
    made = Run.objects.get(name="form sim (plan row 2)")
    assert r.redirect_chain == [(made.get_absolute_url(), 302)]
    assert f"Row 2 of run #{best.pk}&#x27;s plan, simulated: run #{made.pk}." in r.content.decode()
    assert made.simulation["cluster"]["inference_share"] == best.simulation["plan"]["candidates"][1]["inference_share"]
