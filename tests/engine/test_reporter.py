"""MetricsReporter against a real local HTTP server: batching, auth, spool and re-send."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.engine.ingest_stub import IngestStub
from workers.run import reporter as reporter_mod
from workers.run.reporter import MetricsReporter, spool_path


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
    from workers.run.reporter import read_spool, status_spool_path

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


# -- what each answer of the site does to a batch ------------------------------------------


class Clock:
    """The reporter's clock and sleep: time moves only when the test (or a sleep) says."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock():
    return Clock()


def reporter(stub_url: str, tmp_path, clock: Clock, run_id: int = 7, token: str = "tok-123", **kw) -> MetricsReporter:
    return MetricsReporter(run_id, stub_url, token, str(tmp_path), clock=clock, sleep=clock.sleep, **kw)


def spooled_steps(tmp_path, run_id: int = 7) -> list[int]:
    spool = spool_path(str(tmp_path), run_id)
    return [json.loads(line)["step"] for line in spool.read_text().splitlines()] if spool.exists() else []


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504])
def test_a_retryable_answer_spools_the_batch_and_sends_it_after_the_backoff(stub, tmp_path, clock, status):
    rep = reporter(stub.url, tmp_path, clock)
    stub.script = [(status, {})]
    for s, step, v in points(5):
        rep.add(s, step, v)
    assert rep.flush() == 0
    assert rep.site_down and str(status) in rep.last_error
    assert spooled_steps(tmp_path) == [0, 1, 2, 3, 4]
    rep.add("reward/mean", 5, 0.5)
    clock.now += reporter_mod.BACKOFF_START_S / 2
    assert rep.flush() == 0  # still backing off: nothing is posted
    assert stub.attempts == 1
    clock.now += reporter_mod.BACKOFF_START_S
    assert rep.flush() == 6
    assert stub.series(7)["reward/mean"] == {step: step / 10 for step in range(6)}
    assert rep.dropped == 0 and not spool_path(str(tmp_path), 7).exists()


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_holds_the_next_post_back_that_long(stub, tmp_path, clock, status):
    rep = reporter(stub.url, tmp_path, clock)
    stub.script = [(status, {"Retry-After": "30"})]
    rep.add("loss", 1, 1.0)
    rep.flush()
    clock.now += 29  # far past the backoff, short of Retry-After
    assert rep.flush() == 0 and stub.attempts == 1
    clock.now += 2
    assert rep.flush() == 1
    assert stub.series(7) == {"loss": {1: 1.0}}


def test_close_waits_out_retry_after_and_delivers(stub, tmp_path, clock):
    rep = reporter(stub.url, tmp_path, clock)
    stub.script = [(503, {"Retry-After": "4"})]
    rep.add("loss", 1, 1.0)
    assert rep.close(timeout_s=10) is True
    assert clock.slept == [4.0]
    assert stub.series(7) == {"loss": {1: 1.0}}


def test_retry_after_reads_seconds_and_http_dates_within_a_bound():
    assert reporter_mod.retry_after_s("12") == 12.0
    assert reporter_mod.retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    assert reporter_mod.retry_after_s("Fri, 01 Jan 2100 00:00:00 GMT") == reporter_mod.RETRY_AFTER_MAX_S
    assert reporter_mod.retry_after_s("999999") == reporter_mod.RETRY_AFTER_MAX_S
    assert reporter_mod.retry_after_s("soon") is None
    assert reporter_mod.retry_after_s(None) is None


def test_a_status_and_a_checkpoint_answered_429_are_kept_and_sent_again(stub, tmp_path, clock):
    rep = reporter(stub.url, tmp_path, clock)
    stub.script = [(429, {}), (429, {})]
    assert rep.post_status("running", phase="stepping", detail="step 3") is False
    clock.now += reporter_mod.BACKOFF_MAX_S
    assert rep.post_checkpoint(4, "/c/run-7/step-00000004", 10, "ab" * 32, []) is False
    clock.now += reporter_mod.BACKOFF_MAX_S
    rep.flush()
    assert stub.statuses[7] == ["running"]
    assert [body["step"] for body in stub.checkpoints[7]] == [4]


def test_a_batch_too_large_is_split_in_halves_until_the_site_takes_it(stub, tmp_path, clock, monkeypatch):
    monkeypatch.setattr(reporter_mod, "BATCH_POINTS", 10)
    stub.max_points = 3
    rep = reporter(stub.url, tmp_path, clock)
    for s, step, v in points(10):
        rep.add(s, step, v)
    assert rep.flush() == 10
    assert [len(body["points"]) for body in stub.metric_requests()] == [2, 3, 2, 3]
    assert [p["step"] for body in stub.metric_requests() for p in body["points"]] == list(range(10))
    assert rep.dropped == 0 and not spool_path(str(tmp_path), 7).exists()


def test_a_single_point_too_large_is_dropped_saying_so(stub, tmp_path, clock, caplog):
    stub.max_points = 0
    rep = reporter(stub.url, tmp_path, clock)
    rep.add("loss", 1, 1.0)
    rep.add("loss", 2, 2.0)
    with caplog.at_level("ERROR", logger="workers.run.reporter"):
        assert rep.flush() == 0
    assert rep.dropped == 2
    assert "a single point is larger than the site takes" in caplog.text and "HTTP 413" in caplog.text
    assert not spool_path(str(tmp_path), 7).exists()


@pytest.mark.parametrize("status", [301, 308])
def test_a_moved_endpoint_on_the_same_host_is_followed_and_kept(tmp_path, clock, status):
    with IngestStub(token="tok-123", prefix="/rollway") as stub:
        stub.script = [(status, {"Location": "/rollway/api/runs/7/metrics"})]
        rep = reporter(stub.url, tmp_path, clock)
        rep.add("loss", 1, 1.0)
        assert rep.flush() == 1
        assert rep.ingest_url == f"{stub.url}/rollway"
        rep.add("loss", 2, 2.0)
        assert rep.flush() == 1
        assert stub.attempts == 3  # the redirect, its target, then straight to the target
        assert stub.series(7) == {"loss": {1: 1.0, 2: 2.0}}


@pytest.mark.parametrize("status", [302, 307])
def test_a_temporary_redirect_on_the_same_host_is_followed_once(tmp_path, clock, status):
    with IngestStub(token="tok-123", prefix="/rollway") as stub:
        stub.script = [(status, {"Location": f"{stub.url}/rollway/api/runs/7/metrics"})]
        rep = reporter(stub.url, tmp_path, clock)
        rep.add("loss", 1, 1.0)
        assert rep.flush() == 1
        assert rep.ingest_url == stub.url
        assert stub.series(7) == {"loss": {1: 1.0}}


def test_a_tls_proxys_upgrade_to_https_is_followed_with_the_token(tmp_path, clock):
    seen: list[tuple[str, str]] = []

    def site(request: httpx.Request) -> httpx.Response:
        seen.append((str(request.url), request.headers.get("Authorization", "")))
        if request.url.scheme == "http":
            return httpx.Response(301, headers={"Location": str(request.url.copy_with(scheme="https"))})
        return httpx.Response(200, json={"accepted": len(json.loads(request.content)["points"])})

    rep = reporter("http://rollway.example", tmp_path, clock, transport=httpx.MockTransport(site))
    rep.add("loss", 1, 1.0)
    assert rep.flush() == 1
    assert seen == [
        ("http://rollway.example/api/runs/7/metrics", "Bearer tok-123"),
        ("https://rollway.example/api/runs/7/metrics", "Bearer tok-123"),
    ]
    assert rep.ingest_url == "https://rollway.example"


def test_a_redirect_to_another_host_is_not_followed_and_the_points_wait(stub, tmp_path, clock, caplog):
    elsewhere = f"http://localhost:{stub.port}/api/runs/7/metrics"  # another name: another host
    stub.script = [(301, {"Location": elsewhere})]
    rep = reporter(stub.url, tmp_path, clock)
    rep.add("loss", 1, 1.0)
    with caplog.at_level("WARNING", logger="workers.run.reporter"):
        assert rep.flush() == 0
    assert stub.attempts == 1  # the redirect was not followed
    assert f"redirects to {elsewhere}" in caplog.text and "not followed" in caplog.text
    assert rep.site_down and rep.ingest_url == stub.url
    assert spooled_steps(tmp_path) == [1]
    clock.now += reporter_mod.BACKOFF_START_S
    assert rep.flush() == 1  # the site answers itself again
    assert stub.series(7) == {"loss": {1: 1.0}}


def test_a_redirect_loop_is_cut_and_the_points_wait(stub, tmp_path, clock):
    stub.script = [(307, {"Location": "/api/runs/7/metrics"})] * (reporter_mod.MAX_REDIRECTS + 1)
    rep = reporter(stub.url, tmp_path, clock)
    rep.add("loss", 1, 1.0)
    assert rep.flush() == 0
    assert "redirects" in rep.last_error and spooled_steps(tmp_path) == [1]


@pytest.mark.parametrize(
    ("location", "base"),
    [
        ("https://site/api/runs/7/metrics", "https://site"),
        ("https://site:8443/api/runs/7/metrics", "https://site:8443"),
        ("/rollway/api/runs/7/metrics", "http://site/rollway"),
        ("http://site:8000/api/runs/7/metrics", None),  # another port, in clear
        ("https://other/api/runs/7/metrics", None),
        ("http://site/login/?next=/api/runs/7/metrics", None),
        ("https://site/api/runs/8/metrics", None),
        ("ftp://site/api/runs/7/metrics", None),
        ("", None),
    ],
)
def test_a_redirect_is_followed_only_to_the_same_endpoint_on_the_same_host(location, base):
    assert reporter_mod.redirect_base("http://site/api/runs/7/metrics", location, "/api/runs/7/metrics") == base


def test_https_is_never_followed_down_to_http():
    assert (
        reporter_mod.redirect_base(
            "https://site/api/runs/7/metrics", "http://site/api/runs/7/metrics", "/api/runs/7/metrics"
        )
        is None
    )


@pytest.mark.parametrize("status", [400, 404, 409])
def test_a_rejected_batch_is_dropped_naming_the_status_and_the_url(stub, tmp_path, clock, caplog, status):
    stub.script = [(status, {})]
    rep = reporter(stub.url, tmp_path, clock)
    rep.add("loss", 1, 1.0)
    with caplog.at_level("ERROR", logger="workers.run.reporter"):
        assert rep.flush() == 0
    assert rep.dropped == 1 and not rep.site_down
    assert f"HTTP {status}" in caplog.text and f"{stub.url}/api/runs/7/metrics" in caplog.text
    assert not spool_path(str(tmp_path), 7).exists()
    rep.flush(force=True)
    assert stub.attempts == 1  # nothing left to resend


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_token_stops_reporting_and_keeps_every_point_for_reconcile(stub, tmp_path, clock, status):
    from workers.run.reporter import read_spool

    stub.script = [(status, {})]
    rep = reporter(stub.url, tmp_path, clock)
    for s, step, v in points(3):
        rep.add(s, step, v)
    assert rep.flush() == 0
    assert rep.refused and str(status) in rep.refused and rep.dropped == 0
    rep.add("reward/mean", 3, 0.3)
    clock.now += reporter_mod.BACKOFF_MAX_S
    assert rep.flush(force=True) == 0
    assert rep.post_status("failed", "out of memory") is False
    assert rep.close(timeout_s=30) is False
    assert stub.attempts == 1  # refused once, never asked again
    assert clock.slept == []  # close did not wait for an answer that cannot change
    spooled, status = read_spool(7, str(tmp_path))
    assert [(p["series"], p["step"], p["value"]) for p in spooled] == points(4)
    assert status == ("failed", "out of memory")


def test_a_wrong_token_is_refused_by_the_stub_and_nothing_is_lost(stub, tmp_path, clock):
    rep = reporter(stub.url, tmp_path, clock, token="wrong")
    rep.add("loss", 1, 0.1)
    assert rep.flush() == 0
    assert stub.unauthorized == 1 and "401" in rep.last_error
    assert spooled_steps(tmp_path) == [1]
    rep.flush(force=True)
    assert stub.unauthorized == 1  # not asked again


def test_the_schedule_and_placement_answered_429_are_kept_and_only_the_latest_is_sent(stub, tmp_path, clock):
    rep = reporter(stub.url, tmp_path, clock)
    stub.script = [(429, {})]
    first = {"admissions": [[0, 0, 2]], "batches": [[0, ["a", "b"]]], "bytes": 40, "bytes_per_step": 40.0}
    assert rep.post_schedule(first) is False
    clock.now += reporter_mod.BACKOFF_MAX_S
    stub.script = [(429, {})]
    latest = {**first, "batches": [[0, ["b", "a"]]]}
    assert rep.post_schedule(latest) is False  # replaces the undelivered one
    # The next report delivers what is pending first: only the latest schedule.
    assert rep.post_placement([{"actor": "trainer"}]) is True
    taken = [(kind, body) for kind, _, body in stub.requests if kind in ("schedule", "placement")]
    assert taken == [("schedule", latest), ("placement", {"actors": [{"actor": "trainer"}]})]
    assert rep.close() is True


def test_without_a_site_the_schedule_is_kept_in_memory(tmp_path):
    rep = MetricsReporter(7, None, "", str(tmp_path))
    schedule = {"admissions": [], "batches": [[0, ["g"]]]}
    assert rep.post_schedule(schedule) is True and rep.schedule == schedule
