"""Utility warnings (docs/pitfalls.md 13 to 16, dpledger.decoding.utility): each is triggered by a run
that has the problem and stays silent on one that does not, in the decoder's output, the audit's lint
and the report. Synthetic runs (no models) except the one decode through the command line."""
import copy


import pytest

from dpledger.cli import main
from dpledger.decoding.utility import no_better_than_public, unanimous_release_probability, utility_warnings
from dpledger.reports.render import render, utility_notes
from dpledger.reports.run_data import load_run
from tests.micro import ADAPMIXED, micro_config, write_toml
from tests.synthetic import write_synthetic_run

DPARGMAX = {"type": "voting", "votes": "coordinated", "aggregator": "dpargmax", "threshold": 2.0, "sigma": 1.0,
            "sigma_threshold": 1.0}
NOISY_DPWS = {"type": "voting", "votes": "coordinated", "aggregator": "dpws", "threshold": 2.0, "sigma": 4.0}
KINDS = {
    "dpargmax": (DPARGMAX, "replace_one"),
    "noisy-dpws": (NOISY_DPWS, "replace_one"),
    "adapmixed": (ADAPMIXED, "add_or_remove_one"),
    "pmixed-q0.5": ({"type": "pmixed", "alpha": 6.0, "beta": 0.05, "sample_rate": 0.5}, "add_or_remove_one"),
    "pmixed-q0.9": ({"type": "pmixed", "alpha": 6.0, "beta": 0.05, "sample_rate": 0.9}, "add_or_remove_one"),
    "public": ({"type": "public"}, "add_or_remove_one"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("utility")
    return {name: load_run(write_synthetic_run(root / name, teachers=4, vocab=32, steps=40, block_size=10,
                                               mechanism=mechanism, relation=relation))
            for name, (mechanism, relation) in KINDS.items()}


def warning(run, pitfall):
    return next(w for w in utility_warnings(run.manifest, run.records, run.ledger) if w.pitfall == pitfall)


def test_noise_that_drowns_a_unanimous_vote_is_flagged_and_modest_noise_is_not(runs):
    assert warning(runs["noisy-dpws"], 13).applies and "below 1/2" in warning(runs["noisy-dpws"], 13).reason
    assert not warning(runs["dpargmax"], 13).applies
    assert not warning(runs["adapmixed"], 13).applies  # not a voting run


def test_the_unanimous_release_probability_follows_the_noise():
    """DPARGMAX with 16 teachers: sigma 1 releases a unanimous vote almost surely, sigma 32 rarely."""
    params = {**{k: v for k, v in DPARGMAX.items() if k != "type"}, "accounting": "released-output"}
    low = unanimous_release_probability(params, 16, "replace_one", 64)
    high = unanimous_release_probability({**params, "sigma": 32.0, "sigma_threshold": 32.0}, 16, "replace_one", 64)
    assert low > 0.99 and high < 0.5


def test_a_screen_that_always_passes_is_flagged_and_one_that_varies_is_not(runs):
    always = warning(runs["adapmixed"], 14)
    assert always.applies and "passed on 40 of 40 screened steps" in always.reason
    assert not warning(runs["dpargmax"], 14).applies  # 10 of 40 in this run
    assert warning(runs["pmixed-q0.5"], 14).reason == "no screening step"


def test_too_few_screened_steps_say_nothing(runs):
    run = runs["adapmixed"]
    few = next(w for w in utility_warnings(run.manifest, run.records[:10], run.ledger) if w.pitfall == 14)
    assert not few.applies and "fewer than 20" in few.reason


def test_subsampling_that_raises_epsilon_is_flagged_and_one_that_lowers_it_is_not(runs):
    raised = warning(runs["pmixed-q0.9"], 15)
    assert raised.applies and "costs more than it amplifies" in raised.reason
    lowered = warning(runs["pmixed-q0.5"], 15)
    assert not lowered.applies
    numbers = [float(x) for x in lowered.reason.replace(",", " ").split() if x.replace(".", "", 1).isdigit()]
    assert numbers[0] < numbers[2]  # "epsilon A with sample rate q ... against B without"


def test_unanimous_teachers_are_flagged_and_disagreeing_ones_are_not(runs):
    run = runs["dpargmax"]
    assert not warning(run, 16).applies  # random synthetic teachers rarely agree
    alike = copy.deepcopy(run.records)
    for record in alike[:35]:  # 35 of 40 steps unanimous: 88%
        record["vote_counts"] = [4]
    flagged = next(w for w in utility_warnings(run.manifest, alike, run.ledger) if w.pitfall == 16)
    assert flagged.applies and "88% of 40 voting steps" in flagged.reason


def test_a_private_run_no_better_than_the_public_model_is_named_in_the_report(runs):
    assert no_better_than_public(600.0, 508.4) and not no_better_than_public(400.0, 508.4)
    assert not no_better_than_public(None, 508.4) and not no_better_than_public(float("inf"), 508.4)
    public, private = runs["public"], runs["pmixed-q0.5"]
    notes = utility_notes(private, [public, private])
    worse = no_better_than_public(private.ledger["perplexity"], public.ledger["perplexity"])
    assert any("no better than the public model" in note for note in notes) == worse
    # without the public run in the report there is nothing to compare with
    assert not any("no better than the public model" in note for note in utility_notes(private, [private]))


def test_the_report_and_the_lint_list_what_applies(runs):
    from dpledger.audit.lint import lint
    from dpledger.audit.loader import load_trace

    markdown = render([runs["adapmixed"], runs["dpargmax"]], "md")
    section = markdown.split("### Utility warnings")
    assert len(section) == 2 and "screen that (nearly) always or never passes" in section[1].split("##")[0]
    findings = {f.pitfall: f for f in lint(load_trace(runs["noisy-dpws"].directory))}
    assert set(findings) == set(range(1, 17))
    assert findings[13].applies and findings[13].severity == "low"
    assert not findings[16].applies and findings[16].severity == "info"


def test_decode_prints_a_warning_that_applies_and_none_otherwise(micro_models, tmp_path, capsys):
    """The micro ensemble has 3 teachers: DPWS with sigma 8 drowns a unanimous vote; sigma 0.5 does not."""
    printed = {}
    for name, sigma in (("drowned", 8.0), ("clear", 0.5)):
        config = micro_config(micro_models, tmp_path / name, {**NOISY_DPWS, "sigma": sigma}, queries=8, block_size=8)
        assert main(["decode", str(write_toml(tmp_path / f"{name}.toml", config)), "--no-progress"]) == 0
        printed[name] = capsys.readouterr().out
    assert "utility warning (noise comparable to the ensemble)" in printed["drowned"]
    assert "utility warning" not in printed["clear"]


def test_a_damaged_run_gets_no_warning_and_no_crash(runs):
    """A hand-edited manifest (the voting parameters gone) and a ledger without the epsilon the
    subsampling check reads: each check says it could not look, none raises."""
    run = runs["noisy-dpws"]
    manifest = copy.deepcopy(run.manifest)
    manifest["mechanism"]["params"] = {}
    ledger = {**runs["pmixed-q0.9"].ledger, "epsilon": []}
    damaged = utility_warnings(manifest, run.records, run.ledger) + utility_warnings(
        runs["pmixed-q0.9"].manifest, runs["pmixed-q0.9"].records, ledger)
    assert [w.pitfall for w in damaged] == [13, 14, 15, 16] * 2
    flagged = [w for w in damaged if w.reason.startswith("not computed")]
    assert {w.pitfall for w in flagged} == {13, 15} and not any(w.applies for w in flagged)
