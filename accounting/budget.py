"""An RDP privacy filter: may this step still be afforded within (epsilon, delta)?

Composition under a fixed budget is a privacy filter (Feldman & Zrnic 2021, Theorem 3.1: an RDP
filter with adaptively chosen data-independent per-step curves is valid as long as the running sum
never exceeds the budget curve). Checking a *data-dependent* total against a budget leaks private
information (Redberg et al. 2023), so it is refused unless the caller opts in
with `allow_data_dependent=True`, which the ledger records.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from dpledger.accounting.conversion import ConversionMethod, conversion_method, conversion_terms, epsilon_from_rdp
from dpledger.accounting.curve import RdpCurve, require_curve
from dpledger.accounting.errors import require, require_bool, require_in_open, require_int_at_least, require_positive
from dpledger.accounting.orders import DEFAULT_ORDERS
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.accounting.rounding import ROUNDING_ULPS
from dpledger.accounting.summation import ExactSum


class RdpBudget:
    """Spend RDP curves against an (epsilon, delta) target."""

    def __init__(self, epsilon: float, delta: float, orders: Sequence[float] = DEFAULT_ORDERS,
                 relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE,
                 method: ConversionMethod | str = ConversionMethod.IMPROVED, allow_data_dependent: bool = False) -> None:
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
        """The epsilon, at the budget's delta and conversion method, of what was spent plus `curve`;
        nothing is spent and no data-dependence check is made (a GridEdgeWarning may be issued).

        Args:
            curve: the RDP curve of the next step, on the budget's order grid.

        Returns:
            epsilon_from_rdp(spent + curve, delta, method).epsilon, a float >= 0 (+inf: no guarantee).

        Raises:
            ValueError: curve is not an RdpCurve, is on another grid, or its relation shares no
                neighbouring pair with the budget's.
        """
        return epsilon_from_rdp(self.spent + require_curve(curve), self.delta, self.method).epsilon

    def can_afford(self, curve: RdpCurve) -> bool:
        """True when spending `curve` keeps the (epsilon, delta) target.

        A data-dependent curve is checked only when the budget was built with
        allow_data_dependent=True, and each such check is counted in `data_dependent_checks`.

        Args:
            curve: the RDP curve of the next step, on the budget's order grid.

        Returns:
            Whether epsilon_after(curve) <= the target epsilon.

        Raises:
            ValueError: a data-dependent curve without the opt-in, or a curve epsilon_after refuses.
        """
        self._check_allowed(curve)
        if curve.data_dependent:
            self.data_dependent_checks += 1
        return self.epsilon_after(curve) <= self.epsilon

    def spend(self, curve: RdpCurve) -> None:
        """Spend `curve`; ValueError (and nothing spent) when it does not fit.

        Args:
            curve: the RDP curve of the step, on the budget's order grid.

        Raises:
            ValueError: the curve does not fit the target, or can_afford refuses it.
        """
        require(self.can_afford(curve),
                f"step does not fit the budget: epsilon would be {self.epsilon_after(curve):.6g} > {self.epsilon:g}")
        self.spent = self.spent + curve


FILTER_MARGIN = 1e-9
"""Relative margin kept below the RDP budget: it covers the rounding of the budget's own conversion
term and of the ledger's epsilon (rounded up by a few ulps), so that a filter spent to its budget
never converts to more than the target epsilon."""


class RenyiFilter:
    """A Renyi privacy filter at one order, chosen before the run (Feldman & Zrnic 2021, Theorem
    3.1): with per-step RDP charges c_t(a*) chosen adaptively from the outputs so far, a composition
    stopped before sum_t c_t(a*) exceeds the budget B(a*) is (a*, B(a*))-RDP, hence (epsilon,
    delta)-DP with B(a*) = epsilon - conversion_term(a*, delta) (Balle et al. 2020, Theorem 21).
    The order is fixed in advance: a filter over several orders at once is only known to be valid
    when the charges are fixed in advance too (the RDP filters proven valid are of one order; Haney
    et al. 2023).

    A step is answered privately only when `fits(charge)`; then `spend(charge)`. Refused steps are
    answered by the public model and cost nothing. The state is the exact (rational) sum of the
    charges spent (dpledger.accounting.summation.ExactSum): a float sum would lose charges smaller than half
    an ulp of the total and let the filter answer after the exact sum passed its budget. A run
    restored from its records (`restore`) continues exactly.
    """

    def __init__(self, epsilon: float, delta: float, order: float, spent: Iterable[float] = ()) -> None:
        self.epsilon = require_positive("budget epsilon", epsilon)
        self.delta = require_in_open("budget delta", delta, 0.0, 1.0)
        require(math.isfinite(order) and order > 1, f"budget order must be finite and > 1, got {order!r}")
        self.order = float(order)
        term = float(conversion_terms(np.asarray([self.order]), self.delta, ConversionMethod.IMPROVED)[0])
        self.rdp_budget = (self.epsilon - term) * (1.0 - FILTER_MARGIN)
        require(self.rdp_budget > 0, f"budget epsilon = {self.epsilon:g} at delta = {self.delta:g} leaves no RDP "
                                     f"budget at order {self.order:g} (the conversion alone costs {term:.4g})")
        self._spent = ExactSum()
        self.restore(spent)

    @classmethod
    def plan(cls, epsilon: float, delta: float, step_bound: npt.ArrayLike, orders: npt.ArrayLike,
             order: float | None = None) -> "RenyiFilter":
        """The filter for a mechanism whose steps each cost at most `step_bound` (one value per order,
        data-independent): at `order` if given, else at the order of `orders` that affords the most
        such steps (ties: the lowest such order). Depends on the configuration only, never on data.

        Args:
            epsilon: the target epsilon, > 0.
            delta: the target delta, in (0, 1).
            step_bound: a data-independent bound on one step's RDP at each order of `orders`, each
                >= 0 (+inf: no guarantee at that order).
            orders: the Renyi orders `step_bound` is given at, each > 1, of step_bound's shape.
            order: the filter's order if fixed in advance (then `orders` only serves the checks).

        Returns:
            A RenyiFilter at the chosen order, nothing spent.

        Raises:
            ValueError: step_bound and orders of different shapes, a NaN or negative step_bound
                entry, delta outside (0, 1), a budget that leaves no RDP budget at any order (or at
                `order`), or an order that is not finite and > 1.
        """
        grid = np.asarray(orders, dtype=np.float64)
        bound = np.asarray(step_bound, dtype=np.float64)
        require(bound.shape == grid.shape, f"step_bound has shape {bound.shape}, orders {grid.shape}")
        require(not np.any(np.isnan(bound)) and not np.any(bound < 0),
                f"step_bound must be >= 0 at every order (+inf for no guarantee), got {bound[:8].tolist()}...")
        if order is None:
            budgets = epsilon - conversion_terms(grid, require_in_open("budget delta", delta, 0.0, 1.0),
                                                 ConversionMethod.IMPROVED)
            with np.errstate(divide="ignore", invalid="ignore"):
                affordable = np.where(budgets <= 0, -1.0,
                                      np.where(bound > 0, np.floor(budgets * (1 - FILTER_MARGIN) / bound), np.inf))
            require(bool(np.any(budgets > 0)), f"budget epsilon = {epsilon:g} at delta = {delta:g} leaves no RDP "
                                               "budget at any order of the grid")
            order = float(grid[int(np.argmax(affordable))])
        return cls(epsilon, delta, order)

    @property
    def spent(self) -> float:
        """The charges spent so far, rounded up (their exact sum is kept)."""
        return self._spent.upper()

    @property
    def state(self) -> ExactSum:
        """A copy of the exact running sum (what `set_state` takes back)."""
        return self._spent.copy()

    def set_state(self, state: ExactSum) -> None:
        """Continue from `state` (what the `state` property gave): the spent charges become a copy of it.

        Args:
            state: the exact running sum of the charges spent.

        Raises:
            ValueError: state is not an ExactSum.
        """
        require(isinstance(state, ExactSum), f"a filter state must be an ExactSum, got {type(state).__name__}")
        self._spent = state.copy()

    def restore(self, charges: Iterable[float]) -> None:
        """Start again from nothing and spend `charges` in order (each must fit).

        Args:
            charges: the RDP charges at the filter's order, in the order they were spent.

        Raises:
            ValueError: a charge that does not fit; the filter then holds the charges before it.
        """
        self._spent = ExactSum()
        for charge in charges:
            self.spend(charge)

    def fits(self, charge: float) -> bool:
        """Whether a step charging `charge` at the filter's order keeps the exact running sum within the
        budget (NaN never fits; +inf fits nothing).

        Args:
            charge: the step's RDP at the filter's order, a float >= 0.

        Returns:
            True when spent + charge <= rdp_budget in exact arithmetic; False for a negative or NaN charge.
        """
        charge = float(charge)
        if not charge >= 0:  # NaN or negative: never a charge the filter accepts
            return False
        return self._spent.at_most(self.rdp_budget, plus=charge)

    def spend(self, charge: float) -> None:
        """Spend `charge`; ValueError (and nothing spent) when it does not fit.

        Args:
            charge: the step's RDP at the filter's order, a float >= 0.

        Raises:
            ValueError: the charge is negative, NaN, or does not fit the remaining budget.
        """
        if not self.spend_if_fits(charge):  # not require(): its message would be formatted on every step
            raise ValueError(f"a charge of {charge:.6g} at order {self.order:g} does not fit the remaining budget "
                             f"{self.rdp_budget - self.spent:.6g}")

    def spend_if_fits(self, charge: float) -> bool:
        """Spend `charge` if it fits (as `fits` decides); whether it was spent.

        Args:
            charge: the step's RDP at the filter's order, a float >= 0.

        Returns:
            True when the charge was spent; False (nothing spent) when it does not fit, or is
            negative or NaN.
        """
        return charge >= 0 and self._spent.add_if_at_most(charge, self.rdp_budget)

    def affordable_repeats(self, charge: float) -> int | float:
        """How many more steps each charging `charge` fit, exactly (+inf for a zero charge): the largest
        k with spent + k * charge <= rdp_budget in exact arithmetic.

        Args:
            charge: one step's RDP at the filter's order, a float >= 0 (+inf: no step fits).

        Returns:
            The number of such steps that still fit: an int >= 0, or math.inf for a zero charge
            while the budget is not exceeded.

        Raises:
            ValueError: a negative or NaN charge.
        """
        charge = float(charge)
        require(charge >= 0, f"a charge must be >= 0, got {charge!r}")
        if not self._spent.at_most(self.rdp_budget):
            return 0
        if charge == 0.0:
            return math.inf
        if charge == math.inf:
            return 0
        room = ExactSum([self.rdp_budget]).exact() - self._spent.exact()
        return int(room // ExactSum([charge]).exact())

    def spend_repeated(self, charge: float, times: int) -> None:
        """Spend `charge` `times` times (each must fit: ValueError otherwise, nothing spent).

        Args:
            charge: one step's RDP at the filter's order, a float >= 0.
            times: how many steps, an integer >= 0.

        Raises:
            ValueError: the steps do not all fit, a negative or NaN charge, or times not an integer >= 0.
        """
        times = require_int_at_least("times", times, 0)  # int(2.5) would spend 2 charges, int(inf) overflow
        require(times <= self.affordable_repeats(charge), f"{times} charges of {charge:.6g} do not fit the remaining "
                                                          f"budget {self.rdp_budget - self.spent:.6g}")
        self._spent.add_repeated(float(charge), times)

    def epsilon_spent(self) -> float:
        """The (epsilon, delta) the spent charges convert to at the filter's order (<= epsilon).

        Returns:
            The epsilon at the filter's delta (Balle et al. 2020, Theorem 21, at the filter's order),
            rounded up like epsilon_from_rdp; 0.0 while nothing positive was spent.
        """
        if not self.spent > 0:
            return 0.0
        term = float(conversion_terms(np.asarray([self.order]), self.delta, ConversionMethod.IMPROVED)[0])
        # rounded up like dpledger.accounting.conversion.epsilon_from_rdp: by a bound on the error of spent + term
        return max(0.0, self.spent + term + ROUNDING_ULPS * (self.spent + abs(term) + 1.0))

    def to_dict(self) -> dict[str, float]:
        """The filter's budget and spending, for a run's records.

        Returns:
            A dict with "epsilon", "delta", "order", "rdp_budget" (the RDP budget at the order, after
            FILTER_MARGIN) and "spent" (the charges' sum, rounded up).
        """
        return {"epsilon": self.epsilon, "delta": self.delta, "order": self.order, "rdp_budget": self.rdp_budget,
                "spent": self.spent}
