"""Directed rounding of privacy numbers: floating-point error may over-state a loss, never
under-state it. Every rounding-up in the package uses these, so the bound is stated once."""
from __future__ import annotations

import numpy as np

ROUNDING_ULPS = 8.0 * np.finfo(np.float64).eps
"""Relative error allowance per computed quantity: 8 ulps of the magnitudes that formed it."""

SMALLEST_POSITIVE = float(np.finfo(np.float64).smallest_subnormal)


def positive_floor(values):
    """A loss that is positive in exact arithmetic but underflowed is reported as the smallest float,
    never 0: an all-zero curve converts to epsilon 0 (a mechanism that reads no data)."""
    return np.maximum(values, SMALLEST_POSITIVE)
