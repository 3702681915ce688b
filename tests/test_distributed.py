"""Two processes on localhost run one sharded `simulate` (`jax.distributed`).

Each process initialises `jax.distributed` against a coordinator on a free local
port, with 2 simulated CPU devices and gloo CPU collectives: 4 devices in all,
2 of them addressable per process. The particle axis is sharded over the 4
(`mf.shard`), the solve runs with collectives between the processes, and the
gathered trajectory must equal a single-process solve of the same tokens.
"""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import meanfield as mf

WORKER = """
import sys
import jax

process, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=f"localhost:{port}", num_processes=2, process_id=process
)
jax.config.update("jax_enable_x64", True)
import numpy as np
from jax.experimental import multihost_utils

import meanfield as mf

assert (jax.process_count(), jax.device_count(), jax.local_device_count()) == (2, 4, 2)
rng = np.random.default_rng(0)  # the same tokens in every process
x = rng.normal(size=(64, 3))
w = rng.uniform(size=64)
mu = mf.shard(mf.Particles(x, w / w.sum()))
assert not mu.x.is_fully_addressable  # really spread over both processes
attn = mf.SoftmaxAttention(np.eye(3), A=2 * np.eye(3))
sol = mf.simulate(mu, attn, 3.0, saveat=np.linspace(0, 3, 7), normalization="sphere")
xs = multihost_utils.process_allgather(sol.x, tiled=True)
if process == 0:
    np.savez(out, x=np.asarray(xs), status=str(sol.status), steps=int(sol.num_steps))
jax.distributed.shutdown()
print("ok", process)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# Second tier (make test-slow): two fresh processes, each compiling the solve.
@pytest.mark.slow
def test_two_processes_give_the_single_process_solution(tmp_path):
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        JAX_PLATFORMS="cpu",
    )
    port, out = _free_port(), tmp_path / "two_processes.npz"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(i), str(port), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:  # a process whose peer died waits in a collective
            p.kill()
    for p, (stdout, stderr) in zip(procs, results, strict=True):
        assert p.returncode == 0, stderr[-3000:]
        assert stdout.strip().endswith(f"ok {procs.index(p)}")  # gloo logs before
    got = np.load(out)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3))
    w = rng.uniform(size=64)
    want = mf.simulate(
        mf.Particles(x, w / w.sum()),
        mf.SoftmaxAttention(np.eye(3), A=2 * np.eye(3)),
        3.0,
        saveat=np.linspace(0, 3, 7),
        normalization="sphere",
    )
    assert str(got["status"]) == "success"
    assert int(got["steps"]) == int(want.num_steps)  # the same steps were taken
    # The same steps; sums over the keys in another order: rounding only.
    np.testing.assert_allclose(got["x"], np.asarray(want.x), rtol=0, atol=1e-12)
