"""The number of clusters over time (with the tolerance used, on a twin axis)."""

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ..clustering._over_time import ClusterCounts
from ._common import new_axes

_TOL_AXES_LABEL = "meanfield: tolerance"


def _tolerance_axes(ax):
    """The twin y-axis holding tolerance curves of `ax`, created on first use."""
    for other in ax.figure.axes:
        if (
            other is not ax
            and other.get_label() == _TOL_AXES_LABEL
            and other.get_shared_x_axes().joined(ax, other)
        ):
            return other
    twin = ax.twinx()
    twin.set_label(_TOL_AXES_LABEL)
    twin.set_yscale("log")
    twin.set_ylabel("tolerance (dashed)")
    return twin


def plot_cluster_counts(
    ts,
    counts=None,
    *,
    tol=None,
    ax=None,
    title: str | None = None,
    label: str | None = None,
    method=None,
) -> Figure:
    """Number of clusters against t, as a step plot.

    Tokens under self-attention merge into clusters (Geshkovski, Letrouit,
    Polyanskiy & Rigollet, 2023): the count is piecewise constant and, in the
    long run, non-increasing. The y-axis is logarithmic when the counts span more
    than a factor 10 (from n tokens down to a few clusters), with plain integer
    labels. Call again on the same `ax` to compare runs (`label` names each
    curve). Times that are not finite (save times after an early stop) are
    skipped.

    Takes the result of `mf.clustering.cluster_counts` as it is
    (`plot_cluster_counts(mf.clustering.cluster_counts(sol))`), or its arrays.

    Args:
        ts: a `ClusterCounts` (`mf.clustering.cluster_counts`): its times,
            counts, and, unless `tol` is given here, its tolerances and how
            each was chosen; or the times, shape (T,).
        counts: number of clusters at each time, shape (T,); None with a
            `ClusterCounts`.
        tol: the clustering tolerance: a scalar, given in the legend, or one per
            time, shape (T,), drawn dashed against a logarithmic right axis when
            it varies. None for no annotation.
        ax: 2-D axes to draw on; None creates a figure.
        title: axes title; None for a default.
        label: legend label of this curve; None for none (unless `tol` is given).
        method: how each tolerance was chosen, shape (T,) (`ClusterCounts.method`):
            the varying tolerance is then drawn dotted where it is the relative
            fallback (1e-2 max|x|, no gap yet) and dashed where it sits in a gap of
            the merge heights, each with its legend entry, so that the jump
            between the two rules is explained. None: one dashed line.

    Returns:
        The figure.

    Raises:
        ValueError: `ts`, `counts` or `tol` of the wrong shape, no finite time,
            or a negative count; `counts` missing, or given with a
            `ClusterCounts`.
    """
    if isinstance(ts, ClusterCounts):
        if counts is not None:
            raise ValueError(
                "`counts` must be None when `ts` is a ClusterCounts (it holds them)."
            )
        result = ts
        ts, counts = result.ts, result.counts
        if tol is None:  # the result's tolerances, with how each was chosen
            tol = result.tol
            method = result.method if method is None else method
    elif counts is None:
        raise ValueError(
            "`counts` is needed with times `ts`; or pass the ClusterCounts of "
            "`mf.clustering.cluster_counts` alone."
        )
    ts = np.asarray(ts, dtype=float)
    counts = np.asarray(counts)
    if ts.ndim != 1:
        raise ValueError(f"`ts` must have shape (T,); got shape {ts.shape}.")
    if counts.shape != ts.shape:
        raise ValueError(
            f"`counts` must have shape {ts.shape} to match `ts`; got {counts.shape}."
        )
    tols = None if tol is None else np.asarray(tol, dtype=float)
    if tols is not None and tols.shape not in ((), ts.shape):
        raise ValueError(
            f"`tol` must be a scalar or have shape {ts.shape}; got {tols.shape}."
        )
    methods = None if method is None else np.asarray(method, dtype=str)
    if methods is not None and (tols is None or methods.shape != ts.shape):
        raise ValueError(
            f"`method` must have shape {ts.shape} and come with a `tol` per time; "
            f"got shape {methods.shape}."
        )
    keep = np.isfinite(ts) & np.isfinite(counts.astype(float))
    if not keep.any():
        raise ValueError("no finite time with a finite count: nothing to plot.")
    ts, counts = ts[keep], counts[keep]
    if np.any(counts < 0):
        raise ValueError("`counts` must be nonnegative.")
    if methods is not None:
        methods = methods[keep]
    if tols is not None and tols.ndim == 1:
        tols = tols[keep]
        finite_tols = tols[np.isfinite(tols)]
        if finite_tols.size and np.all(finite_tols == finite_tols[0]):
            tols = finite_tols[0]  # constant: annotate once, in the legend
    fig, ax = new_axes(ax, figsize=(6.0, 4.0))
    text = label
    if tols is not None and tols.ndim == 0:
        suffix = f"tol = {float(tols):.3g}"
        text = f"{label} ({suffix})" if label else suffix
    (line,) = ax.step(ts, counts, where="post", label=text)
    positive = counts[counts > 0]
    if positive.size and positive.max() > 10 * positive.min():
        ax.set_yscale("log")
    if ax.get_yscale() == "log":
        # Plain numbers (2, 50, 200), not 2 x 10^0: counts are integers.
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(
            FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else "")
        )
    else:
        ax.yaxis.get_major_locator().set_params(integer=True)
    handles = []
    if tols is not None and tols.ndim == 1:
        twin = _tolerance_axes(ax)
        ok = np.isfinite(tols) & (tols > 0)
        name = f"{label} tolerance" if label else "tolerance"
        drawn = tols[ok]
        if drawn.size and drawn.max() <= drawn.min() * (1 + 1e-9):
            # One value (to rounding): a log axis cannot autoscale on it. Fixed
            # limits before drawing (an autoscale pending at set_ylim would warn).
            twin.set_ylim(drawn.min() / 2, drawn.max() * 2)
        if methods is None:
            parts = [(ok, "--", name)]
        else:
            relative = methods == "relative"
            parts = [
                (ok & relative, ":", f"{name}: 1e-2 max|x| (no gap yet)"),
                (ok & ~relative, "--", f"{name}: in a gap of the merge heights"),
            ]
        for sel, style, text in parts:
            if sel.any():
                # NaN outside the selection: each rule's stretch is drawn alone.
                twin.plot(
                    ts,
                    np.where(sel, tols, np.nan),
                    ls=style,
                    lw=0.9,
                    color=line.get_color(),
                    label=text,
                )
        handles = twin.get_lines()
    ax.set_xlabel("t")
    ax.set_ylabel("number of clusters")
    ax.grid(True, which="both", alpha=0.3)
    labelled = [h for h in ax.get_lines() + list(handles) if h.get_label()[:1] != "_"]
    if labelled:
        ax.legend(handles=labelled, fontsize="small")
    ax.set_title(title if title is not None else "clusters")
    return fig


def plot_phase_diagram(
    diagram,
    *,
    log_time: bool = False,
    theory: bool = True,
    ax=None,
    title: str | None = None,
) -> Figure:
    """Heat map of the merged-pair fraction over (t, beta), with the equiangular curve.

    The clustering phase diagram of Geshkovski, Letrouit, Polyanskiy & Rigollet
    (2023): colour is `diagram.density`, the mean fraction of aligned token pairs.
    The white curve is the time at which n equiangular tokens starting orthogonal
    (rho0 = 0) merge to within eps (`mf.clustering.equiangular_time`), drawn where
    it falls inside the time range.

    Args:
        diagram: a `mf.clustering.PhaseDiagram`.
        log_time: logarithmic time axis (t = 0 is then left out).
        theory: draw the equiangular curve.
        ax: axes to draw on (default: a new figure).
        title: axes title.

    Returns:
        The figure.
    """
    fig, ax = new_axes(ax)
    ts, betas = np.asarray(diagram.ts), np.asarray(diagram.betas)
    keep = ts > 0 if log_time else np.ones(ts.shape, bool)
    mesh = ax.pcolormesh(
        ts[keep], betas, diagram.density[:, keep], shading="nearest", vmin=0, vmax=1
    )
    fig.colorbar(mesh, ax=ax, label=f"aligned pairs (<θᵢ, θⱼ> > 1 − {diagram.eps:g})")
    if theory:
        curve = diagram.theory()
        inside = curve <= ts[keep].max()
        ax.plot(
            curve[inside], betas[inside], color="white", lw=1.5, label="equiangular"
        )
        ax.legend(loc="lower right")
    if log_time:
        ax.set_xscale("log")
    ax.set_xlabel("t")
    ax.set_ylabel("β")
    ax.set_title(title or f"n = {diagram.n}: pair alignment")
    return fig
