"""What the AdaPMixED step's kernels cost against the arithmetic they perform: the cost of each primitive
on this machine, the work each kernel does in one step, and its time per unit of that work. Writes
benchmarks/results/floor.json.

What it answers: where the step's time goes between its kernels and the Python around them, and whether
Eq. 3's moments, its largest kernel, cost more than their parts timed apart, measured on the machine at
hand instead of quoted from one-off numbers.

1. Primitives, each a compiled loop over a 2,048-token chunk with the kernels' flags, in ns per token:
   the exp pair (`vexp_pair`: exp(x) and exp(-x), what Eq. 3's exp path takes per token and order),
   one product pass (two multiplies and their loads and stores, the power path per set bit of a step)
   and one sum pass (the power path's two weighted sums per order).
2. One step at `--vocab` x `--teachers` (default N = 8, V = 50,257, issue 27's target that stays below
   2x): the step's median seconds without a profiler; under cProfile, each compiled kernel's own time
   per step and the rest (Python and numpy around them, inflated by the profiler); and the work, counted
   by wrapping the calls: Eq. 3's teacher-order evaluations (leave_one_out_log_moments), split into those
   on its one-exp-pair path and those on its two-pass log-sum-exp path (two exps per token and a pass for
   the largest exponents, taken where an order times the row's log-ratio span is large; a row with
   q = p or a token q_j = 0 < p_j takes neither: the kernel answers 0 or +inf without a sum), and the
   add-one sums' orders and allocated tokens.
3. Per unit of work (null where the profile kept no time for the kernel): Eq. 3's ns per teacher-order-token
   of the evaluations that sum (both paths together) beside the exp pair plus a
   sum pass timed apart (its one-exp-pair path per token: the pair, three loads, no stores, four running
   sums, two of them the slopes'; the sum pass has two: these are its parts, not a proven lower bound),
   and the add-one sums' ns per order-token (no such comparison).

Run: python benchmarks/bench_floor.py [--vocab V] [--teachers N] [--steps S]
"""
from __future__ import annotations

import cProfile
import json
import os
import pstats
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DPLEDGER_KERNEL_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.bench_step import load, vector_unit  # noqa: E402
from benchmarks.step_timing import call_seconds, timed_adapmixed_steps  # noqa: E402
from dpledger.accounting.errors import OneLineErrorParser  # noqa: E402

CHUNK = 2048
"""Tokens per primitive pass: the kernels' own chunk (dpledger.mechanisms.fused._CHUNK), in L1/L2."""


def primitive_costs(repeats: int = 20000) -> dict:
    """ns per token of the exp pair, a product pass and a sum pass, each the median of 5 timings of
    `repeats` passes over one chunk, compiled with the fused kernels' flags (reassociated sums)."""
    from dpledger.mechanisms.fastmath import jit, vexp_pair
    from dpledger.mechanisms.fused import _FLAGS

    @jit(**{**_FLAGS, "cache": False})
    def exp_pairs(x, ups, downs, passes):
        for _ in range(passes):
            for j in range(x.size):
                ups[j], downs[j] = vexp_pair(0.1 * x[j])

    @jit(**{**_FLAGS, "cache": False})
    def product_passes(power, inverse, ups, downs, passes):
        for _ in range(passes):
            for j in range(power.size):
                power[j] *= ups[j]
                inverse[j] *= downs[j]

    @jit(**{**_FLAGS, "cache": False})
    def sum_passes(power, inverse, output, ratios, passes):
        total = 0.0
        for _ in range(passes):
            forward, reverse = 0.0, 0.0
            for j in range(power.size):
                reverse += output[j] * power[j]
                forward += output[j] * ratios[j] * inverse[j]
            total += forward + reverse
        return total

    rng = np.random.default_rng(0)
    x = -5.0 * rng.random(CHUNK)
    ups, downs = np.exp(0.1 * x), np.exp(-0.1 * x)
    power, inverse, output, ratios = (rng.random(CHUNK) for _ in range(4))
    cases = {"exp_pair": (exp_pairs, (x, ups.copy(), downs.copy())),
             "product_pass": (product_passes, (np.ones(CHUNK), np.ones(CHUNK), np.full(CHUNK, 1.0 - 1e-9),
                                               np.full(CHUNK, 1.0 + 1e-9))),
             "sum_pass": (sum_passes, (power, inverse, output, ratios))}
    costs = {}
    for name, (kernel, arguments) in cases.items():
        kernel(*arguments, 1)   # compiles
        timings = call_seconds(lambda: kernel(*arguments, repeats), 5, warm_up=0)  # noqa: B023 (called at once)
        costs[name] = round(statistics.median(timings) / (repeats * CHUNK) * 1e9, 4)
    return costs


def step_work(vocab: int, teachers: int, steps: int) -> dict:
    """The step's time, its kernels' own times under cProfile, and the work it does (module docstring)."""
    from dpledger.mechanisms import add_one, fused, kernels

    step, seconds = timed_adapmixed_steps(vocab, teachers, steps)
    from dpledger.mechanisms.fused import _FAST_RANGE

    counts = {"eq3_evaluations": 0, "eq3_one_exp_pair_path": 0, "eq3_two_pass_path": 0, "eq3_calls": 0,
              "add_one_orders": 0, "add_one_order_tokens": 0}
    moments, row_sums = kernels._LeaveOneOut.moments, add_one._AllocatedTokens._row_sums

    def counted_moments(self, rows, grid, wanted=None):
        wanted = np.ones((len(rows), len(grid)), dtype=bool) if wanted is None else np.asarray(wanted)
        counts["eq3_calls"] += 1
        counts["eq3_evaluations"] += int(wanted.sum())
        low, high = self.spans[rows, 0][:, None], self.spans[rows, 1][:, None]   # (fused.leave_one_out_log_moments' test)
        # rows with q = p or q_j = 0 < p_j take neither path (the kernel answers 0 or +inf at once)
        summed = wanted & ~(((low == 0.0) & (high == 0.0)) | (low == -np.inf))
        with np.errstate(invalid="ignore"):
            fast = (np.asarray(grid)[None, :] * (high - low) + np.abs(high) + np.log(self.output.size) < _FAST_RANGE) \
                & (not self.shifted_only)
        counts["eq3_one_exp_pair_path"] += int((summed & fast).sum())
        counts["eq3_two_pass_path"] += int((summed & ~fast).sum())
        return moments(self, rows, grid, wanted)

    def counted_row_sums(self, row, grid, targets):   # (every order and row the add-one sums take passes here)
        counts["add_one_orders"] += len(grid)
        counts["add_one_order_tokens"] += len(grid) * int(self.allocated_counts[row])
        return row_sums(self, row, grid, targets)

    kernels._LeaveOneOut.moments, add_one._AllocatedTokens._row_sums = counted_moments, counted_row_sums
    try:
        step()
    finally:
        kernels._LeaveOneOut.moments, add_one._AllocatedTokens._row_sums = moments, row_sums

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        step()
    profile.disable()
    table = pstats.Stats(profile).stats   # (function -> (calls, primitive calls, own time, cumulative, callers))
    kernel_files = {os.path.abspath(fused.__file__), os.path.abspath(add_one.__file__)}
    kernel_names = {name for module in (fused, add_one) for name, value in vars(module).items() if hasattr(value, "py_func")}
    own: dict[str, float] = {}
    total = 0.0
    for (filename, _, name), (_, _, own_time, cumulative, _) in table.items():
        if os.path.abspath(filename) in kernel_files and name in kernel_names:
            own[name] = own.get(name, 0.0) + own_time / steps
        if name == "step" and filename.endswith("adapmixed.py"):
            total = cumulative / steps
    kernel_seconds = sum(own.values())
    return {"vocab": vocab, "teachers": teachers, "steps": steps,
            "step_seconds": {"median": round(statistics.median(seconds), 6), "min": round(min(seconds), 6)},
            "profiled_step_seconds": round(total, 6),
            "profiled_kernel_seconds": {name: round(value, 6) for name, value in
                                        sorted(own.items(), key=lambda item: -item[1]) if value >= 1e-5},
            "profiled_kernels_total": round(kernel_seconds, 6),
            "profiled_rest": round(total - kernel_seconds, 6),
            "work": counts}


def main() -> None:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--teachers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "floor.json")
    arguments = parser.parse_args()
    for name, least in (("vocab", 1), ("teachers", 2), ("steps", 1)):
        if getattr(arguments, name) < least:
            parser.error(f"argument --{name}: must be at least {least}, got {getattr(arguments, name)}")
    torch.set_num_threads(1)
    started = load()
    primitives = primitive_costs()
    step = step_work(arguments.vocab, arguments.teachers, arguments.steps)
    work, kernel = step["work"], step["profiled_kernel_seconds"]
    per_unit: dict[str, float | None] = {}

    def per(name: str, units: float) -> float | None:
        """The kernel's ns per unit of work; None where the profile kept no time for it (under 10 us a step)."""
        return None if name not in kernel else round(kernel[name] / units * 1e9, 4)

    if work["eq3_evaluations"]:
        per_unit["eq3_ns_per_teacher_order_token"] = per(   # over the evaluations that sum over the tokens
            "leave_one_out_log_moments", (work["eq3_one_exp_pair_path"] + work["eq3_two_pass_path"]) * arguments.vocab)
        per_unit["eq3_parts_ns_exp_pair_plus_sum_pass"] = round(primitives["exp_pair"] + primitives["sum_pass"], 4)
    if work["add_one_order_tokens"]:
        per_unit["add_one_sums_ns_per_order_token"] = per("add_one_power_order_sums", work["add_one_order_tokens"])
    result = {"machine": vector_unit(), "load_before": started, "load_after": load(),
              "primitives_ns_per_token": primitives, "step": step, "per_unit_of_work": per_unit}
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
