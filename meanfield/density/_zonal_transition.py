"""The noise sweep of zonal stationary states on S^{d-1}: both branches, hysteresis.

`noise_continuation_zonal` continues the stationary states of `stationary_zonal`
along sigma from the uniform state (down) and from the clustered state (up): they
disagree between sigma_c and the fold of the cluster branch where the transition
is discontinuous (`landau_coefficient` < 0), as on the circle (`_transition`).
See [Stationary states on the sphere][math-sphere-stationary].
"""

import numpy as np
from jaxtyping import ArrayLike, Float

from ._linear import critical_noise
from ._stationary import PUSH, check_iteration, quiet
from ._transition import NoiseContinuation, order_path
from ._zonal_stationary import (
    Problem,
    largest_eigenvalue,
    problem,
    settle,
    zonal_stationary_state,
)


def noise_continuation_zonal(
    beta: float,
    sigmas: Float[ArrayLike, " S"],
    d: int,
    attention: str = "softmax",
    N: int = 128,
    tol: float = 1e-12,
    max_iter: int = 20_000,
) -> NoiseContinuation:
    """Stable zonal stationary states along sigma, continued from both sides.

    Down: from the uniform state at the largest sigma, each step from the
    previous state times e^{1e-4 t}: the uniform state is kept while it is
    stable and left along degree 1 where it is not. Up: from the clustered
    state at the smallest sigma (`stationary_zonal`'s default start), each step
    from the previous state. Where the transition is discontinuous
    (`landau_coefficient` < 0) the two disagree between sigma_c and the
    fold of the cluster branch. See [Hysteresis][math-sphere-stationary].

    Args:
        beta: inverse temperature, > 0.
        sigmas: noises, shape (S,), increasing, positive.
        d: the dimension, an integer >= 2.
        attention: "softmax" or "unnormalized".
        N: nodes, as in `stationary_zonal`.
        tol: as in `stationary_zonal`.
        max_iter: as in `stationary_zonal`, per state.

    Returns:
        A `NoiseContinuation` (sigma, from_uniform, from_cluster,
        sigma_c, converged, residual, bistable).

    Raises:
        ValueError: as `stationary_zonal`, and sigmas not a 1-D increasing
            array of positive noises.
    """
    prob = problem(beta, attention, d, N)
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
    push = PUSH * prob.t
    ok, worst = True, 0.0
    branches = []
    for down in (True, False):
        if down:  # from the uniform state at the largest sigma
            psi, order = prob.uniform(), range(sig.size - 1, -1, -1)
        else:  # from the clustered state at the smallest
            psi, order = prob.point_cluster_image(prob.scale(sig[0])), range(sig.size)
        out = np.empty(sig.size)
        for i in order:
            # Down, the push leaves a uniform state that has become unstable.
            seed = psi + push if down else psi
            psi, conv, stable, _ = settle(prob, seed, prob.scale(sig[i]), tol, max_iter)
            state = zonal_stationary_state(prob, psi, sig[i], conv, stable, 0, tol=tol)
            out[i], ok = state.order, ok and state.converged and stable
            worst = max(worst, state.residual)
        branches.append(out)
    return NoiseContinuation(
        sigma=sig,
        from_uniform=branches[0],
        from_cluster=branches[1],
        sigma_c=float(critical_noise(prob.beta, attention, prob.d)),
        converged=bool(ok),
        residual=float(worst),
        beta=prob.beta,
        attention=attention,
        d=prob.d,
    )


def _bordered_newton(prob: Problem, psi, s, target, tol, max_iter=60):
    """Newton on (psi = T(psi; s), order(psi) = target): (psi, s, converged, lam).

    The circle's `_transition._bordered_newton` with dense solves: finds the
    state of order parameter `target` and its noise, stable or not.
    """
    tw = prob.w * prob.t
    eye = np.eye(prob.N)

    def residual(psi, s):
        im = prob.image(psi, s)
        return im, psi - im.psi, float(tw @ np.exp(psi)) - target

    im, R, e = residual(psi, s)
    ok = False
    for _ in range(max_iter):
        J = prob.jacobian(im)
        size = np.abs(R).max()
        if size <= tol * (1 + np.abs(im.phi).max()) and abs(e) <= tol:
            ok = True
            break
        try:
            JR, Jg = np.linalg.solve(eye - J, np.stack([R, prob.ds(im)], 1)).T
        except np.linalg.LinAlgError:
            break
        c = tw * np.exp(psi)  # d order / d psi
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
        J = prob.jacobian(im)
    return psi, s, ok, largest_eigenvalue(J)


def _zonal_branch(prob: Problem, orders: np.ndarray, tol: float = 1e-12):
    """(sigma, converged, lam) at each order parameter of `orders` (increasing).

    Along `_transition.order_path`, from the linear mode (1 + d r t) / |S^{d-1}|
    (whose order parameter is r, int t^2 = |S^{d-1}| / d), each from a secant
    prediction of the two before: the branch
    of one-cluster states through its folds, unstable parts included.
    """
    path = order_path(orders)
    guess = np.log((1 + prob.d * path[0] * prob.t) / prob.area)
    s = prob.scale(float(critical_noise(prob.beta, prob.attention, prob.d)))
    history, found = [], {}
    for target in path:
        if len(history) >= 2:  # secant predictor in r
            (p1, s1, r1), (p2, s2, r2) = history[-2:]
            f = (target - r2) / (r2 - r1)
            guess, s = p2 + f * (p2 - p1), s2 + f * (s2 - s1)
        psi, s_new, ok, lam = _bordered_newton(prob, guess, s, target, tol)
        if ok:
            history.append((psi, s_new, target))
        found[float(target)] = (prob.sigma(s_new), ok, lam)
    out = np.array([found[float(r)] for r in orders])
    return out[:, 0], out[:, 1].astype(bool), out[:, 2]
