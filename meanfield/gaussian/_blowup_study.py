"""The result of a batched blow-up study: each run's class, time, rank and rate."""

import equinox as eqx
import numpy as np

from .. import _status
from .._repr import fields_repr


class BlowupStudy(eqx.Module):
    """Fate of a batch of parameter sets on [t0, t_max], per attention variant.

    Every run ends in one class (`status`):
    - "blowup": lambda_max(Sigma) diverges at `times` <= t_max;
    - "stationary": Sigma stopped moving before t_max (|Sigma'| / |Sigma| times
      t_max - t0 below the tolerance, or below the solve's resolution): a steady,
      typically rank-deficient Gaussian (clustering);
    - "success": reached t_max; `rate` says whether Sigma grows (> 0) or contracts
      (< 0) there;
    - "max_steps" / "failed": not classified (step budget; non-finite field).

    See [How a run ends][math-study-outcomes] for the rules behind each class.

    Attributes:
        t_max: the horizon of the study.
        times: variant name -> blow-up times (batch,), +inf for no blow-up.
        fraction: variant name -> fraction of the batch that blows up.
        rank: variant name -> numerical rank (batch,) of Sigma at the end (relative
            to its top eigenvalue, `rank_rtol`); -1 for blow-ups and failures.
        rate: variant name -> exponential rate d log tr Sigma / dt at the end
            (batch,); +inf for blow-ups, NaN for failures.
        status: variant name -> result codes (batch,) (`mf.Status`: e.g.
            `study.status[name] == mf.Status.BLOWUP`); `status_names(name)`
            gives them by name, `classes(name)` the fraction of runs in each
            class.
        steps: variant name -> solver steps per run (batch,).
    """

    t_max: float
    times: dict
    fraction: dict
    rank: dict
    rate: dict
    status: dict
    steps: dict

    def classes(self, name: str) -> dict[str, float]:
        """{class name: fraction of the runs} of one variant.

        Args:
            name: the variant (a key of `status`).

        Returns:
            The fraction of the batch in each class that occurs, by class name
            ("blowup", "stationary", "success", "max_steps", "failed").
        """
        codes = np.asarray(self.status[name])
        return {_status.name(c): float(np.mean(codes == c)) for c in np.unique(codes)}

    def status_names(self, name: str) -> np.ndarray:
        """The class of every run of one variant, by name.

        Args:
            name: the variant (a key of `status`).

        Returns:
            Names (batch,) of `status[name]`, e.g. "blowup" (`mf.Status.label`).
        """
        return np.atleast_1d(_status.names(self.status[name]))

    def __repr__(self) -> str:
        runs = {name: int(np.size(codes)) for name, codes in self.status.items()}
        return fields_repr(
            self,
            t_max=self.t_max,
            runs=runs,
            classes={name: self.classes(name) for name in self.status},
        )
