"""Tables: Table 2b (breakdown), Table 2a (method comparison), Table 1 (queries, epsilon, perplexity),
the audit's per-teacher leakage. Values are copied from ledger.json / audit.json, never recomputed."""
from __future__ import annotations

import pandas as pd

from accounting.errors import require
from accounting.relation import DivergenceDirection
from reports.run_data import RunData


def breakdown_table(run: RunData) -> pd.DataFrame:
    """Table 2b: each component's RDP at the chosen order, the conversion term, the total.

    Raises ValueError if the rows do not sum to the total (the report must never show that)."""
    breakdown = run.ledger["breakdown"]
    rows = breakdown["rows"]
    frame = pd.DataFrame([{"component": r["component"], "epsilon": r["epsilon"],
                           "data_dependent": r["data_dependent"], "direction": direction_label(r.get("direction"))}
                          for r in rows])
    total = rows[-1]["epsilon"]
    parts = sum(r["epsilon"] for r in rows[:-1])
    require(total == float("inf") or abs(parts - total) <= 1e-9 * max(1.0, abs(total)),
            f"breakdown rows of {run.directory} sum to {parts!r}, not the total {total!r}")
    return frame


def direction_label(direction: str | None) -> str:
    """How a table names the divergence direction(s) a row bounds (records before it existed: both);
    ValueError for a value that names no direction."""
    covers = DivergenceDirection(direction or DivergenceDirection.BOTH.value)
    return "both" if covers is DivergenceDirection.BOTH else "D(M(D)||M(D')) only"


def relation_label(run: RunData) -> str:
    """The relation the charged total covers ("remove-one", ...); a ledger that predates the field
    holds the run's claim only."""
    return str(run.ledger.get("relation", run.manifest["relation"])).replace("_", "-")


def audit_headline(run: RunData) -> str:
    """The audit's verdict with the relation it is for and every other relation tested."""
    if run.stale_audit:
        return f"STALE audit, not shown: {run.stale_audit}"
    if not run.audit:
        return "not audited"
    return run.audit.get("headline", run.audit["verdict"])


def comparison_table(runs: list[RunData]) -> pd.DataFrame:
    """Table 2a / Table 1: method, queries, epsilon at delta (improved), order, perplexity,
    queries answered by the public model, whether epsilon is data-dependent, the neighbouring relation
    the charged total covers, and the audit's headline (its verdict for the claimed relation and
    every other relation it tested)."""
    rows = []
    for run in runs:
        epsilon = run.epsilon()
        rows.append({"method": run.label, "queries": run.ledger["steps"], "epsilon": epsilon["epsilon"],
                     "delta": epsilon["delta"], "order": epsilon["order"], "data_dependent": run.data_dependent,
                     "direction": direction_label(run.ledger.get("direction")),
                     "relation": relation_label(run),
                     "perplexity": run.ledger["perplexity"], "answered_by_public": run.ledger["answered_by_public"],
                     "audit": audit_headline(run)})
        for delta in run.manifest["config"]["deltas"][1:]:  # every requested delta, not only the first
            entry = next((e for e in run.ledger["epsilon"] if e.get("method") == "improved" and e.get("delta") == delta),
                         None)
            rows[-1][f"epsilon at delta={delta:g}"] = None if entry is None else entry["epsilon"]
        if any("voting" in r.ledger for r in runs):  # voting releases point masses: yield and accuracy, not perplexity
            voting = run.ledger.get("voting") or {}
            rows[-1].update({"yield": voting.get("yield"), "token_accuracy": voting.get("token_accuracy")})
    # object dtype keeps a missing value (e.g. no order for epsilon = 0) None: a float column would
    # turn it into NaN, which the renderers refuse
    columns = list(dict.fromkeys(key for row in rows for key in row))  # a run without a column shows it missing
    return pd.DataFrame([{key: row.get(key) for key in columns} for row in rows], dtype=object)


def leakage_table(run: RunData) -> pd.DataFrame | None:
    """The audit's per-neighbour empirical epsilon (None when the run has no ablation)."""
    if not run.audit:
        return None
    ablation = next((c for c in run.audit["checks"] if c["name"] == "neighbour_ablation"), None)
    if not ablation or "per_neighbour" not in ablation["evidence"]:
        return None
    return pd.DataFrame(ablation["evidence"]["per_neighbour"])


def checks_table(run: RunData) -> pd.DataFrame | None:
    if not run.audit:
        return None
    return pd.DataFrame([{"check": c["name"], "status": c["status"], "evidence": c["detail"]}
                         for c in run.audit["checks"]])
