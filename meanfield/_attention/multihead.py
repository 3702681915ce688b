"""Multi-head attention: Gamma = sum_h W_h Gamma_h."""

from collections.abc import Sequence

import jax.numpy as jnp
from jaxtyping import ArrayLike

from .._params import as_param, at
from .base import AbstractAttention, param_at


class MultiHeadAttention(AbstractAttention):
    """Sum of heads, each mapped by its output matrix: Gamma = sum_h W_h Gamma^(h).

    A combinator over families, not a family: it is not in `registry.FAMILIES`.
    Analyses see it through `flat_heads`, the single-family heads with their
    composed output matrices.

    See [The families][math-kernel-families], and [Gaussians][math-gaussian-multihead]
    for its field on a Gaussian.

    Args:
        heads: a non-empty sequence of attention modules (any family, even mixed,
            or multi-head themselves).
        out: None (every W_h = I) or one (d, d) matrix per head (arrays or
            functions of t).

    Raises:
        ValueError: no heads, a head that is not an attention, or a wrong number of
            output matrices.
    """

    heads: tuple[AbstractAttention, ...]
    out: tuple | None

    def __init__(
        self, heads: Sequence[AbstractAttention], out: Sequence[ArrayLike] | None = None
    ):
        heads = tuple(heads)
        if len(heads) == 0:
            raise ValueError("`heads` must contain at least one attention head.")
        for i, head in enumerate(heads):
            if not isinstance(head, AbstractAttention):
                raise ValueError(
                    f"`heads[{i}]` must be an attention module; "
                    f"got {type(head).__name__}."
                )
        if out is not None:
            out = tuple(as_param(w, f"out[{i}]") for i, w in enumerate(out))
            if len(out) != len(heads):
                raise ValueError(
                    f"`out` must hold one matrix per head ({len(heads)}); "
                    f"got {len(out)}."
                )
        self.heads, self.out = heads, out

    @property
    def normalised(self) -> bool:
        """Whether every head is normalised (then |Gamma| <= sum_h |W_h V_h| R)."""
        return all(head.normalised for head in self.heads)

    def flat_heads(self, t=0.0, d=None):
        """[(head, W)] over the single-family heads, nested multi-heads expanded.

        W is the product of the output matrices from this module down to the head
        (None when all of them are the identity), evaluated at t and checked to be
        (d, d) when d is given.
        """
        flat = []
        for h, head in enumerate(self.heads):
            W = None
            if self.out is not None and d is None:
                W = at(self.out[h], t, f"out[{h}]")
            elif self.out is not None:
                W = param_at(self.out[h], t, f"out[{h}]", (d, d))
            for leaf, inner in head.flat_heads(t, d):
                flat.append((leaf, _compose(W, inner)))
        return flat

    def _evaluate(self, measure, z, positions, t):
        total = jnp.zeros_like(z)
        ok = jnp.array(True)
        for head, W in self.flat_heads(t, z.shape[-1]):
            vel, head_ok = head._evaluate(measure, z, positions, t)
            if W is not None:
                vel = vel @ W.T
            total, ok = total + vel.astype(z.dtype), ok & head_ok
        return total, ok


def _compose(outer, inner):
    """The product outer @ inner, None standing for the identity."""
    if outer is None or inner is None:
        return inner if outer is None else outer
    return outer @ inner
