"""The `dpledger` command line. Bad input ends with a one-line error naming the constraint, exit 2."""
from __future__ import annotations

import argparse
import sys

from dpledger import account_cli, audit_cli, decode_cli, demo_cli, report_cli, sweep_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpledger", description="Privacy accounting and auditing of private LLM decoding")
    subparsers = parser.add_subparsers(dest="command", required=True)
    account_cli.add_parser(subparsers)
    decode_cli.add_parser(subparsers)
    audit_cli.add_parser(subparsers)
    report_cli.add_parser(subparsers)
    sweep_cli.add_parser(subparsers)
    demo_cli.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except ValueError as error:
        print(f"dpledger {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
