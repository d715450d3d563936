"""Report noisy max with Laplace noise, from the papers, in mpmath (no package code).

Laplace(b): density exp(-|x| / b) / (2 b), CDF e^{x/b} / 2 for x < 0 and 1 - e^{-x/b} / 2 for x >= 0.

- Mironov 2017, "Renyi Differential Privacy", Proposition 6: the Laplace mechanism with sensitivity 1
  and scale lambda has, at order a > 1,
      D_a = 1/(a-1) log( a/(2a-1) exp((a-1)/lambda) + (a-1)/(2a-1) exp(-a/lambda) ).
  `laplace_rdp_closed_form` is that formula; `laplace_rdp_by_definition` integrates
  D_a(P || Q) = 1/(a-1) log int p^a q^(1-a) (Renyi 1961; van Erven & Harremoes 2014, Definition 2)
  for P = Lap(0, lambda), Q = Lap(1, lambda) numerically, independently of the closed form.
- The released law of report noisy max (Dwork & Roth 2014, Section 3.3): argmax_j (c_j + Z_j),
  Pr[argmax = j] = int f(x - c_j) prod_{k != j} F(x - c_k) dx (`noisy_max_law`).
"""
from __future__ import annotations

import mpmath

from tests.oracles._mp import INF, mp, order, precise, vector


def _scale(scale):
    b = mp(scale)
    if not b > 0 or b == INF:
        raise ValueError("scale must be finite and > 0")
    return b


@precise
def laplace_rdp_closed_form(alpha, ratio):
    """Mironov 2017, Proposition 6 at sensitivity / scale = `ratio`."""
    a, t = order(alpha), mp(ratio)
    inside = a / (2 * a - 1) * mpmath.exp((a - 1) * t) + (a - 1) / (2 * a - 1) * mpmath.exp(-a * t)
    return mpmath.log(inside) / (a - 1)


def laplace_rdp_by_definition(alpha, ratio, dps=40):
    """D_a(Lap(0, 1) || Lap(ratio, 1)) by quadrature of p^a q^(1-a), split at the kinks 0 and ratio."""
    with mpmath.workdps(dps):
        a, t = order(alpha), mp(ratio)

        def integrand(x):
            return mpmath.exp(-a * abs(x) - (1 - a) * abs(x - t)) / 2

        total = mpmath.quad(integrand, [-INF, 0, t, INF])
        return mpmath.log(total) / (a - 1)


def noisy_max_law(counts, scale, dps=30):
    """[Pr[argmax_j (c_j + Z_j) = j] for every j], Z_j i.i.d. Laplace(scale), by quadrature over x split at
    every count (the kinks of the density and the CDFs)."""
    with mpmath.workdps(dps):
        c, b = vector(counts), _scale(scale)

        def density(x):
            return mpmath.exp(-abs(x) / b) / (2 * b)

        def cdf(x):
            return mpmath.exp(x / b) / 2 if x < 0 else 1 - mpmath.exp(-x / b) / 2

        points = [-INF] + sorted(set(c)) + [INF]
        law = []
        for j in range(len(c)):
            def integrand(x, j=j):
                value = density(x - c[j])
                for k in range(len(c)):
                    if k != j:
                        value *= cdf(x - c[k])
                return value
            law.append(mpmath.quad(integrand, points))
        return law


def renyi_divergence(p, q, alpha, dps=30):
    """D_a(p || q) of two laws on the same finite outcomes (van Erven & Harremoes 2014, Definition 2)."""
    with mpmath.workdps(dps):
        a = order(alpha)
        total = mpmath.fsum(pi ** a * qi ** (1 - a) for pi, qi in zip(p, q) if pi > 0)
        return mpmath.log(total) / (a - 1)
