"""Attention on a Gaussian is affine: Gamma(x) = B x + b (MATH.md section 3).

Tilting N(alpha, Sigma) by a kernel that is Gaussian in y gives another Gaussian, so
softmax, L2 and Sinkhorn attention map a Gaussian measure to an affine velocity
field and mu(t) stays Gaussian (Castin, Ablin, Carrillo & Peyre, 2025).
"""

import jax.numpy as jnp
from jaxtyping import Array, Float

from .._attention.base import AbstractAttention, interaction_matrix, param_at
from .._attention.l2 import L2Attention
from .._attention.multihead import MultiHeadAttention, heads_with_outputs
from .._attention.sinkhorn import SinkhornAttention
from .._attention.softmax import SoftmaxAttention
from .._linalg import safe_eigh, sym_sqrt
from .._measures import Gaussian

SUPPORTED = (SoftmaxAttention, L2Attention, SinkhornAttention, MultiHeadAttention)


def check_supported(attn, d: int) -> None:
    """ValueError unless every head of `attn` keeps Gaussians Gaussian."""
    if not isinstance(attn, AbstractAttention):
        raise ValueError(
            f"`attn` must be an attention module; got {type(attn).__name__}."
        )
    heads = attn.heads if isinstance(attn, MultiHeadAttention) else (attn,)
    for head in heads:
        if isinstance(head, MultiHeadAttention):
            check_supported(head, d)
        elif not isinstance(head, SUPPORTED):
            raise ValueError(
                f"`attn` of type {type(head).__name__} is not supported on Gaussians: "
                "only softmax, L2, Sinkhorn and multi-head sums of these keep a "
                "Gaussian Gaussian (masked measures and unnormalised kernels do not)."
            )


def sinkhorn_gain(A, cov) -> Float[Array, "d d"]:
    """S^T Sigma^{-1} for the entropic self-coupling with cost -<A x, y>.

    Stable form of MATH.md: S^T Sigma^{-1} = Sigma^{1/2} X Sigma^{1/2} A with
    X = 2 (I + (I + 4 G)^{1/2})^{-1} and G = Sigma^{1/2} A Sigma A^T Sigma^{1/2}
    (symmetric PSD): one eigendecomposition of G, no inverse of A or Sigma.
    """
    root = sym_sqrt(cov)
    G = root @ A @ cov @ A.T @ root
    gam, U = safe_eigh((G + G.T) / 2)
    X = (U * (2 / (1 + jnp.sqrt(1 + 4 * jnp.maximum(gam, 0))))[None, :]) @ U.T
    return root @ X @ root @ A


def _affine(attn, mean, cov, t):
    d = mean.shape[0]
    if isinstance(attn, MultiHeadAttention):
        B, b = jnp.zeros((d, d), mean.dtype), jnp.zeros((d,), mean.dtype)
        for head, W in heads_with_outputs(attn, t, d):
            Bh, bh = _affine(head, mean, cov, t)
            if W is not None:
                Bh, bh = W @ Bh, W @ bh
            B, b = B + Bh, b + bh
        return B, b
    V = param_at(attn.V, t, "V", (d, d))
    if isinstance(attn, SoftmaxAttention):
        # Tilting N(alpha, Sigma) by e^{<A x, y>} gives N(alpha + Sigma A x, Sigma).
        A = interaction_matrix(attn, t, d)
        return V @ cov @ A, V @ mean
    if isinstance(attn, L2Attention):
        # Precision Sigma^{-1} + 2 K^T K; D = (I + 2 Sigma K^T K)^{-1}.
        A = interaction_matrix(attn, t, d)
        K = param_at(attn.K, t, "K", (None, d))
        D = jnp.linalg.solve(
            jnp.eye(d, dtype=mean.dtype) + 2 * cov @ K.T @ K,
            jnp.eye(d, dtype=mean.dtype),
        )
        return 2 * V @ D @ cov @ A, V @ D @ mean
    # Sinkhorn: kernel "l2" has the limit of "dot" with A replaced by 2 K^T Q.
    A = interaction_matrix(attn, t, d)
    if attn.kernel == "l2":
        A = 2 * A
    B = V @ sinkhorn_gain(A, cov)
    return B, V @ mean - B @ mean


def velocity(
    gauss: Gaussian, attn: AbstractAttention, t=0.0
) -> tuple[Float[Array, "d d"], Float[Array, " d"]]:
    """The affine velocity field Gamma(x) = B x + b of `attn` on N(mean, cov).

    Formulas (MATH.md section 3; Castin et al., 2025):
    softmax B = V Sigma A, b = V alpha; L2 (Kim et al.) B = 2 V D Sigma A,
    b = V D alpha with D = (I + 2 Sigma K^T K)^{-1}; Sinkhorn (Sander et al.)
    B = V S^T Sigma^{-1}, b = V alpha - B alpha with S the cross-covariance of the
    entropic self-coupling; multi-head sums W_h (B_h, b_h).

    Args:
        gauss: the Gaussian measure.
        attn: softmax, L2, Sinkhorn or multi-head attention (parameters may depend
            on t).
        t: time.

    Returns:
        (B (d, d), b (d,)).

    Raises:
        ValueError: unsupported attention (masked, unnormalised kernels), or a
            dimension mismatch.
    """
    if not isinstance(gauss, Gaussian):
        raise ValueError(f"`gauss` must be a `Gaussian`; got {type(gauss).__name__}.")
    check_supported(attn, gauss.dim)
    return _affine(attn, gauss.mean, gauss.cov, t)
