"""Directed rounding of privacy numbers: floating-point error may over-state a loss, never
under-state it. Every rounding-up in the package uses these, so the bound is stated once."""
from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

ROUNDING_ULPS = 8.0 * np.finfo(np.float64).eps
"""Relative error allowance per computed quantity: 8 ulps of the magnitudes that formed it."""

SMALLEST_POSITIVE = float(np.finfo(np.float64).smallest_subnormal)

UNIT_ROUNDOFF = 2.0 ** -53
"""u of float64: a sum of n nonnegative terms, added in any order (any vector width, any chunking),
is within (n - 1) u / (1 - (n - 1) u) of the exact sum, relative (Higham 2002, Section 4.2). The
kernels add (n + 2) u for their n-term sums on top of the per-term allowance (log2 n alone, which a
pairwise sum would need, does not hold for a recursive one)."""

Losses = TypeVar("Losses", float, npt.NDArray[np.float64])
"""One privacy loss (a float; numpy's float64 is one) or an array of them."""


def positive_floor(values: Losses) -> Losses:
    """A loss that is positive in exact arithmetic but underflowed is reported as the smallest float,
    never 0: an all-zero curve converts to epsilon 0 (a mechanism that reads no data).

    Args:
        values: RDP values (a float or a float64 array), each positive in exact arithmetic.

    Returns:
        values with every entry below the smallest positive float (5e-324) raised to it; a float
        for a float, an array of the same shape for an array.
    """
    floored: Losses = np.maximum(values, SMALLEST_POSITIVE)  # numpy's stubs type np.maximum of floats as Any
    return floored
