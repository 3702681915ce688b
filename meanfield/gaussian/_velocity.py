"""Attention on a Gaussian is affine: Gamma(x) = B x + b (docs/math/gaussians.md).

Tilting N(alpha, Sigma) by a kernel that is Gaussian in y gives another Gaussian, so
softmax, L2 and Sinkhorn attention map a Gaussian measure to an affine velocity
field and mu(t) stays Gaussian (Castin, Ablin, Carrillo & Peyre, 2025). Each family
gives its (B, b) (`AbstractAttention.gaussian_field`); multi-head sums W_h (B_h, b_h).
An affine feed-forward layer F(x) = W x + b (`mf.FeedForward`, alone as `ffn=` or in
an `mf.Block`) adds (W, b) (Alcalde, Ji & Zuazua, arXiv 2606.07600).
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._attention.base import AbstractAttention
from .._block import Block
from .._feedforward import AbstractFeedForward, FeedForward
from .._measures import Gaussian

_NOT_AFFINE = (
    "is not affine, so Gaussians do not stay Gaussian; only `mf.FeedForward` "
    "(F(x) = W x + b) keeps them Gaussian"
)


def _sum_heads(attn, mean, t, field_of):
    """(B, b) = sum_h W_h (B_h, b_h) over the heads, (B_h, b_h) = field_of(head).

    ValueError for a head without a Gaussian field.
    """
    d = mean.shape[0]
    B, b = jnp.zeros((d, d), mean.dtype), jnp.zeros((d,), mean.dtype)
    for head, W in attn.flat_heads(t, d):
        field = field_of(head)
        if field is None and isinstance(head, AbstractFeedForward):
            raise ValueError(
                f"`attn` holds a feed-forward layer of type {type(head).__name__} "
                f"(in an `mf.Block`): it {_NOT_AFFINE}."
            )
        if field is None:
            raise ValueError(
                f"`attn` of type {type(head).__name__} is not supported on Gaussians: "
                "only softmax, L2, Sinkhorn and multi-head sums of these keep a "
                "Gaussian Gaussian (masked measures and unnormalised kernels do not)."
            )
        Bh, bh = field
        if W is not None:
            Bh, bh = W @ Bh, W @ bh
        B, b = B + Bh, b + bh
    return B, b


def summed_affine(attn, mean, cov, t):
    """(B, b) of N(mean, cov), summed over the heads."""
    return _sum_heads(attn, mean, t, lambda h: h.gaussian_field(mean, cov, t))


def affine_graded(attn, mean, frame, scales, unit, t):
    """`summed_affine` for Sigma = Q diag(r) U U^T diag(r) Q^T given in factors."""
    return _sum_heads(
        attn,
        mean,
        t,
        lambda h: h.gaussian_field_graded(mean, frame, scales, unit, t),
    )


def _check_attention(attn) -> None:
    if not isinstance(attn, AbstractAttention):
        raise ValueError(
            f"`attn` must be an attention module; got {type(attn).__name__}."
        )


def check_ffn(ffn) -> None:
    """ValueError unless `ffn` is None or an affine `mf.FeedForward`."""
    if ffn is None or isinstance(ffn, FeedForward):
        return
    why = f": it {_NOT_AFFINE}" if isinstance(ffn, AbstractFeedForward) else ""
    raise ValueError(
        "`ffn` must be None or an affine `mf.FeedForward` (F(x) = W x + b); "
        f"got {type(ffn).__name__}{why}."
    )


def with_ffn(attn, ffn):
    """`attn` with the feed-forward field `ffn` added: `Block(attn, ffn)` (or attn).

    The moment ODE sees a block as the attention's heads plus (ffn, None)
    (`Block.flat_heads`), so both spellings give the same (B, b).
    """
    check_ffn(ffn)
    _check_attention(attn)
    return attn if ffn is None else Block(attn, ffn)


def split_ffn(attn, ffn):
    """(attention, ffn or None) of `attn` plus `ffn`: a block's affine part split off.

    `mf.Block(attention, FeedForward)` and `(attention, ffn=FeedForward)` are the
    same field. ValueError for a block with a non-affine feed-forward, or a
    feed-forward given both ways.
    """
    check_ffn(ffn)
    if isinstance(attn, Block):
        if not isinstance(attn.feedforward, FeedForward):
            raise ValueError(
                "`attn` is an `mf.Block` whose feed-forward layer of type "
                f"{type(attn.feedforward).__name__} {_NOT_AFFINE}."
            )
        if ffn is not None:
            raise ValueError(
                "`ffn` given twice: `attn` is an `mf.Block` with its own "
                "feed-forward layer; pass `ffn=None` or the attention alone."
            )
        return attn.attention, attn.feedforward
    return attn, ffn


def check_supported(attn, gauss: Gaussian) -> None:
    """ValueError unless every head of `attn` keeps Gaussians Gaussian.

    Traces the field once without computing it (`jax.eval_shape`), so the
    parameters' shapes are checked too.
    """
    _check_attention(attn)
    jax.eval_shape(functools.partial(summed_affine, attn, t=0.0), gauss.mean, gauss.cov)


def velocity(
    gauss: Gaussian,
    attn: AbstractAttention,
    t=0.0,
    *,
    ffn: FeedForward | None = None,
) -> tuple[Float[Array, "d d"], Float[Array, " d"]]:
    """The affine velocity field Gamma(x) = B x + b of `attn` on N(mean, cov).

    Formulas (docs/math/gaussians.md; Castin et al., 2025):
    softmax B = V Sigma A, b = V alpha; L2 (Kim et al.) B = 2 V D Sigma A,
    b = V D alpha with D = (I + 2 Sigma K^T K)^{-1}; Sinkhorn (Sander et al.)
    B = V S^T Sigma^{-1}, b = V alpha - B alpha with S the cross-covariance of the
    entropic self-coupling; multi-head sums W_h (B_h, b_h). A feed-forward layer
    F(x) = W_f x + b_f adds (W_f, b_f) (Alcalde, Ji & Zuazua, arXiv 2606.07600).

    See [Gaussians][math-gaussians] for the derivation of each family's field and
    [Feed-forward layers][math-gaussian-feedforward] for the feed-forward part.

    Args:
        gauss: the Gaussian measure.
        attn: softmax, L2, Sinkhorn or multi-head attention (parameters may depend
            on t), any family that gives `gaussian_field`, or an `mf.Block` of one
            with an `mf.FeedForward`.
        t: time.
        ffn: an affine feed-forward layer `mf.FeedForward(W_f, b_f)` added to the
            field (the same as `mf.Block(attn, ffn)`), or None.

    Returns:
        (B (d, d), b (d,)).

    Raises:
        ValueError: unsupported attention (masked, unnormalised kernels), a
            non-affine feed-forward (`mf.MLP`), or a dimension mismatch.
    """
    if not isinstance(gauss, Gaussian):
        raise ValueError(f"`gauss` must be a `Gaussian`; got {type(gauss).__name__}.")
    attn = with_ffn(attn, ffn)
    return summed_affine(attn, gauss.mean, gauss.cov, t)


def as_batch(attn, gauss: Gaussian, name: str):
    """(batch, first): `attn` with a leading batch axis, and its first parameter set.

    One attention (one parameter set) becomes a batch of one. A batch has one
    more axis on every array leaf than one parameter set, but no leaf's ndim
    tells which it is by itself: the unbatched ndim is the family's (V, A
    (d, d); Q, K (k, d); a `PiecewiseConstant` adds a layer axis). The family's
    own Gaussian field knows it: traced at the Gaussian's d (`jax.eval_shape`,
    nothing computed), it accepts one parameter set and returns B (d, d),
    b (d,), while a batch fails its shape checks (`param_at`) or comes out with
    the batch axis in front. So an attention whose field has the shapes of one
    run is one run; anything else must be a batch, checked as one.

    Args:
        attn: one attention, or a batch of them.
        gauss: the Gaussian of the study.
        name: the variant's name, for the message.

    Returns:
        (the batch, its first parameter set).

    Raises:
        ValueError: `attn` is neither one attention for `gauss` nor a batch of
            them (the message shows how to build a batch), or not supported on
            Gaussians.
    """
    _check_attention(attn)
    d = gauss.mean.shape[-1]
    try:
        B, b = jax.eval_shape(
            functools.partial(summed_affine, attn, t=0.0), gauss.mean, gauss.cov
        )
        one = B.shape == (d, d) and b.shape == (d,)
    except (ValueError, TypeError, IndexError):  # not one run of a supported family
        one = False
    if one:
        attn = jax.tree.map(lambda a: a[None] if eqx.is_array(a) else a, attn)
    try:
        first = jax.tree.map(lambda a: a[0] if eqx.is_array(a) else a, attn)
        check_supported(first, gauss)
    except (ValueError, TypeError, IndexError) as err:
        raise ValueError(
            f"`attns` ({name!r}) must be one attention for a Gaussian in d = {d}, "
            "or a batch of them with a leading batch axis on every array leaf, "
            "e.g. `jax.vmap(lambda A: mf.SoftmaxAttention(V, A=A))(As)` with As "
            f"of shape (batch, {d}, {d}); as a batch: {err}"
        ) from err
    return attn, first
