"""The seams between the analyses, their results and the figures.

Each test pins a friction a user met: a figure that did not take the result of its
analysis, a `Solution` passed where positions at one time are expected, status
codes without public names, reprs that hid the values. Results are built by hand
(the dataclasses and modules the analyses return), so nothing here compiles a
solve.
"""

import ast
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import QuadMesh

import meanfield as mf
from meanfield import clustering, density, plotting, wasserstein

T = 5


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _solution(x, ts=None):
    x = np.asarray(x, float)
    ts = np.linspace(0.0, 1.0, x.shape[0]) if ts is None else np.asarray(ts)
    reached = np.isfinite(ts)
    return mf.Solution(
        ts=jnp.asarray(ts),
        x=jnp.asarray(x),
        blowup_time=jnp.asarray(np.inf),
        result=jnp.asarray(int(mf.Status.SUCCESS if reached.all() else 1)),
        t_final=jnp.asarray(ts[reached][-1]),
        num_steps=jnp.asarray(12),
        initial=mf.Particles(x[0]),
    )


@pytest.fixture(scope="module")
def merging_pairs():
    """Four tokens in R^2 that merge pairwise: 4 clusters at t = 0, 2 at the end."""
    x0 = np.array([[0.0, 0.0], [0.0, 1.0], [4.0, 0.0], [4.0, 1.0]])
    shrink = np.exp(-np.arange(T) * 2.0)  # the pairs contract, 4 apart stay apart
    offsets = np.array([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 1.0]])
    x = x0 - offsets + shrink[:, None, None] * offsets
    return _solution(x)


def _merging_solution(beta=4.0):
    ts = np.array([0.0, 1.0, 10.0, 100.0, 1000.0])
    counts = np.array([4, 3, 2, 1, 0])  # the last save time was not reached
    log_energy = np.array([0.5, 1.0, 2.0, beta - np.log(2 * beta), np.nan])
    x = np.full((5, 4, 2), np.nan)
    weights = np.zeros((5, 4))
    for i, k in enumerate(counts):
        x[i, :k], weights[i, :k] = 1.0, 1 / max(k, 1)
    return clustering.MergingSolution(
        ts=ts,
        x=x,
        weights=weights,
        counts=counts,
        log_energy=log_energy,
        beta=beta,
        status="max_steps",
        num_steps=345,
    )


def _gaussian_solution():
    ts = np.linspace(0.0, 1.0, T)
    cov = np.einsum("t,kl->tkl", np.exp(ts), np.eye(2))
    return mf.gaussian.GaussianSolution(
        ts=jnp.asarray(ts),
        mean=jnp.asarray(np.stack([ts, -ts], 1)),
        cov=jnp.asarray(cov),
        blowup_time=jnp.asarray(np.inf),
        result=jnp.asarray(int(mf.Status.SUCCESS)),
        t_final=jnp.asarray(1.0),
        num_steps=jnp.asarray(7),
    )


def _blowup_study(times):
    times = np.asarray(times, float)
    codes = np.where(np.isfinite(times), mf.Status.BLOWUP, mf.Status.SUCCESS)
    return mf.gaussian.BlowupStudy(
        t_max=5.0,
        times={"softmax": times},
        fraction={"softmax": float(np.isfinite(times).mean())},
        rank={"softmax": np.full(times.shape, 2)},
        rate={"softmax": np.zeros(times.shape)},
        status={"softmax": codes},
        steps={"softmax": np.full(times.shape, 10)},
    )


# ---- 1. every figure takes what its analysis returns ----


def test_plot_cluster_counts_takes_the_result_of_cluster_counts(merging_pairs):
    counts = clustering.cluster_counts(merging_pairs, tol=0.5)
    fig = plotting.plot_cluster_counts(counts, label="pairs")
    ax = fig.axes[0]
    (line,) = ax.get_lines()
    np.testing.assert_allclose(line.get_xdata(), counts.ts)
    np.testing.assert_array_equal(line.get_ydata(), counts.counts)
    assert counts.counts[0] == 4 and counts.counts[-1] == 2
    # The result's (constant) tolerance is annotated, as with `tol=counts.tol`.
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["pairs (tol = 0.5)"]
    # The automatic tolerance varies: drawn on the twin axis, by rule.
    auto = clustering.cluster_counts(merging_pairs)
    fig = plotting.plot_cluster_counts(auto)
    assert len(fig.axes) == 2 and fig.axes[1].get_lines()
    with pytest.raises(ValueError, match="`counts` must be None"):
        plotting.plot_cluster_counts(counts, counts.counts)
    with pytest.raises(ValueError, match="`counts` is needed"):
        plotting.plot_cluster_counts(counts.ts)


def test_plot_energy_takes_the_result_of_simulate_merging():
    run = _merging_solution(beta=4.0)
    fig = plotting.plot_energy(run)
    ax = fig.axes[0]
    line = ax.get_lines()[0]
    # t > 0 and reached; normalised by the run's beta: 1 for one cluster.
    np.testing.assert_allclose(line.get_xdata(), [1.0, 10.0, 100.0])
    np.testing.assert_allclose(
        line.get_ydata(), np.exp(run.log_energy[1:4] + np.log(8.0) - 4.0)
    )
    assert line.get_ydata()[-1] == pytest.approx(1.0)
    assert fig.axes[1].get_ylabel() == "atoms"  # the run's counts
    np.testing.assert_array_equal(fig.axes[1].get_lines()[0].get_ydata(), [3, 2, 1])
    with pytest.raises(ValueError, match="must be None when `ts` is a Merging"):
        plotting.plot_energy(run, log_energy=run.log_energy)
    unknown = clustering.MergingSolution(
        **{**run.__dict__, "log_energy": None, "beta": None}
    )
    with pytest.raises(ValueError, match="without energy"):
        plotting.plot_energy(unknown)


def test_gaussian_figures_take_one_solution_of_gaussian_simulate():
    sol = _gaussian_solution()
    fig = plotting.plot_covariance_eigenvalues(sol)
    ax = fig.axes[0]
    top = ax.get_lines()[1]
    np.testing.assert_allclose(top.get_ydata(), np.exp(np.asarray(sol.ts)))
    fig = plotting.plot_covariance_ellipses(sol, n_ellipses=2)
    assert fig.axes[0].get_title().startswith("Gaussian: success")
    with pytest.raises(TypeError, match="`solutions` must be a GaussianSolution"):
        plotting.plot_covariance_eigenvalues([sol])


def test_blowup_phase_diagram_takes_the_study_of_blowup_times():
    s, r = np.linspace(-1, 1, 4), np.linspace(0, 1, 3)
    times = np.full((3, 4), np.inf)
    times[1:, 2:] = [[0.5, 0.25], [0.2, 0.1]]
    study = _blowup_study(times.ravel())  # row-major: r slow, s fast
    fig = plotting.plot_blowup_phase_diagram(s, r, study)
    ax = fig.axes[0]
    meshes = [c for c in ax.collections if isinstance(c, QuadMesh)]
    finite = [m for m in meshes if np.ma.count(m.get_array()) == 4]
    np.testing.assert_allclose(np.ma.compressed(finite[0].get_array()).sum(), 1.05)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("no blow-up on [0, 5]" in lab for lab in labels)  # study's t_max
    with pytest.raises(ValueError, match="`variant` must be one of"):
        plotting.plot_blowup_phase_diagram(s, r, study, variant="l2")
    with pytest.raises(ValueError, match="12 runs; got 6"):
        plotting.plot_blowup_phase_diagram(s, r, _blowup_study(times.ravel()[:6]))


def test_trajectories_3d_takes_a_solution():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(T, 4, 3))
    ax = plotting.plot_trajectories_3d(_solution(x)).axes[0]
    ref = plotting.plot_trajectories_3d(x, np.linspace(0.0, 1.0, T)).axes[0]
    assert ax.get_title() == ref.get_title()
    np.testing.assert_allclose(ax.get_xlim(), ref.get_xlim())
    with pytest.raises(ValueError, match="`ts` must be None"):
        plotting.plot_trajectories_3d(_solution(x), np.arange(T))


def test_the_other_figures_take_their_results():
    # Already so before; pinned beside the others.
    diagram = clustering.PhaseDiagram(
        betas=np.array([1.0, 4.0]),
        ts=np.linspace(0.0, 3.0, 4),
        density=np.linspace(0.0, 1.0, 8).reshape(2, 4),
        one_cluster=np.zeros((2, 4)),
        completed=np.ones(2),
        mean_steps=np.full(2, 20.0),
        n=8,
        eps=1e-3,
    )
    assert plotting.plot_phase_diagram(diagram).axes
    stab = wasserstein.Stability(
        ts=np.linspace(0.0, 1.0, 3),
        distance=np.ones(3),
        ratio=np.ones(3),
        bound=np.e ** np.arange(3),
        log_bound=np.arange(3.0),
        radius=np.ones(3),
        radius_bound=np.e ** np.arange(3),
        p=2.0,
        method="exact",
        status=("success", "success"),
    )
    assert len(plotting.plot_stability(stab).axes) == 2


# ---- 2. a Solution where positions at one time are expected ----


def _rejections(sol):
    attn = mf.SoftmaxAttention(np.eye(2), A=np.eye(2))
    mu = sol.measure(0)
    return {
        "clusters": lambda: clustering.clusters(sol),
        "detect": lambda: clustering.detect(sol),
        "diameter": lambda: clustering.diameter(sol),
        "polytope": lambda: clustering.polytope(sol),
        "local": lambda: mf.lipschitz.local(attn, sol),
        "Particles": lambda: mf.Particles(sol),
        "MaskedParticles": lambda: mf.MaskedParticles(sol, np.zeros(4)),
    }, {
        "merge": lambda: clustering.merge(sol, 0.1),
        "simulate_merging": lambda: mf.simulate_merging(
            sol, attn, 1.0, merge_tol=0.1, saveat=[0.0, 1.0]
        ),
        "distance": lambda: wasserstein.distance(sol, mu),
        "stability": lambda: wasserstein.stability(mu, sol, attn, [0.0, 1.0]),
    }


def test_functions_of_positions_name_the_argument_when_given_a_solution(
    merging_pairs,
):
    positions, measures = _rejections(merging_pairs)
    for where, call in positions.items():
        with pytest.raises(TypeError) as err:
            call()
        message = str(err.value)
        assert message.startswith(f"{where}: `"), message
        assert "got a Solution: pass " in message and "[-1] is the last" in message
    with pytest.raises(TypeError, match=re.escape("pass sol.x[i] for save time i")):
        clustering.clusters(merging_pairs)
    with pytest.raises(TypeError, match=re.escape("rescale(sol, V)[-1] is the last")):
        clustering.polytope(merging_pairs)
    for where, call in measures.items():
        with pytest.raises(TypeError, match=rf"^{where}: .*sol\.measure\(i\)"):
            call()


def test_other_results_and_measures_are_named_too(merging_pairs):
    # A MergingSolution pads x with NaN rows: its atoms are measure(i).x.
    with pytest.raises(TypeError, match=re.escape("pass sol.measure(i).x")):
        clustering.detect(_merging_solution())
    with pytest.raises(TypeError, match="got a Particles: pass its positions `.x`"):
        clustering.clusters(merging_pairs.measure(-1))
    with pytest.raises(TypeError, match=re.escape("pass sol.gaussian(i)")):
        wasserstein.gaussian_w2(
            _gaussian_solution(), mf.Gaussian(np.zeros(2), np.eye(2))
        )
    rho = np.full((2, 8), 1 / (2 * np.pi))
    dens = density.DensitySolution(np.array([0.0, 1.0]), rho, "success", 3, 2.0, "x")
    for call in (
        lambda: density.count_clusters(dens),
        lambda: density.sample_quantiles(dens, 4),
        lambda: density.circle_w1(dens, np.zeros(3)),
    ):
        with pytest.raises(TypeError, match=re.escape("pass sol.rho[i]")):
            call()
    # A particle Solution is not a density: no misleading hint.
    with pytest.raises(TypeError, match="got a Solution: it has no `rho`"):
        density.count_clusters(merging_pairs)
    with pytest.raises(TypeError, match=re.escape("angles(sol.x[i])")):
        density.circle_w1(rho[0], merging_pairs)


def test_functions_over_save_times_take_a_solution():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(T, 4, 2))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    ts = np.linspace(0.0, 1.0, T)
    ts[-1], x[-1] = np.inf, np.inf  # an early stop: the last save not reached
    sol = _solution(x, ts)
    got = clustering.pair_alignment(sol)
    assert got.shape == (T,) and np.isnan(got[-1])
    np.testing.assert_array_equal(got, clustering.pair_alignment(jnp.asarray(x)))
    theta = density.angles(sol)
    assert theta.shape == (T, 4) and np.all(np.isnan(theta[-1]))
    np.testing.assert_allclose(theta[:-1], density.angles(x[:-1]), rtol=0, atol=0)
    with pytest.raises(TypeError, match="^pair_alignment: `x`"):
        clustering.pair_alignment(_merging_solution())


# ---- 4. statuses by name ----


def test_status_codes_have_public_names():
    assert "Status" in mf.__all__
    assert {s.label: int(s) for s in mf.Status} == {
        "success": 0,
        "blowup": 1,
        "max_steps": 2,
        "sinkhorn_not_converged": 3,
        "failed": 4,
        "stationary": 5,
        "invalid_input": 6,
    }
    sol = _solution(np.zeros((T, 2, 2)) + np.arange(2.0)[:, None])
    assert sol.result == mf.Status.SUCCESS
    assert mf.Status(int(sol.result)).label == sol.status == "success"
    study = _blowup_study([0.5, np.inf, 0.25])
    np.testing.assert_array_equal(
        study.status_names("softmax"), ["blowup", "success", "blowup"]
    )
    assert np.sum(study.status["softmax"] == mf.Status.BLOWUP) == 2
    assert study.classes("softmax") == pytest.approx(
        {"blowup": 2 / 3, "success": 1 / 3}
    )


# ---- 5. reprs show the values ----


def test_reprs_show_key_values_and_shapes_not_arrays(merging_pairs):
    res = mf.lipschitz.LipschitzResult(
        value=jnp.asarray(31.99),
        direction=jnp.zeros((64, 2)),
        iterations=jnp.asarray(17),
        converged=jnp.asarray(True),
        residual=jnp.asarray(3.2e-9),
    )
    assert repr(res) == (
        "LipschitzResult(value=31.99, converged=True, iterations=17, "
        "residual=3.2e-09, direction=f64[64,2])"
    )
    assert repr(merging_pairs) == (
        "Solution(status='success', t_final=1, num_steps=12, blowup_time=inf, "
        "ts=[0, 0.25, 0.5, 0.75, 1], x=f64[5,4,2])"
    )
    assert repr(_merging_solution()) == (
        "MergingSolution(status='max_steps', num_steps=345, t_final=100, atoms=1, "
        "beta=4, ts=[0, 1, 10, 100, 1000], x=f64[5,4,2])"
    )
    assert repr(_gaussian_solution()).startswith(
        "GaussianSolution(status='success', blowup_time=inf, t_final=1, num_steps=7"
    )
    big = np.zeros((3, 4096))
    dens = density.DensitySolution(np.arange(3.0), big, "success", 9, 2.0, "softmax")
    assert repr(dens) == (
        "DensitySolution(status='success', num_steps=9, beta=2, "
        "attention='softmax', ts=[0, 1, 2], rho=f64[3,4096])"
    )
    assert repr(_blowup_study([0.5, np.inf])) == (
        "BlowupStudy(t_max=5, runs={'softmax': 2}, "
        "classes={'softmax': {'success': 0.5, 'blowup': 0.5}})"
    )
    found = clustering.detect(merging_pairs.x[-1], 0.5)
    assert repr(found).startswith("Clusters(number=2, tol=0.5, method='given'")
    for text in (repr(dens), repr(clustering.polytope(merging_pairs.x[-1], 0.5))):
        assert len(text) < 400 and "0., 0." not in text  # nothing dumped


# ---- 7. benchmarks write to scratch by default ----


def test_benchmark_scripts_default_to_a_scratch_directory():
    # benchmarks/results holds the committed results: written only when named.
    scripts = sorted((Path(__file__).parent.parent / "benchmarks").glob("*.py"))
    defaults = []
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "add_argument"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "--out"
            ):
                for kw in node.keywords:
                    if kw.arg == "default":
                        defaults.append((path.name, ast.literal_eval(kw.value)))
    assert defaults, "no --out option found"
    for name, default in defaults:
        assert "benchmarks/results" not in str(default), name
        assert str(default).startswith("out/"), name
