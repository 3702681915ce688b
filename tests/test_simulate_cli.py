"""`meanfield simulate`: configuration, outputs, checkpoints and --resume."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield._app import simulate_segments as _segments
from meanfield._app.cli import main
from meanfield._app.simulate_config import resolve_config

# Tiny runs: n = 12 tokens, 9 save times in 4 segments.
SPHERE = 'n = 12\nd = 3\nt1 = 4.0\nsaves = 9\nsegments = 4\nanimation = "gif"\n'
RD = (
    'n = 12\nd = 2\nt1 = 3.0\nsaves = 9\nsegments = 4\nnormalization = "none"\n'
    'animation = "none"\ndtype = "float64"\n[attention]\nV = 1.0\nA = [[1.0, 0.2], '
    "[0.2, 0.5]]\n"
)

# Independent noise on S^2, adaptive Heun (the default with noise), 2 segments.
NOISY = (
    'n = 8\nd = 3\nt1 = 1.0\nsaves = 5\nsegments = 2\nanimation = "none"\n'
    'dtype = "float64"\n[noise]\nkind = "independent"\nsigma = 0.5\nseed = 4\n'
)


def _run(tmp_path, name, text, *extra):
    config = tmp_path / f"{name}.toml"
    config.write_text(text)
    out = tmp_path / name
    args = ["simulate", "--config", str(config), "--out", str(out), "--no-progress"]
    return main([*args, *extra]), out


def test_sphere_run_writes_manifest_figures_animation_and_arrays(tmp_path, capsys):
    code, out = _run(tmp_path, "sphere", SPHERE, "--seed", "5")
    assert code == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # --no-progress: no bars
    printed = captured.out
    assert "status success" in printed and "cluster(s)" in printed
    for name in ["trajectories.png", "clusters.png"]:
        assert (out / name).stat().st_size > 10_000, name
    from PIL import Image

    with Image.open(out / "tokens.gif") as gif:
        assert gif.n_frames == 9
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 5
    # Defaults are resolved into the manifest, not left implicit.
    assert manifest["config"]["attention"]["kind"] == "softmax"
    assert manifest["config"]["rtol"] == 1e-6
    assert {"jax", "diffrax", "python"} <= set(manifest["versions"])
    assert manifest["device"]["platform"] == "cpu" and manifest["wall_time_s"] > 0
    summary = manifest["summary"]
    assert summary["status"] == "success" and summary["num_steps"] > 0
    assert "order_parameter" not in summary  # noise-free: the clusters are sharp
    with np.load(out / "trajectory.npz") as data:
        x, ts = data["x"], data["ts"]
        np.testing.assert_allclose(ts, np.linspace(0, 4, 9), rtol=1e-6)
        assert x.shape == (9, 12, 3)
        np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1, atol=1e-5)
        assert data["cluster_counts"][-1] == summary["clusters_final"]
    assert not list(out.glob(".*tmp*")), "temporary files left behind"


def test_progress_bars_go_to_stderr(tmp_path, capsys):
    # The configuration of the test above: its compiled solves are reused.
    config = tmp_path / "sphere.toml"
    config.write_text(SPHERE)
    out = tmp_path / "sphere"
    assert main(["simulate", "--config", str(config), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    err = captured.err
    assert "simulate: 100%" in err and "4/4" in err and "segment" in err
    assert "drawing figures\n" in err
    assert "frames: 100%" in err and "9/9" in err  # the animation's bar
    assert "status success" in captured.out and "segment" not in captured.out


def test_resume_after_an_interruption_gives_the_uninterrupted_result(
    tmp_path, monkeypatch, capsys
):
    code, full = _run(tmp_path, "full", RD)
    assert code == 0
    summary = json.loads((full / "manifest.json").read_text())["summary"]
    # V = I, A positive definite: the rescaled limits sit on a polytope.
    assert summary["polytope"]["clusters_on_boundary"] == summary["clusters_final"]
    assert (full / "radius.png").exists()

    calls = []
    solve = _segments.simulate

    def interrupted(*args, **kwargs):
        calls.append(kwargs["t0"])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return solve(*args, **kwargs)

    monkeypatch.setattr(_segments, "simulate", interrupted)
    code, part = _run(tmp_path, "part", RD)
    assert code == 130
    assert "--resume" in capsys.readouterr().err
    with np.load(part / _segments.CHECKPOINT) as data:
        assert int(data["segment"]) == 2
    assert not (part / "manifest.json").exists()

    monkeypatch.setattr(_segments, "simulate", solve)
    code, part = _run(tmp_path, "part", RD, "--resume")
    assert code == 0
    assert "resumed from segment 2" in capsys.readouterr().out
    with np.load(full / "trajectory.npz") as a, np.load(part / "trajectory.npz") as b:
        # The same solves in the same order: bit for bit equal.
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["ts"], b["ts"])
        np.testing.assert_array_equal(a["cluster_counts"], b["cluster_counts"])


def test_resume_with_another_configuration_exits_2(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text(RD)
    out = tmp_path / "run"
    out.mkdir()
    ckpt = _segments._Checkpoint(
        1, np.zeros(1), np.zeros((1, 12, 2)), 0, np.inf, 3, '{"config": {}, "seed": 0}'
    )
    ckpt.save(out / _segments.CHECKPOINT)
    args = ["simulate", "--config", str(config), "--out", str(out), "--resume"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was written by another run" in err[0]


def test_blowup_is_reported_and_plotted(tmp_path, capsys):
    text = RD.replace("V = 1.0\n", 'V = 1.0\nkind = "unnormalized"\n').replace(
        "t1 = 3.0", "t1 = 8.0"
    )
    code, out = _run(tmp_path, "blow", text.replace("n = 12", "n = 6"))
    assert code == 0
    assert "blow-up detected at t*" in capsys.readouterr().out
    summary = json.loads((out / "manifest.json").read_text())["summary"]
    assert summary["status"] == "blowup" and summary["blowup_time"] < 8
    with np.load(out / "trajectory.npz") as data:
        assert np.isinf(data["ts"][-1]) and not np.isnan(data["x"]).any()
    assert (out / "radius.png").exists()


@pytest.mark.parametrize(
    "text, key",
    [
        ("speed = 3\n", "`speed`"),
        ('n = "many"\n', "`n`"),
        ("n = 1\n", "`n`"),
        ('initial = "torus"\n', "`initial`"),
        ("segments = 50\nsaves = 10\n", "`segments`"),
        ('[attention]\nkind = "cosine"\n', "`attention.kind`"),
        ("[attention]\nV = [[1.0, 0.0]]\n", "`attention.V`"),
        ("[attention]\nQ = 1.0\n", "`attention.Q`"),
        ("[attention]\ntemperature = 2\n", "`attention.temperature`"),
        ('masked = true\n[attention]\nkind = "sinkhorn"\n', "`attention.kind`"),
        ('normalization = "pre-ln"\n[noise]\nkind = "common"\n', "`noise.kind`"),
        ("[noise]\nsigma = 0.5\n", "`noise.sigma`"),
        ('[noise]\nkind = "independent"\nsigma = -0.5\n', "`noise.sigma`"),
        ('[noise]\nkind = "brownian"\n', "`noise.kind`"),
        ('[noise]\nkind = "common"\nseed = -1\n', "`noise.seed`"),
        ('solver = "tsit5"\n[noise]\nkind = "common"\n', "`solver`"),
        ('solver = "euler_heun"\n[noise]\nkind = "common"\n', "`solver`"),
    ],
)
def test_bad_config_exits_2_with_one_line_naming_the_key(tmp_path, capsys, text, key):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    code = main(["simulate", "--config", str(config), "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("meanfield simulate: error:")
    assert key in err[0]
    assert not (tmp_path / "o").exists()


def test_sigma_beyond_the_dtype_exits_2_naming_the_key_and_the_limit(tmp_path, capsys):
    # 1e300 is inf in float32: refused with the configuration, not a traceback
    # from the noise's constructor once the run has started.
    config = tmp_path / "bad.toml"
    noise = '[noise]\nkind = "independent"\nsigma = 1e300\n'
    config.write_text('dtype = "float32"\n' + noise)
    code = main(["simulate", "--config", str(config), "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("meanfield simulate: error:")
    assert "`noise.sigma` must be <= 3.40282e+38, the largest float32" in err[0]
    assert not (tmp_path / "o").exists()
    # float64 holds it; the largest float32 is a float32.
    big = {"kind": "independent", "sigma": 1e300}
    assert resolve_config({"dtype": "float64", "noise": big})["noise"] == {
        **big,
        "seed": 0,
    }
    largest = float(np.finfo(np.float32).max)
    cfg = resolve_config({"noise": {"kind": "common", "sigma": largest}})
    assert cfg["noise"]["sigma"] == largest
    # `meanfield phase` resolves its dtype after [noise]: the same check.
    from meanfield._app.phase_report import resolve_config as resolve_phase

    with pytest.raises(ValueError, match="`noise.sigma` must be <= 3.40282e"):
        resolve_phase({"dtype": "float32", "noise": big})
    assert resolve_phase({"noise": big})["dtype"] == "float64"  # noisy default


def test_directory_in_use_exits_2_naming_it(tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / ".meanfield.lock").write_text(f"{os.getppid()}\n")  # a live process
    config = tmp_path / "run.toml"
    config.write_text(RD)
    assert main(["simulate", "--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{str(out)!r} is in use by another run" in err[0]
    assert sorted(p.name for p in out.iterdir()) == [".meanfield.lock"]


def test_truncated_checkpoint_and_missing_ffmpeg_exit_2_before_the_run(
    tmp_path, capsys, monkeypatch
):
    config = tmp_path / "run.toml"
    config.write_text(RD)
    out = tmp_path / "run"
    out.mkdir()
    (out / _segments.CHECKPOINT).write_bytes(b"PK\x03\x04 truncated")
    args = ["simulate", "--config", str(config), "--out", str(out), "--resume"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read checkpoint" in err[0]
    monkeypatch.setattr(shutil, "which", lambda name: None)
    config.write_text(RD.replace('animation = "none"', 'animation = "mp4"'))
    assert (
        main(["simulate", "--config", str(config), "--out", str(tmp_path / "m")]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs ffmpeg" in err[0]
    assert not (tmp_path / "m").exists()


def test_interrupt_in_the_first_segment_says_there_is_no_checkpoint(
    tmp_path, monkeypatch, capsys
):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_segments, "simulate", interrupted)
    code, out = _run(tmp_path, "first", RD)
    assert code == 130
    err = capsys.readouterr().err
    assert "no segment had finished" in err and "--resume" not in err
    assert not (out / _segments.CHECKPOINT).exists()
    assert not (out / ".meanfield.lock").exists()  # released


def test_fresh_run_replaces_an_older_run_and_resume_says_when_it_starts_afresh(
    tmp_path, capsys
):
    out = tmp_path / "again"
    out.mkdir()
    (out / "stale.png").write_text("old figure")
    (out / "manifest.json").write_text(
        json.dumps({"written_by": "meanfield", "files": ["stale.png"]})
    )
    config = tmp_path / "again.toml"
    config.write_text(RD)
    # --resume without a checkpoint: a word, then a fresh run.
    argv = ["simulate", "--config", str(config), "--out", str(out), "--resume"]
    assert main(argv) == 0
    assert "starting from the beginning" in capsys.readouterr().err
    assert not (out / "stale.png").exists()
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert {"trajectory.npz", "trajectories.png", "clusters.png"} <= set(files)
    assert all((out / name).exists() for name in files)


def test_resume_without_a_checkpoint_says_so_even_without_progress(tmp_path, capsys):
    code, out = _run(tmp_path, "quiet", RD, "--resume")  # with --no-progress
    assert code == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"--resume: no checkpoint.npz in {out}/: starting from the beginning"
    ]


def _interrupt(tmp_path, delay, n=1000):
    """Run the real executable; SIGINT `delay` s after its first segment starts."""
    config = tmp_path / "big.toml"
    config.write_text(
        f'n = {n}\nd = 3\nt1 = 50.0\nsaves = 11\nsegments = 10\nanimation = "none"\n'
    )
    out = tmp_path / f"out{delay}"
    exe = Path(sys.executable).with_name("meanfield")
    # The installed `meanfield` script, with Python's own Ctrl-C handler even
    # where the test runner was started with SIGINT ignored (which children
    # inherit).
    start = (
        "import runpy, signal, sys; "
        "signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.argv = [{str(exe)!r}, *sys.argv[1:]]; "
        f"runpy.run_path({str(exe)!r}, run_name='__main__')"
    )
    argv = ["simulate", "--config", str(config), "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-c", start, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = ""
    while "simulate:" not in seen:  # the segments' bar: the first solve starts
        char = proc.stderr.read(1)
        assert char, f"exited early: {seen}"
        seen += char
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err, out


def test_ctrl_c_of_the_command_exits_130_with_a_true_message(tmp_path):
    # Interrupted as its first segment starts. Python sees the signal only when
    # the running XLA call returns, so the first segment may or may not have
    # finished by then: the message must say which, truthfully.
    code, err, out = _interrupt(tmp_path, 0.0)
    assert code == 130, (code, err)
    if (out / "checkpoint.npz").exists():
        assert "checkpoint.npz: rerun with --resume" in err
    else:
        assert "meanfield simulate: interrupted; no segment had finished" in err
    assert not (out / ".meanfield.lock").exists()


# Second tier: three interrupts (about 25 s).
@pytest.mark.slow
def test_ctrl_c_while_xla_runs_does_not_crash(tmp_path):
    # Interrupted while XLA's threads ran the first solve, the interpreter's
    # teardown crashed (SIGSEGV, exit 139; seen at 7 s with n = 2000).
    for delay in (3.0, 5.0, 7.0):
        code, err, _ = _interrupt(tmp_path, delay, n=2000)
        assert code == 130, (delay, code, err)
        assert "meanfield simulate: interrupted" in err


def test_summary_puts_the_saved_radius_after_the_blowup_and_dates_it():
    from meanfield._app.simulate_report import format_summary

    summary = dict(
        status="blowup",
        t_final=0.35,
        num_steps=40,
        resumed_from_segment=None,
        clusters_final=3,
        clustered="z = e^{-tV} x",
        cluster_tol=0.1,
        cluster_tol_method="gap",
        cluster_sizes=[5, 2, 1],
        radius_final=1.2e4,
        radius_time=0.3,
        blowup_time=0.35,
        blowup_radius=1e8,
    )
    lines = format_summary(summary).splitlines()
    blowup = next(i for i, line in enumerate(lines) if "blow-up detected" in line)
    assert "at the last save before it, t = 0.3: 1.2e+04" in lines[blowup + 1]
    assert not any("radius" in line for line in lines[:blowup])


def test_titles_name_the_family_and_the_causal_mask():
    from meanfield._app.simulate_report import run_label

    cfg = dict(n=64, d=3, normalization="none", masked=True, attention={"kind": "l2"})
    assert run_label(cfg) == "l2, causal mask, n = 64 on R^3"
    cfg.update(masked=False, normalization="sphere", attention={"kind": "softmax"})
    assert run_label(cfg) == "softmax, n = 64 on S^2"


@pytest.mark.parametrize("scheme", ["pre-ln", "peri-ln", "ngpt"])
def test_normalisation_schemes_run_and_cluster_what_the_scheme_moves(
    tmp_path, capsys, scheme
):
    """Free residual streams cluster their directions; nGPT keeps |x| = 1."""
    text = RD.replace('normalization = "none"', f'normalization = "{scheme}"')
    code, out = _run(tmp_path, scheme, text)
    assert code == 0
    printed = capsys.readouterr().out
    x = np.load(out / "trajectory.npz")["x"]
    radii = np.linalg.norm(x, axis=-1)
    if scheme == "ngpt":
        assert "of x (sphere)" in printed
        np.testing.assert_allclose(radii, 1, atol=1e-12)
    else:
        assert "of θ = x/|x|" in printed
        assert not np.allclose(radii[-1], radii[0])  # the stream is free


def test_solver_and_tolerances_default_to_the_library_s_with_and_without_noise():
    ode = resolve_config(None)
    assert (ode["solver"], ode["rtol"], ode["atol"]) == ("tsit5", 1e-6, 1e-6)
    assert ode["noise"] == {"kind": "none", "sigma": 0.0, "seed": 0}
    sde = resolve_config({"noise": {"kind": "common", "sigma": 0.3}})
    assert (sde["solver"], sde["rtol"], sde["atol"]) == ("heun", 1e-3, 1e-3)
    given = {"solver": "spark", "rtol": 1e-4, "noise": {"kind": "independent"}}
    assert resolve_config(given)["rtol"] == 1e-4
    with pytest.raises(ValueError, match='`solver` = "euler_heun" needs a fixed'):
        resolve_config({"solver": "euler_heun", "noise": {"kind": "common"}})
    fixed = {"solver": "euler_heun", "dt0": 0.1, "normalization": "none"}
    assert resolve_config({**fixed, "noise": {"kind": "common"}})["dt0"] == 0.1


def _noisy_segments(seed, noise_seed):
    """The documented solves of NOISY: segment k on fold_in(key(seed), k)."""
    x = _segments.initial_measure(resolve_config({"n": 8}), seed, np.float64).x
    x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    ts, want = np.linspace(0, 1, 5), [np.asarray(x)]
    attn = mf.SoftmaxAttention(jnp.eye(3), A=jnp.eye(3))
    for k, (lo, hi) in enumerate([(0, 2), (2, 4)]):
        sol = mf.simulate(
            mf.Particles(jnp.asarray(want[-1])),
            attn,
            float(ts[hi]),
            t0=float(ts[lo]),
            saveat=ts[lo + 1 : hi + 1],
            normalization="sphere",
            noise=mf.IndependentNoise(0.5),
            key=jax.random.fold_in(jax.random.key(noise_seed), k),
        )
        want += list(np.asarray(sol.x))
    return np.array(want)


def test_noisy_run_is_its_segments_on_the_documented_keys(tmp_path, capsys):
    code, out = _run(tmp_path, "noisy", NOISY, "--seed", "2")
    assert code == 0
    printed = capsys.readouterr().out
    assert "independent noise, sigma = 0.5, solver heun" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    # The order parameter of the tokens at the first and last saves, beside the
    # cluster count; about 1/sqrt(n) for independent uniform directions.
    order = manifest["summary"]["order_parameter"]
    with np.load(out / "trajectory.npz") as data:
        want = mf.clustering.order_parameter(data["x"], data["weights"])
    np.testing.assert_allclose(order["initial"], want[0], rtol=1e-12)
    np.testing.assert_allclose(order["final"], want[-1], rtol=1e-12)
    np.testing.assert_allclose(order["uniform"], 1 / np.sqrt(8), rtol=1e-12)
    line = next(line for line in printed.splitlines() if "order parameter" in line)
    assert f"{order['final']:.3f} at the end" in line and "x (sphere)" in line
    noise = {"kind": "independent", "sigma": 0.5, "seed": 4}
    assert manifest["config"]["noise"] == noise
    assert manifest["config"]["solver"] == "heun" and manifest["config"]["rtol"] == 1e-3
    want = _noisy_segments(2, 4)
    with np.load(out / "trajectory.npz") as data:
        np.testing.assert_array_equal(data["x"], want)
        np.testing.assert_allclose(np.linalg.norm(data["x"], axis=-1), 1, atol=1e-12)
    # Another [noise] seed is another path from the same tokens.
    other = _noisy_segments(2, 5)
    np.testing.assert_array_equal(other[0], want[0])
    assert np.abs(other[-1] - want[-1]).max() > 1e-2


def test_noisy_run_resumed_continues_the_same_path(tmp_path, monkeypatch, capsys):
    solve = _segments.simulate

    def interrupted(*args, **kwargs):
        if kwargs["t0"] > 0:  # the second segment
            raise KeyboardInterrupt
        return solve(*args, **kwargs)

    monkeypatch.setattr(_segments, "simulate", interrupted)
    assert _run(tmp_path, "part", NOISY)[0] == 130
    monkeypatch.setattr(_segments, "simulate", solve)
    code, out = _run(tmp_path, "part", NOISY, "--resume")
    assert code == 0 and "resumed from segment 1" in capsys.readouterr().out
    with np.load(out / "trajectory.npz") as data:
        np.testing.assert_array_equal(data["x"], _noisy_segments(0, 4))
