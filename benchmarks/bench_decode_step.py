"""Per-step cost of PMixED's decode step (dpledger.decoding.runners.pmixed_runner's `process`, what the
decode loop calls on each block) relative to PMixED.step alone, before and after the decode loop
stopped computing what it does not charge. Writes benchmarks/results/decode_step.json.

Before: the runner also computed Eq. 3 exactly at every order of the run's grid (mixed_teachers, then
leave_one_out_divergences over all 156 orders, max over teachers) for a recorded column that nothing
charged; that computation is timed here beside today's `process`, on the same step, as the earlier
runner ran it. After: `process` as it is (PMixED's mixing weights, output and Theorem 3.1 curve).

Inputs: benchmarks.bench_step.synthetic_ensemble (seeded LM-like laws) at demo scale (V = 1,024,
N = 8) and paper scale (V = 50,257, N = 100), one decode step (L = 1), PMixED at alpha 6, beta 0.01
(bench_step's PMixED), the run's grid default_orders(6) (156 orders). The machine is shared: every
repetition times the three calls back to back in a rotating order (paired, interleaved) after one
untimed warm-up each (numba compiles); the ratios are per repetition, and the JSON holds every
repetition's times and the ratios' min / median / max. One thread.

    python -m benchmarks.bench_decode_step [--quick]
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
OUT = HERE / "results" / "decode_step.json"
SIZES = ((1024, 8, 41), (50257, 100, 7))
"""(vocabulary, teachers, paired repetitions)."""
ALPHA, BETA = 6.0, 0.01


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _summary(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def measure(vocab: int, teachers: int, repetitions: int) -> dict:
    """The paired, interleaved times of PMixED.step, the decode step before and the decode step after
    on one synthetic step, and the ratios of each decode step to PMixED.step."""
    from benchmarks.bench_step import synthetic_ensemble
    from dpledger.accounting.orders import default_orders
    from dpledger.decoding.runners import pmixed_runner
    from dpledger.mechanisms.kernels import mixed_teachers
    from dpledger.mechanisms.leave_one_out import leave_one_out_divergences
    from dpledger.mechanisms.pmixed import PMixED
    from dpledger.mechanisms.randomness import StepGenerators

    probs, public = synthetic_ensemble(vocab, teachers)
    teacher_block = torch.from_numpy(probs)[None]     # (L = 1, N, V), as the decode loop passes a block
    public_block = torch.from_numpy(public)[None]     # (1, V)
    orders = np.asarray(default_orders(ALPHA))
    pmixed = PMixED(ALPHA, BETA, teachers)
    runner = pmixed_runner(ALPHA, BETA, teachers)
    generators = StepGenerators.for_steps(0, 0, 1)

    def after():
        return runner.process(public_block, teacher_block, generators, orders)

    def before():
        outcome = after()
        mixed = mixed_teachers(teacher_block, public_block, torch.from_numpy(outcome.lambdas))
        return leave_one_out_divergences(mixed, torch.from_numpy(orders)).max(dim=-2).values.numpy()

    calls = {"pmixed_step": lambda: pmixed.step(probs, public, orders=orders), "decode_before": before,
             "decode_after": after}
    for call in calls.values():
        call()
    names = list(calls)
    rows = []
    for repetition in range(repetitions):
        order = names[repetition % 3:] + names[:repetition % 3]   # rotate who goes first
        times = {name: _timed(calls[name]) for name in order}
        rows.append({**{f"{name}_s": times[name] for name in names},
                     "before_over_step": times["decode_before"] / times["pmixed_step"],
                     "after_over_step": times["decode_after"] / times["pmixed_step"],
                     "after_over_before": times["decode_after"] / times["decode_before"]})
    return {"vocab": vocab, "teachers": teachers, "orders": int(orders.size), "alpha": ALPHA, "beta": BETA,
            "repetitions": repetitions, "pairs": rows,
            **{f"{name}_s": _summary([row[f"{name}_s"] for row in rows]) for name in names},
            **{key: _summary([row[key] for row in rows])
               for key in ("before_over_step", "after_over_step", "after_over_before")}}


def main() -> None:
    """Measure every size and write OUT."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="demo scale only, 3 repetitions")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("DPLEDGER_KERNEL_THREADS", "1")
    sizes = ((1024, 8, 3),) if args.quick else SIZES
    results = []
    for vocab, teachers, repetitions in sizes:
        results.append(measure(vocab, teachers, repetitions))
        row = results[-1]
        print(f"V={vocab} N={teachers}: PMixED.step {row['pmixed_step_s']['median']:.4g} s; decode step / PMixED.step "
              f"before {row['before_over_step']['median']:.3g} "
              f"[{row['before_over_step']['min']:.3g}, {row['before_over_step']['max']:.3g}], after "
              f"{row['after_over_step']['median']:.3g} [{row['after_over_step']['min']:.3g}, "
              f"{row['after_over_step']['max']:.3g}]", flush=True)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({
        "what": __doc__.split("\n\n    python")[0],
        "machine": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "note": "a shared 2-core machine (other workloads ran beside it): times are indicative, the paired ratios "
                "less sensitive to the load",
        "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
