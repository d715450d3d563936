"""No silent NaN in the auditor and the reports: every site where a privacy quantity meets
max/min/a comparison/nan_to_num/argmax gets a NaN here and must raise ValueError or FAIL its check
naming the NaN field and step, never PASS."""
import json
import math
from types import SimpleNamespace

import pytest
import torch

from dpledger.audit import Status, load_trace
from dpledger.audit import ablation, bounds, replay
from dpledger.audit.lint import lint
from dpledger.audit.sampled import canary_query, check_canary_game, epsilon_lower_bound
from dpledger.reports import load_run, plots, render
from dpledger.reports.run_data import fmt
from dpledger.reports.statement import privacy_statement
from tests.micro import ADAPMIXED, PMIXED, make_run

NAN = float("nan")


@pytest.fixture(scope="module")
def runs(micro_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("nan_sites")
    return {"adapmixed": make_run(micro_models, root / "adapmixed", ADAPMIXED, queries=16),
            "pmixed": make_run(micro_models, root / "pmixed", PMIXED, queries=16)}


def editable(loaded):
    """The trace's records, held in memory and served to every check (they read records block by
    block through iter_blocks), so a test can plant a value in one of them."""
    blocks = [(block, records) for block, records in loaded.iter_blocks()]
    loaded.iter_blocks = lambda: iter(blocks)
    loaded.records = [record for _, records in blocks for record in records]
    return loaded


def answered_step(loaded) -> int:
    return next(i for i, r in enumerate(loaded.records) if r["screen_passed"] and i > 0)


def test_site1_replay_close_counts_a_nan_as_a_mismatch(runs):
    assert not replay._close([NAN], [1.0]) and not replay._close([1.0], [NAN]) and not replay._close([NAN], [NAN])
    loaded = editable(load_trace(runs["adapmixed"]))
    loaded.ledger["epsilon"][0]["epsilon"] = NAN
    conversion = replay.check_conversion(loaded)
    assert conversion.status is Status.FAIL and "reported nan" in conversion.detail and "(NaN recorded)" in conversion.detail
    loaded = editable(load_trace(runs["adapmixed"]))
    loaded.records[2]["screen_statistic"] = NAN
    loaded.records[3]["rdp_screen"][5] = NAN
    result = replay.check_replay(loaded)
    assert result.status is Status.FAIL
    assert "step 2: screening statistic nan recorded" in result.detail and "(NaN recorded)" in result.detail
    assert "step 3: charged screen differs from the mechanism's (NaN recorded)" in result.detail


def test_site2_replay_nan_lambda_gap_is_a_mismatch(runs):
    loaded = editable(load_trace(runs["pmixed"]))
    loaded.records[4]["lambdas"][1] = NAN
    result = replay.check_replay(loaded)
    assert result.status is Status.FAIL
    assert "step 4: mixing weights differ by nan (NaN recorded)" in result.detail
    assert math.isnan(result.evidence["max_deviation"]["lambdas"])


def test_site3_mixing_ball_nan_divergence_fails_naming_the_step(runs, monkeypatch):
    real = bounds.symmetric_renyi_orders

    def with_nan(*args):
        divergence = real(*args).clone()
        divergence[5, 1] = NAN
        return divergence

    monkeypatch.setattr(bounds, "symmetric_renyi_orders", with_nan)
    result = bounds.check_mixing_ball(load_trace(runs["pmixed"]))
    assert result.status is Status.FAIL and "step 5 teacher 1: D<-> at nan of its radius" in result.detail
    assert math.isnan(result.evidence["max_fraction_of_radius"])


def test_site4_eq3_nan_charge_on_an_answered_step_fails(runs):
    loaded = editable(load_trace(runs["adapmixed"]))
    step = answered_step(loaded)
    loaded.records[step]["rdp_pmixed_data_dependent"][0] = NAN
    result = bounds.check_data_dependent_charge(loaded)
    assert result.status is Status.FAIL and f"step {step}: rdp_pmixed_data_dependent NaN" in result.detail


def test_site5_theorem_3_1_nan_loss_fails_with_its_cause(runs):
    loaded = editable(load_trace(runs["adapmixed"]))
    assert loaded.manifest["records_version"] >= 4  # the charged Eq. 3 is recorded on its own: the check reads it
    loaded.records[6]["eq3_remove_one"][0] = NAN
    result = bounds.check_theorem_3_1(loaded)
    assert result.status is Status.FAIL and result.detail == "eq3_remove_one is NaN at steps [6]"
    # a run charged by Theorem 3.1 records no Eq. 3 (the check recomputes it): its bound's NaN is named
    loaded = editable(load_trace(runs["pmixed"]))
    loaded.records[6]["data_independent"][0] = NAN
    result = bounds.check_theorem_3_1(loaded)
    assert result.status is Status.FAIL and result.detail == "data_independent is NaN at steps [6]"


def test_site6_utility_bound_nan_fails_and_lambda_one_term_vanishes(runs):
    loaded = editable(load_trace(runs["pmixed"]))
    loaded.records[7]["lambdas"][0] = NAN
    result = bounds.check_utility_bound(loaded)
    assert result.status is Status.FAIL and "at steps [7]" in result.detail and "NaN" in result.detail
    # lambda = 1 with p_j(x_t) underflowing to 0: (1 - lambda) log(p_j / p0) is 0, not 0 * -inf = NaN
    loaded = editable(load_trace(runs["pmixed"]))
    block = loaded.blocks()[0]
    logits = loaded.payload_logits(block).clone()
    row, teacher = 3, 0
    logits[1 + teacher, row, loaded.records[row]["true_token"]] = -1e5
    loaded.payload_logits = lambda _: logits
    loaded.records[row]["lambdas"][teacher] = 1.0
    result = bounds.check_utility_bound(loaded)
    assert result.status is Status.PASS, result.detail
    assert math.isfinite(result.evidence["bound"])


def test_site7_canary_game_and_ablation_refuse_a_nan_claim(runs):
    loaded = editable(load_trace(runs["adapmixed"]))
    for entry in loaded.ledger["epsilon"]:
        entry["epsilon"] = NAN
    with pytest.raises(ValueError, match=r"canary game: the claimed epsilon in ledger.json at delta=1e-05 is NaN"):
        check_canary_game(loaded, trials=20)
    # the same claim compared by the ablation (it made the ratio inf and the FAIL read "> claimed nan")
    with pytest.raises(ValueError, match=r"neighbour ablation: the claimed epsilon in ledger.json at delta=1e-05 is NaN"):
        ablation.check_ablation(loaded)


@pytest.mark.parametrize("hits_in, hits_out, trials, delta, message", [
    (900, 100, 1000, NAN, r"delta must be finite, got nan"),
    (900, 100, 1000, -0.5, r"delta must be in \(0, 1\), got -0.5"),
    (1500, 100, 1000, 1e-5, r"hits_in must be <= trials \(1000\), got 1500"),
    (900, -5, 1000, 1e-5, r"hits_out must be an integer >= 0, got -5"),
])
def test_site8_epsilon_lower_bound_validates_delta_and_counts(hits_in, hits_out, trials, delta, message):
    with pytest.raises(ValueError, match=message):
        epsilon_lower_bound(hits_in, hits_out, trials, delta)


def test_site9_ablation_nan_divergence_raises_naming_step_neighbour_order(runs, monkeypatch):
    real = ablation.block_divergences
    poisoned_orders = []

    def with_nan(*args):
        divergences, halfwidth, realised = real(*args)
        divergences = divergences.clone()
        divergences[1, 3, 0, 2] = NAN
        poisoned_orders.append(float(args[4][2]))
        return divergences, halfwidth, realised

    monkeypatch.setattr(ablation, "block_divergences", with_nan)
    with pytest.raises(ValueError, match=r"D\(M\(D'\) \|\| M\(D\)\) is NaN at step 3, neighbour 'remove teacher 0', "
                                         r"order ([0-9.]+) \(1 NaN entries") as raised:
        ablation.run_ablation(load_trace(runs["pmixed"]), 1e-5)
    # the message names the order the NaN sits at, whichever orders the audit's grid holds
    assert raised.value.args[0].split("order ")[1].split(" ")[0] == f"{poisoned_orders[0]:g}"


def test_site10_lint_scans_every_numeric_per_step_field(runs):
    loaded = editable(load_trace(runs["adapmixed"]))
    loaded.records[1]["lambdas"][0] = NAN
    loaded.records[2]["observed_data_dependent"][3] = NAN
    loaded.records[3]["screen_statistic"] = NAN
    finding = next(f for f in lint(loaded) if f.pitfall == 9)
    assert finding.applies and finding.severity == "high"
    assert finding.reason == ("NaN in the per-step records: lambdas at steps [1]; observed_data_dependent at steps [2]; "
                              "screen_statistic at steps [3]")
    # a run without screening records NaN as its "not screened" statistic: not a finding
    assert not next(f for f in lint(load_trace(runs["pmixed"])) if f.pitfall == 9).applies


def test_site11_argmin_argmax_sites_refuse_nan_distributions():
    output = torch.full((4, 5), 0.2, dtype=torch.float64)
    output[2, 1] = NAN
    with pytest.raises(ValueError, match=r"the output distribution holds NaN at rows \[2\]"):
        ablation.point_mass_adversaries(output, torch.full((4, 5), 0.2, dtype=torch.float64))

    def distributions(tokens):
        length, vocab = tokens.shape[1], 8
        public = torch.full((1, length, vocab), 1 / vocab, dtype=torch.float64)
        public[0, -2] = NAN
        return public, torch.full((1, length, 3, vocab), 1 / vocab, dtype=torch.float64)

    tokenizer = lambda text, add_special_tokens: {"input_ids": [ord(c) % 8 for c in text]}  # noqa: E731
    ensemble = SimpleNamespace(n_positions=64, distributions=distributions)
    with pytest.raises(ValueError, match=r"canary query: the teacher-vs-baseline log ratio is NaN at context positions"):
        canary_query(tokenizer, ensemble, {"text": "the code is abcd", "secret": "abcd", "teacher": 1})


def test_site12_reports_refuse_nan_and_write_strict_json(runs):
    assert fmt(None) == "n/a" and fmt(math.inf) == "inf"
    with pytest.raises(ValueError, match="must be a number, inf or missing, got NaN"):
        fmt(NAN)
    run = load_run(runs["pmixed"])
    run.ledger["perplexity"] = NAN
    with pytest.raises(ValueError, match=r"report\.comparison\[0\]\.perplexity must be a number, inf or null, got NaN"):
        render([run], "json")
    with pytest.raises(ValueError, match=r"table column 'perplexity' must be a number, inf or missing, got NaN"):
        render([run], "md")
    # +inf and a missing order become null beside a reason, and the output parses as strict JSON
    run.ledger["perplexity"] = math.inf
    free = load_run(runs["pmixed"])
    free.ledger["epsilon"] = [{**e, "epsilon": 0.0, "order": None} for e in free.ledger["epsilon"]]
    strict = json.loads(render([run, free], "json"),
                        parse_constant=lambda token: pytest.fail(f"non-standard JSON token {token}"))
    assert strict["comparison"][0]["perplexity"] is None and "probability 0" in strict["comparison"][0]["perplexity_missing"]
    assert strict["comparison"][1]["order@1e-05"] is None and strict["comparison"][1]["order@1e-05_missing"]
    # a NaN epsilon is not "inf: no order gives a guarantee"
    free.ledger["epsilon"] = [{**e, "epsilon": NAN} for e in free.ledger["epsilon"]]
    with pytest.raises(ValueError, match=r"ledger.json: epsilon at delta=1e-05 must be a number or inf, got NaN"):
        privacy_statement(free)


def test_site12_plots_refuse_nan_instead_of_dropping_it(runs):
    run = load_run(runs["pmixed"])
    optimal = run.manifest["orders"].index(run.ledger["breakdown"]["order"])
    run.records[2]["rdp_pmixed_theorem_3_1"][optimal] = NAN  # the histogram counted it as "no guarantee"
    with pytest.raises(ValueError, match=r"the charged RDP is NaN at steps \[2\]"):
        plots.plot_step_loss_distribution(run)
    run.records[5]["lambdas"][0] = NAN
    with pytest.raises(ValueError, match=r"the mixing weights are NaN at steps \[5\]"):
        plots.plot_mixing_weights(run)
    run.ledger["ledger"]["components"]["pmixed_theorem_3_1"]["values"][0] = NAN
    with pytest.raises(ValueError, match=r"ledger.json: the composed RDP curve is NaN at orders \[1\.\d+\]"):
        plots.plot_rdp_curve(run)
