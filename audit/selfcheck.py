"""The auditor checks itself: planted faults, each of which a named check must flag.

Mechanism faults are runners that claim the correct parameters but misbehave; trace faults edit a
correct run's files the way a buggy accountant would have written them.
"""
from __future__ import annotations

import copy
import shutil
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from dpledger.accounting.conversion import epsilon_from_rdp
from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.decoding import trace
from dpledger.decoding.totals import ledger_summary
from dpledger.decoding.runners import Runner, adapmixed_runner, voting_mechanism, voting_runner
from dpledger.mechanisms.kernels import mixed_teachers, renyi_divergence_orders, sums_without_each
from dpledger.mechanisms.leave_one_out import leave_one_out_divergences
from dpledger.mechanisms.screening import NoisyScreening


@dataclass(frozen=True)
class Fault:
    """A planted fault: its `name`, what it does, the audit check that must catch it (`caught_by`)
    and whether it is planted on the mechanism or the finished trace (`kind`)."""

    name: str
    description: str
    caught_by: str
    kind: str  # "runner": a faulty mechanism; "trace": an edited trace


def _misreporting(real: Runner, edit: Callable) -> Callable:
    """A process that runs `real` and then edits its outcome the way a buggy implementation would."""
    def process(public, teachers, generator, orders):
        outcome = real.process(public, teachers, generator, orders)
        edit(outcome, public, teachers, orders)
        return outcome
    return process


def _noise_halved(params: dict) -> Callable:
    claimed = NoisyScreening(teachers=params["teachers"], lam=params["lam"], sigma=params["sigma"], alpha=params["alpha"])

    def edit(outcome, public, teachers, orders):
        outcome.charged["screen"] = np.broadcast_to(claimed.rdp_values(orders), outcome.charged["screen"].shape).copy()
    return _misreporting(adapmixed_runner(**{**params, "sigma": params["sigma"] / 2}), edit)


def _sensitivity_wrong(params: dict) -> Callable:
    def edit(outcome, public, teachers, orders):
        outcome.charged["screen"] = outcome.charged["screen"] / 4.0  # sensitivity lam/(sqrt(2) N) instead of lam sqrt(2)/N
    return _misreporting(adapmixed_runner(**params), edit)


def _one_direction(params: dict) -> Callable:
    def edit(outcome, public, teachers, orders):
        mixed = mixed_teachers(teachers, public, torch.from_numpy(outcome.lambdas))
        n = mixed.shape[-2]
        total = mixed.sum(-2, keepdim=True)
        backward = renyi_divergence_orders(torch.log(sums_without_each(mixed) / (n - 1)), torch.log(total / n),
                                           torch.from_numpy(orders)).max(dim=-2).values.numpy()
        outcome.charged["pmixed_data_dependent"] = np.where(outcome.screen_passed[:, None], backward, 0.0)
    return _misreporting(adapmixed_runner(**params), edit)


def _leaves_ball(params: dict) -> Callable:
    def edit(outcome, public, teachers, orders):
        lambdas = torch.clamp(torch.from_numpy(outcome.lambdas) * 2 + 0.1, max=1.0)
        mixed = mixed_teachers(teachers, public, lambdas)
        dd = leave_one_out_divergences(mixed, torch.from_numpy(orders)).max(dim=-2).values.numpy()
        passed = outcome.screen_passed
        outcome.lambdas, outcome.observed_data_dependent = lambdas.numpy(), dd
        outcome.output = torch.where(torch.from_numpy(passed).unsqueeze(-1), mixed.mean(dim=-2), public)
        outcome.charged["pmixed_data_dependent"] = np.where(passed[:, None], dd, 0.0)
    return _misreporting(adapmixed_runner(**params), edit)


RUNNER_FAULTS = {
    "noise_halved": (Fault("noise_halved", "screening noise sigma/2 used while sigma is claimed and charged",
                           "replay", "runner"), _noise_halved),
    "screening_sensitivity": (Fault("screening_sensitivity", "screening charged with a sensitivity off by a factor 2 "
                                    "(RDP / 4)", "screening_cost", "runner"), _sensitivity_wrong),
    # Which direction is larger depends on the data; here D(p || p_-i) usually is, so the planted bug
    # keeps the other one, the one that under-charges (a one-direction loss is only wrong when it does).
    "one_direction": (Fault("one_direction", "data-dependent loss computed as D(p_-i || p) only", "data_dependent_eq3",
                            "runner"), _one_direction),
    "leaves_ball": (Fault("leaves_ball", "mixing weights 2*lambda + 0.1: mixed teachers leave the Renyi ball",
                          "mixing_ball", "runner"), _leaves_ball),
}


def _seed_from_teacher(params: dict) -> Callable:
    """Shared voting randomness seeded from teacher 0's likeliest token (private data), while the
    public seed is recorded: the analysis's "public randomness" assumption is broken."""
    real = voting_runner(**params)

    def process(public, teachers, generator, orders):
        honest = generator.vote_seeds()
        leaky = copy.copy(generator)
        leaky.vote_seeds = lambda: [seed ^ int(teachers[row, 0].argmax()) for row, seed in enumerate(honest)]
        outcome = real.process(public, teachers, leaky, orders)
        outcome.vote_seeds = np.asarray(honest, dtype=np.int64)
        return outcome
    return process


def _gnmax_sensitivity(params: dict) -> Callable:
    def edit(outcome, public, teachers, orders):
        outcome.charged["gnmax"] = outcome.charged["gnmax"] / 2.0  # the sensitivity's square halved
    return _misreporting(voting_runner(**params), edit)


def _threshold_ignored(params: dict) -> Callable:
    return voting_runner(**{**params, "threshold": 1}).process  # TARGMAX_1: the plurality, whatever its count


def _screen_noise_halved(params: dict) -> Callable:
    claimed = voting_mechanism(params, params["teachers"], NeighbouringRelation.ADD_OR_REMOVE_ONE)
    real = voting_runner(**{**params, "sigma_threshold": params["sigma_threshold"] / 2})

    def process(public, teachers, generator, orders):
        outcome = real.process(public, teachers, generator, orders)
        if outcome.vote_counts is None or outcome.screen_passed is None:
            raise RuntimeError("a voting step records both")
        outcome.charged = claimed.charges(outcome.vote_counts, outcome.screen_passed, orders)
        return outcome
    return process


VOTING_FAULTS = {
    "shared_seed_from_teacher": (Fault("shared_seed_from_teacher", "coordinated votes seeded from a teacher's output "
                                       "while the public seed is recorded", "replay", "runner"), _seed_from_teacher),
    "gnmax_sensitivity": (Fault("gnmax_sensitivity", "DPARGMAX's answer charged at half its sensitivity's RDP (sqrt(2) "
                                "times too small a sensitivity: RDP / 2)", "voting_charges", "runner"),
                          _gnmax_sensitivity),
    "threshold_ignored": (Fault("threshold_ignored", "TARGMAX releases the plurality token even below T",
                                "vote_threshold", "runner"), _threshold_ignored),
    "screen_noise_halved": (Fault("screen_noise_halved", "DPARGMAX screens with s1/2 while s1 is claimed and charged",
                                  "replay", "runner"), _screen_noise_halved),
}
"""Faults of voting runs (each planted on a runner of its aggregator: see tests/test_voting_runs.py)."""


def faulty_runner(runner: Runner, fault: str) -> Runner:
    """The runner with a planted fault; it claims the same kind and parameters as `runner`.

    Args:
        runner: the correct runner the fault is planted on.
        fault: a name of RUNNER_FAULTS or VOTING_FAULTS.

    Returns:
        A copy of `runner` whose `process` is the faulty one.

    Raises:
        KeyError: if `fault` names no runner fault.
    """
    _, build = {**RUNNER_FAULTS, **VOTING_FAULTS}[fault]
    params = {**runner.params}
    return replace(runner, process=build(params))


def _rewrite_ledger(run_dir: Path, edit: Callable[[dict, list[dict], dict], None]) -> None:
    manifest = trace.read_manifest(run_dir)
    records = trace.read_records(run_dir)
    summary = trace.read_ledger(run_dir)
    edit(summary, records, manifest)
    trace.atomic_write_json(run_dir / trace.LEDGER, summary)


def _eps_summed(run_dir: Path) -> None:
    def edit(summary, records, manifest):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for entry in summary["epsilon"]:
                per_step = [epsilon_from_rdp(RdpCurve(manifest["orders"],
                                                      np.sum([r[f"rdp_{n}"] for n in manifest["mechanism"]["components"]], axis=0),
                                                      NeighbouringRelation(manifest["relation"])), entry["delta"]).epsilon
                            for r in records]
                entry["epsilon"] = float(np.sum(per_step))
    _rewrite_ledger(run_dir, edit)


def _wrong_conversion(run_dir: Path) -> None:
    def edit(summary, records, manifest):
        for entry in summary["epsilon"]:
            order = entry["order"] or 2.0
            entry["epsilon"] = entry["rdp_at_order"] - np.log(entry["delta"]) / order  # divides by a, not a - 1
    _rewrite_ledger(run_dir, edit)


def _step_dropped(run_dir: Path) -> None:
    def edit(summary, records, manifest):
        summary.clear()
        summary.update(ledger_summary(records[:len(records) // 2] + records[len(records) // 2 + 1:], manifest))
    _rewrite_ledger(run_dir, edit)


def _record_edited(run_dir: Path) -> None:
    path = trace.chunk_path(run_dir, 0)
    rows = pq.read_table(path).to_pylist()
    name = next(k for k in rows[0] if k.startswith("rdp_"))
    rows[1][name] = [v / 2 for v in rows[1][name]]
    pq.write_table(pa.Table.from_pylist(rows), path)


TRACE_FAULTS = {
    "eps_summed": (Fault("eps_summed", "epsilon reported as the sum of per-step epsilons instead of composing RDP",
                         "conversion", "trace"), _eps_summed),
    "wrong_conversion": (Fault("wrong_conversion", "RDP->DP conversion with log(1/delta)/a instead of the improved "
                               "formula", "conversion", "trace"), _wrong_conversion),
    "step_dropped": (Fault("step_dropped", "one step left out of ledger.json", "ledger_recompute", "trace"),
                     _step_dropped),
    "record_edited": (Fault("record_edited", "a committed record's charge halved after the fact", "hash_chain",
                            "trace"), _record_edited),
}

FAULTS = {name: fault for name, (fault, _) in {**RUNNER_FAULTS, **VOTING_FAULTS, **TRACE_FAULTS}.items()}


def plant_trace_fault(source: Path, target: Path, fault: str) -> Path:
    """Copy a correct run to `target` and plant a trace fault there.

    Args:
        source: the correct run's directory (left unchanged).
        target: where the copy goes (must not exist); its audit.json, if copied, is removed.
        fault: a name of TRACE_FAULTS.

    Returns:
        `target`.

    Raises:
        KeyError: if `fault` names no trace fault.
        FileExistsError: if `target` exists.
    """
    shutil.copytree(source, target)
    for stale in (target / "audit.json",):
        stale.unlink(missing_ok=True)
    TRACE_FAULTS[fault][1](target)
    return target
