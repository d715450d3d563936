"""What a privacy bound covers: the neighbouring relation and the divergence direction.

A privacy unit is one teacher's shard. Bounds proved for one relation do not transfer silently to
another (a remove-one bound says nothing about an added adversarial teacher), so every curve
carries its relation and composition checks it. Likewise a data-dependent bound may cover only one
direction of the divergence (Papernot et al. 2018, Theorem 6 bounds D(M(D) || M(D')) at the
actual data D), so every curve says which directions it covers.
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


class DivergenceDirection(enum.Enum):
    """Which direction(s) of D_a(M(D) || M(D')) a curve bounds, D the actual data, D' a neighbour.

    Renyi DP (Mironov 2017, Definition 4) quantifies over ordered pairs, so a DP guarantee covers
    BOTH. A data-dependent bound in the style of Papernot et al. 2018 (Theorem 6, Definition 5)
    covers FROM_ACTUAL only: D_a(M(D) || M(D')) with D fixed to the data that was used. Composing a
    FROM_ACTUAL curve with anything gives FROM_ACTUAL: the total covers no more than its weakest part.
    """

    BOTH = "both"
    """D_a(M(D) || M(D')) and D_a(M(D') || M(D)) for every neighbouring pair."""

    FROM_ACTUAL = "from_actual"
    """D_a(M(D) || M(D')) only, D the actual data (the reverse direction can be far larger)."""

    def __str__(self) -> str:
        return self.value

    def composed_with(self, other: "DivergenceDirection") -> "DivergenceDirection":
        """The direction a composition covers: BOTH only when every part covers both."""
        return DivergenceDirection.BOTH if self is other is DivergenceDirection.BOTH else DivergenceDirection.FROM_ACTUAL
