import matplotlib

matplotlib.use("Agg")

import jax.numpy as jnp
import jax.random as jr
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib import animation
from PIL import Image

import meanfield as mf
from meanfield import _status, plotting
from meanfield.plotting import _animation

# Solutions are built from closed-form paths, not `mf.simulate`: compiling a solve
# takes seconds, rendering these frames a fraction of one. `test_simulated_*`
# (slow) covers real solutions.
T = 11


def _solution(ts, x, *, result=_status.SUCCESS, blowup_time=np.inf):
    return mf.Solution(
        ts=jnp.asarray(ts),
        x=jnp.asarray(x),
        blowup_time=jnp.asarray(blowup_time),
        result=jnp.asarray(result),
        t_final=jnp.asarray(ts[np.isfinite(ts)][-1]),
        num_steps=jnp.asarray(T),
        initial=mf.Particles(x[0]),
    )


@pytest.fixture(scope="module")
def sphere_sol():
    """n = 8 tokens on S^2 sliding towards the north pole: |x_i(t)| = 1."""
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=(8, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    ts = np.linspace(0.0, 2.0, T)
    s = ts[:, None, None] / 3
    x = (1 - s) * x0 + s * np.array([0.0, 0.0, 1.0])
    return _solution(ts, x / np.linalg.norm(x, axis=-1, keepdims=True))


@pytest.fixture(scope="module")
def planar_sol():
    """n = 8 tokens in R^2 contracting to two points."""
    rng = np.random.default_rng(1)
    x0 = rng.normal(size=(8, 2))
    ts = np.linspace(0.0, 2.0, T)
    target = np.sign(x0[:, :1]) * np.array([1.0, 0.0])
    decay = np.exp(-2 * ts)[:, None, None]
    return _solution(ts, target + decay * (x0 - target))


@pytest.fixture(scope="module")
def blowup_sol():
    """Reached rows 0..3, then +inf (time and state) as after a blow-up."""
    rng = np.random.default_rng(2)
    ts = np.linspace(0.0, 5.0, T)
    x = np.exp(ts)[:, None, None] * rng.normal(size=(1, 8, 2))
    ts[4:], x[4:] = np.inf, np.inf
    return _solution(ts, x, result=_status.BLOWUP, blowup_time=1.6)


def _frames(path) -> tuple[int, tuple[int, int]]:
    with Image.open(path) as im:
        return im.n_frames, im.size


def _only(path) -> None:
    """`path` is the only file in its directory: no temporary file was left."""
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_sphere_gif_has_one_frame_per_save_time(tmp_path, sphere_sol):
    figures = plt.get_fignums()
    out = plotting.animate(sphere_sol, tmp_path / "sphere.gif", title="toy")
    assert out == tmp_path / "sphere.gif"
    # 5 in at 80 dpi; min(T_reached, max_frames) = 11 frames.
    assert _frames(out) == (T, (400, 400))
    _only(out)
    assert plt.get_fignums() == figures  # nothing left open in pyplot


@pytest.mark.parametrize("kind", ["3d", "2d"])
def test_max_frames_subsamples_evenly(tmp_path, sphere_sol, kind):
    out = plotting.animate(
        sphere_sol, str(tmp_path / "a.gif"), kind=kind, max_frames=4, dims=(0, 2)
    )
    assert _frames(out)[0] == 4
    assert _frames(out)[1] == (400, 400)


def test_planar_gif_with_progress_bar(tmp_path, planar_sol):
    out = plotting.animate(
        planar_sol, tmp_path / "planar.gif", progress=True, trail=0, max_frames=4
    )
    assert _frames(out)[0] == 4
    _only(out)


def test_blowup_animates_reached_frames_only(tmp_path, blowup_sol):
    out = plotting.animate(blowup_sol, tmp_path / "blowup.gif")
    assert _frames(out)[0] == 4
    _only(out)


def test_positions_override(tmp_path, planar_sol):
    # Rescaled trajectories e^{-t} x(t), with and without a Solution.
    ts = np.asarray(planar_sol.ts)
    z = np.exp(-ts)[:, None, None] * np.asarray(planar_sol.x)
    out = plotting.animate(planar_sol, tmp_path / "z.gif", x=z, max_frames=2)
    assert _frames(out)[0] == 2
    out = plotting.animate(None, tmp_path / "z2.gif", x=z[:3], ts=ts[:3])
    assert _frames(out)[0] == 3


def test_failed_render_leaves_existing_file_untouched(
    tmp_path, planar_sol, monkeypatch
):
    out = tmp_path / "keep.gif"
    out.write_bytes(b"old")
    grab = _animation._GifWriter.grab_frame
    calls = []

    def flaky(self, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        grab(self, **kw)

    monkeypatch.setattr(_animation._GifWriter, "grab_frame", flaky)
    with pytest.raises(RuntimeError, match="disk full"):
        plotting.animate(planar_sol, out)
    assert out.read_bytes() == b"old"
    _only(out)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"path": "a.png"}, "`path`.*a.png"),
        ({"path": "a"}, "`path`"),
        ({"kind": "movie"}, "`kind`"),
        ({"kind": "sphere"}, '`kind="sphere"` needs d = 3'),
        ({"kind": "3d"}, "d = 3"),
        ({"dims": (0, 2)}, "`dims`"),
        ({"dims": (1, 1)}, "`dims`"),
        ({"x": np.zeros((T, 2))}, "`x`"),
        ({"x": np.zeros((T, 8, 2)), "ts": np.zeros(3)}, "`ts`"),
        ({"ts": np.zeros(T)}, "`ts`"),
        ({"max_frames": 0}, "`max_frames`"),
        ({"fps": 0}, "`fps`"),
        ({"trail": -1}, "`trail`"),
        ({"max_particles": 0}, "`max_particles`"),
    ],
)
def test_bad_arguments_raise(tmp_path, planar_sol, kwargs, match):
    path = tmp_path / kwargs.pop("path", "a.gif")
    with pytest.raises(ValueError, match=match):
        plotting.animate(planar_sol, path, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_mp4_without_ffmpeg_suggests_gif(tmp_path, planar_sol, monkeypatch):
    monkeypatch.setattr(animation.writers, "is_available", lambda name: False)
    with pytest.raises(ValueError, match="ffmpeg is not available.*gif"):
        plotting.animate(planar_sol, tmp_path / "a.mp4")
    assert list(tmp_path.iterdir()) == []


def test_mp4_with_ffmpeg(tmp_path, planar_sol):
    if not animation.writers.is_available("ffmpeg"):
        pytest.skip("ffmpeg is not installed")
    out = plotting.animate(planar_sol, tmp_path / "a.mp4", max_frames=4)
    # An MP4 (ISO base media) file starts with a box whose type is "ftyp".
    assert out.read_bytes()[4:8] == b"ftyp"
    _only(out)


def test_cluster_counts_step_data_and_scales():
    ts = np.array([0.0, 1.0, 2.0, 3.0, np.inf])
    counts = np.array([64, 20, 5, 2, 2])
    fig = plotting.plot_cluster_counts(ts, counts, tol=1e-3, label="softmax")
    ax = fig.axes[0]
    (line,) = ax.get_lines()
    np.testing.assert_array_equal(line.get_xdata(), ts[:4])
    np.testing.assert_array_equal(line.get_ydata(), counts[:4])
    assert line.get_drawstyle() == "steps-post"
    assert ax.get_yscale() == "log"  # 64 / 2 > 10
    assert "tol = 0.001" in line.get_label()
    # A second curve on the same axes, with a varying tolerance on a twin axis.
    plotting.plot_cluster_counts(
        ts[:4], [3, 3, 2, 2], tol=[1e-3, 1e-2, 1e-2, 1e-1], ax=ax, label="L2"
    )
    assert len(ax.get_lines()) == 2
    (twin,) = (a for a in fig.axes if a is not ax)
    np.testing.assert_array_equal(
        twin.get_lines()[0].get_ydata(), [1e-3, 1e-2, 1e-2, 1e-1]
    )
    plt.close(fig)
    fig = plotting.plot_cluster_counts([0.0, 1.0], [3, 2])
    assert fig.axes[0].get_yscale() == "linear"
    plt.close(fig)


def test_cluster_counts_explain_the_switch_of_tolerance_rule():
    # The automatic tolerance jumps from 1e-2 max|x| to a cut inside a gap when
    # clusters form: the two stretches get their own style and legend entry.
    ts = np.array([0.0, 1.0, 2.0, 3.0])
    tol = np.array([1e-2, 1e-2, 0.3, 0.3])
    method = np.array(["relative", "relative", "gap", "gap"])
    fig = plotting.plot_cluster_counts(ts, [50, 40, 3, 2], tol=tol, method=method)
    (twin,) = fig.axes[1:]
    dotted, dashed = twin.get_lines()
    assert dotted.get_linestyle() == ":" and dashed.get_linestyle() == "--"
    np.testing.assert_array_equal(dotted.get_ydata(), [1e-2, 1e-2, np.nan, np.nan])
    np.testing.assert_array_equal(dashed.get_ydata(), [np.nan, np.nan, 0.3, 0.3])
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == [
        "tolerance: 1e-2 max|x| (no gap yet)",
        "tolerance: in a gap of the merge heights",
    ]
    plt.close(fig)
    # ClusterCounts carries the rule of every time.
    rng = np.random.default_rng(0)
    spread = rng.normal(size=(20, 2))  # t = 0: a cloud, no gap
    tight = 1e-3 * spread + np.repeat([[0.0, 0.0], [5.0, 0.0]], 10, axis=0)
    counts = mf.clustering.cluster_counts(np.stack([spread, tight]))
    assert counts.method.tolist() == ["relative", "gap"]
    assert counts.counts.tolist() == [20, 2]


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (([0.0, 1.0], [1, 2, 3]), {}, "`counts`"),
        (([[0.0, 1.0]], [[1, 2]]), {}, "`ts`"),
        (([0.0, 1.0], [1, 2]), {"tol": [1.0]}, "`tol`"),
        (([np.inf], [1]), {}, "nothing to plot"),
    ],
)
def test_cluster_counts_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plotting.plot_cluster_counts(*args, **kwargs)


@pytest.mark.slow
def test_simulated_solutions_animate(tmp_path, key):
    x = jr.normal(key, (8, 3))
    sphere = mf.simulate(
        mf.Particles(x),
        mf.SoftmaxAttention(jnp.eye(3), A=jnp.eye(3)),
        2.0,
        saveat=jnp.linspace(0.0, 2.0, T),
        normalization="sphere",
    )
    out = plotting.animate(sphere, tmp_path / "sphere.gif")
    assert _frames(out) == (T, (400, 400))
    blowup = mf.simulate(
        mf.Particles(0.1 * x[:, :2]),
        mf.UnnormalizedAttention(jnp.eye(2), A=jnp.eye(2)),
        5.0,
        saveat=jnp.linspace(0.0, 5.0, T),
    )
    assert blowup.status == "blowup"
    reached = int(np.isfinite(np.asarray(blowup.ts)).sum())
    assert 1 < reached < T
    out = plotting.animate(blowup, tmp_path / "blowup.gif")
    assert _frames(out)[0] == reached


def test_animation_axes_name_the_drawn_coordinates():
    # animate(x=rescaled) draws z = e^{-tV} x: its axes say z, not x.
    from matplotlib.figure import Figure

    x = np.random.default_rng(0).normal(size=(3, 4, 3))
    ax, _, _ = _animation._axes(Figure(), "2d", x[:, :, :2], (0, 2), "z")
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("$z_{0}$", "$z_{2}$")
    ax, _, _ = _animation._axes(Figure(), "3d", x, (0, 1), "x")
    assert (ax.get_xlabel(), ax.get_zlabel()) == ("$x_0$", "$x_2$")
