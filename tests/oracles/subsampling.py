"""Privacy amplification by Poisson subsampling for RDP, term by term."""
from __future__ import annotations

import mpmath

from tests.oracles._mp import INF, integer_order, mp, precise


def _sampling_probability(q):
    q = mp(q)
    if not 0 <= q <= 1:
        raise ValueError(f"sampling probability must be in [0, 1], got {q}")
    return q


@precise
def amplified_rdp_integer(q, base_epsilon, order: int, general: bool = False):
    """RDP at integer order A >= 2 of a mechanism with RDP base_epsilon(k) (k = 2..A) run on a
    Poisson subsample of rate q, add/remove-one neighbours.

    Tight form (Steinke 2022, Poisson subsampling theorem; Mironov, Talwar & Zhang 2019 for the
    Gaussian; Zhu & Wang 2019 Theorem 5 under its extra condition):
        1/(A-1) log((1-q)^(A-1) (1+(A-1) q) + sum_{k=2..A} C(A,k) (1-q)^(A-k) q^k e^{(k-1) eps(k)})
    General form (Zhu & Wang 2019, Theorem 9): every k >= 3 term multiplied by 3.

    A term whose coefficient C(A,k) (1-q)^(A-k) q^k is exactly 0 (q = 0, or q = 1 and k < A)
    contributes 0 whatever eps(k) is, +inf included; any other +inf base value gives +inf.
    So q = 0 gives 0, and q = 1 gives eps(A) (tight) or eps(A) + log(3)/(A-1) (general, A >= 3).
    """
    a = int(order)
    if a != order or a < 2:
        raise ValueError(f"order must be an integer >= 2, got {order!r}")
    q = _sampling_probability(q)
    one_minus_q = 1 - q
    total = one_minus_q ** (a - 1) * (1 + (a - 1) * q)
    for k in range(2, a + 1):
        # mpmath: 0 ** 0 == 1, the (1-q)^0 factor at k = A when q = 1
        coefficient = mpmath.binomial(a, k) * one_minus_q ** (a - k) * q ** k
        if coefficient == 0:
            continue
        eps_k = mp(base_epsilon(k))
        if eps_k == INF:
            return INF
        term = coefficient * mpmath.exp((k - 1) * eps_k)
        if general and k >= 3:
            term *= 3
        total += term
    return mpmath.log(total) / (a - 1)


@precise
def amplified_rdp(q, base_epsilon, alpha, general: bool = False):
    """amplified_rdp_integer at max(2, ceil(alpha)): RDP is non-decreasing in the order
    (van Erven & Harremoes 2014, Theorem 3), so the value at ceil(alpha) bounds order alpha."""
    return amplified_rdp_integer(q, base_epsilon, integer_order(alpha), general)


@precise
def subsampled_rdp(q, base_epsilon, alpha, general: bool = False):
    """min(amplified_rdp(q, base_epsilon, alpha, general), base_epsilon(alpha)).

    Both are valid bounds on the subsampled mechanism at order alpha. The second: the subsampled
    output laws on neighbours are mixtures, with the same weights, over subsamples U of pairs that
    are identical (record not in U) or neighbours (record in U, divergence <= eps(alpha)); Renyi
    divergence is jointly quasi-convex (van Erven & Harremoes 2014, Theorem 13), so the mixture's
    divergence is at most eps(alpha). At q = 1 this gives eps(alpha) for both forms.
    """
    amplified = amplified_rdp(q, base_epsilon, alpha, general)
    if _sampling_probability(q) == 0:
        return amplified
    return min(amplified, mp(base_epsilon(alpha)))
