"""`dpledger decode CONFIG.toml [--out DIR] [--queries N] [--set TABLE.KEY=VALUE ...] [--resume]
[--workers N | --scheduler ADDRESS]`: run a private decoding job, write its trace.

With --workers or --scheduler, a teacher-forced run's blocks are decoded on Dask workers and
committed here in block order: the trace is the one a single process writes (docs/distributed.md).
Free generation and a data-dependent privacy filter are sequential and run in this process."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from contextlib import ExitStack

from dpledger.audit_cli import add_cluster_flags


def add_parser(subparsers) -> None:
    """Add `dpledger decode` to the command line: the run configuration, its overrides, --resume and
    the cluster flags (the module docstring is its help).

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
    """
    parser = subparsers.add_parser("decode", help="run a mechanism over a query stream and write the trace",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="TOML run configuration: every key is in docs/config.md, examples in examples/")
    parser.add_argument("--out", help="trace directory (overrides [run] out)")
    parser.add_argument("--queries", type=int, help="number of queries (overrides [run] queries)")
    parser.add_argument("--set", action="append", default=[], metavar="TABLE.KEY=VALUE", dest="overrides",
                        help="override one config key, VALUE read as TOML (e.g. --set mechanism.beta=0.05); "
                             "repeatable")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted run in the same directory")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_cluster_flags(parser, "decode a teacher-forced run's blocks on")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """`dpledger decode`: load the configuration (with --out, --queries and --set applied), decode the
    query stream (on a Dask cluster where the run allows it), write the trace and print its summary:
    epsilon, the public model's share of the answers, utility, and the chain head to publish.

    Args:
        args: the parsed flags of `dpledger decode`.

    Returns:
        The exit status: 0 once the run is written, 130 when interrupted before it finished (the
        committed blocks are kept; --resume continues).

    Raises:
        ValueError: if the configuration or a flag is invalid, or --workers / --scheduler is given
            without Dask installed.
        OSError: if the run's files cannot be written, or the cluster fails.
    """
    from dpledger.decoding.config import load_config
    from dpledger.decoding import trace

    overrides = tuple(args.overrides) + (() if args.queries is None else (f"run.queries={args.queries}",))
    config = load_config(args.config, args.out, overrides)
    # a bad config, a used --out or a run another process is writing fails here, in under a second:
    # neither torch nor the models are loaded yet
    trace.check_output_directory(config.out, args.resume, config.fingerprint())
    from dpledger.decoding.cluster import ClusterSpec, dask_client, require_dask
    from dpledger.decoding.dask_decode import sequential_reason
    from dpledger.decoding.blocks import prepare
    from dpledger.decoding.run import run_decode
    from dpledger.decoding.utility import utility_warnings
    cluster = ClusterSpec.from_flags(args.workers, args.scheduler)
    if cluster is not None:
        require_dask("--workers / --scheduler")
        reason = sequential_reason(config)
        if reason is not None:
            print(f"dpledger decode: {reason}: decoding in this process (--workers and --scheduler split "
                  "teacher-forced runs only)", file=sys.stderr)
            cluster = None
        elif args.resume and (Path(config.out) / trace.FINAL).exists():
            cluster = None  # a finished run: nothing to decode, no cluster to start
    result = None
    try:
        with ExitStack() as stack:
            # the models are loaded and checked here first: workers then find the embedded default built
            prepared = prepare(config)
            client = stack.enter_context(dask_client(cluster, not args.no_progress)) if cluster is not None else None
            result = run_decode(config, resume=args.resume, progress=not args.no_progress, prepared=prepared,
                                client=client)
    except KeyboardInterrupt:
        if result is None:  # an interrupt while the cluster closed after the run finished changes nothing
            started = (Path(config.out) / trace.MANIFEST).exists()
            committed = len(trace.committed_chunk_indices(Path(config.out))) if started else 0
            print(f"\ninterrupted: {committed} block{'' if committed == 1 else 's'} committed in {config.out}; "
                  "continue with --resume", file=sys.stderr)
            return 130
    summary = result.summary
    first = summary["epsilon"][0]
    kind = "data-dependent loss" if summary["data_dependent"] else "epsilon"
    utility = ("perplexity n/a (free generation has no reference text)" if summary["perplexity"] is None
               else f"perplexity of the mechanism's output on data.text {summary['perplexity']:.3f}")
    if "voting" in summary:  # a voting step releases a point mass: yield and accuracy, and what is guaranteed
        voting = summary["voting"]
        accuracy = "n/a" if voting["token_accuracy"] is None else f"{voting['token_accuracy']:.3f}"
        utility = f"yield {voting['yield']:.3f}, token accuracy {accuracy}"
    if result.resumed_from_step:
        print(f"resumed after {result.resumed_from_step} committed steps")
    if first["epsilon"] == float("inf"):
        loss = f"{kind} +inf (no guarantee at any order)"
    else:
        order = "" if first["order"] is None else f", Renyi order {first['order']:g}"
        loss = f"{kind} {first['epsilon']:.4g} at delta={first['delta']:g}{order}"
    print(f"{result.directory}: {summary['steps']} queries, {loss}; fell back to the public model on "
          f"{summary['answered_by_public']} of {summary['steps']} queries; {utility}")
    if "voting" in summary:
        print(f"guarantee: {summary['voting']['guarantee']}")
    if "budget" in summary:
        budget = summary["budget"]
        print(f"budget: epsilon {budget['epsilon']:g} at delta {budget['delta']:g}, a Renyi filter at order "
              f"{budget['order']:g}: {budget['private_answers']} queries answered privately, "
              f"{budget['refused_steps']} by the public model after the budget was reached")
    for warning in utility_warnings(trace.read_manifest(result.directory), trace.read_records(result.directory), summary):
        if warning.applies:   # utility only: the privacy numbers above stand
            print(f"utility warning ({warning.title}): {warning.reason}")
    print(f"chain head {result.head} ({summary['steps']} steps): publish it; `dpledger audit {result.directory} "
          f"--expect-head {result.head}` then detects any rewrite or truncation of this run")
    return 0
