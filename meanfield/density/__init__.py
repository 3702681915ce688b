"""The Transformer PDE as a density: the mean-field equation on S^1, S^2 and S^{d-1}.

Public namespace `mf.density`, for attention with A = beta I, V = I (softmax or
unnormalised) and optional noise (tokens with Brownian motions, sigma > 0: a
diffusion term):
- on the circle, `simulate` evolves a density on [0, 2 pi), the continuum limit
  of the token dynamics that `mf.simulate` integrates particle by particle;
  `stationary`, `noise_continuation`, `cluster_branch` and `coexistence_noise`
  describe its stationary states with noise; `count_clusters` reads clusters
  off a density; `simulate_particles` runs the same model as tokens, and
  `circle_w1` compares a density with them;
- on S^{d-1}, `simulate_zonal` evolves a density of the angle to an axis (any
  d >= 2), `stationary_zonal` and `noise_continuation_zonal` its stationary
  states with noise; `sample_zonal` draws tokens from it and `zonal_w1`
  compares them with it;
- on S^2, `simulate_sphere` evolves a full density under general Q, K, V
  (spherical harmonics on `sphere_grid`), and `count_sphere_clusters` reads
  clusters off it;
- in any dimension d, `growth_rate` and `fastest_mode` give the linear
  instability of the uniform density (which spherical harmonics grow, how
  many clusters emerge), `critical_noise` the noise above which it is stable,
  and `landau_coefficient`, `transition_type` and `type_change_beta` the type
  of the phase transition in the noise.
"""

from ._analysis import angles, circle_w1, count_clusters, sample_quantiles
from ._circle import DensitySolution, cell_centres, simulate
from ._harmonics import SphereGrid, sphere_grid
from ._linear import critical_noise, fastest_mode, growth_rate
from ._particles import simulate_particles, simulate_tokens
from ._sphere import SphereSolution, min_band_limit, simulate_sphere
from ._sphere_clusters import count_sphere_clusters
from ._sphere_tokens import sample_sphere, sphere_values
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
from ._zonal import ZonalSolution, simulate_zonal
from ._zonal_grid import zonal_volumes
from ._zonal_stationary import ZonalStationaryState, stationary_zonal
from ._zonal_tokens import sample_zonal, zonal_angles, zonal_w1
from ._zonal_transition import noise_continuation_zonal

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
    "simulate_sphere",
    "min_band_limit",
    "SphereGrid",
    "SphereSolution",
    "sphere_grid",
    "count_sphere_clusters",
    "sample_sphere",
    "sphere_values",
    "simulate_particles",
    "simulate_tokens",
    "stationary",
    "transition_type",
    "type_change_beta",
    "ZonalSolution",
    "ZonalStationaryState",
    "noise_continuation_zonal",
    "sample_zonal",
    "simulate_zonal",
    "stationary_zonal",
    "zonal_angles",
    "zonal_volumes",
    "zonal_w1",
]
