"""Local Lipschitz constants of self-attention (Castin, Ablin & Peyre, ICML 2024).

f(X)_i = Gamma_X(x_i) on (R^d)^n, Lip_X(f) = |D_X f|_2 = sigma_max(J), by power
iteration on J^T J with one `jax.jvp` and one `jax.vjp` (a linear transpose of the
linearisation) per step: J is never formed. docs/math/lipschitz.md.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .._attention.base import AbstractAttention, interaction_matrix, param_at
from .._attention.norms import meanfield_lipschitz, value_norm
from .._attention.softmax import SoftmaxAttention
from .._checks import is_traced, reject_result
from .._feedforward import AbstractFeedForward
from .._measures import AbstractParticles, MaskedParticles, Particles
from .._params import at
from .._repr import fields_repr


class LipschitzResult(eqx.Module):
    """Local Lipschitz constant |D_X f|_2 from power iteration; `float(res)` is it.

    Attributes:
        value: sigma_max of the (weighted) Jacobian.
        direction: (n, d) maximising perturbation, unit in the norm of the problem
            (Euclidean; |e|_w^2 = sum_i w_i |e_i|^2 when weights were given).
        iterations: products M^T M u done.
        converged: the true residual of the returned direction meets the
            tolerance (`residual` <= tol), computed from one more product; never
            the estimate of a recurrence.
        residual: |M^T M u - rho u| / rho at the returned u (rho = <u, M^T M u>).
            Some singular value s of M satisfies |s^2 - rho| <= residual rho
            (Krylov-Bogoliubov), and the value is ~ rho^(1/2).
    """

    value: Float[Array, ""]
    direction: Float[Array, "n d"]
    iterations: Int[Array, ""]
    converged: Bool[Array, ""]
    residual: Float[Array, ""]

    def __float__(self) -> float:
        return float(self.value)

    def __repr__(self) -> str:
        return fields_repr(
            self,
            value=self.value,
            converged=self.converged,
            iterations=self.iterations,
            residual=self.residual,
            direction=self.direction,
        )


def measure_of(x, positions, weights) -> AbstractParticles:
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


def _rayleigh(u, g):
    """(rho, relative residual) of a unit u with g = M^T M u."""
    rho = jnp.vdot(u, g)
    residual = jnp.linalg.norm(g - rho * u) / jnp.where(rho > 0, rho, 1)
    return rho, jnp.where(rho > 0, residual, jnp.inf)


def _iterate(gram, apply, sw, step, u0, products, max_iter, tol, rtol):
    """Iterate `step(u, g) -> u_new` (g = M^T M u) to convergence.

    Every iterate's true residual |M^T M u - rho u| / rho is computed from one
    product (which the next step reuses as its g), so the loop stops on, and
    `converged` reports, the residual of the returned vector: never an estimate
    from a recurrence. Stops at residual <= tol, at a stall (|Delta rho| <= rtol
    rho and a residual that no longer falls: rounding keeps it above tol;
    `converged` False), or when the next step would pass `max_iter` products
    (`products` per step, + 1 for the residual).
    """
    u0 = u0 / jnp.linalg.norm(u0)
    g0 = gram(u0)
    rho0, res0 = _rayleigh(u0, g0)

    def body(state):
        u, g, rho, residual, _, it = state
        new_u = step(u, g)
        new_u = new_u / jnp.linalg.norm(new_u)
        new_g = gram(new_u)
        new_rho, new_residual = _rayleigh(new_u, new_g)
        # Rounding, not slow convergence: rho no longer moves and the residual
        # no longer shrinks (power iteration with close singular values moves
        # rho by ~ residual^2 per step while the residual still falls).
        stalled = (jnp.abs(new_rho - rho) <= rtol * jnp.abs(new_rho)) & (
            new_residual >= residual
        )
        return new_u, new_g, new_rho, new_residual, stalled, it + products + 1

    def cond(state):
        _, _, _, residual, stalled, it = state
        return (it + products + 1 <= max_iter) & (residual > tol) & ~stalled

    init = (u0, g0, rho0, res0, jnp.asarray(False), jnp.asarray(1))
    u, _, _, residual, _, it = jax.lax.while_loop(cond, body, init)
    return LipschitzResult(
        jnp.linalg.norm(apply(u)), u / sw, it, residual <= tol, residual
    )


@eqx.filter_jit
def _power_iteration(attn, measure, u0, t, max_iter, tol, rtol, weighted):
    gram, apply, sw = _operators(attn, measure, t, weighted)
    return _iterate(gram, apply, sw, lambda u, g: g, u0, 0, max_iter, tol, rtol)


@eqx.filter_jit
def _lanczos(attn, measure, u0, t, max_iter, tol, rtol, weighted, krylov: int):
    """Restarted Lanczos on M^T M, restarting from the top Ritz vector.

    A cycle spans {u, G u, ..., G^(krylov-1) u} (G = M^T M; G u is already known,
    so krylov - 1 new products) with full reorthogonalisation, then one product
    gives the Ritz vector's true residual.
    """
    gram, apply, sw = _operators(attn, measure, t, weighted)
    dtype = measure.x.dtype
    shape = measure.x.shape
    # A Krylov space has at most n d dimensions; beyond, w is pure rounding.
    krylov = min(krylov, measure.x.size)
    # Breakdown (an invariant subspace) is declared when what is left of w after
    # orthogonalisation is at rounding level, 100 eps of the spectrum's scale. It
    # must stay below every residual the loop is asked to reach: at step 0,
    # |w| = residual(u) rho, so a threshold of sqrt(eps) (1.5e-8) stalled float64
    # runs at a residual of 1.1e-8 > tol, and one that grew with n d (100 n d
    # eps, 0.59 in float32 at n d = 49152) cut every Krylov space after a few
    # vectors and stopped at a wrong Ritz value.
    breakdown = 100 * jnp.finfo(dtype).eps

    def extend(j, w, carry):
        # w = G v_j: the next Lanczos vector v_{j+1}, alpha_j and beta_j.
        basis, alpha, beta = carry
        alpha = alpha.at[j].set(jnp.vdot(basis[j], w))
        # Full reorthogonalisation, twice (Kahan-Parlett): Krylov vectors lose
        # orthogonality exactly when a Ritz value converges.
        for _ in range(2):
            w = w - jnp.tensordot(jnp.tensordot(basis, w, w.ndim), basis, 1)
        b = jnp.linalg.norm(w)
        # Breakdown: what is left of w is rounding noise, not a new direction;
        # the rest of the basis stays 0.
        alive = b > breakdown * jnp.max(jnp.abs(alpha))
        b = jnp.where(alive, b, 0)
        beta = beta.at[j].set(b)
        nxt = jnp.where(alive, w / jnp.where(alive, b, 1), 0)
        return basis.at[j + 1].set(nxt), alpha, beta

    def cycle(u, g):
        zeros = jnp.zeros((krylov,), dtype)
        basis = jnp.zeros((krylov + 1, *shape), dtype).at[0].set(u)
        carry = extend(0, g, (basis, zeros, zeros))
        basis, alpha, beta = jax.lax.fori_loop(
            1, krylov, lambda j, c: extend(j, gram(c[0][j]), c), carry
        )
        T = jnp.diag(alpha) + jnp.diag(beta[:-1], 1) + jnp.diag(beta[:-1], -1)
        _, S = jnp.linalg.eigh(T)
        return jnp.tensordot(S[:, -1], basis[:-1], 1)

    return _iterate(gram, apply, sw, cycle, u0, krylov - 1, max_iter, tol, rtol)


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
    refine: bool = True,
) -> LipschitzResult:
    """Local Lipschitz constant |D_X f|_2 of f(X)_i = Gamma_X(x_i) (self-attention).

    Iterations on J^T J with `jax.linearize` + `linear_transpose` (one JVP and one
    VJP per product; J is never formed, memory is that of one linearised
    evaluation). method="power": u <- J^T J u / |J^T J u| (docs/math/lipschitz.md).
    method="lanczos" (default): the same products accelerated in their Krylov space,
    `krylov` per cycle with full reorthogonalisation, restarted from the top Ritz
    vector. At adversarial inputs the top singular values nearly coincide and power
    iteration crawls: at the `adversarial` configuration (d = 2, R = 3) it stays
    1.6e-5 (n = 64) to 2.3e-4 (n = 1024) below the true value after 1000
    products; Lanczos converges there.

    Stops when the true residual |J^T J u - rho u| <= tol rho (rho = <u, J^T J u>,
    computed from a product at every iterate: `converged` says this held), when
    rounding stalls it (|Delta rho| <= rtol rho while the residual no longer falls;
    per product for power, per cycle for Lanczos; `converged` False) or when
    `max_iter` would be passed. The value is |J u| at the final u.

    Float32: a product J^T J u is only accurate to ~1e-5 relative at n d ~ 5e4
    (12 heads, d = 384), so a float32 residual measures the rounded products, not
    the map: a float32 run can meet tol with a value 5e-6 off. With `refine`
    (default) and float64 enabled (`jax_enable_x64`), a run in a narrower dtype is
    therefore checked and, if needed, finished in float64 from its vector, on the
    same map (its parameters evaluated in float64): the float64 residual decides
    `converged` (usually one product when the float32 run converged; at most the
    budget left, and at least one product). The value and direction keep the
    input's dtype. Without float64 (or inside jit/vmap, or with `refine=False`)
    the float32 residual decides, and values are accurate to the products'
    rounding only.

    Masked (positions given): the causal map of Castin et al., Def. 2.6. Weighted
    (weights given): the mean-field version at mu = sum_i w_i delta_{x_i}, the norm of
    D_X f for |e|_w^2 = sum_i w_i |e_i|^2, i.e. sigma_max(diag(sqrt w) J
    diag(1/sqrt w)); uniform weights 1/n give the Euclidean value.

    See [The local constant][math-lipschitz-local] for the method and what `converged`
    guarantees.

    Args:
        attn: any velocity field of meanfield (softmax, L2, Sinkhorn, multi-head,
            positional, hardmax, ...), a feed-forward field or an `mf.Block`.
        x: tokens X, shape (n, d).
        positions: s (n,) in [0, 1] for masked attention (needed by the
            positional families, ALiBi and RoPE), else None.
        weights: (n,) on the simplex for the weighted norm, else None (Euclidean).
        key: PRNG key of the random start; None means `jr.key(0)`.
        t: time at which time-dependent parameters are evaluated.
        method: "lanczos" or "power".
        max_iter: budget of J^T J products (`converged` False when it runs out;
            a Lanczos cycle needs krylov of them after the first).
        tol: residual tolerance, relative to rho (raised to 16 ulps of the dtype).
        rtol: stall tolerance on rho (raised to 4 ulps of the dtype).
        krylov: Lanczos products per cycle (>= 2; memory: krylov + 1 copies of x).
        refine: check and finish a float32 (or narrower) run in float64 when
            float64 is enabled and the inputs are concrete (see above).

    Returns:
        `LipschitzResult` (value, direction, iterations = products, converged,
        residual).

    Raises:
        ValueError: bad x / positions / weights (as for the measures), not an
            attention, unknown method, max_iter < 1, krylov < 2, tol or rtol not
            positive.
        TypeError: `x` is a `Solution` (pass `sol.x[i]` for save time i) or a
            measure (pass its positions `.x`, its weights as `weights`).
    """
    reject_result(x, "x", "local")
    if not isinstance(attn, AbstractAttention):
        raise ValueError(
            f"`attn` must be a meanfield attention; got {type(attn).__name__}."
        )
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}; got {method!r}.")
    if int(max_iter) != max_iter or max_iter < 1:
        raise ValueError(f"`max_iter` must be a positive integer; got {max_iter!r}.")
    if int(krylov) != krylov or krylov < 2:
        raise ValueError(f"`krylov` must be an integer >= 2; got {krylov!r}.")
    for name, value in (("tol", tol), ("rtol", rtol)):
        if not float(value) > 0:
            raise ValueError(f"`{name}` must be positive; got {value!r}.")
    measure = measure_of(x, positions, weights)
    key = jr.key(0) if key is None else key
    dtype = measure.x.dtype
    u0 = jr.normal(key, measure.x.shape, dtype)
    weighted = weights is not None
    solve = functools.partial(
        _solve, method=method, krylov=int(krylov), weighted=weighted
    )
    res = solve(attn, measure, u0, t, int(max_iter), tol, rtol)
    wide = jnp.float64
    if not (
        refine
        and jax.config.jax_enable_x64
        and jnp.finfo(dtype).bits < 64
        and not is_traced(*jax.tree.leaves(eqx.filter((attn, measure), eqx.is_array)))
    ):
        return res
    # The same map in float64, from the float32 vector (u = direction in the
    # problem's norm, times sqrt(w) when weighted).
    to_wide = functools.partial(
        jax.tree.map,
        lambda a: a.astype(wide) if eqx.is_inexact_array(a) else a,
    )
    start = res.direction.astype(wide)
    if weighted:
        start = start * jnp.sqrt(measure.weights.astype(wide))[:, None]
    fine = solve(
        to_wide(attn),
        to_wide(measure),
        start,
        t,
        # At least the one product that checks the float32 vector.
        max(1, int(max_iter) - int(res.iterations)),
        tol,
        rtol,
    )
    return LipschitzResult(
        fine.value.astype(dtype),
        fine.direction.astype(dtype),
        res.iterations + fine.iterations,
        fine.converged,
        fine.residual.astype(dtype),
    )


def _solve(attn, measure, u0, t, max_iter, tol, rtol, *, method, krylov, weighted):
    """One solve in the measure's dtype (tolerances floored at its resolution)."""
    dtype = measure.x.dtype
    eps = float(jnp.finfo(dtype).eps)
    args = (
        attn,
        measure,
        u0,
        jnp.asarray(t, dtype),
        # Traced: a refinement with the budget left reuses the compiled solve.
        jnp.asarray(max_iter),
        # Below the dtype's resolution neither test can ever pass.
        jnp.asarray(max(tol, 16 * eps), dtype),
        jnp.asarray(max(rtol, 4 * eps), dtype),
        weighted,
    )
    if method == "power":
        return _power_iteration(*args)
    return _lanczos(*args, krylov=krylov)


def token_dim(attn: AbstractAttention, t=0.0) -> int:
    """d, read from the first head: its value matrix, or a feed-forward field's own.

    A feed-forward field (`mf.FeedForward`, `mf.MLP`) has no value matrix; it
    knows the d its parameters act on.
    """
    head, _ = attn.flat_heads(t)[0]
    if isinstance(head, AbstractFeedForward):
        return head.token_dim(t)
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

    See [Upper bounds][math-lipschitz-upper].

    Args:
        attn: softmax attention, or multi-head of softmax heads (or of any family
            that gives `lipschitz_growth`).
        n: number of tokens.
        R: radius of the ball holding every token.
        t: time of time-dependent parameters.

    Returns:
        The bound (scalar).

    Raises:
        ValueError: a head without a finite-n bound (positional, hardmax, ...),
            a feed-forward field (alone or in `mf.Block`), n < 1, R <= 0.
    """
    n, R = _check_size(n, R)
    d = token_dim(attn, t)
    total = 0.0
    for head, out in attn.flat_heads(t, d):
        growth = head.lipschitz_growth(n, R, t, d)
        if growth is None:
            name = type(head).__name__
            got = (
                f"got a feed-forward field ({name}, alone or in `mf.Block`)"
                if isinstance(head, AbstractFeedForward)
                else f"got a {name} head"
            )
            raise ValueError(
                "`upper_bound` is proved for softmax attention (heads of "
                "MultiHeadAttention included) and families that give "
                f"`lipschitz_growth`; {got}, which has no such bound."
            )
        total = total + value_norm(head, t, d, out) * growth
    return total


def meanfield_bound(attn: AbstractAttention, R: float, *, t=0.0):
    """Mean-field bound (Geshkovski et al., 2023), unmasked: |V|(1+3|A|R^2)e^{2|A|R^2}.

    L2 and multi-head heads use the constants of `_stability` (same derivation).
    Masked attention exceeds this bound even as R -> 0 (the Cesaro matrix).

    See [The mean-field bound][math-lipschitz-meanfield], derived in
    [Stability][math-stability].

    Args:
        attn: softmax, L2, or multi-head of those.
        R: radius of the support.
        t: time of time-dependent parameters.

    Returns:
        The bound (scalar); +inf for fields without one: Sinkhorn, ill-posed,
        positional and hardmax attention, feed-forward fields and `mf.Block`.
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
    """The (n, d) configuration of Castin et al., Prop. 3.4 (docs/math/lipschitz.md).

    For a unit u with lambda = <A u, u>: lambda < 0 gives X = (R u, -R u, ..., -R u)
    with gamma = |lambda|; lambda > 0 gives X = (R u, R u/2, ..., R u/2), gamma =
    lambda / 8. The u (extreme eigenvector of (A + A^T)/2) maximises gamma. Lip grows
    like sqrt(n) while n <~ e^{2 gamma R^2}.

    See [Lower bound and adversarial inputs][math-lipschitz-lower].

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

    See [Lower bound and adversarial inputs][math-lipschitz-lower].

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

    See [The mean-field adversarial measure][math-lipschitz-meanfield-adversarial].

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
    """(gamma / 2) R^2 e^{gamma R^2}: the growth of the two-Dirac constant.

    See [The mean-field adversarial measure][math-lipschitz-meanfield-adversarial].
    """
    head = _single_softmax(attn, "meanfield_adversarial")
    _, _, gamma = _direction(head, t, token_dim(head, t))
    return gamma / 2 * R**2 * jnp.exp(gamma * R**2)
