"""`meanfield density`: the density on the circle beside particles, from a TOML."""

import dataclasses
import json

import jax
import numpy as np
import pytest

import meanfield as mf
from meanfield import density
from meanfield._app.cli import main
from meanfield._app.density_report import (
    UNNORMALIZED_MAX_BETA,
    initial_density,
    resolve_config,
)

SMALL = """\
N = 128
beta = 8.0
t1 = 6.0
saves = 4
init = "smooth"
particles = 64
"""


def _toml(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def test_density_writes_the_solution_and_the_particles(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["density", "--config", _toml(tmp_path, SMALL), "--out", str(out)]
    assert main([*argv, "--seed", "2", "--no-progress"]) == 0
    assert (out / "density.png").stat().st_size > 10_000
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 2 and manifest["config"]["N"] == 128
    assert sorted(manifest["files"]) == ["density.npz", "density.png"]
    cfg = resolve_config({"N": 128, "beta": 8.0, "init": "smooth", "particles": 64})
    rho0 = initial_density(cfg, 2)
    ts = np.linspace(0, 6, 4)
    want = density.simulate(rho0, 6.0, beta=8.0, saveat=ts)
    angles = density.sample_quantiles(rho0, 64)
    with jax.enable_x64(True):
        particles = mf.simulate(
            mf.Particles(np.stack([np.cos(angles), np.sin(angles)], 1)),
            mf.SoftmaxAttention(np.eye(2), A=8.0 * np.eye(2)),
            6.0,
            saveat=ts,
            normalization="sphere",
            rtol=1e-8,
            atol=1e-8,
        )
    with np.load(out / "density.npz") as data:
        np.testing.assert_array_equal(data["rho"], want.rho)
        np.testing.assert_array_equal(data["ts"], ts)
        x = np.asarray(particles.x)
        np.testing.assert_allclose(
            data["angles"], np.mod(np.arctan2(x[..., 1], x[..., 0]), 2 * np.pi)
        )
        assert data["w1"].shape == (4,) and np.all(data["w1"] < 0.05)
    printed = capsys.readouterr().out
    assert (
        "density: N = 128, beta = 8 (softmax), sigma = 0 (critical 0.484) to t = 6"
        in printed
    )
    assert "particles: 64 tokens" in printed


# Second tier: the SDE solve's compilation beside the density's (about 4 s).
@pytest.mark.slow
def test_noisy_density_runs_beside_noisy_particles(tmp_path, capsys):
    """[noise]: the particles have the Brownian paths of the seed, W1 reported."""
    text = SMALL.replace("t1 = 6.0", "t1 = 0.5").replace("saves = 4", "saves = 3")
    text += "[noise]\nsigma = 0.5\nseed = 3\n"
    out = tmp_path / "out"
    argv = ["density", "--config", _toml(tmp_path, text), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    summary = manifest["summary"]
    assert summary["sigma"] == 0.5 and summary["particles_noise_seed"] == 3
    assert manifest["config"]["noise"] == {"sigma": 0.5, "seed": 3}
    assert "jax.random.key(3)" in manifest["config"]["particle_solver"]
    cfg = resolve_config({"N": 128, "init": "smooth"})
    ts = np.linspace(0, 0.5, 3)
    want = density.simulate_particles(
        density.sample_quantiles(initial_density(cfg, 0), 64),
        0.5,
        beta=8.0,
        sigma=0.5,
        key=jax.random.key(3),
        saveat=ts,
    )
    with np.load(out / "density.npz") as data:
        np.testing.assert_array_equal(data["angles"], density.angles(want.x))
        assert np.all(np.isfinite(data["w1"])) and data["w1"][-1] > 0
        np.testing.assert_allclose(summary["w1_max"], data["w1"].max())
    printed = capsys.readouterr().out
    assert "Brownian paths of seed 3); largest W1 to the density" in printed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("N = 4", "`N` must be an integer >= 8"),
        ("beta = -1.0", "`beta` must be positive"),
        ('attention = "l2"', "`attention` must be one of softmax, unnormalized"),
        ("perturbation = 0.0", "`perturbation` must be positive with init = 'uniform'"),
        ("perturbation = 1.5", "`perturbation` must be below 1"),
        ("noise = 0.5", "`noise`"),
        ("[noise]\nsigma = -1.0", "`noise.sigma` must be >= 0"),
        (
            'beta = 800.0\nattention = "unnormalized"',
            '`beta` must be in (0, 709.7827] with `attention` = "unnormalized"',
        ),
        ("colour = 1", "unknown key `colour`"),
    ],
)
def test_density_rejects_bad_configurations(tmp_path, capsys, text, message):
    out = tmp_path / "out"
    assert main(["density", "--config", _toml(tmp_path, text), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meanfield density: error:") and message in err
    assert not out.exists() or not any(out.iterdir())


def test_the_unnormalized_beta_limit_is_where_the_library_refuses():
    # The configuration refuses what mf.density would refuse mid-run (a traceback).
    limit = UNNORMALIZED_MAX_BETA
    over = np.nextafter(limit, np.inf)
    rho0 = np.full(8, 1 / (2 * np.pi))
    run = dict(attention="unnormalized", max_steps=2)  # the check, not the solve
    assert resolve_config({"beta": limit, "attention": "unnormalized"})["beta"] == limit
    assert density.simulate(rho0, 1e-3, beta=limit, **run).status == "success"
    with pytest.raises(ValueError, match="`beta`"):
        resolve_config({"beta": over, "attention": "unnormalized"})
    with pytest.raises(ValueError, match="`beta`"):
        density.simulate(rho0, 1e-3, beta=over, **run)
    assert resolve_config({"beta": 800.0})["beta"] == 800.0  # softmax: any beta


def test_a_density_solve_that_stops_early_is_a_status_not_a_traceback(
    tmp_path, capsys, monkeypatch
):
    # A solve that fails before t1 leaves NaN rows (e^beta near float64's limit
    # with unnormalised attention does): the run reports it and exits 0.
    solve = density.simulate

    def stops_early(*args, **kwargs):
        sol = solve(*args, **kwargs)
        ts, rho = sol.ts.copy(), sol.rho.copy()
        ts[2:], rho[2:] = np.inf, np.nan
        return dataclasses.replace(sol, ts=ts, rho=rho, status="failed")

    monkeypatch.setattr(density, "simulate", stops_early)
    out = tmp_path / "out"
    assert main(["density", "--config", _toml(tmp_path, SMALL), "--out", str(out)]) == 0
    summary = json.loads((out / "manifest.json").read_text())["summary"]
    assert summary["status"] == "failed" and summary["clusters_at_t1"] is None
    with np.load(out / "density.npz") as data:
        w1 = data["w1"]
    assert np.all(np.isfinite(w1[:2])) and np.all(np.isnan(w1[2:]))
    assert "t1 not reached" in capsys.readouterr().out


def test_initial_density_has_mass_one_and_is_nonnegative():
    for init in ("uniform", "smooth"):
        rho = initial_density(resolve_config({"init": init, "perturbation": 0.5}), 0)
        assert rho.min() >= 0
        np.testing.assert_allclose(rho.sum() * 2 * np.pi / rho.size, 1, rtol=1e-14)


SPHERE = """\
geometry = "sphere"
L = 24
beta = 4.0
t1 = 0.5
saves = 3
init = "smooth"
particles = 64
animation = true
"""


def test_density_on_the_sphere_writes_maps_animation_and_tokens(tmp_path, capsys):
    # geometry = "sphere": simulate_sphere on sphere_grid(L) from the
    # configuration's initial density, tokens drawn from it beside it.
    from meanfield._app import density_sphere

    out = tmp_path / "out"
    argv = ["density", "--config", _toml(tmp_path, SPHERE), "--out", str(out)]
    assert main([*argv, "--seed", "3", "--no-progress"]) == 0
    assert "density on S^2: L = 24" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["density.gif", "density.npz", "density.png"]
    summary = manifest["summary"]
    assert summary["status"] == "success"
    assert summary["fastest_degree"] == density.fastest_mode(4.0, d=3) == 2
    assert summary["mass_error"] < 1e-14
    cfg = resolve_config(
        {"geometry": "sphere", "L": 24, "beta": 4.0, "init": "smooth", "t1": 0.5}
    )
    rho0 = density_sphere.initial_density(cfg, 3)
    want = density.simulate_sphere(rho0, 0.5, beta=4.0, saveat=np.linspace(0, 0.5, 3))
    with np.load(out / "density.npz") as data:
        np.testing.assert_array_equal(data["rho"], want.rho)
        assert data["particles"].shape == (3, 64, 3)
        # 64 tokens from a smooth density: its first two moments to ~1/sqrt(64).
        assert np.nanmax(data["moment_gap"]) < 0.5
    # The random perturbation lives in degrees 1..L/2: the band's top is empty.
    grid = density.sphere_grid(24)
    bumps = np.exp(2 * np.asarray(grid.nodes)[:, 2]) + np.exp(
        3 * np.asarray(grid.nodes)[:, 0]
    )
    ratio = rho0.reshape(-1) / bumps
    coeffs = grid.coefficients((ratio / ratio.mean()).reshape(grid.shape))
    assert np.abs(coeffs[13:]).max() < 1e-12


def test_sphere_band_limit_too_small_for_beta_is_a_one_line_error(tmp_path, capsys):
    text = SPHERE.replace("beta = 4.0", "beta = 60.0")
    argv = ["density", "--config", _toml(tmp_path, text), "--out", str(tmp_path / "o")]
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "`L`" in err[0]
