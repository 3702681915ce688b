"""How smooth is attention: local Lipschitz constants, bounds, adversarial inputs.

Public namespace `mf.lipschitz` (Castin, Ablin & Peyre, "How Smooth Is Attention?",
ICML 2024; mean-field bound of Geshkovski et al., 2023). Formulas: MATH.md s. 5.
"""

from ._lipschitz import (
    LipschitzResult,
    adversarial,
    local,
    lower_bound,
    meanfield_adversarial,
    meanfield_adversarial_rate,
    meanfield_bound,
    upper_bound,
)
from ._lipschitz_search import SearchResult, adversarial_search

__all__ = [
    "LipschitzResult",
    "SearchResult",
    "adversarial_search",
    "adversarial",
    "local",
    "lower_bound",
    "meanfield_adversarial",
    "meanfield_adversarial_rate",
    "meanfield_bound",
    "upper_bound",
]
