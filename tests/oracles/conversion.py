"""RDP -> (epsilon, delta) conversions, evaluated per order and minimised over the given orders."""
from __future__ import annotations

import mpmath

from tests.oracles._mp import INF, mp, order, precise


def _curve(orders, values):
    orders = [order(a) for a in orders]
    values = [mp(v) for v in values]
    if len(orders) != len(values) or not orders:
        raise ValueError("need one RDP value per order, at least one order")
    if any(v < 0 for v in values):
        raise ValueError("RDP values must be >= 0")
    return orders, values


def _delta(delta):
    d = mp(delta)
    if not 0 < d < 1:
        raise ValueError("delta must be in (0, 1)")
    return d


@precise
def improved_epsilon_at(alpha, rdp, delta):
    """Balle et al. 2020, Theorem 21: (alpha, r)-RDP implies (eps, delta)-DP with
    eps = r + log((alpha-1)/alpha) - (log delta + log alpha) / (alpha - 1)."""
    a, r, d = order(alpha), mp(rdp), _delta(delta)
    return r + mpmath.log((a - 1) / a) - (mpmath.log(d) + mpmath.log(a)) / (a - 1)


@precise
def classic_epsilon_at(alpha, rdp, delta):
    """Mironov 2017, Proposition 3: (alpha, r)-RDP implies (r + log(1/delta)/(alpha-1), delta)-DP."""
    a, r, d = order(alpha), mp(rdp), _delta(delta)
    return r + mpmath.log(1 / d) / (a - 1)


def _epsilon(orders, values, delta, per_order):
    orders, values = _curve(orders, values)
    if all(v == 0 for v in values):
        # RDP 0 means identical output laws on every pair of neighbours: (0, 0)-DP.
        return mpmath.mpf(0)
    best = min(per_order(a, r, delta) for a, r in zip(orders, values))
    return max(mpmath.mpf(0), best)


@precise
def epsilon_improved(orders, values, delta):
    """min over the orders of Balle et al. 2020 Theorem 21, clipped at 0 below; +inf when every
    order is +inf; 0 for an all-zero curve (the output law does not depend on the data)."""
    return _epsilon(orders, values, delta, improved_epsilon_at)


@precise
def epsilon_classic(orders, values, delta):
    """min over the orders of Mironov 2017 Proposition 3, clipped at 0 below (same edge cases)."""
    return _epsilon(orders, values, delta, classic_epsilon_at)


@precise
def improved_delta_at(alpha, rdp, epsilon):
    """Inverse of Balle et al. 2020 Theorem 21 at one order:
    delta = exp((alpha-1)(r - eps)) (1 - 1/alpha)^(alpha-1) / alpha (capped at 1 by the caller)."""
    a, r, e = order(alpha), mp(rdp), mp(epsilon)
    if r == INF:
        return INF
    return mpmath.exp((a - 1) * (r - e)) * (1 - 1 / a) ** (a - 1) / a


@precise
def tv_delta_at(rdp):
    """delta <= TV(P, Q) <= sqrt(1 - exp(-KL(P||Q))) (Bretagnolle-Huber) with KL <= D_alpha <= r
    (Renyi divergence is non-decreasing in the order; van Erven & Harremoes 2014, Theorem 3).
    Holds for every epsilon >= 0, since delta(eps) <= delta(0) = TV."""
    r = mp(rdp)
    if r == INF:
        return mpmath.mpf(1)
    return mpmath.sqrt(-mpmath.expm1(-r))


@precise
def delta_improved(orders, values, epsilon):
    """min over the orders of improved_delta_at, capped at 1."""
    orders, values = _curve(orders, values)
    return min(mpmath.mpf(1), min(improved_delta_at(a, r, epsilon) for a, r in zip(orders, values)))


@precise
def delta_tv(orders, values):
    """min over the orders of tv_delta_at (at most 1)."""
    _, values = _curve(orders, values)
    return min(tv_delta_at(r) for r in values)


@precise
def delta_from_rdp(orders, values, epsilon):
    """The smaller of delta_improved and delta_tv: both are valid deltas for the curve at epsilon."""
    return min(delta_improved(orders, values, epsilon), delta_tv(orders, values))
