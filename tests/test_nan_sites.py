"""No silent NaN in accounting/, mechanisms/ and decoding/: every site where a privacy quantity
passes through max, min, np.maximum, clamp, np.where, argmin or a comparison is fed a NaN here, and
must raise a ValueError first (never turn the NaN into a number or pick a branch with it).
The audit and report sites are in test_nan_sites_audit_reports.py."""
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from dpledger.accounting import DEFAULT_ORDERS, PrivacyLedger, RdpCurve, delta_from_rdp
from dpledger.mechanisms import (GNMax, Mechanism, NoisyScreening, PMixED, PoissonSubsampledGaussian, amplified_rdp,
                        data_dependent_gnmax_rdp, data_dependent_pmixed_values, log_q_gnmax, theorem_3_1_epsilon)
from dpledger.mechanisms.kernels import mixing_weights, renyi_divergence_orders
from dpledger.mechanisms.leave_one_out import leave_one_out_divergences
from tests.conftest import lm_like

NAN = float("nan")
ORDERS = np.asarray(DEFAULT_ORDERS)


def test_amplification_with_a_nan_base_raises():
    """subsampling.amplified_rdp: logsumexp then max(0, total) would turn NaN into 0."""
    with pytest.raises(ValueError, match="NaN"):
        amplified_rdp(0.5, lambda ks: np.where(ks > 3, np.nan, 1.0), np.array([2.0, 5.0]), general=True)


def test_amplification_at_rate_one_never_forms_minus_inf_plus_inf():
    """subsampling.amplified_rdp: (1-q)^(A-k) = 0 times e^{inf} was -inf + inf = NaN -> max(0, NaN) = 0."""
    values = amplified_rdp(1.0, lambda ks: np.where(ks <= 2, 0.3, np.inf), np.array([2.0, 3.0]), general=False)
    assert values.tolist() == [0.3, math.inf]


def test_a_mechanism_whose_formula_gives_nan_raises():
    """base.Mechanism: every subclass's rdp_values output is checked, whatever its formula."""

    @dataclass(frozen=True)
    class Broken(Mechanism):
        def rdp_values(self, orders):
            return np.where(orders > 4, np.nan, 0.1)

    with pytest.raises(ValueError, match="Broken gave a NaN RDP value at order 4.1"):
        Broken().rdp_curve()
    with pytest.raises(ValueError, match="order must be finite and > 1, got nan"):
        Broken().rdp_values(np.array([np.nan]))


def test_curves_and_ledgers_refuse_nan():
    """curve.RdpCurve and ledger.charge_many: composition adds values, so a NaN would spread."""
    with pytest.raises(ValueError, match="must not be NaN"):
        RdpCurve((2.0,), np.array([NAN]))
    with pytest.raises(ValueError, match="NaN RDP values"):
        PrivacyLedger((2.0,)).charge_many({"step": (np.array([[NAN]]), False)})


def test_delta_with_a_zero_rdp_value_has_no_minus_inf_plus_inf():
    """conversion.delta_from_rdp: the rounding slack added to log delta = -inf gave NaN, and argmin
    then picked it; a zero RDP value is an exact delta of 0."""
    result = delta_from_rdp(RdpCurve((2.0, 3.0), np.array([0.0, 1.0])), 0.5)
    assert result.delta == 0.0 and result.order == 2.0
    result = delta_from_rdp(RdpCurve((2.0, 3.0), np.array([1.0, 2.0])), 0.5)
    assert 0 < result.delta < 1 and not math.isnan(result.log_delta)


def test_gnmax_nan_log_q_counts_and_sigma_raise():
    """pate.data_dependent_gnmax_rdp: `log_q >= 0` and `isfinite` branches returned zeros for NaN."""
    with pytest.raises(ValueError, match="log_q must be <= 0 and not NaN"):
        data_dependent_gnmax_rdp(NAN, 1.0, ORDERS)
    with pytest.raises(ValueError, match="counts must be finite non-negative integers, got nan"):
        log_q_gnmax([NAN, 1.0], 1.0)
    with pytest.raises(ValueError, match="sigma must be finite, got nan"):
        data_dependent_gnmax_rdp(-3.0, NAN, ORDERS)


def test_gnmax_log_q_below_the_smallest_float_is_rounded_up_not_to_zero():
    values = GNMax(1e-3).data_dependent_rdp([10**6, 0], np.array([2.0, 10.0]), "from_actual")
    assert np.all(values > 0)


def test_theorem_3_1_with_nan_parameters_raises():
    """pmixed.theorem_3_1_epsilon: np.where(n > 1, ...) sent a NaN N to the 0 branch."""
    for args in ((NAN, 0.1, 3), (6.0, NAN, 3), (6.0, 0.1, NAN)):
        with pytest.raises(ValueError, match="nan"):
            theorem_3_1_epsilon(*args)


def test_divergence_kernel_refuses_nan_inputs():
    """kernels.renyi_divergence_orders: the shift `shift[~isfinite] = 0` and np.maximum(result, 0)
    would carry a NaN out as a divergence."""
    log_p = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    log_q = torch.tensor([[NAN, math.log(0.5)]], dtype=torch.float64)
    with pytest.raises(ValueError, match="Renyi divergence is NaN in row 0"):
        renyi_divergence_orders(log_p, log_q, torch.tensor([2.0], dtype=torch.float64))


def test_mixing_weights_of_a_nan_teacher_raise_instead_of_lambda_one(rng):
    """kernels.mixing_weights: `excess(...) > 0` is False for NaN, so a NaN teacher was never
    iterated and kept lambda = 1 (full weight on garbage)."""
    teachers = torch.from_numpy(lm_like(rng, 6, batch=(3,)))
    teachers[1] = NAN
    public = torch.from_numpy(lm_like(rng, 6))
    with pytest.raises(ValueError, match="NaN"):
        mixing_weights(teachers, public, 6.0, 0.6)


def test_leave_one_out_with_nan_raises(rng):
    """leave_one_out.leave_one_out_divergences: `.clamp_min(0)` keeps NaN, `.max` over teachers picks it."""
    mixed = torch.from_numpy(lm_like(rng, 6, batch=(3,)))
    mixed[0, 2] = NAN
    with pytest.raises(ValueError, match="NaN"):
        leave_one_out_divergences(mixed, torch.tensor([2.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="lambdas must be in \\[0, 1\\], got nan"):
        data_dependent_pmixed_values(lm_like(rng, 6, batch=(3,)), lm_like(rng, 6), [NAN, 1.0, 1.0], DEFAULT_ORDERS)


def test_screening_statistic_with_nan_or_inf_inputs_raises(rng):
    """screening.statistic_from_mean: `torch.where(total > 0, stat, inf)` and `statistic <= T`
    turned a NaN teacher into +inf (a fail, silently) and an inf public entry into passed=False."""
    screening = NoisyScreening(3, 1e-4, 1e-2)
    teachers = torch.from_numpy(lm_like(rng, 8, batch=(1, 3)))
    public = torch.from_numpy(lm_like(rng, 8, batch=(1,)))
    bad_teachers = teachers.clone()
    bad_teachers[0, 1] = NAN
    with pytest.raises(ValueError, match="NaN"):
        screening.statistics(bad_teachers, public, torch.Generator().manual_seed(0))
    bad_public = public.clone()
    bad_public[0, 0] = math.inf
    with pytest.raises(ValueError, match="NaN"):
        screening.statistics(teachers, bad_public, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("mechanism", [
    {"type": "pmixed", "alpha": 6.0, "beta": 0.1},
    {"type": "pmixed", "alpha": 6.0, "beta": 0.1, "sample_rate": 0.5},
    {"type": "adapmixed", "alpha": 6.0, "beta": 0.1, "lam": 1e-4, "sigma": 1e-2, "threshold": 4.5, "top_k": 4},
    {"type": "adapmixed", "alpha": 6.0, "beta": 0.1, "lam": 1e-4, "sigma": 1e-2, "threshold": 4.5, "top_k": 4,
     "screening": False}])
def test_decode_runners_refuse_a_nan_teacher_distribution(rng, mechanism):
    """dpledger.decoding.runners: a NaN logit makes a NaN softmax row; it used to get lambda = 1 and a
    charged data-dependent loss of 0 (AdaPMixED) or crash in torch.multinomial."""
    from dpledger.decoding.runners import build_runner

    runner = build_runner(mechanism, teachers=3)
    public = torch.from_numpy(lm_like(rng, 8, batch=(2,)))
    teachers = torch.from_numpy(lm_like(rng, 8, batch=(2, 3)))
    teachers[1, 1] = NAN
    with pytest.raises(ValueError, match="NaN"):
        runner.process(public, teachers, torch.Generator().manual_seed(0), np.asarray(DEFAULT_ORDERS))


def test_dp_accounting_nan_is_refused(monkeypatch):
    """gaussian.PoissonSubsampledGaussian: np.minimum with a NaN from dp-accounting stays NaN."""
    from dp_accounting.rdp import rdp_privacy_accountant

    monkeypatch.setattr(rdp_privacy_accountant, "_compute_rdp_poisson_subsampled_gaussian",
                        lambda q, sigma, orders: np.full(np.shape(orders), np.nan))
    with pytest.raises(ValueError, match="dp-accounting returned a NaN RDP value"):
        PoissonSubsampledGaussian(1.0, 0.5).rdp_curve()


def test_pmixed_output_with_nan_lambdas_raises(rng):
    with pytest.raises(ValueError, match="lambdas must be in \\[0, 1\\], got nan"):
        PMixED(6.0, 0.1, 3).output_distribution(lm_like(rng, 5, batch=(3,)), lm_like(rng, 5), [NAN, 1.0, 1.0])
