"""Hot PATE: coordinated teacher voting and its aggregators (Cohen et al. 2023).

Votes are cast with shared public randomness (coordinated) or independently (cold); the histogram
changes by one vote when one teacher is replaced (L1 = 2, L2 = sqrt(2), Linf = 1). TARGMAX and TWS
are T-threshold private (a robustness notion, not DP): their curves are +inf at every order.
DPARGMAX is Confident-GNMax (dpledger.mechanisms.pate); DPWS is the construction documented below.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray
from scipy.special import log_ndtr, ndtr, ndtri_exp

from dpledger.accounting.errors import require, require_bool, require_finite, require_int_at_least, require_positive
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.accounting.rounding import positive_floor
from dpledger.mechanisms.base import Mechanism, require_relation, set_validated
from dpledger.mechanisms.distributions import as_float64_array
from dpledger.mechanisms.pate import histogram_sensitivity_squared, require_generator, validated_counts
from dpledger.mechanisms.kernels import _log
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:  # dp_accounting ships no type information: DpEvent is opaque to mypy
    import torch
    from dp_accounting.dp_event import DpEvent
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light


def vote_histogram(votes: npt.ArrayLike, vocabulary_size: int) -> NDArray[np.int64]:
    """c_j = #{i : y_i = j} for each token j; votes (..., N) -> counts (..., V).

    Args:
        votes: (..., N) integer token ids in [0, vocabulary_size), one per teacher.
        vocabulary_size: V, an integer >= 1.

    Returns:
        (..., V) int64 vote counts.

    Raises:
        ValueError: if V is not an integer >= 1, the votes are not integers in [0, V), or the teacher axis is empty.
    """
    vocabulary_size = require_int_at_least("vocabulary_size", vocabulary_size, 1)
    votes = np.asarray(votes)
    require(np.issubdtype(votes.dtype, np.integer), f"votes must be integer token ids, got dtype {votes.dtype}")
    require(votes.ndim >= 1 and votes.shape[-1] > 0, f"votes must have a non-empty teacher axis, got shape {votes.shape}")
    require(bool(np.all((votes >= 0) & (votes < vocabulary_size))), f"votes must lie in [0, {vocabulary_size})")
    flat = votes.reshape(-1, votes.shape[-1])
    counts = np.zeros((flat.shape[0], vocabulary_size), dtype=np.int64)
    np.add.at(counts, (np.arange(flat.shape[0])[:, None], flat), 1)
    return counts.reshape(votes.shape[:-1] + (vocabulary_size,))


def coordinated_votes(teachers: torch.Tensor, generator: torch.Generator | None = None,
                      log_uniform_exp: torch.Tensor | None = None) -> torch.Tensor:
    """Hot PATE coordinated votes: y_i = argmax_j p_i[j] / u_j with one shared u_j ~ Exp(1).

    Hot PATE (Cohen et al. 2023), coordinated ensembles: the shared exponential draws make each
    vote's marginal exactly p_i (exponential race) while teachers that agree on the support vote
    alike.

    Args:
        teachers: (..., N, V) next-token distributions, one row per teacher.
        generator: seeds the shared Exp(1) draws (None: torch's global generator); unused when
            `log_uniform_exp` is given.
        log_uniform_exp: log u, shape (..., V), passed explicitly for replay; None draws it.

    Returns:
        (..., N) int64 votes, one token index per teacher.
    """
    if log_uniform_exp is None:
        shape = teachers.shape[:-2] + teachers.shape[-1:]
        exp_draws = torch.empty(shape, dtype=torch.float64, device=teachers.device).exponential_(generator=generator)
        log_uniform_exp = torch.log(exp_draws)
    # a log draw of -inf beside a zero probability would score NaN, which argmax takes as the maximum
    log_uniform_exp = log_uniform_exp.clamp_min(math.log(torch.finfo(torch.float64).tiny))
    scores = _log(teachers.double()) - log_uniform_exp.unsqueeze(-2)
    return torch.argmax(scores, dim=-1)


def cast_votes(teachers: npt.ArrayLike | torch.Tensor, coordinated: bool, seed: int) -> NDArray[np.int64]:
    """One vote per teacher: coordinated (one shared Exp(1) vector, Gumbel-max) or independent.

    teachers (..., N, V). The shared randomness depends on `seed` only, never on private data.

    Args:
        teachers: (..., N, V) the teachers' next-token distributions.
        coordinated: True for coordinated votes (shared randomness), False for independent ones.
        seed: the public seed, an integer in [0, 2**63).

    Returns:
        (..., N) int64 token ids.

    Raises:
        ValueError: if `teachers` are not distributions, `coordinated` is not a bool or `seed` is out of range.
    """
    probs = torch.from_numpy(as_float64_array("teachers", teachers, min_ndim=2))
    coordinated = require_bool("coordinated", coordinated)
    seed = require_int_at_least("seed", seed, 0)
    require(seed < 2 ** 63, f"seed must be < 2**63, got {seed}")
    generator = torch.Generator().manual_seed(seed)
    if coordinated:
        return coordinated_votes(probs, generator).numpy()
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1]).numpy()


def require_finite_at_least_one(name: str, value: object) -> float:
    """Check a parameter such as TWS's gamma: a finite real >= 1.

    Args:
        name: the parameter's name, for the error message.
        value: the value given.

    Returns:
        The value as a float.

    Raises:
        ValueError: if it is not a finite real >= 1.
    """
    number = require_finite(name, value)
    require(number >= 1.0, f"{name} must be >= 1, got {number:g}")
    return number


def require_vote_threshold(value: object) -> int:
    """Check a vote threshold T (TARGMAX_T, TWS_{T, gamma}): an integer >= 1 (2.0 is taken as 2).

    Args:
        value: the threshold given.

    Returns:
        T as an int.

    Raises:
        ValueError: if it is not an integer >= 1.
    """
    return require_int_at_least("threshold", value, 1)


class _ThresholdPrivateOnly(Mechanism):
    """Aggregators with no DP guarantee: +inf at every order ("no guarantee")."""

    relation = NeighbouringRelation.REPLACE_ONE

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.full_like(orders, np.inf)


@dataclass(frozen=True)
class Targmax(_ThresholdPrivateOnly):
    """TARGMAX_T: the plurality token if its count is >= T, else fail (None -> public fallback)."""

    threshold: int

    def __post_init__(self) -> None:
        set_validated(self, threshold=require_vote_threshold(self.threshold))

    def aggregate(self, counts: npt.ArrayLike) -> int | None:
        """TARGMAX_T on one histogram.

        Args:
            counts: (V,) the vote histogram (V >= 2, finite non-negative integer counts).

        Returns:
            The plurality token (the lowest index of equals) if it has >= T votes, else None (fail).

        Raises:
            ValueError: if `counts` is not a valid histogram.
        """
        counts = validated_counts(counts)
        top = int(np.argmax(counts))
        return top if counts[top] >= self.threshold else None


@dataclass(frozen=True)
class ThresholdWeightedSampler(_ThresholdPrivateOnly):
    """TWS_{T, gamma}: sample among tokens with c_j >= T with probability c_j / max(n/gamma, S),
    S = sum of those counts; fail with the remaining mass. Never outputs a token with c_j < T, and
    never gives a token more than gamma times its vote share c_j / n (gamma >= 1: the Hot PATE
    correlation condition of (tau, beta, gamma)-diversity preservation)."""

    threshold: int
    gamma: float

    def __post_init__(self) -> None:
        set_validated(self, threshold=require_vote_threshold(self.threshold),
                      gamma=require_finite_at_least_one("gamma", self.gamma))

    def probabilities(self, counts: npt.ArrayLike) -> NDArray[np.float64]:
        """Per-token output probabilities (the failure probability is 1 minus their sum).

        Args:
            counts: (V,) the vote histogram.

        Returns:
            (V,) c_j / max(n / gamma, S) for the tokens with c_j >= T, 0 for the others.

        Raises:
            ValueError: if `counts` is not a valid histogram.
        """
        counts = validated_counts(counts)
        passing = np.where(counts >= self.threshold, counts, 0.0)
        normaliser = max(counts.sum() / self.gamma, passing.sum())
        return passing / normaliser if normaliser > 0 else passing

    def aggregate(self, counts: npt.ArrayLike, rng: np.random.Generator) -> int | None:
        """TWS_{T, gamma} on one histogram.

        Args:
            counts: (V,) the vote histogram.
            rng: the numpy generator of the one uniform draw.

        Returns:
            The sampled token, or None (fail).

        Raises:
            ValueError: if `counts` is not a valid histogram or `rng` is not a numpy Generator.
        """
        probs = self.probabilities(counts)
        require_generator(rng)
        draw = rng.random()
        cumulative = np.cumsum(probs)
        index = int(np.searchsorted(cumulative, draw, side="right"))
        return index if index < probs.size else None


@dataclass(frozen=True)
class DPWeightedSampler(Mechanism):
    """DPWS: Gaussian noisy histogram, then TWS on the noisy counts.

    Construction: add N(0, sigma^2) to every count, then run TWS_{T, gamma} on max(noisy counts, 0)
    with normaliser max(n / gamma, sum of the passing noisy counts). The second stage is
    post-processing (Mironov 2017, Proposition 9) as long as n is public, so the RDP is the Gaussian
    mechanism's at the histogram's L2 sensitivity s under the relation (Mironov 2017, Corollary 3),
    data-independent: alpha s^2 / (2 sigma^2), s = sqrt(2) when one teacher is replaced (alpha /
    sigma^2), s = 1 when one is added or removed (alpha / (2 sigma^2)).

    `voters` is the public number of teachers N used as n. Without it n is the histogram's own total,
    public only when one teacher is replaced (under add/remove-one n itself moves), so the relation
    must then be replace-one.
    """

    sigma: float
    threshold: float
    gamma: float
    relation: NeighbouringRelation = NeighbouringRelation.REPLACE_ONE
    voters: int | None = None

    def __post_init__(self) -> None:
        set_validated(self, sigma=require_positive("sigma", self.sigma),
                      threshold=require_positive("threshold", self.threshold),
                      gamma=require_finite_at_least_one("gamma", self.gamma), relation=require_relation(self.relation),
                      voters=None if self.voters is None else require_int_at_least("voters", self.voters, 1))
        require(self.voters is not None or self.relation is NeighbouringRelation.REPLACE_ONE,
                f"DPWS is analysed for replace-one neighbours only, got relation {self.relation} "
                "(pass voters = the public number of teachers to cover adding or removing one)")

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return positive_floor(orders * histogram_sensitivity_squared(self.relation) / (2.0 * np.float64(self.sigma) ** 2))

    def dp_event(self) -> DpEvent:
        """GaussianDpEvent(sigma / s): RDP a s^2 / (2 sigma^2), the charge above (Mironov 2017,
        Corollary 3 at the histogram's L2 sensitivity s under the relation).

        Returns:
            dp_accounting.GaussianDpEvent(sigma / s).
        """
        import dp_accounting

        return dp_accounting.GaussianDpEvent(self.sigma / math.sqrt(histogram_sensitivity_squared(self.relation)))

    def output_law_bounds(self, counts: npt.ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Certified (lower, upper) bounds on DPWS's output law on one histogram: arrays (V + 1,),
        entry 0 the failure, entry 1 + j the release of token j (an audit composes lower bounds of one
        law against upper bounds of another into a lower bound on epsilon(delta): the composed
        hockey-stick grows with the first law's masses and falls with the second's).

        With a = n / gamma, g_j = (c_j + Z_j) 1{c_j + Z_j >= T} (T > 0) and S = sum_j g_j, the release
        probability is P_j = E[g_j / max(a, S)] (the construction above). Then
          P_j <= E[g_j] / a,                                   as max(a, S) >= a;
          P_j >= (E[g_j] - sqrt(E[g_j^2] Pr[S > a])) / a,       as g_j / max(a, S) >= g_j 1{S <= a} / a
                                                                and Cauchy-Schwarz on E[g_j 1{S > a}];
          P_j >= E[g_j] / a - (E[g_j^2] + E[g_j] E[(S - a)_+]) / a^2, as 1/y >= 1/a - (y - a)/a^2 for
                                                                y >= a and (S - a)_+ <= g_j + (S_-j - a)_+;
        with u_j = (T - c_j) / sigma, phi and Q the standard normal density and upper tail:
          E[g_j] = c_j Q(u_j) + sigma phi(u_j),  E[g_j^2] = (c_j^2 + sigma^2) Q(u_j) + sigma (c_j + T) phi(u_j),
        and Pr[S > a] <= min_t exp(-t a) prod_j E[exp(t g_j)] (Chernoff; the g_j are independent),
        E[(S - a)_+] = int_a^inf Pr[S > s] ds <= min_t exp(-t a) prod_j E[exp(t g_j)] / t, with
          E[exp(t g_j)] = Phi(u_j) + exp(t c_j + t^2 sigma^2 / 2) Q(u_j - t sigma).
        The failure's bounds are 1 minus the releases' sums. Each value carries a 1e-10 relative
        allowance for its floating-point evaluation (libm and scipy's log_ndtr err by a few ulps).

        Args:
            counts: (V,) the vote histogram.

        Returns:
            (lower, upper), each (V + 1,) probabilities, entry 0 the failure.

        Raises:
            ValueError: if `counts` is not a valid histogram.
        """
        counts = validated_counts(counts)
        n = float(counts.sum()) if self.voters is None else float(self.voters)
        a = n / self.gamma
        sigma, threshold = float(self.sigma), float(self.threshold)
        u = (threshold - counts) / sigma
        tail, density = ndtr(-u), np.exp(-0.5 * u * u) / np.sqrt(2.0 * np.pi)
        first = np.maximum(counts * tail + sigma * density, 0.0)
        second = np.maximum((counts ** 2 + sigma ** 2) * tail + sigma * (counts + threshold) * density, 0.0)
        log_tail, log_excess = np.inf, np.inf
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for t in np.geomspace(1e-3, 50.0, 60) / sigma:
                terms = np.logaddexp(log_ndtr(u), t * counts + 0.5 * (t * sigma) ** 2 + log_ndtr(t * sigma - u))
                bound = -t * a + float(np.sum(terms))
                if np.isfinite(bound):
                    log_tail, log_excess = min(log_tail, bound), min(log_excess, bound - np.log(t))
        exceed = min(1.0, float(np.exp(log_tail)) * (1.0 + 1e-10)) if a > 0 else 1.0
        excess = float(np.exp(log_excess)) * (1.0 + 1e-10)   # E[(S - a)_+] = int_a^inf Pr[S > s] ds
        slack = 1e-10
        if a > 0:
            upper = np.minimum(first / a * (1.0 + slack), 1.0)
            # 1 / max(a, S) >= 1/a - (S - a)_+ / a^2 (the tangent of the convex 1/y at a), and
            # (S - a)_+ <= g_j + (S_-j - a)_+ with S_-j independent of g_j and below S
            # (a token that never passes adds nothing: 0 * inf would be NaN)
            tangent = first / a - (second + np.where(first > 0, first * excess, 0.0)) / a ** 2
            lower = np.maximum(np.maximum(first - np.sqrt(second * exceed), 0.0) / a, tangent) * (1.0 - slack)
            lower = np.maximum(lower, 0.0)
        else:
            upper, lower = np.ones_like(first), np.zeros_like(first)
        fail_low = max(0.0, 1.0 - float(np.sum(upper)) * (1.0 + slack))
        fail_high = min(1.0, 1.0 - float(np.sum(lower)) * (1.0 - slack))
        return np.concatenate([[fail_low], lower]), np.concatenate([[fail_high], upper])

    def probabilities_given_noise(self, counts: npt.ArrayLike, noise: npt.ArrayLike) -> NDArray[np.float64]:
        """Output probabilities of each token given the Gaussian draws `noise` (the rest is fail).

        Args:
            counts: (V,) the vote histogram.
            noise: (V,) the Gaussian draws added to the counts.

        Returns:
            (V,) each token's probability of release.

        Raises:
            ValueError: if `counts` is not a valid histogram.
        """
        counts = validated_counts(counts)
        noisy = np.maximum(counts + np.asarray(noise, dtype=np.float64), 0.0)
        passing = np.where(noisy >= self.threshold, noisy, 0.0)
        total = counts.sum() if self.voters is None else float(self.voters)
        normaliser = max(total / self.gamma, passing.sum())
        return passing / normaliser if normaliser > 0 else passing

    def aggregate(self, counts: npt.ArrayLike, rng: np.random.Generator) -> int | None:
        """DPWS on one histogram.

        Args:
            counts: (V,) the vote histogram.
            rng: the numpy generator of the Gaussian noise and the sampling draw.

        Returns:
            The sampled token, or None (fail).

        Raises:
            ValueError: if `counts` is not a valid histogram or `rng` is not a numpy Generator.
        """
        values = validated_counts(counts)
        require_generator(rng)
        probs = self.probabilities_given_noise(values, rng.normal(0.0, self.sigma, size=values.shape))
        index = int(np.searchsorted(np.cumsum(probs), rng.random(), side="right"))
        return index if index < values.size else None


DPWS_SAMPLES = 4000
"""The fewest Gaussian draws per step for DPWS's Monte Carlo law bounds (common to the step's histograms)."""
DPWS_WORK = 2 ** 25
"""Noisy counts drawn per step: small vocabularies get more draws (up to DPWS_MAX_SAMPLES), since the
empirical Bernstein width shrinks as 1/sqrt(draws) and a one-vote change moves DPWS's law by a few percent."""
DPWS_MAX_SAMPLES = 100_000


def dpws_draws(histograms: int, vocab: int) -> int:
    """Gaussian draws a step for `histograms` laws over `vocab` tokens: DPWS_WORK noisy counts, within
    [DPWS_SAMPLES, DPWS_MAX_SAMPLES].

    Args:
        histograms: the number H of laws.
        vocab: the number V of tokens.

    Returns:
        The number of draws.
    """
    return int(np.clip(DPWS_WORK // max(1, histograms * vocab), DPWS_SAMPLES, DPWS_MAX_SAMPLES))


def _bernstein(total: NDArray[np.float64], squares: NDArray[np.float64], samples: int,
               eta: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(lower, upper) bounds on E[X] for X in [0, 1] from `samples` draws' sum and sum of squares,
    each holding with probability >= 1 - eta (empirical Bernstein: Maurer & Pontil 2009, Theorem 4)."""
    mean = total / samples
    variance = np.maximum(squares - total * mean, 0.0) / (samples - 1)
    log_term = math.log(2.0 / eta)
    width = np.sqrt(2.0 * variance * log_term / samples) + 7.0 * log_term / (3.0 * (samples - 1))
    return np.clip(mean - width, 0.0, 1.0), np.clip(mean + width, 0.0, 1.0)


def dpws_law_bounds(sampler: DPWeightedSampler, histograms: npt.ArrayLike, generator: torch.Generator, samples: int,
                    eta: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(lower, upper) bounds (H, V + 1) on DPWS's released law (entry 0 the failure) on each of the
    histograms (H, V): the certified analytic bounds (DPWeightedSampler.output_law_bounds) tightened
    by Monte Carlo, each Monte Carlo bound holding with probability >= 1 - eta (empirical Bernstein on
    the per-draw law, whose entries lie in [0, 1]).

    A draw is sampled without drawing every token's noise. Tokens with equal counts c are exchangeable,
    and only the passing ones (c + Z >= T) enter the law, so for each group of m tokens at count c a draw
    takes the number that pass, K ~ Binomial(m, Q(u)) with u = (T - c) / sigma, and their noisy counts
    c + sigma Z with Z drawn from the normal truncated to [u, inf) by inversion,
    Z = Q^-1(U Q(u)) for U uniform on (0, 1]: the same joint law of the group's passing sum as drawing
    all m noises, at a cost of the expected number of passing tokens (about V Q(T / sigma) for a
    histogram mostly of zeros) instead of V normals. A group's release probability is each draw's
    average over its tokens (still in [0, 1] and unbiased).

    Args:
        sampler: the DPWS mechanism.
        histograms: (H, V) vote histograms.
        generator: the torch generator that seeds the draws.
        samples: the number of draws per histogram, >= 2.
        eta: each Monte Carlo bound's failure probability, in (0, 1).

    Returns:
        (lower, upper), each (H, V + 1) probabilities, column 0 the failure.
    """
    histograms = np.asarray(histograms, dtype=np.float64)
    count, vocab = histograms.shape
    analytic = [sampler.output_law_bounds(h) for h in histograms]
    low, high = np.stack([a[0] for a in analytic]), np.stack([a[1] for a in analytic])
    rng = np.random.default_rng(int(torch.randint(0, 2 ** 62, (1,), generator=generator)))
    n = float(histograms[0].sum()) if sampler.voters is None else float(sampler.voters)
    floor, sigma, threshold = n / sampler.gamma, float(sampler.sigma), float(sampler.threshold)
    mc_low, mc_high = np.empty((count, vocab + 1)), np.empty((count, vocab + 1))
    for index in range(count):
        levels, group, sizes = np.unique(histograms[index], return_inverse=True, return_counts=True)
        start_at = (threshold - levels) / sigma                   # u: a token passes iff Z >= u (T > 0)
        log_pass = log_ndtr(-start_at)                            # log Q(u)
        pass_probability = np.exp(log_pass)
        groups = levels.size
        expected = float(np.sum(sizes * pass_probability))
        chunk = int(np.clip(2 ** 20 // max(1.0, expected + groups), 1, samples))
        total, squares = np.zeros(groups + 1), np.zeros(groups + 1)
        for first in range(0, samples, chunk):
            draws = min(chunk, samples - first)
            passing = rng.binomial(sizes, pass_probability, size=(draws, groups))      # (S, groups)
            cells = np.repeat(np.arange(draws * groups), passing.reshape(-1))
            member = cells % groups
            with np.errstate(divide="ignore"):
                # U = 1 gives Z = u exactly; ndtri_exp(0) = inf would not
                z = np.maximum(-ndtri_exp(np.log1p(-rng.random(cells.size)) + log_pass[member]), start_at[member])
            sums = np.bincount(cells, weights=levels[member] + sigma * z, minlength=draws * groups)
            sums = sums.reshape(draws, groups)
            passed = sums.sum(axis=1)
            normaliser = np.maximum(floor, passed)
            scale = np.where(normaliser > 0, 1.0 / np.where(normaliser > 0, normaliser, 1.0), 0.0)
            values = np.empty((draws, groups + 1))
            values[:, 0] = np.clip(1.0 - passed * scale, 0.0, 1.0)
            values[:, 1:] = np.clip(sums * scale[:, None] / sizes, 0.0, 1.0)
            total += values.sum(axis=0)
            squares += (values * values).sum(axis=0)
        group_low, group_high = _bernstein(total, squares, samples, eta)
        columns = np.concatenate([[0], 1 + group])
        mc_low[index], mc_high[index] = group_low[columns], group_high[columns]
    # a sum of draws carries rounding: 1e-12 relative covers it many times over
    return np.maximum(low, mc_low * (1 - 1e-12)), np.minimum(high, mc_high * (1 + 1e-12) + 1e-300)
