"""The end-to-end demo on the embedded default (`make demo`), every private run on one stated budget.

Builds (or loads from the cache) the embedded corpus, tokenizer, public model and N teachers; then
evaluates the same teacher-forced queries with the public model alone, the non-private ensemble and
the private mechanisms, each calibrated to DEMO_TARGET (epsilon 8 at delta 1e-5 over the demo's
query count) so that their rows are comparable: PMixED with each Renyi ball (beta from
`calibrate_pmixed_order`), and AdaPMixED with its Table 2a ablations inside a privacy filter of the
same budget. It prints a Table-1-style summary, AdaPMixED's Table-2b breakdown, hot and cold PATE on
the same budget, the audit of the private runs, one HTML report and, last, a small privacy-utility
frontier. Every number comes from the runs' ledger.json files.
"""
from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from dpledger.decoding.config import BudgetConfig, DataConfig, ModelsConfig, RunConfig
from dpledger.decoding.run import run_decode
from dpledger.accounting.safe_files import write_atomic

DEMO_TEACHERS = 8
DEMO_QUERIES = 1024
DEMO_TARGET = BudgetConfig(epsilon=8.0, delta=1e-5)
"""The one budget every private run of the demo is calibrated to: (epsilon, delta) = (8, 1e-5) over the
demo's query count."""
PAPER_ADAPMIXED = dict(alpha=18.0, beta=0.2, lam=1e-4, sigma=1e-2, threshold=4.5, top_k=60)
"""AdaPMixED's parameters in Flemings et al. 2024, Table 4 (the demo keeps the screen's and takes
alpha and beta from the budget)."""
PAPER_PMIXED = dict(alpha=6.0, beta=0.01)
"""PMixED's parameters in Flemings et al. 2024, Table 2 (used by tests and examples; the demo
calibrates beta)."""
SCREEN = {key: PAPER_ADAPMIXED[key] for key in ("lam", "sigma", "threshold", "top_k")}


@dataclass(frozen=True)
class DemoMethod:
    """One row of the demo: its [mechanism] table, its privacy filter (None: none) and what its epsilon is."""

    mechanism: dict
    budget: BudgetConfig | None
    basis: str


def demo_methods(queries: int = DEMO_QUERIES, teachers: int = DEMO_TEACHERS,
                 target: BudgetConfig = DEMO_TARGET) -> dict[str, DemoMethod]:
    """Method label -> DemoMethod, every private one calibrated to `target` over `queries` queries.

    PMixED with each ball takes the order and beta that `calibrate_pmixed_order` finds for the
    target (the largest beta; Flemings et al. 2024, Theorem 3.1 with Lemma C.1, converted by Balle
    et al. 2020, Theorem 21): the paper's ball as claimed, the proof-orders and all-orders balls
    proven (docs/soundness.md). AdaPMixED and its ablations (Flemings et al. 2024, Table 2a) use the
    proof-orders ball at the same order and beta with the paper's screen, inside a privacy filter of
    the target (Feldman & Zrnic 2021, Theorem 3.1): the filter's (epsilon, delta) is their guarantee,
    and their data-dependent loss is printed beside it, labelled.

    Args:
        queries: teacher-forced queries per run (>= 1).
        teachers: the ensemble size N.
        target: the (epsilon, delta) every private run is calibrated to.

    Returns:
        Method label -> DemoMethod, in the order the demo runs them.

    Raises:
        ValueError: if the target is out of reach for a mechanism, or a parameter is out of range.
    """
    from dpledger.mechanisms import PMixED
    from dpledger.mechanisms.calibration import calibrate_pmixed_order

    methods = {"Public model": DemoMethod({"type": "public"}, None, "no private data"),
               "Non-private ensemble": DemoMethod({"type": "ensemble"}, None, "no guarantee")}
    calibrated = {}
    for ball, label in (("projection-order", "paper's ball"), ("proof-orders", "proof-orders ball"),
                        ("all-orders", "all-orders ball")):
        result = calibrate_pmixed_order(target.epsilon, target.delta, queries, teachers, ball=ball)
        calibrated[ball] = {"alpha": result.mechanism.alpha if isinstance(result.mechanism, PMixED) else math.nan,
                            "beta": result.value}
        methods[f"PMixED, {label}"] = DemoMethod(
            {"type": "pmixed", **calibrated[ball], "ball": ball}, None,
            "as claimed (Theorem 3.1 unproven for this ball)" if ball == "projection-order" else "proven")
    sound = {**calibrated["proof-orders"], "ball": "proof-orders", **SCREEN}
    for label, extra in (("PMixED with noisy screening", {"data_dependent": False}),
                         ("AdaPMixED with only data-dependence", {"screening": False}),
                         ("AdaPMixED", {})):
        methods[label] = DemoMethod({"type": "adapmixed", **sound, **extra}, target, "proven, by the filter")
    return methods


def demo_seed(directory: Path) -> int:
    """A secret random run seed (secrets.randbits(63)), or the one an unfinished run in `directory`
    recorded, so that the demo resumes it. Never printed: outputs show its commitment.

    Args:
        directory: the run's trace directory (it need not exist).

    Returns:
        The seed, an integer in [0, 2^63).

    Raises:
        dpledger.decoding.trace.TraceError: (a ValueError) if `directory` has a manifest that cannot be read.
    """
    from dpledger.decoding import trace

    if (directory / trace.MANIFEST).exists():
        return int(trace.read_manifest(directory)["config"]["seed"])
    return secrets.randbits(63)


def slug(label: str) -> str:
    """A method label as a directory name: lower case, each run of characters other than letters and
    digits written "-", with no "-" at either end ("PMixED, paper's ball" -> "pmixed-paper-s-ball").

    Args:
        label: the method label.

    Returns:
        The directory name.
    """
    return "-".join("".join(c if c.isalnum() else " " for c in label.lower()).split())


def summary_row(label: str, directory: Path, summary: dict, basis: str = "") -> dict:
    """One row of the demo's summary table, from a finished run's summary (ledger.json's numbers).

    Args:
        label: the method label.
        directory: the run's trace directory (its manifest's seed is read for the commitment).
        summary: the run's summary (`run_decode(...).summary`).
        basis: what the run's guarantee rests on (DemoMethod.basis).

    Returns:
        {method, queries, guarantee (the (epsilon, delta) statement at the first delta: the privacy
        filter's epsilon for a run with one, else the ledger's data-independent epsilon; +inf for a
        data-dependent run without a filter), basis, epsilon and order (the ledger's at the first
        delta), data_dependent, perplexity, answered_by_public, trace, seed_commitment}: the secret
        seed is never in it, only its commitment.
    """
    from dpledger.decoding import trace
    from dpledger.mechanisms.randomness import seed_commitment

    first = summary["epsilon"][0]
    budget = summary.get("budget")
    guarantee = (budget["epsilon"] if budget else math.inf if summary["data_dependent"] else first["epsilon"])
    return {"method": label, "queries": summary["steps"], "guarantee": guarantee, "basis": basis,
            "epsilon": first["epsilon"], "order": first["order"], "data_dependent": summary["data_dependent"],
            "perplexity": summary["perplexity"], "answered_by_public": summary["answered_by_public"],
            "trace": str(directory),
            "seed_commitment": seed_commitment(trace.read_manifest(directory)["config"]["seed"])}


def run_demo(out: str | None = None, queries: int = DEMO_QUERIES, teachers: int = DEMO_TEACHERS,
             progress: bool = True) -> tuple[pd.DataFrame, dict, Path]:
    """The end-to-end demo (module docstring): every method of `demo_methods` on the same queries and
    the same budget, the hot vs cold voting runs on that budget, the audit of the private runs, one
    HTML report and a small frontier, printing the summary tables as it goes. Finished runs under
    `out` are resumed, not rerun.

    Args:
        out: the output directory (default runs/demo/<UTC time>).
        queries: teacher-forced queries per run (>= 1).
        teachers: the embedded default's ensemble size N.
        progress: whether each run shows a progress bar.

    Returns:
        (the summary table, one row per method, without the voting runs; method label -> its run's
        summary; the output directory).

    Raises:
        ValueError: if a run's configuration is invalid (e.g. `queries` or `teachers` out of range).
    """
    from dpledger.mechanisms.warmup import finish_background_warmup, start_background_warmup

    methods = demo_methods(queries, teachers)   # (its checks first: bad input starts nothing)
    # a first run trains the embedded models on one thread: the kernels compile on another core meanwhile
    warmup = start_background_warmup()
    try:
        table, summaries, root = _demo_runs(out, methods, queries, teachers, progress)
    finally:
        finish_background_warmup(warmup)
    return table, summaries, root


def _demo_runs(out: str | None, methods: dict[str, DemoMethod], queries: int, teachers: int,
               progress: bool) -> tuple[pd.DataFrame, dict, Path]:
    """run_demo's runs, tables, audit and report."""
    started = time.time()
    root = Path(out) if out else Path("runs") / "demo" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    rows, summaries = [], {}
    for label, method in methods.items():
        config = RunConfig(out=str(root / slug(label)), mechanism=method.mechanism,
                           models=ModelsConfig(teachers=teachers), queries=queries, seed=demo_seed(root / slug(label)),
                           replay_payload=True, deltas=(DEMO_TARGET.delta,), budget=method.budget)
        result = run_decode(config, resume=True, progress=progress)
        summaries[label] = result.summary
        rows.append(summary_row(label, result.directory, result.summary, method.basis))
    table = pd.DataFrame(rows)
    print(f"\n== Table 1 / 2a on one budget: every private run calibrated to epsilon {DEMO_TARGET.epsilon:g} at delta "
          f"{DEMO_TARGET.delta:g} over {queries} teacher-forced queries on held-out private dialogues, N={teachers} "
          f"({time.time() - started:.0f} s) ==")
    shown = pd.DataFrame({
        "method": table["method"], "guarantee": [_eps(r["guarantee"]) for r in rows], "basis": table["basis"],
        "alpha": [m.mechanism.get("alpha", math.nan) for m in methods.values()],
        "beta": [m.mechanism.get("beta", math.nan) for m in methods.values()],
        "data-dependent eps*": [_eps(r["epsilon"]) + "*" if r["data_dependent"] else "" for r in rows],
        "perplexity": table["perplexity"], "answered_by_public": table["answered_by_public"]})
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep=""))
    print(f"  guarantee: (epsilon, delta = {DEMO_TARGET.delta:g}) of the whole run; a filtered run's is its filter's "
          "budget (Feldman & Zrnic 2021, Theorem 3.1), resting on Theorem 3.1 for its ball; inf = no guarantee")
    print("  * data-dependent loss measured on the private data: not a released DP guarantee (Papernot et al. 2018, "
          "Section 3); AdaPMixED's filter charges Theorem 3.1, not this")
    print("  PMixED, paper's ball: Theorem 3.1 as claimed (not proven for the paper's one-order ball: docs/soundness.md)")
    breakdown = summaries["AdaPMixED"]["breakdown"]
    print(f"\n== Table 2b: AdaPMixED data-dependent privacy-loss breakdown at order {breakdown['order']:g}, "
          f"{breakdown['method']} conversion, delta={breakdown['delta']:g} ==")
    print(pd.DataFrame(breakdown["rows"]).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    budget = summaries["AdaPMixED"]["budget"]
    print(f"  AdaPMixED's filter: epsilon {budget['epsilon']:g} at delta {budget['delta']:g}, a Renyi filter at order "
          f"{budget['order']:g}: {budget['private_answers']} queries answered privately, "
          f"{budget['refused_steps']} by the public model at no cost")
    voting_rows = run_voting_demo(root, progress)
    rows += voting_rows
    print("\ntraces (each run seed is secret and random; shown by its commitment):")
    for row in rows:
        print(f"  {row['method']:<38} {row['trace']}  seed {row['seed_commitment']}")
    from dpledger.reports.hotpate import hotpate_html, hotpate_markdown, run_hotpate, write_hotpate

    print(f"\n== Hot vs cold PATE: N = {HOTPATE_TEACHERS} in-context teachers (dpledger hotpate, short) ==")
    # short: 16 queries, 60 rounds, T/N = 0.1, ..., 1 and three epsilons (about 40 s; dpledger hotpate runs the full grid)
    hotpate = run_hotpate(HOTPATE_TEACHERS, queries=16, samples=60, verbose=False, epsilons=(1.0, 4.0, 16.0),
                          thresholds=[round(HOTPATE_TEACHERS * k / 10) for k in range(1, 11)])
    write_hotpate(hotpate, root / "hotpate")
    print(hotpate_markdown(hotpate))
    frontier_html = run_small_frontier(root, teachers, progress)
    audit_and_report(root, [Path(row["trace"]) for row in rows], extra_html=hotpate_html(hotpate) + frontier_html)
    return table, summaries, root


DEMO_FRONTIER_BUDGETS = ((2.0, 1e-5), (8.0, 1e-5))
DEMO_FRONTIER_QUERIES = 256
DEMO_FRONTIER_VARIANTS = ("public", "ensemble", "pmixed-projection-order", "pmixed-proof-orders", "pmixed-all-orders")
"""The demo's small frontier: PMixED's three balls between the anchors at two budgets over 256 queries
(`dpledger frontier` runs every variant at four)."""


def run_small_frontier(root: Path, teachers: int, progress: bool) -> str:
    """A small privacy-utility frontier (dpledger.reports.frontier.run_frontier, unaudited: the demo
    audits its own runs) under root/frontier, printed, and returned as the report's HTML section.

    Args:
        root: the demo's output directory.
        teachers: the ensemble size N.
        progress: whether a progress bar runs over the frontier's runs.

    Returns:
        The frontier's HTML section (frontier_html).

    Raises:
        ValueError: if the frontier's settings are invalid or its directory holds another frontier.
    """
    from dpledger.reports.frontier import best_by_budget, best_lines, compact_table, frontier_html, run_frontier

    budgets = ", ".join(f"epsilon {e:g}" for e, _ in DEMO_FRONTIER_BUDGETS)
    print(f"\n== A small privacy-utility frontier: PMixED's three balls at {budgets} (delta "
          f"{DEMO_FRONTIER_BUDGETS[0][1]:g}) over {DEMO_FRONTIER_QUERIES} queries, each calibrated before it runs "
          f"(dpledger frontier runs every mechanism at four budgets) ==")
    frame = run_frontier(root / "frontier", DEMO_FRONTIER_BUDGETS, DEMO_FRONTIER_QUERIES, teachers,
                         DEMO_FRONTIER_VARIANTS, audit=False, progress=progress, verbose=False)
    shown = compact_table(frame).drop(columns=["audit"], errors="ignore")
    print(shown.astype(object).where(shown.notna(), "").to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    best = best_by_budget(frame)
    for line in best_lines(best):
        print(f"  {line}")
    print(f"  table, figure and LaTeX: {root / 'frontier'}/frontier.{{csv,png,tex,html}}")
    return frontier_html(frame, best=best)


HOTPATE_TEACHERS = 64
VOTING_QUERIES = 128
VOTING_THRESHOLD = 32.0
"""DPARGMAX's threshold T = N/2: a token passes when about half the teachers vote for it."""


def voting_noise(target: BudgetConfig = DEMO_TARGET, queries: int = VOTING_QUERIES) -> float:
    """DPARGMAX's noise s1 = s2 calibrated to `target` over `queries` queries under the runs' claimed
    relation, add-or-remove-one (calibrate_confident_gnmax: Papernot et al. 2018, Algorithm 1 and
    Proposition 8, released-output accounting).

    Args:
        target: the (epsilon, delta) of the whole run.
        queries: the number of queries.

    Returns:
        The smallest s2 (= s1) whose run accounts to at most the target.
    """
    from dpledger.mechanisms.calibration import calibrate_confident_gnmax

    return calibrate_confident_gnmax(target.epsilon, target.delta, queries, threshold=VOTING_THRESHOLD,
                                     relation="add_or_remove_one").value


def run_voting_demo(root: Path, progress: bool) -> list[dict]:
    """Hot and cold DPARGMAX (Confident-GNMax) decoding with 64 in-context teachers: the same
    queries, the same noise, calibrated to DEMO_TARGET; hot votes pass the threshold far more often.

    Args:
        root: the demo's output directory; each run's trace goes to root/<slug of its label>.
        progress: whether each run shows a progress bar.

    Returns:
        The summary rows of the hot and the cold run (`summary_row`).
    """
    rows = []
    sigma = voting_noise()
    print(f"\n== Hot PATE decoding: {VOTING_QUERIES} teacher-forced queries, N={HOTPATE_TEACHERS} in-context "
          f"teachers, DPARGMAX T={VOTING_THRESHOLD:g}, s1=s2={sigma:.4g} (calibrated to epsilon "
          f"{DEMO_TARGET.epsilon:g} at delta {DEMO_TARGET.delta:g}) ==")
    for votes in ("coordinated", "independent"):
        label = f"{'Hot' if votes == 'coordinated' else 'Cold'} PATE DPARGMAX"
        mechanism = {"type": "voting", "votes": votes, "aggregator": "dpargmax", "threshold": VOTING_THRESHOLD,
                     "sigma": sigma, "sigma_threshold": sigma}
        config = RunConfig(out=str(root / slug(label)), mechanism=mechanism,
                           models=ModelsConfig(teachers=HOTPATE_TEACHERS, teacher_kind="icl"),
                           data=DataConfig(block_size=64), queries=VOTING_QUERIES,
                           seed=demo_seed(root / slug(label)), replay_payload=True,
                           deltas=(DEMO_TARGET.delta,))
        result = run_decode(config, resume=True, progress=progress)
        voting = result.summary["voting"]
        print(f"  {label:<22} yield {voting['yield']:.3f}, token accuracy {voting['token_accuracy']:.3f}, "
              f"epsilon {result.summary['epsilon'][0]['epsilon']:.3f}")
        rows.append(summary_row(label, result.directory, result.summary, "proven"))
    return rows


AUDITED = ("pmixed-proof-orders-ball", "adapmixed", "hot-pate-dpargmax")
"""The runs the demo audits: the proven PMixED, AdaPMixED and hot PATE (the others are in the report
unaudited; `dpledger audit DIR` audits any of them)."""


def audit_and_report(root: Path, directories: list[Path], extra_html: str = "") -> Path:
    """Audit the PMixED, AdaPMixED and voting traces, then write one HTML report of every run
    (with `extra_html`, e.g. the hot-vs-cold section, before its end).

    Args:
        root: the demo's output directory; the report is root/report.html.
        directories: every run's trace directory, in the report's order; those named in AUDITED are audited.
        extra_html: HTML inserted before the report's closing tags.

    Returns:
        The path of the report written.

    Raises:
        ValueError: if a run cannot be read or its report has a NaN value.
    """
    from dpledger.audit import audit_run
    from dpledger.reports import load_run, render

    print("\n== Audit (dpledger audit) ==")
    for directory in directories:
        if directory.name not in AUDITED:
            continue
        started = time.time()
        report = audit_run(directory, mc_samples=200, game_trials=600)
        ablation = report.check("neighbour_ablation").evidence
        game = next(c for c in report.checks if c.name in ("canary_game", "sampled_aggregator"))
        game_text = (f"{game.name.replace('_', ' ')} lower bound {game.evidence['epsilon_lower_bound']:.3f}"
                     if game.evidence else game.detail)
        print(f"  {directory.name:<10} {report.verdict}: {_bracket_text(report)}; {time.time() - started:.0f} s")
        print(f"      tested neighbours' RDP empirical/claimed = {ablation['ratio']:.3f} (worst: "
              f"{ablation['worst_neighbour']}); {game_text}")
        per_teacher = ablation.get("per_teacher") or {}
        if per_teacher.get("epsilon") is not None:
            print(f"      per-teacher data-dependent epsilon {per_teacher['epsilon']:.4g} vs "
                  f"{per_teacher['composed_max_epsilon']:.4g} composing the per-step maximum")
        for finding in report.findings:
            if finding.applies and finding.severity in ("medium", "high"):
                print(f"      pitfall #{finding.pitfall} [{finding.severity}] {finding.title}")

    out = root / "report.html"
    write_atomic(out, render([load_run(d) for d in directories], "html").replace(
        "</body></html>", extra_html + "</body></html>").encode())
    print(f"\nHTML report: {out}")
    return out


def _bracket_text(report) -> str:
    """"epsilon(delta) in [certified lower bound, claim] (ratio)" for each delta, or why there is none."""
    bracket = report.bracket
    if bracket is None:
        check = next((c for c in report.checks if c.name == "epsilon_bracket"), None)
        return "no bracket" + (f" ({check.detail})" if check is not None else "")
    return "; ".join(f"epsilon({row['delta']:g}) in [{row['lower']:.4g}, {row['upper']:.4g}], ratio {row['ratio']:.3g}"
                     + (" (upper: the filter's budget)" if row.get("claimed_by") == "the privacy filter's budget" else "")
                     for row in bracket["rows"])


def _eps(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3f}"
