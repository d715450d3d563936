"""Command-line conventions: --version, a closed pipe, missing keys named at once."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_cli_version_closed_pipe_and_missing_mechanism_keys_at_once(tmp_path):
    """--version; a reader that closes the pipe early ends the command cleanly (exit 0, no
    traceback); every missing [mechanism] key is named at once."""
    from dpledger.decoding.runners import build_runner

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    version = subprocess.run([sys.executable, "-m", "dpledger", "--version"], env=env, capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("dpledger ")
    piped = subprocess.run(f"{sys.executable} -m dpledger account gaussian --noise-multiplier 1 --queries 10 "
                           f"--delta 1e-5 --json | head -c 1", shell=True, env=env, capture_output=True, text=True)
    assert piped.stderr == "" and "Traceback" not in piped.stderr
    with pytest.raises(ValueError, match=r"mechanism 'adapmixed' needs beta, lam, sigma, threshold, top_k"):
        build_runner({"type": "adapmixed", "alpha": 18.0}, 3)
    with pytest.raises(ValueError, match=r"mechanism 'voting' needs votes, aggregator"):
        build_runner({"type": "voting"}, 3)   # and the keys every registered aggregator needs (threshold today)
    with pytest.raises(ValueError, match=r"sigma, threshold are required for aggregator dpws"):
        build_runner({"type": "voting", "votes": "coordinated", "aggregator": "dpws"}, 3)


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_embedded_default_trains_the_teacher_kind_the_config_names(kind, monkeypatch, tmp_path):
    """embedded = true with teacher_kind = "lora" used to train full teachers while the manifest said lora."""
    from dpledger.decoding import blocks
    from dpledger.decoding.config import config_from_dict

    asked = {}

    def capture(teachers, recipe, verbose):
        asked["recipe"] = recipe
        raise RuntimeError("stop after the recipe is chosen")

    monkeypatch.setattr(blocks, "build_or_load", capture)  # the name prepare() calls
    config = config_from_dict({"run": {"out": str(tmp_path / "run")}, "mechanism": {"type": "public"},
                               "models": {"embedded": True, "teachers": 2, "teacher_kind": kind}})
    with pytest.raises(RuntimeError, match="stop after"):
        blocks.prepare(config, verbose=False)
    assert asked["recipe"].teacher_kind == kind


def test_audit_and_report_accept_a_folder_of_runs(micro_models, tmp_path, capsys):
    from dpledger.decoding.config import config_from_dict
    from dpledger.decoding.run import run_decode
    from dpledger.cli import main
    from tests.micro import micro_config

    for name in ("b-voting", "a-public"):
        mechanism = ({"type": "voting", "votes": "coordinated", "aggregator": "targmax", "threshold": 2}
                     if name == "b-voting" else {"type": "public"})
        run_decode(config_from_dict(micro_config(micro_models, tmp_path / "runs" / name, mechanism, queries=8,
                                                 block_size=8)), progress=False, verbose=False)
    assert main(["report", str(tmp_path / "runs"), "--format", "csv"]) == 0
    rows = capsys.readouterr().out
    assert "Public model" in rows and "Hot PATE TARGMAX_T" in rows
    assert main(["audit", str(tmp_path / "runs"), "--no-game"]) == 0
    out = capsys.readouterr().out
    assert out.index("a-public") < out.index("b-voting")
    assert main(["report", str(tmp_path / "empty-folder"), "--format", "md"]) == 2


@pytest.mark.parametrize("params, says, never", [
    ({}, ["noisy screening test", "data-dependent loss"], ["Without a screening step", "Theorem 3.1"]),
    ({"data_dependent": False}, ["noisy screening test", "Theorem 3.1's data-independent bound"], ["data-dependent loss"]),
    ({"screening": False}, ["Without a screening step", "data-dependent loss"], ["noisy screening test"]),
])
def test_adapmixed_statements_describe_each_ablation(params, says, never):
    """The ablations' statements no longer describe a screen or a charge they do not have."""
    from dpledger.reports.run_data import RunData
    from dpledger.reports.statement import privacy_statement

    from tests.micro import PAPER_ADAPMIXED

    paper = {key: value for key, value in PAPER_ADAPMIXED.items() if key != "type"}
    manifest = {"mechanism": {"type": "adapmixed", "params": {**paper, **params}},
                "orders": [1.5, 2.0], "n_teachers": 8, "relation": "add_or_remove_one", "config": {"deltas": [1e-5]}}
    ledger = {"epsilon": [{"method": "improved", "delta": 1e-5, "epsilon": 3.0, "order": 2.0}], "steps": 10,
              "data_dependent": params.get("data_dependent", True), "relation": "add_or_remove_one"}
    text = privacy_statement(RunData(Path("run"), manifest, ledger, None, []))[0]
    assert all(s in text for s in says) and not any(s in text for s in never), text


def test_the_comparison_table_shows_every_requested_delta(micro_models, tmp_path):
    from dpledger.decoding.config import config_from_dict
    from dpledger.decoding.run import run_decode
    from dpledger.reports import load_run, render
    from dpledger.reports.tables import comparison_table
    from tests.micro import micro_config

    config = micro_config(micro_models, tmp_path / "run", {"type": "pmixed", "alpha": 6.0, "beta": 0.05}, queries=8,
                          block_size=8, deltas=[1e-5, 1e-6, 1e-8])
    result = run_decode(config_from_dict(config), progress=False, verbose=False)
    run = load_run(result.directory)
    table = comparison_table([run])
    by_delta = {e["delta"]: e["epsilon"] for e in result.summary["epsilon"] if e["method"] == "improved"}
    assert table.loc[0, "epsilon@1e-05"] == by_delta[1e-5]
    assert table.loc[0, "epsilon@1e-06"] == by_delta[1e-6]
    assert table.loc[0, "epsilon@1e-08"] == by_delta[1e-8] > by_delta[1e-6]
    other = run_decode(config_from_dict(micro_config(micro_models, tmp_path / "other", {"type": "public"}, queries=8,
                                                     block_size=8)), progress=False, verbose=False)
    for output_format in ("md", "html", "json", "latex"):  # a run without the column shows it missing, never NaN
        assert "1e-08" in render([run, load_run(other.directory)], output_format)


SHIPPED_TEXT = [*REPO.glob("*.md"), *(REPO / "docs").glob("*.md"), *(REPO / "examples").rglob("*.toml"),
                *(p for package in ("accounting", "mechanisms", "decoding", "audit", "reports", "dpledger")
                  for p in (REPO / package).glob("*.py"))]


@pytest.mark.parametrize("pattern", [r"\bSPEC\b", r"SPEC\.md", r"\bseeds?/",
                                     r"\bseed'?s? (Eq|Theorem|section|Lemma|Algorithm|Table|Appendix|Definition|Proposition|Figure)",
                                     r"notes_feasibility", r"\bnotes section", r"\.\./shared"])
def test_shipped_text_cites_no_file_that_does_not_ship(pattern):
    hits = [f"{path}:{number}" for path in SHIPPED_TEXT
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if re.search(pattern, line)]
    assert not hits, f"{pattern!r} in {hits[:10]}"


def test_every_pitfall_number_cited_is_a_section_of_docs_pitfalls_and_matches_the_lint():
    from dpledger.audit import lint
    from dpledger.decoding.utility import PITFALL_TITLES

    sections = dict(re.findall(r"^## (\d+)\. (.+)$", (REPO / "docs" / "pitfalls.md").read_text(), re.M))
    titles = dict(re.findall(r"Finding\((\d+), \"([^\"]+)\"", Path(lint.__file__).read_text()))
    titles.update({str(number): title for number, title in PITFALL_TITLES.items()})  # the utility pitfalls
    assert sections == titles, "docs/pitfalls.md and audit/lint.py must number and name the same pitfalls"
    for path in SHIPPED_TEXT:
        for number in re.findall(r"[Pp]itfalls? (\d+)", path.read_text(encoding="utf-8")):
            assert number in sections, f"{path} cites pitfall {number}, which docs/pitfalls.md does not have"
