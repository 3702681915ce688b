"""This machine, for the n-scaling benchmark: its floor and its environment.

The floor of one softmax velocity evaluation is n^2 exponentials at the measured
exp rate plus 4 n^2 d flops at the measured matmul rate (`measure_floor`,
`floor_seconds`); `environment` records the device, versions, CPU and BLAS thread
settings next to the timings.
"""

import importlib.metadata
import math
import os
import platform
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


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
    outputs) and a kernel whose exponentials need no memory traffic: on a CPU exp
    fused into a row sum over a 4096 x 4096 grid (what a softmax kernel does); on
    an accelerator `EXP_CHAIN` exponentials chained on each of 2^24 elements
    (XLA's GPU compiler took minutes over the row sum of a grid large enough to
    hide kernel launches). The matmul rate is an m x m product (m = 2048 on
    CPU) at JAX's default precision, as in the kernels. Accelerators get larger
    sizes so that kernel launches do not dominate.

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
    x = jnp.asarray(rng.standard_normal(size).astype(np.float32))
    elementwise = size / _best_seconds(lambda: _exp(x), repeats)
    if on_cpu:
        rows = jnp.asarray(rng.standard_normal(rows_n).astype(np.float32))
        cols = jnp.asarray(rng.standard_normal(cols_n).astype(np.float32))
        seconds = _best_seconds(lambda: _exp_rowsum(rows, cols), repeats)
        fused, fused_size = rows_n * cols_n / seconds, [rows_n, cols_n]
    else:
        y = jnp.asarray(rng.random(1 << 24).astype(np.float32))
        seconds = _best_seconds(lambda: _exp_chain(y), repeats)
        fused, fused_size = EXP_CHAIN * y.size / seconds, [y.size, EXP_CHAIN]
    a = jnp.asarray(rng.standard_normal((m, m)).astype(np.float32))
    flops = 2 * m**3 / _best_seconds(lambda: _matmul(a, a), repeats)
    half = {}
    if not on_cpu:  # the half-precision peers' floor (they run on accelerators only)
        for dtype in ("bfloat16", "float16"):
            h = a.astype(dtype)
            rate = 2 * m**3 / _best_seconds(lambda h=h: _matmul(h, h), repeats)
            half[f"matmul_{dtype}_flops_per_second"] = rate
    return {
        "exp_per_second": max(elementwise, fused),
        "exp_elementwise_per_second": elementwise,
        "exp_fused_per_second": fused,
        "matmul_flops_per_second": flops,
        **half,
        "sizes": {"exp": size, "exp_fused": fused_size, "matmul": m},
        "exp_fused_kernel": "row sum" if on_cpu else "chain",
        "seconds": time.perf_counter() - start,
    }


@jax.jit
def _exp(x):
    return jnp.exp(x)


@jax.jit
def _exp_rowsum(rows, cols):
    return jnp.sum(jnp.exp(rows[:, None] * 0.1 + cols[None, :] * 0.1), axis=1)


#: Exponentials per element in `_exp_chain`: enough that the kernel is bound by
#: the exp unit, not by reading and writing its 4-byte elements.
EXP_CHAIN = 64


@jax.jit
def _exp_chain(y):
    """Y -> exp(-y), `EXP_CHAIN` times per element, in one elementwise kernel.

    exp(-y) maps [0, inf) into (0, 1], so the chain stays finite and no
    simplification can remove a step.
    """
    for _ in range(EXP_CHAIN):
        y = jnp.exp(-y)
    return y


@jax.jit
def _matmul(a, b):
    return a @ b


def floor_seconds(
    n: int, d: int, floor: Mapping[str, float], dtype: str = "float32"
) -> float:
    """The floor of one evaluation: n^2 exps plus 4 n^2 d flops at measured rates.

    The flops are the two (n, n, d) products, logits and weighted values, at the
    matmul rate of the inputs' precision (float32's where that was not measured).

    Args:
        n: number of particles.
        d: dimension.
        floor: rates from `measure_floor` ("exp_per_second",
            "matmul_flops_per_second", "matmul_<dtype>_flops_per_second").
        dtype: the inputs' precision, "float32", "bfloat16" or "float16".

    Returns:
        Seconds.
    """
    matmul = floor.get(f"matmul_{dtype}_flops_per_second")
    matmul = floor["matmul_flops_per_second"] if matmul is None else matmul
    return n * n / floor["exp_per_second"] + 4 * n * n * d / matmul


def keops_status() -> tuple[bool, str]:
    """Whether pykeops imports.

    Returns:
        (available, its version or the reason it is not).
    """
    try:
        import pykeops
    except Exception as err:  # any import failure means "not available"
        return False, f"pykeops does not import: {type(err).__name__}: {err}"
    return True, getattr(pykeops, "__version__", "unknown")


def torch_status() -> tuple[bool, str]:
    """Whether PyTorch can run the peer on JAX's device (a CUDA GPU, or the CPU).

    Returns:
        (available, "torch <version> on <device>" or the reason it is not).
    """
    try:
        import torch
    except Exception as err:  # any import failure means "not available"
        return False, f"torch does not import: {type(err).__name__}: {err}"
    platform_ = jax.devices()[0].platform
    if platform_ == "cpu":
        return True, f"torch {torch.__version__} on cpu"
    if platform_ in ("gpu", "cuda") and torch.cuda.is_available():
        return True, f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}"
    return False, f"torch has no device next to JAX's {platform_}"


def fused_status() -> tuple[bool, str]:
    """Whether meanfield's fused kernel compiles here (Triton: a GPU).

    Returns:
        (available, the device or the reason it is not timed).
    """
    device = jax.devices()[0]
    if device.platform in ("gpu", "cuda"):
        return True, device.device_kind
    return False, (
        f"the fused kernel compiles for GPUs; on {device.platform} it runs in "
        "Pallas' interpret mode (for tests), which is not worth timing"
    )


def cudnn_status() -> tuple[bool, str]:
    """Whether cuDNN's fused attention applies (`jax.nn.dot_product_attention`).

    Returns:
        (available, the device or the reason it is not).
    """
    device = jax.devices()[0]
    if device.platform in ("gpu", "cuda"):
        return True, device.device_kind
    return False, f"cuDNN attention needs an NVIDIA GPU; JAX runs on {device.platform}"


def environment() -> dict[str, Any]:
    """Device, versions, CPU model, BLAS thread settings and load average.

    Returns:
        {"device", "cpu", "versions", "thread_env", "load_average"}.
    """
    versions = {"python": platform.python_version()}
    dists = ("meanfield", "jax", "jaxlib", "numpy", "pykeops", "threadpoolctl", "torch")
    for dist in dists:
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


def blas_limits():
    """Pin NumPy's BLAS to all cores with threadpoolctl, if installed.

    Returns:
        (the limits to `unregister` at the end, or None; a line saying which).
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None, "threadpoolctl not installed: BLAS threads left at the defaults"
    limits = threadpool_limits(limits=os.cpu_count(), user_api="blas")
    return limits, f"threadpoolctl: BLAS pinned to {os.cpu_count()} threads"
