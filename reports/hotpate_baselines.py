"""Baselines on the same teachers as Hot PATE (issue 28, item 3): at each target epsilon, DP-ICL's
averaged-distribution aggregation over the public top-k (Tang et al. 2023) and PMixED (Flemings et al. 2024),
each calibrated to that epsilon over the same budget of queries, beside two anchors: the non-private ensemble
(the teachers' mean law, the reference itself) and the public model alone (no private data, epsilon 0).

Every mechanism is scored on its exact output law at each teacher-forced query, with the one metric set of
dpledger.reports.law_utility: total variation to the teachers' mean law, mass on the reference's top token,
and, with the true next tokens, their mean probability and cross-entropy. DP-ICL releases an argmax, so its
law is that of report-noisy-max (quadrature, or Monte Carlo with a stated sample count); PMixED samples from
its mixture, which is its law exactly.
"""
from __future__ import annotations

from typing import Sequence, cast

import numpy as np
import numpy.typing as npt

from dpledger.accounting.errors import require, require_in_open, require_int_at_least, require_positive
from dpledger.accounting.relation import NeighbouringRelation, neighbouring_relation
from dpledger.mechanisms.ball import Ball
from dpledger.mechanisms.calibration import calibrate_pmixed_order, require_query_count
from dpledger.mechanisms.distributions import validated_ensemble
from dpledger.mechanisms.dp_icl import DPICL, calibrate_dp_icl
from dpledger.mechanisms.pmixed import PMixED
from dpledger.reports.law_utility import finite_utility, output_law_utility

DP_ICL_TOP_K = 100
"""Tang et al. 2023 restrict the teachers to the public model's 100 most likely tokens."""
RELATION = NeighbouringRelation.ADD_OR_REMOVE_ONE
"""The baselines' default relation, one teacher added or removed (PMixED has no replace-one bound)."""


def _row(mechanism: str, target_epsilon: float | None, epsilon: float | None, epsilon_label: str, delta: float,
         budget_queries: int, parameters: dict[str, object], law_label: str,
         metrics: dict[str, float | None], relation: NeighbouringRelation = RELATION) -> dict[str, object]:
    """One row; a non-finite metric (a cross-entropy of +inf) is written as None with a note in `notes`
    (law_utility.finite_utility), so that the row stays strict JSON."""
    finite = finite_utility(metrics)
    notes = [f"{name.removesuffix('_note')} is {finite.pop(name)}, written as null"
             for name in [key for key in finite if key.endswith("_note")]]
    return {"mechanism": mechanism, "target_epsilon": target_epsilon, "epsilon": epsilon,
            "epsilon_label": epsilon_label, "delta": delta, "budget_queries": budget_queries,
            "relation": relation.value, "parameters": parameters, "law": law_label, **finite, "notes": notes}


def baseline_rows(teachers: npt.ArrayLike, public: npt.ArrayLike, targets: npt.ArrayLike | None,
                  epsilons: Sequence[float], delta: float, budget_queries: int, samples: int | None = None,
                  seed: int = 0, top_k: int = DP_ICL_TOP_K,
                  relation: NeighbouringRelation | str = RELATION) -> list[dict[str, object]]:
    """The frontier rows of the module docstring: two anchors, then DP-ICL and PMixED at each target epsilon.

    Calibration: DP-ICL's sigma is the smallest whose Gaussian curve composed `budget_queries` times
    converts to at most the target at `delta` (dpledger.mechanisms.dp_icl.calibrate_dp_icl); PMixED's beta
    the largest over its candidate projection orders with the proof-orders ball, Theorem 3.1 proven there
    (dpledger.mechanisms.calibration.calibrate_pmixed_order). Each row's `epsilon` is the calibration's
    forward epsilon (<= the target); a target out of PMixED's reach gives a row with epsilon and metrics None
    and the reason in `notes`.

    Args:
        teachers: (Q, N, V) teacher next-token distributions.
        public: (Q, V) public next-token distributions.
        targets: (Q,) the true next tokens, or None when unknown.
        epsilons: the target epsilons (each > 0), in the order the rows list them.
        delta: the delta of every epsilon, in (0, 1).
        budget_queries: the queries each calibration is charged for (>= 1), whatever Q is.
        samples: None for DP-ICL's law by quadrature; else the Monte Carlo releases per query (>= 1).
        seed: the seed of the Monte Carlo releases (>= 0).
        top_k: DP-ICL's public candidate count k (>= 1; V if larger).
        relation: the neighbouring relation every epsilon holds for: add_or_remove_one, or replace_one (DP-ICL
            at L2 sensitivity sqrt(2); PMixED has no replace-one bound, so its rows then say so, epsilon None).

    Returns:
        A list of strict-JSON-serialisable dicts with keys mechanism, target_epsilon, epsilon,
        epsilon_label, delta, budget_queries, relation, parameters, law, the law_utility metrics and notes.

    Raises:
        ValueError: if the distributions are invalid or their shapes disagree, a target or epsilon is
            out of range, or an option is.
    """
    teachers_np, public_np = validated_ensemble(teachers, public, None)
    require(teachers_np.ndim == 3, f"teachers must be a (Q, N, V) array, got shape {teachers_np.shape}")
    tokens = None if targets is None else np.asarray(targets)
    require(len(epsilons) >= 1, "epsilons must name at least one target epsilon, got none")
    targets_epsilon = [require_positive("epsilon", value) for value in epsilons]
    delta = require_in_open("delta", delta, 0.0, 1.0)
    budget_queries = require_query_count("budget_queries", budget_queries)
    seed = require_int_at_least("seed", seed, 0)
    if samples is not None:
        samples = require_int_at_least("samples", samples, 1)
    top_k = min(require_int_at_least("top_k", top_k, 1), teachers_np.shape[-1])
    relation = neighbouring_relation(relation)
    require(relation in (NeighbouringRelation.ADD_OR_REMOVE_ONE, NeighbouringRelation.REPLACE_ONE),
            f"relation must be add_or_remove_one or replace_one, got {relation.value}")
    sensitivity = "sqrt(2)" if relation is NeighbouringRelation.REPLACE_ONE else "1"
    gaussian = "a / sigma^2" if relation is NeighbouringRelation.REPLACE_ONE else "a / (2 sigma^2)"
    reference = teachers_np.mean(axis=1)
    ensemble_size = teachers_np.shape[1]

    def metrics(laws: np.ndarray) -> dict[str, float | None]:
        return output_law_utility(laws, reference, tokens)

    rows = [
        _row("non-private ensemble", None, None, "no privacy: the teachers' mean law itself (no finite epsilon)",
             delta, budget_queries, {"teachers": ensemble_size}, "exact (the reference)", metrics(reference), relation),
        _row("public model", None, 0.0, "reads no private data: epsilon 0", delta, budget_queries, {},
             "exact (the public law)", metrics(public_np), relation),
    ]
    rng = np.random.default_rng(seed)
    for target in targets_epsilon:
        dp_icl = calibrate_dp_icl(target, delta, budget_queries, top_k, relation=relation)
        noisy_max = cast(DPICL, dp_icl.mechanism)  # calibrate_dp_icl builds a DPICL
        if samples is None:
            laws, error = noisy_max.output_law(teachers_np, public_np)
            law_label = f"quadrature of report-noisy-max's law (relative error estimate {error:.1e})"
        else:
            laws = noisy_max.monte_carlo_output_law(teachers_np, public_np, samples, rng)
            law_label = f"Monte Carlo, {samples} releases per query (seed {seed})"
        rows.append(_row(
            "dp-icl", target, dp_icl.forward_epsilon,
            f"Gaussian RDP {gaussian} at L2 sensitivity {sensitivity} (Mironov 2017, Corollary 3) composed over "
            f"{budget_queries} queries, converted at delta (Balle et al. 2020, Theorem 21); sigma calibrated",
            delta, budget_queries, {"sigma": dp_icl.value, "sigma_on_mean": dp_icl.value / ensemble_size,
                                    "top_k": top_k}, law_label, metrics(laws), relation))
        if relation is not RELATION:
            row = _row("pmixed", target, None, "not covered", delta, budget_queries, {}, "none",
                       dict.fromkeys(("tv_to_reference", "reference_top1_mass", "target_probability",
                                      "target_cross_entropy")), relation)
            row["notes"] = ["PMixED's Theorem 3.1 (Flemings et al. 2024) bounds adding or removing one teacher; "
                            "it gives no replace-one epsilon"]
            rows.append(row)
            continue
        try:
            pmixed = calibrate_pmixed_order(target, delta, budget_queries, ensemble_size, ball=Ball.PROOF_ORDERS)
        except ValueError as error:
            if "out of reach" not in str(error):
                raise
            row = _row("pmixed", target, None, "out of reach", delta, budget_queries, {}, "none",
                       {name: None for name in ("tv_to_reference", "reference_top1_mass", "target_probability",
                                                "target_cross_entropy")})
            row["notes"] = [str(error)]
            rows.append(row)
            continue
        mixture = cast(PMixED, pmixed.mechanism)  # calibrate_pmixed_order builds a PMixED
        rows.append(_row(
            "pmixed", target, pmixed.forward_epsilon,
            f"Theorem 3.1 (Flemings et al. 2024) at order <= alpha, proof-orders ball (proven), composed over "
            f"{budget_queries} queries, converted at delta (Balle et al. 2020, Theorem 21); beta calibrated at the "
            "candidate alpha allowing the largest beta",
            delta, budget_queries, {"alpha": pmixed.fixed["alpha"], "beta": pmixed.value, "ball": Ball.PROOF_ORDERS.value,
                                    "teachers": ensemble_size},
            "exact (the mixture PMixED samples from)", metrics(mixture.output_distribution(teachers_np, public_np))))
    return rows
