"""Attention velocity fields Gamma_mu, one family per module.

Importing this package registers every family (`registry.FAMILIES`), in the order of
the imports below: the normalised families (softmax, l2, sinkhorn), then the
ill-posed kernels (unnormalized, linear, relu, sigmoid), then later additions.
"""

# isort: off
# The order of these imports is the order of FAMILIES (see registry).
from . import softmax, l2, sinkhorn, ill_posed  # noqa: F401  (registration)
from . import positional, hardmax  # noqa: F401  (registration)
from . import multihead  # noqa: F401  (a combinator, not registered)

# isort: on
from .registry import FAMILIES, family, name_of, register  # noqa: F401
