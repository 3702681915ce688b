"""The stochastic particle solve: SDE terms, solvers and Brownian path of a noisy run.

`_dynamics.solve_dynamics` integrates, beside the drift of `_dynamics.velocity_field`, a
diffusion term driven by a `diffrax.VirtualBrownianTree` on the solver clock
(`_clock`): with t = t0 + s rate, W_t - W_t0 = sqrt(rate) (W_s - W_0), so the
diffusion on the clock is sqrt(rate) sigma g(x). The tree resolves the path to
2^-`brownian_depth` of the clock, the same for every step of at least
2^-(BROWNIAN_DEPTH - 1) of the clock: one key is one Brownian path, whatever the
solver, step or tolerance (so a strong error can be measured on it), and
`layers` reads its increments off the same path.

What the solver integrates (docs/math/noise.md):
- in R^d the model is the Ito equation dx = Gamma dt + sigma g(x) dW; a
  Stratonovich solver integrates the drift Gamma - c (`AbstractNoise.ito_correction`),
  an Ito solver (Euler-Maruyama) Gamma itself;
- on the sphere the model is the Stratonovich projection
  dx = P^perp_x (Gamma dt + sigma g(x) o dW). Both fields are made homogeneous of
  degree one, |x| P^perp_theta Gamma(theta) and |x| P^perp_theta sigma g(theta) with
  theta = x / |x|: a step from r theta is then r times the step from theta, so
  every step is taken from the sphere and the radius never feeds back (the
  projection method, as for the ODE). Under the Stratonovich chain rule |x| is
  constant; under Ito's formula theta = x / |x| gains the drift
  -(1/2) tr(P^perp g g^T P^perp) theta, which for both noises is the Ito drift of
  the Stratonovich projection: either kind of solver converges to the model. An
  Ito step also grows |x| (like e^{t tr / 2}): Euler-Maruyama normalises its
  state after each step (`SphereEuler`), which keeps it the normalised block of
  `layers`, and other Ito solvers are refused on the sphere.
"""

import math

import diffrax as dfx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from . import _normalization
from ._linalg import row_norms
from ._noise import IndependentNoise
from ._normalization import ON_SPHERE

#: Solvers of a noisy `simulate` by name. Heun, midpoint, Ralston and SPaRK have an
#: embedded error estimate (adaptive, or fixed with `dt0`); the others need `dt0`.
#: All but Euler-Maruyama ("euler", Ito) converge to Stratonovich solutions.
SDE_SOLVERS = {
    "heun": dfx.Heun,
    "midpoint": dfx.Midpoint,
    "ralston": dfx.Ralston,
    "spark": dfx.SPaRK,
    "euler": dfx.Euler,
    "euler_heun": dfx.EulerHeun,
    "general_shark": dfx.GeneralShARK,
}
#: An insensitive PI controller for SDE steps, as diffrax recommends (after
#: Burrage, Herdiana & Burrage, 2004): the error estimate of one step is random.
SDE_PID = {"pcoeff": 0.1, "icoeff": 0.3}
#: Default rtol and atol of an adaptive noisy solve. A strong-order-1/2 step is
#: accepted when its local error, O(dt), is below the tolerance: 1e-6 would take
#: ~1e6 steps per unit time.
SDE_TOLERANCE = 1e-3
#: The default rtol = atol of an ODE solve (`mf.simulate` without noise).
ODE_TOLERANCE = 1e-6


def default_tolerance(noisy: bool) -> float:
    """The default rtol = atol of `mf.simulate` and the studies built on it.

    ODE_TOLERANCE (1e-6) without noise; SDE_TOLERANCE (1e-3) with noise, whose
    steps have local error O(dt) (1e-6 would take ~1e6 steps per unit time).
    """
    return SDE_TOLERANCE if noisy else ODE_TOLERANCE


#: Rejected step ends an adaptive noisy solve remembers (to step back to them):
#: more consecutive rejections end it as "failed" (the step floor comes first).
REVISITS = 100
#: The Brownian path is resolved to 2^-BROWNIAN_DEPTH of the clock's length
#: (1e-6; resolved in float32 too), finer for smaller fixed steps.
BROWNIAN_DEPTH = 20


def sde_solver(solver) -> tuple[dfx.AbstractSolver, bool]:
    """(diffrax solver, adaptive) for `simulate(..., noise=...)`; None is Heun.

    Raises:
        ValueError: a name outside SDE_SOLVERS (an ODE solver such as "tsit5"),
            or a diffrax solver that solves neither Ito nor Stratonovich SDEs.
    """
    if solver is None:
        solver = "heun"
    if isinstance(solver, dfx.AbstractSolver):
        kinds = (dfx.AbstractItoSolver, dfx.AbstractStratonovichSolver)
        if not isinstance(solver, kinds):
            raise ValueError(
                "`solver` must be an SDE solver with `noise` (an Ito or "
                f"Stratonovich diffrax solver, e.g. diffrax.Heun()); got "
                f"{type(solver).__name__}, which solves ODEs only."
            )
    elif solver in SDE_SOLVERS:
        solver = SDE_SOLVERS[solver]()
    else:
        raise ValueError(
            f"`solver` must be an SDE solver with `noise`: one of "
            f"{tuple(SDE_SOLVERS)} or a diffrax Ito/Stratonovich solver; got "
            f"{solver!r}."
        )
    return solver, isinstance(solver, dfx.AbstractAdaptiveSolver)


#: diffrax's solvers that assume commutative noise (the Milstein schemes).
COMMUTATIVE_NOISE_SOLVERS = (dfx.ItoMilstein, dfx.StratonovichMilstein)


def check_solver_noise(solver, noise, normalization) -> None:
    """ValueError for a Milstein solver where the noise is not additive.

    The Milstein schemes need commutative noise. Only independent noise in R^d
    (normalization None) is commutative here: it is additive, sigma dW_i.
    Common noise (sigma x dW^T) and any noise projected on the sphere are
    multiplicative and do not commute. diffrax's `ItoMilstein` also cannot take
    the diffusion as a linear operator, which every noise here is: refused
    always, with Euler-Maruyama as the Ito alternative.

    Raises:
        ValueError: `ItoMilstein`, or `StratonovichMilstein` with a noise that is
            not `IndependentNoise` in R^d.
    """
    if isinstance(solver, dfx.ItoMilstein):
        raise ValueError(
            "`solver` diffrax.ItoMilstein() cannot take meanfield's diffusion (a "
            'linear operator of the Brownian increment); use "euler" '
            '(Euler-Maruyama, Ito) or "heun" (Stratonovich).'
        )
    additive = isinstance(noise, IndependentNoise) and normalization is None
    if isinstance(solver, COMMUTATIVE_NOISE_SOLVERS) and not additive:
        raise ValueError(
            f"`solver` {type(solver).__name__} assumes commutative noise: only "
            "mf.IndependentNoise with normalization=None (additive noise) is; got "
            f"{type(noise).__name__} with normalization={normalization!r}. Use "
            '"heun", "spark" or "general_shark".'
        )


class SphereEuler(dfx.Euler):
    """Euler-Maruyama whose every step ends back on the sphere (x / |x|).

    An Ito step along the tangent noise grows |x| by a factor 1 + O(dt) whose
    product grows like e^{t tr / 2}, tr = tr(P^perp g g^T P^perp); the
    homogeneous fields make each step's direction independent of |x|, so
    normalising the state after the step changes no direction: the solve is the
    normalised block of `layers`, step for step, and |x| = 1 over any horizon.
    """

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        y1, error, _, state, result = super().step(
            terms, t0, t1, y0, args, solver_state, made_jump
        )
        x1, flags = y1
        y1 = (x1 / row_norms(x1, keepdims=True), flags)
        return y1, error, dict(y0=y0, y1=y1), state, result


def on_sphere(solver):
    """The solver a noisy solve on the sphere uses: Euler ends steps on it.

    Raises:
        ValueError: an Ito solver other than Euler-Maruyama (its steps would grow
            |x| like e^{t tr / 2}, see `SphereEuler`).
    """
    if type(solver) is dfx.Euler:
        return SphereEuler()
    if not isinstance(solver, dfx.AbstractStratonovichSolver):
        raise ValueError(
            '`solver` must be a Stratonovich solver or Euler-Maruyama ("euler") '
            'with `noise` and normalization="sphere"; got the Ito solver '
            f"{type(solver).__name__}."
        )
    return solver


def brownian_depth(steps: float | None = None) -> int:
    """Depth k of the Brownian tree: the path is resolved to 2^-k of the clock.

    BROWNIAN_DEPTH, or more for a fixed step: `steps` = length / ds0 equal steps
    on the clock need 2^-(k - 1) <= 1 / steps so that the tree resolves each.
    Computed on the host; a static integer of the compiled solve.
    """
    depth = BROWNIAN_DEPTH
    if steps is not None:
        depth = max(depth, math.ceil(math.log2(steps)) + 1)
    return depth


def fixed_grid(fractions, length: float, ds0: float) -> np.ndarray:
    """Step ends of a fixed-step noisy solve: the grid of `dfx.ConstantStepSize`.

    N = ceil(length / ds0) equal steps on [0, length] (as diffrax takes them),
    merged with the save times `fractions` * length; a save within 1e-9 length
    of a grid point is that point (no sliver of a step). Host values; the solve
    takes the grid as a traced array (one compilation per number of steps).
    """
    n = max(1, math.ceil(length / ds0 - 1e-9))
    grid = np.arange(n + 1) * (length / n)
    if fractions is not None:
        grid = np.union1d(grid, np.asarray(fractions) * length)
    keep = np.concatenate([[True], np.diff(grid) >= 1e-9 * length])
    grid = grid[keep]
    grid[-1] = length
    return grid


def sde_controller(controller, fractions, length, ds0, grid, dtype):
    """(step-size controller, dt0 for diffeqsolve) of a noisy solve.

    Save times are step ends: inside a step an SDE solution is not the solver's
    interpolant, which sees no Brownian path there. Adaptive (`ds0` None):
    `diffrax.ClipStepSizeController` steps to the save times, and back to the
    end of every rejected step, so that no step is rejected for the Brownian
    increment it drew (Foster & Jelincic, 2024; arXiv 2311.14201). Fixed step:
    `diffrax.StepTo` on `grid` (`fixed_grid`); save times traced under a
    caller's jit have no grid and keep the uniform step (their rows are then
    interpolants).

    Args:
        controller: the controller of the ODE solve (PID or constant step).
        fractions: the save fractions (`_clock.save_fractions`), or None.
        length: the clock's length.
        ds0: the fixed step in s, or None (adaptive).
        grid: the step ends of a fixed-step solve (`fixed_grid`), or None.
        dtype: the dtype of the solver's time.
    """
    if ds0 is None:
        step_ts = None if fractions is None else jnp.asarray(fractions, dtype) * length
        clip = dfx.ClipStepSizeController(
            controller, step_ts=step_ts, store_rejected_steps=REVISITS
        )
        return clip, None
    if grid is None:
        return controller, jnp.asarray(ds0, dtype)
    return dfx.StepTo(ts=jnp.asarray(grid, dtype)), None


def _levy_area(solver):
    """The cheapest Levy area the solver accepts (SPaRK, ShARK need space-time)."""
    need = getattr(solver, "minimal_levy_area", None)
    for area in (dfx.BrownianIncrement, dfx.SpaceTimeLevyArea):
        if need is None or issubclass(area, need):
            return area
    return dfx.SpaceTimeTimeLevyArea


def brownian_path(noise, key, x0, length, depth: int, solver=None):
    """The Brownian motion W_s of `noise` on the clock [0, length], for tokens x0.

    Resolved to length 2^-depth (`brownian_depth`). The tree works in fractions
    of its interval: one key gives the same path in fractions of the clock
    whatever its length. The path is drawn in the tokens' dtype: float32 and
    float64 runs of one key follow different (equally distributed) paths.
    """
    shape = noise.brownian_shape(*x0.shape)
    return dfx.VirtualBrownianTree(
        jnp.zeros((), x0.dtype),
        length,
        length * 2.0**-depth,
        jax.ShapeDtypeStruct(shape, x0.dtype),
        key,
        levy_area=_levy_area(solver),
    )


def _tangent(theta, v):
    return v - jnp.sum(theta * v, axis=-1, keepdims=True) * theta


def sde_terms(drift, noise, key, x0, normalization, rate, length, depth, solver):
    """The terms of a noisy solve on the clock: drift and sqrt(rate) sigma g dW.

    Args:
        drift: (s, (x, flags), args) -> (dx/ds, dflags/ds), the field of the ODE.
        noise: the `AbstractNoise`.
        key: the PRNG key of the Brownian path.
        x0: initial tokens (n, d) (shape and dtype of the path).
        normalization: None or "sphere" (`simulate` refuses the others).
        rate: dt/ds.
        length: the clock's length.
        depth: the Brownian tree's depth (`brownian_depth`).
        solver: the diffrax solver (its kind sets the drift, its Levy area the path).
    """
    dtype = x0.dtype
    sphere = normalization in ON_SPHERE
    stratonovich = isinstance(solver, dfx.AbstractStratonovichSolver)
    path = brownian_path(noise, key, x0, length, depth, solver)
    sqrt_rate = jnp.sqrt(rate)

    def drift_term(s, y, args):
        vel, flags = drift(s, y, args)
        if sphere:
            vel = vel * row_norms(y[0], keepdims=True)
            return vel, flags
        if stratonovich:
            vel = vel - rate * noise.ito_correction(y[0])
        return vel, flags

    def diffusion(s, y, args):
        x = y[0]
        radius = row_norms(x, keepdims=True)
        at = x / radius if sphere else x

        def apply(dw):
            kick = sqrt_rate * noise.kick(at, dw)
            if sphere:
                kick = radius * _tangent(at, kick)
            return kick, jnp.zeros(2, dtype)

        return lx.FunctionLinearOperator(apply, path.shape)

    return dfx.MultiTerm(dfx.ODETerm(drift_term), dfx.ControlTerm(diffusion, path))


def layer_increments(noise, key, x0, t1, L: int, length):
    """(L, *shape) increments W(t_{l+1}) - W(t_l), t_l = l t1 / L, in t.

    They are those of the path a noisy `simulate` on [0, t1] with dt0 = t1 / L and
    the same key integrates (clock length `length`).
    """
    path = brownian_path(noise, key, x0, length, brownian_depth(L))
    s = jnp.arange(L + 1, dtype=x0.dtype) * (length / L)
    w = jax.vmap(path.evaluate)(s)
    return jnp.sqrt(t1 / length).astype(x0.dtype) * jnp.diff(w, axis=0)


def noisy_layer(attn, measure, x, t, h, normalization, alpha, noise, dw):
    """(x after one noisy block, converged): x + h Gamma + sigma g(x) dW.

    On the sphere the drift and the kick are projected on the tangent space and
    the result normalised: the Euler-Maruyama step of `simulate`'s SDE.
    """
    vel, ok = _normalization.velocity(attn, measure, x, t, normalization, alpha)
    if normalization in ON_SPHERE:
        theta = x / row_norms(x, keepdims=True)
        step = x + h * vel + _tangent(theta, noise.kick(theta, dw))
        return step / row_norms(step, keepdims=True), ok
    return x + h * vel + noise.kick(x, dw), ok
