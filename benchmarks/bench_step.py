"""Per-step cost of PMixED and AdaPMixED against a baseline that follows the public reference
implementation's algorithm, side by side in one process, plus the accountant and the audit's
ablation. Writes benchmarks/results.json and benchmarks/results.md.

Baseline (written here, as the public PMixED code runs it): distributions in float32 torch; each
teacher's mixing weight by scalar bisection with 20 halvings on D<->_alpha(mix, p0) - beta alpha, the
divergence evaluated as 1/(a-1) log sum (p/q)^a q after a cast to float64; the data-dependent loss at
one order by a Python loop over teachers (mean of the others, then the symmetric divergence); the
noisy screen on the public top-k. dpledger: PMixED.step / AdaPMixED.step with the run's full
156-order charged curve (remove-one Eq. 3 and the add-one bound, add-or-remove relation).

Synthetic LM-like inputs (seeded): public logits 4.5 z, teacher i logits = public logits + 1.0 z_i,
z standard normal, softmax. Every figure is a median over repetitions; one thread unless stated.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).parent


def synthetic_ensemble(vocab: int, teachers: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    public_logits = 4.5 * rng.standard_normal(vocab)
    teacher_logits = public_logits + rng.standard_normal((teachers, vocab))

    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return softmax(teacher_logits), softmax(public_logits)


# ---- baseline: the public reference's algorithm -------------------------------------------------

def _renyi(p: torch.Tensor, q: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.log(torch.sum((p / q) ** alpha * q)) / (alpha - 1)


def _symmetric(p: torch.Tensor, q: torch.Tensor, alpha: float) -> float:
    p, q = p.double(), q.double()
    return max(float(_renyi(p, q, alpha)), float(_renyi(q, p, alpha)))


def baseline_lambda(teacher: torch.Tensor, public: torch.Tensor, alpha: float, target: float) -> float:
    def excess(lam: float) -> float:
        return _symmetric(lam * teacher + (1 - lam) * public, public, alpha) - target

    if excess(1.0) <= 0:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(20):                 # scipy.optimize.bisect(maxiter=20), as the reference calls it
        middle = 0.5 * (low + high)
        if excess(middle) > 0:
            high = middle
        else:
            low = middle
    return 0.5 * (low + high)


def baseline_loss(mixed: torch.Tensor, alpha: float) -> float:
    p = mixed.mean(dim=0)
    worst = 0.0
    for i in range(mixed.shape[0]):
        without = torch.cat((mixed[:i], mixed[i + 1:])).mean(dim=0)
        worst = max(worst, _symmetric(p, without, alpha))
    return worst


def baseline_screen(teachers: torch.Tensor, public: torch.Tensor, lam: float, sigma: float, alpha: float, top_k: int,
                    generator: torch.Generator) -> float:
    top = torch.topk(public, top_k).indices
    mean = (lam * teachers[:, top] + (1 - lam) * public[top]).mean(dim=0)
    noisy = (mean + sigma * torch.randn(top_k, generator=generator)).clamp_min(0)
    return _symmetric(noisy / noisy.sum(), public[top] / public[top].sum(), alpha)


def baseline_step(teachers: torch.Tensor, public: torch.Tensor, alpha: float, beta: float, screen: dict | None,
                  generator: torch.Generator) -> tuple[torch.Tensor, np.ndarray]:
    if screen is not None:
        baseline_screen(teachers, public, screen["lam"], screen["sigma"], alpha, screen["top_k"], generator)
    lambdas = np.array([baseline_lambda(t, public, alpha, beta * alpha) for t in teachers])
    mixed = torch.stack([float(lam) * t + (1 - float(lam)) * public for lam, t in zip(lambdas, teachers)])
    if screen is not None:
        baseline_loss(mixed, alpha)
    return mixed.mean(dim=0), lambdas


# ---- measurement ------------------------------------------------------------------------------------

def median_seconds(function, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def step_section(vocab: int, teachers: int, repeats: int, baseline_repeats: int) -> dict:
    from dpledger.accounting.orders import DEFAULT_ORDERS
    from dpledger.mechanisms.adapmixed import AdaPMixED
    from dpledger.mechanisms.add_one import add_one_divergence_bounds
    from dpledger.mechanisms.kernels import mixed_teachers, mixing_weights
    from dpledger.mechanisms.leave_one_out import leave_one_out_curve, leave_one_out_divergences
    from dpledger.mechanisms.pmixed import PMixED

    probs, public = synthetic_ensemble(vocab, teachers)
    t64, p64 = torch.from_numpy(probs), torch.from_numpy(public)
    t32, p32 = t64.float(), p64.float()
    orders = np.asarray(DEFAULT_ORDERS)
    ada = AdaPMixED.paper_defaults(teachers)
    pmixed6 = PMixED(6.0, 0.01, teachers)
    generator = torch.Generator().manual_seed(0)
    screen = {"lam": 1e-4, "sigma": 1e-2, "top_k": 60}
    lambdas = mixing_weights(t64, p64, 18.0, 3.6)
    figures = {
        "baseline_adapmixed_step": median_seconds(lambda: baseline_step(t32, p32, 18.0, 0.2, screen, generator),
                                                  baseline_repeats),
        "baseline_pmixed_step": median_seconds(lambda: baseline_step(t32, p32, 6.0, 0.01, None, generator),
                                               baseline_repeats),
        "baseline_mixing_weights": median_seconds(
            lambda: [baseline_lambda(t, p32, 18.0, 3.6) for t in t32], baseline_repeats),
        "baseline_loss_one_order": median_seconds(
            lambda: baseline_loss(mixed_teachers(t64, p64, lambdas).float(), 18.0), baseline_repeats),
        "dpledger_adapmixed_step": median_seconds(lambda: ada.step(probs, public, generator, orders), repeats),
        "dpledger_pmixed_step": median_seconds(lambda: pmixed6.step(probs, public, orders=orders), repeats),
        "dpledger_mixing_weights": median_seconds(lambda: mixing_weights(t64, p64, 18.0, 3.6), repeats),
        "dpledger_loss_one_order": median_seconds(
            lambda: leave_one_out_divergences(mixed_teachers(t64, p64, lambdas), torch.tensor([18.0])), repeats),
        "dpledger_remove_one_curve": median_seconds(lambda: leave_one_out_curve(t64, p64, lambdas, orders), repeats),
        "dpledger_add_one_curve": median_seconds(
            lambda: add_one_divergence_bounds(mixed_teachers(t64, p64, lambdas).mean(dim=-2), p64, teachers,
                                              torch.from_numpy(orders), 18.0, 3.6), repeats),
    }
    # accuracy of the sub-grid curve against the exact value at every order
    coarse, exact_mask, _ = leave_one_out_curve(t64, p64, lambdas, orders)
    exact = leave_one_out_curve(t64, p64, lambdas, orders, relative_tolerance=None)[0]   # every teacher, every order
    ratio = coarse / exact
    epsilons = run_epsilon_ratio(coarse, exact, orders)
    return {
        "vocab": vocab, "teachers": teachers,
        "seconds": {k: round(v, 5) for k, v in figures.items()},
        "speedup": {
            "adapmixed_step": round(figures["baseline_adapmixed_step"] / figures["dpledger_adapmixed_step"], 2),
            "pmixed_step": round(figures["baseline_pmixed_step"] / figures["dpledger_pmixed_step"], 2),
            "mixing_weights": round(figures["baseline_mixing_weights"] / figures["dpledger_mixing_weights"], 2),
            "loss_one_order": round(figures["baseline_loss_one_order"] / figures["dpledger_loss_one_order"], 2),
        },
        "sub_grid": {"exact_orders": int(exact_mask.sum()), "grid_orders": int(orders.size),
                     "min_ratio_to_exact": float(ratio.min()), "max_ratio_to_exact": float(ratio.max()),
                     "run_epsilon_ratio": epsilons},
    }


def run_epsilon_ratio(coarse: np.ndarray, exact: np.ndarray, orders: np.ndarray) -> dict:
    """The run's epsilon (delta 1e-5) from the sub-grid curve over the exact one, for runs of this
    step repeated 1, 100 and 10,000 times (the optimal order moves with the run length)."""
    from dpledger.accounting.conversion import epsilon_from_rdp
    from dpledger.accounting.curve import RdpCurve

    out = {}
    for steps in (1, 100, 10_000):
        bounded = epsilon_from_rdp(RdpCurve(tuple(orders), coarse * steps), 1e-5).epsilon
        true = epsilon_from_rdp(RdpCurve(tuple(orders), exact * steps), 1e-5).epsilon
        out[str(steps)] = round(bounded / true, 6)
    return out


def accountant_section(steps: int = 100_000) -> dict:
    from dpledger.accounting.conversion import epsilon_from_rdp
    from dpledger.accounting.curve import RdpCurve, compose_curves
    from dpledger.accounting.ledger import PrivacyLedger
    from dpledger.accounting.orders import DEFAULT_ORDERS
    from dpledger.accounting.relation import NeighbouringRelation

    rng = np.random.default_rng(0)
    values = rng.uniform(0.0, 1e-4, (steps, len(DEFAULT_ORDERS))) * np.asarray(DEFAULT_ORDERS)

    def curves_one_by_one():
        curves = [RdpCurve(DEFAULT_ORDERS, row, NeighbouringRelation.ADD_OR_REMOVE_ONE, True) for row in values]
        return epsilon_from_rdp(compose_curves(curves), 1e-5).epsilon

    def ledger_block():
        ledger = PrivacyLedger(DEFAULT_ORDERS)
        ledger.charge_many({"step": (values, True)})
        return ledger.epsilon(1e-5).epsilon

    return {"steps": steps,
            "seconds_rdpcurve_objects_composed_and_converted": round(median_seconds(curves_one_by_one, 3), 3),
            "seconds_ledger_charge_many_and_convert": round(median_seconds(ledger_block, 3), 4)}


def ablation_section(steps: int, threads: int) -> dict:
    """The audit's neighbour ablation (remove each of the N teachers and add each of three
    adversaries, both directions, the audit's orders, exact at each) on `steps` paper-scale steps,
    extrapolated to 1,000 steps."""
    from dpledger.audit.ablation import DEFAULT_AUDIT_ORDERS, neighbour_divergences

    os.environ["DPLEDGER_KERNEL_THREADS"] = str(threads)
    probs, public = synthetic_ensemble(50257, 100)
    rng = np.random.default_rng(1)
    block_t = torch.from_numpy(np.stack([probs] * steps))
    block_p = torch.from_numpy(np.stack([public] * steps))
    lambdas = torch.from_numpy(rng.uniform(0.0, 1.0, (steps, 100)))
    orders = torch.tensor(sorted(set(DEFAULT_AUDIT_ORDERS)), dtype=torch.float64)
    params = {"alpha": 18.0, "beta": 0.2}
    seconds = median_seconds(lambda: neighbour_divergences(block_p, block_t, lambdas, "pmixed", params,
                                                           list(range(100)), orders), 1)
    os.environ.pop("DPLEDGER_KERNEL_THREADS")
    return {"steps_measured": steps, "threads": threads, "orders": len(orders),
            "seconds_per_step": round(seconds / steps, 4), "seconds_per_1000_steps": round(seconds / steps * 1000, 1)}


def gpu_section() -> dict:
    if not torch.cuda.is_available():
        return {"device": None, "note": "no CUDA device on this machine"}
    from dpledger.accounting.orders import DEFAULT_ORDERS
    from dpledger.mechanisms.adapmixed import AdaPMixED

    probs, public = synthetic_ensemble(50257, 100)
    teachers = torch.from_numpy(probs).cuda()
    public_t = torch.from_numpy(public).cuda()
    ada = AdaPMixED.paper_defaults(100)
    generator = torch.Generator().manual_seed(0)

    def step():
        ada.step(teachers, public_t, generator, DEFAULT_ORDERS)
        torch.cuda.synchronize()

    return {"device": torch.cuda.get_device_name(0), "seconds_adapmixed_step": round(median_seconds(step, 5), 5)}


def markdown(results: dict) -> str:
    lines = ["| figure | baseline (reference algorithm) | dpledger | speed-up |", "|---|---|---|---|"]
    for name, section in (("paper scale (V=50,257, N=100)", results["paper"]), ("demo scale (V=1,024, N=8)", results["demo"])):
        s = section["seconds"]
        lines += [f"| {name}: AdaPMixED step, full 156-order curve | {s['baseline_adapmixed_step']:.4f} s (one order) | "
                  f"{s['dpledger_adapmixed_step']:.4f} s | {section['speedup']['adapmixed_step']}x |",
                  f"| {name}: PMixED step (alpha 6, beta 0.01) | {s['baseline_pmixed_step']:.4f} s | "
                  f"{s['dpledger_pmixed_step']:.4f} s | {section['speedup']['pmixed_step']}x |",
                  f"| {name}: mixing weights | {s['baseline_mixing_weights']:.4f} s | {s['dpledger_mixing_weights']:.4f} s | "
                  f"{section['speedup']['mixing_weights']}x |",
                  f"| {name}: Eq. 3 loss at order 18 | {s['baseline_loss_one_order']:.4f} s | {s['dpledger_loss_one_order']:.4f} s | "
                  f"{section['speedup']['loss_one_order']}x |"]
    a = results["accountant"]
    lines += [f"| 100,000 per-step curves: RdpCurve objects, compose_curves, epsilon | | "
              f"{a['seconds_rdpcurve_objects_composed_and_converted']} s | |",
              f"| 100,000 per-step curves: ledger.charge_many, epsilon | | {a['seconds_ledger_charge_many_and_convert']} s | |"]
    if "ablation" in results:
        b = results["ablation"]
        lines.append(f"| audit ablation, 1,000 paper-scale steps ({b['threads']} threads, extrapolated from "
                     f"{b['steps_measured']}) | | {b['seconds_per_1000_steps']} s | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, no ablation (a smoke run)")
    parser.add_argument("--out", default=str(HERE / "results.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats, baseline_repeats = (3, 1) if args.quick else (7, 3)
    results = {
        "benchmark": __doc__.split("\n\n")[0],
        "machine": {"processor": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads(),
                    "python": platform.python_version(), "torch": torch.__version__},
        "paper": step_section(50257, 100, repeats, baseline_repeats),
        "demo": step_section(1024, 8, repeats * 5, baseline_repeats * 5),
        "accountant": accountant_section(),
        "gpu": gpu_section(),
    }
    if not args.quick:
        results["ablation"] = ablation_section(steps=4, threads=2)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    Path(args.out).with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
