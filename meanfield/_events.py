"""How a particle solve ends: the stop event, its root finder, end state and status.

`simulate` stops on one diffrax event (a radius crossing, or the "blowing up" flag
of the field) located by bisection, or at the step floor (`_step_floor`). Under
`jax.vmap` (`mf.simulate_ensemble`) diffrax 0.7 runs the event's root find for every
member as soon as one member's event fired. For the others it bisects t_end - t,
t_end the end of their last attempted step; `optx.Bisection(flip=False)` then
converged to the step's start and never terminated, so a member that had reached
t1 came back with "nonlinear_max_steps_reached", its stop one step early and its
last saves deleted. Here:
- `SignBisection` detects the orientation of each member's bracket and terminates
  on its width alone: such a member's root is t_end exactly, and its result is
  left as it was;
- `EndTrackingPID` carries the last accepted (s, y) in its state: diffrax's
  t_end is a rejected step's end when the last step was rejected (max_steps, the
  step floor), so a member without an event reads its end from there, exactly as
  a solo solve (which skips the root find) does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx

from . import _status
from ._linalg import row_norms
from ._step_floor import FlooredPIDController, step_floor

#: A step-floor stop is a blow-up when the singularity extrapolated from the
#: radius there is within this many floor steps (as for one Gaussian).
FLOOR_STEPS = 1000


def stop_condition(log_radius, dtype):
    """The event's condition (s, y) -> scalar, positive once the solve must stop.

    max(log max_i |x_i| - log R, |F| - tiny), F the integrated "blowing up" flag
    (`_dynamics.velocity_field`): one scalar, so bisection on its sign finds the
    first crossing in the step (no Jacobian or linear solve to compile, unlike
    Newton). The log keeps it O(1) in float32. F is 0 until the first flagged step,
    then ~ c (s - s_flag), so its root is the flag time. (A boolean condition would
    be simpler, but diffrax 0.7 mixes dtypes on it.)
    """
    tiny = jnp.finfo(dtype).tiny
    # diffrax compares condition values with a Python 0.0 inside a lax.cond, so
    # they must be in the default float dtype (float64 under x64).
    cond_dtype = jnp.result_type(float)

    def stopping(t, y, args, **kwargs):
        radius = jnp.maximum(jnp.max(row_norms(y[0])), tiny)
        crossed = jnp.log(radius) - log_radius
        return jnp.maximum(crossed, jnp.abs(y[1][0]) - tiny).astype(cond_dtype)

    return stopping


class _BracketState(eqx.Module):
    lower: jax.Array
    upper: jax.Array
    checked: jax.Array  # f(upper) evaluated (the first step)
    at_end: jax.Array  # f(upper) <= 0: the answer is upper


class SignBisection(optx.AbstractRootFinder):
    """Bisection for the first t in (lower, upper] with f(t) > 0, per member.

    It returns the final bracket's upper end, where f > 0. Where f(upper) <= 0
    there is no such t and it returns `upper` itself, exactly: diffrax's bracket
    for a vmapped member without an event (f = t_end - t). No error when both
    ends have one sign (`optx.Bisection(flip="detect")` raises one), and the
    iteration stops on the bracket's width alone (f jumps where the flag rises,
    so |f| need not become small). The first step evaluates f(upper), the others
    f(midpoint), at one call site: f (diffrax's interpolation and the stop
    condition) is traced and compiled once, not also in `init`.

    Attributes:
        rtol: relative width of the final bracket.
        atol: absolute width of the final bracket.
    """

    rtol: float
    atol: float
    norm: ClassVar = jnp.abs

    def init(self, fn, y, args, options, f_struct, aux_struct, tags):
        lower = jnp.asarray(options["lower"], f_struct.dtype)
        upper = jnp.asarray(options["upper"], f_struct.dtype)
        false = jnp.asarray(False)
        return _BracketState(lower=lower, upper=upper, checked=false, at_end=false)

    def step(self, fn, y, args, options, state, tags):
        mid = state.lower + 0.5 * (state.upper - state.lower)
        value, aux = fn(jnp.where(state.checked, mid, state.upper), args)
        # An event's condition holds at the bracket's end (> 0); diffrax's
        # stand-in for a member without an event, t_end - t, is 0 there.
        at_end = jnp.where(state.checked, state.at_end, value <= 0)
        after = state.checked & (value > 0)  # past the root: the condition holds
        before = state.checked & ~after
        lower = jnp.where(before, mid, state.lower)
        upper = jnp.where(after, mid, state.upper)
        state = _BracketState(
            lower=lower, upper=upper, checked=jnp.asarray(True), at_end=at_end
        )
        return upper, state, aux

    def terminate(self, fn, y, args, options, state, tags):
        width = state.upper - state.lower
        done = width <= self.atol + self.rtol * jnp.abs(state.upper)
        return done | state.at_end, optx.RESULTS.successful

    def postprocess(self, fn, y, aux, args, options, state, tags, result):
        return y, aux, {}


class EndTrackingPID(FlooredPIDController):
    """`FlooredPIDController` whose state also carries the last accepted (s, y).

    State: (the PID state, s, y) at the end of the last accepted step, read back
    with `diffrax.SaveAt(controller_state=True)`.
    """

    def init(self, terms, t0, t1, y0, dt0, args, func, error_order):
        tnext, inner = super().init(terms, t0, t1, y0, dt0, args, func, error_order)
        return tnext, (inner, jnp.asarray(t0), y0)

    def adapt_step_size(
        self, t0, t1, y0, y1_candidate, args, y_error, error_order, state
    ):
        keep, next_t0, next_t1, jump, inner, result = super().adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, state[0]
        )
        y = jax.tree.map(lambda a, b: jnp.where(keep, a, b), y1_candidate, y0)
        s = jnp.where(keep, t1, t0).astype(jnp.result_type(state[1]))
        return keep, next_t0, next_t1, jump, (inner, s, y), result


def singular_soon(velocity: Callable, x, t, start_radius):
    """Blow-up evidence at a step-floor stop: a singularity extrapolated close by.

    r(t) = |x_i(t)|, i the farthest token. If r ~ c (t* - t)^{-p}, then
    r r'' / r'^2 = (p + 1) / p and t* - t = p r / r' (docs/math/blowup.md); r'
    and r'' along the flow come from the field (r'' by a finite difference). The
    evidence is that r has grown since t0 and t* - t is positive and below
    FLOOR_STEPS floor steps at t. Exponential growth (r r'' / r'^2 = 1), a
    bounded or shrinking radius, or a step too short from the start because the
    tolerance is below the dtype's resolution give none: such a run is "failed".

    Args:
        velocity: (x, t) -> dx/dt (n, d).
        x: the state (n, d) where the solve stopped.
        t: the time of that state.
        start_radius: max_i |x_i| at t0.
    """
    i = jnp.argmax(row_norms(x))

    def rate(x, v):  # r' = <x_i, v_i> / |x_i|
        return jnp.dot(x[i], v[i]) / row_norms(x[i])

    t = jnp.asarray(t, x.dtype)
    radius, v = row_norms(x[i]), velocity(x, t)
    dr = rate(x, v)
    # r'' by a forward difference along the flow over sqrt(eps) e-folding times:
    # truncation and rounding both ~ sqrt(eps) q relative. (A jax.jvp of the
    # field would be exact, but it costs 7x the field's compilation.)
    h = jnp.sqrt(jnp.finfo(x.dtype).eps) * radius / jnp.where(dr > 0, dr, 1)
    ddr = (rate(x + h * v, velocity(x + h * v, t + h)) - dr) / h
    q = radius * ddr / jnp.where(dr != 0, dr**2, 1)
    ok = (radius > start_radius) & (dr > 0) & (q > 1) & jnp.isfinite(q)
    remaining = radius / jnp.where(ok, (q - 1) * dr, 1)
    return ok & (remaining < FLOOR_STEPS * step_floor(t, x.dtype))


def final_status(dfx_result, flags, floor_blowup):
    """(meanfield result code, blew up) from diffrax's result and the flags.

    An event (radius crossing, overflow, e-folding collapse) is a blow-up; a step
    floor is one only with growth evidence (`grows_to_blowup`), else "failed".
    """
    code = jnp.where(
        dfx_result == dfx.RESULTS.max_steps_reached, _status.MAX_STEPS, _status.FAILED
    )
    code = jnp.where(dfx_result == dfx.RESULTS.successful, _status.SUCCESS, code)
    blew_up = (dfx_result == dfx.RESULTS.event_occurred) | (
        (dfx_result == dfx.RESULTS.dt_min_reached) & floor_blowup
    )
    code = jnp.where(blew_up, _status.BLOWUP, code)
    # A field from unconverged Sinkhorn iterations is not the model's: its status
    # wins over a blow-up seen through it (Sinkhorn attention is bounded, |V| R,
    # so a flagged blow-up there comes from the failed solve, e.g. overflowing
    # logits, not from the dynamics).
    sinkhorn_failed = flags[1] != 0
    code = jnp.where(sinkhorn_failed, _status.SINKHORN_NOT_CONVERGED, code)
    return code, blew_up & ~sinkhorn_failed
