"""The ledger's fast paths (chunked extraction sums, buffered per-step charges) stay upper bounds of
the exact sums, within two ulps: checked against exact rational sums (Fraction) on generated inputs."""
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpledger.accounting import DEFAULT_ORDERS, PrivacyLedger, RdpCurve
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.accounting.summation import CHUNK_ROWS, UpperSum

ORDERS = (1.5, 2.0, 8.0)
LARGEST = Fraction(float(np.finfo(np.float64).max))
RELATIVE = Fraction(2) ** -51      # the stated tightness for nonnegative terms: two ulps
TINY = Fraction(2) ** -1074        # one subnormal step, the slack allowed per chunk where bounds underflow


def exact_sums(rows):
    """Exact column sums (Fraction), math.inf for a column holding +inf."""
    columns = []
    for column in np.asarray(rows, dtype=np.float64).T:
        columns.append(math.inf if np.isinf(column).any() else sum((Fraction(float(v)) for v in column), Fraction(0)))
    return columns


def assert_upper_and_within_two_ulps(totals, rows):
    chunks = len(rows) // CHUNK_ROWS + 2
    for total, exact in zip(totals, exact_sums(rows)):
        if exact == math.inf or exact > LARGEST:
            assert total == math.inf, (total, exact)
            continue
        assert math.isfinite(total)
        assert Fraction(float(total)) >= exact, (float(total), float(exact))                 # never below
        assert Fraction(float(total)) - exact <= RELATIVE * exact + chunks * TINY, (float(total), float(exact))


magnitude = st.one_of(st.floats(min_value=-323.5, max_value=300), st.sampled_from([-320.0, -310.0, 0.0, 300.0]))
charge = st.one_of(
    st.builds(lambda mantissa, exponent: mantissa * 10.0 ** exponent, st.floats(0.0, 1.0), magnitude),
    st.sampled_from([0.0, 5e-324, 2.2250738585072014e-308, 4.35e-16, 4.000001, 1e300, math.inf]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(charge, min_size=3, max_size=3), min_size=1, max_size=200), st.integers(1, 80))
def test_block_and_per_step_totals_are_upper_bounds_within_two_ulps(rows, block):
    """Magnitudes over 620 decades, subnormals, +inf, tiny after huge: charged in blocks of any size
    and step by step, every total is >= the exact sum and within two ulps of it."""
    rows = np.asarray(rows, dtype=np.float64)
    blocks, steps = PrivacyLedger(ORDERS), PrivacyLedger(ORDERS)
    for start in range(0, len(rows), block):
        blocks.charge_many({"a": (rows[start:start + block], False)})
    for row in rows:
        steps.charge({"a": RdpCurve(ORDERS, row)})
    assert blocks.steps == steps.steps == len(rows)
    assert_upper_and_within_two_ulps(blocks.component_curve("a").values, rows)
    assert_upper_and_within_two_ulps(steps.component_curve("a").values, rows)


@pytest.mark.parametrize("count", [1, 2, 63, 64, 65, CHUNK_ROWS - 1, CHUNK_ROWS, CHUNK_ROWS + 1, 3 * CHUNK_ROWS + 7,
                                   200_000])
def test_many_rows_over_many_decades_chunk_edges_included(count):
    """1 to 200,000 rows (across the chunk and buffer sizes): magnitudes over 600 decades in one
    column, comparable ones in another (where a naive sum errs by ~n ulps), near-overflow terms in
    a third (the pairwise fallback), by charge_many and by charge()."""
    rng = np.random.default_rng(count)
    rows = np.column_stack([rng.random(count) * 10.0 ** rng.uniform(-320, 300, count),
                            rng.uniform(0.5, 1.0, count) * 0.1,
                            rng.uniform(0.0, 1.0, count) * 10.0 ** rng.uniform(290, 304, count)])
    ledger = PrivacyLedger(ORDERS)
    ledger.charge_many({"a": (rows, True)})
    assert_upper_and_within_two_ulps(ledger.component_curve("a").values, rows)
    if count <= 5000:
        stepwise = PrivacyLedger(ORDERS)
        for row in rows:
            stepwise.charge({"a": RdpCurve(ORDERS, row)})
        assert_upper_and_within_two_ulps(stepwise.component_curve("a").values, rows)


def test_sums_past_the_largest_float_are_infinite_and_just_below_stay_finite():
    """Columns whose exact sum passes the largest float are +inf (the only upper bound); the
    pairwise fallback near the top of the range stays an upper bound."""
    rows = np.zeros((3000, 3))
    rows[:, 0] = 1e305                         # exact sum 3e308 > max float
    rows[:, 1] = 5e304                         # 1.5e308: finite, 2 m max|x| overflows the split
    rows[0, 2], rows[1:, 2] = 1.7e308, 1e290   # just below the top
    ledger = PrivacyLedger(ORDERS)
    ledger.charge_many({"a": (rows, False)})
    assert_upper_and_within_two_ulps(ledger.component_curve("a").values, rows)
    assert ledger.component_curve("a").values[0] == math.inf


@pytest.mark.parametrize("per_step", [False, True])
def test_tiny_charges_after_a_huge_one_are_kept(per_step):
    """4.000001, then 200,000 charges of 4.35e-16 in a block or 20,000 step by step (each under half an
    ulp of the running float sum, which a plain float sum would keep at 4.000001)."""
    charges = 20_000 if per_step else 200_000
    rows = np.full((charges + 1, 3), 4.35e-16)
    rows[0] = 4.000001
    ledger = PrivacyLedger(ORDERS)
    if per_step:
        for row in rows:
            ledger.charge({"a": RdpCurve(ORDERS, row)})
    else:
        ledger.charge_many({"a": (rows, False)})
    exact = Fraction(4.000001) + charges * Fraction(4.35e-16)
    for total in ledger.component_curve("a").values:
        assert exact <= Fraction(float(total)) <= exact * (1 + RELATIVE)
        assert total > 4.000001


def test_default_grid_block_with_infinities_and_a_permuted_grid():
    """The default 156-order grid (given sorted and given reversed): +inf entries make only their
    columns +inf, every other column is an upper bound within two ulps."""
    rng = np.random.default_rng(7)
    rows = rng.random((2500, len(DEFAULT_ORDERS))) * 10.0 ** rng.uniform(-12, 3, (2500, len(DEFAULT_ORDERS)))
    rows[17, 5] = rows[2400, 150] = math.inf
    ledger = PrivacyLedger()
    ledger.charge_many({"a": (rows, False)})
    totals = ledger.component_curve("a").values
    assert_upper_and_within_two_ulps(totals, rows)
    assert np.isinf(totals).sum() == 2
    reversed_ledger = PrivacyLedger(DEFAULT_ORDERS[::-1])
    reversed_ledger.charge_many({"a": (rows[:, ::-1], False)})
    assert reversed_ledger.orders == ledger.orders
    assert_upper_and_within_two_ulps(reversed_ledger.component_curve("a").values, rows)


def test_per_step_totals_read_between_charges_keep_the_guarantee():
    """Reading a total folds the buffered steps in; charging goes on afterwards; the totals at every
    read and the conversion are those of the steps charged so far."""
    rng = np.random.default_rng(11)
    rows = rng.random((3000, 3)) * 10.0 ** rng.uniform(-300, 2, (3000, 3))
    ledger = PrivacyLedger(ORDERS)
    for index, row in enumerate(rows, start=1):
        ledger.charge({"a": RdpCurve(ORDERS, row, data_dependent=True)})
        if index in (1, 5, 64, 65, 1000, 2047, 2048, 3000):
            assert_upper_and_within_two_ulps(ledger.component_curve("a").values, rows[:index])
            assert ledger.steps == index
    block = PrivacyLedger(ORDERS)
    block.charge_many({"a": (rows, True)})
    assert ledger.total_curve().data_dependent and block.total_curve().data_dependent
    restored = PrivacyLedger.from_dict(ledger.to_dict())
    np.testing.assert_array_equal(restored.component_curve("a").values, ledger.component_curve("a").values)


def snapshot(ledger):
    return ledger.to_dict(), ledger.total_relation


def test_refused_charges_leave_the_ledger_as_it_was():
    """A block or step that is refused (NaN, negative, -inf, wrong shape, mismatched steps, no
    common neighbouring pair, not a curve) charges nothing, buffered steps included."""
    ledger = PrivacyLedger(ORDERS)
    ledger.charge_many({"a": (np.full((5, 3), 0.25), False)})
    for _ in range(10):
        ledger.charge({"a": RdpCurve(ORDERS, [0.5, 1.0, 2.0]), "b": RdpCurve(ORDERS, [1e-300, 0.0, 3.0])})
    before = snapshot(ledger)
    good = np.full((4000, 3), 0.125)
    late_nan, late_negative, late_minus_inf = good.copy(), good.copy(), good.copy()
    late_nan[3999, 2] = math.nan
    late_negative[2500, 0] = -1e-300
    late_minus_inf[1500, 1] = -math.inf
    refused_blocks = [
        ({"a": (good, False), "b": (late_nan, False)}, "NaN"),
        ({"a": (good, False), "b": (late_negative, False)}, "negative"),
        ({"a": (late_minus_inf, False)}, "negative"),
        ({"a": (good, False), "b": (good[:10], False)}, "same steps"),
        ({"a": (good, False), "c": (good, False, NeighbouringRelation.REPLACE_ONE)}, "no common"),
        ({"a": (good[:, :2], False)}, "shape"),
    ]
    for components, message in refused_blocks:
        with pytest.raises(ValueError, match=message):
            ledger.charge_many(components)
        assert snapshot(ledger) == before and ledger.steps == 15
    refused_steps = [
        ({"a": RdpCurve(ORDERS, [1.0, 1.0, 1.0]), "b": "not a curve"}, "must be an RdpCurve"),
        ({"a": RdpCurve(ORDERS, [1.0, 1.0, 1.0]), "c": RdpCurve((2.0, 3.0), [1.0, 1.0])}, "different order grid"),
        ({"a": RdpCurve(ORDERS, [1.0, 1.0, 1.0]),
          "c": RdpCurve(ORDERS, [1.0, 1.0, 1.0], NeighbouringRelation.REPLACE_ONE)}, "no common"),
        ({}, "non-empty"),
    ]
    for components, message in refused_steps:
        with pytest.raises(ValueError, match=message):
            ledger.charge(components)
        assert snapshot(ledger) == before and ledger.steps == 15


def test_upper_sum_rows_one_at_a_time_are_checked_and_signed_terms_bounded():
    """add_row refuses NaN, -inf and a wrong shape without adding anything; signed finite terms
    (UpperSum is not only for privacy losses) are bounded by 2 u |S| + 2^-64 sum|x|."""
    total = UpperSum(2)
    total.add_row([1.0, 2.0])
    for bad, message in (([math.nan, 1.0], "NaN"), ([1.0, -math.inf], "-inf"), ([1.0, 2.0, 3.0], "shape")):
        with pytest.raises(ValueError, match=message):
            total.add_row(bad)
    assert total.upper().tolist() == [1.0, 2.0]
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(5000, 2)) * 10.0 ** rng.uniform(-20, 20, (5000, 2))
    signed = UpperSum(2)
    for row in rows[:2500]:
        signed.add_row(row)
    copied = signed.copy()
    signed.add_rows(rows[2500:])
    copied.add_rows(rows[2500:])
    for result in (signed.upper(), copied.upper()):
        for value, column in zip(result, rows.T):
            exact = sum((Fraction(float(v)) for v in column), Fraction(0))
            magnitudes = sum((abs(Fraction(float(v))) for v in column), Fraction(0))
            slack = 2 * Fraction(2) ** -53 * abs(exact) + Fraction(2) ** -64 * magnitudes
            assert exact <= Fraction(float(value)) <= exact + slack


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.builds(lambda mantissa, exponent: mantissa * 2.0 ** exponent, st.floats(-1.0, 1.0),
                                   st.integers(-1000, 1000)), min_size=2, max_size=2), min_size=1, max_size=60),
       st.integers(1, 7))
def test_upper_sum_state_bounds_its_own_error_exactly(rows, block):
    """The invariant every step keeps, checked in exact arithmetic: |exact - (hi + lo)| <= err,
    whatever the blocking (one-row blocks leave err with nothing but the merges' dropped terms)."""
    rows = np.asarray(rows, dtype=np.float64)
    total = UpperSum(2)
    for start in range(0, len(rows), block):
        total.add_rows(rows[start:start + block])
    for column, hi, lo, err in zip(rows.T, total.hi, total.lo, total.err):
        exact = sum((Fraction(float(v)) for v in column), Fraction(0))
        assert abs(exact - Fraction(float(hi)) - Fraction(float(lo))) <= Fraction(float(err))


def test_upper_sum_state_counts_what_each_merge_drops():
    """Blocks built so that a merge's low-part addition rounds (2^-200 against -2^-54) while the
    chunk's own residual bound is ~2^-253: the state's err must count the dropped part itself."""
    blocks = [[[1.0]], [[3 * 2.0 ** -54]], [[2.0 ** -52], [1.25 * 2.0 ** -200]]]
    total = UpperSum(1)
    for block in blocks:
        total.add_rows(block)
    exact = sum((Fraction(row[0]) for block in blocks for row in block), Fraction(0))
    assert abs(exact - Fraction(float(total.hi[0])) - Fraction(float(total.lo[0]))) <= Fraction(float(total.err[0]))
    assert Fraction(float(total.upper()[0])) >= exact


def test_a_tampered_curve_is_never_summed_as_zero():
    """A curve whose read-only values were made writable and set to NaN after its checks: the
    buffered step is not silently dropped from the total; reading it fails."""
    curve = RdpCurve(ORDERS, [1.0, 1.0, 1.0])
    curve.values.flags.writeable = True
    curve.values[1] = math.nan
    ledger = PrivacyLedger(ORDERS)
    ledger.charge({"a": curve})
    with pytest.raises(ValueError, match="NaN or -inf"):
        ledger.component_curve("a")
