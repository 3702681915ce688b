"""The interaction energy, merging of weighted atoms, and merged long runs.

Geshkovski, Koubbi, Polyanskiy & Rigollet ("Dynamic metastability in the
self-attention model", 2024) and Bruno, Pasqualotto & Agazzi (ICLR 2025): on the
circle with A = beta I, V = I the tokens form clusters that merge on time scales
growing like e^{c beta}, and the energy 1/(2 beta) sum_ij w_i w_j e^{beta <x_i, x_j>}
climbs a staircase, one step per merge.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import softmax_velocity_numpy
from scipy.integrate import quad

import meanfield as mf
from meanfield.clustering import energy, merge, simulate_merging


def _circle(n, seed=0):
    theta = np.random.default_rng(seed).uniform(0, 2 * np.pi, n)
    return np.stack([np.cos(theta), np.sin(theta)], 1)


def _naive_energy(x, w, beta):
    total = 0.0
    for i in range(len(x)):
        for j in range(len(x)):
            total += w[i] * w[j] * np.exp(beta * (x[i] @ x[j]))
    return total / (2 * beta)


def test_energy_matches_a_double_loop():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(7, 3))
    w = rng.uniform(size=7)
    w /= w.sum()
    got = energy(mf.Particles(x, w), 1.7)
    np.testing.assert_allclose(float(got), _naive_energy(x, w, 1.7), rtol=1e-13)
    log = energy(mf.Particles(x, w), 1.7, log=True)
    np.testing.assert_allclose(float(log), np.log(_naive_energy(x, w, 1.7)), rtol=1e-13)


def test_log_energy_stays_finite_where_the_energy_overflows():
    x = _circle(5)
    log = float(energy(mf.Particles(x), 2000.0, log=True))
    # On the sphere e^{beta <x_i, x_j>} <= e^beta, with equality on the diagonal.
    assert np.isfinite(log)
    assert 2000 + np.log(1 / 5 / 4000) - 1e-9 <= log <= 2000 - np.log(4000) + 1e-9
    assert np.isinf(float(energy(mf.Particles(x), 2000.0)))


@pytest.mark.parametrize("family", ["softmax", "unnormalized"])
def test_energy_never_decreases_along_sphere_dynamics(family):
    beta = 3.0
    cls = mf.SoftmaxAttention if family == "softmax" else mf.UnnormalizedAttention
    attn = cls(np.eye(3), A=beta * np.eye(3))
    x = np.random.default_rng(2).normal(size=(16, 3))
    ts = np.linspace(0, 6, 61)
    sol = mf.simulate(
        mf.Particles(x),
        attn,
        6.0,
        saveat=ts,
        normalization="sphere",
        rtol=1e-10,
        atol=1e-10,
    )
    e = np.asarray(energy(sol, beta))
    assert sol.status == "success"
    # E' >= 0 exactly; the solve is accurate to rtol = 1e-10 relative, so a
    # decrease beyond 1e-9 E would be the dynamics', not the solver's.
    assert np.all(np.diff(e) >= -1e-9 * e[:-1]), np.diff(e).min()
    assert e[-1] > 1.1 * e[0]  # it grows, it does not just stay
    np.testing.assert_allclose(e[3], float(energy(sol.measure(3), beta)), rtol=1e-14)


def test_energy_is_nan_at_unreached_save_times():
    attn = mf.UnnormalizedAttention(np.eye(2), A=np.eye(2))
    x = np.array([[1.0, 0.0], [0.9, 0.1]])
    sol = mf.simulate(
        mf.Particles(x), attn, 10.0, saveat=np.linspace(0, 10, 11), blowup_radius=1e3
    )
    e = np.asarray(energy(sol, 1.0))
    assert sol.status == "blowup"
    reached = np.asarray(sol.reached)
    assert not reached.all() and np.all(np.isfinite(e[reached]))
    assert np.all(np.isnan(e[~reached]))


def test_energy_rejects_bad_arguments():
    with pytest.raises(ValueError, match="`beta`"):
        energy(mf.Particles(_circle(3)), 0.0)
    with pytest.raises(ValueError, match="`state`"):
        energy(np.ones((3, 2)), 1.0)


def _velocity_at(measure, probe):
    """Gamma_mu at the probe points, from the naive double loop."""
    return softmax_velocity_numpy(
        np.asarray(probe.x),
        np.asarray(measure.x),
        np.asarray(measure.weights),
        np.eye(2),
        A=4.0 * np.eye(2),
    )


def test_merging_coincident_atoms_leaves_the_field_unchanged():
    base = _circle(5, seed=3)
    x = np.concatenate([base, base[[0, 0, 2]]])  # atoms 0 (x3) and 2 (x2) repeat
    w = np.random.default_rng(4).uniform(size=8)
    w /= w.sum()
    mu = mf.Particles(x, w)
    merged, labels = merge(mu, 1e-9)
    assert merged.n == 5
    np.testing.assert_array_equal(labels, [0, 1, 2, 3, 4, 0, 0, 2])
    np.testing.assert_allclose(
        np.asarray(merged.weights)[[0, 2]], [w[[0, 5, 6]].sum(), w[[2, 7]].sum()]
    )
    probe = mf.Particles(_circle(9, seed=5))
    np.testing.assert_allclose(
        _velocity_at(merged, probe), _velocity_at(mu, probe), atol=1e-15
    )


def test_merging_close_atoms_changes_the_field_to_second_order():
    base = _circle(4, seed=6)
    probe = mf.Particles(_circle(9, seed=7))
    tangent = np.array([-base[0, 1], base[0, 0]])
    errors = []
    for delta in (1e-2, 5e-3, 2.5e-3):
        pair = np.stack([base[0] + delta * tangent, base[0] - 0.5 * delta * tangent])
        pair /= np.linalg.norm(pair, axis=1, keepdims=True)
        mu = mf.Particles(np.concatenate([pair, base[1:]]), [0.2, 0.3, 0.1, 0.2, 0.2])
        merged, _ = merge(mu, 2 * delta)
        assert merged.n == 4
        np.testing.assert_allclose(np.linalg.norm(merged.x, axis=1), 1, rtol=1e-15)
        errors.append(
            np.abs(_velocity_at(merged, probe) - _velocity_at(mu, probe)).max()
        )
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    np.testing.assert_allclose(ratios, 4, rtol=0.05)  # O(delta^2): halving -> /4


def test_merge_projects_on_the_sphere_only_when_the_tokens_live_there():
    x = np.array([[1.0, 0.0], [np.cos(0.1), np.sin(0.1)], [-1.0, 0.0]])
    on, _ = merge(mf.Particles(x), 0.2)
    np.testing.assert_allclose(np.linalg.norm(on.x, axis=1), 1, rtol=1e-15)
    off, _ = merge(mf.Particles(2 * x), 0.5)
    np.testing.assert_allclose(off.x[0], x[:2].mean(0) * 2, rtol=1e-15)
    forced, _ = merge(mf.Particles(2 * x), 0.5, sphere=True)
    np.testing.assert_allclose(np.linalg.norm(forced.x, axis=1), 1, rtol=1e-15)


def test_a_balanced_cluster_on_the_sphere_keeps_its_heaviest_atom():
    # Antipodal atoms of equal weight: the weighted mean is 0, no direction.
    x = np.array([[0.0, 1.0], [0.0, -1.0]])
    merged, labels = merge(mf.Particles(x), 2.0)
    np.testing.assert_array_equal(labels, [0, 0])
    np.testing.assert_array_equal(merged.x, [[0.0, 1.0]])  # the first of equals
    np.testing.assert_array_equal(merged.weights, [1.0])
    # Unequal weights: the mean (w_1 - w_2) x_2 points along the heavier atom,
    # so the rule is the limit of the mean's direction.
    heavier, _ = merge(mf.Particles(x, [0.4, 0.6]), 2.0)
    np.testing.assert_array_equal(heavier.x, [[0.0, -1.0]])
    # Three equal atoms at 120 degrees: the mean is 0 to rounding (1e-16).
    angles = np.array([0.5, 0.5 + 2 * np.pi / 3, 0.5 + 4 * np.pi / 3])
    ring = np.stack([np.cos(angles), np.sin(angles)], 1)
    merged, _ = merge(mf.Particles(ring[[1, 0, 2]]), 1.8)
    np.testing.assert_allclose(merged.x, ring[[1]], rtol=0, atol=1e-15)
    # And a run that starts by merging them does not fail.
    attn = mf.SoftmaxAttention(np.eye(2), A=2 * np.eye(2))
    run = simulate_merging(
        mf.Particles(x),
        attn,
        1.0,
        merge_tol=2.0,
        saveat=[0.0, 1.0],
        normalization="sphere",
    )
    assert run.status == "success" and np.all(run.counts == 1)
    np.testing.assert_array_equal(run.x[:, 0], [[0.0, 1.0], [0.0, 1.0]])


def test_a_merged_atom_within_tol_of_another_merges_with_it():
    # On S^2: A and B within tol, C just beyond tol of both; the mean of A and
    # B is 0.87 tol from C. The event of the next solve fires only when a
    # distance falls through tol: C used to stay apart for the whole run.
    tangent = np.array([[-0.05, 0.0], [0.05, 0.0], [0.0, 0.0875]])
    x = np.concatenate([tangent, np.ones((3, 1))], 1)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    tol = 0.5 * (d[0, 1] + min(d[0, 2], d[1, 2]))
    assert d[0, 1] < tol < min(d[0, 2], d[1, 2])
    attn = mf.SoftmaxAttention(np.eye(3), A=np.eye(3))
    run = simulate_merging(
        mf.Particles(x), attn, 1e-3, merge_tol=tol, saveat=[0.0, 1e-3]
    )
    assert run.status == "success"
    np.testing.assert_array_equal(run.counts, [1, 1])


def test_merge_rejects_masked_particles_and_bad_tolerances():
    x = _circle(3)
    with pytest.raises(ValueError, match="unmasked"):
        merge(mf.MaskedParticles(x, np.linspace(0, 1, 3)), 0.1)
    with pytest.raises(ValueError, match="`tol`"):
        merge(mf.Particles(x), -1.0)


def _match(centres_a, masses_a, centres_b, masses_b):
    """Masses and centres of two cluster lists, paired by nearest centre."""
    order = [int(np.argmin(np.linalg.norm(centres_b - c, axis=1))) for c in centres_a]
    assert sorted(order) == list(range(len(centres_b)))
    return (
        np.abs(masses_a - masses_b[order]).max(),
        np.abs(centres_a - centres_b[order]).max(),
    )


def test_a_merged_run_matches_the_unmerged_run():
    beta, n, t1 = 9.0, 12, 30.0
    attn = mf.SoftmaxAttention(np.eye(2), A=beta * np.eye(2))
    mu = mf.Particles(_circle(n, seed=8))
    ts = np.linspace(0, t1, 16)
    full = mf.simulate(
        mu, attn, t1, saveat=ts, normalization="sphere", rtol=1e-11, atol=1e-11
    )
    merged = simulate_merging(
        mu,
        attn,
        t1,
        merge_tol=1e-6,
        saveat=ts,
        normalization="sphere",
        rtol=1e-11,
        atol=1e-11,
    )
    assert merged.status == "success"
    assert merged.counts[0] == n and np.all(np.diff(merged.counts) <= 0)
    assert merged.counts[-1] < n  # merges happened
    end = mf.clustering.detect(np.asarray(full.x[-1]), 1e-3)
    assert end.number == merged.counts[-1]
    last = merged.measure(-1)
    dm, dx = _match(
        end.centres, end.masses, np.asarray(last.x), np.asarray(last.weights)
    )
    assert dm < 1e-15
    # Merges perturb the field by O(tol^2) = 1e-10 (the unmerged clusters are
    # 2e-9 wide at t1).
    assert dx < 1e-8, dx
    np.testing.assert_allclose(merged.energy, np.asarray(energy(full, beta)), rtol=1e-8)


def _two_token_merge_time(beta, phi0, tol):
    """Time for two equal tokens phi0 apart on S^1 (softmax, A = beta I, V = I)
    to come |x_1 - x_2| = tol apart, by quadrature.

    Token 1 moves along P^perp_{x_1} of the mean of x_1, x_2 with weights e^beta,
    e^{beta cos phi}: theta_1' = sin(phi) / (1 + e^{beta (1 - cos phi)}), token 2
    the mirror image, so phi' = -2 sin(phi) / (1 + e^{beta (1 - cos phi)}).
    """
    phi_end = 2 * np.arcsin(tol / 2)
    rate = lambda p: (1 + np.exp(beta * (1 - np.cos(p)))) / (2 * np.sin(p))
    value, error = quad(rate, phi_end, phi0, epsabs=0, epsrel=1e-13, limit=200)
    assert error < 1e-12 * value
    return value


@pytest.mark.parametrize("beta, phi0, tol", [(4.0, 1.5, 1e-3), (1.0, 2.5, 1e-4)])
def test_merge_time_of_two_tokens_matches_quadrature(beta, phi0, tol):
    want = _two_token_merge_time(beta, phi0, tol)
    x = np.stack([np.cos([0.0, phi0]), np.sin([0.0, phi0])], 1)
    attn = mf.SoftmaxAttention(np.eye(2), A=beta * np.eye(2))
    run = simulate_merging(
        mf.Particles(x),
        attn,
        2 * want,
        merge_tol=tol,
        saveat=[0.0, 2 * want],
        normalization="sphere",
        rtol=1e-12,
        atol=1e-12,
    )
    assert run.status == "success" and run.counts[-1] == 1
    assert run.merge_times.shape == (1,)
    # Near the merge phi' ~ -phi, so a relative error e of phi is a time error
    # e: Tsit5's global error at rtol 1e-12 over ~300 steps is ~1e-10 (measured
    # 7e-12 and 4e-11). An event left at the end of its step is ~1e-2 late.
    np.testing.assert_allclose(run.merge_times[0], want, rtol=1e-9)
    # By symmetry the merged atom sits at the pair's midpoint angle.
    angle = np.arctan2(run.x[-1, 0, 1], run.x[-1, 0, 0])
    np.testing.assert_allclose(angle, phi0 / 2, atol=1e-14)


def test_two_tokens_merge_at_3e15_as_quadrature_says():
    """beta = 500 unnormalised, V = e^{-beta} / n (`log_scale`): the tokens'
    own radial terms are e^{35} times their mutual pull, and the merge comes at
    t = 3.7e15, where float64's ulp of t is 0.5 and the final approach takes
    steps of order 1. Projecting the field lost the pull (max_steps); a step
    floor of 100 ulps of t stopped the approach (failed)."""
    beta, phi0, tol = 500.0, 0.4, 1e-4
    # Each token moves by P^perp of (1/4) e^{beta (cos phi - 1)} x_other:
    # phi' = -(1/2) e^{beta (cos phi - 1)} sin phi.
    rate = lambda p: 2 * np.exp(beta * (1 - np.cos(p))) / np.sin(p)
    # The integrand spans e^{40}: quadrature on pieces.
    edges = np.linspace(2 * np.arcsin(tol / 2), phi0, 41)
    want = sum(
        quad(rate, a, b, epsabs=0, epsrel=1e-13)[0]
        for a, b in zip(edges[:-1], edges[1:], strict=True)
    )
    assert 3e15 < want < 4e15
    x = np.stack([np.cos([0.0, phi0]), np.sin([0.0, phi0])], 1)
    attn = mf.UnnormalizedAttention(
        np.eye(2), A=beta * np.eye(2), log_scale=-beta - np.log(2)
    )
    run = simulate_merging(
        mf.Particles(x),
        attn,
        2 * want,
        merge_tol=tol,
        saveat=[0.0, 2 * want],
        normalization="sphere",
        rtol=1e-10,
        atol=1e-10,
    )
    assert run.status == "success" and run.counts[-1] == 1
    # T ~ e^{beta (1 - cos phi0)}: an error e in phi moves log T by
    # beta sin(phi0) e ~ 200 e, and the solve's e is ~1e-10 (measured 1.6e-8).
    np.testing.assert_allclose(run.merge_times, [want], rtol=1e-6)


@pytest.mark.slow
def test_five_tokens_at_beta_500_merge_down_to_one_atom():
    """The metastable staircase past float64's step resolution: four merges,
    the last at t ~ 7e18, energy non-decreasing to rounding."""
    beta, n = 500.0, 5
    theta = 0.55 * np.array([0.0, 0.25, 0.55, 0.9, 1.3])
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    attn = mf.UnnormalizedAttention(
        np.eye(2), A=beta * np.eye(2), log_scale=-beta - np.log(n)
    )
    ts = np.concatenate([[0.0], np.logspace(-2, 20, 45)])
    run = simulate_merging(
        mf.Particles(x),
        attn,
        ts[-1],
        merge_tol=1e-4,
        saveat=ts,
        normalization="sphere",
        beta=beta,
    )
    assert run.status == "success" and run.counts[-1] == 1
    assert run.merge_times.size == 4 and run.merge_times[-1] > 1e18
    assert np.all(np.diff(run.merge_times) > 0)
    # log E ~ 500: its ulp is 1e-13.
    assert np.all(np.diff(run.log_energy) >= -1e-12)


@pytest.mark.slow
def test_koubbi_five_tokens_reach_one_atom_at_3e15():
    """The 5-token staircase of Geshkovski, Koubbi, Polyanskiy & Rigollet
    (*Dynamic metastability in the self-attention model*, 2024; their script's
    initial angles 0.5 (0, 0.5, 2, 4, 7) log(2000) / sqrt(2000)) at beta = 500,
    unnormalised with V = e^{-beta} / n: the last merge at tau = 3.15e15, the
    value an independent Radau + quadrature solve gives (to its 3 digits)."""
    beta, n = 500.0, 5
    unit = np.log(2000.0) / np.sqrt(2000.0)
    theta = 0.5 * np.array([0.0, 0.5, 2.0, 4.0, 7.0]) * unit
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    attn = mf.UnnormalizedAttention(
        np.eye(2), A=beta * np.eye(2), log_scale=-beta - np.log(n)
    )
    ts = np.concatenate([[0.0], np.logspace(-2, 20, 45)])
    run = simulate_merging(
        mf.Particles(x),
        attn,
        ts[-1],
        merge_tol=1e-4,
        saveat=ts,
        normalization="sphere",
        beta=beta,
    )
    assert run.status == "success" and run.counts[-1] == 1
    assert run.merge_times.size == 4 and np.all(np.diff(run.merge_times) > 0)
    # The reference's 3 digits: +-0.5 of the last one.
    np.testing.assert_allclose(run.merge_times[-1], 3.15e15, rtol=0.005 / 3.15)


def test_simulate_merging_checks_its_arguments():
    attn = mf.SoftmaxAttention(np.eye(2), A=np.eye(2))
    mu = mf.Particles(_circle(4))
    ts = np.linspace(0, 1, 3)
    with pytest.raises(ValueError, match="`merge_tol`"):
        simulate_merging(mu, attn, 1.0, merge_tol=0.0, saveat=ts)
    with pytest.raises(ValueError, match="`saveat`"):
        simulate_merging(mu, attn, 2.0, merge_tol=1e-4, saveat=ts)
    with pytest.raises(ValueError, match="adaptive"):
        simulate_merging(mu, attn, 1.0, merge_tol=1e-4, saveat=ts, solver="euler")
    # An infinite horizon has no solve (saveat ending at inf is increasing).
    with pytest.raises(ValueError, match="`t1` must be a finite time; got inf"):
        simulate_merging(mu, attn, np.inf, merge_tol=1e-4, saveat=[0.0, 1.0, np.inf])
    with pytest.raises(ValueError, match="unmasked"):
        simulate_merging(
            mf.MaskedParticles(_circle(4), np.linspace(0, 1, 4)),
            attn,
            1.0,
            merge_tol=1e-4,
            saveat=ts,
        )


@pytest.mark.slow
def test_the_energy_staircase_on_the_circle():
    """n = 32, beta = 16: 5 and 4 clusters briefly, then plateaus at 3 and 2
    clusters over decades of time, then one, by t ~ 1e11."""
    beta = 16.0
    attn = mf.SoftmaxAttention(np.eye(2), A=beta * np.eye(2))
    ts = np.concatenate([[0.0], np.logspace(-2, 14, 161)])
    run = simulate_merging(
        mf.Particles(_circle(32)),
        attn,
        ts[-1],
        merge_tol=1e-4,
        saveat=ts,
        normalization="sphere",
    )
    assert run.status == "success"
    assert np.all(np.diff(run.counts) <= 0) and run.counts[-1] == 1
    assert np.all(np.diff(run.log_energy) >= -1e-9)
    # Plateaus: atom counts held over at least a decade of time each.
    late = ts > 10
    plateaus = [
        k
        for k in np.unique(run.counts[late])
        if np.ptp(np.log10(ts[late][run.counts[late] == k])) >= 1
    ]
    assert len(plateaus) >= 3 and max(plateaus) >= 3, plateaus
    # One cluster holds all the mass at energy e^beta / (2 beta).
    np.testing.assert_allclose(run.log_energy[-1], beta - np.log(2 * beta), rtol=1e-12)


@pytest.mark.slow
def test_simulate_merging_runs_in_float64_from_float32_tokens():
    """float32 time cannot resolve a merge at t ~ 1e6 (ulp 0.06): float64 inside."""
    beta = 9.0
    # Two tokens 2.2 rad apart merge after t ~ e^{beta (1 - cos 2.2)} ~ 1e6.
    angles = np.array([0.0, 2.2])
    x = jnp.asarray(np.stack([np.cos(angles), np.sin(angles)], 1), jnp.float32)
    attn = mf.SoftmaxAttention(jnp.eye(2, dtype=jnp.float32), A=beta * jnp.eye(2))
    ts = np.concatenate([[0.0], np.logspace(-1, 9, 11)])
    run = simulate_merging(
        mf.Particles(x),
        attn,
        ts[-1],
        merge_tol=1e-4,
        saveat=ts,
        normalization="sphere",
    )
    assert run.status == "success" and run.counts[-1] == 1
    assert run.x.dtype == np.float64


@pytest.mark.slow
def test_simulate_merging_follows_each_normalization_as_simulate_does():
    """Without merges (a tolerance far below the tokens' distances) the run is
    `mf.simulate`'s: nGPT included, whose step scale alpha must reach the field."""
    x = np.random.default_rng(10).normal(size=(6, 3))
    attn = mf.SoftmaxAttention(np.eye(3), A=2 * np.eye(3))
    ts = np.linspace(0, 3, 4)
    for normalization in ("ngpt", "pre-ln"):
        run = simulate_merging(
            mf.Particles(x),
            attn,
            3.0,
            merge_tol=1e-9,
            saveat=ts,
            normalization=normalization,
            rtol=1e-11,
            atol=1e-11,
        )
        want = mf.simulate(
            mf.Particles(x),
            attn,
            3.0,
            saveat=ts,
            normalization=normalization,
            rtol=1e-11,
            atol=1e-11,
        )
        assert run.status == "success" and np.all(run.counts == 6)
        # Two solves of the same ODE on different clocks: within their tolerance.
        np.testing.assert_allclose(run.x, np.asarray(want.x), atol=1e-8)
