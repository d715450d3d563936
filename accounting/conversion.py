"""RDP -> (epsilon, delta) conversions (Balle et al. 2020, Theorem 21; Mironov 2017, Proposition 3).

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
import numpy.typing as npt

from dpledger.accounting.curve import RdpCurve, require_curve
from dpledger.accounting.errors import (require, require_bool, require_finite, require_in_closed, require_in_open, require_member,
                               require_non_negative, require_not_nan, require_order)
from dpledger.accounting.relation import DivergenceDirection, NeighbouringRelation
from dpledger.accounting.rounding import ROUNDING_ULPS


class ConversionMethod(enum.Enum):
    IMPROVED = "improved"
    """Balle et al. 2020, Theorem 21."""
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
      direction: carried over from the curve (which divergence directions the result covers).
      relation: carried over from the curve (which neighbouring pairs the result covers).
    """

    epsilon: float
    delta: float
    order: float | None
    method: ConversionMethod
    rdp_at_order: float
    conversion_term: float
    at_grid_edge: bool
    data_dependent: bool
    direction: DivergenceDirection = DivergenceDirection.BOTH
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE

    def __post_init__(self) -> None:
        epsilon = require_not_nan("epsilon", self.epsilon)
        require(epsilon >= 0, f"epsilon must be >= 0 (+inf: no guarantee), got {epsilon:g}")
        rdp = require_not_nan("rdp_at_order", self.rdp_at_order)
        require(rdp >= 0, f"rdp_at_order must be >= 0 (+inf: no guarantee), got {rdp:g}")
        _set(self, epsilon=epsilon, delta=require_in_open("delta", self.delta, 0.0, 1.0),
             order=_optional_order(self.order), method=require_member(ConversionMethod, "method", self.method),
             rdp_at_order=rdp, conversion_term=require_finite("conversion_term", self.conversion_term),
             at_grid_edge=require_bool("at_grid_edge", self.at_grid_edge),
             data_dependent=require_bool("data_dependent", self.data_dependent),
             direction=require_member(DivergenceDirection, "direction", self.direction),
             relation=require_member(NeighbouringRelation, "relation", self.relation))


def _set(instance: object, **values: object) -> None:
    """Store validated, normalised field values on a frozen dataclass instance."""
    for name, value in values.items():
        object.__setattr__(instance, name, value)


def _optional_order(order: object) -> float | None:
    """None (no optimal order) or a finite Renyi order > 1."""
    return None if order is None else require_order("order", order)


@dataclass(frozen=True)
class DeltaConversion:
    """Result of an epsilon -> delta conversion: the smallest delta over the grid.

    `log_delta` is the bound's natural log, exact where `delta` would underflow; `delta` is
    rounded up, never down: a positive bound is never reported as 0.
    """

    delta: float
    epsilon: float
    order: float | None
    at_grid_edge: bool
    data_dependent: bool
    log_delta: float = 0.0
    direction: DivergenceDirection = DivergenceDirection.BOTH

    def __post_init__(self) -> None:
        log_delta = require_not_nan("log_delta", self.log_delta)
        require(log_delta <= 0, f"log_delta must be <= 0 (delta <= 1; -inf for delta = 0), got {log_delta:g}")
        _set(self, delta=require_in_closed("delta", self.delta, 0.0, 1.0),
             epsilon=require_non_negative("epsilon", self.epsilon), order=_optional_order(self.order),
             at_grid_edge=require_bool("at_grid_edge", self.at_grid_edge),
             data_dependent=require_bool("data_dependent", self.data_dependent), log_delta=log_delta,
             direction=require_member(DivergenceDirection, "direction", self.direction))


def conversion_terms(orders: npt.NDArray[np.float64], delta: float, method: ConversionMethod) -> npt.NDArray[np.float64]:
    """The part of epsilon(order) beyond RDP(order), for each order.

    improved (Balle et al. 2020, Theorem 21):
        log((a-1)/a) - (log(delta) + log(a)) / (a-1), with log((a-1)/a) formed as log(a-1) - log(a)
        (a - 1 is exact; log1p(-1/a) loses the digits of 1 - 1/a for orders near 1)
    classic (Mironov 2017, Proposition 3):
        log(1/delta) / (a-1)

    Args:
        orders: Renyi orders a, each > 1, an array (any shape).
        delta: target delta, in (0, 1).
        method: ConversionMethod.IMPROVED or CLASSIC (a member, not its name).

    Returns:
        A float64 array of orders' shape: epsilon(a) - RDP(a) at each order (the improved term is
        negative where a * delta >= 1).

    Raises:
        ValueError: an order <= 1 (or NaN), delta outside (0, 1), or a method that is not a
            ConversionMethod member.
    """
    a = np.asarray(orders, dtype=np.float64)
    require(bool(np.all(a > 1)), f"every Renyi order must be > 1, got {a.min():g}")
    delta = require_in_open("delta", delta, 0.0, 1.0)
    terms: npt.NDArray[np.float64]
    if method is ConversionMethod.IMPROVED:
        terms = np.log(a - 1.0) - np.log(a) - (math.log(delta) + np.log(a)) / (a - 1.0)
        return terms
    if method is ConversionMethod.CLASSIC:
        terms = -math.log(delta) / (a - 1.0)
        return terms
    raise ValueError(f"method must be one of {[m.value for m in ConversionMethod]}, got {method!r}")


def _warn_if_edge(at_edge: bool, order: float | None, curve: RdpCurve) -> None:
    if at_edge:
        warnings.warn(
            f"optimal Renyi order {order:g} is at the edge of the grid "
            f"[{curve.orders[0]:g}, {curve.orders[-1]:g}]; extend the grid for a possibly smaller value",
            GridEdgeWarning, stacklevel=3)


def conversion_method(method: ConversionMethod | str) -> ConversionMethod:
    """The method named by `method`; ValueError listing the names for anything else.

    Args:
        method: a ConversionMethod or its value ("improved", "classic").

    Returns:
        The ConversionMethod member.

    Raises:
        ValueError: when method names no conversion.
    """
    return require_member(ConversionMethod, "method", method)


def epsilon_from_rdp(curve: RdpCurve, delta: float,
                     method: ConversionMethod | str = ConversionMethod.IMPROVED) -> EpsilonConversion:
    """Smallest epsilon such that the curve implies (epsilon, delta)-DP, minimised over orders.

    The improved conversion is Balle et al. 2020 Theorem 21; the classic one is Mironov 2017
    Proposition 3. epsilon is clipped below at 0 (DP with epsilon < 0 is meaningless), in which
    case conversion_term = -rdp_at_order so that rdp + term still equals epsilon.
    A curve that is 0 at every order is a mechanism whose output does not depend on the data: it is
    (0, 0)-DP, so epsilon = 0 with no optimal order (the conversion formulas would add a spurious
    positive term). A curve that is +inf at every order gives epsilon = +inf ("no guarantee").
    epsilon is rounded up by a bound on its floating-point error (8 ulps of RDP + |term| + 1,
    about 2e-15 relative), never down.

    Args:
        curve: the composed RDP curve of everything released.
        delta: target delta, in (0, 1).
        method: ConversionMethod.IMPROVED (default) or CLASSIC, or their names.

    Returns:
        An EpsilonConversion: epsilon, the optimal order, the RDP value and conversion term there,
        and whether the optimum lies at the grid's edge (a GridEdgeWarning is issued then).

    Raises:
        ValueError: delta outside (0, 1), a method that does not exist, or a curve that is not an RdpCurve.
    """
    curve = require_curve(curve)
    delta = require_in_open("delta", delta, 0.0, 1.0)
    method = conversion_method(method)
    orders = np.asarray(curve.orders)
    if not np.any(curve.values):
        return EpsilonConversion(0.0, delta, None, method, 0.0, 0.0, False, curve.data_dependent, curve.direction,
                                 curve.relation)
    # curve values are never NaN (RdpCurve refuses them) and the terms are finite for orders > 1
    eps_per_order = curve.values + conversion_terms(orders, delta, method)
    if not np.any(np.isfinite(eps_per_order)):
        # no order guarantees anything: rdp_at_order + conversion_term = inf + 0 = epsilon, never NaN
        return EpsilonConversion(math.inf, delta, None, method, math.inf, 0.0, False, curve.data_dependent,
                                 curve.direction, curve.relation)
    best = int(np.argmin(eps_per_order))
    rdp = float(curve.values[best])
    # rounded up by a bound on the floating-point error of r + term, so rounding never under-states
    rounding = ROUNDING_ULPS * (rdp + abs(float(eps_per_order[best] - rdp)) + 1.0)
    epsilon = max(0.0, float(eps_per_order[best]) + rounding)
    at_edge = best in (0, len(orders) - 1)
    _warn_if_edge(at_edge, float(orders[best]), curve)
    return EpsilonConversion(epsilon, delta, float(orders[best]), method, rdp, epsilon - rdp, at_edge,
                             curve.data_dependent, curve.direction, curve.relation)


def rdp_branch_rounding_slack(order: npt.NDArray[np.float64], rdp: npt.NDArray[np.float64], epsilon: float
                              ) -> npt.NDArray[np.float64]:
    """Bound on the floating-point error of log delta(a) = (a-1)(r - eps + log(1-1/a)) - log a:
    8 ulps of the magnitudes that enter it (the subtraction r - eps is where digits are lost).

    Args:
        order: Renyi orders a, each > 1, an array.
        rdp: RDP values r at those orders, finite and >= 0, an array broadcastable against `order`.
        epsilon: the target epsilon, finite and >= 0.

    Returns:
        A float64 array of the broadcast shape: the amount to add to log delta(a) so that it is
        never below the exact value.
    """
    a = np.asarray(order, dtype=np.float64)
    return ROUNDING_ULPS * ((a - 1.0) * (np.asarray(rdp, dtype=np.float64) + epsilon + 1.0) + np.log(a) + 1.0)


def tv_branch_rounding_slack(log_delta_tv: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Bound on the floating-point error of 0.5 log(-expm1(-r)): 8 ulps of its magnitude.

    Args:
        log_delta_tv: the computed total-variation branch of log delta at each order, finite, an array.

    Returns:
        A float64 array of its shape: the amount to add so that it is never below the exact value.
    """
    return ROUNDING_ULPS * (np.abs(np.asarray(log_delta_tv, dtype=np.float64)) + 1.0)


def delta_from_rdp(curve: RdpCurve, epsilon: float) -> DeltaConversion:
    """Smallest delta such that the curve implies (epsilon, delta)-DP, minimised over orders.

    Inverse of the improved conversion (Balle et al. 2020, Theorem 21):
        log delta(a) = (a-1)(RDP(a) - epsilon) + (a-1) log(1 - 1/a) - log(a),
    and, at every order, the total-variation bound delta <= TV <= sqrt(1 - exp(-KL)) with
    KL <= RDP(a) (Bretagnolle & Huber 1979; RDP is non-decreasing in the order, van Erven &
    Harremoes 2014 Theorem 3), which is tighter when the RDP value is tiny. 1 - exp(-r) is formed as
    -expm1(-r), which keeps its digits for r down to the smallest float (log1p(-exp(-r)) returns
    -inf below r ~ 1e-16). delta is capped at 1 and rounded up by its floating-point error bound
    (`rdp_branch_rounding_slack`, `tv_branch_rounding_slack`), never down to 0.

    Args:
        curve: the composed RDP curve of everything released.
        epsilon: target epsilon, a finite number >= 0.

    Returns:
        A DeltaConversion: delta and the order attaining it.

    Raises:
        ValueError: epsilon negative or not finite, or a curve that is not an RdpCurve.
    """
    curve = require_curve(curve)
    epsilon = require_non_negative("epsilon", epsilon)
    orders = np.asarray(curve.orders)
    values = curve.values
    finite = np.isfinite(values)
    if not np.any(finite):
        return DeltaConversion(1.0, epsilon, None, False, curve.data_dependent, 0.0, curve.direction)
    log_delta = np.full(values.shape, np.inf)
    a, r = orders[finite], values[finite]
    with np.errstate(divide="ignore"):  # log(0) = -inf is the exact bound of a zero RDP value
        log_delta_rdp = (a - 1.0) * (r - epsilon + np.log(a - 1.0) - np.log(a)) - np.log(a)
        log_delta_tv = 0.5 * np.log(-np.expm1(-r))
    # rounded up by a bound on the floating-point error, so rounding never under-states delta
    log_delta_rdp = log_delta_rdp + rdp_branch_rounding_slack(a, r, epsilon)
    tv_finite = np.isfinite(log_delta_tv)  # -inf (a zero RDP value) is exact: no slack, never -inf + inf
    log_delta_tv[tv_finite] += tv_branch_rounding_slack(log_delta_tv[tv_finite])
    log_delta[finite] = np.minimum(log_delta_rdp, log_delta_tv)
    best = int(np.argmin(log_delta))
    best_log_delta = min(0.0, float(log_delta[best]))
    delta = min(1.0, float(np.nextafter(math.exp(best_log_delta), math.inf))) if best_log_delta > -math.inf else 0.0
    at_edge = best in (0, len(orders) - 1)
    _warn_if_edge(at_edge, float(orders[best]), curve)
    return DeltaConversion(delta, epsilon, float(orders[best]), at_edge, curve.data_dependent, best_log_delta,
                           curve.direction)
