"""Gaussian moment ODE figures: covariance ellipses, eigenvalues, phase diagram."""

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import ListedColormap, LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from ..gaussian._blowup_study import BlowupStudy
from ..gaussian._ode import GaussianSolution
from ._common import new_axes

_TIME_CMAP = "viridis"


def _gaussian_rows(sol: GaussianSolution) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reached rows (ts, mean, cov) of a `GaussianSolution`: finite time and state.

    Save times after a blow-up or another early stop are +inf in the solution.
    """
    ts, mean, cov = (np.asarray(a, dtype=float) for a in (sol.ts, sol.mean, sol.cov))
    keep = (
        np.isfinite(ts)
        & np.all(np.isfinite(mean), axis=1)
        & np.all(np.isfinite(cov), axis=(1, 2))
    )
    if not keep.any():
        raise ValueError("no saved state is finite: nothing to plot.")
    return ts[keep], mean[keep], cov[keep]


def _variants(solutions) -> dict[str, GaussianSolution]:
    """{name: GaussianSolution}; one solution (`mf.gaussian.simulate`) is "Gaussian"."""
    if isinstance(solutions, GaussianSolution):
        return {"Gaussian": solutions}
    if not isinstance(solutions, Mapping) or not all(
        isinstance(sol, GaussianSolution) for sol in solutions.values()
    ):
        raise TypeError(
            "`solutions` must be a GaussianSolution (`mf.gaussian.simulate`) or a "
            f"dict of them by variant name; got {type(solutions).__name__}."
        )
    if not solutions:
        raise ValueError("`solutions` must hold at least one GaussianSolution.")
    return dict(solutions)


def _blowup_time(sol: GaussianSolution) -> float:
    return float(np.asarray(sol.blowup_time))


def _ellipse(mean: np.ndarray, cov: np.ndarray, num: int = 100) -> np.ndarray:
    """1-sigma ellipse {mean + Sigma^{1/2} u : |u| = 1} of N(mean, cov): (num, 2)."""
    lam, U = np.linalg.eigh((cov + cov.T) / 2)
    theta = np.linspace(0, 2 * np.pi, num)
    circle = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    return mean + (circle * np.sqrt(np.maximum(lam, 0))) @ U.T


def plot_covariance_ellipses(
    solutions: dict[str, GaussianSolution] | GaussianSolution,
    *,
    n_ellipses: int = 8,
    axes=None,
    title: str | None = None,
    max_growth: float = 10.0,
) -> Figure:
    """1-sigma ellipses of N(alpha(t), Sigma(t)) in d = 2, one panel per variant.

    The Gaussian moment ODE of Castin, Ablin, Carrillo & Peyre (2025)
    (docs/math/gaussians.md) keeps a Gaussian Gaussian; each panel draws the ellipse
    {alpha(t) + Sigma(t)^{1/2} u : |u| = 1} at `n_ellipses` save times evenly
    spread over the shown range, coloured by time (one colorbar per panel: the
    time ranges differ), with the mean path alpha(t) in black. The panel title
    gives the blow-up time t* when there is one, and the time range drawn.

    Readability near a blow-up: softmax covariances grow like 1/(t* - t), so the
    last reached ellipses would dwarf every earlier one. Each panel therefore
    shows the save times from 0 up to the last one at which the largest 1-sigma
    radius sqrt(lambda_max(Sigma(t))) is at most `max_growth` times its initial
    value (the title then adds "radius <= x`max_growth`"). Only reached save
    times are drawn (finite ts), so a blown-up run ends at the last save time
    before t*. The geometry itself is not distorted (true radii, equal aspect);
    `plot_covariance_eigenvalues` shows the full growth. Axis limits are chosen
    per panel from the drawn ellipses (the scales differ a lot).

    Args:
        solutions: a `GaussianSolution` with d = 2 (`mf.gaussian.simulate`), or
            variant name -> `GaussianSolution`, e.g.
            {"softmax": ..., "L2": ..., "Sinkhorn": ...}.
        n_ellipses: ellipses per panel (fewer if fewer rows are shown).
        axes: one 2-D axes per variant, in the order of `solutions`; None
            creates a figure with the panels side by side.
        title: figure title (suptitle); None for none.
        max_growth: largest radius growth factor shown (>= 1); inf shows every
            reached save time.

    Returns:
        The figure (of the first axes).

    Raises:
        ValueError: no solutions, d != 2, `n_ellipses` < 1, `max_growth` < 1,
            wrong number of axes, or a solution with no finite state.
        TypeError: `solutions` neither a GaussianSolution nor a dict of them.
    """
    solutions = _variants(solutions)
    if n_ellipses < 1:
        raise ValueError(f"`n_ellipses` must be >= 1; got {n_ellipses}.")
    if not max_growth >= 1:
        raise ValueError(f"`max_growth` must be >= 1; got {max_growth}.")
    for name, sol in solutions.items():
        d = np.shape(sol.mean)[-1]
        if d != 2:
            raise ValueError(
                f"`plot_covariance_ellipses` needs d = 2; got d = {d} for {name!r}."
            )
    if axes is None:
        k = len(solutions)
        fig, axes = plt.subplots(
            1, k, figsize=(4.4 * k + 1.0, 4.6), layout="constrained", squeeze=False
        )
        axes = list(axes[0])
    else:
        axes = list(np.ravel(np.asarray(axes, dtype=object)))
        if len(axes) != len(solutions):
            raise ValueError(
                f"`axes` must hold {len(solutions)} axes (one per variant); "
                f"got {len(axes)}."
            )
        fig = axes[0].figure

    shown = {}
    for name, sol in solutions.items():
        ts, mean, cov = _gaussian_rows(sol)
        radius = np.sqrt(np.linalg.eigvalsh(cov)[:, -1])
        # Prefix of rows within the growth cap (row 0 always qualifies).
        over = np.flatnonzero(radius > max_growth * radius[0])
        stop = over[0] if over.size else ts.size
        shown[name] = (ts[:stop], mean[:stop], cov[:stop], stop < ts.size)
    cmap = plt.get_cmap(_TIME_CMAP)
    for ax, (name, (ts, mean, cov, cut)) in zip(axes, shown.items(), strict=True):
        # Per-panel time scale: a softmax blow-up ends long before the others.
        norm = Normalize(0.0, float(ts[-1]) if ts[-1] > 0 else 1.0)
        idx = np.unique(np.linspace(0, ts.size - 1, n_ellipses).round().astype(int))
        curves = np.stack([_ellipse(mean[i], cov[i]) for i in idx])
        ax.add_collection(
            LineCollection(curves, colors=cmap(norm(ts[idx])), linewidths=1.4)
        )
        ax.plot(mean[:, 0], mean[:, 1], color="k", lw=1.0, label=r"mean $\alpha(t)$")
        ax.scatter(mean[idx, 0], mean[idx, 1], s=12, c=cmap(norm(ts[idx])), zorder=3)
        # Square limits around the drawn data (ellipses and mean path), 5% margin:
        # equal aspect without matplotlib overriding fixed limits.
        pts = np.concatenate([curves.reshape(-1, 2), mean])
        lo, hi = pts.min(axis=0), pts.max(axis=0)
        center, half = (lo + hi) / 2, 0.55 * max(float((hi - lo).max()), 1e-12)
        ax.set_xlim(center[0] - half, center[0] + half)
        ax.set_ylim(center[1] - half, center[1] + half)
        ax.set_aspect("equal", adjustable="box")
        ax.set_xlabel("$x_0$")
        ax.set_ylabel("$x_1$")
        ax.grid(True, alpha=0.3)
        sol = solutions[name]
        t_star = _blowup_time(sol)
        if np.isfinite(t_star):
            head = f"{name}: blow-up at t* = {t_star:.4g}"
        else:
            t_end = float(_gaussian_rows(sol)[0][-1])
            head = f"{name}: {sol.status}, no blow-up on [0, {t_end:.3g}]"
        head += f"\nellipses for t in [0, {ts[-1]:.3g}]"
        if cut:
            head += f" (radius <= x{max_growth:g})"
        ax.set_title(head, fontsize="medium")
        ax.legend(loc="upper left", fontsize="small", framealpha=0.8)
        fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="t", shrink=0.8)
    if title is not None:
        fig.suptitle(title)
    return fig


def plot_covariance_eigenvalues(
    solutions: dict[str, GaussianSolution] | GaussianSolution,
    *,
    ax=None,
    title: str | None = None,
) -> Figure:
    """Eigenvalues of Sigma(t) against t (log scale), one colour per variant.

    The largest eigenvalue is a solid line, the others dotted; a dashed vertical
    line marks each finite blow-up time t*. Softmax attention on a Gaussian
    blows up like lambda_max ~ 1/(t* - t) when M = V A + A^T V^T has a positive
    direction; L2 (with K of full column rank) and Sinkhorn grow at most
    exponentially (Castin, Ablin, Carrillo & Peyre, 2025; docs/math/gaussians.md).
    Non-positive eigenvalues (rounding after a rank collapse) are not drawn.

    Args:
        solutions: a `GaussianSolution` (`mf.gaussian.simulate`), or variant
            name -> `GaussianSolution`.
        ax: 2-D axes to draw on; None creates a figure.
        title: axes title; None for a default.

    Returns:
        The figure.

    Raises:
        ValueError: no solutions, or a solution with no finite state.
        TypeError: `solutions` neither a GaussianSolution nor a dict of them.
    """
    solutions = _variants(solutions)
    fig, ax = new_axes(ax, figsize=(7.0, 4.5))
    for c, (name, sol) in enumerate(solutions.items()):
        color = f"C{c}"
        ts, _, cov = _gaussian_rows(sol)
        lam = np.linalg.eigvalsh(cov)  # ascending, (T, d)
        lam = np.where(lam > 0, lam, np.nan)
        d = lam.shape[1]
        for i in range(d):
            top = i == d - 1
            ax.semilogy(
                ts,
                lam[:, i],
                color=color,
                ls="-" if top else ":",
                lw=1.6 if top else 1.2,
                label=name if top else None,
            )
        t_star = _blowup_time(sol)
        if np.isfinite(t_star):
            ax.axvline(
                t_star, color=color, ls="--", lw=1.0, label=f"{name} t* = {t_star:.4g}"
            )
    handles, _ = ax.get_legend_handles_labels()
    handles += [
        Line2D([], [], color="0.3", ls="-", label=r"$\lambda_{\max}$"),
        Line2D([], [], color="0.3", ls=":", label="other eigenvalues"),
    ]
    ax.legend(handles=handles, fontsize="small", framealpha=0.8)
    ax.set_xlabel("t")
    ax.set_ylabel(r"eigenvalues of $\Sigma(t)$")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title if title is not None else r"covariance eigenvalues")
    return fig


def plot_blowup_phase_diagram(
    s_values,
    r_values,
    times,
    *,
    ax=None,
    t_max: float | None = None,
    point: tuple[float, float] | None = None,
    title: str | None = None,
    xlabel: str = "s",
    ylabel: str = "r",
    variant: str | None = None,
) -> Figure:
    """Blow-up time over a 2-parameter family of attention matrices A(s, r).

    For softmax attention on a Gaussian the covariance blows up in finite time
    iff M = V A + A^T V^T has a positive direction (closed form
    t* = 1 / lambda_max(Sigma0^{1/2} M Sigma0^{1/2}) when V commutes with M and
    Sigma0; Castin, Ablin, Carrillo & Peyre, 2025; docs/math/gaussians.md). Cells are
    coloured by t* (log scale when t* spans more than a decade); cells without
    blow-up on [0, t_max] (t* = +inf) are light grey, as the colorbar label and
    the legend say; NaN cells (failed solves) are blue.

    Args:
        s_values: first parameter, shape (S,) (x axis), monotonic.
        r_values: second parameter, shape (R,) (y axis), monotonic.
        times: blow-up times, shape (R, S) (row i is r_values[i]); +inf means no
            blow-up on [0, t_max], NaN a failed solve. Or the `BlowupStudy` of
            `mf.gaussian.blowup_times` over the R * S grid in row-major order
            (r slow, s fast, as `np.meshgrid(s_values, r_values)` ravelled): its
            times of `variant` are reshaped to (R, S), and its horizon is
            `t_max` unless given.
        ax: 2-D axes to draw on; None creates a figure.
        t_max: horizon of the study (for the labels); None if unknown.
        point: (s, r) marked with a star, e.g. the parameters of a simulated run.
        title: axes title; None for a default.
        xlabel: x axis label.
        ylabel: y axis label.
        variant: the variant of a `BlowupStudy` to draw; None when it has one.

    Returns:
        The figure.

    Raises:
        ValueError: `s_values`/`r_values` not 1-D and non-empty, or `times` not of
            shape (R, S) (a study: not R * S runs); `variant` not in the study,
            or None with several variants; `variant` without a study.
    """
    s = np.asarray(s_values, dtype=float)
    r = np.asarray(r_values, dtype=float)
    if isinstance(times, BlowupStudy):
        study = times
        if variant is None and len(study.times) != 1:
            raise ValueError(
                f"`variant` must name one of the study's variants "
                f"{sorted(study.times)}; got None."
            )
        variant = next(iter(study.times)) if variant is None else variant
        if variant not in study.times:
            raise ValueError(
                f"`variant` must be one of {sorted(study.times)}; got {variant!r}."
            )
        times = np.asarray(study.times[variant], dtype=float)
        if times.size != r.size * s.size:
            raise ValueError(
                f"`times` must be a study of len(r_values) * len(s_values) = "
                f"{r.size * s.size} runs; got {times.size}."
            )
        times = times.reshape(r.size, s.size)
        t_max = study.t_max if t_max is None else t_max
    elif variant is not None:
        raise ValueError("`variant` names a variant of a BlowupStudy `times`.")
    times = np.asarray(times, dtype=float)
    if s.ndim != 1 or s.size == 0 or r.ndim != 1 or r.size == 0:
        raise ValueError(
            "`s_values` and `r_values` must be non-empty 1-D arrays; got shapes "
            f"{s.shape} and {r.shape}."
        )
    if times.shape != (r.size, s.size):
        raise ValueError(
            f"`times` must have shape (len(r_values), len(s_values)) = "
            f"({r.size}, {s.size}); got {times.shape}."
        )
    fig, ax = new_axes(ax, figsize=(6.2, 5.0))
    finite = np.isfinite(times)
    never = np.isposinf(times)
    failed = np.isnan(times)
    horizon = f"[0, {t_max:g}]" if t_max is not None else "the horizon"
    grey, failed_color = "0.85", "tab:blue"  # blue is not in magma
    if never.any():
        ax.pcolormesh(
            s,
            r,
            np.ma.masked_where(~never, np.ones_like(times)),
            cmap=ListedColormap([grey]),
            shading="nearest",
        )
    if failed.any():
        ax.pcolormesh(
            s,
            r,
            np.ma.masked_where(~failed, np.ones_like(times)),
            cmap=ListedColormap([failed_color]),
            shading="nearest",
        )
    if finite.any():
        lo, hi = float(times[finite].min()), float(times[finite].max())
        norm = LogNorm(lo, hi) if lo > 0 and hi > 10 * lo else Normalize(lo, hi)
        mesh = ax.pcolormesh(
            s,
            r,
            np.ma.masked_where(~finite, times),
            cmap="magma",
            norm=norm,
            shading="nearest",
        )
        cbar = fig.colorbar(
            mesh, ax=ax, label=f"blow-up time t*  (grey: no blow-up on {horizon})"
        )
        # Plain numbers (0.5, 2), not 5 x 10^-1, on the (possibly log) colorbar;
        # minor log ticks labelled at 2, 3, 5 x 10^k only, so labels do not collide.
        cbar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        cbar.ax.yaxis.set_minor_formatter(
            FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "235" else "")
        )
    handles = [
        Patch(
            facecolor=grey,
            edgecolor="0.5",
            label=f"no blow-up on {horizon} ({never.mean():.0%})",
        )
    ]
    if failed.any():
        handles.append(
            Patch(facecolor=failed_color, edgecolor="0.5", label="solve failed")
        )
    if point is not None:
        ax.plot(
            *point,
            marker="*",
            ms=14,
            color="white",
            mec="k",
            ls="",
            label="simulated A",
        )
        handles.append(ax.get_lines()[-1])
    ax.legend(handles=handles, loc="upper left", fontsize="small", framealpha=0.9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title if title is not None else "softmax blow-up time")
    return fig
