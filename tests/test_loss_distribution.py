"""Certified lower bounds on epsilon(delta) from exact laws, checked against mechanisms whose
epsilon(delta) is known exactly: randomized response (a binomial sum), the Gaussian mechanism
(Balle & Wang 2018, Theorem 8, and dp-accounting's PLD accountant), and laws with impossible outcomes.
Every bound must be at or below the truth, and within 10% of it with exact laws (here within 5%)."""
from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy.special import comb
from scipy.stats import norm

from dpledger.accounting.loss_distribution import LossDistribution, pair_epsilon_lower_bound


def _bisect(delta_of, delta, high):
    low = 0.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if delta_of(middle) > delta else (low, middle)
    return high


@pytest.mark.parametrize("epsilon0, rounds", [(0.5, 200), (2.0, 10), (0.05, 1000)])
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_randomized_response_composed_is_bracketed_from_below(epsilon0, rounds, delta):
    keep = math.exp(epsilon0) / (1 + math.exp(epsilon0))
    log_p = np.log([keep, 1 - keep])

    def exact(eps):  # k flips of randomized response: the loss is (rounds - 2 j) epsilon0 with binomial weight
        return sum(comb(rounds, j, exact=True) * keep ** (rounds - j) * (1 - keep) ** j
                   * -math.expm1(eps - (rounds - 2 * j) * epsilon0)
                   for j in range(rounds + 1) if (rounds - 2 * j) * epsilon0 > eps)

    truth = _bisect(exact, delta, rounds * epsilon0)
    composed = LossDistribution.composed([LossDistribution.from_log_laws(log_p, log_p[::-1], 1e-4)] * rounds)
    lower = composed.epsilon(delta)
    assert lower <= truth and lower >= 0.95 * truth, (lower, truth)  # rounding down costs at most steps * interval
    for eps in np.linspace(0.0, truth * 1.5, 7):
        assert composed.delta(eps) <= exact(eps) + 1e-15


@pytest.mark.parametrize("sigma, steps", [(4.0, 100), (1.0, 1), (20.0, 1000)])
def test_the_gaussian_mechanism_seen_through_bins_is_bracketed_from_below(sigma, steps):
    """Binning the Gaussian's output is a post-processing: its losses lower-bound the Gaussian's,
    whose epsilon(delta) is exact (Balle & Wang 2018) and dp-accounting's PLD bounds from above."""
    delta = 1e-5
    edges = np.concatenate([[-np.inf], np.linspace(-40 * sigma, 40 * sigma + 1, 40001), [np.inf]])
    with np.errstate(divide="ignore"):
        log_p = np.log(np.diff(norm.cdf(edges / sigma)))
        log_q = np.log(np.diff(norm.cdf((edges - 1) / sigma)))
    forward = LossDistribution.composed([LossDistribution.from_log_laws(log_p, log_q, 1e-4)] * steps)
    backward = LossDistribution.composed([LossDistribution.from_log_laws(log_q, log_p, 1e-4)] * steps)
    lower = pair_epsilon_lower_bound(forward, backward, delta)
    mu = math.sqrt(steps) / sigma
    truth = _bisect(lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2), delta, 200.0)
    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(sigma), steps)
    assert lower <= truth <= accountant.get_epsilon(delta) + 1e-9
    assert lower >= 0.99 * truth, (lower, truth)


def test_impossible_outcomes_count_fully_and_compose_exactly():
    """An outcome the second law cannot produce has loss +inf: it counts towards delta at every epsilon."""
    log_p, log_q = np.log([0.5, 0.5]), np.array([0.0, -np.inf])
    one = LossDistribution.from_log_laws(log_p, log_q, 1e-3)
    assert one.infinite == pytest.approx(0.5, rel=1e-9) and one.epsilon(0.4) == math.inf
    three = LossDistribution.composed([one] * 3)
    assert three.infinite == pytest.approx(1 - 0.5 ** 3, rel=1e-9)
    assert three.delta(100.0) == pytest.approx(0.875, rel=1e-9) and three.delta(100.0) <= 0.875


def test_discretisation_never_rounds_a_loss_up_and_truncation_only_lowers_delta():
    rng = np.random.default_rng(5)
    for _ in range(200):
        p = rng.dirichlet(np.full(6, 0.3))
        q = rng.dirichlet(np.full(6, 0.3))
        with np.errstate(divide="ignore"):
            one = LossDistribution.from_log_laws(np.log(p), np.log(q), 10 ** rng.uniform(-4, -1))
        for eps in (0.0, 0.3, 1.0, 3.0):
            exact = float(np.sum(np.maximum(p - math.exp(eps) * q, 0.0)))
            assert one.delta(eps) <= exact


def test_a_balanced_tree_equals_a_chain_and_nan_is_refused():
    rng = np.random.default_rng(1)
    parts = [LossDistribution.from_log_laws(np.log(rng.dirichlet(np.ones(40))), np.log(rng.dirichlet(np.ones(40))),
                                            1e-3) for _ in range(9)]
    chain = parts[0]
    for part in parts[1:]:
        chain = chain.compose(part)
    tree = LossDistribution.composed(parts)
    assert tree.steps == chain.steps == 9
    # both lie in [exact - rounding, exact]: coarsened at different points, they differ by less
    assert abs(tree.epsilon(1e-3) - chain.epsilon(1e-3)) <= max(tree.rounding, chain.rounding)
    with pytest.raises(ValueError, match="NaN"):
        LossDistribution.from_log_laws([0.0, math.nan], [0.0, -1.0], 1e-3)


def test_a_running_composition_equals_the_tree_and_holds_few_distributions():
    from dpledger.accounting.loss_distribution import RunningComposition

    rng = np.random.default_rng(2)
    parts = [LossDistribution.from_log_laws(np.log(rng.dirichlet(np.ones(30))), np.log(rng.dirichlet(np.ones(30))),
                                            1e-3) for _ in range(37)]
    running = RunningComposition()
    for part in parts:
        running.add(part)
        assert len(running._stack) <= 6  # a binary counter: log2(37) + 1
    assert running.result().epsilon(1e-3) == pytest.approx(LossDistribution.composed(parts).epsilon(1e-3), rel=1e-9)
    assert RunningComposition().result() is None


def test_sparse_steps_compose_to_the_direct_convolution():
    """One step's law has few outcomes on a fine grid: composing by pairs of occupied cells gives
    the convolution's masses, with its summation error counted."""
    rng = np.random.default_rng(5)
    first, second = (LossDistribution.from_log_laws(np.log(rng.dirichlet(np.ones(12))),
                                                    np.log(rng.dirichlet(np.ones(12))), 2e-3) for _ in range(2))
    assert np.count_nonzero(first.mass) * np.count_nonzero(second.mass) < first.mass.size
    composed = first.compose(second)
    direct = np.convolve(first.mass, second.mass)
    start = composed.offset - (first.offset + second.offset)
    assert np.allclose(composed.mass, direct[start:start + composed.mass.size], rtol=1e-13, atol=0)
    assert composed.interval == 2e-3 and 0 < composed.error < 1e-13 and composed.rounding == 4e-3
