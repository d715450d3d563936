"""Shared arithmetic for the oracles: every function runs at DPS decimal digits in mpmath.

Plain Python + mpmath only. Floats given to an oracle are converted exactly (mpmath.mpf of a
binary64 number is exact), so an oracle evaluates the formula at exactly the inputs the fast code
saw; only the oracle's own arithmetic rounds, at ~1e-60 relative.
"""
from __future__ import annotations

import functools
import math

import mpmath

DPS = 60
"""Decimal digits of every oracle computation (>= 50 as required for a reference)."""

INF = mpmath.inf


def precise(function):
    """Run `function` at DPS digits, restoring the caller's mpmath precision afterwards."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with mpmath.workdps(DPS):
            return function(*args, **kwargs)

    return wrapper


def mp(value):
    """An exact mpf of a Python/numpy float, int or mpf; ValueError for NaN."""
    if isinstance(value, mpmath.mpf):
        result = value
    elif isinstance(value, int):
        result = mpmath.mpf(value)
    else:
        as_float = float(value)
        if math.isnan(as_float):
            raise ValueError("oracle input must not be NaN")
        result = mpmath.mpf(as_float)
    return result


def order(alpha):
    """A Renyi order > 1 as an exact mpf."""
    a = mp(alpha)
    if not a > 1:
        raise ValueError(f"Renyi order must be > 1, got {alpha!r}")
    return a


def integer_order(alpha) -> int:
    """The integer order charged for `alpha`: max(2, ceil(alpha)) (exact ceiling, no fudge)."""
    a = order(alpha)
    return max(2, int(mpmath.ceil(a)))


def vector(values) -> list:
    """A list of exact mpfs from any sequence of numbers."""
    return [mp(v) for v in values]
