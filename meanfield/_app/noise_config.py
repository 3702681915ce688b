"""The `[noise]` table of `meanfield simulate` and `meanfield phase`.

A Brownian forcing of the tokens: `kind` names the noise (`mf.IndependentNoise`
or `mf.CommonNoise`, "none" for the ODE), `sigma` its level and `seed` its
Brownian paths. A noise is defined with the normalizations of
`mf.simulate`'s noisy runs (none or "sphere"), read from the library, and a
positive `sigma` needs a noise `kind`. Both commands take the same table; only
how `seed` draws the paths differs, so each command writes that key's doc
(`noise_table`).
"""

import numpy as np

from .._noise import CommonNoise, IndependentNoise
from .._simulate_inputs import NOISY_NORMALIZATIONS as _LIBRARY_NORMALIZATIONS
from .config import Key, choice, integer, number, one_of

#: `[noise] kind` -> the noise of `mf.simulate` (None: no noise, the ODE).
NOISES = {"none": None, "independent": IndependentNoise, "common": CommonNoise}
#: The `normalization` keys a noise is defined with (`mf.simulate`'s None is "none").
NOISY_NORMALIZATIONS = tuple(
    "none" if name is None else name for name in _LIBRARY_NORMALIZATIONS
)
_NOISY = " or ".join(f'"{name}"' for name in NOISY_NORMALIZATIONS)
_KINDS = " or ".join(f'"{kind}"' for kind in NOISES if kind != "none")


def is_noisy(cfg) -> bool:
    """Whether a (partly) resolved configuration has a noise."""
    return cfg["noise"]["kind"] != "none"


def noise_kind(value, key, cfg):
    """`[noise] kind`: a key of NOISES; a noise only with a noisy normalization."""
    value = choice(NOISES)(value, key, cfg)
    if value != "none" and cfg["normalization"] not in NOISY_NORMALIZATIONS:
        raise ValueError(
            f'`{key}` = "{value}" needs `normalization` = {_NOISY} (a '
            f'noise is defined in R^d and on the sphere); got "{cfg["normalization"]}".'
        )
    return value


def noise_sigma(value, key, cfg):
    """`[noise] sigma`: a number >= 0, positive only with a noise `kind`."""
    value = number()(value, key, cfg)
    if value < 0:
        raise ValueError(f"`{key}` must be >= 0; got {value}.")
    if value > 0 and cfg["kind"] == "none":
        raise ValueError(
            f'`{key}` = {value} needs `noise.kind` = {_KINDS}; got "none".'
        )
    return value


def noise_table(seed_doc: str) -> dict:
    """The `[noise]` schema: `kind`, `sigma`, and `seed` documented by `seed_doc`.

    Args:
        seed_doc: the reference line of `seed`: how the command draws the
            Brownian paths from it.
    """
    return {
        "kind": Key(
            noise_kind,
            "none",
            doc='Brownian forcing of the tokens: `"none"`, `"independent"` (each '
            "token its own Brownian motion, dx_i = Γ(x_i) dt + σ dW^i) or "
            '`"common"` (one matrix Brownian motion B for all tokens, '
            "dx_i = Γ(x_i) dt + σ dB x_i); only with `normalization` = "
            f"{one_of(NOISY_NORMALIZATIONS)} (projected on the sphere).",
        ),
        "sigma": Key(
            noise_sigma,
            0.0,
            doc="Noise level σ ≥ 0, finite in `dtype` (at most 3.4e38 in "
            f"float32); positive only with `kind` = {one_of(list(NOISES)[1:])}.",
        ),
        "seed": Key(integer(0), 0, doc=seed_doc),
    }


def check_sigma_in_dtype(cfg) -> None:
    """`noise.sigma` of a resolved configuration is a finite number of its `dtype`.

    The run holds sigma in its dtype: 1e300 is inf in float32, which the noise
    refuses once the run has started (`dtype` may be resolved after `[noise]`).

    Raises:
        ValueError: sigma above the largest number of `dtype` (one line).
    """
    sigma, dtype = cfg["noise"]["sigma"], cfg["dtype"]
    largest = float(np.finfo(dtype).max)
    if sigma > largest:
        raise ValueError(
            f"`noise.sigma` must be <= {largest:.6g}, the largest {dtype} "
            f'(`dtype` = "{dtype}"); got {sigma}.'
        )


def build_noise(cfg: dict):
    """The noise of a resolved configuration (None for `kind` = "none").

    Args:
        cfg: a resolved configuration (its `[noise]` table).

    Returns:
        `mf.IndependentNoise(sigma)`, `mf.CommonNoise(sigma)` or None: as a
        script would build it (sigma a Python float; the tokens' dtype wins).
    """
    family = NOISES[cfg["noise"]["kind"]]
    return None if family is None else family(cfg["noise"]["sigma"])
