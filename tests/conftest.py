import gc

import jax
import jax.random as jr
import pytest

# Reference comparisons are made in float64; rank promotion must be explicit.
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def key():
    return jr.key(0)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code():
    # Every compiled XLA executable keeps memory maps (8400 after test_attention
    # alone). In one process the whole suite passed Linux's default
    # vm.max_map_count (65530) and LLVM aborted mid-compile; clearing JAX's caches
    # after each module gives them back (8421 -> 707 measured).
    yield
    jax.clear_caches()
    gc.collect()
