"""The neighbouring relation a privacy bound is stated for (SPEC section 0).

A privacy unit is one teacher's shard. Bounds proved for one relation do not transfer silently to
another (pitfall 5), so every curve carries its relation and composition checks it.
"""
from __future__ import annotations

import enum


class NeighbouringRelation(enum.Enum):
    """Which pairs of ensembles a bound covers."""

    ADD_OR_REMOVE_ONE = "add_or_remove_one"
    """D vs D with one teacher's shard added or removed (PMixED, AdaPMixED, Poisson subsampling)."""

    REPLACE_ONE = "replace_one"
    """D vs D with one teacher's shard replaced (PATE / GNMax histograms, Hot PATE)."""

    def __str__(self) -> str:
        return self.value
