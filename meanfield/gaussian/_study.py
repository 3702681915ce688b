"""Batched blow-up studies of the Gaussian moment ODE (docs/math/blowup.md)."""

import math
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _status
from .._attention.base import AbstractAttention
from .._attention.softmax import SoftmaxAttention
from .._block import Block
from .._checks import check_finite_times, check_tolerances
from .._ensemble import ChunkLog
from .._feedforward import FeedForward
from .._measures import Gaussian
from ._blowup_study import BlowupStudy
from ._classify import classify
from ._velocity import as_batch, check_ffn, split_ffn, with_ffn


def blowup_times(
    gauss: Gaussian,
    attns: Mapping[str, AbstractAttention] | AbstractAttention,
    t_max: float,
    *,
    t0: float = 0.0,
    rank_rtol: float = 1e-3,
    rtol: float | None = None,
    atol: float | None = None,
    max_steps: int = 4000,
    blowup_threshold: float = 1e16,
    stationary_tol: float = 1e-6,
    slots: int | None = None,
    chunk_size: int = 65_536,
    progress: bool = False,
    ffn: FeedForward | None = None,
    chunks: ChunkLog | None = None,
) -> BlowupStudy:
    """Classify the covariance ODE of a batch of parameter sets (blow-up studies).

    Each attention carries a leading batch axis on every array leaf, e.g.
    `jax.vmap(lambda A, V: mf.SoftmaxAttention(V, A=A))(As, Vs)`. This is the study
    of Castin, Ablin, Carrillo & Peyre (2025), section on Gaussian blow-up, for any
    number of parameter sets. Only Sigma is solved (its ODE does not involve the
    mean), in scale-shape coordinates on a rate clock (docs/math/blowup.md), by an
    adaptive Dormand-Prince 5(4) over a work queue: `slots` runs step together and a
    finished run hands its slot to the next one. Runs that pass is unable to end
    within `max_steps` with a residual |dSigma/ds| / |Sigma| within 1e3 of
    rtol + atol (a huge Sigma at a steady state, where the fast modes keep the
    explicit residual above the stationary test) continue from where they stopped
    with RODAS (L-stable Rosenbrock, exact Jacobian) on a growth clock
    dt/ds = 1 / sqrt(1 + l'^2), with max_steps // 20 steps, `slots` // 8 at a time; a
    run that pass cannot end either keeps "max_steps". Attentions with a head other
    than softmax are solved in an orthogonal frame throughout.

    A run blows up when tr Sigma exceeds blowup_threshold times its blow-up-free
    bound (tr Sigma0 e^{2 int r}, see `mf.gaussian.simulate`) and the singularity
    is imminent: with l = log tr Sigma, a two-point fit of l = c - p log(t* - t)
    over the last step (from l and l' only) gives p in [0.05, 50] and t* - t below
    1e-3 of the elapsed time. The reported time is t + l'/l'' at that state (l''
    exact, by forward differentiation). A huge Sigma that stops growing is not a
    blow-up: it ends "stationary" or reaches t_max. "stationary" means
    |Sigma'| / |Sigma| (t_max - t0) <= stationary_tol + 64 eps |B|_F (t_max - t0)
    (the second term: the rounding floor of Sigma'), or |dSigma/ds| / |Sigma| <=
    rtol + atol on the rate clock (a huge steady Sigma, whose residual in t is the
    state's error times |B|: stationary to the solve's resolution).

    Computed in float64 whatever JAX's default precision (in the scoped,
    thread-local `jax.enable_x64`; float32 parameters are taken at their float64
    values): in float32 runs that blow up overflow before the blow-up test can
    pass, and stiff runs exhaust float32's step floor, ending "failed" or
    "max_steps". A host-side driver (a loop over chunks, NumPy outputs): call it
    outside `jax.jit` and `jax.vmap`.

    A feed-forward layer F(x) = W_f x + b_f (`ffn`, added to every variant, or
    variants that are `mf.Block(attention, mf.FeedForward)`) adds W_f to B and
    |W_f|_2 to the growth rate r (Alcalde, Ji & Zuazua, arXiv 2606.07600). Its
    parameters may be one set shared by every run or a batch of the runs' size;
    softmax with a feed-forward stays in the scale-shape coordinates (B = V Sigma A
    + W_f is still affine in Sigma).

    See [Studies of many runs][math-blowup-studies] for the coordinates, clocks and
    passes, [How a run ends][math-study-outcomes] for the classes, and
    [Feed-forward layers][math-gaussian-feedforward] for the feed-forward terms.

    Args:
        gauss: the initial Gaussian, shared by every run (only its covariance
            matters).
        attns: {variant name: batched attention}, or one batched attention. An
            attention without the batch axis (one parameter set) is a batch of
            one. An `mf.Block(attention, mf.FeedForward)` may batch its two parts
            separately (one of them unbatched is shared by every run).
        t_max: horizon.
        t0: initial time (for time-dependent parameters).
        rank_rtol: relative eigenvalue threshold of the numerical rank.
        rtol: relative tolerance of each solve (default 1e-8).
        atol: absolute tolerance of each solve, S having trace 1 (default rtol / 100).
        max_steps: explicit step budget of each run; the implicit pass gets an
            twentieth of it (status "max_steps" beyond both).
        blowup_threshold: factor over the blow-up-free growth bound.
        stationary_tol: relative change of Sigma up to t_max below which a run is
            stationary.
        slots: runs stepped together; None (default) sizes the queue to the
            chunk: the power of two nearest sqrt(runs per chunk), between 32 and
            256 (`queue_slots`).
        chunk_size: runs per compiled call (bounds memory: the states of one chunk).
        progress: print a progress bar over the chunks (tqdm).
        ffn: an affine feed-forward layer `mf.FeedForward(W_f, b_f)` added to
            every variant (one parameter set, or a batch with the runs' leading
            axis; W_f may be a function of t), or None.
        chunks: None, or an `mf.ChunkLog` to checkpoint and resume the study by
            its chunks: they are counted from 0 over the variants in order (the
            chunks of the first variant, then those of the second, ...), and a
            chunk's output is the tuple (times, rank, rate, status, steps) of
            its runs. The chunks are cut by `chunk_size` alone (the log's
            `width` is not used). With the log of an interrupted call of the
            same arguments, the study is bit for bit the uninterrupted one.

    Returns:
        A `BlowupStudy` (NumPy arrays; times and rates in float64).

    Raises:
        ValueError: bad horizon, tolerances or attention; an attention that is
            neither one parameter set nor a batch of them (the message shows how
            to build a batch); a non-affine feed-forward (`mf.MLP`), in `ffn` or
            in a block.
    """
    check_ffn(ffn)
    if not isinstance(attns, Mapping):
        attns = {type(attns).__name__: attns}
    attns = {name: with_ffn(attn, ffn) for name, attn in attns.items()}
    check_finite_times(t0=t0, t_max=t_max)
    if rtol is None:
        rtol = 1e-8
    if atol is None:
        atol = rtol / 100
    check_tolerances(rtol, atol)
    if not float(t_max) > float(t0):
        raise ValueError(f"`t_max` must exceed `t0`; got t0={t0}, t_max={t_max}.")
    for label, value in (
        ("blowup_threshold", blowup_threshold),
        ("stationary_tol", stationary_tol),
    ):
        if not value > 0:
            raise ValueError(f"`{label}` must be positive; got {value}.")
    sizes = (("chunk_size", chunk_size),)
    if slots is not None:  # None: sized to each chunk (`queue_slots`)
        sizes += (("slots", slots),)
    for label, value in sizes:
        if int(value) < 1:
            raise ValueError(f"`{label}` must be a positive integer; got {value}.")
    settings = dict(
        t0=float(t0),
        t_max=float(t_max),
        log_threshold=math.log(blowup_threshold),
        stationary_tol=float(stationary_tol),
        rank_rtol=float(rank_rtol),
        rtol=float(rtol),
        atol=float(atol),
    )
    # Float64 whatever JAX's default (scoped and thread-local, as in
    # `density.simulate`). In float32 e^l must stay below sqrt(max) ~ 1.8e19 (|B|
    # representable) while a blow-up must first pass 1e16 over its growth bound, and
    # steps near t* or on stiff Sinkhorn runs hit the float32 step floor: on the
    # documented example 42 of 1000 softmax runs that blow up ended "failed" and
    # 149 of 1000 Sinkhorn runs "failed" or "max_steps" (float64: none).
    with jax.enable_x64(True):
        times, fraction, rank, rate, status, steps = _solve_variants(
            gauss,
            attns,
            settings,
            slots=None if slots is None else int(slots),
            max_steps=int(max_steps),
            chunk_size=int(chunk_size),
            progress=progress,
            chunks=chunks,
        )
    return BlowupStudy(
        t_max=float(t_max),
        times=times,
        fraction=fraction,
        rank=rank,
        rate=rate,
        status=status,
        steps=steps,
    )


def _solve_variants(
    gauss, attns, settings, *, slots, max_steps, chunk_size, progress, chunks
):
    """The solves of `blowup_times` (arguments checked there), under x64.

    Returns:
        The dicts (times, fraction, rank, rate, status, steps) of `BlowupStudy`.
    """
    dtype = jnp.float64
    t0 = settings["t0"]
    cov0 = jnp.asarray(np.asarray(gauss.cov, np.float64), dtype)
    # Traced, so that one compilation serves every horizon, threshold and tolerance.
    settings = {key: jnp.asarray(value, dtype) for key, value in settings.items()}
    times, fraction, rank, rate, status, steps = {}, {}, {}, {}, {}, {}
    from tqdm.auto import tqdm

    done = {} if chunks is None else chunks.done
    offset = 0  # index in `chunks` of the variant's first chunk
    for name, attn in attns.items():
        attn, first = _as_batch_blocks(attn, gauss, name)
        frame_only = _needs_frame(first, t0, cov0.shape[0])
        arrays, static = eqx.partition(attn, eqx.is_array)
        # float32 parameters (JAX's default) are solved as the float64 they equal.
        arrays = jax.tree.map(
            lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a,
            arrays,
        )
        leaves = jax.tree.leaves(arrays)
        if not leaves:
            raise ValueError("`attns` must hold arrays with a leading batch axis.")
        size = leaves[0].shape[0]
        sizes = chunk_sizes(size, chunk_size)
        width = sizes[0]
        parts = []
        starts = range(0, size, width)
        indices = range(offset, offset + len(starts))
        offset += len(starts)
        bar = tqdm(
            total=len(starts),
            initial=sum(index in done for index in indices),
            desc=f"blowup_times {name}",
            unit="chunk",
            disable=not progress,
        )
        with bar:
            for index, start in zip(indices, starts, strict=True):
                if index in done:  # solved before an interruption
                    parts.append(list(done[index]))
                    continue
                idx = np.minimum(np.arange(start, start + width), size - 1)
                chunk = jax.tree.map(lambda a, idx=idx: a[idx], arrays)
                out = classify(
                    chunk,
                    static,
                    cov0,
                    **settings,
                    slots=queue_slots(width) if slots is None else slots,
                    max_steps=max_steps,
                    frame_only=frame_only,
                )
                keep = min(width, size - start)
                parts.append([np.asarray(o)[:keep] for o in out])
                if chunks is not None:
                    chunks.record(index, tuple(parts[-1]))
                bar.update()
        t, r, g, s, n = (np.concatenate(p) for p in zip(*parts, strict=True))
        times[name], rank[name], rate[name], status[name], steps[name] = t, r, g, s, n
        fraction[name] = float(np.mean(s == _status.BLOWUP))
    return times, fraction, rank, rate, status, steps


def chunk_sizes(size: int, chunk_size: int) -> list[int]:
    """Runs in each chunk of a batch of `size` runs, as `blowup_times` cuts it.

    Equal chunks of at most `chunk_size` runs, the last maybe shorter (padded by
    repeating its final run), so a batch compiles once whatever its size modulo
    `chunk_size`; these are the chunks of its `chunks` log.
    """
    count = -(-size // chunk_size)
    width = -(-size // count)
    return [min(width, size - start) for start in range(0, size, width)]


def queue_slots(runs: int) -> int:
    """Runs stepped together for a chunk of `runs`: a power of two in [32, 256].

    The power of two nearest sqrt(runs), clipped to [32, 256].

    The queue loops about (total steps) / slots + (longest run) times, one loop
    costing about c0 + c1 slots (c0 the loop's own work, c1 one run's step): the
    cost is least at slots = sqrt(c0 (total steps) / (c1 (longest run))), which
    grows as sqrt(runs). In d = 2 a loop costs ~13 us + 1.1 us per slot
    (Sinkhorn, 2-core CPU), a run takes 44-182 steps on average and the longest
    spends the 4000-step budget: the optimum lies at 0.5-1 sqrt(runs), and the
    cost is flat within a factor 2 of it. 256 slots (the width from 50 000 runs
    per chunk up) at 1000 runs loop ~4000 times over mostly empty slots while
    the longest run ends: 3x the time of 32 (docs/benchmarks.md, "Gaussian
    blow-up studies").
    """
    return int(min(256, max(32, 2 ** round(math.log2(math.sqrt(runs))))))


def _as_batch_blocks(attn, gauss, name):
    """`as_batch` for an attention that may be a block of two separate batches.

    A block's attention and feed-forward are batched each on its own (a shared
    `ffn` has no batch axis while the attentions do); a batch of one is then
    broadcast to the other's size, so every array leaf has the runs' axis.
    """
    if not isinstance(attn, Block):
        return as_batch(attn, gauss, name)
    split_ffn(attn, None)  # a clear ValueError for a non-affine feed-forward
    inner, inner_first = _as_batch_blocks(attn.attention, gauss, name)
    ff, ff_first = as_batch(attn.feedforward, gauss, name)
    first = Block(inner_first, ff_first)
    sizes = {a.shape[0] for a in jax.tree.leaves((inner, ff)) if eqx.is_array(a)}
    size = max(sizes, default=1)
    if not sizes <= {1, size}:
        raise ValueError(
            f"`attns` ({name!r}): the attention and the feed-forward layer must "
            f"have the same batch size (or one of them none); got sizes "
            f"{sorted(sizes)}."
        )

    def broadcast(a):
        return jnp.broadcast_to(a, (size, *a.shape[1:])) if eqx.is_array(a) else a

    return jax.tree.map(broadcast, Block(inner, ff)), first


def _needs_frame(attn, t0, d) -> bool:
    """Whether a study solves in the orthogonal frame throughout.

    See docs/math/blowup.md.

    Softmax's B = V Sigma A is linear in Sigma, and an affine feed-forward's W_f
    does not depend on it: the small directions of a huge Sigma barely move them,
    and the scale-shape coordinates (where they sit in the last digits) serve.
    Every other head depends on them (L2 through (Sigma^{-1} + 2 K^T K)^{-1},
    Sinkhorn through Sigma^{-1}).
    """
    linear = (SoftmaxAttention, FeedForward)
    return not all(isinstance(h, linear) for h, _ in attn.flat_heads(t0, d))
