"""`dpledger account`: (epsilon, delta) of Q queries of a data-independent mechanism.

Hot PATE's aggregators (Cohen et al. 2023): dpargmax (Confident-GNMax, Papernot et al. 2018,
Algorithm 1) and dpws (Gaussian-noised counts, then TWS) are DP; targmax and tws are only
T-threshold private (a robustness notion) and are reported as giving no DP guarantee."""
from __future__ import annotations

import argparse
import json
import math
import warnings

import numpy as np

from accounting.conversion import ConversionMethod, GridEdgeWarning, epsilon_from_rdp
from accounting.curve import RdpCurve
from accounting.errors import require
from accounting.orders import default_orders
from mechanisms import (Ball, ConfidentGNMax, DPWeightedSampler, GaussianMechanism, GNMax, NoisyScreening, PMixED,
                        PoissonSubsampledGaussian, SubsamplingVariant, Targmax, ThresholdWeightedSampler,
                        subsampled_pmixed_curve)

MECHANISMS = ("gaussian", "subsampled-gaussian", "pmixed", "screening", "gnmax", "confident-gnmax",
              "dpargmax", "dpws", "targmax", "tws")
# Hot PATE's aggregators; their --json output is strict JSON (+inf written as null, with a note)
HOT_PATE = ("dpargmax", "dpws", "targmax", "tws")
# T-threshold private only (Cohen et al. 2023): no DP guarantee, no epsilon
THRESHOLD_PRIVATE = ("targmax", "tws")
ACCOUNTING = ("released-output", "realised-path")

# which flags each mechanism needs; the CLI refuses a missing one by name
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
# flags a mechanism reads beyond its required ones; any other flag given is refused, never ignored
_OPTIONAL = {
    "gaussian": ("method",), "subsampled-gaussian": ("method",), "gnmax": ("method",),
    "confident-gnmax": ("method",), "screening": ("method",),
    "pmixed": ("method", "ball", "sample_rate", "seed"),
    "dpargmax": ("method", "threshold", "accounting", "answered"), "dpws": ("method", "gamma"),
    "targmax": ("queries", "delta"), "tws": ("queries", "delta", "gamma"),  # any Q: still no DP guarantee
}
_DEFAULTS = {"method": "improved", "ball": Ball.PROJECTION_ORDER.value, "gamma": 1.0, "accounting": "released-output",
             "seed": 0}
_FLAGS = ("queries", "delta", "method", "noise_multiplier", "sample_rate", "alpha", "ball", "beta", "teachers", "sigma",
          "sigma_threshold", "lam", "threshold", "gamma", "accounting", "answered", "seed")


def _refuse_flags_that_do_not_apply(args: argparse.Namespace) -> None:
    """Every missing flag, then every flag the mechanism does not read, named at once (a flag that
    does not apply would otherwise be ignored silently: gaussian --sample-rate 0.1 is not sampled)."""
    kind = args.mechanism
    missing = [flag for flag in _REQUIRED[kind] if getattr(args, flag) is None]
    require(not missing, f"mechanism {kind} needs " + ", ".join(f"--{f.replace('_', '-')}" for f in missing))
    accepted = set(_REQUIRED[kind]) | set(_OPTIONAL[kind])
    given = [flag for flag in _FLAGS if flag not in accepted and getattr(args, flag) is not None
             and getattr(args, flag) != _DEFAULTS.get(flag)]
    require(not given, f"mechanism {kind} does not use " + ", ".join(f"--{f.replace('_', '-')}" for f in given)
            + f"; it reads " + ", ".join(f"--{f.replace('_', '-')}" for f in sorted(accepted)))


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("account", help="epsilon of Q queries of a data-independent mechanism",
                                   description=__doc__)
    parser.add_argument("mechanism", choices=MECHANISMS)
    parser.add_argument("--queries", type=int, help="number of queries Q (composition); needed by every DP mechanism")
    parser.add_argument("--delta", type=float, help="needed by every DP mechanism")
    parser.add_argument("--method", choices=[m.value for m in ConversionMethod], default="improved")
    parser.add_argument("--noise-multiplier", type=float)
    parser.add_argument("--sample-rate", type=float, help="Poisson sampling probability q")
    parser.add_argument("--alpha", type=float, help="PMixED projection order")
    parser.add_argument("--ball", choices=[b.value for b in Ball], default=Ball.PROJECTION_ORDER.value,
                        help="PMixED's Renyi ball: the paper's (projection order only; Theorem 3.1 as claimed) or "
                             "all-orders (Theorem 3.1 proven at every order)")
    parser.add_argument("--beta", type=float)
    parser.add_argument("--teachers", type=int, help="ensemble size N")
    parser.add_argument("--sigma", type=float)
    parser.add_argument("--sigma-threshold", type=float, help="Confident-GNMax threshold noise s1")
    parser.add_argument("--lam", type=float, help="screening mixing weight lambda")
    parser.add_argument("--threshold", type=float,
                        help="vote threshold T: dpargmax's screen threshold (recorded; the RDP does not depend on "
                             "it), dpws/tws's TWS threshold, targmax's T")
    parser.add_argument("--gamma", type=float, default=1.0, help="TWS's gamma >= 1 (dpws, tws; default 1)")
    parser.add_argument("--accounting", choices=ACCOUNTING, default="released-output",
                        help="dpargmax: released-output (default) charges screen + GNMax on every query, a bound "
                             "on the released (decision, token) pair; realised-path charges GNMax only on the "
                             "--answered queries (Papernot et al. 2018's convention; ex post, not a guarantee)")
    parser.add_argument("--answered", type=int, help="dpargmax --accounting realised-path: answered queries K")
    parser.add_argument("--seed", type=int, default=0, help="seed for variants that simulate sample sizes")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def _conversion_record(curve, delta, method, name=None, **extra) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GridEdgeWarning)
        result = epsilon_from_rdp(curve, delta, method)
    record = {"epsilon": result.epsilon, "delta": result.delta, "order": result.order, "method": result.method.value,
              "at_grid_edge": result.at_grid_edge, **extra}
    if name is not None:
        record = {"name": name, **record}
    record["warnings"] = [str(w.message) for w in caught]
    return record


def account(args: argparse.Namespace) -> dict:
    """Build the mechanism from the flags, compose it Q times and convert; returns the JSON object."""
    _refuse_flags_that_do_not_apply(args)
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
    orders = default_orders(*([args.alpha] if kind == "pmixed" else []))
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
    orders = default_orders()
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


def _strict_json(record: dict) -> str:
    """One strict JSON object: +inf (no guarantee) is written as null, with a note saying so."""
    nulled = []

    def clean(value, path):
        if isinstance(value, dict):
            return {key: clean(item, f"{path}.{key}" if path else key) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(item, f"{path}[{i}]") for i, item in enumerate(value)]
        if isinstance(value, (float, np.floating)):
            if math.isinf(value) and value > 0:
                nulled.append(path)
                return None
            return float(value)
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.bool_):
            return bool(value)
        return value

    cleaned = clean(record, "")
    if nulled:
        cleaned["null_note"] = f"{', '.join(nulled)}: +inf (no guarantee at any order of the grid), written as null"
    return json.dumps(cleaned, indent=2, allow_nan=False)


def _format(value) -> str:
    if value is None:
        return "-"
    return "inf" if isinstance(value, float) and math.isinf(value) else f"{value:.6g}"


def run(args: argparse.Namespace) -> int:
    record = account(args)
    if args.json:
        print(_strict_json(record) if record["mechanism"] in HOT_PATE else json.dumps(record, indent=2, default=str))
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
