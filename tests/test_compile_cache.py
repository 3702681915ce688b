"""The persistent compilation cache: on by default, in a user directory, opt-out."""

import json
import os
import subprocess
import sys

import jax
import numpy as np

import meanfield as mf

# A fresh process: imports meanfield, runs one small solve, reports where the
# cache is and how many compiled programs it loaded from disk.
PROBE = """
import json, jax
hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None
)
import numpy as np
import meanfield as mf
x = np.random.default_rng(0).normal(size=(6, 2))
sol = mf.simulate(mf.Particles(x), mf.SoftmaxAttention(np.eye(2), A=np.eye(2)), 1.0)
print(json.dumps({"dir": jax.config.jax_compilation_cache_dir, "hits": len(hits),
                  "status": sol.status,
                  "max_size": jax.config.jax_compilation_cache_max_size}))
"""


def _probe(tmp_path, **env):
    full = {k: v for k, v in os.environ.items() if k != "MEANFIELD_COMPILATION_CACHE"}
    full.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), **env)
    run = subprocess.run(
        [sys.executable, "-c", PROBE], env=full, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_cache_is_on_by_default_and_a_second_process_loads_from_it(tmp_path):
    first = _probe(tmp_path)
    where = tmp_path / "xdg" / "meanfield" / "jax"
    assert first["dir"] == str(where) and first["status"] == "success"
    assert first["max_size"] == 2 * 1024**3  # bounded, unlike JAX's default
    assert any(where.iterdir())  # compiled programs were written
    second = _probe(tmp_path)
    assert second["hits"] > 0 and second["status"] == "success"


def test_cache_directory_and_opt_out(tmp_path):
    chosen = tmp_path / "mine"
    assert _probe(tmp_path, MEANFIELD_COMPILATION_CACHE=str(chosen))["dir"] == str(
        chosen
    )
    assert any(chosen.iterdir())
    off = _probe(tmp_path, MEANFIELD_COMPILATION_CACHE="0")
    assert off["dir"] is None and not (tmp_path / "xdg" / "meanfield").exists()


def _holds_callback(run) -> bool:
    text = jax.jit(run).lower().as_text()
    return "callback" in text


def test_solves_hold_no_host_callback():
    # JAX's persistent cache never keeps a program with a host callback, and
    # diffrax checks traced save times with one: the solver clock makes them
    # compile-time constants (meanfield/_clock.py).
    x = np.random.default_rng(0).normal(size=(6, 2))
    mu, attn = mf.Particles(x), mf.SoftmaxAttention(np.eye(2), A=np.eye(2))
    saves = np.linspace(0.0, 2.0, 5)
    gauss = mf.Gaussian(np.zeros(2), np.eye(2))
    runs = {
        "default": lambda: mf.simulate(mu, attn, 2.0).x,
        "saveat, sphere": lambda: (
            mf.simulate(mu, attn, 2.0, saveat=saves, normalization="sphere").x
        ),
        "fixed step": lambda: (
            mf.simulate(mu, attn, 2.0, solver="euler", dt0=0.1, saveat=saves).x
        ),
        "gaussian": lambda: mf.gaussian.simulate(gauss, attn, 2.0, saveat=saves).cov,
        "layers": lambda: mf.layers(mu, attn, 4).x,
    }
    held = [name for name, run in runs.items() if _holds_callback(run)]
    assert held == []
    # A parameter given as a function of t keeps its runtime check (a callback):
    # such solves work, only without the persistent cache.
    timed = mf.SoftmaxAttention(lambda t: np.eye(2) * (1 + t), A=np.eye(2))
    assert _holds_callback(lambda: mf.simulate(mu, timed, 2.0).x)
