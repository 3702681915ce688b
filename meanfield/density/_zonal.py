"""Zonal densities on S^{d-1}: a finite-volume solver in the angle to an axis.

Tokens on S^{d-1} (d >= 2) with A = beta I, V = I (`mf.simulate` with
normalization="sphere") have the density equation

    d_t rho + div_S(rho v) = (sigma^2 / 2) Delta_S rho,
    v = grad_S Z / (beta Z)  (softmax),   v = grad_S Z / beta  (unnormalised),

Z(x) = int e^{beta <x, y>} rho(y) dy. A density of the angle theta in [0, pi] to
an axis e stays one: the surface measure is |S^{d-2}| sin^{d-2}(theta) dtheta, and
by Funk-Hecke (`_funk_hecke`)

    Z(theta) = sum_l kappa_l c_l P_l(cos theta),
    c_l = N(d, l) / |S^{d-1}| int rho(y) P_l(<y, e>) dy,

truncated at the L_K modes past which kappa_l N(d, l) l (l + d - 2) / kappa_0
< 1e-17 (kappa_l falls super-exponentially past l ~ beta + 10 sqrt(beta)): the
neglected tail of Z and of dZ/dtheta is below 1e-17 kappa_0 for any density
(|c_l| <= N(d, l) / |S^{d-1}|). O(N L_K) per evaluation.

The scheme: N cells uniform in theta (h = pi / N) with exact volumes V_j (mass
sum_j V_j rho_j = 1); c_l exact for piecewise-constant cells (Gauss quadrature
in each cell, precomputed); dZ/dtheta from d/dt P_l = l (l + d - 2) / (d - 1)
P^{(d+2)}_{l-1} (no division by sin theta); the flux through an interior face the
MUSCL (minmod) upwind value times v times the face area |S^{d-2}|
sin^{d-2}(theta_face), none through the poles (area 0 for d >= 3, v = 0 by
symmetry for d = 2), reflected ghost cells for the limiter. The fluxes telescope
(mass conserved to rounding) and a cell at 0 sends nothing out; the time steps
are `PositiveSSPRK43` (rho >= 0 exactly). Noise: Strang splitting with the heat
semigroup of the finite-volume Laplacian (`_zonal_heat`).
"""

import dataclasses

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import ArrayLike, Float

from .._checks import check_tolerances
from .._clock import diffeqsolve_in_jit
from .._measures import Particles
from .._progress import progress_meter
from .._repr import fields_repr
from ._circle import (
    MASS_TOL,
    check_attention,
    check_beta,
    check_horizon,
    check_max_steps,
    check_representable,
    check_sigma,
    minmod,
    run_status,
)
from ._funk_hecke import harmonic_dimension, legendre, scaled_funk_hecke, sphere_area
from ._linear import check_dimension
from ._ssp import PositiveSSPRK43
from ._zonal_grid import (
    VOLUME_NODES,
    check_axis,
    gauss_cells,
    householder_frame,
    zonal_volumes,
)
from ._zonal_heat import SplitZonalHeatSSPRK43, heat_operator

#: Relative size of the first neglected Funk-Hecke term (module docstring).
_TRUNCATION = 1e-17
#: Cells per kernel width 1 / sqrt(beta) required: the field Z varies on that
#: scale, and fewer than 2 cells across it leave the initial transport unresolved.
_CELLS_PER_WIDTH = 2.0


def _truncation(beta: float, d: int) -> int:
    """L_K: modes 0..L_K-1 kept, the rest below _TRUNCATION (module docstring)."""
    ell = np.arange(int(beta + 10 * np.sqrt(beta) + 60))
    k = scaled_funk_hecke(ell, beta, d)
    size = k * harmonic_dimension(ell, d) * np.maximum(1, ell * (ell + d - 2))
    kept = np.nonzero(size >= _TRUNCATION * k[0])[0]
    # Rounded up to a multiple of 16 (the extra modes are below the threshold):
    # nearby beta and d then share one compiled program.
    return 16 * ((int(kept[-1]) + 2 + 15) // 16)


@dataclasses.dataclass(frozen=True)
class _Grid:
    """What the rate of change needs, precomputed in NumPy float64.

    W (L, N): |S^{d-2}| int_cell P_l(cos theta) sin^{d-2}; P (L, N-1) and
    dP (L, N-1): P_l(cos theta_f) and d/dtheta of it at the interior faces;
    gain (L,): e^{-beta} kappa_l N(d, l) / |S^{d-1}|; areas (N-1,); volumes (N,).
    """

    W: np.ndarray
    P: np.ndarray
    dP: np.ndarray
    gain: np.ndarray
    areas: np.ndarray
    volumes: np.ndarray


def _grid(N: int, d: int, beta: float) -> _Grid:
    L = _truncation(beta, d)
    h = np.pi / N
    # Gauss points enough for a trigonometric polynomial of degree L + d in a cell.
    q = max(VOLUME_NODES, int(np.ceil((L + d) * h)) + 12)
    points, w = gauss_cells(N, q)
    weight = sphere_area(d - 1) * np.sin(points) ** (d - 2) * w  # (N, q)
    # Cell by cell in chunks: an (L, N, q) array would be ~1 GB at N = 10^5.
    W = np.empty((L, N))
    for s in range(0, N, 1024):
        W[:, s : s + 1024] = np.einsum(
            "lnq,nq->ln",
            legendre(L, np.cos(points[s : s + 1024]), d),
            weight[s : s + 1024],
        )
    faces = np.arange(1, N) * h
    P = legendre(L, np.cos(faces), d)
    ell = np.arange(L)
    dP = np.zeros((L, N - 1))
    dP[1:] = -(
        np.sin(faces)[None, :]
        * (ell[1:, None] * (ell[1:, None] + d - 2) / (d - 1))
        * legendre(L - 1, np.cos(faces), d + 2)
    )
    gain = scaled_funk_hecke(ell, beta, d) * harmonic_dimension(ell, d) / sphere_area(d)
    return _Grid(
        W=W,
        P=P,
        dP=dP,
        gain=gain,
        areas=sphere_area(d - 1) * np.sin(faces) ** (d - 2),
        volumes=zonal_volumes(N, d),
    )


def rate_of_change(rho, W, P, dP, num, den, areas, volumes, softmax: bool):
    """The rate d rho / dt (N,) of the finite-volume scheme (module docstring).

    num (L,) and den (L,) are the Funk-Hecke gains of dZ/dtheta / beta and Z.
    """
    moments = W @ rho  # int rho P_l, exact for the cells: (L,)
    v = (num * moments) @ dP
    if softmax:
        v = v / ((den * moments) @ P)
    # Reflected ghost cells: the end cells' slopes are 0.
    padded = jnp.concatenate([rho[:1], rho, rho[-1:]])
    slope = minmod(padded[1:-1] - padded[:-2], padded[2:] - padded[1:-1])
    left = (rho + 0.5 * slope)[:-1]  # face j + 1/2 seen from cell j
    right = (rho - 0.5 * slope)[1:]  # ... from cell j + 1
    flux = areas * (jnp.maximum(v, 0) * left + jnp.minimum(v, 0) * right)
    zero = jnp.zeros((1,), rho.dtype)
    flux = jnp.concatenate([zero, flux, zero])  # closed poles
    return -(flux[1:] - flux[:-1]) / volumes


@eqx.filter_jit
def _solve(
    rho0,
    t1,
    ts,
    W,
    P,
    dP,
    num,
    den,
    areas,
    volumes,
    heat_op,
    rtol,
    atol,
    *,
    softmax,
    max_steps,
    progress,
):
    def field(t, rho, args):
        return rate_of_change(rho, W, P, dP, num, den, areas, volumes, softmax)

    meter = progress_meter(progress)
    # Land on the save times: saved rows are steps' ends, not interpolants.
    controller = dfx.ClipStepSizeController(
        dfx.PIDController(rtol=rtol, atol=atol), step_ts=ts
    )
    sol = diffeqsolve_in_jit(
        dfx.ODETerm(field),
        PositiveSSPRK43() if heat_op is None else SplitZonalHeatSSPRK43(heat_op),
        jnp.zeros((), rho0.dtype),
        t1,
        None,
        rho0,
        saveat=dfx.SaveAt(ts=ts),
        stepsize_controller=controller,
        max_steps=max_steps,
        throw=False,
        progress_meter=meter,
    )
    return sol.ts, sol.ys, sol.result, sol.stats["num_steps"]


@dataclasses.dataclass(frozen=True, eq=False)  # array fields: no elementwise ==
class ZonalSolution:
    """A zonal density on S^{d-1} at the save times.

    Attributes:
        ts: save times, shape (T,); +inf where not reached.
        rho: cell values, shape (T, N) (sum_j V_j rho_j = 1); NaN rows where
            not reached. Cell j is theta in [j h, (j + 1) h), h = pi / N.
        status: "success", "max_steps", "negative" or "failed" (as
            `DensitySolution`).
        num_steps: accepted + rejected steps.
        beta: the inverse temperature.
        attention: "softmax" or "unnormalized".
        sigma: the noise.
        d: the dimension (tokens on S^{d-1}).
    """

    ts: np.ndarray
    rho: np.ndarray
    status: str
    num_steps: int
    beta: float
    attention: str
    sigma: float
    d: int

    def __repr__(self) -> str:
        noise = {"sigma": self.sigma} if self.sigma > 0 else {}
        return fields_repr(
            self,
            status=self.status,
            num_steps=self.num_steps,
            d=self.d,
            beta=self.beta,
            attention=self.attention,
            **noise,
            ts=self.ts,
            rho=self.rho,
        )

    @property
    def edges(self) -> np.ndarray:
        """The cells' faces j pi / N, shape (N + 1,)."""
        return np.arange(self.rho.shape[-1] + 1) * (np.pi / self.rho.shape[-1])

    @property
    def theta(self) -> np.ndarray:
        """The cells' centres, shape (N,)."""
        return (np.arange(self.rho.shape[-1]) + 0.5) * (np.pi / self.rho.shape[-1])

    @property
    def volumes(self) -> np.ndarray:
        """The cells' volumes V_j, shape (N,)."""
        return zonal_volumes(self.rho.shape[-1], self.d)

    @property
    def mass(self) -> np.ndarray:
        """sum_j V_j rho_j at every save time, shape (T,): 1 to rounding."""
        return self.rho @ self.volumes

    @property
    def lowest(self) -> float:
        """The smallest cell value over the reached save times."""
        return float(np.nanmin(self.rho))

    def measure(self, i: int, *, axis=None, per_ring: int | None = None) -> Particles:
        """The density at save time i as weighted points on S^{d-1}.

        Each cell's mass is spread evenly over points of one ring at the angle
        theta*_j whose cosine is the cell's mean of cos theta, so the measure's
        mean equals the density's exactly: d = 2, the two points +-theta*_j;
        d = 3, `per_ring` equally spaced azimuths; d >= 4, `per_ring` / 2
        antipodal pairs of directions of S^{d-2} drawn from a fixed key (the
        ring's mean exact). For Wasserstein distances, clustering and plots.

        Args:
            i: the save time's index.
            axis: the symmetry axis e, shape (d,); None: e_1.
            per_ring: points per ring; None: 2 for d = 2, 16 else. Even for
                d >= 4; ignored for d = 2.

        Returns:
            `Particles(x, weights)`, x of shape (N * per_ring, d), in JAX's
            default precision (float64 with x64 enabled).

        Raises:
            ValueError: save time i not reached, bad `axis` or `per_ring`.
        """
        rho = self.rho[i]
        if not np.all(np.isfinite(rho)):
            raise ValueError(f"save time `i` = {i} was not reached.")
        d, N = self.d, rho.shape[0]
        e = check_axis(axis, d)
        k = 2 if d == 2 else (16 if per_ring is None else per_ring)
        if isinstance(k, bool) or int(k) != k or k < 1 or (d >= 4 and k % 2):
            raise ValueError(
                "`per_ring` must be a positive integer, even for d >= 4; got "
                f"{per_ring!r}."
            )
        k = int(k)
        if d == 2:
            dirs = np.array([[1.0], [-1.0]])
        elif d == 3:
            phi = 2 * np.pi * np.arange(k) / k
            dirs = np.stack([np.cos(phi), np.sin(phi)], 1)
        else:
            with jax.enable_x64(True):  # float64 whatever JAX's default
                g = np.asarray(jr.normal(jr.key(0), (k // 2, d - 1), jnp.float64))
            g = g / np.linalg.norm(g, axis=1, keepdims=True)
            dirs = np.concatenate([g, -g])
        points, w = gauss_cells(N, VOLUME_NODES)
        s = np.sin(points) ** (d - 2)
        c = np.clip((np.cos(points) * s) @ w / (s @ w), -1, 1)  # mean cos per cell
        sn = np.sqrt(1 - c**2)
        x = np.concatenate(
            [c[:, None, None] * np.ones((N, k, 1)), sn[:, None, None] * dirs[None]], 2
        ).reshape(N * k, d)
        mass = np.maximum(rho, 0) * self.volumes
        weights = np.repeat(mass / mass.sum(), k) / k
        # In JAX's default precision, as every measure the engine builds: a
        # float64 measure with x64 off would not run through `mf.simulate`.
        return Particles(householder_frame(x, e), weights)


def _check_rho(rho0, beta: float) -> np.ndarray:
    rho0 = np.asarray(rho0, np.float64)
    if rho0.ndim != 1 or rho0.shape[0] < 4:
        raise ValueError(f"`rho0` must have shape (N,), N >= 4; got {rho0.shape}.")
    if not (np.all(np.isfinite(rho0)) and np.all(rho0 >= 0)):
        raise ValueError("`rho0` must be finite and nonnegative.")
    N = rho0.shape[0]
    need = int(np.ceil(_CELLS_PER_WIDTH * np.pi * np.sqrt(beta)))
    if N < need:
        raise ValueError(
            f"`rho0` has N = {N} cells, too coarse for `beta` = {beta:g}: the "
            f"kernel's width 1/sqrt(beta) needs N >= 2 pi sqrt(beta) = {need}."
        )
    return rho0


def simulate_zonal(
    rho0: Float[ArrayLike, " N"],
    t1: float,
    *,
    beta: float,
    d: int,
    attention: str = "softmax",
    sigma: float = 0.0,
    saveat: ArrayLike | None = None,
    rtol: float = 1e-8,
    atol: float = 1e-8,
    max_steps: int = 1_000_000,
    progress: bool = False,
) -> ZonalSolution:
    """Evolve a zonal density on S^{d-1} under attention with A = beta I, V = I.

    The mean-field limit of `mf.simulate(..., normalization="sphere")` with
    `mf.SoftmaxAttention(I, A=beta I)` (or `UnnormalizedAttention`) and
    `mf.IndependentNoise(sigma)`, for densities of the angle theta to an axis
    (module docstring for the scheme).

    Args:
        rho0: cell values of the initial density in theta, shape (N,), cell j
            being [j h, (j + 1) h), h = pi / N: nonnegative, with mass
            sum_j V_j rho0_j = 1 (`zonal_volumes`) to 1e-8. N >= 4 and
            N >= 2 pi sqrt(beta): at least 2 cells per kernel width 1/sqrt(beta).
        t1: final time, > 0.
        beta: inverse temperature, > 0.
        d: dimension of the tokens (the sphere S^{d-1}), an integer >= 2.
        attention: "softmax" (normalised by Z) or "unnormalized".
        sigma: noise of the tokens, >= 0: adds (sigma^2 / 2) Delta_S rho
            (Strang splitting, `_zonal_heat`). The step control estimates the
            transport's error, not the splitting's: at rtol = atol = 1e-8 and
            sigma = 0.3 the time error was 1.8e-6 in L1 (benchmarks/sphere_density.py);
            tighten the tolerances for more.
        saveat: save times (T,) in [0, t1], non-decreasing; None saves 0 and t1.
        rtol: relative tolerance of the adaptive steps.
        atol: absolute tolerance of the adaptive steps (in units of rho).
        max_steps: step budget; running out gives status "max_steps".
        progress: show a progress bar (tqdm).

    Returns:
        A `ZonalSolution` (ts, rho (T, N), status, ...), computed in float64.

    Raises:
        ValueError: rho0 not a finite nonnegative (N,) array of mass 1, N < 4,
            N < 2 pi sqrt(beta), d not an integer >= 2, beta or t1 not positive
            finite, sigma < 0, unknown attention, saveat outside [0, t1], bad
            tolerances or max_steps, beta > 709.8 with "unnormalized".
    """
    beta = check_beta(beta)
    d = check_dimension(d)
    check_attention(attention)
    check_representable(beta, attention)
    sigma = check_sigma(sigma)
    check_tolerances(rtol, atol)
    check_max_steps(max_steps)
    rho0 = _check_rho(rho0, beta)
    N = rho0.shape[0]
    grid = _grid(N, d, beta)
    mass = rho0 @ grid.volumes
    if abs(mass - 1) > MASS_TOL:
        raise ValueError(
            f"`rho0` must have mass sum V_j rho0_j = 1; got {mass:.12g}: divide it "
            "by its mass."
        )
    t1, ts = check_horizon(t1, saveat)
    softmax = attention == "softmax"
    # v = Z' / (beta Z): the e^{-beta} scaling cancels; unnormalised: Z' / beta.
    num = grid.gain / beta * (1.0 if softmax else np.exp(beta))
    h = np.pi / N
    heat_op = None if sigma == 0 else heat_operator(grid.volumes, grid.areas, h, sigma)
    with jax.enable_x64(True):
        arrays = [grid.W, grid.P, grid.dP, num, grid.gain, grid.areas, grid.volumes]
        out_ts, rho, result, steps = _solve(
            jnp.asarray(rho0),
            jnp.asarray(t1),
            jnp.asarray(ts),
            *(jnp.asarray(a) for a in arrays),
            jax.tree.map(jnp.asarray, heat_op),
            jnp.asarray(float(rtol)),
            jnp.asarray(float(atol)),
            softmax=softmax,
            max_steps=int(max_steps),
            progress=bool(progress),
        )
        out_ts, rho = np.asarray(out_ts), np.asarray(rho)
    return ZonalSolution(
        ts=out_ts,
        rho=np.where(np.isfinite(out_ts)[:, None], rho, np.nan),
        status=run_status(result, rho, out_ts),
        num_steps=int(steps),
        beta=beta,
        attention=attention,
        sigma=sigma,
        d=d,
    )
