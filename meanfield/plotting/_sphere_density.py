"""Densities on S^2 as maps: Mollweide panels at save times, and their animation."""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ..density._sphere import SphereSolution
from ._animation import movie_writer


def _check_solution(sol) -> SphereSolution:
    if not isinstance(sol, SphereSolution):
        raise ValueError(
            f"`sol` must be a `density.SphereSolution`; got {type(sol).__name__}."
        )
    return sol


def _edges(sol: SphereSolution) -> tuple[np.ndarray, np.ndarray]:
    """Longitude (nlon + 1,) and latitude (nlat + 1,) cell edges for pcolormesh.

    Longitudes shifted to [-pi, pi) (Mollweide axes), latitudes from the north
    pole down: the Gauss nodes' midpoints, closed by the poles.
    """
    grid = sol.grid
    step = 2 * np.pi / grid.nlon
    lon = np.arange(grid.nlon + 1) * step - 0.5 * step - np.pi
    lat = 0.5 * np.pi - np.asarray(grid.theta)
    mid = 0.5 * (lat[1:] + lat[:-1])
    return lon, np.concatenate([[0.5 * np.pi], mid, [-0.5 * np.pi]])


def _map_values(sol: SphereSolution, i: int) -> np.ndarray:
    """The density / (uniform density) at save i, longitudes rolled to start at -pi."""
    rho = np.asarray(sol.rho[i]) * (4 * np.pi)
    return np.roll(rho, sol.grid.nlon // 2, axis=1)


def _reached(sol: SphereSolution) -> np.ndarray:
    return np.nonzero(np.isfinite(sol.ts))[0]


def plot_sphere_density(
    sol: SphereSolution,
    indices=None,
    *,
    columns: int = 4,
    title: str | None = None,
) -> Figure:
    """Mollweide maps of a density on S^2 at some save times.

    The colour is rho in units of the uniform density 1 / (4 pi) (1: uniform;
    clusters reach hundreds), each panel with its own colour scale.

    Args:
        sol: a `density.SphereSolution` (`density.simulate_sphere`).
        indices: save indices to draw (at most 12); None: four evenly spaced
            reached save times, first and last included.
        columns: panels per row.
        title: figure title.

    Returns:
        The matplotlib `Figure`.

    Raises:
        ValueError: `sol` not a `SphereSolution`, no save time reached, or
            `indices` not valid save indices of reached times (1 to 12 of
            them).
    """
    sol = _check_solution(sol)
    reached = _reached(sol)
    if reached.size == 0:
        raise ValueError("`sol` reached no save time: nothing to draw.")
    if indices is None:
        picks = np.linspace(0, reached.size - 1, min(4, reached.size))
        indices = reached[np.round(picks).astype(int)]
    indices = [int(i) for i in np.atleast_1d(indices)]
    if not 1 <= len(indices) <= 12 or any(i not in set(reached) for i in indices):
        raise ValueError(
            "`indices` must be 1 to 12 indices of reached save times "
            f"(0..{reached[-1]}); got {indices}."
        )
    columns = max(1, min(int(columns), len(indices)))
    rows = -(-len(indices) // columns)
    fig = plt.figure(figsize=(3.6 * columns, 2.2 * rows + 0.4), layout="constrained")
    lon, lat = _edges(sol)
    for k, i in enumerate(indices):
        ax = fig.add_subplot(rows, columns, k + 1, projection="mollweide")
        values = _map_values(sol, i)
        mesh = ax.pcolormesh(lon, lat, values, cmap="magma", shading="flat")
        ax.set_xticklabels([])
        ax.set_yticklabels([])
        ax.grid(alpha=0.3)
        ax.set_title(f"t = {sol.ts[i]:.3g}", fontsize=9)
        fig.colorbar(mesh, ax=ax, shrink=0.6, label="ρ · 4π")
    if title:
        fig.suptitle(title)
    return fig


def animate_sphere_density(
    sol: SphereSolution,
    path,
    *,
    fps: float = 8.0,
    max_frames: int = 120,
    title: str | None = None,
) -> Path:
    """Write an animation of a density on S^2 (Mollweide map) to a GIF or MP4.

    One frame per reached save time (evenly thinned to `max_frames`), the
    colour rho in units of the uniform density on a scale that follows the
    frame's maximum.

    Args:
        sol: a `density.SphereSolution`.
        path: output file, ".gif" (always available) or ".mp4" (needs ffmpeg);
            its directory is created if needed.
        fps: frames per second, > 0.
        max_frames: at most this many frames, >= 2.
        title: title above the map (the time is appended).

    Returns:
        The path written.

    Raises:
        ValueError: `sol` not a `SphereSolution`, fewer than two reached save
            times, `fps` not positive, `max_frames` < 2, or ".mp4" without
            ffmpeg.
    """
    sol = _check_solution(sol)
    reached = _reached(sol)
    if reached.size < 2:
        raise ValueError("`sol` must have at least two reached save times.")
    if not float(fps) > 0:
        raise ValueError(f"`fps` must be positive; got {fps}.")
    if int(max_frames) < 2:
        raise ValueError(f"`max_frames` must be >= 2; got {max_frames}.")
    picks = np.linspace(0, reached.size - 1, int(max_frames)).round().astype(int)
    rows = reached[np.unique(picks)]
    path = Path(path)
    writer = movie_writer(path, float(fps))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = plt.figure(figsize=(6.0, 3.6), layout="constrained")
    ax = fig.add_subplot(projection="mollweide")
    lon, lat = _edges(sol)
    mesh = ax.pcolormesh(lon, lat, _map_values(sol, rows[0]), cmap="magma")
    ax.set_xticklabels([])
    ax.set_yticklabels([])
    ax.grid(alpha=0.3)
    fig.colorbar(mesh, ax=ax, shrink=0.7, label="ρ · 4π")
    prefix = f"{title}: " if title else ""
    with writer.saving(fig, str(path), dpi=80):
        for i in rows:
            values = _map_values(sol, int(i))
            mesh.set_array(values.ravel())
            mesh.set_clim(float(values.min()), float(values.max()))
            ax.set_title(f"{prefix}t = {sol.ts[i]:.3g}", fontsize=10)
            writer.grab_frame()
    plt.close(fig)
    return path
