"""Plan a run before it spends: the parameter an (epsilon, delta) budget over Q queries allows.

Each calibration solves for one parameter with the others fixed, then accounts the answer forward
with dpledger's own accounting and guarantees target * (1 - CALIBRATION_TOLERANCE) <= forward
epsilon <= target (ValueError when no parameter can meet the target):

* PMixED: the largest beta (Flemings et al. 2024, Theorem 3.1 per query; Lemma C.1 gives beta for
  an RDP budget at one order and is the search's starting point; the RDP -> (epsilon, delta)
  conversion, Balle et al. 2020 Theorem 21, adds a term, so beta is found by bisection on the
  composed, converted curve). With Poisson subsampling of teachers, Flemings et al. 2024 Theorem
  A.4 with the chosen SubsamplingVariant (default: the proven one, all-orders-ball).
* Gaussian-noise mechanisms: the smallest noise. Gaussian (Mironov 2017, Proposition 7 /
  Corollary 3), Poisson-subsampled Gaussian (Mironov, Talwar & Zhang 2019), AdaPMixED's screen
  (Flemings et al. 2024, Theorem 4.1), GNMax and Confident-GNMax (Papernot et al. 2018,
  Proposition 8 and Algorithm 1; s1 = ratio * s2), DPWS (Gaussian-noised counts). dp-accounting's
  `calibrate_dp_mechanism` (Brent's method) runs on the mechanism's DpEvent with an RdpAccountant
  (default: dpledger's ledgers are RDP) or a PLDAccountant (Koskela et al. 2020; Doroshenko et al.
  2022), then dpledger re-checks the answer forward and bisects to restore the guarantee if needed.
  A PLD-calibrated noise is only as good as the PLD accounting that will be used to report it: the
  RDP ledger of the same run states a larger epsilon (Calibration.rdp_epsilon).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, TypedDict, Unpack

import numpy as np
import dataclasses

from dpledger.accounting.conversion import ConversionMethod, EpsilonConversion, GridEdgeWarning, epsilon_from_rdp
from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.errors import (require, require_finite, require_in_closed, require_in_open, require_int_at_least,
                             require_member, require_not_nan, require_order, require_positive, require_str)
from dpledger.accounting.orders import DEFAULT_ORDERS, canonical_orders, default_orders
from dpledger.accounting.relation import NeighbouringRelation, neighbouring_relation
from dpledger.mechanisms.base import Mechanism
from dpledger.mechanisms.dp_events import dp_accounting_relation, effective_gaussian_noise_multiplier
from dpledger.mechanisms.gaussian import GaussianMechanism, PoissonSubsampledGaussian
from dpledger.mechanisms.hot_pate import DPWeightedSampler
from dpledger.mechanisms.pate import ConfidentGNMax, GNMax
from dpledger.mechanisms.pld import (PLD_NOISE_LIMIT, PLD_VALUE_DISCRETIZATION_INTERVAL, composed_event, pld_epsilon,
                           simplified_event)
from dpledger.mechanisms.ball import Ball, ball_named
from dpledger.mechanisms.pmixed import (PMixED, SubsamplingVariant, beta_from_budget, subsampled_pmixed_curve,
                                        subsampling_variant)
from dpledger.mechanisms.screening import NoisyScreening

if TYPE_CHECKING:   # annotations only: dp-accounting is imported where it is used (~1 s)
    from dp_accounting import DpEvent
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

ACCOUNTANTS = ("rdp", "pld")
CALIBRATION_TOLERANCE = 0.01
"""Every answer accounts forward to at least (1 - CALIBRATION_TOLERANCE) * target, and at most target."""
MAX_TARGET_EPSILON = 700.0
"""The largest target epsilon calibration accepts. An (epsilon, delta) guarantee bounds probabilities by a
factor e^epsilon; beyond e^709.78, the largest double, that factor is not even a number, and a target
anywhere near it states no privacy. Bounding it also bounds every search (epsilon 1e308 drove the
subsampled Gaussian's noise towards 1e-155, where each RDP evaluation takes a second)."""
MAX_QUERIES = 2 ** 53
"""The largest query count accounted: every integer up to 2^53 is exact in double precision, the
arithmetic the RDP curve is composed in (Q times the per-query curve); a larger count would be
rounded, possibly down, which would under-state epsilon."""
MAX_SUBSAMPLED_TEACHERS = 4096
"""The largest N for PMixED with Poisson subsampling of teachers: its bounds evaluate Theorem 3.1 at
every subsample size 1..N and every integer order up to the grid's largest (1024), an N x 1024 array
per evaluation (0.7 s and 150 MB at N = 4096; N = 10^6 ran out of memory). Ensembles in the literature
have a few hundred teachers at most (Flemings et al. 2024, Table 4: N = 100; Papernot et al. 2017: 250)."""
MAX_REALISED_DRAWS = 10 ** 7
"""The largest Q for the realised-size variants, which draw one subsample size per query (80 MB at
10^7; they are shown for comparison and are not guarantees)."""
MAX_NOISE_RATIO = 1e6
"""Confident-GNMax's s1 / s2 is in [1 / MAX_NOISE_RATIO, MAX_NOISE_RATIO]: beyond it one part's RDP is
under 1e-12 of the other's (RDP scales with 1 / sigma^2), and s1 = ratio * s2 would leave double range
within the search's bracket."""
_SEARCH_GAP = 1e-7  # the bisection stops once forward >= target * (1 - _SEARCH_GAP)
_PLD_SEARCH_GAP = 1e-4
_MAX_STEPS = 4000


class NoiseOptions(TypedDict, total=False):
    """The options of calibrate_noise that its wrappers pass on (calibrate_noise's docstring has their meaning)."""

    accountant: str
    orders: Sequence[float]
    method: ConversionMethod | str
    value_discretization_interval: float
    compare_pld: bool


class PldOptions(TypedDict, total=False):
    """The PLD option calibrate_scale passes on to calibrate_noise for a Gaussian mechanism."""

    value_discretization_interval: float


@dataclass(frozen=True)
class Calibration:
    """One calibrated parameter and its forward check.

    forward_epsilon is what `accountant` states for `mechanism` composed `queries` times at `delta`
    (dpledger's RDP curve and conversion for "rdp"; dp-accounting's PLD of the mechanism's event for
    "pld"); it is <= target_epsilon and >= (1 - CALIBRATION_TOLERANCE) * target_epsilon.
    rdp_epsilon is dpledger's RDP statement of the same parameter (what its ledger will say);
    pld_epsilon the PLD one where computed. slack = target_epsilon - forward_epsilon >= 0.
    """

    mechanism_name: str
    parameter: str
    value: float
    target_epsilon: float
    delta: float
    queries: int
    accountant: str
    forward_epsilon: float
    rdp_epsilon: float
    rdp_order: float | None
    pld_epsilon: float | None
    mechanism: Mechanism
    fixed: dict[str, object] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        target_epsilon = require_positive("target_epsilon", self.target_epsilon)
        require(target_epsilon <= MAX_TARGET_EPSILON,
                f"target_epsilon must be <= {MAX_TARGET_EPSILON:g}, got {target_epsilon:g}")
        delta = require_in_open("delta", self.delta, 0.0, 1.0)
        queries = require_query_count("queries", self.queries)

        def epsilon(name: str, value: float) -> float:  # +inf is "no guarantee"; NaN and negative values are not epsilons
            value = require_not_nan(name, value)
            require(value >= 0, f"{name} must be >= 0 (+inf: no guarantee), got {value:g}")
            return value

        forward = epsilon("forward_epsilon", self.forward_epsilon)
        require(forward <= target_epsilon,
                f"forward_epsilon must be <= target_epsilon = {target_epsilon:g} (a calibration never overspends), "
                f"got {forward:g}")
        for name in ("mechanism_name", "parameter"):
            require_str(name, getattr(self, name))
        require(isinstance(self.mechanism, Mechanism), f"mechanism must be a Mechanism, got {self.mechanism!r}")
        require(isinstance(self.fixed, dict), f"fixed must be a dict, got {self.fixed!r}")
        for name in ("notes", "warnings"):
            require(isinstance(getattr(self, name), tuple) and all(isinstance(t, str) for t in getattr(self, name)),
                    f"{name} must be a tuple of strings, got {getattr(self, name)!r}")
        for name, value in dict(value=require_positive("value", self.value), target_epsilon=target_epsilon,
                                delta=delta, queries=queries, accountant=_accountant(self.accountant),
                                forward_epsilon=forward, rdp_epsilon=epsilon("rdp_epsilon", self.rdp_epsilon),
                                rdp_order=None if self.rdp_order is None else require_order("rdp_order", self.rdp_order),
                                pld_epsilon=(None if self.pld_epsilon is None
                                             else epsilon("pld_epsilon", self.pld_epsilon))).items():
            object.__setattr__(self, name, value)

    @property
    def slack(self) -> float:
        return self.target_epsilon - self.forward_epsilon

    @property
    def relative_slack(self) -> float:
        return self.slack / self.target_epsilon

    def to_record(self) -> dict[str, object]:
        """A JSON-ready dict (strict_json_text turns +inf into null with a reason).

        Returns:
            A dict of JSON-ready values: the calibration's fields, its slack, the relation's name, the
            tolerance, and lists for notes and warnings (+inf stays a float).
        """
        return {"mechanism": self.mechanism_name, "parameter": self.parameter, "value": self.value,
                "target_epsilon": self.target_epsilon, "delta": self.delta, "queries": self.queries,
                "accountant": self.accountant, "forward_epsilon": self.forward_epsilon, "slack": self.slack,
                "relative_slack": self.relative_slack, "rdp_epsilon": self.rdp_epsilon, "rdp_order": self.rdp_order,
                "pld_epsilon": self.pld_epsilon, "relation": self.mechanism.relation.value, "fixed": dict(self.fixed),
                "tolerance": CALIBRATION_TOLERANCE, "notes": list(self.notes), "warnings": list(self.warnings)}


# ---- validation ----

def _target(epsilon: float, delta: float, queries: int) -> tuple[float, float, int]:
    epsilon = require_positive("epsilon", epsilon)
    require(epsilon <= MAX_TARGET_EPSILON,
            f"epsilon must be <= {MAX_TARGET_EPSILON:g} (a guarantee bounds probabilities by a factor e^epsilon, "
            f"which is past the largest double above 709.78: such a target states no privacy), got {epsilon:g}")
    delta = require_in_open("delta", delta, 0.0, 1.0)
    queries = require_query_count("queries", queries)
    return epsilon, delta, queries


def require_query_count(name: str, value: object) -> int:
    """value as an int in [1, MAX_QUERIES] (exact in double precision); ValueError naming `name` otherwise.

    Args:
        name: the argument's name, for the message.
        value: the query count (an integer, or a float with an integer value).

    Returns:
        The count as an int.

    Raises:
        ValueError: if it is not an integer in [1, MAX_QUERIES].
    """
    queries = require_int_at_least(name, value, 1)
    require(queries <= MAX_QUERIES, f"{name} must be at most 2^53 = {MAX_QUERIES} (counts above it are not exact in "
                                    f"double precision and could be rounded down), got {queries}")
    return queries


def require_subsampling_work(teachers: int, queries: int, realised_sizes: bool, teachers_name: str = "teachers",
                             queries_name: str = "queries") -> None:
    """ValueError naming the value and the limit when PMixED's subsampled accounting of `teachers` over
    `queries` would exceed MAX_SUBSAMPLED_TEACHERS or (for the realised-size variants) MAX_REALISED_DRAWS.

    Args:
        teachers: the ensemble size N.
        queries: the number of queries Q.
        realised_sizes: whether the variant draws a subsample size per query.
        teachers_name: the name of N in the message.
        queries_name: the name of Q in the message.

    Raises:
        ValueError: if N > MAX_SUBSAMPLED_TEACHERS, or realised_sizes and Q > MAX_REALISED_DRAWS.
    """
    require(teachers <= MAX_SUBSAMPLED_TEACHERS,
            f"{teachers_name} must be at most {MAX_SUBSAMPLED_TEACHERS} with Poisson subsampling of teachers (its "
            f"bound evaluates Theorem 3.1 at every subsample size 1..N and order: an N x 1024 array), got {teachers}")
    require(not realised_sizes or queries <= MAX_REALISED_DRAWS,
            f"{queries_name} must be at most {MAX_REALISED_DRAWS:,} for the realised-size variants, which draw one "
            f"subsample size per query, got {queries}")


@contextlib.contextmanager
def quiet_dp_accounting() -> Iterator[None]:
    """dp-accounting's warnings through absl logging off for the block (restored after): at extreme noise its
    fractional-order series logs one line per order it drops ("failed to converge ... Excluding this
    order"), hundreds per search. What it drops costs nothing here: dp-accounting only steers a
    search, and dpledger's own curve charges a sound value at every order (PoissonSubsampledGaussian).

    Yields:
        Nothing: the block runs with the "absl" logger at level ERROR (also usable as a decorator).
    """
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _accountant(accountant: str) -> str:
    require(accountant in ACCOUNTANTS, f"accountant must be one of {list(ACCOUNTANTS)}, got {accountant!r}")
    return accountant


# ---- forward accounting ----

def _rdp_forward(mechanism: Mechanism, queries: int, delta: float, orders: Sequence[float],
                 method: ConversionMethod | str) -> tuple[float, float | None, tuple[str, ...]]:
    """(epsilon, its order, the grid-edge warnings) of `queries` compositions of `mechanism` at `delta`.
    A search's noise can be so large that its square overflows: RDP 0 there is right (the true value is
    below 1e-300), so numpy's overflow warning is not shown."""
    with warnings.catch_warnings(record=True) as caught, np.errstate(over="ignore"):
        warnings.simplefilter("always", GridEdgeWarning)
        result = epsilon_from_rdp(mechanism.rdp_curve(orders).composed(queries), delta, method)
    return (float(result.epsilon), result.order,
            tuple(str(w.message) for w in caught if issubclass(w.category, GridEdgeWarning)))


def _search(forward: Callable[[float], float], target: float, good: float, bad: float, gap: float = _SEARCH_GAP) -> float:
    """A parameter p between `good` (forward(good) <= target) and `bad` (forward(bad) > target) with
    target (1 - _SEARCH_GAP) <= forward(p) <= target, by bisection (geometric while the endpoints
    are far apart); the closest good point found when float resolution ends the search first."""
    value = forward(good)
    require(value <= target, "internal: the search's good endpoint is over the target")
    for _ in range(_MAX_STEPS):
        if value >= target * (1.0 - gap):
            return good
        if good > 0 and bad > 0 and max(good, bad) / min(good, bad) > 2.0:
            middle = math.sqrt(good * bad)
        else:
            middle = 0.5 * (good + bad)
        if middle in (good, bad):
            return good
        middle_value = forward(middle)
        if middle_value <= target:
            good, value = middle, middle_value
        else:
            bad = middle
    return good


def _bracket(forward: Callable[[float], float], target: float, guess: float, increasing: bool,
             lowest: float, highest: float) -> tuple[float, float] | None:
    """(good, bad) around the boundary of {forward <= target}, from `guess` by factors of 2 within
    [lowest, highest]; None when no good point is found (the target is out of reach)."""
    guess = min(max(guess, lowest), highest)
    up, down = (2.0, 0.5) if increasing else (0.5, 2.0)  # `up` moves towards larger epsilon
    point = guess
    if forward(point) <= target:
        good = point
        bad = point * up
        while forward(bad) <= target:
            good = bad
            bad *= up
            require(lowest <= bad <= highest, f"internal: no parameter in [{lowest:g}, {highest:g}] exceeds the target")
        return good, bad
    bad = point
    good = point * down
    while forward(good) > target:
        bad = good
        good *= down
        if not lowest <= good <= highest:
            return None
    return good, bad


def _finish(forward: Callable[[float], float], target: float, good: float, bad: float, gap: float = _SEARCH_GAP) -> float:
    value = _search(forward, target, good, bad, gap)
    achieved = forward(value)
    require(achieved <= target, "internal: the calibrated parameter accounts over the target")
    require(achieved > 0,
            f"no parameter accounts to within {CALIBRATION_TOLERANCE:.0%} of epsilon = {target:g}: the accounting "
            "drops from above it to exactly 0 (delta alone covers the rest there); ask for a larger epsilon")
    require(achieved >= target * (1.0 - CALIBRATION_TOLERANCE),
            f"no parameter accounts to within {CALIBRATION_TOLERANCE:.0%} of epsilon = {target:g} (the closest "
            f"gives {achieved:g}): the accounting jumps there")
    return value


# ---- noise calibration (Gaussian-noise mechanisms) ----

def _gaussian_guess(epsilon: float, delta: float, queries: int) -> float:
    """Noise multiplier z with Q-fold Gaussian epsilon about `epsilon`: mu = sqrt(Q) / z solving
    epsilon = mu^2 / 2 + mu sqrt(2 log(1/delta)) (the Gaussian's RDP converted at its best order,
    Mironov 2017, Proposition 3; a starting point only)."""
    log_inverse = math.log(1.0 / delta)
    mu = -math.sqrt(2.0 * log_inverse) + math.sqrt(2.0 * log_inverse + 2.0 * epsilon)
    return math.sqrt(queries) / max(mu, 1e-300)


PLD_EPSILON_LIMIT = 100.0
"""Beyond this epsilon (or below dpledger.mechanisms.pld.PLD_NOISE_LIMIT) the PLD's loss grid is too large to
compute in reasonable time (measured: epsilon 500 over one query ran past 250 s); calibration with
the PLD accountant refuses such targets and points to the RDP accountant."""
PLD_DELTA_LIMIT = 1e-12
"""The smallest delta the PLD accountant calibrates at: dp-accounting truncates up to 1e-15 of each
distribution's tail mass (its `tail_mass_truncation`), so below about 1e-13 its pessimistic epsilon
jumps to +inf (measured: Gaussian noise 10 over 1,000 queries, 29.7 at delta 1e-15, +inf at 1e-16;
the subsampled Gaussian already at 1e-15), and a search there finds no answer."""
PLD_RDP_CUTOFF = 1000.0
"""The PLD of an event that is not one Gaussian (a Poisson-subsampled Gaussian) is not computed where its
RDP epsilon, an upper bound that grows with how far the privacy losses spread, is above this: measured
on 2 cores, 3.8 s at RDP epsilon 1,100 (q = 0.01, noise 1, 10^7 queries)."""
PLD_MAX_STEPS = 10 ** 6
"""Nor where it composes more than this many such steps: the pessimistic discretisation rounds every
step's losses up to the grid, so the composed distribution's support grows with the count (measured on
2 cores: at most 3.1 s for 10^6 Poisson-subsampled Gaussian steps, 28 to 81 s for 10^7, past 10
minutes for 10^9)."""


def _pld_steps(event: "DpEvent") -> int:
    """How many steps dp-accounting's PLD composes for `event` (a composition of Gaussians is one)."""
    from dp_accounting import ComposedDpEvent, SelfComposedDpEvent

    if effective_gaussian_noise_multiplier(event) is not None:
        return 1
    if isinstance(event, SelfComposedDpEvent):
        count: int = event.count
        return count * _pld_steps(event.event)
    if isinstance(event, ComposedDpEvent):
        return sum(_pld_steps(part) for part in event.events)
    return 1


def pld_grid_noise(event: "DpEvent") -> tuple[float, str] | None:
    """(z, what z is): the Gaussian noise multiplier that sets how far the PLD's privacy-loss grid spans
    for `event`. A composition of Gaussians is one Gaussian (Dong, Roth & Su 2022, Corollary 3.3): its
    composed noise multiplier. Otherwise the smallest noise multiplier one step adds (a
    Poisson-subsampled Gaussian's loss reaches as far as its Gaussian's). None when no Gaussian is inside.

    Args:
        event: a dp-accounting DpEvent.

    Returns:
        (z, "composed noise multiplier" or "noise multiplier per step"), or None.
    """
    from dp_accounting import ComposedDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent

    composed = effective_gaussian_noise_multiplier(simplified_event(event))
    if composed is not None:
        return composed, "composed noise multiplier"

    def per_step(part: "DpEvent") -> float | None:
        z = effective_gaussian_noise_multiplier(part)
        if z is not None:
            return z
        if isinstance(part, (PoissonSampledDpEvent, SelfComposedDpEvent)):
            return per_step(part.event)
        if isinstance(part, ComposedDpEvent):
            values = [v for v in (per_step(p) for p in part.events) if v is not None]
            return min(values) if values else None
        return None

    z = per_step(event)
    return None if z is None else (z, "noise multiplier per step")


def pld_cost_reason(event: "DpEvent", rdp_epsilon: float) -> str | None:
    """Why dp-accounting's PLD of `event` is not computed (None when it is): too little noise for its
    loss grid (pld_grid_noise below dpledger.mechanisms.pld.PLD_NOISE_LIMIT) or, for an event that is not one
    Gaussian, more than PLD_MAX_STEPS steps or an RDP epsilon above PLD_RDP_CUTOFF; each would take
    minutes and gigabytes.

    Args:
        event: a dp-accounting DpEvent (the composed run).
        rdp_epsilon: dpledger's RDP epsilon of the same run.

    Returns:
        A sentence saying why the PLD is skipped (ending "RDP only"), or None when it is affordable.
    """
    grid = pld_grid_noise(event)
    if grid is None:
        return None
    z, what = grid
    if z < PLD_NOISE_LIMIT:
        # 1 / z^2 overflows below about 1e-154, where z is computed as 0: say so rather than quote 0
        shown = f"{z:.3g}" if z > 0 else "(below 1e-154: its inverse square overflows)"
        return (f"the {what} {shown} is below {PLD_NOISE_LIMIT:g}: the privacy-loss grid would have millions of "
                "points (minutes of dp-accounting); RDP only")
    if what == "composed noise multiplier":  # one Gaussian: its grid does not grow with the count
        return None
    steps = _pld_steps(event)
    if steps > PLD_MAX_STEPS:
        return (f"{steps} Poisson-subsampled steps are more than the {PLD_MAX_STEPS:,} the PLD grid composes in "
                "seconds (minutes of dp-accounting beyond); RDP only")
    if rdp_epsilon > PLD_RDP_CUTOFF:
        return (f"the RDP epsilon {rdp_epsilon:.6g} is above {PLD_RDP_CUTOFF:g}: the privacy losses spread over "
                "millions of grid points (minutes of dp-accounting); RDP only")
    return None


@quiet_dp_accounting()
def calibrate_noise(factory: Callable[[float], Mechanism], epsilon: float, delta: float, queries: int, *,
                    mechanism_name: str, parameter: str, accountant: str = "rdp",
                    orders: Sequence[float] = DEFAULT_ORDERS, method: ConversionMethod | str = ConversionMethod.IMPROVED,
                    value_discretization_interval: float = PLD_VALUE_DISCRETIZATION_INTERVAL,
                    compare_pld: bool = False, fixed: dict[str, object] | None = None) -> Calibration:
    """The smallest value of `parameter` (a noise scale: epsilon decreases as it grows) for which
    `factory(value)` composed `queries` times accounts to at most `epsilon` at `delta`.

    dp-accounting's calibrate_dp_mechanism (Brent's method) solves on the mechanism's DpEvent with
    a fresh RdpAccountant on `orders` or PLDAccountant per evaluation; dpledger then accounts the
    answer forward (its RDP curve and conversion, or the PLD of its event) and bisects until
    target (1 - 1e-7) <= forward <= target (1e-4 for PLD), so dp-accounting's and dpledger's rounding never leave
    the answer over the target. ValueError when no noise can meet the target (with RDP, the
    conversion term at the largest order of the grid is a floor; with PLD, the limits of its grid).
    With compare_pld, the PLD epsilon of the answer is computed too where it is affordable
    (pld_cost_reason; otherwise a note says why not).

    Args:
        factory: builds the mechanism from a value of the parameter (> 0).
        epsilon: the target epsilon of the whole run (> 0, <= MAX_TARGET_EPSILON).
        delta: the target delta, in (0, 1).
        queries: the number of queries Q composed, in [1, MAX_QUERIES].
        mechanism_name: the mechanism's name, for records and messages.
        parameter: the parameter's name (e.g. "sigma").
        accountant: "rdp" (dpledger's RDP curve and conversion) or "pld" (dp-accounting's PLD).
        orders: the RDP orders (> 1).
        method: the RDP -> (epsilon, delta) conversion (ConversionMethod or its name).
        value_discretization_interval: the PLD's loss grid interval.
        compare_pld: also compute the PLD epsilon of the answer (RDP accountant) where affordable.
        fixed: the other parameters, recorded as they are.

    Returns:
        The Calibration: the value, its forward epsilon (<= epsilon, >= (1 - CALIBRATION_TOLERANCE)
        epsilon) and the mechanism built with it.

    Raises:
        ValueError: if a target or option is out of range, or no value meets the target.
    """
    from dp_accounting import SelfComposedDpEvent, mechanism_calibration
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    epsilon, delta, queries = _target(epsilon, delta, queries)
    accountant = _accountant(accountant)
    method = require_member(ConversionMethod, "method", method)
    orders = canonical_orders(orders)
    fixed = dict(fixed or {})
    probe = factory(1.0)
    with np.errstate(over="ignore", divide="ignore"):  # fixed parameters at the edge of double range: +inf or 0
        event = probe.dp_event()
        require(event is not None, f"{mechanism_name} has no DpEvent: calibrate it by bisection instead")
        unit = _noise_per_unit(event)  # the event's z per unit of the parameter
    relation = dp_accounting_relation(probe.relation, event)  # ValueError for a one-sided relation
    if unit is None:
        raise ValueError(f"internal: {mechanism_name} is not a Gaussian-noise mechanism")
    require(1e-300 < unit < 1e300,
            f"{mechanism_name} with " + ", ".join(f"{k} = {v:g}" for k, v in fixed.items()
                                                 if isinstance(v, (int, float)) and not isinstance(v, bool))
            + f" adds a noise multiplier of {unit:g} per unit of {parameter}: outside [1e-300, 1e300], where no "
            f"{parameter} can be calibrated in double precision")
    pld_lowest = [1e-300]  # the parameter below which the PLD is not evaluated (set before its first use)
    pld_skipped: set[float] = set()

    @functools.lru_cache(maxsize=None)
    def rdp_forward(value: float) -> float:
        return _rdp_forward(factory(value), queries, delta, orders, method)[0]

    @functools.lru_cache(maxsize=None)
    def pld_forward(value: float) -> float:
        # below the grid's noise limit, or where RDP shows the losses spread too far, the PLD would take minutes:
        # such a noise is taken to be over the target (<= PLD_EPSILON_LIMIT) and never returned as an answer
        if value < pld_lowest[0] or rdp_forward(value) > PLD_RDP_CUTOFF:
            pld_skipped.add(value)
            return math.inf
        return pld_epsilon(composed_event(factory(value), queries), delta, probe.relation, value_discretization_interval)

    rdp_floor = _rdp_floor(orders, delta, method, probe.relation)
    if accountant == "rdp":
        require(epsilon > rdp_floor,
                f"epsilon = {epsilon:g} is out of reach: on this order grid (largest order {orders[-1]:g}) no noise "
                f"accounts below {rdp_floor:.6g} at delta = {delta:g} (the RDP -> DP conversion term); add larger "
                "orders or use the PLD accountant")
    else:
        require(delta >= PLD_DELTA_LIMIT, f"delta = {delta:g} is below the PLD accountant's limit {PLD_DELTA_LIMIT:g} "
                "(dp-accounting truncates up to 1e-15 of the tail mass: below about 1e-13 its epsilon jumps, to +inf by "
                "1e-16); use the RDP accountant")
        require(epsilon <= PLD_EPSILON_LIMIT, f"epsilon = {epsilon:g} is above the PLD accountant's limit "
                f"{PLD_EPSILON_LIMIT:g} (its loss grid, interval {value_discretization_interval:g}, would be too large); "
                "use the RDP accountant")
    guess = _gaussian_guess(epsilon, delta, queries) / unit
    forward = rdp_forward if accountant == "rdp" else pld_forward
    # bracket with the cheap RDP forward first; for PLD, start from the RDP answer's neighbourhood
    bracket = _bracket(rdp_forward, epsilon, guess, False, 1e-300, 1e300) if epsilon > rdp_floor else None
    if accountant == "pld":
        start = bracket[0] if bracket is not None else guess
        # the PLD is discretised on a grid of privacy losses: too little noise spans so many points that
        # dp-accounting runs for minutes; refuse what the RDP answer already shows to be out of the grid's range
        event = composed_event(factory(start), queries)
        grid = pld_grid_noise(event)
        what = "noise multiplier"
        if grid is not None:
            z, what = grid
            require(what == "composed noise multiplier" or _pld_steps(event) <= PLD_MAX_STEPS,
                    f"queries = {queries} is more than the {PLD_MAX_STEPS:,} Poisson-subsampled steps the PLD "
                    "accountant's grid composes in seconds (its pessimistic discretisation grows with the count); "
                    "use the RDP accountant")
            require(z >= PLD_NOISE_LIMIT,
                    f"epsilon = {epsilon:g} at delta = {delta:g} needs a {what} of about {z:.3g}: too little noise for "
                    f"the PLD accountant's grid (interval {value_discretization_interval:g}; limit noise >= "
                    f"{PLD_NOISE_LIMIT:g}); use the RDP accountant")
            # the parameter at which that noise reaches the grid's limit (the noise scales with the parameter)
            pld_lowest[0] = start * PLD_NOISE_LIMIT / z
        lowest = pld_lowest[0]
        bracket = _bracket(pld_forward, epsilon, max(start, lowest), False, lowest, 1e300)
        if bracket is not None and bracket[1] < lowest:  # the search went below the grid's limit, where it skips
            require(pld_forward(lowest) > epsilon,
                    f"epsilon = {epsilon:g} at delta = {delta:g}: even noise down to the PLD grid's limit ({what} "
                    f"{PLD_NOISE_LIMIT:g}) accounts below it, so the smallest noise is out of the PLD accountant's "
                    "range; use the RDP accountant")
            bracket = (bracket[0], lowest)
    if bracket is None:
        raise ValueError(f"epsilon = {epsilon:g} is out of reach for {mechanism_name}")
    good, bad = bracket

    def fresh_accountant() -> "RdpAccountant | PLDAccountant":
        if accountant == "rdp":
            return RdpAccountant(list(orders), relation)
        return PLDAccountant(relation, value_discretization_interval)

    def event_of(value: float) -> "DpEvent":
        return SelfComposedDpEvent(simplified_event(factory(value).dp_event()), queries)

    if bad in pld_skipped:  # dp-accounting would compute the PLD the guard skipped there: bisect here instead
        solved = good
    else:
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                solved = float(mechanism_calibration.calibrate_dp_mechanism(
                    fresh_accountant, event_of, epsilon, delta, mechanism_calibration.ExplicitBracketInterval(bad, good),
                    tol=good * (1e-9 if accountant == "rdp" else 1e-5)))
        except (ValueError, mechanism_calibration.NoBracketIntervalFoundError):
            solved = good  # dp-accounting's and dpledger's accounting disagree about the bracket: bisect it here
    # forward re-check with dpledger's accounting; bisect from the solution if it is over (rounding)
    if forward(solved) <= epsilon:
        good = solved
    else:
        bad = solved  # the bracket's good end is still good
    # the PLD's epsilon moves in steps of its discretisation: stop within 1e-4 of the target there
    value = _finish(forward, epsilon, good, bad, _SEARCH_GAP if accountant == "rdp" else _PLD_SEARCH_GAP)
    mechanism = factory(value)
    rdp_epsilon, rdp_order, grid_warnings = _rdp_forward(mechanism, queries, delta, orders, method)
    notes = []
    pld: float | None = None
    forward_epsilon = rdp_epsilon
    if accountant == "pld":
        pld = forward_epsilon = pld_forward(value)
    elif compare_pld:
        too_costly = pld_cost_reason(composed_event(mechanism, queries), rdp_epsilon)
        if too_costly is None:
            pld = pld_epsilon(composed_event(mechanism, queries), delta, probe.relation, value_discretization_interval)
        else:
            notes.append(f"no PLD epsilon beside the RDP one: {too_costly}")
    if accountant == "pld":
        notes.append(f"calibrated with dp-accounting's PLD (pessimistic estimate, value_discretization_interval = "
                     f"{value_discretization_interval:g}): only as good as the PLD accounting that will report it; "
                     f"dpledger's RDP ledger states epsilon = {rdp_epsilon:.6g} for this noise")
    return Calibration(mechanism_name, parameter, value, epsilon, delta, queries, accountant,
                       forward_epsilon, rdp_epsilon, rdp_order, pld, mechanism, fixed, tuple(notes), grid_warnings)


def _noise_per_unit(event: "DpEvent") -> float | None:
    """The Gaussian noise multiplier of `event` (through a Poisson-sampling step) at parameter 1."""
    from dp_accounting import PoissonSampledDpEvent

    return effective_gaussian_noise_multiplier(event.event if isinstance(event, PoissonSampledDpEvent) else event)


def _rdp_floor(orders: tuple[float, ...], delta: float, method: ConversionMethod | str,
               relation: NeighbouringRelation) -> float:
    """The epsilon an RDP curve of (almost) 0 converts to on `orders`: the infimum over all noise
    levels, the conversion term at the best order (Balle et al. 2020, Theorem 21: log((a-1)/a) -
    (log delta + log a) / (a - 1); Mironov 2017, Proposition 3 for the classic method), below which
    no noise reaches on this grid."""
    tiny = RdpCurve(orders, np.full(len(orders), 1e-300), relation)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        return float(epsilon_from_rdp(tiny, delta, method).epsilon)


def calibrate_gaussian(epsilon: float, delta: float, queries: int, *,
                       relation: NeighbouringRelation | str = NeighbouringRelation.ADD_OR_REMOVE_ONE,
                       **options: Unpack[NoiseOptions]) -> Calibration:
    """Smallest Gaussian noise multiplier (noise std / L2 sensitivity): RDP a / (2 z^2) per query
    (Mironov 2017, Proposition 7 / Corollary 3).

    Args:
        epsilon: the target epsilon of the whole run (> 0, <= MAX_TARGET_EPSILON).
        delta: the target delta, in (0, 1).
        queries: the number of queries Q composed, in [1, MAX_QUERIES].
        relation: the neighbouring relation (a NeighbouringRelation or its name).
        **options: calibrate_noise's options (NoiseOptions: accountant, orders, method,
            value_discretization_interval, compare_pld).

    Returns:
        The Calibration: the value, its forward epsilon (<= epsilon, >= (1 - CALIBRATION_TOLERANCE)
        epsilon) and the mechanism built with it.

    Raises:
        ValueError: if a target or option is out of range, or no value meets the target (calibrate_noise).
    """
    relation = neighbouring_relation(relation)
    return calibrate_noise(lambda z: GaussianMechanism(z, relation=relation), epsilon, delta, queries,
                           mechanism_name="gaussian", parameter="noise_multiplier", **options)


def calibrate_subsampled_gaussian(epsilon: float, delta: float, queries: int, sampling_probability: float,
                                  **options: Unpack[NoiseOptions]) -> Calibration:
    """Smallest noise multiplier of the Poisson-subsampled Gaussian with rate q (Mironov, Talwar &
    Zhang 2019; add-or-remove-one), the DP-SGD / Opacus setting.

    Args:
        epsilon: the target epsilon of the whole run (> 0, <= MAX_TARGET_EPSILON).
        delta: the target delta, in (0, 1).
        queries: the number of queries Q composed, in [1, MAX_QUERIES].
        sampling_probability: the Poisson sampling rate q, in (0, 1].
        **options: calibrate_noise's options (NoiseOptions: accountant, orders, method,
            value_discretization_interval, compare_pld).

    Returns:
        The Calibration: the value, its forward epsilon (<= epsilon, >= (1 - CALIBRATION_TOLERANCE)
        epsilon) and the mechanism built with it.

    Raises:
        ValueError: if a target or option is out of range, or no value meets the target (calibrate_noise).
    """
    q = require_finite("sampling_probability", sampling_probability)
    require(0.0 < q <= 1.0, f"sampling_probability must be in (0, 1], got {q:g}")
    return calibrate_noise(lambda z: PoissonSubsampledGaussian(z, q), epsilon, delta, queries,
                           mechanism_name="subsampled-gaussian", parameter="noise_multiplier",
                           fixed={"sample_rate": q}, **options)


def calibrate_screening(epsilon: float, delta: float, queries: int, teachers: int, lam: float,
                        **options: Unpack[NoiseOptions]) -> Calibration:
    """Smallest sigma of AdaPMixED's noisy screening: RDP (lam / (N sigma))^2 a per query
    (Flemings et al. 2024, Theorem 4.1), a Gaussian with noise multiplier N sigma / (lam sqrt 2).

    Args:
        epsilon: the target epsilon of the whole run (> 0, <= MAX_TARGET_EPSILON).
        delta: the target delta, in (0, 1).
        queries: the number of queries Q composed, in [1, MAX_QUERIES].
        teachers: the ensemble size N.
        lam: the screen's lambda (> 0).
        **options: calibrate_noise's options (NoiseOptions: accountant, orders, method,
            value_discretization_interval, compare_pld).

    Returns:
        The Calibration: the value, its forward epsilon (<= epsilon, >= (1 - CALIBRATION_TOLERANCE)
        epsilon) and the mechanism built with it.

    Raises:
        ValueError: if a target or option is out of range, or no value meets the target (calibrate_noise).
    """
    probe = NoisyScreening(teachers=teachers, lam=lam, sigma=1.0)
    require(probe.lam > 0, "lam must be > 0 to calibrate the screen (lam = 0 reads no teacher and costs nothing)")
    return calibrate_noise(lambda s: NoisyScreening(teachers=probe.teachers, lam=probe.lam, sigma=s), epsilon, delta,
                           queries, mechanism_name="screening", parameter="sigma",
                           fixed={"teachers": probe.teachers, "lam": probe.lam}, **options)


def calibrate_gnmax(epsilon: float, delta: float, queries: int, **options: Unpack[NoiseOptions]) -> Calibration:
    """Smallest GNMax sigma (votes): RDP a / sigma^2 per query (Papernot et al. 2018, Proposition 8).

    Args:
        epsilon: the target epsilon of the whole run (> 0, <= MAX_TARGET_EPSILON).
        delta: the target delta, in (0, 1).
        queries: the number of queries Q composed, in [1, MAX_QUERIES].
        **options: calibrate_noise's options (NoiseOptions: accountant, orders, method,
            value_discretization_interval, compare_pld).

    Returns:
        The Calibration: the value, its forward epsilon (<= epsilon, >= (1 - CALIBRATION_TOLERANCE)
        epsilon) and the mechanism built with it.

    Raises:
        ValueError: if a target or option is out of range, or no value meets the target (calibrate_noise).
    """
    return calibrate_noise(GNMax, epsilon, delta, queries, mechanism_name="gnmax", parameter="sigma", **options)


def calibrate_confident_gnmax(epsilon: float, delta: float, queries: int, *, ratio: float = 1.0,
                              threshold: float = 0.0, mechanism_name: str = "confident-gnmax",
                              relation: NeighbouringRelation | str = NeighbouringRelation.REPLACE_ONE,
                              **options: Unpack[NoiseOptions]) -> Calibration:
    """Smallest GNMax sigma s2 with the screen's s1 = ratio * s2 (default s1 = s2), every query charged
    a / (2 s1^2) + a / s2^2 (Papernot et al. 2018, Algorithm 1 and Proposition 8; released-output
    accounting). Hot PATE's DP argmax (Cohen et al. 2023) is this mechanism.

    Args:
        epsilon: the target epsilon of the whole run (> 0, <= MAX_TARGET_EPSILON).
        delta: the target delta, in (0, 1).
        queries: the number of queries Q composed, in [1, MAX_QUERIES].
        ratio: s1 / s2, in [1 / MAX_NOISE_RATIO, MAX_NOISE_RATIO].
        threshold: the screen's threshold T on the noisy largest count.
        mechanism_name: the name recorded.
        relation: the neighbouring relation the run claims (GNMax's sensitivity follows it:
            Papernot et al. 2018, Proposition 8; the screen's count has sensitivity 1 under every one).
        **options: calibrate_noise's options (NoiseOptions: accountant, orders, method,
            value_discretization_interval, compare_pld).

    Returns:
        The Calibration: the value, its forward epsilon (<= epsilon, >= (1 - CALIBRATION_TOLERANCE)
        epsilon) and the mechanism built with it; `fixed` also records sigma_threshold.

    Raises:
        ValueError: if a target or option is out of range, or no value meets the target (calibrate_noise).
    """
    ratio = require_positive("ratio", ratio)
    require(1.0 / MAX_NOISE_RATIO <= ratio <= MAX_NOISE_RATIO,
            f"ratio must be in [{1.0 / MAX_NOISE_RATIO:g}, {MAX_NOISE_RATIO:g}] (s1 = ratio * s2: beyond it one noise's "
            "RDP is under 1e-12 of the other's, so calibrate the other alone: gnmax for s2, gaussian for s1), "
            f"got {ratio:g}")
    relation = neighbouring_relation(relation)
    ConfidentGNMax(threshold=threshold, sigma_threshold=1.0, sigma=1.0, relation=relation)  # validates them

    def factory(s2: float) -> ConfidentGNMax:
        return ConfidentGNMax(threshold=threshold, sigma_threshold=ratio * s2, sigma=s2, relation=relation)

    result = calibrate_noise(factory, epsilon, delta, queries, mechanism_name=mechanism_name, parameter="sigma",
                             fixed={"ratio": ratio, "threshold": threshold}, **options)
    return _with_fixed(result, sigma_threshold=factory(result.value).sigma_threshold)


def calibrate_dpws(epsilon: float, delta: float, queries: int, *, threshold: float = 1.0, gamma: float = 1.0,
                   voters: int | None = None, relation: NeighbouringRelation | str = NeighbouringRelation.REPLACE_ONE,
                   **options: Unpack[NoiseOptions]) -> Calibration:
    """Smallest DPWS sigma (votes): Gaussian-noised counts, RDP a / sigma^2 per query (Mironov 2017,
    Corollary 3 at L2 sensitivity sqrt 2); TWS is post-processing. threshold and gamma do not enter
    the RDP (recorded).

    Args:
        epsilon: the target epsilon of the whole run (> 0, <= MAX_TARGET_EPSILON).
        delta: the target delta, in (0, 1).
        queries: the number of queries Q composed, in [1, MAX_QUERIES].
        threshold: the TWS threshold (recorded).
        gamma: the TWS gamma (recorded).
        voters: the number of voters, or None.
        relation: the neighbouring relation (a NeighbouringRelation or its name).
        **options: calibrate_noise's options (NoiseOptions: accountant, orders, method,
            value_discretization_interval, compare_pld).

    Returns:
        The Calibration: the value, its forward epsilon (<= epsilon, >= (1 - CALIBRATION_TOLERANCE)
        epsilon) and the mechanism built with it.

    Raises:
        ValueError: if a target or option is out of range, or no value meets the target (calibrate_noise).
    """
    relation = neighbouring_relation(relation)
    DPWeightedSampler(1.0, threshold, gamma, relation, voters)  # validates the fixed parameters

    def factory(sigma: float) -> DPWeightedSampler:
        return DPWeightedSampler(sigma, threshold, gamma, relation, voters)

    return calibrate_noise(factory, epsilon, delta, queries, mechanism_name="dpws", parameter="sigma",
                           fixed={"threshold": threshold, "gamma": gamma, "voters": voters}, **options)


def calibrate_scale(factory: Callable[[float], Mechanism], epsilon: float, delta: float, queries: int, *,
                    mechanism_name: str, parameter: str, fixed: dict[str, object] | None = None, accountant: str = "rdp",
                    orders: Sequence[float] = DEFAULT_ORDERS, method: ConversionMethod | str = ConversionMethod.IMPROVED,
                    compare_pld: bool = False, **options: Unpack[PldOptions]) -> Calibration:
    """The smallest noise scale `parameter` (epsilon decreases as it grows) for which `factory(value)`
    composed `queries` times accounts to at most `epsilon` at `delta`.

    A mechanism with a Gaussian DpEvent goes to `calibrate_noise` (dp-accounting's calibration, then
    dpledger's forward check). Any other is solved by bisection on dpledger's own RDP accounting: its
    curve composed Q times (Mironov 2017, Proposition 1) and converted (Balle et al. 2020, Theorem 21,
    or Mironov 2017, Proposition 3), bracketed by factors of 2 from 1 and bisected until
    target (1 - 1e-7) <= forward <= target; RDP only (no DpEvent, no PLD). ValueError when no scale
    can meet the target (the conversion term at the grid's largest order is a floor).

    Args:
        factory: builds the mechanism from a value of the parameter (> 0).
        epsilon: the target epsilon of the whole run (> 0, <= MAX_TARGET_EPSILON).
        delta: the target delta, in (0, 1).
        queries: the number of queries Q composed, in [1, MAX_QUERIES].
        mechanism_name: the mechanism's name, for records and messages.
        parameter: the parameter's name.
        fixed: the other parameters, recorded as they are.
        accountant: "rdp", or "pld" for a mechanism with a Gaussian DpEvent.
        orders: the RDP orders (> 1).
        method: the RDP -> (epsilon, delta) conversion (ConversionMethod or its name).
        compare_pld: also compute (or say why not) the PLD epsilon of the answer.
        **options: value_discretization_interval, for a Gaussian mechanism (calibrate_noise).

    Returns:
        The Calibration (forward epsilon <= epsilon, >= (1 - CALIBRATION_TOLERANCE) epsilon).

    Raises:
        ValueError: if a target or option is out of range, an option is given that a non-Gaussian
            mechanism does not take, the accountant is "pld" for one, or no scale meets the target.
    """
    probe = factory(1.0)
    with np.errstate(over="ignore", divide="ignore"):
        event = probe.dp_event()
    if event is not None and _noise_per_unit(event) is not None:
        return calibrate_noise(factory, epsilon, delta, queries, mechanism_name=mechanism_name, parameter=parameter,
                               accountant=accountant, orders=orders, method=method, compare_pld=compare_pld,
                               fixed=fixed, **options)
    require(not options, f"unknown calibration options {sorted(options)} for {mechanism_name}")
    epsilon, delta, queries = _target(epsilon, delta, queries)
    reason = probe.no_pld_reason() or f"{mechanism_name} has no Gaussian DpEvent: RDP only"
    require(_accountant(accountant) == "rdp", f"{reason} (calibrate with the rdp accountant)")
    method = require_member(ConversionMethod, "method", method)
    orders = canonical_orders(orders)
    floor = _rdp_floor(orders, delta, method, probe.relation)
    require(epsilon > floor, f"epsilon = {epsilon:g} is out of reach: on this order grid (largest order "
                             f"{orders[-1]:g}) no noise accounts below {floor:.6g} at delta = {delta:g} (the RDP -> "
                             "DP conversion term); add larger orders")

    @functools.lru_cache(maxsize=None)
    def forward(value: float) -> float:
        return _rdp_forward(factory(value), queries, delta, orders, method)[0]

    bracket = _bracket(forward, epsilon, 1.0, False, 1e-300, 1e300)
    if bracket is None:
        raise ValueError(f"epsilon = {epsilon:g} is out of reach for {mechanism_name}")
    value = _finish(forward, epsilon, *bracket)
    mechanism = factory(value)
    rdp_epsilon, rdp_order, grid_warnings = _rdp_forward(mechanism, queries, delta, orders, method)
    notes = (f"no PLD epsilon beside the RDP one: {reason}",) if compare_pld else ()
    return Calibration(mechanism_name, parameter, value, epsilon, delta, queries, "rdp", rdp_epsilon, rdp_epsilon,
                       rdp_order, None, mechanism, dict(fixed or {}), notes, grid_warnings)


def _with_fixed(result: Calibration, **extra: object) -> Calibration:
    return dataclasses.replace(result, fixed={**result.fixed, **extra})


# ---- PMixED: the largest beta ----

def calibrate_pmixed(epsilon: float, delta: float, queries: int, alpha: float, teachers: int, *,
                     ball: Ball | str | None = None, sampling_probability: float | None = None,
                     variant: SubsamplingVariant | str | None = None, seed: int = 0,
                     orders: Sequence[float] | None = None, method: ConversionMethod | str = ConversionMethod.IMPROVED,
                     accountant: str = "rdp") -> Calibration:
    """The largest PMixED beta whose Q-query curve converts to at most `epsilon` at `delta`.

    Per query Theorem 3.1 (Flemings et al. 2024; "as claimed" for the paper's projection-order ball,
    proven at orders <= alpha for ball = proof-orders and at every order for ball = all-orders); composed Q
    times (Mironov 2017, Proposition 1);
    converted by Balle et al. 2020, Theorem 21 (or Mironov 2017, Proposition 3); with
    `sampling_probability`, Poisson subsampling of teachers (Flemings et al. 2024, Theorem A.4;
    Zhu & Wang 2019) with `variant`, by default the proven one (SubsamplingVariant.ALL_ORDERS_BALL,
    which needs ball = all-orders; docs/soundness.md). Lemma C.1's beta for the RDP budget `epsilon`
    at order alpha starts a bisection on beta (epsilon is increasing in beta). The grid is the
    default one plus alpha. ValueError when even beta -> 0 accounts over the target (the conversion
    term at the orders the ball covers), and for accountant "pld": PMixED has no PLD in dp-accounting.

    Args:
        epsilon: the target epsilon of the whole run (> 0, <= MAX_TARGET_EPSILON).
        delta: the target delta, in (0, 1).
        queries: the number of queries Q, in [1, MAX_QUERIES].
        alpha: PMixED's projection order (> 1).
        teachers: the ensemble size N.
        ball: the Ball (or its name); None: all-orders with subsampling (or with the all-orders-ball
            variant), the projection-order ball otherwise.
        sampling_probability: the Poisson sampling rate of teachers, in [0, 1], or None for none.
        variant: the SubsamplingVariant (or its name); needs sampling_probability.
        seed: the seed of the realised-size variants' draws (>= 0).
        orders: orders added to the default grid (alpha is always added).
        method: the RDP -> (epsilon, delta) conversion (ConversionMethod or its name).
        accountant: "rdp" (the only one PMixED has).

    Returns:
        The Calibration of beta (forward epsilon <= epsilon, >= (1 - CALIBRATION_TOLERANCE) epsilon).

    Raises:
        ValueError: if a target or parameter is out of range, a variant comes without a sampling
            probability, the accountant is not "rdp", or even beta -> 0 accounts over the target.
    """
    epsilon, delta, queries = _target(epsilon, delta, queries)
    require(_accountant(accountant) == "rdp", "PMixED has no DpEvent: no PLD in dp-accounting; RDP only "
                                              "(calibrate with the rdp accountant)")
    method = require_member(ConversionMethod, "method", method)
    probe = PMixED(alpha, 0.0, teachers)  # validates alpha and teachers
    alpha, teachers = probe.alpha, probe.teachers
    seed = require_int_at_least("seed", seed, 0)
    if variant is not None:
        variant = subsampling_variant(variant)
        require(sampling_probability is not None, "a subsampling variant needs sampling_probability")
    if ball is None:
        if variant is not None:
            ball = Ball.ALL_ORDERS if variant is SubsamplingVariant.ALL_ORDERS_BALL else Ball.PROJECTION_ORDER
        else:
            ball = Ball.ALL_ORDERS if sampling_probability is not None else Ball.PROJECTION_ORDER
    ball = ball_named(ball)
    if sampling_probability is not None:
        if variant is None:
            variant = (SubsamplingVariant.ALL_ORDERS_BALL if ball is Ball.ALL_ORDERS
                       else SubsamplingVariant.WORST_CASE_SIZE_GENERAL)
        sampling_probability = require_in_closed("sampling_probability", sampling_probability, 0.0, 1.0)
        require_subsampling_work(teachers, queries, variant.uses_realised_sizes)
    grid = default_orders(alpha, *(orders or ()))

    def mechanism(beta: float) -> PMixED:
        return PMixED(alpha, beta, teachers, ball=ball)

    def curve(beta: float) -> RdpCurve:
        if sampling_probability is None:
            return mechanism(beta).rdp_curve(grid).composed(queries)
        if variant is None:   # set above whenever sampling_probability is
            raise ValueError("internal: Poisson subsampling of teachers without a variant")
        return subsampled_pmixed_curve(mechanism(beta), sampling_probability, variant, queries, seed, grid)

    def forward_result(beta: float) -> tuple[EpsilonConversion, tuple[str, ...]]:
        # a beta the bracket doubles past double range overflows Theorem 3.1's exponent: +inf, no guarantee, is right
        with warnings.catch_warnings(record=True) as caught, np.errstate(over="ignore"):
            warnings.simplefilter("always", GridEdgeWarning)
            result = epsilon_from_rdp(curve(beta), delta, method)
        return result, tuple(str(w.message) for w in caught if issubclass(w.category, GridEdgeWarning))

    @functools.lru_cache(maxsize=None)
    def forward(beta: float) -> float:
        return float(forward_result(beta)[0].epsilon)

    lowest = 1e-30
    floor = forward(lowest)
    require(epsilon > floor,
            f"epsilon = {epsilon:g} is out of reach for PMixED: even beta -> 0 accounts to {floor:.6g} at delta = "
            f"{delta:g} over {queries} queries (the RDP -> DP conversion term at the orders the ball covers, <= "
            f"alpha = {alpha:g} for the projection-order ball); raise epsilon, delta or alpha")
    guess = beta_from_budget(epsilon, queries, alpha, teachers)  # Lemma C.1: the RDP budget at order alpha
    bracket = _bracket(forward, epsilon, guess, True, lowest, 1e300)
    if bracket is None:
        raise ValueError(f"epsilon = {epsilon:g} is out of reach for PMixED")
    beta = _finish(forward, epsilon, *bracket)
    result, grid_warnings = forward_result(beta)
    notes = [] if (ball is not Ball.PROJECTION_ORDER and (variant is None or variant.proven)) else [
        "Theorem 3.1 as claimed (projection-order ball): ball = proof-orders or all-orders is a proven projection "
        "(docs/soundness.md)" if variant is None else f"variant {variant}: {variant.soundness}"]
    fixed: dict[str, object] = {"alpha": alpha, "teachers": teachers, "ball": ball.value, "sample_rate": sampling_probability,
             "variant": None if variant is None else variant.value}
    if variant is not None and variant.uses_realised_sizes:
        fixed["seed"] = seed
    return Calibration("pmixed", "beta", beta, epsilon, delta, queries, "rdp", float(result.epsilon),
                       float(result.epsilon), result.order, None, mechanism(beta), fixed, tuple(notes), grid_warnings)


PMIXED_CANDIDATE_ORDERS: tuple[float, ...] = (2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
"""The projection orders `calibrate_pmixed_order` tries (Flemings et al. 2024 use 6; dp-accounting's
grid spans 1.25 to 256)."""


def calibrate_pmixed_order(epsilon: float, delta: float, queries: int, teachers: int, *,
                           ball: Ball | str = Ball.PROOF_ORDERS,
                           alphas: Sequence[float] = PMIXED_CANDIDATE_ORDERS,
                           method: ConversionMethod | str = ConversionMethod.IMPROVED) -> Calibration:
    """PMixED's calibration (`calibrate_pmixed`) at the projection order that allows the largest beta.

    beta is the comparable quantity across orders: for a teacher near the public law, D_k(pbar || p0)
    is about k chi^2(pbar || p0) / 2 at every order k (van Erven & Harremoes 2014, Section on small
    perturbations), so the ball D_k <= beta k is chi^2 <= 2 beta whatever its order; the largest beta
    lets every such teacher keep the most weight. The choice reads the budget only, never the data, so
    it costs no privacy. Orders whose target is out of reach (the projection-order and proof-orders
    curves are +inf above alpha, so the conversion term at orders <= alpha may exceed epsilon) are
    skipped.

    Args:
        epsilon: the target epsilon of the whole run (> 0).
        delta: the target delta, in (0, 1).
        queries: the number of queries Q (>= 1).
        teachers: the ensemble size N.
        ball: the Ball (or its name).
        alphas: the candidate projection orders (each > 1).
        method: the RDP -> (epsilon, delta) conversion.

    Returns:
        The Calibration with the largest beta (its `fixed["alpha"]` is the order chosen; ties go to
        the smaller order).

    Raises:
        ValueError: if a target or parameter is out of range, `alphas` is empty, or no candidate
            order reaches the target.
    """
    require(len(alphas) > 0, "alphas must name at least one projection order, got none")
    best: Calibration | None = None
    refusals = []
    for alpha in sorted(float(a) for a in alphas):
        try:
            result = calibrate_pmixed(epsilon, delta, queries, alpha, teachers, ball=ball, method=method)
        except ValueError as error:
            if "out of reach" not in str(error):
                raise
            refusals.append(f"{alpha:g}")
            continue
        if best is None or result.value > best.value:
            best = result
    if best is None:
        raise ValueError(f"epsilon = {epsilon:g} is out of reach for PMixED (ball = {ball_named(ball).value}) at every "
                         f"candidate order ({', '.join(refusals)}) at delta = {delta:g} over {queries} queries; "
                         "raise epsilon or delta, or try larger orders")
    return best
