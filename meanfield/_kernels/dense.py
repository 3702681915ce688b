"""Dense kernels shared by every attention family.

Logits are always bilinear plus a per-key bias, l_ij = <q_i, k_j> + b_j, so a
family only supplies (q, k, b); weights enter as log-prior log w_j and the causal
mask as -inf. Everything is in max-shifted (log-sum-exp) form so that float32 stays
finite for logits of size 1e4.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float


def compute_dtype(dtype):
    """Softmax arithmetic in at least float32 (half precision loses the logits)."""
    return jnp.promote_types(dtype, jnp.float32)


def log_weights(weights: Float[Array, " n"]) -> Float[Array, " n"]:
    """Log w with -inf for w = 0 and finite gradients (double `where`)."""
    positive = weights > 0
    return jnp.where(positive, jnp.log(jnp.where(positive, weights, 1)), -jnp.inf)


def causal_mask(
    query_positions: Float[Array, " m"] | None, key_positions: Float[Array, " n"] | None
) -> Bool[Array, "m n"] | None:
    """mask_ij = (s_j <= s_i): query i sees key j; None when unmasked."""
    if query_positions is None:
        return None
    return key_positions[None, :] <= query_positions[:, None]


def logits(
    q: Float[Array, "m k"],
    keys: Float[Array, "n k"],
    key_bias: Float[Array, " n"] | None,
) -> Float[Array, "m n"]:
    """l_ij = <q_i, k_j> + b_j (one matmul, no (m, n, k) intermediate)."""
    out = q @ keys.T
    return out if key_bias is None else out + key_bias[None, :]


def unscale(shifted: Float[Array, "..."], logit_scale) -> Float[Array, "..."]:
    """c^2 s for max-shifted logits s <= 0, as (s c) c: never inf * 0 or c^2 = inf."""
    if logit_scale is None:
        return shifted
    return (shifted * logit_scale) * logit_scale


def _finite_row_max(logits: Float[Array, "m n"]) -> Float[Array, "m 1"]:
    """Row maxima, at least the lowest finite float (no gradient).

    An empty row (all -inf) then shifts by a finite number, so no inf - inf = NaN
    appears. `maximum` rather than `where(isfinite)`: under vmap on CPU, XLA
    fused the `where` form so poorly that a 32-token softmax field ran 7x slower.
    """
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    return jax.lax.stop_gradient(jnp.maximum(row_max, jnp.finfo(logits.dtype).min))


def softmax_average(
    logits: Float[Array, "m n"],
    values: Float[Array, "n d"],
    mask: Bool[Array, "m n"] | None = None,
    logit_scale: Float[Array, ""] | None = None,
) -> Float[Array, "m d"]:
    """sum_j softmax_j(c^2 l_ij) v_j over the keys j with mask_ij; 0 for empty rows.

    A row with no visible key (a query position before every key position) is the
    average over an empty measure: its velocity is defined as 0. c = `logit_scale`
    (None: 1) lets a caller pass logits divided by c^2 when the true ones would
    overflow: the row maximum is taken on the scaled logits, and the shifted
    logits (all <= 0) are scaled back, so exp sees c^2 (l_ij - max_k l_ik).
    """
    if mask is not None:
        logits = jnp.where(mask, logits, -jnp.inf)
    row_max = _finite_row_max(logits)
    p = jnp.exp(unscale(logits - row_max, logit_scale))
    denom = jnp.sum(p, axis=-1, keepdims=True)
    # A non-empty row has denom >= 1 (its maximum gives e^0); an empty one has
    # numerator 0, so 0 / tiny = 0.
    return (p @ values) / jnp.maximum(denom, jnp.finfo(denom.dtype).tiny)


def exp_kernel_sum(
    logits: Float[Array, "m n"],
    log_w: Float[Array, " n"],
    values: Float[Array, "n d"],
    mask: Bool[Array, "m n"] | None = None,
) -> Float[Array, "m d"]:
    """sum_j w_j exp(l_ij) v_j, unnormalised.

    Computed as exp(M_i + log s) * sum_j exp(l_ij + log w_j - M_i) (v_j / s), M_i
    the row maximum and s = max_jk |v_jk| the values' scale: small values (V ~
    e^{-beta}) offset large logits (beta >~ 709, where e^{M_i} alone overflows)
    before anything is exponentiated.

    Overflows (to inf) only where the true value exceeds the dtype's range.
    """
    shifted = logits + log_w[None, :]
    if mask is not None:
        shifted = jnp.where(mask, shifted, -jnp.inf)
    row_max = _finite_row_max(shifted)
    # The result does not depend on s: no gradient through it.
    scale = jax.lax.stop_gradient(jnp.max(jnp.abs(values)))
    nonzero = scale > 0
    safe = jnp.where(nonzero, scale, 1)
    sums = jnp.exp(shifted - row_max) @ (values / safe)
    # Values all 0: the sum is 0 even where e^{M_i} overflows (no inf * 0).
    return jnp.where(nonzero, jnp.exp(row_max + jnp.log(safe)), 0) * sums


def exp_kernel_tangent(
    logits: Float[Array, "n n"],
    log_w: Float[Array, " n"],
    x: Float[Array, "n d"],
    V: Float[Array, "d d"],
    mask: Bool[Array, "n n"] | None = None,
) -> Float[Array, "n d"]:
    """P^perp_{x_i} sum_j w_j exp(l_ij) V x_j at unit atoms x_i, to relative precision.

    Where one term dominates (the atom's own, at large beta), the projection of
    the sum cancels it and keeps a rounding error eps |sum| that can exceed the
    true tangential part (1e-17 of the sum for clusters e^{-35} apart). Since
    P^perp_{x_i} x_i = 0, for any scalar lam

        P^perp_{x_i} sum_j w_j e^{l_ij} V x_j
          = P^perp_{x_i} [sum_j w_j e^{l_ij} V (x_j - x_i) + Z_i (V - lam I) x_i],

    Z_i = sum_j w_j e^{l_ij}: the own term vanishes exactly, the differences of
    close atoms are exact (Sterbenz), and with lam the median of diag V the
    second term is exactly 0 for V = c I. The differences are summed one
    coordinate at a time (O(n^2) memory, as the logits). Scaled as
    `exp_kernel_sum`.
    """
    shifted = logits + log_w[None, :]
    if mask is not None:
        shifted = jnp.where(mask, shifted, -jnp.inf)
    row_max = _finite_row_max(shifted)
    kernel = jnp.exp(shifted - row_max)
    d = x.shape[-1]
    scale = jax.lax.stop_gradient(jnp.max(jnp.abs(V)))
    nonzero = scale > 0
    safe = jnp.where(nonzero, scale, 1)
    V = V / safe
    lam = jnp.sort(jnp.diagonal(V))[d // 2]
    # sum_j k_ij (x_jc - x_ic) for each coordinate c.
    diffs = jax.lax.map(
        lambda col: jnp.sum(kernel * (col[None, :] - col[:, None]), axis=1), x.T
    ).T
    rest = V - lam * jnp.eye(d, dtype=V.dtype)
    inner = diffs @ V.T + jnp.sum(kernel, axis=1, keepdims=True) * (x @ rest.T)
    tangent = inner - jnp.sum(x * inner, axis=-1, keepdims=True) * x
    return jnp.where(nonzero, jnp.exp(row_max + jnp.log(safe)), 0) * tangent


def kernel_sum(
    kernel: Float[Array, "m n"],
    weights: Float[Array, " n"],
    values: Float[Array, "n d"],
    mask: Bool[Array, "m n"] | None = None,
) -> Float[Array, "m d"]:
    """sum_j w_j K_ij v_j for an explicit (bounded or polynomial) kernel matrix."""
    kernel = kernel * weights[None, :]
    if mask is not None:
        kernel = jnp.where(mask, kernel, 0)
    return kernel @ values
