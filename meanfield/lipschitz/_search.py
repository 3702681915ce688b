"""Adversarial search: projected gradient ascent of the local Lipschitz constant.

Maximise Lip_X(f) = sigma_max(D_X f) over X in the ball B_R^n (every token |x_i| <= R),
as Castin, Ablin & Peyre (ICML 2024) do to probe the sqrt(n) growth. The gradient of
sigma_max is <v, (d J) u> at the top singular pair (u, v) (envelope theorem), i.e. the
gradient of |J(X) u| with u held fixed; u is refreshed by a few warm-started power
iterations per step. Adam (optax) takes the steps; each step projects the rows back
on B_R.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import optax
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._attention.base import AbstractAttention
from .._repr import fields_repr
from ._local import adversarial, local, measure_of, token_dim


class SearchResult(eqx.Module):
    """Best input found by `adversarial_search`.

    Attributes:
        x: the best configuration (n, d), every row in B_R (the best iterate of the
            best restart).
        value: its local Lipschitz constant (converged power iteration).
        values: final constant of every restart (restarts,).
        history: the objective along the ascent (restarts, steps).
        heuristic: local constant at `adversarial(attn, n, R)` (single softmax
            head), -inf when there is none.
    """

    x: Float[Array, "n d"]
    value: Float[Array, ""]
    values: Float[Array, " restarts"]
    history: Float[Array, "restarts steps"]
    heuristic: Float[Array, ""]

    def __repr__(self) -> str:
        return fields_repr(
            self,
            value=self.value,
            heuristic=self.heuristic,
            values=self.values,
            x=self.x,
            history=self.history,
        )


def project_ball(x: Float[Array, "n d"], R) -> Float[Array, "n d"]:
    """Rows scaled back onto the ball |x_i| <= R."""
    norms = jnp.linalg.norm(x, axis=1, keepdims=True)
    return x * jnp.minimum(1.0, R / jnp.maximum(norms, jnp.finfo(x.dtype).tiny))


def random_ball(key: PRNGKeyArray, n: int, d: int, R, dtype) -> Float[Array, "n d"]:
    """Tokens x_i ~ N(0, (R^2 / d) I) (typical norm R), projected on B_R."""
    x = jr.normal(key, (n, d), dtype) * (R / jnp.sqrt(d))
    return project_ball(x, R)


@eqx.filter_jit
def _ascent(attn, measure, x0, u0, R, learning_rate, steps: int, inner: int):
    optimizer = optax.adam(learning_rate)

    def f_at(x):
        return lambda y: attn.velocity(eqx.tree_at(lambda m: m.x, measure, y))

    def refresh(x, u):  # a few power iterations on J^T J, warm-started
        _, jvp = jax.linearize(f_at(x), x)
        vjp = jax.linear_transpose(jvp, x)

        def one(_, u):
            (g,) = vjp(jvp(u))
            return g / jnp.linalg.norm(g)

        return jax.lax.fori_loop(0, inner, one, u)

    def objective(x, u):  # |J(x) u| with u fixed: gradient of sigma_max at (u, v)
        _, ju = jax.jvp(f_at(x), (x,), (u,))
        return jnp.linalg.norm(ju)

    def step(carry, _):
        x, u, state, best_x, best = carry
        u = refresh(x, u)
        value, grad = jax.value_and_grad(objective)(x, u)
        # Adam oscillates near the top: keep the best iterate, not the last.
        best_x = jnp.where(value > best, x, best_x)
        best = jnp.maximum(value, best)
        updates, state = optimizer.update(-grad, state, x)  # ascent
        x = project_ball(optax.apply_updates(x, updates), R)
        return (x, u, state, best_x, best), value

    init = (x0, u0, optimizer.init(x0), x0, jnp.asarray(-jnp.inf, x0.dtype))
    (_, _, _, best_x, _), history = jax.lax.scan(step, init, None, length=steps)
    return best_x, history


def adversarial_search(
    attn: AbstractAttention,
    n: int,
    R: float,
    *,
    key: PRNGKeyArray | None = None,
    positions: ArrayLike | None = None,
    restarts: int = 4,
    steps: int = 200,
    learning_rate: float | None = None,
    inner: int = 3,
) -> SearchResult:
    """Projected gradient ascent (Adam) of Lip_X(f) over X in B_R^n, several restarts.

    Restarts start from random tokens (N(0, R^2/d I) projected on B_R); for a single
    softmax head one more starts from the heuristic configuration `adversarial`
    (Castin et al., Prop. 3.4), so the search never ends below it.

    Args:
        attn: any attention.
        n: number of tokens.
        R: radius of the ball.
        key: PRNG key of the random starts; None means `jr.key(0)`.
        positions: (n,) positions for masked attention, else None.
        restarts: random starts.
        steps: ascent steps per start.
        learning_rate: Adam step; None means 0.02 R.
        inner: power iterations per step refreshing the top singular vector.

    Returns:
        `SearchResult` (best x and value, per-restart values and histories, the
        heuristic's value).

    Raises:
        ValueError: n < 2, R <= 0, restarts < 1, steps < 1.
    """
    if int(n) != n or n < 2:
        raise ValueError(f"`n` must be an integer >= 2; got {n}.")
    if not R > 0:
        raise ValueError(f"`R` must be > 0; got {R}.")
    if restarts < 1 or steps < 1:
        raise ValueError(
            f"`restarts` and `steps` must be >= 1; got {restarts} and {steps}."
        )
    n, R = int(n), float(R)
    d = token_dim(attn)
    key = jr.key(0) if key is None else key
    dtype = jnp.result_type(float)
    lr = 0.02 * R if learning_rate is None else learning_rate
    keys = jr.split(key, restarts)
    starts = [random_ball(k, n, d, R, dtype) for k in keys]
    try:
        heuristic_x = adversarial(attn, n, R).astype(dtype)
    except ValueError:  # not a single softmax head, or no growth direction
        heuristic_x = None
    if heuristic_x is not None:
        starts.append(heuristic_x)

    finals, values, histories = [], [], []
    for i, x0 in enumerate(starts):
        measure = measure_of(x0, positions, None)
        u0 = jr.normal(jr.fold_in(key, i), x0.shape, dtype)
        u0 = u0 / jnp.linalg.norm(u0)
        x, history = _ascent(
            attn, measure, x0, u0, jnp.asarray(R, dtype), lr, steps, inner
        )
        finals.append(x)
        histories.append(history)
        values.append(local(attn, x, positions=positions, key=key).value)
    values = jnp.stack(values)
    best = int(jnp.argmax(values))
    heuristic = (
        -jnp.inf
        if heuristic_x is None
        else local(attn, heuristic_x, positions=positions, key=key).value
    )
    return SearchResult(
        x=finals[best],
        value=values[best],
        values=values,
        history=jnp.stack(histories),
        heuristic=jnp.asarray(heuristic, dtype),
    )
