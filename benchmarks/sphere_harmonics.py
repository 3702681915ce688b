"""The full density on S^2 (`mf.density.simulate_sphere`): cost and accuracy.

`simulate_sphere` holds the density as spherical-harmonic coefficients of
degree < L on the Gauss-Legendre grid of `sphere_grid(L)` (M = ceil(3L/2) x 3L
nodes) and steps them with a Lawson form of Tsit5 (the heat factor exact). For
A = beta I, V = I the field is a Funk-Hecke convolution (the zonal path, a few
Legendre transforms: O(L^3) per right-hand side); for general Q, K, V it is a
quadrature over the nodes (O(M^2), as the particle field on n = M tokens).

- target: softmax, beta = 9, sigma = 0.1, t from 0 to 20 (saves at 5, 10, 20),
  from the uniform density plus a smooth perturbation of relative size
  `--eps` (random coefficients in degrees 1..8, fixed seed, scaled to RMS 1:
  rho0 = (1 + eps f) / (4 pi), mass 1 exactly), at L = `--L` and each
  rtol = atol of `--tols`: warm wall time (median of `--repeats` calls after
  a first one, which compiles, reported apart), steps
  (accepted + rejected), status, mass error, lowest value, and the max-norm
  error relative to max rho against a reference on a finer band
  (`--reference-L`, rtol = atol = `--reference-tol`; the L coefficients are
  zero-padded and synthesised on the reference grid, so the error includes
  the truncation at L).
- zonal scaling: the same problem at rtol = atol = 1e-8 for each L of `--Ls`:
  time per step (median wall / steps) and per right-hand side (the solver's
  rate function, jitted, median of calls), fitted a L^p.
- general path: Q, K random (fixed seed) scaled so |Q^T K|_2 = `--qk-norm`,
  V = I, sigma = 0.1, t1 = `--general-t1` (rtol = atol = `--general-tol`), for
  each L of `--general-Ls`: time per step (wall / steps, so including the
  solve's fixed cost) and per right-hand side against M, beside the particle field
  `SoftmaxAttention(V, Q=Q, K=K).velocity` on n = M tokens (the nodes,
  weighted w rho0; jitted, median) — which the solver's field must match at
  the nodes (checked) — each fitted a M^p.

The general kernel e^{<Q x_i, K x_j>} does not depend on rho; the solver ties
the nodes to rho by an optimization barrier so that XLA cannot hoist it out of
the step loop (it did, holding several M x M copies where the nodes fit in a
block or two): every right-hand side recomputes it in blocks, in O(M block)
memory.

The right-hand sides are timed through the solver's field classes, which
`meanfield.extend` exposes (`SphereZonalField`, `SphereGeneralField`, as
tests/test_density_sphere.py does): the public solve reports only whole solves.

    python benchmarks/sphere_harmonics.py [--L 128] [--tols 1e-8 1e-10]
        [--Ls 16 32 64 128] [--general-Ls 8 12 16 24 32] [--out DIR]
    python benchmarks/sphere_harmonics.py --replot FILE.json [--out DIR]
"""

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)  # the solver runs in float64 anyway

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield.extend import (  # noqa: E402
    SPHERE_BLOCK_ELEMENTS,
    SphereGeneralField,
    SphereZonalField,
    manifest,
    savefig_atomic,
    scaled_funk_hecke,
    sphere_synthesis,
    write_manifest,
)

BETA, SIGMA, T1 = 9.0, 0.1, 20.0
SAVES = (0.0, 5.0, 10.0, 20.0)
DEGREES = 8  # the perturbation's highest degree
STAGES = 6  # new right-hand sides per Tsit5 step (first same as last)


def perturbation(seed: int) -> np.ndarray:
    """Coefficients (DEGREES + 1, DEGREES + 1) [l, m] of a real f, degrees 1..8.

    Scaled to RMS 1 over the sphere: (1 / 4 pi) sum_l (|c_l0|^2 + 2 sum_m>0
    |c_lm|^2) = 1 (Parseval with orthonormal Y_lm; m < 0 by symmetry).
    """
    rng = np.random.default_rng(seed)
    n = DEGREES + 1
    c = np.tril(rng.normal(size=(n, n)) + 1j * rng.normal(size=(n, n)))
    c[:, 0] = c[:, 0].real
    c[0] = 0
    power = np.sum(np.abs(c[:, 0]) ** 2) + 2 * np.sum(np.abs(c[:, 1:]) ** 2)
    return c / np.sqrt(power / (4 * np.pi))


def initial_coefficients(L: int, eps: float, seed: int) -> np.ndarray:
    """(1 + eps f) / (4 pi) as coefficients (L, L): the same function for L > 8.

    (L = 8 keeps f's degrees < 8: its projection, enough for timing.)
    """
    a = np.zeros((L, L), complex)
    n = min(L, DEGREES + 1)
    a[:n, :n] = eps * perturbation(seed)[:n, :n]
    a[0, 0] = 0
    a /= 4 * np.pi
    a[0, 0] = 1 / np.sqrt(4 * np.pi)  # mass sqrt(4 pi) a_00 = 1
    return a


def initial_density(L: int, eps: float, seed: int) -> np.ndarray:
    grid = mf.density.sphere_grid(L)
    return np.asarray(
        sphere_synthesis(grid, jnp.asarray(initial_coefficients(L, eps, seed)))
    )


def timed(call, repeats: int):
    """(last result, record): first call, then the median of `repeats` calls."""
    start = time.perf_counter()
    result = call()
    first = time.perf_counter() - start
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = call()
        walls.append(time.perf_counter() - start)
    wall = float(np.median(walls)) if walls else first
    # The first call compiles unless an earlier call compiled the same program.
    return result, dict(wall_s=wall, walls_s=walls, first_call_s=first)


def per_call(fn, *args, budget: float = 0.3, repeats: int = 7) -> float:
    """Median seconds of one jitted call, each sample long enough to time."""
    jax.block_until_ready(fn(*args))  # compile
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    once = time.perf_counter() - start
    number = max(1, int(budget / max(once, 1e-6)))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / number)
    return float(np.median(samples))


def on_device(grid):
    """The grid with its NumPy tables as JAX arrays: a jitted call given the
    NumPy grid would copy its tables (50 MB at L = 128) to the device each call."""
    return jax.tree.map(
        lambda v: jnp.asarray(v) if isinstance(v, np.ndarray) else v, grid
    )


def summary(sol) -> dict:
    reached = np.isfinite(sol.ts)
    return dict(
        status=sol.status,
        steps=sol.num_steps,
        mass_error=float(np.max(np.abs(sol.mass[reached] - 1))),
        lowest=sol.lowest,
    )


def zonal_solve(L, tol, args, saveat=SAVES, t1=T1):
    rho0 = initial_density(L, args.eps, args.seed)
    return lambda: mf.density.simulate_sphere(
        rho0, t1, beta=BETA, sigma=SIGMA, saveat=saveat, rtol=tol, atol=tol
    )


def max_error(sol, ref) -> list[float]:
    """max |rho - rho_ref| / max rho_ref at each save after t = 0, on ref's grid."""
    L, Lr = sol.L, ref.L
    a = np.zeros((len(SAVES), Lr, Lr), complex)
    a[:, :L, :L] = sol.coeffs
    rho = np.asarray(sphere_synthesis(ref.grid, jnp.asarray(a)))
    err = np.max(np.abs(rho - ref.rho), axis=(-2, -1)) / np.max(ref.rho, axis=(-2, -1))
    return [float(e) for e in err[1:]]


def target(args) -> dict:
    start = time.perf_counter()
    ref = zonal_solve(args.reference_L, args.reference_tol, args)()
    reference = dict(
        L=args.reference_L,
        tol=args.reference_tol,
        wall_s=time.perf_counter() - start,  # one call, compile included
        **summary(ref),
    )
    print(f"reference {reference}", flush=True)
    rows = []
    for tol in args.tols:
        sol, rec = timed(zonal_solve(args.L, tol, args), args.repeats)
        row = dict(L=args.L, tol=tol, **rec, **summary(sol))
        row["error"] = dict(zip(("t5", "t10", "t20"), max_error(sol, ref), strict=True))
        print(
            f"target L={args.L} tol={tol:g}: {row['wall_s']:.2f} s "
            f"(first call {row['first_call_s']:.1f} s), {row['steps']} steps, "
            f"{row['status']}, mass {row['mass_error']:.1e}, lowest "
            f"{row['lowest']:.4f}, error {row['error']}",
            flush=True,
        )
        rows.append(row)
    return dict(reference=reference, rows=rows)


def loglog_fit(x, y):
    """(prefactor, exponent) of y = a x^p by least squares in logs."""
    p, log_a = np.polyfit(np.log(x), np.log(y), 1)
    return float(np.exp(log_a)), float(p)


def zonal_scaling(args, done: dict) -> dict:
    rows = []
    for L in args.Ls:
        if L == args.L and 1e-8 in done:  # the target's run at tol 1e-8
            rec, steps, status = done[1e-8], done[1e-8]["steps"], done[1e-8]["status"]
            rec = {k: rec[k] for k in ("wall_s", "walls_s", "first_call_s")}
        else:
            sol, rec = timed(zonal_solve(L, 1e-8, args), args.repeats)
            steps, status = sol.num_steps, sol.status
        grid = mf.density.sphere_grid(L)
        model = SphereZonalField(
            jnp.asarray(scaled_funk_hecke(np.arange(L), BETA, 3)),
            jnp.asarray(1 / BETA),
            True,
        )
        a = jnp.asarray(initial_coefficients(L, args.eps, args.seed))
        rate = eqx.filter_jit(lambda m, g, a: m.rate(g, a))
        row = dict(
            L=L,
            M=grid.nlat * grid.nlon,
            steps=steps,
            status=status,
            **rec,
            step_s=rec["wall_s"] / steps,
            rhs_s=per_call(rate, model, on_device(grid), a),
        )
        print(
            f"zonal L={L}: {row['step_s'] * 1e3:.3g} ms/step ({steps} steps), "
            f"{row['rhs_s'] * 1e3:.3g} ms/rhs",
            flush=True,
        )
        rows.append(row)
    Ls = np.array([r["L"] for r in rows], float)
    fits = {}
    for key in ("step_s", "rhs_s"):
        y = np.array([r[key] for r in rows])
        big = Ls >= 32
        fits[key] = dict(
            all=loglog_fit(Ls, y)[1],
            from_32=loglog_fit(Ls[big], y[big])[1] if big.sum() >= 2 else None,
        )
    return dict(rows=rows, fits=fits)


def general_matrices(qk_norm: float, seed: int):
    rng = np.random.default_rng(seed)
    Q, K = rng.normal(size=(2, 3, 3))
    scale = np.sqrt(qk_norm / np.linalg.norm(K.T @ Q, 2))
    return scale * Q, scale * K, np.eye(3)


def general_scaling(args) -> dict:
    Q, K, V = general_matrices(args.qk_norm, args.seed)
    attn = mf.SoftmaxAttention(V, Q=Q, K=K)
    velocity = jax.jit(lambda att, mu: att.velocity(mu))
    rows = []
    for L in args.general_Ls:
        grid = mf.density.sphere_grid(L)
        M = grid.nlat * grid.nlon
        rho0 = initial_density(L, args.eps, args.seed)
        sol, rec = timed(
            lambda rho0=rho0: mf.density.simulate_sphere(
                rho0,
                args.general_t1,
                Q=Q,
                K=K,
                V=V,
                sigma=SIGMA,
                rtol=args.general_tol,
                atol=args.general_tol,
            ),
            args.repeats,
        )
        block = int(max(1, min(M, SPHERE_BLOCK_ELEMENTS // M)))  # as simulate_sphere
        model = SphereGeneralField(
            jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V), True, block
        )
        a = jnp.asarray(initial_coefficients(L, args.eps, args.seed))
        rate = eqx.filter_jit(lambda m, g, a: m.rate(g, a))
        w = grid.weights * rho0.reshape(-1)
        mu = mf.Particles(grid.nodes, w / w.sum())
        # Check: the solver's field at the nodes is the particle field (tangent parts).
        x = np.asarray(grid.nodes)
        field = eqx.filter_jit(lambda m, g, r: m.field(g, r))
        ours = np.array(field(model, grid, rho0))
        theirs = np.array(velocity(attn, mu))
        ours -= np.sum(ours * x, 1, keepdims=True) * x
        theirs -= np.sum(theirs * x, 1, keepdims=True) * x
        row = dict(
            L=L,
            M=M,
            steps=sol.num_steps,
            status=sol.status,
            **rec,
            reached_t1=bool(np.isfinite(sol.ts[-1])),
            step_s=rec["wall_s"] / sol.num_steps,
            rhs_s=per_call(rate, model, on_device(grid), a),
            particle_field_s=per_call(velocity, attn, mu),
            field_difference=float(np.max(np.abs(ours - theirs))),
        )
        print(
            f"general L={L} M={M}: {row['step_s'] * 1e3:.3g} ms/step "
            f"({row['steps']} steps, {row['status']}), {row['rhs_s'] * 1e3:.3g} "
            f"ms/rhs, particle field {row['particle_field_s'] * 1e3:.3g} ms, "
            f"|field diff| {row['field_difference']:.1e}",
            flush=True,
        )
        rows.append(row)
    Ms = np.array([r["M"] for r in rows], float)
    fits = {
        key: loglog_fit(Ms, [r[key] for r in rows])[1]
        for key in ("step_s", "rhs_s", "particle_field_s")
    }
    return dict(
        Q=Q, K=K, V=V, qk_norm=float(np.linalg.norm(K.T @ Q, 2)), rows=rows, fits=fits
    )


def run(args) -> dict:
    result = dict(target=target(args))
    done = {r["tol"]: r for r in result["target"]["rows"]}
    result["zonal"] = zonal_scaling(args, done)
    print(f"zonal fits {result['zonal']['fits']}", flush=True)
    result["general"] = general_scaling(args)
    print(f"general fits {result['general']['fits']}", flush=True)
    return result


def plot(result, path):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.3), layout="constrained")
    zonal = result["zonal"]
    Ls = np.array([r["L"] for r in zonal["rows"]], float)
    step = np.array([r["step_s"] for r in zonal["rows"]])
    rhs = np.array([r["rhs_s"] for r in zonal["rows"]])
    fits = zonal["fits"]
    ax1.plot(
        Ls,
        step,
        "-o",
        label=f"per step (Lawson-Tsit5), ~L^{fits['step_s']['from_32']:.2f} (L ≥ 32)",
    )
    ax1.plot(
        Ls,
        STAGES * rhs,
        "--s",
        label=f"{STAGES} x right-hand side, ~L^{fits['rhs_s']['from_32']:.2f} (L ≥ 32)",
    )
    ax1.plot(Ls, step[-1] * (Ls / Ls[-1]) ** 3, ":", color="gray", label="∝ L³")
    text = "\n".join(
        f"L = {r['L']}, t1 = {T1:g}, tol {r['tol']:g}: {r['wall_s']:.1f} s, "
        f"{r['steps']} steps, error(t = 20) {r['error']['t20']:.1e}"
        for r in result["target"]["rows"]
    )
    ax1.text(0.98, 0.03, text, transform=ax1.transAxes, ha="right", fontsize="small")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("band limit L")
    ax1.set_ylabel("seconds")
    ax1.set_title(f"zonal path (A = {BETA:g} I, σ = {SIGMA:g})", fontsize="medium")
    ax1.legend(fontsize="small")

    gen = result["general"]
    Ms = np.array([r["M"] for r in gen["rows"]], float)
    fits = gen["fits"]
    for key, style, name in (
        ("step_s", "-o", "density, per step"),
        ("rhs_s", "--s", "density, right-hand side"),
        ("particle_field_s", "-^", "particle field, n = M tokens"),
    ):
        ax2.plot(
            Ms,
            [r[key] for r in gen["rows"]],
            style,
            label=f"{name}, ~M^{fits[key]:.2f}",
        )
    top = gen["rows"][-1]["particle_field_s"]
    ax2.plot(Ms, top * (Ms / Ms[-1]) ** 2, ":", color="gray", label="∝ M²")
    ax2.set_xscale("log")
    ax2.set_xticks(Ms, [f"{m:g}" for m in Ms])
    ax2.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax2.set_yscale("log")
    ax2.set_xlabel("nodes M = ceil(3L/2)·3L (tokens n = M)")
    ax2.set_ylabel("seconds")
    ax2.set_title(
        f"general Q, K (|QᵀK| = {gen['qk_norm']:.3g}), V = I", fontsize="medium"
    )
    ax2.legend(fontsize="small")
    platform, cpus = result["manifest"]["device"]["platform"], result["load"]["cpus"]
    fig.suptitle(f"simulate_sphere on S², {platform} ({cpus} cores)")
    savefig_atomic(fig, path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--L", type=int, default=128, help="band limit of the target")
    parser.add_argument("--tols", type=float, nargs="+", default=[1e-8, 1e-10])
    parser.add_argument("--reference-L", type=int, default=160)
    parser.add_argument("--reference-tol", type=float, default=1e-11)
    parser.add_argument("--eps", type=float, default=1e-3, help="perturbation (RMS)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls")
    parser.add_argument("--Ls", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument(
        "--general-Ls", type=int, nargs="+", default=[8, 12, 16, 24, 32]
    )
    parser.add_argument("--qk-norm", type=float, default=4.0, help="|Q^T K|_2")
    parser.add_argument("--general-t1", type=float, default=1.0)
    parser.add_argument(
        "--general-tol",
        type=float,
        default=1e-10,
        help="rtol = atol of the general solves (tight: more steps to divide by)",
    )
    parser.add_argument(
        "--out",
        default="out/sphere_harmonics",
        help="output folder (default out/sphere_harmonics; the committed results "
        "are benchmarks/results)",
    )
    parser.add_argument(
        "--replot",
        metavar="FILE.json",
        help="redraw a results file into --out instead of measuring",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        path = Path(args.replot)
        plot(json.loads(path.read_text()), out / path.with_suffix(".png").name)
        return
    load_before = os.getloadavg()
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout
    start = time.perf_counter()
    result = run(args)
    wall = time.perf_counter() - start
    config = dict(vars(args), beta=BETA, sigma=SIGMA, t1=T1, saveat=SAVES)
    device = jax.devices()[0].platform
    write_manifest(
        out / f"sphere_harmonics_{device}.json",
        dict(
            manifest=manifest(config, args.seed, wall),
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
    plot(
        json.loads((out / f"sphere_harmonics_{device}.json").read_text()),
        out / f"sphere_harmonics_{device}.png",
    )
    print(f"wrote {out}/sphere_harmonics_{device}.{{json,png}} in {wall:.0f} s")


if __name__ == "__main__":
    main()
