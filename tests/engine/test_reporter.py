"""MetricsReporter against a real local HTTP server: batching, auth, spool and re-send."""

from __future__ import annotations

import json

import pytest

from tests.engine.ingest_stub import IngestStub
from workers import reporter as reporter_mod
from workers.reporter import MetricsReporter, spool_path


@pytest.fixture
def stub():
    with IngestStub(token="tok-123") as s:
        yield s


def points(n: int, series: str = "reward/mean", start: int = 0) -> list[tuple[str, int, float]]:
    return [(series, step, step / 10) for step in range(start, start + n)]


def test_it_batches_points_and_sends_the_bearer_token(stub, tmp_path, monkeypatch):
    monkeypatch.setattr(reporter_mod, "BATCH_POINTS", 100)
    rep = MetricsReporter(7, stub.url, "tok-123", str(tmp_path))
    for s, step, v in points(250):
        rep.add(s, step, v)
    assert rep.flush() == 250
    sizes = [len(body["points"]) for body in stub.metric_requests()]
    assert sizes == [100, 100, 50]
    assert stub.unauthorized == 0
    assert stub.series(7)["reward/mean"] == {step: step / 10 for step in range(250)}
    first = stub.metric_requests()[0]["points"][0]
    assert set(first) == {"series", "step", "value", "time"}
    assert rep.close() is True


def test_add_many_puts_every_series_at_one_step(stub, tmp_path):
    rep = MetricsReporter(7, stub.url, "tok-123", str(tmp_path))
    rep.add_many({"loss": 0.5, "reward/mean": 0.25}, step=3)
    rep.flush()
    assert stub.series(7) == {"loss": {3: 0.5}, "reward/mean": {3: 0.25}}


def test_a_wrong_token_is_rejected_and_not_retried(stub, tmp_path):
    rep = MetricsReporter(7, stub.url, "wrong", str(tmp_path))
    rep.add("loss", 1, 0.1)
    assert rep.flush() == 0
    assert stub.unauthorized == 1
    assert rep.dropped == 1 and "401" in rep.last_error
    assert not spool_path(str(tmp_path), 7).exists()
    rep.flush(force=True)
    assert stub.unauthorized == 1  # nothing left to resend


def test_points_survive_the_site_being_down_and_arrive_once(tmp_path):
    # Site down: a port nobody listens on. Then the same port comes up.
    probe = IngestStub(token="t")
    port = probe.port
    probe.server.server_close()
    rep = MetricsReporter(9, f"http://127.0.0.1:{port}", "t", str(tmp_path), timeout_s=1.0)
    for s, step, v in points(30):
        rep.add(s, step, v)
    assert rep.flush() == 0
    assert rep.site_down
    spool = spool_path(str(tmp_path), 9)
    assert len(spool.read_text().splitlines()) == 30
    for s, step, v in points(20, start=30):  # added while down, during the backoff
        rep.add(s, step, v)
    rep.flush()
    assert len(spool.read_text().splitlines()) == 50

    with IngestStub(token="t", port=port) as stub:
        assert rep.flush(force=True) == 50
        rep.add("reward/mean", 50, 5.0)
        rep.flush()
        assert not spool.exists()
        assert stub.series(9)["reward/mean"] == {step: step / 10 for step in range(51)}
        assert stub.received == 51  # nothing sent twice
        assert rep.close() is True


def test_a_5xx_answer_spools_instead_of_losing_points(stub, tmp_path):
    rep = MetricsReporter(4, stub.url, "tok-123", str(tmp_path))
    stub.fail_with = 503
    rep.add("loss", 1, 1.0)
    rep.flush()
    assert spool_path(str(tmp_path), 4).exists()
    stub.fail_with = None
    rep.flush(force=True)
    assert stub.series(4) == {"loss": {1: 1.0}}


def test_status_is_retried_until_the_site_answers(tmp_path):
    probe = IngestStub(token="t")
    port = probe.port
    probe.server.server_close()
    rep = MetricsReporter(5, f"http://127.0.0.1:{port}", "t", str(tmp_path), timeout_s=1.0)
    assert rep.post_status("running") is False
    with IngestStub(token="t", port=port) as stub:
        assert rep.post_status("succeeded") is True
        assert stub.statuses[5] == ["succeeded"]  # the latest status wins


def test_close_leaves_undeliverable_points_in_the_spool_for_the_next_reporter(tmp_path):
    probe = IngestStub(token="t")
    port = probe.port
    probe.server.server_close()
    rep = MetricsReporter(6, f"http://127.0.0.1:{port}", "t", str(tmp_path), timeout_s=0.5)
    rep.add("loss", 1, 1.0)
    rep.add("loss", 2, 2.0)
    assert rep.close(timeout_s=0.5) is False
    lines = spool_path(str(tmp_path), 6).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    with IngestStub(token="t", port=port) as stub:
        # A later reporter of the run (a restarted driver) sends the spool first.
        assert MetricsReporter(6, stub.url, "t", str(tmp_path)).close() is True
        assert stub.series(6) == {"loss": {1: 1.0, 2: 2.0}}


def test_an_undelivered_final_status_is_spooled_and_resent_once(tmp_path):
    from workers.reporter import read_spool, status_spool_path

    probe = IngestStub(token="t")
    port = probe.port
    probe.server.server_close()
    rep = MetricsReporter(8, f"http://127.0.0.1:{port}", "t", str(tmp_path), timeout_s=0.5)
    assert rep.post_status("failed", "out of memory") is False
    assert rep.close(timeout_s=0.3) is False
    assert read_spool(8, str(tmp_path)) == ([], ("failed", "out of memory"))
    with IngestStub(token="t", port=port) as stub:
        assert MetricsReporter(8, stub.url, "t", str(tmp_path)).close() is True
        assert stub.statuses[8] == ["failed"]
    assert not status_spool_path(str(tmp_path), 8).exists()


def test_without_a_site_points_stay_in_memory(tmp_path):
    rep = MetricsReporter(1, None)
    rep.add("loss", 1, 0.5)
    rep.add("loss", 2, float("nan"))
    assert [(p["series"], p["step"], p["value"]) for p in rep.points] == [("loss", 1, 0.5)]
    assert rep.dropped == 1
    assert rep.post_status("succeeded") is True
    assert rep.close() is True


def test_a_bad_status_names_the_allowed_ones():
    with pytest.raises(ValueError, match="running"):
        MetricsReporter(1, None).post_status("done")
