"""Validation helpers shared by every package: bad input raises ValueError naming the constraint."""
from __future__ import annotations

import argparse
import enum
import math
from typing import NoReturn, SupportsFloat, SupportsIndex, SupportsInt, TypeGuard, TypeVar

import numpy as np

MemberT = TypeVar("MemberT", bound=enum.Enum)

EXIT_BAD_INPUT = 2
"""The exit status of a command given bad input (a usage error or a ValueError)."""


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse with its usage errors on one line (the usage block is in --help), exit status 2: the
    `dpledger` command's parser and every module run as a command (python -m dpledger.mechanisms.warmup).
    Subcommand parsers inherit the class (argparse's add_subparsers uses type(self))."""

    def error(self, message: str) -> NoReturn:
        """Print the usage error on one line, with a pointer to --help, and exit with status 2.

        Args:
            message: argparse's message (its whitespace collapsed to single spaces).

        Raises:
            SystemExit: always, with status EXIT_BAD_INPUT (2).
        """
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def require(condition: bool, message: str) -> None:
    """Raise ValueError(message) unless condition holds (never `assert`: it vanishes under -O).

    Args:
        condition: the constraint, already evaluated (a Python bool; wrap numpy results in bool()).
        message: the error's text, naming the value and the constraint it broke.

    Raises:
        ValueError: with `message`, when condition is false.
    """
    if not condition:
        raise ValueError(message)


def require_member(kind: type[MemberT], name: str, value: object) -> MemberT:
    """The member of enum `kind` that `value` is or names; ValueError listing the names otherwise.

    Args:
        kind: the enum class.
        name: what the value is, for the error message (e.g. "method").
        value: a member of `kind`, or the value of one (e.g. "improved").

    Returns:
        The member itself, or the member whose value equals `value`.

    Raises:
        ValueError: when `value` is neither a member nor a member's value; the message lists the values.
    """
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {[member.value for member in kind]}, got {value!r}") from None


def _float_convertible(value: object) -> TypeGuard[SupportsFloat | SupportsIndex]:
    """Whether float() may be tried on value: its type defines __float__ or __index__, the two hooks
    float() calls on anything but a string or a buffer (a type check, far cheaper than isinstance
    with the runtime protocols)."""
    kind = type(value)
    return hasattr(kind, "__float__") or hasattr(kind, "__index__")


def _int_convertible(value: object) -> TypeGuard[SupportsInt | SupportsIndex]:
    """Whether int() may be tried on value: its type defines __int__ or __index__."""
    kind = type(value)
    return hasattr(kind, "__int__") or hasattr(kind, "__index__")


def _real(name: str, value: object) -> float:
    """value as a float, or ValueError naming it when it is not a real number (a string such as
    "1e-5" is not a number here: it would hide a caller's parsing bug)."""
    if isinstance(value, (str, bytes, bool)) or not _float_convertible(value):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None


def require_finite(name: str, value: object) -> float:
    """Return value as float, or raise naming it when it is NaN, inf or not a number.

    Args:
        name: what the value is, for the error message.
        value: a real number (int, float, numpy scalar, ...); strings and bools are refused.

    Returns:
        float(value), finite.

    Raises:
        ValueError: when value is not a real number, or is NaN or +-inf.
    """
    as_float = _real(name, value)
    require(math.isfinite(as_float), f"{name} must be finite, got {value!r}")
    return as_float


def require_not_nan(name: str, value: object) -> float:
    """Return value as float, +inf and -inf included (+inf is "no guarantee"), or raise naming it when
    it is NaN or not a real number: a NaN never becomes a number silently.

    Args:
        name: what the value is, for the error message.
        value: a real number, infinities included; strings and bools are refused.

    Returns:
        float(value), never NaN.

    Raises:
        ValueError: when value is NaN or not a real number.
    """
    as_float = _real(name, value)
    require(not math.isnan(as_float), f"{name} must be a number, got nan")
    return as_float


def require_str(name: str, value: object) -> str:
    """Return value, or raise naming it unless it is a non-empty string.

    Args:
        name: what the value is, for the error message.
        value: the value to check.

    Returns:
        value itself, a non-empty str.

    Raises:
        ValueError: when value is not a str, or is the empty string.
    """
    if not isinstance(value, str) or value == "":
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def require_in_closed(name: str, value: object, low: float, high: float) -> float:
    """Return value as float, or raise naming it unless it is finite and in [low, high].

    Args:
        name: what the value is, for the error message.
        value: a real number.
        low: the smallest value allowed.
        high: the largest value allowed.

    Returns:
        float(value), with low <= value <= high.

    Raises:
        ValueError: when value is not a finite real number or lies outside [low, high].
    """
    as_float = require_finite(name, value)
    require(low <= as_float <= high, f"{name} must be in [{low:g}, {high:g}], got {as_float:g}")
    return as_float


def require_in_open(name: str, value: object, low: float, high: float) -> float:
    """Return value as float, or raise naming it unless it is finite and in (low, high).

    Args:
        name: what the value is, for the error message.
        value: a real number.
        low: the bound the value must exceed (e.g. 0 for a delta).
        high: the bound the value must stay below (e.g. 1 for a delta).

    Returns:
        float(value), with low < value < high.

    Raises:
        ValueError: when value is not a finite real number or lies outside (low, high).
    """
    as_float = require_finite(name, value)
    require(low < as_float < high, f"{name} must be in ({low:g}, {high:g}), got {as_float:g}")
    return as_float


def require_positive(name: str, value: object) -> float:
    """Return value as float, or raise naming it unless it is finite and > 0.

    Args:
        name: what the value is, for the error message.
        value: a real number.

    Returns:
        float(value), finite and > 0.

    Raises:
        ValueError: when value is not a finite real number > 0.
    """
    as_float = require_finite(name, value)
    require(as_float > 0, f"{name} must be > 0, got {as_float:g}")
    return as_float


def require_non_negative(name: str, value: object) -> float:
    """Return value as float, or raise naming it unless it is finite and >= 0.

    Args:
        name: what the value is, for the error message.
        value: a real number.

    Returns:
        float(value), finite and >= 0.

    Raises:
        ValueError: when value is not a finite real number >= 0.
    """
    as_float = require_finite(name, value)
    require(as_float >= 0, f"{name} must be >= 0, got {as_float:g}")
    return as_float


def require_order(name: str, value: object) -> float:
    """Return value as float, or raise naming it unless it is a Renyi order: finite and > 1.

    Args:
        name: what the value is, for the error message.
        value: a real number.

    Returns:
        float(value), finite and > 1.

    Raises:
        ValueError: when value is not a finite real number > 1.
    """
    as_float = require_finite(name, value)
    require(as_float > 1, f"{name} (Renyi order) must be > 1, got {as_float:g}")
    return as_float


def require_bool(name: str, value: object) -> bool:
    """Return value as bool, or raise naming it unless it is True or False (NaN is not a truth value).

    Args:
        name: what the value is, for the error message.
        value: a Python bool or a numpy bool; 0, 1 and other truthy values are refused.

    Returns:
        bool(value).

    Raises:
        ValueError: when value is not a bool or numpy bool.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def require_int_at_least(name: str, value: object, low: int) -> int:
    """Return value as int, or raise naming it unless it is an integer >= low.

    Args:
        name: what the value is, for the error message.
        value: an integer, or a number with an integral value (3.0, numpy integers); bools and
            strings are refused.
        low: the smallest value allowed.

    Returns:
        int(value), >= low.

    Raises:
        ValueError: when value is not an integral number, or is below low.
    """
    try:
        integral = (not isinstance(value, (bool, str, bytes)) and _float_convertible(value)
                    and float(value).is_integer())
    except (TypeError, ValueError, OverflowError):
        integral = False
    if not integral or not _int_convertible(value):
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    as_int = int(value)
    require(as_int >= low, f"{name} must be an integer >= {low}, got {as_int}")
    return as_int
