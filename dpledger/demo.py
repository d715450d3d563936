"""The end-to-end demo on the embedded default (`make demo`).

Builds (or loads from the cache) the embedded corpus, tokenizer, public model and N teachers; then
evaluates the same teacher-forced queries with the public model alone, the non-private ensemble,
PMixED and AdaPMixED (and AdaPMixED's Table 2a ablations), and prints a Table-1-style summary
and AdaPMixED's Table-2b breakdown. Every number comes from the runs' ledger.json files.
"""
from __future__ import annotations

import math
import secrets
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from dpledger.decoding.config import BudgetConfig, DataConfig, ModelsConfig, RunConfig
from dpledger.decoding.run import run_decode
from dpledger.accounting.safe_files import write_atomic

DEMO_TEACHERS = 8
DEMO_QUERIES = 1024
PAPER_ADAPMIXED = dict(alpha=18.0, beta=0.2, lam=1e-4, sigma=1e-2, threshold=4.5, top_k=60)
PAPER_PMIXED = dict(alpha=6.0, beta=0.01)


def demo_methods() -> dict[str, dict]:
    """Method label -> [mechanism] table (paper parameters, Flemings et al. 2024, Tables 2 and 4).

    Returns:
        Method label -> the [mechanism] table of its run, in the order the demo runs them: the public
        model, the non-private ensemble, PMixED, AdaPMixED's Table 2a ablations, AdaPMixED, and
        PMixED with a budget (BUDGET_LABEL, run with DEMO_BUDGET).
    """
    return {
        "Public model": {"type": "public"},
        "Non-private ensemble": {"type": "ensemble"},
        "PMixED": {"type": "pmixed", **PAPER_PMIXED},
        "PMixED with noisy screening": {"type": "adapmixed", **PAPER_ADAPMIXED, **PAPER_PMIXED, "data_dependent": False},
        "AdaPMixED with only data-dependence": {"type": "adapmixed", **PAPER_ADAPMIXED, "screening": False},
        "AdaPMixED": {"type": "adapmixed", **PAPER_ADAPMIXED},
        BUDGET_LABEL: {"type": "pmixed", **PAPER_PMIXED},
    }


BUDGET_LABEL = "PMixED with a budget"
DEMO_BUDGET = BudgetConfig(epsilon=8.0, delta=1e-5)  # a Renyi filter: the public model answers once it is spent


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
    """A method label as a directory name: lower case, every character other than a letter or digit
    written "-", with no "-" at either end ("PMixED with a budget" -> "pmixed-with-a-budget").

    Args:
        label: the method label.

    Returns:
        The directory name.
    """
    return "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-")


def summary_row(label: str, directory: Path, summary: dict) -> dict:
    """One row of the demo's summary table, from a finished run's summary (ledger.json's numbers).

    Args:
        label: the method label.
        directory: the run's trace directory (its manifest's seed is read for the commitment).
        summary: the run's summary (`run_decode(...).summary`).

    Returns:
        {method, queries, epsilon and order at the first delta, data_dependent, perplexity,
        answered_by_public, trace, seed_commitment}: the secret seed is never in it, only its commitment.
    """
    from dpledger.decoding import trace
    from dpledger.mechanisms.randomness import seed_commitment

    first = summary["epsilon"][0]
    return {"method": label, "queries": summary["steps"], "epsilon": first["epsilon"], "order": first["order"],
            "data_dependent": summary["data_dependent"], "perplexity": summary["perplexity"],
            "answered_by_public": summary["answered_by_public"], "trace": str(directory),
            "seed_commitment": seed_commitment(trace.read_manifest(directory)["config"]["seed"])}


def run_demo(out: str | None = None, queries: int = DEMO_QUERIES, teachers: int = DEMO_TEACHERS,
             progress: bool = True) -> tuple[pd.DataFrame, dict, Path]:
    """The end-to-end demo (module docstring): every method of `demo_methods` on the same queries,
    the hot vs cold voting runs, the audit of the private runs and one HTML report, printing the
    summary tables as it goes. Finished runs under `out` are resumed, not rerun.

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
    started = time.time()
    root = Path(out) if out else Path("runs") / "demo" / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    rows, summaries = [], {}
    for label, mechanism in demo_methods().items():
        config = RunConfig(out=str(root / slug(label)), mechanism=mechanism, models=ModelsConfig(teachers=teachers),
                           queries=queries, seed=demo_seed(root / slug(label)), replay_payload=True, deltas=(1e-5,),
                           budget=DEMO_BUDGET if label == BUDGET_LABEL else None)
        result = run_decode(config, resume=True, progress=progress)
        summaries[label] = result.summary
        rows.append(summary_row(label, result.directory, result.summary))
    table = pd.DataFrame(rows)
    print(f"\n== Table 1 / 2a: {queries} teacher-forced queries on held-out private dialogues, N={teachers}, "
          f"delta=1e-5 ({time.time() - started:.0f} s) ==")
    shown = table.assign(epsilon=[_eps(r) for r in rows]).drop(columns=["trace", "data_dependent", "seed_commitment"])
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("  * data-dependent loss measured on the private data: not a released DP guarantee (Papernot et al. 2018, Section 3)")
    print("  PMixED: Theorem 3.1 as claimed (not proven for the paper's ball: docs/soundness.md); inf = no privacy guarantee")
    breakdown = summaries["AdaPMixED"]["breakdown"]
    print(f"\n== Table 2b: AdaPMixED privacy-loss breakdown at order {breakdown['order']:g}, "
          f"{breakdown['method']} conversion, delta={breakdown['delta']:g} ==")
    print(pd.DataFrame(breakdown["rows"]).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    budget = summaries[BUDGET_LABEL]["budget"]
    print(f"\n== {BUDGET_LABEL}: epsilon {budget['epsilon']:g} at delta {budget['delta']:g}, a Renyi filter at order "
          f"{budget['order']:g} ==\n  {budget['private_answers']} queries answered privately, then "
          f"{budget['refused_steps']} by the public model at no cost; "
          f"epsilon spent {summaries[BUDGET_LABEL]['epsilon'][0]['epsilon']:.3f}")
    voting_rows = run_voting_demo(root, progress)
    rows += voting_rows
    print("\ntraces (each run seed is secret and random; shown by its commitment):")
    for row in rows:
        print(f"  {row['method']:<38} {row['trace']}  seed {row['seed_commitment']}")
    from dpledger.reports.hotpate import hotpate_html, hotpate_markdown, run_hotpate, write_hotpate

    print(f"\n== Hot vs cold PATE: N = {HOTPATE_TEACHERS} in-context teachers (dpledger hotpate, short) ==")
    hotpate = run_hotpate(HOTPATE_TEACHERS, queries=32, samples=100, verbose=False)
    write_hotpate(hotpate, root / "hotpate")
    print(hotpate_markdown(hotpate))
    audit_and_report(root, [Path(row["trace"]) for row in rows], extra_html=hotpate_html(hotpate))
    return table, summaries, root


HOTPATE_TEACHERS = 64
VOTING_QUERIES = 128
VOTING_DEMO = {"threshold": 32.0, "sigma": 8.0, "sigma_threshold": 8.0}


def run_voting_demo(root: Path, progress: bool) -> list[dict]:
    """Hot and cold DPARGMAX (Confident-GNMax) decoding with 64 in-context teachers: the same
    queries, the same noise; hot votes pass the threshold far more often.

    Args:
        root: the demo's output directory; each run's trace goes to root/<slug of its label>.
        progress: whether each run shows a progress bar.

    Returns:
        The summary rows of the hot and the cold run (`summary_row`).
    """
    rows = []
    print(f"\n== Hot PATE decoding: {VOTING_QUERIES} teacher-forced queries, N={HOTPATE_TEACHERS} in-context "
          f"teachers, DPARGMAX T={VOTING_DEMO['threshold']:g}, s1=s2={VOTING_DEMO['sigma']:g} ==")
    for votes in ("coordinated", "independent"):
        label = f"{'Hot' if votes == 'coordinated' else 'Cold'} PATE DPARGMAX"
        mechanism = {"type": "voting", "votes": votes, "aggregator": "dpargmax", **VOTING_DEMO}
        config = RunConfig(out=str(root / slug(label)), mechanism=mechanism,
                           models=ModelsConfig(teachers=HOTPATE_TEACHERS, teacher_kind="icl"),
                           data=DataConfig(block_size=64), queries=VOTING_QUERIES,
                           seed=demo_seed(root / slug(label)), replay_payload=True,
                           deltas=(1e-5,))
        result = run_decode(config, resume=True, progress=progress)
        voting = result.summary["voting"]
        print(f"  {label:<22} yield {voting['yield']:.3f}, token accuracy {voting['token_accuracy']:.3f}, "
              f"epsilon {result.summary['epsilon'][0]['epsilon']:.3f}")
        rows.append(summary_row(label, result.directory, result.summary))
    return rows


AUDITED = ("pmixed", "adapmixed", "pmixed-with-a-budget", "hot-pate-dpargmax", "cold-pate-dpargmax")


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
                     for row in bracket["rows"])


def _eps(row: dict) -> str:
    if math.isinf(row["epsilon"]):
        return "inf"
    return f"{row['epsilon']:.3f}" + ("*" if row["data_dependent"] else "")
