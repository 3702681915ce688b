"""The zonal density on S^2 against tokens: cost at equal accuracy.

`mf.density.simulate_zonal` evolves a density of the angle theta to an axis on
S^{d-1}; `mf.simulate(..., normalization="sphere")` moves the tokens whose
mean-field limit it is. Here d = 3, softmax, beta = 9, from the smooth
non-uniform zonal density

    rho0(theta) ∝ exp(2 cos theta) + 0.5 exp(3 cos(theta - 2))

(a cap at the pole and a ring at theta = 2), to t1 = 3. By then the mass is
moving from the ring into the polar cluster (peak density 4x the initial one)
but the narrowest feature still spans ~160 cells of N = 1000 (~40 at N = 250), so
every N measured resolves it and the error decays at the scheme's order; at
t = 4 the polar cluster is 4x narrower again, and past it it collapses toward a
point mass, which no fixed grid resolves.

- density: warm wall time (median of `--repeats` calls after a warm-up; the
  compile, first call minus median, reported apart) and steps for each N of
  `--ns`, and its error against a reference run on 2x the finest N: L1 on the
  sphere of the cell averages restricted to the coarse grid, and W1 of the
  theta-marginal; the observed order between consecutive N.
- particles: n tokens drawn from rho0 by `sample_zonal` (several seeds), run with
  `mf.simulate` at rtol = atol = 1e-8 in float64 to t1, and their W1 to the
  reference density (`zonal_w1(rho_ref(t1), zonal_angles(x(t1)), 3)`); fits
  W1 = c / sqrt(n) and wall = a n^p (the field is O(n^2)). Each seed is one
  timed call (the compiled solve is shared: a warm-up at t1 = 0.01 compiles it).
- equal accuracy: for each N, n* = (c / W1_N)^2, the tokens that would match the
  density's W1, their projected time a n*^p against the density's, and the N at
  which the density's W1 equals that of the largest n measured.
- noise: the density alone with sigma = `--sigma` at N = 1000 and 10000.

    python benchmarks/sphere_density.py [--ns 250 500 1000 2000 4000 10000]
        [--particle-ns 256 ... 16384] [--out DIR]
"""

import argparse
import os
import subprocess
import time
from pathlib import Path

import jax
import jax.random as jr
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield.extend import manifest, savefig_atomic, write_manifest  # noqa: E402

D, BETA, T1 = 3, 9.0, 3.0
PARTICLE_TOL = 1e-8  # the ODE far below the sampling error (as simulate_particles)


# On S^2 (d = 3) the surface measure is 2 pi sin(theta) dtheta: the cap fraction
# and the cell volumes have closed forms (mf.density does not export its own).
def cap_fraction(theta):
    """Fraction of |S^2| at angle < theta from the axis."""
    return 0.5 * (1 - np.cos(theta))


def zonal_volumes(N: int, d: int = D) -> np.ndarray:
    """Volumes 2 pi (cos a - cos b) of the cells [a, b) = [j h, (j + 1) h)."""
    assert d == 3
    edges = np.arange(N + 1) * np.pi / N
    return 2 * np.pi * (np.cos(edges[:-1]) - np.cos(edges[1:]))


def initial_density(N: int) -> np.ndarray:
    """rho0 at the cell centres, normalised to sum_j V_j rho_j = 1."""
    theta = (np.arange(N) + 0.5) * np.pi / N
    rho = np.exp(2 * np.cos(theta)) + 0.5 * np.exp(3 * np.cos(theta - 2.0))
    return rho / (rho @ zonal_volumes(N, D))


def restrict(rho_fine: np.ndarray, N: int) -> np.ndarray:
    """Volume-weighted averages of a fine density over the N coarse cells."""
    k = rho_fine.size // N
    mass = (rho_fine * zonal_volumes(rho_fine.size, D)).reshape(N, k).sum(1)
    return mass / zonal_volumes(N, D)


def density_w1(rho: np.ndarray, rho_ref: np.ndarray) -> float:
    """W1 of the theta-marginals, int_0^pi |F - F_ref| dtheta.

    Both CDFs are exact (affine in the cap fraction inside a cell); the coarse
    faces are fine faces, so the integrand is smooth inside each fine cell, where
    8-point Gauss-Legendre integrates it.
    """
    M = rho_ref.size
    x, w = np.polynomial.legendre.leggauss(8)
    h = np.pi / M
    pts = ((np.arange(M)[:, None] + 0.5 * (x[None, :] + 1)) * h).ravel()

    def cdf(r):
        n = r.size
        p = r * zonal_volumes(n, D)
        p = p / p.sum()
        cum = np.concatenate([[0.0], np.cumsum(p)])
        f = cap_fraction(np.arange(n + 1) * np.pi / n)
        cell = np.minimum((pts / (np.pi / n)).astype(int), n - 1)
        inside = (cap_fraction(pts) - f[cell]) / (f[cell + 1] - f[cell])
        return cum[cell] + p[cell] * inside

    diff = np.abs(cdf(rho) - cdf(rho_ref)).reshape(M, 8)
    return float(np.sum(diff @ w) * 0.5 * h)


def zonal(N: int, sigma: float = 0.0, tol: float = 1e-8):
    """The zonal solve of rho0 on N cells to T1 at rtol = atol = tol."""
    return mf.density.simulate_zonal(
        initial_density(N), T1, beta=BETA, d=D, sigma=sigma, rtol=tol, atol=tol
    )


def time_error(sol, N: int, sigma: float) -> float:
    """L1 on the sphere between `sol` (tol 1e-8) and a tol = 1e-11 solve, same N."""
    tight = zonal(N, sigma, tol=1e-11)
    return float(np.sum(zonal_volumes(N, D) * np.abs(sol.rho[-1] - tight.rho[-1])))


def time_zonal(N: int, repeats: int, sigma: float = 0.0):
    """(solution, record): warm median wall time over `repeats` calls, compile."""
    start = time.perf_counter()
    zonal(N, sigma)
    first = time.perf_counter() - start
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        sol = zonal(N, sigma)
        walls.append(time.perf_counter() - start)
    wall = float(np.median(walls))
    record = dict(
        N=N,
        sigma=sigma,
        wall_s=wall,
        walls_s=walls,
        compile_s=first - wall,
        steps=sol.num_steps,
        status=sol.status,
    )
    return sol, record


def particles(x: np.ndarray, t1: float):
    with jax.enable_x64(True):
        sol = mf.simulate(
            mf.Particles(x),
            mf.SoftmaxAttention(np.eye(D), A=BETA * np.eye(D)),
            t1,
            normalization="sphere",
            rtol=PARTICLE_TOL,
            atol=PARTICLE_TOL,
        )
        return jax.block_until_ready(sol)


def run_particles(n: int, seeds: int, rho0: np.ndarray, rho_ref: np.ndarray):
    x0 = mf.density.sample_zonal(jr.key(10_000), rho0, n, D)
    start = time.perf_counter()
    particles(x0, 0.01)  # compiles the solve that every t1 reuses
    compile_s = time.perf_counter() - start
    walls, w1s, w1s_initial, steps = [], [], [], []
    for seed in range(seeds):
        x0 = mf.density.sample_zonal(jr.key(seed), rho0, n, D)
        start = time.perf_counter()
        sol = particles(x0, T1)
        walls.append(time.perf_counter() - start)
        assert sol.status == "success", sol.status
        x1 = np.asarray(sol.x[-1])
        w1s.append(mf.density.zonal_w1(rho_ref, mf.density.zonal_angles(x1), D))
        w1s_initial.append(mf.density.zonal_w1(rho0, mf.density.zonal_angles(x0), D))
        steps.append(int(sol.num_steps))
    record = dict(
        n=n,
        seeds=seeds,
        wall_s=float(np.median(walls)),
        walls_s=walls,
        compile_s=compile_s,
        steps=steps,
        w1=float(np.median(w1s)),
        w1_rms=float(np.sqrt(np.mean(np.square(w1s)))),
        w1s=w1s,
        w1_initial=float(np.median(w1s_initial)),
    )
    print(
        f"particles n={n}: {record['wall_s']:.3g} s, steps {steps}, "
        f"W1 {record['w1']:.3g}",
        flush=True,
    )
    return record


def loglog_fit(x, y):
    """(prefactor, exponent) of y = a x^p by least squares in logs."""
    p, log_a = np.polyfit(np.log(x), np.log(y), 1)
    return float(np.exp(log_a)), float(p)


def run(args):
    ns = sorted(args.ns)
    N_ref = 2 * ns[-1]
    print(f"reference N = {N_ref}", flush=True)
    start = time.perf_counter()
    ref = zonal(N_ref, tol=args.reference_tol)
    ref_wall = time.perf_counter() - start
    rho_ref = ref.rho[-1]
    reference = dict(
        N=N_ref, wall_s_with_compile=ref_wall, steps=ref.num_steps, status=ref.status
    )

    density = []
    for N in ns:
        sol, record = time_zonal(N, args.repeats)
        record["l1"] = float(
            np.sum(zonal_volumes(N, D) * np.abs(sol.rho[-1] - restrict(rho_ref, N)))
        )
        record["w1"] = density_w1(sol.rho[-1], rho_ref)
        record["mass_error"] = float(abs(sol.rho[-1] @ zonal_volumes(N, D) - 1))
        if N <= args.time_error_max_n:
            record["time_error_l1"] = time_error(sol, N, 0.0)
        print(
            f"density N={N}: {record['wall_s']:.3g} s, {record['steps']} steps, "
            f"L1 {record['l1']:.3g}, W1 {record['w1']:.3g}",
            flush=True,
        )
        density.append(record)
    for a, b in zip(density, density[1:], strict=False):
        ratio = np.log(b["N"] / a["N"])
        b["order_l1"] = float(np.log(a["l1"] / b["l1"]) / ratio)
        b["order_w1"] = float(np.log(a["w1"] / b["w1"]) / ratio)

    # Tokens from the same piecewise-constant rho0 as the reference (on N_ref
    # cells): the sampled measure then has no discretisation error of its own.
    rho0 = initial_density(N_ref)
    tokens = []
    for n in sorted(args.particle_ns):
        seeds = int(np.clip(args.seed_budget // n, args.min_seeds, args.max_seeds))
        tokens.append(run_particles(n, seeds, rho0, rho_ref))

    big = [r for r in tokens if r["n"] >= args.fit_from]
    c = float(np.exp(np.mean([np.log(r["w1"] * np.sqrt(r["n"])) for r in tokens])))
    _, w1_slope = loglog_fit([r["n"] for r in tokens], [r["w1"] for r in tokens])
    a_time, p_time = loglog_fit([r["n"] for r in big], [r["wall_s"] for r in big])
    fit = dict(
        w1_c=c,
        w1_slope_free_fit=w1_slope,
        time_prefactor_s=a_time,
        time_exponent=p_time,
        time_fit_from_n=args.fit_from,
    )

    equal = []
    for r in density:
        n_star = (c / r["w1"]) ** 2
        t_star = a_time * n_star**p_time
        equal.append(
            dict(
                N=r["N"],
                density_w1=r["w1"],
                density_wall_s=r["wall_s"],
                particles_n=n_star,
                particles_projected_s=t_star,
                speedup=t_star / r["wall_s"],
            )
        )
    # The N at which the density's W1 equals the largest n's: log-log
    # interpolation of W1(N), extrapolated by the two coarsest N if below them.
    n_max = tokens[-1]
    target = c / np.sqrt(n_max["n"])
    logN = np.log([r["N"] for r in density])
    logw = np.log([r["w1"] for r in density])
    if target >= density[0]["w1"]:
        slope = (logw[1] - logw[0]) / (logN[1] - logN[0])
        N_match = float(np.exp(logN[0] + (np.log(target) - logw[0]) / slope))
    else:
        N_match = float(np.exp(np.interp(-np.log(target), -logw, logN)))
    match = dict(
        n=n_max["n"],
        particles_w1_fit=float(target),
        particles_w1_measured=n_max["w1"],
        particles_wall_s=n_max["wall_s"],
        density_N=N_match,
        density_N_min=int(np.ceil(2 * np.pi * np.sqrt(BETA))),
        extrapolated=bool(target >= density[0]["w1"]),
    )

    noisy = []
    for N in args.noise_ns:
        repeats = args.repeats if N <= 2000 else max(1, args.repeats - 2)
        sol, record = time_zonal(N, repeats, sigma=args.sigma)
        record["mass_error"] = float(abs(sol.rho[-1] @ zonal_volumes(N, D) - 1))
        if N <= args.time_error_max_n:
            record["time_error_l1"] = time_error(sol, N, args.sigma)
        print(
            f"noisy N={N}: {record['wall_s']:.3g} s, {record['steps']} steps",
            flush=True,
        )
        noisy.append(record)
    return dict(
        reference=reference,
        density=density,
        particles=tokens,
        fit=fit,
        equal_accuracy=equal,
        match=match,
        noisy=noisy,
    )


def plot(result, path):
    fig, ax = plt.subplots(figsize=(6.5, 4.5), layout="constrained")
    dens, toks = result["density"], result["particles"]
    ax.plot(
        [r["wall_s"] for r in dens],
        [r["w1"] for r in dens],
        "-o",
        color="C0",
        label="density, W1 (N cells)",
    )
    ax.plot(
        [r["wall_s"] for r in dens],
        [r["l1"] for r in dens],
        ":^",
        color="C0",
        alpha=0.6,
        label="density, L1 of cell averages",
    )
    for r in dens:
        ax.annotate(
            f"{r['N']}",
            (r["wall_s"], r["w1"]),
            (4, -10),
            textcoords="offset points",
            fontsize="x-small",
            color="C0",
        )
    ax.plot(
        [r["wall_s"] for r in toks],
        [r["w1"] for r in toks],
        "-s",
        color="C3",
        label="tokens, W1 (n, median of seeds)",
    )
    for r in toks:
        ax.annotate(
            f"{r['n']}",
            (r["wall_s"], r["w1"]),
            (4, 2),
            textcoords="offset points",
            fontsize="x-small",
            color="C3",
        )
    fit = result["fit"]
    ws = np.geomspace(min(r["w1"] for r in dens), max(r["w1"] for r in toks), 50)
    n = (fit["w1_c"] / ws) ** 2
    ax.plot(
        fit["time_prefactor_s"] * n ** fit["time_exponent"],
        ws,
        "--",
        color="C3",
        alpha=0.5,
        label=f"tokens projected: W1 = {fit['w1_c']:.2f}/√n, "
        f"t ∝ n^{fit['time_exponent']:.2f}",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(right=1e4 * max(r["wall_s"] for r in toks))
    ax.set_xlabel("warm wall time per solve (s)")
    ax.set_ylabel("error at t1 against the reference density")
    ax.set_title(
        f"S², softmax β = {BETA:g}, t1 = {T1:g}: density vs tokens", fontsize="medium"
    )
    ax.legend(fontsize="x-small")
    savefig_atomic(fig, path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ns",
        type=int,
        nargs="+",
        default=[250, 500, 1000, 2000, 4000, 10000],
        help="cells of the density (the reference has 2x the largest; each must "
        "divide it)",
    )
    parser.add_argument(
        "--particle-ns",
        type=int,
        nargs="+",
        default=[256, 512, 1024, 2048, 4096, 8192, 16384],
    )
    parser.add_argument(
        "--seed-budget",
        type=int,
        default=2**15,
        help="seeds per n: seed_budget // n, clipped to [min-seeds, max-seeds]",
    )
    parser.add_argument("--min-seeds", type=int, default=3)
    parser.add_argument("--max-seeds", type=int, default=8)
    parser.add_argument(
        "--fit-from",
        type=int,
        default=1024,
        help="smallest n in the fit of wall time against n (below it, overhead)",
    )
    parser.add_argument(
        "--reference-tol",
        type=float,
        default=1e-10,
        help="rtol = atol of the reference solve",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed density calls")
    parser.add_argument("--sigma", type=float, default=0.3)
    parser.add_argument(
        "--time-error-max-n",
        type=int,
        default=2000,
        help="up to this N, also the L1 distance of the tol = 1e-8 solve to a "
        "tol = 1e-11 one (its time-stepping error)",
    )
    parser.add_argument("--noise-ns", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument(
        "--out",
        default="out/sphere_density",
        help="output folder (default out/sphere_density; the committed results "
        "are benchmarks/results)",
    )
    args = parser.parse_args()
    if any((2 * max(args.ns)) % N for N in args.ns):
        parser.error("every N of --ns must divide twice the largest")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout
    start = time.perf_counter()
    result = run(args)
    wall = time.perf_counter() - start
    config = dict(vars(args), d=D, beta=BETA, t1=T1, particle_tol=PARTICLE_TOL)
    device = jax.devices()[0].platform
    write_manifest(
        out / f"sphere_density_{device}.json",
        dict(
            manifest=manifest(config, None, wall),
            load=dict(
                before=list(load_before),
                after=list(os.getloadavg()),
                uptime_before=uptime_before.strip(),
                uptime_after=subprocess.run(
                    ["uptime"], capture_output=True, text=True
                ).stdout.strip(),
                cpus=os.cpu_count(),
            ),
            **result,
        ),
    )
    plot(result, out / f"sphere_density_{device}.png")
    print(f"wrote {out}/sphere_density_{device}.{{json,png}} in {wall:.0f} s")


if __name__ == "__main__":
    main()
