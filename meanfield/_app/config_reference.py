"""The page "Command-line reference", generated from the table of commands.

`markdown()` reads, for every command of `commands.COMMANDS`, its summary, its
options from its argparse parser (the subparsers of `cli`; its own parser for a
command that owns its options, `meanfield bench`) and its TOML keys from its
schema (`config.Key`: checker, default, `doc`), so the page cannot drift from the
code. docs/hooks.py publishes it as
`reference/cli.md`; tests/test_config_reference.py checks that it names every key
and option and that its example files resolve to the defaults.
"""

import argparse
import decimal
import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

from .commands import COMMANDS, load
from .config import Key, Schema

INTRO = """\
# Command-line reference

Every command runs as `meanfield <command> [options]`, and
`meanfield <command> --help` prints the options listed here. Every command that
runs a computation (all but `install-model`) takes `--out DIR` (the output
directory, created if needed), `--seed INT` and `--no-progress`; every one of
them except `demo` also takes `--config FILE.toml`, a
[TOML](https://toml.io) file of configuration keys. An omitted key takes its
default; an unknown key, or a value of the wrong type or outside the range given
below, stops the command before it computes anything, with a one-line message
that names the key and exit status 2. Keys of a table are written dotted here:
`attention.kind` is the key `kind` of the table `[attention]`. The options and the
keys set different things, except for `meanfield bench`, whose keys are also
options: there the command line wins over the file. The section of each command
that reads a file ends with one that sets every key to its default, a starting
point for your own. How to run the commands, read their outputs and resume a run:
[The command line](../how-to/cli.md).
"""


def parsers() -> dict[str, argparse.ArgumentParser]:
    """The parser of every command, in the order of `meanfield --help`.

    Returns:
        command name -> its argparse parser; for a command that owns its options
        (`bench`) its own parser (`bench_config.parser`), not the pass-through of
        `cli`.
    """
    from . import cli

    parser = cli._parser()
    (subparsers,) = (
        action
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    out = dict(subparsers.choices)
    for command in COMMANDS:
        if command.own_parser is not None:
            out[command.name] = load(command.own_parser)(command.description)
    return out


def summaries() -> dict[str, str]:
    """What each command does and writes, in the order of `meanfield --help`."""
    return {command.name: command.summary for command in COMMANDS}


def schemas() -> dict[str, Schema | None]:
    """The configuration schema of every command (None: no `--config`).

    Imported on call: the report modules import JAX.
    """
    return {command.name: command.load_schema() for command in COMMANDS}


def quick_defaults() -> dict[str, dict[str, Any]]:
    """Per command, the defaults that `--quick` changes (shown beside the others)."""
    return {c.name: dict(load(c.quick)) for c in COMMANDS if c.quick is not None}


def keys(schema: Schema, table: str | None = None) -> Iterator[tuple[str, Key]]:
    """(dotted name, `Key`) of every key of a schema, tables after the top level.

    The order of a TOML file: a table's header ends the top level, so the keys
    of the top level come first, then each table (and its sub-tables) in turn.

    Args:
        schema: a command's schema.
        table: the dotted name of `schema` inside an outer one; None at the top.
    """
    prefix = "" if table is None else f"{table}."
    for name, spec in schema.items():
        if isinstance(spec, Key):
            yield prefix + name, spec
    for name, spec in schema.items():
        if not isinstance(spec, Key):
            yield from keys(spec, prefix + name)


def undocumented(schema: Schema) -> list[str]:
    """The dotted names of the keys of `schema` without a `doc`."""
    return [name for name, key in keys(schema) if not key.doc.strip()]


def toml_value(value: Any) -> str:
    """A default as TOML writes it: `true`, `1e-6`, `"sphere"`, `[[1.0, 0.0]]`.

    Raises:
        TypeError: a value TOML cannot hold (None, a dict, a non-finite float).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return _float(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML value for {value!r}")


def _float(value: float) -> str:
    """The shortest exact TOML float: 15.0, 0.001, 1e-6, 1e8 (never `1e-06`)."""
    text = repr(value)  # the shortest exact digits, always with "." or "e"
    if "e" not in text and abs(value) < 1e6:
        return text
    mantissa, exponent = f"{decimal.Decimal(text).normalize():e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def example_toml(command: str, schema: Schema) -> str:
    """A configuration file that sets every key of `schema` to its default.

    A key whose default is None (the omitted key means something of its own, see
    its `doc`) is shown commented out.
    """
    lines = [f"# meanfield {command}: every key at its default."]
    table = None
    for name, key in keys(schema):
        where, _, short = name.rpartition(".")
        if where and where != table:
            lines += ["", f"[{where}]"]
        table = where or table
        if key.default is None:
            lines.append(f"# {short}: omitted by default (see its description)")
        else:
            lines.append(f"{short} = {toml_value(key.default)}")
    return "\n".join(lines) + "\n"


def markdown() -> str:
    """The complete markdown of the page "Command-line reference".

    Returns:
        An introduction, then per command: what it does and writes, a usage line,
        its options (from its parser), its configuration keys with their defaults
        and descriptions (from its schema) and an example file of every default.

    Raises:
        ValueError: a key without a `doc` (the page would be incomplete).
    """
    found, configs, quick = parsers(), schemas(), quick_defaults()
    parts = [INTRO]
    for command, parser in found.items():
        schema = configs[command]
        parts.append(_section(command, parser, schema, quick.get(command, {})))
    return "\n".join(parts)


def _section(
    command: str,
    parser: argparse.ArgumentParser,
    schema: Schema | None,
    quick: Mapping[str, Any],
) -> str:
    actions = [a for a in parser._actions if a.help != argparse.SUPPRESS]
    usage = _wrap(
        f"meanfield {command}",
        [f"[{_invocation(a, a.option_strings[:1])}]" for a in actions],
    )
    out = [
        f"## meanfield {command}",
        "",
        summaries()[command],
        "",
        "```text",
        usage,
        "```",
        "",
        f"### Options {{#{command}-options}}",
        "",
        "| option | description |",
        "|---|---|",
    ]
    out += [
        f"| `{_invocation(a, a.option_strings)}` | {_help(a, parser.prog)} |"
        for a in actions
    ]
    if schema is None:
        return "\n".join(out) + "\n"
    bad = undocumented(schema)
    if bad:
        raise ValueError(f"`meanfield {command}` keys without a doc: {bad}")
    out += [
        "",
        f"### Configuration keys {{#{command}-keys}}",
        "",
        "| key | default | description |",
        "|---|---|---|",
    ]
    for name, key in keys(schema):
        out.append(
            f"| `{name}` | {_default(key.default, quick.get(name))} | "
            f"{_cell(key.doc)} |"
        )
    out += [
        "",
        f"### Example {{#{command}-example}}",
        "",
        "```toml",
        example_toml(command, schema).rstrip("\n"),
        "```",
    ]
    return "\n".join(out) + "\n"


def _wrap(head: str, items: list[str], width: int = 88) -> str:
    """`head item item ...` in lines of at most `width`, an item never split."""
    lines, line = [], head
    for item in items:
        if len(line) + 1 + len(item) > width and line.strip() != head:
            lines.append(line)
            line = " " * len(head)
        line += " " + item
    return "\n".join([*lines, line])


def _invocation(action: argparse.Action, strings: list[str]) -> str:
    """`--out DIR`, `--ns N [N ...]`, `-h, --help`: how an option is written."""
    names = strings or [action.metavar or action.dest]
    if action.nargs == 0:
        return ", ".join(names)
    meta = action.metavar or action.dest.upper()
    forms = {
        None: meta,
        "?": f"[{meta}]",
        "*": f"[{meta} ...]",
        "+": f"{meta} [{meta} ...]",
        argparse.REMAINDER: "...",
    }
    arg = forms.get(action.nargs) or " ".join([meta] * int(action.nargs))
    return ", ".join(f"{name} {arg}" for name in names) if strings else arg


def _help(action: argparse.Action, prog: str) -> str:
    """An option's help as a table cell: %(default)s filled in, choices listed."""
    text = action.help or ""
    if "%" in text:
        text = text % {**vars(action), "prog": prog}
    text = _escape(" ".join(text.split()))
    if action.choices is not None:
        text += "; one of " + ", ".join(f"`{c}`" for c in action.choices)
    return text


def _default(value: Any, quick: Any = None) -> str:
    """A default as a table cell: TOML in code, *omitted* for None."""
    cell = "*omitted*" if value is None else f"`{toml_value(value)}`"
    if quick is not None:
        cell += f" (`--quick`: `{toml_value(quick)}`)"
    return _cell(cell)


def _cell(text: str) -> str:
    """Markdown for one table cell: one line, `|` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _escape(text: str) -> str:
    """Plain text (an argparse help) as literal markdown."""
    for char in "\\`*_[]":
        text = text.replace(char, "\\" + char)
    return _cell(text.replace("<", "&lt;").replace(">", "&gt;"))
