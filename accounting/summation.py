"""Sums that decide privacy, rounded towards privacy: never below the exact sum of their terms.

A float sum rounds to nearest, so a long run of small charges after a large one can vanish (4.000001
plus 10.5 million charges of 4.35e-16 stays 4.000001 in plain float addition): a privacy filter
would keep answering after the exact sum passed its budget. Three tools, each with a proof of its
direction:

- `ExactSum`: the exact rational sum of floats (every finite float is an integer multiple of
  2^-1074, so the sum is kept as one Python integer in those units); comparisons with a budget are
  exact, and `upper()` is the smallest float >= the exact sum. For the privacy filter.
- `up_add`, `up_multiply`: a + b and a * k rounded upwards (the smallest float >= the exact result),
  from the error-free transformations TwoSum (Knuth 1969, TAOCP vol. 2, 4.2.2) and TwoProduct
  (Dekker 1971, with Veltkamp's split); for composing two curves or one curve k times.
- `UpperSum`: a vectorised running sum over many rows (steps) of many columns (orders) kept as an
  unevaluated pair hi + lo with a rigorous bound `err` on |exact - (hi + lo)|; `upper()` rounds
  hi + lo + err upwards. Each block of rows is summed by a pairwise tree of TwoSums whose exact
  errors are summed separately (the cascaded summation of Ogita, Rump & Oishi 2005, Algorithm 4.4),
  so the result is within a few ulps of the exact sum (not the n ulps of a naive sum) and never
  below it. For the ledger and for composing many curves.

+inf terms give +inf ("no guarantee"); NaN is refused by the callers before it gets here.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterable, TypeVar

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
_Floats = TypeVar("_Floats", np.float64, FloatArray)

UNIT_ROUNDOFF = 2.0 ** -53
"""u: round-to-nearest float64 arithmetic errs by at most u times the exact result's magnitude."""
_SPLITTER = 134217729.0  # 2^27 + 1: Veltkamp's split of a float64 into two 26-bit halves
_SPLIT_SAFE = 2.0 ** 996  # below this the split cannot overflow
_PRODUCT_EXACT_ABOVE = 2.0 ** -969  # above this TwoProduct's error term cannot underflow
_SCALE_BITS = 1074  # every finite float64 is an integer multiple of 2^-1074


def _two_sum(a: FloatArray, b: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(s, e) with s = fl(a + b) and a + b = s + e exactly (Knuth's TwoSum; exact for finite
    results, subnormal ones included, since the error of a float addition is itself a float)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def up_add(a: npt.ArrayLike, b: npt.ArrayLike) -> FloatArray:
    """a + b rounded upwards, elementwise: the smallest float >= the exact sum (+inf stays +inf).

    Args:
        a: float or array of floats (NaN is refused by the callers before it gets here).
        b: float or array of floats, broadcastable against `a`.

    Returns:
        A float64 array of the broadcast shape (0-d for two scalars).
    """
    with np.errstate(invalid="ignore", over="ignore"):
        s, e = _two_sum(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
        # e > 0: the rounded sum is below the exact one by e; e is NaN where s is infinite
        return np.where(e > 0, np.nextafter(s, np.inf), s)


def up_multiply(values: npt.ArrayLike, factor: float) -> np.float64 | FloatArray:
    """values * factor rounded upwards, elementwise, for values >= 0 (or +inf) and factor >= 0: the
    smallest float >= the exact product. TwoProduct decides where its error term is exact; where it
    could overflow or underflow (products near the ends of the float range), exact rational
    arithmetic does.

    Args:
        values: a float or an array of floats, each >= 0 or +inf.
        factor: the multiplier, >= 0 (e.g. a repeat count).

    Returns:
        For a scalar, a numpy float64; otherwise a float64 array of values' shape: each entry the
        smallest float >= the exact product, +inf where no finite float holds it.
    """
    scalar = np.ndim(values) == 0
    array = np.atleast_1d(np.asarray(values, dtype=np.float64))
    factor = float(factor)
    with np.errstate(invalid="ignore", over="ignore"):
        product = array * factor
        a_hi, a_lo = _split(array)
        b_hi, b_lo = _split(np.float64(factor))
        error = ((a_hi * b_hi - product) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo  # exact - product
    safe = (np.abs(array) < _SPLIT_SAFE) & (abs(factor) < _SPLIT_SAFE) & (np.abs(product) > _PRODUCT_EXACT_ABOVE)
    result = np.where(safe & (error > 0), np.nextafter(product, np.inf), product)
    for index in zip(*np.nonzero(~safe & np.isfinite(array))):
        exact = Fraction(float(array[index])) * Fraction(factor)
        if exact > Fraction(np.finfo(np.float64).max):
            result[index] = math.inf  # no float holds it: +inf is the only upward rounding
            continue
        nearest = float(exact)
        result[index] = math.nextafter(nearest, math.inf) if Fraction(nearest) < exact else nearest
    return np.float64(result[0]) if scalar else result


def _split(x: _Floats) -> tuple[_Floats, _Floats]:
    c = _SPLITTER * x
    high = c - (c - x)
    return high, x - high


def _scaled(value: float) -> int:
    """value * 2^1074 as an exact integer (value a finite float)."""
    numerator, denominator = value.as_integer_ratio()
    return numerator << (_SCALE_BITS - (denominator.bit_length() - 1))


def _float_at_least(scaled: int) -> float:
    """The smallest float >= scaled * 2^-1074 (+inf beyond the largest float)."""
    try:
        nearest = scaled / (1 << _SCALE_BITS)  # int / int is correctly rounded in Python
    except OverflowError:
        return math.inf
    if math.isfinite(nearest) and _scaled(nearest) < scaled:
        return math.nextafter(nearest, math.inf)
    return nearest


class ExactSum:
    """The exact sum of the floats added to it (an integer count of 2^-1074), +inf once an infinite
    term was added. Comparisons with a float limit are exact."""

    __slots__ = ("_scaled", "_infinite", "_limit", "_limit_scaled")

    def __init__(self, terms: Iterable[float] = ()) -> None:
        self._scaled = 0
        self._infinite = False
        self._limit, self._limit_scaled = math.nan, 0  # the last finite limit compared with, scaled
        for term in terms:
            self.add(term)

    def add(self, term: float) -> None:
        """Add one float term; ValueError for NaN or -inf (a charge is never negative infinity).

        Args:
            term: a finite float or +inf (then the sum is +inf for good).

        Raises:
            ValueError: term is NaN or -inf (nothing is added).
        """
        term = float(term)
        if math.isfinite(term):
            self._scaled += _scaled(term)
        elif term == math.inf:
            self._infinite = True
        else:
            raise ValueError(f"a summed charge must be a number or +inf, got {term!r}")

    def add_repeated(self, term: float, times: int) -> None:
        """Add `times` copies of one float term (times an integer >= 0).

        Args:
            term: a finite float or +inf.
            times: how many copies, an integer >= 0 (0 adds nothing, whatever the term).

        Raises:
            ValueError: times negative or not an integer, or term NaN or -inf (nothing is added).
        """
        if times < 0 or int(times) != times:
            raise ValueError(f"times must be an integer >= 0, got {times!r}")
        if times:
            self.add(term)
            if math.isfinite(float(term)):
                self._scaled += _scaled(float(term)) * (int(times) - 1)

    def copy(self) -> "ExactSum":
        """An independent ExactSum holding the same exact sum (the limit cache is not copied).

        Returns:
            A new ExactSum equal to this one.
        """
        copy = ExactSum()
        copy._scaled, copy._infinite = self._scaled, self._infinite
        return copy

    def at_most(self, limit: float, plus: float = 0.0) -> bool:
        """Whether the exact sum, with `plus` added, is <= `limit` (False for a NaN limit or term).

        Args:
            limit: the bound, a float (+inf: everything fits; -inf: nothing does).
            plus: a term to count in without adding it, a float >= 0 or +inf (-inf never fits).

        Returns:
            True when sum + plus <= limit in exact arithmetic.
        """
        return self._scaled_with(plus, limit) is not None

    def add_if_at_most(self, term: float, limit: float) -> bool:
        """Add `term` if the exact sum with it stays <= `limit`; whether it was added.

        Args:
            term: a float >= 0, or +inf (added only under an infinite limit); NaN never fits.
            limit: the bound, a float.

        Returns:
            True when the term was added (sum + term <= limit exactly), False when nothing changed.
        """
        total = self._scaled_with(term, limit)
        if total is None:
            return False
        if float(term) == math.inf:  # only under an infinite limit
            self._infinite = True
        self._scaled = total
        return True

    def _scaled_with(self, plus: float, limit: float) -> int | None:
        """The scaled exact sum with `plus` added if it is <= `limit`, else None."""
        limit, plus = float(limit), float(plus)
        if plus != plus or limit != limit or plus == -math.inf:  # NaN, or a term no sum of charges has
            return None
        if limit == math.inf:
            return self._scaled + (_scaled(plus) if plus != math.inf else 0)
        if self._infinite or plus == math.inf or limit == -math.inf:
            return None
        if limit != self._limit:
            self._limit, self._limit_scaled = limit, _scaled(limit)
        total = self._scaled + _scaled(plus)
        return total if total <= self._limit_scaled else None

    def upper(self) -> float:
        """The smallest float >= the exact sum.

        Returns:
            A float >= the exact sum, +inf once an infinite term was added or beyond the largest float.
        """
        return math.inf if self._infinite else _float_at_least(self._scaled)

    def exact(self) -> Fraction | float:
        """The exact sum as a Fraction (+inf as a float).

        Returns:
            The exact rational sum (a Fraction with a power-of-two denominator), or math.inf.
        """
        return math.inf if self._infinite else Fraction(self._scaled, 1 << _SCALE_BITS)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExactSum) and (self._scaled, self._infinite) == (other._scaled, other._infinite)

    def __repr__(self) -> str:
        return f"ExactSum(upper={self.upper()!r})"


def _block_sum(rows: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(s, e_sum, e_bound) for a finite (n, k) block: the exact column sums are s + E where E is the
    sum of the pairwise tree's TwoSum errors, |E - e_sum| <= e_bound."""
    total_errors = np.zeros(rows.shape[1])
    absolute_errors = np.zeros(rows.shape[1])
    level = rows
    count = 0
    while level.shape[0] > 1:
        if level.shape[0] % 2:
            level = np.vstack([level, np.zeros((1, level.shape[1]))])  # adding 0 is exact
        level, errors = _two_sum(level[0::2], level[1::2])
        total_errors += errors.sum(axis=0)
        absolute_errors += np.abs(errors).sum(axis=0)
        count += errors.shape[0] + 1
    # summing `count` error terms in floats errs by at most (count - 1) u sum|e| (Higham 2002, (4.4)),
    # with sum|e| itself computed to within a factor (1 + count u); 3 count u covers both for count u < 0.1
    return level[0], total_errors, 3.0 * count * UNIT_ROUNDOFF * absolute_errors


class UpperSum:
    """Running column sums of rows added over time, never reported below the exact sums.

    State: hi + lo (an unevaluated sum of two floats per column) and err, with |exact - (hi + lo)|
    <= err in exact arithmetic; columns that received +inf (or overflowed) are +inf."""

    def __init__(self, columns: int) -> None:
        self.hi: FloatArray = np.zeros(columns)
        self.lo: FloatArray = np.zeros(columns)
        self.err: FloatArray = np.zeros(columns)
        self.infinite: npt.NDArray[np.bool_] = np.zeros(columns, dtype=bool)

    def copy(self) -> "UpperSum":
        """An independent UpperSum with the same state (hi, lo, err and the infinite columns copied).

        Returns:
            A new UpperSum equal in state to this one.
        """
        copy = UpperSum(self.hi.shape[0])
        copy.hi, copy.lo, copy.err, copy.infinite = self.hi.copy(), self.lo.copy(), self.err.copy(), self.infinite.copy()
        return copy

    def add_rows(self, rows: npt.ArrayLike) -> None:
        """Add each row of `rows` (shape (n, columns), or one row of shape (columns,)) to the sums;
        ValueError for NaN or -inf (a privacy loss is a number or +inf), nothing added then.

        Args:
            rows: the terms, shape (n, columns) or (columns,); finite or +inf.

        Raises:
            ValueError: rows of another width, or a NaN or -inf term (nothing is added).
        """
        block_rows = np.asarray(rows, dtype=np.float64)
        if block_rows.ndim == 1:
            block_rows = block_rows[None, :]
        if block_rows.shape != (block_rows.shape[0], self.hi.shape[0]):
            raise ValueError(f"rows must have shape (n, {self.hi.shape[0]}), got {block_rows.shape}")
        if block_rows.shape[0] == 0:
            return
        finite = np.isfinite(block_rows)
        if not finite.all():
            if np.any(np.isnan(block_rows) | (block_rows == -np.inf)):
                raise ValueError("a summed privacy loss must be a number or +inf, got NaN or -inf")
            self.infinite |= ~finite.all(axis=0)
            block_rows = np.where(finite, block_rows, 0.0)
        block, block_errors, block_bound = _block_sum(block_rows)
        with np.errstate(invalid="ignore", over="ignore"):
            hi, carry = _two_sum(self.hi, block)               # exact: old hi + block = hi + carry
            low, dropped = _two_sum(self.lo, carry)            # exact: old lo + carry = low + dropped
            low, dropped_too = _two_sum(low, block_errors)     # exact: low + e_sum = low' + dropped_too
            # what hi + lo does not keep goes into the bound; (1 + 4u) covers the bound's own rounding
            self.err = (self.err + block_bound + np.abs(dropped) + np.abs(dropped_too)) * (1 + 4 * UNIT_ROUNDOFF)
            self.hi, self.lo = _two_sum(hi, low)               # exact renormalisation
        self.infinite |= ~np.isfinite(self.hi) | ~np.isfinite(self.err)

    def upper(self) -> FloatArray:
        """Each column's sum rounded upwards: a float >= hi + lo + err >= the exact sum (the correctly
        rounded-up sum whenever every addition was exact, err = 0); +inf where a term was +inf.

        Returns:
            A float64 array of shape (columns,), each entry >= the exact column sum.
        """
        with np.errstate(invalid="ignore", over="ignore"):
            total = up_add(self.hi, up_add(self.lo, self.err))
        return np.where(self.infinite | ~np.isfinite(total), np.inf, total)


def upper_sum(rows: npt.ArrayLike) -> FloatArray:
    """Column sums of a (n, k) array of terms, each rounded up (never below the exact sum).

    Args:
        rows: an (n, k) array of terms (or one row of k), each finite or +inf.

    Returns:
        A float64 array of shape (k,), each entry >= the exact column sum (+inf where a term is).

    Raises:
        ValueError: a NaN or -inf term (from UpperSum.add_rows).
    """
    array = np.asarray(rows, dtype=np.float64)
    total = UpperSum(array.shape[-1])
    total.add_rows(array)
    return total.upper()
