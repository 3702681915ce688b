"""The mean-field density on the circle: a finite-volume solver with FFT convolutions.

For tokens on S^1 with A = beta I, V = I (the sphere dynamics of `mf.simulate` with
normalization="sphere", written in the angle), the density rho(theta, t) solves

    d_t rho + d_theta(rho v) = 0,
    v(theta) = int e^{beta cos(theta - phi)} sin(phi - theta) rho(phi) dphi [/ Z]

with Z(theta) = int e^{beta cos(theta - phi)} rho(phi) dphi for softmax attention
(docs/math/density.md). Both integrals are convolutions, evaluated by FFT with the
kernels' exact Fourier coefficients (modified Bessel functions): O(N log N) per
evaluation. The flux rho v is upwinded at the cell faces from a MUSCL (minmod)
reconstruction, so the semi-discrete scheme conserves mass exactly (the fluxes
telescope) and keeps rho >= 0 (a cell at 0 sends nothing out). Time stepping is
the strong-stability-preserving SSPRK(4,3), adaptive, whose steps are kept only
when every stage is >= 0 (`_ssp.PositiveSSPRK43`): the fully discrete scheme
keeps rho >= 0 exactly too. With noise sigma > 0 the equation gains
(sigma^2 / 2) d_theta^2 rho, solved exactly and split from the transport
(`_splitting`).
"""

import dataclasses

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike, Float

from .._checks import check_tolerances, real_scalar
from .._clock import diffeqsolve_in_jit
from .._progress import progress_meter
from .._repr import fields_repr
from ._bessel import scaled_bessel
from ._splitting import SplitHeatSSPRK43, heat_rates
from ._ssp import PositiveSSPRK43

ATTENTIONS = ("softmax", "unnormalized")
# Mass |h sum rho - 1| accepted in rho0 (relative to N ulps it is generous).
MASS_TOL = 1e-8
# log of float64's largest value: e^beta overflows past it (709.78).
LOG_MAX = float(np.log(np.finfo(np.float64).max))


def cell_centres(N: int) -> np.ndarray:
    """Angles theta_j = (j + 1/2) 2 pi / N of the N cells' centres, shape (N,)."""
    return (np.arange(N) + 0.5) * (2 * np.pi / N)


def check_beta(beta) -> float:
    value = real_scalar(beta, "beta")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"`beta` must be positive and finite; got {beta}.")
    return value


def check_sigma(sigma) -> float:
    value = real_scalar(sigma, "sigma")
    if not (np.isfinite(value) and value >= 0):
        raise ValueError(f"`sigma` must be >= 0 and finite; got {sigma}.")
    return value


def check_attention(attention) -> None:
    if attention not in ATTENTIONS:
        raise ValueError(f"`attention` must be one of {ATTENTIONS}; got {attention!r}.")


def check_representable(beta: float, attention: str) -> None:
    """Refuse unnormalised attention whose field e^beta is beyond float64.

    Raises:
        ValueError: attention="unnormalized" with beta > 709.8.
    """
    if attention != "softmax" and beta > LOG_MAX:
        # The field itself is ~ e^beta / sqrt(2 pi beta): not representable, and
        # its time scale e^{-beta} is not either. Refuse rather than return NaN.
        raise ValueError(
            f'`beta` = {beta:g} is too large for attention="unnormalized": its '
            f"field is of size e^beta, beyond float64 for beta > {LOG_MAX:.1f}. "
            "Its dynamics on the clock e^{-beta} t is that of V = e^{-beta} I: "
            "simulate particles with `mf.UnnormalizedAttention(I, A=beta I, "
            'log_scale=-beta)`, or use attention="softmax".'
        )


def check_horizon(t1, saveat) -> tuple[float, np.ndarray]:
    """The final time and the save times (T,) of a density solve, checked.

    Raises:
        ValueError: t1 not a positive finite number, or saveat not
            non-decreasing times within [0, t1] (None saves 0 and t1).
    """
    t1 = real_scalar(t1, "t1")
    if not (np.isfinite(t1) and t1 > 0):
        raise ValueError(f"`t1` must be positive and finite; got {t1}.")
    ts = np.array([0.0, t1]) if saveat is None else np.asarray(saveat, np.float64)
    if (
        ts.ndim != 1
        or ts.size == 0
        or not (np.all(np.diff(ts) >= 0) and ts[0] >= 0 and ts[-1] <= t1)
    ):
        raise ValueError(f"`saveat` must be non-decreasing times within [0, {t1}].")
    return t1, ts


def check_max_steps(max_steps) -> int:
    """The step budget of a density solve: a positive integer (ValueError if not)."""
    if isinstance(max_steps, bool) or int(max_steps) != max_steps or max_steps < 1:
        raise ValueError(f"`max_steps` must be a positive integer; got {max_steps!r}.")
    return int(max_steps)


def _kernel_coefficients(N: int, beta: float, attention: str):
    """2 pi K^_k e^{ikh/2} / scale for k = 0..N/2: (denominator, numerator).

    K_c = e^{beta cos psi} has K^_k = I_k(beta); K_s = -e^{beta cos psi} sin psi
    = (1/beta) d/dpsi K_c has ik I_k(beta) / beta. The half-cell phase moves the
    convolution from the cell centres to the right faces. Scaled by e^{-beta}
    (`_bessel.scaled_bessel`) against overflow; unnormalised attention
    multiplies it back.

    Raises:
        ValueError: unnormalised attention with e^beta beyond float64.
    """
    check_representable(beta, attention)
    k = np.arange(N // 2 + 1)
    shift = np.exp(0.5j * k * (2 * np.pi / N))
    i_k = scaled_bessel(k, beta)  # SciPy past its range: NaN (`_bessel`)
    cos_hat = 2 * np.pi * i_k * shift
    sin_hat = 2 * np.pi * (1j * k / beta) * i_k * shift
    if N % 2 == 0:  # the Nyquist mode has no sign of its own: leave it out
        cos_hat[-1] = sin_hat[-1] = 0
    scale = 1.0 if attention == "softmax" else float(np.exp(beta))
    return cos_hat, sin_hat * scale


def minmod(a, b):
    return jnp.where(a * b > 0, jnp.sign(a) * jnp.minimum(jnp.abs(a), jnp.abs(b)), 0)


def rate_of_change(rho, cos_hat, sin_hat, softmax: bool):
    """The rate d rho / dt (N,) of the finite-volume scheme (module docstring)."""
    N = rho.shape[0]
    h = 2 * jnp.pi / N
    rho_hat = jnp.fft.rfft(rho)
    if softmax:  # both convolutions in one inverse transform
        num, den = jnp.fft.irfft(rho_hat[None, :] * jnp.stack([sin_hat, cos_hat]), n=N)
        v = num / den  # at face j + 1/2, the right of cell j
    else:
        v = jnp.fft.irfft(rho_hat * sin_hat, n=N)
    slope = minmod(rho - jnp.roll(rho, 1), jnp.roll(rho, -1) - rho)
    left = rho + 0.5 * slope  # face j + 1/2 seen from cell j
    right = jnp.roll(rho - 0.5 * slope, -1)  # ... from cell j + 1
    flux = jnp.maximum(v, 0) * left + jnp.minimum(v, 0) * right
    return -(flux - jnp.roll(flux, 1)) / h


@dataclasses.dataclass(frozen=True, eq=False)  # array fields: no elementwise ==
class DensitySolution:
    """The density on the circle at the save times.

    Attributes:
        ts: save times, shape (T,); +inf where not reached.
        rho: cell values, shape (T, N) (h sum_j rho_j = 1, h = 2 pi / N); NaN
            rows where not reached.
        status: "success", "max_steps", "negative" (a cell below 0; the
            positive time steps never make one), or "failed" (a non-finite
            density, or a step rejected below 100 ulps of t).
        num_steps: accepted + rejected steps.
        beta: the inverse temperature.
        attention: "softmax" or "unnormalized".
        sigma: the noise (shown in the repr when > 0).
    """

    ts: np.ndarray
    rho: np.ndarray
    status: str
    num_steps: int
    beta: float
    attention: str
    sigma: float = 0.0

    def __repr__(self) -> str:
        noise = {"sigma": self.sigma} if self.sigma > 0 else {}
        return fields_repr(
            self,
            status=self.status,
            num_steps=self.num_steps,
            beta=self.beta,
            attention=self.attention,
            **noise,
            ts=self.ts,
            rho=self.rho,
        )

    @property
    def theta(self) -> np.ndarray:
        """The cells' centres, shape (N,)."""
        return cell_centres(self.rho.shape[-1])

    @property
    def lowest(self) -> float:
        """The smallest cell value over the reached save times."""
        return float(np.nanmin(self.rho))

    @property
    def mass(self) -> np.ndarray:
        """The mass h sum_j rho_j at every save time, shape (T,): 1 to rounding."""
        return self.rho.sum(-1) * (2 * np.pi / self.rho.shape[-1])


@eqx.filter_jit
def _solve(
    rho0,
    t1,
    ts,
    cos_hat,
    sin_hat,
    heat_exponents,
    rtol,
    atol,
    *,
    softmax,
    max_steps,
    progress,
):
    def field(t, rho, args):
        return rate_of_change(rho, cos_hat, sin_hat, softmax)

    meter = progress_meter(progress)
    # Positive steps (`PositiveSSPRK43`), landing on the save times so that the
    # saved rows are steps' ends, not interpolants. No floor on the step beyond
    # the solver's own (relative to t): unnormalised attention at beta ~ 700
    # moves on a time scale e^{-beta}.
    controller = dfx.ClipStepSizeController(
        dfx.PIDController(rtol=rtol, atol=atol), step_ts=ts
    )
    sol = diffeqsolve_in_jit(  # inside this jit: no second jit wrapper
        dfx.ODETerm(field),
        # No noise: the transport alone, no heat steps (not even e^{0 D}).
        (
            PositiveSSPRK43()
            if heat_exponents is None
            else SplitHeatSSPRK43(heat_exponents)
        ),
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


def simulate(
    rho0: Float[ArrayLike, " N"],
    t1: float,
    *,
    beta: float,
    attention: str = "softmax",
    sigma: float = 0.0,
    saveat: ArrayLike | None = None,
    rtol: float = 1e-8,
    atol: float = 1e-8,
    max_steps: int = 1_000_000,
    progress: bool = False,
) -> DensitySolution:
    """Evolve a density on the circle under attention with A = beta I, V = I.

    See [The density on the circle][math-density] for the equation,
    [A conservative, positive scheme][math-density-scheme] for the scheme and
    [With noise][math-density-noise-scheme] for the diffusion.

    Args:
        rho0: cell values of the initial density on [0, 2 pi), shape (N,), N >= 4:
            nonnegative, with h sum rho0 = 1 (h = 2 pi / N) to 1e-8. Cell j is
            [j h, (j + 1) h).
        t1: final time, > 0.
        beta: inverse temperature, > 0.
        attention: "softmax" (normalised by Z) or "unnormalized".
        sigma: noise of the tokens, a number >= 0: adds (sigma^2 / 2) d_theta^2 rho,
            solved exactly and split from the transport (Strang); 0 solves the
            transport alone, as without this argument.
        saveat: save times (T,) in [0, t1], non-decreasing; None saves 0 and t1.
        rtol: relative tolerance of the adaptive steps.
        atol: absolute tolerance of the adaptive steps (in units of rho).
        max_steps: step budget; running out gives status "max_steps".
        progress: show a progress bar (tqdm).

    Returns:
        A `DensitySolution` (ts, rho (T, N), status, theta, mass). Computed in
        float64 whatever JAX's default precision.

    Raises:
        ValueError: rho0 not a finite nonnegative (N,) array of mass 1, N < 4,
            beta or t1 not a positive finite number, sigma not a finite number
            >= 0 (a scalar), unknown attention, saveat outside [0, t1],
            max_steps not a positive integer, beta > 709.8 (e^beta beyond
            float64) with attention="unnormalized".
    """
    beta = check_beta(beta)
    check_attention(attention)
    sigma = check_sigma(sigma)
    check_tolerances(rtol, atol)
    check_max_steps(max_steps)
    rho0 = np.asarray(rho0, np.float64)
    if rho0.ndim != 1 or rho0.shape[0] < 4:
        raise ValueError(f"`rho0` must have shape (N,), N >= 4; got {rho0.shape}.")
    if not (np.all(np.isfinite(rho0)) and np.all(rho0 >= 0)):
        raise ValueError("`rho0` must be finite and nonnegative.")
    N = rho0.shape[0]
    mass = rho0.sum() * 2 * np.pi / N
    if abs(mass - 1) > MASS_TOL:
        raise ValueError(
            f"`rho0` must have mass h sum rho0 = 1 (h = 2 pi / N); got {mass:.12g}: "
            "divide it by its mass."
        )
    t1, ts = check_horizon(t1, saveat)
    cos_hat, sin_hat = _kernel_coefficients(N, beta, attention)
    with jax.enable_x64(True):
        out_ts, rho, result, steps = _solve(
            jnp.asarray(rho0),
            jnp.asarray(t1),
            jnp.asarray(ts),
            jnp.asarray(cos_hat),
            jnp.asarray(sin_hat),
            None if sigma == 0 else jnp.asarray(heat_rates(N, sigma)),
            jnp.asarray(float(rtol)),
            jnp.asarray(float(atol)),
            softmax=attention == "softmax",
            max_steps=int(max_steps),
            progress=bool(progress),
        )
        out_ts, rho = np.asarray(out_ts), np.asarray(rho)
    return DensitySolution(
        ts=out_ts,
        rho=np.where(np.isfinite(out_ts)[:, None], rho, np.nan),
        status=run_status(result, rho, out_ts),
        num_steps=int(steps),
        beta=beta,
        attention=attention,
        sigma=sigma,
    )


def run_status(result, rho, ts) -> str:
    reached = rho[np.isfinite(ts)]
    # A non-finite density is a failure whatever the solver's own result (it
    # used to read "max_steps": the steps shrank on NaN until the budget ran out).
    if not np.all(np.isfinite(reached)):
        return "failed"
    if result == dfx.RESULTS.max_steps_reached:
        return "max_steps"
    if result != dfx.RESULTS.successful:
        return "failed"
    # Every accepted step is >= 0 exactly (`PositiveSSPRK43`): any negative cell
    # is a defect, never "success".
    if reached.size and reached.min() < 0:
        return "negative"
    return "success"
