"""Throughput of the batched Gaussian blow-up study (mf.gaussian.blowup_times).

For each d: `batch` random parameter sets (A ~ N(0, 1/d), V = I + N(0, 0.1/d)) per
variant (softmax, L2 with Q = A, K = I, Sinkhorn), float64, t_max = 5, the study's
defaults. Records wall time (first call includes compilation), runs per second, the
fraction of runs in each class (blowup, stationary, success = reached t_max,
max_steps = unclassified, failed) and a correctness check: for V = I the softmax
blow-up time is exactly 1 / lambda_max(A + A^T) (P = Sigma^{-1} = I - t (A + A^T)).
`--sizes` sweeps several batch sizes at each d (small studies: 1000 4000 10000);
`--slots` fixes the queue width instead of the study's sizing (which picks 256
from 50 000 runs per chunk up); `--repeat` times several warm calls (median).

    python benchmarks/gaussian_blowup.py [--batch 10000] [--dims 2 4 8]
        [--batches 100000 1000 1000 | --sizes 1000 4000 10000] [--slots S]
        [--repeat R] [--out DIR]
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
from meanfield.extend import (  # noqa: E402
    manifest,
    queue_slots,
    savefig_atomic,
    write_manifest,
)

CHUNK = 65_536  # the study's default chunk_size

VARIANTS = {
    "softmax": lambda A, V: mf.SoftmaxAttention(V, A=A),
    "l2": lambda A, V: mf.L2Attention(V, Q=A, K=jnp.eye(A.shape[0])),
    "sinkhorn": lambda A, V: mf.SinkhornAttention(V, A=A),
}


def run(
    batches, dims, t_max: float = 5.0, on_row=None, *, slots=None, repeat=1
) -> list[dict]:
    """Rows of the benchmark; `batches` holds one size or a list of sizes per d."""
    rows = []
    cases = [
        (d, batch)
        for d, sizes in zip(dims, batches, strict=True)
        for batch in (sizes if isinstance(sizes, list | tuple) else [sizes])
    ]
    options = {} if slots is None else dict(slots=slots)
    for d, batch in cases:
        ka, kv = jr.split(jr.fold_in(jr.key(0), d))
        As = jr.normal(ka, (batch, d, d)) / np.sqrt(d)
        Vs = jnp.eye(d)[None] + jr.normal(kv, (batch, d, d)) * np.sqrt(0.1 / d)
        gauss = mf.Gaussian(np.zeros(d), np.eye(d))
        for name, make in VARIANTS.items():
            attns = {name: jax.vmap(make)(As, Vs)}
            start = time.perf_counter()
            study = mf.gaussian.blowup_times(gauss, attns, t_max, **options)
            first = time.perf_counter() - start
            walls = []
            for _ in range(repeat):  # warm calls: compiled above
                start = time.perf_counter()
                study = mf.gaussian.blowup_times(gauss, attns, t_max, **options)
                walls.append(time.perf_counter() - start)
            second = float(np.median(walls))
            width = -(-batch // -(-batch // CHUNK))  # runs per chunk (equal chunks)
            row = dict(
                d=d,
                variant=name,
                batch=batch,
                slots=slots or queue_slots(width),
                t_max=t_max,
                first_call_s=first,
                wall_s=second,
                wall_s_all=walls,
                runs_per_s=batch / second,
                classes=study.classes(name),
                mean_steps=float(np.mean(study.steps[name])),
            )
            if name == "softmax":
                # Check on V = I copies: t* = 1 / lambda_max(A + A^T) exactly.
                k = min(256, batch)
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
    sweep = len({r["batch"] for r in rows}) > 1 and len({r["d"] for r in rows}) == 1
    for name in VARIANTS:
        sel = [r for r in rows if r["variant"] == name]
        x = [r["batch" if sweep else "d"] for r in sel]
        ax.plot(x, [r["runs_per_s"] for r in sel], "o-", label=name)
    if sweep:  # one d, several batch sizes: throughput against the study's size
        ax.set_xscale("log")
        ax.set_xlabel(f"runs per variant (d = {rows[0]['d']})")
    else:
        ax.set_xlabel("dimension d")
    ax.set_ylabel("moment-ODE solves per second")
    ax.set_yscale("log")
    ax.set_title(f"mf.gaussian.blowup_times, {platform.machine()} CPU")
    ax.legend()
    savefig_atomic(fig, path, dpi=120, bbox_inches="tight")
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
        "--sizes",
        type=int,
        nargs="+",
        default=None,
        help="runs per variant, swept at every d (overrides --batch and --batches)",
    )
    parser.add_argument(
        "--slots",
        type=int,
        default=None,
        help="runs stepped together (default: the study's sizing, sqrt of the chunk)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="warm calls timed per row; wall_s is their median (default 1)",
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
    if args.sizes:
        batches = [list(args.sizes)] * len(args.dims)
    if len(batches) != len(args.dims):
        parser.error("--batches needs one count per --dims entry")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    run(batches, args.dims, on_row=save, slots=args.slots, repeat=args.repeat)


if __name__ == "__main__":
    main()
