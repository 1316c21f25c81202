"""docs/metrics.md's table of series, generated from the metric vocabulary.

    .venv/bin/python -m workers.core.metric_reference --write   # rewrite the table in docs/metrics.md
    .venv/bin/python -m workers.core.metric_reference           # print the page

Every series of `workers.core.metric_names.METRICS`, in its order, with its unit, meaning, the
condition under which a run reports it, and the name TRL's `GRPOTrainer` and verl's
`RayPPOTrainer` log the same figure under (`PEER_NAMES`). The page's prose is written by
hand around the table, which sits between the two `MARKERS`; tests/test_metric_reference.py
fails when the table there differs from what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from workers.core.metric_names import METRICS, Metric

PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
COMMAND = ".venv/bin/python -m workers.core.metric_reference --write"
MARKERS = (
    "<!-- The table is generated from workers/core/metric_names.py; do not edit it by hand. Regenerate with:\n"
    f"     {COMMAND} -->",
    "<!-- end of the generated table -->",
)
PEERS = ("TRL", "verl")

# The same figure under the peers' names: what TRL's GRPOTrainer logs and what verl's
# RayPPOTrainer logs. Only figures that mean the same thing; the others have none.
PEER_NAMES: dict[str, dict[str, str]] = {
    "reward/mean": {"TRL": "reward", "verl": "critic/score/mean"},
    "reward/std": {"TRL": "reward_std"},
    "reward/zero_std_frac": {"TRL": "frac_reward_zero_std"},
    "completion/length_mean": {"TRL": "completions/mean_length", "verl": "response_length/mean"},
    "completion/length_min": {"TRL": "completions/min_length", "verl": "response_length/min"},
    "completion/length_max": {"TRL": "completions/max_length", "verl": "response_length/max"},
    "completion/clipped_frac": {"TRL": "completions/clipped_ratio", "verl": "response_length/clip_ratio"},
    "loss": {"TRL": "loss", "verl": "actor/pg_loss"},
    "ppo/clipped_frac": {"TRL": "clip_ratio/region_mean", "verl": "actor/pg_clipfrac"},
    "ppo/clipped_low_frac": {"TRL": "clip_ratio/low_mean"},
    "ppo/clipped_high_frac": {"TRL": "clip_ratio/high_mean"},
    "is/ratio_mean": {"TRL": "sampling/importance_sampling_ratio/mean"},
    "loss/kl_ref": {"TRL": "kl", "verl": "actor/kl_loss"},
    "policy/entropy": {"TRL": "entropy", "verl": "actor/entropy"},
    "trainer/grad_norm": {"TRL": "grad_norm", "verl": "actor/grad_norm"},
    "trainer/lr": {"TRL": "learning_rate", "verl": "actor/lr"},
    "trainer/step_s": {"verl": "timing_s/step"},
}


class MarkersMissing(ValueError):
    def __init__(self) -> None:
        super().__init__(
            f"{PAGE.name} has lost the markers around its generated table; put these two lines where the table "
            f"goes, then run {COMMAND}:\n{MARKERS[0]}\n{MARKERS[1]}"
        )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _name(metric: Metric) -> str:
    return f"`{metric.name}/<rank>`" if metric.per_rank else f"`{metric.name}`"


def _peer(metric: Metric, peer: str) -> str:
    name = PEER_NAMES.get(metric.name, {}).get(peer)
    return f"`{name}`" if name else "—"


def table() -> str:
    """The generated table, markers included."""
    lines = [
        MARKERS[0],
        "",
        "| Rollway | unit | what it is | reported | TRL (`GRPOTrainer`) | verl |",
        "|---|---|---|---|---|---|",
    ]
    for m in METRICS:
        reported = f"with {m.only}" if m.only else "always"
        if m.per_rank:
            reported += ", one series per trainer rank"
        cells = [_name(m), m.unit or "—", _cell(m.help), _cell(reported), _peer(m, "TRL"), _peer(m, "verl")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", MARKERS[1]])


def render(page: str) -> str:
    """`page` (docs/metrics.md as it is) with its generated table as it should read now."""
    start, end = page.find(MARKERS[0]), page.find(MARKERS[1])
    if start < 0 or end < start:
        raise MarkersMissing()
    return page[:start] + table() + page[end + len(MARKERS[1]) :]


def main(argv: list[str]) -> int:
    if argv not in ([], ["--write"]):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        page = render(PAGE.read_text())
    except MarkersMissing as e:
        print(e, file=sys.stderr)
        return 1
    if argv == ["--write"]:
        PAGE.write_text(page)
        print(f"wrote {PAGE}")
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
