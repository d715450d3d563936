"""Reports: tables come from ledger.json / audit.json, rows sum to the total, every format renders,
the HTML opens in headless Chromium with every image loaded."""
import json
import shutil

import pytest

from dpledger.audit import audit_run
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode
from dpledger.cli import main
from dpledger.reports import load_run, render
from dpledger.reports.tables import breakdown_table, comparison_table
from tests.micro import ADAPMIXED, micro_config



@pytest.fixture(scope="module")
def runs(micro_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("reported")
    made = {}
    for name, mechanism in {"public": {"type": "public"}, "pmixed": {"type": "pmixed", "alpha": 6.0, "beta": 0.01},
                            "adapmixed": ADAPMIXED}.items():
        config = config_from_dict(micro_config(micro_models, root / name, mechanism, queries=64))
        made[name] = run_decode(config, progress=False, verbose=False).directory
    audit_run(made["adapmixed"], mc_samples=50, play_game=False)
    return made


def test_breakdown_rows_sum_to_the_total_shown(runs):
    for directory in runs.values():
        frame = breakdown_table(load_run(directory))
        assert frame["epsilon"].iloc[:-1].sum() == pytest.approx(frame["epsilon"].iloc[-1], abs=1e-12)


def test_tables_show_the_ledger_values_not_a_recomputation(runs, tmp_path):
    copy = tmp_path / "edited"
    shutil.copytree(runs["pmixed"], copy)
    ledger = json.loads((copy / "ledger.json").read_text())
    for entry in ledger["epsilon"]:
        entry["epsilon"] = 12345.678
    (copy / "ledger.json").write_text(json.dumps(ledger))
    assert comparison_table([load_run(copy)])["epsilon@1e-05"].iloc[0] == 12345.678
    assert "12346" in render([load_run(copy)], "md")


def test_breakdown_that_does_not_sum_is_refused(runs, tmp_path):
    copy = tmp_path / "broken"
    shutil.copytree(runs["pmixed"], copy)
    ledger = json.loads((copy / "ledger.json").read_text())
    ledger["breakdown"]["rows"][0]["epsilon"] += 1.0
    (copy / "ledger.json").write_text(json.dumps(ledger))
    with pytest.raises(ValueError, match="sum to"):
        render([load_run(copy)], "md")


def test_cumulative_plot_ends_at_the_ledger_epsilon(runs):
    from dpledger.reports.plots import _charged, cumulative_epsilon_series

    run = load_run(runs["adapmixed"])
    steps, epsilons = cumulative_epsilon_series(run, _charged(run))
    assert steps[-1] == run.ledger["steps"]
    assert epsilons[-1] == pytest.approx(run.epsilon()["epsilon"], rel=1e-12)


def test_report_without_audit_says_so(runs):
    text = render([load_run(runs["pmixed"])], "md")
    assert "not audited" in text and "has not been audited: no verdict is available" in text
    assert "Audit verdict" not in text
    audited = render([load_run(runs["adapmixed"])], "md")
    assert "Audit verdict: PASS" in audited and "Data-dependent. This epsilon is computed from the private data" in audited


@pytest.mark.parametrize("fmt, marker", [("md", "| component |"), ("json", '"comparison"'),
                                         ("latex", r"\begin{tabular}"), ("csv", "run,method,table,row,epsilon")])
def test_every_format_renders(runs, fmt, marker, capsys):
    assert main(["report", *map(str, runs.values()), "--format", fmt]) == 0
    assert marker in capsys.readouterr().out


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_html_report_opens_in_headless_chromium_with_every_image_loaded(runs, tmp_path):
    from playwright.sync_api import sync_playwright

    out = tmp_path / "report.html"
    assert main(["report", *map(str, runs.values()), "--format", "html", "--out", str(out)]) == 0
    assert "http" not in out.read_text().split("<body>")[1].split("data:image")[0]  # nothing to fetch
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page()
        page.goto(out.as_uri())
        page.wait_for_load_state("load")
        images = page.evaluate("Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])")
        tables = page.evaluate("Array.from(document.querySelectorAll('table')).map(t => t.className)")
        headings = page.evaluate("Array.from(document.querySelectorAll('h2')).map(h => h.textContent)")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        browser.close()
    assert len(images) >= 8 and all(complete and width > 0 for _, complete, width in images), images
    assert tables.count("comparison") == 1 and tables.count("breakdown") == 3 and "checks" in tables
    assert any("AdaPMixED" in h and "PASS" in h for h in headings)


def test_direction_labels_refuse_a_value_that_names_no_direction():
    """A tampered or unknown "direction" in ledger.json must not read as "both" (claiming more)."""
    from dpledger.reports.tables import direction_label

    assert direction_label(None) == "both" and direction_label("both") == "both"
    assert direction_label("from_actual") == "D(M(D)||M(D')) only"
    with pytest.raises(ValueError, match="'forward' is not a valid DivergenceDirection"):
        direction_label("forward")
