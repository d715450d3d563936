"""`dpledger sweep`: Figure 2's ablations (T, top-k, beta, N, (lambda, sigma), alpha) on the embedded default."""
from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("sweep", help="privacy-loss vs perplexity sweeps on the embedded default",
                                   description=__doc__)
    parser.add_argument("--out", help="directory (default runs/sweep/<time>)")
    parser.add_argument("--queries", type=int, default=256)
    parser.add_argument("--parameters", nargs="*", help="subset of: threshold top_k beta teachers lam_sigma alpha")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dpledger.reports.sweep import run_sweep

    out = args.out or str(Path("runs") / "sweep" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    run_sweep(out, args.queries, parameters=args.parameters)
    print(f"wrote {out}/sweep.csv and one sweep_<parameter>.png per parameter")
    return 0
