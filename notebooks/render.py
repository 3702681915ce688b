"""Run the notebooks at full size and keep their outputs for the documentation.

    python notebooks/render.py [NAME ...]      # all notebooks by default

Each notebook (a jupytext percent-format script) is executed cell by cell in one
namespace, as Jupyter would. What a cell prints and every figure it draws (saved
when the cell closes it, or at the end of the cell if it leaves it open), and
the animations it writes, are stored under `docs/tutorials/<notebook>/`:
`outputs.json` (per cell: a hash of its source, its printed text, its figures)
and the image files. The documentation build (`docs/hooks.py`) turns each
notebook and its outputs into a tutorial page, and refuses to build when a
cell's source no longer matches the hash it was run with, so a page never shows
outputs of code it no longer contains: rerun this script after editing a
notebook (about seven minutes for all ten on two cores).
"""

import argparse
import contextlib
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
DOCS = ROOT / "docs" / "tutorials"
ANIMATIONS = (".gif", ".mp4")


def cells(text: str) -> list[tuple[str, str]]:
    """Split a percent-format script into ("markdown" | "code", source) cells."""
    text = re.sub(r"\A# ---\n(?:#.*\n)*?# ---\n", "", text)  # jupytext header
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("# %%"):
            kind = "markdown" if "[markdown]" in line else "code"
            out.append((kind, []))
        elif out:
            out[-1][1].append(line)
    result = []
    for kind, lines in out:
        if kind == "markdown":
            lines = [re.sub(r"^# ?", "", line) for line in lines]
        source = "\n".join(lines).strip("\n")
        if source.strip():
            result.append((kind, source))
    return result


def source_hash(source: str) -> str:
    """A short hash of a cell's source (whitespace at the ends ignored)."""
    return hashlib.sha256(source.strip().encode()).hexdigest()[:16]


def run_notebook(path: Path) -> dict:
    """Execute one notebook cell by cell and store its outputs; return the record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dest = DOCS / path.stem
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    out_dir = ROOT / "out" / "notebooks"
    namespace = {"__name__": "__main__", "__file__": str(path)}
    record = {"notebook": path.name, "cells": []}
    figures: list[str] = []
    close = plt.close

    def save(fig) -> None:
        name = f"figure_{len(record['cells']):02d}_{len(figures)}.png"
        fig.savefig(dest / name, dpi=100, bbox_inches="tight")
        figures.append(name)

    def close_and_keep(fig=None):
        # The notebooks close each figure once drawn: keep it first.
        target = plt.gcf() if fig is None and plt.get_fignums() else fig
        if isinstance(target, matplotlib.figure.Figure):
            save(target)
        return close(fig)

    start_all = time.perf_counter()
    plt.close = close_and_keep
    try:
        for kind, source in cells(path.read_text()):
            if kind != "code":
                continue
            figures = []
            before = time.time()
            printed = io.StringIO()
            start = time.perf_counter()
            with contextlib.redirect_stdout(printed):
                code = compile(source, f"{path.name}[{len(record['cells'])}]", "exec")
                exec(code, namespace)  # noqa: S102 - running the notebook is the point
            for number in plt.get_fignums():
                fig = plt.figure(number)
                save(fig)
                close(fig)
            animations = []
            if out_dir.exists():
                for file in sorted(out_dir.iterdir()):
                    if file.suffix in ANIMATIONS and file.stat().st_mtime >= before:
                        shutil.copy(file, dest / file.name)
                        animations.append(file.name)
            record["cells"].append(
                {
                    "hash": source_hash(source),
                    "stdout": printed.getvalue(),
                    "figures": figures + animations,
                    "seconds": round(time.perf_counter() - start, 2),
                }
            )
            sys.stderr.write(f"  {path.name} cell {len(record['cells'])}\n")
    finally:
        plt.close = close
        close("all")
    import jax

    record["seconds"] = round(time.perf_counter() - start_all, 1)
    record["jax"] = jax.__version__
    record["machine"] = f"{platform.machine()}, {os.cpu_count()} cores"
    (dest / "outputs.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main() -> None:
    """Render the notebooks named on the command line (all by default)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook stems, e.g. 01_clustering")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
    unknown = set(args.names) - {p.stem for p in paths}
    if unknown:
        parser.error(f"no notebook named {', '.join(sorted(unknown))}")
    if args.names:
        paths = [p for p in paths if p.stem in args.names]
    os.environ.pop("SMOKE_TEST", None)
    for path in paths:
        if args.in_process:
            record = run_notebook(path)
            print(f"{path.name}: {len(record['cells'])} cells in {record['seconds']} s")
        else:
            # One process per notebook: each sets JAX's precision for itself.
            cmd = [sys.executable, __file__, "--in-process", path.stem]
            subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
