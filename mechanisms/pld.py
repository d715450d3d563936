"""PLD accounting beside RDP: the epsilon of a DpEvent from dp-accounting's privacy loss distributions.

The PLD accountant (Koskela et al. 2020; Doroshenko et al. 2022, "Connect the Dots") discretises
the privacy loss on a grid of width PLD_VALUE_DISCRETIZATION_INTERVAL and composes by FFT. dpledger
always uses its pessimistic estimate (dp-accounting's default): the discretised distribution
dominates the true one, so the epsilon it gives is an upper bound on the mechanism's epsilon at
that delta, like the RDP conversion. Neither is uniformly tighter: PLD is usually tighter for
many compositions of Gaussians (sigma 10, 100 queries, delta 1e-5: PLD 4.38, RDP 4.73), and RDP's
grid gives no better than its edge. dpledger's ledgers are RDP; PLD is reported beside them.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from dpledger.accounting.conversion import ConversionMethod, GridEdgeWarning, epsilon_from_rdp
from dpledger.accounting.errors import (require, require_in_open, require_int_at_least, require_not_nan, require_order,
                               require_positive)
from dpledger.accounting.orders import DEFAULT_ORDERS
from dpledger.accounting.relation import NeighbouringRelation, neighbouring_relation
from dpledger.mechanisms.base import Mechanism, require_mechanism
from dpledger.mechanisms.dp_events import (dp_accounting_relation, effective_gaussian_noise_multiplier, require_dp_event)
from dpledger.mechanisms.dp_events import mechanism_from_dp_event

if TYPE_CHECKING:  # dp_accounting ships no type information: DpEvent is opaque to mypy
    from dp_accounting.dp_event import DpEvent
    from dp_accounting.pld import PLDAccountant

PLD_VALUE_DISCRETIZATION_INTERVAL = 1e-4
"""Width of the privacy-loss grid (dp-accounting's default): the pessimistic PLD epsilon is within
about this much per composed component of the exact one, above it."""


def simplified_event(event: DpEvent) -> DpEvent:
    """An event with the same privacy loss distribution, Gaussian parts merged: every composition of
    unit-sensitivity Gaussians is one Gaussian with 1 / z^2 = sum 1 / z_i^2 (Dong, Roth & Su 2022,
    Corollary 3.3; effective_gaussian_noise_multiplier), so the PLD accountant discretises one
    Gaussian instead of composing discretised ones (faster, and no discretisation error added per
    part). Other events are kept.

    Args:
        event: a dp_accounting DpEvent at unit sensitivity.

    Returns:
        The simplified event: one GaussianDpEvent (NoOpDpEvent when nothing is released) for a composition
        of Gaussians, compositions simplified part by part, anything else as given.

    Raises:
        ValueError: if `event` (or a nested event) is not a DpEvent.
    """
    import dp_accounting

    z = effective_gaussian_noise_multiplier(event)
    if z is not None:
        return dp_accounting.NoOpDpEvent() if math.isinf(z) else dp_accounting.GaussianDpEvent(z)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        parts = [simplified_event(e) for e in event.events]
        gaussians = [p for p in parts if effective_gaussian_noise_multiplier(p) is not None]
        rest = [p for p in parts if effective_gaussian_noise_multiplier(p) is None]
        merged = simplified_event(dp_accounting.ComposedDpEvent(gaussians)) if gaussians else None
        kept = rest + ([merged] if merged is not None and not isinstance(merged, dp_accounting.NoOpDpEvent) else [])
        return kept[0] if len(kept) == 1 else dp_accounting.ComposedDpEvent(kept)
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return dp_accounting.SelfComposedDpEvent(simplified_event(event.event), event.count)
    return event


PLD_NOISE_LIMIT = 0.25
"""Below this composed (Gaussian) noise multiplier the PLD's loss grid is too large to compute in
reasonable time (measured: a composed multiplier of 0.03, GNMax sigma 1 over 600 steps, took 100 s;
0.15 took 114 s inside a calibration): no PLD statement is computed there, RDP only."""


def pld_out_of_range(event: DpEvent) -> str | None:
    """Why the PLD of `event` is not computed (None when it is): a composed Gaussian noise multiplier
    below PLD_NOISE_LIMIT, where the epsilon is large and the grid has millions of points.

    Args:
        event: a dp_accounting DpEvent at unit sensitivity.

    Returns:
        The reason as a sentence, or None.

    Raises:
        ValueError: if `event` is not a DpEvent.
    """
    z = effective_gaussian_noise_multiplier(simplified_event(event))
    if z is not None and z < PLD_NOISE_LIMIT:
        return (f"the composed noise multiplier {z:.3g} is below {PLD_NOISE_LIMIT:g}: the privacy-loss grid would "
                "have millions of points (minutes of dp-accounting); RDP only")
    return None


_COMPOSED: dict[tuple[object, object, object], "PLDAccountant"] = {}
"""pld_epsilon's composed accountants, by (_exact_key of the simplified event, dp-accounting's relation,
_exact_key of the grid's width), the oldest dropped past _COMPOSED_KEPT."""
_COMPOSED_KEPT = 8


def _exact_key(value: object) -> object:
    """A hashable key equal for two values exactly when they are the same event, field for field and
    type for type: an attrs event as its class and fields, a Python float by its hex digits (so -0.0
    and 0.0 differ, and a NaN has no key), a numpy scalar or array by its type or dtype, shape and
    bytes (dp-accounting computes in float32 when handed float32), a list or tuple element by element.
    None (do not reuse) for anything else: a repr would not do, since numpy prints 8 digits and elides
    long arrays.
    """
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes()) if value.dtype.kind in "biuf" else None
    if isinstance(value, np.generic):
        return ("numpy", type(value).__name__, value.tobytes()) if value.dtype.kind in "biuf" else None
    if isinstance(value, float):
        return None if math.isnan(value) else ("float", value.hex())
    if isinstance(value, (bool, int, str)) or value is None:
        return (type(value).__name__, value)
    if isinstance(value, (list, tuple)):
        items = [_exact_key(item) for item in value]
        return None if any(item is None for item in items) else (type(value).__name__, tuple(items))
    fields = getattr(type(value), "__attrs_attrs__", None)
    if fields is None:
        return None
    parts = [_exact_key(getattr(value, field.name)) for field in fields]
    name = f"{type(value).__module__}.{type(value).__qualname__}"
    return None if any(part is None for part in parts) else (name, tuple(parts))


def pld_epsilon(event: DpEvent, delta: float,
                relation: NeighbouringRelation | str = NeighbouringRelation.ADD_OR_REMOVE_ONE,
                value_discretization_interval: float = PLD_VALUE_DISCRETIZATION_INTERVAL) -> float:
    """Epsilon of `event` at `delta` from dp-accounting's PLDAccountant (pessimistic estimate, an upper
    bound; Koskela et al. 2020; Doroshenko et al. 2022), the event read at unit sensitivity under
    dpledger's `relation` (dpledger.mechanisms.dp_events.dp_accounting_relation). +inf where dp-accounting
    cannot build the distribution (a noise multiplier so small that the loss overflows): no statement.
    ValueError for a relation or event dp-accounting cannot account.

    Args:
        event: a dp_accounting DpEvent at unit sensitivity.
        delta: in (0, 1).
        relation: dpledger's NeighbouringRelation the event is stated for (or its value).
        value_discretization_interval: the privacy-loss grid's width, > 0.

    Returns:
        The pessimistic PLD epsilon, >= 0, or +inf where dp-accounting cannot build the distribution.

    Raises:
        ValueError: for an argument out of range, a relation or event dp-accounting cannot account, or
            a NaN epsilon.
    """
    from dp_accounting.pld import PLDAccountant

    require_dp_event("event", event)
    delta = require_in_open("delta", delta, 0.0, 1.0)
    require(value_discretization_interval > 0, f"value_discretization_interval must be > 0, got "
                                               f"{value_discretization_interval!r}")
    dp_relation = dp_accounting_relation(relation, event)
    simple = simplified_event(event)
    # the composed distribution depends on the event, the relation and the grid only: a run's summary
    # asks it at each of its deltas, and runs of one configuration ask it again (2 s a composition)
    exact = _exact_key(simple)
    width = _exact_key(value_discretization_interval)   # its type too: a float32 width composes otherwise
    key = None if exact is None or width is None else (exact, dp_relation, width)
    accountant = None if key is None else _COMPOSED.get(key)
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if accountant is None:
                accountant = PLDAccountant(dp_relation, value_discretization_interval)
                require(accountant.supports(simple), f"dp-accounting's PLDAccountant does not support "
                                                     f"{type(simple).__name__} under {neighbouring_relation(relation).label}")
                accountant.compose(simple)
                if key is not None:
                    _COMPOSED[key] = accountant
                    while len(_COMPOSED) > _COMPOSED_KEPT:
                        _COMPOSED.pop(next(iter(_COMPOSED)))
            epsilon = float(accountant.get_epsilon(delta))
    except (OverflowError, FloatingPointError, ZeroDivisionError, MemoryError):
        return math.inf
    require(not math.isnan(epsilon), "dp-accounting's PLD gave a NaN epsilon")
    return max(epsilon, 0.0)


def rdp_epsilon_of_event(event: DpEvent, delta: float,
                         relation: NeighbouringRelation | str = NeighbouringRelation.ADD_OR_REMOVE_ONE,
                         orders: Sequence[float] = DEFAULT_ORDERS,
                         method: ConversionMethod | str = ConversionMethod.IMPROVED) -> float:
    """Epsilon of `event` through dpledger's own RDP curve of the event's mechanism
    (dpledger.mechanisms.dp_events.mechanism_from_dp_event) and conversion (Balle et al. 2020, Theorem 21).

    Args:
        event: a dp_accounting DpEvent at unit sensitivity.
        delta: in (0, 1).
        relation: dpledger's NeighbouringRelation the event is stated for (or its value).
        orders: the Renyi orders of the curve, each finite and > 1.
        method: the RDP-to-DP conversion (dpledger.accounting.conversion.ConversionMethod).

    Returns:
        The converted epsilon (+inf where the curve gives no guarantee).

    Raises:
        ValueError: for an event with no dpledger mechanism, or an argument out of range.
    """
    curve = mechanism_from_dp_event(event, relation).rdp_curve(orders)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        return epsilon_from_rdp(curve, delta, method).epsilon



def pld_unavailable_reason(mechanism: Mechanism) -> str | None:
    """Why `mechanism` has no PLD statement (None when it has one): its own reason
    (Mechanism.no_pld_reason: a data-dependent charge, no DpEvent, threshold privacy), or a relation
    dp-accounting cannot represent for its event (one-sided remove-one / add-one; replace-one with a
    sampling step), in dpledger.mechanisms.dp_events.dp_accounting_relation's words.

    Args:
        mechanism: a dpledger Mechanism.

    Returns:
        The reason as a sentence, or None.

    Raises:
        ValueError: if `mechanism` is not a Mechanism.
    """
    reason = require_mechanism("mechanism", mechanism).no_pld_reason()
    if reason is not None:
        return reason
    try:
        dp_accounting_relation(mechanism.relation, mechanism.dp_event())
    except ValueError as error:
        return str(error)
    return None

@dataclass(frozen=True)
class RdpPldComparison:
    """RDP and PLD epsilons of one composed mechanism at one delta, and which is tighter.

    `pld_epsilon` is None (and `pld_unavailable_reason` says why) when there is no PLD: no event in
    dp-accounting (PMixED, data-dependent losses) or a relation it cannot represent. `tighter` is
    "rdp", "pld" or "equal" (within 1e-12 relative); "rdp" when there is no PLD. Both are upper
    bounds, so the smaller is the statement to make.
    """

    rdp_epsilon: float
    rdp_order: float | None
    pld_epsilon: float | None
    delta: float
    queries: int
    value_discretization_interval: float
    pld_unavailable_reason: str | None = None

    def __post_init__(self) -> None:
        def epsilon(name: str, value: object) -> float:  # +inf is "no guarantee"; NaN and negative values are not epsilons
            number = require_not_nan(name, value)
            require(number >= 0, f"{name} must be >= 0 (+inf: no guarantee), got {number:g}")
            return number

        require(self.pld_unavailable_reason is None or isinstance(self.pld_unavailable_reason, str),
                f"pld_unavailable_reason must be a string or None, got {self.pld_unavailable_reason!r}")
        fields = dict(rdp_epsilon=epsilon("rdp_epsilon", self.rdp_epsilon),
                      rdp_order=None if self.rdp_order is None else require_order("rdp_order", self.rdp_order),
                      pld_epsilon=None if self.pld_epsilon is None else epsilon("pld_epsilon", self.pld_epsilon),
                      delta=require_in_open("delta", self.delta, 0.0, 1.0),
                      queries=require_int_at_least("queries", self.queries, 1),
                      value_discretization_interval=require_positive("value_discretization_interval",
                                                                     self.value_discretization_interval))
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    @property
    def tighter(self) -> str:
        if self.pld_epsilon is None:
            return "rdp"
        scale = max(abs(self.rdp_epsilon), abs(self.pld_epsilon), 1e-300)
        if self.rdp_epsilon == self.pld_epsilon or (math.isfinite(scale) and
                                                    abs(self.rdp_epsilon - self.pld_epsilon) <= 1e-12 * scale):
            return "equal"
        return "pld" if self.pld_epsilon < self.rdp_epsilon else "rdp"

    @property
    def epsilon(self) -> float:
        """The smaller of the two (both are upper bounds)."""
        return self.rdp_epsilon if self.pld_epsilon is None else min(self.rdp_epsilon, self.pld_epsilon)


def composed_event(mechanism: Mechanism, queries: int) -> DpEvent | None:
    """SelfComposedDpEvent(mechanism.dp_event(), queries); None when the mechanism has no event.

    Args:
        mechanism: a dpledger Mechanism.
        queries: the number of adaptive runs, an integer >= 1.

    Returns:
        The SelfComposedDpEvent, or None.

    Raises:
        ValueError: if `mechanism` is not a Mechanism or `queries` is not an integer >= 1.
    """
    import dp_accounting

    event = require_mechanism("mechanism", mechanism).dp_event()
    queries = require_int_at_least("queries", queries, 1)
    return None if event is None else dp_accounting.SelfComposedDpEvent(event, queries)


def compare_rdp_pld(mechanism: Mechanism, queries: int, delta: float, orders: Sequence[float] = DEFAULT_ORDERS,
                    method: ConversionMethod | str = ConversionMethod.IMPROVED,
                    value_discretization_interval: float = PLD_VALUE_DISCRETIZATION_INTERVAL) -> RdpPldComparison:
    """`queries` adaptive compositions of `mechanism` (Mironov 2017, Proposition 1), converted at
    `delta` by dpledger's RDP accounting and, where the mechanism has an event, by dp-accounting's PLD.

    Args:
        mechanism: a dpledger Mechanism.
        queries: the number of adaptive runs, an integer >= 1.
        delta: in (0, 1).
        orders: the Renyi orders of the RDP curve, each finite and > 1.
        method: the RDP-to-DP conversion.
        value_discretization_interval: the PLD's privacy-loss grid width, > 0.

    Returns:
        The RdpPldComparison: both epsilons (the PLD's None with the reason where there is none).

    Raises:
        ValueError: for an argument out of range, or as pld_epsilon.
    """
    queries = require_int_at_least("queries", queries, 1)
    delta = require_in_open("delta", delta, 0.0, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        rdp = epsilon_from_rdp(mechanism.rdp_curve(orders).composed(queries), delta, method)
    reason = pld_unavailable_reason(mechanism) or pld_out_of_range(composed_event(mechanism, queries))
    pld = None if reason is not None else pld_epsilon(composed_event(mechanism, queries), delta, mechanism.relation,
                                                      value_discretization_interval)
    return RdpPldComparison(rdp.epsilon, rdp.order, pld, delta, queries, value_discretization_interval, reason)
