"""Figures and animations: particles, Gaussians, stability, Lipschitz, clusters.

Particles: planar projections, the sphere, the radius. Gaussians (Castin, Ablin,
Carrillo & Peyre, 2025): covariance ellipses, covariance eigenvalues, and a
phase diagram of blow-up times over a 2-parameter family of attention matrices.
Stability: the measured W_p ratio and support radius against their bounds.

Every function draws on `ax` when given (so figures can be composed) and returns
the `matplotlib.figure.Figure`. New figures are created through pyplot, so they
show in notebooks and with `plt.show()`; close them with `plt.close(fig)` when
done. The backend is left to the user: this module never calls
`matplotlib.use`, and matplotlib itself falls back to the non-interactive Agg
backend when there is no display. (Command-line tools select Agg explicitly.)

Particles are coloured by the angle of their initial position in the first two
plotted coordinates (a cyclic colormap): where the colours of a cluster come
from shows which tokens merged.
"""

# The solution types these figures take (importable from here before the split).
from .._dynamics import Solution as Solution
from ..gaussian._ode import GaussianSolution as GaussianSolution
from ..wasserstein._stability import Stability as Stability
from ._animation import animate
from ._clustering import plot_cluster_counts, plot_phase_diagram
from ._density import plot_density
from ._energy import plot_energy
from ._gaussian import (
    plot_blowup_phase_diagram,
    plot_covariance_eigenvalues,
    plot_covariance_ellipses,
)
from ._lipschitz import plot_lipschitz_scaling, plot_real_model_lipschitz
from ._particles import (
    plot_radius,
    plot_sphere,
    plot_trajectories,
    plot_trajectories_3d,
)
from ._sphere_density import animate_sphere_density, plot_sphere_density
from ._stability import plot_stability

__all__ = [
    "animate",
    "animate_sphere_density",
    "plot_sphere_density",
    "plot_blowup_phase_diagram",
    "plot_cluster_counts",
    "plot_covariance_eigenvalues",
    "plot_covariance_ellipses",
    "plot_density",
    "plot_energy",
    "plot_lipschitz_scaling",
    "plot_phase_diagram",
    "plot_radius",
    "plot_real_model_lipschitz",
    "plot_sphere",
    "plot_stability",
    "plot_trajectories",
    "plot_trajectories_3d",
]
