import jax
import jax.random as jr
import pytest

# Reference comparisons are made in float64; rank promotion must be explicit.
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def key():
    return jr.key(0)
