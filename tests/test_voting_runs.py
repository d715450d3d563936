"""Hot PATE voting runs end to end: decode, trace, ledger, audit (incl. a planted fault), resume."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

from dpledger.accounting.relation import NeighbouringRelation
from dpledger.audit import audit_run
from dpledger.decoding import trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode
from dpledger.mechanisms import ConfidentGNMax, GNMax
from dpledger.mechanisms.randomness import vote_seed
from dpledger.mechanisms.voting import (VoteCoordination, VotingMechanism, gnmax_log_output_law,
                                        renyi_divergence_of_log_laws)
from tests.micro import kill_and_resume, micro_config

AGGREGATORS = {
    "targmax": {"threshold": 2},
    "tws": {"threshold": 2, "gamma": 1.5},
    "dpargmax": {"threshold": 2.0, "sigma": 1.0, "sigma_threshold": 1.0},
    "dpws": {"threshold": 2, "sigma": 1.5},
}


def voting(aggregator: str, votes: str = "coordinated", **extra) -> dict:
    return {"type": "voting", "votes": votes, "aggregator": aggregator, **AGGREGATORS[aggregator], **extra}


def decode(micro_models, out: Path, mechanism: dict, queries: int = 48, block_size: int = 16, **run):
    return run_decode(config_from_dict(micro_config(micro_models, out, mechanism, queries=queries,
                                                    block_size=block_size, **run)), progress=False, verbose=False)


@pytest.mark.parametrize("aggregator", sorted(AGGREGATORS))
def test_each_aggregator_decodes_records_votes_and_audits_pass(micro_models, tmp_path, aggregator):
    # DPWS's bracket draws its Monte Carlo law bounds at ~0.25 s a step here: 16 steps, the others 48
    result = decode(micro_models, tmp_path / aggregator, voting(aggregator, "independent" if aggregator == "tws"
                                                                else "coordinated"),
                    queries=16 if aggregator == "dpws" else 48, block_size=8 if aggregator == "dpws" else 16)
    records = trace.read_records(result.directory)
    for record in records:
        assert record["vote_seed"] == vote_seed(7, record["step"])
        assert sum(record["vote_counts"]) == 3 and record["vote_tokens"] == sorted(record["vote_tokens"])
        released = record["answered_by"] == "mechanism"
        assert released == record["screen_passed"]
    summary = result.summary["voting"]
    assert summary["released_steps"] == sum(r["answered_by"] == "mechanism" for r in records)
    epsilon = result.summary["epsilon"][0]["epsilon"]
    if aggregator in ("targmax", "tws"):
        assert math.isinf(epsilon) and summary["dp_guarantee"] is False
        assert summary["released_below_threshold"] == 0
        assert "no DP guarantee; every released token had at least T = 2 votes" in summary["guarantee"]
    else:
        assert math.isfinite(epsilon) and summary["dp_guarantee"] is True
    report = audit_run(result.directory, game_trials=0, play_game=aggregator in ("dpargmax", "dpws"))
    assert report.verdict == "PASS", [c.to_dict() for c in report.failed]
    assert report.check("shared_randomness").status.value == "PASS"
    assert report.check("voting_charges").status.value == "PASS"
    ablation = report.check("neighbour_ablation")
    assert ablation.evidence["leakiest_teacher"] in range(3)
    if aggregator in ("targmax", "tws"):
        assert report.check("vote_threshold").status.value == "PASS"
        assert "T-threshold privacy verified" in report.headline


def test_shared_randomness_that_depends_on_a_teacher_is_caught(micro_models, tmp_path, monkeypatch):
    """A planted fault: the shared vector is seeded from teacher 0's most likely token, while the
    public seed is recorded. The replay recomputes the histograms with the public seed: FAIL."""
    original = VotingMechanism.histograms

    def leaky(self, teachers, seeds):
        return original(self, teachers, [seed ^ int(teachers[row, 0].argmax()) for row, seed in enumerate(seeds)])

    monkeypatch.setattr(VotingMechanism, "histograms", leaky)
    result = decode(micro_models, tmp_path / "leaky", voting("targmax"), queries=32)
    monkeypatch.setattr(VotingMechanism, "histograms", original)
    report = audit_run(result.directory, play_game=False)
    assert report.verdict == "FAIL"
    assert "replay" in [c.name for c in report.failed]
    assert "vote histogram differs" in report.check("replay").detail


def test_dpargmax_charges_screen_every_step_and_the_answer_by_accounting(micro_models, tmp_path):
    orders = None
    charges = {}
    for accounting in ("released-output", "realised-path"):
        result = decode(micro_models, tmp_path / accounting, voting("dpargmax", threshold=2.5, accounting=accounting))
        records = trace.read_records(result.directory)
        orders = np.asarray(json.loads((result.directory / trace.MANIFEST).read_text())["orders"])
        charges[accounting] = records
    # the runs claim add-or-remove-one: one vote moves one count by one (sensitivity 1 for both Gaussians)
    relation = NeighbouringRelation(json.loads((tmp_path / "released-output" / trace.MANIFEST).read_text())["relation"])
    assert relation is NeighbouringRelation.ADD_OR_REMOVE_ONE
    mechanism = ConfidentGNMax(2.5, 1.0, 1.0, relation)
    for accounting, records in charges.items():
        failed = [r for r in records if not r["screen_passed"]]
        assert failed and len(failed) < len(records)
        for record in records:
            np.testing.assert_allclose(record["rdp_confident_gnmax_screen"], mechanism.screen_rdp(orders))
            answered = record["screen_passed"] or accounting == "released-output"
            np.testing.assert_allclose(record["rdp_gnmax"], mechanism.answer_rdp(orders) if answered else 0.0)
    # the released-output total against dp-accounting: Q screens and Q answers, each a Gaussian of
    # multiplier s at sensitivity 1 (add-or-remove-one)
    from tests.test_cli_account import gaussian_reference

    released = json.loads((tmp_path / "released-output" / trace.LEDGER).read_text())
    epsilon = next(e["epsilon"] for e in released["epsilon"] if e["method"] == "improved" and e["delta"] == 1e-5)
    reference = gaussian_reference([(1.0, released["steps"]), (1.0, released["steps"])], 1e-5)
    assert epsilon == pytest.approx(reference, rel=1e-9)


def test_realised_path_dpargmax_is_labelled_ex_post_and_audited_like_with_like(micro_models, tmp_path):
    result = decode(micro_models, tmp_path / "path", voting("dpargmax", threshold=2.5, accounting="realised-path"))
    voting_summary = result.summary["voting"]
    assert voting_summary["dp_guarantee"] is False and "ex-post" in voting_summary["guarantee"]
    report = audit_run(result.directory)
    assert report.verdict == "PASS", [c.to_dict() for c in report.failed]
    ablation = report.check("neighbour_ablation").evidence
    assert "decision's divergence plus" in ablation["measured_quantity"]
    # the released law's divergence is reported beside the like-with-like quantity
    assert math.isfinite(ablation["released_output_epsilon"]) and ablation["released_output_epsilon"] > 0
    from dpledger.reports import load_run
    from dpledger.reports.statement import privacy_statement

    text = " ".join(privacy_statement(load_run(result.directory)))
    assert "Papernot et al. 2018's convention" in text and "Flemings" not in text


def test_data_dependent_dpargmax_is_labelled_and_never_above_gnmax(micro_models, tmp_path):
    result = decode(micro_models, tmp_path / "dd", voting("dpargmax", data_dependent=True, sigma=0.5,
                                                          sigma_threshold=0.5))
    assert result.summary["data_dependent"] is True and result.summary["direction"] == "both"
    orders = np.asarray(json.loads((result.directory / trace.MANIFEST).read_text())["orders"])
    for record in trace.read_records(result.directory):
        counts = np.zeros(400, dtype=np.int64)
        counts[record["vote_tokens"]] = record["vote_counts"]
        expected = GNMax(0.5, NeighbouringRelation.ADD_OR_REMOVE_ONE).data_dependent_rdp(counts, orders)
        np.testing.assert_allclose(record["rdp_gnmax_data_dependent"], expected, rtol=1e-12)
        # never above GNMax's own bound under the run's relation, a / (2 sigma^2) for add-or-remove-one
        assert np.all(np.asarray(record["rdp_gnmax_data_dependent"]) <= orders / 0.5 * (1 + 1e-12))
    assert audit_run(result.directory, play_game=False).verdict == "PASS"


def test_data_dependent_screen_is_opt_in_labelled_recorded_and_audited(micro_models, tmp_path):
    result = decode(micro_models, tmp_path / "dds", voting("dpargmax", data_dependent_screen=True, sigma=0.5,
                                                           sigma_threshold=0.5))
    assert result.summary["data_dependent"] is True
    manifest = json.loads((result.directory / trace.MANIFEST).read_text())
    assert manifest["mechanism"]["params"]["data_dependent_screen"] is True
    assert manifest["mechanism"]["components"] == {"confident_gnmax_screen_data_dependent": True, "gnmax": False}
    orders = np.asarray(manifest["orders"])
    mechanism = ConfidentGNMax(2.0, 0.5, 0.5, NeighbouringRelation.ADD_OR_REMOVE_ONE)
    for record in trace.read_records(result.directory):
        counts = np.zeros(400, dtype=np.int64)
        counts[record["vote_tokens"]] = record["vote_counts"]
        np.testing.assert_allclose(record["rdp_confident_gnmax_screen_data_dependent"],
                                   mechanism.data_dependent_screen_rdp(counts, orders), rtol=1e-12)
        assert np.all(np.asarray(record["rdp_confident_gnmax_screen_data_dependent"])
                      <= mechanism.screen_rdp(orders) * (1 + 1e-12))
    assert audit_run(result.directory, play_game=False).verdict == "PASS"


def test_voting_runs_may_claim_replace_one_and_the_ablation_tests_it(micro_models, tmp_path):
    result = decode(micro_models, tmp_path / "replace", voting("dpargmax"), queries=16, relation="replace_one")
    assert result.summary["relation"] == "replace_one"
    report = audit_run(result.directory, play_game=False)
    assert report.verdict == "PASS", [c.to_dict() for c in report.failed]
    relations = report.check("neighbour_ablation").evidence["relations"]
    assert relations["replace_one"]["claimed"] and relations["replace_one"]["within_claim"]
    # one vote moved changes the histogram by two votes: at least as distinguishable as one removed
    assert relations["replace_one"]["empirical_epsilon"] >= relations["remove_one"]["empirical_epsilon"] * (1 - 1e-9)


def test_killed_voting_run_resumes_to_the_identical_ledger(micro_models, tmp_path):
    mechanism = voting("dpargmax")
    reference_cfg = micro_config(micro_models, tmp_path / "reference", mechanism, queries=600, block_size=8,
                                 replay_payload=False)
    reference = run_decode(config_from_dict(reference_cfg), progress=False, verbose=False)
    resumed, killed, committed = kill_and_resume(reference_cfg, tmp_path)
    assert 0 < committed < 600
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    killed_ledger = json.loads((tmp_path / "killed" / trace.LEDGER).read_text())
    for key in ("ledger", "epsilon", "voting", "breakdown"):
        assert killed_ledger[key] == reference.summary[key]

    def content(run_dir):
        return [{k: v for k, v in r.items() if k not in ("prev_hash", "record_hash")} for r in trace.read_records(run_dir)]

    assert content(tmp_path / "killed") == content(reference.directory)


def test_mixing_mechanisms_still_refuse_replace_one():
    with pytest.raises(ValueError, match="replace_one is for type"):
        config_from_dict({"run": {"out": "x", "relation": "replace_one"},
                          "mechanism": {"type": "pmixed", "alpha": 6.0, "beta": 0.01}})


@pytest.mark.parametrize("mechanism, message", [
    ({"aggregator": "dpargmax", "threshold": 2.0, "sigma": 1.0}, "sigma_threshold is required for aggregator dpargmax"),
    ({"aggregator": "targmax", "threshold": 2, "sigma": 1.0}, "sigma is not used for aggregator targmax, got 1.0"),
    ({"aggregator": "targmax", "threshold": 2.5}, "threshold must be an integer vote count for targmax, got 2.5"),
    ({"aggregator": "targmax", "threshold": 9}, "threshold must be <= teachers = 3"),
    ({"aggregator": "vote", "threshold": 2}, "aggregator must be one of"),
    ({"aggregator": "tws", "threshold": 2, "gamma": 0.5}, "gamma must be >= 1, got 0.5"),
    ({"aggregator": "tws", "threshold": 2, "accounting": "realised-path"}, "realised-path' applies to dpargmax only"),
])
def test_bad_voting_configs_are_one_line_value_errors(mechanism, message):
    from dpledger.decoding.runners import build_runner

    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as error:
        build_runner({"type": "voting", "votes": "coordinated", **mechanism}, 3)
    assert "\n" not in str(error.value)


def test_gnmax_law_matches_closed_form_and_sampling():
    for counts, sigma in (([5, 3], 1.0), ([40, 0], 1.0), ([10, 9], 3.0)):
        law, error = gnmax_log_output_law(np.asarray(counts, float), sigma)
        gap = (counts[0] - counts[1]) / (math.sqrt(2) * sigma)
        np.testing.assert_allclose(law, [norm.logcdf(gap), norm.logsf(gap)], rtol=1e-10)
        assert error < 1e-9
    counts = np.array([10, 8, 8, 3] + [0] * 60, float)
    law, _ = gnmax_log_output_law(counts, 2.0)
    draws = np.argmax(counts + np.random.default_rng(0).normal(0, 2.0, (200_000, counts.size)), axis=1)
    frequency = np.bincount(draws, minlength=counts.size) / draws.size
    standard_error = np.sqrt(np.exp(law) * (1 - np.exp(law)) / draws.size)
    assert np.all(np.abs(frequency - np.exp(law)) <= 5 * standard_error + 1e-12)
    assert law[1] == law[2] and law[4] == law[63]


def test_renyi_divergence_of_laws_is_infinite_off_support_and_symmetric_on_swaps():
    orders = np.array([1.5, 2.0, 8.0])
    p, q = np.log([0.5, 0.5, 0.0]), np.log([0.25, 0.5, 0.25])
    assert np.all(np.isinf(renyi_divergence_of_log_laws(q, p, orders)))
    closed = np.log(0.5 ** orders * 0.25 ** (1 - orders) + 0.5) / (orders - 1)
    np.testing.assert_allclose(renyi_divergence_of_log_laws(p, q, orders), closed, rtol=1e-12)


def test_voting_mechanism_charges_and_worst_case():
    orders = np.array([2.0, 8.0, 32.0])
    # add-or-remove-one (the default): one vote moves one count, L2 sensitivity 1 for both Gaussians
    dp = VotingMechanism.build(VoteCoordination.COORDINATED, "dpargmax", 16, threshold=8.0, sigma=2.0,
                               sigma_threshold=4.0)
    np.testing.assert_allclose(dp.rdp_values(orders), orders / 32 + orders / 8)
    assert np.all(np.isinf(VotingMechanism.build("coordinated", "tws", 16, threshold=8, gamma=2.0).rdp_values(orders)))
    dpws = VotingMechanism.build("independent", "dpws", 16, threshold=8, sigma=3.0)
    np.testing.assert_allclose(dpws.rdp_values(orders), orders / 18)
    # replace-one: a vote moves between two counts, sensitivity sqrt(2) for the answer and DPWS
    replace = NeighbouringRelation.REPLACE_ONE
    np.testing.assert_allclose(VotingMechanism.build("coordinated", "dpargmax", 16, threshold=8.0, sigma=2.0,
                                                     sigma_threshold=4.0, relation=replace).rdp_values(orders),
                               orders / 32 + orders / 4)
    np.testing.assert_allclose(VotingMechanism.build("independent", "dpws", 16, threshold=8, sigma=3.0,
                                                     relation=replace).rdp_values(orders), orders / 9)


VOTING_FAULT_MECHANISMS = {"shared_seed_from_teacher": voting("targmax"), "gnmax_sensitivity": voting("dpargmax"),
                           "threshold_ignored": voting("targmax", threshold=3, votes="independent"),
                           "screen_noise_halved": voting("dpargmax", threshold=2.5)}


@pytest.mark.parametrize("fault", sorted(VOTING_FAULT_MECHANISMS))
def test_planted_voting_faults_are_caught_by_their_check(micro_models, tmp_path, fault):
    from dpledger.audit.checks import Status
    from dpledger.audit.selfcheck import FAULTS, VOTING_FAULTS, faulty_runner
    from dpledger.decoding.blocks import prepare

    assert set(VOTING_FAULTS) == set(VOTING_FAULT_MECHANISMS)
    config = config_from_dict(micro_config(micro_models, tmp_path / fault, VOTING_FAULT_MECHANISMS[fault], queries=48,
                                           block_size=16))
    prepared = prepare(config, verbose=False)
    prepared.runner = faulty_runner(prepared.runner, fault)
    run_dir = run_decode(config, progress=False, verbose=False, prepared=prepared).directory
    report = audit_run(run_dir, play_game=False)
    assert report.verdict == "FAIL"
    assert report.check(FAULTS[fault].caught_by).status is Status.FAIL, report.check(FAULTS[fault].caught_by).detail


def test_a_guessable_run_seed_is_a_pitfall_and_a_secret_one_is_not(micro_models, tmp_path):
    """Every step's noise derives from the run seed: a small seed lets an adversary recompute it."""
    from dpledger.audit.lint import lint
    from dpledger.audit.loader import load_trace

    small = decode(micro_models, tmp_path / "small", voting("dpargmax"), queries=16)
    secret = decode(micro_models, tmp_path / "secret", voting("dpargmax"), queries=16, seed=2 ** 62 + 12345)
    flagged = next(f for f in lint(load_trace(small.directory)) if f.pitfall == 12)
    assert flagged.applies and flagged.severity == "medium" and "below 2^40" in flagged.reason
    assert "7" not in flagged.reason  # the seed itself is secret, even a guessable one
    assert not next(f for f in lint(load_trace(secret.directory)) if f.pitfall == 12).applies

