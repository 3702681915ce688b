"""Noisy particle dynamics: `simulate`, `layers` and `simulate_ensemble` with noise.

References are closed forms of Brownian motion (on the sphere and in R^d), exact
invariants of common noise, central finite differences, and each solve against
another on the same Brownian path (one key). Monte Carlo checks allow 5 standard
errors: a false failure has probability below 1e-6 per check.
"""

import diffrax as dfx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import meanfield as mf

Z = 5  # standard errors allowed by the Monte Carlo checks


def _on_sphere(key, n, d):
    x = np.asarray(jr.normal(key, (n, d)))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _silent(d):
    # V = 0: Gamma = 0, the tokens move by the noise alone.
    return mf.SoftmaxAttention(np.zeros((d, d)), A=np.eye(d))


def _attention(d):
    V = np.eye(d) + 0.5 * np.diag(np.ones(d - 1), 1)
    return mf.SoftmaxAttention(V, A=2 * np.eye(d))


def _mean_within(samples, want, z=Z):
    """|mean - want| <= z standard errors of the mean, for each column."""
    samples = np.asarray(samples)
    se = samples.std(axis=0, ddof=1) / np.sqrt(samples.shape[0])
    np.testing.assert_array_less(np.abs(samples.mean(axis=0) - want), z * se)


@pytest.mark.parametrize(
    "d, dt0",
    [
        pytest.param(2, 1 / 64, marks=pytest.mark.slow),
        (3, 1 / 64),
        pytest.param(2, None, marks=pytest.mark.slow),
    ],
)
def test_brownian_motion_on_the_sphere(key, d, dt0):
    # Stratonovich dx = sigma P_x o dW on S^{d-1}: E<x_t, x_0> = e^{-(d-1) sigma^2 t/2}
    # (an eigenfunction of the Laplace-Beltrami operator, eigenvalue -(d-1)).
    # V = 0 and independent noise: all B n = 1600 tokens are independent samples
    # (80 systems of 20: the attention costs n^2 per system). t1 = 1.5 puts the
    # clock at rate dt/ds = 0.75: a wrong sqrt(rate) would move the mean at t1 by
    # 6 standard errors. dt0 None: the adaptive solve (~600 steps per system).
    B, n, sigma, t1 = 80, 20, 0.8, 1.5
    ts = np.array([0.0, 0.5, 1.5])
    x0 = np.stack([_on_sphere(k, n, d) for k in jr.split(key, B)])
    sol = mf.simulate_ensemble(
        jax.vmap(mf.Particles)(x0), _silent(d), t1, saveat=ts,
        normalization="sphere", noise=mf.IndependentNoise(sigma), key=jr.key(1),
        dt0=dt0,
    )  # fmt: skip
    assert np.all(sol.status == "success")
    np.testing.assert_allclose(np.linalg.norm(sol.x, axis=-1), 1.0, atol=1e-14)
    cosines = np.sum(np.asarray(sol.x) * x0[:, None], axis=-1)  # (B, T, n)
    cosines = cosines.transpose(0, 2, 1).reshape(B * n, len(ts))
    # Adaptive (rtol 1e-3) or fixed steps: weak error below 1e-3, a tenth of a
    # standard error (~0.012).
    _mean_within(cosines, np.exp(-(d - 1) * sigma**2 * ts / 2))


def test_common_noise_on_the_sphere_is_brownian_motion_at_rate_one_over_d(key):
    # Each token alone sees sigma P_x dB x, quadratic variation (sigma^2 / d) P_x:
    # Brownian motion on S^{d-1} at speed sigma^2 / d. The tokens of one system share
    # the path, so the members (independent keys) are the samples.
    B, n, d, sigma, t1 = 300, 4, 3, 1.5, 1.0
    xs = np.stack([_on_sphere(k, n, d) for k in jr.split(key, B)])
    sol = mf.simulate_ensemble(
        jax.vmap(mf.Particles)(xs), _silent(d), t1, normalization="sphere",
        noise=mf.CommonNoise(sigma), key=jr.key(2), dt0=1 / 64,
    )  # fmt: skip
    cos = np.sum(np.asarray(sol.x[:, -1]) * xs, axis=-1).mean(axis=1)  # (B,)
    # Heun at dt = 1/64: weak error O(dt) ~ 1e-3, a tenth of a standard error.
    _mean_within(cos[:, None], np.exp(-(d - 1) * sigma**2 * t1 / (2 * d)))


def test_independent_noise_in_rd_is_gaussian(key):
    # V = 0 in R^d: x_t - x_s = sigma (W_t - W_s) exactly (additive noise, zero
    # drift: every step is exact), N(0, sigma^2 (t - s) I), increments independent.
    # t0 = 0.5, t1 = 3.5: clock length 4, rate 0.75.
    n, d, sigma = 1000, 2, 0.7
    ts = np.array([0.5, 1.5, 3.5])
    x0 = np.asarray(jr.normal(key, (n, d)))
    sol = mf.simulate(
        mf.Particles(x0), _silent(d), 3.5, t0=0.5, saveat=ts,
        noise=mf.IndependentNoise(sigma), key=jr.key(3),
    )  # fmt: skip
    steps = np.diff(np.asarray(sol.x), axis=0).reshape(2, n * d)  # two increments
    scaled = steps / (sigma * np.sqrt(np.diff(ts)))[:, None]  # ~ N(0, 1) if right
    _mean_within(scaled.T, 0.0)
    # Var of a sample variance of N samples of N(0, 1): 2 / (N - 1).
    N = n * d
    np.testing.assert_array_less(np.abs(scaled.var(axis=1) - 1), Z * np.sqrt(2 / N))
    # Independent increments: correlation ~ N(0, 1/N).
    assert abs(np.corrcoef(scaled)[0, 1]) < Z / np.sqrt(N)


def test_common_noise_in_rd_is_one_random_linear_map(key):
    # Ito dx_i = sigma dB x_i: x_i(t) = M_t x_i(0), one M_t for every token. A
    # token that starts as a x_1 + b x_2 stays a x_1 + b x_2 (each step is one
    # linear map of all tokens, so to rounding). Moments: E x_t = x_0 and
    # E <x_i, x_j>(t) = e^{sigma^2 t} <x_i, x_j>(0) (entries of B of variance t/d).
    B, d, sigma, t1 = 300, 3, 0.6, 1.0
    base = np.asarray(jr.normal(key, (2, d)))
    x0 = np.concatenate([base, [0.3 * base[0] - 1.2 * base[1]]])
    xs = np.broadcast_to(x0, (B, 3, d))
    sol = mf.simulate_ensemble(
        jax.vmap(mf.Particles)(xs), _silent(d), t1, noise=mf.CommonNoise(sigma),
        key=jr.key(4), dt0=1 / 64,
    )  # fmt: skip
    x = np.asarray(sol.x[:, -1])  # (B, 3, d)
    np.testing.assert_allclose(x[:, 2], 0.3 * x[:, 0] - 1.2 * x[:, 1], atol=1e-12)
    _mean_within(x.reshape(B, -1), x0.ravel())
    gram = np.einsum("bid,bjd->bij", x, x).reshape(B, -1)
    # Heun at dt = 1/64: weak error O(dt), below a tenth of a standard error.
    _mean_within(gram, np.exp(sigma**2 * t1) * (x0 @ x0.T).ravel())
    # Independent noise moves each token on its own path: the relation breaks.
    own = mf.simulate(
        mf.Particles(x0), _silent(d), t1, noise=mf.IndependentNoise(sigma),
        key=jr.key(4), dt0=1 / 64,
    ).x[-1]  # fmt: skip
    assert np.max(np.abs(own[2] - (0.3 * own[0] - 1.2 * own[1]))) > 0.1


@pytest.mark.parametrize("normalization", [None, "sphere"])
@pytest.mark.parametrize("kind", [mf.IndependentNoise, mf.CommonNoise])
def test_layers_are_euler_maruyama_on_the_path_of_simulate(key, normalization, kind):
    # layers(L) adds sigma g(x) (W(t_{l+1}) - W(t_l)) from the path simulate
    # integrates with the same key: it is simulate's Euler-Maruyama solve with
    # dt0 = t1 / L (on the sphere, the projected and normalised block). t1 = 3:
    # clock length 4. Same arithmetic: agreement to rounding (2e-14 observed).
    x0 = np.asarray(jr.normal(key, (6, 3)))
    L, t1 = 32, 3.0
    noise, k = kind(0.5), jr.key(5)
    stack = mf.layers(
        mf.Particles(x0), _attention(3), L, t1=t1, normalization=normalization,
        noise=noise, key=k,
    )  # fmt: skip
    solve = mf.simulate(
        mf.Particles(x0), _attention(3), t1, saveat=np.linspace(0, t1, L + 1),
        normalization=normalization, noise=noise, key=k, solver="euler", dt0=t1 / L,
    )  # fmt: skip
    np.testing.assert_allclose(stack.ts, solve.ts, atol=1e-15)
    np.testing.assert_allclose(stack.x, solve.x, rtol=1e-12, atol=1e-12)
    if normalization == "sphere":
        np.testing.assert_allclose(np.linalg.norm(stack.x, axis=-1), 1, atol=1e-14)


def _strong_errors(x0, noise, normalization, dts, keys, solver="heun"):
    """Slope of log mean |x_dt(t1) - x_ref(t1)| against log dt, on the same paths.

    The mean over paths, not the root mean square: one path can hold a third of
    the squared error, and the RMS slope then moves by 0.1 with the keys.
    """

    def final(k, dt, name):
        return mf.simulate(
            mf.Particles(x0), _attention(x0.shape[1]), 1.0, noise=noise, key=k,
            normalization=normalization, solver=name, dt0=dt,
        ).x[-1]  # fmt: skip

    ref = jax.vmap(lambda k: final(k, 2.0**-11, "heun"))(keys)
    errs = []
    for dt in dts:
        got = jax.vmap(lambda k, dt=dt: final(k, dt, solver))(keys)
        errs.append(np.mean(np.sqrt(np.sum((got - ref) ** 2, axis=(-2, -1)))))
    return np.polyfit(np.log(dts), np.log(errs), 1)[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, normalization, order",
    [
        # Non-commuting noise fields (P_x e_k, x on the sphere; E_kl x): strong
        # order 1/2 without Levy areas. Additive noise: Heun is strong order 1.
        (mf.IndependentNoise, "sphere", 0.5),
        (mf.CommonNoise, "sphere", 0.5),
        (mf.IndependentNoise, None, 1.0),
    ],
)
def test_heun_strong_order_on_one_brownian_path(key, kind, normalization, order):
    # Errors at t1 = 1 against dt = 2^-11 on the same 64 paths (one key each).
    # Observed slopes 0.51, 0.54, 0.99: within 0.15 of the order.
    x0 = _on_sphere(key, 4, 3)
    dts = 2.0 ** -np.arange(3, 8)
    slope = _strong_errors(x0, kind(1.0), normalization, dts, jr.split(jr.key(6), 64))
    assert abs(slope - order) < 0.15, slope


@pytest.mark.slow
def test_same_key_same_path_other_key_other_path(key):
    x0 = _on_sphere(key, 5, 3)

    def run(k, **kw):
        return mf.simulate(
            mf.Particles(x0), _attention(3), 1.0, normalization="sphere",
            noise=mf.IndependentNoise(0.5), key=k, **kw,
        )  # fmt: skip

    first, again = run(jr.key(7)), run(jr.key(7))
    np.testing.assert_array_equal(first.x, again.x)
    assert int(first.num_steps) == int(again.num_steps)
    other = run(jr.key(8))
    assert np.max(np.abs(other.x[-1] - first.x[-1])) > 1e-2
    # A raw key (jax.random.PRNGKey) is a key too.
    raw = run(jr.PRNGKey(7))
    np.testing.assert_array_equal(raw.x, run(jr.PRNGKey(7)).x)
    # sigma = 0 is the ODE (to the adaptive steps' tolerance, 1e-3).
    ode = mf.simulate(mf.Particles(x0), _attention(3), 1.0, normalization="sphere")
    quiet = mf.simulate(
        mf.Particles(x0), _attention(3), 1.0, normalization="sphere",
        noise=mf.IndependentNoise(0.0), key=jr.key(7),
    )  # fmt: skip
    np.testing.assert_allclose(quiet.x[-1], ode.x[-1], atol=1e-2)


@pytest.mark.parametrize(
    "mode", ["forward", pytest.param("reverse", marks=pytest.mark.slow)]
)
def test_pathwise_gradient_matches_finite_differences(key, mode):
    # Fixed key and fixed steps: x(t1) is a smooth function of sigma and V, and
    # JAX differentiates the discrete solve: forward mode (diffrax.ForwardMode,
    # cheaper to compile) or reverse mode (the default adjoint, jax.grad). Central
    # differences with eps = 1e-5: truncation ~ eps^2 ~ 1e-10, rounding ~ 1e-16 /
    # eps ~ 1e-11 (agreement to 1e-10 relative observed).
    x0 = _on_sphere(key, 5, 2)
    A = np.array([[1.0, 0.3], [0.2, 0.8]])
    direction = np.array([[0.3, -1.0], [0.5, 0.2]])
    adjoint = dfx.ForwardMode() if mode == "forward" else None

    def loss(c):  # c = (step along `direction` in V, step in sigma)
        sol = mf.simulate(
            mf.Particles(x0), mf.SoftmaxAttention(jnp.eye(2) + c[0] * direction, A=A),
            1.0, normalization="sphere", noise=mf.CommonNoise(0.7 + c[1]),
            key=jr.key(9), dt0=1 / 32, adjoint=adjoint,
        )  # fmt: skip
        return jnp.sum(sol.x[-1] @ jnp.array([1.0, 2.0]))

    derivative = jax.jacfwd if mode == "forward" else jax.grad
    got = derivative(loss)(jnp.zeros(2))
    eps = 1e-5
    for i, step in enumerate(eps * np.eye(2)):
        fd = (loss(step) - loss(-step)) / (2 * eps)
        np.testing.assert_allclose(got[i], fd, rtol=1e-7, atol=1e-9)


def test_ensemble_members_are_their_own_simulate(key):
    # Member b runs on jax.random.split(key, B)[b], whatever the chunks (B = 5 in
    # chunks of 2: the last one padded). Fixed steps: the same arithmetic up to
    # batching (1e-13 observed). A batched sigma gives each member its own level.
    B, d = 5, 2
    xs = np.broadcast_to(_on_sphere(key, 4, d), (B, 4, d))  # equal starts
    sigmas = np.linspace(0.2, 1.0, B)
    attn, k = _attention(d), jr.key(10)
    ens = mf.simulate_ensemble(
        jax.vmap(mf.Particles)(xs), attn, 1.0, normalization="sphere",
        noise=jax.vmap(mf.CommonNoise)(sigmas), key=k, dt0=1 / 16, chunk_size=2,
    )  # fmt: skip
    for b, kb in enumerate(jr.split(k, B)):
        one = mf.simulate(
            mf.Particles(xs[b]), attn, 1.0, normalization="sphere",
            noise=mf.CommonNoise(sigmas[b]), key=kb, dt0=1 / 16,
        )  # fmt: skip
        np.testing.assert_allclose(ens.x[b], one.x, rtol=1e-11, atol=1e-11)
    # Equal starts, independent paths: the members end apart.
    gaps = np.abs(np.diff(np.asarray(ens.x[:, -1]), axis=0))
    assert np.all(gaps.max(axis=(1, 2)) > 1e-2)


def test_noisy_blowup_is_detected_where_finer_solves_put_it(key):
    # Unnormalised attention blows up in finite time (t = 2.614 without noise);
    # noise of 0.01 moves the time by a few percent, path by path. The adaptive
    # solve (rtol 1e-5) and a fixed-step one (dt = 1e-3) on the same path agree
    # within a few steps (8e-4 observed on another path, both converging to one
    # time as rtol, dt -> 0).
    x0 = 0.1 * np.asarray(jr.normal(key, (16, 3)))
    attn = mf.UnnormalizedAttention(np.eye(3), A=np.eye(3))
    common = dict(noise=mf.IndependentNoise(0.01), key=jr.key(11))
    fine = mf.simulate(mf.Particles(x0), attn, 5.0, rtol=1e-5, atol=1e-5, **common)
    fixed = mf.simulate(mf.Particles(x0), attn, 5.0, dt0=1e-3, **common)
    for sol in (fine, fixed):
        assert sol.status == "blowup"
        assert float(sol.blowup_time) == float(sol.t_final) == float(sol.ts[-1])
    assert abs(float(fine.blowup_time) - float(fixed.blowup_time)) < 4e-3
    # A radius is crossed earlier, and the crossing is located on the last step
    # (the event's bisection on the step's interpolant): |x| = R at the stop.
    radius = mf.simulate(mf.Particles(x0), attn, 5.0, blowup_radius=1.0, **common)
    assert radius.status == "blowup"
    assert float(radius.blowup_time) < float(fine.blowup_time)
    top = np.max(np.linalg.norm(radius.x[-1], axis=-1))
    np.testing.assert_allclose(top, 1.0, rtol=1e-9)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(noise=mf.IndependentNoise(0.1)), "needs a random key"),
        (dict(key=jr.key(0)), "`key` draws the Brownian path"),
        (dict(noise=0.1, key=jr.key(0)), "`noise` must be"),
        (dict(noise=mf.IndependentNoise(0.1), key=0), "`key` must be a JAX PRNG"),
        (
            dict(noise=mf.IndependentNoise(0.1), key=np.zeros(3)),
            "`key` must be a JAX PRNG",
        ),
        (
            dict(noise=mf.IndependentNoise(0.1), key=jr.split(jr.key(0), 2)),
            "`key` must be a JAX PRNG",
        ),
        (
            dict(noise=mf.CommonNoise(0.1), key=jr.key(0), normalization="pre-ln"),
            "normalization None",
        ),
        (dict(noise=mf.IndependentNoise(0.1), key=jr.key(0), solver="tsit5"), "SDE"),
        (
            dict(noise=mf.IndependentNoise(0.1), key=jr.key(0), solver=dfx.Dopri5()),
            "SDE solver",
        ),
        (
            dict(noise=mf.IndependentNoise(0.1), key=jr.key(0), solver="euler"),
            "pass `dt0`",
        ),
        (
            dict(noise=jax.vmap(mf.IndependentNoise)(jnp.ones(2)), key=jr.key(0)),
            r"`noise.sigma` must be a scalar",
        ),
    ],
)
def test_simulate_rejects_bad_noise_arguments(kwargs, match):
    mu = mf.Particles(np.ones((3, 2)))
    with pytest.raises(ValueError, match=match):
        mf.simulate(mu, _attention(2), 1.0, **kwargs)


@pytest.mark.parametrize(
    "sigma, match",
    [
        (-0.1, "finite number >= 0"),
        (np.nan, "finite number >= 0"),
        (np.inf, "finite number >= 0"),
        (np.ones(2), "finite number >= 0"),
        (1j, "real number"),
        (True, "real number"),
        ("0.1", "`sigma` must be a real number; got '0.1'"),
        (None, "`sigma` must be a real number; got None"),
    ],
)
@pytest.mark.parametrize("kind", [mf.IndependentNoise, mf.CommonNoise])
def test_noise_rejects_bad_sigma(kind, sigma, match):
    with pytest.raises(ValueError, match=match):
        kind(sigma)


@pytest.mark.parametrize("bad", [-0.2, np.nan, np.inf])
def test_ensemble_rejects_a_bad_member_sigma(bad):
    # A vmapped constructor traces sigma and cannot check it: the ensemble
    # checks its (B,) noise levels on the host, naming the systems.
    batch = jax.vmap(mf.Particles)(np.ones((3, 2, 2)))
    noise = jax.vmap(mf.IndependentNoise)(jnp.array([0.1, bad, 0.3]))
    match = r"`noise.sigma` must be finite and >= 0; systems \[1\] have"
    with pytest.raises(ValueError, match=match):
        mf.simulate_ensemble(
            batch, _attention(2), 1.0, noise=noise, key=jr.key(0), dt0=0.5
        )


def test_a_traced_bad_sigma_marks_the_solve_invalid_input():
    # Under jax.jit sigma cannot raise: `mark_invalid_start` (which `simulate`
    # applies to its solve) reports the check as status "invalid_input".
    from meanfield._simulate_inputs import mark_invalid_start

    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    sol = mf.simulate(
        mf.Particles(x), _attention(2), 0.5, noise=mf.IndependentNoise(0.1),
        key=jr.key(0), dt0=0.25,
    )  # fmt: skip

    @jax.jit
    def mark(sol, sigma):
        return mark_invalid_start(sol, x, None, 1e8, mf.IndependentNoise(sigma))

    for sigma in (np.nan, -0.1, np.inf):
        marked = mark(sol, sigma)
        assert marked.status == "invalid_input" and marked.blowup_time == np.inf
    assert mark(sol, 0.1).status == sol.status == "success"
    # Concrete inputs, checked on the host already, are left alone.
    assert mark_invalid_start(sol, x, None, 1e8, mf.IndependentNoise(0.1)) is sol


def test_layers_and_ensemble_reject_bad_noise_arguments():
    mu = mf.Particles(np.ones((3, 2)))
    with pytest.raises(ValueError, match="needs a random key"):
        mf.layers(mu, _attention(2), 4, noise=mf.CommonNoise(0.1))
    with pytest.raises(ValueError, match="normalization None"):
        mf.layers(
            mu, _attention(2), 4, noise=mf.CommonNoise(0.1), key=jr.key(0),
            normalization="ngpt",
        )  # fmt: skip
    batch = jax.vmap(mf.Particles)(np.ones((3, 2, 2)))
    with pytest.raises(ValueError, match=r"scalar or shape \(3,\)"):
        mf.simulate_ensemble(
            batch, _attention(2), 1.0, noise=jax.vmap(mf.CommonNoise)(jnp.ones(2)),
            key=jr.key(0),
        )  # fmt: skip
    with pytest.raises(ValueError, match="`key` draws the Brownian path"):
        mf.simulate_ensemble(batch, _attention(2), 1.0, key=jr.key(0))


@pytest.mark.slow
def test_sigma_is_a_traced_and_vmapped_parameter(key):
    # One compiled solve for every sigma: sigma is an array leaf, vmapped here.
    x0 = _on_sphere(key, 3, 2)
    sigmas = jnp.array([0.0, 0.5])

    def final(sigma):
        return mf.simulate(
            mf.Particles(x0), _attention(2), 1.0, normalization="sphere",
            noise=mf.IndependentNoise(sigma), key=jr.key(12), dt0=1 / 16,
        ).x[-1]  # fmt: skip

    both = jax.vmap(final)(sigmas)
    np.testing.assert_allclose(both[1], final(0.5), rtol=1e-12, atol=1e-12)
    assert np.max(np.abs(both[0] - both[1])) > 1e-2


@pytest.mark.parametrize("noise", [mf.IndependentNoise(1.5), mf.CommonNoise(1.5)])
def test_ito_steps_on_the_sphere_keep_the_radius(noise):
    # Euler-Maruyama along the tangent noise grows |x|^2 like e^{t tr}: without
    # the radial correction the radius passes 1e8 by t ~ 2.3 (independent) or
    # 19 (common) here, and the run ended as a false "blowup".
    d = 8
    x = np.random.default_rng(0).standard_normal((2, d))
    attn = mf.SoftmaxAttention(np.eye(d), A=np.eye(d))
    sol = mf.simulate(
        mf.Particles(x / np.linalg.norm(x, axis=1, keepdims=True)),
        attn,
        40.0,
        normalization="sphere",
        noise=noise,
        key=jax.random.key(3),
        solver="euler",
        dt0=0.02,
    )
    assert sol.status == "success" and float(sol.t_final) == 40.0
    np.testing.assert_allclose(np.linalg.norm(sol.x, axis=-1), 1.0, atol=1e-14)


def test_ito_solvers_other_than_euler_are_refused_on_the_sphere():
    class OtherIto(dfx.Euler):  # an Ito solver that is not Euler-Maruyama itself
        pass

    x = np.eye(3)[:2]
    with pytest.raises(ValueError, match="Ito solver OtherIto"):
        mf.simulate(
            mf.Particles(x), _attention(3), 1.0, normalization="sphere",
            noise=mf.IndependentNoise(0.1), key=jr.key(0),
            solver=OtherIto(), dt0=0.1,
        )  # fmt: skip


@pytest.mark.parametrize(
    "noise, normalization",
    [
        # The additive case solves to convergence: three compiled solves.
        pytest.param(mf.IndependentNoise(0.1), None, marks=pytest.mark.slow),
        (mf.IndependentNoise(0.1), "sphere"),
        (mf.CommonNoise(0.1), None),
    ],
)
def test_milstein_solvers_need_additive_noise(noise, normalization):
    # The Milstein schemes assume commutative noise: only independent noise in
    # R^d (additive) is; diffrax's ItoMilstein cannot take the diffusion at all.
    x = np.eye(3)[:2]
    opts = dict(noise=noise, key=jr.key(0), dt0=0.1, normalization=normalization)
    with pytest.raises(ValueError, match="`solver` diffrax.ItoMilstein"):
        mf.simulate(
            mf.Particles(x), _attention(3), 1.0, solver=dfx.ItoMilstein(), **opts
        )
    milstein = dfx.StratonovichMilstein()
    additive = isinstance(noise, mf.IndependentNoise) and normalization is None
    if additive:
        # For additive noise Milstein's correction vanishes: it is
        # Euler-Maruyama, of strong order 1 on the path of a fine Heun solve.
        opts.pop("dt0")
        mu, attn = mf.Particles(x), _attention(3)
        ref = mf.simulate(mu, attn, 1.0, solver="heun", dt0=2**-8, **opts).x[-1]
        errors = []
        for dt in (0.05, 0.025):
            sol = mf.simulate(mu, attn, 1.0, solver=milstein, dt0=dt, **opts)
            euler = mf.simulate(mu, attn, 1.0, solver="euler", dt0=dt, **opts)
            assert sol.status == "success"
            np.testing.assert_allclose(sol.x, euler.x, rtol=1e-12, atol=1e-12)
            errors.append(np.abs(sol.x[-1] - ref).max())
        assert 1.6 < errors[0] / errors[1] < 2.4  # halving dt halves the error
    else:
        with pytest.raises(ValueError, match="assumes commutative noise"):
            mf.simulate(mf.Particles(x), _attention(3), 1.0, solver=milstein, **opts)


def test_a_bad_sigma_under_jit_is_invalid_input():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    run = jax.jit(lambda s: mf.simulate(
        mf.Particles(x), _attention(2), 1.0, noise=mf.IndependentNoise(s),
        key=jr.key(0), dt0=0.25).result)  # fmt: skip
    for sigma in (np.nan, -0.1, np.inf):
        assert run(sigma) == mf.Status.INVALID_INPUT
    assert run(0.1) == mf.Status.SUCCESS


def test_noisy_layers_mark_a_bad_traced_sigma_invalid_input():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    run = jax.jit(lambda s: mf.layers(
        mf.Particles(x), _attention(2), 4, noise=mf.IndependentNoise(s),
        key=jr.key(0)).result)  # fmt: skip
    for sigma in (np.nan, -0.1, np.inf):
        assert run(sigma) == mf.Status.INVALID_INPUT
    assert run(0.1) == mf.Status.SUCCESS
