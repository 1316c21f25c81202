"""JSON log lines (workers/core/logs.py): one object a line, with the run's id, for the
platform (settings.LOGGING) and each run's driver, behind ROLLWAY_LOG_FORMAT=json."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.core.logs import JsonFormatter, configure_driver_logging, log_format

REPO = Path(__file__).resolve().parents[2]


def record(msg, *args, exc_info=None, **extra) -> logging.LogRecord:
    rec = logging.LogRecord("runs.actions", logging.INFO, __file__, 1, msg, args, exc_info)
    rec.__dict__.update(extra)
    return rec


def test_a_line_is_one_json_object_with_the_message_and_the_run_id():
    line = JsonFormatter().format(record("checkpoint %s written", "step-3", run_id=7))
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "checkpoint step-3 written"
    assert (parsed["run_id"], parsed["level"], parsed["logger"]) == (7, "INFO", "runs.actions")
    assert parsed["time"].endswith("+00:00")


def test_a_line_about_a_run_carries_its_id_without_extra():
    assert json.loads(JsonFormatter().format(record("run %s → %s", 12, "running")))["run_id"] == 12
    assert "run_id" not in json.loads(JsonFormatter().format(record("runs %s scheduled", 3)))
    assert "run_id" not in json.loads(JsonFormatter().format(record("run %s", "-")))


def test_an_exception_keeps_its_traceback_on_the_same_line():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        line = JsonFormatter().format(record("run %s failed", 4, exc_info=sys.exc_info()))
    assert "\n" not in line and "RuntimeError: boom" in json.loads(line)["exc"]


def test_the_switch_takes_plain_or_json_and_names_itself_otherwise():
    assert log_format({}) == "plain"
    assert log_format({"ROLLWAY_LOG_FORMAT": "JSON"}) == "json"
    with pytest.raises(ValueError, match="ROLLWAY_LOG_FORMAT must be one of plain, json .got 'yaml'."):
        log_format({"ROLLWAY_LOG_FORMAT": "yaml"})


@pytest.fixture
def engine_logger():
    engine = logging.getLogger("workers")
    saved = (list(engine.handlers), engine.level, engine.propagate)
    yield engine
    engine.handlers[:], engine.level, engine.propagate = saved


def test_the_drivers_engine_lines_are_json_with_its_run_id(engine_logger):
    out = io.StringIO()
    configure_driver_logging(5, {"ROLLWAY_LOG_FORMAT": "json"}, stream=out)
    configure_driver_logging(5, {"ROLLWAY_LOG_FORMAT": "json"}, stream=out)  # once, not twice
    logging.getLogger("workers.run.driver").warning("no checkpoints are written")
    [line] = out.getvalue().splitlines()
    assert json.loads(line) | {"time": ""} == {
        "time": "",
        "level": "WARNING",
        "logger": "workers.run.driver",
        "message": "no checkpoints are written",
        "run_id": 5,
    }


def test_the_driver_leaves_logging_alone_without_the_switch(engine_logger):
    before = list(engine_logger.handlers)
    configure_driver_logging(5, {})
    assert engine_logger.handlers == before and engine_logger.propagate


def test_the_platforms_processes_log_json_with_the_switch(tmp_path):
    code = (
        "import django, logging; django.setup(); "
        "logging.getLogger('runs.actions').info('run %s → %s', 9, 'running', extra={'run_id': 9})"
    )
    env = {
        **os.environ,
        "ROLLWAY_LOG_FORMAT": "json",
        "ROLLWAY_HOME": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "rollway.settings",
        "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO)]),
    }
    env.pop("DATABASE_URL", None)
    err = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stderr
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert {"message": "run 9 → running", "run_id": 9}.items() <= lines[-1].items()


def test_the_drivers_engine_lines_go_to_the_runs_own_log_file_too(engine_logger, tmp_path):
    log_file = tmp_path / "logs" / "run-5.log"
    configure_driver_logging(5, {}, log_file=str(log_file))
    configure_driver_logging(5, {}, log_file=str(log_file))  # once, not twice
    logging.getLogger("workers.run.driver").info("run %s: warm start done", 5)
    logging.getLogger("workers.run.reporter").debug("not at INFO: left out")
    [line] = log_file.read_text().splitlines()
    assert line.endswith(" INFO workers.run.driver: run 5: warm start done")
    assert engine_logger.propagate  # Ray's log keeps its lines as before

    configure_driver_logging(5, {"ROLLWAY_LOG_FORMAT": "json"}, stream=io.StringIO(), log_file=str(log_file))
    logging.getLogger("workers.run.driver").warning("as JSON now")
    assert json.loads(log_file.read_text().splitlines()[-1])["message"] == "as JSON now"


def test_a_failing_runs_driver_writes_why_to_its_log_file(engine_logger, tmp_path):
    """The driver's own class outside Ray, on a config whose model it may not read: the
    failure reaches the run's log file under Confinement.log_root."""
    from workers.run.driver import RunDriver
    from workers.run.paths import Confinement

    box = Confinement(scratch_root=str(tmp_path / "scratch"), log_root=str(tmp_path / "logs"))
    assert box.log_file(12) == str(tmp_path / "logs" / "run-12.log")
    assert Confinement(scratch_root=str(tmp_path)).log_file(12) is None
    config = {"model": {"source": "path", "path": str(tmp_path / "elsewhere")}}
    driver = RunDriver.__ray_actor_class__(12, config, None, "", str(tmp_path), confinement=box)
    assert driver.run()["state"] == "failed"
    text = (tmp_path / "logs" / "run-12.log").read_text()
    assert "INFO workers.run.driver: run 12: driver started" in text
    assert f"ERROR workers.run.driver: run 12 failed: {driver.error}" in text
    assert "INFO workers.run.driver: run 12: driver done: failed (error)" in text
