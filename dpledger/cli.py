"""The `dpledger` command line. Bad input ends with a one-line error naming the file, key or flag,
the value and the rule, and exit status 2; nothing is written by a command that fails that way."""
from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import version

from dpledger import account_cli, audit_cli, decode_cli, demo_cli, hotpate_cli, report_cli, sweep_cli
from dpledger import verify_cli

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 4


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpledger", description="Privacy accounting and auditing of private LLM decoding")
    parser.add_argument("--version", action="version", version=f"dpledger {version('dpledger')}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    account_cli.add_parser(subparsers)
    decode_cli.add_parser(subparsers)
    audit_cli.add_parser(subparsers)
    report_cli.add_parser(subparsers)
    sweep_cli.add_parser(subparsers)
    hotpate_cli.add_parser(subparsers)
    demo_cli.add_parser(subparsers)
    verify_cli.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
