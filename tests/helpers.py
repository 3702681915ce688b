"""Naive O(n^2) NumPy references (explicit double loops) and shared fixtures."""

import numpy as np


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
