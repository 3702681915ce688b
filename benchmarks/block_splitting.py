"""Transformer blocks: how `mf.layers` converges to `mf.simulate`, by splitting.

A block x' = Gamma_mu(x) + F(x) (softmax attention and a tanh MLP, n = 7 tokens in
R^3, weighted) is run for depth t1 = 1 with L = 8 .. 256 layers, in R^d and on the
sphere (post-LN), with the Transformer's splitting (an attention step, then a
feed-forward step: "lie") and the symmetric one ("strang", midpoint sub-steps).
The error at t1 is measured against a tight solve of the ODE (Dopri8,
rtol = atol = 1e-12) and its log-log slope fitted. Also times one layer of each
splitting at n = 4096, d = 16 (the second of two calls).

    python benchmarks/block_splitting.py [--out DIR]
"""

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield.extend import Output, device_name, use_agg  # noqa: E402

N, D, P = 7, 3, 5
LS = (8, 16, 32, 64, 128, 256)
SPLITTINGS = ("lie", "strang")
NORMALIZATIONS = (None, "sphere")


def problem(seed: int):
    """(measure, block) of the convergence study."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, D))
    w = rng.dirichlet(np.ones(N))
    V = 0.5 * rng.normal(size=(D, D))
    A = 0.5 * rng.normal(size=(D, D))
    W1, b1 = rng.normal(size=(P, D)), rng.normal(size=P)
    W2, b2 = 0.5 * rng.normal(size=(D, P)) / np.sqrt(P), rng.normal(size=D)
    block = mf.Block(
        mf.SoftmaxAttention(V, A=A), mf.MLP(W1, b1, W2, b2, activation="tanh")
    )
    return mf.Particles(x, w), block


def convergence(seed: int) -> list[dict]:
    mu, block = problem(seed)
    rows = []
    for normalization in NORMALIZATIONS:
        ref = mf.simulate(
            mu,
            block,
            t1=1.0,
            normalization=normalization,
            solver="dopri8",
            rtol=1e-12,
            atol=1e-12,
        ).x[-1]
        for splitting in SPLITTINGS:
            errors = []
            for L in LS:
                sol = mf.layers(
                    mu, block, L, normalization=normalization, splitting=splitting
                )
                errors.append(float(np.max(np.abs(np.asarray(sol.x[-1]) - ref))))
            slope = float(np.polyfit(np.log(LS), np.log(errors), 1)[0])
            rows.append(
                dict(
                    normalization=normalization or "none",
                    splitting=splitting,
                    L=list(LS),
                    max_error=errors,
                    slope=slope,
                )
            )
    return rows


def timing(seed: int, n: int = 4096, d: int = 16, hidden: int = 64) -> dict:
    """Seconds per layer of each splitting (the second of two calls, L = 8)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) / np.sqrt(d)
    block = mf.Block(
        mf.SoftmaxAttention(np.eye(d), A=np.eye(d)),
        mf.MLP(
            rng.normal(size=(hidden, d)) / np.sqrt(d),
            None,
            rng.normal(size=(d, hidden)) / np.sqrt(hidden),
            None,
            activation="gelu",
        ),
    )
    mu = mf.Particles(x)
    out = dict(n=n, d=d, hidden=hidden, L=8)
    for splitting in SPLITTINGS:
        for _ in range(2):
            start = time.perf_counter()
            mf.layers(mu, block, 8, splitting=splitting).x.block_until_ready()
            seconds = time.perf_counter() - start
        out[f"{splitting}_s_per_layer"] = seconds / 8
    return out


def plot(result, output: Output, name: str) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for row in result["convergence"]:
        style = "-" if row["splitting"] == "lie" else "--"
        marker = "o" if row["normalization"] == "none" else "s"
        ax.loglog(
            row["L"],
            row["max_error"],
            style,
            marker=marker,
            label=f"{row['splitting']}, {row['normalization']} "
            f"(slope {row['slope']:.2f})",
        )
    L = np.asarray(LS, float)
    ax.loglog(L, 0.6 / L, ":", color="gray", label="$L^{-1}$")
    ax.loglog(L, 0.1 / L**2, "-.", color="gray", label="$L^{-2}$")
    ax.set_xlabel("layers $L$ (depth $t_1 = 1$)")
    ax.set_ylabel(r"$\max_i |x_i^{L} - x_i(1)|$")
    ax.set_title("Transformer blocks: layers against the ODE")
    ax.legend(fontsize=8)
    fig.tight_layout()
    output.figure(fig, name, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        default="out/block_splitting",
        help="output folder (default out/block_splitting; the committed results "
        "are benchmarks/results, written only when named here)",
    )
    args = parser.parse_args(argv)
    use_agg()
    output = Output(args.out)
    name = f"block_splitting_{device_name()}"
    with output.locked():
        start = time.perf_counter()
        result = dict(convergence=convergence(args.seed), timing=timing(args.seed))
        result["wall_s"] = time.perf_counter() - start
        result["manifest"] = output.describe(dict(vars(args)), args.seed)
        output.json(f"{name}.json", result)
        plot(result, output, f"{name}.png")
    for row in result["convergence"]:
        print(
            f"{row['splitting']:>6} {row['normalization']:>6}: slope "
            f"{row['slope']:.3f}, error at L = {LS[-1]}: {row['max_error'][-1]:.2e}"
        )
    t = result["timing"]
    print(
        f"n = {t['n']}, d = {t['d']}: lie {1e3 * t['lie_s_per_layer']:.1f} ms/layer, "
        f"strang {1e3 * t['strang_s_per_layer']:.1f} ms/layer"
    )


if __name__ == "__main__":
    main()
