"""The measures `dpledger hotpate` reports beside the privacy numbers: distinct-n and self-BLEU
(dpledger.reports.text_diversity), the public Hot PATE code's vote statistics and the largest preserved beta
(dpledger.mechanisms.diversity), each against a reference written from its definition."""
import itertools
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from dpledger.mechanisms.diversity import diversity_preservation, largest_preserved_beta, vote_statistics
from dpledger.reports.text_diversity import bleu, distinct_n, self_bleu


def reference_bleu(hypothesis, references, max_n=4):
    """Papineni et al. 2002 with exact fractions: clipped precisions, geometric mean, brevity penalty."""
    precisions = []
    for n in range(1, max_n + 1):
        grams = [tuple(hypothesis[i:i + n]) for i in range(len(hypothesis) - n + 1)]
        if not grams:
            return 0.0
        clipped = 0
        for gram in set(grams):
            most = max(sum(1 for i in range(len(r) - n + 1) if tuple(r[i:i + n]) == gram) for r in references)
            clipped += min(grams.count(gram), most)
        if clipped == 0:
            return 0.0
        precisions.append(Fraction(clipped, len(grams)))
    closest = sorted(references, key=lambda r: (abs(len(r) - len(hypothesis)), len(r)))[0]
    penalty = 1.0 if len(hypothesis) > len(closest) else math.exp(1 - len(closest) / len(hypothesis))
    return penalty * math.exp(sum(math.log(p) for p in precisions) / max_n)


@pytest.mark.parametrize("seed", range(5))
def test_bleu_and_self_bleu_follow_the_definition(seed):
    rng = np.random.default_rng(seed)
    sequences = [list(rng.integers(0, 3, rng.integers(3, 9))) for _ in range(4)]
    for index, hypothesis in enumerate(sequences):
        others = sequences[:index] + sequences[index + 1:]
        assert bleu(hypothesis, others) == pytest.approx(reference_bleu(hypothesis, others), rel=1e-12)
    expected = sum(reference_bleu(h, sequences[:i] + sequences[i + 1:]) for i, h in enumerate(sequences)) / 4
    assert self_bleu(sequences) == pytest.approx(expected, rel=1e-12)
    assert self_bleu([[1, 2, 3, 4, 5]] * 3) == 1.0 and self_bleu([[1, 2, 3, 4], [5, 6, 7, 8]]) == 0.0
    with pytest.raises(ValueError, match="need at least 2 sequences, got 1"):
        self_bleu([[1, 2]])


@pytest.mark.parametrize("seed", range(3))
def test_distinct_n_counts_distinct_ngrams(seed):
    rng = np.random.default_rng(seed)
    sequences = [list(rng.integers(0, 4, 6)) for _ in range(5)]
    for n in (1, 2, 3):
        grams = [tuple(s[i:i + n]) for s in sequences for i in range(len(s) - n + 1)]
        assert distinct_n(sequences, n) == len(set(grams)) / len(grams)
    assert distinct_n([[1]], 2) is None


@pytest.mark.parametrize("seed", range(3))
def test_vote_statistics_by_brute_force(seed):
    rng = np.random.default_rng(seed)
    histograms = rng.multinomial(10, rng.dirichlet(np.ones(6)), size=30)
    stats = vote_statistics(histograms, (1, 3, 5, 10))
    for k, threshold in enumerate((1, 3, 5, 10)):
        expected = np.mean([sum(c for c in row if c >= threshold) / 10 for row in histograms])
        assert stats.transferred_mass[k] == pytest.approx(expected, rel=1e-12)
    assert stats.max_passing_threshold == pytest.approx(np.mean([max(row) for row in histograms]))
    assert stats.margin == pytest.approx(np.mean([sorted(row)[-1] - sorted(row)[-2] for row in histograms]))
    with pytest.raises(ValueError, match="every histogram must count the same N"):
        vote_statistics(np.array([[1, 2], [1, 1]]), (1,))


@pytest.mark.parametrize("seed, tau", list(itertools.product(range(4), (1, 2, 3))))
def test_largest_preserved_beta_is_where_the_transfer_condition_stops_holding(seed, tau):
    rng = np.random.default_rng(seed)
    teachers = rng.dirichlet(np.ones(5) * 0.5, 4)
    law = 0.9 * rng.dirichlet(np.ones(5))
    grid = (0.1, 0.3, 0.6)
    beta = largest_preserved_beta(law, teachers, tau, grid)
    counts = Counter()
    for j in range(5):  # the constrained tokens from the definition
        for q in grid:
            c = sum(teachers[i, j] >= q for i in range(4))
            if c >= tau:
                counts[j] = max(counts[j], c / 4 * q)
    if not counts:
        assert beta is None
        return
    expected = min(1.0, min(law[j] / need for j, need in counts.items()))
    assert beta == pytest.approx(expected, rel=1e-12)
    if 0 < beta < 1:
        assert diversity_preservation(law, teachers, tau, beta * (1 - 1e-9), 100.0, grid).transfer_holds
        assert not diversity_preservation(law, teachers, tau, min(1.0, beta * (1 + 1e-6)), 100.0, grid).transfer_holds
