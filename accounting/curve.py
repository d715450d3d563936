"""RDP curves and their composition (Mironov 2017, Definition 4 and Proposition 1).

A curve is a vector of RDP values over a sorted order grid, each value kept with its own order.
+inf is legal and means "no guarantee at this order". Composition adds curves order by order
(Mironov 2017, Proposition 1); the result is data-dependent when any part is, and covers only the
divergence directions and the neighbouring pairs that every part covers. Every composed value is
rounded upwards, never below the exact sum (dpledger.accounting.summation).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence, TypeAlias

import numpy as np
import numpy.typing as npt

from dpledger.accounting.errors import require, require_bool, require_int_at_least
from dpledger.accounting.orders import DEFAULT_ORDERS, canonical_orders, paired_orders
from dpledger.accounting.relation import DivergenceDirection, NeighbouringRelation
from dpledger.accounting.strict_json import JsonObject
from dpledger.accounting.summation import up_add, up_multiply, upper_sum


@dataclass(frozen=True, eq=False)
class RdpCurve:
    """RDP epsilon at each order of `orders`; immutable.

    Attributes:
      orders: Renyi orders, each > 1 and distinct; given in any order, stored sorted.
      values: epsilon(order) >= 0 at each order, values[i] belonging to orders[i] as given (they
        are sorted together); +inf where nothing is guaranteed.
      relation: the neighbouring relation the values hold for.
      data_dependent: True when the values depend on the private data (then they are a
        data-dependent loss, not a releasable DP guarantee; Papernot et al. 2018, Section 3).
      direction: which divergence directions the values bound (DivergenceDirection.BOTH for a DP
        guarantee; FROM_ACTUAL for a bound on D(M(D) || M(D')) at the actual data only).
    """

    orders: tuple[float, ...]
    values: npt.NDArray[np.float64]
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE
    data_dependent: bool = False
    direction: DivergenceDirection = DivergenceDirection.BOTH
    _order_index: dict[float, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        orders, permutation, index = _validated_grid(self.orders)
        raw = self.values if type(self.values) is np.ndarray else np.asarray(self.values)
        if raw.dtype.kind not in "biuf":
            raise ValueError(f"RDP values must be real numbers, got dtype {raw.dtype}")
        values = raw.astype(np.float64)          # a copy: the curve owns its values
        if values.shape != (len(orders),):
            raise ValueError(f"values must have one entry per order ({len(orders)}), got shape {values.shape}")
        low = _smallest(values)      # NaN if any value is NaN: one reduction checks both
        if not low >= 0:
            require(not bool(np.any(np.isnan(values))), "RDP values must not be NaN (use +inf for 'no guarantee')")
            raise ValueError(f"RDP values must be >= 0, got min {low:g}")
        if not isinstance(self.relation, NeighbouringRelation):
            raise ValueError(f"relation must be a NeighbouringRelation, got {self.relation!r}")
        if not isinstance(self.direction, DivergenceDirection):
            raise ValueError(f"direction must be a DivergenceDirection, got {self.direction!r}")
        if type(self.data_dependent) is not bool:
            object.__setattr__(self, "data_dependent", require_bool("data_dependent", self.data_dependent))
        if permutation is not None:
            values = values[permutation]  # each value stays with its own order
        values.flags.writeable = False
        set_field = object.__setattr__
        set_field(self, "orders", orders)
        set_field(self, "values", values)
        set_field(self, "_order_index", index)

    @classmethod
    def zero(cls, orders: Sequence[float] = DEFAULT_ORDERS,
             relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE) -> "RdpCurve":
        """The curve of a mechanism that reveals nothing (the identity of composition).

        Args:
            orders: Renyi orders, each finite and > 1 (default: dp-accounting's grid, DEFAULT_ORDERS).
            relation: the neighbouring relation the curve is stated for.

        Returns:
            A data-independent curve, 0 at every order, on the sorted distinct orders.

        Raises:
            ValueError: an order that is not a finite number > 1, or a relation that is not a
                NeighbouringRelation.
        """
        orders = canonical_orders(orders)
        return cls(orders, np.zeros(len(orders)), relation, False)

    def value_at(self, order: float) -> float:
        """epsilon at `order`, which must lie on the grid (no interpolation: RDP is not linear).

        Args:
            order: a Renyi order of this curve's grid (rounded to 10 decimals before the look-up).

        Returns:
            The RDP epsilon at that order, a float >= 0 (+inf: no guarantee there).

        Raises:
            ValueError: order is not a finite number > 1, or is not on the grid.
        """
        key = canonical_orders([order])[0]
        require(key in self._order_index, f"order {order:g} is not on this curve's grid")
        return float(self.values[self._order_index[key]])

    def _check_compatible(self, other: "RdpCurve") -> None:
        if not isinstance(other, RdpCurve):
            raise TypeError(f"can only compose an RdpCurve with an RdpCurve, got {type(other).__name__}")
        require(self.orders == other.orders, "cannot compose curves on different order grids")

    def __add__(self, other: "RdpCurve") -> "RdpCurve":
        """Adaptive composition: RDP adds order by order (Mironov 2017, Proposition 1). The sum holds
        for the neighbours both curves cover (NeighbouringRelation.composed_with)."""
        self._check_compatible(other)
        return RdpCurve(self.orders, up_add(self.values, other.values), self.relation.composed_with(other.relation),
                        self.data_dependent or other.data_dependent, self.direction.composed_with(other.direction))

    def composed(self, times: int) -> "RdpCurve":
        """k-fold composition of this curve with itself: k * epsilon(order), rounded upwards.

        Args:
            times: how many runs, an integer >= 0 (0 gives the zero curve, +inf values included).

        Returns:
            A curve on the same grid, relation, direction and data dependence, each value the
            smallest float >= times * value (Mironov 2017, Proposition 1).

        Raises:
            ValueError: times is not an integer >= 0.
        """
        times = require_int_at_least("times", times, 0)
        with np.errstate(invalid="ignore"):
            values = np.where(np.isinf(self.values) & (times == 0), 0.0, up_multiply(self.values, times))
        return RdpCurve(self.orders, values, self.relation, self.data_dependent, self.direction)

    def __repr__(self) -> str:
        finite = np.isfinite(self.values)
        return (f"RdpCurve({len(self.orders)} orders {self.orders[0]:g}..{self.orders[-1]:g}, "
                f"finite at {int(finite.sum())}, relation={self.relation}, data_dependent={self.data_dependent}, "
                f"direction={self.direction})")

    def to_dict(self) -> JsonObject:
        """JSON-safe form; +inf is written as the string "inf" so JSON stays standard.

        Returns:
            A dict with "orders" (list of floats), "values" (floats, "inf" for +inf), "relation",
            "data_dependent" and "direction" (the enums' values).
        """
        return {
            "orders": list(self.orders),
            "values": [float(v) if np.isfinite(v) else "inf" for v in self.values],
            "relation": self.relation.value,
            "data_dependent": self.data_dependent,
            "direction": self.direction.value,
        }

    @classmethod
    def from_dict(cls, data: JsonObject) -> "RdpCurve":
        """Inverse of to_dict. A record without "direction" predates it and was always BOTH.

        Args:
            data: a record as to_dict writes it (parsed from JSON).

        Returns:
            The curve the record describes.

        Raises:
            ValueError: data is not a dict, lacks a field, holds a malformed one (data_dependent not a
                bool, an unknown relation or direction, values that are not numbers), or describes an
                invalid curve (see RdpCurve).
        """
        require(isinstance(data, dict), f"an RDP curve record must be a mapping, got {type(data).__name__}")
        try:
            values = [float("inf") if v == "inf" else float(v) for v in data["values"]]
            require(isinstance(data["data_dependent"], bool),
                    f"data_dependent must be true or false, got {data['data_dependent']!r}")
            return cls(tuple(data["orders"]), np.asarray(values), NeighbouringRelation(data["relation"]),
                       data["data_dependent"], DivergenceDirection(data.get("direction", "both")))
        except KeyError as missing:
            raise ValueError(f"RDP curve record lacks the field {missing}") from None
        except (TypeError, AttributeError, IndexError) as wrong:
            raise ValueError(f"RDP curve record is malformed: {wrong}") from None


_Grid: TypeAlias = tuple[tuple[float, ...], "npt.NDArray[np.intp] | None", dict[float, int]]
"""(sorted orders, the permutation that sorts the given ones or None, order -> position)."""


def _validated_grid(orders: Iterable[float]) -> _Grid:
    """(sorted orders, the permutation that sorts the given ones or None, order -> position). A grid
    tuple seen before (every curve's own `orders`, DEFAULT_ORDERS) is found by identity and not
    validated again, so building the many per-step curves of a run costs microseconds."""
    if type(orders) is tuple:
        known = _KNOWN_GRIDS.get(id(orders))
        if known is not None and known[0] is orders:
            return known[1]
    sorted_orders, permutation = paired_orders(orders)
    identity = np.array_equal(permutation, np.arange(len(sorted_orders)))
    result = (sorted_orders, None if identity else permutation, {o: i for i, o in enumerate(sorted_orders)})
    if type(orders) is tuple and len(_KNOWN_GRIDS) < 256:
        _KNOWN_GRIDS[id(orders)] = (orders, result)      # holding `orders` keeps its id from being reused
    if len(_KNOWN_GRIDS) < 256:
        _KNOWN_GRIDS[id(sorted_orders)] = (sorted_orders, (sorted_orders, None, result[2]))
    return result


_KNOWN_GRIDS: dict[int, tuple[tuple[float, ...], _Grid]] = {}
_smallest = np.minimum.reduce   # the ufunc itself: ndarray.min's Python wrapper costs as much as the rest


def require_curve(curve: object, name: str = "curve") -> RdpCurve:
    """curve itself, or ValueError naming `name` when it is not an RdpCurve.

    Args:
        curve: the value to check.
        name: what the value is, for the error message.

    Returns:
        curve, an RdpCurve.

    Raises:
        ValueError: curve is not an RdpCurve.
    """
    if not isinstance(curve, RdpCurve):
        raise ValueError(f"{name} must be an RdpCurve (e.g. RdpCurve(orders, values)), got {type(curve).__name__}")
    return curve


def compose_curves(curves: Iterable[RdpCurve]) -> RdpCurve:
    """The RDP curve of running the curves' mechanisms one after another, adaptively: their sum at
    every order (Mironov 2017, Proposition 1), rounded upwards.

    Args:
        curves: a non-empty iterable of RdpCurve on one order grid.

    Returns:
        An RdpCurve on that grid, for the neighbours every curve covers (data-dependent when any is).

    Raises:
        ValueError: not an iterable of RdpCurve, empty, grids that differ, or relations with no
            common neighbouring pair.
    """
    if not hasattr(curves, "__iter__"):
        raise ValueError(f"compose_curves needs an iterable of RdpCurve, got {curves!r}")
    curves = list(curves)
    require(len(curves) > 0, "compose_curves needs at least one curve")
    for index, curve in enumerate(curves):
        if not isinstance(curve, RdpCurve):
            require_curve(curve, f"curve {index}")
    first = curves[0]
    require(all(curve.orders is first.orders or curve.orders == first.orders for curve in curves),
            "cannot compose curves on different order grids")
    relation, direction = first.relation, first.direction
    for pair in {(c.relation, c.direction) for c in curves[1:]}:   # folding distinct pairs is enough
        relation, direction = relation.composed_with(pair[0]), direction.composed_with(pair[1])
    # one sum over the stacked values (Mironov 2017, Proposition 1), rounded upwards
    total = upper_sum(np.stack([c.values for c in curves]))
    return RdpCurve(first.orders, total, relation, any(c.data_dependent for c in curves), direction)
