"""Screening, AdaPMixED's data-dependent curve, the ledger's Table-2b breakdown and the budget."""

import numpy as np
import pytest
import torch

from dpledger.accounting import DEFAULT_ORDERS, PrivacyLedger, RdpBudget, RdpCurve
from dpledger.mechanisms import (AdaPMixED, CustomCurveMechanism, GaussianMechanism, GNMax, NoisyScreening, PMixED, compose,
                        data_dependent_pmixed_curve, renyi_divergence, self_compose)
from tests.conftest import lm_like

ORDERS = np.asarray(DEFAULT_ORDERS)


def test_screening_total_over_paper_run_is_0_00175():
    screening = NoisyScreening(teachers=100, lam=1e-4, sigma=1e-2)
    total = screening.rdp_curve().composed(9728).value_at(18)
    assert total == pytest.approx(9728 * (1e-4 / (100 * 1e-2)) ** 2 * 18, rel=1e-14)
    assert round(total, 5) == 0.00175


def test_screening_curve_equals_gaussian_mechanism_with_its_sensitivity():
    screening = NoisyScreening(teachers=10, lam=0.01, sigma=0.002)
    gaussian = GaussianMechanism(noise_multiplier=screening.sigma / screening.l2_sensitivity)
    np.testing.assert_allclose(screening.rdp_values(ORDERS), gaussian.rdp_values(ORDERS), rtol=1e-12)


def test_screening_passes_when_teachers_agree_with_public_and_fails_when_they_do_not(rng):
    public = lm_like(rng, 200)
    generator = torch.Generator().manual_seed(0)
    same = NoisyScreening(teachers=4, lam=0.5, sigma=1e-4, threshold=0.5).screen(np.stack([public] * 4), public, generator)
    assert same.passed and same.statistic < 0.01
    far = lm_like(rng, 200, (4,))
    different = NoisyScreening(teachers=4, lam=0.9, sigma=1e-4, threshold=0.05).screen(far, public, generator)
    assert not different.passed


def test_data_dependent_curve_equals_explicit_leave_one_out_loop(rng):
    n, vocab = 5, 60
    teachers, public = lm_like(rng, vocab, (n,)), lm_like(rng, vocab)
    pmixed = PMixED(18, 0.05, n)
    lambdas = pmixed.mixing_weights(teachers, public)
    curve = data_dependent_pmixed_curve(pmixed, teachers, public, lambdas)
    assert curve.data_dependent
    mixed = lambdas[:, None] * teachers + (1 - lambdas[:, None]) * public
    p = mixed.mean(axis=0)
    for order in (2.0, 18.0, 63.0):
        reference = max(renyi_divergence(p, np.delete(mixed, i, axis=0).mean(axis=0), order, symmetric=True)
                        for i in range(n))
        assert curve.value_at(order) == pytest.approx(reference, rel=1e-10)


def test_data_dependent_curve_is_non_decreasing_in_order(rng):
    teachers, public = lm_like(rng, 80, (6,)), lm_like(rng, 80)
    values = data_dependent_pmixed_curve(PMixED(18, 0.2, 6), teachers, public).values
    assert np.all(np.diff(values) >= -1e-12)


def test_adapmixed_paper_defaults_and_mismatch():
    ada = AdaPMixED.paper_defaults()
    assert (ada.pmixed.alpha, ada.pmixed.beta, ada.screening.threshold, ada.screening.top_k) == (18, 0.2, 4.5, 60)
    with pytest.raises(ValueError, match="screening teachers"):
        AdaPMixED(PMixED(18, 0.2, 10), NoisyScreening(teachers=9, lam=1e-4, sigma=1e-2))


def table_2b_ledger():
    ledger = PrivacyLedger()
    screening = NoisyScreening(teachers=100, lam=1e-4, sigma=1e-2).rdp_curve()
    # as in the paper, the data-dependent loss is known at orders up to 18 only
    per_step = RdpCurve(DEFAULT_ORDERS, np.where(ORDERS <= 18, ORDERS * 3e-6, np.inf), data_dependent=True)
    for step in range(9728):
        components = {"screen": screening}
        if step % 10:
            components["pmixed_data_dependent"] = per_step
        ledger.charge(components)
    return ledger


def test_breakdown_rows_sum_to_total_and_conversion_row_is_0_450_at_18():
    ledger = table_2b_ledger()
    breakdown = ledger.breakdown(1e-5)
    assert breakdown.conversion.order == 18.0
    rows = {row.component: row.epsilon for row in breakdown.rows}
    assert rows["screen"] == pytest.approx(0.00175, abs=5e-6)
    assert rows["RDP to DP (improved)"] == pytest.approx(0.450, abs=5e-4)
    parts = [row.epsilon for row in breakdown.rows if row.component != "total"]
    assert sum(parts) == breakdown.total
    assert breakdown.conversion.data_dependent and rows["total"] == breakdown.total


def test_block_charging_equals_step_charging_and_round_trips():
    values = np.random.default_rng(0).uniform(0, 0.01, size=(50, len(DEFAULT_ORDERS)))
    step_ledger, block_ledger = PrivacyLedger(), PrivacyLedger()
    for row in values:
        step_ledger.charge({"x": RdpCurve(DEFAULT_ORDERS, row)})
    block_ledger.charge_many({"x": (values, False)})
    np.testing.assert_allclose(step_ledger.total_curve().values, block_ledger.total_curve().values, rtol=1e-12)
    assert block_ledger.steps == 50
    restored = PrivacyLedger.from_dict(block_ledger.to_dict())
    np.testing.assert_array_equal(restored.total_curve().values, block_ledger.total_curve().values)


def test_ledger_refuses_other_relation_and_nan():
    ledger = PrivacyLedger()
    with pytest.raises(ValueError, match="no common neighbouring pair"):
        ledger.charge({"gnmax": GNMax(10.0).rdp_curve()})
    with pytest.raises(ValueError, match="NaN"):
        ledger.charge_many({"x": (np.full((2, len(DEFAULT_ORDERS)), np.nan), False)})


def test_composition_of_mechanisms_checks_relations():
    both = compose(GaussianMechanism(2.0), NoisyScreening(teachers=10, lam=0.1, sigma=0.1))
    np.testing.assert_allclose(both.rdp_values(ORDERS), ORDERS / 8 + ORDERS * (0.1 / 1.0) ** 2)
    np.testing.assert_allclose(self_compose(GaussianMechanism(2.0), 5).rdp_values(ORDERS), 5 * ORDERS / 8)
    with pytest.raises(ValueError, match="cover no common neighbouring pair"):
        compose(GaussianMechanism(2.0), GNMax(3.0))


def test_custom_curve_never_interpolates_down():
    known = RdpCurve((2.0, 8.0), np.array([0.1, 0.5]))
    mech = CustomCurveMechanism(known)
    np.testing.assert_array_equal(mech.rdp_values(np.array([1.5, 2.0, 3.0, 8.0, 9.0])), [0.1, 0.1, 0.5, 0.5, np.inf])


def test_budget_filters_and_refuses_data_dependent_checks_unless_opted_in():
    budget = RdpBudget(epsilon=1.0, delta=1e-5)
    step = GaussianMechanism(20.0).rdp_curve()
    spent = 0
    while budget.can_afford(step):
        budget.spend(step)
        spent += 1
    assert spent > 0 and not budget.can_afford(step)
    with pytest.raises(ValueError, match="does not fit the budget"):
        budget.spend(step)
    dependent = RdpCurve(DEFAULT_ORDERS, ORDERS * 1e-6, data_dependent=True)
    with pytest.raises(ValueError, match="leaks private information"):
        RdpBudget(1.0, 1e-5).can_afford(dependent)
    opted_in = RdpBudget(1.0, 1e-5, allow_data_dependent=True)
    assert opted_in.can_afford(dependent) and opted_in.data_dependent_checks == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(teachers=10, lam=1.3, sigma=0.1), r"lam must be in \[0, 1\], got 1.3"),
    (dict(teachers=10, lam=0.1, sigma=0.0), "sigma must be > 0, got 0"),
    (dict(teachers=0, lam=0.1, sigma=0.1), "teachers must be an integer >= 1, got 0"),
    (dict(teachers=10, lam=0.1, sigma=0.1, alpha=0.9), "must be > 1, got 0.9"),
])
def test_invalid_screening_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NoisyScreening(**kwargs)


def _generated_screen_case(seed):
    """A batch of steps of LM-like teachers around a public law, and a screen, from one seed."""
    rng = np.random.default_rng(seed)
    n, vocab, steps = int(rng.choice([1, 2, 8, 100])), int(rng.choice([5, 60, 1024])), int(rng.integers(1, 5))
    logits = 4.0 * rng.standard_normal((steps, vocab))
    public = np.exp(logits - logits.max(-1, keepdims=True))
    public /= public.sum(-1, keepdims=True)
    spread = logits[:, None] + rng.uniform(0.1, 3.0) * rng.standard_normal((steps, n, vocab))
    teachers = np.exp(spread - spread.max(-1, keepdims=True))
    teachers /= teachers.sum(-1, keepdims=True)
    screen = NoisyScreening(teachers=n, lam=float(rng.uniform(0, 1)), sigma=float(10 ** rng.uniform(-4, 0)),
                            alpha=float(rng.choice([2.0, 6.0, 18.0])), threshold=1.0, top_k=int(rng.choice([1, 8, 60])))
    return torch.from_numpy(teachers), torch.from_numpy(public), screen


@pytest.mark.parametrize("seed", range(40))
def test_the_compiled_screen_statistic_is_the_torch_forms(seed):
    """Records version 10's screening statistic (one compiled pass, fused.screen_statistics) against
    version 9's torch operations on the same columns and draws: the same value within 1e-9 relative (or
    1e-13 absolute, where both are the rounding-up slack around 0: a one-token top-k), the same +inf where
    every noisy entry clips to 0."""
    teachers, public, screen = _generated_screen_case(seed)
    before, after = (screen.statistics(teachers, public, torch.Generator().manual_seed(seed), version=v).numpy()
                     for v in (9, 10))
    assert before.shape == after.shape == tuple(public.shape[:-1])
    finite = np.isfinite(before)
    assert np.array_equal(finite, np.isfinite(after)) and np.array_equal(before[~finite], after[~finite])
    np.testing.assert_allclose(after[finite], before[finite], rtol=1e-9, atol=1e-13)


def test_a_screen_whose_noise_clips_every_entry_gives_inf_in_both_versions():
    """sigma far above the mean with draws all negative: every clipped entry is 0, the statistic +inf."""
    screen = NoisyScreening(teachers=2, lam=0.5, sigma=10.0, alpha=18.0, threshold=1.0, top_k=3)
    teachers = torch.full((1, 2, 3), 1.0 / 3, dtype=torch.float64)
    public = torch.full((1, 3), 1.0 / 3, dtype=torch.float64)
    generator_seed = next(s for s in range(10_000)
                          if bool((torch.randn(1, 3, generator=torch.Generator().manual_seed(s), dtype=torch.float64) < -0.1).all()))
    for version in (9, 10):
        value = screen.statistics(teachers, public, torch.Generator().manual_seed(generator_seed), version=version)
        assert value.tolist() == [np.inf]


def test_a_runner_screens_with_the_arithmetic_of_the_records_version(monkeypatch):
    """build_runner passes the trace's records version to the screen: 9 for a version 9 trace (the
    torch operations it was decoded with), 10 from version 10 on."""
    from dpledger.decoding.runners import build_runner
    from dpledger.mechanisms.randomness import StepGenerators

    seen = []
    original = NoisyScreening.statistics

    def recorded(self, *args, **kwargs):
        seen.append(args[3] if len(args) > 3 else kwargs.get("version"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(NoisyScreening, "statistics", recorded)
    rng = np.random.default_rng(5)
    teachers, public = torch.from_numpy(lm_like(rng, 64, (2, 4))), torch.from_numpy(lm_like(rng, 64, (2,)))
    table = dict(type="adapmixed", alpha=6.0, beta=0.05, lam=1e-4, sigma=1e-2, threshold=4.5, top_k=8)
    for version in (9, 10):
        seen.clear()
        runner = build_runner(dict(table), 4, "add_or_remove_one", records_version=version)
        assert "screen_version" not in runner.params
        runner.process(public, teachers, StepGenerators.for_steps(1, 0, 2), ORDERS)
        assert seen == [version]


def test_the_compiled_screen_takes_an_empty_batch_and_tensors_that_require_grad():
    """Found in review: version 10 failed on zero steps (numpy's argmax of nothing in its NaN check) and on
    tensors that require grad (.numpy() without .detach()); version 9 answered both."""
    screen = NoisyScreening(teachers=2, lam=0.5, sigma=0.01, alpha=18.0, top_k=4)
    for version in (9, 10):
        empty = screen.statistics(torch.rand(0, 2, 10, dtype=torch.float64), torch.rand(0, 10, dtype=torch.float64),
                                  torch.Generator(), version=version)
        assert tuple(empty.shape) == (0,)
    teachers = torch.softmax(torch.randn(3, 2, 10, dtype=torch.float64), -1).requires_grad_()
    public = torch.softmax(torch.randn(3, 10, dtype=torch.float64), -1)
    values = [screen.statistics(teachers, public, torch.Generator().manual_seed(1), version=v).detach().numpy()
              for v in (9, 10)]
    np.testing.assert_allclose(values[1], values[0], rtol=1e-9, atol=1e-13)
