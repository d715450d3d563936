"""Per-step cost of dpledger's PMixED and AdaPMixED beside the public reference implementation's own
step functions, in one process, on one thread, plus the accountant and the audit's ablation.
Writes benchmarks/results/step.json and benchmarks/results.md.

Comparator: with $DPLEDGER_REFERENCE naming a checkout of github.com/james-flemings/pmixed, the
reference's own steps run (`Ensemble.priv_pred`, main branch, for PMixED;
`PMixED.gen_priv_output_dist` with data-dependent accounting, noisy-screening branch, for
AdaPMixED; only their model loading is stubbed: benchmarks/baselines.py), the in-repo baseline runs
beside them and must reproduce their lambdas and outputs bit for bit. Without a copy the in-repo
baseline (benchmarks/baselines.py, which follows the reference step for step) is the comparator.
Every figure names the comparator that ran.

dpledger: AdaPMixED.paper_defaults(N).step (alpha 18, beta 0.2, the screen at lam 1e-4, sigma 1e-2,
T 4.5, top-60) with the full 156-order charged curve (remove-one Eq. 3 and the add-one bound,
add-or-remove relation); PMixED(6, 0.01, N).step; and PMixED's decode step, the per-block process of
decoding/runners.py's pmixed_runner on one step (the step plus Eq. 3 at every order for the audit).
The reference's PMixED solves beta per step from a per-query budget: the budget is set so that its
beta is 0.01 (to 20 bisections). The reference runs in float32 (its models' softmax), dpledger in
float64 (its decode loop's).

Timing: interleaved pairs (comparator, dpledger, in rotating order), each sample `steps` calls, after
a warm-up call of each (numba compiles on first use); the speed-up is the per-pair ratio, reported
as median and range. One thread: OMP_NUM_THREADS=1, NUMBA_NUM_THREADS=1, torch.set_num_threads(1).

Synthetic LM-like inputs (seeded): public logits 4.5 z, teacher i logits = public logits + 1.0 z_i,
z standard normal, softmax.

The process keeps freed memory (dpledger.decoding.process_memory.retain_freed_memory, as `dpledger decode`
and `dpledger audit` do), for the comparator and dpledger alike.
"""
from __future__ import annotations

import os

# one thread unless this is the child process that times the ablation on more (ablation_section)
_THREADS = os.environ.get("DPLEDGER_BENCH_THREADS", "1")
for _variable in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = _THREADS   # before numpy, torch and numba start their pools

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.baselines import (IN_REPO, InRepoAdaPMixED, InRepoPMixED, load_reference,  # noqa: E402
                                  reference_adapmixed, reference_pmixed, subsampled_ball_loss)
from benchmarks.step_timing import call_seconds, synthetic_ensemble, timed_adapmixed_steps  # noqa: E402,F401
from dpledger.decoding.process_memory import retain_freed_memory  # noqa: E402

ADA = dict(alpha=18, beta=0.2, lam=1e-4, sigma=1e-2, threshold=4.5, top_k=60)
PMIXED_ALPHA, PMIXED_BETA = 6, 0.01


def load() -> dict:
    """The machine's load: 1-minute load average and uptime's line."""
    import subprocess

    return {"loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}


def vector_unit() -> dict:
    """The CPU as LLVM names it and the vector width the fused kernels compile for: 512 bits where
    dpledger.mechanisms.fastmath let LLVM use AVX-512's full width (its import decides), else 256 with
    AVX2 (128 without). The ratios depend on it: the kernels run twice the lanes on AVX-512."""
    import llvmlite.binding as llvm

    import dpledger.mechanisms.fastmath  # noqa: F401  (importing it sets the kernels' CPU features)

    llvm.initialize_native_target()
    features = llvm.get_host_cpu_features().flatten().split(",")
    wide = os.environ.get("NUMBA_CPU_FEATURES", "").endswith("-prefer-256-bit")
    return {"cpu": llvm.get_host_cpu_name(), "avx512f": "+avx512f" in features, "avx2": "+avx2" in features,
            "kernel_vector_bits": 512 if wide else 256 if "+avx2" in features else 128}


# ---- interleaved pairs --------------------------------------------------------------------------------

def interleaved(functions: dict, pairs: int, steps: int) -> dict:
    """Seconds per step of each function, sampled in rotation: sample k runs them starting at the k-th
    (so none is always first), each `steps` times. One warm-up call of each first.

    Returns:
        name -> list of `pairs` seconds-per-step samples.
    """
    names = list(functions)
    for name in names:
        functions[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for k in range(pairs):
        for name in names[k % len(names):] + names[:k % len(names)]:
            started = time.perf_counter()
            for _ in range(steps):
                functions[name]()
            samples[name].append((time.perf_counter() - started) / steps)
    return samples


def summary(values: list[float], digits: int = 5) -> dict:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def ratios(samples: dict, numerator: str, denominator: str) -> dict:
    """Per-pair ratio numerator / denominator: median, range and the pairs."""
    per_pair = [a / b for a, b in zip(samples[numerator], samples[denominator])]
    return {**summary(per_pair, 3), "pairs": len(per_pair)}


# ---- the steps ------------------------------------------------------------------------------------------

def comparators(reference, which: str, teachers: int, t32: list, p32: torch.Tensor) -> tuple[dict, dict]:
    """The comparator's step (reference or in-repo) and, with the reference present, the in-repo
    baseline beside it, after checking that the two agree bit for bit on three steps."""
    if which == "adapmixed":
        baseline = InRepoAdaPMixED(**ADA)
        generator = torch.Generator().manual_seed(0)
        functions = {"in_repo": lambda: baseline.step(t32, p32, generator)}
    else:
        budget = subsampled_ball_loss(PMIXED_ALPHA, 1.0, teachers, PMIXED_BETA)
        baseline = InRepoPMixED(teachers, PMIXED_ALPHA, budget)
        functions = {"in_repo": lambda: baseline.step(t32, p32)}
    module = None if reference is None else (reference.adapmixed_module if which == "adapmixed"
                                             else reference.pmixed_module)
    if module is None:
        return functions, {"comparator": "in_repo", "comparator_is": IN_REPO}
    if which == "adapmixed":
        ours = reference_adapmixed(module, teachers, **ADA)
        check = InRepoAdaPMixED(**ADA)
        agree = []
        for seed in range(3):
            torch.manual_seed(seed)
            theirs = ours.gen_priv_output_dist(p32, t32)
            output, lambdas, _ = check.step(t32, p32, torch.Generator().manual_seed(seed))
            agree.append(torch.equal(theirs, output) and np.array_equal(ours.lambdas, lambdas)
                         and ours.priv_loss == check.privacy_loss)
            module.PMixED.data_dep_loss.cache_clear()

        def reference_step():
            ours.gen_priv_output_dist(p32, t32)
            module.PMixED.data_dep_loss.cache_clear()   # its cache keeps every step's N x V tensors alive
    else:
        budget = subsampled_ball_loss(PMIXED_ALPHA, 1.0, teachers, PMIXED_BETA)
        ours = reference_pmixed(module, teachers, PMIXED_ALPHA, budget)
        check = InRepoPMixED(teachers, PMIXED_ALPHA, budget, seed=0)
        np.random.seed(0)
        agree = []
        for _ in range(3):
            theirs = ours.priv_pred(t32 + [p32])
            output, lambdas = check.step(t32, p32)
            agree.append(torch.equal(theirs, output) and np.array_equal(ours.lambdas, lambdas))

        def reference_step():
            ours.priv_pred(t32 + [p32])
    if not all(agree):
        raise SystemExit(f"{which}: the in-repo baseline does not reproduce the reference's step")
    return ({"reference": reference_step, **functions},
            {"comparator": "reference", "comparator_is": reference.describe(which),
             "in_repo_reproduces_reference_bit_for_bit": True})


def adapmixed_section(reference, vocab: int, teachers: int, pairs: int, steps: int) -> dict:
    from dpledger.accounting.orders import DEFAULT_ORDERS
    from dpledger.mechanisms.adapmixed import AdaPMixED

    probs, public = synthetic_ensemble(vocab, teachers)
    t64, p64 = torch.from_numpy(probs), torch.from_numpy(public)
    t32, p32 = [t.float() for t in t64], p64.float()
    orders = np.asarray(DEFAULT_ORDERS)
    ada = AdaPMixED.paper_defaults(teachers)
    generator = torch.Generator().manual_seed(0)
    first = ada.step(t64, p64, generator, orders)
    functions, about = comparators(reference, "adapmixed", teachers, t32, p32)
    functions["dpledger"] = lambda: ada.step(t64, p64, generator, orders)
    before = load()
    samples = interleaved(functions, pairs, steps)
    out = {"vocab": vocab, "teachers": teachers, **about, "steps_per_sample": steps,
           "dpledger_charged_components": sorted(first.charged), "dpledger_orders": int(orders.size),
           "dpledger_relation": first.relation.value, "dpledger_screen_passed": bool(first.screen_passed),
           "seconds_per_step": {name: summary(values) for name, values in samples.items()},
           "speedup": ratios(samples, about["comparator"], "dpledger"), "load_before": before, "load_after": load()}
    if about["comparator"] == "reference":
        out["in_repo_over_reference_time"] = ratios(samples, "in_repo", "reference")
    return out


def pmixed_section(reference, vocab: int, teachers: int, pairs: int, steps: int) -> dict:
    from dpledger.accounting.orders import DEFAULT_ORDERS
    from dpledger.decoding.runners import pmixed_runner
    from dpledger.mechanisms.pmixed import PMixED

    probs, public = synthetic_ensemble(vocab, teachers)
    t64, p64 = torch.from_numpy(probs), torch.from_numpy(public)
    t32, p32 = [t.float() for t in t64], p64.float()
    orders = np.asarray(DEFAULT_ORDERS)
    pmixed = PMixED(float(PMIXED_ALPHA), PMIXED_BETA, teachers)
    runner = pmixed_runner(float(PMIXED_ALPHA), PMIXED_BETA, teachers)
    generator = torch.Generator().manual_seed(0)
    block_public, block_teachers = p64[None], t64[None]     # a block of one step, as the decode loop hands it
    functions, about = comparators(reference, "pmixed", teachers, t32, p32)
    functions["dpledger_step"] = lambda: pmixed.step(t64, p64, orders=orders)
    functions["dpledger_decode_step"] = lambda: runner.process(block_public, block_teachers, generator, orders)
    before = load()
    samples = interleaved(functions, pairs, steps)
    out = {"vocab": vocab, "teachers": teachers, **about, "steps_per_sample": steps, "alpha": PMIXED_ALPHA,
           "beta": PMIXED_BETA, "dpledger_orders": int(orders.size),
           "seconds_per_step": {name: summary(values) for name, values in samples.items()},
           "speedup_step": ratios(samples, about["comparator"], "dpledger_step"),
           "speedup_decode_step": ratios(samples, about["comparator"], "dpledger_decode_step"),
           "load_before": before, "load_after": load()}
    if about["comparator"] == "reference":
        out["in_repo_over_reference_time"] = ratios(samples, "in_repo", "reference")
    return out


# ---- dpledger alone ---------------------------------------------------------------------------------

def sub_grid_section(vocab: int, teachers: int) -> dict:
    """Accuracy of the Eq. 3 sub-grid curve (exact on a sub-grid, chords between) against the exact
    value at every order, and what it does to a run's epsilon."""
    from dpledger.accounting.orders import DEFAULT_ORDERS
    from dpledger.mechanisms.kernels import mixing_weights
    from dpledger.mechanisms.leave_one_out import leave_one_out_curve

    probs, public = synthetic_ensemble(vocab, teachers)
    t64, p64 = torch.from_numpy(probs), torch.from_numpy(public)
    orders = np.asarray(DEFAULT_ORDERS)
    lambdas = mixing_weights(t64, p64, 18.0, 3.6)
    coarse, exact_mask, _ = leave_one_out_curve(t64, p64, lambdas, orders)
    exact = leave_one_out_curve(t64, p64, lambdas, orders, relative_tolerance=None)[0]   # every teacher, every order
    ratio = coarse / exact
    return {"vocab": vocab, "teachers": teachers, "exact_orders": int(exact_mask.sum()), "grid_orders": int(orders.size),
            "min_ratio_to_exact": float(ratio.min()), "max_ratio_to_exact": float(ratio.max()),
            "run_epsilon_ratio": run_epsilon_ratio(coarse, exact, orders)}


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


def median_seconds(function, repeats: int) -> float:
    return statistics.median(call_seconds(function, repeats))


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


def ablation_in_process(steps: int, threads: int) -> dict:
    """ablation_section in a child process whose numba and OpenMP pools hold `threads` threads (this
    process keeps one: numba's pool cannot grow once started)."""
    import subprocess

    command = [sys.executable, __file__, "--ablation-child", str(steps)]
    environment = {**os.environ, "DPLEDGER_BENCH_THREADS": str(threads)}
    child = subprocess.run(command, env=environment, capture_output=True, text=True, check=True)
    result: dict = json.loads(child.stdout.strip().splitlines()[-1])
    return result


def ablation_section(steps: int, threads: int, pairs: int = 7) -> dict:
    """The audit's neighbour ablation as an AdaPMixED trace is audited (remove each of the N teachers
    and add each of three adversaries, both directions, the audit's orders, the screen's pass
    probabilities by 400 Monte Carlo draws per step) on `steps` paper-scale steps, interleaved with
    dpledger's AdaPMixED step on the same inputs (what the audit's replay recomputes per step):
    seconds per step of each, their paired ratio, and the ablation extrapolated to 1,000 steps."""
    from dpledger.accounting.orders import DEFAULT_ORDERS
    from dpledger.audit.ablation import DEFAULT_AUDIT_ORDERS, neighbour_divergences
    from dpledger.mechanisms.adapmixed import AdaPMixED

    os.environ["DPLEDGER_KERNEL_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    probs, public = synthetic_ensemble(50257, 100)
    ada = AdaPMixED.paper_defaults(100)
    t64, p64 = torch.from_numpy(probs), torch.from_numpy(public)
    generator = torch.Generator().manual_seed(0)
    lambdas = ada.step(t64, p64, generator, DEFAULT_ORDERS).lambdas
    block_t = torch.from_numpy(np.stack([probs] * steps))
    block_p = torch.from_numpy(np.stack([public] * steps))
    block_lambdas = lambdas.unsqueeze(0).expand(steps, -1).contiguous()
    orders = torch.tensor(sorted(set(DEFAULT_AUDIT_ORDERS)), dtype=torch.float64)
    params = {"alpha": 18.0, "beta": 0.2, "lam": 1e-4, "sigma": 1e-2, "threshold": 4.5, "top_k": 60, "screening": True}
    functions = {
        "ablation": lambda: neighbour_divergences(block_p, block_t, block_lambdas, "adapmixed", params,
                                                  list(range(100)), orders, 400),
        "step": lambda: [ada.step(t64, p64, generator, DEFAULT_ORDERS) for _ in range(steps)],
    }
    samples = interleaved(functions, pairs, 1)
    os.environ.pop("DPLEDGER_KERNEL_THREADS")
    per_step = {name: [value / steps for value in values] for name, values in samples.items()}
    ablation = summary(per_step["ablation"], 4)
    return {"form": "adapmixed, screening, 100 removals + 3 adversaries, 400 Monte Carlo draws per step",
            "steps_measured": steps, "threads": threads, "orders": len(orders),
            "seconds_per_step": {name: summary(values, 4) for name, values in per_step.items()},
            "ablation_over_step": ratios(per_step, "ablation", "step"),
            "seconds_per_1000_steps": round(ablation["median"] * 1000, 1)}


def audit_section(steps: int = 4, pairs: int = 3) -> dict:
    """`dpledger audit` of a paper-scale AdaPMixED trace as it runs (every check, the canary game
    included; one thread), interleaved with dpledger's AdaPMixED step: seconds per step of each, their
    paired ratio, and where the audit's time goes (audit.json's check_seconds, per step). The trace is
    tests/synthetic.py's: `steps` steps in one decode block at N = 100, V = 50,257, random logits whose
    teachers sit at four spreads from the public model, with the replay payload (the audit replays one
    step per window at this size)."""
    import tempfile

    from dpledger.accounting.orders import DEFAULT_ORDERS
    from dpledger.audit import audit_run
    from dpledger.mechanisms.adapmixed import AdaPMixED
    from tests.micro import PAPER_ADAPMIXED
    from tests.synthetic import write_synthetic_run

    probs, public = synthetic_ensemble(50257, 100)
    ada = AdaPMixED.paper_defaults(100)
    t64, p64 = torch.from_numpy(probs), torch.from_numpy(public)
    generator = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        run = write_synthetic_run(Path(folder) / "run", 100, 50257, steps, steps, PAPER_ADAPMIXED, payload=True,
                                  step_spreads=(0.3, 1.0, 2.0, 0.5))
        reports = []
        functions = {"audit": lambda: reports.append(audit_run(run, write=False)),
                     "step": lambda: [ada.step(t64, p64, generator, DEFAULT_ORDERS) for _ in range(steps)]}
        samples = interleaved(functions, pairs, 1)
    per_step = {name: [value / steps for value in values] for name, values in samples.items()}
    checks = {name: round(seconds / steps, 4) for name, seconds in reports[-1].check_seconds.items()}
    return {"form": "dpledger audit (every check, canary game included) of a synthetic paper-scale AdaPMixED trace",
            "steps": steps, "verdict": reports[-1].verdict, "threads": 1,
            "seconds_per_step": {name: summary(values, 4) for name, values in per_step.items()},
            "audit_over_step": ratios(per_step, "audit", "step"),
            "check_seconds_per_step": dict(sorted(checks.items(), key=lambda item: -item[1]))}


def _range(figure: dict, unit: float = 1.0, digits: int = 4) -> str:
    return (f"{figure['median'] * unit:.{digits}f} ({figure['min'] * unit:.{digits}f} to "
            f"{figure['max'] * unit:.{digits}f})")


def _speedup(figure: dict) -> str:
    return f"{figure['median']:.2f}x ({figure['min']:.2f}x to {figure['max']:.2f}x, {figure['pairs']} pairs)"


def markdown(results: dict) -> str:
    comparators = sorted({s["comparator_is"] for s in results["steps"].values()})
    lines = ["Comparator: " + "; ".join(comparators) + ".", "",
             "| per step, one thread | comparator | comparator s | dpledger s | speed-up (median, range over pairs) |",
             "|---|---|---|---|---|"]
    for key, section in results["steps"].items():
        scale = f"V={section['vocab']:,}, N={section['teachers']}"
        seconds = section["seconds_per_step"]
        theirs = seconds[section["comparator"]]
        who = "reference" if section["comparator"] == "reference" else "in-repo baseline"
        if key.startswith("adapmixed"):
            lines.append(f"| AdaPMixED step ({scale}; dpledger: {section['dpledger_orders']} orders, "
                         f"{' + '.join(section['dpledger_charged_components'])}) | {who} | {_range(theirs)} | "
                         f"{_range(seconds['dpledger'])} | {_speedup(section['speedup'])} |")
        else:
            lines.append(f"| PMixED step ({scale}) | {who} | {_range(theirs)} | {_range(seconds['dpledger_step'])} | "
                         f"{_speedup(section['speedup_step'])} |")
            lines.append(f"| PMixED decode step, pmixed_runner's process ({scale}) | {who} | {_range(theirs)} | "
                         f"{_range(seconds['dpledger_decode_step'])} | {_speedup(section['speedup_decode_step'])} |")
        if "in_repo_over_reference_time" in section:
            lines.append(f"| ... in-repo baseline's time over the reference's ({scale}) | | | | "
                         f"{_speedup(section['in_repo_over_reference_time'])} |")
    a = results["accountant"]
    lines += [f"| 100,000 per-step curves: RdpCurve objects, compose_curves, epsilon | | | "
              f"{a['seconds_rdpcurve_objects_composed_and_converted']} | |",
              f"| 100,000 per-step curves: ledger.charge_many, epsilon | | | {a['seconds_ledger_charge_many_and_convert']} | |"]
    for b in results.get("ablation", {}).values():
        lines.append(f"| audit ablation as an AdaPMixED trace is audited, 1,000 paper-scale steps ({b['threads']} "
                     f"thread(s), extrapolated from {b['steps_measured']}); its time over dpledger's step | | | "
                     f"{b['seconds_per_1000_steps']} | {_speedup(b['ablation_over_step'])} |")
    if "audit" in results:
        b = results["audit"]
        lines.append(f"| dpledger audit of a paper-scale AdaPMixED trace as it runs ({b['steps']} steps, every check); "
                     f"its time per step over dpledger's step | | | {_range(b['seconds_per_step']['audit'])} | "
                     f"{_speedup(b['audit_over_step'])} |")
    g = results["sub_grid"]
    lines += ["", f"Eq. 3 sub-grid at V={g['vocab']:,}, N={g['teachers']}: {g['exact_orders']} exact orders of "
              f"{g['grid_orders']}, curve / exact in [{g['min_ratio_to_exact']:.4f}, {g['max_ratio_to_exact']:.4f}], "
              f"run epsilon ratio {g['run_epsilon_ratio']}.",
              f"Load (1, 5, 15-minute averages) at the start: {results['load_start']['loadavg_1_5_15']}, "
              f"at the end: {results['load_end']['loadavg_1_5_15']} on {results['machine']['cores']} cores "
              f"({results['machine'].get('cpu', 'CPU not recorded')}, kernels at "
              f"{results['machine'].get('kernel_vector_bits', '?')}-bit vectors)."]
    lines += ["", "The distributed audit and decode against one plain process: benchmarks/results/distributed.json "
              "(bench_distributed.py; docs/distributed.md)."]
    return "\n".join(lines) + "\n"


# (name, kind, vocab, teachers, pairs, steps per sample); --quick: 3 pairs of 1 step
SECTIONS = (("adapmixed_paper", "adapmixed", 50257, 100, 5, 1),
            ("adapmixed_n8_full_vocab", "adapmixed", 50257, 8, 5, 3),
            ("adapmixed_demo", "adapmixed", 1024, 8, 7, 20),
            ("pmixed_paper", "pmixed", 50257, 100, 5, 1),
            ("pmixed_n8_full_vocab", "pmixed", 50257, 8, 5, 2),
            ("pmixed_demo", "pmixed", 1024, 8, 7, 10))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 pairs of one step each, no ablation (a smoke run)")
    parser.add_argument("--only", nargs="*", help="run only these step sections (names in SECTIONS)")
    parser.add_argument("--out", default=str(HERE / "results" / "step.json"))
    parser.add_argument("--markdown", default=str(HERE / "results.md"))
    parser.add_argument("--ablation-child", type=int, metavar="STEPS", help=argparse.SUPPRESS)
    parser.add_argument("--audit-only", action="store_true",
                        help="measure only the audit as it runs, into the existing results (the other sections kept)")
    parser.add_argument("--ablation-only", action="store_true",
                        help="measure only the ablation (1 and 2 threads), into the existing results (the others kept)")
    args = parser.parse_args()
    retain_freed_memory()
    if args.ablation_child:        # ablation_in_process's child: one JSON line
        print(json.dumps(ablation_section(args.ablation_child, int(_THREADS)), allow_nan=False))
        return
    torch.set_num_threads(1)
    if args.audit_only or args.ablation_only:
        kept = json.loads(Path(args.out).read_text())
        started = load()
        if args.audit_only:
            kept["audit"] = {**audit_section(), "load_start": started, "load_end": load()}
        else:
            kept["ablation"] = {"threads_1": {**ablation_section(steps=4, threads=1), "load_start": started},
                                "threads_2": {**ablation_in_process(steps=4, threads=2), "load_end": load()}}
        Path(args.out).write_text(json.dumps(kept, indent=2, allow_nan=False) + "\n")
        Path(args.markdown).write_text(markdown(kept))
        print(json.dumps(kept["audit" if args.audit_only else "ablation"], indent=2))
        return
    reference = load_reference()
    print(f"comparator: {'the reference from $DPLEDGER_REFERENCE' if reference else IN_REPO}", flush=True)
    results = {
        "benchmark": __doc__.split("\n\n")[0],
        "machine": {"processor": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "numba_threads": os.environ["NUMBA_NUM_THREADS"],
                    "omp_threads": os.environ["OMP_NUM_THREADS"], "python": platform.python_version(),
                    "torch": torch.__version__, **vector_unit()},
        "reference_folder": None if reference is None else str(reference.folder),
        "load_start": load(),
        "steps": {},
    }
    for name, kind, vocab, teachers, pairs, steps in SECTIONS:
        if args.only and name not in args.only:
            continue
        if args.quick:
            pairs, steps = 3, 1
        print(f"{name}: V={vocab}, N={teachers}, {pairs} pairs of {steps} step(s)", flush=True)
        section = adapmixed_section if kind == "adapmixed" else pmixed_section
        results["steps"][name] = section(reference, vocab, teachers, pairs, steps)
    results["sub_grid"] = sub_grid_section(50257, 100)
    results["accountant"] = accountant_section()
    if not args.quick:
        results["ablation"] = {"threads_1": ablation_section(steps=4, threads=1),
                               "threads_2": ablation_in_process(steps=4, threads=2)}
        results["audit"] = audit_section()
    results["load_end"] = load()
    Path(args.out).write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
    Path(args.markdown).write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
