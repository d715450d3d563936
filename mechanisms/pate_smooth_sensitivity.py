"""Publishing a data-dependent Confident-GNMax epsilon with smooth sensitivity (Papernot et al. 2018,
"Scalable Private Learning with PATE", Section 4 and Appendix C).

A data-dependent RDP total (Theorem 6 for the answers, the threshold check's exact divergence for the
screens) depends on the private votes, so it is not a DP epsilon and publishing it leaks. The release
adds Gaussian noise scaled by a beta-smooth upper bound SS on its local sensitivity (Nissim,
Raskhodnikova & Smith 2007, Definition 2.1) and pays for that with Papernot et al. 2018's Theorem 23
(the GNSS mechanism): F(D) + SS_beta(D) N(0, sigma_ss^2) is (lambda, eps_ss)-RDP with
  eps_ss = lambda e^{2 beta} / sigma_ss^2 + (beta lambda - log(1 - 2 lambda beta) / 2) / (lambda - 1),
for 1 < lambda < 1 / (2 beta).

The released statistic F is the per-step data-dependent RDP at one order lambda, summed over the
steps (every step charges its answer: released-output accounting). Its answer term reads Theorem 6
through a non-decreasing step function of log q~: the smallest Theorem 6 value over the points of a
fixed grid at or above log q~ (each is a valid q~ bound, so the value still bounds the divergence,
Papernot et al. 2018, Theorem 6). Monotone by construction, its extremes over a set of histograms are
its values at the extremes of q~, with no appeal to the paper's Condition C5.

Local sensitivity at distance d (Papernot et al. 2018, Appendix B; Nissim et al. 2007, Section 3):
within r teacher changes of D every plurality gap moves by at most s r (s = 2 replace-one, 1 add or
remove) and the largest count by at most r, whichever token leads. So q~ stays within
[sum_j Q(gap_j + s r), sum_j Q(gap_j - s r)] (Proposition 7's terms: a leader other than j* only
lowers the union bound, and the new leader's gaps are dominated by the old ones shifted by s r), and
the screen's largest count within [m - r, m + r]. The local sensitivity of every histogram within
distance d is at most the spread of F over distance d + 1, which for a neighbour D' of D is at most
the spread at D over distance d + 2: SS_beta(D) = max_d e^{-beta d} spread_{d+1}(D) is beta-smooth.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray
from scipy.special import log_ndtr, logsumexp

from dpledger.accounting.errors import require, require_bool, require_in_open, require_order, require_positive
from dpledger.mechanisms.pate import (ConfidentGNMax, GNMax, data_dependent_gnmax_rdp, data_dependent_screen_rdp,
                                      gap_shift, require_generator,
                                      validated_counts)

LOG_Q_GRID = -np.geomspace(1e7, 1e-8, 8001)
"""Fixed points of log q~ (ascending, plus 0) at which the released statistic reads Theorem 6: a
relative spacing of 0.43% in log(1/q~), public and independent of the data."""

MOST_RADII = 10 ** 6
"""The distances at which the smooth sensitivity's maximum is evaluated one by one; beyond them (a beta
so small that e^{-beta d} barely falls) every spread is bounded by the largest possible, the curve caps."""

RELEASE_LABEL = ("data-dependent epsilon released with smooth sensitivity (Papernot et al. 2018, Section 4): a "
                 "noisy estimate of this run's data-dependent bound, published at the stated release cost; not a "
                 "data-independent DP guarantee of the run")


def gnss_rdp(order: float, beta: float, sigma_ss: float) -> float:
    """RDP at `order` of releasing F(D) + SS_beta(D) N(0, sigma_ss^2), SS_beta a beta-smooth upper bound
    on F's local sensitivity (Papernot et al. 2018, Theorem 23, the GNSS mechanism).

    Args:
        order: the Renyi order lambda, > 1 and < 1 / (2 beta).
        beta: the smoothness parameter, > 0.
        sigma_ss: the noise's standard deviation in units of SS_beta, > 0.

    Returns:
        lambda e^{2 beta} / sigma_ss^2 + (beta lambda - log(1 - 2 lambda beta) / 2) / (lambda - 1).

    Raises:
        ValueError: if a parameter is out of range.
    """
    order = require_order("order", order)
    beta = require_positive("beta", beta)
    sigma_ss = require_positive("sigma_ss", sigma_ss)
    require(order < 1.0 / (2.0 * beta), f"order must be < 1 / (2 beta) = {1.0 / (2.0 * beta):g} "
                                        f"(Papernot et al. 2018, Theorem 23), got {order:g}")
    return (order * math.exp(2.0 * beta) / sigma_ss ** 2
            + (beta * order - 0.5 * math.log1p(-2.0 * order * beta)) / (order - 1.0))


@dataclass(frozen=True)
class _MonotoneTheorem6:
    """Theorem 6 at one order read through the non-decreasing step function of log q~ on LOG_Q_GRID."""

    rdp_sigma: float
    order: float
    suffix_minimum: NDArray[np.float64] = field(repr=False)

    @classmethod
    @functools.lru_cache(maxsize=32)
    def build(cls, rdp_sigma: float, order: float) -> "_MonotoneTheorem6":
        grid = np.append(LOG_Q_GRID, 0.0)
        orders = np.array([order])
        values = np.array([data_dependent_gnmax_rdp(float(log_q), rdp_sigma, orders)[0] for log_q in grid])
        return cls(rdp_sigma, order, np.minimum.accumulate(values[::-1])[::-1])

    def __call__(self, log_q: NDArray[np.float64]) -> NDArray[np.float64]:
        """The smallest Theorem 6 value at the grid points >= log_q (log_q <= 0, any shape)."""
        index = np.searchsorted(np.append(LOG_Q_GRID, 0.0), log_q, side="left")
        result: NDArray[np.float64] = self.suffix_minimum[index]
        return result


def _gap_table(histograms: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Each step's plurality gaps c_{j*} - c_j (j != j*) as distinct values and log multiplicities,
    padded to one width with log multiplicity -inf: (L, U) each."""
    rows = []
    for counts in histograms:
        top = int(np.argmax(counts))
        values, multiplicity = np.unique(counts[top] - np.delete(counts, top), return_counts=True)
        rows.append((values, np.log(multiplicity)))
    width = max(len(values) for values, _ in rows)
    gaps = np.zeros((len(rows), width))
    log_weights = np.full((len(rows), width), -np.inf)
    for index, (values, weights) in enumerate(rows):
        gaps[index, :len(values)], log_weights[index, :len(values)] = values, weights
    return gaps, log_weights


def _log_union(gaps: NDArray[np.float64], log_weights: NDArray[np.float64], shift: float,
               sigma: float) -> NDArray[np.float64]:
    """log sum_j Pr[N(0, 2 sigma^2) >= gap_j + shift] per step (Proposition 7's union bound)."""
    result: NDArray[np.float64] = logsumexp(log_ndtr(-(gaps + shift) / (math.sqrt(2.0) * sigma)) + log_weights,
                                            axis=1)
    return result


@dataclass(frozen=True)
class SmoothSensitivity:
    """The released statistic and its beta-smooth sensitivity bound, both private (never publish them)."""

    statistic: float                        # F(D): the data-dependent RDP at `order`, summed over the steps
    charged: float                          # the same total as the ledger charges it (Theorem 6 at q~ itself)
    smooth_sensitivity: float               # SS_beta(D)
    local_sensitivity: NDArray[np.float64] = field(repr=False)  # the bound at distance d = 0, 1, ... (evaluated)


def smooth_sensitivity(histograms: npt.ArrayLike, mechanism: ConfidentGNMax, order: float, beta: float, *,
                       data_dependent_screen: bool = True, data_dependent_answer: bool = True) -> SmoothSensitivity:
    """The per-step data-dependent RDP of Confident-GNMax at `order`, summed over the steps, and a
    beta-smooth upper bound on its local sensitivity (module docstring; Papernot et al. 2018, Section 4
    and Appendix B). The relation is the mechanism's (GNMax.data_dependent_rdp's neighbours and RDP).

    Args:
        histograms: (L, V) vote counts, one row per step; every step's answer is charged.
        mechanism: the Confident-GNMax (threshold T, s1, s2, relation) that ran.
        order: the Renyi order lambda, > 1.
        beta: the smoothness parameter, > 0.
        data_dependent_screen: charge the screen its data-dependent divergence (else a / (2 s1^2)).
        data_dependent_answer: charge the answer Theorem 6 (else GNMax's data-independent RDP).

    Returns:
        The SmoothSensitivity (private values).

    Raises:
        ValueError: if the histograms are not (L, V) valid counts with L >= 1, or a parameter is out of range.
    """
    counts = np.asarray(histograms)
    require(counts.ndim == 2 and counts.shape[0] >= 1, f"histograms must be (steps, V) with >= 1 step, got shape "
                                                       f"{counts.shape}")
    counts = np.stack([validated_counts(row) for row in counts])
    require(isinstance(mechanism, ConfidentGNMax), f"mechanism must be a ConfidentGNMax, got {mechanism!r}")
    order = require_order("order", order)
    beta = require_positive("beta", beta)
    screen_dd = require_bool("data_dependent_screen", data_dependent_screen)
    answer_dd = require_bool("data_dependent_answer", data_dependent_answer)
    grid = np.array([order])
    gnmax = GNMax(mechanism.sigma, mechanism.relation)
    answer_cap = float(gnmax.rdp_values(grid)[0])
    screen_cap = float(mechanism.screen_rdp(grid)[0])
    steps, vocabulary = counts.shape
    shift = gap_shift(mechanism.relation)

    tops = counts.max(axis=1)
    screen_cache: dict[float, float] = {}

    def screen(top: float) -> float:
        if top not in screen_cache:
            screen_cache[top] = float(data_dependent_screen_rdp(top, mechanism.threshold, mechanism.sigma_threshold,
                                                                grid)[0])
        return screen_cache[top]

    if answer_dd:
        theorem_6 = _MonotoneTheorem6.build(gnmax.theorem_6_sigma, order)
        gaps, log_weights = _gap_table(counts)
        cap = math.log1p(-1.0 / vocabulary)

        def answer(radius: int, high: bool) -> NDArray[np.float64]:
            """Largest (high) or smallest F answer term within `radius` changes, per step."""
            moved = -shift * radius if high else shift * radius
            log_q = np.minimum(_log_union(gaps, log_weights, moved, mechanism.sigma), cap)
            log_q_neighbours = np.minimum(_log_union(gaps, log_weights, moved - shift, mechanism.sigma), 0.0)
            return np.minimum(answer_cap, np.maximum(theorem_6(log_q), theorem_6(log_q_neighbours)))

        answer_terms = answer(0, True)
        charged_answer = sum(float(gnmax.data_dependent_rdp(row, grid)[0]) for row in counts)
    else:
        answer_terms = np.full(steps, answer_cap)
        charged_answer = answer_cap * steps
    screen_terms = np.array([screen(float(top)) for top in tops]) if screen_dd else np.full(steps, screen_cap)
    statistic = float(answer_terms.sum() + screen_terms.sum())

    bound = steps * ((answer_cap if answer_dd else 0.0) + (screen_cap if screen_dd else 0.0))
    spreads: list[float] = []
    best = 0.0
    high_screen = screen_terms.copy()
    low_screen = screen_terms.copy()
    radius = 0
    while True:
        radius += 1  # the spread over distance d + 1 bounds the local sensitivity at distance d = radius - 1
        spread = 0.0
        if screen_dd:
            for index, top in enumerate(tops):  # the window [m - r, m + r] grew by one count on each side
                for reached in (top - radius, top + radius):
                    if reached >= 0:
                        value = screen(float(reached))
                        high_screen[index] = max(high_screen[index], value)
                        low_screen[index] = min(low_screen[index], value)
            spread += float(np.sum(high_screen - low_screen))
        if answer_dd:
            spread += float(np.sum(answer(radius, True) - answer(radius, False)))
        spreads.append(spread)
        best = max(best, math.exp(-beta * (radius - 1)) * spread)
        if math.exp(-beta * radius) * bound <= best:
            break
        if radius >= MOST_RADII:  # distances d >= radius add at most e^{-beta d} bound: charge that, never drop it
            best = math.exp(-beta * radius) * bound
            break
    return SmoothSensitivity(statistic, charged_answer + float(screen_terms.sum()),
                             best * (1.0 + 1e-9), np.asarray(spreads))


@dataclass(frozen=True)
class SmoothSensitivityRelease:
    """A data-dependent epsilon published with smooth sensitivity. Only `published` may be released."""

    published: dict[str, Any]   # noisy RDP, its release cost, epsilon at delta, the parameters and the label
    private: SmoothSensitivity  # the exact statistic and SS: never publish


def smooth_sensitivity_release(histograms: npt.ArrayLike, mechanism: ConfidentGNMax, order: float, *,
                               beta: float, sigma_ss: float, delta: float, rng: np.random.Generator,
                               data_dependent_screen: bool = True,
                               data_dependent_answer: bool = True) -> SmoothSensitivityRelease:
    """Publish the run's data-dependent epsilon at `order` (Papernot et al. 2018, Section 4 and Appendix C).

    The released RDP is max(0, F(D) + SS_beta(D) Z), Z ~ N(0, sigma_ss^2) (`smooth_sensitivity`); releasing it
    costs gnss_rdp(order, beta, sigma_ss) at `order` (Theorem 23), which composes with the run's own
    data-dependent RDP (Mironov 2017, Proposition 1). The published epsilon is
    released RDP + release cost + log(1 / delta) / (order - 1) (Mironov 2017, Proposition 3), labelled
    data-dependent: a noisy estimate of this run's bound, not a data-independent guarantee. beta and
    sigma_ss must be chosen without looking at the data (choosing them from SS leaks).

    Args:
        histograms: (L, V) vote counts, one row per step.
        mechanism: the Confident-GNMax that ran.
        order: the Renyi order lambda, > 1 and < 1 / (2 beta).
        beta: the smoothness parameter, > 0 (Papernot et al. 2018 use 0.3 / lambda to 0.5 / lambda).
        sigma_ss: the release noise in units of SS_beta, > 0.
        delta: the delta of the published epsilon, in (0, 1).
        rng: the numpy generator of the release noise (secret, like every DP noise).
        data_dependent_screen: whether the screen's charge is data-dependent.
        data_dependent_answer: whether the answer's charge is data-dependent.

    Returns:
        The SmoothSensitivityRelease: `published` (what may be released) and `private`.

    Raises:
        ValueError: if a parameter is out of range or the histograms are invalid.
    """
    release_cost = gnss_rdp(order, beta, sigma_ss)
    delta = require_in_open("delta", delta, 0.0, 1.0)
    require_generator(rng)
    private = smooth_sensitivity(histograms, mechanism, order, beta, data_dependent_screen=data_dependent_screen,
                                 data_dependent_answer=data_dependent_answer)
    statistic, sensitivity = float(private.statistic), float(private.smooth_sensitivity)
    require(not (math.isnan(statistic) or math.isnan(sensitivity)),
            f"the data-dependent RDP and its smooth sensitivity must not be NaN, got {statistic} and {sensitivity}")
    if math.isinf(statistic) or math.isinf(sensitivity):
        noisy = math.inf   # noise of unbounded scale bounds nothing: +inf, "no guarantee", never clipped to 0
    else:
        # an RDP is >= 0: clipping the noisy value there is post-processing (Mironov 2017, Proposition 9)
        noisy = max(0.0, statistic + sensitivity * float(rng.normal(0.0, sigma_ss)))
    published = {"data_dependent": True, "label": RELEASE_LABEL, "order": float(order), "beta": float(beta),
                 "sigma_ss": float(sigma_ss), "delta": float(delta), "relation": mechanism.relation.value,
                 "steps": int(np.asarray(histograms).shape[0]), "released_rdp": noisy,
                 "release_rdp_cost": release_cost, "total_rdp": noisy + release_cost,
                 "epsilon": noisy + release_cost + math.log(1.0 / delta) / (order - 1.0),
                 "charged": {"screen": "data-dependent" if data_dependent_screen else "data-independent",
                             "answer": "data-dependent" if data_dependent_answer else "data-independent"}}
    return SmoothSensitivityRelease(published, private)
