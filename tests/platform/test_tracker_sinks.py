"""The export's other sinks (runs/sinks/): TensorBoard, read back with TensorBoard's own
EventAccumulator; several sinks at once, one failing without holding the others back;
and W&B in its own offline mode, its records read back from the files it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runs import sinks, tracking
from runs.models import MetricPoint, Run
from runs.sinks import tensorboard_sink, wandb_sink
from runs.tasks import export_run_metrics, finish_run_metrics

pytest.importorskip("tensorboard", reason="the TensorBoard export needs the `tensorboard` extra")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
Status = Run.Status


@pytest.fixture
def tb_dir(settings, tmp_path, monkeypatch):
    settings.ROLLWAY_MLFLOW_TRACKING_URI = ""
    settings.ROLLWAY_TENSORBOARD_DIR = str(tmp_path / "tb")
    monkeypatch.setattr(tracking, "_last_asked", {})
    yield tmp_path / "tb"
    for run_id in list(tensorboard_sink._writers):
        tensorboard_sink._drop_writer(run_id)


def add_points(run: Run, series: str, steps, base: float = 0.0) -> None:
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, series=series, step=s, value=base + s / 10, time=1763700000.0 + s) for s in steps
    )


def stored(run: Run, series: str) -> list[tuple[int, float, float]]:
    return sorted(MetricPoint.objects.filter(run=run, series=series).values_list("step", "value", "time"))


def read_back(directory: Path) -> EventAccumulator:
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def scalars(events: EventAccumulator, series: str) -> list[tuple[int, float, float]]:
    return sorted((e.step, e.value, e.wall_time) for e in events.Scalars(series))


def text(events: EventAccumulator, tag: str) -> str:
    [event] = events.Tensors(f"{tag}/text_summary")  # SummaryWriter.add_text's tag
    return event.tensor_proto.string_val[0].decode()


def assert_same(got, want):
    """Values go over as float32: equal to float32 precision, steps and times exactly."""
    assert [(s, t) for s, _, t in got] == [(s, t) for s, _, t in want]
    assert [v for _, v, _ in got] == pytest.approx([v for _, v, _ in want], rel=1e-6)


def test_tensorboard_gets_the_series_as_scalars_and_the_config_as_text_and_hparams(tb_dir, run):
    add_points(run, "reward/mean", range(0, 5))
    add_points(run, "loss", range(0, 5), base=1.0)
    assert export_run_metrics(run.pk) == 10

    directory = tb_dir / f"run-{run.pk}"
    events = read_back(directory)
    assert set(events.Tags()["scalars"]) == {"reward/mean", "loss"}
    for series in ("reward/mean", "loss"):
        assert_same(scalars(events, series), stored(run, series))
    assert json.loads("\n".join(line[4:] for line in text(events, "rollway/config").splitlines())) == run.config
    about = text(events, "rollway/run")
    assert f"[{run.name}](" in about and f"/runs/{run.pk}/)" in about and f"preset {run.preset}" in about
    team = run.experiment.team
    assert f"experiment {team.pk}-{team.slug}/{run.experiment.name}" in about
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["trainer.lr"].number_value == pytest.approx(run.config["trainer"]["lr"])
    assert hparams["buffer.mode"].string_value == run.config["buffer"]["mode"]
    assert set(hparams) == set(tracking.flatten(run.config))


def test_tensorboard_takes_later_points_once_and_the_runs_end_closes_it(tb_dir, run):
    add_points(run, "reward/mean", range(0, 3))
    assert export_run_metrics(run.pk) == 3
    add_points(run, "reward/mean", range(3, 6))
    assert export_run_metrics(run.pk) == 3
    assert export_run_metrics(run.pk) == 0
    directory = tb_dir / f"run-{run.pk}"
    # One writer, so one event file, for the run's exports in this process.
    assert len(list(directory.glob("events.out.tfevents.*"))) == 1
    assert json.loads((directory / tensorboard_sink.CURSOR_FILE).read_text()) == {
        "exported_point_id": MetricPoint.objects.filter(run=run).latest("pk").pk
    }
    run.transition(Status.STARTING)
    run.transition(Status.RUNNING)
    run.transition(Status.SUCCEEDED)
    add_points(run, "reward/mean", range(6, 8))
    assert finish_run_metrics(run.pk) == 2
    assert run.pk not in tensorboard_sink._writers  # closed with the run
    events = read_back(directory)
    assert_same(scalars(events, "reward/mean"), stored(run, "reward/mean"))
    assert text(events, "rollway/outcome") == "succeeded"
    assert len(events.Tensors("rollway/config/text_summary")) == 1  # described once


def test_a_new_process_resumes_from_the_cursor_file(tb_dir, run):
    add_points(run, "reward/mean", range(0, 3))
    export_run_metrics(run.pk)
    tensorboard_sink._drop_writer(run.pk)  # as if the next export ran in another worker process
    add_points(run, "reward/mean", range(3, 5))
    assert export_run_metrics(run.pk) == 2
    assert_same(scalars(read_back(tb_dir / f"run-{run.pk}"), "reward/mean"), stored(run, "reward/mean"))


def test_a_failing_tracker_holds_back_no_other_and_its_error_is_raised(tb_dir, run, settings, tmp_path, caplog):
    (tmp_path / "a-file").write_text("not a directory")
    settings.ROLLWAY_MLFLOW_TRACKING_URI = f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}"
    assert [s.NAME for s in sinks.configured()] == ["MLflow", "TensorBoard"]
    add_points(run, "reward/mean", range(0, 4))
    with pytest.raises(Exception):  # noqa: B017 (whatever MLflow's store raises)
        export_run_metrics(run.pk)
    assert f"run {run.pk}: the export to MLflow failed" in caplog.text
    assert_same(scalars(read_back(tb_dir / f"run-{run.pk}"), "reward/mean"), stored(run, "reward/mean"))


def test_nothing_is_written_without_a_directory(settings, run, enqueued, tmp_path):
    settings.ROLLWAY_MLFLOW_TRACKING_URI = ""
    settings.ROLLWAY_TENSORBOARD_DIR = ""
    assert sinks.configured() == [] and not tracking.enabled()
    add_points(run, "reward/mean", range(0, 2))
    assert export_run_metrics(run.pk) == 0


def test_a_run_goes_only_to_the_trackers_it_chose(tb_dir, make_run):
    chose, none, unset = make_run(trackers=["tensorboard"]), make_run(trackers=[]), make_run()
    for run in (chose, none, unset):
        add_points(run, "reward/mean", range(0, 2))
    assert [export_run_metrics(run.pk) for run in (chose, none, unset)] == [2, 0, 2]
    assert sorted(p.name for p in tb_dir.iterdir()) == sorted(f"run-{run.pk}" for run in (chose, unset))


def wandb_records(directory: Path) -> list:
    """Every record W&B wrote offline under `directory`, run after run in the order they
    were made: each file is a LevelDB-style log (a 7-byte header, then 32 KiB blocks of
    checksummed chunks) of `wandb_internal_pb2.Record`s, what `wandb sync` uploads. W&B
    ships no reader of its own in Python any more (its Go core reads them), hence this one."""
    import struct

    from wandb.proto import wandb_internal_pb2

    block, out = 32768, []
    for path in sorted(directory.glob("wandb/offline-run-*/run-*.wandb"), key=lambda p: p.stat().st_mtime_ns):
        data, pos, pending = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B", path
        while pos + 7 <= len(data):
            if block - pos % block < 7:  # a block's tail too short for a chunk header: padding
                pos += block - pos % block
                continue
            _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if kind == 0:  # zeros to the block's end
                pos += block - pos % block
                continue
            chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
            pending = chunk if kind in (1, 2) else pending + chunk  # full, first | middle, last
            if kind in (1, 4):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pending)
                out.append(record)
    return out


def test_wandb_offline_gets_each_step_as_a_row_once_and_each_export_closes_it(settings, run, monkeypatch, tmp_path):
    wandb = pytest.importorskip("wandb", reason="the W&B export needs the `wandb` extra")
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's own: records for `wandb sync`, nothing sent
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setattr(tracking, "_last_asked", {})
    settings.ROLLWAY_HOME = tmp_path
    settings.ROLLWAY_MLFLOW_TRACKING_URI = settings.ROLLWAY_TENSORBOARD_DIR = ""
    settings.ROLLWAY_WANDB_PROJECT, settings.ROLLWAY_WANDB_ENTITY = "rl", ""
    try:
        add_points(run, "reward/mean", range(0, 2))
        add_points(run, "loss", range(0, 2), base=1.0)
        assert export_run_metrics(run.pk) == 4
        # Offline, a resumed W&B run has an empty summary: the cursor kept beside W&B's
        # files is what holds the next export to the new point.
        add_points(run, "reward/mean", [2])
        assert export_run_metrics(run.pk) == 1
        add_points(run, "reward/mean", [3])
        run.transition(Status.STARTING)
        run.transition(Status.FAILED)
        assert finish_run_metrics(run.pk) == 1
    finally:
        wandb.teardown()

    records = wandb_records(tmp_path / "wandb")
    kinds = [r.WhichOneof("record_type") for r in records]
    starts = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert len(starts) == 3 and {s.run_id for s in starts} == {f"rollway-{run.pk}"}  # one W&B run, resumed
    team = run.experiment.team
    first = starts[0]
    assert first.project == "rl" and first.display_name == run.name and list(first.tags) == [run.preset]
    assert first.run_group == f"{team.pk}-{team.slug}/{run.experiment.name}"  # an id no other team has
    config = {item.key: json.loads(item.value_json) for item in first.config.update}
    assert config["trainer.lr"] == run.config["trainer"]["lr"]
    assert first.notes.endswith(f"/runs/{run.pk}/")

    def row(record) -> dict:
        keys = ((item.key or "/".join(item.nested_key), item.value_json) for item in record.history.item)
        return {key: json.loads(value) for key, value in keys if not key.startswith("_")}  # W&B's own: _step, …

    rows = [row(r) for r in records if r.WhichOneof("record_type") == "history"]
    # Stored order: reward/mean 0, 1, then loss 0, 1, then the later points; each once.
    assert rows == [
        {"reward/mean": 0.0, "rollway/step": 0},
        {"reward/mean": 0.1, "rollway/step": 1},
        {"loss": 1.0, "rollway/step": 0},
        {"loss": 1.1, "rollway/step": 1},
        {"reward/mean": 0.2, "rollway/step": 2},
        {"reward/mean": 0.3, "rollway/step": 3},
    ]
    # Each session: `rollway/step` a metric, and every other series plotted against it.
    metrics = [(r.metric.name, r.metric.glob_name, r.metric.step_metric) for r in records if r.metric.ByteSize()]
    assert metrics == [(wandb_sink.STEP_METRIC, "", ""), ("", "*", wandb_sink.STEP_METRIC)] * 3
    cursors = [
        json.loads(item.value_json)
        for r in records
        if r.WhichOneof("record_type") == "summary"
        for item in r.summary.update
        if item.key == wandb_sink.CURSOR_KEY
    ]
    assert cursors[-1] == MetricPoint.objects.filter(run=run).latest("pk").pk
    # Each export ends its session (resume="allow" reopens it); the failed run's last with 1.
    assert [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"] == [0, 0, 1]
    assert kinds.count("run") == kinds.count("exit")


def test_a_site_asking_for_a_tracker_whose_package_is_missing_refuses_to_start(tmp_path):
    """Without the `wandb` extra: unset, the sink is inert; set, the settings name the fix."""
    env = {
        **os.environ,
        "ROLLWAY_HOME": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "rollway.settings",
        "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)]),
        "ROLLWAY_WANDB_PROJECT": "rl",
    }
    env.pop("DATABASE_URL", None)
    # As where the extra is not installed: an import of wandb fails, find_spec answers None.
    code = "import sys; sys.modules['wandb'] = None; import django; django.setup()"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode != 0
    assert "ROLLWAY_WANDB_PROJECT is set but wandb is not installed: pip install 'rollway[wandb]'" in done.stderr
    env["ROLLWAY_WANDB_PROJECT"] = ""
    code = (
        "import sys, django; django.setup(); from runs import sinks; "
        "print([s.NAME for s in sinks.configured()], 'wandb' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] False"
