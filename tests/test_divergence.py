"""Renyi divergence against mpmath at 60 digits, including order 18 with probabilities down to 1e-30."""
import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpledger import renyi_divergence
from tests.conftest import lm_like

mpmath.mp.dps = 60


def mp_renyi(p, q, alpha):
    total = mpmath.mpf(0)
    for pj, qj in zip(p, q):
        pj, qj = mpmath.mpf(float(pj)), mpmath.mpf(float(qj))
        if pj == 0:
            continue
        if qj == 0:
            return mpmath.inf
        total += pj ** alpha * qj ** (1 - alpha)
    return mpmath.log(total) / (alpha - 1)


def tiny_tail_pair():
    p = np.array([1e-30, 3e-25, 1e-12, 0.3, 0.7 - 1e-12 - 3e-25 - 1e-30])
    q = np.array([2e-28, 1e-30, 5e-9, 0.6, 0.4 - 5e-9 - 2e-28 - 1e-30])
    return p, q


@pytest.mark.parametrize("alpha", [1.1, 2.0, 6.0, 18.0, 64.0])
def test_matches_mpmath_with_extreme_tails(alpha):
    p, q = tiny_tail_pair()
    ours = renyi_divergence(p, q, alpha)
    reference = float(mp_renyi(p, q, alpha))
    # never below; above by at most twice the kernel's documented rounding-up (mechanisms/kernels.py)
    largest = np.abs(np.log(p)).max() + np.abs(np.log(q)).max() + 2.0
    rounding = 8 * 2.0 ** -52 * ((alpha + 1) * largest + np.log2(p.size) + 2 + (alpha - 1) * reference) / (alpha - 1)
    assert reference * (1 - 1e-15) <= ours <= reference * (1 + 1e-12) + 2 * rounding


@pytest.mark.parametrize("alpha", [2.0, 18.0])
def test_matches_mpmath_on_lm_like_distributions(rng, alpha):
    p, q = lm_like(rng, 300), lm_like(rng, 300)
    assert renyi_divergence(p, q, alpha) == pytest.approx(float(mp_renyi(p, q, alpha)), rel=1e-11)


def test_order_18_tiny_probabilities_do_not_underflow_in_float32_input():
    p, q = tiny_tail_pair()
    ours = renyi_divergence(torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32), 18.0)
    assert ours.dtype == torch.float64 and torch.isfinite(ours)
    # float32 rounds the inputs, so compare with mpmath on the rounded inputs
    p32, q32 = p.astype(np.float32).astype(np.float64), q.astype(np.float32).astype(np.float64)
    assert float(ours) == pytest.approx(float(mp_renyi(p32 / p32.sum(), q32 / q32.sum(), 18)), rel=1e-5)


def test_symmetric_is_max_of_both_directions(rng):
    p, q = lm_like(rng, 50), lm_like(rng, 50)
    both = max(renyi_divergence(p, q, 6.0), renyi_divergence(q, p, 6.0))
    assert renyi_divergence(p, q, 6.0, symmetric=True) == pytest.approx(both, rel=1e-15)


def test_support_mismatch_is_infinite_and_zero_over_zero_contributes_nothing():
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.5, 0.0, 0.5])
    assert renyi_divergence(p, q, 2.0) == np.inf
    shared_zero = renyi_divergence(np.array([0.5, 0.5, 0.0]), np.array([0.25, 0.75, 0.0]), 3.0)
    assert np.isfinite(shared_zero)
    assert shared_zero == pytest.approx(float(mp_renyi([0.5, 0.5], [0.25, 0.75], 3)), rel=1e-13)


def test_batched_over_leading_axes_and_orders(rng):
    p, q = lm_like(rng, 40, (3, 4)), lm_like(rng, 40, (4,))
    orders = [1.5, 2.0, 18.0]
    batched = renyi_divergence(p, q, orders)
    assert batched.shape == (3, 4, 3)
    assert batched[2, 1, 2] == pytest.approx(renyi_divergence(p[2, 1], q[1], 18.0), rel=1e-14)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), a1=st.floats(1.01, 60), a2=st.floats(1.01, 60))
def test_non_decreasing_in_order(seed, a1, a2):
    rng = np.random.default_rng(seed)
    p, q = lm_like(rng, 30), lm_like(rng, 30)
    low, high = sorted([a1, a2])
    assert renyi_divergence(p, q, low) <= renyi_divergence(p, q, high) * (1 + 1e-12) + 1e-15


@pytest.mark.parametrize("p, q, alpha, message", [
    (np.array([0.5, np.nan, 0.5]), np.array([1 / 3] * 3), 2.0, "NaN"),
    (np.array([1.2, -0.2]), np.array([0.5, 0.5]), 2.0, "non-negative, got entry -0.2"),
    (np.array([0.5, 0.4]), np.array([0.5, 0.5]), 2.0, "sum to 1"),
    (np.array([0.5, 0.5]), np.array([1 / 3] * 3), 2.0, "vocabulary"),
    (np.array([0.5, 0.5]), np.array([0.5, 0.5]), 1.0, "must be > 1, got 1"),
    (np.array([0.5, 0.5]), np.array([0.5, 0.5]), 0.5, "must be > 1, got 0.5"),
    (np.ones((2, 2)) / 2, np.ones((3, 2)) / 2, 2.0, "broadcastable"),
])
def test_invalid_inputs_name_the_constraint(p, q, alpha, message):
    with pytest.raises(ValueError, match=message):
        renyi_divergence(p, q, alpha)
