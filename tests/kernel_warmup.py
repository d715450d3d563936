"""Compile every numba kernel the suite runs into the on-disk kernel cache once, split across processes,
before `make test` starts its workers.

Why: in a clean clone (as CI runs) the cache is empty, and every process that needs a kernel compiles
it: both pytest workers, the Dask workers of tests/test_distributed.py and the CLI subprocesses, all at
once on two cores. That made a cold `make test` 1,004 s against 550 s warm (2026-11-27). Compiled once
here, two processes side by side, the rest load each kernel from the cache in milliseconds.

The table lists each kernel's argument types as its call sites pass them (taken from a cache that the
whole suite filled: `python -m tests.kernel_warmup --table CACHE_DIR` prints it again). A stale entry
costs time, never a test: a kernel called with other types compiles on first use, as it always did.
A kernel renamed or removed fails here, naming it (tests/test_kernel_warmup.py checks the table).

Run: python -m tests.kernel_warmup [--processes N]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (module under dpledger.mechanisms, kernel, argument types): f float64, i int64, b bool; an array is
# its dtype letter and its number of dimensions, C-contiguous, with "r" when read-only
KERNELS: tuple[tuple[str, str, str], ...] = (
    ("add_one", "_ball_certified", "f f f"),
    ("add_one", "_certified_point", "f f f f f f f f f f2 i"),
    ("add_one", "_certify", "f f f f1 f1 f1 f1 f f f f2 f2 f2 f2 f1 f i"),
    ("add_one", "_certify_token", "f f f i f1 f1 f1 f1 f f f f f f f f2 f2 f f i f1 f2"),
    ("add_one", "_combine", "f f f f f f f f"),
    ("add_one", "_evaluate", "f f f f1 f1 f f f f2 f2 f2 f2 i f1 f2"),
    ("add_one", "_f_certified", "f f f f"),
    ("add_one", "_grid", "f1 f1 f1 f1 i f2"),
    ("add_one", "_initial_multipliers", "f1 f1 f f f f"),
    ("add_one", "_linear", "f f f f f"),
    ("add_one", "_merged_box", "f1 f2 f1 f1 f f i"),
    ("add_one", "_min_over_nu", "f f f1 f1 f f f f f f f2 f2 f2 f2 i f1 f2"),
    ("add_one", "_nelder_mead", "f1 f i f1 f1 f f f f f f f2 f2 f2 f2 i f1 f2"),
    ("add_one", "_nm_value", "f1 f1 f1 f f f f f f f2 f2 f2 f2 i f1 f2"),
    ("add_one", "_optimise", "f1 f1 f f f f f f f2 f2 f2 f2 i f1 f1 i i"),
    ("add_one", "_phi_all", "f f f f f f f f f"),
    ("add_one", "_piece_bound", "f f f f f f f f f f f f f f"),
    ("add_one", "_row_duals", "f1 f1 f1 f1 f f1 f1 f1 f f f f f f b i i i i f i f2 f3 f3 f2"),
    ("add_one", "_solve_small", "f2 f1 b1 f1"),
    ("fused", "_chords_and_floor", "f1 b1 f2 f2 f f2 f1 f1"),
    ("fused", "_integer_order_sums", "i f f f f f1 f1"),
    ("fused", "_public_for_bounds", "f1 f1"),
    ("fused", "_screen_decided", "f1 f f1 f f f"),
    ("fused", "_screen_decision_margin", "f f i"),
    ("fused", "_screen_decision_margin", "f f f"),
    ("fused", "add_one_lattice_allowances", "f1 b1 f1 f2 f2"),
    ("fused", "add_one_order_sums", "f1 f1 f1 f1 f f1 f1 f1 f1"),
    ("fused", "add_one_power_bases", "f1 f1 f1 f1 f1 f1 f1 f1"),
    ("fused", "add_one_token_bounds", "f2 f2 f f f2 f2 f2 f2"),
    ("fused", "allocated_tokens_of", "f1 f1"),
    ("fused", "add_one_power_order_sums", "f1 f1 f1 f1 f1 f1 f f f f1 i1 i1 f f1 f1 f1 f1 b1"),
    ("fused", "add_one_weighted_order_sums", "f1 f1 f1 f1 f f1 f f1 f1 f1 f1"),
    ("fused", "convex_sandwich", "f1 b2 f2 f2 b f f2 f2 f2"),
    ("fused", "finite_magnitude", "f1 f1"),
    ("fused", "has_positive_below", "f1 f"),
    ("fused", "has_positive_below_parallel", "f1 f"),
    ("fused", "knapsack_allocation", "f1 f1 f f1"),
    ("fused", "leave_one_out_direction_power_moments", "f1 f1 f2 f2 f2 i1 f1 b f f f3"),
    ("fused", "leave_one_out_log_moments", "f1 f1 f2 f2 f2 i1 f1 b2 b f f2 f2 f3"),
    ("fused", "leave_one_out_log_ratios", "f2 f1 f1 f1 f1 f2 f2 f2"),
    ("fused", "leave_one_out_log_ratios_parallel", "f2 f1 f1 f1 f1 f2 f2 f2"),
    ("fused", "normalised_distributions", "f2 f2 f1"),
    ("fused", "refinement_round", "f1 f f f f i b i1 i1 b2 f2 f2 f2 f2 f1 b1"),
    ("fused", "renyi_log_moments", "f2 f2 i1 i1 f1 f f f2"),
    ("fused", "renyi_log_moments", "f2 f2r i1 i1 f1 f f f2"),
    ("fused", "renyi_log_moments_parallel", "f2 f2 i1 i1 f1 f f f2"),
    ("fused", "screen_pass_counts", "f3 f2 f3 f f f f2"),
    ("fused", "solve_mixing_weights", "f2 f1 f1 f1 f f i f i f1 i1"),
)

# seconds to compile, measured cold on one core (2026-11-27); unlisted kernels take about a second.
# Only the split across processes uses them: the largest first, each to the least loaded process.
COMPILE_SECONDS = {"solve_mixing_weights": 30.0, "_row_duals": 30.0, "leave_one_out_log_ratios_parallel": 15.0,
                   "leave_one_out_direction_power_moments": 13.0, "screen_pass_counts": 10.0,
                   "refinement_round": 7.0, "knapsack_allocation": 5.0, "leave_one_out_log_ratios": 4.5,
                   "renyi_log_moments_parallel": 4.0, "add_one_power_order_sums": 3.5,
                   "leave_one_out_log_moments": 3.0, "renyi_log_moments": 2.5, "_chords_and_floor": 2.5}

_LETTERS = {"f": "float64", "i": "int64", "b": "boolean"}


def argument_types(codes: str) -> tuple:
    """The numba types a row of KERNELS names, e.g. "f2r i" -> (read-only 2-d float64 array, int64)."""
    from numba import types

    result = []
    for code in codes.split():
        scalar = getattr(types, _LETTERS[code[0]])
        if len(code) == 1:
            result.append(scalar)
            continue
        result.append(types.Array(scalar, int(code[1]), "C", readonly=code.endswith("r")))
    return tuple(result)


def shares(processes: int) -> list[list[int]]:
    """KERNELS' row indices split into `processes` lists of about equal compile time."""
    loads = [0.0] * processes
    split: list[list[int]] = [[] for _ in range(processes)]
    order = sorted(range(len(KERNELS)), key=lambda row: -COMPILE_SECONDS.get(KERNELS[row][1], 1.0))
    for row in order:
        least = loads.index(min(loads))
        split[least].append(row)
        loads[least] += COMPILE_SECONDS.get(KERNELS[row][1], 1.0)
    return split


def compile_rows(rows: list[int]) -> None:
    """Compile (or load from the cache) the kernels of these KERNELS rows, in this process."""
    import importlib

    for row in rows:   # importing the kernels' modules sets the vector width, as in the suite (fastmath.py)
        module, name, codes = KERNELS[row]
        kernel = getattr(importlib.import_module(f"dpledger.mechanisms.{module}"), name, None)
        if kernel is None or not hasattr(kernel, "compile"):
            raise SystemExit(f"tests/kernel_warmup.py: dpledger.mechanisms.{module}.{name} is not a numba kernel; "
                             "update KERNELS")
        kernel.compile(argument_types(codes))


def print_table(cache: Path) -> None:
    """Print KERNELS' rows from a filled numba cache directory (numba's index files: pickled
    (stamp, {(signature, target, ...): file name})), for pasting above."""
    import pickle

    from numba import types

    letters = {"float64": "f", "int64": "i", "bool": "b"}
    for index in sorted(cache.rglob("*.nbi")):
        module, _, rest = index.name.partition(".")
        name = rest.rsplit("-", 1)[0]
        with index.open("rb") as handle:
            pickle.load(handle)                       # numba's version
            _, overloads = pickle.loads(handle.read())
        for key in overloads:
            codes = []
            for kind in key[0]:
                if isinstance(kind, types.Array) and kind.layout == "C" and str(kind.dtype) in letters:
                    codes.append(f"{letters[str(kind.dtype)]}{kind.ndim}{'' if kind.mutable else 'r'}")
                elif str(kind) in letters:
                    codes.append(letters[str(kind)])
                else:
                    break   # a literal or other type a test passed: it compiles on first use
            else:
                print(f'    ("{module}", "{name}", "{" ".join(codes)}"),')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--rows", help=argparse.SUPPRESS)   # a child's share: comma-separated row indices
    parser.add_argument("--table", type=Path, help="print KERNELS from this filled numba cache directory")
    arguments = parser.parse_args()
    if arguments.table is not None:
        print_table(arguments.table)
        return
    if arguments.rows is not None:
        compile_rows([int(row) for row in arguments.rows.split(",") if row])
        return
    from dpledger.mechanisms.fastmath import kernel_cache_dir

    directory = kernel_cache_dir()
    if directory is None:
        print("kernel warm-up: the kernel cache is off (DPLEDGER_NUMBA_CACHE=off): nothing to warm")
        return
    started = time.perf_counter()
    children = [subprocess.Popen([sys.executable, "-m", "tests.kernel_warmup", "--rows", ",".join(map(str, share))],
                                 cwd=ROOT) for share in shares(max(1, arguments.processes)) if share]
    failed = [child.args for child in children if child.wait() != 0]
    if failed:
        raise SystemExit(f"kernel warm-up failed: {failed}")
    print(f"kernel warm-up: {len(KERNELS)} kernels compiled or loaded in {len(children)} processes into "
          f"{directory} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
