"""PMixED's charged bound covers every neighbour of its relation at every ensemble size, N = 1 included.

For N = 1, 2, 3 teachers, every relation PMixED accepts (add-or-remove-one, remove-one, add-one),
both balls and the sound subsampling variants, the one-query output laws of the actual ensemble
and of each neighbour are formed exactly in mpmath from the package's mixing weights (removing the
only teacher leaves the public model; an added teacher is projected like any other):
- their Renyi divergences, both directions, stay within the mechanism's curve at every order where
  it is finite (an exact worst case over generated ensembles and an optimised adversary);
- their exact privacy profile (hockey-stick divergence sum_j max(0, P_j - e^eps Q_j), both
  directions) at the epsilon dpledger prints for delta stays at or below that delta.
The paper's one-order ball is "as claimed" (Theorem 3.1 needs the ball at every order), and a
two-token LM-like ensemble exceeds it by 22% at order alpha (kept here as evidence); the generated
coverage check runs on the proven balls (proof-orders, all-orders) on every family, and the
optimised and subsampled checks keep fixed seeds for the one-order ball.
Replace-one has no PMixED bound and is refused.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import zlib

import mpmath
import numpy as np
import pytest

from dpledger.accounting.conversion import epsilon_from_rdp
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.mechanisms.pmixed import Ball, PMixED, SubsampledPMixED, SubsamplingVariant, beta_from_budget
from tests.oracles import renyi_divergence, theorem_3_1_epsilon as oracle_theorem_3_1

DPS = 50
RELATIONS = (NeighbouringRelation.ADD_OR_REMOVE_ONE, NeighbouringRelation.REMOVE_ONE, NeighbouringRelation.ADD_ONE)
ORDERS = np.array([1.25, 2.0, 3.0, 6.0, 10.0, 64.0])
ALPHA = 6.0
SLACK = 1e-12  # float64 curve vs 50-digit oracle: the check may only fail because of it, never pass


def _law(values) -> list:
    values = [mpmath.mpf(float(v)) for v in values]
    total = mpmath.fsum(values)
    return [v / total for v in values]


def _mixed(lam, teacher, public) -> list:
    lam = mpmath.mpf(float(lam))
    return [lam * t + (1 - lam) * p for t, p in zip(teacher, public)]


def _mean(laws) -> list:
    return [mpmath.fsum(column) / len(laws) for column in zip(*laws)]


def _neighbour_pairs(mixed: list, public: list, added: list, relation: NeighbouringRelation):
    """(actual output, neighbour output) for every neighbour `relation` holds: each teacher removed
    (the public model when none is left) and the projected teacher `added` added."""
    actual = _mean(mixed)
    pairs = []
    if "remove" in relation.moves:
        for i in range(len(mixed)):
            rest = mixed[:i] + mixed[i + 1:]
            pairs.append((actual, _mean(rest) if rest else public))
    if "add" in relation.moves:
        pairs.append((actual, _mean(mixed + [added])))
    return pairs


def _hockey_stick(p: list, q: list, epsilon) -> mpmath.mpf:
    """sum_j max(0, P_j - e^eps Q_j): the smallest delta at eps for the ordered pair (P, Q)."""
    factor = mpmath.exp(mpmath.mpf(epsilon))
    return mpmath.fsum(max(mpmath.mpf(0), pj - factor * qj) for pj, qj in zip(p, q))


def _softmax(rng, vocab, scale):
    logits = rng.normal(0.0, scale, vocab)
    law = np.exp(logits - logits.max())
    return law / law.sum()


def _ensemble(rng, teachers: int, vocab: int, family: str):
    """(teachers (N+1, V): the N teachers and the one an adversary adds, public (V,))."""
    if family == "lm-like":
        return np.stack([_softmax(rng, vocab, 2.0) for _ in range(teachers + 1)]), _softmax(rng, vocab, 2.0)
    # extreme: point masses where the public model is nearly silent, and a public model with a tiny entry
    public = _softmax(rng, vocab, 1.0)
    public[rng.integers(vocab)] = 10.0 ** rng.uniform(-12, -3)
    public /= public.sum()
    rows = []
    for _ in range(teachers + 1):
        row = np.full(vocab, 10.0 ** rng.uniform(-15, -6))
        row[rng.integers(vocab)] = 1.0
        rows.append(row / row.sum())
    return np.stack(rows), public


def _lambdas(pmixed: PMixED, ensemble: np.ndarray, public: np.ndarray) -> np.ndarray:
    """The package's mixing weight of each row of `ensemble` (each depends on its teacher and the
    public model only, so one call projects the N teachers and the added one alike)."""
    return dataclasses.replace(pmixed, teachers=len(ensemble)).mixing_weights(ensemble[None], public[None])[0]


def _worst_ratio(pmixed: PMixED, ensemble: np.ndarray, public: np.ndarray) -> tuple[float, str]:
    """max over neighbours, directions and finite-curve orders of exact divergence / charged value."""
    lambdas = _lambdas(pmixed, ensemble, public)
    with mpmath.workdps(DPS):
        public_law = _law(public)
        mixed = [_mixed(lam, _law(row), public_law) for lam, row in zip(lambdas, ensemble)]
        bound = pmixed.rdp_values(ORDERS)
        worst, where = 0.0, ""
        for actual, neighbour in _neighbour_pairs(mixed[:-1], public_law, mixed[-1], pmixed.relation):
            for order, charged in zip(ORDERS, bound):
                if not math.isfinite(charged):
                    continue
                for p, q in ((actual, neighbour), (neighbour, actual)):
                    exact = float(renyi_divergence(p, q, float(order)))
                    ratio = exact / (charged * (1 + SLACK)) if charged > 0 else (math.inf if exact > 0 else 0.0)
                    if ratio > worst:
                        worst, where = ratio, f"order {order:g}: exact {exact:.6g} vs charged {charged:.6g}"
    return worst, where


CASES = [(n, relation, ball, beta) for n in (1, 2, 3) for relation in RELATIONS
         for ball in (Ball.PROOF_ORDERS, Ball.ALL_ORDERS) for beta in (0.01, 0.2)]


@pytest.mark.parametrize("teachers,relation,ball,beta", CASES,
                         ids=[f"N{n}-{r.label}-{b.value}-beta{beta}" for n, r, b, beta in CASES])
def test_the_charged_curve_covers_every_neighbour_of_the_relation(teachers, relation, ball, beta):
    """The two proven balls, on every family. (The seed is a stable digest of the case: Python's hash()
    of a string changes with every interpreter, which drew other ensembles in every run.)"""
    rng = np.random.default_rng(zlib.crc32(f"{teachers}-{relation.value}-{ball.value}-{beta}".encode()))
    pmixed = PMixED(ALPHA, beta, teachers, relation, ball)
    for family in ("lm-like", "extreme"):
        for _ in range(12):
            ensemble, public = _ensemble(rng, teachers, int(rng.integers(2, 5)), family)
            worst, where = _worst_ratio(pmixed, ensemble, public)
            assert worst <= 1.0, f"{family} ensemble: {where}"


def test_the_papers_one_order_ball_is_exceeded_on_a_two_token_lm_like_ensemble():
    """The projection-order ball (the paper's) is charged Theorem 3.1 "as claimed": its proof needs the
    ball at every order. Not only inputs with extreme tails break it (docs/soundness.md): among 4,000
    generated LM-like ensembles of N = 2 (softmax of N(0, 4) logits, V = 2 to 4) one exceeds it at
    order alpha itself by 22%, with the smallest public probability 1.4e-3. Its first teacher lies in
    the ball at order 6 (lambda 1) and removing the second gives D_6(p || p_-2) = 0.189 against
    Theorem 3.1's 0.154; the two proven balls project it further and stay below (0.15 and 0.19 of
    their curves)."""
    ensemble = np.array([[5.2073719437449660e-04, 9.9947926280562538e-01],
                         [2.7277373195341703e-01, 7.2722626804658308e-01],
                         [3.6701037349638610e-01, 6.3298962650361390e-01]])   # teachers 1, 2 and the added one
    public = np.array([0.00135481088377275, 0.9986451891162272])
    relation = NeighbouringRelation.ADD_OR_REMOVE_ONE
    exceeded, where = _worst_ratio(PMixED(ALPHA, 0.01, 2, relation, Ball.PROJECTION_ORDER), ensemble, public)
    assert exceeded > 1.2 and where.startswith("order 6:"), where
    for ball in (Ball.PROOF_ORDERS, Ball.ALL_ORDERS):
        assert _worst_ratio(PMixED(ALPHA, 0.01, 2, relation, ball), ensemble, public)[0] < 0.5


def _adversary_case(pmixed: PMixED, parameters: np.ndarray) -> float:
    """The largest exact divergence / charge over neighbours for a vocabulary-3 case given by logits
    (public, the teacher(s), the added teacher)."""
    vocab = 3
    logits = parameters.reshape(-1, vocab)
    laws = np.exp(logits - logits.max(axis=1, keepdims=True))
    laws /= laws.sum(axis=1, keepdims=True)
    return _worst_ratio(pmixed, laws[1:], laws[0])[0]


@pytest.mark.parametrize("ball", [Ball.PROJECTION_ORDER, Ball.ALL_ORDERS])
def test_an_optimised_adversary_stays_within_the_single_teacher_bound_and_beats_the_old_one(ball):
    """N = 1 under add-or-remove: a random search over (public, teacher, added teacher) with
    vocabulary 3 never exceeds the charged curve, and finds neighbours above beta * alpha, the value
    charged before (Theorem 3.1's N = 1 case covers removing the teacher, not adding a second)."""
    rng = np.random.default_rng(7)
    pmixed = PMixED(ALPHA, 0.2, 1, NeighbouringRelation.ADD_OR_REMOVE_ONE, ball)
    old_bound = 0.2 * ALPHA
    best, best_parameters = 0.0, None
    for _ in range(60):
        parameters = rng.normal(0.0, 8.0, 9)
        ratio = _adversary_case(pmixed, parameters)
        if ratio > best:
            best, best_parameters = ratio, parameters
    for _ in range(60):  # local refinement around the best case found
        candidate = best_parameters + rng.normal(0.0, 1.0, 9)
        ratio = _adversary_case(pmixed, candidate)
        if ratio > best:
            best, best_parameters = ratio, candidate
    assert best <= 1.0
    charged_at_alpha = float(pmixed.rdp_values(np.array([ALPHA]))[0])
    assert best * charged_at_alpha > old_bound, "the adversary should exceed what was charged before"


def test_the_reported_single_teacher_example_is_covered_in_epsilon_delta():
    """alpha 6, beta 0.2, one teacher, one query, delta 1e-5, all-orders ball: public (1.172e-4,
    1 - 1.172e-4), the teacher on the second token, an added teacher on the first. Before, dpledger
    printed epsilon 2.81365 there and the exact delta at that epsilon was 4.42e-4."""
    delta = 1e-5
    public = np.array([1.172e-4, 1 - 1.172e-4])
    teacher, added = np.array([0.0, 1.0]), np.array([1.0, 0.0])
    pmixed = PMixED(ALPHA, 0.2, 1, NeighbouringRelation.ADD_OR_REMOVE_ONE, Ball.ALL_ORDERS)
    epsilon = epsilon_from_rdp(pmixed.rdp_curve(), delta).epsilon
    assert epsilon > 2.81365
    lambdas = _lambdas(pmixed, np.stack([teacher, added]), public)
    with mpmath.workdps(DPS):
        public_law = _law(public)
        mixed = [_mixed(lam, _law(row), public_law) for lam, row in zip(lambdas, (teacher, added))]
        exact = max(_hockey_stick(p, q, epsilon) for actual, neighbour in
                    _neighbour_pairs(mixed[:1], public_law, mixed[1], pmixed.relation)
                    for p, q in ((actual, neighbour), (neighbour, actual)))
        at_old = max(_hockey_stick(p, q, 2.81365) for actual, neighbour in
                     _neighbour_pairs(mixed[:1], public_law, mixed[1], pmixed.relation)
                     for p, q in ((actual, neighbour), (neighbour, actual)))
    assert exact <= delta
    assert at_old > delta  # the pair the report found: the old epsilon was broken here


@pytest.mark.parametrize("teachers", [1, 2, 3])
@pytest.mark.parametrize("relation", RELATIONS, ids=lambda r: r.label)
def test_the_exact_privacy_profile_is_within_the_printed_epsilon(teachers, relation):
    """One query, all-orders ball: at the epsilon dpledger prints for delta, the exact hockey-stick
    divergence of every neighbouring pair (both directions) is at most delta."""
    rng = np.random.default_rng(11 + teachers)
    for beta, delta in ((0.05, 1e-5), (0.2, 1e-5), (0.2, 1e-3)):
        pmixed = PMixED(ALPHA, beta, teachers, relation, Ball.ALL_ORDERS)
        epsilon = epsilon_from_rdp(pmixed.rdp_curve(), delta).epsilon
        for family in ("lm-like", "extreme"):
            for _ in range(6):
                ensemble, public = _ensemble(rng, teachers, 3, family)
                lambdas = _lambdas(pmixed, ensemble, public)
                with mpmath.workdps(DPS):
                    public_law = _law(public)
                    mixed = [_mixed(lam, _law(row), public_law) for lam, row in zip(lambdas, ensemble)]
                    for actual, neighbour in _neighbour_pairs(mixed[:-1], public_law, mixed[-1], relation):
                        for p, q in ((actual, neighbour), (neighbour, actual)):
                            assert _hockey_stick(p, q, epsilon) <= delta


def _subsampled_output(mixed: list, public: list, rate) -> list:
    """The exact output law of PMixED on a Poisson subsample of `mixed` (each teacher kept with
    probability `rate`; an empty subsample answers with the public model)."""
    rate = mpmath.mpf(float(rate))
    law = [mpmath.mpf(0)] * len(public)
    for kept in itertools.product((False, True), repeat=len(mixed)):
        chosen = [m for m, keep in zip(mixed, kept) if keep]
        weight = rate ** len(chosen) * (1 - rate) ** (len(mixed) - len(chosen))
        answer = _mean(chosen) if chosen else public
        law = [acc + weight * a for acc, a in zip(law, answer)]
    return law


@pytest.mark.parametrize("teachers", [1, 2, 3])
@pytest.mark.parametrize("rate", [0.3, 0.9])
@pytest.mark.parametrize("relation", RELATIONS, ids=lambda r: r.label)
def test_subsampled_pmixed_covers_every_neighbour(teachers, rate, relation):
    """The all-orders-ball variant (proven) on every family, worst-case-size-general (sound given
    Theorem 3.1) on LM-like ensembles: exact subsampled output laws of each neighbouring ensemble
    (every subset enumerated) stay within the curve at every finite order."""
    rng = np.random.default_rng(int(rate * 100) + teachers)
    integer_orders = np.array([2.0, 3.0, 6.0])
    for ball, variant, families in ((Ball.ALL_ORDERS, SubsamplingVariant.ALL_ORDERS_BALL, ("lm-like", "extreme")),
                                    (Ball.PROJECTION_ORDER, SubsamplingVariant.WORST_CASE_SIZE_GENERAL, ("lm-like",))):
        pmixed = PMixED(ALPHA, 0.2, teachers, relation, ball)
        curve = SubsampledPMixED(pmixed, rate, variant).rdp_values(integer_orders)
        for family in families:
            for _ in range(5):
                ensemble, public = _ensemble(rng, teachers, 3, family)
                lambdas = _lambdas(pmixed, ensemble, public)
                with mpmath.workdps(DPS):
                    public_law = _law(public)
                    mixed = [_mixed(lam, _law(row), public_law) for lam, row in zip(lambdas, ensemble)]
                    actual = _subsampled_output(mixed[:-1], public_law, rate)
                    neighbours = []
                    if "remove" in relation.moves:
                        neighbours += [_subsampled_output(mixed[:i] + mixed[i + 1:teachers], public_law, rate)
                                       for i in range(teachers)]
                    if "add" in relation.moves:
                        neighbours.append(_subsampled_output(mixed, public_law, rate))
                    for neighbour in neighbours:
                        for order, charged in zip(integer_orders, curve):
                            for p, q in ((actual, neighbour), (neighbour, actual)):
                                exact = float(renyi_divergence(p, q, float(order)))
                                assert exact <= charged * (1 + SLACK), (variant.value, family, order, exact, charged)


def test_replace_one_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="replacing one is two moves"):
        PMixED(ALPHA, 0.2, 3, NeighbouringRelation.REPLACE_ONE)


@pytest.mark.parametrize("relation", RELATIONS, ids=lambda r: r.label)
@pytest.mark.parametrize("teachers", [1, 2, 3, 50])
def test_beta_from_budget_inverts_the_charged_bound(relation, teachers):
    """Lemma C.1 at the ensemble size the relation charges: the beta it returns charges at most the
    per-query budget, and (oracle) the single-teacher add-one case is Theorem 3.1 at two teachers."""
    for budget, queries in ((8.0, 1000), (1.0, 1), (50.0, 10)):
        beta = beta_from_budget(budget, queries, ALPHA, teachers, relation)
        charged = PMixED(ALPHA, beta, teachers, relation).per_query_epsilon
        assert charged <= budget / queries
        assert charged >= 0.999 * budget / queries
    if teachers == 1 and "add" in relation.moves:
        beta = beta_from_budget(8.0, 1000, ALPHA, 1, relation)
        with mpmath.workdps(DPS):
            assert oracle_theorem_3_1(ALPHA, beta, 2) <= mpmath.mpf(8.0) / 1000


def test_adapmixed_with_one_teacher_is_refused_with_the_reason():
    from dpledger.mechanisms import AdaPMixED, NoisyScreening

    with pytest.raises(ValueError, match="AdaPMixED needs at least 2 teachers, got 1"):
        AdaPMixED(PMixED(18.0, 0.2, 1), NoisyScreening(teachers=1, lam=1e-4, sigma=1e-2))
