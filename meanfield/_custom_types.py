"""Type aliases shared by the package (jaxtyping shapes: n m d k h T)."""

from collections.abc import Callable
from typing import Any, TypeAlias

from jaxtyping import Array, ArrayLike, Float

#: A parameter of an attention layer: an array, or a function of time t -> array
#: (for instance :class:`meanfield.PiecewiseConstant` for a stack of layers).
Param: TypeAlias = Float[Array, "..."] | Callable[[Any], Float[Array, "..."]]
ParamLike: TypeAlias = ArrayLike | Callable[[Any], ArrayLike]
