"""The command line is built from one table, `meanfield._app.commands.COMMANDS`.

Every command of the table is a subcommand of `meanfield`, its `--help` lists
every key of its schema (tables included, written `noise.sigma`), and the page
"Command-line reference" has a section for it.
"""

import argparse
import re

import pytest

from meanfield._app import cli, config_reference
from meanfield._app.commands import COMMANDS, dotted_keys, load

NAMES = [command.name for command in COMMANDS]
WITH_SCHEMA = [command for command in COMMANDS if command.schema is not None]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    (action,) = (
        a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    return dict(action.choices)


def _mentions(text: str, name: str) -> bool:
    # The key as a whole word: `noise.sigma`, not the `sigma` of `noise.sigma`.
    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\.?\w)", text) is not None


def test_the_parser_has_every_command_of_the_table_in_order():
    assert list(_subparsers()) == NAMES
    assert len(set(NAMES)) == len(NAMES)


def test_dotted_keys_walk_nested_tables():
    schema = {"a": 1, "t": {"b": 2, "u": {"c": 3}}, "d": 4}
    assert list(dotted_keys(schema)) == ["a", "d", "t.b", "t.u.c"]


@pytest.mark.parametrize("command", WITH_SCHEMA, ids=lambda c: c.name)
def test_help_lists_every_key_of_the_schema(command):
    keys = list(dotted_keys(command.load_schema()))
    assert keys
    if command.own_parser is None:
        text = " ".join(_subparsers()[command.name].format_help().split())
        missing = [key for key in keys if not _mentions(text, key)]
    else:  # its keys are its options: `max_seconds` is `--max-seconds`
        parser = load(command.own_parser)(command.description)
        text = " ".join(parser.format_help().split())
        missing = [
            key
            for key in keys
            if not _mentions(text, "--" + key.replace("_", "-").replace(".", "-"))
        ]
    assert missing == [], f"`meanfield {command.name} --help` omits {missing}"


def test_the_reference_page_has_a_section_per_command_of_the_table():
    page = config_reference.markdown()
    assert re.findall(r"^## meanfield ([\w-]+)$", page, re.M) == NAMES
    for command in COMMANDS:
        assert command.summary in page
