"""The density on the circle as a (theta, t) heat map, beside the particles."""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure

from ..density._analysis import angles as angles_of
from ..density._analysis import arc_averages


def plot_density(
    solution,
    *,
    particles=None,
    bins: int = 256,
    columns: int = 1024,
    axes=None,
    title: str | None = None,
) -> Figure:
    """The density over (theta, t), and its last save against a particle histogram.

    Left: rho(theta, t) as a heat map (colour on a square-root scale, so the
    uniform state and the clusters both show). Right, when `particles` is given:
    the histogram of the particles' angles at the last save time, and the
    density's mass in the same bins drawn over it: the continuum limit against
    the tokens it describes, at one resolution.

    Args:
        solution: a `mf.density.DensitySolution`.
        particles: a particle `Solution` on the circle (d = 2), saved at the
            same times, or None for the heat map alone.
        bins: histogram bins.
        columns: the heat map shows the density averaged over this many equal
            arcs when N is larger (mass-preserving: a cluster narrower than a
            pixel stays visible instead of falling between pixels).
        axes: axes to draw on: one for the heat map, two when `particles` is
            given; None creates the figure.
        title: title of the heat map; None for a default.

    Returns:
        The figure.

    Raises:
        ValueError: particles not on the circle, or `axes` of the wrong length.
    """
    wanted = 1 if particles is None else 2
    if axes is None:
        fig, axes = plt.subplots(
            1, wanted, figsize=(5.5 * wanted, 4.0), layout="constrained", squeeze=False
        )
        axes = list(axes[0])
    else:
        axes = list(np.atleast_1d(axes))
        if len(axes) != wanted:
            raise ValueError(f"`axes` must hold {wanted} axes; got {len(axes)}.")
        fig = axes[0].figure
    reached = np.isfinite(solution.ts)
    ts, rho = solution.ts[reached], solution.rho[reached]
    shown = min(int(columns), rho.shape[1])
    edges = np.linspace(0, 2 * np.pi, shown + 1)
    shown_rho = arc_averages(rho, edges)
    heat = axes[0].pcolormesh(
        0.5 * (edges[1:] + edges[:-1]),
        ts,
        shown_rho,
        shading="nearest",
        norm=PowerNorm(0.5, vmin=0, vmax=max(float(rho.max()), 1e-300)),
        cmap="magma",
    )
    fig.colorbar(heat, ax=axes[0], label="ρ")
    axes[0].set_xlabel("θ")
    axes[0].set_ylabel("t")
    axes[0].set_title(
        title
        if title is not None
        else f"density, β = {solution.beta:g} ({solution.attention})"
    )
    if particles is not None:
        ax = axes[1]
        x = np.asarray(particles.x[int(np.flatnonzero(reached)[-1])])
        if x.ndim != 2 or x.shape[1] != 2:
            raise ValueError(
                "`particles` must hold tokens on the circle, shape (T, n, 2); got "
                f"{np.shape(particles.x)}."
            )
        angles = angles_of(x)
        # The density in the histogram's bins: the particles' resolution.
        edges = np.linspace(0, 2 * np.pi, bins + 1)
        binned = arc_averages(rho[-1], edges)
        ax.hist(
            angles,
            bins=edges,
            density=True,
            color="0.6",
            label=f"{angles.size} particles",
        )
        ax.stairs(binned, edges, color="C3", lw=1.2, label="density")
        ax.set_xlim(0, 2 * np.pi)
        ax.set_xlabel("θ")
        ax.set_ylabel("ρ")
        ax.set_title(f"t = {ts[-1]:g}")
        ax.legend(fontsize="small")
    return fig
