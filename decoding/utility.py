"""Utility warnings: a run can be soundly private and still answer nothing useful. Each warning reads
the run's manifest and per-step records (so the decoder, the audit's lint and the reports give the
same answer) and says, with the run's own numbers, why its text may be worth no more than the public
model's. They are about utility only: none changes a privacy number.

The four run-level warnings (docs/pitfalls.md, pitfalls 13 to 16):

* noise comparable to the ensemble: with all N teachers voting for one token, the aggregator releases
  that token with probability below 1/2 (its exact output law, or 4,000 draws where it has none);
* a screen that (nearly) always or never passes: one decision on at least 99% of at least 20
  screened steps, so the screen tells queries apart no better than a fixed rule while it is charged;
* subsampling that raises epsilon: a Poisson-subsampled PMixED run whose composed epsilon is above
  the same PMixED's without subsampling over the same charged steps (the variant's amplification
  does not pay for itself at this sample rate);
* teachers nearly identical: at least 80% of at least 20 voting steps unanimous, so the ensemble
  adds little over one teacher.

A fifth compares runs: a private run whose perplexity is no better than the public model's on the
same queries (`no_better_than_public`), for reports that hold both."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dpledger.accounting.conversion import epsilon_from_rdp
from dpledger.decoding.runners import voting_mechanism
from dpledger.mechanisms.ball import Ball
from dpledger.mechanisms.pmixed import PMixED

PITFALL_TITLES = {13: "noise comparable to the ensemble", 14: "screen that (nearly) always or never passes",
                  15: "subsampling that raises epsilon", 16: "teachers nearly identical"}
"""The utility pitfalls' numbers and titles, as docs/pitfalls.md names them."""
UNANIMOUS_RELEASE_BELOW = 0.5
"""Noise comparable to N: a unanimous vote is released with probability below this."""
SCREEN_SAME_DECISION = 0.99
"""A screen deciding one way on at least this fraction of its steps (and at least MIN_STEPS) warns."""
ALIKE_UNANIMOUS = 0.8
"""Teachers nearly identical: at least this fraction of voting steps unanimous (and at least MIN_STEPS)."""
MIN_STEPS = 20
"""Fewer screened or voting steps than this say too little to warn about."""
UNANIMOUS_DRAWS = 4000
"""Draws of an aggregator without an exact output law, for its unanimous release probability."""


@dataclass(frozen=True)
class UtilityWarning:
    """One utility check on a run: its pitfall number in docs/pitfalls.md, a title, whether it
    `applies`, and the reason with the run's numbers (why it applies, or why not)."""

    pitfall: int
    title: str
    applies: bool
    reason: str


def unanimous_release_probability(params: dict[str, Any], teachers: int, relation: str, vocab_size: int) -> float:
    """Pr[the voting aggregator releases token 0 | all `teachers` teachers vote for token 0].

    Args:
        params: the run's recorded [mechanism] parameters (a voting run's).
        teachers: N, the number of teachers.
        relation: the run's neighbouring relation.
        vocab_size: V, the number of tokens the noise is spread over.

    Returns:
        The probability, from the aggregator's exact output law, or the fraction of UNANIMOUS_DRAWS
        draws (seeded) where it has none.

    Raises:
        ValueError: if the parameters do not make a voting mechanism.
    """
    aggregator = voting_mechanism(params, teachers, relation).aggregator
    counts = np.zeros(vocab_size, dtype=np.int64)
    counts[0] = teachers
    if aggregator.exact_law:
        return float(np.exp(aggregator.log_output_law(counts)[1][0]))
    draws = aggregator.sample_outputs(counts, UNANIMOUS_DRAWS, np.random.default_rng(0))
    return float(np.mean(draws == 0))


def _noise_warning(manifest: dict[str, Any], params: dict[str, Any]) -> UtilityWarning:
    title = PITFALL_TITLES[13]
    if manifest["mechanism"]["type"] != "voting":
        return UtilityWarning(13, title, False, "not a voting run")
    teachers = int(manifest["n_teachers"])
    probability = unanimous_release_probability(params, teachers, manifest["relation"], int(manifest["vocab_size"]))
    applies = probability < UNANIMOUS_RELEASE_BELOW
    return UtilityWarning(13, title, applies,
                          f"with all {teachers} teachers voting for one token, {params['aggregator']} releases it with "
                          f"probability {probability:.3f}" + (" (below 1/2: the noise drowns even a unanimous vote; "
                                                               "more teachers or less noise)" if applies else ""))


def _screen_warning(manifest: dict[str, Any], records: Sequence[dict[str, Any]]) -> UtilityWarning:
    title = PITFALL_TITLES[14]
    if not any("screen" in name for name in manifest["mechanism"]["components"]):
        return UtilityWarning(14, title, False, "no screening step")
    decisions = [bool(r["screen_passed"]) for r in records if r.get("screen_statistic") is not None]
    if len(decisions) < MIN_STEPS:
        return UtilityWarning(14, title, False, f"{len(decisions)} screened steps (fewer than {MIN_STEPS})")
    passed = sum(decisions)
    share = max(passed, len(decisions) - passed) / len(decisions)
    applies = share >= SCREEN_SAME_DECISION
    return UtilityWarning(14, title, applies,
                          f"the screen passed on {passed} of {len(decisions)} screened steps"
                          + (": one decision nearly always, so it tells queries apart no better than a fixed rule "
                             "while every screened step is charged" if applies else ""))


def _subsampling_warning(manifest: dict[str, Any], params: dict[str, Any], records: Sequence[dict[str, Any]],
                         ledger: dict[str, Any]) -> UtilityWarning:
    title = PITFALL_TITLES[15]
    if manifest["mechanism"]["type"] != "pmixed" or params.get("sample_rate") is None:
        return UtilityWarning(15, title, False, "no Poisson subsampling of teachers")
    delta = manifest["config"]["deltas"][0]
    charged = sum(r["answered_by"] == "mechanism" for r in records)
    ball = Ball(params.get("ball", Ball.PROJECTION_ORDER.value))
    unsampled = PMixED(params["alpha"], params["beta"], int(params["teachers"]), ball=ball)
    curve = unsampled.rdp_curve(manifest["orders"]).composed(charged)
    without = epsilon_from_rdp(curve, delta).epsilon
    subsampled = next(e["epsilon"] for e in ledger["epsilon"] if e["method"] == "improved" and e["delta"] == delta)
    applies = subsampled > without
    return UtilityWarning(15, title, applies,
                          f"epsilon {subsampled:.4g} with sample rate {params['sample_rate']:g} "
                          f"({params['subsampling_variant']}) against {without:.4g} without subsampling, over "
                          f"{charged} charged steps at delta {delta:g}"
                          + ("; subsampling costs more than it amplifies here" if applies else ""))


def _alike_warning(manifest: dict[str, Any], records: Sequence[dict[str, Any]]) -> UtilityWarning:
    title = PITFALL_TITLES[16]
    if manifest["mechanism"]["type"] != "voting":
        return UtilityWarning(16, title, False, "not a voting run")
    teachers = int(manifest["n_teachers"])
    counts = [r["vote_counts"] for r in records if r.get("vote_counts")]
    if len(counts) < MIN_STEPS:
        return UtilityWarning(16, title, False, f"{len(counts)} voting steps (fewer than {MIN_STEPS})")
    unanimous = sum(max(c) == teachers for c in counts) / len(counts)
    applies = unanimous >= ALIKE_UNANIMOUS
    return UtilityWarning(16, title, applies,
                          f"all {teachers} teachers voted alike on {unanimous:.0%} of {len(counts)} voting steps"
                          + (": the ensemble adds little over one teacher (train teachers on more distinct data)"
                             if applies else ""))


def utility_warnings(manifest: dict[str, Any], records: Sequence[dict[str, Any]],
                     ledger: dict[str, Any]) -> list[UtilityWarning]:
    """The four run-level utility checks (pitfalls 13 to 16 of docs/pitfalls.md), in order.

    Args:
        manifest: the run's manifest.
        records: its per-step records, in step order.
        ledger: its ledger.json summary (the improved epsilon at its first delta is read).

    Returns:
        One UtilityWarning per check, applying or not, each with its reason; a check the run's files
        cannot support (a damaged or edited run) does not apply and says so.
    """
    params = manifest["mechanism"]["params"]
    checks = {13: lambda: _noise_warning(manifest, params), 14: lambda: _screen_warning(manifest, records),
              15: lambda: _subsampling_warning(manifest, params, records, ledger),
              16: lambda: _alike_warning(manifest, records)}
    found = []
    for pitfall, check in checks.items():
        try:
            found.append(check())
        except (ValueError, KeyError, TypeError, IndexError, StopIteration) as error:
            # a damaged or hand-edited run: the audit's own checks say what is wrong with it; a utility
            # warning only says it could not look
            found.append(UtilityWarning(pitfall, PITFALL_TITLES[pitfall], False,
                                        f"not computed: the run's records do not support it ({error!r})"))
    return found


def no_better_than_public(private_perplexity: float | None, public_perplexity: float | None) -> bool:
    """Whether a private run's perplexity is no better (no lower) than the public model's on the same queries.

    Args:
        private_perplexity: the private run's perplexity (None or +inf: not measured or no text).
        public_perplexity: the public model's on the same queries.

    Returns:
        True when both are finite numbers and the private one is >= the public one.
    """
    if private_perplexity is None or public_perplexity is None:
        return False
    return (math.isfinite(private_perplexity) and math.isfinite(public_perplexity)
            and private_perplexity >= public_perplexity)

