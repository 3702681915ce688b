"""`meanfield gaussian`: softmax / L2 / Sinkhorn blow-up comparison on a Gaussian."""

import json
import math

import numpy as np
import pytest

from meanfield._app.chunk_checkpoint import Checkpoint
from meanfield._app.cli import main

# 30 cells of the phase grid in 4 chunks (of 8, 8, 8 and 6).
SMALL = """\
t1 = 2.0

[phase]
s_range = [-1.0, 1.0, 6]
r_range = [-1.0, 1.0, 5]
t_max = 3.0
chunk_size = 8
"""


def _toml(tmp_path, text, name="config.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# Second tier (make test-slow): 28 s of solves; the progress test below runs the
# command end to end on the same small configuration in the default suite.
@pytest.mark.slow
def test_gaussian_writes_figures_arrays_and_manifest(tmp_path, capsys):
    out = tmp_path / "out"
    config = _toml(tmp_path, SMALL)
    argv = ["gaussian", "--config", config, "--out", str(out), "--seed", "7"]
    assert main([*argv, "--no-progress"]) == 0
    for name in ["ellipses.png", "eigenvalues.png", "phase.png"]:
        assert (out / name).stat().st_size > 10_000, name
    manifest = json.loads((out / "manifest.json").read_text())
    cfg = manifest["config"]
    assert manifest["seed"] == 7
    assert cfg["t1"] == 2.0 and cfg["phase"]["s_range"] == [-1.0, 1.0, 6]
    assert cfg["phase"]["r_range"] == [-1.0, 1.0, 5] and cfg["phase"]["t_max"] == 3.0
    # Defaults are resolved into the manifest, not left implicit.
    assert cfg["Q"] == [[1.0, 0.5], [0.0, 1.0]] and cfg["mean"] == [0.5, 0.0]
    summary = manifest["summary"]
    assert summary["phase"]["shape"] == [5, 6]
    with np.load(out / "gaussian.npz") as data:
        assert data["phase_times"].shape == (5, 6)
        assert data["softmax_cov"].shape == (121, 2, 2)
        t_softmax = float(data["softmax_blowup_time"])
    # V = I commutes with everything: the closed form t* applies. The solver
    # stops at lambda_max ~ 1e8 and extrapolates; agreement is ~1e-8 relative.
    exact = summary["softmax"]["closed_form_blowup_time"]
    assert summary["softmax"]["status"] == "blowup"
    assert math.isclose(t_softmax, exact, rel_tol=1e-5)
    # L2 with K = I (full column rank) and Sinkhorn exist for all time.
    assert summary["L2"]["status"] == "success"
    assert summary["Sinkhorn"]["status"] == "success"
    assert 0 < summary["phase"]["fraction_blowup"] < 1
    captured = capsys.readouterr()
    printed = captured.out
    assert "softmax" in printed and "phase" in printed
    assert captured.err == ""  # --no-progress: no progress lines


def test_progress_lines_go_to_stderr(tmp_path, capsys):
    # The configuration of the test above (in the second tier).
    out = tmp_path / "out"
    assert (
        main(["gaussian", "--config", _toml(tmp_path, SMALL), "--out", str(out)]) == 0
    )
    captured = capsys.readouterr()
    # The bar over the grid's chunks, redrawn after a carriage return.
    bar = "blowup_times softmax: "
    assert f"{bar}100%" in captured.err and "4/4" in captured.err
    lines = [
        line for line in captured.err.splitlines() if line and not line.startswith(bar)
    ]
    assert [line.split(":")[0] for line in lines[:3]] == ["softmax", "L2", "Sinkhorn"]
    assert lines[0].startswith("softmax: blowup, t* = ")
    assert lines[3:] == [
        "phase diagram: 5 x 6 runs to t = 3",
        lines[4],
        "drawing figures",
    ]
    assert lines[4].startswith("phase diagram done (")
    # The summary stays on stdout.
    assert "softmax" in captured.out and "drawing" not in captured.out


@pytest.mark.parametrize(
    "text, key",
    [
        ("foo = 1\n", "`foo`"),
        ("cov = [[1.0, 2.0], [2.0, 1.0]]\n", "`cov`"),  # eigenvalues -1, 3
        ("[phase]\nt_maxx = 1.0\n", "`phase.t_maxx`"),
        ('t1 = "long"\n', "`t1`"),
        ("Q = [[1.0, 0.0, 0.0]]\n", "`Q`"),
    ],
)
def test_bad_config_exits_2_with_one_line_naming_the_key(tmp_path, capsys, text, key):
    out = tmp_path / "out"
    code = main(["gaussian", "--config", _toml(tmp_path, text), "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("meanfield gaussian: error: ")
    assert key in err
    assert not out.exists()  # validated before anything is written


def test_unreadable_or_invalid_toml_exits_2(tmp_path, capsys):
    assert main(["gaussian", "--config", str(tmp_path / "missing.toml")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["gaussian", "--config", _toml(tmp_path, "cov = [[1.0,\n")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid TOML" in err


def test_a_config_file_not_in_utf8_exits_2_naming_the_file(tmp_path, capsys):
    path = tmp_path / "latin1.toml"
    path.write_bytes("t1 = 2.0 # café\n".encode("latin-1"))
    assert main(["gaussian", "--config", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("meanfield gaussian: error:")
    assert f"config file {str(path)!r} is not UTF-8" in err and "0xe9" in err


def test_resume_after_an_interruption_gives_the_uninterrupted_study(
    tmp_path, monkeypatch, capsys
):
    config = _toml(tmp_path, SMALL)

    def run(name, *extra):
        out = tmp_path / name
        return main(["gaussian", "--config", config, "--out", str(out), *extra]), out

    code, full = run("full", "--no-progress")
    assert code == 0
    # Stopped as Ctrl-C would, once the three variants and one chunk are saved.
    save = Checkpoint.save_chunk

    def interrupted(self, index, output):
        save(self, index, output)
        raise KeyboardInterrupt

    monkeypatch.setattr(Checkpoint, "save_chunk", interrupted)
    code, part = run("part", "--no-progress")
    assert code == 130
    err = capsys.readouterr().err
    assert f"4 of 7 parts are in the checkpoint {part}/checkpoint/" in err
    monkeypatch.undo()
    code, part = run("part", "--resume")  # with progress
    assert code == 0
    captured = capsys.readouterr()
    assert "resumed with 4 of 7 parts (variants and chunks)" in captured.out
    assert "softmax: blowup, t* = 0.365153 (from the checkpoint)" in captured.err
    assert "resumed: 1 of 4 chunks from checkpoint/" in captured.err
    assert "blowup_times softmax:  25%" in captured.err  # the bar starts at 1/4
    # Every array and every figure, bit for bit.
    with np.load(full / "gaussian.npz") as a, np.load(part / "gaussian.npz") as b:
        assert a.files == b.files
        for name in a.files:
            assert a[name].tobytes() == b[name].tobytes(), name
    for name in ["ellipses.png", "eigenvalues.png", "phase.png"]:
        assert (full / name).read_bytes() == (part / name).read_bytes(), name


def test_resume_with_another_grid_exits_2_naming_the_key(tmp_path, capsys):
    from meanfield._app.gaussian_report import resolve_config
    from meanfield._app.report import Output

    out = tmp_path / "out"
    cfg = resolve_config({"phase": {"chunk_size": 8}})
    Checkpoint.open(Output(out), "gaussian", cfg, 0, resume=False, chunks=1)
    argv = ["gaussian", "--config", _toml(tmp_path, SMALL), "--out", str(out)]
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "was written by another configuration" in err[0]
    assert "`phase.r_range`: [-1.5, 1.5, 41] -> [-1.0, 1.0, 5]" in err[0]
    assert "`t1`: 3.0 -> 2.0" in err[0]
