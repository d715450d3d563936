"""The accountant's cost through the public PrivacyLedger API, against the implementation it replaced.

Cases, each on the default 156-order grid (DEFAULT_ORDERS), fresh ledger per repetition:
  charge_many_100k: `charge_many({"a": (v, True)})` with v of shape (100000, 156), then `epsilon(1e-5)`;
  charge_100k:      100,000 `charge({"a": curve})` calls (10,000 prebuilt RdpCurves, cycled), then
                    `epsilon(1e-5)`;
  numpy_sum_100k:   `v.sum(axis=0)`, the floor of a float sum without any guarantee (reference only).

Baseline: the ledger and UpperSum of commit BASELINE_COMMIT (before issue 27), read with `git show`
into a temporary directory and imported beside the current package (its other imports, curves and
relations, are the current ones; NeighbouringRelation.composed_with's early return for equal
relations therefore speeds the baseline's charge() a little, which only lowers the ratios).

Repetitions are interleaved (baseline, new, numpy in turn, 7 times) so that load from other
processes hits every case alike; each figure is the median with the range (min, max), and each ratio
is the median and range of the per-repetition ratios baseline / new. Writes
benchmarks/results/ledger.json (strict JSON). Run: python benchmarks/bench_ledger.py [--repeats 7].
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Callable

import numpy as np

HERE = Path(__file__).parent
REPOSITORY = HERE.parent
BASELINE_COMMIT = "d5eb9ecf976793651f72437f93a99e07f0a65156"
STEPS = 100_000
DISTINCT_CURVES = 10_000


def baseline_ledger_class(directory: Path, commit: str) -> type:
    """The PrivacyLedger class of `commit`, using that commit's UpperSum (both read with git show)."""
    def source(path: str) -> str:
        return subprocess.run(["git", "-C", str(REPOSITORY), "show", f"{commit}:{path}"], check=True,
                              capture_output=True, text=True).stdout

    def load(name: str, text: str) -> ModuleType:
        path = directory / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    load("baseline_summation", source("accounting/summation.py"))
    ledger_text = source("accounting/ledger.py")
    old_import = "from dpledger.accounting.summation import UpperSum"
    if old_import not in ledger_text:
        raise SystemExit(f"the baseline ledger at {commit} does not import UpperSum as expected")
    ledger = load("baseline_ledger", ledger_text.replace(old_import, "from baseline_summation import UpperSum"))
    return ledger.PrivacyLedger


def per_step_values(steps: int, orders: tuple[float, ...], seed: int = 0) -> np.ndarray:
    """RDP-like rows: a Gaussian mechanism's alpha / (2 sigma^2) with sigma spread over two decades,
    times a data-dependent factor over six decades (seeded); 100,000 of them convert to epsilon ~ 1."""
    rng = np.random.default_rng(seed)
    sigma = 10.0 ** rng.uniform(0.0, 2.0, (steps, 1))
    factor = 10.0 ** rng.uniform(-9.0, -3.0, (steps, 1))
    return factor * np.asarray(orders)[None, :] / (2.0 * sigma ** 2)


def summary(seconds: list[float]) -> dict:
    return {"median_s": round(statistics.median(seconds), 5), "min_s": round(min(seconds), 5),
            "max_s": round(max(seconds), 5), "repeats": len(seconds)}


def ratio_summary(baseline: list[float], new: list[float]) -> dict:
    ratios = [b / n for b, n in zip(baseline, new)]
    return {"median": round(statistics.median(ratios), 2), "min": round(min(ratios), 2), "max": round(max(ratios), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--baseline-commit", default=BASELINE_COMMIT)
    parser.add_argument("--out", default=str(HERE / "results" / "ledger.json"))
    args = parser.parse_args()

    from dpledger.accounting import DEFAULT_ORDERS, PrivacyLedger, RdpCurve

    values = per_step_values(STEPS, DEFAULT_ORDERS)
    curves = [RdpCurve(DEFAULT_ORDERS, row, data_dependent=True) for row in values[:DISTINCT_CURVES]]
    with tempfile.TemporaryDirectory() as directory:
        OldLedger = baseline_ledger_class(Path(directory), args.baseline_commit)

        def block(ledger_class: type) -> Callable[[], object]:
            def run() -> object:
                ledger = ledger_class()
                ledger.charge_many({"a": (values, True)})
                return ledger.epsilon(1e-5).epsilon, ledger.component_curve("a").values
            return run

        def stepwise(ledger_class: type) -> Callable[[], object]:
            def run() -> object:
                ledger = ledger_class()
                for index in range(STEPS):
                    ledger.charge({"a": curves[index % DISTINCT_CURVES]})
                return ledger.epsilon(1e-5).epsilon, ledger.component_curve("a").values
            return run

        cases: dict[str, Callable[[], object]] = {
            "charge_many_100k/baseline": block(OldLedger), "charge_many_100k/new": block(PrivacyLedger),
            "charge_100k/baseline": stepwise(OldLedger), "charge_100k/new": stepwise(PrivacyLedger),
            "numpy_sum_100k": lambda: values.sum(axis=0),
        }
        outputs = {name: run() for name, run in cases.items()}  # warm-up, and the results compared below
        seconds: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, run in cases.items():
                started = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - started)

    def relative_gap(name: str) -> float:
        """Largest relative difference of the new totals from the baseline's (both upper bounds)."""
        old, new = outputs[f"{name}/baseline"][1], outputs[f"{name}/new"][1]
        return float(np.max(np.abs(new - old) / old))

    results = {
        "benchmark": "PrivacyLedger: 100,000 steps on the 156-order default grid, then epsilon(1e-5)",
        "baseline": f"accounting/ledger.py and accounting/summation.py at {args.baseline_commit}",
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                    "numpy": np.__version__, "python": platform.python_version()},
        "method": f"{args.repeats} interleaved repetitions; median and range; ratio = baseline / new per repetition",
        "cases": {name: summary(times) for name, times in seconds.items()},
        "speedup": {case: ratio_summary(seconds[f"{case}/baseline"], seconds[f"{case}/new"])
                    for case in ("charge_many_100k", "charge_100k")},
        "new_over_numpy_sum": {case: round(statistics.median(seconds[f"{case}/new"])
                                           / statistics.median(seconds["numpy_sum_100k"]), 1)
                               for case in ("charge_many_100k", "charge_100k")},
        "totals_max_relative_gap_new_vs_baseline": {case: relative_gap(case)
                                                   for case in ("charge_many_100k", "charge_100k")},
        "epsilon": {name: outputs[name][0] for name in cases if name != "numpy_sum_100k"},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
    print(json.dumps({"cases": results["cases"], "speedup": results["speedup"]}, indent=1))


if __name__ == "__main__":
    main()
