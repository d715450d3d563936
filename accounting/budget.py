"""An RDP privacy filter: may this step still be afforded within (epsilon, delta)?

Composition under a fixed budget is a privacy filter (Feldman & Zrnic 2021, Theorem 3.1: an RDP
filter with adaptively chosen data-independent per-step curves is valid as long as the running sum
never exceeds the budget curve). Checking a *data-dependent* total against a budget leaks private
information (Redberg et al. 2023), so it is refused unless the caller opts in
with `allow_data_dependent=True`, which the ledger records.
"""
from __future__ import annotations

from typing import Sequence

from accounting.conversion import ConversionMethod, conversion_method, epsilon_from_rdp
from accounting.curve import RdpCurve, require_curve
from accounting.errors import require, require_bool, require_in_open, require_positive
from accounting.orders import DEFAULT_ORDERS
from accounting.relation import NeighbouringRelation


class RdpBudget:
    """Spend RDP curves against an (epsilon, delta) target."""

    def __init__(self, epsilon: float, delta: float, orders: Sequence[float] = DEFAULT_ORDERS,
                 relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE,
                 method: ConversionMethod = ConversionMethod.IMPROVED, allow_data_dependent: bool = False):
        self.epsilon = require_positive("epsilon", epsilon)
        self.delta = require_in_open("delta", delta, 0.0, 1.0)
        self.method = conversion_method(method)
        self.allow_data_dependent = require_bool("allow_data_dependent", allow_data_dependent)
        self.spent = RdpCurve.zero(orders, relation)
        self.data_dependent_checks = 0

    def _check_allowed(self, curve: RdpCurve) -> None:
        if require_curve(curve).data_dependent and not self.allow_data_dependent:
            raise ValueError(
                "checking a data-dependent loss against a budget leaks private information "
                "(Redberg et al. 2023); construct RdpBudget(..., allow_data_dependent=True) to opt in")

    def epsilon_after(self, curve: RdpCurve) -> float:
        return epsilon_from_rdp(self.spent + require_curve(curve), self.delta, self.method).epsilon

    def can_afford(self, curve: RdpCurve) -> bool:
        """True when spending `curve` keeps the (epsilon, delta) target."""
        self._check_allowed(curve)
        if curve.data_dependent:
            self.data_dependent_checks += 1
        return self.epsilon_after(curve) <= self.epsilon

    def spend(self, curve: RdpCurve) -> None:
        """Spend `curve`; ValueError (and nothing spent) when it does not fit."""
        require(self.can_afford(curve),
                f"step does not fit the budget: epsilon would be {self.epsilon_after(curve):.6g} > {self.epsilon:g}")
        self.spent = self.spent + curve
