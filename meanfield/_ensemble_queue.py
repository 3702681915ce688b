"""Many small particle systems over a work queue: each slot its own adaptive solve.

A vmapped diffrax solve (`simulate` under `jax.vmap`) steps its members in
lockstep until the slowest one ends, and every step pays for machinery that a
member rarely needs: under vmap the event's root find and the save buffers of
every member are evaluated on every step. Here a fixed number of slots step
together, each slot one system's own adaptive solve, and a slot whose system has
reached t1 writes its result and takes the next system of the queue
(compaction): a chunk costs about (total steps) / slots + the longest solve.

Each slot runs exactly `simulate`'s algorithm: the same vector field
(`_dynamics.velocity_field`, on the same solver clock), the solver's own
`step`, the same step-size controller and error norm, diffrax's clipping to the
end of the interval and its dense output at the save times. A system that does not
reach t1 cleanly (an event: the blow-up radius or the "blowing up" flag; the step
floor; the step budget; unconverged Sinkhorn iterations; a start that `simulate`
marks invalid) is handed back to the caller, which solves it again with
`simulate` itself: its status, stop time and saves are then exactly those of a
solo solve.

See [Ensembles of small systems][math-ensemble-queue] for the cost model.
"""

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from . import _noisy_solve, _small_field, _status
from ._dynamics import Solution, measure_on_sphere, velocity_field
from ._events import stop_condition
from ._linalg import last_axis_sum, row_norms
from ._normalization import ON_SPHERE
from ._step_floor import FlooredPIDController

#: Diffrax's solvers the queue runs: explicit Runge-Kutta methods with a local
#: interpolation and an error estimate (the adaptive ODE solvers of `simulate`).
QUEUE_SOLVERS = (dfx.Tsit5, dfx.Dopri5, dfx.Dopri8)
#: With a noise: the adaptive Stratonovich Runge-Kutta solvers of `simulate`.
QUEUE_SDE_SOLVERS = (dfx.Heun, dfx.Midpoint, dfx.Ralston)


#: The first step of an adaptive `simulate` solve on the solver clock.
FIRST_STEP = 0.01


def take_systems(tree, index):
    """Array leaves of a batched pytree at `index` (any shape of indices)."""
    return jax.tree.map(lambda a: a[index] if eqx.is_array(a) else a, tree)


def take_if(tree, index, batched: bool):
    """`take_systems` for a tree that may be shared by every system."""
    return take_systems(tree, index) if batched else tree


def _select(mask, new, old):
    """Per-slot choice between two batched pytrees (mask of shape (slots,))."""

    def pick(a, b):
        if not eqx.is_array(a):
            return a
        m = mask.reshape(mask.shape + (1,) * (a.ndim - 1))
        return jnp.where(m, a, b)

    return jax.tree.map(pick, new, old)


class _Problem(eqx.Module):
    """One system's ODE or SDE on the solver clock: terms, controller, solver.

    With a noise (`noise` and its Brownian `key` not None) the terms, the PI
    coefficients and the clipping to the save times `step_ts` are those of a
    noisy `simulate` (`_noisy_solve`).
    """

    measure: eqx.Module
    attn: eqx.Module
    noise: eqx.Module | None
    key: jax.Array | None
    step_ts: jax.Array | None
    t0: jax.Array
    rate: jax.Array
    rtol: jax.Array
    atol: jax.Array
    length: jax.Array
    normalization: str | None = eqx.field(static=True)
    alpha: float = eqx.field(static=True)
    solver: dfx.AbstractSolver = eqx.field(static=True)

    def term(self):
        attn = self.attn
        if _small_field.applies(attn, self.normalization):
            attn = _small_field.SmallSoftmax(attn)
        field = velocity_field(
            attn, self.measure, self.normalization, self.alpha, self.t0, self.rate
        )
        if self.noise is None:
            return dfx.ODETerm(field)
        return _noisy_solve.sde_terms(
            field,
            self.noise,
            self.key,
            self.measure.x,
            self.normalization,
            self.rate,
            self.length,
            _noisy_solve.brownian_depth(),
            self.solver,
        )

    def controller(self):
        # The flags are indicators, not dynamics: out of the error norm, as in
        # `simulate`.
        pid = FlooredPIDController(
            rtol=self.rtol,
            atol=self.atol,
            norm=lambda y: optx.rms_norm(y[0]),
            t_start=self.t0,
            dt_ds=self.rate,
            **({} if self.noise is None else _noisy_solve.SDE_PID),
        )
        if self.noise is None:
            return pid
        return dfx.ClipStepSizeController(
            pid, step_ts=self.step_ts, store_rejected_steps=_noisy_solve.REVISITS
        )


def _start(problem, length):
    """(first step end, controller state, solver state) of one system at s = 0."""
    term = problem.term()
    dtype = problem.measure.x.dtype
    y0 = (problem.measure.x, jnp.zeros(2, dtype))
    zero, end = jnp.asarray(0.0, dtype), jnp.asarray(length, dtype)
    order = problem.solver.error_order(term)
    # `diffeqsolve` wraps its terms before the controller picks the first
    # step, and diffrax's initial-step heuristic then takes 0.01 (in s), with
    # or without a noise: the same first step as `simulate`'s (tests compare
    # the step counts).
    s_next, cstate = problem.controller().init(
        term, zero, end, y0, FIRST_STEP, None, problem.solver.func, order
    )
    s_next = jnp.minimum(s_next, end)
    fstate = problem.solver.init(term, zero, s_next, y0, None)
    return s_next, cstate, fstate


def _step(problem, length, floor, s_prev, s_next, y, fstate, cstate):
    """One attempted step of one system, with diffrax's bookkeeping.

    `floor` is 100 ulps below the clock's length `length` (`_below_end`).

    Returns (keep, new s_prev, new s_next, y, solver state, controller state,
    ok, interpolation) where ok is False once the controller or the solver
    reports a failure (the step floor).
    """
    term = problem.term()
    solver = problem.solver
    y1, y_err, dense, fstate1, solver_result = solver.step(
        term, s_prev, s_next, y, None, fstate, False
    )
    y_err = jax.tree.map(lambda a: jnp.where(jnp.isnan(a), jnp.inf, a), y_err)
    keep, prev1, next1, _, cstate1, ctrl_result = problem.controller().adapt_step_size(
        s_prev, s_next, y, y1, None, y_err, solver.error_order(term), cstate
    )
    end = jnp.asarray(length, s_prev.dtype)
    prev1 = jnp.minimum(prev1, end)
    # diffrax's clip to the end: within 100 ulps of it, land on it.
    clip = jnp.where(keep, end, prev1 + 0.5 * (end - prev1))
    next1 = jnp.where(next1 > floor, clip, next1)
    y_new = jax.tree.map(lambda a, b: jnp.where(keep, a, b), y1, y)
    fstate_new = jax.tree.map(lambda a, b: jnp.where(keep, a, b), fstate1, fstate)
    ok = (ctrl_result == dfx.RESULTS.successful) & (
        ~keep | (solver_result == dfx.RESULTS.successful)
    )
    interp = solver.interpolation_cls(t0=s_prev, t1=s_next, **dense)
    return keep, prev1, next1, y_new, fstate_new, cstate1, ok, interp


class QueueOut(eqx.Module):
    """Per-system results of a queue solve (leading axis: the systems).

    Attributes:
        xs: the saves (B, T, n, d), x at each save time on the solver clock
            (with a noise, save times are step ends).
        x_end: the state where the solve stopped (B, n, d).
        num_steps: attempted steps (B,).
        clean: whether the system reached the end of the clock with no event,
            step floor, step budget or flag (B,); the others are solved again
            by the caller.
    """

    xs: jax.Array
    x_end: jax.Array
    num_steps: jax.Array
    clean: jax.Array


@eqx.filter_jit
def run_particle_queue(
    systems,
    batched: tuple[bool, bool],
    t0,
    t1,
    length,
    save_s,
    step_ts,
    rtol,
    atol,
    log_radius,
    *,
    solver: dfx.AbstractSolver,
    normalization,
    alpha: float,
    max_steps: int,
    slots: int,
) -> QueueOut:
    """Solve B systems over `slots` slots (see the module docstring).

    Args:
        systems: (measures, attn, noise, keys): B measures (batch axis first),
            already checked; one attention or B of them; None (ODEs) or the
            noise, one or B of them; None or the B keys of the Brownian paths.
        batched: whether the attention and the noise carry the batch axis.
        t0: start of the interval (traced scalar of the tokens' dtype).
        t1: its end.
        length: the solver clock's length L (traced scalar).
        save_s: save times on the solver clock (T,), non-decreasing in [0, L].
        step_ts: with a noise, the save times the steps end at (None: both
            ends of the clock only, as in `simulate`).
        rtol: relative tolerance, as in `simulate` (traced).
        atol: absolute tolerance (traced).
        log_radius: log of the blow-up radius (traced).
        solver: a diffrax adaptive explicit Runge-Kutta solver (`QUEUE_SOLVERS`,
            or `QUEUE_SDE_SOLVERS` with a noise).
        normalization: where the LayerNorm sits, as in `simulate`.
        alpha: nGPT's step scale.
        max_steps: the step budget of each system.
        slots: systems stepping together (at most B).
    """
    measures, attn, noise, keys = systems
    batched_attention, batched_noise = batched
    if normalization in ON_SPHERE:
        measures = jax.vmap(measure_on_sphere)(measures)
    x0 = measures.x
    size, n, d = x0.shape
    dtype = x0.dtype
    rate = (t1 - t0) / length
    count = save_s.shape[0]
    floor = _below_end(length)

    if noise is not None and normalization in ON_SPHERE:
        solver = _noisy_solve.on_sphere(solver)

    def problem(m, a, nz, k):
        tolerances = (t0, rate, rtol, atol)
        options = (length, normalization, alpha, solver)
        return _Problem(m, a, nz, k, step_ts, *tolerances, *options)

    attn_axis = 0 if batched_attention else None
    noise_axis = 0 if batched_noise else None
    key_axis = None if keys is None else 0
    # Every system's first step and solver state, in one batched pass.
    s_next0, cstate0, fstate0 = jax.vmap(
        lambda m, a, nz, k: _start(problem(m, a, nz, k), length),
        in_axes=(0, attn_axis, noise_axis, key_axis),
    )(measures, attn, noise, keys)

    if normalization in ON_SPHERE:
        # `stop_condition` on states with |x_i| = 1 to rounding: squared norms
        # cannot overflow, and a slice-wise sum costs a fifth of `row_norms`.
        def condition(s, y, args):
            radius_sq = jnp.max(last_axis_sum(y[0] * y[0]))
            tiny = jnp.finfo(dtype).tiny
            crossed = 0.5 * jnp.log(radius_sq) - log_radius
            return jnp.maximum(crossed, jnp.abs(y[1][0]) - tiny)
    else:
        condition = stop_condition(log_radius, dtype)
    sys0 = jnp.arange(slots)
    carry0 = dict(
        sys=sys0,
        s_prev=jnp.zeros(slots, dtype),
        s_next=s_next0[sys0],
        y=(x0[sys0], jnp.zeros((slots, 2), dtype)),
        fstate=take_systems(fstate0, sys0),
        cstate=take_systems(cstate0, sys0),
        save=jnp.zeros(slots, jnp.int32),
        steps=jnp.zeros(slots, jnp.int32),
        head=jnp.asarray(slots),
        xs=jnp.full((size, count, n, d), jnp.inf, dtype),
        x_end=x0,
        num_steps=jnp.zeros(size, jnp.int32),
        clean=jnp.zeros(size, bool),
    )

    def step_slot(m, a, nz, k, s_prev, s_next, y, fstate, cstate):
        args = (s_prev, s_next, y, fstate, cstate)
        return _step(problem(m, a, nz, k), length, floor, *args)

    def body(c):
        sys = c["sys"]
        active = sys < size
        index = jnp.minimum(sys, size - 1)
        a_slot = take_if(attn, index, batched_attention)
        noise_slot = take_if(noise, index, batched_noise)
        keep, s_prev, s_next, y, fstate, cstate, ok, interp = jax.vmap(
            step_slot, in_axes=(0, attn_axis, noise_axis, key_axis, 0, 0, 0, 0, 0)
        )(
            take_systems(measures, index),
            a_slot,
            noise_slot,
            None if keys is None else keys[index],
            c["s_prev"],
            c["s_next"],
            c["y"],
            c["fstate"],
            c["cstate"],
        )
        keep = keep & active

        # Saves inside the accepted step (s_prev_old, s_next_old], by the
        # step's interpolation, as diffrax does.
        def wants(save):
            at = save_s[jnp.minimum(save, count - 1)]
            return keep & (save < count) & (at <= c["s_next"])

        def save_body(state):
            save, xs = state
            want = wants(save)
            at = save_s[jnp.minimum(save, count - 1)]
            x_at = jax.vmap(lambda f, s: f.evaluate(s)[0])(interp, at)
            row = jnp.where(want, index, size)  # out of range: dropped
            xs = xs.at[row, jnp.minimum(save, count - 1)].set(x_at, mode="drop")
            return save + want, xs

        save, xs = jax.lax.while_loop(
            lambda state: jnp.any(wants(state[0])), save_body, (c["save"], c["xs"])
        )

        steps = c["steps"] + active
        stopped = jax.vmap(lambda s, yy: condition(s, yy, None) > 0)(s_prev, y)
        at_end = s_prev >= length
        finished = active & (at_end | ~ok | stopped | (steps >= max_steps))
        clean = finished & at_end & ok & ~stopped & (y[1][:, 1] == 0)
        row = jnp.where(finished, index, size)
        x_end = c["x_end"].at[row].set(y[0], mode="drop")
        num_steps = c["num_steps"].at[row].set(steps, mode="drop")
        clean_out = c["clean"].at[row].set(clean, mode="drop")

        # Refill: the k-th finished slot takes system head + k.
        rank = jnp.cumsum(finished) - 1
        incoming = jnp.where(finished, c["head"] + rank, sys)
        incoming = jnp.where(finished & (incoming >= size), size, incoming)
        fresh = finished & (incoming < size)
        take = jnp.minimum(incoming, size - 1)
        y_in = (x0[take], jnp.zeros((slots, 2), dtype))
        return dict(
            sys=incoming,
            s_prev=jnp.where(fresh, 0, s_prev),
            s_next=jnp.where(fresh, s_next0[take], s_next),
            y=_select(fresh, y_in, y),
            fstate=_select(fresh, take_systems(fstate0, take), fstate),
            cstate=_select(fresh, take_systems(cstate0, take), cstate),
            save=jnp.where(fresh, 0, save),
            steps=jnp.where(fresh, 0, steps),
            head=c["head"] + jnp.sum(finished),
            xs=xs,
            x_end=x_end,
            num_steps=num_steps,
            clean=clean_out,
        )

    out = jax.lax.while_loop(lambda c: jnp.any(c["sys"] < size), body, carry0)
    return QueueOut(
        xs=out["xs"],
        x_end=out["x_end"],
        num_steps=out["num_steps"],
        clean=out["clean"],
    )


#: The largest system the queue serves: its slots hold whole systems, and every
#: step evaluates each slot's n x n interactions densely.
MAX_TOKENS = 256
#: Pair interactions evaluated together per step (slots x n^2): enough to keep
#: the step's overhead small against its field, small enough to stay in cache.
PAIRS_PER_STEP = 1 << 18


def applies(measures, noise, options) -> bool:
    """Whether the queue can solve these systems (else: vmapped `simulate`)."""
    solver = options.get("solver")
    if noise is None:
        names, kinds = (None, "tsit5", "dopri5", "dopri8"), QUEUE_SOLVERS
    else:
        names, kinds = (None, "heun", "midpoint", "ralston"), QUEUE_SDE_SOLVERS
    known = (
        solver in names
        if isinstance(solver, str | None)
        else (isinstance(solver, kinds))
    )
    return (
        known
        and options.get("dt0") is None
        and options.get("adjoint") is None
        and not options.get("progress", False)
        and measures.x.shape[1] <= MAX_TOKENS
    )


def slots_for(size: int, n: int) -> int:
    """Slots for a chunk of `size` systems of n tokens (`PAIRS_PER_STEP`)."""
    return int(max(1, min(size, PAIRS_PER_STEP // (n * n))))


def preferred(measures, noise) -> bool:
    """Whether "auto" takes the queue: measured faster than lockstep there.

    `benchmarks/ensemble_scaling.py`: 6-9x at n = 128-256, d = 2; even at n = 128,
    d = 16; at n = 256, d = 16 lockstep is 1.3x faster (four slots of 256 tokens
    leave a step's fixed costs large against its field). With a noise the
    Brownian path dominates a step and step counts vary little: no faster.
    """
    n, d = measures.x.shape[1:]
    return noise is None and (n <= 128 or d <= 8)


@eqx.filter_jit
def assemble(out: QueueOut, measures, t0, t1, ts, *, normalization, saved_ends):
    """The `Solution` (batch axis first) of the systems the queue ended cleanly.

    `ts` holds the save times (T,) or None (`saved_ends`: rows t0 and t_final).
    """
    size = out.xs.shape[0]
    dtype = out.xs.dtype
    xs = out.xs
    if saved_ends:
        ts = jnp.stack([t0, t1]).astype(dtype)
        xs = xs.at[:, -1].set(out.x_end)
    if normalization in ON_SPHERE:
        measures = jax.vmap(measure_on_sphere)(measures)
        norms = row_norms(xs, keepdims=True)
        xs = jnp.where(jnp.isfinite(norms), xs / norms, xs)
    return Solution(
        ts=jnp.broadcast_to(jnp.asarray(ts, dtype), (size, xs.shape[1])),
        x=xs,
        blowup_time=jnp.full(size, jnp.inf, dtype),
        result=jnp.full(size, _status.SUCCESS, jnp.int32),
        t_final=jnp.full(size, t1, dtype),
        num_steps=out.num_steps,
        initial=measures,
    )


def solve(systems, batched, resolved, redo):
    """B systems: the queue, then `redo(indices)` for those it did not end cleanly.

    Args:
        systems: (measures, attn, noise, keys) as `run_particle_queue`'s; the
            measures as `simulate_ensemble`'s.
        batched: whether the attention and the noise carry the batch axis.
        resolved: (the `_dynamics.SolveInputs` every system shares, the
            blow-up radius, `_dynamics.solve_dynamics`'s keywords), from
            `_dynamics.resolve_solve`.
        redo: indices (k,) -> the vmapped `simulate` of those systems (a
            `Solution` with batch axis k).

    Returns:
        A `Solution` with batch axis B.
    """
    measures, attn, noise, keys = systems
    size, n = measures.x.shape[:2]
    inputs, _, kwargs = resolved
    fractions = inputs.fractions
    save_s = saves_on_clock(fractions, inputs.length, measures.x.dtype)
    # With a noise the steps end at the user's save times (`sde_controller`).
    step_ts = save_s if noise is not None and fractions is not None else None
    out = run_particle_queue(
        systems,
        batched,
        inputs.t0,
        inputs.t1,
        inputs.length,
        save_s,
        step_ts,
        inputs.rtol,
        inputs.atol,
        inputs.log_radius,
        solver=kwargs["solver"],
        normalization=kwargs["normalization"],
        alpha=kwargs["alpha"],
        max_steps=kwargs["max_steps"],
        slots=slots_for(size, n),
    )
    sol = assemble(
        out,
        measures,
        inputs.t0,
        inputs.t1,
        inputs.ts,
        normalization=kwargs["normalization"],
        saved_ends=fractions is None,
    )
    again = np.flatnonzero(~np.asarray(out.clean))
    if again.size:
        fixed = redo(again)
        sol = jax.tree.map(
            lambda a, b: a.at[again].set(b) if eqx.is_array(a) else a, sol, fixed
        )
    return sol


def _below_end(length):
    """The clock's length less 100 ulps (diffrax's clip to the end)."""
    return jax.lax.fori_loop(
        0, 100, lambda _, v: jnp.nextafter(v, -jnp.inf), jnp.asarray(length)
    )


def saves_on_clock(fractions, length, dtype) -> np.ndarray:
    """Save times on the solver clock: fractions x L (None: both ends)."""
    fractions = (0.0, 1.0) if fractions is None else fractions
    return np.asarray(fractions, dtype) * np.asarray(length, dtype)
