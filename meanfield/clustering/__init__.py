"""Clustering analysis of token dynamics.

Public namespace `mf.clustering`: the rescaled tokens z_i(t) = e^{-tV} x_i(t),
single-linkage clusters with a gap-based automatic tolerance, the number of clusters
over time, the time at which all tokens form one cluster, and the convex polytope
whose boundary the rescaled tokens converge to when V = I (Geshkovski, Letrouit,
Polyanskiy & Rigollet, "The Emergence of Clusters in Self-Attention Dynamics",
NeurIPS 2023), and the statistics of ensembles over save times (order parameter,
aligned pairs and groups; JAX, usable as an ensemble's `reduce`), and the
probability that two tokens under common noise end antipodal (Fedorov, Sander,
Elie, Marion & Lauriere, 2026). Clusters, counts and the polytope are computed on
the host in NumPy/SciPy on concrete float64 arrays in O(n d + 16 n) memory, never
an (n, n) matrix; `rescale` and the ensemble statistics are JAX functions (the
statistics form one system's Gram matrix at a time, for the small n of a study).
"""

from ._antipodal import antipodal_probability, antipodal_threshold, pair_coefficients
from ._detect import Clusters, clusters, detect
from ._energy import energy
from ._merging import MergingSolution, merge, simulate_merging
from ._order import Statistics, aligned_groups, order_parameter, statistics
from ._over_time import CONSENSUS_TOL as CONSENSUS_TOL
from ._over_time import ClusterCounts, cluster_counts, consensus_time, diameter
from ._phase import (
    PhaseDiagram,
    equiangular_rate,
    equiangular_time,
    head_attention,
    pair_alignment,
    phase_diagram,
)
from ._polytope import Polytope, polytope
from ._rescale import rescale

__all__ = [
    "ClusterCounts",
    "Clusters",
    "MergingSolution",
    "PhaseDiagram",
    "Polytope",
    "Statistics",
    "aligned_groups",
    "antipodal_probability",
    "antipodal_threshold",
    "cluster_counts",
    "clusters",
    "consensus_time",
    "detect",
    "diameter",
    "energy",
    "equiangular_rate",
    "equiangular_time",
    "head_attention",
    "merge",
    "order_parameter",
    "pair_alignment",
    "pair_coefficients",
    "phase_diagram",
    "polytope",
    "rescale",
    "simulate_merging",
    "statistics",
]
