"""The summary of `meanfield lipschitz`: numbers for the manifest, lines to print."""

import math

import numpy as np


def _gamma(A) -> float:
    """max(-lambda_min, lambda_max / 8) of (A + A^T)/2: the rate of Prop. 3.4."""
    A = np.asarray(A, float)
    lam = np.linalg.eigvalsh((A + A.T) / 2)
    return float(max(-lam[0], lam[-1] / 8))


def summarize_study(cfg: dict, study, real) -> dict:
    """The summary of a run: slopes, values at the largest n, ratios, convergence.

    Args:
        cfg: the resolved configuration.
        study: the `mf.lipschitz.scaling_study` result.
        real: the `mf.lipschitz.real_model_study` result, or None.

    Returns:
        A JSON-ready dict (stored in the manifest; `format_summary` prints it).
    """
    ns = study.ns
    last = -1
    gamma = _gamma(cfg["A"])
    at_last = {name: float(v[last]) for name, v in study.series().items()}
    at_last.pop("searched")

    def ratio(a, b):
        if a in at_last and b in at_last:
            return at_last[a] / at_last[b]
        return None

    searched = np.isfinite(study.searched)
    search = None
    if searched.any():
        i = int(np.flatnonzero(searched)[-1])
        search = {
            "n": int(ns[i]),
            "value": float(study.searched[i]),
            "random": float(study.random[i]),
            "adversarial": (
                None if study.adversarial is None else float(study.adversarial[i])
            ),
        }
    converged = {
        "random": [int(study.random_converged.sum()), int(ns.size)],
        "searched": [
            int(study.searched_converged[searched].sum()),
            int(searched.sum()),
        ],
    }
    if study.adversarial_converged is not None:
        converged["adversarial"] = [
            int(study.adversarial_converged.sum()),
            int(ns.size),
        ]
    summary = {
        "d": len(cfg["A"]),
        "R": cfg["R"],
        "gamma": gamma,
        # Prop. 3.4: the adversarial constant grows like sqrt(n) while
        # n << e^{2 gamma R^2}.
        "sqrt_n_regime_below": math.exp(2 * gamma * cfg["R"] ** 2)
        if gamma > 0
        else None,
        "ns": [int(n) for n in ns],
        "slopes": dict(study.slopes),
        "largest_n": int(ns[last]),
        "at_largest_n": at_last,
        "ratios": {
            "adversarial_over_upper": ratio("adversarial", "upper"),
            "adversarial_over_lower": ratio("adversarial", "lower"),
            "random_over_upper": ratio("random", "upper"),
        },
        "search": search,
        "converged": converged,
        "real_model": None,
    }
    if real is not None:
        summary["real_model"] = {
            "dtype": real.dtype,
            "masked": real.masked,
            "lengths": real.lengths.tolist(),
            "layers": real.layers.tolist(),
            "slopes": real.slopes.tolist(),
            "values": real.values.tolist(),
            "converged": [int(real.converged.sum()), int(real.converged.size)],
            "wall_s": float(real.wall_s.sum()),
        }
    return summary


def _g(value) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3g}"


def format_summary(summary: dict) -> str:
    """A few lines: slopes, values at the largest n, bound ratios, convergence."""
    ns = summary["ns"]
    lines = [
        f"softmax head, d = {summary['d']}, R = {summary['R']:g}, "
        f"n = {ns[0]}..{ns[-1]} ({len(ns)} sizes)"
        + (
            f"; sqrt(n) regime of Prop. 3.4 for n << e^(2 gamma R^2) = "
            f"{summary['sqrt_n_regime_below']:.3g}"
            if summary["sqrt_n_regime_below"] is not None
            else "; A has no adversarial direction"
        )
    ]
    lines.append(
        "log-log slopes: "
        + ", ".join(f"{k} {_g(v)}" for k, v in summary["slopes"].items())
    )
    lines.append(
        f"at n = {summary['largest_n']}: "
        + ", ".join(f"{k} {_g(v)}" for k, v in summary["at_largest_n"].items())
    )
    ratios = [
        f"{k.replace('_over_', ' / ')} {_g(v)}"
        for k, v in summary["ratios"].items()
        if v is not None
    ]
    if ratios:
        lines.append("  " + ", ".join(ratios))
    s = summary["search"]
    if s is not None:
        line = f"search at n = {s['n']}: {_g(s['value'])} (random {_g(s['random'])}"
        if s["adversarial"] is not None:
            line += (
                f", Prop. 3.4 configuration {_g(s['adversarial'])}, ratio "
                f"{_g(s['value'] / s['adversarial'])}"
            )
        lines.append(line + ")")
    lines.append(
        "Lanczos converged: "
        + ", ".join(f"{k} {a}/{b}" for k, (a, b) in summary["converged"].items())
    )
    real = summary["real_model"]
    if real is not None:
        lines.append(
            f"real model ({real['dtype']}"
            + (", causal mask" if real["masked"] else "")
            + f", n = {real['lengths'][0]}.."
            f"{real['lengths'][-1]}): slopes "
            + ", ".join(
                f"layer {l} {_g(s)}"
                for l, s in zip(real["layers"], real["slopes"], strict=True)
            )
            + f"; converged {real['converged'][0]}/{real['converged'][1]}"
        )
    return "\n".join(lines)
