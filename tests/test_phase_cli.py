"""`meanfield phase`: the clustering phase diagram from a configuration."""

import json
import tomllib

import jax
import numpy as np
import pytest

import meanfield as mf
from meanfield._app.chunk_checkpoint import Checkpoint
from meanfield._app.cli import main
from meanfield._app.phase_report import checked_config, resolve_config

SMALL = """\
n = 6
systems = 5
betas = [1.0, 4.0, 3]
t1 = 8.0
saves = 5
"""


def _toml(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return str(path)


def test_phase_writes_the_diagram_of_phase_diagram(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["phase", "--config", _toml(tmp_path, SMALL), "--out", str(out)]
    assert main([*argv, "--seed", "3", "--no-progress"]) == 0
    assert (out / "phase.png").stat().st_size > 10_000
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 3 and manifest["config"]["systems"] == 5
    assert sorted(manifest["files"]) == ["phase.npz", "phase.png"]
    with jax.enable_x64(True):
        want = mf.clustering.phase_diagram(
            [1.0, 2.5, 4.0],
            n=6,
            systems=5,
            t1=8.0,
            saveat=np.linspace(0, 8, 5),
            key=jax.random.key(3),
        )
    with np.load(out / "phase.npz") as data:
        np.testing.assert_array_equal(data["density"], want.density)
        np.testing.assert_array_equal(data["one_cluster"], want.one_cluster)
        np.testing.assert_array_equal(data["completed"], np.ones(3))
        np.testing.assert_allclose(data["theory"], want.theory(), rtol=1e-12)
    printed = capsys.readouterr().out
    assert "3 betas in [1, 4] x 5 systems of 6 tokens" in printed


def test_phase_options_reach_the_model(tmp_path, capsys):
    """Causal, two heads, pre-LN: the arrays of that model, no equiangular curve."""
    text = SMALL + 'd = 4\nheads = 2\nmasked = true\nnormalization = "pre-ln"\n'
    out = tmp_path / "out"
    argv = ["phase", "--config", _toml(tmp_path, text), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    with jax.enable_x64(True):
        want = mf.clustering.phase_diagram(
            [1.0, 2.5, 4.0],
            n=6,
            d=4,
            systems=5,
            t1=8.0,
            saveat=np.linspace(0, 8, 5),
            heads=2,
            masked=True,
            normalization="pre-ln",
        )
    with np.load(out / "phase.npz") as data:
        assert "theory" not in data.files
        np.testing.assert_array_equal(data["density"], want.density)
        np.testing.assert_array_equal(data["one_cluster"], want.one_cluster)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("betas = [0.0, 1.0, 3]", "`betas` must start above 0"),
        ("betas = [2.0, 1.0, 3]", "`betas` must have min < max"),
        ("d = 3\nheads = 2", "`heads` must divide d = 3"),
        ('attention = "l2"', "`attention` must be one of softmax, unnormalized"),
        ("eps = 2.5", "`eps` must be in (0, 2)"),
        ("colour = 1", "unknown key `colour`"),
        ("systems = 1_000_000_000", "`systems` must be an integer in [1, 1000000]"),
        ('normalization = "ngpt"\n[noise]\nkind = "independent"', "`noise.kind`"),
        ("[noise]\nsigma = 0.2", "`noise.sigma` = 0.2 needs `noise.kind`"),
        ('[noise]\nkind = "common"\nsigma = -1.0', "`noise.sigma` must be >= 0"),
        # 90 betas x 10^6 systems of 4096 tokens: about 14 TiB, on no machine.
        ("systems = 1_000_000\nn = 4096", "`systems` = 1000000 needs at least"),
    ],
)
def test_phase_rejects_bad_configurations(tmp_path, capsys, text, message):
    out = tmp_path / "out"
    assert main(["phase", "--config", _toml(tmp_path, text), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meanfield phase: error:") and message in err
    assert not out.exists() or not any(out.iterdir())


def test_phase_defaults_are_the_published_grid():
    cfg = resolve_config(None)
    assert cfg["betas"] == [0.1, 9.0, 90] and cfg["systems"] == 2048
    assert (cfg["n"], cfg["d"], cfg["t1"], cfg["saves"]) == (32, 2, 30.0, 31)
    assert (cfg["rtol"], cfg["atol"]) == (1e-6, 1e-6)
    noisy = resolve_config({"noise": {"kind": "common", "sigma": 0.2}})
    assert (noisy["rtol"], noisy["atol"]) == (1e-3, 1e-3)  # mf.simulate's with noise


# Second tier: the noisy ensemble's compilation (about 5 s).
@pytest.mark.slow
def test_noisy_phase_is_phase_diagram_on_the_seed_s_paths(tmp_path, capsys):
    text = SMALL + '[noise]\nkind = "independent"\nsigma = 0.3\nseed = 7\n'
    out = tmp_path / "out"
    argv = ["phase", "--config", _toml(tmp_path, text), "--out", str(out)]
    assert main([*argv, "--seed", "3", "--no-progress"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["summary"]["noise"] == {
        "kind": "independent",
        "sigma": 0.3,
        "seed": 7,
    }
    assert manifest["config"]["rtol"] == 1e-3
    with jax.enable_x64(True):
        want = mf.clustering.phase_diagram(
            [1.0, 2.5, 4.0],
            n=6,
            systems=5,
            t1=8.0,
            saveat=np.linspace(0, 8, 5),
            key=jax.random.key(3),
            noise=mf.IndependentNoise(0.3),
            noise_key=jax.random.key(7),
        )
    with np.load(out / "phase.npz") as data:
        assert "theory" not in data.files  # the equiangular curve has no noise
        np.testing.assert_array_equal(data["density"], want.density)
        np.testing.assert_array_equal(data["one_cluster"], want.one_cluster)
    assert "Brownian paths of seed 7" in capsys.readouterr().out


def test_phase_memory_check_names_the_key_to_lower():
    from meanfield._app.phase_report import check_memory, memory_bytes

    cfg = resolve_config({"systems": 10, "betas": [1.0, 2.0, 2], "n": 64})
    every, chunk = memory_bytes(cfg)  # 20 systems: 20 x 8 x (2nd + n + 2d^2 + T)
    assert every == 8 * 20 * (2 * 64 * 2 + 64 + 2 * 4 + 31)
    assert chunk == 8 * 20 * 64 * (31 * 2 + 64)  # a chunk of all 20 systems
    check_memory(cfg, every + chunk)  # fits exactly
    with pytest.raises(ValueError, match=r"^`chunk_size` = 16384 needs at least"):
        check_memory(cfg, every + chunk - 1)  # a smaller chunk would fit
    with pytest.raises(ValueError, match=r"^`systems` = 10 needs at least"):
        check_memory(cfg, every)  # not even a chunk of one system fits


# Resuming: 15 systems in chunks of 4, so 4 chunks (on any number of cores).
CHUNKED = SMALL + "chunk_size = 4\n"


def _resume_run(tmp_path, name, text, *extra):
    argv = ["phase", "--config", _toml(tmp_path, text), "--out", str(tmp_path / name)]
    return main([*argv, *extra]), tmp_path / name


def _interrupt_after(monkeypatch, k):
    """Let the run checkpoint k chunks, then stop it as Ctrl-C would."""
    save, saved = Checkpoint.save_chunk, []

    def interrupted(self, index, output):
        if len(saved) >= k:  # a chunk ending after the interrupt is not saved
            raise KeyboardInterrupt
        saved.append(index)
        save(self, index, output)

    monkeypatch.setattr(Checkpoint, "save_chunk", interrupted)
    return saved


def test_resume_after_an_interruption_gives_the_uninterrupted_diagram(
    tmp_path, monkeypatch, capsys
):
    # --resume where there is no checkpoint: a word, then a whole run.
    code, full = _resume_run(tmp_path, "full", CHUNKED, "--no-progress", "--resume")
    assert code == 0
    assert capsys.readouterr().err.splitlines() == [
        f"--resume: no checkpoint/ in {full}/: starting from the beginning"
    ]
    assert len(list((full / "checkpoint").glob("chunk-*.npz"))) == 4

    saved = _interrupt_after(monkeypatch, 2)
    code, part = _resume_run(tmp_path, "part", CHUNKED, "--no-progress")
    assert code == 130
    err = capsys.readouterr().err
    assert f"2 of 4 chunks are in the checkpoint {part}/checkpoint/" in err
    assert "rerun with --resume" in err
    chunks = sorted(p.name for p in (part / "checkpoint").glob("chunk-*.npz"))
    assert chunks == [f"chunk-{i:05d}.npz" for i in sorted(saved)]
    assert not (part / "manifest.json").exists()
    assert not (part / ".meanfield.lock").exists()

    monkeypatch.undo()
    code, part = _resume_run(tmp_path, "part", CHUNKED, "--resume")  # with progress
    assert code == 0
    captured = capsys.readouterr()
    assert "(resumed with 2 of 4 chunks from the checkpoint)" in captured.out
    # The bar starts at the chunks read back.
    assert "resumed: 2 of 4 chunks from checkpoint/" in captured.err
    assert "simulate_ensemble:  50%" in captured.err and "2/4" in captured.err
    # The same chunks, each the same computation: bit for bit equal arrays, and
    # the same figure.
    with np.load(full / "phase.npz") as a, np.load(part / "phase.npz") as b:
        assert a.files == b.files
        for name in a.files:
            assert a[name].tobytes() == b[name].tobytes(), name
    assert (full / "phase.png").read_bytes() == (part / "phase.png").read_bytes()
    summary = json.loads((part / "manifest.json").read_text())["summary"]
    assert summary["resumed_chunks"] == 2 and summary["chunks"] == 4


def _checkpoint_of(tmp_path, text, *, seed=0, command="phase"):
    """Write the checkpoint description of a run of `text`, without its solves."""
    from meanfield._app.report import Output

    out = tmp_path / "run"
    cfg = checked_config(resolve_config(tomllib.loads(text)))
    Checkpoint.open(Output(out), command, cfg, seed, resume=False, chunks=4, width=4)
    return out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("systems = 5", "systems = 6"),
            "was written by another configuration (`systems`: 5 -> 6)",
        ),
        (
            ("chunk_size = 4", 'chunk_size = 4\n[noise]\nkind = "common"\nsigma = 0.1'),
            "(`atol`: 1e-06 -> 0.001; `dtype`: 'float32' -> 'float64'; "
            "`noise.kind`: 'none' -> 'common'; `noise.sigma`: 0.0 -> 0.1; `rtol`:",
        ),
        (("", ""), "was written with --seed 1, not 0"),
    ],
)
def test_resume_of_another_run_exits_2_naming_the_difference(
    tmp_path, capsys, change, message
):
    out = _checkpoint_of(tmp_path, CHUNKED, seed=1 if change == ("", "") else 0)
    text = CHUNKED.replace(*change)
    code, _ = _resume_run(tmp_path, "run", text, "--resume", "--seed", "0")
    assert code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("meanfield phase: error: checkpoint")
    assert message in err[0]
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == ["run.json"]


def test_resume_refuses_another_command_s_checkpoint_and_ignores_the_figure_key(
    tmp_path, capsys
):
    out = _checkpoint_of(tmp_path, CHUNKED, command="gaussian")
    assert _resume_run(tmp_path, "run", CHUNKED, "--resume")[0] == 2
    err = capsys.readouterr().err
    assert "was written by `meanfield gaussian`, not `meanfield phase`" in err
    (out / "checkpoint" / "run.json").unlink()
    out = _checkpoint_of(tmp_path, CHUNKED)
    # log_time draws the same diagram on another axis: the chunks still serve.
    cfg = resolve_config({**tomllib.loads(CHUNKED), "log_time": True})
    assert Checkpoint.read(out, "phase", checked_config(cfg), 0) is not None
    (out / "checkpoint" / "run.json").write_text("{ truncated")
    assert _resume_run(tmp_path, "run", CHUNKED, "--resume")[0] == 2
    assert "cannot read checkpoint" in capsys.readouterr().err


def test_interrupt_before_the_first_chunk_says_there_is_no_checkpoint(
    tmp_path, monkeypatch, capsys
):
    _interrupt_after(monkeypatch, 0)
    code, out = _resume_run(tmp_path, "first", CHUNKED, "--no-progress")
    assert code == 130
    err = capsys.readouterr().err
    assert "meanfield phase: interrupted; no part had finished" in err
    assert "--resume" not in err
    assert not list((out / "checkpoint").glob("chunk-*"))
