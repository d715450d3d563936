"""Hot PATE voting as a decoding mechanism: votes, one aggregator, per-step charges and output laws.

A step (Cohen et al. 2023, Framework 1.2): every teacher casts one vote from its next-token
distribution, coordinated (one shared Exp(1) vector per step: y_i = argmax_j p_i[j] / u_j) or
independent; the histogram c goes to an aggregator, which releases a token or fails, and on fail
the public model answers. The shared vector is drawn from `randomness.vote_seed(run seed, step)`,
public by construction, so conditioned on it the histogram is a deterministic function of the
teachers: that is what lets an audit recompute the exact output law on any neighbouring
histogram.

Aggregators and what they are charged per step (NeighbouringRelation: one teacher added, removed
or replaced moves at most one vote, L2 sensitivity <= sqrt(2), max-count sensitivity 1):
- TARGMAX_T and TWS_{T, gamma}: T-threshold private (robustness, not DP): +inf, "no guarantee".
- DPARGMAX, Confident-GNMax (Papernot et al. 2018, Algorithm 1): the screen alpha / (2 s1^2)
  every step; the answer GNMax alpha / s2^2 (ibid., Proposition 8) or, data-dependently, Theorem 6
  at the histogram (both directions, `GNMax.data_dependent_rdp`). accounting = "released-output"
  charges the answer at every step: the released pair (decision, token) has divergence at most
  screen + answer whichever branch is taken (Mironov 2017, Proposition 1). "realised-path" charges
  the answer only where the screen passed (Papernot et al. 2018's convention: a failed step costs
  only the screen): an ex-post statement about this run, not an RDP bound (docs/soundness.md).
- DPWS: Gaussian noise on every count, then TWS on the noisy counts with the public N as n:
  alpha / sigma^2 every step (post-processing of the Gaussian mechanism).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from scipy.special import log_ndtr, logsumexp

from dpledger.accounting.errors import require, require_bool, require_int_at_least, require_member, require_positive
from dpledger.accounting.relation import DivergenceDirection, NeighbouringRelation
from dpledger.mechanisms.base import Mechanism, require_relation, set_validated
from dpledger.mechanisms.hot_pate import DPWeightedSampler, ThresholdWeightedSampler, require_finite_at_least_one
from dpledger.mechanisms.pate import ConfidentGNMax, GNMax

ACCOUNTING_CHOICES = ("released-output", "realised-path")


class VoteCoordination(enum.Enum):
    """How teachers vote: with one shared random vector per step (hot) or independently (cold)."""

    COORDINATED = "coordinated"
    INDEPENDENT = "independent"


class Aggregator(enum.Enum):
    TARGMAX = "targmax"
    TWS = "tws"
    DPARGMAX = "dpargmax"
    DPWS = "dpws"

    @property
    def differentially_private(self) -> bool:
        return self in (Aggregator.DPARGMAX, Aggregator.DPWS)


def votes_from_seeds(teachers: torch.Tensor, seeds: Sequence[int], coordination: VoteCoordination) -> np.ndarray:
    """One vote per teacher per step, (L, N), from teachers (L, N, V) and one seed per step.

    Coordinated: one Exp(1) vector u per step, y_i = argmax_j log p_i[j] - log u_j (the exponential
    race with shared draws: each vote's marginal is p_i, Cohen et al. 2023). Independent: an Exp(1)
    per teacher and token, the same race run separately (exact categorical sampling).
    """
    require(teachers.ndim == 3 and teachers.shape[0] == len(seeds),
            f"teachers must be (steps, N, V) with one seed per step, got {tuple(teachers.shape)} and {len(seeds)} seeds")
    rows, n, vocab = teachers.shape
    shape = (vocab,) if coordination is VoteCoordination.COORDINATED else (n, vocab)
    draws = torch.stack([torch.empty(shape, dtype=torch.float64).exponential_(generator=torch.Generator().manual_seed(s))
                         for s in seeds])
    if coordination is VoteCoordination.COORDINATED:
        draws = draws.unsqueeze(1)
    with torch.no_grad():  # a draw of exactly 0 would make -inf - (-inf) = NaN, which argmax takes as the maximum
        scores = torch.log(teachers.double().cpu()) - torch.log(draws.clamp_min(torch.finfo(torch.float64).tiny))
    return torch.argmax(scores, dim=-1).numpy()


def histograms(votes: np.ndarray, vocabulary_size: int) -> np.ndarray:
    """Counts (L, V) int64 from votes (L, N)."""
    counts = np.zeros((votes.shape[0], vocabulary_size), dtype=np.int64)
    np.add.at(counts, (np.arange(votes.shape[0])[:, None], votes), 1)
    return counts


def gnmax_log_output_law(counts, sigma: float, points_per_sigma: int = 32) -> tuple[np.ndarray, float]:
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
    """
    counts = np.asarray(counts, dtype=np.float64)
    sigma = require_positive("sigma", sigma)
    values, inverse, multiplicity = np.unique(counts, return_inverse=True, return_counts=True)
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

    def log_integrand(t: np.ndarray) -> np.ndarray:
        """t (distinct, points) -> log of value k's integrand at t[k]."""
        log_cdf = log_ndtr(t[:, :, None] + gaps[:, None, :])
        return -0.5 * t ** 2 - log_root + (weights[:, None, :] * log_cdf).sum(axis=-1)

    def slope(t: np.ndarray) -> np.ndarray:
        """d/dt of log_integrand at t (distinct,): decreasing, as the integrand is log-concave."""
        z = t[:, None] + gaps
        hazard = np.exp(-0.5 * z ** 2 - log_root - log_ndtr(z))                   # phi / Phi
        return -t + (weights * hazard).sum(axis=1)

    low = (values[0] - values) / sigma - 16.0
    high = (values[-1] - values) / sigma + 16.0
    for _ in range(200):  # bisection on the slope, to the bracket's float resolution
        middle = 0.5 * (low + high)
        rising = slope(middle) > 0
        low, high = np.where(rising, middle, low), np.where(rising, high, middle)
    mode = 0.5 * (low + high)

    def per_value(points: int) -> np.ndarray:
        offsets = np.arange(-16 * points, 16 * points + 1) / points
        weights = np.full(offsets.size, -math.log(points))
        weights[[0, -1]] -= math.log(2.0)
        return logsumexp(log_integrand(mode[:, None] + offsets[None, :]) + weights[None, :], axis=1)

    fine, coarse = per_value(points_per_sigma), per_value(points_per_sigma // 2)
    log_total = float(logsumexp(fine, b=multiplicity))
    error = max(abs(math.expm1(log_total)), float(np.max(np.abs(np.expm1(coarse - fine)))))
    return (fine - log_total)[inverse], error


@dataclass(frozen=True)
class VotingMechanism(Mechanism):
    """One Hot PATE voting step (Cohen et al. 2023) over N teachers, with its aggregator and charges.

    `rdp_values` is the worst case of one step (what released-output accounting charges); `charges`
    gives each component's per-step values for a block of histograms.
    """

    coordination: VoteCoordination
    aggregator: Aggregator
    teachers: int
    threshold: float
    gamma: float = 1.0
    sigma: float | None = None
    sigma_threshold: float | None = None
    data_dependent_answer: bool = False
    accounting: str = "released-output"
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE

    def __post_init__(self) -> None:
        coordination = require_member(VoteCoordination, "votes", self.coordination)
        aggregator = require_member(Aggregator, "aggregator", self.aggregator)
        teachers = require_int_at_least("teachers", self.teachers, 1)
        threshold = require_positive("threshold", self.threshold)
        if aggregator in (Aggregator.TARGMAX, Aggregator.TWS):
            require(float(threshold).is_integer(), f"threshold must be an integer vote count for {aggregator.value}, "
                                                   f"got {threshold!r}")
        require(threshold <= teachers or aggregator.differentially_private,
                f"threshold must be <= teachers = {teachers} (no token could pass), got {threshold!r}")
        gamma = require_finite_at_least_one("gamma", self.gamma)
        needs_sigma = aggregator.differentially_private
        require(needs_sigma == (self.sigma is not None),
                f"sigma is {'required' if needs_sigma else 'not used'} for aggregator {aggregator.value}"
                + (f", got {self.sigma!r}" if self.sigma is not None else ""))
        sigma = require_positive("sigma", self.sigma) if needs_sigma else None
        screened = aggregator is Aggregator.DPARGMAX
        require(screened == (self.sigma_threshold is not None),
                f"sigma_threshold is {'required' if screened else 'not used'} for aggregator {aggregator.value}"
                + (f", got {self.sigma_threshold!r}" if self.sigma_threshold is not None else ""))
        sigma_threshold = require_positive("sigma_threshold", self.sigma_threshold) if screened else None
        data_dependent = require_bool("data_dependent_answer", self.data_dependent_answer)
        require(not data_dependent or screened, f"data_dependent_answer applies to dpargmax only (PATE 2018 Theorem 6), "
                                                f"got aggregator {aggregator.value}")
        require(self.accounting in ACCOUNTING_CHOICES,
                f"accounting must be one of {list(ACCOUNTING_CHOICES)}, got {self.accounting!r}")
        require(self.accounting == "released-output" or screened,
                f"accounting = 'realised-path' applies to dpargmax only, got aggregator {aggregator.value}")
        set_validated(self, coordination=coordination, aggregator=aggregator, teachers=teachers, threshold=threshold,
                      gamma=gamma, sigma=sigma, sigma_threshold=sigma_threshold, data_dependent_answer=data_dependent,
                      relation=require_relation(self.relation))

    # -- the pieces -------------------------------------------------------------------------------

    @property
    def confident_gnmax(self) -> ConfidentGNMax:
        return ConfidentGNMax(self.threshold, self.sigma_threshold, self.sigma, self.relation)

    @property
    def dpws(self) -> DPWeightedSampler:
        return DPWeightedSampler(self.sigma, self.threshold, self.gamma, self.relation, voters=self.teachers)

    @property
    def threshold_private(self) -> bool:
        return not self.aggregator.differentially_private

    @property
    def answer_component(self) -> str:
        return "gnmax_data_dependent" if self.data_dependent_answer else "gnmax"

    def components(self) -> dict[str, bool]:
        """Charged component -> data-dependent."""
        if self.threshold_private:
            return {f"{self.aggregator.value}_threshold_private": False}
        if self.aggregator is Aggregator.DPWS:
            return {"dpws_gaussian": False}
        return {"confident_gnmax_screen": False, self.answer_component: self.data_dependent_answer}

    def dp_event(self):
        """The dp-accounting event of one step as charged: Confident-GNMax's or DPWS's Gaussians
        (released-output accounting; dpledger.mechanisms.base.Mechanism.dp_event). None for TARGMAX/TWS (no
        DP guarantee), for realised-path accounting (the charge depends on the screen's outcome) and
        for Theorem 6's data-dependent answer."""
        if self.threshold_private or self.accounting != "released-output" or self.data_dependent_answer:
            return None
        return (self.dpws if self.aggregator is Aggregator.DPWS else self.confident_gnmax).dp_event()

    def no_pld_reason(self) -> str | None:
        if self.threshold_private:
            return f"{self.aggregator.value} gives no DP guarantee (T-threshold privacy only): no PLD"
        if self.accounting != "released-output":
            return "realised-path accounting charges the answer only where the screen passed: an ex-post total, no PLD"
        if self.data_dependent_answer:
            return "the answer is charged Papernot et al. 2018's data-dependent Theorem 6: no PLD in dp-accounting"
        return super().no_pld_reason()

    def rdp_values(self, orders: np.ndarray) -> np.ndarray:
        if self.threshold_private:
            return np.full_like(orders, np.inf, dtype=np.float64)
        if self.aggregator is Aggregator.DPWS:
            return self.dpws.rdp_values(orders)
        return self.confident_gnmax.rdp_values(orders)

    # -- one block of steps -----------------------------------------------------------------------

    def histograms(self, teachers: torch.Tensor, seeds: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(votes (L, N), counts (L, V)) for teachers (L, N, V) and the steps' vote seeds."""
        require(teachers.shape[-2] == self.teachers,
                f"the mechanism is for {self.teachers} teachers, got distributions of {teachers.shape[-2]}")
        votes = votes_from_seeds(teachers, seeds, self.coordination)
        return votes, histograms(votes, teachers.shape[-1])

    def decide(self, counts: np.ndarray, generator: torch.Generator) -> tuple[int | None, float, list[float]]:
        """The aggregator on one histogram: (released token or None, screen statistic, noise drawn).

        The statistic is the (noisy, for DPARGMAX and DPWS) maximum count; the noise list holds what
        the decision consumed from `generator`, for the trace (the generator replays it exactly).
        """
        top = int(np.argmax(counts))
        if self.aggregator is Aggregator.TARGMAX:
            return (top if counts[top] >= self.threshold else None), float(counts[top]), []
        if self.aggregator is Aggregator.TWS:
            probs = ThresholdWeightedSampler(int(self.threshold), self.gamma).probabilities(counts)
            draw = float(torch.rand(1, generator=generator, dtype=torch.float64))
            return _pick(probs, draw), float(counts[top]), [draw]
        if self.aggregator is Aggregator.DPARGMAX:
            screen_noise = float(torch.randn(1, generator=generator, dtype=torch.float64)) * self.sigma_threshold
            statistic = float(counts[top]) + screen_noise
            if statistic < self.threshold:
                return None, statistic, [screen_noise]
            noisy = counts + torch.randn(counts.size, generator=generator, dtype=torch.float64).numpy() * self.sigma
            token = int(np.argmax(noisy))
            return token, statistic, [screen_noise, float(noisy[token])]
        noise = torch.randn(counts.size, generator=generator, dtype=torch.float64).numpy() * self.sigma
        probs = self.dpws.probabilities_given_noise(counts, noise)
        draw = float(torch.rand(1, generator=generator, dtype=torch.float64))
        return _pick(probs, draw), float(np.max(counts + noise)), [draw]

    def charges(self, counts: np.ndarray, passed: np.ndarray, orders: np.ndarray) -> dict[str, np.ndarray]:
        """Each component's RDP (L, K) for histograms (L, V) whose screens passed as `passed` (L,)."""
        rows = counts.shape[0]
        if self.threshold_private or self.aggregator is Aggregator.DPWS:
            (name,) = self.components()
            return {name: np.broadcast_to(self.rdp_values(orders), (rows, orders.size)).copy()}
        screen = np.broadcast_to(self.confident_gnmax.screen_rdp(orders), (rows, orders.size)).copy()
        if self.data_dependent_answer:
            gnmax = GNMax(self.sigma, self.relation)
            answer = np.stack([gnmax.data_dependent_rdp(c, orders, DivergenceDirection.BOTH) for c in counts]) \
                if rows else np.zeros((0, orders.size))
        else:
            answer = np.broadcast_to(self.confident_gnmax.answer_rdp(orders), (rows, orders.size)).copy()
        if self.accounting == "realised-path":
            answer = np.where(np.asarray(passed, dtype=bool)[:, None], answer, 0.0)
        return {"confident_gnmax_screen": screen, self.answer_component: answer}

    # -- exact output laws (the audit's neighbours) -----------------------------------------------

    def log_output_law(self, counts) -> tuple[float, np.ndarray, float]:
        """(log Pr[fail], log Pr[release j] for every j, relative numerical error) on one histogram,
        for the aggregators whose law has a closed form or a one-dimensional integral: TARGMAX (a
        point mass), TWS (its weights), DPARGMAX (Pr[fail] = Phi((T - max c) / s1), the answer by
        `gnmax_log_output_law`). DPWS's law is a V-dimensional integral: ValueError."""
        counts = np.asarray(counts, dtype=np.float64)
        if self.aggregator is Aggregator.TARGMAX or self.aggregator is Aggregator.TWS:
            if self.aggregator is Aggregator.TARGMAX:
                law = np.zeros(counts.size)
                top = int(np.argmax(counts))
                law[top] = 1.0 if counts[top] >= self.threshold else 0.0
            else:
                law = ThresholdWeightedSampler(int(self.threshold), self.gamma).probabilities(counts)
            fail = max(0.0, 1.0 - float(law.sum()))
            with np.errstate(divide="ignore"):
                return (math.log(fail) if fail > 0 else -math.inf), np.log(law), 0.0
        require(self.aggregator is Aggregator.DPARGMAX, "DPWS's output law has no closed form (a V-dimensional "
                                                         "integral); use its noisy-histogram divergence")
        log_fail = float(log_ndtr((self.threshold - counts.max()) / self.sigma_threshold))
        log_pass = float(log_ndtr((counts.max() - self.threshold) / self.sigma_threshold))
        answer, error = gnmax_log_output_law(counts, self.sigma)
        return log_fail, log_pass + answer, error

    def log_answer_law(self, counts) -> tuple[np.ndarray, float]:
        """DPARGMAX's token law given that the screen passed (GNMax's), in logs, with its error."""
        require(self.aggregator is Aggregator.DPARGMAX, "the answer law given a passed screen is DPARGMAX's")
        return gnmax_log_output_law(np.asarray(counts, dtype=np.float64), self.sigma)

    def log_screen_law(self, counts) -> tuple[float, float]:
        """DPARGMAX's (log Pr[fail], log Pr[pass]) on one histogram."""
        top = float(np.max(counts))
        return (float(log_ndtr((self.threshold - top) / self.sigma_threshold)),
                float(log_ndtr((top - self.threshold) / self.sigma_threshold)))


def _pick(probs: np.ndarray, draw: float) -> int | None:
    """The token whose cumulative-probability interval holds `draw`, or None (fail) past the total."""
    index = int(np.searchsorted(np.cumsum(probs), draw, side="right"))
    return index if index < probs.size else None


def renyi_divergence_of_log_laws(log_p: np.ndarray, log_q: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """D_a(p || q) at every order for two laws on the same finite outcomes, given as log
    probabilities (-inf for none) (van Erven & Harremoes 2014, Definition 2): +inf where p puts mass
    outside q's support; rounding below 0 is reported as 0."""
    log_p, log_q = np.asarray(log_p, dtype=np.float64), np.asarray(log_q, dtype=np.float64)
    orders = np.asarray(orders, dtype=np.float64)
    support = log_p > -np.inf
    if np.any(support & (log_q == -np.inf)):
        return np.full(orders.shape, np.inf)
    values = logsumexp(orders[:, None] * log_p[support][None, :] + (1.0 - orders[:, None]) * log_q[support][None, :],
                       axis=1)
    return np.maximum(values / (orders - 1.0), 0.0)
