"""`dpledger demo`: the end-to-end demo on the embedded default."""
from __future__ import annotations


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the end-to-end demo on the embedded default")
    parser.add_argument("--out", help="directory for the demo's traces (default runs/demo/<time>)")
    parser.add_argument("--queries", type=int, default=1024)
    parser.add_argument("--teachers", type=int, default=8)
    parser.add_argument("--accounting-only", action="store_true", help="only the accounting demo (no models)")
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from dpledger.accounting_demo import run_accounting_demo

    run_accounting_demo()
    if args.accounting_only:
        return 0
    from dpledger.demo import run_demo

    print()
    run_demo(args.out, args.queries, args.teachers, progress=not args.no_progress)
    return 0
