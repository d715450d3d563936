"""numba's on-disk kernel cache (dpledger.mechanisms.fastmath.configure_kernel_cache) and the audit's
derived rounding allowance (dpledger.mechanisms.leave_one_out.leave_one_out_allowance): a process that
loads cached kernels records what a freshly compiling one does, within that allowance, and an honest
remove-one AdaPMixED run passes the audit's Eq. 3 check."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpledger.mechanisms.fastmath import kernel_cache_dir
from dpledger.mechanisms.leave_one_out import leave_one_out_allowance, leave_one_out_curve

ROOT = Path(__file__).resolve().parent.parent

VOCAB, TEACHERS = 4096, 64
"""Large enough that a kernel whose helpers were linked rather than inlined gave cached and fresh
lambdas apart (the history-dependent binding described in dpledger.mechanisms.fused)."""

_STEP = """
import json, sys
import numpy as np
sys.path.insert(0, {benchmarks!r})
from bench_step import synthetic_ensemble
from dpledger.mechanisms.adapmixed import AdaPMixED
from dpledger.accounting.orders import DEFAULT_ORDERS
import torch
probs, public = synthetic_ensemble({vocab}, {teachers}, seed=3)
result = AdaPMixED.paper_defaults({teachers}).step(probs, public, torch.Generator().manual_seed(0),
                                                   np.asarray(DEFAULT_ORDERS))
print(json.dumps({{"lambdas": result.lambdas.numpy().tolist(), "eq3": result.details["eq3_remove_one"].tolist(),
                  "added": result.add_one_bound.tolist(), "exact": result.exact_orders.tolist(),
                  "screen": result.screen_statistic.tolist()}}))
"""


def _step_in_subprocess(cache: str, **environment: str) -> dict:
    env = {**os.environ, "DPLEDGER_NUMBA_CACHE": cache, "OMP_NUM_THREADS": "1", **environment}
    env.pop("NUMBA_CACHE_DIR", None)
    script = _STEP.format(benchmarks=str(ROOT / "benchmarks"), vocab=VOCAB, teachers=TEACHERS)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _host_features() -> str:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    return str(llvm.get_host_cpu_features().flatten())


@pytest.mark.slow   # four interpreters, three compiling every kernel (60 s): make test-slow
def test_cached_and_fresh_kernels_record_the_same_step(tmp_path):
    """Processes that compile into an empty cache, load that cache, or run with the cache off record
    the same step bit for bit (lambdas, Eq. 3, the add-one bound). One compiled for 256-bit vectors
    sums in another order: its values stay within the replay's 1e-9 on lambdas and twice the derived
    allowance on Eq. 3 (leave_one_out_allowance)."""
    cache = str(tmp_path / "numba-cache")
    fresh = _step_in_subprocess(cache)
    assert any(Path(cache).rglob("*.nbi")), "the first process wrote no numba cache index"
    for other in (_step_in_subprocess(cache), _step_in_subprocess("off")):
        assert other == fresh
    narrow = _step_in_subprocess(cache, NUMBA_CPU_FEATURES=_host_features() + ",+prefer-256-bit")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_step import synthetic_ensemble

    from dpledger.accounting.orders import DEFAULT_ORDERS

    probs, public = synthetic_ensemble(VOCAB, TEACHERS, seed=3)
    allowance = leave_one_out_allowance(torch.from_numpy(probs), torch.from_numpy(public),
                                        torch.tensor(fresh["lambdas"], dtype=torch.float64),
                                        np.asarray(DEFAULT_ORDERS), np.asarray(fresh["eq3"]))
    assert np.max(np.abs(np.subtract(narrow["lambdas"], fresh["lambdas"]))) <= 1e-9
    assert narrow["exact"] == fresh["exact"]
    assert np.all(np.abs(np.subtract(narrow["eq3"], fresh["eq3"])) <= 2.0 * allowance)


AUDIT_ONLY_PARALLEL = {"leave_one_out_direction_power_moments", "screen_pass_counts", "leave_one_out_log_ratios_parallel",
                       "renyi_log_moments_parallel", "has_positive_below_parallel"}
"""The kernels that may run parallel: the audit's ablation and Monte Carlo, whose values are compared
within the kernels' allowance and never recorded in a trace."""


def _kernels() -> dict:
    import inspect

    from numba.core.registry import CPUDispatcher

    from dpledger.mechanisms import add_one, fastmath, fused
    found = {}
    for module in (fastmath, fused, add_one):
        for name, value in vars(module).items():
            if isinstance(value, CPUDispatcher) and inspect.getmodule(value.py_func) is module:
                found[name] = value
    return found


def test_no_trace_kernel_runs_parallel_or_links_another_fast_kernel():
    """What makes cached and fresh code agree bit for bit (dpledger.mechanisms.fused), checked on the
    kernels themselves, since the subprocess test above is slow: numba optimises a parallel kernel again
    when it loads it from the cache, and a fastmath kernel called (not inlined) from compiled code is
    linked and optimised again in its caller. Either gave Eq. 3 moments 4e-16 apart between a run and
    its resumption under a cold cache."""
    import inspect
    import re

    kernels = _kernels()
    fast = {name for name, kernel in kernels.items()
            if kernel.targetoptions.get("fastmath") and kernel.targetoptions.get("inline") != "always"}
    assert {"leave_one_out_log_moments", "leave_one_out_log_ratios", "renyi_log_moments"} <= fast
    parallel = {name for name, kernel in kernels.items() if kernel.targetoptions.get("parallel")}
    assert parallel <= AUDIT_ONLY_PARALLEL, parallel - AUDIT_ONLY_PARALLEL
    for name, kernel in kernels.items():
        body = inspect.getsource(kernel.py_func).split(":\n", 1)[1]
        linked = {callee for callee in fast - {name} if re.search(rf"\b{callee}\(", body)}
        assert not linked, f"{name} calls the fastmath kernels {linked} from compiled code"
    # what compiled code may call without inlining keeps IEEE semantics, so a re-optimised copy has its bits
    for name in ("vexp", "_chords_and_floor", "convex_sandwich"):
        assert not kernels[name].targetoptions.get("fastmath"), name


def test_kernel_cache_dir_honours_the_settings(monkeypatch, tmp_path):
    """A NUMBA_CACHE_DIR the user set is used as it is; "off" turns caching off; otherwise the
    directory is named by numba's version and the kernel sources' hash, under the chosen base."""
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("DPLEDGER_NUMBA_CACHE", "off")
    assert kernel_cache_dir() is None
    monkeypatch.setenv("DPLEDGER_NUMBA_CACHE", str(tmp_path))
    chosen = kernel_cache_dir()
    assert chosen is not None and Path(chosen).parent == tmp_path and Path(chosen).name.startswith("numba-")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    assert kernel_cache_dir() == str(tmp_path / "mine")


def test_allowance_bounds_the_gap_between_two_summation_orders(rng):
    """The derived allowance covers the exact Eq. 3 (mpmath would agree to far more digits: the
    curve's values at these sizes are ~1e-3) and is far below the values it pads, so a forged charge
    a relative 1e-6 below Eq. 3 still falls below the audit's floor."""
    teachers = torch.from_numpy(rng.dirichlet(np.ones(64), size=(2, 4)))
    public = torch.from_numpy(rng.dirichlet(np.ones(64), size=2))
    lambdas = torch.full((2, 4), 0.3, dtype=torch.float64)
    orders = np.array([1.01, 1.1, 2.0, 18.0])
    values, exact, _ = leave_one_out_curve(teachers, public, lambdas, orders, relative_tolerance=None)
    allowance = leave_one_out_allowance(teachers, public, lambdas, orders, values)
    assert exact.all() and np.all(allowance > 0.0)
    assert np.all(values * (1.0 - 1e-6) < values - 2.0 * allowance)
    with pytest.raises(ValueError, match="orders must be > 1"):
        leave_one_out_allowance(teachers, public, lambdas, np.array([1.0]), values[:, :1])
    with pytest.raises(ValueError, match="at least one order, got none"):
        leave_one_out_curve(teachers, public, lambdas, np.array([]))


def test_remove_one_adapmixed_run_passes_the_eq3_and_replay_checks(micro_models, tmp_path):
    """Regression: an AdaPMixED run claiming remove-one FAILed data_dependent_eq3 (first seen on the
    embedded default), the audit recomputing Eq. 3 from the softmax's rows where the decode loop charged
    it on their renormalised copies (values ~1e-9 apart by ~1e-14, beyond the old relative 1e-9). Its
    screening off so that every step is charged Eq. 3; the session's micro models, so that no test
    trains the embedded default."""
    from dpledger.audit.bounds import check_data_dependent_charge
    from dpledger.audit.checks import Status
    from dpledger.audit.loader import load_trace
    from dpledger.audit.replay import check_replay
    from dpledger.decoding.config import config_from_dict
    from dpledger.decoding.run import run_decode
    from tests.micro import micro_config

    mechanism = {"type": "adapmixed", "alpha": 18.0, "beta": 0.2, "lam": 1e-4, "sigma": 1e-2, "threshold": 4.5,
                 "top_k": 60, "screening": False}
    config = config_from_dict(micro_config(micro_models, tmp_path / "remove-one", mechanism, queries=32,
                                           relation="remove_one"))
    directory = run_decode(config, progress=False, verbose=False).directory
    trace = load_trace(directory)
    eq3 = check_data_dependent_charge(trace)
    replay = check_replay(trace)
    assert eq3.status is Status.PASS, eq3.to_dict()
    assert replay.status is Status.PASS, replay.to_dict()
    # a charge a relative 1e-6 below at every order: far above the allowance at the high orders
    from tests.forging import copy, first_record, forge

    def lower(record):
        record["rdp_pmixed_data_dependent"] = [v * (1.0 - 1e-6) for v in record["rdp_pmixed_data_dependent"]]

    forged = copy(directory, tmp_path / "forged")
    forge(forged, edit_record=first_record(lower))
    forged_trace = load_trace(forged)
    assert check_data_dependent_charge(forged_trace).status is Status.FAIL
    assert check_replay(forged_trace).status is Status.FAIL


def test_kernels_compile_uncached_where_no_cache_directory_can_be_written(tmp_path):
    """A read-only installation (site-packages and home not writable; simulated with files where
    numba's cache directories would go, since the tests may run as root): numba finds no cache
    directory, and `jit(cache=True)` compiles in memory instead of failing at import."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    package = tmp_path / "package"
    package.mkdir()
    (package / "__pycache__").write_text("")   # numba's in-tree cache cannot be created beside the source
    (package / "kernel.py").write_text("from dpledger.mechanisms.fastmath import jit\n\n\n@jit(cache=True)\n"
                                       "def plus_one(x: float) -> float:\n    return x + 1.0\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(blocker / "numba"), "XDG_CACHE_HOME": str(blocker / "home"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", "import kernel; print(kernel.plus_one(1.0))"], cwd=package, env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "2.0"
