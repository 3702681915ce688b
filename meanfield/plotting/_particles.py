"""Particle figures: planar trajectories, the sphere, 3-D trajectories, the radius."""

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from mpl_toolkits.mplot3d.art3d import Line3DCollection

from .._dynamics import Solution
from ._common import (
    angle_colors,
    cell_mass,
    equal_3d_limits,
    new_axes,
    reached_rows,
    start_end_legend,
    subsample,
    unit_sphere_wireframe,
)


def plot_trajectories(
    sol: Solution,
    *,
    ax=None,
    dims: tuple[int, int] = (0, 1),
    max_particles: int = 256,
    title: str | None = None,
    coordinate: str = "x",
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
        coordinate: the symbol of the plotted state in the axis labels
            ("z" for rescaled tokens z = e^{-tV} x put in `sol.x`).

    Returns:
        The figure.

    Raises:
        ValueError: `dims` not two distinct coordinates in [0, d), no finite state.
    """
    ts, x = reached_rows(sol.ts, sol.x)
    d = x.shape[2]
    i, j = dims
    if len(dims) != 2 or i == j or not (0 <= i < d and 0 <= j < d):
        raise ValueError(
            f"`dims` must be two distinct coordinates in [0, {d}); got {dims}."
        )
    x = x[:, subsample(x.shape[1], max_particles)][:, :, [i, j]]
    colors = angle_colors(x[0])
    fig, ax = new_axes(ax)
    # One LineCollection, not n plot calls: fast for hundreds of particles.
    paths = LineCollection(
        np.swapaxes(x, 0, 1), colors=colors, linewidths=0.7, alpha=0.5
    )
    ax.add_collection(paths)
    ax.scatter(x[0, :, 0], x[0, :, 1], s=14, facecolors="none", edgecolors=colors)
    ax.scatter(x[-1, :, 0], x[-1, :, 1], s=22, c=colors, edgecolors="k", linewidths=0.4)
    ax.autoscale_view()
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel(f"${coordinate}_{{{i}}}$")
    ax.set_ylabel(f"${coordinate}_{{{j}}}$")
    start_end_legend(ax, ts[0], ts[-1])
    ax.set_title(title if title is not None else "particle trajectories")
    return fig


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
    ts, x = reached_rows(sol.ts, sol.x)
    if x.shape[2] != 3:
        raise ValueError(f"`plot_sphere` needs d = 3; got d = {x.shape[2]}.")
    T = x.shape[0]
    if not -T <= time_index < T:
        raise ValueError(f"`time_index` must be in [-{T}, {T}); got {time_index}.")
    k = time_index % T
    colors = angle_colors(x[0])
    new = ax is None
    fig, ax = new_axes(ax, "3d")
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
    unit_sphere_wireframe(ax)
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
    sizes = 14 * np.sqrt(x.shape[1] * cell_mass(x[k], sol.initial.weights))
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
    coordinate: str = "x",
) -> Figure:
    """3-D particle paths, e.g. of rescaled trajectories e^{-tV} x(t).

    Start points are hollow, end points filled; axes have equal scale. Rows with
    a non-finite time or state (not reached) are skipped.

    Args:
        x_traj: trajectories, shape (T, n, 3) (NumPy or JAX array), or a
            `Solution` with d = 3 (its `x`, at its save times `ts`).
        ts: times, shape (T,), or None (rows are then numbered 0..T-1); None
            for a `Solution`.
        ax: 3-D axes to draw on; None creates a figure.
        title: axes title; None for a default.
        coordinate: the symbol of the plotted state in the axis labels ("z" for
            rescaled tokens z = e^{-tV} x).

    Returns:
        The figure.

    Raises:
        ValueError: `x_traj` not of shape (T, n, 3), `ts` of the wrong shape (or
            given with a `Solution`), no finite row, `ax` not 3-D.
    """
    if isinstance(x_traj, Solution):
        if ts is not None:
            raise ValueError("`ts` must be None when `x_traj` is a Solution.")
        x_traj, ts = x_traj.x, x_traj.ts
    x = np.asarray(x_traj)
    if x.ndim != 3 or x.shape[2] != 3:
        raise ValueError(f"`x_traj` must have shape (T, n, 3); got shape {x.shape}.")
    ts, x = reached_rows(ts, x)
    colors = angle_colors(x[0])
    fig, ax = new_axes(ax, "3d")
    ax.add_collection3d(
        Line3DCollection(
            np.swapaxes(x, 0, 1), colors=colors, linewidths=0.6, alpha=0.45
        )
    )
    ax.scatter(*x[0].T, s=12, facecolors="none", edgecolors=colors, depthshade=False)
    ax.scatter(
        *x[-1].T, s=24, c=colors, edgecolors="k", linewidths=0.4, depthshade=False
    )
    equal_3d_limits(ax, x.reshape(-1, 3))
    ax.set_xlabel(f"${coordinate}_0$")
    ax.set_ylabel(f"${coordinate}_1$")
    ax.set_zlabel(f"${coordinate}_2$")
    start_end_legend(ax, ts[0], ts[-1])
    ax.set_title(title if title is not None else "particle trajectories")
    return fig


def plot_radius(sol: Solution, *, ax=None, title: str | None = None) -> Figure:
    """Support radius max_i |x_i(t)| against t (log scale), blow-up time marked.

    Args:
        sol: a `Solution`.
        ax: 2-D axes to draw on; None creates a figure.
        title: axes title; None for none.

    Returns:
        The figure.
    """
    ts, x = reached_rows(sol.ts, sol.x)
    radius = np.linalg.norm(x, axis=-1).max(axis=-1)
    fig, ax = new_axes(ax, figsize=(6.0, 4.0))
    ax.semilogy(ts, radius, marker=".", markersize=3, label=r"$\max_i |x_i(t)|$")
    t_star = float(np.asarray(sol.blowup_time))
    if np.isfinite(t_star):
        ax.axvline(t_star, color="C3", ls="--", label=f"blow-up t* = {t_star:.4g}")
    ax.set_xlabel("t")
    ax.set_ylabel("radius")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    if title is not None:
        ax.set_title(title)
    return fig
