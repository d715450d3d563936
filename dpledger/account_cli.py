"""`dpledger account`: (epsilon, delta) of Q queries of a data-independent mechanism."""
from __future__ import annotations

import argparse
import json
import math
import warnings

from accounting.conversion import ConversionMethod, GridEdgeWarning, epsilon_from_rdp
from accounting.errors import require
from accounting.orders import default_orders
from mechanisms import (Ball, ConfidentGNMax, GaussianMechanism, GNMax, NoisyScreening, PMixED,
                        PoissonSubsampledGaussian, SubsamplingVariant, subsampled_pmixed_curve)

MECHANISMS = ("gaussian", "subsampled-gaussian", "pmixed", "screening", "gnmax", "confident-gnmax")

# which flags each mechanism needs; the CLI refuses a missing one by name
_REQUIRED = {
    "gaussian": ("noise_multiplier",),
    "subsampled-gaussian": ("noise_multiplier", "sample_rate"),
    "pmixed": ("alpha", "beta", "teachers"),
    "screening": ("teachers", "lam", "sigma"),
    "gnmax": ("sigma",),
    "confident-gnmax": ("sigma", "sigma_threshold"),
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("account", help="epsilon of Q queries of a data-independent mechanism",
                                   description=__doc__)
    parser.add_argument("mechanism", choices=MECHANISMS)
    parser.add_argument("--queries", type=int, required=True, help="number of queries Q (composition)")
    parser.add_argument("--delta", type=float, required=True)
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
    for flag in _REQUIRED[args.mechanism]:
        require(getattr(args, flag) is not None,
                f"mechanism {args.mechanism} needs --{flag.replace('_', '-')}")
    require(args.queries >= 1, f"--queries must be >= 1, got {args.queries}")
    kind = args.mechanism
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
    if kind == "pmixed":
        record["ball"] = mechanism.ball.value
        record["note"] = ("Theorem 3.1 proven at every order: the ball holds at every order" if mechanism.proven else
                          "Theorem 3.1 as claimed: not guaranteed for inputs with extreme tails; --ball all-orders "
                          "gives a projection for which it is proven (docs/soundness.md)")
    return record


def _format(value) -> str:
    if value is None:
        return "-"
    return "inf" if isinstance(value, float) and math.isinf(value) else f"{value:.6g}"


def run(args: argparse.Namespace) -> int:
    record = account(args)
    if args.json:
        print(json.dumps(record, indent=2, default=str))
        return 0
    print(f"{record['mechanism']}: {record['queries']} queries -> epsilon = {_format(record['epsilon'])} "
          f"at delta = {record['delta']:g} (order {_format(record['order'])}, {record['method']} conversion)")
    for variant in record.get("variants", []):
        print(f"  {variant['name']:<26} epsilon = {_format(variant['epsilon']):>10}  order {_format(variant['order']):>4}"
              f"  -- {variant['soundness']}")
    for message in record.get("warnings", []):
        print(f"  warning: {message}")
    if "note" in record:
        print(f"  note: {record['note']}")
    return 0
