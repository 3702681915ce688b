"""A Transformer block in continuous time: attention plus a feed-forward layer.

The field of a residual block is x' = Gamma_mu(x) + F(x) (`Block`). Its discrete
layers (`mf.layers`) split the two parts as a Transformer does:

    "lie"     x <- Φ^F_h ∘ Φ^Γ_h (x), each an explicit Euler step (residual
              sub-block): a Transformer layer, first order in h.
    "strang"  x <- Φ^F_{h/2} ∘ Φ^Γ_h ∘ Φ^F_{h/2} (x), each an explicit midpoint
              step: a second-order scheme of `simulate`'s ODE.

Each sub-step goes through the same normalization scheme (`_normalization`), so a
pre-LN block is x + h Attn(Norm x) followed by x + h FF(Norm x).

See [Feed-forward layers][math-feedforward].
"""

from typing import ClassVar

import jax.numpy as jnp

from . import _normalization
from ._attention.base import AbstractAttention
from ._feedforward import AbstractFeedForward
from ._linalg import row_norms
from ._normalization import ON_SPHERE

#: How `mf.layers` composes the attention and feed-forward steps of a block.
SPLITTINGS = ("lie", "strang")


class Block(AbstractAttention):
    """The residual block x' = Gamma_mu(x) + F(x): attention, then feed-forward.

    Runs wherever an attention does. In `mf.simulate` the two fields are summed;
    in `mf.layers` each layer is one attention step then one feed-forward step
    (`splitting="lie"`) or their symmetric Strang composition.

    Analyses see a block as the attention's heads plus the feed-forward field
    (`flat_heads`): on a Gaussian, an affine feed-forward adds (W, b) to the
    attention's affine field.

    Args:
        attention: any attention (multi-head included).
        feedforward: a token-wise field, `mf.FeedForward` or `mf.MLP`.

    Raises:
        ValueError: arguments of the wrong kinds.
    """

    attention: AbstractAttention
    feedforward: AbstractFeedForward
    normalised: ClassVar[bool] = False

    def __init__(self, attention: AbstractAttention, feedforward: AbstractFeedForward):
        if not isinstance(attention, AbstractAttention) or isinstance(
            attention, AbstractFeedForward
        ):
            raise ValueError(
                "`attention` must be an attention module; "
                f"got {type(attention).__name__}."
            )
        if not isinstance(feedforward, AbstractFeedForward):
            raise ValueError(
                "`feedforward` must be `mf.FeedForward` or `mf.MLP`; "
                f"got {type(feedforward).__name__}."
            )
        self.attention, self.feedforward = attention, feedforward

    def flat_heads(self, t=0.0, d=None):
        """The attention's heads, then (feedforward, None)."""
        return [*self.attention.flat_heads(t, d), (self.feedforward, None)]

    def sphere_velocity(self, measure, t=0.0):
        """The attention's tangential field (where it has one) plus P^perp F."""
        tangent = self.attention.sphere_velocity(measure, t)
        if tangent is None:
            return None
        theta = measure.x
        ff = self.feedforward(theta, t)
        ff = ff - jnp.sum(theta * ff, axis=-1, keepdims=True) * theta
        return tangent + ff.astype(tangent.dtype)

    def _evaluate(self, measure, z, positions, t):
        vel, ok = self.attention._evaluate(measure, z, positions, t)
        return vel.astype(z.dtype) + self.feedforward(z, t).astype(z.dtype), ok


def check_splitting(splitting: str, attn, noise) -> str:
    """Validate `mf.layers`' `splitting` against the field and the noise."""
    if splitting not in SPLITTINGS:
        raise ValueError(f"`splitting` must be one of {SPLITTINGS}; got {splitting!r}.")
    if splitting == "strang" and not isinstance(attn, Block):
        raise ValueError(
            '`splitting="strang"` composes the two fields of an `mf.Block`; '
            f"got {type(attn).__name__}."
        )
    if splitting == "strang" and noise is not None:
        raise ValueError(
            '`splitting="strang"` is a deterministic second-order scheme; with '
            '`noise` use `splitting="lie"` (Euler-Maruyama).'
        )
    return splitting


def _midpoint(field, measure, x, t, h, normalization, alpha):
    """(x after one explicit midpoint step of `field`'s scheme, converged)."""
    v1, ok1 = _normalization.velocity(field, measure, x, t, normalization, alpha)
    v2, ok2 = _normalization.velocity(
        field, measure, x + (h / 2) * v1, t + h / 2, normalization, alpha
    )
    x_new = x + h * v2
    if normalization in ON_SPHERE:
        x_new = x_new / row_norms(x_new, keepdims=True)
    return x_new, ok1 & ok2


def block_layer(block, measure, x, t, h, normalization, alpha, splitting, attn_step):
    """(x after one layer of a `Block`, converged).

    `attn_step(field, x)` advances the attention part by h at t (an Euler step,
    noisy or not); "strang" uses midpoint steps throughout.
    """
    ff = block.feedforward
    if splitting == "lie":
        x, ok = attn_step(block.attention, x)
        x_new, _ = _normalization.layer(ff, measure, x, t, h, normalization, alpha)
        return x_new, ok
    half = h / 2
    args = (normalization, alpha)
    x, _ = _midpoint(ff, measure, x, t, half, *args)
    x, ok = _midpoint(block.attention, measure, x, t, h, *args)
    x, _ = _midpoint(ff, measure, x, t + half, half, *args)
    return x, ok
