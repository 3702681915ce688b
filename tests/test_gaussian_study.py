"""Batched Gaussian blow-up studies: the work-queue solver and the classification.

References: closed forms (V = I softmax, Castin, Ablin, Carrillo & Peyre, 2025; the
rank-deficient L2 example of docs/math/gaussians.md), tight single-run solves and an
independent SciPy solve of Sigma' = V Sigma A Sigma + (transpose) in t.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import meanfield as mf
from meanfield import _status
from meanfield._ode_queue import OUT_OF_STEPS, _rodas4_step, solve_ode_queue

# A d = 2 softmax run that collapses to a huge steady rank-one Sigma (lambda_max
# ~ 3e9, u^T A u = 0): a threshold test alone reported it as a blow-up at t = 0.52.
A_STEADY = np.array(
    [
        [-0.6661836615863911, -1.7811813665025202],
        [-0.4440381616706501, 0.45946946291245466],
    ]
)
V_STEADY = np.array(
    [
        [0.8882803819226119, 0.08127121787704752],
        [-0.1263797631620064, 0.7425702431472221],
    ]
)


# A d = 2 softmax run that settles at a steady rank-one Sigma (lambda_max ~ 7.8e4)
# by t = 0.24; the explicit pass spends its budget there (the rate clock crawls in
# t), the implicit pass classifies it.
A_CRAWL = np.array([[-0.3761, -1.1723], [0.0471, 1.6095]])
V_CRAWL = np.array([[1.1805, 0.2875], [-0.2047, 1.2775]])


def _softmax_batch(As, Vs):
    return jax.vmap(lambda A, V: mf.SoftmaxAttention(V, A=A))(
        jnp.asarray(As), jnp.asarray(Vs)
    )


def test_ode_queue_matches_exact_decay_and_compacts():
    # y' = -lam y on t in [0, 1]: y(1) = e^{-lam}; rates over 3 decades, so the
    # step counts differ and finished runs must leave their slots.
    n, slots = 2000, 64
    lam = jnp.asarray(np.geomspace(0.01, 30.0, n))
    y0 = jnp.stack([jnp.ones(n), jnp.zeros(n)], axis=1)
    out = jax.jit(
        lambda y0, lam: solve_ode_queue(
            lambda y, p: jnp.stack([-p * y[0], jnp.ones_like(y[0])]),
            lambda y, f, yp, fp, p, steps: jnp.where(y[1] >= 1 - 1e-12, 1, 0).astype(
                jnp.int32
            ),
            lambda y, f, p: jnp.maximum(1.0 - y[1], 0.0),
            y0,
            lam,
            slots=slots,
            rtol=1e-10,
            atol=1e-12,
            max_steps=1000,
            h0=1e-3,
            h_min=1e-14,
        )
    )(y0, lam)
    np.testing.assert_array_equal(np.asarray(out.code), 1)
    np.testing.assert_allclose(np.asarray(out.y[:, 1]), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        np.asarray(out.y[:, 0]), np.exp(-np.asarray(lam)), rtol=1e-8, atol=1e-12
    )
    np.testing.assert_allclose(np.asarray(out.dy[:, 0]), -lam * out.y[:, 0])
    steps = np.asarray(out.steps)
    assert steps.min() < steps.max() // 2
    # Compaction: the loop runs about sum(steps) / slots + max(steps) times, far
    # below the lockstep count (n / slots) * max(steps).
    assert int(out.iterations) <= steps.sum() / slots + steps.max() + 1
    assert int(out.iterations) < 0.6 * (n / slots) * steps.max()


def test_ode_queue_reports_the_step_budget():
    out = solve_ode_queue(
        lambda y, p: -p * y,
        lambda y, f, yp, fp, p, steps: jnp.int32(0),  # never stops
        lambda y, f, p: jnp.inf,
        jnp.ones((3, 1)),
        jnp.ones(3),
        slots=2,
        rtol=1e-8,
        atol=1e-8,
        max_steps=25,
        h0=1e-3,
        h_min=1e-14,
    )
    np.testing.assert_array_equal(np.asarray(out.code), OUT_OF_STEPS)
    np.testing.assert_array_equal(np.asarray(out.steps), 25)


def test_rodas_step_has_order_four_and_damps_stiff_modes():
    def local_error(field, exact, h):
        y = jnp.array([1.0])
        y_new, f_new, _ = _rodas4_step(field, y, field(y, None), None, h)
        np.testing.assert_allclose(f_new, field(y_new, None), rtol=1e-15)
        return abs(float(y_new[0]) - exact(h))

    # Local error O(h^5): halving h divides it by ~32, on a linear and on a
    # nonlinear field (y' = -y^2, y = 1 / (1 + t)).
    for field, exact in (
        (lambda y, p: 0.7 * y, lambda h: np.exp(0.7 * h)),
        (lambda y, p: -(y**2), lambda h: 1 / (1 + h)),
    ):
        ratio = local_error(field, exact, 0.1) / local_error(field, exact, 0.05)
        assert 25 < ratio < 40
    # L-stability: a mode with h lambda = -1e12 is removed, not amplified.
    assert local_error(lambda y, p: -1e12 * y, lambda h: 0.0, 1.0) < 1e-10


def test_ode_queue_rodas_steps_over_stiff_decay():
    # y' = -lam (y - cos t) - sin t: y = cos t + (y0 - 1) e^{-lam t}. An explicit
    # method needs ~lam steps; RODAS resolves a transient it can see (lam = 1e3:
    # ~log(1 / atol) / (h lam) steps) and steps over one far below atol.
    lam = jnp.array([1.0, 1e3, 1e6, 1e9, 1.0, 1.0])
    y0 = jnp.stack([jnp.full(6, 2.0), jnp.zeros(6)], axis=1)
    out = solve_ode_queue(
        lambda y, p: jnp.stack(
            [-p * (y[0] - jnp.cos(y[1])) - jnp.sin(y[1]), jnp.ones_like(y[0])]
        ),
        lambda y, f, yp, fp, p, steps: jnp.where(y[1] >= 1 - 1e-12, 1, 0).astype(
            jnp.int32
        ),
        lambda y, f, p: jnp.maximum(1.0 - y[1], 0.0),
        y0,
        lam,
        slots=2,
        rtol=1e-8,
        atol=1e-10,
        max_steps=2000,
        h0=1e-3,
        h_min=1e-14,
        method="rodas4",
        count=4,  # the last two runs are not solved
    )
    code, steps = np.asarray(out.code), np.asarray(out.steps)
    np.testing.assert_array_equal(code, [1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(steps[4:], 0)
    want = np.cos(1.0) + np.exp(-np.asarray(lam[:4]))
    np.testing.assert_allclose(np.asarray(out.y[:4, 0]), want, rtol=1e-7)
    assert steps[2:4].max() < 300  # explicit: > lam / 3.3 (its stability bound)


def test_v_identity_blowup_times_are_exact(key):
    # V = I: P = Sigma^{-1} = P0 - t (A + A^T), so t* = 1 / lambda_max(P0^{-1/2} M
    # P0^{-1/2}) for any Sigma0; the runs without one reach t_max ("success").
    d, batch, t_max = 3, 200, 3.0
    As = np.asarray(jr.normal(key, (batch, d, d))) / np.sqrt(d)
    cov0 = np.array([[1.0, 0.3, 0.0], [0.3, 0.7, 0.1], [0.0, 0.1, 0.5]])
    study = mf.gaussian.blowup_times(
        mf.Gaussian(np.zeros(d), cov0),
        _softmax_batch(As, np.broadcast_to(np.eye(d), (batch, d, d))),
        t_max,
    )
    lam, U = np.linalg.eigh(cov0)
    root = (U * np.sqrt(lam)) @ U.T
    top = np.linalg.eigvalsh(root @ (As + np.swapaxes(As, 1, 2)) @ root)[:, -1]
    want = np.where(top > 1 / t_max, 1 / np.maximum(top, 1e-300), np.inf)
    got = study.times["SoftmaxAttention"]
    status = study.status["SoftmaxAttention"]
    finite = np.isfinite(want)
    assert 0.2 < finite.mean() < 0.9
    np.testing.assert_array_equal(status[finite], _status.BLOWUP)
    np.testing.assert_array_equal(status[~finite], _status.SUCCESS)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)
    assert np.all(np.isinf(got[~finite]))
    assert study.fraction["SoftmaxAttention"] == pytest.approx(finite.mean())
    assert np.all(study.rate["SoftmaxAttention"][finite] == np.inf)


def test_general_v_blowup_times_match_a_tight_solve(key):
    # No closed form: compare with the single-run moment ODE solved at rtol 1e-12.
    d, batch = 2, 12
    ka, kv = jr.split(key)
    As = np.asarray(jr.normal(ka, (batch, d, d))) + np.eye(d)  # mostly blow-ups
    Vs = np.eye(d) + 0.3 * np.asarray(jr.normal(kv, (batch, d, d)))
    gauss = mf.Gaussian(np.zeros(d), np.eye(d))
    study = mf.gaussian.blowup_times(gauss, _softmax_batch(As, Vs), 5.0)
    got = study.times["SoftmaxAttention"]
    checked = 0
    for A, V, t_got in zip(As, Vs, got, strict=True):
        ref = mf.gaussian.simulate(
            gauss, mf.SoftmaxAttention(V, A=A), 5.0, rtol=1e-12, atol=1e-12
        )
        if ref.status == "blowup":
            checked += 1
            np.testing.assert_allclose(t_got, float(ref.blowup_time), rtol=1e-6)
        else:
            assert np.isinf(t_got)
    assert checked >= batch // 2


def test_rank_deficient_l2_blowup_time_is_the_closed_form():
    # docs/math/gaussians.md: K = [1 0], Q = [0 1], V = diag(0, 1),
    # Sigma0 = [[a, b], [b, c]]:
    # Sigma_22 ~ (t* - t)^{-2} with t* = (1 + 2a) / (2b): a p = 2 singularity.
    a, b, c = 0.5, 0.4, 1.0
    attn = mf.L2Attention(
        np.diag([0.0, 1.0]), Q=np.array([[0.0, 1.0]]), K=np.array([[1.0, 0.0]])
    )
    batched = jax.tree.map(lambda x: x[None], attn)
    study = mf.gaussian.blowup_times(
        mf.Gaussian(np.zeros(2), np.array([[a, b], [b, c]])), {"l2": batched}, 5.0
    )
    assert study.status["l2"][0] == _status.BLOWUP
    np.testing.assert_allclose(study.times["l2"][0], (1 + 2 * a) / (2 * b), rtol=1e-6)


def _reference_scale_shape(A, V, taus):
    """SciPy's DOP853 on Sigma = e^l S, tr S = 1, in tau (dtau = e^l dt).

    Sigma' = F(Sigma) is quadratic, so dS/dtau = F(S) - g S, dl/dtau = g = tr F(S),
    dt/dtau = e^{-l}: an independent solve (t-solvers, even stiff ones, stall on
    this run). Returns (t, l, S) at the given tau.
    """

    def field(tau, y):
        S = y[:4].reshape(2, 2)
        F = V @ S @ A @ S
        F = F + F.T
        g = np.trace(F)
        return np.concatenate([(F - g * S).ravel(), [g, np.exp(-y[4])]])

    y0 = np.concatenate([np.eye(2).ravel() / 2, [np.log(2.0), 0.0]])
    sol = solve_ivp(
        field, (0, taus[-1]), y0, method="DOP853", rtol=1e-12, atol=1e-14, t_eval=taus
    )
    assert sol.status == 0
    return sol.y[5], sol.y[4], sol.y[:4].T.reshape(-1, 2, 2)


@pytest.mark.parametrize(
    "A, V, ell_min", [(A_STEADY, V_STEADY, np.log(1e9)), (A_CRAWL, V_CRAWL, 11.0)]
)
def test_huge_steady_sigma_is_stationary_not_blowup(A, V, ell_min):
    study = mf.gaussian.blowup_times(
        mf.Gaussian(np.zeros(2), np.eye(2)), _softmax_batch(A[None], V[None]), 5.0
    )
    assert study.status["SoftmaxAttention"][0] == _status.STATIONARY
    assert np.isinf(study.times["SoftmaxAttention"][0])
    assert study.rank["SoftmaxAttention"][0] == 1
    # The reference: log tr Sigma rises to a large value (21.86 for A_STEADY,
    # near t = 0.5232; 11.27 for A_CRAWL, near t = 0.23) and stays there while
    # tau (and t) go on; the shape is rank one, on the null cone of A.
    t, ell, S = _reference_scale_shape(A, V, np.array([300.0, 3000.0]))
    assert t[1] > t[0]
    assert ell[0] > ell_min
    assert abs(ell[1] - ell[0]) < 1e-9
    lam, U = np.linalg.eigh(S[1])
    assert lam[0] < 1e-12
    u = U[:, -1]
    assert abs(u @ A @ u) < 1e-9


@pytest.mark.parametrize("family", ["l2", "sinkhorn"])
def test_bounded_families_never_blow_up(key, family):
    # Full-rank L2 and Sinkhorn have global solutions (docs/math/gaussians.md): no
    # run blows up or fails, and none grows faster than the bound 2 r. Solved in the
    # orthogonal frame (docs/math/blowup.md), every run is classified.
    d, batch = 3, 64
    ka, kv = jr.split(key)
    As = jr.normal(ka, (batch, d, d)) / np.sqrt(d)
    Vs = jnp.eye(d)[None] + jr.normal(kv, (batch, d, d)) * np.sqrt(0.1 / d)
    make = {
        "l2": lambda A, V: mf.L2Attention(V, Q=A, K=jnp.eye(d)),
        "sinkhorn": lambda A, V: mf.SinkhornAttention(V, A=A),
    }[family]
    study = mf.gaussian.blowup_times(
        mf.Gaussian(np.zeros(d), np.eye(d)), {family: jax.vmap(make)(As, Vs)}, 5.0
    )
    status = study.status[family]
    classified = (status == _status.SUCCESS) | (status == _status.STATIONARY)
    assert np.all(classified)
    assert study.fraction[family] == 0.0
    assert np.all(study.rank[family][classified] >= 1)
    norms = np.linalg.norm(np.asarray(Vs), 2, axis=(1, 2))
    if family == "sinkhorn":  # |S| <= |Sigma|: tr Sigma grows at most at 2 |V|
        assert np.all(
            study.rate[family][classified] <= 2 * norms[classified] * (1 + 1e-6)
        )


def test_one_attention_is_a_batch_of_one():
    # Before: one attention (no batch axis) failed with an error about V's shape.
    gauss = mf.Gaussian(np.zeros(2), np.eye(2))
    A, V = np.array([[1.0, 0.5], [0.0, 0.5]]), np.eye(2)
    one = mf.gaussian.blowup_times(gauss, mf.SoftmaxAttention(V, A=A), 5.0)
    batch = mf.gaussian.blowup_times(gauss, _softmax_batch(A[None], V[None]), 5.0)
    for field in ("times", "rank", "rate", "status", "steps"):
        got, want = getattr(one, field), getattr(batch, field)
        np.testing.assert_array_equal(got["SoftmaxAttention"], want["SoftmaxAttention"])
    assert one.status_names("SoftmaxAttention").tolist() == ["blowup"]
    # Neither one attention nor a batch of them for this Gaussian (d = 3, not 2):
    # the message names `attns` and shows how to build a batch.
    wrong = mf.SoftmaxAttention(np.eye(3), A=np.eye(3))
    with pytest.raises(ValueError, match=r"^`attns` .*leading batch axis.*jax\.vmap"):
        mf.gaussian.blowup_times(gauss, wrong, 5.0)


def test_study_rejects_bad_arguments():
    gauss = mf.Gaussian(np.zeros(2), np.eye(2))
    attns = _softmax_batch(np.eye(2)[None], np.eye(2)[None])
    with pytest.raises(ValueError, match="t_max"):
        mf.gaussian.blowup_times(gauss, attns, 0.0)
    with pytest.raises(ValueError, match="stationary_tol"):
        mf.gaussian.blowup_times(gauss, attns, 1.0, stationary_tol=0.0)
    with pytest.raises(ValueError, match="slots"):
        mf.gaussian.blowup_times(gauss, attns, 1.0, slots=0)
    with pytest.raises(ValueError, match="rtol"):
        mf.gaussian.blowup_times(gauss, attns, 1.0, rtol=-1.0)


# The documented example (docs/how-to/blowup.md) in JAX's default float32, in a child
# process (this suite enables x64), beside the float64 study of the same values
# (`jax.enable_x64`). Before the study computed in float64 itself, the float32
# solve ended runs that blow up "failed" (42 of 1000 softmax runs; e^l overflows
# before the blow-up test can pass) and Sinkhorn runs "failed" or "max_steps" (149
# of 1000); the first 200 runs hold 8 and 30 of them.
_FLOAT32_STUDY = """
import sys
import jax, jax.numpy as jnp, numpy as np
import meanfield as mf
assert not jax.config.jax_enable_x64
n, path = int(sys.argv[1]), sys.argv[2]
g = mf.Gaussian(mean=[0.5, 0.0], cov=[[1.0, 0.3], [0.3, 0.5]])
As = jax.random.normal(jax.random.key(1), (n, 2, 2))
def study(As, g):
    batched = lambda cls: jax.vmap(lambda A: cls(jnp.eye(2), A=A))(As)
    attns = {"softmax": batched(mf.SoftmaxAttention),
             "sinkhorn": batched(mf.SinkhornAttention)}
    return mf.gaussian.blowup_times(g, attns, 5.0)
default = study(As, g)
with jax.enable_x64(True):
    f64 = lambda a: jnp.asarray(np.asarray(a, np.float64))
    x64 = study(f64(As), mf.Gaussian(f64(g.mean), f64(g.cov)))
np.savez(path, As=As, cov=g.cov, **{
    f"{which}_{field}_{name}": getattr(res, field)[name]
    for which, res in (("default", default), ("x64", x64))
    for field in ("status", "times") for name in ("softmax", "sinkhorn")})
"""


# A fresh process compiles everything again (10-20 s): in the second tier.
@pytest.mark.slow
@pytest.mark.parametrize("n", [1000])
def test_float32_default_study_matches_float64_and_the_closed_form(tmp_path, n):
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    path = tmp_path / "study.npz"
    run = subprocess.run(
        [sys.executable, "-c", _FLOAT32_STUDY, str(n), str(path)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    got = np.load(path)
    assert got["As"].dtype == np.float32 and got["cov"].dtype == np.float32
    for name in ("softmax", "sinkhorn"):
        status = got[f"default_status_{name}"]
        np.testing.assert_array_equal(status, got[f"x64_status_{name}"])
        # A float64 solve of the same values either way: equal up to rounding
        # (1e-12 leaves room for a differently compiled reduction).
        np.testing.assert_allclose(
            got[f"default_times_{name}"], got[f"x64_times_{name}"], rtol=1e-12
        )
    assert np.all(got["default_status_sinkhorn"] == _status.SUCCESS)
    # V = I: t* = 1 / lambda_max(Sigma0^{1/2} (A + A^T) Sigma0^{1/2}) (closed form),
    # to the study's accuracy (1e-6, as in test_v_identity_blowup_times_are_exact).
    As, cov0 = got["As"].astype(np.float64), got["cov"].astype(np.float64)
    lam, U = np.linalg.eigh(cov0)
    root = (U * np.sqrt(lam)) @ U.T
    top = np.linalg.eigvalsh(root @ (As + np.swapaxes(As, 1, 2)) @ root)[:, -1]
    t_star = np.where(top > 1 / 5.0, 1 / np.maximum(top, 1e-300), np.inf)
    blown = np.isfinite(t_star)
    status, times = got["default_status_softmax"], got["default_times_softmax"]
    np.testing.assert_array_equal(status[blown], _status.BLOWUP)
    np.testing.assert_array_equal(status[~blown], _status.SUCCESS)
    np.testing.assert_allclose(times[blown], t_star[blown], rtol=1e-6)
