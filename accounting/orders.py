"""The Renyi order grid.

The default grid is dp-accounting's (1.1..10.9 step 0.1, 11..63, 128, 256, 512, 1024), which
already holds the orders the papers run at (alpha=6 for PMixED, alpha=18 for AdaPMixED).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from accounting.errors import require

_GRID_DECIMALS = 10  # orders are rounded so that 6.000000001 and 6 name the same order


def canonical_orders(orders: Iterable[float]) -> tuple[float, ...]:
    """Return orders as a sorted tuple of unique floats, each > 1; ValueError otherwise."""
    values = np.round(np.asarray(list(orders), dtype=np.float64), _GRID_DECIMALS)
    require(values.ndim == 1 and values.size > 0, f"orders must be a non-empty 1-D sequence, got {values.shape}")
    require(bool(np.all(np.isfinite(values))), f"orders must be finite, got {values.tolist()}")
    require(bool(np.all(values > 1)), f"every Renyi order must be > 1, got min {values.min():g}")
    return tuple(float(v) for v in np.unique(values))


def paired_orders(orders: Iterable[float]) -> tuple[tuple[float, ...], np.ndarray]:
    """Sorted orders and the permutation that sorts them, so values given beside `orders` can be
    reordered with them; ValueError for a repeated order (two values for one order is ambiguous)."""
    values = np.round(np.asarray(list(orders), dtype=np.float64), _GRID_DECIMALS)
    sorted_orders = canonical_orders(values)
    require(len(sorted_orders) == values.size,
            f"orders must be distinct, got a repeated order among {values.tolist()[:8]}")
    return sorted_orders, np.argsort(values, kind="stable")


def default_orders(*extra: float) -> tuple[float, ...]:
    """dp-accounting's default grid, plus any extra orders a mechanism is run at."""
    fine = np.linspace(1.1, 10.9, 99)
    integers = np.arange(11, 64, dtype=np.float64)
    large = np.array([128.0, 256.0, 512.0, 1024.0])
    return canonical_orders(np.concatenate([fine, integers, large, np.asarray(extra, dtype=np.float64)]))


DEFAULT_ORDERS: tuple[float, ...] = default_orders()
