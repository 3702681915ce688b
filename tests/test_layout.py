"""The layout holds: public names, no import cycles, small modules, lazy import.

Structural checks only (no timing): they read the source tree or import the package
in a fresh interpreter.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "meanfield"
MAX_LINES = 600

# Every public name before the restructuring (meanfield 0.1.0 at 555c7cd), and the
# status codes by name (`Status`) since: each must stay importable under the same
# name.
PUBLIC = {
    "meanfield": [
        "AbstractAttention", "AbstractIllPosedAttention", "AbstractKernelAttention",
        "AbstractMeasure", "AbstractParticles", "Gaussian", "L2Attention",
        "LinearAttention", "MaskedParticles", "MultiHeadAttention", "Particles",
        "PiecewiseConstant", "ReLUAttention", "SOLVERS", "SigmoidAttention",
        "SinkhornAttention", "SinkhornPotentials", "SoftmaxAttention", "Solution",
        "Status", "UnnormalizedAttention", "bert", "clustering", "gaussian", "layers",
        "lipschitz", "particle_mesh", "shard", "simulate", "wasserstein",
    ],
    "meanfield.gaussian": [
        "BlowupStudy", "ClosedForm", "GaussianSolution", "ParticleComparison",
        "blowup_time", "blowup_times", "closed_form", "compare_particles",
        "numerical_rank", "simulate", "velocity",
    ],
    "meanfield.wasserstein": [
        "Distance", "Stability", "conditional", "distance", "gaussian_w2",
        "gronwall_bound", "stability",
    ],
    "meanfield.lipschitz": [
        "LipschitzResult", "RealModelStudy", "ScalingStudy", "SearchResult",
        "adversarial", "adversarial_search", "fit_slope", "local", "lower_bound",
        "meanfield_adversarial", "meanfield_adversarial_rate", "meanfield_bound",
        "real_model_study", "scaling_study", "upper_bound",
    ],
    "meanfield.clustering": [
        "ClusterCounts", "Clusters", "Polytope", "cluster_counts", "clusters",
        "consensus_time", "detect", "diameter", "polytope", "rescale",
    ],
    "meanfield.bert": [
        "BertConfig", "BertHeadAttention", "BertModel", "PretrainedPaths",
        "attention_layer", "attention_offset", "embed", "english_text",
        "find_pretrained", "hidden_states", "load", "save_random", "tokenize",
    ],
    "meanfield.plotting": [
        "GaussianSolution", "Solution", "Stability", "animate",
        "plot_blowup_phase_diagram", "plot_cluster_counts",
        "plot_covariance_eigenvalues", "plot_covariance_ellipses",
        "plot_lipschitz_scaling", "plot_radius", "plot_real_model_lipschitz",
        "plot_sphere", "plot_stability", "plot_trajectories", "plot_trajectories_3d",
    ],
}  # fmt: skip


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _import_graph() -> dict[str, set[str]]:
    """Module -> modules it imports when it is imported (module-level statements).

    Importing `a.b.c` also runs the packages `a.b` and `a` unless the importer is
    inside them already (then they are mid-import, not re-run). The top package is
    lazy and imports nothing itself, so it is left out.
    """
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        package = name if _is_package(path) else name.rpartition(".")[0]
        targets = set()
        for node in ast.parse(path.read_text()).body:  # top level only
            if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks never run
                continue
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")
                if node.level:
                    base = base[: len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if not module.startswith("meanfield"):
                    continue
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    targets.add(sub if sub in modules else module)
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name in modules}
        deps = set()
        for target in targets:
            parts = target.split(".")
            for k in range(2, len(parts) + 1):
                parent = ".".join(parts[:k])
                if not (name + ".").startswith(parent + "."):
                    deps.add(parent)
        graph[name] = deps - {name, "meanfield"}
    return graph


def test_no_import_cycles():
    graph = _import_graph()
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_import_graph_sees_real_edges():
    # The cycle check above is only as good as the graph: spot-check known edges.
    graph = _import_graph()
    assert "meanfield._measures" in graph["meanfield._dynamics"]
    assert "meanfield.gaussian" in graph["meanfield.plotting._gaussian"]
    assert "meanfield.gaussian._ode" in graph["meanfield.gaussian"]


ANALYSES = ("bert", "clustering", "density", "gaussian", "lipschitz", "wasserstein")


def _layer(module: str) -> int:
    """0 engine, 1 analyses, 2 plotting, 3 applications: imports only go down."""
    top = module.split(".")[1] if "." in module else ""
    if top in ("_app", "__main__"):  # `python -m meanfield` is the CLI
        return 3
    if top == "plotting":
        return 2
    return 1 if top in ANALYSES else 0


def test_layers_import_only_downwards():
    # engine (measures, attention, kernels, dynamics) <- analyses <- plotting <- app
    upward = [
        f"{name} -> {dep}"
        for name, deps in _import_graph().items()
        for dep in deps
        if _layer(dep) > _layer(name)
    ]
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


@pytest.mark.parametrize("name", sorted(_modules()))
def test_no_module_over_600_lines(name):
    lines = len(_modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (at most {MAX_LINES})"


def _fresh_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def test_import_meanfield_loads_neither_jax_nor_matplotlib():
    loaded = _fresh_python(
        "import sys, meanfield; "
        "print(sorted(m for m in ('jax', 'matplotlib') if m in sys.modules))"
    )
    assert loaded == "[]"


def test_plotting_is_reachable_after_import_meanfield_alone():
    # Before the lazy namespace, `mf.plotting` needed `import meanfield.plotting`.
    got = _fresh_python(
        "import meanfield as mf; print(mf.plotting.animate.__name__, "
        "mf.gaussian.simulate.__module__)"
    )
    assert got == "animate meanfield.gaussian._ode"


@pytest.mark.parametrize("namespace", sorted(PUBLIC))
def test_public_names_unchanged(namespace):
    import importlib

    module = importlib.import_module(namespace)
    missing = [n for n in PUBLIC[namespace] if not hasattr(module, n)]
    assert not missing, f"{namespace} lost {missing}"
    if hasattr(module, "__all__") and namespace != "meanfield.plotting":
        assert set(PUBLIC[namespace]) <= set(module.__all__)


def test_unknown_attribute_is_an_attribute_error():
    import meanfield as mf

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mf.nope  # noqa: B018
    assert set(mf.__all__) <= set(dir(mf))


# What code outside the package may import: public modules only. The private
# pieces it needs are re-exported by `meanfield.extend`. docs/hooks.py is left
# out: it is the documentation build's own plugin (like tests/), not code a reader
# copies, and it renders the command's internal schemas.
ROOT = PACKAGE.parent
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
# `from meanfield... import a, (b, c)` and `import meanfield...`, in a code block
# of any language (a diff's +/- markers are stripped first).
FROM_IMPORT = re.compile(
    r"^\s*from\s+(meanfield[\w.]*)\s+import\s+(\([^)]*\)|.*)$", re.M
)
PLAIN_IMPORT = re.compile(r"^\s*import\s+(.*)$", re.M)


def _private(module: str, names: list[str]) -> list[str]:
    """The imported paths that name a private module or a private name."""
    if module.split(".")[0] != "meanfield":
        return []
    if any(part.startswith("_") for part in module.split(".")):
        return [module]
    return [f"{module}.{name}" for name in names if name.startswith("_")]


def _private_imports_in_python(code: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += _private(alias.name, [])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += _private(node.module, [a.name for a in node.names])
    return found


def _private_imports_in_markdown(text: str) -> list[str]:
    found = []
    for block in FENCE.findall(text):
        code = re.sub(r"^[+-]", "", block, flags=re.M)  # diff markers
        for module, names in FROM_IMPORT.findall(code):
            names = re.sub(r"#.*$", "", names, flags=re.M)  # comments
            names = [n.split(" as ")[0].strip() for n in re.split(r"[(),\n]", names)]
            found += _private(module, [n for n in names if n])
        for line in PLAIN_IMPORT.findall(code):
            for alias in line.split("#")[0].split(","):
                found += _private(alias.split(" as ")[0].strip(), [])
    return found


OUTSIDE = sorted(
    [*ROOT.glob("benchmarks/*.py"), *ROOT.glob("notebooks/*.py")]
    + list(ROOT.glob("docs/**/*.md"))
)


def test_code_outside_the_package_imports_no_private_module():
    found = []
    for path in OUTSIDE:
        text = path.read_text()
        if path.suffix == ".py":
            private = _private_imports_in_python(text)
        else:
            private = _private_imports_in_markdown(text)
        found += [f"{path.relative_to(ROOT)}: {name}" for name in private]
    assert not found, "import these from `meanfield.extend`:\n" + "\n".join(found)


def test_the_private_import_check_sees_private_imports():
    # The check above is only as good as its parsers: known bad forms are caught.
    python = "from meanfield import _io\nimport meanfield._app.cli\n"
    python += "from meanfield.density._sphere import simulate_sphere\n"
    assert len(_private_imports_in_python(python)) == 3
    markdown = (
        "```python\nfrom meanfield.density import (\n    _harmonics,\n)\n```\n"
        "```diff\n+from meanfield._params import as_param\n```\n"
    )
    assert _private_imports_in_markdown(markdown) == [
        "meanfield.density._harmonics",
        "meanfield._params",
    ]
    assert not _private_imports_in_python("from meanfield.extend import as_param")


def _imports_extend(path: Path, package: str) -> bool:
    """Whether a module of the package imports `meanfield.extend` (anywhere in it)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            if any(a.name.startswith("meanfield.extend") for a in node.names):
                return True
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [a.name for a in node.names]
            if module.startswith("meanfield.extend") or (
                module == "meanfield" and "extend" in names
            ):
                return True
    return False


def test_extend_names_resolve_and_nothing_inside_imports_extend():
    import meanfield.extend as extend

    assert sorted(extend.__all__) == sorted(extend._NAMES)  # no name twice or missing
    missing = [name for name in extend.__all__ if not hasattr(extend, name)]
    assert not missing, f"meanfield.extend cannot load {missing}"
    importers = []
    for name, path in _modules().items():
        if name in ("meanfield", "meanfield.extend"):  # the namespace table, itself
            continue
        package = name if _is_package(path) else name.rpartition(".")[0]
        if _imports_extend(path, package):
            importers.append(name)
    # It sits above every layer, the command's included: the library never needs it.
    assert not importers, f"the library imports its extension surface: {importers}"
