"""Clusters of a density on S^2 given on latitude rings: connected superlevel sets."""

import numpy as np
from jaxtyping import ArrayLike, Float
from scipy import ndimage

#: The uniform density on S^2, 1 / (4 pi).
_UNIFORM = 1 / (4 * np.pi)


def count_sphere_clusters(
    rho: Float[ArrayLike, "nlat nlon"], level: float = 4.0
) -> int:
    """Number of clusters of a density on S^2 sampled on latitude rings.

    A cluster is a connected region where rho exceeds `level` times the uniform
    density 1 / (4 pi), as `count_clusters` on the circle. Neighbours are the
    four grid neighbours, longitude wraps around, and the nodes of the first
    (last) ring all touch one another through the north (south) pole. A
    cluster of mass m and angular radius a has rho ~ m / (pi a^2), so it
    counts once a^2 < 4 m / level.

    Args:
        rho: density values (mass 1 for the surface measure) on nlat rings
            ordered from one pole to the other, each of nlon equally spaced
            longitudes, shape (nlat, nlon), nlat >= 2, nlon >= 3 (e.g.
            `SphereSolution.rho[i]`).
        level: threshold in units of the uniform density, > 1.

    Returns:
        The number of connected regions above the threshold (1 when every node
        is above it).

    Raises:
        ValueError: `rho` not a finite (nlat, nlon) array, or `level` <= 1.
    """
    rho = np.asarray(rho, np.float64)
    if rho.ndim != 2 or rho.shape[0] < 2 or rho.shape[1] < 3:
        raise ValueError(
            "`rho` must have shape (nlat, nlon), nlat >= 2, nlon >= 3; got "
            f"{rho.shape}."
        )
    if not np.all(np.isfinite(rho)):
        raise ValueError("`rho` must be finite.")
    if not float(level) > 1:
        raise ValueError(f"`level` must be greater than 1; got {level}.")
    above = rho > float(level) * _UNIFORM
    if above.all():
        return 1
    labels, count = ndimage.label(above)  # 4-connectivity inside the chart
    if count == 0:
        return 0
    # Union of labels joined across the date line and through each pole.
    parent = np.arange(count + 1)

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(a, b):
        if a and b:
            parent[find(a)] = find(b)

    for a, b in zip(labels[:, 0], labels[:, -1], strict=True):
        join(a, b)
    for ring in (labels[0], labels[-1]):
        present = ring[ring > 0]
        for a in present[1:]:
            join(a, present[0])
    return len({find(i) for i in range(1, count + 1)})
