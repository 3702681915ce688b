"""Helpers shared by the figures: reached rows, subsampling, colours, axes."""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

_CMAP = "twilight"


def reached_rows(ts, x) -> tuple[np.ndarray, np.ndarray]:
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


def subsample(n: int, max_particles: int) -> np.ndarray:
    """Indices of at most `max_particles` of n particles, evenly spread."""
    if max_particles < 1:
        raise ValueError(f"`max_particles` must be >= 1; got {max_particles}.")
    if n <= max_particles:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_particles).round().astype(int))


def angle_colors(x0: np.ndarray) -> np.ndarray:
    """RGBA (n, 4): cyclic colour of the angle of (x0[:, 0], x0[:, 1])."""
    if x0.shape[1] < 2:
        angle = np.zeros(x0.shape[0])
    else:
        angle = np.arctan2(x0[:, 1], x0[:, 0])
    return plt.get_cmap(_CMAP)((angle + np.pi) / (2 * np.pi))


def cell_mass(x: np.ndarray, weights, cell: float = 0.02) -> np.ndarray:
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


def new_axes(ax, projection: str | None = None, figsize=(5.0, 5.0)):
    if ax is not None:
        if projection == "3d" and ax.name != "3d":
            raise ValueError("`ax` must be a 3-D axes (projection='3d').")
        return ax.figure, ax
    fig = plt.figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot(projection=projection)


def start_end_legend(ax, t_start: float, t_end: float) -> None:
    # Proxy handles: the scatters are multi-coloured, the legend should be neutral.
    handles = [
        Line2D(
            [], [], ls="", marker="o", mfc="none", mec="0.3", label=f"t = {t_start:.3g}"
        ),
        Line2D([], [], ls="", marker="o", mfc="0.3", mec="k", label=f"t = {t_end:.3g}"),
    ]
    ax.legend(handles=handles, loc="upper right", fontsize="small", framealpha=0.8)


def equal_3d_limits(ax, pts: np.ndarray) -> None:
    """Cube limits around the points: equal scale on the three axes."""
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    center, half = (lo + hi) / 2, max(float((hi - lo).max()) / 2, 1e-12) * 1.05
    ax.set_xlim(center[0] - half, center[0] + half)
    ax.set_ylim(center[1] - half, center[1] + half)
    ax.set_zlim(center[2] - half, center[2] + half)
    ax.set_box_aspect((1, 1, 1))


def unit_sphere_wireframe(ax) -> None:
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
