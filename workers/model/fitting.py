"""Settings that fit a checkpoint's size, beside the ones the presets assume.

The presets' defaults are the built-in tiny model's: a learning rate of 1e-3, 8 new
tokens, float32. A user's checkpoint of hundreds of millions of parameters or more wants
what the field runs such models with: TRL's `GRPOConfig` and verl's actor default to a
learning rate of 1e-6; bf16 on GPUs; completions of hundreds of tokens. A launch keeps
what it was given (a config is the user's to set) and answers these beside it.

    parameters          trainer.lr   on GPUs: trainer.dtype, inference.dtype   inference.max_new_tokens
    < 100M (tiny)       as given     as given                                  as given
    100M - 10B          1e-6         bfloat16                                  256 (at most a quarter of the context)
    ≥ 10B               5e-7         bfloat16                                  256 (at most a quarter of the context)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from workers.model.loading import meta_model, model_config, model_dims

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig

SMALLEST = 100_000_000  # below it, the tiny model's settings are the ones that work
LARGE = 10_000_000_000
NEW_TOKENS = 256


@dataclass(frozen=True)
class Fit:
    """One setting: the config's value, the one that suits the model, and why."""

    field: str
    current: Any
    suggested: Any
    why: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def size(params: int) -> str:
    return f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"


def fits(cfg: RunConfig, params: int, positions: int | None) -> list[Fit]:
    """The settings of `cfg` that do not suit a model of `params` parameters and
    `positions` positions (None: no limit of its own)."""
    if params < SMALLEST:
        return []
    out = []
    lr = 5e-7 if params >= LARGE else 1e-6
    if cfg.trainer.lr > 10 * lr:
        out.append(
            Fit(
                "trainer.lr",
                cfg.trainer.lr,
                lr,
                f"a {size(params)}-parameter model: TRL's GRPOConfig and verl's actor default to 1e-6 at this "
                f"size; {cfg.trainer.lr:g} is the tiny model's and moves a pretrained policy far in a step",
            )
        )
    if cfg.placement.devices == "gpu":
        for field, value in (("trainer.dtype", cfg.trainer.dtype), ("inference.dtype", cfg.inference.dtype)):
            if value == "float32":
                out.append(Fit(field, value, "bfloat16", "on GPUs the field trains and serves such models in bf16"))
    budget = NEW_TOKENS if positions is None else min(NEW_TOKENS, positions // 4)
    if cfg.inference.max_new_tokens < budget // 2:
        out.append(
            Fit(
                "inference.max_new_tokens",
                cfg.inference.max_new_tokens,
                budget,
                "completions of such models run to hundreds of tokens; "
                f"{cfg.inference.max_new_tokens} cuts them off and scores the cut",
            )
        )
    return out


def checkpoint_fits(cfg: RunConfig, model_dir: str) -> list[Fit]:
    """`fits` for the checkpoint in `model_dir`, its size read from its config alone (the
    model built on the meta device: no weights are read)."""
    params = sum(p.numel() for p in meta_model(model_dir).parameters())
    return fits(cfg, params, model_dims(model_config(model_dir)).positions)
