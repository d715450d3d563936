"""RDP curves and their composition (SPEC section 2; Mironov 2017, Proposition 1).

A curve is a vector of RDP values over a fixed sorted order grid. +inf is legal and means
"no guarantee at this order". Composition adds curves order by order (seed Theorem A.2); the result
is data-dependent when any part is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from accounting.errors import require, require_int_at_least
from accounting.orders import DEFAULT_ORDERS, canonical_orders
from accounting.relation import NeighbouringRelation


@dataclass(frozen=True, eq=False)
class RdpCurve:
    """RDP epsilon at each order of `orders`; immutable.

    Attributes:
      orders: sorted Renyi orders, each > 1.
      values: epsilon(order) >= 0 at each order; +inf where nothing is guaranteed.
      relation: the neighbouring relation the values hold for.
      data_dependent: True when the values depend on the private data (then they are a
        data-dependent loss, not a releasable DP guarantee; seed section 3.1).
    """

    orders: tuple[float, ...]
    values: np.ndarray
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE
    data_dependent: bool = False
    _order_index: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        orders = canonical_orders(self.orders)
        require(len(orders) == len(self.orders), f"orders must be sorted and unique, got {list(self.orders)[:8]}...")
        values = np.array(self.values, dtype=np.float64, copy=True)
        require(values.shape == (len(orders),),
                f"values must have one entry per order ({len(orders)}), got shape {values.shape}")
        require(not bool(np.any(np.isnan(values))), "RDP values must not be NaN (use +inf for 'no guarantee')")
        require(bool(np.all(values >= 0)), f"RDP values must be >= 0, got min {values.min():g}")
        require(isinstance(self.relation, NeighbouringRelation),
                f"relation must be a NeighbouringRelation, got {self.relation!r}")
        values.setflags(write=False)
        object.__setattr__(self, "orders", orders)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "data_dependent", bool(self.data_dependent))
        object.__setattr__(self, "_order_index", {o: i for i, o in enumerate(orders)})

    @classmethod
    def zero(cls, orders: Sequence[float] = DEFAULT_ORDERS,
             relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE) -> "RdpCurve":
        """The curve of a mechanism that reveals nothing (the identity of composition)."""
        return cls(tuple(orders), np.zeros(len(orders)), relation, False)

    def value_at(self, order: float) -> float:
        """epsilon at `order`, which must lie on the grid (no interpolation: RDP is not linear)."""
        key = canonical_orders([order])[0]
        require(key in self._order_index, f"order {order:g} is not on this curve's grid")
        return float(self.values[self._order_index[key]])

    def _check_compatible(self, other: "RdpCurve") -> None:
        if not isinstance(other, RdpCurve):
            raise TypeError(f"can only compose an RdpCurve with an RdpCurve, got {type(other).__name__}")
        require(self.orders == other.orders, "cannot compose curves on different order grids")
        require(self.relation == other.relation,
                f"cannot compose curves for different neighbouring relations: {self.relation} vs {other.relation}")

    def __add__(self, other: "RdpCurve") -> "RdpCurve":
        """Adaptive composition: RDP adds order by order (Mironov 2017, Proposition 1)."""
        self._check_compatible(other)
        return RdpCurve(self.orders, self.values + other.values, self.relation,
                        self.data_dependent or other.data_dependent)

    def composed(self, times: int) -> "RdpCurve":
        """k-fold composition of this curve with itself: k * epsilon(order)."""
        times = require_int_at_least("times", times, 0)
        with np.errstate(invalid="ignore"):
            values = np.where(np.isinf(self.values) & (times == 0), 0.0, self.values * times)
        return RdpCurve(self.orders, values, self.relation, self.data_dependent)

    def __repr__(self) -> str:
        finite = np.isfinite(self.values)
        return (f"RdpCurve({len(self.orders)} orders {self.orders[0]:g}..{self.orders[-1]:g}, "
                f"finite at {int(finite.sum())}, relation={self.relation}, data_dependent={self.data_dependent})")

    def to_dict(self) -> dict:
        """JSON-safe form; +inf is written as the string "inf" so JSON stays standard."""
        return {
            "orders": list(self.orders),
            "values": [float(v) if np.isfinite(v) else "inf" for v in self.values],
            "relation": self.relation.value,
            "data_dependent": self.data_dependent,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "RdpCurve":
        try:
            values = [float("inf") if v == "inf" else float(v) for v in data["values"]]
            return cls(tuple(data["orders"]), np.asarray(values), NeighbouringRelation(data["relation"]),
                       bool(data["data_dependent"]))
        except KeyError as missing:
            raise ValueError(f"RDP curve record lacks the field {missing}") from None


def compose_curves(curves: Iterable[RdpCurve]) -> RdpCurve:
    """Sum of a non-empty sequence of curves on one grid and relation."""
    curves = list(curves)
    require(len(curves) > 0, "compose_curves needs at least one curve")
    total = curves[0]
    for curve in curves[1:]:
        total = total + curve
    return total
