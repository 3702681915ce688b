"""Reading a density on the circle: its clusters, its particles, W1 to particles.

On the circle W1(mu, nu) = min_c int_0^{2 pi} |F_mu(theta) - F_nu(theta) - c| dtheta,
F the cumulative distribution functions from angle 0 and c their difference's
median (Rabin, Delon & Gousseau, "Transportation distances on the circle", 2011).
"""

import numpy as np
from jaxtyping import ArrayLike, Float

from .._checks import reject_result
from .._dynamics import Solution

TWO_PI = 2 * np.pi


def _cdf_of_cells(rho: np.ndarray):
    """(faces (N+1,), CDF at the faces (..., N+1)) of cell values rho (..., N).

    The CDF is exact between the faces too: linear across each cell.
    """
    N = rho.shape[-1]
    faces = np.arange(N + 1) * (TWO_PI / N)
    zero = np.zeros(rho.shape[:-1] + (1,))
    cdf = np.concatenate([zero, np.cumsum(rho, -1) * (TWO_PI / N)], -1)
    return faces, cdf / cdf[..., -1:]


def arc_averages(rho, edges) -> np.ndarray:
    """The density rho (..., N) averaged over the arcs between `edges` (M+1,).

    Exact (the CDF is linear across cells) and mass-preserving: (..., M).
    """
    faces, cdf = _cdf_of_cells(np.asarray(rho, np.float64))
    mass = np.apply_along_axis(lambda row: np.interp(edges, faces, row), -1, cdf)
    return np.diff(mass, axis=-1) / np.diff(edges)


def _check_rho(rho, where: str) -> np.ndarray:
    reject_result(
        rho,
        "rho",
        where,
        expected="cell values of one density (N,)",
        take="sol.rho[{i}]",
        positions=False,
    )
    rho = np.asarray(rho, np.float64)
    if rho.ndim != 1 or rho.size == 0 or not np.all(np.isfinite(rho)):
        raise ValueError(f"`rho` must be a finite (N,) array; got shape {rho.shape}.")
    if not rho.sum() > 0:
        raise ValueError("`rho` must have positive mass.")
    return rho


def _check_count(value, name: str) -> None:
    """Reject a `value` that is not a positive integer (2.5 is not 2)."""
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"`{name}` must be a positive integer; got {value!r}.")


def sample_quantiles(rho: Float[ArrayLike, " N"], n: int) -> np.ndarray:
    """Angles (n,) at the quantiles (i + 1/2) / n of a density's cells.

    The deterministic sample whose empirical measure is within W1 <= 2 pi / (2 n)
    of rho (a random sample is ~1 / sqrt(n) away): particles to compare with the
    density solver without Monte Carlo noise.

    See [W1 on the circle][math-circle-w1].
    """
    rho = _check_rho(rho, "sample_quantiles")
    _check_count(n, "n")
    faces, cdf = _cdf_of_cells(rho)
    return np.interp((np.arange(int(n)) + 0.5) / int(n), cdf, faces)


def circle_w1(
    rho: Float[ArrayLike, " N"],
    angles: Float[ArrayLike, " n"],
    weights: Float[ArrayLike, " n"] | None = None,
    *,
    resolution: int = 1 << 18,
) -> float:
    """W1 on the circle between a density's cells and weighted particles.

    The difference of the two CDFs is sampled at the midpoints of `resolution`
    equal arcs (the density's CDF is exact, piecewise linear; each particle's
    step is placed exactly), so the result is within 2 pi / resolution of the
    exact distance. O(resolution + n log n).

    See [W1 on the circle][math-circle-w1].

    Args:
        rho: cell values on [0, 2 pi), shape (N,), normalised here (the tiny
            negative values a solver may leave are taken as they are).
        angles: particle angles, shape (n,), any real numbers (taken mod 2 pi).
        weights: particle masses, shape (n,), nonnegative; None: uniform.
        resolution: number of sample arcs.

    Returns:
        The distance, in radians (at most pi).

    Raises:
        ValueError: `rho`, `angles` or `weights` malformed, `resolution` not a
            positive integer.
        TypeError: `rho` is a `DensitySolution` (pass `sol.rho[i]`), or `angles`
            a particle `Solution` (pass `angles(sol.x[i])`).
    """
    rho = _check_rho(rho, "circle_w1")
    reject_result(
        angles,
        "angles",
        "circle_w1",
        expected="an array of angles (n,)",
        take="mf.density.angles(sol.x[{i}])",
        positions=False,
    )
    angles = np.mod(np.asarray(angles, np.float64), TWO_PI)
    if angles.ndim != 1 or angles.size == 0 or not np.all(np.isfinite(angles)):
        raise ValueError("`angles` must be a finite (n,) array.")
    w = (
        np.full(angles.size, 1 / angles.size)
        if weights is None
        else np.asarray(weights, np.float64)
    )
    if w.shape != angles.shape or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"`weights` must be nonnegative with shape {angles.shape}.")
    w = w / w.sum()
    _check_count(resolution, "resolution")
    grid = (np.arange(int(resolution)) + 0.5) * (TWO_PI / int(resolution))
    faces, cdf = _cdf_of_cells(rho)
    order = np.argsort(angles)
    steps = np.concatenate([[0.0], np.cumsum(w[order])])
    particle_cdf = steps[np.searchsorted(angles[order], grid, side="right")]
    diff = np.interp(grid, faces, cdf) - particle_cdf
    return float(np.mean(np.abs(diff - np.median(diff))) * TWO_PI)


def count_clusters(rho: Float[ArrayLike, " N"], level: float = 4.0) -> int:
    """Number of clusters of a density on the circle.

    A cluster is a maximal arc of cells where rho exceeds `level` times the
    uniform density 1 / (2 pi). The uniform state and its small perturbations
    have none; a cluster of mass m and width w has rho ~ m / w, so it counts as
    soon as it is narrower than 2 pi m / level.

    Args:
        rho: cell values on [0, 2 pi), shape (N,) (normalised here).
        level: threshold in units of the uniform density, > 1.

    Returns:
        The number of arcs above the threshold (0 to N / 2).

    Raises:
        ValueError: `rho` not a finite (N,) array of positive mass, `level` <= 1.
        TypeError: `rho` is a `DensitySolution` (pass `sol.rho[i]`).
    """
    rho = _check_rho(rho, "count_clusters")
    if not float(level) > 1:
        raise ValueError(f"`level` must be greater than 1; got {level}.")
    rho = rho / (rho.sum() * TWO_PI / rho.size)
    above = rho > float(level) / TWO_PI
    if above.all():
        return 1
    # Arcs start where a cell is above and its left neighbour (cyclically) not.
    return int(np.sum(above & ~np.roll(above, 1)))


def angles(x: Float[ArrayLike, "... 2"] | Solution) -> np.ndarray:
    """Angles in [0, 2 pi) of points of the plane (tokens on S^1).

    Args:
        x: points, shape (..., 2), any leading axes; or a particle `Solution` on
            the circle (`simulate_particles`), for its tokens at every save time.

    Returns:
        The angles, shape (...); (T, n) for a `Solution`, NaN at the save times
        it did not reach.

    Raises:
        ValueError: `x` not of shape (..., 2).
        TypeError: `x` is another result or a measure (pass its positions `.x`).
    """
    reached = None
    if isinstance(x, Solution):
        reached, x = np.isfinite(np.asarray(x.ts)), x.x
    reject_result(x, "x", "angles", expected="an array of points (..., 2)")
    x = np.asarray(x, np.float64)
    if x.ndim == 0 or x.shape[-1] != 2:
        raise ValueError(f"`x` must have shape (..., 2); got {x.shape}.")
    theta = np.mod(np.arctan2(x[..., 1], x[..., 0]), TWO_PI)
    if reached is not None:  # rows of +inf after an early stop are not angles
        theta = np.where(reached[..., None], theta, np.nan)
    return theta
