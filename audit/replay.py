"""Replay checks: the hash chain, the step count, the ledger recomputed from the records, the
(epsilon, delta) conversion, and every step recomputed from the exact-replay payload."""
from __future__ import annotations

import math
import warnings
from typing import TypedDict

from pathlib import Path

import numpy as np
import torch
import hashlib

from dpledger.accounting import safe_files
from dpledger.accounting.conversion import ConversionMethod, epsilon_from_rdp
from dpledger.accounting.summation import ExactSum
from dpledger.audit.checks import CheckResult, failed, passed, skipped, verdict
from dpledger.audit.loader import LoadedTrace, OverWindows, WindowData
from dpledger.decoding.blocks import replay_steps, replay_vote_steps
from dpledger.decoding.runners import BlockOutcome
from dpledger.decoding.vote_payload import VotePayload
from dpledger.decoding.trace import json_bytes, loads_json, read_chunk
from dpledger.decoding.cluster import ClusterError
from dpledger.decoding.recipe import encode_documents
from dpledger.mechanisms.leave_one_out import leave_one_out_allowance
from dpledger.mechanisms.step import as_ensemble

RTOL = 1e-9
"""Relative tolerance for recomputed floats: the same float64 code on the same inputs agrees to
~1e-15; 1e-9 leaves room for summation order while catching any real change. The data-dependent
loss (Eq. 3) is also allowed twice the leave-one-out kernels' rounding allowance on top
(_DATA_DEPENDENT_KEYS): its values at low orders are ~1e-9 and smaller, where the last bits of a sum
summed in another order (another vector width) are more than 1e-9 of the value."""
LAMBDA_ATOL = 1e-9
MAX_TEXT_BYTES = 2 ** 31
"""The run's data text (named by its manifest, outside the run) is re-read up to this size."""


def check_hash_chain(trace: LoadedTrace) -> CheckResult:
    """The per-step records chain from the manifest's genesis hash (load_trace followed the chain).

    Args:
        trace: the loaded run (load_trace).

    Returns:
        The "hash_chain" CheckResult: FAIL with where the chain breaks, else PASS.
    """
    if trace.chain_error:
        return failed("hash_chain", trace.chain_error)
    return passed("hash_chain", f"all {trace.steps} records chain from the manifest's genesis hash")


def _close(a, b, rtol=RTOL, atol=None) -> bool:
    """Equal within rtol (a relative tolerance, per element where an array), plus atol (an absolute
    tolerance per element, where given), with +-inf equal only to itself; a NaN on either side is a mismatch."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape == b.shape and np.array_equal(a, b):   # an exact replay (a NaN is never equal: below)
        return True
    if a.shape != b.shape or np.isnan(a).any() or np.isnan(b).any():
        return False
    rtol = np.broadcast_to(np.asarray(rtol, dtype=np.float64), a.shape)
    same_inf = np.isinf(a) == np.isinf(b)
    finite = np.isfinite(a) & np.isfinite(b)
    absolute = np.broadcast_to(1e-300 if atol is None else np.maximum(np.asarray(atol, dtype=np.float64), 1e-300),
                               a.shape)
    return bool(np.all(same_inf) and np.all(np.isinf(a) <= (a == b))
                and np.all(np.abs(a[finite] - b[finite]) <= absolute[finite] + rtol[finite] * np.abs(b[finite])))


def _nan_note(recorded, recomputed) -> str:
    """Which side of a comparison holds a NaN ("" when neither), for the mismatch message."""
    sides = [side for side, values in (("recorded", recorded), ("recomputed", recomputed))
             if np.isnan(np.asarray(values, dtype=np.float64)).any()]
    return f" (NaN {' and '.join(sides)})" if sides else ""


def _differences(recomputed, written, path: str = "") -> list[str]:
    """Where two JSON values differ: floats within RTOL (+-inf only equal to itself, NaN never
    equal), everything else exactly; keys missing or extra on either side are differences."""
    if isinstance(recomputed, dict) and isinstance(written, dict):
        out = [f"{path}.{key}".lstrip(".") + (" missing from ledger.json" if key not in written else " not expected")
               for key in sorted(set(recomputed) ^ set(written))]
        for key in sorted(set(recomputed) & set(written)):
            out += _differences(recomputed[key], written[key], f"{path}.{key}")
        return out
    if isinstance(recomputed, list) and isinstance(written, list) and len(recomputed) == len(written):
        return [d for i, (a, b) in enumerate(zip(recomputed, written)) for d in _differences(a, b, f"{path}[{i}]")]
    numbers = (int, float)
    if (isinstance(recomputed, float) or isinstance(written, float)) and isinstance(recomputed, numbers) \
            and isinstance(written, numbers) and not isinstance(recomputed, bool) and not isinstance(written, bool):
        return [] if _close([recomputed], [written]) else [f"{path.lstrip('.')}: {written!r} written, "
                                                           f"{recomputed!r} recomputed{_nan_note(written, recomputed)}"]
    if recomputed != written or type(recomputed) is not type(written):
        return [f"{path.lstrip('.')}: {written!r} written, {recomputed!r} recomputed"]
    return []


def check_ledger_recompute(trace: LoadedTrace) -> CheckResult:
    """Every field of ledger.json equals its recomputation from the per-step records and the
    manifest: component totals, the composed curve, epsilons at every delta and conversion, the
    breakdown, data-dependence, direction, relations, accounting, perplexity, public answers and the
    observed totals (a dropped, added or altered step, or an edited flag, shows here).

    Args:
        trace: the loaded run (load_trace).

    Returns:
        The "ledger_recompute" CheckResult: SKIPPED when the records do not fit the manifest; FAIL
        naming the fields that differ (floats compared within RTOL; at most 50 in the evidence); else PASS.
    """
    if trace.totals is None:
        return skipped("ledger_recompute", "the records do not fit the manifest (see records), so ledger.json "
                       "cannot be recomputed from them")
    recomputed = loads_json(json_bytes(trace.totals.summary()).decode())
    mismatched = _differences(recomputed, trace.ledger)
    return verdict("ledger_recompute", not mismatched,
                   f"every field of ledger.json equals its recomputation from the {trace.steps} per-step records "
                   f"(components {', '.join(trace.components)}; epsilons, breakdown, flags, utility)",
                   f"ledger.json disagrees with the per-step records in {len(mismatched)} fields: "
                   + "; ".join(mismatched[:5]), mismatched=mismatched[:50])


def check_conversion(trace: LoadedTrace) -> CheckResult:
    """The reported epsilons are the improved / classic conversions of the composed curve, and the
    breakdown rows sum to the total.

    Args:
        trace: the loaded run (load_trace).

    Returns:
        The "conversion" CheckResult: SKIPPED when the records do not fit the manifest; FAIL listing
        every epsilon entry that differs (or cannot be converted) and a breakdown that does not sum;
        else PASS.
    """
    if trace.totals is None:
        return skipped("conversion", "the records do not fit the manifest (see records)")
    ledger = trace.totals.ledger
    problems = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for entry in trace.ledger.get("epsilon", []):
            try:
                expected = epsilon_from_rdp(ledger.total_curve(), entry["delta"],
                                            ConversionMethod(entry["method"])).epsilon
            except (ValueError, KeyError, TypeError) as error:
                problems.append(f"an epsilon entry cannot be converted ({error})")
                continue
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


LOGIT_ATOL = 1e-3
"""Payload logits against the models' recomputation: float32 logits of the same weights agree to
~1e-5 across BLAS builds; an edit that moves a charge moves logits by far more."""


_DATA_DEPENDENT_KEYS = ("rdp_pmixed_data_dependent", "observed_data_dependent", "eq3_remove_one")
"""Recorded curves that hold Eq. 3 (alone or as the larger part of a covering loss): compared within
RTOL plus twice the kernels' rounding allowance (_eq3_allowance)."""


def _eq3_allowance(trace: LoadedTrace, logits: torch.Tensor, outcome: BlockOutcome) -> np.ndarray | None:
    """Per step and order, twice the leave-one-out kernels' rounding allowance on the replayed Eq. 3
    values (dpledger.mechanisms.leave_one_out.leave_one_out_allowance derives it: every value the
    kernels return lies in [Eq. 3, Eq. 3 + 2 allowance], so two of them differ by at most twice it),
    as the replayed step computed it where it did (from its own ratios' magnitude), else recomputed;
    None for a run without Eq. 3."""
    lambdas, eq3 = outcome.lambdas, outcome.eq3_remove_one
    if eq3 is None or lambdas is None:
        return None
    if outcome.eq3_allowance is not None:
        return 2.0 * np.asarray(outcome.eq3_allowance)
    public, teachers = trace.window_distributions(logits)
    teachers, public = as_ensemble(teachers, public, trace.n_teachers)   # the decode loop's inputs
    return 2.0 * leave_one_out_allowance(teachers, public, torch.as_tensor(lambdas, dtype=torch.float64),
                                         trace.orders, eq3)


def _compare_arrays(mismatches: list, worst: dict, key: str, where: str, recorded, replayed, absolute: bool,
                    atol=None, rtol: float | np.ndarray = RTOL) -> None:
    recorded = np.asarray(recorded, dtype=np.float64)
    replayed = np.asarray(replayed, dtype=np.float64)
    if recorded.shape != replayed.shape:
        mismatches.append(f"{where}: {key} has shape {recorded.shape}, replayed {replayed.shape}")
        return
    if absolute:
        gap = float(np.max(np.abs(recorded - replayed), initial=0.0))
        # np.maximum, not max(): a NaN gap must reach the evidence, not be skipped
        worst[key] = float(np.maximum(worst.get(key, 0.0), gap))
        if not np.isfinite(gap) or gap > LAMBDA_ATOL:
            mismatches.append(f"{where}: mixing weights differ by {gap:.3g}{_nan_note(recorded, replayed)}")
    elif not _close(recorded, replayed, rtol, atol):
        mismatches.append(f"{where}: {key} differs from the mechanism's{_nan_note(recorded, replayed)}")


def _payload_gap(model_logits: torch.Tensor, payload: WindowData) -> float:
    """The largest gap between the models' logits (N+1, W, V) and what the payload stored of them:
    every logit, or for a bounded vote payload the public logits and each teacher's stored
    log-probabilities (log-softmax of its logits at the stored tokens)."""
    if not isinstance(payload, VotePayload):
        return float(torch.max(torch.abs(model_logits.double() - payload.double())))
    public = torch.max(torch.abs(model_logits[0].double() - torch.from_numpy(payload.public_logits).double()))
    # as the decoder computed them (log of the float64 softmax), so a probability that underflows to 0 compares equal
    log_probs = torch.log(torch.softmax(model_logits[1:].double(), dim=-1)).movedim(0, 1)   # (W, N, V)
    stored = torch.from_numpy(payload.token_ids.astype(np.int64))
    recomputed, kept = log_probs.gather(-1, stored), torch.from_numpy(payload.log_probs)
    teachers = torch.where(recomputed == kept, 0.0, torch.abs(recomputed - kept))   # -inf on both sides: equal
    return float(torch.maximum(public, torch.nan_to_num(teachers, nan=math.inf).max()))


def _data_tokens(trace: LoadedTrace) -> np.ndarray | None:
    """The run's teacher-forced token stream re-encoded from its text file, when the text (with the
    recorded sha256) and the tokenizer are available; None otherwise."""
    config = trace.manifest["config"]
    text_path = config["data"].get("text")
    tokenizer = trace.manifest.get("tokenizer")
    if trace.manifest["data"].get("stream") != "teacher-forced" or not text_path or not tokenizer:
        return None
    if not Path(tokenizer).exists():
        return None
    try:  # the manifest names it: a FIFO, a device or a huge file there must not stall the audit
        text = safe_files.read_bytes(text_path, MAX_TEXT_BYTES, follow=True, what="a run's data text").decode(
            "utf-8", errors="replace")
    except (OSError, safe_files.UnsafeFileError):
        return None
    if hashlib.sha256(text.encode()).hexdigest() != trace.manifest["data"].get("sha256"):
        return None
    from transformers import AutoTokenizer

    return encode_documents(AutoTokenizer.from_pretrained(tokenizer), text)


def _budget_spent_before_windows(trace: LoadedTrace) -> dict[int, ExactSum]:
    """The privacy filter's state before each payload window (keyed by the window's first step): the
    exact sum of the recorded charges of every earlier step, as the run kept it."""
    window, spent, before = trace.window_rows(), ExactSum(), {}
    for _, records in trace.iter_blocks():
        for start in range(0, len(records), window):
            before[records[start]["step"]] = spent.copy()
            for record in records[start:start + window]:
                spent.add(record["budget_charge"])
    return before


_ADD_ONE_KEYS = ("rdp_pmixed_data_dependent", "observed_data_dependent", "add_one_bound")
"""Recorded curves that hold the add-one bound (alone or as the larger part of a covering loss)."""
_ADD_ONE_CERTIFICATE = 0.005
"""The add-one sub-grid's certificate that records versions 4 to 8 charged with (every value within 0.5% of
the all-orders computation: dpledger.mechanisms.add_one.ADD_ONE_RELATIVE_TOLERANCE, fixed for those versions)."""


def _shared_subgrid_window(trace: LoadedTrace, records: list[dict]) -> bool:
    """Whether this window's add-one values cannot be reproduced bit for bit: records versions 4 to 8
    refined the add-one bound's sub-grid jointly over a decode block's steps (from
    dpledger.mechanisms.add_one.ADD_ONE_SUBGRID_MIN_VOCABULARY tokens on), so a window shorter than its
    block refines other sub-grids. Every such value lies in [E, (1 + ADD_ONE_RELATIVE_TOLERANCE) E], E
    the bound computed at every order (each interval is bisected until its chord value is within that
    factor of a lower bound on E, and a chord is never below E: add_one_direction_bounds), so two of
    them differ by at most that factor: the replay compares them within it (_ADD_ONE_CERTIFICATE), and
    the data_dependent_eq3 check compares the charges with E itself. The losses the add-one bound covers
    with Eq. 3 get the certificate only at the orders where the add-one bound can be the larger part
    (_add_one_rtol)."""
    from dpledger.mechanisms.add_one import ADD_ONE_SUBGRID_MIN_VOCABULARY   # deferred: numba kernels on first use

    version = trace.manifest.get("records_version", 1)
    if not 4 <= version <= 8 or int(trace.manifest["vocab_size"]) < ADD_ONE_SUBGRID_MIN_VOCABULARY \
            or not records[0].get("add_one_bound") or trace.manifest["data"]["stream"] == "generate":
        return False   # (a remove-one run records no add-one bound; free generation decodes one step at a time)
    block = next(info for info in trace.blocks_info if info.index == records[0]["block"])
    return len(records) < block.length


def _add_one_rtol(added: np.ndarray, removed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Per order, the relative tolerances of (the add-one bound, a loss that is the larger of it and Eq. 3)
    for a step whose replayed add-one bound `added` (K,) is compared within the sub-grid's certificate
    (`removed`: its replayed Eq. 3, or None): RTOL plus the certificate for the bound, and for the loss
    where the bound can be its larger part, i.e. where the replayed bound is within the certificate of
    Eq. 3 or above it (either side's bound lies in [E, 1.005 E], so a recorded bound above Eq. 3 puts the
    replayed one above Eq. 3 / 1.005); RTOL where Eq. 3 is the loss."""
    bound = np.full(added.shape, RTOL + _ADD_ONE_CERTIFICATE)
    if removed is None:
        return bound, bound
    with np.errstate(invalid="ignore"):
        binding = ~(added * (1.0 + _ADD_ONE_CERTIFICATE) < removed)   # (a NaN side: the wider tolerance, and _close fails it)
    return bound, np.where(binding, RTOL + _ADD_ONE_CERTIFICATE, RTOL)


class _ReplayPartial(TypedDict):
    """One window's replay: its first mismatches, how many there were, the largest deviations seen, and
    how many steps' add-one values were compared within the sub-grid's certificate (_shared_subgrid_window)."""

    mismatches: list[str]
    count: int
    worst: dict[str, float]
    certificate_steps: int


def _replay_window(trace: LoadedTrace, records: list[dict], logits: WindowData, cross_check: bool,
                   check_tokens: bool, spent_before: dict[int, ExactSum] | None) -> _ReplayPartial:
    """One window replayed: its mismatches (in step order) and the largest deviations seen."""
    memo = trace.memo
    if "runner" not in memo:
        memo["runner"] = trace.runner()
    tokens_stream = None
    if check_tokens:
        if "tokens_stream" not in memo:
            memo["tokens_stream"] = _data_tokens(trace)
        tokens_stream = memo["tokens_stream"]
        if tokens_stream is None:  # a worker that cannot see the run's text must not skip what the driver checks

            raise ClusterError(f"a worker cannot re-encode the run's text {trace.manifest['config']['data'].get('text')}"
                               " (every worker must see the driver's files at the same paths)")
    block, first = records[0]["block"], records[0]["step"]
    gate = None
    if spent_before is not None:  # the filter's state before this window: the recorded charges so far
        if "gate" not in memo:
            memo["gate"] = trace.budget_gate()
        gate = memo["gate"]
        gate.filter.set_state(spent_before[first])
    seed, sequential = trace.manifest["config"]["seed"], trace.manifest["data"]["stream"] == "generate"
    mismatches: list[str] = []
    if isinstance(logits, VotePayload):  # a voting run's bounded payload: certified votes, public logits
        outcome, tokens, uncertified = replay_vote_steps(memo["runner"], logits, seed, first, trace.orders, sequential,
                                                         int(trace.manifest["vocab_size"]), gate)
        mismatches += [f"step {first + row}: the bounded payload does not certify its votes: {problem}"
                       for row, problem in uncertified]
        allowance = None
    else:
        outcome, tokens = replay_steps(memo["runner"], logits, seed, first, trace.orders, sequential, gate,
                                       None if sequential else trace.window_distributions(logits))
        allowance = _eq3_allowance(trace, logits, outcome)
    output = outcome.output.numpy()
    worst = {"lambdas": 0.0, "logits_vs_models": 0.0}
    if cross_check:
        if memo.get("model_logits_block") != block:  # a block's forward pass serves all its windows
            memo["model_logits"] = trace._model_logits(read_chunk(trace.directory, block))
            memo["model_logits_block"] = block
        rows = [r["position"] for r in records]
        gap = _payload_gap(memo["model_logits"][:, rows], logits)
        worst["logits_vs_models"] = gap
        if not gap <= LOGIT_ATOL:
            mismatches.append(f"block {block}: payload logits differ from the models' by {gap:.3g}")
    if tokens_stream is not None:
        contexts = np.asarray([r["context_token"] for r in records])
        truths = np.asarray([r["true_token"] for r in records])
        if first + len(records) >= tokens_stream.size or \
                not np.array_equal(contexts, tokens_stream[first:first + len(records)]) or \
                not np.array_equal(truths, tokens_stream[first + 1:first + 1 + len(records)]):
            mismatches.append(f"block {block}: the recorded tokens are not the run's text at steps {first}..")
    # a key's relative tolerance: the sub-grid's certificate on top of RTOL where the block shared its sub-grid
    added = outcome.add_one_bound if allowance is not None else None
    shared = added is not None and _shared_subgrid_window(trace, records)
    for row, record in enumerate(records):
        where = f"step {record['step']}"
        bound_rtol, loss_rtol = (RTOL, RTOL) if added is None or not shared else _add_one_rtol(
            added[row], None if outcome.eq3_remove_one is None else outcome.eq3_remove_one[row])
        if outcome.lambdas is not None:
            _compare_arrays(mismatches, worst, "lambdas", where, record["lambdas"], outcome.lambdas[row], True)
        if outcome.screen_statistic is not None:
            if outcome.screen_passed is None:
                raise RuntimeError("a screened step records its decision with its statistic")
            recorded, replayed = record["screen_statistic"], outcome.screen_statistic[row]
            if not _close([recorded], [replayed]) or record["screen_passed"] != bool(outcome.screen_passed[row]):
                mismatches.append(f"{where}: screening statistic {recorded:.6g} recorded, {replayed:.6g} replayed"
                                  f"{_nan_note(recorded, replayed)}")
        if outcome.sampled is not None and record["sampled_teachers"] != np.flatnonzero(outcome.sampled[row]).tolist():
            mismatches.append(f"{where}: sampled teachers differ from the replayed Poisson subsample")
        eq3_atol = None if allowance is None else allowance[row]
        for name in trace.components:
            key = f"rdp_{name}"
            atol = eq3_atol if key in _DATA_DEPENDENT_KEYS else None
            if not _close(record[key], outcome.charged[name][row], loss_rtol if key in _ADD_ONE_KEYS else RTOL, atol):
                mismatches.append(f"{where}: charged {name} differs from the mechanism's"
                                  f"{_nan_note(record[key], outcome.charged[name][row])}")
        for key in ("observed_data_dependent", "data_independent", "eq3_remove_one", "add_one_bound"):
            replayed = getattr(outcome, key)
            if replayed is not None and key in record:   # version 1 records hold the first two only
                _compare_arrays(mismatches, worst, key, where, record[key], replayed[row], False,
                                eq3_atol if key in _DATA_DEPENDENT_KEYS else None,
                                bound_rtol if key == "add_one_bound" else loss_rtol if key in _ADD_ONE_KEYS else RTOL)
        if outcome.vote_counts is not None:
            if outcome.aggregator_noise is None:
                raise RuntimeError("a voting step records its aggregator's draws")
            voted = np.flatnonzero(outcome.vote_counts[row])
            if record["vote_tokens"] != voted.tolist() or \
                    record["vote_counts"] != outcome.vote_counts[row, voted].tolist():
                mismatches.append(f"{where}: the vote histogram differs from the teachers' votes recomputed with "
                                  "the public shared randomness")
            if not _close(record["aggregator_noise"], outcome.aggregator_noise[row]):
                mismatches.append(f"{where}: the aggregator's noise differs from the step's generator")
        if gate is not None:
            refused, charge = outcome.budget_refused, outcome.budget_charge
            if refused is None or charge is None:
                raise RuntimeError("a step under a privacy filter records its decision")
            if record["budget_refused"] != bool(refused[row]) or not _close([record["budget_charge"]], [charge[row]]):
                mismatches.append(f"{where}: the privacy filter's decision (refused {record['budget_refused']}, "
                                  f"charge {record['budget_charge']:.6g}) differs from the replayed one (refused "
                                  f"{bool(refused[row])}, charge {charge[row]:.6g})")
        if int(tokens[row]) != record["output_token"]:
            mismatches.append(f"{where}: output token {record['output_token']} recorded, {int(tokens[row])} replayed")
        if record["true_token"] >= 0 and not _close([record["prob_true_token"]], [output[row, record["true_token"]]]):
            mismatches.append(f"{where}: probability of the true token differs"
                              f"{_nan_note(record['prob_true_token'], output[row, record['true_token']])}")
    return {"mismatches": mismatches[:51], "count": len(mismatches), "worst": worst,
            "certificate_steps": len(records) if shared else 0}


def check_replay(trace: LoadedTrace) -> CheckResult:
    """Every step recomputed from its logits with the manifest's mechanism and per-step seeds:
    mixing weights, screening statistic and decision, Poisson subsample, charged curves, observed
    data-dependent loss and data-independent bound, sampled token, utility. The logits come from the
    replay payload (its hashes are chained in the records) or the run's models; when both are there
    the payload is also compared with the models' logits, and the token stream with the run's text
    where it is available. This is the check that verifies the claimed charges: without it the
    audit's verdict is UNVERIFIED.

    Args:
        trace: the loaded run (load_trace).

    Returns:
        The "replay" CheckResult: SKIPPED (with the reasons) when neither the payload nor the run's
        models give the logits, or the records do not fit the manifest; FAIL with the mismatch count
        and the first mismatches (at most 50 in the evidence); else PASS with the largest deviations.
    """
    return trace.run_check(replay_over_windows(trace))


def replay_over_windows(trace: LoadedTrace) -> OverWindows[CheckResult]:
    """check_replay written over windows (dpledger.audit.loader.OverWindows): what dpledger.audit.audit runs
    beside the other checks over one pass of the windows.

    Args:
        trace: the loaded run (load_trace).

    Returns:
        A generator that yields its window request and returns the CheckResult of check_replay.
    """
    if trace.logits_source is None:  # has_payload: neither the payload nor the run's models
        reasons = trace.payload_problems + [trace.model_unavailability()]
        return skipped("replay", "the charges cannot be recomputed: " + "; ".join(reasons), reasons=reasons)
    if trace.totals is None:
        return skipped("replay", "the records do not fit the manifest (see records), so they cannot be replayed")
    cross_check = trace.logits_source == "payload" and trace.models_available
    if trace.models_available or trace.logits_source == "models":
        trace.memo["tokens_stream"] = _data_tokens(trace)
    check_tokens = trace.memo.get("tokens_stream") is not None
    spent_before = _budget_spent_before_windows(trace) if trace.manifest.get("budget") is not None else None
    worst = {"lambdas": 0.0, "logits_vs_models": 0.0}
    mismatches: list[str] = []
    count = certificate_steps = 0
    for _, window in (yield from trace.windows(_replay_window, cross_check, check_tokens, spent_before,
                                               desc="replay")):
        mismatches += window["mismatches"]
        count += window["count"]
        certificate_steps += window["certificate_steps"]
        for key, value in window["worst"].items():  # np.maximum, not max(): a NaN gap must reach the evidence
            worst[key] = float(np.maximum(worst.get(key, 0.0), value))
        if count > 50:
            break
    source = {"payload": "the exact-replay payload", "models": "the run's models, re-run"}[trace.logits_source]
    if trace.logits_source == "payload" and trace.bounded_payload:
        source = "the bounded vote payload (each vote certified by its teacher's top-k race entries)"
    if cross_check:
        source += f", whose logits equal the run's models' (max gap {worst['logits_vs_models']:.2g})"
    if check_tokens:
        source += "; tokens re-encoded from the run's text"
    how = "exactly"
    if certificate_steps:
        how = (f"exactly but for the add-one bound of {certificate_steps} steps, which replays within its sub-grid's "
               f"certificate {_ADD_ONE_CERTIFICATE:g} (records version {trace.manifest.get('records_version')} shared "
               "the sub-grid across a decode block; data_dependent_eq3 compares the charges with every order computed),")
    return verdict("replay", not mismatches,
                   f"all {trace.steps} steps replay {how} from {source} (max |lambda gap| {worst['lambdas']:.2g}, "
                   f"tolerance {LAMBDA_ATOL:g}; floats rtol {RTOL:g})",
                   f"{count} replay mismatches, first: " + "; ".join(mismatches[:5]),
                   mismatches=mismatches[:50], max_deviation=worst, source=trace.logits_source,
                   cross_checked_with_models=cross_check, tokens_checked=check_tokens,
                   add_one_within_certificate_steps=certificate_steps)
