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

_STEP = """
import json, sys
import numpy as np
sys.path.insert(0, {benchmarks!r})
from bench_step import synthetic_ensemble
from dpledger.mechanisms.adapmixed import AdaPMixED
from dpledger.accounting.orders import DEFAULT_ORDERS
import torch
probs, public = synthetic_ensemble(1024, 8, seed=3)
result = AdaPMixED.paper_defaults(8).step(probs, public, torch.Generator().manual_seed(0), np.asarray(DEFAULT_ORDERS))
print(json.dumps({{"lambdas": result.lambdas.numpy().tolist(), "eq3": result.details["eq3_remove_one"].tolist(),
                  "exact": result.exact_orders.tolist()}}))
"""


def _step_in_subprocess(cache: str) -> dict:
    env = {**os.environ, "DPLEDGER_NUMBA_CACHE": cache, "OMP_NUM_THREADS": "1"}
    env.pop("NUMBA_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", _STEP.format(benchmarks=str(ROOT / "benchmarks"))], env=env,
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cached_and_fresh_kernels_record_the_same_step_within_the_allowance(tmp_path):
    """Three processes: one compiling into an empty cache, one loading that cache, one with the cache
    off: their lambdas agree within the replay's 1e-9 and their Eq. 3 values within twice the
    derived allowance (in practice bit for bit at this size)."""
    cache = str(tmp_path / "numba-cache")
    fresh = _step_in_subprocess(cache)
    assert any(Path(cache).rglob("*.nbi")), "the first process wrote no numba cache index"
    warm = _step_in_subprocess(cache)
    uncached = _step_in_subprocess("off")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_step import synthetic_ensemble

    probs, public = synthetic_ensemble(1024, 8, seed=3)
    from dpledger.accounting.orders import DEFAULT_ORDERS

    orders = np.asarray(DEFAULT_ORDERS)
    lambdas = torch.tensor(fresh["lambdas"], dtype=torch.float64)
    allowance = leave_one_out_allowance(torch.from_numpy(probs), torch.from_numpy(public), lambdas, orders,
                                        np.asarray(fresh["eq3"]))
    for other in (warm, uncached):
        assert np.max(np.abs(np.subtract(other["lambdas"], fresh["lambdas"]))) <= 1e-9
        assert other["exact"] == fresh["exact"]
        assert np.all(np.abs(np.subtract(other["eq3"], fresh["eq3"])) <= 2.0 * allowance)


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


def test_remove_one_adapmixed_run_passes_the_eq3_and_replay_checks(tmp_path):
    """Regression: an AdaPMixED run on the embedded default claiming remove-one FAILed
    data_dependent_eq3, the audit recomputing Eq. 3 from the softmax's rows where the decode loop
    charged it on their renormalised copies (values ~1e-9 apart by ~1e-14, beyond the old relative
    1e-9). Its screening off so that every step is charged Eq. 3."""
    from dpledger.audit.bounds import check_data_dependent_charge
    from dpledger.audit.checks import Status
    from dpledger.audit.loader import load_trace
    from dpledger.audit.replay import check_replay
    from dpledger.decoding.config import config_from_dict
    from dpledger.decoding.run import run_decode

    config = config_from_dict({
        "run": {"out": str(tmp_path / "remove-one"), "queries": 32, "relation": "remove_one"},
        "mechanism": {"type": "adapmixed", "alpha": 18.0, "beta": 0.2, "lam": 1e-4, "sigma": 1e-2, "threshold": 4.5,
                      "top_k": 60, "screening": False},
        "models": {"embedded": True, "teachers": 8},
    })
    directory = run_decode(config, progress=False, verbose=False).directory
    trace = load_trace(directory)
    eq3 = check_data_dependent_charge(trace)
    replay = check_replay(trace)
    assert eq3.status is Status.PASS, eq3.to_dict()
    assert replay.status is Status.PASS, replay.to_dict()
