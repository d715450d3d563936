"""The auditor: correct runs pass, every planted fault is caught by its named check, the sampled
game's lower bound covers known mechanisms, bad trace directories get clear errors."""
import itertools
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dpledger.audit import Status, audit_run, load_trace
from dpledger.audit.ablation import ensemble_output, run_ablation
from dpledger.audit.sampled import distinguishing_game, epsilon_lower_bound
from dpledger.audit.selfcheck import FAULTS, RUNNER_FAULTS, TRACE_FAULTS, plant_trace_fault
from dpledger.decoding import trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode
from dpledger.cli import main
from dpledger.mechanisms import renyi_divergence
from tests.micro import ADAPMIXED, PMIXED, make_run, micro_config


@pytest.fixture(scope="module")
def correct_runs(micro_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("audited")
    return {"adapmixed": make_run(micro_models, root / "adapmixed", ADAPMIXED),
            "pmixed": make_run(micro_models, root / "pmixed", PMIXED)}


@pytest.mark.parametrize("kind", ["adapmixed", "pmixed"])
def test_correct_runs_pass_every_check(correct_runs, kind):
    report = audit_run(correct_runs[kind], mc_samples=200, game_trials=600)
    assert report.verdict == "PASS", [c.to_dict() for c in report.failed]
    statuses = {c.name: c.status for c in report.checks}
    expected_pass = {"hash_chain", "final_record", "manifest", "records", "ledger_recompute", "conversion", "replay", "mixing_ball",
                     "theorem_3_1", "utility_theorem_4_3", "neighbour_ablation", "canary_game"}
    assert all(statuses[name] is Status.PASS for name in expected_pass)
    written = json.loads((correct_runs[kind] / "audit.json").read_text())
    assert written["verdict"] == "PASS" and written["data_dependent"] == (kind == "adapmixed")
    game = report.check("canary_game").evidence
    assert game["epsilon_lower_bound"] <= game["claimed_one_query_epsilon"]


@pytest.mark.parametrize("fault", sorted(RUNNER_FAULTS))
def test_planted_mechanism_faults_are_caught_by_their_check(micro_models, tmp_path, fault):
    run_dir = make_run(micro_models, tmp_path / fault, ADAPMIXED, fault=fault)
    report = audit_run(run_dir, mc_samples=100, play_game=False)
    assert report.verdict == "FAIL"
    assert report.check(FAULTS[fault].caught_by).status is Status.FAIL, report.check(FAULTS[fault].caught_by).detail


@pytest.mark.parametrize("fault", sorted(TRACE_FAULTS))
def test_planted_trace_faults_are_caught_by_their_check(correct_runs, tmp_path, fault):
    run_dir = plant_trace_fault(correct_runs["adapmixed"], tmp_path / fault, fault)
    report = audit_run(run_dir, mc_samples=100, play_game=False)
    assert report.verdict == "FAIL"
    assert report.check(FAULTS[fault].caught_by).status is Status.FAIL


def test_cli_exit_status_follows_the_verdict(correct_runs, tmp_path, capsys):
    assert main(["audit", str(correct_runs["pmixed"]), "--no-game", "--mc-samples", "50"]) == 0
    assert "PASS" in capsys.readouterr().out
    broken = plant_trace_fault(correct_runs["pmixed"], tmp_path / "broken", "record_edited")
    assert main(["audit", str(broken), "--no-game", "--mc-samples", "50"]) == 1
    assert "FAIL for add-or-remove-one (failed: hash_chain" in capsys.readouterr().out


def test_ablation_composes_exact_leave_one_out_divergences_per_direction(correct_runs):
    loaded = load_trace(correct_runs["pmixed"])
    result = run_ablation(loaded, 1e-5, orders=(2.0, 6.0))
    forward = np.zeros(2)
    for _, records, logits in loaded.iter_payload():
        probs = torch.softmax(logits.double(), -1).numpy()
        public, teachers = probs[0], probs[1:]
        lam = np.asarray([r["lambdas"] for r in records])
        mixed = lam.T[:, :, None] * teachers + (1 - lam.T[:, :, None]) * public
        p = mixed.mean(axis=0)
        without = mixed[1:].mean(axis=0)  # remove teacher 0
        forward += renyi_divergence(p, without, [2.0, 6.0]).sum(axis=0)
    at = [result.orders.index(order) for order in (2.0, 6.0)]  # the claim's smallest and optimal orders join them
    np.testing.assert_allclose(result.forward[0][at], forward, rtol=1e-9)


def test_subsampled_output_law_matches_enumeration_of_subsets(rng):
    n, q, vocab = 4, 0.3, 5
    public = rng.dirichlet(np.ones(vocab))
    mixed = rng.dirichlet(np.ones(vocab), size=n)
    expected = np.zeros(vocab)
    for mask in itertools.product([0, 1], repeat=n):
        size = sum(mask)
        probability = np.prod([q if m else 1 - q for m in mask])
        expected += probability * (mixed[np.array(mask, bool)].mean(axis=0) if size else public)
    law = ensemble_output(torch.from_numpy(mixed.sum(0)), torch.tensor(n), torch.from_numpy(public), q)
    np.testing.assert_allclose(law.numpy(), expected, rtol=1e-12)


def test_monte_carlo_screening_matches_the_noise_free_statistic_of_each_ensemble(rng):
    """With sigma ~ 0 the pass decision is deterministic: each ensemble (all teachers, each removed,
    each added adversary) must pass exactly when its explicitly averaged screened mean does."""
    from dpledger.audit.ablation import screen_pass_counts

    n, vocab, k, alpha, lam = 4, 30, 8, 6.0, 0.5
    public = rng.dirichlet(np.ones(vocab))
    teachers = rng.dirichlet(np.ones(vocab) * 0.3, size=n)
    top = np.argsort(public)[::-1][:k]
    ensembles = [list(range(n))] + [[j for j in range(n) if j != i] for i in range(n)]
    statistics = []
    for members in ensembles:
        mean = lam * teachers[members][:, top].mean(axis=0) + (1 - lam) * public[top]
        statistics.append(renyi_divergence(mean / mean.sum(), public[top] / public[top].sum(), alpha))
    ranked = sorted(statistics)
    threshold = float(ranked[2] + ranked[3]) / 2  # between two statistics: no ties with the noise
    sums = torch.from_numpy(np.stack([teachers[m].sum(axis=0) for m in ensembles]))[None]
    sizes = torch.tensor([[len(m) for m in ensembles]])
    params = {"lam": lam, "sigma": 1e-12, "threshold": threshold, "alpha": alpha, "top_k": k}
    counts = screen_pass_counts(sums, sizes, torch.from_numpy(public)[None], params, 50, torch.Generator().manual_seed(0))
    expected = [50.0 if s <= threshold else 0.0 for s in statistics]
    assert counts[0].tolist() == expected and 0 < sum(expected) < 50 * len(ensembles)


def randomized_response(epsilon):
    keep = math.exp(epsilon) / (1 + math.exp(epsilon))
    return (lambda n, rng: rng.random(n) < keep), (lambda n, rng: rng.random(n) >= keep)


def test_lower_bound_covers_randomized_response_and_is_tight_with_ample_samples():
    true_epsilon = 1.0
    sample_in, sample_out = randomized_response(true_epsilon)
    bounds = [distinguishing_game(sample_in, sample_out, lambda x: x, 2000, 1e-6, 0.95, seed).epsilon_lower_bound
              for seed in range(200)]
    coverage = np.mean(np.asarray(bounds) <= true_epsilon)
    assert coverage >= 0.95
    ample = distinguishing_game(sample_in, sample_out, lambda x: x, 2_000_000, 1e-6, 0.95, 0).epsilon_lower_bound
    assert true_epsilon / 1.1 <= ample <= true_epsilon


def test_lower_bound_covers_the_gaussian_mechanism():
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    sigma, delta = 1.0, 1e-3
    accountant = PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_accounting.GaussianDpEvent(sigma))
    true_epsilon = accountant.get_epsilon(delta)  # independent reference: privacy loss distributions
    sample_in = lambda n, rng: rng.normal(1.0, sigma, n)
    sample_out = lambda n, rng: rng.normal(0.0, sigma, n)
    threshold = 2.5
    bounds = [distinguishing_game(sample_in, sample_out, lambda x: x > threshold, 5000, delta, 0.95, seed)
              .epsilon_lower_bound for seed in range(100)]
    assert np.mean(np.asarray(bounds) <= true_epsilon) >= 0.95
    ample = distinguishing_game(sample_in, sample_out, lambda x: x > threshold, 4_000_000, delta, 0.95, 0)
    assert true_epsilon / 3 <= ample.epsilon_lower_bound <= true_epsilon  # one threshold test is not optimal


def test_epsilon_lower_bound_edges():
    assert epsilon_lower_bound(0, 0, 100, 1e-5) == 0.0
    assert epsilon_lower_bound(100, 0, 100, 1e-5) > 3.0
    with pytest.raises(ValueError, match="trials must be an integer >= 1, got 0"):
        epsilon_lower_bound(0, 0, 0, 1e-5)


def test_truncated_corrupted_and_foreign_directories_name_the_file(correct_runs, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    with pytest.raises(trace.TraceError, match=r"foreign/manifest.json: missing"):
        load_trace(foreign)
    (foreign / "manifest.json").write_text('{"format": "something-else"}')
    with pytest.raises(trace.TraceError, match="not a dpledger trace manifest"):
        load_trace(foreign)
    (foreign / "manifest.json").write_text("{not json")
    with pytest.raises(trace.TraceError, match="manifest.json: not valid JSON"):
        load_trace(foreign)
    unfinished = tmp_path / "unfinished"
    shutil.copytree(correct_runs["pmixed"], unfinished)
    (unfinished / "final.json").unlink()
    with pytest.raises(trace.TraceError, match="final.json: missing; the run is unfinished"):
        load_trace(unfinished)
    no_ledger = tmp_path / "no_ledger"
    shutil.copytree(correct_runs["pmixed"], no_ledger)
    (no_ledger / "ledger.json").unlink()
    with pytest.raises(trace.TraceError, match="ledger.json: missing"):
        load_trace(no_ledger)
    corrupted = tmp_path / "corrupted"
    shutil.copytree(correct_runs["pmixed"], corrupted)
    chunk = trace.chunk_path(corrupted, 1)
    chunk.write_bytes(chunk.read_bytes()[:100])
    with pytest.raises(trace.TraceError, match="chunk-000001.parquet: unreadable Parquet chunk"):
        load_trace(corrupted)
    payload = tmp_path / "payload"
    shutil.copytree(correct_runs["pmixed"], payload)
    trace.replay_path(payload, 0).write_bytes(b"garbage")
    report = audit_run(payload, play_game=False, mc_samples=50)
    assert report.verdict == "FAIL" and report.check("payload").status is Status.FAIL
    assert "block-000000.npy: sha256 differs from the hash chained in its records" in report.check("payload").detail


def test_replay_without_payload_recomputes_from_the_models(micro_models, tmp_path):
    config = config_from_dict(micro_config(micro_models, tmp_path / "nopayload", ADAPMIXED, queries=64,
                                           replay_payload=False))
    run_dir = run_decode(config, progress=False, verbose=False).directory
    assert not (run_dir / "replay").exists()
    loaded = load_trace(run_dir)
    assert loaded.logits_source == "models"
    report = audit_run(run_dir, mc_samples=50, play_game=False)
    assert report.check("replay").status is Status.PASS and "the run's models, re-run" in report.check("replay").detail
    assert report.verdict == "PASS"


def _claim(run_dir: Path, relation: str) -> None:
    manifest = json.loads((run_dir / trace.MANIFEST).read_text())
    manifest["relation"] = relation
    trace.atomic_write_json(run_dir / trace.MANIFEST, manifest)


def test_claimed_relation_not_covered_by_the_charges_fails_naming_it(micro_models, tmp_path):
    """A remove-one run (Eq. 3 only) whose manifest claims add-or-remove: relation_coverage FAILs
    with the relation named, and the ablation judges the add-one adversaries as claimed."""
    run_dir = tmp_path / "remove"
    config = config_from_dict(micro_config(micro_models, run_dir, ADAPMIXED, queries=32, relation="remove_one"))
    run_decode(config, progress=False, verbose=False)
    honest = audit_run(run_dir, mc_samples=100, play_game=False, write=False)
    coverage = honest.check("relation_coverage")
    assert coverage.status is Status.PASS and coverage.evidence["covered_relation"] == "remove_one"
    assert honest.headline.startswith(f"{honest.verdict} for remove-one")
    add_one = honest.relations["add_one"]
    assert not add_one["claimed"] and not add_one["charged_for"]
    assert ("NOT COVERED" in honest.headline) == (not add_one["within_claim"])
    _claim(run_dir, "add_or_remove_one")
    report = audit_run(run_dir, mc_samples=100, play_game=False, write=False)
    assert report.verdict == "FAIL"
    coverage = report.check("relation_coverage")
    assert coverage.status is Status.FAIL
    assert "claims add-or-remove-one but its charged loss covers remove-one only" in coverage.detail
    assert "adding a teacher" in coverage.detail
    assert report.relations["add_one"]["claimed"]


def test_trace_without_component_relations_reads_eq3_as_remove_one(correct_runs, tmp_path):
    """Traces written before components carried a relation labelled Eq. 3 add-or-remove."""
    run_dir = tmp_path / "old"
    shutil.copytree(correct_runs["adapmixed"], run_dir)
    manifest = json.loads((run_dir / trace.MANIFEST).read_text())
    del manifest["mechanism"]["component_relations"]
    trace.atomic_write_json(run_dir / trace.MANIFEST, manifest)
    report = audit_run(run_dir, mc_samples=100, play_game=False, write=False)
    assert report.check("relation_coverage").status is Status.FAIL
