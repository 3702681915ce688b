"""How many clusters emerge from the uniform density on S^2, and how they merge.

Bruno, Pasqualotto & Agazzi (ICLR 2025, arXiv 2410.23228) linearise the mean-field
Transformer at the uniform density on S^{d-1}: the degree-l spherical harmonics
grow at `mf.density.growth_rate(l, beta, d=3)`, fastest at l* =
`fastest_mode(beta, d=3)` (their "Gegenbauer rule"), and the clusters that first
form are set by l*; later they merge, metastably, on much longer times.

Here, softmax attention with Q^T K = beta I, V = I on S^2:

- formation (density): `mf.density.simulate_sphere` from the uniform density
  plus white noise of amplitude `--amplitude` (times the uniform density) at the
  nodes of `sphere_grid(L)`, projected on degrees < L (random coefficients in all
  degrees 1..L-1, scaled like white noise), for each beta of `--betas` and
  `--seeds` seeds, without noise (sigma = 0, band limit `--L`) and with noise
  sigma = `--sigma` (band limit `--L-noisy`). At every save time: the maximum,
  the clusters `count_sphere_clusters(rho, level)` at levels 2 and 4 (times the
  uniform density), the fraction of the mass above 4x uniform, and the energy
  in the top tenth of the degrees. A save is read while that fraction is
  <= `--top-max` (the solver's own "unresolved" threshold, 1e-10, is already
  passed at t = 0 by white noise in every degree: it flags an accuracy of
  1e-5, not the 1e-3 that superlevel sets at 2x and 4x uniform need).
  Formation is the first read save at which max rho >= 4x uniform (it then
  stays above); the count at formation is the count at level 2 there (the
  bumps that have emerged, not only those already past 4x). It is compared
  with l* (fits c l*^2, c l*(l*+1) and a power law) and with the expected
  number of local maxima of a random degree-l* harmonic, a quarter of its
  ~(2 / sqrt 3) l*(l*+1) critical points (Cammarota, Marinucci & Wigman).
  (`fastest_mode` is taken at the run's sigma.)
- merging (tokens): for `--merge-betas`, `--tokens` tokens drawn from the
  density at formation by `mf.density.sample_sphere` run with
  `mf.simulate(..., normalization="sphere")` (float32, rtol `--merge-rtol`) to
  `--merge-t1`; `mf.clustering.cluster_counts` at a fixed tolerance
  `--merge-tol` at every save: the staircase of merges, as the plateaus
  (count, first, last time from the uniform state) lasting >= `--plateau`
  times their start, once the count is within 3x the density's.

Writes sphere_clusters_<platform>.json (manifest, then every record), a
figure sphere_clusters.png (counts at formation against beta with l* and the
fit; counts over time, density then tokens) and the animation
sphere_clusters.gif of the density for `--gif-beta`, `--gif-sigma`.

    python benchmarks/sphere_clusters.py [--betas 3 5 9 16 25 40] [--seeds 3]
        [--tokens 10000] [--out DIR]
"""

import argparse
import dataclasses
import os
import shutil
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

# Not exported (yet): the transforms and the band-limit rule.

UNIFORM = 1 / (4 * np.pi)


def top_fraction(coeffs: np.ndarray) -> np.ndarray:
    """Energy in the top tenth of the degrees over the total, shape (T,)."""
    e = np.abs(coeffs) ** 2
    energy = e[..., 0] + 2 * e[..., 1:].sum(-1)
    L = energy.shape[-1]
    return energy[..., L - -(-L // 10) :].sum(-1) / energy.sum(-1)


def initial_density(L: int, seed: int, amplitude: float) -> np.ndarray:
    """Uniform x (1 + amplitude xi), xi white noise at the nodes, projected on l < L.

    The projection (the quadrature `analysis`) keeps ~L^2 of the 4.5 L^2 nodes'
    degrees of freedom, each degree l >= 1 with energy ~ (2l + 1) amplitude^2
    U^2 4 pi / M (white); a_00 is set to the uniform's exactly (mass 1).
    """
    grid = mf.density.sphere_grid(L)
    xi = np.random.default_rng(seed).normal(size=grid.shape)
    a = grid.coefficients(UNIFORM * (1 + amplitude * xi))
    a[0, 0] = 1 / np.sqrt(4 * np.pi)
    return grid.values(a)


def formation_run(beta, sigma, L, seed, args):
    """One density solve and its cluster counts at every read save."""
    rho0 = initial_density(L, seed, args.amplitude)
    ts = np.arange(0, args.t1 + 1e-9, args.dt)
    start = time.perf_counter()
    sol = mf.density.simulate_sphere(rho0, args.t1, beta=beta, sigma=sigma, saveat=ts)
    wall = time.perf_counter() - start
    w = sol.grid.weights.reshape(sol.grid.shape)
    top = top_fraction(sol.coeffs)
    rows = []
    for i in range(ts.size):
        if not np.isfinite(sol.ts[i]) or not top[i] <= args.top_max:
            break
        r = sol.rho[i]
        rows.append(
            dict(
                t=float(ts[i]),
                max=float(r.max() / UNIFORM),
                min=float(r.min() / UNIFORM),
                top=float(top[i]),
                count2=mf.density.count_sphere_clusters(r, 2.0),
                count4=mf.density.count_sphere_clusters(r, 4.0),
                mass4=float(np.sum(w * r * (r > 4 * UNIFORM))),
            )
        )
    formed = [k for k, row in enumerate(rows) if row["max"] >= 4]
    stays = bool(formed) and all(row["max"] >= 4 for row in rows[formed[0] :])
    form = rows[formed[0]] if formed else None
    record = dict(
        beta=beta,
        sigma=sigma,
        L=L,
        seed=seed,
        status=sol.status,
        num_steps=sol.num_steps,
        wall_s=wall,
        read_until=rows[-1]["t"] if rows else None,
        t_form=form["t"] if form else None,
        count_form=form["count2"] if form else None,
        count4_form=form["count4"] if form else None,
        count4_last=rows[-1]["count4"] if rows else None,
        stays_above_4=stays,
        # Seed 0 only, from 3 time units before formation, every other save:
        # the figure's curves, in a results file of tens of kB.
        series=[
            row
            for row in rows[::2]
            if seed == 0 and form is not None and row["t"] >= form["t"] - 3
        ],
    )
    return record, sol, formed[0] if formed else None


def formation(args):
    records, keep = [], {}
    for sigma, L in ((0.0, args.L), (args.sigma, args.L_noisy)):
        for beta in args.betas:
            if L < mf.density.min_band_limit(beta):
                raise SystemExit(f"L = {L} < min_band_limit({beta})")
            lstar = mf.density.fastest_mode(beta, sigma=sigma, d=3)
            for seed in range(args.seeds):
                rec, sol, i_form = formation_run(beta, sigma, L, seed, args)
                rec["lstar"] = int(lstar)
                rec["rate_lstar"] = float(
                    mf.density.growth_rate(lstar, beta, sigma=sigma, d=3)
                )
                records.append(rec)
                print(
                    f"sigma={sigma:g} beta={beta:g} seed={seed}: l*={lstar}, "
                    f"t_form={rec['t_form']}, clusters {rec['count_form']} "
                    f"(4x: {rec['count4_form']}), read to t={rec['read_until']}, "
                    f"{rec['status']}, {rec['wall_s']:.1f} s",
                    flush=True,
                )
                if seed == 0 and i_form is not None:
                    keep[(sigma, beta)] = (sol, i_form)
    return records, keep


def fit_relation(records, sigma):
    """Least-squares c in count = c g(l*) for g = l*^2, l*(l*+1); and a power law."""
    recs = [r for r in records if r["sigma"] == sigma and r["count_form"]]
    lstar = np.array([r["lstar"] for r in recs], float)
    count = np.array([r["count_form"] for r in recs], float)
    out = {}
    for name, g in (("lstar_sq", lstar**2), ("lstar_lstar1", lstar * (lstar + 1))):
        c = float(g @ count / (g @ g))
        resid = count - c * g
        out[name] = dict(c=c, rms_rel=float(np.sqrt(np.mean((resid / count) ** 2))))
    p, log_a = np.polyfit(np.log(lstar), np.log(count), 1)
    out["power"] = dict(a=float(np.exp(log_a)), p=float(p))
    # Expected local maxima of a random degree-l harmonic: a quarter of its
    # ~(2 / sqrt 3) l (l + 1) critical points (Cammarota, Marinucci & Wigman).
    maxima = lstar * (lstar + 1) / (2 * np.sqrt(3))
    out["random_harmonic_maxima"] = dict(
        ratio_mean=float(np.mean(count / maxima)),
        ratio_sd=float(np.std(count / maxima)),
    )
    return out


def merging(keep, args):
    out = []
    for beta in args.merge_betas:
        sol, i_form = keep[(0.0, beta)]
        start = time.perf_counter()
        x0 = mf.density.sample_sphere(
            jr.key(args.merge_seed), sol.rho[i_form], args.tokens
        )
        sample_s = time.perf_counter() - start
        ts = np.concatenate([[0.0], np.geomspace(0.1, args.merge_t1, args.merge_saves)])
        attn = mf.SoftmaxAttention(np.eye(3), A=beta * np.eye(3))
        start = time.perf_counter()
        res = mf.simulate(
            mf.Particles(x0.astype(np.float32)),
            attn,
            args.merge_t1,
            normalization="sphere",
            rtol=args.merge_rtol,
            atol=args.merge_rtol,
            saveat=ts,
        )
        jax.block_until_ready(res.x)
        wall = time.perf_counter() - start
        counts = mf.clustering.cluster_counts(res, tol=args.merge_tol)
        c = counts.counts
        # The staircase: the plateaus (count, first, last save time) that last
        # at least `--plateau` times their start (metastable on a log clock),
        # once the count is within 3x the density's (the tokens have gathered).
        t_abs = counts.ts + float(sol.ts[i_form])
        steps, k = [], 0
        while k < c.size:
            j = k
            while j + 1 < c.size and c[j + 1] == c[k]:
                j += 1
            if t_abs[j] >= (1 + args.plateau) * t_abs[k]:
                steps.append((int(c[k]), float(t_abs[k]), float(t_abs[j])))
            k = j + 1
        n_form = mf.density.count_sphere_clusters(sol.rho[i_form], 2.0)
        steps = [s for s in steps if s[0] <= 3 * n_form]
        rec = dict(
            beta=beta,
            n=args.tokens,
            t_form=float(sol.ts[i_form]),
            density_count_form=n_form,
            status=res.status,
            num_steps=int(res.num_steps),
            sample_s=sample_s,
            wall_s=wall,
            ts=counts.ts,
            counts=c,
            staircase=steps,
        )
        print(
            f"merging beta={beta:g}, n={args.tokens}: {res.status}, "
            f"{res.num_steps} steps, {wall:.0f} s; staircase {steps}",
            flush=True,
        )
        out.append(rec)
    return out


def _plain_ticks(ax, xs, ys):
    """Log axes with plain-number ticks at xs, ys and no minor labels."""
    from matplotlib.ticker import NullFormatter

    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.set_yticks(ys, [f"{y:g}" for y in ys])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot(records, fits, merges, args, path):
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), layout="constrained")
    ax = axes[0]
    for sigma, colour, marker in ((0.0, "C0", "o"), (args.sigma, "C3", "s")):
        recs = [r for r in records if r["sigma"] == sigma and r["count_form"]]
        b = np.array([r["beta"] for r in recs])
        jitter = 1 + 0.03 * (np.array([r["seed"] for r in recs]) - 1)
        ax.plot(
            b * jitter,
            [r["count_form"] for r in recs],
            marker,
            color=colour,
            alpha=0.7,
            label=f"σ = {sigma:g}: clusters at formation",
        )
        betas = sorted(set(b))
        lstar = np.array(
            [mf.density.fastest_mode(x, sigma=sigma, d=3) for x in betas], float
        )
        c = fits[str(sigma)]["lstar_lstar1"]["c"]
        ax.plot(
            betas,
            c * lstar * (lstar + 1),
            "--",
            color=colour,
            label=f"{c:.2f} l*(l*+1)",
        )
        ax.plot(betas, lstar, ":", color=colour, alpha=0.6, label="l*")
        if sigma == 0:
            ax.plot(
                betas,
                lstar * (lstar + 1) / (2 * np.sqrt(3)),
                "-",
                color="k",
                alpha=0.4,
                lw=3,
                label="maxima of a random degree-l* harmonic, l*(l*+1)/(2√3)",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_ticks(ax, args.betas, [2, 3, 5, 10, 20])
    ax.set_xlabel("β")
    ax.set_ylabel("clusters")
    ax.set_title("clusters at formation vs the fastest degree l*", fontsize="medium")
    ax.legend(fontsize="xx-small", loc="upper left")

    ax = axes[1]
    for k, beta in enumerate(args.betas):
        for sigma, style in ((0.0, "-"), (args.sigma, "--")):
            rec = next(r for r in records if r["beta"] == beta and r["sigma"] == sigma)
            s = rec["series"]
            ax.plot(
                [row["t"] for row in s],
                [row["count2"] for row in s],
                style,
                color=f"C{k}",
                label=f"β = {beta:g}" if sigma == 0 else None,
            )
    ax.set_xlabel("t")
    ax.set_ylabel("clusters (ρ > 2 · uniform)")
    ax.set_title(
        f"density, seed 0: σ = 0 (solid, read while resolved), σ = {args.sigma:g} "
        "(dashed)",
        fontsize="small",
    )
    ax.legend(fontsize="x-small", ncol=2)

    ax = axes[2]
    for k, rec in enumerate(merges):
        ax.step(
            np.asarray(rec["ts"]) + rec["t_form"],
            rec["counts"],
            where="post",
            color=f"C{k}",
            label=f"β = {rec['beta']:g}, n = {rec['n']} tokens",
        )
        ax.axhline(rec["density_count_form"], color=f"C{k}", ls=":", alpha=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_ticks(ax, [15, 30, 60, 100, 200, 300], [3, 5, 10, 20, 50, 100, 300])
    ax.set_xlabel("t (from the uniform density)")
    ax.set_ylabel(f"clusters (single linkage, tol {args.merge_tol:g})")
    ax.set_title(
        "merging: tokens from the density at formation\n(dotted: the density's count)",
        fontsize="small",
    )
    ax.legend(fontsize="x-small")
    savefig_atomic(fig, path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--betas", type=float, nargs="+", default=[3, 5, 9, 16, 25, 40])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--L", type=int, default=96, help="band limit, sigma = 0")
    parser.add_argument(
        "--L-noisy", dest="L_noisy", type=int, default=64, help="band limit, noisy"
    )
    parser.add_argument("--sigma", type=float, default=0.1)
    parser.add_argument("--amplitude", type=float, default=1e-3)
    parser.add_argument("--t1", type=float, default=40.0)
    parser.add_argument("--dt", type=float, default=0.25, help="save interval")
    parser.add_argument(
        "--top-max",
        type=float,
        default=1e-6,
        help="read a save while its top-tenth energy fraction is at most this",
    )
    parser.add_argument("--merge-betas", type=float, nargs="*", default=[9, 25])
    parser.add_argument("--tokens", type=int, default=10_000)
    parser.add_argument("--merge-seed", type=int, default=0)
    parser.add_argument("--merge-t1", type=float, default=300.0)
    parser.add_argument("--merge-saves", type=int, default=80)
    parser.add_argument("--merge-rtol", type=float, default=1e-4)
    parser.add_argument("--merge-tol", type=float, default=0.05)
    parser.add_argument(
        "--plateau",
        type=float,
        default=0.25,
        help="a plateau of the staircase lasts >= this fraction of its start time",
    )
    parser.add_argument("--gif-beta", type=float, default=25.0)
    parser.add_argument(
        "--gif-sigma",
        type=float,
        default=0.1,
        help="the GIF's run: 0 or --sigma (0: only ~1 time unit past formation "
        "is resolved)",
    )
    parser.add_argument("--gif-frames", type=int, default=45)
    parser.add_argument(
        "--gif-lead",
        type=float,
        default=6.0,
        help="GIF starts this long before formation",
    )
    parser.add_argument(
        "--out",
        default="out/sphere_clusters",
        help="output folder (default out/sphere_clusters; the committed results "
        "are benchmarks/results, figures docs/gallery)",
    )
    parser.add_argument(
        "--gallery",
        default=None,
        help="folder for sphere_clusters.{png,gif} (default: --out)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gallery = Path(args.gallery) if args.gallery else out
    gallery.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    records, keep = formation(args)
    fits = {str(s): fit_relation(records, s) for s in (0.0, args.sigma)}
    print(f"fits: {fits}", flush=True)
    merges = merging(keep, args)
    wall = time.perf_counter() - start
    device = jax.devices()[0].platform
    summary = [
        dict(
            beta=beta,
            sigma=sigma,
            lstar=next(
                r["lstar"] for r in records if r["beta"] == beta and r["sigma"] == sigma
            ),
            counts=[
                r["count_form"]
                for r in records
                if r["beta"] == beta and r["sigma"] == sigma
            ],
            t_form=[
                r["t_form"]
                for r in records
                if r["beta"] == beta and r["sigma"] == sigma
            ],
        )
        for sigma in (0.0, args.sigma)
        for beta in args.betas
    ]
    write_manifest(
        out / f"sphere_clusters_{device}.json",
        dict(
            manifest=manifest(vars(args), args.merge_seed, wall),
            cpus=os.cpu_count(),
            summary=summary,
            fits=fits,
            formation=records,
            merging=merges,
        ),
    )
    plot(records, fits, merges, args, gallery / "sphere_clusters.png")
    gif_key = (args.gif_sigma, args.gif_beta)
    if gif_key in keep:
        sol, i_form = keep[gif_key]
        rec = next(
            r
            for r in records
            if (r["beta"], r["sigma"], r["seed"]) == (args.gif_beta, args.gif_sigma, 0)
        )
        # Only the read saves (past them the band no longer holds the clusters),
        # from a few e-foldings before formation.
        t = sol.ts
        shown = (t <= rec["read_until"]) & (t >= sol.ts[i_form] - args.gif_lead)
        sol = dataclasses.replace(sol, ts=np.where(shown, t, np.inf))
        gif = gallery / "sphere_clusters.gif"
        tmp = gallery / "sphere_clusters.tmp.gif"
        mf.plotting.animate_sphere_density(
            sol,
            tmp,
            fps=8,
            max_frames=args.gif_frames,
            title=f"β = {args.gif_beta:g}, σ = {args.gif_sigma:g}",
        )
        shutil.move(tmp, gif)
    print(f"wrote {out} and {gallery} in {wall:.0f} s")


if __name__ == "__main__":
    main()
