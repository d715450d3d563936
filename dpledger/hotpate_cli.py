"""`dpledger hotpate`: hot vs cold PATE on the embedded default (Cohen et al. 2023's main result):
yield, coverage and transferred support size against T/N, and the privacy cost at a matched yield."""
from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path


def add_parser(subparsers) -> None:
    """Add `dpledger hotpate` to the command line: --out and the parameters of `run_hotpate`.

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
    """
    parser = subparsers.add_parser("hotpate", help="hot vs cold voting with N in-context teachers of the embedded "
                                                   "default", description=__doc__)
    parser.add_argument("--out", help="directory for hotpate.json, hotpate.png, hotpate.md (default runs/hotpate/<time>)")
    parser.add_argument("--teachers", type=int, default=64, help="ensemble size N (in-context teachers), >= 2")
    parser.add_argument("--queries", type=int, default=48, help="teacher-forced query positions")
    parser.add_argument("--samples", type=int, default=200, help="voting rounds per query and scheme")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-tokens", type=int, default=48, help="each teacher's private prompt budget")
    parser.add_argument("--target-yield", type=float, default=0.5, help="the matched utility: yield in (0, 1)")
    parser.add_argument("--budget-queries", type=int, default=1000, help="queries charged for the matched cost")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """`dpledger hotpate`: run hot vs cold voting (dpledger.reports.hotpate.run_hotpate), write
    hotpate.json, hotpate.png and hotpate.md under --out (default runs/hotpate/<UTC time>) and print
    the Markdown summary.

    Args:
        args: the parsed flags of `dpledger hotpate`.

    Returns:
        The exit status: 0 once the files are written.

    Raises:
        ValueError: if a parameter is out of range.
        OSError: if a file cannot be written.
    """
    from dpledger.reports.hotpate import hotpate_markdown, run_hotpate, write_hotpate

    out = Path(args.out or Path("runs") / "hotpate" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    result = run_hotpate(args.teachers, args.queries, args.samples, args.seed, args.prompt_tokens, args.target_yield,
                         args.budget_queries, args.delta)
    paths = write_hotpate(result, out)
    print(hotpate_markdown(result))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
