"""Figures hold what they claim: axes, labels and the plotted data, read back from
matplotlib's objects (not from file sizes).

Solutions are built from closed-form paths (no solve to compile), so every
expected value is known exactly.
"""

import matplotlib

matplotlib.use("Agg")

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import LineCollection, QuadMesh
from mpl_toolkits.mplot3d.art3d import Path3DCollection

import meanfield as mf
from meanfield import _status, plotting

T = 6


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _solution(ts, x, *, blowup_time=np.inf):
    reached = np.isfinite(ts)
    return mf.Solution(
        ts=jnp.asarray(ts),
        x=jnp.asarray(x),
        blowup_time=jnp.asarray(blowup_time),
        result=jnp.asarray(_status.SUCCESS if reached.all() else _status.BLOWUP),
        t_final=jnp.asarray(ts[reached][-1]),
        num_steps=jnp.asarray(T),
        initial=mf.Particles(x[0]),
    )


@pytest.fixture(scope="module")
def planar():
    """n = 5 tokens in R^3 moving along straight lines, reached at every save time."""
    rng = np.random.default_rng(0)
    x0, v = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    ts = np.linspace(0.0, 1.0, T)
    return _solution(ts, x0 + ts[:, None, None] * v)


@pytest.fixture(scope="module")
def blown_up():
    """Radius e^t up to t = 0.6, then +inf rows (not reached), blow-up at 0.7."""
    ts = np.linspace(0.0, 1.0, T)
    x = np.exp(ts)[:, None, None] * np.array([[1.0, 0.0], [0.0, 0.5]])
    ts, x = ts.copy(), x.copy()
    ts[4:], x[4:] = np.inf, np.inf
    return _solution(ts, x, blowup_time=0.7)


def _gaussian_solution(ts, cov, *, blowup_time=np.inf):
    ts = np.asarray(ts, float)
    return mf.gaussian.GaussianSolution(
        ts=jnp.asarray(ts),
        mean=jnp.asarray(np.outer(ts, [1.0, -1.0])),
        cov=jnp.asarray(cov),
        blowup_time=jnp.asarray(blowup_time),
        result=jnp.asarray(_status.SUCCESS),
        t_final=jnp.asarray(ts[-1]),
        num_steps=jnp.asarray(len(ts)),
    )


def test_trajectories_draw_every_path_in_the_chosen_coordinates(planar):
    fig = plotting.plot_trajectories(planar, dims=(2, 0), title="paths")
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == (
        "$x_{2}$",
        "$x_{0}$",
        "paths",
    )
    (paths,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    segments = paths.get_segments()
    assert len(segments) == 5
    x = np.asarray(planar.x)
    for i, seg in enumerate(segments):
        np.testing.assert_allclose(seg, x[:, i][:, [2, 0]])
    starts, ends = (c for c in ax.collections if c is not paths)
    np.testing.assert_allclose(starts.get_offsets(), x[0][:, [2, 0]])
    np.testing.assert_allclose(ends.get_offsets(), x[-1][:, [2, 0]])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["t = 0", "t = 1"]


def test_trajectories_subsample_and_reject_bad_dims(planar):
    fig = plotting.plot_trajectories(planar, max_particles=2)
    (paths,) = [c for c in fig.axes[0].collections if isinstance(c, LineCollection)]
    assert len(paths.get_segments()) == 2
    with pytest.raises(ValueError, match="`dims` must be two distinct"):
        plotting.plot_trajectories(planar, dims=(1, 1))


def test_trajectories_skip_rows_that_were_not_reached(blown_up):
    fig = plotting.plot_trajectories(blown_up)
    (paths,) = [c for c in fig.axes[0].collections if isinstance(c, LineCollection)]
    assert all(seg.shape == (4, 2) for seg in paths.get_segments())
    assert np.all(np.isfinite(np.concatenate(paths.get_segments())))


def test_trajectories_3d_draws_paths_with_equal_axes(planar):
    x = np.asarray(planar.x)
    fig = plotting.plot_trajectories_3d(x, np.asarray(planar.ts), title="3d")
    ax = fig.axes[0]
    assert ax.name == "3d"
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_zlabel()) == (
        "$x_0$",
        "$x_1$",
        "$x_2$",
    )
    spans = [np.ptp(lim) for lim in (ax.get_xlim(), ax.get_ylim(), ax.get_zlim())]
    np.testing.assert_allclose(spans, spans[0])
    # Every point lies inside the limits.
    for k, lim in enumerate((ax.get_xlim(), ax.get_ylim(), ax.get_zlim())):
        assert lim[0] <= x[..., k].min() and x[..., k].max() <= lim[1]


def test_radius_plots_the_largest_norm_and_marks_the_blowup(blown_up):
    fig = plotting.plot_radius(blown_up)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("t", "radius")
    radius, marker = ax.get_lines()
    ts = np.asarray(blown_up.ts)[:4]
    np.testing.assert_allclose(radius.get_xdata(), ts)
    np.testing.assert_allclose(radius.get_ydata(), np.exp(ts))
    np.testing.assert_allclose(marker.get_xdata(), [0.7, 0.7])
    assert "blow-up t* = 0.7" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_sphere_shows_the_chosen_time_on_fixed_limits():
    rng = np.random.default_rng(2)
    x0 = rng.normal(size=(6, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    ts = np.linspace(0.0, 1.0, T)
    sol = _solution(ts, np.broadcast_to(x0, (T, 6, 3)))
    fig = plotting.plot_sphere(sol, time_index=2)
    ax = fig.axes[0]
    assert ax.get_title() == "t = 0.4"
    for lim in (ax.get_xlim(), ax.get_ylim(), ax.get_zlim()):
        np.testing.assert_allclose(lim, (-1, 1))
    # Front and back points together are the 6 tokens at that time.
    points = [c for c in ax.collections if isinstance(c, Path3DCollection)]
    assert sum(len(c.get_offsets()) for c in points) == 6
    with pytest.raises(ValueError, match="needs d = 3"):
        plotting.plot_sphere(_solution(ts, np.zeros((T, 2, 2))))


def test_covariance_eigenvalues_are_the_plotted_lines():
    ts = np.linspace(0.0, 1.0, T)
    lam = np.stack([np.exp(ts), np.exp(3 * ts)], axis=1)
    cov = np.einsum("tk,kl->tkl", lam, np.eye(2))
    fig = plotting.plot_covariance_eigenvalues(
        {"softmax": _gaussian_solution(ts, cov, blowup_time=0.9)}
    )
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert ax.get_ylabel() == r"eigenvalues of $\Sigma(t)$"
    small, large, t_star = ax.get_lines()
    np.testing.assert_allclose(small.get_ydata(), np.exp(ts))
    np.testing.assert_allclose(large.get_ydata(), np.exp(3 * ts))
    assert (small.get_linestyle(), large.get_linestyle()) == (":", "-")
    np.testing.assert_allclose(t_star.get_xdata(), [0.9, 0.9])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["softmax", "softmax t* = 0.9"]


def test_covariance_ellipses_are_one_sigma():
    ts = np.linspace(0.0, 1.0, T)
    cov = np.broadcast_to(np.diag([4.0, 1.0]), (T, 2, 2))
    fig = plotting.plot_covariance_ellipses(
        {"L2": _gaussian_solution(ts, cov)}, n_ellipses=3
    )
    ax = fig.axes[0]  # the colorbar is axes 1
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("$x_0$", "$x_1$")
    assert ax.get_title().startswith("L2: success, no blow-up on [0, 1]")
    (ellipses,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    curves = ellipses.get_segments()
    assert len(curves) == 3
    # Rows 0, 2 (2.5 rounded to even) and 5 of the 6 save times.
    for curve, t in zip(curves, [0.0, 0.4, 1.0], strict=True):
        u = (curve - np.array([t, -t])) / np.array([2.0, 1.0])
        np.testing.assert_allclose(np.linalg.norm(u, axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(ax.get_lines()[0].get_xdata(), ts)


def test_phase_diagram_colours_the_given_times():
    s, r = np.linspace(-1, 1, 4), np.linspace(0, 1, 3)
    times = np.full((3, 4), np.inf)
    times[1:, 2:] = [[0.5, 0.25], [0.2, 0.1]]
    fig = plotting.plot_blowup_phase_diagram(s, r, times, t_max=5.0, xlabel="s")
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("s", "r")
    assert ax.get_title() == "softmax blow-up time"
    meshes = [c for c in ax.collections if isinstance(c, QuadMesh)]
    finite = [m for m in meshes if np.ma.count(m.get_array()) == 4]
    assert len(finite) == 1
    np.testing.assert_allclose(np.ma.compressed(finite[0].get_array()).sum(), 1.05)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(lab.startswith("no blow-up on") and "67%" in lab for lab in labels)


def test_rescaled_paths_are_labelled_z(planar):
    # Rescaled tokens z = e^{-tV} x are not x: the axes say so.
    x, ts = np.asarray(planar.x), np.asarray(planar.ts)
    ax = plotting.plot_trajectories_3d(x, ts, coordinate="z").axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_zlabel()) == (
        "$z_0$",
        "$z_1$",
        "$z_2$",
    )
    ax = plotting.plot_trajectories(planar, dims=(0, 2), coordinate="z").axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("$z_{0}$", "$z_{2}$")


def test_radius_title(blown_up):
    ax = plotting.plot_radius(blown_up, title="softmax, causal mask").axes[0]
    assert ax.get_title() == "softmax, causal mask"


def _scaling_study():
    from meanfield.lipschitz import ScalingStudy

    ns = np.array([16, 32, 64, 128])
    root = np.sqrt(ns / 16.0)
    return ScalingStudy(
        ns=ns,
        R=3.0,
        random=np.array([4.0, 3.9, 3.5, 3.0]),
        random_converged=np.ones(4, bool),
        adversarial=4.0 * root,
        adversarial_converged=np.ones(4, bool),
        searched=np.array([20.0, 30.0, np.nan, np.nan]),
        searched_converged=np.array([True, True, False, False]),
        upper=120.0 * root,
        lower=4.0 * root,  # equal to the Prop. 3.4 values, as in a real study
        slopes={"random": -0.1, "adversarial": 0.5, "upper": 0.5, "lower": 0.5},
        wall_s=np.ones(4),
    )


def test_lipschitz_legend_hides_no_curve_and_the_lower_bound_shows():
    fig = plotting.plot_lipschitz_scaling(_scaling_study())
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert any(lab.startswith("upper bound") for lab in labels)
    assert any(lab.startswith("lower bound") for lab in labels)
    # The legend sits outside the plotting area: it covers no curve.
    renderer = fig.canvas.get_renderer()
    box, area = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert box.y1 <= area.y0
    # The lower bound coincides with the Prop. 3.4 curve: drawn as a band wider
    # than that curve and beneath it, so both stay visible.
    lines = {line.get_label().split(" (")[0]: line for line in ax.get_lines()}
    lower, config = lines["lower bound"], lines["Prop. 3.4 configuration"]
    np.testing.assert_allclose(lower.get_ydata(), config.get_ydata())
    assert lower.get_linewidth() >= 3 * config.get_linewidth()
    assert lower.get_zorder() < config.get_zorder()


def test_energy_is_normalised_by_beta_on_a_log_time_axis():
    ts = np.array([0.0, 1.0, 10.0, 100.0, np.inf])
    beta = 4.0
    log_e = np.array([1.0, 2.0, 3.0, beta - np.log(2 * beta), np.nan])
    fig = plotting.plot_energy(ts, log_energy=log_e, beta=beta, counts=[5, 4, 2, 1, 0])
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    line = ax.get_lines()[0]
    np.testing.assert_allclose(line.get_xdata(), [1.0, 10.0, 100.0])  # t > 0, finite
    np.testing.assert_allclose(
        line.get_ydata(), np.exp(log_e[1:4] + np.log(2 * beta) - beta)
    )
    assert line.get_ydata()[-1] == pytest.approx(1.0)  # one cluster
    assert fig.axes[1].get_ylabel() == "atoms"
    with pytest.raises(ValueError, match="exactly one"):
        plotting.plot_energy(ts, energy=np.ones(5), log_energy=log_e)


def test_density_heat_map_and_binned_density_beside_the_particles():
    from meanfield import density

    N, ts = 16, np.array([0.0, 1.0])
    rho = np.full((2, N), 1 / (2 * np.pi))
    rho[1] = 0.0
    rho[1, :4] = 1 / (4 * 2 * np.pi / N)  # all mass on [0, pi/2)
    sol = density.DensitySolution(ts, rho, "success", 3, 2.0, "softmax")
    theta = np.linspace(0.1, 1.4, 8)
    x = np.stack([np.cos(theta), np.sin(theta)], -1)
    particles = _solution(ts, np.stack([x, x]))
    fig = plotting.plot_density(sol, particles=particles, bins=4)
    heat = [c for c in fig.axes[0].collections if isinstance(c, QuadMesh)][0]
    np.testing.assert_allclose(np.asarray(heat.get_array()).reshape(2, N), rho)
    (right,) = [ax for ax in fig.axes if ax.get_title() == "t = 1"]
    bars = [p.get_height() for p in right.patches[:4]]
    np.testing.assert_allclose(bars, [1 / (np.pi / 2), 0, 0, 0])
    stairs = right.patches[4].get_data().values  # the density, in the same bins
    np.testing.assert_allclose(stairs, [1 / (np.pi / 2), 0, 0, 0])
    with pytest.raises(ValueError, match="`axes`"):
        plotting.plot_density(sol, particles=particles, axes=[fig.axes[0]])
