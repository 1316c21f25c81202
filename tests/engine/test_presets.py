"""Presets and the override helpers that the launch form, the API and the benches share.

Fast: every preset validates, names its peer and keeps the sizes every preset shares.
Slow: presets that together use every engine switch value of every preset run four steps
through the real RunDriver on in-process Ray (torch backend, a small model), one Ray
session for all. These runs also carry what other modules would need a run of their own
for: a double buffer (slime, prime-rl) holds one batch and trains at most one version
behind, a finished LoRA run (trl-async-lora) exports its merged policy and its adapter,
which peft puts back on the exported base, and each update mode's partial-rollout
counters agree with it (drain's runs mix no versions and abort nothing: the drain case
of tests/engine/test_update_modes_in_runs.py, whose stepped modes force weights
mid-generation). Five of them are replayed from the schedule they recorded, which with
tests/engine/test_replay.py's replays covers every switch that shapes a schedule.
"""

import os
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from pydantic import ValidationError
from transformers import AutoModelForCausalLM

from tests.engine.helpers import run_config
from tests.engine.test_replay import CONFIG as REPLAYED
from tests.engine.test_replay import REQUEUE
from workers.config.presets import PEERS, PRESETS, UnknownPreset, build, deep_merge
from workers.config.run_config import RunConfig
from workers.core.merge import parse_sets
from workers.core.metric_names import TRAINED
from workers.model.loading import checkpoint_state_dict
from workers.model.tokenizer import CharTokenizer
from workers.sync.base import state_checksum

# Every peer library whose buffer layout at least is known: each has a preset.
PEER_PRESETS = {
    "trl-async",
    "pipelinerl",
    "prime-rl",
    "areal",
    "verl-fully-async",
    "skyrl",
    "nemo-rl",
    "slime",
    "miles",
    "art",
    "verifiers",
    "atropos",
    "open-instruct",
    "roll",
    "tunix",
    "oat",
    "torchforge",
}


def test_every_preset_is_a_valid_config():
    for name in PRESETS:
        assert build(name).model_dump() == PRESETS[name]["config"].model_dump()


def test_overrides_merge_into_the_preset_without_losing_siblings():
    cfg = build("async", {"buffer": {"capacity": 5}})
    assert cfg.buffer.capacity == 5
    assert cfg.buffer.max_staleness == PRESETS["async"]["config"].buffer.max_staleness


def test_deep_merge_leaves_its_inputs_alone():
    base = {"a": {"b": 1, "c": 2}}
    assert deep_merge(base, {"a": {"b": 3}}) == {"a": {"b": 3, "c": 2}}
    assert base == {"a": {"b": 1, "c": 2}}


def test_a_bad_override_names_the_field():
    with pytest.raises(ValidationError) as err:
        build("sync", parse_sets(["buffer.capacity=-1"]))
    assert "buffer.capacity" in str(err.value)


def test_an_unknown_preset_is_refused_with_the_choices():
    with pytest.raises(UnknownPreset, match="choose one of"):
        build("verl-9000")


def test_every_peer_has_a_preset_whose_description_names_it():
    assert set(PRESETS) >= PEER_PRESETS
    assert set(PEERS) <= set(PRESETS)
    for name, peer in PEERS.items():
        description = PRESETS[name]["description"]
        assert peer in description, f"{name}: description does not name {peer}"
        assert len(description) > 120, f"{name}: say which knobs it reproduces"


def test_async_and_sync_stay_first_and_unchanged():
    assert list(PRESETS)[:2] == ["async", "sync"]  # the launch form defaults to the first
    assert PRESETS["async"]["config"] == RunConfig(mode="async")
    assert PRESETS["sync"]["config"].mode == "sync"


def test_presets_compare_on_the_same_task_and_leave_the_backend_to_the_user():
    default = RunConfig()
    for name, preset in PRESETS.items():
        cfg = preset["config"]
        for section in ("model", "task", "warm_start", "inference", "stop"):
            assert getattr(cfg, section) == getattr(default, section), f"{name}: {section} changed"
        assert (cfg.trainer.batch_groups, cfg.trainer.group_size) == (16, 8), name


@pytest.mark.parametrize("backend", ["torch", "vllm"])
def test_every_preset_accepts_either_backend(backend):
    for name in PRESETS:
        assert build(name, {"inference": {"backend": backend}}).inference.backend == backend


def test_lora_is_off_except_in_the_lora_preset():
    on = {name for name, p in PRESETS.items() if p["config"].lora.enabled}
    assert on == {"trl-async-lora"}
    assert PRESETS["trl-async-lora"]["config"].sync.protocol == "lora"


def test_peer_presets_set_the_peers_own_figures():
    trl = PRESETS["trl-async"]["config"]
    assert (trl.buffer.max_staleness, trl.buffer.on_stale, trl.sync.bucket_mb) == (4, "drop", 1024)
    assert PRESETS["pipelinerl"]["config"].correction.method == "pipelinerl_reinforce"
    assert PRESETS["prime-rl"]["config"].buffer.max_staleness == 8
    assert PRESETS["areal"]["config"].correction.method == "decoupled_ppo"
    assert PRESETS["verl-fully-async"]["config"].sync.bucket_mb == 2048
    assert PRESETS["nemo-rl"]["config"].sync.update_mode == "drain"
    assert PRESETS["slime"]["config"].sync.update_mode == "abort_retry"
    assert PRESETS["slime"]["config"].sync.bucket_mb == 512
    assert PRESETS["miles"]["config"].buffer.on_stale == "requeue"
    assert PRESETS["art"]["config"].buffer.mode == "none"
    assert PRESETS["open-instruct"]["config"].sync.update_mode == "in_flight"
    roll = PRESETS["roll"]["config"]
    assert (roll.trainer.tis_cap, roll.sync.bucket_mb, roll.sync.update_mode) == (1.2, 1024, "abort_resume")
    assert PRESETS["tunix"]["config"].correction.method == "none"
    assert PRESETS["oat"]["config"].sync.packed is False
    assert PRESETS["torchforge"]["config"].buffer.mode == "unbounded"


# -- where each peer scores rewards ---------------------------------------------------------

REWARDS_DOC = Path(__file__).resolve().parents[2] / "docs" / "rewards.md"
REWARDS_SECTION = "## Where each peer scores rewards"


def test_every_preset_says_where_its_peer_scores_rewards_and_the_nearest_setting():
    for name, preset in PRESETS.items():
        where = preset["rewards_where"].strip()
        assert where, f"{name}: rewards_where is empty"
        # The peer's placement alone does not tell a user what to set here.
        assert "rewards.workers" in where, f"{name}: name the rewards.* setting that matches"
        if name in PEERS:
            assert PEERS[name] in where, f"{name}: rewards_where does not name {PEERS[name]}"
        else:
            assert "Rollway's default" in where, name


def test_presets_keep_the_default_reward_stage():
    # Where a peer scores on a pool, the sentence names the override: presets compare on
    # one reward stage, as on one task.
    for name, preset in PRESETS.items():
        assert preset["config"].rewards == RunConfig().rewards, name


def test_the_reward_stage_overrides_the_sentences_name_are_accepted():
    for name in ("verl-fully-async", "nemo-rl", "roll", "torchforge"):
        assert "rewards.workers" in PRESETS[name]["rewards_where"]
        assert build(name, {"rewards": {"workers": 1, "mode": "after"}}).rewards.workers == 1
    for name in ("pipelinerl", "areal"):
        assert "rewards.chunk_tokens ≥ inference.max_new_tokens" in PRESETS[name]["rewards_where"]
        tokens = PRESETS[name]["config"].inference.max_new_tokens
        cfg = build(name, {"rewards": {"workers": 1, "mode": "pipelined", "chunk_tokens": tokens}})
        assert (cfg.rewards.mode, cfg.rewards.chunk_tokens) == ("pipelined", tokens)


def test_the_docs_table_holds_every_presets_rewards_sentence_word_for_word():
    page = REWARDS_DOC.read_text()
    assert page.count(REWARDS_SECTION) == 1
    section = page.split(REWARDS_SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    expected = [
        f"| `{name}` | {PEERS.get(name, '— (Rollway)')} | {preset['rewards_where']} |"
        for name, preset in PRESETS.items()
    ]
    for want in expected:
        assert want in rows, f"docs/rewards.md: the row for {want.split('`')[1]} differs from workers/config/presets.py"
    assert rows == expected, "docs/rewards.md: one row per preset, in PRESETS order"


# -- the presets through the real driver (slow) -------------------------------------------

# A model and warm start that take milliseconds (helpers.small_config's sizes), the torch
# backend: what differs between runs is only the preset's own switches. Four steps, so
# that a run could train data older than one version (a step k batch can be at most k - 1
# versions old): the staleness bound of a preset whose max_staleness is 1 can fail.
STEPS = 4
SMALL = {
    "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
    "warm_start": {"steps": 2, "noisy_steps": 1, "batch_size": 8},
    "trainer": {"batch_groups": 4, "group_size": 4},
    "inference": {"backend": "torch"},
    "stop": {"max_steps": STEPS, "max_minutes": 3},
}

# One run costs ~15–25 s on a busy 2-core host (mostly starting the actor processes), so
# not every preset runs: these together set every value any preset gives an
# engine-relevant switch (checked below), so every switch value a preset uses is run
# (and replayed from the schedule it recorded, REPLAY below).
RUN = ["trl-async-lora", "pipelinerl", "prime-rl", "areal", "slime", "miles", "art", "torchforge"]


def engine_switches(cfg: RunConfig) -> set[tuple[str, object]]:
    """(switch, value) pairs that change what the engine does."""
    protocol = cfg.sync.protocol
    return {
        ("mode", cfg.mode),
        ("buffer.mode", cfg.buffer.mode),
        ("buffer.on_stale", cfg.buffer.on_stale),
        ("correction.method", cfg.correction.method),
        ("sync.protocol", protocol),
        ("sync.update_mode", cfg.sync.update_mode),
        ("lora.enabled", cfg.lora.enabled),
        ("sync.packed", cfg.sync.packed if protocol == "collective" else None),
    }


def test_the_presets_run_below_use_every_switch_value_of_every_preset():
    covered = set().union(*(engine_switches(PRESETS[n]["config"]) for n in RUN))
    for name, preset in PRESETS.items():
        missing = engine_switches(preset["config"]) - covered
        assert not missing, f"{name} sets {sorted(missing, key=str)}, which no preset in RUN runs"


# A replay follows the schedule a run recorded: what shapes it is every engine switch but
# the correction method (which changes the loss, not which groups a step trains or when
# weights load). These presets' replays, with tests/engine/test_replay.py's (the async
# preset, and miles' requeue with abort_resume), cover every such value of every preset;
# a replay costs a whole run, and replaying the rest would prove the same switches again.
REPLAY = ["trl-async-lora", "pipelinerl", "prime-rl", "slime", "art"]


def schedule_switches(cfg: RunConfig) -> set[tuple[str, object]]:
    return {(k, v) for k, v in engine_switches(cfg) if k != "correction.method"}


def test_the_replays_below_and_the_replay_tests_cover_every_schedule_switch_of_every_preset():
    assert set(REPLAY) <= set(RUN)
    replayed = [PRESETS[n]["config"] for n in REPLAY]
    replayed += [build("async", REPLAYED), build("async", deep_merge(REPLAYED, REQUEUE))]
    covered = set().union(*map(schedule_switches, replayed))
    for name, preset in PRESETS.items():
        missing = schedule_switches(preset["config"]) - covered
        assert not missing, f"{name} sets {sorted(missing, key=str)}, which no replay replays"


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN)
def test_the_preset_runs_through_the_driver(cluster, cache_dir, name):
    config = build(name, SMALL)
    run_id = 400 + list(PRESETS).index(name)
    out = run_config(run_id, cache_dir, config.model_dump(mode="json"), timeout_s=240)
    assert out["state"] == "succeeded", f"{name}: {out['error']}"
    assert out["steps"] == STEPS
    s = {k: dict(v) for k, v in out["series"].items()}
    assert sorted(s["reward/mean"]) == list(range(1, STEPS + 1)), name
    assert all(v > 0 for v in s["sync/bytes"].values()), name
    assert max(s["staleness/max"].values()) <= config.buffer.max_staleness, name
    if config.buffer.mode == "double":  # the BufferActor got the mode: one batch of B=4 groups
        assert set(s["buffer/capacity"].values()) == {4.0}, name
    if config.lora.enabled:
        assert_the_lora_export_is_the_final_policy(out)
    assert_the_update_mode_counted_what_it_does(config.sync.update_mode, s)
    if name not in REPLAY:
        return
    # Replayed under the schedule it recorded, the preset trains the same, bit for bit.
    again = run_config(run_id + 100, cache_dir, config.model_dump(mode="json"), timeout_s=240, replay=out["schedule"])
    assert again["state"] == "succeeded", f"{name} replayed: {again['error']}"
    # A replay that stalls ends "succeeded" at stop.max_minutes, short of its steps.
    assert again["steps"] == STEPS, f"{name} replayed: {again['steps']} of {STEPS} steps"
    assert again["schedule"]["batches"] == out["schedule"]["batches"], name
    assert again["policy_sha256"] == out["policy_sha256"], name
    for series in TRAINED:
        if series in out["series"]:
            assert dict(again["series"][series]) == s[series], (name, series)


def assert_the_update_mode_counted_what_it_does(mode: str, series: dict) -> None:
    """What each update mode does to a call that weights arrive in, by its cumulative
    counters: whether weights arrived mid-call here is up to the host (the stepped modes'
    runs that force it are tests/engine/test_update_modes_in_runs.py's)."""
    aborted, resumed, retried = (
        max(series[f"rollout/partial_{k}"].items())[1] for k in ("aborted", "resumed", "retried")
    )
    mixed = set(series["rollout/mixed_version_frac"].values())
    if mode == "drain":  # weights load between calls only: nothing aborted, nothing mixed
        assert aborted == resumed == retried == 0 and mixed == {0.0}, (aborted, resumed, retried, mixed)
    elif mode == "in_flight":
        assert aborted == resumed == retried == 0, (aborted, resumed, retried)
    elif mode == "abort_retry":  # a retried sequence starts again on the new weights
        assert retried == aborted and resumed == 0 and mixed == {0.0}, (aborted, resumed, retried, mixed)
    else:
        assert (mode, resumed, retried) == ("abort_resume", aborted, 0), (mode, aborted, resumed, retried)


def assert_the_lora_export_is_the_final_policy(out: dict) -> None:
    """A finished LoRA run's export (workers/train/export.py): the top level holds the
    trainer's final policy, the adapter merged; base/ and adapter/ are that policy as
    peft loads it."""
    merged = AutoModelForCausalLM.from_pretrained(out["export_dir"])
    assert state_checksum(checkpoint_state_dict(merged)) == out["policy_sha256"]
    base = AutoModelForCausalLM.from_pretrained(os.path.join(out["export_dir"], "base"))
    peft_model = PeftModel.from_pretrained(base, os.path.join(out["export_dir"], "adapter"))
    ids = torch.tensor([CharTokenizer().prompt_ids("abcd=")])
    with torch.no_grad():
        assert torch.allclose(peft_model(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5)


def test_a_checkpoint_or_the_dataset_task_starts_without_the_warm_start_under_every_preset(tmp_path):
    """A preset carries its own fields only: the warm start's default, off for a
    checkpoint and for the dataset task, follows the overrides as without a preset (the
    site launches through presets)."""
    checkpoint = {"model": {"source": "path", "path": str(tmp_path)}}
    dataset_task = {"task": {"name": "dataset"}}
    for name in PRESETS:
        for overrides in (checkpoint, dataset_task):
            ws = build(name, overrides).warm_start
            assert (ws.steps, ws.noisy_steps) == (0, 0), (name, overrides)
        assert build(name, {**checkpoint, "warm_start": {"steps": 5}}).warm_start.steps == 5
        assert build(name).warm_start.steps == 200  # the tiny model keeps its warm start


def test_the_settings_that_fit_a_checkpoint_follow_its_size():
    from workers.config.run_config import RunConfig
    from workers.model.fitting import fits

    tiny = RunConfig()
    assert fits(tiny, 1_000_000, 2048) == []  # the tiny model's own settings
    advice = {f.field: f.suggested for f in fits(tiny, 494_000_000, 32768)}
    assert advice == {"trainer.lr": 1e-6, "inference.max_new_tokens": 256}
    on_gpus = RunConfig.model_validate({"placement": {"devices": "gpu"}})
    assert {f.field: f.suggested for f in fits(on_gpus, 32_000_000_000, None)} == {
        "trainer.lr": 5e-7,
        "trainer.dtype": "bfloat16",
        "inference.dtype": "bfloat16",
        "inference.max_new_tokens": 256,
    }
    fitted = RunConfig.model_validate({"trainer": {"lr": 1e-6}, "inference": {"max_new_tokens": 512}})
    assert fits(fitted, 494_000_000, 32768) == []
