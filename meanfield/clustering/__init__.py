"""Clustering analysis of token dynamics.

Public namespace `mf.clustering`: the rescaled tokens z_i(t) = e^{-tV} x_i(t),
single-linkage clusters with a gap-based automatic tolerance, the number of clusters
over time, the time at which all tokens form one cluster, and the convex polytope
whose boundary the rescaled tokens converge to when V = I (Geshkovski, Letrouit,
Polyanskiy & Rigollet, "The Emergence of Clusters in Self-Attention Dynamics",
NeurIPS 2023). Post-processing on the host in NumPy/SciPy (`rescale` excepted).
"""

from ._clustering import (
    ClusterCounts,
    Clusters,
    Polytope,
    cluster_counts,
    clusters,
    consensus_time,
    detect,
    diameter,
    polytope,
    rescale,
)

__all__ = [
    "ClusterCounts",
    "Clusters",
    "Polytope",
    "cluster_counts",
    "clusters",
    "consensus_time",
    "detect",
    "diameter",
    "polytope",
    "rescale",
]
