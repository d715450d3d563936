"""The paper-scale AdaPMixED step on a CUDA device (V = 50,257, N = 100, the 156 default orders,
remove- and add-one): its time, where it goes, Eq. 3's Triton kernel beside torch's loop of one
logsumexp per order, and the step's numbers against the CPU step's on the same inputs.
Writes benchmarks/results/gpu.json; without CUDA it measures nothing and leaves that file as it is.

Timing: CUDA-synchronised wall time per call after warm-up calls (Triton and numba compile on first use);
kernel against loop as interleaved pairs in one process, each pair's ratio reported as median and range.
The CPU side (the add-one bound, the screen's statistic, the comparison step) runs on one thread.

Agreement with the CPU step (numba kernels), same inputs and noise seed: the lambdas and output, the
screen's statistic, and per order the Eq. 3 value (the GPU's exact at every order; the CPU's exact on
a sub-grid with chord bounds in between, never below the exact value beyond their rounding allowance),
the add-one bound and the charged curve, as ratios GPU / CPU.

Inputs: bench_step.synthetic_ensemble (public logits 4.5 z, teacher logits + 1.0 z_i, softmax), seed 0.
"""
from __future__ import annotations

import os

for _variable in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")   # the CPU side on one thread, before numpy, torch and numba start

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.bench_step import ratios, summary  # noqa: E402
from benchmarks.step_timing import call_seconds, synthetic_ensemble  # noqa: E402
from dpledger.accounting.strict_json import strict_json_text  # noqa: E402

VOCAB, TEACHERS = 50257, 100


def synchronise() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def synchronised_seconds(function, repeats: int, warm_up: int = 2) -> list[float]:
    """Wall seconds of `repeats` calls, each ended by torch.cuda.synchronize, after `warm_up` calls."""
    return call_seconds(function, repeats, warm_up, after=synchronise)


def with_triton(enabled: bool, function):
    """`function` run with dpledger's Triton kernels on or off (DPLEDGER_TRITON; off: the torch forms)."""
    def run():
        before = os.environ.get("DPLEDGER_TRITON")
        os.environ["DPLEDGER_TRITON"] = "1" if enabled else "0"
        try:
            return function()
        finally:
            if before is None:
                del os.environ["DPLEDGER_TRITON"]
            else:
                os.environ["DPLEDGER_TRITON"] = before
    return run


def paired(kernel, loop, pairs: int, repeats: int) -> dict:
    """Interleaved pairs (loop, kernel), each sample the median of `repeats` synchronised calls: `kernel`
    with the Triton kernels, `loop` the same work with DPLEDGER_TRITON=0 (the torch forms: torch's loop of
    logsumexps, and in a whole step the torch Illinois solver too)."""
    kernel_seconds, loop_seconds = [], []
    for _ in range(pairs):
        loop_seconds.append(statistics.median(synchronised_seconds(loop, repeats, warm_up=1)))
        kernel_seconds.append(statistics.median(synchronised_seconds(kernel, repeats, warm_up=1)))
    return {"seconds_triton_kernels": summary(kernel_seconds, 6), "seconds_torch_forms": summary(loop_seconds, 6),
            "speedup": ratios({"loop": loop_seconds, "kernel": kernel_seconds}, "loop", "kernel")}


def environment() -> dict:
    import numba

    from dpledger.mechanisms.device_kernels import triton_moments_enabled
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    on_device = torch.cuda.is_available()
    properties = torch.cuda.get_device_properties(0) if on_device else None
    return {"device": torch.cuda.get_device_name(0) if on_device else "cpu (a dry run)",
            "multiprocessors": properties.multi_processor_count if properties else None,
            "device_memory_gib": round(properties.total_memory / 2 ** 30, 1) if properties else None,
            "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton_version, "numba": numba.__version__, "numpy": np.__version__,
            "python": platform.python_version(), "cpu_cores": os.cpu_count(),
            "triton_kernel_runs": triton_moments_enabled(torch.device("cuda" if on_device else "cpu"))}


def step_section(ada, teachers, public, orders, pairs: int) -> dict:
    from dpledger.mechanisms.step import adapmixed_step

    def step(relation=None):
        def run():
            return adapmixed_step(ada, teachers, public, torch.Generator().manual_seed(0), orders, relation=relation)
        return run

    full = paired(with_triton(True, step()), with_triton(False, step()), pairs, repeats=10)
    remove_one = summary(synchronised_seconds(step("remove_one"), 10), 6)
    return {"adapmixed_step_add_or_remove": full, "adapmixed_step_remove_one_only": {"seconds_triton_kernels": remove_one}}


def phases_section(ada, teachers, public, orders) -> dict:
    """Each part of the step alone, synchronised, median of 10 (the step runs them in this order)."""
    from dpledger.mechanisms.add_one import add_one_divergence_bounds
    from dpledger.mechanisms.kernels import _sums_without_each_by_rows, mixed_teachers, sums_without_each
    from dpledger.mechanisms.leave_one_out import leave_one_out_curve

    pmixed, screen = ada.pmixed, ada.screening
    lambdas = pmixed.mixing_weights_tensor(teachers, public)
    mixed = mixed_teachers(teachers, public, lambdas)
    output = mixed.mean(dim=-2)
    orders_t = torch.from_numpy(orders)

    parts = {
        "screen_statistic (top-k columns gathered on the device)":
            lambda: screen.statistics(teachers, public, torch.Generator().manual_seed(0)),
        "screen_statistic (whole ensemble copied to the CPU, as before)":
            lambda: screen.statistics(teachers.cpu(), public.cpu(), torch.Generator().manual_seed(0)),
        "mixing_weights (Triton solver, one launch)": with_triton(True, lambda: pmixed.mixing_weights_tensor(teachers, public)),
        "mixing_weights (torch Illinois solver)": with_triton(False, lambda: pmixed.mixing_weights_tensor(teachers, public)),
        "mixed_teachers": lambda: mixed_teachers(teachers, public, lambdas),
        "sums_without_each (two scans)": lambda: sums_without_each(mixed),
        "sums_without_each (row at a time, as before)": lambda: _sums_without_each_by_rows(mixed),
        "eq3_curve (Triton kernel)": with_triton(True, lambda: leave_one_out_curve(teachers, public, lambdas, orders)),
        "eq3_curve (torch loop over orders)":
            with_triton(False, lambda: leave_one_out_curve(teachers, public, lambdas, orders)),
        "add_one_bound (CPU, output copied)": lambda: add_one_divergence_bounds(
            output, public, TEACHERS, orders_t, *pmixed.one_order_ball, relative_tolerance=0.005),
    }
    return {name: summary(synchronised_seconds(function, 10), 6) for name, function in parts.items()}


def kernel_section(ada, teachers, public, orders) -> dict:
    """The Triton kernel against torch's loop on the same rows: values and the exps per second."""
    from dpledger.mechanisms.device_kernels import log_moments

    base, ratio = eq3_rows(ada, teachers, public)
    orders_t = torch.from_numpy(orders).to(teachers.device)
    kernel = with_triton(True, lambda: log_moments(base, ratio, orders_t))
    loop = with_triton(False, lambda: log_moments(base, ratio, orders_t))
    difference = (kernel() - loop()).abs()
    timing = paired(kernel, loop, pairs=5, repeats=5)
    exps = base.numel() * orders.size
    return {**timing, "max_abs_difference_from_loop": float(difference.max()),
            "exps_per_second_triton": exps / timing["seconds_triton_kernels"]["median"],
            "note": "one direction of Eq. 3 (D(p || p_-i)) at every teacher and order: N x K x V exps"}


def eq3_rows(ada, teachers, public) -> tuple:
    """(base, ratio) of D(p || p_-i) for every teacher i: log p_-i and log p - log p_-i, (N, V) each."""
    from dpledger.mechanisms.kernels import _log, mixed_teachers, sums_without_each

    lambdas = ada.pmixed.mixing_weights_tensor(teachers, public)
    mixed = mixed_teachers(teachers, public, lambdas)
    log_p = _log(mixed.sum(dim=-2, keepdim=True) / TEACHERS).expand_as(mixed)
    log_q = _log(sums_without_each(mixed) / (TEACHERS - 1))
    return log_q.contiguous(), (log_p - log_q).contiguous()


def block_sizes_section(ada, teachers, public, orders) -> dict:
    """Block sizes of both kernels, each the median of 5 synchronised calls; the fastest is kept for the
    sections after this one (and recorded)."""
    from dpledger.mechanisms import device_kernels

    base, ratio = eq3_rows(ada, teachers, public)
    orders_t = torch.from_numpy(orders).to(teachers.device)
    moments = {}
    for block_orders, block_tokens in ((4, 128), (4, 256), (8, 128), (8, 256), (8, 512), (16, 128), (16, 256)):
        device_kernels._BLOCK_ORDERS, device_kernels._BLOCK_TOKENS = block_orders, block_tokens
        moments[f"{block_orders}x{block_tokens}"] = statistics.median(synchronised_seconds(
            lambda: device_kernels.log_moments(base, ratio, orders_t), 5))
    best = min(moments, key=moments.get)
    device_kernels._BLOCK_ORDERS, device_kernels._BLOCK_TOKENS = (int(x) for x in best.split("x"))
    solver = {}
    for block_tokens, warps in ((256, 4), (512, 4), (512, 8), (1024, 4), (1024, 8), (2048, 8)):
        device_kernels._SOLVER_BLOCK_TOKENS, device_kernels._SOLVER_WARPS = block_tokens, warps
        solver[f"{block_tokens}x{warps}"] = statistics.median(synchronised_seconds(
            lambda: ada.pmixed.mixing_weights_tensor(teachers, public), 5))
    best_solver = min(solver, key=solver.get)
    device_kernels._SOLVER_BLOCK_TOKENS, device_kernels._SOLVER_WARPS = (int(x) for x in best_solver.split("x"))
    return {"log_moments_orders_x_tokens_seconds": moments, "used_in_this_run": best,
            "solver_tokens_x_warps_seconds": solver, "solver_used_in_this_run": best_solver}


def agreement_section(ada, teachers, public, orders) -> dict:
    """The GPU step against the CPU step (numba kernels) on the same inputs and noise seed."""
    on_gpu = ada.step(teachers, public, torch.Generator().manual_seed(0), orders)
    on_cpu = ada.step(teachers.cpu(), public.cpu(), torch.Generator().manual_seed(0), orders)

    def ratio_range(gpu, cpu) -> dict:
        ratio = np.asarray(gpu, dtype=float) / np.asarray(cpu, dtype=float)
        return {"min": float(ratio.min()), "max": float(ratio.max())}

    removed_gpu, removed_cpu = on_gpu.details["eq3_remove_one"], on_cpu.details["eq3_remove_one"]
    exact = on_cpu.exact_orders.reshape(-1)
    allowance = on_cpu.details["eq3_allowance"].reshape(-1)
    # the CPU's exact orders against the GPU's (both exact there): within both computations' allowances
    exact_gap = np.abs(removed_gpu.reshape(-1) - removed_cpu.reshape(-1))[exact]
    # between them the CPU's chord bound is above the exact value, the GPU's: never below it beyond allowances
    below = (removed_cpu.reshape(-1) + 2 * allowance - removed_gpu.reshape(-1))[~exact]
    total_gpu = sum(on_gpu.charged.values())
    total_cpu = sum(on_cpu.charged.values())
    torch_lambdas = with_triton(False, lambda: ada.pmixed.mixing_weights_tensor(teachers, public))()
    return {
        "lambdas_max_abs_difference": float((on_gpu.lambdas.cpu() - on_cpu.lambdas).abs().max()),
        "lambdas_triton_solver_minus_torch_solver_max_abs": float((on_gpu.lambdas - torch_lambdas).abs().max()),
        "output_max_abs_difference": float((on_gpu.output.cpu() - on_cpu.output).abs().max()),
        "screen_statistic_gpu_cpu": [float(on_gpu.screen_statistic.reshape(-1)[0]),
                                     float(on_cpu.screen_statistic.reshape(-1)[0])],
        "eq3_gpu_over_cpu": ratio_range(removed_gpu, removed_cpu),
        "eq3_cpu_exact_orders": int(exact.sum()), "eq3_orders": int(exact.size),
        "eq3_max_abs_gap_at_cpu_exact_orders": float(exact_gap.max()) if exact_gap.size else None,
        "eq3_cpu_allowance_max": float(allowance.max()),
        "eq3_cpu_chord_plus_twice_allowance_minus_gpu_min_at_other_orders": float(below.min()) if below.size else None,
        "add_one_gpu_over_cpu": ratio_range(on_gpu.add_one_bound, on_cpu.add_one_bound),
        "charged_total_gpu_over_cpu": ratio_range(total_gpu, total_cpu),
    }


def profile_section(ada, teachers, public, orders) -> list:
    """The step's device kernels by CUDA time (torch.profiler), top 15."""
    from torch.profiler import ProfilerActivity, profile

    ada.step(teachers, public, torch.Generator().manual_seed(0), orders)
    synchronise()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        ada.step(teachers, public, torch.Generator().manual_seed(0), orders)
        synchronise()
    rows = []
    for event in sorted(prof.key_averages(), key=lambda e: -getattr(e, "device_time_total", 0))[:15]:
        rows.append({"name": event.key[:120], "calls": event.count,
                     "device_ms": round(getattr(event, "device_time_total", 0) / 1000, 3),
                     "cpu_ms": round(event.cpu_time_total / 1000, 3)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="the results file (default benchmarks/results/gpu.json; a dry run writes "
                                      "only where this names a file)")
    parser.add_argument("--pairs", type=int, default=5, help="interleaved (loop, kernel) pairs of the whole step")
    parser.add_argument("--dry-run", type=int, nargs=2, metavar=("VOCAB", "TEACHERS"),
                        help="run every section on the CPU at this size (checks the script, measures nothing; writes only to --out)")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error(f"--pairs must be at least 1, got {args.pairs}")
    global VOCAB, TEACHERS
    from dpledger.mechanisms.device_kernels import triton_moments_enabled

    out = args.out if args.out is not None or args.dry_run else str(HERE / "results" / "gpu.json")
    if args.dry_run:
        VOCAB, TEACHERS = args.dry_run
    elif not torch.cuda.is_available():   # the measured results stay as they are
        print(f"bench_gpu: no CUDA device on this machine, nothing measured ({out} kept)")
        return
    elif not triton_moments_enabled(torch.device("cuda")):   # its figures would time the torch forms against themselves
        print(f"bench_gpu: the Triton kernels do not run on this CUDA device (Triton missing, ROCm or DPLEDGER_TRITON=0), "
              f"nothing measured ({out} kept)")
        return
    torch.set_num_threads(1)
    from dpledger.accounting.orders import DEFAULT_ORDERS
    from dpledger.mechanisms.adapmixed import AdaPMixED

    probs, public_np = synthetic_ensemble(VOCAB, TEACHERS)
    device = "cpu" if args.dry_run else "cuda"
    teachers, public = torch.from_numpy(probs).to(device), torch.from_numpy(public_np).to(device)
    ada = AdaPMixED.paper_defaults(TEACHERS)
    orders = np.asarray(DEFAULT_ORDERS, dtype=np.float64)
    result: dict = {"benchmark": __doc__.split("\n\n")[0], "vocab": VOCAB, "teachers": TEACHERS,
                    "orders": int(orders.size), "environment": environment()}
    print(json.dumps(result["environment"]), flush=True)
    sections = (("block_sizes", block_sizes_section), ("kernel", kernel_section), ("phases", phases_section),
                ("agreement", agreement_section),
                ("profile", profile_section),
                ("step", lambda *inputs: step_section(*inputs, pairs=args.pairs)))
    for name, section in sections:
        started = time.perf_counter()
        try:
            result[name] = section(ada, teachers, public, orders)
        except Exception:   # one failing section must not lose the others' figures
            result[name] = {"error": traceback.format_exc()[-3000:]}
        print(f"{name} ({time.perf_counter() - started:.1f} s): {strict_json_text({name: result[name]}, indent=None)}", flush=True)
        if out is not None:   # strict JSON: a non-finite figure is written null and named under NULLS
            Path(out).write_text(strict_json_text(result, sort_keys=False) + "\n")


if __name__ == "__main__":
    main()
