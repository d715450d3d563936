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
  hi + lo + err upwards. Each block of rows is summed in cache-sized chunks by the error-free
  extraction of Rump, Ogita & Oishi 2008 (exact high parts; the residuals' float sum carries
  Higham's a-priori error bound), the chunks merged with TwoSums; columns within a factor 2^11 of
  the largest float fall back to a pairwise tree of TwoSums (the cascaded summation of Ogita, Rump
  & Oishi 2005, Algorithm 4.4). The result is within a few ulps of the exact sum (not the n ulps of
  a naive sum) and never below it. For the ledger and for composing many curves.

+inf terms give +inf ("no guarantee"); NaN is refused by the callers before it gets here.
"""
from __future__ import annotations

import functools
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
    sum of the pairwise tree's TwoSum errors, |E - e_sum| <= e_bound. Used for the columns whose
    magnitudes are too close to the largest float for `_extracted_sum`'s split."""
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


CHUNK_ROWS = 1024
"""Rows summed by one extraction (`_extracted_sum`): small enough to stay in cache and to keep the
residuals' error bound near 2^-74 of the chunk's largest term, large enough that the per-chunk
overhead is small."""


@functools.cache  # a few row counts recur (CHUNK_ROWS above all); computed when first needed, not at import
def _residual_bound_factor(rows: int) -> float:
    """A float >= gamma / (1 - gamma), gamma = gamma_{rows-1} = (rows-1) u / (1 - (rows-1) u) (Higham
    2002, Lemma 3.1), rounded upwards from its exact rational value. A float sum of `rows` terms, in any
    order, is sum x_i (1 + theta_i) with |theta_i| <= gamma, each term passing through at most rows - 1
    additions (Higham 2002, Section 4.2, Eq. 4.4 made rigorous by Lemma 3.1), so it errs by at most
    gamma sum|x_i|; the computed sum of the |x_i| (exact magnitudes) is at least (1 - gamma) sum|x_i|,
    so this factor times that computed sum bounds the error."""
    u = Fraction(1, 2 ** 53)
    gamma = (rows - 1) * u / (1 - (rows - 1) * u)
    exact = gamma / (1 - gamma)
    nearest = float(exact)
    return math.nextafter(nearest, math.inf) if Fraction(nearest) < exact else nearest


_SIGMA_EXPONENT_LIMIT = 1023  # 2^1023 is the largest power of two that is a float


def _extracted_sum(chunk: FloatArray, largest: FloatArray
                   ) -> tuple[FloatArray, FloatArray, FloatArray, npt.NDArray[np.bool_]]:
    """(tau, rho, bound, huge) for a finite (m, k) chunk, 1 <= m <= CHUNK_ROWS, whose columns' largest
    magnitudes max|x| are `largest`: outside the `huge` columns the exact column sums are tau + R with
    |R - rho| <= bound.

    The error-free extraction of Rump, Ogita & Oishi 2008 (Accurate floating-point summation part I:
    faithful rounding, SIAM J. Sci. Comput. 31(1), Section 3, ExtractScalar and ExtractVector): with
    sigma = 2^E >= 2 m max|x| per column, q = fl(fl(sigma + x) - sigma) is x rounded to a multiple of
    g = max(u sigma, 2^-1074) (the subtraction is exact by Sterbenz's lemma, fl(sigma + x) lying in
    [sigma/2, 2 sigma]), and r = fl(x - q) = x - q exactly, |r| <= u sigma. Every partial sum of the
    q's is a multiple of g below sigma in magnitude (sum|x| <= sigma/2 and m u sigma < sigma/2), hence
    a float: tau = fl(sum q) is exact in any summation order. rho = fl(sum r) errs by at most
    gamma_{m-1} sum|r| (Higham 2002, Eq. 4.4 with Lemma 3.1, any order); `bound` is that with sum|r|
    taken from its computed value (`_residual_bound_factor`), rounded upwards: 0 when every residual
    is 0 (then the sum is exact), and at most about m u * m u sigma <= 4 m^3 u^2 max|x| (2^-74 max|x|
    for m = 1024). `huge` marks the columns where sigma would not be a float (2 m max|x| >= 2^1023);
    their tau, rho and bound are meaningless."""
    rows = chunk.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):
        span = largest * (2.0 * rows)
        # fl(2 m max) < 2^E and rounding is monotone, so the exact 2 m max is <= 2^E too
        exponent = np.frexp(span)[1]
    huge = (exponent > _SIGMA_EXPONENT_LIMIT) | ~np.isfinite(span)   # frexp(inf) gives exponent 0
    sigma = np.ldexp(1.0, np.where(huge, 0, exponent))
    extracted = np.add(chunk, sigma)
    extracted -= sigma
    tau = np.add.reduce(extracted, axis=0)
    residuals = np.subtract(chunk, extracted, out=extracted)
    rho = np.add.reduce(residuals, axis=0)
    absolute = np.add.reduce(np.abs(residuals, out=residuals), axis=0)
    # the product rounds to nearest: one step up covers it (also where it underflows); 0 stays 0
    product = absolute * _residual_bound_factor(rows)
    bound = np.where(product > 0, np.nextafter(product, np.inf), product)
    return tau, rho, bound, huge


class UpperSum:
    """Running column sums of rows added over time, never reported below the exact sums.

    State: hi + lo (an unevaluated sum of two floats per column) and err, with |exact - (hi + lo)|
    <= err in exact arithmetic over the rows summed so far; columns that received +inf (or
    overflowed) are +inf. Rows given one at a time (`add_row`) wait in a buffer and are summed in
    blocks when it fills or a total is read (`upper`), so hi, lo and err may not count them yet.

    Tightness: each block of rows is cut into chunks of up to CHUNK_ROWS rows summed by error-free
    extraction (`_extracted_sum`), the chunks' results are merged with TwoSums, and what a merge drops
    goes into err; `upper()` is then at most 2 u |S| + 2^-64 sum|x_i| above the exact sum S of the
    terms x_i (u = 2^-53), plus 2^-1074 per chunk where the bounds underflow, for fewer than 2^40
    rows. For nonnegative terms (privacy losses) that is within 2^-51 relative (two ulps) whatever
    the number of rows; where err = 0 (one row, or no rounding anywhere) it is the smallest float >= hi + lo.
    """

    _BUFFER_ROWS_FIRST = 64  # the buffer doubles from here up to CHUNK_ROWS rows

    def __init__(self, columns: int) -> None:
        self.hi: FloatArray = np.zeros(columns)
        self.lo: FloatArray = np.zeros(columns)
        self.err: FloatArray = np.zeros(columns)
        self.infinite: npt.NDArray[np.bool_] = np.zeros(columns, dtype=bool)
        self._buffer: FloatArray | None = None  # rows given by add_row, not yet in hi, lo and err
        self._buffered = 0

    def copy(self) -> "UpperSum":
        """An independent UpperSum with the same state (hi, lo, err, the infinite columns and the
        buffered rows copied).

        Returns:
            A new UpperSum equal in state to this one.
        """
        copy = UpperSum(self.hi.shape[0])
        copy.hi, copy.lo, copy.err, copy.infinite = self.hi.copy(), self.lo.copy(), self.err.copy(), self.infinite.copy()
        copy._buffer, copy._buffered = (None if self._buffer is None else self._buffer.copy()), self._buffered
        return copy

    def add_row(self, row: npt.ArrayLike) -> None:
        """Add one row of terms; it is buffered and summed with the next ones in a block (the cheap
        way to add rows one at a time). ValueError for NaN or -inf, nothing added then.

        Args:
            row: the terms, shape (columns,); finite or +inf.

        Raises:
            ValueError: a row of another shape, or a NaN or -inf term (nothing is added).
        """
        values = row if type(row) is np.ndarray and row.dtype == np.float64 else np.asarray(row, dtype=np.float64)
        if values.shape != self.hi.shape:
            raise ValueError(f"a row must have shape ({self.hi.shape[0]},), got {values.shape}")
        if not _smallest(values) > -math.inf:  # NaN fails the comparison too
            raise ValueError("a summed privacy loss must be a number or +inf, got NaN or -inf")
        self._add_checked_row(values)

    def _add_checked_row(self, values: FloatArray) -> None:
        """add_row for a float64 row of the right shape already known to hold no NaN or -inf (an
        RdpCurve's values): the ledger's per-step path. `_fold_buffer` checks the block again."""
        buffer = self._buffer
        if buffer is None or self._buffered == buffer.shape[0]:
            if buffer is not None and buffer.shape[0] >= CHUNK_ROWS:
                self._fold_buffer()
            else:
                grown = np.empty((self._BUFFER_ROWS_FIRST if buffer is None else 2 * buffer.shape[0], self.hi.shape[0]))
                if buffer is not None:
                    grown[:self._buffered] = buffer[:self._buffered]
                self._buffer = buffer = grown
        buffer[self._buffered] = values
        self._buffered += 1

    def _fold_buffer(self) -> None:
        """Sum the buffered rows (validated by add_row) into hi, lo and err; empty the buffer."""
        if self._buffered and self._buffer is not None:
            block = BlockSum.of(self._buffer[:self._buffered])
            if block.refused:  # only if an RdpCurve's values were changed after its checks: fail loudly, never drop it
                raise ValueError("a buffered privacy loss became NaN or -inf after it was added")
            self._buffered = 0
            self.absorb(block)

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
        block = BlockSum.of(block_rows)
        if block.refused:
            raise ValueError("a summed privacy loss must be a number or +inf, got NaN or -inf")
        self.absorb(block)

    def absorb(self, block: "BlockSum") -> None:
        """Add a block's sums (from `BlockSum.of`; a refused block must not be added).

        Args:
            block: the block's sums, over the same columns.
        """
        with np.errstate(invalid="ignore", over="ignore"):
            hi, lo, err = _merged(self.hi, self.lo, self.err, block.hi, block.lo, block.err)
        self.hi, self.lo, self.err = hi, lo, err
        self.infinite |= block.infinite | ~np.isfinite(hi) | ~np.isfinite(err)

    def upper(self) -> FloatArray:
        """Each column's sum rounded upwards: a float >= hi + lo + err >= the exact sum (the correctly
        rounded-up sum whenever every addition was exact, err = 0); +inf where a term was +inf.
        Buffered rows are summed first.

        Returns:
            A float64 array of shape (columns,), each entry >= the exact column sum.
        """
        self._fold_buffer()
        with np.errstate(invalid="ignore", over="ignore"):
            total = up_add(self.hi, up_add(self.lo, self.err))
        return np.where(self.infinite | ~np.isfinite(total), np.inf, total)


_smallest = np.minimum.reduce   # the ufuncs themselves: ndarray.min's Python wrapper costs as much as the reduction
_largest = np.maximum.reduce
_ERR_GROWTH = 1.0 + 8.0 * UNIT_ROUNDOFF  # covers the rounding of a sum of four nonnegative floats: (1 + u)^4 < 1 + 8u


def _merged(hi: FloatArray, lo: FloatArray, err: FloatArray, other_hi: FloatArray, other_lo: FloatArray,
            other_err: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(hi, lo, err) of the sum of two (hi + lo, err) pairs: TwoSums keep everything exact except
    two dropped error terms, which go into err with the other bounds (rounded upwards)."""
    high, carry = _two_sum(hi, other_hi)                # exact: hi + other_hi = high + carry
    low, dropped = _two_sum(lo, other_lo)               # exact: lo + other_lo = low + dropped
    low, dropped_too = _two_sum(low, carry)             # exact: low + carry = low' + dropped_too
    bound = (err + other_err + np.abs(dropped) + np.abs(dropped_too)) * _ERR_GROWTH
    high, low = _two_sum(high, low)                     # exact renormalisation
    return high, low, bound


class BlockSum:
    """A block of rows summed column by column, ready to be added to an UpperSum (`UpperSum.absorb`):
    checking and summing a block are one pass, so a caller can refuse a block before anything is added.

    Attributes:
      hi, lo, err: as in UpperSum, |exact - (hi + lo)| <= err per column (outside `infinite`).
      infinite: the columns holding +inf (or whose sum overflowed).
      smallest: each column's smallest term (+inf for no rows), NaN in a column holding NaN; when
        the block holds NaN or -inf (`refused`) it was not summed and its sums are zero.
    """

    __slots__ = ("hi", "lo", "err", "infinite", "smallest")

    def __init__(self, hi: FloatArray, lo: FloatArray, err: FloatArray, infinite: npt.NDArray[np.bool_],
                 smallest: FloatArray) -> None:
        self.hi, self.lo, self.err, self.infinite, self.smallest = hi, lo, err, infinite, smallest

    def permuted(self, permutation: npt.NDArray[np.intp]) -> "BlockSum":
        """The same sums with the columns reordered (column sums of values[:, permutation]).

        Args:
            permutation: an index array over the columns.

        Returns:
            A new BlockSum whose column j is this one's column permutation[j].
        """
        return BlockSum(self.hi[permutation], self.lo[permutation], self.err[permutation], self.infinite[permutation],
                        self.smallest[permutation])

    @property
    def refused(self) -> bool:
        """Whether the block holds NaN or -inf (no sum of privacy losses does): it was not summed."""
        return not bool(_smallest(self.smallest) > -math.inf)

    @classmethod
    def of(cls, rows: FloatArray) -> "BlockSum":
        """Sum an (n, k) float64 block chunk by chunk (`_extracted_sum`), in one pass that also finds
        each column's smallest term. A block holding NaN or -inf is not summed: its `smallest` says so
        (NaN wherever any term of the block is NaN) and its sums are zero.

        Args:
            rows: the terms, a float64 array of shape (n, k), n >= 0.

        Returns:
            The block's BlockSum.
        """
        columns = rows.shape[1]
        hi, lo, err = np.zeros(columns), np.zeros(columns), np.zeros(columns)
        infinite = np.zeros(columns, dtype=bool)
        smallest = np.full(columns, np.inf)
        with np.errstate(invalid="ignore", over="ignore"):
            for start in range(0, rows.shape[0], CHUNK_ROWS):
                chunk = rows[start:start + CHUNK_ROWS]
                chunk_smallest = np.minimum.reduce(chunk, axis=0)
                if not _smallest(chunk_smallest) > -math.inf:   # NaN or -inf: refused, report it exactly
                    return cls(hi * 0.0, lo * 0.0, err * 0.0, infinite, np.minimum.reduce(rows, axis=0))
                np.minimum(smallest, chunk_smallest, out=smallest)
                chunk_largest = np.maximum.reduce(chunk, axis=0)
                if _largest(chunk_largest) == math.inf:
                    infinite |= chunk_largest == math.inf
                    chunk = np.where(chunk == math.inf, 0.0, chunk)  # the column is +inf whatever the rest adds
                    chunk_largest = np.maximum.reduce(chunk, axis=0)
                magnitude = np.maximum(chunk_largest, np.negative(chunk_smallest))
                tau, rho, bound, huge = _extracted_sum(chunk, magnitude)
                if huge.any():
                    tau[huge], rho[huge], bound[huge] = _block_sum(chunk[:, huge])
                hi, lo, err = _merged(hi, lo, err, tau, rho, bound)
        return cls(hi, lo, err, infinite | ~np.isfinite(hi) | ~np.isfinite(err), smallest)


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
