"""The mean-field density on S^2: a pseudo-spectral spherical-harmonic solver.

Tokens x on S^2 with dx/dt = P_x^perp Gamma_rho(x) (`mf.simulate` with
normalization="sphere"),

    Gamma_rho(x) = int e^{<Q x, K y>} V y rho(y) dy [/ Z(x)],
    Z(x) = int e^{<Q x, K y>} rho(y) dy,

(softmax divides by Z, "unnormalized" does not) and independent Brownian motions
on the sphere of strength sigma have the density equation

    d_t rho + div_S(rho v) = (sigma^2 / 2) Delta_S rho,    v = P^perp Gamma_rho.

With Q^T K = beta I, V = I the kernel e^{beta <x, y>} is zonal: Z = K * rho is a
spherical convolution, diagonal on spherical harmonics with the Funk-Hecke
eigenvalues kappa_l = (2 pi)^{3/2} beta^{-1/2} I_{l+1/2}(beta) (`_funk_hecke`),
and v = grad_S Z / (beta Z) (softmax) or grad_S Z / beta (unnormalised): no
sum over pairs of points.

Discretisation. rho is held as its coefficients a_lm, degrees l < L, on the
Gauss-Legendre grid of `_harmonics` (nlat = ceil(3L/2), nlon = 3L). Why
spectral: the solutions are smooth (analytic with noise, and the kernel is
entire), so the error falls geometrically in L, the convolution is exact and
O(L^2) per step, and the heat semigroup is diagonal. The rate is computed
pseudo-spectrally: rho, Z and grad Z at the nodes, the flux F = rho v there,
and the coefficients of div F in weak form, -sum_nodes w F . grad conj(Y_lm)
(`_harmonics.weak_divergence`). Degree 0 of it is exactly 0, so the mass
sqrt(4 pi) a_00 is conserved to rounding; and the 3/2 rule makes the quadrature
exact for the cubic integrand rho (grad Z . grad Y) of the unnormalised zonal
case (a Galerkin scheme without aliasing); for softmax, 1 / Z is smooth and
its aliasing falls geometrically. General Q, K, V: Z and Gamma at the nodes by
the same quadrature over the nodes (weights w_j rho_j), computed in blocks of
rows (`jax.lax.map`, O(M block) memory), stabilised by the bound
<Q x, K y> <= |K^T Q x| on the exponent (the weights w_j rho_j may be
slightly negative, so no log of them).

Time stepping. Noise enters through its exact factor e^{-sigma^2 l (l + 1) tau / 2}
on the coefficients, in a Lawson (integrating-factor) form of Tsit5 rather than
a Strang splitting: with the stage times 0 <= c_i <= 1 increasing, every stage
is e^{D c_i h} a_0 + h sum_j a_ij e^{D (c_i - c_j) h} k_j, whose factors are all
<= 1 (no overflow for any sigma h), the heat is still exact, and the embedded
error estimate covers the whole step, whereas Strang's O(h^2) splitting error
is not estimated at all, so the adaptive steps would not honour rtol. The
transport has fifth order (Tsit5; `_ssp.PositiveSSPRK43` is third order with a
second-order estimate and would need ~20 times the steps at rtol = 1e-8).

Positivity. A spectral scheme does not keep rho >= 0: a sharp density has Gibbs
undershoots. Steps are not rejected for it; a saved density whose minimum is
below -1e-6 of its maximum gives the status "negative". When clusters sharpen
beyond the band limit (without noise they collapse to points), the energy in
the top tenth of the degrees rises: above 1e-10 of the total (amplitudes ~1e-5
of the density's) the status is "unresolved"; past 1e-2 the solve stops there
(the rest of its save times unreached).
"""

import dataclasses
from typing import ClassVar

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float
from scipy.special import ive

from .._checks import check_tolerances
from .._clock import diffeqsolve_in_jit
from .._measures import Particles
from .._progress import progress_meter
from .._repr import fields_repr
from . import _harmonics as sh
from ._circle import (
    check_attention,
    check_beta,
    check_horizon,
    check_max_steps,
    check_sigma,
)
from ._funk_hecke import scaled_funk_hecke
from ._harmonics import SphereGrid, grid_size, sphere_grid
from ._ssp import end_step

# |int rho0 - 1| accepted (the quadrature of a band-limited density is exact).
_MASS_TOL = 1e-8
# "negative": a saved density below -_NEGATIVE_TOL max rho.
_NEGATIVE_TOL = 1e-6
# "unresolved": energy in the top tenth of the degrees above this fraction.
_UNRESOLVED_TOL = 1e-10
# ... and the solve stops past this one: the density is wrong at the percent
# level, and going on only grows Gibbs oscillations while the steps shrink (a
# collapsing run took 10^5 steps to reach "max_steps", measured).
_HOPELESS = 1e-2
# The band must hold the kernel down to kappa_{L} / kappa_0 <= this (see
# `min_band_limit`).
_KERNEL_TAIL = 1e-3
# log of float64's largest value: e^{|A|} overflows past it.
_LOG_MAX = float(np.log(np.finfo(np.float64).max))
# Elements of one block of the general kernel (rows x nodes): 32 MiB in float64.
BLOCK_ELEMENTS = 2**22


def min_band_limit(beta: float) -> int:
    """The smallest band limit L with kappa_L / kappa_0 <= 1e-3 for e^{beta <x, y>}.

    kappa_l / kappa_0 = I_{l+1/2}(beta) / I_{1/2}(beta) ~ e^{-l^2 / (2 beta)}:
    the kernel has width ~1 / sqrt(beta) and degrees up to ~sqrt(2 beta ln 1e3)
    ~ 3.7 sqrt(beta). The first degree left out then grows at most at
    l (l + 1) kappa_l / (beta kappa_0) ~ 2 ln(1e3) 1e-3 ~ 0.014, against a
    fastest rate ~ 2 / e ~ 0.74 (softmax): the band holds every mode of the
    linear instability that grows faster than ~2 % of the fastest.

    Args:
        beta: the kernel's inverse temperature (|Q^T K|_2 for a general kernel).

    Returns:
        The band limit, an integer >= 4.
    """
    ell = np.arange(4, 100_000)
    ratio = ive(ell + 0.5, beta) / ive(0.5, beta)
    return int(ell[np.argmax(ratio <= _KERNEL_TAIL)])


class ZonalField(eqx.Module):
    """The transport rate for Q^T K = beta I, V = I: Funk-Hecke convolutions."""

    kappa: Float[Array, " L"]  # kappa_l, scaled by e^{-beta} for softmax
    inv_beta: Float[Array, ""]
    softmax: bool = eqx.field(static=True)

    def rate(self, grid: SphereGrid, a):
        """The transport rate d a / dt, (L, L) complex coefficients in and out."""
        z = self.kappa[:, None] * a
        im = 1j * jnp.asarray(sh.orders(grid.L))
        # rho, Z and d_phi Z in one pass over the Legendre table, d_theta Z in one.
        rho, Z, Z_phi = sh._to_grid(
            grid, sh._legendre_sum(grid.legendre, jnp.stack([a, z, im * z]))
        )
        Z_theta = sh._to_grid(grid, sh._legendre_sum(grid.legendre_dtheta, z[None]))[0]
        scale = self.inv_beta / Z if self.softmax else self.inv_beta
        flux = rho * scale
        sin = jnp.asarray(grid.sin_theta)[:, None]
        return -sh.weak_divergence(grid, flux * Z_theta, flux * Z_phi / sin)


class GeneralField(eqx.Module):
    """The transport rate for any Q, K, V (3, 3): quadrature over the nodes."""

    Q: Float[Array, "3 3"]
    K: Float[Array, "3 3"]
    V: Float[Array, "3 3"]
    softmax: bool = eqx.field(static=True)
    block: int = eqx.field(static=True)

    def field(self, grid: SphereGrid, rho):
        """Gamma_rho at the nodes, (M, 3), from grid values rho (nlat, nlon)."""
        # The kernel e^{<Q x_i, K x_j>} does not depend on rho: without the
        # barrier XLA hoists it out of the step loop whenever it fits in a block
        # or two, holding several (M, M) copies. Tying the nodes to rho keeps it
        # inside, blocked: O(M block) memory.
        nodes, rho = jax.lax.optimization_barrier((jnp.asarray(grid.nodes), rho))
        wr = jnp.asarray(grid.weights) * rho.reshape(-1)
        keys = nodes @ self.K.T  # (M, 3): <Q x, K y> = <Q x, keys_y>
        values = nodes @ self.V.T

        def row(x):
            q = self.Q @ x
            # The bound max_y <q, K y> = |K^T q| over the sphere: exponents <= 0.
            top = jnp.linalg.norm(self.K.T @ q)
            e = jnp.exp(keys @ q - top) * wr
            return jnp.sum(e), e @ values, top

        Z, num, top = jax.lax.map(row, nodes, batch_size=self.block)
        if self.softmax:
            return num / Z[:, None]
        return jnp.exp(top)[:, None] * num

    def rate(self, grid: SphereGrid, a):
        """The transport rate d a / dt, (L, L) complex coefficients in and out."""
        rho = sh.synthesis(grid, a)
        gamma = self.field(grid, rho)
        e_theta, e_phi = grid.tangent_frame()
        # Components on the tangent frame: the projection P^perp comes for free.
        v_theta = jnp.sum(gamma * jnp.asarray(e_theta), -1).reshape(grid.shape)
        v_phi = jnp.sum(gamma * jnp.asarray(e_phi), -1).reshape(grid.shape)
        return -sh.weak_divergence(grid, rho * v_theta, rho * v_phi)


def _to_complex(y):
    return y[0] + 1j * y[1]


def _to_real(a):
    return jnp.stack([a.real, a.imag])


class LawsonTsit5(dfx.AbstractAdaptiveSolver):
    """Tsit5 in Lawson (integrating-factor) form for dy/dt = D y + N(y), D diagonal.

    `rates` is D (any shape broadcasting against y); the ODE term gives N. The
    linear part is exact; the stages are combined with the factors
    e^{D (c_i - c_j) h} <= 1 (Tsit5's c_i increase; D <= 0), so nothing
    overflows whatever D h. First same as last: the rate at the step's end is
    the next step's first stage (diffrax keeps the state of a rejected step).
    A non-finite step is rejected; one that no longer moves t ends the solve
    (`_ssp.end_step`).
    """

    rates: Array
    term_structure: ClassVar = dfx.AbstractTerm
    interpolation_cls: ClassVar = dfx.LocalLinearInterpolation
    _tableau: ClassVar = dfx.Tsit5.tableau

    def order(self, terms):
        return 5

    def error_order(self, terms):
        return 5

    def init(self, terms, t0, t1, y0, args):
        return terms.vf(t0, y0, args)

    def step(self, terms, t0, t1, y0, args, solver_state, made_jump):
        del made_jump
        tab = self._tableau
        h = t1 - t0
        c = [0.0, *(float(ci) for ci in tab.c)]

        def decay(s):
            return jnp.exp(self.rates * (s * h))

        ks = [solver_state]
        for i, row in enumerate(tab.a_lower, start=1):
            yi = decay(c[i]) * y0
            for j, aij in enumerate(row):
                if aij != 0:
                    yi = yi + (h * float(aij)) * decay(c[i] - c[j]) * ks[j]
            if i < len(tab.a_lower):
                ks.append(terms.vf(t0 + c[i] * h, yi, args))
        # Tsit5's last row is its solution (first same as last).
        y1 = yi
        k_end = terms.vf(t1, y1, args)
        error = sum(
            (h * float(e)) * decay(1 - c[j]) * k
            for j, (e, k) in enumerate(zip(tab.b_error, [*ks, k_end], strict=True))
            if e != 0
        )
        finite = jnp.all(jnp.isfinite(y1)) & jnp.all(jnp.isfinite(error))
        error = jnp.where(finite, error, jnp.inf)
        y1, error, dense, _, result = end_step(t0, t1, y0, y1, error, finite)
        k_end = jnp.where(finite, k_end, solver_state)
        return y1, error, dense, k_end, result

    def func(self, terms, t0, y0, args):
        return self.rates * y0 + terms.vf(t0, y0, args)


@eqx.filter_jit
def _solve(a0, t1, ts, grid, model, heat, rtol, atol, *, max_steps, progress):
    def transport(t, y, args):
        return _to_real(model.rate(grid, _to_complex(y)))

    def hopeless(t, y, args, **kwargs):
        return _top_fraction(sh.degree_energy(_to_complex(y))) > _HOPELESS

    # Steps land on the save times: the saved rows are steps' ends.
    controller = dfx.ClipStepSizeController(
        dfx.PIDController(rtol=rtol, atol=atol), step_ts=ts
    )
    sol = diffeqsolve_in_jit(  # inside this jit: no second jit wrapper
        dfx.ODETerm(transport),
        LawsonTsit5(heat),
        jnp.zeros((), ts.dtype),
        t1,
        None,
        _to_real(a0),
        # The end of the solve too (t1, or where it stopped): its status.
        saveat=dfx.SaveAt(ts=ts, t1=True),
        stepsize_controller=controller,
        event=dfx.Event(hopeless),
        max_steps=max_steps,
        throw=False,
        progress_meter=progress_meter(progress),
    )
    coeffs = _to_complex(jnp.moveaxis(sol.ys, 1, 0))
    return (
        sol.ts,
        coeffs,
        sh.synthesis(grid, coeffs),
        sol.result,
        sol.stats["num_steps"],
    )


@dataclasses.dataclass(frozen=True, eq=False)  # array fields: no elementwise ==
class SphereSolution:
    """The density on S^2 at the save times.

    Attributes:
        ts: save times, shape (T,); +inf where not reached.
        rho: grid values, shape (T, nlat, nlon) (int rho = 1); NaN rows where
            not reached.
        coeffs: spherical-harmonic coefficients, shape (T, L, L) complex,
            indexed [l, m] (`_harmonics`).
        status: "success"; "max_steps"; "failed" (a non-finite density, or a
            step that no longer moves t); "unresolved" (energy in the top tenth
            of the degrees above 1e-10 of the total: sharper than the band
            limit); "negative" (a saved density below -1e-6 of its maximum:
            Gibbs undershoot, which the spectral scheme does not prevent).
            The first that applies, in this order.
        num_steps: accepted + rejected steps.
        L: band limit (degrees 0..L-1).
        beta: the inverse temperature of the zonal kernel; None for general
            Q, K, V.
        attention: "softmax" or "unnormalized".
        sigma: the noise.
        grid: the `SphereGrid`.
    """

    ts: np.ndarray
    rho: np.ndarray
    coeffs: np.ndarray
    status: str
    num_steps: int
    L: int
    beta: float | None
    attention: str
    sigma: float
    grid: SphereGrid = dataclasses.field(repr=False)

    def __repr__(self) -> str:
        return fields_repr(
            self,
            status=self.status,
            num_steps=self.num_steps,
            L=self.L,
            beta=self.beta,
            attention=self.attention,
            sigma=self.sigma,
            ts=self.ts,
            rho=self.rho,
        )

    @property
    def mass(self) -> np.ndarray:
        """Int rho by the grid's quadrature at every save time, shape (T,)."""
        w = self.grid.weights.reshape(self.grid.shape)
        return np.sum(self.rho * w, axis=(-2, -1))

    @property
    def lowest(self) -> float:
        """The smallest grid value over the reached save times."""
        return float(np.nanmin(self.rho))

    def coefficients(self, i: int) -> np.ndarray:
        """The coefficients a_lm at save time i, shape (L, L) complex, [l, m]."""
        return self.coeffs[i]

    def measure(self, i: int) -> Particles:
        """The density at save time i as weighted atoms on the nodes.

        Weights w_j rho_j (quadrature weight times density), clipped at 0 and
        renormalised to sum 1, so that Wasserstein distances, clustering and
        plotting take the density.

        Args:
            i: index of the save time.

        Returns:
            `mf.Particles` with x the nodes (M, 3) and weights (M,), in JAX's
            default precision (float64 with x64 enabled).
        """
        w = self.grid.weights * np.maximum(self.rho[i].reshape(-1), 0)
        # In JAX's default precision, as every measure the engine builds: a
        # float64 measure with x64 off would not run through `mf.simulate`.
        return Particles(np.asarray(self.grid.nodes), w / w.sum())


def _matrix(value, name: str) -> np.ndarray:
    m = np.asarray(value, np.float64)
    if m.shape != (3, 3) or not np.all(np.isfinite(m)):
        raise ValueError(
            f"`{name}` must be a finite (3, 3) matrix; got shape {np.shape(value)}."
        )
    return m


def simulate_sphere(
    rho0: Float[ArrayLike, "nlat nlon"],
    t1: float,
    *,
    beta: float | None = None,
    Q: ArrayLike | None = None,
    K: ArrayLike | None = None,
    V: ArrayLike | None = None,
    attention: str = "softmax",
    sigma: float = 0.0,
    L: int | None = None,
    saveat: ArrayLike | None = None,
    rtol: float = 1e-8,
    atol: float = 1e-8,
    max_steps: int = 100_000,
    progress: bool = False,
) -> SphereSolution:
    """Evolve a density on S^2 under attention, with optional noise.

    The continuum limit of `mf.simulate(mf.Particles(x, w), mf.SoftmaxAttention(V,
    Q=Q, K=K), t1, normalization="sphere")` (or `mf.UnnormalizedAttention`, whose
    log_scale is 0): d_t rho + div(rho P^perp Gamma_rho) = (sigma^2 / 2) Delta rho
    (module docstring).

    Args:
        rho0: the initial density at the nodes of `sphere_grid(L)`, shape
            (nlat, nlon) = (ceil(3L / 2), 3L): finite, nonnegative, mass
            sum w rho0 = 1 to 1e-8. Projected on degrees < L.
        t1: final time, > 0.
        beta: inverse temperature of the zonal kernel (Q^T K = beta I, V = I):
            convolutions by Funk-Hecke. Give either beta or all of Q, K, V.
        Q: query matrix (3, 3); kernel e^{<Q x, K y>}.
        K: key matrix (3, 3).
        V: value matrix (3, 3).
        attention: "softmax" (divided by Z) or "unnormalized".
        sigma: noise of the tokens, >= 0: adds (sigma^2 / 2) Delta_S rho.
        L: band limit; None reads it from rho0's shape. At least
            `min_band_limit(beta)` (|Q^T K|_2 for a general kernel).
        saveat: save times (T,) in [0, t1], non-decreasing; None saves 0 and t1.
        rtol: relative tolerance of the adaptive steps.
        atol: absolute tolerance of the steps, in units of the coefficients
            a_lm (a_00 = 1 / sqrt(4 pi)).
        max_steps: step budget; running out gives status "max_steps".
        progress: show a progress bar (tqdm).

    Returns:
        A `SphereSolution`. Computed in float64 whatever JAX's default.

    Raises:
        ValueError: beta together with Q, K, V or neither of them; Q, K, V not
            all given or not finite (3, 3); beta or t1 not positive and finite;
            sigma < 0; unknown attention; rho0 not finite, nonnegative, of the
            grid's shape or of mass 1; L not matching rho0 or too small for
            the kernel; saveat outside [0, t1]; unnormalised attention with
            e^{|Q^T K|} beyond float64.
    """
    general = [m is not None for m in (Q, K, V)]
    if beta is not None and any(general):
        raise ValueError("Give either `beta` or `Q`, `K`, `V`, not both.")
    if beta is None and not all(general):
        raise ValueError("Give either `beta` or all three of `Q`, `K`, `V`.")
    check_attention(attention)
    sigma = check_sigma(sigma)
    check_tolerances(rtol, atol)
    check_max_steps(max_steps)
    if beta is not None:
        beta = check_beta(beta)
        strength = beta
    else:
        Q, K, V = _matrix(Q, "Q"), _matrix(K, "K"), _matrix(V, "V")
        strength = float(np.linalg.norm(K.T @ Q, 2))
    if attention != "softmax" and strength > _LOG_MAX:
        raise ValueError(
            f"`beta` (or |Q^T K|_2) = {strength:g} is too large for "
            f'attention="unnormalized": e^beta is beyond float64 past {_LOG_MAX:.1f}.'
        )
    rho0 = np.asarray(rho0, np.float64)
    if rho0.ndim != 2 or rho0.shape[1] % 3 or rho0.shape[1] < 6:
        raise ValueError(
            f"`rho0` must have the shape (nlat, nlon) of `sphere_grid(L)`; got "
            f"{rho0.shape}."
        )
    L_rho = rho0.shape[1] // 3
    if rho0.shape != grid_size(L_rho):
        raise ValueError(
            f"`rho0` must have the shape (nlat, nlon) of `sphere_grid(L)`; got "
            f"{rho0.shape}, expected {grid_size(L_rho)} for L = {L_rho}."
        )
    if L is not None and L != L_rho:
        raise ValueError(
            f"`L` = {L} does not match `rho0`'s shape {rho0.shape} (L = {L_rho})."
        )
    L = L_rho
    need = min_band_limit(strength) if strength > 0 else 4
    if L < need:
        raise ValueError(
            f"`L` = {L} is too small for beta = {strength:g}: the kernel needs "
            f"L >= {need} (kappa_L / kappa_0 <= {_KERNEL_TAIL:g})."
        )
    if not (np.all(np.isfinite(rho0)) and np.all(rho0 >= 0)):
        raise ValueError("`rho0` must be finite and nonnegative.")
    grid = sphere_grid(L)
    mass = float(np.sum(grid.weights * rho0.reshape(-1)))
    if abs(mass - 1) > _MASS_TOL:
        raise ValueError(
            f"`rho0` must have mass sum w rho0 = 1; got {mass:.12g}: divide it by "
            "its mass."
        )
    t1, ts = check_horizon(t1, saveat)
    softmax = attention == "softmax"
    # (1, L, 1): against the state (re/im, l, m).
    heat = (-0.5 * sigma**2 * sh.degrees(L) * (sh.degrees(L) + 1))[None]
    with jax.enable_x64(True):
        if beta is not None:
            kappa = scaled_funk_hecke(np.arange(L), beta, 3)
            if not softmax:  # the field itself: e^beta back (< float64's max)
                kappa = kappa * np.exp(beta)
            model = ZonalField(jnp.asarray(kappa), jnp.asarray(1 / beta), softmax)
        else:
            M = grid.nlat * grid.nlon
            block = int(max(1, min(M, BLOCK_ELEMENTS // M)))
            model = GeneralField(
                jnp.asarray(Q), jnp.asarray(K), jnp.asarray(V), softmax, block
            )
        a0 = sh.analysis(grid, jnp.asarray(rho0))
        out_ts, coeffs, rho, result, steps = _solve(
            a0,
            jnp.asarray(t1),
            jnp.asarray(ts),
            grid,
            model,
            jnp.asarray(heat),
            jnp.asarray(float(rtol)),
            jnp.asarray(float(atol)),
            max_steps=int(max_steps),
            progress=bool(progress),
        )
        out_ts, coeffs, rho = np.asarray(out_ts), np.asarray(coeffs), np.asarray(rho)
    # diffrax saves the reached save times, then the end of the solve (t1 or
    # where it stopped), then +inf rows: the end is judged, not returned.
    end = int(np.isfinite(out_ts).sum()) - 1
    status = _status(result, rho[: end + 1], coeffs[: end + 1])
    T = ts.shape[0]
    reached = np.arange(T) < end
    out_ts = np.where(reached, out_ts[:T], np.inf)
    return SphereSolution(
        ts=out_ts,
        rho=np.where(reached[:, None, None], rho[:T], np.nan),
        coeffs=np.where(reached[:, None, None], coeffs[:T], np.nan),
        status=status,
        num_steps=int(steps),
        L=L,
        beta=beta,
        attention=attention,
        sigma=sigma,
        grid=grid,
    )


def _top_fraction(energy):
    L = energy.shape[-1]
    return energy[..., L - -(-L // 10) :].sum(-1) / energy.sum(-1)


def top_energy_fraction(coeffs: np.ndarray) -> np.ndarray:
    """Energy in the top tenth of the degrees over the total, shape (...,).

    Args:
        coeffs: coefficients (..., L, L) complex, [l, m].

    Returns:
        sum_{l >= L - ceil(L / 10)} E_l / sum_l E_l (`_harmonics.degree_energy`).
    """
    return np.asarray(_top_fraction(sh.degree_energy(coeffs)))


def _status(result, rho, coeffs) -> str:
    if not (np.all(np.isfinite(rho)) and np.all(np.isfinite(coeffs))):
        return "failed"
    if result == dfx.RESULTS.max_steps_reached:
        return "max_steps"
    # The solve stops on a hopeless band (`_HOPELESS`): "unresolved" below.
    if result not in (dfx.RESULTS.successful, dfx.RESULTS.event_occurred):
        return "failed"
    if rho.size == 0:
        return "success"
    if np.any(top_energy_fraction(coeffs) > _UNRESOLVED_TOL):
        return "unresolved"
    # Relative to each saved density's own maximum.
    top = rho.max(axis=(-2, -1))
    if np.any(rho.min(axis=(-2, -1)) < -_NEGATIVE_TOL * top):
        return "negative"
    return "success"
