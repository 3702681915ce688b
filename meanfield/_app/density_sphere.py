"""`meanfield density` on S^2: the full density under A = beta I, beside tokens.

`geometry = "sphere"` in the configuration of `meanfield density`
(`density_report`): the density on S^2 by spherical harmonics
(`mf.density.simulate_sphere`, band limit `L`), clusters counted at every save
(`count_sphere_clusters`) against the fastest-growing degree (Bruno,
Pasqualotto & Agazzi, 2025), and optionally tokens drawn from the initial
density (`sample_sphere`) run beside it, compared by their first two moments.
"""

import jax
import numpy as np

from .. import density, plotting
from .report import Output, Result


def initial_density(cfg: dict, seed: int) -> np.ndarray:
    """rho0 (nlat, nlon) on `sphere_grid(L)`: nonnegative, mass 1 by the grid's rule.

    "uniform": 1 + perturbation g, "smooth": (e^{2 <x, e_3>} + e^{3 <x, e_1>})
    (1 + perturbation g), where g is a random field of the degrees 1..L/2 with
    independent N(0, 1) coefficients, scaled to unit standard deviation over
    the sphere. Degrees above L/2 are left empty, so the top of the band starts
    at 0 and "unresolved" keeps its meaning (structure made by the dynamics,
    not put in the data).
    """
    grid = density.sphere_grid(cfg["L"])
    x = np.asarray(grid.nodes).reshape(grid.shape + (3,))
    base = (
        np.ones(grid.shape)
        if cfg["init"] == "uniform"
        else np.exp(2 * x[..., 2]) + np.exp(3 * x[..., 0])
    )
    rng = np.random.default_rng(seed)
    L = cfg["L"]
    coeffs = rng.standard_normal((L, L)) + 1j * rng.standard_normal((L, L))
    ell, m = np.arange(L)[:, None], np.arange(L)[None, :]
    coeffs = np.where((m <= ell) & (ell >= 1) & (ell <= L // 2), coeffs, 0)
    coeffs[:, 0] = coeffs[:, 0].real  # m = 0 of a real field
    field = grid.values(coeffs)
    weights = np.asarray(grid.weights).reshape(grid.shape)
    field /= np.sqrt(np.sum(field**2 * weights) / (4 * np.pi))
    rho = base * np.clip(1 + cfg["perturbation"] * field, 0, None)
    return rho / np.sum(rho * weights)


def _moments(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean (3,) and second moment (3, 3) of weighted points."""
    return w @ x, np.einsum("i,ij,ik->jk", w, x, x)


def compute(cfg: dict, output: Output, *, seed: int | None = None) -> Result:
    """The sphere run: density, clusters over time, and tokens beside it."""
    rho0 = initial_density(cfg, 0 if seed is None else seed)
    ts = np.linspace(0.0, cfg["t1"], cfg["saves"])
    sigma = cfg["noise"]["sigma"]
    output.log(
        f"density on S^2: band limit L = {cfg['L']}, beta = {cfg['beta']:g} "
        f"({cfg['attention']}), sigma = {sigma:g}, t1 = {cfg['t1']:g}"
    )
    sol = density.simulate_sphere(
        rho0,
        cfg["t1"],
        beta=cfg["beta"],
        attention=cfg["attention"],
        sigma=sigma,
        saveat=ts,
        rtol=cfg["rtol"],
        atol=cfg["atol"],
        progress=output.progress,
    )
    density_s = output.wall_s
    reached = np.isfinite(sol.ts)
    clusters = np.array(
        [
            density.count_sphere_clusters(sol.rho[i]) if reached[i] else -1
            for i in range(ts.size)
        ]
    )
    grid = sol.grid
    arrays = dict(
        theta=np.asarray(grid.theta),
        phi=grid.phi,
        ts=sol.ts,
        rho=sol.rho,
        clusters=clusters,
    )
    summary = {
        "geometry": "sphere",
        "L": cfg["L"],
        "beta": cfg["beta"],
        "attention": cfg["attention"],
        "sigma": sigma,
        "critical_noise": float(
            density.critical_noise(cfg["beta"], cfg["attention"], d=3)
        ),
        "t1": cfg["t1"],
        "status": sol.status,
        "num_steps": sol.num_steps,
        "density_wall_s": density_s,
        "mass_error": float(np.nanmax(np.abs(sol.mass - 1))),
        "lowest": sol.lowest,
        "clusters_at_t1": int(clusters[-1]) if reached[-1] else None,
        "fastest_degree": density.fastest_mode(
            cfg["beta"], cfg["attention"], sigma, d=3
        ),
    }
    particles = None
    if cfg["particles"]:
        n = cfg["particles"]
        output.log(f"particles: {n} tokens drawn from rho0")
        x0 = density.sample_sphere(jax.random.key(cfg["noise"]["seed"]), rho0, n)
        particles = density.simulate_tokens(
            x0,
            cfg["t1"],
            beta=cfg["beta"],
            attention=cfg["attention"],
            sigma=sigma,
            key=jax.random.key(cfg["noise"]["seed"] + 1) if sigma > 0 else None,
            saveat=ts,
            rtol=None if sigma > 0 else cfg["rtol"],
            atol=None if sigma > 0 else cfg["atol"],
            progress=output.progress,
        )
        mean_gap = np.full(ts.size, np.nan)
        both = reached & np.isfinite(particles.ts)
        for i in np.nonzero(both)[0]:
            atoms = sol.measure(int(i))
            want = _moments(np.asarray(atoms.x), np.asarray(atoms.weights))
            xi = np.asarray(particles.x[i])
            got = _moments(xi, np.full(n, 1.0 / n))
            mean_gap[i] = max(
                np.abs(got[0] - want[0]).max(), np.abs(got[1] - want[1]).max()
            )
        arrays.update(particles=np.asarray(particles.x), moment_gap=mean_gap)
        summary.update(
            particles=n,
            particle_status=str(particles.status),
            particles_wall_s=output.wall_s - density_s,
            moment_gap_max=float(np.nanmax(mean_gap)),
        )
    summary["wall_s"] = output.wall_s
    resolved = {
        **cfg,
        "out_dir": str(output.dir),
        "dtype": "float64",
        "attention_matrices": "V = I, A = beta I on S^2",
        "scheme": "spherical harmonics of degree < L on a Gauss-Legendre grid "
        "(ceil(3L/2) x 3L), Funk-Hecke convolution, weak-form divergence, "
        "Lawson-Tsit5 with the exact heat factor",
    }
    return Result(summary, resolved, arrays, {"solution": sol, "particles": particles})


def figures(cfg: dict, result: Result, output: Output) -> None:
    """density.png (Mollweide maps at four save times) and, if asked, density.gif."""
    sol = result.data["solution"]
    title = f"β = {cfg['beta']:g} ({cfg['attention']}), σ = {cfg['noise']['sigma']:g}"
    output.figure(plotting.plot_sphere_density(sol, title=title), "density.png")
    if cfg["animation"] and np.isfinite(sol.ts).sum() >= 2:
        plotting.animate_sphere_density(sol, output.path("density.gif"), title=title)


def summary_lines(summary: dict) -> list[str]:
    """The lines printed after a sphere run."""
    clusters = summary["clusters_at_t1"]
    lines = [
        f"density on S^2: L = {summary['L']}, beta = {summary['beta']:g} "
        f"({summary['attention']}), sigma = {summary['sigma']:g} (critical "
        f"{summary['critical_noise']:.3g}) to t = {summary['t1']:g} in "
        f"{summary['density_wall_s']:.1f} s, {summary['num_steps']} steps, "
        f"status {summary['status']}",
        f"mass error {summary['mass_error']:.1e}, "
        f"lowest value {summary['lowest']:.1e}; "
        + ("t1 not reached" if clusters is None else f"{clusters} clusters at t1")
        + f" (fastest degree: {summary['fastest_degree']})",
    ]
    if "particles" in summary:
        lines.append(
            f"particles: {summary['particles']} tokens in "
            f"{summary['particles_wall_s']:.1f} s ({summary['particle_status']}); "
            f"largest gap in the first two moments {summary['moment_gap_max']:.2e}"
        )
    return lines
