"""Hot vs cold PATE (dpledger.reports.hotpate): the experiment on in-context teachers of the micro models."""
import json
import math

import numpy as np
import pytest

from dpledger.mechanisms.diversity import mean_diversity_curve
from dpledger.mechanisms.pate import ConfidentGNMax
from dpledger.reports.hotpate import (NOISE_PER_THRESHOLD, dpargmax_yields, hot_vs_cold, hotpate_html, hotpate_markdown,
                             matched_privacy_cost, teacher_distributions, write_hotpate)
from tests.micro import MICRO_CORPUS


@pytest.fixture(scope="module")
def micro_icl_distributions(micro_models):
    from transformers import AutoTokenizer

    from dpledger.decoding.corpus import generate_corpus
    from dpledger.decoding.icl import load_icl_ensemble
    from dpledger.decoding.recipe import encode_documents

    corpus = generate_corpus(seed=0, teachers=16, **MICRO_CORPUS)
    ensemble = load_icl_ensemble(str(micro_models.public), str(micro_models.tokenizer), 16, 16, corpus=corpus)
    tokens = encode_documents(AutoTokenizer.from_pretrained(str(micro_models.tokenizer)), corpus.private_heldout)
    return teacher_distributions(ensemble, tokens, queries=12)


def test_hot_vs_cold_on_in_context_teachers(micro_icl_distributions, tmp_path):
    distributions = micro_icl_distributions
    assert distributions.shape[:2] == (12, 16)
    np.testing.assert_allclose(distributions.sum(axis=-1), 1.0, rtol=1e-9)
    result = hot_vs_cold(distributions, samples=60, seed=3)
    assert result.thresholds[0] == 1 and result.thresholds[-1] == 16
    # paired with the diversity module's own curves (same seeds)
    hot = mean_diversity_curve(distributions, result.thresholds, True, 60, 3)
    assert hot.coverage == result.hot.coverage
    for curve in (result.hot, result.cold):
        assert all(a >= b - 1e-12 for a, b in zip(curve.yield_, curve.yield_[1:]))
        assert all(a >= b - 1e-12 for a, b in zip(curve.coverage, curve.coverage[1:]))
    assert result.hot_coverage_higher_from_quarter == all(
        h > c for t, h, c in zip(result.thresholds, result.hot.coverage, result.cold.coverage) if t >= 4)
    paths = write_hotpate(result, tmp_path / "out")
    loaded = json.loads(paths["json"].read_text(), parse_constant=lambda name: pytest.fail(f"non-strict JSON {name}"))
    assert loaded["teachers"] == 16 and loaded["hot"]["coordinated"] is True
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Hot vs cold PATE" in hotpate_markdown(result) and "<img" in hotpate_html(result)


def test_matched_cost_is_confident_gnmax_at_the_largest_threshold_reaching_the_yield(micro_icl_distributions):
    """The threshold is the largest whose DPARGMAX yield (its noisy screen's pass rate, recomputed
    here from the votes) reaches the target, and the cost is Confident-GNMax's at it."""
    from scipy.stats import norm

    from dpledger.accounting.conversion import epsilon_from_rdp
    from dpledger.accounting.orders import default_orders
    from dpledger.mechanisms.diversity import query_seed, vote_draws

    thresholds, target = (2, 4, 8, 12, 16), 0.5
    yields = dpargmax_yields(micro_icl_distributions, thresholds, False, 40, 0)
    maxima = np.concatenate([np.bincount(row, minlength=query.shape[-1]).max(keepdims=True)
                             for index, query in enumerate(micro_icl_distributions)
                             for row in vote_draws(query, False, 40, query_seed(0, index))])
    for threshold, value in zip(thresholds, yields):
        expected = norm.cdf((maxima - threshold) / (NOISE_PER_THRESHOLD * threshold)).mean()
        assert math.isclose(value, expected, rel_tol=1e-12)
    entry = matched_privacy_cost(thresholds, yields, 16, target, 500, 1e-6)
    reached = [t for t, y in zip(thresholds, yields) if y >= target]
    if not reached:
        assert entry["threshold"] is None and entry["epsilon"] is None
        return
    threshold = max(reached)
    assert entry["threshold"] == threshold and entry["sigma"] == NOISE_PER_THRESHOLD * threshold
    assert entry["dpargmax_yield"] >= target and entry["at_ceiling"] == (threshold == 16)
    expected = epsilon_from_rdp(ConfidentGNMax(threshold, entry["sigma"], entry["sigma"]).rdp_curve(default_orders())
                                .composed(500), 1e-6).epsilon
    assert math.isclose(entry["epsilon"], expected, rel_tol=1e-12)
    from tests.test_cli_account import gaussian_reference  # the same cost from dp-accounting

    noise = entry["sigma"]
    assert entry["epsilon"] == pytest.approx(gaussian_reference([(noise, 500), (noise / math.sqrt(2.0), 500)], 1e-6),
                                             rel=1e-9)


def test_a_higher_usable_threshold_costs_less():
    """Identical teachers spread over 8 tokens: hot votes agree (yield 1 at T = N), cold ones spread
    out, so at a matched yield hot runs at a larger T and pays a smaller epsilon."""
    teachers = np.full((4, 32, 8), 1 / 8)
    result = hot_vs_cold(teachers, samples=50)
    hot, cold = result.matched["hot"], result.matched["cold"]
    assert hot["threshold"] == 32 and hot["at_ceiling"] and hot["dpargmax_yield"] >= 0.5
    assert cold["threshold"] < 16 and cold["dpargmax_yield"] >= 0.5
    assert result.matched["cold_over_hot"] > 4
    assert "each at a yield of at least 0.5" in hotpate_markdown(result)
    assert result.hot_coverage_higher_from_quarter


@pytest.mark.parametrize("flags, message", [
    (["--teachers", "1"], "teachers must be an integer >= 2, got 1"),
    (["--target-yield", "1.5"], "target_yield must be in (0, 1), got 1.5"),
    (["--samples", "1"], "samples must be an integer >= 2, got 1"),
    (["--delta", "2"], "delta must be in (0, 1), got 2"),
    (["--budget-queries", "0"], "budget_queries must be an integer >= 1, got 0"),
])
def test_hotpate_cli_refuses_bad_input_with_one_line(flags, message, tmp_path, capsys):
    from dpledger.cli import main

    assert main(["hotpate", "--out", str(tmp_path / "x"), *flags]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
    assert not (tmp_path / "x").exists()
