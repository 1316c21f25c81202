"""task.dataset beyond one file: a save_to_disk directory, a directory of data files, a
Hub dataset id (a stand-in Hub here: checked at launch by its metadata only, read by a
worker within the operator's bounds), splits by name, and conversational prompts
rendered by the chat template."""

from __future__ import annotations

import json

import pytest

from tests.fake_hub import FakeHub
from workers.config.run_config import RunConfig, TaskConfig
from workers.core import chat
from workers.model.tiny_hf import train_tokenizer
from workers.model.tokenizer import HFTokenizer, load_tokenizer
from workers.rollout.task_data import DatasetError, dataset_errors, is_hub_id, load_splits
from workers.run.paths import Confinement, PathNotAllowed

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


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


SUMS_CARD = {
    "dataset_info": {
        "features": [{"name": "prompt", "dtype": "string"}, {"name": "answer", "dtype": "string"}],
        "splits": [{"name": "train", "num_examples": len(TRAIN)}, {"name": "test", "num_examples": len(TEST)}],
    }
}


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A Hub holding `acme/sums` (train and test files, a card declaring its columns),
    and a working directory holding a local `acme/sums` of other rows."""
    hub = FakeHub(monkeypatch, tmp_path)
    hub.dataset(
        "acme/sums",
        {"README.md": b"", "data/train.jsonl": jsonl(TRAIN), "data/test.jsonl": jsonl(TEST)},
        card=SUMS_CARD,
    )
    decoy = tmp_path / "cwd" / "acme" / "sums"
    decoy.mkdir(parents=True)
    write_jsonl(decoy / "train.jsonl", [{"prompt": "local=", "answer": "local"}])
    monkeypatch.chdir(tmp_path / "cwd")
    return hub


# A dataset of two configurations, as openai/gsm8k ships "main" and "socratic": its README
# says which files each configuration reads, as `load_dataset(path, name)` takes it.
TWO_CONFIGS_README = b"""---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train.jsonl
  - split: test
    path: main/test.jsonl
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train.jsonl
---
"""
SOCRATIC = [{"prompt": f"why {r['prompt']}", "answer": r["answer"]} for r in TRAIN]
TWO_CONFIGS_FILES = {
    "README.md": TWO_CONFIGS_README,
    "main/train.jsonl": jsonl(TRAIN),
    "main/test.jsonl": jsonl(TEST),
    "socratic/train.jsonl": jsonl(SOCRATIC),
}
TWO_CONFIGS_CARD = {
    "configs": [{"config_name": "main"}, {"config_name": "socratic"}],
    "dataset_info": [
        {"config_name": "main", **SUMS_CARD["dataset_info"]},
        {"config_name": "socratic", **SUMS_CARD["dataset_info"]},
    ],
}


def test_task_dataset_subset_picks_the_configuration_of_a_hub_dataset_as_load_dataset_name(hub):
    hub.dataset("acme/gsm", TWO_CONFIGS_FILES, card=TWO_CONFIGS_CARD)
    main = load_splits(config("acme/gsm", subset="main", eval_fraction=0, eval_split="test"))
    assert set(main.train) == pairs(TRAIN) and set(main.eval) == pairs(TEST)
    socratic = load_splits(config("acme/gsm", subset="socratic", eval_fraction=0.25))
    assert set(socratic.train) | set(socratic.eval) == pairs(SOCRATIC)

    # The launch check reads the card only, and names the field and the configurations.
    downloads = list(hub.downloads)
    assert Confinement().errors(config("acme/gsm", subset="main")) == {}
    errors = Confinement().errors(config("acme/gsm", subset="mian"))
    assert errors == {
        "task.dataset.subset": "'acme/gsm' has no configuration 'mian'; its configurations are main, socratic"
    }
    assert hub.downloads == downloads
    # A worker reading a configuration the card did not declare names the field too.
    hub.dataset("acme/gsm-nocard", TWO_CONFIGS_FILES)
    with pytest.raises(DatasetError) as info:
        load_splits(config("acme/gsm-nocard", subset="mian"))
    assert info.value.field == "task.dataset.subset" and "'mian'" in info.value.message


def test_task_dataset_subset_reads_a_directory_of_configurations_and_is_refused_for_one_file(tmp_path):
    directory = tmp_path / "gsm"
    for name, content in TWO_CONFIGS_FILES.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(content)
    splits = load_splits(config(str(directory), subset="socratic", eval_fraction=0.25))
    assert set(splits.train) | set(splits.eval) == pairs(SOCRATIC)
    path = write_jsonl(tmp_path / "rows.jsonl", TRAIN)
    with pytest.raises(DatasetError) as info:
        load_splits(config(path, subset="main"))
    assert info.value.field == "task.dataset.subset" and "leave it null" in info.value.message


def test_a_worker_reads_a_hub_dataset_from_the_hub_never_a_local_directory_of_that_name(hub):
    assert is_hub_id("acme/sums") and not is_hub_id("acme/sums.jsonl") and not is_hub_id("/data/acme/sums")
    cfg = config("acme/sums", eval_fraction=0, eval_split="test")
    splits = load_splits(cfg)
    assert set(splits.train) == pairs(TRAIN) and set(splits.eval) == pairs(TEST)
    assert ("acme/sums", "data/train.jsonl") in hub.downloads


def test_a_launch_check_of_a_hub_dataset_reads_its_metadata_only(hub):
    cfg = config("acme/sums", eval_fraction=0, eval_split="test")
    # No local path to confine: the data roots do not apply, and the check passes.
    assert Confinement(data_roots=()).errors(cfg) == {}
    assert hub.downloads == [] and hub.load_dataset_calls == []
    assert [what for what, _ in hub.calls] == ["dataset_info"]


def test_a_launch_check_refuses_a_column_or_split_the_hub_dataset_card_lacks(hub):
    errors = Confinement().errors(config("acme/sums", prompt_column="question"))
    assert "no column 'question'" in errors["task.dataset.prompt_column"]
    errors = Confinement().errors(config("acme/sums", eval_fraction=0, eval_split="validation"))
    assert errors == {"task.dataset.eval_split": "'acme/sums' has no split 'validation'; its splits are train, test"}
    assert hub.downloads == [] and hub.load_dataset_calls == []


def test_without_a_card_the_columns_come_from_the_parquet_conversions_schema(hub, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    hub.dataset("acme/plain", {"data/train.parquet": 10**12})  # a file no check may fetch
    parquet = str(tmp_path / "conv.parquet")
    pq.write_table(pa.table({"question": ["1+1="], "answer": ["2"]}), parquet)
    hub.parquet_conversion("acme/plain", "train", parquet)
    errors = Confinement().errors(config("acme/plain"))
    assert "no column 'prompt'; its columns are question, answer" in errors["task.dataset.prompt_column"]
    assert Confinement().errors(config("acme/plain", prompt_column="question")) == {}
    assert hub.downloads == [] and hub.load_dataset_calls == []


def test_an_unknown_hub_dataset_is_refused_at_launch_naming_the_field(hub):
    errors = Confinement(data_roots=()).errors(config("acme/no-such-set"))
    assert errors == {
        "task.dataset.path": "there is no dataset 'acme/no-such-set' on the Hugging Face Hub (or it is private)"
    }


def test_a_hub_dataset_is_refused_on_an_offline_site_with_a_way_out(hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    message = Confinement().errors(config("acme/sums"))["task.dataset.path"]
    assert "offline" in message and hub.calls == []


def test_a_worker_keeps_the_first_rows_up_to_the_operators_bound(hub, monkeypatch):
    monkeypatch.setenv("ROLLWAY_HUB_DATASET_MAX_ROWS", "5")
    assert len(load_splits(config("acme/sums")).train) == 5


def test_a_worker_refuses_a_hub_dataset_larger_than_the_operators_bound_before_fetching_it(hub, monkeypatch):
    monkeypatch.setenv("ROLLWAY_HUB_DATASET_MAX_BYTES", "100")
    with pytest.raises(DatasetError) as info:
        load_splits(config("acme/sums"))
    assert info.value.field == "task.dataset.path" and "ROLLWAY_HUB_DATASET_MAX_BYTES=100" in info.value.message
    assert hub.downloads == []


def test_a_worker_stops_downloading_a_hub_dataset_past_the_operators_time_bound(hub, monkeypatch):
    from workers.core import hub as hub_module

    monkeypatch.setenv("ROLLWAY_HUB_DATASET_TIMEOUT_S", "60")
    clock = iter([0.0, 0.0, 61.0, 61.0])  # the deadline is set, the card is fetched, then time is up
    monkeypatch.setattr(hub_module, "clock", lambda: next(clock))
    with pytest.raises(DatasetError) as info:
        load_splits(config("acme/sums"))
    assert "ROLLWAY_HUB_DATASET_TIMEOUT_S=60" in info.value.message
    assert hub.downloads == [("acme/sums", "README.md")]


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

    from workers.inference.backends import make_backend
    from workers.model.tiny_hf import make_tiny_checkpoint
    from workers.rl_tasks import make_task
    from workers.rollout.generation import generate_groups
    from workers.run.runnable import check_runnable
    from workers.train.batch_stats import batch_metrics

    module = types.ModuleType("my_chat_rewards")
    module.completion_length = completion_length
    monkeypatch.setitem(sys.modules, "my_chat_rewards", module)
    monkeypatch.setenv("ROLLWAY_TASK_MODULES", "my_chat_rewards")
    qwen = make_tiny_checkpoint(str(tmp_path / "qwen2"), "qwen2")
    cfg = RunConfig.model_validate(
        {
            "model": {"source": "path", "path": qwen},
            "task": {
                "name": "dataset",  # the rows and the function, nothing else
                "dataset": {"path": write_jsonl(tmp_path / "chat.jsonl", CONVERSATIONS), "eval_fraction": 0},
                "reward_funcs": ["my_chat_rewards:completion_length"],
            },
            "inference": {"max_new_tokens": 6},
            "trainer": {"batch_groups": 2, "group_size": 2},
        }
    )
    assert dataset_errors(cfg) == {} and check_runnable(cfg) is cfg
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


def test_the_drivers_check_reads_the_rows_a_launch_check_could_not_see(hub):
    hub.dataset("acme/blank", {"README.md": b"", "train.jsonl": jsonl([{"prompt": "", "answer": "1"}])}, card=SUMS_CARD)
    cfg = config("acme/blank")
    assert Confinement().errors(cfg) == {} and hub.downloads == []  # the card declares the columns
    with pytest.raises(PathNotAllowed) as refused:
        Confinement().check(cfg)  # the driver's check, within the Hub bounds
    assert refused.value.field == "task.dataset.path" and "row 0: the prompt is empty" in refused.value.message
    assert ("acme/blank", "train.jsonl") in hub.downloads
