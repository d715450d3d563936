"""Adversarial review of issue 28's PATE accounting: every charged data-dependent value must be at least
the true Renyi divergence of the exact output laws over every neighbour, computed here from the
definitions only (mpmath quadrature of GNMax's law, the threshold check's exact Bernoulli law, brute-force
enumeration of neighbour sets and balls), never from the code under test."""
from __future__ import annotations

import functools
import itertools
import math

import mpmath
import numpy as np
import pytest

from dpledger.accounting.relation import DivergenceDirection, NeighbouringRelation
from dpledger.mechanisms.dp_icl import DPICL, public_top_k, restricted_sums
from dpledger.mechanisms.hot_pate_aggregators import DpargmaxAggregator
from dpledger.mechanisms.pate import ConfidentGNMax, GNMax, data_dependent_screen_rdp
from dpledger.mechanisms.pate_smooth_sensitivity import RELEASE_LABEL, smooth_sensitivity, smooth_sensitivity_release

R = NeighbouringRelation
ORDERS = np.array([1.0001, 1.01, 1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 64.0, 256.0, 1024.0])


def neighbours(counts: tuple[int, ...], relation: NeighbouringRelation) -> set[tuple[int, ...]]:
    """Every histogram one teacher away under `relation`, enumerated from the definition of each move."""
    found: set[tuple[int, ...]] = set()
    size = len(counts)
    for j in range(size):
        up = tuple(c + (k == j) for k, c in enumerate(counts))
        down = tuple(c - (k == j) for k, c in enumerate(counts))
        if relation in (R.ADD_ONE, R.ADD_OR_REMOVE_ONE):
            found.add(up)
        if relation in (R.REMOVE_ONE, R.ADD_OR_REMOVE_ONE) and counts[j] >= 1:
            found.add(down)
        if relation is R.REPLACE_ONE and counts[j] >= 1:
            for i in range(size):
                if i != j:
                    found.add(tuple(c - (k == j) + (k == i) for k, c in enumerate(counts)))
    found.discard(tuple(counts))
    return found


@functools.lru_cache(maxsize=None)
def gnmax_law(counts: tuple[int, ...], sigma: float) -> tuple[mpmath.mpf, ...]:
    """log Pr[argmax_j (c_j + N(0, sigma^2)) = j] for every j, by mpmath quadrature of
    int phi(t) prod_{k != j} Phi(t + (c_j - c_k) / sigma) dt on a grid of step 2 in t that covers every
    integrand's narrow peak; the largest count's log-mass is log1p(-the rest), so that every mass keeps
    its relative accuracy however small the others are. Equal counts win equally."""
    s = mpmath.mpf(sigma)
    top = max(range(len(counts)), key=lambda j: counts[j])
    masses: list[mpmath.mpf] = [mpmath.mpf(0)] * len(counts)
    for j, c in enumerate(counts):
        if j == top:
            continue
        shifts = [(mpmath.mpf(c) - other) / s for k, other in enumerate(counts) if k != j]

        def integrand(t, shifts=shifts):
            return mpmath.npdf(t) * mpmath.fprod(mpmath.ncdf(t + shift) for shift in shifts)

        low, high = int(mpmath.floor(min([-x for x in shifts] + [0]))) - 10, int(mpmath.ceil(max([-x for x in shifts])))
        masses[j] = mpmath.quad(integrand, [-mpmath.inf] + list(range(low, max(high, 0) + 11, 2)) + [mpmath.inf])
    rest = mpmath.fsum(masses)
    return tuple(mpmath.log1p(-rest) if j == top else mpmath.log(m) for j, m in enumerate(masses))


def renyi(log_p, log_q, alpha: float) -> mpmath.mpf:
    """D_alpha(P || Q) = log(sum_i p_i^alpha q_i^(1 - alpha)) / (alpha - 1) (van Erven & Harremoes 2014,
    Definition 2) from the laws' log-masses, summed as log1p(sum_i p_i expm1((alpha - 1) log(p_i / q_i)))
    so that a divergence far below the working precision keeps its digits."""
    a = mpmath.mpf(alpha)
    excess = mpmath.fsum(mpmath.exp(lp) * mpmath.expm1((a - 1) * (lp - lq))
                         for lp, lq in zip(log_p, log_q) if lp > -mpmath.inf)
    return mpmath.log1p(excess) / (a - 1)


GNMAX_CASES = [((0, 0), 1.0), ((5, 5), 1.0), ((9, 1), 1.0), ((6, 5), 0.5), ((12, 0), 1.0), ((8, 8, 0), 1.0),
               ((15, 2, 2), 1.5), ((19, 0, 3), 0.6), ((20, 19, 0), 2.0), ((7, 0, 0), 0.7)]
"""Ties, a top count of 0, one-vote margins where a neighbour's argmax changes, Theorem 6's active range
(a gap of 10 to 30 sigma: charges of 1e-38 to 1e-5) and its cap."""


# add-one and remove-one are charged exactly the add-or-remove value (every gap moves by one) and
# their neighbours are subsets of its own, so add-or-remove's check covers them
@pytest.mark.parametrize("relation", [R.REPLACE_ONE, R.ADD_OR_REMOVE_ONE])
def test_gnmax_data_dependent_rdp_bounds_the_exact_divergence_over_every_neighbour(relation):
    orders = np.array([1.01, 1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 64.0])
    checked = 0
    with mpmath.workdps(20):
        for counts, sigma in GNMAX_CASES:
            gnmax = GNMax(sigma, relation)
            both = gnmax.data_dependent_rdp(np.array(counts), orders, DivergenceDirection.BOTH)
            forward = gnmax.data_dependent_rdp(np.array(counts), orders, DivergenceDirection.FROM_ACTUAL)
            actual = gnmax_law(counts, sigma)
            for other in neighbours(counts, relation):
                law = gnmax_law(other, sigma)
                for index, alpha in enumerate(orders):
                    to_neighbour, from_neighbour = renyi(actual, law, alpha), renyi(law, actual, alpha)
                    assert forward[index] >= to_neighbour * (1 - 1e-12), (counts, other, sigma, alpha)
                    assert both[index] >= max(to_neighbour, from_neighbour) * (1 - 1e-12), (counts, other, sigma, alpha)
                    checked += 1
    assert checked > 200


def two_token_law(counts: tuple[int, int], sigma: float) -> tuple[mpmath.mpf, mpmath.mpf]:
    """GNMax's exact log-law on two tokens: token 1 wins iff N(0, 2 sigma^2) > c_0 - c_1, with probability
    Phi(-(c_0 - c_1) / (sigma sqrt 2)); the larger mass as log1p(-the smaller)."""
    x = (mpmath.mpf(counts[0]) - counts[1]) / (mpmath.mpf(sigma) * mpmath.sqrt(2))
    small = mpmath.ncdf(-abs(x))
    return (mpmath.log1p(-small), mpmath.log(small)) if x >= 0 else (mpmath.log(small), mpmath.log1p(-small))


def test_gnmax_two_token_charges_bound_the_closed_form_divergence_at_every_order():
    # closed form, so gaps of thousands of sigma and orders up to 1024: Theorem 6 down to 1e-320, where
    # float rounding lost relative precision (1.4e-320 charged 5e-324 for counts (366, 11), sigma 6.53)
    orders = np.array([1.0001, 1.01, 1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0])
    rng = np.random.default_rng(5)
    cases = [((366, 11), 6.53457033843372), ((41, 2551), 45.635975131147674), ((0, 0), 1.0), ((1, 0), 0.01)]
    for trial in range(120):
        gap = int(rng.integers(0, 4000)) if trial % 2 else int(rng.integers(0, 40))
        low = int(rng.integers(0, 50))
        cases.append(((low + gap, low) if trial % 3 else (low, low + gap), float(10 ** rng.uniform(-1, 2.5))))
    checked = 0
    with mpmath.workdps(60):
        for counts, sigma in cases:
            for relation in (R.REPLACE_ONE, R.ADD_OR_REMOVE_ONE):
                gnmax = GNMax(sigma, relation)
                both = gnmax.data_dependent_rdp(np.array(counts), orders, DivergenceDirection.BOTH)
                forward = gnmax.data_dependent_rdp(np.array(counts), orders, DivergenceDirection.FROM_ACTUAL)
                actual = two_token_law(counts, sigma)
                for other in neighbours(counts, relation):
                    law = two_token_law(other, sigma)
                    for index, alpha in enumerate(orders):
                        to_neighbour, from_neighbour = renyi(actual, law, alpha), renyi(law, actual, alpha)
                        assert forward[index] >= to_neighbour, (counts, other, sigma, relation, alpha)
                        assert both[index] >= max(to_neighbour, from_neighbour), (counts, other, sigma, relation, alpha)
                        checked += 1
    assert checked > 9000


def screen_law(top: int, threshold: float, sigma_threshold: float) -> tuple[mpmath.mpf, mpmath.mpf]:
    """(log Pr[pass], log Pr[fail]) of the check top + N(0, s1^2) >= T: the smaller mass from its tail,
    the larger as log1p(-the smaller), so neither loses digits to a 1 - tiny."""
    x = (mpmath.mpf(top) - mpmath.mpf(threshold)) / mpmath.mpf(sigma_threshold)
    small = mpmath.ncdf(-abs(x))
    return (mpmath.log1p(-small), mpmath.log(small)) if x >= 0 else (mpmath.log(small), mpmath.log1p(-small))


@pytest.mark.parametrize("sigma_threshold", [0.05, 0.4, 1.0, 3.0, 40.0, 1e4])
def test_data_dependent_screen_is_at_least_the_exact_bernoulli_divergence(sigma_threshold):
    thresholds = [0.0, 3.0, 10.5, 30.0]
    checked = 0
    with mpmath.workdps(120):
        for threshold in thresholds:
            for top in list(range(0, 16)) + [29, 30, 31, 60, 1000]:
                charged = data_dependent_screen_rdp(float(top), threshold, sigma_threshold, ORDERS)
                actual = screen_law(top, threshold, sigma_threshold)
                steps = [top + 1] + ([top - 1] if top >= 1 else [])
                for index, alpha in enumerate(ORDERS):
                    truth = max(max(renyi(actual, screen_law(m, threshold, sigma_threshold), alpha),
                                    renyi(screen_law(m, threshold, sigma_threshold), actual, alpha))
                                for m in steps)
                    assert charged[index] >= truth, (top, threshold, sigma_threshold, alpha, charged[index], truth)
                    assert charged[index] > 0.0
                    cap = alpha / (2 * sigma_threshold ** 2)
                    # tight: within 1e-4 of the truth (the rounding allowance near order 1) unless the cap binds or
                    # both are below 1e-290
                    if charged[index] < cap * (1 - 1e-12) and truth > 1e-290:
                        assert charged[index] <= truth * (1 + 1e-4) + 1e-300, (top, threshold, alpha)
                    checked += 1
    assert checked > 900


def test_screen_reads_float32_and_uint_histograms_as_their_integers():
    mechanism = ConfidentGNMax(12.0, 2.0, 3.0, R.ADD_OR_REMOVE_ONE)
    reference = mechanism.data_dependent_screen_rdp(np.array([11, 3, 0]), ORDERS)
    for dtype in (np.float32, np.uint8, np.int16):
        assert np.array_equal(mechanism.data_dependent_screen_rdp(np.array([11, 3, 0], dtype=dtype), ORDERS),
                              reference)
    with pytest.raises(ValueError, match="integers"):
        mechanism.data_dependent_screen_rdp(np.array([11.5, 3, 0], dtype=np.float32), ORDERS)


def test_confident_gnmax_answered_charge_bounds_the_joint_law_of_decision_and_token():
    # the released pair (decision, token): law (fail, pass * GNMax law), its divergence over every neighbour
    with mpmath.workdps(20):
        for relation in (R.REPLACE_ONE, R.ADD_OR_REMOVE_ONE):
            for counts, threshold, s1, s2 in [((9, 2, 0), 8.0, 2.0, 1.0), ((4, 4), 3.0, 1.0, 1.0),
                                              ((1, 0, 0), 0.0, 0.5, 0.6)]:
                mechanism = ConfidentGNMax(threshold, s1, s2, relation)
                charged = mechanism.data_dependent_rdp(np.array(counts), ORDERS[:8], answered=True,
                                                       data_dependent_screen=True)

                def joint(c, threshold=threshold, s1=s1, s2=s2):
                    passing, failing = screen_law(max(c), threshold, s1)
                    return [failing] + [passing + p for p in gnmax_law(c, s2)]

                actual = joint(counts)
                for other in neighbours(counts, relation):
                    law = joint(other)
                    for index, alpha in enumerate(ORDERS[:8]):
                        truth = max(renyi(actual, law, alpha), renyi(law, actual, alpha))
                        assert charged[index] >= truth, (relation, counts, other, alpha)


def test_a_data_dependent_screen_without_its_threshold_is_refused():
    # the data-dependent screen reads T: charging it at a stand-in T = 0 under-states it (4.9e-37 against
    # 0.071 at order 2 for counts (40, 1, 0), T = 40, s1 = 3)
    with pytest.raises(ValueError, match="threshold"):
        DpargmaxAggregator(sigma=2.0, sigma_threshold=3.0, data_dependent_screen=True)
    aggregator = DpargmaxAggregator(sigma=2.0, sigma_threshold=3.0, threshold=40.0, data_dependent_screen=True)
    charged = aggregator.charges(np.array([[40, 1, 0]]), np.array([True]), np.array([2.0]))
    with mpmath.workdps(60):
        truth = max(renyi(screen_law(40, 40.0, 3.0), screen_law(m, 40.0, 3.0), 2.0) for m in (39, 41))
    assert charged["confident_gnmax_screen_data_dependent"][0, 0] >= truth > 0.05


def ball(center: tuple[int, ...], radius: int, relation: NeighbouringRelation) -> dict[tuple[int, ...], int]:
    """Every histogram within `radius` moves of `center`, with its distance (breadth-first search)."""
    distance = {center: 0}
    frontier = [center]
    for step in range(1, radius + 1):
        reached = []
        for histogram in frontier:
            for other in neighbours(histogram, relation):
                if other not in distance:
                    distance[other] = step
                    reached.append(other)
        frontier = reached
    return distance


@pytest.mark.parametrize("relation", [R.REPLACE_ONE, R.ADD_OR_REMOVE_ONE])
def test_smooth_sensitivity_dominates_the_local_sensitivity_at_every_distance_and_is_smooth(relation):
    mechanism = ConfidentGNMax(6.0, 1.5, 1.2, relation)
    order, beta, reach = 6.0, 0.05, 3
    statistic_cache: dict[tuple[int, ...], float] = {}

    def statistic(histogram):
        if histogram not in statistic_cache:
            statistic_cache[histogram] = smooth_sensitivity([histogram], mechanism, order, beta).statistic
        return statistic_cache[histogram]

    for center in [(7, 2, 1), (5, 5, 0), (9, 0, 0), (4, 3, 2), (1, 0, 0)]:
        result = smooth_sensitivity([center], mechanism, order, beta)
        points = ball(center, reach, relation)
        worst_at = [0.0] * reach  # A_d: the largest local sensitivity over the histograms within d
        for histogram, distance in points.items():
            if distance >= reach:
                continue
            local = max(abs(statistic(histogram) - statistic(other)) for other in neighbours(histogram, relation))
            for d in range(distance, reach):
                worst_at[d] = max(worst_at[d], local)
        for d, local in enumerate(worst_at):
            assert result.smooth_sensitivity >= math.exp(-beta * d) * local, (center, d, local)
        for other in neighbours(center, relation):  # beta-smooth: SS(D) <= e^beta SS(D')
            assert result.smooth_sensitivity <= math.exp(beta) * smooth_sensitivity(
                [other], mechanism, order, beta).smooth_sensitivity * (1 + 1e-12), (center, other)


def test_smooth_sensitivity_stopped_at_its_last_radius_charges_the_rest(monkeypatch):
    # a beta too small for e^{-beta d} to fall within MOST_RADII distances: stopping there used to drop
    # the larger distances' terms; here MOST_RADII = 1 stands in for 10^6 (hours of evaluation)
    from dpledger.mechanisms import pate_smooth_sensitivity

    monkeypatch.setattr(pate_smooth_sensitivity, "MOST_RADII", 1)
    mechanism, beta = ConfidentGNMax(6.0, 1.5, 1.2, R.REPLACE_ONE), 1e-9
    center = (7, 2, 1)
    stopped = smooth_sensitivity([center], mechanism, 6.0, beta).smooth_sensitivity
    statistic = functools.lru_cache(maxsize=None)(
        lambda histogram: smooth_sensitivity([histogram], mechanism, 6.0, beta).statistic)
    for histogram, distance in ball(center, 2, R.REPLACE_ONE).items():
        if distance < 2:
            local = max(abs(statistic(histogram) - statistic(other)) for other in neighbours(histogram, R.REPLACE_ONE))
            assert stopped >= math.exp(-beta) * local, (histogram, local, stopped)


def test_smooth_sensitivity_release_is_labelled_data_dependent():
    mechanism = ConfidentGNMax(6.0, 1.5, 1.2, R.REPLACE_ONE)
    release = smooth_sensitivity_release([[7, 2, 1], [3, 3, 4]], mechanism, 6.0, beta=0.05, sigma_ss=2.0,
                                         delta=1e-5, rng=np.random.default_rng(0))
    published = release.published
    assert published["data_dependent"] is True and published["label"] == RELEASE_LABEL
    assert "not a data-independent DP guarantee" in published["label"]
    assert published["charged"] == {"screen": "data-dependent", "answer": "data-dependent"}
    assert not {"statistic", "smooth_sensitivity", "local_sensitivity"} & set(published)


def _teacher_pairs(rng: np.random.Generator, vocabulary: int, top_k: int):
    """Teacher distributions: dense, point masses, with no mass on the public top-k, subnormal masses there."""
    public = rng.dirichlet(np.ones(vocabulary))
    tokens = public_top_k(public, top_k)
    outside = np.setdiff1d(np.arange(vocabulary), tokens)
    kinds = []
    for _ in range(6):
        kind = int(rng.integers(0, 4))
        if kind == 0:
            law = rng.dirichlet(np.full(vocabulary, 0.3))
        elif kind == 1:
            law = np.eye(vocabulary)[int(rng.integers(vocabulary))]
        elif kind == 2 and outside.size:
            law = np.zeros(vocabulary)
            law[outside] = rng.dirichlet(np.ones(outside.size))
        else:
            law = np.zeros(vocabulary)
            law[outside[:1] if outside.size else tokens[:1]] = 1.0 - 1e-300
            law[tokens[int(rng.integers(top_k))]] += 5e-324
        kinds.append(law / law.sum())
    return public, np.array(kinds)


@pytest.mark.parametrize("relation", [R.ADD_OR_REMOVE_ONE, R.REPLACE_ONE])
def test_dp_icl_sum_moves_by_at_most_its_sensitivity_on_every_neighbour(relation):
    rng = np.random.default_rng(7)
    mechanism = DPICL(1.0, 3, relation)
    worst, pairs = 0.0, 0
    for _ in range(150):
        vocabulary = int(rng.integers(3, 7))
        public, teachers = _teacher_pairs(rng, vocabulary, 3)
        tokens = public_top_k(public, 3)
        base = restricted_sums(teachers, tokens)
        others = []
        if relation is R.REPLACE_ONE:
            others = [np.concatenate([teachers[:i], teachers[j:j + 1], teachers[i + 1:]])
                      for i, j in itertools.permutations(range(len(teachers)), 2)]
        else:
            others = [np.delete(teachers, i, axis=0) for i in range(len(teachers))]
            others += [np.concatenate([teachers, np.eye(vocabulary)[[v]]]) for v in range(vocabulary)]
        for other in others:
            moved = float(np.linalg.norm(restricted_sums(other, tokens) - base))
            worst = max(worst, moved)
            pairs += 1
            assert moved <= mechanism.sensitivity * (1 + 1e-12), (relation, moved)
    assert pairs > 1000
    # attained: the claimed sensitivity is the worst case, not loose by more than rounding
    assert worst >= mechanism.sensitivity * (1 - 1e-12)


def test_dp_icl_dp_event_has_the_charged_rdp():
    from dp_accounting.rdp import RdpAccountant

    for relation in (R.ADD_OR_REMOVE_ONE, R.REPLACE_ONE):
        mechanism = DPICL(3.0, 4, relation)
        accountant = RdpAccountant(list(ORDERS))
        accountant.compose(mechanism.dp_event())
        expected = ORDERS * mechanism.sensitivity ** 2 / (2 * 3.0 ** 2)
        assert np.allclose(accountant._rdp, expected, rtol=1e-12)
        assert np.all(mechanism.rdp_values(ORDERS) >= np.asarray(accountant._rdp))
