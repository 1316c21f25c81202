"""LoRA with peft: wrap the trainer's policy, read its adapter, merge it into full weights.

With `lora.enabled` the trainer trains a peft LoRA adapter on a frozen base. What the
rest of the engine needs of that lives here, in one place:

- `apply_lora`: wrap a model (base frozen, adapter trainable; build the optimizer after);
- `adapter_state_dict` / `adapter_parameters`: the adapter's tensors under peft's saved
  names (what adapter-only sync moves, workers/sync/lora.py);
- `base_state_dict` + `merge_adapter` + `lora_scaling`: base + scaling · B·A, the exact
  float operations of peft's `merge_and_unload`, so an inference worker merging locally
  holds weights bit-identical to the trainer's merged policy;
- `effective_state_dict`: the policy a model computes, as full weights under Hugging
  Face checkpoint names, peft-wrapped or not (what every full-weight sync moves);
- `adapter_config` / `write_adapter_dir`: a peft adapter directory, loadable by peft
  and by vLLM.

The default target is peft's "all-linear" (`workers.config.run_config.ALL_LINEAR`): every linear
layer whatever the architecture names them; `target_problem` says, before any weight is
loaded, when a list of names matches no module of the model. The vLLM side of adapters
(engine arguments, registering an adapter) belongs to the vLLM backend.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import TYPE_CHECKING, TypeVar, cast

import torch
from safetensors.torch import save_file

from workers.config.run_config import ALL_LINEAR
from workers.model.loading import untied

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel

    from workers.config.run_config import LoRAConfig

T = TypeVar("T")

# peft's saved adapter names start with this; checkpoint names do not.
_PEFT_PREFIX = "base_model.model."
# A live adapter weight: <module>.lora_A|lora_B.<adapter name>.weight.
_LIVE_ADAPTER = re.compile(r"^(.*)\.(lora_[AB])\.[^.]+\.weight$")


def apply_lora(model: torch.nn.Module, cfg: LoRAConfig, *, init_lora_weights: bool = True):
    """Wrap the trainer's model with a peft LoRA adapter as `cfg` (the run's `lora`
    section) says. `init_lora_weights=False` starts B non-zero (tests and benchmarks
    that need the adapter to change the policy from step 0)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,  # type: ignore[arg-type]  # peft annotates an int and computes with any number
        target_modules=peft_targets(cfg, model),
        lora_dropout=cfg.dropout,
        init_lora_weights=init_lora_weights,
        bias="none",
    )
    return get_peft_model(model, config)


def peft_targets(cfg: LoRAConfig, model: torch.nn.Module) -> list[str]:
    """`lora.target_modules` as peft takes it. "all-linear" is spelt out here as the
    names of every linear layer (nn.Linear, GPT-2's Conv1D) but the output layer, the
    layers peft's own "all-linear" picks: given the string, peft 0.21 also adapts the
    fused expert tensors of a transformers-5 mixture of experts (Mixtral) as parameters
    of their own ranks, which neither the adapter merge here nor vLLM's adapters take."""
    from transformers.pytorch_utils import Conv1D

    if cfg.target_modules != [ALL_LINEAR]:
        return list(cfg.target_modules)
    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, (torch.nn.Linear, Conv1D)) and module is not output
        }
    )


def target_problem(model: torch.nn.Module, cfg: LoRAConfig) -> str | None:
    """Why `lora.target_modules` cannot adapt `model`, or None: a list of names that
    matches none of its modules (peft would refuse it when the trainer starts). `model`
    may be on the meta device: only its module names are read, with peft's own matching."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    targets = list(cfg.target_modules)
    if targets == [ALL_LINEAR]:
        return None
    config = LoraConfig(target_modules=targets)
    names = [name for name, _ in model.named_modules() if name]
    if any(check_target_module_exists(config, name) for name in names):
        return None
    # A module's own name, for the linear layers a user would pick from.
    linear = sorted(
        {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if type(m).__name__ in ("Linear", "Conv1D")}
        - {"lm_head"}
    )
    return (
        f"{targets} match no module of this {type(model).__name__}; its linear layers are named "
        f"{', '.join(linear)}: name some of those, or use ['all-linear']"
    )


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _peft(model: torch.nn.Module) -> PeftModel:
    """`model` as the peft wrapper it is (`is_peft`): torch types a module's attributes
    as tensors or modules."""
    return cast("PeftModel", model)


def base_model_of(model: torch.nn.Module):
    """Context in which `model` (a peft model) computes its frozen base alone: peft's
    `disable_adapter`, the LoRA run's KL reference without a second copy of the weights."""
    if not is_peft(model):
        raise ValueError("base_model_of needs a peft (LoRA) model")
    return _peft(model).disable_adapter()


def _lora_config(model: torch.nn.Module) -> LoraConfig:
    return cast("LoraConfig", _peft(model).peft_config["default"])


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors under peft's saved names (…q_proj.lora_A.weight), detached
    views of the live parameters."""
    from peft.utils import get_peft_model_state_dict

    return {k: v.detach() for k, v in get_peft_model_state_dict(model).items()}


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """peft's saved name → the live Parameter, resolved once: asking peft for its adapter
    state dict walks the whole model each time."""
    active = model.active_adapter if isinstance(model.active_adapter, str) else "default"
    params = dict(model.named_parameters())
    out = {}
    for key in adapter_state_dict(model):
        live = key.removesuffix(".weight") + f".{active}.weight"
        if live not in params:
            raise KeyError(f"adapter tensor {key!r} has no live parameter {live!r}")
        out[key] = params[live]
    return out


def base_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base under Hugging Face checkpoint names (views, no copy), a tied
    weight once: what the base's model.safetensors holds."""
    out = {}
    for key, t in _peft(model).get_base_model().state_dict().items():
        if ".lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = t.detach()
    return untied(out, model)


def lora_fan_in_fan_out(model: torch.nn.Module) -> bool:
    """Whether the adapted weights are stored (in, out), as GPT-2's Conv1D layers are:
    B·A is then transposed before it is added (peft's `fan_in_fan_out`)."""
    return bool(_lora_config(model).fan_in_fan_out)


def lora_scaling(model: torch.nn.Module) -> float:
    """alpha / r (alpha / √r with rsLoRA): what B·A is multiplied by."""
    cfg = _lora_config(model)
    if cfg.rank_pattern or cfg.alpha_pattern:
        raise NotImplementedError("per-module LoRA ranks/alphas are not supported")
    return cfg.lora_alpha / (cfg.r**0.5 if cfg.use_rslora else cfg.r)


def _target_weight(adapter_key: str) -> tuple[str, str]:
    """'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' →
    ('model.layers.0.self_attn.q_proj.weight', 'A')."""
    key = adapter_key.removeprefix(_PEFT_PREFIX)
    for part in ("A", "B"):
        suffix = f".lora_{part}.weight"
        if key.endswith(suffix):
            return key[: -len(suffix)] + ".weight", part
    raise ValueError(f"{adapter_key!r} is not a LoRA A/B weight (bias and DoRA adapters are not supported)")


def merge_adapter(
    base: dict[str, torch.Tensor],
    adapter: dict[str, torch.Tensor],
    scaling: float,
    out: dict[str, torch.Tensor] | None = None,
    fan_in_fan_out: bool = False,
) -> dict[str, torch.Tensor]:
    """base + (B @ A) · scaling for every adapted weight, untouched tensors shared;
    (B @ A)ᵀ · scaling with `fan_in_fan_out` (`lora_fan_in_fan_out`).

    The same float operations, in the same order, as peft's merge (get_delta_weight then
    +=), so the result is bit-identical to `merge_and_unload()` on the same tensors.
    `out`: buffers from an earlier call to merge into again (an inference worker merging
    every version would otherwise fault in a fresh model-sized allocation each time)."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in adapter.items():
        weight, part = _target_weight(key)
        pairs.setdefault(weight, {})[part] = t
    merged = dict(base)
    for weight, ab in pairs.items():
        if weight not in base or set(ab) != {"A", "B"}:
            raise KeyError(
                f"adapter for {weight!r} does not match the base (has {sorted(ab)}; base has it: {weight in base})"
            )
        if out is None:
            delta = ab["B"] @ ab["A"]
            merged[weight] = base[weight] + (delta.T if fan_in_fan_out else delta) * scaling
        else:
            dest = out.get(weight)
            if dest is None:
                dest = out[weight] = torch.empty_like(base[weight])
            if fan_in_fan_out:
                dest.copy_((ab["B"] @ ab["A"]).T)
            else:
                torch.matmul(ab["B"], ab["A"], out=dest)
            dest.mul_(scaling)
            torch.add(base[weight], dest, out=dest)
            merged[weight] = dest
    return merged


def split_live_state(state: dict[str, T]) -> tuple[dict[str, T], dict[str, T]]:
    """A peft model's own state dict (or a piece of it, under its live names) as (base
    under checkpoint names, adapter under peft's saved names): what `merge_adapter`
    takes. Used where the live tensors were gathered from ranks that each held a shard,
    and (given {live name: live name}) to map a checkpoint's files back to live names."""
    base: dict[str, T] = {}
    adapter: dict[str, T] = {}
    for key, t in state.items():
        name = key.removeprefix(_PEFT_PREFIX)
        m = _LIVE_ADAPTER.match(name)
        if m:  # "…q_proj.lora_A.default.weight" → "base_model.model.…q_proj.lora_A.weight"
            adapter[f"{_PEFT_PREFIX}{m.group(1)}.{m.group(2)}.weight"] = t
        else:
            base[name.replace(".base_layer.", ".")] = t
    return base, adapter


def effective_live_state(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`effective_state_dict` of tensors gathered from the ranks that each held a shard of
    `model` (its whole state dict, or a piece of it, under its live names): a tied weight
    once, and for a peft model base and adapter merged."""
    if not is_peft(model):
        return untied(state, model)
    base, adapter = split_live_state(state)
    return merge_adapter(untied(base, model), adapter, lora_scaling(model), fan_in_fan_out=lora_fan_in_fan_out(model))


def effective_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy `model` computes, as full weights under Hugging Face checkpoint names:
    detached views of the live parameters (no copy) for a plain model; base and adapter
    merged (a copy) for a peft model, which is what a full-weight sync of a LoRA run
    must move."""
    if is_peft(model):
        return merge_adapter(
            base_state_dict(model),
            adapter_state_dict(model),
            lora_scaling(model),
            fan_in_fan_out=lora_fan_in_fan_out(model),
        )
    return untied({name: t.detach() for name, t in model.state_dict().items()}, model)


def adapter_config(model: torch.nn.Module) -> dict:
    """The adapter's `adapter_config.json` contents (JSON-safe, peft format)."""
    config = _lora_config(model).to_dict()
    config["target_modules"] = sorted(config["target_modules"] or [])
    # peft keeps some name lists as sets (target_parameters for a mixture of experts).
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    config["peft_type"] = "LORA"
    config.pop("runtime_config", None)
    return config


def write_adapter_dir(path: str, adapter: dict[str, torch.Tensor], config: dict) -> None:
    """A peft adapter directory (adapter_config.json + adapter_model.safetensors),
    written under a temporary name then renamed, so a reader never sees half of it."""
    parent = os.path.dirname(path) or "."
    tmp = tempfile.mkdtemp(prefix=".adapter-", dir=parent)
    with open(os.path.join(tmp, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    save_file({k: v.contiguous() for k, v in adapter.items()}, os.path.join(tmp, "adapter_model.safetensors"))
    if os.path.exists(path):
        shutil.rmtree(path)
    os.rename(tmp, path)
