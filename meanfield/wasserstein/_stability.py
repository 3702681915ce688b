r"""Stability of the Transformer PDE in W_p: measured ratio against a Gronwall bound.

Derivation (Geshkovski et al., 2023, mean-field Lipschitz constant;
docs/math/wasserstein.md).
Write a row-normalised kernel as k(x, y) = e^{phi(x, y)} and
Gamma_mu(x) = int k(x, y) V y dmu(y) / int k(x, y) dmu(y). On the ball B_R:

- support: |Gamma_mu(x)| <= |V| R (a convex combination of V y), so both measures
  stay in B_{R(t)} with R(t) = R_0 e^{int_0^t |V|};
- in x: D_x Gamma_mu(x) = V Cov_{P_x}(y, grad_x phi(x, y)) with P_x the attention
  distribution, so |D_x Gamma| <= |V| c_x R^2;
- in mu: move the atoms along a coupling, y_theta = y + theta delta, theta in [0, 1];
  d/dtheta Gamma = int (k / Z) [V delta + (V y - Gamma) <grad_y phi, delta>], and with
  k / Z <= e^{c_o R^2} (oscillation of phi in y), |V y - Gamma| <= 2 |V| R and
  |grad_y phi| <= c_y R: |Gamma_mu(x) - Gamma_nu(x)| <= L_mu W_1(mu, nu) with
  L_mu = |V| (1 + 2 c_y R^2) e^{c_o R^2}.

Transport an optimal coupling of (mu_0, nu_0) along both flows and let D(t) be its
L^p cost; then d/dt |X - Y| <= L_x |X - Y| + L_mu W_1(mu_t, nu_t)
<= L_x |X - Y| + L_mu D, and Minkowski + Gronwall give
W_p(mu_t, nu_t) <= D(t) <= exp(int_0^t L(R(s)) ds) D(0),
L = L_x + L_mu <= |V| (1 + (c_x + 2 c_y) R^2) e^{c_o R^2}:

- softmax, phi = <A x, y>: c_x = c_y = |A|, c_o = 2 |A| ->
  L(R) = |V| (1 + 3 |A| R^2) e^{2 |A| R^2} (docs/math/wasserstein.md);
- L2, phi = 2 <Q x, K y> - |K y|^2 (the x-only term cancels): with a = 2 |K^T Q|,
  k = |K|: c_x = a, c_y = a + 2 k^2, c_o = 2 a + k^2;
- multi-head sum_h W_h Gamma_h: each head is attention with values W_h V_h, so the
  rates and constants add over heads with |W_h V_h| in place of |V|.

Masked measures (Castin et al., 2025), compared with the conditional distance:
couplings pair equal positions only, and a query at s sees the prefix s' <= s, so the
mu-term becomes the prefix average of |delta|. Its norm on L^p(lambda) is at most
p / (p - 1) for p > 1 (Copson's inequality, weighted Hardy) and exactly
sum_g m_g / M_g for p = 1 (group masses m_g, prefix masses M_g). Hence
L_masked = |V| (h_p + (c_x + 2 h_p c_y) R^2) e^{c_o R^2}: the unmasked L is not an upper
bound there (masked attention exceeds it even as R -> 0).

Each family gives its constants (`AbstractAttention.kernel_constants`) and says
whether its rows are probability vectors (`normalised`). Sinkhorn attention keeps
the radius bound (`normalised`) but has no constants (`bound` = +inf); the ill-posed
kernels (not `normalised`) have neither.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from .._attention.base import AbstractAttention
from .._attention.norms import value_norm
from .._checks import reject_result
from .._dynamics import simulate
from .._measures import AbstractParticles, MaskedParticles
from .._repr import fields_repr
from . import _distance as _wasserstein

# Quadrature steps on [t0, t_T] for int |V| and int L(R). Right-endpoint sums: exact
# for a constant rate and an over-estimate for the increasing L(R(s)).
GRID_STEPS = 4096


@dataclasses.dataclass(frozen=True)
class Stability:
    """Result of `stability`: measured W_p ratio and support radius with bounds.

    Attributes:
        ts: times (T,), ts[0] the initial time.
        distance: W_p(mu(t), nu(t)) (T,) (conditional for masked measures); +inf after
            a simulation stopped early.
        ratio: distance / distance[0] (T,).
        bound: the Gronwall bound C(t, R_0) (T,) (+inf once it overflows, or for
            attention without a bound).
        log_bound: log C(t, R_0) (T,), finite where `bound` overflows.
        radius: max |x| over the atoms of both measures (T,).
        radius_bound: R_0 e^{int |V|} (T,) (+inf for the ill-posed kernels).
        p: the order p.
        method: "exact" or "conditional".
        status: the two simulations' statuses (mu, nu).
    """

    ts: np.ndarray
    distance: np.ndarray
    ratio: np.ndarray
    bound: np.ndarray
    log_bound: np.ndarray
    radius: np.ndarray
    radius_bound: np.ndarray
    p: float
    method: str
    status: tuple[str, str]

    def __repr__(self) -> str:
        return fields_repr(
            self,
            p=self.p,
            method=self.method,
            status=self.status,
            within_bounds=self.within_bounds(),
            ts=self.ts,
            ratio=self.ratio,
        )

    def within_bounds(self, rtol: float = 1e-6) -> bool:
        """Ratio <= bound and radius <= radius bound at every reached time.

        Args:
            rtol: relative slack for the solver's error. The radius bound is attained
                (a token that sees only itself moves as x' = V x), so a measured
                radius may exceed it by the integration error.
        """
        ok = np.isfinite(self.ratio)
        slack = 1 + rtol
        return bool(
            np.all(self.ratio[ok] <= self.bound[ok] * slack)
            and np.all(self.radius[ok] <= self.radius_bound[ok] * slack)
        )


def hardy_constant(measure: AbstractParticles, p: float) -> float:
    """Norm bound of the prefix average on L^p(lambda): 1 unmasked, see module."""
    if not isinstance(measure, MaskedParticles):
        return 1.0
    if p > 1:
        return p / (p - 1)
    s = np.asarray(measure.positions, dtype=np.float64)
    w = np.asarray(measure.weights, dtype=np.float64)
    levels, group = np.unique(s[w > 0], return_inverse=True)
    mass = np.bincount(group, weights=w[w > 0], minlength=levels.size)
    return float(np.sum(mass / np.cumsum(mass)))


def gronwall_bound(
    attn: AbstractAttention, ts, R0: float, d: int, hardy: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """(log C(t, R_0), R(t)) at the times ts (T,) for measures in B_{R_0} at ts[0].

    log C = int L(R(s)) ds with L as in the module docstring; R(t) = R_0 e^{int rate}.
    Integrals by right-endpoint sums on GRID_STEPS steps plus the points of ts.

    See [The Gronwall bound][math-gronwall] for the derivation.
    """
    ts = np.asarray(ts, dtype=np.float64)
    grid = np.union1d(np.linspace(ts[0], ts[-1], GRID_STEPS + 1), ts)
    dt = np.diff(grid)
    right = jnp.asarray(grid[1:])
    heads = attn.flat_heads(grid[0], d)
    if not all(head.normalised for head, _ in heads):  # the ill-posed kernels
        inf = np.full(ts.shape, np.inf)
        return inf, inf

    def constants(t):  # (H, 4): |W V|, c_x, c_y, c_o per head
        rows = []
        for head, out in attn.flat_heads(t, d):
            c = head.kernel_constants(t, d)
            c = (jnp.inf,) * 3 if c is None else c
            rows.append(jnp.stack([value_norm(head, t, d, out), *c]))
        return jnp.stack(rows)

    v, cx, cy, co = np.moveaxis(np.asarray(jax.vmap(constants)(right)), -1, 0)
    log_growth = np.concatenate([[0.0], np.cumsum(np.sum(v, axis=1) * dt)])
    R = R0 * np.exp(log_growth)
    at_ts = np.searchsorted(grid, ts)
    if not np.all(np.isfinite(co)):  # Sinkhorn: radius bound only
        return np.full(ts.shape, np.inf), R[at_ts]
    R2 = (R[1:] ** 2)[:, None]
    with np.errstate(over="ignore", divide="ignore"):
        # log of each head's L; exp(c_o R^2) overflows long before the log does.
        log_L = np.log(v) + np.log(hardy + (cx + 2 * hardy * cy) * R2) + co * R2
        L = np.sum(np.exp(log_L), axis=1)
        log_C = np.concatenate([[0.0], np.cumsum(L * dt)])
    return log_C[at_ts], R[at_ts]


def _support_radius(x, weights) -> np.ndarray:
    """max_i |x_i| over atoms with positive weight per saved time, (T, n, d) -> (T,)."""
    norms = np.linalg.norm(np.asarray(x, dtype=np.float64), axis=-1)
    return np.max(norms[:, np.asarray(weights) > 0], axis=-1)


def stability(
    mu0: AbstractParticles,
    nu0: AbstractParticles,
    attn: AbstractAttention,
    ts,
    *,
    p: float = 2,
    **simulate_kwargs,
) -> Stability:
    """Check W_p(mu(t), nu(t)) <= C(t, R_0) W_p(mu_0, nu_0) and R(t) <= e^{int|V|} R_0.

    Simulates both measures with `simulate` (saving at ts), measures the exact W_p
    (the conditional W_p for `MaskedParticles`) at every time, and evaluates the
    Gronwall bound C(t, R_0) = exp(int_0^t L(R(s)) ds) derived in this module's
    docstring (softmax: L(R) = |V|_2 (1 + 3 |A|_2 R^2) e^{2 |A|_2 R^2}, Geshkovski et
    al.'s mean-field Lipschitz constant; L2, multi-head and masked: the same
    argument with their constants). The bound is loose; the measured ratio is
    reported beside it.

    See [Stability][math-stability] for the derivation of the bound and
    [The constants of each family][math-kernel-constants] for each family's constants.

    Args:
        mu0: initial measure, `Particles` or `MaskedParticles`.
        nu0: initial measure of the same kind and dimension (masked: the same
            position marginal, else the conditional distance is infinite).
        attn: attention velocity field (time-dependent parameters allowed).
        ts: increasing times (T,), ts[0] the initial time.
        p: order of the Wasserstein distance, >= 1.
        **simulate_kwargs: passed to `simulate` (solver, rtol, atol, ...).

    Returns:
        A `Stability` (ratio, bound, radius, radius_bound against ts).

    Raises:
        ValueError: mismatched measure kinds or dimensions, mu0 = nu0 (ratio
            undefined), different position marginals, bad ts or p.
        TypeError: `mu0` or `nu0` is a `Solution` (pass `sol.measure(i)`).
    """
    for name, m in (("mu0", mu0), ("nu0", nu0)):
        reject_result(
            m,
            name,
            "stability",
            expected="a particle measure",
            take="sol.measure({i})",
            positions=False,
        )
    masked = isinstance(mu0, MaskedParticles)
    if masked != isinstance(nu0, MaskedParticles):
        raise ValueError(
            "`mu0` and `nu0` must both be MaskedParticles or both unmasked; got "
            f"{type(mu0).__name__} and {type(nu0).__name__}."
        )
    ts = np.asarray(ts, dtype=np.float64)
    if ts.ndim != 1 or ts.size < 2 or np.any(np.diff(ts) <= 0):
        raise ValueError(
            f"`ts` must be a strictly increasing 1-D array of >= 2 times; got {ts}."
        )

    def measure_distance(m, n):
        if masked:
            return _wasserstein.conditional(m, n, p)
        return _wasserstein.distance(m, n, p)

    d0 = measure_distance(mu0, nu0)
    if not np.isfinite(d0.value):
        raise ValueError(
            "`mu0` and `nu0` must have the same position marginal (their conditional "
            "distance is infinite)."
        )
    if d0.value == 0:
        raise ValueError(
            "`mu0` and `nu0` coincide: the ratio W(t) / W(0) is undefined."
        )

    sols = [
        simulate(m, attn, float(ts[-1]), t0=float(ts[0]), saveat=ts, **simulate_kwargs)
        for m in (mu0, nu0)
    ]
    reached = np.asarray(sols[0].reached) & np.asarray(sols[1].reached)
    dist = np.full(ts.shape, np.inf)
    for i in np.flatnonzero(reached):
        dist[i] = measure_distance(sols[0].measure(i), sols[1].measure(i)).value
    radius = np.maximum(
        _support_radius(sols[0].x, mu0.weights), _support_radius(sols[1].x, nu0.weights)
    )
    radius[~reached] = np.inf
    hardy = hardy_constant(mu0, p) if masked else 1.0
    log_bound, radius_bound = gronwall_bound(attn, ts, float(radius[0]), mu0.dim, hardy)
    with np.errstate(over="ignore"):
        bound = np.exp(log_bound)
    return Stability(
        ts=ts,
        distance=dist,
        ratio=dist / d0.value,
        bound=bound,
        log_bound=log_bound,
        radius=radius,
        radius_bound=radius_bound,
        p=float(p),
        method="conditional" if masked else "exact",
        status=(sols[0].status, sols[1].status),
    )
