"""PMixED: Theorem 3.1, Lemma C.1, the mixing-weight solver, subsampling variants, the counterexample."""
import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from dp_accounting.rdp import rdp_privacy_accountant as dpa

from dpledger.accounting import DEFAULT_ORDERS, epsilon_from_rdp
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.mechanisms import (GaussianMechanism, PMixED, SubsampledPMixED, SubsamplingVariant, amplified_rdp,
                        beta_from_budget, data_dependent_pmixed_curve, poisson_subsample, renyi_divergence,
                        subsampled_pmixed_curve, theorem_3_1_epsilon)
from tests.conftest import lm_like

ORDERS = np.asarray(DEFAULT_ORDERS)


@pytest.mark.parametrize("alpha, beta, n", [(6, 0.01, 100), (18, 0.2, 100), (2, 0.5, 3), (30, 1.0, 7)])
def test_theorem_3_1_matches_closed_form_in_mpmath(alpha, beta, n):
    mpmath.mp.dps = 50
    closed = mpmath.log((n - 1 + mpmath.exp(4 * beta * alpha * (alpha - 1))) / n) / (alpha - 1)
    assert float(theorem_3_1_epsilon(alpha, beta, n)) == pytest.approx(float(closed), rel=1e-13)
    assert float(theorem_3_1_epsilon(alpha, beta, 1)) == pytest.approx(beta * alpha)


def test_pmixed_curve_holds_at_and_below_projection_order_only():
    pmixed = PMixED(alpha=6, beta=0.01, teachers=100)
    curve = pmixed.rdp_curve()
    assert curve.value_at(6) == pytest.approx(pmixed.per_query_epsilon)
    assert curve.value_at(2) == pytest.approx(pmixed.per_query_epsilon)
    assert math.isinf(curve.value_at(6.1)) and math.isinf(curve.value_at(18))


@pytest.mark.parametrize("eps_g, queries, alpha, n", [(8.0, 9728, 6, 100), (1.0, 100, 18, 10), (3.0, 10, 4, 1)])
def test_lemma_c1_beta_inverts_theorem_3_1(eps_g, queries, alpha, n):
    # the paper's Lemma C.1 inverts Theorem 3.1 at N (removing a teacher) ...
    beta = beta_from_budget(eps_g, queries, alpha, n, NeighbouringRelation.REMOVE_ONE)
    assert float(theorem_3_1_epsilon(alpha, beta, n)) * queries == pytest.approx(eps_g, rel=1e-10)
    # ... and under add-or-remove the mechanism's own charge, which for one teacher is an added second
    beta = beta_from_budget(eps_g, queries, alpha, n)
    assert PMixED(alpha, beta, n).per_query_epsilon * queries == pytest.approx(eps_g, rel=1e-10)


def test_mixing_weights_satisfy_the_ball_and_are_nearly_maximal(rng):
    n, vocab, alpha, beta = 16, 400, 18.0, 0.05
    public = lm_like(rng, vocab)
    teachers = lm_like(rng, vocab, (n,))
    pmixed = PMixED(alpha, beta, n)
    lambdas = pmixed.mixing_weights(teachers, public)
    mixed = lambdas[:, None] * teachers + (1 - lambdas[:, None]) * public
    divergence = renyi_divergence(mixed, public, alpha, symmetric=True)
    assert np.all(divergence <= pmixed.radius)  # never outside the ball
    bumped = np.minimum(lambdas + 1e-6, 1.0)
    bumped_mixed = bumped[:, None] * teachers + (1 - bumped[:, None]) * public
    interior = lambdas < 1
    assert interior.any()
    assert np.all(renyi_divergence(bumped_mixed, public, alpha, symmetric=True)[interior] > pmixed.radius)


def test_mixing_weight_is_one_inside_the_ball_and_zero_radius_gives_public(rng):
    public = lm_like(rng, 50)
    close = 0.999 * public + 0.001 * lm_like(rng, 50)
    assert PMixED(6, 0.5, 1).mixing_weights(close[None], public)[0] == 1.0
    far = lm_like(rng, 50, (3,))
    assert np.all(PMixED(6, 0.0, 3).mixing_weights(far, public) == 0.0)


def test_tight_amplification_of_gaussian_matches_dp_accounting_subsampled_gaussian():
    # Theorem A.4 with eps(k) = k / (2 sigma^2) is Mironov-Talwar-Zhang's integer-order formula.
    sigma, q = 1.3, 0.05
    integer_orders = np.arange(2, 64, dtype=float)
    ours = amplified_rdp(q, GaussianMechanism(sigma).rdp_values, integer_orders, general=False)
    theirs = dpa._compute_rdp_poisson_subsampled_gaussian(q, sigma, integer_orders)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)
    general = poisson_subsample(GaussianMechanism(sigma), q, general=True).rdp_values(integer_orders)
    assert np.all(general >= ours - 1e-15)


def test_amplification_edges():
    gaussian = GaussianMechanism(2.0)
    assert np.all(amplified_rdp(0.0, gaussian.rdp_values, ORDERS, True) == 0)
    integer_orders = np.arange(2, 20, dtype=float)
    np.testing.assert_allclose(amplified_rdp(1.0, gaussian.rdp_values, integer_orders, False),
                               gaussian.rdp_values(integer_orders), rtol=1e-12)


def test_table_2a_pmixed_realised_size_and_sound_variants():
    pmixed = PMixED(alpha=6, beta=0.01, teachers=100)
    realised = [epsilon_from_rdp(subsampled_pmixed_curve(pmixed, 0.03, "realised-size", 9728, seed), 1e-5).epsilon
                for seed in range(10)]
    assert min(realised) > 4.30 and max(realised) < 4.45  # seed Table 2a: 4.399
    assert abs(np.mean(realised) - 4.399) < 0.05
    sound = epsilon_from_rdp(subsampled_pmixed_curve(pmixed, 0.03, "worst-case-size-general", 9728), 1e-5)
    tight_worst = epsilon_from_rdp(subsampled_pmixed_curve(pmixed, 0.03, "worst-case-size", 9728), 1e-5)
    assert sound.epsilon > tight_worst.epsilon > max(realised)
    # At the projection order alone the sound variants give ~6.0 and ~8.7.
    at_six = lambda v: (subsampled_pmixed_curve(pmixed, 0.03, v, 9728).value_at(6)
                        + math.log(5 / 6) - (math.log(1e-5) + math.log(6)) / 5)
    assert at_six("worst-case-size") == pytest.approx(6.0, abs=0.05)
    assert at_six("worst-case-size-general") == pytest.approx(8.7, abs=0.05)
    assert at_six("realised-size-general") == pytest.approx(6.7, abs=0.1)


def test_worst_case_size_is_two_teachers():
    mech = SubsampledPMixED(PMixED(6, 0.01, 100), 0.03, SubsamplingVariant.WORST_CASE_SIZE)
    assert mech.worst_case_size == 2


def test_subsampling_refuses_data_dependent_curves(rng):
    pmixed = PMixED(4, 0.1, 3)
    curve = data_dependent_pmixed_curve(pmixed, lm_like(rng, 20, (3,)), lm_like(rng, 20))
    from dpledger.mechanisms import CustomCurveMechanism

    with pytest.raises(ValueError, match="data-dependent"):
        poisson_subsample(CustomCurveMechanism(curve), 0.1)


def spec_counterexample():
    public = np.array([7.9e-11, 1.0, 1.4e-13])
    first = np.array([8.1e-15, 1.0, 1.1e-17])
    second = np.array([0.47, 0.16, 0.37])
    return np.stack([first / first.sum(), second / second.sum()]), public / public.sum()


def test_spec_counterexample_data_dependent_loss_exceeds_theorem_3_1():
    teachers, public = spec_counterexample()
    pmixed = PMixED(alpha=2, beta=0.01, teachers=2)
    lambdas = pmixed.mixing_weights(teachers, public)
    assert lambdas[0] == 1.0 and lambdas[1] == pytest.approx(1.4e-7, rel=0.05)
    mixed = lambdas[:, None] * teachers + (1 - lambdas[:, None]) * public
    assert np.all(renyi_divergence(mixed, public, 2.0, symmetric=True) <= pmixed.radius)
    loss = data_dependent_pmixed_curve(pmixed, teachers, public, lambdas).value_at(2)
    assert loss == pytest.approx(4.2, abs=0.05)
    assert pmixed.per_query_epsilon == pytest.approx(0.041, abs=5e-4)
    # independent check of the leave-one-out divergence with mpmath
    mpmath.mp.dps = 60
    p = mixed.mean(axis=0)
    without_second = mixed[0]
    forward = mpmath.log(sum(mpmath.mpf(a) ** 2 / mpmath.mpf(b) for a, b in zip(p, without_second)))
    assert loss >= float(forward) - 1e-9


def count_theorem_3_1_violations(trials, seed):
    """LM-like search: softmax(Gaussian logits) public model, teachers = public logits + shift."""
    rng = np.random.default_rng(seed)
    violations = 0
    for _ in range(trials):
        vocab, n = 200, int(rng.integers(2, 12))
        alpha, beta = float(rng.choice([2, 6, 18])), float(rng.choice([0.01, 0.1, 0.2]))
        base = rng.normal(0, 3.0, vocab)
        public = np.exp(base - base.max())
        public /= public.sum()
        logits = base + rng.normal(0, rng.uniform(0.5, 4.0), (n, vocab))
        teachers = np.exp(logits - logits.max(axis=1, keepdims=True))
        teachers /= teachers.sum(axis=1, keepdims=True)
        pmixed = PMixED(alpha, beta, n)
        loss = data_dependent_pmixed_curve(pmixed, teachers, public, orders=[alpha]).value_at(alpha)
        violations += loss > pmixed.per_query_epsilon * (1 + 1e-9)
    return violations


def test_lm_like_search_for_theorem_3_1_violations_finds_none():
    assert count_theorem_3_1_violations(trials=150, seed=7) == 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(alpha=1.0, beta=0.1, teachers=3), "must be > 1, got 1"),
    (dict(alpha=6, beta=-0.1, teachers=3), "beta must be >= 0, got -0.1"),
    (dict(alpha=6, beta=0.1, teachers=0), "teachers must be an integer >= 1, got 0"),
])
def test_invalid_pmixed_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PMixED(**kwargs)


@pytest.mark.parametrize("q", [-0.1, 1.3])
def test_invalid_sampling_rate(q):
    with pytest.raises(ValueError, match=rf"sampling_probability must be in \[0, 1\], got {q:g}"):
        SubsampledPMixED(PMixED(6, 0.01, 10), q, SubsamplingVariant.WORST_CASE_SIZE)


def test_unknown_subsampling_variant_is_refused_by_name():
    assert SubsampledPMixED(PMixED(6, 0.01, 10), 0.1, "worst-case-size").variant is SubsamplingVariant.WORST_CASE_SIZE
    with pytest.raises(ValueError, match=r"subsampling variant must be one of .*got 'realised'"):
        SubsampledPMixED(PMixED(6, 0.01, 10), 0.1, "realised")


def test_wrong_number_of_teachers_is_refused(rng):
    with pytest.raises(ValueError, match="N=4"):
        PMixED(6, 0.1, 4).mixing_weights(lm_like(rng, 10, (3,)), lm_like(rng, 10))


@settings(max_examples=30, deadline=None)
@given(st.floats(1.5, 64.0), st.floats(1e-4, 2.0), st.integers(2, 200), st.sampled_from(["projection-order", "proof-orders", "all-orders"]),
       st.lists(st.floats(1.01, 2048.0), min_size=1, max_size=12, unique=True))
def test_data_independent_curves_are_computed_once_per_spec_and_grid(alpha, beta, teachers, ball, orders):
    """The decode loop's cached data-independent curve (mechanisms.step.data_independent_values) is the
    spec's own rdp_values on that grid, bit for bit, for every spec and grid (equal specs share it,
    different ones never do), and cannot be written through."""
    from dpledger.mechanisms import NoisyScreening
    from dpledger.mechanisms.step import data_independent_values

    grid = np.sort(np.asarray(orders))
    specs = [PMixED(alpha=alpha, beta=beta, teachers=teachers, ball=ball),
             PMixED(alpha=alpha, beta=beta * 0.5, teachers=teachers, ball=ball),
             NoisyScreening(teachers=teachers, lam=1e-4, sigma=1e-2, alpha=alpha, threshold=4.5, top_k=60)]
    for spec in specs:
        first = data_independent_values(spec, grid)
        np.testing.assert_array_equal(first, spec.rdp_values(grid))
        assert data_independent_values(spec, grid.copy()) is first
        np.testing.assert_array_equal(data_independent_values(spec, grid[:1]), spec.rdp_values(grid[:1]))
        with pytest.raises(ValueError, match="read-only"):
            first[0] = 0.0
