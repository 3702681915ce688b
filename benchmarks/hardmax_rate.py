"""How fast finite-beta solutions approach the hardmax one.

Leaders dynamics in continuous depth (the depth limit of Alcalde, Fantuzzi &
Zuazua's layer, arXiv 2407.01602): x_i' = Gamma_mu(x_i) - x_i in R^2 with V = I
and an SPD A, as `mf.Block(attention, mf.FeedForward(-I))`. The hardmax
solution (`HardmaxAttention(I, A=A)`) is the beta -> inf limit of the softmax
ones (`SoftmaxAttention(I, A=beta A)`); Alcalde, Bungert, Riedl & Roith (arXiv
2605.10931) bound their Wasserstein distance on [0, T] by
C (sqrt(log(beta + 1) / beta) e^{CT} + e^{-cT}). For beta on a log grid this
measures

    sup_t max_i |x_i^beta(t) - x_i^inf(t)|                (the worst token)
    sup_t (sum_i w_i |x_i^beta(t) - x_i^inf(t)|^2)^{1/2}  (>= W2 of the measures)

for three initial data (32 tokens with first-choice gaps >= 0.05, 32 uniform
tokens, 512 uniform tokens), fits the log-log slope on 100 <= beta <= 2000
(above the solver floor) and plots both against the shape
sqrt(log(beta + 1) / beta). The hardmax reference is checked against the closed
form x_i = v_i + e^{-t} (x_i(0) - v_i) (every token's first choice v_i is a
leader, so no selection ever switches) and against fixed-step solves at dt and
dt / 2.

    python benchmarks/hardmax_rate.py [--n 32] [--T 3] [--betas 1 ... 1e4] [--out DIR]
"""

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield.extend import manifest, savefig_atomic, write_manifest  # noqa: E402

A = np.array([[1.0, 0.3], [0.3, 0.6]])  # SPD (eigenvalues 1.17, 0.43)
TOL = 1e-10  # rtol = atol of every adaptive solve
FLOOR = 1e3 * TOL  # distances below it are not fitted


def initial_tokens(n, min_gap, seed=0):
    """n tokens in R^2: six on a hexagon (the leaders), the rest inside.

    Inside tokens lie in the disk of radius 0.6, so each first chooses a vertex;
    a token whose two best logits differ by less than `min_gap` is drawn again
    (0: plain uniform draws, near-ties included).
    """
    rng = np.random.default_rng(seed)
    angles = np.pi / 3 * np.arange(6) + 0.2
    x = np.stack([np.cos(angles), np.sin(angles)], 1)
    while x.shape[0] < n:
        r, phi = 0.6 * np.sqrt(rng.uniform()), rng.uniform(0, 2 * np.pi)
        y = np.concatenate([x, [[r * np.cos(phi), r * np.sin(phi)]]])
        top = np.sort(y[-1] @ A @ y.T)
        if top[-1] - top[-2] >= min_gap:
            x = y
    return x


def closed_form(x0, ts):
    """Leaders fixed, every other token straight to its first choice at rate e^{-t}.

    Valid when every first choice is a leader (checked): then no choice switches
    (the comparison <A x, v - y> is linear in x and holds at both ends of the
    segment from x_i(0) to v_i).
    """
    logits = x0 @ A @ x0.T
    choice = np.argmax(logits, axis=1)
    leaders = choice[choice] == choice
    assert np.all(leaders), "a first choice is not a leader: no closed form"
    top = np.sort(logits, axis=1)
    assert np.all(top[:, -1] - top[:, -2] > 1e-8), "tied first choices"
    v = x0[choice]
    return v[None] + (x0 - v)[None] * np.exp(-ts)[:, None, None]


def solve(x0, attn, T, ts, **kw):
    block = mf.Block(attn, mf.FeedForward(-np.eye(2)))
    start = time.perf_counter()
    sol = mf.simulate(mf.Particles(x0), block, T, saveat=ts, max_steps=10**6, **kw)
    x = np.asarray(sol.x)
    wall = time.perf_counter() - start
    assert sol.status == "success", sol.status
    return x, int(sol.num_steps), wall


def distances(x, ref):
    err = np.linalg.norm(x - ref, axis=-1)  # (T, n)
    return float(err.max()), float(np.sqrt((err**2).mean(axis=1)).max())


def fit_slope(betas, values):
    slope, _ = np.polyfit(np.log(betas), np.log(values), 1)
    return float(slope)


def _fmt(slope):
    return "n/a" if slope is None else f"{slope:.2f}"


def plot(runs, fit, path):
    fig, ax = plt.subplots(figsize=(7.2, 4.8), layout="constrained")
    styles = {"separated": ("C0", "-"), "uniform": ("C1", "--"), "many": ("C2", "-.")}
    for name, run in runs.items():
        color, ls = styles[name]
        betas = np.array([r["beta"] for r in run["rows"]])
        sup = np.array([r["sup_max"] for r in run["rows"]])
        mean = np.array([r["sup_mean"] for r in run["rows"]])
        gap = run["reference"]["smallest_initial_gap"]
        ax.loglog(
            betas,
            sup,
            "o",
            color=color,
            ls=ls,
            ms=4,
            label=f"{name} (gap {gap:.0e}): max over tokens, "
            f"slope {_fmt(run['slope_max'])}",
        )
        ax.loglog(
            betas,
            mean,
            "s",
            color=color,
            ls=ls,
            ms=3,
            mfc="none",
            label=f"{name}: root mean square, slope {_fmt(run['slope_mean'])}",
        )
    first = runs["separated"]["rows"][0]
    betas = np.geomspace(
        first["beta"], max(r["beta"] for r in runs["separated"]["rows"])
    )
    shape = np.sqrt(np.log(betas + 1) / betas)
    ax.loglog(
        betas,
        shape * first["sup_max"] / shape[0],
        "k--",
        lw=1,
        label="sqrt(log(β+1)/β), scaled",
    )
    ax.loglog(
        betas, first["sup_max"] * betas[0] / betas, "k:", lw=1, label="1/β, scaled"
    )
    ax.axvspan(*fit, color="0.92", zorder=0, label="fitted range")
    ax.set_xlabel("β")
    ax.set_ylabel("sup over t ≤ T of the distance to hardmax")
    ax.set_title(
        "x' = Γ(x) − x: softmax with βA against hardmax with A", fontsize="medium"
    )
    ax.legend(fontsize="x-small")
    savefig_atomic(fig, path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32, help="tokens")
    parser.add_argument(
        "--n-many", type=int, default=512, help="tokens of the many-token run"
    )
    parser.add_argument("--T", type=float, default=3.0, help="final time")
    parser.add_argument(
        "--betas", type=float, nargs="+", default=list(np.geomspace(1, 1e4, 17))
    )
    parser.add_argument(
        "--fit-from", type=float, default=100.0, help="smallest beta of the fit"
    )
    parser.add_argument(
        "--min-gap",
        type=float,
        default=0.05,
        help="smallest gap of first choices in the separated data",
    )
    parser.add_argument(
        "--fit-to", type=float, default=2000.0, help="largest beta of the fit"
    )
    parser.add_argument("--dt", type=float, default=1e-3, help="fixed-step check")
    parser.add_argument(
        "--out",
        default="out/hardmax_rate",
        help="output folder (default out/hardmax_rate; the committed results are "
        "benchmarks/results)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    ts = np.linspace(0.0, args.T, 61)
    hard = mf.HardmaxAttention(np.eye(2), A=A)
    runs = {}
    configurations = (
        ("separated", args.n, args.min_gap),
        ("uniform", args.n, 0.0),
        ("many", args.n_many, 0.0),
    )
    for name, n, min_gap in configurations:
        x0 = initial_tokens(n, min_gap)
        exact = closed_form(x0, ts)
        ref, steps, wall = solve(x0, hard, args.T, ts, rtol=TOL, atol=TOL)
        fixed = {
            dt: solve(x0, hard, args.T, ts, solver="heun", dt0=dt)[0]
            for dt in (args.dt, args.dt / 2)
        }
        top = np.sort(x0 @ A @ x0.T, axis=1)
        reference = dict(
            smallest_initial_gap=float(np.min(top[:, -1] - top[:, -2])),
            adaptive_vs_closed_form=float(np.abs(ref - exact).max()),
            heun_dt_vs_closed_form=float(np.abs(fixed[args.dt] - exact).max()),
            heun_half_dt_vs_closed_form=float(np.abs(fixed[args.dt / 2] - exact).max()),
            adaptive_steps=steps,
            adaptive_s=wall,
        )
        print(name, reference, flush=True)
        rows = []
        for beta in args.betas:
            soft = mf.SoftmaxAttention(np.eye(2), A=beta * A)
            x, steps, wall = solve(x0, soft, args.T, ts, rtol=TOL, atol=TOL)
            sup_max, sup_mean = distances(x, exact)
            row = dict(
                beta=float(beta),
                sup_max=sup_max,
                sup_mean=sup_mean,
                steps=steps,
                s=wall,
            )
            print(name, row, flush=True)
            rows.append(row)
        betas = np.array([r["beta"] for r in rows])
        slopes = {}
        for key in ("max", "mean"):
            values = np.array([r[f"sup_{key}"] for r in rows])
            # Above the solver floor (~TOL): there the distance is the solves' error.
            big = (betas >= args.fit_from) & (betas <= args.fit_to) & (values > FLOOR)
            slopes[key] = fit_slope(betas[big], values[big]) if big.sum() > 1 else None
        runs[name] = dict(
            n=n,
            min_gap=min_gap,
            x0=x0.tolist(),
            reference=reference,
            slope_max=slopes["max"],
            slope_mean=slopes["mean"],
            rows=rows,
        )
    summary = dict(
        {
            f"slope_{k}_{name}": runs[name][f"slope_{k}"]
            for name in runs
            for k in ("max", "mean")
        },
        fit_betas=[args.fit_from, args.fit_to],
        predicted_shape="sqrt(log(beta+1)/beta): local slope -1/2 + O(1/log beta)",
    )
    wall = time.perf_counter() - start
    print(summary, f"wall {wall:.1f} s", flush=True)
    write_manifest(
        out / "hardmax_rate_cpu.json",
        dict(
            manifest=manifest(vars(args), None, wall),
            setting=dict(
                field="x' = Gamma(x) - x (Block with FeedForward(-I))",
                V="I",
                A=A.tolist(),
                n=args.n,
                T=args.T,
                rtol=TOL,
                atol=TOL,
            ),
            summary=summary,
            runs=runs,
        ),
    )
    plot(runs, (args.fit_from, args.fit_to), out / "hardmax_rate_cpu.png")


if __name__ == "__main__":
    main()
