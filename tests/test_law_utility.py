"""reports.law_utility against direct per-query computations on generated laws."""
import math

import numpy as np
import pytest

from dpledger.reports.law_utility import output_law_utility


def _random_laws(rng, queries, vocabulary):
    laws = rng.dirichlet(np.full(vocabulary, 0.3), size=queries)
    return laws


@pytest.mark.parametrize("seed", range(5))
def test_metrics_match_per_query_definitions(seed):
    rng = np.random.default_rng(seed)
    queries, vocabulary = 7, 11
    output, reference = _random_laws(rng, queries, vocabulary), _random_laws(rng, queries, vocabulary)
    targets = rng.integers(0, vocabulary, size=queries)
    got = output_law_utility(output, reference, targets)
    tv = sum(0.5 * sum(abs(output[q, j] - reference[q, j]) for j in range(vocabulary)) for q in range(queries)) / queries
    assert got["tv_to_reference"] == pytest.approx(tv, rel=1e-12)
    top1 = sum(output[q, int(np.argmax(reference[q]))] for q in range(queries)) / queries
    assert got["reference_top1_mass"] == pytest.approx(top1, rel=1e-12)
    assert got["target_probability"] == pytest.approx(np.mean([output[q, targets[q]] for q in range(queries)]))
    assert got["target_cross_entropy"] == pytest.approx(np.mean([-math.log(output[q, targets[q]]) for q in range(queries)]))


def test_reference_itself_is_at_distance_zero_and_zero_target_mass_is_infinite_loss():
    reference = np.array([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]])
    got = output_law_utility(reference, reference, np.array([2, 1]))
    assert got["tv_to_reference"] == 0.0
    assert got["target_cross_entropy"] == math.inf
    assert got["target_probability"] == pytest.approx(0.5)
    assert output_law_utility(reference, reference)["target_probability"] is None


@pytest.mark.parametrize("bad, message", [
    (np.array([[0.5, 0.6]]), "sum to 1"),
    (np.array([[np.nan, 1.0]]), "finite and nonnegative"),
    (np.array([1.0, 0.0]), "(queries, vocabulary)"),
])
def test_bad_laws_are_refused_with_the_constraint(bad, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        output_law_utility(bad, np.array([[0.5, 0.5]]))


def test_out_of_range_targets_are_refused():
    laws = np.array([[0.5, 0.5]])
    with pytest.raises(ValueError, match=r"targets must be in \[0, 2\)"):
        output_law_utility(laws, laws, np.array([2]))
