"""meanfield: the mean-field Transformer PDE d_t mu + div(mu Gamma_mu) = 0 in JAX.

Measures (particles, masked particles, Gaussians), attention velocity fields
(softmax, L2, Sinkhorn, multi-head, positional, hardmax, ill-posed kernels),
feed-forward layers and Transformer blocks, and particle dynamics.

Names are loaded on first use (PEP 562): `import meanfield` imports neither JAX nor
matplotlib, so `meanfield --help` answers at once and `mf.plotting` costs nothing
until it is touched.
"""

import importlib
from typing import TYPE_CHECKING

from . import _heap

__version__ = "0.1.0"

# Before XLA's CPU client allocates: a heap that keeps its temporaries between
# steps (glibc; `_heap`).
_heap.keep_top()

# Public name -> the module that defines it (relative to this package).
_ENGINE = {
    "AbstractAttention": "._attention.base",
    "AbstractKernelAttention": "._attention.base",
    "AbstractIllPosedAttention": "._attention.ill_posed",
    "ALiBiAttention": "._attention.positional",
    "RoPEAttention": "._attention.positional",
    "UnnormalizedALiBiAttention": "._attention.positional",
    "HardmaxAttention": "._attention.hardmax",
    "AbstractFeedForward": "._feedforward",
    "FeedForward": "._feedforward",
    "MLP": "._feedforward",
    "Block": "._block",
    "LinearAttention": "._attention.ill_posed",
    "ReLUAttention": "._attention.ill_posed",
    "SigmoidAttention": "._attention.ill_posed",
    "UnnormalizedAttention": "._attention.ill_posed",
    "L2Attention": "._attention.l2",
    "MultiHeadAttention": "._attention.multihead",
    "SinkhornAttention": "._attention.sinkhorn",
    "SinkhornPotentials": "._attention.sinkhorn",
    "SoftmaxAttention": "._attention.softmax",
    "SOLVERS": "._dynamics",
    "Solution": "._dynamics",
    "layers": "._layers",
    "simulate": "._dynamics",
    "simulate_ensemble": "._ensemble",
    "ChunkLog": "._ensemble",
    "simulate_merging": ".clustering._merging",
    "AbstractMeasure": "._measures",
    "AbstractParticles": "._measures",
    "Gaussian": "._measures",
    "MaskedParticles": "._measures",
    "Particles": "._measures",
    "AbstractNoise": "._noise",
    "CommonNoise": "._noise",
    "IndependentNoise": "._noise",
    "PiecewiseConstant": "._params",
    "particle_mesh": "._sharding",
    "shard": "._sharding",
    "Status": "._status",
}
# Public namespaces (subpackages).
_NAMESPACES = (
    "bert",
    "clustering",
    "density",
    "extend",
    "gaussian",
    "lipschitz",
    "plotting",
    "wasserstein",
)

__all__ = sorted([*_ENGINE, *_NAMESPACES])


def __getattr__(name: str):
    if name in _ENGINE or (name in _NAMESPACES and name != "plotting"):
        # Before anything compiles: JAX's persistent cache in a user directory.
        from . import _compile_cache

        _compile_cache.enable()
    if name in _ENGINE:
        value = getattr(importlib.import_module(_ENGINE[name], __name__), name)
    elif name in _NAMESPACES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # static analysers and IDEs see the eager imports
    from . import (
        bert,
        clustering,
        density,
        extend,
        gaussian,
        lipschitz,
        plotting,
        wasserstein,
    )
    from ._attention.base import AbstractAttention, AbstractKernelAttention
    from ._attention.hardmax import HardmaxAttention
    from ._attention.ill_posed import (
        AbstractIllPosedAttention,
        LinearAttention,
        ReLUAttention,
        SigmoidAttention,
        UnnormalizedAttention,
    )
    from ._attention.l2 import L2Attention
    from ._attention.multihead import MultiHeadAttention
    from ._attention.positional import (
        ALiBiAttention,
        RoPEAttention,
        UnnormalizedALiBiAttention,
    )
    from ._attention.sinkhorn import SinkhornAttention, SinkhornPotentials
    from ._attention.softmax import SoftmaxAttention
    from ._block import Block
    from ._dynamics import SOLVERS, Solution, simulate
    from ._ensemble import ChunkLog, simulate_ensemble
    from ._feedforward import MLP, AbstractFeedForward, FeedForward
    from ._layers import layers
    from ._measures import (
        AbstractMeasure,
        AbstractParticles,
        Gaussian,
        MaskedParticles,
        Particles,
    )
    from ._noise import AbstractNoise, CommonNoise, IndependentNoise
    from ._params import PiecewiseConstant
    from ._sharding import particle_mesh, shard
    from ._status import Status
    from .clustering._merging import simulate_merging
