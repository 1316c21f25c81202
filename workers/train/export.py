"""Get the model back: a run's final policy as a Hugging Face directory.

At the end of a successful run the driver asks the trainer to export its policy to the
run's export directory (`ROLLWAY_EXPORT_DIR/run-<id>`, workers/run/paths.py); the site
serves it as a zip. The directory is what `from_pretrained` reads:

    config.json, generation_config.json   the model's config; every stop id as EOS
    model.safetensors                     the trainer's final weights, float32 (with
                                          LoRA: base and adapter merged); from an
                                          fsdp2 pool, shards of about sync.bucket_mb
                                          and model.safetensors.index.json
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
from collections.abc import Iterable
from typing import TYPE_CHECKING

from workers.model.loading import untied
from workers.model.lora import (
    adapter_config,
    adapter_state_dict,
    base_state_dict,
    effective_state_dict,
    is_peft,
    write_adapter_dir,
)
from workers.model.tokenizer import CharTokenizer, HFTokenizer, Tokenizer, load_tokenizer
from workers.rollout.task_data import write_split_record
from workers.sync.base import StateHasher, state_checksum
from workers.sync.weights import adapter_tensors, base_stream, drain, effective_stream, follow, is_sharded

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
    return cfg.model.hub_id if cfg.model.source == "hub" else None


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


def write_streamed_model_dir(
    stream: Iterable[tuple[str, torch.Tensor]], model_dir: str, tokenizer: Tokenizer, out_dir: str, shard_mb: float
) -> str:
    """`write_model_dir` for weights that come a tensor at a time, in name order
    (workers/sync/weights.py's streams of a sharded trainer): each safetensors shard is
    written once it holds about `shard_mb`, so no more than one shard of gathered
    weights is held at a time. Returns their `state_checksum`, taken on the way.

    transformers' `save_pretrained` takes the whole state dict; what it writes besides
    the weights (config with dtype and architecture, generation config, the shard index)
    is written here as it writes it, from the model built on the meta device."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    expected = set(untied(model.state_dict(), model))
    limit = shard_mb * 2**20
    hasher = StateHasher()
    shards: list[tuple[str, list[str]]] = []
    shard: dict[str, torch.Tensor] = {}
    held = total = parameters = 0

    def flush() -> None:
        name = f".shard-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(out_dir, name), metadata={"format": "pt"})
        shards.append((name, list(shard)))

    for name, tensor in stream:
        if name not in expected:
            raise KeyError(f"export: {name!r} is no weight of a {type(model).__name__}")
        expected.discard(name)
        hasher.add(name, tensor)
        t = tensor.detach().to("cpu").contiguous()
        shard[name] = t
        held += t.numel() * t.element_size()
        total += t.numel() * t.element_size()
        parameters += t.numel()
        if held >= limit:
            flush()
            shard, held = {}, 0
        del tensor, t  # not held while the next module is gathered
    if expected:
        raise KeyError(f"export: no weight for {sorted(expected)[:5]} in the trainer's state")
    if shard or not shards:
        flush()
    weight_map = {}
    for k, (tmp, names) in enumerate(shards):
        final = SAFE_WEIGHTS_NAME if len(shards) == 1 else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        os.replace(os.path.join(out_dir, tmp), os.path.join(out_dir, final))
        weight_map.update(dict.fromkeys(names, final))
    if len(shards) > 1:
        index = {"metadata": {"total_parameters": parameters, "total_size": total}, "weight_map": weight_map}
        with open(os.path.join(out_dir, SAFE_WEIGHTS_INDEX_NAME), "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
    model.config.dtype = "float32"
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out_dir)
    if os.path.exists(os.path.join(model_dir, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(model_dir)
    if model.can_generate():
        model.generation_config.save_pretrained(out_dir)
    hf_tokenizer(tokenizer).save_pretrained(out_dir)
    return hasher.hexdigest()


def export_policy(model: torch.nn.Module, model_dir: str, target: str, cfg: RunConfig) -> dict:
    """Export the trainer's `model` (plain or peft-wrapped, trained from the policy
    directory `model_dir`) to `target`, replacing what was there. Returns the manifest.

    `model` sharded (a rank of an fsdp2 pool): its weights are gathered and written a
    shard at a time (`write_streamed_model_dir`), never whole on one rank; every other
    rank of the pool runs `follow_export` meanwhile."""
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}-", dir=parent)
    try:
        tokenizer = load_tokenizer(model_dir)
        if is_sharded(model):
            tensors = None
            checksum = write_streamed_model_dir(effective_stream(model), model_dir, tokenizer, tmp, cfg.sync.bucket_mb)
        else:
            tensors = _tensors(model)
            write_model_dir(tensors["effective"], model_dir, tokenizer, tmp)
            checksum = state_checksum(tensors["effective"])
        manifest = {
            "format": "huggingface",
            "model_source": cfg.model.source,
            "model": export_model_name(cfg),
            "lora": is_peft(model),
            "sha256": checksum,
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


def follow_export(model: torch.nn.Module, cfg: RunConfig) -> None:
    """What ranks 1.. of a sharded pool run while rank 0 exports: the same gathers, in
    `export_policy`'s order, their results dropped."""
    drain(effective_stream(model))
    if is_peft(model):
        if _ships_base(cfg):
            drain(base_stream(model))
        follow(model, "adapter")


def _tensors(model: torch.nn.Module) -> dict[str, dict]:
    """The policy's weights under checkpoint names ("effective", LoRA merged) and, for a
    peft model, its "base" and "adapter" (peft's saved names)."""
    if not is_peft(model):
        return {"effective": effective_state_dict(model)}
    return {
        "effective": effective_state_dict(model),
        "base": base_state_dict(model),
        "adapter": adapter_state_dict(model),
    }


def _ships_base(cfg: RunConfig) -> bool:
    """Whether a LoRA export carries its base: the adapter was trained on a base only this
    run's cache holds (the tiny model, or one the warm start changed)."""
    warm_started = cfg.warm_start.steps + cfg.warm_start.noisy_steps > 0
    return cfg.model.source == "tiny" or warm_started


def _export_adapter(
    model, tensors: dict | None, model_dir: str, tokenizer: Tokenizer, out_dir: str, cfg: RunConfig
) -> dict:
    """adapter/ (peft) and, where the run's checkpoint is not its base, base/. `tensors`
    None: `model` is sharded, and both are gathered here (the base a shard at a time)."""
    base = export_model_name(cfg)
    if _ships_base(cfg):
        base_dir = os.path.join(out_dir, "base")
        if tensors is None:
            os.makedirs(base_dir)
            write_streamed_model_dir(base_stream(model), model_dir, tokenizer, base_dir, cfg.sync.bucket_mb)
        else:
            write_model_dir(tensors["base"], model_dir, tokenizer, base_dir)
        base = "base"
    adapter = adapter_tensors(model) if tensors is None else tensors["adapter"]
    config = adapter_config(model)
    config["base_model_name_or_path"] = base
    write_adapter_dir(os.path.join(out_dir, "adapter"), adapter, config)
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
