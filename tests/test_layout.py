"""The layout holds: public names, no import cycles, small modules, lazy import.

Structural checks only (no timing): they read the source tree or import the package
in a fresh interpreter.
"""

import ast
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
