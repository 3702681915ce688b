"""Mapping a per-run function over many runs without the jaxlib 0.10 LAPACK hang.

jaxlib 0.10 (0.10.0 to 0.10.2) splits a batched LAPACK call (eigh, LU, triangular
solve, SVD, ...) whose estimated work reaches 2e5 flops into tasks on XLA's
intra-op thread pool, and the pool worker that runs the call blocks until they
finish. When every worker is such a caller (two concurrent calls on a 2-core
machine) no worker is left to run the tasks and the program waits forever at 0 %
CPU (seen: `mf.gaussian.blowup_times` on 1000 L2 runs in d = 8, native stacks in
`jax::ParallelBatchMap` / `BlockingCounter::Wait`). Below the threshold the call
runs inline, so a vmap over at most `inline_batch(m)` runs of m x m matrices is
safe; larger batches go through `jax.lax.map` in chunks of that size, which does
the same work in sequence (the 2e5-flop tasks were no faster on a few cores). JAX
has since stopped the fan-out in open-source builds (jax commit 859992407d, not in
a jaxlib release as of 0.10.2).
"""

import math
from collections.abc import Callable

import jax
import jax.extend as jex

# jaxlib's threshold (GetLapackBatchChunkSize) and its largest per-matrix cost
# estimate, 10 m^3 (SVD, non-symmetric eig; eigh 4-5 m^3, LU and trsm m^3).
_INLINE_FLOPS = 200_000
_FLOPS_PER_CUBE = 10
# Primitives that lower to jaxlib's LAPACK kernels on CPU.
_LAPACK = frozenset(
    {
        "cholesky",
        "eig",
        "eigh",
        "geqp3",
        "geqrf",
        "hessenberg",
        "householder_product",
        "lu",
        "qr",
        "schur",
        "svd",
        "triangular_solve",
        "tridiagonal",
        "tridiagonal_solve",
    }
)


def inline_batch(m: int) -> int:
    """Largest batch of m x m LAPACK problems that jaxlib runs inline (>= 1)."""
    return max(1, (_INLINE_FLOPS - 1) // (_FLOPS_PER_CUBE * int(m) ** 3))


def _lapack_operands(jaxpr):
    """Shapes of the first operand of every LAPACK primitive, sub-jaxprs included."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _LAPACK:
            yield eqn.invars[0].aval.shape
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                if isinstance(sub, jex.core.ClosedJaxpr):
                    yield from _lapack_operands(sub.jaxpr)
                elif isinstance(sub, jex.core.Jaxpr):
                    yield from _lapack_operands(sub)


def safe_batch(fn: Callable, *args) -> int | None:
    """Runs of fn that may be vectorised together; None when fn calls no LAPACK.

    `args` carry the leading run axis (as for `map_runs`); fn is traced once on
    one run's shapes. A call that already batches k problems inside fn leaves
    inline_batch(m) // k runs.
    """
    one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), args)
    limits = [
        max(1, inline_batch(max(shape[-2:])) // math.prod(shape[:-2]))
        for shape in _lapack_operands(jax.make_jaxpr(fn)(*one).jaxpr)
    ]
    return min(limits) if limits else None


def map_runs(fn: Callable, *args, batch: int | None = None):
    """`jax.vmap(fn)(*args)` over the leading axis, in LAPACK-inline chunks.

    Args:
        fn: per-run function of the leaves of `args` without their leading axis.
        *args: pytrees whose leaves share a leading (run) axis.
        batch: runs per vectorised call; default `safe_batch(fn, *args)` (all
            runs at once when fn calls no LAPACK).

    Returns:
        fn's outputs stacked along a leading axis, as jax.vmap would.
    """
    size = jax.tree.leaves(args)[0].shape[0]
    if batch is None:
        batch = safe_batch(fn, *args) or size
    if size <= batch:
        return jax.vmap(fn)(*args)
    return jax.lax.map(lambda a: fn(*a), args, batch_size=int(batch))
