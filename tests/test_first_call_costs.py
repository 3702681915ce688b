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
    assert names == ["jit(solve_dynamics)"]
    assert sol.status == "success"


def _sweep(run, horizons):
    """Programs compiled by run(t1, saves) over horizons and save-time values.

    The first horizon compiles (outside the count); every other horizon moves
    the solver clock's length (24 -> 16... 5 -> 4, 100 -> 128), and each takes
    two grids of save times of one shape: uniform and random.
    """
    rng = np.random.default_rng(0)

    def saves(t1):
        return [np.linspace(0, t1, 5), np.sort(rng.uniform(0, t1, 5))]

    first = horizons[0]
    jax.block_until_ready(run(first, saves(first)[0]))
    with compiled_programs() as names:
        for t1 in horizons[1:]:
            for s in saves(t1):
                jax.block_until_ready(run(t1, s))
    return names


_HORIZONS = (20.0, 24.0, 5.0, 100.0, 0.3)


def test_a_sweep_over_t1_and_save_times_reuses_the_compiled_solve():
    eye = np.eye(3)
    mu, attn = _on_sphere(9, 3), mf.SoftmaxAttention(eye, A=eye)
    mu = mf.Particles(np.asarray(mu.x, np.float64))

    def particles(t1, s):
        return mf.simulate(mu, attn, t1, saveat=s, normalization="sphere").x

    def ends_only(t1, s):
        return mf.simulate(mu, attn, t1, normalization="sphere").x

    def noisy(t1, s):
        noise, key = mf.IndependentNoise(0.1), jax.random.key(1)
        return mf.simulate(mu, attn, t1, saveat=s, noise=noise, key=key).x

    def fixed_step(t1, s):
        return mf.simulate(mu, attn, t1, saveat=s, solver="euler", dt0=t1 / 50).x

    def gaussian(t1, s):
        gauss = mf.Gaussian(np.zeros(3), 0.01 * eye)
        return mf.gaussian.simulate(gauss, attn, t1 / 100, saveat=s / 100).cov

    runs = dict(
        particles=particles,
        ends_only=ends_only,
        noisy=noisy,
        fixed_step=fixed_step,
        gaussian=gaussian,
    )
    compiled = {name: _sweep(run, _HORIZONS) for name, run in runs.items()}
    assert compiled == {name: [] for name in runs}


@pytest.mark.parametrize("scheduling", ["vmap", "queue"])
def test_an_ensemble_sweep_over_t1_and_save_times_reuses_the_compiled_chunk(
    scheduling,
):
    eye = np.eye(2)
    x = np.random.default_rng(3).normal(size=(4, 6, 2))
    measures = jax.vmap(mf.Particles)(x / np.linalg.norm(x, axis=-1, keepdims=True))
    attn = mf.SoftmaxAttention(eye, A=eye)

    def run(t1, s):
        opts = dict(saveat=s, normalization="sphere", scheduling=scheduling)
        return mf.simulate_ensemble(measures, attn, t1, **opts).x

    assert _sweep(run, _HORIZONS[:3]) == []


def test_noisy_layers_over_another_depth_of_time_reuse_the_compiled_stack():
    eye = np.eye(3)
    mu, attn = _on_sphere(9, 3), mf.SoftmaxAttention(eye, A=eye)
    noise, key = mf.IndependentNoise(0.1), jax.random.key(0)

    def run(t1, s):
        return mf.layers(mu, attn, 8, t1=t1, noise=noise, key=key).x

    assert _sweep(run, _HORIZONS) == []
