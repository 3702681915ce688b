"""The documentation is a contract: README and every page of docs/ are checked.

- every ```python block is self-contained (no undefined name) and, in the second
  tier, runs verbatim in a fresh process;
- every public name of meanfield has an entry in the API reference;
- every relative link of README.md points at a file that exists;
- README stays a front page;
- the packaging facts a plain `pip install` relies on (declared imports, licence,
  `py.typed`, the sdist's documentation).
"""

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from helpers import skip_if_an_extra_is_missing

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted([README, *(ROOT / "docs").rglob("*.md")])
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
BLOCKS = [
    pytest.param(code, id=f"{page.relative_to(ROOT)}:{number}")
    for page in PAGES
    for number, code in enumerate(BLOCK.findall(page.read_text()), 1)
]
# The public namespaces, as the package declares them.
NAMESPACES = importlib.import_module("meanfield")._NAMESPACES


def test_there_are_python_blocks_to_check():
    assert len(BLOCKS) >= 20


@pytest.mark.parametrize("code", BLOCKS)
def test_block_defines_every_name_it_uses(code):
    # Fast and static: no undefined names (ruff F821), so a block copied into a
    # fresh interpreter does not stop at its first line.
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    run = subprocess.run(
        [ruff, "check", "--select", "F821", "--stdin-filename", "block.py", "-"],
        input=code,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout


# Second tier: the blocks run the documented computations (a few minutes).
@pytest.mark.slow
@pytest.mark.parametrize("code", BLOCKS)
def test_block_runs_verbatim_in_a_fresh_process(code, tmp_path):
    env = dict(os.environ, MPLBACKEND="Agg")
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,  # files a block writes (tokens.gif) land here
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if run.returncode != 0:
        skip_if_an_extra_is_missing(run.stderr)  # a page on an extra, without it
    assert run.returncode == 0, run.stderr[-3000:]


def documented_names() -> set[str]:
    """`meanfield.X` and `meanfield.ns.X` named by `::: ...` in docs/api/."""
    found = set()
    for page in (ROOT / "docs" / "api").glob("*.md"):
        found |= set(re.findall(r"^::: (meanfield[\w.]*)\s*$", page.read_text(), re.M))
    return found


def public_names() -> set[str]:
    import meanfield

    names = {f"meanfield.{name}" for name in meanfield._ENGINE}
    for namespace in NAMESPACES:
        module = importlib.import_module(f"meanfield.{namespace}")
        names |= {f"meanfield.{namespace}.{name}" for name in module.__all__}
    return names


def test_every_public_name_is_in_the_api_reference():
    missing = public_names() - documented_names()
    assert not missing, f"add to a page of docs/api/: {sorted(missing)}"


def test_the_api_reference_documents_only_public_names():
    documented = documented_names() - {"meanfield"}
    documented -= {f"meanfield.{namespace}" for namespace in NAMESPACES}
    assert documented <= public_names(), sorted(documented - public_names())


def test_readme_is_a_front_page_whose_links_exist():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    for word in ("this stop", "the peers", "turn 2"):
        assert word not in text.lower()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "README links into the documentation"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing


def test_front_pages_count_the_notebooks():
    count = len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.py")))
    words = "zero one two three four five six seven eight nine ten eleven twelve"
    word = words.split()[count]
    assert f"{word} notebooks" in README.read_text().lower()
    assert f"{word} notebooks" in (ROOT / "docs" / "index.md").read_text().lower()


def test_no_documented_command_overwrites_committed_results():
    # Only benchmarks/README.md may say how to refresh the committed results,
    # and it says that it rewrites them.
    for page in PAGES:
        for line in page.read_text().splitlines():
            assert "--out benchmarks/results" not in line, (page, line)
    text = (ROOT / "benchmarks" / "README.md").read_text()
    if "--out benchmarks/results" in text:
        assert "rewrites the committed" in text


def third_party_imports() -> set[str]:
    found = set()
    for path in (ROOT / "meanfield").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"meanfield"}


# Import name -> distribution name, where they differ.
DISTRIBUTION = {"PIL": "pillow", "mpl_toolkits": "matplotlib", "ot": "pot"}
# Imported only by the benchmark command when present (peers and BLAS pinning).
PEERS = {"torch", "pykeops", "threadpoolctl"}


def test_every_import_is_a_declared_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        declared += extra
    names = {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower() for spec in declared}
    for module in sorted(third_party_imports() - PEERS):
        assert DISTRIBUTION.get(module, module).lower().replace("_", "-") in names, (
            module
        )
    # The persistent compilation cache that meanfield turns on needs filelock.
    core = {re.split(r"[<>=!~\[; ]", s, maxsplit=1)[0] for s in project["dependencies"]}
    assert "filelock" in core


def test_packaging_ships_the_licence_the_type_marker_and_the_docs():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert (ROOT / "meanfield" / "py.typed").exists()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["package-data"]["meanfield"] == ["py.typed"]
    assert "graft docs" in (ROOT / "MANIFEST.in").read_text()
    citation = (ROOT / "CITATION.cff").read_text()
    assert f"version: {pyproject['project']['version']}" in citation


def test_plain_text_docstrings_keep_their_angle_brackets():
    # `<A x, y>` in a docstring is an inner product; unescaped, the API page
    # would hand it to the browser as an HTML tag and it would vanish.
    import importlib.util

    pytest.importorskip("griffe", reason="`griffe` not installed (extra `docs`)")
    path = ROOT / "docs" / "griffe_plain_text.py"
    spec = importlib.util.spec_from_file_location("griffe_plain_text", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    escape = module.escape_angle_brackets
    assert escape("k = e^{<A x, y>}") == "k = e^{&lt;A x, y>}"
    assert escape("a `<b>` c <d") == "a `<b>` c &lt;d"
    assert escape("``x < y`` and x < y") == "``x < y`` and x &lt; y"
