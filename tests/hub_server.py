"""A Hugging Face Hub over HTTP, for tests whose commands read the Hub from another
process (`hf download`, a site's launch check) through `HF_ENDPOINT`.

tests/fake_hub.py replaces huggingface_hub's functions inside the test's own process;
a command run as a person runs it needs a Hub it can reach instead. This one answers,
from files a test gives it, what huggingface_hub asks of the Hub to download a
repository: its info at a revision, its file tree, and each file's resolve URL (HEAD
for the commit, ETag and size; GET for the bytes). Nothing else is served: a request
it does not know is a 404, kept in `unknown` for a failing test to show (the `hf` command
also asks the Hub about AI agents' skills, and gets that 404).

    with HubServer() as hub:
        hub.add("model", "acme/tiny", {"config.json": b"{}"})
        env["HF_ENDPOINT"] = hub.url
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# One commit per repository is all a download needs: the revision "main" resolves to it.
COMMIT = "0123456789abcdef0123456789abcdef01234567"
KINDS = {"models": "model", "datasets": "dataset"}
_API = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+)(?:/revision/([^/]+)|/tree/([^/]+)(?:/(.*))?)?$")
_RESOLVE = re.compile(r"^(?:/(datasets))?/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class HubServer:
    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], dict[str, bytes]] = {}
        self.fetched: list[tuple[str, str]] = []  # (repo id, path) of every file whose bytes were sent
        self.unknown: list[str] = []  # requests this stand-in has no answer for
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, kind: str, repo_id: str, files: dict[str, bytes]) -> None:
        """A repository (`kind` "model" or "dataset") holding `files` (path → bytes)."""
        self.repos[(kind, repo_id)] = dict(files)

    def add_dir(self, kind: str, repo_id: str, folder: Path) -> None:
        """A repository holding every file under `folder`, at the same relative paths."""
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        self.add(kind, repo_id, files)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- answers ---------------------------------------------------------------------

    def _files(self, kind: str, repo_id: str) -> dict[str, bytes] | None:
        return self.repos.get((kind, urllib.parse.unquote(repo_id)))

    def _api(self, kind: str, repo_id: str, tree_rev: str | None, tree_path: str | None) -> tuple[int, object]:
        files = self._files(kind, repo_id)
        if files is None:
            return 404, {"error": "Repository not found"}
        if tree_rev is not None:
            prefix = (urllib.parse.unquote(tree_path).rstrip("/") + "/") if tree_path else ""
            return 200, [
                {"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data), "path": path}
                for path, data in sorted(files.items())
                if path.startswith(prefix)
            ]
        return 200, {
            "id": urllib.parse.unquote(repo_id),
            "sha": COMMIT,
            "private": False,
            "disabled": False,
            "gated": False,
            "siblings": [{"rfilename": path, "size": len(data)} for path, data in sorted(files.items())],
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet: the test shows `unknown` when it fails
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str], with_body: bool) -> None:
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(key, value)
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def _answer(self, with_body: bool) -> None:
                path = urllib.parse.urlsplit(self.path).path
                api = _API.match(path)
                if api:
                    kind, repo_id, _, tree_rev, tree_path = api.groups()
                    status, data = hub._api(KINDS[kind], repo_id, tree_rev, tree_path)
                    self._send(status, json.dumps(data).encode(), {"Content-Type": "application/json"}, with_body)
                    return
                resolve = _RESOLVE.match(path)
                if resolve:
                    datasets, repo_id, _, file_path = resolve.groups()
                    files = hub._files("dataset" if datasets else "model", repo_id) or {}
                    name = urllib.parse.unquote(file_path)
                    if name in files:
                        data = files[name]
                        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
                        if with_body:
                            hub.fetched.append((urllib.parse.unquote(repo_id), name))
                        self._send(200, data, headers, with_body)
                        return
                    self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, with_body)
                    return
                hub.unknown.append(f"{self.command} {self.path}")
                self._send(404, b"", {}, with_body)

            def do_GET(self) -> None:
                self._answer(with_body=True)

            def do_HEAD(self) -> None:
                self._answer(with_body=False)

        return Handler
