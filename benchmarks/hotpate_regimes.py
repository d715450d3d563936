"""Hot vs cold PATE in three regimes of the embedded default (`dpledger hotpate --heterogeneity h`):
near-identical teachers (h = 0), mixed (h = 0.2: each teacher 80% the shared in-context ensemble, 20% its
own; the mixture the issue's synthetic ensembles used) and distinct (h = 1). For each regime: hot vs cold at
matched coverage (threshold-private aggregators: the largest usable T; DPARGMAX and DPWS: the smallest
epsilon reaching it, refined by bisection, and the epsilon ratio cold / hot) and at matched epsilon, with the
diversity of what is released (distinct-n, self-BLEU) and the (tau, beta, gamma) check; every epsilon under
add-or-remove-one, beside DP-ICL and PMixED on the same teachers at the same epsilons (`--baselines`).

Writes benchmarks/results/hotpate_regimes.json (strict JSON) and hotpate_regimes.md.

    python benchmarks/hotpate_regimes.py                      # N = 64, 24 queries, 100 rounds: a few minutes each
    python benchmarks/hotpate_regimes.py --teachers 16 --queries 6 --samples 20 --suffix _smoke
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from dpledger.accounting.safe_files import write_atomic
from dpledger.accounting.strict_json import strict_json_text
from dpledger.reports.hotpate import DIFFERENTIALLY_PRIVATE, SCHEMES, THRESHOLD_PRIVATE, run_hotpate, summary_lines

RESULTS = Path(__file__).parent / "results"
REGIMES = {"near-identical": 0.0, "mixed": 0.2, "distinct": 1.0}
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)


def _brief(row: dict | None) -> dict | None:
    keys = ("threshold", "threshold_fraction", "epsilon", "epsilon_label", "sigma", "sigma_threshold", "coverage",
            "yield", "tv_to_reference", "target_probability", "distinct_1", "distinct_2", "self_bleu")
    return None if row is None else {key: row.get(key) for key in keys}


def regime_summary(result) -> dict:
    """The numbers of one regime the report quotes.

    Args:
        result: the regime's HotPateResult.

    Returns:
        A dict: the ceiling, the target coverage, per aggregator the matched-coverage rows and ratios, per
        DP aggregator the matched-epsilon pairs, the vote statistics and the diversity-preservation check.
    """
    matched = {}
    for mechanism in THRESHOLD_PRIVATE + DIFFERENTIALLY_PRIVATE:
        entry = result.matched_coverage[mechanism]
        matched[mechanism] = {**{scheme: _brief(entry[scheme]) for scheme in SCHEMES},
                              **{k: v for k, v in entry.items() if k not in SCHEMES}}
    at_epsilon = {mechanism: [{"epsilon": pair["epsilon"], **{s: _brief(pair[s]) for s in SCHEMES}}
                              for pair in result.matched_epsilon[mechanism]] for mechanism in DIFFERENTIALLY_PRIVATE}
    return {"non_private_ceiling": result.ceiling, "target_coverage": result.target_coverage,
            "hot_coverage_higher_at_every_T_from_N_over_4": result.hot_coverage_higher_from_quarter,
            "matched_coverage": matched, "matched_epsilon": at_epsilon, "vote_statistics": result.vote_statistics,
            "diversity_preservation": result.diversity_preservation, "relation": result.relation.value,
            "baselines": [{key: row[key] for key in ("mechanism", "target_epsilon", "epsilon", "relation", "parameters",
                                                     "tv_to_reference", "target_probability", "law")}
                          for row in result.baselines],
            "seconds": round(result.seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    """Run the three regimes and write the results.

    Args:
        argv: the command line (default: sys.argv[1:]).

    Returns:
        0 once both files are written.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teachers", type=int, default=64)
    parser.add_argument("--queries", type=int, default=24)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--budget-queries", type=int, default=1000)
    parser.add_argument("--suffix", default="")
    args = parser.parse_args(argv)
    record: dict = {"benchmark": "hotpate_regimes", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
                    "settings": {"teachers": args.teachers, "queries": args.queries, "samples": args.samples,
                                 "budget_queries": args.budget_queries, "delta": 1e-5, "epsilons": list(EPSILONS),
                                 "temperature": 1.0, "top_p": 1.0, "gamma": 1.0, "retries": 0,
                                 "thresholds": "T/N = 0.05, ..., 1", "target_coverage": "half the non-private ceiling",
                                 "relation": "add_or_remove_one", "baselines": "DP-ICL (k = 100, quadrature), PMixED"},
                    "regimes": {}}
    markdown = ["# Hot vs cold PATE in three regimes (benchmarks/hotpate_regimes.py)", "",
                f"Embedded default, N = {args.teachers}, {args.queries} queries, {args.samples} rounds per query and "
                f"scheme, epsilons over {args.budget_queries} queries at delta = 1e-5.", ""]
    for name, heterogeneity in REGIMES.items():
        started = time.time()
        result = run_hotpate(args.teachers, args.queries, args.samples, budget_queries=args.budget_queries,
                             heterogeneity=heterogeneity, epsilons=EPSILONS, verbose=False, baselines=True)
        record["regimes"][name] = {"heterogeneity": heterogeneity, "wall_seconds": round(time.time() - started, 1),
                                   **regime_summary(result)}
        markdown += [f"## {name} (h = {heterogeneity:g}; {time.time() - started:.0f} s)", "", *summary_lines(result), ""]
        print("\n".join(markdown[-len(summary_lines(result)) - 3:]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    write_atomic(RESULTS / f"hotpate_regimes{args.suffix}.json", (strict_json_text(record, sort_keys=False) + "\n").encode())
    write_atomic(RESULTS / f"hotpate_regimes{args.suffix}.md", ("\n".join(markdown) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
