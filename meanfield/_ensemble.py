"""Many independent particle systems in one compiled call (clustering studies).

The published clustering experiments solve thousands of small systems, for
instance 2048 systems of 32 tokens for each of 90 temperatures. Each system is an
ordinary `simulate` solve; here they are solved together (a work queue or a
vmap), in equal chunks so that memory stays bounded and one compilation serves
every chunk, and on the CPU one chunk per core side by side.
"""

import inspect
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from . import _ensemble_queue
from ._attention.base import AbstractAttention
from ._checks import check_finite_times, is_traced
from ._dynamics import Solution, resolve_solve, simulate, solve_dynamics
from ._measures import AbstractParticles
from ._noise import AbstractNoise
from ._simulate_inputs import (
    check_noise,
    check_start,
    is_integer,
    mark_invalid_start,
)

#: How `simulate_ensemble` schedules its systems.
SCHEDULINGS = ("auto", "queue", "vmap")
#: The smallest chunk `simulate_ensemble` cuts to give every core a chunk.
MIN_CONCURRENT_CHUNK = 2048


def concurrent_chunks() -> int:
    """Chunks solved side by side: one per core on the CPU backend, else one.

    XLA's CPU code spreads each of a solver step's many small operations over
    the cores and waits for them all, so one chunk leaves the cores idle part of
    the time; chunks side by side keep them busy.
    """
    if jax.default_backend() != "cpu":
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def chunk_layout(size: int, chunk_size: int | None, streams: int):
    """(chunks, systems per chunk, chunks side by side) for B = `size` systems.

    At most `chunk_size` systems per chunk, and at least `streams` chunks where
    each keeps MIN_CONCURRENT_CHUNK systems.
    """
    count = 1 if chunk_size is None else math.ceil(size / int(chunk_size))
    if count < streams:
        count = max(count, min(streams, size // MIN_CONCURRENT_CHUNK))
    width = math.ceil(size / count)
    count = math.ceil(size / width)
    return count, width, min(streams, count)


class ChunkLog:
    """The chunks of a study solved so far: resume it by its completed chunks.

    `simulate_ensemble(..., chunks=log)` (and `mf.clustering.phase_diagram`,
    `mf.gaussian.blowup_times`) solves only the chunks that `done` lacks and
    records every chunk it solves: `done[index] = output`, then
    `on_chunk(index, output)`, where a study writes its checkpoint. After an
    interruption, a log holding the outputs read back resumes the study. A chunk
    is the same computation whatever ran before it (the same systems, padding and
    compiled program), so a resumed study ends with the arrays of an
    uninterrupted one, bit for bit.

    Args:
        done: chunk index (from 0) -> that chunk's output as the call returns it
            for its systems (after `reduce`), e.g. read back from a checkpoint.
        width: systems per chunk of `simulate_ensemble`; None: its own choice
            (`chunk_layout`), recorded here before the first chunk. Given, it is
            kept, so that a resumed call cuts the systems as the interrupted one
            did, also on a machine with another number of cores
            (`mf.gaussian.blowup_times` cuts by its `chunk_size` alone and does
            not use it).
        on_chunk: None, or a function called as `on_chunk(index, output)` after
            every chunk solved, one call at a time, from the thread that solved
            the chunk (chunks run side by side on the CPU): a chunk that ends
            while an interrupt stops the call is still recorded.
    """

    def __init__(
        self,
        done: dict[int, Any] | None = None,
        *,
        width: int | None = None,
        on_chunk: Callable[[int, Any], None] | None = None,
    ):
        if width is not None and (
            isinstance(width, bool) or not is_integer(width) or width < 1
        ):
            raise ValueError(f"`width` must be an integer >= 1; got {width!r}.")
        self.done = {} if done is None else dict(done)
        self.width = None if width is None else int(width)
        self.on_chunk = on_chunk
        self._lock = threading.Lock()

    def record(self, index: int, output: Any) -> None:
        """Store chunk `index`'s output and call `on_chunk` (under a lock)."""
        with self._lock:
            self.done[index] = output
            if self.on_chunk is not None:
                self.on_chunk(index, output)

    def __repr__(self) -> str:
        return f"ChunkLog(done={sorted(self.done)}, width={self.width})"


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
    noise: AbstractNoise | None = None,
    key: jax.Array | None = None,
    scheduling: str = "auto",
    chunks: ChunkLog | None = None,
    **options,
) -> Any:
    """Solve B independent particle systems: one `simulate` per system, vmapped.

    See [Tokens as particles][math-particles] for the particle system of each member,
    and [Noise][math-noise] for noisy members.

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
        chunk_size: the most systems per compiled call (default: all B at
            once); chunks are equal, the last padded with copies of the final
            system, so every chunk compiles once. On the CPU the chunks run side
            by side, one per core (so up to that many chunks are in memory at
            once), and fewer chunks than cores are cut further while each keeps
            at least 2048 systems.
        progress: show a progress bar over the chunks (tqdm).
        reduce: None, or a function of a chunk's `Solution` (batch axis first)
            returning a pytree of arrays with the batch axis first, applied
            inside the chunk's compiled program: only its output leaves the
            chunk, so a study keeps what it needs (an alignment, a final state)
            without holding every trajectory. It is part of the compilation key:
            pass a module-level function, or `eqx.Partial(f, option=value)`, so
            repeated calls reuse the program.
        noise: None, or one noise for every system (`mf.IndependentNoise`,
            `mf.CommonNoise`), or B noise levels: a noise whose sigma has shape
            (B,), e.g. `jax.vmap(mf.IndependentNoise)(sigmas)`.
        key: a JAX PRNG key, required with `noise`: member b runs on the
            Brownian path of `jax.random.split(key, B)[b]`, so the members are
            independent, and each equals its own `simulate(..., key=that key)`
            whatever `chunk_size` is.
        scheduling: how the systems share the compiled solve. "queue": a work
            queue of slots, each slot one system's own adaptive solve, a slot
            that reaches t1 taking the next system ([ensembles of small
            systems][math-ensemble-queue]); "vmap": every system of a chunk
            steps in lockstep (a vmapped `simulate`); "auto": "queue" where it
            applies (n <= 256 tokens, an adaptive solver among "tsit5",
            "dopri5", "dopri8", or with `noise` "heun", "midpoint", "ralston";
            no `dt0`, `adjoint` or `progress`) and is the faster one (no noise,
            and n <= 128 or d <= 8), else "vmap". Both give each system its own
            `simulate`'s result to the solver's tolerance (with multiplicative
            noise, to the scheme's pathwise error on the same Brownian path).
        chunks: None, or a `ChunkLog`: the chunks it holds are taken from it,
            not solved again, and every chunk solved is recorded in it (a
            checkpoint after each chunk; see `ChunkLog`). The progress bar
            starts at the chunks it holds.
        **options: any keyword of `mf.simulate` (saveat, solver, rtol, atol, dt0,
            max_steps, normalization, blowup_radius, t0), shared by all systems.

    Returns:
        A `Solution` whose every field has the batch axis first: ts (B, T),
        x (B, T, n, d), blowup_time, result, t_final and num_steps (B,), and the
        B initial measures. `status` is then an array of B names. With
        `reduce`, its output over the B systems instead. Each system's status,
        blow-up time and saves are those of its own `simulate` (to rounding):
        one system's blow-up or early stop changes no other.

    Raises:
        ValueError: `measures` without a batch axis or with B = 0; a batched
            `attn` whose batch size differs; `chunk_size` not an integer >= 1;
            t1 traced (under jax.jit) or not finite; a `reduce` whose outputs
            lack the batch axis; anything `simulate` rejects, for any system
            (a zero token under a normalization, a start at or beyond
            `blowup_radius`: checked on the host before the solves); a sigma
            neither scalar nor of shape (B,).
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
    if size == 0:
        raise ValueError("`measures` must hold at least one system; got B = 0.")
    check_finite_times(t1=t1, t0=options.get("t0", 0.0))
    sizes = _leading(attn)
    inferred = batched_attention is None
    if inferred:
        batched_attention = sizes == {size}
    if batched_attention and sizes != {size}:
        raise ValueError(
            f"a batched `attn` must have leading size B = {size} on every array "
            f"leaf; got leading sizes {sorted(sizes)}."
        )
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not is_integer(chunk_size) or chunk_size < 1
    ):
        raise ValueError(f"`chunk_size` must be an integer >= 1; got {chunk_size!r}.")
    check_noise(noise, key, options.get("normalization"), batch=size)
    batched_noise = noise is not None and jnp.ndim(noise.sigma) == 1
    keys = None if noise is None else jr.split(key, size)
    defaults = inspect.signature(simulate).parameters
    if not is_traced(measures.x):
        # simulate's checks of the tokens, on the host for every system: traced
        # inside the vmap they could only mark a member "invalid_input".
        check_start(
            measures.x,
            options.get("normalization", defaults["normalization"].default),
            options.get("blowup_radius", defaults["blowup_radius"].default),
            name="measures",
        )
    # simulate's checks and resolved arguments, once for every system: the
    # times, save times and tolerances are traced arrays shared by the systems
    # (a sweep over t1 or the save times reuses the compiled chunk).
    _, args, kwargs = resolve_solve(
        _ensemble_queue.take_systems(measures, 0),
        _ensemble_queue.take_if(attn, 0, batched_attention),
        t1,
        noise=_ensemble_queue.take_if(noise, 0, batched_noise),
        key=None if keys is None else keys[0],
        **options,
    )
    radius = np.asarray(
        options.get("blowup_radius", defaults["blowup_radius"].default),
        measures.x.dtype,
    )
    resolved = (args[4], radius, kwargs)
    # Small systems: a work queue of slots (`_ensemble_queue`).
    if scheduling not in SCHEDULINGS:
        raise ValueError(
            f"`scheduling` must be one of {SCHEDULINGS}; got {scheduling!r}."
        )
    queueable = not is_traced(measures.x) and _ensemble_queue.applies(
        measures, noise, options
    )
    if scheduling == "queue" and not queueable:
        raise ValueError(
            '`scheduling="queue"` needs n <= 256 tokens, an adaptive solver among '
            '"tsit5", "dopri5", "dopri8" (with `noise`: "heun", "midpoint", '
            '"ralston"), and no `dt0`, `adjoint` or `progress`; use "auto" or '
            '"vmap".'
        )
    queued = queueable and (
        scheduling == "queue"
        or (scheduling == "auto" and _ensemble_queue.preferred(measures, noise))
    )
    concrete = not any(
        is_traced(leaf) for leaf in jax.tree.leaves((measures, attn, noise, keys))
    )
    streams = concurrent_chunks() if concrete else 1
    count, width, workers = chunk_layout(size, chunk_size, streams)
    done = {}
    if chunks is not None:
        if chunks.width is None:
            chunks.width = width
        else:  # the layout of the run it resumes
            width = min(chunks.width, size)
            count = math.ceil(size / width)
            workers = min(streams, count)
        stray = sorted(set(chunks.done) - set(range(count)))
        if stray:
            raise ValueError(
                f"`chunks` holds chunks {stray}, but B = {size} systems in chunks "
                f"of {width} make {count} (indices 0 to {count - 1})."
            )
        done = dict(chunks.done)
    starts = list(range(0, size, width))
    todo = [index for index in range(count) if index not in done]

    def solve_at(start):
        idx = np.minimum(np.arange(start, start + width), size - 1)
        take = lambda tree, idx=idx: jax.tree.map(  # noqa: E731
            lambda a: a[idx] if eqx.is_array(a) else a, tree
        )
        try:
            if queued:
                chunk = _solve_queued(
                    take(measures),
                    take(attn) if batched_attention else attn,
                    take(noise) if batched_noise else noise,
                    take(keys),
                    (batched_attention, batched_noise),
                    resolved,
                    reduce,
                )
            else:
                chunk = _solve_chunk(
                    take(measures),
                    take(attn) if batched_attention else attn,
                    take(noise) if batched_noise else noise,
                    take(keys),
                    (batched_attention, batched_noise),
                    resolved,
                    reduce,
                )
        except (ValueError, TypeError) as err:
            # Leading size k != B on every leaf: a batch of the wrong size?
            looks_batched = inferred and not batched_attention and len(sizes) == 1
            if looks_batched and not _works_shared(attn, take(measures)):
                raise ValueError(
                    f"`attn` failed as one attention shared by the B = {size} "
                    f"systems, and every array leaf has leading size "
                    f"{next(iter(sizes))}: a batched `attn` must have leading size "
                    f"B = {size} ({err})"
                ) from err
            raise
        keep = min(width, size - start)
        return jax.tree.map(lambda a, keep=keep: a[:keep], chunk)

    def solve_index(index):
        out = solve_at(starts[index])
        if chunks is not None:  # in the worker: recorded even if the caller stops
            chunks.record(index, out)
        return out

    workers = min(workers, max(1, len(todo)))
    with ThreadPoolExecutor(workers) if workers > 1 else nullcontext() as pool:
        # Traced inputs (under jax.jit) stay in this thread: one stream.
        solved = (pool.map if pool else map)(solve_index, todo)
        if progress:
            from tqdm.auto import tqdm

            solved = tqdm(
                solved,
                total=count,
                initial=count - len(todo),
                desc="simulate_ensemble",
                unit="chunk",
            )
        done.update(zip(todo, solved, strict=True))
    parts = [done[index] for index in range(count)]
    if len(parts) == 1:
        return parts[0]
    return jax.tree.map(lambda *a: jnp.concatenate(a), *parts)


def _works_shared(attn, measures) -> bool:
    """Whether `attn`'s velocity traces on one system of `measures`."""
    one = jax.tree.map(lambda a: a[0] if eqx.is_array(a) else a, measures)
    try:
        eqx.filter_eval_shape(lambda a, m: a.velocity(m), attn, one)
    except (ValueError, TypeError):
        return False
    return True


def _solve_queued(measures, attn, noise, keys, batched, resolved, reduce):
    """A chunk through the work queue; systems it hands back go to `_solve_chunk`.

    `batched` says whether the attention and the noise carry the batch axis;
    `resolved` is as `_solve_chunk`'s.
    """
    take, take_if = _ensemble_queue.take_systems, _ensemble_queue.take_if

    def redo(index):
        # Padded to a power of two: few distinct compilations.
        padded = np.resize(index, 1 << math.ceil(math.log2(index.size)))
        sol = _solve_chunk(
            take(measures, padded),
            take_if(attn, padded, batched[0]),
            take_if(noise, padded, batched[1]),
            None if keys is None else keys[padded],
            batched,
            resolved,
            None,
        )
        return take(sol, np.arange(index.size))

    systems = (measures, attn, noise, keys)
    sol = _ensemble_queue.solve(systems, batched, resolved, redo)
    return sol if reduce is None else _reduce(reduce, sol)


@eqx.filter_jit
def _reduce(reduce, sol):
    out = reduce(sol)
    _check_reduced(out, sol.x.shape[0])
    return out


def _check_reduced(out, width):
    """Raise unless every output leaf has the batch axis (size `width`) first."""
    # Checked while tracing, before anything runs: chunks are cut and joined
    # along the first axis of every output leaf.
    shapes = [jnp.shape(a) for a in jax.tree.leaves(out)]
    if not shapes or any(not shape or shape[0] != width for shape in shapes):
        raise ValueError(
            "`reduce` must return a pytree of arrays with the batch axis first "
            f"(leading size {width}, the systems of a chunk); got leaves of shapes "
            f"{shapes}."
        )


@eqx.filter_jit
def _solve_chunk(measures, attn, noise, keys, batched, resolved, reduce):
    """One compiled vmap of `simulate`'s solve over a chunk of systems, then `reduce`.

    `batched` says whether the attention and the noise carry the batch axis;
    `keys` (one per system) is None without noise. `resolved` is (the
    `SolveInputs` every system shares, the blow-up radius, `_dynamics.solve_dynamics`'s
    keywords), from `resolve_solve`.
    """
    inputs, radius, options = resolved

    def solve(m, a, nz, k):
        sol = solve_dynamics(m, a, nz, k, inputs, **options)
        # simulate's per-member checks of traced tokens and sigma.
        return mark_invalid_start(sol, m.x, options["normalization"], radius, nz)

    axes = (0, *(0 if b else None for b in batched), None if keys is None else 0)
    sol = jax.vmap(solve, in_axes=axes)(measures, attn, noise, keys)
    if reduce is None:
        return sol
    out = reduce(sol)
    _check_reduced(out, measures.x.shape[0])
    return out
