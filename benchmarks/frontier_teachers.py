"""The privacy-utility frontier (`dpledger frontier`) at larger ensembles: N = 32 and N = 100 teachers by
default. The embedded default trains N teachers on N disjoint shards the first time (build_or_load; about
9 s per teacher on the 2-core reference machine, plus the public model): the training is timed apart from
the frontier. Writes benchmarks/results/frontier_<N>.json per N (strict JSON: +inf as null, listed in
`nulls`). `--teachers 8` reproduces the reference frontier of docs/frontier.md.

    python benchmarks/frontier_teachers.py                        # N = 32 and 100, 1,024 queries, epsilon 1 2 4 8
    python benchmarks/frontier_teachers.py --teachers 100 --queries 16 --epsilons 8 --suffix _smoke \
        --variants public pmixed-all-orders hot-dpargmax          # a smoke check: trains 100 teachers, 3 short runs

Disk: every run keeps its replay payload, (N + 1) x queries x V float32: about 0.4 GB per run at N = 100
and 1,024 queries, about 20 GB for the full grid (runs under --out-root, default runs/frontier-bench/).
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from dpledger.accounting.safe_files import write_atomic
from dpledger.decoding.embedded import build_or_load, cache_root
from dpledger.reports.frontier import (DEFAULT_BUDGETS, DEFAULT_QUERIES, best_by_budget, best_lines, frontier_markdown,
                                       run_frontier)
from dpledger.reports.render import strict_json, table_records

RESULTS = Path(__file__).parent / "results"


def train(teachers: int) -> dict:
    """Build (or load) the embedded default for `teachers` shards and time it.

    Args:
        teachers: the ensemble size N.

    Returns:
        The training record: the wall time of this build_or_load, whether the entry was already cached,
        and the training times its info.json records (public model, all teachers, per teacher).
    """
    started = time.time()
    entries = set(cache_root().glob("embedded-*")) if cache_root().exists() else set()
    embedded = build_or_load(teachers=teachers, verbose=True)
    wall = time.time() - started
    cached = embedded.directory in entries
    info = embedded.info
    return {"teachers": teachers, "cached": cached, "build_or_load_wall_seconds": round(wall, 1),
            "public_train_seconds": info.get("public_train_seconds"),
            "teachers_train_seconds": info.get("teachers_train_seconds"),
            "seconds_per_teacher": (None if info.get("teachers_train_seconds") is None
                                    else round(info["teachers_train_seconds"] / teachers, 2)),
            "note": ("the cache entry existed: build_or_load_wall_seconds is loading only; the training times are "
                     "the ones info.json recorded when it was trained" if cached else
                     "trained in this invocation: build_or_load_wall_seconds includes corpus, tokenizer, public model "
                     "and teachers"),
            "cache_entry": str(embedded.directory)}


def main() -> None:
    """Run the frontier at each --teachers and write benchmarks/results/frontier_<N>.json."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teachers", type=int, nargs="+", default=[32, 100])
    parser.add_argument("--queries", type=int, default=DEFAULT_QUERIES)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[e for e, _ in DEFAULT_BUDGETS])
    parser.add_argument("--delta", type=float, default=DEFAULT_BUDGETS[0][1])
    parser.add_argument("--variants", nargs="+", default=None)
    parser.add_argument("--no-audit", action="store_true")
    parser.add_argument("--out-root", default="runs/frontier-bench")
    parser.add_argument("--results", default=str(RESULTS), help="where frontier_<N><suffix>.json is written")
    parser.add_argument("--suffix", default="", help="appended to the results file's name (e.g. _smoke for a short check)")
    args = parser.parse_args()
    budgets = [(epsilon, args.delta) for epsilon in args.epsilons]
    for teachers in args.teachers:
        training = train(teachers)
        print(f"N = {teachers}: embedded default ready in {training['build_or_load_wall_seconds']} s "
              f"({'cached' if training['cached'] else 'trained now'}; teachers trained in "
              f"{training['teachers_train_seconds']} s)")
        out = Path(args.out_root) / f"n{teachers}-q{args.queries}"
        started = time.time()
        frame = run_frontier(out, budgets, args.queries, teachers, args.variants, audit=not args.no_audit)
        seconds = time.time() - started
        best = best_by_budget(frame)
        print(frontier_markdown(frame, best))
        record = {"benchmark": "dpledger frontier at N teachers (benchmarks/frontier_teachers.py)",
                  "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                              "python": platform.python_version(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
                  "teachers": teachers, "queries": args.queries, "budgets": [list(b) for b in budgets],
                  "audit": not args.no_audit, "variants": args.variants or "all", "training": training,
                  "frontier_seconds": round(seconds, 1),
                  "frontier_seconds_note": "decode, audit and outputs of every run not already finished under out; "
                                           "a rerun into the same out only reads the finished runs",
                  "out": str(out), "best_by_budget": best, "best_lines": best_lines(best),
                  "rows": table_records(frame.drop(columns=["trace"]), f"frontier_{teachers}.rows")}
        path = Path(args.results) / f"frontier_{teachers}{args.suffix}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, (strict_json(record, path.name, "no guarantee") + "\n").encode())
        print(f"wrote {path} ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
