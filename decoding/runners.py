"""Mechanisms applied to a block of queries at once (vectorised over positions and teachers).

A runner turns the public and teacher distributions of L queries into the output distribution the
mechanism samples from, the per-step RDP components it charges, and everything the audit needs
to check it (mixing weights, screening statistic and decision, the data-independent bound, and the
data-dependent loss where it is charged). A runner computes nothing it does not charge: what only
the audit needs (Eq. 3 beside a Theorem 3.1 charge) the audit computes from the replay payload.
Runners are built from a config's [mechanism] table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, TypeAlias

import numpy as np
import numpy.typing as npt
import torch
import inspect

from dpledger.accounting.errors import require
from dpledger.accounting.relation import NeighbouringRelation, PathAccounting, neighbouring_relation, path_accounting
from dpledger.decoding.mechanism_types import MECHANISM_TYPES, unknown_type_message
from dpledger.decoding.trace import RECORDS_VERSION
from dpledger.mechanisms.adapmixed import AdaPMixED
from dpledger.mechanisms.ball import Ball, ball_named
from dpledger.mechanisms.pmixed import PMixED, SubsampledPMixED, SubsamplingVariant
from dpledger.mechanisms.pmixed import subsampling_variant as variant_named
from dpledger.mechanisms.aggregation import VoteAggregator
from dpledger.mechanisms.randomness import StepGenerators, uniform
from dpledger.mechanisms.screening import NoisyScreening
from dpledger.mechanisms.kernels import ADD_ONE_VERSION, SCREEN_VERSION, SOLVER_VERSION
from dpledger.mechanisms.step import adapmixed_step, pmixed_step
from dpledger.mechanisms.aggregators import aggregator_class, aggregators
from dpledger.mechanisms.voting import VotingMechanism, histograms

Randomness: TypeAlias = torch.Generator | StepGenerators
"""What a runner's `process` draws from: one generator for the block, or one per step (StepGenerators,
what decoding uses: a resumed run and a replayed window then draw exactly what the run drew); voting
needs the per-step generators."""
Bounds: TypeAlias = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]


@dataclass
class BlockOutcome:
    """What a mechanism did on L queries; every array has L rows."""

    output: torch.Tensor                       # (L, V) distribution sampled from
    charged: dict[str, np.ndarray]             # component -> (L, K) RDP charged at each step
    lambdas: np.ndarray | None = None          # (L, N)
    sampled: np.ndarray | None = None          # (L, N) bool, Poisson-sampled teachers
    screen_statistic: np.ndarray | None = None  # (L,)
    screen_passed: np.ndarray | None = None     # (L,) bool
    # the data-dependent losses, only where a data-dependent component charges them (None otherwise)
    observed_data_dependent: np.ndarray | None = None  # (L, K) the data-dependent loss covering the run's relation
    data_independent: np.ndarray | None = None          # (L, K) Theorem 3.1 where it applies
    eq3_remove_one: np.ndarray | None = None            # (L, K) Eq. 3, max_i D<->(p, p_-i): its remove-one part
    add_one_bound: np.ndarray | None = None             # (L, K) bound for an added teacher
    # not recorded: Eq. 3's rounding allowance (leave_one_out.eq3_allowance_of), which the replay compares within
    eq3_allowance: np.ndarray | None = None             # (L, K)
    vote_seeds: np.ndarray | None = None       # (L,) voting: each step's shared-randomness seed
    vote_counts: np.ndarray | None = None      # (L, V) voting: the vote histogram
    aggregator_noise: list | None = None       # L lists: the draws the aggregator consumed
    budget_refused: np.ndarray | None = None   # (L,) bool: the run's privacy filter answered publicly
    budget_charge: np.ndarray | None = None    # (L,) what each step spent of the filter's budget


@dataclass(frozen=True)
class Runner:
    """A named mechanism: `components` it charges (with their data-dependence) and `process`."""

    kind: str
    params: dict
    components: dict[str, bool]  # name -> data_dependent
    process: Callable[[torch.Tensor, torch.Tensor, Randomness, npt.NDArray[np.float64]], BlockOutcome] = field(repr=False)
    relations: dict[str, NeighbouringRelation] = field(default_factory=dict)
    """name -> the neighbouring relation its charges hold for (add-or-remove-one when absent)."""
    step_bound: Bounds | None = field(default=None, repr=False)
    """orders -> a data-independent upper bound on everything one step charges (+inf where there is
    none): what a privacy filter charges a step by default (dpledger.accounting.budget.RenyiFilter)."""
    realised_path_bounds: Callable[[npt.NDArray[np.float64]], tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] \
        | None = field(default=None, repr=False)
    """orders -> (the screen's data-independent bound, the answer's), for realised-path runs whose
    screen decision is released before the answer is charged: a privacy filter then charges the
    screen at every step and the answer only where the screen passed (dpledger.decoding.budget)."""
    process_votes: Callable[[torch.Tensor, npt.NDArray[np.int64], Randomness, npt.NDArray[np.float64]], BlockOutcome] \
        | None = field(default=None, repr=False)
    """Voting runners: `process` from the public distributions (L, V) and the teachers' votes (L, N)
    instead of their distributions, what a bounded vote payload replays (dpledger.decoding.vote_payload)."""

    def relation_of(self, name: str) -> NeighbouringRelation:
        """The neighbouring relation component `name`'s charges hold for.

        Args:
            name: one of the runner's components.

        Returns:
            Its relation in `relations`, add-or-remove-one when it has none there.
        """
        return self.relations.get(name, NeighbouringRelation.ADD_OR_REMOVE_ONE)


def _public_only(public: torch.Tensor, teachers: torch.Tensor, generator: Randomness,
                 orders: npt.NDArray[np.float64]) -> BlockOutcome:
    zeros = np.zeros((public.shape[0], orders.size))
    return BlockOutcome(output=public, charged={"public_only": zeros})


def _ensemble(public: torch.Tensor, teachers: torch.Tensor, generator: Randomness,
              orders: npt.NDArray[np.float64]) -> BlockOutcome:
    infinite = np.full((public.shape[0], orders.size), np.inf)  # no privacy guarantee at all
    return BlockOutcome(output=teachers.mean(dim=-2), charged={"non_private_ensemble": infinite})


def _pmixed_step(pmixed: PMixED, public: torch.Tensor, teachers: torch.Tensor, orders: npt.NDArray[np.float64],
                 mask: torch.Tensor | None = None, solver_version: int = SOLVER_VERSION) -> tuple[torch.Tensor, torch.Tensor]:
    """PMixED's step (dpledger.mechanisms.step.pmixed_step): its mixing weights and output. Nothing
    it does not charge: the audit's theorem_3_1 check computes Eq. 3 itself from the replay payload."""
    result = pmixed_step(pmixed, teachers, public, orders, mask, solver_version)
    return result.lambdas, result.output


def pmixed_runner(alpha: float, beta: float, teachers: int, sample_rate: float | None = None,
                  subsampling_variant: str | None = None, ball: str = Ball.PROJECTION_ORDER.value,
                  relation: NeighbouringRelation | str = NeighbouringRelation.ADD_OR_REMOVE_ONE,
                  solver_version: int = SOLVER_VERSION) -> Runner:
    """PMixED (Flemings et al. 2024, Algorithm 2): charges Theorem 3.1 (as claimed for the paper's
    ball, proven for ball="proof-orders" and "all-orders"), or a named subsampling variant. Theorem 3.1 is
    data-independent, so it covers adding and removing a teacher alike (any claimed relation).

    Args:
        alpha: PMixED's target Renyi order (> 1).
        beta: the mixing weight's bound parameter (> 0; the paper's beta).
        teachers: the number of teachers N (>= 1).
        sample_rate: the Poisson subsampling rate q in [0, 1] of each step's teachers; None: every teacher.
        subsampling_variant: how a subsampled step is charged (dpledger.mechanisms.pmixed.SubsamplingVariant's
            value); None: the proven default for the ball. Needs `sample_rate`.
        ball: the projection's ball (dpledger.mechanisms.ball.Ball's value).
        relation: the run's claimed neighbouring relation (replace-one is not covered).
        solver_version: whose mixing-weight solver arithmetic to follow; not a config key: it follows
            the code that wrote a trace (its records_version; build_runner).

    Returns:
        The runner: kind "pmixed", its recorded parameters, one data-independent component, its
        step bound, and `process`.

    Raises:
        ValueError: if a parameter is out of range or unknown, the relation is replace-one, or
            `subsampling_variant` is given without `sample_rate`.
    """
    ball_kind = ball_named(ball)
    relation = neighbouring_relation(relation)
    require(relation is not NeighbouringRelation.REPLACE_ONE,
            "PMixED's bounds are for adding or removing a teacher; relation replace_one is not covered")
    pmixed = PMixED(alpha, beta, teachers, ball=ball_kind)
    ball_params = {} if ball_kind is Ball.PROJECTION_ORDER else {"ball": ball_kind.value}
    if sample_rate is None:
        require(subsampling_variant is None, "subsampling_variant needs sample_rate")
        name = "pmixed_theorem_3_1"

        def process(public: torch.Tensor, teacher_probs: torch.Tensor, generator: Randomness,
                    orders: npt.NDArray[np.float64]) -> BlockOutcome:
            lambdas, output = _pmixed_step(pmixed, public, teacher_probs, orders, solver_version=solver_version)
            bound = np.broadcast_to(pmixed.rdp_values(orders), (public.shape[0], orders.size)).copy()
            return BlockOutcome(output=output, charged={name: bound}, lambdas=lambdas.numpy(), data_independent=bound)

        return Runner("pmixed", dict(alpha=alpha, beta=beta, teachers=teachers, **ball_params), {name: False}, process,
                      step_bound=pmixed.rdp_values)

    if subsampling_variant is None:
        subsampling_variant = (SubsamplingVariant.ALL_ORDERS_BALL if ball_kind is Ball.ALL_ORDERS
                               else SubsamplingVariant.WORST_CASE_SIZE_GENERAL).value
    variant = variant_named(subsampling_variant)
    # validates the parameters (a size of round(qN) is possible for every q, including 0 and 1)
    SubsampledPMixED(pmixed, sample_rate, variant, round(sample_rate * teachers) if variant.uses_realised_sizes else None)
    name = f"pmixed_subsampled_{variant.value}"

    def subsampled_process(public: torch.Tensor, teacher_probs: torch.Tensor, generator: Randomness,
                           orders: npt.NDArray[np.float64]) -> BlockOutcome:
        mask = uniform(teacher_probs.shape[:-1], generator) < sample_rate
        lambdas, output = _pmixed_step(pmixed, public, teacher_probs, orders, mask, solver_version)
        sizes = mask.sum(dim=-1).numpy()
        unique, index = np.unique(sizes, return_inverse=True)  # curves depend on the subsample size only
        charged = np.stack([SubsampledPMixED(pmixed, sample_rate, variant,
                                             int(m) if variant.uses_realised_sizes else None).rdp_values(orders)
                            for m in unique])[index]
        bound = np.stack([PMixED(alpha, beta, max(int(m), 1), ball=ball_kind).rdp_values(orders) for m in unique])[index]
        return BlockOutcome(output=output, charged={name: charged}, lambdas=lambdas.numpy(), sampled=mask.numpy(),
                            data_independent=bound)

    def step_bound(orders: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The variant's charge, at its largest over the subsample sizes it may be charged at."""
        sizes = range(teachers + 1) if variant.uses_realised_sizes else (None,)
        return np.max([SubsampledPMixED(pmixed, sample_rate, variant, m).rdp_values(orders) for m in sizes], axis=0)

    return Runner("pmixed", dict(alpha=alpha, beta=beta, teachers=teachers, sample_rate=sample_rate,
                                 subsampling_variant=variant.value, **ball_params), {name: False}, subsampled_process,
                  step_bound=step_bound)


def adapmixed_runner(alpha: float, beta: float, teachers: int, lam: float, sigma: float, threshold: float,
                     top_k: int, screening: bool = True, data_dependent: bool = True,
                     accounting: str = "released-output", ball: str = Ball.PROJECTION_ORDER.value,
                     relation: NeighbouringRelation | str = NeighbouringRelation.ADD_OR_REMOVE_ONE,
                     add_one_dual: bool = False, add_one_version: int = ADD_ONE_VERSION,
                     solver_version: int = SOLVER_VERSION, screen_version: int = SCREEN_VERSION) -> Runner:
    """AdaPMixED (Flemings et al. 2024, Algorithm 1) and its Table 2a ablations.

    screening=True, data_dependent=True: AdaPMixED (screen, then PMixED charged data-dependently);
    screening=True, data_dependent=False: PMixED with noisy screening (screen + Theorem 3.1);
    screening=False, data_dependent=True: AdaPMixED with only data-dependence (Eq. 3 every step).

    The data-dependent charge covers the neighbours of `relation`, the run's claim: remove-one is
    ibid. Eq. 3; add-one the add-one bound (dpledger.mechanisms.add_one.add_one_divergence_bounds);
    add-or-remove-one the larger of the two at each order. add_one_dual=True tightens the add-one
    bound by the certified Lagrangian dual (dpledger.mechanisms.add_one; per step it costs about 500 times
    the whole data-dependent step at V = 1024 and minutes a step at V = 50257:
    benchmarks/results/add_one_dual_cost.json); the manifest's params record it ("add_one_dual":
    true, absent otherwise) and the audit recomputes the bound the same way.

    What a screened step releases is the pair (b, y): the decision b (pass or fail, with
    Pr[pass] = pi under D and pi' under a neighbour D') and the token y, drawn from PMixED's p when b
    passes and from p0 when it fails. Its Renyi divergence is exactly
      exp((a-1) D_a) = pi^a pi'^(1-a) exp((a-1) D_a(p || p')) + (1-pi)^a (1-pi')^(1-a)       (*)
    (the chain rule for a pair; the fail branch answers p0 on both sides, divergence 0), so
      D_a <= D_a(b || b') + max(D_a(p || p'), 0) <= eps_screen(a) + eps_t(a)
    (adaptive composition, Mironov 2017, Proposition 1: a maximum over the branch, not the branch
    taken). accounting="released-output" (the default) charges exactly that at every step, the
    screen passed or not: a bound on the released output's law, which composes over the run.
    accounting="realised-path" is the paper's Theorem 4.2 as stated: eps_screen + 1{passed} eps_t,
    the decision's divergence plus the token's divergence given the decision that was released. It
    does not bound (*): with lam = 0 the screen reads no teacher (pi = pi' for every neighbour,
    eps_screen = 0) and, if it fails, the step is charged 0, while (*) is
    log(1 - pi + pi exp((a-1) D_a(p || p'))) / (a-1) > 0 whenever pi > 0 and p != p'
    (tests/test_realised_path.py). What it does bound is an odometer: along the run,
    exp((a-1) (L - C)) is a supermartingale, L the realised privacy loss and C the realised charge
    (Feldman & Zrnic 2021; Whitehouse et al. 2023), so Pr[L > C(a) + log(1/delta) / (a-1)] <= delta at
    an order a fixed in advance (log(K/delta) when the order is chosen afterwards among K): an
    ex-post statement about this run's loss, not an RDP guarantee of the mechanism. Inside a privacy
    filter the same charges give a guarantee (dpledger.decoding.budget, fully adaptive composition). The audit
    measures both quantities (dpledger.audit.ablation) and the report labels a realised-path total as such.

    Args:
        alpha: PMixED's target Renyi order (> 1).
        beta: the mixing weight's bound parameter (> 0).
        teachers: the number of teachers N (>= 1).
        lam: the screen's weight on the teachers' statistic (the paper's lambda, >= 0).
        sigma: the screen's Gaussian noise scale (> 0).
        threshold: the screen's threshold.
        top_k: how many of the public model's likeliest tokens the screen reads.
        screening: screen each step (a failed screen answers with the public model).
        data_dependent: charge the answer data-dependently (Eq. 3 and the add-one bound) rather
            than by Theorem 3.1.
        accounting: "released-output" or "realised-path" (see above).
        ball: the projection's ball (dpledger.mechanisms.ball.Ball's value).
        relation: the run's claimed neighbouring relation (replace-one is not covered).
        add_one_dual: tighten the add-one bound by the certified Lagrangian dual.
        add_one_version: whose add-one bound arithmetic to follow (the sub-grid from 4, the weighted chord
            sum from 7); not a config key: it follows the code that wrote a trace (build_runner).
        solver_version: whose mixing-weight solver arithmetic to follow; not a config key either (the
            trace's records_version).
        screen_version: whose screening-statistic arithmetic to follow (one compiled pass from 10); not a
            config key either.

    Returns:
        The runner: kind "adapmixed", its recorded parameters, its components ("screen" when
        screening, and the answer's), their relations, the data-independent step bound, and the
        realised-path bounds for a screened, data-dependent, realised-path run (None otherwise).

    Raises:
        ValueError: if neither screening nor data_dependent is set, add_one_dual is not a bool,
            accounting, ball or relation is unknown, the relation is replace-one, a parameter is out
            of range, or sigma makes the screening charge overflow to +inf.
    """
    require(screening or data_dependent, "at least one of screening / data_dependent must be enabled "
                                         "(with neither, use type = \"pmixed\")")
    require(isinstance(add_one_dual, bool), f"add_one_dual must be true or false, got {add_one_dual!r}")
    accounting = path_accounting(accounting).value   # how a screened step is charged (the analysis below)
    relation = neighbouring_relation(relation)
    require(relation is not NeighbouringRelation.REPLACE_ONE,
            "AdaPMixED's bounds are for adding or removing a teacher; relation replace_one is not covered")
    ball_kind = ball_named(ball)
    pmixed = PMixED(alpha, beta, teachers, ball=ball_kind)
    screen = NoisyScreening(teachers=teachers, lam=lam, sigma=sigma, alpha=alpha, threshold=threshold, top_k=top_k)
    if screening:
        with np.errstate(over="ignore"):
            finite = bool(np.all(np.isfinite(screen.rdp_values(np.asarray([alpha, 256.0])))))
        require(finite, f"mechanism.sigma = {sigma!r} makes the screening charge (lam / (N sigma))^2 * order overflow "
                        "to +inf: the run would have no privacy guarantee; choose a larger sigma")
    mechanism = AdaPMixED(pmixed, screen)
    decode_name = "pmixed_data_dependent" if data_dependent else "pmixed_theorem_3_1"
    components = ({"screen": False} if screening else {}) | {decode_name: data_dependent}
    relations = {decode_name: relation if data_dependent else NeighbouringRelation.ADD_OR_REMOVE_ONE}

    def process(public: torch.Tensor, teacher_probs: torch.Tensor, generator: Randomness,
                orders: npt.NDArray[np.float64]) -> BlockOutcome:
        result = adapmixed_step(mechanism, teacher_probs, public, generator if screening else None, orders, relation,
                                accounting, screening, data_dependent, add_one_dual, add_one_version, solver_version,
                                screen_version)
        # what was charged: the loss covering the relation, Eq. 3 its remove-one part; a run charged by
        # Theorem 3.1 records neither (the audit's theorem_3_1 check computes Eq. 3 from the payload)
        observed = result.data_dependent if data_dependent else None
        eq3 = result.details["eq3_remove_one"] if data_dependent else None
        return BlockOutcome(output=result.output, charged=result.charged, lambdas=result.lambdas.numpy(),
                            screen_statistic=result.screen_statistic if screening else None,
                            screen_passed=result.screen_passed, observed_data_dependent=observed,
                            data_independent=result.details["data_independent"], eq3_remove_one=eq3,
                            add_one_bound=result.add_one_bound,
                            eq3_allowance=result.details["eq3_allowance"] if data_dependent else None)

    params = dict(alpha=alpha, beta=beta, teachers=teachers, lam=lam, sigma=sigma, threshold=threshold, top_k=top_k,
                  screening=screening, data_dependent=data_dependent, accounting=accounting)
    if ball_kind is not Ball.PROJECTION_ORDER:
        params["ball"] = ball_kind.value
    if add_one_dual:   # absent when false: manifests of runs without it are unchanged
        params["add_one_dual"] = True

    def step_bound(orders: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The screen's charge plus Theorem 3.1 for the answer (Flemings et al. 2024, Theorem 4.2 with
        the data-independent PMixED bound): a data-independent bound on one step's released output
        (as claimed for the paper's ball, proven for the proof-orders and all-orders balls). The data-dependent charge
        (Eq. 3, and the add-one bound for add-or-remove-one) is a separate, data-dependent measurement
        and can exceed it: the add-one bound is loose."""
        return (screen.rdp_values(orders) if screening else 0.0) + pmixed.rdp_values(orders)

    def realised_path_bounds(orders: npt.NDArray[np.float64]
                             ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """The screen's charge (every step) and Theorem 3.1 for the answer (passed steps only)."""
        return screen.rdp_values(orders), pmixed.rdp_values(orders)

    return Runner("adapmixed", params, components, process, relations, step_bound,
                  realised_path_bounds if screening and data_dependent and accounting == "realised-path" else None)


def voting_runner(teachers: int, votes: str, aggregator: str, accounting: str = PathAccounting.RELEASED_OUTPUT.value,
                  relation: NeighbouringRelation | str = NeighbouringRelation.ADD_OR_REMOVE_ONE,
                  **parameters: object) -> Runner:
    """Hot PATE voting (Cohen et al. 2023): `votes` coordinated (hot) or independent (cold), aggregated by
    the registered aggregator `aggregator` with its `parameters` (dpledger.mechanisms.aggregators: targmax,
    tws, dpargmax = Confident-GNMax, dpws, ...); on fail the public model answers. The output distribution
    of a step is a point mass on the released token, or the public distribution on fail. What each
    aggregator is charged is its class's docstring. Every bound covers one vote moved, added or removed,
    so any claimed relation is covered.

    Args:
        teachers: the number of teachers N (>= 1).
        votes: "hot" (coordinated) or "cold" (independent) votes.
        aggregator: a registered aggregator's name.
        accounting: "released-output" or "realised-path" (the latter for aggregators that support it).
        relation: the run's claimed neighbouring relation.
        **parameters: the aggregator's parameters (its registered fields: threshold, sigma, ...).

    Returns:
        The runner: kind "voting", its recorded parameters, the aggregator's components (each for
        `relation`), its data-independent step bound, and the realised-path bounds under
        realised-path accounting.

    Raises:
        ValueError: if the votes, aggregator, accounting or relation is unknown, or a parameter is
            missing or invalid (VotingMechanism.build).
    """
    relation = neighbouring_relation(relation)
    mechanism = VotingMechanism.build(votes, aggregator, teachers, relation=relation, accounting=accounting,
                                      **parameters)

    def process(public: torch.Tensor, teacher_probs: torch.Tensor, generator: Randomness,
                orders: npt.NDArray[np.float64]) -> BlockOutcome:
        if not isinstance(generator, StepGenerators):
            raise ValueError("voting needs per-step generators (dpledger.mechanisms.randomness.StepGenerators)")
        votes, _ = mechanism.histograms(teacher_probs, generator.vote_seeds())
        return process_votes(public, votes, generator, orders)

    def process_votes(public: torch.Tensor, votes: npt.NDArray[np.int64], generator: Randomness,
                      orders: npt.NDArray[np.float64]) -> BlockOutcome:
        if not isinstance(generator, StepGenerators):
            raise ValueError("voting needs per-step generators (dpledger.mechanisms.randomness.StepGenerators)")
        seeds = generator.vote_seeds()
        counts = histograms(votes, public.shape[-1])
        decisions = [mechanism.decide(row, g) for row, g in zip(counts, generator.generators)]
        passed = np.asarray([token is not None for token, _, _ in decisions], dtype=bool)
        output = public.clone()
        for row, (token, _, _) in enumerate(decisions):
            if token is not None:
                output[row] = 0.0
                output[row, token] = 1.0
        return BlockOutcome(output=output, charged=mechanism.charges(counts, passed, orders),
                            screen_statistic=np.asarray([statistic for _, statistic, _ in decisions]),
                            screen_passed=passed, vote_seeds=np.asarray(seeds, dtype=np.int64), vote_counts=counts,
                            aggregator_noise=[noise for _, _, noise in decisions])

    rule = mechanism.aggregator
    params = dict(votes=mechanism.coordination.value, aggregator=rule.name, teachers=teachers,
                  **type(rule).recorded_parameters(parameters), accounting=mechanism.accounting.value)
    components = mechanism.components()
    realised = _realised_path_bounds(rule) if mechanism.accounting is PathAccounting.REALISED_PATH else None
    return Runner("voting", params, components, process, {name: relation for name in components},
                  mechanism.rdp_values, realised, process_votes)


def _realised_path_bounds(rule: VoteAggregator) -> Callable[[npt.NDArray[np.float64]],
                                                             tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]:
    """The aggregator's realised-path bounds, for an aggregator under realised-path accounting (which
    VoteAggregator accepts only where it supports it, so the bounds exist)."""
    def bounds(orders: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        found = rule.realised_path_bounds(orders)
        if found is None:
            raise ValueError(f"aggregator {rule.name} has no realised-path bounds")
        return found
    return bounds


VOTING_KEYS = {"votes": str, "aggregator": str, "accounting": str}
"""The [mechanism] keys of type = "voting" besides the aggregator's own parameters."""


def voting_mechanism(params: dict, teachers: int, relation: NeighbouringRelation | str) -> VotingMechanism:
    """The VotingMechanism of a voting run's recorded [mechanism] parameters.

    Args:
        params: the manifest's mechanism parameters of a voting run (votes, aggregator, accounting,
            teachers and the aggregator's own).
        teachers: the number of teachers N.
        relation: the run's claimed neighbouring relation.

    Returns:
        The mechanism those parameters build.

    Raises:
        KeyError: if params lacks votes, aggregator or accounting.
        ValueError: if a parameter is unknown or invalid (VotingMechanism.build).
    """
    parameters = {key: value for key, value in params.items() if key not in VOTING_KEYS and key != "teachers"}
    return VotingMechanism.build(params["votes"], params["aggregator"], teachers,
                                 relation=neighbouring_relation(relation), accounting=params["accounting"], **parameters)


def _voting_parameter_types() -> dict[str, str]:
    """Every key a voting [mechanism] may hold -> its type as an annotation (None: not given): the voting
    keys, every registered aggregator's parameters and the keys a recorded table keeps unused."""
    types = {name: kind.__name__ for name, kind in VOTING_KEYS.items()}
    for cls in aggregators().values():
        for name, spec in cls.parameter_fields("decode").items():
            types.setdefault(name, f"{spec.metadata['type'].__name__} | None")
        for name, value in cls.unused_defaults.items():
            types.setdefault(name, f"{type(value).__name__} | None")
    return types


def _needed_by_every_aggregator() -> list[str]:
    """The parameters every registered aggregator needs in a decode (in the first one's order)."""
    required = [cls.required_parameters("decode") for cls in aggregators().values()]
    return [name for name in required[0] if all(name in other for other in required[1:])] if required else []


def runner_parameters(kind: str) -> set[str]:
    """The [mechanism] keys of `kind` besides `type` and `teachers` (docs/config.md documents each).

    Args:
        kind: "pmixed", "adapmixed" or "voting".

    Returns:
        The key names: the runner's parameters, or for voting the voting keys, every registered
        aggregator's parameters and the keys a recorded table keeps unused.

    Raises:
        KeyError: if `kind` is another type.
    """
    if kind == "voting":
        return set(_voting_parameter_types())
    return set(inspect.signature(_PARAMETERISED[kind]).parameters) - {"teachers", "relation"} - _CODE_VERSION_OPTIONS


_CODE_VERSION_OPTIONS = frozenset({"add_one_version", "solver_version", "screen_version"})
"""Runner arguments that follow the version of the code that wrote a trace, never a config key: build_runner
sets them from the trace's records_version."""


_BUILDERS = {
    "public": lambda teachers: Runner("public", {}, {"public_only": False}, _public_only,
                                      step_bound=lambda orders: np.zeros_like(orders, dtype=np.float64)),
    "ensemble": lambda teachers: Runner("ensemble", {"teachers": teachers}, {"non_private_ensemble": False}, _ensemble,
                                        step_bound=lambda orders: np.full_like(orders, np.inf, dtype=np.float64)),
}
_PARAMETERISED: dict[str, Callable[..., Runner]] = {"pmixed": pmixed_runner, "adapmixed": adapmixed_runner,
                                                     "voting": voting_runner}


def _check_parameter(kind: str, name: str, value: object, annotation: str) -> None:
    """A [mechanism] value has its parameter's type, without coercion ("0.2" is not a number, 1 is
    not true); None is accepted where the parameter is optional."""
    if value is None and "None" in annotation:
        return
    base = annotation.split("|")[0].strip()
    if base == "bool":
        ok = isinstance(value, bool)
    elif base == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:  # str, or an enum given by its value
        ok = isinstance(value, str)
    names = {"bool": "true or false", "int": "an integer", "float": "a number"}
    require(ok, f"mechanism.{name} ({kind}) must be {names.get(base, 'a string')}, got {value!r}")


def build_runner(mechanism: dict, teachers: int,
                 relation: NeighbouringRelation | str = NeighbouringRelation.ADD_OR_REMOVE_ONE,
                 records_version: int = RECORDS_VERSION) -> Runner:
    """A runner from a config's [mechanism] table: `type` plus that mechanism's parameters;
    `relation` is the run's claimed neighbouring relation (the [run] table's `relation`).

    Args:
        mechanism: the [mechanism] table: `type` and the mechanism's parameters (an optional
            `teachers` must equal `teachers`).
        teachers: the number of teacher models the run loads.
        relation: the run's claimed neighbouring relation.
        records_version: the version of the code whose arithmetic to follow (a trace's manifest
            records it; 1 when absent): before 4 the add-one bound was charged at every order, before
            6 the mixing weights were solved by Newton points only.

    Returns:
        The runner (pmixed_runner, adapmixed_runner, voting_runner, or the public or ensemble baseline).

    Raises:
        ValueError: if the table has no type or an unknown one, non-string keys, a teachers count
            other than `teachers`, unknown or missing parameters, a value of the wrong type, or a
            value the mechanism refuses.
    """
    require(isinstance(mechanism, dict) and "type" in mechanism, "the [mechanism] table needs a `type`")
    require(all(isinstance(key, str) for key in mechanism), f"[mechanism] keys must be strings, got {list(mechanism)!r}")
    params = {k: v for k, v in mechanism.items() if k != "type"}
    kind = mechanism["type"]
    require(kind in MECHANISM_TYPES, unknown_type_message(kind))
    if "teachers" in params:
        require(params.pop("teachers") == teachers,
                f"mechanism.teachers = {mechanism['teachers']} does not match the {teachers} teacher models given")
    if kind in _BUILDERS:
        require(not params, f"mechanism {kind!r} takes no parameters, got {sorted(params)}")
        neighbouring_relation(relation)
        return _BUILDERS[kind](teachers)

    accepted = runner_parameters(kind)
    unknown = sorted(set(params) - accepted)
    require(not unknown, f"unknown parameters for mechanism {kind!r}: {unknown}; accepted: {sorted(accepted)} "
                         "(the claimed neighbouring relation is [run] relation)")
    signature = inspect.signature(_PARAMETERISED[kind])
    missing = [name for name, parameter in signature.parameters.items()
               if parameter.default is inspect.Parameter.empty and name not in params and name not in ("teachers",
                                                                                                        "relation")
               and parameter.kind is not inspect.Parameter.VAR_KEYWORD]
    if kind == "voting" and missing:   # with the aggregator unknown, the keys every aggregator needs, named too
        missing += [name for name in _needed_by_every_aggregator() if name not in params]
    require(not missing, f"mechanism {kind!r} needs {', '.join(missing)} in the [mechanism] table "
                         f"(missing: {', '.join(missing)})")
    annotations = _voting_parameter_types() if kind == "voting" else {
        name: str(parameter.annotation) for name, parameter in signature.parameters.items()}
    for name, value in params.items():
        _check_parameter(kind, name, value, annotations[name])
    if kind == "voting":
        aggregator_class(params["aggregator"])   # an unknown name: the registry's one line
    if kind == "adapmixed":
        params = {**params, "add_one_version": min(records_version, ADD_ONE_VERSION),
                  "screen_version": min(records_version, SCREEN_VERSION)}
    if kind in ("pmixed", "adapmixed"):
        params = {**params, "solver_version": min(records_version, SOLVER_VERSION)}
    try:
        return _PARAMETERISED[kind](teachers=teachers, relation=relation, **params)
    except TypeError as error:
        raise ValueError(f"mechanism {kind!r}: {error}") from None
