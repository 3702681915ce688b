"""One case of the n-scaling benchmark: an implementation at one (n, d).

The problem (`problem`), its float64 reference (`reference_rows`, online softmax
in NumPy), the implementations (`IMPLS`, see `bench_config`), their compilation
with XLA's memory analysis, the timing loop and the optional fixed-step solve.
"""

import contextlib
import functools
import math
import os
import time
import tracemalloc
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .bench_config import GIB, HALF_IMPLS, SOLVE_IMPLS

_DTYPE = np.float32
# Rows of the float64 correctness check (evenly spaced over the n particles).
_CHECK_ROWS = 256


class Skip(Exception):
    """A case that is not run, with the reason."""


def problem(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(x, A, V) in float32 with O(1) logits: x ~ N(0, I), A ~ N(0, 1/d^2).

    Args:
        n: number of particles.
        d: dimension.
        seed: seed, combined with n and d.

    Returns:
        x (n, d), A (d, d) and V (d, d), NumPy float32.
    """
    rng = np.random.default_rng([seed, n, d])
    x = rng.standard_normal((n, d)).astype(_DTYPE)
    A = (rng.standard_normal((d, d)) / d).astype(_DTYPE)
    V = (rng.standard_normal((d, d)) / math.sqrt(d)).astype(_DTYPE)
    return x, A, V


def check_rows(n: int) -> np.ndarray:
    """Indices of the rows checked against the float64 reference.

    Args:
        n: number of particles.

    Returns:
        Up to 256 evenly spaced indices in [0, n).
    """
    return np.unique(np.linspace(0, n - 1, min(n, _CHECK_ROWS)).astype(np.int64))


def reference_rows(x, A, V, rows, *, chunk: int = 8192) -> np.ndarray:
    """Float64 velocity at the atoms `rows`, over all n keys, in key chunks.

    Online softmax in NumPy float64 (running max, sum and weighted sum), so memory
    is O(len(rows) * chunk) at any n, and independent of the code under test.

    Args:
        x: particles, shape (n, d).
        A: interaction matrix, shape (d, d).
        V: value matrix, shape (d, d).
        rows: indices of the atoms, shape (r,).
        chunk: keys per chunk.

    Returns:
        Velocities at x[rows], shape (r, d), float64.
    """
    x = np.asarray(x, np.float64)
    q = x[rows] @ np.asarray(A, np.float64).T
    values = x @ np.asarray(V, np.float64).T
    run_max = np.full(len(rows), -np.inf)
    run_sum = np.zeros(len(rows))
    acc = np.zeros((len(rows), x.shape[1]))
    for lo in range(0, x.shape[0], chunk):
        s = q @ x[lo : lo + chunk].T
        new_max = np.maximum(run_max, s.max(axis=1))
        scale = np.exp(run_max - new_max)
        p = np.exp(s - new_max[:, None])
        run_sum = run_sum * scale + p.sum(axis=1)
        acc = acc * scale[:, None] + p @ values[lo : lo + chunk]
        run_max = new_max
    return acc / run_sum[:, None]


def numpy_velocity(x: np.ndarray, A: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Softmax velocity in the naive NumPy style of public peer code.

    Materialises the logits and their exponentials: two n x n arrays.

    Args:
        x: particles, shape (n, d).
        A: interaction matrix, shape (d, d).
        V: value matrix, shape (d, d).

    Returns:
        Velocities, shape (n, d).
    """
    s = (x @ A.T) @ x.T
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)
    return (p @ (x @ V.T)) / p.sum(axis=1, keepdims=True)


def _attention(A, V, blocking: str, block_size: int):
    from .._attention.softmax import SoftmaxAttention

    return SoftmaxAttention(V, A=A, blocking=blocking, block_size=block_size)


def _library_velocity(blocking: str, block_size: int):
    from .._measures import Particles

    def velocity(x, A, V):
        attn = _attention(A, V, blocking, block_size)
        return attn.velocity(Particles(x))

    return velocity


def _default_prepare(x, A, V, max_bytes: float):
    """The path a user gets by default: `velocity` jitted on a measure and a module.

    `Particles(x)` and `SoftmaxAttention(V, A=A)` (blocking "auto") are built, and
    validated, outside the jitted function, as in `jax.jit(lambda mu, a:
    a.velocity(mu))(mu, attn)`.
    """
    from .._attention.softmax import SoftmaxAttention
    from .._measures import Particles

    mu = Particles(jnp.asarray(x))
    attn = SoftmaxAttention(jnp.asarray(V), A=jnp.asarray(A))
    return _compile(lambda mu, a: a.velocity(mu), (mu, attn), max_bytes, "jax_default")


def _pad_head(a, multiple: int):
    """Zero columns up to a multiple of `multiple` (fused kernels' head sizes).

    Zero query/key columns add nothing to the logits; zero value columns give
    zero output columns, cut off afterwards.
    """
    pad = -a.shape[-1] % multiple
    return a if pad == 0 else jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, pad)])


def sdpa_velocity(x, A, V, *, implementation: str = "xla", dtype=None):
    """The same velocity through `jax.nn.dot_product_attention` (one head).

    Args:
        x: particles, shape (n, d).
        A: interaction matrix, shape (d, d).
        V: value matrix, shape (d, d).
        implementation: "xla", or "cudnn" (GPU, half precision only).
        dtype: the attention's input precision (None: that of x). cuDNN takes
            bfloat16 or float16, and head sizes that are multiples of 8: q, k, v
            are zero-padded to one.

    Returns:
        Velocities, shape (n, d), float32.
    """
    d = x.shape[1]
    q, k, v = x @ A.T, x, x @ V.T
    if implementation == "cudnn":
        q, k, v = (_pad_head(a, 8) for a in (q, k, v))
    if dtype is not None:
        q, k, v = (a.astype(dtype) for a in (q, k, v))
    # (batch, length, heads, head_dim) = (1, n, 1, d); scale 1: logits <A x_i, x_j>.
    q, k, v = (a[None, :, None, :] for a in (q, k, v))
    out = jax.nn.dot_product_attention(
        q, k, v, scale=1.0, implementation=implementation
    )
    return out[0, :, 0, :d].astype(jnp.float32)


def _torch_prepare(x, A, V, *, dtype: str, max_bytes: float):
    """PyTorch's `scaled_dot_product_attention` on JAX's device, ready to time.

    On a CUDA GPU only the fused kernels (flash, memory-efficient, cuDNN) may run:
    its math fallback would hold n x n logits, and a case it cannot fuse is an
    error, not a silent O(n^2) run. Head sizes are zero-padded to a multiple of 8.
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    n, d = x.shape
    on_gpu = jax.devices()[0].platform != "cpu"
    device = "cuda" if on_gpu else "cpu"
    if not on_gpu and 2 * n * n * 4 > max_bytes:  # the CPU may fall back to math
        raise Skip(
            f"torch on CPU may hold two n x n float32 arrays ({8 * n * n / GIB:.2f} "
            f"GiB) > max_bytes {max_bytes / GIB:.2f} GiB"
        )
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    q, k, v = (
        torch.from_numpy(np.array(_pad_head(a, 8)))  # a writable copy
        .to(device=device, dtype=tdtype)
        .reshape(1, 1, n, -1)  # (batch, heads, length, head_dim)
        for a in (x @ A.T, x, x @ V.T)
    )
    fused = [
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
    ]

    backends = (lambda: sdpa_kernel(fused)) if on_gpu else contextlib.nullcontext

    def call():
        with backends():
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
        if on_gpu:
            torch.cuda.synchronize()
        return out

    def to_numpy(out):
        return out[0, 0, :, :d].float().cpu().numpy()

    peak, method = None, None
    if on_gpu:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        call()
        peak = int(torch.cuda.max_memory_allocated())
        method = "torch.cuda.max_memory_allocated over one call (inputs included)"
    return _Prepared(call, None, peak, method, to_numpy)


def _xla_peak_bytes(compiled) -> int | None:
    """Temp + argument + output bytes of a compiled computation (None if unknown)."""
    try:
        stats = compiled.memory_analysis()
    except (RuntimeError, AttributeError):  # a backend without memory analysis
        return None
    if stats is None:
        return None
    return int(
        stats.temp_size_in_bytes
        + stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - getattr(stats, "alias_size_in_bytes", 0)
    )


class _Prepared:
    """A ready-to-time evaluation: call() -> output, plus what preparing it cost."""

    def __init__(
        self, call, compile_seconds=None, peak_bytes=None, method=None, to_numpy=None
    ):
        self.call = call
        self.compile_seconds = compile_seconds
        self.peak_bytes = peak_bytes
        self.peak_bytes_method = method
        self.to_numpy = np.asarray if to_numpy is None else to_numpy


def _compile(fn, args, max_bytes: float, what: str) -> _Prepared:
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    seconds = time.perf_counter() - start
    peak = _xla_peak_bytes(compiled)
    if peak is not None and peak > max_bytes:
        raise Skip(
            f"{what} needs {peak / GIB:.2f} GiB (XLA memory analysis) > "
            f"max_bytes {max_bytes / GIB:.2f} GiB"
        )
    return _Prepared(
        lambda: compiled(*args),
        seconds,
        peak,
        "XLA memory_analysis: temp + argument + output bytes",
    )


def _prepare(impl: str, x, A, V, *, block_size: int, max_bytes: float) -> _Prepared:
    n, d = x.shape
    if impl == "numpy":
        need = 2 * n * n * x.itemsize
        if need > max_bytes:
            raise Skip(
                f"two n x n float32 arrays need {need / GIB:.2f} GiB > max_bytes "
                f"{max_bytes / GIB:.2f} GiB"
            )
        return _Prepared(lambda: numpy_velocity(x, A, V))
    if impl == "keops":
        from pykeops.numpy import LazyTensor

        q, values = x @ A.T, x @ V.T

        def call():
            qi, xj = LazyTensor(q[:, None, :]), LazyTensor(x[None, :, :])
            return (qi | xj).sumsoftmaxweight(LazyTensor(values[None, :, :]), axis=1)

        # KeOps keeps no n x n buffer: inputs and output only.
        return _Prepared(call, None, 5 * n * d * x.itemsize, "analytic: inputs + out")
    if impl.startswith("torch_sdpa"):
        dtype = HALF_IMPLS.get(impl, "float32")
        return _torch_prepare(x, A, V, dtype=dtype, max_bytes=max_bytes)
    if impl == "jax_default":
        return _default_prepare(x, A, V, max_bytes)
    args = tuple(jnp.asarray(a) for a in (x, A, V))
    if impl == "jax_sdpa":
        return _compile(sdpa_velocity, args, max_bytes, impl)
    if impl == "jax_fused_bf16":
        from .._kernels import fused

        def fused_bf16(x, A, V):
            bias = jnp.zeros(x.shape[0], x.dtype)
            return fused.softmax_average(
                x @ A.T, x, bias, x @ V.T, compute_dtype="bfloat16"
            )

        return _compile(fused_bf16, args, max_bytes, impl)
    if impl.startswith("jax_cudnn"):
        sdpa = functools.partial(
            sdpa_velocity, implementation="cudnn", dtype=HALF_IMPLS[impl]
        )
        return _compile(sdpa, args, max_bytes, impl)
    blocking = {"jax_dense": "dense", "jax_blocked": "blocked", "jax_fused": "fused"}
    return _compile(
        _library_velocity(blocking[impl], block_size), args, max_bytes, impl
    )


def _time(call, repeats: int, budget: float) -> dict[str, Any]:
    """Warm-up call, then up to `repeats` timed calls that fit in `budget` seconds."""
    start = time.perf_counter()
    out = jax.block_until_ready(call())
    warm = time.perf_counter() - start
    count = max(1, min(repeats, int((budget - warm) / max(warm, 1e-9))))
    walls, cpus = [], []
    for _ in range(count):
        start, cpu = time.perf_counter(), time.process_time()
        out = jax.block_until_ready(call())
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    best = int(np.argmin(walls))
    return dict(
        first_call_seconds=warm,
        seconds=walls[best],
        cpu_seconds=cpus[best],
        all_seconds=walls,
        out=out,
    )


def _numpy_peak(x, A, V) -> int:
    """Peak bytes NumPy allocates in one evaluation (tracemalloc)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        numpy_velocity(x, A, V)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _solve(impl, x, A, V, *, steps, block_size, max_bytes, budget) -> dict:
    """Time `steps` Euler steps of `mf.simulate` with this implementation."""
    from .._dynamics import simulate
    from .._measures import Particles

    blocking = {"jax_dense": "dense", "jax_blocked": "blocked"}[impl]
    dt = 1 / 16  # exact in binary: the solve takes exactly `steps` steps

    def solve(x, A, V):
        attn = _attention(A, V, blocking, block_size)
        sol = simulate(Particles(x), attn, steps * dt, dt0=dt, solver="euler")
        return sol.x[-1], sol.num_steps

    args = tuple(jnp.asarray(a) for a in (x, A, V))
    prep = _compile(solve, args, max_bytes, f"{impl} solve")
    timing = _time(prep.call, 1, budget)
    num_steps = int(timing["out"][1])
    return dict(
        status="ok",
        solver="euler",
        dt0=dt,
        steps=num_steps,
        compile_seconds=prep.compile_seconds,
        seconds=timing["seconds"],
        cpu_seconds=timing["cpu_seconds"],
        seconds_per_step=timing["seconds"] / num_steps,
        peak_bytes=prep.peak_bytes,
    )


def _case(
    impl, n, d, *, repeats, budget, block_size, max_bytes, steps, solve_max_n, seed=0
) -> dict:
    """Run one (impl, n, d): timing, memory, correctness and (maybe) the solve."""
    x, A, V = problem(n, d, seed)
    prep = _prepare(impl, x, A, V, block_size=block_size, max_bytes=max_bytes)
    rec: dict[str, Any] = dict(
        compile_seconds=prep.compile_seconds,
        # Other jobs on the machine inflate wall times: keep the load with them.
        load_average_1min=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    )
    if impl == "numpy":
        prep.peak_bytes = _numpy_peak(x, A, V)
        prep.peak_bytes_method = "tracemalloc peak of one evaluation"
    timing = _time(prep.call, repeats, budget)
    out = prep.to_numpy(timing.pop("out"))
    if impl == "keops":
        # The first call generates and compiles the formula; with the formula
        # already in KeOps' disk cache this is ~0 (timing noise, either sign).
        rec["compile_seconds"] = timing["first_call_seconds"] - timing["seconds"]
    rows = check_rows(n)
    ref = reference_rows(x, A, V, rows)
    err = np.max(np.abs(out[rows].astype(np.float64) - ref)) / np.max(np.abs(ref))
    rec.update(timing)
    rec.update(
        status="ok",
        interactions_per_second=n * n / timing["seconds"],
        peak_bytes=prep.peak_bytes,
        peak_bytes_method=prep.peak_bytes_method,
        rel_error=float(err),
        check_rows=len(rows),
    )
    del out, prep
    if (
        impl in SOLVE_IMPLS
        and steps > 0
        and solve_max_n is not None
        and n > solve_max_n
    ):
        rec["solve"] = dict(
            status="skipped", reason=f"n > solve_max_n = {solve_max_n} (configured)"
        )
    elif impl in SOLVE_IMPLS and steps > 0:
        projected = 2 * steps * timing["seconds"]
        if projected > budget:
            rec["solve"] = dict(
                status="skipped",
                reason=f"projected {projected:.1f} s (2 x {steps} evaluations) > "
                f"budget {budget:.0f} s",
            )
        else:
            rec["solve"] = _solve(
                impl,
                x,
                A,
                V,
                steps=steps,
                block_size=block_size,
                max_bytes=max_bytes,
                budget=budget,
            )
    return rec


def guarded_case(impl, n, d, *, available, last, max_n, only_ds, **kw) -> dict:
    """One case behind its skip checks; exceptions become an "error" record.

    Args:
        impl: implementation name.
        n: number of particles.
        d: dimension.
        available: (available, reason) of the implementation.
        last: (n, seconds) of its last timed case at this d, or None.
        max_n: its largest n, or None.
        only_ds: its dimensions, or None for all.
        **kw: the case's budgets and options (see `_case`).

    Returns:
        The record's fields (status, timings, ...).

    Raises:
        Skip: the case is not run (configured out, or projected over budget).
    """
    ok, info = available
    if not ok:
        return dict(status="unavailable", reason=info)
    if max_n is not None and n > max_n:
        raise Skip(f"n > max_n = {max_n} for {impl} (configured)")
    if only_ds is not None and d not in only_ds:
        raise Skip(f"d not in {list(only_ds)} for {impl} (configured)")
    if last is not None:
        n_prev, s_prev = last
        projected = s_prev * (n / n_prev) ** 2
        if 2 * projected > kw["budget"]:
            raise Skip(
                f"projected {projected:.1f} s per evaluation (from {s_prev:.3g} s at "
                f"n = {n_prev}, x4 per doubling): warm-up + 1 call > budget "
                f"{kw['budget']:.0f} s"
            )
    try:
        return _case(impl, n, d, **kw)
    except Skip:
        raise
    except Exception as err:  # e.g. out of memory: record it and go on
        return dict(status="error", reason=f"{type(err).__name__}: {err}"[:500])
