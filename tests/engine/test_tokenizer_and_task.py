"""CharTokenizer round trips and the reverse task's rewards."""

from __future__ import annotations

import random

import pydantic
import pytest

from workers.config.run_config import RunConfig, TaskConfig
from workers.model.tokenizer import CharTokenizer
from workers.rl_tasks import make_task
from workers.run.runnable import check_runnable


def test_it_round_trips_text_and_keeps_special_ids_fixed():
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    ids = tok.encode("abc=cba")
    assert min(ids) >= 3
    assert tok.decode(ids) == "abc=cba"
    assert tok.vocab_size == 3 + len(tok.chars)


def test_decode_stops_at_eos_and_skips_pad_and_bos():
    tok = CharTokenizer()
    ids = [tok.bos_id, *tok.encode("ab"), tok.pad_id, *tok.encode("c"), tok.eos_id, *tok.encode("zz")]
    assert tok.decode(ids) == "abc"


def test_it_names_an_unknown_character():
    with pytest.raises(ValueError, match="'!'"):
        CharTokenizer().encode("ab!")


def test_save_and_load_give_the_same_vocabulary(tmp_path):
    CharTokenizer("xyz").save(str(tmp_path))
    loaded = CharTokenizer.load(str(tmp_path))
    assert loaded.chars == "xyz"
    assert loaded.encode("zyx") == [5, 4, 3]


def test_load_without_a_tokenizer_file_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="CharTokenizer"):
        CharTokenizer.load(str(tmp_path))


def test_reverse_task_samples_prompts_and_reversed_answers():
    task = make_task(TaskConfig(min_len=3, max_len=5, alphabet="abcd"))
    pairs = task.sample(50, random.Random(1))
    assert pairs == task.sample(50, random.Random(1))  # seeded
    for prompt, answer in pairs:
        assert prompt.endswith("=")
        assert answer == prompt[:-1][::-1]
        assert 3 <= len(answer) <= 5 and set(answer) <= set("abcd")


def test_copy_task_answers_the_string_itself_and_scores_as_reverse_does():
    cfg = TaskConfig(name="copy", min_len=3, max_len=5, alphabet="abcd", reward="position")
    task = make_task(cfg)
    pairs = task.sample(50, random.Random(1))
    # the same prompts as reverse draws from the same generator
    assert [p for p, _ in pairs] == [
        p for p, _ in make_task(TaskConfig(**(cfg.model_dump() | {"name": "reverse"}))).sample(50, random.Random(1))
    ]
    assert all(answer == prompt[:-1] for prompt, answer in pairs)
    assert task.reward("abxd", "abcd") == pytest.approx(3 / 4)


@pytest.mark.parametrize(
    ("mode", "completion", "answer", "expected"),
    [
        ("prefix", "cba", "cba", 1.0),
        ("prefix", "cbx", "cba", 2 / 3),
        ("prefix", "xba", "cba", 0.0),  # a wrong first character earns nothing after it
        ("prefix", "cbaa", "cba", 3 / 4),  # too long: divided by the longer length
        ("prefix", "cb", "cba", 2 / 3),  # too short
        ("prefix", "", "cba", 0.0),
        ("position", "xba", "cba", 2 / 3),
        ("position", "cbaxx", "cba", 3 / 5),
        ("exact", "cba", "cba", 1.0),
        ("exact", "cbaa", "cba", 0.0),
    ],
)
def test_reverse_reward(mode, completion, answer, expected):
    task = make_task(TaskConfig(reward=mode))
    assert task.reward(completion, answer) == pytest.approx(expected)


def test_config_errors_name_the_field_and_the_fix():
    with pytest.raises(
        pydantic.ValidationError, match=r"inference.max_new_tokens \(4\) must be ≥ task.max_len \+ 1 \(6\)"
    ):
        check_runnable(RunConfig.model_validate({"task": {"max_len": 5}, "inference": {"max_new_tokens": 4}}))
    with pytest.raises(pydantic.ValidationError, match="task.alphabet"):
        TaskConfig(alphabet="ab=")
    with pytest.raises(pydantic.ValidationError, match="max_position_embeddings"):
        check_runnable(RunConfig.model_validate({"model": {"max_position_embeddings": 8}}))
    with pytest.raises(pydantic.ValidationError, match="extra"):
        RunConfig.model_validate({"trainer": {"learning_rate": 1e-3}})
