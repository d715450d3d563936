"""Vote aggregators as classes: the abstract aggregator every Hot PATE aggregator subclasses.

A voting step (Cohen et al. 2023, Framework 1.2) gives an aggregator the histogram c of the teachers'
votes (counts over the vocabulary); the aggregator releases a token or fails (then the public model
answers). One subclass per aggregator, registered by `register_aggregator` and listed by
dpledger.mechanisms.aggregators (which finds every module of this package named *_aggregator(s).py),
declares

- `name` (the config's `aggregator` and the CLI subcommand), `title`, `summary`, `description`;
- its parameters, as frozen-dataclass fields made by `parameter(help=..., unit=...)`: every command
  line flag, claim key, config key and report label is generated from them;
- `differentially_private`, `calibrated` (the noise-scale field `dpledger calibrate` solves for, or
  None), `supports_realised_path` (a screen whose decision is released before the answer is charged),
  `exact_law` (whether `log_output_law` gives the released law on any histogram);

and implements what a voting run, its ledger and its audit ask of it: validation (`check`),
`components`, `rdp_values` (the worst case of one step), `dp_event` / `no_pld_reason`,
`decide(counts, generator)`, `charges(counts, passed, orders)`, `log_output_law` and `sample_outputs`.
The defaults here are what a data-independent aggregator with one charged component needs; the
built-in aggregators (dpledger.mechanisms.hot_pate_aggregators) override what they record differently.

Besides its parameters an aggregator carries its context: `teachers` (the public number N of voters;
None when it is accounted from parameters alone, as by `dpledger account`, `calibrate` and `verify`),
the neighbouring `relation` its charges hold for, and the `accounting` of a screened step
(dpledger.accounting.relation.PathAccounting).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar, Mapping, NamedTuple

import numpy as np
import torch

from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.errors import require, require_int_at_least
from dpledger.accounting.relation import NeighbouringRelation, PathAccounting, path_accounting
from dpledger.mechanisms.base import Mechanism, require_relation, set_validated
from dpledger.mechanisms.calibration import Calibration, calibrate_scale

COMMANDS = frozenset({"account", "calibrate", "verify", "decode"})
"""Where a parameter is read: `dpledger account` and `calibrate` flags, claim keys, the config's [mechanism]."""

_REGISTERED: dict[str, type["VoteAggregator"]] = {}


def parameter(*, help: str, unit: str, default: Any = MISSING, type: type = float, symbol: str | None = None,
              commands=COMMANDS, calibrate_default: Any = MISSING, metavar: str | None = None,
              decode_required: bool = False) -> Any:
    """A parameter field of an aggregator: `help` (one phrase: what it is), `unit` ("votes", "unitless", ...),
    `type` (float, int or bool: how a flag parses it and a config must spell it), `symbol` (its name in report
    labels, e.g. "T"; None keeps it out of them), `commands` (where it is read, a subset of COMMANDS),
    `calibrate_default` (its value when `dpledger calibrate` is not given it, where that differs from
    `default`), the flag's `metavar`, and `decode_required` (a decode needs it though accounting does not)."""
    commands = frozenset(commands)
    require(commands <= COMMANDS, f"commands must be a subset of {sorted(COMMANDS)}, got {sorted(commands)}")
    metadata = {"help": help, "unit": unit, "type": type, "symbol": symbol, "commands": commands,
                "metavar": metavar or (symbol or "VALUE").upper(), "decode_required": decode_required}
    if calibrate_default is not MISSING:
        metadata["calibrate_default"] = calibrate_default
    return field(default=default, metadata=metadata)


# the functional form: its field types are objects, not the strings `from __future__ import annotations`
# makes, which the generated constructor could not resolve (the API reference reads them)
AccountingVariant = NamedTuple("AccountingVariant", [("name", str), ("level", str), ("soundness", str),
                                                     ("declared", bool), ("curve", RdpCurve)])
AccountingVariant.__doc__ = """One accounting of Q steps of an aggregator, as `dpledger verify` lists it: its name, its
level ("proven" or "not-a-guarantee"), the theorem it rests on, whether the claim declared it, its curve."""


def pick_token(probabilities: np.ndarray, draw: float) -> int | None:
    """The token whose cumulative-probability interval holds `draw`, or None (fail) past the total."""
    index = int(np.searchsorted(np.cumsum(probabilities), draw, side="right"))
    return index if index < probabilities.size else None


@dataclass(frozen=True, kw_only=True)
class VoteAggregator(Mechanism):
    """One aggregator of vote histograms, its parameters as fields (see the module docstring).

    Its RDP curve (`rdp_values`) is the worst case of one step under `relation`, what released-output
    accounting charges; `charges` gives each charged component's per-step values for a block of
    histograms. Subclasses are made with `register_aggregator`.
    """

    name: ClassVar[str]
    title: ClassVar[str]                   # e.g. "DPARGMAX (Confident-GNMax)": report labels
    summary: ClassVar[str]                 # one line: `dpledger account NAME --help`
    description: ClassVar[str]             # one sentence: what it releases (the run's privacy statement)
    differentially_private: ClassVar[bool]
    calibrated: ClassVar[str | None] = None
    data_dependent_charge: ClassVar[bool] = False
    """Whether it may charge a data-dependent loss (a claim may then declare accounting.basis = data-dependent)."""
    has_dp_event: ClassVar[bool] = False
    """Whether `dp_event` gives a DpEvent (for released-output accounting): `dpledger account NAME` then
    shows dp-accounting's PLD epsilon and offers --dp-event-out."""
    calibrate_summary: ClassVar[str] = ""  # one line: `dpledger calibrate NAME --help`
    supports_realised_path: ClassVar[bool] = False
    exact_law: ClassVar[bool] = True
    natural_relation: ClassVar[NeighbouringRelation] = NeighbouringRelation.REPLACE_ONE
    """The relation of `dpledger account` and of a claim that states none (PATE's: one teacher replaced)."""
    soundness: ClassVar[str] = ""          # the theorem its per-step curve rests on, with its citation
    account_note: ClassVar[str] = ""       # the note `dpledger account NAME` prints
    surrogate_measured: ClassVar[str] = ""
    """Where `exact_law` is False: what the audit's neighbour ablation measures instead (one phrase)."""
    surrogate_note: ClassVar[str] = ""
    """Where `exact_law` is False: what that measurement checks and what not (one phrase)."""
    calibrate_flags: ClassVar[Mapping[str, dict]] = {}
    """Flags only `dpledger calibrate NAME` reads besides the parameters (argparse keyword arguments)."""
    claim_voters: ClassVar[bool] = False
    """A claim may state the public number of voters (mechanism.voters), which `teachers` takes."""
    unused_defaults: ClassVar[Mapping[str, Any]] = {}
    """Keys a recorded parameter table may hold for this aggregator without its reading them, at these values
    (None is always accepted as "not given")."""

    teachers: int | None = None
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE
    accounting: PathAccounting = PathAccounting.RELEASED_OUTPUT

    def __post_init__(self) -> None:
        teachers = None if self.teachers is None else require_int_at_least("teachers", self.teachers, 1)
        accounting = path_accounting(self.accounting)
        require(accounting is PathAccounting.RELEASED_OUTPUT or self.supports_realised_path,
                f"accounting = 'realised-path' applies to {_realised_path_names()} only, got aggregator {self.name}")
        set_validated(self, teachers=teachers, relation=require_relation(self.relation), accounting=accounting)
        self.check()

    # -- what a subclass declares ---------------------------------------------------------------------

    def check(self) -> None:
        """Validate (and convert, with set_validated) the parameters; ValueError naming the constraint."""

    @classmethod
    def parameter_fields(cls, command: str | None = None) -> dict[str, dataclasses.Field]:
        """name -> field of the parameters (the context fields excluded), those read by `command` if given."""
        return {f.name: f for f in dataclasses.fields(cls) if "help" in f.metadata
                and (command is None or command in f.metadata["commands"])}

    @classmethod
    def required_parameters(cls, command: str | None = None) -> tuple[str, ...]:
        """The parameters `command` cannot do without (a decode also needs those marked decode_required)."""
        return tuple(name for name, f in cls.parameter_fields(command).items()
                     if f.default is MISSING or (command == "decode" and f.metadata["decode_required"]))

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any], **context) -> "VoteAggregator":
        """The aggregator of a decode's parameter table (a config's [mechanism] or a run's recorded parameters):
        None is "not given", every missing one is named at once; a key it does not read is refused unless at
        its `unused_defaults` value."""
        fields = cls.parameter_fields()
        for key, value in parameters.items():
            if key not in fields and value is not None:
                require(key in cls.unused_defaults and _same(cls.unused_defaults[key], value),
                        f"{key} is not used for aggregator {cls.name}, got {value!r}")
        missing = [name for name in cls.required_parameters("decode") if parameters.get(name) is None]
        require(not missing, f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required for aggregator "
                             f"{cls.name}")
        return cls(**{key: value for key, value in parameters.items() if key in fields and value is not None},
                   **context)

    @classmethod
    def recorded_parameters(cls, parameters: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters a run's manifest records, as given (defaults for the ones not given)."""
        return {name: parameters.get(name, None if f.default is MISSING else f.default)
                for name, f in cls.parameter_fields("decode").items()}

    def parameters(self, command: str | None = None) -> dict[str, Any]:
        """The validated parameter values (those read by `command` if given)."""
        return {name: getattr(self, name) for name in self.parameter_fields(command)}

    def with_context(self, **context) -> "VoteAggregator":
        """This aggregator with other context (teachers, relation, accounting), re-validated."""
        return dataclasses.replace(self, **context)

    # -- one step ---------------------------------------------------------------------------------------

    @property
    def component(self) -> str:
        """The name of its one charged component (the record key rdp_<component>)."""
        return self.name.replace("-", "_")

    def components(self) -> dict[str, bool]:
        """Charged component -> data-dependent."""
        return {self.component: False}

    def decide(self, counts: np.ndarray, generator: torch.Generator) -> tuple[int | None, float, list[float]]:
        """The aggregator on one histogram: (released token or None, screen statistic, noise drawn), the noise
        list holding what the decision consumed from `generator`, for the trace (the generator replays it)."""
        raise NotImplementedError(f"aggregator {self.name} does not implement decide")

    def charges(self, counts: np.ndarray, passed: np.ndarray, orders: np.ndarray) -> dict[str, np.ndarray]:
        """Each component's RDP (L, K) for histograms (L, V) whose screens passed as `passed` (L,):
        by default the step's data-independent curve at every step."""
        (name,) = self.components()
        return {name: np.broadcast_to(self.rdp_values(orders), (counts.shape[0], orders.size)).copy()}

    def vote_floor(self) -> float | None:
        """T when every released token must have had at least T votes (T-threshold privacy, checked by the
        audit), None when the aggregator promises no such floor (a DP aggregator's noise may release any)."""
        return None

    def realised_path_bounds(self, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(the screen's data-independent bound, the answer's), for realised-path runs whose screen decision
        is released before the answer is charged (a privacy filter charges the answer where it passed)."""
        return None

    # -- exact output laws (the audit's neighbours) ------------------------------------------------------

    def log_output_law(self, counts) -> tuple[float, np.ndarray, float]:
        """(log Pr[fail], log Pr[release j] for every j, relative numerical error) on one histogram."""
        raise ValueError(f"aggregator {self.name} has no exact output law")

    def sample_outputs(self, counts: np.ndarray, draws: int, rng: np.random.Generator) -> np.ndarray:
        """`draws` outputs of the aggregator on one histogram (-1 = fail), for the sampled audit."""
        raise ValueError(f"aggregator {self.name} cannot be sampled")

    def log_screen_law(self, counts) -> tuple[float, float]:
        """Where `supports_realised_path`: the screen's (log Pr[fail], log Pr[pass]) on one histogram."""
        raise ValueError(f"aggregator {self.name} has no screen")

    def log_answer_law(self, counts) -> tuple[np.ndarray, float]:
        """Where `supports_realised_path`: the token law given that the screen passed, in logs, with its error."""
        raise ValueError(f"aggregator {self.name} has no screen")

    def surrogate_divergence(self, counts: np.ndarray, neighbour: np.ndarray, orders: np.ndarray) -> np.ndarray:
        """Where `exact_law` is False: an upper bound on the released law's Renyi divergence between two
        histograms (that of what the aggregator post-processes), which the audit measures instead."""
        raise ValueError(f"aggregator {self.name} has an exact law")

    def output_law_bounds(self, counts) -> tuple[np.ndarray, np.ndarray]:
        """Where `exact_law` is False: certified (lower, upper) bounds (V + 1,) on the released law, entry 0
        the failure (the audit's bracket composes lower bounds of one law against upper bounds of another)."""
        raise ValueError(f"aggregator {self.name} has an exact law")

    def sampled_law_bounds(self, histograms: np.ndarray, generator: torch.Generator,
                           eta: float) -> tuple[np.ndarray, np.ndarray]:
        """Where `exact_law` is False: (lower, upper) bounds (H, V + 1) on the released laws of `histograms`
        (H, V) tightened by Monte Carlo over common draws, each holding with probability >= 1 - eta."""
        raise ValueError(f"aggregator {self.name} has an exact law")

    def sampled_law_draws(self, histograms: int, vocabulary: int) -> int:
        """How many draws a step `sampled_law_bounds` takes for `histograms` laws over `vocabulary` tokens."""
        raise ValueError(f"aggregator {self.name} has an exact law")

    # -- what the commands print (defaults; the built-ins keep their own) --------------------------------

    def account_curve(self, orders, queries: int, answered: int | None = None) -> RdpCurve:
        """The curve of `queries` steps (`answered` of them answered, for realised-path accounting)."""
        return self.rdp_curve(orders).composed(queries)

    def account_details(self, epsilon: float, queries: int, answered: int | None = None) -> dict:
        """What `dpledger account NAME --json` adds after the mechanism, the queries and the relation."""
        return {"dp_guarantee": math.isfinite(epsilon), **self.parameters("account"), "note": self.account_note}

    def verify_accounts(self, orders, queries: int, answered: int | None, path: PathAccounting,
                        relation: NeighbouringRelation) -> list[AccountingVariant]:
        """Every data-independent accounting `dpledger verify` compares a claim for `relation` with: by default
        this aggregator's curve under that relation, where it covers it (its natural relation's otherwise)."""
        at = self.with_context(relation=relation) if relation in self.covered_relations() else self
        return [AccountingVariant(self.name, "proven", self.soundness, True, at.account_curve(orders, queries))]

    def covered_relations(self) -> set[NeighbouringRelation]:
        """The claimed relations this aggregator's curve (at its natural relation) covers."""
        return set(NeighbouringRelation)

    @classmethod
    def calibrate(cls, epsilon: float, delta: float, queries: int, fixed: Mapping[str, Any], **options) -> Calibration:
        """The smallest `calibrated` noise scale whose `queries` steps account to at most `epsilon` at `delta`,
        the other parameters `fixed` (dpledger.mechanisms.calibration.calibrate_scale: dp-accounting's
        calibration on a Gaussian DpEvent, RDP bisection otherwise), at the natural relation."""
        require(cls.calibrated is not None, f"aggregator {cls.name} has no noise to calibrate")
        fixed = dict(fixed)

        def factory(value: float) -> VoteAggregator:
            return cls(**{key: v for key, v in fixed.items() if v is not None}, **{cls.calibrated: value},
                       relation=cls.natural_relation)

        return calibrate_scale(factory, epsilon, delta, queries, mechanism_name=cls.name, parameter=cls.calibrated,
                               fixed=fixed, **options)

    @classmethod
    def label(cls, parameters: Mapping[str, Any]) -> str:
        """Its parameters as a report label shows them: "T=2, gamma=1.5"."""
        fields = cls.parameter_fields("decode")
        return ", ".join(f"{f.metadata['symbol']}={parameters[name]:g}" for name, f in fields.items()
                         if f.metadata["symbol"] and parameters.get(name) is not None
                         and not isinstance(parameters[name], bool))

    @classmethod
    def statement_parameters(cls, parameters: Mapping[str, Any]) -> str:
        """Its parameters as the run's privacy statement shows them (by default, as its label)."""
        return cls.label(parameters)

    @classmethod
    def charge_statement(cls, parameters: Mapping[str, Any]) -> str:
        """What every step is charged, one sentence for the run's privacy statement."""
        return f"Every step is charged {cls.soundness}."


def _same(expected, value) -> bool:
    """value is `expected` as a config may spell it: a bool for a bool, a number equal to a number."""
    return isinstance(value, bool) == isinstance(expected, bool) and expected == value


def _realised_path_names() -> str:
    names = sorted(name for name, cls in _REGISTERED.items() if cls.supports_realised_path)
    return ", ".join(names) or "no aggregator"


def register_aggregator(cls: type) -> type:
    """Class decorator: make `cls` a frozen, keyword-only dataclass and register it under `cls.name`.
    ValueError when it lacks a declaration or its name is taken."""
    require(isinstance(cls, type) and issubclass(cls, VoteAggregator),
            f"register_aggregator applies to VoteAggregator subclasses, got {cls!r}")
    require("name" in cls.__dict__, f"aggregator class {cls.__name__} must declare its own name")
    for attribute in ("title", "summary", "description", "differentially_private"):
        require(hasattr(cls, attribute), f"aggregator class {cls.__name__} must declare {attribute}")
    name = cls.__dict__["name"]
    require(isinstance(name, str) and name and name == name.strip().lower(),
            f"aggregator name must be a non-empty lower-case string, got {name!r}")
    require(name not in _REGISTERED or _REGISTERED[name].__qualname__ == cls.__qualname__,
            f"aggregator name {name!r} is already registered by {_REGISTERED.get(name)!r}")
    cls = dataclass(frozen=True, kw_only=True)(cls)
    for parameter_field in cls.parameter_fields().values():
        require(parameter_field.metadata["type"] in (float, int, bool),
                f"{cls.__name__}.{parameter_field.name}: type must be float, int or bool")
    require(cls.calibrated is None or (cls.differentially_private and cls.calibrated in cls.parameter_fields()),
            f"{cls.__name__}.calibrated must name one of its parameters, got {cls.calibrated!r}")
    _REGISTERED[name] = cls
    return cls
