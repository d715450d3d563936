"""PMixED: project each teacher onto a Renyi ball around the public model, average, sample.

Flemings et al. 2024, Section 3.2, Algorithm 2, Appendix C.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar, Sequence

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from dpledger.accounting.curve import RdpCurve, compose_curves
from dpledger.accounting.errors import (require, require_in_closed, require_int_at_least, require_non_negative,
                               require_order, require_positive)
from dpledger.accounting.orders import DEFAULT_ORDERS, canonical_orders
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.accounting.rounding import ROUNDING_ULPS, SMALLEST_POSITIVE
from dpledger.mechanisms.accountable import TEACHERS_HELP, AccountableMechanism, mechanism_parameter, register_mechanism
from dpledger.mechanisms.base import Mechanism, require_relation, set_validated
from dpledger.mechanisms.distributions import validated_ensemble, validated_lambdas
from dpledger.mechanisms.ball import Ball, all_orders_ball_constraints, ball_named, proof_orders_ball_constraints
from dpledger.mechanisms.kernels import SOLVER_VERSION, ball_mixing_weights, mixing_weights
from dpledger.mechanisms.log_space import log_mean_with_one_exp
from dpledger.mechanisms.step import pmixed_step
from dpledger.mechanisms.subsampling import amplified_rdp
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:
    import torch
    from dpledger.mechanisms.randomness import StepGenerators
    from dpledger.mechanisms.step import StepResult
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light


def theorem_3_1_epsilon(alpha: npt.ArrayLike, beta: float, teachers: npt.ArrayLike) -> NDArray[np.float64]:
    """Data-independent per-query RDP of PMixED at the projection order, AS CLAIMED.

    Flemings et al. 2024, Theorem 3.1 / C.1: eps(a, beta, N) = log((N - 1 + exp(4 beta a (a-1))) / N) / (a-1)
    for N > 1, and beta * a for N = 1 (the single teacher's ball). Vectorised over alpha and N.
    Caution: the proof applies a triangle-like inequality (Flemings et al. 2024, Theorem A.5, after
    Steinke) whose hypothesis is a bound at every order, while the projection enforces order a
    only; there are inputs whose loss exceeds this value, with extreme tails or not (a two-token
    LM-like ensemble by 22% at order a: docs/soundness.md). It is
    reported "as claimed". N = 0 (an empty subsample: the output is the public model) costs 0.

    Args:
        alpha: projection order(s) a > 1 (a number or an array).
        beta: ball radius per order, finite and >= 0.
        teachers: ensemble size(s) N >= 0 (a number or an array broadcast against alpha).

    Returns:
        The per-query RDP at order a, broadcast over alpha and N.

    Raises:
        ValueError: an alpha not finite and > 1, beta not finite and >= 0, or an N that is not an
            integer >= 0.
    """
    a = np.asarray(alpha, dtype=np.float64)
    bad_alpha = ~(np.isfinite(a) & (a > 1))
    if np.any(bad_alpha):
        raise ValueError(f"alpha (Renyi order) must be finite and > 1, got {float(a[bad_alpha].flat[0])!r}")
    beta = require_non_negative("beta", beta)
    n = np.asarray(teachers, dtype=np.float64)
    bad_n = ~np.isfinite(n) | (n < 0) | (n != np.round(n))
    if np.any(bad_n):
        raise ValueError(f"teachers must be integers >= 0, got {float(n[bad_n].flat[0])!r}")
    exponent = 4.0 * beta * a * (a - 1.0)
    many = log_mean_with_one_exp(exponent, np.maximum(n, 1.0)) / (a - 1.0)
    values: NDArray[np.float64] = np.where(n > 1, many, np.where(n == 1, beta * a, 0.0))
    return values


def covering_ensemble_sizes(teachers: int, relation: NeighbouringRelation) -> tuple[int, ...]:
    """The ensemble sizes m whose Theorem 3.1 value (removing one of m teachers) a PMixED of N teachers
    must cover under `relation`: removing one of its N teachers is m = N (the empty ensemble answers
    with the public model, so m = 1 is the single teacher's ball), adding one to its N is m = N + 1.
    Replacing a teacher is two moves and has no bound here (ValueError).

    Args:
        teachers: the ensemble size N, an integer >= 1.
        relation: the neighbouring relation.

    Returns:
        The sizes m: (N,) under remove-one, (N + 1,) under add-one, (N, N + 1) under add-or-remove-one.

    Raises:
        ValueError: if N is not an integer >= 1, `relation` is not a NeighbouringRelation, or it is replace-one.
    """
    teachers = require_int_at_least("teachers", teachers, 1)
    relation = require_relation(relation)
    require(relation is not NeighbouringRelation.REPLACE_ONE,
            "PMixED's bound (Flemings et al. 2024, Theorem 3.1) covers adding or removing one teacher; replacing "
            "one is two moves with no proven bound here: use the add-or-remove-one relation")
    return tuple(size for move, size in (("remove", teachers), ("add", teachers + 1)) if move in relation.moves)


def proof_orders_epsilon(alpha: npt.ArrayLike, beta: float, teachers: int,
                         relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE) -> NDArray[np.float64]:
    """PMixED's per-query RDP at order a for the ball at the proof's two orders (Ball.PROOF_ORDERS:
    D<->_{2a-1}(pbar_i, p0) <= beta (2a - 1), D<->_{2a}(pbar_i, p0) <= 2 beta a), PROVEN at a (and, by
    monotonicity, at every order <= a, where the value at a is what holds: a ball enforced for a
    projection order a holds nothing at order a' < a with the value for a'). `alpha` is the ball's
    projection order (an array gives the value for each such ball, not a curve of one ball).

    For an ensemble of m >= 2 teachers it is Theorem 3.1 of Flemings et al. 2024 at order a: its proof
    reads the ball only through Theorem A.5 at order a, and Hoelder's inequality with exponents
    p = (2a - 1)/a, q = (2a - 1)/(a - 1) (Mironov 2017, Proposition 11) gives
    (a - 1) D_a(P || R) <= (a - 1/p) D_{2a-1}(P || p0) + (a - 1) D_{2a}(p0 || R) <= 4 beta a (a - 1)
    for P, R each a mixed teacher or a mean of them (joint quasi-convexity, Flemings et al. 2024,
    Theorem A.6, carries the ball to means); the rest of the proof (Jensen, convexity in the second
    argument) holds at a as written. For m = 1 (the single teacher against the public model, removal
    only) it is 2 beta a: D_a(pbar || p0) <= D_{2a-1}(pbar || p0) <= beta (2a - 1) and
    D_a(p0 || pbar) <= D_{2a}(p0 || pbar) <= 2 beta a, by monotonicity in the order (van Erven &
    Harremoes 2014, Theorem 3). The largest value over the ensemble sizes `relation` covers
    (`covering_ensemble_sizes`), as pmixed_epsilon.

    Args:
        alpha: order(s) a > 1 at which Theorem 3.1 is charged (a number or an array).
        beta: ball radius per order, finite and >= 0.
        teachers: the ensemble size N, an integer >= 1.
        relation: the neighbouring relation (not replace-one).

    Returns:
        The per-query RDP at order a, shaped as alpha.

    Raises:
        ValueError: for a parameter out of range or relation replace-one.
    """
    sizes = np.asarray(covering_ensemble_sizes(teachers, relation), dtype=np.float64)
    a = np.asarray(alpha, dtype=np.float64)
    theorem = theorem_3_1_epsilon(a[..., None], beta, sizes)
    values: NDArray[np.float64] = np.where(sizes == 1, 2.0 * beta * a[..., None], theorem).max(axis=-1)
    return values


def pmixed_epsilon(alpha: npt.ArrayLike, beta: float, teachers: int,
                   relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE) -> NDArray[np.float64]:
    """PMixED's per-query RDP for an ensemble of N teachers under `relation`: the largest Theorem 3.1
    value over the neighbouring pairs the relation holds (`covering_ensemble_sizes`). For N >= 2 it is
    Theorem 3.1 at N (its value decreases in N, so adding a teacher costs less); for N = 1 under
    add-or-remove it is Theorem 3.1 at N = 2 (an added second teacher), not the single teacher's
    ball beta * alpha (Flemings et al. 2024, Theorem 3.1 / C.1, whose N = 1 case covers removal only).

    Args:
        alpha: order(s) a > 1 (a number or an array).
        beta: ball radius per order, finite and >= 0.
        teachers: the ensemble size N, an integer >= 1.
        relation: the neighbouring relation (not replace-one).

    Returns:
        The per-query RDP, shaped as alpha.

    Raises:
        ValueError: for a parameter out of range or relation replace-one.
    """
    sizes = np.asarray(covering_ensemble_sizes(teachers, relation), dtype=np.float64)
    a = np.asarray(alpha, dtype=np.float64)
    values: NDArray[np.float64] = theorem_3_1_epsilon(a[..., None], beta, sizes).max(axis=-1)
    return values


def beta_from_budget(epsilon_budget: float, queries: int, alpha: float, teachers: int,
                     relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE) -> float:
    """Largest beta giving (alpha, epsilon_budget)-RDP over `queries` queries (Flemings et al. 2024, Lemma C.1).

    beta = log(M exp((a-1) eps_G / Q) + 1 - M) / (4 (a-1) a) for M > 1; eps_G / (Q a) for M = 1, where
    M is the ensemble size whose Theorem 3.1 value `pmixed_epsilon` charges (N, or 2 for a single
    teacher under a relation that adds one: Lemma C.1 inverts Theorem 3.1 at that size).

    Args:
        epsilon_budget: the RDP budget at order alpha over all queries, > 0.
        queries: number of queries Q, an integer >= 1.
        alpha: the projection order a > 1.
        teachers: ensemble size N >= 1.
        relation: the neighbouring relation the budget must hold for (default add-or-remove-one).

    Returns:
        The largest beta whose Q-fold Theorem 3.1 charge at order alpha is at most the budget.

    Raises:
        ValueError: a parameter outside the ranges above.
    """
    epsilon_budget = require_positive("epsilon_budget", epsilon_budget)
    queries = require_int_at_least("queries", queries, 1)
    alpha = require_order("alpha", alpha)
    # the covering size with the largest Theorem 3.1 value: the smallest one above 1 (the value decreases
    # in the size and at size 2 already exceeds the single teacher's beta * alpha), else 1
    several = [size for size in covering_ensemble_sizes(teachers, relation) if size > 1]
    size = min(several) if several else 1
    per_query = epsilon_budget / queries
    if size == 1:
        beta = per_query / alpha
    else:
        x = (alpha - 1.0) * per_query
        # log(M e^x + 1 - M) = log1p(M expm1(x)): no cancellation for small x (log M + x +
        # log1p((1 - M) e^{-x} / M) was 8.9e-7 too large at x = 1e-10, M = 1000); for large x, where
        # expm1 overflows, that second form is itself accurate.
        inner = (math.log1p(size * math.expm1(x)) if x < 700.0
                 else math.log(size) + x + math.log1p((1.0 - size) * math.exp(-x) / size))
        beta = inner / (4.0 * (alpha - 1.0) * alpha)
    require(math.isfinite(beta), f"beta overflows for epsilon_budget={epsilon_budget:g}, queries={queries}, "
                                 f"alpha={alpha:g}: choose a smaller budget per query or order")
    # rounded down by a bound on its floating-point error (relative, and absolute for subnormal
    # values), so that beta never exceeds the budget
    beta = beta * (1.0 - 2.0 * ROUNDING_ULPS) - 16.0 * SMALLEST_POSITIVE
    # where float64 has few digits left (tiny budgets), a proof instead of a margin: step down until an
    # exact rational upper bound on Theorem 3.1 fits the exact per-query budget
    exact_budget = Fraction(epsilon_budget) / queries
    while beta > 0 and not _tiny_beta_fits(beta, alpha, size, exact_budget):
        beta = math.nextafter(beta, 0.0)
    require(beta > 0, f"beta underflows for epsilon_budget={epsilon_budget:g}, queries={queries}: the budget per "
                      f"query is below what float64 can resolve")
    return beta


_EXACT_CHECK_BELOW = 2.0 ** -50
"""Exponents c = 4 beta alpha (alpha - 1) below this get beta_from_budget's exact check: there the
bound c (1 + c) / M on M (alpha - 1) times Theorem 3.1 is within an ulp of it."""


def _tiny_beta_fits(beta: float, alpha: float, size: int, budget: Fraction) -> bool:
    """Theorem 3.1 at `beta` is at most `budget` (exact rationals) when c = 4 beta alpha (alpha - 1)
    is tiny; True (the relative margin suffices) otherwise. For 0 <= c <= 1,
    log(1 + (e^c - 1) / M) <= (e^c - 1) / M <= (c + c^2) / M; for M = 1 the bound is beta * alpha."""
    b, a = Fraction(beta), Fraction(alpha)
    c = 4 * b * a * (a - 1)
    if c >= _EXACT_CHECK_BELOW:
        return True
    if size == 1:
        return b * a <= budget
    return (c + c * c) / (size * (a - 1)) <= budget


PROOF_ORDERS_MAX_ALPHA = 512.0
"""The largest alpha of a proof-orders PMixED: its constraint orders 2 alpha - 1 and 2 alpha stay within
1024, the largest order at which the kernels' divergences are checked against mpmath."""


def balls_for_order(alpha: float) -> tuple[Ball, ...]:
    """The balls a PMixED of projection order `alpha` can use: every Ball, less proof-orders above
    PROOF_ORDERS_MAX_ALPHA.

    Args:
        alpha: the projection order (> 1).

    Returns:
        The balls, in Ball's order.
    """
    return tuple(b for b in Ball if b is not Ball.PROOF_ORDERS or alpha <= PROOF_ORDERS_MAX_ALPHA)


@register_mechanism
@dataclass(frozen=True)
class PMixED(AccountableMechanism):
    """One PMixED query: N teachers, each projected onto a Renyi ball around p0, then averaged.

    ball="projection-order" (the paper's, Flemings et al. 2024, Algorithm 2): radius beta * alpha at
    order alpha only. The curve is Theorem 3.1's value (as claimed) at every order <= alpha (RDP is
    non-decreasing in the order, so the projection-order bound covers lower orders) and +inf above
    alpha, where the projection enforces nothing.
    ball="all-orders": radius beta * k at every order k (Ball.ALL_ORDERS); the curve is Theorem 3.1
    at every order, proven. `alpha` is then only the order Lemma C.1 budgets at.
    ball="proof-orders": radius beta * k at k = 2 alpha - 1 and 2 alpha only, the orders the proof of
    Theorem 3.1 at alpha reads (Ball.PROOF_ORDERS); the curve is Theorem 3.1 at alpha, proven
    (`proof_orders_epsilon`), at every order <= alpha, and +inf above.
    Either way the value covers every neighbour of `relation` (`pmixed_epsilon`): with one teacher
    under add-or-remove that is an added second teacher. Replace-one is refused (no bound).
    """

    name: ClassVar[str] = "pmixed"
    summary: ClassVar[str] = ("PMixED, optionally with Poisson subsampling of teachers (Flemings et al. 2024, "
                              "Theorem 3.1, Theorem A.4)")
    calibrated: ClassVar[str | None] = "beta"
    calibrate_summary: ClassVar[str] = ("largest PMixED beta (Flemings et al. 2024, Theorem 3.1 / Lemma C.1; Theorem "
                                        "A.4 with --sample-rate)")

    alpha: float = mechanism_parameter(metavar="A", unit="Renyi order",
                                       help="PMixED projection order a (> 1; Flemings et al. 2024 use 6)")
    beta: float = mechanism_parameter(
        metavar="BETA", unit="nats per unit of order",
        help="Renyi-ball radius per unit of order: each mixed teacher keeps D_a(mixed || public) <= beta * a, in "
             "nats (> 0)")
    teachers: int = mechanism_parameter(metavar="N", type=int, unit="teachers", help=TEACHERS_HELP)
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE
    ball: Ball = mechanism_parameter(
        default=Ball.PROJECTION_ORDER, type=str, unit="a ball", choices=[b.value for b in Ball],
        help="PMixED's Renyi ball: projection-order (the paper's; Theorem 3.1 as claimed), proof-orders "
             "(orders 2a-1 and 2a; Theorem 3.1 proven at orders <= a) or all-orders (Theorem 3.1 proven at every "
             "order; docs/soundness.md) (default: projection-order)")

    def __post_init__(self) -> None:
        set_validated(self, alpha=require_order("alpha", self.alpha), beta=require_non_negative("beta", self.beta),
                      teachers=require_int_at_least("teachers", self.teachers, 1),
                      relation=require_relation(self.relation), ball=ball_named(self.ball))
        covering_ensemble_sizes(self.teachers, self.relation)  # refuses a relation PMixED has no bound for
        # the proof-orders ball constrains order 2 alpha: keep it within the orders the kernels are checked at
        require(self.ball is not Ball.PROOF_ORDERS or self.alpha <= PROOF_ORDERS_MAX_ALPHA,
                f"alpha must be <= {PROOF_ORDERS_MAX_ALPHA:g} with ball = proof-orders (its constraint order 2 alpha "
                f"must be <= 1024, the largest order the kernels are checked at), got {self.alpha!r}")

    @property
    def radius(self) -> float:
        """The Renyi ball's radius beta * alpha (Flemings et al. 2024, Algorithm 2)."""
        return self.beta * self.alpha

    @property
    def per_query_epsilon(self) -> float:
        """The per-query RDP at the projection order under the mechanism's relation (`pmixed_epsilon`;
        `proof_orders_epsilon` for the proof-orders ball)."""
        if self.ball is Ball.PROOF_ORDERS:
            return float(proof_orders_epsilon(self.alpha, self.beta, self.teachers, self.relation))
        return float(pmixed_epsilon(self.alpha, self.beta, self.teachers, self.relation))

    @property
    def proven(self) -> bool:
        """True when the ball enforces what the proof of Theorem 3.1 reads (all-orders, proof-orders);
        False: "as claimed" (the paper's projection-order ball)."""
        return self.ball is not Ball.PROJECTION_ORDER

    @property
    def ball_constraints(self) -> tuple[tuple[float, ...], tuple[float, ...], float | None]:
        """(orders, radii in nats, D<->_inf radius or None) that the projection enforces: (alpha,),
        (beta alpha,) for the paper's ball; `proof_orders_ball_constraints` and
        `all_orders_ball_constraints` for the others."""
        if self.ball is Ball.ALL_ORDERS:
            return all_orders_ball_constraints(self.beta)
        if self.ball is Ball.PROOF_ORDERS:
            return proof_orders_ball_constraints(self.alpha, self.beta)
        return (self.alpha,), (self.radius,), None

    @property
    def one_order_ball(self) -> tuple[float, float, float | None]:
        """(order, radius, all-orders beta or None): a ball at one order that holds every projected
        teacher, as the add-one bound (dpledger.mechanisms.add_one) takes it. The paper's ball:
        (alpha, beta alpha, None); all-orders: (alpha, beta alpha, beta); proof-orders: (2 alpha,
        2 beta alpha, None), its constraint at order 2 alpha (D<-> there <= 2 beta alpha)."""
        if self.ball is Ball.PROOF_ORDERS:
            return 2.0 * self.alpha, 2.0 * self.alpha * self.beta, None
        return self.alpha, self.radius, (self.beta if self.ball is Ball.ALL_ORDERS else None)

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        orders = np.asarray(orders, dtype=np.float64)
        if self.beta == 0.0:  # a ball of radius 0: every lambda is 0 and the output is the public model
            return np.zeros_like(orders)
        if self.ball is Ball.ALL_ORDERS:
            # Theorem 3.1 / C.1 at each order k: its proof applies Theorem A.5 with the ball at every order
            return pmixed_epsilon(orders, self.beta, self.teachers, self.relation)
        # one order alpha (proven there for proof-orders, as claimed for the paper's ball); lower orders by monotonicity
        return np.where(orders <= self.alpha + 1e-12, self.per_query_epsilon, np.inf)

    def mixing_weights(self, teachers: npt.ArrayLike | torch.Tensor,
                       public: npt.ArrayLike | torch.Tensor) -> NDArray[np.float64]:
        """lambda_i per teacher (vectorised over all N): largest lambda in [0, 1] keeping the mixed
        teacher within the ball (Flemings et al. 2024, Algorithm 2; every order for the all-orders
        ball). teachers (..., N, V), public (..., V).

        Args:
            teachers: (..., N, V) distributions.
            public: (..., V) distributions.

        Returns:
            (..., N) float64 mixing weights in [0, 1].

        Raises:
            ValueError: if the distributions are invalid, do not match, or N differs.
        """
        teachers_np, public_np = validated_ensemble(teachers, public, self.teachers)
        return self.mixing_weights_tensor(torch.from_numpy(teachers_np), torch.from_numpy(public_np)).numpy()

    def mixing_weights_tensor(self, teachers: torch.Tensor, public: torch.Tensor,
                              solver_version: int = SOLVER_VERSION) -> torch.Tensor:
        """mixing_weights on float64 tensors, unvalidated (the decode loop's inner call).

        Args:
            teachers: (..., N, V) float64 distributions.
            public: (..., V) float64 distributions.
            solver_version: whose solver arithmetic to follow (dpledger.mechanisms.kernels.SOLVER_VERSION;
                a trace's replay passes the version that wrote it).

        Returns:
            (..., N) float64 mixing weights.
        """
        if self.ball is Ball.PROJECTION_ORDER:
            return mixing_weights(teachers, public, self.alpha, self.radius, solver_version=solver_version)
        if self.beta == 0.0:  # radius 0: only the public model itself is in the ball
            return torch.zeros(teachers.shape[:-1], dtype=torch.float64, device=teachers.device)
        return ball_mixing_weights(teachers, public, *self.ball_constraints, solver_version=solver_version)

    def step(self, teachers: npt.ArrayLike | torch.Tensor, public: npt.ArrayLike | torch.Tensor,
             generator: torch.Generator | StepGenerators | None = None,
             orders: Sequence[float] | None = None) -> StepResult:
        """One PMixED step for a batch of steps, as the decode loop runs it: teachers (..., N, V) and
        public (..., V), numpy or torch on any device. Returns a dpledger.mechanisms.step.StepResult (the
        distribution to sample from, the lambdas, Theorem 3.1's curve on `orders`, default
        dpledger.accounting.orders.DEFAULT_ORDERS). `generator` is accepted for symmetry with
        AdaPMixED.step; PMixED itself draws nothing before sampling.

        Args:
            teachers: (..., N, V) distributions.
            public: (..., V) distributions.
            generator: unused (see above).
            orders: Renyi orders of the curve; None for DEFAULT_ORDERS.

        Returns:
            The StepResult.

        Raises:
            ValueError: if the distributions or orders are invalid.
        """
        return pmixed_step(self, teachers, public, orders)

    def output_distribution(self, teachers: npt.ArrayLike | torch.Tensor, public: npt.ArrayLike | torch.Tensor,
                            lambdas: npt.ArrayLike | None = None) -> NDArray[np.float64]:
        """p = mean_i (lambda_i p_i + (1 - lambda_i) p0), the distribution PMixED samples from.

        Args:
            teachers: (..., N, V) distributions.
            public: (..., V) distributions.
            lambdas: (..., N) mixing weights in [0, 1]; None computes them (mixing_weights).

        Returns:
            (..., V) float64 output distribution.

        Raises:
            ValueError: if the distributions or the lambdas are invalid.
        """
        teachers_np, public_np = validated_ensemble(teachers, public, self.teachers)
        weights = self.mixing_weights(teachers_np, public_np) if lambdas is None else lambdas
        lam = validated_lambdas(weights, teachers_np)[..., None]
        output: NDArray[np.float64] = (lam * teachers_np + (1.0 - lam) * public_np[..., None, :]).mean(axis=-2)
        return output


class SubsamplingVariant(enum.Enum):
    """How PMixED's Poisson-subsampled per-query bound is formed (Flemings et al. 2024, Theorem A.4; Zhu & Wang 2019).

    Each is an accounting choice with different soundness; reports show them side by side.
    """

    REALISED_SIZE = "realised-size"
    PER_ORDER_RADIUS = "per-order-radius"
    WORST_CASE_SIZE = "worst-case-size"
    REALISED_SIZE_GENERAL = "realised-size-general"
    WORST_CASE_SIZE_GENERAL = "worst-case-size-general"
    ALL_ORDERS_BALL = "all-orders-ball"

    def __str__(self) -> str:
        return self.value

    @property
    def uses_realised_sizes(self) -> bool:
        return self in (SubsamplingVariant.REALISED_SIZE, SubsamplingVariant.PER_ORDER_RADIUS,
                        SubsamplingVariant.REALISED_SIZE_GENERAL)

    @property
    def general(self) -> bool:
        return self in (SubsamplingVariant.REALISED_SIZE_GENERAL, SubsamplingVariant.WORST_CASE_SIZE_GENERAL,
                        SubsamplingVariant.ALL_ORDERS_BALL)

    @property
    def soundness(self) -> str:
        return _VARIANT_SOUNDNESS[self]

    @property
    def proven(self) -> bool:
        """True when the variant's bound is proven for the mechanism it accounts: only all-orders-ball
        (Theorem 3.1 holds at every order with the all-orders ball; Zhu & Wang 2019, Theorem 9). The
        others let the realised size choose the bound, charge a ball that is not enforced, need the
        tight form's extra condition (Zhu & Wang 2019, Theorem 5), or rest on Theorem 3.1 at the
        projection order, which is as claimed (Flemings et al. 2024, Theorem 3.1; docs/soundness.md)."""
        return self is SubsamplingVariant.ALL_ORDERS_BALL


_VARIANT_SOUNDNESS = {
    SubsamplingVariant.REALISED_SIZE: (
        "public reference implementation (reproduces Table 2a); lets the realised sample size, a random "
        "quantity, choose the bound (pitfall 2) and omits the factor 3 (pitfall 3): not a sound guarantee"),
    SubsamplingVariant.PER_ORDER_RADIUS: (
        "PMixED paper's original code; charges order k as if the ball there had radius beta*k although "
        "only the projection order is enforced (pitfall 4): unsound"),
    SubsamplingVariant.WORST_CASE_SIZE: (
        "worst ensemble size for every query, tight amplification (Zhu & Wang 2019, Theorem 5) without the factor 3: "
        "sound only if PMixED meets the tight form's extra condition"),
    SubsamplingVariant.REALISED_SIZE_GENERAL: (
        "general amplification (Zhu & Wang 2019, factor 3) but the realised sample size still chooses the "
        "bound (pitfall 2)"),
    SubsamplingVariant.WORST_CASE_SIZE_GENERAL: (
        "worst ensemble size and general amplification (Zhu & Wang 2019, factor 3): sound given Theorem 3.1, "
        "which the paper's one-order ball does not guarantee"),
    SubsamplingVariant.ALL_ORDERS_BALL: (
        "PMixED with the ball at every order (ball = all-orders): Theorem 3.1 then holds at every order k, so "
        "eps(k) := max over ensemble sizes m of Theorem 3.1 at order k is what the per-order-radius variant "
        "assumed, now enforced; with general amplification (Zhu & Wang 2019, factor 3): sound"),
}


@dataclass(frozen=True)
class SubsampledPMixED(Mechanism):
    """One PMixED query on a Poisson subsample of the teachers with rate `sampling_probability`.

    Base epsilon(k) plugged into the amplification bound (Steinke 2022; Zhu & Wang 2019):
      realised-size(-general): eps(k) := Theorem 3.1 at the projection order a with m = realised_size,
        for k <= a (+inf above a, where no bound holds);
      per-order-radius: eps(k) := Theorem 3.1 at order k with m = realised_size (unsound, pitfall 4);
      worst-case-size(-general): eps(k) := max over m in 1..M of Theorem 3.1 at order a, for k <= a;
      all-orders-ball: eps(k) := max over m in 1..M of Theorem 3.1 at order k, every k (needs a PMixED
        with ball="all-orders", for which that is proven);
      M = N, or N + 1 when the relation adds a teacher (a subsample of the neighbouring ensemble may
      hold all N + 1 teachers: at N = 1 that is the pair of sizes 1 and 2, not the single ball).
    The relation is the PMixED's.
    `realised_size` is required by the realised variants and ignored by the worst-case ones.
    q = 1 is no subsampling (every teacher is always sampled): the curve is PMixED's own for every
    variant, and a realised size must then be N; q = 0 samples nobody (the public model answers):
    the curve is 0, and a realised size must be 0.
    """

    pmixed: PMixED
    sampling_probability: float
    variant: SubsamplingVariant = SubsamplingVariant.WORST_CASE_SIZE_GENERAL
    realised_size: int | None = None

    def __post_init__(self) -> None:
        require(isinstance(self.pmixed, PMixED), f"pmixed must be a PMixED, got {type(self.pmixed).__name__}")
        set_validated(self, sampling_probability=require_in_closed("sampling_probability", self.sampling_probability,
                                                                   0.0, 1.0),
                      variant=subsampling_variant(self.variant))
        require(self.pmixed.ball is not Ball.PROOF_ORDERS,
                "Poisson subsampling of a PMixED with ball = proof-orders is not accounted here: use ball = "
                "all-orders (variant all-orders-ball), which holds Theorem 3.1 at every order the amplification sums")
        require((self.variant is SubsamplingVariant.ALL_ORDERS_BALL) == (self.pmixed.ball is Ball.ALL_ORDERS),
                f"variant {self.variant} needs a PMixED with ball = "
                f"{'all-orders' if self.variant is SubsamplingVariant.ALL_ORDERS_BALL else 'projection-order'}, "
                f"got ball = {self.pmixed.ball}")
        if self.variant.uses_realised_sizes:
            require(self.realised_size is not None, f"variant {self.variant} needs realised_size")
        if self.realised_size is not None:
            set_validated(self, realised_size=require_int_at_least("realised_size", self.realised_size, 0))
            require(self.realised_size <= self.pmixed.teachers,
                    f"realised_size must be <= teachers ({self.pmixed.teachers}), got {self.realised_size}")
            if self.sampling_probability in (0.0, 1.0):
                certain = round(self.sampling_probability * self.pmixed.teachers)
                require(self.realised_size == certain,
                        f"realised_size must be {certain} when sampling_probability is "
                        f"{self.sampling_probability:g}, got {self.realised_size}")

    @property
    def relation(self) -> NeighbouringRelation:
        return self.pmixed.relation

    @property
    def subsample_sizes(self) -> NDArray[np.int64]:
        """1..M: the sizes of the subsampled ensembles a neighbouring pair can differ at (one teacher
        removed from a subsample of this ensemble, or of the ensemble with one teacher added)."""
        return np.arange(1, max(covering_ensemble_sizes(self.pmixed.teachers, self.relation)) + 1)

    @property
    def worst_case_size(self) -> int:
        sizes = self.subsample_sizes
        return int(sizes[np.argmax(theorem_3_1_epsilon(self.pmixed.alpha, self.pmixed.beta, sizes))])

    def _realised(self) -> int:
        """realised_size, which __post_init__ requires for the realised variants."""
        if self.realised_size is None:
            raise ValueError(f"variant {self.variant} needs realised_size")
        return self.realised_size

    def base_epsilon(self, ks: NDArray[np.float64]) -> NDArray[np.float64]:
        """The base epsilon(k) the amplification bound takes (the class docstring's table).

        Args:
            ks: orders k, a float64 array.

        Returns:
            epsilon(k) at each k (+inf above the projection order for the one-order variants).

        Raises:
            ValueError: for a realised variant without realised_size (refused at construction).
        """
        alpha, beta = self.pmixed.alpha, self.pmixed.beta
        if self.variant is SubsamplingVariant.ALL_ORDERS_BALL:
            sizes = self.subsample_sizes.astype(np.float64)
            grid = np.asarray(ks, dtype=np.float64)
            largest: NDArray[np.float64] = theorem_3_1_epsilon(grid[..., None], beta, sizes).max(axis=-1)
            return largest
        if self.variant is SubsamplingVariant.PER_ORDER_RADIUS:
            return theorem_3_1_epsilon(ks, beta, self._realised())
        size = self._realised() if self.variant.uses_realised_sizes else self.worst_case_size
        value = float(theorem_3_1_epsilon(alpha, beta, size))
        values: NDArray[np.float64] = np.where(ks <= alpha + 1e-12, value, np.inf)
        return values

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        if self.sampling_probability == 1.0:  # no subsampling: the ensemble is always all N teachers
            return self.pmixed.rdp_values(np.asarray(orders, dtype=np.float64))
        return amplified_rdp(self.sampling_probability, self.base_epsilon, orders, self.variant.general)


def subsampling_variant(value: SubsamplingVariant | str) -> SubsamplingVariant:
    """The variant named by `value`; ValueError listing the names for anything else.

    Args:
        value: a SubsamplingVariant or its name (e.g. "all-orders-ball").

    Returns:
        The SubsamplingVariant.

    Raises:
        ValueError: if `value` names no variant.
    """
    try:
        return SubsamplingVariant(value)
    except ValueError:
        raise ValueError(f"subsampling variant must be one of {[v.value for v in SubsamplingVariant]}, "
                         f"got {value!r}") from None


def realised_subsample_sizes(teachers: int, sampling_probability: float, queries: int,
                             seed: int) -> NDArray[np.int64]:
    """m_t ~ Binomial(N, q) for each query, from numpy's PCG64 seeded with `seed` (reproducible).

    Args:
        teachers: N, an integer >= 1.
        sampling_probability: q in [0, 1].
        queries: the number of queries, an integer >= 1.
        seed: an integer >= 0.

    Returns:
        (queries,) int64 sizes.

    Raises:
        ValueError: for a parameter out of range.
    """
    teachers = require_int_at_least("teachers", teachers, 1)
    sampling_probability = require_in_closed("sampling_probability", sampling_probability, 0.0, 1.0)
    queries = require_int_at_least("queries", queries, 1)
    seed = require_int_at_least("seed", seed, 0)
    return np.random.default_rng(seed).binomial(teachers, sampling_probability, size=queries)


def subsampled_pmixed_curve(pmixed: PMixED, sampling_probability: float, variant: SubsamplingVariant | str,
                            queries: int, seed: int = 0, orders: Sequence[float] = DEFAULT_ORDERS) -> RdpCurve:
    """The composed RDP curve of `queries` PMixED queries, each over a Poisson subsample of the
    teachers (Flemings et al. 2024, Theorem A.4), formed as `variant` says (SubsamplingVariant:
    which amplification theorem and which ensemble size; realised-size variants draw the sizes with
    `seed`; docs/soundness.md says which variants are sound).

    Args:
        pmixed: the PMixED spec (alpha, beta, N, ball).
        sampling_probability: q in (0, 1].
        variant: a SubsamplingVariant or its name.
        queries: number of queries Q, an integer >= 1.
        seed: seed of the simulated subsample sizes (realised-size variants only).
        orders: the Renyi orders of the curve.

    Returns:
        The composed RdpCurve over `orders`.

    Raises:
        ValueError: a parameter outside its range, or a variant that needs the other ball.
    """
    require(isinstance(pmixed, PMixED), f"pmixed must be a PMixED, got {type(pmixed).__name__}")
    variant = subsampling_variant(variant)
    queries = require_int_at_least("queries", queries, 1)
    seed = require_int_at_least("seed", seed, 0)
    orders = canonical_orders(orders)
    if not variant.uses_realised_sizes:
        return SubsampledPMixED(pmixed, sampling_probability, variant).rdp_curve(orders).composed(queries)
    sizes = realised_subsample_sizes(pmixed.teachers, sampling_probability, queries, seed)
    unique_sizes, counts = np.unique(sizes, return_counts=True)
    return compose_curves(
        SubsampledPMixED(pmixed, sampling_probability, variant, int(size)).rdp_curve(orders).composed(int(count))
        for size, count in zip(unique_sizes, counts))
