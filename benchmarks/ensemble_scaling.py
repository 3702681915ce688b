"""Ensembles of small systems: systems x steps per second against n and d.

`mf.simulate_ensemble` schedules its systems through a work queue (each slot one
system's adaptive solve, a finished system handing its slot to the next) or in
lockstep (a vmapped `simulate`). For each (n, d) this times both on the same
systems (softmax, A = beta I with beta uniform in [0.5, 5], V = I, tokens
uniform on the sphere, t1 = 10, rtol = atol = 1e-5, float32, warm), and reports
the throughput in attempted solver steps of all systems per second, the
exponentials the solves need (6 field evaluations per Tsit5 step, n^2 each)
against the float32 exp rate measured in the same run, and the largest
difference between the two schedulings' final tokens. The noisy cases add
`mf.IndependentNoise(0.2)` on the sphere (Heun, the default SDE tolerance,
2 field evaluations per step): their two schedulings draw the same Brownian
paths, so their final tokens differ by the scheme's pathwise error, not by
rounding.

    python benchmarks/ensemble_scaling.py [--ns 8 32 128 256] [--ds 2 16]
        [--noise-ns 8 32 128] [--pairs 2^24] [--out DIR]
"""

import argparse
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.random as jr
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield.extend import (  # noqa: E402
    manifest,
    measure_floor,
    savefig_atomic,
    write_manifest,
)

T1 = 10.0
STAGES = 6  # field evaluations per attempted Tsit5 step (FSAL)
SDE_STAGES = 2  # per attempted Heun step
NOISE = mf.IndependentNoise(0.2)


def systems_of(n: int, d: int, count: int, masked: bool):
    """`count` systems of n unit tokens in d dimensions, and their attentions."""
    key_x, key_b = jr.split(jr.key(n * 1000 + d))
    x = jr.normal(key_x, (count, n, d), jnp.float32)
    x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    betas = jr.uniform(key_b, (count,), jnp.float32, 0.5, 5.0)
    eye = jnp.eye(d, dtype=jnp.float32)
    attn = jax.vmap(lambda b: mf.SoftmaxAttention(eye, A=b * eye))(betas)
    if masked:
        s = jnp.broadcast_to(jnp.arange(n, dtype=jnp.float32) / n, (count, n))
        return jax.vmap(mf.MaskedParticles)(x, s), attn
    return jax.vmap(mf.Particles)(x), attn


def time_one(measures, attn, scheduling, normalization, noisy):
    """(warm wall seconds, the solution) of one ensemble solve."""
    tolerances = {} if noisy else dict(rtol=1e-5, atol=1e-5)
    noise = dict(noise=NOISE, key=jr.key(7)) if noisy else {}

    def call():
        sol = mf.simulate_ensemble(
            measures,
            attn,
            T1,
            normalization=normalization,
            scheduling=scheduling,
            chunk_size=16384,
            **tolerances,
            **noise,
        )
        return jax.block_until_ready(sol)

    call()
    start = time.perf_counter()
    sol = call()
    return time.perf_counter() - start, sol


def run(ns, ds, noise_ns, pairs, exp_rate):
    rows = []
    cases = [(n, d, False, "sphere", False) for d in ds for n in ns]
    if ns:
        cases += [(32, 2, True, "sphere", False), (32, 2, False, "pre-ln", False)]
    cases += [(n, 2, False, "sphere", True) for n in noise_ns]
    for n, d, masked, normalization, noisy in cases:
        # A noisy step costs about 8 noise-free ones (its Brownian path).
        count = int(min(16384, max(256, pairs // (n * n * (512 if noisy else 64)))))
        measures, attn = systems_of(n, d, count, masked)
        row = dict(
            n=n,
            d=d,
            masked=masked,
            normalization=normalization,
            noise=noisy,
            systems=count,
        )
        finals = {}
        for scheduling in ("queue", "vmap"):
            wall, sol = time_one(measures, attn, scheduling, normalization, noisy)
            steps = float(np.sum(sol.num_steps))
            exps = (count + (SDE_STAGES if noisy else STAGES) * steps) * n * n
            row[scheduling] = dict(
                wall_s=wall,
                system_steps_per_s=steps / wall,
                mean_steps=steps / count,
                floor_fraction=exps / exp_rate / wall,
            )
            finals[scheduling] = np.asarray(sol.x[:, -1], np.float64)
        row["max_final_difference"] = float(
            np.max(np.abs(finals["queue"] - finals["vmap"]))
        )
        row["speedup"] = row["vmap"]["wall_s"] / row["queue"]["wall_s"]
        print(row, flush=True)
        rows.append(row)
    return rows


def plot(rows, path):
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    plain = [r for r in rows if not r["masked"] and r["normalization"] == "sphere"]
    groups = sorted({(r["d"], r.get("noise", False)) for r in plain})
    for i, (d, noisy) in enumerate(groups):
        sel = [r for r in plain if r["d"] == d and r.get("noise", False) == noisy]
        sel = sorted(sel, key=lambda r: r["n"])
        ns = [r["n"] for r in sel]
        for scheduling, style, name in (
            ("queue", "-o", "work queue"),
            ("vmap", "--s", "lockstep"),
        ):
            ax.plot(
                ns,
                [r[scheduling]["system_steps_per_s"] for r in sel],
                style,
                color=f"C{i}",
                label=f"d = {d}{', noise' if noisy else ''}, {name}",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per system n")
    ax.set_ylabel("system·steps per second")
    ax.set_title(f"simulate_ensemble, softmax on the sphere, {platform.machine()} CPU")
    ax.legend(fontsize="small")
    savefig_atomic(fig, path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", type=int, nargs="*", default=[8, 32, 128, 256])
    parser.add_argument("--ds", type=int, nargs="+", default=[2, 16])
    parser.add_argument(
        "--noise-ns",
        type=int,
        nargs="*",
        default=[8, 32, 128],
        help="n of the noisy cases (d = 2, sphere)",
    )
    parser.add_argument(
        "--pairs",
        type=float,
        default=2**28,
        help="about systems x n^2 x 64 per case (sets the number of systems)",
    )
    parser.add_argument(
        "--out",
        default="out/benchmarks",
        help="output folder (default out/benchmarks; the committed results are "
        "benchmarks/results)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    floor = measure_floor()
    rows = run(
        args.ns, args.ds, args.noise_ns, int(args.pairs), floor["exp_per_second"]
    )
    device = jax.devices()[0].platform
    write_manifest(
        out / f"ensemble_scaling_{device}.json",
        dict(manifest=manifest(vars(args), 0, None), floor=floor, rows=rows),
    )
    plot(rows, out / f"ensemble_scaling_{device}.png")


if __name__ == "__main__":
    main()
