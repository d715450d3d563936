"""dpledger.mechanisms.log_space.log_sum_exp against an mpmath oracle written from its definition
(log sum_j w_j e^(x_j), summed in 60-digit arithmetic): within its stated (M + 3) u, on generated
inputs, and exact in its special cases."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dpledger.mechanisms.log_space import log_sum_exp
from tests.conftest import examples

UNIT = 2.0 ** -53


def oracle(row: list[float], weights: list[float] | None) -> mpmath.mpf:
    with mpmath.workdps(60):
        total = mpmath.mpf(0)
        for j, x in enumerate(row):
            weight = 1 if weights is None else mpmath.mpf(weights[j])
            if x != -math.inf and weight != 0:
                total += weight * mpmath.exp(mpmath.mpf(x))
        return mpmath.log(total) if total > 0 else -mpmath.inf


@st.composite
def rows(draw):
    size = draw(st.integers(1, 40))
    scale = draw(st.sampled_from([1e-3, 1.0, 30.0, 700.0]))
    values = draw(st.lists(st.one_of(st.floats(-scale, scale), st.just(-math.inf)), min_size=size, max_size=size))
    weight = st.sampled_from([0.0, 1.0, 2.0, 3.0, 0.5]) | st.floats(1e-30, 1e30)   # uneven weights: 60 decades
    weights = draw(st.none() | st.lists(weight, min_size=size, max_size=size))
    return values, weights


@examples(200, 3000)
@given(rows())
def test_within_its_stated_rounding_of_the_exact_value(case):
    values, weights = case
    got = float(log_sum_exp(np.asarray(values), weights=None if weights is None else np.asarray(weights)))
    exact = oracle(values, weights)
    if exact == -mpmath.inf:
        assert got == -math.inf
        return
    # the docstring's (M + 3) u max(1, |y_m|), y_m the largest x_j + log w_j: |y_m| <= |exact| + log M
    allowed = (len(values) + 3) * UNIT * max(1.0, abs(float(exact)) + math.log(len(values)))
    assert abs(mpmath.mpf(got) - exact) <= allowed


def test_a_probability_near_one_keeps_its_relative_accuracy():
    # log(1 + e^-404.26) = 2.698e-176: the plain log of the sum would give 0
    got = float(log_sum_exp(np.array([0.0, -404.262491])))
    assert got == pytest.approx(float(mpmath.exp(-404.262491)), rel=1e-14) and got > 0


def test_special_values_and_axes():
    assert log_sum_exp(np.array([])) == -np.inf and log_sum_exp(np.zeros((3, 0)), axis=1).tolist() == [-np.inf] * 3
    assert log_sum_exp(np.array(2.5)) == 2.5
    assert np.isnan(log_sum_exp(np.array([1.0, 2.0]), weights=np.array([-1.0, 1.0])))   # weights are nonnegative
    # the largest weighted term is factored out: tiny or huge weights never overflow a quotient
    assert float(log_sum_exp(np.array([0.0, -1.0]), weights=np.array([1e-320, 1.0]))) == pytest.approx(-1.0, rel=1e-15)
    assert float(log_sum_exp(np.array([0.0, -1.0]), weights=np.array([1e-300, 1e300]))) == pytest.approx(
        float(mpmath.log(mpmath.mpf(1e-300) + mpmath.mpf(1e300) * mpmath.exp(-1))), rel=1e-15)
    assert log_sum_exp(np.array([-np.inf, -np.inf])) == -np.inf
    assert log_sum_exp(np.array([np.inf, 1.0])) == np.inf
    assert np.isnan(log_sum_exp(np.array([np.nan, 1.0])))
    assert np.isnan(log_sum_exp(np.array([1.0, 2.0]), weights=np.array([np.nan, 1.0])))   # a NaN weight is no 0
    assert np.isnan(log_sum_exp(np.array([np.nan, 2.0]), weights=np.array([0.0, 1.0])))   # nor drops a NaN value
    # a largest term of weight 0 adds nothing, however large
    assert float(log_sum_exp(np.array([900.0, -475.0]), weights=np.array([0.0, 2.0]))) == pytest.approx(-475.0 + math.log(2.0))
    grid = np.random.default_rng(3).normal(0, 5, (3, 4, 5))
    for axis in range(3):
        expected = np.log(np.sum(np.exp(grid), axis=axis))
        np.testing.assert_allclose(log_sum_exp(grid, axis=axis), expected, rtol=1e-13)
