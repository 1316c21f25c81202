"""task.dataset beyond one file: a save_to_disk directory, a directory of data files, a
Hub dataset id (read here from the datasets cache, offline), splits by name, and
conversational prompts rendered by the chat template."""

from __future__ import annotations

import glob
import json
import os
import shutil

import pytest

from workers import chat
from workers.config import RunConfig, TaskConfig
from workers.paths import Confinement
from workers.task_data import DatasetError, dataset_errors, is_hub_id, load_splits
from workers.tiny_hf import train_tokenizer
from workers.tokenizer import HFTokenizer, load_tokenizer

TRAIN = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(1, 5) for b in range(1, 4)]
TEST = [{"prompt": f"{a}*{b}=", "answer": str(a * b)} for a in range(1, 3) for b in range(1, 3)]


def config(path: str, model: dict | None = None, **dataset) -> RunConfig:
    return RunConfig.model_validate(
        {
            "model": model or {},
            "task": {"name": "copy", "dataset": {"path": path, **dataset}},
            "inference": {"max_new_tokens": 6},
        }
    )


def pairs(rows) -> set[tuple[str, str]]:
    return {(r["prompt"], r["answer"]) for r in rows}


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_a_saved_dataset_directory_gives_its_splits_by_name(tmp_path):
    import datasets

    directory = str(tmp_path / "saved")
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(TRAIN), "test": datasets.Dataset.from_list(TEST)}
    ).save_to_disk(directory)
    splits = load_splits(config(directory, eval_fraction=0, eval_split="test"))
    assert set(splits.train) == pairs(TRAIN) and set(splits.eval) == pairs(TEST)
    with pytest.raises(DatasetError) as info:
        load_splits(config(directory, split="validation"))
    assert info.value.field == "task.dataset.split" and "its splits are train, test" in info.value.message


def test_a_directory_of_files_is_split_by_their_names(tmp_path):
    directory = tmp_path / "files"
    directory.mkdir()
    write_jsonl(directory / "train.jsonl", TRAIN)
    write_jsonl(directory / "test.jsonl", TEST)
    splits = load_splits(config(str(directory), eval_fraction=0, eval_split="test"))
    assert set(splits.train) == pairs(TRAIN) and set(splits.eval) == pairs(TEST)
    with pytest.raises(DatasetError) as info:
        load_splits(config(str(directory), eval_fraction=0, eval_split="validation"))
    assert info.value.field == "task.dataset.eval_split"


def test_one_file_is_the_split_train(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", TRAIN)
    with pytest.raises(DatasetError) as info:
        load_splits(config(path, split="test"))
    assert info.value.field == "task.dataset.split" and "set it to 'train'" in info.value.message


@pytest.fixture
def offline_hub_cache(tmp_path, monkeypatch):
    """An offline site whose datasets cache holds `acme/sums` (train and test), as a
    download by `datasets.load_dataset` leaves it: the Arrow files of each split under
    <cache>/acme___sums/<config>/<version>/<hash>/, named after the dataset."""
    import datasets

    files = tmp_path / "source"
    files.mkdir()
    data_files = {"train": write_jsonl(files / "train.jsonl", TRAIN), "test": write_jsonl(files / "test.jsonl", TEST)}
    build = str(tmp_path / "build")
    datasets.load_dataset("json", data_files=data_files, cache_dir=build)
    (built,) = [d for d in glob.glob(os.path.join(build, "json", "*", "*", "*")) if os.path.isdir(d)]
    cache = tmp_path / "datasets-cache"
    target = cache / "acme___sums" / "default" / "0.0.0" / "0"
    shutil.copytree(built, target)
    for arrow in target.glob("json-*.arrow"):
        arrow.rename(target / arrow.name.replace("json-", "sums-", 1))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return str(cache)


def test_a_hub_dataset_id_loads_through_datasets_from_its_cache(offline_hub_cache):
    assert is_hub_id("acme/sums") and not is_hub_id("acme/sums.jsonl") and not is_hub_id("/data/acme/sums")
    cfg = config("acme/sums", eval_fraction=0, eval_split="test")
    splits = load_splits(cfg)
    assert set(splits.train) == pairs(TRAIN) and set(splits.eval) == pairs(TEST)
    # No local path to confine: the data roots do not apply, and the check passes.
    assert Confinement(data_roots=()).errors(cfg) == {}


def test_an_unknown_hub_dataset_is_refused_at_launch_naming_the_field(offline_hub_cache):
    errors = Confinement(data_roots=()).errors(config("acme/no-such-set"))
    message = errors["task.dataset.path"]
    assert "'acme/no-such-set'" in message and "offline" in message and "save_to_disk" in message
    assert list(errors) == ["task.dataset.path"]


# --- conversational prompts ------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_tokenizer_dir(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp("chat-tokenizer"))
    train_tokenizer(TaskConfig(), chat=True).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def plain_tokenizer_dir(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp("plain-tokenizer"))
    train_tokenizer(TaskConfig(), chat=False).save_pretrained(directory)
    return directory


CONVERSATIONS = [
    {
        "prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"{a}+1="}],
        "answer": str(a + 1),
    }
    for a in range(6)
]


def test_conversational_prompts_render_through_the_chat_template(tmp_path, chat_tokenizer_dir):
    path = write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS)
    cfg = config(path, {"source": "path", "path": chat_tokenizer_dir}, eval_fraction=0)
    prompt, answer = sorted(load_splits(cfg).train)[0]
    messages = chat.messages_of(prompt)
    assert messages == CONVERSATIONS[0]["prompt"] and answer == "1"
    tokenizer = load_tokenizer(chat_tokenizer_dir)
    assert isinstance(tokenizer, HFTokenizer)
    want = tokenizer.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tokenizer.prompt_ids(prompt) == list(want)
    assert "be brief" in tokenizer.hf.decode(tokenizer.prompt_ids(prompt))
    assert dataset_errors(cfg) == {}
    # A text prompt is not taken for messages.
    assert chat.messages_of("[1, 2]") is None and chat.messages_of("2+2=") is None


def test_a_messages_column_is_the_prompt_without_its_last_assistant_turn(tmp_path, chat_tokenizer_dir):
    rows = [
        {
            "messages": [{"role": "user", "content": f"{a}+1="}, {"role": "assistant", "content": str(a + 1)}],
            "answer": "x",
        }
        for a in range(3)
    ]
    cfg = config(
        write_jsonl(tmp_path / "m.jsonl", rows), {"source": "path", "path": chat_tokenizer_dir}, eval_fraction=0
    )
    assert {chat.messages_of(p)[-1]["role"] for p, _ in load_splits(cfg).train} == {"user"}


def test_conversational_data_without_a_chat_template_is_refused_at_launch(tmp_path, plain_tokenizer_dir):
    path = write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS)
    errors = dataset_errors(config(path, {"source": "path", "path": plain_tokenizer_dir}, eval_fraction=0))
    assert "has no chat template" in errors["task.dataset.path"]
    tiny = dataset_errors(config(path, eval_fraction=0))
    assert "the tiny model has no chat template" in tiny["task.dataset.path"]
    with pytest.raises(ValueError, match="needs the model's chat template"):
        load_tokenizer(plain_tokenizer_dir).prompt_ids(chat.encode(CONVERSATIONS[0]["prompt"]))


def test_mixed_prompt_forms_are_refused(tmp_path, chat_tokenizer_dir):
    rows = [CONVERSATIONS[0], {"prompt": "1+1=", "answer": "2"}]
    with pytest.raises(DatasetError, match="some prompts are messages and some are text"):
        load_splits(config(write_jsonl(tmp_path / "mixed.jsonl", rows), {"source": "path", "path": chat_tokenizer_dir}))


COMPLETIONS_SEEN: list = []


def completion_length(prompts, completions, answer, **kwargs):
    COMPLETIONS_SEEN.append((prompts, completions, answer))
    return [float(len(c[0]["content"])) for c in completions]


def test_a_conversational_dataset_runs_through_a_real_chat_checkpoint(tmp_path, monkeypatch):
    """Rows of messages, a tiny Qwen2 checkpoint with its ChatML template, generation on
    the model's backend and a TRL-shaped reward function: the prompt ids are the
    template's rendering of the row's messages, and the function gets the prompts as
    messages and each completion as one assistant message."""
    import sys
    import types

    from workers.batch_stats import batch_metrics
    from workers.generation import generate_groups
    from workers.inference import make_backend
    from workers.rl_tasks import make_task
    from workers.tiny_hf import make_tiny_checkpoint

    module = types.ModuleType("my_chat_rewards")
    module.completion_length = completion_length
    monkeypatch.setitem(sys.modules, "my_chat_rewards", module)
    monkeypatch.setenv("ROLLWAY_TASK_MODULES", "my_chat_rewards")
    qwen = make_tiny_checkpoint(str(tmp_path / "qwen2"), "qwen2")
    cfg = RunConfig.model_validate(
        {
            "model": {"source": "path", "path": qwen},
            "task": {
                "name": "copy",
                "dataset": {"path": write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS), "eval_fraction": 0},
                "reward_funcs": ["my_chat_rewards:completion_length"],
            },
            "inference": {"max_new_tokens": 6},
            "trainer": {"batch_groups": 2, "group_size": 2},
        }
    )
    assert dataset_errors(cfg) == {}
    tokenizer, task = load_tokenizer(qwen), make_task(cfg.task)
    rows = load_splits(cfg).train[:2]
    groups = generate_groups(make_backend(cfg, qwen), task, tokenizer, rows, cfg, version=0, seed=0)
    for (prompt, _), g in zip(rows, groups, strict=True):
        messages = chat.messages_of(prompt)
        want = tokenizer.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        for r in g.rollouts:
            assert r.prompt_ids == list(want)
            assert r.reward == float(len(tokenizer.decode(r.completion_ids)))
            assert r.reward_parts == {"completion_length": r.reward}
    prompts, completions, answer = COMPLETIONS_SEEN[-1]
    assert chat.is_messages(prompts[0]) and prompts[0][0] == {"role": "system", "content": "be brief"}
    assert all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in completions)
    assert {"rewards/completion_length/mean", "rewards/completion_length/std"} <= set(batch_metrics(groups))
