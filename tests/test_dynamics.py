import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import meanfield as mf


def _tokens(key, n=16, d=3, scale=1.0):
    return scale * np.asarray(jr.normal(key, (n, d)))


def _identity_softmax(d):
    return mf.SoftmaxAttention(np.eye(d), A=np.eye(d))


def test_simulate_saves_requested_times(key):
    x = _tokens(key)
    ts = np.linspace(0, 1, 5)
    sol = mf.simulate(mf.Particles(x), _identity_softmax(3), 1.0, saveat=ts)
    assert sol.status == "success"
    np.testing.assert_allclose(sol.ts, ts)
    assert sol.x.shape == (5, 16, 3)
    np.testing.assert_array_equal(sol.x[0], x)
    assert np.isinf(float(sol.blowup_time))


@pytest.mark.parametrize(
    "solver, kwargs, tol",
    [
        ("tsit5", {}, 1e-5),
        pytest.param("dopri5", {}, 1e-5, marks=pytest.mark.slow),
        pytest.param("dopri8", {}, 1e-5, marks=pytest.mark.slow),
        ("heun", {"dt0": 1e-3}, 1e-4),  # second order: O(dt^2) ~ 1e-6 x constants
        ("euler", {"dt0": 1e-3}, 1e-2),  # first order: O(dt) ~ 1e-3 x constants
    ],
)
def test_simulate_matches_tight_reference_for_each_solver(key, solver, kwargs, tol):
    # One compile per solver: the other Runge-Kutta tableaus run under -m slow.
    x = _tokens(key, n=8, d=2)
    attn = mf.SoftmaxAttention(np.array([[1.0, 0.5], [0.0, 1.0]]), A=np.eye(2))
    ref = mf.simulate(mf.Particles(x), attn, 1.0, rtol=1e-12, atol=1e-12).x[-1]
    sol = mf.simulate(mf.Particles(x), attn, 1.0, solver=solver, **kwargs)
    assert sol.status == "success", solver
    err = np.max(np.abs(sol.x[-1] - ref)) / np.max(np.abs(ref))
    assert err < tol, (solver, err)


def test_layers_converge_to_simulate_at_first_order(key):
    x = _tokens(key, n=10, d=2)
    attn = mf.SoftmaxAttention(np.array([[0.5, 1.0], [-1.0, 0.5]]), A=np.eye(2))
    ref = mf.simulate(mf.Particles(x), attn, 1.0, rtol=1e-12, atol=1e-12).x[-1]
    Ls = np.array([8, 16, 32, 64, 128])
    errs = [
        np.max(np.abs(mf.layers(mf.Particles(x), attn, int(L)).x[-1] - ref)) for L in Ls
    ]
    slope = np.polyfit(np.log(Ls), np.log(errs), 1)[0]
    # Explicit Euler: error = C h + O(h^2), so the fitted slope is -1 up to O(h).
    assert abs(slope + 1) < 0.1, (slope, errs)


def test_layers_returns_L_plus_one_states(key):
    x = _tokens(key)
    sol = mf.layers(mf.Particles(x), _identity_softmax(3), 5, t1=2.0)
    assert sol.x.shape == (6, 16, 3) and sol.status == "success"
    np.testing.assert_allclose(sol.ts, np.arange(6) * 0.4)


def test_layers_use_one_parameter_per_layer(key):
    x = _tokens(key, n=6, d=2)
    V = np.stack([np.eye(2), -np.eye(2), 2 * np.eye(2)])
    attn = mf.SoftmaxAttention(mf.PiecewiseConstant(V, t1=3.0), A=np.eye(2))
    sol = mf.layers(mf.Particles(x), attn, 3, t1=3.0)
    state = x
    for layer in range(3):
        vel = mf.SoftmaxAttention(V[layer], A=np.eye(2)).velocity(mf.Particles(state))
        state = state + 1.0 * np.asarray(vel)
        np.testing.assert_allclose(sol.x[layer + 1], state, rtol=1e-12, atol=1e-12)


def test_sphere_normalisation_keeps_unit_norm(key):
    x = _tokens(key, n=32, d=3)
    x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    ts = np.linspace(0, 10, 21)
    sol = mf.simulate(
        mf.Particles(x), _identity_softmax(3), 10.0, saveat=ts, normalization="sphere"
    )
    assert sol.status == "success"
    assert np.max(np.abs(np.linalg.norm(sol.x, axis=-1) - 1)) < 1e-6
    # The projected dynamics are right, not just normalised: compare with a tight solve.
    ref = mf.simulate(
        mf.Particles(x),
        _identity_softmax(3),
        10.0,
        saveat=ts,
        normalization="sphere",
        rtol=1e-11,
        atol=1e-11,
    )
    assert np.max(np.abs(sol.x - ref.x)) < 1e-4
    # Geshkovski et al.: with Q = K = V = I tokens on the sphere cluster.
    final = np.asarray(sol.x[-1])
    assert np.max(np.linalg.norm(final[:, None] - final[None], axis=-1)) < 0.1


def test_sphere_layers_keep_unit_norm(key):
    x = _tokens(key, n=16, d=3)
    sol = mf.layers(
        mf.Particles(x), _identity_softmax(3), 50, t1=5.0, normalization="sphere"
    )
    np.testing.assert_allclose(np.linalg.norm(sol.x, axis=-1), 1, atol=1e-12)


def test_unnormalized_attention_blows_up_and_reports_it(key):
    x = _tokens(key, n=16, d=3, scale=0.1)
    ts = np.linspace(0, 5, 6)
    attn = mf.UnnormalizedAttention(np.eye(3), A=np.eye(3))
    sol = mf.simulate(mf.Particles(x), attn, 5.0, saveat=ts)
    assert sol.status == "blowup"
    t_star = float(sol.blowup_time)
    assert 0 < t_star < 5
    reached = np.asarray(sol.reached)
    assert np.all(np.isfinite(np.asarray(sol.x)[reached]))
    assert not np.any(np.isnan(np.asarray(sol.x)))
    np.testing.assert_array_equal(np.asarray(sol.ts)[~reached], np.inf)
    # The same blow-up in float32 is reported at the same time (to float32 accuracy).
    sol32 = mf.simulate(
        mf.Particles(x.astype(np.float32)),
        mf.UnnormalizedAttention(
            np.eye(3, dtype=np.float32), A=np.eye(3, dtype=np.float32)
        ),
        5.0,
    )
    assert sol32.status == "blowup"
    assert abs(float(sol32.blowup_time) - t_star) < 1e-4 * t_star


def test_blowup_radius_crossing_is_located(key):
    # x' = x for V = I: |x(t)| = |x0| e^t exactly, so radius R is hit at log(R/|x0|).
    x = np.array([[1.0, 0.0]])
    sol = mf.simulate(
        mf.Particles(x),
        _identity_softmax(2),
        10.0,
        blowup_radius=100.0,
        rtol=1e-10,
        atol=1e-10,
    )
    assert sol.status == "blowup"
    np.testing.assert_allclose(float(sol.blowup_time), np.log(100.0), rtol=1e-6)


def test_softmax_with_bounded_V_does_not_blow_up(key):
    x = _tokens(key, n=16, d=3)
    sol = mf.simulate(mf.Particles(x), _identity_softmax(3), 10.0)
    assert sol.status == "success"
    # Well-posedness: the support radius grows at most like e^{t |V|}.
    r0 = np.max(np.linalg.norm(x, axis=-1))
    assert np.max(np.linalg.norm(sol.x[-1], axis=-1)) <= r0 * np.exp(10.0) * (1 + 1e-6)


def test_max_steps_is_a_status_not_an_exception(key):
    x = _tokens(key)
    sol = mf.simulate(mf.Particles(x), _identity_softmax(3), 10.0, max_steps=3)
    assert sol.status == "max_steps"


def test_sinkhorn_non_convergence_is_reported_by_simulate(key):
    x = _tokens(key, n=12, d=2)
    attn = mf.SinkhornAttention(np.eye(2), A=3 * np.eye(2), max_iter=2, tol=1e-14)
    sol = mf.simulate(mf.Particles(x), attn, 0.5)
    assert sol.status == "sinkhorn_not_converged"
    sol = mf.layers(mf.Particles(x), attn, 4, t1=0.5)
    assert sol.status == "sinkhorn_not_converged"


def _count_compiles(fn):
    """(fn(), number of XLA compilations it triggered)."""
    events = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            events.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        out = jax.block_until_ready(fn())
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return out, len(events)


def test_traced_save_times_give_the_same_solve(key):
    # Concrete save times become static fractions of the solver clock; traced ones
    # (a caller's jit) go through diffrax's runtime checks. Same solve either way.
    mu, attn = mf.Particles(_tokens(key, n=6, d=2)), _identity_softmax(2)
    ts = np.linspace(0.0, 2.0, 5)
    eager = mf.simulate(mu, attn, 2.0, saveat=ts)
    traced = eqx.filter_jit(lambda s: mf.simulate(mu, attn, 2.0, saveat=s))(
        jnp.asarray(ts)
    )
    np.testing.assert_array_equal(traced.ts, eager.ts)
    np.testing.assert_allclose(traced.x, eager.x, rtol=1e-12, atol=1e-12)
    assert traced.status == eager.status == "success"


def test_layers_compile_once_per_structure(key):
    # mf.layers used to retrace and recompile its scan on every call (a fresh
    # closure each time); depth and radius are traced now.
    mu, attn = mf.Particles(_tokens(key, n=5, d=2)), _identity_softmax(2)
    first, n_first = _count_compiles(lambda: mf.layers(mu, attn, 4).x)
    again, n_again = _count_compiles(lambda: mf.layers(mu, attn, 4).x)
    other, n_other = _count_compiles(
        lambda: mf.layers(mu, attn, 4, t1=2.0, blowup_radius=1e3).x
    )
    assert n_first > 0 and n_again == 0 and n_other == 0, (n_first, n_again, n_other)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_tolerances_and_radius_do_not_recompile(key):
    # One compiled solve per structure: a study over rtol, atol or blowup_radius
    # (or a tight reference next to a default run) reuses it.
    mu, attn = mf.Particles(_tokens(key, n=5, d=2)), _identity_softmax(2)
    first, n_first = _count_compiles(lambda: mf.simulate(mu, attn, 1.0).x)
    tight, n_tight = _count_compiles(
        lambda: mf.simulate(mu, attn, 1.0, rtol=1e-11, atol=1e-11, blowup_radius=1e3).x
    )
    assert n_first > 0 and n_tight == 0, (n_first, n_tight)
    # The tolerances reached the solver: the default run is 1e-6 accurate only.
    assert 1e-12 < np.max(np.abs(first - tight)) < 1e-5


def test_simulate_under_jit_and_vmap(key):
    x = _tokens(key, n=8, d=2)
    run = jax.jit(lambda mu, attn: mf.simulate(mu, attn, 1.0).x[-1])
    attn = _identity_softmax(2)
    direct = mf.simulate(mf.Particles(x), attn, 1.0).x[-1]
    np.testing.assert_allclose(run(mf.Particles(x), attn), direct, rtol=1e-12)
    scales = jnp.array([0.5, 1.0, 2.0])
    batched = jax.vmap(
        lambda c: mf.simulate(
            mf.Particles(x), mf.SoftmaxAttention(c * jnp.eye(2), A=jnp.eye(2)), 1.0
        ).x[-1]
    )(scales)
    for i, c in enumerate(scales):
        single = mf.simulate(
            mf.Particles(x), mf.SoftmaxAttention(c * jnp.eye(2), A=jnp.eye(2)), 1.0
        ).x[-1]
        # Batched adaptive steps share one step-size sequence: agree to tolerance.
        np.testing.assert_allclose(batched[i], single, rtol=1e-5, atol=1e-5)


def test_grad_of_simulate_matches_finite_differences(key):
    x = _tokens(key, n=6, d=2)
    A = np.array([[1.0, 0.3], [0.2, 0.8]])
    direction = np.array([[0.3, -1.0], [0.5, 0.2]])

    def loss(V):
        sol = mf.simulate(
            mf.Particles(x), mf.SoftmaxAttention(V, A=A), 1.0, rtol=1e-10, atol=1e-10
        )
        return jnp.sum(sol.x[-1] ** 2)

    V0 = jnp.eye(2)
    g = jax.grad(loss)(V0)
    eps = 1e-5
    fd = (loss(V0 + eps * direction) - loss(V0 - eps * direction)) / (2 * eps)
    # Discretise-then-optimise gradient vs central differences of a 1e-10 solve.
    np.testing.assert_allclose(np.sum(g * direction), fd, rtol=1e-5)


def test_forward_mode_through_simulate_matches_reverse_mode_and_differences(key):
    x = _tokens(key, n=6, d=2)

    def final(c, **kw):
        attn = mf.SoftmaxAttention(c * jnp.eye(2), A=jnp.eye(2))
        return mf.simulate(mf.Particles(x), attn, 1.0, rtol=1e-10, atol=1e-10, **kw).x[
            -1
        ]

    _, tangent = jax.jvp(lambda c: final(c, adjoint=dfx.ForwardMode()), (1.0,), (1.0,))
    reverse = jax.jacrev(final)(1.0)
    # Both differentiate the same discrete solve (same accepted steps): they differ
    # by rounding only (6e-15 observed).
    np.testing.assert_allclose(tangent, reverse, rtol=1e-12, atol=1e-12)
    eps = 1e-5
    central = (final(1.0 + eps) - final(1.0 - eps)) / (2 * eps)
    # Truncation ~ eps^2 (third derivative) ~ 1e-10; the 1e-10 solve error varies
    # smoothly with c and mostly cancels (1e-9 observed, |tangent| ~ 3).
    np.testing.assert_allclose(tangent, central, rtol=1e-6, atol=1e-7)


def test_progress_bar_prints_to_the_end(key, capsys):
    x = _tokens(key, n=4, d=2)
    sol = mf.simulate(mf.Particles(x), _identity_softmax(2), 1.0, progress=True)
    assert sol.status == "success"
    err = capsys.readouterr().err
    assert "0.00%" in err and "100.00%" in err
    mf.simulate(mf.Particles(x), _identity_softmax(2), 1.0, progress=False)
    assert "%" not in capsys.readouterr().err


def test_progress_meter_shows_percent_and_times_but_no_rate(capsys):
    from meanfield._progress import progress_meter

    # diffrax's own tqdm bar counts percent (unit "%") and prints "12.3%/s".
    decay = dfx.ODETerm(lambda t, y, args: -y)
    meter = progress_meter(True)
    sol = dfx.diffeqsolve(
        decay, dfx.Tsit5(), 0.0, 1.0, 0.01, jnp.ones(2), progress_meter=meter
    )
    assert sol.result == dfx.RESULTS.successful
    err = capsys.readouterr().err
    assert "0.00%" in err and "100.00%" in err and "<" in err  # elapsed<remaining
    assert "/s" not in err
    assert isinstance(progress_meter(False), dfx.NoProgressMeter)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(solver="rk4"), r"`solver` must be one of"),
        (dict(solver="euler"), r"pass `dt0`"),
        (dict(normalization="layer"), r"`normalization` must be one of"),
        (dict(t0=2.0), r"`t1` must be greater than `t0`"),
        (
            dict(saveat=np.array([0.0, 2.0])),
            r"`saveat` must be non-decreasing times within",
        ),
        (dict(blowup_radius=-1.0), r"`blowup_radius` must be positive"),
        (dict(dt0=-0.1), r"`dt0` must be positive"),
    ],
)
def test_simulate_rejects_bad_arguments(kwargs, match):
    mu = mf.Particles(np.zeros((2, 2)))
    with pytest.raises(ValueError, match=match):
        mf.simulate(mu, _identity_softmax(2), 1.0, **kwargs)


def test_simulate_rejects_gaussians_and_non_attention():
    with pytest.raises(ValueError, match=r"mf.gaussian.simulate"):
        mf.simulate(mf.Gaussian(np.zeros(2), np.eye(2)), _identity_softmax(2), 1.0)
    with pytest.raises(ValueError, match=r"`attn` must be an attention module"):
        mf.simulate(mf.Particles(np.zeros((2, 2))), np.eye(2), 1.0)
    with pytest.raises(ValueError, match=r"`L` must be an integer >= 1"):
        mf.layers(mf.Particles(np.zeros((2, 2))), _identity_softmax(2), 0)


def test_super_exponential_blowup_is_reported_in_float32(key):
    # e^{|x|^2} growth: the velocity changes much faster than |x|, so float32 runs
    # out of time resolution (dt < 100 ulps of t) before |x| gets large.
    x = 0.3 * np.asarray(jr.normal(key, (16, 3)))
    eye = np.eye(3)
    t64 = mf.simulate(mf.Particles(x), mf.UnnormalizedAttention(eye, A=eye), 20.0)
    x32, eye32 = x.astype(np.float32), eye.astype(np.float32)
    t32 = mf.simulate(mf.Particles(x32), mf.UnnormalizedAttention(eye32, A=eye32), 20.0)
    assert t64.status == "blowup" and t32.status == "blowup"
    assert int(t32.num_steps) < 1000  # stopped, not stalled until max_steps
    # float32 stops once dt < 100 ulps of t, a little before the singularity.
    assert abs(float(t32.blowup_time) - float(t64.blowup_time)) < 2e-3 * float(
        t64.blowup_time
    )


def test_blowup_rule_does_not_depend_on_the_horizon(key):
    # The e-folding and step-floor rules read t and t0 only: a horizon of 1e300
    # once flagged a blow-up at t = 2e-308 (1e-10 x horizon as the e-folding floor).
    x = 0.3 * np.asarray(jr.normal(key, (8, 2)))
    eye = np.eye(2)
    blowing = mf.UnnormalizedAttention(eye, A=eye)
    # The solver clock's length follows the horizon (a power of two near it), so
    # the step sequences differ: at default tolerances both times are within the
    # solve's accuracy (5e-6 here) of a tight one, and tight solves agree to 1e-9.
    tight = dict(rtol=1e-10, atol=1e-10)
    near, far = (
        mf.simulate(mf.Particles(x), blowing, t1, **tight) for t1 in (20.0, 1e300)
    )
    assert near.status == far.status == "blowup"
    want = float(near.blowup_time)
    assert float(far.blowup_time) == pytest.approx(want, rel=1e-9)
    for t1 in (20.0, 1e300):
        sol = mf.simulate(mf.Particles(x), blowing, t1)
        assert sol.status == "blowup"
        assert float(sol.blowup_time) == pytest.approx(want, rel=2e-5)
    # A still field reaches any finite horizon in a few hundred growing steps.
    still = mf.SoftmaxAttention(np.zeros((2, 2)), A=eye)
    sol = mf.simulate(mf.Particles(x), still, 1e300, saveat=[0.0, 1e300])
    assert sol.status == "success" and float(sol.t_final) == 1e300
    np.testing.assert_array_equal(sol.x[-1], x)


@pytest.mark.parametrize("dtype, scale", [(np.float64, 1e200), (np.float32, 1e20)])
def test_huge_tokens_are_simulated_not_called_a_blowup(dtype, scale):
    # |x|^2 and the logits overflow; the field does not. Each token is its own
    # best match (|x_i|^2 > <x_i, x_j>), so with V = A = I: x(t) = e^t x(0).
    x = scale * np.array([[1.0, 0.2], [0.3, -1.0], [-0.5, 0.4]], dtype)
    eye = np.eye(2, dtype=dtype)
    sol = mf.simulate(
        mf.Particles(x),
        mf.SoftmaxAttention(eye, A=eye),
        1.0,
        blowup_radius=1e10 * scale,
    )
    assert sol.status == "success"
    # Default rtol = atol = 1e-6 per step; e x(0) is reached to 10x that.
    np.testing.assert_allclose(sol.x[-1], np.e * x, rtol=1e-5)
    sphere = mf.simulate(
        mf.Particles(x), mf.SoftmaxAttention(eye, A=eye), 1.0, normalization="sphere"
    )
    x_unit = x / np.linalg.norm(x / scale, axis=1, keepdims=True) / scale
    np.testing.assert_allclose(sphere.x[0], x_unit, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(t1=np.inf), r"`t1` must be a finite time"),
        (dict(t0=-np.inf), r"`t0` must be a finite time"),
        (dict(t1=np.nan), r"`t1` must be a finite time"),
        (dict(rtol=-1e-6), r"`rtol` must be >= 0"),
        (dict(atol=-1e-6), r"`atol` must be >= 0"),
        (dict(rtol=0.0, atol=0.0), r"`rtol` and `atol` must not both be 0"),
        # The initial radius is 5: only an upward crossing would be seen.
        (dict(blowup_radius=2.0), r"`blowup_radius` must exceed the initial radius"),
        # Once accepted: inf accepts any step, 2.7 was truncated to 2, a string
        # failed inside diffrax, a non-finite alpha was reported as a blow-up.
        (dict(rtol=np.inf), r"`rtol` must be >= 0 and finite"),
        (dict(atol=np.nan), r"`atol` must be >= 0 and finite"),
        (dict(max_steps=2.7), r"`max_steps` must be an integer >= 1; got 2.7"),
        (dict(adjoint="forward"), r"`adjoint` must be a diffrax adjoint"),
        (
            dict(normalization="ngpt", ngpt_alpha=np.nan),
            r"`ngpt_alpha` must be a finite number",
        ),
        (
            dict(normalization="ngpt", ngpt_alpha=np.inf),
            r"`ngpt_alpha` must be a finite number",
        ),
    ],
)
def test_simulate_rejects_hostile_arguments(kwargs, match):
    mu = mf.Particles(np.array([[3.0, 4.0], [0.0, 1.0]]))
    t1 = kwargs.pop("t1", 1.0)
    with pytest.raises(ValueError, match=match):
        mf.simulate(mu, _identity_softmax(2), t1, **kwargs)


def test_zero_token_is_rejected_on_the_sphere():
    mu = mf.Particles(np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]]))
    with pytest.raises(ValueError, match=r"no zero token.*rows \[1\]"):
        mf.simulate(mu, _identity_softmax(2), 1.0, normalization="sphere")
    with pytest.raises(ValueError, match=r"no zero token"):
        mf.layers(mu, _identity_softmax(2), 3, normalization="sphere")
    with pytest.raises(ValueError, match=r"`t1` must be a finite time"):
        mf.layers(mu, _identity_softmax(2), 3, t1=np.inf)


def test_solution_measure_index_out_of_range(key):
    sol = mf.layers(mf.Particles(_tokens(key, n=3, d=2)), _identity_softmax(2), 4)
    np.testing.assert_array_equal(sol.measure(-1).x, sol.x[-1])
    for i in (5, -6, 100):
        with pytest.raises(IndexError, match=r"`i` must be in \[-5, 5\)"):
            sol.measure(i)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_tokens_are_rejected(key, dtype):
    # 100 ulps of t = 1 are 0.1 (float16) or 0.8 (bfloat16): every solve once
    # ended at the step floor as a "blowup" at t = 0 to 0.01 or 2.5e-31.
    x = _tokens(key).astype(dtype)
    with pytest.raises(ValueError, match=r"`measure` must hold tokens of dtype"):
        mf.simulate(mf.Particles(x), _identity_softmax(3), 1.0)


def test_step_floor_without_growth_is_failed_not_blowup(key):
    # atol = 1e-300 cannot be met by tokens of size 1: the step falls to the
    # floor at t = 0, which was reported as a blow-up; nothing grows there.
    x = _tokens(key)
    sol = mf.simulate(mf.Particles(x), _identity_softmax(3), 1.0, rtol=0.0, atol=1e-300)
    assert sol.status == "failed"
    assert float(sol.blowup_time) == np.inf and float(sol.t_final) == 0.0
    # Tokens of that size can meet it: the tolerance itself is not rejected.
    tiny = mf.simulate(
        mf.Particles(1e-295 * x), _identity_softmax(3), 1.0, rtol=0.0, atol=1e-300
    )
    assert tiny.status == "success"


def test_rows_after_an_early_stop_carry_the_time_they_were_computed_at():
    # saveat=None once labelled the state at the blow-up t* = 3.8 with t1 = 5,
    # and clustering.rescale then scaled it by e^{-5} instead of e^{-t*}.
    x = 0.1 * np.asarray(jr.normal(jr.key(0), (256, 3)))
    eye = np.eye(3)
    sol = mf.simulate(mf.Particles(x), mf.UnnormalizedAttention(eye, A=eye), 5.0)
    assert sol.status == "blowup"
    t_stop = float(sol.t_final)
    assert float(sol.ts[-1]) == t_stop == float(sol.blowup_time) < 5.0
    z = mf.clustering.rescale(sol, eye)
    np.testing.assert_allclose(z[-1], np.exp(-t_stop) * sol.x[-1], rtol=1e-12)
    # Explicit save times after the stop are not reached: +inf, never relabelled.
    saved = mf.simulate(
        mf.Particles(x),
        mf.UnnormalizedAttention(eye, A=eye),
        5.0,
        saveat=np.linspace(0, 5, 11),
    )
    assert np.all(np.isinf(saved.ts[8:])) and np.all(np.isinf(saved.x[8:]))
    np.testing.assert_array_equal(saved.ts[:8], np.linspace(0, 5, 11)[:8])


def test_traced_tokens_that_simulate_rejects_get_a_status():
    # Under jit/vmap the host checks cannot run: a zero token under "sphere"
    # made every member "blowup", a start beyond the radius was "success".
    x = np.array(jr.normal(jr.key(1), (3, 6, 2)))
    x[1, 2] = 0.0
    attn = _identity_softmax(2)
    solve = jax.vmap(lambda m: mf.simulate(m, attn, 1.0, normalization="sphere"))
    sol = solve(jax.vmap(mf.Particles)(x))
    assert list(sol.status) == ["success", "invalid_input", "success"]
    assert np.isinf(sol.blowup_time[1])
    with pytest.raises(ValueError, match=r"rows \[2\] are zero"):
        mf.simulate(mf.Particles(x[1]), attn, 1.0, normalization="sphere")
    start = float(np.max(np.linalg.norm(x[0], axis=-1)))
    inside = jax.jit(lambda m: mf.simulate(m, attn, 1.0, blowup_radius=start / 2))
    assert inside(mf.Particles(x[0])).status == "invalid_input"
    traced_t1 = jax.jit(lambda t: mf.simulate(mf.Particles(x[0]), attn, t).x)
    with pytest.raises(ValueError, match=r"`t1` must be a concrete number"):
        traced_t1(1.0)
