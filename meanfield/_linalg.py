"""Dense linear algebra shared by the Gaussian solver, distances and clustering.

Symmetric eigendecompositions that never see inf/NaN, PSD square roots, a
matrix exponential whose scaling and squaring is right for every norm, and
Euclidean norms and logit scales that do not overflow for huge finite tokens.
"""

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jaxtyping import Array, Float


def power_of_two_scale(x: Float[Array, "..."], keep: int) -> Float[Array, ""]:
    """2^k with k >= 0 the smallest such that max|x| / 2^k < 2^keep (1 below it).

    Dividing by a power of two is exact (it only shifts exponents), so a
    computation done on x / 2^k and scaled back rounds exactly as on x, while
    squares and products that would overflow stay finite. Non-finite entries are
    left to the caller (scale 1). The scale is piecewise constant in x: no gradient.
    """
    top = jnp.max(jnp.abs(x))
    _, exponent = jnp.frexp(jnp.where(jnp.isfinite(top), top, 0))
    k = jnp.maximum(exponent - keep, 0)
    return jax.lax.stop_gradient(jnp.ldexp(jnp.ones((), x.dtype), k))


def _row_scales(top: Float[Array, "..."]) -> tuple[Array, Array]:
    """(2^-k, 2^k) with k = max(frexp exponent of top, 0): exact powers of two.

    Built from the exponent bits (a shift and a clip) rather than with
    jnp.frexp/ldexp, whose subnormal and special-value selects made the norms a
    fifth of a small-system field evaluation. k is capped at bias - 1 so both
    factors stay normal; non-finite tops get that cap (the norm stays inf/NaN).
    """
    info = jnp.finfo(top.dtype)
    int_dtype = jnp.dtype(f"int{info.bits}")
    mantissa = info.nmant
    bias = info.maxexp - 1
    biased = jax.lax.shift_right_logical(
        jax.lax.bitcast_convert_type(jax.lax.stop_gradient(top), int_dtype),
        jnp.asarray(mantissa, int_dtype),
    ) & jnp.asarray(2 * info.maxexp - 1, int_dtype)
    # top = 1.f 2^(biased - bias), so k = max(biased - bias + 1, 0).
    down = jnp.clip(2 * bias - 1 - biased, 1, bias)  # biased exponent of 2^-k
    as_float = lambda field: jax.lax.bitcast_convert_type(  # noqa: E731
        jax.lax.shift_left(field, jnp.asarray(mantissa, int_dtype)), top.dtype
    )
    return as_float(down), as_float(2 * bias - down)


#: Last axes up to this length are reduced slice by slice (`last_axis_sum`).
UNROLL = 8


def last_axis_sum(a: Float[Array, "... d"], keepdims: bool = False) -> Array:
    """Sum over the last axis; for a short axis (d <= UNROLL) slice by slice.

    XLA's CPU reduction over a minor axis of 2 or 3 elements costs about as much
    as an n x n pass; written as d - 1 additions of slices it fuses with its
    producers and vectorises over the other axes.
    """
    d = a.shape[-1]
    if d == 0 or d > UNROLL:
        return jnp.sum(a, axis=-1, keepdims=keepdims)
    total = a[..., 0:1]
    for k in range(1, d):
        total = total + a[..., k : k + 1]
    return total if keepdims else total[..., 0]


def _last_axis_max(a: Float[Array, "... d"]) -> Float[Array, "... 1"]:
    d = a.shape[-1]
    if d == 0 or d > UNROLL:
        return jnp.max(a, axis=-1, keepdims=True)
    top = a[..., 0:1]
    for k in range(1, d):
        top = jnp.maximum(top, a[..., k : k + 1])
    return top


def matmul_small(x: Float[Array, "... d"], M: Float[Array, "k d"]) -> Array:
    """The product x Mᵀ; for d <= UNROLL as d broadcast products.

    Batched products with a contraction of 2 or 3 run one small matrix product
    per batch member on XLA's CPU backend; the broadcast form fuses (see
    `last_axis_sum`).
    """
    d = M.shape[-1]
    if d == 0 or d > UNROLL:
        return x @ M.T
    column = lambda k: M[:, k].reshape((1,) * (x.ndim - 1) + (-1,))  # noqa: E731
    out = x[..., 0:1] * column(0)
    for k in range(1, d):
        out = out + x[..., k : k + 1] * column(k)
    return out


def row_norms(x: Float[Array, "... d"], keepdims: bool = False) -> Float[Array, "..."]:
    """Euclidean norms along the last axis, finite for every finite x.

    |x|^2 overflows once |x| passes sqrt(max float) (1e154 in float64, 1e19 in
    float32); each row with an entry above 1 is divided by a power of two near
    its largest entry first (exact), other rows are left as they are.
    """
    top = _last_axis_max(jnp.abs(x))
    down, up = _row_scales(top)
    scaled = x * down
    norms = jnp.sqrt(last_axis_sum(scaled * scaled, keepdims=True)) * up
    return norms if keepdims else norms[..., 0]


def host_row_norms(x: np.ndarray) -> np.ndarray:
    """`row_norms` in NumPy for concrete arrays (no program to compile)."""
    x = np.asarray(x)
    top = np.max(np.abs(x), axis=-1, keepdims=True)
    scale = np.where(np.isfinite(top) & (top > 0), top, 1)
    return (scale * np.linalg.norm(x / scale, axis=-1, keepdims=True))[..., 0]


def safe_eigh(S: Float[Array, "d d"]):
    """`eigh` that never sees inf/NaN (LAPACK's eigensolvers can hang on them).

    A non-finite matrix (a rejected trial step near a blow-up) is replaced by
    inf * I, so the eigenvalues come out +inf and the step is rejected as usual.
    """
    finite = jnp.all(jnp.isfinite(S))
    lam, U = jnp.linalg.eigh(jnp.where(finite, S, jnp.zeros_like(S)))
    return jnp.where(finite, lam, jnp.inf), U


def inverse(M: Float[Array, "d d"]) -> Float[Array, "d d"]:
    """M^{-1}; the adjugate over the determinant for 2 x 2 (no LAPACK call)."""
    if M.shape == (2, 2):
        adj = jnp.array([[M[1, 1], -M[0, 1]], [-M[1, 0], M[0, 0]]])
        return adj / (M[0, 0] * M[1, 1] - M[0, 1] * M[1, 0])
    return jnp.linalg.inv(M)


def graded_tilt(
    frame: Float[Array, "d d"],
    scales: Float[Array, " d"],
    unit: Float[Array, "d d"],
    G: Float[Array, "d d"],
) -> Float[Array, "d d"]:
    """(Sigma^{-1} + G)^{-1} for Sigma = Q diag(r) U U^T diag(r) Q^T and G PSD.

    With H = U^{-T} U^{-1} + diag(r) Q^T G Q diag(r), the result is
    Q diag(r) H^{-1} diag(r) Q^T. H is inverted after scaling it to a unit
    diagonal, so directions of Sigma with tiny or huge r keep their relative
    precision; forming Sigma first loses every direction below eps |Sigma|.
    """
    d = scales.shape[0]
    eye = jnp.eye(d, dtype=scales.dtype)
    U_inv = jsl.solve_triangular(unit, eye, lower=False, unit_diagonal=True)
    H = U_inv.T @ U_inv + scales[:, None] * (frame.T @ G @ frame) * scales[None, :]
    s = jnp.sqrt(jnp.diag(H))
    ratio = scales / s
    inner = ratio[:, None] * inverse(H / (s[:, None] * s[None, :])) * ratio[None, :]
    return frame @ ((inner + inner.T) / 2) @ frame.T


def sym_sqrt(S: Float[Array, "d d"]) -> Float[Array, "d d"]:
    """Symmetric PSD square root by one eigendecomposition (no sqrtm).

    For d = 2 the closed form sqrt(S) = (S + sqrt(det S) I) / sqrt(tr S + 2 sqrt(det S))
    (Cayley-Hamilton) replaces the eigendecomposition: same accuracy, and a batched
    2 x 2 `eigh` on CPU costs one LAPACK call per matrix.
    """
    if S.shape[-2:] == (2, 2):
        return _sym_sqrt_2x2(S)
    lam, U = safe_eigh(S)
    return (U * jnp.sqrt(jnp.maximum(lam, 0))[None, :]) @ U.T


def _sym_sqrt_2x2(S: Float[Array, "2 2"]) -> Float[Array, "2 2"]:
    S = (S + S.T) / 2
    root_det = jnp.sqrt(jnp.maximum(S[0, 0] * S[1, 1] - S[0, 1] ** 2, 0))
    norm = jnp.sqrt(jnp.maximum(S[0, 0] + S[1, 1] + 2 * root_det, 0))
    top = S + root_det * jnp.eye(2, dtype=S.dtype)
    return jnp.where(norm > 0, top / jnp.where(norm > 0, norm, 1), 0 * S)


#: Largest 1-norm for which `jax.scipy.linalg.expm` uses its Pade approximant
#: unscaled and accurately: theta_13 (float64) and theta_7 (float32) of Higham (2005).
_PADE_MAX_NORM = {
    np.dtype(np.float64): 5.371920351148152,
    np.dtype(np.float32): 3.925724783138660,
}


def expm(a: Float[Array, "d d"]) -> Float[Array, "d d"]:
    """Matrix exponential by scaling and squaring around `jax.scipy.linalg.expm`.

    jax's expm takes floor(log2(|a|_1 / theta)) squarings, which leaves norms up to
    2 theta for the Pade approximant (relative error 2e-7 measured for
    expm(-10.7 I) in float64, jax 0.10); scaling by the ceiling first keeps the
    norm <= theta (Higham, 2005), then the result is squared back.
    """
    theta = _PADE_MAX_NORM[np.dtype(a.dtype)]
    norm = jnp.linalg.norm(a, 1)
    squarings = jnp.maximum(0.0, jnp.ceil(jnp.log2(norm / theta)))
    r = jsl.expm(a / 2**squarings)
    return jax.lax.fori_loop(0, squarings.astype(jnp.int32), lambda _, m: m @ m, r)
