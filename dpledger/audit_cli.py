"""`dpledger audit RUN_DIR [RUN_DIR ...]`: integrity, replay, bound checks, ablations, a sampled game.

Exit status: 0 PASS, 1 FAIL (a check failed, or the run's files are damaged or planted: links,
FIFOs, malformed or duplicate-key JSON, missing or stray chunks), 2 input that cannot be audited
at all (not a dpledger run, one being written, a bad flag), 3 UNVERIFIED (nothing failed, but the
charges could not be recomputed from the run's models or replay payload). With several runs, the
worst status wins, in the order FAIL, unusable, UNVERIFIED, PASS.

audit.json is written into the run (or to --audit-out); when it cannot be (a read-only run), the
verdict is printed all the same, one line says so, and the exit status is still the verdict's.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from contextlib import ExitStack
from dpledger.accounting.errors import require

SEVERITY = (1, 2, 3, 0)  # worst first


def add_parser(subparsers) -> None:
    """Add `dpledger audit` to the command line: its run directories and flags (the module docstring
    is its help).

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
    """
    parser = subparsers.add_parser("audit", help="audit a run trace (exit 0 PASS, 1 FAIL, 2 unusable, 3 UNVERIFIED)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="+", help="run directories, or folders holding runs (each run below is audited)")
    parser.add_argument("--expect-head", help="the chain head published for the run (printed by dpledger decode); "
                        "a run whose final record has another head FAILs")
    parser.add_argument("--teachers-sample", type=int, help="ablate a seeded sample of this many teachers (default: every teacher)")
    parser.add_argument("--mc-samples", type=int, default=400, help="Monte Carlo draws per step for screening (default: 400)")
    parser.add_argument("--trials", type=int, default=2000, help="distinguishing-game trials per world (default: 2000)")
    parser.add_argument("--no-game", action="store_true", help="skip the sampled canary game (needs the models)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the audit's own sampling (default: 0)")
    parser.add_argument("--json", action="store_true", help="print audit.json instead of the summary")
    parser.add_argument("--audit-out", metavar="PATH", help="write audit.json to PATH instead of into the run "
                        "directory (one run; e.g. for a run on read-only media)")
    add_cluster_flags(parser, "replay and ablate the trace's blocks on")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.set_defaults(handler=run)


def add_cluster_flags(parser, purpose: str) -> None:
    """--workers / --scheduler: where distributed work runs (dpledger.decoding.cluster; needs dpledger[dask]).

    Args:
        parser: the subcommand's parser; the two flags are added as a mutually exclusive group.
        purpose: what the cluster does, the start of each flag's help (e.g. "decode a teacher-forced
            run's blocks on").
    """
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--workers", type=int, metavar="N",
                       help=f"{purpose} N local Dask worker processes (needs the extra: pip install 'dpledger[dask]')")
    group.add_argument("--scheduler", metavar="ADDRESS",
                       help=f"{purpose} the Dask cluster whose scheduler is at ADDRESS (e.g. tcp://host:8786); "
                            "its workers must see the run's files at the same paths")


def run(args: argparse.Namespace) -> int:
    """`dpledger audit`: audit each run directory (those below a folder too), print its summary (or its
    audit.json with --json) and write audit.json into the run or to --audit-out. A run that cannot be
    audited is reported on stderr and the others are still audited.

    Args:
        args: the parsed flags of `dpledger audit`.

    Returns:
        The worst exit status over the runs (module docstring): 1 FAIL, then 2 unusable, 3 UNVERIFIED,
        0 PASS.

    Raises:
        ValueError: if a flag is out of range, --workers / --scheduler is given without Dask installed,
            --expect-head or --audit-out is given with several runs,
            or --audit-out names a directory or a file in a missing directory (a run that cannot be
            audited is not an error: its status is 2).
        dpledger.decoding.cluster.ClusterError: (an OSError) if the Dask cluster fails: not a property of
            any run, so the audit stops.
    """
    from dpledger.audit import audit_run, render_summary
    from dpledger.decoding.cluster import ClusterError, ClusterSpec, dask_client, require_dask
    from dpledger.audit.audit import EXIT_UNUSABLE
    from dpledger.decoding.trace import json_bytes, run_directories

    cluster = ClusterSpec.from_flags(args.workers, args.scheduler)  # bad flags before any work
    if cluster is not None:
        require_dask("--workers / --scheduler")
    args.run_dir = [str(d) for d in run_directories(args.run_dir)]

    require(args.expect_head is None or len(args.run_dir) == 1,
            f"--expect-head names one run's head, got {len(args.run_dir)} run directories")
    if args.audit_out is not None:
        out = Path(args.audit_out)
        require(len(args.run_dir) == 1, f"--audit-out names one file, got {len(args.run_dir)} run directories")
        require(out.parent.is_dir(), f"--audit-out {out}: its directory {out.parent} does not exist")
        require(not out.is_dir(), f"--audit-out {out}: is a directory, expected a file name")
    require(args.teachers_sample is None or args.teachers_sample >= 1,
            f"--teachers-sample must be >= 1, got {args.teachers_sample}")
    require(args.mc_samples >= 1, f"--mc-samples must be >= 1, got {args.mc_samples}")
    require(args.trials >= 1, f"--trials must be >= 1, got {args.trials}")
    with ExitStack() as stack:
        executor = None
        if cluster is not None:
            from dpledger.audit.dask_audit import DaskWindowExecutor

            client = stack.enter_context(dask_client(cluster, progress=not args.no_progress))
            executor = DaskWindowExecutor(client, progress=not args.no_progress)
        statuses = []
        for run_dir in args.run_dir:
            try:
                report = audit_run(run_dir, args.teachers_sample, args.mc_samples, args.trials, not args.no_game,
                                   args.seed, expect_head=args.expect_head, executor=executor,
                                   audit_out=args.audit_out, progress=not args.no_progress)
            except ClusterError:
                raise  # the cluster, not this run: stop (the CLI prints one line, exit 2)
            except (ValueError, OSError) as error:
                print(f"dpledger audit: error: {' '.join(str(error).split())}", file=sys.stderr)
                statuses.append(EXIT_UNUSABLE)
                continue
            print(json_bytes(report.to_dict()).decode().rstrip() if args.json else render_summary(report), flush=True)
            if report.not_written is not None:
                print(f"dpledger audit: audit.json not written ({report.not_written}); the verdict above stands "
                      f"(pass --audit-out PATH to keep it elsewhere)", file=sys.stderr)
            statuses.append(report.exit_code)
    return min(statuses, key=SEVERITY.index)
