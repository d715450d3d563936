"""Mechanisms as objects that know their own RDP curve; composition and subsampling are functions
from mechanisms to mechanisms (autodp's design), so the accountant needs no isinstance chain.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from accounting.curve import RdpCurve
from accounting.errors import require, require_int_at_least
from accounting.orders import DEFAULT_ORDERS, canonical_orders
from accounting.relation import NeighbouringRelation


class Mechanism(abc.ABC):
    """A randomised algorithm with a known RDP curve for one neighbouring relation.

    Subclasses are frozen dataclasses implementing `rdp_values`; `data_dependent` is True when the
    curve depends on the private data (then it is a data-dependent loss, seed Definition 2.4).
    """

    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE
    data_dependent: bool = False

    @abc.abstractmethod
    def rdp_values(self, orders: np.ndarray) -> np.ndarray:
        """RDP epsilon at each order (a float64 array, +inf where no guarantee)."""

    def rdp_curve(self, orders: Sequence[float] = DEFAULT_ORDERS) -> RdpCurve:
        orders = canonical_orders(orders)
        values = np.asarray(self.rdp_values(np.asarray(orders, dtype=np.float64)), dtype=np.float64)
        return RdpCurve(orders, values, self.relation, self.data_dependent)


@dataclass(frozen=True)
class ComposedMechanism(Mechanism):
    """Adaptive composition of mechanisms (Mironov 2017, Proposition 1; seed Theorem A.2)."""

    parts: tuple[Mechanism, ...]

    def __post_init__(self) -> None:
        require(len(self.parts) > 0, "a composition needs at least one mechanism")
        relations = {part.relation for part in self.parts}
        require(len(relations) == 1,
                f"cannot compose mechanisms for different neighbouring relations: {sorted(map(str, relations))}")

    @property
    def relation(self) -> NeighbouringRelation:  # type: ignore[override]
        return self.parts[0].relation

    @property
    def data_dependent(self) -> bool:  # type: ignore[override]
        return any(part.data_dependent for part in self.parts)

    def rdp_values(self, orders: np.ndarray) -> np.ndarray:
        return np.sum([part.rdp_values(orders) for part in self.parts], axis=0)


@dataclass(frozen=True)
class SelfComposedMechanism(Mechanism):
    """`times`-fold composition of one mechanism: times * epsilon(order)."""

    mechanism: Mechanism
    times: int

    def __post_init__(self) -> None:
        require_int_at_least("times", self.times, 0)

    @property
    def relation(self) -> NeighbouringRelation:  # type: ignore[override]
        return self.mechanism.relation

    @property
    def data_dependent(self) -> bool:  # type: ignore[override]
        return self.mechanism.data_dependent

    def rdp_values(self, orders: np.ndarray) -> np.ndarray:
        if self.times == 0:
            return np.zeros_like(orders)
        return self.mechanism.rdp_values(orders) * self.times


def compose(*mechanisms: Mechanism) -> ComposedMechanism:
    """Composition of several mechanisms; refused when their neighbouring relations differ."""
    return ComposedMechanism(tuple(mechanisms))


def self_compose(mechanism: Mechanism, times: int) -> SelfComposedMechanism:
    return SelfComposedMechanism(mechanism, times)
