"""dp_accounting DpEvents both ways: relations, the inverse map to dpledger mechanisms, and JSON.

A dpledger mechanism knows its own event (`Mechanism.dp_event`, autodp's design). Every event
dpledger builds is normalised to unit L2 sensitivity of one neighbouring move under the mechanism's
own relation: its noise multiplier is the noise standard deviation divided by that sensitivity,
so a GaussianDpEvent(z) is the pair N(0, z^2) vs N(1, z^2), RDP alpha / (2 z^2) (Mironov 2017,
Corollary 3). GNMax, for instance, adds N(0, sigma^2) to a histogram whose replace-one L2
sensitivity is sqrt 2, so its event is GaussianDpEvent(sigma / sqrt 2).

Why dp_accounting's ADD_OR_REMOVE_ONE is used for replace-one mechanisms too: dp-accounting 0.6.0
reads a GaussianDpEvent under REPLACE_ONE in two ways. Its RdpAccountant charges alpha / (2 z^2)
whatever the relation (the unit-shift pair), while its PLDAccountant charges the pair N(0, z^2) vs
N(2, z^2) (records of norm <= C, a replacement moves the sum by 2C): for z = 10 over 100 queries at
delta = 1e-5 that is epsilon 4.73 (RDP) against 10.0 (PLD). One event cannot mean both. A
unit-sensitivity event accounted under ADD_OR_REMOVE_ONE means the same pair in both accountants,
and for a mechanism without subsampling that pair is the dominating pair of the mechanism under
its own relation, replace-one included. Poisson subsampling is analysed for add-or-remove only
(in dpledger and in dp-accounting), so an event with a sampling step under replace-one is refused.
"""
from __future__ import annotations

import importlib
import math
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import attr

from dpledger.accounting.errors import require
from dpledger.accounting.relation import NeighbouringRelation, neighbouring_relation
from dpledger.accounting.strict_json import loads_json, strict_json_text
from dpledger.mechanisms.base import ComposedMechanism, Mechanism, SelfComposedMechanism
from dpledger.mechanisms.gaussian import GaussianMechanism, PoissonSubsampledGaussian

if TYPE_CHECKING:  # dp_accounting ships no type information: its classes are opaque to mypy
    from dp_accounting import NeighboringRelation as DpAccountingRelation
    from dp_accounting.dp_event import DpEvent

DP_EVENT_FILE_FORMAT = "dpledger.dp_event"
DP_EVENT_FILE_VERSION = 1
UNIT_SENSITIVITY_NOTE = ("every noise multiplier is the noise standard deviation divided by the L2 sensitivity of one "
                         "neighbouring move under `relation`; account it with dp_accounting's ADD_OR_REMOVE_ONE")
_SAMPLING_EVENTS = ("PoissonSampledDpEvent", "SampledWithReplacementDpEvent", "SampledWithoutReplacementDpEvent",
                    "TruncatedSubsampledGaussianDpEvent")


def _dp_event_module() -> ModuleType:
    return importlib.import_module("dp_accounting.dp_event")


def require_dp_event(name: str, event: object) -> DpEvent:
    """Check that `event` is a dp_accounting DpEvent.

    Args:
        name: what the value is, for the error message.
        event: the value to check.

    Returns:
        `event` itself.

    Raises:
        ValueError: if `event` is not a dp_accounting DpEvent.
    """
    require(isinstance(event, _dp_event_module().DpEvent), f"{name} must be a dp_accounting DpEvent, got "
                                                            f"{type(event).__name__}")
    return event


def _subevents(event: DpEvent) -> list[DpEvent]:
    """The events nested directly in `event` (composition, sampling, repetition)."""
    module = _dp_event_module()
    if isinstance(event, module.ComposedDpEvent):
        return list(event.events)
    inner = getattr(event, "event", None)
    return [inner] if isinstance(inner, module.DpEvent) else []


def contains_sampling(event: DpEvent) -> bool:
    """True when `event` has a subsampling step anywhere in it.

    Args:
        event: a dp_accounting DpEvent.

    Returns:
        Whether a Poisson, with- or without-replacement sampling or truncated subsampled Gaussian
        event occurs anywhere in `event`.

    Raises:
        ValueError: if `event` (or an event nested in it) is not a DpEvent.
    """
    require_dp_event("event", event)
    return type(event).__name__ in _SAMPLING_EVENTS or any(contains_sampling(e) for e in _subevents(event))


def dp_accounting_relation(relation: NeighbouringRelation | DpAccountingRelation | str,
                           event: DpEvent | None = None) -> DpAccountingRelation:
    """The dp_accounting NeighboringRelation to account a dpledger event under `relation` with.

    add_or_remove_one -> ADD_OR_REMOVE_ONE. replace_one -> ADD_OR_REMOVE_ONE too, for an event
    without a sampling step: the event is normalised to unit sensitivity under replace-one and its
    Gaussian pair is the same under either reading (see the module docstring for why dp_accounting's
    REPLACE_ONE is not used); ValueError for an event with a sampling step (Poisson amplification is
    analysed for add-or-remove only). remove_one and add_one: ValueError (dp-accounting has no
    one-sided relation; a data-independent mechanism stated for add_or_remove_one covers both).

    Args:
        relation: dpledger's NeighbouringRelation (or its value, e.g. "replace_one"), or a
            dp_accounting NeighboringRelation, which must be ADD_OR_REMOVE_ONE.
        event: the DpEvent to be accounted, if known (checked for a sampling step under replace-one).

    Returns:
        dp_accounting's NeighboringRelation.ADD_OR_REMOVE_ONE.

    Raises:
        ValueError: for a dp_accounting relation other than ADD_OR_REMOVE_ONE, an unknown relation name,
            replace_one with a subsampled event, or remove_one / add_one.
    """
    from dp_accounting import NeighboringRelation as DpAccountingRelation

    if isinstance(relation, DpAccountingRelation):
        require(relation is DpAccountingRelation.ADD_OR_REMOVE_ONE,
                f"dp_accounting relation {relation.name} is ambiguous for a GaussianDpEvent in dp-accounting 0.6.0 "
                "(its RdpAccountant reads a unit shift, its PLDAccountant a shift of 2): state the event at unit "
                "sensitivity and use ADD_OR_REMOVE_ONE, or pass dpledger's NeighbouringRelation")
        return relation
    ours = neighbouring_relation(relation)
    if ours is NeighbouringRelation.ADD_OR_REMOVE_ONE:
        return DpAccountingRelation.ADD_OR_REMOVE_ONE
    if ours is NeighbouringRelation.REPLACE_ONE:
        require(event is None or not contains_sampling(event),
                "relation replace_one cannot be accounted with a subsampled DpEvent: Poisson amplification is "
                "analysed for add_or_remove_one neighbours only (Mironov, Talwar & Zhang 2019; dp-accounting refuses "
                "PoissonSampledDpEvent under REPLACE_ONE)")
        return DpAccountingRelation.ADD_OR_REMOVE_ONE
    raise ValueError(f"relation {ours.label} cannot be represented in dp-accounting (it has add-or-remove-one, "
                     "replace-one and replace-special, no one-sided relation): no PLD; RDP only")


def effective_gaussian_noise_multiplier(event: DpEvent) -> float | None:
    """z with 1 / z^2 = sum of count_i / z_i^2 when `event` is built only from GaussianDpEvents (and
    NoOpDpEvents) by composition; None otherwise. A composition of unit-sensitivity Gaussian
    mechanisms is exactly one Gaussian mechanism: RDP adds up, sum alpha / (2 z_i^2) (Mironov 2017,
    Proposition 1), and so do the squared GDP parameters (Dong, Roth & Su 2022, Corollary 3.3). +inf
    for an event that releases nothing.

    Args:
        event: a dp_accounting DpEvent, at unit sensitivity.

    Returns:
        The effective noise multiplier z > 0 (+inf when nothing is released), or None when the event
        holds anything but Gaussian, NoOp, composed and self-composed events.

    Raises:
        ValueError: if `event` is not a DpEvent, or a GaussianDpEvent's noise multiplier is not a number.
    """
    module = _dp_event_module()
    require_dp_event("event", event)

    def precision(e: DpEvent) -> float | None:  # sum of 1 / z^2
        if isinstance(e, module.NoOpDpEvent):
            return 0.0
        if isinstance(e, module.GaussianDpEvent):
            with np.errstate(all="ignore"):  # z = 1e-200 gives +inf, z = 1e200 gives 0: never an error
                return float(np.float64(1.0) / np.float64(_number("GaussianDpEvent.noise_multiplier",
                                                                  e.noise_multiplier)) ** 2)
        if isinstance(e, module.SelfComposedDpEvent):
            inner = precision(e.event)
            return None if inner is None else (0.0 if e.count == 0 else inner * e.count)
        if isinstance(e, module.ComposedDpEvent):
            parts = [precision(p) for p in e.events]
            known = [p for p in parts if p is not None]
            return None if len(known) < len(parts) else float(sum(known))
        return None

    total = precision(event)
    if total is None:
        return None
    return math.inf if total == 0 else float(1.0 / math.sqrt(total))


def mechanism_from_dp_event(event: DpEvent, relation: NeighbouringRelation | str = NeighbouringRelation.ADD_OR_REMOVE_ONE
                            ) -> Mechanism:
    """The dpledger mechanism of a unit-sensitivity DpEvent, stated for `relation` (dpledger's).

    GaussianDpEvent(z) -> GaussianMechanism(z) (Mironov 2017, Corollary 3);
    PoissonSampledDpEvent(q, Gaussian) -> PoissonSubsampledGaussian(z, q) (Mironov, Talwar & Zhang
    2019; add_or_remove_one only; a composition of Gaussians inside is one Gaussian with
    effective_gaussian_noise_multiplier, as dp-accounting's RdpAccountant reads it);
    ComposedDpEvent -> ComposedMechanism; SelfComposedDpEvent -> SelfComposedMechanism (Mironov 2017,
    Proposition 1); NoOpDpEvent -> a mechanism charged 0 at every order. ValueError naming the type
    of any other event. An event built for dp_accounting's REPLACE_ONE with records of norm <= C (a
    replacement moving the sum by 2C, as its PLDAccountant reads it) must have its noise multiplier
    halved before it is read here at relation replace_one.

    Args:
        event: a dp_accounting DpEvent at unit L2 sensitivity.
        relation: dpledger's NeighbouringRelation the event is stated for (or its value).

    Returns:
        The dpledger Mechanism whose RDP curve is the event's.

    Raises:
        ValueError: for an event of any other type, a PoissonSampledDpEvent under a relation other than
            add_or_remove_one or around anything but Gaussians, an empty ComposedDpEvent, a parameter
            that is not a number, or an unknown relation.
    """

    module = _dp_event_module()
    require_dp_event("event", event)
    ours = neighbouring_relation(relation)
    if isinstance(event, module.GaussianDpEvent):
        return GaussianMechanism(_number("GaussianDpEvent.noise_multiplier", event.noise_multiplier), relation=ours)
    if isinstance(event, module.PoissonSampledDpEvent):
        require(ours is NeighbouringRelation.ADD_OR_REMOVE_ONE,
                f"PoissonSampledDpEvent needs relation add_or_remove_one (Poisson amplification), got {ours.label}")
        z = effective_gaussian_noise_multiplier(require_dp_event("PoissonSampledDpEvent.event", event.event))
        if z is None:
            raise ValueError("PoissonSampledDpEvent has a dpledger mechanism only around GaussianDpEvents, got "
                             f"{type(event.event).__name__}")
        return PoissonSubsampledGaussian(z, _number("PoissonSampledDpEvent.sampling_probability",
                                                    event.sampling_probability))
    if isinstance(event, module.ComposedDpEvent):
        require(len(event.events) > 0, "ComposedDpEvent with no events has no dpledger mechanism")
        return ComposedMechanism(tuple(mechanism_from_dp_event(e, ours) for e in event.events))
    if isinstance(event, module.SelfComposedDpEvent):
        return SelfComposedMechanism(mechanism_from_dp_event(event.event, ours), event.count)
    if isinstance(event, module.NoOpDpEvent):
        # releases nothing: charged 0 at every order (any mechanism composed zero times)
        return SelfComposedMechanism(GaussianMechanism(1.0, relation=ours), 0)
    raise ValueError(f"no dpledger mechanism for {type(event).__name__}: supported are GaussianDpEvent, "
                     "PoissonSampledDpEvent of Gaussians, ComposedDpEvent, SelfComposedDpEvent and NoOpDpEvent")


def _number(name: str, value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return value


# ---- JSON ----

def dp_event_to_dict(event: DpEvent) -> dict[str, object]:
    """`event` as a JSON-ready dict in the layout of dp-accounting's DpEvent.to_named_tuple:
    {"module_name": "dp_accounting.dp_event", "class_name": ..., one key per attrs field}, nested
    events as nested dicts and lists as lists.

    Args:
        event: a dp_accounting DpEvent.

    Returns:
        The dict: strings, numbers, lists and nested dicts only.

    Raises:
        ValueError: if `event` is not a DpEvent or dp_accounting cannot name it (to_named_tuple).
    """
    named = require_dp_event("event", event).to_named_tuple()  # ValueError for events it cannot name

    def plain(value: object) -> object:
        if hasattr(value, "_fields") and hasattr(value, "class_name"):
            return {field: plain(getattr(value, field)) for field in value._fields}
        if isinstance(value, (list, tuple)):
            return [plain(item) for item in value]
        return value

    body = plain(named)
    if not isinstance(body, dict):
        raise ValueError(f"{type(event).__name__}.to_named_tuple() gave no named fields: {named!r}")
    return body


def dp_event_from_dict(payload: object, where: str = "dp_event") -> DpEvent:
    """The DpEvent a dict from dp_event_to_dict names. Only classes of dp_accounting.dp_event are
    built (no other module is imported from a file); every attrs field must be given, no other key;
    leaves must be numbers. ValueError naming the path and the problem otherwise.

    Args:
        payload: the dict (parsed JSON).
        where: the path of `payload` in its document, for error messages.

    Returns:
        The DpEvent, nested events built recursively.

    Raises:
        ValueError: if `payload` is not a dict, names another module or a class that is not an attrs
            DpEvent class of dp_accounting.dp_event, lacks a field or has an extra key, or has a leaf
            that is not a number.
    """
    module = _dp_event_module()
    if not isinstance(payload, dict):
        raise ValueError(f"{where} must be an object naming a DpEvent, got {type(payload).__name__}")
    module_name = payload.get("module_name", module.__name__)
    require(module_name == module.__name__, f"{where}.module_name must be {module.__name__!r}, got {module_name!r}")
    class_name = payload.get("class_name")
    cls = getattr(module, class_name, None) if isinstance(class_name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, module.DpEvent) and attr.has(cls)):
        raise ValueError(f"{where}.class_name must name a DpEvent class of dp_accounting.dp_event, got {class_name!r}")
    fields = [field.name for field in attr.fields(cls)]
    given = set(payload) - {"module_name", "class_name"}
    require(given == set(fields), f"{where}: {class_name} has fields {sorted(fields)}, got {sorted(given)}")

    def value_of(value: object, path: str) -> object:
        if isinstance(value, dict):
            return dp_event_from_dict(value, path)
        if isinstance(value, list):
            return [value_of(item, f"{path}[{index}]") for index, item in enumerate(value)]
        require(isinstance(value, (int, float)) and not isinstance(value, bool),
                f"{path} must be a number, a list or a DpEvent object, got {value!r}")
        return value

    return cls(**{name: value_of(payload[name], f"{where}.{name}") for name in fields})


def dp_event_to_json(event: DpEvent, relation: NeighbouringRelation | str | None = None) -> str:
    """Strict JSON text of `event` (dp_event_to_dict). With `relation` (dpledger's), a file envelope
    {"format", "version", "relation", "dp_accounting_neighboring_relation", "normalisation",
    "dp_event"} that says how the event is to be accounted.

    Args:
        event: a dp_accounting DpEvent at unit sensitivity.
        relation: dpledger's NeighbouringRelation (or its value) the event is stated for; None for a
            bare event without an envelope.

    Returns:
        The JSON text.

    Raises:
        ValueError: if `event` is not a DpEvent dp_accounting can name, or the relation cannot be
            represented in dp-accounting for this event (dp_accounting_relation).
    """
    body = dp_event_to_dict(event)
    if relation is None:
        return strict_json_text(body, sort_keys=False)
    ours = neighbouring_relation(relation)
    return strict_json_text({"format": DP_EVENT_FILE_FORMAT, "version": DP_EVENT_FILE_VERSION,
                             "relation": ours.value,
                             "dp_accounting_neighboring_relation": dp_accounting_relation(ours, event).name,
                             "normalisation": UNIT_SENSITIVITY_NOTE, "dp_event": body}, sort_keys=False)


def read_dp_event_json(text: str, where: str = "DpEvent JSON") -> tuple[DpEvent, NeighbouringRelation | None]:
    """(event, relation) from dp_event_to_json's text: relation is dpledger's NeighbouringRelation from
    an envelope, None for a bare event.

    Args:
        text: the JSON text.
        where: what the text is (e.g. a file name), for error messages.

    Returns:
        (event, relation): the DpEvent, and the envelope's relation or None for a bare event.

    Raises:
        ValueError: if the text is not JSON, not an object, an envelope of another format or version or
            with an unknown relation, or the event is malformed (dp_event_from_dict).
    """
    try:
        payload = loads_json(text, where)
    except ValueError as error:  # json.JSONDecodeError
        raise ValueError(f"{where}: not JSON: {error}") from None
    require(isinstance(payload, dict), f"{where}: must be a JSON object, got {type(payload).__name__}")
    if "dp_event" not in payload:
        return dp_event_from_dict(payload, f"{where}: dp_event"), None
    require(payload.get("format") == DP_EVENT_FILE_FORMAT,
            f"{where}: format must be {DP_EVENT_FILE_FORMAT!r}, got {payload.get('format')!r}")
    require(payload.get("version") == DP_EVENT_FILE_VERSION,
            f"{where}: version must be {DP_EVENT_FILE_VERSION}, got {payload.get('version')!r}")
    relation = neighbouring_relation(payload.get("relation"))
    return dp_event_from_dict(payload["dp_event"], f"{where}: dp_event"), relation


def dp_event_from_json(text: str, where: str = "DpEvent JSON") -> DpEvent:
    """The DpEvent in dp_event_to_json's text (a bare event or a file envelope).

    Args:
        text: the JSON text.
        where: what the text is, for error messages.

    Returns:
        The DpEvent (the envelope's relation, if any, is dropped).

    Raises:
        ValueError: as read_dp_event_json.
    """
    return read_dp_event_json(text, where)[0]
