"""The Transformer PDE as a density: the mean-field equation on the circle.

Public namespace `mf.density`: `simulate` evolves a density rho on [0, 2 pi) under
attention with A = beta I, V = I (softmax or unnormalised), the continuum limit of
the token dynamics on S^1 that `mf.simulate` integrates particle by particle, with
optional noise (tokens with Brownian motions, sigma > 0: a diffusion term);
`growth_rate` and `fastest_mode` give the linear instability of the uniform
density (how many clusters emerge from noise), `critical_noise` the noise above
which it is stable; `stationary` solves for the stationary densities with
noise, and `noise_continuation`, `cluster_branch`, `landau_coefficient`,
`transition_type`, `type_change_beta` and `coexistence_noise` describe the
phase transition in the noise; `count_clusters` reads clusters off a density;
`simulate_particles` runs the same model as tokens, and `circle_w1` compares a
density with them.
"""

from ._analysis import angles, circle_w1, count_clusters, sample_quantiles
from ._circle import DensitySolution, cell_centres, simulate
from ._linear import critical_noise, fastest_mode, growth_rate
from ._particles import simulate_particles
from ._stationary import StationaryState, stationary
from ._transition import (
    ClusterBranch,
    NoiseContinuation,
    cluster_branch,
    coexistence_noise,
    landau_coefficient,
    noise_continuation,
    transition_type,
    type_change_beta,
)

__all__ = [
    "angles",
    "ClusterBranch",
    "DensitySolution",
    "NoiseContinuation",
    "StationaryState",
    "cluster_branch",
    "coexistence_noise",
    "cell_centres",
    "circle_w1",
    "count_clusters",
    "critical_noise",
    "fastest_mode",
    "growth_rate",
    "landau_coefficient",
    "noise_continuation",
    "sample_quantiles",
    "simulate",
    "simulate_particles",
    "stationary",
    "transition_type",
    "type_change_beta",
]
