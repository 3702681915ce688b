"""The attention families by name, read by the CLI, configurations, bounds and docs.

A family is a final attention class decorated with `@register("name")`; the name is
what a TOML configuration (`[attention] kind = "name"`) and the command line use,
and the constructor's keywords (`inspect.signature(cls)`) are the keys it accepts.

Order: registration order, which `meanfield._attention`'s imports fix: softmax, l2,
sinkhorn, then unnormalized, linear, relu, sigmoid, then families added later.

`MultiHeadAttention` is not a family: it combines heads of any families (built in
code, not from one name and a set of matrices), so it is not registered. Analyses
see it through `AbstractAttention.flat_heads`. Adding a family:
docs/how-to/new-attention-family.md.
"""

from collections.abc import Callable
from typing import TypeVar

from .base import AbstractAttention

_A = TypeVar("_A", bound=type[AbstractAttention])

#: name -> final attention class, in registration order (see the module docstring).
FAMILIES: dict[str, type[AbstractAttention]] = {}


def register(name: str) -> Callable[[_A], _A]:
    """Class decorator: make `cls` the attention family called `name`."""

    def decorate(cls: _A) -> _A:
        if name in FAMILIES and FAMILIES[name] is not cls:
            raise ValueError(
                f"attention family {name!r} is already {FAMILIES[name].__name__}."
            )
        FAMILIES[name] = cls
        return cls

    return decorate


def family(name: str) -> type[AbstractAttention]:
    """The attention class called `name`; ValueError listing the known names."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(
            f"unknown attention family {name!r}; known: {', '.join(FAMILIES)}."
        ) from None


def name_of(cls: type) -> str | None:
    """The registered name of an attention class, or None."""
    return next((n for n, c in FAMILIES.items() if c is cls), None)
