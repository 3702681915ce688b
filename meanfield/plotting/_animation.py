"""Animations of tokens moving under self-attention: GIF or MP4 files.

One frame per save time (subsampled to at most `max_frames`), drawn as in the
still figures of `plotting`: tokens coloured by the angle of their initial
position, marker area growing with the mass nearby so that clusters show as
large dots, and a short fading trail behind each token. Axis limits and the
viewpoint are fixed over the whole animation, so motion on screen is motion of
the tokens.

Frames are rendered off-screen on a bare `matplotlib.figure.Figure` (never
registered with pyplot, so nothing shows in a notebook and nothing leaks) and
written atomically: to a temporary file with the same suffix in the destination
directory, moved into place with `os.replace` when complete.
"""

import io
import os
from pathlib import Path

import numpy as np
from matplotlib import animation
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from mpl_toolkits.mplot3d.art3d import Line3DCollection
from PIL import Image

from .._dynamics import Solution
from .._io import atomic_path
from ._common import (
    angle_colors,
    cell_mass,
    equal_3d_limits,
    reached_rows,
    subsample,
    unit_sphere_wireframe,
)

KINDS = ("auto", "sphere", "3d", "2d")
SUFFIXES = (".gif", ".mp4")
_SIZE_INCHES = 5.0


class _GifWriter(animation.AbstractMovieWriter):
    """GIF writer: matplotlib's `PillowWriter` with undithered frame palettes.

    `PillowWriter` leaves the reduction to 256 colours to Pillow, which dithers:
    the dither noise differs from frame to frame, so GIF's frame differencing
    saves little on faint lines (the sphere's wireframe, fading trails). Each
    frame is quantised here by median cut without dithering: indistinguishable
    at this size, and files 1.7-2.2x smaller (256 tokens, 60 frames: 2.0 MB ->
    0.9 MB on the sphere).
    """

    def setup(self, fig, outfile, dpi=None):
        """Start a GIF of `fig` at `outfile`."""
        super().setup(fig, outfile, dpi=dpi)
        self._frames: list[Image.Image] = []

    def grab_frame(self, **savefig_kwargs):
        """Render the figure into the next frame."""
        buf = io.BytesIO()
        self.fig.savefig(buf, **savefig_kwargs, format="rgba", dpi=self.dpi)
        im = Image.frombuffer(
            "RGBA", self.frame_size, buf.getbuffer(), "raw", "RGBA", 0, 1
        )
        self._frames.append(
            im.convert("RGB").quantize(
                255, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
            )
        )

    def finish(self):
        """Write the frames, looping forever."""
        if self._frames:
            self._frames[0].save(
                self.outfile,
                save_all=True,
                append_images=self._frames[1:],
                duration=round(1000 / self.fps),
                loop=0,
            )


def movie_writer(path: Path, fps: float) -> animation.AbstractMovieWriter:
    if path.suffix.lower() == ".gif":
        # Pillow is a matplotlib dependency: GIFs can always be written.
        return _GifWriter(fps=fps)
    if not animation.writers.is_available("ffmpeg"):
        raise ValueError(
            f"cannot write {str(path)!r}: ffmpeg is not available for MP4 output; "
            "install ffmpeg or write a .gif instead."
        )
    return animation.FFMpegWriter(fps=fps)


def _trajectories(sol, x, ts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ts (T,), x (T, n, d), weights (n,)) of the positions to animate."""
    if sol is not None and not isinstance(sol, Solution):
        raise ValueError(f"`sol` must be a `Solution` or None; got {type(sol)}.")
    if x is None:
        if sol is None:
            raise ValueError("give a `Solution` as `sol`, or positions as `x`.")
        if ts is not None:
            raise ValueError("`ts` can only be given together with `x`.")
        x, ts = sol.x, sol.ts
    x = np.asarray(x, dtype=float)
    if x.ndim != 3 or x.shape[1] == 0:
        raise ValueError(f"`x` must have shape (T, n, d) with n >= 1; got {x.shape}.")
    n = x.shape[1]
    if ts is None and sol is not None and np.shape(sol.ts) == x.shape[:1]:
        ts = sol.ts
    ts = np.arange(x.shape[0], dtype=float) if ts is None else np.asarray(ts, float)
    if ts.shape != x.shape[:1]:
        raise ValueError(
            f"`ts` must have shape ({x.shape[0]},) to match `x`; got {ts.shape}."
        )
    weights = None if sol is None else np.asarray(sol.initial.weights, dtype=float)
    if weights is None or weights.shape != (n,):
        weights = np.full(n, 1 / n)
    return ts, x, weights


def _resolve_kind(kind: str, x: np.ndarray) -> str:
    if kind not in KINDS:
        raise ValueError(f"`kind` must be one of {KINDS}; got {kind!r}.")
    d = x.shape[2]
    if kind == "auto":
        if d != 3:
            return "2d"
        # Tolerance far above float32 rounding of a normalised token, far below
        # any radius an unnormalised run keeps.
        on_sphere = np.allclose(np.linalg.norm(x, axis=-1), 1.0, atol=1e-3)
        return "sphere" if on_sphere else "3d"
    if kind in ("sphere", "3d") and d != 3:
        raise ValueError(f'`kind="{kind}"` needs d = 3; got d = {d}.')
    return kind


def _frame_rows(T: int, max_frames: int) -> np.ndarray:
    """Indices of min(T, max_frames) rows evenly spread over 0..T-1, ends included."""
    # With num <= T the spacing (T - 1) / (num - 1) is >= 1: rounding keeps them
    # distinct, so exactly num frames.
    return np.linspace(0, T - 1, min(T, max_frames)).round().astype(int)


def _trail_segments(x: np.ndarray, k: int, trail: int, colors: np.ndarray, alpha):
    """Segments (m, 2, dim) from frame max(0, k - trail) to k, and their RGBA (m, 4).

    Older segments are more transparent: the trail fades out behind each token.
    """
    start = max(0, k - trail)
    if k == start:
        return None, None
    pts = x[start : k + 1]  # (L, n, dim)
    L, n = pts.shape[:2]
    segs = np.stack([pts[:-1], pts[1:]], axis=2)  # (L - 1, n, 2, dim)
    rgba = np.repeat(colors[None], L - 1, axis=0).copy()  # (L - 1, n, 4)
    rgba[..., 3] = alpha * (np.arange(1, L) / (L - 1))[:, None]
    return segs.reshape(-1, 2, pts.shape[2]), rgba.reshape(-1, 4)


def _sizes(pts: np.ndarray, weights: np.ndarray, cell: float, local_mass) -> np.ndarray:
    """Marker areas: 14 pt^2 for one token's mass, growing like sqrt(mass nearby)."""
    return np.maximum(14 * np.sqrt(pts.shape[0] * local_mass(pts, weights, cell)), 14)


def _sphere_view(ax, center: np.ndarray) -> np.ndarray:
    """Look at `center` (if it is not ~0); the unit vector towards the viewer."""
    if np.linalg.norm(center) > 1e-3:
        c = center / np.linalg.norm(center)
        ax.view_init(
            elev=np.degrees(np.arcsin(np.clip(c[2], -1, 1))),
            azim=np.degrees(np.arctan2(c[1], c[0])),
        )
    elev, azim = np.radians(ax.elev), np.radians(ax.azim)
    return np.array(
        [np.cos(elev) * np.cos(azim), np.cos(elev) * np.sin(azim), np.sin(elev)]
    )


def _axes(fig: Figure, kind: str, x: np.ndarray, dims, coordinate: str) -> tuple:
    """Fixed axes for all frames of x (T, n, dim): (ax, cell, eye).

    `cell` is the side of the grid cells in which `cell_mass` sums weights (2%
    of the extent); `eye` the unit vector towards the viewer on the sphere, else
    None.
    """
    eye = None
    if kind == "2d":
        ax = fig.add_axes((0.14, 0.1, 0.82, 0.8))
        lo, hi = x.reshape(-1, 2).min(axis=0), x.reshape(-1, 2).max(axis=0)
        center, half = (lo + hi) / 2, max(float((hi - lo).max()) / 2, 1e-12) * 1.05
        ax.set_xlim(center[0] - half, center[0] + half)
        ax.set_ylim(center[1] - half, center[1] + half)
        ax.set_aspect("equal", adjustable="box")
        ax.set_xlabel(f"${coordinate}_{{{dims[0]}}}$")
        ax.set_ylabel(f"${coordinate}_{{{dims[1]}}}$")
        cell = 0.02 * 2 * half
    else:
        ax = fig.add_axes((0.0, 0.0, 1.0, 0.92), projection="3d")
        # Draw in call order (points last): mplot3d's per-collection depth sort
        # can hide every point behind the wireframe or the trails.
        ax.computed_zorder = False
        if kind == "sphere":
            eye = _sphere_view(ax, x[-1].mean(axis=0))
            unit_sphere_wireframe(ax)
            ax.set_xlim(-1, 1)
            ax.set_ylim(-1, 1)
            ax.set_zlim(-1, 1)
            ax.set_box_aspect((1, 1, 1), zoom=1.3)
            ax.set_axis_off()
            cell = 0.02
        else:
            equal_3d_limits(ax, x.reshape(-1, 3))
            # Few, small tick labels: the defaults crowd a 400-pixel frame.
            for axis in (ax.xaxis, ax.yaxis, ax.zaxis):
                axis.set_major_locator(MaxNLocator(5))
            ax.tick_params(labelsize="x-small")
            # Shrink the cube so that the axis labels stay inside the frame.
            ax.set_box_aspect((1, 1, 1), zoom=0.85)
            ax.set_xlabel(f"${coordinate}_0$")
            ax.set_ylabel(f"${coordinate}_1$")
            ax.set_zlabel(f"${coordinate}_2$")
            lo, hi = x.reshape(-1, 3).min(axis=0), x.reshape(-1, 3).max(axis=0)
            cell = 0.02 * max(float((hi - lo).max()), 1e-12)
    return ax, cell, eye


def animate(
    sol: Solution | None,
    path: str | os.PathLike,
    *,
    x=None,
    ts=None,
    kind: str = "auto",
    fps: float = 10.0,
    max_frames: int = 60,
    dims: tuple[int, int] = (0, 1),
    max_particles: int = 512,
    trail: int = 5,
    title: str | None = None,
    progress: bool = False,
    coordinate: str | None = None,
) -> Path:
    """Write an animation of the tokens over the reached save times.

    One frame per save time, subsampled evenly to at most `max_frames` (first and
    last reached times always included); save times after an early stop
    (blow-up: rows of +inf) are skipped. Each frame is titled with its time t.
    Tokens are coloured by the angle of their initial position (so a cluster's
    colours show which tokens merged), marker area grows like the square root of
    the mass nearby (clusters show as large dots), and each token drags a trail
    through its previous `trail` frames, fading with age. Axis limits (and the
    3-D viewpoint) are fixed over the whole animation; near a blow-up the last
    frames then set the scale, and rescaled positions (`x`) show more.

    Kinds:
        "sphere": d = 3, tokens on the unit sphere S^2 (as `plot_sphere`), looked
            at from the centroid of the last frame; tokens on the far side faded.
        "3d": d = 3, points in a cube of equal-scale axes holding all frames.
        "2d": the planar projection on coordinates `dims` (any d >= 2), equal
            aspect.
        "auto": "sphere" when d = 3 and every |x_i| = 1 (to 1e-3), "3d" when
            d = 3, else "2d".

    Output: ".gif" through Pillow (always available); ".mp4" (H.264) through
    ffmpeg, which must be installed. The file is 400 x 400 pixels (5 in at 80
    dpi) and written atomically: a reader never sees a partial file.

    Args:
        sol: a `Solution`, x of shape (T, n, d); its initial weights size the
            markers. May be None when `x` is given; weights are then uniform, as
            they are when `x` holds another number of tokens.
        path: destination file ending in ".gif" or ".mp4"; its directory must
            exist.
        x: positions to animate instead of `sol.x`, shape (T, n, d), e.g.
            rescaled trajectories e^{-tV} x(t). Rows with a non-finite time or
            state are skipped.
        ts: times of `x`, shape (T,); None takes `sol.ts` when its length
            matches, else numbers the rows 0..T-1. Only with `x`.
        kind: "auto", "sphere", "3d" or "2d" (above).
        fps: frames per second.
        max_frames: at most this many frames (>= 1).
        dims: the two coordinates drawn by kind "2d"; the angle of the initial
            position in these coordinates gives the colours.
        max_particles: draw at most this many tokens (evenly spread indices).
        trail: length of the fading trail, in frames; 0 for none.
        title: text shown before "t = ..." in each frame's title; None for none.
        progress: show a tqdm progress bar over the frames.
        coordinate: the symbol of the drawn state in the axis labels; None: "x"
            for `sol.x`, "z" when `x` is given (rescaled tokens).

    Returns:
        The path written, as a `pathlib.Path`.

    Raises:
        ValueError: `path` not ending in ".gif" or ".mp4", ".mp4" without
            ffmpeg, unknown `kind`, "sphere"/"3d" with d != 3, `x` not of shape
            (T, n, d), `ts` of the wrong shape or given without `x`, `dims` not
            two distinct coordinates in [0, d), `fps` <= 0, `max_frames` < 1,
            `trail` < 0, `max_particles` < 1, or no finite saved state.
    """
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ValueError(f"`path` must end in one of {SUFFIXES}; got {str(path)!r}.")
    if not fps > 0:
        raise ValueError(f"`fps` must be positive; got {fps}.")
    if int(max_frames) != max_frames or max_frames < 1:
        raise ValueError(f"`max_frames` must be an integer >= 1; got {max_frames}.")
    if int(trail) != trail or trail < 0:
        raise ValueError(f"`trail` must be an integer >= 0; got {trail}.")
    if kind not in KINDS:
        raise ValueError(f"`kind` must be one of {KINDS}; got {kind!r}.")
    if coordinate is None:
        coordinate = "x" if x is None else "z"
    ts, x, weights = _trajectories(sol, x, ts)
    ts, x = reached_rows(ts, x)
    kind = _resolve_kind(kind, x)
    d = x.shape[2]
    if kind == "2d":
        dims = tuple(dims)
        if len(dims) != 2 or dims[0] == dims[1] or not all(0 <= i < d for i in dims):
            raise ValueError(
                f"`dims` must be two distinct coordinates in [0, {d}); got {dims}."
            )
    keep = subsample(x.shape[1], max_particles)
    rows = _frame_rows(x.shape[0], int(max_frames))
    ts, x = ts[rows], x[rows][:, keep]
    weights = weights[keep]
    # Mass of the drawn tokens, renormalised: one token's share is then 1 / n_drawn.
    total = weights.sum()
    weights = weights / total if total > 0 else np.full_like(weights, 1 / weights.size)
    if kind == "2d":
        x = x[:, :, list(dims)]
    colors = angle_colors(x[0])
    writer = movie_writer(path, fps)  # raises before any rendering if ffmpeg is missing

    fig = Figure(figsize=(_SIZE_INCHES, _SIZE_INCHES), dpi=80)
    ax, cell, eye = _axes(fig, kind, x, dims, coordinate)
    frames = range(len(ts))
    if progress:
        from tqdm.auto import tqdm

        frames = tqdm(frames, desc="frames", unit="frame")
    dynamic: list = []
    try:
        with atomic_path(path) as tmp, writer.saving(fig, tmp, dpi=80):
            for k in frames:
                for artist in dynamic:
                    artist.remove()
                sizes = _sizes(x[k], weights, cell, cell_mass)
                dynamic = _draw_frame(ax, kind, x, k, trail, colors, sizes, eye)
                label = f"t = {ts[k]:.3g}"
                ax.set_title(f"{title}   {label}" if title else label)
                writer.grab_frame()
    finally:
        if progress:
            frames.close()
    return path


def _draw_frame(ax, kind, x, k, trail, colors, sizes, eye) -> list:
    """Draw frame k's trails and tokens; return the artists to remove next frame.

    On the sphere, tokens on the hemisphere facing the viewer (`eye`, a unit
    vector) are drawn solid, those behind faded.
    """
    artists = []
    segs, rgba = _trail_segments(x, k, trail, colors, 0.25 if kind == "sphere" else 0.5)
    if segs is not None:
        cls = LineCollection if kind == "2d" else Line3DCollection
        lines = cls(segs, colors=rgba, linewidths=0.8)
        artists.append(
            ax.add_collection(lines) if kind == "2d" else ax.add_collection3d(lines)
        )
    if kind == "2d":
        artists.append(
            ax.scatter(
                *x[k].T, s=sizes, c=colors, edgecolors="k", linewidths=0.3, zorder=3
            )
        )
        return artists
    if kind == "sphere":
        front = x[k] @ eye >= 0
        groups = ((~front, 0.25), (front, 1.0))
    else:
        groups = ((np.ones(x.shape[1], bool), 1.0),)
    for mask, alpha in groups:
        if mask.any():
            artists.append(
                ax.scatter(
                    *x[k][mask].T,
                    s=sizes[mask],
                    c=colors[mask],
                    edgecolors="k",
                    linewidths=0.3,
                    alpha=alpha,
                    depthshade=False,
                )
            )
    return artists
