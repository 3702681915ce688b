"""The energy staircase: interaction energy against log time, with atom counts."""

import numpy as np
from matplotlib.figure import Figure

from ..clustering._merging import MergingSolution
from ._common import new_axes


def plot_energy(
    ts,
    energy=None,
    *,
    log_energy=None,
    beta: float | None = None,
    counts=None,
    ax=None,
    title: str | None = None,
    label: str | None = None,
) -> Figure:
    """Interaction energy against t on a logarithmic time axis.

    Metastable clustering shows as a staircase: the energy stays flat while the
    clusters hold, and climbs one step at each merge (Geshkovski, Koubbi,
    Polyanskiy & Rigollet, 2024). With `beta` the curve is 2 beta e^{-beta} E =
    sum_ij w_i w_j e^{beta (<x_i, x_j> - 1)}, which is 1 for one cluster on the
    sphere. t <= 0 and non-finite values (save times not reached) are left out.

    Takes the result of `mf.simulate_merging` as it is
    (`plot_energy(mf.simulate_merging(...))`), or arrays.

    Args:
        ts: a `MergingSolution` (`mf.simulate_merging` with a known beta): its
            times, log energy, atom counts and beta are used, each unless given
            here; or the times, shape (T,).
        energy: E at each time, shape (T,) (`clustering.energy`).
        log_energy: log E instead of `energy` (finite for any beta).
        beta: the inverse temperature: normalise as above; None plots E as given
            (a `MergingSolution`'s own beta: normalised).
        counts: number of atoms or clusters at each time, shape (T,), drawn as a
            step curve against a right axis.
        ax: axes to draw on; None creates a figure.
        title: axes title; None for a default.
        label: legend label of the energy curve.

    Returns:
        The figure.

    Raises:
        ValueError: neither or both of energy and log_energy, shapes that do not
            match `ts`, or no positive finite time; a `MergingSolution` without
            energy (beta unknown), or with `energy`/`log_energy` also given.
    """
    if isinstance(ts, MergingSolution):
        run = ts
        if energy is not None or log_energy is not None:
            raise ValueError(
                "`energy` and `log_energy` must be None when `ts` is a "
                "MergingSolution (it holds its energy)."
            )
        if run.log_energy is None:
            raise ValueError(
                "`ts` is a MergingSolution without energy (beta unknown): pass "
                "`beta=` to `mf.simulate_merging`."
            )
        ts, log_energy = run.ts, run.log_energy
        beta = run.beta if beta is None else beta
        counts = run.counts if counts is None else counts
    ts = np.asarray(ts, dtype=float)
    if (energy is None) == (log_energy is None):
        raise ValueError("give exactly one of `energy` and `log_energy`.")
    log_e = (
        np.log(np.asarray(energy, float))
        if log_energy is None
        else np.asarray(log_energy, float)
    )
    if ts.ndim != 1 or log_e.shape != ts.shape:
        raise ValueError(
            f"`ts` must have shape (T,) and the energy the same; got {ts.shape} "
            f"and {log_e.shape}."
        )
    keep = (ts > 0) & np.isfinite(ts) & np.isfinite(log_e)
    if not keep.any():
        raise ValueError("no positive finite time with a finite energy to plot.")
    if beta is not None:
        log_e = log_e + np.log(2 * beta) - beta
    fig, ax = new_axes(ax, figsize=(6.5, 4.0))
    ax.plot(ts[keep], np.exp(log_e[keep]), label=label, color="C0")
    ax.set_xscale("log")
    ax.set_xlabel("t")
    ax.set_ylabel(r"$2\beta\, e^{-\beta} E$" if beta is not None else "E")
    ax.grid(True, which="both", alpha=0.3)
    if counts is not None:
        counts = np.asarray(counts, float)
        if counts.shape != ts.shape:
            raise ValueError(
                f"`counts` must have shape {ts.shape}; got {counts.shape}."
            )
        twin = ax.twinx()
        twin.step(ts[keep], counts[keep], where="post", color="C1", lw=1.0)
        twin.set_ylabel("atoms", color="C1")
        twin.set_yscale("log")
        twin.yaxis.set_major_formatter(lambda v, _: f"{v:g}")
    if label:
        ax.legend(fontsize="small")
    ax.set_title(title if title is not None else "energy")
    return fig
