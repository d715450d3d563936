"""UpperSum (accounting/summation.py) on adversarial sequences: alternating huge and tiny terms,
subnormals, terms near the largest float, signed terms over many decades, +inf, added as blocks and
row by row in random mixes, totals read and copies taken mid-buffer; and the ledger's totals through
to_dict/from_dict mid-buffer. Every total must be at least the exact Fraction sum (+inf exactly where
a term is +inf or the sum passes the largest float)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.ledger import PrivacyLedger
from dpledger.accounting.summation import UpperSum

LARGEST = float(np.finfo(np.float64).max)


def adversarial_rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows, columns = int(rng.choice([1, 2, 63, 64, 65, 1023, 1024, 1025, 2100])), int(rng.integers(1, 4))
    shape = (rows, columns)
    kind = seed % 7
    if kind == 0:    # alternating huge and tiny
        x = np.where((np.arange(rows) % 2)[:, None] == 0, 1e300, 1e-300) * rng.uniform(0, 1, shape)
    elif kind == 1:  # subnormal multiples of the smallest float
        x = rng.integers(0, 5, shape) * 5e-324
    elif kind == 2:  # near the largest float, some sums overflowing
        x = LARGEST * rng.uniform(0, 1, shape) / rng.choice([1.0, 2.0, rows, 2.0 * rows, 4096.0])
    elif kind == 3:  # ones and half-ulps: every naive addition rounds
        x = np.where(rng.random(shape) < 0.5, 1.0, 2.0 ** -53) * (1 + rng.integers(0, 3, shape) * 2.0 ** -52)
    elif kind == 4:  # every decade of the float range
        x = np.exp(rng.uniform(-745, 709, shape))
    elif kind == 5:  # a few awkward values mixed
        x = rng.choice([0.0, 5e-324, 2.2250738585072014e-308, 1e-320, 0.1, 1.0, 1e16, 3.0], shape)
    else:            # signed terms over forty decades
        x = rng.uniform(-1, 1, shape) * 10.0 ** rng.integers(-20, 20, shape)
    if rng.random() < 0.2:
        x[rng.integers(0, rows), rng.integers(0, columns)] = np.inf
    return x


def assert_upper(totals: np.ndarray, rows: np.ndarray) -> None:
    for column, total in enumerate(totals):
        terms = rows[:, column]
        if np.isposinf(terms).any():
            assert total == math.inf
            continue
        exact = sum((Fraction(float(v)) for v in terms), Fraction(0))
        assert not math.isnan(total)
        assert total == math.inf and exact > Fraction(LARGEST) or Fraction(float(total)) >= exact, column


@pytest.mark.parametrize("seed", range(42))
def test_blocks_rows_mixes_mid_buffer_reads_and_copies_stay_above_the_exact_sum(seed):
    rows = adversarial_rows(seed)
    rng = np.random.default_rng(seed + 1000)
    block = UpperSum(rows.shape[1])
    block.add_rows(rows)
    assert_upper(block.upper(), rows)
    mixed, copied, cut, start = UpperSum(rows.shape[1]), None, int(rng.integers(0, rows.shape[0] + 1)), 0
    while start < rows.shape[0]:
        stop = min(rows.shape[0], start + int(rng.integers(1, 300)))
        if rng.random() < 0.5:
            mixed.add_rows(rows[start:stop])
        else:
            for row in rows[start:stop]:
                mixed.add_row(row)
        if copied is None and stop >= cut:
            assert_upper(mixed.upper(), rows[:stop])     # read mid-stream (mid-buffer when rows were single)
            copied, copied_at = mixed.copy(), stop
        start = stop
    assert_upper(mixed.upper(), rows)
    copied.add_rows(rows[copied_at:])
    assert_upper(copied.upper(), rows)


@pytest.mark.parametrize("seed", range(0, 42, 3))
def test_ledger_totals_through_a_round_trip_mid_buffer_stay_above_the_exact_sum(seed):
    rows = np.abs(adversarial_rows(seed))[:700]
    orders = tuple(float(o) for o in np.linspace(1.5, 10.0, rows.shape[1]))
    ledger = PrivacyLedger(orders)
    half = rows.shape[0] // 2
    for step, row in enumerate(rows):
        ledger.charge({"loss": RdpCurve(orders, row)})
        if step == half:
            restored = PrivacyLedger.from_dict(ledger.to_dict())
            assert_upper(restored.component_curve("loss").values, rows[:half + 1])
            for later in rows[half + 1:]:
                restored.charge({"loss": RdpCurve(orders, later)})
            assert_upper(restored.component_curve("loss").values, rows)
    assert_upper(ledger.component_curve("loss").values, rows)
