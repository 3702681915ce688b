"""Smoke test of an installed wheel, run in a fresh venv by `make wheel-check`.

It runs from outside the checkout, so `meanfield` is the installed package:
import, one particle solve, one Gaussian blow-up study, the persistent
compilation cache storing programs with no warning, and every command's --help.
"""

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import warnings
    warnings.simplefilter("error")  # a warning anywhere fails the smoke test
    import jax, jax.numpy as jnp
    import meanfield as mf

    assert "site-packages" in mf.__file__, mf.__file__
    x = jax.random.normal(jax.random.key(0), (32, 3))
    attn = mf.SoftmaxAttention(jnp.eye(3), A=jnp.eye(3))
    sol = mf.simulate(mf.Particles(x), attn, 2.0, normalization="sphere")
    assert sol.status == "success", sol.status
    g = mf.Gaussian(jnp.zeros(2), jnp.eye(2))
    As = jax.random.normal(jax.random.key(1), (8, 2, 2))
    attns = jax.vmap(lambda A: mf.SoftmaxAttention(jnp.eye(2), A=A))(As)
    study = mf.gaussian.blowup_times(g, {"softmax": attns}, 2.0)
    assert study.times["softmax"].shape == (8,)
    print("ok", sol.status, study.classes("softmax"))
    """
)


def main() -> None:
    """Run the checks; exit non-zero with the reason on the first failure."""
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        env = dict(os.environ, MEANFIELD_COMPILATION_CACHE=str(cache))
        run = subprocess.run(
            [sys.executable, "-c", SCRIPT],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
        )
        print(run.stdout, end="")
        if run.returncode:
            sys.exit(f"the smoke script failed:\n{run.stderr[-3000:]}")
        noise = [line for line in run.stderr.splitlines() if line.strip()]
        if noise:
            sys.exit(
                "the smoke script wrote to stderr (a warning?):\n"
                + "\n".join(noise[-20:])
            )
        entries = [p for p in cache.rglob("*") if p.is_file()]
        if not entries:
            sys.exit(f"the compilation cache {cache} stored nothing")
        print(f"compilation cache: {len(entries)} files")
        meanfield = Path(sys.executable).with_name("meanfield")
        for command in (
            "",
            "demo",
            "simulate",
            "gaussian",
            "lipschitz",
            "phase",
            "density",
            "bench",
        ):
            argv = [str(meanfield), *command.split(), "--help"]
            run = subprocess.run(argv, cwd=tmp, capture_output=True, text=True)
            if run.returncode or "usage" not in run.stdout:
                sys.exit(f"{' '.join(argv[1:])} failed:\n{run.stdout}{run.stderr}")
        print("every command's --help: ok")


if __name__ == "__main__":
    main()
