"""Check the built sdist and wheel carry what users and docstrings need.

    python tests/check_dist.py DIST_DIR      (run by `make wheel-check`)

The sdist holds the licence, the README and the documentation sources that
docstrings cite (docs/math/...); the wheel holds the package, its `py.typed`
marker and the licence, and no tests or documentation sources.
"""

import sys
import tarfile
import zipfile
from pathlib import Path


def check(dist: Path) -> list[str]:
    """Return what is missing or misplaced in the distributions in `dist`."""
    problems = []
    (sdist,) = dist.glob("meanfield-*.tar.gz")
    (wheel,) = dist.glob("meanfield-*.whl")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for needed in (
        "LICENSE",
        "README.md",
        "CITATION.cff",
        "mkdocs.yml",
        "meanfield/py.typed",
    ):
        if needed not in names:
            problems.append(f"sdist lacks {needed}")
    if not any(name.startswith("docs/math/") for name in names):
        problems.append("sdist lacks docs/math/ (docstrings cite it)")
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
    if "meanfield/py.typed" not in names:
        problems.append("wheel lacks meanfield/py.typed")
    if not any(name.endswith("licenses/LICENSE") for name in names):
        problems.append("wheel lacks the licence file")
    stray = sorted(n for n in names if n.startswith(("tests/", "docs/", "benchmarks/")))
    if stray:
        problems.append(f"wheel carries files outside the package: {stray[:5]}")
    return problems


if __name__ == "__main__":
    found = check(Path(sys.argv[1]))
    for problem in found:
        print(problem)
    if found:
        sys.exit(1)
    print("sdist and wheel contents: ok")
