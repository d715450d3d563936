"""PATE accounting that follows the claimed relation, the data-dependent screen and the smooth-sensitivity
release (issue 28), against mpmath oracles written from Papernot et al. 2018 and the definitions
(tests/oracles/pate_relations.py) and against dp-accounting, on generated histograms."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpledger.accounting.conversion import epsilon_from_rdp
from dpledger.accounting.orders import default_orders
from dpledger.accounting.relation import DivergenceDirection, NeighbouringRelation, PathAccounting
from dpledger.mechanisms.hot_pate_aggregators import DpargmaxAggregator, DpwsAggregator
from dpledger.mechanisms.pate import ConfidentGNMax, GNMax, data_dependent_screen_rdp
from dpledger.mechanisms.pate_smooth_sensitivity import gnss_rdp, smooth_sensitivity, smooth_sensitivity_release
from tests.oracles import pate_relations as O

REPLACE, ADD_REMOVE = NeighbouringRelation.REPLACE_ONE, NeighbouringRelation.ADD_OR_REMOVE_ONE
ORDERS = np.array([1.01, 1.5, 2.0, 3.7, 8.0, 16.0, 32.0, 100.0, 1024.0])


def _histograms(seed: int, cases: int) -> list[tuple[np.ndarray, float]]:
    """Generated (histogram, sigma): a few tokens, concentrated or spread, margins from 0 to huge."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(cases):
        tokens = int(rng.integers(2, 7))
        teachers = int(rng.choice([4, 16, 64, 256, 2000]))
        shares = rng.dirichlet(np.full(tokens, float(rng.choice([0.05, 0.3, 1.0, 5.0]))))
        counts = np.bincount(rng.choice(tokens, teachers, p=shares), minlength=tokens)
        found.append((counts, float(rng.choice([0.3, 1.0, 2.0, 5.0, 20.0]))))
    return found


@pytest.mark.parametrize("relation", [REPLACE, ADD_REMOVE])
def test_gnmax_data_dependent_matches_theorem_6_at_the_relation(relation):
    # Theorem 6 with GNMax's RDP under the relation and that relation's neighbours (both directions)
    for counts, sigma in _histograms(1 if relation is REPLACE else 2, 60):
        gnmax = GNMax(sigma, relation)
        both = gnmax.data_dependent_rdp(counts, ORDERS)
        forward = gnmax.data_dependent_rdp(counts, ORDERS, DivergenceDirection.FROM_ACTUAL)
        for alpha, b_value, f_value in zip(ORDERS, both, forward):
            b_ref = float(O.gnmax_data_dependent(counts, sigma, alpha, relation.value))
            f_ref = float(O.gnmax_data_dependent(counts, sigma, alpha, relation.value, both=False))
            what = f"{relation.value} counts={counts.tolist()} sigma={sigma} alpha={alpha}"
            # never below Theorem 6, even at 1e-58; the data-independent cap a s^2 / (2 sigma^2) is one float
            # division, within an ulp or two of the exact value
            assert b_value >= b_ref * (1 - 1e-15) and f_value >= f_ref * (1 - 1e-15), what
            assert b_value <= b_ref * (1 + 1e-9) + 1e-12, what
            assert f_value <= f_ref * (1 + 1e-9) + 1e-12, what


def test_add_or_remove_is_never_charged_more_than_replace_one():
    for counts, sigma in _histograms(3, 80):
        add_remove = GNMax(sigma, ADD_REMOVE).data_dependent_rdp(counts, ORDERS)
        replace = GNMax(sigma, REPLACE).data_dependent_rdp(counts, ORDERS)
        assert np.all(add_remove <= replace * (1 + 1e-12)), (counts, sigma)


@pytest.mark.parametrize("relation", [REPLACE, ADD_REMOVE])
def test_gnmax_data_dependent_bounds_the_exact_two_class_divergences(relation):
    # the bound must cover the exact divergence to every neighbour, both directions: an under-statement fails
    rng = np.random.default_rng(4)
    checked = 0
    for _ in range(120):
        c1, c2 = (int(v) for v in rng.integers(0, 60, size=2))
        if c1 + c2 == 0:
            continue
        sigma = float(rng.choice([0.5, 1.0, 2.0, 4.0]))
        bound = GNMax(sigma, relation).data_dependent_rdp([c1, c2], ORDERS)
        for alpha, value in zip(ORDERS, bound):
            forward, reverse = O.two_class_exact(c1, c2, sigma, alpha, relation.value)
            assert value >= float(max(forward, reverse)) * (1 - 1e-9), (relation, c1, c2, sigma, alpha)
            checked += 1
    assert checked > 500


def test_screen_rdp_is_the_exact_divergence_with_a_small_rounding_allowance():
    rng = np.random.default_rng(5)
    cases = [(0.0, 32.0, 8.0), (32.0, 32.0, 8.0), (33.0, 32.0, 1e-3), (1000.0, 32.0, 8.0), (3.0, 2.5, 1e6),
             (400.0, 10.0, 30.0)]
    cases += [(float(rng.integers(0, 300)), float(rng.integers(0, 300)), float(rng.choice([0.2, 1.0, 5.0, 40.0])))
              for _ in range(60)]
    for top, threshold, sigma_threshold in cases:
        values = data_dependent_screen_rdp(top, threshold, sigma_threshold, ORDERS)
        for alpha, value in zip(ORDERS, values):
            exact = O.screen_exact(top, threshold, sigma_threshold, alpha)
            independent = alpha / (2 * sigma_threshold ** 2)
            what = f"m={top} T={threshold} s1={sigma_threshold} alpha={alpha}"
            assert value >= float(exact) * (1 - 1e-12) or value == pytest.approx(independent, rel=1e-15), what
            assert value <= float(exact) * (1 + 1e-6) + 1e-13, what  # the rounding allowance (stated tolerance)
            assert value <= independent * (1 + 1e-15), what


def test_data_dependent_screen_never_exceeds_the_screen_charge_and_is_opt_in():
    mechanism = ConfidentGNMax(32.0, 8.0, 8.0, ADD_REMOVE)
    counts = np.array([60, 4, 0])
    plain = mechanism.data_dependent_rdp(counts, ORDERS, True)
    screened = mechanism.data_dependent_rdp(counts, ORDERS, True, data_dependent_screen=True)
    assert np.all(screened <= plain) and np.any(screened < plain)
    np.testing.assert_allclose(plain - GNMax(8.0, ADD_REMOVE).data_dependent_rdp(counts, ORDERS),
                               mechanism.screen_rdp(ORDERS))


def _aggregator(name, relation, **parameters):
    return {"dpargmax": DpargmaxAggregator, "dpws": DpwsAggregator}[name](relation=relation, **parameters)


def test_verify_curves_follow_the_claimed_relation_and_the_demo_numbers():
    # issue 28: the demo's DPARGMAX (T = 32, s1 = s2 = 8, 128 steps) was charged 13.78 under add-or-remove
    orders = default_orders()
    dpargmax = _aggregator("dpargmax", ADD_REMOVE, threshold=32.0, sigma=8.0, sigma_threshold=8.0)
    epsilons = {}
    for relation in (REPLACE, ADD_REMOVE):
        (variant,) = dpargmax.verify_accounts(orders, 128, None, PathAccounting.RELEASED_OUTPUT, relation)
        epsilons[relation] = epsilon_from_rdp(variant.curve, 1e-5).epsilon
        assert variant.curve.relation is relation
    assert epsilons[REPLACE] == pytest.approx(13.78, abs=0.01)
    assert epsilons[ADD_REMOVE] == pytest.approx(10.73, abs=0.01)
    # DPWS: add-or-remove only with a public voter count; a curve is never presented for another relation
    with_voters = _aggregator("dpws", ADD_REMOVE, sigma=8.0, threshold=4.0, teachers=64)
    (variant,) = with_voters.verify_accounts(orders, 10, None, PathAccounting.RELEASED_OUTPUT, ADD_REMOVE)
    np.testing.assert_allclose(variant.curve.values, 10 * np.asarray(orders) / 128.0)
    (variant,) = with_voters.verify_accounts(orders, 10, None, PathAccounting.RELEASED_OUTPUT, REPLACE)
    np.testing.assert_allclose(variant.curve.values, 10 * np.asarray(orders) / 64.0)
    without = _aggregator("dpws", REPLACE, sigma=8.0, threshold=4.0)
    assert ADD_REMOVE not in without.covered_relations()
    (variant,) = without.verify_accounts(orders, 10, None, PathAccounting.RELEASED_OUTPUT, ADD_REMOVE)
    assert variant.curve.relation is REPLACE


def test_data_independent_parts_match_dp_accounting():
    dp_accounting = pytest.importorskip("dp_accounting")
    orders = [2.0, 4.0, 16.0, 64.0]
    for relation, s1, s2 in itertools.product((REPLACE, ADD_REMOVE), (3.0, 10.0), (2.0, 8.0)):
        mechanism = ConfidentGNMax(0.0, s1, s2, relation)
        accountant = dp_accounting.rdp.RdpAccountant(orders)
        accountant.compose(mechanism.dp_event(), 7)
        ours = 7 * mechanism.rdp_values(np.asarray(orders))
        np.testing.assert_allclose(ours, accountant._rdp, rtol=1e-12)
        sensitivity_squared = 2.0 if relation is REPLACE else 1.0
        np.testing.assert_allclose(ours, 7 * np.asarray(orders) * (1 / (2 * s1 ** 2) + sensitivity_squared / (2 * s2 ** 2)))


def test_gnss_cost_matches_theorem_23_and_refuses_orders_past_its_range():
    for alpha, beta, sigma_ss in [(2.0, 0.1, 1.0), (10.0, 0.04, 5.0), (40.0, 0.0124, 3.0)]:
        assert gnss_rdp(alpha, beta, sigma_ss) == pytest.approx(float(O.gnss_rdp(alpha, beta, sigma_ss)), rel=1e-13)
    with pytest.raises(ValueError, match="order must be < 1 / \\(2 beta\\)"):
        gnss_rdp(10.0, 0.05, 1.0)


def _histograms_within(counts: np.ndarray, relation: NeighbouringRelation) -> list[np.ndarray]:
    """Every histogram one teacher away (counts stay >= 0)."""
    found = []
    for i, j in itertools.product(range(counts.size), repeat=2):
        moved = counts.copy()
        if relation is REPLACE:
            if i == j or moved[i] == 0:
                continue
            moved[i] -= 1
            moved[j] += 1
        else:
            if i != j:
                continue
            for step in (-1, 1):
                other = counts.copy()
                other[i] += step
                if other[i] >= 0:
                    found.append(other)
            continue
        found.append(moved)
    return found


@pytest.mark.parametrize("relation", [REPLACE, ADD_REMOVE])
def test_local_sensitivity_bounds_hold_by_enumeration_and_ss_is_smooth(relation):
    # the bound at distance d must cover |F(D'') - F(D''')| for every D'' within d of D and D''' next to
    # D''; SS_beta(D') <= e^beta SS_beta(D) for every neighbour D'
    rng = np.random.default_rng(6 if relation is REPLACE else 7)
    mechanism = ConfidentGNMax(6.0, 2.0, 1.5, relation)
    order, beta = 6.0, 0.05

    statistics: dict[tuple[int, ...], float] = {}

    def statistic(step_counts):  # each histogram meets many others in the enumeration: computed once
        key = tuple(int(c) for c in step_counts)
        if key not in statistics:
            statistics[key] = smooth_sensitivity(step_counts[None, :], mechanism, order, beta).statistic
        return statistics[key]

    for _ in range(4):
        counts = np.bincount(rng.choice(3, 12, p=rng.dirichlet(np.ones(3))), minlength=3)
        found = smooth_sensitivity(counts[None, :], mechanism, order, beta)
        ring = [counts]
        seen = {tuple(counts)}
        for distance in range(2):
            worst = max(abs(statistic(near) - statistic(far)) for near in ring for far in _histograms_within(near, relation))
            assert worst <= found.local_sensitivity[distance] * (1 + 1e-9), (counts, distance)
            ring = [h for near in ring for h in _histograms_within(near, relation) if tuple(h) not in seen]
            seen.update(tuple(h) for h in ring)
        for neighbour in _histograms_within(counts, relation):
            other = smooth_sensitivity(neighbour[None, :], mechanism, order, beta).smooth_sensitivity
            assert other <= math.exp(beta) * found.smooth_sensitivity * (1 + 1e-9), (counts, neighbour)


def test_release_is_labelled_data_dependent_and_the_statistic_bounds_the_charge():
    rng = np.random.default_rng(8)
    histograms = np.stack([np.bincount(rng.choice(5, 64, p=rng.dirichlet(np.full(5, 0.2))), minlength=5)
                           for _ in range(20)])
    mechanism = ConfidentGNMax(32.0, 8.0, 8.0, ADD_REMOVE)
    release = smooth_sensitivity_release(histograms, mechanism, 10.0, beta=0.04, sigma_ss=5.0, delta=1e-5,
                                         rng=np.random.default_rng(0))
    published = release.published
    assert published["data_dependent"] is True and "not a data-independent DP guarantee" in published["label"]
    assert published["relation"] == "add_or_remove_one"
    assert "smooth_sensitivity" not in published and "statistic" not in published
    assert published["epsilon"] == pytest.approx(published["released_rdp"] + gnss_rdp(10.0, 0.04, 5.0)
                                                 + math.log(1e5) / 9.0)
    charged = sum(mechanism.data_dependent_rdp(h, np.array([10.0]), True, data_dependent_screen=True)[0]
                  for h in histograms)
    assert release.private.charged == pytest.approx(charged, rel=1e-12)
    assert charged <= release.private.statistic <= 20 * mechanism.rdp_values(np.array([10.0]))[0]


@pytest.mark.parametrize("statistic, sensitivity", [(math.inf, 1.0), (1.0, math.inf), (math.nan, 1.0), (1.0, math.nan)])
def test_a_release_without_a_finite_bound_publishes_no_guarantee_and_nan_is_refused(monkeypatch, statistic,
                                                                                     sensitivity):
    """An unbounded statistic or smooth sensitivity publishes +inf (max(0, x) would have made a draw of
    -inf a published 0); a NaN stops the release with one line."""
    import dpledger.mechanisms.pate_smooth_sensitivity as module

    monkeypatch.setattr(module, "smooth_sensitivity", lambda *args, **kwargs: module.SmoothSensitivity(
        statistic, statistic, sensitivity, np.zeros(1)))
    mechanism = ConfidentGNMax(32.0, 8.0, 8.0, ADD_REMOVE)
    release = lambda: smooth_sensitivity_release(np.array([[40, 3, 1]]), mechanism, 10.0, beta=0.04,  # noqa: E731
                                                 sigma_ss=5.0, delta=1e-5,
                                                 rng=np.random.default_rng(4))   # its first draw is negative
    if math.isnan(statistic) or math.isnan(sensitivity):
        with pytest.raises(ValueError, match="must not be NaN"):
            release()
    else:
        assert release().published["epsilon"] == math.inf


@pytest.mark.parametrize("relation, expected", [("add-or-remove-one", 10.73), ("replace-one", 13.78)])
def test_a_confident_gnmax_claim_is_verified_at_its_own_relation(relation, expected):
    # dpledger verify: the DPARGMAX (T = 32, s1 = s2 = 8, 128 queries) at each claimed relation
    from dpledger.audit.claims import claim_from_mapping, verify_claim

    claim = claim_from_mapping({"claim": {"source": "constructed", "epsilon": expected, "delta": 1e-5,
                                          "queries": 128, "relation": relation},
                                "mechanism": {"type": "confident-gnmax", "sigma": 8.0, "sigma_threshold": 8.0,
                                              "threshold": 32.0}})
    verdict = verify_claim(claim)
    released = next(v for v in verdict.variants if v.name == "released-output" and v.conversion == "improved")
    assert released.sound and released.epsilon == pytest.approx(expected, abs=0.01)
