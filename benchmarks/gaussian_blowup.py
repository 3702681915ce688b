"""Throughput of the batched Gaussian blow-up study (mf.gaussian.blowup_times).

For each d: `batch` random parameter sets (A ~ N(0, 1/d), V = I + N(0, 0.1/d)) per
variant (softmax, L2 with Q = A, K = I, Sinkhorn), float64, t_max = 5, the study's
defaults. Records wall time (first call includes compilation), runs per second, the
fraction of runs in each class (blowup, stationary, success = reached t_max,
max_steps = unclassified, failed) and a correctness check: for V = I the softmax
blow-up time is exactly 1 / lambda_max(A + A^T) (P = Sigma^{-1} = I - t (A + A^T)).

    python benchmarks/gaussian_blowup.py [--batch 10000] [--dims 2 4 8]
        [--batches 100000 1000 1000] [--out DIR]
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

import meanfield as mf  # noqa: E402
from meanfield import _io  # noqa: E402
from meanfield._app.manifest import manifest, write_manifest  # noqa: E402

VARIANTS = {
    "softmax": lambda A, V: mf.SoftmaxAttention(V, A=A),
    "l2": lambda A, V: mf.L2Attention(V, Q=A, K=jnp.eye(A.shape[0])),
    "sinkhorn": lambda A, V: mf.SinkhornAttention(V, A=A),
}


def run(batches, dims, t_max: float = 5.0, on_row=None) -> list[dict]:
    rows = []
    for d, batch in zip(dims, batches, strict=True):
        ka, kv = jr.split(jr.fold_in(jr.key(0), d))
        As = jr.normal(ka, (batch, d, d)) / np.sqrt(d)
        Vs = jnp.eye(d)[None] + jr.normal(kv, (batch, d, d)) * np.sqrt(0.1 / d)
        gauss = mf.Gaussian(np.zeros(d), np.eye(d))
        for name, make in VARIANTS.items():
            attns = {name: jax.vmap(make)(As, Vs)}
            start = time.perf_counter()
            study = mf.gaussian.blowup_times(gauss, attns, t_max)
            first = time.perf_counter() - start
            start = time.perf_counter()
            study = mf.gaussian.blowup_times(gauss, attns, t_max)
            second = time.perf_counter() - start
            row = dict(
                d=d,
                variant=name,
                batch=batch,
                t_max=t_max,
                first_call_s=first,
                wall_s=second,
                runs_per_s=batch / second,
                classes=study.classes(name),
                mean_steps=float(np.mean(study.steps[name])),
            )
            if name == "softmax":
                # Check on V = I copies: t* = 1 / lambda_max(A + A^T) exactly.
                k = 256
                eye = jnp.broadcast_to(jnp.eye(d), (k, d, d))
                check = mf.gaussian.blowup_times(
                    gauss, {name: jax.vmap(make)(As[:k], eye)}, t_max
                )
                lam = np.linalg.eigvalsh(
                    np.asarray(As[:k] + jnp.swapaxes(As[:k], 1, 2))
                )[:, -1]
                want = np.where(lam > 1 / t_max, 1 / np.maximum(lam, 1e-300), np.inf)
                got = np.asarray(check.times[name])
                fin = np.isfinite(want)
                row["check_max_rel_err_V_eq_I"] = float(
                    np.max(np.abs(got[fin] - want[fin]) / want[fin])
                )
                row["check_same_finiteness"] = bool(np.all(np.isfinite(got) == fin))
            print(row, flush=True)
            rows.append(row)
            if on_row is not None:
                on_row(rows)
    return rows


def plot(rows, path):
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name in VARIANTS:
        sel = [r for r in rows if r["variant"] == name]
        ax.plot([r["d"] for r in sel], [r["runs_per_s"] for r in sel], "o-", label=name)
    ax.set_xlabel("dimension d")
    ax.set_ylabel("moment-ODE solves per second")
    ax.set_yscale("log")
    ax.set_title(f"mf.gaussian.blowup_times, {platform.machine()} CPU")
    ax.legend()
    _io.savefig_atomic(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batch", type=int, default=10_000, help="runs per variant (default 10000)"
    )
    parser.add_argument(
        "--dims", type=int, nargs="+", default=[2, 4, 8], help="d (default 2 4 8)"
    )
    parser.add_argument(
        "--batches",
        type=int,
        nargs="+",
        default=None,
        help="runs per variant for each d (overrides --batch)",
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
        # Written after every row (atomically): a long run keeps what it measured.
        result = dict(manifest=manifest(vars(args), 0, None), rows=rows)
        write_manifest(out / f"gaussian_blowup_{device}.json", result)
        plot(rows, out / f"gaussian_blowup_{device}.png")

    batches = args.batches or [args.batch] * len(args.dims)
    if len(batches) != len(args.dims):
        parser.error("--batches needs one count per --dims entry")
    run(batches, args.dims, on_row=save)


if __name__ == "__main__":
    main()
