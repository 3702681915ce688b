"""n-scaling benchmark of one softmax velocity evaluation (`meanfield bench`).

Times naive NumPy, dense JAX, blocked JAX, jax.nn.dot_product_attention and KeOps
(when pykeops imports) on Gamma(x_i) = sum_j softmax_j(<A x_i, x_j>) V x_j, float32,
against this machine's floor measured in the same run (n^2 exps at the measured exp
rate + 4 n^2 d flops at the measured matmul rate); the engine is `_bench`. Writes
nscaling_<device>.json (after every case, atomically) and a log-log plot
nscaling_<device>.png.

    meanfield bench --ns 2^10 2^14 --ds 2 16 --impls numpy jax_blocked
    meanfield bench --quick --out out/bench
"""

import argparse
import json
import re
import sys
import time
from pathlib import Path

import jax
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from .. import _io
from . import bench as _bench

COLORS = {
    "numpy": "tab:blue",
    "jax_dense": "tab:orange",
    "jax_blocked": "tab:green",
    "jax_sdpa": "tab:red",
    "keops": "tab:purple",
}
MARKERS = ["o", "s", "^", "D", "v", "P"]


def size(text: str) -> int:
    """An integer, or a power written 2^k / 2**k."""
    match = re.fullmatch(r"(\d+)\s*(?:\^|\*\*)\s*(\d+)", text)
    return int(match[1]) ** int(match[2]) if match else int(text)


def limits(items: list[str], parse) -> dict:
    """impl=value pairs, e.g. numpy=16384 or keops=2,16."""
    out = {}
    for item in items or []:
        impl, _, value = item.partition("=")
        out[impl] = parse(value)
    return out


def device_name() -> str:
    """Results name: cpu, or the accelerator kind as a file-name fragment."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "_", device.device_kind.lower()).strip("_")


def plot(result: dict, path: Path) -> None:
    """Two log-log panels: seconds and interactions/s against n, floor dashed."""
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
        rate = 1 / _bench.floor_seconds(1, d, result["floor"]["used"])
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
        floor_t = [
            _bench.floor_seconds(n, d, result["floor"]["used"]) for n in (lo, hi)
        ]
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
    _io.savefig_atomic(fig, path, dpi=120)
    plt.close(fig)


def summary(result: dict) -> str:
    """One line per timed case: seconds, rate, fraction of floor, memory, error."""
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


#: TOML keys of `--config` and their types (lists hold ints, or names for impls).
CONFIG_KEYS = {
    "ns": list,
    "ds": list,
    "impls": list,
    "repeats": int,
    "max_seconds": float,
    "max_gib": float,
    "block_size": int,
    "solve_steps": int,
}


#: Defaults of the options left unset (None) by the command line and the config.
FULL_DEFAULTS = {
    "ns": [2**k for k in range(10, 21)],
    "ds": [2, 16, 64, 128],
    "repeats": 3,
    "solve_steps": 10,
}
QUICK_DEFAULTS = {
    "ns": [2**k for k in range(10, 14)],
    "ds": [2, 16],
    "repeats": 1,
    "solve_steps": 3,
}


def _apply_config(args, argv) -> None:
    """Fill options from the TOML file unless given on the command line."""
    import tomllib

    try:
        with open(args.config, "rb") as f:
            raw = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"cannot read {args.config!r}: {err}") from err
    for key, value in raw.items():
        if key not in CONFIG_KEYS:
            known = sorted(CONFIG_KEYS)
            raise ValueError(f"unknown key `{key}`; expected one of {known}")
        kind = CONFIG_KEYS[key]
        ok = isinstance(value, kind) and not isinstance(value, bool)
        if kind is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if kind is list and ok:
            want = str if key == "impls" else int
            ok = len(value) > 0 and all(isinstance(v, want) for v in value)
            if ok and key == "impls":
                ok = all(v in _bench.IMPLS for v in value)
        if not ok:
            raise ValueError(f"`{key}` has a wrong type or value: {value!r}")
        if f"--{key.replace('_', '-')}" not in argv:
            setattr(args, key, value)


def main(argv=None) -> int:
    """`meanfield bench` / `python benchmarks/nscaling.py`: run, save, plot."""
    parser = argparse.ArgumentParser(
        prog="meanfield bench", description=__doc__.splitlines()[0]
    )
    # None: the full (or --quick) defaults below; explicit values always win.
    parser.add_argument("--ns", type=size, nargs="+", default=None)
    parser.add_argument("--ds", type=int, nargs="+", default=None)
    parser.add_argument(
        "--impls", nargs="+", default=list(_bench.IMPLS), choices=_bench.IMPLS
    )
    parser.add_argument("--out", default="benchmarks/results", help="directory")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="defaults n = 2^10..2^13, d = 2 16, one repeat, 3-step solve "
        "(explicit --ns, --ds, --repeats, --solve-steps still apply)",
    )
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help="time budget per case (evaluations + solve)",
    )
    parser.add_argument(
        "--max-gib", type=float, default=3.0, help="memory budget of one evaluation"
    )
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--solve-steps", type=int, default=None)
    parser.add_argument("--solve-max-n", type=size, default=None)
    parser.add_argument(
        "--max-n",
        nargs="*",
        default=["numpy=16384"],
        metavar="IMPL=N",
        help="largest n per implementation",
    )
    parser.add_argument(
        "--only-ds",
        nargs="*",
        default=[],
        metavar="IMPL=D,D",
        help="dimensions per implementation, e.g. keops=2,16",
    )
    parser.add_argument(
        "--replot", default=None, metavar="JSON", help="only redraw a results file"
    )
    parser.add_argument(
        "--name", default=None, help="results name (default: the device, e.g. cpu)"
    )
    parser.add_argument(
        "--config",
        metavar="FILE.toml",
        default=None,
        help=f"TOML with any of {sorted(CONFIG_KEYS)}; command-line options win",
    )
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no case lines"
    )
    args = parser.parse_args(argv)
    if args.config is not None:
        try:
            _apply_config(args, argv or [])
        except ValueError as err:
            print(f"meanfield bench: error: {err}", file=sys.stderr)
            return 2
    if args.replot:
        path = Path(args.replot)
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
        return 0
    defaults = QUICK_DEFAULTS if args.quick else FULL_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"nscaling_{args.name or device_name()}"
    start = time.perf_counter()

    def save(result):
        # After every case (atomically): an interrupted run keeps what it measured.
        manifest = _io.manifest(vars(args), 0, time.perf_counter() - start)
        _io.write_manifest(out / f"{name}.json", dict(manifest=manifest, **result))

    result = _bench.run(
        args.ns,
        args.ds,
        args.impls,
        solve_steps=args.solve_steps,
        solve_max_n=args.solve_max_n,
        repeats=args.repeats,
        max_seconds_per_case=args.max_seconds,
        max_bytes=args.max_gib * _bench.GIB,
        block_size=args.block_size,
        max_n=limits(args.max_n, size),
        only_ds=limits(args.only_ds, lambda v: [int(d) for d in v.split(",")]),
        on_record=save,
        progress=args.progress,
    )
    save(result)
    plot(result, out / f"{name}.png")
    print(summary(result))
    print(f"wrote {out / name}.json and .png")
    return 0
