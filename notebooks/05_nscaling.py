# ---
# jupyter:
#   jupytext:
#     formats: py:percent
# ---

# %% [markdown]
# # n-scaling: O(n) memory, on one device or several
#
# One velocity evaluation Γ_μ(x_i) = Σ_j softmax_j(⟨A x_i, x_j⟩) V x_j costs n²
# query–key interactions. Written densely it also stores two n × n arrays: 2 GiB in
# float32 at n = 16384, 32 GiB at n = 65536. meanfield's kernels can instead run
# **blocked** (the online softmax of flash attention): queries in blocks (`lax.map`),
# keys scanned in blocks with a running maximum, a running sum and a running weighted
# sum of the values, so memory is O(block² + n d) while the arithmetic is unchanged.
#
# ```python
# attn = mf.SoftmaxAttention(V, A=A, blocking="auto", block_size=512)
# # blocking: "auto" | "dense" | "blocked"
# ```
#
# `"auto"` runs dense up to 2048² query–key pairs and blocked beyond. Every family
# (softmax, L2, masked, weighted, multi-head, Sinkhorn) has both paths; they agree to
# 1e−12 in float64, gradients included. This notebook
#
# 1. reads XLA's memory analysis of the compiled dense and blocked kernels (compiled
#    only, never run: the dense one would not fit in memory);
# 2. runs a small benchmark through the library (`meanfield bench`) and plots
#    interactions per second and peak memory against n, then the committed runs of
#    `benchmarks/results/`;
# 3. runs the same velocity sharded over all available devices (`mf.shard`) and
#    checks it against one device.
#
# `SMOKE_TEST=1` runs a small version (used by the test suite).

# %%
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import meanfield as mf
from meanfield.extend import floor_seconds

SMOKE_TEST = os.environ.get("SMOKE_TEST") == "1"

try:
    ROOT = Path(__file__).resolve().parents[1]
except NameError:  # in Jupyter the working directory is notebooks/
    ROOT = Path.cwd().parent
OUT = ROOT / "out" / "notebooks"


def finish(fig, name):
    """Save the full-size figure (full mode only), then close it."""
    if not SMOKE_TEST:
        OUT.mkdir(parents=True, exist_ok=True)
        fig.savefig(OUT / f"{name}.png", dpi=150)
    plt.close(fig)


MiB = 2**20

# %% [markdown]
# ## 1. Compiled memory of a gradient, dense against blocked
#
# `jax.jit(f).lower(shape).compile().memory_analysis()` reports the buffers XLA will
# allocate (temporaries, arguments, outputs) without running anything. Here f is the
# gradient of Σᵢ|Γ(xᵢ)|² with respect to the tokens, as in training or an adjoint
# solve: dense keeps the n × n weights for the backward pass and grows like n², blocked
# recomputes them tile by tile and grows like n (float32, d = 16). (For one unmasked
# evaluation XLA's CPU backend streams the dense kernel by itself; that is a fusion of
# the backend, not something the blocked kernel relies on.)

# %%
d = 16
rng = np.random.default_rng(0)
A = jnp.asarray(rng.standard_normal((d, d)) / d, jnp.float32)
V = jnp.asarray(rng.standard_normal((d, d)) / np.sqrt(d), jnp.float32)
sizes = {
    "dense": [2**12, 2**16] if SMOKE_TEST else [2**k for k in range(10, 18)],
    "blocked": [2**12, 2**16] if SMOKE_TEST else [2**k for k in range(10, 21)],
}
compiled_bytes = {}
for blocking, ns_ in sizes.items():
    attn = mf.SoftmaxAttention(V, A=A, blocking=blocking)
    f = jax.jit(
        jax.grad(lambda x, attn=attn: jnp.sum(attn.velocity(mf.Particles(x)) ** 2))
    )
    compiled_bytes[blocking] = []
    for n in ns_:
        stats = f.lower(jax.ShapeDtypeStruct((n, d), jnp.float32)).compile()
        stats = stats.memory_analysis()
        total = (
            stats.temp_size_in_bytes
            + stats.argument_size_in_bytes
            + stats.output_size_in_bytes
        )
        compiled_bytes[blocking].append(total)
    print(
        blocking,
        {
            n: f"{b / MiB:.0f} MiB"
            for n, b in zip(ns_, compiled_bytes[blocking], strict=True)
        },
    )
# Dense: two n x n float32 arrays; blocked: far below one at n = 65536.
assert compiled_bytes["dense"][sizes["dense"].index(2**16)] > 2 * 4 * 2**32 * 0.9
assert compiled_bytes["blocked"][sizes["blocked"].index(2**16)] < 256 * MiB

# %%
fig, ax = plt.subplots(figsize=(6, 4.2), layout="constrained")
for blocking, marker in (("dense", "s-"), ("blocked", "o-")):
    mib = np.array(compiled_bytes[blocking]) / MiB
    ax.plot(sizes[blocking], mib, marker, label=f'blocking="{blocking}"')
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("n (tokens)")
ax.set_ylabel("compiled memory of a gradient (MiB)")
ax.set_title("XLA memory analysis, gradient of Σ|Γ|², float32, d = 16")
ax.grid(True, which="major", alpha=0.3)
ax.legend()
finish(fig, "05_compiled_memory")

# %% [markdown]
# ## 2. A benchmark through the library
#
# `meanfield bench` times one softmax velocity evaluation (float32) for naive NumPy,
# dense JAX, blocked JAX, `jax.nn.dot_product_attention` and KeOps (when installed),
# checks each against a float64 reference, records XLA's memory analysis (NumPy: the
# `tracemalloc` peak), and measures this machine's floor (exp throughput and matmul
# rate) in the same run. In full mode this cell runs the command line
# `meanfield bench --quick` (n = 2¹⁰…2¹³, d = 2 and 16, about a minute). The smoke
# test runs the same engine (`meanfield.extend.bench_run`) on two tiny sizes with one
# quick floor measurement: the command line measures the floor twice, at the start
# and at the end of the run, which alone takes about 4 s. Both write the same JSON.

# %%
with tempfile.TemporaryDirectory(prefix="meanfield_bench_") as tmp:
    bench_dir = Path(tmp) if SMOKE_TEST else OUT / "05_bench"
    path = bench_dir / "nscaling_notebook.json"
    if SMOKE_TEST:
        from meanfield.extend import bench_run, measure_floor, write_manifest

        result = bench_run(
            [256, 1024],
            [2],
            ("numpy", "jax_dense", "jax_blocked"),
            solve_steps=0,
            repeats=1,
            floor=measure_floor(repeats=1),
            progress=False,
        )
        write_manifest(path, result)
    else:
        from meanfield.extend import cli_main

        start = time.perf_counter()
        argv = ["bench", "--quick", "--name", "notebook", "--out", str(bench_dir)]
        print("meanfield", " ".join(argv[:-2]), "...")
        log = io.StringIO()  # its summary table: printed below from the JSON
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            assert cli_main([*argv, "--no-progress"]) == 0
        print(log.getvalue().strip().splitlines()[-1])
        print(f"meanfield bench --quick: {time.perf_counter() - start:.0f} s")
    live = json.loads(path.read_text())
print(f"read {path}: {len(live['records'])} records")

# %%
STYLE = {
    "numpy": "tab:blue",
    "jax_dense": "tab:orange",
    "jax_blocked": "tab:green",
    "jax_sdpa": "tab:red",
    "keops": "tab:purple",
}
MARKERS = "os^Dv"


def plot_bench(result, title, ds=None):
    """Interactions/s and peak memory against n, per implementation and d.

    `ds`: the dimensions to draw (those of the run that are in it); None: all.
    """
    ok = [r for r in result["records"] if r["status"] == "ok"]
    present = {r["d"] for r in result["records"]}
    ds = sorted(present if ds is None else present & set(ds))
    fig, (ax_r, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    for impl in result["config"]["impls"]:
        for marker, d in zip(MARKERS, ds, strict=False):
            recs = sorted(
                (r for r in ok if r["impl"] == impl and r["d"] == d),
                key=lambda r: r["n"],
            )
            if not recs:
                continue
            ns = [r["n"] for r in recs]
            style = dict(color=STYLE.get(impl), marker=marker, ms=4, lw=1.2)
            label = f"{impl}, d = {d}"
            ax_r.plot(
                ns, [r["interactions_per_second"] for r in recs], **style, label=label
            )
            peak = [r["peak_bytes"] or np.nan for r in recs]
            ax_m.plot(ns, np.array(peak, float) / MiB, **style, label=label)
    ns_all = [r["n"] for r in result["records"]]
    for marker, d in zip(MARKERS, ds, strict=False):
        # The floor of one interaction: 1 exp + 4 d flops at the measured rates.
        rate = 1 / floor_seconds(1, d, result["floor"]["used"])
        ax_r.plot(
            [min(ns_all), max(ns_all)],
            [rate, rate],
            "k--",
            lw=0.8,
            marker=marker,
            ms=4,
            alpha=0.5,
        )
    for ax, label in ((ax_r, "interactions / s"), (ax_m, "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
    ax_r.set_title(f"{title}: rate (dashed: the run's floor per d)", fontsize=10)
    ax_m.set_title(f"{title}: peak memory of one evaluation", fontsize=10)
    ax_m.legend(fontsize=7, ncol=2)
    return fig


def describe(result):
    env = result["environment"]
    if env["device"]["platform"] == "cpu":
        return f"{env['cpu']['model']} ({env['cpu']['cores']} cores)"
    return env["device"]["device_kind"]


for r in live["records"]:
    if r["status"] == "ok":
        print(
            f"{r['impl']:<12} n = {r['n']:<6} d = {r['d']:<3} "
            f"{r['interactions_per_second']:.2e}/s, {r['fraction_of_floor']:.2f} of "
            f"the floor, peak {(r['peak_bytes'] or np.nan) / MiB:.1f} MiB, rel. error "
            f"{r['rel_error']:.1e}"
        )
    else:
        print(f"{r['impl']:<12} n = {r['n']:<6} d = {r['d']:<3} {r['status']}")
assert all(r["rel_error"] < 1e-4 for r in live["records"] if r["status"] == "ok")
fig = plot_bench(live, f"this run, {describe(live)}")
finish(fig, "05_bench_this_run")

# %% [markdown]
# ## 3. The committed runs
#
# `benchmarks/results/nscaling_*.json` hold the runs described in
# `benchmarks/README.md` (a 2-core CPU: n up to 2¹⁷, where the blocked kernel needs
# 8–193 MiB, against 2 GiB for the dense ones at n = 2¹⁴; a rerun with taller query
# blocks). Runs on other devices (a GPU, named after the device kind) are plotted the
# same way when present (d = 2 and 16 here; NumPy, dense JAX and
# `dot_product_attention` all hold two n × n arrays, so their memory curves overlap).

# %%
committed = sorted((ROOT / "benchmarks" / "results").glob("nscaling_*.json"))
print("committed runs:", [p.name for p in committed])
for p in committed if not SMOKE_TEST else committed[:1]:
    result = json.loads(p.read_text())
    best = {}
    for r in result["records"]:
        if r["status"] == "ok" and r["impl"] == "jax_blocked":
            seen = (r["n"], r["peak_bytes"] or 0)
            best[r["d"]] = max(best.get(r["d"], (0, 0)), seen)
    print(
        f"{p.name}: {describe(result)}, largest blocked run per d "
        f"(n, MiB): { {d: (n, round(b / MiB)) for d, (n, b) in best.items()} }"
    )
    fig = plot_bench(result, p.stem, ds=(2, 16))
    finish(fig, f"05_{p.stem}")

# %% [markdown]
# ## 4. Several devices
#
# `mf.shard(mu)` places x, the weights and the positions on a 1-D mesh over
# `jax.devices()` (`mf.particle_mesh()`, axis `"particles"`), the particle axis split.
# Every velocity field and `mf.simulate` then run unchanged: under `jit` the compiler
# partitions the queries and all-gathers the keys (O(n d) per device, never n × n),
# and each device runs the blocked kernel over its own queries. On this machine there
# is one CPU device unless `XLA_FLAGS=--xla_force_host_platform_device_count=4` is set
# before JAX starts; several hosts call `jax.distributed.initialize()` first.

# %%
devices = jax.devices()
n = 512 * len(devices)
x = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
attn = mf.SoftmaxAttention(V, A=A, blocking="blocked", block_size=128)
velocity = jax.jit(lambda mu: attn.velocity(mu))
mu = mf.Particles(x)
mu_sharded = mf.shard(mu, mf.particle_mesh())
v_one = velocity(mu)
v_many = velocity(mu_sharded)
err = float(jnp.max(jnp.abs(v_many - v_one)) / jnp.max(jnp.abs(v_one)))
print(f"{len(devices)} device(s): {devices}")
print("input sharding:", mu_sharded.x.sharding)
print("output sharding:", v_many.sharding)
print(f"sharded vs one device: max relative difference {err:.1e}")
assert err < 1e-5

# %% [markdown]
# In full mode the same check runs in a fresh process with four simulated CPU
# devices (the flag must be set before JAX starts), together with a short sharded
# `mf.simulate`.

# %%
SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    import meanfield as mf
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    n, d = 2048, 16
    x = jnp.asarray(rng.standard_normal((n, d)))
    A = jnp.asarray(rng.standard_normal((d, d)) / d)
    attn = mf.SoftmaxAttention(jnp.eye(d), A=A, blocking="blocked", block_size=128)
    mu, mu_sh = mf.Particles(x), mf.shard(mf.Particles(x))
    velocity = jax.jit(lambda m: attn.velocity(m))
    v1, v4 = velocity(mu), velocity(mu_sh)
    s1 = mf.simulate(mu, attn, 1.0, dt0=0.1, solver="euler")
    s4 = mf.simulate(mu_sh, attn, 1.0, dt0=0.1, solver="euler")
    print(len(jax.devices()), "devices;", v4.sharding)
    print("velocity max abs difference", float(jnp.max(jnp.abs(v4 - v1))))
    print("simulate max abs difference", float(jnp.max(jnp.abs(s4.x - s1.x))))
    """
)
if not SMOKE_TEST:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(out.stdout.strip(), out.stderr[-2000:] if out.returncode else "")
    assert out.returncode == 0

# %% [markdown]
# ## On a GPU
#
# Install the CUDA build of JAX in the virtual environment
# (`.venv/bin/pip install "jax[cuda12]>=0.10,<0.12"`) and run the same code; nothing
# in meanfield is device specific. The GPU benchmark of `benchmarks/README.md`:
#
# ```bash
# python benchmarks/nscaling.py --ns 2^10 2^12 2^14 2^16 2^18 2^20 --ds 2 16 64 128 \
#     --impls jax_blocked jax_dense jax_sdpa keops numpy --max-n numpy=16384 \
#     --block-size 4096 --max-gib 60 --max-seconds 120 --solve-max-n 2^16 \
#     --out benchmarks/results
# ```
#
# writes `benchmarks/results/nscaling_<device_kind>.json`, which section 3 then plots
# beside the CPU runs. Re-tune `--block-size` there: the blocked kernel runs its tiles
# one after another, and 512 (the CPU default) means 2²² sequential tiles at n = 2²⁰.
# Float32 matmuls may run as TF32 on recent NVIDIA GPUs; set
# `jax.config.update("jax_default_matmul_precision", "highest")` when that matters.
