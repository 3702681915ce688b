"""The progress bar of a solve: how far along its time interval, and how long left.

diffrax's `TqdmProgressMeter` counts a solve in percent of its time interval
(tqdm's `unit="%"`), so tqdm's rate reads "12.3%/s": a rate of a percentage,
which nobody asked for. `ProgressMeter` draws the same bar, with the percentage,
the elapsed and the remaining time, and no rate.
"""

import diffrax as dfx


class ProgressMeter(dfx.TqdmProgressMeter):
    """diffrax's tqdm bar without the rate: "37.00%|███▋      | [00:02<00:03]".

    Args:
        refresh_steps: solver steps between two redraws of the bar (each redraw
            is a host callback).
    """

    @staticmethod
    def _init_bar():
        # diffrax exposes no bar format: the bar is built here, as diffrax builds
        # it (total 100, advanced by diffrax to the percentage), minus the rate.
        import tqdm

        return tqdm.tqdm(
            total=100,
            bar_format="{percentage:.2f}%|{bar}| [{elapsed}<{remaining}]",
        )


def progress_meter(progress: bool) -> dfx.AbstractProgressMeter:
    """`ProgressMeter()` when `progress`, else diffrax's `NoProgressMeter()`."""
    return ProgressMeter(refresh_steps=20) if progress else dfx.NoProgressMeter()
