"""The phase transition of the noisy density on the circle.

Below sigma_c (`critical_noise`) the uniform density is unstable and a cluster
forms. Whether its order parameter grows continuously from 0 or jumps is decided
by the direction of the bifurcating branch, sigma_c^2 / sigma^2 = 1 + kappa r^2
+ O(r^4): kappa > 0 continuous, kappa < 0 discontinuous, with hysteresis
(docs/math/noise-density.md). kappa has a closed form in Bessel ratios;
`noise_continuation` shows the hysteresis by sweeping sigma down from the uniform
state and up from the clustered one.
"""

import dataclasses

import numpy as np
from jaxtyping import ArrayLike, Float
from scipy.optimize import brentq
from scipy.special import ive

from .._repr import fields_repr
from ._bessel import neighbour_ratios
from ._circle import cell_centres, check_attention, check_beta
from ._linear import check_dimension
from ._stationary import (
    PUSH,
    STABLE_SLACK,
    Problem,
    check_iteration,
    critical,
    largest_eigenvalue,
    point_cluster_image,
    problem,
    quiet,
    settle,
    stationary_state,
)

TRANSITIONS = ("continuous", "discontinuous")
# A branch of stationary states starts on the linear mode at this order
# parameter and moves by at most _ORDER_STEP (`order_path`).
_FIRST_ORDER, _ORDER_STEP = 0.01, 0.02


def landau_coefficient(beta: float, attention: str = "softmax", d: int = 2) -> float:
    """The Landau coefficient: sigma_c^2 / sigma^2 = 1 + kappa r^2 + O(r^4).

    r = |int x rho| is the order parameter of the branch of stationary states
    that bifurcates from the uniform density on S^{d-1} along degree 1. With
    gamma_1 = I_{nu+1}(beta) / I_nu(beta), q = I_{nu+2}(beta) / I_{nu+1}(beta),
    nu = d/2 - 1, the fixed point rho ~ G(Z / Z_0 - 1) with G(u) = (1 + u)^a
    (softmax) or e^{b u} (unnormalised), expanded to third order with its
    degree-2 part slaved, gives

        kappa = d g_2 gamma_1^2 - d^2 gamma_1^3 (4 (d - 1) g_2^2 q
                / (d (d + 2) (1 - q)) + 3 g_3 / (d + 2)),

    g_j the Taylor coefficients of G at the threshold a = b = 1 / gamma_1.
    Unnormalised: kappa = d (1 - d q) / ((d + 2) (1 - q)), which vanishes where
    I_{d/2+1}(beta) / I_{d/2}(beta) = 1/d: Mun & Rosenzweig's beta_*^{(d)}.
    Softmax, delta = 1 - gamma_1: kappa = d delta / 2 - d^2 delta (2 delta - 1)
    / (2 (d + 2)) - d (d - 1) delta^2 q / ((d + 2) (1 - q)). On the circle (d = 2)
    these are (1 - 2q) / (2 (1 - q)) and delta (3/2 - delta - delta q / (2 (1 -
    q))), both tending to 1/2 as beta -> 0; softmax kappa ~ 2 / (3 beta) and
    unnormalised kappa ~ 11/12 - beta / 3 as beta -> inf. Accurate at every
    beta > 0 ([Large and small beta][math-density-bessel]).
    See [The amplitude equation][math-noise-amplitude] and
    [The transition on the sphere][math-sphere-transition].

    Args:
        beta: inverse temperature, > 0.
        attention: "softmax" or "unnormalized".
        d: the dimension of the tokens, an integer >= 2 (tokens on S^{d-1}).

    Returns:
        kappa: > 0 where the transition is continuous, < 0 where it is not.

    Raises:
        ValueError: beta not positive and finite, unknown attention, or `d`
            not an integer >= 2.
    """
    beta = check_beta(beta)
    check_attention(attention)
    d = check_dimension(d)
    # gamma_1 = 1 - delta and q = 1 - gap: at large beta both are 1 - O(1 / beta),
    # and delta, gap are computed without cancellation.
    delta, q, gap = neighbour_ratios(beta, 0.5 * d - 1)
    if attention == "softmax":
        # The formula above with g_1 = a = 1 / gamma_1 and g_j = binom(a, j),
        # delta factored out: delta^2 underflows at beta ~ 1e300.
        return float(
            delta
            * (
                d / 2
                - d * d * (2 * delta - 1) / (2 * (d + 2))
                - d * (d - 1) * delta * q / ((d + 2) * gap)
            )
        )
    return float(d * (1 - d * q) / ((d + 2) * gap))


def transition_type(beta: float, attention: str = "softmax", d: int = 2) -> str:
    """The type of the transition: "continuous" (kappa >= 0) or "discontinuous".

    kappa is `landau_coefficient`. See [The amplitude equation][math-noise-amplitude].

    Args:
        beta: inverse temperature, > 0.
        attention: "softmax" or "unnormalized".
        d: the dimension of the tokens, an integer >= 2 (tokens on S^{d-1}).

    Returns:
        "continuous" or "discontinuous".

    Raises:
        ValueError: beta not positive and finite, unknown attention, or `d`
            not an integer >= 2.
    """
    return TRANSITIONS[landau_coefficient(beta, attention, d) < 0]


def type_change_beta(
    attention: str = "unnormalized",
    bracket: tuple[float, float] = (0.05, 500.0),
    d: int = 2,
) -> float | None:
    """The beta at which the transition changes type: the root of kappa(beta).

    Brent's method on `landau_coefficient` (to 4 ulps of beta). For unnormalised
    attention the root solves I_{d/2+1}(beta) / I_{d/2}(beta) = 1/d: Mun &
    Rosenzweig's beta_*^{(d)} (2.4469... on the circle, 1.8162... on S^2).
    Softmax attention has kappa > 0 wherever it is evaluated in d = 2 (kappa ~
    2 / (3 beta) at large beta): no root, None; see
    [The transition on the sphere][math-sphere-transition] for d >= 3.

    Args:
        attention: "softmax" or "unnormalized".
        bracket: (low, high), 0 < low < high: where to look.
        d: the dimension of the tokens, an integer >= 2 (tokens on S^{d-1}).

    Returns:
        The root, or None if kappa has one sign at 400 log-spaced betas of
        `bracket`.

    Raises:
        ValueError: unknown attention, bracket not 0 < low < high finite, or
            `d` not an integer >= 2.
    """
    check_attention(attention)
    d = check_dimension(d)
    low, high = (float(b) for b in bracket)
    if not (0 < low < high < np.inf):
        raise ValueError(f"`bracket` must satisfy 0 < low < high < inf; got {bracket}.")
    betas = np.geomspace(low, high, 400)
    kappa = np.array([landau_coefficient(b, attention, d) for b in betas])
    change = np.nonzero(np.sign(kappa[:-1]) != np.sign(kappa[1:]))[0]
    if change.size == 0:
        return None
    i = int(change[0])
    return float(
        brentq(
            lambda b: landau_coefficient(b, attention, d),
            betas[i],
            betas[i + 1],
            xtol=1e-15,
            rtol=4 * np.finfo(np.float64).eps,
        )
    )


@dataclasses.dataclass(frozen=True, eq=False)
class NoiseContinuation:
    """The order parameter along a sweep of the noise, from both sides.

    On the circle (`noise_continuation`) or, for zonal states, on S^{d-1}
    (`noise_continuation_zonal`).

    Attributes:
        sigma: the noises, shape (S,), increasing.
        from_uniform: order parameter continued with decreasing sigma from the
            uniform state (pushed along mode 1 at every step), shape (S,).
        from_cluster: order parameter continued with increasing sigma from the
            clustered state, shape (S,).
        sigma_c: the linear threshold (`critical_noise`).
        converged: every state converged (`StationaryState.converged`: the
            iteration and the flux residual) and is stable.
        residual: the largest flux residual of the states (`StationaryState`,
            `ZonalStationaryState`).
        beta: the inverse temperature.
        attention: "softmax" or "unnormalized".
        d: the dimension of the tokens (on S^{d-1}): 2 on the circle
            (`noise_continuation`), any d >= 2 for zonal states
            (`noise_continuation_zonal`).
    """

    sigma: np.ndarray
    from_uniform: np.ndarray
    from_cluster: np.ndarray
    sigma_c: float
    converged: bool
    residual: float
    beta: float
    attention: str
    d: int = 2

    def __repr__(self) -> str:
        return fields_repr(
            self,
            sigma_c=self.sigma_c,
            converged=self.converged,
            beta=self.beta,
            attention=self.attention,
            d=self.d,
            sigma=self.sigma,
            from_uniform=self.from_uniform,
            from_cluster=self.from_cluster,
        )

    @property
    def bistable(self) -> np.ndarray:
        """The noises at which the two branches differ, (S,) bool.

        By more than 1e-3 in the order parameter: at sigma_c itself the
        fixed point is degenerate, and Newton's tolerance on the equation
        leaves the order parameter only to about sqrt(tol).
        """
        return np.abs(self.from_uniform - self.from_cluster) > 1e-3


def noise_continuation(
    beta: float,
    sigmas: Float[ArrayLike, " S"],
    attention: str = "softmax",
    N: int = 512,
    tol: float = 1e-12,
    max_iter: int = 20_000,
) -> NoiseContinuation:
    """Stable stationary states along sigma, continued from both sides.

    Down: from the uniform state at the largest sigma, each step starting from
    the previous state times e^{1e-4 cos theta}: the uniform state is kept
    while it is stable and left along mode 1 where it is not. Up: from the
    clustered state at the smallest sigma (`stationary`'s default start), each
    step from the previous state. Where the transition is discontinuous the
    two disagree between sigma_c and the fold of the cluster branch. See
    [Hysteresis][math-noise-hysteresis].

    Args:
        beta: inverse temperature, > 0.
        sigmas: noises, shape (S,), increasing, positive.
        attention: "softmax" or "unnormalized".
        N: cells, even, >= 8.
        tol: as in `stationary`.
        max_iter: as in `stationary`, per state.

    Returns:
        A `NoiseContinuation` (sigma, from_uniform, from_cluster, sigma_c,
        converged, residual, bistable).

    Raises:
        ValueError: beta not positive and finite, sigmas not increasing and
            positive, unknown attention, N not an even integer >= 8, tol or
            max_iter not positive, unnormalised attention with beta > 709.8.
    """
    prob = problem(beta, attention, N)
    tol, max_iter = check_iteration(tol, max_iter)
    sig = np.asarray(sigmas, np.float64)
    if (
        sig.ndim != 1
        or sig.size == 0
        or not (np.all(np.isfinite(sig)) and sig[0] > 0 and np.all(np.diff(sig) > 0))
    ):
        raise ValueError("`sigmas` must be a 1-D increasing array of positive noises.")
    if not np.isfinite(prob.scale(sig[0])):
        raise ValueError(f"`sigmas` start at {sig[0]:g}: too small for float64.")
    push = PUSH * prob.cos1
    ok, worst = True, 0.0
    down = np.empty(sig.size)
    psi = np.full(prob.N // 2, -np.log(2 * np.pi))
    for i in range(sig.size - 1, -1, -1):
        s = prob.scale(sig[i])
        psi, conv, stable, _ = settle(prob, psi + push, s, tol, max_iter)
        state = stationary_state(prob, psi, sig[i], conv, stable, 0, tol=tol)
        down[i], ok = state.order, ok and state.converged and stable
        worst = max(worst, state.residual)
    up = np.empty(sig.size)
    psi = point_cluster_image(prob, prob.scale(sig[0]))
    for i in range(sig.size):
        s = prob.scale(sig[i])
        psi, conv, stable, _ = settle(prob, psi, s, tol, max_iter)
        state = stationary_state(prob, psi, sig[i], conv, stable, 0, tol=tol)
        up[i], ok = state.order, ok and state.converged and stable
        worst = max(worst, state.residual)
    return NoiseContinuation(
        sigma=sig,
        from_uniform=down,
        from_cluster=up,
        sigma_c=critical(prob.beta, attention),
        converged=bool(ok),
        residual=float(worst),
        beta=prob.beta,
        attention=attention,
    )


@dataclasses.dataclass(frozen=True, eq=False)
class ClusterBranch:
    """The branch of one-cluster states, parametrised by its order parameter.

    Attributes:
        order: the order parameters r, shape (R,).
        sigma: the noise at which the state of order r is stationary, (R,).
        stable: the state is stable within even densities, (R,).
        converged: Newton converged and the state solves the zero-flux
            equation to its tolerance (`StationaryState.converged`), (R,).
        residual: the flux residual of each state (`StationaryState`), (R,).
        rho: the states at `cell_centres(N)`, shape (R, N).
        sigma_c: the linear threshold, where the branch leaves the uniform state.
        beta: the inverse temperature.
        attention: "softmax" or "unnormalized".
    """

    order: np.ndarray
    sigma: np.ndarray
    stable: np.ndarray
    converged: np.ndarray
    residual: np.ndarray
    rho: np.ndarray
    sigma_c: float
    beta: float
    attention: str

    def __repr__(self) -> str:
        return fields_repr(
            self,
            sigma_c=self.sigma_c,
            beta=self.beta,
            attention=self.attention,
            order=self.order,
            sigma=self.sigma,
            stable=self.stable,
        )

    @property
    def fold(self) -> float:
        """The largest noise on the branch (nan if no state converged).

        Where the transition is discontinuous no clustered state exists above
        it; where it is continuous it is the noise at the smallest order, just
        below sigma_c. Its accuracy is that of the order parameters' spacing.
        """
        if not np.any(self.converged):
            return float("nan")
        return float(np.max(self.sigma[self.converged]))


def cluster_branch(
    beta: float,
    orders: Float[ArrayLike, " R"],
    attention: str = "softmax",
    N: int = 512,
    tol: float = 1e-12,
) -> ClusterBranch:
    """The one-cluster stationary states at prescribed order parameters.

    For each r, solves for the even density of order parameter r and the noise
    sigma at which it is stationary (Newton on (log rho, a), bordered by the
    constraint int cos(theta) rho = r), continuing from the previous r. Unlike
    a sweep in sigma it passes the folds of the branch, and gives its unstable
    part. See [The amplitude equation][math-noise-amplitude].

    Args:
        beta: inverse temperature, > 0.
        orders: order parameters, shape (R,), increasing, within (0, 1).
        attention: "softmax" or "unnormalized".
        N: cells, even, >= 8.
        tol: Newton's tolerance, as in `stationary`.

    Returns:
        A `ClusterBranch` (order, sigma, stable, converged, residual, rho,
        sigma_c, fold).

    Raises:
        ValueError: beta not positive and finite, orders not increasing
            within (0, 1), unknown attention, N not an even integer >= 8, tol
            not positive, unnormalised attention with beta > 709.8.
    """
    prob = problem(beta, attention, N)
    tol, _ = check_iteration(tol, 1)
    r = np.asarray(orders, np.float64)
    if r.ndim != 1 or r.size == 0 or not (np.all(np.diff(r) > 0) and 0 < r[0]):
        raise ValueError("`orders` must be an increasing 1-D array within (0, 1).")
    if r[-1] >= 1:
        raise ValueError(f"`orders` must lie below 1; got {r[-1]}.")
    sigma_c = critical(prob.beta, attention)
    out = dict(sigma=[], stable=[], converged=[], residual=[], rho=[])
    for psi, s, ok, lam in _branch(prob, r, tol):
        sigma = prob.sigma(s)
        state = stationary_state(
            prob, psi, sigma, ok, lam <= 1 + STABLE_SLACK, 0, tol=tol
        )
        out["sigma"].append(sigma)
        out["stable"].append(state.stable)
        out["converged"].append(state.converged)
        out["residual"].append(state.residual)
        out["rho"].append(state.rho)
    return ClusterBranch(
        order=r,
        sigma=np.array(out["sigma"]),
        stable=np.array(out["stable"]),
        converged=np.array(out["converged"]),
        residual=np.array(out["residual"]),
        rho=np.stack(out["rho"]),
        sigma_c=sigma_c,
        beta=prob.beta,
        attention=attention,
    )


def order_path(orders) -> list[float]:
    """The order parameters a branch is continued through to reach `orders`.

    From min(_FIRST_ORDER, orders[0]) in steps of at most _ORDER_STEP and
    (1 - r) / 5 (near r = 1 the cluster sharpens fast), every target of
    `orders` (increasing) included.
    """
    path = [min(_FIRST_ORDER, float(orders[0]))]
    for target in orders:
        while path[-1] + min(_ORDER_STEP, (1 - path[-1]) / 5) < target:
            path.append(path[-1] + min(_ORDER_STEP, (1 - path[-1]) / 5))
        if target > path[-1]:
            path.append(float(target))
    return path


def _branch(prob: Problem, r: np.ndarray, tol: float):
    """(psi, s, converged, lam) at each order parameter of r (increasing).

    From r = _FIRST_ORDER on the linear mode 1 + 2 r cos(theta), in steps of at
    most _ORDER_STEP and (1 - r) / 5, each from a secant prediction of the two
    before.
    """
    path = order_path(r)
    theta = cell_centres(prob.N)[: prob.N // 2]
    guess = np.log((1 + 2 * path[0] * np.cos(theta)) / (2 * np.pi))
    s = prob.scale(critical(prob.beta, prob.attention))
    history: list[tuple[np.ndarray, float, float]] = []
    found = {}
    for target in path:
        if len(history) >= 2:  # secant predictor in r
            (p1, s1, r1), (p2, s2, r2) = history[-2:]
            t = (target - r2) / (r2 - r1)
            guess, s = p2 + t * (p2 - p1), s2 + t * (s2 - s1)
        psi, s_new, ok, lam = _bordered_newton(prob, guess, s, target, tol)
        if not ok and history:  # again from the last state, without the predictor
            psi, s_new, ok, lam = _bordered_newton(prob, *history[-1][:2], target, tol)
        if ok:
            history.append((psi, s_new, target))
        found[float(target)] = (psi, s_new, ok, lam)
    return [found[float(target)] for target in r]


def _bordered_newton(prob: Problem, psi, s, target, tol, max_iter=60):
    """Newton on (psi = T(psi; s), order(psi) = target): (psi, s, converged, lam).

    Steps are halved until the residual decreases (at most 14 times), and s is
    kept positive.
    """
    cos_weight = 2 * prob.h * prob.cos1

    def residual(psi, s):
        im = prob.image(psi, s)
        e = float(cos_weight @ np.exp(psi)) - target
        return im, psi - im.psi, e

    im, R, e = residual(psi, s)
    ok = False
    for _ in range(max_iter):
        B, solve = prob.linear(im)
        size = np.abs(R).max()
        if size <= tol * (1 + np.abs(im.phi).max()) and abs(e) <= tol:
            ok = True
            break
        g = prob.ds(im)  # d/ds of the equation psi - T is -g
        try:
            JR, Jg = solve(np.stack([R, g], 1)).T  # (I - DT)^{-1} [R, g]
        except np.linalg.LinAlgError:
            break
        c = cos_weight * np.exp(psi)  # d order / d psi
        # [I - DT, -g; c^T, 0] [dpsi; ds] = -[R; e]
        ds = (c @ JR - e) / (c @ Jg)
        dpsi = -JR + Jg * ds
        t, before = 1.0, max(size, abs(e))
        for _ in range(15):
            if s + t * ds > 0:
                with quiet():  # a rejected trial may overflow
                    trial = residual(psi + t * dpsi, s + t * ds)
                    after = max(np.abs(trial[1]).max(), abs(trial[2]))
                if np.isfinite(after) and after < (1 - 1e-4 * t) * before:
                    break
            t /= 2
        else:
            break
        psi, s = psi + t * dpsi, s + t * ds
        im, R, e = trial
    else:
        B, _ = prob.linear(im)
    return psi, s, ok, largest_eigenvalue(B)


def coexistence_noise(beta: float, N: int = 512, tol: float = 1e-12) -> float:
    """The noise of the phase transition of unnormalised attention.

    Unnormalised attention with noise is the Wasserstein gradient flow of the
    free energy F (`StationaryState.free_energy`); the phase transition is where
    the global minimiser changes. Where the transition is continuous
    (`landau_coefficient` >= 0) that is sigma_c. Where it is discontinuous it
    is the noise sigma_* in (sigma_c, fold) at which the stable clustered state
    has the uniform state's free energy -(sigma^2/2) log(2 pi) - I_0(beta) /
    (2 beta): Mun & Rosenzweig's critical coupling K_c = 1 / sigma_*^2 (their
    K_# is 1 / sigma_c^2). Found along `cluster_branch` (98 order parameters
    from 0.005 to 0.99), then by Brent's method in the order parameter. See
    [Hysteresis][math-noise-hysteresis].

    Args:
        beta: inverse temperature, > 0, <= 709.8.
        N: cells, even, >= 8.
        tol: Newton's tolerance, as in `stationary`.

    Returns:
        sigma_*; nan if the free energies do not cross on the branch's stable
        part (a grid too coarse for a cluster sharper than r = 0.99).

    Raises:
        ValueError: beta not positive, finite and <= 709.8, N not an even
            integer >= 8, tol not positive.
    """
    prob = problem(beta, "unnormalized", N)
    tol, _ = check_iteration(tol, 1)
    sigma_c = critical(prob.beta, "unnormalized")
    if landau_coefficient(prob.beta, "unnormalized") >= 0:
        return sigma_c
    orders = np.geomspace(0.005, 0.99, 98)
    states = _branch(prob, orders, tol)

    def gap(psi, s, ok):
        sigma = prob.sigma(s)
        uniform = -0.5 * sigma**2 * np.log(2 * np.pi) - np.exp(prob.beta) * ive(
            0, prob.beta
        ) / (2 * prob.beta)
        return (
            stationary_state(prob, psi, sigma, ok, True, 0, tol=tol).free_energy
            - uniform
        )

    # The saddles between the uniform state and the cluster (the unstable part)
    # lie above the uniform state's free energy: the crossing is on the stable
    # part, found from the sharpest cluster down.
    gaps = [gap(psi, s, ok) if ok else np.nan for psi, s, ok, _ in states]
    for i in range(len(orders) - 1, 0, -1):
        if not (states[i][2] and states[i - 1][2]):
            break
        if gaps[i] < 0 <= gaps[i - 1]:
            psi0, s0 = states[i][:2]

            def along(r, psi0=psi0, s0=s0):
                psi, s, ok, _ = _bordered_newton(prob, psi0, s0, r, tol)
                return gap(psi, s, ok)

            r_star = brentq(along, orders[i - 1], orders[i], xtol=1e-13)
            return prob.sigma(_bordered_newton(prob, psi0, s0, r_star, tol)[1])
    return float("nan")
