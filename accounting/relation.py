"""What a privacy bound covers: the neighbouring relation and the divergence direction.

A privacy unit is one teacher's shard. Bounds proved for one relation do not transfer silently to
another (a remove-one bound says nothing about an added adversarial teacher), so every curve
carries its relation and composition checks it. Likewise a data-dependent bound may cover only one
direction of the divergence (Papernot et al. 2018, Theorem 6 bounds D(M(D) || M(D')) at the
actual data D), so every curve says which directions it covers.
"""
from __future__ import annotations

import enum

from dpledger.accounting.errors import require_member


class NeighbouringRelation(enum.Enum):
    """Which pairs of ensembles a bound covers: the moves that turn the actual ensemble D into a neighbour D'.

    For a data-independent (DP) bound, REMOVE_ONE, ADD_ONE and ADD_OR_REMOVE_ONE coincide: removing
    a teacher from D is adding it to D', and a DP bound quantifies over every D. They differ for
    data-dependent bounds, which are anchored at the actual ensemble (Papernot et al. 2018,
    Section 3): Flemings et al. 2024, Eq. 3 maximises over the N ensembles with one teacher
    removed and says nothing about an ensemble with an (adversarial) teacher added.

    Composition rule (`composed_with`): a composed bound holds for the neighbours that every part
    covers, so the relation of a composition is the intersection of the parts' moves. Add-or-remove
    therefore needs every part to cover both adding and removing; a remove-one part makes the total
    remove-one. Replacing a teacher is two moves (remove, then add), so a replace-one bound and an
    add/remove bound share no neighbouring pair and are refused together.
    """

    ADD_OR_REMOVE_ONE = "add_or_remove_one"
    """D vs D with one teacher's shard added or removed (PMixED, AdaPMixED, Poisson subsampling)."""

    REMOVE_ONE = "remove_one"
    """D vs D with one of its teachers removed (Flemings et al. 2024, Eq. 3's leave-one-out loss)."""

    ADD_ONE = "add_one"
    """D vs D with one teacher added, whatever that teacher's data."""

    REPLACE_ONE = "replace_one"
    """D vs D with one teacher's shard replaced (PATE / GNMax histograms, Hot PATE)."""

    def __str__(self) -> str:
        return self.value

    @property
    def label(self) -> str:
        """Human-readable name: "add-or-remove-one", "remove-one", "add-one", "replace-one"."""
        return self.value.replace("_", "-")

    @property
    def moves(self) -> frozenset[str]:
        """The neighbouring moves covered: a subset of {"add", "remove", "replace"}."""
        return _MOVES[self]

    def covers(self, other: "NeighbouringRelation") -> bool:
        """True when every neighbour of `other` is a neighbour this relation covers.

        Args:
            other: the relation a bound is needed for.

        Returns:
            Whether other's moves are a subset of this relation's.
        """
        return other.moves <= self.moves

    def composed_with(self, other: "NeighbouringRelation") -> "NeighbouringRelation":
        """The relation a composition of a bound for self and one for other holds for (the common
        moves); ValueError when they share none (replace-one with add or remove).

        Args:
            other: the relation of the other part of the composition.

        Returns:
            The relation whose moves are the moves both relations cover.

        Raises:
            ValueError: other is not a NeighbouringRelation, or the two share no move.
        """
        if other is self:  # the common case of a ledger's every step: nothing narrows
            return self
        if not isinstance(other, NeighbouringRelation):
            raise ValueError(f"relation must be a NeighbouringRelation, got {other!r}")
        common = self.moves & other.moves
        if not common:
            raise ValueError(f"cannot compose bounds for {self.label} and {other.label}: they cover no common "
                             "neighbouring pair")
        return next(relation for relation, moves in _MOVES.items() if moves == common)


_MOVES = {
    NeighbouringRelation.ADD_OR_REMOVE_ONE: frozenset({"add", "remove"}),
    NeighbouringRelation.REMOVE_ONE: frozenset({"remove"}),
    NeighbouringRelation.ADD_ONE: frozenset({"add"}),
    NeighbouringRelation.REPLACE_ONE: frozenset({"replace"}),
}


def neighbouring_relation(value: object) -> NeighbouringRelation:
    """The relation named by `value` (an enum member or its value, e.g. "remove_one"); ValueError
    listing the names for anything else.

    Args:
        value: a NeighbouringRelation or its value ("add_or_remove_one", "remove_one", "add_one",
            "replace_one").

    Returns:
        The NeighbouringRelation member.

    Raises:
        ValueError: when value names no relation.
    """
    return require_member(NeighbouringRelation, "neighbouring relation", value)


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
        """The direction a composition covers: BOTH only when every part covers both.

        Args:
            other: the direction of the other part of the composition.

        Returns:
            BOTH when self and other are both BOTH, else FROM_ACTUAL.
        """
        return DivergenceDirection.BOTH if self is other is DivergenceDirection.BOTH else DivergenceDirection.FROM_ACTUAL


class PathAccounting(enum.StrEnum):
    """What a screened step is charged: the one choice behind every `accounting` key and flag.

    A screened mechanism (AdaPMixED's noisy screen, Confident-GNMax's threshold check) releases the
    pair (decision, token). Its Renyi divergence is at most the screen's plus the answer's whichever
    branch is taken (adaptive composition, Mironov 2017, Proposition 1), which RELEASED_OUTPUT charges
    at every step: a bound on the released output's law. REALISED_PATH charges the answer only where
    the screen passed (Papernot et al. 2018's convention; Flemings et al. 2024, Theorem 4.2 as stated):
    an ex-post statement about one run (an odometer, Feldman & Zrnic 2021), not an RDP bound
    (docs/soundness.md). A str enum: a member equals its value, so manifests keep the plain string.
    """

    RELEASED_OUTPUT = "released-output"
    REALISED_PATH = "realised-path"


def path_accounting(value: object) -> PathAccounting:
    """The accounting named by `value` (a member or its value); ValueError listing the names otherwise.

    Args:
        value: a PathAccounting or its value ("released-output", "realised-path").

    Returns:
        The PathAccounting member.

    Raises:
        ValueError: when value names no accounting.
    """
    return require_member(PathAccounting, "accounting", value)
