"""docs/session-limits.md's one user-name rule, held to the rule the code applies (validation.py)."""

from __future__ import annotations

import re
from pathlib import Path

from hpops_core.common import validation

DOC = Path(__file__).resolve().parents[2] / "docs" / "session-limits.md"
# What the page says is refused, as names that have each.
REFUSED = {"whitespace": "j doe", "`:`": "j:doe", "`/`": "j/doe", "a leading `@`": "@staff",
           "a second `@`": "a@b@example.edu", "shell characters": "j;doe", "a leading `-`": "-jdoe", "or `.`": ".jdoe"}


def rule_sentence() -> str:
    text = " ".join(DOC.read_text().split())
    [sentence] = re.findall(r"`hpops_core/common/validation\.py`: (.*?)\)\.", text)
    return sentence


def test_the_names_the_page_accepts_are_accepted_and_those_it_refuses_refused():
    accepted_part, _, refused_part = rule_sentence().partition(" are accepted")
    accepted = re.findall(r"`([^`]+)`", accepted_part)
    assert "alice@example.edu" in accepted and accepted, accepted
    assert all(validation.is_posix_user(name) for name in accepted), accepted
    for feature, name in REFUSED.items():
        assert feature in refused_part, f"the page no longer names {feature} as refused: {refused_part}"
        assert not validation.is_posix_user(name), name


def test_the_page_says_one_thing_about_at_in_user_names():
    text = " ".join(DOC.read_text().split())
    # Nowhere may a bare `@` be listed among what is refused: directory users are named so.
    assert not re.search(r"`:`, `/`, `@`", text)
    assert "`alice@example.edu`" in text and validation.is_posix_user("alice@example.edu")
