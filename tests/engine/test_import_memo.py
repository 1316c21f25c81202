"""transformers' import-time answers kept on disk (workers/core/import_memo.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.core import import_memo

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "rollway" / "imports"


def package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def counting(answer):
    calls: list[tuple] = []

    def fn(*args):
        calls.append(args)
        return answer(*args)

    return fn, calls


def test_an_answer_is_worked_out_once_then_read_by_the_next_process(cache, tmp_path):
    pkg = package(tmp_path / "pkg", {"a.py": "x = 1", "sub/b.py": "y = 2"})
    fn, calls = counting(lambda path, prefix=None: {"files": sorted(os.listdir(path))})
    first = import_memo._Memo(fn, "t", import_memo._tree_key)
    assert first(str(pkg)) == {"files": ["a.py", "sub"]}
    assert first(str(pkg)) == {"files": ["a.py", "sub"]}  # this process's own
    assert len(calls) == 1 and len(list(cache.glob("t-*.json"))) == 1
    # Another process (a memo of its own) reads the file instead of working it out.
    assert import_memo._Memo(fn, "t", import_memo._tree_key)(str(pkg)) == {"files": ["a.py", "sub"]}
    assert len(calls) == 1


def test_a_changed_file_or_a_new_one_is_a_new_key(cache, tmp_path):
    pkg = package(tmp_path / "pkg", {"a.py": "x = 1"})
    fn, calls = counting(lambda path: len(calls))

    def in_a_new_process(path: Path) -> int:
        import_memo._python_files.cache_clear()  # a process walks a folder once
        return import_memo._Memo(fn, "t", import_memo._tree_key)(str(path))

    assert in_a_new_process(pkg) == 1
    (pkg / "a.py").write_text("x = 12")  # another size
    assert in_a_new_process(pkg) == 2
    (pkg / "c.py").write_text("")
    assert in_a_new_process(pkg / "a.py") == 3  # a file names its folder
    (pkg / "notes.txt").write_text("not read by it")
    assert in_a_new_process(pkg) == 3
    (pkg / "d.py").write_text("")
    assert import_memo._Memo(fn, "t", import_memo._tree_key)(str(pkg)) == 3  # this process walked it already


def test_a_newly_installed_distribution_is_a_new_key(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "a-1.0.dist-info").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(site), str(tmp_path / "gone")])
    before = import_memo._installed_key()
    (site / "b-2.0.dist-info").mkdir()
    assert import_memo._installed_key() != before
    assert import_memo._installed_key()[1].endswith(":")  # an entry that is gone holds nothing


def test_an_unreadable_file_is_worked_out_again_and_replaced(cache, tmp_path):
    fn, calls = counting(lambda: {"a": ["b"]})
    import_memo._Memo(fn, "t", lambda: ["k"])()
    [kept] = cache.glob("t-*.json")
    kept.write_text("{not json")
    assert import_memo._Memo(fn, "t", lambda: ["k"])() == {"a": ["b"]}
    assert len(calls) == 2 and json.loads(kept.read_text()) == {"a": ["b"]}


def test_a_file_of_another_shape_is_worked_out_again(cache):
    fn, calls = counting(lambda: {"torch": ["torch"]})

    def packages():  # a new process's memo
        return import_memo._Memo(fn, "packages", lambda: ["k"], decode=import_memo._decode_packages)()

    packages()
    [kept] = cache.glob("packages-*.json")
    for other in ("[]", '{"torch": "torch"}'):
        kept.write_text(other)
        assert packages() == {"torch": ["torch"]}
    (cache / kept.name.replace("packages", "s")).write_text('[["torch", []]]')  # the same key, another name
    structure = import_memo._Memo(fn, "s", lambda: ["k"], decode=import_memo._decode_structure)
    assert structure() == {"torch": ["torch"]}
    assert len(calls) == 4


def test_a_cache_that_cannot_be_written_still_answers(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # a file, not a folder
    fn, calls = counting(lambda: 7)
    assert import_memo._Memo(fn, "t", lambda: ["k"])() == 7
    assert import_memo._Memo(fn, "t", lambda: ["k"])() == 7 and len(calls) == 2


def test_an_import_structure_comes_back_as_transformers_built_it():
    structure = {frozenset({"torch"}): {"m.modeling": {"A", "B"}}, frozenset(): {"m.config": {"C"}}}
    encoded = json.loads(json.dumps(import_memo._encode_structure(structure)))
    assert import_memo._decode_structure(encoded) == structure


@pytest.mark.slow  # two fresh processes importing transformers
def test_transformers_reads_both_answers_from_the_cache_and_they_are_its_own(tmp_path):
    """A fresh process (as a Ray worker starts) keeps both answers; the next reads them
    back; each equals what transformers and the standard library work out without it."""
    script = """
import importlib.metadata, json, sys
from workers.core.worker_process import setup
setup()
from transformers import AutoModelForCausalLM
from transformers.utils import import_utils
import transformers.models
memo = import_utils.define_import_structure
models = transformers.models.__file__
assert isinstance(memo, type(importlib.metadata.packages_distributions)), memo
packages = importlib.metadata.packages_distributions
answers = {
    "worked out": [packages.worked_out, memo.worked_out],
    "packages": packages() == packages.__wrapped__(),
    "structure": memo(models) == memo.__wrapped__.__wrapped__(models),  # under transformers' lru_cache
}
print(json.dumps(answers))
"""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    kept = tmp_path / "xdg" / "rollway" / "imports"
    seen = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        seen.append(json.loads(done.stdout.splitlines()[-1]))
    first, second = seen
    assert first["packages"] and first["structure"] and second["packages"] and second["structure"]
    assert first["worked out"][0] == 1 and first["worked out"][1] >= 2  # the models' table, twice, and each model's
    assert second["worked out"] == [0, 0]
    assert list(kept.glob("packages-*.json")) and len(list(kept.glob("transformers-structure-*.json"))) >= 2
