"""`dpledger audit RUN_DIR`: replay, bound checks, ablations, a sampled game; exit 1 on FAIL."""
from __future__ import annotations

import argparse
import json


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("audit", help="audit a run trace (exit status 1 on FAIL)", description=__doc__)
    parser.add_argument("run_dir", nargs="+")
    parser.add_argument("--teachers-sample", type=int, help="ablate a seeded sample of this many teachers")
    parser.add_argument("--mc-samples", type=int, default=400, help="Monte Carlo draws per step for screening")
    parser.add_argument("--trials", type=int, default=2000, help="distinguishing-game trials per world")
    parser.add_argument("--no-game", action="store_true", help="skip the sampled canary game (needs the models)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print audit.json instead of the summary")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from audit import audit_run, render_summary

    status = 0
    for run_dir in args.run_dir:
        report = audit_run(run_dir, args.teachers_sample, args.mc_samples, args.trials, not args.no_game, args.seed)
        print(json.dumps(report.to_dict(), indent=2, default=str) if args.json else render_summary(report))
        status = max(status, 1 if report.failed else 0)
    return status
