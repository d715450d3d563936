"""Certified lower bounds on epsilon(delta) from exact output laws: privacy loss distributions.

A pair of neighbouring inputs to a mechanism run T times, each time with its own randomness on a
fixed query (teacher-forced decoding), releases outputs whose joint laws are products P = prod_t
P_t and Q = prod_t Q_t. The pair's privacy profile is the hockey-stick divergence

    delta(eps) = sup_S P(S) - e^eps Q(S) = E_P[(1 - e^(eps - L))_+],  L = sum_t log(P_t / Q_t),

the expectation of a non-decreasing function of the privacy loss L (Balle, Barthe & Gaboardi 2018,
Theorem 1; Sommer, Meiser & Mohammadi 2019). The pair's epsilon(delta) = inf {eps : delta(eps) <=
delta} is a lower bound on the epsilon(delta) of the mechanism, which must cover every pair: an
auditor who finds a pair above a claim has refuted it.

`LossDistribution` holds L (for one ordered pair: P first) as masses on a grid of width `interval`,
built so that the profile it gives never exceeds the exact one:
- every loss is rounded DOWN to the grid, after a downward allowance for the floating-point error
  of the laws it comes from (the integrand (1 - e^(eps - L))_+ is non-decreasing in L: this is
  dp-accounting's optimistic discretisation, Doroshenko et al. 2022);
- each probability is lowered by a relative allowance for its own rounding;
- masses below `truncation` at either end are dropped (dropping mass only lowers the profile);
- composition is convolution (independent steps add their losses), and every convolution's
  floating-point error is bounded and subtracted from the profile at the end.
Losses of +inf (P puts mass where Q has none) are kept exactly: an outcome impossible under Q
counts fully towards delta at every epsilon.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import numpy.typing as npt
from scipy.signal import fftconvolve

from dpledger.accounting.errors import require, require_in_open, require_positive

LAW_RELATIVE_ERROR = 1e-12
"""Relative error allowed in each probability of a law given here (float64 laws formed from
logits and mixtures carry errors of a few ulps, ~1e-15): masses are lowered by this factor, and
each log-probability may be off by as much, so losses are lowered by 2 * LAW_RELATIVE_ERROR plus
LOSS_ABSOLUTE_ERROR times the magnitudes of the two logs."""
LOSS_ABSOLUTE_ERROR = 1e-12
MAX_CELLS = 2 ** 15
"""A composed distribution wider than this many cells is coarsened (its interval doubled, losses
rounded down again) before it grows further: memory and time stay bounded whatever the run length,
at the price of a larger rounding, which `rounding` accounts for."""
TRUNCATION = 1e-30
"""Mass below which the ends of a loss distribution are dropped (a lower bound stays one)."""
_UNIT_ROUNDOFF = 2.0 ** -52
"""Twice float64's unit roundoff: a bound on the relative error of each product and each addition
in a sum of non-negative terms (n terms: at most n of these relative to the sum)."""
_FFT_ERROR = 1e-14
"""Bound, relative to the product of the two inputs' total masses, on the summed absolute error of
one FFT convolution's entries (float64 FFTs err by ~u log2(n) per entry, n <= 2^30)."""
_FFT_FLOOR = 1e-15
"""Entries of an FFT convolution below this, relative to the product of the inputs' total masses,
are set to 0: they are within the FFT's rounding of 0, and left as they are they would keep the
tails (thousands of cells of rounding noise) from being trimmed. Dropping them lowers the profile."""


@dataclass(frozen=True)
class LossDistribution:
    """The privacy loss of an ordered pair of laws, discretised so that `delta` is a lower bound.

    Attributes:
      interval: grid width; entry k of `mass` is the mass of losses in [(offset + k) interval, ...).
      offset: the grid index of `mass[0]`.
      mass: probability (under the first law) of each grid cell, rounded down; float64 >= 0.
      infinite: probability of an outcome the second law cannot produce (loss +inf), a lower bound.
      error: bound on the summed absolute floating-point error of `mass`.
      steps: how many independent steps were composed into it.
      rounding: bound on how far the grid has lowered any composed loss (each step's rounding, plus
        each coarsening's): what the lower bound may lose to the discretisation.
    """

    interval: float
    offset: int
    mass: npt.NDArray[np.float64]
    infinite: float = 0.0
    error: float = 0.0
    steps: int = 1
    rounding: float = 0.0

    @classmethod
    def from_log_laws(cls, log_p: npt.ArrayLike, log_q: npt.ArrayLike, interval: float,
                      truncation: float = TRUNCATION) -> "LossDistribution":
        """The loss of one step whose outcome has log-probabilities `log_p` under the first law and
        `log_q` under the second (same outcomes; -inf for probability 0). ValueError for NaN.

        Args:
            log_p: natural-log probabilities of the outcomes under the first law P, each <= 0
                (flattened to 1-D).
            log_q: the same outcomes' log-probabilities under the second law Q, same size.
            interval: the grid width in nats, finite and > 0.
            truncation: mass below which the ends of the distribution are dropped.

        Returns:
            The one-step loss distribution: losses log(P/Q), lowered by their floating-point
            allowance and rounded down to the grid; masses lowered by LAW_RELATIVE_ERROR; the mass
            of outcomes Q cannot produce as `infinite`.

        Raises:
            ValueError: interval not a finite number > 0, laws of different sizes, a NaN, or a
                log-probability above 0.
        """
        interval = require_positive("interval", interval)
        all_p = np.asarray(log_p, dtype=np.float64).reshape(-1)
        all_q = np.asarray(log_q, dtype=np.float64).reshape(-1)
        require(all_p.shape == all_q.shape, f"the two laws must have the same outcomes, got {all_p.shape} and "
                                            f"{all_q.shape}")
        require(not (np.isnan(all_p).any() or np.isnan(all_q).any()), "a law holds NaN")
        require(not ((all_p > 0).any() or (all_q > 0).any()), "a log-probability is above 0")
        possible = all_p > -np.inf
        impossible = possible & (all_q == -np.inf)
        lower = 1.0 - LAW_RELATIVE_ERROR
        infinite = float(np.exp(all_p[impossible]).sum() * lower) if impossible.any() else 0.0
        finite = possible & ~impossible
        p, q = all_p[finite], all_q[finite]
        loss = p - q
        # each log off by up to its own rounding and the laws' error: lower the loss by a bound on both
        loss = loss - (2 * LAW_RELATIVE_ERROR + LOSS_ABSOLUTE_ERROR * (np.abs(p) + np.abs(q) + 1.0))
        index = np.floor(loss / interval)
        index = np.where(index * interval > loss, index - 1, index)   # floor never rounds up, even at an edge
        masses = np.exp(p) * lower
        if index.size == 0:
            return cls(interval, 0, np.zeros(1), min(1.0, infinite), rounding=interval)
        low = int(index.min())
        mass = _binned((index - low).astype(np.int64), masses)
        # bincount adds masses: a relative rounding of the count's size, covered by the masses' allowance
        return cls(interval, low, mass, min(1.0, infinite), 0.0, rounding=interval)._trimmed(truncation)

    def coarsened(self, factor: int) -> "LossDistribution":
        """The same distribution on a grid `factor` times wider, each cell's loss rounded down to the
        new grid (a cell k goes to floor(k / factor)): still a lower bound.

        Args:
            factor: how many times wider the new grid is, an integer >= 1.

        Returns:
            A distribution with interval * factor as its grid width and that width added to `rounding`.
        """
        first = self.offset // factor
        cells = (self.offset + np.arange(self.mass.size)) // factor - first
        mass = _binned(cells, self.mass)
        return LossDistribution(self.interval * factor, first, mass, self.infinite, self.error, self.steps,
                                self.rounding + self.interval * factor)

    def _trimmed(self, truncation: float) -> "LossDistribution":
        """This distribution with the masses below `truncation` at either end dropped."""
        first = _mass_below(self.mass, truncation)
        last = self.mass.size - _mass_below(self.mass[::-1], truncation)
        if first >= last:  # everything below the truncation: nothing finite is kept
            return LossDistribution(self.interval, self.offset, np.zeros(1), self.infinite, self.error, self.steps,
                                    self.rounding)
        return LossDistribution(self.interval, self.offset + first, self.mass[first:last].copy(), self.infinite,
                                self.error, self.steps, self.rounding)

    def compose(self, other: "LossDistribution", truncation: float = TRUNCATION) -> "LossDistribution":
        """The loss of both pairs run independently: losses add, so masses convolve.

        Args:
            other: the other pair's loss distribution, on a grid of this one's width times or divided
                by a whole number (the finer is coarsened to the wider).
            truncation: mass below which the ends of the result are dropped.

        Returns:
            The composed distribution (coarsened until it has at most MAX_CELLS cells), its error
            bound covering the convolution's floating-point error.

        Raises:
            ValueError: other is not a LossDistribution, or the grids are not nested.
        """
        require(isinstance(other, LossDistribution), f"only a LossDistribution composes, got {type(other).__name__}")
        if other.interval != self.interval:  # grids of one base interval times powers of 2: coarsen the finer
            finer, coarser = (self, other) if self.interval < other.interval else (other, self)
            factor = coarser.interval / finer.interval
            require(factor == round(factor), "only loss distributions on nested grids compose")
            return finer.coarsened(int(round(factor))).compose(coarser, truncation)
        total_self, total_other = float(self.mass.sum()), float(other.mass.sum())
        cells_self, cells_other = np.flatnonzero(self.mass), np.flatnonzero(other.mass)
        pairs = cells_self.size * cells_other.size
        if 0 < pairs <= 4 * (self.mass.size + other.mass.size):
            # one step's law has at most |V| + 1 outcomes on a wide fine grid: add the occupied cells'
            # indices pairwise (no FFT of mostly empty arrays); each cell sums at most min(nnz) products
            index = (cells_self[:, None] + cells_other[None, :]).reshape(-1)
            products = (self.mass[cells_self][:, None] * other.mass[cells_other][None, :]).reshape(-1)
            mass = _binned(index, products, self.mass.size + other.mass.size - 1)
            error = min(cells_self.size, cells_other.size) * _UNIT_ROUNDOFF * total_self * total_other
        elif min(self.mass.size, other.mass.size) <= 64:
            mass = np.convolve(self.mass, other.mass)   # direct sums: errors within the masses' allowance
            error = 0.0
        else:
            mass = fftconvolve(self.mass, other.mass)
            error = _FFT_ERROR * total_self * total_other
            # an entry the FFT made negative holds rounding only (0 adds at most that error); one below
            # the floor is indistinguishable from rounding noise (0 drops it: a lower bound stays one)
            mass[mass < _FFT_FLOOR * total_self * total_other] = 0.0
        infinite = self.infinite + other.infinite - self.infinite * other.infinite
        composed = LossDistribution(self.interval, self.offset + other.offset, mass, infinite,
                                    self.error * total_other + other.error * total_self + self.error * other.error
                                    + error, self.steps + other.steps, self.rounding + other.rounding)._trimmed(truncation)
        while composed.mass.size > MAX_CELLS:
            composed = composed.coarsened(2)
        return composed

    @staticmethod
    def composed(parts: Sequence["LossDistribution"], truncation: float = TRUNCATION) -> "LossDistribution":
        """All of `parts` composed, pairwise in a balanced tree (sizes grow evenly: cheaper FFTs).

        Args:
            parts: the loss distributions of independent steps, on nested grids.
            truncation: mass below which the ends of each intermediate result are dropped.

        Returns:
            The distribution of the summed loss.

        Raises:
            ValueError: no parts, or parts that compose refuses.
        """
        require(len(parts) > 0, "nothing to compose")
        level = list(parts)
        while len(level) > 1:
            level = [level[i].compose(level[i + 1], truncation) if i + 1 < len(level) else level[i]
                     for i in range(0, len(level), 2)]
        return level[0]

    def delta(self, epsilon: float) -> float:
        """A lower bound on the pair's delta at `epsilon`: E[(1 - e^(eps - L))_+] over the rounded-down
        losses, plus the infinite-loss mass, minus the floating-point error bound (never below 0).

        Args:
            epsilon: the epsilon to evaluate the profile at, a real number (+-inf allowed).

        Returns:
            A lower bound on delta(epsilon), >= 0.

        Raises:
            ValueError: epsilon is NaN.
        """
        epsilon = float(epsilon)
        require(not math.isnan(epsilon), "epsilon must be a number, got nan")
        losses = (self.offset + np.arange(self.mass.size)) * self.interval
        above = losses > epsilon
        finite = float(np.sum(self.mass[above] * -np.expm1(epsilon - losses[above])))
        return max(0.0, (finite + self.infinite) * (1.0 - 1e-12) - self.error)

    def epsilon(self, delta: float) -> float:
        """A lower bound on the pair's epsilon(delta): the largest grid epsilon whose `delta` lower
        bound exceeds `delta` (then every smaller epsilon fails too), or 0 when none does. +inf when
        the infinite-loss mass alone exceeds delta.

        Args:
            delta: the target delta, in (0, 1).

        Returns:
            A lower bound on epsilon(delta), >= 0 (found by bisection to a relative width of 1e-12),
            or +inf.

        Raises:
            ValueError: delta outside (0, 1).
        """
        delta = require_in_open("delta", delta, 0.0, 1.0)
        if self.infinite * (1.0 - 1e-12) - self.error > delta:
            return math.inf
        low = 0.0
        if not self.delta(low) > delta:
            return 0.0
        high = float((self.offset + self.mass.size) * self.interval)   # delta(high) = infinite mass only
        for _ in range(200):
            middle = 0.5 * (low + high)
            if self.delta(middle) > delta:
                low = middle
            else:
                high = middle
            if high - low <= 1e-12 * max(1.0, high):
                break
        return low

    @property
    def mean(self) -> float:
        """E[L] over the finite part (for reports; the rounded-down grid's, so a lower bound)."""
        total = float(self.mass.sum())
        losses = (self.offset + np.arange(self.mass.size)) * self.interval
        return float(np.sum(self.mass * losses) / total) if total > 0 else 0.0


def _binned(cells: npt.NDArray[np.integer], weights: npt.NDArray[np.float64], minlength: int = 0
            ) -> npt.NDArray[np.float64]:
    """np.bincount(cells, weights, minlength): the summed weights per cell, float64 (numpy's stubs type
    every bincount as integer counts; with weights it returns float64, so astype copies nothing)."""
    return np.bincount(cells, weights=weights, minlength=minlength).astype(np.float64, copy=False)


def _mass_below(mass: np.ndarray, truncation: float) -> int:
    """How many leading cells of `mass` hold at most `truncation` together. Only the cells before
    the first one above `truncation` can qualify, so only those are summed."""
    above = mass > truncation
    reach = int(np.argmax(above)) if above.any() else mass.size
    return int(np.searchsorted(np.cumsum(mass[:reach]), truncation, side="right"))


class RunningComposition:
    """Loss distributions composed as they arrive (e.g. one per window of a long run), in the same
    balanced tree as `LossDistribution.composed` but holding only O(log n) of them: two of equal
    weight are merged as soon as both are there (a binary counter)."""

    def __init__(self, truncation: float = TRUNCATION) -> None:
        self.truncation = truncation
        self._stack: list[tuple[int, LossDistribution]] = []   # (weight, distribution), weights decreasing

    def add(self, distribution: LossDistribution) -> None:
        """Compose one more distribution in (merging equal-weight partial results as a binary counter).

        Args:
            distribution: the next step's (or window's) loss distribution, on a grid nested with the others'.

        Raises:
            ValueError: a distribution that LossDistribution.compose refuses.
        """
        weight = 1
        while self._stack and self._stack[-1][0] == weight:
            _, previous = self._stack.pop()
            distribution = previous.compose(distribution, self.truncation)
            weight *= 2
        self._stack.append((weight, distribution))

    def result(self) -> LossDistribution | None:
        """Everything added, composed (None when nothing was).

        Returns:
            The composed LossDistribution of every distribution added, or None.
        """
        total = None
        for _, distribution in reversed(self._stack):
            total = distribution if total is None else distribution.compose(total, self.truncation)
        return total


def pair_epsilon_lower_bound(forward: LossDistribution, backward: LossDistribution, delta: float) -> float:
    """epsilon(delta) of a neighbouring pair, both directions: a DP claim must cover the larger, so
    the larger lower bound is a lower bound on the claim's epsilon.

    Args:
        forward: the loss distribution of (M(D), M(D')).
        backward: the loss distribution of (M(D'), M(D)).
        delta: the target delta, in (0, 1).

    Returns:
        The larger of the two epsilon(delta) lower bounds (+inf possible).

    Raises:
        ValueError: delta outside (0, 1).
    """
    return max(forward.epsilon(delta), backward.epsilon(delta))
