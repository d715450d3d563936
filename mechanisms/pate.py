"""GNMax and Confident-GNMax over vote histograms (Papernot et al. 2018, "Scalable Private Learning
with PATE"). Neighbouring relation: replace one teacher (one vote moves: L2 sensitivity sqrt 2, the
paper's), or add or remove one (one count moves by one: L2 sensitivity 1); the largest count moves by
at most 1 under every relation.

Data-dependent bounds come in two directions. Papernot et al. 2018 Theorem 6 bounds
D_a(M(D) || M(D')) at the actual histogram D only (DivergenceDirection.FROM_ACTUAL); the reverse
direction D_a(M(D') || M(D)) can be far larger (counts (9, 1), sigma 1, order 2: 0.0157 against the
forward bound's 1.35e-4). The symmetric bound (DivergenceDirection.BOTH, the default) adds Theorem 6
applied at every neighbour D', whose failure probability is bounded by Proposition 7 with every gap
reduced by the most one neighbour moves it: 2 when a teacher is replaced, 1 when one is added or
removed. Theorem 6 is applied with GNMax's own RDP under the relation (mu / sigma^2 replace-one,
mu / (2 sigma^2) add or remove: the replace-one analysis at sigma sqrt 2).

The threshold check's data-dependent RDP (`data_dependent_screen_rdp`) is the exact Renyi divergence
of its two-outcome law at the actual largest count against the largest count one step up or down,
both directions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray
from scipy.special import log_ndtr, logsumexp

from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.errors import require, require_bool, require_non_negative, require_positive
from dpledger.accounting.orders import DEFAULT_ORDERS, canonical_orders, validated_orders
from dpledger.accounting.relation import DivergenceDirection, NeighbouringRelation
from dpledger.accounting.rounding import SMALLEST_POSITIVE, positive_floor
from dpledger.mechanisms.accountable import AccountableMechanism, mechanism_parameter, register_mechanism
from dpledger.mechanisms.base import require_relation, set_validated
from dpledger.mechanisms.log_space import log_sum_exp

if TYPE_CHECKING:  # dp_accounting ships no type information: DpEvent is opaque to mypy
    from dp_accounting.dp_event import DpEvent


def validated_counts(counts: npt.ArrayLike) -> NDArray[np.float64]:
    """A vote histogram as float64: 1-D over >= 2 tokens, every count a finite non-negative integer.

    Args:
        counts: (V,) vote counts (any real dtype).

    Returns:
        A float64 copy, shape (V,).

    Raises:
        ValueError: if the counts are not numbers, not 1-D over >= 2 tokens, or not finite non-negative integers.
    """
    raw = np.asarray(counts)
    require(raw.dtype.kind in "biuf", f"counts must be numbers, got dtype {raw.dtype}")
    values = raw.astype(np.float64)
    require(values.ndim == 1 and values.size >= 2, f"counts must be a 1-D histogram over >= 2 tokens, got shape {values.shape}")
    with np.errstate(invalid="ignore"):  # NaN and inf are caught by the finiteness test itself
        bad = ~np.isfinite(values) | (values < 0) | (values != np.round(values))
    if np.any(bad):
        index = int(np.argmax(bad))
        raise ValueError(f"counts must be finite non-negative integers, got {float(values[index])!r} at index {index}")
    return values


def require_generator(rng: object) -> np.random.Generator:
    """Check that `rng` is a numpy Generator (a legacy RandomState or a seed is refused).

    Args:
        rng: the value given.

    Returns:
        `rng` itself.

    Raises:
        ValueError: if it is not a numpy Generator.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy Generator (np.random.default_rng(seed)), got {rng!r}")
    return rng


def _log_union_bound(gaps: NDArray[np.float64], sigma: float) -> float:
    """log sum_j Pr[N(0, 2 sigma^2) >= gap_j] (the noisy difference of two counts has variance 2 sigma^2)."""
    # log Pr[N(0, s^2) >= g] = log Phi(-g / s): what scipy.stats.norm.logsf computes, without loading scipy.stats
    return float(logsumexp(log_ndtr(-(gaps / (math.sqrt(2.0) * sigma)))))


def log_q_gnmax(counts: npt.ArrayLike, sigma: float) -> float:
    """log of an upper bound q~ on Pr[GNMax(counts) != argmax counts] (Papernot et al. 2018, Proposition 7).

    q~ = sum_{j != j*} Pr[N(0, 2 sigma^2) >= c_{j*} - c_j] (union bound), capped at 1 - 1/V because
    the plurality token wins with probability at least 1/V (it is the most likely winner).

    Args:
        counts: (V,) the vote histogram.
        sigma: GNMax's noise standard deviation, > 0 (votes).

    Returns:
        log q~, <= log(1 - 1/V).

    Raises:
        ValueError: if `counts` is not a valid histogram or sigma is not > 0.
    """
    values = validated_counts(counts)
    sigma = require_positive("sigma", sigma)
    top = int(np.argmax(values))
    gaps = values[top] - np.delete(values, top)
    return min(_log_union_bound(gaps, sigma), math.log1p(-1.0 / values.size))


def gap_shift(relation: NeighbouringRelation) -> float:
    """The most one neighbour moves a plurality gap c_{j*} - c_j: 2 when a teacher is replaced (one
    count down, another up), 1 when one is added or removed (one count moves by one).

    Args:
        relation: the neighbouring relation.

    Returns:
        2.0 under replace-one, 1.0 under the others.

    Raises:
        ValueError: if `relation` is not a NeighbouringRelation.
    """
    return 2.0 if require_relation(relation) is NeighbouringRelation.REPLACE_ONE else 1.0


def log_q_gnmax_neighbours(counts: npt.ArrayLike, sigma: float,
                           relation: NeighbouringRelation = NeighbouringRelation.REPLACE_ONE) -> float:
    """log of an upper bound on Pr[GNMax(D') != argmax counts of D] over every neighbour D' of D.

    Proposition 7's union bound (Papernot et al. 2018) at D' with the outcome j* = argmax of D: one
    neighbour changes each gap c_{j*} - c_j by at most `gap_shift(relation)` (2 replace-one, 1 add or
    remove), so every gap is reduced by that. Capped at 0 (q <= 1); no 1 - 1/V cap, because j* need
    not be the plurality of D'.

    Args:
        counts: (V,) the vote histogram D.
        sigma: GNMax's noise standard deviation, > 0 (votes).
        relation: the neighbouring relation (default replace-one, the paper's).

    Returns:
        The log of the bound, <= 0.

    Raises:
        ValueError: if `counts` is not a valid histogram, sigma is not > 0 or the relation is unknown.
    """
    values = validated_counts(counts)
    sigma = require_positive("sigma", sigma)
    top = int(np.argmax(values))
    gaps = values[top] - np.delete(values, top) - gap_shift(relation)
    return min(_log_union_bound(gaps, sigma), 0.0)


_ROUNDING = float(np.finfo(np.float64).eps)
_SUBNORMAL_ALLOWANCE = 2.0 ** -1000
"""An absolute allowance, times a / (a - 1), on a bound near or below the smallest normal float (2.2e-308):
there every operation errs by up to 2^-1074 absolute, which no relative allowance covers (a Theorem 6
bound of 1.4e-320 came out 5e-324), and the final division by a - 1 amplifies it; 2^-1000 covers 2^74 such
errors, and is far below any privacy loss that matters."""


def _log1mexp(x: float) -> float:
    """log(1 - exp(x)) for x < 0, stable at both ends."""
    return math.log(-math.expm1(x)) if x > -0.693 else math.log1p(-math.exp(x))


def data_dependent_gnmax_rdp(log_q: float, sigma: float, orders: NDArray[np.float64]) -> NDArray[np.float64]:
    """Data-dependent RDP of GNMax at each order (Papernot et al. 2018, Theorem 6), min with alpha / sigma^2.

    Direction: this bounds D_a(M(D) || M(D')) for every neighbour D' of the histogram D at which
    Pr[M(D) != j*] <= exp(log_q) (DivergenceDirection.FROM_ACTUAL); see `GNMax.data_dependent_rdp`
    for the symmetric bound. log_q must be <= 0 and not NaN; -inf (q~ underflowed) is the limit 0,
    reported as the smallest positive float.

    With mu2 = sigma sqrt(log(1/q~)), mu1 = mu2 + 1, eps_i = mu_i / sigma^2 (GNMax's own RDP at mu_i),
    for every order a < mu1, if mu2 > 1, q~ < e^{-eps2} and
    q~ <= e^{(mu2 - 1) eps2} / (mu1/(mu1-1) * mu2/(mu2-1))^{mu2}, then
      D_a <= 1/(a-1) log((1 - q~) A^{a-1} + q~ B^{a-1}),
      A = (1 - q~) / (1 - (q~ e^{eps2})^{(mu2-1)/mu2}),  B = e^{eps1} / q~^{1/(mu1-1)}.
    Outside those conditions only the data-independent alpha / sigma^2 is used.

    Args:
        log_q: log q~, a real <= 0 (log_q_gnmax or log_q_gnmax_neighbours); -inf allowed.
        sigma: the sigma of the mechanism's RDP mu / sigma^2, > 0 (votes): GNMax's noise under
            replace-one, the noise times sqrt 2 when one teacher is added or removed
            (GNMax.theorem_6_sigma).
        orders: Renyi orders, each finite and > 1.

    Returns:
        A float64 array, one bound per order, at most alpha / sigma^2 and > 0.

    Raises:
        ValueError: if log_q is not a real number <= 0, sigma is not > 0, an order is not finite and > 1,
            or the bound comes out NaN.
    """
    sigma = np.float64(require_positive("sigma", sigma))  # float64: a tiny sigma gives inf, never ZeroDivisionError
    orders = validated_orders(orders)
    if isinstance(log_q, (str, bytes, bool)):
        raise ValueError(f"log_q must be a real number, got {log_q!r}")
    try:
        log_q = float(log_q)
    except (TypeError, ValueError):
        raise ValueError(f"log_q must be a real number, got {log_q!r}") from None
    require(log_q <= 0.0, f"log_q must be <= 0 and not NaN (log of a probability), got {log_q!r}")
    independent = orders / sigma ** 2
    if log_q == 0.0:
        return independent
    if log_q == -math.inf:
        # q~ below the smallest float (a gap of ~1e154 sigma): the bound tends to 0 as q~ -> 0 at
        # every order (A -> 1, q~ B^(a-1) -> 0); report the smallest positive float, rounded up.
        return np.minimum(independent, SMALLEST_POSITIVE)
    mu2 = sigma * math.sqrt(-log_q)
    mu1 = mu2 + 1.0
    eps1, eps2 = mu1 / sigma ** 2, mu2 / sigma ** 2
    if mu2 <= 1.0 or -log_q <= eps2:
        return independent
    condition = (mu2 - 1.0) * eps2 - mu2 * (math.log1p(1.0 / (mu1 - 1.0)) + math.log1p(1.0 / (mu2 - 1.0)))
    if log_q > condition:
        return independent
    log_1mq = _log1mexp(log_q)
    log_1m_a = _log1mexp((log_q + eps2) * (1.0 - 1.0 / mu2))
    log_a = log_1mq - log_1m_a
    log_b = eps1 - log_q / (mu1 - 1.0)
    bound = np.logaddexp(log_1mq + (orders - 1.0) * log_a, log_q + (orders - 1.0) * log_b) / (orders - 1.0)
    # log(1 - q~) + (a - 1) log A nearly cancels when q~ is tiny (a bound of 1e-58 from terms of 1e-44):
    # raise the bound by 8 ulps of the terms that cancel, and by 1e-10 of itself for log q~'s own
    # rounding (a few ulps, amplified at most ~a times), so that rounding never lowers it
    bound = (bound + 8.0 * _ROUNDING * (orders * abs(log_1mq) + (orders - 1.0) * abs(log_1m_a)) / (orders - 1.0)) \
        * (1.0 + 1e-10) + _SUBNORMAL_ALLOWANCE * orders / (orders - 1.0)
    require(not bool(np.any(np.isnan(bound))), f"Theorem 6 bound is NaN at log_q={log_q!r}, sigma={sigma!r}")
    valid = orders < mu1
    # neighbouring GNMax output laws always differ, so the bound is > 0: a value that underflows is
    # rounded up to the smallest float, never to 0 (an all-zero curve would convert to epsilon 0)
    result: NDArray[np.float64] = np.where(valid, np.minimum(independent, positive_floor(bound)), independent)
    return result


def _log_screen_law(top_count: float, threshold: float,
                    sigma_threshold: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """((log Pr[pass], log Pr[fail]), an absolute error bound on each) of the check max c + N(0, s1^2) >= T.

    scipy's log_ndtr is log(ndtr(x)) on (-20, 6), a few ulps absolute, and an expansion of relative
    accuracy outside it; 8 ulps of the value, plus 8 absolute ulps on that interval, cover both."""
    x = (top_count - threshold) / sigma_threshold
    logs = np.array([log_ndtr(x), log_ndtr(-x)], dtype=np.float64)
    middle = np.array([8.0 * _ROUNDING if -21.0 < x < 7.0 else 0.0, 8.0 * _ROUNDING if -7.0 < x < 21.0 else 0.0])
    return logs, 8.0 * _ROUNDING * np.where(np.isfinite(logs), np.abs(logs), 0.0) + middle


def _bernoulli_renyi_upper(log_p: NDArray[np.float64], log_q: NDArray[np.float64], error: NDArray[np.float64],
                           orders: NDArray[np.float64]) -> NDArray[np.float64]:
    """An upper bound on D_a(P || Q) for two-outcome laws given by their log-probabilities, log p_i
    and log q_i together within error_i of the truth (van Erven & Harremoes 2014, Definition 2).

    exp((a - 1) D) - 1 = sum_i p_i expm1(r_i), r_i = (a - 1)(log p_i - log q_i), since sum_i p_i = 1:
    no cancellation against 1 when D is tiny (both laws near a point mass). Each r_i is raised by
    its rounding allowance (a - 1) error_i, and the sum by 8 ulps of its terms' magnitudes; an
    outcome P gives no mass adds nothing, one Q gives none (in floats) makes D infinite. The result is
    raised by _SUBNORMAL_ALLOWANCE too: a divergence near 1e-320 has no relative precision left."""
    scale = (orders - 1.0)[:, None]
    mass = log_p > -np.inf
    if np.any(mass & (log_q == -np.inf)):
        return np.full(orders.shape, np.inf)
    difference = np.where(mass, log_p - np.where(mass, log_q, 0.0) + error, 0.0)   # 0 where P has no mass
    raised = scale * difference[None, :]                                             # (K, 2)
    probabilities = np.exp(log_p)
    with np.errstate(over="ignore", invalid="ignore"):  # such rows take the log-space value below
        terms = np.where(mass[None, :], probabilities[None, :] * np.expm1(raised), 0.0)
        excess = terms.sum(axis=1) + 8.0 * _ROUNDING * np.abs(terms).sum(axis=1)
        small = np.log1p(np.maximum(excess, 0.0)) / scale[:, 0]
    large = logsumexp(np.where(mass[None, :], log_p[None, :] + raised, -np.inf), axis=1) / scale[:, 0]
    # log space where a term is large (expm1 would overflow); relative rounding allowance 1e-12, and the
    # absolute one a subnormal value needs (1.24e-323 came out 9.9e-324)
    result: NDArray[np.float64] = np.where(raised.max(axis=1) > 30.0, large, small) * (1.0 + 1e-12) \
        + _SUBNORMAL_ALLOWANCE * orders / (orders - 1.0)
    return result


def data_dependent_screen_rdp(top_count: float, threshold: float, sigma_threshold: float,
                              orders: NDArray[np.float64]) -> NDArray[np.float64]:
    """Data-dependent RDP of Confident-GNMax's threshold check at the histogram whose largest count is
    `top_count`, both directions (DivergenceDirection.BOTH), under every neighbouring relation.

    The check releases one bit, pass with probability p(m) = Phi((m - T) / s1) at largest count m
    (Papernot et al. 2018, Algorithm 1). One teacher added, removed or replaced moves m by at most 1,
    so the neighbours' laws are those at m - 1 (m >= 1) and m + 1; a Renyi divergence with one law
    fixed is quasi-convex in the other (its exp((a - 1) D) is convex), so these extremes bound every
    m' in between. The value is max over them of D_a(P_m || P_m') and D_a(P_m' || P_m), computed
    exactly with a rounding allowance (`_bernoulli_renyi_upper`), and capped by the data-independent
    a / (2 s1^2) (Mironov 2017, Corollary 3 at sensitivity 1). Papernot et al. 2018 (Section 4 and
    Appendix; their compute_rdp_threshold) bound the forward direction by Theorem 6 instead; the
    exact two-point divergence is never larger than a valid bound of that direction.

    Args:
        top_count: the largest vote count m, a finite real >= 0.
        threshold: the check's threshold T, a finite real >= 0.
        sigma_threshold: the check's noise s1, > 0 (votes).
        orders: Renyi orders, each finite and > 1.

    Returns:
        A float64 array, one bound per order, in (0, a / (2 s1^2)].

    Raises:
        ValueError: if a parameter is out of range or an order is not finite and > 1.
    """
    top_count = require_non_negative("top_count", top_count)
    threshold = require_non_negative("threshold", threshold)
    sigma_threshold = require_positive("sigma_threshold", sigma_threshold)
    grid = validated_orders(orders)
    independent = grid / (2.0 * np.float64(sigma_threshold) ** 2)
    actual, error = _log_screen_law(top_count, threshold, sigma_threshold)
    worst = np.zeros_like(grid)
    for neighbour in ([top_count - 1.0] if top_count >= 1.0 else []) + [top_count + 1.0]:
        other, other_error = _log_screen_law(neighbour, threshold, sigma_threshold)
        worst = np.maximum(worst, _bernoulli_renyi_upper(actual, other, error + other_error, grid))
        worst = np.maximum(worst, _bernoulli_renyi_upper(other, actual, error + other_error, grid))
    require(not bool(np.any(np.isnan(worst))), f"screen divergence is NaN at top_count={top_count!r}, "
                                               f"threshold={threshold!r}, sigma_threshold={sigma_threshold!r}")
    result: NDArray[np.float64] = positive_floor(np.minimum(worst, independent))
    return result


def histogram_sensitivity_squared(relation: NeighbouringRelation) -> float:
    """The squared L2 sensitivity of a vote histogram under `relation`: 2 when one teacher is
    replaced (its vote moves: one count down, one up), 1 when one is added or removed (one count
    moves by one). Papernot et al. 2018, Section 4 (replace-one); Mironov 2017, Corollary 3 gives the
    Gaussian mechanism's RDP alpha * sensitivity^2 / (2 sigma^2).

    Args:
        relation: the neighbouring relation.

    Returns:
        2.0 under replace-one, 1.0 under the others.

    Raises:
        ValueError: if `relation` is not a NeighbouringRelation.
    """
    return 2.0 if require_relation(relation) is NeighbouringRelation.REPLACE_ONE else 1.0


@register_mechanism
@dataclass(frozen=True)
class GNMax(AccountableMechanism):
    """argmax_j (c_j + N(0, sigma^2)); RDP alpha * s^2 / (2 sigma^2) at the histogram's L2 sensitivity s
    under the relation (Papernot et al. 2018, Proposition 8; Mironov 2017, Corollary 3): alpha / sigma^2
    under replace-one (s = sqrt 2), alpha / (2 sigma^2) when one teacher is added or removed (s = 1)."""

    name: ClassVar[str] = "gnmax"
    summary: ClassVar[str] = "GNMax, Gaussian noisy argmax of vote counts (Papernot et al. 2018, Proposition 8)"
    has_dp_event: ClassVar[bool] = True
    calibrated: ClassVar[str | None] = "sigma"
    calibrate_summary: ClassVar[str] = "smallest GNMax sigma (Papernot et al. 2018, Proposition 8)"

    sigma: float = mechanism_parameter(
        metavar="SIGMA", unit="votes", help="standard deviation of the Gaussian added to each vote count, in votes (> 0)")
    relation: NeighbouringRelation = NeighbouringRelation.REPLACE_ONE

    def __post_init__(self) -> None:
        set_validated(self, sigma=require_positive("sigma", self.sigma), relation=require_relation(self.relation))

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return positive_floor(orders * histogram_sensitivity_squared(self.relation) / (2.0 * np.float64(self.sigma) ** 2))

    def dp_event(self) -> DpEvent:
        """GaussianDpEvent(sigma / s), s the histogram's L2 sensitivity under the relation: the
        unit-sensitivity event has RDP a s^2 / (2 sigma^2), this curve (Papernot et al. 2018,
        Proposition 8); the argmax is post-processing.

        Returns:
            dp_accounting.GaussianDpEvent(sigma / s).
        """
        import dp_accounting

        return dp_accounting.GaussianDpEvent(self.sigma / math.sqrt(histogram_sensitivity_squared(self.relation)))

    @property
    def theorem_6_sigma(self) -> float:
        """The sigma at which Theorem 6 reads this relation's RDP mu / sigma'^2: sigma under replace-one
        (mu / sigma^2, Papernot et al. 2018, Proposition 8), sigma sqrt 2 when one teacher is added or
        removed (mu / (2 sigma^2) = mu / (sigma sqrt 2)^2; Mironov 2017, Corollary 3 at sensitivity 1)."""
        return float(self.sigma) * math.sqrt(2.0 / histogram_sensitivity_squared(self.relation))

    def data_dependent_rdp(self, counts: npt.ArrayLike, orders: NDArray[np.float64],
                           direction: DivergenceDirection = DivergenceDirection.BOTH) -> NDArray[np.float64]:
        """Data-dependent RDP at the histogram `counts` (Papernot et al. 2018, Theorem 6 with Proposition 7).

        FROM_ACTUAL: Theorem 6 at D, bounding D_a(M(D) || M(D')). BOTH (default): the larger of that
        and Theorem 6 at every neighbour D' (`log_q_gnmax_neighbours`: every gap reduced by 2 under
        replace-one, by 1 when one teacher is added or removed), which bounds D_a(M(D') || M(D))
        because D is a neighbour of D'. Theorem 6 holds for any mechanism that is (mu_i, eps_i)-RDP
        under the relation; it is applied with this relation's own GNMax RDP (`theorem_6_sigma`:
        mu / sigma^2 replace-one, mu / (2 sigma^2) add or remove), and q~ is Proposition 7's at the
        noise actually added (sigma). The result is capped by this relation's data-independent curve.

        Args:
            counts: (V,) the vote histogram D.
            orders: Renyi orders, each finite and > 1.
            direction: FROM_ACTUAL or BOTH (or its value).

        Returns:
            A float64 array, one bound per order, capped by this relation's data-independent curve.

        Raises:
            ValueError: if `counts` is not a valid histogram, an order is not finite and > 1, or the
                direction is unknown.
        """
        direction = DivergenceDirection(direction)
        rdp_sigma = self.theorem_6_sigma
        forward = data_dependent_gnmax_rdp(log_q_gnmax(counts, self.sigma), rdp_sigma, orders)
        if direction is DivergenceDirection.FROM_ACTUAL:
            return np.minimum(forward, self.rdp_values(orders))
        reverse = data_dependent_gnmax_rdp(log_q_gnmax_neighbours(counts, self.sigma, self.relation), rdp_sigma,
                                           orders)
        return np.minimum(np.maximum(forward, reverse), self.rdp_values(orders))

    def data_dependent_curve(self, counts: npt.ArrayLike, orders: Sequence[float] = DEFAULT_ORDERS,
                             direction: DivergenceDirection = DivergenceDirection.BOTH) -> RdpCurve:
        """`data_dependent_rdp` as a data-dependent RdpCurve that records its direction.

        Args:
            counts: (V,) the vote histogram D.
            orders: Renyi orders, each finite and > 1 (sorted, repeats merged).
            direction: FROM_ACTUAL or BOTH (or its value).

        Returns:
            The RdpCurve, data_dependent=True, with `direction`.

        Raises:
            ValueError: as data_dependent_rdp.
        """
        grid = canonical_orders(orders)
        direction = DivergenceDirection(direction)
        values = self.data_dependent_rdp(counts, np.asarray(grid), direction)
        return RdpCurve(grid, values, self.relation, data_dependent=True, direction=direction)

    def aggregate(self, counts: npt.ArrayLike, rng: np.random.Generator) -> int:
        """GNMax on one histogram.

        Args:
            counts: (V,) the vote histogram.
            rng: the numpy generator of the Gaussian noise.

        Returns:
            argmax_j (c_j + N(0, sigma^2)).

        Raises:
            ValueError: if `counts` is not a valid histogram or `rng` is not a numpy Generator.
        """
        values = validated_counts(counts)
        require_generator(rng)
        return int(np.argmax(values + rng.normal(0.0, self.sigma, size=values.shape)))


@register_mechanism
@dataclass(frozen=True)
class ConfidentGNMax(AccountableMechanism):
    """Confident-GNMax (Papernot et al. 2018, Algorithm 1): answer only if max_j c_j + N(0, s1^2) >= T.

    Data-independent RDP per query: the threshold check alpha / (2 s1^2) (the max count has
    sensitivity 1 under every relation) plus, when it answers, GNMax's under the relation (alpha / s2^2
    replace-one, alpha / (2 s2^2) add or remove). `rdp_values` is
    the worst case (both); use `screen_rdp` / `answer_rdp` to charge a query that failed the check.
    """

    name: ClassVar[str] = "confident-gnmax"
    summary: ClassVar[str] = ("Confident-GNMax, screen then GNMax, both charged every query (Papernot et al. 2018, "
                              "Algorithm 1)")
    has_dp_event: ClassVar[bool] = True
    calibrated: ClassVar[str | None] = "sigma"
    calibrate_summary: ClassVar[str] = ("smallest Confident-GNMax sigma s2 with s1 = R * s2 (Papernot et al. 2018, "
                                        "Algorithm 1)")
    calibrate_derived: ClassVar[Sequence[str]] = ("sigma_threshold",)  # s1 = --ratio * s2
    flag_order: ClassVar[Sequence[str]] = ("sigma", "sigma_threshold")
    account_fixed: ClassVar[Mapping[str, Any]] = {"threshold": 0.0}  # the data-independent curve does not read T

    threshold: float
    sigma_threshold: float = mechanism_parameter(
        metavar="S1", unit="votes",
        help="Confident-GNMax screen noise s1: standard deviation of the Gaussian added to the top vote count, in votes")
    sigma: float = mechanism_parameter(
        metavar="SIGMA", unit="votes",
        help="GNMax noise s2: standard deviation of the Gaussian added to each vote count, in votes")
    relation: NeighbouringRelation = NeighbouringRelation.REPLACE_ONE

    def __post_init__(self) -> None:
        set_validated(self, threshold=require_non_negative("threshold", self.threshold),
                      sigma_threshold=require_positive("sigma_threshold", self.sigma_threshold),
                      sigma=require_positive("sigma", self.sigma), relation=require_relation(self.relation))

    def screen_rdp(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        """The threshold check's RDP alpha / (2 s1^2) (the max count has sensitivity 1).

        Args:
            orders: Renyi orders, each finite and > 1.

        Returns:
            A float64 array, one value per order.

        Raises:
            ValueError: if an order is not finite and > 1.
        """
        return positive_floor(validated_orders(orders) / (2.0 * np.float64(self.sigma_threshold) ** 2))

    def answer_rdp(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        """The answer's RDP: GNMax(sigma)'s under the relation.

        Args:
            orders: Renyi orders, each finite and > 1.

        Returns:
            A float64 array, one value per order.
        """
        return GNMax(self.sigma, self.relation).rdp_values(orders)

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.screen_rdp(orders) + self.answer_rdp(orders)

    def dp_event(self) -> DpEvent:
        """ComposedDpEvent([GaussianDpEvent(s1), GNMax's event]): the screen adds N(0, s1^2) to the max
        count (sensitivity 1: a / (2 s1^2)) and the answer is GNMax under the relation, composed
        (Papernot et al. 2018, Algorithm 1 and Proposition 8; Mironov 2017, Proposition 1).

        Returns:
            The ComposedDpEvent.
        """
        import dp_accounting

        return dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(self.sigma_threshold),
                                              GNMax(self.sigma, self.relation).dp_event()])

    def data_dependent_screen_rdp(self, counts: npt.ArrayLike, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        """The threshold check's data-dependent RDP at the histogram, both directions, every relation
        (`data_dependent_screen_rdp`: the exact two-outcome divergence against the largest count one
        step up or down, capped by a / (2 s1^2); Papernot et al. 2018, Algorithm 1 and Section 4).

        Args:
            counts: (V,) the vote histogram.
            orders: Renyi orders, each finite and > 1.

        Returns:
            A float64 array, one value per order, at most screen_rdp's.

        Raises:
            ValueError: if `counts` is not a valid histogram or an order is not finite and > 1.
        """
        values = validated_counts(counts)
        return data_dependent_screen_rdp(float(values.max()), self.threshold, self.sigma_threshold, orders)

    def data_dependent_rdp(self, counts: npt.ArrayLike, orders: NDArray[np.float64], answered: bool,
                           direction: DivergenceDirection = DivergenceDirection.BOTH,
                           data_dependent_screen: bool = False) -> NDArray[np.float64]:
        """The screen plus, if answered, GNMax's data-dependent bound in `direction` (Papernot et al.
        2018, Theorem 6; see GNMax.data_dependent_rdp). The screen is charged its data-independent
        a / (2 s1^2), or with `data_dependent_screen` its data-dependent divergence at the histogram
        (`data_dependent_screen_rdp`, both directions).

        Args:
            counts: (V,) the vote histogram.
            orders: Renyi orders, each finite and > 1.
            answered: whether the query passed the check and was answered.
            direction: FROM_ACTUAL or BOTH.
            data_dependent_screen: charge the screen data-dependently too.

        Returns:
            A float64 array, one value per order.

        Raises:
            ValueError: if an order, `counts`, `answered` or `data_dependent_screen` is invalid.
        """
        grid = validated_orders(orders)
        values = validated_counts(counts)
        answered = require_bool("answered", answered)
        screen = (self.data_dependent_screen_rdp(values, grid)
                  if require_bool("data_dependent_screen", data_dependent_screen) else self.screen_rdp(grid))
        answer = GNMax(self.sigma, self.relation).data_dependent_rdp(values, grid, direction)
        return screen + answer if answered else screen

    def aggregate(self, counts: npt.ArrayLike, rng: np.random.Generator) -> int | None:
        """Confident-GNMax on one histogram.

        Args:
            counts: (V,) the vote histogram.
            rng: the numpy generator of the screen's and the answer's noise.

        Returns:
            GNMax's answer if max_j c_j + N(0, s1^2) >= T, else None.

        Raises:
            ValueError: if `counts` is not a valid histogram or `rng` is not a numpy Generator.
        """
        values = validated_counts(counts)
        require_generator(rng)
        if values.max() + rng.normal(0.0, self.sigma_threshold) < self.threshold:
            return None
        return GNMax(self.sigma, self.relation).aggregate(values, rng)


def gnmax_log_output_law(counts: npt.ArrayLike, sigma: float,
                         points_per_sigma: int = 32) -> tuple[NDArray[np.float64], float]:
    """log Pr[argmax_j (c_j + N(0, sigma^2)) = j] for every token, and the quadrature's relative
    error estimate.

    Pr[j wins] = integral phi_s(x - c_j) prod_{k != j} Phi_s(x - c_k) dx (Papernot et al. 2018,
    GNMax). Tokens with equal counts win with equal probability, so the integrand is evaluated once
    per distinct count value, in log space (log_ndtr): probabilities far below the smallest float (a
    token 64 votes behind at sigma 0.5) stay finite. The integrand is log-concave (a product of phi
    and Phi factors), so it is unimodal and falls at least as fast as a Gaussian of scale sigma
    away from its mode: each value is integrated by the trapezoid rule on mode +- 16 sigma, spacing
    sigma / points_per_sigma, whatever the spread of the counts, in the scale-free variable
    t = (x - c) / sigma. The error estimate is the larger of
    |sum - 1| and the largest relative change against half the resolution.

    Args:
        counts: (V,) the vote histogram.
        sigma: the noise standard deviation, > 0 (votes).
        points_per_sigma: the trapezoid rule's points per sigma (halved for the error estimate).

    Returns:
        ((V,) log Pr[token j wins], the relative error estimate).

    Raises:
        ValueError: if sigma is not > 0.
    """
    given = np.asarray(counts, dtype=np.float64)
    sigma = require_positive("sigma", sigma)
    values, inverse, multiplicity = np.unique(given, return_inverse=True, return_counts=True)
    if (values[-1] - values[0]) / sigma > 1e150:  # (gap / sigma)^2 would overflow: the noise cannot reorder counts
        law = np.full(values.size, -np.inf)       # below the top, a log-probability under -1e300: 0 in floats
        law[-1] = -math.log(multiplicity[-1])
        return law[inverse], 0.0
    # in t = (x - v_k) / sigma the integrand of value v_k is phi(t) prod_w Phi(t + (v_k - w) / sigma)^m'_w, m'_w
    # the multiplicity of w (less one for w = v_k): scale-free, so a sigma below the counts' float spacing is fine
    gaps = (values[:, None] - values[None, :]) / sigma                             # (distinct, distinct)
    weights = np.broadcast_to(multiplicity.astype(np.float64), gaps.shape).copy()
    np.fill_diagonal(weights, multiplicity - 1.0)
    log_root = 0.5 * math.log(2 * math.pi)

    def log_integrand(t: NDArray[np.float64]) -> NDArray[np.float64]:
        """t (distinct, points) -> log of value k's integrand at t[k]."""
        log_cdf = log_ndtr(t[:, :, None] + gaps[:, None, :])
        result: NDArray[np.float64] = -0.5 * t ** 2 - log_root + (weights[:, None, :] * log_cdf).sum(axis=-1)
        return result

    def slope(t: NDArray[np.float64]) -> NDArray[np.float64]:
        """d/dt of log_integrand at t (distinct,): decreasing, as the integrand is log-concave."""
        z = t[:, None] + gaps
        hazard = np.exp(-0.5 * z ** 2 - log_root - log_ndtr(z))                   # phi / Phi
        result: NDArray[np.float64] = -t + (weights * hazard).sum(axis=1)
        return result

    low = (values[0] - values) / sigma - 16.0
    high = (values[-1] - values) / sigma + 16.0
    for _ in range(200):  # bisection on the slope, to 1e-12 (the window about the mode needs no more)
        if np.all(high - low <= 1e-12):
            break
        middle = 0.5 * (low + high)
        rising = slope(middle) > 0
        low, high = np.where(rising, middle, low), np.where(rising, high, middle)
    mode = 0.5 * (low + high)

    def per_value(points: int) -> NDArray[np.float64]:
        offsets = np.arange(-16 * points, 16 * points + 1) / points
        weights = np.full(offsets.size, -math.log(points))
        weights[[0, -1]] -= math.log(2.0)
        law: NDArray[np.float64] = log_sum_exp(log_integrand(mode[:, None] + offsets[None, :]) + weights[None, :], axis=1)
        return law

    fine, coarse = per_value(points_per_sigma), per_value(points_per_sigma // 2)
    log_total = float(log_sum_exp(fine, weights=multiplicity))
    error = max(abs(math.expm1(log_total)), float(np.max(np.abs(np.expm1(coarse - fine)))))
    return (fine - log_total)[inverse], error
