"""Attention velocity fields Gamma_mu, one family per module.

Importing this package registers every family (`registry.FAMILIES`).
"""

from . import ill_posed, l2, multihead, sinkhorn, softmax  # noqa: F401  (registration)
from .registry import FAMILIES, family, name_of, register  # noqa: F401
