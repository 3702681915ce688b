"""Parameter keys of the `[attention]` and `[feedforward]` tables of `simulate`.

A matrix key takes a number c for c I or a list of rows (`param`), a vector key
a number c for c (1, ..., 1) or a list of numbers (`vector`); `as_matrix` and
`as_vector` turn the resolved value into an array. `only_for` makes a key belong
to some kinds of its table: given for another kind it is an error, not ignored.
Nothing here imports JAX.
"""

import math
from collections.abc import Callable

import numpy as np

from . import config as _config
from .config import is_number, matrix, number, short


def param(rows, cols) -> _config.Check:
    """A number c (meaning c I) or a matrix of shape (rows, cols) (rows None: any).

    `rows` and `cols` are ints, None, or functions of the values resolved so far.
    """
    as_matrix_ = matrix(rows, cols)

    def check(value, key, cfg):
        if is_number(value):
            r = rows(cfg) if callable(rows) else rows
            c = cols(cfg) if callable(cols) else cols
            if r is not None and r != c:
                raise ValueError(f"`{key}` must be a ({r}, {c}) matrix; got a number.")
            return number()(value, key, cfg)
        return as_matrix_(value, key, cfg)

    return check


def vector(size: Callable[[dict], int], label: str) -> _config.Check:
    """A number c (meaning (c, ..., c)) or a list of `size(cfg)` finite numbers.

    `label` names the length in messages ("d", "p", "k/2").
    """

    def check(value, key, cfg):
        n = size(cfg)
        if is_number(value):
            return number()(value, key, cfg)
        ok = isinstance(value, list) and all(
            is_number(v) and math.isfinite(v) for v in value
        )
        if not ok:
            raise ValueError(
                f"`{key}` must be a number or a list of {label} = {n} finite "
                f"numbers; got {short(value)}."
            )
        if len(value) != n:
            raise ValueError(
                f"`{key}` must have {label} = {n} entries; got {len(value)}."
            )
        return [float(v) for v in value]

    return check


def only_for(
    table: str, takes: Callable[[str], bool], check: _config.Check
) -> _config.Check:
    """`check` for a key of the kinds `k` of `[table]` with `takes(k)`; None stays.

    The table's `kind` must be resolved before the key (it comes first).
    """

    def wrapped(value, key, cfg):
        if value is None:
            return None
        kind = cfg["kind"]
        if not takes(kind):
            raise ValueError(f'`{key}` does not apply to `{table}.kind` = "{kind}".')
        return check(value, key, cfg)

    return wrapped


def as_matrix(value, d: int) -> np.ndarray:
    """A resolved matrix parameter: a list of rows as is, a number c as c I_d."""
    if isinstance(value, list):
        return np.asarray(value, np.float64)
    return value * np.eye(d)


def as_vector(value, size: int) -> np.ndarray:
    """A resolved vector parameter: a list as is, a number c as c (1, ..., 1)."""
    if isinstance(value, list):
        return np.asarray(value, np.float64)
    return np.full(size, float(value))
