"""Result codes of solvers, as integers (jit-friendly) and their user-facing names."""

SUCCESS = 0
BLOWUP = 1
MAX_STEPS = 2
SINKHORN_NOT_CONVERGED = 3
FAILED = 4
STATIONARY = 5

NAMES = {
    SUCCESS: "success",
    BLOWUP: "blowup",
    MAX_STEPS: "max_steps",
    SINKHORN_NOT_CONVERGED: "sinkhorn_not_converged",
    FAILED: "failed",
    STATIONARY: "stationary",
}


def name(code) -> str:
    """User-facing status string of a (concrete) result code."""
    return NAMES[int(code)]
