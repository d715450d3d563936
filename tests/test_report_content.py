"""What a report shows: free generation's prompts and text, every requested delta in every format,
one spelling of a missing value per format (strict JSON with reasons), statements that say what the
ledger charges, and plots that mark +inf orders, never clip a title and join sweep points in order."""
import csv
import io
import json
import math
import re
from pathlib import Path

import pytest

from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode
from dpledger.reports import load_run, render
from dpledger.reports.run_data import RunData
from dpledger.reports.statement import privacy_statement
from tests.micro import ADAPMIXED, PAPER_ADAPMIXED, micro_config

KINDS = {"public": {"type": "public"}, "pmixed": {"type": "pmixed", "alpha": 6.0, "beta": 0.01},
         "adapmixed": ADAPMIXED,
         "targmax": {"type": "voting", "votes": "coordinated", "aggregator": "targmax", "threshold": 2},
         "dpargmax": {"type": "voting", "votes": "coordinated", "aggregator": "dpargmax", "threshold": 2.0,
                      "sigma": 1.0, "sigma_threshold": 1.0}}
PROMPTS = ["Customer: <b>Hi</b> & \"Ana\" ```x```", "Agent: Good morning,"]


def _decode(micro_models, out: Path, mechanism: dict, queries: int = 16, **run) -> Path:
    config = micro_config(micro_models, out, mechanism, queries=queries, block_size=8, **run)
    return run_decode(config_from_dict(config), progress=False, verbose=False).directory


@pytest.fixture(scope="module")
def kinds(micro_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("kinds")
    return {name: _decode(micro_models, root / name, mechanism, deltas=[1e-5, 1e-6] if name == "pmixed" else [1e-5])
            for name, mechanism in KINDS.items()}


@pytest.fixture(scope="module")
def generated(micro_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("generate") / "run"
    config = micro_config(micro_models, out, {"type": "pmixed", "alpha": 6.0, "beta": 0.01}, queries=12)
    config["data"] = {"stream": "generate", "prompts": PROMPTS, "max_new_tokens": 4}
    return run_decode(config_from_dict(config), progress=False, verbose=False).directory


# -- 1. free generation ---------------------------------------------------------------------------

def _continuations(run_dir: Path) -> list[str]:
    from transformers import AutoTokenizer

    from dpledger.decoding import trace

    manifest = trace.read_manifest(run_dir)
    tokenizer = AutoTokenizer.from_pretrained(manifest["tokenizer"])
    records = trace.read_records(run_dir, verify=False)
    return [tokenizer.decode([r["output_token"] for r in records if r["block"] == block])
            for block in range(manifest["n_blocks"])]


def test_generation_report_shows_each_prompt_and_its_continuation(generated):
    import html

    from dpledger.reports.run_data import printable

    run = load_run(generated)
    texts = _continuations(generated)
    assert len(texts) == 3  # 12 queries in blocks of 4: prompts 0, 1, 0
    page = render([run], "html")
    assert "Prompts and generated text" in page and html.escape(PROMPTS[0]) in page and PROMPTS[0] not in page
    for text in texts:
        assert html.escape(printable(text)) in page
    markdown = render([run], "md")
    assert PROMPTS[0] in markdown and all(printable(t) in markdown for t in texts)
    assert "````text\n" + PROMPTS[0] in markdown  # a fence longer than the prompt's backticks
    entries = json.loads(render([run], "json"))["runs"][0]["generations"]
    assert [(e["block"], e["prompt_index"], e["prompt"], e["text"]) for e in entries] == [
        (0, 0, PROMPTS[0], texts[0]), (1, 1, PROMPTS[1], texts[1]), (2, 0, PROMPTS[0], texts[2])]
    assert all(len(e["tokens"]) == 4 for e in entries)
    assert "free generation" in run.label


def test_generation_report_truncates_long_text_and_says_how_much(generated, monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.import_module("dpledger.reports.render"), "SHOWN_CHARACTERS", 5)
    run = load_run(generated)
    page = render([run], "html")
    hidden = len(PROMPTS[1]) - 5
    assert f"[{hidden} more characters not shown; the JSON report (--format json) has the full text]" in page
    assert f"[{hidden} more characters not shown" in render([run], "md")
    assert json.loads(render([run], "json"))["runs"][0]["generations"][1]["prompt"] == PROMPTS[1]  # JSON: in full


def test_generation_report_without_the_tokenizer_shows_token_ids_and_why(generated, tmp_path):
    import shutil

    copy = tmp_path / "moved"
    shutil.copytree(generated, copy)
    run = load_run(copy)
    run.manifest["tokenizer"] = str(tmp_path / "no-such-tokenizer")
    entry = json.loads(render([run], "json"))["runs"][0]["generations"][0]
    assert entry["text"] is None and "cannot be loaded here" in entry["text_missing"]
    assert " ".join(map(str, entry["tokens"])) in render([run], "html")


def test_teacher_forced_runs_show_no_text(kinds):
    assert "Prompts and generated text" not in render([load_run(kinds["pmixed"])], "html")


# -- 2. every delta in every format ---------------------------------------------------------------

def test_every_format_has_a_column_per_requested_delta(kinds):
    runs = [load_run(kinds["pmixed"]), load_run(kinds["public"])]
    improved = {e["delta"]: e["epsilon"] for e in runs[0].ledger["epsilon"] if e["method"] == "improved"}
    rows = list(csv.DictReader(io.StringIO(render(runs, "csv"))))
    compared = [r for r in rows if r["table"] == "comparison"]
    assert float(compared[0]["epsilon@1e-05"]) == pytest.approx(improved[1e-5], rel=1e-12)
    assert float(compared[0]["epsilon@1e-06"]) == pytest.approx(improved[1e-6], rel=1e-12)
    assert compared[1]["epsilon@1e-06"] == "" and "this run did not request this delta" in compared[1]["notes"]
    payload = json.loads(render(runs, "json"))["comparison"]
    assert payload[0]["epsilon@1e-06"] == improved[1e-6] and payload[1]["epsilon@1e-06"] is None
    assert "did not request" in payload[1]["epsilon@1e-06_missing"]
    latex = render(runs, "latex")
    assert "epsilon@1e-05 & epsilon@1e-06" in latex and f"{improved[1e-6]:.5g}" in latex
    for output_format in ("html", "md"):
        text = re.sub(r"<[^>]+>", "", render(runs, output_format))  # an HTML header may break before "@"
        assert "epsilon@1e-05" in text and "epsilon@1e-06" in text


# -- 3. one spelling of a missing value per format; strict JSON -----------------------------------

def _strict_json(text: str):
    return json.loads(text, parse_constant=lambda token: pytest.fail(f"non-standard JSON token {token}"))


def _nulls_have_reasons(record: dict, where: str) -> None:
    for key, value in record.items():
        if value is None and not key.endswith("_missing"):
            assert record.get(f"{key}_missing"), f"{where}.{key} is null without a reason"


def test_json_is_strict_and_every_null_has_a_reason(kinds):
    runs = [load_run(d) for d in kinds.values()]
    payload = _strict_json(render(runs, "json"))
    assert '"inf"' not in render(runs, "json") and "Infinity" not in render(runs, "json")
    by_method = {r["method"]: r for r in payload["comparison"]}
    for index, record in enumerate(payload["comparison"]):
        _nulls_have_reasons(record, f"comparison[{index}]")
    for index, run in enumerate(payload["runs"]):
        for row in run["breakdown"]:
            _nulls_have_reasons(row, f"runs[{index}].breakdown")
    targmax = next(r for m, r in by_method.items() if "TARGMAX" in m)
    assert targmax["epsilon@1e-05"] is None and "T-threshold privacy only" in targmax["epsilon@1e-05_missing"]
    assert targmax["perplexity"] is None and "point mass" in targmax["perplexity_missing"]
    assert "epsilon = 0 at every order" in by_method["Public model"]["order@1e-05_missing"]
    assert by_method["PMixED"]["yield_missing"] == "not a voting run"
    dpargmax = next(r for m, r in by_method.items() if "DPARGMAX" in m)
    assert math.isfinite(dpargmax["epsilon@1e-05"]) and dpargmax["yield"] is not None
    # as in every JSON file dpledger writes, each +inf is listed under "nulls" and reads back exactly
    from dpledger.accounting.strict_json import loads_json

    index = next(i for i, r in enumerate(payload["comparison"]) if "TARGMAX" in r["method"])
    assert payload["nulls"][f"/comparison/{index}/epsilon@1e-05"].startswith("+inf: no guarantee")
    assert loads_json(render(runs, "json"))["comparison"][index]["epsilon@1e-05"] == math.inf


def test_json_report_turns_a_perplexity_of_inf_into_null_and_a_reason(kinds):
    run = load_run(kinds["pmixed"])
    run.ledger["perplexity"] = math.inf
    record = _strict_json(render([run], "json"))["comparison"][0]
    assert record["perplexity"] is None and "probability 0" in record["perplexity_missing"]


FORBIDDEN = ("None", "nan", "NaN", "null", "Infinity")


def test_each_tabular_format_spells_missing_one_way(kinds):
    runs = [load_run(d) for d in kinds.values()]
    page = render(runs, "html")
    tables = re.findall(r"<table.*?</table>", page, flags=re.S)
    cells = [c for t in tables for c in re.findall(r"<td[^>]*>(.*?)</td>", t, flags=re.S)]
    assert any(c.startswith("n/a<sup class='fn'>") for c in cells)
    assert not any(c in ("", *FORBIDDEN, "-", "--") for c in cells), sorted(set(cells))
    assert "<ol class='table-notes'>" in page and "T-threshold privacy only" in page
    markdown = render(runs, "md")
    rows = [line for line in markdown.splitlines() if line.startswith("| ") and "---" not in line]
    markdown_cells = [c.strip() for row in rows for c in row.strip("|").split(" | ")]
    assert any(re.fullmatch(r"n/a \[\d+\]", c) for c in markdown_cells)
    assert not any(c in ("", *FORBIDDEN, "-", "--") for c in markdown_cells)
    assert re.search(r"^- \[\d+\] voting runs release a point mass per step", markdown, flags=re.M)
    latex = render(runs, "latex")
    assert "--$^{" in latex and "n/a" not in latex and not any(w in latex for w in FORBIDDEN)
    assert r"$\infty$" in latex  # TARGMAX's epsilon
    labels = re.findall(r"\\label\{([^}]*)\}", latex)  # one per table, none repeated
    assert len(labels) == latex.count(r"\begin{table}") == len(set(labels)) and "tab:dpledger-comparison" in labels
    table = list(csv.reader(io.StringIO(render(runs, "csv"))))
    flat = [cell for row in table for cell in row]
    assert "" in flat and "inf" in flat and not any(c in (*FORBIDDEN, "n/a", "--") for c in flat)


def test_every_json_dumps_in_reports_refuses_nan():
    source = Path(__file__).resolve().parents[1] / "reports"
    for path in source.glob("*.py"):
        text = path.read_text()
        for match in re.finditer(r"json\.dumps\(", text):
            depth, end = 0, match.end() - 1
            for end in range(match.end() - 1, len(text)):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            assert "allow_nan=False" in text[match.start():end], f"{path.name}: {text[match.start():end + 1]}"


def test_sweep_json_is_strict(tmp_path):
    from dpledger.reports.render import strict_json

    text = strict_json([{"point": "lam=1", "epsilon": math.inf, "perplexity": 3.0}], "sweep.json", "no guarantee")
    assert _strict_json(text) == [{"point": "lam=1", "epsilon": None, "epsilon_missing": "+inf: no guarantee",
                                   "perplexity": 3.0}]
    with pytest.raises(ValueError, match=r"sweep.json\[0\].perplexity must be a number, inf or null, got NaN"):
        strict_json([{"perplexity": math.nan}], "sweep.json")


# -- 4. statements say what the ledger charges ----------------------------------------------------

def _statement(kind: str, params: dict, relation: str = "add_or_remove_one", data_dependent: bool = False,
               epsilon: float = 3.0) -> str:
    manifest = {"mechanism": {"type": kind, "params": params}, "orders": [1.5, 2.0], "n_teachers": 8,
                "relation": relation, "config": {"deltas": [1e-5]}, "data": {"stream": "teacher-forced"}}
    ledger = {"epsilon": [{"method": "improved", "delta": 1e-5, "epsilon": epsilon,
                           "order": 2.0 if math.isfinite(epsilon) else None}], "steps": 10,
              "data_dependent": data_dependent, "relation": relation, "accounting": params.get("accounting")}
    return " ".join(privacy_statement(RunData(Path("run"), manifest, ledger, None, [])))


ADA = {key: value for key, value in PAPER_ADAPMIXED.items() if key != "type"}


@pytest.mark.parametrize("kind, params, extra, says, never", [
    ("public", {}, {"epsilon": 0.0}, ["teachers are never read", "epsilon = 0"], ["charged Theorem"]),
    ("ensemble", {}, {"epsilon": math.inf}, ["not private", "No guarantee"], ["Theorem 3.1"]),
    ("pmixed", {"alpha": 6.0, "beta": 0.01}, {}, ["Every step is charged Theorem 3.1", "not guaranteed for every input"],
     ["subsampled"]),
    ("pmixed", {"alpha": 6.0, "beta": 0.01, "ball": "all-orders"}, {}, ["proven at every order"], ["not guaranteed"]),
    ("pmixed", {"alpha": 6.0, "beta": 0.01, "sample_rate": 0.5, "subsampling_variant": "worst-case-size-general"}, {},
     ["subsampled bound of variant 'worst-case-size-general'", "Theorem A.4", "Zhu & Wang 2019", "rate q=0.5"],
     ["Every step is charged Theorem 3.1", "Its per-query bound is Theorem 3.1"]),
    ("pmixed", {"alpha": 6.0, "beta": 0.01, "sample_rate": 0.5, "subsampling_variant": "realised-size"}, {},
     ["not a sound guarantee"], []),
    ("adapmixed", {**ADA, "accounting": "released-output"}, {"data_dependent": True},
     ["screen is charged its RDP (Flemings et al. 2024, Theorem 4.1) at every step", "at every step, the screen passed "
      "or not", "the larger of removing a teacher's (Flemings et al. 2024, Eq. 3) and adding one's"],
     ["realised path", "Theorem 3.1"]),
    ("adapmixed", {**ADA, "accounting": "realised-path"}, {"data_dependent": True, "relation": "remove_one"},
     ["only at the steps where the screen passed", "Screened steps are charged on the realised path",
      "loss of removing a teacher (Flemings et al. 2024, Eq. 3)"], ["add-one", "the screen passed or not"]),
    ("adapmixed", {**ADA, "data_dependent": False, "accounting": "realised-path"}, {},
     ["Theorem 3.1's data-independent bound at every step", "whatever the accounting", "not guaranteed"],
     ["realised path", "data-dependent loss"]),
    ("adapmixed", {**ADA, "screening": False, "accounting": "realised-path"}, {"data_dependent": True},
     ["Without a screening step", "every step is charged the data-dependent loss"],
     ["realised path", "noisy screening test", "screen is charged"]),
    ("voting", {"votes": "coordinated", "aggregator": "targmax", "threshold": 2.0}, {"epsilon": math.inf},
     ["Every step is charged +inf", "Hot PATE"], ["Proposition 8"]),
    ("voting", {"votes": "independent", "aggregator": "tws", "threshold": 2.0, "gamma": 1.0}, {"epsilon": math.inf},
     ["cold PATE", "Every step is charged +inf"], ["votes coordinated"]),
    ("voting", {"votes": "coordinated", "aggregator": "dpargmax", "threshold": 2.0, "sigma": 1.0,
                "sigma_threshold": 1.0, "accounting": "released-output"}, {},
     ["a / (2 sigma_threshold^2)", "Proposition 8", "the screen passed or not"], ["realised path", "Flemings"]),
    ("voting", {"votes": "coordinated", "aggregator": "dpargmax", "threshold": 2.0, "sigma": 1.0,
                "sigma_threshold": 1.0, "accounting": "realised-path", "data_dependent": True}, {"data_dependent": True},
     ["Theorem 6", "only where the screen passed", "Papernot et al. 2018's convention"], ["Flemings"]),
    ("voting", {"votes": "coordinated", "aggregator": "dpws", "threshold": 2.0, "sigma": 1.5, "gamma": 1.0,
                "accounting": "realised-path"}, {}, ["a / sigma^2", "post-processing"], ["realised path"]),
])
def test_each_run_kind_states_what_the_ledger_charges(kind, params, extra, says, never):
    text = _statement(kind, params, **extra)
    assert all(s in text for s in says) and not any(s in text for s in never), text
    assert not any(word in text for word in ("SPEC", "seed file", "notes file"))


# -- 5. plots -------------------------------------------------------------------------------------

@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions make, kept open instead of rendered to PNG."""
    from dpledger.reports import plots

    made = []

    def keep(figure):
        made.append(figure)
        return b"png"

    monkeypatch.setattr(plots, "_png", keep)
    return made


def test_rdp_curve_marks_the_orders_where_it_is_infinite(kinds, figures):
    from dpledger.reports.plots import plot_rdp_curve

    run = load_run(kinds["pmixed"])  # Theorem 3.1 with the one-order ball: +inf above alpha
    orders = run.manifest["orders"]
    values = next(iter(run.ledger["ledger"]["components"].values()))["values"]
    first_infinite = orders[next(i for i, v in enumerate(values) if v in ("inf", math.inf))]
    assert plot_rdp_curve(run) == b"png"
    axis = figures[0].axes[0]
    labels = axis.get_legend_handles_labels()[1]
    assert f"+inf: no guarantee at orders >= {first_infinite:g}" in labels
    assert axis.patches, "no band shades the +inf orders"


def test_titles_are_wrapped_inside_the_figure(kinds, figures):
    from dpledger.reports.plots import plot_cumulative_epsilon

    class LongLabel(RunData):
        label = "Hot PATE DPARGMAX (Confident-GNMax) (T=32, a long method name that goes on and on)"

    plot_cumulative_epsilon(LongLabel(**vars(load_run(kinds["adapmixed"]))))
    figure = figures[0]
    figure.canvas.draw()
    title = figure.axes[0].title
    box = title.get_window_extent(figure.canvas.get_renderer())
    assert "\n" in title.get_text()
    assert box.x0 >= 0 and box.x1 <= figure.bbox.x1 and box.y1 <= figure.bbox.y1


def test_sweep_points_are_joined_in_parameter_order_and_labelled_by_a_legend():
    import pandas as pd

    from dpledger.reports.sweep import sweep_plot, sweep_series

    group = pd.DataFrame({"point": ["lam=0.01, sigma=0.001", "lam=0.0001, sigma=0.01", "lam=0.01, sigma=0.01",
                                    "lam=0.001, sigma=0.01"],
                          "perplexity": [30.1, 40.0, 30.5, 30.6], "epsilon": [500.0, 129.9, 131.0, 130.5]})
    lines = sweep_series(group)
    assert [(label, rows["point"].tolist()) for label, rows in lines] == [
        ("sigma=0.001", ["lam=0.01, sigma=0.001"]),
        ("sigma=0.01", ["lam=0.0001, sigma=0.01", "lam=0.001, sigma=0.01", "lam=0.01, sigma=0.01"])]
    single = pd.DataFrame({"point": ["threshold=8", "threshold=1", "threshold=4.5"], "perplexity": [1.0, 2.0, 3.0],
                           "epsilon": [1.0, 2.0, 3.0]})
    assert sweep_series(single)[0][1]["point"].tolist() == ["threshold=1", "threshold=4.5", "threshold=8"]
    import matplotlib.pyplot as plt

    made = []
    original = plt.Figure.savefig
    plt.Figure.savefig = lambda self, *a, **k: (made.append(self), original(self, *a, **k))[1]
    try:
        assert sweep_plot("lam_sigma", group)[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        plt.Figure.savefig = original
    axis = made[0].axes[0]
    assert not axis.texts  # no per-point text to overlap
    labels = axis.get_legend_handles_labels()[1]
    assert all(point in labels for point in group["point"])
    joined = [line for line in axis.lines if len(line.get_xdata()) > 1]
    assert [list(line.get_xdata()) for line in joined] == [[40.0, 30.6, 30.5]]


def test_the_report_says_what_an_audit_pass_means(kinds):
    # a green PASS beside a large epsilon reads as "private"; the page says it means "verified"
    runs = [load_run(kinds["pmixed"])]
    for output_format in ("html", "md"):
        assert "a verified epsilon is right, not necessarily small" in render(runs, output_format)
