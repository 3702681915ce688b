"""The phase transition of the noisy density on the circle: both attentions.

For softmax and unnormalised attention (A = beta I, V = I) and each beta, the
order parameter |int e^{i theta} rho| of the stable stationary states along the
noise sigma, swept down from the uniform state and up from the clustered one
(`noise_continuation`, N = 512 cells), beside the whole one-cluster branch with
its unstable part (`cluster_branch`), the linear threshold sigma_c, the Landau
coefficient kappa (kappa < 0: discontinuous), the fold of the branch (the end of
the hysteresis) and, for unnormalised attention, the noise sigma_* at which the
clustered and uniform free energies are equal (Mun & Rosenzweig's K_c =
1 / sigma_*^2, against K_# = 1 / sigma_c^2). Then the beta at which the type
changes, for both attentions, against Mun & Rosenzweig's beta_*
(I_2 / I_1 = 1/2, SciPy). NumPy/SciPy only: no JAX computation.

    python benchmarks/noise_phase.py [--betas 1 2 4 8 16] [--N 512] [--out DIR]
"""

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.optimize import brentq  # noqa: E402
from scipy.special import iv  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield.density import (  # noqa: E402
    cluster_branch,
    coexistence_noise,
    landau_coefficient,
    noise_continuation,
    transition_type,
    type_change_beta,
)
from meanfield.extend import manifest, savefig_atomic, write_manifest  # noqa: E402

ATTENTIONS = ("softmax", "unnormalized")
# sigma / sigma_c: 61 noises from 0.305 to 1.505, none at the degenerate 1.
RATIOS = 0.305 + 0.02 * np.arange(61)
ORDERS = np.linspace(0.005, 0.98, 196)


def sweep(beta, attention, N):
    sigma_c = mf.density.critical_noise(beta, attention)
    start = time.perf_counter()
    run = noise_continuation(beta, RATIOS * sigma_c, attention, N=N)
    sweep_s = time.perf_counter() - start
    start = time.perf_counter()
    branch = cluster_branch(beta, ORDERS, attention, N=N)
    branch_s = time.perf_counter() - start
    kappa = landau_coefficient(beta, attention)
    window = RATIOS[run.bistable]
    row = dict(
        beta=beta,
        attention=attention,
        sigma_c=sigma_c,
        kappa=kappa,
        type=transition_type(beta, attention),
        fold_over_sigma_c=branch.fold / sigma_c,
        hysteresis_over_sigma_c=[float(window.min()), float(window.max())]
        if window.size
        else None,
        order_at_fold=float(ORDERS[np.argmax(branch.sigma)]),
        converged=run.converged and bool(branch.converged.all()),
        max_residual=max(run.residual, float(branch.residual.max())),
        sweep_s=sweep_s,
        branch_s=branch_s,
        from_uniform=run.from_uniform,
        from_cluster=run.from_cluster,
        branch_sigma_over_sigma_c=branch.sigma / sigma_c,
        branch_stable=branch.stable,
    )
    if attention == "unnormalized":
        start = time.perf_counter()
        sigma_star = coexistence_noise(beta, N=N)
        row.update(
            coexistence_over_sigma_c=sigma_star / sigma_c,
            K_c_over_K_sharp=(sigma_c / sigma_star) ** 2,
            coexistence_s=time.perf_counter() - start,
        )
    brief = {k: v for k, v in row.items() if np.ndim(v) == 0 or k.startswith("hyst")}
    print(brief, flush=True)
    return row


def plot(rows, change, path):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), layout="constrained")
    for ax, attention in zip(axes[:2], ATTENTIONS, strict=True):
        for i, row in enumerate(r for r in rows if r["attention"] == attention):
            color = f"C{i}"
            stable = np.asarray(row["branch_stable"])
            x = np.asarray(row["branch_sigma_over_sigma_c"])
            ax.plot(
                np.where(stable, np.nan, x), ORDERS, color=color, ls=":", lw=1
            )  # the unstable part of the branch
            ax.plot(
                RATIOS,
                row["from_cluster"],
                color=color,
                lw=1.5,
                label=f"β = {row['beta']:g} ({row['type']})",
            )
            ax.plot(
                RATIOS, row["from_uniform"], color=color, ls="none", marker="o", ms=2.5
            )
            if "coexistence_over_sigma_c" in row and row["type"] == "discontinuous":
                ax.axvline(
                    row["coexistence_over_sigma_c"], color=color, lw=0.8, ls="--"
                )
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("σ / σ_c(β)")
        ax.set_ylabel("order parameter |∫ e^{iθ} ρ|")
        ax.set_title(
            f"{attention}: line from the cluster (σ up), dots from uniform (σ down),"
            "\ndotted: unstable branch; black: σ_c"
            + ("; dashed: equal free energies" if attention == "unnormalized" else ""),
            fontsize="small",
        )
        ax.legend(fontsize="small")
        ax.set_xlim(RATIOS[0], RATIOS[-1])
    ax = axes[2]
    betas = np.geomspace(0.1, 100, 300)
    for attention in ATTENTIONS:
        ax.semilogx(
            betas, [landau_coefficient(b, attention) for b in betas], label=attention
        )
    ax.axhline(0, color="k", lw=0.8)
    ax.axvline(
        change["unnormalized"],
        color="C1",
        ls="--",
        lw=0.8,
        label=f"β_* = {change['unnormalized']:.6f}",
    )
    ax.set_ylim(-2, 1)
    ax.set_xlabel("β")
    ax.set_ylabel("κ: σ_c²/σ² = 1 + κ r² + O(r⁴)")
    ax.set_title("κ < 0: discontinuous (subcritical)", fontsize="small")
    ax.legend(fontsize="small")
    savefig_atomic(fig, path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--betas", type=float, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--N", type=int, default=512, help="cells")
    parser.add_argument(
        "--out",
        default="out/noise_phase",
        help="output folder (default out/noise_phase; the committed results are "
        "benchmarks/results)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows = [sweep(b, a, args.N) for a in ATTENTIONS for b in args.betas]
    change = {a: type_change_beta(a) for a in ATTENTIONS}
    beta_star = brentq(lambda b: iv(2, b) / iv(1, b) - 0.5, 1.0, 5.0, xtol=1e-14)
    summary = dict(
        type_change_beta=change,
        mun_rosenzweig_beta_star=beta_star,
        type_change_minus_beta_star=change["unnormalized"] - beta_star,
        softmax_kappa_times_beta_at_1000=landau_coefficient(1000.0) * 1000.0,
    )
    wall = time.perf_counter() - start
    print(summary, f"wall {wall:.1f} s", flush=True)
    write_manifest(
        out / "noise_phase_cpu.json",
        dict(manifest=manifest(vars(args), None, wall), summary=summary, rows=rows),
    )
    plot(rows, change, out / "noise_phase_cpu.png")


if __name__ == "__main__":
    main()
