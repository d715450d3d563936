"""The [mechanism] types a run configuration may name, and the one line for any other.

Light (no torch, no kernels): `dpledger decode` checks a configuration and its output directory with
it before the decoding stack and the models load, so that a mistake costs well under a second.
dpledger.decoding.runners builds a runner for each of these types (tests/test_decoding.py checks
that the two agree)."""
from __future__ import annotations

from dpledger.mechanisms.aggregators import aggregators

MECHANISM_TYPES = ("adapmixed", "ensemble", "pmixed", "public", "voting")
"""The mechanism types, sorted: PMixED and AdaPMixED (Flemings et al.), the non-private ensemble,
the public model alone, and PATE voting (type "voting" with an aggregator)."""


def unknown_type_message(kind: object) -> str:
    """The one line for an unknown [mechanism] type; PATE aggregator names point to type = "voting".

    Args:
        kind: the `type` the [mechanism] table gave.

    Returns:
        The message, listing MECHANISM_TYPES, with a hint where `kind` names a PATE aggregator.
    """
    hint = (f" (PATE aggregators are type = \"voting\" with aggregator = \"{kind}\")"
            if kind in aggregators() else
            " (PATE aggregators are type = \"voting\" with aggregator = \"dpargmax\", Confident-GNMax)"
            if kind in ("gnmax", "confident-gnmax", "confident_gnmax", "pate", "hotpate", "hot_pate") else "")
    return f"unknown mechanism type {kind!r}; known: {', '.join(MECHANISM_TYPES)}{hint}"
