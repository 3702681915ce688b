"""Checkers of TOML configurations for the command line.

Each returns the validated value (plain Python) or raises ValueError whose
one-line message names the key, so the CLI can print it and exit with status 2.
"""

import math


def short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_number(value) -> bool:
    # bool is an int subclass; `true` in a config is not a number.
    return isinstance(value, int | float) and not isinstance(value, bool)


def number(value, key: str, *, positive: bool = False) -> float:
    if not is_number(value) or not math.isfinite(value):
        raise ValueError(f"`{key}` must be a finite number; got {short(value)}.")
    if positive and not value > 0:
        raise ValueError(f"`{key}` must be positive; got {value!r}.")
    return float(value)


def matrix(value, key: str, rows: int | None, cols: int) -> list[list[float]]:
    """A list of lists of numbers with the given shape (rows None: any >= 1)."""
    ok = (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(row, list) for row in value)
        and all(is_number(v) and math.isfinite(v) for row in value for v in row)
    )
    if not ok:
        raise ValueError(
            f"`{key}` must be a matrix (a list of lists of finite numbers); "
            f"got {short(value)}."
        )
    lengths = sorted({len(row) for row in value})
    want_rows = "k" if rows is None else rows
    if (rows is not None and len(value) != rows) or lengths != [cols]:
        got = (
            f"shape ({len(value)}, {lengths[0]})"
            if len(lengths) == 1
            else f"rows of lengths {lengths}"
        )
        raise ValueError(f"`{key}` must have shape ({want_rows}, {cols}); got {got}.")
    return [[float(v) for v in row] for row in value]


def check_keys(config, allowed, table: str | None) -> None:
    """Unknown keys of the top level (table None) or of a [table]."""
    where = "the configuration" if table is None else f"the [{table}] table"
    if not isinstance(config, dict):
        name = "the configuration" if table is None else f"`{table}`"
        raise ValueError(f"{name} must be a table; got {short(config)}.")
    for key in config:
        if key not in allowed:
            name = key if table is None else f"{table}.{key}"
            raise ValueError(
                f"unknown key `{name}` in {where}; expected one of "
                f"{', '.join(allowed)}."
            )


def integer(value, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"`{key}` must be an integer >= {minimum}; got {short(value)}."
        )
    return value


def int_list(value, key: str, minimum: int, min_len: int = 1) -> list[int]:
    """A strictly increasing list of at least `min_len` integers >= `minimum`."""
    ok = (
        isinstance(value, list)
        and len(value) >= min_len
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and all(v >= minimum for v in value)
        and all(a < b for a, b in zip(value, value[1:], strict=False))
    )
    if not ok:
        raise ValueError(
            f"`{key}` must be a strictly increasing list of at least {min_len} "
            f"integers >= {minimum}; got {short(value)}."
        )
    return list(value)


def square(value, key: str) -> list[list[float]]:
    first = value[0] if isinstance(value, list) and value else None
    rows = matrix(value, key, None, len(first) if isinstance(first, list) else 0)
    if len(rows) != len(rows[0]):
        raise ValueError(
            f"`{key}` must be square (d, d); got shape ({len(rows)}, {len(rows[0])})."
        )
    return rows
