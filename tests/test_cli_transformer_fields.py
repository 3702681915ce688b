"""`meanfield simulate` with positional and hardmax attention and a feed-forward layer.

The `[attention]` keys `slope` ("alibi") and `frequencies` ("rope"), `masked`
required by the positional families, and the `[feedforward]` table (the run's
field is then `mf.Block(attention, feedforward)`).
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield._app import config_reference
from meanfield._app.cli import main
from meanfield._app.simulate_config import (
    build_attention,
    build_field,
    resolve_config,
)

D2 = {"d": 2}
MASKED = {"d": 2, "masked": True}


def _field(raw):
    return build_field(resolve_config(raw), jnp.float64)


# ---- each key resolves to the object a script would build ----


def test_alibi_slope_and_its_matrices():
    attn = _field({**MASKED, "attention": {"kind": "alibi", "slope": 2.5, "V": 0.5}})
    assert type(attn) is mf.ALiBiAttention
    assert float(attn.slope) == 2.5
    np.testing.assert_array_equal(attn.V, 0.5 * np.eye(2))
    np.testing.assert_array_equal(attn.A, np.eye(2))  # A = I by default
    Q, K = [[1.0, 0.0]], [[0.0, 2.0]]
    raw = {**MASKED, "attention": {"kind": "alibi", "slope": -1, "Q": Q, "K": K}}
    attn = _field(raw)
    assert attn.A is None and float(attn.slope) == -1.0
    np.testing.assert_array_equal(attn.Q, Q)
    np.testing.assert_array_equal(attn.K, K)


@pytest.mark.parametrize(
    ("d", "extra", "expected"),
    [
        # A number omega: every pair of coordinates turns at omega.
        (2, {"frequencies": 3.0}, [3.0]),
        (4, {"frequencies": 0.5}, [0.5, 0.5]),
        (4, {"frequencies": [1.0, 4]}, [1.0, 4.0]),
        # k = 6 rows of Q in d = 3: k/2 = 3 frequencies.
        (
            3,
            {"frequencies": 2.0, "Q": [[1.0, 0, 0]] * 6, "K": [[0, 1, 0]] * 6},
            [2] * 3,
        ),
    ],
)
def test_rope_frequencies_are_k_over_two(d, extra, expected):
    raw = {"d": d, "masked": True, "attention": {"kind": "rope", **extra}}
    attn = _field(raw)
    assert type(attn) is mf.RoPEAttention
    np.testing.assert_array_equal(attn.frequencies, expected)
    if "Q" not in extra:  # Q = K = I by default
        np.testing.assert_array_equal(attn.Q, np.eye(d))


@pytest.mark.parametrize("masked", [False, True])
def test_hardmax_with_a_or_q_and_k(masked):
    A = [[1.0, 0.5], [0.0, 2.0]]
    raw = {"d": 2, "masked": masked, "attention": {"kind": "hardmax", "A": A}}
    attn = _field(raw)
    assert type(attn) is mf.HardmaxAttention
    np.testing.assert_array_equal(attn.A, A)
    raw["attention"] = {"kind": "hardmax", "Q": 2.0, "K": 1.0, "blocking": "blocked"}
    attn = _field(raw)
    assert attn.A is None and attn.blocking == "blocked"
    np.testing.assert_array_equal(attn.Q, 2 * np.eye(2))


def test_affine_feedforward_numbers_and_arrays():
    raw = {**D2, "feedforward": {"kind": "affine", "W": -0.5, "b": 0.25}}
    cfg = resolve_config(raw)
    # The resolved table keeps what was given, without the keys of "mlp".
    assert cfg["feedforward"] == {"kind": "affine", "W": -0.5, "b": 0.25}
    block = build_field(cfg, jnp.float64)
    assert type(block) is mf.Block and type(block.attention) is mf.SoftmaxAttention
    ff = block.feedforward
    assert type(ff) is mf.FeedForward
    np.testing.assert_array_equal(ff.W, -0.5 * np.eye(2))
    np.testing.assert_array_equal(ff.b, [0.25, 0.25])
    W = [[0.0, 1.0], [-1.0, 0.0]]
    ff = _field({**D2, "feedforward": {"kind": "affine", "W": W}}).feedforward
    np.testing.assert_array_equal(ff.W, W)
    assert ff.b is None  # omitted: zero


def test_mlp_feedforward_shapes_and_activation():
    W1 = [[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]  # p = 3 hidden units
    W2 = [[1.0, 0.0, 0.5], [0.0, 1.0, 0.5]]
    table = {"kind": "mlp", "W1": W1, "b1": [0.1, 0.2, 0.3], "W2": W2}
    cfg = resolve_config({**D2, "feedforward": {**table, "activation": "gelu"}})
    ff = build_field(cfg, jnp.float64).feedforward
    assert type(ff) is mf.MLP and ff.activation == "gelu" and ff.b2 is None
    np.testing.assert_array_equal(ff.W1, W1)
    np.testing.assert_array_equal(ff.b1, [0.1, 0.2, 0.3])
    np.testing.assert_array_equal(ff.W2, W2)
    # activation omitted: relu; numbers: c I (p = d) and (c, ..., c).
    raw = {**D2, "feedforward": {"kind": "mlp", "W1": 2.0, "W2": 1.0, "b2": -1.0}}
    cfg = resolve_config(raw)
    assert cfg["feedforward"]["activation"] == "relu"
    ff = build_field(cfg, jnp.float64).feedforward
    np.testing.assert_array_equal(ff.W1, 2 * np.eye(2))
    np.testing.assert_array_equal(ff.b2, [-1.0, -1.0])


def test_without_feedforward_the_field_is_the_attention():
    cfg = resolve_config(MASKED | {"attention": {"kind": "alibi", "slope": 1.0}})
    assert cfg["feedforward"] == {"kind": "none"}
    assert "frequencies" not in cfg["attention"]  # not a key of "alibi"
    assert type(build_field(cfg, jnp.float32)) is mf.ALiBiAttention
    assert type(build_attention(cfg, jnp.float32)) is mf.ALiBiAttention


def test_the_reference_lists_the_new_keys():
    page = config_reference.markdown()
    for key in [
        "attention.slope",
        "attention.frequencies",
        "feedforward.kind",
        "feedforward.W",
        "feedforward.b",
        "feedforward.W1",
        "feedforward.b1",
        "feedforward.W2",
        "feedforward.b2",
        "feedforward.activation",
    ]:
        assert f"| `{key}` |" in page, key
    assert '`"alibi"`, `"rope"`, `"hardmax"`' in page  # the families of `kind`


# ---- bad values: one line naming the key ----


def _att(masked=True, d=2, **table):
    return {"d": d, "masked": masked, "attention": table}


def _ff(**table):
    return {"d": 2, "feedforward": table}


W1 = [[1.0, 0.0]]  # p = 1 hidden unit in d = 2
BAD = [
    # Positional families need positions; Sinkhorn refuses them.
    (_att(False, kind="alibi", slope=1.0), "`masked` = true", "alibi"),
    (_att(False, kind="rope", frequencies=1.0), "`masked` = true", "rope"),
    (_att(kind="sinkhorn"), "`attention.kind`", "cannot be `masked`"),
    (_att(kind="alibi"), "`attention.slope`", "needs"),
    (_att(kind="alibi", slope="steep"), "`attention.slope`", "number"),
    (_att(False, slope=1.0), "`attention.slope`", '"softmax"'),
    (_att(kind="rope"), "`attention.frequencies`", "needs"),
    (_att(kind="rope", frequencies=[1.0, 2]), "`attention.frequencies`", "k/2 = 1"),
    (_att(kind="rope", frequencies="fast"), "`attention.frequencies`", "number"),
    (_att(d=3, kind="rope", frequencies=1.0), "`attention.frequencies`", "even `d`"),
    (
        _att(kind="rope", frequencies=1.0, Q=[[1.0, 0.0]] * 3, K=[[0.0, 1.0]] * 3),
        "`attention.frequencies`",
        "even rows of `attention.Q`",
    ),
    (_att(kind="rope", frequencies=1.0, A=1.0), "`attention.A`", "rope"),
    (_att(False, frequencies=1.0), "`attention.frequencies`", '"softmax"'),
    (_att(False, kind="hardmax", blocking="fused"), "`attention.blocking`", "fused"),
    # The [feedforward] table.
    (_ff(kind="relu"), "`feedforward.kind`", "none, affine, mlp"),
    (_ff(kind="affine"), "`feedforward.W`", "needs"),
    (_ff(kind="affine", W=[[1.0]]), "`feedforward.W`", "(2, 2)"),
    (_ff(kind="affine", W=1.0, b=[1.0]), "`feedforward.b`", "d = 2"),
    (_ff(kind="affine", W=1.0, b="x"), "`feedforward.b`", "number"),
    (_ff(kind="affine", W=1.0, W1=1.0), "`feedforward.W1`", '"affine"'),
    (_ff(W=1.0), "`feedforward.W`", '"none"'),
    (_ff(activation="gelu"), "`feedforward.activation`", '"none"'),
    (_ff(kind="mlp", W1=1.0), "`feedforward.W2`", "needs"),
    (_ff(kind="mlp", W1=W1, W2=1.0), "`feedforward.W2`", "(2, 1)"),
    (_ff(kind="mlp", W1=W1, W2=[[1.0]] * 2, b1=[0, 0]), "`feedforward.b1`", "p = 1"),
    (
        _ff(kind="mlp", W1=1.0, W2=1.0, activation="swish"),
        "`feedforward.activation`",
        "gelu",
    ),
    (_ff(kind="affine", W=1.0, bias=0.0), "`feedforward.bias`", "unknown"),
]


@pytest.mark.parametrize(("raw", "key", "what"), BAD)
def test_bad_values_are_one_line_naming_the_key(raw, key, what):
    with pytest.raises(ValueError) as info:
        resolve_config(raw)
    message = str(info.value)
    assert "\n" not in message
    assert key in message and what in message, message


def test_the_command_exits_2_with_the_line(tmp_path, capsys):
    config = tmp_path / "alibi.toml"
    config.write_text('[attention]\nkind = "alibi"\nslope = 1.0\n')
    code = main(["simulate", "--config", str(config), "--out", str(tmp_path / "o")])
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("meanfield simulate: error:") and "`masked` = true" in line
    assert not (tmp_path / "o").exists()


# ---- a run: the command's output is the run built in Python ----

BLOCK_RUN = """\
n = 8
d = 2
t1 = 1.0
saves = 5
segments = 1
normalization = "none"
initial = "gaussian"
dtype = "float64"
animation = "none"
masked = true

[attention]
kind = "alibi"
slope = 4.0
A = [[1.0, 0.5], [0.0, 2.0]]
V = 0.5

[feedforward]
kind = "affine"
W = [[-1.0, 0.3], [0.0, -0.5]]
b = [0.1, -0.2]
"""


def test_alibi_block_run_equals_the_same_run_in_python(tmp_path, capsys):
    config = tmp_path / "block.toml"
    config.write_text(BLOCK_RUN)
    out = tmp_path / "block"
    args = ["simulate", "--config", str(config), "--out", str(out), "--no-progress"]
    assert main([*args, "--seed", "3"]) == 0
    assert "status success" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["feedforward"]["kind"] == "affine"
    assert manifest["config"]["attention"]["slope"] == 4.0
    with np.load(out / "trajectory.npz") as data:
        x, ts = data["x"], data["ts"]
    n = 8
    # The same tokens, positions s_i = i/n, block and options, built by hand.
    measure = mf.MaskedParticles(x[0], np.arange(n) / n)
    attn = mf.ALiBiAttention(
        0.5 * np.eye(2), A=np.array([[1.0, 0.5], [0.0, 2.0]]), slope=4.0
    )
    ff = mf.FeedForward(np.array([[-1.0, 0.3], [0.0, -0.5]]), np.array([0.1, -0.2]))
    sol = mf.simulate(measure, mf.Block(attn, ff), 1.0, saveat=np.linspace(0, 1, 5))
    np.testing.assert_allclose(ts, sol.ts, rtol=1e-12)
    # One segment: the same adaptive steps, so equal up to rounding (1e-12).
    np.testing.assert_allclose(x, sol.x, rtol=0, atol=1e-12)
    # And the feed-forward term moved the tokens: not the attention alone.
    alone = mf.simulate(measure, attn, 1.0, saveat=np.linspace(0, 1, 5))
    assert np.abs(np.asarray(alone.x[-1]) - x[-1]).max() > 1e-2
