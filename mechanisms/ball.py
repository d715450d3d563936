"""PMixED's Renyi ball around the public law: which ball (Flemings et al. 2024, Algorithm 2, or the
ball at every order) and the finite constraints that enforce the all-orders ball."""
from __future__ import annotations

import enum
from typing import Sequence


class Ball(enum.Enum):
    """Which Renyi ball PMixED projects each teacher onto."""

    PROJECTION_ORDER = "projection-order"
    """Flemings et al. 2024, Algorithm 2: D<->_alpha(pbar_i, p0) <= beta alpha at the one order alpha.
    Theorem 3.1's proof needs the ball at every order (Theorem A.5's hypothesis), so its bound is
    reported "as claimed"; an input with extreme tails exceeds it (a data-dependent loss of 4.2
    against 0.041; tests/test_all_orders_ball.py)."""

    ALL_ORDERS = "all-orders"
    """D<->_k(pbar_i, p0) <= beta k at every order k > 1, enforced on the grid ALL_ORDERS_BALL_GRID
    with slack (for k in (k_j, k_j+1], D_k <= D_k_j+1 <= beta k_j, k_0 = 1) and above it through
    D<->_inf <= beta k_max. This is the hypothesis of Theorem A.5 (Steinke 2022, Lemma 33.7) at every
    order, so Theorem 3.1 is proven at every order and the curve is finite everywhere."""

    def __str__(self) -> str:
        return self.value


ALL_ORDERS_BALL_GRID: tuple[float, ...] = tuple(float(1.2 ** i) for i in range(1, 39))
"""Orders at which ball="all-orders" enforces its radii: 1.2, 1.44, ..., 1.2^38 ~ 1022 (38 orders).
Between two of them the radius enforced is at least 1/1.2 of beta k; the ratio trades utility for
projection cost (each root-finding step evaluates every order)."""


def ball_named(value: "Ball | str") -> Ball:
    """The Ball named by `value`; ValueError listing the names for anything else.

    Args:
        value: a Ball, or its name ("projection-order" or "all-orders").

    Returns:
        The Ball.

    Raises:
        ValueError: if `value` names no Ball.
    """
    try:
        return Ball(value)
    except ValueError:
        raise ValueError(f"ball must be one of {[b.value for b in Ball]}, got {value!r}") from None


def all_orders_ball_constraints(beta: float, grid: Sequence[float] = ALL_ORDERS_BALL_GRID
                                ) -> tuple[tuple[float, ...], tuple[float, ...], float]:
    """(orders, radii, max_radius) enforcing D<->_k <= beta k at every k > 1 through a finite grid
    k_1 < ... < k_m: D<->_{k_j+1} <= beta k_j (k_0 = 1) and D<->_inf <= beta k_m. Since D_k is
    non-decreasing in k (van Erven & Harremoes 2014, Theorem 3), for k in (k_j, k_j+1]:
    D_k <= D_{k_j+1} <= beta k_j < beta k, and for k > k_m: D_k <= D_inf <= beta k_m < beta k.

    Args:
        beta: the all-orders ball's beta (D<->_k <= beta k), > 0.
        grid: the orders k_1 < ... < k_m > 1 to enforce (sorted here).

    Returns:
        (orders, radii, max_radius): the sorted grid, the radius in nats enforced at each of its orders
        (beta k_(j-1), k_0 = 1) and the radius of D<->_inf (beta k_m).
    """
    grid = tuple(sorted(float(k) for k in grid))
    lower = (1.0,) + grid[:-1]
    return grid, tuple(beta * k for k in lower), beta * grid[-1]
