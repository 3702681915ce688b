"""An adaptive step-size controller whose smallest step is set by the current time.

diffrax's `PIDController(dtmin=...)` takes one floor for the whole solve. A floor
that must hold at every time of [t0, t1] is 100 ulps of max(|t0|, |t1|): it grows
with the horizon, so a solve to t1 = 1e300 could take no step shorter than 1e286
and ended at once. Here the floor is 100 ulps of max(|t|, 1) at the step's own
start t: the resolution the time grid really has there, the same on any horizon.
"""

from __future__ import annotations

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp

# A step shorter than this many ulps of t barely moves t: the solution cannot be
# resolved further (close to a blow-up, or too stiff for the dtype).
FLOOR_ULPS = 100


def step_floor(t, dtype):
    """Smallest useful step at time t: FLOOR_ULPS ulps of max(|t|, 1)."""
    return FLOOR_ULPS * jnp.finfo(dtype).eps * jnp.maximum(jnp.abs(t), 1)


class FlooredPIDController(dfx.PIDController):
    """`dfx.PIDController` whose floor on the step follows the current time.

    It ends the solve with `RESULTS.dt_min_reached` when the next step would be
    shorter than `step_floor` at its start. Use it without `dtmin`: the floor
    replaces diffrax's fixed one. The solver's time is s on the solver clock
    (`_clock`), t = t_start + s dt_ds: the floor is taken at t, converted to s.

    Attributes:
        t_start: t at solver time 0.
        dt_ds: dt/ds.
    """

    # Keyword-only and required: PIDController's own fields all have defaults.
    t_start: jax.Array = eqx.field(kw_only=True)
    dt_ds: jax.Array = eqx.field(kw_only=True)

    def adapt_step_size(
        self, t0, t1, y0, y1_candidate, args, y_error, error_order, state
    ):
        keep, next_t0, next_t1, jump, state, result = super().adapt_step_size(
            t0, t1, y0, y1_candidate, args, y_error, error_order, state
        )
        t = self.t_start + next_t0 * self.dt_ds
        floor = step_floor(t, jnp.result_type(next_t0)) / self.dt_ds
        too_short = (next_t1 - next_t0) < floor
        result = dfx.RESULTS.where(too_short, dfx.RESULTS.dt_min_reached, result)
        return keep, next_t0, next_t1, jump, state, result
