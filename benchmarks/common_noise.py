"""Tokens under a common matrix noise: the antipodal phase transition, and n > 2.

Three Monte Carlo studies against `mf.clustering.antipodal_probability`, written
as one JSON file and one figure (docs/math/common-noise.md):

- values: the finite-depth Transformer of Fedorov, Sander, Elie, Marion &
  Lauriere (2026; arXiv 2601.21942), x <- N(x + sqrt(h) G (softmax) x) with
  one standard Gaussian value matrix G per layer shared by the tokens and N the
  normalisation to the unit sphere (sigma^2 / d = 1; L = t1 / h = 4000 layers). Two
  tokens from <x1, x2> = 0, d = 2, 3, 8, over beta: the fraction that end
  antipodal (<x1, x2> < 0 at t1), with its binomial standard error, against the
  scale-function probability and the threshold cosh(2 beta) = d - 2.
- tokens: `mf.simulate_ensemble(..., noise=mf.CommonNoise(sigma), key=k)` on the
  sphere (softmax A = beta I, V = I, Euler-Maruyama), two tokens, d = 2, 3, 8 at
  one sigma, against `antipodal_probability(noise="tokens")`.
- groups: n = 3, 4, 8 tokens uniform on S^{d-1} under the values model: the
  fraction of runs that end as one cluster, as two antipodal groups, or neither
  (`mf.clustering.aligned_groups` on the tokens and on their axis +-x_i).

    python benchmarks/common_noise.py [--out DIR] [--runs 400] [--no-progress]
"""

import argparse
import math
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import jax.random as jr  # noqa: E402
import numpy as np  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield.clustering import (  # noqa: E402
    antipodal_probability,
    antipodal_threshold,
)
from meanfield.extend import Output, device_name, use_agg  # noqa: E402

DIMS = (2, 3, 8)
# Values model: rate sigma^2 / d = 1, so t1 = 40 is 40 units of the noise's clock.
VALUES_T1, VALUES_H = 40.0, 0.01
VALUES_BETAS = {
    2: (0.0, 1.0, 3.0),
    3: (0.0, 0.5, 1.0, 2.0, 4.0),
    8: (0.5, 1.0, 1.5, 2.0, 3.0, 4.0),
}
# Tokens model (mf.CommonNoise): one sigma for every d, so sigma^2 / d varies.
TOKENS_SIGMA, TOKENS_T1, TOKENS_DT = 1.5, 20.0, 0.02
TOKENS_BETAS = (0.5, 1.5, 3.0)
GROUPS_D, GROUPS_NS, GROUPS_BETAS = 3, (3, 4, 8), (0.0, 1.0, 2.0, 4.0)
GROUPS_EPS = 1e-2


def _sphere(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def values_layer_stack(key, x0, beta, *, t1, h):
    """Final tokens (n, d) of the normalised stack with random shared values.

    x_{l+1} = N(x_l + sqrt(h) G_l y_l), y = softmax(beta x x^T) x, G_l a
    standard Gaussian (d, d) matrix: the Euler-Maruyama step of the values model
    with sigma = sqrt(d), i.e. sigma^2 / d = 1 (its Ito drift is the
    normalisation's). sigma only sets the clock: P depends on beta and d alone.
    """
    d = x0.shape[-1]
    scale = math.sqrt(h)

    def layer(x, k):
        y = jax.nn.softmax(beta * x @ x.T, axis=-1) @ x
        g = jr.normal(k, (d, d), x.dtype)
        return _sphere(x + scale * y @ g.T), None

    x, _ = jax.lax.scan(layer, x0, jr.split(key, round(t1 / h)))
    return x


@jax.jit
def _values_runs(keys, x0s, beta):
    run = lambda k, x: values_layer_stack(k, x, beta, t1=VALUES_T1, h=VALUES_H)
    return jax.vmap(run)(keys, x0s)


def _estimate(hits, runs):
    p = hits / runs
    return p, math.sqrt(max(p * (1 - p), 1 / runs) / runs)


def study_values(runs, seed, bar, log):
    rows = []
    for d in DIMS:
        x0 = jnp.zeros((runs, 2, d)).at[:, 0, 0].set(1.0).at[:, 1, 1].set(1.0)
        for beta in VALUES_BETAS[d]:
            start = time.perf_counter()
            keys = jr.split(
                jr.fold_in(jr.key(seed), 1000 * d + round(100 * beta)), runs
            )
            x = np.asarray(_values_runs(keys, x0, beta))
            rho = np.sum(x[:, 0] * x[:, 1], axis=1)
            p, se = _estimate(np.sum(rho < 0), runs)
            theory = float(antipodal_probability(0.0, beta, d=d))
            rows.append(
                dict(
                    d=d,
                    beta=beta,
                    # At cosh(2 beta) = d - 2 exactly, -1 is critical: P = 0, but
                    # the fraction near -1 decays only like t^{-1/2}.
                    critical=bool(abs(math.cosh(2 * beta) - (d - 2)) < 1e-12),
                    runs=runs,
                    fraction=p,
                    se=se,
                    undecided=float(np.mean(np.abs(rho) < 0.99)),
                    theory=theory,
                    z=(p - theory) / se,
                    wall_s=time.perf_counter() - start,
                )
            )
            bar.update()
            log(f"values d={d} beta={beta}: {p:.3f} +- {se:.3f}, theory {theory:.3f}")
    return rows


def _final_tokens(sol):
    """The ensemble's reduce: the tokens at t1, (B, n, d)."""
    return sol.x[:, -1]


def study_tokens(runs, seed, bar, log):
    rows = []
    betas = np.repeat(np.asarray(TOKENS_BETAS), runs)  # member b has beta = betas[b]
    for d in DIMS:
        start = time.perf_counter()
        x0 = jnp.broadcast_to(jnp.eye(d)[:2], (betas.size, 2, d))
        attn = jax.vmap(
            lambda b, d=d: mf.SoftmaxAttention(jnp.eye(d), A=b * jnp.eye(d))
        )(jnp.asarray(betas))
        x = mf.simulate_ensemble(
            jax.vmap(mf.Particles)(x0),
            attn,
            TOKENS_T1,
            noise=mf.CommonNoise(TOKENS_SIGMA),
            key=jr.fold_in(jr.key(seed + 1), d),
            normalization="sphere",
            solver="euler",
            dt0=TOKENS_DT,
            reduce=_final_tokens,
        )
        rho_all = np.einsum("bd,bd->b", np.asarray(x[:, 0]), np.asarray(x[:, 1]))
        wall = time.perf_counter() - start
        for beta in TOKENS_BETAS:
            rho = rho_all[betas == beta]
            p, se = _estimate(np.sum(rho < 0), runs)
            theory = float(
                antipodal_probability(
                    0.0, beta, d=d, sigma=TOKENS_SIGMA, noise="tokens"
                )
            )
            rows.append(
                dict(
                    d=d,
                    beta=beta,
                    sigma=TOKENS_SIGMA,
                    runs=runs,
                    fraction=p,
                    se=se,
                    undecided=float(np.mean(np.abs(rho) < 0.99)),
                    theory=theory,
                    z=(p - theory) / se,
                    wall_s=wall / len(TOKENS_BETAS),
                )
            )
            bar.update()
            log(f"tokens d={d} beta={beta}: {p:.3f} +- {se:.3f}, theory {theory:.3f}")
    return rows


def classify(x, eps=GROUPS_EPS):
    """(one cluster, two antipodal groups) flags for final tokens (B, n, d)."""
    groups = np.asarray(mf.clustering.aligned_groups(x, eps))
    # Fold every token onto the half-space of token 0: antipodal groups become one.
    sign = np.sign(np.einsum("bnd,bd->bn", x, x[:, 0]))
    folded = np.asarray(mf.clustering.aligned_groups(x * sign[..., None], eps))
    return groups == 1, (groups == 2) & (folded == 1)


def study_groups(runs, seed, bar, log):
    rows = []
    d = GROUPS_D
    for n in GROUPS_NS:
        x0 = _sphere(jr.normal(jr.key(seed + 2 + n), (runs, n, d)))
        for beta in GROUPS_BETAS:
            start = time.perf_counter()
            keys = jr.split(
                jr.fold_in(jr.key(seed + 3), 1000 * n + round(100 * beta)), runs
            )
            x = np.asarray(_values_runs(keys, x0, beta))
            one, two = classify(x)
            groups = np.asarray(mf.clustering.aligned_groups(x, GROUPS_EPS))
            rows.append(
                dict(
                    n=n,
                    d=d,
                    beta=beta,
                    runs=runs,
                    one_cluster=float(one.mean()),
                    two_antipodal=float(two.mean()),
                    other=float(1 - one.mean() - two.mean()),
                    se_two=_estimate(two.sum(), runs)[1],
                    three_or_more_groups=float(np.mean(groups >= 3)),
                    wall_s=time.perf_counter() - start,
                )
            )
            bar.update()
            log(
                f"groups n={n} beta={beta}: one {one.mean():.3f}, two antipodal "
                f"{two.mean():.3f}"
            )
    return rows


def plot(result, output, name):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), layout="constrained")
    betas = np.linspace(0, 4.5, 181)
    ax = axes[0]
    for i, d in enumerate(DIMS):
        color = f"C{i}"
        ax.plot(
            betas, antipodal_probability(0.0, betas, d=d), color=color, label=f"d = {d}"
        )
        beta_c = antipodal_threshold(d=d)
        if beta_c > 0:
            ax.axvline(beta_c, color=color, ls=":", lw=1)
        rows = [r for r in result["values"] if r["d"] == d]
        ax.errorbar(
            [r["beta"] for r in rows],
            [r["fraction"] for r in rows],
            yerr=[2 * r["se"] for r in rows],
            fmt="o",
            color=color,
            ms=4,
            capsize=2,
        )
    ax.set_xlabel("β")
    ax.set_ylabel("P(⟨x₁, x₂⟩ → −1) from ⟨x₁, x₂⟩ = 0")
    ax.set_title("random values (Fedorov et al.): theory, Monte Carlo ± 2 SE")
    ax.legend(fontsize="small")
    ax = axes[1]
    for i, d in enumerate(DIMS):
        color = f"C{i}"
        curve = antipodal_probability(
            0.0, betas, d=d, sigma=TOKENS_SIGMA, noise="tokens"
        )
        ax.plot(betas, curve, color=color, label=f"d = {d}")
        rows = [r for r in result["tokens"] if r["d"] == d]
        ax.errorbar(
            [r["beta"] for r in rows],
            [r["fraction"] for r in rows],
            yerr=[2 * r["se"] for r in rows],
            fmt="o",
            color=color,
            ms=4,
            capsize=2,
        )
    ax.set_xlabel("β")
    ax.set_title(f"mf.CommonNoise(σ = {TOKENS_SIGMA}) + softmax drift")
    ax.legend(fontsize="small")
    ax = axes[2]
    for i, n in enumerate(GROUPS_NS):
        rows = [r for r in result["groups"] if r["n"] == n]
        b = [r["beta"] for r in rows]
        ax.errorbar(
            b,
            [r["two_antipodal"] for r in rows],
            yerr=[2 * r["se_two"] for r in rows],
            fmt="o-",
            color=f"C{i}",
            ms=4,
            capsize=2,
            label=f"n = {n}: two antipodal groups",
        )
        ax.plot(
            b,
            [r["one_cluster"] for r in rows],
            "s--",
            color=f"C{i}",
            ms=3,
            label=f"n = {n}: one cluster",
        )
    ax.set_xlabel("β")
    ax.set_ylabel("fraction of runs")
    ax.set_title(f"n tokens uniform on S^{GROUPS_D - 1}, random values")
    ax.legend(fontsize="x-small")
    output.figure(fig, name, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs",
        type=int,
        default=400,
        help="runs per point of the values and groups studies (default 400)",
    )
    parser.add_argument(
        "--token-runs",
        type=int,
        default=128,
        help="runs per point of the mf.CommonNoise study (default 128)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        default="out/common_noise",
        help="output folder (default out/common_noise; the committed results are "
        "benchmarks/results, written only when named here)",
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.token_runs < 1:
        parser.error("--runs and --token-runs must be >= 1")
    from tqdm.auto import tqdm

    use_agg()
    output = Output(args.out, progress=args.progress)
    name = f"common_noise_{device_name()}"
    config = dict(
        vars(args),
        values=dict(
            t1=VALUES_T1, h=VALUES_H, betas=VALUES_BETAS, rho0=0.0, sigma2_over_d=1.0
        ),
        tokens=dict(
            sigma=TOKENS_SIGMA,
            t1=TOKENS_T1,
            dt0=TOKENS_DT,
            solver="euler",
            betas=TOKENS_BETAS,
            rho0=0.0,
        ),
        groups=dict(
            d=GROUPS_D,
            ns=GROUPS_NS,
            betas=GROUPS_BETAS,
            eps=GROUPS_EPS,
            start="uniform",
        ),
    )
    total = sum(len(v) for v in VALUES_BETAS.values()) + len(DIMS) * len(TOKENS_BETAS)
    total += len(GROUPS_NS) * len(GROUPS_BETAS)
    result = {}
    start = time.perf_counter()

    def log(message):
        if args.progress:
            tqdm.write(message, file=sys.stderr)

    with (
        output.locked(),
        tqdm(total=total, disable=not args.progress, file=sys.stderr) as bar,
    ):
        for part, study, runs in (
            ("values", study_values, args.runs),
            ("tokens", study_tokens, args.token_runs),
            ("groups", study_groups, args.runs),
        ):
            t = time.perf_counter()
            result[part] = study(runs, args.seed, bar, log)
            result[f"{part}_wall_s"] = time.perf_counter() - t
        result["wall_s"] = time.perf_counter() - start
        rows = result["values"] + result["tokens"]
        zs = [abs(r["z"]) for r in rows if not r.get("critical")]
        result["max_abs_z"] = max(zs)
        result["manifest"] = output.describe(config, args.seed)
        output.json(f"{name}.json", result)
        plot(result, output, f"{name}.png")
    print(
        f"wall {result['wall_s']:.0f} s (values {result['values_wall_s']:.0f}, tokens "
        f"{result['tokens_wall_s']:.0f}, groups {result['groups_wall_s']:.0f}); "
        f"max |MC - theory| / SE = {result['max_abs_z']:.2f}"
    )


if __name__ == "__main__":
    main()
