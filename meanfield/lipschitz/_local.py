"""Local Lipschitz constants of self-attention (Castin, Ablin & Peyre, ICML 2024).

f(X)_i = Gamma_X(x_i) on (R^d)^n, Lip_X(f) = |D_X f|_2 = sigma_max(J), by power
iteration on J^T J with one `jax.jvp` and one `jax.vjp` (a linear transpose of the
linearisation) per step: J is never formed. MATH.md s. 5.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .._attention.base import AbstractAttention, interaction_matrix, param_at
from .._attention.norms import meanfield_lipschitz, value_norm
from .._attention.softmax import SoftmaxAttention
from .._measures import AbstractParticles, MaskedParticles, Particles
from .._params import at


class LipschitzResult(eqx.Module):
    """Local Lipschitz constant |D_X f|_2 from power iteration; `float(res)` is it.

    Attributes:
        value: sigma_max of the (weighted) Jacobian.
        direction: (n, d) maximising perturbation, unit in the norm of the problem
            (Euclidean; |e|_w^2 = sum_i w_i |e_i|^2 when weights were given).
        iterations: power iterations done.
        converged: stopped on the residual or on the stalled Rayleigh quotient, not
            on `max_iter`.
        residual: |M^T M u - rho u| / rho at the last iterate.
    """

    value: Float[Array, ""]
    direction: Float[Array, "n d"]
    iterations: Int[Array, ""]
    converged: Bool[Array, ""]
    residual: Float[Array, ""]

    def __float__(self) -> float:
        return float(self.value)


def _measure(x, positions, weights) -> AbstractParticles:
    if positions is None:
        return Particles(x, weights)
    return MaskedParticles(x, positions, weights)


def _operators(attn, measure, t, weighted):
    """(gram, apply): u -> M^T M u and u -> M u, M = diag(sqrt w) J diag(1/sqrt w).

    M is J in the weighted norm (M = J unweighted). `jax.linearize` stores the
    residuals of f once; the VJP is the linear transpose of the JVP.
    """
    x = measure.x
    sw = jnp.sqrt(measure.weights)[:, None] if weighted else jnp.ones_like(x[:, :1])

    def f(y):
        return attn.velocity(eqx.tree_at(lambda m: m.x, measure, y), t=t)

    _, jvp = jax.linearize(f, x)
    vjp = jax.linear_transpose(jvp, x)

    def apply(u):
        return sw * jvp(u / sw)

    def gram(u):  # M^T v = J^T(sw v) / sw
        (back,) = vjp(sw * apply(u))
        return back / sw

    return gram, apply, sw


def _result(gram, apply, sw, u, iterations, stopped, tol) -> LipschitzResult:
    # The value at the final unit u (|M u|), and its true residual: one more product.
    # `stopped`: the iteration met its own test (Ritz residual or stalled rho). The
    # true residual can stay above tol in float32: one product is only accurate
    # to ~ n d eps (2e-5 measured at n d = 256), while the Ritz estimate, computed
    # from the recurrence, keeps decreasing.
    g = gram(u)
    rho = jnp.vdot(u, g)
    residual = jnp.linalg.norm(g - rho * u) / rho
    converged = (residual <= tol) | stopped
    return LipschitzResult(
        jnp.linalg.norm(apply(u)), u / sw, iterations + 1, converged, residual
    )


def _iterate(update, u0, products: int, max_iter, tol, rtol):
    """Run `update(u) -> (u, rho, residual)` to convergence; (u, stopped, products).

    Stops at residual <= tol, a stalled rho (|Delta rho| <= rtol rho) or `max_iter`
    products (`products` per update); `stopped` is True unless the budget ran out.
    """
    dtype = u0.dtype

    def body(state):
        u, rho, _, _, it = state
        u, new_rho, residual = update(u)
        stalled = jnp.abs(new_rho - rho) <= rtol * new_rho
        return u, new_rho, residual, stalled, it + products

    def cond(state):
        _, _, residual, stalled, it = state
        return (it < max_iter) & (residual > tol) & ~stalled

    u0 = u0 / jnp.linalg.norm(u0)
    inf = jnp.asarray(jnp.inf, dtype)
    init = (u0, jnp.zeros((), dtype), inf, jnp.asarray(False), jnp.asarray(0))
    u, _, residual, stalled, it = jax.lax.while_loop(cond, body, init)
    return u, stalled | (residual <= tol), it


@eqx.filter_jit
def _power_iteration(attn, measure, u0, t, max_iter, tol, rtol, weighted):
    gram, apply, sw = _operators(attn, measure, t, weighted)

    def update(u):
        g = gram(u)
        rho = jnp.vdot(u, g)
        return g / jnp.linalg.norm(g), rho, jnp.linalg.norm(g - rho * u) / rho

    u, stopped, it = _iterate(update, u0, 1, max_iter, tol, rtol)
    return _result(gram, apply, sw, u, it, stopped, tol)


@eqx.filter_jit
def _lanczos(attn, measure, u0, t, max_iter, tol, rtol, weighted, krylov: int):
    """Restarted Lanczos on M^T M, restarting from the top Ritz vector.

    `krylov` products per cycle, with full reorthogonalisation.
    """
    gram, apply, sw = _operators(attn, measure, t, weighted)
    dtype = measure.x.dtype
    shape = measure.x.shape
    # A Krylov space has at most n d dimensions; beyond, w is pure rounding.
    krylov = min(krylov, measure.x.size)
    breakdown = 100 * measure.x.size * jnp.finfo(dtype).eps

    def cycle(u):
        basis = jnp.zeros((krylov + 1, *shape), dtype).at[0].set(u)

        def step(j, carry):
            basis, alpha, beta = carry
            v = basis[j]
            w = gram(v)
            alpha = alpha.at[j].set(jnp.vdot(v, w))
            # Full reorthogonalisation, twice (Kahan-Parlett): Krylov vectors lose
            # orthogonality exactly when a Ritz value converges.
            for _ in range(2):
                w = w - jnp.tensordot(jnp.tensordot(basis, w, w.ndim), basis, 1)
            b = jnp.linalg.norm(w)
            # Breakdown (invariant subspace found): what is left of w is rounding
            # noise, not a new direction; the rest of the basis stays 0.
            alive = b > breakdown * jnp.max(jnp.abs(alpha))
            b = jnp.where(alive, b, 0)
            beta = beta.at[j].set(b)
            nxt = jnp.where(alive, w / jnp.where(alive, b, 1), 0)
            return basis.at[j + 1].set(nxt), alpha, beta

        zeros = jnp.zeros((krylov,), dtype)
        basis, alpha, beta = jax.lax.fori_loop(0, krylov, step, (basis, zeros, zeros))
        T = jnp.diag(alpha) + jnp.diag(beta[:-1], 1) + jnp.diag(beta[:-1], -1)
        theta, S = jnp.linalg.eigh(T)
        top = S[:, -1]
        u = jnp.tensordot(top, basis[:-1], 1)
        u = u / jnp.linalg.norm(u)
        # Ritz residual |M^T M u - theta u| = beta_k |last entry of the Ritz vector|.
        residual = beta[-1] * jnp.abs(top[-1]) / theta[-1]
        return u, theta[-1], residual

    u, stopped, it = _iterate(cycle, u0, krylov, max_iter, tol, rtol)
    return _result(gram, apply, sw, u, it, stopped, tol)


METHODS = ("lanczos", "power")


def local(
    attn: AbstractAttention,
    x: ArrayLike,
    *,
    positions: ArrayLike | None = None,
    weights: ArrayLike | None = None,
    key: PRNGKeyArray | None = None,
    t: float = 0.0,
    method: str = "lanczos",
    max_iter: int = 2000,
    tol: float = 1e-8,
    rtol: float = 1e-13,
    krylov: int = 16,
) -> LipschitzResult:
    """Local Lipschitz constant |D_X f|_2 of f(X)_i = Gamma_X(x_i) (self-attention).

    Iterations on J^T J with `jax.linearize` + `linear_transpose` (one JVP and one
    VJP per product; J is never formed, memory is that of one linearised
    evaluation). method="power": u <- J^T J u / |J^T J u| (MATH.md s. 5).
    method="lanczos" (default): the same products accelerated in their Krylov space,
    `krylov` per cycle with full reorthogonalisation, restarted from the top Ritz
    vector. At adversarial inputs the top singular values nearly coincide and power
    iteration crawls: at the `adversarial` configuration (d = 2, R = 3) it stays
    1.6e-5 (n = 64) to 2.3e-4 (n = 1024) below the true value after 1000
    products; Lanczos converges there.

    Stops when the residual |J^T J u - rho u| <= tol rho (rho = <u, J^T J u>; for
    Lanczos the Ritz residual) or when rho stalls, |Delta rho| <= rtol rho (per
    product for power, per cycle for Lanczos). The value is |J u| at the final u.

    Masked (positions given): the causal map of Castin et al., Def. 2.6. Weighted
    (weights given): the mean-field version at mu = sum_i w_i delta_{x_i}, the norm of
    D_X f for |e|_w^2 = sum_i w_i |e_i|^2, i.e. sigma_max(diag(sqrt w) J
    diag(1/sqrt w)); uniform weights 1/n give the Euclidean value.

    Args:
        attn: any attention of meanfield (softmax, L2, Sinkhorn, multi-head, ...).
        x: tokens X, shape (n, d).
        positions: s (n,) in [0, 1] for masked attention, else None.
        weights: (n,) on the simplex for the weighted norm, else None (Euclidean).
        key: PRNG key of the random start; None means `jr.key(0)`.
        t: time at which time-dependent parameters are evaluated.
        method: "lanczos" or "power".
        max_iter: budget of J^T J products (`converged` False when it runs out).
        tol: residual tolerance, relative to rho (raised to 16 ulps of the dtype).
        rtol: stall tolerance on rho (raised to 4 ulps of the dtype).
        krylov: Lanczos products per cycle (memory: krylov + 1 copies of x).

    Returns:
        `LipschitzResult` (value, direction, iterations = products, converged,
        residual).

    Raises:
        ValueError: bad x / positions / weights (as for the measures), not an
            attention, unknown method.
    """
    if not isinstance(attn, AbstractAttention):
        raise ValueError(
            f"`attn` must be a meanfield attention; got {type(attn).__name__}."
        )
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}; got {method!r}.")
    measure = _measure(x, positions, weights)
    key = jr.key(0) if key is None else key
    dtype = measure.x.dtype
    eps = float(jnp.finfo(dtype).eps)
    u0 = jr.normal(key, measure.x.shape, dtype)
    args = (
        attn,
        measure,
        u0,
        jnp.asarray(t, dtype),
        max_iter,
        # Below the dtype's resolution neither test can ever pass (float32).
        jnp.asarray(max(tol, 16 * eps), dtype),
        jnp.asarray(max(rtol, 4 * eps), dtype),
        weights is not None,
    )
    if method == "power":
        return _power_iteration(*args)
    return _lanczos(*args, krylov=int(krylov))


def token_dim(attn: AbstractAttention, t=0.0) -> int:
    """d, read from the value matrix of the first head."""
    head, _ = attn.flat_heads(t)[0]
    return int(at(head.V, t).shape[-1])


def _check_size(n, R) -> tuple[int, float]:
    if int(n) != n or n < 1:
        raise ValueError(f"`n` must be a positive integer; got {n}.")
    if not R > 0:
        raise ValueError(f"`R` must be > 0; got {R}.")
    return int(n), float(R)


def upper_bound(attn: AbstractAttention, n: int, R: float, *, t=0.0):
    """Castin-Ablin-Peyre Thm 3.3 (and Thm 4.3, masked) on the ball B_R^n.

    Lip <= sqrt(3) |V|_2 (|A|_2^2 R^4 (4 n + 1) + n)^{1/2}; multi-head: the sum over
    heads of |W_h V_h|_2 / |V_h|_2-weighted head bounds, i.e. |V| replaced by
    |W_h V_h| (W_h Gamma_h is a head with values W_h V_h; at most |W_h| times it).
    Each head's factor is its family's `lipschitz_growth`.

    Args:
        attn: softmax attention, or multi-head of softmax heads (or of any family
            that gives `lipschitz_growth`).
        n: number of tokens.
        R: radius of the ball holding every token.
        t: time of time-dependent parameters.

    Returns:
        The bound (scalar).

    Raises:
        ValueError: a head without a finite-n bound, n < 1, R <= 0.
    """
    n, R = _check_size(n, R)
    d = token_dim(attn, t)
    total = 0.0
    for head, out in attn.flat_heads(t, d):
        growth = head.lipschitz_growth(n, R, t, d)
        if growth is None:
            raise ValueError(
                "`upper_bound` is proved for softmax attention (heads of "
                "MultiHeadAttention included) and families that give "
                f"`lipschitz_growth`; got a {type(head).__name__} head."
            )
        total = total + value_norm(head, t, d, out) * growth
    return total


def meanfield_bound(attn: AbstractAttention, R: float, *, t=0.0):
    """Mean-field bound (Geshkovski et al., 2023), unmasked: |V|(1+3|A|R^2)e^{2|A|R^2}.

    L2 and multi-head heads use the constants of `_stability` (same derivation).
    Masked attention exceeds this bound even as R -> 0 (the Cesaro matrix).

    Args:
        attn: softmax, L2, or multi-head of those.
        R: radius of the support.
        t: time of time-dependent parameters.

    Returns:
        The bound (scalar); +inf for families without one (Sinkhorn, ill-posed).
    """
    _check_size(1, R)
    d = token_dim(attn, t)
    return meanfield_lipschitz(attn, float(R), t, d)


def _direction(attn: SoftmaxAttention, t, d):
    """(u, lambda, gamma): unit u maximising gamma = max(-lambda, lambda / 8).

    lambda = <A u, u> ranges over the numerical range of A, i.e. the eigenvalues of
    its symmetric part: the extreme eigenvectors are the best u.
    """
    A = interaction_matrix(attn, t, d)
    lam, U = jnp.linalg.eigh((A + A.T) / 2)
    neg, pos = -lam[0], lam[-1] / 8
    use_neg = neg >= pos
    u = jnp.where(use_neg, U[:, 0], U[:, -1])
    return u, jnp.where(use_neg, lam[0], lam[-1]), jnp.maximum(neg, pos)


def _single_softmax(attn, name: str) -> SoftmaxAttention:
    if not isinstance(attn, SoftmaxAttention):
        raise ValueError(
            f"`{name}` needs a single SoftmaxAttention head (Castin et al., Prop. "
            f"3.4); got {type(attn).__name__}."
        )
    return attn


def adversarial(attn: AbstractAttention, n: int, R: float, *, t=0.0):
    """The (n, d) configuration of Castin et al., Prop. 3.4 (MATH.md s. 5).

    For a unit u with lambda = <A u, u>: lambda < 0 gives X = (R u, -R u, ..., -R u)
    with gamma = |lambda|; lambda > 0 gives X = (R u, R u/2, ..., R u/2), gamma =
    lambda / 8. The u (extreme eigenvector of (A + A^T)/2) maximises gamma. Lip grows
    like sqrt(n) while n <~ e^{2 gamma R^2}.

    Raises:
        ValueError: not a single softmax head, gamma = 0 (A antisymmetric), n < 2.
    """
    n, R = _check_size(n, R)
    if n < 2:
        raise ValueError(
            f"`n` must be >= 2 for the adversarial configuration; got {n}."
        )
    u, lam, gamma = _direction(
        _single_softmax(attn, "adversarial"), t, token_dim(attn, t)
    )
    if not float(gamma) > 0:
        raise ValueError("`attn.A` has a zero symmetric part: no adversarial growth.")
    rest = jnp.where(lam < 0, -R * u, R * u / 2)
    return jnp.concatenate([R * u[None, :], jnp.tile(rest[None, :], (n - 1, 1))])


def lower_bound(attn: AbstractAttention, n: int, R: float, *, t=0.0):
    """Castin et al., Prop. 3.4 at the `adversarial` configuration in B_R^n.

    Lip >= sqrt(n - 1) P (1 + 2 gamma R^2 (1 - P)) |V u| with
    P = 1 / (1 + (n - 1) e^{-2 gamma R^2}): the norm of rows 2..n of the directional
    derivative along (u, 0, ..., 0). The paper takes V = I (|V u| = 1); rows 2..n are
    V times the V = I rows, hence the factor for general V.

    Raises:
        ValueError: as `adversarial`.
    """
    n, R = _check_size(n, R)
    head = _single_softmax(attn, "lower_bound")
    d = token_dim(head, t)
    u, _, gamma = _direction(head, t, d)
    vu = jnp.linalg.norm(param_at(head.V, t, "V", (d, d)) @ u)
    P = 1 / (1 + (n - 1) * jnp.exp(-2 * gamma * R**2))
    return jnp.sqrt(n - 1.0) * P * (1 + 2 * gamma * R**2 * (1 - P)) * vu


def meanfield_adversarial(attn: AbstractAttention, R: float, *, t=0.0):
    """Two-Dirac measure of Castin et al., Prop. 3.6: p delta_{R u} + (1 - p) delta_y.

    p = e^{-2 gamma R^2}, y = -R u (lambda < 0) or R u / 2 (lambda > 0). Its weighted
    local Lipschitz constant L >= (gamma / 2) R^2 e^{gamma R^2}, with
    L / ((gamma / 2) R^2 e^{gamma R^2}) -> 1 as R grows (excess ~ 1 + 1 / (gamma R^2)).

    Returns:
        `Particles` with x (2, d), weights (p, 1 - p).
    """
    _check_size(2, R)
    head = _single_softmax(attn, "meanfield_adversarial")
    u, lam, gamma = _direction(head, t, token_dim(head, t))
    p = jnp.exp(-2 * gamma * R**2)
    y = jnp.where(lam < 0, -R * u, R * u / 2)
    return Particles(jnp.stack([R * u, y]), jnp.stack([p, 1 - p]))


def meanfield_adversarial_rate(attn: AbstractAttention, R: float, *, t=0.0):
    """(gamma / 2) R^2 e^{gamma R^2}: the growth of the two-Dirac constant."""
    head = _single_softmax(attn, "meanfield_adversarial")
    _, _, gamma = _direction(head, t, token_dim(head, t))
    return gamma / 2 * R**2 * jnp.exp(gamma * R**2)
