"""Clusters of tokens: rescaling, single linkage, consensus time, limit polytopes.

Geshkovski, Letrouit, Polyanskiy & Rigollet, "The Emergence of Clusters in
Self-Attention Dynamics" (NeurIPS 2023): under x_i' = V x_i + (attention-weighted
mean) the rescaled tokens z_i(t) = e^{-tV} x_i(t) converge to a few points; for
V = I and Q^T K > 0 they converge to the boundary of a convex polytope, most of them
to its vertices. On the sphere (LayerNorm model) the tokens collapse to one point
for Q = K = V = I.

Clustering is post-processing: apart from `rescale` (matrix exponentials in JAX)
everything here runs in NumPy/SciPy on the host, on concrete float64 arrays, in
O(n d + 16 n) memory: never an (n, n) matrix.

Clusters are single-linkage clusters: the connected components of the graph
|x_i - x_j| <= tol. They are read off a Euclidean minimum spanning tree (MST): its
edges no longer than tol span exactly those components, and its sorted edge
lengths h_1 <= ... <= h_{n-1} are the merge heights used by the automatic tolerance.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float
from scipy.optimize import nnls
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import ConvexHull, cKDTree

from .._linalg import expm

#: Smallest ratio h_{k+1} / h_k of consecutive merge heights accepted as a cut.
MIN_GAP = 10.0
#: Heights below FLOOR * max_i |x_i| count as coincident points (rounding level).
FLOOR = 1e-12
#: Without a gap, the automatic tolerance is RELATIVE_TOL * max_i |x_i|.
RELATIVE_TOL = 1e-2
#: Default diameter under which all tokens form one cluster (`consensus_time`).
CONSENSUS_TOL = 1e-3
#: Up to this many points the MST is Prim's algorithm, O(n^2 d) time, O(n d) memory
#: (faster than building a k-d tree below ~256 points).
PRIM_MAX_POINTS = 256
#: Neighbours per point of the k-d tree MST (Boruvka) used above PRIM_MAX_POINTS.
NEIGHBOURS = 16


# ---- input checks ------------------------------------------------------------------


def _check_points(x, name: str = "x") -> np.ndarray:
    """The points as a finite float64 array of shape (n, d), n, d >= 1."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"`{name}` must have shape (n, d), n, d >= 1; got {x.shape}.")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"`{name}` must be finite; got NaN or inf entries.")
    return x


def _check_positive(value, name: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"`{name}` must be a positive number; got {value!r}.") from err
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"`{name}` must be positive and finite; got {value}.")
    return value


def _check_weights(weights, n: int) -> np.ndarray:
    if weights is None:
        return np.full(n, 1 / n)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"`weights` must have shape ({n},); got {w.shape}.")
    if not (np.all(np.isfinite(w)) and np.all(w >= 0)):
        raise ValueError("`weights` must be finite and nonnegative.")
    return w


def _check_trajectory(ts, x, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(ts (T,), x (T, n, d)) as float64 arrays, checked against each other."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3 or 0 in x.shape:
        raise ValueError(
            f"`{name}` positions must have shape (T, n, d); got {x.shape}."
        )
    ts = np.arange(x.shape[0], dtype=np.float64) if ts is None else np.asarray(ts)
    ts = ts.astype(np.float64)
    if ts.shape != x.shape[:1]:
        raise ValueError(
            f"`ts` must have shape ({x.shape[0]},) to match `{name}`; got {ts.shape}."
        )
    return ts, x


# ---- rescaling ---------------------------------------------------------------------


def rescale(sol, V: Float[ArrayLike, "d d"]) -> Float[Array, "T n d"]:
    """Rescaled trajectories z_i(t) = e^{-tV} x_i(t) (Geshkovski et al., 2023).

    For x_i' = V x_i + (attention-weighted mean of V x_j) the factor e^{-tV} removes
    the linear growth, so z stays bounded and clusters; with V = I it is
    z(t) = e^{-t} x(t). The matrix exponential is taken at every save time, so any
    V works (not only symmetric or diagonalisable ones): `jax.scipy.linalg.expm`
    with our own scaling and squaring (`meanfield._linalg.expm`), compiled once
    per shape.

    Args:
        sol: a `Solution`, or anything with `ts` (T,) and `x` (T, n, d).
        V: value matrix, shape (d, d).

    Returns:
        z, shape (T, n, d), in the dtype of `sol.x`. Rows of save times that were not
        reached (ts = +inf) stay +inf, never NaN.

    Raises:
        ValueError: `sol.x` is not (T, n, d), `sol.ts` is not (T,), or `V` is not
            (d, d).
    """
    ts, x = jnp.asarray(sol.ts), jnp.asarray(sol.x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.result_type(float))
    if x.ndim != 3 or ts.shape != x.shape[:1]:
        raise ValueError(
            "`sol` must have `ts` of shape (T,) and `x` of shape (T, n, d); got "
            f"{ts.shape} and {x.shape}."
        )
    d = x.shape[-1]
    V = jnp.asarray(V, x.dtype)
    if V.shape != (d, d):
        raise ValueError(f"`V` must have shape ({d}, {d}); got {V.shape}.")
    # Exponentials in >= float32 (expm has no half-precision Pade coefficients).
    work = jnp.promote_types(x.dtype, jnp.float32)
    return _rescale_arrays(ts, x.astype(work), V.astype(work)).astype(x.dtype)


@jax.jit
def _rescale_arrays(ts, x, V):
    # Compiled once per shape: expm run op by op costs more than its compilation.
    reached = jnp.isfinite(ts)
    # expm(-inf V) is NaN: evaluate at t = 0 and restore the +inf rows afterwards.
    t_safe = jnp.where(reached, ts, 0).astype(x.dtype)
    propagators = jax.vmap(lambda t: expm(-t * V))(t_safe)  # (T, d, d)
    z = jnp.einsum("tij,tnj->tni", propagators, x)
    return jnp.where(reached[:, None, None], z, jnp.inf)


# ---- minimum spanning tree ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Edges:
    """Edges (i, j) of lengths w of a minimum spanning forest, each of shape (m,)."""

    i: np.ndarray
    j: np.ndarray
    w: np.ndarray


def _prim(x: np.ndarray) -> _Edges:
    """Exact Euclidean MST by Prim's algorithm: O(n^2 d) time, O(n d) memory."""
    n = x.shape[0]
    in_tree = np.zeros(n, dtype=bool)
    in_tree[0] = True
    best = np.linalg.norm(x - x[0], axis=1)  # distance to the tree
    nearest = np.zeros(n, dtype=np.int64)  # its closest tree point
    best[0] = np.inf
    i, j, w = (np.empty(n - 1, dtype=t) for t in (np.int64, np.int64, np.float64))
    for step in range(n - 1):
        new = int(np.argmin(best))
        i[step], j[step], w[step] = nearest[new], new, best[new]
        in_tree[new], best[new] = True, np.inf
        dist = np.linalg.norm(x - x[new], axis=1)
        closer = (dist < best) & ~in_tree
        best[closer], nearest[closer] = dist[closer], new
    return _Edges(i, j, w)


def _neighbours(tree: cKDTree, x: np.ndarray, k: int):
    """The k nearest other points, sorted: distances and indices, each (n, k)."""
    dist, idx = tree.query(x, k=k + 1)
    # Drop the point itself; among exact duplicates it need not come first.
    other = idx != np.arange(x.shape[0])[:, None]
    keep = np.argsort(~other, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(dist, keep, 1), np.take_along_axis(idx, keep, 1)


def _known_outgoing(comp, dist, idx):
    """Each point's nearest neighbour in another component, when among its k.

    Returns (has (n,), p, q, w): the points that have one and their edges. The
    neighbour lists are sorted, so the first foreign entry is the exact nearest
    foreign point.
    """
    foreign = comp[idx] != comp[:, None]
    has = foreign.any(axis=1)
    p = np.flatnonzero(has)
    first = foreign[p].argmax(axis=1)
    return has, p, idx[p, first], dist[p, first]


def _cheapest_per_component(comp, num, p, q, w):
    """Cheapest known edge leaving each component: arrays (num,) of w, p, q.

    An edge counts for the components of both ends; ties are broken by the
    endpoints, so that equal lengths rarely close a cycle (see `_acyclic`).
    """
    lo, hi = np.minimum(p, q), np.maximum(p, q)
    c = np.concatenate([comp[p], comp[q]])
    w2, lo2, hi2 = (np.concatenate([a, a]) for a in (w, lo, hi))
    order = np.lexsort((hi2, lo2, w2, c))
    c_sorted = c[order]
    first = order[np.r_[True, c_sorted[1:] != c_sorted[:-1]]] if c.size else order
    best_w = np.full(num, np.inf)
    best_p = np.full(num, -1, dtype=np.int64)
    best_q = np.full(num, -1, dtype=np.int64)
    owner = c[first]
    best_w[owner], best_p[owner], best_q[owner] = w2[first], lo2[first], hi2[first]
    return best_w, best_p, best_q


#: Components up to this size search their foreign neighbours in the global tree.
_SMALL_COMPONENT = 256


def _exact_outgoing(x, tree, members, candidates, limit):
    """Shortest edge (w, p, q) from `candidates` out of the component, or None.

    `candidates` are points of the component `members`; only edges shorter than
    `limit` are searched.
    A small component asks the global tree for |C| + 1 neighbours, which always
    include a foreign point; a large one builds a tree of its complement.
    """
    n = x.shape[0]
    if members.size <= _SMALL_COMPONENT:
        dist, idx = tree.query(
            x[candidates], k=min(members.size + 1, n), distance_upper_bound=limit
        )
        dist, idx = dist.reshape(candidates.size, -1), idx.reshape(candidates.size, -1)
        inside = np.zeros(n + 1, dtype=bool)  # index n: "none within limit"
        inside[members] = True
        dist = np.where(inside[idx], np.inf, dist)
        first = dist.argmin(axis=1)
        dist, idx = (
            dist[np.arange(candidates.size), first],
            idx[np.arange(candidates.size), first],
        )
    else:
        outside = np.setdiff1d(np.arange(n), members, assume_unique=True)
        dist, j = cKDTree(x[outside]).query(
            x[candidates], k=1, distance_upper_bound=limit
        )
        idx = np.where(np.isfinite(dist), outside[np.minimum(j, outside.size - 1)], n)
    if dist.size == 0 or not np.isfinite(dist.min()):
        return None
    m = int(np.argmin(dist))
    return float(dist[m]), int(candidates[m]), int(idx[m])


def _components(n: int, edges: _Edges) -> tuple[int, np.ndarray]:
    graph = coo_matrix((np.ones(edges.w.size), (edges.i, edges.j)), shape=(n, n))
    return connected_components(graph, directed=False)


def _boruvka(x: np.ndarray, max_height: float = np.inf) -> _Edges:
    """Exact Euclidean minimum spanning forest of the edges <= max_height.

    Boruvka's algorithm: every round, each component joins along its shortest
    outgoing edge. The k nearest neighbours of every point (one k-d tree query,
    O(n k) memory) give each point's nearest foreign point whenever one is among
    them. A point p whose neighbours all lie in its own component has no foreign
    point closer than r_p, its k-th neighbour distance; the component's cheapest
    known edge is therefore exact when it is <= r_p for all such p. Otherwise the
    remaining candidates are searched exactly (`_exact_outgoing`). Components whose
    shortest outgoing edge exceeds `max_height` are final. Exact duplicates are
    joined by zero-length edges first (they would fill the neighbour lists).
    """
    x_unique, first, inverse = np.unique(
        x, axis=0, return_index=True, return_inverse=True
    )
    inverse = inverse.reshape(-1)
    duplicate = np.flatnonzero(first[inverse] != np.arange(x.shape[0]))
    dup = _Edges(first[inverse[duplicate]], duplicate, np.zeros(duplicate.size))
    if x_unique.shape[0] == 1:
        return dup
    tree_edges = _boruvka_distinct(x_unique, max_height)
    return _Edges(
        np.concatenate([dup.i, first[tree_edges.i]]),
        np.concatenate([dup.j, first[tree_edges.j]]),
        np.concatenate([dup.w, tree_edges.w]),
    )


def _boruvka_distinct(x: np.ndarray, max_height: float) -> _Edges:
    """`_boruvka` for pairwise distinct points."""
    n = x.shape[0]
    tree = cKDTree(x)
    dist, idx = _neighbours(tree, x, min(NEIGHBOURS, n - 1))
    radius = dist[:, -1]
    edges = _Edges(*(np.empty(0, dtype=t) for t in (np.int64, np.int64, float)))
    num, comp = n, np.arange(n)
    while num > 1:
        has, p, q, w = _known_outgoing(comp, dist, idx)
        best_w, best_p, best_q = _cheapest_per_component(comp, num, p, q, w)
        limit = np.minimum(best_w, max_height)
        bound = np.full(num, np.inf)
        np.minimum.at(bound, comp[~has], radius[~has])
        for c in np.flatnonzero(bound < limit):
            members = np.flatnonzero(comp == c)
            candidates = members[~has[members] & (radius[members] < limit[c])]
            found = _exact_outgoing(x, tree, members, candidates, limit[c])
            if found is not None and found[0] < best_w[c]:
                best_w[c], best_p[c], best_q[c] = found
        chosen = np.flatnonzero(best_w <= max_height)
        if chosen.size == 0:
            break
        lo = np.minimum(best_p[chosen], best_q[chosen])
        hi = np.maximum(best_p[chosen], best_q[chosen])
        w = best_w[chosen]
        order = np.lexsort((hi, lo, w))
        lo, hi, w = lo[order], hi[order], w[order]
        keep = _acyclic(num, comp[lo], comp[hi])
        edges = _Edges(
            np.concatenate([edges.i, lo[keep]]),
            np.concatenate([edges.j, hi[keep]]),
            np.concatenate([edges.w, w[keep]]),
        )
        num, comp = _components(n, edges)
    return edges


def _acyclic(num: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mask of the edges (a, b) between components 0..num-1 that close no cycle.

    Edges come sorted by length; an edge chosen by both of its components appears
    twice, and equal lengths can close a cycle (all its edges then have the same
    length, so dropping one keeps a minimum spanning forest). Union-find.
    """
    parent = list(range(num))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving
            i = parent[i]
        return i

    keep = np.zeros(a.size, dtype=bool)
    for e, (u, v) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
        ru, rv = root(u), root(v)
        if ru != rv:
            parent[ru], keep[e] = rv, True
    return keep


def _spanning_forest(x: np.ndarray, max_height: float = np.inf) -> _Edges:
    """Edges of length <= max_height of a Euclidean minimum spanning tree of x."""
    if x.shape[0] == 1:
        empty = np.empty(0, dtype=np.int64)
        return _Edges(empty, empty, np.empty(0))
    if x.shape[0] > PRIM_MAX_POINTS:
        return _boruvka(x, max_height)
    edges = _prim(x)
    keep = edges.w <= max_height
    return _Edges(edges.i[keep], edges.j[keep], edges.w[keep])


def _labels(n: int, edges: _Edges, tol: float) -> np.ndarray:
    """Components of the MST edges <= tol, numbered by first appearance, (n,)."""
    keep = edges.w <= tol
    _, comp = _components(n, _Edges(edges.i[keep], edges.j[keep], edges.w[keep]))
    _, first = np.unique(comp, return_index=True)
    rank = np.empty_like(first)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[comp].astype(np.int64)


# ---- automatic tolerance -----------------------------------------------------------


def _scale(x: np.ndarray) -> float:
    """max_i |x_i|: the length scale (1 when every point is the origin)."""
    scale = float(np.linalg.norm(x, axis=1).max())
    return scale if scale > 0 else 1.0


def _cut(heights: np.ndarray, scale: float, min_gap: float):
    """(tol, gap, method) of the automatic rule; see `detect`."""
    floor = FLOOR * scale
    # Coincident points are always merged; the scale is a virtual last height.
    h = np.append(np.sort(heights[heights > floor]), scale)
    if h.size == 1:  # one point, or all points coincide
        return floor, None, "none"
    ratios = h[1:] / h[:-1]
    # A cut below h[i + 1] leaves h.size - 1 - i clusters. Only cuts where most
    # points share their cluster (at most ceil(n / 2) clusters) count: the lowest
    # ratios (the closest pair against the next) are heavy-tailed in any cloud and
    # would split off a single pair.
    n = heights.size + 1
    clusters_left = h.size - 1 - np.arange(ratios.size)
    ratios = np.where(clusters_left <= (n + 1) // 2, ratios, 0.0)
    cut = int(np.argmax(ratios))
    gap = float(ratios[cut])
    if gap < min_gap:
        return RELATIVE_TOL * scale, gap, "relative"
    return float(np.sqrt(h[cut] * h[cut + 1])), gap, "gap"


# ---- clusters ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)  # array fields: no elementwise ==
class Clusters:
    """Single-linkage clusters of n points in R^d.

    Attributes:
        labels: cluster of every point, shape (n,), integers 0..number-1 numbered in
            order of first appearance.
        number: the number of clusters k.
        tol: the tolerance used: clusters are the connected components of the graph
            |x_i - x_j| <= tol.
        centres: weighted mean of every cluster, shape (k, d) (unweighted mean for a
            cluster of zero mass).
        masses: summed weights of every cluster, shape (k,).
        sizes: number of points of every cluster, shape (k,).
        method: how `tol` was chosen: "given" (by the caller), "gap" (automatic, at
            a gap of the merge heights), "relative" (automatic, no gap: tol =
            RELATIVE_TOL * max_i |x_i|) or "none" (a single point, or all points
            coincident: tol = FLOOR * max_i |x_i|).
        gap: the ratio of the merge heights on either side of the automatic cut
            (method "gap"), or the largest ratio found (method "relative"); None for
            method "given", and when there is no ratio (a single point, or all
            points coincident).
    """

    labels: np.ndarray
    number: int
    tol: float
    centres: np.ndarray
    masses: np.ndarray
    sizes: np.ndarray
    method: str
    gap: float | None


def _summarise(x, weights, labels, tol, method, gap) -> Clusters:
    k = int(labels.max()) + 1
    sizes = np.bincount(labels, minlength=k)
    masses = np.bincount(labels, weights=weights, minlength=k)
    sums = np.stack(
        [np.bincount(labels, weights=weights * col, minlength=k) for col in x.T], 1
    )
    plain = np.stack([np.bincount(labels, weights=col, minlength=k) for col in x.T], 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        centres = np.where(
            masses[:, None] > 0, sums / masses[:, None], plain / sizes[:, None]
        )
    return Clusters(labels, k, float(tol), centres, masses, sizes, method, gap)


def detect(
    x: Float[ArrayLike, "n d"],
    tol: float | None = None,
    *,
    weights: Float[ArrayLike, " n"] | None = None,
    min_gap: float = MIN_GAP,
) -> Clusters:
    """Single-linkage clusters of points, with an automatic scale-aware tolerance.

    Clusters are the connected components of the graph |x_i - x_j| <= tol, read off
    the edges <= tol of a Euclidean minimum spanning tree (MST).

    Automatic tolerance (tol=None). Let s = max_i |x_i| be the scale of the
    configuration (distances from the origin are meaningful here: tokens on the
    unit sphere, rescaled tokens of size O(1)). MST edges no longer than
    FLOOR * s = 1e-12 s join coincident points (duplicates, rounding) and are
    always merged; let h_1 <= ... <= h_m be the other MST edge lengths (the
    single-linkage merge heights) and h_{m+1} = s. The cut is at the largest
    ratio r = h_{j+1} / h_j over the cuts that leave at most ceil(n / 2) clusters
    (most points share their cluster: the ratio of the closest pair to the next
    merge is heavy-tailed in any cloud, and a contracting cloud keeps it, so
    without this a single pair split off reads as structure):

    - if r >= min_gap: tol = sqrt(h_j h_{j+1}), the geometric mean of the two
      heights around the gap. For j = m every merge height is below s / min_gap:
      all points form one cluster, small at the scale of the configuration;
    - otherwise there is no gap: tol = RELATIVE_TOL * s = 1e-2 s (method
      "relative"), the resolution of a snapshot still on its way to clusters.
      Tokens that converge along faces of the limit polytope, or metastable
      clusters on the sphere, fill the range of heights without a tenfold gap
      (n = 256, Q = K = V = I: the rescaled tokens at t = 8 have merge heights
      from 1e-4 to 0.5 with no ratio above 4); 1e-2 s then counts the groups a
      reader sees. When m = 0 (one point, or all coincident) tol = FLOOR * s.

    Why a gap: as tokens cluster, the spread inside a cluster decays like e^{-ct}
    while the distances between clusters stay O(1) (Geshkovski et al., 2023), so
    the merge heights split into two groups whose ratio grows without bound; the
    geometric mean of the two heights around the cut sits in the middle of that gap
    on a log scale. Within an unstructured cloud consecutive merge heights differ
    by factors of a few, so a factor min_gap = 10 is rarely reached by chance:
    without the ceil(n / 2) condition 1% of draws of 32 to 512 Gaussian points in
    R^2 and 1-2% on S^2 had their closest pair 10x closer than the next merge
    (n - 1 clusters); with it, none of 300 draws each in R^2, S^2 and R^8. An
    unstructured cloud denser than 1e-2 s is chained into few clusters
    by the relative fallback: `method` says which rule fired, and a caller that
    knows the resolution it wants should pass `tol`.

    Cost: the MST is exact and never needs an (n, n) matrix. Up to 256 points:
    Prim's algorithm, O(n^2 d) time, O(n d) memory. Above: Boruvka's algorithm on
    a k-d tree with 16 neighbours per point, O(16 n) memory, ~0.2 s for n = 20000
    in d = 2 (exact, not the MST of a neighbour graph: edges missing from the
    neighbour lists are searched in the tree when they could be shorter).

    Args:
        x: points, shape (n, d).
        tol: merging distance (> 0), or None for the automatic rule above.
        weights: point masses, shape (n,), nonnegative; None means uniform 1/n.
        min_gap: smallest ratio of consecutive merge heights accepted as a cut.

    Returns:
        A `Clusters` (labels (n,), number, tol, centres (k, d), masses (k,),
        sizes (k,), method, gap).

    Raises:
        ValueError: `x` is not a finite (n, d) array, `tol` or `min_gap` is not a
            positive finite number (min_gap must be > 1), or `weights` is not a
            nonnegative (n,) array.
    """
    x = _check_points(x)
    n = x.shape[0]
    w = _check_weights(weights, n)
    min_gap = _check_positive(min_gap, "min_gap")
    if min_gap <= 1:
        raise ValueError(f"`min_gap` must be > 1; got {min_gap}.")
    if tol is not None:
        tol = _check_positive(tol, "tol")
        edges = _spanning_forest(x, max_height=tol)
        return _summarise(x, w, _labels(n, edges, tol), tol, "given", None)
    edges = _spanning_forest(x)
    tol, gap, method = _cut(edges.w, _scale(x), min_gap)
    return _summarise(x, w, _labels(n, edges, tol), tol, method, gap)


def clusters(
    x: Float[ArrayLike, "n d"], tol: float | None = None
) -> tuple[np.ndarray, int]:
    """Single-linkage clusters: the components of the graph |x_i - x_j| <= tol.

    `detect` with its default options, returning only the labels and the number.

    Args:
        x: points, shape (n, d).
        tol: merging distance (> 0), or None for `detect`'s automatic tolerance
            (a large gap in the single-linkage merge heights).

    Returns:
        (labels, number): labels of shape (n,), integers 0..number-1 numbered in
        order of first appearance, and the number of clusters.

    Raises:
        ValueError: `x` is not a finite (n, d) array or `tol` is not positive.
    """
    found = detect(x, tol)
    return found.labels, found.number


# ---- over time ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)  # array fields: no elementwise ==
class ClusterCounts:
    """Number of clusters at every reached save time.

    Attributes:
        ts: the reached save times, shape (T',) (T' <= T: unreached times dropped).
        counts: number of clusters at each, shape (T',).
        tol: tolerance used at each, shape (T',).
    """

    ts: np.ndarray
    counts: np.ndarray
    tol: np.ndarray


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
    ts, x = _check_trajectory(ts, x, name)
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
        A `ClusterCounts` (ts, counts, tol), over the reached save times only.

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
    )


def diameter(x: Float[ArrayLike, "n d"]) -> float:
    """max_{i,j} |x_i - x_j|: O(n^2 d) time, blocks of rows in <= 32 MiB.

    Args:
        x: points, shape (n, d).

    Returns:
        The diameter.

    Raises:
        ValueError: `x` is not a finite (n, d) array.
    """
    x = _check_points(x)
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

    Args:
        sol: a `Solution` (anything with `ts` (T,) and `x` (T, n, d)).
        tol: diameter (> 0) below which the tokens count as one cluster.
        V: value matrix (d, d), or None to use x(t) itself.

    Returns:
        The time, or +inf if the diameter never gets below tol at a reached time.

    Raises:
        ValueError: malformed `sol` or `V`, or `tol` not positive.
    """
    tol = _check_positive(tol, "tol")
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


# ---- limit polytope ----------------------------------------------------------------


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
    """
    found = detect(z, tol, weights=weights, min_gap=min_gap)
    btol = (
        found.tol
        if boundary_tol is None
        else _check_positive(boundary_tol, "boundary_tol")
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
