"""DP-ICL over a public top-k (dpledger.mechanisms.dp_icl): its curve against dp-accounting and exact
arithmetic, the sensitivity bound on generated neighbours, calibration, and the released token's law
against an independent quadrature (mpmath) and against releases."""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from dpledger.accounting.orders import DEFAULT_ORDERS
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.mechanisms.calibration import CALIBRATION_TOLERANCE
from dpledger.mechanisms.dp_icl import DPICL, calibrate_dp_icl, public_top_k, restricted_sums, sum_sensitivity

RELATIONS = (NeighbouringRelation.ADD_OR_REMOVE_ONE, NeighbouringRelation.REPLACE_ONE)


def ensemble(rng: np.random.Generator, queries: int, teachers: int, vocabulary: int,
             concentration: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Random teachers (Q, N, V) and public (Q, V) laws, Dirichlet with the given concentration."""
    public = rng.dirichlet(np.full(vocabulary, concentration), size=queries)
    return rng.dirichlet(np.full(vocabulary, concentration), size=(queries, teachers)), public


@pytest.mark.parametrize("relation", RELATIONS)
def test_curve_is_dp_accountings_gaussian_at_sigma_over_sensitivity(relation):
    from dp_accounting.rdp import RdpAccountant

    rng = np.random.default_rng(1)
    orders = np.asarray(DEFAULT_ORDERS)
    for sigma in np.exp(rng.uniform(math.log(0.05), math.log(500.0), 20)):
        mechanism = DPICL(float(sigma), 10, relation)
        accountant = RdpAccountant(list(DEFAULT_ORDERS))
        accountant.compose(mechanism.dp_event(), 1)
        ours = mechanism.rdp_values(orders)
        np.testing.assert_allclose(ours, accountant._rdp, rtol=1e-13)


@pytest.mark.parametrize("relation", RELATIONS)
def test_curve_never_below_the_exact_closed_form(relation):
    """a S^2 / (2 sigma^2) in exact rational arithmetic (S^2 = 2 or 1; every float is a rational)."""
    rng = np.random.default_rng(2)
    squared = Fraction(2) if relation is NeighbouringRelation.REPLACE_ONE else Fraction(1)
    orders = np.concatenate([rng.uniform(1.001, 1000.0, 30), np.arange(2.0, 65.0)])
    for sigma in np.exp(rng.uniform(math.log(1e-3), math.log(1e4), 30)):
        values = DPICL(float(sigma), 3, relation).rdp_values(orders)
        for order, value in zip(orders, values):
            exact = Fraction(float(order)) * squared / (2 * Fraction(float(sigma)) ** 2)
            assert Fraction(float(value)) >= exact
            assert float(value) <= float(exact) * (1 + 1e-14)


def test_sensitivity_bounds_the_sum_on_generated_neighbours():
    """Add or remove one teacher moves the restricted sum by at most 1 in L2, replacing one by at most
    sqrt(2); the replace bound is attained by two point masses on different candidates."""
    rng = np.random.default_rng(3)
    worst = {relation: 0.0 for relation in RELATIONS}
    for _ in range(300):
        vocabulary, teachers = int(rng.integers(2, 30)), int(rng.integers(1, 8))
        k = int(rng.integers(1, vocabulary + 1))
        concentration = float(np.exp(rng.uniform(-5, 2)))  # near point masses to near uniform
        laws, public = ensemble(rng, 1, teachers + 1, vocabulary, concentration)
        tokens = public_top_k(public, k)
        full = restricted_sums(laws, tokens)[0]
        removed = restricted_sums(laws[:, :-1], tokens)[0]
        replaced = laws.copy()
        replaced[0, -1] = rng.dirichlet(np.full(vocabulary, concentration))
        moved = restricted_sums(replaced, tokens)[0]
        worst[RELATIONS[0]] = max(worst[RELATIONS[0]], float(np.linalg.norm(full - removed)))
        worst[RELATIONS[1]] = max(worst[RELATIONS[1]], float(np.linalg.norm(full - moved)))
    for relation in RELATIONS:
        assert worst[relation] <= sum_sensitivity(relation) + 1e-12
    point_masses = np.eye(4)[None, [0, 1]]                    # teacher 0 on token 0, teacher 1 on token 1
    tokens = public_top_k(np.full((1, 4), 0.25), 4)
    swapped = np.eye(4)[None, [1, 1]]
    gap = np.linalg.norm(restricted_sums(point_masses, tokens) - restricted_sums(swapped, tokens))
    assert gap == pytest.approx(math.sqrt(2.0))


def test_restriction_renormalises_and_a_teacher_without_candidate_mass_adds_nothing():
    teachers = np.array([[[0.5, 0.25, 0.25, 0.0], [0.0, 0.0, 0.0, 1.0]]])
    public = np.array([[0.4, 0.3, 0.2, 0.1]])
    tokens = public_top_k(public, 2)
    np.testing.assert_array_equal(tokens, [[0, 1]])
    np.testing.assert_allclose(restricted_sums(teachers, tokens), [[2 / 3, 1 / 3]])


def test_public_top_k_breaks_ties_towards_the_smaller_token():
    np.testing.assert_array_equal(public_top_k(np.array([0.1, 0.3, 0.3, 0.3]), 2), [1, 2])


def mpmath_law(sums: np.ndarray, sigma: float) -> list[float]:
    """Pr[argmax_j (s_j + N(0, sigma^2)) = j] from its definition, by mpmath quadrature at 20 digits
    (the comparison's rtol is 1e-6)."""
    with mpmath.workdps(20):
        values = [mpmath.mpf(float(s)) for s in sums]
        s = mpmath.mpf(sigma)
        law = []
        for j, own in enumerate(values):
            def integrand(x, own=own, j=j):
                density = mpmath.npdf(x, own, s)
                for l, other in enumerate(values):
                    if l != j:
                        density *= mpmath.ncdf((x - other) / s)
                return density
            low, high = min(values) - 12 * s, max(values) + 12 * s
            law.append(float(mpmath.quad(integrand, mpmath.linspace(low, high, 9))))
    return law


def test_output_law_matches_an_independent_quadrature_and_sums_to_one():
    rng = np.random.default_rng(4)
    for _ in range(4):
        teachers, public = ensemble(rng, 2, int(rng.integers(2, 9)), 12)
        k = int(rng.integers(2, 6))
        sigma = float(np.exp(rng.uniform(math.log(0.1), math.log(5.0))))
        mechanism = DPICL(sigma, k)
        laws, error = mechanism.output_law(teachers, public)
        assert error < 1e-6
        np.testing.assert_allclose(laws.sum(axis=1), 1.0, atol=1e-12)
        sums, tokens = mechanism.scores(teachers, public)
        for row in range(2):
            outside = np.setdiff1d(np.arange(12), tokens[row])
            assert np.all(laws[row, outside] == 0.0)
            np.testing.assert_allclose(laws[row, tokens[row]], mpmath_law(sums[row], sigma), rtol=1e-6, atol=1e-12)


def test_monte_carlo_law_and_releases_agree_with_the_quadrature():
    rng = np.random.default_rng(5)
    teachers, public = ensemble(rng, 3, 6, 20, 0.3)
    mechanism = DPICL(0.7, 8)
    laws, _ = mechanism.output_law(teachers, public)
    samples = 40_000
    estimate = mechanism.monte_carlo_output_law(teachers, public, samples, np.random.default_rng(6))
    np.testing.assert_allclose(estimate.sum(axis=1), 1.0)
    bound = 5 * np.sqrt(laws * (1 - laws) / samples) + 1e-12          # five standard errors
    assert np.all(np.abs(estimate - laws) <= bound)
    released = np.stack([mechanism.step(teachers, public, np.random.default_rng(seed)) for seed in range(2000)])
    assert released.shape == (2000, 3)
    frequencies = np.stack([np.bincount(released[:, q], minlength=20) / 2000 for q in range(3)])
    assert np.all(np.abs(frequencies - laws) <= 5 * np.sqrt(laws * (1 - laws) / 2000) + 1e-12)


def test_step_is_vectorised_and_tiny_noise_releases_the_argmax_of_the_sums():
    rng = np.random.default_rng(7)
    teachers, public = ensemble(rng, 5, 4, 15)
    mechanism = DPICL(1e-9, 6)
    sums, tokens = mechanism.scores(teachers, public)
    expected = tokens[np.arange(5), sums.argmax(axis=1)]
    np.testing.assert_array_equal(mechanism.step(teachers, public, rng), expected)
    single = mechanism.step(teachers[0], public[0], rng)
    assert single.shape == () and int(single) == expected[0]


@pytest.mark.parametrize("relation", RELATIONS)
@pytest.mark.parametrize("epsilon, delta, queries", [(1.0, 1e-5, 1000), (8.0, 1e-6, 100), (0.5, 1e-3, 1)])
def test_calibration_lands_at_or_just_below_the_target(epsilon, delta, queries, relation):
    from dp_accounting.rdp import RdpAccountant

    result = calibrate_dp_icl(epsilon, delta, queries, 20, relation=relation)
    assert (1 - CALIBRATION_TOLERANCE) * epsilon <= result.forward_epsilon <= epsilon
    assert isinstance(result.mechanism, DPICL) and result.mechanism.top_k == 20
    accountant = RdpAccountant(list(DEFAULT_ORDERS))                  # independent forward check
    accountant.compose(result.mechanism.dp_event(), queries)
    assert accountant.get_epsilon(delta) <= epsilon * (1 + 1e-9)
    if relation is NeighbouringRelation.REPLACE_ONE:  # the same noise multiplier, sqrt(2) more noise
        plain = calibrate_dp_icl(epsilon, delta, queries, 20)
        assert result.value == pytest.approx(math.sqrt(2) * plain.value, rel=1e-6)


@pytest.mark.parametrize("arguments, message", [
    ((0.0, 5), "sigma"), ((float("nan"), 5), "sigma"), ((-1.0, 5), "sigma"), ((math.inf, 5), "sigma"),
    ((1.0, 0), "top_k"), ((1.0, 2.5), "top_k"), ((1.0, True), "top_k"), ((1.0, 5, "replace"), "relation"),
])
def test_bad_parameters_raise_one_line_value_errors(arguments, message):
    with pytest.raises(ValueError, match=message) as caught:
        DPICL(*arguments)
    assert "\n" not in str(caught.value)


def test_bad_distributions_raise_one_line_value_errors():
    rng = np.random.default_rng(8)
    teachers, public = ensemble(rng, 2, 3, 5)
    mechanism = DPICL(1.0, 6)
    for call, message in [(lambda: mechanism.output_law(teachers, public), "top_k"),
                          (lambda: DPICL(1.0, 2).output_law(teachers, public[:1]), "batch shape"),
                          (lambda: DPICL(1.0, 2).output_law(teachers * 2, public), "sum to 1"),
                          (lambda: DPICL(1.0, 2).step(teachers, public, 0), "Generator"),
                          (lambda: DPICL(1.0, 2).monte_carlo_output_law(teachers, public, 0, rng), "samples"),
                          (lambda: calibrate_dp_icl(0.0, 1e-5, 10, 5), "epsilon"),
                          (lambda: calibrate_dp_icl(1.0, 1e-5, 10, 0), "top_k")]:
        with pytest.raises(ValueError, match=message) as caught:
            call()
        assert "\n" not in str(caught.value)
