"""Verify a published privacy claim without a trace (`dpledger verify CLAIM.toml`).

A claim names a mechanism, its parameters, the number of queries Q, delta, the claimed epsilon and
the accounting choices its authors said they made (conversion, subsampling variant, Renyi ball,
data-independent or data-dependent basis). `verify_claim` recomputes the epsilon under every
accounting variant that applies to the mechanism, lints the declared choices against the known
pitfalls (docs/soundness.md), and answers three questions:

1. reproduced? which variant gives the claimed epsilon at the claim's printed precision;
2. sound? the variant that reproduces it is a proven accounting and the claimed epsilon is at least
   the sound epsilon;
3. the sound epsilon: the smallest epsilon among the variants whose bound is proven, and which.

A data-dependent epsilon (Papernot et al. 2018, Section 3) depends on the private data and cannot
be recomputed from parameters: such a claim is "not checkable without a trace" (`dpledger audit`
checks a run's trace); its data-independent parts are still recomputed.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import tomllib
import warnings
from dataclasses import dataclass, field
from typing import TypeVar
from decimal import Decimal
from pathlib import Path

import numpy as np

from dpledger.accounting.conversion import ConversionMethod, GridEdgeWarning, conversion_terms, epsilon_from_rdp
from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.errors import (require, require_finite, require_in_closed, require_in_open, require_int_at_least,
                               require_non_negative, require_order, require_positive)
from dpledger.accounting.orders import default_orders
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.accounting.safe_files import read_text
from dpledger.accounting.relation import PathAccounting
from dpledger.mechanisms import (Ball, ConfidentGNMax, GaussianMechanism, GNMax, NoisyScreening, PMixED, PoissonSubsampledGaussian,
                                 SubsamplingVariant, realised_subsample_sizes)
from dpledger.mechanisms.aggregation import VoteAggregator
from dpledger.mechanisms.aggregators import aggregators
from dpledger.mechanisms.pmixed import SubsampledPMixED, balls_for_order
from dpledger.mechanisms.screening import BLIND_SCREEN_RATIO
from dpledger.mechanisms import subsampled_pmixed_curve

AGGREGATORS = aggregators()
"""The registered vote aggregators (dpledger.mechanisms.aggregators): each a claim's mechanism.type, its keys its
parameters."""
KINDS = ("gaussian", "subsampled-gaussian", "pmixed", "adapmixed", "screening", "gnmax", "confident-gnmax",
         *AGGREGATORS)
THRESHOLD_ONLY = tuple(name for name, cls in AGGREGATORS.items() if not cls.differentially_private)
DATA_DEPENDENT_KINDS = ("pmixed", "adapmixed", "gnmax", "confident-gnmax",
                        *(name for name, cls in AGGREGATORS.items() if cls.data_dependent_charge))
REALISED_PATH_KINDS = ("confident-gnmax", *(name for name, cls in AGGREGATORS.items() if cls.supports_realised_path))
SAMPLINGS = ("poisson", "with-replacement")
BASES = ("data-independent", "data-dependent")
PATHS = tuple(member.value for member in PathAccounting)

REALISED_SEEDS = 200
MAX_CLAIM_BYTES = 2 ** 20
"""A claim file is read up to this size (one is a few hundred bytes)."""
"""Realised-size variants draw each query's sample size m_t ~ Binomial(N, q): their epsilon is a
random quantity. It is simulated with seeds 0..REALISED_SEEDS-1 (dpledger.mechanisms.realised_subsample_sizes);
a claim is reproduced by such a variant when it lies within the simulated range."""


_MECHANISM_KEYS = {
    # kind: (required keys, optional keys) of [mechanism], besides "type"
    "gaussian": (("noise_multiplier",), ()),
    "subsampled-gaussian": (("noise_multiplier", "sample_rate"), ()),
    "pmixed": (("alpha", "beta", "teachers"), ("sample_rate", "sampling")),
    "adapmixed": (("alpha", "beta", "teachers", "lam", "sigma"), ("threshold", "top_k", "sample_rate", "sampling")),
    "screening": (("teachers", "lam", "sigma"), ("alpha", "threshold", "top_k")),
    "gnmax": (("sigma",), ()),
    "confident-gnmax": (("sigma", "sigma_threshold"), ("threshold", "answered")),
    # an aggregator's: its parameters (required: those without a default), the public voter count where it reads
    # one, the answered count where it has realised-path accounting
    **{name: (cls.required_parameters("verify"),
              tuple(key for key, field in cls.parameter_fields("verify").items() if key not in
                    cls.required_parameters("verify"))
              + (("voters",) if cls.claim_voters else ()) + (("answered",) if cls.supports_realised_path else ()))
       for name, cls in AGGREGATORS.items()},
}
_CLAIM_KEYS = (("epsilon", "delta", "queries"), ("source", "relation", "tolerance"))
_ACCOUNTING_KEYS = ("conversion", "subsampling_variant", "ball", "basis", "path")


def _relation_named(key: str, value) -> NeighbouringRelation:
    names = [r.label for r in NeighbouringRelation]
    require(isinstance(value, str), f"{key} must be one of {names}, got {value!r}")
    try:
        return NeighbouringRelation(value.replace("-", "_"))
    except ValueError:
        raise ValueError(f"{key} must be one of {names}, got {value!r}") from None


def _choice(key: str, value, choices) -> str:
    require(isinstance(value, str) and value in choices, f"{key} must be one of {list(choices)}, got {value!r}")
    return value


def _member(key: str, kind, value):
    names = [m.value for m in kind]
    require(isinstance(value, str) and value in names, f"{key} must be one of {names}, got {value!r}")
    return kind(value)


@dataclass(frozen=True)
class Claim:
    """A published (epsilon, delta) claim and the accounting its authors declared; validated on
    construction (ValueError naming the TOML key, the value and the rule). None: not stated."""

    kind: str
    epsilon: float
    delta: float
    queries: int
    source: str = ""
    relation: NeighbouringRelation | None = None
    tolerance: float | None = None
    alpha: float | None = None
    beta: float | None = None
    teachers: int | None = None
    sample_rate: float | None = None
    sampling: str = "poisson"
    noise_multiplier: float | None = None
    sigma: float | None = None
    sigma_threshold: float | None = None
    lam: float | None = None
    threshold: float | None = None
    top_k: int | None = None
    gamma: float | None = None
    voters: int | None = None
    answered: int | None = None
    conversion: ConversionMethod | None = None
    subsampling_variant: SubsamplingVariant | None = None
    ball: Ball | None = None
    basis: str = "data-independent"
    path: str = "released-output"
    parameters: dict = field(default_factory=dict)
    """An aggregator's parameters that are none of the fields above (name -> value)."""

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        require(self.kind in KINDS, f"mechanism.type must be one of {list(KINDS)}, got {self.kind!r}")
        put("epsilon", require_non_negative("claim.epsilon", self.epsilon))
        put("delta", require_in_open("claim.delta", self.delta, 0.0, 1.0))
        put("queries", require_int_at_least("claim.queries", self.queries, 1))
        require(isinstance(self.source, str), f"claim.source must be a string, got {self.source!r}")
        if self.tolerance is not None:
            put("tolerance", require_positive("claim.tolerance", self.tolerance))
        required, optional = _MECHANISM_KEYS[self.kind]
        require(isinstance(self.parameters, dict), f"parameters must be a dict, got {self.parameters!r}")
        names = ("alpha", "beta", "teachers", "sample_rate", "noise_multiplier", "sigma", "sigma_threshold", "lam",
                 "threshold", "top_k", "gamma", "voters", "answered")
        for name in dict.fromkeys(names + required + optional + tuple(self.parameters)):
            value = getattr(self, name) if name in _FIELDS else self.parameters.get(name)
            if name in required:
                require(value is not None, f"mechanism.{name} is required for mechanism {self.kind}")
            elif value is not None:
                require(name in optional, f"mechanism.{name} does not apply to mechanism {self.kind}; it reads "
                                          + ", ".join(f"mechanism.{k}" for k in required + optional))
        checks = {
            "alpha": lambda v: require_order("mechanism.alpha", v),
            "beta": lambda v: require_non_negative("mechanism.beta", v),
            "teachers": lambda v: require_int_at_least("mechanism.teachers", v, 1),
            "sample_rate": lambda v: require_in_closed("mechanism.sample_rate", v, 0.0, 1.0),
            "noise_multiplier": lambda v: require_positive("mechanism.noise_multiplier", v),
            "sigma": lambda v: require_positive("mechanism.sigma", v),
            "sigma_threshold": lambda v: require_positive("mechanism.sigma_threshold", v),
            "lam": lambda v: require_in_closed("mechanism.lam", v, 0.0, 1.0),
            "threshold": lambda v: require_non_negative("mechanism.threshold", v),
            "top_k": lambda v: require_int_at_least("mechanism.top_k", v, 1),
            "gamma": lambda v: require_finite("mechanism.gamma", v),
            "voters": lambda v: require_int_at_least("mechanism.voters", v, 1),
            "answered": lambda v: require_int_at_least("mechanism.answered", v, 0),
        }
        for name, check in checks.items():
            if getattr(self, name) is not None:
                put(name, check(getattr(self, name)))
        if self.gamma is not None:
            require(self.gamma >= 1.0, f"mechanism.gamma must be >= 1, got {self.gamma:g}")
        if self.kind in AGGREGATORS:
            claim_aggregator(self)   # the aggregator validates its own parameters
        put("sampling", _choice("mechanism.sampling", self.sampling, SAMPLINGS))
        require(self.sampling == "poisson" or self.sample_rate is not None,
                "mechanism.sampling applies only with mechanism.sample_rate")
        if self.conversion is not None:
            put("conversion", _member("dpledger.accounting.conversion", ConversionMethod, self.conversion)
                if not isinstance(self.conversion, ConversionMethod) else self.conversion)
        if self.ball is not None:
            require(self.kind in ("pmixed", "adapmixed"),
                    f"accounting.ball applies to mechanisms pmixed and adapmixed only, not {self.kind}")
            put("ball", self.ball if isinstance(self.ball, Ball) else _member("accounting.ball", Ball, self.ball))
        if self.subsampling_variant is not None:
            require(self.kind == "pmixed" and self.sample_rate is not None,
                    "accounting.subsampling_variant applies to mechanism pmixed with mechanism.sample_rate only")
            variant = (self.subsampling_variant if isinstance(self.subsampling_variant, SubsamplingVariant)
                       else _member("accounting.subsampling_variant", SubsamplingVariant, self.subsampling_variant))
            put("subsampling_variant", variant)
            if self.ball is not None:
                needed = Ball.ALL_ORDERS if variant is SubsamplingVariant.ALL_ORDERS_BALL else Ball.PROJECTION_ORDER
                require(self.ball is needed, f"accounting.subsampling_variant = {variant.value!r} accounts PMixED "
                                             f"with ball = {needed.value!r}, got accounting.ball = {self.ball.value!r}")
        put("basis", _choice("accounting.basis", self.basis, BASES))
        if self.basis == "data-dependent":
            require(self.kind in DATA_DEPENDENT_KINDS,
                    f"accounting.basis = 'data-dependent' applies to {list(DATA_DEPENDENT_KINDS)}, not {self.kind}")
        if self.kind == "adapmixed" and self.sample_rate is not None:
            require(self.basis == "data-dependent",
                    "mechanism.sample_rate with mechanism adapmixed is read only to lint a data-dependent claim "
                    "(amplification of the screened, data-dependent mechanism is not accounted)")
        put("path", _choice("accounting.path", self.path, PATHS))
        if self.path == "realised-path":
            require(self.kind in REALISED_PATH_KINDS, "accounting.path = 'realised-path' applies to "
                                                      f"{' and '.join(REALISED_PATH_KINDS)}, not {self.kind}")
            require(self.answered is not None, "accounting.path = 'realised-path' needs mechanism.answered")
        if self.answered is not None:
            require(self.path == "realised-path", "mechanism.answered applies only with accounting.path = 'realised-path'")
            require(self.answered <= self.queries,
                    f"mechanism.answered must be <= claim.queries ({self.queries}), got {self.answered}")
        if self.relation is not None and not isinstance(self.relation, NeighbouringRelation):
            put("relation", _relation_named("claim.relation", self.relation))

    @property
    def unit(self) -> float:
        """One unit in the last printed digit of the claimed epsilon (4.399 -> 0.001), read from its
        shortest repr; trailing zeros of the TOML literal are lost (4.390 reads as 4.39): set
        claim.tolerance to be stricter."""
        exponent = Decimal(repr(float(self.epsilon))).normalize().as_tuple().exponent
        if not isinstance(exponent, int):
            raise RuntimeError("claim.epsilon is validated finite, so its exponent is a number")
        return float(Decimal(1).scaleb(exponent))

    def reproduces(self, low: float, high: float | None = None) -> bool:
        """True when some value in [low, high] prints as the claim: with claim.tolerance t, within
        +-t; otherwise rounded to nearest (value in [eps - unit/2, eps + unit/2]) or rounded up (value
        in (eps - unit, eps]) at the claim's printed precision.

        Args:
            low: the smallest value of the range (a single value when `high` is None); a non-finite
                `low` never reproduces.
            high: the largest value of the range (a realised-size variant's simulated seeds); None: `low`.

        Returns:
            Whether the range reaches a value that prints as the claimed epsilon.
        """
        high = low if high is None else high
        if not math.isfinite(low):
            return False
        slack = 1e-12 * max(1.0, abs(self.epsilon))
        if self.tolerance is not None:
            below, above = self.tolerance, self.tolerance
        else:
            below, above = self.unit, self.unit / 2.0
        return bool(low <= self.epsilon + above + slack and high > self.epsilon - below - slack)


_FIELDS = frozenset(f.name for f in dataclasses.fields(Claim))


def claim_aggregator(claim: Claim) -> VoteAggregator:
    """The registered aggregator a claim names, with its parameters, at its natural relation, the claim's
    voters (where it reads them) and path; a ValueError from its validation names the claim's key.

    Args:
        claim: a validated claim whose kind is a registered aggregator.

    Returns:
        The aggregator, validated.

    Raises:
        ValueError: if the aggregator's validation refuses a parameter ("mechanism.<key> ...").
    """
    cls = AGGREGATORS[claim.kind]
    values = {name: (getattr(claim, name) if name in _FIELDS else claim.parameters.get(name))
              for name in cls.parameter_fields("verify")}
    try:
        return cls(**{name: value for name, value in values.items() if value is not None},
                   teachers=claim.voters if cls.claim_voters else None, relation=cls.natural_relation,
                   accounting=PathAccounting(claim.path) if cls.supports_realised_path else PathAccounting.RELEASED_OUTPUT)
    except ValueError as error:
        raise ValueError(f"mechanism.{error}") from None


def _refuse(unknown: list, message_if_any) -> None:
    """ValueError(message_if_any()) when `unknown` is non-empty (a callable: the message names
    unknown[0], which exists only then)."""
    if unknown:
        raise ValueError(message_if_any())


def _table(data: dict, name: str) -> dict:
    value = data.get(name, {})
    require(isinstance(value, dict), f"[{name}] must be a table, got {type(value).__name__}")
    return value


def claim_from_mapping(data: dict) -> Claim:
    """A Claim from parsed TOML: tables [claim], [mechanism] (with `type`), optional [accounting];
    ValueError naming an unknown or missing key.

    Args:
        data: the parsed TOML document.

    Returns:
        The validated Claim.

    Raises:
        ValueError: if a table or key is unknown, a required key is missing, a value has the wrong
            type, or Claim's validation refuses a value.
    """
    require(isinstance(data, dict), "a claim must be a TOML table")
    unknown_tables = sorted(set(data) - {"claim", "mechanism", "accounting"})
    _refuse(unknown_tables, lambda: f"unknown table or key {unknown_tables[0]!r}; a claim has [claim], [mechanism], "
                                "[accounting]")
    claim, mechanism, accounting = (_table(data, name) for name in ("claim", "mechanism", "accounting"))
    for key in _CLAIM_KEYS[0]:
        require(key in claim, f"claim.{key} is required")
    unknown = sorted(set(claim) - set(_CLAIM_KEYS[0] + _CLAIM_KEYS[1]))
    _refuse(unknown, lambda: f"unknown key claim.{unknown[0]}; [claim] reads " + ", ".join(_CLAIM_KEYS[0] + _CLAIM_KEYS[1]))
    # `type`, as in a decode config's [mechanism]
    require("kind" not in mechanism, "unknown key mechanism.kind: the mechanism is named by mechanism.type, as in a "
                                     "decode config")
    require("type" in mechanism, "mechanism.type is required")
    kind = mechanism["type"]
    require(isinstance(kind, str) and kind in KINDS, f"mechanism.type must be one of {list(KINDS)}, got {kind!r}")
    required, optional = _MECHANISM_KEYS[kind]
    unknown = sorted(set(mechanism) - {"type"} - set(required) - set(optional))
    _refuse(unknown, lambda: f"unknown key mechanism.{unknown[0]} for mechanism {kind}; it reads "
                         + ", ".join(f"mechanism.{k}" for k in ("type",) + required + optional))
    unknown = sorted(set(accounting) - set(_ACCOUNTING_KEYS))
    _refuse(unknown, lambda: f"unknown key accounting.{unknown[0]}; [accounting] reads " + ", ".join(_ACCOUNTING_KEYS))
    typed = {key: field.metadata["type"] for key, field in AGGREGATORS[kind].parameter_fields("verify").items()} \
        if kind in AGGREGATORS else {}
    for table, values in (("claim", claim), ("mechanism", mechanism), ("accounting", accounting)):
        for key, value in values.items():
            require(not isinstance(value, (dict, list)), f"{table}.{key} must be a single value, got {value!r}")
            if table == "mechanism" and typed.get(key) is bool:
                require(isinstance(value, bool), f"{table}.{key} must be true or false, got {value!r}")
            elif key in ("teachers", "top_k", "voters", "answered", "queries") or (
                    table == "mechanism" and typed.get(key) is int):
                require(isinstance(value, int) and not isinstance(value, bool),
                        f"{table}.{key} must be an integer, got {value!r}")
            elif key not in ("type", "source", "relation", "sampling") and table != "accounting":
                require(isinstance(value, (int, float)) and not isinstance(value, bool),
                        f"{table}.{key} must be a number, got {value!r}")
    fields = {key: value for key, value in mechanism.items() if key != "type" and key in _FIELDS}
    parameters = {key: value for key, value in mechanism.items() if key != "type" and key not in _FIELDS}
    return Claim(kind=kind, **claim, **fields, **accounting, parameters=parameters)


def load_claim(path: str | Path) -> Claim:
    """Parse and validate a claim TOML file; ValueError naming the file and the key otherwise.

    Args:
        path: the claim file (a regular file of at most MAX_CLAIM_BYTES; a link is followed).

    Returns:
        The validated Claim.

    Raises:
        ValueError: if the file is not a regular file within the size limit, not UTF-8, not valid
            TOML, nests too deep, or is not a valid claim (claim_from_mapping); the message names the file.
        OSError: if the file cannot be read (missing, no permission).
    """
    path = Path(path)
    text = read_text(path, MAX_CLAIM_BYTES, follow=True, what="a claim")  # never a FIFO or a device
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML: {error}") from None
    except RecursionError:  # tomllib recurses once per nested array or table: a claim nests two deep
        raise ValueError(f"{path}: arrays or tables nest deeper than Python's recursion limit; a claim nests two "
                         "deep") from None
    try:
        return claim_from_mapping(data)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


@dataclass(frozen=True)
class VariantResult:
    """One accounting variant of the claim's mechanism.

    epsilon: at the claim's delta (+inf: no guarantee; None: not computable without a trace); for a
    realised-size variant the median over the simulated seeds, with `epsilon_range` = (min, max).
    sound: True when the bound is proven for the mechanism as declared. level: "proven",
    "conditional" (sound given an unproven hypothesis, named in `soundness`), "unsound", or
    "not-a-guarantee" (data-dependent / ex post). component: a part of the mechanism's cost only,
    never compared with the claim."""

    name: str
    conversion: str
    epsilon: float | None
    order: float | None
    sound: bool
    level: str
    soundness: str
    declared: bool
    reproduces: bool = False
    epsilon_range: tuple[float, float] | None = None
    at_grid_edge: bool = False
    component: bool = False

    def to_dict(self) -> dict:
        """The row as `dpledger verify --json` prints it.

        Returns:
            The fields by name; epsilon_range as a list (or None).
        """
        record = dict(vars(self))
        record["epsilon_range"] = list(self.epsilon_range) if self.epsilon_range else None
        return record


@dataclass(frozen=True)
class Finding:
    """A pitfall the claim's declared accounting exhibits: a stable id, a severity (high, medium,
    low, info) and one sentence with its citation."""

    id: str
    severity: str
    message: str

    def to_dict(self) -> dict:
        """The finding as `dpledger verify --json` prints it.

        Returns:
            {"id", "severity", "message"}.
        """
        return dict(vars(self))


@dataclass(frozen=True)
class ClaimVerdict:
    """What `verify_claim` found. verdict is one of: reproduced-sound, reproduced-conditional,
    reproduced-unsound, not-reproduced-sound, not-reproduced-conditional, not-reproduced-unsound,
    not-checkable-data-dependent, no-dp-guarantee ("conditional": at least the smallest bound for
    PMixED's paper's ball, which rests on Theorem 3.1 as claimed; no bound is proven there).
    reproduced / sound are None where they cannot be decided (data-dependent claims).
    sound_epsilon is the smallest bound for the mechanism as declared: a proven one, or, for PMixED's
    paper's ball, which has none, the smallest resting on Theorem 3.1 alone (`sound_basis` says which);
    +inf where there is neither."""

    claim: Claim
    variants: tuple[VariantResult, ...]
    reproduced: bool | None
    reproduced_by: str | None
    sound: bool | None
    sound_epsilon: float
    sound_variant: str | None
    verdict: str
    statement: str
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = field(default_factory=tuple)
    sound_basis: str | None = None
    """"proven", or CONDITIONAL_ON_THEOREM_3_1 where the mechanism as declared (PMixED's paper's ball)
    has no proven bound; None when there is no sound epsilon."""

    @property
    def exit_code(self) -> int:
        """0 when reproduced and sound, 1 otherwise (not sound, not reproduced, or not checkable)."""
        return 0 if self.verdict == "reproduced-sound" else 1

    def to_dict(self) -> dict:
        """The verdict as `dpledger verify --json` prints it.

        Returns:
            The verdict, statement, reproduction and soundness fields, the claim as read (with its
            relation and tolerance), the variants, findings and notes.
        """
        claim = self.claim
        return {
            "verdict": self.verdict, "statement": self.statement, "reproduced": self.reproduced,
            "reproduced_by": self.reproduced_by, "sound": self.sound, "sound_epsilon": self.sound_epsilon,
            "sound_variant": self.sound_variant, "sound_basis": self.sound_basis,
            "claim": {"source": claim.source, "mechanism": claim.kind, "epsilon": claim.epsilon, "delta": claim.delta,
                      "queries": claim.queries, "relation": self.relation.label,
                      "tolerance": (claim.tolerance if claim.tolerance is not None else
                                    {"rounded_to_nearest": claim.unit / 2.0, "rounded_up": claim.unit})},
            "variants": [v.to_dict() for v in self.variants],
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
        }

    @property
    def relation(self) -> NeighbouringRelation:
        return self.claim.relation or _natural_relation(self.claim.kind)


def _natural_relation(kind: str) -> NeighbouringRelation:
    if kind in AGGREGATORS:
        return AGGREGATORS[kind].natural_relation
    if kind in ("gnmax", "confident-gnmax"):
        return NeighbouringRelation.REPLACE_ONE
    return NeighbouringRelation.ADD_OR_REMOVE_ONE


_ADD_REMOVE = {NeighbouringRelation.ADD_OR_REMOVE_ONE, NeighbouringRelation.REMOVE_ONE, NeighbouringRelation.ADD_ONE}


def _covered_relations(claim: Claim) -> set[NeighbouringRelation]:
    """The relations the mechanism's data-independent bound covers.

    gaussian: the noise multiplier is relative to the L2 sensitivity under the claim's own relation
    (Mironov 2017, Corollary 3). Poisson amplification (Mironov, Talwar & Zhang 2019; Zhu & Wang
    2019) and PMixED (Flemings et al. 2024, Theorem 3.1): add/remove one. Screening (Flemings et al.
    2024, Theorem 4.1): L2 sensitivity lam sqrt(2)/N for replacing as for adding/removing a teacher.
    GNMax / Confident-GNMax (Papernot et al. 2018, Proposition 8): alpha/sigma^2 is the replace-one
    charge (L2 sensitivity sqrt 2); adding or removing a teacher moves one vote (L2 sensitivity 1),
    which it covers. A registered aggregator says which (VoteAggregator.covered_relations; DPWS:
    replace-one, add/remove only with a public voter count, its normaliser).
    """
    kind = claim.kind
    if kind in AGGREGATORS:
        return claim_aggregator(claim).covered_relations()
    if kind == "gaussian":
        return set(NeighbouringRelation)
    if kind in ("subsampled-gaussian", "pmixed", "adapmixed"):
        return set(_ADD_REMOVE)
    if kind in ("screening", "gnmax", "confident-gnmax"):
        return set(NeighbouringRelation)
    return set()


@dataclass(frozen=True)
class _Account:
    """One accounting of the whole mechanism: its composed curve (or simulated curves), before conversion."""

    name: str
    level: str
    soundness: str
    declared: bool
    curve: RdpCurve | None = None
    realised: tuple[tuple[float, ...], np.ndarray] | None = None  # (orders, values per seed)
    component: bool = False


_T = TypeVar("_T")


def _required(value: _T | None, name: str) -> _T:
    """A mechanism parameter that Claim's validation requires for the claim's kind (mechanism.`name`):
    ValueError where it is missing all the same."""
    if value is None:
        raise ValueError(f"mechanism.{name} is required for this mechanism")
    return value


def _epsilon_of(row: VariantResult) -> float:
    """The epsilon of a row the caller kept for having one (`row.epsilon is not None`)."""
    if row.epsilon is None:
        raise RuntimeError(f"{row.name}/{row.conversion} has no epsilon")
    return row.epsilon


def _convert(curve: RdpCurve, delta: float, method: ConversionMethod):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        return epsilon_from_rdp(curve, delta, method)


@functools.lru_cache(maxsize=8)
def _realised_size_counts(teachers: int, rate: float, queries: int) -> np.ndarray:
    """counts[seed, m]: how many of the `queries` queries drew sample size m with that seed (read-only)."""
    counts = np.stack([np.bincount(realised_subsample_sizes(teachers, rate, queries, seed), minlength=teachers + 1)
                       for seed in range(REALISED_SEEDS)])
    counts.flags.writeable = False
    return counts


@functools.lru_cache(maxsize=1024)
def _per_query_values(pmixed: PMixED, rate: float, variant: SubsamplingVariant, size: int,
                      orders: tuple[float, ...]) -> np.ndarray:
    """One subsampled PMixED query's RDP at realised size `size` (Flemings et al. 2024, Theorem A.4
    with Theorem 3.1; dpledger.mechanisms.pmixed.SubsampledPMixED), memoised: a claim verified twice, or two
    claims sharing parameters, compute each size's amplification sum once."""
    return SubsampledPMixED(pmixed, rate, variant, size).rdp_curve(orders).values


def _realised_size_values(pmixed: PMixED, rate: float, variant: SubsamplingVariant, queries: int,
                          orders: tuple[float, ...]) -> np.ndarray:
    """Composed curves of `queries` subsampled PMixED queries for seeds 0..REALISED_SEEDS-1: per seed,
    sum over queries of the per-query bound at the realised size m_t (Flemings et al. 2024, Theorem
    A.4 with Theorem 3.1; RDP composes additively, Mironov 2017, Proposition 1). Identical to
    dpledger.mechanisms.subsampled_pmixed_curve(pmixed, rate, variant, queries, seed) for each seed; each
    size's curve is computed once for all seeds."""
    counts = _realised_size_counts(pmixed.teachers, rate, queries)
    values = np.zeros((REALISED_SEEDS, len(orders)))
    for size in np.flatnonzero(counts.sum(axis=0)):
        per_query = _per_query_values(pmixed, rate, variant, int(size), orders)
        times = counts[:, size][:, None].astype(np.float64)
        with np.errstate(invalid="ignore"):  # 0 * inf for seeds that never drew this size: 0
            values += np.where(times > 0, times * per_query, 0.0)
    return values


def _pmixed_accounts(claim: Claim, orders) -> list[_Account]:
    """PMixED's data-independent accountings: every subsampling variant when sample_rate < 1,
    Theorem 3.1 at the projection-order and at the all-orders ball otherwise."""
    alpha = _required(claim.alpha, "alpha")
    balls = {ball: PMixED(alpha, _required(claim.beta, "beta"), _required(claim.teachers, "teachers"), ball=ball)
             for ball in balls_for_order(alpha)}
    declared_ball = claim.ball
    accounts = []
    if claim.sample_rate is not None and claim.sample_rate < 1.0:
        for variant in SubsamplingVariant:
            ball = Ball.ALL_ORDERS if variant is SubsamplingVariant.ALL_ORDERS_BALL else Ball.PROJECTION_ORDER
            level = "proven" if variant.proven else ("unsound" if variant.uses_realised_sizes else "conditional")
            text = variant.soundness  # its "pitfall N" are the sections of docs/pitfalls.md
            declared = ((claim.subsampling_variant in (None, variant))
                        and declared_ball in (None, ball))
            if variant.uses_realised_sizes:
                values = _realised_size_values(balls[ball], claim.sample_rate, variant, claim.queries, orders)
                accounts.append(_Account(variant.value, level, text, declared, realised=(orders, values)))
            else:
                curve = subsampled_pmixed_curve(balls[ball], claim.sample_rate, variant, claim.queries, 0, orders)
                accounts.append(_Account(variant.value, level, text, declared, curve=curve))
        return accounts
    for ball, mechanism in balls.items():
        text = ball.theorem_3_1_basis
        accounts.append(_Account(f"{ball.value}-ball", "proven" if mechanism.proven else "conditional", text,
                                 declared_ball in (None, ball), curve=mechanism.rdp_curve(orders).composed(claim.queries)))
    return accounts


def _accounts(claim: Claim) -> list[_Account]:
    """Every data-independent accounting of the claim's mechanism over Q queries."""
    kind, queries = claim.kind, claim.queries
    if kind in ("pmixed",):
        return _pmixed_accounts(claim, default_orders(_required(claim.alpha, "alpha")))
    if kind == "adapmixed":
        alpha, teachers = _required(claim.alpha, "alpha"), _required(claim.teachers, "teachers")
        orders = default_orders(alpha)
        screen_step = NoisyScreening(teachers, _required(claim.lam, "lam"), _required(claim.sigma, "sigma"),
                                     alpha=alpha)
        screening = screen_step.rdp_curve(orders).composed(queries)
        accounts = [_Account("screening-part", "proven",
                             "noisy screening alone, (lam/(N sigma))^2 a per query (Flemings et al. 2024, Theorem "
                             "4.1): one part of AdaPMixED's cost, not a bound on the whole mechanism", False,
                             curve=screening, component=True)]
        for ball in balls_for_order(alpha):
            pmixed = PMixED(alpha, _required(claim.beta, "beta"), teachers, ball=ball)
            text = ("screening on every query plus Theorem 3.1 on every query (adaptive composition, Mironov 2017, "
                    "Proposition 1), " + ball.theorem_3_1_basis)
            accounts.append(_Account(f"screening+{ball.value}-ball", "proven" if pmixed.proven else "conditional",
                                     text, claim.ball in (None, ball),
                                     curve=screening + pmixed.rdp_curve(orders).composed(queries)))
        return accounts
    orders = default_orders()
    if kind == "gaussian":
        return [_Account("gaussian", "proven", "a / (2 sigma^2) per query (Mironov 2017, Corollary 3)", True,
                         curve=GaussianMechanism(_required(claim.noise_multiplier, "noise_multiplier"))
                         .rdp_curve(orders).composed(queries))]
    if kind == "subsampled-gaussian":
        subsampled = PoissonSubsampledGaussian(_required(claim.noise_multiplier, "noise_multiplier"),
                                               _required(claim.sample_rate, "sample_rate"))
        return [_Account("poisson-subsampled-gaussian", "proven",
                         "tight Poisson-subsampled Gaussian RDP (Mironov, Talwar & Zhang 2019; Zhu & Wang 2019, "
                         "Theorem 5, whose condition the Gaussian meets)", True,
                         curve=subsampled.rdp_curve(orders).composed(queries))]
    if kind == "screening":
        screening_only = NoisyScreening(_required(claim.teachers, "teachers"), _required(claim.lam, "lam"),
                                        _required(claim.sigma, "sigma"))
        return [_Account("screening", "proven", "(lam/(N sigma))^2 a per query (Flemings et al. 2024, Theorem 4.1)",
                         True, curve=screening_only.rdp_curve(orders).composed(queries))]
    # GNMax's curve at the claim's own relation (L2 sensitivity sqrt 2 replace-one, 1 add or remove):
    # never an add-or-remove curve for a replace-one claim (Papernot et al. 2018, Proposition 8)
    relation = claim.relation or _natural_relation(kind)
    if kind == "gnmax":
        gnmax = GNMax(_required(claim.sigma, "sigma"), relation)
        return [_Account("gnmax", "proven", "a s^2 / (2 sigma^2) per query at the relation's L2 sensitivity s "
                         "(Papernot et al. 2018, Proposition 8)", True,
                         curve=gnmax.rdp_curve(orders).composed(queries))]
    if kind == "confident-gnmax":
        confident = ConfidentGNMax(claim.threshold or 0.0, _required(claim.sigma_threshold, "sigma_threshold"),
                                   _required(claim.sigma, "sigma"), relation)
        grid = np.asarray(orders)
        screen = RdpCurve(orders, confident.screen_rdp(grid), confident.relation)
        answer = RdpCurve(orders, confident.answer_rdp(grid), confident.relation)
        accounts = [_Account("released-output", "proven",
                             "threshold check a/(2 s1^2) plus GNMax a s^2/(2 s2^2) on every query: a bound on the released "
                             "(decision, token) pair (Papernot et al. 2018, Algorithm 1; Mironov 2017, Proposition 1)",
                             claim.path == "released-output", curve=screen.composed(queries) + answer.composed(queries))]
        if claim.answered is not None:
            accounts.append(_Account("realised-path", "not-a-guarantee",
                                     f"GNMax charged on the {claim.answered} answered queries only: the count depends "
                                     "on the private data, an ex-post statement about one run, not an RDP guarantee "
                                     "(Feldman & Zrnic 2021; docs/soundness.md)", claim.path == "realised-path",
                                     curve=screen.composed(queries) + answer.composed(claim.answered)))
        return accounts
    if kind in AGGREGATORS and kind not in THRESHOLD_ONLY:
        relation = claim.relation or _natural_relation(kind)
        return [_Account(*variant) for variant in
                claim_aggregator(claim).verify_accounts(orders, queries, claim.answered, PathAccounting(claim.path),
                                                        relation)]
    raise AssertionError(f"no accounting for {kind}")  # threshold-only kinds never get here


def _results(claim: Claim, accounts: list[_Account], demote: str | None) -> list[VariantResult]:
    """Each account converted with each conversion (Balle et al. 2020, Theorem 21; Mironov 2017,
    Proposition 3); realised-size accounts report the median seed and the simulated range."""
    rows = []
    for account in accounts:
        for method in ConversionMethod:
            declared = account.declared and claim.conversion in (None, method) and claim.basis == "data-independent"
            sound = account.level == "proven" and demote is None
            soundness = account.soundness if demote is None or account.level != "proven" else \
                f"{account.soundness}; not for this claim: {demote}"
            if account.realised is not None:
                orders, values = account.realised
                terms = conversion_terms(np.asarray(orders), claim.delta, method)
                ranked = np.argsort(np.min(values + terms, axis=1), kind="stable")
                picks = [ranked[0], ranked[len(ranked) // 2], ranked[-1]]
                low, mid, high = (_convert(RdpCurve(orders, values[i]), claim.delta, method) for i in picks)
                rows.append(VariantResult(account.name, method.value, mid.epsilon, mid.order, sound, account.level,
                                          soundness + f" (median of {REALISED_SEEDS} simulated seeds)", declared,
                                          claim.reproduces(low.epsilon, high.epsilon) and not account.component,
                                          (float(low.epsilon), float(high.epsilon)), mid.at_grid_edge,
                                          account.component))
                continue
            if account.curve is None:
                raise RuntimeError("an account holds a curve where it holds no simulated values")
            result = _convert(account.curve, claim.delta, method)
            rows.append(VariantResult(account.name, method.value, result.epsilon, result.order, sound, account.level,
                                      soundness, declared,
                                      claim.reproduces(result.epsilon) and not account.component, None,
                                      result.at_grid_edge, account.component))
    return rows


def lint_claim(claim: Claim) -> list[Finding]:
    """The pitfalls the claim's declared accounting exhibits (docs/soundness.md), each with a stable id.

    Args:
        claim: a validated claim.

    Returns:
        The findings that apply, in a fixed order.

    Raises:
        ValueError: if a screened claim (adapmixed, screening) lacks lam, teachers or sigma.
    """
    findings = []
    add = lambda id_, severity, message: findings.append(Finding(id_, severity, message))  # noqa: E731
    relation = claim.relation or _natural_relation(claim.kind)
    variant = claim.subsampling_variant
    if claim.kind in THRESHOLD_ONLY:
        add("no-dp-guarantee", "high", f"{claim.kind} only releases tokens with at least T votes: T-threshold privacy "
                                       "is a robustness notion, not differential privacy (Cohen et al. 2023), so no "
                                       "epsilon holds for it.")
    if claim.sample_rate is not None and claim.sampling == "with-replacement":
        add("with-replacement-sampling", "high", "teachers sampled with replacement are not a Poisson subsample, "
                                                 "so Poisson amplification (Zhu & Wang 2019, Theorem 9; Flemings et "
                                                 "al. 2024, Theorem A.4) does not apply.")
    if variant is not None and variant.uses_realised_sizes:
        add("realised-size", "high", f"subsampling variant {variant.value} plugs in the realised sample size of each "
                                     "query, a random quantity that then chooses the bound; Poisson amplification "
                                     "(Zhu & Wang 2019, Theorem 9) charges the base mechanism's bound over every "
                                     "possible subsample.")
    if variant is not None and not variant.general:
        add("tight-amplification", "medium", f"subsampling variant {variant.value} uses the tight amplification "
                                             "bound (Zhu & Wang 2019, Theorem 5), which needs a condition PMixED is "
                                             "not shown to meet; the general bound (ibid., Theorem 9) multiplies the "
                                             "k >= 3 terms by 3.")
    if variant is SubsamplingVariant.PER_ORDER_RADIUS:
        add("per-order-radius", "high", "per-order-radius charges order k as if the ball there had radius beta*k, "
                                        "while the projection enforces order alpha only (Flemings et al. 2024, "
                                        "Algorithm 2), so the lower orders' bounds are not guaranteed.")
    pmixed_like = claim.kind in ("pmixed", "adapmixed")
    ball = claim.ball or (Ball.ALL_ORDERS if variant is SubsamplingVariant.ALL_ORDERS_BALL else
                          Ball.PROJECTION_ORDER if pmixed_like else None)
    if pmixed_like and ball is Ball.PROJECTION_ORDER:
        add("projection-order-ball", "medium", "Theorem 3.1 (Flemings et al. 2024) is as claimed for the one-order "
                                               "projection: its proof applies Theorem A.5 (Steinke 2022, Lemma 33.7), "
                                               "whose hypothesis is the ball at other orders, and inputs with extreme "
                                               "tails exceed it; the proof-orders and all-orders balls make it proven "
                                               "(docs/soundness.md)"
                                               + ("" if claim.ball else " (ball not stated: the paper's assumed)") + ".")
    if claim.basis == "data-dependent":
        add("data-dependent-epsilon", "high", "a data-dependent epsilon depends on the private data: it is not a DP "
                                              "guarantee and releasing it leaks (Papernot et al. 2018, Section 3); "
                                              "checking it against a budget leaks too (Redberg et al. 2023).")
        if claim.sample_rate is not None:
            add("amplification-with-data-dependent", "high", "privacy amplification by subsampling is known for "
                                                             "data-independent bounds only and cannot be combined "
                                                             "with data-dependent accounting (Zhu et al. 2020).")
        if pmixed_like and "add" in relation.moves:
            add("remove-one-data-dependent", "high", f"the data-dependent PMixED loss (Flemings et al. 2024, Eq. 3) "
                                                     "maximises over the ensembles with one teacher removed; the "
                                                     f"claim is {relation.label}, and an added teacher can cost more "
                                                     "(docs/soundness.md, the add-one bound).")
    if claim.path == "realised-path":
        add("realised-path", "high", f"charging GNMax only on the {claim.answered} answered queries lets the private "
                                     "data choose what is charged: an ex-post statement about one run (Feldman & "
                                     "Zrnic 2021), not a bound on the released output (Papernot et al. 2018, Algorithm "
                                     "1; docs/soundness.md).")
    if claim.conversion is ConversionMethod.CLASSIC:
        add("classic-conversion", "info", "the classic conversion (Mironov 2017, Proposition 3) is sound but looser "
                                          "than the improved one (Balle et al. 2020, Theorem 21).")
    covered = _covered_relations(claim)
    if claim.kind not in THRESHOLD_ONLY and relation not in covered:
        add("relation-mismatch", "high", f"the claim is for {relation.label} neighbours, but the mechanism's bound "
                                         f"covers {', '.join(sorted(r.label for r in covered))} only (Flemings et al. "
                                         "2024, Theorem 3.1; Papernot et al. 2018, Proposition 8; docs/soundness.md).")
    screening = claim.kind in ("adapmixed", "screening")
    ratio = (_required(claim.lam, "lam") / (_required(claim.teachers, "teachers") * _required(claim.sigma, "sigma"))
             if screening else math.nan)
    if screening and ratio < BLIND_SCREEN_RATIO:
        add("blind-screening", "low", f"lam/(N sigma) = {ratio:.3g}: the ensemble moves the screened mean far less "
                                      "than the noise does, so the screen's decisions barely depend on the teachers "
                                      "(Flemings et al. 2024, Theorem 4.1 charges it nonetheless).")
    return findings


def _demotion(claim: Claim, relation: NeighbouringRelation) -> str | None:
    """Why no proven variant's bound covers this claim's mechanism as declared, or None."""
    if claim.sample_rate is not None and claim.sample_rate < 1.0 and claim.sampling == "with-replacement":
        return "teachers were sampled with replacement, not Poisson-subsampled"
    covered = _covered_relations(claim)
    if relation not in covered:
        return f"the claim is for {relation.label}, the bound covers {', '.join(sorted(r.label for r in covered))}"
    return None


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    return "inf" if math.isinf(value) else f"{value:.4f}"


CONDITIONAL_ON_THEOREM_3_1 = "conditional on Theorem 3.1 (Flemings et al. 2024) as claimed for the paper's ball"


def _declared_ball(claim: Claim) -> Ball | None:
    """The projection of the claim's PMixED/AdaPMixED (the paper's one-order ball unless stated), or None."""
    if claim.kind not in ("pmixed", "adapmixed"):
        return None
    if claim.ball is not None:
        return claim.ball
    return Ball.ALL_ORDERS if claim.subsampling_variant is SubsamplingVariant.ALL_ORDERS_BALL else Ball.PROJECTION_ORDER


def _row_ball(claim: Claim, row: VariantResult) -> Ball | None:
    """The projection a PMixED/AdaPMixED row accounts (None for other mechanisms and components)."""
    if claim.kind not in ("pmixed", "adapmixed") or row.component or row.level == "not-a-guarantee":
        return None
    return _ball_of_row(row.name)


def _ball_of_row(name: str) -> Ball:
    """The ball a PMixED/AdaPMixED account row is named after ("<ball>-ball", "screening+<ball>-ball",
    the all-orders-ball subsampling variant); the paper's ball for the other subsampling variants."""
    for ball in Ball:
        if f"{ball.value}-ball" in name:
            return ball
    return Ball.PROJECTION_ORDER


def _for_declared_ball(row: VariantResult, declared_ball: Ball | None) -> VariantResult:
    """A row for PMixED's other projection is no bound for the mechanism as declared: not `sound` here."""
    if declared_ball is None or row.component or not row.sound or _ball_of_row(row.name) is declared_ball:
        return row
    return dataclasses.replace(row, sound=False, soundness=f"{row.soundness}; for ball = "
                               f"{_ball_of_row(row.name).value}, not the declared ball = {declared_ball.value}")


def _rests_on_theorem_3_1_only(row: VariantResult) -> bool:
    """A conditional row whose one unproven hypothesis is Theorem 3.1 for the paper's ball: not one that
    also needs the tight amplification's condition or lets the realised sample size choose the bound."""
    if row.level != "conditional" or row.component or row.epsilon is None:
        return False
    try:
        variant = SubsamplingVariant(row.name)
    except ValueError:
        return row.name.endswith("-ball")
    return variant.general and not variant.uses_realised_sizes


def verify_claim(claim: Claim) -> ClaimVerdict:
    """Recompute the claim under every accounting variant that applies, lint it, and decide.

    Every variant is the mechanism's RDP curve (its theorem named in the row's `soundness`),
    composed Q times (Mironov 2017, Proposition 1) and converted at the claim's delta with both the
    improved (Balle et al. 2020, Theorem 21) and the classic (Mironov 2017, Proposition 3)
    conversion, minimised over the order grid (dp-accounting's plus the mechanism's order).

    Args:
        claim: a Claim (load_claim, claim_from_mapping).

    Returns:
        The ClaimVerdict: every variant's row, the findings, whether the claim is reproduced and
        sound, the sound epsilon and the verdict's statement.

    Raises:
        ValueError: if `claim` is not a Claim, or its mechanism refuses its parameters (claim_aggregator;
            a parameter its kind requires is missing).
    """
    if not isinstance(claim, Claim):
        raise ValueError(f"claim must be a Claim (dpledger.audit.claims.load_claim), got {type(claim).__name__}")
    relation = claim.relation or _natural_relation(claim.kind)
    findings = tuple(lint_claim(claim))
    if claim.kind in THRESHOLD_ONLY:
        mechanism = claim_aggregator(claim)
        require(not np.any(np.isfinite(mechanism.rdp_curve().values)), f"{claim.kind} has a finite RDP curve")
        statement = (f"NO DP GUARANTEE: {claim.kind} is T-threshold private only (Cohen et al. 2023); the claimed "
                     f"epsilon {claim.epsilon:g} is not supported by any accounting. Use dpargmax or dpws for a DP "
                     "guarantee.")
        return ClaimVerdict(claim, (), False, None, False, math.inf, None, "no-dp-guarantee", statement, findings)
    demote = _demotion(claim, relation)
    declared_ball = _declared_ball(claim)
    rows = tuple(_for_declared_ball(row, declared_ball) for row in _results(claim, _accounts(claim), demote))
    # the claim is compared with bounds for its mechanism as declared: PMixED's other projection is another
    # mechanism, listed in a note
    own = [row for row in rows if not row.component and row.epsilon is not None
           and _row_ball(claim, row) in (None, declared_ball)]
    proven = [row for row in own if row.sound]
    conditional_only = [] if proven or demote else [row for row in own if _rests_on_theorem_3_1_only(row)]
    best = min(proven or conditional_only, key=_epsilon_of) if proven or conditional_only else None
    basis = "proven" if proven else CONDITIONAL_ON_THEOREM_3_1 if best else None
    sound_epsilon = float(_epsilon_of(best)) if best else math.inf
    sound_variant = f"{best.name}/{best.conversion}" if best else None
    notes = []
    if basis == CONDITIONAL_ON_THEOREM_3_1:
        notes.append(f"the sound epsilon {_fmt(sound_epsilon)} ({sound_variant}) is {basis}; no bound is proven for "
                     "the paper's one-order ball (docs/soundness.md)")
    other = [row for row in rows if not row.component and row.epsilon is not None and row.level == "proven"
             and _row_ball(claim, row) not in (None, declared_ball)]
    if other:
        lowest = min(other, key=_epsilon_of)
        lowest_ball = _row_ball(claim, lowest)
        if lowest_ball is None:
            raise RuntimeError("`other` holds PMixED rows of another projection")
        notes.append(f"PMixED with ball = {lowest_ball.value} (another projection, not the declared "
                     f"mechanism) has the proven epsilon {_fmt(lowest.epsilon)} ({lowest.name}/{lowest.conversion}) "
                     "for these parameters")
    if best is not None and best.at_grid_edge:
        notes.append(f"the sound epsilon's optimal order {best.order:g} is at the edge of the order grid: a richer "
                     "grid might give a smaller sound epsilon (it stays a valid bound)")
    if claim.basis == "data-dependent":
        notes.append("the data-dependent epsilon is computed from the run's distributions: recompute and check it "
                     "with `dpledger audit` on the run's trace")
        statement = (f"NOT CHECKABLE WITHOUT A TRACE: data-dependent. The claimed epsilon {claim.epsilon:g} depends "
                     f"on the private data (Papernot et al. 2018) and cannot be recomputed from parameters; run "
                     f"`dpledger audit` on the run's trace. The data-independent guarantee for these parameters is "
                     f"{_fmt(sound_epsilon)}" + (f" ({sound_variant}; {basis})." if sound_variant else "."))
        method = claim.conversion or ConversionMethod.IMPROVED
        rows += (VariantResult("data-dependent", method.value, None, None, False, "not-a-guarantee",
                               "the claim's own accounting: a loss computed from the run's distributions (Flemings "
                               "et al. 2024, Eq. 3 and Theorem 4.2 for PMixED/AdaPMixED; Papernot et al. 2018, "
                               "Theorem 6 for GNMax), not computable from parameters and not a DP guarantee", True),)
        return ClaimVerdict(claim, rows, None, None, None, sound_epsilon, sound_variant,
                            "not-checkable-data-dependent", statement, findings, tuple(notes), basis)
    reproducing = [row for row in rows if row.reproduces]
    # the declared accounting first, then a proven one, then any
    reproducing.sort(key=lambda row: (not row.declared, not row.sound))
    chosen = reproducing[0] if reproducing else None
    reproduced = chosen is not None
    reproduced_by = f"{chosen.name}/{chosen.conversion}" if chosen else None
    holds = bool(claim.epsilon >= sound_epsilon)
    conditional = basis == CONDITIONAL_ON_THEOREM_3_1
    # for the paper's ball a derivation resting on Theorem 3.1 alone is as good as the comparison itself
    derivation_ok = chosen is None or chosen.sound or (conditional and _rests_on_theorem_3_1_only(chosen))
    sound = holds and derivation_ok
    verdict = (f"{'reproduced' if reproduced else 'not-reproduced'}-"
               f"{('conditional' if conditional else 'sound') if sound else 'unsound'}")
    parts = [f"REPRODUCED by {reproduced_by}" + ("" if chosen.declared else " (not the declared accounting)")
             if chosen is not None else "NOT REPRODUCED by any variant at the claim's printed precision"]
    if not math.isfinite(sound_epsilon):
        parts.append("UNSOUND: no variant's bound is proven for this mechanism as declared"
                     + (f" ({demote})" if demote else ""))
    elif not holds:
        basis_text = "" if basis == "proven" else f", {basis}"
        weaker = [row for row in own if row.level == "conditional" and row.epsilon is not None
                  and row.epsilon < sound_epsilon and not row.reproduces and claim.epsilon < row.epsilon]
        parts.append(f"UNSOUND: under-states by {sound_epsilon - claim.epsilon:.4f}"
                     f" (claimed {claim.epsilon:g} < sound epsilon {_fmt(sound_epsilon)}, {sound_variant}{basis_text})"
                     + (f"; by {min(_epsilon_of(r) for r in weaker) - claim.epsilon:.4f} even against "
                        f"{min(weaker, key=_epsilon_of).name}, which needs a further condition" if weaker else ""))
    elif not derivation_ok:
        if chosen is None:
            raise RuntimeError("a derivation is checked only where a variant reproduces the claim")
        parts.append(f"NOT SOUND: the accounting that reproduces it ({reproduced_by}) is {chosen.level}, though the "
                     f"claimed value is >= the sound epsilon {_fmt(sound_epsilon)} ({sound_variant})")
    elif conditional:
        parts.append(f"SOUND IF THEOREM 3.1 HOLDS for the paper's ball: claimed {claim.epsilon:g} >= {_fmt(sound_epsilon)} "
                     f"({sound_variant}, {basis}); no bound is proven for that ball (docs/soundness.md)")
    else:
        parts.append(f"SOUND: claimed {claim.epsilon:g} >= sound epsilon {_fmt(sound_epsilon)} ({sound_variant})")
    if chosen is not None and not chosen.declared:
        notes.append(f"the declared accounting does not reproduce the claim; {reproduced_by} does")
    return ClaimVerdict(claim, rows, reproduced, reproduced_by, sound, sound_epsilon, sound_variant, verdict,
                        "; ".join(parts), findings, tuple(notes), basis)


def verify_file(path: str | Path) -> ClaimVerdict:
    """load_claim then verify_claim.

    Args:
        path: the claim file.

    Returns:
        verify_claim's ClaimVerdict.

    Raises:
        ValueError: if the file is not a valid claim (load_claim).
        OSError: if the file cannot be read.
    """
    return verify_claim(load_claim(path))
