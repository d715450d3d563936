"""`dpledger demo`: the end-to-end demo on the embedded default."""
from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    """Add `dpledger demo` to the command line: --out, --queries, --teachers, --accounting-only and
    --no-progress.

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
    """
    parser = subparsers.add_parser("demo", help="run the end-to-end demo on the embedded default")
    parser.add_argument("--out", help="directory for the demo's traces (default runs/demo/<time>)")
    parser.add_argument("--queries", type=int, default=1024)
    parser.add_argument("--teachers", type=int, default=8)
    parser.add_argument("--accounting-only", action="store_true", help="only the accounting demo (no models)")
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """`dpledger demo`: print the accounting demo (`run_accounting_demo`) and, unless --accounting-only,
    run the end-to-end demo on the embedded default (`dpledger.demo.run_demo`).

    Args:
        args: the parsed flags of `dpledger demo`.

    Returns:
        The exit status: 0 once the demo has finished.

    Raises:
        ValueError: if a demo run's configuration is invalid (e.g. --queries or --teachers out of range).
        OSError: if the demo's files cannot be written.
    """
    from dpledger.accounting_demo import run_accounting_demo

    run_accounting_demo()
    if args.accounting_only:
        return 0
    from dpledger.demo import run_demo

    print()
    run_demo(args.out, args.queries, args.teachers, progress=not args.no_progress)
    return 0
