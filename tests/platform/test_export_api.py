"""Getting a run's model back from the site: GET /api/runs/<id>/export streams the
exported Hugging Face directory (ROLLWAY_EXPORT_DIR/run-<id>) as a zip, only to members
of the run's team and only once the run has finished; the run page links it. And a
model directory a run cannot use is refused at launch, naming model.path."""

from __future__ import annotations

import asyncio
import io
import json
import re
import zipfile

import pytest
from django.test import AsyncRequestFactory, RequestFactory
from transformers import AutoModelForCausalLM, AutoTokenizer

from configs import policy
from runs import exports, in_ray, queue
from runs.models import Run
from workers.config.run_config import RunConfig
from workers.model.loading import build_tiny, checkpoint_state_dict, save_model
from workers.model.tiny_hf import make_tiny_checkpoint
from workers.model.tokenizer import CharTokenizer
from workers.sync.base import state_checksum
from workers.train.export import export_policy

Status = Run.Status
SMALL_MODEL = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}


@pytest.fixture
def export_root(settings, tmp_path):
    settings.ROLLWAY_EXPORT_DIR = str(tmp_path / "exports")
    return tmp_path / "exports"


@pytest.fixture
def export_for(tmp_path):
    """export_for(run) writes a real export of a tiny char model for `run` (what its
    driver does when it succeeds) and returns the weights' checksum."""

    def make(run: Run) -> str:
        cfg = RunConfig.model_validate({"model": SMALL_MODEL})
        tokenizer = CharTokenizer()
        model = build_tiny(cfg.model, tokenizer, seed=run.pk)
        policy = tmp_path / f"policy-{run.pk}"
        save_model(model, tokenizer, str(policy))
        manifest = export_policy(model, str(policy), str(exports.export_dir(run.pk)), cfg)
        return manifest["sha256"]

    return make


def url(run_id: int) -> str:
    return f"/api/runs/{run_id}/export"


def unzip(body: bytes) -> zipfile.ZipFile:
    archive = zipfile.ZipFile(io.BytesIO(body))
    assert archive.testzip() is None  # every entry's CRC checks out
    return archive


def test_a_member_downloads_a_zip_that_loads(client_for, teammate, make_run, export_root, export_for, tmp_path):
    run = make_run(status=Status.SUCCEEDED)
    checksum = export_for(run)
    response = client_for(teammate).get(url(run.pk))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-model.zip"'
    archive = unzip(b"".join(response.streaming_content))
    root = f"run-{run.pk}-model"
    names = set(archive.namelist())
    assert {f"{root}/config.json", f"{root}/model.safetensors", f"{root}/tokenizer.json"} <= names
    archive.extractall(tmp_path / "download")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "download" / root)
    assert state_checksum(checkpoint_state_dict(model)) == checksum
    tok = AutoTokenizer.from_pretrained(tmp_path / "download" / root)
    assert tok("ab=")["input_ids"] == CharTokenizer().prompt_ids("ab=")


def test_the_zip_is_streamed_in_chunks_not_built_in_memory(export_root, make_run, export_for, monkeypatch):
    run = make_run(status=Status.SUCCEEDED)
    export_for(run)
    monkeypatch.setattr(exports, "CHUNK_BYTES", 4096)
    directory = exports.export_dir(run.pk)
    biggest = max(p.stat().st_size for p, _ in exports.files(directory))
    chunks = list(exports.zip_chunks(directory, "m"))
    assert len(chunks) > biggest // 4096  # at least one chunk per block of the largest file
    assert max(len(c) for c in chunks) < 4096 + 1024  # a block plus zip headers, never a file
    sync_zip = b"".join(chunks)

    async def collect() -> bytes:
        return b"".join([c async for c in exports.azip_chunks(directory, "m")])

    # The ASGI server gets the same bytes through the async iterator.
    assert asyncio.run(collect()) == sync_zip
    assert exports.zip_response(AsyncRequestFactory().get(url(run.pk)), run, directory).is_async
    assert not exports.zip_response(RequestFactory().get(url(run.pk)), run, directory).is_async
    assert "m/model.safetensors" in unzip(sync_zip).namelist()


def test_links_inside_the_export_are_not_followed(export_root, make_run, export_for, tmp_path):
    run = make_run(status=Status.SUCCEEDED)
    export_for(run)
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    (exports.export_dir(run.pk) / "leak.txt").symlink_to(secret)
    names = unzip(b"".join(exports.zip_chunks(exports.export_dir(run.pk), "m"))).namelist()
    assert "m/leak.txt" not in names and "m/config.json" in names


@pytest.mark.parametrize("status", [Status.QUEUED, Status.STARTING, Status.RUNNING, Status.CANCELLING])
def test_an_unfinished_run_is_a_conflict(client_for, owner, make_run, export_root, status):
    run = make_run(status=status)
    response = client_for(owner).get(url(run.pk))
    assert response.status_code == 409
    assert f"run {run.pk} is {status}" in response.json()["errors"]["run"]


@pytest.mark.parametrize("status", [Status.SUCCEEDED, Status.FAILED, Status.CANCELLED])
def test_a_finished_run_without_an_export_is_not_found(client_for, owner, make_run, export_root, status):
    run = make_run(status=status)
    response = client_for(owner).get(url(run.pk))
    assert response.status_code == 404
    assert "has no exported model" in response.json()["errors"]["run"]


def test_another_teams_run_is_not_found(client_for, outsider, make_run, export_root, export_for):
    run = make_run(status=Status.SUCCEEDED)
    export_for(run)
    response = client_for(outsider).get(url(run.pk))
    assert response.status_code == 404
    assert response.json()["errors"]["run"] == f"run {run.pk} not found"
    assert client_for(outsider).get(url(run.pk + 1000)).status_code == 404


def test_it_asks_anonymous_callers_to_log_in(client, make_run, export_root, export_for):
    run = make_run(status=Status.SUCCEEDED)
    export_for(run)
    assert client.get(url(run.pk)).status_code == 401


def test_the_run_page_links_the_download_once_the_run_succeeded(client_for, owner, make_run, export_root):
    done, running = make_run(status=Status.SUCCEEDED), make_run(status=Status.RUNNING)
    link = re.compile(r'<a [^>]*id="download-model"[^>]*>')
    [shown] = link.findall(client_for(owner).get(f"/runs/{done.pk}/").content.decode())
    assert f'href="{url(done.pk)}"' in shown and "hidden" not in shown
    # A running run's page holds it hidden, for run.js to show once the run succeeds.
    [held] = link.findall(client_for(owner).get(f"/runs/{running.pk}/").content.decode())
    assert re.search(r"\bhidden\b", held)


def test_the_worker_tells_the_driver_where_to_export(make_run, driver, export_root):
    run = make_run(phase=queue.SCHEDULED)
    in_ray.do_start_in_ray(run.pk)
    [confinement] = driver.confinements
    assert confinement.export_dir(run.pk) == str(export_root / f"run-{run.pk}")
    assert confinement == policy.confinement()


# --- a model directory a run cannot use is refused at launch -----------------------------


def test_a_launch_on_a_model_directory_that_cannot_work_is_a_400_naming_model_path(
    client_for, owner, experiment, settings, tmp_path
):
    settings.ROLLWAY_MODEL_ROOTS = [str(tmp_path / "models")]
    path = make_tiny_checkpoint(str(tmp_path / "models" / "grown"), "llama")
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_tokens(["<new-token>"])  # the embedding was not resized to match
    tok.save_pretrained(path)
    body = {"experiment": experiment.pk, "preset": "async", "overrides": {"model": {"source": "path", "path": path}}}
    response = client_for(owner).post("/api/runs", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 400
    message = response.json()["errors"]["model.path"]
    assert path in message and "tokenizer of" in message and "vocab_size" in message
    assert Run.objects.count() == 0
