import gc
import os

# The suite compiles thousands of small programs and runs each a few times, so
# compilation dominates: skip LLVM's optimisation of the generated CPU code (35 %
# less CPU measured on test_attention.py). XLA's own HLO passes, which decide
# fusion and precision, still run; no result a test checks depends on LLVM's.
# Set before JAX creates its CPU backend; a user's XLA_FLAGS are kept.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]
).strip()

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
