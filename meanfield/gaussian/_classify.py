"""The queue solves of one chunk of a blow-up study (docs/math/blowup.md).

`classify` runs the passes of `blowup_times`: an explicit pass in scale-shape
coordinates on the rate clock, an implicit (RODAS) pass for the runs it hands over,
and passes in the orthogonal frame; `frame_only` studies are solved in the frame
throughout.
"""

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .. import _status
from .._batching import map_runs
from .._linalg import safe_eigh
from .._ode_queue import OUT_OF_STEPS, STEP_UNDERFLOW, solve_ode_queue
from . import _frame, _scale_shape
from ._ode import value_rate


def numerical_rank(cov: Float[Array, "d d"], rtol: float) -> Int[Array, ""]:
    """Number of eigenvalues above rtol * lambda_max."""
    lam = safe_eigh(cov)[0]
    return jnp.sum(lam > rtol * lam[-1])


# The implicit second pass gets max_steps // _IMPLICIT_SHARE steps per run (200 by
# default): the runs it classifies take 6 steps (median) and 160 (99th
# percentile) in d = 2; the rest would spend any budget without ending.
_IMPLICIT_SHARE = 20
# The frame pass (third) gets max_steps // _FRAME_SHARE steps and slots // 4 slots.
_FRAME_SHARE = 4
# ... and takes the runs whose |dSigma/ds| / |Sigma| at the end of the explicit
# pass is within this factor of its resolution floor rtol + atol: a steady Sigma
# whose residual the explicit error keeps up (measured: ~3-15x on d = 2 softmax
# runs). Runs still moving hand over far above it (d = 4 softmax ~200-1300x,
# d = 2 L2 ~1e8x, estimated from l' ~ 3 and |B| = O(1)); the implicit pass cannot
# end them (docs/math/blowup.md).
_NEAR_STEADY = 1e3

# The stop rule's codes (> 0 ends a run) and the queue's, as result codes.
_REACHED, _STATIONARY, _BLOWUP, _OVERFLOW, _STALLED = 1, 2, 3, 4, 5
_CODES = {
    _REACHED: _status.SUCCESS,
    _STATIONARY: _status.STATIONARY,
    _BLOWUP: _status.BLOWUP,
    _OVERFLOW: _status.FAILED,
    OUT_OF_STEPS: _status.MAX_STEPS,
    _STALLED: _status.MAX_STEPS,
    STEP_UNDERFLOW: _status.FAILED,
}


@functools.partial(
    jax.jit,
    static_argnames=("static", "slots", "max_steps", "frame_only"),
    # The study's work is many small matrices: XLA's multi-threaded Eigen pool on
    # CPU only adds synchronisation (d = 4 softmax 63 -> 268 runs/s without it,
    # quiet 2-core CPU; benchmarks/README.md).
    compiler_options={"xla_cpu_multi_thread_eigen": False},
)
def classify(
    arrays,
    static,
    cov0,
    *,
    t0,
    t_max,
    log_threshold,
    stationary_tol,
    rank_rtol,
    rtol,
    atol,
    slots,
    max_steps,
    frame_only,
):
    """Queue solve of one chunk: (times, rank, rate, status, steps) as arrays.

    Both coordinate systems keep [l, t, beta] as the last three state entries, so
    the stop rule reads them at negative indices.
    """
    dtype = cov0.dtype
    d = cov0.shape[0]
    eps = jnp.finfo(dtype).eps
    n = jax.tree.leaves(arrays)[0].shape[0]
    y0 = jnp.broadcast_to(
        _scale_shape.pack(cov0, jnp.asarray(t0, dtype), dtype), (n, d * d + 3)
    )
    ell0 = y0[0, -3]
    big = math.log(jnp.finfo(dtype).max) / 2  # e^l and |B| stay representable
    attn_of = lambda p: eqx.combine(p, static)  # noqa: E731

    if _scale_shape.depends_on_time(static):
        params = (arrays, jnp.zeros((n,), dtype))
        growth_of = lambda p: None  # noqa: E731
    else:  # the bound's rate 2 r is constant: once per run, not per stage
        growth = map_runs(lambda a: 2 * value_rate(attn_of(a), t0, d), arrays)
        params = (arrays, growth.astype(dtype))
        growth_of = lambda p: p[1]  # noqa: E731

    def t_field(y, p):  # scale-shape
        return _scale_shape.time_field(y, attn_of(p[0]), d, growth_of(p))

    def rate_clock(y, p):  # explicit pass: dt/ds = 1 / (1 + |B|_F)
        dy, speed = t_field(y, p)
        return dy / (1 + speed)

    def growth_clock(y, p):  # implicit pass: dt/ds = 1 / sqrt(1 + l'^2)
        dy, _ = t_field(y, p)
        return dy / jnp.sqrt(1 + dy[-3] ** 2)

    def frame_clock(y, p):  # frame pass: the rate clock in the orthogonal frame
        dy, speed = _frame.time_field(y, attn_of(p[0]), d, growth_of(p))
        return dy / (1 + speed)

    def clock_drift(y, f):  # |dSigma/ds| / |Sigma| on the solver's clock
        S = _scale_shape.unpack(y, d)[0]
        return jnp.linalg.norm(f[: d * d].reshape(d, d) + f[-3] * S) / jnp.linalg.norm(
            S
        )

    def stop_rule(speed_of, drift_of, resolution, stall=None):
        def stop(y, f, y_prev, f_prev, p, steps):
            ell, t, beta = y[-3], y[-2], y[-1]
            dt_ds = f[-2]
            speed = speed_of(y, f, p)  # |B|_F
            dl = f[-3] / dt_ds
            dl_prev = f_prev[-3] / f_prev[-2]
            # Two-point fit of l = c - p log(t* - t) over the last step, from l and
            # l' only (close to t*, t itself stops resolving the steps): with
            # q = l'(s) / l'(s_prev) > 1, p = (l - l_prev) / log q, t* - t = p / l'.
            q = dl / jnp.where(dl_prev > 0, dl_prev, 1)
            growing = (dl_prev > 0) & (q > 1) & (ell > y_prev[-3])
            power = (ell - y_prev[-3]) / jnp.log(jnp.where(growing, q, 2))
            remaining = power / jnp.where(growing, dl, 1)
            blowup = (
                (ell - ell0 - beta >= log_threshold)
                & growing
                & (remaining <= 1e-3 * (t - t0 + remaining))
                & (power >= 0.05)
                & (power <= 50)
                & (t + remaining <= t_max)
            )
            # Stationary: Sigma' would move Sigma by less than stationary_tol over
            # the whole study (beyond the rounding floor of Sigma', 64 eps |B|).
            # On the rate clock also when |dSigma/ds| / |Sigma| is below the
            # solve's resolution rtol + atol (a huge steady Sigma: there |B| >> 1
            # and the residual in t is the state's error times |B|).
            span = t_max - t0
            drift = drift_of(y, f, p)  # |Sigma'| / |Sigma|
            horizon = t >= t_max - 1e-12 * jnp.maximum(jnp.abs(t_max), span)
            still = drift * span <= stationary_tol + 64 * eps * speed * span
            if resolution:
                still = still | (drift * dt_ds <= rtol + atol)
            code = jnp.where(horizon, _REACHED, 0)  # 0: go on (the queue's rule)
            code = jnp.where(~horizon & still, _STATIONARY, code)
            code = jnp.where(blowup, _BLOWUP, code)
            if stall is not None:
                # Stalled: at this pace neither t_max nor the blow-up threshold is
                # within `stall` steps (after 20 steps, for the step size to adapt).
                goal = ell0 + beta + log_threshold
                slow_t = (t - y_prev[-2]) * stall < t_max - t
                slow_l = (ell - y_prev[-3]) * stall < goal - ell
                stalled = (steps >= 20) & slow_t & slow_l & (code == 0)
                code = jnp.where(stalled, _STALLED, code)
            return jnp.where(ell > big, _OVERFLOW, code).astype(jnp.int32)

        return stop

    def max_step(y, f, p):
        # Land on t_max: the step in s that covers the time left at the current dt/ds.
        left = jnp.maximum(t_max - y[-2], 0)
        return jnp.where(f[-2] > 0, left / f[-2], jnp.inf)

    options = dict(rtol=rtol, atol=atol, h0=1e-3, h_min=16 * eps)
    clock_speed = lambda y, f, p: 1 / f[-2] - 1  # noqa: E731  |B| on a rate clock

    def retry(field, stop, y_from, handed, *, method, share, slot_share):
        """Solve the `handed` runs again from `y_from`; (result, handed & ended)."""
        order = jnp.argsort(~handed, stable=True)  # the handed runs first
        redo = solve_ode_queue(
            field,
            stop,
            max_step,
            y_from[order],
            jax.tree.map(lambda a: a[order], params),
            method=method,
            count=jnp.sum(handed),
            slots=max(1, slots // slot_share),
            max_steps=max(1, max_steps // share),
            **options,
        )
        back = jnp.argsort(order)
        redo = jax.tree.map(lambda a: a[back] if a.ndim else a, redo)
        # A second chance: a run this pass cannot classify either (budget, stall,
        # non-finite Jacobian) keeps the previous pass's verdict.
        return redo, handed & (redo.code > 0) & (redo.code != _STALLED)

    def summary(shape_of, ddl_of):
        def one(y, f, code, p):
            attn = attn_of(p)
            dl = f[-3] / f[-2]  # l' from the field the queue kept
            ddl = ddl_of(y, attn)
            blew = code == _status.BLOWUP
            # t* - t = l'/l'' for a power law; a rotating shape can make l'' <= 0
            # at the stop, where t* - t <= 50 / l' (p <= 50): ~1e-14 t* at
            # threshold 1e16.
            remaining = jnp.where(ddl > 0, dl / jnp.where(ddl > 0, ddl, 1), 0)
            t_star = y[-2] + jnp.clip(remaining, 0, 50 / jnp.maximum(dl, eps))
            classified = (code == _status.SUCCESS) | (code == _status.STATIONARY)
            return (
                jnp.where(blew, t_star, jnp.inf),
                jnp.where(classified, numerical_rank(shape_of(y), rank_rtol), -1),
                jnp.where(blew, jnp.inf, jnp.where(classified, dl, jnp.nan)),
            )

        return lambda *args: map_runs(one, *args)

    def as_status(codes):
        return jnp.select(
            [codes == c for c in _CODES], list(_CODES.values()), _status.FAILED
        )

    frame_drift = lambda y, f, p: _frame.relative_rate(y, attn_of(p[0]), d)  # noqa: E731
    scale_shape_summary = summary(
        lambda y: _scale_shape.unpack(y, d)[0],
        lambda y, a: _scale_shape.log_rate_derivative(y, a, d),
    )
    frame_summary = summary(
        lambda y: _frame.shape(y, d),
        lambda y, a: _frame.log_rate_derivative(y, a, d),
    )

    pick = lambda mask, a, b: jnp.where(  # noqa: E731
        mask.reshape((-1,) + (1,) * (a.ndim - 1)), b, a
    )

    if frame_only:
        # B does not grow with Sigma but depends on its small directions: solved
        # in the frame throughout, with the budget of the explicit pass. (An
        # implicit second pass for the runs it cannot end would double the
        # compilation of every L2 and Sinkhorn study; see docs/math/blowup.md.)
        out = solve_ode_queue(
            frame_clock,
            stop_rule(clock_speed, frame_drift, resolution=True),
            max_step,
            map_runs(lambda z: _frame.from_scale_shape(z, d), y0),
            params,
            method="dopri5",
            slots=slots,
            max_steps=max_steps,
            increment_relative=jnp.arange(_frame.size(d)) == _frame.size(d) - 2,
            **options,
        )
        code = as_status(out.code)
        return (*frame_summary(out.y, out.dy, code, arrays), code, out.steps)

    # Explicit pass on the rate clock. The runs it cannot end within the budget
    # are typically a huge Sigma on (or near) a rank-deficient steady state: the
    # rate clock crawls in t (dt/ds = 1 / |B|), and the explicit error keeps the
    # fast modes (rates ~|B| in t) excited at the tolerance, so the drift never
    # falls below the stationary test.
    out = solve_ode_queue(
        rate_clock,
        stop_rule(
            clock_speed, lambda y, f, p: clock_drift(y, f) / f[-2], resolution=True
        ),
        max_step,
        y0,
        params,
        method="dopri5",
        slots=slots,
        max_steps=max_steps,
        # Near t* the steps in t fall far below rtol |t|: t is held to rtol of
        # its increment, so that the blow-up fit sees an accurate clock.
        increment_relative=jnp.arange(d * d + 3) == d * d + 1,
        **options,
    )

    # Implicit pass for those, from where they stopped: RODAS damps the fast modes
    # (the residual falls to rounding) and steps on the scale of the slow ones.
    # t is held to rtol |t| only: on the growth clock t' depends on l', which the
    # state fixes only to atol e^l (the complement of a huge Sigma lives in S's
    # last digits); near t* the clock slows t down geometrically, and rtol |t| is
    # the accuracy the times promise. Fewer slots: these are few runs.
    near_steady = (out.code == OUT_OF_STEPS) & (
        jax.vmap(clock_drift)(out.y, out.dy) <= _NEAR_STEADY * (rtol + atol)
    )
    redo, ended = retry(
        growth_clock,
        stop_rule(
            lambda y, f, p: t_field(y, p)[1],
            lambda y, f, p: clock_drift(y, f) / f[-2],
            resolution=False,
        ),
        out.y,
        near_steady,
        method="rodas4",
        share=_IMPLICIT_SHARE,
        slot_share=8,
    )
    y, dy, codes = (
        pick(ended, a, b)
        for a, b in ((out.y, redo.y), (out.dy, redo.dy), (out.code, redo.code))
    )
    steps = out.steps + jnp.where(near_steady, redo.steps, 0)

    # Frame pass for the runs still unclassified, from where they stopped: the
    # same rate clock in the orthogonal frame (`_frame`), where the complement of
    # a huge direction keeps full relative precision. Where B is bounded (L2,
    # Sinkhorn) the stiffness of the scale-shape coordinates is gone and the
    # explicit method ends the run; a run still crawling in t leaves after 20
    # steps (stall rule) instead of spending the budget.
    unended = codes == OUT_OF_STEPS
    frame_budget = max(1, max_steps // _FRAME_SHARE)
    framed, framed_ended = retry(
        frame_clock,
        stop_rule(clock_speed, frame_drift, resolution=True, stall=frame_budget),
        map_runs(lambda z: _frame.from_scale_shape(z, d), y),
        unended,
        method="dopri5",
        share=_FRAME_SHARE,
        slot_share=4,
    )
    steps = steps + jnp.where(unended, framed.steps, 0)

    code = as_status(codes)
    framed_code = as_status(framed.code)
    times, rank, rate = (
        jnp.where(framed_ended, b, a)
        for a, b in zip(
            scale_shape_summary(y, dy, code, arrays),
            frame_summary(framed.y, framed.dy, framed_code, arrays),
            strict=True,
        )
    )
    return times, rank, rate, jnp.where(framed_ended, framed_code, code), steps
