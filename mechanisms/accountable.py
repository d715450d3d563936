"""Mechanisms `dpledger account` composes from their parameters alone: each declares, on its class, its
command name, its one-line summary, its parameters (dataclass fields made by `mechanism_parameter`,
carrying each flag's help, unit and metavar), whether it has a DpEvent and the parameter `dpledger
calibrate` solves for; `register_mechanism` records it (dpledger.mechanisms.registry lists them).

The vote aggregators have their own, richer declaration (dpledger.mechanisms.aggregation.VoteAggregator).
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import MISSING, field
from typing import Any, ClassVar, Mapping, Self, Sequence, TypeVar

from dpledger.accounting.errors import require
from dpledger.mechanisms.base import Mechanism

_REGISTERED: dict[str, type["AccountableMechanism"]] = {}

TEACHERS_HELP = "ensemble size N (number of teachers, >= 1)"
"""The help of a `teachers` parameter's flag (PMixED's and the screening's)."""


def mechanism_parameter(*, help: str, unit: str, metavar: str | None = None, type: type = float,
                        flag: str | None = None, choices: Sequence[str] | None = None, default: Any = MISSING) -> Any:
    """A parameter field of an accountable mechanism, with what its `dpledger account` flag shows.

    Args:
        help: the flag's whole help text (it names the unit and the range, as the user reads them).
        unit: the parameter's unit, e.g. "votes", "unitless", "nats".
        metavar: the flag's metavar (none for a flag with `choices`).
        type: how the flag parses its value (float, int or str).
        flag: the flag's table name when it differs from the field's, e.g. "sample_rate" for
            sampling_probability (typed --sample-rate).
        choices: the values the flag accepts, if it is a choice.
        default: the field's default; none (MISSING) makes the flag required.

    Returns:
        A dataclasses.field carrying these as metadata (typed Any, as dataclasses.field is).

    Raises:
        ValueError: if neither a metavar nor choices is given.
    """
    require(metavar is not None or choices is not None, "a mechanism parameter needs a metavar or choices")
    metadata = {"help": help, "unit": unit, "metavar": metavar, "type": type, "flag": flag,
                "choices": None if choices is None else tuple(choices)}
    return field(default=default, metadata=metadata)


class AccountableMechanism(Mechanism):
    """A mechanism `dpledger account NAME` builds from its flags and composes Q times.

    A subclass is a frozen dataclass registered with `register_mechanism`; it declares `name`, `summary`
    and its parameters as `mechanism_parameter` fields (a field without that metadata, e.g. `relation`,
    is no flag).
    """

    name: ClassVar[str]                    # the `dpledger account` / `dpledger calibrate` subcommand
    summary: ClassVar[str]                 # one line, with its citation: `dpledger account NAME --help`
    has_dp_event: ClassVar[bool] = False
    """Whether `dp_event` gives a DpEvent: `dpledger account NAME` then shows dp-accounting's PLD epsilon
    beside the RDP one and offers --dp-event-out."""
    calibrated: ClassVar[str | None] = None
    """The field `dpledger calibrate NAME` solves for (None: it is not calibrated)."""
    calibrate_summary: ClassVar[str] = ""  # one line, with its citation: `dpledger calibrate NAME --help`
    calibrate_derived: ClassVar[Sequence[str]] = ()
    """Parameters `dpledger calibrate NAME` derives from the calibrated one, so no flag of it (ConfidentGNMax's
    sigma_threshold = --ratio * sigma)."""
    flag_order: ClassVar[Sequence[str]] = ()
    """The parameter fields in the order their flags are listed, where that differs from declaration order."""
    account_fixed: ClassVar[Mapping[str, Any]] = {}
    """Fields that are no flag but that `dpledger account` sets (ConfidentGNMax's threshold: the curve
    does not depend on it)."""

    @classmethod
    def parameter_fields(cls) -> dict[str, dataclasses.Field[Any]]:
        """field name -> field of the parameters that are flags, in the order their flags are listed.

        Returns:
            The fields carrying `mechanism_parameter` metadata, in `flag_order` or else declaration order.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                  if "help" in f.metadata}
        order = list(cls.flag_order) + [name for name in fields if name not in cls.flag_order]
        return {name: fields[name] for name in order}

    @classmethod
    def flags(cls) -> dict[str, dataclasses.Field[Any]]:
        """flag table name -> field (e.g. "sample_rate" -> sampling_probability), in listing order.

        Returns:
            The parameter fields keyed by their flags' table names.
        """
        return {f.metadata["flag"] or name: f for name, f in cls.parameter_fields().items()}

    @classmethod
    def required_flags(cls) -> tuple[str, ...]:
        """The flags of the parameters without a default.

        Returns:
            Their table names, in listing order.
        """
        return tuple(flag for flag, f in cls.flags().items() if f.default is MISSING)

    @classmethod
    def optional_flags(cls) -> tuple[str, ...]:
        """The flags of the parameters with a default.

        Returns:
            Their table names, in listing order.
        """
        return tuple(flag for flag, f in cls.flags().items() if f.default is not MISSING)

    @classmethod
    def flag_default(cls, flag: str) -> Any:
        """The value an optional flag takes when not given (an enum default as its value), or None.

        Args:
            flag: a flag table name of this mechanism.

        Returns:
            The field's default (its `.value` for an enum member), or None for a required one.

        Raises:
            KeyError: if `flag` is not one of this mechanism's flags.
        """
        default = cls.flags()[flag].default
        if default is MISSING:
            return None
        return default.value if isinstance(default, enum.Enum) else default

    @classmethod
    def from_flags(cls, values: Mapping[str, Any]) -> Self:
        """The mechanism with these flag values (and `account_fixed`); it validates its own parameters.

        Args:
            values: flag table name -> value, for every flag of this mechanism.

        Returns:
            The validated mechanism.

        Raises:
            ValueError: if a value is out of range.
        """
        return cls(**cls.account_fixed, **{f.name: values[flag] for flag, f in cls.flags().items()})


_M = TypeVar("_M", bound=AccountableMechanism)


def register_mechanism(cls: type[_M]) -> type[_M]:
    """Class decorator (above @dataclass): register an accountable mechanism under `cls.name`.

    Args:
        cls: an AccountableMechanism dataclass declaring its own name and summary.

    Returns:
        `cls`, unchanged.

    Raises:
        ValueError: if `cls` is not an AccountableMechanism dataclass, lacks its own name or summary, its name
            is not a non-empty lower-case string or is taken by another class, or `calibrated` or
            `flag_order` names a field that is no parameter.
    """
    require(isinstance(cls, type) and issubclass(cls, AccountableMechanism) and dataclasses.is_dataclass(cls),
            f"register_mechanism applies to AccountableMechanism dataclasses, got {cls!r}")
    for attribute in ("name", "summary"):
        require(attribute in cls.__dict__, f"mechanism class {cls.__name__} must declare its own {attribute}")
    name = cls.__dict__["name"]
    require(isinstance(name, str) and bool(name) and name == name.strip().lower(),
            f"mechanism name must be a non-empty lower-case string, got {name!r}")
    require(name not in _REGISTERED or _REGISTERED[name].__qualname__ == cls.__qualname__,
            f"mechanism name {name!r} is already registered by {_REGISTERED.get(name)!r}")
    names = {f.name for f in dataclasses.fields(cls) if "help" in f.metadata}  # type: ignore[arg-type]
    require(set(cls.flag_order) <= names, f"{cls.__name__}.flag_order names a field that is no parameter")
    require(cls.calibrated is None or cls.calibrated in names,
            f"{cls.__name__}.calibrated must name one of its parameters, got {cls.calibrated!r}")
    require(set(cls.calibrate_derived) <= names, f"{cls.__name__}.calibrate_derived names a field that is no parameter")
    _REGISTERED[name] = cls
    return cls
