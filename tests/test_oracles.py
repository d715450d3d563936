"""Sanity checks of the mpmath oracles (tests/oracles) against closed forms, so that the
differential tests compare the package against something trustworthy."""
import math

import mpmath
import pytest

from tests import oracles as O


@pytest.fixture(autouse=True)
def sixty_digits():
    """Expected values below are computed at the oracles' precision."""
    with mpmath.workdps(60):
        yield


def close(x, y, rel=1e-40, abs_=0.0):
    x, y = mpmath.mpf(x), mpmath.mpf(y)
    return abs(x - y) <= abs_ + rel * max(abs(x), abs(y))


# ---------------------------------------------------------------- Renyi divergence

@pytest.mark.parametrize("p,q", [(0.3, 0.6), (1e-9, 0.5), (0.999, 1e-3)])
def test_renyi_order_2_bernoulli_is_log_one_plus_chi_square(p, q):
    # D_2(Ber(p) || Ber(q)) = log(1 + (p - q)^2 / (q (1 - q)))  (chi-square identity)
    with mpmath.workdps(60):
        p, q = mpmath.mpf(p), mpmath.mpf(q)
        expected = mpmath.log(1 + (p - q) ** 2 / (q * (1 - q)))
        assert close(O.renyi_divergence([p, 1 - p], [q, 1 - q], 2), expected)


@pytest.mark.parametrize("alpha", [1.01, 2, 18, 1024])
def test_renyi_of_point_mass_and_of_uniform_on_a_subset(alpha):
    # D_a(delta_j || Q) = -log Q_j and D_a(U_S || U_T) = log(|T| / |S|) at every order
    with mpmath.workdps(60):
        q = [mpmath.mpf(1) / 8, mpmath.mpf(3) / 8, mpmath.mpf(1) / 2]
        assert close(O.renyi_divergence([0, 1, 0], q, alpha), -mpmath.log(q[1]))
        assert close(O.renyi_divergence([0.5, 0.5, 0, 0], [0.25] * 4, alpha), mpmath.log(2))


def test_renyi_conventions_zero_over_zero_and_support():
    assert O.renyi_divergence([0.5, 0.5, 0.0], [0.5, 0.5, 0.0], 3) == 0        # 0/0 terms contribute 0
    assert O.renyi_divergence([0.5, 0.5, 0.0], [0.5, 0.25, 0.25], 3) < mpmath.inf
    assert O.renyi_divergence([0.5, 0.25, 0.25], [0.5, 0.5, 0.0], 3) == mpmath.inf
    assert O.renyi_divergence([1.0, 0.0], [0.0, 1.0], 1.5) == mpmath.inf     # disjoint supports
    assert O.symmetric_renyi_divergence([0.5, 0.5, 0.0], [0.5, 0.25, 0.25], 3) == mpmath.inf
    with pytest.raises(ValueError):
        O.renyi_divergence([1.0, 0.0], [0.5, 0.5], 1.0)


def test_renyi_tends_to_kl_as_the_order_tends_to_one():
    p, q = [0.2, 0.5, 0.3], [0.4, 0.4, 0.2]
    kl = sum(pj * math.log(pj / qj) for pj, qj in zip(p, q))
    assert float(O.renyi_divergence(p, q, 1 + 1e-12)) == pytest.approx(kl, rel=1e-9)


def test_renyi_extreme_tails_do_not_underflow():
    # P_j^a Q_j^(1-a) with P = 1e-300, Q = 1e-301, a = 1024 is ~10^723 (1e-300^1024 alone is
    # 1e-307200): computed without underflow, D = log(10^723 + 1) / 1023
    value = O.renyi_divergence([1e-300, 1.0], [1e-301, 1.0], 1024)
    assert close(value, 723 * mpmath.log(10) / 1023, rel=1e-12)


# ---------------------------------------------------------------- Gaussian and subsampling

@pytest.mark.parametrize("order", [2, 3, 7, 64])
@pytest.mark.parametrize("sigma", [0.5, 1.0, 4.0])
def test_subsampled_gaussian_at_q_1_is_the_gaussian_and_at_q_0_is_zero(order, sigma):
    assert close(O.subsampled_gaussian_rdp(1, sigma, order), O.gaussian_rdp(order, sigma))
    assert close(O.gaussian_rdp(order, sigma), mpmath.mpf(order) / (2 * mpmath.mpf(sigma) ** 2))
    assert O.subsampled_gaussian_rdp(0, sigma, order) == 0


@pytest.mark.parametrize("q", [1e-6, 0.03, 0.5, 0.999])
@pytest.mark.parametrize("order", [2, 5, 33])
def test_tight_amplification_of_the_gaussian_is_the_binomial_expansion(q, order):
    # The k = 0, 1 terms of Mironov-Talwar-Zhang's sum are (1-q)^(a-1) (1 + (a-1) q): the same number.
    sigma = 1.3
    via_amplification = O.amplified_rdp_integer(q, lambda k: O.gaussian_rdp(k, sigma), order)
    assert close(via_amplification, O.subsampled_gaussian_rdp(q, sigma, order), rel=1e-50)


def test_amplification_end_points():
    table = {k: 0.1 * k for k in range(2, 9)}
    base = table.__getitem__
    for order in (2, 5, 8):
        assert O.amplified_rdp_integer(0, base, order) == 0
        assert O.amplified_rdp_integer(0, base, order, general=True) == 0
        assert close(O.amplified_rdp_integer(1, base, order), table[order])
        expected_general = table[order] + (mpmath.log(3) / (order - 1) if order >= 3 else 0)
        assert close(O.amplified_rdp_integer(1, base, order, general=True), expected_general)


def test_amplification_with_infinite_base_values():
    def base(k):
        return 0.5 if k <= 4 else mpmath.inf
    assert O.amplified_rdp_integer(1, base, 4) == mpmath.mpf(0.5)      # only eps(4) has weight at q = 1
    assert O.amplified_rdp_integer(1, base, 6) == mpmath.inf            # eps(6) = inf
    assert O.amplified_rdp_integer(0.03, base, 6) == mpmath.inf         # a positive-weight inf term
    assert O.amplified_rdp_integer(0, base, 6) == 0
    assert 0 < O.amplified_rdp_integer(0.03, base, 4) < 0.5


def test_amplification_fractional_order_is_charged_at_the_ceiling():
    base = {k: 0.2 * k for k in range(2, 8)}.__getitem__
    assert O.amplified_rdp(0.1, base, 5.5) == O.amplified_rdp_integer(0.1, base, 6)
    assert O.amplified_rdp(0.1, base, 1.01) == O.amplified_rdp_integer(0.1, base, 2)
    assert O.amplified_rdp(0.1, base, 6) == O.amplified_rdp_integer(0.1, base, 6)


def test_general_amplification_small_q_is_about_q_squared():
    # C(2, 2) q^2 (e^{eps(2)} - 1) dominates: eps'(2) ~ q^2 (e^{eps(2)} - 1) for tiny q
    q, eps2 = 1e-6, 1.0
    value = O.amplified_rdp_integer(q, lambda k: eps2, 2, general=True)
    assert close(value, q * q * (math.e - 1), rel=1e-5)


# ---------------------------------------------------------------- PMixED

@pytest.mark.parametrize("teachers", [2, 3, 10, 100, 1000])
@pytest.mark.parametrize("alpha", [2, 6, 18])
def test_lemma_c1_beta_inverts_theorem_3_1(teachers, alpha):
    eps_g, queries = 8.0, 1000
    beta = O.beta_from_budget(eps_g, queries, alpha, teachers)
    assert close(O.theorem_3_1_epsilon(alpha, beta, teachers), mpmath.mpf(eps_g) / queries, rel=1e-45)


def test_theorem_3_1_small_ensembles_and_values():
    assert O.theorem_3_1_epsilon(6, 0.01, 0) == 0
    assert close(O.theorem_3_1_epsilon(6, 0.01, 1), mpmath.mpf(0.01) * 6)
    assert close(O.beta_from_budget(3.0, 10, 6, 1), mpmath.mpf(3) / 10 / 6)
    # N = 2, a = 2, beta = 0.01: log((1 + e^{0.08}) / 2)
    expected = mpmath.log((1 + mpmath.exp(4 * mpmath.mpf(0.01) * 2)) / 2)
    assert close(O.theorem_3_1_epsilon(2, 0.01, 2), expected)


def test_mixing_weight_is_one_inside_the_ball_and_on_the_boundary_otherwise():
    public = [0.5, 0.3, 0.2]
    assert O.mixing_weight([0.5, 0.3, 0.2], public, 6, 0.01) == 1
    assert O.mixing_weight([0.51, 0.29, 0.2], public, 6, 0.5) == 1
    teacher = [0.05, 0.05, 0.9]
    low, high = O.mixing_weight_bracket(teacher, public, 6, 0.01)
    assert 0 < low < high <= low + 1e-15
    radius = mpmath.mpf(0.01) * 6
    assert O.ball_divergence(teacher, public, 6, low) <= radius < O.ball_divergence(teacher, public, 6, high)
    assert close(O.ball_divergence(teacher, public, 6, low), radius, rel=1e-12)


def test_mixing_weight_is_zero_when_the_teacher_leaves_the_public_support():
    assert O.mixing_weight([0.5, 0.5], [1.0, 0.0], 2, 1.0) < 1e-15
    assert O.mixing_weight([0.0, 1.0], [1.0, 0.0], 2, 1.0) < 1e-15


def test_eq3_leave_one_out_for_two_teachers_is_a_direct_divergence():
    public = [0.6, 0.3, 0.1]
    teachers = [[0.2, 0.2, 0.6], [0.5, 0.4, 0.1]]
    lambdas = [0.3, 1.0]
    with mpmath.workdps(60):
        m1 = [mpmath.mpf(0.3) * t + (1 - mpmath.mpf(0.3)) * p for t, p in zip(teachers[0], public)]
        m2 = [mpmath.mpf(t) for t in teachers[1]]
        p = [(x + y) / 2 for x, y in zip(m1, m2)]
        expected = max(O.symmetric_renyi_divergence(p, m2, 6), O.symmetric_renyi_divergence(p, m1, 6))
    assert close(O.data_dependent_loss(teachers, public, lambdas, 6), expected)
    # identical teachers: 0 up to the float inputs summing to 1 - 1e-16 (used as given)
    assert abs(O.data_dependent_loss([public, public], public, [1.0, 1.0], 18)) < 1e-15


def test_noisy_screening_formula():
    assert close(O.noisy_screening_rdp(18, 100, 1e-4, 1e-2), (mpmath.mpf(1e-4) / (100 * mpmath.mpf(1e-2))) ** 2 * 18)


# ---------------------------------------------------------------- GNMax

@pytest.mark.parametrize("counts,sigma", [((9, 1), 1.0), ((30, 10), 4.0), ((5, 5), 2.0), ((100, 0), 10.0)])
def test_two_class_union_bound_is_the_exact_error_probability(counts, sigma):
    exact_error = O.two_class_output_law(*counts, sigma)[1]
    assert close(mpmath.exp(O.log_q_gnmax(counts, sigma)), min(exact_error, mpmath.mpf(1) / 2))
    law = O.two_class_output_law(*counts, sigma)
    assert close(law[0] + law[1], 1, rel=1e-50)


def test_log_q_is_capped_at_one_minus_one_over_v():
    assert close(mpmath.exp(O.log_q_gnmax([3, 3, 3, 3], 5.0)), mpmath.mpf(3) / 4)


@pytest.mark.parametrize("counts,sigma", [((9, 1), 1.0), ((40, 2), 5.0), ((200, 0), 20.0), ((6, 4), 0.7)])
@pytest.mark.parametrize("alpha", [1.5, 2, 4, 10, 32])
def test_theorem_6_bounds_the_exact_forward_divergence(counts, sigma, alpha):
    forward, reverse = O.two_class_neighbour_divergences(*counts, sigma, alpha)
    bound = O.data_dependent_gnmax_rdp(counts, sigma, alpha)
    assert forward <= bound * (1 + mpmath.mpf(10) ** -40)
    assert max(forward, reverse) <= O.gnmax_data_independent_rdp(alpha, sigma)


def test_theorem_6_is_one_directional_on_counts_9_1():
    # Theorem 6 bounds D(M(D) || M(D')); the reverse direction can be far larger.
    forward, reverse = O.two_class_neighbour_divergences(9, 1, 1.0, 2)
    bound = O.data_dependent_gnmax_rdp([9, 1], 1.0, 2)
    assert float(bound) == pytest.approx(1.35e-4, rel=1e-2)
    assert float(reverse) == pytest.approx(0.0157, rel=1e-2)
    assert forward <= bound < reverse


def test_theorem_6_falls_back_to_the_data_independent_bound_when_q_is_large():
    # near-tie: q~ ~ 1/2, so mu2 = sigma sqrt(log 2) < 1 and Theorem 6 does not apply
    assert O.data_dependent_gnmax_rdp([5, 4], 1.0, 3) == O.gnmax_data_independent_rdp(3, 1.0)
    assert O.theorem_6_rdp(-mpmath.inf, 1.0, 3) == 0


# ---------------------------------------------------------------- conversions

def test_improved_conversion_term_at_order_18_delta_1e_5_is_0_450():
    term = O.improved_epsilon_at(18, 0, 1e-5)
    assert close(term, mpmath.log(mpmath.mpf(17) / 18) - (mpmath.log(mpmath.mpf(1e-5)) + mpmath.log(18)) / 17)
    assert float(term) == pytest.approx(0.45005, abs=5e-6)


def test_classic_conversion_and_minimisation():
    orders, values = [2, 18, 64], [0.1, 0.5, 3.0]
    classic = [mpmath.mpf(v) + mpmath.log(1e5) / (a - 1) for a, v in zip(orders, values)]
    assert close(O.epsilon_classic(orders, values, 1e-5), min(classic), rel=1e-15)
    assert O.epsilon_improved(orders, values, 1e-5) < O.epsilon_classic(orders, values, 1e-5)
    assert O.epsilon_improved([2, 3], [0, 0], 1e-5) == 0
    assert O.epsilon_improved([2, 3], [mpmath.inf, mpmath.inf], 1e-5) == mpmath.inf
    assert O.epsilon_improved([1024], [0.0], 0.5) == 0                        # clipped at 0


@pytest.mark.parametrize("alpha,rdp,delta", [(2, 0.3, 1e-5), (18, 2.0, 1e-10), (1.5, 0.01, 0.3)])
def test_improved_delta_inverts_improved_epsilon(alpha, rdp, delta):
    eps = O.improved_epsilon_at(alpha, rdp, delta)
    assert close(O.improved_delta_at(alpha, rdp, eps), delta, rel=1e-45)


def test_tv_delta_for_tiny_rdp_is_about_its_square_root():
    # Gaussian with noise 1e9: r(a) = a / 2e18; at order 1.1, sqrt(1 - e^{-r}) ~ sqrt(r) = 7.4e-10
    r = O.gaussian_rdp(1.1, 1e9)
    assert close(O.tv_delta_at(r), mpmath.sqrt(r), rel=1e-15)
    assert O.delta_from_rdp([1.1, 2], [r, O.gaussian_rdp(2, 1e9)], 0) == O.tv_delta_at(r)
    assert O.delta_from_rdp([2], [mpmath.inf], 1.0) == 1
    assert O.delta_from_rdp([2], [0], 0) == 0


@pytest.mark.parametrize("counts,sigma", [((9, 1), 1.0), ((40, 2), 5.0), ((6, 4), 0.7), ((12, 0), 2.0)])
@pytest.mark.parametrize("alpha", [1.5, 2, 4, 10])
def test_both_directions_bound_covers_the_exact_reverse_divergence(counts, sigma, alpha):
    forward, reverse = O.two_class_neighbour_divergences(*counts, sigma, alpha)
    both = O.data_dependent_gnmax_rdp_both_directions(counts, sigma, alpha)
    assert max(forward, reverse) <= both <= O.gnmax_data_independent_rdp(alpha, sigma)


def test_subsampling_cap_by_the_unsampled_value():
    base = {k: 0.1 * k for k in range(2, 9)}
    assert O.subsampled_rdp(1, lambda a: base[math.ceil(a)], 5, general=True) == mpmath.mpf(base[5])
    assert O.subsampled_rdp(0, lambda a: base[math.ceil(a)], 5, general=True) == 0
    small = O.subsampled_rdp(0.01, lambda a: base[math.ceil(a)], 5, general=True)
    assert small == O.amplified_rdp_integer(0.01, base.__getitem__, 5, general=True)
