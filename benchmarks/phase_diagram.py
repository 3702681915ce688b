"""Clustering phase diagram: meanfield against explicit Euler, and against its floor.

The grid of Geshkovski, Letrouit, Polyanskiy & Rigollet: n = 32 tokens uniform
on S^1 (d = 2), `systems` systems per beta, A = beta I, V = I, the sphere
dynamics, t <= 30, 31 saves. The usual scheme for it is explicit Euler,
dt = 0.1, renormalising the tokens after every step; here that scheme runs
batched in float64 NumPy on a slice of the grid, beside
`mf.clustering.phase_diagram` at its defaults (work queue, float32, rtol = atol
= 1e-6) and as a vmapped solve in float64 (`scheduling="vmap"`,
`dtype="float64"`, `chunk_size=4096`, rtol = atol = 1e-5), and all are compared
with a tight solve (Dopri8, rtol =
atol = 1e-10, float64) of the same tokens: the largest token error at the saves
and the largest error of the merged-pair fraction (the diagram's value).

The floor: every attempted Tsit5 step evaluates the field 6 times (plus one
evaluation at the start), each n^2 exponentials; at the float32 exp rate
measured in the same run (`meanfield.extend.measure_floor`) those
exponentials alone take `floor_s`, and `floor_fraction` = floor_s / wall.

    python benchmarks/phase_diagram.py [--betas 6] [--systems 2048]
        [--check 256] [--full] [--out DIR]

--full also times the whole grid (90 betas in [0.1, 9]) both ways.
--tolerances instead measures the errors of the diagram's solves against the
tight solve at rtol = atol in {1e-5, 1e-6, 1e-7}, float32 and float64, on
samples of `check` systems per beta (--seeds), with their steps and wall times
(phase_tolerance_<device>.json): the table of docs/math/clusters.md.
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
    default_tolerance,
    manifest,
    measure_floor,
    savefig_atomic,
    write_manifest,
)

N, D, T1, SAVES = 32, 2, 30.0, 31
KEY = jr.key(0)


def tokens(count):
    """The initial tokens of `phase_diagram(..., key=KEY)`, (count, n, d)."""
    x = jr.normal(KEY, (count, N, D))
    return np.asarray(x / jnp.linalg.norm(x, axis=-1, keepdims=True))


def euler(x, betas, dt=0.1):
    """Explicit Euler, renormalised: x <- Norm(x + dt softmax(beta x x^T) x).

    Saves every unit of t, (S, T, n, d).
    """
    x = x.copy()
    per_save = round(1.0 / dt)
    out = [x.copy()]
    for step in range(1, round(T1 / dt) + 1):
        logits = betas[:, None, None] * np.einsum("snd,smd->snm", x, x)
        logits -= logits.max(axis=-1, keepdims=True)
        w = np.exp(logits)
        w /= w.sum(axis=-1, keepdims=True)
        x = x + dt * np.einsum("snm,smd->snd", w, x)
        x /= np.linalg.norm(x, axis=-1, keepdims=True)
        if step % per_save == 0:
            out.append(x.copy())
    return np.stack(out, axis=1)  # (S, T, n, d)


def ensemble(x, betas, steps=False, **options):
    """The saves (S, T, n, d) in float64 (and the step counts if `steps`)."""
    dtype = x.dtype
    eye = jnp.eye(D, dtype=dtype)
    attn = jax.vmap(lambda b: mf.SoftmaxAttention(eye, A=b * eye))(
        jnp.asarray(betas, dtype)
    )
    sol = mf.simulate_ensemble(
        jax.vmap(mf.Particles)(jnp.asarray(x)),
        attn,
        T1,
        saveat=np.linspace(0, T1, SAVES),
        normalization="sphere",
        **options,
    )
    x = np.asarray(sol.x, np.float64)
    return (x, np.asarray(sol.num_steps)) if steps else x


#: The baseline: lockstep in float64 at 1e-5, as a vmapped `simulate` would solve it.
BEFORE = dict(rtol=1e-5, atol=1e-5)
LOCKSTEP = dict(scheduling="vmap", dtype="float64", chunk_size=4096, **BEFORE)
#: Field evaluations per attempted Tsit5 step (FSAL: 7 stages, one reused).
STAGES = 6


def timed(betas, systems, exp_rate, **options):
    """Warm wall time of a diagram, its exponentials and the floor's fraction."""
    out = {}
    for attempt in ("first_call_s", "wall_s"):
        start = time.perf_counter()
        diagram = mf.clustering.phase_diagram(
            betas, n=N, d=D, systems=systems, t1=T1, key=KEY, **options
        )
        out[attempt] = time.perf_counter() - start
    evaluations = systems * np.sum(1 + STAGES * diagram.mean_steps)
    out["mean_steps"] = float(diagram.mean_steps.mean())
    out["completed"] = float(diagram.completed.min())  # 1: every system reached t1
    out["exponentials"] = float(evaluations * N * N)
    out["floor_s"] = out["exponentials"] / exp_rate
    out["floor_fraction"] = out["floor_s"] / out["wall_s"]
    return out, diagram


def run(n_betas, systems, check, full):
    betas = np.linspace(0.1, 9.0, n_betas)
    row = dict(n=N, d=D, t1=T1, saves=SAVES, betas=betas.tolist(), systems=systems)
    floor = measure_floor()
    row["exp_per_second"] = floor["exp_per_second"]
    after, diagram = timed(betas, systems, floor["exp_per_second"])
    before, lockstep = timed(betas, systems, floor["exp_per_second"], **LOCKSTEP)
    row["queue_float32"], row["lockstep_float64"] = after, before
    row["meanfield_s"], row["first_call_s"] = after["wall_s"], after["first_call_s"]
    x0 = tokens(n_betas * systems)
    per_system = np.repeat(betas, systems)
    start = time.perf_counter()
    peer = euler(x0, per_system)
    row["euler_s"] = time.perf_counter() - start
    # Errors on `check` systems per beta against a tight solve of the same tokens.
    pick = (np.arange(n_betas)[:, None] * systems + np.arange(check)).ravel()
    ref = ensemble(x0[pick], per_system[pick], rtol=1e-10, atol=1e-10, solver="dopri8")
    # The same solves as the diagram's: its tolerance without noise, in float32;
    # and the previous defaults' (lockstep, float64, 1e-5).
    tol = dict(rtol=default_tolerance(False), atol=default_tolerance(False))
    row.update(tol)
    row["lockstep_rtol"] = BEFORE["rtol"]
    ours = ensemble(x0[pick].astype(np.float32), per_system[pick], **tol)
    align = lambda x: np.asarray(mf.clustering.pair_alignment(x)).reshape(  # noqa: E731
        n_betas, check, SAVES
    )
    ref_density = align(ref).mean(axis=1)
    lock = ensemble(x0[pick], per_system[pick], scheduling="vmap", **BEFORE)
    for name, x in (("meanfield", ours), ("lockstep", lock), ("euler", peer[pick])):
        row[f"{name}_max_token_error"] = float(np.max(np.abs(x - ref)))
        row[f"{name}_max_density_error"] = float(
            np.max(np.abs(align(x).mean(axis=1) - ref_density))
        )
    row["density"] = diagram.density.tolist()
    # The two schedulings' diagrams on the whole slice (every system).
    row["lockstep_vs_queue_max_density_difference"] = float(
        np.max(np.abs(diagram.density - lockstep.density))
    )
    if full:
        grid = np.linspace(0.1, 9.0, 90)
        rate = floor["exp_per_second"]
        row["full_grid"] = dict(
            queue_float32=timed(grid, 2048, rate)[0],
            lockstep_float64=timed(grid, 2048, rate, **LOCKSTEP)[0],
        )
    print({k: v for k, v in row.items() if k != "density"}, flush=True)
    return row, diagram


#: The tolerances of the table in docs/math/clusters.md.
TOLERANCES = (1e-5, 1e-6, 1e-7)


def tolerance_table(n_betas, systems, check, seeds):
    """Errors of the diagram's solves (work queue) against a tight solve.

    For each seed, `check` systems per beta of tokens drawn from jr.key(seed);
    the wall times are warm (the first seed compiles every configuration).
    """
    betas = np.linspace(0.1, 9.0, n_betas)
    align = lambda x: np.asarray(mf.clustering.pair_alignment(x)).reshape(  # noqa: E731
        n_betas, check, SAVES
    )
    rows = []
    for i, seed in enumerate(seeds):
        x = jr.normal(jr.key(seed), (n_betas * check, N, D))
        x0 = np.asarray(x / jnp.linalg.norm(x, axis=-1, keepdims=True))
        b = np.repeat(betas, check)
        ref = ensemble(x0, b, rtol=1e-10, atol=1e-10, solver="dopri8")
        ref_density = align(ref).mean(axis=1)
        for tol in TOLERANCES:
            for dtype in (np.float32, np.float64):
                if i == 0:
                    ensemble(x0.astype(dtype), b, rtol=tol, atol=tol)  # compile
                start = time.perf_counter()
                x, steps = ensemble(x0.astype(dtype), b, rtol=tol, atol=tol, steps=True)
                wall = time.perf_counter() - start
                err = np.abs(align(x).mean(axis=1) - ref_density)
                row = dict(
                    seed=seed,
                    tolerance=tol,
                    dtype=np.dtype(dtype).name,
                    max_density_error=float(err.max()),
                    entries_above_1e4=int(np.sum(err > 1e-4)),
                    max_token_error=float(np.max(np.abs(x - ref))),
                    mean_steps=float(steps.mean()),
                    wall_s=wall,
                )
                print(row, flush=True)
                rows.append(row)
    return dict(betas=betas.tolist(), systems=systems, check=check, rows=rows)


def plot(row, diagram, path):
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    mf.plotting.plot_phase_diagram(diagram, ax=left)
    names = ["meanfield", "lockstep", "euler"]
    row = {**row, "lockstep_s": row["lockstep_float64"]["wall_s"]}
    right.bar(
        ["queue, float32", "lockstep, float64", "explicit Euler"],
        [row[f"{name}_s"] for name in names],
        color=["C0", "C2", "C1"],
    )
    right.axhline(row["queue_float32"]["floor_s"], color="k", ls=":", label="exp floor")
    right.legend(loc="upper left", fontsize="small")
    for i, name in enumerate(names):
        right.annotate(
            f"token error {row[f'{name}_max_token_error']:.1e}\n"
            f"density error {row[f'{name}_max_density_error']:.1e}",
            (i, row[f"{name}_s"]),
            ha="center",
            va="bottom",
            fontsize="small",
        )
    right.set_ylabel("seconds (warm)")
    right.set_title(
        f"{len(row['betas'])} β × {row['systems']} systems, {platform.machine()} CPU"
    )
    savefig_atomic(fig, path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--betas", type=int, default=6, help="betas in the slice")
    parser.add_argument("--systems", type=int, default=2048, help="systems per beta")
    parser.add_argument(
        "--check", type=int, default=256, help="systems per beta checked for errors"
    )
    parser.add_argument("--full", action="store_true", help="also time the full grid")
    parser.add_argument(
        "--tolerances",
        action="store_true",
        help="only the errors against the tight solve at three tolerances",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0, 11, 12, 13, 14, 15, 16],
        help="samples of --tolerances (keys of the tokens)",
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
    if args.tolerances:
        check = min(args.check, args.systems)
        table = tolerance_table(args.betas, args.systems, check, args.seeds)
        write_manifest(
            out / f"phase_tolerance_{device}.json",
            dict(manifest=manifest(vars(args), 0, None), **table),
        )
        return
    row, diagram = run(
        args.betas, args.systems, min(args.check, args.systems), args.full
    )
    write_manifest(
        out / f"phase_diagram_{device}.json",
        dict(manifest=manifest(vars(args), 0, None), rows=[row]),
    )
    plot(row, diagram, out / f"phase_diagram_{device}.png")


if __name__ == "__main__":
    main()
