"""How smooth is attention: local Lipschitz constants, bounds, adversarial inputs.

Public namespace `mf.lipschitz` (Castin, Ablin & Peyre, "How Smooth Is Attention?",
ICML 2024; mean-field bound of Geshkovski et al., 2023). Formulas:
[Lipschitz constants][math-lipschitz] (docs/math/lipschitz.md).
Growth with n (random, adversarial and searched inputs beside the bounds) and the
layers of a real encoder against the sequence length: `scaling_study`,
`real_model_study`.
"""

from ._local import (
    LipschitzResult,
    adversarial,
    local,
    lower_bound,
    meanfield_adversarial,
    meanfield_adversarial_rate,
    meanfield_bound,
    upper_bound,
)
from ._search import SearchResult, adversarial_search
from ._study import (
    RealModelStudy,
    ScalingStudy,
    fit_slope,
    real_model_study,
    scaling_study,
)

__all__ = [
    "LipschitzResult",
    "RealModelStudy",
    "ScalingStudy",
    "SearchResult",
    "adversarial_search",
    "adversarial",
    "fit_slope",
    "local",
    "lower_bound",
    "meanfield_adversarial",
    "meanfield_adversarial_rate",
    "meanfield_bound",
    "real_model_study",
    "scaling_study",
    "upper_bound",
]
