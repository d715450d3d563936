"""Statistical and reference checks of Hot PATE voting, its aggregators, GNMax's curves and the
diversity metrics of dpledger.mechanisms.diversity.

Hot PATE (Cohen et al. 2023): coordinated votes y_i = argmax_j p_i[j] / u_j with one shared
u ~ Exp(1)^V keep every marginal p_i and make two teachers agree with probability at least
(1 - TV) / (1 + TV). The exact agreement probability of this exponential race is the probability
Jaccard index J_P(p, q) = sum_j 1 / sum_l max(p_l / p_j, q_l / q_j) (Moulton and Jiang 2018,
"Maximally consistent sampling and the Jaccard index of probability distributions", P-MinHash),
which equals (1 - TV) / (1 + TV) for two distributions uniform on supports of the same size.

Each statistical test function has overall false-alarm level ALPHA = 1e-3, split by Bonferroni
over its generated examples and, within one, over teachers or pairs; every input and every seed is
fixed (hypothesis runs derandomised), so the outcome is reproducible. Under `pytest -m slow` the generated tests run
with the slow hypothesis profile's example counts (tests/conftest.py).
"""
import json
import math
from itertools import combinations

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binomtest, chisquare

from dpledger.accounting import DEFAULT_ORDERS
from dpledger.mechanisms import (ConfidentGNMax, GNMax, Targmax, ThresholdWeightedSampler, cast_votes, data_dependent_gnmax_rdp,
                        log_q_gnmax, vote_histogram)
from dpledger.mechanisms.diversity import (DiversityCurve, DiversityPreservation, aggregator_output_law, diversity_curve,
                                  diversity_preservation, mean_diversity_curve, query_seed, targmax_probabilities,
                                  vote_draws)
from tests.conftest import examples

ALPHA = 1e-3
"""Overall false-alarm level of each statistical test function, split by Bonferroni over its
generated examples (`statistical`) and, within an example, over teachers or pairs."""

ORDERS = np.asarray(DEFAULT_ORDERS)


def statistical(examples_default: int, examples_slow: int, *strategies):
    """@given(level, *strategies) for a statistical check(level, ...) with examples(examples_default,
    examples_slow): each example tests at level ALPHA / (the profile's count), so the family-wise
    false-alarm rate of the whole test stays <= ALPHA (a generated search over ~200 examples at a
    per-example level would otherwise find a chance rejection)."""
    chosen = examples(examples_default, examples_slow)
    return lambda check: chosen(given(st.just(ALPHA / chosen.count), *strategies)(check))


@st.composite
def ensembles(draw, max_teachers=5, max_vocab=8, zeros=True):
    """Teachers (N, V) with probabilities w / sum(w), integer weights in [0, 20] (some zero when
    `zeros`): every positive probability is >= 1 / (20 V), so chi-square cells stay well filled."""
    n = draw(st.integers(2, max_teachers))
    vocab = draw(st.integers(2, max_vocab))
    low = 0 if zeros else 1
    rows = []
    for _ in range(n):
        weights = draw(st.lists(st.integers(low, 20), min_size=vocab, max_size=vocab).filter(lambda w: sum(w) > 0))
        rows.append(np.asarray(weights, dtype=np.float64) / sum(weights))
    return np.stack(rows)


def total_variation(p, q) -> float:
    return 0.5 * float(np.abs(p - q).sum())


def probability_jaccard(p, q) -> float:
    """J_P(p, q): the exact agreement probability of the shared-exponential race (Moulton and Jiang 2018)."""
    total = 0.0
    for j in range(p.size):
        if p[j] > 0 and q[j] > 0:
            total += 1.0 / sum(max(p[l] / p[j], q[l] / q[j]) for l in range(p.size))
    return total


def marginals_fit(votes: np.ndarray, teachers: np.ndarray, level: float = ALPHA) -> None:
    """Chi-square goodness of fit of every teacher's vote frequencies to p_i, at overall level
    `level` (Bonferroni over teachers); tokens with p_i[j] = 0 must never be voted."""
    samples, n = votes.shape
    for i in range(n):
        observed = np.bincount(votes[:, i], minlength=teachers.shape[1])
        support = teachers[i] > 0
        assert observed[~support].sum() == 0, f"teacher {i} voted a zero-probability token"
        if support.sum() < 2:
            assert observed[support].sum() == samples
            continue
        expected = samples * teachers[i, support]
        assert expected.min() >= 5  # the chi-square approximation's usual condition
        pvalue = chisquare(observed[support], expected).pvalue
        assert pvalue >= level / n, f"teacher {i}: chi-square p-value {pvalue:.2e} < {level / n:.1e}"


# ------------------------------------------------------------------------------------------------
# (a) coordinated votes keep every teacher's marginal


@statistical(12, 200, ensembles(), st.integers(0, 2 ** 32))
def _marginals_of_cast_votes(level, teachers, seed):
    samples = 4000
    batch = np.broadcast_to(teachers, (samples,) + teachers.shape)  # one shared Exp(1) vector per row
    marginals_fit(cast_votes(batch, True, seed), teachers, level)


test_cast_votes_coordinated_marginals_chi_square = _marginals_of_cast_votes


@statistical(12, 200, ensembles(), st.booleans(), st.integers(0, 2 ** 32))
def _marginals_of_vote_draws(level, teachers, coordinated, seed):
    marginals_fit(vote_draws(teachers, coordinated, 4000, seed), teachers, level)


test_vote_draws_marginals_chi_square = _marginals_of_vote_draws


def test_vote_draws_shape_determinism_and_batch_agreement_with_cast_votes():
    rng = np.random.default_rng(3)
    teachers = rng.dirichlet(np.ones(7), size=4)
    hot = vote_draws(teachers, True, 300, 11)
    assert hot.shape == (300, 4) and hot.dtype == np.int64
    np.testing.assert_array_equal(hot, vote_draws(teachers, True, 300, 11))
    assert not np.array_equal(hot, vote_draws(teachers, True, 300, 12))
    # identical teachers under coordination vote alike in every draw; independent ones do not
    same = np.stack([teachers[0]] * 5)
    assert np.all(vote_draws(same, True, 200, 0) == vote_draws(same, True, 200, 0)[:, :1])
    assert not np.all(vote_draws(same, False, 200, 0) == vote_draws(same, False, 200, 0)[:, :1])


# ------------------------------------------------------------------------------------------------
# (b) coordinated agreement >= (1 - TV) / (1 + TV); (c) independent agreement = sum_j p_i[j] p_k[j]


def pair_checks(votes, teachers, law, alternative, level=ALPHA):
    """Binomial test of each pair's agreement count against law(p_i, p_k) at overall level `level`
    (Bonferroni over pairs). alternative 'less': reject only when agreement is significantly
    below law (a one-sided lower bound); 'two-sided': equality."""
    samples, n = votes.shape
    pairs = list(combinations(range(n), 2))
    for i, k in pairs:
        agree = int(np.sum(votes[:, i] == votes[:, k]))
        target = law(teachers[i], teachers[k])
        if target >= 1.0 - 1e-12:
            assert agree == samples
            continue
        if target <= 1e-12:
            assert agree == 0
            continue
        pvalue = binomtest(agree, samples, target, alternative=alternative).pvalue
        assert pvalue >= level / len(pairs), (
            f"pair {(i, k)}: agreement {agree / samples:.4f} against {target:.4f}, p-value {pvalue:.2e}")


def tv_bound(p, q):
    tv = total_variation(p, q)
    return (1.0 - tv) / (1.0 + tv)


@statistical(10, 150, ensembles(max_teachers=4), st.integers(0, 2 ** 32))
def _coordinated_agreement(level, teachers, seed):
    votes = vote_draws(teachers, True, 6000, seed)
    # one-sided: agreement is not significantly below (1 - TV) / (1 + TV) ...
    pair_checks(votes, teachers, tv_bound, "less", level / 2)
    # ... and equals the exact exponential-race agreement J_P, which is >= that bound
    pair_checks(votes, teachers, probability_jaccard, "two-sided", level / 2)
    for i, k in combinations(range(teachers.shape[0]), 2):
        assert probability_jaccard(teachers[i], teachers[k]) >= tv_bound(teachers[i], teachers[k]) - 1e-12


test_coordinated_agreement_at_least_tv_bound = _coordinated_agreement


@st.composite
def uniform_pairs(draw, equal_sizes=True):
    vocab = draw(st.integers(2, 12))
    size_a = draw(st.integers(1, vocab))
    size_b = size_a if equal_sizes else draw(st.integers(1, vocab))
    a = draw(st.permutations(range(vocab)))[:size_a]
    b = draw(st.permutations(range(vocab)))[:size_b]
    teachers = np.zeros((2, vocab))
    teachers[0, list(a)] = 1.0 / size_a
    teachers[1, list(b)] = 1.0 / size_b
    return teachers


@statistical(12, 200, uniform_pairs(), st.integers(0, 2 ** 32))
def _uniform_equality(level, teachers, seed):
    p, q = teachers
    assert probability_jaccard(p, q) == pytest.approx(tv_bound(p, q), rel=1e-12, abs=1e-15)
    pair_checks(vote_draws(teachers, True, 6000, seed), teachers, tv_bound, "two-sided", level)


test_coordinated_agreement_equals_tv_bound_for_equal_size_uniform_supports = _uniform_equality


def test_unequal_uniform_supports_agree_at_their_jaccard_index_above_the_tv_bound():
    """Uniform on A = {0, 1} and on B = {0, 1, 2, 3}: agreement |A & B| / |A | B| = 1/2, above
    (1 - TV) / (1 + TV) = 1/3: the bound is tight for equal-size supports only."""
    teachers = np.array([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    assert tv_bound(*teachers) == pytest.approx(1 / 3) and probability_jaccard(*teachers) == pytest.approx(0.5)
    pair_checks(vote_draws(teachers, True, 8000, 5), teachers, probability_jaccard, "two-sided")
    with pytest.raises(AssertionError):
        pair_checks(vote_draws(teachers, True, 8000, 5), teachers, tv_bound, "two-sided")


@statistical(10, 150, ensembles(max_teachers=4), st.integers(0, 2 ** 32))
def _cold_agreement(level, teachers, seed):
    votes = vote_draws(teachers, False, 6000, seed)
    pair_checks(votes, teachers, lambda p, q: float(np.dot(p, q)), "two-sided", level)


test_cold_agreement_is_the_product_form = _cold_agreement


def test_cast_votes_cold_agreement_is_the_product_form():
    teachers = np.array([[0.5, 0.3, 0.2, 0.0], [0.1, 0.3, 0.2, 0.4], [0.25, 0.25, 0.25, 0.25]])
    batch = np.broadcast_to(teachers, (6000,) + teachers.shape)
    pair_checks(cast_votes(batch, False, 7), teachers, lambda p, q: float(np.dot(p, q)), "two-sided", ALPHA / 2)
    pair_checks(cast_votes(batch, True, 7), teachers, probability_jaccard, "two-sided", ALPHA / 2)


# ------------------------------------------------------------------------------------------------
# (d) TARGMAX and TWS never release a token whose count is below T

histograms = st.lists(st.integers(0, 40), min_size=2, max_size=12)


@examples(80, 2000)
@given(histograms, st.integers(1, 50), st.floats(1.0, 20.0), st.integers(0, 2 ** 32))
def _threshold_release(counts, threshold, gamma, seed):
    counts = np.asarray(counts)
    n = counts.sum()
    below = counts < threshold
    token = Targmax(threshold).aggregate(counts)
    assert token is None or counts[token] >= threshold
    assert (token is None) == (counts.max() < threshold)
    one_hot = targmax_probabilities(counts, threshold)
    assert np.all(one_hot[below] == 0) and one_hot.sum() == (0.0 if token is None else 1.0)
    tws = ThresholdWeightedSampler(threshold, gamma)
    probs = tws.probabilities(counts)
    assert np.all(probs >= 0) and np.all(probs[below] == 0)
    assert probs.sum() <= 1.0 + 1e-12
    if n > 0:
        assert np.all(probs <= gamma * counts / n * (1 + 1e-12))  # correlation: <= gamma times the vote share
    rng = np.random.default_rng(seed)
    for _ in range(20):
        released = tws.aggregate(counts, rng)
        assert released is None or counts[released] >= threshold


test_targmax_and_tws_never_release_below_threshold = _threshold_release


# ------------------------------------------------------------------------------------------------
# (e) GNMax's data-independent curve is dp-accounting's Gaussian mechanism


def dp_accounting_gaussian_rdp(*noise_multipliers):
    """dp-accounting's RDP (orders, values) of Gaussian mechanisms composed, each stated by its noise
    multiplier (noise std / L2 sensitivity), under replace-one neighbours."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(m) for m in noise_multipliers]))
    return np.asarray(accountant._orders, dtype=np.float64), np.asarray(accountant._rdp, dtype=np.float64)


@examples(40, 500)
@given(st.floats(0.05, 1e4), st.floats(0.05, 1e4))
def _gnmax_against_dp_accounting(sigma, sigma_threshold):
    # GNMax: the histogram's L2 sensitivity under replace-one is sqrt(2), so noise multiplier sigma / sqrt 2
    orders, expected = dp_accounting_gaussian_rdp(sigma / math.sqrt(2.0))
    np.testing.assert_allclose(GNMax(sigma).rdp_values(orders), expected, rtol=1e-12, atol=0)
    # Confident-GNMax's screen: the max count has sensitivity 1, noise multiplier s1
    confident = ConfidentGNMax(threshold=10.0, sigma_threshold=sigma_threshold, sigma=sigma)
    orders, screen = dp_accounting_gaussian_rdp(sigma_threshold)
    np.testing.assert_allclose(confident.screen_rdp(orders), screen, rtol=1e-12, atol=0)
    orders, both = dp_accounting_gaussian_rdp(sigma_threshold, sigma / math.sqrt(2.0))
    np.testing.assert_allclose(confident.rdp_values(orders), both, rtol=1e-12, atol=0)


test_gnmax_curves_match_dp_accounting_gaussian = _gnmax_against_dp_accounting


def test_dp_accounting_grid_is_the_default_grid():
    orders, _ = dp_accounting_gaussian_rdp(1.0)
    np.testing.assert_array_equal(orders, ORDERS)


# ------------------------------------------------------------------------------------------------
# (f) Papernot et al. 2018 Theorem 6, written out independently in mpmath

DPS = 60
"""mpmath working digits (the bound is evaluated as log1p of a sum of non-negative terms, so it
keeps them all however small it is)."""


def direct_q(counts, sigma):
    """Proposition 7 (Papernot et al. 2018): q~ = sum_{j != j*} Pr[N(0, 2 sigma^2) >= c_{j*} - c_j]
    = sum 1/2 erfc(gap / (2 sigma)), j* the first plurality token; capped at 1 - 1/V (as
    dpledger.mechanisms.pate documents: the plurality token wins with probability >= 1/V)."""
    counts = [int(c) for c in counts]
    top = counts.index(max(counts))
    with mpmath.workdps(DPS):
        sigma = mpmath.mpf(sigma)
        q = mpmath.fsum(mpmath.erfc((counts[top] - c) / (2 * sigma)) / 2 for j, c in enumerate(counts) if j != top)
        return min(q, 1 - mpmath.mpf(1) / len(counts))


def direct_theorem_6(q, sigma, orders):
    """Papernot et al. 2018, Theorem 6, with mu2 = sigma sqrt(log 1/q), mu1 = mu2 + 1 and GNMax's RDP
    eps_i = mu_i / sigma^2 at mu_i. Conditions: q < 1, mu2 > 1, q e^{eps2} < 1 (A finite),
    q <= e^{(mu2-1) eps2} / (mu1/(mu1-1) mu2/(mu2-1))^mu2, and the order a < mu1. Then
      D_a <= log((1-q) A^(a-1) + q B^(a-1)) / (a-1),
      A = (1-q) / (1 - (q e^{eps2})^((mu2-1)/mu2)),  B = e^{eps1} / q^(1/(mu1-1)).
    Returns one (bound or None where a condition fails, the smallest relative margin of the
    conditions, to skip orders that float rounding could decide either way) per order."""
    with mpmath.workdps(DPS):
        sigma = mpmath.mpf(sigma)
        if q >= 1 or q <= 0:
            return [(None, mpmath.inf)] * len(orders)
        mu2 = sigma * mpmath.sqrt(mpmath.log(1 / q))
        mu1 = mu2 + 1
        eps1, eps2 = mu1 / sigma ** 2, mu2 / sigma ** 2
        margins = [abs(mu2 - 1) / mu2]
        valid = mu2 > 1
        if valid:
            log_limit = (mu2 - 1) * eps2 - mu2 * mpmath.log((mu1 / (mu1 - 1)) * (mu2 / (mu2 - 1)))
            margins += [abs(-mpmath.log(q) - eps2) / eps2, abs(log_limit - mpmath.log(q)) / max(abs(log_limit), 1)]
            valid = q * mpmath.exp(eps2) < 1 and mpmath.log(q) <= log_limit
    results = []
    for order in orders:
        with mpmath.workdps(DPS):
            order = mpmath.mpf(float(order))
            margin = min(margins + [abs(mu1 - order) / mu1])
        if not (valid and order < mu1):
            results.append((None, margin))
            continue
        with mpmath.workdps(DPS):
            # (1-q) A^(a-1) + q B^(a-1) = 1 + x with x = (1-q) (A^(a-1) - 1) + q (B^(a-1) - 1), both
            # terms >= 0 (A, B >= 1): log1p(x) keeps every digit where log(1 + x) would lose log10(1/x)
            log_a = mpmath.log1p(-q) - mpmath.log1p(-(q * mpmath.exp(eps2)) ** ((mu2 - 1) / mu2))
            log_b = eps1 - mpmath.log(q) / (mu1 - 1)
            x = (1 - q) * mpmath.expm1((order - 1) * log_a) + q * mpmath.expm1((order - 1) * log_b)
            bound = mpmath.log1p(x) / (order - 1)
        results.append((bound, margin))
    return results


def literal_theorem_6(q, sigma, order, digits=1000):
    """Theorem 6's bound exactly as printed, log((1-q) A^(a-1) + q B^(a-1)) / (a-1), at `digits`
    digits (enough for log(1 + x) with x down to 1e-(digits - 60))."""
    with mpmath.workdps(digits):
        sigma, order = mpmath.mpf(sigma), mpmath.mpf(float(order))
        mu2 = sigma * mpmath.sqrt(mpmath.log(1 / q))
        mu1 = mu2 + 1
        eps1, eps2 = mu1 / sigma ** 2, mu2 / sigma ** 2
        a = (1 - q) / (1 - (q * mpmath.exp(eps2)) ** ((mu2 - 1) / mu2))
        b = mpmath.exp(eps1) / q ** (1 / (mu1 - 1))
        return mpmath.log((1 - q) * a ** (order - 1) + q * b ** (order - 1)) / (order - 1)


@st.composite
def gnmax_cases(draw):
    vocab = draw(st.integers(2, 8))
    top = draw(st.integers(0, 600))
    spread = draw(st.sampled_from([1.0, 0.5, 0.1, 0.02]))  # small spread: a confident histogram
    others = draw(st.lists(st.integers(0, max(0, int(top * spread))), min_size=vocab - 1, max_size=vocab - 1))
    counts = [top] + others
    position = draw(st.integers(0, vocab - 1))
    counts[0], counts[position] = counts[position], counts[0]
    sigma = draw(st.one_of(st.floats(0.3, 100.0), st.sampled_from([1.0, 5.0, 20.0, 40.0])))
    return np.asarray(counts), sigma


def check_theorem_6(counts, sigma, orders=ORDERS):
    """Returns how many orders Theorem 6 was applied at (the rest must be alpha / sigma^2)."""
    log_q = log_q_gnmax(counts, sigma)
    q = direct_q(counts, sigma)
    assert log_q == pytest.approx(float(mpmath.log(q)), rel=1e-9, abs=1e-12)
    values = data_dependent_gnmax_rdp(log_q, sigma, orders)
    independent = orders / sigma ** 2
    assert np.all(values <= independent)
    applied = 0
    for order, value, plain, (bound, margin) in zip(orders, values, independent, direct_theorem_6(q, sigma, orders)):
        if margin < 1e-8:
            continue  # a condition sits on its boundary: float rounding may decide it either way
        if bound is None:
            assert value == pytest.approx(plain, rel=1e-12), f"order {order}: conditions fail, expected alpha / sigma^2"
            continue
        applied += 1
        expected = min(float(bound), plain)
        if expected < 1e-290:  # subnormal range: float keeps too few digits for a relative test
            assert value < 1e-280
        else:
            assert value == pytest.approx(expected, rel=1e-9, abs=0), f"order {order}: {value!r} vs Theorem 6 {expected!r}"
    return applied


@examples(60, 1000)
@given(gnmax_cases())
def _theorem_6(case):
    counts, sigma = case
    check_theorem_6(counts, sigma)


test_data_dependent_gnmax_matches_direct_theorem_6 = _theorem_6


@pytest.mark.parametrize("counts, sigma", [([250, 5, 0], 40.0), ([300, 20, 10, 0], 20.0), ([90, 10], 5.0),
                                           ([10_000, 0, 0], 40.0), ([60, 0, 0, 0, 0], 3.0), ([130, 120, 0], 40.0)])
def test_direct_theorem_6_fixed_cases(counts, sigma):
    applied = check_theorem_6(np.asarray(counts), sigma)
    # the first five are confident: Theorem 6 applies at the low orders; the last is not
    assert (applied > 0) == (counts != [130, 120, 0])
    q = direct_q(counts, sigma)
    for order in (1.5, 2.0, 5.0):
        bound, _ = direct_theorem_6(q, sigma, [order])[0]
        if bound is not None and bound > mpmath.mpf("1e-900"):  # the log1p evaluation is the printed formula
            assert abs(bound - literal_theorem_6(q, sigma, order)) <= mpmath.mpf("1e-50") * bound


# ------------------------------------------------------------------------------------------------
# (g) diversity metrics


def reference_curve(teachers, thresholds, coordinated, samples, seed):
    """Naive per-draw loops over vote_draws and vote_histogram, for the metric arithmetic."""
    votes = vote_draws(teachers, coordinated, samples, seed)
    counts = vote_histogram(votes, teachers.shape[1])
    pbar = teachers.mean(axis=0)
    out = {"yield_": [], "coverage": [], "support_size": [], "passing_mass": []}
    for t in thresholds:
        out["yield_"].append(np.mean([row.max() >= t for row in counts]))
        support = [j for j in range(teachers.shape[1]) if any(row[j] >= t for row in counts)]
        out["coverage"].append(sum(pbar[j] for j in support))
        out["support_size"].append(len(support))
        out["passing_mass"].append(np.mean([sum(pbar[j] for j in range(teachers.shape[1]) if row[j] >= t) for row in counts]))
    return out


@examples(15, 200)
@given(ensembles(max_teachers=8, max_vocab=10), st.booleans(), st.integers(0, 2 ** 32))
def _curve_reference(teachers, coordinated, seed):
    thresholds = (1, 2, 3, 5, 8, 9)
    curve = diversity_curve(teachers, thresholds, coordinated, samples=60, seed=seed)
    reference = reference_curve(teachers, thresholds, coordinated, 60, seed)
    for name, values in reference.items():
        np.testing.assert_allclose(getattr(curve, name), values, rtol=1e-12, atol=1e-15, err_msg=name)
    # monotone non-increasing in T
    for name in ("yield_", "coverage", "support_size", "passing_mass"):
        assert np.all(np.diff(getattr(curve, name)) <= 1e-15), name
    json.dumps(curve.to_dict(), allow_nan=False)


test_diversity_curve_matches_reference_and_is_monotone = _curve_reference


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hot_coverage_dominates_cold_for_identical_high_entropy_teachers(seed):
    n, vocab = 16, 64
    p = np.random.default_rng(seed).dirichlet(np.full(vocab, 50.0))  # near uniform: entropy ~ log 64
    teachers = np.stack([p] * n)
    thresholds = tuple(range(n // 4, n + 1))
    hot = diversity_curve(teachers, thresholds, True, samples=200, seed=seed)
    cold = diversity_curve(teachers, thresholds, False, samples=200, seed=seed)
    assert all(h >= c for h, c in zip(hot.coverage, cold.coverage))
    assert hot.yield_ == (1.0,) * len(thresholds)  # identical coordinated teachers always agree
    assert min(hot.coverage) > 0.9 and max(cold.coverage[1:]) == 0.0  # cold never reaches 5 of 16 here
    assert hot.support_size[0] > cold.support_size[0]


def test_mean_curve_is_paired_and_averages_queries():
    rng = np.random.default_rng(8)
    queries = rng.dirichlet(np.full(32, 2.0), size=(3, 10))
    thresholds = (2, 5, 10)
    hot = mean_diversity_curve(queries, thresholds, True, samples=80, seed=4)
    cold = mean_diversity_curve(queries, thresholds, False, samples=80, seed=4)
    singles = [diversity_curve(q, thresholds, True, samples=80, seed=query_seed(4, i)) for i, q in enumerate(queries)]
    assert hot.queries == 3 and hot.teachers == 10 and hot.samples == 80
    np.testing.assert_allclose(hot.coverage, np.mean([s.coverage for s in singles], axis=0), rtol=1e-15)
    np.testing.assert_allclose(hot.yield_stderr, np.sqrt(np.sum([np.square(s.yield_stderr) for s in singles], axis=0)) / 3)
    assert all(h >= c for h, c in zip(hot.yield_, cold.yield_))
    payload = json.loads(json.dumps(hot.to_dict(), allow_nan=False))
    assert payload["thresholds"] == [2, 5, 10] and isinstance(payload["support_size"][0], float)


@examples(10, 100)
@given(ensembles(max_teachers=6, max_vocab=10), st.integers(0, 2 ** 32), st.randoms(use_true_random=False))
def _permutation(teachers, seed, random):
    order = list(range(teachers.shape[0]))
    random.shuffle(order)
    thresholds = (1, 2, 4)
    np.testing.assert_array_equal(vote_draws(teachers[order], True, 50, seed), vote_draws(teachers, True, 50, seed)[:, order])
    assert diversity_curve(teachers[order], thresholds, True, 50, seed) == diversity_curve(teachers, thresholds, True, 50, seed)
    stacked = np.stack([teachers, teachers[::-1]])
    assert (mean_diversity_curve(stacked[:, order], thresholds, True, 30, seed)
            == mean_diversity_curve(stacked, thresholds, True, 30, seed))


test_coordinated_metrics_invariant_to_permuting_teachers = _permutation


# ------------------------------------------------------------------------------------------------
# (tau, beta, gamma)-diversity preservation and aggregator output laws


def test_diversity_preservation_hand_example_and_planted_violations():
    teachers = np.array([[0.6, 0.4, 0.0], [0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    pbar = teachers.mean(axis=0)
    # tau = 2, beta = 1: token 0 needs max(2/3 * 0.5, 3/3 * 0.1) = 1/3; token 1: max(2/3 * 0.3, 0.1) = 0.2;
    # token 2: only c = 2 at q = 0.2 (q = 0 is vacuous): 2/3 * 0.2
    law = np.array([1 / 3, 0.2, 2 / 15])
    check = diversity_preservation(law, teachers, tau=2, beta=1.0, gamma=1.0)
    assert check.holds and check.transfer_slack == pytest.approx(0.0, abs=1e-15)
    assert check.correlation_slack == pytest.approx(min(pbar - law))
    planted = law.copy()
    planted[1] = 0.19
    bad = diversity_preservation(planted, teachers, tau=2, beta=1.0, gamma=1.0)
    assert not bad.transfer_holds and bad.transfer_offending == (1,) and bad.transfer_violations == 1
    assert bad.transfer_slack == pytest.approx(-0.01)
    hot = np.array([0.5, 0.1, 0.1])  # above pbar_0 = 0.4 for gamma = 1.2 (0.48)
    greedy = diversity_preservation(hot, teachers, tau=3, beta=0.1, gamma=1.2)
    assert greedy.transfer_holds and not greedy.correlation_holds and greedy.correlation_offending == (0,)
    assert greedy.correlation_slack == pytest.approx(1.2 * 0.4 - 0.5)
    assert diversity_preservation(law, teachers, tau=4, beta=1.0, gamma=1.0).transfer_slack is None  # tau > n
    json.dumps(bad.to_dict(), allow_nan=False)
    assert isinstance(bad, DiversityPreservation)


@examples(25, 300)
@given(ensembles(max_teachers=6, max_vocab=10), st.integers(1, 6), st.floats(0.05, 1.0),
       st.integers(0, 2 ** 32))
def _grid_agreement(teachers, tau, beta, seed):
    """The default grid (distinct teacher probabilities) equals the same grid given explicitly,
    computed by the other code path, and a finer grid never asks for less."""
    rng = np.random.default_rng(seed)
    law = rng.dirichlet(np.ones(teachers.shape[1])) * rng.uniform(0.2, 1.0)
    default = diversity_preservation(law, teachers, tau, beta, gamma=1.0)
    explicit = diversity_preservation(law, teachers, tau, beta, gamma=1.0, q_grid=np.unique(teachers[teachers > 0]))
    assert default.transfer_holds == explicit.transfer_holds and default.transfer_offending == explicit.transfer_offending
    if default.transfer_slack is None:
        assert explicit.transfer_slack is None
    else:
        assert default.transfer_slack == pytest.approx(explicit.transfer_slack, rel=1e-12, abs=1e-15)
    coarse = diversity_preservation(law, teachers, tau, beta, gamma=1.0, q_grid=[0.5, 1.0])
    if coarse.transfer_slack is not None:
        assert default.transfer_slack <= coarse.transfer_slack + 1e-15


test_diversity_preservation_default_grid_matches_explicit = _grid_agreement


def test_tws_on_coordinated_votes_transfers_diversity_and_cold_votes_do_not():
    n, vocab, samples, threshold = 20, 16, 2000, 10  # T = n / 2
    p = np.random.default_rng(21).dirichlet(np.full(vocab, 50.0))
    teachers = np.stack([p] * n)
    tws = ThresholdWeightedSampler(threshold, gamma=1.0)
    hot, hot_se = aggregator_output_law(tws.probabilities, teachers, True, samples, seed=3)
    # identical coordinated teachers all vote the token y ~ p: TWS outputs it with probability 1
    frequencies = np.bincount(vote_draws(teachers, True, samples, 3)[:, 0], minlength=vocab) / samples
    np.testing.assert_allclose(hot, frequencies, rtol=1e-15, atol=0)
    np.testing.assert_allclose(hot_se, np.sqrt(frequencies * (1 - frequencies) / (samples - 1)), rtol=1e-12)
    assert np.all(np.abs(hot - p) <= 5.0 * np.sqrt(p * (1 - p) / samples))  # law_j ~ p_j
    assert diversity_preservation(hot, teachers, tau=threshold, beta=0.5, gamma=2.0).holds
    cold, _ = aggregator_output_law(tws.probabilities, teachers, False, samples, seed=3)
    assert cold.sum() < 0.01  # Pr[some count >= 10 of 20] over 16 near-uniform tokens is ~1e-6
    verdict = diversity_preservation(cold, teachers, tau=threshold, beta=0.5, gamma=2.0)
    assert not verdict.transfer_holds and verdict.transfer_violations == vocab and verdict.correlation_holds
    targmax, _ = aggregator_output_law(lambda c: targmax_probabilities(c, threshold), teachers, True, samples, seed=3)
    np.testing.assert_array_equal(targmax, hot)


def test_aggregator_output_law_respects_tws_correlation_on_distinct_teachers():
    rng = np.random.default_rng(5)
    teachers = rng.dirichlet(np.ones(12), size=9)
    tws = ThresholdWeightedSampler(3, 1.5)
    law, stderr = aggregator_output_law(tws.probabilities, teachers, True, 400, 1)
    assert law.shape == stderr.shape == (12,) and law.sum() <= 1.0 + 1e-12
    # per draw TWS gives j at most gamma c_j / n, so the law is at most gamma times the mean vote share
    share = vote_histogram(vote_draws(teachers, True, 400, 1), 12).mean(axis=0) / 9
    assert np.all(law <= 1.5 * share + 1e-12)
    assert np.all(stderr >= 0) and np.all(stderr[law == 0] == 0)
    # and the vote share itself estimates pbar (marginals are kept): within 5 standard errors
    assert np.all(np.abs(share - teachers.mean(axis=0)) <= 5 * np.sqrt(teachers.mean(axis=0) / 400) + 1e-12)


# ------------------------------------------------------------------------------------------------
# input validation

GOOD = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])


@pytest.mark.parametrize("call, message", [
    (lambda: vote_draws(GOOD, True, 0, 0), "samples must be an integer >= 1, got 0"),
    (lambda: vote_draws(GOOD, True, 10, -1), "seed must be an integer >= 0, got -1"),
    (lambda: vote_draws(GOOD, 1, 10, 0), "coordinated must be True or False, got 1"),
    (lambda: vote_draws(GOOD[0], True, 10, 0), r"teachers must have 2 axes \(last = vocabulary\), got shape \(3,\)"),
    (lambda: vote_draws([[0.5, 0.6]], True, 10, 0), "teachers rows must sum to 1 within 1e-06, off by 0.1"),
    (lambda: vote_draws([[1.5, -0.5]], True, 10, 0), "teachers must be non-negative, got entry -0.5"),
    (lambda: vote_draws([[np.nan, 1.0]], True, 10, 0), r"teachers must be finite \(no NaN or inf\)"),
    (lambda: diversity_curve(GOOD, [], True), "thresholds must be a non-empty sequence of integers >= 1, got an empty one"),
    (lambda: diversity_curve(GOOD, [0, 1], True), "threshold must be an integer >= 1, got 0"),
    (lambda: diversity_curve(GOOD, [2, 1], True), r"thresholds must be strictly increasing, got \[2, 1\]"),
    (lambda: diversity_curve(GOOD, 3, True), "thresholds must be a non-empty sequence of integers >= 1, got 3"),
    (lambda: mean_diversity_curve(GOOD, [1], True), r"queries must have 3 axes \(last = vocabulary\), got shape \(2, 3\)"),
    (lambda: diversity_preservation([0.2, 0.2, 0.2], GOOD, 0, 0.5, 1.0), "tau must be an integer >= 1, got 0"),
    (lambda: diversity_preservation([0.2, 0.2, 0.2], GOOD, 1, 0.0, 1.0), r"beta must be in \(0, 1\], got 0"),
    (lambda: diversity_preservation([0.2, 0.2, 0.2], GOOD, 1, 1.5, 1.0), r"beta must be in \(0, 1\], got 1.5"),
    (lambda: diversity_preservation([0.2, 0.2, 0.2], GOOD, 1, 0.5, 0.9), "gamma must be >= 1, got 0.9"),
    (lambda: diversity_preservation([0.2, 0.2, 0.2], GOOD, 1, 0.5, math.inf), "gamma must be finite, got inf"),
    (lambda: diversity_preservation([0.2, 0.2], GOOD, 1, 0.5, 1.0), r"output_law must have shape \(3,\), got \(2,\)"),
    (lambda: diversity_preservation([0.6, 0.6, 0.0], GOOD, 1, 0.5, 1.0),
     r"output_law must sum to <= 1 \(the rest is failure\), got 1.2"),
    (lambda: diversity_preservation([0.2, 0.2, 0.2], GOOD, 1, 0.5, 1.0, q_grid=[0.0]), r"q_grid values must be in \(0, 1\]"),
    (lambda: aggregator_output_law(lambda c: np.ones(3), GOOD, True, 5, 0),
     r"aggregate_probabilities\(counts\) must sum to <= 1 \(the rest is failure\), got 3"),
    (lambda: aggregator_output_law(None, GOOD, True, 5, 0), "aggregate_probabilities must be callable, got None"),
    (lambda: targmax_probabilities([3, 1], 0), "threshold must be an integer >= 1, got 0"),
    (lambda: query_seed(0, -1), "index must be an integer >= 0, got -1"),
])
def test_input_validation(call, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        call()


def test_curve_dataclass_is_frozen_and_json_safe():
    curve = diversity_curve(GOOD, (1, 2), True, samples=20, seed=0)
    assert isinstance(curve, DiversityCurve)
    with pytest.raises(AttributeError):
        curve.samples = 3
    payload = json.loads(json.dumps(curve.to_dict(), allow_nan=False))
    assert set(payload) == {"coordinated", "teachers", "samples", "queries", "thresholds", "yield_", "yield_stderr",
                            "coverage", "support_size", "passing_mass", "passing_mass_stderr"}
