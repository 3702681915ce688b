"""Command-line interface: `meanfield <command> [options]`.

Thin by design: the parser is built from the table of commands
(`commands.COMMANDS`) and hands the parsed arguments to the command's `run`. Each
command's `--help` lists its configuration keys, read from its schema when the
help is printed. Nothing is imported before a command runs or prints its own
`--help`, so `meanfield --help` imports no JAX.
"""

import argparse
import atexit
import contextlib
import os
import sys
from collections.abc import Sequence

from .commands import COMMANDS, Command, keys_help


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: its `--help` ends with its keys, read on demand.

    The schema lives in the command's module, which imports JAX: it is read
    only when the help is printed, never to parse.
    """

    def __init__(self, *args, command: Command | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.command = command

    def format_help(self) -> str:
        """The help, with the configuration keys of the command's schema."""
        command = self.command
        if command is not None and command.own_parser is None:
            schema = command.load_schema()
            if schema is not None:
                self.description = f"{command.description} {keys_help(schema)}"
        return super().format_help()


def _add_common_options(p, *, out: str, seed_help: str) -> None:
    """--out, --seed and --no-progress, shared by every command that computes."""
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


def _add_command(subparsers, command: Command) -> None:
    """The parser of one command, from its record."""
    p = subparsers.add_parser(
        command.name,
        help=command.help,
        description=command.description,
        add_help=command.own_parser is None,
        command=command,
    )
    if command.own_parser is not None:
        # Its own parser reads the options (`meanfield <name> --help` too).
        p.add_argument("own_args", nargs=argparse.REMAINDER)
        p.set_defaults(func=lambda args: command.run(args.own_args))
        return
    if command.schema is not None:
        p.add_argument(
            "--config",
            metavar="FILE.toml",
            default=None,
            help="TOML configuration; omitted keys take their defaults",
        )
    if command.out is not None:
        _add_common_options(p, out=command.out, seed_help=command.seed_help)
    for option in command.options:
        p.add_argument(*option.flags, **option.kwargs)
    p.set_defaults(func=command.run)


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
        dest="command",
        metavar="<command>",
        required=True,
        parser_class=_CommandParser,
    )
    for command in COMMANDS:
        _add_command(subparsers, command)
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
    for command in COMMANDS:
        if command.own_parser is not None and argv[:1] == [command.name]:
            # It owns its options (`bench_config`): pass them through.
            return command.run(argv[1:])
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
