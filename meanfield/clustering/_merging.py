"""Merging of weighted atoms, and long runs that merge as clusters form.

Clustering is metastable: tokens gather into clusters in time O(1), and the
clusters merge on time scales that grow like e^{c beta} (Geshkovski, Koubbi,
Polyanskiy & Rigollet, 2024; Bruno, Pasqualotto & Agazzi, ICLR 2025). A cluster
whose atoms lie within `tol` of each other moves, to O(tol^2), like one atom of
its total weight at its weighted mean (the first-order term of the kernel's
Taylor expansion cancels at the mean, docs/math/energy.md). `simulate_merging`
replaces each such cluster by that atom between segments of the solve, so a run
to t = 10^8 costs a few hundred steps of a few atoms instead of a stiff system of
n tokens.
"""

import dataclasses

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from jaxtyping import Array, ArrayLike, Bool, Float
from scipy.spatial import cKDTree

from .. import _dynamics, _normalization
from .._attention.base import AbstractAttention
from .._checks import check_finite_times, check_tolerances, reject_result
from .._clock import diffeqsolve_in_jit
from .._linalg import row_norms
from .._measures import AbstractParticles, MaskedParticles, Particles
from .._normalization import ON_SPHERE
from .._repr import fields_repr
from .._simulate_inputs import check_common
from .._status import FAILED, MAX_STEPS, SUCCESS
from .._status import name as status_name
from .._step_floor import FlooredPIDController
from ._checks import check_positive
from ._detect import detect
from ._energy import energy

# |x| within this many ulps of 1 on every atom: the tokens live on the sphere.
_SPHERE_ULPS = 100


def _lives_on_sphere(x: np.ndarray) -> bool:
    norms = np.linalg.norm(x, axis=-1)
    return bool(np.all(np.abs(norms - 1) <= _SPHERE_ULPS * np.finfo(x.dtype).eps))


def _directions(centres, x, weights, labels, sizes) -> np.ndarray:
    """The merged atoms on the sphere: their weighted means' directions.

    A cluster that balances on the sphere (mean 0 to rounding: two antipodal
    atoms of equal weight) has no mean direction; it keeps the direction of its
    heaviest atom, the first of equal ones. That is the limit of the mean's
    direction as that atom's weight wins: for antipodal atoms with w_1 > w_2 the
    mean (w_1 - w_2) x_1 / (w_1 + w_2) points along x_1.
    """
    norms = np.linalg.norm(centres, axis=-1)
    lengths = np.linalg.norm(x, axis=-1)
    scale = np.zeros(len(centres))
    np.maximum.at(scale, labels, lengths)
    # A mean of `size` terms of length <= scale is exact to ~size ulps of scale.
    eps = np.finfo(centres.dtype).eps
    balanced = norms <= 4 * sizes * eps * scale
    # Heaviest atom of each cluster: atoms by weight down, then index up; the
    # first of each label in that order.
    order = np.lexsort((np.arange(len(x)), -weights))
    _, first = np.unique(labels[order], return_index=True)
    heaviest = x[order[first]].astype(centres.dtype)
    safe = np.where(balanced, 1.0, norms)[:, None]
    return np.where(
        balanced[:, None],
        heaviest / np.linalg.norm(heaviest, axis=-1, keepdims=True),
        centres / safe,
    )


def merge(
    measure: AbstractParticles, tol: float, *, sphere: bool | None = None
) -> tuple[Particles, np.ndarray]:
    """Merge atoms closer than `tol` (single linkage) into weighted atoms.

    Each connected component of the graph |x_i - x_j| <= tol becomes one atom:
    its weight is the summed weight, its position the weighted mean, projected
    back on the unit sphere when the tokens live there; a component whose mean
    is 0 to rounding (antipodal atoms of equal weight) has no direction and
    keeps its heaviest atom's (the first of equal ones). Coincident atoms merge
    exactly (the velocity field of the merged measure is the same); atoms within
    tol change it by O(tol^2).

    See [Merging atoms][math-merging] for why the field changes by O(tol^2).

    Args:
        measure: `Particles`, shape (n, d) (not masked: merging tokens of
            different positions s would change who attends to whom).
        tol: merging distance, > 0.
        sphere: project the merged atoms on the unit sphere; None projects when
            every |x_i| is 1 to 100 ulps.

    Returns:
        (merged, labels): `Particles` of k <= n atoms, in order of first
        appearance of their clusters, dtype of the input; labels (n,) the atom
        each input atom went to.

    Raises:
        ValueError: masked particles, non-finite positions, tol not positive.
        TypeError: `measure` is a `Solution` (pass `sol.measure(i)`).
    """
    if isinstance(measure, MaskedParticles):
        raise ValueError(
            "`measure` must be unmasked Particles: merging tokens of different "
            "positions would change the causal mask."
        )
    if not isinstance(measure, AbstractParticles):
        reject_result(
            measure,
            "measure",
            "merge",
            expected="Particles",
            take="sol.measure({i})",
            positions=False,
        )
        raise ValueError(f"`measure` must be Particles; got {type(measure).__name__}.")
    tol = check_positive(tol, "tol")
    x = np.asarray(measure.x)
    w = np.asarray(measure.weights, np.float64)
    found = detect(x, tol, weights=w)
    centres, masses = found.centres, found.masses
    if _lives_on_sphere(x) if sphere is None else sphere:
        centres = _directions(centres, x, w, found.labels, found.sizes)
    # Exact simplex weights in the measure's dtype (sums of weights may round).
    masses = masses / masses.sum()
    return Particles(centres.astype(x.dtype), masses.astype(x.dtype)), found.labels


@dataclasses.dataclass(frozen=True, eq=False)  # array fields: no elementwise ==
class MergingSolution:
    """A run of `simulate_merging`: weighted atoms at every save time.

    Attributes:
        ts: save times, shape (T,).
        x: atom positions, shape (T, n, d); rows past `counts[i]` are NaN.
        weights: atom weights, shape (T, n); 0 past `counts[i]`.
        counts: number of atoms after merging at each save time, shape (T,).
        log_energy: log of the interaction energy (`clustering.energy`, with
            `beta`) at each save time, shape (T,), finite for any beta; None
            when beta is unknown. `energy` is its exponential.
        beta: the inverse temperature of the energy, or None.
        status: "success", "max_steps" (a solve between two merges ran out of
            steps) or "failed" (a non-finite state, e.g. a blow-up in R^d, or a
            step below 100 ulps of max(s, 1), s the time since the segment's
            start, met at s < 1); save times after the stop hold NaN.
        num_steps: solver steps over all segments.
        merge_times: the times of the merges, in order, shape (M,): each the
            root of min |x_i - x_j| = merge_tol on the solver's dense output,
            located to the solver's tolerance (one event may merge more than
            two atoms).
    """

    ts: np.ndarray
    x: np.ndarray
    weights: np.ndarray
    counts: np.ndarray
    log_energy: np.ndarray | None
    beta: float | None
    status: str
    num_steps: int
    merge_times: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))

    def __repr__(self) -> str:
        reached = np.flatnonzero(self.counts > 0)
        return fields_repr(
            self,
            status=self.status,
            num_steps=self.num_steps,
            t_final=self.ts[reached[-1]] if reached.size else np.nan,
            atoms=self.counts[reached[-1]] if reached.size else 0,
            beta=self.beta,
            ts=self.ts,
            x=self.x,
        )

    @property
    def energy(self) -> np.ndarray | None:
        """The interaction energy at each save time, shape (T,) (inf past ~e^700)."""
        return None if self.log_energy is None else np.exp(self.log_energy)

    def measure(self, i: int) -> Particles:
        """The merged measure at `ts[i]` (`counts[i]` atoms)."""
        k = int(self.counts[i])
        if k == 0:
            raise IndexError(f"save time {i} was not reached (status {self.status}).")
        return Particles(self.x[i, :k], self.weights[i, :k])


def _beta_of(attn) -> float | None:
    """Beta when the interaction matrix is a constant beta I, else None."""
    a = getattr(attn, "A", None)
    if a is None or callable(a):
        return None
    a = np.asarray(a, np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        return None
    beta = float(a[0, 0])
    if beta > 0 and np.array_equal(a, beta * np.eye(a.shape[0])):
        return beta
    return None


def _padded(measure: Particles) -> Particles:
    """The atoms padded to the next power of two by weight-0 copies of atom 0.

    One compiled solve serves every atom count in (2^(j-1), 2^j]. A weight-0 copy
    of an atom moves exactly with it and acts on nobody.
    """
    k = measure.n
    size = 1 << (k - 1).bit_length()
    x = np.asarray(measure.x)
    w = np.asarray(measure.weights)
    x = np.concatenate([x, np.repeat(x[:1], size - k, axis=0)])
    w = np.concatenate([w, np.zeros(size - k, w.dtype)])
    return Particles(x, w)


def _min_distance(x: Float[Array, "n d"], real: Bool[Array, " n"]) -> Array:
    """Min |x_i - x_j| over pairs i != j of real atoms, in O(256 n) memory.

    Differences, not |x_i|^2 + |x_j|^2 - 2<x_i, x_j>, which cancels to rounding
    at the small distances a merge tolerance sits at.
    """
    n = x.shape[0]

    def row(args):
        xi, ri, i = args
        dist = row_norms(x - xi[None, :])
        others = real & ri & (jnp.arange(n) != i)
        return jnp.min(jnp.where(others, dist, jnp.inf))

    return jnp.min(jax.lax.map(row, (x, real, jnp.arange(n)), batch_size=256))


@eqx.filter_jit
def _segment(
    measure,
    attn,
    t0,
    t1,
    ts,
    tol,
    rtol,
    atol,
    *,
    solver,
    max_steps,
    normalization,
    alpha,
):
    """Solve from t0 towards t1 until two real atoms come within `tol`.

    Integrated in s = t - t0 with every time traced (unlike `mf.simulate`'s
    static clock and save fractions): the segments of a run start at the event
    times, and one compilation per atom count serves them all. The step floor
    (`FlooredPIDController`) is 100 ulps of max(s, 1), the resolution of the
    segment's own clock: a merge at t = 3e15 takes steps of order 1, below 100
    ulps of t (50) but not of s near 0 (`_run` restarts a long segment there).

    Returns:
        (saved ts (T,), +inf where not reached; saved x (T, n, d); t_end;
        x_end (n, d); diffrax result; steps).
    """
    real = measure.weights > 0
    dtype = measure.x.dtype
    cond_dtype = jnp.result_type(float)  # diffrax compares with a Python 0.0

    def field(s, x, args):
        t = t0 + s
        vel, _ = _normalization.velocity(attn, measure, x, t, normalization, alpha)
        return vel

    def apart(t, y, args, **kwargs):  # diffrax passes t, y, args by keyword
        x = y
        return (_min_distance(x, real) - tol).astype(cond_dtype)

    # The event is located inside the step on the solver's dense output. `apart`
    # falls from + to -: optimistix's `flip=True` is the setting for a
    # decreasing function (flip=False keeps the point where the value is < 0 as
    # the *lower* end, and the bisection collapsed at the step's end: merges
    # late by up to a step). It stops when the time is resolved to 64 ulps and
    # the distance to a thousandth of the solver's tolerance (the state is no
    # more accurate than that); if rounding makes the second out of reach, the
    # root find ends on its step count with the time resolved all the same.
    eps = float(jnp.finfo(dtype).eps)
    root_finder = optx.Bisection(
        rtol=64 * eps,
        atol=jnp.maximum(1e-3 * jnp.minimum(rtol, atol), 64 * eps),
        flip=True,
    )

    length = t1 - t0
    save = dfx.SaveAt(
        subs=(dfx.SubSaveAt(ts=jnp.clip(ts - t0, 0, length)), dfx.SubSaveAt(t1=True))
    )
    sol = diffeqsolve_in_jit(
        dfx.ODETerm(field),
        solver,
        jnp.zeros((), dtype),
        length,
        None,
        measure.x,
        saveat=save,
        stepsize_controller=FlooredPIDController(
            rtol=rtol, atol=atol, t_start=jnp.zeros((), dtype), dt_ds=1.0
        ),
        max_steps=max_steps,
        event=dfx.Event(apart, root_finder=root_finder, direction=False),
        throw=False,
    )
    (s_saved, s_end), (xs, x_end) = sol.ts, sol.ys
    if normalization in ON_SPHERE:  # the projection method, as `mf.simulate`
        xs = xs / row_norms(xs, keepdims=True)
        x_end = x_end / row_norms(x_end, keepdims=True)
    return t0 + s_saved, xs, t0 + s_end[0], x_end[0], sol.result, sol.stats["num_steps"]


def simulate_merging(
    mu: AbstractParticles,
    attn: AbstractAttention,
    t1: float,
    *,
    merge_tol: float,
    saveat: ArrayLike,
    normalization: str | None = None,
    beta: float | None = None,
    t0: float = 0.0,
    solver: str = "tsit5",
    rtol: float = 1e-8,
    atol: float = 1e-8,
    max_steps: int = 100_000,
    ngpt_alpha: float = 0.2,
    progress: bool = False,
) -> MergingSolution:
    """Simulate, merging two atoms into one whenever they come within `merge_tol`.

    The solve stops at the first time two atoms are `merge_tol` apart (an
    event located inside the step by bisection on the solver's dense output,
    so exact to the solver's tolerance), merges the atoms within that distance
    (`merge`), and goes on from there with fewer atoms. So a tight cluster
    never has to be resolved: its internal contraction (rate O(1), or e^beta
    unnormalised) would otherwise bound an explicit solver's step for the whole
    of an exponentially long run. Atom counts are padded to powers of two, so at
    most log2(n) + 1 solves are compiled.

    See [Why merge during the run][math-merging-why] and [Merging atoms][math-merging].

    Args:
        mu: initial unmasked `Particles` (n, d).
        attn: the attention field.
        t1: final time, finite; must equal saveat[-1].
        merge_tol: merging distance, > 0. A merge perturbs the field by
            O(merge_tol^2) (docs/math/energy.md); tokens of one cluster approach
            each other exponentially fast, so a small tolerance costs little.
        saveat: save times (T,), strictly increasing from t0 to t1 (a log-spaced
            grid suits metastable runs).
        normalization: as `mf.simulate` ("sphere" for the tokens on S^{d-1};
            merged atoms are then projected back on it).
        beta: inverse temperature of the energy; None reads it from attn.A when
            that is a constant beta I (else no energy is computed).
        t0: initial time; must equal saveat[0].
        solver: an adaptive solver name of `mf.SOLVERS` or a diffrax solver.
        rtol: relative tolerance of the adaptive steps.
        atol: absolute tolerance of the adaptive steps.
        max_steps: step budget of each solve between two merges.
        ngpt_alpha: the step scale alpha of normalization="ngpt".
        progress: show a progress bar over the merges (tqdm).

    Returns:
        A `MergingSolution` (ts, x, weights, counts, energy, status,
        merge_times), in float64 whatever JAX's default precision.

    Raises:
        ValueError: masked particles, merge_tol not positive, t0 or t1 not a
            finite number, saveat not increasing from t0 to t1, a fixed-step
            solver.
        TypeError: `mu` is a `Solution` (pass `sol.measure(i)`).
    """
    if isinstance(mu, MaskedParticles) or not isinstance(mu, AbstractParticles):
        reject_result(
            mu,
            "mu",
            "simulate_merging",
            expected="unmasked Particles",
            take="sol.measure({i})",
            positions=False,
        )
        raise ValueError(f"`mu` must be unmasked Particles; got {type(mu).__name__}.")
    merge_tol = check_positive(merge_tol, "merge_tol")
    check_finite_times(t0=t0, t1=t1)
    check_tolerances(rtol, atol)
    solver, adaptive = _dynamics._solver(solver)
    if not adaptive:
        raise ValueError("`solver` must be adaptive: merges happen at located events.")
    ts = np.asarray(saveat, np.float64)
    if ts.ndim != 1 or ts.size < 2 or not np.all(np.diff(ts) > 0):
        raise ValueError("`saveat` must be a strictly increasing (T,) array, T >= 2.")
    if ts[0] != float(t0) or ts[-1] != float(t1):
        raise ValueError(
            f"`saveat` must run from t0 = {t0} to t1 = {t1}; got {ts[0]} to {ts[-1]}."
        )
    if beta is None:
        beta = _beta_of(attn)
    elif not (np.isfinite(float(beta)) and float(beta) > 0):
        raise ValueError(f"`beta` must be positive and finite; got {beta}.")
    check_common(mu, attn, normalization)

    # Long runs need float64 time: at t = 1e6 a float32 ulp is 0.06, coarser
    # than a merge, which takes a time of order 1.
    # The options of every `_segment` solve (static) and its tolerances.
    solve = {
        "solver": solver,
        "max_steps": int(max_steps),
        "normalization": normalization,
        "alpha": float(ngpt_alpha),
    }
    with jax.enable_x64(True):
        mu = Particles(np.asarray(mu.x, np.float64), np.asarray(mu.weights, np.float64))
        return _run(mu, attn, ts, merge_tol, (rtol, atol), beta, solve, progress)


def _run(mu, attn, ts, merge_tol, tolerances, beta, solve, progress) -> MergingSolution:
    """The event loop of `simulate_merging` (arguments checked there)."""
    t0, t1 = float(ts[0]), float(ts[-1])
    n, d = mu.n, mu.dim
    dtype = np.asarray(mu.x).dtype
    out = _Record(ts, n, d, dtype, beta)
    t, status, steps = float(t0), SUCCESS, 0
    sphere = solve["normalization"] in ON_SPHERE
    current = _merge_until_apart(mu, merge_tol, sphere)
    out.save(0, current)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n - 1, desc="simulate_merging", unit="merge")
    while True:
        k = current.n
        saved_t, saved_x, t_end, x_end, result, num = _segment(
            _padded(current),
            attn,
            *(np.asarray(v, dtype) for v in (t, t1, ts, merge_tol, *tolerances)),
            **solve,
        )
        steps += int(num)
        saved_t, t_end = np.asarray(saved_t), float(t_end)
        for i in np.flatnonzero((ts > t) & np.isfinite(saved_t)):
            out.save(i, Particles(np.asarray(saved_x[i, :k]), current.weights))
        x_end = np.asarray(x_end)[:k]
        if not np.all(np.isfinite(x_end)):
            status = FAILED
            break
        # A save time that coincides with the event may be left out by diffrax.
        for i in np.flatnonzero((ts > t) & (ts <= t_end) & (out.counts == 0)):
            out.save(i, Particles(x_end, current.weights))
        if result == dfx.RESULTS.successful:
            break
        gap = (
            float(cKDTree(x_end).query(x_end, k=2)[0][:, 1].min()) if k > 1 else np.inf
        )
        # Under some solves diffrax reports a located event as the root find's
        # "nonlinear_max_steps_reached" (as in `mf.simulate`): the pair within
        # tol at the final state tells that it was the event.
        located = result == dfx.RESULTS.event_occurred or (
            result == dfx.RESULTS.nonlinear_max_steps_reached
            and gap <= merge_tol * (1 + 1e-6)
        )
        if not located:
            # The floor is 100 ulps of the segment's clock s = t - t_start: after
            # s >= 1 it exceeds its value at s = 0, and a restart from here
            # lowers it (a plateau of 1e15 ends in steps of order 1). A floor
            # met at s < 1 is the dynamics' own (a blow-up): the run fails.
            if result == dfx.RESULTS.dt_min_reached and t_end - t >= 1:
                current, t = Particles(x_end, current.weights), t_end
                continue
            status = MAX_STEPS if result == dfx.RESULTS.max_steps_reached else FAILED
            break
        # The root find leaves the pair a hair off tol: merge at their distance.
        current = _merge_until_apart(
            Particles(x_end, current.weights),
            max(merge_tol, gap * (1 + 1e-9)),
            sphere,
        )
        t = t_end
        out.merge_times.append(t_end)
        if bar is not None:
            bar.update(k - current.n)
    if bar is not None:
        bar.close()
    return out.result(status_name(status), steps)


def _merge_until_apart(atoms: Particles, tol: float, sphere: bool) -> Particles:
    """`merge` until no two atoms are within tol.

    A merged atom sits at its cluster's mean, which can be within tol of an
    atom that was not within tol of any member (three atoms ~tol apart on S^2:
    the mean of two is 0.87 tol from the third). The next solve's event fires
    only when the distance falls through tol, so such a pair would never merge.
    """
    while True:
        merged, _ = merge(atoms, tol, sphere=sphere)
        if merged.n == atoms.n or merged.n == 1:
            return merged
        atoms = merged


class _Record:
    """The save-time arrays of a `MergingSolution`, filled as the run goes."""

    def __init__(self, ts, n, d, dtype, beta):
        self.ts, self.beta = ts, beta
        self.x = np.full((ts.size, n, d), np.nan, dtype)
        self.weights = np.zeros((ts.size, n), dtype)
        self.counts = np.zeros(ts.size, np.int64)
        self.log_energy = np.full(ts.size, np.nan)
        self.merge_times: list[float] = []

    def save(self, i: int, atoms: Particles) -> None:
        k = atoms.n
        self.x[i, :k], self.weights[i, :k], self.counts[i] = atoms.x, atoms.weights, k
        if self.beta is not None:
            # Padded (weight-0 atoms add nothing): one compilation per power of two.
            self.log_energy[i] = float(energy(_padded(atoms), self.beta, log=True))

    def result(self, status: str, steps: int) -> MergingSolution:
        known = self.beta is not None
        return MergingSolution(
            ts=self.ts,
            x=self.x,
            weights=self.weights,
            counts=self.counts,
            log_energy=self.log_energy if known else None,
            beta=float(self.beta) if known else None,
            status=status,
            num_steps=steps,
            merge_times=np.asarray(self.merge_times, np.float64),
        )
