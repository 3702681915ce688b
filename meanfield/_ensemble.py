"""Many independent particle systems in one compiled call (clustering studies).

The published clustering experiments solve thousands of small systems, for
instance 2048 systems of 32 tokens for each of 90 temperatures. Each system is an
ordinary `simulate` solve; here they are vmapped together, in equal chunks so
that memory stays bounded and one compilation serves every chunk.
"""

import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._attention.base import AbstractAttention
from ._dynamics import Solution, simulate
from ._measures import AbstractParticles


def _leading(tree) -> set[int]:
    """Leading sizes of the array leaves of a pytree (empty when it has none)."""
    return {
        a.shape[0] for a in jax.tree.leaves(eqx.filter(tree, eqx.is_array)) if a.ndim
    }


def simulate_ensemble(
    measures: AbstractParticles,
    attn: AbstractAttention,
    t1: float,
    *,
    batched_attention: bool | None = None,
    chunk_size: int | None = None,
    progress: bool = False,
    reduce: Callable[[Solution], Any] | None = None,
    **options,
) -> Any:
    """Solve B independent particle systems: one `simulate` per system, vmapped.

    See [Tokens as particles][math-particles] for the particle system of each member.

    Args:
        measures: B initial measures, a leading batch axis on every array leaf,
            e.g. `jax.vmap(mf.Particles)(xs)` with xs of shape (B, n, d).
        attn: one attention shared by every system, or B of them (a leading
            batch axis on every array leaf, e.g. `jax.vmap(lambda b:
            mf.SoftmaxAttention(V, A=b * I))(betas)`).
        t1: final time (shared).
        batched_attention: whether `attn` carries the batch axis; None infers it
            (every array leaf of `attn` has leading size B). Pass False for a
            shared attention whose matrices happen to be B x B.
        chunk_size: systems per compiled call (default: all B at once); the last
            chunk is padded with copies of the final system, so every chunk
            compiles once.
        progress: show a progress bar over the chunks (tqdm).
        reduce: None, or a function of a chunk's `Solution` (batch axis first)
            returning a pytree of arrays with the batch axis first, applied
            inside the chunk's compiled program: only its output leaves the
            chunk, so a study keeps what it needs (an alignment, a final state)
            without holding every trajectory. It is part of the compilation key:
            pass a module-level function, or `eqx.Partial(f, option=value)`, so
            repeated calls reuse the program.
        **options: any keyword of `mf.simulate` (saveat, solver, rtol, atol, dt0,
            max_steps, normalization, blowup_radius, t0), shared by all systems.

    Returns:
        A `Solution` whose every field has the batch axis first: ts (B, T),
        x (B, T, n, d), blowup_time, result, t_final and num_steps (B,), and the
        B initial measures. `status` is then an array of B names. With
        `reduce`, its output over the B systems instead.

    Raises:
        ValueError: `measures` without a batch axis, or a batched `attn` whose
            batch size differs; anything `simulate` rejects.
    """
    if not isinstance(measures, AbstractParticles):
        raise ValueError(
            f"`measures` must be batched Particles or MaskedParticles; got "
            f"{type(measures).__name__}."
        )
    if measures.x.ndim != 3:
        raise ValueError(
            "`measures` must carry a leading batch axis: x of shape (B, n, d), e.g. "
            f"jax.vmap(mf.Particles)(xs); got x of shape {measures.x.shape}."
        )
    size = measures.x.shape[0]
    sizes = _leading(attn)
    if batched_attention is None:
        batched_attention = sizes == {size}
    if batched_attention and sizes != {size}:
        raise ValueError(
            f"a batched `attn` must have leading size B = {size} on every array "
            f"leaf; got leading sizes {sorted(sizes)}."
        )
    if chunk_size is not None and int(chunk_size) < 1:
        raise ValueError(f"`chunk_size` must be a positive integer; got {chunk_size}.")
    # Host arrays (saveat) as tuples: options are compile-time constants, like
    # simulate's own save fractions.
    static_options = tuple(
        (key, tuple(np.asarray(v).tolist()) if np.ndim(v) > 0 else v)
        for key, v in sorted(options.items())
    )
    count = 1 if chunk_size is None else math.ceil(size / int(chunk_size))
    width = math.ceil(size / count)
    starts = range(0, size, width)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="simulate_ensemble", unit="chunk")
    parts = []
    for start in starts:
        idx = np.minimum(np.arange(start, start + width), size - 1)
        take = lambda tree, idx=idx: jax.tree.map(  # noqa: E731
            lambda a: a[idx] if eqx.is_array(a) else a, tree
        )
        chunk = _solve_chunk(
            take(measures),
            take(attn) if batched_attention else attn,
            t1,
            batched_attention,
            static_options,
            reduce,
        )
        keep = min(width, size - start)
        parts.append(jax.tree.map(lambda a, keep=keep: a[:keep], chunk))
    if len(parts) == 1:
        return parts[0]
    return jax.tree.map(lambda *a: jnp.concatenate(a), *parts)


@eqx.filter_jit
def _solve_chunk(measures, attn, t1, batched_attention, options, reduce):
    """One compiled vmap of `simulate` over a chunk of systems, then `reduce`."""
    solve = lambda m, a: simulate(m, a, t1, **dict(options))  # noqa: E731
    sol = jax.vmap(solve, in_axes=(0, 0 if batched_attention else None))(measures, attn)
    return sol if reduce is None else reduce(sol)
