"""`dpledger calibrate`: the parameter an (epsilon, delta) budget over Q queries allows.

PMixED: the largest beta; the Gaussian-noise mechanisms and every registered DP vote aggregator
(dpledger.mechanisms.aggregators; its `calibrated` parameter): the smallest noise. Each answer is
accounted forward and accounts to at most --epsilon and within 1% of it (docs/calibration.md)."""
from __future__ import annotations

import argparse
import math
from dataclasses import MISSING
from typing import Callable, TypedDict, cast

from dpledger.accounting.conversion import ConversionMethod
from dpledger.accounting.strict_json import strict_json_text
from dpledger.mechanism_flags import (ACCOUNT_FLAG_SPECS, CALIBRATE_FLAG_SPECS, FlagSpec, add_conversion_flags,
                                      add_mechanism_parser, add_mechanism_subcommands, aggregator_flag_spec,
                                      mechanism_flag_spec, option, require_queries_flag)
from dpledger.mechanisms import calibration
from dpledger.mechanisms.aggregation import VoteAggregator
from dpledger.mechanisms.aggregators import aggregators
from dpledger.mechanisms.registry import accountable_mechanisms
from dpledger.accounting.orders import default_orders

AGGREGATORS = {name: cls for name, cls in aggregators().items() if cls.calibrated is not None}
"""The registered vote aggregators with a noise to calibrate: one subcommand each."""
_TARGET = ("epsilon", "delta", "queries")


class _Options(TypedDict):
    """The accounting options every calibration but PMixED's takes as keywords."""

    method: ConversionMethod
    accountant: str
    orders: tuple[float, ...]
    compare_pld: bool


_Target = tuple[float, float, int]
# how each registered mechanism's `calibrated` parameter is solved for: a theorem-specific solver each
# (dpledger.mechanisms.calibration), fed the target, the fixed parameters' flags and the accounting options
_CALIBRATIONS: dict[str, Callable[[argparse.Namespace, _Target, _Options], calibration.Calibration]] = {
    "gaussian": lambda args, target, options: calibration.calibrate_gaussian(*target, **options),
    "subsampled-gaussian": lambda args, target, options: calibration.calibrate_subsampled_gaussian(
        *target, args.sample_rate, **options),
    "pmixed": lambda args, target, options: calibration.calibrate_pmixed(
        *target, args.alpha, args.teachers, ball=args.ball, sampling_probability=args.sample_rate,
        variant=args.variant, seed=args.seed, orders=args.orders, method=options["method"]),
    "screening": lambda args, target, options: calibration.calibrate_screening(
        *target, args.teachers, args.lam, **options),
    "gnmax": lambda args, target, options: calibration.calibrate_gnmax(*target, **options),
    "confident-gnmax": lambda args, target, options: calibration.calibrate_confident_gnmax(
        *target, ratio=args.ratio, threshold=0.0, mechanism_name=args.mechanism, **options),
}
CALIBRATED = {name: cls for name, cls in accountable_mechanisms().items()
              if cls.calibrated is not None and name in _CALIBRATIONS}
"""The registered accountable mechanisms with a parameter to calibrate and a solver for it: one subcommand each."""
MECHANISMS = (*CALIBRATED, *AGGREGATORS)

# flags a calibration reads that are no parameter of its mechanism: PMixED's subsampled bound (rate, variant, seed
# of the simulated sizes), Confident-GNMax's screen-to-answer noise ratio, and the accountant of the noise solvers
_CLI_OPTIONAL = {"pmixed": ("sample_rate", "variant", "seed"), "confident-gnmax": ("ratio", "accountant")}
_SUMMARY = {name: cls.calibrate_summary for name, cls in CALIBRATED.items()}
_SUMMARY.update({name: cls.calibrate_summary or f"smallest {cls.calibrated} of {cls.title}"
                 for name, cls in AGGREGATORS.items()})
# a fixed parameter (neither the calibrated one nor one derived from it) without a default is required
_REQUIRED = {name: tuple(flag for flag, field in cls.flags().items() if field.default is MISSING
                         and field.name != cls.calibrated and field.name not in cls.calibrate_derived)
             for name, cls in CALIBRATED.items()}
_OPTIONAL = {name: cls.optional_flags() + _CLI_OPTIONAL.get(name, ("accountant",)) for name, cls in CALIBRATED.items()}


def _fixed_parameters(cls) -> dict:
    """An aggregator's parameters `dpledger calibrate` holds fixed: name -> field (the calibrated one aside)."""
    return {name: field for name, field in cls.parameter_fields("calibrate").items() if name != cls.calibrated}


for _name, _cls in AGGREGATORS.items():   # a fixed parameter without a default is required; the others optional
    _fields = _fixed_parameters(_cls)
    _REQUIRED[_name] = tuple(name for name, field in _fields.items()
                             if field.default is MISSING and "calibrate_default" not in field.metadata)
    _OPTIONAL[_name] = (tuple(_cls.calibrate_flags) + tuple(name for name in _fields if name not in _REQUIRED[_name])
                        + ("accountant",))


def _spec(flag: str, mechanism: str) -> FlagSpec:
    aggregator = AGGREGATORS.get(mechanism)
    if aggregator is not None and flag in aggregator.calibrate_flags:
        # the mechanisms layer cannot name FlagSpec; its tables hold the same argparse keyword arguments
        return cast(FlagSpec, dict(aggregator.calibrate_flags[flag]))
    if aggregator is not None and flag in _fixed_parameters(aggregator):
        return aggregator_flag_spec(aggregator, flag, "calibrate")
    registered = accountable_mechanisms().get(mechanism)
    if flag not in CALIBRATE_FLAG_SPECS and registered is not None and flag in registered.flags():
        spec = mechanism_flag_spec(registered, flag)  # a fixed parameter's flag, from its class
    else:
        spec = (CALIBRATE_FLAG_SPECS.get(flag) or ACCOUNT_FLAG_SPECS[flag]).copy()
    if flag == "queries":
        spec["help"] = "number of queries Q the budget covers, composed adaptively (Mironov 2017, Proposition 1); >= 1"
    if flag == "sample_rate":
        spec["help"] = ("Poisson sampling probability q in (0, 1]" + (" of teachers (Flemings et al. 2024, Theorem A.4)"
                                                                     if mechanism == "pmixed" else ""))
    if flag == "lam":
        spec["help"] = "screening mixing weight lambda, in (0, 1] (fixed)"
    return spec


def accepted_flags(mechanism: str) -> tuple[str, ...]:
    """The flags `dpledger calibrate MECHANISM` reads, as typed on the command line: the target, the
    mechanism's required and optional flags, --method, --orders and --json.

    Args:
        mechanism: a name in MECHANISMS.

    Returns:
        The flags, e.g. ("--epsilon", "--delta", "--queries", ..., "--json").

    Raises:
        KeyError: if `mechanism` is not in MECHANISMS.
    """
    flags = _TARGET + _REQUIRED[mechanism] + _OPTIONAL[mechanism] + ("method", "orders")
    return tuple(option(flag) for flag in flags) + ("--json",)


def add_parser(subparsers) -> None:
    """Add `dpledger calibrate` to the command line: one subcommand per mechanism in MECHANISMS, with
    the target flags (--epsilon, --delta, --queries), the mechanism's fixed parameters and the conversion flags.

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
    """
    mechanisms = add_mechanism_subcommands(subparsers, "calibrate",
                                           "the parameter an (epsilon, delta) budget over Q queries allows", __doc__)
    for mechanism in MECHANISMS:
        sub, required, optional = add_mechanism_parser(mechanisms, mechanism, _SUMMARY[mechanism])
        for flag in _TARGET + _REQUIRED[mechanism]:
            required.add_argument(option(flag), required=True, **_spec(flag, mechanism))
        for flag in _OPTIONAL[mechanism]:
            optional.add_argument(option(flag), **_spec(flag, mechanism))
        add_conversion_flags(optional)
        optional.add_argument("--json", action="store_true", help="print one strict JSON object")
        sub.set_defaults(handler=run, accepted_flags=accepted_flags(mechanism))


def calibrate(args: argparse.Namespace) -> calibration.Calibration:
    """The Calibration the flags ask for.

    Args:
        args: the parsed flags of one `dpledger calibrate MECHANISM` subcommand.

    Returns:
        The Calibration: the parameter (beta for PMixED, else the noise), its forward accounting and slack.

    Raises:
        ValueError: if a target or fixed parameter is out of range, --method names no conversion, or no
            parameter meets the budget.
    """
    kind = args.mechanism
    target = (args.epsilon, args.delta, args.queries)
    method = ConversionMethod(args.method)
    # PMixED's solver has no --accountant and takes the user's --orders itself (its grid holds alpha)
    options = _Options(method=method, accountant=getattr(args, "accountant", "rdp"),
                       orders=default_orders(*(args.orders or ())), compare_pld=True)
    if kind in CALIBRATED:
        return _CALIBRATIONS[kind](args, target, options)
    return _calibrate_aggregator(AGGREGATORS[kind], args, target, options)


def _calibrate_aggregator(cls: type[VoteAggregator], args: argparse.Namespace, target: tuple[float, float, int],
                          options: _Options) -> calibration.Calibration:
    """A registered aggregator's noise (VoteAggregator.calibrate), its other parameters fixed by the flags
    (a parameter's `calibrate_default` where its flag is not given)."""
    fixed = {flag: getattr(args, flag) for flag in cls.calibrate_flags}
    for name, field in _fixed_parameters(cls).items():
        value = getattr(args, name, None)
        fixed[name] = field.metadata.get("calibrate_default") if value is None else value
    return cls.calibrate(*target, fixed, **options)


def _format(value) -> str:
    if value is None:
        return "-"
    return "inf" if isinstance(value, float) and math.isinf(value) else f"{value:.6g}"


def _printed(result) -> str:
    """The value at 8 significant digits, rounded towards privacy (a noise up, beta down), so that the
    printed number, copied into a config, still accounts to at most the target; --json has it exact."""
    text = f"{result.value:.8g}"
    shown = float(text)
    towards_privacy = result.parameter == "beta"  # beta: smaller is more private; noise: larger is
    if (shown > result.value) if towards_privacy else (shown < result.value):
        step = 10.0 ** (math.floor(math.log10(abs(result.value))) - 7)
        text = f"{(shown - step) if towards_privacy else (shown + step):.8g}"
    return text


def run(args: argparse.Namespace) -> int:
    """`dpledger calibrate MECHANISM`: print the calibrated parameter, rounded towards privacy at 8
    significant digits, its forward accounting (RDP and, where there is one, PLD), notes and warnings;
    with --json one strict JSON object with the exact value.

    Args:
        args: the parsed flags of the subcommand.

    Returns:
        The exit status: 0 once the result is printed (bad input raises instead; `main` maps it to 2).

    Raises:
        ValueError: if --queries is not in [1, 2^53], or as `calibrate` does.
    """
    require_queries_flag(args.queries)
    result = calibrate(args)
    record = result.to_record()
    if args.json:
        print(strict_json_text(record, sort_keys=False))
        return 0
    print(f"{result.mechanism_name}: {result.parameter} = {_printed(result)} for epsilon <= {result.target_epsilon:g} "
          f"at delta = {result.delta:g} over {result.queries} queries")
    print(f"  accounts forward to epsilon = {result.forward_epsilon:.8g} ({result.accountant}); slack "
          f"{result.slack:.3g} ({result.relative_slack:.2e} of the target)")
    print(f"  RDP: epsilon = {_format(result.rdp_epsilon)} (order {_format(result.rdp_order)}); PLD: "
          + (f"epsilon = {_format(result.pld_epsilon)}" if result.pld_epsilon is not None else "none (RDP only)"))
    if "sigma_threshold" in result.fixed:
        print(f"  screen noise s1 = {result.fixed['sigma_threshold']:.8g} (ratio {result.fixed['ratio']:g})")
    for note in result.notes:
        print(f"  note: {note}")
    for message in result.warnings:
        print(f"  warning: {message} (--orders A,B,...)")
    return 0
