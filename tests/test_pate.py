"""GNMax / Confident-GNMax (PATE 2018) and Hot PATE aggregators."""
import math

import numpy as np
import pytest
from scipy.stats import norm

from dpledger.accounting import DEFAULT_ORDERS, DivergenceDirection, NeighbouringRelation
from dpledger.mechanisms import (ConfidentGNMax, DPWeightedSampler, GNMax, Targmax, ThresholdWeightedSampler, cast_votes,
                        data_dependent_gnmax_rdp, log_q_gnmax, renyi_divergence, vote_histogram)
from tests.conftest import lm_like

ORDERS = np.asarray(DEFAULT_ORDERS)


def test_gnmax_data_independent_curve_and_relation():
    gnmax = GNMax(sigma=40.0)
    np.testing.assert_allclose(gnmax.rdp_values(ORDERS), ORDERS / 1600)
    assert gnmax.relation is NeighbouringRelation.REPLACE_ONE
    confident = ConfidentGNMax(threshold=150, sigma_threshold=150, sigma=40)
    np.testing.assert_allclose(confident.rdp_values(ORDERS), ORDERS / (2 * 150 ** 2) + ORDERS / 1600)


def two_class_gnmax_output(counts, sigma):
    """Exact GNMax output distribution over 2 classes: Pr[class 0] = Pr[N(0, 2 sigma^2) > c1 - c0]."""
    first = norm.sf(counts[1] - counts[0], scale=math.sqrt(2) * sigma)
    return np.array([first, 1 - first])


@pytest.mark.parametrize("gap", [6, 40, 120, 250])
def test_data_dependent_bound_covers_exact_divergence_of_every_neighbour(gap):
    sigma = 20.0
    counts = np.array([150 + gap // 2, 150 - gap // 2])
    orders = np.array([2.0, 5.0, 10.0, 20.0])
    forward = GNMax(sigma).data_dependent_rdp(counts, orders, DivergenceDirection.FROM_ACTUAL)
    both = GNMax(sigma).data_dependent_rdp(counts, orders)
    assert np.all(forward <= both) and np.all(both <= orders / sigma ** 2 + 1e-15)
    here = two_class_gnmax_output(counts, sigma)
    for neighbour in (counts + [-1, 1], counts + [1, -1]):  # replace one teacher's vote
        there = two_class_gnmax_output(neighbour, sigma)
        assert np.all(renyi_divergence(here, there, orders) <= forward + 1e-12)
        assert np.all(renyi_divergence(here, there, orders, symmetric=True) <= both + 1e-12)


def test_reverse_direction_exceeds_theorem_6_and_the_symmetric_bound_covers_it():
    """Counts (9, 1), sigma 1, order 2: D(M(D') || M(D)) = 0.0157 for D' = (8, 2), against
    Theorem 6's forward bound 1.35e-4 (Papernot et al. 2018 bound one direction only)."""
    gnmax, orders = GNMax(1.0), np.array([2.0])
    here, there = two_class_gnmax_output([9, 1], 1.0), two_class_gnmax_output([8, 2], 1.0)
    reverse = renyi_divergence(there, here, orders)[0]
    assert reverse == pytest.approx(0.0157, abs=1e-4)
    assert gnmax.data_dependent_rdp([9, 1], orders, DivergenceDirection.FROM_ACTUAL)[0] == pytest.approx(1.35e-4, rel=1e-2)
    assert gnmax.data_dependent_rdp([9, 1], orders)[0] >= reverse
    curve = gnmax.data_dependent_curve([9, 1], DEFAULT_ORDERS, DivergenceDirection.FROM_ACTUAL)
    assert curve.direction is DivergenceDirection.FROM_ACTUAL and curve.data_dependent
    assert (curve + gnmax.rdp_curve()).direction is DivergenceDirection.FROM_ACTUAL
    assert gnmax.data_dependent_curve([9, 1]).direction is DivergenceDirection.BOTH


def test_data_dependent_bound_improves_for_confident_histograms_and_vanishes_as_gap_grows():
    sigma, orders = 40.0, np.array([2.0, 10.0, 20.0])
    weak = data_dependent_gnmax_rdp(log_q_gnmax(np.array([130, 120, 0]), sigma), sigma, orders)
    strong = data_dependent_gnmax_rdp(log_q_gnmax(np.array([250, 5, 0]), sigma), sigma, orders)
    np.testing.assert_allclose(weak, orders / sigma ** 2)  # validity conditions fail: fall back
    assert np.all(strong < orders / sigma ** 2 / 10)
    huge = data_dependent_gnmax_rdp(log_q_gnmax(np.array([10_000, 0, 0]), sigma), sigma, orders)
    assert np.all(huge < 1e-20)


def test_log_q_union_bound_and_cap():
    counts = np.array([10.0, 10.0, 10.0])
    assert log_q_gnmax(counts, 5.0) == pytest.approx(math.log(2 / 3))


def test_coordinated_votes_keep_marginals_and_agree_more_than_independent(rng):
    teachers = np.stack([lm_like(rng, 6, temperature=1.0)] * 2)
    teachers[1] = 0.8 * teachers[1] + 0.2 * lm_like(rng, 6, temperature=1.0)
    trials = 4000
    hot = np.stack([cast_votes(teachers, True, seed) for seed in range(trials)])
    cold = np.stack([cast_votes(teachers, False, seed) for seed in range(trials)])
    frequency = vote_histogram(hot[:, 0:1], 6).sum(axis=0) / trials
    assert np.max(np.abs(frequency - teachers[0])) < 0.03  # marginal is p_i
    tv = 0.5 * np.abs(teachers[0] - teachers[1]).sum()
    hot_agreement = np.mean(hot[:, 0] == hot[:, 1])
    assert hot_agreement >= (1 - tv) / (1 + tv) - 0.02
    assert hot_agreement > np.mean(cold[:, 0] == cold[:, 1]) + 0.2


def test_threshold_aggregators_never_release_low_counts(rng):
    counts = np.array([7, 3, 0, 10])
    assert Targmax(threshold=8).aggregate(counts) == 3
    assert Targmax(threshold=11).aggregate(counts) is None
    tws = ThresholdWeightedSampler(threshold=5, gamma=1.25)
    probs = tws.probabilities(counts)
    np.testing.assert_allclose(probs, [7 / 17, 0, 0, 10 / 17])  # normaliser max(20 / 1.25, 17) = 17
    assert np.all(probs <= 1.25 * counts / counts.sum() + 1e-15)
    with pytest.raises(ValueError, match="gamma must be >= 1, got 0.5"):
        ThresholdWeightedSampler(threshold=5, gamma=0.5)
    draws = [tws.aggregate(counts, rng) for _ in range(500)]
    assert set(draws) <= {0, 3, None}
    assert np.all(np.isinf(tws.rdp_values(ORDERS)))  # threshold privacy is not DP


def test_dpws_curve_is_gaussian_with_replace_one_sensitivity(rng):
    dpws = DPWeightedSampler(sigma=3.0, threshold=5, gamma=1.0)
    np.testing.assert_allclose(dpws.rdp_values(ORDERS), ORDERS / 9)
    outputs = [dpws.aggregate(np.array([0, 0, 40, 0]), rng) for _ in range(200)]
    assert outputs.count(2) > 150


@pytest.mark.parametrize("sigma", [0.3, 1.0, 7.5, 40.0])
def test_dpws_curve_is_the_gaussian_mechanism_with_sensitivity_sqrt_2(sigma):
    """DPWS's curve against the mpmath oracle: the Gaussian mechanism on a histogram whose L2
    sensitivity under replace-one is sqrt(2) (noise multiplier sigma / sqrt(2); Mironov 2017, Cor. 3)."""
    from tests import oracles as O

    values = DPWeightedSampler(sigma, threshold=2.0, gamma=1.0).rdp_values(ORDERS)
    for order, value in zip(ORDERS, values):
        exact = O.gaussian_rdp(order, sigma / math.sqrt(2.0))
        assert float(exact) <= value * (1 + 1e-15) and value <= float(exact) * (1 + 1e-12)
