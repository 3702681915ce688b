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
- "jax_default": the path a user gets by default, `jax.jit(lambda mu, a:
  a.velocity(mu))` on `Particles(x)` and `SoftmaxAttention(V, A=A)` built outside
  it (`blocking="auto"`, default `block_size`).
- "jax_sdpa": `jax.nn.dot_product_attention`, one head, float32, XLA path (its
  cuDNN path accepts only half precision, so it does not apply to float32).
- "keops": pykeops' `sumsoftmaxweight` reduction, when pykeops imports.
- "jax_fused", "jax_fused_bf16": `SoftmaxAttention(blocking="fused")`, and the
  same Pallas kernel with bf16 products (`_kernels.fused`; GPU only).
- "jax_cudnn_bf16", "jax_cudnn_fp16": `jax.nn.dot_product_attention`'s cuDNN
  path (GPU only; half-precision inputs, head size padded to a multiple of 8).
- "torch_sdpa", "torch_sdpa_bf16": PyTorch's `scaled_dot_product_attention` on
  JAX's device (float32 and bfloat16), when torch imports; on a GPU only its
  fused kernels may run.

Half-precision cases are measured against the floor at their matmul precision.
"""

import gc
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .bench_cases import (
    Skip,
    check_rows,
    guarded_case,
    numpy_velocity,
    problem,
    reference_rows,
    sdpa_velocity,
)
from .bench_config import GIB, HALF_IMPLS, IMPLS, SOLVE_IMPLS
from .bench_machine import (
    blas_limits,
    cudnn_status,
    environment,
    floor_seconds,
    fused_status,
    keops_status,
    measure_floor,
    torch_status,
)

__all__ = [
    "GIB",
    "IMPLS",
    "SOLVE_IMPLS",
    "check_rows",
    "environment",
    "floor_seconds",
    "keops_status",
    "measure_floor",
    "numpy_velocity",
    "problem",
    "reference_rows",
    "run",
    "sdpa_velocity",
]


def _fractions(records: list[dict], floor: Mapping[str, float]) -> None:
    for rec in records:
        if rec.get("seconds") is not None:
            dtype = HALF_IMPLS.get(rec["impl"], "float32")
            rec["floor_seconds"] = floor_seconds(rec["n"], rec["d"], floor, dtype)
            rec["fraction_of_floor"] = rec["floor_seconds"] / rec["seconds"]


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
    seed: int = 0,
    deadline: float | None = None,
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
        seed: seed of the random problems (combined with n and d, `problem`).
        deadline: a `time.perf_counter()` value after which no case starts (they
            are recorded as skipped, with the reason), or None.

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
    status = {
        "keops": keops_status,
        "jax_fused": fused_status,
        "jax_cudnn": cudnn_status,
        "torch": torch_status,
    }
    for impl in impls:
        check = next((f for k, f in status.items() if impl.startswith(k)), None)
        if check is not None:
            available[impl] = check()
    given_floor = floor is not None
    floor_start = dict(floor) if given_floor else measure_floor()
    limits, blas = blas_limits()
    result: dict[str, Any] = dict(
        environment=environment(),
        floor=dict(start=floor_start, end=None, used=floor_start),
        blas=blas,
        keops=available.get("keops", (False, "not requested"))[1],
        peers={impl: info for impl, (_, info) in available.items() if info},
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
            seed=seed,
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
                    rec: dict[str, Any] = dict(
                        impl=impl,
                        n=int(n),
                        d=int(d),
                        dtype=HALF_IMPLS.get(impl, "float32"),
                    )
                    try:
                        if deadline is not None and time.perf_counter() > deadline:
                            raise Skip("the run's time budget is spent")
                        rec.update(
                            guarded_case(
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
                                seed=seed,
                            )
                        )
                    except Skip as skip:
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
