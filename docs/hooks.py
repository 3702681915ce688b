"""Pages of the site generated at build time (an MkDocs hook, see mkdocs.yml).

- `tutorials/NN_name.md`: each notebook of `notebooks/` (a jupytext percent-format
  script) with the outputs stored by `python notebooks/render.py` in
  `docs/tutorials/NN_name/`. A notebook whose code changed since it was rendered
  stops the build: the page would show outputs of code it no longer contains.
- `reference/cli.md`: every command's options and configuration keys, read from
  the parsers and schemas of `meanfield._app` (so it cannot drift from the code).
- `benchmarks/results/*.png`: the committed benchmark figures, published where
  the benchmarks page expects them.
"""

import importlib.util
import json
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]


def _render_module():
    """`notebooks/render.py` (cell splitting and hashing shared with the renderer)."""
    spec = importlib.util.spec_from_file_location(
        "_notebook_render", ROOT / "notebooks" / "render.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tutorial_markdown(path: Path, outputs: dict, render) -> str:
    """The page of one notebook: its prose, its code and what each cell printed."""
    code_cells = outputs["cells"]
    parts, index = [], 0
    for kind, source in render.cells(path.read_text()):
        if kind == "markdown":
            parts.append(source)
            if not index and len(parts) == 1:
                parts.append(
                    f'!!! info inline end "Run it"\n    This page is `notebooks/'
                    f"{path.name}`, run at full size ({outputs['seconds']:.0f} s on "
                    f"{outputs['machine']}). Run it yourself with `python notebooks/"
                    f"{path.name}` (figures in `out/notebooks/`), or with "
                    f"`SMOKE_TEST=1` for a small version."
                )
            continue
        if index >= len(code_cells) or code_cells[index]["hash"] != (
            render.source_hash(source)
        ):
            raise PluginError(
                f"notebooks/{path.name} changed since its outputs were stored (code "
                f"cell {index + 1}): run `python notebooks/render.py {path.stem}`"
            )
        cell = code_cells[index]
        index += 1
        parts.append(f"```python\n{source}\n```")
        if cell["stdout"].strip():
            parts.append(f"```text\n{cell['stdout'].rstrip()}\n```")
        parts.extend(f"![]({path.stem}/{name})" for name in cell["figures"])
    if index != len(code_cells):
        raise PluginError(
            f"notebooks/{path.name} has fewer code cells than its stored outputs: "
            f"run `python notebooks/render.py {path.stem}`"
        )
    return "\n\n".join(parts) + "\n"


def on_files(files, config):
    """Add the generated pages and the benchmark figures to the site."""
    render = _render_module()
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        stored = ROOT / "docs" / "tutorials" / path.stem / "outputs.json"
        if not stored.exists():
            raise PluginError(
                f"no stored outputs for notebooks/{path.name}: run "
                f"`python notebooks/render.py {path.stem}`"
            )
        outputs = json.loads(stored.read_text())
        page = tutorial_markdown(path, outputs, render)
        files.append(File.generated(config, f"tutorials/{path.stem}.md", content=page))

    sys.path.insert(0, str(ROOT))  # the checkout's meanfield, installed or not
    from meanfield._app import config_reference

    files.append(
        File.generated(config, "reference/cli.md", content=config_reference.markdown())
    )
    for figure in sorted((ROOT / "benchmarks" / "results").glob("*.png")):
        files.append(
            File.generated(
                config,
                f"benchmarks/results/{figure.name}",
                abs_src_path=str(figure),
            )
        )
    return files
