"""The privacy filter of a decode run: `[budget] epsilon, delta` in the run config.

Before each private answer the step's charge at the filter's order must fit what is left of the
RDP budget (dpledger.accounting.budget.RenyiFilter; Feldman & Zrnic 2021, Theorem 3.1). A step that does not
fit is answered by the public model and charged nothing: its token is drawn from the public
distribution with a generator of its own, seeded from (run seed, step) and never touched by the
mechanism, so what it releases does not depend on the private data (the mechanism's generator has
drawn a data-dependent number of values by then, e.g. GNMax's noise only after a passed screen).

What a step is charged in the filter:
  - by default the mechanism's data-independent bound on one step (Runner.step_bound) at the
    filter's order: the stopping step then depends on the configuration only;
  - for a realised-path run whose screen decision is released before its answer is charged
    (AdaPMixED with screening, DPARGMAX): the screen's data-independent bound at every step, and the
    answer's only where the screen passed. A step is answered only if its largest charge (screen and
    answer) fits, so the filter decides from released outputs only, and each charge is a function of
    what was released before it: fully adaptive composition holds with the filter's budget as the
    guarantee (Feldman & Zrnic 2021, Theorem 3.1; Whitehouse et al. 2023). The stopping step then
    depends on the released screen decisions;
  - with `data_dependent = true`, the step's actual charge at that order, data-dependent losses
    included. Checking a data-dependent loss against a budget leaks private information (Redberg
    et al. 2023); the manifest, the ledger and the report label such a run.

The filter's state is the running sum of the charges of the answered steps, in step order; the
trace records each step's `budget_charge`, so a resumed run and the audit's replay restore it
exactly by summing the committed records in the same order.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np
import numpy.typing as npt
import torch

from dpledger.accounting.budget import RenyiFilter
from dpledger.accounting.errors import require
from dpledger.accounting.summation import up_add
from dpledger.decoding.config import require_on_grid

if TYPE_CHECKING:
    from dpledger.decoding.runners import BlockOutcome

DATA_DEPENDENT_LABEL = ("the filter was driven by data-dependent losses: checking them against the budget leaks "
                        "private information (Redberg et al. 2023), so the stopping point is not covered by the "
                        "(epsilon, delta) target")


def fallback_seed(run_seed: int, step: int) -> int:
    """The seed of the public answer of a step the filter refused: (run seed, step) only.

    Args:
        run_seed: the run's seed.
        step: the step's run-wide index.

    Returns:
        A 63-bit seed from sha256 of the two, independent of everything the mechanism drew.
    """
    digest = hashlib.sha256(f"dpledger-budget-fallback:{run_seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass
class BudgetGate:
    """A run's filter and how its steps are charged; `apply` decides a block's steps in order."""

    filter: RenyiFilter
    order_index: int
    step_bound: float  # the data-independent bound of one step at the filter's order
    data_dependent: bool
    realised_path: tuple[float, float] | None = None  # (screen, answer) bounds at the order: realised-path charging

    @classmethod
    def plan(cls, budget: dict, step_bound: npt.NDArray[np.float64], orders: npt.NDArray[np.float64],
             realised_path_bounds: Callable[[npt.NDArray[np.float64]],
                                            tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] | None = None
             ) -> "BudgetGate":
        """The gate for `budget` (the config's [budget] table as a dict) and a mechanism whose steps
        each cost at most `step_bound` (one value per order of `orders`); `realised_path_bounds`
        (Runner.realised_path_bounds) makes a data-independent filter charge realised-path.

        Args:
            budget: epsilon, delta, and optionally order (on the grid) and data_dependent.
            step_bound: the mechanism's data-independent bound on one step, one value per order.
            orders: the ledger's Renyi orders.
            realised_path_bounds: orders -> (the screen's bound, the answer's); None: not realised-path.

        Returns:
            The gate: the Renyi filter planned at its order (the given one, or the one allowing the
            most steps), the step bound there (for realised-path, at least screen + answer), whether
            it is data-dependent, and the realised-path bounds at the order.

        Raises:
            ValueError: if epsilon, delta or order is invalid, or order is not on the grid.
        """
        orders = np.asarray(orders, dtype=np.float64)
        order = budget.get("order")
        if order is not None:
            order = require_on_grid("budget.order", order, orders)
        renyi = RenyiFilter.plan(budget["epsilon"], budget["delta"], step_bound, orders, order)
        index = int(np.flatnonzero(orders == renyi.order)[0])
        data_dependent = bool(budget.get("data_dependent", False))
        bound = float(np.asarray(step_bound, dtype=np.float64)[index])
        realised = None
        if realised_path_bounds is not None and not data_dependent:
            screen, answer = (float(np.asarray(v, dtype=np.float64)[index]) for v in realised_path_bounds(orders))
            realised = (screen, answer)
            bound = max(bound, float(up_add(screen, answer)))  # what a step may cost: checked before it runs
        return cls(renyi, index, bound, data_dependent, realised)

    def manifest_entry(self) -> dict:
        """What the manifest records: the plan, fixed before any step.

        Returns:
            The filter's plan (epsilon, delta, order, RDP budget), the step bound at the order,
            whether it is data-dependent, the affordable steps (where fixed in advance), the rule
            in words, and the realised-path bounds and label where they apply.
        """
        predetermined = not self.data_dependent and self.realised_path is None
        entry = {**{k: v for k, v in self.filter.to_dict().items() if k != "spent"},
                 "step_bound_at_order": self.step_bound, "data_dependent": self.data_dependent,
                 "affordable_steps": (None if not predetermined or not np.isfinite(self.step_bound)
                                      or self.step_bound <= 0 else int(np.floor(self.filter.rdp_budget / self.step_bound))),
                 "rule": "a step is answered privately only if the charges of the answered steps so far plus its own, "
                         "at the filter's order, stay within rdp_budget (Feldman & Zrnic 2021, Theorem 3.1)",
                 **({"label": DATA_DEPENDENT_LABEL} if self.data_dependent else {})}
        if self.realised_path is not None:
            entry.update(charging="realised-path", screen_bound_at_order=self.realised_path[0],
                         answer_bound_at_order=self.realised_path[1],
                         rule="a step is answered privately only if the charges of the answered steps so far plus its "
                              "largest charge (screen and answer), at the filter's order, stay within rdp_budget; it is "
                              "then charged the screen's bound, plus the answer's where the screen passed (the decision "
                              "is released before the answer is charged: fully adaptive composition, Feldman & Zrnic "
                              "2021, Theorem 3.1; the answer's bound is the mechanism's data-independent one, for "
                              "AdaPMixED Theorem 3.1: as claimed for the paper's ball, proven for the proof-orders and "
                              "all-orders balls)")
        return entry

    def restore(self, charges: Iterable[float]) -> None:
        """Continue from committed records: their `budget_charge`, summed exactly.

        Args:
            charges: the committed steps' charges, in step order.

        Raises:
            ValueError: if a charge does not fit the budget (RenyiFilter.restore).
        """
        self.filter.restore(charges)

    def advance_data_independent(self, steps: int) -> npt.NDArray[np.bool_]:
        """Decide the next `steps` steps when every step is charged the data-independent bound (the
        default), spending as the run does; returns which were refused. With a constant charge, the
        first step that does not fit is followed by none that does.

        Args:
            steps: how many steps to decide.

        Returns:
            (steps,) bool, True for a refused step.

        Raises:
            ValueError: if the filter is data-dependent or realised-path.
        """
        require(not self.data_dependent, "a data-dependent filter's state depends on the earlier steps' private "
                                         "charges: it can only be restored from their records")
        require(self.realised_path is None, "a realised-path filter's state depends on the earlier steps' screen "
                                            "decisions: it can only be restored from their records")
        answered = int(min(steps, self.filter.affordable_repeats(self.step_bound)))  # +inf only for a zero bound
        self.filter.spend_repeated(self.step_bound, answered)
        refused = np.zeros(steps, dtype=bool)
        refused[answered:] = True
        return refused

    def restore_data_independent(self, steps: int) -> None:
        """The state after the run's first `steps` steps (data-independent charges): a worker decoding a
        later block knows it without the earlier records.

        Args:
            steps: the number of steps before the state wanted.

        Raises:
            ValueError: if the filter is data-dependent or realised-path.
        """
        self.filter.restore(())
        self.advance_data_independent(steps)

    def require_decisions(self, records: list[dict]) -> None:
        """Advance the filter over a block decoded elsewhere and require that its records made the same
        decisions and charges (ValueError naming the first step that differs): the process that commits
        a run never commits an answer its own filter would have refused.

        Args:
            records: the block's records, with budget_refused and budget_charge.

        Raises:
            ValueError: if a record's decision or charge differs from this filter's, or the filter is
                data-dependent or realised-path.
        """
        refused = self.advance_data_independent(len(records))
        for record, expected in zip(records, refused):
            charge = 0.0 if expected else self.step_bound
            if record["budget_refused"] != bool(expected) or record["budget_charge"] != charge:
                raise ValueError(f"step {record['step']}: the privacy filter's decision from a worker (refused "
                                 f"{record['budget_refused']}, charge {record['budget_charge']!r}) differs from the "
                                 f"committing process's (refused {bool(expected)}, charge {charge!r})")

    def charges(self, charged: dict[str, np.ndarray], passed: np.ndarray | None = None) -> npt.NDArray[np.float64]:
        """Each step's charge in the filter: the step bound; realised-path, the screen's bound plus the
        answer's where `passed`; or (data-dependent) its actual total.

        Args:
            charged: component -> (L, K) charges of L steps at the K orders.
            passed: (L,) bool, where each step's screen passed (realised-path); None: every step passed.

        Returns:
            (L,) charges at the filter's order.
        """
        rows = next(iter(charged.values())).shape[0]
        if self.realised_path is not None:
            passed = np.ones(rows, dtype=bool) if passed is None else np.asarray(passed, dtype=bool)
            return np.asarray([self.realised_path_charge(bool(p)) for p in passed], dtype=np.float64)
        if not self.data_dependent:
            return np.full(rows, self.step_bound)
        return np.sum([values[:, self.order_index] for values in charged.values()], axis=0)

    def realised_path_charge(self, passed: bool) -> float:
        """A realised-path step's filter charge: the screen's bound, plus the answer's (rounded up) if it passed.

        Args:
            passed: whether the step's screen passed.

        Returns:
            The charge at the filter's order.

        Raises:
            ValueError: if the filter is not realised-path.
        """
        if self.realised_path is None:
            raise ValueError("the privacy filter does not charge realised-path")
        screen, answer = self.realised_path
        return float(up_add(screen, answer)) if passed else screen

    def apply(self, outcome: BlockOutcome, tokens: npt.NDArray[np.int64], public: torch.Tensor, run_seed: int,
              first_step: int) -> npt.NDArray[np.int64]:
        """Decide the block's steps in order; refused steps get the public distribution, zero
        charges, a public token from their fallback generator. Sets outcome.budget_refused and
        outcome.budget_charge; returns the tokens.

        Args:
            outcome: the mechanism's outcome on the block's L steps; changed in place.
            tokens: the L tokens sampled from outcome.output.
            public: the public distributions (L, V).
            run_seed: the run's seed (seeds a refused step's fallback token).
            first_step: the run-wide index of the block's first step.

        Returns:
            The L tokens, a refused step's replaced by its fallback draw from the public distribution.

        Raises:
            ValueError: if a realised-path step's charge does not fit after it was admitted (RenyiFilter.spend).
        """
        charges = self.charges(outcome.charged, outcome.screen_passed)
        refused = np.zeros(charges.shape[0], dtype=bool)
        spent = np.zeros(charges.shape[0])
        for row, charge in enumerate(charges):
            if self.realised_path is not None:  # admitted on its largest charge, before its screen's decision is used
                answered = self.filter.fits(self.step_bound)
                if answered:
                    self.filter.spend(float(charge))
            else:
                answered = self.filter.spend_if_fits(float(charge))
            if answered:
                spent[row] = charge
            else:
                refused[row] = True
        # every step gets a decision (not only blocks with a refusal: free generation concatenates steps)
        passed = (np.ones(charges.shape[0], dtype=bool) if outcome.screen_passed is None
                  else np.asarray(outcome.screen_passed, dtype=bool).copy())
        if refused.any():
            tokens = tokens.copy()
            rows = np.flatnonzero(refused)
            outcome.output = outcome.output.clone()
            outcome.output[rows] = public[rows]
            for name in outcome.charged:
                outcome.charged[name] = outcome.charged[name].copy()
                outcome.charged[name][rows] = 0.0
            passed[rows] = False
            for refused_row in rows:
                generator = torch.Generator().manual_seed(fallback_seed(run_seed, first_step + int(refused_row)))
                tokens[refused_row] = int(torch.multinomial(public[refused_row], 1, generator=generator)[0])
        outcome.screen_passed, outcome.budget_refused, outcome.budget_charge = passed, refused, spent
        return tokens
