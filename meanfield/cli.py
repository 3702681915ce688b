"""Command-line interface: `meanfield <command> [options]`.

Thin by design: parse the arguments, call the library, print a summary. Each
command is a `_add_<name>(subparsers)` function that registers its parser and
sets `func`, a callable taking the parsed namespace and returning an exit code.
"""

import argparse
import sys
from collections.abc import Sequence


def _run_demo(args: argparse.Namespace) -> int:
    # Files only, never windows: select Agg, unless pyplot is already in use
    # (main() called from a notebook or script that chose its backend).
    if "matplotlib.pyplot" not in sys.modules:
        import matplotlib

        matplotlib.use("Agg")
    from .demo import run_demo

    run_demo(args.out, n=args.n, seed=args.seed, progress=args.progress)
    return 0


def _at_least_two(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 2:
        raise argparse.ArgumentTypeError(f"must be an integer >= 2; got {text!r}")
    return value


def _add_demo(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="clustering of tokens under self-attention (Q = K = V = I)",
        description=(
            "Canonical clustering run of Geshkovski, Letrouit, Polyanskiy & "
            "Rigollet: n tokens uniform on the sphere S^2 under softmax attention "
            "with Q = K = V = I, on the sphere (t1 = 15) and in R^3 with the "
            "rescaling e^{-t} x(t) (t1 = 8). Writes sphere.png, "
            "sphere_trajectories.png, rescaled.png, trajectory.npz and "
            "manifest.json, and prints a short summary."
        ),
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default="out",
        help="output directory, created if needed (default: %(default)s)",
    )
    p.add_argument(
        "--seed",
        metavar="INT",
        type=int,
        default=0,
        help="PRNG seed of the initial tokens (default: %(default)s)",
    )
    p.add_argument(
        "--n",
        metavar="INT",
        type=_at_least_two,
        default=256,
        help="number of tokens, >= 2 (default: %(default)s)",
    )
    p.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="do not show progress bars (shown by default)",
    )
    p.set_defaults(func=_run_demo)


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="meanfield",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Mean-field Transformer PDE in JAX: particle dynamics of self-attention.\n"
            "Run `meanfield <command> --help` for a command's options.\n"
        ),
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}"
    )
    subparsers = parser.add_subparsers(
        dest="command", metavar="<command>", required=True
    )
    _add_demo(subparsers)
    # List every command's options in `meanfield --help` too, from the
    # subparsers themselves so the text cannot go stale.
    usages = "".join(
        "  " + sub.format_usage().removeprefix("usage: ")
        for sub in subparsers.choices.values()
    )
    parser.epilog = "command options (see `meanfield <command> --help`):\n" + usages
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `meanfield` command line.

    Args:
        argv: arguments without the program name; None reads `sys.argv[1:]`.

    Returns:
        The exit code (0 on success). Invalid arguments exit with code 2
        (argparse's `SystemExit`).
    """
    args = _parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
