"""PATE's data-dependent analyses under each neighbouring relation, from Papernot et al. 2018 ("Scalable
Private Learning with PATE") and the definitions, in mpmath.

Relations: one teacher replaced (a vote moves: two counts change by one, L2 sensitivity sqrt 2) or one
added or removed (one count changes by one, L2 sensitivity 1). GNMax is (mu, mu s^2 / (2 sigma^2))-RDP
at L2 sensitivity s (Mironov 2017, Corollary 3). The threshold check's largest count changes by at
most one under every relation.
"""
from __future__ import annotations

import mpmath

from tests.oracles._mp import INF, mp, order, precise, vector
from tests.oracles.renyi import renyi_divergence

REPLACE, ADD_REMOVE = "replace_one", "add_or_remove_one"


def _sensitivity_squared(relation):
    if relation not in (REPLACE, ADD_REMOVE):
        raise ValueError(f"unknown relation {relation!r}")
    return mpmath.mpf(2) if relation == REPLACE else mpmath.mpf(1)


def _gap_move(relation):
    """The most one neighbour moves c_{j*} - c_j: both counts (replace) or one (add/remove)."""
    return 2 if relation == REPLACE else 1


@precise
def gnmax_slope(sigma, relation):
    """c with GNMax's RDP c * mu at order mu: s^2 / (2 sigma^2)."""
    return _sensitivity_squared(relation) / (2 * mp(sigma) ** 2)


@precise
def union_bound(counts, sigma, reduce_by=0):
    """sum_{j != j*} Pr[N(0, 2 sigma^2) >= c_{j*} - c_j - reduce_by] (Proposition 7)."""
    c, s = vector(counts), mp(sigma)
    top = max(range(len(c)), key=lambda j: (c[j], -j))
    return mpmath.fsum(mpmath.erfc((c[top] - c[j] - reduce_by) / (2 * s)) / 2 for j in range(len(c)) if j != top)


@precise
def log_q(counts, sigma):
    """log min(1 - 1/V, Proposition 7's union bound) at D."""
    return mpmath.log(min(union_bound(counts, sigma), 1 - mpmath.mpf(1) / len(counts)))


@precise
def log_q_neighbours(counts, sigma, relation):
    """log min(1, the union bound at every neighbour D' for j* = argmax D): gaps reduced by the relation's move."""
    return mpmath.log(min(union_bound(counts, sigma, _gap_move(relation)), mpmath.mpf(1)))


@precise
def theorem_6(log_q_value, slope, alpha):
    """Papernot et al. 2018, Theorem 6 for a mechanism that is (mu, slope * mu)-RDP at every mu, with
    mu2 = sqrt(log(1/q) / slope) (Proposition 10's choice: eps2 = slope mu2), mu1 = mu2 + 1; when
    mu2 > 1, alpha < mu1, q < e^{-eps2} and q <= e^{(mu2-1) eps2} / (mu1/(mu1-1) mu2/(mu2-1))^{mu2}:
      D_alpha <= log((1-q) A^{alpha-1} + q B^{alpha-1}) / (alpha-1),
      A = (1-q) / (1 - (q e^{eps2})^{(mu2-1)/mu2}),  B = e^{eps1} / q^{1/(mu1-1)};
    else (and in any case at most) slope * alpha, the data-independent bound."""
    a, c, lq = order(alpha), mp(slope), mp(log_q_value)
    independent = c * a
    if lq == -INF:
        return mpmath.mpf(0)
    q = mpmath.exp(lq)
    mu2 = mpmath.sqrt(-lq / c)
    mu1 = mu2 + 1
    eps1, eps2 = c * mu1, c * mu2
    if not (mu2 > 1 and a < mu1 and -lq > eps2):
        return independent
    if lq > (mu2 - 1) * eps2 - mu2 * mpmath.log(mu1 / (mu1 - 1) * mu2 / (mu2 - 1)):
        return independent
    with mpmath.workdps(150):  # log1p / expm1 form: (1-q) A^{a-1} + q B^{a-1} - 1 keeps a bound of 1e-300
        log_big_a = mpmath.log1p(-q) - mpmath.log1p(-(q * mpmath.exp(eps2)) ** ((mu2 - 1) / mu2))
        log_big_b = eps1 - lq / (mu1 - 1)
        excess = (1 - q) * mpmath.expm1((a - 1) * log_big_a) + q * mpmath.expm1((a - 1) * log_big_b)
        return min(independent, mpmath.log1p(excess) / (a - 1))


@precise
def gnmax_data_dependent(counts, sigma, alpha, relation, both=True):
    """Theorem 6 at D under the relation's RDP (and, both=True, at every neighbour D' with its q bound)."""
    slope = gnmax_slope(sigma, relation)
    forward = theorem_6(log_q(counts, sigma), slope, alpha)
    if not both:
        return forward
    return max(forward, theorem_6(log_q_neighbours(counts, sigma, relation), slope, alpha))


@precise
def two_class_law(c1, c2, sigma):
    """GNMax's exact law on two classes: Pr[class 1 wins] = Phi((c1 - c2) / (sqrt 2 sigma))."""
    d = (mp(c1) - mp(c2)) / (2 * mp(sigma))
    return mpmath.erfc(-d) / 2, mpmath.erfc(d) / 2


def two_class_neighbours(c1, c2, relation):
    """The histograms one teacher away from (c1, c2) under the relation (counts stay >= 0)."""
    if relation == REPLACE:
        moves = [(-1, 1), (1, -1)]
    else:
        moves = [(1, 0), (-1, 0), (0, 1), (0, -1)]
    return [(c1 + a, c2 + b) for a, b in moves if c1 + a >= 0 and c2 + b >= 0]


@precise
def two_class_exact(c1, c2, sigma, alpha, relation):
    """(max_D' D_alpha(M(D) || M(D')), max_D' D_alpha(M(D') || M(D))) over the neighbours, exactly."""
    law = two_class_law(c1, c2, sigma)
    forward = reverse = mpmath.mpf(0)
    for d1, d2 in two_class_neighbours(c1, c2, relation):
        other = two_class_law(d1, d2, sigma)
        forward = max(forward, renyi_divergence(law, other, alpha))
        reverse = max(reverse, renyi_divergence(other, law, alpha))
    return forward, reverse


def _log_screen_law(top, threshold, sigma_threshold):
    """(log Pr[pass], log Pr[fail]) of the check max c + N(0, s1^2) >= T (Papernot et al. 2018,
    Algorithm 1): each from its own tail, the one near 1 as log1p of minus the other, so that neither
    loses the tiny complement."""
    x = (mp(top) - mp(threshold)) / (mpmath.sqrt(2) * mp(sigma_threshold))
    upper, lower = mpmath.erfc(-x) / 2, mpmath.erfc(x) / 2
    if upper >= lower:
        return mpmath.log1p(-lower), mpmath.log(lower)
    return mpmath.log(upper), mpmath.log1p(-upper)


def _two_point_renyi(log_p, log_q, alpha):
    """D_alpha(P || Q) = log(1 + sum_i p_i (exp((alpha-1) log(p_i/q_i)) - 1)) / (alpha - 1) (van Erven &
    Harremoes 2014, Definition 2, with sum_i p_i = 1): log1p and expm1 keep a divergence of 1e-300."""
    a = order(alpha)
    excess = mpmath.fsum(mpmath.exp(lp) * mpmath.expm1((a - 1) * (lp - lq)) for lp, lq in zip(log_p, log_q))
    return mpmath.log1p(excess) / (a - 1)


def screen_exact(top, threshold, sigma_threshold, alpha):
    """The largest Renyi divergence, either direction, between the check's laws at m and m +- 1 (m - 1 >= 0),
    at 120 digits (the log1p form loses nothing to the 1 it adds)."""
    with mpmath.workdps(120):
        law = _log_screen_law(top, threshold, sigma_threshold)
        worst = mpmath.mpf(0)
        for other_top in [t for t in (mp(top) - 1, mp(top) + 1) if t >= 0]:
            other = _log_screen_law(other_top, threshold, sigma_threshold)
            worst = max(worst, _two_point_renyi(law, other, alpha), _two_point_renyi(other, law, alpha))
        return +worst


@precise
def gnss_rdp(alpha, beta, sigma_ss):
    """Papernot et al. 2018, Theorem 23: alpha e^{2 beta} / sigma^2 + (beta alpha - log(1 - 2 alpha beta) / 2) / (alpha - 1)."""
    a, b, s = order(alpha), mp(beta), mp(sigma_ss)
    return a * mpmath.exp(2 * b) / s ** 2 + (b * a - mpmath.log(1 - 2 * a * b) / 2) / (a - 1)
