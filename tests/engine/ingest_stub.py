"""A local stand-in for the platform's ingest endpoints, for engine tests.

A real HTTP server in a thread that speaks the Metrics ingest contract: Bearer token,
`POST /api/runs/<id>/metrics` (idempotent per (run, series, step)) and
`POST /api/runs/<id>/status` (terminal states stick), `POST /api/runs/<id>/checkpoints`
(each announcement recorded in `checkpoints`, in order), `POST /api/runs/<id>/placement`
(the latest in `placement`) and `POST /api/runs/<id>/schedule` (the latest in
`schedule`). It records every request so
tests can check batching, auth and duplicates.

Tests force the site's other answers: `fail_with` answers every request with one status,
`script` answers the next requests in order ((status, headers) each, then the contract
again), `max_points` answers 413 to a metrics batch larger than that (a body limit),
and `prefix` serves the endpoints under a path prefix (a site moved behind a proxy).
`attempts` counts every POST, answered or not.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATH = re.compile(r"^(.*)/api/runs/(\d+)/(metrics|status|checkpoints|placement|schedule)$")
TERMINAL = {"succeeded", "failed", "cancelled"}


class IngestStub:
    def __init__(self, token: str = "secret", port: int = 0, prefix: str = "") -> None:
        self.token = token
        self.prefix = prefix
        self.lock = threading.Lock()
        self.requests: list[tuple[str, int, dict]] = []  # (kind, run_id, body) accepted
        self.unauthorized = 0
        self.points: dict[tuple[int, str, int], float] = {}  # (run, series, step) → value
        self.received = 0  # points received, duplicates included
        self.statuses: dict[int, list[str]] = {}  # every change of status posted, in order
        self.status: dict[int, str] = {}  # current state (terminal sticks)
        self.errors: dict[int, str] = {}
        self.phases: dict[int, list[tuple[str, str]]] = {}  # every (phase, detail) posted, in order
        self.checkpoints: dict[int, list[dict]] = {}  # every checkpoint body posted, in order
        self.placement: dict[int, list[dict]] = {}  # the latest placement posted: its actors
        self.schedule: dict[int, dict] = {}  # the latest schedule posted
        self.fail_with: int | None = None  # answer every request with this status code
        self.script: list[tuple[int, dict[str, str]]] = []  # the next answers, in order
        self.max_points: int | None = None  # a larger metrics batch gets 413
        self.attempts = 0  # every POST, whatever its answer
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                m = PATH.match(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                with stub.lock:
                    stub.attempts += 1
                    scripted = stub.script.pop(0) if stub.script else None
                if scripted is not None:
                    return self._answer(scripted[0], {"error": "scripted"}, scripted[1])
                if stub.fail_with:
                    return self._answer(stub.fail_with, {"error": "injected"})
                if not m or m.group(1) != stub.prefix:
                    return self._answer(404, {"error": "no such endpoint"})
                if self.headers.get("Authorization") != f"Bearer {stub.token}":
                    with stub.lock:
                        stub.unauthorized += 1
                    return self._answer(401, {"error": "bad token"})
                run_id, kind = int(m.group(2)), m.group(3)
                body = json.loads(raw)
                if kind == "metrics" and stub.max_points is not None and len(body["points"]) > stub.max_points:
                    return self._answer(413, {"errors": {"body": "too large"}})
                with stub.lock:
                    stub.requests.append((kind, run_id, body))
                    if kind == "metrics":
                        for p in body["points"]:
                            stub.received += 1
                            stub.points.setdefault((run_id, p["series"], p["step"]), p["value"])
                        return self._answer(200, {"accepted": len(body["points"])})
                    if kind == "checkpoints":
                        stub.checkpoints.setdefault(run_id, []).append(body)
                        return self._answer(201, {"step": body["step"]})
                    if kind == "placement":
                        stub.placement[run_id] = body["actors"]
                        return self._answer(200, {"actors": len(body["actors"])})
                    if kind == "schedule":
                        stub.schedule[run_id] = body
                        return self._answer(200, {"batches": len(body["batches"])})
                    # A phase change repeats the status the run is in: it is recorded in
                    # `phases` only, so `statuses` lists the changes of status.
                    if not (body.get("phase") and stub.status.get(run_id) == body["status"]):
                        stub.statuses.setdefault(run_id, []).append(body["status"])
                    if body.get("phase"):
                        stub.phases.setdefault(run_id, []).append((body["phase"], body.get("phase_detail", "")))
                    if stub.status.get(run_id) not in TERMINAL:
                        stub.status[run_id] = body["status"]
                        stub.errors[run_id] = body.get("error", "")
                    return self._answer(200, {"status": stub.status[run_id]})

            def _answer(self, code: int, body: dict, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> IngestStub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def series(self, run_id: int) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        with self.lock:
            for (rid, name, step), value in self.points.items():
                if rid == run_id:
                    out.setdefault(name, {})[step] = value
        return out

    def metric_requests(self) -> list[dict]:
        with self.lock:
            return [body for kind, _, body in self.requests if kind == "metrics"]
