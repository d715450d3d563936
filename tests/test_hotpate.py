"""Hot vs cold PATE (dpledger.reports.hotpate): the experiment on in-context teachers of the micro models,
its accounting against dp-accounting, its laws against the aggregators' own classes, and the CLI."""
import json
import math

import numpy as np
import pytest

from dpledger.reports.hotpate import (NO_DP, TeacherDistributions, _first_release, _tws_laws, calibrated_noise,
                                      dpargmax_epsilon, dpws_epsilon, hot_vs_cold, hotpate_html, hotpate_markdown,
                                      mixed_teachers, pooled_utility, read_partitioned_dataset, run_hotpate,
                                      tempered_distributions, write_hotpate)
from dpledger.reports.law_utility import output_law_utility
from tests.test_cli_account import gaussian_reference  # dp-accounting's RDP epsilon of Gaussian events

SMALL = dict(samples=20, thresholds=(1, 2, 3, 4), epsilons=(4.0, 256.0), budget_queries=100)


def synthetic(queries=3, teachers=4, vocabulary=6, seed=0, identical=False):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(queries, 1 if identical else teachers, vocabulary)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    probs = np.broadcast_to(probs, (queries, teachers, vocabulary)).copy()
    public = np.full((queries, vocabulary), 1.0 / vocabulary)
    return TeacherDistributions(probs, public, rng.integers(0, vocabulary, queries))


def reference_tempered(logits, temperature, top_p):
    """softmax(l / t), then the nucleus from the definition: most likely first, keep while the mass before is < p."""
    scaled = [x / temperature for x in logits]
    top = max(scaled)
    weights = [math.exp(x - top) for x in scaled]
    probs = [w / sum(weights) for w in weights]
    kept, before = set(), 0.0
    for index in sorted(range(len(probs)), key=lambda i: -probs[i]):
        if before < top_p:
            kept.add(index)
        before += probs[index]
    total = sum(probs[i] for i in kept)
    return [probs[i] / total if i in kept else 0.0 for i in range(len(probs))]


@pytest.mark.parametrize("seed", range(4))
def test_tempered_distributions_follow_the_definition(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(3, 9)) * 3
    temperature, top_p = float(rng.uniform(0.3, 2.0)), float(rng.uniform(0.2, 1.0))
    got = tempered_distributions(logits, temperature, top_p)
    for row, out in zip(logits, got):
        np.testing.assert_allclose(out, reference_tempered(list(row), temperature, top_p), rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="temperature must be in \\(0, inf\\), got 0"):
        tempered_distributions(logits, 0.0)
    with pytest.raises(ValueError, match="top_p must be in \\[0, 1\\], got 1.5"):
        tempered_distributions(logits, 1.0, 1.5)
    with pytest.raises(ValueError, match="finite"):
        tempered_distributions(np.array([[0.0, np.nan]]))


def test_mixed_teachers_spans_shared_to_own():
    shared, own = synthetic(seed=1).teachers, synthetic(seed=2).teachers
    np.testing.assert_array_equal(mixed_teachers(shared, own, 0.0), shared)
    np.testing.assert_array_equal(mixed_teachers(shared, own, 1.0), own)
    np.testing.assert_allclose(mixed_teachers(shared, own, 0.2).sum(-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(mixed_teachers(shared, own, 0.2), 0.8 * shared + 0.2 * own, rtol=1e-15)
    with pytest.raises(ValueError, match="heterogeneity must be in \\[0, 1\\], got 1.5"):
        mixed_teachers(shared, own, 1.5)


@pytest.mark.parametrize("relation, sensitivity", [("add_or_remove_one", 1.0), ("replace_one", math.sqrt(2.0))])
@pytest.mark.parametrize("retries", [0, 2])
def test_retry_accounting_matches_dp_accounting(retries, relation, sensitivity):
    """(r + 1) screens N(0, s1^2) at sensitivity 1 and one answer N(0, s2^2) at the relation's sensitivity s
    (1 adding or removing a teacher, sqrt(2) replacing one) per query for DPARGMAX, (r + 1) noisy histograms at
    s for DPWS, composed over Q queries."""
    queries, delta = 300, 1e-6
    s1, s2 = 37.0, 53.0
    assert dpargmax_epsilon(s1, s2, queries, retries, delta, relation)[0] == pytest.approx(
        gaussian_reference([(s1, queries * (retries + 1)), (s2 / sensitivity, queries)], delta), rel=1e-9)
    assert dpws_epsilon(s2, queries, retries, delta, 16, relation)[0] == pytest.approx(
        gaussian_reference([(s2 / sensitivity, queries * (retries + 1))], delta), rel=1e-9)


def test_calibrated_noise_meets_each_target_and_retries_cost_noise():
    plain = calibrated_noise((1.0, 8.0), 1e-5, 200, 0, 16)
    retried = calibrated_noise((1.0, 8.0), 1e-5, 200, 2, 16)
    replaced = calibrated_noise((1.0, 8.0), 1e-5, 200, 0, 16, "replace_one")
    for noise in (plain, retried, replaced):
        for name in ("DPARGMAX", "DPWS"):
            for entry in noise[name]:
                assert 0.99 * entry["target_epsilon"] <= entry["epsilon"] <= entry["target_epsilon"]
    for name in ("DPARGMAX", "DPWS"):
        assert all(r["sigma"] > p["sigma"] for p, r in zip(plain[name], retried[name]))
        assert all(r["sigma"] > p["sigma"] for p, r in zip(plain[name], replaced[name]))
        assert plain[name][0]["sigma"] > plain[name][1]["sigma"]


def test_batched_laws_are_the_aggregators_own():
    from dpledger.mechanisms.hot_pate import DPWeightedSampler, ThresholdWeightedSampler

    rng = np.random.default_rng(5)
    counts = rng.multinomial(12, np.full(7, 1 / 7), size=20).astype(np.float64)
    for threshold, gamma in ((1, 1.0), (3, 1.5), (6, 4.0)):
        batched = _tws_laws(counts, threshold, gamma, 12.0)
        for row, law in zip(counts, batched):
            np.testing.assert_allclose(law, ThresholdWeightedSampler(threshold, gamma).probabilities(row), rtol=1e-15)
        noise = rng.normal(size=counts.shape) * 2.0
        batched = _tws_laws(np.maximum(counts + noise, 0.0), threshold, gamma, 12.0)
        sampler = DPWeightedSampler(2.0, threshold, gamma, voters=12)
        for row, draws, law in zip(counts, noise, batched):
            np.testing.assert_allclose(law, sampler.probabilities_given_noise(row, draws), rtol=1e-15)


def test_retries_release_the_first_attempt_that_passes():
    attempts = np.array([[[0.5, 0.0, 0.0], [0.0, 0.25, 0.25]]])  # attempt 1 releases token 0 w.p. 1/2
    law, fail = _first_release(attempts)
    np.testing.assert_allclose(law[0], [0.5, 0.125, 0.125])
    np.testing.assert_allclose(fail, [0.25])


def test_pooled_utility_is_output_law_utility_of_all_queries():
    rng = np.random.default_rng(2)
    laws, reference = rng.dirichlet(np.ones(5), 6), rng.dirichlet(np.ones(5), 6)
    targets = rng.integers(0, 5, 6)
    pooled = pooled_utility([output_law_utility(laws[q:q + 1], reference[q:q + 1], targets[q:q + 1]) for q in range(6)])
    direct = output_law_utility(laws, reference, targets)
    assert pooled.keys() == direct.keys()
    for key in direct:
        assert pooled[key] == pytest.approx(direct[key], rel=1e-12)


def test_identical_teachers_hot_uses_a_higher_threshold_and_a_smaller_epsilon():
    """Identical teachers spread over 8 tokens: hot votes agree (every T passes), cold ones spread out, so at a
    matched coverage hot runs at T = N and reaches it at a smaller epsilon."""
    data = TeacherDistributions(np.full((3, 16, 8), 1 / 8), np.full((3, 8), 1 / 8), np.array([0, 1, 2]))
    result = hot_vs_cold(data, samples=40, thresholds=(2, 4, 8, 12, 16), epsilons=(2.0, 8.0, 32.0, 128.0),
                         budget_queries=100, target_coverage=0.9)
    targmax = result.matched_coverage["TARGMAX"]
    assert targmax["hot"]["threshold"] == 16 and targmax["epsilon_label"] == NO_DP
    assert targmax["cold"] is None or targmax["cold"]["threshold"] <= 4
    hot_rows = [r for r in result.grid if r["scheme"] == "hot" and r["mechanism"] == "TARGMAX"]
    assert all(r["yield"] == 1.0 for r in hot_rows)  # every hot round is unanimous
    dpargmax = result.matched_coverage["DPARGMAX"]
    assert dpargmax["hot"] is not None
    if dpargmax["cold"] is not None:
        assert dpargmax["epsilon_cold_over_hot"] == dpargmax["cold"]["epsilon"] / dpargmax["hot"]["epsilon"]
    at_n = {r["scheme"]: r["yield"] for r in result.grid
            if r["mechanism"] == "DPARGMAX" and r["threshold"] == 16 and r["target_epsilon"] == 128.0}
    assert at_n["hot"] > 0.4 > 0.01 > at_n["cold"]  # hot's unanimous count N passes a screen at T = N half the time
    assert all(h >= c for h, c in zip(result.hot.coverage, result.cold.coverage))
    assert result.vote_statistics["hot"]["margin"] == 16 and result.vote_statistics["hot"]["max_passing_threshold"] == 16


def test_dpargmax_yield_is_the_screen_pass_probability():
    """All teachers on token 0: every round's top count is N, so DPARGMAX's yield is Phi((N - T) / s1) exactly."""
    from scipy.stats import norm

    teachers = np.zeros((2, 8, 4))
    teachers[..., 0] = 1.0
    data = TeacherDistributions(teachers, np.full((2, 4), 0.25), np.array([0, 0]))
    result = hot_vs_cold(data, samples=10, thresholds=(4, 8), epsilons=(50.0,), budget_queries=10, retries=1)
    for row in result.grid:
        if row["mechanism"] == "DPARGMAX":
            passed = norm.cdf((8 - row["threshold"]) / row["sigma_threshold"])
            assert row["yield"] == pytest.approx(1 - (1 - passed) ** 2, rel=1e-12)  # two attempts
            assert row["epsilon"] <= 50.0 and row["retries"] == 1


def test_frontier_rows_carry_the_shared_keys():
    result = hot_vs_cold(synthetic(queries=2), **SMALL)
    keys = {"mechanism", "scheme", "epsilon", "delta", "budget_queries", "tv_to_reference", "reference_top1_mass",
            "target_probability", "target_cross_entropy", "coverage", "yield", "threshold"}
    assert all(keys <= row.keys() for row in result.frontier)
    assert {row["mechanism"] for row in result.frontier} == {"TARGMAX", "TWS", "DPARGMAX", "DPWS"}
    for row in result.frontier:
        assert (row["epsilon"] is None) == (row["mechanism"] in ("TARGMAX", "TWS"))
        assert row["epsilon_label"] == (NO_DP if row["epsilon"] is None else None)


def test_run_hotpate_on_your_own_model_and_examples(micro_models, tmp_path):
    """--model, --examples, --heldout, temperature, top-p, heterogeneity and retries on the micro models."""
    from dpledger.decoding.corpus import generate_corpus
    from dpledger.decoding.icl import partition_records
    from tests.micro import MICRO_CORPUS

    corpus = generate_corpus(seed=0, teachers=6, **MICRO_CORPUS)
    examples = tmp_path / "examples.json"
    examples.write_text(json.dumps(partition_records(corpus, 6)))
    result = run_hotpate(6, queries=3, samples=10, prompt_tokens=16, model=str(micro_models.public),
                         tokenizer=str(micro_models.tokenizer), examples=str(examples),
                         heldout=str(micro_models.heldout_text), temperature=0.8, top_p=0.9, heterogeneity=0.5,
                         retries=1, thresholds=(1, 3, 6), epsilons=(8.0,), budget_queries=50, verbose=False)
    assert result.teachers == 6 and result.queries == 3 and result.retries == 1
    assert result.source["heterogeneity"] == 0.5 and result.source["dtype"] == "float32"
    paths = write_hotpate(result, tmp_path / "out")
    loaded = json.loads(paths["json"].read_text(), parse_constant=lambda name: pytest.fail(f"non-strict JSON {name}"))
    assert loaded["format"] == "dpledger-hotpate" and loaded["version"] == 2
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = hotpate_markdown(result)
    assert "Non-private ceiling" in markdown and "Matched coverage" in markdown and "Matched epsilon" in markdown
    assert "<img" in hotpate_html(result)


def test_teacher_distributions_keep_public_and_targets(micro_models):
    from transformers import AutoTokenizer

    from dpledger.decoding.corpus import generate_corpus
    from dpledger.decoding.icl import load_icl_ensemble
    from dpledger.decoding.recipe import encode_documents
    from dpledger.reports.hotpate import teacher_distributions
    from tests.micro import MICRO_CORPUS

    corpus = generate_corpus(seed=0, teachers=4, **MICRO_CORPUS)
    ensemble = load_icl_ensemble(str(micro_models.public), str(micro_models.tokenizer), 4, 16, corpus=corpus)
    tokens = encode_documents(AutoTokenizer.from_pretrained(str(micro_models.tokenizer)), corpus.private_heldout)
    data = teacher_distributions(ensemble, tokens, queries=40)  # two windows of 32 query positions
    assert data.teachers.shape[:2] == (40, 4) and data.public.shape == (40, data.teachers.shape[2])
    np.testing.assert_array_equal(data.targets[:32], tokens[17:49])
    np.testing.assert_array_equal(data.targets[32:], tokens[48 + 17:48 + 25])
    np.testing.assert_allclose(data.public.sum(-1), 1.0, rtol=1e-9)


def test_read_partitioned_dataset(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps({"user": u, "text": f"record {i} of {u}"})
                              for i, u in enumerate(["b", "a", "c", "a", "b"])) + "\n")
    groups = read_partitioned_dataset(path, "user", 2)
    assert groups == [["record 1 of a", "record 3 of a", "record 2 of c"], ["record 0 of b", "record 4 of b"]]
    with pytest.raises(ValueError, match="3 distinct 'user' values, fewer than the 4 teachers"):
        read_partitioned_dataset(path, "user", 4)
    path.write_text('{"user": "a"}\n')
    with pytest.raises(ValueError, match="line 1 must be an object with 'user' and a non-empty string 'text'"):
        read_partitioned_dataset(path, "user", 2)


@pytest.mark.parametrize("flags, message", [
    (["--teachers", "1"], "teachers must be an integer >= 2, got 1"),
    (["--teachers", "513"], "teachers must be <= 512, got 513"),
    (["--samples", "1"], "samples must be an integer >= 2, got 1"),
    (["--delta", "2"], "delta must be in (0, 1), got 2"),
    (["--budget-queries", "0"], "budget_queries must be an integer >= 1, got 0"),
    (["--temperature", "0"], "temperature must be in (0, inf), got 0"),
    (["--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
    (["--heterogeneity", "2"], "heterogeneity must be in [0, 1], got 2"),
    (["--gamma", "0.5"], "gamma must be in [1, inf], got 0.5"),
    (["--retries", "-1"], "retries must be an integer >= 0, got -1"),
    (["--dtype", "float8"], "dtype must be auto, float32, bfloat16, float16, got 'float8'"),
    (["--model", "x"], "--model needs the teachers' examples"),
    (["--dataset", "x.jsonl"], "--dataset needs --partition-key"),
])
def test_hotpate_cli_refuses_bad_input_with_one_line(flags, message, tmp_path, capsys):
    from dpledger.cli import main

    assert main(["hotpate", "--out", str(tmp_path / "x"), *flags]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
    assert not (tmp_path / "x").exists()
