"""The stability figure: measured W_p ratio and support radius against their bounds."""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ..wasserstein._stability import Stability


def plot_stability(st: Stability, *, title: str | None = None) -> Figure:
    """Stability figure: W_p ratio against its Gronwall bound, radius against its bound.

    Left: log10 of the measured ratio W_p(mu(t), nu(t)) / W_p(mu_0, nu_0) and of the
    bound C(t, R_0) against t. Log10 values are drawn on a linear axis because the
    bound overflows float64 quickly (e^{2|A|R^2} inside an exponential): it is drawn
    from `log_bound`, which stays finite. Right: support radius and R_0 e^{int|V|}
    (log scale).

    Args:
        st: a `Stability` result.
        title: optional figure title.

    Returns:
        The figure (two panels).
    """
    fig, (ax_ratio, ax_radius) = plt.subplots(1, 2, figsize=(10.0, 4.0))
    reached = np.isfinite(st.ratio)
    ts = st.ts[reached]
    label = "conditional " if st.method == "conditional" else ""
    ax_ratio.plot(
        ts,
        np.log10(st.ratio[reached]),
        marker=".",
        label=rf"measured $W_{{{st.p:g}}}$ ratio ({label}{st.method})",
    )
    finite = reached & np.isfinite(st.log_bound)
    if np.any(finite):
        ax_ratio.plot(
            st.ts[finite],
            st.log_bound[finite] / np.log(10),
            color="C3",
            ls="--",
            label=r"Gronwall bound $C(t, R_0)$",
        )
    else:
        ax_ratio.text(
            0.02, 0.95, "no bound for this attention", transform=ax_ratio.transAxes
        )
    ax_ratio.set_xlabel("t")
    ax_ratio.set_ylabel(r"$\log_{10}$ ratio")
    ax_ratio.grid(True, alpha=0.3)
    ax_ratio.legend(fontsize="small")

    ax_radius.semilogy(ts, st.radius[reached], marker=".", label="support radius")
    bounded = reached & np.isfinite(st.radius_bound)
    if np.any(bounded):
        ax_radius.semilogy(
            st.ts[bounded],
            st.radius_bound[bounded],
            color="C3",
            ls="--",
            label=r"$R_0 e^{\int \|V\|}$",
        )
    ax_radius.set_xlabel("t")
    ax_radius.set_ylabel("radius")
    ax_radius.grid(True, which="both", alpha=0.3)
    ax_radius.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
