"""A mechanism whose RDP curve the user already knows."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dpledger.accounting.curve import RdpCurve, require_curve
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.mechanisms.base import Mechanism


@dataclass(frozen=True)
class CustomCurveMechanism(Mechanism):
    """Wraps a known RdpCurve. On another grid, each requested order is charged the value at the
    smallest known order >= it (RDP is non-decreasing in the order, van Erven & Harremoes 2014
    Theorem 3), or +inf when none is known: never an interpolation that could under-charge."""

    curve: RdpCurve
    name: str = "custom"

    def __post_init__(self) -> None:
        require_curve(self.curve)

    @property
    def relation(self) -> NeighbouringRelation:
        return self.curve.relation

    @property
    def data_dependent(self) -> bool:
        return self.curve.data_dependent

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        known = np.asarray(self.curve.orders)
        index = np.searchsorted(known, np.asarray(orders) - 1e-12, side="left")
        padded = np.append(self.curve.values, np.inf)
        return padded[np.minimum(index, known.size)]
