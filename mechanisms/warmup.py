"""Compile the package's numba kernels into the on-disk kernel cache ahead of their first use, split
across processes: before `make test` starts its workers, and beside the demo while it trains its models.

Why: with an empty cache (a clean clone, a first install, or an upgrade that changes a kernel's source or
numba's version, either of which starts a fresh cache directory: dpledger.mechanisms.fastmath.kernel_cache_dir)
every process that needs a kernel compiles it: both pytest workers, the Dask workers of
tests/test_distributed.py and the CLI subprocesses, all at once on two cores. That made a cold `make test`
1,004 s against 550 s warm (2026-11-27). Compiled once here, two processes side by side, the rest load
each kernel from the cache in milliseconds. The demo's first run trains its embedded models on one thread
for about 160 s while a second core idles; a warm-up started beside it (start_background_warmup) fills the
cache meanwhile, so the demo's decoding loads its kernels instead of compiling them after the training.
Every kernel whose values a trace records gives the same bits cached or freshly compiled
(dpledger.mechanisms.fused says what that takes), so which process compiled it changes no recorded value.

The table lists each kernel's argument types as its call sites pass them (taken from a cache that the
whole suite filled: `python -m dpledger.mechanisms.warmup --table CACHE_DIR` prints it again). A stale
entry costs time, never a result: a kernel called with other types compiles on first use, as it always
did. A kernel renamed or removed fails here, naming it (tests/test_kernel_warmup.py checks the table).

Run: python -m dpledger.mechanisms.warmup [--processes N]
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dpledger.accounting.errors import EXIT_BAD_INPUT, OneLineErrorParser

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
    ("fused", "add_one_forward_round", "f1 i1 f1 f1 f1 f1 b2 f2 f2 f1 f1 f1 f1 f f f1"),
    ("fused", "add_one_lattice_allowances", "f1 b1 f1 f2 f2"),
    ("fused", "add_one_order_sums", "f1 f1 f1 f1 f f1 f1 f1 f1"),
    ("fused", "add_one_power_bases", "f1 f1 f1 f1 f1 f1 f1 f1"),
    ("fused", "add_one_shifts", "f1 f f1"),
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
    ("fused", "screen_statistics", "f3 f2 f2 f f f f f1"),
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


def argument_types(codes: str) -> tuple[Any, ...]:
    """The numba types a row of KERNELS names.

    Args:
        codes: the row's argument codes, e.g. "f2r i".

    Returns:
        The numba types, e.g. (read-only 2-d float64 array, int64).
    """
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
    """KERNELS' row indices split into lists of about equal compile time: the largest first, each to the
    least loaded list. (Processes saving into one cache at once are safe: numba's saves are serialised,
    dpledger.mechanisms.fastmath.serialise_cache_saves.)

    Args:
        processes: how many lists, >= 1.

    Returns:
        `processes` lists of row indices (some empty when there are more lists than rows).
    """
    loads = [0.0] * processes
    split: list[list[int]] = [[] for _ in range(processes)]
    order = sorted(range(len(KERNELS)), key=lambda row: -COMPILE_SECONDS.get(KERNELS[row][1], 1.0))
    for row in order:
        least = loads.index(min(loads))
        split[least].append(row)
        loads[least] += COMPILE_SECONDS.get(KERNELS[row][1], 1.0)
    return split


def compile_rows(rows: list[int]) -> None:
    """Compile (or load from the cache) the kernels of these KERNELS rows, in this process.

    Args:
        rows: indices into KERNELS.

    A row whose types the kernel no longer takes (its signature changed) is skipped with one line on
    stderr, naming it: that kernel compiles on first use, as without a warm-up, and the rows after it
    are still warmed (tests/test_kernel_warmup.py compiles every row, so the suite names a stale one).

    Raises:
        ValueError: if a row names no numba kernel (a kernel renamed or removed: update KERNELS).
    """
    from numba.core.errors import TypingError

    for row in rows:   # importing the kernels' modules sets the vector width, as in the suite (fastmath.py)
        module, name, codes = KERNELS[row]
        kernel = _kernel(row)
        if kernel is None or not hasattr(kernel, "compile"):
            raise ValueError(f"dpledger.mechanisms.{module}.{name} is not a numba kernel: update "
                             "dpledger.mechanisms.warmup.KERNELS")
        try:
            kernel.compile(argument_types(codes))
        except TypingError:
            print(f"kernel warm-up: row {row} ({module}.{name}, {codes!r}) does not type: skipped, update "
                  "dpledger.mechanisms.warmup.KERNELS", file=sys.stderr)


def warmed_marker(directory: str | Path) -> Path:
    """The file whose presence says that a warm-up finished in the kernel cache `directory` for this
    process's cache key: every row of KERNELS is there. Its name hashes what numba's cache keys on beyond
    the directory (the Python version, the kernels' source folder and their files' modification times and
    sizes, the CPU name and features the code is compiled for) and the table, so that another interpreter,
    checkout, touched source file, vector width or table warms again (a change to a kernel's source
    already starts a fresh directory).

    Args:
        directory: the kernel cache directory (dpledger.mechanisms.fastmath.kernel_cache_dir).

    Returns:
        The marker's path in it.
    """
    folder = Path(__file__).resolve().parent
    stamps = [(name, found.st_mtime, found.st_size) for name in sorted({f"{module}.py" for module, _, _ in KERNELS})
              for found in [os.stat(folder / name)]]
    key = repr((KERNELS, tuple(sys.version_info[:2]), str(folder), stamps, _cpu_key()))
    return Path(directory) / f"warmed-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _cpu_key() -> tuple[str, str, str]:
    """numba's cache key for this process's code: (target triple, CPU name, CPU features)."""
    from dpledger.mechanisms.fastmath import prefer_wide_vectors

    prefer_wide_vectors()   # before numba builds its CPU target (a no-op once decided)
    from numba.core.registry import cpu_target

    triple, name, features = cpu_target.target_context.codegen().magic_tuple()
    return str(triple), str(name), str(features)


def _mark_warm() -> None:
    from dpledger.mechanisms.fastmath import kernel_cache_dir

    directory = kernel_cache_dir()
    if directory is None:
        return
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        warmed_marker(directory).touch()
    except OSError:   # a cache folder this process cannot write (numba then caches elsewhere or not at all)
        pass


def audit_kernels_first(rows: list[int]) -> list[int]:
    """The rows in the order a background warm-up takes them: the parallel kernels first (the audit's
    ablation and Monte Carlo: a trace's values come from one-thread kernels, dpledger.mechanisms.fused),
    which a job that decodes and then audits needs last, so that its own process, compiling what the
    decoding needs as it needs it, and the warm-up work on different kernels; otherwise as given.

    Args:
        rows: indices into KERNELS.

    Returns:
        The same indices, reordered.
    """
    def parallel(row: int) -> bool:
        return bool(getattr(_kernel(row), "targetoptions", {}).get("parallel", False))

    return sorted(rows, key=lambda row: not parallel(row))


def _kernel(row: int) -> Any:
    """The object a KERNELS row names (its module imported), or None where the module has no such name."""
    module, name, _ = KERNELS[row]
    return getattr(importlib.import_module(f"dpledger.mechanisms.{module}"), name, None)


def _command(rows: list[int], background: bool) -> list[str]:
    """This module run on `rows`, with -P: a `dpledger/` folder in the working directory is never imported.
    A background one is told this process's id, to stop once this process is gone."""
    return [sys.executable, "-P", "-m", "dpledger.mechanisms.warmup",
            *(["--background", "--parent", str(os.getpid())] if background else []), "--rows", ",".join(map(str, rows))]


def warm_kernels(processes: int) -> tuple[int, float] | None:
    """Compile every kernel of KERNELS into the kernel cache, in `processes` processes side by side,
    and wait for them (what `make test` runs before its workers start).

    Args:
        processes: how many processes compile at once, >= 1 (at most one per row of KERNELS run).

    Returns:
        (the number of processes, seconds taken), or None when the kernel cache is off
        (DPLEDGER_NUMBA_CACHE=off): nothing to warm.

    Raises:
        RuntimeError: if a process failed (a row that names no kernel: its message says which).
    """
    from dpledger.mechanisms.fastmath import kernel_cache_dir

    if kernel_cache_dir() is None:
        return None
    started = time.perf_counter()
    children = [subprocess.Popen(_command(share, False))
                for share in shares(min(max(1, processes), len(KERNELS))) if share]   # no more processes than rows
    failed = [child.args for child in children if child.wait() != 0]
    if failed:
        raise RuntimeError(f"kernel warm-up failed: {failed}")
    return len(children), time.perf_counter() - started


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system says, else the machine's).

    Returns:
        The number of cores, >= 1.
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def start_background_warmup() -> list[subprocess.Popen[bytes]]:
    """Start filling the kernel cache in one background process at low priority (nice 10 where the system
    has it; its output discarded), and return at once: for a long job whose first kernel comes late, such
    as the demo's first run, which trains its models on one thread first. The process compiles every row
    of KERNELS, the audit's kernels first, for this process's CPU name and features (passed to it, so that
    its cache entries are the ones this process loads), loading any that are cached already, and stops
    between two kernels once this process has gone. This process loads what it finds in the cache when it
    first needs a kernel and compiles what it does not; both saving into the cache at once is safe
    (dpledger.mechanisms.fastmath.serialise_cache_saves). Which process compiled a kernel changes no value a trace records (those
    kernels give the same bits cached or fresh); the audit's parallel kernels may differ in their last
    bits, within their rounding allowance (dpledger.mechanisms.fused). Nothing starts with one usable core
    (it would slow this process down), with the cache off, where a finished warm-up marked the cache
    (warmed_marker), or where the process cannot be started.

    Returns:
        The started process in a list (finish_background_warmup takes it), or an empty list.
    """
    from dpledger.mechanisms.fastmath import kernel_cache_dir

    directory = kernel_cache_dir()
    if usable_cores() < 2 or directory is None or warmed_marker(directory).exists():
        return []
    _, name, features = _cpu_key()
    environment = {**os.environ, "NUMBA_CPU_NAME": name, "NUMBA_CPU_FEATURES": features}
    try:
        return [subprocess.Popen(_command(list(range(len(KERNELS))), True), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, env=environment)]
    except OSError:   # no process to spare: the kernels compile on first use, as without a warm-up
        return []


def finish_background_warmup(processes: list[subprocess.Popen[bytes]]) -> None:
    """Stop what start_background_warmup started, if it still runs: a kernel it has not reached compiles
    on first use, as without it (numba writes each cache file under a temporary name and renames it into
    place, and a saved signature's data before the index that names it: serialise_cache_saves).

    Args:
        processes: start_background_warmup's list.
    """
    for process in processes:
        if process.poll() is None:
            process.terminate()
        process.wait()


def print_table(cache: Path) -> None:
    """Print KERNELS' rows from a filled numba cache directory (numba's index files: pickled
    (stamp, {(signature, target, ...): file name})), for pasting above.

    Args:
        cache: the numba cache directory, filled by a run of the whole suite.

    Raises:
        ValueError: if `cache` is not a directory holding index files, or one of them cannot be read.
    """
    from numba import types

    letters = {"float64": "f", "int64": "i", "bool": "b"}
    indexes = sorted(cache.rglob("*.nbi")) if cache.is_dir() else []
    if not indexes:
        raise ValueError(f"--table must name a numba cache directory holding index files (*.nbi), got {cache}")
    for index in indexes:
        module, _, rest = index.name.partition(".")
        name = rest.rsplit("-", 1)[0]
        try:
            with index.open("rb") as handle:
                pickle.load(handle)                       # numba's version
                _, overloads = pickle.loads(handle.read())
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
            raise ValueError(f"{index} is not a numba cache index ({type(error).__name__})") from None
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


def _at_least_one(text: str) -> int:
    """argparse's reading of --processes: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def _rows(text: str) -> list[int]:
    """argparse's reading of --rows: comma-separated indices into KERNELS."""
    try:
        rows = [int(row) for row in text.split(",") if row]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text!r}") from None
    if not rows:
        raise argparse.ArgumentTypeError(f"must name at least one row, got {text!r}")
    outside = [row for row in rows if not 0 <= row < len(KERNELS)]
    if outside:
        raise argparse.ArgumentTypeError(f"rows must be in [0, {len(KERNELS)}), got {outside}")
    return rows


def main() -> None:
    """The command line: warm every kernel (--processes N), a child's share (--rows), or print the table.

    Raises:
        SystemExit: naming a row that names no kernel (exit code 1), or for bad arguments or a --table that
            is not a numba cache (one line, exit code 2).
    """
    parser = OneLineErrorParser(description="Compile the package's numba kernels into the kernel cache "
                                            "(dpledger.mechanisms.fastmath.kernel_cache_dir), split across processes.")
    parser.add_argument("--processes", type=_at_least_one, default=min(4, usable_cores()))
    parser.add_argument("--rows", type=_rows, help=argparse.SUPPRESS)   # a child's share: comma-separated row indices
    parser.add_argument("--background", action="store_true", help=argparse.SUPPRESS)   # at low priority
    parser.add_argument("--parent", type=int, help=argparse.SUPPRESS)   # the process it warms for
    parser.add_argument("--table", type=Path, help="print KERNELS from this filled numba cache directory")
    arguments = parser.parse_args()
    if arguments.background and arguments.rows is None:
        parser.error("argument --background: needs --rows (a background child's share)")
    if arguments.parent is not None and not arguments.background:
        parser.error("argument --parent: needs --background (only a background child stops with its parent)")
    if arguments.table is not None:
        try:
            print_table(arguments.table)
        except ValueError as error:
            parser.exit(EXIT_BAD_INPUT, f"{parser.prog}: error: {error}\n")
        return
    if arguments.rows is not None:
        rows = arguments.rows
        parent = os.getppid() if arguments.parent is None else arguments.parent
        if arguments.background:
            if hasattr(os, "nice"):
                os.nice(10)
            rows = audit_kernels_first(rows)
        try:
            for row in rows:
                if arguments.background and os.getppid() != parent:   # the job it warmed for has ended
                    return
                compile_rows([row])
        except ValueError as error:
            raise SystemExit(f"kernel warm-up: {error}") from None
        if sorted(rows) == list(range(len(KERNELS))):   # one process did them all (the background warm-up)
            _mark_warm()
        return
    from dpledger.mechanisms.fastmath import kernel_cache_dir

    try:
        warmed = warm_kernels(arguments.processes)
    except RuntimeError as error:
        raise SystemExit(str(error)) from None
    if warmed is None:
        print("kernel warm-up: the kernel cache is off (DPLEDGER_NUMBA_CACHE=off): nothing to warm")
        return
    _mark_warm()
    print(f"kernel warm-up: {len(KERNELS)} kernels compiled or loaded in {warmed[0]} processes into "
          f"{kernel_cache_dir()} in {warmed[1]:.0f} s")


if __name__ == "__main__":
    main()
