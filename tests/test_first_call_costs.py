"""What the first `mf.simulate` of a structure compiles: one XLA program, the solve.

A fresh process pays for every program it compiles (benchmarks/first_call.py
times it). These tests count programs, never seconds: JAX reports each
compilation as a monitoring event.
"""

import contextlib

import jax
import numpy as np
import pytest

import meanfield as mf
from meanfield._checks import as_float_array

_COMPILE = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def compiled_programs():
    """The names of the XLA programs compiled (or read from the disk cache) inside."""
    names = []

    def listen(event, secs, **kwargs):
        if event == _COMPILE:
            names.append(kwargs.get("fun_name"))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


@pytest.mark.parametrize(
    "value",
    [
        np.linspace(0, 1, 35, dtype=np.float32).reshape(7, 5),
        np.linspace(0, 1, 36).reshape(9, 4),
        np.arange(33).reshape(11, 3),
        np.array([True, False, True, True, False, True, False]),
        np.float32(2.5),
    ],
    ids=["float32", "float64", "int", "bool", "scalar"],
)
def test_numpy_input_is_converted_without_a_program(value):
    with compiled_programs() as names:
        got = as_float_array(value, "value")
    assert names == []
    want = jax.numpy.asarray(value)
    if not jax.numpy.issubdtype(want.dtype, jax.numpy.floating):
        want = want.astype(jax.numpy.result_type(float))
    assert got.dtype == want.dtype and got.shape == want.shape
    assert not got.weak_type
    np.testing.assert_array_equal(got, want)  # a conversion: exact


def _on_sphere(n, d):
    x = np.random.default_rng(n).normal(size=(n, d)).astype(np.float32)
    return mf.Particles(x / np.linalg.norm(x, axis=1, keepdims=True))


def test_concrete_simulate_compiles_only_the_solve():
    opts = dict(saveat=np.linspace(0, 3, 7), normalization="sphere")
    # diffrax evaluates its result codes eagerly once per process (programs of
    # its own, whatever the inputs): a first solve of other shapes pays them.
    eye = np.eye(3, dtype=np.float32)
    mf.simulate(_on_sphere(5, 3), mf.SoftmaxAttention(eye, A=eye), 3.0, **opts)
    mu = _on_sphere(37, 4)  # the measure's own construction is not counted here
    with compiled_programs() as names:
        eye = np.eye(4, dtype=np.float32)
        sol = mf.simulate(mu, mf.SoftmaxAttention(eye, A=eye), 3.0, **opts)
        jax.block_until_ready(sol.x)
    # One program: the inputs (the attention's matrices included) are checked
    # and converted on the host, and nothing is compiled eagerly before the solve.
    assert names == ["jit(_solve)"]
    assert sol.status == "success"
