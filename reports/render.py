"""Render a report of one or more runs: HTML (one self-contained file, images inline), Markdown,
JSON, LaTeX or CSV."""
from __future__ import annotations

import base64
import html
import json
import math
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from accounting.errors import require
from reports.plots import run_figures
from reports.run_data import RunData, fmt
from reports.statement import privacy_statement
from reports.tables import (audit_headline, breakdown_table, checks_table, comparison_table, direction_label,
                           leakage_table)

FORMATS = ("html", "md", "json", "latex", "csv")


def _cell(value, column: str) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) or value is None:
        return fmt(value, 5, f"table column {column!r}")
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = ["| " + " | ".join(_cell(v, c).replace("|", "\\|") for c, v in zip(frame.columns, row)) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def latex_table(frame: pd.DataFrame, caption: str) -> str:
    def escape(text: str) -> str:
        for char, repl in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("%", r"\%"), ("&", r"\&"), ("#", r"\#"),
                           ("$", r"\$"), ("{", r"\{"), ("}", r"\}")):
            text = text.replace(char, repl)
        return text.replace(r"\textbackslash\{\}", r"\textbackslash{}")

    columns = "l" * len(frame.columns)
    lines = [r"\begin{table}[h]", r"\centering", rf"\begin{{tabular}}{{{columns}}}", r"\hline",
             " & ".join(escape(str(c)) for c in frame.columns) + r" \\", r"\hline"]
    lines += [" & ".join(escape(_cell(v, c)) for c, v in zip(frame.columns, row)) + r" \\"
              for row in frame.itertuples(index=False)]
    lines += [r"\hline", r"\end{tabular}", rf"\caption{{{escape(caption)}}}", r"\end{table}"]
    return "\n".join(lines)


def _html_table(frame: pd.DataFrame, css: str) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(v, c))}</td>" for c, v in zip(frame.columns, row))
                   + "</tr>" for row in frame.itertuples(index=False))
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _breakdown_caption(run: RunData) -> str:
    b = run.ledger["breakdown"]
    kind = " (data-dependent)" if b["data_dependent"] else ""
    covers = ("both divergence directions" if direction_label(b.get("direction")) == "both"
              else "only D(M(D) || M(D')) at the actual data D, not the reverse direction")
    return (f"Privacy-loss breakdown of {run.label}{kind} at order {fmt(b['order'])}, {b['method']} conversion, "
            f"delta={b['delta']:g}; rows sum to the total; the total covers {covers}.")


def _no_nan(value, where: str):
    """value with +-inf as the strings "inf" / "-inf" (ledger.json's convention: strict JSON has no
    infinity); ValueError naming `where` for a NaN, which no output format can show as a number."""
    if isinstance(value, dict):
        return {key: _no_nan(item, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, (float, np.floating)):
        require(not math.isnan(value), f"{where} must be a number, inf or null, got NaN")
        return float(value) if math.isfinite(value) else str(float(value))
    return value


def render_json(runs: list[RunData]) -> str:
    payload = {"generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "comparison": comparison_table(runs).to_dict(orient="records"),
               "runs": [{"directory": str(r.directory), "label": r.label,
                         "breakdown": breakdown_table(r).to_dict(orient="records"),
                         "statement": privacy_statement(r), "audit": r.audit} for r in runs]}
    return json.dumps(_no_nan(payload, "report"), indent=2, allow_nan=False, default=str)


def render_csv(runs: list[RunData]) -> str:
    rows = []
    for run in runs:
        for _, row in breakdown_table(run).iterrows():
            rows.append({"run": str(run.directory), "method": run.label, "table": "breakdown", "row": row["component"],
                         "epsilon": row["epsilon"], "data_dependent": row["data_dependent"],
                         "direction": row["direction"]})
    comparison = comparison_table(runs)
    for _, row in comparison.iterrows():
        rows.append({"run": "", "method": row["method"], "table": "comparison", "row": "total",
                     "epsilon": row["epsilon"], "data_dependent": row["data_dependent"],
                     "perplexity": row["perplexity"], "answered_by_public": row["answered_by_public"],
                     "audit": row["audit"]})
    return pd.DataFrame(_no_nan(rows, "csv")).to_csv(index=False)


def render_markdown(runs: list[RunData]) -> str:
    parts = ["# dpledger privacy report", "", "## Method comparison (Table 1 / Table 2a shape)", "",
             markdown_table(comparison_table(runs)), "",
             "epsilon: improved RDP->DP conversion at the run's delta; data-dependent values are measurements, "
             "not releasable guarantees.", ""]
    for run in runs:
        parts += [f"## {run.label}", "", f"Trace: `{run.directory}`", "", "### Breakdown (Table 2b shape)", "",
                  markdown_table(breakdown_table(run)), "", _breakdown_caption(run), "", "### Privacy statement", ""]
        parts += [p + "\n" for p in privacy_statement(run)]
        checks = checks_table(run)
        parts += ["### Audit", "", f"Verdict: {audit_headline(run)}", "",
                  markdown_table(checks) if checks is not None else "Not audited.", ""]
    return "\n".join(parts)


def render_latex(runs: list[RunData]) -> str:
    parts = [latex_table(comparison_table(runs).drop(columns=["delta"]), "Method comparison (Table 2a shape).")]
    parts += [latex_table(breakdown_table(run), _breakdown_caption(run)) for run in runs]
    return "\n\n".join(parts) + "\n"


_STYLE = """body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.8em 0}td,th{border:1px solid #bbb;padding:4px 8px;font-size:0.9em;text-align:left}
th{background:#eef}.verdict-PASS{color:#176b1b;font-weight:bold}.verdict-FAIL{color:#b00;font-weight:bold}
.verdict-UNVERIFIED{color:#b36b00;font-weight:bold}
.note{color:#555;font-size:0.9em}figure{margin:1em 0}img{max-width:100%;border:1px solid #ddd}"""


def render_html(runs: list[RunData]) -> str:
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>dpledger privacy report</title>"
             f"<style>{_STYLE}</style></head><body>", "<h1>dpledger privacy report</h1>",
             f"<p class='note'>Generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} from "
             f"{len(runs)} run(s). Every number is read from the runs' ledger.json and audit.json.</p>",
             "<h2>Method comparison</h2>", _html_table(comparison_table(runs), "comparison"),
             "<p class='note'>epsilon: improved RDP-to-DP conversion at the run's delta. Data-dependent values are "
             "measurements on the private data, not releasable guarantees.</p>"]
    for index, run in enumerate(runs):
        verdict = run.audit["verdict"] if run.audit else None
        headline = audit_headline(run)
        rest = headline[len(verdict):] if verdict and headline.startswith(verdict) else ""
        # the relations not covered are shown in red beside the verdict, never hidden below it
        badge = (f"<span class='verdict-{verdict}'>{verdict}</span>"
                 + (f"<span class='verdict-FAIL'>{html.escape(rest)}</span>" if "NOT COVERED" in rest
                    else html.escape(rest)) if verdict else
                 f"<span class='verdict-FAIL'>{html.escape(headline)}</span>" if run.stale_audit else "<span>not audited</span>")
        parts += [f"<h2 id='run-{index}'>{html.escape(run.label)} — audit: {badge}</h2>",
                  f"<p class='note'>Trace: {html.escape(str(run.directory))}</p>",
                  "<h3>Privacy-loss breakdown</h3>", _html_table(breakdown_table(run), "breakdown"),
                  f"<p class='note'>{html.escape(_breakdown_caption(run))}</p>", "<h3>Privacy statement</h3>"]
        parts += [f"<p>{html.escape(p)}</p>" for p in privacy_statement(run)]
        checks = checks_table(run)
        if checks is not None:
            parts += ["<h3>Audit checks</h3>", _html_table(checks, "checks")]
        for name, png in run_figures(run).items():
            encoded = base64.b64encode(png).decode()
            parts.append(f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,{encoded}'>"
                         f"<figcaption>{html.escape(name)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def render(runs: list[RunData], output_format: str) -> str:
    require(output_format in FORMATS, f"format must be one of {', '.join(FORMATS)}, got {output_format!r}")
    require(len(runs) > 0, "a report needs at least one run directory")
    return {"html": render_html, "md": render_markdown, "json": render_json, "latex": render_latex,
            "csv": render_csv}[output_format](runs)
