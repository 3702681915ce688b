"""Segments and checkpoints of `meanfield simulate`.

The run is cut into `segments` solves of equal numbers of save times; after each
one the state is written atomically to `checkpoint.npz`, so an interrupted run
continues with `--resume`. A run is always cut the same way, so a resumed run and
an uninterrupted one compute exactly the same solves and end in the same state.

With a noise, each solve draws its Brownian path from its own key (a
`diffrax.VirtualBrownianTree` lives on the clock of one solve, `_noisy_solve`):
segment k, counted from 0, runs on the path of
`jax.random.fold_in(jax.random.key(seed), k)`, `seed` the `[noise]` one. The
paths of consecutive segments are independent, so the glued path is a Brownian
motion on [0, t1], but it depends on `segments`: the same seed cut differently is
another path (of the same law). A resumed run repeats the uninterrupted one.
"""

import dataclasses
import json
import math
import sys
from pathlib import Path

import equinox as eqx
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from tqdm.auto import tqdm

from .. import _io, _status
from .._dynamics import Solution, simulate
from .._measures import MaskedParticles, Particles
from .._normalization import ON_SPHERE
from .noise_config import build_noise
from .simulate_config import build_field, normalization_of

#: The checkpoint's file name in the output directory.
CHECKPOINT = "checkpoint.npz"


def initial_measure(cfg: dict, seed: int, dtype):
    """Initial tokens (n, d) from the seed; positions s_i = i/n when masked.

    Args:
        cfg: a resolved configuration (`n`, `d`, `initial`, `scale`, `masked`).
        seed: PRNG seed.
        dtype: dtype of the tokens.

    Returns:
        `Particles`, or `MaskedParticles` when `masked`.
    """
    n, d, scale = cfg["n"], cfg["d"], cfg["scale"]
    key = jr.key(seed)
    if cfg["initial"] == "cube":
        x = jr.uniform(key, (n, d), dtype, -scale, scale)
    else:
        x = jr.normal(key, (n, d), dtype)
        if cfg["initial"] == "sphere":
            x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
        x = scale * x
    if cfg["masked"]:
        return MaskedParticles(x, jnp.arange(n, dtype=dtype) / n)
    return Particles(x)


def segment_key(cfg: dict, segment: int):
    """The key of segment `segment`'s Brownian path; None without noise.

    Args:
        cfg: a resolved configuration (its `[noise]` table).
        segment: the segment's index, from 0.

    Returns:
        `jax.random.fold_in(jax.random.key(cfg["noise"]["seed"]), segment)`.
    """
    if cfg["noise"]["kind"] == "none":
        return None
    return jr.fold_in(jr.key(cfg["noise"]["seed"]), segment)


def segment_bounds(saves: int, segments: int) -> list[int]:
    """Save-time indices where the segments start and end: [0, ..., saves - 1].

    Args:
        saves: number of save times.
        segments: number of segments (<= saves - 1).

    Returns:
        segments + 1 increasing indices, as even as rounding allows.
    """
    return [round(k * (saves - 1) / segments) for k in range(segments + 1)]


@dataclasses.dataclass(frozen=True)
class _Checkpoint:
    """The state after a number of segments, saved as one `.npz` file.

    Attributes:
        segment: segments done.
        ts: save times reached so far, shape (T',).
        x: states at those times, shape (T', n, d).
        result: status code so far (`_status`).
        blowup_time: +inf unless a segment blew up.
        num_steps: solver steps so far.
        config_json: the configuration and seed (JSON) the run belongs to.
    """

    segment: int
    ts: np.ndarray
    x: np.ndarray
    result: int
    blowup_time: float
    num_steps: int
    config_json: str

    def save(self, path: Path) -> None:
        _io.save_npz_atomic(
            path,
            segment=self.segment,
            ts=self.ts,
            x=self.x,
            result=self.result,
            blowup_time=self.blowup_time,
            num_steps=self.num_steps,
            config_json=np.array(self.config_json),
        )

    @classmethod
    def load(cls, path: Path) -> "_Checkpoint":
        data = _io.load_npz(path)
        return cls(
            int(data["segment"]),
            data["ts"],
            data["x"],
            int(data["result"]),
            float(data["blowup_time"]),
            int(data["num_steps"]),
            str(data["config_json"]),
        )


def _config_json(cfg: dict, seed: int) -> str:
    return json.dumps({"config": cfg, "seed": seed}, sort_keys=True)


def check_resume(cfg: dict, out: str | Path, seed: int) -> "_Checkpoint | None":
    """The checkpoint in `out` to resume from, None if there is none.

    Args:
        cfg: the resolved configuration of the run to resume.
        out: the output directory.
        seed: the run's seed.

    Returns:
        The checkpoint, or None when `out` has none.

    Raises:
        ValueError: the checkpoint is unreadable or belongs to another
            configuration or seed (one line, for the CLI's exit status 2).
    """
    path = Path(out) / CHECKPOINT
    if not path.exists():
        return None
    try:
        ckpt = _Checkpoint.load(path)
    except _io.UNREADABLE_NPZ as err:
        raise ValueError(
            f"cannot read checkpoint {str(path)!r} ({err}); remove it to start afresh"
        ) from err
    saved = json.loads(ckpt.config_json)
    if saved != json.loads(_config_json(cfg, seed)):
        diff = sorted(
            k
            for k in set(saved["config"]) | set(cfg)
            if saved["config"].get(k) != cfg.get(k)
        )
        what = f"keys {', '.join(diff)}" if diff else f"seed {saved['seed']} != {seed}"
        raise ValueError(
            f"checkpoint {str(path)!r} was written by another run ({what} differ); "
            "use another --out or the same configuration and seed."
        )
    return ckpt


def interrupted_hint(out: str | Path) -> str:
    """What an interrupted run leaves to resume, for its last line.

    Args:
        out: the output directory.
    """
    checkpoint = Path(out) / CHECKPOINT
    if checkpoint.exists():
        return f"the last checkpoint is {checkpoint}: rerun with --resume"
    return "no segment had finished, so there is no checkpoint to resume"


def run_segments(
    cfg: dict,
    out: Path,
    seed: int,
    *,
    resume_from: "_Checkpoint | None" = None,
    progress: bool = True,
) -> Solution:
    """Integrate segment by segment, writing `checkpoint.npz` after each one.

    Args:
        cfg: a resolved configuration.
        out: the output directory (exists).
        seed: PRNG seed of the initial tokens.
        resume_from: a checkpoint of this configuration and seed, or None.
        progress: show a progress bar over the segments.

    Returns:
        The whole run as one `Solution` (save times not reached hold +inf).
    """
    dtype = jnp.dtype(cfg["dtype"])
    attn = build_field(cfg, dtype)
    measure = initial_measure(cfg, seed, dtype)
    save_ts = np.linspace(0.0, cfg["t1"], cfg["saves"])
    bounds = segment_bounds(cfg["saves"], cfg["segments"])
    normalization = normalization_of(cfg)
    noise = build_noise(cfg)
    options = {
        name: cfg[name]
        for name in ("solver", "rtol", "atol", "dt0", "max_steps", "blowup_radius")
    }
    if normalization in ON_SPHERE:
        x0 = measure.x / jnp.linalg.norm(measure.x, axis=-1, keepdims=True)
    else:
        x0 = measure.x
    config_json = _config_json(cfg, seed)
    if resume_from is None:
        ckpt = _Checkpoint(
            0,
            save_ts[:1],
            np.asarray(x0)[None],
            _status.SUCCESS,
            math.inf,
            0,
            config_json,
        )
    else:
        ckpt = resume_from
    bar = tqdm(
        total=cfg["segments"],
        initial=ckpt.segment,
        desc="simulate",
        unit="segment",
        disable=not progress,
        file=sys.stderr,
    )
    with bar:
        while ckpt.segment < cfg["segments"] and _continues(ckpt.result):
            lo, hi = bounds[ckpt.segment], bounds[ckpt.segment + 1]
            start = eqx.tree_at(lambda m: m.x, measure, jnp.asarray(ckpt.x[-1], dtype))
            sol = simulate(
                start,
                attn,
                float(save_ts[hi]),
                t0=float(save_ts[lo]),
                saveat=save_ts[lo + 1 : hi + 1],
                normalization=normalization,
                noise=noise,
                key=segment_key(cfg, ckpt.segment),
                **options,
            )
            ckpt = _advance(ckpt, sol)
            ckpt.save(out / CHECKPOINT)
            bar.update(1)
    return _solution(ckpt, save_ts, measure)


def _continues(result: int) -> bool:
    # A Sinkhorn tolerance miss is reported but the dynamics go on.
    return result in (_status.SUCCESS, _status.SINKHORN_NOT_CONVERGED)


def _advance(ckpt: "_Checkpoint", sol: Solution) -> "_Checkpoint":
    """The checkpoint after one more segment solved by `sol`."""
    reached = np.isfinite(np.asarray(sol.ts))
    result = int(sol.result)
    worst = ckpt.result if result == _status.SUCCESS else result
    return _Checkpoint(
        ckpt.segment + 1,
        np.concatenate([ckpt.ts, np.asarray(sol.ts)[reached]]),
        np.concatenate([ckpt.x, np.asarray(sol.x)[reached]]),
        worst,
        float(sol.blowup_time),
        ckpt.num_steps + int(sol.num_steps),
        ckpt.config_json,
    )


def _solution(ckpt: "_Checkpoint", save_ts: np.ndarray, measure) -> Solution:
    """Pad the reached rows with +inf to every save time, as `simulate` does."""
    T, reached = len(save_ts), len(ckpt.ts)
    ts = np.full(T, np.inf, ckpt.ts.dtype)
    ts[:reached] = ckpt.ts
    x = np.full((T, *ckpt.x.shape[1:]), np.inf, ckpt.x.dtype)
    x[:reached] = ckpt.x
    t_final = ckpt.blowup_time if math.isfinite(ckpt.blowup_time) else ckpt.ts[-1]
    return Solution(
        ts=jnp.asarray(ts),
        x=jnp.asarray(x),
        blowup_time=jnp.asarray(ckpt.blowup_time),
        result=jnp.asarray(ckpt.result),
        t_final=jnp.asarray(t_final),
        num_steps=jnp.asarray(ckpt.num_steps),
        initial=measure,
    )
