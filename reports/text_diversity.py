"""Diversity of generated token sequences: distinct-n (Li et al. 2016, "A Diversity-Promoting Objective
Function for Neural Conversation Models", Section 4.3) and self-BLEU (Zhu et al. 2018, "Texygen",
Section 2.2.4: the mean BLEU of each sequence against all the others as references; BLEU as Papineni
et al. 2002, "BLEU", Sections 2.1 and 2.2.1, uniform weights, no smoothing).

Low self-BLEU and high distinct-n mean diverse sequences. Both work on token ids, so no tokenizer is needed.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

from dpledger.accounting.errors import require


def _ngrams(sequence: Sequence[int], n: int) -> Counter:
    return Counter(tuple(sequence[i:i + n]) for i in range(len(sequence) - n + 1))


def _validated(sequences: Sequence[Sequence[int]], n: int, least: int) -> list[tuple[int, ...]]:
    require(isinstance(n, int) and not isinstance(n, bool) and n >= 1, f"n must be an integer >= 1, got {n!r}")
    rows = [tuple(int(token) for token in sequence) for sequence in sequences]
    require(len(rows) >= least, f"need at least {least} sequences, got {len(rows)}")
    return rows


def distinct_n(sequences: Sequence[Sequence[int]], n: int) -> float | None:
    """distinct-n: the number of distinct n-grams over all sequences divided by the number of n-grams.

    Args:
        sequences: token-id sequences (at least one).
        n: the n-gram length (>= 1).

    Returns:
        The ratio in (0, 1], or None when no sequence is as long as n.

    Raises:
        ValueError: if there is no sequence or n < 1.
    """
    rows = _validated(sequences, n, 1)
    pooled: Counter = Counter()
    for row in rows:
        pooled.update(_ngrams(row, n))
    total = sum(pooled.values())
    return len(pooled) / total if total else None


def bleu(hypothesis: Sequence[int], references: Sequence[Sequence[int]], max_n: int = 4) -> float:
    """BLEU of one hypothesis against references (Papineni et al. 2002): the geometric mean of the clipped
    n-gram precisions for n = 1..max_n times the brevity penalty min(1, exp(1 - r / c)), r the reference
    length closest to c = len(hypothesis) (the shorter on ties); 0 when a precision is 0.

    Args:
        hypothesis: the hypothesis token ids (non-empty).
        references: the reference sequences (at least one).
        max_n: the largest n-gram length (>= 1).

    Returns:
        BLEU in [0, 1].

    Raises:
        ValueError: if the hypothesis is empty, there is no reference, or max_n < 1.
    """
    rows = _validated(references, max_n, 1)
    candidate = tuple(int(token) for token in hypothesis)
    require(len(candidate) >= 1, "the hypothesis must be non-empty")
    log_sum = 0.0
    for n in range(1, max_n + 1):
        counts = _ngrams(candidate, n)
        total = sum(counts.values())
        if total == 0:
            return 0.0
        ceiling: Counter = Counter()
        for reference in rows:
            ceiling |= _ngrams(reference, n)  # the largest count of each n-gram in any one reference
        clipped = sum(min(count, ceiling[gram]) for gram, count in counts.items())
        if clipped == 0:
            return 0.0
        log_sum += math.log(clipped / total) / max_n
    length = len(candidate)
    closest = min((abs(len(r) - length), len(r)) for r in rows)[1]
    penalty = 1.0 if length > closest else math.exp(1.0 - closest / length)
    return penalty * math.exp(log_sum)


def self_bleu(sequences: Sequence[Sequence[int]], max_n: int = 4) -> float:
    """Self-BLEU (Zhu et al. 2018): the mean over sequences of BLEU against all the other sequences.

    Args:
        sequences: at least two non-empty token-id sequences.
        max_n: the largest n-gram length (>= 1).

    Returns:
        Self-BLEU in [0, 1] (1: every sequence is repeated elsewhere).

    Raises:
        ValueError: if there are fewer than two sequences, one is empty, or max_n < 1.
    """
    rows = _validated(sequences, max_n, 2)
    return sum(bleu(row, rows[:i] + rows[i + 1:], max_n) for i, row in enumerate(rows)) / len(rows)
