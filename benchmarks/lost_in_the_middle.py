"""Lost in the middle: causal ALiBi dynamics on S^1 and the U-shaped retrieval profile.

The experiment of Duerinckx, Geshkovski & Rossi (arXiv 2605.09213), with their code
(github.com/borjanG/2026-lost-in-the-middle) beside meanfield on the same data:

- trajectories: n = 64 tokens on S^1 in 4 clusters (their "clusters" data, seed 17),
  beta = 1, ALiBi slope lambda = 1 (discrete slope lambda / n), t <= 10. Their
  model (the ALiBi weights normalised, the kernel e^{beta cos} not, each token
  left out of its own sum) is `mf.UnnormalizedALiBiAttention(beta I, A=beta I,
  slope=lambda, include_self=False)`: meanfield integrates it with its default
  solve (Tsit5, rtol = atol = 1e-6) and a tight reference (Dopri8,
  rtol = atol = 1e-12); their script integrates it by RK4 with dt = 0.0025, and an
  independent vectorised form of their angle field is solved at the tight
  tolerance as a second reference. Every solve is compared with meanfield's tight
  one. The softmax-normalised ALiBi of a standard Transformer
  (`mf.ALiBiAttention`) is run on the same data, and its distance to their model
  reported apart.
- retrieval profile S_t(sigma) = sum_k omega_k g_k(t, 1; sigma) at t = 1, M = 8:
  their closed form (`profile_value`) against the linear response of the
  meanfield flow of their model, rings of equispaced angles at n_pos positions
  displaced by eps sin(k phi) (reverse-mode derivative of `mf.simulate`).

meanfield times are the second of two identical calls (the first compiles); the
authors RK4 is timed once (NumPy, no compilation).

    python benchmarks/lost_in_the_middle.py [--authors PATH] [--out DIR] [--smoke]
"""

import argparse
import math
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import diffrax as dfx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield.extend import manifest, savefig_atomic, write_manifest  # noqa: E402


def _warm(call):
    """(result, seconds) of the second of two calls: the first compiles."""
    jax.block_until_ready(call())
    start = time.perf_counter()
    result = jax.block_until_ready(call())
    return result, time.perf_counter() - start


def _wrap(a):
    """Angles to (-pi, pi]."""
    return np.angle(np.exp(1j * np.asarray(a)))


def _circle(theta):
    return jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=-1)


def _angles(x):
    return np.arctan2(np.asarray(x)[..., 1], np.asarray(x)[..., 0])


def clusters(n, seed):
    """Their "clusters" data: 4 groups of consecutive tokens, centres 0.1 pi..1.9 pi."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(4), math.ceil(n / 4))[:n]
    centres = np.linspace(0.1, 1.9, 4) * np.pi
    return np.mod(centres[labels] + rng.normal(0.0, 0.075, n), 2 * np.pi), labels


def authors_field(beta, lam, n):
    """Their model, vectorised: theta_i' = sum_{j<i} W_ij K'(theta_i - theta_j).

    K(u) = e^{beta cos u}, W_ij = e^{-lam (i - j) / n} / sum_{j' < i} (same).
    """
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    w = np.where(j < i, np.exp(-lam * (i - j) / n), 0.0)
    w = jnp.asarray(w / np.maximum(w.sum(1, keepdims=True), 1e-300))

    def field(t, theta, args):
        u = theta[:, None] - theta[None, :]
        return jnp.sum(w * (-beta * jnp.sin(u) * jnp.exp(beta * jnp.cos(u))), axis=1)

    return field


def authors_model(beta, lam, include_self=False):
    """Their model in meanfield: ALiBi weights normalised, kernel e^{beta cos} not.

    Their tokens leave themselves out (include_self=False). The rings of the
    retrieval profile discretise the continuum, where a ring at s sees the
    positions s' <= s: the right-endpoint sum includes its own ring.
    """
    return mf.UnnormalizedALiBiAttention(
        beta * np.eye(2), A=beta * np.eye(2), slope=lam, include_self=include_self
    )


def trajectories(args, authors):
    """The particle runs: meanfield default/tight, their RK4, their model tight."""
    n, beta, lam, t1 = args.n, 1.0, 1.0, 10.0
    theta0, labels = clusters(n, 17)
    ts = np.linspace(0.0, t1, 41)
    s = np.arange(n) / n  # s_i = i / n: slope lam per unit of s is lam / n per token
    attn = authors_model(beta, lam)
    mu = mf.MaskedParticles(_circle(jnp.asarray(theta0)), s)

    def run(field=attn, **kw):
        return mf.simulate(mu, field, t1, saveat=ts, normalization="sphere", **kw)

    rows = {}
    sol_ref, t_ref = _warm(lambda: run(solver="dopri8", rtol=1e-12, atol=1e-12))
    sol_def, t_def = _warm(lambda: run())
    ref = _angles(sol_ref.x)
    model = "their model (mf.UnnormalizedALiBiAttention, include_self=False)"
    rows["meanfield_default"] = dict(
        model=model,
        solver="tsit5 rtol=atol=1e-6",
        max_error_vs_tight=float(np.abs(_wrap(_angles(sol_def.x) - ref)).max()),
        wall_s=t_def,
        status=str(sol_def.status),
    )
    rows["meanfield_tight"] = dict(
        model=model,
        solver="dopri8 rtol=atol=1e-12",
        max_error_vs_tight=0.0,
        wall_s=t_ref,
        status=str(sol_ref.status),
    )
    softmax = mf.ALiBiAttention(np.eye(2), A=beta * np.eye(2), slope=lam)
    sol_soft, t_soft = _warm(lambda: run(softmax))

    # Their model, tight: Dopri8 at 1e-12 on the vectorised field.
    field = authors_field(beta, lam, n)
    solve = jax.jit(
        lambda y0: (
            dfx.diffeqsolve(
                dfx.ODETerm(field),
                dfx.Dopri8(),
                0.0,
                t1,
                None,
                y0,
                saveat=dfx.SaveAt(ts=jnp.asarray(ts)),
                stepsize_controller=dfx.PIDController(rtol=1e-12, atol=1e-12),
                max_steps=100_000,
            ).ys
        )
    )
    authors_ref, t_authors_ref = _warm(lambda: solve(jnp.asarray(theta0)))
    authors_ref = np.asarray(authors_ref)
    rows["angle_field_tight"] = dict(
        model="their angle field, written independently (vectorised JAX)",
        solver="diffrax dopri8 rtol=atol=1e-12",
        max_error_vs_tight=float(np.abs(_wrap(authors_ref - ref)).max()),
        wall_s=t_authors_ref,
    )
    out = dict(ts=ts, theta0=theta0, labels=labels, mf=ref, authors_ref=authors_ref)
    if authors is not None:
        dt = 0.0025
        start = time.perf_counter()
        times, hist, _, labels_p = authors.simulate(
            n_tokens=n,
            beta=beta,
            lam=lam,
            t_max=t1,
            dt=dt,
            seed=17,
            initial_mode="clusters",
        )
        t_authors = time.perf_counter() - start
        assert np.array_equal(hist[0], theta0), "their data differs from ours"
        stride = round((ts[1] - ts[0]) / dt)
        hist = hist[::stride]
        rows["authors_rk4"] = dict(
            model="their model (their script)",
            solver=f"their RK4, dt={dt}",
            max_error_vs_tight=float(np.abs(_wrap(hist - ref)).max()),
            wall_s=t_authors,
        )
        out["authors"] = hist
    rows["softmax_alibi"] = dict(
        model="softmax ALiBi of a Transformer (mf.ALiBiAttention, V = I)",
        solver="tsit5 rtol=atol=1e-6",
        max_distance_to_their_model=float(
            np.abs(_wrap(_angles(sol_soft.x) - ref)).max()
        ),
        wall_s=t_soft,
    )
    out["softmax"] = _angles(sol_soft.x)
    return rows, out


def retrieval(args, authors):
    """S_t(sigma): their closed form against the linear response of meanfield."""
    beta, lam, t1, m_bins = 1.0, 1.0, 1.0, 8.0
    n_pos, n_ring, modes = args.n_pos, 12, 5
    phi = 2 * np.pi * np.arange(n_ring) / n_ring
    s = np.repeat(np.arange(1, n_pos + 1) / n_pos, n_ring)
    ks = np.arange(1, modes + 1)
    basis = jnp.asarray(np.sin(ks[:, None] * phi[None, :]))  # (modes, n_ring)
    attn = authors_model(beta, lam, include_self=True)

    def response(theta):
        # The sin(k phi) coefficients of the last ring's displacement at t1. The
        # uniform state is stationary, so a fixed step resolves the linearisation
        # (an adaptive controller would see a zero error and take one step).
        x0 = _circle(theta)
        sol = mf.simulate(
            mf.MaskedParticles(x0, s),
            attn,
            t1,
            saveat=[t1],
            normalization="sphere",
            solver="dopri8",
            dt0=t1 / 20,
        )
        a, b = x0[-n_ring:], sol.x[-1, -n_ring:]
        shift = jnp.arctan2(a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0], jnp.sum(a * b, -1))
        return (2 / n_ring) * basis @ shift

    jac = jax.jit(jax.jacrev(response))
    jac_theta, wall = _warm(lambda: jac(jnp.asarray(np.tile(phi, n_pos))))
    jac_theta = np.asarray(jac_theta).reshape(modes, n_pos, n_ring)
    # g_k(t, 1; sigma_j) = n_pos c / eps: one ring is a slice 1 / n_pos of density.
    g = n_pos * np.einsum("kjm,km->kj", jac_theta, np.asarray(basis))[:, :-1]
    omega = np.exp(-0.5 * (np.pi * ks / m_bins) ** 2)
    sigma = np.arange(1, n_pos) / n_pos
    rows = dict(
        t=t1,
        beta=beta,
        lam=lam,
        M=m_bins,
        n_pos=n_pos,
        n_ring=n_ring,
        modes=modes,
        meanfield_wall_s=wall,
        meanfield_argmin=float(sigma[np.argmin(omega @ g)]),
    )
    curves = dict(sigma=sigma, meanfield=omega @ g)
    if authors is not None:
        u = authors.numerology
        fine = np.linspace(0.005, 0.995, 199)
        start = time.perf_counter()
        closed = np.array(
            [u.profile_value(x, beta, t1, lam, m_bins, 20) for x in sigma]
        )
        rows["authors_wall_s"] = time.perf_counter() - start
        curves["authors"] = closed
        curves["fine"] = fine
        curves["authors_fine"] = [
            u.profile_value(x, beta, t1, lam, m_bins, 20) for x in fine
        ]
        rel = np.abs(omega @ g - closed) / closed
        rows["max_rel_diff"] = float(rel.max())
        rows["max_rel_diff_sigma_ge_0.1"] = float(rel[sigma >= 0.1].max())
        rows["authors_argmin"] = float(fine[np.argmin(curves["authors_fine"])])
        rows["t_crit_authors"] = u.t_crit(beta, lam, m_bins, 20)
    return rows, curves


class _Authors:
    """Their two scripts, imported from a checkout (their code, unmodified)."""

    def __init__(self, path):
        path = Path(path)
        sys.path.insert(0, str(path if path.is_dir() else path.parent))
        import generate_alibi_particle_circle_dynamics as particles
        import generate_u_shape_numerology_data as numerology

        # Importing their particle script sets text.usetex (needs a LaTeX install).
        plt.rcParams["text.usetex"] = False
        self.simulate = particles.simulate
        self.numerology = numerology


def plot(traj, curves, path):
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    ts, colors = traj["ts"], plt.get_cmap("tab10")(traj["labels"])
    ax = axes[0]
    for i in range(traj["mf"].shape[1]):
        ax.plot(
            ts, np.unwrap(np.mod(traj["mf"][:, i], 2 * np.pi)), color=colors[i], lw=0.8
        )
    ax.set(
        xlabel="t",
        ylabel=r"$\theta_i(t)$",
        title="meanfield: mf.UnnormalizedALiBiAttention",
    )
    ax = axes[1]
    theirs = traj.get("authors", traj["authors_ref"])
    for i in range(theirs.shape[1]):
        ax.plot(ts, np.unwrap(np.mod(theirs[:, i], 2 * np.pi)), color=colors[i], lw=0.8)
    ax.set(xlabel="t", title="their model (their RK4)")
    ax = axes[2]
    if "authors_fine" in curves:
        ax.plot(
            curves["fine"], curves["authors_fine"], "k-", lw=1.2, label="closed form"
        )
    ax.plot(
        curves["sigma"],
        curves["meanfield"],
        "o",
        ms=3,
        mfc="none",
        label="meanfield linear response",
    )
    ax.set(
        xlabel=r"source position $\sigma$",
        ylabel=r"$S_t(\sigma)$",
        title="retrieval profile, t = 1",
    )
    ax.legend()
    fig.tight_layout()
    savefig_atomic(fig, path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--authors", default=None, help="the authors' checkout (or a script in it)"
    )
    parser.add_argument("--out", default="out/lost_in_the_middle")
    parser.add_argument("--smoke", action="store_true", help="n = 16, 16 positions")
    args = parser.parse_args()
    args.n, args.n_pos = (16, 16) if args.smoke else (64, 64)
    authors = None if args.authors is None else _Authors(args.authors)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    traj_rows, traj = trajectories(args, authors)
    prof_rows, curves = retrieval(args, authors)
    device = jax.devices()[0].platform
    write_manifest(
        out / f"lost_in_the_middle_{device}.json",
        dict(
            manifest=manifest(vars(args), 17, time.perf_counter() - start),
            machine="2 CPU cores shared with other jobs",
            trajectories=traj_rows,
            retrieval=prof_rows,
            profile={k: np.asarray(v).tolist() for k, v in curves.items()},
        ),
    )
    plot(traj, curves, out / f"lost_in_the_middle_{device}.png")
    for name, row in {**traj_rows, "retrieval": prof_rows}.items():
        print(name, row)


if __name__ == "__main__":
    main()
