"""Particle dynamics of the Transformer PDE: x_i' = Gamma_mu(x_i) with diffrax.

With a noise the ODE gains a Brownian term (`_noise`, `_noisy_solve`). Its explicit
Euler scheme, the discrete residual Transformer, is `_layers`.
"""

import math
from typing import NamedTuple

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jaxtyping import Array, ArrayLike, Float, Int

from . import _noisy_solve, _normalization, _status
from ._attention.base import AbstractAttention
from ._checks import check_finite_times, check_tolerances, is_traced
from ._clock import (
    checked_on_host,
    clock_length,
    diffeqsolve_in_jit,
    save_fractions,
    to_t,
)
from ._events import (
    EndTrackingPID,
    SignBisection,
    final_status,
    singular_soon,
    stop_condition,
)
from ._linalg import last_axis_sum, row_norms
from ._measures import AbstractParticles
from ._noise import AbstractNoise
from ._normalization import NORMALIZATIONS as NORMALIZATIONS
from ._normalization import ON_SPHERE
from ._progress import progress_meter
from ._repr import fields_repr, status_brief
from ._simulate_inputs import check_common as _check_common
from ._simulate_inputs import (
    check_noise,
    check_options,
    check_start,
    mark_invalid_start,
)

_ADAPTIVE_SOLVERS = {
    "tsit5": dfx.Tsit5,
    "dopri5": dfx.Dopri5,
    "dopri8": dfx.Dopri8,
    "bosh3": dfx.Bosh3,
    "heun": dfx.Heun,
    "midpoint": dfx.Midpoint,
    "ralston": dfx.Ralston,
}
_FIXED_STEP_SOLVERS = {"euler": dfx.Euler}
SOLVERS = tuple(sorted(_ADAPTIVE_SOLVERS) + sorted(_FIXED_STEP_SOLVERS))


class Solution(eqx.Module):
    """Trajectory of a particle measure under attention dynamics.

    Every row of x is the state at its entry of ts, never at another time. With
    `saveat=None` the rows are the start and the state where the solve stopped:
    ts = (t0, t_final), t_final = t1 unless it stopped early (blow-up,
    max_steps, a failure). With explicit save times, a time after such a stop
    was not reached: its entry of ts and its row of x are +inf.

    Attributes:
        ts: save times, shape (T,); +inf where not reached (see above).
        x: positions, shape (T, n, d); rows not reached are +inf.
        blowup_time: first time max_i |x_i| reached `blowup_radius` (or another
            blow-up rule of `simulate` fired), +inf if it did not.
        result: integer result code (`mf.Status`); `status` gives its name.
        t_final: time at which integration stopped.
        num_steps: accepted + rejected solver steps (L for `layers`).
        initial: the initial measure (carries weights and positions).
    """

    ts: Float[Array, " T"]
    x: Float[Array, "T n d"]
    blowup_time: Float[Array, ""]
    result: Int[Array, ""]
    t_final: Float[Array, ""]
    num_steps: Int[Array, ""]
    initial: AbstractParticles

    @property
    def status(self) -> str | np.ndarray:
        """'success' | 'blowup' | 'max_steps' | 'sinkhorn_not_converged' | 'failed'.

        The name of `result` (`mf.Status(result).label`); an array of such
        names for an ensemble (`mf.simulate_ensemble`).
        """
        return _status.names(self.result)

    def __repr__(self) -> str:
        return fields_repr(
            self,
            status=status_brief(self.result),
            t_final=self.t_final,
            num_steps=self.num_steps,
            blowup_time=self.blowup_time,
            ts=self.ts,
            x=self.x,
        )

    @property
    def reached(self) -> Array:
        """Boolean mask (T,) of the save times that were reached."""
        return jnp.isfinite(self.ts)

    def measure(self, i: int) -> AbstractParticles:
        """The measure at `ts[i]`, of the same type as the initial measure.

        Raises:
            IndexError: i outside [-T, T) (JAX would clamp it silently).
        """
        T = self.x.shape[0]
        if not -T <= int(i) < T:
            raise IndexError(f"`i` must be in [-{T}, {T}) (T save times); got {i}.")
        return eqx.tree_at(lambda m: m.x, self.initial, self.x[int(i)])


class SolveInputs(NamedTuple):
    """The traced inputs of a solve that every system of an ensemble shares.

    Scalars in the tokens' dtype unless said; None where the solve has none.
    From `resolve_solve`; `solve_dynamics` takes them after a system's own measure,
    attention, noise and key.

    Attributes:
        t0: start time.
        t1: end time.
        length: the solver clock's length L (`_clock`).
        fractions: save fractions (T,) of [t0, t1], or None (t0 and the end).
        ts: the save times (T,), or None.
        ds0: a fixed step on the clock, or None (adaptive).
        grid: the step ends of a fixed-step noisy solve, or None.
        rtol: relative tolerance.
        atol: absolute tolerance.
        log_radius: log of the blow-up radius.
    """

    t0: Array
    t1: Array
    length: Array
    fractions: Array | None
    ts: Array | None
    ds0: Array | None
    grid: Array | None
    rtol: Array
    atol: Array
    log_radius: Array


def velocity_field(attn, measure, normalization, alpha, t0, rate):
    """(s, state) -> d state / ds on the solver clock (`_clock`), state = (x, flags).

    The field is rate Gamma(t) at t = t0 + s rate (rate = dt/ds). flags integrates two
    indicators, (blowing up, sinkhorn not converged): a nonzero value means it
    happened on an accepted step. "Blowing up" is a velocity that overflows the
    dtype, or an e-folding time max|x| / max|dx/dt| shorter than
    max(1e-10 (t - t0), 1000 ulps of max(|t|, 1)). Near a blow-up at t* the
    e-folding time is at least as short as (t* - t) / p for growth like
    (t* - t)^-p, so the blow-up is that close (relative to the time elapsed, or at
    the resolution of t); past it an adaptive solver only shrinks dt until
    max_steps. The rule reads t and t0 only, never t1: a longer horizon does not
    move it. The velocity is then replaced by 0 so the step is accepted and the
    event stops the solve there.
    """

    def field(s, state, args):
        x, _ = state
        t = to_t(s, t0, rate)
        vel, converged = _normalization.velocity(
            attn, measure, x, t, normalization, alpha
        )
        ulp_t = jnp.finfo(x.dtype).eps * jnp.maximum(jnp.abs(t), 1)
        min_efold = jnp.maximum(1e-10 * s * rate, 1000 * ulp_t)
        if normalization in ON_SPHERE:
            # |x_i| = 1 to rounding: plain squared norms cannot overflow short of
            # a speed the rule stops anyway (inf), and cost a fifth as much.
            speed = jnp.sqrt(jnp.max(last_axis_sum(vel * vel)))
            radius = jnp.maximum(jnp.sqrt(jnp.max(last_axis_sum(x * x))), 1)
        else:
            speed = jnp.max(row_norms(vel))
            radius = jnp.maximum(jnp.max(row_norms(x)), 1)
        too_fast = speed * min_efold > radius
        stop = ~jnp.all(jnp.isfinite(vel)) | too_fast
        vel = jnp.where(stop, 0, vel * rate)
        flags = jnp.stack([stop, ~converged]).astype(x.dtype)
        return vel, flags

    return field


def _solver(solver):
    solver = "tsit5" if solver is None else solver
    if isinstance(solver, dfx.AbstractSolver):
        return solver, not isinstance(solver, dfx.Euler)
    if solver in _ADAPTIVE_SOLVERS:
        return _ADAPTIVE_SOLVERS[solver](), True
    if solver in _FIXED_STEP_SOLVERS:
        return _FIXED_STEP_SOLVERS[solver](), False
    raise ValueError(
        f"`solver` must be one of {SOLVERS} or a diffrax solver; got {solver!r}."
    )


def measure_on_sphere(measure):
    """The measure with every token normalised (inside the jitted solves)."""
    return eqx.tree_at(lambda m: m.x, measure, measure.x / row_norms(measure.x, True))


def simulate(
    measure: AbstractParticles,
    attn: AbstractAttention,
    t1: float,
    *,
    t0: float = 0.0,
    saveat: ArrayLike | None = None,
    solver: str | dfx.AbstractSolver | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    dt0: float | None = None,
    max_steps: int = 100_000,
    normalization: str | None = None,
    ngpt_alpha: float = 0.2,
    blowup_radius: float = 1e8,
    progress: bool = False,
    adjoint: dfx.AbstractAdjoint | None = None,
    noise: AbstractNoise | None = None,
    key: jax.Array | None = None,
) -> Solution:
    """Integrate the particle system x_i' = Gamma_mu(t)(x_i) of the Transformer PDE.

    For mu = sum_j w_j delta_{x_j} the PDE d_t mu + div(mu Gamma_mu) = 0 is exactly this
    ODE (Geshkovski et al., 2023; Castin et al., 2025). Masked particles keep their
    positions s_j; weights never change.

    See [Tokens as particles][math-particles] for the particle system,
    [Where the LayerNorm sits][math-normalizations] for the normalizations,
    [Blow-up detection][math-blowup-particles] for when a run is a blow-up, and
    [The solver clock][math-solver-clock] for the clock the solve runs on. With
    `noise`, the stochastic particle system of [Noise][math-noise].

    Args:
        measure: initial `Particles` or `MaskedParticles`, x of shape (n, d).
        attn: the attention velocity field.
        t1: final time.
        t0: initial time.
        saveat: times (T,) in [t0, t1] at which to save; None saves t0 and the
            end of the solve, t_final (t1 unless it stopped early). Times after
            an early stop are +inf in `ts` and `x`.
        solver: "tsit5" (adaptive, default), "dopri5", "dopri8", "bosh3", "heun",
            "midpoint", "ralston", "euler" (fixed step: needs `dt0`), or a diffrax
            solver instance. With `noise`: "heun" (default), "midpoint",
            "ralston", "spark" (adaptive), "euler" (Euler-Maruyama), "euler_heun",
            "general_shark" (fixed step), or a diffrax SDE solver.
        rtol: relative tolerance of the adaptive step-size controller: finite,
            >= 0 (default 1e-6; 1e-3 with `noise`). A tolerance the dtype cannot
            resolve ends at the step floor, with status "failed".
        atol: absolute tolerance of the adaptive step-size controller: finite,
            >= 0, not 0 with rtol (default as rtol).
        dt0: initial step; when given, the step is constant (fixed-step solve).
        max_steps: step budget, an integer; running out gives status
            "max_steps", not an error.
        normalization: where the LayerNorm sits (`meanfield._normalization`,
            docs/math/particles.md): None; "sphere", the post-LN model of Geshkovski et
            al. (x_i' = P_{x_i}^perp Gamma(x_i)); "pre-ln" (x_i' = Gamma_nu(theta_i),
            nu the measure of directions theta = x/|x|); "peri-ln" (the same,
            normalised to unit speed); "ngpt" (theta_i' = alpha P^perp of the unit
            output). For "sphere" and "ngpt" initial points are normalised, the
            field is evaluated on the sphere, and saved points are projected on it
            (projection method), so |x_i| = 1 to rounding.
        ngpt_alpha: the step scale alpha of "ngpt".
        blowup_radius: stop with status "blowup" when max_i |x_i| reaches it (located
            by root finding on log max_i |x_i| - log R). A blow-up is also reported
            when the velocity overflows the dtype or the e-folding time
            max|x| / max|x'| drops below max(1e-10 (t - t0), 1000 ulps of
            max(|t|, 1)). An adaptive step below 100 ulps of max(|t|, 1) ends
            the solve too: as a blow-up when the radius has grown and a power law
            fitted to it puts the singularity within 1000 such steps, else as
            "failed" (no evidence of growth: e.g. a tolerance the dtype cannot
            meet; always with a normalization, which bounds the speed). No rule
            depends on t1.
        progress: show a tqdm progress bar.
        adjoint: a diffrax adjoint for differentiation (default: recursive
            checkpointing, reverse mode). Use `diffrax.ForwardMode()` for jax.jvp.
        noise: None (the ODE), or `mf.IndependentNoise(sigma)` or
            `mf.CommonNoise(sigma)`: the SDE of [Noise][math-noise], with
            normalization None or "sphere". Gradients are pathwise (fixed key).
        key: a JAX PRNG key, `jax.random.key(seed)`, required with `noise`: one
            key is one Brownian path, whatever the solver, dt0 or tolerances.
            The path is drawn in the tokens' dtype: a float32 and a
            float64 run of one key follow different paths (of the same law).

    Returns:
        A `Solution` (ts, x, blowup_time, status, measure(i)). Under jax.jit or
        jax.vmap, where the tokens or the noise level are traced and cannot be
        checked on the host, a zero token under a normalization, a start at or
        beyond `blowup_radius`, or a noise sigma that is negative, NaN or
        infinite gives status "invalid_input" instead of the ValueError.

    Raises:
        ValueError: bad measure/attention type, tokens neither float32 nor
            float64, unknown solver or normalization, fixed-step solver without
            dt0, t0 or t1 traced (under jax.jit) or not finite, t1 <= t0,
            blowup_radius not above the initial radius, rtol/atol negative,
            non-finite or both 0, max_steps not an integer >= 1, adjoint not a
            diffrax adjoint, ngpt_alpha not finite, a zero token with a
            normalization; `noise` without `key` or the reverse, a key that is not
            a PRNG key, `noise` with another normalization or an ODE-only solver,
            a Milstein solver where the noise is not additive (`ItoMilstein`
            always).
    """
    measure, args, kwargs = resolve_solve(
        measure,
        attn,
        t1,
        t0=t0,
        saveat=saveat,
        solver=solver,
        rtol=rtol,
        atol=atol,
        dt0=dt0,
        max_steps=max_steps,
        normalization=normalization,
        ngpt_alpha=ngpt_alpha,
        blowup_radius=blowup_radius,
        progress=progress,
        adjoint=adjoint,
        noise=noise,
        key=key,
    )
    sol = solve_dynamics(*args, **kwargs)
    # The checks of the tokens and sigma made on the host, for traced ones.
    return mark_invalid_start(sol, measure.x, normalization, blowup_radius, noise)


def resolve_solve(
    measure,
    attn,
    t1,
    *,
    t0=0.0,
    saveat=None,
    solver=None,
    rtol=None,
    atol=None,
    dt0=None,
    max_steps=100_000,
    normalization=None,
    ngpt_alpha=0.2,
    blowup_radius=1e8,
    progress=False,
    adjoint=None,
    noise=None,
    key=None,
):
    """`simulate`'s checks and the arguments of its compiled solve.

    Returns (measure, args, kwargs) with `solve_dynamics(*args, **kwargs)` the solve:
    args = (measure, attn, noise, key, `SolveInputs`). Raises what `simulate`
    raises. `mf.simulate_ensemble` resolves its options here once for all its
    members.
    """
    measure = _check_common(measure, attn, normalization)
    check_noise(noise, key, normalization)
    solver, adaptive = (_solver if noise is None else _noisy_solve.sde_solver)(solver)
    if noise is not None:
        _noisy_solve.check_solver_noise(solver, noise, normalization)
    tol = _noisy_solve.default_tolerance(noise is not None)
    rtol, atol = (tol if v is None else v for v in (rtol, atol))
    check_finite_times(t0=t0, t1=t1)
    if not float(t1) > float(t0):
        raise ValueError(f"`t1` must be greater than `t0`; got t0={t0}, t1={t1}.")
    if not blowup_radius > 0:
        raise ValueError(f"`blowup_radius` must be positive; got {blowup_radius}.")
    check_options(measure.x.dtype, max_steps, adjoint, ngpt_alpha)
    traced = is_traced(measure.x)
    if not traced:
        check_start(measure.x, normalization, blowup_radius)
    if adaptive and dt0 is None:
        check_tolerances(rtol, atol)
    if dt0 is None and not adaptive:
        raise ValueError("fixed-step `solver` needs a step size: pass `dt0`.")
    if dt0 is not None and not float(dt0) > 0:
        raise ValueError(f"`dt0` must be positive; got {dt0}.")
    dtype = measure.x.dtype
    # The solver clock (`_clock`): t0, t1, its length, the save times and
    # fractions, a fixed step, the tolerances and the blow-up radius are all
    # traced arrays. A sweep over any of them, a tight reference beside a
    # default solve, or the next segment of a run reuse one compiled solve, and
    # that solve can be kept in JAX's persistent cache. NumPy, not jnp:
    # converting on the host compiles nothing.
    length = clock_length(t0, t1)
    fractions, checked = save_fractions(saveat, float(t0), float(t1))
    if saveat is None or is_traced(saveat):
        ts = None if saveat is None else saveat.astype(dtype)
    else:
        ts = np.asarray(saveat, dtype)
    ds0 = None if dt0 is None else float(dt0) / (float(t1) - float(t0)) * length
    grid, depth = None, None
    if noise is not None:
        depth = _noisy_solve.brownian_depth(None if ds0 is None else length / ds0)
        if ds0 is not None and checked:  # save times are step ends
            grid = np.asarray(_noisy_solve.fixed_grid(fractions, length, ds0), dtype)
    if checked and fractions is not None:  # host float64 (the grid above): cast
        fractions = fractions.astype(dtype)
    inputs = SolveInputs(
        t0=np.asarray(t0, dtype),
        t1=np.asarray(t1, dtype),
        length=np.asarray(length, dtype),
        fractions=fractions,
        ts=ts,
        ds0=None if ds0 is None else np.asarray(ds0, dtype),
        grid=grid,
        rtol=np.asarray(rtol, dtype),
        atol=np.asarray(atol, dtype),
        log_radius=np.asarray(math.log(blowup_radius), dtype),
    )
    args = (measure, attn, noise, key, inputs)
    kwargs = dict(
        checked=checked,
        brownian_depth=depth,
        solver=solver,
        max_steps=int(max_steps),
        normalization=normalization,
        alpha=float(ngpt_alpha),
        progress=bool(progress),
        adjoint=adjoint,
    )
    return measure, args, kwargs


@eqx.filter_jit
def solve_dynamics(
    measure,
    attn,
    noise,
    key,
    inputs: SolveInputs,
    *,
    checked,
    brownian_depth,
    solver,
    max_steps,
    normalization,
    alpha,
    progress,
    adjoint,
) -> Solution:
    """The diffrax solve of `simulate` on the solver clock (validated there).

    Jitted once per (measure/attention structure, shapes, options): every
    field of `inputs` is a traced array (or None), and so are the noise and its
    key. With `checked` (save times validated on the host) diffrax's own checks
    compile without their callback (`_clock.checked_on_host`), so the program
    holds none and JAX's persistent cache can keep it.
    """
    t0, t1, length, fractions, ts, ds0, grid, rtol, atol, log_radius = inputs
    if normalization in ON_SPHERE:
        measure = measure_on_sphere(measure)
    x0 = measure.x
    dtype = x0.dtype
    rate = (t1 - t0) / length  # dt/ds
    if fractions is None:
        user_save = dfx.SubSaveAt(t0=True, t1=True)
    else:
        user_save = dfx.SubSaveAt(ts=jnp.asarray(fractions, dtype) * length)
    # Always also save the final state: it tells where an early stop happened.
    # An adaptive solve also returns its controller's state: the last accepted
    # step's end (`_events`).
    adaptive = ds0 is None
    save = dfx.SaveAt(
        subs=(user_save, dfx.SubSaveAt(t1=True)), controller_state=adaptive
    )
    if adaptive:
        # The flags are indicators, not dynamics: keep them out of the error norm.
        # A step below 100 ulps of t cannot resolve the solution: stop there
        # (a blow-up only with growth evidence, below).
        controller = EndTrackingPID(
            rtol=rtol,
            atol=atol,
            norm=lambda y: optx.rms_norm(y[0]),
            t_start=t0,
            dt_ds=rate,
            **({} if noise is None else _noisy_solve.SDE_PID),
        )
    else:
        controller = dfx.ConstantStepSize()
    step0 = None if ds0 is None else jnp.asarray(ds0, dtype)
    if noise is not None:  # save times are step ends (`_noisy_solve`)
        args = (controller, fractions, length, ds0, grid, dtype)
        controller, step0 = _noisy_solve.sde_controller(*args)
    # The event time to 64 ulps of s (relative), or far below any step near 0.
    bisection = SignBisection(rtol=64 * float(jnp.finfo(dtype).eps), atol=1e-30)
    meter = progress_meter(progress)
    kwargs = {} if adjoint is None else {"adjoint": adjoint}
    terms = dfx.ODETerm(velocity_field(attn, measure, normalization, alpha, t0, rate))
    if noise is not None:  # drift and diffusion (`_noisy_solve`)
        if normalization in ON_SPHERE:
            solver = _noisy_solve.on_sphere(solver)
        args = (noise, key, x0, normalization, rate, length, brownian_depth, solver)
        terms = _noisy_solve.sde_terms(terms.vector_field, *args)
    with checked_on_host(checked):
        sol = diffeqsolve_in_jit(
            terms,
            solver,
            # Concrete times in the state's dtype (diffrax would promote a float32
            # state to a float64 time).
            jnp.asarray(0.0, dtype),
            length,
            step0,
            (x0, jnp.zeros(2, dtype)),
            saveat=save,
            stepsize_controller=controller,
            max_steps=max_steps,
            event=dfx.Event(stop_condition(log_radius, dtype), root_finder=bisection),
            throw=False,
            progress_meter=meter,
            **kwargs,
        )
    (s_saved, (s_end,)), ((xs, _), ((x_end,), (flags_end,))) = sol.ts, sol.ys
    event = sol.result == dfx.RESULTS.event_occurred
    if adaptive:
        # Without an event the solve ended after its last accepted step; vmapped
        # beside a member whose event fired, diffrax may report a rejected
        # step's end instead (`_events`).
        state = sol.controller_state  # a noisy solve's PID is wrapped (`_noisy_solve`)
        _, s_step, (x_step, flags_step) = state if noise is None else state.inner_state
        s_end = jnp.where(event, s_end, s_step)
        x_end = jnp.where(event, x_end, x_step)
        flags_end = jnp.where(event, flags_end, flags_step)
    # The stop in t: exactly t1 at the end of the clock.
    t_final = jnp.where(s_end == length, t1, to_t(s_end, t0, rate))
    if fractions is None:
        # The last row is the state where the solve stopped: labelled t_final,
        # never t1 after an early stop.
        ts = jnp.stack([t0, t_final])
        xs = xs.at[-1].set(x_end)
    else:
        # The requested times where reached (diffrax marks the others +inf).
        ts = jnp.where(jnp.isfinite(s_saved), ts.astype(dtype), jnp.inf)
    if normalization in ON_SPHERE:
        # Projection method (Hairer, Lubich & Wanner, GNI IV.4): the field is evaluated
        # at x/|x|, so radial round-off (O(rtol t)) never feeds back; report x/|x|.
        norms = row_norms(xs, keepdims=True)
        xs = jnp.where(jnp.isfinite(norms), xs / norms, xs)
    floor_blowup = False
    if adaptive and normalization is None:
        # Every normalization bounds the speed: no blow-up in finite time there.
        def velocity(x, t):
            return _normalization.velocity(attn, measure, x, t, None, alpha)[0]

        start = jnp.max(row_norms(x0))
        floor_blowup = singular_soon(velocity, x_end, t_final, start)
    result, blew_up = final_status(sol.result, flags_end, floor_blowup)
    blowup_time = jnp.where(blew_up, t_final, jnp.inf)
    return Solution(
        ts=ts,
        x=xs,
        blowup_time=blowup_time,
        result=result,
        t_final=t_final,
        num_steps=sol.stats["num_steps"],
        initial=measure,
    )
