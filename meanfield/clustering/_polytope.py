"""The convex polytope that the rescaled tokens converge to when V = I.

Geshkovski, Letrouit, Polyanskiy & Rigollet (NeurIPS 2023): for V = I and Q^T K
positive definite the rescaled tokens z_i(t) = e^{-t} x_i(t) converge to the
boundary of a convex polytope, most of them to its vertices. The hull is taken of
the cluster centres (`detect`) with Qhull, in their affine hull when degenerate.
"""

import dataclasses

import numpy as np
from jaxtyping import ArrayLike, Float
from scipy.optimize import nnls
from scipy.spatial import ConvexHull

from .._checks import reject_result
from .._repr import fields_repr
from ._checks import check_positive
from ._detect import MIN_GAP, Clusters, detect


@dataclasses.dataclass(frozen=True, eq=False)  # array fields: no elementwise ==
class Polytope:
    """The convex hull of cluster centres and where the clusters sit on it.

    Attributes:
        clusters: the `Clusters` of the points.
        centres: cluster centres, shape (k, d) (= clusters.centres).
        vertices: indices into `centres` of the vertices of their convex hull,
            shape (v,): the hull's vertices farther than `boundary_tol` from the
            hull of the other centres (a centre on an edge that rounding pushed
            outwards is not a vertex).
        on_boundary: whether each centre lies on the (relative) boundary of the
            hull, within `boundary_tol`, shape (k,).
        points_at_vertices: number of points whose cluster centre is a vertex.
        fraction_at_vertices: points_at_vertices / n.
        dim: dimension of the affine hull of the centres (0 <= dim <= d).
        volume: dim-dimensional volume of the hull in its affine hull (length of a
            segment, area of a polygon, ...); 0 for a single point.
        tol: the clustering tolerance (clusters.tol).
        boundary_tol: distance to the boundary under which a centre counts as on it;
            also the thickness under which a direction of the affine hull is
            dropped.
    """

    clusters: Clusters
    centres: np.ndarray
    vertices: np.ndarray
    on_boundary: np.ndarray
    points_at_vertices: int
    fraction_at_vertices: float
    dim: int
    volume: float
    tol: float
    boundary_tol: float

    def __repr__(self) -> str:
        return fields_repr(
            self,
            dim=self.dim,
            vertices=self.vertices,
            fraction_at_vertices=self.fraction_at_vertices,
            volume=self.volume,
            tol=self.tol,
            clusters=self.clusters,
        )


def _affine_coordinates(centres: np.ndarray, thickness: float) -> np.ndarray:
    """Coordinates (k, r) of the centres in their affine hull (SVD projection).

    Principal directions along which every centre is within `thickness` of the
    mean are dropped, so nearly flat hulls are treated as flat.
    """
    offsets = centres - centres.mean(axis=0)
    _, _, vt = np.linalg.svd(offsets, full_matrices=False)
    coords = offsets @ vt.T
    return coords[:, np.abs(coords).max(axis=0) > thickness]


def _distance_to_hull(point: np.ndarray, others: np.ndarray) -> float:
    """Distance from point (r,) to the convex hull of others (m, r).

    min |point - others^T lam| over the simplex, by NNLS with the constraint
    sum(lam) = 1 as a heavily weighted extra row; the distance is evaluated at the
    renormalised (feasible) lam, so it is never below the true distance.
    """
    weight = 1e6 * (1 + np.abs(others).max() + np.abs(point).max())
    a = np.vstack([others.T, np.full(others.shape[0], weight)])
    lam, _ = nnls(a, np.append(point, weight))
    return float(np.linalg.norm(others.T @ (lam / lam.sum()) - point))


def _robust_vertices(coords: np.ndarray, candidates, boundary_tol: float):
    """The candidates more than boundary_tol from the hull of the other centres.

    A centre on an edge or a face that noise has pushed slightly outwards is a
    vertex of the hull in exact arithmetic; at the resolution boundary_tol it is
    not. Centres found within boundary_tol are removed one at a time, so of two
    nearly coincident extreme centres one stays.
    """
    keep = np.ones(coords.shape[0], dtype=bool)
    for v in sorted(candidates):
        keep[v] = False
        if _distance_to_hull(coords[v], coords[keep]) > boundary_tol:
            keep[v] = True
    return np.array([v for v in sorted(candidates) if keep[v]], dtype=np.int64)


def _hull(coords: np.ndarray, boundary_tol: float):
    """(vertices, on_boundary, volume) of the hull of coords (k, r), r = 0, 1, >= 2."""
    k, r = coords.shape
    if r == 0:  # every centre at one point at this resolution: the first stands
        return np.array([0]), np.ones(k, dtype=bool), 0.0
    if r == 1:
        y = coords[:, 0]
        lo, hi = int(np.argmin(y)), int(np.argmax(y))
        ends = (y - y[lo] <= boundary_tol) | (y[hi] - y <= boundary_tol)
        return np.array(sorted({lo, hi})), ends, float(y[hi] - y[lo])
    hull = ConvexHull(coords)
    # Qhull's facet equations a.y + b <= 0 inside, with unit normals a.
    depth = -(coords @ hull.equations[:, :-1].T + hull.equations[:, -1])
    vertices = _robust_vertices(coords, hull.vertices, boundary_tol)
    return vertices, depth.min(axis=1) <= boundary_tol, hull.volume


def polytope(
    z: Float[ArrayLike, "n d"],
    tol: float | None = None,
    *,
    weights: Float[ArrayLike, " n"] | None = None,
    boundary_tol: float | None = None,
    min_gap: float = MIN_GAP,
) -> Polytope:
    """Cluster limit points and locate the clusters on the hull of their centres.

    For V = I and Q^T K positive definite, the rescaled tokens z_i(t) = e^{-t} x_i(t)
    converge to points on the boundary of a convex polytope, most of them to its
    vertices (Geshkovski et al., 2023). Given late rescaled tokens z (e.g. the last
    reached row of `rescale(sol, I)`), this clusters them (`detect`), takes the
    convex hull of the cluster centres (Qhull) and reports which centres are
    vertices and which lie on the boundary.

    Degenerate hulls are handled in their affine hull, found by an SVD of the
    centred centres: a single centre is a point (dim 0), two or collinear centres a
    segment (dim 1, its two ends are the vertices and the boundary), and centres in
    an r-dimensional affine subspace (fewer than d + 1 of them, or coplanar) a
    polytope of dimension r; on_boundary then means the relative boundary.

    See [The limit polytope][math-polytope].

    Args:
        z: points, shape (n, d).
        tol: clustering tolerance, or None for `detect`'s automatic rule.
        weights: point masses, shape (n,); None means uniform.
        boundary_tol: distance to a facet under which a centre counts as on the
            boundary; None uses the clustering tolerance (the resolution at which
            the centres themselves are defined).
        min_gap: see `detect`.

    Returns:
        A `Polytope`.

    Raises:
        ValueError: bad `z`, `tol`, `weights`, `min_gap` or `boundary_tol`.
        TypeError: `z` is a `Solution` (pass the rescaled tokens at one save
            time, e.g. `rescale(sol, V)[-1]`) or a measure (pass `.x`).
    """
    reject_result(
        z,
        "z",
        "polytope",
        expected="an array of rescaled tokens (n, d)",
        take="rescale(sol, V)[{i}]",
    )
    found = detect(z, tol, weights=weights, min_gap=min_gap)
    btol = (
        found.tol
        if boundary_tol is None
        else check_positive(boundary_tol, "boundary_tol")
    )
    coords = _affine_coordinates(found.centres, btol)
    vertices, on_boundary, volume = _hull(coords, btol)
    at_vertices = int(found.sizes[vertices].sum())
    return Polytope(
        clusters=found,
        centres=found.centres,
        vertices=vertices,
        on_boundary=on_boundary,
        points_at_vertices=at_vertices,
        fraction_at_vertices=at_vertices / found.labels.shape[0],
        dim=coords.shape[1],
        volume=float(volume),
        tol=found.tol,
        boundary_tol=btol,
    )
