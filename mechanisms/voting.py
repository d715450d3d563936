"""Hot PATE voting as a decoding mechanism: votes, one aggregator, per-step charges and output laws.

A step (Cohen et al. 2023, Framework 1.2): every teacher casts one vote from its next-token
distribution, coordinated (one shared Exp(1) vector per step: y_i = argmax_j p_i[j] / u_j) or
independent; the histogram c goes to an aggregator, which releases a token or fails, and on fail
the public model answers. The shared vector is drawn from `randomness.vote_seed(run seed, step)`,
public by construction, so conditioned on it the histogram is a deterministic function of the
teachers: that is what lets an audit recompute the exact output law on any neighbouring
histogram.

The aggregator is an object (dpledger.mechanisms.aggregation.VoteAggregator, one registered class per
aggregator, listed by dpledger.mechanisms.aggregators): `VotingMechanism` coordinates the votes and
delegates validation, charges, decisions and output laws to it. What each built-in aggregator is
charged is dpledger.mechanisms.hot_pate_aggregators's docstring (NeighbouringRelation: one teacher
added, removed or replaced moves at most one vote, L2 sensitivity <= sqrt(2), max-count sensitivity 1).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray
from scipy.special import logsumexp

from dpledger.accounting.errors import require, require_member
from dpledger.accounting.relation import NeighbouringRelation, PathAccounting, path_accounting
from dpledger.mechanisms.aggregation import VoteAggregator, pick_token
from dpledger.mechanisms.aggregators import build_aggregator
from dpledger.mechanisms.base import Mechanism, set_validated
from dpledger.mechanisms.pate import gnmax_log_output_law
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:  # dp_accounting ships no type information: DpEvent is opaque to mypy
    import torch
    from dp_accounting.dp_event import DpEvent
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light

__all__ = ["VoteCoordination", "VotingMechanism", "gnmax_log_output_law", "histograms", "pick_token",
           "renyi_divergence_of_log_laws", "votes_from_seeds"]


class VoteCoordination(enum.Enum):
    """How teachers vote: with one shared random vector per step (hot) or independently (cold)."""

    COORDINATED = "coordinated"
    INDEPENDENT = "independent"


def votes_from_seeds(teachers: torch.Tensor, seeds: Sequence[int], coordination: VoteCoordination) -> NDArray[np.int64]:
    """One vote per teacher per step, (L, N), from teachers (L, N, V) and one seed per step.

    Coordinated: one Exp(1) vector u per step, y_i = argmax_j log p_i[j] - log u_j (the exponential
    race with shared draws: each vote's marginal is p_i, Cohen et al. 2023). Independent: an Exp(1)
    per teacher and token, the same race run separately (exact categorical sampling).

    Args:
        teachers: (L, N, V) next-token distributions.
        seeds: one public vote seed per step (randomness.vote_seed).
        coordination: COORDINATED or INDEPENDENT.

    Returns:
        (L, N) int64 token ids.

    Raises:
        ValueError: if `teachers` is not (L, N, V) with one seed per step.
    """
    require(teachers.ndim == 3 and teachers.shape[0] == len(seeds),
            f"teachers must be (steps, N, V) with one seed per step, got {tuple(teachers.shape)} and {len(seeds)} seeds")
    rows, n, vocab = teachers.shape
    shape = (vocab,) if coordination is VoteCoordination.COORDINATED else (n, vocab)
    draws = torch.stack([torch.empty(shape, dtype=torch.float64).exponential_(generator=torch.Generator().manual_seed(s))
                         for s in seeds])
    if coordination is VoteCoordination.COORDINATED:
        draws = draws.unsqueeze(1)
    with torch.no_grad():  # a draw of exactly 0 would make -inf - (-inf) = NaN, which argmax takes as the maximum
        scores = torch.log(teachers.double().cpu()) - torch.log(draws.clamp_min(torch.finfo(torch.float64).tiny))
    return torch.argmax(scores, dim=-1).numpy()


def histograms(votes: NDArray[np.int64], vocabulary_size: int) -> NDArray[np.int64]:
    """Counts (L, V) int64 from votes (L, N).

    Args:
        votes: (L, N) token ids in [0, vocabulary_size).
        vocabulary_size: V.

    Returns:
        (L, V) int64 vote counts.
    """
    counts = np.zeros((votes.shape[0], vocabulary_size), dtype=np.int64)
    np.add.at(counts, (np.arange(votes.shape[0])[:, None], votes), 1)
    return counts


@dataclass(frozen=True)
class VotingMechanism(Mechanism):
    """One Hot PATE voting step (Cohen et al. 2023) over N teachers: coordinated or independent votes,
    then its aggregator (a VoteAggregator whose context holds N, the relation and the accounting).

    `rdp_values` is the worst case of one step (what released-output accounting charges); `charges`
    gives each component's per-step values for a block of histograms.
    """

    coordination: VoteCoordination
    aggregator: VoteAggregator

    def __post_init__(self) -> None:
        coordination = require_member(VoteCoordination, "votes", self.coordination)
        require(isinstance(self.aggregator, VoteAggregator),
                f"aggregator must be a VoteAggregator, got {type(self.aggregator).__name__}")
        require(self.aggregator.teachers is not None, "a voting mechanism's aggregator needs its number of teachers")
        set_validated(self, coordination=coordination)

    @classmethod
    def build(cls, votes: VoteCoordination | str, aggregator: str, teachers: int, *,
              relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE,
              accounting: PathAccounting | str = PathAccounting.RELEASED_OUTPUT, **parameters: Any) -> "VotingMechanism":
        """The mechanism of a [mechanism] table: `votes`, the aggregator's name and its parameters (None:
        not given); ValueError naming the constraint.

        Args:
            votes: "coordinated" or "independent" (or the member).
            aggregator: the aggregator's registered name.
            teachers: the number N of teachers.
            relation: the neighbouring relation its charges hold for.
            accounting: "released-output" or "realised-path" (or the member).
            **parameters: the aggregator's parameters (None: not given).

        Returns:
            The VotingMechanism.

        Raises:
            ValueError: for an unknown coordination, aggregator or accounting, or parameters the aggregator refuses.
        """
        coordination = require_member(VoteCoordination, "votes", votes)
        return cls(coordination, build_aggregator(aggregator, parameters, teachers=teachers, relation=relation,
                                                  accounting=path_accounting(accounting)))

    @property
    def teachers(self) -> int:
        teachers = self.aggregator.teachers
        if teachers is None:  # refused by __post_init__
            raise ValueError("a voting mechanism's aggregator needs its number of teachers")
        return teachers

    @property
    def relation(self) -> NeighbouringRelation:
        return self.aggregator.relation

    @property
    def accounting(self) -> PathAccounting:
        return self.aggregator.accounting

    def components(self) -> dict[str, bool]:
        """Charged component -> data-dependent.

        Returns:
            The aggregator's components.
        """
        return self.aggregator.components()

    def dp_event(self) -> DpEvent | None:
        """The dp-accounting event of one step as charged (dpledger.mechanisms.base.Mechanism.dp_event), or
        None where the aggregator has none.

        Returns:
            The aggregator's DpEvent, or None.
        """
        return self.aggregator.dp_event()

    def no_pld_reason(self) -> str | None:
        return self.aggregator.no_pld_reason()

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.aggregator.rdp_values(orders)

    # -- one block of steps -----------------------------------------------------------------------

    def histograms(self, teachers: torch.Tensor, seeds: Sequence[int]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """(votes (L, N), counts (L, V)) for teachers (L, N, V) and the steps' vote seeds.

        Args:
            teachers: (L, N, V) next-token distributions, N = teachers.
            seeds: one public vote seed per step.

        Returns:
            (votes (L, N), counts (L, V)), int64.

        Raises:
            ValueError: if the teacher axis does not hold N distributions, or there is not one seed per step.
        """
        require(teachers.shape[-2] == self.teachers,
                f"the mechanism is for {self.teachers} teachers, got distributions of {teachers.shape[-2]}")
        votes = votes_from_seeds(teachers, seeds, self.coordination)
        return votes, histograms(votes, teachers.shape[-1])

    def decide(self, counts: NDArray[np.int64], generator: torch.Generator) -> tuple[int | None, float, list[float]]:
        """The aggregator on one histogram: (released token or None, screen statistic, noise drawn).

        Args:
            counts: (V,) the vote histogram.
            generator: the step's torch generator.

        Returns:
            (released token or None, screen statistic, noise drawn), as VoteAggregator.decide.
        """
        return self.aggregator.decide(counts, generator)

    def charges(self, counts: NDArray[np.int64], passed: NDArray[np.bool_],
                orders: NDArray[np.float64]) -> dict[str, NDArray[np.float64]]:
        """Each component's RDP (L, K) for histograms (L, V) whose screens passed as `passed` (L,).

        Args:
            counts: (L, V) vote histograms.
            passed: (L,) whether each step's screen passed.
            orders: (K,) Renyi orders.

        Returns:
            Component name -> (L, K) float64 charges.
        """
        return self.aggregator.charges(counts, passed, orders)

    def log_output_law(self, counts: npt.ArrayLike) -> tuple[float, NDArray[np.float64], float]:
        """(log Pr[fail], log Pr[release j] for every j, relative numerical error) on one histogram, for the
        aggregators with an exact law (VoteAggregator.exact_law); ValueError for the others.

        Args:
            counts: (V,) the vote histogram.

        Returns:
            (log Pr[fail], (V,) log Pr[release j], relative numerical error).
        """
        return self.aggregator.log_output_law(counts)


def renyi_divergence_of_log_laws(log_p: npt.ArrayLike, log_q: npt.ArrayLike,
                                 orders: npt.ArrayLike) -> NDArray[np.float64]:
    """D_a(p || q) at every order for two laws on the same finite outcomes, given as log
    probabilities (-inf for none) (van Erven & Harremoes 2014, Definition 2): +inf where p puts mass
    outside q's support; rounding below 0 is reported as 0.

    Args:
        log_p: (M,) log probabilities of p.
        log_q: (M,) log probabilities of q, on the same outcomes.
        orders: (K,) Renyi orders > 1.

    Returns:
        (K,) D_a(p || q) >= 0 at each order (+inf everywhere where p is not absolutely continuous w.r.t. q).
    """
    lp, lq = np.asarray(log_p, dtype=np.float64), np.asarray(log_q, dtype=np.float64)
    grid = np.asarray(orders, dtype=np.float64)
    support = lp > -np.inf
    if np.any(support & (lq == -np.inf)):
        return np.full(grid.shape, np.inf)
    values = logsumexp(grid[:, None] * lp[support][None, :] + (1.0 - grid[:, None]) * lq[support][None, :], axis=1)
    divergence: NDArray[np.float64] = np.maximum(values / (grid - 1.0), 0.0)
    return divergence
