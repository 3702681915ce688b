"""Adaptive one-step solvers over a work queue of many small ODEs (`solve_ode_queue`).

The queue of the Gaussian studies (`gaussian._classify`): each run is a small
moment ODE. Particle ensembles have their own queue of systems,
`_ensemble_queue.run_particle_queue`.

A vmapped diffrax solve steps all its members in lockstep until the slowest one
ends, so a batch costs (batch size) x (longest run). Here a fixed number of slots
step together; a slot whose run has ended writes its result and takes the next run
from the queue (compaction), so a batch costs about (total steps) / slots + the
longest run. Everything runs in one `lax.while_loop`: one compilation per
(field, stop rule, method, slots, state size, batch size).

Two methods share the queue:
- "dopri5": explicit Dormand-Prince 5(4);
- "rodas4": Hairer & Wanner's L-stable, stiffly accurate Rosenbrock method of
  order 4(3) (RODAS), with the exact Jacobian by forward differentiation and one
  LU factorisation per step. Its fast modes are damped, not resolved.

The caller gives the vector field in its own clock s (autonomous: time, if needed,
is a component of the state), a stop rule evaluated after every accepted step, and
a step cap (for instance to land on a horizon).
"""

import functools
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._batching import map_runs, safe_batch

# Dormand-Prince 5(4) (Shampine's tableau): stages, 5th-order weights, and the
# difference to the embedded 4th-order weights. The 7th stage is f(y_new) (FSAL).
_C = np.array([0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0])
_A = (
    (),
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
)
_B_ERR = np.array(
    [
        35 / 384 - 1951 / 21600,
        0.0,
        500 / 1113 - 22642 / 50085,
        125 / 192 - 451 / 720,
        -2187 / 6784 + 12231 / 42400,
        11 / 84 - 649 / 6300,
        -1 / 60,
    ]
)

#: `QueueResult.code` of a run whose step budget ran out.
OUT_OF_STEPS = -1
#: `QueueResult.code` of a run whose step size fell below `h_min` (or went NaN).
STEP_UNDERFLOW = -2

# RODAS (Hairer & Wanner, Solving ODEs II, section IV.7), in the form with
# increments K_i: (I / (h gamma) - J) K_i = f(Y_i) + sum_j (c_ij / h) K_j,
# Y_i = y + sum_j a_ij K_j for i <= 5, Y_6 = Y_5 + K_5, y_new = Y_6 + K_6; K_6 is
# the difference to the embedded 3rd-order solution Y_6.
_GAMMA = 0.25
_RA = (
    (),
    (1.544,),
    (0.9466785280815826, 0.2557011698983284),
    (3.314825187068521, 2.896124015972201, 0.9986419139977817),
    (1.221224509226641, 6.019134481288629, 12.53708332932087, -0.6878860361058950),
)
_RC = (
    (),
    (-5.6688,),
    (-2.430093356833875, -0.2063599157091915),
    (-0.1073529058151375, -9.594562251023355, -20.47028614809616),
    (7.496443313967647, -10.24680431464352, -33.99990352819905, 11.70890893206160),
    (
        8.083246795921522,
        -7.981132988064893,
        -31.52159432874371,
        16.31930543123136,
        -6.058818238834054,
    ),
)


class QueueResult(eqx.Module):
    """Final states of a queue of runs.

    Attributes:
        y: final states (N, m).
        dy: the field at the final states (N, m).
        code: the stop rule's code (> 0), `OUT_OF_STEPS` or `STEP_UNDERFLOW` (N,).
        steps: attempted steps per run (N,).
        iterations: loop iterations of the whole batch (each advances every slot).
    """

    y: Float[Array, "N m"]
    dy: Float[Array, "N m"]
    code: Int[Array, " N"]
    steps: Int[Array, " N"]
    iterations: Int[Array, ""]


def _dopri5_step(field, y, f0, p, h):
    """One Dormand-Prince step of size h: (y_new, f(y_new), error estimate)."""
    ks = [f0]
    for i in range(1, 7):
        incr = sum(a * k for a, k in zip(_A[i], ks, strict=False) if a != 0.0)
        ks.append(field(y + h * incr, p))
    y_new = y + h * sum(a * k for a, k in zip(_A[6], ks, strict=False) if a != 0.0)
    err = h * sum(e * k for e, k in zip(_B_ERR, ks, strict=True) if e != 0.0)
    return y_new, ks[6], err


def _rodas4_step(field, y, f0, p, h):
    """One RODAS step of size h: (y_new, f(y_new), error estimate)."""
    m = y.shape[0]
    jac = jax.jacfwd(field)(y, p)
    lu = jax.scipy.linalg.lu_factor(jnp.eye(m, dtype=y.dtype) / (h * _GAMMA) - jac)
    ks, arg = [], y
    for i in range(6):
        if i == 5:
            arg = arg + ks[4]
        elif i > 0:
            arg = y + sum(a * k for a, k in zip(_RA[i], ks, strict=True))
        rhs = f0 if i == 0 else field(arg, p)
        rhs = rhs + sum(c / h * k for c, k in zip(_RC[i], ks, strict=True))
        ks.append(jax.scipy.linalg.lu_solve(lu, rhs))
    y_new = arg + ks[5]
    return y_new, field(y_new, p), ks[5]


# method -> (step, exponent of the step-size controller: 1 / (embedded order + 1))
_METHODS = {"dopri5": (_dopri5_step, 1 / 5), "rodas4": (_rodas4_step, 1 / 4)}


def solve_ode_queue(
    field: Callable,
    stop: Callable,
    max_step: Callable,
    y0: Float[Array, "N m"],
    params,
    *,
    slots: int,
    rtol: float,
    atol: float,
    max_steps: int,
    h0: float,
    h_min: float,
    increment_relative=None,
    method: str = "dopri5",
    count=None,
) -> QueueResult:
    """Solve N independent ODEs dy/ds = field(y, p) with `slots` of them at a time.

    Args:
        field: (y (m,), p) -> dy/ds (m,), for one run (mapped over the slots
            by `map_runs`: where it, or RODAS's LU, calls LAPACK the slots go
            through in chunks that jaxlib runs inline).
        stop: (y, dy, y_prev, dy_prev, p, steps) -> int32 code after an accepted
            step (steps: attempted so far, this one included):
            0 to go on, > 0 to end the run with that code.
        max_step: (y, dy, p) -> largest allowed next step (e.g. to land on a
            horizon); `jnp.inf` for none.
        y0: initial states (N, m).
        params: pytree of per-run parameters, leading axis N on every leaf.
        slots: runs stepped together (at most N is used).
        rtol: relative tolerance: the step is accepted when the max norm of
            err / (atol + rtol max(|y|, |y_new|)) is <= 1.
        atol: absolute tolerance.
        max_steps: attempted steps per run before `OUT_OF_STEPS`.
        h0: first step of every run.
        h_min: steps below this end the run with `STEP_UNDERFLOW`.
        increment_relative: optional boolean mask (m,) of components whose relative
            error is measured against their increment over the step instead of
            their value (a clock such as t: near a singularity it moves by far
            less than rtol |t| per step, and must stay accurate to rtol of that).
        method: "dopri5" (explicit) or "rodas4" (linearly implicit, for stiff
            runs; the field must be differentiable in y).
        count: solve only the first `count` runs (may be traced, so one
            compilation serves any number of runs up to N); the others keep code
            0 and zero states.

    Returns:
        A `QueueResult`.
    """
    if method not in _METHODS:
        raise ValueError(f"`method` must be one of {sorted(_METHODS)}; got {method!r}.")
    rk_step, exponent = _METHODS[method]
    n, m = y0.shape
    slots = min(slots, n)
    dtype = y0.dtype
    count = jnp.asarray(n if count is None else count)
    # One LAPACK-safe chunk size for every per-slot map, from one trace of a step
    # and its stop rule (they hold every call of the field).
    h_like = y0[:, 0]
    batch = safe_batch(
        lambda y, p, h, k: (rk_step(field, y, y, p, h), stop(y, y, y, y, p, k)),
        y0,
        params,
        h_like,
        jnp.zeros((n,), jnp.int32),
    )
    per_slot = functools.partial(map_runs, batch=batch or slots)

    def take(idx):
        safe = jnp.minimum(idx, n - 1)
        p = jax.tree.map(lambda a: a[safe], params)
        y = y0[safe]
        return y, per_slot(field, y, p), p

    first = jnp.arange(slots)
    y, f, p = take(first)
    first = jnp.where(first < count, first, n)  # n: an empty slot
    state = dict(
        idx=first,
        y=y,
        f=f,
        p=p,
        h=jnp.minimum(jnp.asarray(h0, dtype), per_slot(max_step, y, f, p)),
        steps=jnp.zeros((slots,), jnp.int32),
        next=jnp.minimum(jnp.asarray(slots), count),
        out_y=jnp.zeros((n, m), dtype),
        out_f=jnp.zeros((n, m), dtype),
        out_code=jnp.zeros((n,), jnp.int32),
        out_steps=jnp.zeros((n,), jnp.int32),
        iterations=jnp.asarray(0),
    )

    def step(state):
        active = state["idx"] < n
        y, f, p, h = state["y"], state["f"], state["p"], state["h"]
        y_new, f_new, err = per_slot(lambda *a: rk_step(field, *a), y, f, p, h)
        size = jnp.maximum(jnp.abs(y), jnp.abs(y_new))
        if increment_relative is not None:
            size = jnp.where(increment_relative, jnp.abs(y_new - y), size)
        err_norm = jnp.max(jnp.abs(err / (atol + rtol * size)), axis=-1)
        ok = jnp.isfinite(err_norm) & jnp.all(jnp.isfinite(y_new), axis=-1)
        accept = active & ok & (err_norm <= 1)
        code = jnp.where(
            accept, per_slot(stop, y_new, f_new, y, f, p, state["steps"] + 1), 0
        )
        y = jnp.where(accept[:, None], y_new, y)
        f = jnp.where(accept[:, None], f_new, f)
        # Standard I-controller, growth at most 10x per step, 5x shrink on failure.
        factor = jnp.where(ok, 0.9 * jnp.maximum(err_norm, 1e-10) ** -exponent, 0.2)
        factor = jnp.clip(factor, 0.2, jnp.where(accept, 10.0, 1.0))
        h = jnp.minimum(h * factor, per_slot(max_step, y, f, p))
        steps = state["steps"] + active
        code = jnp.where(
            (code == 0) & active & ((h < h_min) | ~jnp.isfinite(h)),
            STEP_UNDERFLOW,
            code,
        )
        code = jnp.where(
            (code == 0) & active & (steps >= max_steps), OUT_OF_STEPS, code
        )
        done = active & (code != 0)
        where = jnp.where(done, state["idx"], n)  # n: dropped
        out_y = state["out_y"].at[where].set(y, mode="drop")
        out_f = state["out_f"].at[where].set(f, mode="drop")
        out_code = state["out_code"].at[where].set(code, mode="drop")
        out_steps = state["out_steps"].at[where].set(steps, mode="drop")
        # Refill the finished slots, in order, from the queue.
        new_idx = state["next"] + jnp.cumsum(done) - 1
        idx = jnp.where(done, jnp.where(new_idx < count, new_idx, n), state["idx"])

        def refill(args):
            y, f, p, h, steps = args
            y_in, f_in, p_in = take(idx)
            h_in = jnp.minimum(h0, per_slot(max_step, y_in, f_in, p_in))
            fresh = done & (idx < n)
            pick = lambda a, b: jnp.where(  # noqa: E731
                fresh.reshape((-1,) + (1,) * (a.ndim - 1)), a, b
            )
            return (
                pick(y_in, y),
                pick(f_in, f),
                jax.tree.map(pick, p_in, p),
                jnp.where(fresh, h_in, h),
                jnp.where(fresh, 0, steps),
            )

        y, f, p, h, steps = jax.lax.cond(
            jnp.any(done), refill, lambda a: a, (y, f, p, h, steps)
        )
        return dict(
            idx=idx,
            y=y,
            f=f,
            p=p,
            h=h,
            steps=steps,
            next=jnp.minimum(state["next"] + jnp.sum(done), count),
            out_y=out_y,
            out_f=out_f,
            out_code=out_code,
            out_steps=out_steps,
            iterations=state["iterations"] + 1,
        )

    state = jax.lax.while_loop(lambda s: jnp.any(s["idx"] < n), step, state)
    return QueueResult(
        y=state["out_y"],
        dy=state["out_f"],
        code=state["out_code"],
        steps=state["out_steps"],
        iterations=state["iterations"],
    )
