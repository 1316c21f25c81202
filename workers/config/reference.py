"""docs/config.md, the run config's reference, generated from `RunConfig`'s JSON schema.

    .venv/bin/python -m workers.config.reference --write   # rewrite docs/config.md
    .venv/bin/python -m workers.config.reference           # print the page

One table per config section: every field by its dotted name (`trainer.lr`), its type,
default, bounds, description, and the name TRL, verl or peft give the same knob where
they have one (`PEER_NAMES`). tests/test_config_reference.py fails when docs/config.md
differs from what this writes, or when a field or section has no description.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from workers.config import capabilities
from workers.config.run_config import SCHEMA_BOUNDS, RunConfig, json_schema, schema_node

PAGE = Path(__file__).resolve().parents[2] / "docs" / "config.md"
COMMAND = ".venv/bin/python -m workers.config.reference --write"

# The same knob under the peers' names: TRL's GRPOConfig (and its TrainingArguments and
# ModelConfig), verl's YAML config as full dotted paths, peft's LoraConfig. Only knobs
# that mean the same thing; where the semantics differ, the field's description says so.
PEER_NAMES: dict[str, dict[str, str]] = {
    "seed": {"TRL": "seed"},
    "model.path": {"TRL": "model_name_or_path", "verl": "actor_rollout_ref.model.path"},
    "model.hub_id": {"TRL": "model_name_or_path", "verl": "actor_rollout_ref.model.path"},
    "task.dataset.path": {"verl": "data.train_files"},
    "task.dataset.eval_path": {"verl": "data.val_files"},
    "task.dataset.prompt_column": {"verl": "data.prompt_key"},
    "inference.backend": {"TRL": "use_vllm", "verl": "actor_rollout_ref.rollout.name"},
    "correction.keep_routing": {"verl": "actor_rollout_ref.actor.router_replay.mode=R3"},
    "inference.tensor_parallel_size": {
        "TRL": "vllm_tensor_parallel_size",
        "verl": "actor_rollout_ref.rollout.tensor_model_parallel_size",
    },
    "inference.max_new_tokens": {"TRL": "max_completion_length", "verl": "data.max_response_length"},
    "inference.temperature": {"TRL": "temperature", "verl": "actor_rollout_ref.rollout.temperature"},
    "inference.top_k": {"TRL": "top_k", "verl": "actor_rollout_ref.rollout.top_k"},
    "inference.top_p": {"TRL": "top_p", "verl": "actor_rollout_ref.rollout.top_p"},
    "inference.min_p": {"TRL": "min_p"},
    "inference.gpu_memory_utilization": {
        "TRL": "vllm_gpu_memory_utilization",
        "verl": "actor_rollout_ref.rollout.gpu_memory_utilization",
    },
    "inference.dtype": {"verl": "actor_rollout_ref.rollout.dtype"},
    "inference.enforce_eager": {"verl": "actor_rollout_ref.rollout.enforce_eager"},
    "inference.max_num_seqs": {"verl": "actor_rollout_ref.rollout.max_num_seqs"},
    "inference.max_num_batched_tokens": {"verl": "actor_rollout_ref.rollout.max_num_batched_tokens"},
    "inference.enable_chunked_prefill": {"verl": "actor_rollout_ref.rollout.enable_chunked_prefill"},
    "buffer.max_staleness": {"TRL": "max_staleness"},
    "buffer.max_head_offpolicyness": {"TRL": "max_inflight_tasks", "verl": "async_training.staleness_threshold"},
    "trainer.lr": {"TRL": "learning_rate", "verl": "actor_rollout_ref.actor.optim.lr"},
    "trainer.backend": {"verl": "actor_rollout_ref.actor.strategy"},
    "trainer.batch_groups": {"verl": "data.train_batch_size"},
    "trainer.group_size": {"TRL": "num_generations", "verl": "actor_rollout_ref.rollout.n"},
    "trainer.clip_eps": {"TRL": "epsilon", "verl": "actor_rollout_ref.actor.clip_ratio"},
    "trainer.clip_eps_high": {"TRL": "epsilon_high", "verl": "actor_rollout_ref.actor.clip_ratio_high"},
    "trainer.kl_coef": {"TRL": "beta", "verl": "actor_rollout_ref.actor.kl_loss_coef"},
    "trainer.kl_estimator": {"verl": "actor_rollout_ref.actor.kl_loss_type"},
    "trainer.loss_aggregation": {"TRL": "loss_type", "verl": "actor_rollout_ref.actor.loss_agg_mode"},
    "trainer.loss_constant": {"TRL": "max_completion_length"},
    "trainer.advantage_scaling": {"TRL": "scale_rewards", "verl": "algorithm.norm_adv_by_std_in_grpo"},
    "trainer.mask_truncated": {"TRL": "mask_truncated_completions"},
    "trainer.disable_dropout": {"TRL": "disable_dropout"},
    "trainer.dynamic_sampling": {"verl": "algorithm.filter_groups.enable"},
    "trainer.dynamic_sampling_max_batches": {"verl": "algorithm.filter_groups.max_num_gen_batches"},
    "trainer.tis_cap": {"TRL": "vllm_importance_sampling_cap"},
    "trainer.max_grad_norm": {"TRL": "max_grad_norm", "verl": "actor_rollout_ref.actor.grad_clip"},
    "trainer.weight_decay": {"TRL": "weight_decay", "verl": "actor_rollout_ref.actor.optim.weight_decay"},
    "trainer.entropy_coef": {"verl": "actor_rollout_ref.actor.entropy_coeff"},
    "trainer.micro_batch_rows": {"verl": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"},
    "trainer.gradient_checkpointing": {
        "TRL": "gradient_checkpointing",
        "verl": "actor_rollout_ref.model.enable_gradient_checkpointing",
    },
    "trainer.dtype": {"TRL": "bf16"},
    "sync.bucket_mb": {"verl": "actor_rollout_ref.rollout.update_weights_bucket_megabytes"},
    "lora.enabled": {"TRL": "use_peft"},
    "lora.rank": {"peft": "r", "verl": "actor_rollout_ref.model.lora_rank"},
    "lora.alpha": {"peft": "lora_alpha", "verl": "actor_rollout_ref.model.lora_alpha"},
    "lora.target_modules": {"peft": "target_modules", "verl": "actor_rollout_ref.model.target_modules"},
    "lora.dropout": {"peft": "lora_dropout"},
    "stop.max_steps": {"TRL": "max_steps", "verl": "trainer.total_training_steps"},
    "eval.every_steps": {"TRL": "eval_steps", "verl": "trainer.test_freq"},
    "checkpoint.every_steps": {"TRL": "save_steps", "verl": "trainer.save_freq"},
    "checkpoint.keep_last": {"TRL": "save_total_limit", "verl": "trainer.max_actor_ckpt_to_keep"},
}
PEERS = ("TRL", "verl", "peft")


@dataclass(frozen=True)
class ConfigField:
    """One config field: its dotted path and its JSON schema (a nullable field's
    schema is its non-null choice, with `nullable` set)."""

    path: str
    schema: dict
    nullable: bool
    description: str


@dataclass(frozen=True)
class Section:
    """A config section (`trainer`, `task.dataset`; "" for the top level): its
    description and its fields, in the config's order."""

    path: str
    description: str
    fields: list[ConfigField]


def _is_section(node: dict) -> bool:
    return node.get("type") == "object" and "properties" in node


def sections(schema: dict | None = None) -> list[Section]:
    """Every section of the run config, the top level first, each nested section right
    after the one that holds it."""
    root = schema if schema is not None else json_schema()
    out: list[Section] = []

    def walk(path: str, node: dict, description: str) -> None:
        fields: list[ConfigField] = []
        nested: list[tuple[str, dict, str]] = []
        for name, prop in node["properties"].items():
            dotted = f"{path}.{name}" if path else name
            target, nullable = schema_node(root, prop)
            if _is_section(target):
                nested.append((dotted, target, target.get("description") or prop.get("description", "")))
            else:
                fields.append(ConfigField(dotted, target, nullable, prop.get("description", "")))
        out.append(Section(path, description, fields))
        for dotted, target, text in nested:
            walk(dotted, target, text)

    walk("", root, root.get("description", ""))
    return out


def undescribed(schema: dict | None = None) -> list[str]:
    """The dotted paths of the fields and sections that have no description."""
    missing = []
    for section in sections(schema):
        if section.path and not section.description.strip():
            missing.append(section.path)
        missing += [f.path for f in section.fields if not f.description.strip()]
    return missing


# -- rendering -----------------------------------------------------------------------


def _text(text: str) -> str:
    """One line of a table cell: whitespace collapsed, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _number(value: float) -> str:
    if isinstance(value, int) and value >= 2**53 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return json.dumps(value)


def _type(f: ConfigField) -> str:
    s = f.schema
    if "enum" in s:
        kind = " · ".join(f"`{v}`" for v in s["enum"])
    elif s.get("type") == "array":
        kind = f"list of {s.get('items', {}).get('type', 'value')}s"
    elif s.get("type") == "object":
        kind = "object"
    else:
        kind = s.get("type", "any")
    return f"{kind}, or null" if f.nullable else kind


def _default(f: ConfigField, defaults: dict) -> str:
    """The schema's default; for a default made by a factory (the schema shows none),
    the value in a default RunConfig; "required" for a field of a section that is unset
    by default and must be given when it is set."""
    if "default" in f.schema:
        value = f.schema["default"]
    else:
        value = defaults
        for part in f.path.split("."):
            if not isinstance(value, dict) or part not in value:
                return "required"
            value = value[part]
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def _bounds(f: ConfigField) -> str:
    s = f.schema
    parts = [f"{word} {_number(s[key])}" for key, word in SCHEMA_BOUNDS if key in s]
    parts += [f"length {word} {s[key]}" for key, word in [("minLength", "≥"), ("maxLength", "≤")] if key in s]
    parts += [f"items {word} {s[key]}" for key, word in [("minItems", "≥"), ("maxItems", "≤")] if key in s]
    if "pattern" in s:
        parts.append(f"matches `{s['pattern']}`")
    return _text(", ".join(parts))


def _peers(path: str) -> str:
    names = PEER_NAMES.get(path, {})
    return " · ".join(f"{peer} `{names[peer]}`" for peer in PEERS if peer in names)


def _rows(section: Section, defaults: dict) -> Iterator[str]:
    yield "| field | type | default | bounds | what it is | TRL · verl · peft |"
    yield "|---|---|---|---|---|---|"
    for f in section.fields:
        cells = [f"`{f.path}`", _type(f), _default(f, defaults), _bounds(f), _text(f.description), _peers(f.path)]
        yield "| " + " | ".join(cells) + " |"


def render(schema: dict | None = None) -> str:
    """docs/config.md as it should read now."""
    found = sections(schema)
    defaults = RunConfig().model_dump(mode="json")
    lines = [
        "# The run config, field by field",
        "",
        "<!-- Generated from workers.config.run_config.RunConfig; do not edit by hand. Regenerate with:",
        f"     {COMMAND} -->",
        "",
        "Every switch a run has, from `workers/config/run_config.py` (`RunConfig`; the same JSON schema is",
        "served at `/api/config/schema`, and the launch form's controls are built from it). Give",
        'a field as a JSON override (`{"trainer": {"lr": 3e-4}}`), on the command line',
        "(`--set trainer.lr=3e-4`), or in a saved configuration. A field may be null only where",
        "its type says so (null: unset, the behaviour its description gives). The last column is",
        "the name TRL (`GRPOConfig`), verl (its YAML config) or peft (`LoraConfig`) gives the same",
        "knob, where one exists. [concepts.md](concepts.md) explains the switches and",
        "[configuration.md](configuration.md) the presets that set them.",
        "",
        "Sections: "
        + " · ".join(
            f"[{s.path or 'top level'}](#{(s.path or 'top level').replace('.', '').replace(' ', '-')})" for s in found
        ),
    ]
    for section in found:
        title = section.path or "top level"
        lines += ["", f"## {title}", "", _text(section.description), "", *_rows(section, defaults)]
    lines += [
        "",
        "## Fields read only in some runs",
        "",
        "A launch that sets one of these (gives it other than its default) where nothing reads it",
        "is refused where the run would not be what the config says, and warned where the run is",
        "the same without it (the warning comes back beside the run in the API's answer, under",
        "`unread`, and on the launch form), naming the field and what would read it",
        "(`workers/config/capabilities.py`).",
        "",
        capabilities.markdown().rstrip("\n"),
        "",
        "Every other field is either read by every run (the module named reads it) or refused,",
        "wherever nothing reads it, by a check that runs before this table is asked: the config's",
        "own validation or the launch's.",
        "",
        capabilities.markdown_every_run().rstrip("\n"),
        "",
        capabilities.markdown_refused_elsewhere().rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv not in ([], ["--write"]):
        print(__doc__, file=sys.stderr)
        return 2
    page = render()
    if argv == ["--write"]:
        PAGE.write_text(page)
        print(f"wrote {PAGE}")
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
