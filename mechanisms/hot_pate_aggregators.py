"""Hot PATE's four aggregators (Cohen et al. 2023) as registered classes.

What each is charged per step (one teacher added or removed moves one count by one: L2 sensitivity
1; one replaced moves a vote: L2 sensitivity sqrt(2); the largest count moves by at most 1 under
every relation; dpledger.mechanisms.voting):
- TARGMAX_T and TWS_{T, gamma}: T-threshold private (robustness, not DP): +inf, "no guarantee".
- DPARGMAX, Confident-GNMax (Papernot et al. 2018, Algorithm 1): the screen alpha / (2 s1^2) every
  step, or with data_dependent_screen its exact data-dependent divergence at the step's largest
  count (`pate.data_dependent_screen_rdp`); the answer GNMax alpha s^2 / (2 s2^2) at the histogram's
  L2 sensitivity s under the run's relation (ibid., Proposition 8) or, data-dependently, Theorem 6 at
  the histogram with that relation's RDP and neighbours (both directions, `GNMax.data_dependent_rdp`).
  accounting = "released-output" charges the answer at every step: the released pair (decision,
  token) has divergence at most screen + answer whichever branch is taken (Mironov 2017, Proposition
  1). "realised-path" charges the answer only where the screen passed (Papernot et al. 2018's
  convention): an ex-post statement about this run, not an RDP bound (docs/soundness.md).
- DPWS: Gaussian noise on every count, then TWS on the noisy counts with the public N as n: the
  Gaussian mechanism's alpha s^2 / (2 sigma^2) every step at the relation's s (post-processing).

`verify_accounts` computes every curve at the claim's relation, so a curve computed at add-or-remove
is never offered as covering replace-one.

Their recorded parameter tables keep the layout runs have always had (threshold, gamma, sigma,
sigma_threshold, data_dependent, whichever the aggregator reads), and their account, verify and
report texts are the ones these aggregators have always printed.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray
from scipy.special import log_ndtr

from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.errors import require, require_bool, require_non_negative, require_positive
from dpledger.accounting.relation import DivergenceDirection, NeighbouringRelation, PathAccounting
from dpledger.mechanisms.aggregation import (AccountingVariant, VoteAggregator, parameter, pick_token,
                                             register_aggregator)
from dpledger.mechanisms.calibration import Calibration, calibrate_confident_gnmax, calibrate_dpws
from dpledger.mechanisms.hot_pate import (DPWeightedSampler, ThresholdWeightedSampler, dpws_draws, dpws_law_bounds,
                                          require_finite_at_least_one, require_vote_threshold)
from dpledger.mechanisms.pate import ConfidentGNMax, GNMax, gnmax_log_output_law
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:  # dp_accounting ships no type information: DpEvent is opaque to mypy
    import torch
    from dp_accounting.dp_event import DpEvent
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light

LEGACY_PARAMETERS = {"threshold": None, "gamma": 1.0, "sigma": None, "sigma_threshold": None, "data_dependent": False,
                     "data_dependent_screen": False}
"""The parameter table every Hot PATE run records, with the value of a key its aggregator does not read
(a manifest written before data_dependent_screen existed reads it as False)."""

_ADD_REMOVE = {NeighbouringRelation.ADD_OR_REMOVE_ONE, NeighbouringRelation.REMOVE_ONE, NeighbouringRelation.ADD_ONE}


class _HotPateAggregator(VoteAggregator):
    """What the four share: the recorded table above and the report's labels."""

    unused_defaults: ClassVar[Mapping[str, Any]] = {"gamma": 1.0, "data_dependent": False,
                                                    "data_dependent_screen": False}

    @classmethod
    def recorded_parameters(cls, parameters: Mapping[str, Any]) -> dict[str, Any]:
        return {key: parameters.get(key, default) for key, default in LEGACY_PARAMETERS.items()}

    @classmethod
    def label(cls, parameters: Mapping[str, Any]) -> str:
        """"T=2" or, for the aggregators with a gamma, "T=2, gamma=1.5"."""
        gamma = f", gamma={parameters['gamma']:g}" if "gamma" in cls.parameter_fields() else ""
        return f"T={parameters['threshold']:g}{gamma}"

    @classmethod
    def statement_parameters(cls, parameters: Mapping[str, Any]) -> str:
        """"T=2, sigma=1, sigma_threshold=1": the threshold and the noise the aggregator reads."""
        fields = cls.parameter_fields()
        noise = "".join(f", {name}={parameters[name]:g}" for name in ("gamma", "sigma", "sigma_threshold")
                        if parameters.get(name) is not None and name in fields)
        return f"T={parameters['threshold']:g}{noise}"


def _vote_count_threshold(aggregator: _ThresholdPrivate, teachers: int) -> float:
    """TARGMAX's and TWS's T in a decode: a positive integer vote count <= N (else no token could pass)."""
    threshold = require_positive("threshold", aggregator.threshold)
    require(float(threshold).is_integer(), f"threshold must be an integer vote count for {aggregator.name}, "
                                           f"got {threshold!r}")
    require(threshold <= teachers,
            f"threshold must be <= teachers = {teachers} (no token could pass), got {threshold!r}")
    return threshold


class _ThresholdPrivate(_HotPateAggregator):
    """TARGMAX and TWS: T-threshold private only (Cohen et al. 2023), +inf at every order."""

    threshold: float  # declared for mypy only: each registered subclass makes it a parameter field
    differentially_private: ClassVar[bool] = False
    soundness: ClassVar[str] = "+inf: the aggregator is not differentially private (docs/hotpate.md)"

    def components(self) -> dict[str, bool]:
        return {f"{self.name}_threshold_private": False}

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.full_like(orders, np.inf, dtype=np.float64)

    def no_pld_reason(self) -> str | None:
        return f"{self.name} gives no DP guarantee (T-threshold privacy only): no PLD"

    def vote_floor(self) -> float | None:
        return self.threshold

    def account_details(self, epsilon: float, queries: int, answered: int | None = None) -> dict[str, Any]:
        return {**self.parameters("account"),
                "guarantee": (f"T-threshold privacy with T = {self.threshold:g}: every released token had at least "
                              "T teacher votes; a robustness notion, not differential privacy (Cohen et al. 2023)"),
                "statement": (f"no DP guarantee: {self.title} releases only tokens with at least T votes (T-threshold "
                              "privacy, a robustness notion; Cohen et al. 2023)"),
                "note": "for a DP guarantee use dpargmax (Confident-GNMax) or dpws (Gaussian-noised counts, then TWS)"}

    @classmethod
    def charge_statement(cls, parameters: Mapping[str, Any]) -> str:
        return "Every step is charged +inf: the aggregator is not differentially private (docs/hotpate.md)."


_THRESHOLD = "threshold T: only tokens with at least T votes can be released"


@register_aggregator
class TargmaxAggregator(_ThresholdPrivate):
    """TARGMAX_T: the plurality token if its count is >= T, else fail (the public model answers)."""

    name = "targmax"
    title = "TARGMAX_T"
    summary = ("Hot PATE's TARGMAX_T: T-threshold private only, no DP guarantee, so no epsilon and no --delta "
               "(Cohen et al. 2023)")
    description = "TARGMAX_T releases the plurality token if it has at least T votes"

    threshold: float = parameter(help="TARGMAX threshold T, an integer >= 1: the top token is released only with >= T "
                                      "votes", unit="votes", symbol="T", commands={"account", "verify", "decode"})

    def check(self) -> None:
        # without an ensemble (account, verify) T is validated as TARGMAX_T's own; in a decode, against N
        threshold = (require_vote_threshold(self.threshold) if self.teachers is None
                     else _vote_count_threshold(self, self.teachers))
        object.__setattr__(self, "threshold", threshold)

    def decide(self, counts: NDArray[np.int64], generator: torch.Generator) -> tuple[int | None, float, list[float]]:
        top = int(np.argmax(counts))
        return (top if counts[top] >= self.threshold else None), float(counts[top]), []

    def log_output_law(self, counts: npt.ArrayLike) -> tuple[float, NDArray[np.float64], float]:
        """A point mass on the plurality token (the lowest index of equals) if it has >= T votes, else fail.

        Args:
            counts: (V,) the vote histogram.

        Returns:
            (log Pr[fail], (V,) log Pr[release j], 0.0: the law is exact).
        """
        counts = np.asarray(counts, dtype=np.float64)
        law = np.zeros(counts.size)
        top = int(np.argmax(counts))
        law[top] = 1.0 if counts[top] >= self.threshold else 0.0
        return _with_failure(law)


@register_aggregator
class TwsAggregator(_ThresholdPrivate):
    """TWS_{T, gamma}: sample among the tokens with >= T votes (dpledger.mechanisms.hot_pate.ThresholdWeightedSampler)."""

    name = "tws"
    title = "TWS_{T,gamma}"
    summary = ("Hot PATE's TWS_{T,gamma}: T-threshold private only, no DP guarantee, so no epsilon and no --delta "
               "(Cohen et al. 2023)")
    description = "TWS_{T,gamma} samples among the tokens with at least T votes in proportion to their counts"

    threshold: float = parameter(help="TWS " + _THRESHOLD, unit="votes", symbol="T",
                                 commands={"account", "verify", "decode"})
    gamma: float = parameter(help="TWS's gamma >= 1: no token gets more than gamma times its vote share",
                             unit="unitless", default=1.0, symbol="gamma", commands={"account", "verify", "decode"})

    def check(self) -> None:
        threshold: float
        if self.teachers is None:
            sampler = ThresholdWeightedSampler(require_vote_threshold(self.threshold), self.gamma)
            threshold, gamma = sampler.threshold, sampler.gamma
        else:
            threshold = _vote_count_threshold(self, self.teachers)
            gamma = require_finite_at_least_one("gamma", self.gamma)
        object.__setattr__(self, "threshold", threshold)
        object.__setattr__(self, "gamma", gamma)

    @property
    def sampler(self) -> ThresholdWeightedSampler:
        return ThresholdWeightedSampler(int(self.threshold), self.gamma)

    def decide(self, counts: NDArray[np.int64], generator: torch.Generator) -> tuple[int | None, float, list[float]]:
        top = int(np.argmax(counts))
        probs = self.sampler.probabilities(counts)
        draw = float(torch.rand(1, generator=generator, dtype=torch.float64))
        return pick_token(probs, draw), float(counts[top]), [draw]

    def log_output_law(self, counts: npt.ArrayLike) -> tuple[float, NDArray[np.float64], float]:
        """Its weights (ThresholdWeightedSampler.probabilities); the failure is the rest of the mass.

        Args:
            counts: (V,) the vote histogram.

        Returns:
            (log Pr[fail], (V,) log Pr[release j], 0.0: the law is exact).
        """
        return _with_failure(self.sampler.probabilities(np.asarray(counts, dtype=np.float64)))


def _with_failure(law: NDArray[np.float64]) -> tuple[float, NDArray[np.float64], float]:
    fail = max(0.0, 1.0 - float(law.sum()))
    with np.errstate(divide="ignore"):
        return (math.log(fail) if fail > 0 else -math.inf), np.log(law), 0.0


_ANSWER_NOISE = "GNMax noise s2: standard deviation of the Gaussian added to each vote count"


@register_aggregator
class DpargmaxAggregator(_HotPateAggregator):
    """DPARGMAX = Confident-GNMax (Papernot et al. 2018, Algorithm 1): a noisy check of the top count against
    T, then GNMax; charged as the module docstring says."""

    name = "dpargmax"
    title = "DPARGMAX (Confident-GNMax)"
    summary = "Hot PATE's DP argmax = Confident-GNMax (Cohen et al. 2023; Papernot et al. 2018)"
    calibrate_summary = "smallest sigma s2 of Hot PATE's DP argmax = Confident-GNMax, s1 = R * s2 (Cohen et al. 2023)"
    description = ("DPARGMAX is Confident-GNMax (Papernot et al. 2018): a noisy check of the largest count against T, "
                   "then the noisy argmax")
    differentially_private = True
    calibrated = "sigma"
    has_dp_event = True
    supports_realised_path = True
    data_dependent_charge = True
    calibrate_flags = {"ratio": dict(type=float, default=1.0, metavar="R",
                                     help="screen noise over answer noise, s1 = R * s2 (> 0; default: 1, i.e. s1 = s2)")}

    threshold: float | None = parameter(
        help="screen threshold T on the noisy top count (recorded: the RDP does not depend on it)", unit="votes",
        default=None, symbol="T", calibrate_default=0.0, decode_required=True)
    sigma: float = parameter(help=_ANSWER_NOISE, unit="votes", symbol="sigma", metavar="SIGMA")
    sigma_threshold: float = parameter(help="Confident-GNMax screen noise s1: standard deviation of the Gaussian "
                                            "added to the top vote count", unit="votes", symbol="sigma_threshold",
                                       metavar="S1", commands={"account", "verify", "decode"})
    data_dependent: bool = parameter(help="charge the answer Papernot et al. 2018's data-dependent Theorem 6 at the "
                                          "step's histogram", unit="true or false", default=False, type=bool,
                                     commands={"decode"})
    data_dependent_screen: bool = parameter(
        help="charge the screen its data-dependent divergence at the step's largest count (Papernot et al. 2018, "
             "Section 4; data-dependent: not a DP epsilon without a smooth-sensitivity release)",
        unit="true or false", default=False, type=bool, commands={"decode"})

    def check(self) -> None:
        threshold: float | None
        if self.teachers is not None:   # a decode: T is required (decode_required) and a positive vote count
            threshold = require_positive("threshold", self.threshold)
        else:
            threshold = None if self.threshold is None else require_non_negative("threshold", self.threshold)
        object.__setattr__(self, "threshold", threshold)
        object.__setattr__(self, "sigma", require_positive("sigma", self.sigma))
        object.__setattr__(self, "sigma_threshold", require_positive("sigma_threshold", self.sigma_threshold))
        object.__setattr__(self, "data_dependent", require_bool("data_dependent", self.data_dependent))
        object.__setattr__(self, "data_dependent_screen", require_bool("data_dependent_screen",
                                                                       self.data_dependent_screen))
        # the data-dependent screen's divergence reads T: a stand-in T would charge another check's value
        require(threshold is not None or not self.data_dependent_screen,
                "data_dependent_screen needs the screen threshold T, got threshold None")

    @property
    def confident_gnmax(self) -> ConfidentGNMax:
        return ConfidentGNMax(0.0 if self.threshold is None else self.threshold, self.sigma_threshold, self.sigma,
                              self.relation)

    @property
    def answer_component(self) -> str:
        return "gnmax_data_dependent" if self.data_dependent else "gnmax"

    @property
    def screen_component(self) -> str:
        return "confident_gnmax_screen_data_dependent" if self.data_dependent_screen else "confident_gnmax_screen"

    @property
    def any_data_dependent(self) -> bool:
        """Whether some part of the step's charge is data-dependent (answer or screen)."""
        return bool(self.data_dependent or self.data_dependent_screen)

    def components(self) -> dict[str, bool]:
        return {self.screen_component: self.data_dependent_screen, self.answer_component: self.data_dependent}

    def _decode_threshold(self) -> float:
        """T, which deciding and the output law need (a decode requires it; accounting does not)."""
        if self.threshold is None:
            raise ValueError(f"aggregator {self.name} needs the screen threshold T to decide or give its output law")
        return self.threshold

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.confident_gnmax.rdp_values(orders)

    def dp_event(self) -> DpEvent | None:
        """Confident-GNMax's Gaussians (released-output accounting). None for realised-path accounting (the
        charge depends on the screen's outcome) and for Theorem 6's data-dependent answer.

        Returns:
            ConfidentGNMax.dp_event()'s event, or None.
        """
        if self.accounting is not PathAccounting.RELEASED_OUTPUT or self.any_data_dependent:
            return None
        return self.confident_gnmax.dp_event()

    def no_pld_reason(self) -> str | None:
        if self.accounting is not PathAccounting.RELEASED_OUTPUT:
            return "realised-path accounting charges the answer only where the screen passed: an ex-post total, no PLD"
        if self.data_dependent:
            return "the answer is charged Papernot et al. 2018's data-dependent Theorem 6: no PLD in dp-accounting"
        if self.data_dependent_screen:
            return "the screen is charged its data-dependent divergence at the histogram: no PLD in dp-accounting"
        return super().no_pld_reason()

    def decide(self, counts: NDArray[np.int64], generator: torch.Generator) -> tuple[int | None, float, list[float]]:
        """The statistic is the noisy maximum count; the noise list is the screen's draw and, where it
        passed, the winning noisy count.

        Args:
            counts: (V,) the vote histogram.
            generator: the step's torch generator.

        Returns:
            (released token or None, noisy maximum count, [screen noise] or [screen noise, winning noisy count]).

        Raises:
            ValueError: if the aggregator has no threshold T.
        """
        threshold = self._decode_threshold()
        top = int(np.argmax(counts))
        screen_noise = float(torch.randn(1, generator=generator, dtype=torch.float64)) * self.sigma_threshold
        statistic = float(counts[top]) + screen_noise
        if statistic < threshold:
            return None, statistic, [screen_noise]
        noisy = counts + torch.randn(counts.size, generator=generator, dtype=torch.float64).numpy() * self.sigma
        token = int(np.argmax(noisy))
        return token, statistic, [screen_noise, float(noisy[token])]

    def charges(self, counts: NDArray[np.int64], passed: NDArray[np.bool_],
                orders: NDArray[np.float64]) -> dict[str, NDArray[np.float64]]:
        rows = counts.shape[0]
        if self.data_dependent_screen and rows:
            screen = np.stack([self.confident_gnmax.data_dependent_screen_rdp(c, orders) for c in counts])
        else:
            screen = np.broadcast_to(self.confident_gnmax.screen_rdp(orders), (rows, orders.size)).copy()
        if self.data_dependent:
            gnmax = GNMax(self.sigma, self.relation)
            answer = np.stack([gnmax.data_dependent_rdp(c, orders, DivergenceDirection.BOTH) for c in counts]) \
                if rows else np.zeros((0, orders.size))
        else:
            answer = np.broadcast_to(self.confident_gnmax.answer_rdp(orders), (rows, orders.size)).copy()
        if self.accounting is PathAccounting.REALISED_PATH:
            answer = np.where(np.asarray(passed, dtype=bool)[:, None], answer, 0.0)
        return {self.screen_component: screen, self.answer_component: answer}

    def realised_path_bounds(self, orders: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
        """Confident-GNMax's screen (every step) and its answer (passed steps only), data-independent.

        Args:
            orders: (K,) Renyi orders, each > 1.

        Returns:
            (screen RDP, answer RDP), each (K,), under realised-path accounting; None otherwise.
        """
        if self.accounting is not PathAccounting.REALISED_PATH:
            return None
        return self.confident_gnmax.screen_rdp(orders), self.confident_gnmax.answer_rdp(orders)

    def log_output_law(self, counts: npt.ArrayLike) -> tuple[float, NDArray[np.float64], float]:
        """Pr[fail] = Phi((T - max c) / s1); the answer's law is GNMax's (`gnmax_log_output_law`).

        Args:
            counts: (V,) the vote histogram.

        Returns:
            (log Pr[fail], (V,) log Pr[release j], the GNMax law's relative numerical error).

        Raises:
            ValueError: if the aggregator has no threshold T.
        """
        values = np.asarray(counts, dtype=np.float64)
        log_fail, log_pass = self.log_screen_law(values)
        answer, error = gnmax_log_output_law(values, self.sigma)
        return log_fail, log_pass + answer, error

    def log_answer_law(self, counts: npt.ArrayLike) -> tuple[NDArray[np.float64], float]:
        """The token law given that the screen passed (GNMax's), in logs, with its error.

        Args:
            counts: (V,) the vote histogram.

        Returns:
            ((V,) log Pr[release j | passed], relative numerical error).
        """
        return gnmax_log_output_law(np.asarray(counts, dtype=np.float64), self.sigma)

    def log_screen_law(self, counts: npt.ArrayLike) -> tuple[float, float]:
        """(log Pr[fail], log Pr[pass]) on one histogram.

        Args:
            counts: (V,) the vote histogram.

        Returns:
            (log Phi((T - max c) / s1), log Phi((max c - T) / s1)).

        Raises:
            ValueError: if the aggregator has no threshold T.
        """
        threshold = self._decode_threshold()
        top = float(np.max(counts))
        return (float(log_ndtr((threshold - top) / self.sigma_threshold)),
                float(log_ndtr((top - threshold) / self.sigma_threshold)))

    def sample_outputs(self, counts: NDArray[np.int64], draws: int, rng: np.random.Generator) -> NDArray[np.int64]:
        threshold = self._decode_threshold()
        values = counts.astype(np.float64)
        passes = values.max() + rng.normal(0.0, self.sigma_threshold, draws) >= threshold
        tokens = np.argmax(values + rng.normal(0.0, self.sigma, (draws, values.size)), axis=1)
        outputs: NDArray[np.int64] = np.where(passes, tokens, -1)
        return outputs

    # -- dpledger account / verify / calibrate ------------------------------------------------------------

    def _screen_and_answer(self, orders: Sequence[float]) -> tuple[RdpCurve, RdpCurve]:
        given = tuple(float(order) for order in orders)
        grid = np.asarray(given, dtype=np.float64)
        mechanism = self.confident_gnmax
        return (RdpCurve(given, mechanism.screen_rdp(grid), mechanism.relation),
                RdpCurve(given, mechanism.answer_rdp(grid), mechanism.relation))

    def account_curve(self, orders: Sequence[float], queries: int, answered: int | None = None) -> RdpCurve:
        """Q screens plus GNMax on Q queries (released-output) or on the K answered ones (realised-path),
        adaptive composition (Mironov 2017, Proposition 1); a realised-path total is data-dependent: K
        depends on the private data through the screen.

        Args:
            orders: Renyi orders, each > 1.
            queries: the number Q of steps, >= 0.
            answered: the number K of answered steps (realised-path accounting needs it).

        Returns:
            The composed RdpCurve, marked data-dependent under realised-path accounting.

        Raises:
            ValueError: under realised-path accounting without `answered`, or for a negative count.
        """
        screen, answer = self._screen_and_answer(orders)
        realised = self.accounting is PathAccounting.REALISED_PATH
        charged = answered if realised else queries
        if charged is None:
            raise ValueError("realised-path accounting needs the number of answered queries")
        curve = screen.composed(queries) + answer.composed(charged)
        if realised:
            curve = RdpCurve(curve.orders, curve.values, curve.relation, True, curve.direction)
        return curve

    def account_details(self, epsilon: float, queries: int, answered: int | None = None) -> dict[str, Any]:
        realised = self.accounting is PathAccounting.REALISED_PATH
        charged_answers = answered if realised else queries
        record: dict[str, Any] = {"accounting": self.accounting.value, "dp_guarantee": not realised and math.isfinite(epsilon),
                  "sigma": self.sigma, "sigma_threshold": self.sigma_threshold, "threshold": self.threshold,
                  "charged": {"screen_queries": queries, "gnmax_queries": charged_answers}}
        if realised:
            record.update(answered=answered, data_dependent=True)
            record["label"] = (f"realised-path: an ex-post statement about one run with {answered} answered "
                               "queries, not an RDP guarantee of the mechanism")
            record["note"] = (f"screen alpha/(2 s1^2) on all queries, GNMax {self.answer_formula} on the answered ones "
                              f"only ({self.relation.value}; Papernot et al. 2018's convention)")
        else:
            record["note"] = (f"released-output: every query charged screen alpha/(2 s1^2) + GNMax {self.answer_formula} "
                              f"({self.relation.value}: the histogram's L2 sensitivity is "
                              f"{'sqrt 2' if self.relation is NeighbouringRelation.REPLACE_ONE else '1'}), which "
                              "bounds the released (decision, token) pair whichever branch is taken (Mironov 2017, "
                              "Proposition 1); T is recorded, the RDP does not depend on it")
        return record

    @property
    def answer_formula(self) -> str:
        """GNMax's per-query RDP under the relation: "alpha/s2^2" (replace-one) or "alpha/(2 s2^2)"."""
        return "alpha/s2^2" if self.relation is NeighbouringRelation.REPLACE_ONE else "alpha/(2 s2^2)"

    def verify_accounts(self, orders: Sequence[float], queries: int, answered: int | None, path: PathAccounting,
                        relation: NeighbouringRelation) -> list[AccountingVariant]:
        """At the claim's relation: GNMax's a s^2 / (2 s2^2) at that relation's L2 sensitivity s (Papernot et
        al. 2018, Proposition 8; Mironov 2017, Corollary 3), so an add-or-remove curve is never offered
        for a replace-one claim.

        Args:
            orders: Renyi orders, each > 1.
            queries: the number of steps.
            answered: the number of answered steps, if known (adds the realised-path variant).
            path: the claim's path accounting (which variant it declared).
            relation: the claim's relation, at which every curve is computed.

        Returns:
            The released-output variant, and the realised-path one when `answered` is given.
        """
        at = self.with_context(relation=relation)
        screen, answer = at._screen_and_answer(orders)
        accounts = [AccountingVariant("released-output", "proven",
                                      f"threshold check a/(2 s1^2) plus GNMax {at.answer_formula} ({relation.value}) on "
                                      "every query: a bound on the released (decision, token) pair (Papernot et al. "
                                      "2018, Algorithm 1 and Proposition 8; Mironov 2017, Proposition 1)",
                                      path is PathAccounting.RELEASED_OUTPUT,
                                      screen.composed(queries) + answer.composed(queries))]
        if answered is not None:
            accounts.append(AccountingVariant("realised-path", "not-a-guarantee",
                                              f"GNMax charged on the {answered} answered queries only: the count "
                                              "depends on the private data, an ex-post statement about one run, not "
                                              "an RDP guarantee (Feldman & Zrnic 2021; docs/soundness.md)",
                                              path is PathAccounting.REALISED_PATH,
                                              screen.composed(queries) + answer.composed(answered)))
        return accounts

    @classmethod
    def calibrate(cls, epsilon: float, delta: float, queries: int, fixed: Mapping[str, Any],
                  **options: Any) -> Calibration:
        """Confident-GNMax's s2 with s1 = ratio * s2 (dpledger.mechanisms.calibration.calibrate_confident_gnmax).

        Args:
            epsilon: the target epsilon, > 0.
            delta: the target delta, in (0, 1).
            queries: the number of steps, >= 1.
            fixed: must hold "ratio" (s1 / s2); "threshold" is recorded (None: 0).
            **options: passed on to calibrate_confident_gnmax.

        Returns:
            The Calibration of s2.
        """
        threshold = 0.0 if fixed.get("threshold") is None else fixed["threshold"]
        return calibrate_confident_gnmax(epsilon, delta, queries, ratio=fixed["ratio"], threshold=threshold,
                                         mechanism_name=cls.name, **{"relation": cls.natural_relation, **options})

    @classmethod
    def charge_statement(cls, parameters: Mapping[str, Any]) -> str:
        replace = str(parameters.get("relation", cls.natural_relation.value)) == NeighbouringRelation.REPLACE_ONE.value
        answer = ("the noisy argmax's data-dependent RDP at the step's histogram (Papernot et al. 2018, Theorem 6)"
                  if parameters.get("data_dependent") else
                  f"the noisy argmax's {'a / sigma^2' if replace else 'a / (2 sigma^2)'} (Papernot et al. 2018, "
                  "Proposition 8, at the relation's L2 sensitivity)")
        screen = ("the screen's data-dependent divergence at the step's largest count (data-dependent)"
                  if parameters.get("data_dependent_screen") else "the screen's a / (2 sigma_threshold^2)")
        realised = parameters.get("accounting") == PathAccounting.REALISED_PATH
        return (f"Every step is charged {screen} plus {answer}, "
                + ("only where the screen passed (Papernot et al. 2018's convention)." if realised else
                   "the screen passed or not: a step releases the decision and the token (Mironov 2017, "
                   "Proposition 1; docs/hotpate.md)."))


@register_aggregator
class DpwsAggregator(_HotPateAggregator):
    """DPWS (dpledger.mechanisms.hot_pate.DPWeightedSampler): Gaussian noise on every count, then TWS on the
    noisy counts with the public N as n."""

    name = "dpws"
    title = "DPWS"
    summary = "Hot PATE's DP weighted sampler: Gaussian-noised counts, then TWS (Cohen et al. 2023)"
    calibrate_summary = "smallest sigma of Hot PATE's DP weighted sampler (Gaussian-noised counts, then TWS)"
    description = "DPWS adds Gaussian noise to every count, then samples TWS-style among the noisy counts at least T"
    differentially_private = True
    calibrated = "sigma"
    has_dp_event = True
    exact_law = False
    surrogate_measured = ("the noisy histogram's law (DPWS releases a post-processing of it, so this bounds the "
                          "released law)")
    surrogate_note = ("DPWS: measured on the Gaussian noisy histogram, the same formula as the charge; this checks the "
                      "charge's arithmetic, not the released law")
    claim_voters = True
    soundness = ("N(0, sigma^2) on every count, a s^2 / (2 sigma^2) per query at the relation's L2 sensitivity s "
                 "(sqrt 2 replace-one, 1 add or remove; Mironov 2017, Corollary 3); TWS on the noisy counts is "
                 "post-processing (Mironov 2017, Proposition 9)")
    account_note = ("Gaussian N(0, sigma^2) on every count: alpha / sigma^2 per query under replace-one (L2 sensitivity "
                    "sqrt 2), alpha / (2 sigma^2) when one teacher is added or removed (L2 sensitivity 1, with the "
                    "public N as TWS's n); TWS on the clipped noisy counts is post-processing")

    sigma: float = parameter(help="standard deviation of the Gaussian added to each vote count before TWS",
                             unit="votes", symbol="sigma", metavar="SIGMA")
    threshold: float = parameter(help="TWS threshold T: only tokens with a noisy count >= T can be released (recorded "
                                      "by calibrate: the RDP does not depend on it)", unit="votes", symbol="T",
                                 calibrate_default=1.0)
    gamma: float = parameter(help="TWS's gamma >= 1: no token gets more than gamma times its vote share",
                             unit="unitless", default=1.0, symbol="gamma")

    def check(self) -> None:
        threshold = require_positive("threshold", self.threshold)
        gamma = require_finite_at_least_one("gamma", self.gamma)
        sampler = DPWeightedSampler(self.sigma, threshold, gamma, self.relation, voters=self.teachers)
        object.__setattr__(self, "threshold", sampler.threshold)
        object.__setattr__(self, "gamma", sampler.gamma)
        object.__setattr__(self, "sigma", sampler.sigma)

    @property
    def dpws(self) -> DPWeightedSampler:
        return DPWeightedSampler(self.sigma, self.threshold, self.gamma, self.relation, voters=self.teachers)

    @property
    def component(self) -> str:
        return "dpws_gaussian"

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        return self.dpws.rdp_values(orders)

    def dp_event(self) -> DpEvent:
        return self.dpws.dp_event()

    def decide(self, counts: NDArray[np.int64], generator: torch.Generator) -> tuple[int | None, float, list[float]]:
        """The statistic is the noisy maximum count; the noise list is the sampling draw.

        Args:
            counts: (V,) the vote histogram.
            generator: the step's torch generator (the Gaussian noise, then the sampling draw).

        Returns:
            (released token or None, noisy maximum count, [sampling draw]).
        """
        noise = torch.randn(counts.size, generator=generator, dtype=torch.float64).numpy() * self.sigma
        probs = self.dpws.probabilities_given_noise(counts, noise)
        draw = float(torch.rand(1, generator=generator, dtype=torch.float64))
        return pick_token(probs, draw), float(np.max(counts + noise)), [draw]

    def sample_outputs(self, counts: NDArray[np.int64], draws: int, rng: np.random.Generator) -> NDArray[np.int64]:
        values = counts.astype(np.float64)
        noisy = np.maximum(values + rng.normal(0.0, self.sigma, (draws, values.size)), 0.0)
        passing = np.where(noisy >= self.threshold, noisy, 0.0)
        # n as DPWeightedSampler reads it: the public voter count, else the histogram's own total
        voters = float(values.sum()) if self.teachers is None else self.teachers
        normaliser = np.maximum(voters / self.gamma, passing.sum(axis=1, keepdims=True))
        cumulative = np.cumsum(passing / normaliser, axis=1)
        index = (cumulative < rng.random((draws, 1))).sum(axis=1)
        outputs: NDArray[np.int64] = np.where(index < values.size, index, -1)
        return outputs

    def surrogate_divergence(self, counts: NDArray[np.int64], neighbour: NDArray[np.int64],
                             orders: NDArray[np.float64]) -> NDArray[np.float64]:
        """The Gaussian noisy histogram's divergence a ||c - c'||^2 / (2 sigma^2) (Mironov 2017, Corollary 3),
        which bounds the released law's: DPWS post-processes the noisy histogram.

        Args:
            counts: (V,) the vote histogram.
            neighbour: (V,) a neighbouring histogram.
            orders: (K,) Renyi orders, each > 1.

        Returns:
            (K,) a ||c - c'||^2 / (2 sigma^2) at each order a.
        """
        squared = float(np.sum((counts - neighbour) ** 2))
        return orders * squared / (2.0 * self.sigma ** 2)

    def output_law_bounds(self, counts: npt.ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return self.dpws.output_law_bounds(counts)

    def sampled_law_bounds(self, histograms: NDArray[np.int64], generator: torch.Generator,
                           eta: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        values = np.asarray(histograms, dtype=np.float64)
        return dpws_law_bounds(self.dpws, values, generator, self.sampled_law_draws(*values.shape), eta)

    def sampled_law_draws(self, histograms: int, vocabulary: int) -> int:
        return dpws_draws(histograms, vocabulary)

    def account_details(self, epsilon: float, queries: int, answered: int | None = None) -> dict[str, Any]:
        return {"dp_guarantee": math.isfinite(epsilon), "sigma": self.sigma, "threshold": self.threshold,
                "gamma": self.gamma, "note": self.account_note}

    def verify_accounts(self, orders: Sequence[float], queries: int, answered: int | None, path: PathAccounting,
                        relation: NeighbouringRelation) -> list[AccountingVariant]:
        """At the claim's relation where covered_relations covers it (a / (2 sigma^2) add or remove, a / sigma^2
        replace-one: Mironov 2017, Corollary 3), else at replace-one (the claim is then demoted).

        Args:
            orders: Renyi orders, each > 1.
            queries: the number of steps.
            answered: unused (DPWS charges every step).
            path: unused (one accounting).
            relation: the claim's relation.

        Returns:
            One proven variant: the Gaussian counts' curve over `queries` steps.
        """
        at = relation if relation in self.covered_relations() else NeighbouringRelation.REPLACE_ONE
        curve = DPWeightedSampler(self.sigma, self.threshold, self.gamma, at,
                                  voters=self.teachers).rdp_curve(orders).composed(queries)
        return [AccountingVariant("gaussian-counts", "proven", self.soundness, True, curve)]

    def covered_relations(self) -> set[NeighbouringRelation]:
        """Replace-one; adding or removing one only with a public voter count (its normaliser).

        Returns:
            {REPLACE_ONE}, plus ADD_OR_REMOVE_ONE, REMOVE_ONE and ADD_ONE when `teachers` is given.
        """
        return {NeighbouringRelation.REPLACE_ONE} | (_ADD_REMOVE if self.teachers is not None else set())

    @classmethod
    def calibrate(cls, epsilon: float, delta: float, queries: int, fixed: Mapping[str, Any],
                  **options: Any) -> Calibration:
        """DPWS's sigma (dpledger.mechanisms.calibration.calibrate_dpws).

        Args:
            epsilon: the target epsilon, > 0.
            delta: the target delta, in (0, 1).
            queries: the number of steps, >= 1.
            fixed: must hold "threshold" and "gamma".
            **options: passed on to calibrate_dpws.

        Returns:
            The Calibration of sigma.
        """
        return calibrate_dpws(epsilon, delta, queries, threshold=fixed["threshold"], gamma=fixed["gamma"],
                              **{"relation": cls.natural_relation, **options})

    @classmethod
    def charge_statement(cls, parameters: Mapping[str, Any]) -> str:
        replace = str(parameters.get("relation", cls.natural_relation.value)) == NeighbouringRelation.REPLACE_ONE.value
        return (f"Every step is charged {'a / sigma^2' if replace else 'a / (2 sigma^2)'} at order a: the Gaussian "
                "mechanism on the histogram, whose L2 sensitivity is sqrt(2) when one teacher is replaced and 1 when "
                "one is added or removed; sampling from the noisy counts is post-processing (docs/hotpate.md).")
