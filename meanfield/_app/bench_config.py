"""Options of `meanfield bench`: the implementations, the schema and the parser.

The benchmark's settings are one schema (`config.Key` per TOML key, as for the
other commands), filled from three places in order of precedence: the command
line, the `--config` TOML file, then the defaults (`QUICK` ones with `--quick`).
Options of a single run (`--out`, `--name`, `--max-n`, ...) are command-line only.
Imports no JAX: `meanfield bench --help` answers at once.
"""

import argparse
import re
from collections.abc import Callable, Sequence
from typing import Any

from .config import (
    Key,
    int_list,
    integer,
    load_toml,
    names,
    number,
    resolve,
    with_defaults,
)

#: The implementations timed (see `meanfield._app.bench`). After the first six:
#: meanfield's fused Pallas kernel (GPU only: elsewhere it is interpreted), and
#: the accelerator peers, cuDNN's fused attention through JAX (GPU only) and
#: PyTorch's `scaled_dot_product_attention` (when torch imports).
IMPLS = (
    "numpy",
    "jax_dense",
    "jax_blocked",
    "jax_default",
    "jax_sdpa",
    "keops",
    "jax_fused",
    "jax_fused_bf16",
    "jax_cudnn_bf16",
    "jax_cudnn_fp16",
    "torch_sdpa",
    "torch_sdpa_bf16",
)
#: Run when none are named: the ones that apply on a CPU.
DEFAULT_IMPLS = IMPLS[:6]
#: Input precision of each implementation (float32 unless named here).
HALF_IMPLS = {
    "jax_fused_bf16": "bfloat16",
    "jax_cudnn_bf16": "bfloat16",
    "jax_cudnn_fp16": "float16",
    "torch_sdpa_bf16": "bfloat16",
}
#: Implementations that also time a fixed-step solve through `mf.simulate`.
SOLVE_IMPLS = ("jax_dense", "jax_blocked")
GIB = 2**30

#: TOML keys (and the options of the same names): key -> (checker, default).
SCHEMA: dict = {
    "ns": Key(
        int_list(1, increasing=False),
        [2**k for k in range(10, 21)],
        doc="Numbers of particles n: a non-empty list of integers ≥ 1.",
    ),
    "ds": Key(
        int_list(1, increasing=False),
        [2, 16, 64, 128],
        doc="Dimensions d: a non-empty list of integers ≥ 1.",
    ),
    "impls": Key(
        names(IMPLS),
        list(DEFAULT_IMPLS),
        doc="Implementations to time: a non-empty list of names from "
        + ", ".join(f'`"{name}"`' for name in IMPLS)
        + "; one that cannot run here (no GPU, KeOps or PyTorch) is recorded as "
        "unavailable.",
    ),
    "repeats": Key(
        integer(1),
        3,
        doc="Timed calls per case after a warm-up call (fewer when over the time "
        "budget), ≥ 1; the fastest is reported.",
    ),
    "max_seconds": Key(
        number(positive=True),
        60.0,
        doc="Time budget of one case (evaluations and solve) in seconds, > 0; a "
        "case projected to exceed it is skipped.",
    ),
    "max_gib": Key(
        number(positive=True),
        3.0,
        doc="Memory budget of one evaluation in GiB, > 0; a larger case is skipped.",
    ),
    "block_size": Key(
        integer(1),
        512,
        doc="Keys per block of the blocked kernel, ≥ 1.",
    ),
    "solve_steps": Key(
        integer(0),
        10,
        doc="Euler steps of the timed `mf.simulate` solve (dense and blocked JAX), "
        "≥ 0 (0: no solve).",
    ),
}
#: The defaults of `--quick` (explicit values still win).
QUICK = {
    "ns": [2**k for k in range(10, 14)],
    "ds": [2, 16],
    "repeats": 1,
    "solve_steps": 3,
}


def size(text: str) -> int:
    """Parse an integer, or a power written 2^k / 2**k (an argparse type).

    Args:
        text: e.g. "1024", "2^10" or "2**10".

    Returns:
        The integer.
    """
    match = re.fullmatch(r"(\d+)\s*(?:\^|\*\*)\s*(\d+)", text)
    return int(match[1]) ** int(match[2]) if match else int(text)


def limits(items: list[str] | None, parse: Callable[[str], Any]) -> dict:
    """Parse impl=value pairs, e.g. numpy=16384 or keops=2,16.

    Args:
        items: the pairs as given on the command line.
        parse: parses one value.

    Returns:
        impl -> parsed value.
    """
    out = {}
    for item in items or []:
        impl, _, value = item.partition("=")
        out[impl] = parse(value)
    return out


def parser(description: str) -> argparse.ArgumentParser:
    """The parser of `meanfield bench`; schema options default to None (unset)."""
    p = argparse.ArgumentParser(prog="meanfield bench", description=description)

    def default(key: str) -> str:
        full, quick = SCHEMA[key].default, QUICK.get(key)
        shown = " ".join(map(str, full)) if isinstance(full, list) else str(full)
        if quick is None:
            return f"default: {shown}"
        quick = " ".join(map(str, quick)) if isinstance(quick, list) else str(quick)
        return f"default: {shown}; with --quick {quick}"

    # None: the --config value, else the full (or --quick) default.
    p.add_argument(
        "--ns",
        type=size,
        nargs="+",
        default=None,
        metavar="N",
        help=f"numbers of particles, integers >= 1 or 2^k ({default('ns')})",
    )
    p.add_argument(
        "--ds",
        type=int,
        nargs="+",
        default=None,
        metavar="D",
        help=f"dimensions ({default('ds')})",
    )
    p.add_argument(
        "--impls",
        nargs="+",
        default=None,
        choices=IMPLS,
        help=f"implementations ({default('impls')})",
    )
    p.add_argument(
        "--out",
        default="out/bench",
        metavar="DIR",
        help="output directory (default: %(default)s; the committed results are "
        "benchmarks/results, written only when named here)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="INT",
        help="seed of the random problems, combined with n and d (default: 0)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="defaults n = 2^10..2^13, d = 2 16, one repeat, 3-step solve "
        "(explicit --ns, --ds, --repeats, --solve-steps still apply)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"timed calls per case after a warm-up ({default('repeats')})",
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="time budget per case (evaluations + solve; default 60)",
    )
    p.add_argument(
        "--max-gib",
        type=float,
        default=None,
        help="memory budget of one evaluation (default 3)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help=f"keys per block of the blocked kernel ({default('block_size')})",
    )
    p.add_argument(
        "--solve-steps",
        type=int,
        default=None,
        help=f"Euler steps of the timed mf.simulate solve, 0 for none "
        f"({default('solve_steps')})",
    )
    p.add_argument(
        "--solve-max-n",
        type=size,
        default=None,
        help="largest n of the timed solve (default: any n within the case budget)",
    )
    p.add_argument(
        "--max-n",
        nargs="*",
        default=["numpy=16384"],
        metavar="IMPL=N",
        help="largest n per implementation (default: numpy=16384)",
    )
    p.add_argument(
        "--only-ds",
        nargs="*",
        default=[],
        metavar="IMPL=D,D",
        help="dimensions per implementation, e.g. keops=2,16 (default: all)",
    )
    p.add_argument(
        "--replot",
        default=None,
        metavar="JSON",
        help="only redraw a results file, into --out as <name>.png",
    )
    p.add_argument(
        "--name", default=None, help="results name (default: the device, e.g. cpu)"
    )
    p.add_argument(
        "--config",
        metavar="FILE.toml",
        default=None,
        help=f"TOML with any of {', '.join(SCHEMA)}; command-line options win",
    )
    p.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no case lines (shown by default)",
    )
    return p


def parse(argv: Sequence[str], description: str) -> argparse.Namespace:
    """Parse the options and resolve the schema's: command line > TOML > defaults.

    Args:
        argv: the arguments after `bench`.
        description: the parser's description.

    Returns:
        The options, every schema key resolved and validated.

    Raises:
        ValueError: unreadable TOML, unknown key or bad value (naming the key).
        SystemExit: bad command-line syntax, or `--help`.
    """
    args = parser(description).parse_args(argv)
    raw = load_toml(args.config) if args.config is not None else {}
    given = {key: getattr(args, key) for key in SCHEMA}
    # Command-line values win over the TOML's; resolve rejects unknown TOML keys.
    merged = {**raw, **{k: v for k, v in given.items() if v is not None}}
    schema = with_defaults(SCHEMA, QUICK) if args.quick else SCHEMA
    for key, value in resolve(schema, merged).items():
        setattr(args, key, value)
    return args
