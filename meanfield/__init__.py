"""meanfield: the mean-field Transformer PDE d_t mu + div(mu Gamma_mu) = 0 in JAX.

Measures (particles, masked particles, Gaussians), attention velocity fields
(softmax, L2, Sinkhorn, multi-head, ill-posed kernels), and particle dynamics.
"""

from . import bert, clustering, gaussian, lipschitz, wasserstein
from ._attention.base import AbstractAttention, AbstractKernelAttention
from ._attention.ill_posed import (
    AbstractIllPosedAttention,
    LinearAttention,
    ReLUAttention,
    SigmoidAttention,
    UnnormalizedAttention,
)
from ._attention.l2 import L2Attention
from ._attention.multihead import MultiHeadAttention
from ._attention.sinkhorn import SinkhornAttention, SinkhornPotentials
from ._attention.softmax import SoftmaxAttention
from ._dynamics import SOLVERS, Solution, layers, simulate
from ._measures import (
    AbstractMeasure,
    AbstractParticles,
    Gaussian,
    MaskedParticles,
    Particles,
)
from ._params import PiecewiseConstant
from ._sharding import particle_mesh, shard

__version__ = "0.1.0"

__all__ = [
    "AbstractAttention",
    "AbstractIllPosedAttention",
    "AbstractKernelAttention",
    "AbstractMeasure",
    "AbstractParticles",
    "Gaussian",
    "L2Attention",
    "LinearAttention",
    "MaskedParticles",
    "MultiHeadAttention",
    "Particles",
    "PiecewiseConstant",
    "ReLUAttention",
    "SOLVERS",
    "SigmoidAttention",
    "SinkhornAttention",
    "SinkhornPotentials",
    "SoftmaxAttention",
    "Solution",
    "UnnormalizedAttention",
    "bert",
    "clustering",
    "gaussian",
    "layers",
    "lipschitz",
    "particle_mesh",
    "shard",
    "simulate",
    "wasserstein",
]
