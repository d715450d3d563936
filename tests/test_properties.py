"""Metamorphic properties of every curve, mechanism class and conversion, on generated inputs.

Each property is one that theory gives, checked without reference values: permuting the order grid
changes no value at any order; q = 1 is the unsampled mechanism and q = 0 costs nothing for every
subsampling variant; monotonicity in q, sigma, beta, the order, N and lam; k-fold composition is k
times one step; a ledger's total is the composition of its charges in any order; epsilon is
non-increasing in delta, delta in epsilon, and the two conversions round-trip.
Example counts are fixed (derandomised) so the suite is reproducible; see EXAMPLES.
"""
import dataclasses
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dpledger.accounting.conversion import rdp_branch_rounding_slack
from dpledger.accounting import (DEFAULT_ORDERS, ConversionMethod, GridEdgeWarning, PrivacyLedger, RdpCurve, compose_curves,
                        delta_from_rdp, epsilon_from_rdp)
from dpledger.mechanisms import (Ball, ConfidentGNMax, GaussianMechanism, GNMax, NoisyScreening, PMixED, PoissonSubsampledGaussian,
                        SubsampledPMixED, SubsamplingVariant, amplified_rdp, data_dependent_pmixed_values,
                        poisson_subsample, self_compose, theorem_3_1_epsilon)
from tests.conftest import examples

EXAMPLES = 60
"""Generated cases per property in the default run; the slow run (pytest -m slow, the "slow"
hypothesis profile: tests/conftest.py) runs SLOW_EXAMPLES."""
SLOW_EXAMPLES = 1000

orders_st = st.lists(st.floats(1.01, 1024.0), min_size=1, max_size=12, unique_by=lambda o: round(o, 10))
rdp_value_st = st.one_of(st.floats(0.0, 1e4), st.just(math.inf), st.just(0.0), st.floats(0.0, 1e-12))
delta_st = st.floats(1e-12, 0.5)
q_st = st.sampled_from([0.0, 1e-6, 1e-3, 0.03, 0.3, 0.5, 0.999, 1.0])
teachers_st = st.sampled_from([1, 2, 3, 10, 100, 1000])


@st.composite
def curves(draw, min_size=1):
    orders = draw(orders_st.filter(lambda o: len(o) >= min_size))
    values = draw(st.lists(rdp_value_st, min_size=len(orders), max_size=len(orders)))
    return RdpCurve(tuple(orders), np.array(values))


@st.composite
def mechanisms(draw):
    """A data-independent mechanism of any class, with generated parameters."""
    kind = draw(st.sampled_from(["gaussian", "subsampled-gaussian", "pmixed", "subsampled-pmixed", "screening",
                                 "gnmax", "confident-gnmax", "poisson-gaussian"]))
    sigma = draw(st.floats(0.05, 100.0))
    if kind == "gaussian":
        return GaussianMechanism(sigma)
    if kind == "subsampled-gaussian":
        return PoissonSubsampledGaussian(sigma, draw(q_st))
    if kind == "poisson-gaussian":
        return poisson_subsample(GaussianMechanism(sigma), draw(q_st), draw(st.booleans()))
    if kind == "screening":
        return NoisyScreening(draw(teachers_st), draw(st.floats(0.0, 1.0)), sigma)
    if kind == "gnmax":
        return GNMax(sigma)
    if kind == "confident-gnmax":
        return ConfidentGNMax(draw(st.floats(0.0, 300.0)), draw(st.floats(0.05, 100.0)), sigma)
    pmixed = PMixED(draw(st.floats(1.5, 64.0)), draw(st.floats(0.0, 1.0)), draw(teachers_st))
    if kind == "pmixed":
        return pmixed
    variant = draw(st.sampled_from([v for v in SubsamplingVariant if not v.uses_realised_sizes]))
    if variant is SubsamplingVariant.ALL_ORDERS_BALL:
        pmixed = dataclasses.replace(pmixed, ball=Ball.ALL_ORDERS)
    return SubsampledPMixED(pmixed, draw(q_st), variant)


def quiet(function, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        return function(*args, **kwargs)


# permuting the order grid ---------------------------------------------------------------------------

def check_permuting_a_curves_orders_changes_no_value(curve, random):
    permutation = list(range(len(curve.orders)))
    random.shuffle(permutation)
    shuffled = RdpCurve(tuple(curve.orders[i] for i in permutation), curve.values[permutation])
    for order in curve.orders:
        assert shuffled.value_at(order) == curve.value_at(order)
    assert RdpCurve.from_dict({**curve.to_dict(), "orders": list(shuffled.orders),
                               "values": shuffled.to_dict()["values"]}).values.tolist() == curve.values.tolist()


test_permuting_a_curves_orders_changes_no_value = examples(EXAMPLES, SLOW_EXAMPLES)(given(curves(), st.randoms(use_true_random=False))(check_permuting_a_curves_orders_changes_no_value))


def check_permuting_the_grid_changes_no_mechanism_value(mechanism, orders, random):
    shuffled = list(orders)
    random.shuffle(shuffled)
    assert mechanism.rdp_curve(orders).values.tolist() == mechanism.rdp_curve(shuffled).values.tolist()
    values = mechanism.rdp_values(np.array(orders))
    again = mechanism.rdp_values(np.array(shuffled))
    lookup = dict(zip(shuffled, again))
    assert [lookup[o] for o in orders] == values.tolist()


test_permuting_the_grid_changes_no_mechanism_value = examples(EXAMPLES, SLOW_EXAMPLES)(given(mechanisms(), orders_st, st.randoms(use_true_random=False))(check_permuting_the_grid_changes_no_mechanism_value))


def check_permuting_the_grid_changes_no_data_dependent_value(teachers, vocab, orders, random):
    rng = np.random.default_rng(random.randrange(2 ** 32))
    probs = rng.dirichlet(np.ones(vocab), size=teachers + 1)
    lambdas = rng.uniform(0, 1, size=teachers)
    shuffled = list(orders)
    random.shuffle(shuffled)
    first = data_dependent_pmixed_values(probs[1:], probs[0], lambdas, orders)
    second = data_dependent_pmixed_values(probs[1:], probs[0], lambdas, shuffled)
    assert first.tolist() == second.tolist()  # both in sorted order of the grid


test_permuting_the_grid_changes_no_data_dependent_value = examples(EXAMPLES, SLOW_EXAMPLES)(given(st.integers(2, 6), st.integers(2, 9), orders_st, st.randoms(use_true_random=False))(check_permuting_the_grid_changes_no_data_dependent_value))


# q = 1 and q = 0 -----------------------------------------------------------------------------------

def check_every_pmixed_variant_at_rate_one_is_pmixed_and_at_rate_zero_is_free(alpha, beta, teachers, orders):
    for variant in SubsamplingVariant:
        ball = Ball.ALL_ORDERS if variant is SubsamplingVariant.ALL_ORDERS_BALL else Ball.PROJECTION_ORDER
        pmixed = PMixED(alpha, beta, teachers, ball=ball)
        unsampled = pmixed.rdp_curve(orders).values
        full = SubsampledPMixED(pmixed, 1.0, variant, teachers if variant.uses_realised_sizes else None)
        empty = SubsampledPMixED(pmixed, 0.0, variant, 0 if variant.uses_realised_sizes else None)
        assert full.rdp_curve(orders).values.tolist() == unsampled.tolist(), variant
        assert not np.any(empty.rdp_curve(orders).values), variant


test_every_pmixed_variant_at_rate_one_is_pmixed_and_at_rate_zero_is_free = examples(EXAMPLES, SLOW_EXAMPLES)(given(st.floats(1.5, 64.0), st.floats(0.0, 1.0), teachers_st, orders_st)(check_every_pmixed_variant_at_rate_one_is_pmixed_and_at_rate_zero_is_free))


def check_subsampled_gaussian_at_rate_one_is_the_gaussian_and_at_zero_is_free(sigma, orders, general):
    gaussian = GaussianMechanism(sigma).rdp_curve(orders).values
    np.testing.assert_allclose(poisson_subsample(GaussianMechanism(sigma), 1.0, general).rdp_curve(orders).values,
                               gaussian, rtol=1e-12)
    np.testing.assert_allclose(PoissonSubsampledGaussian(sigma, 1.0).rdp_curve(orders).values, gaussian, rtol=1e-9)
    assert not np.any(poisson_subsample(GaussianMechanism(sigma), 0.0, general).rdp_curve(orders).values)
    assert not np.any(PoissonSubsampledGaussian(sigma, 0.0).rdp_curve(orders).values)


test_subsampled_gaussian_at_rate_one_is_the_gaussian_and_at_zero_is_free = examples(EXAMPLES, SLOW_EXAMPLES)(given(st.floats(0.05, 100.0), orders_st, st.booleans())(check_subsampled_gaussian_at_rate_one_is_the_gaussian_and_at_zero_is_free))


# monotonicity ----------------------------------------------------------------------------------------

def check_amplification_is_non_decreasing_in_q(base_values, general, rates):
    """For a fixed base curve, Zhu & Wang 2019's bounds grow with the sampling rate."""
    orders = np.arange(2, len(base_values) + 2, dtype=np.float64)
    base = np.maximum.accumulate(np.asarray(base_values))  # a valid RDP curve is non-decreasing in the order

    def base_epsilon(ks):
        return np.interp(ks, orders, base, right=np.inf)

    curves_by_rate = [amplified_rdp(q, base_epsilon, orders, general) for q in sorted(rates)]
    for lower, higher in zip(curves_by_rate, curves_by_rate[1:]):
        assert np.all(lower <= higher * (1 + 1e-12) + 1e-15)


test_amplification_is_non_decreasing_in_q = examples(EXAMPLES, SLOW_EXAMPLES)(given(st.lists(st.floats(0.0, 50.0), min_size=1, max_size=40), st.booleans(),
       st.lists(st.floats(0.0, 1.0), min_size=2, max_size=6))(check_amplification_is_non_decreasing_in_q))


def check_every_curve_is_non_decreasing_in_the_order(mechanism, orders):
    """van Erven & Harremoes 2014, Theorem 3: D_a is non-decreasing in a; so is every valid RDP curve.
    The base class gets there by lowering each value of the mechanism's own formula to its smallest
    at a larger order: never below that suffix minimum, and never above the formula's value."""
    curve = mechanism.rdp_curve(orders)
    values = curve.values
    for lower, higher in zip(values, values[1:]):
        assert higher >= lower * (1 - 1e-12) - 1e-15
    formula = np.asarray(type(mechanism).rdp_values.__wrapped__(mechanism, np.asarray(curve.orders)))
    suffix_minimum = np.minimum.accumulate(formula[::-1])[::-1]
    np.testing.assert_array_equal(values, suffix_minimum)
    assert np.all(values <= formula)


test_every_curve_is_non_decreasing_in_the_order = examples(EXAMPLES, SLOW_EXAMPLES)(given(mechanisms(), orders_st)(check_every_curve_is_non_decreasing_in_the_order))


def check_more_noise_never_costs_more(sigma_a, sigma_b, q, orders):
    small, large = sorted((sigma_a, sigma_b))
    for make in (GaussianMechanism, GNMax, lambda s: PoissonSubsampledGaussian(s, q),
                 lambda s: poisson_subsample(GaussianMechanism(s), q), lambda s: NoisyScreening(10, 0.5, s)):
        assert np.all(make(large).rdp_curve(orders).values <= make(small).rdp_curve(orders).values * (1 + 1e-9) + 1e-15)


test_more_noise_never_costs_more = examples(EXAMPLES, SLOW_EXAMPLES)(given(st.floats(0.05, 100.0), st.floats(0.05, 100.0), q_st, orders_st)(check_more_noise_never_costs_more))


def check_theorem_3_1_grows_with_beta_and_shrinks_with_n(alpha, beta_a, beta_b, n_a, n_b):
    low_beta, high_beta = sorted((beta_a, beta_b))
    few, many = sorted((n_a, n_b))
    assert theorem_3_1_epsilon(alpha, low_beta, few) <= theorem_3_1_epsilon(alpha, high_beta, few)
    assert theorem_3_1_epsilon(alpha, high_beta, many) <= theorem_3_1_epsilon(alpha, high_beta, few) * (1 + 1e-12)


test_theorem_3_1_grows_with_beta_and_shrinks_with_n = examples(EXAMPLES, SLOW_EXAMPLES)(given(st.floats(1.01, 64.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(2, 1000), st.integers(2, 1000))(check_theorem_3_1_grows_with_beta_and_shrinks_with_n))


def check_screening_grows_with_lam_and_shrinks_with_n(n_a, n_b, lam_a, lam_b, sigma):
    few, many = sorted((n_a, n_b))
    low, high = sorted((lam_a, lam_b))
    orders = np.asarray(DEFAULT_ORDERS)
    assert np.all(NoisyScreening(few, low, sigma).rdp_values(orders) <= NoisyScreening(few, high, sigma).rdp_values(orders))
    assert np.all(NoisyScreening(many, high, sigma).rdp_values(orders) <= NoisyScreening(few, high, sigma).rdp_values(orders))


test_screening_grows_with_lam_and_shrinks_with_n = examples(EXAMPLES, SLOW_EXAMPLES)(given(teachers_st, teachers_st, st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.01, 10.0))(check_screening_grows_with_lam_and_shrinks_with_n))


def check_mixing_weights_grow_with_beta(teachers, vocab, alpha, beta_a, beta_b, seed):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(vocab, 0.5), size=teachers + 1)
    probs = np.maximum(probs, 1e-12)
    probs /= probs.sum(axis=-1, keepdims=True)
    low, high = sorted((beta_a, beta_b))
    tight = PMixED(alpha, low, teachers).mixing_weights(probs[1:], probs[0])
    loose = PMixED(alpha, high, teachers).mixing_weights(probs[1:], probs[0])
    assert np.all(tight <= loose + 1e-9)


test_mixing_weights_grow_with_beta = examples(EXAMPLES // 2, SLOW_EXAMPLES // 2)(given(st.integers(2, 5), st.integers(2, 8), st.floats(1.5, 20.0), st.floats(0.001, 0.5), st.floats(0.001, 0.5),
       st.integers(0, 2 ** 32 - 1))(check_mixing_weights_grow_with_beta))


# composition -----------------------------------------------------------------------------------------

def check_k_fold_composition_is_k_times_one_step(curve, times):
    composed = curve.composed(times)
    if times == 0:
        assert not np.any(composed.values)
        return
    summed = compose_curves([curve] * times)
    np.testing.assert_allclose(composed.values, summed.values, rtol=1e-12)
    assert_smallest_float_at_or_above(composed.values, curve.values, times)


def assert_smallest_float_at_or_above(rounded, values, times):
    """Each rounded value is the smallest float >= times * value, exactly (a rational check)."""
    for result, value in zip(np.asarray(rounded, dtype=np.float64), np.asarray(values, dtype=np.float64)):
        if math.isinf(value):
            assert result == math.inf
            continue
        exact = times * Fraction(float(value))
        assert Fraction(float(result)) >= exact
        assert result == 0.0 or Fraction(float(np.nextafter(result, -math.inf))) < exact


test_k_fold_composition_is_k_times_one_step = examples(EXAMPLES, SLOW_EXAMPLES)(given(curves(), st.integers(0, 50))(check_k_fold_composition_is_k_times_one_step))


def check_self_composed_mechanism_is_k_times_its_curve(mechanism, times, orders):
    values = mechanism.rdp_curve(orders).values
    composed = self_compose(mechanism, times).rdp_curve(orders).values
    if times == 0:
        assert not np.any(composed)
    else:
        assert_smallest_float_at_or_above(composed, values, times)


test_self_composed_mechanism_is_k_times_its_curve = examples(EXAMPLES, SLOW_EXAMPLES)(given(mechanisms(), st.integers(0, 30), orders_st)(check_self_composed_mechanism_is_k_times_its_curve))


def check_ledger_total_is_the_composition_of_its_charges_in_any_order(steps, random, delta):
    orders = (1.5, 2.0, 8.0, 64.0)
    shuffled = list(steps)
    random.shuffle(shuffled)
    one_by_one, block, reordered = PrivacyLedger(orders), PrivacyLedger(orders), PrivacyLedger(orders)
    for values in steps:
        one_by_one.charge({"step": RdpCurve(orders, np.array(values))})
    block.charge_many({"step": (np.array(steps), False)})
    for values in shuffled:
        reordered.charge({"step": RdpCurve(orders, np.array(values))})
    expected = np.sum(steps, axis=0)
    for ledger in (one_by_one, block, reordered):
        np.testing.assert_allclose(ledger.total_curve().values, expected, rtol=1e-12)
        assert quiet(ledger.epsilon, delta).epsilon == pytest.approx(
            quiet(epsilon_from_rdp, RdpCurve(orders, expected), delta).epsilon, rel=1e-12)
    breakdown = quiet(one_by_one.breakdown, delta)
    assert sum(row.epsilon for row in breakdown.rows[:-1]) == pytest.approx(breakdown.total, rel=1e-12, abs=1e-12)


test_ledger_total_is_the_composition_of_its_charges_in_any_order = examples(EXAMPLES, SLOW_EXAMPLES)(given(st.lists(st.lists(st.floats(0.0, 100.0), min_size=4, max_size=4), min_size=1, max_size=12),
       st.randoms(use_true_random=False), delta_st)(check_ledger_total_is_the_composition_of_its_charges_in_any_order))


# conversions -----------------------------------------------------------------------------------------

def check_epsilon_is_non_increasing_in_delta(curve, delta_a, delta_b, method):
    small, large = sorted((delta_a, delta_b))
    assert quiet(epsilon_from_rdp, curve, large, method).epsilon <= quiet(epsilon_from_rdp, curve, small, method).epsilon


test_epsilon_is_non_increasing_in_delta = examples(EXAMPLES, SLOW_EXAMPLES)(given(curves(), delta_st, delta_st, st.sampled_from(list(ConversionMethod)))(check_epsilon_is_non_increasing_in_delta))


def check_delta_is_non_increasing_in_epsilon(curve, eps_a, eps_b):
    small, large = sorted((eps_a, eps_b))
    assert quiet(delta_from_rdp, curve, large).delta <= quiet(delta_from_rdp, curve, small).delta


test_delta_is_non_increasing_in_epsilon = examples(EXAMPLES, SLOW_EXAMPLES)(given(curves(), st.floats(0.0, 1e3), st.floats(0.0, 1e3))(check_delta_is_non_increasing_in_epsilon))


def check_delta_of_the_epsilon_of_delta_is_at_most_delta(curve, delta):
    conversion = quiet(epsilon_from_rdp, curve, delta)
    assume(math.isfinite(conversion.epsilon) and conversion.epsilon > 0)
    # epsilon and delta are each rounded up by their documented floating-point error bounds
    slack = rdp_branch_rounding_slack(conversion.order, conversion.rdp_at_order, conversion.epsilon)
    assert quiet(delta_from_rdp, curve, conversion.epsilon).delta <= delta * math.exp(slack) * (1 + 1e-12)


test_delta_of_the_epsilon_of_delta_is_at_most_delta = examples(EXAMPLES, SLOW_EXAMPLES)(given(curves(), delta_st)(check_delta_of_the_epsilon_of_delta_is_at_most_delta))


def check_epsilon_of_the_delta_of_epsilon_round_trips(values, orders, epsilon):
    """With RDP values >= 1 the total-variation bound is never the tighter one, so the improved
    conversion and its inverse meet exactly at the optimal order."""
    size = min(len(values), len(orders))
    curve = RdpCurve(tuple(orders[:size]), np.maximum.accumulate(np.array(values[:size])))
    delta = quiet(delta_from_rdp, curve, epsilon).delta
    assume(1e-300 < delta < 0.5)
    back = quiet(epsilon_from_rdp, curve, delta).epsilon
    assert back <= epsilon + 1e-9 * (1 + epsilon)
    assert back >= epsilon - 1e-6 * (1 + epsilon)


test_epsilon_of_the_delta_of_epsilon_round_trips = examples(EXAMPLES, SLOW_EXAMPLES)(given(st.lists(st.floats(1.0, 1e3), min_size=1, max_size=8), orders_st, st.floats(0.0, 1e3))(check_epsilon_of_the_delta_of_epsilon_round_trips))

