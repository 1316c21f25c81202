"""The launch form's config controls, compiled from the run config's JSON schema.

One control per config field, in a group per axis (`CONTROL_GROUPS`); a control's kind,
choices and bounds come from its field's schema, so a field added to workers/config/run_config.py
gets a control without an edit here, and a field no control can show is refused when the
controls are built. The controls post nothing themselves: launch.js keeps the overrides
JSON in step with them.
"""

from __future__ import annotations

from functools import cache

from django.utils.text import slugify

from workers.config.run_config import SCHEMA_BOUNDS, json_schema, schema_node
from workers.rl_tasks import BUILTINS

# The control groups, one per axis, in the order shown: (title, config paths). "section.*"
# is every field of the section that no earlier entry placed. Sections left out
# (warm_start) are edited in the overrides JSON only.
CONTROL_GROUPS: list[tuple[str, list[str]]] = [
    ("Orchestration", ["mode"]),
    # The buffer's unit and overcommit decide what it holds: with its mode and capacity.
    ("Buffer", ["buffer.mode", "buffer.capacity", "buffer.unit", "buffer.overcommit"]),
    ("Staleness", ["buffer.max_staleness", "buffer.on_stale", "buffer.max_head_offpolicyness", "buffer.*"]),
    ("IS correction", ["correction.method", "trainer.tis_cap", "correction.*"]),
    # The objective's knobs users bring from TRL and verl (docs/concepts.md, "The algorithm's knobs").
    (
        "Algorithm",
        [
            "trainer.kl_coef",
            "trainer.kl_estimator",
            "trainer.loss_aggregation",
            "trainer.loss_constant",
            "trainer.advantage_scaling",
            "trainer.clip_eps",
            "trainer.clip_eps_high",
            "trainer.mask_truncated",
            "trainer.disable_dropout",
            "trainer.dynamic_sampling",
            "trainer.dynamic_sampling_max_batches",
            "inference.top_k",
            "inference.top_p",
            "inference.min_p",
        ],
    ),
    ("Weight sync", ["sync.protocol", "sync.update_mode", "sync.*"]),
    ("LoRA", ["lora.*"]),
    ("Inference backend", ["inference.backend", "inference.*"]),
    # Where the policy comes from first; the size fields after them apply to `tiny` only.
    ("Model", ["model.source", "model.path", "model.hub_id", "model.*"]),
    # task.options is an object, each task's own, and task.reward_weights a list of
    # numbers: edited in the overrides JSON only. The dataset's fields are controls
    # although the section is unset in every preset: a value typed there creates it.
    (
        "Task",
        [
            "task.name",
            "task.dataset.*",
            "task.reward_funcs",
            "task.min_len",
            "task.max_len",
            "task.alphabet",
            "task.reward",
        ],
    ),
    # The reward stage: who scores the rollouts, and when (docs/rewards.md).
    ("Rewards", ["rewards.workers", "rewards.mode", "rewards.*"]),
    ("Trainer", ["trainer.*"]),
    # Devices per pool are in the inference, trainer and rewards groups; where the pools go, here.
    ("Placement", ["placement.*"]),
    ("Eval", ["eval.*"]),
    ("Checkpoints", ["checkpoint.*"]),
    # Deadlines on the actors' waits (docs/reliability.md, "Hangs: the watchdog").
    ("Watchdog", ["watchdog.*"]),
    ("Stop", ["stop.*"]),
    ("Seed", ["seed"]),
]

# Free-text fields offered with their usual values: a select of these plus "other", whose
# text box takes anything else (a task in the user's package, "package.module:Class").
SUGGESTIONS: dict[str, list[str]] = {"task.name": list(BUILTINS)}


def _section(schema: dict, node: dict) -> tuple[dict, bool]:
    """`node` with a section's $ref resolved, also that of a section that may be null
    (`anyOf` [its $ref, null]: unset, as task.dataset is by default), and whether it
    may be null. Any other field comes back as it is (`field_control` reads it)."""
    if not any("$ref" in o for o in [node, *node.get("anyOf", [])]):
        return node, False
    return schema_node(schema, node)


def schema_field(schema: dict, path: str) -> tuple[dict, bool]:
    """The JSON schema of the config field (or section, resolved) at dotted `path`, and
    whether a section on the way may be null; KeyError naming the path if the config
    has no such field."""
    node, in_optional = schema, False
    for part in path.split("."):
        properties = node.get("properties", {})
        if part not in properties:
            raise KeyError(f"the run config has no field {path!r}")
        parent_optional = in_optional
        node, optional = _section(schema, properties[part])
        in_optional = parent_optional or optional
    return node, parent_optional


def field_control(path: str, field: dict, in_optional: bool = False) -> dict:
    """One form control for a config field, from its JSON schema: enums → select,
    booleans → checkbox, integers and numbers → number input with the schema's bounds,
    lists of strings → comma-separated text, strings → text, or a select of their usual
    values plus free text (`SUGGESTIONS`). A field that may be null ("unset") takes an
    empty value for it. A field of a section that may be null (`in_optional`) is empty
    while the section is unset, its default shown as the placeholder; launch.js drops
    an emptied one from the overrides."""
    spec, nullable = schema_node({}, field)
    if "anyOf" in spec:
        raise ValueError(f"{path}: no form control for a field of several types ({field})")
    control = {
        "path": path,
        "id": "cfg-" + path.replace(".", "-"),
        "label": path.rsplit(".", 1)[-1],
        "help": field.get("description", ""),
        "nullable": nullable,
        "optional": in_optional,
        "bounds": "",
    }
    control["placeholder"] = "unset" if control["nullable"] else ""
    if in_optional:
        control["placeholder"] = f"default: {field['default']}" if field.get("default") is not None else "not set"
    kind = spec.get("type")
    if path in SUGGESTIONS:
        control.update(kind="choice", options=SUGGESTIONS[path])
    elif "enum" in spec or "const" in spec:
        control.update(kind="select", options=spec.get("enum") or [spec["const"]])
    elif kind == "boolean":
        control["kind"] = "checkbox"
    elif kind in ("integer", "number"):
        # HTML's min/max are inclusive: an exclusive bound is said in words only.
        limits = [(word, spec[key]) for key, word in SCHEMA_BOUNDS if key in spec]
        control.update(
            kind=kind,
            min=spec.get("minimum"),
            max=spec.get("maximum"),
            step="1" if kind == "integer" else "any",
            bounds=", ".join(f"{word} {value}" for word, value in limits if abs(value) < 2**53),
        )
    elif kind == "array" and spec.get("items", {}).get("type") == "string":
        control.update(kind="list", bounds="comma-separated")
    elif kind == "string":
        control["kind"] = "text"
    else:
        raise ValueError(f"{path}: no form control for schema {spec}")
    return control


@cache
def config_controls() -> tuple[dict, ...]:
    """The launch form's control groups (`CONTROL_GROUPS`), each control described from
    the run config's JSON schema (`field_control`)."""
    schema = json_schema()
    placed: set[str] = set()
    groups = []
    for title, entries in CONTROL_GROUPS:
        paths = []
        for entry in entries:
            if entry.endswith(".*"):
                section = entry.removesuffix(".*")
                fields = schema_field(schema, section)[0]["properties"]
                paths += [f"{section}.{name}" for name in fields if f"{section}.{name}" not in placed]
            elif entry not in placed:
                paths.append(entry)
            placed.update(paths)
        groups.append(
            {
                "title": title,
                "id": "axis-" + slugify(title),
                "controls": [field_control(path, *schema_field(schema, path)) for path in paths],
            }
        )
    return tuple(groups)


def controls_with_errors(errors: dict[str, str]) -> tuple[list[dict], dict[str, str]]:
    """The control groups with each config error beside its control, and the errors no
    control shows (they go beside the overrides box)."""
    groups = [
        {**group, "controls": [{**control, "error": errors.get(control["path"], "")} for control in group["controls"]]}
        for group in config_controls()
    ]
    shown = {control["path"] for group in groups for control in group["controls"]}
    return groups, {field: message for field, message in errors.items() if field not in shown}
