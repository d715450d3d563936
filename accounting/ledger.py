"""The accountant: a ledger of named per-step RDP charges (Flemings et al. 2024, Table 2b).

Each step charges one or more named components (e.g. `screen`, `pmixed_data_dependent`). The ledger
keeps one running RDP total per component; the composed curve is their sum (Mironov 2017, Proposition 1).
`breakdown` gives Table 2b's shape: each component's RDP at the optimal order of the composed
curve, the conversion term, and the total, which sum to the reported epsilon. Each component
keeps whether it is data-dependent and which divergence direction(s) it bounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence, TypeAlias

import numpy as np
import numpy.typing as npt

from dpledger.accounting.conversion import ConversionMethod, EpsilonConversion, epsilon_from_rdp
from dpledger.accounting.curve import RdpCurve, _validated_grid
from dpledger.accounting.errors import require, require_bool, require_int_at_least, require_member, require_not_nan, require_str
from dpledger.accounting.orders import DEFAULT_ORDERS
from dpledger.accounting.relation import DivergenceDirection, NeighbouringRelation
from dpledger.accounting.strict_json import JsonObject
from dpledger.accounting.summation import BlockSum, UpperSum

if TYPE_CHECKING:
    import pandas as pd  # imported only by to_frame at run time: the accounting needs numpy and scipy only

BlockEntry: TypeAlias = (tuple[npt.ArrayLike, bool] | tuple[npt.ArrayLike, bool, NeighbouringRelation])
"""What `PrivacyLedger.charge_many` takes per component: (values[steps, orders], data_dependent[, relation])."""


@dataclass(frozen=True)
class BreakdownRow:
    """One row of Table 2b: a component's epsilon share (the conversion row's may be negative; +inf is
    no guarantee)."""

    component: str
    epsilon: float
    data_dependent: bool
    direction: DivergenceDirection = DivergenceDirection.BOTH
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE

    def __post_init__(self) -> None:
        for name, value in (("component", require_str("component", self.component)),
                            ("epsilon", require_not_nan(f"row {self.component!r} epsilon", self.epsilon)),
                            ("data_dependent", require_bool(f"row {self.component!r} data_dependent",
                                                            self.data_dependent)),
                            ("direction", require_member(DivergenceDirection, "direction", self.direction)),
                            ("relation", require_member(NeighbouringRelation, "relation", self.relation))):
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class Breakdown:
    """Table 2b: component rows at `order`, the conversion row, and the total.

    `rows` holds one row per component, then "RDP to DP (<method>)", then "total"; the component
    rows plus the conversion row sum to the total (the ledger computes the conversion row as the
    difference, so the identity holds in floating point too).
    """

    rows: tuple[BreakdownRow, ...]
    conversion: EpsilonConversion

    def __post_init__(self) -> None:
        rows = self.rows
        require(isinstance(rows, (tuple, list)) and len(rows) > 0,
                f"rows must be a non-empty sequence of BreakdownRow, got {rows!r}")
        for row in rows:
            require(isinstance(row, BreakdownRow), f"rows must hold BreakdownRow instances, got {type(row).__name__}: "
                                                   f"{row!r}")
        require(isinstance(self.conversion, EpsilonConversion),
                f"conversion must be an EpsilonConversion, got {type(self.conversion).__name__}: {self.conversion!r}")
        object.__setattr__(self, "rows", tuple(rows))

    @property
    def total(self) -> float:
        return self.conversion.epsilon

    def to_frame(self) -> "pd.DataFrame":
        """The rows as a pandas DataFrame (pandas is imported here, only when this is called).

        Returns:
            One line per row, columns "component", "epsilon", "data_dependent", "direction" and
            "relation" (the enums' values).
        """
        import pandas as pd

        return pd.DataFrame([{"component": r.component, "epsilon": r.epsilon, "data_dependent": r.data_dependent,
                              "direction": r.direction.value, "relation": r.relation.value} for r in self.rows])

    def to_dict(self) -> JsonObject:
        """JSON-ready form of the table (+inf stays a float: strict_json_text writes it).

        Returns:
            A dict with the conversion's "order", "delta", "method", "data_dependent", "direction" and
            "relation", and "rows": one dict per row (component, epsilon, data_dependent, direction,
            relation).
        """
        return {
            "order": self.conversion.order,
            "delta": self.conversion.delta,
            "method": self.conversion.method.value,
            "data_dependent": self.conversion.data_dependent,
            "direction": self.conversion.direction.value,
            "relation": self.conversion.relation.value,
            "rows": [{"component": r.component, "epsilon": r.epsilon, "data_dependent": r.data_dependent,
                      "direction": r.direction.value, "relation": r.relation.value} for r in self.rows],
        }


class PrivacyLedger:
    """Running composition of named RDP components over steps.

    Each component's running total is an dpledger.accounting.summation.UpperSum: never below the exact sum
    of its charges (a float sum rounds to nearest and can lose small charges after large ones), and
    within a few ulps of it. Steps charged one at a time are buffered and summed in blocks when a
    total is read, so `charge` costs a few microseconds.

    Each component keeps the neighbouring relation its charges hold for; `relation` is the one
    assumed for `charge_many` entries that name none. The total holds for the neighbours every
    component covers (NeighbouringRelation.composed_with): one remove-one component makes the
    total remove-one.
    """

    def __init__(self, orders: Sequence[float] = DEFAULT_ORDERS,
                 relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE) -> None:
        # a grid tuple seen before (DEFAULT_ORDERS) gives the very tuple its curves hold: `charge`
        # then compares grids by identity
        self.orders, permutation, _ = _validated_grid(orders)
        self._permutation = permutation  # None when the orders were given sorted
        require(isinstance(relation, NeighbouringRelation), f"relation must be a NeighbouringRelation, got {relation!r}")
        self.relation = relation
        self._totals: dict[str, UpperSum] = {}
        self._data_dependent: dict[str, bool] = {}
        self._direction: dict[str, DivergenceDirection] = {}
        self._relation: dict[str, NeighbouringRelation] = {}
        self._total_relation = relation  # the ledger's relation composed with every component's
        self.steps = 0

    def _total_for(self, name: str, data_dependent: bool, direction: DivergenceDirection,
                   relation: NeighbouringRelation) -> UpperSum:
        """Component `name`'s running total, its data dependence, direction and relation updated for a
        charge about to be added to it (the relation already checked against the others')."""
        total = self._totals.get(name)
        if total is None:
            total = self._totals[name] = UpperSum(len(self.orders))
            self._data_dependent[name] = data_dependent
            self._direction[name] = direction
            self._relation[name] = relation
            self._total_relation = self._total_relation.composed_with(relation)
            return total
        # each update is skipped when it changes nothing (the usual step): composing equals is the identity
        if data_dependent and not self._data_dependent[name]:
            self._data_dependent[name] = True
        if direction is not self._direction[name]:
            self._direction[name] = self._direction[name].composed_with(direction)
        if relation is not self._relation[name]:
            # the same name charged under another relation holds for the common neighbours only
            self._relation[name] = relation = self._relation[name].composed_with(relation)
            self._total_relation = self._total_relation.composed_with(relation)
        return total

    def total_relation_with(self, *relations: NeighbouringRelation) -> NeighbouringRelation:
        """The relation the total would hold for with components for `relations` added; ValueError
        when they share no neighbouring pair with the ledger's relation and the other components'.
        Called before anything is charged, so that a refused charge leaves the ledger as it was.

        Args:
            *relations: the relations of the components about to be charged.

        Returns:
            The relation whose moves the ledger's relation, every component's and every one given cover.

        Raises:
            ValueError: they share no neighbouring move.
        """
        total = self._total_relation  # components' relations only narrow, so composing with the last total is enough
        for relation in relations:
            total = total.composed_with(relation)
        return total

    @property
    def total_relation(self) -> NeighbouringRelation:
        """The neighbouring relation the composed total holds for: the pairs that the ledger's relation
        and every component cover."""
        return self._total_relation

    def charge(self, components: Mapping[str, RdpCurve]) -> None:
        """Charge one step: every named component's curve is added to its running total.

        Args:
            components: a non-empty mapping of component name to the step's RdpCurve for it, each on
                the ledger's order grid; its relation, direction and data dependence are kept.

        Raises:
            ValueError: an empty mapping, a value that is not an RdpCurve or is on another grid, or
                relations that share no neighbouring pair with the ledger's (nothing is charged then).
        """
        # checks written out, their messages formatted only on failure: this runs once per step
        if not ((type(components) is dict or isinstance(components, Mapping)) and len(components) > 0):
            raise ValueError(f"a step must charge a non-empty mapping of component name to RdpCurve, got {components!r}")
        total_relation = self._total_relation
        for name, curve in components.items():
            if not isinstance(curve, RdpCurve):
                raise ValueError(f"component {name!r} must be an RdpCurve, got {type(curve).__name__}")
            if curve.orders is not self.orders and curve.orders != self.orders:
                raise ValueError(f"component {name!r} is on a different order grid than the ledger")
        for curve in components.values():
            total_relation = total_relation.composed_with(curve.relation)  # ValueError before anything is charged
        for name, curve in components.items():
            # an RdpCurve's values are checked (>= 0, no NaN, one per order) at construction; they are copied
            self._total_for(name, curve.data_dependent, curve.direction, curve.relation)._add_checked_row(curve.values)
        self.steps += 1

    def charge_many(self, components: Mapping[str, BlockEntry]) -> None:
        """Charge a block of steps: each component maps to (values[steps, orders], data_dependent) or
        (values, data_dependent, relation), the columns in the order the ledger's orders were given;
        without a relation the ledger's own is assumed. The values bound both divergence directions;
        a one-direction curve is charged with `charge`, which reads its direction.

        Args:
            components: a non-empty mapping of component name to (values, data_dependent) or
                (values, data_dependent, relation): values a (steps, orders) array of RDP values
                >= 0 (+inf: no guarantee), the same number of steps for every component.

        Raises:
            ValueError: an empty mapping, a malformed entry, values that are not numbers, of the wrong
                shape, NaN or negative, components covering different numbers of steps, or
                relations that share no neighbouring pair (nothing is charged then).
        """
        # the messages hold the entries' arrays: formatted only on failure (a 32-step block's repr took 2.6 ms)
        if not (isinstance(components, Mapping) and len(components) > 0):
            raise ValueError(f"a block must charge a non-empty mapping of component name to (values, data_dependent), "
                             f"got {components!r}")
        steps = -1  # the block's step count, set by the first component
        blocks: dict[str, BlockSum] = {}
        for name, entry in components.items():
            if not (isinstance(entry, tuple) and len(entry) in (2, 3)):
                raise ValueError(f"component {name!r} must be (values[steps, orders], data_dependent[, relation]), "
                                 f"got {entry!r}")
            if not (len(entry) == 2 or isinstance(entry[2], NeighbouringRelation)):
                raise ValueError(f"component {name!r} relation must be a NeighbouringRelation, got {entry[-1]!r}")
            require_bool(f"component {name!r} data_dependent", entry[1])
            raw = np.asarray(entry[0])
            require(raw.dtype.kind in "biuf", f"component {name!r} values must be numbers, got dtype {raw.dtype}")
            values = np.asarray(raw, dtype=np.float64)  # float64 values are read in place, not copied
            require(values.ndim == 2 and values.shape[1] == len(self.orders),
                    f"component {name!r} values must have shape (steps, {len(self.orders)}), got {values.shape}")
            # one pass checks and sums the block; nothing is added until every component passed
            block = BlockSum.of(values)
            require(not bool(np.any(np.isnan(block.smallest))), f"component {name!r} has NaN RDP values")
            require(bool(np.all(block.smallest >= 0)), f"component {name!r} has negative RDP values")
            require(steps == -1 or values.shape[0] == steps, "every component must cover the same steps")
            steps = values.shape[0]
            blocks[name] = block if self._permutation is None else block.permuted(self._permutation)
        relations = {name: self.relation if len(entry) == 2 else entry[2] for name, entry in components.items()}
        self.total_relation_with(*relations.values())
        for name, entry in components.items():
            self._total_for(name, bool(entry[1]), DivergenceDirection.BOTH, relations[name]).absorb(blocks[name])
        self.steps += steps

    def component_curve(self, name: str) -> RdpCurve:
        """One component's running total as a curve.

        Args:
            name: the component's name, as charged.

        Returns:
            The sum of its charges at each order, rounded up, with its relation, data dependence and
            direction.

        Raises:
            ValueError: no component of that name was charged.
        """
        require(name in self._totals, f"no component named {name!r}; have {list(self._totals)}")
        return RdpCurve(self.orders, self._totals[name].upper(), self._relation[name], self._data_dependent[name],
                        self._direction[name])

    def total_curve(self) -> RdpCurve:
        """The composed curve: the sum of every component's total (zero if nothing was charged).

        Returns:
            An RdpCurve on the ledger's grid (Mironov 2017, Proposition 1), for the total relation,
            data-dependent when any component is, FROM_ACTUAL when any component is.
        """
        total = RdpCurve.zero(self.orders, self.total_relation)
        for name in self._totals:
            total = total + self.component_curve(name)
        return total

    def epsilon(self, delta: float, method: ConversionMethod | str = ConversionMethod.IMPROVED) -> EpsilonConversion:
        """The (epsilon, delta) guarantee of the composed curve (conversion.epsilon_from_rdp).

        Args:
            delta: target delta, in (0, 1).
            method: ConversionMethod.IMPROVED (default, Balle et al. 2020, Theorem 21) or CLASSIC
                (Mironov 2017, Proposition 3), or their names.

        Returns:
            The EpsilonConversion of total_curve() (a GridEdgeWarning is issued when its optimal
            order is at the grid's edge).
        """
        return epsilon_from_rdp(self.total_curve(), delta, method)

    def breakdown(self, delta: float, method: ConversionMethod | str = ConversionMethod.IMPROVED) -> Breakdown:
        """Table 2b at the composed curve's optimal order; rows sum to the total epsilon.

        Where there is no optimal order (epsilon +inf, or 0 for a curve that is 0 everywhere), every
        component row holds the total epsilon and there is no conversion row.

        Args:
            delta: target delta, in (0, 1).
            method: ConversionMethod.IMPROVED (default) or CLASSIC, or their names.

        Returns:
            A Breakdown: one row per component (its RDP at the optimal order), the "RDP to DP
            (<method>)" row (total minus the components' sum), and the "total" row.
        """
        conversion = self.epsilon(delta, method)
        rows = []
        if conversion.order is None:  # no guarantee anywhere (inf) or a data-free mechanism (0)
            for name in self._totals:
                rows.append(BreakdownRow(name, conversion.epsilon, self._data_dependent[name], self._direction[name],
                                        self._relation[name]))
            rows.append(BreakdownRow("total", conversion.epsilon, conversion.data_dependent, conversion.direction,
                                     conversion.relation))
            return Breakdown(tuple(rows), conversion)
        component_sum = 0.0
        for name in self._totals:
            value = self.component_curve(name).value_at(conversion.order)
            component_sum += value
            rows.append(BreakdownRow(name, value, self._data_dependent[name], self._direction[name],
                                     self._relation[name]))
        rows.append(BreakdownRow(f"RDP to DP ({conversion.method.value})", conversion.epsilon - component_sum, False,
                                 relation=conversion.relation))
        rows.append(BreakdownRow("total", conversion.epsilon, conversion.data_dependent, conversion.direction,
                                 conversion.relation))
        return Breakdown(tuple(rows), conversion)

    def to_dict(self) -> JsonObject:
        """JSON-ready form of the ledger (from_dict reads it back).

        Returns:
            A dict with "orders", "relation", "total_relation" (the enums' values), "steps" and
            "components": each component's running total as RdpCurve.to_dict gives it.
        """
        return {
            "orders": list(self.orders),
            "relation": self.relation.value,
            "total_relation": self.total_relation.value,
            "steps": self.steps,
            "components": {name: self.component_curve(name).to_dict() for name in self._totals},
        }

    @classmethod
    def from_dict(cls, data: JsonObject) -> "PrivacyLedger":
        """Inverse of to_dict; ValueError when a component is on another grid or its relation shares no
        neighbouring pair with the others'.

        Args:
            data: a record as to_dict writes it (parsed from JSON).

        Returns:
            A ledger holding each component's total as one charge, and the recorded step count.

        Raises:
            ValueError: data or its components not a dict, a missing or malformed field, a component
                on another grid, relations with no common neighbouring pair, or steps not an integer >= 0.
        """
        require(isinstance(data, dict), f"a ledger record must be a mapping, got {type(data).__name__}")
        require(isinstance(data.get("components"), dict),
                f"a ledger record's components must be a mapping, got {type(data.get('components')).__name__}")
        try:
            ledger = cls(data["orders"], NeighbouringRelation(data["relation"]))
            for name, curve_data in data["components"].items():
                curve = RdpCurve.from_dict(curve_data)
                require(curve.orders == ledger.orders, f"component {name!r} is on a different order grid than the ledger")
                ledger.total_relation_with(curve.relation)
                ledger._total_for(name, curve.data_dependent, curve.direction, curve.relation).add_row(curve.values)
            ledger.steps = require_int_at_least("steps", data["steps"], 0)
        except KeyError as missing:
            raise ValueError(f"ledger record lacks the field {missing}") from None
        except (TypeError, AttributeError, IndexError) as wrong:
            raise ValueError(f"ledger record is malformed: {wrong}") from None
        return ledger
