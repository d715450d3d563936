"""`dpledger sweep`: Figure 2's ablations (T, top-k, beta, N, (lambda, sigma), alpha) on the embedded default."""
from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path


def add_parser(subparsers) -> None:
    """Add `dpledger sweep` to the command line: --out, --queries and --parameters.

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
    """
    parser = subparsers.add_parser("sweep", help="privacy-loss vs perplexity sweeps on the embedded default",
                                   description=__doc__)
    parser.add_argument("--out", help="directory (default runs/sweep/<time>)")
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--parameters", nargs="*", help="subset of: threshold top_k beta teachers lam_sigma alpha")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """`dpledger sweep`: run the ablation sweeps (dpledger.reports.sweep.run_sweep) under --out (default
    runs/sweep/<UTC time>) and say where the table and plots are.

    Args:
        args: the parsed flags of `dpledger sweep`.

    Returns:
        The exit status: 0 once every sweep has run.

    Raises:
        ValueError: if --parameters names an unknown sweep, or a run's configuration is invalid.
        OSError: if a file cannot be written.
    """
    from dpledger.reports.sweep import run_sweep

    out = args.out or str(Path("runs") / "sweep" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    run_sweep(out, args.queries, parameters=args.parameters)
    print(f"wrote {out}/sweep.csv and one sweep_<parameter>.png per parameter")
    return 0
