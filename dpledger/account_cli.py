"""`dpledger account`: (epsilon, delta) of Q queries of a data-independent mechanism.

Every registered vote aggregator (dpledger.mechanisms.aggregators) is a subcommand whose flags are its
parameters. Hot PATE's (Cohen et al. 2023): dpargmax (Confident-GNMax, Papernot et al. 2018,
Algorithm 1) and dpws (Gaussian-noised counts, then TWS) are DP; targmax and tws are only
T-threshold private (a robustness notion) and are reported as giving no DP guarantee."""
from __future__ import annotations

import argparse
import math
import warnings

import numpy as np

from dpledger.accounting.conversion import ConversionMethod, GridEdgeWarning, epsilon_from_rdp
from dpledger.accounting.errors import require, require_in_open
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.accounting.safe_files import read_text, write_atomic
from dpledger.accounting.strict_json import MAX_BYTES, loads_json, strict_json_text
from dpledger.accounting.orders import default_orders
from dpledger.accounting.relation import PathAccounting
from dpledger.mechanism_flags import (ACCOUNT_FLAG_SPECS, FlagSpec, add_conversion_flags, add_mechanism_parser,
                                      add_mechanism_subcommands, aggregator_flag_spec, mechanism_flag_spec,
                                      require_queries_flag)
from dpledger.mechanism_flags import option as _option
from dpledger.mechanisms import Ball, PMixED, SubsamplingVariant, subsampled_pmixed_curve
from dpledger.mechanisms.accountable import AccountableMechanism
from dpledger.mechanisms.aggregators import aggregators
from dpledger.mechanisms.registry import accountable_mechanisms
from dpledger.mechanisms.dp_events import (dp_accounting_relation, dp_event_to_json, mechanism_from_dp_event,
                                  read_dp_event_json)
from dpledger.mechanisms.calibration import pld_cost_reason, quiet_dp_accounting, require_subsampling_work
from dpledger.mechanisms.pld import PLD_VALUE_DISCRETIZATION_INTERVAL, RdpPldComparison, pld_epsilon

# (this docstring is `dpledger account --help`'s description.) Every registered accountable mechanism
# (dpledger.mechanisms.registry: gaussian, subsampled-gaussian, pmixed, screening, gnmax, confident-gnmax) is a
# subcommand too, its flags its parameters' (dpledger.mechanisms.accountable).
AGGREGATORS = aggregators()
"""The registered vote aggregators, name -> class: one subcommand each, its flags its parameters'."""
MECHANISMS = (*accountable_mechanisms(), *AGGREGATORS)
"""The subcommands at import (the registered accountable mechanisms, then the aggregators); the parser
asks the registry again when it is built (`_mechanisms`), so a class registered later is listed too."""
# T-threshold private only (Cohen et al. 2023): no DP guarantee, no epsilon
THRESHOLD_PRIVATE = tuple(name for name, cls in AGGREGATORS.items() if not cls.differentially_private)

# the flags that are no mechanism parameter (shared with `dpledger calibrate`, dpledger/mechanism_flags.py); a
# mechanism's flags are its parameters' (mechanism_flag_spec, aggregator_flag_spec)
_FLAG_SPECS = ACCOUNT_FLAG_SPECS

# PMixED's subsampled accounting (SubsampledPMixED, every SubsamplingVariant shown) reads two flags that are no
# PMixED parameter: the rate and the seed of the realised-size variants' simulated sizes
_CLI_OPTIONAL = {PMixED.name: ("sample_rate", "seed")}
_PMIXED_SAMPLE_RATE_HELP = ("Poisson subsampling of teachers with probability q in (0, 1]; every accounting variant "
                            "is shown (Flemings et al. 2024, Theorem A.4)")
# the RDP-to-(epsilon, delta) conversion and the order grid apply to every DP mechanism
CONVERSION_FLAGS = ("method", "orders")
# `dpledger account from-event FILE`: account a DpEvent file (dp-accounting interop)
FROM_EVENT = "from-event"
_DP_EVENT_OUT_HELP = ("write the Q-fold composed dp_accounting DpEvent to this file as strict JSON (unit-sensitivity "
                      "event, relation and the dp_accounting relation to account it with; docs/calibration.md)")


def _mechanisms() -> dict[str, type[AccountableMechanism]]:
    """The registered accountable mechanisms, name -> class, as the registry lists them now."""
    return accountable_mechanisms()


def _summary(mechanism: str) -> str:
    """The subcommand's one-line help: its class's summary."""
    return AGGREGATORS[mechanism].summary if mechanism in AGGREGATORS else _mechanisms()[mechanism].summary


def _required(mechanism: str) -> tuple[str, ...]:
    """The flags `mechanism` needs; a missing one is refused by name, all at once. Every DP mechanism is
    composed Q times and converted at delta."""
    if mechanism in AGGREGATORS:
        own = AGGREGATORS[mechanism].required_parameters("account")
    else:
        own = _mechanisms()[mechanism].required_flags()
    return own if mechanism in THRESHOLD_PRIVATE else ("queries", "delta") + own


def _optional(mechanism: str) -> tuple[str, ...]:
    """The flags `mechanism` reads beyond its required ones; its subcommand has no other flag."""
    cls = AGGREGATORS.get(mechanism)
    if cls is None:
        return _mechanisms()[mechanism].optional_flags() + _CLI_OPTIONAL.get(mechanism, ())
    # an aggregator's optional parameters; a screened one's accounting; a threshold-private one reads any Q (still
    # no DP guarantee) and no --delta (T-threshold privacy has none), so --delta is refused as a flag it does not read
    required = _required(mechanism)
    return ((() if cls.differentially_private else ("queries",))
            + tuple(flag for flag in cls.parameter_fields("account") if flag not in required)
            + (("accounting", "answered") if cls.supports_realised_path else ()))


def has_dp_event(mechanism: str) -> bool:
    """Whether the mechanism has a dp_accounting DpEvent: its PLD epsilon is shown beside the RDP one, and
    --dp-event-out writes the composed event (dpledger.mechanisms.dp_events).

    Args:
        mechanism: a subcommand of `dpledger account` (not FROM_EVENT).

    Returns:
        Its class's `has_dp_event`.

    Raises:
        KeyError: if `mechanism` is no registered mechanism or aggregator.
    """
    return (AGGREGATORS[mechanism] if mechanism in AGGREGATORS else _mechanisms()[mechanism]).has_dp_event


def accepted_flags(mechanism: str) -> tuple[str, ...]:
    """The flags `dpledger account MECHANISM` reads, as typed on the command line.

    Args:
        mechanism: a subcommand of `dpledger account`: a name in MECHANISMS, or FROM_EVENT.

    Returns:
        The flags, e.g. ("--queries", "--delta", "--noise-multiplier", ..., "--json"), in help order.

    Raises:
        KeyError: if `mechanism` is not a subcommand of `dpledger account`.
    """
    if mechanism == FROM_EVENT:
        return ("--delta", "--relation") + tuple(_option(flag) for flag in CONVERSION_FLAGS) + ("--json",)
    flags = _required(mechanism) + _optional(mechanism)
    if mechanism not in THRESHOLD_PRIVATE:
        flags += CONVERSION_FLAGS
    if has_dp_event(mechanism):
        flags += ("dp_event_out",)
    return tuple(_option(flag) for flag in flags) + ("--json",)


def _refuse_missing_flags(args: argparse.Namespace) -> None:
    """Every missing flag named at once, by its flag name."""
    missing = [flag for flag in _required(args.mechanism) if getattr(args, flag, None) is None]
    require(not missing, f"mechanism {args.mechanism} needs " + ", ".join(_option(f) for f in missing))


def add_parser(subparsers) -> None:
    """Add `dpledger account` to the command line: one subcommand per mechanism in MECHANISMS, whose
    required and optional flags are the ones it reads (`accepted_flags`), and `from-event`.

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
    """
    mechanisms = add_mechanism_subcommands(subparsers, "account", "epsilon of Q queries of a data-independent mechanism",
                                           __doc__)
    for mechanism in (*_mechanisms(), *AGGREGATORS):
        sub, required, optional = add_mechanism_parser(mechanisms, mechanism, _summary(mechanism))
        aggregator = AGGREGATORS.get(mechanism)
        own = {} if aggregator is not None else _mechanisms()[mechanism].flags()
        for flag in _required(mechanism) + _optional(mechanism):
            spec = _FLAG_SPECS[flag].copy() if flag in _FLAG_SPECS else FlagSpec()
            if aggregator is not None and flag in aggregator.parameter_fields("account"):
                spec = aggregator_flag_spec(aggregator, flag, "account")
            elif flag in own:
                spec = mechanism_flag_spec(_mechanisms()[mechanism], flag)
            if flag in ("queries", "delta") and mechanism in THRESHOLD_PRIVATE:
                spec["help"] = "recorded only: no number of queries gives a DP guarantee"
            if flag == "sample_rate" and mechanism == PMixED.name:
                spec["help"] = _PMIXED_SAMPLE_RATE_HELP
            (required if flag in _required(mechanism) else optional).add_argument(_option(flag), **spec)
        if mechanism not in THRESHOLD_PRIVATE:
            add_conversion_flags(optional)
        if has_dp_event(mechanism):
            optional.add_argument("--dp-event-out", metavar="FILE", help=_DP_EVENT_OUT_HELP)
        optional.add_argument("--json", action="store_true", help="print one strict JSON object")
        sub.set_defaults(handler=run, accepted_flags=accepted_flags(mechanism))
    _add_from_event_parser(mechanisms)


def _add_from_event_parser(mechanisms) -> None:
    summary = ("account a dp_accounting DpEvent file (from --dp-event-out or dp_accounting's own events): dpledger's "
               "RDP epsilon and dp-accounting's PLD epsilon")
    sub = mechanisms.add_parser(FROM_EVENT, help=summary, description=summary + ".")
    sub.add_argument("file", metavar="FILE", help="strict JSON DpEvent: a --dp-event-out file or a bare event "
                                                  "(dpledger.mechanisms.dp_event_to_json)")
    required = sub.add_argument_group("required")
    optional = sub.add_argument_group("optional")
    required.add_argument("--delta", type=float, required=True, metavar="DELTA", help=_FLAG_SPECS["delta"]["help"])
    optional.add_argument("--relation", choices=[r.value for r in NeighbouringRelation], default=None,
                          help="dpledger relation of a bare event, whose noise multipliers are per unit L2 "
                               "sensitivity of one neighbouring move (default: the file's, add_or_remove_one for a "
                               "bare event)")
    add_conversion_flags(optional)
    optional.add_argument("--json", action="store_true", help="print one strict JSON object")
    sub.set_defaults(handler=run_from_event, accepted_flags=accepted_flags(FROM_EVENT))


def _with_every_flag(args: argparse.Namespace) -> argparse.Namespace:
    """args with the flags this mechanism's subcommand does not have set to their unset value."""
    values = {flag: spec.get("default") for flag, spec in _FLAG_SPECS.items()}
    for mechanism in _mechanisms().values():  # a mechanism's parameters: None where it does not read them
        values.update({flag: None for flag in mechanism.flags() if flag not in values})
    for cls in AGGREGATORS.values():  # an aggregator's parameters: None where it does not read them
        values.update({flag: None for flag in cls.parameter_fields("account") if flag not in values})
    values.update(method=ConversionMethod.IMPROVED.value, orders=None, json=False, dp_event_out=None)
    values.update(vars(args))
    return argparse.Namespace(**values)


def _grid(args: argparse.Namespace, *run_at: float) -> tuple[float, ...]:
    """The default grid, the orders the mechanism runs at and the user's --orders."""
    return default_orders(*run_at, *(getattr(args, "orders", None) or ()))


def _conversion_record(curve, delta, method, name=None, **extra) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GridEdgeWarning)
        result = epsilon_from_rdp(curve, delta, method)
    record = {"epsilon": result.epsilon, "delta": result.delta, "order": result.order, "method": result.method.value,
              "at_grid_edge": result.at_grid_edge, **extra}
    if name is not None:
        record = {"name": name, **record}
    # the CLI's way to extend the grid is --orders
    record["warnings"] = [f"{w.message} (--orders A,B,...)" if issubclass(w.category, GridEdgeWarning)
                          else str(w.message) for w in caught]
    return record


def _mechanism(args: argparse.Namespace):
    """The mechanism the flags name, built by its registered class from its flags (each validates its own
    parameters)."""
    if args.mechanism in AGGREGATORS:
        return _aggregator(args)
    cls = _mechanisms()[args.mechanism]
    return cls.from_flags({flag: getattr(args, flag) for flag in cls.flags()})


def _aggregator(args: argparse.Namespace):
    """The registered aggregator the flags name, at its natural relation, without an ensemble (it
    validates its own parameters)."""
    cls = AGGREGATORS[args.mechanism]
    parameters = {flag: getattr(args, flag) for flag in cls.parameter_fields("account")
                  if getattr(args, flag, None) is not None}
    return cls(**parameters, relation=cls.natural_relation, accounting=args.accounting)


def account(args: argparse.Namespace) -> dict:
    """Build the mechanism from the flags, compose it Q times and convert; returns the JSON object,
    with dp-accounting's PLD epsilon beside the RDP one where the mechanism has a DpEvent.

    Args:
        args: the parsed flags of one `dpledger account MECHANISM` subcommand (flags it does not have
            are read as unset).

    Returns:
        The JSON object: epsilon, delta, order, method, mechanism, queries, relation, the RDP
        conversion's warnings, and pld_epsilon with the tighter accountant ("rdp" or "pld"), or
        pld_unavailable saying why there is none; a threshold-private aggregator's states no epsilon.

    Raises:
        ValueError: if a required flag is missing, a value is out of range (each mechanism validates its
            own parameters), or --dp-event-out is given for a mechanism without a DpEvent.
    """
    record = _account_rdp(args)
    if record["mechanism"] in THRESHOLD_PRIVATE:
        return record
    args = _with_every_flag(args)
    mechanism = _mechanism(args) if has_dp_event(args.mechanism) or args.mechanism in AGGREGATORS else None
    if mechanism is not None and args.accounting == PathAccounting.RELEASED_OUTPUT and mechanism.dp_event() is not None:
        from dp_accounting import SelfComposedDpEvent

        event = SelfComposedDpEvent(mechanism.dp_event(), args.queries)
        too_little_noise = pld_cost_reason(event, record["epsilon"])
        if too_little_noise is not None:  # --dp-event-out still writes the event; only its PLD is not computed
            record.update(pld_epsilon=None, tighter="rdp", pld_unavailable=too_little_noise)
            return record
        pld = pld_epsilon(event, args.delta, mechanism.relation)
        comparison = RdpPldComparison(record["epsilon"], record["order"], pld, args.delta, args.queries,
                                      PLD_VALUE_DISCRETIZATION_INTERVAL)
        record.update(pld_epsilon=pld, tighter=comparison.tighter,
                      pld={"value_discretization_interval": PLD_VALUE_DISCRETIZATION_INTERVAL,
                           "estimate": "pessimistic: an upper bound (Koskela et al. 2020; Doroshenko et al. 2022)",
                           "dp_accounting_neighboring_relation": dp_accounting_relation(mechanism.relation, event).name})
    else:
        reason = ("PMixED has no DpEvent: no PLD in dp-accounting; RDP only" if args.mechanism == PMixED.name else
                  "realised-path charges GNMax on the answered queries only, a count that depends on the data: "
                  "no DpEvent; RDP only" if args.accounting == PathAccounting.REALISED_PATH else
                  (mechanism.no_pld_reason() if mechanism is not None else None)
                  or "no DpEvent: no PLD in dp-accounting; RDP only")
        require(getattr(args, "dp_event_out", None) is None, f"--dp-event-out: {reason}")
        record.update(pld_epsilon=None, tighter="rdp", pld_unavailable=reason)
    return record


def _account_rdp(args: argparse.Namespace) -> dict:
    """The RDP accounting of the flags' mechanism (the JSON object without the PLD fields)."""
    _refuse_missing_flags(args)
    args = _with_every_flag(args)
    if args.queries is not None:
        require_queries_flag(args.queries)
    kind = args.mechanism
    screened = [name for name, cls in AGGREGATORS.items() if cls.supports_realised_path]
    require(args.accounting == PathAccounting.RELEASED_OUTPUT or kind in screened,
            f"--accounting {args.accounting} applies to {', '.join(screened)} only, not {kind}")
    require(args.answered is None or args.accounting == PathAccounting.REALISED_PATH,
            "--answered applies only with --accounting realised-path")
    if kind in AGGREGATORS:
        return _aggregator_record(args)
    mechanism = _mechanism(args)
    # the mechanism validated its own parameters; now its order joins the grid
    orders = _grid(args, *([args.alpha] if kind == PMixED.name else []))
    if kind == PMixED.name and args.sample_rate is not None:
        require(mechanism.ball is not Ball.PROOF_ORDERS,
                "--sample-rate with --ball proof-orders is not accounted: use --ball all-orders (variant "
                "all-orders-ball), which holds Theorem 3.1 at every order the amplification sums")
        require_subsampling_work(mechanism.teachers, args.queries, True, "--teachers", "--queries")
        # every variant is shown: the paper's ball for the first five, the all-orders ball for the last
        balls = {ball: PMixED(args.alpha, args.beta, args.teachers, ball=ball)
                 for ball in (Ball.PROJECTION_ORDER, Ball.ALL_ORDERS)}
        variants = [
            _conversion_record(subsampled_pmixed_curve(
                balls[Ball.ALL_ORDERS if variant is SubsamplingVariant.ALL_ORDERS_BALL else Ball.PROJECTION_ORDER],
                args.sample_rate, variant, args.queries, args.seed, orders), args.delta, args.method, variant.value,
                soundness=variant.soundness)
            for variant in SubsamplingVariant]
        headline_variant = (SubsamplingVariant.ALL_ORDERS_BALL if mechanism.ball is Ball.ALL_ORDERS
                            else SubsamplingVariant.WORST_CASE_SIZE_GENERAL)
        headline = next(v for v in variants if v["name"] == headline_variant.value)
        record = {key: headline[key] for key in ("epsilon", "delta", "order", "method")}
        record.update(mechanism=kind, queries=args.queries, ball=mechanism.ball.value, headline_variant=headline["name"],
                      label=_pmixed_label(mechanism, headline["name"]), variants=variants, relation=mechanism.relation.value,
                      note="all-orders-ball accounts PMixED with ball = all-orders (a different projection); the "
                           "others the paper's ball, whose Theorem 3.1 is as claimed (docs/soundness.md)")
        return record
    record = _conversion_record(mechanism.rdp_curve(orders).composed(args.queries), args.delta, args.method)
    record.update(mechanism=kind, queries=args.queries, relation=mechanism.relation.value)
    if kind == PMixED.name:
        record["ball"] = mechanism.ball.value
        record["label"] = _pmixed_label(mechanism, None)
        record["note"] = (f"ball = {mechanism.ball.value} enforces every order the proof of Theorem 3.1 reads at the "
                          "orders charged" if mechanism.proven else
                          "Theorem 3.1 as claimed: not guaranteed (inputs exceed it, a two-token one by 22%); --ball proof-orders "
                          "or all-orders gives a projection for which it is proven (docs/soundness.md)")
    return record


def _pmixed_label(mechanism: PMixED, variant: str | None) -> str:
    """What the headline epsilon rests on: proven for the proof-orders and all-orders balls, conditional
    on Theorem 3.1 as claimed for the paper's one-order ball."""
    accounting = f"{variant}: " if variant else ""
    if mechanism.proven:
        return f"{accounting}proven for ball = {mechanism.ball.value}: {mechanism.ball.theorem_3_1_basis}"
    return (f"{accounting}conditional on Theorem 3.1 (Flemings et al. 2024) for the paper's ball, as claimed: its proof "
            "needs the ball at orders 2a-1 and 2a, which the one-order projection does not enforce (docs/soundness.md)")


def _aggregator_record(args: argparse.Namespace) -> dict:
    """A registered aggregator: Q steps of its curve (VoteAggregator.account_curve; for realised-path
    accounting the screen on every query and the answer on the K answered ones) converted at --delta,
    and what it adds (VoteAggregator.account_details). One that is not DP (targmax, tws: T-threshold
    private only) states no epsilon: its own curve, +inf at every order, says it has no guarantee."""
    aggregator = _aggregator(args)
    kind, queries = args.mechanism, args.queries
    if not aggregator.differentially_private:
        require(not bool(np.any(np.isfinite(aggregator.rdp_curve().values))),
                f"{kind} has a finite RDP curve; it is not threshold-private only")
        return {"mechanism": kind, "dp_guarantee": False, "epsilon": None, "delta": None, "queries": queries,
                "relation": aggregator.relation.value, **aggregator.account_details(math.inf, queries)}
    answered = None
    if aggregator.accounting is PathAccounting.REALISED_PATH:
        require(args.answered is not None, f"mechanism {kind} with --accounting realised-path needs --answered")
        require(0 <= args.answered <= queries, f"--answered must be in [0, --queries = {queries}], got {args.answered}")
        answered = args.answered
    curve = aggregator.account_curve(_grid(args), queries, answered)
    record = _conversion_record(curve, args.delta, args.method)
    record.update(mechanism=kind, queries=queries, relation=aggregator.relation.value,
                  **aggregator.account_details(record["epsilon"], queries, answered))
    return record


def _format(value) -> str:
    if value is None:
        return "-"
    return "inf" if isinstance(value, float) and math.isinf(value) else f"{value:.6g}"


def _write_dp_event(record: dict, args: argparse.Namespace) -> None:
    """The Q-fold composed event as a dpledger.dp_event file (dpledger.mechanisms.dp_events.dp_event_to_json)."""
    from dp_accounting import SelfComposedDpEvent

    mechanism = _mechanism(_with_every_flag(args))
    text = dp_event_to_json(SelfComposedDpEvent(mechanism.dp_event(), args.queries), mechanism.relation)
    path = args.dp_event_out
    write_atomic(path, (text + "\n").encode("utf-8"))  # a new file renamed into place: never through a link
    record["dp_event_out"] = path


@quiet_dp_accounting()
def run(args: argparse.Namespace) -> int:
    # a value past double range (an overflow, or a division by a noise whose square underflows to 0) is +inf,
    # "no guarantee", and is reported so
    """`dpledger account MECHANISM`: print the accounting of `account` (one strict JSON object with
    --json) and, with --dp-event-out, write the composed DpEvent. dp-accounting's absl warnings are off
    while it runs; an overflow is +inf, reported as no guarantee.

    Args:
        args: the parsed flags of the subcommand.

    Returns:
        The exit status: 0 once the result is printed (bad input raises instead; `main` maps it to 2).

    Raises:
        ValueError: as `account` does, or if the DpEvent file cannot be written safely.
        OSError: if --dp-event-out cannot be written.
    """
    with np.errstate(over="ignore", divide="ignore"):
        record = account(args)
    if getattr(args, "dp_event_out", None) is not None:
        _write_dp_event(record, args)
    if args.json:
        print(strict_json_text(record, sort_keys=False))
        return 0
    if record["mechanism"] in THRESHOLD_PRIVATE:
        print(f"{record['mechanism']}: {record['statement']}")
        print(f"  guarantee: {record['guarantee']}")
        print(f"  note: {record['note']}")
        return 0
    print(f"{record['mechanism']}: {record['queries']} queries -> epsilon = {_format(record['epsilon'])} "
          f"at delta = {record['delta']:g} (order {_format(record['order'])}, {record['method']} conversion)")
    if "label" in record:
        print(f"  {record['label']}")
    if "charged" in record:
        print(f"  charged: screen on {record['charged']['screen_queries']} queries, GNMax on "
              f"{record['charged']['gnmax_queries']} ({record['accounting']})")
    for variant in record.get("variants", []):
        print(f"  {variant['name']:<26} epsilon = {_format(variant['epsilon']):>10}  order {_format(variant['order']):>4}"
              f"  -- {variant['soundness']}")
    if record.get("pld_epsilon") is not None:
        print(f"  PLD (dp-accounting, pessimistic, interval {PLD_VALUE_DISCRETIZATION_INTERVAL:g}): epsilon = "
              f"{_format(record['pld_epsilon'])}; tighter: {record['tighter']}")
    elif record.get("pld_unavailable"):
        print(f"  PLD: none ({record['pld_unavailable']})")
    if record.get("dp_event_out"):
        print(f"  DpEvent written to {record['dp_event_out']}")
    for message in record.get("warnings", []):
        print(f"  warning: {message}")
    if "note" in record:
        print(f"  note: {record['note']}")
    return 0


def account_event(args: argparse.Namespace) -> dict:
    """`account from-event`: dpledger's RDP epsilon of the event's mechanism (mechanism_from_dp_event)
    and dp-accounting's PLD epsilon of the event, at --delta; returns the JSON object.

    Args:
        args: the parsed flags of `dpledger account from-event`: file, delta, and optionally relation,
            method and orders.

    Returns:
        The JSON object: epsilon, delta, order and method of dpledger's RDP accounting, mechanism
        "from-event", file, event (its class name), relation, and pld_epsilon with the tighter accountant,
        or pld_unavailable saying why there is none.

    Raises:
        ValueError: if the file is not a strict JSON DpEvent (or a run's ledger.json with one), --relation
            contradicts the file's, --delta is not in (0, 1), or the event has no dpledger mechanism.
        OSError: if the file cannot be read.
    """
    text = read_text(args.file, MAX_BYTES, follow=True, what="an event or ledger file")  # never a FIFO or a device
    ledger = loads_json(text, args.file) if text.lstrip().startswith("{") else None
    if isinstance(ledger, dict) and isinstance(ledger.get("pld"), dict):  # a run's ledger.json: its exported event
        require("dp_event_file" in ledger["pld"], f"{args.file}: the run has no DpEvent ({ledger['pld'].get('reason')})")
        text = strict_json_text(ledger["pld"]["dp_event_file"])
    event, relation = read_dp_event_json(text, args.file)
    if getattr(args, "relation", None) is not None:
        require(relation is None or relation.value == args.relation,
                f"--relation {args.relation} contradicts the file's relation {relation}")
        relation = NeighbouringRelation(args.relation)
    relation = relation or NeighbouringRelation.ADD_OR_REMOVE_ONE
    delta = require_in_open("--delta", args.delta, 0.0, 1.0)
    mechanism = mechanism_from_dp_event(event, relation)
    record = _conversion_record(mechanism.rdp_curve(_grid(args)), delta, getattr(args, "method", "improved"))
    too_little_noise = pld_cost_reason(event, record["epsilon"])
    if too_little_noise is not None:
        record.update(mechanism=FROM_EVENT, file=args.file, event=type(event).__name__, relation=relation.value,
                      pld_epsilon=None, tighter="rdp", pld_unavailable=too_little_noise)
        return record
    pld = pld_epsilon(event, delta, relation)
    comparison = RdpPldComparison(record["epsilon"], record["order"], pld, delta, 1, PLD_VALUE_DISCRETIZATION_INTERVAL)
    record.update(mechanism=FROM_EVENT, file=args.file, event=type(event).__name__, relation=relation.value,
                  pld_epsilon=pld, tighter=comparison.tighter,
                  pld={"value_discretization_interval": PLD_VALUE_DISCRETIZATION_INTERVAL,
                       "estimate": "pessimistic: an upper bound (Koskela et al. 2020; Doroshenko et al. 2022)",
                       "dp_accounting_neighboring_relation": dp_accounting_relation(relation, event).name})
    return record


@quiet_dp_accounting()
def run_from_event(args: argparse.Namespace) -> int:
    """`dpledger account from-event FILE`: print `account_event`'s result (one strict JSON object
    with --json). dp-accounting's absl warnings are off while it runs.

    Args:
        args: the parsed flags of the subcommand.

    Returns:
        The exit status: 0 once the result is printed (bad input raises instead; `main` maps it to 2).

    Raises:
        ValueError: as `account_event` does.
        OSError: if the file cannot be read.
    """
    record = account_event(args)
    if args.json:
        print(strict_json_text(record, sort_keys=False))
        return 0
    print(f"{record['file']} ({record['event']}, {record['relation']}): epsilon = {_format(record['epsilon'])} at "
          f"delta = {record['delta']:g} (RDP, order {_format(record['order'])}, {record['method']} conversion)")
    print(f"  PLD (dp-accounting, pessimistic, interval {PLD_VALUE_DISCRETIZATION_INTERVAL:g}): epsilon = "
          f"{_format(record['pld_epsilon'])}; tighter: {record['tighter']}")
    for message in record.get("warnings", []):
        print(f"  warning: {message}")
    return 0
