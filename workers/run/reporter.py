"""MetricsReporter: the engine's one metrics path to the platform.

The driver hands every point (series, step, value, time) to a `MetricsReporter`, which
refuses a series not in the vocabulary (workers/core/metric_names.py), batches the points and
POSTs them to the platform's ingest endpoint (`POST {ingest_url}/api/runs/{run_id}/metrics`,
`Authorization: Bearer {token}`), the way the W&B / MLflow clients do. The ingest is
idempotent per (run, series, step), so re-sending a point is always safe.

Every answer of the site is read by its status (`answer_kind`), so that a point is
dropped only when the site has said it will never take it:

- 2xx: taken.
- no answer (connection error, timeout), 408, 425, 429, 5xx, or any status not named
  here: the site may take it later. Every unsent point goes to a spool file,
  `<cache_dir>/spool/run-<id>.jsonl`, and is re-sent first on the next flush that gets
  through, after a backoff (doubling from BACKOFF_START_S to BACKOFF_MAX_S) or the
  answer's `Retry-After` if that is longer (at most RETRY_AFTER_MAX_S); nothing is held
  only in memory.
- 301, 302, 307, 308: followed (the same POST, with the token) only to the same
  endpoint on the same host, over the same scheme and port or upgraded from http to
  https (a TLS proxy in front of the site); 301 and 308 move the reporter there for
  good. A redirect anywhere else is never sent the token: the points are spooled and a
  warning names the redirect.
- 413: a batch too large for the site's body limit is split in halves and each half
  sent; a single point the site still refuses is dropped, saying so.
- 401, 403: the run's token is not (or no longer) good, and no retry will make it so:
  the reporter stops posting and keeps everything in the spool, and the site's
  reconcile takes the spool in when the driver ends.
- any other 4xx (400, 404, 409, ...): resending the same body cannot help; it is
  logged with the status and the URL, and dropped.

Each checkpoint a run writes (workers/run/checkpoints.py) is announced with
`post_checkpoint` (`POST .../runs/{run_id}/checkpoints`); undelivered, it is retried on
every flush like the status, and given up when the run ends: the site can also find a
run's checkpoints by their meta.json files.

With `ingest_url=None` the reporter posts nothing and keeps every point in memory
(`points`, and `checkpoints`): benchmarks and tests run without a site.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpx

from workers.core.metric_names import metric_of
from workers.run.failures import DETAIL_MAX, MESSAGE_MAX, Failure, clip

log = logging.getLogger(__name__)

# Points per POST: the ingest takes thousands per second; 500 keeps one request small
# (≈40 KB) while a poll of a fast run still fits in one or two requests.
BATCH_POINTS = 500
# Retry a down site after this many seconds, doubling up to BACKOFF_MAX_S: too short →
# every poll of the driver waits on a dead socket; too long → the dashboard lags.
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 15.0
# The longest `Retry-After` obeyed: a proxy asking for an hour would leave the dashboard
# blank that long, while the points wait safely in the spool either way.
RETRY_AFTER_MAX_S = 300.0
# Redirects followed for one post: a loop between two addresses is not followed forever.
MAX_REDIRECTS = 3
# What an answer's status means for what was posted (answer_kind).
TAKEN = "taken"
RETRY = "retry"
REDIRECT = "redirect"
TOO_LARGE = "too_large"
REFUSED = "refused"
REJECTED = "rejected"
RETRY_STATUSES = frozenset({408, 425, 429})  # and every 5xx
REDIRECT_STATUSES = frozenset({301, 302, 307, 308})
MOVED_STATUSES = frozenset({301, 308})  # the endpoint moved for good
REFUSED_STATUSES = frozenset({401, 403})
STATUSES = ("running", "succeeded", "failed")
# What a starting run is doing, in order (the site's ingest accepts these words only):
# building or loading the warm-started policy, spawning the actors and starting their
# engines (vLLM takes most of a minute on CPU), waiting for the first trained step,
# then training.
PHASES = ("warm_start", "starting_engines", "first_step", "stepping")
PHASE_DETAIL_MAX = 200
# What the reporter posts to, as POST {ingest_url}/api/runs/<id>/<endpoint>: the site
# gives exactly these its ingest body limit and keeps them out of its HTTPS redirect.
INGEST_ENDPOINTS = ("metrics", "status", "checkpoints", "placement", "schedule")


def spool_path(cache_dir: str, run_id: int) -> Path:
    """Where the points of run `run_id` wait while the site is unreachable."""
    return Path(cache_dir) / "spool" / f"run-{run_id}.jsonl"


def status_spool_path(cache_dir: str, run_id: int) -> Path:
    """Where the last undelivered status of run `run_id` waits (written by `close`), so
    a run that ended while the site was down is not taken for lost by reconcile."""
    return Path(cache_dir) / "spool" / f"run-{run_id}.status.json"


def answer_kind(status: int) -> str:
    """What the site's answer `status` means for the body posted: TAKEN, RETRY (keep it
    and send it again later), REDIRECT, TOO_LARGE (split it), REFUSED (the token is not
    good: stop posting) or REJECTED (never send it again)."""
    if 200 <= status < 300:
        return TAKEN
    if status in REDIRECT_STATUSES:
        return REDIRECT
    if status == 413:
        return TOO_LARGE
    if status in REFUSED_STATUSES:
        return REFUSED
    if 400 <= status < 500 and status not in RETRY_STATUSES:
        return REJECTED
    # 5xx, 408, 425, 429, and anything unforeseen (a 1xx, a 303): the safe side is to keep.
    return RETRY


def retry_after_s(value: str | None) -> float | None:
    """Seconds a `Retry-After` header asks to wait (delta-seconds or an HTTP date), at
    most RETRY_AFTER_MAX_S; None when absent or unreadable."""
    if not value or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S)


def _port(url: httpx.URL) -> int | None:
    return url.port or {"http": 80, "https": 443}.get(url.scheme)


def redirect_base(url: str, location: str, endpoint_path: str) -> str | None:
    """The ingest base URL that a redirect of `url` (ending in `endpoint_path`) to
    `location` moves to, if the reporter may follow it with the run's token: the same
    host, over the same scheme and port or from http up to https, at the same endpoint
    (a path prefix may change). None for anything else."""
    if not location.strip():
        return None
    src = httpx.URL(url)
    try:
        dst = src.join(location)
    except httpx.InvalidURL:
        return None
    if dst.host != src.host or not dst.host:
        return None
    upgrade = src.scheme == "http" and dst.scheme == "https"
    if not upgrade and (dst.scheme != src.scheme or _port(dst) != _port(src)):
        return None
    if dst.query or not dst.path.endswith(endpoint_path):
        return None
    return str(dst.copy_with(path=dst.path[: -len(endpoint_path)] or "/", query=None, fragment=None)).rstrip("/")


class _SiteDown(Exception):
    """The site did not take the post but may later (no answer, 408/425/429/5xx, a
    redirect not followed): keep and retry, not before `retry_after` seconds if set."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _Refused(Exception):
    """The site refused the run's token (401/403): stop posting, keep everything."""


class MetricsReporter:
    """Batches metric points and posts them (and run status) to the ingest endpoint.

    Thread-safe. `add*` only buffers in memory; `flush()` sends (call it every poll);
    `close()` makes a last bounded attempt and leaves whatever is left in the spool.
    `clock` (monotonic seconds) and `sleep` time the backoff: tests pass their own.
    """

    def __init__(
        self,
        run_id: int,
        ingest_url: str | None,
        token: str = "",
        cache_dir: str | None = None,
        *,
        timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if ingest_url is not None and not cache_dir:
            raise ValueError("MetricsReporter needs cache_dir (for the spool) when ingest_url is set")
        self.run_id = run_id
        self.ingest_url = ingest_url.rstrip("/") if ingest_url else None
        self.points: list[dict] = []  # in-memory mode only: everything ever added
        self.phases: list[tuple[str, str]] = []  # in-memory mode only: (phase, detail) posted
        self.checkpoints: list[dict] = []  # in-memory mode only: checkpoint bodies posted
        self.placement: dict | None = None  # in-memory mode only: the placement posted
        self.schedule: dict | None = None  # in-memory mode only: the schedule posted
        self._pending_checkpoints: list[dict] = []  # bodies not yet delivered, oldest first
        # The reports of which the site keeps only the latest (placement, schedule) not yet
        # delivered, by endpoint: a newer one replaces an undelivered one.
        self._pending_latest: dict[str, dict] = {}
        self.sent = 0  # points the site accepted
        self.dropped = 0  # points the site rejected for good (answer_kind REJECTED) or not finite
        self.last_error = ""
        # Why the site refused the run's token (401/403), once it has: nothing is posted
        # after that, everything stays in the spool.
        self.refused = ""
        self._clock, self._sleep = clock, sleep
        self._warned_redirects: set[str] = set()
        self._pending: list[dict] = []
        # The status body to post (as `post_status` makes it): only the latest is worth
        # delivering.
        self._pending_status: dict | None = None
        self._lock = threading.Lock()
        self._retry_at = 0.0
        self._backoff = BACKOFF_START_S
        self._spool = spool_path(cache_dir, run_id) if cache_dir else None
        self._status_spool = status_spool_path(cache_dir, run_id) if cache_dir else None
        if self._status_spool is not None:
            # A previous reporter of this run could not deliver it: retry it first.
            spooled = _load_status(self._status_spool, run_id)
            self._pending_status = spooled if spooled is not None and "status" in spooled else None
        self._client = (
            httpx.Client(
                timeout=timeout_s,
                headers={"Authorization": f"Bearer {token}"},
                transport=transport,
            )
            if self.ingest_url
            else None
        )

    # -- adding points -------------------------------------------------------------

    def add(self, series: str, step: int, value: float, t: float | None = None) -> None:
        """Queue one point. Non-finite values are dropped (JSON has no NaN); a series
        outside the vocabulary raises ValueError: the dashboard would not know its unit
        or help text, and a misspelt name would chart as a new series."""
        if metric_of(series) is None:
            raise ValueError(f"unknown metric series {series!r}: add it to workers.core.metric_names.METRICS")
        value = float(value)
        if not math.isfinite(value):
            self.dropped += 1
            log.warning("run %s: dropped non-finite %s=%r at step %s", self.run_id, series, value, step)
            return
        point = {"series": series, "step": int(step), "value": value, "time": t or time.time()}
        with self._lock:
            if self._client is None:
                self.points.append(point)
            else:
                self._pending.append(point)

    def add_many(self, values: dict[str, float], step: int, t: float | None = None) -> None:
        """Queue one point per entry of `values`, all at `step`."""
        t = t or time.time()
        for series, value in values.items():
            self.add(series, step, value, t)

    def post_status(
        self,
        status: str,
        error: str = "",
        *,
        phase: str = "",
        detail: str = "",
        error_detail: str = "",
        error_kind: str = "",
        failure: Failure | None = None,
    ) -> bool:
        """Tell the site the run's state, and optionally its phase (one of PHASES) with a
        detail for people; a failure's `error` (a sentence, workers.run.failures) goes with
        its `error_detail` (what it was worked out from, cut to DETAIL_MAX) and its `error_kind`
        (one of workers.run.failures.KINDS: the site resumes a run that lost a node); a
        `failure` record gives all three (its message, facts and kind) and goes along as
        `failure`, its fields (the traceback among them, for the site's admins). True once delivered.
        Undelivered, the latest status is retried on every flush (terminal states stick
        on the site, so a late retry of "running" cannot undo "cancelled"); a newer phase
        replaces an undelivered older one."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES} (got {status!r})")
        if phase and phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES} (got {phase!r})")
        detail = detail[:PHASE_DETAIL_MAX]
        if failure is not None:
            error, error_detail, error_kind = failure.message, failure.detail, failure.kind
        error, error_detail = clip(error, MESSAGE_MAX), clip(error_detail, DETAIL_MAX)
        if self._client is None:
            log.info("run %s: status %s %s %s %s", self.run_id, status, phase, detail, error)
            self.phases.append((phase, detail))
            return True
        body: dict = {"status": status, "error": error}
        if error_detail:
            body["error_detail"] = error_detail
        if error_kind:
            body["error_kind"] = error_kind
        if failure is not None:
            fields = failure.fields()
            body["failure"] = {
                **fields,
                "message": clip(fields["message"], MESSAGE_MAX),
                "traceback": clip(fields["traceback"], DETAIL_MAX),
            }
        if phase:
            body.update(phase=phase, phase_detail=detail)
        with self._lock:
            self._pending_status = body
            self._send_status()
            return self._pending_status is None

    def post_checkpoint(self, step: int, location: str, bytes: int, sha256: str, pruned: list[str]) -> bool:
        """Tell the site of a completed checkpoint at `step` (`location`, its step
        directory; `bytes` in total; `sha256` its manifest digest) and of the run's
        older checkpoints deleted after it (`pruned`, their locations). True once
        delivered; undelivered, it is retried on each flush until the reporter closes."""
        body = {"step": int(step), "location": location, "bytes": int(bytes), "sha256": sha256, "pruned": list(pruned)}
        if self._client is None:
            self.checkpoints.append(body)
            return True
        with self._lock:
            self._pending_checkpoints.append(body)
            self._send_checkpoints()
            return not self._pending_checkpoints

    def post_placement(self, actors: list[dict]) -> bool:
        """Tell the site where the run's actors run: one row per actor (its role, node id,
        address, labels, GPU ids, CUDA_VISIBLE_DEVICES, pid: workers.run.actors.where_am_i).
        True once delivered; undelivered, it is retried on each flush until the reporter
        closes (only the latest is kept)."""
        body = {"actors": actors}
        if self._client is None:
            self.placement = body
            return True
        return self._post_latest("placement", body)

    def post_schedule(self, schedule: dict) -> bool:
        """Give the site the run's recorded schedule (workers.run.schedule.schedule_json:
        its admissions, batches and size), which a replay of the run follows. True once
        delivered; retried as a placement is."""
        if self._client is None:
            self.schedule = schedule
            return True
        return self._post_latest("schedule", schedule)

    def _post_latest(self, endpoint: str, body: dict) -> bool:
        with self._lock:
            self._pending_latest[endpoint] = body
            self._send_latest()
            return endpoint not in self._pending_latest

    # -- sending -------------------------------------------------------------------

    def flush(self, force: bool = False) -> int:
        """Send the spool (first) and the queued points; returns points accepted now.

        While the site is down this only moves queued points to the spool, unless the
        backoff has expired or `force` is set; once the token is refused, always."""
        if self._client is None:
            return 0
        with self._lock:
            if self.refused or (not force and self._clock() < self._retry_at):
                self._spool_pending()
                return 0
            if self._pending_status is not None:
                self._send_status()
                if self._pending_status is not None:  # still down: don't knock twice
                    self._spool_pending()
                    return 0
            if self._pending_checkpoints:
                self._send_checkpoints()
                if self._pending_checkpoints:
                    self._spool_pending()
                    return 0
            if self._pending_latest:
                self._send_latest()
                if self._pending_latest:
                    self._spool_pending()
                    return 0
            spooled = self._read_spool()
            todo = spooled + self._pending
            self._pending = []
            accepted = 0
            batches = [todo[i : i + BATCH_POINTS] for i in range(0, len(todo), BATCH_POINTS)]
            while batches:
                batch = batches.pop(0)
                try:
                    taken = self._post_points(batch)
                except (_SiteDown, _Refused) as exc:
                    self._write_spool([point for b in [batch, *batches] for point in b])
                    self._not_taken(exc)
                    return accepted
                if taken is not None:
                    accepted += taken
                elif len(batch) > 1:  # too large: its halves go next, in order
                    half = len(batch) // 2
                    batches[:0] = [batch[:half], batch[half:]]
            self._site_up()
            if spooled:
                self._write_spool([])
            return accepted

    def close(self, timeout_s: float = 10.0) -> bool:
        """Deliver what is left, retrying for up to `timeout_s`; True if nothing is left.

        Whatever could not be delivered stays in the spool: a later reporter of the
        run sends it first, and the platform's reconcile takes in a gone driver's."""
        if self._client is None:
            return True
        deadline = self._clock() + timeout_s
        while True:
            self.flush(force=True)
            with self._lock:
                done = (
                    not self._pending
                    and self._pending_status is None
                    and not self._pending_checkpoints
                    and not self._pending_latest
                    and not self._spool_size()
                )
            now = self._clock()
            if done or self.refused or now >= deadline:
                break
            # Until the retry time the last answer set (its Retry-After, or the backoff).
            wait = self._retry_at - now if self._retry_at > now else self._backoff
            self._sleep(min(wait, deadline - now))
        with self._lock:
            self._spool_pending()
            self._spool_status()
            if self._pending_checkpoints:
                # The site finds them by their meta.json files when it rescans.
                log.warning(
                    "run %s: the site was not told of checkpoints at steps %s",
                    self.run_id,
                    [body["step"] for body in self._pending_checkpoints],
                )
        self._client.close()
        return done

    @property
    def site_down(self) -> bool:
        return self._retry_at > 0

    # -- internals (call with the lock held) ---------------------------------------

    def _post(self, endpoint: str, body: dict) -> httpx.Response:
        """POST `body` to the endpoint, following the redirects `redirect_base` allows.
        Returns an answer that is TAKEN, TOO_LARGE or REJECTED; raises _SiteDown for
        one to retry (a redirect not followed included) and _Refused for the token."""
        assert endpoint in INGEST_ENDPOINTS, endpoint
        if self._client is None:
            raise RuntimeError("this reporter has no site to post to (no ingest_url)")
        endpoint_path = f"/api/runs/{self.run_id}/{endpoint}"
        url = f"{self.ingest_url}{endpoint_path}"
        for _ in range(MAX_REDIRECTS + 1):
            try:
                resp = self._client.post(url, json=body)
            except httpx.HTTPError as exc:  # connection refused, timeout, reset
                raise _SiteDown(f"{type(exc).__name__}: {exc} ({url})") from exc
            kind = answer_kind(resp.status_code)
            if kind != REDIRECT:
                break
            url = self._follow(resp, url, endpoint_path)
        else:
            raise _SiteDown(f"more than {MAX_REDIRECTS} redirects from {self.ingest_url}{endpoint_path}; last to {url}")
        if kind == RETRY:
            raise _SiteDown(f"HTTP {resp.status_code} from {url}", retry_after_s(resp.headers.get("Retry-After")))
        if kind == REFUSED:
            raise _Refused(f"HTTP {resp.status_code} from {url}: {resp.text[:300]}")
        return resp

    def _follow(self, resp: httpx.Response, url: str, endpoint_path: str) -> str:
        """Where a redirect answer sends the post next; _SiteDown (and a warning, once per
        address) for a redirect the run's token must not follow."""
        location = resp.headers.get("Location", "")
        base = redirect_base(url, location, endpoint_path)
        if base is None:
            reason = (
                f"HTTP {resp.status_code} from {url} redirects to {location or '(no Location)'}, "
                "which is not this endpoint on the same host over http(s): not followed with the run's token. "
                "Points wait in the spool; set the site's ROLLWAY_PUBLIC_URL (the drivers' ingest URL) "
                "to the address the site answers on"
            )
            if location not in self._warned_redirects:
                self._warned_redirects.add(location)
                log.warning("run %s: %s", self.run_id, reason)
            raise _SiteDown(reason)
        if resp.status_code in MOVED_STATUSES and base != self.ingest_url:
            log.warning(
                "run %s: the ingest moved (HTTP %s): posting to %s from now on", self.run_id, resp.status_code, base
            )
            self.ingest_url = base
        return f"{base}{endpoint_path}"

    def _post_points(self, points: list[dict]) -> int | None:
        """Points taken now, or None when the batch is too large and should be split.
        A single point too large, or a batch the site rejects, is dropped (logged)."""
        resp = self._post("metrics", {"points": points})
        kind = answer_kind(resp.status_code)
        if kind == TAKEN:
            try:
                n = int(resp.json().get("accepted", len(points)))
            except (ValueError, AttributeError):  # a 2xx with no JSON body: it took them
                n = len(points)
            self.sent += n
            return n
        if kind == TOO_LARGE and len(points) > 1:
            return None
        what = "a single point is larger than the site takes" if kind == TOO_LARGE else "resending cannot help"
        self.dropped += len(points)
        self.last_error = (
            f"the ingest at {resp.url} rejected {len(points)} points ({what}): "
            f"HTTP {resp.status_code} {resp.text[:300]}"
        )
        log.error("run %s: %s", self.run_id, self.last_error)
        return 0

    def _send_status(self) -> None:
        if self._pending_status is None:
            return
        body = self._pending_status
        status = body["status"]
        if self.refused:
            self._spool_status()  # for reconcile, should the driver die before close
            return
        try:
            resp = self._post("status", body)
        except (_SiteDown, _Refused) as exc:
            self._not_taken(exc)
            return
        if answer_kind(resp.status_code) != TAKEN:
            self.last_error = f"status {status!r} rejected by {resp.url}: HTTP {resp.status_code} {resp.text[:300]}"
            log.error("run %s: %s", self.run_id, self.last_error)
        self._pending_status = None
        self._spool_status()

    def _send_checkpoints(self) -> None:
        """Deliver the pending checkpoint announcements in order; stop at a site down."""
        while self._pending_checkpoints and not self.refused:
            body = self._pending_checkpoints[0]
            try:
                resp = self._post("checkpoints", body)
            except (_SiteDown, _Refused) as exc:
                self._not_taken(exc)
                return
            if answer_kind(resp.status_code) != TAKEN:
                self.last_error = (
                    f"checkpoint of step {body['step']} rejected by {resp.url}: "
                    f"HTTP {resp.status_code} {resp.text[:300]}"
                )
                log.error("run %s: %s", self.run_id, self.last_error)
            self._pending_checkpoints.pop(0)

    def _send_latest(self) -> None:
        """Deliver the pending latest-only reports; one the site refuses for good is
        dropped (and logged), one it cannot take now stays pending."""
        for endpoint, body in list(self._pending_latest.items()):
            if self.refused:
                return
            try:
                resp = self._post(endpoint, body)
            except (_SiteDown, _Refused) as exc:
                self._not_taken(exc)
                return
            if answer_kind(resp.status_code) != TAKEN:
                self.last_error = f"{endpoint} rejected by {resp.url}: HTTP {resp.status_code} {resp.text[:300]}"
                log.error("run %s: %s", self.run_id, self.last_error)
            del self._pending_latest[endpoint]

    def _spool_status(self) -> None:
        """Mirror the pending status on disk (or remove the file once delivered)."""
        if self._status_spool is None:
            return
        if self._pending_status is None:
            self._status_spool.unlink(missing_ok=True)
            return
        self._status_spool.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._status_spool.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self._pending_status))
        os.replace(tmp, self._status_spool)

    def _not_taken(self, exc: _SiteDown | _Refused) -> None:
        if isinstance(exc, _Refused):
            self._refuse(exc)
        else:
            self._site_down(exc)

    def _site_down(self, exc: _SiteDown) -> None:
        self.last_error = str(exc)
        if self._retry_at == 0:
            log.warning("run %s: ingest unreachable (%s); spooling to %s", self.run_id, exc, self._spool)
        self._retry_at = self._clock() + max(self._backoff, exc.retry_after or 0.0)
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)

    def _refuse(self, exc: _Refused) -> None:
        """The token is refused: posting again would only be refused again (and spin on
        every poll), so stop; what is undelivered stays in the spool for reconcile."""
        self.refused = self.last_error = str(exc)
        log.error(
            "run %s: the site refused the run's ingest token (%s); reporting stops, and points and the "
            "final status stay in %s for the site to take in when the driver ends",
            self.run_id,
            exc,
            self._spool,
        )
        self._spool_pending()
        self._spool_status()

    def _site_up(self) -> None:
        self._retry_at = 0.0
        self._backoff = BACKOFF_START_S

    def _spool_pending(self) -> None:
        if self._pending:
            self._append_spool(self._pending)
            self._pending = []

    def _read_spool(self) -> list[dict]:
        return _read_points(self._spool, self.run_id) if self._spool is not None else []

    def _spool_file(self) -> Path:
        """The spool of a reporter with a site (its constructor asks for a cache_dir)."""
        if self._spool is None:
            raise RuntimeError("this reporter keeps no spool (no cache_dir)")
        return self._spool

    def _append_spool(self, points: Iterable[dict]) -> None:
        spool = self._spool_file()
        spool.parent.mkdir(parents=True, exist_ok=True)
        with open(spool, "a") as f:
            f.writelines(json.dumps(p) + "\n" for p in points)

    def _write_spool(self, points: list[dict]) -> None:
        """Replace the spool atomically (a crash leaves the old or the new one, never half)."""
        spool = self._spool_file()
        if not points:
            spool.unlink(missing_ok=True)
            return
        spool.parent.mkdir(parents=True, exist_ok=True)
        tmp = spool.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "w") as f:
            f.writelines(json.dumps(p) + "\n" for p in points)
        os.replace(tmp, spool)

    def _spool_size(self) -> int:
        return self._spool.stat().st_size if self._spool and self._spool.exists() else 0


def read_spool(run_id: int, cache_dir: str) -> tuple[list[dict], tuple[str, str] | None]:
    """What a run's reporters left undelivered: its points and its last status
    (status, error), for the platform to take in directly when the driver is gone."""
    points = _read_points(spool_path(cache_dir, run_id), run_id)
    return points, _read_status(status_spool_path(cache_dir, run_id), run_id)


def read_spooled_status(run_id: int, cache_dir: str) -> dict | None:
    """The last status a run's reporter could not deliver, as it would have posted it
    ({"status", "error", "error_detail", "error_kind", "failure", "phase", "phase_detail"}, unvalidated: the
    platform checks it as it checks a post), or None."""
    return _load_status(status_spool_path(cache_dir, run_id), run_id)


def clear_spool(run_id: int, cache_dir: str) -> None:
    spool_path(cache_dir, run_id).unlink(missing_ok=True)
    status_spool_path(cache_dir, run_id).unlink(missing_ok=True)


def _read_points(path: Path, run_id: int) -> list[dict]:
    if not path.exists():
        return []
    points = []
    for line in path.read_text().splitlines():
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line after a crash mid-write
            log.warning("run %s: skipping a corrupt spool line", run_id)
    return points


def _load_status(path: Path, run_id: int) -> dict | None:
    if not path.exists():
        return None
    try:
        spooled = json.loads(path.read_text())
    except json.JSONDecodeError:
        spooled = None
    if not isinstance(spooled, dict):
        log.warning("run %s: ignoring a corrupt status spool %s", run_id, path)
        return None
    return spooled


def _read_status(path: Path, run_id: int) -> tuple[str, str] | None:
    """(status, error) of a spooled status."""
    spooled = _load_status(path, run_id)
    if spooled is None or "status" not in spooled:
        return None
    return str(spooled["status"]), str(spooled.get("error", ""))
