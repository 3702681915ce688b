"""Noise on the circle: the heat semigroup, split from the transport by Strang.

Tokens with independent Brownian motions, d theta_i = v dt + sigma dW_i, have the
density equation d_t rho + d_theta(rho v) = (sigma^2 / 2) d_theta^2 rho. On N cells
the diffusion is the three-point Laplacian, (D rho)_j = (sigma^2 / 2)
(rho_{j+1} - 2 rho_j + rho_{j-1}) / h^2, h = 2 pi / N: circulant, so its semigroup
e^{tD} multiplies the discrete Fourier coefficient k by

    exp(-(2 sigma^2 t / h^2) sin^2(kh / 2))
        = exp(-(sigma^2 k^2 t / 2) (1 - (kh)^2 / 12 + ...)),

applied exactly (to rounding) by FFT in O(N log N), whatever sigma^2 t / h^2 (an
explicit step would need dt <= h^2 / sigma^2). e^{tD} has entries >= 0 (D is 0 off
its three diagonals and >= 0 on the outer two) and columns summing to 1 (k = 0 is
multiplied by exactly 1): it keeps rho >= 0 and the mass, and contracts every L^p
norm. The FFT's rounding can leave cells that should be ~0 at -1e-16 max rho; they
are set to 0 and the mass restored by a factor 1 + O(eps).

A step is the Strang splitting (Strang, 1968)

    S(dt) = H(dt/2) T(dt) H(dt/2),

H the heat semigroup and T an SSPRK(4,3) step of the transport (`_ssp`): second
order in dt (symmetric), positive under the transport's CFL condition alone, which
the positive steps enforce by rejection. The error estimate is that of the
transport step, carried through the second H; the splitting error, O(dt^3) per
step, is not estimated (docs/math/density.md).
"""

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._ssp import PositiveSSPRK43, end_step, ssp_stages


def heat_rates(N: int, sigma: float) -> np.ndarray:
    """Exponents per unit time of e^{tD}, k = 0..N/2: -(2 sigma^2 / h^2) sin^2(kh/2)."""
    h = 2 * np.pi / N
    return -(2 * sigma**2 / h**2) * np.sin(0.5 * h * np.arange(N // 2 + 1)) ** 2


def heat(rho: Float[ArrayLike, "... N"], rates, tau) -> Float[Array, "... N"]:
    """e^{tau D} rho along the last axis (not clipped: rounding may leave -1e-16)."""
    decay = jnp.exp(tau * rates)
    rho_hat = jnp.fft.rfft(rho)
    decay = jnp.reshape(decay, (1,) * (rho_hat.ndim - 1) + decay.shape)
    return jnp.fft.irfft(rho_hat * decay, n=rho.shape[-1])


def _clip(rho, before):
    """Clip rho at 0 and give it the mass of `before`.

    e^{tD} >= 0 exactly, so the clip removes only the FFT's rounding (cells that
    should be ~0 at -1e-16 max rho), and the factor 1 + O(eps) takes back the
    mass it adds (else a drift of 1.7e-13 in 8 000 steps at N = 10^4, measured,
    where clusters leave cells near 0).
    """
    rho = jnp.maximum(rho, 0)
    return rho * (jnp.sum(before) / jnp.sum(rho))


class SplitHeatSSPRK43(PositiveSSPRK43):
    """Strang splitting of exact diffusion and a positive SSPRK(4,3) transport step.

    For an ODE term giving the transport rate of a density (N,) on the circle;
    `rates` (N // 2 + 1,) from `heat_rates`. Every accepted step is >= 0 exactly.
    """

    rates: Float[Array, " K"]

    def order(self, terms):
        # Strang splitting; the error estimate stays the transport's, O(dt^3).
        return 2

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del solver_state, made_jump
        half = 0.5 * (t1 - t0)
        start = _clip(heat(y0, self.rates, half), y0)
        u4, low, positive = ssp_stages(terms, t0, t1, start, args)
        # One transform for the step and its error (H is linear).
        end, error = heat(jnp.stack([u4, u4 - low]), self.rates, half)
        # NaN fails `>= 0` in the stages: a non-finite stage is rejected.
        error = jnp.where(positive, error, jnp.inf)
        return end_step(t0, t1, y0, _clip(end, u4), error, positive)
