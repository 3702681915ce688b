"""Input checks of the clustering functions: points, weights, trajectories.

Clustering runs on the host, so inputs become concrete float64 NumPy arrays here;
malformed ones raise `ValueError` naming the argument.
"""

import numpy as np


def check_points(x, name: str = "x") -> np.ndarray:
    """The points as a finite float64 array of shape (n, d), n, d >= 1."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"`{name}` must have shape (n, d), n, d >= 1; got {x.shape}.")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"`{name}` must be finite; got NaN or inf entries.")
    return x


def check_positive(value, name: str) -> float:
    """`value` as a positive finite float; `name` is the argument in the message."""
    try:
        value = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"`{name}` must be a positive number; got {value!r}.") from err
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"`{name}` must be positive and finite; got {value}.")
    return value


def check_weights(weights, n: int) -> np.ndarray:
    """Point masses (n,) as finite nonnegative float64; None means uniform 1/n."""
    if weights is None:
        return np.full(n, 1 / n)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"`weights` must have shape ({n},); got {w.shape}.")
    if not (np.all(np.isfinite(w)) and np.all(w >= 0)):
        raise ValueError("`weights` must be finite and nonnegative.")
    return w


def check_trajectory(ts, x, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(ts (T,), x (T, n, d)) as float64 arrays, checked against each other."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3 or 0 in x.shape:
        raise ValueError(
            f"`{name}` positions must have shape (T, n, d); got {x.shape}."
        )
    ts = np.arange(x.shape[0], dtype=np.float64) if ts is None else np.asarray(ts)
    ts = ts.astype(np.float64)
    if ts.shape != x.shape[:1]:
        raise ValueError(
            f"`ts` must have shape ({x.shape[0]},) to match `{name}`; got {ts.shape}."
        )
    return ts, x
