"""No answer names a server path: a missing driver log's 404 (API and page), a
checkpoint as the API and the run's detail list it, and an exported model's zip (its
manifest) name things inside the run ("run-7.log", "step-00000040/", "tiny-qwen2"),
never the directories the site keeps them in (tests/platform/server_paths.py lists
those: every root the settings configure, the repository, /tmp/ and the test's tmp_path).
"""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from runs import exports
from runs.models import Run
from tests.platform.server_paths import assert_no_server_path, server_roots
from workers.config.presets import build
from workers.config.run_config import RunConfig
from workers.model.loading import build_tiny, save_model
from workers.model.tokenizer import CharTokenizer
from workers.train.export import MANIFEST, export_policy

Status = Run.Status


@pytest.fixture
def roots(settings, tmp_path):
    """The site's directories, all under this test's tmp_path."""
    settings.ROLLWAY_RUN_LOG_DIR = str(tmp_path / "logs")
    settings.ROLLWAY_CHECKPOINT_ROOT = str(tmp_path / "checkpoints")
    settings.ROLLWAY_EXPORT_DIR = str(tmp_path / "exports")
    settings.ROLLWAY_MODEL_ROOTS = [str(tmp_path / "models")]
    (tmp_path / "logs").mkdir()
    return tmp_path


def test_the_helper_finds_each_configured_root_in_a_body(settings, roots):
    listed = server_roots(settings, [roots])
    for root in (settings.ROLLWAY_RUN_LOG_DIR, settings.ROLLWAY_CHECKPOINT_ROOT, str(roots / "models"), "/tmp/"):
        assert root in listed
        with pytest.raises(AssertionError, match="names the server path"):
            assert_no_server_path(json.dumps({"errors": {"run": f"not at {root}/run-1.log"}}), settings, [roots])
    assert_no_server_path('{"location": "step-00000040/"}', settings, [roots])


def test_a_missing_logs_404_names_the_file_not_its_directory(roots, settings, make_run, client_for, owner):
    run = make_run(status=Status.SUCCEEDED)
    client = client_for(owner)
    for path in (f"/api/runs/{run.pk}/log", f"/api/runs/{run.pk}/log/download"):
        response = client.get(path)
        assert response.status_code == 404
        assert f"run-{run.pk}.log" in response.json()["errors"]["run"]
        assert_no_server_path(response.content, settings, [roots], what=path)
    page = client.get(f"/runs/{run.pk}/log/")
    assert page.status_code == 404 and f"run-{run.pk}.log" in page.content.decode()
    assert_no_server_path(page.content, settings, [roots], what="the log page")


def ingest_checkpoint(client, run: Run, location: str, step: int):
    body = {"step": step, "location": location, "bytes": 1000, "sha256": "ab" * 32, "pruned": []}
    return client.post(
        f"/api/runs/{run.pk}/checkpoints",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {run.ingest_token}",
    )


def test_a_checkpoint_is_shown_by_its_step_directory_not_its_server_path(
    roots, settings, client, make_run, client_for, owner, enqueued
):
    parent = make_run(Status.CANCELLED, config=build("sync", {"stop": {"max_steps": 10}}).model_dump(mode="json"))
    location = str(roots / "checkpoints" / f"run-{parent.pk}" / "step-00000004")
    response = ingest_checkpoint(client, parent, location, 4)
    assert response.status_code == 201
    assert parent.checkpoints.get().location == location  # the server keeps the whole path
    member = client_for(owner)
    child = member.post(f"/api/runs/{parent.pk}/resume", data="{}", content_type="application/json")
    assert child.status_code == 201 and child.json()["resume_from"]["location"] == "step-00000004/"
    listed = member.get(f"/api/runs/{parent.pk}/checkpoints")
    assert [c["location"] for c in listed.json()["checkpoints"]] == ["step-00000004/"]
    for what, body in [
        ("the ingest's answer", response.content),
        ("the checkpoint list", listed.content),
        ("the run's detail", member.get(f"/api/runs/{parent.pk}").content),
        ("the child's detail", child.content),
        ("the run page", member.get(f"/runs/{parent.pk}/").content),
        ("the child's page", member.get(f"/runs/{child.json()['id']}/").content),
    ]:
        assert_no_server_path(body, settings, [roots], what=what)


def test_a_checkpoint_in_an_object_store_is_shown_by_its_step_directory(roots, settings, client, make_run):
    run = make_run(Status.RUNNING)
    assert ingest_checkpoint(client, run, f"s3://site-bucket/ck/run-{run.pk}/step-00000002/", 2).status_code == 201
    assert ingest_checkpoint(client, run, "s3://site-bucket/elsewhere", 4).status_code == 201
    shown = [c.as_dict()["location"] for c in run.checkpoints.order_by("step")]
    assert shown == ["step-00000002/", "step-00000004/"]


def test_the_exported_models_zip_names_no_server_path(roots, settings, make_run, client_for, owner):
    model_dir = roots / "models" / "tiny-qwen2"
    cfg = RunConfig.model_validate({"model": {"source": "path", "path": str(model_dir)}})
    run = make_run(status=Status.SUCCEEDED, config=cfg.model_dump(mode="json"))
    tokenizer = CharTokenizer()
    small = RunConfig.model_validate({"model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2}})
    model = build_tiny(small.model, tokenizer, seed=1)
    policy = roots / "policy"
    save_model(model, tokenizer, str(policy))
    export_policy(model, str(policy), str(exports.export_dir(run.pk)), cfg)

    response = client_for(owner).get(f"/api/runs/{run.pk}/export")
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    archive = zipfile.ZipFile(io.BytesIO(body))
    manifest = json.loads(archive.read(f"run-{run.pk}-model/{MANIFEST}"))
    assert (manifest["model_source"], manifest["model"]) == ("path", "tiny-qwen2")
    for name in archive.namelist():
        assert_no_server_path(archive.read(name), settings, [roots], what=name)
    assert_no_server_path(body, settings, [roots], what="the zip")
