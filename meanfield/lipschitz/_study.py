"""How the local Lipschitz constant of attention grows with the number of tokens.

Castin, Ablin & Peyre, "How Smooth Is Attention?" (ICML 2024): on the ball B_R the
local Lipschitz constant of softmax self-attention is O(sqrt(n)) (Thm 3.3), the
bound is attained up to constants by an explicit configuration (Prop. 3.4), while
random inputs and the inputs a trained model sees grow more slowly (their Fig. 1:
every layer of a pretrained BERT against the sequence length).

`scaling_study` measures Lip at random, adversarial and searched inputs for a range
of n beside the two bounds; `real_model_study` measures every layer of a BERT-family
encoder on the first n tokens of a text. Both fit log-log slopes.
"""

import dataclasses
import time

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import ArrayLike, PRNGKeyArray
from tqdm import tqdm

from .._attention.base import AbstractAttention
from .._repr import fields_repr
from ..bert import BertModel, attention_layer, hidden_states
from ._local import adversarial, local, lower_bound, token_dim, upper_bound
from ._search import adversarial_search, random_ball


def fit_slope(ns: ArrayLike, values: ArrayLike) -> float:
    """Least-squares slope of log(value) against log(n).

    Points with a non-finite or non-positive value are left out.

    Args:
        ns: sizes (k,), positive.
        values: measurements (k,).

    Returns:
        The slope; NaN when fewer than two distinct n remain.
    """
    ns = np.asarray(ns, float)
    values = np.asarray(values, float)
    keep = np.isfinite(values) & (values > 0)
    if np.unique(ns[keep]).size < 2:
        return float("nan")
    return float(np.polyfit(np.log(ns[keep]), np.log(values[keep]), 1)[0])


@dataclasses.dataclass(frozen=True)
class ScalingStudy:
    """Local Lipschitz constants of one attention against n on B_R (NumPy arrays).

    Attributes:
        ns: numbers of tokens (k,).
        R: radius of the ball holding every token.
        random: Lip at random tokens N(0, R^2/d I) projected on B_R (k,).
        random_converged: Lanczos converged there (k,).
        adversarial: Lip at `adversarial(attn, n, R)` (Castin et al., Prop. 3.4)
            (k,); None unless `attn` is a single `SoftmaxAttention` whose A has a
            nonzero symmetric part.
        adversarial_converged: (k,), None with `adversarial`.
        searched: best Lip of `adversarial_search` (k,); NaN where n >
            `search_max_n` (not searched).
        searched_converged: Lanczos converged at the searched input (k,); False
            where not searched.
        upper: `upper_bound` (Thm 3.3) (k,); None unless `attn` is softmax or
            multi-head of softmax heads.
        lower: `lower_bound` (Prop. 3.4) (k,); None with `adversarial`.
        slopes: least-squares log-log slope of every series present ("random",
            "adversarial", "searched", "upper", "lower"; NaN below two points).
        wall_s: seconds spent per n (k,), compilation included.
    """

    ns: np.ndarray
    R: float
    random: np.ndarray
    random_converged: np.ndarray
    adversarial: np.ndarray | None
    adversarial_converged: np.ndarray | None
    searched: np.ndarray
    searched_converged: np.ndarray
    upper: np.ndarray | None
    lower: np.ndarray | None
    slopes: dict
    wall_s: np.ndarray

    def __repr__(self) -> str:
        return fields_repr(
            self,
            ns=self.ns,
            R=self.R,
            slopes=self.slopes,
            random=self.random,
            random_converged=self.random_converged,
        )

    def series(self) -> dict[str, np.ndarray]:
        """The measured and bound series that exist, by name (slopes' keys)."""
        names = ("random", "adversarial", "searched", "upper", "lower")
        return {
            name: getattr(self, name)
            for name in names
            if getattr(self, name) is not None
        }


def _check_sizes(values, name: str, minimum: int) -> np.ndarray:
    arr = np.asarray(values)
    ok = (
        arr.ndim == 1
        and arr.size > 0
        and (np.issubdtype(arr.dtype, np.integer) or np.all(arr == np.round(arr)))
        and np.all(arr >= minimum)
    )
    if not ok:
        raise ValueError(
            f"`{name}` must be a non-empty 1-D sequence of integers >= {minimum}; "
            f"got {values!r}."
        )
    return arr.astype(int)


def scaling_study(
    attn: AbstractAttention,
    ns: ArrayLike,
    R: float,
    *,
    key: PRNGKeyArray | None = None,
    search_max_n: int = 0,
    search_kwargs: dict | None = None,
    progress: bool = False,
) -> ScalingStudy:
    """Lip_X(f) against n at random, adversarial and searched X in B_R^n.

    For every n: the local constant (`local`, Lanczos) at random tokens
    (`random_ball`), at the configuration of Castin et al., Prop. 3.4
    (`adversarial`; single softmax head only), and, for n <= `search_max_n`, the
    best constant `adversarial_search` finds (projected Adam ascent; for a single
    softmax head it also starts from the Prop. 3.4 configuration, so it never ends
    below it); beside the upper bound of Thm 3.3 (softmax and multi-head of
    softmax) and the lower bound of Prop. 3.4 (single softmax head). Inputs are in
    the default float dtype (float64 under `jax_enable_x64`); Lanczos cycles are
    capped at n d products (the dimension).

    Args:
        attn: any attention of meanfield; the bounds and the adversarial
            configuration are computed where they are defined.
        ns: numbers of tokens, integers >= 2.
        R: radius of the ball; every token has |x_i| <= R.
        key: PRNG key of the random inputs and of the search; None means
            `jr.key(0)`. Input n uses `fold_in(key, n)`, so a size's input does not
            depend on the other sizes.
        search_max_n: run the search for n <= this (0: never).
        search_kwargs: extra keyword arguments of `adversarial_search` (restarts,
            steps, learning_rate, inner).
        progress: show a tqdm bar over n (on stderr); off by default, as in every
            library function (the `meanfield` command turns it on).

    Returns:
        A `ScalingStudy`.

    Raises:
        ValueError: ns not integers >= 2, R <= 0, or an invalid attention.
    """
    ns = _check_sizes(ns, "ns", 2)
    if not R > 0:
        raise ValueError(f"`R` must be > 0; got {R}.")
    R = float(R)
    key = jr.key(0) if key is None else key
    k_random, k_search = jr.split(key)
    search_kwargs = {} if search_kwargs is None else dict(search_kwargs)
    d = token_dim(attn)
    dtype = jnp.result_type(float)

    try:
        adversarial(attn, 2, R)
        has_adversarial = True
    except ValueError:  # not a single softmax head, or no growth direction
        has_adversarial = False
    try:
        upper_bound(attn, 2, R)
        has_upper = True
    except ValueError:
        has_upper = False

    k = ns.size
    random = np.empty(k)
    random_ok = np.zeros(k, bool)
    adv = np.full(k, np.nan)
    adv_ok = np.zeros(k, bool)
    searched = np.full(k, np.nan)
    searched_ok = np.zeros(k, bool)
    upper = np.full(k, np.nan)
    lower = np.full(k, np.nan)
    wall = np.empty(k)
    bar = tqdm(ns, desc="Lipschitz vs n", disable=not progress, leave=False)
    for i, n in enumerate(bar):
        n = int(n)
        start = time.perf_counter()
        x = random_ball(jr.fold_in(k_random, n), n, d, R, dtype)
        res = local(attn, x)
        random[i], random_ok[i] = float(res.value), bool(res.converged)
        if has_adversarial:
            res = local(attn, adversarial(attn, n, R).astype(dtype))
            adv[i], adv_ok[i] = float(res.value), bool(res.converged)
            lower[i] = float(lower_bound(attn, n, R))
        if has_upper:
            upper[i] = float(upper_bound(attn, n, R))
        if n <= search_max_n:
            k_n = jr.fold_in(k_search, n)
            found = adversarial_search(attn, n, R, key=k_n, **search_kwargs)
            # The call `adversarial_search` made for its value, with the flag.
            res = local(attn, found.x, key=k_n)
            searched[i], searched_ok[i] = float(res.value), bool(res.converged)
        wall[i] = time.perf_counter() - start
        bar.set_postfix(n=n, lip=f"{random[i]:.3g}")
    bar.close()

    series = {
        "random": random,
        "adversarial": adv if has_adversarial else None,
        "searched": searched,
        "upper": upper if has_upper else None,
        "lower": lower if has_adversarial else None,
    }
    return ScalingStudy(
        ns=ns,
        R=R,
        random_converged=random_ok,
        adversarial_converged=adv_ok if has_adversarial else None,
        searched_converged=searched_ok,
        slopes={
            name: fit_slope(ns, values)
            for name, values in series.items()
            if values is not None
        },
        wall_s=wall,
        **series,
    )


@dataclasses.dataclass(frozen=True)
class RealModelStudy:
    """Local Lipschitz constant of every attention layer of an encoder on real text.

    Attributes:
        lengths: sequence lengths n (k,): the first n tokens of the text.
        layers: layer indices (m,).
        values: Lip of layer `layers[j]` at length `lengths[i]`, shape (m, k).
        converged: Lanczos converged, (m, k).
        iterations: J^T J products, (m, k).
        slopes: least-squares log-log slope per layer (m,).
        wall_s: seconds per `local` call, compilation included, (m, k).
        dtype: dtype of the computation (the model's).
        masked: each layer was measured with a causal mask (decoder-style).
    """

    lengths: np.ndarray
    layers: np.ndarray
    values: np.ndarray
    converged: np.ndarray
    iterations: np.ndarray
    slopes: np.ndarray
    wall_s: np.ndarray
    dtype: str
    masked: bool = False

    def __repr__(self) -> str:
        return fields_repr(
            self,
            lengths=self.lengths,
            layers=self.layers,
            slopes=self.slopes,
            all_converged=bool(np.all(self.converged)),
            dtype=self.dtype,
            masked=self.masked,
            values=self.values,
        )


def real_model_study(
    model: BertModel,
    text_ids: ArrayLike,
    lengths: ArrayLike,
    *,
    layers: ArrayLike | None = None,
    key: PRNGKeyArray | None = None,
    local_kwargs: dict | None = None,
    progress: bool = False,
    masked: bool = False,
) -> RealModelStudy:
    """Lip of each self-attention layer against the sequence length (Castin et al.).

    For every n in `lengths`: one forward pass (`hidden_states`) of the first n
    tokens, then for every layer l the local constant (`local`) of
    `attention_layer(model, l)` at the layer's input, the map X -> attention
    sublayer output (Castin, Ablin & Peyre, ICML 2024, Fig. 1). With `masked`,
    the same layers at the same inputs under a causal mask, token i at position
    s_i = i / n (each token attends to itself and the tokens before it): the
    decoder experiment of the same paper (masked self-attention, Thm 4.3).

    Args:
        model: a BERT-family encoder (`mf.bert.load`); its dtype is used.
        text_ids: token ids (N,) of one text, e.g. from `mf.bert.tokenize`.
        lengths: sequence lengths, integers in [1, min(N, max_positions)].
        layers: layer indices; None means all.
        key: PRNG key of the Lanczos start; None means `jr.key(0)` (as `local`).
        local_kwargs: extra keyword arguments of `local` (method, tol, ...).
        progress: show a tqdm bar (on stderr); off by default, as in every
            library function (the `meanfield` command turns it on).
        masked: measure the causal (decoder) map instead of the encoder's.

    Returns:
        A `RealModelStudy`.

    Raises:
        ValueError: lengths beyond the text or the model, layers out of range.
    """
    ids = np.asarray(text_ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"`text_ids` must be a 1-D array of integers; got shape {ids.shape}, "
            f"dtype {ids.dtype}."
        )
    c = model.config
    lengths = _check_sizes(lengths, "lengths", 1)
    longest = min(ids.size, c.max_positions)
    if lengths.max() > longest:
        raise ValueError(
            f"`lengths` must be <= {longest} (the text has {ids.size} tokens, the "
            f"model at most {c.max_positions} positions); got {lengths.max()}."
        )
    layers = np.arange(c.num_layers) if layers is None else np.asarray(layers)
    if (
        layers.ndim != 1
        or layers.size == 0
        or not np.issubdtype(layers.dtype, np.integer)
        or np.any((layers < 0) | (layers >= c.num_layers))
    ):
        raise ValueError(
            f"`layers` must be a non-empty list of indices in [0, {c.num_layers}); "
            f"got {layers.tolist()}."
        )
    local_kwargs = {} if local_kwargs is None else dict(local_kwargs)
    key = jr.key(0) if key is None else key
    forward = eqx.filter_jit(hidden_states)
    attns = {int(l): attention_layer(model, int(l)) for l in layers}

    shape = (layers.size, lengths.size)
    values = np.empty(shape)
    converged = np.zeros(shape, bool)
    iterations = np.zeros(shape, int)
    wall = np.empty(shape)
    bar = tqdm(
        total=values.size, desc="Lipschitz per layer", disable=not progress, leave=False
    )
    for i, n in enumerate(lengths):
        states = forward(model, jnp.asarray(ids[: int(n)]))
        positions = (
            (jnp.arange(1, int(n) + 1) / int(n)).astype(states.dtype)
            if masked
            else None
        )
        for j, l in enumerate(layers):
            start = time.perf_counter()
            res = local(
                attns[int(l)],
                states[int(l)],
                positions=positions,
                key=key,
                **local_kwargs,
            )
            values[j, i] = float(res.value)
            wall[j, i] = time.perf_counter() - start
            converged[j, i] = bool(res.converged)
            iterations[j, i] = int(res.iterations)
            bar.set_postfix(n=int(n), layer=int(l))
            bar.update()
    bar.close()
    slopes = np.array([fit_slope(lengths, row) for row in values])
    return RealModelStudy(
        lengths=lengths,
        layers=layers.astype(int),
        values=values,
        converged=converged,
        iterations=iterations,
        slopes=slopes,
        wall_s=wall,
        dtype=str(model.word.dtype),
        masked=bool(masked),
    )


__all__ = [
    "RealModelStudy",
    "ScalingStudy",
    "fit_slope",
    "real_model_study",
    "scaling_study",
]
