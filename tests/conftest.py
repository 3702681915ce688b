import gc
import os
import subprocess
import sys

# The suite compiles thousands of small programs and runs each a few times, so
# compilation dominates (61 % of test time, measured), and two XLA:CPU options
# trade the speed of the generated code for compile time:
# - skip LLVM's optimisation of the generated code (35 % less CPU measured on
#   test_attention.py);
# - emit fused kernels with XLA's classic element-wise emitters instead of its
#   newer MLIR fusion emitters: backend compile time of the whole suite 396 s ->
#   167 s, `make test` 378 s -> 221 s wall on 2 cores (measured).
# XLA's HLO passes, which decide fusion and precision, still run; no result a
# test checks depends on either option (the suite passes with and without them).
_FAST_COMPILE = (
    "--xla_backend_optimization_level=0",
    "--xla_cpu_use_fusion_emitters=false",
)
_CHECKED = "MEANFIELD_TEST_XLA_FLAGS"


def _supported(flags: str) -> bool:
    # XLA aborts the process on a flag it does not know (a newer jaxlib may drop
    # the fusion-emitter switch): try the flags in a child process once.
    env = dict(os.environ, XLA_FLAGS=flags)
    probe = "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True)
    return run.returncode == 0


# Set before JAX creates its CPU backend; a user's XLA_FLAGS are kept. The pytest
# process checks once; xdist workers inherit the outcome through the environment.
if _CHECKED not in os.environ:
    user = os.environ.get("XLA_FLAGS", "")
    kept = list(_FAST_COMPILE)
    if not _supported(" ".join([user, *kept])):
        kept = [f for f in _FAST_COMPILE if _supported(f"{user} {f}")]
    os.environ["XLA_FLAGS"] = " ".join([user, *kept]).strip()
    os.environ[_CHECKED] = " ".join(kept)

# No persistent compilation cache under test: CI is cold anyway, and a suite must
# not write into the user's cache directory (test_compile_cache.py opts back in,
# in child processes).
os.environ.setdefault("MEANFIELD_COMPILATION_CACHE", "0")

import jax  # noqa: E402
import jax.random as jr  # noqa: E402
import pytest  # noqa: E402

# Reference comparisons are made in float64; rank promotion must be explicit.
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def key():
    return jr.key(0)


def _memory_maps() -> int:
    """Memory maps of this process (Linux); 0 where /proc is not available."""
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code():
    # Every compiled XLA executable keeps memory maps (8400 after test_attention
    # alone). In one process the whole suite passed Linux's default
    # vm.max_map_count (65530) and LLVM aborted mid-compile; clearing JAX's caches
    # gives them back (8421 -> 707 measured). Clear only past a third of the limit:
    # until then later modules reuse what earlier ones compiled.
    yield
    if _memory_maps() > 20_000:
        jax.clear_caches()
        gc.collect()
