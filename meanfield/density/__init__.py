"""The Transformer PDE as a density: the mean-field equation on the circle.

Public namespace `mf.density`: `simulate` evolves a density rho on [0, 2 pi) under
attention with A = beta I, V = I (softmax or unnormalised), the continuum limit of
the token dynamics on S^1 that `mf.simulate` integrates particle by particle;
`growth_rate` and `fastest_mode` give the linear instability of the uniform
density (how many clusters emerge from noise); `count_clusters` reads them
off a density; `simulate_particles` runs the same model as tokens, and
`circle_w1` compares a density with them.
"""

from ._analysis import angles, circle_w1, count_clusters, sample_quantiles
from ._circle import (
    DensitySolution,
    cell_centres,
    fastest_mode,
    growth_rate,
    simulate,
)
from ._particles import simulate_particles

__all__ = [
    "angles",
    "DensitySolution",
    "cell_centres",
    "circle_w1",
    "count_clusters",
    "fastest_mode",
    "growth_rate",
    "sample_quantiles",
    "simulate",
    "simulate_particles",
]
