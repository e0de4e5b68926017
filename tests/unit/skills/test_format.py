"""The Agent Skills format: names, front matter, sizes, unknown keys kept."""

from __future__ import annotations

import pytest

from agent_core.skills.format import (
    MAX_SKILL_CHARS,
    SkillFormatError,
    check_name,
    parse_skill,
    render_skill,
)

HERMES_SKILL = """---
name: arxiv-search
description: Search arXiv for papers and summarise them.
version: 1.2.0
author: someone
license: MIT
metadata:
  hermes:
    tags: [research, papers]
    related_skills: [pdf-reader]
platforms: [cli, telegram]
---

# arXiv search
1. Query the API.
"""


@pytest.mark.parametrize("name", ["a", "daily-briefing", "x1-2-y", "a" * 64])
def test_valid_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "Daily", "a_b", "-a", "a-", "a--b", "a" * 65, "../x", "a/b", "a b", "é", ".hidden"],
)
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(SkillFormatError):
        check_name(name)


def test_a_hermes_skill_parses_with_its_own_keys_kept() -> None:
    doc = parse_skill(HERMES_SKILL, expect_name="arxiv-search")
    assert doc.name == "arxiv-search"
    assert doc.description == "Search arXiv for papers and summarise them."
    assert doc.front["version"] == "1.2.0"
    assert doc.front["platforms"] == ["cli", "telegram"]
    assert doc.front["metadata"]["hermes"]["tags"] == ["research", "papers"]
    assert doc.body.strip().startswith("# arXiv search")


def test_the_standard_optional_fields() -> None:
    text = render_skill(
        "pdf-tools",
        "Work with PDF files.",
        "Steps.",
        license="Apache-2.0",
        compatibility="needs python3",
        metadata={"author": "x", "version": "1"},
    )
    doc = parse_skill(text)
    assert doc.front["license"] == "Apache-2.0"
    assert doc.front["metadata"] == {"author": "x", "version": "1"}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("no front matter", "front matter"),
        ("---\nname: x\n", "front matter"),
        ("---\n- a\n- b\n---\nbody", "mapping"),
        ("---\nname: [\n---\nbody", "YAML"),
        ("---\ndescription: d\n---\nbody", "name"),
        ("---\nname: x\n---\nbody", "description"),
        ("---\nname: x\ndescription: '   '\n---\nbody", "description"),
        ("---\nname: Bad_Name\ndescription: d\n---\nbody", "not valid"),
        ("---\nname: x\ndescription: d\nmetadata: 3\n---\nbody", "metadata"),
        ("---\nname: x\ndescription: d\nlicense: [a]\n---\nbody", "license"),
        ("---\nname: x\ndescription: " + "d" * 1025 + "\n---\nbody", "1024"),
    ],
)
def test_bad_skill_text_is_refused_with_what_to_fix(text: str, fragment: str) -> None:
    with pytest.raises(SkillFormatError, match=fragment):
        parse_skill(text)


def test_the_folder_name_must_match() -> None:
    with pytest.raises(SkillFormatError, match="folder"):
        parse_skill(render_skill("one", "d", "b"), expect_name="two")


def test_skill_md_size_cap() -> None:
    body = "x" * MAX_SKILL_CHARS
    with pytest.raises(SkillFormatError, match="characters"):
        parse_skill(render_skill("big", "d", body))
