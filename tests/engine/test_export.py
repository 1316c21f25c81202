"""Getting the model back (workers/train/export.py): a run's final policy as a Hugging Face
directory that `from_pretrained` loads and that generates, holding exactly the trainer's
weights; with LoRA also the adapter alone, which peft puts back on its base.

Through the driver: a finished LoRA run's export is checked on the trl-async-lora
preset's run (test_presets.py: the merged policy's checksum is the trainer's final one,
and peft's base + adapter compute its logits); a full fine-tuning run's where a user's
checkpoint is post-trained (test_hf_models.py: its checksum is the trainer's final
policy's, its tokenizer kept)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.engine.helpers import HF_WARM_START, small_config
from workers.model.loading import checkpoint_state_dict
from workers.model.lora import adapter_state_dict
from workers.model.tiny_hf import make_tiny_checkpoint
from workers.model.tokenizer import CharTokenizer
from workers.sync.base import state_checksum
from workers.train import warmstart
from workers.train.export import MANIFEST, export_policy
from workers.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> str:
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("models") / "tiny-qwen2"), "qwen2")


def trained(cfg, cache: str) -> Trainer:
    """A trainer on the run's warm-started policy whose trainable weights moved a little
    (as after RL steps), so an export of the starting point would not pass for the result."""
    trainer = Trainer(cfg, policy(cfg, cache))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in trainer.model.parameters():
            if p.requires_grad:
                p.add_(1e-3 * torch.randn(p.shape, generator=gen))
    return trainer


def policy(cfg, cache: str) -> str:
    return warmstart.policy_dir(cfg, cache)


def test_the_char_model_exports_as_a_llama_with_a_tokenizer_hf_loads(tmp_path):
    cfg = small_config()
    cache = str(tmp_path / "cache")
    trainer = trained(cfg, cache)
    target = str(tmp_path / "exports" / "run-1")
    manifest = export_policy(trainer.model, policy(cfg, cache), target, cfg)
    files = set(os.listdir(target))
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", MANIFEST} <= files
    model = AutoModelForCausalLM.from_pretrained(target)
    tok = AutoTokenizer.from_pretrained(target)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert state_checksum(checkpoint_state_dict(model)) == state_checksum(trainer.state_dict()) == manifest["sha256"]
    # The char vocabulary as a Hugging Face tokenizer: the same ids, BOS first, no spaces.
    chars = CharTokenizer.load(policy(cfg, cache))  # the run's own vocabulary
    assert tok("ab c=")["input_ids"] == chars.prompt_ids("ab c=")
    assert tok.decode(chars.encode("c ba") + [chars.eos_id], skip_special_tokens=True) == "c ba"
    assert (tok.eos_token_id, tok.pad_token_id, len(tok)) == (chars.eos_id, chars.pad_id, chars.vocab_size)
    inputs = tok("abc=", return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :].tolist()
    assert 1 <= len(new) <= 4 and all(0 <= t < chars.vocab_size for t in new)


def test_a_bpe_model_exports_with_its_tokenizer_and_chat_template(tmp_path, qwen_dir):
    # A warm start that teaches the format (letters, then EOS), so generation can stop.
    cfg = small_config(model={"source": "path", "path": qwen_dir}, warm_start=HF_WARM_START)
    cache = str(tmp_path / "cache")
    trainer = trained(cfg, cache)
    target = str(tmp_path / "exports" / "run-2")
    export_policy(trainer.model, policy(cfg, cache), target, cfg)
    model = AutoModelForCausalLM.from_pretrained(target)
    tok = AutoTokenizer.from_pretrained(target)
    source = AutoTokenizer.from_pretrained(qwen_dir)
    assert state_checksum(checkpoint_state_dict(model)) == state_checksum(trainer.state_dict())
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    chat = [{"role": "user", "content": "abc="}]
    prompt = tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    assert prompt == source.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    # generate stops at the chat model's end of turn: the generation config names it as EOS.
    out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    new = out[0, len(prompt) :].tolist()
    assert new[-1] == tok.eos_token_id and len(new) < 12, new
    assert set(tok.decode(new, skip_special_tokens=True)) <= set(cfg.task.alphabet)


def test_a_lora_policy_exports_merged_and_the_adapter_alone(tmp_path, qwen_dir):
    cfg = small_config(model={"source": "path", "path": qwen_dir}, lora={"enabled": True, "rank": 4})
    trainer = trained(cfg, str(tmp_path / "cache"))
    target = str(tmp_path / "exports" / "run-3")
    manifest = export_policy(trainer.model, policy(cfg, str(tmp_path / "cache")), target, cfg)
    # The warm start changed the checkpoint, so the adapter's base ships with it.
    assert (manifest["lora"], manifest["adapter"], manifest["base"]) == (True, "adapter", "base")
    merged = AutoModelForCausalLM.from_pretrained(target)
    assert state_checksum(checkpoint_state_dict(merged)) == state_checksum(trainer.state_dict())
    adapter_dir = os.path.join(target, "adapter")
    assert json.load(open(os.path.join(adapter_dir, "adapter_config.json")))["base_model_name_or_path"] == "base"
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(os.path.join(target, "base")), adapter_dir
    )
    loaded = {k.replace(".default", ""): v for k, v in adapter_state_dict(peft_model).items()}
    ours = adapter_state_dict(trainer.model)
    assert loaded.keys() == ours.keys() and all(torch.equal(loaded[k], ours[k]) for k in ours)
    ids = torch.tensor([AutoTokenizer.from_pretrained(target).encode("abcdefgh=hgfe")])
    with torch.no_grad():
        a, b = peft_model(input_ids=ids).logits, merged(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5), float((a - b).abs().max())


def test_a_lora_run_on_the_checkpoint_itself_points_the_adapter_at_it(tmp_path, qwen_dir):
    cfg = small_config(
        model={"source": "path", "path": qwen_dir},
        warm_start={"steps": 0, "noisy_steps": 0},
        lora={"enabled": True, "rank": 4},
    )
    trainer = trained(cfg, str(tmp_path / "cache"))
    target = str(tmp_path / "exports" / "run-4")
    manifest = export_policy(trainer.model, policy(cfg, str(tmp_path / "cache")), target, cfg)
    # The base by its directory's name: the cluster's path to it is not the downloader's.
    assert manifest["base"] == "tiny-qwen2" and "base" not in os.listdir(target)
    adapter_config = json.load(open(os.path.join(target, "adapter", "adapter_config.json")))
    assert adapter_config["base_model_name_or_path"] == "tiny-qwen2"
    for root, _, names in os.walk(target):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                assert os.path.dirname(qwen_dir).encode() not in f.read(), name
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(qwen_dir), os.path.join(target, "adapter")
    )
    merged = AutoModelForCausalLM.from_pretrained(target)
    ids = torch.tensor([[1, 2, 40, 41, 42]])
    with torch.no_grad():
        assert torch.allclose(peft_model(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5)


def test_an_export_replaces_the_previous_one_whole(tmp_path):
    cfg = small_config()
    target = tmp_path / "exports" / "run-5"
    target.mkdir(parents=True)
    (target / "stale.bin").write_bytes(b"old")
    export_policy(trained(cfg, str(tmp_path / "cache")).model, policy(cfg, str(tmp_path / "cache")), str(target), cfg)
    assert "stale.bin" not in os.listdir(target) and "model.safetensors" in os.listdir(target)
    assert [p for p in os.listdir(target.parent) if p != "run-5"] == []  # no temporary left behind
