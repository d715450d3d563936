"""Privacy amplification by Poisson subsampling for RDP (seed Theorem A.4; Zhu & Wang 2019).

For integer orders A >= 2 and a mechanism with RDP epsilon(k) at k = 2..A (add/remove-one):

  tight (Steinke 2022, seed Theorem A.4; Zhu & Wang 2019 Theorem 5 under its extra condition):
    eps'(A) = 1/(A-1) log((1-q)^(A-1) (1+(A-1) q) + sum_{k=2..A} C(A,k) (1-q)^(A-k) q^k e^{(k-1) eps(k)})
  general (Zhu & Wang 2019, Theorem 9): the same with every k >= 3 term multiplied by 3, which
    covers both divergence directions for any mechanism.

A fractional order a is charged the value at ceil(a): RDP is non-decreasing in the order
(van Erven & Harremoes 2014, Theorem 3), so eps'(a) <= eps'(ceil(a)).
Amplification is only known for data-independent curves (seed section 3.1); a data-dependent
mechanism is refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import gammaln, logsumexp

from accounting.errors import require, require_in_closed
from accounting.relation import NeighbouringRelation
from mechanisms.base import Mechanism


def amplified_rdp(sampling_probability: float, base_epsilon: Callable[[np.ndarray], np.ndarray],
                  orders: np.ndarray, general: bool) -> np.ndarray:
    """eps'_q at each order, from base_epsilon(k) evaluated at integer k = 2..ceil(max order).

    base_epsilon maps an integer array of orders to the base mechanism's RDP (+inf allowed).
    Computed in log space (logsumexp) so e^{(k-1) eps(k)} never overflows.
    """
    q = require_in_closed("sampling_probability", sampling_probability, 0.0, 1.0)
    orders = np.asarray(orders, dtype=np.float64)
    integer_orders = np.maximum(2, np.ceil(orders - 1e-12)).astype(np.int64)
    if q == 0.0:
        return np.zeros_like(orders)
    top = int(integer_orders.max())
    ks = np.arange(2, top + 1)
    base = np.asarray(base_epsilon(ks.astype(np.float64)), dtype=np.float64)
    require(base.shape == ks.shape and not np.any(np.isnan(base)), "base mechanism RDP must be a NaN-free array")
    log_q = math.log(q)
    log_1mq = math.log1p(-q) if q < 1.0 else -math.inf
    results = {}
    for order in np.unique(integer_orders):
        k = ks[: order - 1]
        log_binom = gammaln(order + 1) - gammaln(k + 1) - gammaln(order - k + 1)
        with np.errstate(invalid="ignore"):
            # (1-q)^(order-k) with q = 1 and k = order is 0^0 = 1.
            log_1mq_power = np.where(order - k == 0, 0.0, (order - k) * log_1mq)
            log_terms = log_binom + log_1mq_power + k * log_q + (k - 1) * base[: order - 1]
        if general:
            log_terms = log_terms + np.where(k >= 3, math.log(3.0), 0.0)
        first = (order - 1) * log_1mq + math.log1p((order - 1) * q) if q < 1.0 else -math.inf
        total = logsumexp(np.concatenate([[first], log_terms]))
        results[int(order)] = max(0.0, float(total) / (order - 1))
    return np.array([results[int(o)] for o in integer_orders], dtype=np.float64)


@dataclass(frozen=True)
class PoissonSubsampledMechanism(Mechanism):
    """Any data-independent add/remove-one mechanism run on a Poisson subsample of rate q.

    `general=True` applies Zhu & Wang 2019 Theorem 9 (factor 3; sound for every mechanism);
    `general=False` the tight form (seed Theorem A.4), which needs the mechanism to meet its
    extra condition.
    """

    mechanism: Mechanism
    sampling_probability: float
    general: bool = True

    def __post_init__(self) -> None:
        require_in_closed("sampling_probability", self.sampling_probability, 0.0, 1.0)
        require(not self.mechanism.data_dependent,
                "Poisson amplification of a data-dependent mechanism is not known to be sound "
                "(seed section 3.1; Zhu et al. 2020); account it without subsampling")
        require(self.mechanism.relation == NeighbouringRelation.ADD_OR_REMOVE_ONE,
                f"Poisson amplification holds for add/remove-one neighbours, got {self.mechanism.relation}")

    def rdp_values(self, orders: np.ndarray) -> np.ndarray:
        return amplified_rdp(self.sampling_probability, self.mechanism.rdp_values, orders, self.general)


def poisson_subsample(mechanism: Mechanism, sampling_probability: float, general: bool = True) -> PoissonSubsampledMechanism:
    return PoissonSubsampledMechanism(mechanism, sampling_probability, general)
