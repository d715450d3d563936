"""`dpledger account`: (epsilon, delta) of Q queries of a data-independent mechanism.

Hot PATE's aggregators (Cohen et al. 2023): dpargmax (Confident-GNMax, Papernot et al. 2018,
Algorithm 1) and dpws (Gaussian-noised counts, then TWS) are DP; targmax and tws are only
T-threshold private (a robustness notion) and are reported as giving no DP guarantee."""
from __future__ import annotations

import argparse
import math
import warnings

import numpy as np

from accounting.conversion import ConversionMethod, GridEdgeWarning, epsilon_from_rdp
from accounting.curve import RdpCurve
from accounting.errors import require
from accounting.strict_json import strict_json_text
from accounting.orders import default_orders
from mechanisms import (Ball, ConfidentGNMax, DPWeightedSampler, GaussianMechanism, GNMax, NoisyScreening, PMixED,
                        PoissonSubsampledGaussian, SubsamplingVariant, Targmax, ThresholdWeightedSampler,
                        subsampled_pmixed_curve)

MECHANISMS = ("gaussian", "subsampled-gaussian", "pmixed", "screening", "gnmax", "confident-gnmax",
              "dpargmax", "dpws", "targmax", "tws")
# T-threshold private only (Cohen et al. 2023): no DP guarantee, no epsilon
THRESHOLD_PRIVATE = ("targmax", "tws")
ACCOUNTING = ("released-output", "realised-path")

_SUMMARY = {
    "gaussian": "Gaussian mechanism (Mironov 2017, Proposition 7)",
    "subsampled-gaussian": "Poisson-subsampled Gaussian (Mironov, Talwar & Zhang 2019)",
    "pmixed": "PMixED, optionally with Poisson subsampling of teachers (Flemings et al. 2024, Theorem 3.1, "
              "Theorem A.4)",
    "screening": "AdaPMixED's noisy screening step alone (Flemings et al. 2024, Theorem 4.2's eps_screen)",
    "gnmax": "GNMax, Gaussian noisy argmax of vote counts (Papernot et al. 2018, Proposition 8)",
    "confident-gnmax": "Confident-GNMax, screen then GNMax, both charged every query (Papernot et al. 2018, "
                       "Algorithm 1)",
    "dpargmax": "Hot PATE's DP argmax = Confident-GNMax (Cohen et al. 2023; Papernot et al. 2018)",
    "dpws": "Hot PATE's DP weighted sampler: Gaussian-noised counts, then TWS (Cohen et al. 2023)",
    "targmax": "Hot PATE's TARGMAX_T: T-threshold private only, no DP guarantee (Cohen et al. 2023)",
    "tws": "Hot PATE's TWS_{T,gamma}: T-threshold private only, no DP guarantee (Cohen et al. 2023)",
}

# every flag a mechanism may read: argparse keyword arguments (help names units and defaults)
_FLAG_SPECS = {
    "queries": dict(type=int, metavar="Q", help="number of queries Q, composed adaptively (Mironov 2017, "
                                                "Proposition 1); an integer >= 1"),
    "delta": dict(type=float, metavar="DELTA", help="target delta of the (epsilon, delta) guarantee, in (0, 1)"),
    "noise_multiplier": dict(type=float, metavar="Z", help="Gaussian noise standard deviation divided by the L2 "
                                                           "sensitivity (unitless, > 0)"),
    "sample_rate": dict(type=float, metavar="Q_RATE", help="Poisson sampling probability q, in (0, 1]"),
    "alpha": dict(type=float, metavar="A", help="PMixED projection order a (> 1; Flemings et al. 2024 use 6)"),
    "beta": dict(type=float, metavar="BETA", help="Renyi-ball radius per unit of order: each mixed teacher keeps "
                                                  "D_a(mixed || public) <= beta * a, in nats (> 0)"),
    "teachers": dict(type=int, metavar="N", help="ensemble size N (number of teachers, >= 1)"),
    "sigma": dict(type=float, metavar="SIGMA"),  # help per mechanism: its unit differs
    "sigma_threshold": dict(type=float, metavar="S1", help="Confident-GNMax screen noise s1: standard deviation of "
                                                           "the Gaussian added to the top vote count, in votes"),
    "lam": dict(type=float, metavar="LAMBDA", help="screening mixing weight lambda, in (0, 1]"),
    "threshold": dict(type=float, metavar="T"),  # help per mechanism
    "gamma": dict(type=float, default=1.0, metavar="GAMMA", help="TWS's gamma >= 1 (default: 1)"),
    "ball": dict(choices=[b.value for b in Ball], default=Ball.PROJECTION_ORDER.value,
                 help="PMixED's Renyi ball: projection-order (the paper's; Theorem 3.1 as claimed) or all-orders "
                      "(Theorem 3.1 proven at every order; docs/soundness.md) (default: projection-order)"),
    "seed": dict(type=int, default=0, help="seed of the simulated subsample sizes of the realised-size variants "
                                           "(default: 0)"),
    "accounting": dict(choices=ACCOUNTING, default="released-output",
                       help="released-output (default) charges screen + GNMax on every query, a bound on the "
                            "released (decision, token) pair; realised-path charges GNMax only on the --answered "
                            "queries (Papernot et al. 2018's convention; ex post, not a guarantee)"),
    "answered": dict(type=int, metavar="K", help="with --accounting realised-path: the number K of answered "
                                                 "queries, in [0, Q]"),
}
_SIGMA_HELP = {
    "screening": "standard deviation of the Gaussian added to each probability of the mixed distribution "
                 "(probability units, > 0)",
    "gnmax": "standard deviation of the Gaussian added to each vote count, in votes (> 0)",
    "confident-gnmax": "GNMax noise s2: standard deviation of the Gaussian added to each vote count, in votes",
    "dpargmax": "GNMax noise s2: standard deviation of the Gaussian added to each vote count, in votes",
    "dpws": "standard deviation of the Gaussian added to each vote count before TWS, in votes (> 0)",
}
_THRESHOLD_HELP = {
    "dpargmax": "screen threshold T on the noisy top count, in votes (recorded; the RDP does not depend on it)",
    "dpws": "TWS threshold T: only tokens with a noisy count >= T can be released, in votes",
    "targmax": "TARGMAX threshold T: the top token is released only with >= T votes (an integer >= 1)",
    "tws": "TWS threshold T: only tokens with >= T votes can be released, in votes",
}

# which flags each mechanism needs; a missing one is refused by name, all at once
_REQUIRED = {
    "gaussian": ("noise_multiplier",),
    "subsampled-gaussian": ("noise_multiplier", "sample_rate"),
    "pmixed": ("alpha", "beta", "teachers"),
    "screening": ("teachers", "lam", "sigma"),
    "gnmax": ("sigma",),
    "confident-gnmax": ("sigma", "sigma_threshold"),
    "dpargmax": ("sigma", "sigma_threshold"),
    "dpws": ("sigma", "threshold"),
    "targmax": ("threshold",),
    "tws": ("threshold",),
}
# every DP mechanism is composed Q times and converted at delta
for _kind in MECHANISMS:
    if _kind not in THRESHOLD_PRIVATE:
        _REQUIRED[_kind] = ("queries", "delta") + _REQUIRED[_kind]
# flags a mechanism reads beyond its required ones; its subcommand has no other flag
_OPTIONAL = {
    "gaussian": (), "subsampled-gaussian": (), "gnmax": (), "confident-gnmax": (), "screening": (),
    "pmixed": ("ball", "sample_rate", "seed"),
    "dpargmax": ("threshold", "accounting", "answered"), "dpws": ("gamma",),
    "targmax": ("queries", "delta"), "tws": ("queries", "delta", "gamma"),  # any Q: still no DP guarantee
}
# the RDP-to-(epsilon, delta) conversion and the order grid apply to every DP mechanism
CONVERSION_FLAGS = ("method", "orders")


def _option(flag: str) -> str:
    return "--" + flag.replace("_", "-")


def accepted_flags(mechanism: str) -> tuple[str, ...]:
    """The flags `dpledger account MECHANISM` reads, as typed on the command line."""
    flags = _REQUIRED[mechanism] + _OPTIONAL[mechanism]
    if mechanism not in THRESHOLD_PRIVATE:
        flags += CONVERSION_FLAGS
    return tuple(_option(flag) for flag in flags) + ("--json",)


def _refuse_missing_flags(args: argparse.Namespace) -> None:
    """Every missing flag named at once, by its flag name."""
    missing = [flag for flag in _REQUIRED[args.mechanism] if getattr(args, flag, None) is None]
    require(not missing, f"mechanism {args.mechanism} needs " + ", ".join(_option(f) for f in missing))


def parse_orders(text: str) -> tuple[float, ...]:
    """--orders "2,4.5,2048": extra Renyi orders (> 1) added to the default grid."""
    try:
        values = [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers > 1, got {text!r}") from None
    if not values or not all(math.isfinite(v) and v > 1 for v in values):
        raise argparse.ArgumentTypeError(f"every order must be a finite number > 1, got {text!r}")
    return tuple(values)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("account", help="epsilon of Q queries of a data-independent mechanism",
                                   description=__doc__)
    mechanisms = parser.add_subparsers(dest="mechanism", required=True, metavar="MECHANISM",
                                       title="mechanisms (dpledger account MECHANISM --help lists its flags)")
    for mechanism in MECHANISMS:
        sub = mechanisms.add_parser(mechanism, help=_SUMMARY[mechanism], description=_SUMMARY[mechanism] + ".")
        required = sub.add_argument_group("required")
        optional = sub.add_argument_group("optional")
        for flag in _REQUIRED[mechanism] + _OPTIONAL[mechanism]:
            spec = dict(_FLAG_SPECS[flag])
            if flag == "sigma":
                spec["help"] = _SIGMA_HELP[mechanism]
            elif flag == "threshold":
                spec["help"] = _THRESHOLD_HELP[mechanism]
            elif flag in ("queries", "delta") and mechanism in THRESHOLD_PRIVATE:
                spec["help"] = "recorded only: no number of queries gives a DP guarantee"
            if flag == "sample_rate" and mechanism == "pmixed":
                spec["help"] = ("Poisson subsampling of teachers with probability q in (0, 1]; every accounting "
                                "variant is shown (Flemings et al. 2024, Theorem A.4)")
            (required if flag in _REQUIRED[mechanism] else optional).add_argument(_option(flag), **spec)
        if mechanism not in THRESHOLD_PRIVATE:
            optional.add_argument("--method", choices=[m.value for m in ConversionMethod], default="improved",
                                  help="RDP to (epsilon, delta): improved (Balle et al. 2020, Theorem 21) or classic "
                                       "(Mironov 2017, Proposition 3) (default: improved)")
            optional.add_argument("--orders", type=parse_orders, metavar="A,B,...",
                                  help="extra Renyi orders (> 1) added to the default grid (1.1..10.9 by 0.1, "
                                       "11..63, 128, 256, 512, 1024), e.g. when the optimum is at its edge")
        optional.add_argument("--json", action="store_true", help="print one strict JSON object")
        sub.set_defaults(handler=run, accepted_flags=accepted_flags(mechanism))


def _with_every_flag(args: argparse.Namespace) -> argparse.Namespace:
    """args with the flags this mechanism's subcommand does not have set to their unset value."""
    values = {flag: spec.get("default") for flag, spec in _FLAG_SPECS.items()}
    values.update(method=ConversionMethod.IMPROVED.value, orders=None, json=False)
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


def account(args: argparse.Namespace) -> dict:
    """Build the mechanism from the flags, compose it Q times and convert; returns the JSON object."""
    _refuse_missing_flags(args)
    args = _with_every_flag(args)
    if args.queries is not None:
        require(args.queries >= 1, f"--queries must be >= 1, got {args.queries}")
    kind = args.mechanism
    require(args.accounting == "released-output" or kind == "dpargmax",
            f"--accounting {args.accounting} applies to dpargmax only, not {kind}")
    require(args.answered is None or args.accounting == "realised-path",
            "--answered applies only with --accounting realised-path")
    if kind in THRESHOLD_PRIVATE:
        return _threshold_private(args)
    if kind == "dpargmax":
        return _dpargmax(args)
    if kind == "gaussian":
        mechanism = GaussianMechanism(args.noise_multiplier)
    elif kind == "subsampled-gaussian":
        mechanism = PoissonSubsampledGaussian(args.noise_multiplier, args.sample_rate)
    elif kind == "screening":
        mechanism = NoisyScreening(teachers=args.teachers, lam=args.lam, sigma=args.sigma)
    elif kind == "gnmax":
        mechanism = GNMax(args.sigma)
    elif kind == "confident-gnmax":
        mechanism = ConfidentGNMax(threshold=0.0, sigma_threshold=args.sigma_threshold, sigma=args.sigma)
    elif kind == "dpws":
        mechanism = DPWeightedSampler(sigma=args.sigma, threshold=args.threshold, gamma=args.gamma)
    else:
        mechanism = PMixED(args.alpha, args.beta, args.teachers, ball=args.ball)
    # the mechanism validated its own parameters; now its order joins the grid
    orders = _grid(args, *([args.alpha] if kind == "pmixed" else []))
    if kind == "pmixed" and args.sample_rate is not None:
        # every variant is shown: the paper's ball for the first five, the all-orders ball for the last
        balls = {ball: PMixED(args.alpha, args.beta, args.teachers, ball=ball) for ball in Ball}
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
                      variants=variants, relation=mechanism.relation.value,
                      note="all-orders-ball accounts PMixED with ball = all-orders (a different projection); the "
                           "others the paper's ball, whose Theorem 3.1 is as claimed (docs/soundness.md)")
        return record
    record = _conversion_record(mechanism.rdp_curve(orders).composed(args.queries), args.delta, args.method)
    record.update(mechanism=kind, queries=args.queries, relation=mechanism.relation.value)
    if kind == "dpws":
        record.update(dp_guarantee=math.isfinite(record["epsilon"]), sigma=mechanism.sigma, threshold=mechanism.threshold, gamma=mechanism.gamma,
                      note="Gaussian N(0, sigma^2) on every count (L2 sensitivity sqrt 2 under replace-one): "
                           "alpha / sigma^2 per query; TWS on the clipped noisy counts is post-processing")
    if kind == "pmixed":
        record["ball"] = mechanism.ball.value
        record["note"] = ("Theorem 3.1 proven at every order: the ball holds at every order" if mechanism.proven else
                          "Theorem 3.1 as claimed: not guaranteed for inputs with extreme tails; --ball all-orders "
                          "gives a projection for which it is proven (docs/soundness.md)")
    return record


def _dpargmax(args: argparse.Namespace) -> dict:
    """Hot PATE's DP argmax = Confident-GNMax: screen (alpha / (2 s1^2)) on every query plus GNMax
    (alpha / s2^2) on every query (released-output) or on the K answered ones (realised-path)."""
    threshold = 0.0 if args.threshold is None else args.threshold
    mechanism = ConfidentGNMax(threshold=threshold, sigma_threshold=args.sigma_threshold, sigma=args.sigma)
    queries = args.queries
    realised = args.accounting == "realised-path"
    if realised:
        require(args.answered is not None, "mechanism dpargmax with --accounting realised-path needs --answered")
        require(0 <= args.answered <= queries, f"--answered must be in [0, --queries = {queries}], got {args.answered}")
    charged_answers = args.answered if realised else queries
    orders = _grid(args)
    grid = np.asarray(orders, dtype=np.float64)
    screen = RdpCurve(orders, mechanism.screen_rdp(grid), mechanism.relation)
    answer = RdpCurve(orders, mechanism.answer_rdp(grid), mechanism.relation)
    # adaptive composition (Mironov 2017, Proposition 1): Q screens, and GNMax on Q (or K) queries
    curve = screen.composed(queries) + answer.composed(charged_answers)
    if realised:
        # K depends on the private data through the screen: an ex-post statement about one run
        curve = RdpCurve(curve.orders, curve.values, curve.relation, True, curve.direction)
    record = _conversion_record(curve, args.delta, args.method)
    record.update(mechanism="dpargmax", queries=queries, relation=mechanism.relation.value,
                  accounting=args.accounting, dp_guarantee=not realised and math.isfinite(record["epsilon"]),
                  sigma=mechanism.sigma,
                  sigma_threshold=mechanism.sigma_threshold, threshold=args.threshold,
                  charged={"screen_queries": queries, "gnmax_queries": charged_answers})
    if realised:
        record.update(answered=args.answered, data_dependent=True)
        record["label"] = (f"realised-path: an ex-post statement about one run with {args.answered} answered "
                           "queries, not an RDP guarantee of the mechanism")
        record["note"] = ("screen alpha/(2 s1^2) on all queries, GNMax alpha/s2^2 on the answered ones only "
                          "(Papernot et al. 2018's convention)")
    else:
        record["note"] = ("released-output: every query charged screen alpha/(2 s1^2) + GNMax alpha/s2^2, which "
                          "bounds the released (decision, token) pair whichever branch is taken (Mironov 2017, "
                          "Proposition 1); T is recorded, the RDP does not depend on it")
    return record


def _threshold_private(args: argparse.Namespace) -> dict:
    """targmax / tws: T-threshold private only; no DP guarantee, so no epsilon is computed or shown."""
    if args.mechanism == "targmax":
        mechanism = Targmax(threshold=args.threshold)
        name, parameters = "TARGMAX_T", {"threshold": mechanism.threshold}
    else:
        mechanism = ThresholdWeightedSampler(threshold=args.threshold, gamma=args.gamma)
        name, parameters = "TWS_{T,gamma}", {"threshold": mechanism.threshold, "gamma": mechanism.gamma}
    # the mechanism's own curve says it: +inf at every order ("no guarantee")
    require(not bool(np.any(np.isfinite(mechanism.rdp_curve().values))),
            f"{args.mechanism} has a finite RDP curve; it is not threshold-private only")
    statement = (f"no DP guarantee: {name} releases only tokens with at least T votes (T-threshold privacy, a "
                 "robustness notion; Cohen et al. 2023)")
    return {"mechanism": args.mechanism, "dp_guarantee": False, "epsilon": None, "delta": None,
            "queries": args.queries, "relation": mechanism.relation.value, **parameters,
            "guarantee": (f"T-threshold privacy with T = {mechanism.threshold:g}: every released token had at least "
                          "T teacher votes; a robustness notion, not differential privacy (Cohen et al. 2023)"),
            "statement": statement,
            "note": "for a DP guarantee use dpargmax (Confident-GNMax) or dpws (Gaussian-noised counts, then TWS)"}


def _format(value) -> str:
    if value is None:
        return "-"
    return "inf" if isinstance(value, float) and math.isinf(value) else f"{value:.6g}"


def run(args: argparse.Namespace) -> int:
    record = account(args)
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
    for message in record.get("warnings", []):
        print(f"  warning: {message}")
    if "note" in record:
        print(f"  note: {record['note']}")
    return 0
