"""Command-line flags shared by `dpledger account` and `dpledger calibrate`: a mechanism parameter's flag
from its class (`mechanism_flag_spec`, `aggregator_flag_spec`), a table of argparse keyword arguments
for the flags that are no mechanism parameter (help names units and defaults), and the RDP conversion
flags."""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import MISSING
from typing import TypedDict

from dpledger.accounting.conversion import ConversionMethod
from dpledger.accounting.errors import require
from dpledger.accounting.relation import PathAccounting
from dpledger.mechanisms import Ball, SubsamplingVariant
from dpledger.mechanisms.accountable import AccountableMechanism
from dpledger.mechanisms.aggregation import VoteAggregator
from dpledger.mechanisms.calibration import MAX_QUERIES

ACCOUNTING = tuple(member.value for member in PathAccounting)


class FlagSpec(TypedDict, total=False):
    """The argparse keyword arguments of one flag (those of `ArgumentParser.add_argument` the tables use)."""

    type: Callable[[str], object]
    metavar: str
    help: str
    default: object
    choices: Sequence[str]
    action: str


# the flags of `dpledger account` that are no mechanism's parameter: argparse keyword arguments (help names
# units and defaults); a mechanism's parameters' flags come from its class (mechanism_flag_spec)
ACCOUNT_FLAG_SPECS: dict[str, FlagSpec] = {
    "queries": FlagSpec(type=int, metavar="Q", help="number of queries Q, composed adaptively (Mironov 2017, "
                                                "Proposition 1); an integer >= 1"),
    "delta": FlagSpec(type=float, metavar="DELTA", help="target delta of the (epsilon, delta) guarantee, in (0, 1)"),
    # PMixED's Poisson subsampling of teachers: no PMixED parameter (it makes a SubsampledPMixED); help per command
    "sample_rate": FlagSpec(type=float, metavar="Q_RATE"),
    "seed": FlagSpec(type=int, default=0, help="seed of the simulated subsample sizes of the realised-size variants "
                                           "(default: 0)"),
    "accounting": FlagSpec(choices=ACCOUNTING, default="released-output",
                       help="released-output (default) charges screen + GNMax on every query, a bound on the "
                            "released (decision, token) pair; realised-path charges GNMax only on the --answered "
                            "queries (Papernot et al. 2018's convention; ex post, not a guarantee)"),
    "answered": FlagSpec(type=int, metavar="K", help="with --accounting realised-path: the number K of answered "
                                                 "queries, in [0, Q]"),
}


# the flags `dpledger calibrate` adds: the target, and the fixed parameters only calibration has
CALIBRATE_FLAG_SPECS: dict[str, FlagSpec] = {
    "epsilon": FlagSpec(type=float, metavar="EPSILON", help="target epsilon of the (epsilon, delta) guarantee over all "
                                                        "Q queries (> 0); the answer accounts to at most it and "
                                                        "within 1%% of it"),
    "ratio": FlagSpec(type=float, default=1.0, metavar="R", help="screen noise over answer noise, s1 = R * s2 (> 0; "
                                                              "default: 1, i.e. s1 = s2)"),
    "accountant": FlagSpec(choices=("rdp", "pld"), default="rdp",
                       help="rdp (default: dpledger's ledgers are RDP) or pld (dp-accounting's PLD, pessimistic "
                            "estimate: a PLD-calibrated noise is only as good as the PLD accounting that will report "
                            "it)"),
    "variant": FlagSpec(choices=[v.value for v in SubsamplingVariant], default=None,
                    help="with --sample-rate: how the subsampled bound is formed (default: all-orders-ball, the "
                         "proven one, which implies --ball all-orders; worst-case-size-general with --ball "
                         "projection-order)"),
    "ball": FlagSpec(choices=[b.value for b in Ball], default=None,
                 help="PMixED's Renyi ball: projection-order (the paper's; Theorem 3.1 as claimed), proof-orders "
                      "(orders 2a-1 and 2a; Theorem 3.1 proven at orders <= a) or all-orders (proven at every "
                      "order; docs/soundness.md) (default: projection-order, all-orders with --sample-rate)"),
}


def _shown(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def mechanism_flag_spec(mechanism: type[AccountableMechanism], flag: str) -> FlagSpec:
    """argparse keyword arguments of an accountable mechanism's parameter flag, from its field's metadata
    (dpledger.mechanisms.accountable.mechanism_parameter): its help as declared, and its type and metavar,
    or its choices and default.

    Args:
        mechanism: the registered mechanism class.
        flag: the flag's table name (a key of `mechanism.flags()`), e.g. "sample_rate".

    Returns:
        The FlagSpec.

    Raises:
        KeyError: if `flag` is not one of the mechanism's flags.
    """
    metadata = mechanism.flags()[flag].metadata
    if metadata["choices"] is not None:
        return FlagSpec(choices=list(metadata["choices"]), default=mechanism.flag_default(flag), help=metadata["help"])
    return FlagSpec(type=metadata["type"], metavar=metadata["metavar"], help=metadata["help"])


def aggregator_flag_spec(aggregator: type[VoteAggregator], name: str, command: str) -> FlagSpec:
    """argparse keyword arguments of an aggregator parameter's flag, from its field's metadata: its type,
    metavar, help with its unit, and its default (`calibrate_default` for `dpledger calibrate`, where the
    flag's own default stays None and the command fills it in, as the help says).

    Args:
        aggregator: the registered vote aggregator class.
        name: the parameter's field name (a key of `aggregator.parameter_fields()`).
        command: "account" or "calibrate".

    Returns:
        The FlagSpec: store_true for a boolean parameter, else type, metavar, help and, where there is
        one and the command applies it itself, default.

    Raises:
        KeyError: if `name` is not a parameter field of `aggregator`, or its metadata lacks unit, help,
            type or metavar.
    """
    field = aggregator.parameter_fields()[name]
    metadata = field.metadata
    unit = "" if metadata["unit"] in ("unitless", "true or false") else f", in {metadata['unit']}"
    default = None if field.default is MISSING else field.default
    help_text = f"{metadata['help']}{unit}"
    if default not in (None, False) and "default" not in help_text:
        help_text += f" (default: {_shown(default)})"
    if metadata["type"] is bool:
        return FlagSpec(action="store_true", help=help_text)
    spec = FlagSpec(type=metadata["type"], metavar=metadata["metavar"], help=help_text)
    if command == "calibrate" and "calibrate_default" in metadata:
        spec["help"] += f" (default: {_shown(metadata['calibrate_default'])})"
        return spec   # default None: the command applies calibrate_default
    if default is not None:
        spec["default"] = default
    return spec


def require_queries_flag(queries: int) -> None:
    """--queries in [1, 2^53]; ValueError naming the flag, the range and the value otherwise (MAX_QUERIES:
    counts above 2^53 are not exact in double precision).

    Args:
        queries: the --queries value.

    Raises:
        ValueError: if `queries` is not in [1, MAX_QUERIES].
    """
    require(1 <= queries <= MAX_QUERIES, f"--queries must be in [1, 2^53 = {MAX_QUERIES}] (a larger count is not exact "
                                         f"in double precision and could be rounded down), got {queries}")


def option(flag: str) -> str:
    """--flag-name of the table key flag_name.

    Args:
        flag: a key of the flag tables, e.g. "noise_multiplier".

    Returns:
        The flag as typed, e.g. "--noise-multiplier".
    """
    return "--" + flag.replace("_", "-")


MAX_EXTRA_ORDER = 1e6
"""The largest order --orders adds. A larger order b gives an epsilon less than 7.3e-4 below order
10^6's: RDP does not decrease with the order (van Erven & Harremoes 2014, Theorem 3), and Balle et
al. 2020 (Theorem 21)'s conversion term lies in [-(1 + log b) / (b - 1), log(1/delta) / (b - 1)],
i.e. within [-1.5e-5, 7.1e-4] from 10^6 on for any delta >= 1e-308. The subsampled bounds sum about
a terms at order a (an order of 1e308 failed inside them)."""


def parse_orders(text: str) -> tuple[float, ...]:
    """--orders "2,4.5,2048": extra Renyi orders in (1, MAX_EXTRA_ORDER] added to the default grid.

    Args:
        text: the --orders value: comma-separated numbers (empty items are skipped).

    Returns:
        The orders, in the order given.

    Raises:
        argparse.ArgumentTypeError: if an item is not a number, no order is given, or an order is not in
            (1, MAX_EXTRA_ORDER] (argparse reports it as a usage error, exit status 2).
    """
    try:
        values = [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers > 1, got {text!r}") from None
    bad = [v for v in values if not (math.isfinite(v) and 1 < v <= MAX_EXTRA_ORDER)]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"every order must be a number in (1, {MAX_EXTRA_ORDER:g}] (a larger one lowers "
                                         f"epsilon by less than 7.3e-4 more), got {bad[0] if bad else text!r}")
    return tuple(values)


def add_conversion_flags(group) -> None:
    """--method and --orders: the RDP -> (epsilon, delta) conversion and the order grid.

    Args:
        group: the parser or argument group the two flags are added to.
    """
    group.add_argument("--method", choices=[m.value for m in ConversionMethod], default="improved",
                       help="RDP to (epsilon, delta): improved (Balle et al. 2020, Theorem 21) or classic "
                            "(Mironov 2017, Proposition 3) (default: improved)")
    group.add_argument("--orders", type=parse_orders, metavar="A,B,...",
                       help="extra Renyi orders (> 1) added to the default grid (1.1..10.9 by 0.1, "
                            "11..63, 128, 256, 512, 1024), e.g. when the optimum is at its edge")


def add_mechanism_subcommands(subparsers, command: str, help: str, description: str):
    """`dpledger COMMAND MECHANISM`: the command's parser and its one-subcommand-per-mechanism action.

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
        command: the command's name, e.g. "account".
        help: the command's one-line help.
        description: the command's --help description.

    Returns:
        The command's subcommands action, to which each mechanism's parser is added (dest "mechanism",
        required).
    """
    parser = subparsers.add_parser(command, help=help, description=description)
    return parser.add_subparsers(dest="mechanism", required=True, metavar="MECHANISM",
                                 title=f"mechanisms (dpledger {command} MECHANISM --help lists its flags)")


def add_mechanism_parser(mechanisms, mechanism: str, summary: str):
    """One mechanism's subcommand: (parser, its "required" group, its "optional" group).

    Args:
        mechanisms: the command's subcommands action (`add_mechanism_subcommands`).
        mechanism: the mechanism's subcommand name.
        summary: its one-line help; its description is the same with a full stop.

    Returns:
        (the subcommand's parser, its "required" argument group, its "optional" argument group).
    """
    sub = mechanisms.add_parser(mechanism, help=summary, description=summary + ".")
    return sub, sub.add_argument_group("required"), sub.add_argument_group("optional")

