"""Gaussian measures under attention dynamics: affine fields, moment ODE, blow-up.

Public namespace `mf.gaussian` (Castin, Ablin, Carrillo & Peyre, "A Unified
Perspective on the Dynamics of Deep Transformers", 2025). Formulas:
[Gaussians][math-gaussians] (docs/math/gaussians.md).
"""

from ._blowup_study import BlowupStudy
from ._classify import numerical_rank
from ._ode import (
    ClosedForm,
    GaussianSolution,
    blowup_time,
    closed_form,
    simulate,
)
from ._particles import ParticleComparison, compare_particles
from ._study import blowup_times
from ._velocity import velocity

__all__ = [
    "BlowupStudy",
    "ParticleComparison",
    "blowup_times",
    "compare_particles",
    "numerical_rank",
    "ClosedForm",
    "GaussianSolution",
    "blowup_time",
    "closed_form",
    "simulate",
    "velocity",
]
