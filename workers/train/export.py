"""Get the model back: a run's final policy as a Hugging Face directory.

At the end of a successful run the driver asks the trainer to export its policy to the
run's export directory (`ROLLWAY_EXPORT_DIR/run-<id>`, workers/run/paths.py); the site
serves it as a zip. The directory is what `from_pretrained` reads:

    config.json, generation_config.json   the model's config; every stop id as EOS
    model.safetensors                     the trainer's final weights, float32 (with
                                          LoRA: base and adapter merged)
    tokenizer.json, tokenizer_config.json the model's tokenizer (for the tiny char model,
                                          its vocabulary as a PreTrainedTokenizerFast)
    adapter/                              with LoRA only: the adapter alone, peft format
    base/                                 with LoRA only, when the adapter's base is not
                                          the checkpoint the run started from (the tiny
                                          model, or one changed by the warm start)
    rollway_export.json                   what this is: source, LoRA, the weights' sha256
    rollway_split.json                    with a dataset: the split it trained on
                                          (workers/rollout/task_data.py)

The export is for people to download, so nothing in it names a path of the cluster: a
run that started from a local directory (`model.path`) names it by the directory's name
only, in the manifest and as the adapter's base (`export_model_name`).

The directory is built under a temporary name beside the target and renamed into place,
so the site never serves half an export.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import TYPE_CHECKING

from workers.model.loading import untied
from workers.model.lora import (
    adapter_config,
    adapter_state_dict,
    base_state_dict,
    effective_live_state,
    effective_state_dict,
    is_peft,
    split_live_state,
    write_adapter_dir,
)
from workers.model.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, load_tokenizer
from workers.rollout.task_data import write_split_record
from workers.sync.base import state_checksum

if TYPE_CHECKING:
    import torch

    from workers.config.run_config import RunConfig

MANIFEST = "rollway_export.json"


def export_model_name(cfg: RunConfig) -> str | None:
    """The run's starting model as its export names it: the Hub id, or a local
    directory's name without the cluster's path to it (meaningless where the export is
    downloaded, and not the reader's to know)."""
    if cfg.model.source == "path" and cfg.model.path:
        return os.path.basename(os.path.normpath(cfg.model.path))
    return cfg.model.hub_id


def hf_tokenizer(tokenizer: Tokenizer):
    """The Rollway tokenizer as a `transformers` tokenizer, as written into an export."""
    if isinstance(tokenizer, CharTokenizer):
        return tokenizer.to_hf()
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer.hf
    raise TypeError(f"no transformers tokenizer for a {type(tokenizer).__name__}")


def write_model_dir(weights: dict[str, torch.Tensor], model_dir: str, tokenizer: Tokenizer, out_dir: str) -> None:
    """`weights` (checkpoint names) as a Hugging Face directory at `out_dir`, with the
    config and generation config of `model_dir` and `tokenizer` in transformers' format.

    The model is built on the meta device and takes `weights` as they are (no copy), so
    exporting a big model does not hold its weights twice."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(weights, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    left = [n for n, p in model.state_dict().items() if p.is_meta]
    if left:
        raise KeyError(f"export: no weight for {left[:5]} in the trainer's state dict")
    if os.path.exists(os.path.join(model_dir, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(model_dir)
    model.save_pretrained(out_dir)
    hf_tokenizer(tokenizer).save_pretrained(out_dir)


def export_policy(
    model: torch.nn.Module, model_dir: str, target: str, cfg: RunConfig, live_state: dict | None = None
) -> dict:
    """Export the trainer's `model` (plain or peft-wrapped, trained from the policy
    directory `model_dir`) to `target`, replacing what was there. Returns the manifest.
    `live_state`: the model's whole state dict, gathered, when `model` is a shard of a
    trainer pool's (its tensors are read from there, its config from `model`)."""
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}-", dir=parent)
    try:
        tokenizer = load_tokenizer(model_dir)
        tensors = _tensors(model, live_state)
        weights = tensors["effective"]
        write_model_dir(weights, model_dir, tokenizer, tmp)
        manifest = {
            "format": "huggingface",
            "model_source": cfg.model.source,
            "model": export_model_name(cfg),
            "lora": is_peft(model),
            "sha256": state_checksum(weights),
        }
        if is_peft(model):
            manifest.update(_export_adapter(model, tensors, model_dir, tokenizer, tmp, cfg))
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=2)
        write_split_record(cfg, tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only; the site's process reads it
        _replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _tensors(model: torch.nn.Module, live_state: dict | None) -> dict[str, dict]:
    """The policy's weights under checkpoint names ("effective", LoRA merged) and, for a
    peft model, its "base" and "adapter" (peft's saved names): from the model, or from
    its gathered `live_state`."""
    if live_state is None:
        if not is_peft(model):
            return {"effective": effective_state_dict(model)}
        return {
            "effective": effective_state_dict(model),
            "base": base_state_dict(model),
            "adapter": adapter_state_dict(model),
        }
    effective = effective_live_state(live_state, model)
    if not is_peft(model):
        return {"effective": effective}
    base, adapter = split_live_state(live_state)
    return {"effective": effective, "base": untied(base, model), "adapter": adapter}


def _export_adapter(model, tensors: dict, model_dir: str, tokenizer: Tokenizer, out_dir: str, cfg: RunConfig) -> dict:
    """adapter/ (peft) and, where the run's checkpoint is not its base, base/."""
    warm_started = cfg.warm_start.steps + cfg.warm_start.noisy_steps > 0
    if cfg.model.source != "tiny" and not warm_started:
        base = export_model_name(cfg)
    else:
        # The adapter was trained on a base only this run's cache holds: ship it.
        write_model_dir(tensors["base"], model_dir, tokenizer, os.path.join(out_dir, "base"))
        base = "base"
    config = adapter_config(model)
    config["base_model_name_or_path"] = base
    write_adapter_dir(os.path.join(out_dir, "adapter"), tensors["adapter"], config)
    return {"adapter": "adapter", "base": base}


def _replace(new: str, target: str) -> None:
    """Put directory `new` at `target`; an older export there goes once the new one is in."""
    old = None
    if os.path.exists(target):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}-old-", dir=os.path.dirname(new))
        os.rename(target, os.path.join(old, "export"))
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
