"""Stationary densities on the circle under attention and noise.

With noise of strength sigma the density on the circle solves

    d_t rho + d_theta(rho v) = (sigma^2 / 2) d_theta^2 rho,

v as in `_circle` (A = beta I, V = I). Since d_theta Z = beta N, the field is a
gradient: v = (1/beta) d_theta log Z (softmax) or (1/beta) d_theta Z
(unnormalised), and a state of zero flux rho v = (sigma^2 / 2) rho' is a fixed
point

    rho = Z^a / mass  (softmax),   rho = e^{a Z} / mass  (unnormalised),

a = 2 / (beta sigma^2) (docs/math/noise-density.md). The unknown is psi = log rho
at the N/2 cell centres in (0, pi), rho even about theta = 0: the clusters sit at
0 (or pi) and the rotations, which leave every state stationary, are gone, so
Newton's linear systems are regular away from bifurcations. Z is a trapezoid sum
with the kernel e^{beta (cos - 1)} (positive: log Z never meets a cancellation);
Newton's Jacobian is the identity minus a rank-(M + 1) matrix (the kernel's
Fourier modes above 1e-17 of the largest), inverted by the Woodbury identity and
refined with the exact kernel. Newton converges to any fixed point, stable or
not; Picard iterations rho <- T(rho), whose linearisation is the same map, leave
the unstable ones.
"""

import dataclasses

import numpy as np
from jaxtyping import ArrayLike, Float

from .._checks import real_scalar
from .._repr import fields_repr
from ._bessel import scaled_bessel
from ._circle import cell_centres, check_attention, check_beta, check_representable
from ._linear import critical_noise

# Kernel modes with I_k(beta) / I_0(beta) below this change Z by less than an ulp.
MODE_CUTOFF = 1e-17
# The largest eigenvalue of the linearised map may exceed 1 by this and still be
# called stable: the marginal state at the threshold itself.
STABLE_SLACK = 1e-8
# `converged` needs a flux residual within this factor of the iteration's
# tolerance scale (`_solves`). Measured at the default tol = 1e-12: the ratio
# is at most 0.21 on resolved grids and 3e2 or more on unresolved ones; grids
# that nearly resolve the state fall between (12 for softmax, beta = 300, sigma
# = 0.2 sigma_c, N = 1024: residual 1.8e-6, order parameter exact). A grid's
# discretisation error does not shrink with tol, so an unresolved grid's ratio
# falls like 1 / tol: at tol = 1e-4 one passes (softmax, beta = 300, sigma =
# 0.3 sigma_c, N = 256: residual 6.2, ratio 9.3).
RESIDUAL_FACTOR = 10.0
# Size (in psi = log rho) of the mode-1 push that takes the uniform state off its
# unstable manifold's base.
PUSH = 1e-4


@dataclasses.dataclass(frozen=True, eq=False)  # array fields: no elementwise ==
class StationaryState:
    """A stationary density with noise, centred at theta = 0.

    Attributes:
        rho: values at the N cell centres `cell_centres(N)`, shape (N,), even
            about theta = 0, mass h sum rho = 1 (h = 2 pi / N).
        order: the order parameter |int e^{i theta} rho|: 0 for the uniform
            density, 1 for a point cluster.
        free_energy: (sigma^2/2) int rho log rho - (1/(2 beta)) iint
            e^{beta cos(theta - phi)} rho rho (unnormalised attention, whose
            dynamics is its Wasserstein gradient flow); None for softmax, for
            which no such free energy is known.
        residual: max |rho' - (2/sigma^2) rho v| / max rho (1/radian), the
            zero-flux equation evaluated by FFT (exact Bessel coefficients,
            spectral derivative), independently of the iteration.
        converged: the fixed-point iteration reached `tol`, and the density
            solves the zero-flux equation: `residual` <= 10 max(tol, N eps)
            (1 + max|phi|), eps = 2.2e-16, phi the fixed point's exponent
            a log Z (a Z unnormalised), the scale of the iteration's own test.
            At the default tol, False on a grid that does not resolve the
            state, however small the iteration's own residual; the test is as
            loose as `tol` (at tol = 1e-4 a residual of 6 can pass): read
            `residual` itself then. False where the residual is NaN.
        stable: the linearised fixed-point map has no eigenvalue above 1
            (within even densities): Picard iterations, and for unnormalised
            attention the dynamics, return to it.
        iterations: Newton plus Picard iterations.
        sigma: the noise.
        beta: the inverse temperature.
        attention: "softmax" or "unnormalized".
    """

    rho: np.ndarray
    order: float
    free_energy: float | None
    residual: float
    converged: bool
    stable: bool
    iterations: int
    sigma: float
    beta: float
    attention: str

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
            free_energy=self.free_energy,
            rho=self.rho,
        )

    @property
    def theta(self) -> np.ndarray:
        """The cells' centres, shape (N,)."""
        return cell_centres(self.rho.shape[-1])


@dataclasses.dataclass(frozen=True)
class _Image:
    """The fixed-point map at psi: T(psi) and what its derivatives need."""

    psi: np.ndarray  # log T(rho), (n,): unit mass
    rho: np.ndarray  # e^psi of the argument, (n,)
    Z: np.ndarray  # the attention's normaliser e^{-beta} Z, (n,)
    phi: np.ndarray  # the exponent: a log Z or a Z, (n,)
    slope: np.ndarray  # d phi / d Z, (n,)
    prob: np.ndarray  # e^phi / sum e^phi, (n,)


class Problem:
    """The discrete fixed-point map on the N/2 cells in (0, pi)."""

    def __init__(self, beta: float, attention: str, N: int):
        self.beta, self.attention, self.N = beta, attention, N
        self.softmax = attention == "softmax"
        n = N // 2
        self.h = 2 * np.pi / N
        theta = cell_centres(N)[:n]
        self.cos1 = np.cos(theta)
        # Even densities: cell j and its mirror -theta_j share the value.
        diff, total = np.subtract.outer(theta, theta), np.add.outer(theta, theta)
        self.kernel = self.h * (
            np.exp(beta * (np.cos(diff) - 1)) + np.exp(beta * (np.cos(total) - 1))
        )
        gamma = scaled_bessel(np.arange(n), beta)
        kept = np.nonzero(gamma >= MODE_CUTOFF * gamma[0])[0]
        M = int(kept[-1])
        # kernel = C diag(D) C^T up to modes above M (e^{beta cos} = sum I_k e^{ik.}).
        self.C = np.cos(np.outer(theta, np.arange(M + 1)))
        self.D = self.h * np.concatenate([[2 * gamma[0]], 4 * gamma[1 : M + 1]])
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
        # Trapezoid sums of positive terms; the floor only meets e^{-2 beta} < 1e-308.
        Z = np.maximum(self.kernel @ rho, np.finfo(np.float64).tiny)
        if self.softmax:
            phi, slope = s * np.log(Z), s / Z
        else:
            phi, slope = s * Z, np.full_like(Z, s)
        top = phi.max()
        weights = np.exp(phi - top)
        total = weights.sum()
        new = phi - top - np.log(2 * self.h * total)
        return _Image(new, rho, Z, phi, slope, weights / total)

    def linear(self, im: _Image):
        """The map's Jacobian DT = P D_phi' K D_rho, as (B, solve).

        P = I - 1 prob^T is the mass normalisation. B (M+1, M+1) has the
        nonzero eigenvalues of DT: B = diag(D) C^T D_rho P D_phi' C, whose
        entries involve rho phi' only, bounded where phi' = a / Z alone is not
        (far from a cluster). solve(b) is (I - DT)^{-1} b, b (n,) or (n, k):
        with w = D_rho x, x = b + P D_phi' K w where w solves a rank-(M+1)
        system (Woodbury), then refined twice with the exact DT. The refinement
        matters far from a cluster: there (K w)_i / Z_i needs the exact kernel
        sums, which the truncated Fourier form gets only to 1e-17 of the largest
        (an error of 5e-2 in x at beta = 60 before, 2e-14 after).
        """
        slope, rho, prob = im.slope, im.rho, im.prob
        left = (rho * slope)[:, None] * self.C  # D_rho P D_phi' C
        left = left - rho[:, None] * (prob @ (slope[:, None] * self.C))
        right = self.D[:, None] * self.C.T
        # einsum's own loops: a small product, immune to BLAS threads that
        # oversubscribe a busy machine (34 ms for this matmul on 2 loaded cores).
        B = np.einsum("kn,nm->km", right, left)
        small = np.eye(B.shape[0]) - B

        def column(v):  # (n,) -> (n, 1) for a stack of right-hand sides
            return v.reshape(v.shape + (1,))

        def project(u):  # P u = u - 1 prob^T u
            return u - prob @ u

        def approx(b):
            db = column(rho) * b if b.ndim == 2 else rho * b
            w = db + left @ np.linalg.solve(small, right @ db)
            d = column(slope) if b.ndim == 2 else slope
            return b + project(d * (self.kernel @ w))

        def apply(x):  # (I - DT) x, exactly
            d, r = (column(slope), column(rho)) if x.ndim == 2 else (slope, rho)
            return x - project(d * (self.kernel @ (r * x)))

        def solve(b):
            x = approx(b)
            for _ in range(2):
                x = x + approx(b - apply(x))
            return x

        return B, solve

    def ds(self, im: _Image) -> np.ndarray:
        """The derivative d T / d s, shape (n,)."""
        g = np.log(im.Z) if self.softmax else im.Z
        return g - im.prob @ g

    def order(self, psi: np.ndarray) -> float:
        """The integral of cos(theta) rho: > 0 for a cluster at 0, < 0 at pi."""
        return float(2 * self.h * np.exp(psi) @ self.cos1)

    def full(self, psi: np.ndarray) -> np.ndarray:
        """The N cell values from the n in (0, pi)."""
        rho = np.exp(psi)
        return np.concatenate([rho, rho[::-1]])


def quiet():
    return np.errstate(over="ignore", invalid="ignore", divide="ignore")


def largest_eigenvalue(B: np.ndarray) -> float:
    if not np.all(np.isfinite(B)):
        return float("nan")
    return float(np.max(np.linalg.eigvals(B).real))


def _newton(prob: Problem, psi, s: float, tol: float, max_iter: int):
    """Newton's method on psi = T(psi) from psi: (psi, converged, iterations, lam).

    lam is the largest eigenvalue of the linearised map at the last iterate (nan
    if it is not finite). Steps are halved until the residual decreases.
    """
    im = prob.image(psi, s)
    ok = False
    for it in range(max_iter + 1):
        R = psi - im.psi
        size = np.abs(R).max()
        B, solve = prob.linear(im)
        # Rounding in the exponent phi is relative to its size.
        if size <= tol * (1 + np.abs(im.phi).max()):
            ok = True
            break
        if it == max_iter or not np.isfinite(size):
            break
        try:
            step = -solve(R)
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
    return psi, ok, it, largest_eigenvalue(B)


def settle(prob: Problem, psi0, s: float, tol: float, max_iter: int):
    """A stable fixed point near psi0: (psi, converged, stable, iterations).

    Newton from psi0; if it lands on an unstable state (or fails), Picard
    iterations from psi0 + 1e-4 cos(theta) (off a fixed point that is exactly
    uniform) follow the map's own dynamics, in chunks of doubling length, each
    followed by Newton, until Newton lands on a stable state.
    """
    psi, ok, used, lam = _newton(prob, psi0, s, tol, min(100, max_iter))
    stable = lam <= 1 + STABLE_SLACK
    if ok and stable:
        return psi, True, True, used
    walker, chunk = psi0 + PUSH * prob.cos1, 16
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


def _flux_residual(rho: np.ndarray, beta: float, sigma: float, attention) -> float:
    """The flux residual max |rho' - (2/sigma^2) rho v| / max rho, by FFT."""
    N = rho.size
    k = np.arange(N // 2 + 1)
    i_k = scaled_bessel(k, beta)
    cos_hat = 2 * np.pi * i_k
    sin_hat = 2 * np.pi * (1j * k / beta) * i_k
    deriv = 1j * k.astype(np.float64)
    cos_hat[-1] = sin_hat[-1] = deriv[-1] = 0  # the Nyquist mode has no sign
    rho_hat = np.fft.rfft(rho)
    num = np.fft.irfft(rho_hat * sin_hat, n=N)
    den = np.fft.irfft(rho_hat * cos_hat, n=N)
    if attention == "softmax":
        # Where the Fourier sum of Z cancels to rounding, rho ~ Z^a is smaller still.
        v = num / np.maximum(den, np.finfo(np.float64).eps * den.max())
        unit = 1.0
    else:
        v, unit = num, float(np.exp(beta))
    slope = np.fft.irfft(rho_hat * deriv, n=N)
    # (2 / sigma^2) e^beta rho v without forming e^beta / sigma^2 separately.
    coupling = np.exp(np.log(2 * unit) - 2 * np.log(sigma))
    return float(np.abs(slope - coupling * rho * v).max() / rho.max())


def _solves(prob: Problem, residual: float, phi: np.ndarray, tol: float) -> bool:
    """Whether a flux residual says the state solves the zero-flux equation.

    The iteration stops at |log rho - log T(rho)| <= tol (1 + max|phi|); the
    flux residual of such a state on a grid that resolves it is at most 0.21
    times that (at the rounding floor), and 3e2 to 3e12 times it on the grids
    measured that do not, at tol = 1e-12 (`RESIDUAL_FACTOR`). False for a NaN
    residual, and for a NaN or infinite phi (no bound at all).
    """
    scale = max(tol, prob.N * np.finfo(np.float64).eps) * (1 + np.abs(phi).max())
    bound = RESIDUAL_FACTOR * scale
    return bool(np.isfinite(bound) and residual <= bound)


def stationary_state(prob: Problem, psi, sigma, converged, stable, iterations, *, tol):
    """The `StationaryState` of psi; converged only if its residual agrees."""
    s = prob.scale(sigma)
    im = prob.image(psi, s)
    psi = im.psi  # one more application: unit mass to rounding
    rho = prob.full(psi)
    residual = _flux_residual(rho, prob.beta, sigma, prob.attention)
    free = None
    if not prob.softmax:
        Z = prob.kernel @ np.exp(psi)
        rho_half = np.exp(psi)
        entropy = 2 * prob.h * float(rho_half @ psi)
        energy = 2 * prob.h * float(rho_half @ Z) * np.exp(prob.beta) / (2 * prob.beta)
        free = 0.5 * sigma**2 * entropy - energy
    return StationaryState(
        rho=rho,
        order=abs(prob.order(psi)),
        free_energy=free,
        residual=residual,
        converged=bool(converged) and _solves(prob, residual, im.phi, tol),
        stable=bool(stable),
        iterations=int(iterations),
        sigma=float(sigma),
        beta=prob.beta,
        attention=prob.attention,
    )


def _check_N(N) -> int:
    if isinstance(N, bool) or int(N) != N or N < 8 or N % 2:
        raise ValueError(f"`N` must be an even integer >= 8; got {N!r}.")
    return int(N)


def check_positive_sigma(sigma) -> float:
    value = real_scalar(sigma, "sigma")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"`sigma` must be positive and finite; got {sigma}.")
    return value


def check_iteration(tol, max_iter) -> tuple[float, int]:
    tol = float(tol)
    if not (np.isfinite(tol) and tol > 0):
        raise ValueError(f"`tol` must be positive and finite; got {tol}.")
    if isinstance(max_iter, bool) or int(max_iter) != max_iter or max_iter < 1:
        raise ValueError(f"`max_iter` must be a positive integer; got {max_iter!r}.")
    return tol, int(max_iter)


def problem(beta, attention, N) -> Problem:
    beta = check_beta(beta)
    check_attention(attention)
    check_representable(beta, attention)
    return Problem(beta, attention, _check_N(N))


def point_cluster_image(prob: Problem, s: float) -> np.ndarray:
    """The map's image log T(delta_0) of a point cluster at 0: the default seed."""
    n = prob.N // 2
    theta = cell_centres(prob.N)[:n]
    log_Z = prob.beta * (np.cos(theta) - 1)  # log of e^{-beta} Z, never -inf
    phi = s * log_Z if prob.softmax else s * np.exp(log_Z)
    phi = phi - phi.max()
    return phi - np.log(2 * prob.h * np.exp(phi).sum())


def _centred_log(initial, N: int) -> np.ndarray:
    """The log of `initial`'s part even about 0, once its mean direction is 0."""
    rho = np.asarray(initial, np.float64)
    if rho.shape != (N,):
        raise ValueError(f"`initial` must have shape ({N},); got {rho.shape}.")
    if not (np.all(np.isfinite(rho)) and np.all(rho >= 0) and rho.sum() > 0):
        raise ValueError("`initial` must be finite, nonnegative and not all 0.")
    theta = cell_centres(N)
    mean = np.sum(rho * np.exp(1j * theta))
    if abs(mean) > 1e-8 * rho.sum():  # rotate the mean direction to 0 (FFT shift)
        k = np.fft.rfftfreq(N, 1 / N)
        rho = np.fft.irfft(np.fft.rfft(rho) * np.exp(1j * k * np.angle(mean)), n=N)
    half = 0.5 * (rho[: N // 2] + rho[::-1][: N // 2])
    half = np.maximum(half, 1e-300 + 1e-14 * half.max())  # the shift rings near 0
    return np.log(half / (2 * (2 * np.pi / N) * half.sum()))


def stationary(
    beta: float,
    sigma: float,
    attention: str = "softmax",
    N: int = 512,
    initial: Float[ArrayLike, " N"] | None = None,
    tol: float = 1e-12,
    max_iter: int = 20_000,
) -> StationaryState:
    """A stable stationary density of the noisy density on the circle.

    Solves rho v = (sigma^2 / 2) rho' (zero flux) as the fixed point
    rho = Z^a / mass (softmax) or e^{a Z} / mass (unnormalised),
    a = 2 / (beta sigma^2), by Newton's method on log rho, with Picard
    iterations to leave a state that is unstable. See
    [Stationary states with noise][math-noise-stationary].

    Args:
        beta: inverse temperature, > 0.
        sigma: noise, > 0 (the equation's diffusion is sigma^2 / 2).
        attention: "softmax" or "unnormalized".
        N: cells, even, >= 8; the density is returned at `cell_centres(N)`.
            The grid must resolve the state: where it does not, `residual` is
            far above `tol` and (at the default tol) `converged` is False.
        initial: starting density, shape (N,), nonnegative; it is rotated so
            that its mean direction is 0 and its part even about 0 is used.
            None starts from the map's image of a point cluster at 0, which
            finds the clustered state wherever one is stable.
        tol: tolerance on |log rho - log T(rho)|, relative to the exponent's size;
            `converged` also asks the flux `residual` to be within 10 max(tol,
            N eps) (1 + max|phi|) (`StationaryState.converged`).
        max_iter: budget of Newton plus Picard iterations.

    Returns:
        A `StationaryState` (rho (N,), order, free_energy, residual, converged,
        stable, iterations).

    Raises:
        ValueError: beta or sigma not positive and finite, unknown attention,
            N not an even integer >= 8, initial of the wrong shape or not
            nonnegative, tol or max_iter not positive, unnormalised attention
            with beta > 709.8.
    """
    prob = problem(beta, attention, N)
    sigma = check_positive_sigma(sigma)
    tol, max_iter = check_iteration(tol, max_iter)
    s = prob.scale(sigma)
    if not np.isfinite(s):
        raise ValueError(f"`sigma` = {sigma:g} is too small for float64.")
    psi0 = (
        point_cluster_image(prob, s)
        if initial is None
        else _centred_log(initial, prob.N)
    )
    psi, ok, stable, used = settle(prob, psi0, s, tol, max_iter)
    return stationary_state(prob, psi, sigma, ok, stable, used, tol=tol)


def critical(beta: float, attention: str) -> float:
    """The linear threshold sigma_c (`critical_noise`) as a Python float."""
    return float(critical_noise(beta, attention))
