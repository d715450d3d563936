"""Baselines on the same teachers (dpledger.reports.hotpate_baselines): rows on a generated ensemble, their
anchors, their calibrations and their limits, each against what the mechanism must give."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dpledger.mechanisms.calibration import CALIBRATION_TOLERANCE
from dpledger.reports.hotpate_baselines import baseline_rows

METRICS = ("tv_to_reference", "reference_top1_mass", "target_probability", "target_cross_entropy")


def synthetic_ensemble(seed: int = 0, queries: int = 10, teachers: int = 8, vocabulary: int = 24,
                       spread: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Teachers share the public model's logits plus a common private shift and their own noise of scale
    `spread`; the true next token is drawn from the teachers' mean law."""
    rng = np.random.default_rng(seed)
    public_logits = rng.normal(0.0, 2.0, (queries, vocabulary))
    shift = rng.normal(0.0, 2.0, (queries, 1, vocabulary))
    logits = public_logits[:, None, :] + shift + rng.normal(0.0, spread, (queries, teachers, vocabulary))
    teachers_law = np.exp(logits - logits.max(axis=-1, keepdims=True))
    teachers_law /= teachers_law.sum(axis=-1, keepdims=True)
    public = np.exp(public_logits - public_logits.max(axis=-1, keepdims=True))
    public /= public.sum(axis=-1, keepdims=True)
    mean = teachers_law.mean(axis=1)
    targets = np.array([rng.choice(vocabulary, p=row) for row in mean])
    return teachers_law, public, targets


def by_mechanism(rows: list[dict], name: str) -> list[dict]:
    return [row for row in rows if row["mechanism"] == name]


def test_rows_anchor_the_frontier_and_stay_within_their_targets():
    teachers, public, targets = synthetic_ensemble()
    epsilons = (1.0, 4.0, 8.0)
    rows = baseline_rows(teachers, public, targets, epsilons, 1e-5, 1000, top_k=10)
    json.dumps(rows, allow_nan=False)                                # strict JSON
    assert [row["mechanism"] for row in rows[:2]] == ["non-private ensemble", "public model"]
    ensemble, public_row = rows[:2]
    assert ensemble["tv_to_reference"] == 0.0 and ensemble["epsilon"] is None
    reference = teachers.mean(axis=1)
    expected_public_tv = 0.5 * np.abs(public - reference).sum(axis=1).mean()
    assert public_row["epsilon"] == 0.0
    assert public_row["tv_to_reference"] == pytest.approx(expected_public_tv, rel=1e-12) and expected_public_tv > 0.1
    assert ensemble["target_probability"] == pytest.approx(reference[np.arange(10), targets].mean(), rel=1e-12)
    for name in ("dp-icl", "pmixed"):
        private = by_mechanism(rows, name)
        assert [row["target_epsilon"] for row in private] == list(epsilons)
        for row in private:
            assert (1 - CALIBRATION_TOLERANCE) * row["target_epsilon"] <= row["epsilon"] <= row["target_epsilon"]
            assert row["delta"] == 1e-5 and row["budget_queries"] == 1000 and row["epsilon_label"]
            assert row["tv_to_reference"] > 0.0
    # more budget, less noise: DP-ICL's sigma falls and PMixED's beta grows with epsilon
    sigmas = [row["parameters"]["sigma"] for row in by_mechanism(rows, "dp-icl")]
    betas = [row["parameters"]["beta"] for row in by_mechanism(rows, "pmixed")]
    assert sigmas == sorted(sigmas, reverse=True) and betas == sorted(betas)


def test_large_budgets_approach_each_mechanisms_noiseless_limit():
    """PMixED without noise is the ensemble mean (every lambda 1); DP-ICL with the public top-k equal to the
    whole vocabulary releases the argmax of the teachers' summed laws, the reference's top token."""
    teachers, public, targets = synthetic_ensemble(seed=1, spread=0.3)
    rows = baseline_rows(teachers, public, targets, (600.0,), 0.5, 1, top_k=24)
    dp_icl, pmixed = by_mechanism(rows, "dp-icl")[0], by_mechanism(rows, "pmixed")[0]
    assert dp_icl["reference_top1_mass"] > 0.999
    assert pmixed["tv_to_reference"] < 0.05 < rows[1]["tv_to_reference"]


def test_monte_carlo_rows_agree_with_the_quadrature():
    teachers, public, targets = synthetic_ensemble(seed=2)
    exact = by_mechanism(baseline_rows(teachers, public, targets, (4.0,), 1e-5, 100, top_k=6), "dp-icl")[0]
    sampled = by_mechanism(baseline_rows(teachers, public, targets, (4.0,), 1e-5, 100, samples=20_000, seed=3,
                                         top_k=6), "dp-icl")[0]
    assert "Monte Carlo, 20000" in sampled["law"] and "quadrature" in exact["law"]
    for name in ("tv_to_reference", "reference_top1_mass", "target_probability"):
        assert sampled[name] == pytest.approx(exact[name], abs=0.02)


def test_a_target_token_outside_the_public_top_k_is_a_null_cross_entropy_with_a_note():
    teachers, public, targets = synthetic_ensemble(seed=4)
    outside = np.argsort(-public, axis=1)[:, -1]                      # every query's least likely public token
    row = by_mechanism(baseline_rows(teachers, public, outside, (4.0,), 1e-5, 100, top_k=3), "dp-icl")[0]
    assert row["target_cross_entropy"] is None and row["target_probability"] == 0.0
    assert any("target_cross_entropy is +inf" in note for note in row["notes"])


def test_without_targets_the_target_metrics_are_none():
    teachers, public, _ = synthetic_ensemble(seed=5, queries=3)
    rows = baseline_rows(teachers, public, None, (8.0,), 1e-5, 10, top_k=4)
    assert all(row["target_probability"] is None and row["target_cross_entropy"] is None for row in rows)


@pytest.mark.parametrize("change, message", [
    (dict(teachers=np.ones((3, 2, 4)) / 4, public=np.ones((2, 4)) / 4), "batch shape"),
    (dict(teachers=np.ones((2, 4)) / 4, public=np.ones(4) / 4), r"\(Q, N, V\)"),
    (dict(epsilons=()), "epsilons"),
    (dict(epsilons=(1.0, -2.0)), "epsilon"),
    (dict(delta=1.0), "delta"),
    (dict(budget_queries=0), "budget_queries"),
    (dict(samples=0), "samples"),
    (dict(top_k=0), "top_k"),
    (dict(targets=np.array([0, 99])), "targets"),
])
def test_bad_input_raises_one_line_value_errors(change, message):
    teachers, public, targets = synthetic_ensemble(seed=6, queries=2, vocabulary=4)
    arguments = dict(teachers=teachers, public=public, targets=targets, epsilons=(4.0,), delta=1e-5,
                     budget_queries=10)
    with pytest.raises(ValueError, match=message) as caught:
        baseline_rows(**{**arguments, **change})
    assert "\n" not in str(caught.value)


def test_a_target_out_of_pmixeds_reach_is_a_row_that_says_why():
    """PMixED's curve is +inf above its projection order (at most 64 here), so at epsilon 0.1 over 1000 queries
    the conversion term log(1/delta) / (alpha - 1) >= 0.18 alone exceeds the target; DP-ICL's Gaussian curve
    has every order and still meets it."""
    teachers, public, targets = synthetic_ensemble(seed=7, queries=2, vocabulary=6)
    rows = baseline_rows(teachers, public, targets, (0.1,), 1e-5, 1000, top_k=3)
    pmixed, dp_icl = by_mechanism(rows, "pmixed")[0], by_mechanism(rows, "dp-icl")[0]
    assert pmixed["epsilon"] is None and pmixed["epsilon_label"] == "out of reach"
    assert all(pmixed[name] is None for name in METRICS) and "out of reach" in pmixed["notes"][0]
    assert dp_icl["epsilon"] <= 0.1
    json.dumps(rows, allow_nan=False)
