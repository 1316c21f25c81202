"""Confinement of config paths (workers/paths.py): resolved as the OS follows them, then
required under an allowed root; each refusal names the field and the setting."""

from __future__ import annotations

import os

import pytest

from workers.config import RunConfig
from workers.paths import Confinement, PathNotAllowed, confine, make_scratch, remove_scratch
from workers.tiny_hf import make_tiny_checkpoint


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "root" / "inside").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "root-sibling").mkdir()
    return tmp_path


def test_a_path_inside_its_root_resolves(tree):
    assert confine(str(tree / "root" / "inside"), [str(tree / "root")], "f", "S") == str(tree / "root" / "inside")
    assert confine(str(tree / "root"), [str(tree / "root")], "f", "S") == str(tree / "root")


@pytest.mark.parametrize("escape", ["root/../outside", "root-sibling", "outside", "link"])
def test_no_path_escapes_its_root(tree, escape):
    (tree / "root" / "link").symlink_to(tree / "outside")
    path = str(tree / "root" / "link") if escape == "link" else str(tree / escape)
    with pytest.raises(PathNotAllowed) as refused:
        confine(path, [str(tree / "root")], "model.path", "ROLLWAY_MODEL_ROOTS")
    assert refused.value.field == "model.path"
    assert "ROLLWAY_MODEL_ROOTS" in refused.value.message


def test_a_root_that_is_a_symlink_is_followed_too(tree):
    (tree / "alias").symlink_to(tree / "root")
    assert confine(str(tree / "root" / "inside"), [str(tree / "alias")], "f", "S") == str(tree / "root" / "inside")


def test_no_roots_allow_nothing(tree):
    with pytest.raises(PathNotAllowed, match="ROLLWAY_SYNC_ROOTS is empty"):
        confine(str(tree / "root"), [], "sync.directory", "ROLLWAY_SYNC_ROOTS")


def test_a_config_is_checked_field_by_field(tree):
    make_tiny_checkpoint(str(tree / "root" / "inside"), "llama")  # a model directory a run can use
    box = Confinement.from_lists([str(tree / "root")], [], str(tree / "scratch"))
    fine = RunConfig.model_validate({"model": {"source": "path", "path": str(tree / "root" / "inside")}})
    assert box.errors(fine) == {}
    hostile = RunConfig.model_validate(
        {
            "model": {"source": "path", "path": str(tree / "outside")},
            "sync": {"protocol": "filesystem", "directory": str(tree / "root")},
        }
    )
    assert set(box.errors(hostile)) == {"model.path", "sync.directory"}
    with pytest.raises(PathNotAllowed):
        box.check(hostile)
    assert box.errors(RunConfig()) == {}  # the tiny model names no path


def test_a_run_scratch_is_made_and_removed_whole(tree):
    box = Confinement(scratch_root=str(tree / "scratch"))
    path = make_scratch(box.scratch_dir(7))
    assert path == str(tree / "scratch" / "run-7") and os.stat(path).st_mode & 0o777 == 0o700
    (tree / "scratch" / "run-7" / "sync" / "v1").mkdir(parents=True)
    assert remove_scratch(path) and not os.path.exists(path)
    assert not remove_scratch(path)
