"""Multi-device runs: the particle axis sharded over devices (and hosts).

`shard(measure)` places x (n, d), the weights and the positions on a 1-D mesh over
`jax.devices()` with the particle axis split (`PartitionSpec("particles")`). Every
velocity field and `simulate` then run unchanged: under `jit` the compiler
partitions the query axis and all-gathers the keys (O(n d) per device, never n x n),
and the blocked kernel processes each device's queries block by block.

Several hosts: call `jax.distributed.initialize()` on every host first (see the JAX
documentation on multi-process runs); `jax.devices()` then lists the devices of all
hosts and the same `shard` call spans them, each host passing the same global array.
"""

import equinox as eqx
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ._measures import AbstractParticles, MaskedParticles

AXIS = "particles"


def particle_mesh(devices=None) -> Mesh:
    """A 1-D mesh named "particles" over `devices` (default: all of `jax.devices()`)."""
    devices = jax.devices() if devices is None else list(devices)
    return jax.make_mesh(
        (len(devices),),
        (AXIS,),
        devices=devices,
        axis_types=(jax.sharding.AxisType.Auto,),
    )


def shard(measure: AbstractParticles, mesh: Mesh | None = None) -> AbstractParticles:
    """The same measure with its particle axis split over the devices of `mesh`.

    Args:
        measure: `Particles` or `MaskedParticles` with n divisible by the number of
            devices.
        mesh: a 1-D mesh with axis "particles"; None uses `particle_mesh()`.

    Returns:
        A measure of the same type whose leaves are sharded along n.

    Raises:
        ValueError: not particles, or n not divisible by the number of devices.
    """
    if not isinstance(measure, AbstractParticles):
        raise ValueError(
            f"`measure` must be Particles or MaskedParticles; got "
            f"{type(measure).__name__}."
        )
    mesh = particle_mesh() if mesh is None else mesh
    devices = mesh.devices.size
    if measure.n % devices:
        raise ValueError(
            f"the number of particles n = {measure.n} must be divisible by the "
            f"number of devices ({devices})."
        )
    rows = NamedSharding(mesh, PartitionSpec(AXIS, None))
    flat = NamedSharding(mesh, PartitionSpec(AXIS))
    out = eqx.tree_at(lambda m: m.x, measure, jax.device_put(measure.x, rows))
    out = eqx.tree_at(lambda m: m.weights, out, jax.device_put(measure.weights, flat))
    if isinstance(measure, MaskedParticles):
        out = eqx.tree_at(
            lambda m: m.positions, out, jax.device_put(measure.positions, flat)
        )
    return out
