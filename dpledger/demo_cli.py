"""`dpledger demo`: the end-to-end demo on the embedded default."""
from __future__ import annotations


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the demo")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from dpledger.accounting_demo import run_accounting_demo

    run_accounting_demo()
    return 0
