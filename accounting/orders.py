"""The Renyi order grid.

The default grid is dp-accounting's (1.1..10.9 step 0.1, 11..63, 128, 256, 512, 1024), which
already holds the orders the papers run at (alpha=6 for PMixED, alpha=18 for AdaPMixED).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import numpy.typing as npt

from dpledger.accounting.errors import require

_GRID_DECIMALS = 10  # orders are rounded so that 6.000000001 and 6 name the same order


def validated_orders(orders: Iterable[float]) -> npt.NDArray[np.float64]:
    """orders as a non-empty 1-D float64 array, each finite and > 1 (any order, repeats allowed);
    ValueError naming the first bad entry otherwise.

    Args:
        orders: Renyi orders, a sequence or 1-D array of real numbers.

    Returns:
        The orders as a new 1-D float64 array, in the order given.

    Raises:
        ValueError: a string, a non-sequence, non-numeric entries, an empty or multi-dimensional
            array, or an order that is not finite and > 1.
    """
    if isinstance(orders, (str, bytes)) or not hasattr(orders, "__len__") and not hasattr(orders, "__iter__"):
        raise ValueError(f"orders must be a non-empty 1-D sequence of numbers, got {orders!r}")
    raw = np.asarray(list(orders) if not hasattr(orders, "dtype") else orders)
    require(raw.dtype.kind in "biuf", f"orders must be numbers, got {raw.tolist()[:8]!r}")
    values = raw.astype(np.float64)
    require(values.ndim == 1 and values.size > 0, f"orders must be a non-empty 1-D sequence, got shape {values.shape}")
    bad = ~(np.isfinite(values) & (values > 1))  # NaN fails the comparison
    if np.any(bad):
        raise ValueError(f"every Renyi order must be finite and > 1, got {float(values[bad][0])!r}")
    return values


def _on_grid(values: npt.NDArray[np.float64], downward: bool = False) -> npt.NDArray[np.float64]:
    """Orders kept to 10 decimals; with `downward`, never moved up by more than float noise (a
    value stated at order a holds at every order below it, not above: moving 1.00000000016 up to
    1.0000000002 would lower the converted epsilon by 20%)."""
    # from 2^52 on every double is an integer, so rounding is the identity; skipping it there keeps
    # values * 10^10 from overflowing to inf (1e308 was refused as "got inf")
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.where(values < 2.0 ** 52, np.round(values, _GRID_DECIMALS), values)
    if downward:
        up = rounded > values + 4.0 * np.spacing(values)
        rounded[up] = np.round(rounded[up] - 10.0 ** -_GRID_DECIMALS, _GRID_DECIMALS)
    if np.any(rounded <= 1):
        raise ValueError(f"every Renyi order must exceed 1 by at least 1e-10 (orders are kept to 10 decimals), "
                         f"got {float(values[rounded <= 1][0])!r}")
    return rounded


def canonical_orders(orders: Iterable[float]) -> tuple[float, ...]:
    """Return orders as a sorted tuple of unique floats, each finite and > 1; ValueError otherwise.

    Args:
        orders: Renyi orders, each finite and > 1, in any order, repeats allowed.

    Returns:
        The distinct orders, each rounded to 10 decimals (so 6.000000001 and 6 name one order), sorted
        ascending, as Python floats.

    Raises:
        ValueError: an order that is not a finite number > 1, or within 1e-10 of 1.
    """
    return tuple(float(v) for v in np.unique(_on_grid(validated_orders(orders))))


def paired_orders(orders: Iterable[float]) -> tuple[tuple[float, ...], npt.NDArray[np.intp]]:
    """Sorted orders and the permutation that sorts them, so values given beside `orders` can be
    reordered with them; ValueError for a repeated order (two values for one order is ambiguous).
    Orders are kept to 10 decimals, never rounded upward (see _on_grid).

    Args:
        orders: distinct Renyi orders, each finite and > 1, in any order.

    Returns:
        (the orders sorted ascending as a tuple of floats, the index array that sorts the given
        orders): values given beside `orders` are reordered by indexing them with it.

    Raises:
        ValueError: an order that is not a finite number > 1, or two orders that name the same order.
    """
    values = _on_grid(validated_orders(orders), downward=True)
    sorted_orders = canonical_orders(values)
    require(len(sorted_orders) == values.size,
            f"orders must be distinct, got a repeated order among {values.tolist()[:8]}")
    return sorted_orders, np.argsort(values, kind="stable")


def default_orders(*extra: float) -> tuple[float, ...]:
    """dp-accounting's default grid of Renyi orders (1.1 to 10.9 by 0.1, 11 to 63, 128, 256, 512,
    1024), plus any extra orders a mechanism is run at.

    Args:
        *extra: further orders > 1 (e.g. PMixED's projection order).

    Returns:
        The sorted, de-duplicated orders.

    Raises:
        ValueError: an extra order that is not a finite number > 1.
    """
    fine = np.linspace(1.1, 10.9, 99)
    integers = np.arange(11, 64, dtype=np.float64)
    large = np.array([128.0, 256.0, 512.0, 1024.0])
    return canonical_orders(np.concatenate([fine, integers, large, np.asarray(extra, dtype=np.float64)]))


DEFAULT_ORDERS: tuple[float, ...] = default_orders()
