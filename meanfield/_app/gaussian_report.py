"""Gaussian blow-up of attention variants, with figures (`meanfield gaussian`).

Castin, Ablin, Carrillo & Peyre, "A Unified Perspective on the Dynamics of Deep
Transformers" (2025): on a Gaussian N(alpha, Sigma) softmax, L2 and Sinkhorn
attention are affine fields, so mu(t) stays Gaussian (docs/math/gaussians.md).
From the same initial Gaussian, softmax can blow up in finite time (when
M = V A + A^T V^T has a positive direction), while L2 with K of full column rank
and Sinkhorn exist for all time. A phase diagram maps the softmax blow-up time
over the family A(s, r) = [[s, 1/2], [0, r]]. Each variant's solve and each
chunk of the grid is checkpointed as it ends (`chunk_checkpoint`), so an
interrupted run continues with `--resume`.

Run it with `meanfield gaussian [--config FILE.toml] [--resume]`.
"""

import argparse
import dataclasses
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.lines import Line2D

from .. import _status, plotting
from .._attention.l2 import L2Attention
from .._attention.sinkhorn import SinkhornAttention
from .._attention.softmax import SoftmaxAttention
from .._measures import Gaussian
from ..gaussian._ode import GaussianSolution, simulate
from ..gaussian._ode import blowup_time as closed_form_blowup_time
from ..gaussian._study import blowup_times, chunk_sizes
from . import config as _config
from .chunk_checkpoint import Checkpoint
from .config import Key, grid_range, integer, is_number, matrix, number, short
from .report import Output, Report, Result, format_matrix

#: Save times per run, linspace(0, t1, NUM_SAVES).
NUM_SAVES = 121
#: Off-diagonal entry of the phase-diagram family A(s, r) = [[s, c], [0, r]].
PHASE_COUPLING = 0.5
#: Tolerances of the moment ODE solves (float64).
RTOL = ATOL = 1e-8
#: Tolerances of the phase-diagram solves (only the blow-up time is kept).
PHASE_TOL = 1e-6
#: The variants compared, each one part of the checkpoint.
VARIANTS = ("softmax", "L2", "Sinkhorn")


def _mean(value, key: str, cfg) -> list[float]:
    if (
        not isinstance(value, list)
        or not value
        or not all(is_number(v) and math.isfinite(v) for v in value)
    ):
        raise ValueError(
            f"`{key}` must be a list of finite numbers; got {short(value)}."
        )
    if len(value) != 2:
        raise ValueError(
            f"`{key}` must have 2 entries (the figures are planar, d = 2); "
            f"got {len(value)}."
        )
    return [float(v) for v in value]


def _cov(value, key: str, cfg) -> list[list[float]]:
    cov = matrix(2, 2)(value, key, cfg)
    C = np.asarray(cov)
    scale = max(float(np.abs(C).max()), 1e-300)
    if np.abs(C - C.T).max() > 1e-12 * scale:
        raise ValueError(f"`{key}` must be symmetric; got {cov}.")
    lam = np.linalg.eigvalsh(C)
    if not lam[0] > 0:
        raise ValueError(
            f"`{key}` must be positive definite; got eigenvalues "
            f"{lam.round(6).tolist()}."
        )
    return cov


#: The configuration: key -> (checker, default); d = 2 (the figures are planar).
SCHEMA: dict = {
    "mean": Key(
        _mean,
        [0.5, 0.0],
        doc="Mean of the initial Gaussian N(mean, cov): 2 numbers (the figures are "
        "planar, d = 2).",
    ),
    "cov": Key(
        _cov,
        [[1.0, 0.3], [0.3, 0.5]],
        doc="Covariance of the initial Gaussian: a 2 × 2 symmetric positive "
        "definite matrix.",
    ),
    "t1": Key(
        number(positive=True),
        3.0,
        doc="Final time of the softmax, L2 and Sinkhorn solves (saved at "
        f"{NUM_SAVES} evenly spaced times on [0, t1]), > 0.",
    ),
    "V": Key(
        matrix(2, 2),
        [[1.0, 0.0], [0.0, 1.0]],
        doc="Value matrix, 2 × 2, of every attention (the phase diagram's too).",
    ),
    "Q": Key(
        matrix(None, 2),
        [[1.0, 0.5], [0.0, 1.0]],
        doc="Query matrix, k × 2 for any k ≥ 1: L2 attention uses Q and K, softmax "
        "and Sinkhorn attention the score ⟨A x, y⟩ with A = KᵀQ.",
    ),
    # A = K^T Q: K has as many rows as Q.
    "K": Key(
        matrix(lambda cfg: len(cfg["Q"]), 2),
        [[1.0, 0.0], [0.0, 1.0]],
        doc="Key matrix, k × 2 with as many rows as `Q` (see `Q`).",
    ),
    "phase": {
        "s_range": Key(
            grid_range,
            [-1.5, 1.5, 41],
            doc="[min, max, count]: the values of s in the family A(s, r) = "
            f"[[s, {PHASE_COUPLING:g}], [0, r]] of the softmax blow-up phase "
            "diagram, count ≥ 2 evenly spaced from min to max > min.",
        ),
        "r_range": Key(
            grid_range,
            [-1.5, 1.5, 41],
            doc="[min, max, count]: the values of r in A(s, r), as `s_range`.",
        ),
        "t_max": Key(
            number(positive=True),
            5.0,
            doc="Horizon of the phase diagram's solves, > 0: a cell that has not "
            "blown up by t_max is drawn grey.",
        ),
        "chunk_size": Key(
            integer(1),
            65_536,
            doc="Cells of the phase diagram solved per compiled call, ≥ 1: it "
            "bounds the memory and is the unit of the checkpoint. The chunks are "
            "equal (the grid cut into ⌈cells / chunk_size⌉ of them), and the work "
            "queue of each has √(cells per chunk) slots, a power of two in "
            "[32, 256] (`mf.gaussian.blowup_times`).",
        ),
    },
}


def resolve_config(config: dict | None) -> dict:
    """Validate a configuration and fill in the defaults (`SCHEMA`).

    Keys (all optional): `mean` (d = 2 entries), `cov` (2 x 2 symmetric positive
    definite), `t1` (> 0), `V` (2 x 2), `Q`, `K` (k x 2, same k; A = K^T Q) and a
    `phase` table with `s_range`, `r_range` ([min, max, count]) and `t_max`.

    Args:
        config: the user's configuration (e.g. parsed TOML); None for defaults.

    Returns:
        The full configuration (plain lists and floats).

    Raises:
        ValueError: unknown key, wrong type or bad value; the message (one line)
            names the key.
    """
    return _config.resolve(SCHEMA, config)


def _grid(spec: list) -> np.ndarray:
    lo, hi, count = spec
    return np.linspace(lo, hi, count)


def phase_family(s, r) -> np.ndarray:
    """A(s, r) = [[s, c], [0, r]] with c = PHASE_COUPLING, shape s.shape + (2, 2).

    M = A + A^T = [[2s, c], [c, 2r]] is negative semidefinite iff s, r <= 0 and
    4 s r >= c^2: there (V = I) softmax attention has no blow-up; elsewhere
    t* = 1 / lambda_max(Sigma0^{1/2} M Sigma0^{1/2}) (docs/math/gaussians.md).
    """
    s, r = np.broadcast_arrays(np.asarray(s, float), np.asarray(r, float))
    A = np.zeros(s.shape + (2, 2))
    A[..., 0, 0], A[..., 0, 1], A[..., 1, 1] = s, PHASE_COUPLING, r
    return A


def _draw_global_boundary(ax, s, r) -> None:
    """Dashed boundary of {M = A + A^T <= 0}: no blow-up for any Sigma0 when V = I.

    With V = I, Sigma' = Sigma M Sigma, so M negative semidefinite keeps Sigma
    bounded; for A(s, r) this is s, r <= 0 and 4 s r >= c^2
    (docs/math/gaussians.md).
    Cells outside it that are grey blow up after t_max.
    """
    fs, fr = np.linspace(s[0], s[-1], 400), np.linspace(r[0], r[-1], 400)
    S, R = np.meshgrid(fs, fr)
    A = phase_family(S, R)
    top = np.linalg.eigvalsh(A + np.swapaxes(A, -1, -2))[..., -1]
    if top.min() < 0 < top.max():
        ax.contour(fs, fr, top, levels=[0.0], colors="C0", linestyles="--")
        # Extend the diagram's legend (its handles carry their labels).
        legend = ax.get_legend()
        proxy = Line2D([], [], color="C0", ls="--", label=r"$A + A^T \preceq 0$")
        ax.legend(
            handles=[*legend.legend_handles, proxy],
            loc="upper left",
            fontsize="small",
            framealpha=0.9,
        )


def _closed_form_time(gauss, attn) -> float | None:
    # Analytic t* where it applies (V commuting with M and Sigma0, e.g. V = I).
    try:
        return closed_form_blowup_time(gauss, attn)
    except ValueError:
        return None


def run_gaussian(
    config: dict | None,
    out_dir: str | Path = "out/gaussian",
    *,
    seed: int | None = None,
    progress: bool = False,
    resume: bool = False,
) -> dict:
    """Compare softmax, L2 and Sinkhorn attention on one Gaussian; draw figures.

    From N(mean, cov), solves the moment ODE (Castin, Ablin, Carrillo & Peyre,
    2025; docs/math/gaussians.md) to t1 with saveat = linspace(0, t1, 121) for
    softmax (A = K^T Q), L2 (Q, K) and Sinkhorn (kernel "dot", A = K^T Q), all with the
    value matrix V; then maps the softmax blow-up time over
    A(s, r) = [[s, 1/2], [0, r]] (`phase_family`) with `mf.gaussian.blowup_times`.

    Computed in float64, inside the scoped, thread-local `jax.enable_x64(True)`
    (the caller's setting is untouched): the ODE is d x d so this is cheap, and
    in float32 the time grid cannot resolve the approach to t* at the library's
    default blow-up threshold (the solves end with "max_steps").

    Writes to `out_dir` (created if needed): `ellipses.png`, `eigenvalues.png`,
    `phase.png`, `gaussian.npz` (per variant `<name>_ts`, `<name>_mean`,
    `<name>_cov`, `<name>_blowup_time`, `<name>_status`; `phase_s`, `phase_r`,
    `phase_times` (R, S), `phase_status` (R, S), `phase_A` (R, S, 2, 2)),
    `manifest.json` (full configuration, seed, versions, device, wall time,
    summary) and `checkpoint/` (`run.json`, `part-<variant>.npz` per variant and
    `chunk-<i>.npz` per chunk of the grid, each written as it ends).

    Args:
        config: configuration (see `resolve_config`); None for the defaults.
        out_dir: output directory.
        seed: recorded in the manifest (the run itself is deterministic).
        progress: print a line per stage and a bar over the grid's chunks to
            stderr.
        resume: continue from `out_dir/checkpoint/` when it holds one: only the
            variants and chunks it lacks are solved, and the arrays are bit for
            bit those of an uninterrupted run.

    Returns:
        The summary: {variant: {"status", "blowup_time", "closed_form_blowup_time"
        (softmax only; None outside the closed-form case)}, "phase":
        {"fraction_blowup", "shape" [R, S], "t_max", "failed"}}.

    Raises:
        ValueError: invalid configuration (the message names the key), or
            `resume` with a checkpoint of another configuration or seed.
    """
    return REPORT.run(
        resolve_config(config), out_dir, seed=seed, progress=progress, resume=resume
    )


def _check(cfg: dict, args: argparse.Namespace) -> None:
    # A checkpoint of another run in --out is a configuration error (exit 2).
    if args.resume:
        Checkpoint.read(args.out, "gaussian", cfg, args.seed)


def _phase_chunks(cfg: dict) -> list[int]:
    """Cells per chunk of the phase grid, as `blowup_times` cuts it."""
    ph = cfg["phase"]
    return chunk_sizes(ph["s_range"][2] * ph["r_range"][2], ph["chunk_size"])


def _manifest_config(cfg: dict, out: Path) -> dict:
    """The resolved configuration plus what the run fixes (dtype, tolerances)."""
    resolved = {
        **cfg,
        "out_dir": str(out),
        "d": 2,
        "dtype": "float64",
        "saveat": f"linspace(0, t1, {NUM_SAVES})",
        "rtol": RTOL,
        "atol": ATOL,
        "variants": {
            "softmax": "SoftmaxAttention(V, Q=Q, K=K)  (A = K^T Q)",
            "L2": "L2Attention(V, Q=Q, K=K)",
            "Sinkhorn": 'SinkhornAttention(V, Q=Q, K=K, kernel="dot")  (A = K^T Q)',
        },
    }
    resolved["phase"] = {
        **cfg["phase"],
        "family": f"A(s, r) = [[s, {PHASE_COUPLING:g}], [0, r]]",
        "attention": "SoftmaxAttention(V, A=A(s, r))",
        "rtol": PHASE_TOL,
        "atol": PHASE_TOL,
    }
    return resolved


def _compute(
    cfg: dict, output: Output, *, seed: int | None = None, resume: bool = False
) -> Result:
    """The three variants and the phase grid, in float64 (the run is seedless)."""
    sizes = _phase_chunks(cfg)
    ckpt = Checkpoint.open(
        output,
        "gaussian",
        cfg,
        seed,
        resume=resume,
        chunks=len(sizes),
        parts=VARIANTS,
    )
    with jax.enable_x64(True):
        summary, arrays, sols, phase = _solve(cfg, output, ckpt, sizes)
    if ckpt.continued:
        summary["resumed_parts"] = [ckpt.resumed, ckpt.total]
    data = {"sols": sols, "phase": phase}
    return Result(summary, _manifest_config(cfg, output.dir), arrays, data)


def _figures(cfg: dict, result: Result, output: Output) -> None:
    """ellipses.png, eigenvalues.png and phase.png."""
    sols, phase = result.data["sols"], result.data["phase"]
    V = format_matrix(cfg["V"])
    output.figure(
        plotting.plot_covariance_ellipses(
            sols,
            title=(
                f"1-sigma ellipses of N(mean(t), cov(t)): V = {V}, "
                f"A = K^T Q = {format_matrix(phase['A_run'])}"
            ),
        ),
        "ellipses.png",
    )
    output.figure(
        plotting.plot_covariance_eigenvalues(
            sols, title=rf"eigenvalues of $\Sigma(t)$ on [0, {cfg['t1']:g}]"
        ),
        "eigenvalues.png",
    )
    fig = plotting.plot_blowup_phase_diagram(
        phase["s"],
        phase["r"],
        phase["times"],
        t_max=cfg["phase"]["t_max"],
        point=phase["point"],
        title=(
            f"softmax blow-up time\nA(s, r) = [[s, {PHASE_COUPLING:g}], [0, r]], "
            f"V = {V}"
        ),
    )
    if np.array_equal(np.asarray(cfg["V"]), np.eye(2)):
        _draw_global_boundary(fig.axes[0], phase["s"], phase["r"])
    output.figure(fig, "phase.png")


def _variant(name: str, gauss, attn, saveat, t1, ckpt: Checkpoint):
    """One variant's solve, from the checkpoint when it holds it; (sol, resumed)."""
    saved = ckpt.load_part(name)
    if saved is not None:
        return GaussianSolution(**{k: jnp.asarray(v) for k, v in saved.items()}), True
    sol = simulate(gauss, attn, t1, saveat=saveat, rtol=RTOL, atol=ATOL)
    fields = (f.name for f in dataclasses.fields(GaussianSolution))
    ckpt.save_part(name, **{field: getattr(sol, field) for field in fields})
    return sol, False


def _solve(cfg: dict, output: Output, ckpt: Checkpoint, sizes: list[int]):
    """Solve the three variants and the phase grid (run under x64)."""
    log = output.log
    f64 = jnp.float64
    V, Q, K = (jnp.asarray(cfg[k], f64) for k in ("V", "Q", "K"))
    gauss = Gaussian(jnp.asarray(cfg["mean"], f64), jnp.asarray(cfg["cov"], f64))
    t1 = cfg["t1"]
    saveat = jnp.linspace(0.0, t1, NUM_SAVES, dtype=f64)
    attns = {
        "softmax": SoftmaxAttention(V, Q=Q, K=K),
        "L2": L2Attention(V, Q=Q, K=K),
        "Sinkhorn": SinkhornAttention(V, Q=Q, K=K, kernel="dot"),
    }
    assert tuple(attns) == VARIANTS
    sols, summary, arrays = {}, {}, {}
    for name, attn in attns.items():
        t0 = time.perf_counter()
        sol, resumed = _variant(name, gauss, attn, saveat, t1, ckpt)
        sols[name] = sol
        summary[name] = {"status": sol.status, "blowup_time": float(sol.blowup_time)}
        if name == "softmax":
            summary[name]["closed_form_blowup_time"] = _closed_form_time(gauss, attn)
        arrays.update(
            {
                f"{name}_ts": sol.ts,
                f"{name}_mean": sol.mean,
                f"{name}_cov": sol.cov,
                f"{name}_blowup_time": sol.blowup_time,
                f"{name}_status": np.asarray(sol.status),
            }
        )
        took = "from the checkpoint" if resumed else f"{time.perf_counter() - t0:.1f} s"
        log(f"{name}: {sol.status}, t* = {float(sol.blowup_time):.6g} ({took})")

    ph = cfg["phase"]
    s, r = _grid(ph["s_range"]), _grid(ph["r_range"])
    S, R = np.meshgrid(s, r)  # (len(r), len(s)): row i is r[i]
    As = phase_family(S, R)
    log(f"phase diagram: {r.size} x {s.size} runs to t = {ph['t_max']:g}")
    t0 = time.perf_counter()
    batched = jax.vmap(lambda A: SoftmaxAttention(V, A=A))(
        jnp.asarray(As.reshape(-1, 2, 2), f64)
    )
    study = blowup_times(
        gauss,
        {"softmax": batched},
        ph["t_max"],
        rtol=PHASE_TOL,
        atol=PHASE_TOL,
        chunk_size=ph["chunk_size"],
        progress=output.progress,
        chunks=ckpt.chunk_log(sizes, log),
    )
    times = np.asarray(study.times["softmax"], float).reshape(S.shape)
    codes = np.asarray(study.status["softmax"]).reshape(S.shape)
    ok = np.isin(codes, [_status.SUCCESS, _status.STATIONARY, _status.BLOWUP])
    times = np.where(ok, times, np.nan)  # unclassified runs: neither inf nor a time
    log(f"phase diagram done ({time.perf_counter() - t0:.1f} s)")
    arrays.update(
        phase_s=s, phase_r=r, phase_times=times, phase_status=codes, phase_A=As
    )
    summary["phase"] = {
        "fraction_blowup": float(np.mean(np.isfinite(times))),
        "shape": [int(r.size), int(s.size)],
        "t_max": ph["t_max"],
        "failed": int(np.sum(~ok)),
    }
    A_run = np.asarray(K).T @ np.asarray(Q)
    # Mark the simulated A on the diagram when it belongs to the family.
    in_family = np.allclose(A_run, phase_family(A_run[0, 0], A_run[1, 1]))
    phase = {
        "s": s,
        "r": r,
        "times": times,
        "A_run": A_run,
        "point": (A_run[0, 0], A_run[1, 1]) if in_family else None,
    }
    return summary, arrays, sols, phase


def format_summary(summary: dict) -> str:
    """A few lines: status and blow-up time per variant, phase blow-up fraction."""
    lines = []
    for name in VARIANTS:
        res = summary[name]
        t = res["blowup_time"]
        line = (
            f"{name:9s} {res['status']:9s} t* = {t:.6g}"
            if math.isfinite(t)
            else (f"{name:9s} {res['status']:9s} no blow-up")
        )
        exact = res.get("closed_form_blowup_time")
        if exact is not None:
            line += f"  (closed form {exact:.6g})"
        lines.append(line)
    ph = summary["phase"]
    R, S = ph["shape"]
    lines.append(
        f"phase     {R} x {S} grid: {ph['fraction_blowup']:.1%} blow up on "
        f"[0, {ph['t_max']:g}]" + (f", {ph['failed']} failed" if ph["failed"] else "")
    )
    if "resumed_parts" in summary:
        done, total = summary["resumed_parts"]
        lines.append(
            f"resumed with {done} of {total} parts (variants and chunks) from the "
            "checkpoint"
        )
    return "\n".join(lines)


#: `meanfield gaussian`.
REPORT = Report(
    "gaussian",
    resolve_config,
    _compute,
    _figures,
    format_summary,
    arrays="gaussian.npz",
    check=_check,
)
