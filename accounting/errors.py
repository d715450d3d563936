"""Validation helpers shared by every package: bad input raises ValueError naming the constraint."""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def require(condition: bool, message: str) -> None:
    """Raise ValueError(message) unless condition holds (never `assert`: it vanishes under -O)."""
    if not condition:
        raise ValueError(message)


def require_member(kind, name: str, value):
    """The member of enum `kind` that `value` is or names; ValueError listing the names otherwise."""
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {[member.value for member in kind]}, got {value!r}") from None


def _real(name: str, value: Any) -> float:
    """value as a float, or ValueError naming it when it is not a real number (a string such as
    "1e-5" is not a number here: it would hide a caller's parsing bug)."""
    if isinstance(value, (str, bytes, bool)):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None


def require_finite(name: str, value: Any) -> float:
    """Return value as float, or raise naming it when it is NaN, inf or not a number."""
    as_float = _real(name, value)
    require(math.isfinite(as_float), f"{name} must be finite, got {value!r}")
    return as_float


def require_not_nan(name: str, value: Any) -> float:
    """Return value as float, +inf and -inf included (+inf is "no guarantee"), or raise naming it when
    it is NaN or not a real number: a NaN never becomes a number silently."""
    as_float = _real(name, value)
    require(not math.isnan(as_float), f"{name} must be a number, got nan")
    return as_float


def require_str(name: str, value: Any) -> str:
    """Return value, or raise naming it unless it is a non-empty string."""
    require(isinstance(value, str) and value != "", f"{name} must be a non-empty string, got {value!r}")
    return value


def require_in_closed(name: str, value: Any, low: float, high: float) -> float:
    value = require_finite(name, value)
    require(low <= value <= high, f"{name} must be in [{low:g}, {high:g}], got {value:g}")
    return value


def require_in_open(name: str, value: Any, low: float, high: float) -> float:
    value = require_finite(name, value)
    require(low < value < high, f"{name} must be in ({low:g}, {high:g}), got {value:g}")
    return value


def require_positive(name: str, value: Any) -> float:
    value = require_finite(name, value)
    require(value > 0, f"{name} must be > 0, got {value:g}")
    return value


def require_non_negative(name: str, value: Any) -> float:
    value = require_finite(name, value)
    require(value >= 0, f"{name} must be >= 0, got {value:g}")
    return value


def require_order(name: str, value: Any) -> float:
    value = require_finite(name, value)
    require(value > 1, f"{name} (Renyi order) must be > 1, got {value:g}")
    return value


def require_bool(name: str, value: Any) -> bool:
    """Return value as bool, or raise naming it unless it is True or False (NaN is not a truth value)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def require_int_at_least(name: str, value: Any, low: int) -> int:
    try:
        integral = not isinstance(value, (bool, str, bytes)) and float(value).is_integer()
    except (TypeError, ValueError, OverflowError):
        integral = False
    if not integral:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    as_int = int(value)
    require(as_int >= low, f"{name} must be an integer >= {low}, got {as_int}")
    return as_int
