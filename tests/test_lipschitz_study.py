"""Lipschitz constant of attention against n, and of real encoder layers against the
sequence length (Castin, Ablin & Peyre, "How Smooth Is Attention?", ICML 2024), and
the `meanfield lipschitz` command."""

import json

import jax
import jax.numpy as jnp
import jax.random as jr
import matplotlib.pyplot as plt
import numpy as np
import pytest

import meanfield as mf
import meanfield.bert as bert
from meanfield import plotting
from meanfield._app import lipschitz_report as report
from meanfield._app.cli import main
from meanfield.lipschitz._search import random_ball

L = mf.lipschitz


def test_scaling_study_softmax_head():
    # gamma = 1, R = 2: e^{2 gamma R^2} = 3e3 >> 32, the sqrt(n) regime of Prop. 3.4.
    attn = mf.SoftmaxAttention(jnp.eye(2), A=-jnp.eye(2))
    ns = [4, 8, 16, 32]
    study = L.scaling_study(
        attn,
        ns,
        2.0,
        key=jr.key(1),
        search_max_n=8,
        search_kwargs={"restarts": 1, "steps": 30},
        progress=False,
    )
    np.testing.assert_array_equal(study.ns, ns)
    for name in ("random", "adversarial", "upper", "lower"):
        values = getattr(study, name)
        assert values.shape == (4,) and np.all(np.isfinite(values)), name
    assert study.random_converged.all() and study.adversarial_converged.all()
    assert np.all(study.random <= study.upper)
    assert np.all(study.adversarial <= study.upper)
    assert np.all(study.adversarial >= study.lower * (1 - 1e-10))
    # Searched for n <= 8 only; it starts from the Prop. 3.4 configuration too.
    assert np.all(np.isfinite(study.searched[:2])) and np.all(
        np.isnan(study.searched[2:])
    )
    assert np.all(study.searched[:2] >= study.adversarial[:2] * (1 - 1e-6))
    assert np.all(study.searched[:2] <= study.upper[:2])
    assert 0.4 <= study.slopes["adversarial"] <= 0.6
    assert study.slopes["upper"] == pytest.approx(
        np.polyfit(np.log(ns), np.log(study.upper), 1)[0]
    )
    assert study.slopes["random"] < study.slopes["adversarial"]
    # The random inputs are those of `random_ball` at fold_in(key, n); at n = 4
    # (dimension 8, below a Lanczos cycle) against the dense Jacobian.
    k_random, _ = jr.split(jr.key(1))
    x = random_ball(jr.fold_in(k_random, 16), 16, 2, 2.0, float)
    assert float(L.local(attn, x)) == pytest.approx(study.random[2], rel=1e-12)
    x = random_ball(jr.fold_in(k_random, 4), 4, 2, 2.0, float)
    J = jax.jacfwd(lambda y: attn.velocity(mf.Particles(y)))(x).reshape(8, 8)
    assert np.linalg.norm(np.asarray(J), 2) == pytest.approx(study.random[0])
    assert set(study.series()) == {
        "random",
        "adversarial",
        "searched",
        "upper",
        "lower",
    }


def test_scaling_study_other_families_omit_what_is_undefined():
    rng = np.random.default_rng(0)
    V, A = np.eye(2), rng.normal(size=(2, 2))
    multi = mf.MultiHeadAttention(
        [mf.SoftmaxAttention(V, A=A), mf.SoftmaxAttention(V, A=A.T)]
    )
    study = L.scaling_study(multi, [4, 8], 1.0, progress=False)
    assert study.adversarial is None and study.lower is None
    assert np.all(study.random <= study.upper)
    assert set(study.slopes) == {"random", "searched", "upper"}
    assert np.isnan(study.slopes["searched"])  # never searched
    l2 = mf.L2Attention(V, Q=np.eye(2), K=np.eye(2))
    study = L.scaling_study(l2, [4, 8], 1.0, progress=False)
    assert study.upper is None and study.adversarial is None
    assert np.all(np.isfinite(study.random))
    with pytest.raises(ValueError, match="`ns` must be"):
        L.scaling_study(l2, [1, 4], 1.0, progress=False)


def test_fit_slope():
    ns = np.array([2.0, 4.0, 8.0])
    assert L.fit_slope(ns, 3 * ns**0.5) == pytest.approx(0.5)
    assert L.fit_slope(ns, [1.0, np.nan, 4.0]) == pytest.approx(1.0)
    assert np.isnan(L.fit_slope(ns, [1.0, np.nan, np.nan]))


# ---- real encoder: a small random BERT (no pretrained package needed) ----

CONFIG = bert.BertConfig(
    vocab_size=50,
    hidden_size=16,
    num_layers=2,
    num_heads=2,
    intermediate_size=32,
    max_positions=32,
)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    bert.save_random(path, CONFIG, jr.key(0))
    return path


@pytest.fixture(scope="module")
def small_model(small_dir):
    return bert.load(small_dir, dtype=jnp.float64)


def test_real_model_study_matches_direct_local(small_model):
    ids = np.random.default_rng(0).integers(0, CONFIG.vocab_size, size=40)
    lengths = [8, 16]
    res = L.real_model_study(small_model, ids, lengths, progress=False)
    assert res.values.shape == (2, 2) and res.converged.all()
    np.testing.assert_array_equal(res.layers, [0, 1])
    assert res.dtype == "float64"
    for j, l in enumerate(res.layers):
        for i, n in enumerate(lengths):
            x = bert.hidden_states(small_model, ids[:n])[l]
            direct = L.local(bert.attention_layer(small_model, int(l)), x)
            assert res.values[j, i] == pytest.approx(float(direct), rel=1e-10)
        assert res.slopes[j] == pytest.approx(L.fit_slope(lengths, res.values[j]))
    fig = plotting.plot_real_model_lipschitz(res)
    assert len(fig.axes[0].get_lines()) == 3  # two layers and the sqrt(n) guide
    plt.close(fig)
    one = L.real_model_study(small_model, ids, [8, 16], layers=[1], progress=False)
    np.testing.assert_allclose(one.values[0], res.values[1], rtol=1e-12)
    # The decoder experiment: the same inputs under a causal mask (s_i = i / n).
    causal = L.real_model_study(
        small_model, ids, [8], layers=[1], progress=False, masked=True
    )
    assert causal.masked and not res.masked and causal.converged.all()
    x = bert.hidden_states(small_model, ids[:8])[1]
    direct = L.local(
        bert.attention_layer(small_model, 1), x, positions=np.arange(1, 9) / 8
    )
    assert causal.values[0, 0] == pytest.approx(float(direct), rel=1e-10)
    assert causal.values[0, 0] != pytest.approx(res.values[1, 0], rel=1e-3)
    with pytest.raises(ValueError, match="`lengths` must be <= 32"):
        L.real_model_study(small_model, ids, [8, 33], progress=False)
    with pytest.raises(ValueError, match="`layers` must be"):
        L.real_model_study(small_model, ids, [8], layers=[2], progress=False)


def test_studies_print_no_progress_by_default(small_model, capsys):
    # Library calls are quiet (before: a tqdm bar on stderr unless progress=False);
    # the `meanfield lipschitz` command asks for bars itself. The same calls as
    # the tests above, so nothing new compiles.
    l2 = mf.L2Attention(np.eye(2), Q=np.eye(2), K=np.eye(2))
    study = L.scaling_study(l2, [4, 8], 1.0)
    ids = np.random.default_rng(0).integers(0, CONFIG.vocab_size, size=40)
    res = L.real_model_study(small_model, ids, [8, 16], layers=[1])
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
    assert np.all(np.isfinite(study.random)) and res.converged.all()
    # Their reprs: key values, no arrays dumped.
    assert repr(study).startswith("ScalingStudy(ns=[4, 8], R=1, slopes={'random': ")
    assert repr(res).startswith("RealModelStudy(lengths=[8, 16], layers=[1], ")


# ---- the command ----

SMALL = """\
ns = [4, 8, 16]
R = 2.0
A = [[-1.0, 0.2], [0.0, -0.5]]

[search]
max_n = 4
restarts = 1
steps = 10
"""


def _toml(tmp_path, text, name="config.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_lipschitz_cli_writes_figure_arrays_and_manifest(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["lipschitz", "--config", _toml(tmp_path, SMALL), "--out", str(out)]
    assert main([*argv, "--seed", "3", "--no-progress"]) == 0
    assert (out / "lipschitz.png").stat().st_size > 10_000
    assert not (out / "real_model.png").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    cfg = manifest["config"]
    assert manifest["seed"] == 3
    assert cfg["ns"] == [4, 8, 16] and cfg["R"] == 2.0
    # Defaults are resolved into the manifest, not left implicit.
    assert cfg["V"] == [[1.0, 0.0], [0.0, 1.0]]
    assert cfg["search"]["learning_rate"] == pytest.approx(0.04)
    assert cfg["real_model"]["enabled"] is False
    summary = manifest["summary"]
    assert summary["largest_n"] == 16 and summary["search"]["n"] == 4
    assert summary["ratios"]["random_over_upper"] < 1
    with np.load(out / "lipschitz.npz") as data:
        assert data["random"].shape == (3,)
        np.testing.assert_allclose(data["upper"][-1], summary["at_largest_n"]["upper"])
        assert np.isfinite(data["searched"][0]) and np.isnan(data["searched"][1])
        assert data["adversarial_converged"].all()
    captured = capsys.readouterr()
    printed = captured.out
    assert "slopes" in printed and "adversarial / upper" in printed
    assert captured.err == ""  # --no-progress: no progress lines or bars


def test_lipschitz_progress_goes_to_stderr(tmp_path, capsys):
    # The configuration of the test above: its compiled functions are reused.
    out = tmp_path / "out"
    argv = ["lipschitz", "--config", _toml(tmp_path, SMALL), "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("scaling study: n = 4..16\n")
    # The bar over the 3 sizes (leave=False: its last state may be cleared).
    assert "\rLipschitz vs n:   0%|" in err and "| 0/3 [" in err
    assert err.endswith("drawing figures\n")
    assert "scaling study" not in captured.out and "slopes" in captured.out


@pytest.mark.parametrize(
    "text, key",
    [
        ("foo = 1\n", "`foo`"),
        ('R = "big"\n', "`R`"),
        ("ns = [16, 8]\n", "`ns`"),
        ("A = [[1.0, 0.0]]\n", "`A`"),
        ("V = [[1.0]]\n", "`V`"),
        ("[search]\nsteps = 0\n", "`search.steps`"),
        ("[search]\nrate = 0.1\n", "`search.rate`"),
        ("[real_model]\nenabled = 1\n", "`real_model.enabled`"),
        ('[real_model]\ndtype = "float16"\n', "`real_model.dtype`"),
        ("[real_model]\nlayers = [0.5]\n", "`real_model.layers`"),
    ],
)
def test_bad_config_exits_2_with_one_line_naming_the_key(tmp_path, capsys, text, key):
    out = tmp_path / "out"
    code = main(["lipschitz", "--config", _toml(tmp_path, text), "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("meanfield lipschitz: error: ")
    assert key in err
    assert not out.exists()  # validated before anything is written


def test_real_model_without_the_extra_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bert, "find_pretrained", lambda: None)
    out = tmp_path / "out"
    config = _toml(tmp_path, "[real_model]\nenabled = true\n")
    assert main(["lipschitz", "--config", config, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`meanfield install-model`" in err
    assert not out.exists()


def test_real_model_table_runs_the_layers(tmp_path, capsys, monkeypatch, small_dir):
    # The small random encoder stands in for all-MiniLM-L6-v2 and random ids for
    # the tokenizer, so the [real_model] branch runs without the extra.
    ids = np.random.default_rng(1).integers(0, CONFIG.vocab_size, size=32)
    paths = bert.PretrainedPaths(
        small_dir / bert.WEIGHTS_NAME, small_dir / bert.CONFIG_NAME, small_dir
    )
    monkeypatch.setattr(bert, "find_pretrained", lambda: paths)
    monkeypatch.setattr(bert, "tokenize", lambda text, tok, max_length: ids)
    monkeypatch.setattr(report, "_tokenizers_installed", lambda: True)
    out = tmp_path / "out"
    text = SMALL.replace("max_n = 4", "max_n = 0") + (
        "\n[real_model]\nenabled = true\nlengths = [8, 16]\nmasked = true\n"
    )
    argv = ["lipschitz", "--config", _toml(tmp_path, text), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    assert (out / "real_model.png").stat().st_size > 10_000
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["real_model"]["layers"] == [0, 1]
    real = manifest["summary"]["real_model"]
    assert real["lengths"] == [8, 16] and len(real["slopes"]) == 2
    assert real["masked"] and manifest["config"]["real_model"]["masked"]
    with np.load(out / "lipschitz.npz") as data:
        assert data["real_model_values"].shape == (2, 2)
    assert "real model (float64, causal mask" in capsys.readouterr().out
    for bad, key in (
        ("lengths = [8, 64]", "lengths"),
        ("lengths = [8, 16]\nlayers = [2]", "layers"),
    ):
        config = _toml(tmp_path, f"[real_model]\nenabled = true\n{bad}\n")
        assert main(["lipschitz", "--config", config, "--out", str(out)]) == 2
        assert f"`real_model.{key}`" in capsys.readouterr().err
