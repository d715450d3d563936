"""Hot PATE aggregators off the decode path: sampling and output laws of an aggregator built without an
ensemble (teachers None, as `dpledger account`, `calibrate` and `verify` build them)."""
import numpy as np
import pytest

from dpledger.accounting.relation import NeighbouringRelation
from dpledger.mechanisms.hot_pate import DPWeightedSampler
from dpledger.mechanisms.hot_pate_aggregators import DpargmaxAggregator, DpwsAggregator


def test_dpws_sample_outputs_without_voters_normalises_by_the_histogram_total():
    """Without a public voter count DPWS's n is the histogram's own total, as DPWeightedSampler reads it
    (it used to divide None by gamma: TypeError)."""
    counts = np.array([6, 0, 0])
    aggregator = DpwsAggregator(sigma=0.1, threshold=1.0, relation=NeighbouringRelation.REPLACE_ONE)
    draws = aggregator.sample_outputs(counts, 2000, np.random.default_rng(0))
    law = DPWeightedSampler(0.1, 1.0, 1.0).probabilities_given_noise(counts, np.zeros(3))
    assert law[0] == pytest.approx(1.0)  # noise-free: n = 6, so token 0 is released surely
    assert np.mean(draws == 0) > 0.95
    # with 12 public voters the same histogram releases token 0 about half the time
    voters = DpwsAggregator(sigma=0.1, threshold=1.0, teachers=12, relation=NeighbouringRelation.REPLACE_ONE)
    assert np.mean(voters.sample_outputs(counts, 2000, np.random.default_rng(0)) == 0) == pytest.approx(0.5, abs=0.05)


def test_dpargmax_without_threshold_has_no_screen_law():
    """DPARGMAX accounted from parameters alone may lack T; its screen law and samples then need it."""
    aggregator = DpargmaxAggregator(sigma=1.0, sigma_threshold=1.0, relation=NeighbouringRelation.REPLACE_ONE)
    with pytest.raises(ValueError, match="threshold T"):
        aggregator.log_screen_law(np.array([5, 0, 1]))
    with pytest.raises(ValueError, match="threshold T"):
        aggregator.sample_outputs(np.array([5, 0, 1]), 10, np.random.default_rng(0))
