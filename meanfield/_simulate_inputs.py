"""Checks of the inputs of `mf.simulate` (and of every `mf.simulate_ensemble` system).

Two value checks read the initial tokens: no zero token under a normalization
that needs its direction, and a start strictly inside `blowup_radius` (only an
upward crossing is an event: a start at or beyond it would run as if nothing
happened). Concrete tokens are checked on the host, a ValueError naming the rows,
or the systems of an ensemble's (B, n, d) tokens, before anything is vmapped.
Traced tokens (a caller's jax.jit or jax.vmap) cannot raise for one member
without stopping all of them: `invalid_start` gives a traced flag, and the solve
reports status "invalid_input" for that member only; so does a traced noise
level that is negative, NaN or infinite (`invalid_noise`).

A noise (`_noise`) needs a PRNG key, and a normalization for which its SDE is
defined: `check_noise`.
"""

import math

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _status
from ._attention.base import AbstractAttention
from ._checks import host_array, is_traced
from ._linalg import host_row_norms, row_norms
from ._measures import AbstractParticles
from ._noise import AbstractNoise
from ._normalization import NORMALIZATIONS, ON_SPHERE, needs_directions

#: Normalizations under which a noise's SDE is defined (docs/math/noise.md).
NOISY_NORMALIZATIONS = (None, "sphere")

#: Token dtypes of an adaptive solve: in half precision 100 ulps of t are 0.1
#: (float16) or 0.8 (bfloat16) at t = 1, so the step floor ends every solve.
SUPPORTED_DTYPES = ("float32", "float64")


def _listed(indices: np.ndarray) -> str:
    return f"{indices[:5].tolist()}" + (" ..." if indices.size > 5 else "")


def check_common(measure, attn, normalization):
    """ValueError for a measure, attention or normalization no particle solve takes.

    Returns the measure. Concrete tokens are checked for zero rows when the
    normalization needs their directions.
    """
    if not isinstance(measure, AbstractParticles):
        raise ValueError(
            "`measure` must be `Particles` or `MaskedParticles`; got "
            f"{type(measure).__name__} (for a Gaussian use `mf.gaussian.simulate`)."
        )
    if not isinstance(attn, AbstractAttention):
        raise ValueError(
            f"`attn` must be an attention module; got {type(attn).__name__}."
        )
    if normalization not in NORMALIZATIONS:
        raise ValueError(
            f"`normalization` must be one of {NORMALIZATIONS}; got {normalization!r}."
        )
    if needs_directions(normalization) and not is_traced(measure.x):
        check_start(measure.x, normalization, math.inf)
    return measure


def is_key(key) -> bool:
    """Whether `key` is a JAX PRNG key: jax.random.key(seed), or a raw uint32 (2,)."""
    dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
    if dtype is None:
        return False
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return shape == ()
    return dtype == np.uint32 and shape == (2,)  # jax.random.PRNGKey(seed)


def check_noise(noise, key, normalization, *, batch: int | None = None) -> None:
    """ValueError for a noise, key or normalization a noisy solve cannot take.

    `batch` is the ensemble size B (`simulate_ensemble`), where sigma may carry
    a leading batch axis of size B; one solve takes a scalar sigma.

    Raises:
        ValueError: a key without noise; noise that is not an `AbstractNoise`;
            noise without a key, or a key that is not a JAX PRNG key; a
            normalization other than None or "sphere"; sigma of another shape,
            or (concrete) a sigma, or a system's, negative, NaN or infinite.
    """
    if noise is None:
        if key is not None:
            raise ValueError(
                "`key` draws the Brownian path of `noise`; pass `noise` too "
                "(e.g. mf.IndependentNoise(0.1)), or no key."
            )
        return
    if not isinstance(noise, AbstractNoise):
        raise ValueError(
            "`noise` must be mf.IndependentNoise(sigma), mf.CommonNoise(sigma) or "
            f"None; got {type(noise).__name__}."
        )
    if key is None:
        raise ValueError(
            "`noise` needs a random key: pass key=jax.random.key(seed) (one key, "
            "one Brownian path)."
        )
    if not is_key(key):
        raise ValueError(
            "`key` must be a JAX PRNG key, jax.random.key(seed); got "
            f"{type(key).__name__} {getattr(key, 'dtype', '')}"
            f"{getattr(key, 'shape', '')}."
        )
    if normalization not in NOISY_NORMALIZATIONS:
        raise ValueError(
            f"`noise` is defined with normalization None (in R^d) or 'sphere'; got "
            f"normalization={normalization!r}."
        )
    shape = jnp.shape(noise.sigma)
    if shape not in ((), (batch,)):
        want = "a scalar" if batch is None else f"a scalar or shape ({batch},)"
        raise ValueError(f"`noise.sigma` must be {want}; got shape {shape}.")
    if not is_traced(noise.sigma):
        # The constructor checks a scalar; a batch of them (jax.vmap of the
        # constructor, where sigma was traced) is checked here, per system.
        sigma = host_array(noise.sigma)
        bad = ~(np.isfinite(sigma) & (sigma >= 0))
        if np.any(bad):
            where = (
                f"systems {_listed(np.flatnonzero(bad))} have {_listed(sigma[bad])}"
                if shape
                else f"got {float(sigma)}"
            )
            raise ValueError(f"`noise.sigma` must be finite and >= 0; {where}.")


def check_start(x, normalization, blowup_radius: float, name="measure") -> None:
    """ValueError if the concrete tokens x (n, d), or (B, n, d), cannot start.

    `name` is the argument that holds them, for the message.

    Raises:
        ValueError: a zero token under a normalization, or max_i |x_i| not below
            `blowup_radius` (in any system of a batch).
    """
    x = host_array(x)
    batched = x.ndim == 3
    if needs_directions(normalization):
        zero = ~np.any(x != 0, axis=-1)  # (..., n)
        if zero.any():
            where = (
                f"systems {_listed(np.flatnonzero(zero.any(axis=-1)))} hold one"
                if batched
                else f"rows {_listed(np.flatnonzero(zero))} are zero"
            )
            raise ValueError(
                f"`{name}` must have no zero token with "
                f"normalization={normalization!r} (it has no direction); {where}."
            )
    # On the sphere every token starts at radius 1.
    shape = x.shape[:-2]
    if normalization in ON_SPHERE:
        start = np.ones(shape)
    else:
        start = host_row_norms(x).max(-1).astype(np.float64)
    outside = ~(start < blowup_radius)
    if np.any(outside):
        if batched:
            members = np.flatnonzero(outside)
            where = (
                "every system's initial radius max_i |x_i|; systems "
                f"{_listed(members)} start at {np.max(start[members]):g} or beyond"
            )
        else:
            where = f"the initial radius max_i |x_i| = {float(start):g}"
        raise ValueError(f"`blowup_radius` must exceed {where}; got {blowup_radius}.")


def invalid_start(x, normalization, blowup_radius: float):
    """Traced flag: the tokens x (n, d) fail a check of `check_start`."""
    bad = jnp.asarray(False)
    if needs_directions(normalization):
        bad = jnp.any(jnp.all(x == 0, axis=-1))
    if normalization not in ON_SPHERE:
        bad = bad | ~(jnp.max(row_norms(x)) < blowup_radius)
    return bad


def invalid_noise(noise):
    """Traced flag: the noise level `noise.sigma` is negative, NaN or infinite."""
    sigma = noise.sigma
    return jnp.any(~(jnp.isfinite(sigma) & (sigma >= 0)))


def mark_invalid_start(sol, x, normalization, blowup_radius: float, noise=None):
    """`sol` with status "invalid_input" and no blow-up time where an input fails.

    The checks that concrete inputs get on the host (`check_start`,
    `check_noise`), made on traced ones: tokens x (n, d) that fail
    `invalid_start`, and a `noise` whose sigma fails `invalid_noise`. Concrete
    inputs (already checked) are skipped: `sol` comes back as it is when
    neither is traced. `sol` is a particle `Solution`.
    """
    bad = None
    if is_traced(x):
        bad = invalid_start(x, normalization, blowup_radius)
    if noise is not None and is_traced(noise.sigma):
        wrong = invalid_noise(noise)
        bad = wrong if bad is None else bad | wrong
    if bad is None:
        return sol
    return eqx.tree_at(
        lambda s: (s.result, s.blowup_time),
        sol,
        (
            jnp.where(bad, _status.INVALID_INPUT, sol.result),
            jnp.where(bad, jnp.inf, sol.blowup_time),
        ),
    )


def check_options(dtype, max_steps, adjoint, ngpt_alpha) -> None:
    """ValueError for a token dtype, step budget, adjoint or ngpt_alpha no solve takes.

    Raises:
        ValueError: a dtype outside SUPPORTED_DTYPES, `max_steps` not an integer
            >= 1 (2.7 is not truncated), `adjoint` not a diffrax adjoint or None,
            `ngpt_alpha` not a finite number.
    """
    if jnp.dtype(dtype).name not in SUPPORTED_DTYPES:
        raise ValueError(
            f"`measure` must hold tokens of dtype {' or '.join(SUPPORTED_DTYPES)} "
            f"(the solver's time and step floor need their resolution); got "
            f"{jnp.dtype(dtype).name}: pass x.astype(jnp.float32)."
        )
    if isinstance(max_steps, bool) or not is_integer(max_steps) or max_steps < 1:
        raise ValueError(f"`max_steps` must be an integer >= 1; got {max_steps!r}.")
    if adjoint is not None and not isinstance(adjoint, dfx.AbstractAdjoint):
        raise ValueError(
            "`adjoint` must be a diffrax adjoint (e.g. diffrax.ForwardMode()) or "
            f"None; got {adjoint!r}."
        )
    if not math.isfinite(float(ngpt_alpha)):
        raise ValueError(f"`ngpt_alpha` must be a finite number; got {ngpt_alpha!r}.")


def is_integer(value) -> bool:
    """Whether `value` is a whole number: 3 or 3.0, never 2.7 (int() truncates)."""
    try:
        return int(value) == value
    except (TypeError, ValueError, OverflowError):
        return False
