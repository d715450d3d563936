"""Mechanisms as objects that know their own RDP curve; composition and subsampling are functions
from mechanisms to mechanisms (autodp's design), so the accountant needs no isinstance chain.
"""
from __future__ import annotations

import abc
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

import numpy as np
from numpy.typing import NDArray

from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.errors import require, require_int_at_least
from dpledger.accounting.orders import DEFAULT_ORDERS, canonical_orders, validated_orders
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.accounting.summation import up_multiply, upper_sum

if TYPE_CHECKING:  # dp_accounting ships no type information: DpEvent is opaque to mypy
    from dp_accounting.dp_event import DpEvent


_M = TypeVar("_M", bound="Mechanism")


def _checked_rdp_values(
        rdp_values: Callable[[_M, NDArray[np.float64]], NDArray[np.float64]],
) -> Callable[[_M, NDArray[np.float64]], NDArray[np.float64]]:
    """Wrap a subclass's rdp_values: orders validated on the way in (finite, > 1), values on the
    way out (one per order, never NaN, never negative), so no mechanism can return a NaN or a
    negative privacy loss, whatever its formula does.

    Each value is also lowered to the smallest value at any larger requested order: the Renyi
    divergence is non-decreasing in the order (van Erven & Harremoes 2014, Theorem 3), so a bound at
    order b >= a bounds order a too. Some bounds are not monotone themselves (Zhu & Wang 2019's
    general amplification of a Gaussian with sigma 11, q 0.03: 0.00497 at order 35, 0.00496 at 289).
    """

    @functools.wraps(rdp_values)
    def checked(self: _M, given: NDArray[np.float64]) -> NDArray[np.float64]:
        orders = validated_orders(given)
        values: NDArray[np.float64] = np.asarray(rdp_values(self, orders), dtype=np.float64)
        require(values.shape == orders.shape,
                f"{type(self).__name__}.rdp_values must give one value per order, got shape {values.shape}")
        nan = np.isnan(values)
        if np.any(nan):
            raise ValueError(f"{type(self).__name__} gave a NaN RDP value at order {float(orders[nan][0]):g}")
        if np.any(values < 0):
            raise ValueError(f"{type(self).__name__} gave a negative RDP value {float(values.min())!r}")
        ascending = np.argsort(orders, kind="stable")
        suffix_min = np.minimum.accumulate(values[ascending][::-1])[::-1]
        values[ascending] = suffix_min
        return values

    return checked


def set_validated(spec: object, **fields: object) -> None:
    """Store validated (converted) field values on a frozen dataclass, so that e.g. "2" never
    survives validation as a string.

    Args:
        spec: the frozen dataclass instance, in its `__post_init__`.
        **fields: field name -> its validated value, each stored with object.__setattr__ (bypassing
            the frozen check).
    """
    for name, value in fields.items():
        object.__setattr__(spec, name, value)


def require_relation(relation: object) -> NeighbouringRelation:
    """Check that `relation` is a NeighbouringRelation.

    Args:
        relation: the value given as a mechanism's relation.

    Returns:
        `relation` itself, typed as a NeighbouringRelation.

    Raises:
        ValueError: if `relation` is not a NeighbouringRelation.
    """
    if not isinstance(relation, NeighbouringRelation):
        raise ValueError(f"relation must be a NeighbouringRelation, got {relation!r}")
    return relation


def require_mechanism(name: str, mechanism: object) -> Mechanism:
    """Check that `mechanism` is a Mechanism.

    Args:
        name: what the value is, for the error message (e.g. "part 0").
        mechanism: the value to check.

    Returns:
        `mechanism` itself, typed as a Mechanism.

    Raises:
        ValueError: if `mechanism` is not a Mechanism.
    """
    if not isinstance(mechanism, Mechanism):
        raise ValueError(f"{name} must be a Mechanism, got {type(mechanism).__name__}")
    return mechanism


class Mechanism(abc.ABC):
    """A randomised algorithm with a known RDP curve for one neighbouring relation.

    Subclasses are frozen dataclasses implementing `rdp_values`; `data_dependent` is True when the
    curve depends on the private data (then it is a data-dependent loss, Papernot et al. 2018,
    Definition 5). Every subclass's `rdp_values` is wrapped so that its orders and values are checked.
    """

    if TYPE_CHECKING:
        # read-only to the type checker: a spec overrides them with dataclass fields, class attributes or
        # properties (a composition's relation is its parts'), and every spec is frozen
        @property
        def relation(self) -> NeighbouringRelation: ...

        @property
        def data_dependent(self) -> bool: ...
    else:
        relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE
        data_dependent: bool = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "rdp_values" in cls.__dict__ and not getattr(cls.__dict__["rdp_values"], "__isabstractmethod__", False):
            # replaced on the class object itself (mypy refuses assigning to a method name)
            type.__setattr__(cls, "rdp_values", _checked_rdp_values(cls.__dict__["rdp_values"]))

    @abc.abstractmethod
    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        """RDP epsilon at each order (a float64 array, +inf where no guarantee).

        Args:
            orders: Renyi orders, a non-empty 1-D float64 array, each finite and > 1 (any order,
                repeats allowed).

        Returns:
            A float64 array of the same shape: epsilon(order) >= 0 at each order (never NaN),
            non-increasing towards smaller orders, +inf where no guarantee.

        Raises:
            ValueError: if an order is not finite and > 1, or (from the wrapper every subclass gets)
                if the subclass's formula gives the wrong shape, a NaN or a negative value.
        """

    def rdp_curve(self, orders: Sequence[float] = DEFAULT_ORDERS) -> RdpCurve:
        """This mechanism's RDP curve on `orders` (sorted, repeats merged).

        Args:
            orders: Renyi orders, each finite and > 1 (DEFAULT_ORDERS, dp-accounting's grid, by default).

        Returns:
            An RdpCurve on the sorted distinct orders, for this mechanism's relation, marked
            data-dependent when the mechanism is.

        Raises:
            ValueError: if an order is not finite and > 1, or rdp_values fails its checks.
        """
        grid = canonical_orders(orders)
        values = np.asarray(self.rdp_values(np.asarray(grid, dtype=np.float64)), dtype=np.float64)
        return RdpCurve(grid, values, self.relation, self.data_dependent)

    def dp_event(self) -> DpEvent | None:
        """This mechanism as a dp_accounting DpEvent whose RDP is exactly this mechanism's curve, or
        None when dp-accounting has no event for it (autodp's design: a mechanism knows its event).

        Every event dpledger builds is normalised to unit L2 sensitivity of one neighbouring move
        under `self.relation` (noise multiplier = noise standard deviation / that sensitivity), so
        it is accounted with dp_accounting's ADD_OR_REMOVE_ONE reading of a GaussianDpEvent (the
        pair N(0, z^2), N(1, z^2)); see dpledger.mechanisms.dp_events.dp_accounting_relation.

        Returns:
            The DpEvent, or None (the base class's answer) when there is none.
        """
        return None

    def no_pld_reason(self) -> str | None:
        """Why this mechanism itself has no PLD statement, or None when it may have one: a
        data-dependent charge, or no DpEvent (PMixED: RDP only). Whether dp-accounting can represent
        its event under its relation is the interop's question:
        dpledger.mechanisms.pld.pld_unavailable_reason asks both.

        Returns:
            The reason as a sentence, or None.
        """
        if self.data_dependent:
            return (f"{type(self).__name__} charges a data-dependent loss (Papernot et al. 2018, Definition 5): "
                    "no PLD in dp-accounting; RDP only")
        if self.dp_event() is None:
            return f"{type(self).__name__} has no DpEvent: no PLD in dp-accounting; RDP only"
        return None


@dataclass(frozen=True)
class ComposedMechanism(Mechanism):
    """Adaptive composition of mechanisms (Mironov 2017, Proposition 1)."""

    parts: tuple[Mechanism, ...]

    def __post_init__(self) -> None:
        require(isinstance(self.parts, (tuple, list)) and len(self.parts) > 0,
                f"a composition needs a non-empty sequence of mechanisms, got {self.parts!r}")
        set_validated(self, parts=tuple(require_mechanism(f"part {i}", p) for i, p in enumerate(self.parts)))
        _ = self.relation  # refuses parts that cover no common neighbouring pair

    @property
    def relation(self) -> NeighbouringRelation:
        """The neighbours every part covers (NeighbouringRelation.composed_with)."""
        relation = self.parts[0].relation
        for part in self.parts[1:]:
            relation = relation.composed_with(part.relation)
        return relation

    @property
    def data_dependent(self) -> bool:
        return any(part.data_dependent for part in self.parts)

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        """The parts' values summed order by order, rounded upwards (dpledger.accounting.summation).

        Args:
            orders: Renyi orders, a 1-D float64 array, each finite and > 1.

        Returns:
            A float64 array of the same shape: the upward-rounded sum of the parts' values.
        """
        return upper_sum(np.stack([part.rdp_values(orders) for part in self.parts]))

    def dp_event(self) -> DpEvent | None:
        """ComposedDpEvent of the parts' events (Mironov 2017, Proposition 1: RDP adds up under
        adaptive composition); None unless every part has one.

        Returns:
            The ComposedDpEvent, or None.
        """
        import dp_accounting

        events = [part.dp_event() for part in self.parts]
        return None if any(event is None for event in events) else dp_accounting.ComposedDpEvent(events)


@dataclass(frozen=True)
class SelfComposedMechanism(Mechanism):
    """`times`-fold composition of one mechanism: times * epsilon(order), rounded upwards."""

    mechanism: Mechanism
    times: int

    def __post_init__(self) -> None:
        set_validated(self, mechanism=require_mechanism("mechanism", self.mechanism),
                      times=require_int_at_least("times", self.times, 0))

    @property
    def relation(self) -> NeighbouringRelation:
        return self.mechanism.relation

    @property
    def data_dependent(self) -> bool:
        return self.mechanism.data_dependent

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        if self.times == 0:
            return np.zeros_like(orders)
        return np.asarray(up_multiply(self.mechanism.rdp_values(orders), self.times), dtype=np.float64)

    def dp_event(self) -> DpEvent | None:
        """SelfComposedDpEvent(event, times) (Mironov 2017, Proposition 1: times * epsilon(order));
        NoOpDpEvent for times = 0 (nothing released); None when the mechanism has no event.

        Returns:
            The SelfComposedDpEvent or NoOpDpEvent, or None.
        """
        import dp_accounting

        event = self.mechanism.dp_event()
        if event is None:
            return None
        return dp_accounting.NoOpDpEvent() if self.times == 0 else dp_accounting.SelfComposedDpEvent(event, self.times)


def compose(*mechanisms: Mechanism) -> ComposedMechanism:
    """Adaptive composition of several mechanisms: RDP adds up order by order (Mironov 2017,
    Proposition 1), rounded upwards.

    Args:
        *mechanisms: the mechanisms run one after another, each possibly chosen from the outputs
            of the earlier ones.

    Returns:
        A ComposedMechanism whose curve is the sum of theirs, for their common neighbouring relation.

    Raises:
        ValueError: no mechanism, an argument that is not a Mechanism, or relations with no common
            neighbouring pair.
    """
    return ComposedMechanism(tuple(mechanisms))


def self_compose(mechanism: Mechanism, times: int) -> SelfComposedMechanism:
    """`times` adaptive runs of one mechanism: times * RDP at every order (Mironov 2017,
    Proposition 1), rounded upwards.

    Args:
        mechanism: the mechanism run each time.
        times: how many runs, an integer >= 0 (0 releases nothing: RDP 0).

    Returns:
        A SelfComposedMechanism with the same relation as `mechanism`.

    Raises:
        ValueError: `mechanism` is not a Mechanism, or `times` is not an integer >= 0.
    """
    return SelfComposedMechanism(mechanism, times)
