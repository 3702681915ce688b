"""A positivity-preserving Runge-Kutta solver: SSPRK(4,3) with an embedded pair.

The finite-volume scheme of `density.simulate` keeps rho >= 0 in semi-discrete
form, and so does its forward Euler step, but only under a CFL condition
(docs/math/density.md). An adaptive Runge-Kutta method such as Tsit5 is not a
convex combination of Euler steps, and went below 0 (-1e-7 at beta = 7,
unnormalised, with status "success"). The strong-stability-preserving method
SSPRK(4,3) (Kraaijevanger 1991; Gottlieb, Ketcheson & Shu, 2011, sec. 6.2) is

    u1 = u + dt/2 L(u),    u2 = u1 + dt/2 L(u1),
    u3 = 2/3 u + 1/3 (u2 + dt/2 L(u2)),    u4 = u3 + dt/2 L(u3):

third order, each stage u or a convex combination of u and of forward Euler
steps of size dt/2, so positive for twice the Euler step (SSP coefficient 2,
against 1 for SSPRK(3,3): the same positive step for 4 evaluations instead of
6). Its stages contain the second-order SSPRK(3,2),
1/3 u + 2/3 (u2 + dt/2 L(u2)): the difference is the error estimate.

`step` checks that every Euler step is >= 0 as computed; when one is not, the
step reports an infinite error, so the controller rejects it and shrinks dt
until the CFL condition holds. Sums and positive multiples of floats >= 0 are
>= 0 in IEEE arithmetic, so every accepted step is >= 0 exactly, not to
rounding. A rejected step shorter than 100 ulps of t ends the solve
(`RESULTS.dt_min_reached`).
"""

from collections.abc import Callable
from typing import ClassVar

import diffrax as dfx
import jax.numpy as jnp

from .._step_floor import FLOOR_ULPS


def ssp_stages(terms, t0, t1, y0, args):
    """The stages of one SSPRK(4,3) step from t0 to t1.

    Returns:
        (u4, low, positive): the third-order step, the second-order SSPRK(3,2)
        step, and whether every forward Euler stage is >= 0 as computed.
    """
    half = 0.5 * terms.contr(t0, t1)
    mid = t0 + 0.5 * (t1 - t0)
    u1 = y0 + terms.vf_prod(t0, y0, args, half)
    u2 = u1 + terms.vf_prod(mid, u1, args, half)
    euler3 = u2 + terms.vf_prod(t1, u2, args, half)
    # euler3 + c (y0 - euler3) rather than c y0 + (1 - c) euler3: the float
    # coefficients 2/3 and 1/3 do not sum to 1, which would drift the mass
    # by an ulp per step. Still >= 0: euler3 - c euler3 (1 + eps) > 0.
    gap = y0 - euler3
    u3 = euler3 + (2 / 3) * gap
    u4 = u3 + terms.vf_prod(mid, u3, args, half)
    low = euler3 + gap / 3  # SSPRK(3,2)
    positive = (jnp.all(u1 >= 0) & jnp.all(u2 >= 0) & jnp.all(euler3 >= 0)) & jnp.all(
        u4 >= 0
    )
    return u4, low, positive


def end_step(t0, t1, y0, y1, error, positive):
    """The output of a step for diffrax: (y1, error, dense info, state, result).

    A rejected step that no longer moves t (100 ulps of t, or dt = 0 once the
    controller's shrinks underflow, at t = 0) cannot be cured by a smaller one:
    keep y0 and end the solve (diffrax drops the result of rejected steps, so
    this one is "kept").
    """
    floor = FLOOR_ULPS * jnp.finfo(jnp.result_type(t0)).eps * jnp.abs(t0)
    stuck = ~positive & ((t1 - t0) <= floor)
    y1 = jnp.where(stuck, y0, y1)
    error = jnp.where(stuck, 0.0, error)
    result = dfx.RESULTS.where(
        stuck, dfx.RESULTS.dt_min_reached, dfx.RESULTS.successful
    )
    return y1, error, dict(y0=y0, y1=y1), None, result


class PositiveSSPRK43(dfx.AbstractAdaptiveSolver):
    """SSPRK(4,3) whose steps are rejected unless every Euler stage is >= 0.

    For ODE terms on an array state that must stay nonnegative. Local linear
    interpolation between steps (a convex combination: positive too); step to
    the save times (`dfx.ClipStepSizeController(step_ts=...)`) to read them
    without interpolation error.
    """

    term_structure: ClassVar = dfx.AbstractTerm
    interpolation_cls: ClassVar[Callable[..., dfx.LocalLinearInterpolation]] = (
        dfx.LocalLinearInterpolation
    )

    def order(self, terms):
        return 3

    def error_order(self, terms):
        # The estimate is the local error of the second-order pair: O(dt^3).
        return 3

    def init(self, terms, t0, t1, y0, args):
        return None

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del solver_state, made_jump
        u4, low, positive = ssp_stages(terms, t0, t1, y0, args)
        # NaN fails `>= 0` too: a non-finite stage is rejected, never kept.
        error = jnp.where(positive, u4 - low, jnp.inf)
        return end_step(t0, t1, y0, u4, error, positive)

    def func(self, terms, t0, y0, args):
        return terms.vf(t0, y0, args)
