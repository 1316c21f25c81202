"""Confinement of config paths (workers/run/paths.py): resolved as the OS follows them, then
required under an allowed root; each refusal names the field and the setting."""

from __future__ import annotations

import os

import pytest

from workers.config.run_config import RunConfig
from workers.model.tiny_hf import make_tiny_checkpoint
from workers.run.paths import Confinement, PathNotAllowed, confine, make_scratch, remove_scratch


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


def test_a_refusal_says_the_same_of_a_path_that_exists_and_one_that_does_not(tree):
    (tree / "outside" / "link").symlink_to(tree / "root-sibling")
    said = {}
    for name in ("outside", "nowhere", "outside/link"):
        with pytest.raises(PathNotAllowed) as refused:
            confine(str(tree / name), [str(tree / "root")], "model.path", "ROLLWAY_MODEL_ROOTS")
        said[name] = refused.value.message.replace(str(tree / name), "<path>")
    assert said["outside"] == said["nowhere"] == said["outside/link"]
    assert str(tree / "root-sibling") not in said["outside/link"]  # where a symlink leads is not told


def test_a_relative_path_is_refused_whatever_the_working_directory_holds(tree, monkeypatch):
    monkeypatch.chdir(tree)
    with pytest.raises(PathNotAllowed) as refused:
        confine("root/inside", [str(tree / "root")], "task.dataset.eval_path", "ROLLWAY_DATA_ROOTS")
    assert refused.value.message.startswith("'root/inside' is not an absolute path")


def test_a_reward_model_and_a_sync_directory_go_through_the_same_confinement(tree):
    box = Confinement.from_lists([str(tree / "root")], [str(tree / "root")], str(tree / "scratch"))
    cfg = RunConfig.model_validate(
        {
            "rewards": {"workers": 1, "scorer": "model", "model_path": str(tree / "outside")},
            "sync": {"protocol": "filesystem", "directory": str(tree / "outside")},
        }
    )
    errors = box.errors(cfg)
    assert set(errors) == {"rewards.model_path", "sync.directory"}
    assert "outside the allowed roots (ROLLWAY_MODEL_ROOTS" in errors["rewards.model_path"]
    make_tiny_checkpoint(str(tree / "root" / "inside"), "llama")
    fine = cfg.model_copy(
        update={"rewards": cfg.rewards.model_copy(update={"model_path": str(tree / "root" / "inside")})}
    )
    assert "rewards.model_path" not in box.errors(fine)


def test_the_hub_owners_allowlist_names_the_field_and_the_setting():
    from workers.core.hub import owner_problem

    assert owner_problem("acme/x", (), "model.hub_id") is None  # empty: any owner
    assert owner_problem("ACME/x", ("acme",), "model.hub_id") is None
    problem = owner_problem("evil/x", ("acme", "Qwen"), "model.hub_id")
    assert problem is not None and "ROLLWAY_HUB_OWNERS=acme,Qwen" in problem and "'evil'" in problem


def test_a_hub_model_whose_metadata_file_is_too_large_is_refused_without_fetching_it(monkeypatch, tmp_path):
    from tests.fake_hub import FakeHub
    from workers.core.hub import METADATA_MAX_BYTES
    from workers.model.loading import hub_problem

    hub = FakeHub(monkeypatch, tmp_path)
    hub.model("acme/huge", {"config.json": b"{}", "tokenizer.json": METADATA_MAX_BYTES + 1, "model.safetensors": 9})
    problem = hub_problem("acme/huge")
    assert problem is not None and "tokenizer.json" in problem and "model.source='path'" in problem
    assert hub.downloads == []


def test_a_hub_reward_model_is_loaded_from_the_hub_never_a_local_directory_of_that_name(tmp_path, monkeypatch):
    from tests.fake_hub import FakeHub
    from workers.rollout.prm import load_reward_model

    make_tiny_checkpoint(str(tmp_path / "rm"), "llama")
    hub = FakeHub(monkeypatch, tmp_path)
    hub.model("acme/rm", {p.name: p.read_bytes() for p in (tmp_path / "rm").iterdir() if p.is_file()})
    decoy = tmp_path / "cwd" / "acme" / "rm"
    decoy.mkdir(parents=True)
    (decoy / "config.json").write_text("not a config")
    monkeypatch.chdir(tmp_path / "cwd")
    model, _ = load_reward_model("acme/rm")
    assert model.config.num_hidden_layers >= 1
    assert ("snapshot_download", "acme/rm") in hub.calls
    assert all(not str(p).startswith("acme/") for p in hub.autoconfig_calls)


def test_a_refused_model_is_never_read_to_check_the_dataset_against_it(tree, monkeypatch):
    """The dataset's rows are checked with the model's tokenizer and against the split it
    was trained on: with the model outside its roots, neither is read."""
    import workers.run.paths as paths

    read: list[str] = []
    monkeypatch.setattr(paths, "dataset_errors", lambda cfg: read.append(cfg.model.path) or {})
    (tree / "root" / "data.jsonl").write_text('{"prompt": "a", "answer": "a"}\n')
    box = Confinement.from_lists([str(tree / "root")], [], str(tree / "scratch"), data_roots=[str(tree / "root")])
    dataset = {"path": str(tree / "root" / "data.jsonl")}
    refused = RunConfig.model_validate(
        {"model": {"source": "path", "path": str(tree / "outside")}, "task": {"dataset": dataset}}
    )
    assert set(box.errors(refused)) == {"model.path"} and read == []
    make_tiny_checkpoint(str(tree / "root" / "inside"), "llama")
    allowed = refused.model_copy(
        update={"model": refused.model.model_copy(update={"path": str(tree / "root" / "inside")})}
    )
    assert box.errors(allowed) == {} and read == [str(tree / "root" / "inside")]
