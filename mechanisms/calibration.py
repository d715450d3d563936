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

import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from accounting.conversion import ConversionMethod, GridEdgeWarning, epsilon_from_rdp
from accounting.curve import RdpCurve
from accounting.errors import require, require_finite, require_in_open, require_int_at_least, require_member, require_positive
from accounting.orders import DEFAULT_ORDERS, canonical_orders, default_orders
from accounting.relation import NeighbouringRelation, neighbouring_relation
from mechanisms.base import Mechanism
from mechanisms.dp_events import dp_accounting_relation, effective_gaussian_noise_multiplier
from mechanisms.gaussian import GaussianMechanism, PoissonSubsampledGaussian
from mechanisms.hot_pate import DPWeightedSampler
from mechanisms.pate import ConfidentGNMax, GNMax
from mechanisms.pld import (PLD_NOISE_LIMIT, PLD_VALUE_DISCRETIZATION_INTERVAL, composed_event, pld_epsilon,
                           simplified_event)
from mechanisms.pmixed import (Ball, PMixED, SubsamplingVariant, ball_named, beta_from_budget, subsampled_pmixed_curve,
                               subsampling_variant)
from mechanisms.screening import NoisyScreening

ACCOUNTANTS = ("rdp", "pld")
CALIBRATION_TOLERANCE = 0.01
"""Every answer accounts forward to at least (1 - CALIBRATION_TOLERANCE) * target, and at most target."""
_SEARCH_GAP = 1e-7  # the bisection stops once forward >= target * (1 - _SEARCH_GAP)
_PLD_SEARCH_GAP = 1e-4
_MAX_STEPS = 4000


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
    fixed: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def slack(self) -> float:
        return self.target_epsilon - self.forward_epsilon

    @property
    def relative_slack(self) -> float:
        return self.slack / self.target_epsilon

    def to_record(self) -> dict:
        """A JSON-ready dict (strict_json_text turns +inf into null with a reason)."""
        return {"mechanism": self.mechanism_name, "parameter": self.parameter, "value": self.value,
                "target_epsilon": self.target_epsilon, "delta": self.delta, "queries": self.queries,
                "accountant": self.accountant, "forward_epsilon": self.forward_epsilon, "slack": self.slack,
                "relative_slack": self.relative_slack, "rdp_epsilon": self.rdp_epsilon, "rdp_order": self.rdp_order,
                "pld_epsilon": self.pld_epsilon, "relation": self.mechanism.relation.value, "fixed": dict(self.fixed),
                "tolerance": CALIBRATION_TOLERANCE, "notes": list(self.notes), "warnings": list(self.warnings)}


# ---- validation ----

def _target(epsilon, delta, queries) -> tuple[float, float, int]:
    epsilon = require_positive("epsilon", epsilon)
    delta = require_in_open("delta", delta, 0.0, 1.0)
    queries = require_int_at_least("queries", queries, 1)
    return epsilon, delta, queries


def _accountant(accountant: str) -> str:
    require(accountant in ACCOUNTANTS, f"accountant must be one of {list(ACCOUNTANTS)}, got {accountant!r}")
    return accountant


# ---- forward accounting ----

def _rdp_forward(mechanism: Mechanism, queries: int, delta: float, orders, method):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GridEdgeWarning)
        result = epsilon_from_rdp(mechanism.rdp_curve(orders).composed(queries), delta, method)
    return float(result.epsilon), result.order, tuple(str(w.message) for w in caught)


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


def _finish(forward, target, good, bad, gap: float = _SEARCH_GAP) -> float:
    value = _search(forward, target, good, bad, gap)
    achieved = forward(value)
    require(achieved <= target, "internal: the calibrated parameter accounts over the target")
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
"""Beyond this epsilon (or below mechanisms.pld.PLD_NOISE_LIMIT) the PLD's loss grid is too large to
compute in reasonable time (measured: epsilon 500 over one query ran past 250 s); calibration with
the PLD accountant refuses such targets and points to the RDP accountant."""


def calibrate_noise(factory: Callable[[float], Mechanism], epsilon: float, delta: float, queries: int, *,
                    mechanism_name: str, parameter: str, accountant: str = "rdp",
                    orders: Sequence[float] = DEFAULT_ORDERS, method=ConversionMethod.IMPROVED,
                    value_discretization_interval: float = PLD_VALUE_DISCRETIZATION_INTERVAL,
                    compare_pld: bool = False, fixed: dict | None = None) -> Calibration:
    """The smallest value of `parameter` (a noise scale: epsilon decreases as it grows) for which
    `factory(value)` composed `queries` times accounts to at most `epsilon` at `delta`.

    dp-accounting's calibrate_dp_mechanism (Brent's method) solves on the mechanism's DpEvent with
    a fresh RdpAccountant on `orders` or PLDAccountant per evaluation; dpledger then accounts the
    answer forward (its RDP curve and conversion, or the PLD of its event) and bisects until
    target (1 - 1e-7) <= forward <= target (1e-4 for PLD), so dp-accounting's and dpledger's rounding never leave
    the answer over the target. ValueError when no noise can meet the target (with RDP, the
    conversion term at the largest order of the grid is a floor).
    """
    from dp_accounting import SelfComposedDpEvent, mechanism_calibration
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    epsilon, delta, queries = _target(epsilon, delta, queries)
    accountant = _accountant(accountant)
    method = require_member(ConversionMethod, "method", method)
    orders = canonical_orders(orders)
    probe = factory(1.0)
    require(probe.dp_event() is not None, f"{mechanism_name} has no DpEvent: calibrate it by bisection instead")
    relation = dp_accounting_relation(probe.relation, probe.dp_event())  # ValueError for a one-sided relation

    @functools.lru_cache(maxsize=None)
    def rdp_forward(value: float) -> float:
        return _rdp_forward(factory(value), queries, delta, orders, method)[0]

    @functools.lru_cache(maxsize=None)
    def pld_forward(value: float) -> float:
        return pld_epsilon(composed_event(factory(value), queries), delta, probe.relation, value_discretization_interval)

    rdp_floor = _rdp_floor(orders, delta, method, probe.relation)
    if accountant == "rdp":
        require(epsilon > rdp_floor,
                f"epsilon = {epsilon:g} is out of reach: on this order grid (largest order {orders[-1]:g}) no noise "
                f"accounts below {rdp_floor:.6g} at delta = {delta:g} (the RDP -> DP conversion term); add larger "
                "orders or use the PLD accountant")
    unit = _noise_per_unit(probe.dp_event())  # the event's z per unit of the parameter
    require(unit is not None and 0 < unit < math.inf, f"internal: {mechanism_name} is not a Gaussian-noise mechanism")
    guess = _gaussian_guess(epsilon, delta, queries) / unit
    forward = rdp_forward if accountant == "rdp" else pld_forward
    # bracket with the cheap RDP forward first; for PLD, start from the RDP answer's neighbourhood
    bracket = _bracket(rdp_forward, epsilon, guess, False, 1e-300, 1e300) if epsilon > rdp_floor else None
    if accountant == "pld":
        start = bracket[0] if bracket is not None else guess
        # the PLD is discretised on a grid of privacy losses: a tiny composed noise spans so many points that
        # dp-accounting runs for minutes; refuse what the RDP answer already shows to be out of the grid's range
        composed_z = effective_gaussian_noise_multiplier(composed_event(factory(start), queries))
        require(epsilon <= PLD_EPSILON_LIMIT, f"epsilon = {epsilon:g} is above the PLD accountant's limit "
                f"{PLD_EPSILON_LIMIT:g} (its loss grid, interval {value_discretization_interval:g}, would be too large); "
                "use the RDP accountant")
        require(composed_z is None or composed_z >= PLD_NOISE_LIMIT,
                f"epsilon = {epsilon:g} at delta = {delta:g} needs a composed noise multiplier of about "
                f"{composed_z:.3g}: too little noise for the PLD accountant's grid (interval "
                f"{value_discretization_interval:g}; limit noise >= {PLD_NOISE_LIMIT:g}); use the RDP accountant")
        # the parameter at which the composed noise reaches the grid's limit (the noise scales with the parameter)
        lowest = start * PLD_NOISE_LIMIT / composed_z if composed_z is not None else 1e-300
        require(composed_z is None or pld_forward(lowest) > epsilon,
                f"epsilon = {epsilon:g} at delta = {delta:g}: even noise down to the PLD grid's limit (composed noise "
                f"multiplier {PLD_NOISE_LIMIT:g}) accounts below it, so the smallest noise is out of the PLD "
                "accountant's range; use the RDP accountant")
        bracket = _bracket(pld_forward, epsilon, max(start, lowest), False, lowest, 1e300)
    require(bracket is not None, f"epsilon = {epsilon:g} is out of reach for {mechanism_name}")
    good, bad = bracket

    def fresh_accountant():
        if accountant == "rdp":
            return RdpAccountant(list(orders), relation)
        return PLDAccountant(relation, value_discretization_interval)

    def event_of(value: float):
        return SelfComposedDpEvent(simplified_event(factory(value).dp_event()), queries)

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
    pld = pld_forward(value) if accountant == "pld" or compare_pld else None
    notes = []
    if accountant == "pld":
        notes.append(f"calibrated with dp-accounting's PLD (pessimistic estimate, value_discretization_interval = "
                     f"{value_discretization_interval:g}): only as good as the PLD accounting that will report it; "
                     f"dpledger's RDP ledger states epsilon = {rdp_epsilon:.6g} for this noise")
    return Calibration(mechanism_name, parameter, value, epsilon, delta, queries, accountant,
                       pld if accountant == "pld" else rdp_epsilon, rdp_epsilon, rdp_order, pld, mechanism,
                       dict(fixed or {}), tuple(notes), grid_warnings)


def _noise_per_unit(event) -> float | None:
    """The Gaussian noise multiplier of `event` (through a Poisson-sampling step) at parameter 1."""
    from dp_accounting import PoissonSampledDpEvent

    return effective_gaussian_noise_multiplier(event.event if isinstance(event, PoissonSampledDpEvent) else event)


def _rdp_floor(orders, delta, method, relation) -> float:
    """The epsilon an RDP curve of (almost) 0 converts to on `orders`: the infimum over all noise
    levels, the conversion term at the best order (Balle et al. 2020, Theorem 21: log((a-1)/a) -
    (log delta + log a) / (a - 1); Mironov 2017, Proposition 3 for the classic method), below which
    no noise reaches on this grid."""
    tiny = RdpCurve(orders, np.full(len(orders), 1e-300), relation)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        return float(epsilon_from_rdp(tiny, delta, method).epsilon)


def calibrate_gaussian(epsilon: float, delta: float, queries: int, *,
                       relation=NeighbouringRelation.ADD_OR_REMOVE_ONE, **options) -> Calibration:
    """Smallest Gaussian noise multiplier (noise std / L2 sensitivity): RDP a / (2 z^2) per query
    (Mironov 2017, Proposition 7 / Corollary 3)."""
    relation = neighbouring_relation(relation)
    return calibrate_noise(lambda z: GaussianMechanism(z, relation=relation), epsilon, delta, queries,
                           mechanism_name="gaussian", parameter="noise_multiplier", **options)


def calibrate_subsampled_gaussian(epsilon: float, delta: float, queries: int, sampling_probability: float,
                                  **options) -> Calibration:
    """Smallest noise multiplier of the Poisson-subsampled Gaussian with rate q (Mironov, Talwar &
    Zhang 2019; add-or-remove-one), the DP-SGD / Opacus setting."""
    q = require_finite("sampling_probability", sampling_probability)
    require(0.0 < q <= 1.0, f"sampling_probability must be in (0, 1], got {q:g}")
    return calibrate_noise(lambda z: PoissonSubsampledGaussian(z, q), epsilon, delta, queries,
                           mechanism_name="subsampled-gaussian", parameter="noise_multiplier",
                           fixed={"sample_rate": q}, **options)


def calibrate_screening(epsilon: float, delta: float, queries: int, teachers: int, lam: float,
                        **options) -> Calibration:
    """Smallest sigma of AdaPMixED's noisy screening: RDP (lam / (N sigma))^2 a per query
    (Flemings et al. 2024, Theorem 4.1), a Gaussian with noise multiplier N sigma / (lam sqrt 2)."""
    probe = NoisyScreening(teachers=teachers, lam=lam, sigma=1.0)
    require(probe.lam > 0, "lam must be > 0 to calibrate the screen (lam = 0 reads no teacher and costs nothing)")
    return calibrate_noise(lambda s: NoisyScreening(teachers=probe.teachers, lam=probe.lam, sigma=s), epsilon, delta,
                           queries, mechanism_name="screening", parameter="sigma",
                           fixed={"teachers": probe.teachers, "lam": probe.lam}, **options)


def calibrate_gnmax(epsilon: float, delta: float, queries: int, **options) -> Calibration:
    """Smallest GNMax sigma (votes): RDP a / sigma^2 per query (Papernot et al. 2018, Proposition 8)."""
    return calibrate_noise(GNMax, epsilon, delta, queries, mechanism_name="gnmax", parameter="sigma", **options)


def calibrate_confident_gnmax(epsilon: float, delta: float, queries: int, *, ratio: float = 1.0,
                              threshold: float = 0.0, mechanism_name: str = "confident-gnmax",
                              **options) -> Calibration:
    """Smallest GNMax sigma s2 with the screen's s1 = ratio * s2 (default s1 = s2), every query charged
    a / (2 s1^2) + a / s2^2 (Papernot et al. 2018, Algorithm 1 and Proposition 8; released-output
    accounting). Hot PATE's DP argmax (Cohen et al. 2023) is this mechanism."""
    ratio = require_positive("ratio", ratio)
    ConfidentGNMax(threshold=threshold, sigma_threshold=1.0, sigma=1.0)  # validates the threshold

    def factory(s2: float) -> ConfidentGNMax:
        return ConfidentGNMax(threshold=threshold, sigma_threshold=ratio * s2, sigma=s2)

    result = calibrate_noise(factory, epsilon, delta, queries, mechanism_name=mechanism_name, parameter="sigma",
                             fixed={"ratio": ratio, "threshold": threshold}, **options)
    return _with_fixed(result, sigma_threshold=result.mechanism.sigma_threshold)


def calibrate_dpws(epsilon: float, delta: float, queries: int, *, threshold: float = 1.0, gamma: float = 1.0,
                   voters: int | None = None, relation=NeighbouringRelation.REPLACE_ONE, **options) -> Calibration:
    """Smallest DPWS sigma (votes): Gaussian-noised counts, RDP a / sigma^2 per query (Mironov 2017,
    Corollary 3 at L2 sensitivity sqrt 2); TWS is post-processing. threshold and gamma do not enter
    the RDP (recorded)."""
    relation = neighbouring_relation(relation)
    DPWeightedSampler(1.0, threshold, gamma, relation, voters)  # validates the fixed parameters

    def factory(sigma: float) -> DPWeightedSampler:
        return DPWeightedSampler(sigma, threshold, gamma, relation, voters)

    return calibrate_noise(factory, epsilon, delta, queries, mechanism_name="dpws", parameter="sigma",
                           fixed={"threshold": threshold, "gamma": gamma, "voters": voters}, **options)


def _with_fixed(result: Calibration, **extra) -> Calibration:
    import dataclasses

    return dataclasses.replace(result, fixed={**result.fixed, **extra})


# ---- PMixED: the largest beta ----

def calibrate_pmixed(epsilon: float, delta: float, queries: int, alpha: float, teachers: int, *,
                     ball: Ball | str | None = None, sampling_probability: float | None = None,
                     variant: SubsamplingVariant | str | None = None, seed: int = 0,
                     orders: Sequence[float] | None = None, method=ConversionMethod.IMPROVED,
                     accountant: str = "rdp") -> Calibration:
    """The largest PMixED beta whose Q-query curve converts to at most `epsilon` at `delta`.

    Per query Theorem 3.1 (Flemings et al. 2024; "as claimed" for the paper's projection-order ball,
    proven at every order for ball = all-orders); composed Q times (Mironov 2017, Proposition 1);
    converted by Balle et al. 2020, Theorem 21 (or Mironov 2017, Proposition 3); with
    `sampling_probability`, Poisson subsampling of teachers (Flemings et al. 2024, Theorem A.4;
    Zhu & Wang 2019) with `variant`, by default the proven one (SubsamplingVariant.ALL_ORDERS_BALL,
    which needs ball = all-orders; docs/soundness.md). Lemma C.1's beta for the RDP budget `epsilon`
    at order alpha starts a bisection on beta (epsilon is increasing in beta). The grid is the
    default one plus alpha. ValueError when even beta -> 0 accounts over the target (the conversion
    term at the orders the ball covers), and for accountant "pld": PMixED has no PLD in dp-accounting.
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
    if sampling_probability is not None and variant is None:
        variant = (SubsamplingVariant.ALL_ORDERS_BALL if ball is Ball.ALL_ORDERS
                   else SubsamplingVariant.WORST_CASE_SIZE_GENERAL)
    grid = default_orders(alpha, *(orders or ()))

    def mechanism(beta: float) -> PMixED:
        return PMixED(alpha, beta, teachers, ball=ball)

    def curve(beta: float) -> RdpCurve:
        if sampling_probability is None:
            return mechanism(beta).rdp_curve(grid).composed(queries)
        return subsampled_pmixed_curve(mechanism(beta), sampling_probability, variant, queries, seed, grid)

    def forward_result(beta: float):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", GridEdgeWarning)
            result = epsilon_from_rdp(curve(beta), delta, method)
        return result, tuple(str(w.message) for w in caught)

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
    require(bracket is not None, f"epsilon = {epsilon:g} is out of reach for PMixED")
    beta = _finish(forward, epsilon, *bracket)
    result, grid_warnings = forward_result(beta)
    notes = [] if (ball is Ball.ALL_ORDERS and (variant is None or variant.proven)) else [
        "Theorem 3.1 as claimed (projection-order ball): ball = all-orders is the proven projection "
        "(docs/soundness.md)" if variant is None else f"variant {variant}: {variant.soundness}"]
    fixed = {"alpha": alpha, "teachers": teachers, "ball": ball.value, "sample_rate": sampling_probability,
             "variant": None if variant is None else variant.value}
    if variant is not None and variant.uses_realised_sizes:
        fixed["seed"] = seed
    return Calibration("pmixed", "beta", beta, epsilon, delta, queries, "rdp", float(result.epsilon),
                       float(result.epsilon), result.order, None, mechanism(beta), fixed, tuple(notes), grid_warnings)
