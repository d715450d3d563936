"""The registry of accountable mechanisms: name -> class, for `dpledger account` and `dpledger calibrate`.

Each class declares its name, summary, parameters (flags), DpEvent and calibrated parameter
(dpledger.mechanisms.accountable); importing its module registers it. The six built-in ones are
listed first, in the order the commands have always listed them; any other registered class follows,
in name order. The vote aggregators have their own registry (dpledger.mechanisms.aggregators).
"""
from __future__ import annotations

from dpledger.mechanisms.accountable import _REGISTERED, AccountableMechanism
from dpledger.mechanisms.gaussian import GaussianMechanism, PoissonSubsampledGaussian
from dpledger.mechanisms.pate import ConfidentGNMax, GNMax
from dpledger.mechanisms.pmixed import PMixED
from dpledger.mechanisms.screening import NoisyScreening

BUILT_IN: tuple[type[AccountableMechanism], ...] = (GaussianMechanism, PoissonSubsampledGaussian, PMixED,
                                                    NoisyScreening, GNMax, ConfidentGNMax)
"""The built-in accountable mechanisms, in listing order."""


def accountable_mechanisms() -> dict[str, type[AccountableMechanism]]:
    """Every registered accountable mechanism, name -> class: the built-in ones first, then the others by name.

    Returns:
        A new dict of the registered classes by name.
    """
    listed = {cls.name: cls for cls in BUILT_IN}
    listed.update(sorted((name, cls) for name, cls in _REGISTERED.items() if name not in listed))
    return listed


def mechanism_class(name: object) -> type[AccountableMechanism]:
    """The class registered as `name`; ValueError listing the names otherwise.

    Args:
        name: the mechanism's name (a `dpledger account` subcommand).

    Returns:
        Its class.

    Raises:
        ValueError: if `name` is not a registered name.
    """
    known = accountable_mechanisms()
    if not (isinstance(name, str) and name in known):
        raise ValueError(f"mechanism must be one of {list(known)}, got {name!r}")
    return known[name]
