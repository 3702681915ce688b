"""Naive O(n^2) NumPy references (explicit double loops) and shared fixtures."""

import importlib.util
import re
from typing import NamedTuple

import numpy as np
import pytest

import meanfield as mf
from meanfield._optional import OPTIONAL

#: Optional module -> (the PyPI package, the meanfield extra that installs it):
#: the library's optional imports, and griffe (the docs' build, extra `docs`).
EXTRAS = {**OPTIONAL, "griffe": ("griffe", "docs")}


def requires(*modules: str) -> pytest.MarkDecorator:
    """Skip a test where one of `modules` is not installed, naming its extra.

    `pip install ".[dev]"` installs none of them: the suite must pass there too.
    """
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    reasons = [
        f"`{EXTRAS[m][0]}` not installed (pip install 'meanfield[{EXTRAS[m][1]}]')"
        for m in missing
    ]
    return pytest.mark.skipif(bool(missing), reason="; ".join(reasons) or "installed")


#: The ImportError of `meanfield._optional.require` for a package not installed.
MISSING_PACKAGE = re.compile(
    r"needs the `[\w.-]+` package, which is not installed.*?"
    r"(pip install 'meanfield\[[\w-]+\]')"
)


def skip_if_an_extra_is_missing(text: str) -> None:
    """Skip when `text` (an error, a child's stderr) is meanfield's ImportError
    for an optional package that is not installed: code that needs an extra."""
    found = MISSING_PACKAGE.search(text)
    if found:
        pytest.skip(f"needs an optional package: {found[1]}")


def _bilinear(x_i, x_j, A=None, Q=None, K=None):
    if A is not None:
        return float(np.dot(A @ x_i, x_j))
    return float(np.dot(Q @ x_i, K @ x_j))


def normalised_velocity_numpy(
    z, x, w, V, log_kernel, query_pos=None, key_pos=None, out=None
):
    """Gamma(z_i) = sum_j w_j k(z_i, x_j) V x_j / sum_j w_j k(z_i, x_j), double loop."""
    m, n = z.shape[0], x.shape[0]
    result = np.zeros_like(z)
    for i in range(m):
        logs, visible = [], []
        for j in range(n):
            if query_pos is not None and key_pos[j] > query_pos[i]:
                continue
            if w[j] == 0:
                continue
            logs.append(log_kernel(z[i], x[j]) + np.log(w[j]))
            visible.append(j)
        if not visible:
            continue
        logs = np.array(logs)
        p = np.exp(logs - logs.max())
        p /= p.sum()
        for pj, j in zip(p, visible, strict=True):
            result[i] += pj * (V @ x[j])
    return result


def softmax_velocity_numpy(z, x, w, V, A=None, Q=None, K=None, **mask):
    return normalised_velocity_numpy(
        z, x, w, V, lambda a, b: _bilinear(a, b, A, Q, K), **mask
    )


def l2_velocity_numpy(z, x, w, V, Q, K, **mask):
    return normalised_velocity_numpy(
        z, x, w, V, lambda a, b: -float(np.sum((Q @ a - K @ b) ** 2)), **mask
    )


def ill_posed_velocity_numpy(z, x, w, V, kernel, A, query_pos=None, key_pos=None):
    """Gamma(z_i) = sum_j w_j k(<A z_i, x_j>) V x_j, double loop."""
    result = np.zeros_like(z)
    for i in range(z.shape[0]):
        for j in range(x.shape[0]):
            if query_pos is not None and key_pos[j] > query_pos[i]:
                continue
            result[i] += w[j] * kernel(float(np.dot(A @ z[i], x[j]))) * (V @ x[j])
    return result


KERNELS = {
    "unnormalized": np.exp,
    "linear": lambda s: s,
    "relu": lambda s: max(s, 0.0),
    "sigmoid": lambda s: 1 / (1 + np.exp(-s)),
}


def sinkhorn_numpy(x, w, log_kernel, tol=1e-13, max_iter=100_000):
    """Log-domain Sinkhorn on the self-coupling (plain loops over i, j).

    Returns (f, g, logits) with sum_j w_j e^{l_ij + f_i + g_j} = 1 (rows, exact) and
    columns summing to 1 within tol.
    """
    n = x.shape[0]
    logits = np.array([[log_kernel(x[i], x[j]) for j in range(n)] for i in range(n)])
    log_w = np.log(w)
    g = np.zeros(n)
    for _ in range(max_iter):
        a = logits + (g + log_w)[None, :]
        f = -(a.max(1) + np.log(np.exp(a - a.max(1, keepdims=True)).sum(1)))
        b = logits + (f + log_w)[:, None]
        g_new = -(b.max(0) + np.log(np.exp(b - b.max(0, keepdims=True)).sum(0)))
        done = np.max(np.abs(g_new - g)) < tol
        g = g_new
        if done:
            break
    a = logits + (g + log_w)[None, :]
    f = -(a.max(1) + np.log(np.exp(a - a.max(1, keepdims=True)).sum(1)))
    return f, g, logits


def sinkhorn_velocity_numpy(x, w, V, log_kernel):
    f, g, logits = sinkhorn_numpy(x, w, log_kernel)
    n = x.shape[0]
    result = np.zeros_like(x)
    for i in range(n):
        for j in range(n):
            result[i] += w[j] * np.exp(logits[i, j] + f[i] + g[j]) * (V @ x[j])
    return result


class ExampleParams(NamedTuple):
    """Parameters the examples of `FAMILY_EXAMPLES` are built from."""

    V: np.ndarray  # (d, d)
    A: np.ndarray  # (d, d)
    Q: np.ndarray  # (k, d)
    K: np.ndarray  # (k, d)
    W: np.ndarray  # (3, d, d): output matrices of multi-head examples


def example_params(d: int, dtype=np.float64, seed: int = 0) -> ExampleParams:
    """Random parameters of O(1) size (A, Q, K scaled by 0.5: moderate logits)."""
    rng = np.random.default_rng(seed)
    V, A, Q, K = (rng.normal(size=(d, d)) for _ in range(4))
    W = rng.normal(size=(3, d, d)) / np.sqrt(d)
    return ExampleParams(*(M.astype(dtype) for M in (V, 0.5 * A, 0.5 * Q, 0.5 * K, W)))


def _nested_multihead(p: ExampleParams) -> mf.MultiHeadAttention:
    inner = mf.MultiHeadAttention(
        [mf.SoftmaxAttention(p.V, A=p.A), mf.L2Attention(p.V, Q=p.Q, K=p.K)],
        out=[p.W[0], p.W[1]],
    )
    return mf.MultiHeadAttention(
        [inner, mf.SoftmaxAttention(p.V, A=p.A.T)],
        out=[p.W[2], np.eye(p.V.shape[0], dtype=p.V.dtype)],
    )


#: The test constructors of every attention family: registered name -> {variant ->
#: ExampleParams -> attention}. tests/test_families.py runs its invariants on every
#: entry and fails for a registered family that has none; "multihead" is the
#: combinator (not registered), tested with the families.
FAMILY_EXAMPLES = {
    "softmax": {
        "A": lambda p: mf.SoftmaxAttention(p.V, A=p.A),
        "QK": lambda p: mf.SoftmaxAttention(p.V, Q=p.Q, K=p.K),
    },
    "l2": {"QK": lambda p: mf.L2Attention(p.V, Q=p.Q, K=p.K)},
    "sinkhorn": {
        "dot": lambda p: mf.SinkhornAttention(p.V, A=p.A),
        "l2": lambda p: mf.SinkhornAttention(p.V, Q=p.Q, K=p.K, kernel="l2"),
    },
    "unnormalized": {"A": lambda p: mf.UnnormalizedAttention(p.V, A=p.A)},
    "linear": {"A": lambda p: mf.LinearAttention(p.V, A=p.A)},
    "relu": {"A": lambda p: mf.ReLUAttention(p.V, A=p.A)},
    "sigmoid": {"A": lambda p: mf.SigmoidAttention(p.V, A=p.A)},
    "hardmax": {
        "A": lambda p: mf.HardmaxAttention(p.V, A=p.A),
        "QK-blocked": lambda p: mf.HardmaxAttention(
            p.V, Q=p.Q, K=p.K, blocking="blocked", block_size=2
        ),
    },
    "alibi": {"A": lambda p: mf.ALiBiAttention(p.V, A=p.A, slope=1.5)},
    "unnormalized_alibi": {
        "A": lambda p: mf.UnnormalizedALiBiAttention(p.V, A=p.A, slope=1.5),
        "strict": lambda p: mf.UnnormalizedALiBiAttention(
            p.V, A=p.A, slope=1.5, include_self=False
        ),
    },
    "rope": {
        "QK": lambda p: mf.RoPEAttention(
            p.V, Q=p.Q[:2], K=p.K[:2], frequencies=np.array([2.0], p.Q.dtype)
        )
    },
    "multihead": {
        "softmax+l2": lambda p: mf.MultiHeadAttention(
            [mf.SoftmaxAttention(p.V, A=p.A), mf.L2Attention(p.V, Q=p.Q, K=p.K)]
        ),
        "nested+out": _nested_multihead,
    },
}
#: Entries of FAMILY_EXAMPLES that combine families rather than being one.
COMBINATORS = ("multihead",)
#: Families whose kernel reads the token positions: they need `MaskedParticles`,
#: so the invariants on plain particles skip them (tests/test_positional.py).
POSITIONAL = ("alibi", "rope", "unnormalized_alibi")
