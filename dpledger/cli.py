"""The `dpledger` command line. Bad input ends with a one-line error naming the file, key or flag,
the value and the rule, and exit status 2; nothing is written by a command that fails that way."""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from importlib.metadata import version

from dpledger import account_cli, audit_cli, decode_cli, demo_cli, hotpate_cli, report_cli, sweep_cli
from dpledger import frontier_cli
from dpledger import verify_cli
from dpledger import calibrate_cli
from dpledger import teachers_cli
from dpledger.accounting.errors import EXIT_BAD_INPUT, OneLineErrorParser  # noqa: F401 (re-exported)

EXIT_INTERNAL = 4


def build_parser() -> argparse.ArgumentParser:
    """The `dpledger` parser: --version and one subcommand per command module (account, decode, audit,
    report, sweep, frontier, hotpate, demo, verify, teachers, calibrate), each with its handler as `handler`.

    Returns:
        The parser (a OneLineErrorParser: usage errors on one line, exit status 2).
    """
    parser = OneLineErrorParser(prog="dpledger", description="Privacy accounting and auditing of private LLM decoding")
    parser.add_argument("--version", action="version", version=f"dpledger {version('dpledger')}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    account_cli.add_parser(subparsers)
    decode_cli.add_parser(subparsers)
    audit_cli.add_parser(subparsers)
    report_cli.add_parser(subparsers)
    sweep_cli.add_parser(subparsers)
    frontier_cli.add_parser(subparsers)
    hotpate_cli.add_parser(subparsers)
    demo_cli.add_parser(subparsers)
    verify_cli.add_parser(subparsers)
    teachers_cli.add_parser(subparsers)
    calibrate_cli.add_parser(subparsers)
    return parser


def quiet_libraries() -> None:
    """transformers/peft deprecation chatter would bury the progress bars, the summaries and the
    one-line errors (set before they are imported; a user's own TRANSFORMERS_VERBOSITY wins)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|peft)\.")


def main(argv: list[str] | None = None) -> int:
    """Run the `dpledger` command line: parse `argv`, run the subcommand's handler and turn its errors
    into one line on stderr and an exit status.

    Args:
        argv: the arguments after the program name (default: sys.argv[1:]).

    Returns:
        The exit status: the handler's (0 success; `audit` and `verify` also 1 FAIL, 3 UNVERIFIED),
        EXIT_BAD_INPUT (2) for an unknown argument, a ValueError (bad input) or an OSError (a path that
        cannot be read or written), 130 on an interrupt, and EXIT_INTERNAL (4) for any other exception,
        a bug in dpledger. A closed stdout (`| head`) ends quietly with 0.

    Raises:
        SystemExit: from argparse, for --help, --version or a usage error (status 2).
        Exception: any exception a handler raises other than those above, re-raised when the
            DPLEDGER_DEBUG environment variable is set.
    """
    quiet_libraries()
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        print(unknown_arguments_message(args, unknown), file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return args.handler(args)
    except ValueError as error:  # includes UnicodeDecodeError; messages name the file, key or flag
        print(f"dpledger {args.command}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader went away (`| head`): what it wanted was written; end quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as error:  # a path that cannot be read or written
        where = f"{error.filename}: " if getattr(error, "filename", None) else ""
        print(f"dpledger {args.command}: error: {where}{error.strerror or error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"\ndpledger {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # a bug in dpledger, not in the input: say so, distinctly from FAIL (1)
        if os.environ.get("DPLEDGER_DEBUG"):
            raise
        print(f"dpledger {args.command}: internal error (a bug in dpledger; please report it with "
              f"DPLEDGER_DEBUG=1 output): {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_INTERNAL


def unknown_arguments_message(args: argparse.Namespace, unknown: list[str]) -> str:
    """One line naming the arguments the command does not take and, where the command has a fixed
    set of flags (each `account` mechanism), the flags it does read.

    Args:
        args: the parsed arguments of the command (its `command`, and `mechanism` and `accepted_flags`
            where it has them).
        unknown: the arguments argparse did not recognise, as typed.

    Returns:
        The message, "dpledger COMMAND: error: ... (see dpledger COMMAND --help)".
    """
    command = " ".join(part for part in (args.command, getattr(args, "mechanism", None)) if part)
    flags = [item.split("=")[0] for item in unknown if item.startswith("-") and not _is_number(item)]
    if flags and getattr(args, "accepted_flags", None):
        message = (f"mechanism {args.mechanism} does not use {', '.join(flags)}; it reads "
                   f"{', '.join(args.accepted_flags)}")
    else:
        message = f"unrecognized arguments: {' '.join(unknown)}"
    return f"dpledger {command}: error: {message} (see dpledger {command} --help)"


def _is_number(text: str) -> bool:
    """True for a value such as -1 or -1e-5 (an unknown flag's argument, not a flag)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
