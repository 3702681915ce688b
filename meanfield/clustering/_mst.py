"""Exact Euclidean minimum spanning trees, never an (n, n) matrix.

Single-linkage clusters are the connected components of the graph
|x_i - x_j| <= tol. They are read off a Euclidean minimum spanning tree (MST): its
edges no longer than tol span exactly those components, and its sorted edge
lengths h_1 <= ... <= h_{n-1} are the merge heights used by the automatic
tolerance (`_detect`). Up to `PRIM_MAX_POINTS` points the tree is Prim's algorithm
in O(n^2 d) time and O(n d) memory; above, Boruvka's algorithm on a k-d tree with
`NEIGHBOURS` neighbours per point, in O(n d + NEIGHBOURS n) memory.

`NEIGHBOURS` and `_SMALL_COMPONENT` are read as module globals at call time, so a
test can lower them to force the exact fallback searches.
"""

import dataclasses

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

#: Up to this many points the MST is Prim's algorithm, O(n^2 d) time, O(n d) memory
#: (faster than building a k-d tree below ~256 points).
PRIM_MAX_POINTS = 256
#: Neighbours per point of the k-d tree MST (Boruvka) used above PRIM_MAX_POINTS.
NEIGHBOURS = 16
#: Components up to this size search their foreign neighbours in the global tree.
_SMALL_COMPONENT = 256


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


def spanning_forest(x: np.ndarray, max_height: float = np.inf) -> _Edges:
    """Edges of length <= max_height of a Euclidean minimum spanning tree of x."""
    if x.shape[0] == 1:
        empty = np.empty(0, dtype=np.int64)
        return _Edges(empty, empty, np.empty(0))
    if x.shape[0] > PRIM_MAX_POINTS:
        return _boruvka(x, max_height)
    edges = _prim(x)
    keep = edges.w <= max_height
    return _Edges(edges.i[keep], edges.j[keep], edges.w[keep])


def cluster_labels(n: int, edges: _Edges, tol: float) -> np.ndarray:
    """Components of the MST edges <= tol, numbered by first appearance, (n,)."""
    keep = edges.w <= tol
    _, comp = _components(n, _Edges(edges.i[keep], edges.j[keep], edges.w[keep]))
    _, first = np.unique(comp, return_index=True)
    rank = np.empty_like(first)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[comp].astype(np.int64)
