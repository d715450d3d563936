"""`dpledger report RUN_DIR [RUN_DIR ...] --format html|md|json|latex|csv [--out FILE]`."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers) -> None:
    """Add `dpledger report` to the command line: the run directories, --format and --out.

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
    """
    parser = subparsers.add_parser("report", help="render a privacy report of one or more runs", description=__doc__)
    parser.add_argument("run_dir", nargs="+", help="run directories, or folders holding runs (each run below is read)")
    parser.add_argument("--format", default="html", choices=["html", "md", "json", "latex", "csv"])
    parser.add_argument("--out", help="write here (default: print; HTML defaults to report.html in the first run)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """`dpledger report`: render a report of the runs (dpledger.reports.render) and print it, or write it
    to --out (an HTML report defaults to report.html in the first run directory), written atomically.

    Args:
        args: the parsed flags of `dpledger report`.

    Returns:
        The exit status: 0 once the report is printed or written.

    Raises:
        ValueError: if a run cannot be read, its ledger.json or audit.json lacks a field a report reads
            (a hand-edited file), a value is NaN, or --out cannot be written.
    """
    from dpledger.decoding.trace import atomic_write_bytes, run_directories
    from dpledger.reports import load_run, render

    args.run_dir = [str(d) for d in run_directories(args.run_dir)]
    try:
        runs = [load_run(d) for d in args.run_dir]
        text = render(runs, args.format)
    except (KeyError, TypeError, IndexError, AttributeError) as error:  # a hand-edited ledger.json or audit.json
        raise ValueError(f"{', '.join(args.run_dir)}: ledger.json or audit.json does not have the fields a report "
                         f"reads ({type(error).__name__}: {error}); run dpledger audit to find what changed") from None
    out = args.out or (str(Path(args.run_dir[0]) / "report.html") if args.format == "html" else None)
    if out is None:
        print(text)
        return 0
    try:  # write-then-rename: a link at `out` (say one planted in a run directory) is replaced, never written through
        atomic_write_bytes(Path(out), text.encode("utf-8"))
    except OSError as error:
        raise ValueError(f"cannot write {out}: {error.strerror or error}") from None
    print(f"wrote {out}")
    return 0
