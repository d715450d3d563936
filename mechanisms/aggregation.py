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
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Mapping, NamedTuple, Self, Sequence, TypedDict, TypeVar, Unpack

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.errors import require, require_int_at_least
from dpledger.accounting.relation import NeighbouringRelation, PathAccounting, path_accounting
from dpledger.mechanisms.base import Mechanism, require_relation, set_validated
from dpledger.mechanisms.calibration import Calibration, calibrate_scale
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light

COMMANDS = frozenset({"account", "calibrate", "verify", "decode"})
"""Where a parameter is read: `dpledger account` and `calibrate` flags, claim keys, the config's [mechanism]."""

_REGISTERED: dict[str, type["VoteAggregator"]] = {}


class AggregatorContext(TypedDict, total=False):
    """An aggregator's context fields, as keyword arguments (see the module docstring)."""

    teachers: int | None
    relation: NeighbouringRelation
    accounting: PathAccounting


def parameter(*, help: str, unit: str, default: Any = MISSING, type: type = float, symbol: str | None = None,
              commands: Iterable[str] = COMMANDS, calibrate_default: Any = MISSING, metavar: str | None = None,
              decode_required: bool = False) -> Any:
    """A parameter field of an aggregator: `help` (one phrase: what it is), `unit` ("votes", "unitless", ...),
    `type` (float, int or bool: how a flag parses it and a config must spell it), `symbol` (its name in report
    labels, e.g. "T"; None keeps it out of them), `commands` (where it is read, a subset of COMMANDS),
    `calibrate_default` (its value when `dpledger calibrate` is not given it, where that differs from
    `default`), the flag's `metavar`, and `decode_required` (a decode needs it though accounting does not).

    Args:
        help: one phrase: what the parameter is.
        unit: its unit ("votes", "unitless", ...).
        default: its default value; none (MISSING) makes it required.
        type: float, int or bool.
        symbol: its name in report labels (e.g. "T"), or None.
        commands: where it is read, a subset of COMMANDS.
        calibrate_default: its value when `dpledger calibrate` is not given it, if that differs from `default`.
        metavar: the flag's metavar (default: the symbol, or "VALUE", upper-cased).
        decode_required: whether a decode needs it though accounting does not.

    Returns:
        A dataclasses.field carrying these as metadata (typed Any, as dataclasses.field is, so that it
        can stand as the default of a field of any type).

    Raises:
        ValueError: if `commands` is not a subset of COMMANDS.
    """
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


def pick_token(probabilities: NDArray[np.float64], draw: float) -> int | None:
    """The token whose cumulative-probability interval holds `draw`, or None (fail) past the total.

    Args:
        probabilities: (V,) release probability of each token; their total is at most 1, the rest is failure.
        draw: a uniform draw in [0, 1).

    Returns:
        The index of the token drawn, or None (fail) when `draw` is at or past the total.
    """
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
    calibrate_flags: ClassVar[Mapping[str, dict[str, Any]]] = {}
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
    def parameter_fields(cls, command: str | None = None) -> dict[str, dataclasses.Field[Any]]:
        """name -> field of the parameters (the context fields excluded), those read by `command` if given.

        Args:
            command: one of COMMANDS, or None for every parameter.

        Returns:
            The parameter fields by name, in declaration order.
        """
        return {f.name: f for f in dataclasses.fields(cls) if "help" in f.metadata
                and (command is None or command in f.metadata["commands"])}

    @classmethod
    def required_parameters(cls, command: str | None = None) -> tuple[str, ...]:
        """The parameters `command` cannot do without (a decode also needs those marked decode_required).

        Args:
            command: one of COMMANDS, or None for every parameter.

        Returns:
            Their names, in declaration order.
        """
        return tuple(name for name, f in cls.parameter_fields(command).items()
                     if f.default is MISSING or (command == "decode" and f.metadata["decode_required"]))

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, Any], **context: Unpack[AggregatorContext]) -> Self:
        """The aggregator of a decode's parameter table (a config's [mechanism] or a run's recorded parameters):
        None is "not given", every missing one is named at once; a key it does not read is refused unless at
        its `unused_defaults` value.

        Args:
            parameters: parameter name -> value (None: not given).
            **context: teachers, relation, accounting.

        Returns:
            The validated aggregator.

        Raises:
            ValueError: for a key it does not read (unless at its unused_defaults value), a missing required
                parameter, or a value its validation refuses.
        """
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
        """The parameters a run's manifest records, as given (defaults for the ones not given).

        Args:
            parameters: parameter name -> value, as given.

        Returns:
            Every decode parameter by name: its given value, else its default (None where it has none).
        """
        return {name: parameters.get(name, None if f.default is MISSING else f.default)
                for name, f in cls.parameter_fields("decode").items()}

    def parameters(self, command: str | None = None) -> dict[str, Any]:
        """The validated parameter values (those read by `command` if given).

        Args:
            command: one of COMMANDS, or None for every parameter.

        Returns:
            Parameter name -> this aggregator's value.
        """
        return {name: getattr(self, name) for name in self.parameter_fields(command)}

    def with_context(self, **context: Unpack[AggregatorContext]) -> Self:
        """This aggregator with other context (teachers, relation, accounting), re-validated.

        Args:
            **context: the context fields to replace.

        Returns:
            A new aggregator (dataclasses.replace, so __post_init__ validates it again).
        """
        return dataclasses.replace(self, **context)

    # -- one step ---------------------------------------------------------------------------------------

    @property
    def component(self) -> str:
        """The name of its one charged component (the record key rdp_<component>)."""
        return self.name.replace("-", "_")

    def components(self) -> dict[str, bool]:
        """Charged component -> data-dependent.

        Returns:
            By default its one component, data-independent.
        """
        return {self.component: False}

    def decide(self, counts: NDArray[np.int64], generator: torch.Generator) -> tuple[int | None, float, list[float]]:
        """The aggregator on one histogram: (released token or None, screen statistic, noise drawn), the noise
        list holding what the decision consumed from `generator`, for the trace (the generator replays it).

        Args:
            counts: (V,) the vote histogram, counts >= 0.
            generator: the step's torch generator (its only randomness).

        Returns:
            (released token or None for fail, screen statistic, noise drawn).

        Raises:
            NotImplementedError: in the base class; every registered aggregator implements it.
        """
        raise NotImplementedError(f"aggregator {self.name} does not implement decide")

    def charges(self, counts: NDArray[np.int64], passed: NDArray[np.bool_],
                orders: NDArray[np.float64]) -> dict[str, NDArray[np.float64]]:
        """Each component's RDP (L, K) for histograms (L, V) whose screens passed as `passed` (L,):
        by default the step's data-independent curve at every step.

        Args:
            counts: (L, V) vote histograms of L steps.
            passed: (L,) whether each step's screen passed.
            orders: (K,) Renyi orders, each > 1.

        Returns:
            Component name -> (L, K) float64 RDP charges.
        """
        (name,) = self.components()
        return {name: np.broadcast_to(self.rdp_values(orders), (counts.shape[0], orders.size)).copy()}

    def vote_floor(self) -> float | None:
        """T when every released token must have had at least T votes (T-threshold privacy, checked by the
        audit), None when the aggregator promises no such floor (a DP aggregator's noise may release any).

        Returns:
            T in votes, or None (the default).
        """
        return None

    def realised_path_bounds(self, orders: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
        """(the screen's data-independent bound, the answer's), for realised-path runs whose screen decision
        is released before the answer is charged (a privacy filter charges the answer where it passed).

        Args:
            orders: (K,) Renyi orders, each > 1.

        Returns:
            Two (K,) float64 RDP arrays, or None (the default) where the aggregator has no screen.
        """
        return None

    # -- exact output laws (the audit's neighbours) ------------------------------------------------------

    def log_output_law(self, counts: npt.ArrayLike) -> tuple[float, NDArray[np.float64], float]:
        """(log Pr[fail], log Pr[release j] for every j, relative numerical error) on one histogram.

        Args:
            counts: (V,) the vote histogram.

        Returns:
            (log Pr[fail], (V,) log Pr[release j], relative numerical error bound).

        Raises:
            ValueError: in the base class (no exact output law); aggregators with exact_law implement it.
        """
        raise ValueError(f"aggregator {self.name} has no exact output law")

    def sample_outputs(self, counts: NDArray[np.int64], draws: int, rng: np.random.Generator) -> NDArray[np.int64]:
        """`draws` outputs of the aggregator on one histogram (-1 = fail), for the sampled audit.

        Args:
            counts: (V,) the vote histogram.
            draws: how many outputs to draw, >= 1.
            rng: the numpy generator they are drawn with.

        Returns:
            (draws,) released token indices, -1 for fail.

        Raises:
            ValueError: in the base class (it cannot be sampled).
        """
        raise ValueError(f"aggregator {self.name} cannot be sampled")

    def log_screen_law(self, counts: npt.ArrayLike) -> tuple[float, float]:
        """Where `supports_realised_path`: the screen's (log Pr[fail], log Pr[pass]) on one histogram.

        Args:
            counts: (V,) the vote histogram.

        Returns:
            (log Pr[fail], log Pr[pass]).

        Raises:
            ValueError: in the base class (no screen).
        """
        raise ValueError(f"aggregator {self.name} has no screen")

    def log_answer_law(self, counts: npt.ArrayLike) -> tuple[NDArray[np.float64], float]:
        """Where `supports_realised_path`: the token law given that the screen passed, in logs, with its error.

        Args:
            counts: (V,) the vote histogram.

        Returns:
            ((V,) log Pr[release j | passed], relative numerical error bound).

        Raises:
            ValueError: in the base class (no screen).
        """
        raise ValueError(f"aggregator {self.name} has no screen")

    def surrogate_divergence(self, counts: NDArray[np.int64], neighbour: NDArray[np.int64],
                             orders: NDArray[np.float64]) -> NDArray[np.float64]:
        """Where `exact_law` is False: an upper bound on the released law's Renyi divergence between two
        histograms (that of what the aggregator post-processes), which the audit measures instead.

        Args:
            counts: (V,) the vote histogram.
            neighbour: (V,) a neighbouring histogram.
            orders: (K,) Renyi orders, each > 1.

        Returns:
            (K,) the bound at each order.

        Raises:
            ValueError: in the base class (an exact law needs no surrogate).
        """
        raise ValueError(f"aggregator {self.name} has an exact law")

    def output_law_bounds(self, counts: npt.ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Where `exact_law` is False: certified (lower, upper) bounds (V + 1,) on the released law, entry 0
        the failure (the audit's bracket composes lower bounds of one law against upper bounds of another).

        Args:
            counts: (V,) the vote histogram.

        Returns:
            (lower, upper), each (V + 1,) probabilities.

        Raises:
            ValueError: in the base class (the law is exact).
        """
        raise ValueError(f"aggregator {self.name} has an exact law")

    def sampled_law_bounds(self, histograms: NDArray[np.int64], generator: torch.Generator,
                           eta: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Where `exact_law` is False: (lower, upper) bounds (H, V + 1) on the released laws of `histograms`
        (H, V) tightened by Monte Carlo over common draws, each holding with probability >= 1 - eta.

        Args:
            histograms: (H, V) vote histograms.
            generator: the torch generator of the Monte Carlo draws.
            eta: the failure probability of each bound, in (0, 1).

        Returns:
            (lower, upper), each (H, V + 1) probabilities, column 0 the failure.

        Raises:
            ValueError: in the base class (the law is exact).
        """
        raise ValueError(f"aggregator {self.name} has an exact law")

    def sampled_law_draws(self, histograms: int, vocabulary: int) -> int:
        """How many draws a step `sampled_law_bounds` takes for `histograms` laws over `vocabulary` tokens.

        Args:
            histograms: the number H of laws.
            vocabulary: the number V of tokens.

        Returns:
            The number of draws.

        Raises:
            ValueError: in the base class (the law is exact).
        """
        raise ValueError(f"aggregator {self.name} has an exact law")

    # -- what the commands print (defaults; the built-ins keep their own) --------------------------------

    def account_curve(self, orders: Sequence[float], queries: int, answered: int | None = None) -> RdpCurve:
        """The curve of `queries` steps (`answered` of them answered, for realised-path accounting).

        Args:
            orders: Renyi orders, each > 1.
            queries: the number of steps, >= 0.
            answered: how many were answered (realised-path accounting); unused by default.

        Returns:
            The RdpCurve of the `queries`-fold composition.
        """
        return self.rdp_curve(orders).composed(queries)

    def account_details(self, epsilon: float, queries: int, answered: int | None = None) -> dict[str, Any]:
        """What `dpledger account NAME --json` adds after the mechanism, the queries and the relation.

        Args:
            epsilon: the accounted epsilon (+inf: no guarantee).
            queries: the number of steps.
            answered: how many were answered, if known.

        Returns:
            JSON-ready details: dp_guarantee, the "account" parameters, the note.
        """
        return {"dp_guarantee": math.isfinite(epsilon), **self.parameters("account"), "note": self.account_note}

    def verify_accounts(self, orders: Sequence[float], queries: int, answered: int | None, path: PathAccounting,
                        relation: NeighbouringRelation) -> list[AccountingVariant]:
        """Every data-independent accounting `dpledger verify` compares a claim for `relation` with: by default
        this aggregator's curve under that relation, where it covers it (its natural relation's otherwise).

        Args:
            orders: Renyi orders, each > 1.
            queries: the number of steps.
            answered: how many were answered, if known.
            path: the claim's path accounting.
            relation: the claim's neighbouring relation.

        Returns:
            The accountings, each with its level, soundness and curve.
        """
        at = self.with_context(relation=relation) if relation in self.covered_relations() else self
        return [AccountingVariant(self.name, "proven", self.soundness, True, at.account_curve(orders, queries))]

    def covered_relations(self) -> set[NeighbouringRelation]:
        """The claimed relations this aggregator's curve (at its natural relation) covers.

        Returns:
            By default every NeighbouringRelation.
        """
        return set(NeighbouringRelation)

    @classmethod
    def calibrate(cls, epsilon: float, delta: float, queries: int, fixed: Mapping[str, Any],
                  **options: Any) -> Calibration:
        """The smallest `calibrated` noise scale whose `queries` steps account to at most `epsilon` at `delta`,
        the other parameters `fixed` (dpledger.mechanisms.calibration.calibrate_scale: dp-accounting's
        calibration on a Gaussian DpEvent, RDP bisection otherwise), at the natural relation.

        Args:
            epsilon: the target epsilon, > 0.
            delta: the target delta, in (0, 1).
            queries: the number of steps, >= 1.
            fixed: the other parameters' values (None: not given).
            **options: passed on to calibrate_scale (accountant, orders, method, compare_pld, ...).

        Returns:
            The Calibration: the noise scale found and what it accounts to.

        Raises:
            ValueError: if the aggregator has no noise to calibrate, or as calibrate_scale.
        """
        calibrated = cls.calibrated
        if calibrated is None:
            raise ValueError(f"aggregator {cls.name} has no noise to calibrate")
        fixed = dict(fixed)

        def factory(value: float) -> VoteAggregator:
            given: dict[str, Any] = {key: v for key, v in fixed.items() if v is not None}
            scale: dict[str, Any] = {calibrated: value}
            return cls(**given, **scale, relation=cls.natural_relation)

        return calibrate_scale(factory, epsilon, delta, queries, mechanism_name=cls.name, parameter=calibrated,
                               fixed=fixed, **options)

    @classmethod
    def label(cls, parameters: Mapping[str, Any]) -> str:
        """Its parameters as a report label shows them: "T=2, gamma=1.5".

        Args:
            parameters: parameter name -> value (None or absent: left out).

        Returns:
            "symbol=value" for every decode parameter with a symbol and a non-bool value, comma-separated.
        """
        fields = cls.parameter_fields("decode")
        return ", ".join(f"{f.metadata['symbol']}={parameters[name]:g}" for name, f in fields.items()
                         if f.metadata["symbol"] and parameters.get(name) is not None
                         and not isinstance(parameters[name], bool))

    @classmethod
    def statement_parameters(cls, parameters: Mapping[str, Any]) -> str:
        """Its parameters as the run's privacy statement shows them (by default, as its label).

        Args:
            parameters: parameter name -> value.

        Returns:
            The text.
        """
        return cls.label(parameters)

    @classmethod
    def charge_statement(cls, parameters: Mapping[str, Any]) -> str:
        """What every step is charged, one sentence for the run's privacy statement.

        Args:
            parameters: parameter name -> value.

        Returns:
            The sentence.
        """
        return f"Every step is charged {cls.soundness}."


def _same(expected: object, value: object) -> bool:
    """value is `expected` as a config may spell it: a bool for a bool, a number equal to a number."""
    return isinstance(value, bool) == isinstance(expected, bool) and expected == value


def _realised_path_names() -> str:
    names = sorted(name for name, cls in _REGISTERED.items() if cls.supports_realised_path)
    return ", ".join(names) or "no aggregator"


_A = TypeVar("_A", bound=VoteAggregator)


def register_aggregator(cls: type[_A]) -> type[_A]:
    """Class decorator: make `cls` a frozen, keyword-only dataclass and register it under `cls.name`.
    ValueError when it lacks a declaration or its name is taken.

    Args:
        cls: a VoteAggregator subclass declaring its own name, title, summary, description and
            differentially_private.

    Returns:
        `cls`, made a frozen keyword-only dataclass.

    Raises:
        ValueError: if `cls` is not a VoteAggregator subclass, lacks a declaration, has a name that is not a
            non-empty lower-case string or is taken by another class, a parameter of another type than
            float, int or bool, or a `calibrated` that names none of its parameters (or a non-DP aggregator).
    """
    require(isinstance(cls, type) and issubclass(cls, VoteAggregator),
            f"register_aggregator applies to VoteAggregator subclasses, got {cls!r}")
    require("name" in cls.__dict__, f"aggregator class {cls.__name__} must declare its own name")
    for attribute in ("title", "summary", "description", "differentially_private"):
        require(hasattr(cls, attribute), f"aggregator class {cls.__name__} must declare {attribute}")
    name = cls.__dict__["name"]
    require(isinstance(name, str) and bool(name) and name == name.strip().lower(),
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
