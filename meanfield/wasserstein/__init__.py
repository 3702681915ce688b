"""Wasserstein distances and stability checks of the Transformer PDE.

Public namespace `mf.wasserstein`: exact and entropic W_p between particle measures,
the Bures closed form between Gaussians, the conditional distance of masked measures
(Castin et al., 2025, Def. 4.1), and the stability estimate
W_p(mu(t), nu(t)) <= C(t, R_0) W_p(mu_0, nu_0) with the support bound
R(t) <= e^{int |V|} R_0 (Geshkovski et al., 2023). Formulas:
[Wasserstein distances and stability][math-wasserstein] (docs/math/wasserstein.md).
"""

from ._distance import Distance, conditional, distance, gaussian_w2
from ._stability import Stability, gronwall_bound, stability

__all__ = [
    "Distance",
    "Stability",
    "conditional",
    "distance",
    "gaussian_w2",
    "gronwall_bound",
    "stability",
]
