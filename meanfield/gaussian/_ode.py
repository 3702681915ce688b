"""Moment ODE of a Gaussian under attention dynamics, closed forms and blow-up.

On mu = N(alpha, Sigma) the field is affine, Gamma(x) = B x + b, so mu(t) stays
Gaussian with alpha' = B alpha + b and Sigma' = B Sigma + Sigma B^T
(docs/math/gaussians.md). An affine feed-forward layer F(x) = W x + b adds (W, b) to
(B, b) (`ffn=`, or an `mf.Block`).
"""

import math

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from .. import _status
from .._attention.base import AbstractAttention, interaction_matrix
from .._attention.norms import norm2, value_norm
from .._attention.softmax import SoftmaxAttention
from .._checks import check_finite_times, check_tolerances, is_traced
from .._clock import (
    checked_on_host,
    clock_length,
    diffeqsolve_in_jit,
    save_fractions,
    to_t,
)
from .._feedforward import FeedForward
from .._linalg import safe_eigh
from .._measures import Gaussian
from .._repr import fields_repr, status_brief
from .._step_floor import FlooredPIDController, step_floor
from ._velocity import check_supported, split_ffn, summed_affine, with_ffn


class GaussianSolution(eqx.Module):
    """Trajectory of N(alpha(t), Sigma(t)).

    Attributes:
        ts: save times (T,). With saveat=None, (t0, t_final): the last row is
            the state where the solve stopped (t1 unless it stopped early);
            explicit save times after an early stop are +inf, as their rows.
        mean: alpha(t), shape (T, d).
        cov: Sigma(t), shape (T, d, d), symmetric.
        blowup_time: time at which lambda_max(Sigma) diverges (+inf if not on
            [t0, t1]); see `simulate`.
        result: integer code (`mf.Status`); `status` gives its name.
        t_final: time at which integration stopped.
        num_steps: solver steps.
    """

    ts: Float[Array, " T"]
    mean: Float[Array, "T d"]
    cov: Float[Array, "T d d"]
    blowup_time: Float[Array, ""]
    result: Int[Array, ""]
    t_final: Float[Array, ""]
    num_steps: Int[Array, ""]

    @property
    def status(self) -> str | np.ndarray:
        """'success' | 'blowup' | 'max_steps' | 'failed' (`mf.Status(result).label`).

        An array of such names for a vmapped batch of solutions.
        """
        return _status.names(self.result)

    def __repr__(self) -> str:
        return fields_repr(
            self,
            status=status_brief(self.result),
            blowup_time=self.blowup_time,
            t_final=self.t_final,
            num_steps=self.num_steps,
            ts=self.ts,
            mean=self.mean,
            cov=self.cov,
        )

    def gaussian(self, i: int) -> Gaussian:
        """The Gaussian at ts[i] (not re-validated)."""
        g = Gaussian(jnp.zeros(self.mean.shape[-1]), jnp.eye(self.mean.shape[-1]))
        return eqx.tree_at(lambda m: (m.mean, m.cov), g, (self.mean[i], self.cov[i]))


def _symmetrize(S):
    return (S + jnp.swapaxes(S, -1, -2)) / 2


def value_rate(attn, t, d):
    """Growth rate r(t) of a blow-up-free run: |Sigma(t)| <= |Sigma0| e^{2 int r}.

    Per head, `covariance_growth_rate` where the family gives one (L2 with K of full
    column rank: r = |V| |Q| / s_min(K), docs/math/gaussians.md), else |V|_2:
    Sinkhorn has r = |V|_2 (|S| <= |Sigma|); softmax has no such bound
    (B = V Sigma A grows with Sigma) and |V|_2 is the reference rate. Multi-head:
    sum of |W_h| r_h.
    """
    total = 0.0
    for head, W in attn.flat_heads(t, d):
        rate = head.covariance_growth_rate(t, d)
        if rate is None:
            rate = value_norm(head, t, d, None)
        if W is not None:
            rate = rate * norm2(W)
        total = total + rate
    return total


def _lambda_max(t, y):
    return safe_eigh(_symmetrize(y[1]))[0][-1]


def _time_to_singularity(field, t, y):
    """Extrapolated t* - t from lambda(t) = lambda_max(Sigma(t)) and its derivatives.

    For lambda ~ c (t* - t)^{-p}: lambda lambda'' / lambda'^2 = (p + 1) / p, and
    t* - t = p lambda / lambda'. Derivatives along the flow by nested jax.jvp
    (time enters the tangent with dt = 1). Returns 0 when the profile is not
    power-law like (r <= 1), i.e. no extrapolation.
    """

    def along_flow(fn):
        def derivative(t, y):
            tangent = (jnp.ones_like(t), field(t, y, None))
            return jax.jvp(fn, (t, y), tangent)[1]

        return derivative

    d1 = along_flow(_lambda_max)
    d2 = along_flow(d1)
    lam, dlam, ddlam = _lambda_max(t, y), d1(t, y), d2(t, y)
    r = lam * ddlam / jnp.where(dlam != 0, dlam**2, 1)
    ok = (dlam > 0) & (r > 1) & jnp.isfinite(r)
    p = 1 / jnp.where(ok, r - 1, 1)
    return jnp.where(ok, p * lam / jnp.where(dlam > 0, dlam, 1), 0)


def _moment_field(attn):
    def field(t, state, args):
        mean, cov = state[0], _symmetrize(state[1])
        B, b = summed_affine(attn, mean, cov, t)
        return B @ mean + b, _symmetrize(B @ cov + cov @ B.T)

    return field


def _augmented_field(attn, d):
    """(mean, cov, log_bound) with log_bound' = 2 r(t) (see `value_rate`)."""
    moments = _moment_field(attn)

    def field(t, state, args):
        dmean, dcov = moments(t, state, args)
        return dmean, dcov, 2 * value_rate(attn, t, d).astype(state[2].dtype)

    return field


def _check(gauss, attn):
    if not isinstance(gauss, Gaussian):
        raise ValueError(f"`gauss` must be a `Gaussian`; got {type(gauss).__name__}.")
    check_supported(attn, gauss)


def simulate(
    gauss: Gaussian,
    attn: AbstractAttention,
    t1: float,
    *,
    t0: float = 0.0,
    saveat: ArrayLike | None = None,
    rtol: float = 1e-8,
    atol: float = 1e-8,
    max_steps: int = 100_000,
    blowup_threshold: float = 1e8,
    ffn: FeedForward | None = None,
) -> GaussianSolution:
    """Solve the moment ODE alpha' = B alpha + b, Sigma' = B Sigma + Sigma B^T.

    With a feed-forward layer F(x) = W_f x + b_f (`ffn`, or `attn` an `mf.Block`)
    the field is (B + W_f) x + b + b_f: alpha' gains W_f alpha + b_f and Sigma'
    gains W_f Sigma + Sigma W_f^T (Alcalde, Ji & Zuazua, arXiv 2606.07600).

    Computed in float64 when x64 is enabled (whatever the Gaussian's dtype), with
    Dopri8 (8th order: d x d states are cheap, accuracy is not); Sigma is
    symmetrised at every evaluation.

    Blow-up: a diffrax event stops the solve at the end of the step on which
    lambda_max(Sigma(t)) exceeds blowup_threshold * lambda_max(Sigma0) *
    e^{2 int_0^t r}, r the growth rate of a blow-up-free run (`value_rate`:
    |V| for Sinkhorn and softmax, |V| |Q| / s_min(K) for L2 with K of full column
    rank), so Sinkhorn or full-rank L2 runs that grow exponentially are never
    flagged; a feed-forward layer adds |W_f|_2 to r. A step size below 100 ulps
    of max(|t|, 1) at the current t (float32 close to t*; the floor does not
    depend on t1) also ends the solve: as a blow-up when the extrapolated
    singularity below is within 1000 such steps, else as "failed" (a run too
    stiff for the dtype). Near a blow-up at t*, lambda_max ~ c (t* - t)^{-p}
    (p = 1 for softmax, p = 2 for the rank-deficient L2 example of
    docs/math/gaussians.md); p and t* - t are estimated from lambda, lambda',
    lambda'' at that point (`_time_to_singularity`) and `blowup_time` is the
    extrapolated t*.

    See [The moment ODE][math-gaussian-moment-ode] for the equations,
    [Blow-up detection][math-blowup-gaussian] for the blow-up rule and the extrapolated
    time, [The solver clock][math-solver-clock] for the clock the solve runs on, and
    [Feed-forward layers][math-gaussian-feedforward] for the feed-forward terms.

    Args:
        gauss: initial Gaussian N(alpha0, Sigma0).
        attn: softmax, L2, Sinkhorn or multi-head attention, or an `mf.Block` of
            one with an `mf.FeedForward`.
        t1: final time.
        t0: initial time.
        saveat: save times (T,) in [t0, t1]; None saves t0 and the end of the
            solve, t_final (t1 unless it stopped early).
        rtol: relative tolerance.
        atol: absolute tolerance.
        max_steps: step budget (status "max_steps" when exhausted).
        blowup_threshold: factor by which lambda_max(Sigma) must exceed its
            blow-up-free growth bound lambda_max(Sigma0) e^{2 int r} to stop.
        ffn: an affine feed-forward layer `mf.FeedForward(W_f, b_f)` (W_f, b_f
            arrays or functions of t) added to the field, the same as
            `mf.Block(attn, ffn)`; None for attention alone.

    Returns:
        A `GaussianSolution`.

    Raises:
        ValueError: unsupported attention, a non-affine feed-forward (`mf.MLP`:
            Gaussians do not stay Gaussian), bad times, threshold or `max_steps`.
    """
    attn = with_ffn(attn, ffn)
    _check(gauss, attn)
    check_finite_times(t0=t0, t1=t1)
    check_tolerances(rtol, atol)
    if not float(t1) > float(t0):
        raise ValueError(f"`t1` must be greater than `t0`; got t0={t0}, t1={t1}.")
    if not blowup_threshold > 0:
        raise ValueError(
            f"`blowup_threshold` must be positive; got {blowup_threshold}."
        )
    if isinstance(max_steps, bool) or int(max_steps) != max_steps or max_steps < 1:
        raise ValueError(f"`max_steps` must be a positive integer; got {max_steps!r}.")
    dtype = jnp.promote_types(gauss.mean.dtype, jnp.result_type(float))
    mean0, cov0 = gauss.mean.astype(dtype), gauss.cov.astype(dtype)
    if is_traced(cov0):
        log_top = jnp.log(jnp.linalg.eigvalsh(cov0)[-1])
    else:  # on the host: no small eager program to compile
        log_top = math.log(float(np.linalg.eigvalsh(np.asarray(cov0, np.float64))[-1]))
    log_thr = jnp.asarray(math.log(blowup_threshold) + log_top, dtype)
    # The solver clock (`_clock`): times, the clock's length, save fractions,
    # thresholds and tolerances are traced arrays; the jitted solve is traced
    # once per (attention structure, d, number of saves, max_steps).
    fractions, checked = save_fractions(saveat, float(t0), float(t1))
    if checked and fractions is not None:
        fractions = np.asarray(fractions, dtype)
    return _solve(
        mean0,
        cov0,
        attn,
        jnp.asarray(t0, dtype),
        jnp.asarray(t1, dtype),
        np.asarray(clock_length(t0, t1), dtype),
        fractions,
        None if saveat is None else jnp.asarray(saveat, dtype),
        log_thr,
        jnp.asarray(float(rtol), dtype),
        jnp.asarray(float(atol), dtype),
        checked=checked,
        max_steps=int(max_steps),
    )


@eqx.filter_jit
def _solve(
    mean0,
    cov0,
    attn,
    t0,
    t1,
    length,
    fractions,
    ts,
    log_thr,
    rtol,
    atol,
    *,
    checked,
    max_steps,
) -> GaussianSolution:
    """The diffrax solve of `simulate` on the solver clock (validated there)."""
    dtype = mean0.dtype
    rate = (t1 - t0) / length  # dt/ds
    if fractions is None:
        sub = dfx.SubSaveAt(t0=True, t1=True)
    else:
        sub = dfx.SubSaveAt(ts=jnp.asarray(fractions, dtype) * length)

    def crossed(s, y, args, **kwargs):
        # log lambda_max(Sigma) - log(threshold lambda_max(Sigma0) e^{2 int r}).
        lam = _lambda_max(s, y)
        value = jnp.log(jnp.maximum(lam, jnp.finfo(dtype).tiny)) - log_thr - y[2]
        return value.astype(jnp.result_type(float))

    augmented = _augmented_field(attn, mean0.shape[0])

    def on_clock(s, y, args):
        return jax.tree.map(lambda v: v * rate, augmented(to_t(s, t0, rate), y, args))

    field = _moment_field(attn)
    with checked_on_host(checked):
        sol = diffeqsolve_in_jit(
            dfx.ODETerm(on_clock),
            dfx.Dopri8(),
            jnp.asarray(0.0, dtype),
            length,
            None,
            (mean0, cov0, jnp.zeros((), dtype)),
            saveat=dfx.SaveAt(subs=(sub, dfx.SubSaveAt(t1=True))),
            # Steps below 100 ulps of t cannot approach t* further (float32 near
            # a blow-up): stop there and extrapolate, not stall until max_steps.
            stepsize_controller=FlooredPIDController(
                rtol=rtol, atol=atol, t_start=t0, dt_ds=rate
            ),
            max_steps=max_steps,
            # No root finder: the crossing step ends within O(1/threshold) of t*,
            # and the extrapolation below does the rest (Newton on the steep
            # interpolant near a singularity does not converge).
            event=dfx.Event(crossed),
            throw=False,
        )
    (s_saved, s_end), ((means, covs, _), (mean_end, cov_end, _)) = sol.ts, sol.ys
    t_final = jnp.where(s_end[0] == length, t1, to_t(s_end[0], t0, rate))
    if fractions is None:  # the last row is where the solve stopped
        ts = jnp.stack([t0, t_final])
    else:
        ts = jnp.where(jnp.isfinite(s_saved), ts.astype(dtype), jnp.inf)
    remaining = _time_to_singularity(field, t_final, (mean_end[0], cov_end[0]))
    # A collapsed step size is a blow-up only if lambda_max follows a power law
    # whose singularity is within 1000 minimal steps; otherwise the run is merely
    # too stiff for this dtype (lambda' ~ 0) and ends as "failed".
    singular_soon = (remaining > 0) & (remaining < 1000 * step_floor(t_final, dtype))
    blew_up = (sol.result == dfx.RESULTS.event_occurred) | (
        (sol.result == dfx.RESULTS.dt_min_reached) & singular_soon
    )
    blowup_time = jnp.where(blew_up, t_final + remaining, jnp.inf)
    code = jnp.where(
        sol.result == dfx.RESULTS.max_steps_reached, _status.MAX_STEPS, _status.FAILED
    )
    code = jnp.where(sol.result == dfx.RESULTS.successful, _status.SUCCESS, code)
    code = jnp.where(blew_up, _status.BLOWUP, code)
    return GaussianSolution(
        ts=ts,
        mean=means,
        cov=_symmetrize(covs),
        blowup_time=blowup_time,
        result=code,
        t_final=t_final,
        num_steps=sol.stats["num_steps"],
    )


def _commutes(X, Y, scale) -> bool:
    return bool(np.max(np.abs(X @ Y - Y @ X)) <= 1e-10 * scale)


def _closed_form_parts(gauss, attn, ffn=None):
    """(V, A, M, Sigma0, w) for the closed-form case; ValueError outside it.

    w is the growth rate of the feed-forward matrix W_f = w I + K (K skew), 0
    without one.
    """
    attn, ffn = split_ffn(attn, ffn)
    _check(gauss, with_ffn(attn, ffn))
    if not isinstance(attn, SoftmaxAttention):
        raise ValueError(
            "the closed form covers softmax attention only; got "
            f"{type(attn).__name__} (use `mf.gaussian.simulate`)."
        )
    params = [attn.V, attn.A, attn.Q, attn.K]
    if ffn is not None:
        params += [ffn.W, ffn.b]
    if any(callable(p) for p in params if p is not None):
        raise ValueError("the closed form needs constant (array) `A`, `V`, `W`, `b`.")
    if is_traced(*[p for p in params if p is not None], gauss.cov):
        raise ValueError("the closed form checks commutation on concrete arrays.")
    d = gauss.dim
    V = np.asarray(attn.V, np.float64)
    A = np.asarray(interaction_matrix(attn, 0.0, d), np.float64)
    S0 = np.asarray(gauss.cov, np.float64)
    M = V @ A + A.T @ V.T
    scale = max(np.abs(V).max() * max(np.abs(M).max(), np.abs(S0).max()), 1e-300)
    if not (_commutes(V, M, scale) and _commutes(V, S0, scale)):
        raise ValueError(
            "the closed form needs V to commute with M = V A + A^T V^T and with "
            "Sigma0 (docs/math/gaussians.md); use `mf.gaussian.simulate`."
        )
    w = 0.0
    if ffn is not None:
        W = np.asarray(ffn.matrices(0.0, d)[0], np.float64)
        w = float(np.trace(W)) / d
        K = W - w * np.eye(d)
        w_scale = max(np.abs(W).max(), 1e-300)
        skew = np.max(np.abs(K + K.T)) <= 1e-10 * w_scale
        k_scale = w_scale * max(np.abs(M).max(), np.abs(S0).max(), 1e-300)
        if not (skew and _commutes(K, M, k_scale) and _commutes(K, S0, k_scale)):
            raise ValueError(
                "with `ffn` the closed form needs W = w I + K with K skew, "
                "commuting with M = V A + A^T V^T and with Sigma0 "
                "(docs/math/gaussians.md); use `mf.gaussian.simulate`."
            )
    return V, A, M, S0, w


def _phi(w, t):
    """(e^{2 w t} - 1) / (2 w), t at w = 0: P(t) = e^{-2 w t} (Sigma0^{-1} - phi M)."""
    return t if w == 0 else np.expm1(2 * w * t) / (2 * w)


def blowup_time(
    gauss: Gaussian, attn: AbstractAttention, *, ffn: FeedForward | None = None
) -> float:
    """Analytic blow-up time of softmax attention in the closed-form case.

    t0* = 1 / lambda_max(Sigma0^{1/2} M Sigma0^{1/2}), M = V A + A^T V^T
    (docs/math/gaussians.md), or +inf if that eigenvalue is <= 0 (global solution).

    With a feed-forward layer W_f = w I + K (K skew, commuting with M and Sigma0;
    d = 1: any w), P = Sigma^{-1} is e^{-2 w t} (Sigma0^{-1} - phi(t) M) with
    phi(t) = (e^{2 w t} - 1) / (2 w), so t* = log(1 + 2 w t0*) / (2 w), and +inf
    when w < 0 and 1 + 2 w t0* <= 0 (the feed-forward contracts faster than
    attention expands; phi stays below t0* at every finite t), including when
    1 + 2 w t0* is zero to within the rounding of its evaluation. b_f plays no
    part.

    See [The softmax closed form][math-gaussian-closed-form] for the derivation,
    and [Feed-forward layers][math-gaussian-feedforward] for the feed-forward
    case.

    Args:
        gauss: initial Gaussian.
        attn: `SoftmaxAttention` with constant parameters, or an `mf.Block` of one
            with an `mf.FeedForward`.
        ffn: an affine feed-forward layer `mf.FeedForward(W_f, b_f)` with
            constant arrays, or None.

    Returns:
        t* (a float, +inf without blow-up).

    Raises:
        ValueError: outside the closed-form case (see `closed_form`), or a
            non-affine feed-forward.
    """
    _, _, M, S0, w = _closed_form_parts(gauss, attn, ffn)
    lam, U = np.linalg.eigh(S0)
    root = (U * np.sqrt(lam)) @ U.T
    top = np.linalg.eigvalsh(root @ M @ root)[-1]
    if not top > 0:
        return math.inf
    tau = 1 / top  # phi(t*) = tau
    if w == 0:
        return float(tau)
    grow = 2 * w * tau
    if w > 0:  # nothing cancels
        return float(np.log1p(grow) / (2 * w))
    # 1 + grow cancels where grow ~ -1 (w < 0). Its rounding: top, an eigenvalue
    # of root M root (eigh of Sigma0, two products, eigvalsh: backward stable),
    # is off by ~ d eps |Sigma0| |M|, relative to top; w = tr(W) / d, a sum of d
    # equal entries, by d eps. Within that 1 + 2 w t0* is zero: no blow-up.
    eps = np.finfo(np.float64).eps
    spread = np.linalg.norm(S0, 2) * np.linalg.norm(M, 2) / top
    tol = 4 * S0.shape[0] * eps * (1 + spread) * abs(grow)
    return float(np.log1p(grow) / (2 * w)) if 1 + grow > tol else math.inf


class ClosedForm(eqx.Module):
    """Closed-form Gaussian trajectory: ts (T,), mean (T, d) or None, cov (T, d, d).

    `mean` is None when its formula does not apply (it needs V, A, Sigma0
    symmetric and pairwise commuting, or alpha0 = 0). Entries at t >= t* are +inf.
    """

    ts: np.ndarray
    mean: np.ndarray | None
    cov: np.ndarray


def closed_form(
    gauss: Gaussian,
    attn: AbstractAttention,
    ts: ArrayLike,
    *,
    ffn: FeedForward | None = None,
) -> ClosedForm:
    """Exact alpha(t), Sigma(t) for softmax with constant A, V.

    See [The softmax closed form][math-gaussian-closed-form] for the derivation
    (docs/math/gaussians.md).

    When V commutes with M = V A + A^T V^T and with Sigma0:
    Sigma(t) = (Sigma0^{-1} - t M)^{-1} (P = Sigma^{-1} solves P' = -M). If V, A and
    Sigma0 are symmetric and commute pairwise, alpha(t) = e^{tV} (I - t M Sigma0)^{-1/2}
    alpha0; if alpha0 = 0, alpha(t) = 0.

    With a feed-forward layer W_f = w I + K (K skew, commuting with M and Sigma0):
    Sigma(t) = e^{2 w t} (Sigma0^{-1} - phi(t) M)^{-1}, phi(t) = (e^{2 w t} - 1) / (2 w)
    ([Feed-forward layers][math-gaussian-feedforward]); the mean is given only when
    alpha0 = 0 and b_f = 0 (then alpha(t) = 0).

    Args:
        gauss: initial Gaussian.
        attn: `SoftmaxAttention` with constant parameters, or an `mf.Block` of one
            with an `mf.FeedForward`.
        ts: times (T,), t >= 0.
        ffn: an affine feed-forward layer `mf.FeedForward(W_f, b_f)` with
            constant arrays, or None.

    Returns:
        `ClosedForm` (NumPy float64 arrays).

    Raises:
        ValueError: outside this case, or a non-affine feed-forward.
    """
    V, A, M, S0, w = _closed_form_parts(gauss, attn, ffn)
    attn, ffn = split_ffn(attn, ffn)
    ts = np.asarray(ts, np.float64).reshape(-1)
    d = V.shape[0]
    t_star = blowup_time(gauss, attn, ffn=ffn)
    P0 = np.linalg.inv(S0)
    cov = np.full((ts.size, d, d), np.inf)
    alive = ts < t_star
    for i in np.flatnonzero(alive):
        cov[i] = np.exp(2 * w * ts[i]) * np.linalg.inv(P0 - _phi(w, ts[i]) * M)
        cov[i] = (cov[i] + cov[i].T) / 2
    alpha0 = np.asarray(gauss.mean, np.float64)
    if ffn is not None:
        b_f = np.asarray(ffn.matrices(0.0, d)[1], np.float64)
        if np.any(alpha0) or np.any(b_f):  # the mean formula needs W_f = 0
            return ClosedForm(ts=ts, mean=None, cov=cov)
    scale = max(np.abs(A).max(), np.abs(V).max(), np.abs(S0).max(), 1e-300)
    symmetric = all(np.allclose(X, X.T, rtol=0, atol=1e-12 * scale) for X in (V, A))
    commuting = symmetric and all(
        _commutes(X, Y, scale**2) for X, Y in ((V, A), (V, S0), (A, S0))
    )
    if not np.any(alpha0):
        mean = np.zeros((ts.size, d))
        mean[~alive] = np.inf
    elif commuting:
        mean = np.full((ts.size, d), np.inf)
        lamV, UV = np.linalg.eigh(V)
        for i in np.flatnonzero(alive):
            W = np.eye(d) - ts[i] * M @ S0
            W = (W + W.T) / 2
            lam, U = np.linalg.eigh(W)
            inv_root = (U / np.sqrt(lam)) @ U.T
            mean[i] = (UV * np.exp(ts[i] * lamV)) @ UV.T @ inv_root @ alpha0
    else:
        mean = None
    return ClosedForm(ts=ts, mean=mean, cov=cov)
