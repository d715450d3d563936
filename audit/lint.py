"""Pitfall lint: the configuration and trace checked against the known pitfalls of public
implementations, numbered as in docs/pitfalls.md, each reported as applies / does not apply with
the reason and a severity."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpledger.audit.loader import LoadedTrace
from dpledger.decoding.totals import component_relations
from dpledger.decoding.utility import utility_warnings
from dpledger.mechanisms.pmixed import SubsamplingVariant
from dpledger.mechanisms.screening import BLIND_SCREEN_RATIO



GUESSABLE_SEED = 2 ** 40
"""Run seeds below this are within an exhaustive search (pitfall 12); a secrets.randbits(63) seed
falls below it with probability 2^-23."""


@dataclass(frozen=True)
class Finding:
    """One pitfall of docs/pitfalls.md (`pitfall` its number): whether it `applies` to the run, its
    `severity` ("high", "medium", "low" or "info") and the `reason`."""

    pitfall: int
    title: str
    applies: bool
    severity: str
    reason: str

    def to_dict(self) -> dict:
        """The finding as audit.json records it.

        Returns:
            {"pitfall", "title", "applies", "severity", "reason"}.
        """
        return dict(vars(self))


def _nan_fields(record: dict, screened: bool) -> list[str]:
    """The record's numeric fields holding a NaN, except the trace's "not applicable" markers: the
    screening statistic of a run without screening, the true token's probability where there is no
    true token (generated text)."""
    markers = {"screen_statistic"} if not screened else set()
    if record["true_token"] < 0:
        markers.add("prob_true_token")
    return [name for name, value in record.items() if name not in markers and not isinstance(value, str)
            and np.isnan(np.asarray(value, dtype=np.float64)).any()]


def lint(trace: LoadedTrace, ablation_evidence: dict | None = None) -> list[Finding]:
    """The run's configuration and per-step records checked against pitfalls 1 to 12 of docs/pitfalls.md,
    and against its utility pitfalls 13 to 16 (dpledger.decoding.utility).

    Args:
        trace: the loaded run (its manifest and records are read; not its payload).
        ablation_evidence: the neighbour ablation's evidence (check_ablation), whose worst unclaimed
            neighbour is named under pitfall 5; None where the ablation did not run.

    Returns:
        One Finding per pitfall, in pitfall order (1..16).
    """
    params = trace.params
    variant = SubsamplingVariant(params["subsampling_variant"]) if params.get("sample_rate") is not None else None
    data_dependent = any(trace.components.values())
    findings = []

    sizes, passes = [], []
    nan_fields: dict[str, list[int]] = {}
    every_record: list[dict] = []
    for _, records in trace.iter_blocks():
        every_record += records
        sizes += [len(r["sampled_teachers"]) for r in records if r["sampled_teachers"] or variant]
        passes.append(sum(bool(r["screen_passed"]) for r in records))
        for record in records:
            for name in _nan_fields(record, "screen" in trace.components):
                nan_fields.setdefault(name, []).append(record["step"])
    findings.append(Finding(1, "subsampling with replacement analysed as Poisson", False, "info",
                            "teachers are Poisson-sampled without replacement: each is kept independently with "
                            f"probability q (recorded subsample sizes {min(sizes)}..{max(sizes)})" if variant else
                            "no teacher subsampling"))
    findings.append(Finding(2, "amplification with the realised sample size", bool(variant and variant.uses_realised_sizes),
                            "high" if variant and variant.uses_realised_sizes else "info",
                            f"variant {variant.value}: {variant.soundness}" if variant and variant.uses_realised_sizes
                            else "the bound does not depend on the realised sample size"))
    findings.append(Finding(3, "amplification without the factor for both directions", bool(variant and not variant.general),
                            "high" if variant and not variant.general else "info",
                            f"variant {variant.value} uses the tight form without Zhu & Wang's factor 3"
                            if variant and not variant.general else "general bound (factor 3) or no amplification"))
    per_order = variant is SubsamplingVariant.PER_ORDER_RADIUS
    findings.append(Finding(4, "lower orders charged as if their ball were smaller", per_order,
                            "high" if per_order else "info",
                            "per-order-radius treats order k's ball as radius beta*k, only order alpha is enforced"
                            if per_order else "orders below alpha get the projection order's bound (monotonicity)"))
    unclaimed = (ablation_evidence or {}).get("unclaimed_worst")
    relations = component_relations(trace.manifest)
    remove_only = [name for name, dependent in trace.components.items()
                   if dependent and "add" not in relations[name].moves]
    reason5 = (f"{', '.join(remove_only)} covers removing a teacher of the realised ensemble only (Flemings et al. "
               f"2024, Eq. 3); the run claims {trace.manifest['relation'].replace('_', '-')}" if remove_only else
               "the data-dependent loss covers adding a teacher too (the add-one bound)" if data_dependent else
               "no data-dependent loss is charged")
    if unclaimed:
        reason5 += (f"; the ablation's {unclaimed['worst_neighbour']} reaches empirical epsilon "
                    f"{unclaimed['empirical_epsilon']:.4g} against the {trace.manifest['relation'].replace('_', '-')} claim")
    findings.append(Finding(5, "data-dependent loss for remove-one only", bool(remove_only),
                            ("high" if unclaimed and not unclaimed["within_claim"] else "medium") if remove_only
                            else "info", reason5))
    filtered = bool((trace.manifest.get("budget") or {}).get("data_dependent"))
    findings.append(Finding(6, "data-dependent epsilon printed raw", data_dependent or filtered,
                            "high" if filtered else "medium" if data_dependent else "info",
                            ("the run's privacy filter was driven by data-dependent losses: where it stopped depends on "
                             "the private data, which leaks (Redberg et al. 2023); ledger.json, the manifest and the "
                             "report say so" if filtered else
                             "ledger.json and every report flag this epsilon as data-dependent (not a released DP "
                             "guarantee; releasing it leaks, Papernot et al. 2018)") if data_dependent or filtered else
                            "the epsilon is data-independent"))
    if "screen" in trace.components:
        ratio = params["lam"] / (trace.n_teachers * params["sigma"])
        blind = ratio < BLIND_SCREEN_RATIO
        passed = sum(passes) / trace.steps
        findings.append(Finding(7, "screening blind to the private data", blind, "medium" if blind else "info",
                                f"lam/(N sigma) = {ratio:.3g}: the ensemble moves the screened mean by at most "
                                f"{params['lam'] / trace.n_teachers:.3g} per token against noise sigma = {params['sigma']:g}"
                                f"; the pass rate ({passed:.3f}) reflects the noise and the public model, not the teachers"
                                if blind else f"lam/(N sigma) = {ratio:.3g}"))
    else:
        findings.append(Finding(7, "screening blind to the private data", False, "info", "no screening step"))
    findings.append(Finding(8, "screening sensitivity or ensemble size wrong", False, "info",
                            "checked per step by screening_cost (charge = (lam/(N sigma))^2 * order with the run's N)"
                            if "screen" in trace.components else "no screening step"))
    findings.append(Finding(9, "NaN divergences becoming 0", bool(nan_fields), "high" if nan_fields else "info",
                            "NaN in the per-step records: " + "; ".join(f"{name} at steps {steps[:5]}"
                                                                          for name, steps in nan_fields.items())
                            if nan_fields else "no NaN in any numeric per-step field; the kernels map 0/0 terms to 0 "
                            "and support violations to +inf"))
    findings.append(Finding(10, "float32 underflow in high-order divergences", False, "info",
                            "divergences are computed from float64 log-probabilities in log space (logsumexp)"))
    findings.append(Finding(11, "budgets reset per run and epsilon averaged", False, "info",
                            "one run, one ledger; compose runs on the same data by adding their curves, never by "
                            "averaging epsilons"))
    seed = trace.manifest["config"]["seed"]
    random = trace.mechanism_type not in ("public", "ensemble")
    guessable = random and seed < GUESSABLE_SEED
    findings.append(Finding(12, "guessable run seed", guessable, "medium" if guessable else "info",
                            "the run seed is below 2^40, a range an exhaustive search covers: every step's "
                            "noise, sample and vote draws are derived from it, so an "
                            "adversary who guesses it recomputes the mechanism's randomness and the guarantee is void; "
                            "for a release, set run.seed to a secret random integer (secrets.randbits(63)) and keep "
                            "the trace confidential" if guessable else
                            ("the run seed is not among the small seeds a search would try first; it and the trace "
                             "that records it must stay confidential" if random else "the mechanism draws nothing")))
    # 13 to 16: a sound run that answers nothing useful (utility only; the privacy numbers stand)
    findings += [Finding(w.pitfall, w.title, w.applies, "low" if w.applies else "info", w.reason)
                 for w in utility_warnings(trace.manifest, every_record, trace.ledger)]
    return findings
