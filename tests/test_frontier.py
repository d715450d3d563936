"""`dpledger frontier` (dpledger.reports.frontier): every variant calibrated to each target before it runs,
rows labelled for what their epsilons hold, calibrations that meet their targets, shared anchors,
resumption without rerunning, out-of-reach rows, strict JSON, and one-line refusals of bad input.

The runs use the session's micro models (tests/micro.py: 3 teachers, V = 320), so the file runs in
about a minute on 2 cores; the slow test runs every variant at the four default budgets."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dpledger.mechanisms.ball import Ball
from dpledger.mechanisms.calibration import calibrate_pmixed
from dpledger.reports import frontier as F

BUDGETS = ((2.0, 1e-5), (8.0, 1e-5), (0.002, 1e-5))
"""Two budgets in reach and one (epsilon 0.002) out of reach for every calibrated variant."""
VARIANTS = ["public", "ensemble", "pmixed-projection-order", "pmixed-all-orders",
            "adapmixed-filter-add-or-remove-one-realised-path", "adapmixed-paper", "hot-dpargmax"]
QUERIES = 24


def micro_embedded(micro_models):
    """The micro models as a build_or_load entry (cached by the micro_models fixture)."""
    from dpledger.decoding.embedded import build_or_load
    from tests.micro import MICRO_CORPUS, MICRO_RECIPE

    return build_or_load(teachers=len(micro_models.teachers), recipe=MICRO_RECIPE, verbose=False, **MICRO_CORPUS)


@pytest.fixture(scope="module")
def frontier(tmp_path_factory, micro_models):
    """(out, frame) of one frontier on the micro models, audited."""
    out = tmp_path_factory.mktemp("frontier") / "out"
    embedded = micro_embedded(micro_models)
    frame = F.run_frontier(out, BUDGETS, QUERIES, len(micro_models.teachers), VARIANTS, progress=False, verbose=False,
                           embedded=embedded)
    return out, frame, embedded


def _rows(frame, variant):
    return [row for _, row in frame.iterrows() if row["variant"] == variant]


def test_every_ball_is_a_pmixed_variant_and_names_are_unique():
    names = F.frontier_variants()
    assert [f"pmixed-{ball.value}" for ball in Ball] == [n for n in names if n.startswith("pmixed-")]
    assert len(set(F.FRONTIER_VARIANTS)) == len(F.FRONTIER_VARIANTS)
    assert {"adapmixed-filter-add-or-remove-one-released-output", "adapmixed-filter-remove-one-realised-path",
            "adapmixed-paper", "hot-dpargmax", "cold-dpargmax", "hot-dpws", "cold-dpws"} <= set(names)


def test_plans_label_each_variant_and_choose_alpha_from_the_target_alone():
    plans = F.plan_frontier(((1.0, 1e-5), (8.0, 1e-5)), 1024, 8)
    by = {(p.variant.name, p.epsilon): p for p in plans}
    assert sum(p.variant.anchor for p in plans) == 2 and by[("public", None)].status == "proven"
    for ball in Ball:
        from dpledger.mechanisms.pmixed import PMixED

        plan = by[(f"pmixed-{ball.value}", 8.0)]
        assert plan.status == ("proven" if PMixED(plan.alpha, plan.value, 8, ball=ball).proven else "as claimed")
    assert by[("pmixed-projection-order", 8.0)].status == "as claimed"
    assert by[("pmixed-all-orders", 8.0)].status == "proven"
    # alpha: the candidate with the largest beta (each candidate calibrated alone)
    def beta(alpha):
        try:
            return calibrate_pmixed(8.0, 1e-5, 1024, alpha, 8, ball="projection-order").value
        except ValueError as error:   # the candidates the target cannot reach are skipped
            assert "out of reach" in str(error)
            return -1.0

    best = max((beta(a), -a) for a in F.ALPHA_CANDIDATES)
    assert by[("pmixed-projection-order", 8.0)].value == best[0] and by[("pmixed-projection-order", 8.0)].alpha == -best[1]
    # the sound AdaPMixED filters take the all-orders PMixED beta of their budget, in a filter of that budget
    for name in F.FRONTIER_VARIANTS:
        if name.startswith("adapmixed-filter-"):
            plan = by[(name, 8.0)]
            assert plan.value == by[("pmixed-all-orders", 8.0)].value and plan.mechanism["ball"] == "all-orders"
            assert plan.budget.epsilon == 8.0 and not plan.budget.data_dependent
    paper = by[("adapmixed-paper", 1.0)]
    assert paper.status == "as claimed" and paper.budget.data_dependent and paper.mechanism["beta"] == 0.2
    assert paper.variant.relation == "remove_one" and paper.mechanism["accounting"] == "realised-path"
    hot = by[("hot-dpargmax", 8.0)]
    assert hot.variant.relation == "replace_one" and hot.threshold == F.voting_threshold(hot.value, 8, 1024)
    assert hot.threshold >= 4.0


def test_rows_are_labelled_for_what_their_epsilons_hold(frontier):
    _, frame, _ = frontier
    assert len(frame) == 2 + (len(VARIANTS) - 2) * len(BUDGETS)
    for row in _rows(frame, "pmixed-projection-order"):
        if row["reason"] is None:
            assert row["status"] == "as claimed" and math.isinf(row["sound_epsilon"])
            assert row["claimed_epsilon"] <= row["target_epsilon"]
    for row in _rows(frame, "adapmixed-paper"):
        if row["reason"] is None:
            assert row["status"] == "as claimed" and math.isinf(row["sound_epsilon"])
            assert row["claimed_epsilon"] == row["target_epsilon"] and "Redberg" in row["guarantee"] + str(
                frame.attrs["reasons"][frame.index[frame["run"] == row["run"]][0]].get("sound_epsilon"))
    for name in ("pmixed-all-orders", "adapmixed-filter-add-or-remove-one-realised-path", "hot-dpargmax"):
        for row in _rows(frame, name):
            if row["reason"] is None:
                assert row["status"] == "proven" and row["claimed_epsilon"] is None
    filtered = [r for r in _rows(frame, "adapmixed-filter-add-or-remove-one-realised-path") if r["reason"] is None]
    assert all(r["sound_epsilon"] == r["target_epsilon"] and r["ledger_data_dependent"] for r in filtered)
    voting = [r for r in _rows(frame, "hot-dpargmax") if r["reason"] is None]
    assert all(r["perplexity"] is None and r["yield"] is not None and r["coverage"] is not None for r in voting)


def test_calibration_meets_each_target_never_above(frontier):
    _, frame, _ = frontier
    checked = 0
    for _, row in frame.iterrows():
        if row["target_epsilon"] is None or row["reason"] is not None:
            continue
        for value in (row["sound_epsilon"], row["claimed_epsilon"]):
            if value is not None and math.isfinite(value):
                assert value <= row["target_epsilon"], (row["variant"], value, row["target_epsilon"])
                checked += 1
        if row["variant"] in ("pmixed-all-orders", "hot-dpargmax"):   # every step charged: spent to within 1%
            assert row["within_target"] and row["ledger_epsilon"] >= 0.99 * row["target_epsilon"]
    assert checked >= 8


def test_anchors_run_once_and_are_shared(frontier):
    out, frame, _ = frontier
    anchors = frame[frame["family"] == "anchor"]
    assert list(anchors["variant"]) == ["public", "ensemble"] and all(t is None for t in anchors["target_epsilon"])
    assert sorted(p.name for p in (out / "runs" / "public").iterdir() if p.is_dir()) == ["replay", "steps"]
    assert anchors["sound_epsilon"].tolist() == [0.0, math.inf]
    best = F.best_by_budget(frame)
    assert [b["target_epsilon"] for b in best] == [0.002, 2.0, 8.0]   # by delta, then epsilon
    public, ensemble = anchors["perplexity"].tolist()
    assert all(b["public_perplexity"] == public and b["ensemble_perplexity"] == ensemble for b in best)
    assert best[1]["best_proven"] is not None and best[0]["best_proven"] is None


def test_out_of_reach_targets_are_rows_with_their_reason(frontier):
    out, frame, _ = frontier
    unreachable = frame[frame["target_epsilon"] == 0.002]
    assert len(unreachable) == len(VARIANTS) - 2
    for _, row in unreachable.iterrows():
        assert "out of reach" in row["reason"] and row["perplexity"] is None and row["trace"] is None
    assert not any((out / "runs").glob("*/eps-0.002_delta-1e-05"))


def test_a_rerun_resumes_without_decoding_or_auditing_again(frontier, monkeypatch):
    out, frame, embedded = frontier
    # every file but the writers' lock, which resuming takes (and which checks the run's config again)
    files = {path: path.stat().st_mtime_ns for path in (out / "runs").rglob("*") if path.is_file() and path.name != ".lock"}
    calls = []
    monkeypatch.setattr(F, "audit_run", lambda *a, **k: calls.append("audit"))
    from dpledger.decoding import run as run_module

    monkeypatch.setattr(run_module, "block_records", lambda *a, **k: calls.append("decode"))
    again = F.run_frontier(out, BUDGETS, QUERIES, len(embedded.teacher_paths), VARIANTS, progress=False, verbose=False,
                           embedded=embedded)
    assert calls == []
    assert {path: path.stat().st_mtime_ns for path in files} == files
    assert again.drop(columns=["seed_commitment"]).equals(frame.drop(columns=["seed_commitment"]))


def test_other_settings_into_the_same_out_are_refused(frontier):
    out, _, embedded = frontier
    with pytest.raises(ValueError, match=r"holds a frontier made with other settings \(queries = 24 there, 16 here\)"):
        F.run_frontier(out, BUDGETS, 16, len(embedded.teacher_paths), VARIANTS, progress=False, verbose=False,
                       embedded=embedded)


def test_files_are_written_and_the_json_is_strict(frontier):
    out, frame, _ = frontier

    def refuse(constant):
        raise ValueError(f"non-strict JSON constant {constant}")

    payload = json.loads((out / "frontier.json").read_text(), parse_constant=refuse)
    rows = payload["rows"]
    ensemble = next(i for i, r in enumerate(rows) if r["variant"] == "ensemble")
    assert rows[ensemble]["sound_epsilon"] is None and f"/rows/{ensemble}/sound_epsilon" in payload["nulls"]
    assert rows[ensemble]["sound_epsilon_missing"].startswith("no guarantee")
    from dpledger.accounting.strict_json import loads_json

    assert math.isinf(loads_json((out / "frontier.json").read_text())["rows"][ensemble]["sound_epsilon"])
    csv = (out / "frontier.csv").read_text()
    assert csv.splitlines()[0].endswith(",notes") and ",inf," in csv and "nan" not in csv.lower().replace("nan-", "")
    tex = (out / "frontier.tex").read_text()
    assert r"\label{tab:dpledger-frontier}" in tex and r"\caption{" in tex and r"$\infty$" in tex
    html = (out / "frontier.html").read_text()
    assert "data:image/png;base64," in html and "not a guarantee" in html and "<script" not in html
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / F.SETTINGS_FILE).read_text())["queries"] == QUERIES


def test_a_nan_never_becomes_a_number(frontier, tmp_path):
    _, frame, _ = frontier
    broken = frame.copy()
    broken.attrs = frame.attrs
    broken.at[broken.index[0], "perplexity"] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        F.write_frontier(broken, tmp_path)


@pytest.mark.parametrize("flags, message", [
    (["--epsilons", "-1"], r"epsilon must be a finite number in \(0, 700\], got -1.0"),
    (["--delta", "2"], r"delta must be in \(0, 1\), got 2"),
    (["--queries", "0"], r"queries must be .*>= 1, got 0"),
    (["--teachers", "1"], r"teachers must be .*>= 2, got 1"),
    (["--variants", "pmixed-nowhere"], r"unknown frontier variant 'pmixed-nowhere'; known: public, ensemble"),
])
def test_cli_refuses_bad_input_in_one_line(flags, message, tmp_path, capsys):
    from dpledger.cli import main

    out = tmp_path / "out"
    assert main(["frontier", "--out", str(out), *flags]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("dpledger frontier: error: ")
    import re

    assert re.search(message, error), error
    assert not out.exists()


def test_the_command_is_registered():
    from dpledger.cli import build_parser

    args = build_parser().parse_args(["frontier", "--epsilons", "1", "2", "--no-audit"])
    assert args.command == "frontier" and args.epsilons == [1.0, 2.0] and args.no_audit


@pytest.mark.slow
def test_every_variant_at_the_four_default_budgets(tmp_path, micro_models):
    embedded = micro_embedded(micro_models)
    frame = F.run_frontier(tmp_path / "out", F.DEFAULT_BUDGETS, 32, len(micro_models.teachers), progress=False,
                           verbose=False, embedded=embedded)
    assert len(frame) == 2 + (len(F.FRONTIER_VARIANTS) - 2) * len(F.DEFAULT_BUDGETS)
    for _, row in frame.iterrows():
        if row["target_epsilon"] is not None and row["reason"] is None:
            assert row["audit_verdict"] in ("PASS", "FAIL", "UNVERIFIED")
            if math.isfinite(row["sound_epsilon"]):
                assert row["sound_epsilon"] <= row["target_epsilon"]
    assert Path(tmp_path / "out" / "frontier.html").exists()


def test_the_package_level_run_frontier_is_the_reports_one():
    """dpledger.run_frontier forwards to dpledger.reports.frontier.run_frontier with the same parameters and
    defaults (it is defined apart so that `import dpledger` stays light)."""
    import inspect

    import dpledger

    assert inspect.signature(dpledger.run_frontier).parameters.keys() == inspect.signature(
        F.run_frontier).parameters.keys()
    for name, parameter in inspect.signature(dpledger.run_frontier).parameters.items():
        assert parameter.default == inspect.signature(F.run_frontier).parameters[name].default, name


def test_voting_coverage_reads_the_payload_at_the_runs_threshold(tmp_path, micro_models):
    """Coverage (Cohen et al. 2023) from the run's replay payload: in [0, 1], no smaller at a lower
    threshold, and 0 without drawing when T exceeds N."""
    from dpledger.decoding.config import DataConfig, ModelsConfig, RunConfig
    from dpledger.decoding.run import run_decode
    from dpledger.reports.run_data import load_run

    models = ModelsConfig(embedded=False, teachers=len(micro_models.teachers), public=str(micro_models.public),
                          teacher_paths=tuple(str(p) for p in micro_models.teachers),
                          tokenizer=str(micro_models.tokenizer))

    def coverage(threshold: float, name: str, payload_format: str = "logits") -> tuple[float | None, str | None]:
        mechanism = {"type": "voting", "votes": "coordinated", "aggregator": "dpargmax", "threshold": threshold,
                     "sigma": 1.0, "sigma_threshold": 1.0}
        config = RunConfig(out=str(tmp_path / name), mechanism=mechanism, models=models, queries=20,
                           data=DataConfig(text=str(micro_models.heldout_text), block_size=16), relation="replace_one",
                           replay_payload_format=payload_format)
        run_decode(config, progress=False, verbose=False)
        return F.voting_coverage(load_run(tmp_path / name), samples=16)

    (low, _), (high, _), (above, _) = coverage(1.0, "t1"), coverage(3.0, "t3"), coverage(3.5, "t4")
    assert low is not None and high is not None and 0.0 < high <= low <= 1.0
    assert above == 0.0   # ceil(3.5) = 4 > N = 3 votes: no count reaches it
    # the bounded vote payload keeps the votes, not the distributions coverage reads
    assert coverage(1.0, "bounded", "bounded") == (None, "the run keeps the bounded vote payload, not the teachers' "
                                                         "distributions")
