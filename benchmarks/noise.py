"""What noise costs: particles, ensembles and the density, with and without it.

Three measurements on this machine, each the same problem with sigma = 0 and
sigma > 0, written as JSON and one figure:

- particles: `mf.simulate`, n = 1024 tokens on S^2, softmax with beta = 4, t <= 5:
  the ODE (Tsit5, rtol = atol = 1e-6) against `mf.IndependentNoise(0.3)` with
  the default SDE solver (Heun, adaptive, rtol = atol = 1e-3) and with a fixed
  step dt = 0.01;
- ensembles: `mf.simulate_ensemble`, B = 256 systems of n = 32 tokens on S^1,
  beta = 4, t <= 10, Heun with dt = 0.05, reduced to `mf.clustering.statistics`
  at 11 save times: systems per second, noise-free against sigma = 0.5 (one key
  per system);
- density: `mf.density.simulate` on N = 10^4 cells, beta = 30, from the uniform
  density with band-limited noise to t = 20, sigma = 0 against sigma = 0.1.

Every time is the second of two identical calls (the first compiles).

    python benchmarks/noise.py [--out DIR]
"""

import argparse
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield import density  # noqa: E402
from meanfield.extend import manifest, savefig_atomic, write_manifest  # noqa: E402


def _warm(call):
    """(result, seconds) of the second of two calls: the first compiles."""
    jax.block_until_ready(call())
    start = time.perf_counter()
    result = jax.block_until_ready(call())
    return result, time.perf_counter() - start


def _sphere(n, d, seed):
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def particles():
    """n = 1024 tokens on S^2: the ODE against the SDE (adaptive and fixed step)."""
    n, d, beta, t1, sigma = 1024, 3, 4.0, 5.0, 0.3
    mu = mf.Particles(_sphere(n, d, 0))
    attn = mf.SoftmaxAttention(np.eye(d), A=beta * np.eye(d))
    key = jax.random.key(0)
    runs = {
        "ode": lambda: mf.simulate(mu, attn, t1, normalization="sphere"),
        "sde_adaptive": lambda: mf.simulate(
            mu,
            attn,
            t1,
            normalization="sphere",
            noise=mf.IndependentNoise(sigma),
            key=key,
        ),
        "sde_fixed": lambda: mf.simulate(
            mu,
            attn,
            t1,
            normalization="sphere",
            noise=mf.IndependentNoise(sigma),
            key=key,
            dt0=0.01,
        ),
    }
    row = dict(n=n, d=d, beta=beta, t1=t1, sigma=sigma)
    for name, call in runs.items():
        sol, seconds = _warm(call)
        steps = int(sol.num_steps)
        row[name] = dict(
            seconds=seconds,
            steps=steps,
            seconds_per_step=seconds / steps,
            status=str(sol.status),
            order_parameter=float(mf.clustering.order_parameter(sol.x[-1])),
        )
        print(name, row[name], flush=True)
    return row


def ensembles():
    """B = 256 systems of 32 tokens on S^1, reduced to statistics: systems/s."""
    B, n, beta, t1, sigma, dt = 256, 32, 4.0, 10.0, 0.5, 0.05
    xs = jnp.asarray(np.stack([_sphere(n, 2, b) for b in range(B)]))
    measures = jax.vmap(mf.Particles)(xs)
    attn = mf.SoftmaxAttention(np.eye(2), A=beta * np.eye(2))
    options = dict(
        saveat=np.linspace(0.0, t1, 11),
        normalization="sphere",
        solver="heun",
        dt0=dt,
        reduce=mf.clustering.statistics,
    )
    row = dict(B=B, n=n, beta=beta, t1=t1, sigma=sigma, dt=dt)
    for name, extra in (
        ("noise_free", {}),
        ("noisy", dict(noise=mf.IndependentNoise(sigma), key=jax.random.key(1))),
    ):
        stats, seconds = _warm(
            lambda extra=extra: mf.simulate_ensemble(
                measures, attn, t1, **options, **extra
            )
        )
        final = np.asarray(stats.order_parameter[:, -1])
        row[name] = dict(
            seconds=seconds,
            systems_per_second=B / seconds,
            system_steps_per_second=B * t1 / dt / seconds,
            order_parameter_mean=float(final.mean()),
            order_parameter_stderr=float(final.std(ddof=1) / np.sqrt(B)),
            groups_mean=float(np.asarray(stats.groups[:, -1]).mean()),
            completed=int(np.sum(np.asarray(stats.result) == 0)),
        )
        print(name, row[name], flush=True)
    return row


def density_cells():
    """N = 10^4 cells, beta = 30, to t = 20: sigma = 0 against sigma = 0.1."""
    N, beta, t1 = 10_000, 30.0, 20.0
    rng = np.random.default_rng(0)
    theta = density.cell_centres(N)
    k = np.arange(1, 65)
    a, phase = 1e-3 * rng.standard_normal(64), rng.uniform(0, 2 * np.pi, 64)
    rho0 = 1 + (a * np.cos(np.outer(theta, k) + phase)).sum(1)
    rho0 /= rho0.sum() * 2 * np.pi / N
    row = dict(N=N, beta=beta, t1=t1)
    for sigma in (0.0, 0.1):
        sol, seconds = _warm(
            lambda sigma=sigma: density.simulate(
                rho0, t1, beta=beta, sigma=sigma, saveat=[0.0, t1]
            )
        )
        row[f"sigma={sigma:g}"] = dict(
            sigma=sigma,
            seconds=seconds,
            steps=int(sol.num_steps),
            status=str(sol.status),
            clusters=int(density.count_clusters(sol.rho[-1])),
            fastest_mode=int(density.fastest_mode(beta, sigma=sigma)),
            mass_error=float(np.max(np.abs(sol.mass - 1))),
            lowest=float(sol.lowest),
        )
        print(sigma, row[f"sigma={sigma:g}"], flush=True)
    return row


def plot(rows, path):
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), layout="constrained")
    part = rows["particles"]
    names = ["ode", "sde_adaptive", "sde_fixed"]
    labels = ["ODE\nTsit5 1e-6", "SDE Heun\nadaptive 1e-3", "SDE Heun\ndt = 0.01"]
    ax = axes[0]
    bars = ax.bar(labels, [part[k]["seconds"] for k in names], color=["C0", "C1", "C2"])
    for bar, k in zip(bars, names, strict=True):
        ax.annotate(
            f"{part[k]['steps']} steps",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize="small",
        )
    ax.set_ylabel("seconds (warm)")
    ax.set_title(f"n = {part['n']} on S², t ≤ {part['t1']:g}, σ = {part['sigma']:g}")
    ens = rows["ensembles"]
    ax = axes[1]
    ax.bar(
        ["σ = 0", f"σ = {ens['sigma']:g}"],
        [ens["noise_free"]["systems_per_second"], ens["noisy"]["systems_per_second"]],
        color=["C0", "C1"],
    )
    ax.set_ylabel("systems / s")
    ax.set_title(
        f"{ens['B']} systems of {ens['n']} tokens on S¹, Heun dt = {ens['dt']:g}"
    )
    den = rows["density"]
    ax = axes[2]
    keys = [k for k in den if k.startswith("sigma=")]
    ax.bar(keys, [den[k]["seconds"] for k in keys], color=["C0", "C1"])
    for i, k in enumerate(keys):
        ax.annotate(
            f"{den[k]['steps']} steps, {den[k]['clusters']} clusters",
            (i, den[k]["seconds"]),
            ha="center",
            va="bottom",
            fontsize="small",
        )
    ax.set_ylabel("seconds (warm)")
    ax.set_title(f"density, N = {den['N']}, β = {den['beta']:g}, t ≤ {den['t1']:g}")
    savefig_atomic(fig, path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        default="out/benchmarks",
        help="output folder (default out/benchmarks; the committed results are "
        "benchmarks/results)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = dict(particles=particles(), ensembles=ensembles(), density=density_cells())
    device = jax.devices()[0].platform
    write_manifest(
        out / f"noise_{device}.json",
        dict(manifest=manifest(vars(args), 0, None), rows=rows),
    )
    plot(rows, out / f"noise_{device}.png")


if __name__ == "__main__":
    main()
