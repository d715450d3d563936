"""Renyi divergence of discrete distributions, straight from the definition."""
from __future__ import annotations

import mpmath

from tests.oracles._mp import INF, order, precise, vector


@precise
def renyi_divergence(p, q, alpha):
    """D_alpha(P||Q) = 1/(alpha-1) log sum_j P_j^alpha Q_j^(1-alpha), alpha > 1.

    Renyi 1961; van Erven & Harremoes 2014, Definition 2 (discrete case). Conventions of that
    definition: a term with P_j = 0 contributes 0 (also when Q_j = 0, the 0/0 case), and the
    divergence is +inf as soon as P_j > 0 where Q_j = 0 (P not absolutely continuous w.r.t. Q).
    The inputs are used exactly as given (no renormalisation), so for float vectors whose sums
    are 1 only up to rounding the value may be -1e-17 instead of 0.
    """
    a = order(alpha)
    p, q = vector(p), vector(q)
    if len(p) != len(q) or not p:
        raise ValueError("p and q must be non-empty and of equal length")
    if any(v < 0 for v in p + q):
        raise ValueError("probabilities must be non-negative")
    total = mpmath.mpf(0)
    for pj, qj in zip(p, q):
        if pj == 0:
            continue
        if qj == 0:
            return INF
        total += pj ** a * qj ** (1 - a)
    if total == 0:
        raise ValueError("P has no mass")
    return mpmath.log(total) / (a - 1)


@precise
def symmetric_renyi_divergence(p, q, alpha):
    """D<->_alpha(P, Q) = max(D_alpha(P||Q), D_alpha(Q||P)), the symmetric form PMixED's ball and
    leave-one-out loss use (Flemings et al. 2024, Section 3 / Algorithm 2)."""
    return max(renyi_divergence(p, q, alpha), renyi_divergence(q, p, alpha))
