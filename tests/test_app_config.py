"""Command configuration schemas; attention families read from the registry."""

import json
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

from meanfield._app import bench_config, config, simulate_config
from meanfield._app.report import Output
from meanfield._attention.base import AbstractAttention
from meanfield._attention.registry import FAMILIES

SCHEMA = {
    "n": config.Key(config.integer(2), 8),
    "Q": config.Key(config.matrix(None, 2), [[1.0, 0.0]]),
    "K": config.Key(config.matrix(lambda cfg: len(cfg["Q"]), 2), [[0.0, 1.0]]),
    "inner": {
        # Omitted: twice n, read from the enclosing table.
        "m": config.Key(config.or_else(lambda cfg: 2 * cfg["n"], config.integer(0))),
        "mode": config.Key(config.choice(("a", "b")), "a"),
    },
}


def test_resolve_fills_defaults_in_schema_order_and_derives_from_earlier_keys():
    got = config.resolve(SCHEMA, {"n": 3, "inner": {"mode": "b"}})
    assert got == {
        "n": 3,
        "Q": [[1.0, 0.0]],
        "K": [[0.0, 1.0]],
        "inner": {"m": 6, "mode": "b"},
    }
    assert list(got) == list(SCHEMA)
    assert config.defaults(SCHEMA)["inner"] == {"m": None, "mode": "a"}
    quick = config.with_defaults(SCHEMA, {"n": 2})
    assert config.resolve(quick, None)["inner"]["m"] == 4


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"x": 1}, "unknown key `x` in the configuration; expected one of n, Q, K"),
        ({"inner": {"y": 1}}, "unknown key `inner.y` in the [inner] table"),
        ({"inner": 3}, "`inner` must be a table; got 3."),
        ({"n": True}, "`n` must be an integer >= 2; got True."),
        ({"inner": {"mode": "c"}}, "`inner.mode` must be one of a, b; got 'c'."),
        ({"Q": [[1.0, 0.0]] * 2}, "`K` must have shape (2, 2); got shape (1, 2)."),
        ({"inner": {"m": -1}}, "`inner.m` must be an integer >= 0"),
    ],
)
def test_resolve_errors_name_the_key_and_the_expectation(raw, message):
    with pytest.raises(ValueError) as err:
        config.resolve(SCHEMA, raw)
    assert message in str(err.value)


def test_bench_options_command_line_over_toml_over_quick_defaults(tmp_path):
    toml = tmp_path / "bench.toml"
    toml.write_text('ns = [64, 32]\nrepeats = 2\nimpls = ["numpy"]\nmax_seconds = 5\n')
    argv = ["--quick", "--config", str(toml), "--repeats", "4", "--ns", "2^7"]
    args = bench_config.parse(argv, "test")
    assert args.ns == [128] and args.repeats == 4  # the command line wins
    assert args.impls == ["numpy"] and args.max_seconds == 5.0  # then the TOML
    assert args.ds == [2, 16] and args.solve_steps == 3  # then --quick's defaults
    assert args.block_size == 512
    full = bench_config.parse([], "test")
    assert full.ns[-1] == 2**20 and full.impls == list(bench_config.DEFAULT_IMPLS)
    toml.write_text('impls = ["torch"]\n')
    with pytest.raises(ValueError, match="`impls` must be a non-empty list of names"):
        bench_config.parse(["--config", str(toml)], "test")
    with pytest.raises(ValueError, match="`repeats` must be an integer >= 1"):
        bench_config.parse(["--repeats", "0"], "test")


def test_output_writes_atomically_and_logs_only_with_progress(tmp_path, capsys):
    out = Output(tmp_path / "a" / "b", progress=False)
    out.log("hidden")
    out.json("x.json", {"v": np.float64(np.inf), "a": np.arange(2)})
    assert json.loads((tmp_path / "a" / "b" / "x.json").read_text()) == {
        "v": "inf",
        "a": [0, 1],
    }
    Output(tmp_path, progress=True).log("shown")
    assert capsys.readouterr().err == "shown\n"
    assert not list(tmp_path.rglob(".*tmp*"))


# ---- attention families come from the registry ----


class _MeanField(AbstractAttention):
    """Gamma_mu(z) = scale V mean(mu): a toy family with its own keywords."""

    V: jnp.ndarray
    scale: float = eqx.field(static=True)
    blocking: str = eqx.field(static=True)
    normalised: ClassVar[bool] = True

    def __init__(self, V, *, scale: float = 1.0, blocking: str = "auto"):
        self.V, self.scale, self.blocking = jnp.asarray(V), scale, blocking

    def _evaluate(self, measure, z, positions, t):
        mean = measure.weights @ measure.x
        vel = jnp.broadcast_to(self.scale * (self.V @ mean), z.shape)
        return vel, jnp.array(True)


class _NeedsHeads(AbstractAttention):
    """A family whose constructor needs a keyword no configuration key gives."""

    V: jnp.ndarray
    heads: int = eqx.field(static=True)
    normalised: ClassVar[bool] = True

    def __init__(self, V, *, heads: int):
        self.V, self.heads = jnp.asarray(V), heads

    def _evaluate(self, measure, z, positions, t):
        return jnp.zeros_like(z), jnp.array(True)


@pytest.fixture
def toy_families():
    FAMILIES["toy_mean"] = _MeanField
    FAMILIES["toy_heads"] = _NeedsHeads
    yield
    del FAMILIES["toy_mean"], FAMILIES["toy_heads"]


def test_a_newly_registered_family_works_in_a_configuration(toy_families):
    raw = {"d": 2, "masked": True, "attention": {"kind": "toy_mean", "V": 2.0}}
    cfg = simulate_config.resolve_config(raw)
    att = cfg["attention"]
    # It takes no A, Q or K: none is made up; `blocking` is what it takes.
    assert not {"A", "Q", "K"} & set(att) and att["blocking"] == "auto"
    attn = simulate_config.build_attention(cfg, jnp.float64)
    assert isinstance(attn, _MeanField) and attn.blocking == "auto"
    np.testing.assert_array_equal(attn.V, 2 * np.eye(2))
    with pytest.raises(ValueError, match="`attention.A` does not apply"):
        simulate_config.resolve_config({"attention": {"kind": "toy_mean", "A": 1.0}})
    with pytest.raises(ValueError, match='`attention.kind` = "toy_heads" needs heads'):
        simulate_config.resolve_config({"attention": {"kind": "toy_heads"}})


#: What a positional family needs beyond its defaults: positions and its own key.
POSITIONAL_KEYS = {
    "alibi": {"slope": 1.0},
    "unnormalized_alibi": {"slope": 1.0},
    "rope": {"frequencies": 1.0},
}


def test_every_registered_family_builds_from_its_defaults():
    for kind, cls in FAMILIES.items():
        extra = POSITIONAL_KEYS.get(kind)
        config = {"d": 2, "attention": {"kind": kind, **(extra or {})}}
        if extra is not None:
            config["masked"] = True
        cfg = simulate_config.resolve_config(config)
        assert type(simulate_config.build_attention(cfg, jnp.float32)) is cls
    with pytest.raises(ValueError, match="`attention.kind` must be one of softmax"):
        simulate_config.resolve_config({"attention": {"kind": "cosine"}})
