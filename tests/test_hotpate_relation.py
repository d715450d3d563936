"""`dpledger hotpate` states one relation for every epsilon (its accounting against dp-accounting at each
relation: tests/test_hotpate.py); the baselines on the same teachers share it; non-finite utilities stay out
of the JSON."""
import json

import numpy as np
import pytest

from dpledger.reports.hotpate import TeacherDistributions, finite_utility, hot_vs_cold, hotpate_markdown


def _data(seed=0, queries=3, teachers=12, vocabulary=30):
    rng = np.random.default_rng(seed)
    base = rng.normal(0.0, 2.0, (queries, vocabulary))
    teacher_laws = np.exp(base[:, None] + rng.normal(0.0, 1.0, (queries, teachers, vocabulary)))
    public = np.exp(base)
    return TeacherDistributions(teacher_laws / teacher_laws.sum(-1, keepdims=True),
                                public / public.sum(-1, keepdims=True), rng.integers(0, vocabulary, queries))


@pytest.mark.parametrize("relation", ["add_or_remove_one", "replace_one"])
def test_every_dp_row_and_baseline_states_the_runs_relation(relation):
    result = hot_vs_cold(_data(), samples=8, epsilons=(4.0,), thresholds=(3, 6), relation=relation, baselines=True,
                         baseline_samples=50)
    payload = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert payload["relation"] == relation
    dp_rows = [row for row in payload["grid"] if row["epsilon"] is not None]
    assert dp_rows and all(row["relation"] == relation for row in dp_rows)
    assert {row["relation"] for row in payload["baselines"]} == {relation}
    pmixed = [row for row in payload["baselines"] if row["mechanism"] == "pmixed"]
    if relation == "replace_one":   # PMixED has no replace-one bound: said, not computed
        assert all(row["epsilon"] is None and "replace-one" in row["notes"][0] for row in pmixed)
    else:
        assert all(0 < row["epsilon"] <= 4.0 for row in pmixed)
    assert f"{relation}" in hotpate_markdown(result)


def test_an_unsupported_relation_is_one_line():
    with pytest.raises(ValueError, match="relation must be one of add_or_remove_one, replace_one, got remove_one"):
        hot_vs_cold(_data(), samples=4, epsilons=(4.0,), thresholds=(3,), relation="remove_one")


def test_an_infinite_cross_entropy_is_null_with_its_own_note():
    got = finite_utility({"tv_to_reference": 0.2, "target_cross_entropy": float("inf"), "target_probability": None})
    assert got["tv_to_reference"] == 0.2 and got["target_probability"] is None
    assert got["target_cross_entropy"] is None and "probability 0" in got["target_cross_entropy_note"]


def test_bad_baseline_samples_are_refused_before_any_work():
    with pytest.raises(ValueError, match="baseline_samples must be an integer >= 1, got 0"):
        hot_vs_cold(_data(), samples=4, epsilons=(4.0,), thresholds=(3,), baselines=True, baseline_samples=0)
