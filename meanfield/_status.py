"""Result codes of solvers, as integers (jit-friendly) and their user-facing names.

`Status` is the public face (`mf.Status`); the module constants are the same codes
as plain ints, for use inside traced code (`jnp.where(..., BLOWUP, code)`).
"""

import enum

import numpy as np


class Status(enum.IntEnum):
    """Result codes of the solvers and studies, readable by name.

    Results store a status as an integer code, so that it can live in a
    jit-compiled, vmapped result: `Solution.result`, `GaussianSolution.result`,
    `BlowupStudy.status[variant]`. Their `status` properties (and
    `BlowupStudy.status_names`) give the names; `Status(code).label` is the name
    of one code, and `sol.result == mf.Status.BLOWUP` tests for one (an
    `IntEnum` compares equal to its code, in NumPy and JAX arrays too).

    Attributes:
        SUCCESS: reached the final time (label "success").
        BLOWUP: stopped at a finite-time blow-up (label "blowup").
        MAX_STEPS: ran out of solver steps (label "max_steps").
        SINKHORN_NOT_CONVERGED: a Sinkhorn attention's iterations did not
            converge, so the field is not the model's (label
            "sinkhorn_not_converged").
        FAILED: any other failure, e.g. a non-finite state or a step below the
            floor (label "failed").
        STATIONARY: a Gaussian study's covariance stopped moving before its
            horizon (`mf.gaussian.blowup_times`; label "stationary").
        INVALID_INPUT: an input check that `mf.simulate` makes on the host failed
            on inputs traced under jax.jit or jax.vmap, where it cannot raise: a
            zero token under a normalization that needs its direction, a
            start at or beyond `blowup_radius`, or a noise level `sigma` that
            is negative, NaN or infinite (label "invalid_input"). Concrete
            inputs (including `mf.simulate_ensemble`'s) raise a ValueError.
    """

    SUCCESS = 0
    BLOWUP = 1
    MAX_STEPS = 2
    SINKHORN_NOT_CONVERGED = 3
    FAILED = 4
    STATIONARY = 5
    INVALID_INPUT = 6

    @property
    def label(self) -> str:
        """The name results report: "success", "blowup", "max_steps", ..."""
        return self.name.lower()


SUCCESS = int(Status.SUCCESS)
BLOWUP = int(Status.BLOWUP)
MAX_STEPS = int(Status.MAX_STEPS)
SINKHORN_NOT_CONVERGED = int(Status.SINKHORN_NOT_CONVERGED)
FAILED = int(Status.FAILED)
STATIONARY = int(Status.STATIONARY)
INVALID_INPUT = int(Status.INVALID_INPUT)

NAMES = {int(s): s.label for s in Status}


def name(code) -> str:
    """User-facing status string of a (concrete) result code."""
    return NAMES[int(code)]


def names(codes) -> str | np.ndarray:
    """`name` of one code, or an array of names (object dtype) of an array of them."""
    codes = np.asarray(codes)
    if codes.ndim == 0:
        return name(codes)
    return np.vectorize(name, otypes=[object])(codes)
