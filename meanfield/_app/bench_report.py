"""n-scaling benchmark of one softmax velocity evaluation (`meanfield bench`).

Times naive NumPy, dense JAX, blocked JAX, the default JAX path (`blocking="auto"`),
jax.nn.dot_product_attention and KeOps (when pykeops imports) on Gamma(x_i) =
sum_j softmax_j(<A x_i, x_j>) V x_j, float32, against this machine's floor measured
in the same run (n^2 exps at the measured exp rate + 4 n^2 d flops at the measured
matmul rate); the engine is `bench`, the options `bench_config`. Writes
nscaling_<device>.json (after every case, atomically) and a log-log plot
nscaling_<device>.png.

    meanfield bench --ns 2^10 2^14 --ds 2 16 --impls numpy jax_blocked
    meanfield bench --quick --out out/bench
"""

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import _io
from . import bench_config
from .report import Output, fail, use_agg

#: Said by `meanfield bench --help`: the command has no `--resume`.
NOT_RESUMABLE = (
    "Not resumable (no --resume): an interrupted run starts again from the beginning."
)
COLORS = {
    "numpy": "tab:blue",
    "jax_dense": "tab:orange",
    "jax_blocked": "tab:green",
    "jax_default": "darkgreen",
    "jax_sdpa": "tab:red",
    "keops": "tab:purple",
    "jax_fused": "black",
    "jax_fused_bf16": "tab:gray",
    "jax_cudnn_bf16": "tab:brown",
    "jax_cudnn_fp16": "tab:pink",
    "torch_sdpa": "tab:olive",
    "torch_sdpa_bf16": "tab:cyan",
}
MARKERS = ["o", "s", "^", "D", "v", "P"]


def device_name() -> str:
    """The results' name: cpu, or the accelerator kind as a file-name fragment.

    Returns:
        e.g. "cpu" or "nvidia_h100_80gb_hbm3".
    """
    import jax

    device = jax.devices()[0]
    if device.platform == "cpu":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "_", device.device_kind.lower()).strip("_")


def plot(result: dict):
    """Two log-log panels: seconds and interactions/s against n, floor dashed.

    Args:
        result: a `bench.run` result (or its JSON).

    Returns:
        The matplotlib figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from .bench_machine import floor_seconds

    ok = [r for r in result["records"] if r["status"] == "ok"]
    ds = sorted({r["d"] for r in result["records"]})
    marker = {d: MARKERS[i % len(MARKERS)] for i, d in enumerate(ds)}
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(12, 4.8))
    for impl in result["config"]["impls"]:
        for d in ds:
            sel = sorted(
                (r for r in ok if r["impl"] == impl and r["d"] == d),
                key=lambda r: r["n"],
            )
            if not sel:
                continue
            ns = [r["n"] for r in sel]
            style = dict(color=COLORS.get(impl), marker=marker[d], ms=4, lw=1.2)
            ax_t.plot(ns, [r["seconds"] for r in sel], **style)
            ax_r.plot(ns, [r["interactions_per_second"] for r in sel], **style)
    all_ns = [r["n"] for r in result["records"]]
    lo, hi = min(all_ns), max(all_ns)
    for d in ds:
        rate = 1 / floor_seconds(1, d, result["floor"]["used"])
        ax_r.plot(
            [lo, hi],
            [rate, rate],
            "k--",
            lw=0.9,
            marker=marker[d],
            ms=4,
            markevery=[0, 1],
            alpha=0.6,
        )
        floor_t = [floor_seconds(n, d, result["floor"]["used"]) for n in (lo, hi)]
        ax_t.plot([lo, hi], floor_t, "k--", lw=0.9, alpha=0.6)
    for ax, label in ((ax_t, "seconds per evaluation"), (ax_r, "interactions / s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n (particles)")
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
    handles = [
        Line2D([], [], color=COLORS.get(i), lw=2, label=i)
        for i in result["config"]["impls"]
        if any(r["impl"] == i for r in ok)
    ]
    handles += [
        Line2D([], [], color="0.3", marker=marker[d], ls="none", label=f"d = {d}")
        for d in ds
    ]
    handles.append(Line2D([], [], color="k", ls="--", label="floor (per d)"))
    fig.legend(handles=handles, fontsize=8, loc="center right")
    env = result["environment"]
    device = env["device"]["device_kind"]
    if env["device"]["platform"] == "cpu":
        device = f"{env['cpu']['model']} CPU, {env['cpu']['cores']} cores"
    ax_t.set_title(f"one softmax velocity, float32: {device}", fontsize=10)
    fl = result["floor"]["used"]
    ax_r.set_title(
        f"floor: exp {fl['exp_per_second']:.2g}/s, "
        f"matmul {fl['matmul_flops_per_second'] / 1e9:.0f} GFLOP/s",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    return fig


def summary(result: dict) -> str:
    """One line per timed case: seconds, rate, fraction of floor, memory, error.

    Args:
        result: a `bench.run` result.

    Returns:
        The table, with a header line.
    """
    lines = [
        f"{'impl':<12} {'n':>8} {'d':>4} {'seconds':>10} {'inter/s':>9} "
        f"{'floor':>6} {'peak MiB':>9} {'rel err':>8}"
    ]
    for r in result["records"]:
        if r["status"] != "ok":
            continue
        peak = r["peak_bytes"]
        lines.append(
            f"{r['impl']:<12} {r['n']:>8} {r['d']:>4} {r['seconds']:>10.4g} "
            f"{r['interactions_per_second']:>9.3g} {r['fraction_of_floor']:>6.2f} "
            f"{'?' if peak is None else f'{peak / 2**20:.0f}':>9} "
            f"{r['rel_error']:>8.1e}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`meanfield bench` / `python benchmarks/nscaling.py`: run, save, plot.

    Args:
        argv: the arguments after `bench`; None reads `sys.argv[1:]`.

    Returns:
        The exit status: 0, or 2 for a bad configuration.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = bench_config.parse(argv, f"{__doc__.splitlines()[0]} {NOT_RESUMABLE}")
    except ValueError as err:
        return fail("bench", err)
    use_agg()
    if args.replot:
        # Into --out, never beside the JSON: that may be a committed result.
        path = Path(args.replot)
        try:
            results = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            return fail("bench", f"cannot read --replot {str(path)!r}: {err}")
        try:
            target = Output(args.out).dir / path.with_suffix(".png").name
        except ValueError as err:  # empty, cannot be created or written
            return fail("bench", err)
        try:
            _io.save_figure(plot(results), target, dpi=120)
        except OSError as err:
            return fail("bench", f"cannot write to {args.out!r}: {err}")
        print(f"wrote {target}")
        return 0
    # The engine imports JAX (in `_measure`): only once a run is asked for.
    try:
        output = Output(args.out, progress=args.progress)
        output.lock()  # two benchmarks never write into one directory
    except ValueError as err:  # DirectoryInUse, or an unusable --out
        return fail("bench", err)
    try:
        return _measure(args, output)
    except OSError as err:  # full disk, directory removed mid-run
        return fail("bench", f"cannot write to {args.out!r}: {err}")
    finally:
        output.unlock()


def _measure(args, output: Output) -> int:
    """Run the cases of `args` into `output` (locked), save and plot them."""
    from . import bench as _bench

    name = f"nscaling_{args.name or device_name()}"

    def save(result):
        # After every case (atomically): an interrupted run keeps what it measured.
        manifest = output.describe(vars(args), args.seed)
        output.json(f"{name}.json", dict(manifest=manifest, **result))

    result = _bench.run(
        args.ns,
        args.ds,
        args.impls,
        solve_steps=args.solve_steps,
        solve_max_n=args.solve_max_n,
        repeats=args.repeats,
        max_seconds_per_case=args.max_seconds,
        max_bytes=args.max_gib * bench_config.GIB,
        block_size=args.block_size,
        max_n=bench_config.limits(args.max_n, bench_config.size),
        only_ds=bench_config.limits(
            args.only_ds, lambda v: [int(d) for d in v.split(",")]
        ),
        on_record=save,
        progress=args.progress,
        seed=args.seed,
    )
    save(result)
    output.figure(plot(result), f"{name}.png", dpi=120)
    print(summary(result))
    print(f"wrote {output.dir / name}.json and .png")
    return 0
