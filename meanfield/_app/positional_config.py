"""Positional attention in `meanfield simulate`: its keys and the position check.

The positional families encode the tokens' positions s_i = i/n of a `masked`
run: `"alibi"` adds the bias -slope (s_i - s_j) to the scores (`slope`, the
discrete ALiBi slope m per token times n), `"rope"` rotates the coordinate pairs
(2p, 2p + 1) of Q x and K y by the angles omega_p s (`frequencies`, omega of
length k/2 for k rows of Q; a number omega for every pair).

Whether a family needs positions, refuses them or takes either is asked of the
family itself: its velocity is traced once, shapes only, on two tokens with and
without positions (`check_positions`). So a newly registered family needs no
change here.
"""

import inspect
from collections.abc import Callable

import equinox as eqx
import jax.numpy as jnp

from .._attention import FAMILIES
from .._measures import MaskedParticles, Particles
from .config import number
from .param_config import vector


def takes(keyword: str) -> Callable[[str], bool]:
    """Whether the family `kind`'s constructor has the keyword `keyword`."""
    return lambda kind: keyword in inspect.signature(FAMILIES[kind]).parameters


def frequency_count(cfg) -> int:
    """k/2 for the k rows of `Q` (a number Q is c I: k = d), in the [attention] table.

    Raises:
        ValueError: k odd (the rotations act on pairs of coordinates).
    """
    given = isinstance(cfg["Q"], list)
    k = len(cfg["Q"]) if given else cfg["d"]
    if k % 2:
        what = "rows of `attention.Q`" if given else "`d` (Q = c I)"
        raise ValueError(
            "`attention.frequencies` rotates pairs of coordinates of Q x: it needs "
            f"an even {what}; got {k}."
        )
    return k // 2


def frequencies(value, key, cfg):
    """`[attention] frequencies`: a number omega, or a list of k/2 numbers."""
    return vector(frequency_count, "k/2")(value, key, cfg)


def slope(value, key, cfg):
    """`[attention] slope`: a finite number."""
    return number()(value, key, cfg)


def _traces(attn, d: int, masked: bool) -> str | None:
    """None if attn's velocity traces on two tokens (with positions if masked)."""
    x = jnp.zeros((2, d), jnp.float32)
    measure = (
        MaskedParticles(x, jnp.array([0.0, 0.5], jnp.float32))
        if masked
        else Particles(x)
    )
    try:
        eqx.filter_eval_shape(lambda a, m: a.velocity(m), attn, measure)
    except ValueError as err:
        return str(err)
    return None


def check_positions(attn, cfg: dict) -> None:
    """Check `masked` against the family: whether it needs, refuses or takes it.

    A family without a causal form (Sinkhorn) refuses `masked`; one that encodes
    positions (ALiBi, RoPE) needs it.

    Args:
        attn: the run's attention (any dtype).
        cfg: the resolved configuration (`masked`, `d`, `attention.kind`).

    Raises:
        ValueError: one line naming `attention.kind` and `masked`.
    """
    kind, masked, d = cfg["attention"]["kind"], cfg["masked"], cfg["d"]
    err = _traces(attn, d, masked)
    if err is None:
        return
    if masked:
        raise ValueError(f'`attention.kind` = "{kind}" cannot be `masked`: {err}')
    if _traces(attn, d, True) is None:
        raise ValueError(
            f'`attention.kind` = "{kind}" encodes token positions: it needs '
            "`masked` = true (causal attention, positions s_i = i/n)."
        )
    raise ValueError(f'`attention.kind` = "{kind}" cannot run: {err}')


def rename(err: ValueError, names: dict[str, str]) -> ValueError:
    """A constructor's error with its keywords as the table's keys.

    Args:
        err: raised by a family's constructor (keywords in backticks).
        names: keyword -> dotted key (`"blocking"` -> `"attention.blocking"`).
    """
    text = str(err)
    for keyword, key in names.items():
        text = text.replace(f"`{keyword}`", f"`{key}`")
    return ValueError(text)
