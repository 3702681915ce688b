"""The interaction energy of a weighted point measure, and its value over time.

    E_beta(mu) = 1/(2 beta) sum_ij w_i w_j e^{beta <x_i, x_j>}

is the Lyapunov function of the sphere dynamics with A = beta I, V = I: it does not
decrease along softmax or unnormalised attention (docs/math/energy.md). Its plateaus
in log time are the metastable states of Geshkovski, Koubbi, Polyanskiy &
Rigollet ("Dynamic metastability in the self-attention model", 2024) and Bruno,
Pasqualotto & Agazzi (ICLR 2025): an "energy staircase", one step per merge of
two clusters.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._dynamics import Solution
from .._kernels import blocked
from .._kernels.dense import log_weights
from .._measures import AbstractParticles


@eqx.filter_jit
def _log_energy(x: Float[Array, "n d"], w: Float[Array, " n"], beta) -> Array:
    """Log E_beta, blocked: never an (n, n) matrix, finite for any beta."""
    log_w = log_weights(w)
    # rows_i = log sum_j w_j e^{beta <x_i, x_j>}
    rows = blocked.bilinear_logsumexp(beta * x, x, log_w)
    return jax.nn.logsumexp(rows + log_w) - jnp.log(2 * beta)


def energy(
    state: AbstractParticles | Solution, beta: float, *, log: bool = False
) -> Array:
    """Interaction energy E = 1/(2 beta) sum_ij w_i w_j e^{beta <x_i, x_j>}.

    Computed as a blocked log-sum-exp in O(n) memory. E grows like e^{beta}
    on the unit sphere: `log=True` returns log E, finite for any beta (E itself
    overflows float64 beyond beta ~ 700).

    See [The energy increases along the dynamics][math-energy-monotone].

    Args:
        state: a measure (`Particles`, `MaskedParticles`: positions and weights),
            or a `Solution`, whose every save time gets an energy.
        beta: the inverse temperature, > 0.
        log: return log E instead of E.

    Returns:
        Shape () for a measure; (T,) for a `Solution`, NaN at save times that
        were not reached (`Solution.reached` is False there; its `status` says
        why).

    Raises:
        ValueError: `beta` not positive and finite, or `state` of another type.
    """
    beta_value = float(beta)
    if not (np.isfinite(beta_value) and beta_value > 0):
        raise ValueError(f"`beta` must be positive and finite; got {beta}.")
    if isinstance(state, Solution):
        w, x = state.initial.weights, state.x
        beta_arr = jnp.asarray(beta_value, x.dtype)
        values = jax.vmap(lambda xt: _log_energy(xt, w, beta_arr))(
            jnp.where(state.reached[:, None, None], x, 0)
        )
        values = jnp.where(state.reached, values, jnp.nan)
    elif isinstance(state, AbstractParticles):
        x = state.x
        values = _log_energy(x, state.weights, jnp.asarray(beta_value, x.dtype))
    else:
        raise ValueError(
            "`state` must be a particle measure or a Solution; "
            f"got {type(state).__name__}."
        )
    return values if log else jnp.exp(values)
