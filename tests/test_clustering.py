"""Clustering analysis: rescaling, single linkage, automatic tolerance, consensus
time and the limit polytope of Geshkovski, Letrouit, Polyanskiy & Rigollet (2023)."""

import tracemalloc
from types import SimpleNamespace

import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import scipy.linalg
from scipy.cluster.hierarchy import linkage
from scipy.spatial.distance import cdist

import meanfield as mf
from meanfield.clustering import _mst

C = mf.clustering
D = 3
N_TOKENS = 32


# ---- references --------------------------------------------------------------------


def union_find_labels(x, tol):
    """Components of |x_i - x_j| <= tol by union-find over all pairs (double loop)."""
    n = x.shape[0]
    parent = list(range(n))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            if np.sqrt(np.sum((x[i] - x[j]) ** 2)) <= tol:
                parent[find(i)] = find(j)
    return np.array([find(i) for i in range(n)])


def same_partition(a, b):
    """Labelings equal up to a permutation of the labels."""
    pairs = set(zip(np.asarray(a).tolist(), np.asarray(b).tolist(), strict=True))
    return len(pairs) == len(set(np.asarray(a).tolist())) == len(set(b.tolist()))


def separated_centres(rng, k, d, min_sep):
    """k centres in [-2, 2]^d, pairwise at least min_sep apart (rejection)."""
    centres = [rng.uniform(-2, 2, d)]
    while len(centres) < k:
        c = rng.uniform(-2, 2, d)
        if min(np.linalg.norm(c - o) for o in centres) >= min_sep:
            centres.append(c)
    return np.array(centres)


def blobs(rng, k, d, per_cluster, sigma):
    """Gaussian blobs of spread sigma around k separated centres: (x, truth)."""
    centres = separated_centres(rng, k, d, min_sep=1.0)
    truth = np.repeat(np.arange(k), per_cluster)
    x = centres[truth] + sigma * rng.normal(size=(truth.size, d))
    return x, truth


def valid_tol_range(x, truth):
    """[lo, hi): explicit tolerances that recover `truth` exactly.

    lo: the largest single-linkage height inside a true cluster (scipy's linkage,
    an independent MST); hi: the smallest distance between two true clusters.
    """
    lo = max(linkage(x[truth == c], "single")[:, 2].max() for c in np.unique(truth))
    hi = min(
        cdist(x[truth == a], x[truth == b]).min()
        for a in np.unique(truth)
        for b in np.unique(truth)
        if a < b
    )
    return lo, hi


# ---- shared runs (one compilation each) --------------------------------------------


def _identity_attention(d):
    eye = jnp.eye(d)
    return mf.SoftmaxAttention(eye, A=eye)  # Q = K = V = I


@pytest.fixture(scope="module")
def rd_run():
    """Q = K = V = I in R^3 without normalisation, Gaussian tokens, t in [0, 10].

    By t = 3 the rescaled tokens sit in 5 clusters whose spread then shrinks like
    e^{-ct} (gap 1e4 at t = 10, measured), so t1 = 10 is well converged while
    e^{10} |x| ~ 1e5 stays far below the blow-up radius.
    """
    x0 = jr.normal(jr.key(0), (N_TOKENS, D))
    ts = jnp.linspace(0.0, 10.0, 11)
    return mf.simulate(mf.Particles(x0), _identity_attention(D), 10.0, saveat=ts)


@pytest.fixture(scope="module")
def sphere_run():
    """Q = K = V = I on the sphere S^2: tokens collapse to one point (t ~ 13).

    `layers` (the post-LayerNorm Transformer, explicit Euler with h = 0.05)
    compiles several times faster than `simulate` and shows the same collapse.
    """
    x0 = jr.normal(jr.key(0), (N_TOKENS, D))
    x0 = x0 / jnp.linalg.norm(x0, axis=-1, keepdims=True)
    return mf.layers(
        mf.Particles(x0), _identity_attention(D), 300, t1=15.0, normalization="sphere"
    )


# ---- spanning trees ----------------------------------------------------------------


def _point_sets():
    rng = np.random.default_rng(0)
    x_blobs, _ = blobs(rng, 5, 3, 80, 1e-3)
    return {
        "uniform": rng.uniform(size=(600, 2)),
        "blobs": x_blobs,
        "duplicates": np.repeat(rng.normal(size=(40, 2)), 25, axis=0),
        "line": np.c_[np.linspace(0, 1, 500) ** 2, np.zeros(500)],
        "clumps": np.repeat(rng.normal(size=(12, 3)), 50, axis=0)
        + 1e-9 * rng.normal(size=(600, 3)),
    }


@pytest.mark.parametrize("name", list(_point_sets()))
def test_spanning_trees_match_scipy_single_linkage(name):
    x = _point_sets()[name]
    want = np.sort(linkage(x, "single")[:, 2])
    for mst in (_mst._prim, _mst._boruvka):
        edges = mst(x)
        assert edges.w.size == x.shape[0] - 1
        # Same distances up to the rounding of |x_i - x_j| (k-d tree vs NumPy).
        np.testing.assert_allclose(np.sort(edges.w), want, rtol=1e-12, atol=1e-15)
        # A spanning tree: n - 1 edges joining everything.
        assert _mst._components(x.shape[0], edges)[0] == 1


@pytest.mark.parametrize("neighbours, small", [(1, 0), (2, 3), (3, 10_000)])
def test_boruvka_fallback_searches_are_exact(monkeypatch, neighbours, small):
    # Few neighbours force the exact searches: in the global tree (components up
    # to `small` points) and in a tree of the complement (larger ones).
    monkeypatch.setattr(_mst, "NEIGHBOURS", neighbours)
    monkeypatch.setattr(_mst, "_SMALL_COMPONENT", small)
    for name in ("blobs", "duplicates", "clumps"):
        x = _point_sets()[name]
        want = np.sort(linkage(x, "single")[:, 2])
        got = np.sort(_mst._boruvka(x).w)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_truncated_boruvka_keeps_exactly_the_short_edges():
    x = _point_sets()["blobs"]
    h = 0.5  # between the blob spread (1e-3) and the centre separation (>= 1)
    edges = _mst._boruvka(x, max_height=h)
    want = np.sort(linkage(x, "single")[:, 2])
    np.testing.assert_allclose(np.sort(edges.w), want[want <= h], rtol=1e-12)


# ---- clusters ----------------------------------------------------------------------


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("per_cluster", [20, 100])  # n = 100 (Prim), 500 (Boruvka)
def test_gaussian_blobs_are_found_over_the_valid_tolerance_range(d, per_cluster):
    rng = np.random.default_rng(d * 1000 + per_cluster)
    k, sigma = 5, 0.01
    x, truth = blobs(rng, k, d, per_cluster, sigma)
    lo, hi = valid_tol_range(x, truth)
    # The sample is clustered: a factor > 10 between the two scales.
    assert hi > 10 * lo
    for tol in [*np.geomspace(lo, hi, 6)[:-1], hi * (1 - 1e-9)]:
        labels, number = C.clusters(x, tol)
        assert number == k
        assert same_partition(labels, truth)
    # Just below lo the widest link inside a cluster is cut.
    assert C.clusters(x, lo * (1 - 1e-9))[1] > k

    found = C.detect(x)
    assert (found.number, found.method) == (k, "gap")
    assert same_partition(found.labels, truth)
    assert lo < found.tol < hi and found.gap >= 10
    np.testing.assert_array_equal(found.labels[0], 0)  # numbered by first appearance
    means = np.array([x[found.labels == c].mean(axis=0) for c in range(k)])
    np.testing.assert_allclose(found.centres, means, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(found.masses, found.sizes / x.shape[0], rtol=1e-12)


@pytest.mark.parametrize("tol", [0.05, 0.15, 0.3, 0.6])
def test_explicit_tol_matches_naive_union_find(tol):
    x = np.random.default_rng(1).uniform(size=(120, 2))
    labels, number = C.clusters(x, tol)
    want = union_find_labels(x, tol)
    assert number == len(set(want.tolist())) and same_partition(labels, want)
    # Labels are 0..k-1 in order of first appearance.
    _, first = np.unique(labels, return_index=True)
    np.testing.assert_array_equal(labels[np.sort(first)], np.arange(number))


def test_weighted_centres_and_masses():
    x = np.array([[0.0, 0.0], [0.0, 1e-3], [5.0, 0.0]])
    w = np.array([0.2, 0.6, 0.2])
    found = C.detect(x, 0.1, weights=w)
    assert found.number == 2 and found.method == "given" and found.gap is None
    np.testing.assert_allclose(found.masses, [0.8, 0.2])
    np.testing.assert_allclose(found.centres, [[0.0, 0.75e-3], [5.0, 0.0]])
    np.testing.assert_array_equal(found.sizes, [2, 1])


@pytest.mark.parametrize(
    "x, number, method",
    [
        (np.array([[1.0, 2.0]]), 1, "none"),  # a single point
        (np.array([[1.0, 0.0], [-1.0, 0.0]]), 2, "relative"),  # two far points
        (np.array([[1.0, 0.0], [1.0, 1e-4]]), 1, "gap"),  # two points, one cluster
        (np.ones((10, 3)), 1, "none"),  # all equal: coincident points merge
        (np.zeros((4, 2)), 1, "none"),  # all at the origin
        (np.array([[1.0, 1e-9], [1.0, 0.0], [1.0, 2e-9]]), 1, "gap"),  # tiny spread
    ],
)
def test_automatic_tolerance_edge_cases(x, number, method):
    found = C.detect(x)
    assert (found.number, found.method) == (number, method)
    assert found.tol > 0 and np.isfinite(found.tol)


def test_min_gap_controls_the_cut():
    x = np.array([[1.0, 0.0], [1.0, 1e-4], [-1.0, 0.0]])  # gap 2 / 1e-4 = 2e4
    assert C.detect(x).number == 2
    found = C.detect(x, min_gap=1e5)
    # No accepted gap: the relative tolerance 1e-2 max|x| = 1e-2 > 1e-4 merges the pair.
    assert (found.number, found.method) == (2, "relative")
    assert found.tol == pytest.approx(1e-2)
    assert found.gap == pytest.approx(2e4, rel=1e-6)


def test_unstructured_cloud_has_no_gap_and_falls_back_to_the_relative_tol():
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, size=(60, 2))
    found = C.detect(x)
    # Uniform points: consecutive merge heights within a factor < 10 of each other.
    assert found.method == "relative" and found.gap < 10
    assert found.tol == pytest.approx(1e-2 * np.linalg.norm(x, axis=1).max())
    # At 1e-2 of the scale almost every point of a sparse cloud stays alone (here
    # one pair is closer than 0.0138).
    number = found.number
    assert number == C.detect(x, found.tol).number and number >= 55
    # Exact duplicates merge but create no gap (no ratio against h = 0).
    found = C.detect(np.concatenate([x, x[:5]]))
    assert found.method == "relative" and found.number == number


def test_gap_rule_picks_the_largest_ratio_and_one_cluster_needs_the_scale():
    # Three pairs 1e-4 apart, the pairs ~1 apart: heights 1e-4 (x3), 1 - 1e-4,
    # 1 and the scale max|x| ~ 3.6; the largest ratio, ~1e4, gives 3 clusters.
    base = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]) + 2.0
    pairs = np.concatenate([base, base + [1e-4, 0]])
    found = C.detect(pairs)
    assert found.number == 3
    # Coordinates ~2 carry a 1e-4 offset to ~1e-12 relative: rel=1e-9 has margin.
    assert found.gap == pytest.approx((1 - 1e-4) / 1e-4, rel=1e-9)
    assert found.tol == pytest.approx(np.sqrt(1e-4 * (1 - 1e-4)), rel=1e-9)
    # One blob of spread 1e-3 at distance ~2 from the origin: one cluster (the
    # gap to the scale max|x| ~ 2.8 beats any gap inside the blob).
    blob = 2.0 + 1e-3 * np.random.default_rng(4).uniform(size=(40, 2))
    found = C.detect(blob)
    assert (found.number, found.method) == (1, "gap") and found.gap > 100


# ---- rescaling ---------------------------------------------------------------------


def test_rescale_matches_scipy_expm_and_keeps_inf_rows(rd_run):
    rng = np.random.default_rng(5)
    V = rng.normal(size=(D, D))  # non-symmetric
    # rd_run's shapes (one compilation), with an early stop after 8 save times.
    ts, x = np.asarray(rd_run.ts).copy(), np.asarray(rd_run.x).copy()
    ts[8:], x[8:] = np.inf, np.inf  # as `simulate` writes after a stop
    z = np.asarray(C.rescale(SimpleNamespace(ts=ts, x=x), V))
    want = np.stack([x[i] @ scipy.linalg.expm(-t * V).T for i, t in enumerate(ts[:8])])
    # Pade expm in float64, |tV| <= ~20: both sides carry ~1e-13 relative error
    # (scaling and squaring); 1e-10 has margin.
    np.testing.assert_allclose(z[:8], want, rtol=1e-10, atol=1e-10 * np.abs(want).max())
    assert np.all(z[8:] == np.inf)
    # V = I: z = e^{-t} x up to rounding. (Bare jax.scipy.linalg.expm misses this
    # by 2e-8 at t = 10: it under-scales norms in [5.4, 10.7).)
    z = np.asarray(C.rescale(rd_run, jnp.eye(D)))
    want = np.exp(-np.asarray(rd_run.ts))[:, None, None] * np.asarray(rd_run.x)
    np.testing.assert_allclose(z, want, rtol=1e-12)


# ---- the R^d run: limit polytope ---------------------------------------------------


def test_rescaled_tokens_converge_to_polytope_vertices(rd_run):
    assert rd_run.status == "success"
    z = np.asarray(C.rescale(rd_run, jnp.eye(D)))
    counts = C.cluster_counts(rd_run, V=jnp.eye(D))
    # The count has settled: the same at the last three save times.
    assert len(set(counts.counts[-3:].tolist())) == 1
    poly = C.polytope(z[-1])
    k = poly.clusters.number
    # Clustering: on average >= 4 tokens per limit point (5 measured), and the
    # spread inside clusters is > 1000x below the distance between them.
    assert 2 <= k <= N_TOKENS // 4
    assert poly.clusters.gap > 1e3
    # Geshkovski et al. (2023), V = I, A = I > 0: limits on the boundary of a
    # convex polytope, most of them at its vertices.
    assert poly.on_boundary.all()
    assert poly.fraction_at_vertices >= 0.5
    assert poly.dim == D and poly.volume > 0
    assert poly.points_at_vertices == poly.clusters.sizes[poly.vertices].sum()


def test_polytope_degenerate_and_full_dimensional_hulls():
    def cluster_points(centres, per=3, spread=1e-7):
        rng = np.random.default_rng(6)
        c = np.repeat(np.asarray(centres, float), per, axis=0)
        return c + spread * rng.normal(size=c.shape)

    one = C.polytope(cluster_points([[1.0, 2.0, 3.0]]))
    assert (one.dim, one.vertices.tolist(), one.volume) == (0, [0], 0.0)
    segment = C.polytope(cluster_points([[1.0, 0, 0], [0, 1.0, 0]]))
    assert segment.dim == 1 and segment.vertices.tolist() == [0, 1]
    assert segment.volume == pytest.approx(np.sqrt(2), rel=1e-6)
    # Three collinear centres: the middle one is inside the segment.
    line = C.polytope(cluster_points([[0, 0, 1.0], [1, 1, 1.0], [2, 2, 1.0]]))
    assert line.dim == 1 and line.on_boundary.tolist() == [True, False, True]
    assert line.points_at_vertices == 6 and line.fraction_at_vertices == 6 / 9
    # A square and its centre in the plane z = 1 of R^3: 2-d hull.
    square = [[1, 1, 1], [3, 1, 1], [3, 3, 1], [1, 3, 1], [2, 2, 1]]
    flat = C.polytope(cluster_points(square))
    assert flat.dim == 2 and flat.vertices.tolist() == [0, 1, 2, 3]
    assert flat.on_boundary.tolist() == [True] * 4 + [False]
    assert flat.volume == pytest.approx(4.0, rel=1e-6)
    # A cube, the midpoint of an edge, and its centre.
    cube = [[i, j, k] for i in (1, 2) for j in (1, 2) for k in (1, 2)]
    solid = C.polytope(cluster_points([*cube, [1.5, 1, 1], [1.5, 1.5, 1.5]]))
    assert solid.dim == 3 and solid.vertices.tolist() == list(range(8))
    assert solid.on_boundary.tolist() == [True] * 9 + [False]
    assert solid.volume == pytest.approx(1.0, rel=1e-6)


# ---- the sphere run: consensus and counts over time --------------------------------


def test_consensus_time_on_the_sphere(sphere_run):
    assert sphere_run.status == "success"
    tol = C.CONSENSUS_TOL
    t_star = C.consensus_time(sphere_run)
    assert np.isfinite(t_star)
    i = int(np.flatnonzero(np.asarray(sphere_run.ts) == t_star)[0])
    x = np.asarray(sphere_run.x)
    assert C.diameter(x[i]) <= tol < C.diameter(x[i - 1])
    # Every earlier time: not yet one cluster.
    assert all(C.diameter(x[j]) > tol for j in range(i))


def test_consensus_time_in_rd_with_rescaling_is_inf(rd_run):
    # Several clusters of rescaled tokens never merge: no consensus.
    assert C.consensus_time(rd_run, V=jnp.eye(D)) == np.inf


def test_cluster_counts_on_the_sphere(sphere_run):
    fixed = C.cluster_counts(sphere_run, 1e-2)
    assert np.all(np.diff(fixed.counts) <= 0) and fixed.counts[-1] == 1
    assert np.all(fixed.tol == 1e-2)
    automatic = C.cluster_counts(sphere_run)
    assert automatic.counts[-1] == 1 and automatic.ts.shape == fixed.ts.shape
    x = np.asarray(sphere_run.x)
    for i in range(0, x.shape[0], 15):  # every 15th time: the reference is slow
        want = len(set(union_find_labels(x[i], 1e-2).tolist()))
        assert fixed.counts[i] == want


def test_cluster_counts_of_an_array_skips_unreached_times(rd_run):
    eye = jnp.eye(D)
    ts = np.asarray(rd_run.ts).copy()
    x = np.asarray(rd_run.x).copy()
    ts[-2:], x[-2:] = np.inf, np.inf  # as after an early stop
    counts = C.cluster_counts(x, ts=ts, V=eye)
    np.testing.assert_array_equal(counts.ts, ts[:-2])
    np.testing.assert_array_equal(
        counts.counts, C.cluster_counts(rd_run, V=eye).counts[:-2]
    )


# ---- large n -----------------------------------------------------------------------


def test_large_n_without_quadratic_memory():
    rng = np.random.default_rng(7)
    n = 20_000
    centres = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]])
    truth = rng.integers(0, 3, n)
    x = centres[truth] + 0.05 * rng.normal(size=(n, 2))
    tracemalloc.start()
    try:
        found = C.detect(x)
        explicit = C.detect(x, 0.5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # An (n, n) float64 matrix would be 3.2 GB; O(16 n) lists are ~10 MB.
    assert peak < 100e6
    assert found.number == explicit.number == 3
    assert same_partition(found.labels, truth) and same_partition(
        explicit.labels, truth
    )
    # On a subsample the fast path agrees with the naive reference.
    sub = rng.choice(n, 300, replace=False)
    want = union_find_labels(x[sub], found.tol)
    assert same_partition(C.clusters(x[sub], found.tol)[0], want)


# ---- bad inputs --------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: C.clusters(np.zeros(3)), "`x`"),
        (lambda: C.clusters(np.zeros((0, 2))), "`x`"),
        (lambda: C.clusters(np.array([[0.0, np.nan]])), "`x`"),
        (lambda: C.clusters(np.array([[0.0, np.inf]])), "`x`"),
        (lambda: C.clusters(np.zeros((3, 2)), 0.0), "`tol`"),
        (lambda: C.clusters(np.zeros((3, 2)), -1.0), "`tol`"),
        (lambda: C.clusters(np.zeros((3, 2)), np.nan), "`tol`"),
        (lambda: C.clusters(np.zeros((3, 2)), "a"), "`tol`"),
        (lambda: C.detect(np.zeros((3, 2)), weights=np.ones(2)), "`weights`"),
        (lambda: C.detect(np.zeros((3, 2)), weights=-np.ones(3)), "`weights`"),
        (lambda: C.detect(np.zeros((3, 2)), min_gap=1.0), "`min_gap`"),
        (lambda: C.polytope(np.zeros((3, 2)), boundary_tol=-1), "`boundary_tol`"),
        (
            lambda: C.rescale(
                SimpleNamespace(ts=[0.0], x=np.zeros((1, 2, 3))), np.eye(2)
            ),
            "`V`",
        ),
        (
            lambda: C.rescale(SimpleNamespace(ts=[0.0], x=np.zeros((2, 3))), np.eye(3)),
            "`sol`",
        ),
        (lambda: C.cluster_counts(np.zeros((2, 3))), "`trajectory`"),
        (lambda: C.cluster_counts(np.zeros((2, 4, 3)), ts=[0.0]), "`ts`"),
        (lambda: C.cluster_counts(np.zeros((2, 4, 3)), V=np.eye(3)), "`ts`"),
        (lambda: C.cluster_counts(np.full((2, 4, 3), np.nan)), "`trajectory`"),
        (
            lambda: C.consensus_time(
                SimpleNamespace(ts=[0.0], x=np.zeros((1, 2, 3))), tol=0
            ),
            "`tol`",
        ),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_diameter_matches_brute_force():
    x = np.random.default_rng(8).normal(size=(50, 4))
    assert C.diameter(x) == pytest.approx(cdist(x, x).max(), rel=1e-14)
    assert C.diameter(np.ones((3, 2))) == 0.0


def test_a_single_close_pair_is_not_structure():
    # Without the ceil(n/2) rule the ratio (next merge) / (closest pair) ~ 1e3 would
    # be the cut, and 59 of 60 points would be "clusters" at tol ~ 3e-3.
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, size=(60, 2))
    x[1] = x[0] + 1e-5
    found = C.detect(x)
    assert found.method == "relative"
    assert found.number == C.detect(x, 1e-2 * np.linalg.norm(x, axis=1).max()).number
