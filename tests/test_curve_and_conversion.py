"""RDP curves, composition and conversions, cross-checked against dp-accounting and closed forms."""
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dpa
from hypothesis import given, settings
from hypothesis import strategies as st

from dpledger.accounting import (DEFAULT_ORDERS, ConversionMethod, GridEdgeWarning, NeighbouringRelation, RdpCurve,
                        conversion_terms, delta_from_rdp, epsilon_from_rdp)

ORDERS = np.asarray(DEFAULT_ORDERS)


def gaussian_curve(sigma, relation=NeighbouringRelation.ADD_OR_REMOVE_ONE):
    return RdpCurve(DEFAULT_ORDERS, ORDERS / (2 * sigma ** 2), relation)


def test_default_grid_contains_dp_accounting_grid_and_paper_orders():
    assert set(np.round(dpa.DEFAULT_RDP_ORDERS, 10)) <= set(DEFAULT_ORDERS)
    assert 6.0 in DEFAULT_ORDERS and 18.0 in DEFAULT_ORDERS


def test_k_fold_composition_equals_k_times_one_step():
    one = gaussian_curve(3.0)
    summed = one
    for _ in range(6):
        summed = summed + one
    np.testing.assert_allclose(summed.values, one.composed(7).values, rtol=1e-15)
    # rounded upwards: the smallest float at or above the exact product, never below it
    for value, composed in zip(one.values, one.composed(7).values):
        assert Fraction(float(composed)) >= 7 * Fraction(float(value))
        assert Fraction(float(np.nextafter(composed, 0.0))) < 7 * Fraction(float(value))


def test_composition_propagates_data_dependence_and_refuses_mixed_relations():
    independent = gaussian_curve(2.0)
    dependent = RdpCurve(DEFAULT_ORDERS, ORDERS * 0.01, data_dependent=True)
    assert (independent + dependent).data_dependent
    assert not (independent + independent).data_dependent
    with pytest.raises(ValueError, match="cover no common neighbouring pair"):
        independent + gaussian_curve(2.0, NeighbouringRelation.REPLACE_ONE)


def test_infinite_value_means_no_guarantee_and_survives_json():
    values = np.where(ORDERS <= 6, 0.1, np.inf)
    curve = RdpCurve(DEFAULT_ORDERS, values)
    restored = RdpCurve.from_dict(curve.to_dict())
    np.testing.assert_array_equal(restored.values, values)
    assert curve.composed(0).values.max() == 0.0


@pytest.mark.parametrize("bad, message", [
    (np.full(len(DEFAULT_ORDERS), np.nan), "NaN"),
    (np.full(len(DEFAULT_ORDERS), -0.1), ">= 0"),
    (np.zeros(3), "one entry per order"),
])
def test_invalid_curve_values_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        RdpCurve(DEFAULT_ORDERS, bad)


def test_orders_must_exceed_one():
    with pytest.raises(ValueError, match="must be finite and > 1, got 1.0"):
        RdpCurve((1.0, 2.0), np.zeros(2))


@pytest.mark.parametrize("sigma", [0.8, 2.0, 10.0])
@pytest.mark.parametrize("steps", [1, 100, 10_000])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9])
def test_improved_conversion_matches_dp_accounting(sigma, steps, delta):
    curve = gaussian_curve(sigma).composed(steps)
    ours = epsilon_from_rdp(curve, delta)
    theirs, order = dpa.compute_epsilon(ORDERS, curve.values, delta)
    assert ours.epsilon == pytest.approx(theirs, rel=1e-12, abs=1e-12)
    if theirs > 0:
        assert ours.order == pytest.approx(order)


@pytest.mark.parametrize("sigma, steps", [(0.8, 1), (2.0, 100), (10.0, 10_000), (50.0, 1)])
@pytest.mark.parametrize("epsilon", [0.5, 2.0, 8.0])
def test_epsilon_to_delta_matches_dp_accounting(sigma, steps, epsilon):
    curve = gaussian_curve(sigma).composed(steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        ours = delta_from_rdp(curve, epsilon)
    theirs, _ = dpa.compute_delta(ORDERS, curve.values, epsilon)
    assert ours.delta == pytest.approx(theirs, rel=1e-10, abs=1e-300)


def test_classic_conversion_closed_form():
    curve = gaussian_curve(4.0).composed(50)
    result = epsilon_from_rdp(curve, 1e-6, ConversionMethod.CLASSIC)
    closed = np.min(curve.values + math.log(1e6) / (ORDERS - 1))
    assert result.epsilon == pytest.approx(closed, rel=1e-14)
    assert result.epsilon >= epsilon_from_rdp(curve, 1e-6).epsilon  # improved is never worse


def test_paper_conversion_term_at_order_18():
    # seed Table 2b: "RDP to DP (Theorem A.3) 0.450" at alpha = 18, delta = 1e-5
    term = conversion_terms(np.array([18.0]), 1e-5, ConversionMethod.IMPROVED)[0]
    closed = math.log(17 / 18) - (math.log(1e-5) + math.log(18)) / 17
    assert term == pytest.approx(closed, rel=1e-15)
    assert round(term, 3) == 0.450


def test_conversion_term_row_reconstructs_epsilon():
    curve = gaussian_curve(3.0).composed(20)
    result = epsilon_from_rdp(curve, 1e-5)
    assert result.rdp_at_order + result.conversion_term == pytest.approx(result.epsilon, abs=1e-15)


def test_grid_edge_is_warned():
    tiny = RdpCurve(DEFAULT_ORDERS, ORDERS * 1e-9)
    with pytest.warns(GridEdgeWarning, match="edge of the grid"):
        result = epsilon_from_rdp(tiny, 1e-5)
    assert result.at_grid_edge and result.order == DEFAULT_ORDERS[-1]


def test_no_guarantee_anywhere_gives_infinite_epsilon():
    curve = RdpCurve(DEFAULT_ORDERS, np.full(len(DEFAULT_ORDERS), np.inf))
    result = epsilon_from_rdp(curve, 1e-5)
    assert math.isinf(result.epsilon) and result.order is None


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 1.3, float("nan")])
def test_delta_outside_open_unit_interval_is_refused(delta):
    with pytest.raises(ValueError, match="delta"):
        epsilon_from_rdp(gaussian_curve(1.0), delta)


@settings(max_examples=60, deadline=None)
@given(sigma=st.floats(0.3, 50), steps=st.integers(1, 5000),
       d1=st.floats(1e-12, 0.5), d2=st.floats(1e-12, 0.5))
def test_epsilon_is_non_increasing_in_delta(sigma, steps, d1, d2):
    curve = gaussian_curve(sigma).composed(steps)
    small, large = sorted([d1, d2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        assert epsilon_from_rdp(curve, large).epsilon <= epsilon_from_rdp(curve, small).epsilon + 1e-12


@settings(max_examples=60, deadline=None)
@given(sigma=st.floats(0.3, 50), k1=st.integers(1, 500), k2=st.integers(1, 500))
def test_epsilon_is_non_decreasing_in_composition(sigma, k1, k2):
    one = gaussian_curve(sigma)
    fewer, more = sorted([k1, k2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        assert epsilon_from_rdp(one.composed(fewer), 1e-5).epsilon <= epsilon_from_rdp(one.composed(more), 1e-5).epsilon + 1e-12


@pytest.mark.parametrize("text", ["1e-5", b"1e-5", bytearray(b"1e-5"), memoryview(b"1e-5")])
def test_a_delta_given_as_text_is_refused_whatever_its_string_type(text):
    """A number given as text hides a caller's parsing bug. str and bytes were refused, but float()
    also parses a bytearray or memoryview, which were taken as numbers; each is refused alike."""
    with pytest.raises(ValueError, match="delta must be a real number"):
        epsilon_from_rdp(gaussian_curve(1.0), text)


@pytest.mark.parametrize("text", ["3", b"3", bytearray(b"3")])
def test_a_repeat_count_given_as_text_is_refused(text):
    with pytest.raises(ValueError, match="times must be an integer >= 0"):
        gaussian_curve(1.0).composed(text)
