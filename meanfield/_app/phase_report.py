"""Clustering phase diagrams from a configuration (`meanfield phase`).

Geshkovski, Letrouit, Polyanskiy & Rigollet ("A mathematical perspective on
Transformers", 2023): for every temperature beta, many systems of n tokens
uniform on the sphere move under attention with V = I and A = beta I; the
diagram is the fraction of token pairs that have merged, over (beta, t)
(`mf.clustering.phase_diagram`). The configuration chooses the grid, the
attention (softmax or unnormalised), where the LayerNorm sits, a causal mask and
the number of heads (Karagodin, Polyanskiy & Rigollet, 2024), and a Brownian
forcing of the tokens (`[noise]`). The systems are solved chunk by chunk, each
chunk checkpointed as it ends (`chunk_checkpoint`), so an interrupted run
continues with `--resume`.

Run it with `meanfield phase [--config FILE.toml] [--resume]`.
"""

import argparse
import os

import jax
import jax.random as jr
import numpy as np

from .. import clustering, plotting
from .._ensemble import chunk_layout, concurrent_chunks
from .._noisy_solve import default_tolerance
from .chunk_checkpoint import Checkpoint
from .config import (
    Key,
    boolean,
    choice,
    grid_range,
    integer,
    number,
    or_else,
    resolve,
)
from .noise_config import build_noise, check_sigma_in_dtype, is_noisy, noise_table
from .report import Output, Report, Result
from .simulate_config import NORMALIZATIONS, normalization_of

ATTENTIONS = ("softmax", "unnormalized")
#: The most systems per beta: a mean over 10^6 systems has a standard error below
#: 5e-4, far under any visible difference; the memory check bounds the rest.
MAX_SYSTEMS = 10**6
GIB = 2**30
#: Keys that change only the figure: a run may resume with other values.
FIGURE_ONLY = ("log_time",)


def _alignment_eps(value, key: str, cfg) -> float:
    eps = number(positive=True)(value, key, cfg)
    if not eps < 2:
        raise ValueError(f"`{key}` must be in (0, 2); got {value}.")
    return eps


def _tolerance(cfg) -> float:
    return default_tolerance(is_noisy(cfg))


def _heads(value, key: str, cfg) -> int:
    heads = integer(1)(value, key, cfg)
    if cfg["d"] % heads:
        raise ValueError(f"`{key}` must divide d = {cfg['d']}; got {heads}.")
    return heads


#: The configuration: key -> (checker, default). The default grid is the
#: published one: 90 betas in [0.1, 9], 2048 systems of 32 tokens on S^1.
SCHEMA: dict = {
    "n": Key(integer(2), 32, doc="Tokens per system, ≥ 2."),
    "d": Key(
        integer(1),
        2,
        doc="Dimension: the tokens start uniform on the sphere S^(d−1), ≥ 1.",
    ),
    "systems": Key(
        integer(1, MAX_SYSTEMS),
        2048,
        doc="Independent systems per β, whose fractions of merged pairs are "
        "averaged, from 1 to 10⁶; all of them must fit in memory.",
    ),
    "betas": Key(
        grid_range,
        [0.1, 9.0, 90],
        doc="[min, max, count]: count ≥ 2 temperatures β evenly spaced from "
        "min > 0 to max > min; the attention has V = I and A = β I.",
    ),
    "t1": Key(number(positive=True), 30.0, doc="Final time, > 0."),
    "saves": Key(
        integer(2),
        31,
        doc="Number of save times, evenly spaced on [0, t1] with both ends, ≥ 2.",
    ),
    "attention": Key(
        choice(ATTENTIONS),
        "softmax",
        doc='`"softmax"` or `"unnormalized"` (the kernel e^(β⟨x, y⟩) without the '
        "softmax normalisation).",
    ),
    "normalization": Key(
        choice(NORMALIZATIONS),
        "sphere",
        doc='Where the LayerNorm sits: `"sphere"` (post-LN, tokens on the unit '
        'sphere), `"none"` (tokens in ℝ^d), `"pre-ln"`, `"peri-ln"` or `"ngpt"`, '
        "as for `meanfield simulate`.",
    ),
    "masked": Key(
        boolean(),
        False,
        doc="Causal attention: token i attends to the tokens j ≤ i.",
    ),
    "heads": Key(
        _heads,
        1,
        doc="Attention heads, each acting on a block of d/heads coordinates; must "
        "divide d.",
    ),
    "eps": Key(
        _alignment_eps,
        1e-3,
        doc="Two tokens count as merged when their directions have "
        "⟨θ_i, θ_j⟩ > 1 − eps; in (0, 2).",
    ),
    "noise": noise_table(
        "Seed of the Brownian paths, ≥ 0 (`--seed` draws the initial "
        "tokens, the same with or without noise): system s of the k-th β "
        "(from 0) runs on the path of jax.random.split(jax.random.key(seed), "
        "count · systems)[k · systems + s]."
    ),
    "rtol": Key(
        or_else(_tolerance, number(positive=True)),
        doc="Relative tolerance of the adaptive solver, > 0. Omitted: 1e-6, or "
        "1e-3 with noise (Heun's method, `mf.simulate`'s default).",
    ),
    "atol": Key(
        or_else(_tolerance, number(positive=True)),
        doc="Absolute tolerance of the adaptive solver, > 0. Omitted: 1e-6, or "
        "1e-3 with noise (Heun's method, `mf.simulate`'s default).",
    ),
    "chunk_size": Key(
        integer(1),
        16384,
        doc="Systems solved per compiled call, ≥ 1: it bounds the memory, "
        "O(chunk_size · saves · n²), and is the unit of the checkpoint (on the "
        "CPU, fewer chunks than cores are cut further while each keeps 2048 "
        "systems).",
    ),
    "dtype": Key(
        or_else(
            lambda cfg: "float64" if is_noisy(cfg) else "float32",
            choice(("float32", "float64")),
        ),
        doc='Arithmetic of the solves: `"float32"` or `"float64"`. Omitted: '
        "float32 without noise (rounding far below the default tolerance), "
        "float64 with noise.",
    ),
    "log_time": Key(
        boolean(),
        False,
        doc="Draw the figure's time axis on a logarithmic scale.",
    ),
}


def resolve_config(config: dict | None) -> dict:
    """Validate a configuration and fill in the defaults (`SCHEMA`).

    Keys (all optional): `n` (>= 2), `d` (>= 1), `systems` per beta (1 to 10^6),
    `betas` ([min, max, count], evenly spaced, min > 0), `t1` (> 0), `saves`
    (save times on [0, t1], >= 2), `attention` ("softmax" | "unnormalized"),
    `normalization` ("sphere" | "none" | "pre-ln" | "peri-ln" | "ngpt"),
    `masked` (causal), `heads` (dividing d), `eps` (alignment tolerance in
    (0, 2)), a `[noise]` table (`kind` "none" | "independent" | "common",
    `sigma` >= 0, `seed` of the Brownian paths; noise only with normalization
    "none" or "sphere"), `rtol`, `atol` (> 0; 1e-6, or 1e-3 with noise),
    `chunk_size` (systems per compiled call) and `log_time` (the figure's time
    axis).

    Raises:
        ValueError: unknown key, wrong type or bad value, or a diagram that cannot
            fit in memory (`check_memory`); the message (one line) names the key.
    """
    cfg = resolve(SCHEMA, config)
    check_sigma_in_dtype(cfg)
    if not cfg["betas"][0] > 0:
        raise ValueError(f"`betas` must start above 0; got {cfg['betas']}.")
    check_memory(cfg, _memory_limit())
    return cfg


def memory_bytes(cfg: dict) -> tuple[int, int]:
    """Lower bounds of the bytes a diagram holds: (every system, one chunk).

    Every system (betas x systems, float64): its initial tokens twice (drawn,
    then put on the sphere), its weights, its V and A, its alignment at the save
    times; a chunk: its saved tokens (saves, n, d) and one attention matrix
    (n, n) per system, times the chunks solved side by side (one per core on
    the CPU, `mf.simulate_ensemble`).
    """
    n, d, saves = cfg["n"], cfg["d"], cfg["saves"]
    systems = cfg["betas"][2] * cfg["systems"]
    every = 8 * systems * (2 * n * d + n + 2 * d * d + saves)
    streams = concurrent_chunks()
    _, width, side_by_side = chunk_layout(systems, cfg["chunk_size"], streams)
    chunk = 8 * side_by_side * width * n * (saves * d + n)
    return every, chunk


def check_memory(cfg: dict, limit: int | None) -> None:
    """Refuse a diagram that cannot fit in `limit` bytes (None: no check).

    Raises:
        ValueError: naming `systems` (the systems alone do not fit) or
            `chunk_size` (the chunk does not fit beside them).
    """
    every, chunk = memory_bytes(cfg)
    if limit is None or every + chunk <= limit:
        return
    have = f"this machine has {limit / GIB:.3g} GiB"
    grid = (
        f"{cfg['betas'][2]} betas x {cfg['systems']} systems of {cfg['n']} tokens "
        f"in d = {cfg['d']}"
    )
    smallest = memory_bytes({**cfg, "chunk_size": 1})[1]
    if every + smallest > limit:  # no chunk size helps
        raise ValueError(
            f"`systems` = {cfg['systems']} needs at least {every / GIB:.3g} GiB of "
            f"memory for {grid} ({have}); lower `systems` or the count of `betas`."
        )
    raise ValueError(
        f"`chunk_size` = {cfg['chunk_size']} needs at least {chunk / GIB:.3g} GiB "
        f"of memory per chunk of {grid} ({have}); lower `chunk_size`."
    )


def _memory_limit() -> int | None:
    """The bytes a diagram may use: the machine's memory, or the accelerator's."""
    try:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # not a POSIX system
        limit = None
    stats = jax.devices()[0].memory_stats() or {}  # None on the CPU
    device = stats.get("bytes_limit")
    if device:
        limit = device if limit is None else min(limit, device)
    return limit


def run_phase(
    config: dict | None,
    out_dir="out/phase",
    *,
    seed: int | None = None,
    progress: bool = False,
    resume: bool = False,
) -> dict:
    """The phase diagram of a configuration, with its figure and arrays.

    Writes to `out_dir` (created if needed): `phase.png` (the heat map, with the
    equiangular curve for the softmax sphere model with one head and no mask),
    `phase.npz` (`betas`, `ts`, `density` (K, T), `one_cluster` (K, T),
    `completed` (K,), and `theory` (K,) where drawn), `manifest.json` and
    `checkpoint/` (`run.json` and one `chunk-<i>.npz` per chunk of systems, each
    written as the chunk ends).

    Args:
        config: configuration (see `resolve_config`); None for the defaults.
        out_dir: output directory.
        seed: PRNG seed of the initial tokens (None: 0).
        progress: a progress bar over the chunks and progress lines on stderr.
        resume: continue from `out_dir/checkpoint/` when it holds one: only the
            chunks it lacks are solved, and the arrays are bit for bit those of
            an uninterrupted run.

    Returns:
        The summary (see `format_summary`).

    Raises:
        ValueError: invalid configuration (the message names the key), or
            `resume` with a checkpoint of another configuration or seed.
    """
    return REPORT.run(
        resolve_config(config), out_dir, seed=seed, progress=progress, resume=resume
    )


def checked_config(cfg: dict) -> dict:
    """The keys a resumed run must share with its checkpoint: all but the figure's."""
    return {key: value for key, value in cfg.items() if key not in FIGURE_ONLY}


def _check(cfg: dict, args: argparse.Namespace) -> None:
    # A checkpoint of another run in --out is a configuration error (exit 2).
    if args.resume:
        Checkpoint.read(args.out, "phase", checked_config(cfg), args.seed)


def _checkpoint(cfg: dict, output: Output, seed: int, resume: bool):
    """The run's checkpoint and its `ChunkLog` (the layout of the run resumed)."""
    size = cfg["betas"][2] * cfg["systems"]
    count, width, _ = chunk_layout(size, cfg["chunk_size"], concurrent_chunks())
    ckpt = Checkpoint.open(
        output,
        "phase",
        checked_config(cfg),
        seed,
        resume=resume,
        chunks=count,
        width=width,
    )
    width = ckpt.width
    sizes = [min(width, size - start) for start in range(0, size, width)]
    return ckpt, ckpt.chunk_log(sizes, output.log)


def has_theory(cfg: dict) -> bool:
    """Whether the equiangular curve describes the model.

    It does for softmax attention on the sphere, one head, no mask, no noise.
    """
    return (
        not is_noisy(cfg)
        and cfg["attention"] == "softmax"
        and cfg["normalization"] == "sphere"
        and not cfg["masked"]
        and cfg["heads"] == 1
    )


def _compute(
    cfg: dict, output: Output, *, seed: int | None = None, resume: bool = False
) -> Result:
    seed = 0 if seed is None else seed
    ckpt, log = _checkpoint(cfg, output, seed, resume)
    lo, hi, count = cfg["betas"]
    betas = np.linspace(lo, hi, count)
    output.log(
        f"phase diagram: {count} betas x {cfg['systems']} systems of "
        f"{cfg['n']} tokens in d = {cfg['d']}"
    )
    noisy = is_noisy(cfg)
    if noisy:
        output.log(
            f"{cfg['noise']['kind']} noise, sigma = {cfg['noise']['sigma']:g}, "
            f"Brownian seed {cfg['noise']['seed']}"
        )
    with jax.enable_x64(True):
        diagram = clustering.phase_diagram(
            betas,
            n=cfg["n"],
            d=cfg["d"],
            systems=cfg["systems"],
            t1=cfg["t1"],
            saveat=np.linspace(0.0, cfg["t1"], cfg["saves"]),
            key=jr.key(seed),
            attention=cfg["attention"],
            normalization=normalization_of(cfg),
            masked=cfg["masked"],
            heads=cfg["heads"],
            eps=cfg["eps"],
            rtol=cfg["rtol"],
            atol=cfg["atol"],
            chunk_size=cfg["chunk_size"],
            progress=output.progress,
            noise=build_noise(cfg),
            noise_key=jr.key(cfg["noise"]["seed"]) if noisy else None,
            dtype=cfg["dtype"],
            chunks=log,
        )
    arrays = dict(
        betas=diagram.betas,
        ts=diagram.ts,
        density=diagram.density,
        one_cluster=diagram.one_cluster,
        completed=diagram.completed,
    )
    if has_theory(cfg):
        arrays["theory"] = diagram.theory()
    final = diagram.density[:, -1]
    summary = {
        "betas": [float(lo), float(hi), int(count)],
        "systems": cfg["systems"],
        "n": cfg["n"],
        "d": cfg["d"],
        "t1": cfg["t1"],
        "completed_min": float(diagram.completed.min()),
        "density_at_t1": [float(final[0]), float(final[-1])],
        "one_cluster_at_t1": [
            float(diagram.one_cluster[0, -1]),
            float(diagram.one_cluster[-1, -1]),
        ],
        "wall_s": output.wall_s,
        "chunks": ckpt.total,
        "resumed_chunks": ckpt.resumed if ckpt.continued else None,
    }
    if noisy:
        summary["noise"] = dict(cfg["noise"])
    resolved = {
        **cfg,
        "out_dir": str(output.dir),
        "attention_matrices": "V = I, A = beta I (heads: blocks of d / heads)",
        "initial_tokens": "uniform on S^{d-1}, one key for the grid",
    }
    if noisy:
        resolved["brownian_paths"] = (
            "system s of the k-th beta: jax.random.split(jax.random.key(seed), "
            "count * systems)[k * systems + s]; Heun's method, adaptive"
        )
    return Result(summary, resolved, arrays, {"diagram": diagram})


def _figures(cfg: dict, result: Result, output: Output) -> None:
    """phase.png."""
    model = cfg["attention"] + (
        f", {cfg['normalization']}" if cfg["normalization"] != "none" else ", no norm"
    )
    model += ", causal" if cfg["masked"] else ""
    model += f", {cfg['heads']} heads" if cfg["heads"] > 1 else ""
    if is_noisy(cfg):
        model += f", {cfg['noise']['kind']} noise σ = {cfg['noise']['sigma']:g}"
    output.figure(
        plotting.plot_phase_diagram(
            result.data["diagram"],
            log_time=cfg["log_time"],
            theory=has_theory(cfg),
            title=(
                f"n = {cfg['n']}, d = {cfg['d']}, {cfg['systems']} systems per β "
                f"({model})"
            ),
        ),
        "phase.png",
        bbox_inches="tight",
    )


def format_summary(summary: dict) -> str:
    """The lines printed after a run."""
    lo, hi, count = summary["betas"]
    d_lo, d_hi = summary["density_at_t1"]
    o_lo, o_hi = summary["one_cluster_at_t1"]
    lines = [
        f"phase diagram: {count} betas in [{lo:g}, {hi:g}] x {summary['systems']} "
        f"systems of {summary['n']} tokens (d = {summary['d']}) to t = "
        f"{summary['t1']:g} in {summary['wall_s']:.1f} s"
        + (
            f" (resumed with {summary['resumed_chunks']} of {summary['chunks']} "
            "chunks from the checkpoint)"
            if summary.get("resumed_chunks") is not None
            else ""
        ),
        f"aligned pairs at t1: {d_lo:.3f} (beta = {lo:g}) ... {d_hi:.3f} "
        f"(beta = {hi:g}); one cluster: {o_lo:.3f} ... {o_hi:.3f}",
    ]
    if "noise" in summary:
        noise = summary["noise"]
        lines.append(
            f"{noise['kind']} noise, sigma = {noise['sigma']:g}: Brownian paths of "
            f"seed {noise['seed']}"
        )
    if summary["completed_min"] < 1:
        share = 1 - summary["completed_min"]
        lines.append(
            f"warning: up to {share:.1%} of a beta's systems stopped before t1 "
            "(blow-up or max_steps); they are left out of the density"
        )
    return "\n".join(lines)


#: `meanfield phase`.
REPORT = Report(
    "phase",
    resolve_config,
    _compute,
    _figures,
    format_summary,
    arrays="phase.npz",
    check=_check,
)
