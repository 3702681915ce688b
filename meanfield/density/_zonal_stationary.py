"""Zonal stationary densities with noise on the sphere S^{d-1}.

The generalisation of `_stationary` and `_transition` from the circle to
S^{d-1}, d >= 2, for densities that depend on the angle theta to an axis e
only. With A = beta I, V = I and noise sigma the density solves

    d_t rho + div(rho v) = (sigma^2 / 2) Delta rho,
    v = grad Z / (beta Z) (softmax),   v = grad Z / beta (unnormalised),

Z(x) = int e^{beta <x, y>} rho(y) dy, and a state of zero flux is the fixed
point rho = Z^a / mass (softmax) or e^{a Z} / mass (unnormalised),
a = 2 / (beta sigma^2) (docs/math/noise-density.md, with the circle's d/d theta
replaced by the gradient on the sphere).

Discretisation: the N angles theta_j = (j + 1/2) pi / N (the circle's cell
centres in (0, pi); d = 2 is the circle's even grid of 2N cells, folded), with
Fejer's first rule for the weight sin^{d-2}(theta) of dy = |S^{d-2}|
sin^{d-2}(theta) d theta for zonal functions (`fejer_nodes`). A state is an
entire function of t = cos theta, so the rule integrates it spectrally, and a
cluster at theta = 0 is resolved as on the circle. (Gauss-Jacobi nodes in t,
the other candidate, integrate to twice the degree, but SciPy's are less
accurate and their interpolant's derivative is worse conditioned: a rounding
floor in `residual` 10-100 times higher at d = 3, 4.) Z is summed with the
exact zonal kernel

    k(t, s) = e^{beta t s} |S^{d-3}|-average of e^{beta u <xi, eta>}
            = e^{beta t s} (2 pi)^{(d-1)/2} z^{-nu} I_nu(z),
    z = beta u, u = sqrt(1 - t^2) sqrt(1 - s^2), nu = (d - 3) / 2,

(the Funk-Hecke eigenvalue kappa_0 on S^{d-2} at beta u; 2 cosh(z) at d = 2),
a sum of positive terms: log Z never meets the cancellation a Legendre sum of Z
has where Z / max Z < 1e-16. The Jacobian of the map is dense (N x N, N in the
hundreds): Newton's steps are LU solves and the stability test takes all its
eigenvalues. The `residual` checks a state by another route: d rho / d theta
from rho's cosine series, Z and its derivative from rho's Legendre expansion
with the Funk-Hecke eigenvalues kappa_l (`_funk_hecke`).
"""

import dataclasses

import numpy as np
from jaxtyping import ArrayLike, Float
from scipy.fft import dct, dst
from scipy.special import gammaln, ive

from .._checks import real_scalar
from .._repr import fields_repr
from ._circle import check_attention, check_beta, check_representable
from ._funk_hecke import harmonic_dimension, legendre, scaled_funk_hecke, sphere_area
from ._linear import check_dimension
from ._stationary import (
    MODE_CUTOFF,
    PUSH,
    RESIDUAL_FACTOR,
    STABLE_SLACK,
    check_iteration,
    check_positive_sigma,
    quiet,
)


@dataclasses.dataclass(frozen=True, eq=False)  # array fields: no elementwise ==
class ZonalStationaryState:
    """A zonal stationary density with noise on S^{d-1}, clustered about e.

    Attributes:
        rho: values at the N nodes t = cos(theta), shape (N,), with mass
            `weights @ rho` = 1 (the sphere's surface measure).
        t: the nodes cos(theta), theta = (j + 1/2) pi / N, shape (N,), decreasing
            from near 1 to near -1.
        weights: quadrature weights of the surface measure for zonal
            functions, shape (N,): int f(<x, e>) dx = weights @ f(t); they sum
            to |S^{d-1}|.
        order: the order parameter |int <x, e> rho| = |mean of x|: 0 for the
            uniform density, 1 for a point cluster.
        free_energy: (sigma^2/2) int rho log rho - (1/(2 beta)) iint
            e^{beta <x, y>} rho rho (unnormalised attention, whose dynamics is
            its Wasserstein gradient flow); None for softmax.
        residual: max |d rho/d theta - (2/sigma^2) rho v_theta| / max rho
            (1/radian) at the nodes, the zero-flux equation evaluated by
            another route than the iteration's: rho' from rho's cosine series
            (FFT), Z and Z' from its Legendre expansion with the exact
            Funk-Hecke eigenvalues. 1e-14 to 5e-12 for resolved states.
        converged: the fixed-point iteration reached `tol` and `residual` <=
            10 max(tol, N eps) (1 + max|phi|), phi the fixed point's exponent
            a log Z (a Z unnormalised), as `StationaryState.converged`. False
            where the residual is NaN.
        stable: the linearised fixed-point map has no eigenvalue above 1
            (within zonal densities): Picard iterations, and for unnormalised
            attention the dynamics, return to it.
        iterations: Newton plus Picard iterations.
        sigma: the noise.
        beta: the inverse temperature.
        attention: "softmax" or "unnormalized".
        d: the dimension of the ambient space (the sphere is S^{d-1}).
    """

    rho: np.ndarray
    t: np.ndarray
    weights: np.ndarray
    order: float
    free_energy: float | None
    residual: float
    converged: bool
    stable: bool
    iterations: int
    sigma: float
    beta: float
    attention: str
    d: int

    def __repr__(self) -> str:
        return fields_repr(
            self,
            order=self.order,
            converged=self.converged,
            stable=self.stable,
            residual=self.residual,
            iterations=self.iterations,
            sigma=self.sigma,
            beta=self.beta,
            attention=self.attention,
            d=self.d,
            free_energy=self.free_energy,
            rho=self.rho,
        )

    @property
    def theta(self) -> np.ndarray:
        """The nodes' angles (j + 1/2) pi / N to the axis, shape (N,), increasing."""
        N = self.t.shape[-1]
        return (np.arange(N) + 0.5) * np.pi / N


@dataclasses.dataclass(frozen=True)
class _Image:
    """The fixed-point map at psi: T(psi) and what its derivatives need."""

    psi: np.ndarray  # log T(rho), (N,): unit mass
    rho: np.ndarray  # e^psi of the argument, (N,)
    Z: np.ndarray  # the attention's normaliser e^{-beta} Z, (N,)
    phi: np.ndarray  # the exponent: a log Z or a Z, (N,)
    gain: np.ndarray  # Z d phi / d Z: a (softmax) or a Z, bounded, (N,)
    prob: np.ndarray  # weights e^phi / sum weights e^phi, (N,)


def _kernel_scale(z: np.ndarray, d: int) -> np.ndarray:
    """(2 pi)^{(d-1)/2} z^{-nu} e^{-z} I_nu(z), nu = (d-3)/2, z >= 0 (any shape).

    The integral of e^{z <xi, eta>} over eta in S^{d-2}; its limit |S^{d-2}| at
    z = 0, where z^{-nu} I_nu(z) is 0 / 0 in floating point for nu > 0.
    """
    nu = 0.5 * (d - 3)
    front = 0.5 * (d - 1) * np.log(2 * np.pi)
    limit = np.exp(front - nu * np.log(2) - gammaln(nu + 1))
    small = z < 1e-100
    zz = np.where(small, 1.0, z)
    return np.where(small, limit, np.exp(front - nu * np.log(zz)) * ive(nu, zz))


def fejer_nodes(N: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Fejer's first rule for int_0^pi f(theta) sin^{d-2}(theta) d theta.

    Nodes theta_j = (j + 1/2) pi / N (the circle's cell centres in (0, pi));
    weights w_j = (2/N) sum_k' mu_k cos(k theta_j) from the moments
    mu_k = int_0^pi cos(k theta) sin^m(theta) d theta, m = d - 2, by
    mu_{k+2} = mu_k (k - m) / (k + m + 2) (odd moments vanish): exact for
    f(theta) = g(cos theta), g a polynomial of degree < N, and positive for
    the d measured (2..8, N up to 512). Preferred to Gauss-Jacobi
    (`scipy.special.roots_jacobi`), whose nodes and weights lose accuracy
    (3.6e-14 on int e^{3t} at N = 256, d = 3, against 0 here), and whose
    interpolation derivative is worse conditioned; on these nodes d/d theta
    is a cosine series, as on the circle, and d = 2 is the circle's grid.

    Args:
        N: nodes, >= 1.
        d: the dimension, >= 2.

    Returns:
        (theta, w), each shape (N,): theta increasing in (0, pi), and
        int_{-1}^{1} g(t) (1 - t^2)^{(d-3)/2} dt ~ w @ g(cos theta).
    """
    m = d - 2
    theta = (np.arange(N) + 0.5) * np.pi / N
    mu = np.zeros(N)
    mu[0] = np.exp(0.5 * np.log(np.pi) + gammaln(0.5 * (m + 1)) - gammaln(0.5 * m + 1))
    for k in range(0, N - 2, 2):
        mu[k + 2] = mu[k] * (k - m) / (k + m + 2)
    coef = (2 / N) * mu
    coef[0] /= 2
    return theta, coef @ np.cos(np.outer(np.arange(N), theta))


class Problem:
    """The discrete fixed-point map on the N Fejer nodes theta_j (`fejer_nodes`)."""

    def __init__(self, beta: float, attention: str, d: int, N: int):
        self.beta, self.attention, self.d, self.N = beta, attention, d, N
        self.softmax = attention == "softmax"
        theta, w = fejer_nodes(N, d)
        t = np.cos(theta)
        self.theta, self.t = theta, t
        # dy = (1 - t^2)^{(d-3)/2} dt deta for zonal functions: |S^{d-2}| w.
        self.w = sphere_area(d - 1) * w
        self.area = sphere_area(d)
        u = np.outer(np.sin(theta), np.sin(theta))
        # e^{-beta} k(t, s): ts + u = cos(theta_t - theta_s) <= 1, so the
        # exponent -2 beta sin^2(half the gap) is <= 0 and nothing overflows.
        gap = np.subtract.outer(theta, theta)
        kernel = np.exp(-2 * beta * np.sin(gap / 2) ** 2) * _kernel_scale(beta * u, d)
        # The eta-integral is in the kernel: its weights are the rule's, w.
        self.kernel = kernel * w[None, :]  # e^{-beta} Z_i = kernel @ rho
        # a = 2 / (beta sigma^2) multiplies Z = e^beta (e^{-beta} Z) unnormalised.
        self.log_unit = 0.0 if self.softmax else beta

    def scale(self, sigma: float) -> float:
        """The exponent a of Z^a (softmax) or of e^{a Z} (a e^beta unnormalised)."""
        with np.errstate(over="ignore"):  # inf: a noise too small, refused by callers
            return float(
                np.exp(self.log_unit + np.log(2 / self.beta) - 2 * np.log(sigma))
            )

    def sigma(self, s: float) -> float:
        """The noise at which `scale` is s."""
        return float(np.exp(0.5 * (self.log_unit + np.log(2 / (self.beta * s)))))

    def image(self, psi: np.ndarray, s: float) -> _Image:
        rho = np.exp(psi)
        # Sums of positive terms; the floor only meets e^{-2 beta} < 1e-308.
        Z = np.maximum(self.kernel @ rho, np.finfo(np.float64).tiny)
        if self.softmax:
            phi, gain = s * np.log(Z), np.full_like(Z, s)
        else:
            phi, gain = s * Z, s * Z
        top = phi.max()
        mass = self.w * np.exp(phi - top)
        total = mass.sum()
        return _Image(phi - top - np.log(total), rho, Z, phi, gain, mass / total)

    def jacobian(self, im: _Image) -> np.ndarray:
        """DT = P D_phi' K D_rho, shape (N, N), P = I - 1 prob^T the mass projection.

        Row i of D_phi' K D_rho sums to Z_i phi'(Z_i) = `gain`_i, bounded, where
        phi' = a / Z alone is not (far from a cluster): formed as gain times the
        row-normalised kernel, the matrix has entries of size at most a max Z.
        """
        M = im.gain[:, None] * (self.kernel * im.rho[None, :]) / im.Z[:, None]
        return M - (im.prob @ M)[None, :]

    def ds(self, im: _Image) -> np.ndarray:
        """The derivative d T / d s, shape (N,)."""
        g = np.log(im.Z) if self.softmax else im.Z
        return g - im.prob @ g

    def order(self, psi: np.ndarray) -> float:
        """The integral of t rho: > 0 for a cluster at t = 1, < 0 at t = -1."""
        return float(self.w @ (self.t * np.exp(psi)))

    def uniform(self) -> np.ndarray:
        """The log of the uniform density 1 / |S^{d-1}| at the nodes, (N,)."""
        return np.full(self.N, -np.log(self.area))

    def point_cluster_image(self, s: float) -> np.ndarray:
        """The map's image log T(delta_e) of a point cluster at t = 1."""
        log_Z = self.beta * (self.t - 1)  # log of e^{-beta} Z, never -inf
        phi = s * log_Z if self.softmax else s * np.exp(log_Z)
        phi = phi - phi.max()
        return phi - np.log(self.w @ np.exp(phi))


def largest_eigenvalue(J: np.ndarray) -> float:
    if not np.all(np.isfinite(J)):
        return float("nan")
    return float(np.max(np.linalg.eigvals(J).real))


def _newton(prob: Problem, psi, s: float, tol: float, max_iter: int):
    """Newton's method on psi = T(psi) from psi: (psi, converged, iterations, lam).

    lam is the largest eigenvalue of the linearised map at the last iterate (nan
    if it is not finite). Steps are halved until the residual decreases.
    """
    im = prob.image(psi, s)
    ok = False
    eye = np.eye(prob.N)
    for it in range(max_iter + 1):
        R = psi - im.psi
        size = np.abs(R).max()
        J = prob.jacobian(im)
        # Rounding in the exponent phi is relative to its size.
        if size <= tol * (1 + np.abs(im.phi).max()):
            ok = True
            break
        if it == max_iter or not np.isfinite(size):
            break
        try:
            step = -np.linalg.solve(eye - J, R)
        except np.linalg.LinAlgError:
            break
        t = 1.0
        for _ in range(15):  # backtrack on the residual's size
            trial = psi + t * step
            with quiet():  # a rejected trial may overflow
                trial_im = prob.image(trial, s)
                after = np.abs(trial - trial_im.psi).max()
            if np.isfinite(after) and after < (1 - 1e-4 * t) * size:
                break
            t /= 2
        else:
            break
        psi, im = trial, trial_im
    return psi, ok, it, largest_eigenvalue(J)


def settle(prob: Problem, psi0, s: float, tol: float, max_iter: int):
    """A stable fixed point near psi0: (psi, converged, stable, iterations).

    As the circle's `_stationary.settle`: Newton from psi0; if it lands on an
    unstable state (or fails), Picard iterations from psi0 + 1e-4 t (off a
    fixed point that is exactly uniform, along degree 1) in chunks of doubling
    length, each followed by Newton, until Newton lands on a stable state.
    """
    psi, ok, used, lam = _newton(prob, psi0, s, tol, min(100, max_iter))
    stable = lam <= 1 + STABLE_SLACK
    if ok and stable:
        return psi, True, True, used
    walker, chunk = psi0 + PUSH * prob.t, 16
    while used < max_iter:
        for _ in range(min(chunk, max_iter - used)):
            walker = prob.image(walker, s).psi
            used += 1
        psi, ok, it, lam = _newton(prob, walker, s, tol, min(100, max_iter))
        used += it
        stable = lam <= 1 + STABLE_SLACK
        if ok and stable:
            return psi, True, True, used
        chunk *= 2
    return psi, ok, stable, used


def _theta_derivative(f: np.ndarray) -> np.ndarray:
    """d/d theta of the cosine interpolant sum_{k<N} a_k cos(k theta) at the nodes.

    a_k from a DCT-II, the derivative -sum k a_k sin(k theta_j) by a DST-III
    (FFTs: rounding ~ eps log N; the same product as an N x N matrix had N^2
    eps for a constant, 5e-11 at N = 512). f: shape (N,) at `fejer_nodes`.
    """
    N = f.shape[0]
    a = dct(f, type=2) / N  # a_k for k >= 1 (a_0 is not needed)
    b = np.arange(1, N) * a[1:]  # k a_k, k = 1..N-1; DST-III wants them at k-1
    return -0.5 * dst(np.concatenate([b, [0.0]]), type=3)


def _flux_residual(prob: Problem, rho: np.ndarray, sigma: float) -> float:
    """The flux residual max |rho_theta - (2/sigma^2) rho v_theta| / max rho.

    d rho/d theta is the derivative of the cosine interpolant sum_{k<N} a_k
    cos(k theta) at the nodes (rounding ~ N eps, as the circle's FFT; the
    Legendre series of rho differentiated term by term had a floor of 3e-9 at
    d = 3, N = 128). Z and dZ/dt come from the Funk-Hecke expansion
    Z = sum_l kappa_l c_l P_l, c_l = N(d, l) / |S^{d-1}| int rho P_l, kappa_l
    below 1e-17 kappa_0 dropped, P_l' = l (l + d - 2) / (d - 1) P_{l-1} of
    dimension d + 2; d/d theta = -sin(theta) d/dt.
    """
    d, N, t = prob.d, prob.N, prob.t
    slope = _theta_derivative(rho)
    minus_sin = -np.sin(prob.theta)
    kappa = scaled_funk_hecke(np.arange(N), prob.beta, d)
    L = int(np.nonzero(kappa >= MODE_CUTOFF * kappa[0])[0][-1]) + 1
    ell = np.arange(L)
    P = legendre(L, t, d)  # (L, N): P[l, i] = P_l(t_i)
    dP = np.zeros_like(P)
    dP[1:] = (ell[1:] * (ell[1:] + d - 2) / (d - 1))[:, None] * legendre(
        L - 1, t, d + 2
    )
    c = harmonic_dimension(ell, d) / prob.area * (P @ (prob.w * rho))
    Z, dZ = (kappa[:L] * c) @ P, minus_sin * ((kappa[:L] * c) @ dP)
    if prob.softmax:
        # Where the Legendre sum of Z cancels to rounding, rho ~ Z^a is smaller.
        v = dZ / np.maximum(Z, np.finfo(np.float64).eps * Z.max())
        unit = 1.0
    else:
        v, unit = dZ, float(np.exp(prob.beta))
    # (2 / sigma^2) rho (1 / beta) unit dZ without forming e^beta / sigma^2.
    coupling = np.exp(np.log(2 * unit / prob.beta) - 2 * np.log(sigma))
    return float(np.abs(slope - coupling * rho * v).max() / rho.max())


def _solves(prob: Problem, residual: float, phi: np.ndarray, tol: float) -> bool:
    """Whether a flux residual says the state solves the zero-flux equation.

    The circle's test (`_stationary._solves`): residual <= 10 max(tol, N eps)
    (1 + max|phi|). False for a NaN residual, and a NaN or infinite phi.
    """
    scale = max(tol, prob.N * np.finfo(np.float64).eps) * (1 + np.abs(phi).max())
    bound = RESIDUAL_FACTOR * scale
    return bool(np.isfinite(bound) and residual <= bound)


def zonal_stationary_state(
    prob: Problem, psi, sigma, converged, stable, iterations, *, tol
):
    """The `ZonalStationaryState` of psi; converged only if its residual agrees."""
    s = prob.scale(sigma)
    im = prob.image(psi, s)
    psi = im.psi  # one more application: unit mass to rounding
    rho = np.exp(psi)
    residual = _flux_residual(prob, rho, sigma)
    free = None
    if not prob.softmax:
        Z = prob.kernel @ rho
        entropy = float(prob.w @ (rho * psi))
        energy = float(prob.w @ (rho * Z)) * np.exp(prob.beta) / (2 * prob.beta)
        free = 0.5 * sigma**2 * entropy - energy
    return ZonalStationaryState(
        rho=rho,
        t=prob.t,
        weights=prob.w,
        order=abs(prob.order(psi)),
        free_energy=free,
        residual=residual,
        converged=bool(converged) and _solves(prob, residual, im.phi, tol),
        stable=bool(stable),
        iterations=int(iterations),
        sigma=float(sigma),
        beta=prob.beta,
        attention=prob.attention,
        d=prob.d,
    )


def kernel_modes(beta: float, d: int) -> int:
    """The number of Funk-Hecke modes of e^{beta t} with kappa_l >= 1e-17 kappa_0.

    The fewest nodes `stationary_zonal` accepts: fewer cannot integrate the
    kernel itself to rounding (about 24 at beta = 4, 30 at 8, 91 at 100,
    155 at 300, nearly independent of d).

    Args:
        beta: inverse temperature, > 0.
        d: the dimension, an integer >= 2.

    Returns:
        The number of modes L (degrees 0..L-1).

    Raises:
        ValueError: beta not positive and finite, d not an integer >= 2.
    """
    beta, d = check_beta(beta), check_dimension(d)
    # I_nu(beta) falls off like e^{-nu^2 / (2 beta)}: 40 sqrt(beta) + 40 covers it.
    ell = np.arange(int(40 * np.sqrt(beta) + 40))
    kappa = scaled_funk_hecke(ell, beta, d)
    return int(np.nonzero(kappa >= MODE_CUTOFF * kappa[0])[0][-1]) + 1


def problem(beta, attention, d, N) -> Problem:
    beta = check_beta(beta)
    check_attention(attention)
    check_representable(beta, attention)
    d = check_dimension(d)
    value = real_scalar(N, "N")
    if not (np.isfinite(value) and value == int(value) and value >= 8):
        raise ValueError(f"`N` must be an integer >= 8; got {N!r}.")
    N = int(value)
    need = kernel_modes(beta, d)
    if N < need:
        raise ValueError(
            f"`N` = {N} is too small for `beta` = {beta:g}: the kernel e^(beta t) "
            f"has {need} Funk-Hecke modes above 1e-17 of the largest; use N >= "
            f"{need} (and more for a sharp cluster)."
        )
    return Problem(beta, attention, d, N)


def stationary_zonal(
    beta: float,
    sigma: float,
    d: int,
    attention: str = "softmax",
    N: int = 128,
    initial: Float[ArrayLike, " N"] | None = None,
    tol: float = 1e-12,
    max_iter: int = 20_000,
) -> ZonalStationaryState:
    """A stable zonal stationary density of the noisy density on S^{d-1}.

    Solves rho v = (sigma^2 / 2) grad rho (zero flux) as the fixed point
    rho = Z^a / mass (softmax) or e^{a Z} / mass (unnormalised),
    a = 2 / (beta sigma^2), for rho a function of t = <x, e> at N nodes
    (`fejer_nodes`), by Newton's method on log rho, with Picard iterations to
    leave a state that is unstable (as `stationary` on the circle, which it
    equals at d = 2 for even densities: 128 nodes here are 256 cells there).
    Near sigma_c, where the uniform state's growth factor (sigma_c / sigma)^2
    is within ~1e-3 of 1, leaving it takes more Picard steps than the default
    `max_iter` (as on the circle): `stable` is then False. See [Stationary states with
    noise][math-noise-stationary].

    Args:
        beta: inverse temperature, > 0.
        sigma: noise, > 0 (the equation's diffusion is sigma^2 / 2).
        d: the dimension, an integer >= 2; the sphere is S^{d-1}.
        attention: "softmax" or "unnormalized".
        N: nodes, >= `kernel_modes(beta, d)` (and >= 8). The grid must
            resolve the state: where it does not, `residual` is far above
            `tol` and (at the default tol) `converged` is False.
        initial: starting density at the nodes (`ZonalStationaryState.t`),
            shape (N,), nonnegative, not all 0; rescaled to mass 1. None starts
            from the map's image of a point cluster at t = 1, which finds the
            clustered state wherever one is stable.
        tol: tolerance on |log rho - log T(rho)|, relative to the exponent's
            size; `converged` also asks the flux `residual` to be within
            10 max(tol, N eps) (1 + max|phi|).
        max_iter: budget of Newton plus Picard iterations.

    Returns:
        A `ZonalStationaryState` (rho (N,), t (N,), weights (N,), order,
        free_energy, residual, converged, stable, iterations).

    Raises:
        ValueError: beta or sigma not positive and finite, d not an integer
            >= 2, unknown attention, N not an integer >= 8 or below
            `kernel_modes(beta, d)`, initial of the wrong shape or not
            nonnegative, tol or max_iter not positive, unnormalised attention
            with beta > 709.8, sigma too small for float64.
    """
    prob = problem(beta, attention, d, N)
    sigma = check_positive_sigma(sigma)
    tol, max_iter = check_iteration(tol, max_iter)
    s = prob.scale(sigma)
    if not np.isfinite(s):
        raise ValueError(f"`sigma` = {sigma:g} is too small for float64.")
    if initial is None:
        psi0 = prob.point_cluster_image(s)
    else:
        rho = np.asarray(initial, np.float64)
        if rho.shape != (prob.N,):
            raise ValueError(f"`initial` must have shape ({prob.N},); got {rho.shape}.")
        if not (np.all(np.isfinite(rho)) and np.all(rho >= 0) and rho.max() > 0):
            raise ValueError("`initial` must be finite, nonnegative and not all 0.")
        rho = np.maximum(rho, 1e-300)  # log of an exact 0
        psi0 = np.log(rho) - np.log(prob.w @ rho)
    psi, ok, stable, used = settle(prob, psi0, s, tol, max_iter)
    return zonal_stationary_state(prob, psi, sigma, ok, stable, used, tol=tol)
