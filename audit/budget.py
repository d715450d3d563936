"""The privacy filter of a run with a [budget] (dpledger.decoding.budget): its plan and every decision."""
from __future__ import annotations

import math

import numpy as np

from dpledger.accounting.summation import ExactSum
from dpledger.audit.checks import CheckResult, skipped, verdict
from dpledger.audit.loader import LoadedTrace


def check_budget_filter(trace: LoadedTrace) -> CheckResult:
    """The filter's plan is the one its config gives (order, RDP budget, step bound), and along
    the records in step order (Feldman & Zrnic 2021, Theorem 3.1): an answered step's filter charge
    is the step bound (or, with data_dependent, its charges' total at the order), covers what the
    step was actually charged there, and keeps the running sum within the budget; a refused step is
    answered by the public model, charged nothing, and (data-independent filter) would not have
    fitted. A realised-path filter charges the screen's bound, plus the answer's where the screen
    passed, and decides on the step's largest charge. Whether the mechanism's output was replaced is the replay's to check.

    Args:
        trace: the loaded run; its records are read block by block.

    Returns:
        The "budget_filter" CheckResult: SKIPPED without a [budget]; FAIL naming the first problems
        (at most 50 kept in the evidence) where a decision or charge breaks the rule; PASS otherwise,
        with the steps answered and refused and the exact sum spent (rounded up).
    """
    gate = trace.budget_gate()
    if gate is None:
        return skipped("budget_filter", "the run has no [budget]")
    recorded = trace.manifest.get("budget") or {}
    planned = gate.manifest_entry()
    problems = [f"manifest budget.{key} is {recorded.get(key)!r}, its config gives {value!r}"
                for key, value in planned.items() if recorded.get(key) != value]
    k, bound, budget = gate.order_index, gate.step_bound, gate.filter.rdp_budget
    spent, answered, refused, first_refused = ExactSum(), 0, 0, None  # exact, as the filter keeps it
    for record in trace.iter_records():
        where = f"step {record['step']}"
        # what the filter's bound must cover: the charges, a data-dependent one by its step's data-independent
        # bound where the record has one (Theorem 3.1; the data-dependent measurement may exceed it) -- unless the
        # data-dependent charges drive the filter
        realised = gate.realised_path is not None
        # (realised-path: a failed screen's answer is charged nothing, whatever it would have cost)
        charges = np.asarray([record["data_independent"][k] if dependent and record["data_independent"]
                              and not gate.data_dependent and not (realised and not record["screen_passed"])
                              else record[f"rdp_{name}"][k]
                              for name, dependent in trace.components.items()], dtype=np.float64)
        actual = float(charges.sum())
        if record["budget_refused"]:
            refused += 1
            first_refused = record["step"] if first_refused is None else first_refused
            if record["answered_by"] != "public" or record["budget_charge"] != 0.0 or np.any(
                    [np.any(np.asarray(record[f"rdp_{name}"]) != 0) for name in trace.components]):
                problems.append(f"{where}: refused by the filter but not answered publicly at no charge")
            if not gate.data_dependent and spent.at_most(budget, plus=bound):
                problems.append(f"{where}: refused although the step bound {bound:.6g} still fitted "
                                f"({spent.upper():.6g} of {budget:.6g} spent)")
            continue
        answered += 1
        expected = (actual if gate.data_dependent else gate.realised_path_charge(bool(record["screen_passed"]))
                    if realised else bound)
        if not math.isclose(record["budget_charge"], expected, rel_tol=1e-12, abs_tol=0.0):
            problems.append(f"{where}: filter charge {record['budget_charge']:.6g}, expected {expected:.6g}")
        if not actual <= record["budget_charge"] * (1 + 1e-12):
            problems.append(f"{where}: charged {actual:.6g} at order {gate.filter.order:g}, more than the filter's "
                            f"{record['budget_charge']:.6g}")
        spent.add(record["budget_charge"])
        if not spent.at_most(budget):
            problems.append(f"{where}: the filter's exact running sum (at least {spent.upper():.17g}) exceeds its "
                            f"budget {budget:.17g}")
        if len(problems) > 50:
            break
    mode = ("data-dependent charges (leaks: Redberg et al. 2023)" if gate.data_dependent
            else (f"realised-path: the screen's bound {gate.realised_path[0]:.6g} at every answered step, the answer's "
                  f"{gate.realised_path[1]:.6g} where the screen passed (decided on the step's largest charge "
                  f"{bound:.6g})") if gate.realised_path is not None
            else f"the data-independent step bound {bound:.6g}")
    return verdict("budget_filter", not problems,
                   f"filter at order {gate.filter.order:g} with RDP budget {budget:.6g} (epsilon "
                   f"{gate.filter.epsilon:g}, delta {gate.filter.delta:g}), charged {mode}: {answered} steps answered "
                   f"privately, spending {spent.upper():.6g} (exact sum, rounded up); {refused} answered publicly"
                   + (f" from query {first_refused + 1} (step {first_refused})" if first_refused is not None else "")
                   + ("; every answered step's charge and the running sum follow the rule (the charges refused steps "
                      "would have had are not recorded: the replay re-derives those decisions)" if gate.data_dependent
                      else "; every decision follows the rule"),
                   f"{len(problems)} filter problems, first: " + "; ".join(problems[:5]),
                   problems=problems[:50], answered=answered, refused=refused, spent=spent.upper(), rdp_budget=budget,
                   order=gate.filter.order)
