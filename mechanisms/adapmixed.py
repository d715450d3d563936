"""AdaPMixED: noisy screening + PMixED charged data-dependently (Flemings et al. 2024, Section 4, Algorithm 1).

Per-step loss as the paper states it (ibid. Theorem 4.2): eps_screen(a) + 1{screen passed} * eps_t(a),
with eps_t(a') = max_i D<->_a'(p, p_{-i}) (ibid. Eq. 3), computable at every order a' of the grid.
Eq. 3 covers the remove-one neighbours of the realised ensemble; `add_one_bound_values` covers an
added teacher. A data-dependent loss is not a releasable DP guarantee (Papernot et al. 2018), and
reports say so. Which of these the decode loop charges, and why charging eps_t only when the screen
passed does not bound the released output, is in dpledger.decoding.runners.adapmixed_runner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.orders import DEFAULT_ORDERS, canonical_orders
from dpledger.accounting.errors import require
from dpledger.accounting.relation import NeighbouringRelation, neighbouring_relation
from dpledger.mechanisms.distributions import validated_ensemble, validated_lambdas
from dpledger.mechanisms.kernels import mixed_teachers
from dpledger.mechanisms.leave_one_out import leave_one_out_curve
from dpledger.mechanisms.pmixed import PMixED
from dpledger.mechanisms.screening import NoisyScreening
from dpledger.mechanisms.step import StepResult, adapmixed_step
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:
    import torch
    from dpledger.accounting.relation import PathAccounting
    from dpledger.mechanisms.randomness import StepGenerators
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light


def data_dependent_pmixed_values(teachers: npt.ArrayLike | torch.Tensor, public: npt.ArrayLike | torch.Tensor,
                                 lambdas: npt.ArrayLike, orders: Sequence[float]) -> NDArray[np.float64]:
    """max_i D<->_a(p, p_{-i}) at each order (Flemings et al. 2024, Eq. 3), vectorised over all N
    leave-one-out ensembles and the batch: teachers (..., N, V), public (..., V), lambdas (..., N)
    -> (..., K), K the number of distinct orders, in sorted order. Exact at every order, from the
    same kernel the decode loop charges with (dpledger.mechanisms.leave_one_out.leave_one_out_curve), which mixes
    the teachers itself so that probabilities below the normal float range stay accurate.

    Args:
        teachers: (..., N, V) next-token laws of the teachers.
        public: (..., V) the public model's laws.
        lambdas: (..., N) the mixing weights the step used.
        orders: Renyi orders > 1.

    Returns:
        (..., K) the loss at the K distinct orders, sorted.

    Raises:
        ValueError: laws that are not distributions, shapes that disagree, or orders not > 1.
    """
    teachers_np, public_np = validated_ensemble(teachers, public, None)
    lambdas_np = validated_lambdas(lambdas, teachers_np)
    values, _, _ = leave_one_out_curve(torch.from_numpy(teachers_np), torch.from_numpy(public_np),
                                       torch.from_numpy(lambdas_np), canonical_orders(orders), relative_tolerance=None)
    return values


def add_one_bound_values(pmixed: PMixED, teachers: npt.ArrayLike | torch.Tensor, public: npt.ArrayLike | torch.Tensor,
                         lambdas: npt.ArrayLike, orders: Sequence[float]) -> NDArray[np.float64]:
    """Upper bound on max(D_a(p_+ || p), D_a(p || p_+)) over every teacher that could be added to
    the ensemble (p_+ = (N p + q) / (N + 1), q the added teacher after PMixED's projection), at each
    order: teachers (..., N, V), public (..., V), lambdas (..., N) -> (..., K), K distinct orders
    sorted. The derivation, step by step with the theorem behind each, is in
    dpledger.mechanisms.add_one.add_one_divergence_bounds; tests/test_add_one_bound.py checks it against the
    worst case found by direct optimisation over the ball.

    Args:
        pmixed: the PMixED spec whose ball the added teacher is projected onto.
        teachers: next-token laws (..., N, V) of the N teachers.
        public: the public model's laws (..., V).
        lambdas: the mixing weights (..., N) the step used.
        orders: Renyi orders > 1.

    Returns:
        The bound (..., K) over the K distinct orders, sorted.

    Raises:
        ValueError: laws that are not distributions, shapes that disagree, or orders not > 1.
    """
    teachers_np, public_np = validated_ensemble(teachers, public, None)
    lambdas_np = validated_lambdas(lambdas, teachers_np)
    mixed = mixed_teachers(torch.from_numpy(teachers_np), torch.from_numpy(public_np), torch.from_numpy(lambdas_np))
    orders_t = torch.tensor(canonical_orders(orders), dtype=torch.float64)
    from dpledger.mechanisms.add_one import add_one_divergence_bounds  # numba kernels, on first use

    bound: NDArray[np.float64] = add_one_divergence_bounds(
        mixed.mean(dim=-2), torch.from_numpy(public_np), teachers_np.shape[-2], orders_t, *pmixed.one_order_ball).numpy()
    return bound


def loss_covering(relation: NeighbouringRelation | str, remove_one: Callable[[], NDArray[np.float64]],
                  add_one: Callable[[], NDArray[np.float64]]) -> NDArray[np.float64]:
    """The data-dependent loss that covers `relation`, from zero-argument callables giving the
    remove-one loss (Eq. 3) and the add-one bound (each called only when needed): one of them for
    REMOVE_ONE / ADD_ONE, the larger at each order for ADD_OR_REMOVE_ONE. A composition of the two
    per order, not a sum: both bound the same step's divergence for different neighbours.

    Args:
        relation: the neighbouring relation (or its value), not replace-one.
        remove_one: gives the remove-one loss (..., K).
        add_one: gives the add-one bound (..., K).

    Returns:
        (..., K) the covering loss.

    Raises:
        ValueError: for an unknown relation or replace-one.
    """
    covered = neighbouring_relation(relation)
    require(covered is not NeighbouringRelation.REPLACE_ONE,
            "PMixED's data-dependent loss is derived for adding or removing a teacher, not replacing one")
    parts = [loss() for move, loss in (("remove", remove_one), ("add", add_one)) if move in covered.moves]
    covering: NDArray[np.float64] = np.maximum.reduce(parts)
    return covering


def data_dependent_pmixed_curve(pmixed: PMixED, teachers: npt.ArrayLike | torch.Tensor,
                                public: npt.ArrayLike | torch.Tensor, lambdas: npt.ArrayLike | None = None,
                                orders: Sequence[float] = DEFAULT_ORDERS,
                                relation: NeighbouringRelation = NeighbouringRelation.REMOVE_ONE) -> RdpCurve:
    """One step's data-dependent PMixED loss over the whole order grid, covering both divergence
    directions for the neighbours of `relation`: REMOVE_ONE is Flemings et al. 2024, Eq. 3
    (max over the N ensembles without one teacher); ADD_ONE the add-one bound
    (add_one_bound_values); ADD_OR_REMOVE_ONE the larger of the two at each order.

    Args:
        pmixed: the PMixED spec (alpha, beta, N, ball).
        teachers: next-token laws (N, V) of the teachers at this step.
        public: the public model's law (V,).
        lambdas: the mixing weights (N,); None computes them as the step does.
        orders: Renyi orders > 1 (default: the default grid).
        relation: which neighbours the loss covers (default remove-one, Eq. 3).

    Returns:
        A data-dependent RdpCurve covering both divergence directions.

    Raises:
        ValueError: laws that are not distributions, shapes that disagree, or orders not > 1."""
    relation = neighbouring_relation(relation)
    teachers_np, public_np = validated_ensemble(teachers, public, pmixed.teachers)
    weights = pmixed.mixing_weights(teachers_np, public_np) if lambdas is None else lambdas
    grid = canonical_orders(orders)
    values = loss_covering(relation, lambda: data_dependent_pmixed_values(teachers_np, public_np, weights, grid),
                           lambda: add_one_bound_values(pmixed, teachers_np, public_np, weights, grid))
    return RdpCurve(grid, values, relation, data_dependent=True)


@dataclass(frozen=True)
class AdaPMixED:
    """AdaPMixED's parameters: the PMixED projection and the noisy screening.

    Paper defaults (Flemings et al. 2024, Table 4): alpha=18, beta=0.2, N=100, sigma=1e-2, lam=1e-4, T=4.5, top-k=60.
    The decoding runner (dpledger.decoding.runners.adapmixed_runner) also runs Table 2a's two ablations.
    """

    pmixed: PMixED
    screening: NoisyScreening

    def __post_init__(self) -> None:
        if not isinstance(self.pmixed, PMixED) or not isinstance(self.screening, NoisyScreening):
            raise ValueError(f"AdaPMixED needs a PMixED and a NoisyScreening, got {type(self.pmixed).__name__} "
                             f"and {type(self.screening).__name__}")
        if self.screening.teachers != self.pmixed.teachers:
            raise ValueError(f"screening teachers ({self.screening.teachers}) must equal PMixED teachers "
                             f"({self.pmixed.teachers})")
        if self.screening.relation != self.pmixed.relation:
            raise ValueError("screening and PMixED must be stated for the same neighbouring relation")
        if self.pmixed.teachers < 2:
            raise ValueError(f"AdaPMixED needs at least 2 teachers, got {self.pmixed.teachers}: its data-dependent "
                             "loss (Flemings et al. 2024, Eq. 3) compares the ensemble with its leave-one-out "
                             "ensembles; with one teacher use PMixED, whose bound covers it")

    @property
    def relation(self) -> NeighbouringRelation:
        return self.pmixed.relation

    def step(self, teachers: npt.ArrayLike | torch.Tensor, public: npt.ArrayLike | torch.Tensor,
             generator: torch.Generator | StepGenerators | None = None, orders: Sequence[float] | None = None,
             relation: NeighbouringRelation | str | None = None,
             accounting: PathAccounting | str = "released-output") -> StepResult:
        """One AdaPMixED step for a batch of steps, as the decode loop runs it: teachers (..., N, V)
        and public (..., V), numpy or torch on any device; `generator` a torch.Generator (or
        dpledger.mechanisms.randomness.StepGenerators) for the screening noise. Returns a
        dpledger.mechanisms.step.StepResult: the distribution to sample from, lambdas, screening statistic
        and decision, and the charged curve by component on `orders` (default
        dpledger.accounting.orders.DEFAULT_ORDERS), covering `relation` (default: the mechanism's).

        Args:
            teachers: (..., N, V) distributions.
            public: (..., V) distributions.
            generator: the screening noise's generator (required: the screen runs).
            orders: Renyi orders of the curves; None for DEFAULT_ORDERS.
            relation: the relation the data-dependent loss covers; None for the mechanism's.
            accounting: "released-output" or "realised-path".

        Returns:
            The StepResult.

        Raises:
            ValueError: as dpledger.mechanisms.step.adapmixed_step.
        """
        return adapmixed_step(self, teachers, public, generator, orders, relation, accounting)

    @classmethod
    def paper_defaults(cls, teachers: int = 100) -> "AdaPMixED":
        """The paper's defaults (Flemings et al. 2024, Table 4), for `teachers` teachers.

        Args:
            teachers: N, an integer >= 2 (100 in the paper).

        Returns:
            AdaPMixED with alpha 18, beta 0.2, sigma 1e-2, lam 1e-4, T 4.5, top-k 60.

        Raises:
            ValueError: for fewer than 2 teachers.
        """
        return cls(PMixED(alpha=18.0, beta=0.2, teachers=teachers),
                   NoisyScreening(teachers=teachers, lam=1e-4, sigma=1e-2, alpha=18.0, threshold=4.5, top_k=60))
