"""Configuration schemas of the commands: key -> (checker, default), one resolver.

A command declares its TOML keys once, as a schema: a dict from each key to a
`Key(check, default, doc=...)` or, for a `[table]`, to a nested schema.
`resolve(schema, raw)` rejects unknown keys, fills in the defaults and runs every
checker in the schema's order. A checker is called as `check(value, name, cfg)`:
`name` is the key as the user writes it (`search.steps` inside `[search]`) and
`cfg` holds the values resolved before it (outer tables included), so a key can
depend on another (`K` has as many rows as `Q`; `dt0` is required by
`solver = "euler"`). `doc` is the key's line in the command-line reference.

Every error is a ValueError with a one-line message that names the key, what was
expected and what was got; the command line prints it and exits with status 2.
The checker factories below (`number`, `integer`, `choice`, `matrix`, ...) build
the usual checkers. Nothing here imports JAX.
"""

import dataclasses
import math
from collections import ChainMap
from collections.abc import Callable, Collection, Mapping
from typing import Any, Union

#: A checker: (value, key name, values resolved so far) -> the validated value.
Check = Callable[[Any, str, Mapping[str, Any]], Any]


@dataclasses.dataclass(frozen=True)
class Key:
    """One configuration key.

    Attributes:
        check: validates the value (the default too) and returns it as plain
            Python (floats, ints, lists); raises ValueError naming the key.
        default: the value of an omitted key; None marks a key whose checker
            decides what omission means (derived default, optional, required).
        doc: one line for the user: what the key means, its unit or range, its
            allowed values and, for a None default, what omitting it means (the
            command-line reference, `config_reference`, prints it).
    """

    check: Check
    default: Any = None
    doc: str = dataclasses.field(default="", kw_only=True)


#: key -> `Key`, or -> a nested schema for a `[table]`.
Schema = Mapping[str, Union[Key, "Schema"]]


def resolve(
    schema: Schema,
    raw: Mapping[str, Any] | None,
    *,
    table: str | None = None,
    outer: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Validate a configuration against a schema and fill in the defaults.

    Args:
        schema: the command's keys (see the module docstring).
        raw: the user's configuration (parsed TOML); None for all defaults.
        table: the dotted name of the table `raw` is, None at the top level.
        outer: values resolved in the enclosing tables (seen by the checkers).

    Returns:
        The full configuration, every key of the schema present, in its order.

    Raises:
        ValueError: unknown key, wrong type or bad value; the message (one line)
            names the key.
    """
    raw = {} if raw is None else raw
    check_keys(raw, schema, table)
    out: dict[str, Any] = {}
    seen = out if outer is None else ChainMap(out, outer)
    for key, spec in schema.items():
        name = key if table is None else f"{table}.{key}"
        if isinstance(spec, Key):
            out[key] = spec.check(raw.get(key, spec.default), name, seen)
        else:
            out[key] = resolve(spec, raw.get(key, {}), table=name, outer=seen)
    return out


def load_toml(path: str) -> dict[str, Any]:
    """Parse a TOML file.

    Args:
        path: the file.

    Returns:
        Its tables as dicts.

    Raises:
        ValueError: unreadable file, not UTF-8 or invalid TOML (a one-line message
            naming the file).
    """
    import tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as err:
        raise ValueError(
            f"cannot read config file {path!r}: {err.strerror or err}"
        ) from err
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"invalid TOML in {path!r}: {err}") from err
    except UnicodeDecodeError as err:  # TOML is UTF-8; the codec's text names no file
        raise ValueError(
            f"config file {path!r} is not UTF-8 text (as TOML must be): byte "
            f"0x{err.object[err.start]:02x} at position {err.start}; save it as UTF-8"
        ) from err


def defaults(schema: Schema) -> dict[str, Any]:
    """The defaults of a schema, nested like the configuration (None: derived)."""
    return {
        key: spec.default if isinstance(spec, Key) else defaults(spec)
        for key, spec in schema.items()
    }


def with_defaults(schema: Schema, values: Mapping[str, Any]) -> dict[str, Any]:
    """The schema with other defaults for some top-level keys (e.g. a quick run)."""
    return {
        key: dataclasses.replace(spec, default=values[key]) if key in values else spec
        for key, spec in schema.items()
    }


def check_keys(config: Any, allowed: Collection[str], table: str | None) -> None:
    """Reject a non-table, or unknown keys of the top level (table None) or a table.

    Args:
        config: the parsed configuration or table.
        allowed: its known keys.
        table: the table's dotted name, None at the top level.

    Raises:
        ValueError: `config` is not a table, or has a key not in `allowed`.
    """
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


def short(value: Any) -> str:
    """`repr(value)`, cut to 60 characters for one-line messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (`true` in a configuration is not a number)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def one_of(options: Collection[str]) -> str:
    """String options as a key's `doc` writes them: `"a"`, `"b"` or `"c"`."""
    quoted = [f'`"{option}"`' for option in options]
    return (
        ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else quoted[0]
    )


# ---- checker factories --------------------------------------------------------


def number(*, positive: bool = False) -> Check:
    """A finite number (as float); with `positive`, > 0."""

    def check(value, key, cfg):
        if not is_number(value) or not math.isfinite(value):
            raise ValueError(f"`{key}` must be a finite number; got {short(value)}.")
        if positive and not value > 0:
            raise ValueError(f"`{key}` must be positive; got {value!r}.")
        return float(value)

    return check


def integer(minimum: int, maximum: int | None = None) -> Check:
    """An integer >= `minimum` (and <= `maximum`, if given)."""

    def check(value, key, cfg):
        ok = (
            isinstance(value, int)
            and not isinstance(value, bool)
            and value >= minimum
            and (maximum is None or value <= maximum)
        )
        if not ok:
            want = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise ValueError(f"`{key}` must be an integer {want}; got {short(value)}.")
        return value

    return check


def boolean() -> Check:
    """A boolean: `true` or `false` in TOML."""

    def check(value, key, cfg):
        if not isinstance(value, bool):
            raise ValueError(f"`{key}` must be true or false; got {short(value)}.")
        return value

    return check


def choice(options: Collection[str]) -> Check:
    """One of `options` (read at each check: a registry may grow)."""

    def check(value, key, cfg):
        if not isinstance(value, str) or value not in options:
            raise ValueError(
                f"`{key}` must be one of {', '.join(map(str, options))}; "
                f"got {short(value)}."
            )
        return value

    return check


def names(options: Collection[str]) -> Check:
    """A non-empty list of names from `options`."""

    def check(value, key, cfg):
        ok = (
            isinstance(value, list)
            and len(value) > 0
            and all(isinstance(v, str) and v in options for v in value)
        )
        if not ok:
            raise ValueError(
                f"`{key}` must be a non-empty list of names from "
                f"{', '.join(options)}; got {short(value)}."
            )
        return list(value)

    return check


def int_list(minimum: int, *, min_len: int = 1, increasing: bool = True) -> Check:
    """A list of at least `min_len` integers >= `minimum`, strictly increasing."""

    def check(value, key, cfg):
        ok = (
            isinstance(value, list)
            and len(value) >= min_len
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            and all(v >= minimum for v in value)
            and (
                not increasing
                or all(a < b for a, b in zip(value, value[1:], strict=False))
            )
        )
        if not ok:
            order = "strictly increasing " if increasing else ""
            raise ValueError(
                f"`{key}` must be a {order}list of at least {min_len} "
                f"integers >= {minimum}; got {short(value)}."
            )
        return list(value)

    return check


#: A dimension: fixed, read from the values resolved so far, or None (any >= 1).
Dim = int | Callable[[Mapping[str, Any]], int] | None


def matrix(rows: Dim, cols: Dim) -> Check:
    """A list of lists of finite numbers of shape (rows, cols)."""

    def check(value, key, cfg):
        r = rows(cfg) if callable(rows) else rows
        c = cols(cfg) if callable(cols) else cols
        return _matrix(value, key, r, c)

    return check


def square() -> Check:
    """A (d, d) matrix of any d >= 1."""

    def check(value, key, cfg):
        first = value[0] if isinstance(value, list) and value else None
        rows = _matrix(value, key, None, len(first) if isinstance(first, list) else 0)
        if len(rows) != len(rows[0]):
            raise ValueError(
                f"`{key}` must be square (d, d); got shape "
                f"({len(rows)}, {len(rows[0])})."
            )
        return rows

    return check


def grid_range(value, key: str, cfg) -> list:
    """[min, max, count]: an evenly spaced grid, min < max, count >= 2."""
    ok = (
        isinstance(value, list)
        and len(value) == 3
        and all(is_number(v) and math.isfinite(v) for v in value)
        and isinstance(value[2], int)
    )
    if not ok:
        raise ValueError(
            f"`{key}` must be [min, max, count] (count an integer); got {short(value)}."
        )
    lo, hi, count = value
    if not lo < hi or count < 2:
        raise ValueError(
            f"`{key}` must have min < max and count >= 2; got {short(value)}."
        )
    return [float(lo), float(hi), int(count)]


def optional(check: Check) -> Check:
    """`check`, except that an omitted key (None) stays None."""
    return or_else(lambda cfg: None, check)


def or_else(fallback: Callable[[Mapping[str, Any]], Any], check: Check) -> Check:
    """`check`, except that an omitted key (None) takes `fallback(cfg)`."""

    def wrapped(value, key, cfg):
        return fallback(cfg) if value is None else check(value, key, cfg)

    return wrapped


def _matrix(value, key: str, rows: int | None, cols: int) -> list[list[float]]:
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
