"""Every path and Hub id a config, a simulation or a comparison names goes through the
engine's one confinement (workers/run/paths.py), and the web process downloads nothing a
member names: a Hub model is checked by its config and tokenizer files, a Hub dataset by
its metadata. A refusal names the field (and the setting), says the same of a path that
exists and one that does not, and reads nothing; a Hub that does not answer is a 503
naming the field. The Hub is a stand-in here (tests/fake_hub.py): no network."""

from __future__ import annotations

import json

import pytest

from configs.models import SavedConfig
from runs.models import Run
from tests.fake_hub import FakeHub, tiny_model_files
from workers.model.tiny_hf import make_tiny_checkpoint

CARD = {"dataset_info": {"features": [{"name": "prompt"}, {"name": "answer"}], "splits": [{"name": "train"}]}}
HUB_DATASET = {"task": {"name": "countdown", "dataset": {"path": "acme/sums"}}}


def post(client, url, body):
    return client.post(url, data=json.dumps(body), content_type="application/json")


def launch(client, experiment, overrides):
    return post(client, "/api/runs", {"experiment": experiment.pk, "preset": "async", "overrides": overrides})


def simulate(client, experiment, model, overrides=None):
    body = {
        "experiment": experiment.pk,
        "preset": "async",
        "overrides": overrides or {},
        "cluster": {"gpus": 16, "model": model},
        "workload": {"median_tokens": 1024},
        "steps": 4,
    }
    return post(client, "/api/simulations", body)


def reward_model(path: str) -> dict:
    return {"rewards": {"workers": 1, "scorer": "model", "model_path": path}}


@pytest.fixture
def hub(monkeypatch, tmp_path, settings):
    """A Hub with a small model (weights given by size only: fetching them fails the
    test) and a dataset whose files no web request may fetch; a model root beside it."""
    hub = FakeHub(monkeypatch, tmp_path)
    checkpoint = tmp_path / "checkpoint"
    make_tiny_checkpoint(str(checkpoint))
    hub.model("acme/tiny", tiny_model_files(str(checkpoint)))
    hub.model("acme/rm", tiny_model_files(str(checkpoint)))
    hub.dataset("acme/sums", {"README.md": b"", "train.jsonl": 10**9}, card=CARD)
    models = tmp_path / "models"
    models.mkdir()
    settings.ROLLWAY_MODEL_ROOTS = [str(models)]
    settings.ROLLWAY_SCRATCH_DIR = str(tmp_path / "scratch")
    return hub


# --- one confinement, one sentence ------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "overrides"),
    [
        ("model.path", lambda p: {"model": {"source": "path", "path": p}}),
        ("rewards.model_path", reward_model),
        ("task.dataset.path", lambda p: {"task": {"name": "countdown", "dataset": {"path": p}}}),
    ],
)
def test_a_path_outside_the_roots_is_refused_alike_whether_it_exists_or_not(
    client_for, owner, experiment, hub, field, overrides
):
    said = {}
    for path in ("/etc", "/nope"):
        r = launch(client_for(owner), experiment, overrides(path))
        assert r.status_code == 400, r.content
        said[path] = r.json()["errors"][field]
    assert said["/etc"].replace("/etc", "/nope") == said["/nope"]
    assert "outside the allowed roots" in said["/nope"]
    assert Run.objects.count() == 0 and hub.autoconfig_calls == [] and hub.calls == []


def test_a_simulation_reads_no_config_outside_the_model_roots(client_for, owner, experiment, hub, settings, tmp_path):
    # Another team's checkpoints: under the checkpoint root, not a model root.
    other = tmp_path / "checkpoints" / "run-7" / "step-2"
    other.mkdir(parents=True)
    (other / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    said = {}
    for path in ("/etc", "/nope", str(other)):
        r = simulate(client_for(owner), experiment, path)
        assert r.status_code == 400, r.content
        said[path] = r.json()["errors"]["cluster.model"]
    assert said["/etc"].replace("/etc", "/nope") == said["/nope"]
    assert "outside the allowed roots (ROLLWAY_MODEL_ROOTS" in said[str(other)]
    assert hub.autoconfig_calls == [] and Run.objects.count() == 0


def test_a_relative_path_is_refused_never_resolved_against_the_working_directory(
    client_for, owner, experiment, hub, monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)  # holds checkpoint/, a model directory
    r = launch(client_for(owner), experiment, {"model": {"source": "path", "path": "checkpoint"}})
    assert r.status_code == 400
    assert "'checkpoint' is not an absolute path" in r.json()["errors"]["model.path"]
    r = simulate(client_for(owner), experiment, "./checkpoint")
    assert r.status_code == 400 and "is not an absolute path" in r.json()["errors"]["cluster.model"]
    assert hub.autoconfig_calls == []


def test_a_reward_model_under_a_model_root_is_accepted_and_one_outside_is_not(
    client_for, owner, experiment, hub, tmp_path
):
    inside = tmp_path / "models" / "rm"
    make_tiny_checkpoint(str(inside))
    r = launch(client_for(owner), experiment, reward_model(str(inside)))
    assert r.status_code == 201, r.content
    r = launch(client_for(owner), experiment, reward_model(str(tmp_path / "checkpoint")))
    assert r.status_code == 400
    assert "ROLLWAY_MODEL_ROOTS" in r.json()["errors"]["rewards.model_path"]


# --- the Hub: owners, metadata only, 503 ------------------------------------------------


@pytest.mark.parametrize(
    ("field", "overrides"),
    [
        ("model.hub_id", {"model": {"source": "hub", "hub_id": "evil/tiny"}}),
        ("rewards.model_path", reward_model("evil/rm")),
        ("task.dataset.path", {"task": {"name": "countdown", "dataset": {"path": "evil/sums"}}}),
    ],
)
def test_a_hub_repository_of_an_owner_not_allowed_is_refused_before_the_hub_is_asked(
    client_for, owner, experiment, hub, settings, field, overrides
):
    settings.ROLLWAY_HUB_OWNERS = ["acme"]
    r = launch(client_for(owner), experiment, overrides)
    assert r.status_code == 400, r.content
    message = r.json()["errors"][field]
    assert "the owner 'evil' is not among" in message and "ROLLWAY_HUB_OWNERS=acme" in message
    assert hub.calls == [] and Run.objects.count() == 0


def test_a_simulation_of_a_hub_model_of_an_owner_not_allowed_is_refused(client_for, owner, experiment, hub, settings):
    settings.ROLLWAY_HUB_OWNERS = ["acme"]
    r = simulate(client_for(owner), experiment, "evil/tiny")
    assert r.status_code == 400 and "ROLLWAY_HUB_OWNERS" in r.json()["errors"]["cluster.model"]
    assert hub.calls == []


def test_a_hub_model_is_checked_by_its_config_and_tokenizer_files_only(client_for, owner, experiment, hub, settings):
    settings.ROLLWAY_HUB_OWNERS = ["acme"]
    r = launch(client_for(owner), experiment, {"model": {"source": "hub", "hub_id": "acme/tiny"}})
    assert r.status_code == 201, r.content
    fetched = {name for _, name in hub.downloads}
    assert "config.json" in fetched and not any(n.endswith((".safetensors", ".bin")) for n in fetched)


def test_a_simulation_of_a_hub_model_fetches_its_config_alone(client_for, owner, experiment, hub):
    r = simulate(client_for(owner), experiment, "acme/tiny")
    assert r.status_code == 201, r.content
    assert hub.downloads == [("acme/tiny", "config.json")]


def test_a_hub_reward_model_is_checked_by_its_metadata_alone(client_for, owner, experiment, hub):
    r = launch(client_for(owner), experiment, reward_model("acme/rm"))
    assert r.status_code == 201, r.content
    assert [what for what, repo in hub.calls if repo == "acme/rm"] == ["model_info"] and hub.downloads == []


def test_no_web_request_downloads_a_hub_dataset(client_for, owner, team, experiment, hub, enqueued):
    client = client_for(owner)
    assert launch(client, experiment, HUB_DATASET).status_code == 201
    saved = post(
        client, "/api/configs", {"team": team.pk, "name": "hub", "base_preset": "async", "overrides": HUB_DATASET}
    )
    assert saved.status_code == 201, saved.content
    comparison = post(
        client,
        "/api/comparisons",
        {
            "experiment": experiment.pk,
            "name": "c",
            "configurations": ["async", "sync"],
            "seeds": [0, 1],
            "overrides": HUB_DATASET,
        },
    )
    assert comparison.status_code == 201, comparison.content
    assert post(client, f"/api/comparisons/{comparison.json()['id']}/rerun", {}).status_code == 201
    assert simulate(client, experiment, "7B", HUB_DATASET).status_code == 201
    assert SavedConfig.objects.count() == 1 and Run.objects.count() == 10
    assert hub.downloads == [] and hub.load_dataset_calls == []
    assert hub.calls == [("dataset_info", "acme/sums")]  # once for all ten runs, its metadata kept a minute


def test_a_hub_dataset_without_the_prompt_column_is_refused_by_its_card(client_for, owner, experiment, hub):
    task = {"name": "countdown", "dataset": {"path": "acme/sums", "prompt_column": "question"}}
    r = launch(client_for(owner), experiment, {"task": task})
    assert r.status_code == 400
    assert "no column 'question'" in r.json()["errors"]["task.dataset.prompt_column"]
    assert hub.downloads == [] and hub.load_dataset_calls == []


def hub_failures():
    import httpx2

    return [
        (FakeHub.http_error(503), "the Hugging Face Hub answered 503; try again later"),
        (FakeHub.http_error(429), "the Hugging Face Hub answered 429; try again later"),
        (httpx2.ReadTimeout("timed out"), "the Hugging Face Hub did not answer in time (ReadTimeout); try again later"),
        (httpx2.ConnectError("refused"), "the Hugging Face Hub cannot be reached from this site (ConnectError)"),
    ]


@pytest.mark.parametrize("failure", range(4))
@pytest.mark.parametrize(
    ("field", "overrides"),
    [
        ("model.hub_id", {"model": {"source": "hub", "hub_id": "acme/tiny"}}),
        ("rewards.model_path", reward_model("acme/rm")),
        ("task.dataset.path", HUB_DATASET),
    ],
)
def test_a_hub_that_does_not_answer_a_launch_check_is_a_503_naming_the_field(
    client_for, owner, experiment, hub, failure, field, overrides
):
    hub.fail, says = hub_failures()[failure]
    r = launch(client_for(owner), experiment, overrides)
    assert r.status_code == 503, r.content
    assert r.json() == {"errors": {field: r.json()["errors"][field]}}
    assert r.json()["errors"][field].startswith(says)
    assert Run.objects.count() == 0


def test_a_hub_that_does_not_answer_a_save_or_a_simulation_is_a_503(client_for, owner, team, experiment, hub):
    hub.fail = FakeHub.http_error(502)
    client = client_for(owner)
    saved = post(
        client, "/api/configs", {"team": team.pk, "name": "hub", "base_preset": "async", "overrides": HUB_DATASET}
    )
    assert saved.status_code == 503
    assert saved.json()["errors"]["task.dataset.path"] == "the Hugging Face Hub answered 502; try again later"
    r = simulate(client, experiment, "acme/tiny")
    assert r.status_code == 503
    assert r.json()["errors"]["cluster.model"] == "the Hugging Face Hub answered 502; try again later"
    assert SavedConfig.objects.count() == 0 and Run.objects.count() == 0


def test_a_launch_answers_the_settings_its_checkpoints_size_would_want(client_for, owner, experiment, hub, monkeypatch):
    """A checkpoint of hundreds of millions of parameters launched with the presets'
    settings (the tiny model's lr 1e-3, 8 new tokens): the answer names each with the
    value that suits the model. The tiny checkpoint here counts as such a model."""
    from workers.model import fitting

    r = launch(client_for(owner), experiment, {"model": {"source": "hub", "hub_id": "acme/tiny"}})
    assert r.status_code == 201 and r.json()["fitting"] == []  # a tiny checkpoint: nothing to say
    monkeypatch.setattr(fitting, "SMALLEST", 1)
    r = launch(client_for(owner), experiment, {"model": {"source": "hub", "hub_id": "acme/tiny"}})
    assert r.status_code == 201, r.content
    advice = {f["field"]: (f["current"], f["suggested"]) for f in r.json()["fitting"]}
    assert advice == {"trainer.lr": (1e-3, 1e-6), "inference.max_new_tokens": (8, 32)}  # 128 positions: 32
    assert not any(n.endswith((".safetensors", ".bin")) for _, n in hub.downloads)
