import json

import numpy as np
import pytest

from meanfield.cli import main


def test_demo_writes_figures_trajectory_and_manifest(tmp_path):
    out = tmp_path / "out"
    assert (
        main(["demo", "--out", str(out), "--n", "24", "--seed", "3", "--no-progress"])
        == 0
    )
    for name in ["sphere.png", "sphere_trajectories.png", "rescaled.png"]:
        assert (out / name).stat().st_size > 10_000, name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 3 and manifest["config"]["n"] == 24
    assert "jax" in manifest["versions"]
    with np.load(out / "trajectory.npz") as data:
        x = data["x_sphere"]
        assert x.shape[1:] == (24, 3)
        # Tokens stay on the sphere (LayerNorm model).
        np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1, atol=1e-5)


def test_bad_arguments_exit_with_status_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--n", "1"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["nonsense"])
    assert exc.value.code == 2
