"""Scaling benchmark of one softmax velocity evaluation over n and d.

Times Gamma(x_i) = sum_j softmax_j(<A x_i, x_j>) V x_j (uniform weights, float32)
for several implementations, next to this machine's floor measured in the same
run: n^2 exponentials at the measured exp rate plus 4 n^2 d flops at the measured
matmul rate. Library code, so that the command line and the benchmark script share
it; nothing here runs at import.

Implementations (`IMPLS`):

- "numpy": the naive NumPy style of public peer code (two n x n float32 arrays).
- "jax_dense": `SoftmaxAttention(blocking="dense")` under `jax.jit`.
- "jax_blocked": `SoftmaxAttention(blocking="blocked")` under `jax.jit`.
- "jax_sdpa": `jax.nn.dot_product_attention`, one head, float32, XLA path (its
  cuDNN path accepts only half precision, so it does not apply to float32).
- "keops": pykeops' `sumsoftmaxweight` reduction, when pykeops imports.
"""

import gc
import importlib.metadata
import math
import os
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

IMPLS = ("numpy", "jax_dense", "jax_blocked", "jax_sdpa", "keops")
#: Implementations that also time a fixed-step solve through `mf.simulate`.
SOLVE_IMPLS = ("jax_dense", "jax_blocked")
GIB = 2**30
_DTYPE = np.float32
# Rows of the float64 correctness check (evenly spaced over the n particles).
_CHECK_ROWS = 256


class _Skip(Exception):
    """A case that is not run, with the reason."""


def _best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    jax.block_until_ready(fn())
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - start)
    return best


def measure_floor(*, repeats: int = 5) -> dict[str, Any]:
    """Measure this machine's exp throughput and matmul rate (float32, jitted).

    The exp rate is the better of two kernels on all cores: `jnp.exp` over a large
    array (2^22 elements on CPU: 16 MiB, not bound by page faults on fresh
    outputs) and exp fused into a row sum over a grid (4096 x 4096 on CPU; what a
    softmax kernel does, with no memory traffic). The matmul rate is an m x m
    product (m = 2048 on CPU) at JAX's default precision, as in the kernels.
    Accelerators get larger sizes so that kernel launches do not dominate.

    Args:
        repeats: timed calls per kernel after a warm-up; the minimum is kept.

    Returns:
        {"exp_per_second", "exp_elementwise_per_second", "exp_fused_per_second",
        "matmul_flops_per_second", "sizes", "seconds"}.
    """
    start = time.perf_counter()
    on_cpu = jax.devices()[0].platform == "cpu"
    size, (rows_n, cols_n), m = (
        (1 << 22, (4096, 4096), 2048) if on_cpu else (1 << 26, (16384, 65536), 8192)
    )
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(size).astype(_DTYPE))
    elementwise = size / _best_seconds(lambda: _exp(x), repeats)
    rows = jnp.asarray(rng.standard_normal(rows_n).astype(_DTYPE))
    cols = jnp.asarray(rng.standard_normal(cols_n).astype(_DTYPE))
    fused = rows_n * cols_n / _best_seconds(lambda: _exp_rowsum(rows, cols), repeats)
    a = jnp.asarray(rng.standard_normal((m, m)).astype(_DTYPE))
    flops = 2 * m**3 / _best_seconds(lambda: _matmul(a, a), repeats)
    return {
        "exp_per_second": max(elementwise, fused),
        "exp_elementwise_per_second": elementwise,
        "exp_fused_per_second": fused,
        "matmul_flops_per_second": flops,
        "sizes": {"exp": size, "exp_fused": [rows_n, cols_n], "matmul": m},
        "seconds": time.perf_counter() - start,
    }


@jax.jit
def _exp(x):
    return jnp.exp(x)


@jax.jit
def _exp_rowsum(rows, cols):
    return jnp.sum(jnp.exp(rows[:, None] * 0.1 + cols[None, :] * 0.1), axis=1)


@jax.jit
def _matmul(a, b):
    return a @ b


def floor_seconds(n: int, d: int, floor: Mapping[str, float]) -> float:
    """The floor of one evaluation: n^2 exps plus 4 n^2 d flops at measured rates.

    The flops are the two (n, n, d) products, logits and weighted values.
    """
    return (
        n * n / floor["exp_per_second"]
        + 4 * n * n * d / floor["matmul_flops_per_second"]
    )


def problem(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(x, A, V) in float32 with O(1) logits: x ~ N(0, I), A ~ N(0, 1/d^2)."""
    rng = np.random.default_rng([seed, n, d])
    x = rng.standard_normal((n, d)).astype(_DTYPE)
    A = (rng.standard_normal((d, d)) / d).astype(_DTYPE)
    V = (rng.standard_normal((d, d)) / math.sqrt(d)).astype(_DTYPE)
    return x, A, V


def check_rows(n: int) -> np.ndarray:
    """Indices of the rows checked against the float64 reference."""
    return np.unique(np.linspace(0, n - 1, min(n, _CHECK_ROWS)).astype(np.int64))


def reference_rows(x, A, V, rows, *, chunk: int = 8192) -> np.ndarray:
    """Float64 velocity at the atoms `rows`, over all n keys, in key chunks.

    Online softmax in NumPy float64 (running max, sum and weighted sum), so memory
    is O(len(rows) * chunk) at any n, and independent of the code under test.
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


def sdpa_velocity(x, A, V):
    """The same velocity through `jax.nn.dot_product_attention` (one head)."""
    # (batch, length, heads, head_dim) = (1, n, 1, d); scale 1: logits <A x_i, x_j>.
    q = (x @ A.T)[None, :, None, :]
    k = x[None, :, None, :]
    v = (x @ V.T)[None, :, None, :]
    out = jax.nn.dot_product_attention(q, k, v, scale=1.0, implementation="xla")
    return out[0, :, 0, :]


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

    def __init__(self, call, compile_seconds=None, peak_bytes=None, method=None):
        self.call = call
        self.compile_seconds = compile_seconds
        self.peak_bytes = peak_bytes
        self.peak_bytes_method = method


def _compile(fn, args, max_bytes: float, what: str) -> _Prepared:
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    seconds = time.perf_counter() - start
    peak = _xla_peak_bytes(compiled)
    if peak is not None and peak > max_bytes:
        raise _Skip(
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
            raise _Skip(
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
    args = tuple(jnp.asarray(a) for a in (x, A, V))
    if impl == "jax_sdpa":
        return _compile(sdpa_velocity, args, max_bytes, impl)
    blocking = {"jax_dense": "dense", "jax_blocked": "blocked"}[impl]
    return _compile(_library_velocity(blocking, block_size), args, max_bytes, impl)


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


def keops_status() -> tuple[bool, str]:
    """(available, version or the reason it is not)."""
    try:
        import pykeops
    except Exception as err:  # any import failure means "not available"
        return False, f"pykeops does not import: {type(err).__name__}: {err}"
    return True, getattr(pykeops, "__version__", "unknown")


def environment() -> dict[str, Any]:
    """Device, versions, CPU model, BLAS thread settings and load average."""
    versions = {"python": platform.python_version()}
    for dist in ("meanfield", "jax", "jaxlib", "numpy", "pykeops", "threadpoolctl"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    device = jax.devices()[0]
    cpu_model = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next(
                (
                    ln.split(":", 1)[1].strip()
                    for ln in f
                    if ln.startswith("model name")
                ),
                None,
            )
    except OSError:
        pass
    env_keys = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    return dict(
        device=dict(
            platform=device.platform,
            device_kind=device.device_kind,
            name=str(device),
            count=jax.device_count(),
        ),
        cpu=dict(model=cpu_model, cores=os.cpu_count(), machine=platform.machine()),
        versions=versions,
        thread_env={k: os.environ.get(k) for k in env_keys},
        load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    )


def _blas_limits():
    """Pin NumPy's BLAS to all cores with threadpoolctl, if installed."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None, "threadpoolctl not installed: BLAS threads left at the defaults"
    limits = threadpool_limits(limits=os.cpu_count(), user_api="blas")
    return limits, f"threadpoolctl: BLAS pinned to {os.cpu_count()} threads"


def _fractions(records: list[dict], floor: Mapping[str, float]) -> None:
    for rec in records:
        if rec.get("seconds") is not None:
            rec["floor_seconds"] = floor_seconds(rec["n"], rec["d"], floor)
            rec["fraction_of_floor"] = rec["floor_seconds"] / rec["seconds"]


def _case(
    impl, n, d, *, repeats, budget, block_size, max_bytes, steps, solve_max_n
) -> dict:
    """Run one (impl, n, d): timing, memory, correctness and (maybe) the solve."""
    x, A, V = problem(n, d)
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
    out = np.asarray(timing.pop("out"))
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


def _progress_line(rec: dict) -> str:
    head = f"{rec['impl']:<12} n={rec['n']:<8d} d={rec['d']:<4d}"
    if rec["status"] != "ok":
        return f"{head} {rec['status']}: {rec.get('reason')}"
    peak = rec["peak_bytes"]
    line = (
        f"{head} {rec['seconds']:.4g} s  {rec['interactions_per_second']:.3g}/s  "
        f"floor x{rec['fraction_of_floor']:.2f}  "
        f"peak {'?' if peak is None else f'{peak / 2**20:.0f} MiB'}  "
        f"err {rec['rel_error']:.1e}"
    )
    solve = rec.get("solve")
    if solve and solve["status"] == "ok":
        line += f"  solve {solve['seconds']:.3g} s/{solve['steps']} steps"
    return line


def run(
    ns: Sequence[int],
    ds: Sequence[int],
    impls: Sequence[str] = IMPLS,
    *,
    solve_steps: int = 10,
    solve_max_n: int | None = None,
    repeats: int = 3,
    max_seconds_per_case: float = 60.0,
    max_bytes: float = 3 * GIB,
    block_size: int = 512,
    max_n: Mapping[str, int] | None = None,
    only_ds: Mapping[str, Sequence[int]] | None = None,
    floor: Mapping[str, float] | None = None,
    progress: bool = True,
    on_record: Callable[[dict], None] | None = None,
) -> dict[str, Any]:
    """Time one softmax velocity evaluation per (impl, n, d), and a short solve.

    Cases run d by d, n ascending, all implementations at one (n, d) back to back
    (so they see the same machine load). A case is skipped, with the reason, when
    the implementation is unavailable, n or d is outside its `max_n` / `only_ds`
    entry, its memory (NumPy: 2 n^2 float32; JAX: XLA's memory analysis) exceeds
    `max_bytes`, or its time projected from the last measured n (x (n / n_prev)^2,
    4 per doubling) for a warm-up plus one timed call exceeds the case budget.

    Args:
        ns: numbers of particles.
        ds: dimensions.
        impls: names from `IMPLS`.
        solve_steps: Euler steps of the `mf.simulate` solve timed for "jax_dense"
            and "jax_blocked" (0: no solve).
        solve_max_n: largest n at which the solve is timed (None: any n whose
            projected solve fits in the case budget).
        repeats: timed calls per case after a warm-up (fewer if over budget); the
            minimum is reported.
        max_seconds_per_case: time budget of one case (evaluations and solve).
        max_bytes: memory budget of one evaluation.
        block_size: `block_size` of the blocked `SoftmaxAttention`.
        max_n: per-implementation largest n, e.g. {"numpy": 16384}.
        only_ds: per-implementation dimensions to run, e.g. {"keops": (2, 16)}.
        floor: a `measure_floor` result to use instead of measuring the floor at
            the start and the end of the run.
        progress: print one line per case to stderr.
        on_record: called with the result so far after each case (e.g. to save).

    Returns:
        {"environment", "floor" (start, end and the better of the two, used for
        the fractions), "blas", "config", "records", "wall_seconds"}. Each record
        has impl, n, d, status ("ok" | "skipped" | "unavailable" | "error"),
        reason (if not ok) and, when ok: seconds (min over repeats), cpu_seconds,
        all_seconds, first_call_seconds, compile_seconds, interactions_per_second
        (n^2 / seconds), peak_bytes and peak_bytes_method, floor_seconds,
        fraction_of_floor (floor / seconds), rel_error (max abs error over
        max |reference| on up to 256 rows, against float64) and, for the solve
        implementations, solve (seconds, steps, seconds_per_step, compile_seconds).

    Raises:
        ValueError: an unknown implementation name.
    """
    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        raise ValueError(f"unknown implementations {unknown}; choose from {IMPLS}.")
    max_n, only_ds = dict(max_n or {}), dict(only_ds or {})
    start = time.perf_counter()
    available = {impl: (True, "") for impl in impls}
    if "keops" in impls:
        ok, info = keops_status()
        available["keops"] = (ok, info)
    given_floor = floor is not None
    floor_start = dict(floor) if given_floor else measure_floor()
    limits, blas = _blas_limits()
    result: dict[str, Any] = dict(
        environment=environment(),
        floor=dict(start=floor_start, end=None, used=floor_start),
        blas=blas,
        keops=available.get("keops", (False, "not requested"))[1],
        config=dict(
            ns=list(ns),
            ds=list(ds),
            impls=list(impls),
            solve_steps=solve_steps,
            solve_max_n=solve_max_n,
            repeats=repeats,
            max_seconds_per_case=max_seconds_per_case,
            max_bytes=max_bytes,
            block_size=block_size,
            max_n=max_n,
            only_ds={k: list(v) for k, v in only_ds.items()},
            dtype="float32",
            reference="NumPy float64 online softmax on up to 256 evenly spaced rows",
        ),
        records=[],
        wall_seconds=None,
    )
    records = result["records"]
    last: dict[tuple[str, int], tuple[int, float]] = {}
    try:
        for d in ds:
            for n in sorted(ns):
                for impl in impls:
                    rec: dict[str, Any] = dict(impl=impl, n=int(n), d=int(d))
                    try:
                        rec.update(
                            _guarded_case(
                                impl,
                                n,
                                d,
                                available=available[impl],
                                last=last.get((impl, d)),
                                max_n=max_n.get(impl),
                                only_ds=only_ds.get(impl),
                                repeats=repeats,
                                budget=max_seconds_per_case,
                                block_size=block_size,
                                max_bytes=max_bytes,
                                steps=solve_steps if impl in SOLVE_IMPLS else 0,
                                solve_max_n=solve_max_n,
                            )
                        )
                    except _Skip as skip:
                        rec.update(status="skipped", reason=str(skip))
                    if rec["status"] == "ok":
                        last[(impl, d)] = (n, rec["seconds"])
                    _fractions([rec], result["floor"]["used"])
                    records.append(rec)
                    gc.collect()
                    if progress:
                        print(_progress_line(rec), file=sys.stderr, flush=True)
                    if on_record is not None:
                        on_record(result)
    finally:
        if limits is not None:
            limits.unregister()
    if not given_floor:
        # The better of the two: a busy machine at one end must not lower the bar.
        floor_end = measure_floor()
        used = {
            k: max(floor_start[k], floor_end[k])
            for k in floor_start
            if k.endswith("_per_second")
        }
        result["floor"].update(end=floor_end, used=used)
        _fractions(records, used)
    result["environment"]["load_average_end"] = (
        list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    )
    result["wall_seconds"] = time.perf_counter() - start
    return result


def _guarded_case(impl, n, d, *, available, last, max_n, only_ds, **kw) -> dict:
    """Skip checks in front of `_case`; exceptions become an "error" record."""
    ok, info = available
    if not ok:
        return dict(status="unavailable", reason=info)
    if max_n is not None and n > max_n:
        raise _Skip(f"n > max_n = {max_n} for {impl} (configured)")
    if only_ds is not None and d not in only_ds:
        raise _Skip(f"d not in {list(only_ds)} for {impl} (configured)")
    if last is not None:
        n_prev, s_prev = last
        projected = s_prev * (n / n_prev) ** 2
        if 2 * projected > kw["budget"]:
            raise _Skip(
                f"projected {projected:.1f} s per evaluation (from {s_prev:.3g} s at "
                f"n = {n_prev}, x4 per doubling): warm-up + 1 call > budget "
                f"{kw['budget']:.0f} s"
            )
    try:
        return _case(impl, n, d, **kw)
    except _Skip:
        raise
    except Exception as err:  # e.g. out of memory: record it and go on
        return dict(status="error", reason=f"{type(err).__name__}: {err}"[:500])
