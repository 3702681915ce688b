"""Clusters over time: counts at every save time, diameter and consensus time.

Geshkovski, Letrouit, Polyanskiy & Rigollet, "The Emergence of Clusters in
Self-Attention Dynamics" (NeurIPS 2023): the (rescaled) tokens gather into fewer
and fewer clusters; on the sphere (LayerNorm model) with Q = K = V = I they
collapse to one point ("A mathematical perspective on Transformers", 2023).
"""

import dataclasses

import numpy as np
from jaxtyping import ArrayLike, Float

from .._checks import reject_result
from .._repr import fields_repr
from ._checks import check_points, check_positive, check_trajectory
from ._detect import MIN_GAP, detect
from ._rescale import rescale

#: Default diameter under which all tokens form one cluster (`consensus_time`).
CONSENSUS_TOL = 1e-3


@dataclasses.dataclass(frozen=True, eq=False)  # array fields: no elementwise ==
class ClusterCounts:
    """Number of clusters at every reached save time.

    Attributes:
        ts: the reached save times, shape (T',) (T' <= T: unreached times dropped).
        counts: number of clusters at each, shape (T',).
        tol: tolerance used at each, shape (T',).
        method: how each tolerance was chosen, shape (T',) of str (`Clusters.method`:
            "given", "gap", "relative" or "none"). The automatic tolerance jumps
            where the rule changes, e.g. from 1e-2 max|x| ("relative", no gap yet)
            to a cut inside the first clear gap ("gap").
    """

    ts: np.ndarray
    counts: np.ndarray
    tol: np.ndarray
    method: np.ndarray

    def __repr__(self) -> str:
        return fields_repr(self, counts=self.counts, ts=self.ts, tol=self.tol)


@dataclasses.dataclass(frozen=True)
class _Trajectory:
    """Save times (T,) and positions (T, n, d), as `rescale` reads a Solution."""

    ts: np.ndarray
    x: np.ndarray


def _positions_over_time(trajectory, ts, V, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(ts (T,), x (T, n, d)) from a `Solution` or an array, rescaled if V given."""
    if hasattr(trajectory, "ts") and hasattr(trajectory, "x"):
        if ts is not None:
            raise ValueError(f"`ts` must be None when `{name}` is a Solution.")
        ts, x = trajectory.ts, trajectory.x
    else:
        if V is not None and ts is None:
            raise ValueError(f"`ts` is needed to rescale an array `{name}` by `V`.")
        x = trajectory
    ts, x = check_trajectory(ts, x, name)
    if V is not None:
        x = np.asarray(rescale(_Trajectory(ts, x), V), dtype=np.float64)
    return ts, x


def _reached(ts: np.ndarray, x: np.ndarray, name: str) -> np.ndarray:
    """Indices of the reached save times (finite ts), checking their positions."""
    reached = np.flatnonzero(np.isfinite(ts))
    if not np.all(np.isfinite(x[reached])):
        raise ValueError(f"`{name}` positions must be finite at reached times.")
    return reached


def cluster_counts(
    trajectory,
    tol: float | None = None,
    *,
    ts: Float[ArrayLike, " T"] | None = None,
    V: Float[ArrayLike, "d d"] | None = None,
    min_gap: float = MIN_GAP,
) -> ClusterCounts:
    """Number of single-linkage clusters at every reached save time.

    With an explicit `tol` the resolution is the same at every time (use it to
    watch clusters merge, e.g. on the sphere). With tol=None the tolerance is
    chosen afresh at every time by `detect`'s gap rule: the count is then the
    number of clusters at the scale at which that snapshot is clustered, and
    before clusters have formed (no gap) it is the number of distinct points.

    Args:
        trajectory: a `Solution` (anything with `ts` (T,) and `x` (T, n, d)), or an
            array of positions of shape (T, n, d).
        tol: merging distance, fixed over time, or None (automatic at each time).
        ts: save times (T,) of an array `trajectory` (default 0, 1, ..., T-1);
            must be None for a Solution. Non-finite times are skipped.
        V: value matrix (d, d): count the rescaled tokens e^{-tV} x(t) instead.
        min_gap: see `detect`.

    Returns:
        A `ClusterCounts` (ts, counts, tol, method), over the reached save times.

    Raises:
        ValueError: malformed trajectory, times or V, non-finite positions at a
            reached time, or `tol` not positive.
    """
    ts, x = _positions_over_time(trajectory, ts, V, "trajectory")
    reached = _reached(ts, x, "trajectory")
    found = [detect(x[i], tol, min_gap=min_gap) for i in reached]
    return ClusterCounts(
        ts=ts[reached],
        counts=np.array([f.number for f in found], dtype=np.int64),
        tol=np.array([f.tol for f in found], dtype=np.float64),
        method=np.array([f.method for f in found], dtype=str),
    )


def diameter(x: Float[ArrayLike, "n d"]) -> float:
    """max_{i,j} |x_i - x_j|: O(n^2 d) time, blocks of rows in <= 32 MiB.

    Args:
        x: points, shape (n, d).

    Returns:
        The diameter.

    Raises:
        ValueError: `x` is not a finite (n, d) array.
        TypeError: `x` is a `Solution` (pass `sol.x[i]` for save time i) or a
            measure (pass its positions `.x`).
    """
    reject_result(x, "x", "diameter")
    x = check_points(x)
    radius = float(np.linalg.norm(x - x[0], axis=1).max())
    if radius == 0:
        return 0.0
    block = max(1, 2**22 // (x.shape[0] * x.shape[1]))  # ~32 MiB of differences
    return max(
        float(np.linalg.norm(x[s : s + block, None] - x[None], axis=-1).max())
        for s in range(0, x.shape[0], block)
    )


def consensus_time(
    sol, tol: float = CONSENSUS_TOL, *, V: Float[ArrayLike, "d d"] | None = None
) -> float:
    """First reached save time at which all tokens form one cluster of diameter <= tol.

    On the sphere (`simulate(..., normalization="sphere")`) with Q = K = V = I and
    d >= 3 the tokens converge to a single point after metastable phases with a
    few clusters (Geshkovski, Letrouit, Polyanskiy & Rigollet, "A mathematical
    perspective on Transformers", 2023). This is the first save time at which
    max_{i,j} |x_i - x_j| <= tol (1e-3 by default: on the unit sphere, far below
    the O(1) distances between metastable clusters). In R^d pass V to measure the
    rescaled tokens e^{-tV} x(t) instead.

    See [Consensus time][math-consensus].

    Args:
        sol: a `Solution` (anything with `ts` (T,) and `x` (T, n, d)).
        tol: diameter (> 0) below which the tokens count as one cluster.
        V: value matrix (d, d), or None to use x(t) itself.

    Returns:
        The time, or +inf if the diameter never gets below tol at a reached time.

    Raises:
        ValueError: malformed `sol` or `V`, or `tol` not positive.
    """
    tol = check_positive(tol, "tol")
    ts, x = _positions_over_time(sol, None, V, "sol")
    for i in _reached(ts, x, "sol"):
        if _within(x[i], tol):
            return float(ts[i])
    return float("inf")


def _within(x: np.ndarray, tol: float) -> bool:
    """diameter(x) <= tol, using cheap bounds before the exact diameter."""
    radius = float(np.linalg.norm(x - x[0], axis=1).max())  # radius <= diam <= 2 radius
    if 2 * radius <= tol:
        return True
    if radius > tol:
        return False
    return diameter(x) <= tol
