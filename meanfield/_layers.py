"""The discrete residual Transformer: L layers x <- x + h Gamma_mu(x).

The explicit Euler scheme of `simulate`'s ODE (first order in h); a `Block`
layer is an attention step then a feed-forward step (`_block`). With a noise each
layer adds a Brownian increment of `simulate`'s path (Euler-Maruyama).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _block, _noisy_solve, _normalization, _status
from ._attention.base import AbstractAttention
from ._checks import check_finite_times
from ._clock import clock_length
from ._dynamics import Solution, measure_on_sphere
from ._linalg import row_norms
from ._measures import AbstractParticles
from ._noise import AbstractNoise
from ._normalization import ON_SPHERE
from ._simulate_inputs import check_common, check_noise, mark_invalid_start


def layers(
    measure: AbstractParticles,
    attn: AbstractAttention,
    L: int,
    *,
    t1: float = 1.0,
    normalization: str | None = None,
    ngpt_alpha: float = 0.2,
    blowup_radius: float = 1e8,
    noise: AbstractNoise | None = None,
    key: jax.Array | None = None,
    splitting: str = "lie",
) -> Solution:
    """Discrete residual Transformer: L layers x <- x + h Gamma_mu(t_l)(x), h = t1 / L.

    Layer l uses the parameters at t_l = l h (so a `PiecewiseConstant` with L values
    on [0, t1] gives each layer its own weights). This is the explicit Euler scheme
    of `simulate`, first order in h (Castin et al., 2025).

    See [Layers: the explicit Euler scheme][math-layers], and
    [Where the LayerNorm sits][math-normalizations] for the block of each normalization
    and its limit.

    Args:
        measure: initial `Particles` or `MaskedParticles`.
        attn: the attention velocity field.
        L: number of layers (>= 1).
        t1: total depth time.
        normalization: the residual block (`meanfield._normalization`): None
            (x + h Attn(x)), "sphere" (post-LN: x <- (x + h P_x^perp Gamma) / |...|),
            "pre-ln" (x + h Attn(Norm x)), "peri-ln" (x + h Norm(Attn(Norm x))),
            "ngpt" (Norm(x + alpha h (Norm(Attn x) - x))).
        ngpt_alpha: the step scale alpha of "ngpt".
        blowup_radius: a layer whose output exceeds it (or is non-finite) stops the
            stack: status "blowup" at that layer's time, later rows +inf.
        noise: None, or a noise for normalization None or "sphere": each block
            adds sigma g(x) (W(t_{l+1}) - W(t_l)) (Euler-Maruyama; projected and
            normalised on the sphere), W the path of `simulate` with this key.
        key: the PRNG key of that path, required with `noise` ([Noise][math-noise]).
        splitting: for an `mf.Block`: "lie" (an attention step, then a
            feed-forward step: a Transformer layer, first order) or "strang"
            (F(h/2), Gamma(h), F(h/2) by explicit midpoint steps: second order,
            without noise). Ignored by other fields ([Feed-forward
            layers][math-feedforward]).

    Returns:
        A `Solution` with T = L + 1 saved states (ts = l h). Traced inputs that
        `simulate` would mark (a zero token under a normalization, a start at
        or beyond `blowup_radius`, a negative, NaN or infinite noise sigma)
        give status "invalid_input".
    """
    measure = check_common(measure, attn, normalization)
    check_noise(noise, key, normalization)
    splitting = _block.check_splitting(splitting, attn, noise)
    check_finite_times(t1=t1)
    if int(L) != L or L < 1:
        raise ValueError(f"`L` must be an integer >= 1; got {L!r}.")
    L = int(L)
    if not float(t1) > 0:
        raise ValueError(f"`t1` must be positive; got {t1}.")
    dtype = measure.x.dtype
    if not blowup_radius > 0:
        raise ValueError(f"`blowup_radius` must be positive; got {blowup_radius}.")
    # Depth, radius and the Brownian path's clock as traced arrays: a new t1 or
    # radius reuses the compiled stack (one compilation per measure/attention
    # structure, shapes and L).
    sol = _layers(
        measure,
        attn,
        noise,
        key,
        np.asarray(t1, dtype),
        np.asarray(blowup_radius, dtype),
        None if noise is None else np.asarray(clock_length(0.0, t1), dtype),
        L=L,
        normalization=normalization,
        alpha=float(ngpt_alpha),
        splitting=splitting,
    )
    # The host checks of the tokens and of noise.sigma, made on traced inputs.
    return mark_invalid_start(sol, measure.x, normalization, blowup_radius, noise)


@eqx.filter_jit
def _layers(
    measure,
    attn,
    noise,
    key,
    t1,
    blowup_radius,
    length,
    *,
    L,
    normalization,
    alpha,
    splitting,
) -> Solution:
    """The scan of `layers` (arguments validated there)."""
    if normalization in ON_SPHERE:
        measure = measure_on_sphere(measure)
    x0 = measure.x
    dtype = x0.dtype
    h = t1 / L
    dws = None
    if noise is not None:  # the Brownian increments of the L blocks
        dws = _noisy_solve.layer_increments(noise, key, x0, t1, L, length)

    def layer(carry, inputs):
        (x, stopped, t_stop, ok_all), (l, dw) = carry, inputs
        t = l * h

        def step(field, x):  # one residual (sub-)block of `field`
            block = (field, measure, x, t, h, normalization, alpha)
            if noise is None:
                return _normalization.layer(*block)
            return _noisy_solve.noisy_layer(*block, noise, dw)

        if isinstance(attn, _block.Block):
            x_new, ok = _block.block_layer(
                attn, measure, x, t, h, normalization, alpha, splitting, step
            )
        else:
            x_new, ok = step(attn, x)
        bad = ~jnp.all(jnp.isfinite(x_new)) | (
            jnp.max(row_norms(x_new)) >= blowup_radius
        )
        newly = bad & ~stopped
        t_stop = jnp.where(newly, t + h, t_stop)
        stopped = stopped | bad
        ok_all = ok_all & (ok | stopped)
        # Record the layer that blew up as it is; freeze the state after it and
        # report later rows as +inf.
        out = jnp.where(carry[1], jnp.inf, x_new)
        x_next = jnp.where(stopped, x, x_new)
        return (x_next, stopped, t_stop, ok_all), out

    init = (x0, jnp.array(False), jnp.asarray(jnp.inf, dtype), jnp.array(True))
    (_, stopped, t_stop, ok_all), xs = jax.lax.scan(layer, init, (jnp.arange(L), dws))
    xs = jnp.concatenate([x0[None], xs], axis=0)
    ts = jnp.arange(L + 1, dtype=dtype) * h
    ts = jnp.where(ts > t_stop, jnp.inf, ts)
    result = jnp.where(
        stopped,
        _status.BLOWUP,
        jnp.where(ok_all, _status.SUCCESS, _status.SINKHORN_NOT_CONVERGED),
    )
    return Solution(
        ts=ts,
        x=xs,
        blowup_time=t_stop,
        result=result,
        t_final=jnp.where(stopped, t_stop, t1),
        num_steps=jnp.asarray(L),
        initial=measure,
    )
