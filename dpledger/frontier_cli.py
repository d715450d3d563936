"""`dpledger frontier`: the privacy-utility frontier on the embedded default. Each mechanism variant is
calibrated to each target (epsilon, delta) over the queries, decodes the same held-out queries, is
audited, and is tabulated and plotted: utility against epsilon (docs/frontier.md)."""
from __future__ import annotations

import argparse
import time
from datetime import datetime, timezone
from pathlib import Path


def add_parser(subparsers) -> None:
    """Add `dpledger frontier` to the command line: --out, --epsilons, --delta, --queries, --teachers,
    --variants and --no-audit.

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
    """
    parser = subparsers.add_parser("frontier", help="privacy-utility frontier: every mechanism calibrated to each "
                                                    "budget, decoded, audited and plotted", description=__doc__)
    parser.add_argument("--out", help="directory (default runs/frontier/<time>); rerun with the same --out to resume")
    # defaults None: the API's (dpledger.reports.frontier), read when the command runs, not when the parser is built
    parser.add_argument("--epsilons", type=float, nargs="+", metavar="EPS",
                        help="target epsilons, each in (0, 700] (default: 1 2 4 8)")
    parser.add_argument("--delta", type=float, help="target delta of every budget, in (0, 1) (default: 1e-5)")
    parser.add_argument("--queries", type=int,
                        help="teacher-forced queries per run, >= 1; each budget is over this many (default: 1024)")
    parser.add_argument("--teachers", type=int,
                        help="ensemble size N of the embedded default, in [2, 512]; trained and cached if absent "
                             "(default: 8)")
    parser.add_argument("--variants", nargs="+", metavar="NAME",
                        help="subset of the variants (default: all): public, ensemble, pmixed-<ball> for each ball "
                             "(projection-order, all-orders, ...), adapmixed-filter-<relation>-<accounting> "
                             "(relation add-or-remove-one or remove-one; accounting released-output or "
                             "realised-path), adapmixed-paper, hot-dpargmax, cold-dpargmax, hot-dpws, cold-dpws "
                             "(docs/frontier.md)")
    parser.add_argument("--no-audit", action="store_true", help="skip the audits (verdict columns stay empty)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """`dpledger frontier`: run the frontier (dpledger.reports.frontier.run_frontier) under --out (default
    runs/frontier/<UTC time>), print the compact table and the best proven variant per budget, and say
    where the files are.

    Args:
        args: the parsed flags of `dpledger frontier`.

    Returns:
        The exit status: 0 once every run is done and the files are written.

    Raises:
        ValueError: if a flag is out of range (one line, exit 2), --out holds a frontier of other
            settings, or a run directory holds another run.
        OSError: if a file cannot be written.
    """
    from dpledger.reports.frontier import (DEFAULT_BUDGETS, DEFAULT_QUERIES, DEFAULT_TEACHERS, best_by_budget,
                                           frontier_markdown, plan_frontier, run_frontier)

    delta = DEFAULT_BUDGETS[0][1] if args.delta is None else args.delta
    epsilons = [epsilon for epsilon, _ in DEFAULT_BUDGETS] if args.epsilons is None else args.epsilons
    queries = DEFAULT_QUERIES if args.queries is None else args.queries
    teachers = DEFAULT_TEACHERS if args.teachers is None else args.teachers
    budgets = [(epsilon, delta) for epsilon in epsilons]
    plan_frontier(budgets, queries, teachers, args.variants)  # bad input: one line before anything runs
    out = args.out or str(Path("runs") / "frontier" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    started = time.time()
    frame = run_frontier(out, budgets, queries, teachers, args.variants, audit=not args.no_audit,
                         progress=not args.no_progress)
    print(f"\n== Privacy-utility frontier: {queries} teacher-forced queries, N = {teachers}, "
          f"delta = {delta:g} ({time.time() - started:.0f} s) ==")
    print(frontier_markdown(frame, best_by_budget(frame)))
    print("sound eps: the proven guarantee (inf: none); claimed eps: what an unproven accounting states, NOT a "
          "guarantee (docs/frontier.md)")
    print(f"wrote {out}/frontier.csv, frontier.json, frontier.png, frontier.tex, frontier.html")
    return 0
