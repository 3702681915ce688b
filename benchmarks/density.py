"""The density on the circle and the energy staircase: speed and accuracy.

Four measurements on this machine, written as JSON and one figure:

- cells: `mf.density.simulate` on N = 10^4 cells, beta = 30, from the uniform
  density with band-limited noise (modes 1-64, amplitude 1e-3) to t = 20, where
  the clusters have formed; beside a first-order reference, Lax-Friedrichs with
  explicit Euler (dt = h / 2, NumPy FFTs), on the same cells. Both are compared in
  W1 with a tight solve on 2^15 cells (rtol = atol = 1e-10).
- growth: the growth rates of modes 1-12 of the uniform state at N = 512
  against k^2 I_k(beta) / (beta I_0(beta)).
- particles: 2 x 10^4 tokens at the quantiles of a smooth density, beta = 10,
  t <= 6 (`mf.simulate` on S^1), against the density on 1024 and 4096 cells: W1
  on the circle at every save.
- staircase: `mf.simulate_merging`, n = 32 tokens on S^1, beta = 16, t <= 10^14.

    python benchmarks/density.py [--out DIR] [--particles 20000]
"""

import argparse
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.special import ive  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield import density  # noqa: E402
from meanfield.extend import manifest, savefig_atomic, write_manifest  # noqa: E402

BETA, T1, MODES, AMPLITUDE = 30.0, 20.0, 64, 1e-3


def band_limited(N, seed=0):
    """1/(2 pi) (1 + sum_{k <= 64} a_k cos(k theta + phi_k)) at the cell centres."""
    rng = np.random.default_rng(seed)
    a = AMPLITUDE * rng.standard_normal(MODES)
    phase = rng.uniform(0, 2 * np.pi, MODES)
    theta = density.cell_centres(N)
    k = np.arange(1, MODES + 1)
    rho = 1 + (a * np.cos(np.outer(theta, k) + phase)).sum(1)
    return rho / (rho.sum() * 2 * np.pi / N)


def lax_friedrichs(rho, beta, t1, saves):
    """Explicit Euler + Lax-Friedrichs, dt = h / 2 (|v| <= 1): first order."""
    N = rho.size
    h = 2 * np.pi / N
    k = np.arange(N // 2 + 1)
    cos_hat = 2 * np.pi * ive(k, beta)
    sin_hat = 2 * np.pi * (1j * k / beta) * ive(k, beta)  # at the cell centres
    steps = int(np.ceil(t1 / (0.5 * h)))
    dt = t1 / steps
    out, every = [rho.copy()], steps // (len(saves) - 1)
    for step in range(1, steps + 1):
        rho_hat = np.fft.rfft(rho)
        v = np.fft.irfft(rho_hat * sin_hat, n=N) / np.fft.irfft(rho_hat * cos_hat, n=N)
        flux = rho * v
        rho = 0.5 * (np.roll(rho, -1) + np.roll(rho, 1)) - dt / (2 * h) * (
            np.roll(flux, -1) - np.roll(flux, 1)
        )
        if step % every == 0:
            out.append(rho.copy())
    return np.stack(out)


def cells():
    row = {}
    saves = np.linspace(0, T1, 5)
    rho0 = band_limited(10_000)
    for attempt in ("first_call_s", "meanfield_s"):
        start = time.perf_counter()
        sol = density.simulate(rho0, T1, beta=BETA, saveat=saves)
        row[attempt] = time.perf_counter() - start
    row.update(
        N=10_000,
        beta=BETA,
        t1=T1,
        status=sol.status,
        steps=sol.num_steps,
        mass_error=float(np.abs(sol.mass - 1).max()),
        lowest=sol.lowest,
        clusters=density.count_clusters(sol.rho[-1]),
        fastest_mode=density.fastest_mode(BETA),
    )
    start = time.perf_counter()
    lf = lax_friedrichs(rho0, BETA, T1, saves)
    row["lax_friedrichs_s"] = time.perf_counter() - start
    row["lax_friedrichs_mass_error"] = float(
        np.abs(lf.sum(1) * 2 * np.pi / 10_000 - 1).max()
    )
    row["lax_friedrichs_clusters"] = density.count_clusters(np.clip(lf[-1], 0, None))
    start = time.perf_counter()
    ref = density.simulate(
        band_limited(1 << 15), T1, beta=BETA, saveat=saves, rtol=1e-10, atol=1e-10
    )
    row["reference_s"] = time.perf_counter() - start
    samples = [density.sample_quantiles(r, 10**6) for r in ref.rho]
    row["ts"] = saves.tolist()
    row["meanfield_w1"] = [
        density.circle_w1(r, s) for r, s in zip(sol.rho, samples, strict=True)
    ]
    row["lax_friedrichs_w1"] = [
        density.circle_w1(r, s) for r, s in zip(lf, samples, strict=True)
    ]
    print({k: v for k, v in row.items()}, flush=True)
    return row, (sol.theta, sol.rho[-1], lf[-1], ref.theta, ref.rho[-1])


def growth():
    N, beta, t1 = 512, 10.0, 4.0
    every = np.arange(1, 40)
    ks = every[density.growth_rate(every, beta) * t1 > 0.5]
    theta = density.cell_centres(N)
    rho0 = 1 + 1e-6 * np.cos(np.outer(theta, ks)).sum(1)
    rho0 /= rho0.sum() * 2 * np.pi / N
    sol = density.simulate(rho0, t1, beta=beta, rtol=1e-12, atol=1e-14)
    amplitude = np.abs(np.fft.rfft(sol.rho, axis=-1))[:, ks]
    measured = np.log(amplitude[1] / amplitude[0]) / t1
    predicted = density.growth_rate(ks, beta)
    row = dict(
        N=N,
        beta=beta,
        modes=ks.tolist(),
        measured=measured.tolist(),
        predicted=predicted.tolist(),
        max_relative_error=float(np.abs(measured / predicted - 1).max()),
    )
    print(row, flush=True)
    return row


def particles(n):
    beta, t1 = 10.0, 6.0
    ts = np.linspace(0, t1, 7)
    row = dict(n=n, beta=beta, t1=t1, ts=ts.tolist())
    fine = density.cell_centres(4096)
    rho_fine = np.exp(2 * np.cos(fine) + 0.5 * np.cos(3 * fine - 1))
    rho_fine /= rho_fine.sum() * 2 * np.pi / fine.size
    start = time.perf_counter()
    sol = density.simulate_particles(
        density.sample_quantiles(rho_fine, n), t1, beta=beta, saveat=ts
    )
    theta_t = density.angles(sol.x)
    row["particles_s"] = time.perf_counter() - start
    row["particle_steps"] = int(sol.num_steps)
    for N in (1024, 4096):
        c = density.cell_centres(N)
        rho0 = np.exp(2 * np.cos(c) + 0.5 * np.cos(3 * c - 1))
        rho0 /= rho0.sum() * 2 * np.pi / N
        start = time.perf_counter()
        dens = density.simulate(rho0, t1, beta=beta, saveat=ts)
        row[f"density_{N}_s"] = time.perf_counter() - start
        row[f"w1_{N}"] = [
            density.circle_w1(r, a) for r, a in zip(dens.rho, theta_t, strict=True)
        ]
    print(row, flush=True)
    return row


def staircase():
    beta = 16.0
    theta = np.random.default_rng(0).uniform(0, 2 * np.pi, 32)
    ts = np.concatenate([[0.0], np.logspace(-2, 14, 161)])
    start = time.perf_counter()
    run = mf.simulate_merging(
        mf.Particles(np.stack([np.cos(theta), np.sin(theta)], 1)),
        mf.SoftmaxAttention(np.eye(2), A=beta * np.eye(2)),
        ts[-1],
        merge_tol=1e-4,
        saveat=ts,
        normalization="sphere",
    )
    row = dict(
        n=32,
        beta=beta,
        t1=ts[-1],
        wall_s=time.perf_counter() - start,
        steps=run.num_steps,
        status=run.status,
        merge_times={
            int(k): float(ts[np.argmax(run.counts == k)]) for k in np.unique(run.counts)
        },
    )
    print(row, flush=True)
    return row, run


def plot(rows, finals, run, path):
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), layout="constrained")
    theta, ours, lf, ref_theta, ref = finals
    ax = axes[0, 0]
    ax.plot(ref_theta, ref, color="0.6", lw=3, label="2¹⁵ cells, rtol 10⁻¹⁰")
    ax.plot(theta, ours, color="C0", lw=1, label="meanfield, 10⁴ cells")
    ax.plot(theta, lf, color="C1", lw=1, label="Lax-Friedrichs, 10⁴ cells")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel("θ")
    ax.set_ylabel("ρ at t = 20")
    ax.set_title("β = 30, from band-limited noise")
    ax.legend(fontsize="small")
    cell = rows["cells"]
    ax = axes[0, 1]
    names = ["meanfield", "lax_friedrichs"]
    ax.bar(names, [cell["meanfield_s"], cell["lax_friedrichs_s"]], color=["C0", "C1"])
    for i, name in enumerate(names):
        ax.annotate(
            f"W1 at t = {T1:g}: {cell[f'{name}_w1'][-1]:.1e}",
            (i, cell[f"{name}_s"]),
            ha="center",
            va="bottom",
            fontsize="small",
        )
    ax.set_ylabel("seconds (warm)")
    ax.set_title("N = 10⁴ cells to t = 20: time and W1 to 2¹⁵ cells")
    ax = axes[1, 0]
    part = rows["particles"]
    for N in (1024, 4096):
        ax.semilogy(part["ts"], part[f"w1_{N}"], marker="o", label=f"N = {N}")
    ax.axhline(2 * np.pi / (4 * part["n"]), color="0.5", ls=":", label="sample floor")
    ax.set_xlabel("t")
    ax.set_ylabel("W1 (density, particles)")
    ax.set_title(f"{part['n']} particles against the density, β = 10")
    ax.legend(fontsize="small")
    mf.plotting.plot_energy(
        run.ts,
        log_energy=run.log_energy,
        beta=run.beta,
        counts=run.counts,
        ax=axes[1, 1],
        title=f"staircase: n = 32, β = 16, {rows['staircase']['wall_s']:.0f} s",
    )
    savefig_atomic(fig, path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--particles", type=int, default=20_000, help="tokens")
    parser.add_argument(
        "--out",
        default="out/benchmarks",
        help="output folder (default out/benchmarks; the committed results are "
        "benchmarks/results)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    rows["staircase"], run = staircase()
    rows["growth"] = growth()
    rows["cells"], finals = cells()
    rows["particles"] = particles(args.particles)
    device = jax.devices()[0].platform
    write_manifest(
        out / f"density_{device}.json",
        dict(manifest=manifest(vars(args), 0, None), rows=rows),
    )
    plot(rows, finals, run, out / f"density_{device}.png")


if __name__ == "__main__":
    main()
