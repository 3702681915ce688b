import json

import numpy as np
import pytest

from meanfield._app.cli import main


# Second tier (make test-slow): the whole tour, 54 s; each command it runs keeps a
# small end-to-end test in the default suite.
@pytest.mark.slow
def test_demo_tour_writes_the_four_headline_figures_and_manifests(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["demo", "--out", str(out), "--n", "24", "--seed", "3", "--quick"]
    assert main([*args, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert all(f"{i}/4" in printed for i in range(1, 5))
    clustering = out / "clustering"
    for name in [
        "sphere.png",
        "sphere_trajectories.png",
        "rescaled.png",
        "clusters.png",
    ]:
        assert (clustering / name).stat().st_size > 10_000, name
    from PIL import Image

    with Image.open(clustering / "tokens.gif") as gif:
        assert gif.n_frames > 10
    assert (out / "gaussian" / "ellipses.png").stat().st_size > 10_000
    assert (out / "lipschitz" / "lipschitz.png").stat().st_size > 10_000
    assert (out / "phase" / "phase.png").stat().st_size > 10_000
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 3 and manifest["config"]["n"] == 24
    assert "jax" in manifest["versions"]
    summary = manifest["summary"]
    assert summary["gaussian"]["softmax"]["status"] == "blowup"
    assert summary["clustering"]["sphere"]["status"] == "success"
    assert summary["phase"]["completed_min"] == 1.0
    with np.load(clustering / "trajectory.npz") as data:
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
