"""Every TOML configuration shown in the how-to guides is valid for its command."""

import re
import tomllib
from pathlib import Path

import pytest

from meanfield._app import (
    density_report,
    gaussian_report,
    lipschitz_report,
    phase_report,
    simulate_config,
)

ROOT = Path(__file__).resolve().parents[1]
#: how-to page -> the resolver of the command its configurations are for (None:
#: parsed only, e.g. the benchmark's options file).
RESOLVERS = {
    "benchmarks.md": None,
    "blowup.md": gaussian_report.resolve_config,
    "cli.md": simulate_config.resolve_config,
    "clustering.md": simulate_config.resolve_config,
    "density.md": density_report.resolve_config,
    "lipschitz.md": lipschitz_report.resolve_config,
    "phase-diagrams.md": phase_report.resolve_config,
}
BLOCKS = [
    (page.name, i, text)
    for page in sorted((ROOT / "docs" / "how-to").glob("*.md"))
    for i, text in enumerate(re.findall(r"```toml\n(.*?)```", page.read_text(), re.S))
]


def test_every_page_with_configurations_names_its_command():
    assert BLOCKS and {page for page, _, _ in BLOCKS} <= set(RESOLVERS)


@pytest.mark.parametrize(("page", "index", "text"), BLOCKS)
def test_configuration_resolves(page, index, text):
    config = tomllib.loads(text)
    resolve = RESOLVERS.get(page)
    if resolve is not None:
        resolve(config)
