"""docs/config.md is what workers.config.reference writes from RunConfig now, and every
config field and section says what it is."""

from __future__ import annotations

import copy

from workers.config.reference import COMMAND, PAGE, PEER_NAMES, PEERS, render, sections, undescribed
from workers.config.run_config import json_schema


def test_docs_config_md_is_generated_from_the_config_as_it_is():
    assert PAGE.read_text() == render(), (
        f"{PAGE.relative_to(PAGE.parents[1])} differs from what RunConfig gives now; regenerate it with:\n    {COMMAND}"
    )


def test_every_field_and_section_has_a_description():
    missing = undescribed()
    assert not missing, (
        f"config fields without a description: {missing}; give each a description= in workers/config/run_config.py "
        f"(a section: a docstring), then run {COMMAND}"
    )


def test_a_field_without_a_description_is_found():
    schema = copy.deepcopy(json_schema())
    del schema["$defs"]["TrainerConfig"]["properties"]["lr"]["description"]
    del schema["$defs"]["StopConfig"]["description"]
    assert undescribed(schema) == ["trainer.lr", "stop"]


def test_every_field_has_one_row_and_nested_sections_their_own_table():
    page = render()
    paths = [f.path for s in sections() for f in s.fields]
    assert "trainer.lr" in paths and "task.dataset.path" in paths and "lora.rank" in paths
    for path in paths:
        assert page.count(f"| `{path}` |") == 1, path
    assert "\n## task.dataset\n" in page


def test_peer_names_are_of_real_fields_and_known_peers():
    paths = {f.path for s in sections() for f in s.fields}
    assert set(PEER_NAMES) <= paths, set(PEER_NAMES) - paths
    assert {peer for names in PEER_NAMES.values() for peer in names} <= set(PEERS)
    row = next(line for line in render().splitlines() if line.startswith("| `trainer.group_size` |"))
    assert "TRL `num_generations`" in row and "verl `actor_rollout_ref.rollout.n`" in row
