"""GNMax and Confident-GNMax over vote histograms (Papernot et al. 2018, "Scalable Private Learning
with PATE"; SPEC section 5). Neighbouring relation: replace one teacher (one vote moves).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp
from scipy.stats import norm

from accounting.errors import require, require_non_negative, require_positive
from accounting.relation import NeighbouringRelation
from mechanisms.base import Mechanism


def _validated_counts(counts) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64)
    require(counts.ndim == 1 and counts.size >= 2, f"counts must be a 1-D histogram over >= 2 tokens, got shape {counts.shape}")
    require(not bool(np.any(np.isnan(counts))), "counts must not contain NaN")
    require(bool(np.all(counts >= 0)), f"counts must be non-negative, got min {counts.min():g}")
    return counts


def log_q_gnmax(counts, sigma: float) -> float:
    """log of an upper bound q~ on Pr[GNMax(counts) != argmax counts] (Papernot et al. 2018, Proposition 7).

    q~ = sum_{j != j*} Pr[N(0, 2 sigma^2) >= c_{j*} - c_j] (union bound), capped at 1 - 1/V because
    the plurality token wins with probability at least 1/V (it is the most likely winner).
    """
    counts = _validated_counts(counts)
    sigma = require_positive("sigma", sigma)
    top = int(np.argmax(counts))
    gaps = counts[top] - np.delete(counts, top)
    log_q = float(logsumexp(norm.logsf(gaps, scale=math.sqrt(2.0) * sigma)))
    return min(log_q, math.log1p(-1.0 / counts.size))


def _log1mexp(x: float) -> float:
    """log(1 - exp(x)) for x < 0, stable at both ends."""
    return math.log(-math.expm1(x)) if x > -0.693 else math.log1p(-math.exp(x))


def data_dependent_gnmax_rdp(log_q: float, sigma: float, orders: np.ndarray) -> np.ndarray:
    """Data-dependent RDP of GNMax at each order (Papernot et al. 2018, Theorem 6), min with alpha / sigma^2.

    With mu2 = sigma sqrt(log(1/q~)), mu1 = mu2 + 1, eps_i = mu_i / sigma^2 (GNMax's own RDP at mu_i),
    for every order a < mu1, if mu2 > 1, q~ < e^{-eps2} and
    q~ <= e^{(mu2 - 1) eps2} / (mu1/(mu1-1) * mu2/(mu2-1))^{mu2}, then
      D_a <= 1/(a-1) log((1 - q~) A^{a-1} + q~ B^{a-1}),
      A = (1 - q~) / (1 - (q~ e^{eps2})^{(mu2-1)/mu2}),  B = e^{eps1} / q~^{1/(mu1-1)}.
    Outside those conditions only the data-independent alpha / sigma^2 is used.
    """
    sigma = require_positive("sigma", sigma)
    orders = np.asarray(orders, dtype=np.float64)
    independent = orders / sigma ** 2
    if log_q >= 0 or not math.isfinite(log_q):
        return independent if log_q >= 0 else np.zeros_like(orders)
    mu2 = sigma * math.sqrt(-log_q)
    mu1 = mu2 + 1.0
    eps1, eps2 = mu1 / sigma ** 2, mu2 / sigma ** 2
    if mu2 <= 1.0 or -log_q <= eps2:
        return independent
    condition = (mu2 - 1.0) * eps2 - mu2 * (math.log1p(1.0 / (mu1 - 1.0)) + math.log1p(1.0 / (mu2 - 1.0)))
    if log_q > condition:
        return independent
    log_1mq = _log1mexp(log_q)
    log_a = log_1mq - _log1mexp((log_q + eps2) * (1.0 - 1.0 / mu2))
    log_b = eps1 - log_q / (mu1 - 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.logaddexp(log_1mq + (orders - 1.0) * log_a, log_q + (orders - 1.0) * log_b) / (orders - 1.0)
    valid = orders < mu1
    return np.where(valid, np.minimum(independent, np.maximum(bound, 0.0)), independent)


@dataclass(frozen=True)
class GNMax(Mechanism):
    """argmax_j (c_j + N(0, sigma^2)); RDP alpha / sigma^2 (Papernot et al. 2018, Proposition 8:
    L2 sensitivity sqrt(2) under replace-one, Gaussian RDP alpha * 2 / (2 sigma^2))."""

    sigma: float
    relation: NeighbouringRelation = NeighbouringRelation.REPLACE_ONE

    def __post_init__(self) -> None:
        require_positive("sigma", self.sigma)

    def rdp_values(self, orders: np.ndarray) -> np.ndarray:
        return orders / self.sigma ** 2

    def data_dependent_rdp(self, counts, orders: np.ndarray) -> np.ndarray:
        return data_dependent_gnmax_rdp(log_q_gnmax(counts, self.sigma), self.sigma, orders)

    def aggregate(self, counts, rng: np.random.Generator) -> int:
        counts = _validated_counts(counts)
        return int(np.argmax(counts + rng.normal(0.0, self.sigma, size=counts.shape)))


@dataclass(frozen=True)
class ConfidentGNMax(Mechanism):
    """Confident-GNMax (Papernot et al. 2018, Algorithm 1): answer only if max_j c_j + N(0, s1^2) >= T.

    Data-independent RDP per query: the threshold check alpha / (2 s1^2) (the max count has
    sensitivity 1 under replace-one) plus, when it answers, GNMax's alpha / s2^2. `rdp_values` is
    the worst case (both); use `screen_rdp` / `answer_rdp` to charge a query that failed the check.
    """

    threshold: float
    sigma_threshold: float
    sigma: float
    relation: NeighbouringRelation = NeighbouringRelation.REPLACE_ONE

    def __post_init__(self) -> None:
        require_non_negative("threshold", self.threshold)
        require_positive("sigma_threshold", self.sigma_threshold)
        require_positive("sigma", self.sigma)

    def screen_rdp(self, orders: np.ndarray) -> np.ndarray:
        return orders / (2.0 * self.sigma_threshold ** 2)

    def answer_rdp(self, orders: np.ndarray) -> np.ndarray:
        return GNMax(self.sigma).rdp_values(orders)

    def rdp_values(self, orders: np.ndarray) -> np.ndarray:
        return self.screen_rdp(orders) + self.answer_rdp(orders)

    def data_dependent_rdp(self, counts, orders: np.ndarray, answered: bool) -> np.ndarray:
        """Screening (data-independent) plus, if answered, Theorem 6's data-dependent GNMax bound."""
        screen = self.screen_rdp(orders)
        return screen + GNMax(self.sigma).data_dependent_rdp(counts, orders) if answered else screen

    def aggregate(self, counts, rng: np.random.Generator) -> int | None:
        counts = _validated_counts(counts)
        if counts.max() + rng.normal(0.0, self.sigma_threshold) < self.threshold:
            return None
        return GNMax(self.sigma).aggregate(counts, rng)
