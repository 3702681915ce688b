"""Token-wise feed-forward fields: the second half of a Transformer block.

A feed-forward layer acts on each token alone, x_i' = F(x_i): it is a velocity
field that ignores the measure. It subclasses `AbstractAttention` so that it
runs wherever an attention does (`simulate`, `layers`, `simulate_ensemble`,
`mf.lipschitz.local`, alone or inside `mf.Block`).

    FeedForward   F(x) = W x + b                  (affine; keeps Gaussians Gaussian)
    MLP           F(x) = W2 sigma(W1 x + b1) + b2  (sigma: relu, gelu or tanh)

See [Feed-forward layers][math-feedforward].
"""

import abc
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._attention.base import AbstractAttention, norm2, param_at
from ._custom_types import Param, ParamLike
from ._params import as_param, at

#: activation name -> sigma (gelu: the exact erf form, as in BERT).
ACTIVATIONS = {
    "relu": jax.nn.relu,
    "gelu": lambda u: jax.nn.gelu(u, approximate=False),
    "tanh": jnp.tanh,
}


class AbstractFeedForward(AbstractAttention):
    """A token-wise velocity field x -> F(x), the same for every measure.

    Subclasses implement `__call__(x, t)` on (m, d) tokens and `token_dim(t)`.
    """

    # Not an average of values: |F(x)| grows with |x| (and b).
    normalised: ClassVar[bool] = False

    @abc.abstractmethod
    def __call__(self, x: Float[Array, "m d"], t=0.0) -> Float[Array, "m d"]:
        """F applied to each row of x, shape (m, d)."""

    @abc.abstractmethod
    def token_dim(self, t=0.0) -> int:
        """The token dimension d the parameters act on."""

    def _evaluate(self, measure, z, positions, t):
        return self(z, t).astype(z.dtype), jnp.array(True)


def _bias(b, t, name: str, size: int, dtype) -> Float[Array, " d"]:
    if b is None:
        return jnp.zeros((size,), dtype)
    return param_at(b, t, name, (size,))


def _check_array(value, name: str, ndim: int, shape_text: str) -> None:
    if value is not None and not callable(value) and value.ndim != ndim:
        raise ValueError(f"`{name}` must have shape {shape_text}; got {value.shape}.")


class FeedForward(AbstractFeedForward):
    """Affine feed-forward field F(x) = W x + b, token-wise.

    An affine field maps a Gaussian to a Gaussian: with attention, the moment ODE
    gains W alpha + b and W Sigma + Sigma W^T (`mf.gaussian.simulate(ffn=...)`).

    Args:
        W: (d, d) matrix, or a function of t.
        b: (d,) vector, a function of t, or None (zero).

    Raises:
        ValueError: W not square, or b not of length d.
    """

    W: Param
    b: Param | None

    def __init__(self, W: ParamLike, b: ParamLike | None = None):
        W, b = as_param(W, "W"), None if b is None else as_param(b, "b")
        _check_array(W, "W", 2, "(d, d)")
        if not callable(W):
            if W.shape[0] != W.shape[1]:
                raise ValueError(f"`W` must have shape (d, d); got {W.shape}.")
            if b is not None and not callable(b) and b.shape != (W.shape[0],):
                raise ValueError(
                    f"`b` must have shape (d,) = ({W.shape[0]},); got {b.shape}."
                )
        self.W, self.b = W, b

    def token_dim(self, t=0.0) -> int:
        """d, the size of W."""
        return int(at(self.W, t, "W").shape[-1])

    def matrices(self, t, d: int) -> tuple[Float[Array, "d d"], Float[Array, " d"]]:
        """(W, b) at time t, checked against the token dimension d (b = 0 if None)."""
        W = param_at(self.W, t, "W", (d, d))
        return W, _bias(self.b, t, "b", d, W.dtype)

    def __call__(self, x, t=0.0):
        W, b = self.matrices(t, x.shape[-1])
        return x @ W.T + b[None, :]

    def gaussian_field(self, mean, cov, t):
        """(W, b): the field is affine already, whatever the measure."""
        return self.matrices(t, mean.shape[0])

    def covariance_growth_rate(self, t, d):
        """|W|_2: Sigma' = W Sigma + Sigma W^T keeps |Sigma| <= |Sigma0| e^{2|W|t}."""
        return norm2(param_at(self.W, t, "W", (d, d)))


class MLP(AbstractFeedForward):
    """Two-layer perceptron F(x) = W2 sigma(W1 x + b1) + b2, token-wise.

    Args:
        W1: (p, d) first layer (p hidden units), or a function of t.
        b1: (p,) or None (zero).
        W2: (d, p) second layer.
        b2: (d,) or None (zero).
        activation: "relu", "gelu" (exact, erf form) or "tanh".

    Raises:
        ValueError: shapes that do not chain, or an unknown activation.
    """

    W1: Param
    b1: Param | None
    W2: Param
    b2: Param | None
    activation: str = eqx.field(static=True)

    def __init__(
        self,
        W1: ParamLike,
        b1: ParamLike | None,
        W2: ParamLike,
        b2: ParamLike | None = None,
        activation: str = "relu",
    ):
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"`activation` must be one of {tuple(ACTIVATIONS)}; got {activation!r}."
            )
        W1, W2 = as_param(W1, "W1"), as_param(W2, "W2")
        b1 = None if b1 is None else as_param(b1, "b1")
        b2 = None if b2 is None else as_param(b2, "b2")
        _check_array(W1, "W1", 2, "(p, d)")
        _check_array(W2, "W2", 2, "(d, p)")
        if not callable(W1) and not callable(W2):
            p, d = W1.shape
            if W2.shape != (d, p):
                raise ValueError(
                    f"`W2` must have shape (d, p) = ({d}, {p}) to follow `W1` of "
                    f"shape {W1.shape}; got {W2.shape}."
                )
            for name, b, size in (("b1", b1, p), ("b2", b2, d)):
                if b is not None and not callable(b) and b.shape != (size,):
                    raise ValueError(
                        f"`{name}` must have shape ({size},); got {b.shape}."
                    )
        self.W1, self.b1, self.W2, self.b2 = W1, b1, W2, b2
        self.activation = activation

    def token_dim(self, t=0.0) -> int:
        """d, the number of columns of W1."""
        return int(at(self.W1, t, "W1").shape[-1])

    def __call__(self, x, t=0.0):
        d = x.shape[-1]
        W1 = param_at(self.W1, t, "W1", (None, d))
        p = W1.shape[0]
        W2 = param_at(self.W2, t, "W2", (d, p))
        hidden = x @ W1.T + _bias(self.b1, t, "b1", p, W1.dtype)[None, :]
        out = ACTIVATIONS[self.activation](hidden) @ W2.T
        return out + _bias(self.b2, t, "b2", d, W2.dtype)[None, :]
