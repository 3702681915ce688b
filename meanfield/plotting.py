"""Figures of particle trajectories, of the Gaussian moment ODE, and of stability.

Particles: planar projections, the sphere, the radius. Gaussians (Castin, Ablin,
Carrillo & Peyre, 2025): covariance ellipses, covariance eigenvalues, and a
phase diagram of blow-up times over a 2-parameter family of attention matrices.
Stability: the measured W_p ratio and support radius against their bounds.

Every function draws on `ax` when given (so figures can be composed) and returns
the `matplotlib.figure.Figure`. New figures are created through pyplot, so they
show in notebooks and with `plt.show()`; close them with `plt.close(fig)` when
done. The backend is left to the user: this module never calls
`matplotlib.use`, and matplotlib itself falls back to the non-interactive Agg
backend when there is no display. (Command-line tools select Agg explicitly.)

Particles are coloured by the angle of their initial position in the first two
plotted coordinates (a cyclic colormap): where the colours of a cluster come
from shows which tokens merged.
"""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import ListedColormap, LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter
from mpl_toolkits.mplot3d.art3d import Line3DCollection

from ._dynamics import Solution
from ._gaussian_ode import GaussianSolution
from ._stability import Stability

_CMAP = "twilight"


def _reached_rows(ts, x) -> tuple[np.ndarray, np.ndarray]:
    """Saved times and states that were reached: finite time and finite state.

    Rows after an early stop (blow-up, max_steps) are +inf in a `Solution`.
    """
    x = np.asarray(x)
    ts = np.arange(x.shape[0], dtype=float) if ts is None else np.asarray(ts)
    if ts.shape != x.shape[:1]:
        raise ValueError(
            f"`ts` must have shape ({x.shape[0]},) to match the trajectories; "
            f"got {ts.shape}."
        )
    keep = np.isfinite(ts) & np.all(np.isfinite(x), axis=(1, 2))
    if not keep.any():
        raise ValueError("no saved state is finite: nothing to plot.")
    return ts[keep], x[keep]


def _subsample(n: int, max_particles: int) -> np.ndarray:
    """Indices of at most `max_particles` of n particles, evenly spread."""
    if max_particles < 1:
        raise ValueError(f"`max_particles` must be >= 1; got {max_particles}.")
    if n <= max_particles:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_particles).round().astype(int))


def _colors(x0: np.ndarray) -> np.ndarray:
    """RGBA (n, 4): cyclic colour of the angle of (x0[:, 0], x0[:, 1])."""
    if x0.shape[1] < 2:
        angle = np.zeros(x0.shape[0])
    else:
        angle = np.arctan2(x0[:, 1], x0[:, 0])
    return plt.get_cmap(_CMAP)((angle + np.pi) / (2 * np.pi))


def _local_mass(x: np.ndarray, weights, cell: float = 0.02) -> np.ndarray:
    """Weight of the grid cell (side `cell`) holding each point, shape (n,).

    A cheap O(n log n) stand-in for the mass near each point, so that a cluster
    of many coincident tokens is drawn as a large dot rather than one small one.
    """
    w = np.asarray(weights, dtype=float)
    _, inverse = np.unique(
        np.floor(x / cell).astype(np.int64), axis=0, return_inverse=True
    )
    inverse = inverse.reshape(-1)
    return np.bincount(inverse, weights=w)[inverse]


def _new_axes(ax, projection: str | None = None, figsize=(5.0, 5.0)):
    if ax is not None:
        if projection == "3d" and ax.name != "3d":
            raise ValueError("`ax` must be a 3-D axes (projection='3d').")
        return ax.figure, ax
    fig = plt.figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot(projection=projection)


def _start_end_legend(ax, t_start: float, t_end: float) -> None:
    # Proxy handles: the scatters are multi-coloured, the legend should be neutral.
    handles = [
        Line2D(
            [], [], ls="", marker="o", mfc="none", mec="0.3", label=f"t = {t_start:.3g}"
        ),
        Line2D([], [], ls="", marker="o", mfc="0.3", mec="k", label=f"t = {t_end:.3g}"),
    ]
    ax.legend(handles=handles, loc="upper right", fontsize="small", framealpha=0.8)


def _equal_3d_limits(ax, pts: np.ndarray) -> None:
    """Cube limits around the points: equal scale on the three axes."""
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    center, half = (lo + hi) / 2, max(float((hi - lo).max()) / 2, 1e-12) * 1.05
    ax.set_xlim(center[0] - half, center[0] + half)
    ax.set_ylim(center[1] - half, center[1] + half)
    ax.set_zlim(center[2] - half, center[2] + half)
    ax.set_box_aspect((1, 1, 1))


def plot_trajectories(
    sol: Solution,
    *,
    ax=None,
    dims: tuple[int, int] = (0, 1),
    max_particles: int = 256,
    title: str | None = None,
) -> Figure:
    """Planar projection of the particle paths t -> (x_i(t)[dims[0]], x_i(t)[dims[1]]).

    Start points are hollow, end points (last reached save time) filled. Save
    times that were not reached (after a blow-up) are skipped.

    Args:
        sol: a `Solution`, x of shape (T, n, d).
        ax: 2-D axes to draw on; None creates a figure.
        dims: the two coordinates to plot.
        max_particles: plot at most this many particles (evenly spread indices).
        title: axes title; None for a default.

    Returns:
        The figure.

    Raises:
        ValueError: `dims` not two distinct coordinates in [0, d), no finite state.
    """
    ts, x = _reached_rows(sol.ts, sol.x)
    d = x.shape[2]
    i, j = dims
    if len(dims) != 2 or i == j or not (0 <= i < d and 0 <= j < d):
        raise ValueError(
            f"`dims` must be two distinct coordinates in [0, {d}); got {dims}."
        )
    x = x[:, _subsample(x.shape[1], max_particles)][:, :, [i, j]]
    colors = _colors(x[0])
    fig, ax = _new_axes(ax)
    # One LineCollection, not n plot calls: fast for hundreds of particles.
    paths = LineCollection(
        np.swapaxes(x, 0, 1), colors=colors, linewidths=0.7, alpha=0.5
    )
    ax.add_collection(paths)
    ax.scatter(x[0, :, 0], x[0, :, 1], s=14, facecolors="none", edgecolors=colors)
    ax.scatter(x[-1, :, 0], x[-1, :, 1], s=22, c=colors, edgecolors="k", linewidths=0.4)
    ax.autoscale_view()
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel(f"$x_{{{i}}}$")
    ax.set_ylabel(f"$x_{{{j}}}$")
    _start_end_legend(ax, ts[0], ts[-1])
    ax.set_title(title if title is not None else "particle trajectories")
    return fig


def _unit_sphere_wireframe(ax) -> None:
    """A light wireframe of S^2 (10-degree meridians and parallels) on 3-D axes."""
    u, v = np.meshgrid(np.linspace(0, 2 * np.pi, 37), np.linspace(0, np.pi, 19))
    ax.plot_wireframe(
        np.cos(u) * np.sin(v),
        np.sin(u) * np.sin(v),
        np.cos(v),
        color="0.6",
        linewidth=0.3,
        alpha=0.5,
    )


def plot_sphere(
    sol: Solution,
    *,
    time_index: int = -1,
    ax=None,
    title: str | None = None,
) -> Figure:
    """Tokens on the unit sphere S^2 at one save time, with faint trajectories.

    Points on the hemisphere facing the viewer are drawn solid and on top; those
    behind are faded. Marker area grows like the square root of the mass in a
    small neighbourhood, so clusters show as large dots. A new figure looks at
    the centroid of the plotted points (where clusters form); on a given `ax`
    the caller's view is kept.

    Args:
        sol: a `Solution` with d = 3 (typically from `normalization="sphere"`).
        time_index: index into the *reached* save times (those after an early
            stop are skipped), so -1 is the last state reached.
        ax: 3-D axes to draw on; None creates a figure. Its depth sorting is
            turned off (`computed_zorder = False`) so the points stay visible.
        title: axes title; None gives "t = ...".

    Returns:
        The figure.

    Raises:
        ValueError: d != 3, `time_index` out of range, `ax` not 3-D.
    """
    ts, x = _reached_rows(sol.ts, sol.x)
    if x.shape[2] != 3:
        raise ValueError(f"`plot_sphere` needs d = 3; got d = {x.shape[2]}.")
    T = x.shape[0]
    if not -T <= time_index < T:
        raise ValueError(f"`time_index` must be in [-{T}, {T}); got {time_index}.")
    k = time_index % T
    colors = _colors(x[0])
    new = ax is None
    fig, ax = _new_axes(ax, "3d")
    if new:
        center = x[k].mean(axis=0)
        if np.linalg.norm(center) > 1e-3:
            ax.view_init(
                elev=np.degrees(
                    np.arcsin(np.clip(center[2] / np.linalg.norm(center), -1, 1))
                ),
                azim=np.degrees(np.arctan2(center[1], center[0])),
            )
    # mplot3d sorts whole collections by mean depth, which can hide every point
    # behind the wireframe: draw in call order instead, points last.
    ax.computed_zorder = False
    _unit_sphere_wireframe(ax)
    if k > 0:
        ax.add_collection3d(
            Line3DCollection(
                np.swapaxes(x[: k + 1], 0, 1), colors=colors, linewidths=0.5, alpha=0.25
            )
        )
    elev, azim = np.radians(ax.elev), np.radians(ax.azim)
    eye = np.array(
        [np.cos(elev) * np.cos(azim), np.cos(elev) * np.sin(azim), np.sin(elev)]
    )
    front = x[k] @ eye >= 0
    sizes = 14 * np.sqrt(x.shape[1] * _local_mass(x[k], sol.initial.weights))
    for mask, alpha in ((~front, 0.25), (front, 1.0)):
        if mask.any():
            ax.scatter(
                *x[k][mask].T,
                s=np.maximum(sizes[mask], 14),
                c=colors[mask],
                edgecolors="k",
                linewidths=0.3,
                alpha=alpha,
                depthshade=False,
            )
    ax.set_xlim(-1, 1)
    ax.set_ylim(-1, 1)
    ax.set_zlim(-1, 1)
    # Zoom in: without axes the default 3-D margins leave the sphere small.
    ax.set_box_aspect((1, 1, 1), zoom=1.3)
    ax.set_axis_off()
    ax.set_title(title if title is not None else f"t = {ts[k]:.3g}")
    return fig


def plot_trajectories_3d(
    x_traj,
    ts=None,
    *,
    ax=None,
    title: str | None = None,
) -> Figure:
    """3-D particle paths from an array, e.g. rescaled trajectories e^{-tV} x(t).

    Start points are hollow, end points filled; axes have equal scale. Rows with
    a non-finite time or state (not reached) are skipped.

    Args:
        x_traj: trajectories, shape (T, n, 3) (NumPy or JAX array).
        ts: times, shape (T,), or None (rows are then numbered 0..T-1).
        ax: 3-D axes to draw on; None creates a figure.
        title: axes title; None for a default.

    Returns:
        The figure.

    Raises:
        ValueError: `x_traj` not of shape (T, n, 3), `ts` of the wrong shape, no
            finite row, `ax` not 3-D.
    """
    x = np.asarray(x_traj)
    if x.ndim != 3 or x.shape[2] != 3:
        raise ValueError(f"`x_traj` must have shape (T, n, 3); got shape {x.shape}.")
    ts, x = _reached_rows(ts, x)
    colors = _colors(x[0])
    fig, ax = _new_axes(ax, "3d")
    ax.add_collection3d(
        Line3DCollection(
            np.swapaxes(x, 0, 1), colors=colors, linewidths=0.6, alpha=0.45
        )
    )
    ax.scatter(*x[0].T, s=12, facecolors="none", edgecolors=colors, depthshade=False)
    ax.scatter(
        *x[-1].T, s=24, c=colors, edgecolors="k", linewidths=0.4, depthshade=False
    )
    _equal_3d_limits(ax, x.reshape(-1, 3))
    ax.set_xlabel("$x_0$")
    ax.set_ylabel("$x_1$")
    ax.set_zlabel("$x_2$")
    _start_end_legend(ax, ts[0], ts[-1])
    ax.set_title(title if title is not None else "particle trajectories")
    return fig


def plot_radius(sol: Solution, *, ax=None) -> Figure:
    """Support radius max_i |x_i(t)| against t (log scale), blow-up time marked.

    Args:
        sol: a `Solution`.
        ax: 2-D axes to draw on; None creates a figure.

    Returns:
        The figure.
    """
    ts, x = _reached_rows(sol.ts, sol.x)
    radius = np.linalg.norm(x, axis=-1).max(axis=-1)
    fig, ax = _new_axes(ax, figsize=(6.0, 4.0))
    ax.semilogy(ts, radius, marker=".", markersize=3, label=r"$\max_i |x_i(t)|$")
    t_star = float(np.asarray(sol.blowup_time))
    if np.isfinite(t_star):
        ax.axvline(t_star, color="C3", ls="--", label=f"blow-up t* = {t_star:.4g}")
    ax.set_xlabel("t")
    ax.set_ylabel("radius")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return fig


# ---- Gaussian moment ODE -----------------------------------------------------------

_TIME_CMAP = "viridis"


def _gaussian_rows(sol: GaussianSolution) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reached rows (ts, mean, cov) of a `GaussianSolution`: finite time and state.

    Save times after a blow-up or another early stop are +inf in the solution.
    """
    ts, mean, cov = (np.asarray(a, dtype=float) for a in (sol.ts, sol.mean, sol.cov))
    keep = (
        np.isfinite(ts)
        & np.all(np.isfinite(mean), axis=1)
        & np.all(np.isfinite(cov), axis=(1, 2))
    )
    if not keep.any():
        raise ValueError("no saved state is finite: nothing to plot.")
    return ts[keep], mean[keep], cov[keep]


def _blowup_time(sol: GaussianSolution) -> float:
    return float(np.asarray(sol.blowup_time))


def _ellipse(mean: np.ndarray, cov: np.ndarray, num: int = 100) -> np.ndarray:
    """1-sigma ellipse {mean + Sigma^{1/2} u : |u| = 1} of N(mean, cov): (num, 2)."""
    lam, U = np.linalg.eigh((cov + cov.T) / 2)
    theta = np.linspace(0, 2 * np.pi, num)
    circle = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    return mean + (circle * np.sqrt(np.maximum(lam, 0))) @ U.T


def plot_covariance_ellipses(
    solutions: dict[str, GaussianSolution],
    *,
    n_ellipses: int = 8,
    axes=None,
    title: str | None = None,
    max_growth: float = 10.0,
) -> Figure:
    """1-sigma ellipses of N(alpha(t), Sigma(t)) in d = 2, one panel per variant.

    The Gaussian moment ODE of Castin, Ablin, Carrillo & Peyre (2025) (MATH.md
    section 3) keeps a Gaussian Gaussian; each panel draws the ellipse
    {alpha(t) + Sigma(t)^{1/2} u : |u| = 1} at `n_ellipses` save times evenly
    spread over the shown range, coloured by time (one colorbar per panel: the
    time ranges differ), with the mean path alpha(t) in black. The panel title
    gives the blow-up time t* when there is one, and the time range drawn.

    Readability near a blow-up: softmax covariances grow like 1/(t* - t), so the
    last reached ellipses would dwarf every earlier one. Each panel therefore
    shows the save times from 0 up to the last one at which the largest 1-sigma
    radius sqrt(lambda_max(Sigma(t))) is at most `max_growth` times its initial
    value (the title then adds "radius <= x`max_growth`"). Only reached save
    times are drawn (finite ts), so a blown-up run ends at the last save time
    before t*. The geometry itself is not distorted (true radii, equal aspect);
    `plot_covariance_eigenvalues` shows the full growth. Axis limits are chosen
    per panel from the drawn ellipses (the scales differ a lot).

    Args:
        solutions: variant name -> `GaussianSolution` with d = 2, e.g.
            {"softmax": ..., "L2": ..., "Sinkhorn": ...}.
        n_ellipses: ellipses per panel (fewer if fewer rows are shown).
        axes: one 2-D axes per variant, in the order of `solutions`; None
            creates a figure with the panels side by side.
        title: figure title (suptitle); None for none.
        max_growth: largest radius growth factor shown (>= 1); inf shows every
            reached save time.

    Returns:
        The figure (of the first axes).

    Raises:
        ValueError: no solutions, d != 2, `n_ellipses` < 1, `max_growth` < 1,
            wrong number of axes, or a solution with no finite state.
    """
    if not solutions:
        raise ValueError("`solutions` must hold at least one GaussianSolution.")
    if n_ellipses < 1:
        raise ValueError(f"`n_ellipses` must be >= 1; got {n_ellipses}.")
    if not max_growth >= 1:
        raise ValueError(f"`max_growth` must be >= 1; got {max_growth}.")
    for name, sol in solutions.items():
        d = np.shape(sol.mean)[-1]
        if d != 2:
            raise ValueError(
                f"`plot_covariance_ellipses` needs d = 2; got d = {d} for {name!r}."
            )
    if axes is None:
        k = len(solutions)
        fig, axes = plt.subplots(
            1, k, figsize=(4.4 * k + 1.0, 4.6), layout="constrained", squeeze=False
        )
        axes = list(axes[0])
    else:
        axes = list(np.ravel(np.asarray(axes, dtype=object)))
        if len(axes) != len(solutions):
            raise ValueError(
                f"`axes` must hold {len(solutions)} axes (one per variant); "
                f"got {len(axes)}."
            )
        fig = axes[0].figure

    shown = {}
    for name, sol in solutions.items():
        ts, mean, cov = _gaussian_rows(sol)
        radius = np.sqrt(np.linalg.eigvalsh(cov)[:, -1])
        # Prefix of rows within the growth cap (row 0 always qualifies).
        over = np.flatnonzero(radius > max_growth * radius[0])
        stop = over[0] if over.size else ts.size
        shown[name] = (ts[:stop], mean[:stop], cov[:stop], stop < ts.size)
    cmap = plt.get_cmap(_TIME_CMAP)
    for ax, (name, (ts, mean, cov, cut)) in zip(axes, shown.items(), strict=True):
        # Per-panel time scale: a softmax blow-up ends long before the others.
        norm = Normalize(0.0, float(ts[-1]) if ts[-1] > 0 else 1.0)
        idx = np.unique(np.linspace(0, ts.size - 1, n_ellipses).round().astype(int))
        curves = np.stack([_ellipse(mean[i], cov[i]) for i in idx])
        ax.add_collection(
            LineCollection(curves, colors=cmap(norm(ts[idx])), linewidths=1.4)
        )
        ax.plot(mean[:, 0], mean[:, 1], color="k", lw=1.0, label=r"mean $\alpha(t)$")
        ax.scatter(mean[idx, 0], mean[idx, 1], s=12, c=cmap(norm(ts[idx])), zorder=3)
        # Square limits around the drawn data (ellipses and mean path), 5% margin:
        # equal aspect without matplotlib overriding fixed limits.
        pts = np.concatenate([curves.reshape(-1, 2), mean])
        lo, hi = pts.min(axis=0), pts.max(axis=0)
        center, half = (lo + hi) / 2, 0.55 * max(float((hi - lo).max()), 1e-12)
        ax.set_xlim(center[0] - half, center[0] + half)
        ax.set_ylim(center[1] - half, center[1] + half)
        ax.set_aspect("equal", adjustable="box")
        ax.set_xlabel("$x_0$")
        ax.set_ylabel("$x_1$")
        ax.grid(True, alpha=0.3)
        sol = solutions[name]
        t_star = _blowup_time(sol)
        if np.isfinite(t_star):
            head = f"{name}: blow-up at t* = {t_star:.4g}"
        else:
            t_end = float(_gaussian_rows(sol)[0][-1])
            head = f"{name}: {sol.status}, no blow-up on [0, {t_end:.3g}]"
        head += f"\nellipses for t in [0, {ts[-1]:.3g}]"
        if cut:
            head += f" (radius <= x{max_growth:g})"
        ax.set_title(head, fontsize="medium")
        ax.legend(loc="upper left", fontsize="small", framealpha=0.8)
        fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="t", shrink=0.8)
    if title is not None:
        fig.suptitle(title)
    return fig


def plot_covariance_eigenvalues(
    solutions: dict[str, GaussianSolution], *, ax=None, title: str | None = None
) -> Figure:
    """Eigenvalues of Sigma(t) against t (log scale), one colour per variant.

    The largest eigenvalue is a solid line, the others dotted; a dashed vertical
    line marks each finite blow-up time t*. Softmax attention on a Gaussian
    blows up like lambda_max ~ 1/(t* - t) when M = V A + A^T V^T has a positive
    direction; L2 (with K of full column rank) and Sinkhorn grow at most
    exponentially (Castin, Ablin, Carrillo & Peyre, 2025; MATH.md section 3).
    Non-positive eigenvalues (rounding after a rank collapse) are not drawn.

    Args:
        solutions: variant name -> `GaussianSolution`.
        ax: 2-D axes to draw on; None creates a figure.
        title: axes title; None for a default.

    Returns:
        The figure.

    Raises:
        ValueError: no solutions, or a solution with no finite state.
    """
    if not solutions:
        raise ValueError("`solutions` must hold at least one GaussianSolution.")
    fig, ax = _new_axes(ax, figsize=(7.0, 4.5))
    for c, (name, sol) in enumerate(solutions.items()):
        color = f"C{c}"
        ts, _, cov = _gaussian_rows(sol)
        lam = np.linalg.eigvalsh(cov)  # ascending, (T, d)
        lam = np.where(lam > 0, lam, np.nan)
        d = lam.shape[1]
        for i in range(d):
            top = i == d - 1
            ax.semilogy(
                ts,
                lam[:, i],
                color=color,
                ls="-" if top else ":",
                lw=1.6 if top else 1.2,
                label=name if top else None,
            )
        t_star = _blowup_time(sol)
        if np.isfinite(t_star):
            ax.axvline(
                t_star, color=color, ls="--", lw=1.0, label=f"{name} t* = {t_star:.4g}"
            )
    handles, _ = ax.get_legend_handles_labels()
    handles += [
        Line2D([], [], color="0.3", ls="-", label=r"$\lambda_{\max}$"),
        Line2D([], [], color="0.3", ls=":", label="other eigenvalues"),
    ]
    ax.legend(handles=handles, fontsize="small", framealpha=0.8)
    ax.set_xlabel("t")
    ax.set_ylabel(r"eigenvalues of $\Sigma(t)$")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title if title is not None else r"covariance eigenvalues")
    return fig


def plot_blowup_phase_diagram(
    s_values,
    r_values,
    times,
    *,
    ax=None,
    t_max: float | None = None,
    point: tuple[float, float] | None = None,
    title: str | None = None,
    xlabel: str = "s",
    ylabel: str = "r",
) -> Figure:
    """Blow-up time over a 2-parameter family of attention matrices A(s, r).

    For softmax attention on a Gaussian the covariance blows up in finite time
    iff M = V A + A^T V^T has a positive direction (closed form
    t* = 1 / lambda_max(Sigma0^{1/2} M Sigma0^{1/2}) when V commutes with M and
    Sigma0; Castin, Ablin, Carrillo & Peyre, 2025; MATH.md section 3). Cells are
    coloured by t* (log scale when t* spans more than a decade); cells without
    blow-up on [0, t_max] (t* = +inf) are light grey, as the colorbar label and
    the legend say; NaN cells (failed solves) are blue.

    Args:
        s_values: first parameter, shape (S,) (x axis), monotonic.
        r_values: second parameter, shape (R,) (y axis), monotonic.
        times: blow-up times, shape (R, S) (row i is r_values[i]); +inf means no
            blow-up on [0, t_max], NaN a failed solve. E.g. from
            `mf.gaussian.blowup_times(...).times[name].reshape(R, S)`.
        ax: 2-D axes to draw on; None creates a figure.
        t_max: horizon of the study (for the labels); None if unknown.
        point: (s, r) marked with a star, e.g. the parameters of a simulated run.
        title: axes title; None for a default.
        xlabel: x axis label.
        ylabel: y axis label.

    Returns:
        The figure.

    Raises:
        ValueError: `s_values`/`r_values` not 1-D and non-empty, or `times` not of
            shape (R, S).
    """
    s = np.asarray(s_values, dtype=float)
    r = np.asarray(r_values, dtype=float)
    times = np.asarray(times, dtype=float)
    if s.ndim != 1 or s.size == 0 or r.ndim != 1 or r.size == 0:
        raise ValueError(
            "`s_values` and `r_values` must be non-empty 1-D arrays; got shapes "
            f"{s.shape} and {r.shape}."
        )
    if times.shape != (r.size, s.size):
        raise ValueError(
            f"`times` must have shape (len(r_values), len(s_values)) = "
            f"({r.size}, {s.size}); got {times.shape}."
        )
    fig, ax = _new_axes(ax, figsize=(6.2, 5.0))
    finite = np.isfinite(times)
    never = np.isposinf(times)
    failed = np.isnan(times)
    horizon = f"[0, {t_max:g}]" if t_max is not None else "the horizon"
    grey, failed_color = "0.85", "tab:blue"  # blue is not in magma
    if never.any():
        ax.pcolormesh(
            s,
            r,
            np.ma.masked_where(~never, np.ones_like(times)),
            cmap=ListedColormap([grey]),
            shading="nearest",
        )
    if failed.any():
        ax.pcolormesh(
            s,
            r,
            np.ma.masked_where(~failed, np.ones_like(times)),
            cmap=ListedColormap([failed_color]),
            shading="nearest",
        )
    if finite.any():
        lo, hi = float(times[finite].min()), float(times[finite].max())
        norm = LogNorm(lo, hi) if lo > 0 and hi > 10 * lo else Normalize(lo, hi)
        mesh = ax.pcolormesh(
            s,
            r,
            np.ma.masked_where(~finite, times),
            cmap="magma",
            norm=norm,
            shading="nearest",
        )
        cbar = fig.colorbar(
            mesh, ax=ax, label=f"blow-up time t*  (grey: no blow-up on {horizon})"
        )
        # Plain numbers (0.5, 2), not 5 x 10^-1, on the (possibly log) colorbar;
        # minor log ticks labelled at 2, 3, 5 x 10^k only, so labels do not collide.
        cbar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        cbar.ax.yaxis.set_minor_formatter(
            FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "235" else "")
        )
    handles = [
        Patch(
            facecolor=grey,
            edgecolor="0.5",
            label=f"no blow-up on {horizon} ({never.mean():.0%})",
        )
    ]
    if failed.any():
        handles.append(
            Patch(facecolor=failed_color, edgecolor="0.5", label="solve failed")
        )
    if point is not None:
        ax.plot(
            *point,
            marker="*",
            ms=14,
            color="white",
            mec="k",
            ls="",
            label="simulated A",
        )
        handles.append(ax.get_lines()[-1])
    ax.legend(handles=handles, loc="upper left", fontsize="small", framealpha=0.9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title if title is not None else "softmax blow-up time")
    return fig


# ---- stability ---------------------------------------------------------------------


def plot_stability(st: Stability, *, title: str | None = None) -> Figure:
    """Stability figure: W_p ratio against its Gronwall bound, radius against its bound.

    Left: log10 of the measured ratio W_p(mu(t), nu(t)) / W_p(mu_0, nu_0) and of the
    bound C(t, R_0) against t. Log10 values are drawn on a linear axis because the
    bound overflows float64 quickly (e^{2|A|R^2} inside an exponential): it is drawn
    from `log_bound`, which stays finite. Right: support radius and R_0 e^{int|V|}
    (log scale).

    Args:
        st: a `Stability` result.
        title: optional figure title.

    Returns:
        The figure (two panels).
    """
    fig, (ax_ratio, ax_radius) = plt.subplots(1, 2, figsize=(10.0, 4.0))
    reached = np.isfinite(st.ratio)
    ts = st.ts[reached]
    label = "conditional " if st.method == "conditional" else ""
    ax_ratio.plot(
        ts,
        np.log10(st.ratio[reached]),
        marker=".",
        label=rf"measured $W_{{{st.p:g}}}$ ratio ({label}{st.method})",
    )
    finite = reached & np.isfinite(st.log_bound)
    if np.any(finite):
        ax_ratio.plot(
            st.ts[finite],
            st.log_bound[finite] / np.log(10),
            color="C3",
            ls="--",
            label=r"Gronwall bound $C(t, R_0)$",
        )
    else:
        ax_ratio.text(
            0.02, 0.95, "no bound for this attention", transform=ax_ratio.transAxes
        )
    ax_ratio.set_xlabel("t")
    ax_ratio.set_ylabel(r"$\log_{10}$ ratio")
    ax_ratio.grid(True, alpha=0.3)
    ax_ratio.legend(fontsize="small")

    ax_radius.semilogy(ts, st.radius[reached], marker=".", label="support radius")
    bounded = reached & np.isfinite(st.radius_bound)
    if np.any(bounded):
        ax_radius.semilogy(
            st.ts[bounded],
            st.radius_bound[bounded],
            color="C3",
            ls="--",
            label=r"$R_0 e^{\int \|V\|}$",
        )
    ax_radius.set_xlabel("t")
    ax_radius.set_ylabel("radius")
    ax_radius.grid(True, which="both", alpha=0.3)
    ax_radius.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


# ---- Lipschitz constants against n ----------------------------------------------


def _slope_label(name: str, slope: float) -> str:
    return f"{name} (slope {slope:.2f})" if np.isfinite(slope) else name


def _log2_ticks(ax, ns: np.ndarray) -> None:
    """Log-log axes with the measured sizes as plain x tick labels."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    # Plain numbers on y too; minor ticks labelled at 2, 3, 5 x 10^k only.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(
        FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "235" else "")
    )
    ax.grid(True, which="both", alpha=0.3)


def plot_lipschitz_scaling(study, *, ax=None, title: str | None = None) -> Figure:
    """Local Lipschitz constant against n (log-log), with the bounds dashed.

    Castin, Ablin & Peyre (ICML 2024): at the configuration of Prop. 3.4 the
    constant grows like sqrt(n), the rate of the upper bound of Thm 3.3; random
    inputs grow more slowly. Series: random inputs in B_R, the Prop. 3.4
    configuration, the best input of the gradient search (markers only), the
    upper and lower bounds (dashed); each legend entry gives the fitted log-log
    slope. Points where Lanczos did not converge are ringed in red.

    Args:
        study: a `ScalingStudy` (`mf.lipschitz.scaling_study`).
        ax: axes to draw on; None creates a figure.
        title: axes title; None for a default naming R.

    Returns:
        The figure.
    """
    fig, ax = _new_axes(ax, figsize=(6.0, 4.5))
    ns = np.asarray(study.ns)
    unconverged = []
    measured = (
        ("random", "random inputs in $B_R$", "C0", "o-", study.random_converged),
        (
            "adversarial",
            "Prop. 3.4 configuration",
            "C1",
            "s-",
            study.adversarial_converged,
        ),
        ("searched", "gradient search", "C2", "^", study.searched_converged),
    )
    for name, label, color, style, ok in measured:
        values = getattr(study, name)
        if values is None:
            continue
        values = np.asarray(values, float)
        keep = np.isfinite(values)
        if not keep.any():
            continue
        ax.plot(
            ns[keep],
            values[keep],
            style,
            color=color,
            ms=6,
            label=_slope_label(label, study.slopes.get(name, np.nan)),
        )
        bad = keep & ~np.asarray(ok, bool)
        unconverged += list(zip(ns[bad], values[bad], strict=True))
    bounds = (
        ("upper", "upper bound (Thm 3.3)", "C3"),
        ("lower", "lower bound (Prop. 3.4)", "C4"),
    )
    for name, label, color in bounds:
        values = getattr(study, name)
        if values is not None:
            ax.plot(
                ns,
                values,
                "--",
                color=color,
                label=_slope_label(label, study.slopes.get(name, np.nan)),
            )
    if unconverged:
        xs, ys = zip(*unconverged, strict=True)
        ax.plot(
            xs, ys, "o", ms=11, mfc="none", mec="red", label="Lanczos not converged"
        )
    _log2_ticks(ax, ns)
    ax.set_xlabel("number of tokens n")
    ax.set_ylabel(r"local Lipschitz constant $\|D_X f\|_2$")
    ax.set_title(
        title if title is not None else f"self-attention on $B_R$, R = {study.R:g}"
    )
    ax.legend(fontsize="small")
    return fig


def plot_real_model_lipschitz(result, *, ax=None, title: str | None = None) -> Figure:
    """Local Lipschitz constant of each attention layer against sequence length.

    As in Castin, Ablin & Peyre (ICML 2024), Fig. 1: one line per layer on
    log-log axes, the fitted slope in the legend, and a dotted sqrt(n) guide.

    Args:
        result: a `RealModelStudy` (`mf.lipschitz.real_model_study`).
        ax: axes to draw on; None creates a figure.
        title: axes title; None for a default.

    Returns:
        The figure.
    """
    fig, ax = _new_axes(ax, figsize=(6.0, 4.5))
    lengths = np.asarray(result.lengths)
    values = np.asarray(result.values, float)
    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, max(len(values), 1)))
    for layer, row, slope, color in zip(
        result.layers, values, result.slopes, colors, strict=True
    ):
        ax.plot(
            lengths,
            row,
            "o-",
            color=color,
            ms=4,
            label=_slope_label(f"layer {int(layer)}", slope),
        )
    first = values[:, 0]
    first = first[np.isfinite(first) & (first > 0)]
    if lengths.size > 1 and first.size:
        # sqrt(n) guide through the geometric mean of the first column.
        ax.plot(
            lengths,
            np.exp(np.mean(np.log(first))) * np.sqrt(lengths / lengths[0]),
            ":",
            color="0.4",
            label=r"$\propto \sqrt{n}$",
        )
    _log2_ticks(ax, lengths)
    ax.set_xlabel("sequence length n")
    ax.set_ylabel(r"local Lipschitz constant $\|D_X f\|_2$")
    ax.set_title(title if title is not None else "self-attention layers on real text")
    ax.legend(fontsize="small", ncol=2)
    return fig


# ---- clustering ------------------------------------------------------------------

_TOL_AXES_LABEL = "meanfield: tolerance"


def _tolerance_axes(ax):
    """The twin y-axis holding tolerance curves of `ax`, created on first use."""
    for other in ax.figure.axes:
        if (
            other is not ax
            and other.get_label() == _TOL_AXES_LABEL
            and other.get_shared_x_axes().joined(ax, other)
        ):
            return other
    twin = ax.twinx()
    twin.set_label(_TOL_AXES_LABEL)
    twin.set_yscale("log")
    twin.set_ylabel("tolerance (dashed)")
    return twin


def plot_cluster_counts(
    ts,
    counts,
    *,
    tol=None,
    ax=None,
    title: str | None = None,
    label: str | None = None,
) -> Figure:
    """Number of clusters against t, as a step plot.

    Tokens under self-attention merge into clusters (Geshkovski, Letrouit,
    Polyanskiy & Rigollet, 2023): the count is piecewise constant and, in the
    long run, non-increasing. The y-axis is logarithmic when the counts span more
    than a factor 10 (from n tokens down to a few clusters), with plain integer
    labels. Call again on the same `ax` to compare runs (`label` names each
    curve). Times that are not finite (save times after an early stop) are
    skipped.

    Args:
        ts: times, shape (T,).
        counts: number of clusters at each time, shape (T,).
        tol: the clustering tolerance: a scalar, given in the legend, or one per
            time, shape (T,), drawn dashed against a logarithmic right axis when
            it varies. None for no annotation.
        ax: 2-D axes to draw on; None creates a figure.
        title: axes title; None for a default.
        label: legend label of this curve; None for none (unless `tol` is given).

    Returns:
        The figure.

    Raises:
        ValueError: `ts`, `counts` or `tol` of the wrong shape, no finite time,
            or a negative count.
    """
    ts = np.asarray(ts, dtype=float)
    counts = np.asarray(counts)
    if ts.ndim != 1:
        raise ValueError(f"`ts` must have shape (T,); got shape {ts.shape}.")
    if counts.shape != ts.shape:
        raise ValueError(
            f"`counts` must have shape {ts.shape} to match `ts`; got {counts.shape}."
        )
    tols = None if tol is None else np.asarray(tol, dtype=float)
    if tols is not None and tols.shape not in ((), ts.shape):
        raise ValueError(
            f"`tol` must be a scalar or have shape {ts.shape}; got {tols.shape}."
        )
    keep = np.isfinite(ts) & np.isfinite(counts.astype(float))
    if not keep.any():
        raise ValueError("no finite time with a finite count: nothing to plot.")
    ts, counts = ts[keep], counts[keep]
    if np.any(counts < 0):
        raise ValueError("`counts` must be nonnegative.")
    if tols is not None and tols.ndim == 1:
        tols = tols[keep]
        finite_tols = tols[np.isfinite(tols)]
        if finite_tols.size and np.all(finite_tols == finite_tols[0]):
            tols = finite_tols[0]  # constant: annotate once, in the legend
    fig, ax = _new_axes(ax, figsize=(6.0, 4.0))
    text = label
    if tols is not None and tols.ndim == 0:
        suffix = f"tol = {float(tols):.3g}"
        text = f"{label} ({suffix})" if label else suffix
    (line,) = ax.step(ts, counts, where="post", label=text)
    positive = counts[counts > 0]
    if positive.size and positive.max() > 10 * positive.min():
        ax.set_yscale("log")
    if ax.get_yscale() == "log":
        # Plain numbers (2, 50, 200), not 2 x 10^0: counts are integers.
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(
            FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else "")
        )
    else:
        ax.yaxis.get_major_locator().set_params(integer=True)
    handles = []
    if tols is not None and tols.ndim == 1:
        twin = _tolerance_axes(ax)
        ok = np.isfinite(tols) & (tols > 0)
        twin.plot(
            ts[ok],
            tols[ok],
            ls="--",
            lw=0.9,
            color=line.get_color(),
            label=f"{label} tolerance" if label else "tolerance",
        )
        handles = twin.get_lines()
    ax.set_xlabel("t")
    ax.set_ylabel("number of clusters")
    ax.grid(True, which="both", alpha=0.3)
    labelled = [h for h in ax.get_lines() + list(handles) if h.get_label()[:1] != "_"]
    if labelled:
        ax.legend(handles=labelled, fontsize="small")
    ax.set_title(title if title is not None else "clusters")
    return fig


# ---- animations ------------------------------------------------------------------

# Re-exported here, next to the still figures; `_animation` imports this module's
# helpers only when `animate` runs, so there is no import cycle.
from ._animation import animate as animate  # noqa: E402
