"""The registry of vote aggregators: name -> class, for every consumer (CLI, claims, runners, audit, reports).

An aggregator is one class in one module of this package whose name ends in `_aggregator` or
`_aggregators` (dpledger.mechanisms.hot_pate_aggregators holds the four of Cohen et al. 2023): the
registry imports every such module the first time it is asked, and each class registers itself
(dpledger.mechanisms.aggregation.register_aggregator). Adding an aggregator is adding such a module.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path
from typing import Any, Mapping, Unpack

from dpledger.mechanisms.aggregation import _REGISTERED, AggregatorContext, VoteAggregator

MODULE_SUFFIXES = ("_aggregator", "_aggregators")


@functools.cache
def _discovered() -> tuple[str, ...]:
    """The aggregator modules of this package, imported once (their classes register themselves)."""
    names = tuple(info.name for info in pkgutil.iter_modules([str(Path(__file__).parent)])
                  if info.name.endswith(MODULE_SUFFIXES))
    for name in names:
        importlib.import_module(f"{__package__}.{name}")
    return names


def aggregators() -> dict[str, type[VoteAggregator]]:
    """Every registered aggregator, name -> class, in name order.

    Returns:
        A new dict of the registered classes by name (the aggregator modules imported first).
    """
    _discovered()
    return dict(sorted(_REGISTERED.items()))


def aggregator_names(differentially_private: bool | None = None) -> tuple[str, ...]:
    """The registered names (only the DP ones, or only the others, if asked).

    Args:
        differentially_private: True for the DP aggregators only, False for the others only, None for all.

    Returns:
        The names, in name order.
    """
    return tuple(name for name, cls in aggregators().items()
                 if differentially_private is None or cls.differentially_private == differentially_private)


def aggregator_class(name: object) -> type[VoteAggregator]:
    """The class registered as `name`; ValueError listing the names otherwise.

    Args:
        name: the aggregator's name (e.g. a config's `aggregator`).

    Returns:
        Its class.

    Raises:
        ValueError: if `name` is not a registered name.
    """
    known = aggregators()
    if not (isinstance(name, str) and name in known):
        raise ValueError(f"aggregator must be one of {list(known)}, got {name!r}")
    return known[name]


def build_aggregator(name: object, parameters: Mapping[str, Any],
                     **context: Unpack[AggregatorContext]) -> VoteAggregator:
    """The aggregator `name` with `parameters` (a config's or a run's table; None is "not given") and
    context (teachers, relation, accounting).

    Args:
        name: the aggregator's registered name.
        parameters: parameter name -> value (None: not given).
        **context: teachers, relation, accounting.

    Returns:
        The validated aggregator.

    Raises:
        ValueError: for an unknown name, or parameters its from_parameters refuses.
    """
    return aggregator_class(name).from_parameters(parameters, **context)
