"""Replay checks: the hash chain, the step count, the ledger recomputed from the records, the
(epsilon, delta) conversion, and every step recomputed from the exact-replay payload."""
from __future__ import annotations

import math
import warnings

import numpy as np

from accounting.conversion import ConversionMethod, epsilon_from_rdp
from audit.checks import CheckResult, failed, passed, skipped, verdict
from audit.loader import LoadedTrace
from decoding.run import ledger_from_records, replay_block

RTOL = 1e-9
"""Relative tolerance for recomputed floats: the same float64 code on the same inputs agrees to
~1e-15; 1e-9 leaves room for summation order while catching any real change."""
LAMBDA_ATOL = 1e-9


def check_hash_chain(trace: LoadedTrace) -> CheckResult:
    if trace.chain_error:
        return failed("hash_chain", trace.chain_error)
    return passed("hash_chain", f"all {len(trace.records)} records chain from the genesis hash")


def check_step_count(trace: LoadedTrace) -> CheckResult:
    steps = [r["step"] for r in trace.records]
    expected = trace.manifest["queries"]
    contiguous = steps == list(range(len(steps)))
    ledger_steps = trace.ledger.get("steps")
    ok = contiguous and len(steps) == expected and ledger_steps == expected
    return verdict("step_count", ok, f"{expected} queries recorded, contiguous, and all charged in ledger.json",
                   f"manifest says {expected} queries; records hold {len(steps)} (contiguous: {contiguous}); "
                   f"ledger.json charges {ledger_steps}", records=len(steps), manifest=expected, ledger=ledger_steps)


def _close(a, b, rtol=RTOL) -> bool:
    """Equal within rtol, with +-inf equal only to itself; a NaN on either side is a mismatch."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or np.isnan(a).any() or np.isnan(b).any():
        return False
    same_inf = np.isinf(a) == np.isinf(b)
    finite = np.isfinite(a) & np.isfinite(b)
    return bool(np.all(same_inf) and np.all(np.isinf(a) <= (a == b))
                and np.allclose(a[finite], b[finite], rtol=rtol, atol=1e-300))


def _nan_note(recorded, recomputed) -> str:
    """Which side of a comparison holds a NaN ("" when neither), for the mismatch message."""
    sides = [side for side, values in (("recorded", recorded), ("recomputed", recomputed))
             if np.isnan(np.asarray(values, dtype=np.float64)).any()]
    return f" (NaN {' and '.join(sides)})" if sides else ""


def check_ledger_recompute(trace: LoadedTrace) -> CheckResult:
    """ledger.json's component totals equal the sums of the per-step charges (a dropped, added or
    altered step shows here)."""
    ledger = ledger_from_records(trace.records, trace.manifest)
    written = trace.ledger.get("ledger", {}).get("components", {})
    mismatched = []
    for name in trace.components:
        if name not in written:
            mismatched.append(f"{name}: missing from ledger.json")
            continue
        recomputed = ledger.component_curve(name).values
        values = [math.inf if v == "inf" else v for v in written[name]["values"]]
        if not _close(recomputed, values):
            with np.errstate(invalid="ignore"):  # inf - inf where both are "no guarantee"
                worst = np.nanmax(np.abs(np.asarray(values, dtype=float) - recomputed) /
                                  np.maximum(np.abs(recomputed), 1e-300), initial=0.0)
            mismatched.append(f"{name}: relative difference up to {worst:.3g}{_nan_note(values, recomputed)}")
    return verdict("ledger_recompute", not mismatched,
                   f"every component total ({', '.join(trace.components)}) equals the sum of its per-step charges",
                   "ledger.json disagrees with the per-step records: " + "; ".join(mismatched),
                   mismatched=mismatched)


def check_conversion(trace: LoadedTrace) -> CheckResult:
    """The reported epsilons are the improved / classic conversions of the composed curve, and the
    breakdown rows sum to the total."""
    ledger = ledger_from_records(trace.records, trace.manifest)
    problems = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for entry in trace.ledger.get("epsilon", []):
            expected = epsilon_from_rdp(ledger.total_curve(), entry["delta"], ConversionMethod(entry["method"])).epsilon
            if not _close([entry["epsilon"]], [expected]):
                problems.append(f"{entry['method']} at delta={entry['delta']:g}: reported {entry['epsilon']!r}, "
                                f"the composed curve gives {expected!r}{_nan_note(entry['epsilon'], expected)}")
    rows = trace.ledger.get("breakdown", {}).get("rows", [])
    if rows:
        parts = sum(r["epsilon"] for r in rows[:-1])
        if not (math.isinf(rows[-1]["epsilon"]) or math.isclose(parts, rows[-1]["epsilon"], rel_tol=1e-12, abs_tol=1e-12)):
            problems.append(f"breakdown rows sum to {parts!r}, total row says {rows[-1]['epsilon']!r}")
    return verdict("conversion", not problems, "reported epsilons equal the RDP->DP conversions of the composed "
                   "curve (Balle et al. 2020 Thm 21; Mironov 2017 Prop 3) and the breakdown sums to its total",
                   "; ".join(problems), problems=problems)


def check_replay(trace: LoadedTrace) -> CheckResult:
    """Every step recomputed from the recorded logits with the manifest's mechanism and seed:
    mixing weights, screening statistic and decision, charged curves, sampled token, utility."""
    if not trace.has_payload:
        return skipped("replay", "the run kept no exact-replay payload and its models are not available to "
                       "recompute the distributions")
    runner = trace.runner()
    sequential = trace.manifest["data"]["stream"] == "generate"
    seed = trace.manifest["config"]["seed"]
    worst = {"lambdas": 0.0, "screen_statistic": 0.0, "charged": 0.0, "prob_true_token": 0.0}
    mismatches = []
    for block, records, logits in trace.iter_payload():
        outcome, tokens = replay_block(runner, logits, seed, block, trace.orders, sequential)
        output = outcome.output.numpy()
        for row, record in enumerate(records):
            where = f"step {record['step']}"
            if outcome.lambdas is not None:
                gap = float(np.max(np.abs(np.asarray(record["lambdas"]) - outcome.lambdas[row])))
                # np.maximum, not max(): a NaN gap must reach the evidence, not be skipped
                worst["lambdas"] = float(np.maximum(worst["lambdas"], gap))
                if not np.isfinite(gap) or gap > LAMBDA_ATOL:
                    mismatches.append(f"{where}: mixing weights differ by {gap:.3g}"
                                      f"{_nan_note(record['lambdas'], outcome.lambdas[row])}")
            if outcome.screen_statistic is not None:
                recorded, replayed = record["screen_statistic"], outcome.screen_statistic[row]
                gap = abs(recorded - replayed) / np.maximum(abs(replayed), 1e-300)
                worst["screen_statistic"] = float(np.maximum(worst["screen_statistic"], gap))
                if not _close([recorded], [replayed]) or record["screen_passed"] != bool(outcome.screen_passed[row]):
                    mismatches.append(f"{where}: screening statistic {recorded:.6g} recorded, {replayed:.6g} replayed"
                                      f"{_nan_note(recorded, replayed)}")
            for name in trace.components:
                if not _close(record[f"rdp_{name}"], outcome.charged[name][row]):
                    mismatches.append(f"{where}: charged {name} differs from the mechanism's"
                                      f"{_nan_note(record[f'rdp_{name}'], outcome.charged[name][row])}")
            if int(tokens[row]) != record["output_token"]:
                mismatches.append(f"{where}: output token {record['output_token']} recorded, {int(tokens[row])} replayed")
            if record["true_token"] >= 0 and not _close([record["prob_true_token"]], [output[row, record["true_token"]]]):
                mismatches.append(f"{where}: probability of the true token differs"
                                  f"{_nan_note(record['prob_true_token'], output[row, record['true_token']])}")
        if len(mismatches) > 50:
            break
    source = "the exact-replay payload" if trace.logits_source == "payload" else "the run's models, re-run"
    return verdict("replay", not mismatches,
                   f"all {len(trace.records)} steps replay exactly from {source} (max |lambda gap| {worst['lambdas']:.2g}, "
                   f"tolerance {LAMBDA_ATOL:g}; floats rtol {RTOL:g})",
                   f"{len(mismatches)} replay mismatches, first: " + "; ".join(mismatches[:5]),
                   mismatches=mismatches[:50], max_deviation=worst)
