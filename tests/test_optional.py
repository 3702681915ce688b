"""A bare accelerator image: meanfield without POT, ott-jax, tokenizers, pykeops.

The lent GPU machines carry JAX, diffrax, NumPy, SciPy, matplotlib... but none of
the optional packages. A fresh interpreter that cannot import them (their names
are None in `sys.modules`, so any import raises ImportError) must still import
every module of meanfield and run the engine; the exact and entropic W_p and the
tokenizer must raise ImportError naming the package and the extra.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from meanfield import _optional

BLOCKED = ("ot", "ott", "tokenizers", "pykeops")

SCRIPT = textwrap.dedent(
    """
    import json, pkgutil, sys, importlib
    for name in BLOCKED:
        sys.modules[name] = None          # `import name` raises ImportError

    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    import meanfield as mf

    # The fused kernel's Pallas loads only when a "fused" field runs.
    a = mf.SoftmaxAttention(jnp.eye(2), A=jnp.eye(2))
    a.velocity(mf.Particles(jnp.ones((3, 2))))
    pallas_loaded = "jax.experimental.pallas" in sys.modules

    modules = [
        m.name
        for m in pkgutil.walk_packages(mf.__path__, "meanfield.")
        if not m.name.endswith("__main__")  # running it would start the CLI
    ]
    for name in modules:
        importlib.import_module(name)

    x = jax.random.normal(jax.random.key(0), (64, 3))
    mu = mf.Particles(x / jnp.linalg.norm(x, axis=1, keepdims=True))
    attn = mf.SoftmaxAttention(jnp.eye(3), A=2 * jnp.eye(3))
    sol = mf.simulate(mu, attn, 1.0, normalization="sphere")
    lip = mf.lipschitz.local(attn, mu.x)
    g = mf.Gaussian(jnp.zeros(2), jnp.eye(2))
    w2 = float(mf.wasserstein.gaussian_w2(g, g))

    errors = {}
    nu = mf.Particles(x[:32])
    calls = {
        "exact": lambda: mf.wasserstein.distance(mu, nu),
        "sinkhorn": lambda: mf.wasserstein.distance(mu, nu, method="sinkhorn"),
        "tokenize": lambda: mf.bert.tokenize("a", "tokenizer.json"),
    }
    for what, call in calls.items():
        try:
            call()
            errors[what] = None
        except ImportError as err:
            errors[what] = str(err)
    print(json.dumps(dict(
        modules=len(modules), status=sol.status, pallas_loaded=pallas_loaded,
        lip=float(lip.value), w2=w2,
        errors=errors,
        loaded=sorted(n for n in BLOCKED if sys.modules.get(n) is not None),
    )))
    """
)


def test_optional_packages_are_named_with_their_extra(monkeypatch):
    # An installed module is returned as imported (json stands in for one, so
    # the check runs without the extras too).
    monkeypatch.setitem(_optional.OPTIONAL, "json", ("json", "none"))
    assert _optional.require("json", "test") is sys.modules["json"]
    for module, (package, extra) in _optional.OPTIONAL.items():
        monkeypatch.setitem(sys.modules, module, None)
        with pytest.raises(ImportError, match=rf"^Why needs the `{package}`") as err:
            _optional.require(f"{module}.sub", "Why")
        assert f"pip install 'meanfield[{extra}]'" in str(err.value)


def test_bare_image_imports_everything_but_the_optional_parts():
    script = f"BLOCKED = {BLOCKED!r}\n" + SCRIPT
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["modules"] > 60
    assert got["loaded"] == []
    assert got["pallas_loaded"] is False
    assert got["status"] == "success"
    assert got["lip"] > 0 and got["w2"] == 0.0
    errors = got["errors"]
    assert "`pot`" in errors["exact"] and "meanfield[ot]" in errors["exact"]
    assert "`ott-jax`" in errors["sinkhorn"] and "meanfield[ot]" in errors["sinkhorn"]
    assert "`tokenizers`" in errors["tokenize"]
    assert "meanfield[real-model]" in errors["tokenize"]
