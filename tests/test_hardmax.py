"""Hardmax attention: the field, its a.e. derivative, ties, and the leaders dynamics.

References are NumPy double loops. Ties in the references are logits within
TIE_WINDOW |q| max|k| of the maximum: far above the rounding of a dot product
(~1e-15 of |q| |k|) and far below the gaps of the test data (> 1e-6), so the
reference and the library pick the same sets.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import meanfield as mf

TIE_WINDOW = 1e-12


def hardmax_velocity_numpy(z, x, w, V, A, query_pos=None, key_pos=None):
    """Gamma(z_i) = sum_{j in S_i} w_j V x_j / sum_{j in S_i} w_j, double loop."""
    result = np.zeros((z.shape[0], V.shape[0]))
    k_max = max(np.linalg.norm(x[j]) for j in range(x.shape[0]))
    for i in range(z.shape[0]):
        q = A @ z[i]
        logits = {}
        for j in range(x.shape[0]):
            if w[j] > 0 and (query_pos is None or key_pos[j] <= query_pos[i]):
                logits[j] = float(np.dot(q, x[j]))
        if not logits:
            continue  # a query that sees no key
        best = max(logits.values())
        window = TIE_WINDOW * np.linalg.norm(q) * k_max
        chosen = [j for j, l in logits.items() if l >= best - window]
        total = sum(w[j] for j in chosen)
        for j in chosen:
            result[i] += w[j] / total * (V @ x[j])
    return result


def leaders_numpy(z0, A, alpha, L):
    """Alcalde, Fantuzzi & Zuazua's layers (arXiv 2407.01602), double loop:

    z_i <- z_i + alpha / (1 + alpha) (mean_{j in C_i(z)} z_j - z_i),
    C_i(z) = argmax_j <A z_i, z_j> (every token counted, duplicates included).
    Returns the L + 1 states, shape (L + 1, n, d).
    """
    z = np.array(z0, dtype=float)
    states = [z.copy()]
    n = z.shape[0]
    for _ in range(L):
        new = np.empty_like(z)
        k_max = max(np.linalg.norm(z[j]) for j in range(n))
        for i in range(n):
            q = A @ z[i]
            logits = [float(np.dot(q, z[j])) for j in range(n)]
            best = max(logits)
            window = TIE_WINDOW * np.linalg.norm(q) * k_max
            chosen = [j for j in range(n) if logits[j] >= best - window]
            mean = sum(z[j] for j in chosen) / len(chosen)
            new[i] = z[i] + alpha / (1 + alpha) * (mean - z[i])
        z = new
        states.append(z.copy())
    return np.array(states)


def random_problem(key, n, d, m=None):
    """(x, w, V, A, z): random tokens, Dirichlet weights, V, SPD A, queries."""
    kx, kw, kv, ka, kz = jr.split(key, 5)
    x = np.asarray(jr.normal(kx, (n, d)))
    w = np.asarray(jr.dirichlet(kw, jnp.ones(n)))
    V = np.asarray(jr.normal(kv, (d, d)))
    M = np.asarray(jr.normal(ka, (d, d)))
    A = M @ M.T + np.eye(d)
    z = np.asarray(jr.normal(kz, (m or n, d)))
    return x, w, V, A, z


# A square of leaders (A = I), a token on the axis tied between two of them, and
# tokens inside each quadrant: the configuration of the tie tests.
SQUARE = np.array([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])
INSIDE = np.array([[0.5, 0.0], [0.3, 0.6], [-0.2, 0.4], [-0.5, -0.25], [0.1, -0.7]])


# --- the field ---------------------------------------------------------------


@pytest.mark.parametrize("n, d", [(1, 2), (7, 3), (40, 4)])
def test_velocity_matches_naive_loop(key, n, d):
    x, w, V, A, z = random_problem(key, n, d, m=11)
    attn, mu = mf.HardmaxAttention(V, A=A), mf.Particles(x, w)
    velocity = jax.jit(lambda att, mu: att.velocity(mu))
    velocity_at = jax.jit(lambda att, mu, z: att.velocity_at(mu, z))
    # Each output is a weighted mean of a few V x_j: agreement ~1e-15.
    np.testing.assert_allclose(
        velocity(attn, mu), hardmax_velocity_numpy(x, x, w, V, A), rtol=0, atol=1e-12
    )
    np.testing.assert_allclose(
        velocity_at(attn, mu, z),
        hardmax_velocity_numpy(z, x, w, V, A),
        rtol=0,
        atol=1e-12,
    )


def test_query_key_form_matches_bilinear_form(key):
    x, w, V, A, z = random_problem(key, 9, 3)
    Q = np.asarray(jr.normal(jr.fold_in(key, 1), (2, 3)))
    K = np.asarray(jr.normal(jr.fold_in(key, 2), (2, 3)))
    got = mf.HardmaxAttention(V, Q=Q, K=K).velocity_at(mf.Particles(x, w), z)
    # <Q z, K x> = <Q^T K z... > : the bilinear form with A = K^T Q.
    want = hardmax_velocity_numpy(z, x, w, V, K.T @ Q)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("blocking", ["dense", "blocked"])
def test_masked_velocity_matches_naive_loop(key, blocking):
    n, d = 23, 3
    x, w, V, A, _ = random_problem(key, n, d)
    s = np.asarray(jr.uniform(jr.fold_in(key, 1), (n,), minval=0.2, maxval=1.0))
    attn = mf.HardmaxAttention(V, A=A, blocking=blocking, block_size=4)
    mu = mf.MaskedParticles(x, s, w)
    np.testing.assert_allclose(
        attn.velocity(mu),
        hardmax_velocity_numpy(x, x, w, V, A, query_pos=s, key_pos=s),
        rtol=0,
        atol=1e-12,
    )
    # Query positions of their own; below every key's position nothing is seen.
    z = np.asarray(jr.normal(jr.fold_in(key, 2), (6, d)))
    sz = np.array([0.1, 0.15, 0.3, 0.5, 0.9, 1.0])
    got = attn.velocity_at(mu, z, positions=sz)
    want = hardmax_velocity_numpy(z, x, w, V, A, query_pos=sz, key_pos=s)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got[:2], 0.0)  # a query that sees no key


def test_zero_weight_atoms_are_never_chosen():
    # The far atom has the largest logit for every query but no weight.
    x = np.array([[0.0, 1.0], [1.0, 0.0], [10.0, 10.0]])
    attn = mf.HardmaxAttention(np.eye(2), A=np.eye(2))
    got = attn.velocity_at(mf.Particles(x, [0.5, 0.5, 0.0]), np.array([[1.0, 2.0]]))
    np.testing.assert_array_equal(got, [[0.0, 1.0]])


def test_ties_are_shared_in_proportion_to_weights():
    # Query (1, 0) with A = I: (1, 1) and (1, -1) tie exactly; (1, 1) twice
    # (coincident atoms) and a loser at logit 0.
    x = np.array([[1.0, 1.0], [1.0, -1.0], [0.0, 0.5], [1.0, 1.0]])
    w = np.array([0.1, 0.3, 0.4, 0.2])
    attn = mf.HardmaxAttention(np.eye(2), A=np.eye(2))
    got = attn.velocity_at(mf.Particles(x, w), np.array([[1.0, 0.0]]))
    want = (0.1 * x[0] + 0.3 * x[1] + 0.2 * x[3]) / 0.6
    np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-15)


@pytest.mark.parametrize("blocking", ["dense", "blocked"])
def test_ties_within_rounding_are_ties(blocking):
    # k2 = k1 + p + e with p orthogonal to q and e tiny, all dyadic: every
    # product and sum below is exact, so the logits are 5/8 and the next float64
    # up under any BLAS, FMA contraction or rounding mode (1/4 e_0 = 2^-53 =
    # ulp(5/8)), while the keys are 0.79 apart.
    q = np.array([[0.25, 0.75]])
    k1 = np.array([1.0, 0.5])
    k2 = np.array([0.25 + 2.0**-51, 0.75])
    assert q[0] @ k1 == 0.625
    assert q[0] @ k2 == np.nextafter(0.625, np.inf)  # one ulp apart
    # Nine keys on the circle of radius 0.2: logits <= 0.2 |q| < 0.2, far below.
    angles = 2 * np.pi * np.arange(9) / 9
    rest = 0.2 * np.stack([np.cos(angles), np.sin(angles)], axis=1)
    # k1 first, k2 last: in different blocks of the blocked kernel.
    x = np.concatenate([k1[None], rest, k2[None]])
    w = np.full(11, 0.05)
    w[0], w[-1] = 0.2, 0.35
    attn = mf.HardmaxAttention(np.eye(2), A=np.eye(2), blocking=blocking, block_size=3)
    got = attn.velocity_at(mf.Particles(x, w), q)
    # k2 alone (the strict maximum) would give k2, 0.3 away from the mean.
    np.testing.assert_allclose(got[0], (0.2 * k1 + 0.35 * k2) / 0.55, atol=1e-15)


def test_dense_and_blocked_agree_with_ties_across_blocks(key):
    n, d = 37, 2
    x, w, V, _, _ = random_problem(key, n, d)
    x = 0.3 * x
    # Two coincident atoms far out (indices 2 and 33: different key blocks of 4)
    # and the square's tie: queries that pick them share between blocks.
    x[2] = x[33] = [2.0, 1.0]
    x[5], x[30] = [3.0, 3.0], [3.0, -3.0]
    x[10] = [0.7, 0.0]  # tied between x[5] and x[30] with A = I
    A = np.eye(d)
    mu = mf.Particles(x, w)
    dense = mf.HardmaxAttention(V, A=A, blocking="dense")
    blocked = mf.HardmaxAttention(V, A=A, blocking="blocked", block_size=4)
    z = np.concatenate([x, [[1.0, 0.0], [1.0, 0.5]]])
    got_dense = dense.velocity_at(mu, z)
    got_blocked = blocked.velocity_at(mu, z)
    np.testing.assert_allclose(got_blocked, got_dense, rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        got_dense, hardmax_velocity_numpy(z, x, w, V, A), rtol=0, atol=1e-12
    )
    # The tied query x[10] gets the weighted mean of x[5] and x[30]'s values.
    share = (w[5] * V @ x[5] + w[30] * V @ x[30]) / (w[5] + w[30])
    np.testing.assert_allclose(got_blocked[10], share, atol=1e-14)


def test_jacobian_is_the_almost_everywhere_derivative(key):
    n, d = 9, 3
    x, w, V, A, _ = random_problem(key, n, d)
    attn, mu = mf.HardmaxAttention(V, A=A), mf.Particles(x, w)

    def field(x):
        return attn.velocity(eqx.tree_at(lambda m: m.x, mu, x))

    jac = np.asarray(jax.jacfwd(field)(jnp.asarray(x)))  # (n, d, n, d)
    # d Gamma_i / d x_j = w_j 1[j in S_i] / W_i V: the selection is locally
    # constant, so neither the query nor the losing keys contribute.
    logits = (x @ A.T) @ x.T
    chosen = logits >= logits.max(axis=1, keepdims=True)
    coef = np.where(chosen, w[None, :], 0.0)
    coef /= coef.sum(axis=1, keepdims=True)
    want = np.einsum("ij,ab->iajb", coef, V)
    np.testing.assert_allclose(jac, want, rtol=0, atol=1e-14)


def test_float32(key):
    x, w, V, A, _ = random_problem(key, 12, 3)
    attn = mf.HardmaxAttention(V.astype(np.float32), A=A.astype(np.float32))
    got = attn.velocity(mf.Particles(x.astype(np.float32), w.astype(np.float32)))
    assert got.dtype == jnp.float32
    # The random logits' gaps are > 1e-3, far above float32 rounding: the same
    # selection as in float64, the values rounded (~1e-7 relative).
    want = hardmax_velocity_numpy(x, x, w, V, A)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_softmax_with_beta_A_converges_to_hardmax_at_rate_exp_minus_beta_gap():
    # Query (1, 0), A = I: logits 1, 1 (tie), 0 (gap 1), -1 (gap 2). Weights
    # stay a fixed log-prior while beta grows, so they share the tie.
    x = np.array([[1.0, 1.0], [1.0, -1.0], [0.0, 0.5], [-1.0, 0.0]])
    w = np.array([0.1, 0.3, 0.2, 0.4])
    z, mu = np.array([[1.0, 0.0]]), mf.Particles(x, w)
    hard = np.asarray(mf.HardmaxAttention(np.eye(2), A=np.eye(2)).velocity_at(mu, z))
    np.testing.assert_allclose(hard[0], [1.0, -0.5], atol=1e-15)
    for beta in (12.0, 16.0, 20.0):
        soft = mf.SoftmaxAttention(np.eye(2), A=beta * np.eye(2)).velocity_at(mu, z)
        err = np.linalg.norm(np.asarray(soft) - hard)
        # err = (w_3 / (w_1 + w_2)) e^{-beta} |x_3 - Gamma| (1 + O(e^{-beta})); the
        # difference of O(1) values loses ~1e-16 / err ~ 1e-8 relative at beta=20.
        np.testing.assert_allclose(err * np.exp(beta), 0.5 * np.sqrt(2), rtol=1e-4)


# --- the leaders dynamics (Alcalde, Fantuzzi & Zuazua, arXiv 2407.01602) ------


def leaders_by_rescaled_layers(z0, A, alpha, L):
    """Their layers as `mf.layers` of y_k = (1 + alpha)^k z_k (V = I, h = alpha).

    The selection is invariant under z -> c z (c > 0), so y_{k+1} = y_k +
    alpha Gamma(y_k): L layers of depth t1 = alpha L.
    """
    attn = mf.HardmaxAttention(np.eye(z0.shape[1]), A=A)
    sol = mf.layers(mf.Particles(z0), attn, L, t1=alpha * L)
    return np.asarray(sol.x) / (1 + alpha) ** np.arange(L + 1)[:, None, None]


def leaders_by_block(z0, A, alpha, L):
    """Their layers as a Lie-split block: z + alpha Gamma(z), then the feed-forward
    step x + alpha F(x) with F(x) = -x / (1 + alpha), i.e. division by 1 + alpha."""
    d = z0.shape[1]
    block = mf.Block(
        mf.HardmaxAttention(np.eye(d), A=A), mf.FeedForward(-np.eye(d) / (1 + alpha))
    )
    return np.asarray(mf.layers(mf.Particles(z0), block, L, t1=alpha * L).x)


@pytest.mark.parametrize("alpha", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("n, d", [(7, 2), (12, 3)])
@pytest.mark.parametrize("mapping", [leaders_by_rescaled_layers, leaders_by_block])
def test_layers_reproduce_the_leaders_dynamics(key, n, d, alpha, mapping):
    z0, _, _, A, _ = random_problem(key, n, d)
    L = 10
    want = leaders_numpy(z0, A, alpha, L)
    # O(1) tokens, 10 layers of O(n d) flops: rounding ~1e-15.
    np.testing.assert_allclose(mapping(z0, A, alpha, L), want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("mapping", [leaders_by_rescaled_layers, leaders_by_block])
def test_leaders_dynamics_with_ties_and_coincident_tokens(mapping):
    # The square's vertices are leaders; (0.5, 0) ties (1, 1) with (1, -1); a
    # second copy of (1, 1) makes that tie 2 : 1, so the first layer moves the
    # token towards (1, 1/3) and the tie breaks towards (1, 1).
    alpha, L = 1.0, 10
    z0 = np.concatenate([SQUARE, SQUARE[:1], INSIDE])
    want = leaders_numpy(z0, np.eye(2), alpha, L)
    got = mapping(z0, np.eye(2), alpha, L)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
    np.testing.assert_allclose(got[1, 5], [0.75, 1 / 6], atol=1e-15)
    np.testing.assert_allclose(got[:, :5], np.broadcast_to(z0[:5], (L + 1, 5, 2)))


def test_tokens_cluster_at_the_leaders():
    # Without the duplicate the tie of (0.5, 0) never breaks: it goes straight
    # to the midpoint (1, 0) of an edge, the others to the leader of their
    # quadrant, each as v + (1 + alpha)^{-k} (z0 - v). The midpoint is an
    # unstable equilibrium: once the quadrant tokens are within rounding of
    # (1, +-1) (k ~ 48) they join one side of its tie and push it off, so the
    # closed form holds while 2^{-k} is far above rounding.
    alpha, L = 1.0, 40
    z0 = np.concatenate([SQUARE, INSIDE])
    # The block form: the rescaled one grows like 2^k past `blowup_radius`.
    got = leaders_by_block(z0, np.eye(2), alpha, L)
    limits = np.concatenate([SQUARE, [[1, 0], [1, 1], [-1, 1], [-1, -1], [1, -1]]])
    k = np.arange(L + 1)[:, None, None]
    np.testing.assert_allclose(
        got, limits + (z0 - limits) / (1 + alpha) ** k, rtol=0, atol=1e-14
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_tokens_cluster_at_the_initial_leaders(seed):
    # Leaders: tokens that are their own unique maximiser, <A z_i, z_i> >
    # <A z_i, z_j> for j != i. They never move (the tokens stay in the convex
    # hull, over which z_i remains the unique maximiser of <A z_i, .>), and
    # generic tokens converge to them.
    rng = np.random.default_rng(seed)
    M = rng.normal(size=(2, 2))
    A, z0 = M @ M.T + 0.5 * np.eye(2), rng.normal(size=(20, 2))
    logits = z0 @ A @ z0.T
    leaders = np.flatnonzero(
        [np.all(logits[i, i] > np.delete(logits[i], i)) for i in range(20)]
    )
    zL = leaders_by_block(z0, A, 1.0, 60)[-1]
    # 2^{-60} ~ 1e-18: tokens reach their leader to rounding; leaders move only
    # by rounding too (a token within rounding of a leader ties with it).
    np.testing.assert_allclose(zL[leaders], z0[leaders], rtol=0, atol=1e-14)
    dist = np.linalg.norm(zL[:, None] - z0[leaders][None], axis=-1).min(axis=1)
    np.testing.assert_array_less(dist, 1e-13)


def test_continuous_leaders_dynamics_matches_closed_form():
    # The depth limit of their layer, z' = Gamma(z) - z (a block with F = -I):
    # each token goes to its limit as v + e^{-t} (z0 - v), the tied one included
    # (the mean of (1, 1) and (1, -1) has second coordinate exactly 0).
    z0 = np.concatenate([SQUARE, INSIDE])
    block = mf.Block(
        mf.HardmaxAttention(np.eye(2), A=np.eye(2)), mf.FeedForward(-np.eye(2))
    )
    ts = np.linspace(0, 5, 6)
    sol = mf.simulate(mf.Particles(z0), block, 5.0, saveat=ts, rtol=1e-11, atol=1e-11)
    limits = np.concatenate([SQUARE, [[1, 0], [1, 1], [-1, 1], [-1, -1], [1, -1]]])
    want = limits + (z0 - limits) * np.exp(-ts)[:, None, None]
    # tsit5 at rtol 1e-11 on a smooth (piecewise linear, no switch) field.
    np.testing.assert_allclose(sol.x, want, rtol=0, atol=1e-9)


def test_huge_tokens_select_as_ordinary_ones():
    # The selection is invariant under scaling the tokens; at |x| ~ 1e200 the
    # logits <A x_i, x_j> would overflow float64 without the power-of-two scale.
    rng = np.random.default_rng(11)
    x = rng.normal(size=(9, 3))
    attn = mf.HardmaxAttention(np.eye(3), A=np.eye(3))
    for blocking in ("dense", "blocked"):
        field = mf.HardmaxAttention(np.eye(3), A=np.eye(3), blocking=blocking)
        small = np.asarray(field.velocity(mf.Particles(x)))
        huge = np.asarray(field.velocity(mf.Particles(1e200 * x)))
        np.testing.assert_allclose(huge, 1e200 * small, rtol=1e-15)
    assert np.all(np.isfinite(np.asarray(attn.velocity(mf.Particles(1e200 * x)))))
