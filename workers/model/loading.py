"""The policy model: the tiny Llama built from `ModelConfig`, or any Hugging Face causal
LM from a local directory (or the Hub), always handled as a Hugging Face directory.

The directory format is the one thing every backend shares: `config.json` + safetensors
weights under checkpoint names, plus the tokenizer (Rollway's char tokenizer JSON for
the tiny model, the model's own Hugging Face tokenizer files otherwise). The trainer and
the torch backend load it with transformers / safetensors, vLLM from the same files.

`model_dir_problem` is the check a directory passes before a run may use it (at launch,
and again in the driver): a model directory, with weights, of a causal LM, with a
tokenizer that fits its embedding. transformers is imported inside the functions that
need it: the platform imports this module only to check a directory.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, cast

from workers.core.hub import HubRefused, metadata_dir, offline, repo_info
from workers.model.tokenizer import TOKENIZER_FILE, CharTokenizer, HFTokenizer, Tokenizer

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM, PretrainedConfig, PreTrainedModel

    from workers.config.run_config import ModelConfig

# What a model directory's weights may be called (single file, or sharded with an index).
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json")
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"


def _quiet() -> None:
    # Progress bars from every save/load would flood the run logs.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def build_tiny(model_cfg: ModelConfig, tokenizer: CharTokenizer, seed: int) -> LlamaForCausalLM:
    """A freshly initialised Llama of the configured size (deterministic from `seed`)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=model_cfg.num_heads,
        max_position_embeddings=model_cfg.max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_id,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.float()


def load_model(model_dir: str, dtype: str = "float32", dropout: bool = True) -> PreTrainedModel:
    """Load a Hugging Face causal LM directory in eval mode, on the CPU, in `dtype`
    ("float32", "bfloat16", or "auto": the checkpoint's own); `dropout=False`: every
    dropout probability its config names set to 0 (`without_dropout`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    _quiet()
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        raise FileNotFoundError(
            f"{model_dir} is not a Hugging Face model directory (no config.json); model.path must point at one"
        )
    kwargs = {} if dropout else {"config": without_dropout(AutoConfig.from_pretrained(model_dir))}
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype if dtype == "auto" else getattr(torch, dtype), **kwargs
    )
    if not dropout:
        # A module built with a literal rate its config does not name still drops.
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    return model.eval()


def without_dropout(config: PretrainedConfig) -> PretrainedConfig:
    """`config` with every dropout probability at 0: the float attributes whose name says
    dropout (attention_dropout, hidden_dropout, …) or GPT-2's `*_pdrop`, of the config and
    of its text config. Read from the config itself, as each family names its own: a
    model copies them into its modules when it is built, so they must be 0 before."""
    for part in {id(c): c for c in (config, config.get_text_config())}.values():
        for name, value in list(vars(part).items()):
            if isinstance(value, float) and ("dropout" in name or name.endswith("pdrop")):
                setattr(part, name, 0.0)
    return config


def save_model(model: PreTrainedModel, tokenizer: Tokenizer, model_dir: str) -> None:
    """Write `model_dir` as config.json + model.safetensors + the tokenizer's files.

    With a Hugging Face tokenizer, config.json and generation_config.json name every
    stop id as eos_token_id and the pad id the engine uses: the backends stop where the
    tokenizer says a completion ends, and so does `generate` on the saved directory."""
    _quiet()
    os.makedirs(model_dir, exist_ok=True)
    if isinstance(tokenizer, HFTokenizer):
        stops = tokenizer.stop_ids
        eos = stops[0] if len(stops) == 1 else stops
        for config in (model.config, model.generation_config):
            config.eos_token_id = eos
            config.pad_token_id = tokenizer.pad_id
    model.save_pretrained(model_dir)
    tokenizer.save(model_dir)


def checkpoint_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights under HF checkpoint names, as contiguous detached CPU tensors (a copy),
    each tied weight once (`untied`)."""
    return {name: t.detach().to("cpu").contiguous().clone() for name, t in untied(model.state_dict(), model).items()}


def tied_weight_names(model: torch.nn.Module) -> set[str]:
    """Names in `model`'s state dict that are another weight under a second name (an
    output layer tied to the embedding): transformers' own map of them
    (`all_tied_weights_keys`, target → source), which `save_pretrained` leaves out of
    the file. Empty for an untied model; a peft model answers for its base."""
    get_base_model = getattr(model, "get_base_model", None)
    base = get_base_model() if callable(get_base_model) else model
    return set(getattr(base, "all_tied_weights_keys", None) or ())


def untied(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`state` (checkpoint names) as the checkpoint stores it: a tied weight once, under
    its source's name. Every checksum, sync, export and adapter base compares and moves
    this form, so a model's state and its own model.safetensors agree."""
    tied = tied_weight_names(model)
    return {k: v for k, v in state.items() if k not in tied} if tied else state


def checkpoint_weights(model_dir: str) -> dict[str, torch.Tensor]:
    """The weights of a model directory under checkpoint names, read from its files: one
    model.safetensors, or the shards its model.safetensors.index.json names (how every
    checkpoint past a few GB ships); any other format through transformers.

    safetensors reads one file, and transformers' loaders fill a model rather than
    return a dict: building a model to read its weights would hold them twice."""
    from safetensors.torch import load_file

    single = os.path.join(model_dir, SAFETENSORS_FILE)
    if os.path.isfile(single):
        return load_file(single)
    index = os.path.join(model_dir, SAFETENSORS_INDEX)
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            weights.update(load_file(os.path.join(model_dir, shard)))
        return weights
    model = load_model(model_dir)
    return saved_form({k: t.detach() for k, t in model.state_dict().items()}, model)


def live_weights(model_dir: str) -> dict[str, torch.Tensor]:
    """The directory's weights as a model loaded from it holds them (`load_model`):
    under the names of its modules, which transformers may rename or fuse from the
    checkpoint's on load, each tied weight once. Sharded or not, any format."""
    model = load_model(model_dir)
    return {k: t.detach() for k, t in untied(model.state_dict(), model).items()}


def saved_form(state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`state` (a model's own names, as `untied` leaves them) under the names and
    layout its checkpoint files use, what a loader of checkpoint files (vLLM) takes:
    transformers' own reversal of its load-time conversions, as save_pretrained does
    it. `model` may be on the meta device: only its conversions are read."""
    from transformers.core_model_loading import revert_weight_conversion

    get_base_model = getattr(model, "get_base_model", None)  # a peft model's conversions are its base's
    base = get_base_model() if callable(get_base_model) else model
    return revert_weight_conversion(cast("PreTrainedModel", base), untied(state, model))


def meta_model(model_dir: str) -> PreTrainedModel:
    """A model of the directory's architecture on the meta device: its modules and
    names, no weights allocated."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(model_config(model_dir))


# -- the model's sizes, as transformers reads them ------------------------------------


@dataclass(frozen=True)
class ModelDims:
    """A causal LM's sizes, read through its transformers config class: each class maps
    the common names onto its own (GPT-2's n_embd, n_positions, …; a multimodal
    checkpoint's language model is its `get_text_config()`)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    # The most positions it takes; None for a model without a limit of its own.
    positions: int | None
    tied: bool

    @property
    def kv_bytes_per_token(self) -> int:
        """float32 keys and values of one token in every layer."""
        return self.layers * 2 * self.kv_heads * self.head_dim * 4


# Beside a built policy (workers/train/warmstart.py): its `ModelDims`, worked out through
# its transformers config class when it was built. A process that needs only the sizes
# (the torch backend's inference worker) reads them here instead of importing that class,
# which in transformers 5.19 imports the library's modeling machinery with it (torch's
# compiler and distributed tensors among it): `LlamaConfig` alone cost 0.97 s of CPU in a
# fresh worker that had torch and Ray imported.
DIMS_FILE = "rollway_dims.json"


def write_dims(model_dir: str, config: PretrainedConfig) -> None:
    """Keep `model_dims(config)` beside the model in `model_dir` (`dims_of` reads it)."""
    with open(os.path.join(model_dir, DIMS_FILE), "w") as f:
        json.dump(asdict(model_dims(config)), f)


def dims_of(model_dir: str) -> ModelDims:
    """`model_dims(model_config(model_dir))`, read from the directory's DIMS_FILE where it
    has a readable one."""
    try:
        with open(os.path.join(model_dir, DIMS_FILE)) as f:
            return ModelDims(**json.load(f))
    except (OSError, ValueError, TypeError):  # none, or not what write_dims writes
        return model_dims(model_config(model_dir))


def model_config(model_dir: str) -> PretrainedConfig:
    """The directory's config as its transformers config class reads it."""
    from transformers import AutoConfig

    _quiet()
    return AutoConfig.from_pretrained(model_dir)


def model_dims(config: PretrainedConfig) -> ModelDims:
    """The sizes of a model of `config` (`model_config`), the way transformers reads them
    for its architecture."""
    text = config.get_text_config()
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    positions = getattr(text, "max_position_embeddings", None)
    return ModelDims(
        hidden=hidden,
        layers=int(text.num_hidden_layers),
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        # GPT-2 leaves its MLP width unset (n_inner): four times the hidden size.
        intermediate=int(getattr(text, "intermediate_size", None) or 4 * hidden),
        vocab=int(text.vocab_size),
        positions=int(positions) if positions else None,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
    )


# -- is this directory a model a run can use? ------------------------------------------


def has_weights(model_dir: str) -> bool:
    """Whether the directory holds weights in any form a loader reads (one file or shards)."""
    return any(glob.glob(os.path.join(model_dir, pattern)) for pattern in WEIGHT_PATTERNS)


def _vocab_size(config: dict) -> int | None:
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if isinstance(size, int) else None


def causal_lm_problem(config: dict) -> str | None:
    """Why a config.json's model is not one AutoModelForCausalLM loads, or None."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    model_type = config.get("model_type")
    if archs:
        if any(a in causal for a in archs):
            return None
        what = ", ".join(archs)
    elif model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return None
    else:
        what = f"model_type {model_type!r}" if model_type else "a model with neither architectures nor model_type"
    return (
        f"holds {what}, not a causal language model: Rollway post-trains models that "
        "AutoModelForCausalLM loads (…ForCausalLM, …LMHeadModel)"
    )


def tokenizer_problem(model_dir: str, config: dict) -> str | None:
    """Why the directory's tokenizer cannot drive its model, or None: it cannot be
    loaded, names no EOS, or has more tokens than the model's embedding has rows."""
    if os.path.exists(os.path.join(model_dir, TOKENIZER_FILE)):
        try:
            size = CharTokenizer.load(model_dir).vocab_size
        except (OSError, ValueError, KeyError) as exc:
            return f"has a Rollway char tokenizer ({TOKENIZER_FILE}) that cannot be read ({exc})"
    else:
        try:
            size = HFTokenizer.load(model_dir).vocab_size
        except ValueError as exc:
            return f"has a tokenizer Rollway cannot use: {exc}"
        except Exception as exc:  # transformers raises anything from OSError to TypeError here
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            return (
                "has no tokenizer AutoTokenizer can load (tokenizer.json / tokenizer_config.json, or "
                f"tokenizer.model): save the model's tokenizer next to it ({first})"
            )
    vocab = _vocab_size(config)
    if vocab is not None and size > vocab:
        return (
            f"has a tokenizer of {size} tokens but a model whose embedding has {vocab} rows (vocab_size): "
            f"ids from {vocab} up would index past it; the tokenizer must be the one the model was trained with"
        )
    return None


def model_dir_problem(model_dir: str, *, check_weights: bool = True) -> str | None:
    """Why `model_dir` cannot be a run's policy, as the end of a sentence about it, or
    None. In order: not a Hugging Face model directory (no config.json; the words the
    run's failure explanation looks for), a config that does not parse, no weights, not
    a causal LM, a tokenizer missing or larger than the model's vocabulary."""
    config_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(config_path):
        return "is not a Hugging Face model directory (no config.json in it)"
    try:
        with open(config_path) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        return f"is not a Hugging Face model directory: its model config cannot be read as JSON ({exc})"
    if not isinstance(config, dict):
        return "is not a Hugging Face model directory: its model config is not a JSON object"
    if check_weights and not has_weights(model_dir):
        return (
            "has no weights (model.safetensors, sharded *.safetensors or pytorch_model.bin): "
            "point model.path at a complete Hugging Face model directory"
        )
    return causal_lm_problem(config) or tokenizer_problem(model_dir, config)


# -- the Hub -------------------------------------------------------------------------------


def _hub_offline() -> bool:
    return offline()


def hub_problem(hub_id: str, field: str = "model.hub_id") -> str | None:
    """Why the Hub model `hub_id` cannot be a run's policy, or None. Reads its file list
    and its config and tokenizer files (workers/core/hub.py: never its weights, never any
    other file), and checks them as `model_dir_problem` checks a directory. A Hub that
    does not answer raises workers.core.hub.HubUnavailable."""
    local_hint = (
        "download it where the site can read it (huggingface-cli download "
        f"{hub_id} --local-dir <a directory under ROLLWAY_MODEL_ROOTS>) and use model.source='path'"
    )
    if _hub_offline():
        return f"cannot fetch {hub_id!r}: this site is offline (HF_HUB_OFFLINE is set); {local_hint}"
    try:
        info = repo_info(hub_id, field)
    except HubRefused as exc:
        return exc.message
    files = [s.rfilename for s in info.siblings or []]
    if "config.json" not in files:
        return f"{hub_id!r} on the Hub is not a Hugging Face model (no config.json in it)"
    if not any(f.endswith(".safetensors") or (f.startswith("pytorch_model") and f.endswith(".bin")) for f in files):
        return f"{hub_id!r} on the Hub has no weights (*.safetensors or pytorch_model.bin)"
    try:
        local = metadata_dir(hub_id, field, info)
    except HubRefused as exc:
        return exc.message
    problem = model_dir_problem(local, check_weights=False)
    return f"{hub_id!r} {problem}" if problem else None


def hub_metadata_dir(hub_id: str) -> str:
    """A local directory with the Hub model's config and tokenizer (no weights), from
    the Hugging Face cache: what sizing a run needs."""
    return metadata_dir(hub_id, "model.hub_id")


def source_dir(model_cfg: ModelConfig) -> str:
    """The local directory of the run's base model: `model.path`, or the Hub model
    downloaded whole into the Hugging Face cache (every later load, by the trainer,
    the warm start and the inference workers, reads that one copy)."""
    if model_cfg.source == "hub":
        from huggingface_hub import snapshot_download

        if not model_cfg.hub_id:
            raise ValueError("model.hub_id is required when model.source is 'hub'")
        if _hub_offline():
            raise OSError(f"model.hub_id {model_cfg.hub_id!r}: this site is offline (HF_HUB_OFFLINE is set)")
        return snapshot_download(model_cfg.hub_id)
    if not model_cfg.path:
        raise ValueError("model.path is required when model.source is 'path'")
    return model_cfg.path
