"""Tables: Table 2b (breakdown), Table 2a (method comparison), Table 1 (queries, epsilon, perplexity),
the audit's per-teacher leakage. Values are copied from ledger.json / audit.json, never recomputed."""
from __future__ import annotations

import pandas as pd

from dpledger.accounting.errors import require
from dpledger.accounting.relation import DivergenceDirection
from dpledger.mechanisms.aggregators import aggregators
from dpledger.reports.run_data import RunData


def breakdown_table(run: RunData) -> pd.DataFrame:
    """Table 2b: each component's RDP at the chosen order, the conversion term, the total
    (`frame.attrs["reasons"]`: why a row is +inf).

    Raises ValueError if the rows do not sum to the total (the report must never show that).

    Args:
        run: the run whose ledger.json breakdown is tabulated.

    Returns:
        One row per breakdown component (the last the total) with columns component, epsilon (nats),
        data_dependent and direction; `frame.attrs["reasons"]` holds one {column: reason} per row.

    Raises:
        ValueError: if the component rows do not sum to a finite total (relative tolerance 1e-9).
    """
    breakdown = run.ledger["breakdown"]
    rows = breakdown["rows"]
    frame = pd.DataFrame([{"component": r["component"], "epsilon": r["epsilon"],
                           "data_dependent": r["data_dependent"], "direction": direction_label(r.get("direction"))}
                          for r in rows])
    total = rows[-1]["epsilon"]
    parts = sum(r["epsilon"] for r in rows[:-1])
    require(total == float("inf") or abs(parts - total) <= 1e-9 * max(1.0, abs(total)),
            f"breakdown rows of {run.directory} sum to {parts!r}, not the total {total!r}")
    frame.attrs["reasons"] = [{"epsilon": no_guarantee_reason(run)} if r["epsilon"] == float("inf") else {}
                              for r in rows]
    return frame


def direction_label(direction: str | None) -> str:
    """How a table names the divergence direction(s) a row bounds (records before it existed: both);
    ValueError for a value that names no direction.

    Args:
        direction: a DivergenceDirection value ("both", ...) or None (a record made before the field).

    Returns:
        "both", or "D(M(D)||M(D')) only" for a one-direction bound.

    Raises:
        ValueError: if `direction` is not a DivergenceDirection value.
    """
    covers = DivergenceDirection(direction or DivergenceDirection.BOTH.value)
    return "both" if covers is DivergenceDirection.BOTH else "D(M(D)||M(D')) only"


def relation_label(run: RunData) -> str:
    """The relation the charged total covers ("remove-one", ...); a ledger that predates the field
    holds the run's claim only.

    Args:
        run: the run whose ledger.json (or, failing that, manifest) names the relation.

    Returns:
        The neighbouring relation's value with "_" written as "-".
    """
    return str(run.ledger.get("relation", run.manifest["relation"])).replace("_", "-")


def audit_headline(run: RunData) -> str:
    """The audit's verdict with the relation it is for and every other relation tested.

    Args:
        run: the run whose audit.json is summarised.

    Returns:
        The audit's headline (its verdict when the audit has no headline), "not audited", or the
        withheld audit's label and why it is not shown.
    """
    if run.stale_audit:
        return f"{run.audit_withheld} audit, not shown: {run.stale_audit}"
    if not run.audit:
        return "not audited"
    return run.audit.get("headline", run.audit["verdict"])


def epsilon_column(delta: float) -> str:
    """The comparison table's column of the improved epsilon at `delta`: "epsilon@1e-05".

    Args:
        delta: the delta of the column, in (0, 1).

    Returns:
        The column name, "epsilon@" followed by `delta` in %g format.
    """
    return f"epsilon@{delta:g}"


def lower_bound_column(delta: float) -> str:
    """The comparison table's column of the audit's certified lower bound at `delta`: "lower@1e-05".

    Args:
        delta: the delta of the column, in (0, 1).

    Returns:
        The column name, "lower@" followed by `delta` in %g format.
    """
    return f"lower@{delta:g}"


def certified_lower_bound(run: RunData, delta: float) -> tuple[float | None, str | None]:
    """(the audit's certified lower bound on epsilon(delta) for the claimed relation, None) or
    (None, why there is none): the epsilon_bracket check of a current audit (dpledger.audit.bracket).

    Args:
        run: the run whose current audit.json is read.
        delta: the delta at which the bracket's lower bound is wanted (matched exactly).

    Returns:
        (lower bound on epsilon at `delta`, None), or (None, a reason in a few words) when the run is
        not audited, its audit is withheld, has no bracket, skipped it, or bracketed other deltas.
    """
    if run.audit is None:
        return None, "not audited" if not run.stale_audit else f"{run.audit_withheld} audit, not shown"
    bracket = next((c for c in run.audit.get("checks", []) if c.get("name") == "epsilon_bracket"), None)
    if bracket is None:
        return None, "this audit has no epsilon bracket (made by an older dpledger)"
    if bracket.get("status") == "SKIPPED":
        return None, f"no certified lower bound: {bracket.get('detail')}"
    row = next((r for r in bracket.get("evidence", {}).get("rows", []) if r.get("delta") == delta), None)
    if row is None:
        return None, "the audit bracketed other deltas"
    return row.get("lower"), None


def order_column(delta: float) -> str:
    """The comparison table's column of the optimal Renyi order at `delta`: "order@1e-05".

    Args:
        delta: the delta of the column, in (0, 1).

    Returns:
        The column name, "order@" followed by `delta` in %g format.
    """
    return f"order@{delta:g}"


def no_guarantee_reason(run: RunData) -> str:
    """Why the run's epsilon is +inf, in a few words.

    Args:
        run: a run whose epsilon is +inf (its manifest's mechanism and ledger.json's voting record are read).

    Returns:
        A one-line reason: a non-private ensemble, a T-threshold-private aggregator (Cohen et al.
        2023), or a composed RDP curve that is +inf at every order.
    """
    kind = run.manifest["mechanism"]["type"]
    if kind == "ensemble":
        return "no guarantee: the non-private ensemble reads the teachers directly"
    voting = run.ledger.get("voting") or {}
    if voting.get("threshold_private"):
        known = aggregators()
        name = known[voting["aggregator"]].title if voting.get("aggregator") in known else "the aggregator"
        return f"no DP guarantee: {name} gives T-threshold privacy only, a robustness notion (Cohen et al. 2023)"
    return "no guarantee: the composed RDP curve is +inf at every order"


def missing_order_reason(run: RunData, epsilon: float) -> str:
    """Why the run has no optimal Renyi order: epsilon is 0 at every order, or +inf at every order.

    Args:
        run: the run (read for the +inf reason, `no_guarantee_reason`).
        epsilon: the run's epsilon at its first delta: 0 or +inf.

    Returns:
        A one-line reason.
    """
    if epsilon == 0:
        return "epsilon = 0 at every order: the output does not depend on the teachers"
    return no_guarantee_reason(run) + " (no order gives a finite bound)"


def perplexity_reason(run: RunData, value: float | None) -> str | None:
    """Why the perplexity is missing or +inf; None when it is a finite number.

    Args:
        run: the run the perplexity belongs to (its manifest's mechanism type and data stream are read).
        value: the perplexity from ledger.json: a number, +inf or None.

    Returns:
        The reason, or None for a finite perplexity.
    """
    if value is None:
        if run.manifest["mechanism"]["type"] == "voting":
            return "voting runs release a point mass per step: no perplexity (see token_accuracy)"
        if run.manifest["data"]["stream"] != "teacher-forced":
            return "free generation has no true next tokens: no perplexity"
        return "ledger.json records no perplexity"
    if value == float("inf"):
        return "+inf: a true token had probability 0 under a released distribution"
    return None


def comparison_table(runs: list[RunData]) -> pd.DataFrame:
    """Table 2a / Table 1: the run (its directory's name), method, queries, the improved epsilon at
    every requested delta (one column each, "epsilon@1e-05"), the audit's certified lower bound at each
    ("lower@1e-05": dpledger.audit.bracket), the optimal order at each run's first delta, whether
    epsilon is data-dependent, the divergence direction, the neighbouring relation the charged total
    covers, the accounting of a screened step (released-output or realised-path), perplexity, queries
    answered by the public model, the audit's headline (its verdict for the claimed relation and every
    other relation it tested); for voting runs also yield and token accuracy.

    Every missing value is None (never NaN) and every missing or +inf value has a reason:
    `frame.attrs["reasons"]` holds one {column: reason} per row.

    Args:
        runs: the runs to compare, one row each, in this order.

    Returns:
        A DataFrame of object dtype, one row per run, with the columns above (the audit's headline last).

    Raises:
        ValueError: if a run's ledger.json has no improved epsilon at its first delta (`RunData.epsilon`).
    """
    deltas = list(dict.fromkeys(d for run in runs for d in run.manifest["config"]["deltas"]))
    voting_columns = any("voting" in r.ledger for r in runs)
    rows, reasons = [], []
    for run in runs:
        row, why = {"run": run.directory.name, "method": run.label, "queries": run.ledger["steps"]}, {}
        requested = run.manifest["config"]["deltas"]
        for delta in deltas:  # every requested delta, not only the first
            column = epsilon_column(delta)
            entry = next((e for e in run.ledger["epsilon"] if isinstance(e, dict) and e.get("method") == "improved"
                          and e.get("delta") == delta), None)
            row[column] = None if entry is None else entry["epsilon"]
            if entry is None:
                why[column] = ("this run did not request this delta (its deltas: "
                               + ", ".join(f"{d:g}" for d in requested) + ")" if delta not in requested
                               else "ledger.json has no improved epsilon at this delta")
            elif entry["epsilon"] == float("inf"):
                why[column] = no_guarantee_reason(run)
        for delta in deltas:  # the audit's bracket: its certified lower bound beside the claims
            column = lower_bound_column(delta)
            row[column], reason = certified_lower_bound(run, delta)
            if reason:
                why[column] = reason
        epsilon = run.epsilon()
        for delta in deltas:
            if delta == run.delta:
                row[order_column(delta)] = epsilon["order"]
                if epsilon["order"] is None:
                    why[order_column(delta)] = missing_order_reason(run, epsilon["epsilon"])
        row.update({"data_dependent": run.data_dependent, "direction": direction_label(run.ledger.get("direction")),
                    "relation": relation_label(run), "accounting": run.ledger.get("accounting"),
                    "perplexity": run.ledger["perplexity"],
                    "answered_by_public": run.ledger["answered_by_public"], "audit": audit_headline(run)})
        if row["accounting"] is None:
            why["accounting"] = "no screened step: released-output and realised-path accounting coincide"
        reason = perplexity_reason(run, row["perplexity"])
        if reason:
            why["perplexity"] = reason
        if voting_columns:  # voting releases point masses: yield and accuracy, not perplexity
            voting = run.ledger.get("voting")
            row.update({"yield": None if voting is None else voting.get("yield"),
                        "token_accuracy": None if voting is None else voting.get("token_accuracy")})
            if voting is None:
                why["yield"] = why["token_accuracy"] = "not a voting run"
            elif voting.get("token_accuracy") is None:
                why["token_accuracy"] = "free generation has no true next tokens: no accuracy"
        rows.append(row)
        reasons.append(why)
    columns = list(dict.fromkeys(key for row in rows for key in row))  # a run without a column shows it missing
    columns = [c for c in columns if c != "audit"] + ["audit"]  # the one long text, last
    for row, why in zip(rows, reasons):
        for column in columns:
            if column not in row and column not in why:
                why[column] = (f"not applicable: {column} is the order at another run's first delta"
                               if column.startswith("order@") else "not recorded for this run")
    # object dtype keeps a missing value (e.g. no order for epsilon = 0) None: a float column would
    # turn it into NaN, which the renderers refuse
    frame = pd.DataFrame([{key: row.get(key) for key in columns} for row in rows], dtype=object, columns=columns)
    frame.attrs["reasons"] = reasons
    return frame


def leakage_table(run: RunData) -> pd.DataFrame | None:
    """The audit's per-neighbour empirical epsilon (None when the run has no ablation).

    Args:
        run: the run whose current audit.json is read.

    Returns:
        The neighbour_ablation check's per_neighbour rows (one per neighbour: its empirical epsilon and
        whether the claim covers it), or None.
    """
    if not run.audit:
        return None
    ablation = next((c for c in run.audit["checks"] if c["name"] == "neighbour_ablation"), None)
    if not ablation or "per_neighbour" not in ablation["evidence"]:
        return None
    return pd.DataFrame(ablation["evidence"]["per_neighbour"])


def checks_table(run: RunData) -> pd.DataFrame | None:
    """The audit's checks, one row each: its name, status (PASS, FAIL, SKIPPED, ...) and detail.

    Args:
        run: the run whose current audit.json is read.

    Returns:
        A DataFrame with the columns check, status and evidence, or None when no audit is shown.
    """
    if not run.audit:
        return None
    return pd.DataFrame([{"check": c["name"], "status": c["status"], "evidence": c["detail"]}
                         for c in run.audit["checks"]])
