"""The parts of `benchmarks/accelerator.py` that are not the n-scaling sweep.

Each part takes its sizes, returns a JSON-ready dict and checks its own answer
against an independent reference (float64 on the CPU, a closed form, a norm):

- `correctness`: every attention family on the device, dense, blocked and fused
  (where the family has them), against a float64 CPU reference, at float32's
  default and highest matmul precision.
- `sphere_solve`: fixed Euler steps of `mf.simulate` on S^2 (seconds per step).
- `gaussian_runs`: `mf.gaussian.blowup_times` over many runs, checked against
  t* = 1 / lambda_max(A + A^T) on V = I runs.
- `bert_lipschitz`: `mf.lipschitz.local` of a random 12-head BERT-size layer.

Imported by the script, which has put the repository on `sys.path` and enabled
float64 (`jax_enable_x64`) before importing this.
"""

import inspect
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import meanfield as mf
from meanfield.extend import FAMILIES

#: Matmul precisions of the float32 runs: XLA's default (TF32 on recent NVIDIA
#: GPUs) and full float32.
PRECISIONS = ("default", "highest")
#: Largest error relative to max |reference| accepted for float32 at "highest"
#: precision: float32 rounding (6e-8) times the O(d + log n) terms of a row, with a
#: margin; Sinkhorn's iteration stops at its tolerance, so it gets its own.
F32_TOL = {"sinkhorn": 1e-3}
F32_TOL_DEFAULT = 1e-4


def _seconds(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - start


def _params(d: int, seed: int) -> dict[str, np.ndarray]:
    """V, Q, K in float64 with O(1) logits on standard normal tokens."""
    rng = np.random.default_rng([seed, d])
    k = max(2, d // 2)
    return dict(
        V=rng.standard_normal((d, d)) / np.sqrt(d),
        Q=rng.standard_normal((k, d)) / np.sqrt(k * d),
        K=rng.standard_normal((k, d)) / np.sqrt(d),
    )


#: Families whose field jumps where two keys tie: float32 and float64 pick
#: different keys at near-ties, so a device-against-CPU comparison says nothing
#: (checked against double loops in the CPU test suite).
DISCONTINUOUS = ("hardmax",)


def _families(params: dict, dtype) -> dict[str, Callable[[str | None], object]]:
    """name -> (blocking or None) -> attention, every continuous registered family
    and multihead. `build.masked`: the family reads positions (MaskedParticles)."""
    cast = {k: jnp.asarray(v, dtype) for k, v in params.items()}
    k_even = 2 * (cast["Q"].shape[0] // 2)

    def make(name, cls):
        takes = inspect.signature(cls).parameters
        takes_blocking = "blocking" in takes
        extra, Q, K = {}, cast["Q"], cast["K"]
        if "slope" in takes:
            extra["slope"] = 2.0
        if "frequencies" in takes:  # rotations act on pairs of features
            Q, K = Q[:k_even], K[:k_even]
            extra["frequencies"] = jnp.linspace(1.0, 4.0, k_even // 2, dtype=dtype)

        def build(blocking):
            kw = dict(blocking=blocking) if takes_blocking and blocking else {}
            return cls(cast["V"], Q=Q, K=K, **extra, **kw)

        build.blocked = takes_blocking
        build.fused = takes_blocking and name != "sinkhorn"  # no fused Sinkhorn
        build.masked = bool(extra)
        return build

    made = {
        name: make(name, cls)
        for name, cls in FAMILIES.items()
        if name not in DISCONTINUOUS
    }

    def multihead(blocking):
        d = cast["V"].shape[0]
        heads = [
            mf.SoftmaxAttention(
                cast["V"], Q=s * cast["Q"], K=cast["K"], blocking=blocking or "dense"
            )
            for s in (1.0, -0.5)
        ]
        out = [jnp.eye(d, dtype=dtype), 0.5 * jnp.eye(d, dtype=dtype)]
        return mf.MultiHeadAttention(heads, out=out)

    multihead.blocked = multihead.fused = True
    multihead.masked = False
    made["multihead"] = multihead
    return made


def correctness(n: int, d: int, *, seed: int = 0) -> dict:
    """Every family on the device (float32) against a float64 CPU reference.

    The tokens are N(0, I/d)-scaled so that logits are O(1). Errors are
    max |v - v_ref| / max |v_ref| over all n rows.

    Args:
        n: tokens.
        d: dimension.
        seed: seed of tokens and parameters.

    Returns:
        {"n", "d", "rows": one per (family, blocking, precision), "passed"}.
    """
    rng = np.random.default_rng([seed, n, d])
    x64 = rng.standard_normal((n, d))
    params = _params(d, seed)
    cpu = jax.devices("cpu")[0]

    def measure(x, build):  # positions s_i = i / n where the family reads them
        if build.masked:
            return mf.MaskedParticles(x, jnp.arange(n, dtype=x.dtype) / n)
        return mf.Particles(x)

    with jax.default_device(cpu):
        references = {
            name: np.asarray(
                jax.jit(lambda x, b=build: b("dense").velocity(measure(x, b)))(
                    jnp.asarray(x64)
                )
            )
            for name, build in _families(params, jnp.float64).items()
        }
    x32 = jnp.asarray(x64, jnp.float32)
    rows = []
    for name, build in _families(params, jnp.float32).items():
        ref = references[name]
        scale = float(np.max(np.abs(ref)))
        blockings = (None,)
        if build.blocked:  # the fused kernel where the family takes it
            blockings = (
                ("dense", "blocked", "fused") if build.fused else ("dense", "blocked")
            )
        for precision in PRECISIONS:
            outs = {}
            for blocking in blockings:
                attn = build(blocking)
                with jax.default_matmul_precision(precision):
                    fn = jax.jit(lambda x, a=attn, b=build: a.velocity(measure(x, b)))
                    out, first = _seconds(lambda f=fn: f(x32))
                    _, warm = _seconds(lambda f=fn: f(x32))
                out = np.asarray(out, np.float64)
                outs[blocking] = out
                err = float(np.max(np.abs(out - ref)) / scale)
                tol = F32_TOL.get(name, F32_TOL_DEFAULT)
                rows.append(
                    dict(
                        family=name,
                        blocking=blocking or "dense only",
                        precision=precision,
                        rel_error=err,
                        finite=bool(np.all(np.isfinite(out))),
                        tolerance=tol if precision == "highest" else None,
                        passed=(err <= tol) if precision == "highest" else None,
                        first_call_s=first,
                        seconds=warm,
                    )
                )
            for row in rows[-len(outs) :]:
                if row["blocking"] in ("blocked", "fused"):
                    gap = np.max(np.abs(outs[row["blocking"]] - outs["dense"])) / scale
                    row["vs_dense"] = float(gap)
    passed = all(r["passed"] for r in rows if r["passed"] is not None)
    return dict(n=n, d=d, dtype="float32", rows=rows, passed=passed)


def sphere_solve(
    n: int, steps: int, *, d: int = 3, beta: float = 4.0, budget: float = 60.0
) -> dict:
    """`mf.simulate` on S^{d-1}: `steps` Euler steps, blocked softmax, float32.

    A = beta I, V = I; the tokens start uniform on the sphere. The solve is jitted
    whole; the first call includes compilation. One velocity evaluation is timed
    first: if two solves of `steps` steps would pass `budget`, fewer steps run
    (at least one; both counts are reported).

    Args:
        n: tokens.
        steps: Euler steps (dt = 1/16, exact in binary).
        d: ambient dimension.
        beta: inverse temperature.
        budget: seconds for the two solves.

    Returns:
        {"n", "d", "steps", "seconds", "seconds_per_step", "first_call_s",
        "max_norm_error", "solve_status", "passed"}.
    """
    x = jax.random.normal(jax.random.key(1), (n, d), jnp.float32)
    x = x / jnp.linalg.norm(x, axis=1, keepdims=True)
    eye = jnp.eye(d, dtype=jnp.float32)
    dt = 1 / 16

    attn = mf.SoftmaxAttention(eye, A=beta * eye, blocking="blocked")

    @jax.jit
    def velocity(x):
        return attn.velocity(mf.Particles(x))

    _seconds(lambda: velocity(x))
    _, eval_seconds = _seconds(lambda: velocity(x))
    requested, steps = steps, max(1, min(steps, int(budget / (2 * eval_seconds))))

    @jax.jit
    def solve(x):
        sol = mf.simulate(
            mf.Particles(x),
            attn,
            steps * dt,
            dt0=dt,
            solver="euler",
            normalization="sphere",
        )
        return sol.x[-1], sol.num_steps, sol.result

    (_, _, _), first = _seconds(lambda: solve(x))
    (last, num_steps, result), warm = _seconds(lambda: solve(x))
    norm_error = float(jnp.max(jnp.abs(jnp.linalg.norm(last, axis=1) - 1)))
    return dict(
        n=n,
        d=d,
        beta=beta,
        steps=int(num_steps),
        steps_requested=requested,
        eval_seconds=eval_seconds,
        solver="euler",
        dtype="float32",
        first_call_s=first,
        seconds=warm,
        seconds_per_step=warm / int(num_steps),
        interactions_per_second=n * n * int(num_steps) / warm,
        max_norm_error=norm_error,
        solve_status=mf.Status(int(result)).label,
        passed=bool(
            int(num_steps) == steps
            and norm_error < 1e-5
            and int(result) == mf.Status.SUCCESS
        ),
    )


def gaussian_runs(
    runs: int, *, d: int = 2, chunk_size: int, slots: tuple[int, ...]
) -> dict:
    """`mf.gaussian.blowup_times` over `runs` softmax parameter sets, float64.

    A ~ N(0, 1/d), V = I + N(0, 0.1/d), t_max = 5 (the blow-up study's setup).
    Each queue width in `slots` first solves one chunk twice (compiled, then
    warm); the fastest solves all `runs`. Checked on 256 V = I runs: there the
    blow-up time is exactly 1 / lambda_max(A + A^T).

    Args:
        runs: parameter sets.
        d: dimension.
        chunk_size: runs per compiled call.
        slots: the candidate numbers of runs stepped together.

    Returns:
        {"runs", "slots", "slot_tries", "seconds", "runs_per_second", "classes",
        "check_max_rel_error", "passed"}.
    """
    t_max = 5.0
    ka, kv = jax.random.split(jax.random.key(d))
    As = jax.random.normal(ka, (runs, d, d)) / np.sqrt(d)
    Vs = jnp.eye(d)[None] + jax.random.normal(kv, (runs, d, d)) * np.sqrt(0.1 / d)
    gauss = mf.Gaussian(np.zeros(d), np.eye(d))

    def study(A, V, width):
        attn = jax.vmap(lambda a, v: mf.SoftmaxAttention(v, A=a))(A, V)
        return mf.gaussian.blowup_times(
            gauss, {"softmax": attn}, t_max, chunk_size=chunk_size, slots=width
        )

    chunk = min(runs, chunk_size)
    tries = []
    for width in slots:
        _, first = _seconds(lambda w=width: study(As[:chunk], Vs[:chunk], w))
        _, warm = _seconds(lambda w=width: study(As[:chunk], Vs[:chunk], w))
        tries.append(dict(slots=width, first_chunk_s=first, chunk_s=warm))
    best = min(tries, key=lambda r: r["chunk_s"])["slots"]
    result, seconds = _seconds(lambda: study(As, Vs, best))
    k = min(256, runs)
    check = study(As[:k], jnp.broadcast_to(jnp.eye(d), (k, d, d)), best)
    lam = np.linalg.eigvalsh(np.asarray(As[:k] + jnp.swapaxes(As[:k], 1, 2)))[:, -1]
    want = np.where(lam > 1 / t_max, 1 / np.maximum(lam, 1e-300), np.inf)
    got = np.asarray(check.times["softmax"])
    finite = np.isfinite(want)
    err = float(np.max(np.abs(got[finite] - want[finite]) / want[finite]))
    same = bool(np.all(np.isfinite(got) == finite))
    return dict(
        runs=runs,
        d=d,
        t_max=t_max,
        dtype="float64",
        chunk_size=chunk_size,
        slots=best,
        slot_tries=tries,
        seconds=seconds,
        runs_per_second=runs / seconds,
        classes=result.classes("softmax"),
        mean_steps=float(np.mean(np.asarray(result.steps["softmax"]))),
        check_runs=k,
        check_max_rel_error=err,
        check_same_finiteness=same,
        passed=bool(same and err < 1e-6),
    )


def bert_layer(d: int, heads: int, k: int, dtype, seed: int = 0):
    """A random softmax multi-head layer of BERT's shape (d = 384, 12 heads).

    Logits are O(1) on standard normal tokens; each head's output is V_h, then W_h.
    """
    rng = np.random.default_rng(seed)
    scale = 3 / np.sqrt(d)
    heads_, outs = [], []
    for _ in range(heads):
        heads_.append(
            mf.SoftmaxAttention(
                jnp.asarray(rng.normal(size=(d, d)) / np.sqrt(d), dtype),
                Q=jnp.asarray(scale * rng.normal(size=(k, d)), dtype),
                K=jnp.asarray(scale * rng.normal(size=(k, d)), dtype),
            )
        )
        outs.append(jnp.asarray(rng.normal(size=(d, d)) / np.sqrt(d * heads), dtype))
    return mf.MultiHeadAttention(heads_, out=outs)


def bert_lipschitz(n: int, d: int, *, heads: int = 12, k: int = 32) -> dict:
    """`mf.lipschitz.local` of a random BERT-size layer at n tokens, float32.

    The float32 Lanczos run is refined and its residual checked in float64 (the
    default `refine`), so `converged` is the float64 residual's verdict.

    Args:
        n: tokens.
        d: model width.
        heads: attention heads.
        k: query/key width per head.

    Returns:
        {"n", "d", "heads", "value", "converged", "residual", "iterations",
        "seconds", "passed"}.
    """
    layer = bert_layer(d, heads, k, jnp.float32)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(n, d)), jnp.float32)
    res, seconds = _seconds(lambda: mf.lipschitz.local(layer, x))
    return dict(
        n=n,
        d=d,
        heads=heads,
        head_width=k,
        dtype="float32, refined in float64",
        value=float(res.value),
        converged=bool(res.converged),
        residual=float(res.residual),
        iterations=int(res.iterations),
        seconds=seconds,
        passed=bool(res.converged and np.isfinite(float(res.value))),
    )
