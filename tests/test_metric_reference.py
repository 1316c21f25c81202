"""docs/metrics.md's table is what workers.core.metric_reference writes from the metric
vocabulary now, and the peers' names it gives are of real series."""

from __future__ import annotations

import pytest

from workers.core.metric_names import METRICS, NAMES
from workers.core.metric_reference import COMMAND, MARKERS, PAGE, PEER_NAMES, PEERS, MarkersMissing, render, table


def test_docs_metrics_md_has_the_table_the_vocabulary_gives():
    page = PAGE.read_text()
    assert page == render(page), (
        f"{PAGE.relative_to(PAGE.parents[1])} differs from what workers/core/metric_names.py gives now; "
        f"regenerate it with:\n    {COMMAND}"
    )


def test_every_series_has_one_row_and_the_prose_around_it_stays():
    page = render(PAGE.read_text())
    for m in METRICS:
        name = f"`{m.name}/<rank>`" if m.per_rank else f"`{m.name}`"
        assert sum(line.startswith(f"| {name} |") for line in page.splitlines()) == 1, m.name
    assert page.startswith("# Metric names and the peers'\n") and "\n## Experiment trackers\n" in page


def test_peer_names_are_of_real_series_and_known_peers():
    assert set(PEER_NAMES) <= NAMES, set(PEER_NAMES) - NAMES
    assert {peer for names in PEER_NAMES.values() for peer in names} <= set(PEERS)
    row = next(line for line in table().splitlines() if line.startswith("| `reward/mean` |"))
    assert row.endswith("| `reward` | `critic/score/mean` |")


def test_a_page_without_its_markers_is_refused_with_the_fix():
    with pytest.raises(MarkersMissing, match="put these two lines where the table goes"):
        render("# Metric names\n\nno table here\n")
    assert render(f"intro\n{MARKERS[0]}\nstale\n{MARKERS[1]}\noutro\n") == f"intro\n{table()}\noutro\n"
