"""Sums that decide privacy round towards privacy: checked against exact rational sums (Fraction)."""
import math
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dpledger.accounting import DEFAULT_ORDERS, PrivacyLedger, RdpCurve, compose_curves
from dpledger.accounting.budget import RenyiFilter
from dpledger.accounting.summation import ExactSum, UpperSum, up_add, up_multiply, upper_sum
from dpledger.decoding.budget import BudgetGate

EXACT = Fraction


def exact_column_sums(rows):
    return [sum((EXACT(float(v)) for v in column), EXACT(0)) for column in np.asarray(rows).T]


def assert_upper_and_tight(result, exact_sums, ulps=8):
    """Never below the exact sum; within `ulps` ulps of it (a compensated sum, not n ulps)."""
    for value, exact in zip(result, exact_sums):
        assert EXACT(float(value)) >= exact, (value, float(exact))
        if exact > 0:
            assert (EXACT(float(value)) - exact) <= ulps * EXACT(2.0 ** -52) * exact + EXACT(5e-324)


magnitudes = st.floats(min_value=-320, max_value=300)
charges = st.builds(lambda mantissa, exponent: mantissa * 10.0 ** exponent,
                    st.floats(min_value=0.0, max_value=1.0), magnitudes)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(charges, min_size=3, max_size=3), min_size=1, max_size=120), st.integers(1, 40))
def test_upper_sum_is_never_below_the_exact_sum_in_any_blocking(rows, block):
    rows = np.asarray(rows)
    total = UpperSum(3)
    for start in range(0, len(rows), block):
        total.add_rows(rows[start:start + block])
    assert_upper_and_tight(total.upper(), exact_column_sums(rows))
    assert_upper_and_tight(upper_sum(rows), exact_column_sums(rows))


def test_a_large_charge_then_ten_million_tiny_ones_is_not_lost():
    """4.000001 then 10^7 charges of 4.35e-16: a float sum stays at 4.000001 (each charge is under half
    an ulp); the compensated sum keeps them, within a few ulps and never below."""
    tiny = np.full((10 ** 7, 1), 4.35e-16)
    total = UpperSum(1)
    total.add_rows([[4.000001]])
    for start in range(0, tiny.shape[0], 10 ** 6):
        total.add_rows(tiny[start:start + 10 ** 6])
    exact = EXACT(4.000001) + 10 ** 7 * EXACT(4.35e-16)
    assert_upper_and_tight(total.upper(), [exact], ulps=2)
    assert 4.000001 + 4.35e-16 == 4.000001  # what a plain float sum does with each of them


def test_infinite_terms_give_infinity_and_nan_is_refused():
    total = UpperSum(2)
    total.add_rows([[1.0, math.inf], [2.0, 3.0]])
    assert total.upper().tolist() == [3.0, math.inf]
    with pytest.raises(ValueError, match="NaN"):
        total.add_rows([[math.nan, 1.0]])
    assert total.upper().tolist() == [3.0, math.inf]  # nothing was added
    with pytest.raises(ValueError, match="must be a number or \\+inf, got nan"):
        ExactSum([math.nan])


@settings(max_examples=300, deadline=None)
@given(charges, charges)
def test_up_add_is_the_smallest_float_at_or_above_the_exact_sum(a, b):
    result = float(up_add(a, b))
    exact = EXACT(a) + EXACT(b)
    assert EXACT(result) >= exact
    assert EXACT(float(np.nextafter(result, -math.inf))) < exact or result == 0.0


@settings(max_examples=300, deadline=None)
@given(charges, st.integers(0, 10 ** 9))
@example(1e300, 179769314)  # past the largest float: +inf, not an overflow error
def test_up_multiply_is_the_smallest_float_at_or_above_the_exact_product(value, times):
    result = float(up_multiply(value, times))
    exact = EXACT(value) * times
    if math.isinf(result):
        assert exact > EXACT(np.finfo(np.float64).max)
        return
    assert EXACT(result) >= exact
    assert result == 0.0 or EXACT(float(np.nextafter(result, -math.inf))) < exact


@settings(max_examples=100, deadline=None)
@given(st.lists(charges, min_size=1, max_size=400))
def test_exact_sum_is_exact(terms):
    total = ExactSum(terms)
    exact = sum((EXACT(t) for t in terms), EXACT(0))
    assert total.exact() == exact
    upper = total.upper()
    assert EXACT(upper) >= exact and (upper == 0 or EXACT(float(np.nextafter(upper, -math.inf))) < exact)


# the battery's case passes the budget after ~3.4e6 of 10^7 charges (15 s): make test-slow runs it,
# make test the same exactness at a boundary ten times closer, after ~3.4e5 of 10^6
@pytest.mark.parametrize("headroom, calls", [(1.5e-10, 10 ** 6), pytest.param(1.5e-9, 10 ** 7, marks=pytest.mark.slow)],
                         ids=["a-million", "ten-million"])
def test_the_filter_never_answers_after_the_exact_sum_passes_its_budget_after_millions_of_tiny_charges(headroom, calls):
    """A first charge of 4.000001, then `calls` charges of 4.35e-16 (the battery's case: 10^7) through
    the filter's per-step API; the filter must stop exactly where the exact sum would pass the budget."""
    probe = RenyiFilter(6.0, 1e-5, 8.0)
    term = probe.epsilon - probe.rdp_budget / (1 - 1e-9)           # the conversion term at order 8
    renyi = RenyiFilter((4.000001 + headroom) / (1 - 1e-9) + term, 1e-5, 8.0)
    assert renyi.spend_if_fits(4.000001)
    tiny = 4.35e-16
    expected = int((EXACT(renyi.rdp_budget) - EXACT(4.000001)) // EXACT(tiny))
    assert calls // 10 < expected < calls  # the budget is passed inside the run
    started = time.time()
    answered = [renyi.spend_if_fits(tiny) for _ in range(calls)]
    assert time.time() - started < 60 * calls / 10 ** 7   # 60 s for the battery's 10^7
    assert sum(answered) == expected and all(answered[:expected]) and not any(answered[expected:])
    assert EXACT(4.000001) + expected * EXACT(tiny) <= EXACT(renyi.rdp_budget)
    assert EXACT(renyi.spent) >= EXACT(4.000001) + expected * EXACT(tiny)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(charges, st.floats(min_value=0.0, max_value=0.5)), min_size=1, max_size=300),
       st.floats(min_value=0.05, max_value=3.0))
def test_the_filter_answers_exactly_while_the_exact_sum_fits(sequence, epsilon):
    """Generated charge sequences: a step is answered iff the exact sum of the answered charges so far
    plus its own is within the budget."""
    renyi = RenyiFilter(epsilon + 4.0, 1e-5, 8.0)
    spent = EXACT(0)
    for charge in sequence:
        fits = spent + EXACT(charge) <= EXACT(renyi.rdp_budget)
        assert renyi.spend_if_fits(charge) == fits
        spent += EXACT(charge) if fits else 0
        assert EXACT(renyi.spent) >= spent


def test_a_constant_charge_is_decided_exactly_and_restored_from_the_step_index():
    """The data-independent gate decides a constant charge by exact division: the same decisions as
    spending step by step, and a worker restoring from the step index gets the same state."""
    gate = BudgetGate.plan({"epsilon": 2.0, "delta": 1e-5, "order": 8.0}, np.full(len(DEFAULT_ORDERS), 0.0123),
                           np.asarray(DEFAULT_ORDERS))
    refused = gate.advance_data_independent(10 ** 5)
    stepwise = RenyiFilter(2.0, 1e-5, 8.0)
    answered = sum(stepwise.spend_if_fits(gate.step_bound) for _ in range(10 ** 5))
    assert int((~refused).sum()) == answered and not refused[:answered].any() and refused[answered:].all()
    assert gate.filter.state == stepwise.state
    worker = BudgetGate.plan({"epsilon": 2.0, "delta": 1e-5, "order": 8.0}, np.full(len(DEFAULT_ORDERS), 0.0123),
                             np.asarray(DEFAULT_ORDERS))
    worker.restore_data_independent(10 ** 5)
    assert worker.filter.state == gate.filter.state


def test_ledger_totals_and_compositions_are_never_below_the_exact_sums():
    rng = np.random.default_rng(3)
    orders = (1.5, 2.0, 8.0, 64.0)
    steps = np.vstack([[[4.000001, 1e-3, 7.0, 1e300]], rng.random((2000, 4)) * 10.0 ** rng.uniform(-17, -15, (2000, 4))])
    exact = exact_column_sums(steps)
    ledger = PrivacyLedger(orders)
    for start in range(0, len(steps), 64):
        ledger.charge_many({"part": (steps[start:start + 64], False)})
    assert_upper_and_tight(ledger.component_curve("part").values, exact)
    stepwise = PrivacyLedger(orders)
    for row in steps[:300]:
        stepwise.charge({"part": RdpCurve(orders, row)})
    assert_upper_and_tight(stepwise.component_curve("part").values, exact_column_sums(steps[:300]))
    curves = [RdpCurve(orders, row) for row in steps[:300]]
    assert_upper_and_tight(compose_curves(curves).values, exact_column_sums(steps[:300]))
    running = curves[0]
    for curve in curves[1:]:
        running = running + curve  # one upward rounding per addition: never below, looser than the others
    assert all(EXACT(float(v)) >= e for v, e in zip(running.values, exact_column_sums(steps[:300])))
