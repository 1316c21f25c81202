"""A Hugging Face Hub for tests, put in place of huggingface_hub's API and download
functions (no network here), and a record of every call a request made to it and to the
readers that would download or read what a config names (`datasets.load_dataset`,
`AutoConfig.from_pretrained`).

    hub = FakeHub(monkeypatch, tmp_path)
    hub.model("acme/tiny", {"config.json": b"{...}", "model.safetensors": 10 * 2**30})
    hub.dataset("acme/sums", {"train.jsonl": b"..."}, card={"dataset_info": {...}})
    hub.fail = hub.http_error(503)        # every Hub call now fails so
    assert hub.downloads == []            # no data file or weight was fetched

A file is given as bytes (its content) or an int (a size only: a file a test must never
fetch, e.g. weights; fetching it fails the test).
"""

from __future__ import annotations

import fnmatch
import os
from types import SimpleNamespace
from typing import Any


class FakeHub:
    def __init__(self, monkeypatch, tmp_path) -> None:
        import datasets
        import huggingface_hub
        import transformers

        monkeypatch.setattr("workers.core.hub._info_cache", {})  # what a test's Hub says is kept for that test only

        self.root = tmp_path / "fake-hub"
        self.repos: dict[tuple[str, str], dict[str, Any]] = {}
        self.cards: dict[str, dict] = {}
        self.parquet: dict[str, list[Any]] = {}
        self.calls: list[tuple[str, str]] = []  # (what, repo id) of every Hub call
        self.downloads: list[tuple[str, str]] = []  # (repo id, file) of every file fetched
        self.load_dataset_calls: list[Any] = []
        self.autoconfig_calls: list[Any] = []
        self.fail: BaseException | None = None

        def model_info(api, repo_id, **kw):
            return self._info("model", repo_id)

        def dataset_info(api, repo_id, **kw):
            return self._info("dataset", repo_id)

        def list_dataset_parquet_files(api, repo_id, **kw):
            self._call("parquet", repo_id)
            if repo_id not in self.parquet:
                raise self.http_error(404)
            return self.parquet[repo_id]

        monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
        monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
        monkeypatch.setattr(huggingface_hub.HfApi, "list_dataset_parquet_files", list_dataset_parquet_files)
        monkeypatch.setattr(huggingface_hub, "snapshot_download", self._snapshot_download)
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", self._hf_hub_download)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        hub = self

        class FileSystem:  # HfFileSystem, for the footer of a Parquet conversion's file
            def open(self, path, **kw):
                repo_id = path.split("/", 1)[1].split("@", 1)[0]
                hub._call("read_parquet_footer", repo_id)
                return open(hub.parquet_paths[path], "rb")

        self.parquet_paths: dict[str, str] = {}
        monkeypatch.setattr(huggingface_hub, "HfFileSystem", FileSystem)

        real_load, real_config = datasets.load_dataset, transformers.AutoConfig.from_pretrained

        def load_dataset(*args, **kw):
            self.load_dataset_calls.append(args[0] if args else kw.get("path"))
            return real_load(*args, **kw)

        def from_pretrained(*args, **kw):
            self.autoconfig_calls.append(args[0] if args else kw.get("pretrained_model_name_or_path"))
            return real_config(*args, **kw)

        monkeypatch.setattr(datasets, "load_dataset", load_dataset)
        monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)

    # -- what the Hub holds ---------------------------------------------------------------

    def model(self, repo_id: str, files: dict[str, bytes | int]) -> None:
        self.repos[("model", repo_id)] = files

    def dataset(self, repo_id: str, files: dict[str, bytes | int], card: dict | None = None) -> None:
        self.repos[("dataset", repo_id)] = files
        self.cards[repo_id] = card or {}

    def parquet_conversion(self, repo_id: str, split: str, local_parquet: str) -> None:
        """The dataset viewer's Parquet conversion of `repo_id`: one file for `split`."""
        rest = f"refs%2Fconvert%2Fparquet/default/{split}/0000.parquet"
        url = f"https://huggingface.co/datasets/{repo_id}/resolve/{rest}"
        entry = SimpleNamespace(config="default", split=split, url=url, size=os.path.getsize(local_parquet))
        self.parquet.setdefault(repo_id, []).append(entry)
        self.parquet_paths[f"datasets/{repo_id}@{rest}"] = local_parquet

    @staticmethod
    def http_error(status: int) -> BaseException:
        import httpx2
        from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

        response = httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/api/x"))
        kind = RepositoryNotFoundError if status == 404 else HfHubHTTPError
        return kind(f"{status} error", response=response)

    # -- the API ----------------------------------------------------------------------

    def _call(self, what: str, repo_id: str) -> None:
        self.calls.append((what, repo_id))
        if self.fail is not None:
            raise self.fail

    def _files(self, kind: str, repo_id: str) -> dict[str, bytes | int]:
        if (kind, repo_id) not in self.repos:
            raise self.http_error(404)
        return self.repos[(kind, repo_id)]

    def _info(self, kind: str, repo_id: str) -> SimpleNamespace:
        self._call(f"{kind}_info", repo_id)
        files = self._files(kind, repo_id)
        siblings = [
            SimpleNamespace(rfilename=name, size=len(data) if isinstance(data, bytes) else data)
            for name, data in files.items()
        ]
        card = self.cards.get(repo_id)
        card_data = SimpleNamespace(to_dict=lambda: dict(card)) if card is not None else None
        return SimpleNamespace(id=repo_id, sha="0" * 40, siblings=siblings, card_data=card_data)

    def _fetch(self, kind: str, repo_id: str, name: str) -> str:
        data = self._files(kind, repo_id)[name]
        if not isinstance(data, bytes):
            raise AssertionError(f"{repo_id}/{name} was fetched: a file no check may download")
        self.downloads.append((repo_id, name))
        path = self.root / kind / repo_id / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return str(path)

    def _snapshot_download(self, repo_id, *, repo_type=None, allow_patterns=None, **kw) -> str:
        kind = repo_type or "model"
        self._call("snapshot_download", repo_id)
        for name in self._files(kind, repo_id):
            if allow_patterns is None or any(fnmatch.fnmatch(name, p) for p in allow_patterns):
                self._fetch(kind, repo_id, name)
        directory = self.root / kind / repo_id
        directory.mkdir(parents=True, exist_ok=True)
        return str(directory)

    def _hf_hub_download(self, repo_id, filename, *, repo_type=None, **kw) -> str:
        self._call("hf_hub_download", repo_id)
        return self._fetch(repo_type or "model", repo_id, filename)


def tiny_model_files(directory: str) -> dict[str, bytes | int]:
    """The files of a model directory as a Hub repository holds them, its weights given
    by size only (a check that fetches them fails)."""
    files: dict[str, bytes | int] = {}
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            weights = name.endswith((".safetensors", ".bin"))
            files[name] = os.path.getsize(path) if weights else open(path, "rb").read()
    return files
