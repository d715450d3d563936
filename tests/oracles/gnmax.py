"""GNMax (Papernot et al. 2018, "Scalable Private Learning with PATE") over vote histograms.

Neighbouring histograms: one teacher replaced, i.e. one vote moved from one class to another.
"""
from __future__ import annotations

import mpmath

from tests.oracles._mp import INF, mp, order, precise, vector
from tests.oracles.renyi import renyi_divergence


def _sigma(sigma):
    s = mp(sigma)
    if not s > 0 or s == INF:
        raise ValueError("sigma must be finite and > 0")
    return s


def _counts(counts):
    values = vector(counts)
    if len(values) < 2 or any(not mpmath.isfinite(c) or c < 0 for c in values):
        raise ValueError("counts must be >= 2 finite non-negative numbers")
    return values


@precise
def gnmax_data_independent_rdp(alpha, sigma):
    """alpha / sigma^2 (Papernot et al. 2018, Proposition 8): the Gaussian mechanism with L2
    sensitivity sqrt(2) under replace-one, alpha * 2 / (2 sigma^2)."""
    return order(alpha) / _sigma(sigma) ** 2


@precise
def gaussian_tail(gap, sigma):
    """Pr[N(0, 2 sigma^2) >= gap] = erfc(gap / (2 sigma)) / 2: the probability that class j's
    noisy count beats the top class's, c_{j*} - c_j = gap (difference of two N(0, sigma^2))."""
    return mpmath.erfc(mp(gap) / (2 * _sigma(sigma))) / 2


@precise
def log_q_gnmax(counts, sigma):
    """log q~ with q~ = min(1 - 1/V, sum_{j != j*} Pr[N(0, 2 sigma^2) >= c_{j*} - c_j])
    (Papernot et al. 2018, Proposition 7: a union bound on Pr[GNMax(counts) != j*], j* = argmax).

    The cap 1 - 1/V follows the authors' reference analysis code (compute_logq_gaussian): j*
    is the most likely output (i.i.d. noise, largest count), so it wins with probability >= 1/V.
    """
    c, s = _counts(counts), _sigma(sigma)
    top = max(range(len(c)), key=lambda j: (c[j], -j))   # first index of the maximum
    q = mpmath.fsum(gaussian_tail(c[top] - c[j], s) for j in range(len(c)) if j != top)
    cap = 1 - mpmath.mpf(1) / len(c)
    return mpmath.log(min(q, cap))


@precise
def log_q_gnmax_neighbours(counts, sigma):
    """log of a bound on Pr[GNMax(D') != j*] valid at EVERY replace-one neighbour D' of D = counts,
    j* = argmax of D: Proposition 7's union bound (Papernot et al. 2018) at D' for the fixed outcome
    j*, where each gap c'_{j*} - c'_j >= (c_{j*} - c_j) - 2 (one moved vote changes a difference of
    two counts by at most 2). Capped at q = 1 only: j* need not be the plurality of D'.
    """
    c, s = _counts(counts), _sigma(sigma)
    top = max(range(len(c)), key=lambda j: (c[j], -j))
    q = mpmath.fsum(gaussian_tail(c[top] - c[j] - 2, s) for j in range(len(c)) if j != top)
    return mpmath.log(min(q, mpmath.mpf(1)))


@precise
def theorem_6_rdp(log_q, sigma, alpha):
    """Data-dependent RDP of GNMax at order alpha given log q~ (Papernot et al. 2018, Theorem 6
    with the orders of Proposition 10), minimised with the data-independent alpha / sigma^2.

    mu2 = sigma sqrt(log(1/q~)), mu1 = mu2 + 1, eps_i = mu_i / sigma^2 (GNMax's RDP at mu_i).
    Theorem 6 applies when alpha < mu1 (strict, as the authors' code), mu2 > 1, q~ e^{eps2} < 1
    (so that A is finite and positive) and
        q~ <= e^{(mu2-1) eps2} / (mu1/(mu1-1) * mu2/(mu2-1))^{mu2};
    then D_alpha(M(D) || M(D')) <= 1/(alpha-1) log((1-q~) A^{alpha-1} + q~ B^{alpha-1}) with
        A = (1-q~) / (1 - (q~ e^{eps2})^{(mu2-1)/mu2}),   B = e^{eps1} / q~^{1/(mu1-1)}.
    Where it does not apply the value is alpha / sigma^2. q~ = 0 (log_q = -inf) gives 0: the
    output is then a constant. The bound covers ONE direction, D(M(D) || M(D')), at the actual
    histogram D. The result is clipped below at 0 (a divergence is never negative).
    """
    a, s = order(alpha), _sigma(sigma)
    log_q = mp(log_q)
    if log_q > 0:
        raise ValueError("log q~ must be <= 0")
    independent = a / s ** 2
    if log_q == -INF:
        return mpmath.mpf(0)
    q = mpmath.exp(log_q)
    mu2 = s * mpmath.sqrt(-log_q)
    mu1 = mu2 + 1
    eps1, eps2 = mu1 / s ** 2, mu2 / s ** 2
    if not (mu2 > 1 and a < mu1 and -log_q > eps2):
        return independent
    condition = (mu2 - 1) * eps2 - mu2 * (mpmath.log(mu1 / (mu1 - 1)) + mpmath.log(mu2 / (mu2 - 1)))
    if log_q > condition:
        return independent
    big_a = (1 - q) / (1 - (q * mpmath.exp(eps2)) ** ((mu2 - 1) / mu2))
    big_b = mpmath.exp(eps1) / q ** (1 / (mu1 - 1))
    bound = mpmath.log((1 - q) * big_a ** (a - 1) + q * big_b ** (a - 1)) / (a - 1)
    return max(mpmath.mpf(0), min(independent, bound))


@precise
def data_dependent_gnmax_rdp(counts, sigma, alpha):
    """Theorem 6 at the histogram `counts` with q~ from Proposition 7 (see log_q_gnmax)."""
    return theorem_6_rdp(log_q_gnmax(counts, sigma), sigma, alpha)


@precise
def data_dependent_gnmax_rdp_both_directions(counts, sigma, alpha):
    """A data-dependent bound on both directions at D = counts, every replace-one neighbour D':
    D(M(D) || M(D')) <= Theorem 6 with q~(D) (Proposition 7), and D(M(D') || M(D)) <= Theorem 6
    applied at D' (D is a neighbour of D') with q~ from log_q_gnmax_neighbours. The max of the two.
    """
    forward = theorem_6_rdp(log_q_gnmax(counts, sigma), sigma, alpha)
    reverse = theorem_6_rdp(log_q_gnmax_neighbours(counts, sigma), sigma, alpha)
    return max(forward, reverse)


@precise
def two_class_output_law(c1, c2, sigma):
    """Exact law of GNMax on two classes: (Pr[output 1], Pr[output 2]).

    Output 1 iff c1 + Z1 > c2 + Z2 with Z1, Z2 i.i.d. N(0, sigma^2); Z2 - Z1 ~ N(0, 2 sigma^2), so
    Pr[output 1] = Phi((c1 - c2) / (sqrt(2) sigma)) (ties have probability 0). Both entries are
    computed as upper tails (erfc) so that neither loses relative precision when tiny.
    """
    c1, c2, s = mp(c1), mp(c2), _sigma(sigma)
    return gaussian_tail(c2 - c1, s), gaussian_tail(c1 - c2, s)


@precise
def two_class_neighbour_divergences(c1, c2, sigma, alpha):
    """Exact Renyi divergences between GNMax at (c1, c2) and at each replace-one neighbour
    (one vote moved: (c1-1, c2+1) if c1 >= 1, (c1+1, c2-1) if c2 >= 1).

    Returns (forward, reverse): the max over neighbours D' of D_alpha(M(D) || M(D')), the direction
    Papernot et al. 2018 Theorem 6 bounds, and of D_alpha(M(D') || M(D)).
    """
    c1, c2 = mp(c1), mp(c2)
    law = two_class_output_law(c1, c2, sigma)
    neighbours = []
    if c1 >= 1:
        neighbours.append((c1 - 1, c2 + 1))
    if c2 >= 1:
        neighbours.append((c1 + 1, c2 - 1))
    if not neighbours:
        raise ValueError("a histogram with no votes has no replace-one neighbour")
    forward = reverse = mpmath.mpf(0)
    for d1, d2 in neighbours:
        other = two_class_output_law(d1, d2, sigma)
        forward = max(forward, renyi_divergence(law, other, alpha))
        reverse = max(reverse, renyi_divergence(other, law, alpha))
    return forward, reverse
