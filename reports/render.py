"""Render a report of one or more runs: HTML (one self-contained file, images inline), Markdown,
JSON, LaTeX or CSV.

A missing value has one spelling per format, and a reason wherever a table has one
(`frame.attrs["reasons"]`): HTML and Markdown "n/a" with a numbered note below the table (an
infinite epsilon prints "inf" with its note), LaTeX "--" (infinity "$\\infty$") with the notes in
the caption, CSV an empty cell (infinity "inf") with the reasons in a `notes` column, JSON null
beside a `<field>_missing` reason (strict JSON: no NaN, no Infinity; +inf is null too, its JSON Pointer
listed in the top-level `nulls` map as in every JSON file dpledger writes).
"""
from __future__ import annotations

import base64
import json
import math
import re
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from dpledger.accounting.errors import require
from dpledger.decoding.utility import no_better_than_public, utility_warnings
from dpledger.accounting.strict_json import strict_json_text
from dpledger.reports.html_text import escaped
from dpledger.reports.plots import run_figures
from dpledger.reports.run_data import Generation, RunData, fmt, generations, printable, truncated
from dpledger.reports.statement import privacy_statement
from dpledger.reports.tables import audit_headline, breakdown_table, checks_table, comparison_table, direction_label

FORMATS = ("html", "md", "json", "latex", "csv")
MISSING = {"html": "n/a", "md": "n/a", "latex": "--", "csv": ""}
"""How each tabular format spells a missing value (JSON writes null and a reason)."""
INFINITY = {"html": "inf", "md": "inf", "latex": r"$\infty$", "csv": "inf"}
SHOWN_CHARACTERS = 1500
"""The longest prompt or continuation an HTML or Markdown report prints in full."""
SHOWN_BLOCKS = 24
"""The most continuations an HTML or Markdown report prints (the JSON report has them all)."""


def _cell(value, column: str, output_format: str = "md") -> str:
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if value is None:
        return MISSING[output_format]
    if isinstance(value, (float, np.floating)):
        if math.isinf(value) and value > 0:
            return INFINITY[output_format]
        return fmt(float(value), 5, f"table column {column!r}")
    return str(value)


class _Notes:
    """Numbered reasons for the cells of one table (the same reason gets the same number)."""

    def __init__(self, frame: pd.DataFrame):
        self.reasons = frame.attrs.get("reasons") or [{} for _ in range(len(frame))]
        self.numbers: dict[str, int] = {}

    def marker(self, row: int, column: str) -> int | None:
        reason = self.reasons[row].get(column) if row < len(self.reasons) else None
        if not reason:
            return None
        return self.numbers.setdefault(reason, len(self.numbers) + 1)

    def listed(self) -> list[tuple[int, str]]:
        return [(number, reason) for reason, number in self.numbers.items()]


def _cells(frame: pd.DataFrame, output_format: str):
    """Rows of (text, note number or None), a note only beside a missing or infinite value."""
    notes = _Notes(frame)
    rows = []
    for index, row in enumerate(frame.itertuples(index=False)):
        cells = []
        for column, value in zip(frame.columns, row):
            special = value is None or (isinstance(value, (float, np.floating)) and math.isinf(value))
            cells.append((_cell(value, column, output_format), notes.marker(index, column) if special else None))
        rows.append(cells)
    return rows, notes


def _md(text) -> str:
    """Text outside a code fence of a Markdown report: &, < and > as character references (Markdown
    renders raw HTML); quotes stay as they are, outside any attribute."""
    return escaped(text, quotes=False)


def markdown_table(frame: pd.DataFrame) -> str:
    """A table as Markdown: a header, a rule and one line per row; a missing value is "n/a" and a
    missing or infinite one carries a numbered note, the notes listed below the table. Every cell is
    HTML-escaped (Markdown renders raw HTML) and its "|" escaped.

    Args:
        frame: the table; `frame.attrs["reasons"]` (optional) holds one {column: reason} per row.

    Returns:
        The Markdown text, without a trailing newline.

    Raises:
        ValueError: if a cell is a float NaN.
    """
    rows, notes = _cells(frame, "md")
    header = "| " + " | ".join(_md(c) for c in frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    body = ["| " + " | ".join(_md(text + ("" if note is None else f" [{note}]")).replace("|", "\\|").replace("\n", " ")
                              for text, note in row) + " |" for row in rows]
    listed = [f"[{number}] {_md(reason)}" for number, reason in notes.listed()]
    return "\n".join([header, rule, *body] + (["", *("- " + line for line in listed)] if listed else []))


def _latex_escape(text: str) -> str:
    for char, repl in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("%", r"\%"), ("&", r"\&"), ("#", r"\#"),
                       ("$", r"\$"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"),
                       ("^", r"\textasciicircum{}")):
        text = text.replace(char, repl)
    return (text.replace(r"\textbackslash\{\}", r"\textbackslash{}").replace(r"\textasciitilde\{\}", r"\textasciitilde{}")
            .replace(r"\textasciicircum\{\}", r"\textasciicircum{}"))


def _numeric_column(frame: pd.DataFrame, column: object) -> bool:
    """Whether every value of the column is a number (None aside; a bool is not a number here)."""
    values = [value for value in frame[column] if value is not None]
    return bool(values) and all(isinstance(value, (int, float, np.integer, np.floating))
                                and not isinstance(value, (bool, np.bool_)) for value in values)


def latex_label(text: str) -> str:
    """`text` as a LaTeX label key: lower case, every run of other characters than a-z and 0-9 one "-".

    Args:
        text: what the label names (e.g. a run's label).

    Returns:
        The key, e.g. "adapmixed-remove-one" for "AdaPMixED (remove_one)"; "table" if nothing is left.
    """
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "table"


def latex_table(frame: pd.DataFrame, caption: str, label: str) -> str:
    """A table as a LaTeX `table` environment a paper can include: the caption above, then a `\\label`,
    small type and narrow column gaps; numeric columns right-aligned (`r`), text columns left (`l`); a
    missing value is "--", +inf "$\\infty$", each with a superscript note number; the notes end the
    caption. Every text is escaped for LaTeX; only core LaTeX is used (no package needed).

    Args:
        frame: the table; `frame.attrs["reasons"]` (optional) holds one {column: reason} per row.
        caption: the caption's text (escaped here).
        label: the `\\label` key, e.g. "tab:dpledger-comparison" (made of a-z, 0-9, ":" and "-").

    Returns:
        The LaTeX source, without a trailing newline.

    Raises:
        ValueError: if a cell is a float NaN or the label holds another character.
    """
    require(re.fullmatch(r"[a-z0-9:-]+", label) is not None,
            f"a LaTeX label must be made of a-z, 0-9, ':' and '-', got {label!r}")
    rows, notes = _cells(frame, "latex")

    def cell(text: str, note: int | None) -> str:
        shown = text if text == INFINITY["latex"] else _latex_escape(text)
        return shown + ("" if note is None else f"$^{{{note}}}$")

    columns = "".join("r" if _numeric_column(frame, column) else "l" for column in frame.columns)
    listed = "".join(f" {number}: {_latex_escape(reason)}." for number, reason in notes.listed())
    lines = [r"\begin{table}[htbp]", r"\centering", r"\small", r"\setlength{\tabcolsep}{3pt}",
             rf"\caption{{{_latex_escape(caption)}" + (f" -- : not applicable. Notes:{listed}" if listed else "") + "}",
             rf"\label{{{label}}}", rf"\begin{{tabular}}{{{columns}}}", r"\hline",
             " & ".join(_latex_escape(str(c)) for c in frame.columns) + r" \\", r"\hline"]
    lines += [" & ".join(cell(text, note) for text, note in row) + r" \\" for row in rows]
    lines += [r"\hline", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines)


def html_table(frame: pd.DataFrame, css: str) -> str:
    """A table as HTML, as the report renders its tables: every cell escaped, a missing value "n/a" and a
    missing or infinite one with a numbered note listed below the table.

    Args:
        frame: the table; `frame.attrs["reasons"]` (optional) holds one {column: reason} per row.
        css: the table's class ("comparison", "breakdown" or "checks" in the report's style).

    Returns:
        The HTML text: the table in a scrolling wrapper, then its notes.

    Raises:
        ValueError: if a cell is a float NaN.
    """
    return _html_table(frame, css)


def _html_table(frame: pd.DataFrame, css: str) -> str:
    rows, notes = _cells(frame, "html")
    # a header may break after "_" but not inside "epsilon@1e-05"; a short cell never breaks (a number, "n/a")
    head = "".join("<th>" + "<wbr>".join(f"<span class='short'>{escaped(part)}</span>"
                                         for part in str(c).replace("@", "\0@").split("\0")) + "</th>"
                   if "@" in str(c) else "<th>" + escaped(str(c)).replace("_", "_<wbr>") + "</th>"
                   for c in frame.columns)
    body = "".join("<tr>" + "".join(
        ("<td class='short'>" if len(text) <= 12 else "<td>") + escaped(text)
        + ("" if note is None else f"<sup class='fn'>[{note}]</sup>") + "</td>"
        for text, note in row) + "</tr>" for row in rows)
    listed = notes.listed()
    footer = ("<ol class='table-notes'>" + "".join(f"<li value='{number}'>{escaped(reason)}</li>"
                                                   for number, reason in listed) + "</ol>") if listed else ""
    return (f'<div class="table-wrap"><table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            f"</table></div>{footer}")


def _breakdown_caption(run: RunData) -> str:
    b = run.ledger["breakdown"]
    kind = " (data-dependent)" if b["data_dependent"] else ""
    covers = ("both divergence directions" if direction_label(b.get("direction")) == "both"
              else "only D(M(D) || M(D')) at the actual data D, not the reverse direction")
    order = ("no order (epsilon is 0 or +inf at every order)" if b["order"] is None else f"order {fmt(b['order'])}")
    return (f"Privacy-loss breakdown of {run.label}{kind} at {order}, {b['method']} conversion, "
            f"delta={b['delta']:g}; rows sum to the total; the total covers {covers}.")


# -- JSON ------------------------------------------------------------------------------------------

def _is_inf(value) -> bool:
    if isinstance(value, str):
        return value in ("inf", "-inf", "Infinity", "-Infinity")
    return isinstance(value, (float, np.floating)) and math.isinf(value)


def _as_float(value) -> float:
    return float(value) if not isinstance(value, str) else (-math.inf if value.startswith("-") else math.inf)


def _checked(value, where: str, inf_reason: str):
    """`value` ready for strict JSON: a NaN raises ValueError naming `where`; an infinity (a float,
    or an "inf" string) stays a float, given a sibling "<key>_missing" reason; a list holding
    infinities gets one reason for its entries. `strict_json` then writes each infinity as null."""
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for key, item in value.items():
            if _is_inf(item):
                number = _as_float(item)
                out[key] = number
                sign = "-inf" if number < 0 else "+inf"
                out.setdefault(f"{key}_missing", f"{sign}: {inf_reason}")
            elif isinstance(item, (list, tuple)) and any(_is_inf(v) for v in item):
                out[key] = _checked(item, f"{where}.{key}", inf_reason)
                out.setdefault(f"{key}_missing", f"null entries are +inf: {inf_reason}")
            else:
                out[key] = _checked(item, f"{where}.{key}", inf_reason)
        return out
    if isinstance(value, (list, tuple)):
        return [_as_float(item) if _is_inf(item) else _checked(item, f"{where}[{index}]", inf_reason)
                for index, item in enumerate(value)]
    if isinstance(value, (float, np.floating)):
        require(not math.isnan(value), f"{where} must be a number, inf or null, got NaN")
        return float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value


def _nulled(value):
    if isinstance(value, dict):
        return {key: _nulled(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_nulled(item) for item in value]
    return None if isinstance(value, float) and math.isinf(value) else value


def strict_json(value: object, where: str = "report", inf_reason: str = "no finite bound") -> str:
    """Strict JSON text of `value` (json.dumps with allow_nan=False): a NaN raises ValueError naming
    `where`; every missing or infinite value is null beside a "<key>_missing" reason, and, for an
    object, each infinity's JSON Pointer is listed in the top-level `nulls` map as every JSON file
    of dpledger does (dpledger.accounting.strict_json: `loads_json` restores the exact value).

    Args:
        value: a JSON-like value: dicts, lists, tuples, numbers (numpy scalars too), strings, None;
            an infinity may be a float or an "inf" / "Infinity" string; anything else is written as str().
        where: the value's name in error messages.
        inf_reason: the reason written beside each infinity.

    Returns:
        The JSON text, indented by 2.

    Raises:
        ValueError: if `value` holds a NaN.
    """
    checked = _checked(value, where, inf_reason)
    if isinstance(checked, dict):
        return strict_json_text(checked, default=str, sort_keys=False)
    return json.dumps(_nulled(checked), indent=2, allow_nan=False, default=str)


def table_records(frame: pd.DataFrame, where: str) -> list[dict]:
    """A table's rows as JSON objects, as the JSON report writes its tables: a missing or infinite value
    has a "<key>_missing" reason beside it (`frame.attrs["reasons"]`, or a generic one).

    Args:
        frame: the table.
        where: the table's name in error messages.

    Returns:
        One dict per row (infinities stay floats: `strict_json` writes them as null).

    Raises:
        ValueError: if a cell is a float NaN.
    """
    return _records(frame, where)


def _records(frame: pd.DataFrame, where: str) -> list[dict]:
    """A table's rows as JSON objects: a missing or infinite value has a "<key>_missing" reason."""
    reasons = frame.attrs.get("reasons") or [{} for _ in range(len(frame))]
    records = []
    for index, (record, why) in enumerate(zip(frame.to_dict(orient="records"), reasons)):
        out = {}
        for key, value in record.items():
            if isinstance(value, (float, np.floating)) and math.isnan(value):
                raise ValueError(f"{where}[{index}].{key} must be a number, inf or null, got NaN")
            out[key] = _as_float(value) if _is_inf(value) else value
            if value is None or _is_inf(value):
                out[f"{key}_missing"] = why.get(key) or ("+inf: no finite bound" if value is not None else
                                                         "not recorded for this run")
        records.append(out)
    return records


def _generation_json(run: RunData) -> dict:
    made, note = generations(run)
    if not made:
        return {}
    entries = []
    for g in made:
        entry = {"prompt_index": g.prompt_index, "prompt": g.prompt, "block": g.block, "first_step": g.first_step,
                 "tokens": list(g.tokens), "text": g.text, "answered_by_public": g.answered_by_public}
        if g.text is None:
            entry["text_missing"] = note
        entries.append(entry)
    return {"generations": entries, "generations_note": note}


def render_json(runs: list[RunData]) -> str:
    """The report as one strict JSON object: when it was generated, the comparison table, and for
    each run its breakdown, privacy statement, current audit (None when absent or withheld) and, for a
    free-generation run, its generations. Missing values are null beside a `<field>_missing` reason.

    Args:
        runs: the runs to report, at least one.

    Returns:
        The JSON text (`strict_json`).

    Raises:
        ValueError: if a value is NaN, a breakdown does not sum to its total, or a run has no improved
            epsilon at its first delta.
    """
    payload = {"generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "missing_values": "null, with the reason in the field named <field>_missing",
               "comparison": _records(comparison_table(runs), "report.comparison"),
               "runs": [{"directory": str(r.directory), "label": r.label,
                         "breakdown": _records(breakdown_table(r), f"report.runs[{i}].breakdown"),
                         "statement": privacy_statement(r),
                         "audit": _checked(r.audit, f"report.runs[{i}].audit", "infinite in audit.json"),
                         **_generation_json(r)}
                        for i, r in enumerate(runs)]}
    return strict_json(payload, "report", "no finite bound")


# -- CSV -------------------------------------------------------------------------------------------

def _csv_value(value, where: str):
    """A CSV cell: "" for missing, "inf" for +inf, yes/no never (CSV keeps True/False)."""
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        require(not math.isnan(value), f"{where} must be a number, inf or missing, got NaN")
        return "inf" if math.isinf(value) and value > 0 else float(value)
    return value


def render_csv(runs: list[RunData]) -> str:
    """One row per breakdown row of every run, then one per run of the comparison table (with every
    epsilon@delta column); missing cells are empty and the `notes` column says why.

    Args:
        runs: the runs to report, at least one.

    Returns:
        The CSV text with a header row; the `notes` column last.

    Raises:
        ValueError: if a value is NaN, a breakdown does not sum to its total, or a run has no improved
            epsilon at its first delta.
    """
    rows = []
    for run in runs:
        frame = breakdown_table(run)
        for (_, row), why in zip(frame.iterrows(), frame.attrs["reasons"]):
            rows.append({"run": str(run.directory), "method": run.label, "table": "breakdown",
                         "row": row["component"], "epsilon": row["epsilon"], "delta": run.ledger["breakdown"]["delta"],
                         "data_dependent": row["data_dependent"], "direction": row["direction"],
                         "notes": "; ".join(f"{k}: {v}" for k, v in why.items())})
    comparison = comparison_table(runs)
    for run, (_, row), why in zip(runs, comparison.iterrows(), comparison.attrs["reasons"]):
        epsilon = run.epsilon()
        rows.append({"run": str(run.directory), "method": row["method"], "table": "comparison", "row": "total",
                     "epsilon": epsilon["epsilon"], "delta": epsilon["delta"],
                     **{k: v for k, v in row.items() if k not in ("run", "method")},
                     "notes": "; ".join(f"{k}: {v}" for k, v in why.items())})
    columns = list(dict.fromkeys(key for row in rows for key in row))
    columns.remove("notes")
    columns.append("notes")
    cleaned = [{c: _csv_value(row.get(c), f"csv row {i} column {c!r}") for c in columns} for i, row in enumerate(rows)]
    return pd.DataFrame(cleaned, columns=columns, dtype=object).to_csv(index=False)


# -- Markdown and LaTeX ----------------------------------------------------------------------------

def _fence(text: str) -> str:
    """A Markdown fence longer than any run of backticks in `text`."""
    longest, run = 0, 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)


def _shown(text: str) -> tuple[str, str]:
    """(the text a page prints, the sentence on what was left out, "" when nothing was)."""
    shown, hidden = truncated(printable(text), SHOWN_CHARACTERS)
    return shown, (f"[{hidden} more characters not shown; the JSON report (--format json) has the full text]"
                   if hidden else "")


def _generation_groups(made: list[Generation]) -> list[tuple[int, str, list[Generation]]]:
    groups: dict[int, list[Generation]] = {}
    for g in made[:SHOWN_BLOCKS]:
        groups.setdefault(g.prompt_index, []).append(g)
    return [(index, items[0].prompt, items) for index, items in sorted(groups.items())]


def _continuation_caption(g: Generation) -> str:
    public = f", {g.answered_by_public} answered by the public model" if g.answered_by_public else ""
    return (f"block {g.block}, steps {g.first_step}-{g.first_step + len(g.tokens) - 1}: {len(g.tokens)} generated "
            f"tokens{public}")


def _generation_intro(run: RunData, made: list[Generation]) -> str:
    prompts = run.manifest["config"]["data"]["prompts"]
    left = len(made) - min(len(made), SHOWN_BLOCKS)
    return (f"Free generation: {len(made)} continuation(s) of {len(prompts)} prompt(s), each up to "
            f"{run.manifest['config']['data']['max_new_tokens']} tokens; block b continues prompt b mod "
            f"{len(prompts)}. Every generated token is one query of the mechanism; the text below is what it "
            f"released." + (f" The first {SHOWN_BLOCKS} continuations are shown; {left} more are in the JSON report."
                            if left else ""))


def _markdown_generations(run: RunData) -> list[str]:
    made, note = generations(run)
    if not made:
        return []
    parts = ["### Prompts and generated text", "", _md(_generation_intro(run, made)), "", _md(note), ""]
    for index, prompt, items in _generation_groups(made):
        shown, more = _shown(prompt)
        fence = _fence(shown)
        parts += [f"#### Prompt {index + 1}", "", fence + "text", shown, fence, *([_md(more)] if more else []), ""]
        for g in items:
            body = printable(g.text) if g.text is not None else " ".join(map(str, g.tokens))
            shown, more = _shown(body)
            fence = _fence(shown)
            parts += [f"Continuation ({_md(_continuation_caption(g))}):", "", fence + "text", shown, fence,
                      *([_md(more)] if more else []), ""]
    return parts


AUDIT_VERDICT_MEANING = ("The audit verdict says whether the charges, the ledger and the bounds were verified "
                         "against the trace (replay, checks, neighbour ablations): a verified epsilon is right, not "
                         "necessarily small.")

def utility_notes(run: RunData, runs: list[RunData]) -> list[str]:
    """The utility warnings that apply to `run` (dpledger.decoding.utility; docs/pitfalls.md 13 to 16),
    and, when the report holds the public model's run on the same queries, whether this private run's
    perplexity is no better than the public model's. Utility only: no privacy number changes.

    Args:
        run: the run whose warnings are listed.
        runs: every run of the report (searched for the public model's run on the same data and queries).

    Returns:
        One sentence per warning that applies, in pitfall order, the comparison with the public model last.
    """
    notes = [f"{w.title}: {w.reason}." for w in utility_warnings(run.manifest, run.records, run.ledger) if w.applies]
    if run.manifest["mechanism"]["type"] in ("public", "ensemble"):
        return notes
    same_queries = [other for other in runs if other.manifest["mechanism"]["type"] == "public"
                    and other.manifest["data"].get("sha256") == run.manifest["data"].get("sha256")
                    and other.ledger["steps"] == run.ledger["steps"]]
    for public in same_queries[:1]:
        if no_better_than_public(run.ledger["perplexity"], public.ledger["perplexity"]):
            notes.append(f"no better than the public model: perplexity {run.ledger['perplexity']:.4g} against the "
                         f"public model's {public.ledger['perplexity']:.4g} on the same {run.ledger['steps']} queries "
                         f"({public.directory.name}).")
    return notes


def render_markdown(runs: list[RunData]) -> str:
    """The report as Markdown: the method comparison, then per run its breakdown (Table 2b shape),
    privacy statement, a free-generation run's prompts and text, and its audit's verdict and checks.

    Args:
        runs: the runs to report, at least one.

    Returns:
        The Markdown text.

    Raises:
        ValueError: if a value is NaN, a breakdown does not sum to its total, or a run has no improved
            epsilon at its first delta.
    """
    parts = ["# dpledger privacy report", "", "## Method comparison (Table 1 / Table 2a shape)", "",
             markdown_table(comparison_table(runs)), "",
             "epsilon@delta: improved RDP->DP conversion (Balle et al. 2020, Theorem 21) at that delta; order@delta: "
             "the optimal Renyi order there; data-dependent values are measurements, not releasable guarantees; "
             "n/a: not applicable, for the numbered reason. " + AUDIT_VERDICT_MEANING, ""]
    for run in runs:
        parts += [f"## {_md(run.label)}", "", f"Trace: {_md(run.directory)}", "", "### Breakdown (Table 2b shape)", "",
                  markdown_table(breakdown_table(run)), "", _md(_breakdown_caption(run)), "", "### Privacy statement",
                  ""]
        parts += [_md(p) + "\n" for p in privacy_statement(run)]
        warnings_here = utility_notes(run, runs)
        if warnings_here:
            parts += ["### Utility warnings", "", *(f"- {_md(note)}" for note in warnings_here), ""]
        parts += _markdown_generations(run)
        checks = checks_table(run)
        parts += ["### Audit", "", f"Verdict: {_md(audit_headline(run))}", "",
                  markdown_table(checks) if checks is not None else "Not audited.", ""]
    return "\n".join(parts)


def render_latex(runs: list[RunData]) -> str:
    """The report's tables as LaTeX: the method comparison, then each run's breakdown.

    Args:
        runs: the runs to report, at least one.

    Returns:
        The LaTeX source of the tables, separated by blank lines, ending in a newline.

    Raises:
        ValueError: if a value is NaN, a breakdown does not sum to its total, or a run has no improved
            epsilon at its first delta.
    """
    parts = [latex_table(comparison_table(runs), "Method comparison (Table 2a shape); epsilon@delta: improved "
                                                 "conversion at that delta.", "tab:dpledger-comparison")]
    labels: dict[str, int] = {}
    for run in runs:   # one label per table: two runs with the same label get -2, -3, ...
        key = latex_label(run.label)
        labels[key] = labels.get(key, 0) + 1
        suffix = "" if labels[key] == 1 else f"-{labels[key]}"
        parts.append(latex_table(breakdown_table(run), _breakdown_caption(run), f"tab:dpledger-breakdown-{key}{suffix}"))
    return "\n\n".join(parts) + "\n"


# -- HTML ------------------------------------------------------------------------------------------

_STYLE = """body{font-family:system-ui,sans-serif;max-width:1240px;margin:2em auto;padding:0 1em;color:#222;line-height:1.4}
.table-wrap{overflow-x:auto}table{border-collapse:collapse;margin:0.8em 0}
td,th{border:1px solid #bbb;padding:4px 6px;font-size:0.85em;text-align:left;vertical-align:top}
.short{white-space:nowrap}table.comparison td:first-child{min-width:10em;white-space:normal}
table.comparison td:last-child{min-width:15em}th{background:#eef}sup.fn{color:#555;font-size:0.75em}
ol.table-notes{color:#555;font-size:0.85em;margin-top:0}
.verdict-PASS{color:#176b1b;font-weight:bold}.verdict-FAIL{color:#b00;font-weight:bold}
.verdict-UNVERIFIED{color:#b36b00;font-weight:bold}
.note{color:#555;font-size:0.9em}figure{margin:0}img{max-width:100%;border:1px solid #ddd}
.figures{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:1em;align-items:start}
figcaption{color:#555;font-size:0.85em}
nav ul{columns:2;font-size:0.9em}
pre.prompt,pre.continuation{white-space:pre-wrap;word-break:break-word;padding:6px 10px;margin:0.3em 0 0.8em;
font-size:0.88em;border-radius:3px}pre.prompt{background:#eef;border-left:4px solid #88a}
pre.continuation{background:#f6f6f0;border-left:4px solid #bb9}.generation h4{margin:0.8em 0 0.2em}"""
REPORT_STYLE = _STYLE
"""The HTML report's style sheet, for pages that show sections in the report's look (`dpledger frontier`)."""


def _html_generations(run: RunData) -> list[str]:
    made, note = generations(run)
    if not made:
        return []
    parts = ["<h3>Prompts and generated text</h3>", f"<p class='note'>{escaped(_generation_intro(run, made))} "
             f"{escaped(note)}</p>"]
    for index, prompt, items in _generation_groups(made):
        shown, more = _shown(prompt)
        parts += ["<div class='generation'>", f"<h4>Prompt {index + 1}</h4>",
                  f"<pre class='prompt'>{escaped(shown)}</pre>"]
        parts += [f"<p class='note'>{escaped(more)}</p>"] if more else []
        for g in items:
            body = printable(g.text) if g.text is not None else " ".join(map(str, g.tokens))
            shown, more = _shown(body)
            parts += [f"<p class='note'>Continuation ({escaped(_continuation_caption(g))}):</p>",
                      f"<pre class='continuation'>{escaped(shown)}</pre>"]
            parts += [f"<p class='note'>{escaped(more)}</p>"] if more else []
        parts.append("</div>")
    return parts


def render_html(runs: list[RunData]) -> str:
    """The report as one self-contained HTML page (styles inline, figures as data: PNG images): the
    method comparison, then per run its audit verdict, breakdown, privacy statement, a free-generation
    run's prompts and text, the audit's checks and the figures (`run_figures`). Every string read from
    the runs is escaped (`escaped`).

    Args:
        runs: the runs to report, at least one.

    Returns:
        The HTML text.

    Raises:
        ValueError: if a value is NaN, a breakdown does not sum to its total, or a run has no improved
            epsilon at its first delta.
    """
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>dpledger privacy report</title>"
             f"<style>{_STYLE}</style></head><body>", "<h1>dpledger privacy report</h1>",
             f"<p class='note'>Generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} from "
             f"{len(runs)} run(s). Every number is read from the runs' ledger.json and audit.json.</p>"]
    if len(runs) > 1:
        parts.append("<nav><ul>" + "".join(f"<li><a href='#run-{i}'>{escaped(r.label)}</a> "
                                            f"<span class='note'>{escaped(r.directory.name)}</span></li>"
                                            for i, r in enumerate(runs)) + "</ul></nav>")
    parts += ["<h2>Method comparison</h2>", _html_table(comparison_table(runs), "comparison"),
              "<p class='note'>epsilon@delta: improved RDP-to-DP conversion (Balle et al. 2020, Theorem 21) at that "
              "delta; order@delta: the optimal Renyi order there. Data-dependent values are measurements on the "
              "private data, not releasable guarantees. n/a: not applicable, for the numbered reason. "
              f"{escaped(AUDIT_VERDICT_MEANING)}</p>"]
    for index, run in enumerate(runs):
        verdict = run.audit["verdict"] if run.audit else None  # a shown audit passed audit_integrity: a known verdict
        headline = audit_headline(run)
        rest = headline[len(verdict):] if verdict and headline.startswith(verdict) else ""
        # the relations not covered are shown in red beside the verdict, never hidden below it
        badge = (f"<span class='verdict-{escaped(verdict)}'>{escaped(verdict)}</span>"
                 + (f"<span class='verdict-FAIL'>{escaped(rest)}</span>" if "NOT COVERED" in rest
                    else escaped(rest)) if verdict else
                 f"<span class='verdict-FAIL'>{escaped(headline)}</span>" if run.stale_audit else "<span>not audited</span>")
        parts += [f"<h2 id='run-{index}'>{escaped(run.label)} — audit: {badge}</h2>",
                  f"<p class='note'>Trace: {escaped(str(run.directory))}</p>",
                  "<h3>Privacy-loss breakdown</h3>", _html_table(breakdown_table(run), "breakdown"),
                  f"<p class='note'>{escaped(_breakdown_caption(run))}</p>", "<h3>Privacy statement</h3>"]
        parts += [f"<p>{escaped(p)}</p>" for p in privacy_statement(run)]
        warnings_here = utility_notes(run, runs)
        if warnings_here:
            parts += ["<h3>Utility warnings</h3><ul>" + "".join(f"<li>{escaped(note)}</li>" for note in warnings_here)
                      + "</ul>"]
        parts += _html_generations(run)
        checks = checks_table(run)
        if checks is not None:
            parts += ["<h3>Audit checks</h3>", _html_table(checks, "checks")]
        figures = run_figures(run)
        if figures:
            parts.append("<h3>Figures</h3><div class='figures'>" + "".join(
                f"<figure><img alt='{escaped(name)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
                f"<figcaption>{escaped(name)}</figcaption></figure>" for name, png in figures.items()) + "</div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def render(runs: list[RunData], output_format: str) -> str:
    """Render a report of `runs` in one of FORMATS (module docstring: how each spells a missing value).

    Args:
        runs: the runs to report, at least one (`load_run`).
        output_format: "html", "md", "json", "latex" or "csv".

    Returns:
        The report's text.

    Raises:
        ValueError: if `output_format` is not in FORMATS, `runs` is empty, or a run's files hold a NaN,
            a breakdown that does not sum to its total, or no improved epsilon at the run's first delta.
    """
    require(output_format in FORMATS, f"format must be one of {', '.join(FORMATS)}, got {output_format!r}")
    require(len(runs) > 0, "a report needs at least one run directory")
    return {"html": render_html, "md": render_markdown, "json": render_json, "latex": render_latex,
            "csv": render_csv}[output_format](runs)


__all__ = ["FORMATS", "MISSING", "REPORT_STYLE", "html_table", "render", "strict_json", "table_records"]
