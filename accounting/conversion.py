"""RDP -> (epsilon, delta) conversions (SPEC section 2).

Each conversion is evaluated at every order of the curve and minimised over orders. The result
names the optimal order and the method, and warns when the optimum sits at an edge of the grid
(then a richer grid might give a smaller epsilon).
"""
from __future__ import annotations

import enum
import math
import warnings
from dataclasses import dataclass

import numpy as np

from accounting.curve import RdpCurve
from accounting.errors import require_in_open, require_non_negative


class ConversionMethod(enum.Enum):
    IMPROVED = "improved"
    """Balle et al. 2020, Theorem 21 (seed Theorem A.3)."""
    CLASSIC = "classic"
    """Mironov 2017, Proposition 3."""

    def __str__(self) -> str:
        return self.value


class GridEdgeWarning(UserWarning):
    """The optimal order is the smallest or largest order on the grid."""


@dataclass(frozen=True)
class EpsilonConversion:
    """Result of an RDP -> (epsilon, delta) conversion.

    Attributes:
      epsilon: the smallest epsilon over the grid (+inf if no order gives a guarantee).
      delta: the delta it holds at.
      order: the optimal Renyi order (None when epsilon is +inf).
      method: which conversion was used.
      rdp_at_order: the curve's RDP value at the optimal order.
      conversion_term: epsilon - rdp_at_order (Table 2b's "RDP to DP" row).
      at_grid_edge: True when the optimal order is the grid's first or last.
      data_dependent: carried over from the curve.
    """

    epsilon: float
    delta: float
    order: float | None
    method: ConversionMethod
    rdp_at_order: float
    conversion_term: float
    at_grid_edge: bool
    data_dependent: bool


@dataclass(frozen=True)
class DeltaConversion:
    """Result of an epsilon -> delta conversion: the smallest delta over the grid."""

    delta: float
    epsilon: float
    order: float | None
    at_grid_edge: bool
    data_dependent: bool


def conversion_terms(orders: np.ndarray, delta: float, method: ConversionMethod) -> np.ndarray:
    """The part of epsilon(order) beyond RDP(order), for each order.

    improved (Balle et al. 2020, Theorem 21; seed Theorem A.3):
        log((a-1)/a) - (log(delta) + log(a)) / (a-1)
    classic (Mironov 2017, Proposition 3):
        log(1/delta) / (a-1)
    """
    orders = np.asarray(orders, dtype=np.float64)
    if method is ConversionMethod.IMPROVED:
        return np.log1p(-1.0 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1.0)
    if method is ConversionMethod.CLASSIC:
        return -math.log(delta) / (orders - 1.0)
    raise ValueError(f"method must be one of {[m.value for m in ConversionMethod]}, got {method!r}")


def _warn_if_edge(at_edge: bool, order: float | None, curve: RdpCurve) -> None:
    if at_edge:
        warnings.warn(
            f"optimal Renyi order {order:g} is at the edge of the grid "
            f"[{curve.orders[0]:g}, {curve.orders[-1]:g}]; extend the grid for a possibly smaller value",
            GridEdgeWarning, stacklevel=3)


def epsilon_from_rdp(curve: RdpCurve, delta: float,
                     method: ConversionMethod | str = ConversionMethod.IMPROVED) -> EpsilonConversion:
    """Smallest epsilon such that the curve implies (epsilon, delta)-DP, minimised over orders.

    The improved conversion is Balle et al. 2020 Theorem 21 (seed Theorem A.3); the classic one is
    Mironov 2017 Proposition 3. epsilon is clipped below at 0 (DP with epsilon < 0 is meaningless),
    in which case conversion_term = -rdp_at_order so that rdp + term still equals epsilon.
    A curve that is 0 at every order is a mechanism whose output does not depend on the data: it is
    (0, 0)-DP, so epsilon = 0 with no optimal order (the conversion formulas would add a spurious
    positive term).
    """
    delta = require_in_open("delta", delta, 0.0, 1.0)
    method = ConversionMethod(method) if isinstance(method, str) else method
    orders = np.asarray(curve.orders)
    if not np.any(curve.values):
        return EpsilonConversion(0.0, delta, None, method, 0.0, 0.0, False, curve.data_dependent)
    with np.errstate(invalid="ignore"):
        eps_per_order = curve.values + conversion_terms(orders, delta, method)
    if not np.any(np.isfinite(eps_per_order)):
        return EpsilonConversion(math.inf, delta, None, method, math.inf, math.nan, False, curve.data_dependent)
    best = int(np.nanargmin(np.where(np.isfinite(eps_per_order), eps_per_order, np.inf)))
    epsilon = max(0.0, float(eps_per_order[best]))
    rdp = float(curve.values[best])
    at_edge = best in (0, len(orders) - 1)
    _warn_if_edge(at_edge, float(orders[best]), curve)
    return EpsilonConversion(epsilon, delta, float(orders[best]), method, rdp, epsilon - rdp, at_edge,
                             curve.data_dependent)


def delta_from_rdp(curve: RdpCurve, epsilon: float) -> DeltaConversion:
    """Smallest delta such that the curve implies (epsilon, delta)-DP, minimised over orders.

    Inverse of the improved conversion (Balle et al. 2020, Theorem 21; SPEC section 2):
        log delta(a) = (a-1)(RDP(a) - epsilon) + (a-1) log(1 - 1/a) - log(a),
    and, at every order, the total-variation bound delta <= TV <= sqrt(1 - exp(-KL)) with
    KL <= RDP(a) (Bretagnolle-Huber; RDP is non-decreasing in the order), which is tighter when the
    RDP value is tiny. delta is capped at 1.
    """
    epsilon = require_non_negative("epsilon", epsilon)
    orders = np.asarray(curve.orders)
    values = curve.values
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_delta_rdp = (orders - 1.0) * (values - epsilon + np.log1p(-1.0 / orders)) - np.log(orders)
        log_delta_tv = np.where(values == 0, -np.inf, 0.5 * np.log1p(-np.exp(-values)))
    log_delta = np.minimum(np.nan_to_num(log_delta_rdp, nan=np.inf), np.nan_to_num(log_delta_tv, nan=np.inf))
    best = int(np.argmin(log_delta))
    if not np.isfinite(values[best]):
        return DeltaConversion(1.0, epsilon, None, False, curve.data_dependent)
    delta = float(min(1.0, math.exp(min(0.0, float(log_delta[best])))))
    at_edge = best in (0, len(orders) - 1)
    _warn_if_edge(at_edge, float(orders[best]), curve)
    return DeltaConversion(delta, epsilon, float(orders[best]), at_edge, curve.data_dependent)
