"""Privacy amplification by Poisson subsampling for RDP (Zhu & Wang 2019; Steinke 2022, Theorem 6.2).

For integer orders A >= 2 and a mechanism with RDP epsilon(k) at k = 2..A (add/remove-one):

  tight (Steinke 2022; Zhu & Wang 2019 Theorem 5 under its extra condition):
    eps'(A) = 1/(A-1) log((1-q)^(A-1) (1+(A-1) q) + sum_{k=2..A} C(A,k) (1-q)^(A-k) q^k e^{(k-1) eps(k)})
  general (Zhu & Wang 2019, Theorem 9): the same with every k >= 3 term multiplied by 3, which
    covers both divergence directions for any mechanism.

A fractional order a is charged the value at ceil(a): RDP is non-decreasing in the order
(van Erven & Harremoes 2014, Theorem 3), so eps'(a) <= eps'(ceil(a)).
The result is also capped by the base mechanism's own value eps(a): the subsampled output law is a
mixture over subsamples of pairs at divergence 0 (the record not sampled) or at most eps(a) (the
record sampled), and the Renyi divergence is jointly quasi-convex (van Erven & Harremoes 2014,
Theorem 13), so subsampling never costs more than running the mechanism on everyone. This makes
q = 1 give exactly the unsampled curve for both forms (the general form alone would add
log(3)/(A-1)).
Amplification is only known for data-independent curves (Zhu et al. 2020); a data-dependent
mechanism is refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammaln, logsumexp

from dpledger.accounting.errors import require, require_bool, require_in_closed
from dpledger.accounting.orders import validated_orders
from dpledger.accounting.rounding import ROUNDING_ULPS, positive_floor
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.mechanisms.base import Mechanism, require_mechanism, set_validated


def _base_values(base_epsilon: Callable[[NDArray[np.float64]], NDArray[np.float64]],
                 at: NDArray[np.float64] | NDArray[np.int64]) -> NDArray[np.float64]:
    """base_epsilon(at), refused unless it is one non-NaN value >= 0 (or +inf) per order."""
    values = np.asarray(base_epsilon(at.astype(np.float64)), dtype=np.float64)
    require(values.shape == at.shape, f"base mechanism RDP must have one value per order, got shape {values.shape} "
                                      f"for {at.shape[0]} orders")
    require(not bool(np.any(np.isnan(values))), "base mechanism RDP must not be NaN (use +inf for 'no guarantee')")
    require(bool(np.all(values >= 0)), f"base mechanism RDP must be >= 0, got {values.min():g}")
    return values


MAX_AMPLIFIED_ORDER = 100_000
"""Orders above this are charged the unsampled value (the amplification sum has A terms)."""


def _log_term_excess(exponent: NDArray[np.float64], factor: float, k: NDArray[np.int64]) -> NDArray[np.float64]:
    """log(m_k e^x - 1) with m_k = factor for k >= 3 and 1 for k = 2, x = (k-1) eps(k) >= 0:
    log(expm1(x)) for m = 1 (-inf at x = 0), log(2 + 3 expm1(x)) for m = 3; +inf stays +inf."""
    exponent = np.asarray(exponent, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):  # log(0) = -inf at x = 0 is exact
        log_expm1: NDArray[np.float64] = np.where(exponent < 30.0, np.log(np.expm1(np.minimum(exponent, 30.0))),
                             exponent + np.log1p(-np.exp(-np.maximum(exponent, 30.0))))
    if factor == 1.0:
        return log_expm1
    weighted: NDArray[np.float64] = np.where(k >= 3, np.logaddexp(math.log(factor - 1.0), math.log(factor) + log_expm1),
                                             log_expm1)
    return weighted


def amplified_rdp(sampling_probability: float, base_epsilon: Callable[[NDArray[np.float64]], NDArray[np.float64]],
                  orders: NDArray[np.float64], general: bool) -> NDArray[np.float64]:
    """eps'_q at each order: min(the amplification bound at ceil(order), base_epsilon(order)).

    base_epsilon maps an array of orders to the base mechanism's RDP (+inf allowed, NaN or negative
    refused); it is called at the integers 2..ceil(max order) and at `orders` themselves.
    Computed in log space so e^{(k-1) eps(k)} never overflows, and as log1p of the excess over 1:
    by the binomial theorem the bound's sum is 1 + sum_{k>=2} C(A,k) (1-q)^(A-k) q^k (m_k e^{(k-1) eps(k)} - 1)
    (m_k = 3 for k >= 3 in the general form, else 1), a sum of non-negative terms, so nothing
    cancels when q is tiny (summing (1-q)^(A-1) (1 + (A-1) q) with the rest gave 0 instead of
    1.8e-34 at q = 2.4e-16). A term whose binomial weight is exactly 0 ((1-q)^(A-k) with q = 1 and
    k < A) is 0 even where eps(k) = +inf, never 0 * inf = NaN.

    Args:
        sampling_probability: q in [0, 1], the probability that each record is in the subsample.
        base_epsilon: the base mechanism's RDP as a function of a float64 array of orders.
        orders: Renyi orders, a 1-D float64 array, each finite and > 1.
        general: True for Zhu & Wang 2019 Theorem 9 (factor 3 on every k >= 3 term, sound for every
            mechanism); False for the tight form (Steinke 2022; Zhu & Wang 2019, Theorem 5).

    Returns:
        A float64 array, one amplified epsilon per order (0 everywhere for q = 0; the unsampled value
        above MAX_AMPLIFIED_ORDER).

    Raises:
        ValueError: if q is outside [0, 1], an order is not finite and > 1, `general` is not a bool,
            `base_epsilon` is not callable or gives a wrong shape, a NaN or a negative value, or the
            bound comes out NaN.
    """
    q = require_in_closed("sampling_probability", sampling_probability, 0.0, 1.0)
    orders = validated_orders(orders)
    general = require_bool("general", general)
    require(callable(base_epsilon), f"base_epsilon must be a function of the orders, got {base_epsilon!r}")
    if q == 0.0:
        return np.zeros_like(orders)
    unsampled = _base_values(base_epsilon, orders)
    # the sum has one term per integer order up to A: above MAX_AMPLIFIED_ORDER only the
    # unsampled value (always sound, see above) is charged, never a MemoryError
    large = orders > MAX_AMPLIFIED_ORDER
    if np.all(large):
        return unsampled
    integer_orders = np.maximum(2, np.ceil(np.where(large, 2.0, orders) - 1e-12)).astype(np.int64)
    ks = np.arange(2, int(integer_orders.max()) + 1)
    base = _base_values(base_epsilon, ks)
    log_q = math.log(q)
    log_1mq = math.log1p(-q) if q < 1.0 else -math.inf
    results = {}
    for order in np.unique(integer_orders):
        k = ks[: order - 1]
        log_binom = gammaln(order + 1) - gammaln(k + 1) - gammaln(order - k + 1)
        # (1-q)^(order-k) with q = 1 and k = order is 0^0 = 1.
        log_1mq_power = np.where(order - k == 0, 0.0, log_1mq) * (order - k)
        log_weight = log_binom + log_1mq_power + k * log_q
        present = log_weight > -np.inf      # q = 1 makes every k < order weigh exactly 0
        log_excess = np.full(k.shape, -np.inf)
        exponent = (k[present] - 1) * base[k[present] - 2]
        log_excess[present] = log_weight[present] + _log_term_excess(exponent, 3.0 if general else 1.0, k[present])
        log_sum = float(logsumexp(log_excess))
        require(not math.isnan(log_sum), f"amplification bound at order {order} is NaN")
        if math.isfinite(log_sum):
            # rounded up by a bound on its floating-point error: each term's log is off by a few ulps
            # of the magnitudes that form it, weighted by the term's share of the sum (at q = 1e-8
            # the unrounded value was 5e-15 relative low)
            counted = np.isfinite(log_excess)  # terms that are exactly 0 carry no rounding
            magnitude = (np.abs(log_binom) + np.abs(log_1mq_power) + np.abs(k * log_q) + np.abs(log_excess) + 2.0)
            magnitude[present] += np.abs(exponent)
            share = np.exp(log_excess[counted] - log_sum)
            log_sum += ROUNDING_ULPS * (float(np.dot(share, magnitude[counted])) + math.log2(k.size) + 2.0)
        total = float(np.logaddexp(0.0, log_sum))
        value = total / (order - 1) * (1.0 + ROUNDING_ULPS)
        # a positive excess that underflowed is the smallest float, never 0
        results[int(order)] = float(positive_floor(value)) if log_sum > -math.inf else value
    amplified = np.array([results[int(o)] for o in integer_orders], dtype=np.float64)
    return np.where(large, unsampled, np.minimum(amplified, unsampled))


@dataclass(frozen=True)
class PoissonSubsampledMechanism(Mechanism):
    """Any data-independent add/remove-one mechanism run on a Poisson subsample of rate q.

    `general=True` applies Zhu & Wang 2019 Theorem 9 (factor 3; sound for every mechanism);
    `general=False` the tight form (Steinke 2022; Zhu & Wang 2019, Theorem 5), which needs the mechanism to meet its
    extra condition.
    """

    mechanism: Mechanism
    sampling_probability: float
    general: bool = True

    def __post_init__(self) -> None:
        set_validated(self, mechanism=require_mechanism("mechanism", self.mechanism),
                      sampling_probability=require_in_closed("sampling_probability", self.sampling_probability, 0.0, 1.0),
                      general=require_bool("general", self.general))
        require(not self.mechanism.data_dependent,
                "Poisson amplification of a data-dependent mechanism is not known to be sound "
                "(Zhu et al. 2020); account it without subsampling")
        require(self.mechanism.relation == NeighbouringRelation.ADD_OR_REMOVE_ONE,
                f"Poisson amplification holds for add/remove-one neighbours, got {self.mechanism.relation}")

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return amplified_rdp(self.sampling_probability, self.mechanism.rdp_values, orders, self.general)


def poisson_subsample(mechanism: Mechanism, sampling_probability: float, general: bool = True) -> PoissonSubsampledMechanism:
    """`mechanism` run on a Poisson subsample of the data (each record kept with probability q).

    Args:
        mechanism: a data-independent mechanism stated for add-or-remove-one neighbours.
        sampling_probability: q in [0, 1].
        general: True (default) applies Zhu & Wang 2019, Theorem 9 (factor 3, sound for every
            mechanism); False the tight form (Zhu & Wang 2019, Theorem 5; Steinke 2022), which
            needs the mechanism to meet that theorem's extra condition.

    Returns:
        A PoissonSubsampledMechanism: the amplified RDP curve at every order.

    Raises:
        ValueError: q outside [0, 1], a data-dependent mechanism (amplification is not known to be
            sound for it, Zhu et al. 2020), or a relation other than add-or-remove-one.
    """
    return PoissonSubsampledMechanism(mechanism, sampling_probability, general)
