"""Report noisy max with Laplace noise: add Laplace(b) noise to every vote count, release the argmax.

The aggregator never fails (no threshold screen): every step releases argmax_j (c_j + Z_j), the Z_j
i.i.d. Laplace with scale b (density exp(-|z| / b) / (2 b)). Its privacy, per step, under the
relation of the run:

* The histogram's L1 sensitivity Delta_1: one teacher added or removed moves one vote into or out of
  one count (Delta_1 = 1: relations add_or_remove_one, add_one, remove_one); one teacher replaced
  moves one vote from one count to another (Delta_1 = 2: replace_one). `histogram_l1_sensitivity`.
* Pure DP: the Laplace mechanism on the histogram is (Delta_1 / b)-DP (Dwork & Roth 2014, Theorem 3.6)
  and the argmax is post-processing (ibid., Proposition 2.1), so each step is (Delta_1 / b, 0)-DP;
  for one vote added or removed this is also the report-noisy-max claim (ibid., Claim 3.9: Lap(1/eps)
  on counting queries of sensitivity 1 gives eps). `pure_epsilon`.
* RDP: neighbouring histograms differ by +-1 in exactly Delta_1 coordinates, so the noisy histograms
  are products of Laplace laws that differ in Delta_1 coordinates by a shift of 1; the Renyi
  divergence of products is the sum of the coordinates' (van Erven & Harremoes 2014, Theorem 28) and
  each is the Laplace mechanism's at sensitivity 1 (Mironov 2017, Proposition 6), so
      D_a(noisy c || noisy c') = Delta_1 * f_a(1 / b),
      f_a(t) = 1/(a-1) log( a/(2a-1) e^{(a-1) t} + (a-1)/(2a-1) e^{-a t} ),
  exactly, and the released argmax is post-processing (data processing, van Erven & Harremoes 2014,
  Theorem 9): the step's RDP is at most Delta_1 f_a(1/b). It is also at most the pure-DP bound
  Delta_1 / b at every order (D_a <= D_inf); the curve is the smaller of the two, rounded up.
* The output law (`laplace_noisy_max_log_law`): Pr[argmax = j] = int f_b(x - c_j) prod_{k != j}
  F_b(x - c_k) dx with the Laplace density f_b and CDF F_b (ties have probability 0), a
  one-dimensional integral the audit evaluates on every neighbouring histogram.
* Calibration (`dpledger calibrate laplace-noisy-max`): the smallest b whose Q steps account to at
  most epsilon at delta on the RDP curve above (VoteAggregator.calibrate: RDP bisection; the ledger's
  accounting); Q * Delta_1 / b is beside it as a pure (epsilon, 0) statement in `dpledger account`.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray
from scipy.special import logsumexp

from dpledger.accounting.errors import require_positive
from dpledger.accounting.orders import validated_orders
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.accounting.rounding import ROUNDING_ULPS, positive_floor
from dpledger.mechanisms.aggregation import VoteAggregator, parameter, register_aggregator
from dpledger.mechanisms.pate import validated_counts
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light

_GAUSS_NODES, _GAUSS_WEIGHTS = np.polynomial.legendre.leggauss(16)
_COARSE_NODES, _COARSE_WEIGHTS = np.polynomial.legendre.leggauss(8)
_LOG2 = math.log(2.0)
_ROUND_UP = 1.0 + 4.0 * ROUNDING_ULPS
"""The curve's relative allowance for its floating-point evaluation (32 ulps; tests/test_laplace_aggregator.py
checks it against 60-digit arithmetic): it is never below the exact value."""


def histogram_l1_sensitivity(relation: NeighbouringRelation) -> int:
    """Delta_1 of a vote histogram: 2 when one teacher is replaced (one count down, one up), 1 when one
    is added or removed (one count moves by one) (Dwork & Roth 2014, Definition 3.1's l1 sensitivity).

    Args:
        relation: the neighbouring relation (or its value).

    Returns:
        Delta_1: 2 under replace-one, 1 otherwise.

    Raises:
        ValueError: if `relation` names no NeighbouringRelation.
    """
    return 2 if NeighbouringRelation(relation) is NeighbouringRelation.REPLACE_ONE else 1


def _excess_exp(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """e^x - 1 - x >= 0 without cancellation: its Taylor series sum_{k >= 2} x^k / k! for |x| < 1 (to
    k = 24, a remainder below 1e-24 of the sum), expm1(x) - x otherwise (a cancellation of at most 3x)."""
    x = np.asarray(x, dtype=np.float64)
    small = np.abs(x) < 1.0
    xs = np.where(small, x, 0.0)
    term, series = xs * xs / 2.0, np.zeros_like(xs)
    for k in range(3, 26):
        series += term
        term = term * xs / k
    with np.errstate(over="ignore"):
        excess: NDArray[np.float64] = np.where(small, series, np.expm1(x) - x)
    return excess


def laplace_rdp(orders: Iterable[float], ratio: float) -> NDArray[np.float64]:
    """f_a(t) = D_a(Lap(0, b) || Lap(t b, b)) at each order a, t = sensitivity / scale = `ratio`
    (Mironov 2017, Proposition 6):
        f_a(t) = 1/(a-1) log( a/(2a-1) e^{(a-1) t} + (a-1)/(2a-1) e^{-a t} ).
    With A = (a-1) t and B = a t, a A = (a-1) B, so the argument of the log minus 1 is
        [a (e^A - 1 - A) + (a-1) (e^{-B} - 1 + B)] / (2a-1),
    a sum of two non-negative terms (no cancellation; `_excess_exp`): f = log1p(that) / (a-1). Where a e^A
    would leave double range the log form is used (no cancellation there: the argument exceeds e^600 / 2).
    Not rounded (see `LaplaceNoisyMaxAggregator.rdp_values`).

    Args:
        orders: Renyi orders, each finite and > 1.
        ratio: t = sensitivity / scale, finite and > 0.

    Returns:
        A float64 array, f_a(t) at each order.

    Raises:
        ValueError: if an order is not finite and > 1 or ratio is not finite and > 0.
    """
    a = validated_orders(orders)
    t = require_positive("ratio", ratio)
    big = (a - 1.0) * t + np.log(a) > 600.0
    with np.errstate(over="ignore", invalid="ignore"):
        A, B = (a - 1.0) * t, a * t
        excess = (a * _excess_exp(np.where(big, 0.0, A)) + (a - 1.0) * _excess_exp(np.where(big, 0.0, -B))) \
            / (2.0 * a - 1.0)
        direct = np.logaddexp(np.log(a / (2.0 * a - 1.0)) + A, np.log((a - 1.0) / (2.0 * a - 1.0)) - B)
        values = np.where(big, direct, np.log1p(excess)) / (a - 1.0)
    result: NDArray[np.float64] = np.where(np.isnan(values), np.inf, values)   # an infinite t: +inf (no guarantee)
    return result


def _log_laplace_cdf(z: NDArray[np.float64]) -> NDArray[np.float64]:
    """log F(z) of the standard Laplace CDF: z - log 2 for z < 0, log(1 - e^{-z} / 2) for z >= 0."""
    result: NDArray[np.float64] = np.where(z < 0, np.minimum(z, 0.0) - _LOG2,
                                           np.log1p(-0.5 * np.exp(-np.maximum(z, 0.0))))
    return result


STEEPNESS = 2.0
"""Each quadrature interval has |slope of log h| x width <= STEEPNESS: 16-point Gauss-Legendre then integrates
h to about 1e-30 of itself (an exponential e^{s x} over such an interval, by a degree-31 rule)."""
MAX_INTERVALS = 2 ** 14
BISECTION_WIDTH = 1e-12
"""Where the bisections for the mode and the window's ends stop (in t, relative for the ends): the analysis
below needs neither exactly (any point serves as the mode, and each end is kept on the side where log h is
below the floor), and halving a mode at the kink t = 0 to adjacent floats took 200 slope evaluations."""
WINDOW = 60.0
"""The quadrature covers the t where the log-integrand is within WINDOW of its maximum: beyond, a concave
log-integrand's tails are below e^-WINDOW / (1 - e^-WINDOW) (< 1e-26) of the integral (the docstring below)."""


def _log_integral(offsets: NDArray[np.float64], weights: NDArray[np.float64]) -> tuple[float, float]:
    """log int h(t) dt, h(t) = e^{-|t|} / 2 prod_w F(t + offsets[w])^{weights[w]}, by 16- and by 8-point
    Gauss-Legendre over the window (`laplace_noisy_max_log_law` has the analysis)."""

    def log_h(t: float | NDArray[np.float64]) -> NDArray[np.float64]:
        at = np.asarray(t, dtype=np.float64)
        result: NDArray[np.float64] = -np.abs(at) - _LOG2 + (weights * _log_laplace_cdf(at[..., None] + offsets)).sum(axis=-1)
        return result

    def slopes(t: NDArray[np.float64]) -> NDArray[np.float64]:
        """d/dt log h just right of each t: -sign(t) plus sum_w m'_w F'/F (1 left of 0, e^{-z}/2 / F right of it)."""
        shifted = t[:, None] + offsets
        tail = 0.5 * np.exp(-np.maximum(shifted, 0.0))
        hazard = np.where(shifted < 0, 1.0, tail / (1.0 - tail))
        result: NDArray[np.float64] = np.where(t >= 0, -1.0, 1.0) + hazard @ weights
        return result

    def slope(t: float) -> float:
        return float(slopes(np.array([t]))[0])

    kinks = np.unique(np.concatenate([[0.0], -offsets]))
    # left of every kink the slope is 1 + sum of weights > 0; far right of them it tends to -1
    low, high = float(kinks[0]) - 1.0, float(kinks[-1]) + 50.0 + math.log1p(float(np.sum(weights)))
    for _ in range(200):
        middle = 0.5 * (low + high)
        if high - low <= BISECTION_WIDTH:
            break
        low, high = (middle, high) if slope(middle) > 0 else (low, middle)
    mode = 0.5 * (low + high)
    floor = float(log_h(mode)) - WINDOW

    def end(direction: float) -> float:
        """The point past the mode (towards `direction`) where log h falls to `floor` (bisection)."""
        step = 1.0
        while float(log_h(mode + direction * step)) > floor:
            step *= 2.0
        near, far = 0.0, step
        for _ in range(200):
            middle = 0.5 * (near + far)
            if far - near <= BISECTION_WIDTH * far:
                break
            near, far = (middle, far) if float(log_h(mode + direction * middle)) > floor else (near, middle)
        return mode + direction * far

    left, right = end(-1.0), end(1.0)
    edges = np.unique(np.concatenate([[left, right], kinks[(kinks > left) & (kinks < right)]]))
    done: list[NDArray[np.float64]] = []
    pending = np.stack([edges[:-1], edges[1:]], axis=1)
    kept = 0
    while pending.size:   # halve each interval until |slope| x width <= STEEPNESS at both ends (the largest on it)
        steep = np.maximum(np.abs(slopes(pending[:, 0])), np.abs(slopes(np.nextafter(pending[:, 1], -np.inf))))
        final = (pending[:, 1] - pending[:, 0]) * steep <= STEEPNESS
        if kept + pending.shape[0] >= MAX_INTERVALS:
            final[:] = True
        done.append(pending[final])
        kept += int(final.sum())
        split = pending[~final]
        middle_points = 0.5 * (split[:, 0] + split[:, 1])
        pending = np.concatenate([np.stack([split[:, 0], middle_points], axis=1),
                                  np.stack([middle_points, split[:, 1]], axis=1)])
    cuts = np.concatenate(done)
    cuts = cuts[np.argsort(cuts[:, 0], kind="stable")]
    half, centres = (cuts[:, 1:] - cuts[:, :1]) / 2.0, (cuts[:, :1] + cuts[:, 1:]) / 2.0
    totals = []
    for nodes, gauss in ((_GAUSS_NODES, _GAUSS_WEIGHTS), (_COARSE_NODES, _COARSE_WEIGHTS)):
        points = centres + half * nodes[None, :]
        totals.append(float(logsumexp(log_h(points) + np.log(gauss)[None, :] + np.log(half))))
    return totals[0], totals[1]


def laplace_noisy_max_log_law(counts: npt.ArrayLike, scale: float) -> tuple[NDArray[np.float64], float]:
    """log Pr[argmax_j (c_j + Z_j) = j] for every token (Z_j i.i.d. Laplace(scale)), and the quadrature's
    relative error estimate.

    Pr[j wins] = int f_b(x - c_j) prod_{k != j} F_b(x - c_k) dx (ties have probability 0; f_b and F_b the
    Laplace density and CDF). Tokens with equal counts win with equal probability, so the integral is
    computed once per distinct count v, in t = (x - v) / b, where the integrand is
        h(t) = e^{-|t|} / 2 prod_w F(t + (v - w) / b)^{m'_w}
    (m'_w the number of other tokens with count w), in logs. h is log-concave (a product of log-concave
    factors: the Laplace density and CDF), smooth between its kinks t = 0 and t = (w - v) / b. Its mode is
    found by bisection on the slope of log h (decreasing); the window is where log h >= log h(mode) - WINDOW,
    whose ends are found by bisection too. Beyond an end t1 at distance d from the mode, concavity bounds
    log h by the tangent at t1 (tail <= h(t1) / |slope(t1)|) and from below on [mode, t1] by the chord
    (integral >= h(mode) d / WINDOW (1 - e^-WINDOW)), and |slope(t1)| >= WINDOW / d: each tail is below
    e^-WINDOW / (1 - e^-WINDOW) of the integral. Inside the window every piece between kinks is halved into
    intervals on which |slope| times the width is at most STEEPNESS (the largest |slope| of a concave
    function on an interval is at an end) and integrated by 16-point Gauss-Legendre. The error estimate is the larger
    of |sum - 1| and the largest relative change against 8 points per interval.

    Args:
        counts: (V,) the vote histogram.
        scale: the Laplace scale b, > 0 (votes).

    Returns:
        ((V,) log Pr[token j wins], the relative error estimate, at least 1e-25).

    Raises:
        ValueError: if `counts` is not a valid histogram or scale is not > 0.
    """
    histogram = validated_counts(counts)
    scale = require_positive("scale", scale)
    values, inverse, multiplicity = np.unique(histogram, return_inverse=True, return_counts=True)
    fine, coarse = np.empty(values.size), np.empty(values.size)
    for k, value in enumerate(values):
        weights = multiplicity.astype(np.float64)
        weights[k] -= 1.0
        fine[k], coarse[k] = _log_integral((value - values) / scale, weights)
    log_total = float(logsumexp(fine, b=multiplicity))
    error = max(abs(math.expm1(log_total)), float(np.max(np.abs(np.expm1(coarse - fine)))), 1e-25)
    return (fine - log_total)[inverse], error


@register_aggregator
class LaplaceNoisyMaxAggregator(VoteAggregator):
    """Report noisy max with Laplace(b) noise on every count (the module docstring has its analysis)."""

    name = "laplace-noisy-max"
    title = "Laplace noisy max"
    summary = ("report noisy max: Laplace noise of scale b on every vote count, the argmax released; "
               "(Delta_1 / b, 0)-DP per query (Dwork & Roth 2014, Theorem 3.6 and Claim 3.9)")
    calibrate_summary = "smallest Laplace scale b of report noisy max (Mironov 2017, Proposition 6, on RDP)"
    description = "report noisy max adds Laplace noise of scale b to every count and releases the noisy argmax, never failing"
    differentially_private = True
    calibrated = "scale"
    soundness = ("Delta_1 f_a(1/b) at order a, Delta_1 the histogram's L1 sensitivity under the relation (1 for one "
                 "teacher added or removed, 2 replaced): the Laplace mechanism's RDP (Mironov 2017, Proposition 6) "
                 "on each of the Delta_1 moved counts, summed (van Erven & Harremoes 2014, Theorem 28), capped by the "
                 "pure-DP Delta_1 / b (Dwork & Roth 2014, Theorem 3.6); the argmax is post-processing")
    account_note = ("Laplace(b) on every count: RDP Delta_1 f_a(1/b) per query (Mironov 2017, Proposition 6; Delta_1 = 2 "
                    "under replace-one), at most the pure-DP Delta_1 / b (Dwork & Roth 2014, Theorem 3.6); the argmax "
                    "is post-processing")

    scale: float = parameter(help="Laplace noise scale b added to every vote count (> 0)", unit="votes", symbol="b",
                             metavar="B")

    def check(self) -> None:
        object.__setattr__(self, "scale", require_positive("scale", self.scale))

    @property
    def sensitivity(self) -> int:
        return histogram_l1_sensitivity(self.relation)

    @property
    def pure_epsilon(self) -> float:
        """Delta_1 / b: each step is (Delta_1 / b, 0)-DP (Dwork & Roth 2014, Theorem 3.6 and Proposition 2.1);
        one correctly rounded division, then the next float up (never below the exact quotient)."""
        with np.errstate(over="ignore"):
            return float(np.nextafter(np.float64(self.sensitivity) / np.float64(self.scale), np.inf))

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        """min(Delta_1 f_a(1/b), Delta_1 / b), rounded up: see the module docstring.

        Args:
            orders: Renyi orders, each finite and > 1.

        Returns:
            A float64 array, one value per order (+inf everywhere when 1/b overflows).
        """
        with np.errstate(over="ignore", divide="ignore"):
            ratio = np.float64(1.0) / np.float64(self.scale)
            if not math.isfinite(ratio):   # a scale whose inverse overflows: no guarantee
                return np.full(orders.shape, np.inf)
            exact = self.sensitivity * laplace_rdp(orders, ratio) * _ROUND_UP
        return positive_floor(np.minimum(exact, self.pure_epsilon))

    def no_pld_reason(self) -> str | None:
        return ("Laplace noisy max has no DpEvent dpledger reads back (its dp-accounting interop is Gaussian): "
                "no PLD; RDP only")

    def decide(self, counts: NDArray[np.int64], generator: torch.Generator) -> tuple[int | None, float, list[float]]:
        """Laplace(b) noise as b (E_1 - E_2), two Exp(1) draws per count (their difference is a standard
        Laplace variable); the statistic and the recorded noise are the noisy maximum.

        Args:
            counts: (V,) the vote histogram.
            generator: the step's torch generator (2 V exponential draws).

        Returns:
            (the noisy argmax, the noisy maximum, [the noisy maximum]).
        """
        draws = torch.empty((2, counts.size), dtype=torch.float64).exponential_(generator=generator).numpy()
        noisy = counts + self.scale * (draws[0] - draws[1])
        token = int(np.argmax(noisy))
        return token, float(noisy[token]), [float(noisy[token])]

    def log_output_law(self, counts: npt.ArrayLike) -> tuple[float, NDArray[np.float64], float]:
        """It never fails: (-inf, log Pr[argmax = j], error) (`laplace_noisy_max_log_law`).

        Args:
            counts: (V,) the vote histogram.

        Returns:
            (-inf, (V,) log Pr[argmax = j], the relative error estimate).
        """
        law, error = laplace_noisy_max_log_law(np.asarray(counts, dtype=np.float64), self.scale)
        return -math.inf, law, error

    def sample_outputs(self, counts: NDArray[np.int64], draws: int, rng: np.random.Generator) -> NDArray[np.int64]:
        values = np.asarray(counts, dtype=np.float64)
        outputs: NDArray[np.int64] = np.argmax(values + rng.laplace(0.0, self.scale, (draws, values.size)), axis=1)
        return outputs

    def account_details(self, epsilon: float, queries: int, answered: int | None = None) -> dict[str, Any]:
        """The scale, and beside the RDP epsilon the pure (Q Delta_1 / b, 0) guarantee of basic composition
        (Dwork & Roth 2014, Theorem 3.16).

        Args:
            epsilon: the accounted epsilon (+inf: no guarantee).
            queries: the number Q of steps.
            answered: unused (every step is charged).

        Returns:
            JSON-ready details: dp_guarantee, scale, l1_sensitivity, the pure epsilons per query and in
            total, the note.
        """
        with np.errstate(over="ignore"):
            pure = float(np.nextafter(np.float64(queries) * np.float64(self.pure_epsilon), np.inf))
        return {"dp_guarantee": math.isfinite(epsilon), "scale": self.scale, "l1_sensitivity": self.sensitivity,
                "pure_epsilon_per_query": self.pure_epsilon, "pure_epsilon": pure, "note": self.account_note}

    @classmethod
    def charge_statement(cls, parameters: Mapping[str, Any]) -> str:
        return (f"Every step is charged {cls.soundness}; it is also (Delta_1 / b, 0)-DP (Dwork & Roth 2014, "
                "Theorem 3.6).")

