"""The generated page "Command-line reference" covers every command, option and key.

`meanfield._app.config_reference.markdown()` is published by docs/hooks.py as
reference/cli.md. These tests hold it to the code: every key of every schema is
documented and listed, every option of every parser is listed, and every example
configuration file parses and resolves to exactly the defaults.
"""

import re
import tomllib

import pytest

from meanfield._app import bench_config, config, config_reference
from meanfield._app.config import Key

RUNS = ["demo", "simulate", "gaussian", "lipschitz", "phase", "density", "bench"]
COMMANDS = [*RUNS, "install-model"]
WITH_CONFIG = [c for c in RUNS if c != "demo"]


@pytest.fixture(scope="module")
def page() -> str:
    return config_reference.markdown()


def _section(page: str, command: str) -> str:
    """The markdown of one command's section, from its heading to the next."""
    start = page.index(f"\n## meanfield {command}\n")
    end = page.find("\n## ", start + 1)
    return page[start : None if end < 0 else end]


def _dotted(raw: dict, prefix: str = "") -> list[str]:
    """The dotted names of the keys of a parsed TOML file."""
    out = []
    for key, value in raw.items():
        if isinstance(value, dict):
            out += _dotted(value, f"{prefix}{key}.")
        else:
            out.append(prefix + key)
    return out


def _resolvers() -> dict:
    """Each command's own resolver: the schema plus its cross-key checks."""
    from meanfield._app import (
        density_report,
        gaussian_report,
        lipschitz_report,
        phase_report,
        simulate_config,
    )

    return {
        "simulate": simulate_config.resolve_config,
        "gaussian": gaussian_report.resolve_config,
        "lipschitz": lipschitz_report.resolve_config,
        "phase": phase_report.resolve_config,
        "density": density_report.resolve_config,
        "bench": lambda raw: config.resolve(bench_config.SCHEMA, raw),
    }


def test_the_page_has_a_section_per_command_in_the_order_of_help(page):
    assert list(config_reference.parsers()) == COMMANDS
    assert list(config_reference.schemas()) == COMMANDS
    headings = re.findall(r"^## meanfield ([\w-]+)$", page, re.M)
    assert headings == COMMANDS
    assert page.startswith("# Command-line reference\n")


@pytest.mark.parametrize("command", WITH_CONFIG)
def test_every_key_has_a_one_line_doc_that_explains_an_omitted_default(command):
    schema = config_reference.schemas()[command]
    assert config_reference.undocumented(schema) == []
    for name, key in config_reference.keys(schema):
        assert "\n" not in key.doc and "|" not in key.doc, name
        # A None default is not a value: the doc must say what omitting means.
        if key.default is None:
            assert "Omitted:" in key.doc, name


def test_a_key_without_a_doc_is_found_and_stops_the_page(monkeypatch):
    schema = {"n": Key(config.integer(1), 3, doc="Tokens."), "t": {"m": Key(len, 1)}}
    assert config_reference.undocumented(schema) == ["t.m"]
    schemas = {**config_reference.schemas(), "density": schema}
    monkeypatch.setattr(config_reference, "schemas", lambda: schemas)
    with pytest.raises(ValueError, match=r"density.*t\.m"):
        config_reference.markdown()


@pytest.mark.parametrize("command", WITH_CONFIG)
def test_every_key_is_in_the_table_with_its_doc(page, command):
    section = _section(page, command)
    for name, key in config_reference.keys(config_reference.schemas()[command]):
        row = re.search(rf"^\| `{re.escape(name)}` \| (.*) \| (.*) \|$", section, re.M)
        assert row is not None, name
        assert row[2] == " ".join(key.doc.split())


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_of_the_parser_is_listed(page, command):
    section = _section(page, command)
    parser = config_reference.parsers()[command]
    strings = [s for action in parser._actions for s in action.option_strings]
    # As the intro says: the runs take these, install-model none of them.
    common = {"--out", "--seed", "--no-progress"}
    assert common <= set(strings) if command in RUNS else not common & set(strings)
    assert ("--config" in strings) == (command in WITH_CONFIG)
    for string in strings:
        assert re.search(rf"^\| `(.*, )?{re.escape(string)}\b", section, re.M), string


@pytest.mark.parametrize("command", WITH_CONFIG)
def test_only_bench_has_options_that_are_also_keys(command):
    # The intro: options and keys set different things, except for bench.
    parser = config_reference.parsers()[command]
    dests = {action.dest for action in parser._actions}
    shared = dests & set(config_reference.schemas()[command])
    assert shared == (set(bench_config.SCHEMA) if command == "bench" else set())


@pytest.mark.parametrize("command", WITH_CONFIG)
def test_the_example_file_parses_and_resolves_to_the_defaults(page, command):
    (text,) = re.findall(r"```toml\n(.*?)```", _section(page, command), re.S)
    raw = tomllib.loads(text)
    schema = config_reference.schemas()[command]
    # Every key with a default is written out (the others are commented).
    written = {
        name for name, key in config_reference.keys(schema) if key.default is not None
    }
    assert set(_dotted(raw)) == written
    assert config.resolve(schema, raw) == config.resolve(schema, None)
    resolve = _resolvers()[command]
    assert resolve(raw) == resolve(None)


def test_bench_example_file_gives_the_defaults_on_the_command_line(page, tmp_path):
    (text,) = re.findall(r"```toml\n(.*?)```", _section(page, "bench"), re.S)
    path = tmp_path / "bench.toml"
    path.write_text(text)
    from_file = bench_config.parse(["--config", str(path)], "")
    plain = bench_config.parse([], "")
    assert vars(from_file) == {**vars(plain), "config": str(path)}


@pytest.mark.parametrize(
    "value, text",
    [
        (True, "true"),
        (1e-6, "1e-6"),
        (1e8, "1e8"),
        (15.0, "15.0"),
        (0.001, "0.001"),
        ("sphere", '"sphere"'),
        ([[1.0, 0.5], [0, 1]], "[[1.0, 0.5], [0, 1]]"),
    ],
)
def test_defaults_are_written_as_toml_that_reads_back(value, text):
    assert config_reference.toml_value(value) == text
    assert tomllib.loads(f"x = {text}")["x"] == value


def test_tables_have_one_cell_per_column(page):
    # An unescaped `|` in a description would split its cell in two.
    for table in re.findall(r"(?:^\|.*\|\n)+", page, re.M):
        rows = table.splitlines()
        widths = {len(re.split(r"(?<!\\)\|", row)) for row in rows}
        assert len(widths) == 1, rows[0]


def test_links_are_to_pages_of_the_site_or_absolute(page):
    links = re.findall(r"\]\(([^)]+)\)", page)
    assert "../how-to/cli.md" in links
    for link in links:
        assert link == "../how-to/cli.md" or link.startswith("https://"), link
