"""Regression tests, with exactly the reported inputs, for numbers that were printed far below the
truth (or returned where a ValueError belongs). Each test names the defect it pins down."""
import json

import mpmath
import numpy as np
import pytest
import torch

from dpledger.accounting import (DEFAULT_ORDERS, DivergenceDirection, NeighbouringRelation, PrivacyLedger, RdpCurve,
                        default_orders, delta_from_rdp, epsilon_from_rdp)
from dpledger.cli import main
from dpledger.mechanisms import (GaussianMechanism, GNMax, PMixED, PoissonSubsampledGaussian, SubsampledPMixED,
                        SubsamplingVariant, ThresholdWeightedSampler, amplified_rdp, beta_from_budget,
                        data_dependent_gnmax_rdp, data_dependent_pmixed_curve, data_dependent_pmixed_values,
                        poisson_subsample, renyi_divergence, theorem_3_1_epsilon)
from tests import oracles as O
from tests.conftest import lm_like

UNSORTED = (64.0, 32.0, 16.0, 8.0, 4.0, 2.0)


# 1. unsorted order grid ------------------------------------------------------------------------------

def test_unsorted_orders_keep_each_value_with_its_order():
    sorted_eps = epsilon_from_rdp(RdpCurve(sorted(UNSORTED), np.array(sorted(UNSORTED)) / 2), 1e-5).epsilon
    unsorted_eps = epsilon_from_rdp(RdpCurve(UNSORTED, np.array(UNSORTED) / 2), 1e-5).epsilon
    assert sorted_eps == pytest.approx(5.0879, abs=1e-4)
    assert unsorted_eps == sorted_eps
    curve = RdpCurve(UNSORTED, np.array(UNSORTED) / 2)
    for order in UNSORTED:
        assert curve.value_at(order) == order / 2


def test_unsorted_orders_through_from_dict_and_the_ledger():
    record = {"orders": list(UNSORTED), "values": [o / 2 for o in UNSORTED], "relation": "add_or_remove_one",
              "data_dependent": False}
    assert epsilon_from_rdp(RdpCurve.from_dict(record), 1e-5).epsilon == pytest.approx(5.0879, abs=1e-4)
    ledger = PrivacyLedger(UNSORTED)
    ledger.charge_many({"step": (np.array([UNSORTED]) / 2, False)})  # columns follow the orders as given
    assert ledger.epsilon(1e-5).epsilon == pytest.approx(5.0879, abs=1e-4)
    data = ledger.to_dict()
    data["orders"] = list(UNSORTED)
    with pytest.raises(ValueError, match="different order grid"):
        PrivacyLedger.from_dict({**data, "orders": [2.0, 4.0]})
    assert PrivacyLedger.from_dict(data).epsilon(1e-5).epsilon == pytest.approx(5.0879, abs=1e-4)


def test_repeated_orders_are_refused():
    with pytest.raises(ValueError, match="distinct"):
        RdpCurve((2.0, 4.0, 2.0), np.array([1.0, 2.0, 0.5]))


# 2. subsampling rate 1 --------------------------------------------------------------------------------

def test_cli_sample_rate_one_equals_no_subsampling(capsys):
    base = ["account", "pmixed", "--alpha", "6", "--beta", "0.01", "--teachers", "100", "--queries", "1000",
            "--delta", "1e-5", "--json"]
    assert main(base) == 0
    unsampled = json.loads(capsys.readouterr().out)["epsilon"]
    assert unsampled == pytest.approx(6.35, abs=0.01)
    assert main(base + ["--sample-rate", "1.0"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["epsilon"] == pytest.approx(unsampled, rel=1e-12)
    assert main(base + ["--ball", "all-orders"]) == 0
    unsampled_all_orders = json.loads(capsys.readouterr().out)["epsilon"]
    for variant in record["variants"]:
        expected = unsampled_all_orders if variant["name"] == "all-orders-ball" else unsampled
        assert variant["epsilon"] == pytest.approx(expected, rel=1e-12), variant["name"]


def test_amplification_at_rate_one_keeps_infinite_orders_infinite():
    base = lambda ks: np.where(ks <= 6.0, 0.5, np.inf)  # noqa: E731  (a PMixED-like curve)
    orders = np.asarray(default_orders(6.0))
    for general in (False, True):
        values = amplified_rdp(1.0, base, orders, general)
        np.testing.assert_array_equal(values, base(orders))
        assert np.all(np.isinf(values[orders > 6]))


def test_decode_runner_with_rate_one_charges_the_unsampled_curve():
    from dpledger.decoding.runners import pmixed_runner

    rng = np.random.default_rng(0)
    runner = pmixed_runner(6.0, 0.01, 4, sample_rate=1.0)
    public = torch.from_numpy(lm_like(rng, 12, batch=(3,)))
    teachers = torch.from_numpy(lm_like(rng, 12, batch=(3, 4)))
    orders = np.asarray(default_orders(6.0))
    outcome = runner.process(public, teachers, torch.Generator().manual_seed(0), orders)
    (charged,) = outcome.charged.values()
    np.testing.assert_array_equal(charged, np.broadcast_to(PMixED(6.0, 0.01, 4).rdp_values(orders), charged.shape))


def test_realised_size_must_match_a_certain_rate():
    with pytest.raises(ValueError, match="realised_size must be 100"):
        SubsampledPMixED(PMixED(6.0, 0.01, 100), 1.0, SubsamplingVariant.REALISED_SIZE, 3)


# 3. GNMax on a non-finite histogram -------------------------------------------------------------------

def test_gnmax_refuses_non_finite_histograms_and_bad_log_q():
    orders = np.asarray(DEFAULT_ORDERS)
    with pytest.raises(ValueError, match="finite non-negative integers"):
        GNMax(1.0).data_dependent_rdp(np.array([np.inf, np.inf, 0.0]), orders)
    with pytest.raises(ValueError, match="log_q"):
        data_dependent_gnmax_rdp(float("nan"), 1.0, orders)
    with pytest.raises(ValueError, match="log_q"):
        data_dependent_gnmax_rdp(0.5, 1.0, orders)
    with pytest.raises(ValueError, match="order"):
        data_dependent_gnmax_rdp(-3.0, 1.0, np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="order"):
        data_dependent_gnmax_rdp(-3.0, 1.0, np.array([0.5]))


# 4. delta underflow -----------------------------------------------------------------------------------

def test_delta_of_a_tiny_gaussian_loss_is_not_zero():
    result = delta_from_rdp(GaussianMechanism(1e9).rdp_curve(), 0.0)
    # order 1.1: TV bound sqrt(1 - exp(-1.1 / 2e18))
    mpmath.mp.dps = 50
    exact = float(mpmath.sqrt(-mpmath.expm1(-mpmath.mpf(1.1) / (2 * mpmath.mpf(10) ** 18))))
    assert result.delta == pytest.approx(7.416e-10, rel=1e-3)
    assert exact <= result.delta <= exact * (1 + 2e-15 * (1 + abs(result.log_delta)))


@pytest.mark.parametrize("rdp", [1e-16, 3e-15, 1e-14, 1e-13, 1e-12, 1e-300])
def test_delta_for_tiny_rdp_values_keeps_its_digits(rdp):
    mpmath.mp.dps = 50
    curve = RdpCurve((2.0,), np.array([rdp]))
    exact = float(mpmath.sqrt(-mpmath.expm1(-mpmath.mpf(rdp))))
    result = delta_from_rdp(curve, 0.0)
    assert exact <= result.delta <= exact * (1 + 2e-15 * (1 + abs(result.log_delta)))


def test_a_delta_that_underflows_is_rounded_up_not_to_zero():
    result = delta_from_rdp(RdpCurve((2.0,), np.array([1.0])), 2000.0)
    assert result.log_delta < -745 and result.delta > 0


# 5. unchecked inputs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha, beta, teachers, match", [
    (6, -0.01, 10, "beta"), (1, 0.01, 10, "alpha"), (6, 0.01, -3, "teachers"), (6, 0.01, 2.5, "teachers"),
    (float("nan"), 0.01, 10, "alpha"), (6, float("nan"), 10, "beta"), (6, 0.01, float("inf"), "teachers")])
def test_theorem_3_1_refuses_bad_parameters(alpha, beta, teachers, match):
    with pytest.raises(ValueError, match=match):
        theorem_3_1_epsilon(alpha, beta, teachers)


@pytest.mark.parametrize("lambdas", [[1.5, 1.0, 1.0], [-0.5, 1.0, 1.0], [1.0, 1.0], [[1.0, 1.0, 1.0]] * 2,
                                     [float("nan"), 1.0, 1.0]])
def test_data_dependent_pmixed_refuses_bad_lambdas(rng, lambdas):
    teachers, public = lm_like(rng, 5, batch=(3,)), lm_like(rng, 5)
    with pytest.raises(ValueError, match="lambdas"):
        data_dependent_pmixed_curve(PMixED(6.0, 0.1, 3), teachers, public, np.asarray(lambdas))
    with pytest.raises(ValueError, match="lambdas"):
        data_dependent_pmixed_values(teachers, public, np.asarray(lambdas), DEFAULT_ORDERS)


@pytest.mark.parametrize("counts", [[3, float("nan"), 1], [3, -1, 1], [3, 1.5, 1], [3, float("inf"), 1]])
def test_threshold_sampler_refuses_bad_counts(counts):
    with pytest.raises(ValueError, match="counts must be finite non-negative integers"):
        ThresholdWeightedSampler(threshold=2, gamma=1.0).probabilities(counts)


def test_amplification_refuses_a_negative_base():
    with pytest.raises(ValueError, match=">= 0"):
        amplified_rdp(0.1, lambda ks: np.full_like(ks, -0.5), np.array([2.0, 3.0]), True)
    with pytest.raises(ValueError, match="NaN"):
        amplified_rdp(0.1, lambda ks: np.full_like(ks, np.nan), np.array([2.0, 3.0]), True)


def test_conversions_refuse_an_array_instead_of_a_curve():
    with pytest.raises(ValueError, match="RdpCurve"):
        epsilon_from_rdp(np.array([1.0, 2.0]), 1e-5)
    with pytest.raises(ValueError, match="RdpCurve"):
        delta_from_rdp(np.array([1.0, 2.0]), 1.0)


# 6. GNMax direction, carried to the ledger ------------------------------------------------------------

def test_ledger_records_a_one_direction_component_and_its_total():
    gnmax = GNMax(1.0)
    ledger = PrivacyLedger(DEFAULT_ORDERS, NeighbouringRelation.REPLACE_ONE)
    ledger.charge({"gnmax": gnmax.data_dependent_curve([9, 1], DEFAULT_ORDERS, DivergenceDirection.FROM_ACTUAL)})
    ledger.charge({"gnmax": gnmax.rdp_curve()})
    assert ledger.total_curve().direction is DivergenceDirection.FROM_ACTUAL
    breakdown = ledger.breakdown(1e-5).to_dict()
    assert breakdown["direction"] == "from_actual"
    assert breakdown["rows"][0]["direction"] == "from_actual"
    restored = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert restored.total_curve().direction is DivergenceDirection.FROM_ACTUAL


# found by the differential suite and an adversarial review after the report -----------------------

def test_leave_one_out_does_not_cancel_when_one_teacher_holds_a_token():
    """p_{-i} was (N p - pbar_i) / (N - 1): 1 - 0.9999999999999999 lost every digit (33.96 vs 34.58)."""
    teachers, public = [[0.5, 0.5], [1.0 - 6e-17, 6e-17]], [0.5, 0.5]
    got = data_dependent_pmixed_values(np.array(teachers), np.array(public), np.array([1.0, 1.0]), [2.0])[0]
    exact = O.data_dependent_loss(teachers, public, [1.0, 1.0], 2.0)
    assert float(exact) <= got <= float(exact) * (1 + 1e-9)


def test_beta_from_a_budget_never_overspends_it():
    """log N + x + log1p((1-N) e^-x / N) cancels for small x: 8.9e-7 relative too large a beta."""
    for budget, queries, alpha, teachers in ((0.01, 10**6, 1.01, 1000), (1e-10, 10**6, 2.0, 10),
                                             (3.909e-08, 10**6, 1.0001, 185031)):
        beta = beta_from_budget(budget, queries, alpha, teachers)
        assert beta > 0
        spent = O.theorem_3_1_epsilon(alpha, beta, teachers) * queries
        assert spent <= budget * (1 + 1e-15), (budget, queries, alpha, teachers)


def test_rows_summing_to_less_than_one_are_renormalised():
    """The kernel used rows summing to c < 1 as given: 0 instead of 7.5e-5 at order 1.5."""
    c = 1 - 0.99e-4
    got = renyi_divergence(np.array([0.505, 0.495]) * c, np.array([0.5, 0.5]) * c, 1.5, symmetric=True)
    assert got >= float(O.symmetric_renyi_divergence([0.505, 0.495], [0.5, 0.5], 1.5))


def test_two_different_laws_never_have_divergence_zero():
    """Rounding made D_2((1/2 + 2^-30, 1/2 - 2^-30) || uniform) = 3.5e-18 exactly 0, and a zero on a
    curve makes delta 0 at every epsilon (the total variation is 9.3e-10)."""
    p, q = [0.5 + 2 ** -30, 0.5 - 2 ** -30], [0.5, 0.5]
    got = renyi_divergence(np.array(p), np.array(q), np.array([1.5, 2.0]))
    exact = [float(O.renyi_divergence(p, q, a)) for a in (1.5, 2.0)]
    assert np.all(got >= exact) and np.all(got > 0)
    delta = delta_from_rdp(RdpCurve((1.5, 2.0), got), 0.0).delta
    assert delta >= 2 ** -30  # at least the total variation between p and q
    assert renyi_divergence(np.array(q), np.array(q), 2.0) == 0.0  # identical laws: exactly 0


def test_amplification_at_a_tiny_rate_is_not_zero():
    """(1-q)^(A-1)(1 + (A-1)q) + ... cancelled: 0 instead of 1.76e-34 at q = 2.4e-16, order 45."""
    got = poisson_subsample(GaussianMechanism(86.02), 2.406e-16, general=False).rdp_values(np.array([45.0]))[0]
    exact = float(O.amplified_rdp(2.406e-16, lambda k: k / (2 * 86.02 ** 2), 45, general=False))
    assert exact <= got <= exact * (1 + 1e-9)
    gaussian = PoissonSubsampledGaussian(1.0, 1e-8).rdp_values(np.array([2.0]))[0]
    assert gaussian >= float(O.subsampled_gaussian_rdp(1e-8, 1.0, 2))  # dp-accounting was 3e-7 relative low


def test_conversion_near_order_one_keeps_its_digits():
    """log1p(-1/a) loses the digits of 1 - 1/a: 7.3e-9 below at order 1.0000000075."""
    got = epsilon_from_rdp(RdpCurve((1.0000000075,), np.array([0.1])), 1 - 1e-6).epsilon
    assert got >= float(O.epsilon_improved([1.0000000075], [0.1], 1 - 1e-6))


def test_orders_are_never_rounded_upward():
    """1.00000000016 was kept as 1.0000000002: the value then claimed a higher order (eps 20% low)."""
    curve = RdpCurve((1.00000000016,), np.array([1e-3]))
    assert curve.orders[0] <= 1.00000000016
    assert epsilon_from_rdp(curve, 0.5).epsilon >= float(O.epsilon_improved([1.00000000016], [1e-3], 0.5))


def test_subsampled_gaussian_at_tiny_rates_and_extreme_noise():
    """dp-accounting's fractional series gave 0 (exact 1.4e-17) at q = 1e-8, order 1.0000001, and
    raised ZeroDivisionError / OverflowError for sigma 1e-300 / 1e160; order 1e12 ran out of memory."""
    low = PoissonSubsampledGaussian(2.0, 1e-8).rdp_values(np.array([1.0000001]))[0]
    assert low >= float(O.subsampled_gaussian_rdp(1e-8, 2.0, 2)) * 0.49  # >= exact 1.42e-17 (half of order 2)
    for sigma in (1e-300, 1e160):
        curve = PoissonSubsampledGaussian(sigma, 0.5).rdp_curve()
        assert np.all(curve.values > 0)
    assert PoissonSubsampledGaussian(1.0, 0.01).rdp_values(np.array([1e12]))[0] == 1e12 / 2


def test_losses_that_underflow_are_never_zero():
    """GaussianMechanism(1e160) gave an all-zero curve, i.e. epsilon 0 as if it read no data."""
    assert epsilon_from_rdp(GaussianMechanism(1e160).rdp_curve(), 1e-5).epsilon > 0
    assert delta_from_rdp(PoissonSubsampledGaussian(1.0, 1e-200).rdp_curve(), 0.0).delta > 0
    with pytest.raises(ValueError, match="beta underflows"):
        beta_from_budget(1e-320, 10**6, 1.0000001, 2)


def test_a_loss_that_is_exactly_zero_stays_zero(rng):
    """With every lambda 0 all neighbours release the public model: sum/N and sum/(N-1) differed in the
    last ulp and the rounding-up turned 0 into epsilon 0.0035."""
    teachers, public = lm_like(rng, 100, batch=(7,)), lm_like(rng, 100)
    curve = data_dependent_pmixed_curve(PMixED(6.0, 0.0, 7), teachers, public)
    assert not np.any(curve.values) and epsilon_from_rdp(curve, 1e-5).epsilon == 0.0
    same = np.stack([public] * 4)
    assert not np.any(data_dependent_pmixed_values(same, public, np.ones(4), DEFAULT_ORDERS))
