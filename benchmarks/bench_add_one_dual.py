"""Per-step cost of the add-one bound with and without the certified dual (dpledger.mechanisms.add_one), as
AdaPMixED's data-dependent charge runs it under add-or-remove-one: the closed form
(add_one_divergence_bounds(dual=False)) against dual=True, alone and inside the whole data-dependent
step (dpledger.mechanisms.step.data_dependent_step_curve: Eq. 3's leave-one-out curve plus the add-one bound),
on the run's 156-order grid. Writes benchmarks/results/add_one_dual_cost.json.

Inputs: benchmarks.bench_step.synthetic_ensemble (seeded LM-like laws), PMixED at alpha = 18,
beta = 0.002 (the audit tests' AdaPMixED) projected by the package. Paired runs: each repetition
times A then B on the same step (after one untimed warm-up each: numba compiles), the ratio is per
pair, and the JSON holds every pair's times and the ratios' min / median / max. One kernel thread.

    python -m benchmarks.bench_add_one_dual [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).parent
OUT = HERE / "results" / "add_one_dual_cost.json"
SIZES = ((1024, 8, 5), (50257, 100, 2))
"""(vocabulary, teachers, paired repetitions)."""


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(vocab: int, teachers: int, repetitions: int, alpha: float = 18.0, beta: float = 0.002) -> dict:
    from dpledger.accounting.orders import DEFAULT_ORDERS
    from dpledger.accounting.relation import NeighbouringRelation
    from benchmarks.bench_step import synthetic_ensemble
    from dpledger.mechanisms.add_one import add_one_divergence_bounds
    from dpledger.mechanisms.pmixed import PMixED
    from dpledger.mechanisms.step import data_dependent_step_curve

    teacher_np, public_np = synthetic_ensemble(vocab, teachers, seed=vocab + teachers)
    t = torch.from_numpy(teacher_np)[None]
    p0 = torch.from_numpy(public_np)[None]
    pmixed = PMixED(alpha, beta, teachers)
    lambdas = pmixed.mixing_weights_tensor(t, p0)
    orders = np.asarray(DEFAULT_ORDERS, dtype=np.float64)
    orders_t = torch.from_numpy(orders)
    relation = NeighbouringRelation.ADD_OR_REMOVE_ONE
    output = data_dependent_step_curve(pmixed, t, p0, lambdas, orders, relation)[4]

    calls = {
        "add_one_bound": (lambda: add_one_divergence_bounds(output, p0, teachers, orders_t, alpha, pmixed.radius),
                          lambda: add_one_divergence_bounds(output, p0, teachers, orders_t, alpha, pmixed.radius,
                                                            dual=True)),
        "data_dependent_step": (lambda: data_dependent_step_curve(pmixed, t, p0, lambdas, orders, relation),
                                lambda: data_dependent_step_curve(pmixed, t, p0, lambdas, orders, relation,
                                                                  add_one_dual=True)),
    }
    result = {"vocab": vocab, "teachers": teachers, "orders": int(orders.size), "alpha": alpha, "beta": beta,
              "repetitions": repetitions}
    for name, (closed, dual) in calls.items():
        closed(), dual()     # warm-up (compilation)
        pairs = []
        for _ in range(repetitions):
            a = _timed(closed)
            b = _timed(dual)
            pairs.append({"closed_s": a, "dual_s": b, "ratio": b / a})
        ratios = [pair["ratio"] for pair in pairs]
        result[name] = {"pairs": pairs,
                        "closed_s_median": statistics.median(p["closed_s"] for p in pairs),
                        "dual_s_median": statistics.median(p["dual_s"] for p in pairs),
                        "ratio": {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)}}
        print(f"V={vocab} N={teachers} {name}: closed {result[name]['closed_s_median']:.4g} s, dual "
              f"{result[name]['dual_s_median']:.4g} s, ratio {min(ratios):.4g}..{max(ratios):.4g} "
              f"(median {statistics.median(ratios):.4g})", flush=True)
    closed_bound = add_one_divergence_bounds(output, p0, teachers, orders_t, alpha, pmixed.radius).numpy()[0]
    dual_bound = add_one_divergence_bounds(output, p0, teachers, orders_t, alpha, pmixed.radius, dual=True).numpy()[0]
    result["bound_at_orders"] = {f"{k:g}": {"closed": float(c), "with_dual": float(d)}
                                 for k, c, d in zip(orders, closed_bound, dual_bound) if k in (1.5, 2.0, 5.0, 18.0,
                                                                                             64.0, 1024.0)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="V = 1024 only")
    args = parser.parse_args()
    os.environ.setdefault("DPLEDGER_KERNEL_THREADS", "1")
    torch.set_num_threads(1)
    sizes = SIZES[:1] if args.quick else SIZES
    report = {"what": __doc__.split("\n\n")[0], "machine": platform.platform(), "processor": platform.processor(),
              "cpus": os.cpu_count(), "note": "a shared 2-core machine (another workload ran beside it): times are "
                                              "indicative, the paired ratios less sensitive to the load",
              "results": [measure(v, n, r) for v, n, r in sizes]}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
