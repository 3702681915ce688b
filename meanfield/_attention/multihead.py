"""Multi-head attention: Gamma = sum_h W_h Gamma_h."""

from collections.abc import Sequence

import jax.numpy as jnp
from jaxtyping import ArrayLike

from .._params import as_param
from .base import AbstractAttention, param_at


class MultiHeadAttention(AbstractAttention):
    """Sum of heads, each mapped by its output matrix: Gamma = sum_h W_h Gamma^(h).

    Args:
        heads: a non-empty sequence of attention modules (any family, even mixed).
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

    def _evaluate(self, measure, z, positions, t):
        d = z.shape[-1]
        total = jnp.zeros_like(z)
        ok = jnp.array(True)
        for h, head in enumerate(self.heads):
            vel, head_ok = head._evaluate(measure, z, positions, t)
            if self.out is not None:
                vel = vel @ param_at(self.out[h], t, f"out[{h}]", (d, d)).T
            total, ok = total + vel.astype(z.dtype), ok & head_ok
        return total, ok


def heads_with_outputs(attn: MultiHeadAttention, t, d: int) -> list:
    """[(head, W_h at t or None)] of a multi-head attention."""
    if attn.out is None:
        return [(head, None) for head in attn.heads]
    return [
        (head, param_at(attn.out[h], t, f"out[{h}]", (d, d)))
        for h, head in enumerate(attn.heads)
    ]
