"""Clustering phase diagram: meanfield against the peers' explicit Euler scheme.

The grid of Geshkovski, Letrouit, Polyanskiy & Rigollet: n = 32 tokens uniform
on S^1 (d = 2), `systems` systems per beta, A = beta I, V = I, the sphere
dynamics, t <= 30, 31 saves. The peers solve it with explicit Euler, dt = 0.1,
renormalising the tokens after every step; here that scheme runs batched in
float64 NumPy on a slice of the grid, beside `mf.clustering.phase_diagram` at its
defaults, and both are compared with a tight meanfield solve (rtol = atol =
1e-10) of the same tokens: the largest token error at the saves and the largest
error of the merged-pair fraction (the diagram's value).

    python benchmarks/phase_diagram.py [--betas 6] [--systems 2048]
        [--check 256] [--full] [--out DIR]

--full also times the whole grid (90 betas in [0.1, 9]).
"""

import argparse
import inspect
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

N, D, T1, SAVES = 32, 2, 30.0, 31
KEY = jr.key(0)


def tokens(count):
    """The initial tokens of `phase_diagram(..., key=KEY)`, (count, n, d)."""
    x = jr.normal(KEY, (count, N, D))
    return np.asarray(x / jnp.linalg.norm(x, axis=-1, keepdims=True))


def euler(x, betas, dt=0.1):
    """Peer scheme: x <- Norm(x + dt softmax(beta x x^T) x), saves every unit of t."""
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


def ensemble(x, betas, **options):
    attn = jax.vmap(lambda b: mf.SoftmaxAttention(jnp.eye(D), A=b * jnp.eye(D)))(
        jnp.asarray(betas)
    )
    sol = mf.simulate_ensemble(
        jax.vmap(mf.Particles)(jnp.asarray(x)),
        attn,
        T1,
        saveat=np.linspace(0, T1, SAVES),
        normalization="sphere",
        **options,
    )
    return np.asarray(sol.x)


def run(n_betas, systems, check, full):
    betas = np.linspace(0.1, 9.0, n_betas)
    row = dict(n=N, d=D, t1=T1, saves=SAVES, betas=betas.tolist(), systems=systems)
    for attempt in ("first_call_s", "meanfield_s"):
        start = time.perf_counter()
        diagram = mf.clustering.phase_diagram(
            betas, n=N, d=D, systems=systems, t1=T1, key=KEY
        )
        row[attempt] = time.perf_counter() - start
    x0 = tokens(n_betas * systems)
    per_system = np.repeat(betas, systems)
    start = time.perf_counter()
    peer = euler(x0, per_system)
    row["euler_s"] = time.perf_counter() - start
    # Errors on `check` systems per beta against a tight solve of the same tokens.
    pick = (np.arange(n_betas)[:, None] * systems + np.arange(check)).ravel()
    ref = ensemble(x0[pick], per_system[pick], rtol=1e-10, atol=1e-10)
    # The same solves as the diagram's: its default tolerances.
    defaults = inspect.signature(mf.clustering.phase_diagram).parameters
    tol = {k: defaults[k].default for k in ("rtol", "atol")}
    row.update(tol)
    ours = ensemble(x0[pick], per_system[pick], **tol)
    align = lambda x: np.asarray(mf.clustering.pair_alignment(x)).reshape(  # noqa: E731
        n_betas, check, SAVES
    )
    ref_density = align(ref).mean(axis=1)
    for name, x in (("meanfield", ours), ("euler", peer[pick])):
        row[f"{name}_max_token_error"] = float(np.max(np.abs(x - ref)))
        row[f"{name}_max_density_error"] = float(
            np.max(np.abs(align(x).mean(axis=1) - ref_density))
        )
    row["density"] = diagram.density.tolist()
    if full:
        grid = np.linspace(0.1, 9.0, 90)
        start = time.perf_counter()
        mf.clustering.phase_diagram(grid, n=N, d=D, systems=2048, t1=T1, key=KEY)
        row["full_grid_s"] = time.perf_counter() - start
    print({k: v for k, v in row.items() if k != "density"}, flush=True)
    return row, diagram


def plot(row, diagram, path):
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    mf.plotting.plot_phase_diagram(diagram, ax=left)
    names = ["meanfield", "euler"]
    right.bar(names, [row["meanfield_s"], row["euler_s"]], color=["C0", "C1"])
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
    _io.savefig_atomic(fig, path, dpi=120)
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
        "--out",
        default="out/benchmarks",
        help="output folder (default out/benchmarks; the committed results are "
        "benchmarks/results)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    row, diagram = run(
        args.betas, args.systems, min(args.check, args.systems), args.full
    )
    device = jax.devices()[0].platform
    write_manifest(
        out / f"phase_diagram_{device}.json",
        dict(manifest=manifest(vars(args), 0, None), rows=[row]),
    )
    plot(row, diagram, out / f"phase_diagram_{device}.png")


if __name__ == "__main__":
    main()
