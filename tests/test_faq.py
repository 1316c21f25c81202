"""docs/faq.md's glossary: each term the docs use is defined, with the page that explains
it and, where a config field sets it, that field as docs/config.md names it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAQ = REPO / "docs" / "faq.md"
TERMS = ("η", "μ", "π_old", "TIS", "IcePop", "R3", "drain", "admission", "overcommit", "the survey")


def glossary() -> dict[str, str]:
    """term (the bold head of a bullet) → the bullet's text."""
    text = FAQ.read_text().split("## Glossary", 1)[1]
    return {m.group(1): m.group(2) for m in re.finditer(r"^- \*\*(.+?)\*\*(.*?)(?=^- |\Z)", text, re.M | re.S)}


def test_the_glossary_defines_each_term_with_a_page_that_explains_it():
    entries = glossary()
    for term in TERMS:
        found = [text for head, text in entries.items() if head.startswith(term)]
        assert found, f"docs/faq.md defines no {term}"
        pages = re.findall(r"\]\(([\w-]+\.md)", found[0])
        assert set(pages) - {"config.md"}, f"{term}: no page explains it"


def test_each_field_it_names_is_a_field_of_the_run_config():
    fields = set(re.findall(r"^\| `([\w.]+)`", (REPO / "docs" / "config.md").read_text(), re.M))
    sections = {f.split(".")[0] for f in fields}
    named = {f for text in glossary().values() for f in re.findall(r"`([a-z_]+\.[a-z_*]+)`", text)}
    assert len(named) >= 8
    unknown = {f for f in named if f not in fields and not (f.endswith(".*") and f[:-2] in sections)}
    assert unknown == set()


def test_the_survey_is_named_with_its_link():
    survey = glossary()["the survey"]
    assert "16 Open-Source RL Libraries" in survey and "https://huggingface.co/blog/" in survey


def test_the_readme_links_it():
    assert "(docs/faq.md)" in (REPO / "README.md").read_text()
