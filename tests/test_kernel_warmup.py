"""dpledger.mechanisms.warmup's table: every kernel the package's kernel modules define is in it, each row names a
kernel with as many argument types as it takes, and the types read back as numba's."""
import importlib
import inspect

import pytest
from numba.core.registry import CPUDispatcher

from dpledger.mechanisms.warmup import KERNELS, argument_types, shares


def _kernels(module: str) -> set[str]:
    """The kernels a module defines that are called as themselves (helpers inlined into them are not)."""
    namespace = importlib.import_module(f"dpledger.mechanisms.{module}")
    return {name for name, value in vars(namespace).items()
            if isinstance(value, CPUDispatcher) and value.targetoptions.get("inline", "never") == "never"
            and value.__module__ == namespace.__name__}


@pytest.mark.parametrize("module", ["fused", "add_one"])
def test_every_kernel_is_warmed(module):
    listed = {name for listed_module, name, _ in KERNELS if listed_module == module}
    missing = _kernels(module) - listed
    assert not missing, f"add these kernels of dpledger.mechanisms.{module} to dpledger.mechanisms.warmup.KERNELS: {sorted(missing)}"


@pytest.mark.parametrize("module, name, codes", KERNELS)
def test_each_row_names_a_kernel_and_its_arity(module, name, codes):
    kernel = getattr(importlib.import_module(f"dpledger.mechanisms.{module}"), name)
    assert isinstance(kernel, CPUDispatcher)
    assert len(argument_types(codes)) == len(inspect.signature(kernel.py_func).parameters)


def test_argument_types_read_as_numba_types():
    from numba import types

    assert argument_types("f i b f2r b1") == (types.float64, types.int64, types.boolean,
                                              types.Array(types.float64, 2, "C", readonly=True),
                                              types.Array(types.boolean, 1, "C"))


@pytest.mark.parametrize("processes", [1, 2, 3, 60])
def test_the_split_covers_each_row_once(processes):
    split = shares(processes)
    assert len(split) == processes
    assert sorted(row for share in split for row in share) == list(range(len(KERNELS)))


def test_no_background_warmup_with_one_core_the_cache_off_or_a_finished_warmup(monkeypatch, tmp_path):
    from dpledger.mechanisms import warmup

    def started() -> list:
        processes = warmup.start_background_warmup()
        warmup.finish_background_warmup(processes)   # (a wrong start stops here, not after the test)
        return processes

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(warmup, "usable_cores", lambda: 1)
    assert started() == []
    monkeypatch.setattr(warmup, "usable_cores", lambda: 2)
    warmup.warmed_marker(tmp_path).touch()
    assert started() == []
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    monkeypatch.setenv("DPLEDGER_NUMBA_CACHE", "off")
    assert started() == []


def test_a_background_warmup_starts_quietly_for_this_processes_cpu_key(monkeypatch, tmp_path):
    import os
    import subprocess

    from dpledger.mechanisms import warmup

    calls = []

    class Recorded:
        def __init__(self, command, **options):
            calls.append((command, options))

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(warmup, "usable_cores", lambda: 2)
    monkeypatch.setattr(warmup.subprocess, "Popen", Recorded)
    assert len(warmup.start_background_warmup()) == 1
    (command, options), = calls
    assert command[1:5] == ["-P", "-m", "dpledger.mechanisms.warmup", "--background"]   # -P: never the cwd's dpledger/
    assert command[5:7] == ["--parent", str(os.getpid())]
    assert [int(row) for row in command[command.index("--rows") + 1].split(",")] == list(range(len(KERNELS)))
    assert options["stdout"] is subprocess.DEVNULL and options["stderr"] is subprocess.DEVNULL
    _, name, features = warmup._cpu_key()
    assert options["env"]["NUMBA_CPU_NAME"] == name and options["env"]["NUMBA_CPU_FEATURES"] == features

    def refused(command, **options):
        raise OSError("no process to spare")

    monkeypatch.setattr(warmup.subprocess, "Popen", refused)
    assert warmup.start_background_warmup() == []


def test_the_marker_is_named_by_the_table_the_interpreter_the_sources_and_the_cpu_key(monkeypatch, tmp_path):
    import os
    import sys

    from dpledger.mechanisms import warmup

    before = warmup.warmed_marker(tmp_path)
    assert before.parent == tmp_path and warmup.warmed_marker(tmp_path) == before
    monkeypatch.setattr(warmup, "KERNELS", KERNELS[:-1])
    assert warmup.warmed_marker(tmp_path) != before
    monkeypatch.setattr(warmup, "KERNELS", KERNELS)
    monkeypatch.setattr(warmup, "_cpu_key", lambda: ("x86_64-unknown-linux-gnu", "another", "+avx2"))
    assert warmup.warmed_marker(tmp_path) != before
    monkeypatch.undo()
    monkeypatch.setattr(sys, "version_info", (3, 99, 0))
    assert warmup.warmed_marker(tmp_path) != before
    monkeypatch.undo()
    real_stat = os.stat

    def touched(path, *arguments, **options):   # a kernel's source file rewritten with the same content
        found = real_stat(path, *arguments, **options)
        if str(path).endswith("fused.py"):
            return os.stat_result((*found[:8], found.st_mtime + 1.0, found[9]))
        return found

    monkeypatch.setattr(warmup.os, "stat", touched)
    assert warmup.warmed_marker(tmp_path) != before


def test_a_kernel_the_background_warmed_is_a_cache_hit_in_a_fresh_process(tmp_path):
    """The child compiles for the parent's CPU key; a process like the CLI then loads it, not compiles it."""
    import os
    import subprocess
    import sys

    from dpledger.mechanisms import warmup

    cache = tmp_path / "cache"
    row = next(index for index, (_, name, _) in enumerate(KERNELS) if name == "_ball_certified")
    _, name, features = warmup._cpu_key()
    environment = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "NUMBA_CPU_NAME": name, "NUMBA_CPU_FEATURES": features}
    done = subprocess.run([sys.executable, "-P", "-m", "dpledger.mechanisms.warmup", "--background", "--rows", str(row)],
                          env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not warmup.warmed_marker(cache).exists()   # one row of many: no finished warm-up to mark
    probe = ("from dpledger.mechanisms import add_one; add_one._ball_certified(18.0, 3.6, 2.0); "
             "print(sum(add_one._ball_certified.stats.cache_hits.values()), "
             "sum(add_one._ball_certified.stats.cache_misses.values()))")
    environment = {key: value for key, value in environment.items() if not key.startswith("NUMBA_CPU")}
    loaded = subprocess.run([sys.executable, "-P", "-c", probe], env=environment, capture_output=True, text=True,
                            timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["1", "0"], loaded.stdout


def test_a_child_given_every_row_marks_the_cache_and_one_that_fails_does_not(monkeypatch, tmp_path):
    import sys

    from dpledger.mechanisms import warmup

    compiled = []
    every = list(range(len(KERNELS)))
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(warmup, "compile_rows", compiled.extend)
    monkeypatch.setattr(sys, "argv", ["warmup", "--rows", ",".join(map(str, every[:-1]))])
    warmup.main()
    assert not warmup.warmed_marker(tmp_path).exists()

    def failing(rows):
        raise ValueError("dpledger.mechanisms.fused.gone is not a numba kernel")

    monkeypatch.setattr(warmup, "compile_rows", failing)
    monkeypatch.setattr(sys, "argv", ["warmup", "--rows", ",".join(map(str, every))])
    with pytest.raises(SystemExit):
        warmup.main()
    assert not warmup.warmed_marker(tmp_path).exists()
    monkeypatch.setattr(warmup, "compile_rows", compiled.extend)
    warmup.main()
    assert warmup.warmed_marker(tmp_path).exists()
    assert compiled == every[:-1] + every


def test_a_background_child_whose_parent_is_gone_compiles_nothing(tmp_path):
    import os
    import subprocess
    import sys

    cache = tmp_path / "cache"
    row = next(index for index, (_, name, _) in enumerate(KERNELS) if name == "_ball_certified")
    not_its_parent = os.getpid() + 1_000_000   # (its real parent is this process)
    done = subprocess.run([sys.executable, "-P", "-m", "dpledger.mechanisms.warmup", "--background", "--parent",
                           str(not_its_parent), "--rows", str(row)], env={**os.environ, "NUMBA_CACHE_DIR": str(cache)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not list(cache.rglob("*.nbi"))


def test_finishing_stops_a_warmup_that_still_runs():
    import subprocess
    import sys
    import time

    from dpledger.mechanisms.warmup import finish_background_warmup

    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    started = time.perf_counter()
    finish_background_warmup([running])
    assert running.poll() is not None and time.perf_counter() - started < 30


def test_the_demo_checks_its_arguments_before_it_starts_a_warmup(monkeypatch):
    from dpledger import demo
    from dpledger.mechanisms import warmup

    started = []
    monkeypatch.setattr(warmup, "start_background_warmup", lambda: started.append(1) or [])
    with pytest.raises(ValueError):
        demo.run_demo("unused", 0, 2, progress=False)
    assert started == []


def test_the_demo_stops_its_warmup_when_it_fails(monkeypatch):
    from dpledger import demo
    from dpledger.mechanisms import warmup

    finished = []
    started = [object()]
    monkeypatch.setattr(warmup, "start_background_warmup", lambda: started)
    monkeypatch.setattr(warmup, "finish_background_warmup", finished.append)
    monkeypatch.setattr(demo, "demo_methods", lambda queries, teachers: {})

    def failing(*arguments):
        raise RuntimeError("a run failed")

    monkeypatch.setattr(demo, "_demo_runs", failing)
    with pytest.raises(RuntimeError, match="a run failed"):
        demo.run_demo("unused", 4, 2, progress=False)
    assert finished == [started]


def test_a_row_that_names_no_kernel_fails_in_one_line(monkeypatch, capsys):
    import sys

    from dpledger.mechanisms import warmup

    monkeypatch.setattr(warmup, "KERNELS", (("fused", "no_such_kernel", "f"),))
    with pytest.raises(ValueError, match="no_such_kernel is not a numba kernel"):
        warmup.compile_rows([0])
    monkeypatch.setattr(sys, "argv", ["warmup", "--rows", "0"])
    with pytest.raises(SystemExit, match="^kernel warm-up: dpledger.mechanisms.fused.no_such_kernel is not a numba "
                                         "kernel: update dpledger.mechanisms.warmup.KERNELS$"):
        warmup.main()


def test_a_background_warmup_takes_the_audits_parallel_kernels_first():
    from dpledger.mechanisms.warmup import audit_kernels_first

    rows = shares(1)[0]
    ordered = audit_kernels_first(rows)
    assert sorted(ordered) == sorted(rows)
    names = [KERNELS[row][1] for row in ordered]
    parallel = {"leave_one_out_direction_power_moments", "screen_pass_counts", "leave_one_out_log_ratios_parallel",
                "renyi_log_moments_parallel", "has_positive_below_parallel"}
    assert set(names[:len(parallel)]) == parallel


@pytest.mark.parametrize("arguments", [["--rows", "x"], ["--rows", "0,999"], ["--rows", "-1"], ["--processes", "0"],
                                       ["--processes", "two"]])
def test_bad_arguments_exit_2_with_one_line_naming_the_value(monkeypatch, capsys, arguments):
    import sys

    from dpledger.mechanisms import warmup

    monkeypatch.setattr(sys, "argv", ["warmup", *arguments])
    with pytest.raises(SystemExit) as stopped:
        warmup.main()
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("warmup: error: argument ") and arguments[1].split(",")[-1] in error


def test_every_row_types_as_its_kernel_takes_it():
    """A row whose types went stale is skipped by the warm-up with one line (compile_rows): here it fails,
    naming the row. The kernels load from the cache `make test` warmed first."""
    from numba.core.errors import TypingError

    stale = []
    for row, (module, name, codes) in enumerate(KERNELS):
        try:
            getattr(importlib.import_module(f"dpledger.mechanisms.{module}"), name).compile(argument_types(codes))
        except TypingError:
            stale.append(f"{row}: {module}.{name} {codes!r}")
    assert not stale, f"KERNELS rows that no longer type: {stale}"


def test_a_row_that_no_longer_types_is_skipped_in_one_line_and_the_rest_are_warmed(monkeypatch, capsys):
    from dpledger.mechanisms import warmup

    good = next(row for row in KERNELS if row[1] == "_public_for_bounds")
    monkeypatch.setattr(warmup, "KERNELS", (("add_one", "_ball_certified", "f1 f f"), good))
    warmup.compile_rows([0, 1])
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["kernel warm-up: row 0 (add_one._ball_certified, 'f1 f f') does not type: skipped, update "
                     "dpledger.mechanisms.warmup.KERNELS"]
    assert warmup.KERNELS[1][1] == "_public_for_bounds"


@pytest.mark.parametrize("arguments, message", [
    (["--rows", ","], "argument --rows: must name at least one row"),
    (["--background"], "argument --background: needs --rows"),
    (["--parent", "3"], "argument --parent: needs --background"),
    (["--table", "/nonexistent-cache"], "--table must name a numba cache directory holding index files"),
])
def test_arguments_that_do_nothing_exit_2_in_exactly_one_line(monkeypatch, capsys, arguments, message):
    import sys

    from dpledger.mechanisms import warmup

    monkeypatch.setattr(sys, "argv", ["warmup", *arguments])
    with pytest.raises(SystemExit) as stopped:
        warmup.main()
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"warmup: error: {message}")


def test_a_corrupt_index_in_the_table_exits_2_in_one_line(monkeypatch, capsys, tmp_path):
    import sys

    from dpledger.mechanisms import warmup

    (tmp_path / "fused.kernel-12.py311.nbi").write_bytes(b"not a pickle")
    monkeypatch.setattr(sys, "argv", ["warmup", "--table", str(tmp_path)])
    with pytest.raises(SystemExit) as stopped:
        warmup.main()
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "is not a numba cache index (UnpicklingError)" in error[0]


def test_no_more_warm_up_processes_than_rows(monkeypatch, tmp_path):
    from dpledger.mechanisms import fastmath, warmup

    asked = []
    monkeypatch.setattr(fastmath, "kernel_cache_dir", lambda: tmp_path)
    monkeypatch.setattr(warmup, "shares", lambda processes: asked.append(processes) or [])
    assert warmup.warm_kernels(10 ** 11)[0] == 0
    assert asked == [len(KERNELS)]
