"""`hpops --help` and each command's help say what the command does and where its values come from:
every command in the top-level help, every doctor check in `doctor --help`, every --stack-name and
--region with its fallback, one way to read an agent's fingerprint."""

from __future__ import annotations

import argparse

from hpops.doctor_checks import CHECK_HELP, CHECKS
from hpops.main import REGION_HELP, STACK_HELP, build_parser
from hpops_core.node_channel.contract import READ_AGENT_FINGERPRINT


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(words, parser) for every command and subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,), sub
                yield from _commands(sub, prefix + (name,))


def test_the_top_level_help_names_every_command():
    parser = build_parser()
    text = parser.format_help()
    for words, _ in _commands(parser):
        if len(words) == 1:
            assert f"hpops {words[0]}" in text, words
        else:  # a subcommand: named in its command's line (`hpops node enrollments|approve-enrollment`, ...)
            assert words[1] in text, words


def test_doctor_help_lists_every_check_with_what_it_looks_at():
    doctor = dict(_commands(build_parser()))[("doctor",)]
    text = doctor.format_help()
    assert list(CHECK_HELP) == list(CHECKS)
    for check in CHECKS:
        assert f"  {check}" in text, check


def test_every_stack_name_and_region_option_says_where_its_value_comes_from():
    assert "AWS_REGION" in REGION_HELP and "AWS_DEFAULT_REGION" in REGION_HELP and "no default" in STACK_HELP
    seen = 0
    for words, parser in _commands(build_parser()):
        for action in parser._actions:
            if "--region" in action.option_strings:
                assert action.help == REGION_HELP, words
                seen += 1
            if "--stack-name" in action.option_strings:
                assert action.help and action.help.startswith(STACK_HELP), words
    assert seen >= 10


def test_one_way_to_read_an_agents_fingerprint():
    approve = dict(_commands(build_parser()))[("node", "approve-enrollment")]
    assert "".join(READ_AGENT_FINGERPRINT.split()) in "".join(approve.format_help().split())
