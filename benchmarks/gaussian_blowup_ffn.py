"""Throughput of mf.gaussian.blowup_times with and without a feed-forward layer.

The same batch as benchmarks/gaussian_blowup.py (A ~ N(0, 1/d), V = I + N(0, 0.1/d),
float64, t_max = 5, the study's defaults), once as attention alone and once with a
shared affine feed-forward layer F(x) = W x + b, W = w I + N(0, 0.1/d) (`ffn=`), in
the same process. Records the wall time of a second call (the first compiles), runs
per second, the classes, mean steps and a correctness check: with V = I and
W = w I the softmax blow-up time is log(1 + 2 w tau) / (2 w), tau =
1 / lambda_max(A + A^T).

    python benchmarks/gaussian_blowup_ffn.py [--batch 1000] [--dims 2 4]
        [--variants softmax l2 sinkhorn] [--out DIR]
"""

import argparse
import platform
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import jax.random as jr  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

# The same attentions as the study without a layer (run from benchmarks/).
from gaussian_blowup import VARIANTS  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield.extend import manifest, savefig_atomic, write_manifest  # noqa: E402

W_RATE = 0.3  # w of W = w I + noise


def _timed(gauss, attns, t_max, ffn):
    mf.gaussian.blowup_times(gauss, attns, t_max, ffn=ffn)  # compiles
    start = time.perf_counter()
    study = mf.gaussian.blowup_times(gauss, attns, t_max, ffn=ffn)
    return study, time.perf_counter() - start


def _check(gauss, name, As, t_max) -> float:
    """Max relative error of the V = I, W = w I blow-up times on 256 runs."""
    k, d = min(256, As.shape[0]), As.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(d), (k, d, d))
    attns = {name: jax.vmap(VARIANTS[name])(As[:k], eye)}
    ffn = mf.FeedForward(W_RATE * jnp.eye(d))
    got = mf.gaussian.blowup_times(gauss, attns, t_max, ffn=ffn).times[name]
    lam = np.linalg.eigvalsh(np.asarray(As[:k] + jnp.swapaxes(As[:k], 1, 2)))[:, -1]
    tau = np.where(lam > 0, 1 / np.maximum(lam, 1e-300), np.inf)
    want = np.log1p(2 * W_RATE * tau) / (2 * W_RATE)
    want = np.where(want <= t_max, want, np.inf)
    fin = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), fin):
        return float("inf")
    return float(np.max(np.abs(got[fin] / want[fin] - 1)))


def run(batch, dims, variants, t_max: float = 5.0, on_row=None) -> list[dict]:
    rows = []
    for d in dims:
        ka, kv, kw = jr.split(jr.fold_in(jr.key(0), d), 3)
        As = jr.normal(ka, (batch, d, d)) / np.sqrt(d)
        Vs = jnp.eye(d)[None] + jr.normal(kv, (batch, d, d)) * np.sqrt(0.1 / d)
        W = W_RATE * jnp.eye(d) + jr.normal(kw, (d, d)) * np.sqrt(0.1 / d)
        ffn = mf.FeedForward(W, jnp.ones(d))
        gauss = mf.Gaussian(np.zeros(d), np.eye(d))
        for name in variants:
            attns = {name: jax.vmap(VARIANTS[name])(As, Vs)}
            row = dict(d=d, variant=name, batch=batch, t_max=t_max)
            for label, f in (("attention", None), ("ffn", ffn)):
                study, wall = _timed(gauss, attns, t_max, f)
                row[label] = dict(
                    wall_s=wall,
                    runs_per_s=batch / wall,
                    classes=study.classes(name),
                    mean_steps=float(np.mean(study.steps[name])),
                )
            row["slowdown"] = row["attention"]["runs_per_s"] / row["ffn"]["runs_per_s"]
            if name == "softmax":
                row["check_max_rel_err_V_eq_I_W_eq_wI"] = _check(gauss, name, As, t_max)
            print(row, flush=True)
            rows.append(row)
            if on_row is not None:
                on_row(rows)
    return rows


def plot(rows, path):
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, name in enumerate(dict.fromkeys(r["variant"] for r in rows)):
        sel = [r for r in rows if r["variant"] == name]
        ds = [r["d"] for r in sel]
        for label, style in (("attention", "o-"), ("ffn", "s--")):
            ax.plot(
                ds,
                [r[label]["runs_per_s"] for r in sel],
                style,
                color=f"C{i}",
                label=f"{name}" + (" + ffn" if label == "ffn" else ""),
            )
    ax.set_xlabel("dimension d")
    ax.set_ylabel("moment-ODE solves per second")
    ax.set_yscale("log")
    ax.set_title(f"blowup_times with/without ffn, {platform.machine()} CPU")
    ax.legend(fontsize="small")
    savefig_atomic(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batch", type=int, default=1000, help="runs per variant (default 1000)"
    )
    parser.add_argument(
        "--dims", type=int, nargs="+", default=[2, 4], help="d (default 2 4)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS),
        choices=list(VARIANTS),
        help="attention variants (default all)",
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
    device = jax.devices()[0].platform

    def save(rows):
        result = dict(manifest=manifest(vars(args), 0, None), rows=rows)
        write_manifest(out / f"gaussian_blowup_ffn_{device}.json", result)
        plot(rows, out / f"gaussian_blowup_ffn_{device}.png")

    run(args.batch, args.dims, args.variants, on_row=save)


if __name__ == "__main__":
    main()
