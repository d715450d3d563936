"""The privacy filter in decoding: `[budget] epsilon, delta` (dpledger.decoding.budget, dpledger.accounting.budget)."""
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dpledger.accounting.budget import FILTER_MARGIN, RenyiFilter
from dpledger.accounting.conversion import ConversionMethod, conversion_terms, epsilon_from_rdp
from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.orders import default_orders
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.audit import audit_run
from dpledger.decoding import trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode
from dpledger.mechanisms import PMixED
from tests.micro import kill_and_resume, micro_config

PMIXED = {"type": "pmixed", "alpha": 6.0, "beta": 0.002}
AUDIT = dict(mc_samples=20, game_trials=50, play_game=False)


def decode(micro_models, out: Path, mechanism: dict, budget: dict, queries: int = 48, block_size: int = 16, **data):
    config = micro_config(micro_models, out, mechanism, queries=queries, block_size=block_size)
    config["budget"] = budget
    config["data"].update(data)
    if data.get("stream") == "generate":
        config["data"].pop("text")
    return run_decode(config_from_dict(config), progress=False, verbose=False)


# -- the filter itself ------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(epsilon=st.floats(0.05, 50), delta=st.sampled_from([1e-3, 1e-5, 1e-8]), alpha=st.sampled_from([2.0, 6.0, 18.0]),
       beta=st.floats(1e-4, 0.05), teachers=st.integers(2, 200))
def test_a_planned_filter_stops_where_the_next_step_would_exceed_and_never_above_epsilon(epsilon, delta, alpha, beta,
                                                                                        teachers):
    orders = np.asarray(default_orders(alpha))
    bound = PMixED(alpha, beta, teachers).rdp_values(orders)
    try:
        renyi = RenyiFilter.plan(epsilon, delta, bound, orders)
    except ValueError:  # the conversion alone exceeds epsilon at every order
        assert np.all(epsilon - conversion_terms(orders, delta, ConversionMethod.IMPROVED) <= 0)
        return
    k = int(np.flatnonzero(orders == renyi.order)[0])
    # the order affords the most steps of any order on the grid
    budgets = (epsilon - conversion_terms(orders, delta, ConversionMethod.IMPROVED)) * (1 - FILTER_MARGIN)
    with np.errstate(divide="ignore"):
        best = np.max(np.where(budgets > 0, np.floor(budgets / bound), -1))
    assume(best <= 20_000)  # the loop below is one filter step per answered query
    answered = 0
    while renyi.fits(bound[k]):
        renyi.spend(bound[k])
        answered += 1
    assert not renyi.fits(bound[k])  # the next step would exceed
    assert abs(answered - best) <= 1  # floor(budget / bound) up to the rounding of a running sum
    # what was answered, composed and converted like a ledger, is within the target
    curve = RdpCurve(orders, bound * answered if answered else np.zeros_like(bound), NeighbouringRelation.ADD_OR_REMOVE_ONE)
    assert epsilon_from_rdp(curve, delta).epsilon <= epsilon


def test_a_budget_that_the_conversion_alone_exceeds_is_refused():
    orders = np.asarray(default_orders())
    with pytest.raises(ValueError, match="leaves no RDP budget at any order"):
        RenyiFilter.plan(1e-3, 1e-10, np.full(orders.shape, 0.1), orders)


# -- decode, resume, audit --------------------------------------------------------------------------

def test_decode_answers_privately_until_the_budget_then_publicly_at_no_cost(micro_models, tmp_path):
    result = decode(micro_models, tmp_path / "run", PMIXED, {"epsilon": 2.0, "delta": 1e-5})
    manifest, records = trace.read_manifest(result.directory), trace.read_records(result.directory)
    plan = manifest["budget"]
    refused = [r["budget_refused"] for r in records]
    answered = plan["affordable_steps"]
    assert 0 < answered < len(records) and refused == [False] * answered + [True] * (len(records) - answered)
    for record in records[answered:]:
        assert record["answered_by"] == "public" and record["budget_charge"] == 0.0
        assert all(v == 0 for v in record["rdp_pmixed_theorem_3_1"])
    spent = sum(r["budget_charge"] for r in records)
    assert spent <= plan["rdp_budget"] < spent + plan["step_bound_at_order"]  # the next step would have exceeded
    summary = result.summary
    assert summary["budget"]["private_answers"] == answered and summary["budget"]["refused_steps"] == 48 - answered
    assert summary["epsilon"][0]["epsilon"] <= 2.0 and summary["budget"]["epsilon_spent_at_order"] <= 2.0
    assert summary["answered_by_public"] == 48 - answered
    report = audit_run(result.directory, **AUDIT)
    assert report.verdict == "PASS", report.to_dict()
    assert any(c.name == "budget_filter" and c.status.value == "PASS" for c in report.checks)


def test_a_killed_budget_run_resumes_to_the_same_stopping_point(micro_models, tmp_path):
    config = micro_config(micro_models, tmp_path / "reference", PMIXED, queries=48, block_size=8)
    config["budget"] = {"epsilon": 2.0, "delta": 1e-5}
    reference = run_decode(config_from_dict(config), progress=False, verbose=False)
    resumed, killed, committed = kill_and_resume(config, tmp_path, chunk=1)
    assert resumed.returncode == 0, resumed.stderr
    assert 0 < committed < 48
    def content(run_dir):  # the chain hashes differ (each manifest has its own start time); nothing else may
        return json.dumps([{k: v for k, v in r.items() if k not in ("prev_hash", "record_hash")}
                           for r in trace.read_records(run_dir)], sort_keys=True)

    assert content(killed) == content(reference.directory)
    assert trace.read_ledger(killed)["budget"] == reference.summary["budget"]
    assert any(r["budget_refused"] for r in trace.read_records(killed))


def test_a_broken_filter_that_answers_past_the_budget_fails_the_audit(micro_models, tmp_path, monkeypatch):
    def spend_always(self, charge):  # a broken filter: spends whatever the budget says
        self._spent.add(charge)
        return True

    monkeypatch.setattr(RenyiFilter, "spend_if_fits", spend_always)
    result = decode(micro_models, tmp_path / "run", PMIXED, {"epsilon": 2.0, "delta": 1e-5})
    monkeypatch.undo()
    assert not any(r["budget_refused"] for r in trace.read_records(result.directory))
    report = audit_run(result.directory, **AUDIT)
    failed = {c.name for c in report.checks if c.status.value == "FAIL"}
    assert report.verdict == "FAIL" and {"budget_filter", "replay"} <= failed


def test_data_dependent_charges_drive_the_filter_only_on_request_and_are_labelled(micro_models, tmp_path):
    mechanism = {"type": "adapmixed", "alpha": 6.0, "beta": 0.05, "lam": 0.5, "sigma": 0.05, "threshold": 1e9,
                 "top_k": 16, "screening": False}
    result = decode(micro_models, tmp_path / "run", mechanism, {"epsilon": 1.0, "delta": 1e-5, "data_dependent": True})
    budget = result.summary["budget"]
    assert budget["data_dependent"] and "leaks private information (Redberg et al. 2023)" in budget["guarantee"]
    manifest = trace.read_manifest(result.directory)
    assert manifest["budget"]["data_dependent"] is True and "leaks" in manifest["budget"]["label"]
    records = trace.read_records(result.directory)
    answered = [r for r in records if not r["budget_refused"]]
    k = trace.read_manifest(result.directory)["orders"].index(budget["order"])
    for record in answered:
        assert record["budget_charge"] == pytest.approx(record["rdp_pmixed_data_dependent"][k], rel=1e-12)
    report = audit_run(result.directory, **AUDIT)
    assert report.verdict == "PASS"
    ablation = next(c for c in report.checks if c.name == "neighbour_ablation")
    assert ablation.status.value == "SKIPPED" and "driven by data-dependent losses" in ablation.detail
    finding = next(f for f in report.findings if f.pitfall == 6)
    assert finding.applies and finding.severity == "high" and "Redberg et al. 2023" in finding.reason


def test_voting_and_free_generation_runs_keep_their_audits_under_a_budget(micro_models, tmp_path):
    dpargmax = {"type": "voting", "votes": "coordinated", "aggregator": "dpargmax", "threshold": 2.0, "sigma": 2.0,
                "sigma_threshold": 2.0}
    voting = decode(micro_models, tmp_path / "voting", dpargmax, {"epsilon": 6.0, "delta": 1e-5}, queries=32)
    assert 0 < voting.summary["budget"]["refused_steps"] < 32
    assert audit_run(voting.directory, **AUDIT).verdict == "PASS"
    from dpledger.reports import load_run, render
    from dpledger.reports.plots import plot_cumulative_epsilon

    text = render([load_run(voting.directory)], "md")
    refused = voting.summary["budget"]["refused_steps"]
    assert "Budget. A Renyi privacy filter at order" in text and f"{refused} of 32 queries were answered by the " \
        "public model at no cost" in text
    assert "PLD. dp-accounting's privacy-loss-distribution accountant" in text
    assert plot_cumulative_epsilon(load_run(voting.directory)) is not None
    generated = decode(micro_models, tmp_path / "generate", PMIXED, {"epsilon": 2.0, "delta": 1e-5}, queries=24,
                       block_size=8, stream="generate", prompts=["Customer: Hi", "Agent: Hello"], max_new_tokens=8)
    assert 0 < generated.summary["budget"]["refused_steps"] < 24
    assert audit_run(generated.directory, **AUDIT).verdict == "PASS"


def test_the_non_private_ensemble_under_a_budget_answers_everything_publicly(micro_models, tmp_path):
    result = decode(micro_models, tmp_path / "run", {"type": "ensemble"}, {"epsilon": 5.0}, queries=16)
    assert result.summary["budget"]["refused_steps"] == 16 and result.summary["epsilon"][0]["epsilon"] == 0.0


@pytest.mark.parametrize("budget, message", [
    ({"delta": 1e-5}, "[budget] needs `epsilon`"),
    ({"epsilon": -1.0}, "budget.epsilon must be a finite number > 0, got -1.0"),
    ({"epsilon": 1.0, "delta": 2.0}, "budget.delta must be in (0, 1), got 2"),
    ({"epsilon": 1.0, "order": 1.0}, "budget.order must be a finite number > 1, got 1.0"),
    ({"epsilon": 1.0, "colour": "red"}, "unknown keys in [budget]: ['colour']"),
    ({"epsilon": "8"}, "budget.epsilon must be a number, got '8'"),
    # off the grid: the value, the grid in few words and the nearest orders (alpha = 6 is on the grid)
    ({"epsilon": 1.0, "order": 6.05}, "budget.order = 6.05 is not on the run's order grid (1.1 to 11 by 0.1, 12 to 63 "
                                      "by 1, 128, 256, 512, 1024); the nearest: 6 and 6.1"),
    ({"epsilon": 1.0, "order": 2000.0}, "budget.order = 2000 is not on the run's order grid (1.1 to 11 by 0.1, 12 to "
                                        "63 by 1, 128, 256, 512, 1024); the nearest: 1024"),
])
def test_bad_budgets_are_one_line_errors(micro_models, tmp_path, budget, message):
    config = micro_config(micro_models, tmp_path / "run", PMIXED, queries=8)
    config["budget"] = budget
    with pytest.raises(ValueError) as error:
        config_from_dict(config)
    assert message in str(error.value)


def test_the_filter_plan_names_an_order_off_the_grid_and_lists_the_grid():
    from dpledger.decoding.budget import BudgetGate

    orders = np.asarray(default_orders(6.55))  # a mechanism run at alpha = 6.55 adds it to the grid
    with pytest.raises(ValueError, match=r"^budget.order = 6.57 is not on the run's order grid \(1.1 to 6.5 by 0.1, "
                                         r"6.55, 6.6 to 11 by 0.1, 12 to 63 by 1, 128, 256, 512, 1024\); the nearest: "
                                         r"6.55 and 6.6$"):
        BudgetGate.plan({"epsilon": 8.0, "delta": 1e-5, "order": 6.57}, np.full(orders.size, 0.01), orders)
    gate = BudgetGate.plan({"epsilon": 8.0, "delta": 1e-5, "order": 6.55 + 1e-12}, np.full(orders.size, 0.01), orders)
    assert gate.filter.order == 6.55


# -- PLD beside RDP for runs, and the ledger's DpEvent ------------------------------------------------

def test_a_dpargmax_run_reports_pld_beside_rdp_and_exports_an_event_that_reimports_to_its_curve(micro_models, tmp_path,
                                                                                               capsys):
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    from dpledger.cli import main
    from dpledger.mechanisms.dp_events import mechanism_from_dp_event, read_dp_event_json
    from dpledger.mechanisms.pld import PLD_VALUE_DISCRETIZATION_INTERVAL, simplified_event
    from dpledger.accounting.strict_json import strict_json_text

    mechanism = {"type": "voting", "votes": "coordinated", "aggregator": "dpargmax", "threshold": 2.0, "sigma": 4.0,
                 "sigma_threshold": 4.0}
    config = micro_config(micro_models, tmp_path / "run", mechanism, queries=24, block_size=8, deltas=[1e-5, 1e-6])
    result = run_decode(config_from_dict(config), progress=False, verbose=False)
    pld = trace.read_ledger(result.directory)["pld"]
    assert pld["available"] and [row["delta"] for row in pld["epsilon"]] == [1e-5, 1e-6]
    event, relation = read_dp_event_json(strict_json_text(pld["dp_event_file"]))
    # re-imported, the event is exactly the ledger's composed curve
    curve = mechanism_from_dp_event(event, relation).rdp_curve(result.summary["ledger"]["orders"])
    components = result.summary["ledger"]["components"].values()
    total = np.sum([np.asarray(c["values"], dtype=np.float64) for c in components], axis=0)
    np.testing.assert_allclose(curve.values, total, rtol=1e-12)
    # its PLD epsilon is dp-accounting's PLDAccountant on the event with its Gaussians merged into the one
    # Gaussian they compose to exactly (dpledger.mechanisms.pld.simplified_event), and within 1e-6 of (never above)
    # the accountant on the raw composition, which adds a discretisation error per part
    exact, raw = (PLDAccountant(value_discretization_interval=PLD_VALUE_DISCRETIZATION_INTERVAL) for _ in range(2))
    exact.compose(simplified_event(event))
    raw.compose(event)
    for row in pld["epsilon"]:
        assert row["pld_epsilon"] == pytest.approx(exact.get_epsilon(row["delta"]), rel=1e-12)
        assert row["pld_epsilon"] <= raw.get_epsilon(row["delta"]) * (1 + 1e-12)
        assert row["pld_epsilon"] == pytest.approx(raw.get_epsilon(row["delta"]), rel=1e-6)
        assert row["tighter"] == ("pld" if row["pld_epsilon"] < row["rdp_epsilon"] else "rdp")
    rdp = {e["delta"]: e["epsilon"] for e in result.summary["epsilon"] if e["method"] == "improved"}
    assert all(row["rdp_epsilon"] == rdp[row["delta"]] for row in pld["epsilon"])
    # the CLI reads the run's ledger.json as an event file
    assert main(["account", "from-event", str(result.directory / "ledger.json"), "--delta", "1e-5", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["pld_epsilon"] == pytest.approx(pld["epsilon"][0]["pld_epsilon"], rel=1e-12)
    assert record["epsilon"] == pytest.approx(rdp[1e-5], rel=1e-9)
    assert isinstance(event, dp_accounting.SelfComposedDpEvent) and event.count == 24


@pytest.mark.parametrize("mechanism, reason", [
    (PMIXED, "PMixED has no privacy loss distribution in dp-accounting"),
    ({"type": "voting", "votes": "coordinated", "aggregator": "targmax", "threshold": 2}, "no DP guarantee"),
])
def test_runs_without_a_pld_say_why(micro_models, tmp_path, mechanism, reason):
    config = micro_config(micro_models, tmp_path / "run", mechanism, queries=8, block_size=8)
    summary = run_decode(config_from_dict(config), progress=False, verbose=False).summary
    assert summary["pld"]["available"] is False and reason in summary["pld"]["reason"]


@pytest.mark.parametrize("ball", ["projection-order", "all-orders"])
def test_adapmixed_under_a_data_independent_budget_states_what_the_guarantee_rests_on(micro_models, tmp_path, ball):
    # the filter charges screen + Theorem 3.1; the ledger's data-dependent loss (with the loose add-one bound)
    # is a separate measurement that may exceed the budget, and the guarantee text says both
    mechanism = {"type": "adapmixed", "alpha": 6.0, "beta": 0.002, "lam": 0.5, "sigma": 4.0, "threshold": 0.3,
                 "top_k": 16, "ball": ball}
    result = decode(micro_models, tmp_path / ball, mechanism, {"epsilon": 4.0, "delta": 1e-5}, queries=32)
    guarantee = result.summary["budget"]["guarantee"]
    assert "may exceed the budget" in guarantee and "it is not the guarantee" in guarantee
    assert ("Theorem 3.1 as claimed" in guarantee) == (ball == "projection-order")
    report = audit_run(result.directory, **AUDIT)
    assert report.verdict == "PASS", [c.to_dict() for c in report.failed]


def test_a_subsampled_pmixed_budget_names_an_unproven_variant():
    from dpledger.decoding.totals import step_bound_caveat

    assert "realised-size, not a proven bound" in step_bound_caveat(
        "pmixed", {"subsampling_variant": "realised-size", "sample_rate": 0.1})
    assert step_bound_caveat("pmixed", {"subsampling_variant": "all-orders-ball", "ball": "all-orders"}) == ""


def test_a_run_whose_composed_noise_is_too_small_for_the_pld_grid_exports_its_event_without_a_pld(micro_models,
                                                                                                  tmp_path, capsys):
    # GNMax sigma 1 over 200 steps composes to a noise multiplier ~0.05: dp-accounting would take minutes
    from dpledger.cli import main

    mechanism = {"type": "voting", "votes": "coordinated", "aggregator": "dpargmax", "threshold": 2.0, "sigma": 1.0,
                 "sigma_threshold": 1.0}
    config = micro_config(micro_models, tmp_path / "run", mechanism, queries=200, block_size=50, replay_payload=False)
    result = run_decode(config_from_dict(config), progress=False, verbose=False)
    pld = result.summary["pld"]
    assert pld["available"] is False and "RDP only" in pld["reason"] and "dp_event_file" in pld
    assert main(["account", "from-event", str(result.directory / "ledger.json"), "--delta", "1e-5", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["pld_epsilon"] is None and "below 0.25" in record["pld_unavailable"]
    assert record["epsilon"] == pytest.approx(result.summary["epsilon"][0]["epsilon"], rel=1e-9)


def test_decode_prints_what_the_budget_did(micro_models, tmp_path, capsys):
    from dpledger.cli import main
    from tests.micro import write_toml

    config = micro_config(micro_models, tmp_path / "run", PMIXED, queries=32, block_size=16)
    config["budget"] = {"epsilon": 2.0, "delta": 1e-5}
    assert main(["decode", str(write_toml(tmp_path / "run.toml", config)), "--no-progress"]) == 0
    out = capsys.readouterr().out
    answered = trace.read_manifest(tmp_path / "run")["budget"]["affordable_steps"]
    assert ("budget: epsilon 2 at delta 1e-05, a Renyi filter at order" in out
            and f"{answered} queries answered privately, {32 - answered} by the public model" in out)


@settings(max_examples=60, deadline=None)
@given(noise=st.floats(0.5, 50), epsilon=st.floats(0.5, 20), delta=st.sampled_from([1e-5, 1e-7]))
def test_the_filters_stopping_count_agrees_with_dp_accounting(noise, epsilon, delta):
    # an independent reference: dp-accounting's RdpAccountant at the filter's one order, composing the
    # Gaussian as many times as the filter answered, stays within epsilon; one more step would exceed it
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    from dpledger.mechanisms import GaussianMechanism

    orders = np.asarray(default_orders())
    bound = GaussianMechanism(noise).rdp_values(orders)
    try:
        renyi = RenyiFilter.plan(epsilon, delta, bound, orders)
    except ValueError:
        return
    k = int(np.flatnonzero(orders == renyi.order)[0])
    answered = int(np.floor(renyi.rdp_budget / bound[k]))
    assume(answered <= 20_000)

    def reference(count):
        accountant = RdpAccountant(orders=[renyi.order])
        accountant.compose(dp_accounting.GaussianDpEvent(noise), count)
        return accountant.get_epsilon(delta)

    if answered:
        assert reference(answered) <= epsilon * (1 + 1e-12)
    assert reference(answered + 1) > epsilon * (1 - 1e-6)


def test_a_nan_step_bound_is_refused_not_skipped():
    orders = np.asarray(default_orders())
    bound = np.full(orders.shape, 0.1)
    bound[3] = np.nan
    with pytest.raises(ValueError, match="step_bound must be >= 0 at every order"):
        RenyiFilter.plan(1.0, 1e-5, bound, orders)


@pytest.mark.parametrize("charge, times", [(0.01, 2.5), (0.0, float("inf")), (0.01, -1)])
def test_spend_repeated_refuses_a_count_that_is_not_a_whole_number_of_steps(charge, times):
    """spend_repeated(charge, 2.5) used to spend int(2.5) = 2 charges silently, and a zero charge an
    infinite number of times raised OverflowError: either is a caller's bug, refused as ValueError
    with nothing spent."""
    renyi = RenyiFilter(2.0, 1e-5, 8.0)
    with pytest.raises(ValueError, match="times must be an integer >= 0"):
        renyi.spend_repeated(charge, times)
    assert renyi.state == RenyiFilter(2.0, 1e-5, 8.0).state
    renyi.spend_repeated(0.01, 3.0)   # an integral float is a whole number of steps
    assert renyi.state == RenyiFilter(2.0, 1e-5, 8.0, [0.01, 0.01, 0.01]).state


def test_a_worker_s_filter_decisions_are_checked_by_the_committing_process():
    """dpledger.decoding.dask_decode: the driver advances its own filter over each block a worker decoded and
    refuses records whose decisions or charges differ."""
    from dpledger.decoding.budget import BudgetGate

    orders = np.asarray(default_orders(6.0))
    gate = BudgetGate.plan({"epsilon": 2.0, "delta": 1e-5}, PMixED(6.0, 0.002, 3).rdp_values(orders), orders)
    affordable = gate.manifest_entry()["affordable_steps"]
    honest = [{"step": t, "budget_refused": t >= affordable, "budget_charge": 0.0 if t >= affordable else gate.step_bound}
              for t in range(affordable + 5)]
    gate.require_decisions(honest)  # the same decisions: accepted
    for forged in ({"budget_refused": False, "budget_charge": gate.step_bound},  # an answer past the budget
                   {"budget_refused": True, "budget_charge": 0.0}):          # a refusal within it
        step = affordable if not forged["budget_refused"] else 0
        records = [dict(r, **forged) if r["step"] == step else r for r in honest]
        gate.restore_data_independent(0)
        with pytest.raises(ValueError, match=f"step {step}: the privacy filter's decision from a worker"):
            gate.require_decisions(records)


# -- realised-path charges inside the filter (fully adaptive composition) ---------------------------------

REALISED = {
    "adapmixed": {"type": "adapmixed", "alpha": 6.0, "beta": 0.01, "lam": 0.003, "sigma": 0.02, "threshold": 1.1,
                  "top_k": 60, "data_dependent": True, "accounting": "realised-path"},
    "dpargmax": {"type": "voting", "aggregator": "dpargmax", "votes": "coordinated", "threshold": 2.0, "sigma": 8.0,
                 "sigma_threshold": 8.0, "accounting": "realised-path"},
}


@pytest.mark.parametrize("name", list(REALISED))
def test_a_realised_path_filter_charges_the_answer_only_where_the_screen_passed(micro_models, tmp_path, name):
    """Feldman & Zrnic 2021, Theorem 3.1 with charges chosen from released outputs: each step is
    admitted on its largest charge (screen + answer), then charged the screen's bound plus the
    answer's only if its screen passed; the filter's budget is the guarantee."""
    from dpledger.decoding.runners import build_runner

    run = decode(micro_models, tmp_path / name, REALISED[name], {"epsilon": 3.0, "delta": 1e-5}, queries=64)
    manifest, records = trace.read_manifest(run.directory), trace.read_records(run.directory)
    plan = manifest["budget"]
    assert plan["charging"] == "realised-path" and plan["affordable_steps"] is None
    runner = build_runner(REALISED[name], 3)
    orders = np.asarray(manifest["orders"])
    index = int(np.flatnonzero(orders == plan["order"])[0])
    screen, answer = (float(v[index]) for v in runner.realised_path_bounds(orders))
    assert (plan["screen_bound_at_order"], plan["answer_bound_at_order"]) == (screen, answer)
    spent = 0.0
    for record in records:
        if record["budget_refused"]:
            assert record["budget_charge"] == 0.0 and record["answered_by"] == "public"
            assert spent + plan["step_bound_at_order"] > plan["rdp_budget"] * (1 - 1e-12)  # the largest did not fit
            continue
        assert spent + plan["step_bound_at_order"] <= plan["rdp_budget"] * (1 + 1e-12)
        assert record["budget_charge"] == pytest.approx(screen + answer if record["screen_passed"] else screen,
                                                        rel=1e-15)
        spent += record["budget_charge"]
    passed = [r["screen_passed"] for r in records if not r["budget_refused"]]
    assert any(passed) and not all(passed), "the test needs screens that pass and screens that fail"
    refused = sum(r["budget_refused"] for r in records)
    # more private answers than charging every step its largest charge would give
    assert 64 - refused > min(64, int(plan["rdp_budget"] // plan["step_bound_at_order"]))
    summary = trace.read_ledger(run.directory)
    assert "fully adaptive composition" in summary["budget"]["guarantee"]
    if name == "dpargmax":
        assert summary["voting"]["dp_guarantee"] is True
    report = audit_run(run.directory, **AUDIT)
    assert report.verdict == "PASS", report.failed
    assert "realised-path" in report.check("budget_filter").detail
    bracket = report.check("epsilon_bracket")  # the stopping step depends on released decisions: no fixed product
    assert bracket.status.value == "SKIPPED" and "inside a privacy filter" in bracket.detail


def test_a_realised_path_filter_charge_edited_in_the_trace_fails_the_audit(micro_models, tmp_path):
    from tests.forging import forge

    run = decode(micro_models, tmp_path / "run", REALISED["dpargmax"], {"epsilon": 3.0, "delta": 1e-5}, queries=32)
    failed = next(r["step"] for r in trace.read_records(run.directory)
                  if not r["budget_refused"] and not r["screen_passed"])

    def charge_nothing(record):
        if record["step"] == failed:
            record["budget_charge"] = 0.0

    forge(run.directory, edit_record=charge_nothing)
    check = audit_run(run.directory, **AUDIT).check("budget_filter")
    assert check.status.value == "FAIL" and f"step {failed}: filter charge 0" in check.detail


def test_a_realised_path_filter_is_decoded_in_one_process(micro_models, tmp_path):
    from dpledger.decoding.dask_decode import sequential_reason

    config = micro_config(micro_models, tmp_path / "r", REALISED["adapmixed"], queries=8)
    config["budget"] = {"epsilon": 3.0, "delta": 1e-5}
    assert "screen decisions" in sequential_reason(config_from_dict(config))
    config["mechanism"] = dict(REALISED["adapmixed"], accounting="released-output")
    assert sequential_reason(config_from_dict(config)) is None


def test_a_realised_path_ledger_reads_its_total_as_an_odometer(micro_models, tmp_path):
    """C(a) + log(1/delta)/(a-1) at the order fixed in advance; log(K/delta) when chosen afterwards."""
    config = micro_config(micro_models, tmp_path / "r", REALISED["dpargmax"], queries=16)
    run = run_decode(config_from_dict(config), progress=False, verbose=False)
    ledger = trace.read_ledger(run.directory)
    orders = np.asarray(ledger["ledger"]["orders"])
    values = np.sum([c["values"] for c in ledger["ledger"]["components"].values()], axis=0)
    for row, delta in zip(ledger["odometer"], config_from_dict(config).deltas):
        k = int(np.flatnonzero(orders == row["pre_chosen_order"])[0])
        assert row["pre_chosen_order"] == orders[np.argmin(np.abs(orders - 2.0))]
        assert row["epsilon_at_pre_chosen_order"] == pytest.approx(values[k] + np.log(1 / delta) / (orders[k] - 1),
                                                                   rel=1e-12)
        expected = np.min(values + np.log(orders.size / delta) / (orders - 1))
        assert row["epsilon_order_chosen_afterwards"] == pytest.approx(expected, rel=1e-12)
        assert "not an RDP guarantee" in row["note"]
    assert audit_run(run.directory, **AUDIT).check("ledger_recompute").status.value == "PASS"
