"""Lipschitz constants against n: random, searched, bounds, a real model."""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ._common import new_axes


def _slope_label(name: str, slope: float) -> str:
    return f"{name} (slope {slope:.2f})" if np.isfinite(slope) else name


def _log2_ticks(ax, ns: np.ndarray) -> None:
    """Log-log axes with the measured sizes as plain x tick labels."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    # Plain numbers on y too; minor ticks labelled at 2, 3, 5 x 10^k only.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(
        FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "235" else "")
    )
    ax.grid(True, which="both", alpha=0.3)


def plot_lipschitz_scaling(study, *, ax=None, title: str | None = None) -> Figure:
    """Local Lipschitz constant against n (log-log), with the bounds dashed.

    Castin, Ablin & Peyre (ICML 2024): at the configuration of Prop. 3.4 the
    constant grows like sqrt(n), the rate of the upper bound of Thm 3.3; random
    inputs grow more slowly. Series: random inputs in B_R, the Prop. 3.4
    configuration, the best input of the gradient search (markers only), the
    upper and lower bounds (dashed); each legend entry gives the fitted log-log
    slope. Points where Lanczos did not converge are ringed in red.

    Args:
        study: a `ScalingStudy` (`mf.lipschitz.scaling_study`).
        ax: axes to draw on; None creates a figure.
        title: axes title; None for a default naming R.

    Returns:
        The figure.
    """
    fig, ax = new_axes(ax, figsize=(6.0, 4.5))
    ns = np.asarray(study.ns)
    unconverged = []
    measured = (
        ("random", "random inputs in $B_R$", "C0", "o-", study.random_converged),
        (
            "adversarial",
            "Prop. 3.4 configuration",
            "C1",
            "s-",
            study.adversarial_converged,
        ),
        ("searched", "gradient search", "C2", "^", study.searched_converged),
    )
    for name, label, color, style, ok in measured:
        values = getattr(study, name)
        if values is None:
            continue
        values = np.asarray(values, float)
        keep = np.isfinite(values)
        if not keep.any():
            continue
        ax.plot(
            ns[keep],
            values[keep],
            style,
            color=color,
            ms=6,
            label=_slope_label(label, study.slopes.get(name, np.nan)),
        )
        bad = keep & ~np.asarray(ok, bool)
        unconverged += list(zip(ns[bad], values[bad], strict=True))
    # The lower bound is the constant at the Prop. 3.4 configuration up to
    # rounding: a dashed line would vanish under that curve, so it is a wide
    # translucent band beneath it.
    bounds = (
        ("upper", "upper bound (Thm 3.3)", dict(ls="--", color="C3")),
        (
            "lower",
            "lower bound (Prop. 3.4)",
            dict(ls="-", lw=8, alpha=0.3, color="C4", solid_capstyle="butt", zorder=1),
        ),
    )
    for name, label, style in bounds:
        values = getattr(study, name)
        if values is not None:
            ax.plot(
                ns,
                values,
                label=_slope_label(label, study.slopes.get(name, np.nan)),
                **style,
            )
    if unconverged:
        xs, ys = zip(*unconverged, strict=True)
        ax.plot(
            xs, ys, "o", ms=11, mfc="none", mec="red", label="Lanczos not converged"
        )
    _log2_ticks(ax, ns)
    ax.set_xlabel("number of tokens n")
    ax.set_ylabel(r"local Lipschitz constant $\|D_X f\|_2$")
    ax.set_title(
        title if title is not None else f"self-attention on $B_R$, R = {study.R:g}"
    )
    # Below the axes: inside, it would cover some curve at any n range.
    ax.legend(
        fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2
    )
    return fig


def plot_real_model_lipschitz(result, *, ax=None, title: str | None = None) -> Figure:
    """Local Lipschitz constant of each attention layer against sequence length.

    As in Castin, Ablin & Peyre (ICML 2024), Fig. 1: one line per layer on
    log-log axes, the fitted slope in the legend, and a dotted sqrt(n) guide.

    Args:
        result: a `RealModelStudy` (`mf.lipschitz.real_model_study`).
        ax: axes to draw on; None creates a figure.
        title: axes title; None for a default.

    Returns:
        The figure.
    """
    fig, ax = new_axes(ax, figsize=(6.0, 4.5))
    lengths = np.asarray(result.lengths)
    values = np.asarray(result.values, float)
    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, max(len(values), 1)))
    for layer, row, slope, color in zip(
        result.layers, values, result.slopes, colors, strict=True
    ):
        ax.plot(
            lengths,
            row,
            "o-",
            color=color,
            ms=4,
            label=_slope_label(f"layer {int(layer)}", slope),
        )
    first = values[:, 0]
    first = first[np.isfinite(first) & (first > 0)]
    if lengths.size > 1 and first.size:
        # sqrt(n) guide through the geometric mean of the first column.
        ax.plot(
            lengths,
            np.exp(np.mean(np.log(first))) * np.sqrt(lengths / lengths[0]),
            ":",
            color="0.4",
            label=r"$\propto \sqrt{n}$",
        )
    _log2_ticks(ax, lengths)
    ax.set_xlabel("sequence length n")
    ax.set_ylabel(r"local Lipschitz constant $\|D_X f\|_2$")
    ax.set_title(title if title is not None else "self-attention layers on real text")
    ax.legend(fontsize="small", ncol=2)
    return fig
