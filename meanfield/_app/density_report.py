"""The mean-field density on S^1 or S^2 from a configuration (`meanfield density`).

The tokens' density on S^1 (`mf.density.simulate`, rho(theta, t)) or on S^2
(`geometry = "sphere"`: `mf.density.simulate_sphere`, `density_sphere`) under
attention with A = beta I, V = I, beside the same dynamics sampled by particles
(`mf.simulate`; on the circle tokens at the quantiles of rho0, on S^2 drawn
from it): clusters emerge from the uniform state at the fastest-growing mode
(Geshkovski, Letrouit, Polyanskiy & Rigollet, 2023; Bruno, Pasqualotto &
Agazzi, 2025).

Run it with `meanfield density [--config FILE.toml]`.
"""

import jax
import numpy as np

from .. import density, plotting
from .._noisy_solve import SDE_TOLERANCE
from . import density_sphere
from .config import Key, boolean, choice, integer, number
from .config import resolve as resolve_schema
from .report import Output, Report, Result

ATTENTIONS = ("softmax", "unnormalized")
INITS = ("uniform", "smooth")
GEOMETRIES = ("circle", "sphere")
#: The unnormalised field is of size e^beta: beyond float64 past log(max), where
#: `mf.density` refuses it (softmax divides it out and takes any beta).
UNNORMALIZED_MAX_BETA = float(np.log(np.finfo(np.float64).max))


def _nonnegative(value, key: str, cfg) -> float:
    value = number()(value, key, cfg)
    if value < 0:
        raise ValueError(f"`{key}` must be >= 0; got {value}.")
    return value


#: The configuration: key -> (checker, default).
SCHEMA: dict = {
    "geometry": Key(
        choice(GEOMETRIES),
        "circle",
        doc='`"circle"` (the density on S¹ by finite volumes, `N` cells) or '
        '`"sphere"` (the density on S² by spherical harmonics, band limit `L`).',
    ),
    "N": Key(
        integer(8),
        1024,
        doc="Cells of the finite-volume grid on the circle [0, 2π), ≥ 8 "
        '(`geometry = "circle"`).',
    ),
    "L": Key(
        integer(8, 256),
        48,
        doc="Band limit on S²: spherical harmonics of degree < L on a grid of "
        '⌈3L/2⌉ × 3L nodes, 8 to 256 (`geometry = "sphere"`; at least about '
        "3.7 √β).",
    ),
    "animation": Key(
        boolean(),
        False,
        doc="Also write `density.gif`, the density on S² over time "
        '(`geometry = "sphere"`).',
    ),
    "beta": Key(
        number(positive=True),
        30.0,
        doc="Temperature β of the attention, whose matrices are V = I and "
        f"A = β I, > 0; at most {UNNORMALIZED_MAX_BETA:.4f} with `attention` = "
        '`"unnormalized"` (its field e^β is beyond float64 past it).',
    ),
    "attention": Key(
        choice(ATTENTIONS),
        "softmax",
        doc='`"softmax"` or `"unnormalized"` (the kernel e^(β cos(θ − θ′)) '
        "without the softmax normalisation).",
    ),
    "t1": Key(number(positive=True), 25.0, doc="Final time, > 0."),
    "saves": Key(
        integer(2),
        101,
        doc="Number of save times, evenly spaced on [0, t1] with both ends, ≥ 2.",
    ),
    "init": Key(
        choice(INITS),
        "uniform",
        doc='Initial density, normalised to mass 1: `"uniform"` (1, times '
        '1 + perturbation · N(0, 1) in each cell or at each node) or `"smooth"` '
        "(circle: e^(2 cos θ + 0.5 cos(3θ − 1)); sphere: e^(2 x₃) + e^(3 x₁); "
        "times the same factor).",
    ),
    "perturbation": Key(
        _nonnegative,
        1e-3,
        doc="Amplitude of the initial perturbation, in [0, 1); positive with "
        '`init = "uniform"` unless `[noise] sigma` > 0 (the uniform density is '
        "a steady state).",
    ),
    "noise": {
        "sigma": Key(
            _nonnegative,
            0.0,
            doc="Noise level σ ≥ 0: tokens with independent Brownian motions "
            "dθ = v dt + σ dW, and the diffusion (σ²/2) ∂²ρ in the density.",
        ),
        "seed": Key(
            integer(0),
            0,
            doc="Seed of the particles' Brownian paths (with `particles` > 0 and "
            "σ > 0), ≥ 0.",
        ),
    },
    "particles": Key(
        integer(0),
        2000,
        doc="Tokens placed at the quantiles of the initial density (circle) or "
        "drawn from it (sphere) and run beside it, for the comparison (circle: "
        "W1 to the density at every save time; sphere: the largest gap in the "
        "first two moments), ≥ 0 (0: none).",
    ),
    "rtol": Key(
        number(positive=True),
        1e-8,
        doc="Relative tolerance of the adaptive solvers (density, and particles "
        "without noise; noisy particles use the SDE default 1e-3), > 0.",
    ),
    "atol": Key(
        number(positive=True),
        1e-8,
        doc="Absolute tolerance of the adaptive solvers (density, and particles "
        "without noise; noisy particles use the SDE default 1e-3), > 0.",
    ),
}


def resolve_config(config: dict | None) -> dict:
    """Validate a configuration and fill in the defaults (`SCHEMA`).

    Keys (all optional): `geometry` ("circle" | "sphere"), `N` (cells on the
    circle, >= 8), `L` (band limit on S^2, 8..256), `animation` (S^2: also a
    GIF), `beta` (> 0), `attention`
    ("softmax" | "unnormalized"), `t1` (> 0), `saves` (>= 2), `init`
    ("uniform": 1 times 1 + perturbation N(0, 1) per cell; "smooth": e^{2 cos
    theta + 0.5 cos(3 theta - 1)} times the same factor), `perturbation` (>= 0),
    `[noise]` (`sigma` >= 0, `seed` of the particles' paths), `particles`
    (tokens for the comparison, 0 for none), `rtol`, `atol` (> 0).

    Raises:
        ValueError: unknown key, wrong type or bad value; the message (one line)
            names the key.
    """
    cfg = resolve_schema(SCHEMA, config)
    if cfg["attention"] == "unnormalized" and cfg["beta"] > UNNORMALIZED_MAX_BETA:
        raise ValueError(
            f"`beta` must be in (0, {UNNORMALIZED_MAX_BETA:.4f}] with `attention` = "
            '"unnormalized" (its field, of size e^beta, is beyond float64 past it; '
            f'"softmax" takes any beta > 0); got {cfg["beta"]:g}.'
        )
    need = density.min_band_limit(cfg["beta"])
    if cfg["geometry"] == "sphere" and cfg["L"] < need:
        raise ValueError(
            f"`L` = {cfg['L']} is too small for beta = {cfg['beta']:g} on the sphere: "
            f"the kernel e^(beta <x, y>) needs L >= {need}."
        )
    if cfg["init"] == "uniform" and cfg["perturbation"] == 0:
        if cfg["noise"]["sigma"] == 0:
            raise ValueError(
                "`perturbation` must be positive with init = 'uniform' and no "
                "noise (the uniform density is a steady state)."
            )
    if not cfg["perturbation"] < 1:
        raise ValueError(
            f"`perturbation` must be below 1 (rho >= 0); got {cfg['perturbation']}."
        )
    return cfg


def initial_density(cfg: dict, seed: int) -> np.ndarray:
    """rho0 (N,) of a configuration: nonnegative, mass 1."""
    theta = density.cell_centres(cfg["N"])
    base = (
        np.ones_like(theta)
        if cfg["init"] == "uniform"
        else np.exp(2 * np.cos(theta) + 0.5 * np.cos(3 * theta - 1))
    )
    noise = np.random.default_rng(seed).standard_normal(theta.size)
    rho = base * np.clip(1 + cfg["perturbation"] * noise, 0, None)
    return rho / (rho.sum() * 2 * np.pi / rho.size)


def run_density(
    config: dict | None,
    out_dir="out/density",
    *,
    seed: int | None = None,
    progress: bool = False,
) -> dict:
    """The density run of a configuration, with its figure and arrays.

    Writes to `out_dir` (created if needed): `density.png` (the (theta, t) heat
    map, and the particle histogram at t1 against the density), `density.npz`
    (`theta`, `ts`, `rho` (T, N), and with particles `angles` (T, n) and `w1`
    (T,)) and `manifest.json`.

    Args:
        config: configuration (see `resolve_config`); None for the defaults.
        out_dir: output directory.
        seed: seed of the initial noise (None: 0).
        progress: progress bars and lines on stderr.

    Returns:
        The summary (see `format_summary`).

    Raises:
        ValueError: invalid configuration (the message names the key).
    """
    return REPORT.run(resolve_config(config), out_dir, seed=seed, progress=progress)


def _compute(cfg: dict, output: Output, *, seed: int | None = None) -> Result:
    if cfg["geometry"] == "sphere":
        return density_sphere.compute(cfg, output, seed=seed)
    rho0 = initial_density(cfg, 0 if seed is None else seed)
    ts = np.linspace(0.0, cfg["t1"], cfg["saves"])
    sigma = cfg["noise"]["sigma"]
    output.log(
        f"density: N = {cfg['N']} cells, beta = {cfg['beta']:g} "
        f"({cfg['attention']}), sigma = {sigma:g}, t1 = {cfg['t1']:g}"
    )
    sol = density.simulate(
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
    # A solve that stops early (status "failed", "max_steps") leaves NaN rows.
    reached = np.isfinite(sol.ts)
    arrays = dict(theta=sol.theta, ts=sol.ts, rho=sol.rho)
    summary = {
        "N": cfg["N"],
        "beta": cfg["beta"],
        "attention": cfg["attention"],
        "sigma": sigma,
        "critical_noise": float(density.critical_noise(cfg["beta"], cfg["attention"])),
        "t1": cfg["t1"],
        "status": sol.status,
        "num_steps": sol.num_steps,
        "density_wall_s": density_s,
        "mass_error": float(np.nanmax(np.abs(sol.mass - 1))),
        "lowest": sol.lowest,
        "clusters_at_t1": (
            density.count_clusters(sol.rho[-1]) if reached[-1] else None
        ),
        "fastest_mode": density.fastest_mode(cfg["beta"], cfg["attention"], sigma),
    }
    particles = None
    noisy = sigma > 0
    if cfg["particles"]:
        output.log(f"particles: {cfg['particles']} tokens at the quantiles of rho0")
        # With noise the particles are an SDE solve: its own default tolerances
        # (1e-3; the ODE's 1e-8 would take ~1e8 steps per unit time), on the
        # Brownian paths of the [noise] seed.
        particles = density.simulate_particles(
            density.sample_quantiles(rho0, cfg["particles"]),
            cfg["t1"],
            beta=cfg["beta"],
            attention=cfg["attention"],
            sigma=sigma,
            key=jax.random.key(cfg["noise"]["seed"]) if noisy else None,
            saveat=ts,
            rtol=None if noisy else cfg["rtol"],
            atol=None if noisy else cfg["atol"],
            progress=output.progress,
        )
        angles = density.angles(particles.x)
        both = reached & np.isfinite(particles.ts)
        w1 = np.array(
            [
                density.circle_w1(sol.rho[i], angles[i]) if both[i] else np.nan
                for i in range(ts.size)
            ]
        )
        arrays.update(angles=angles, w1=w1)
        summary.update(
            particles=cfg["particles"],
            particle_status=str(particles.status),
            particles_wall_s=output.wall_s - density_s,
            particles_noise_seed=cfg["noise"]["seed"] if noisy else None,
            w1_max=float(np.nanmax(w1)),
        )
    summary["wall_s"] = output.wall_s
    resolved = {
        **cfg,
        "out_dir": str(output.dir),
        "dtype": "float64",
        "attention_matrices": "V = I, A = beta I on S^1",
        "scheme": "finite volumes, MUSCL-minmod upwind flux, FFT convolutions, "
        "SSPRK(4,3); with sigma > 0 the exact heat semigroup of the 3-point "
        "Laplacian in Strang splitting",
    }
    if cfg["particles"]:
        resolved["particle_solver"] = (
            f"SDE on S^1 (independent Brownian motions, sigma = {sigma:g}): Heun, "
            f"adaptive, rtol = atol = {SDE_TOLERANCE:g}, paths of "
            f"jax.random.key({cfg['noise']['seed']})"
            if noisy
            else f"ODE: Tsit5, rtol = {cfg['rtol']:g}, atol = {cfg['atol']:g}"
        )
    return Result(summary, resolved, arrays, {"solution": sol, "particles": particles})


def _figures(cfg: dict, result: Result, output: Output) -> None:
    """density.png (and density.gif on the sphere, if asked)."""
    if cfg["geometry"] == "sphere":
        density_sphere.figures(cfg, result, output)
        return
    output.figure(
        plotting.plot_density(
            result.data["solution"], particles=result.data["particles"]
        ),
        "density.png",
        bbox_inches="tight",
    )


def format_summary(summary: dict) -> str:
    """The lines printed after a run."""
    if summary.get("geometry") == "sphere":
        return "\n".join(density_sphere.summary_lines(summary))
    lines = [
        f"density: N = {summary['N']}, beta = {summary['beta']:g} "
        f"({summary['attention']}), sigma = {summary['sigma']:g} (critical "
        f"{summary['critical_noise']:.3g}) to t = {summary['t1']:g} in "
        f"{summary['density_wall_s']:.1f} s, {summary['num_steps']} steps, "
        f"status {summary['status']}",
        f"mass error {summary['mass_error']:.1e}, lowest cell {summary['lowest']:.1e}; "
        + (
            "t1 not reached"
            if summary["clusters_at_t1"] is None
            else f"{summary['clusters_at_t1']} clusters at t1"
        )
        + f" (fastest mode: {summary['fastest_mode']})",
    ]
    if "particles" in summary:
        seed = summary.get("particles_noise_seed")
        paths = "" if seed is None else f", Brownian paths of seed {seed}"
        lines.append(
            f"particles: {summary['particles']} tokens in "
            f"{summary['particles_wall_s']:.1f} s ({summary['particle_status']}"
            f"{paths}); largest W1 to the density {summary['w1_max']:.2e}"
        )
    return "\n".join(lines)


#: `meanfield density`.
REPORT = Report(
    "density",
    resolve_config,
    _compute,
    _figures,
    format_summary,
    arrays="density.npz",
)
