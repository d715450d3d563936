"""Utility of a private next-token mechanism's output laws, one metric set for every mechanism compared on
the same teachers (Hot PATE's voting aggregators, PMixED, a DP-ICL averaged-distribution baseline), so that
a frontier table puts them side by side on equal terms.

For Q queries, each mechanism's output law at a query is a distribution over V tokens (a voting run's law
is the mean of its released point masses, with failed rounds answered by the public model). Against the
non-private reference, the mean of the teachers' distributions (what an ensemble without privacy would
sample from), and, where known, the held-out text's true next tokens:

- ``tv_to_reference``: mean total variation distance to the reference law (0 is the non-private ensemble);
- ``target_probability``: mean probability of the true next token (the expected next-token accuracy of
  one sample);
- ``target_cross_entropy``: mean -log of it, in nats (+inf when some law gives the true token 0);
- ``reference_top1_mass``: mean mass on the reference's most likely token.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from dpledger.accounting.errors import require


def _laws(name: str, laws: npt.ArrayLike) -> np.ndarray:
    array = np.asarray(laws, dtype=np.float64)
    require(array.ndim == 2 and array.shape[0] >= 1 and array.shape[1] >= 2,
            f"{name} must be a (queries, vocabulary) array with vocabulary >= 2, got shape {array.shape}")
    bad = array[~(np.isfinite(array) & (array >= 0))]
    require(bad.size == 0, f"{name} must be finite and nonnegative, got a value {bad[0] if bad.size else ''}")
    sums = array.sum(axis=1)
    worst = float(np.abs(sums - 1.0).max())
    require(worst <= 1e-6, f"{name}'s rows must each sum to 1 (within 1e-6), got a row off by {worst:.3g}")
    return array


def output_law_utility(output_laws: npt.ArrayLike, reference_laws: npt.ArrayLike,
                       targets: npt.ArrayLike | None = None) -> dict[str, float | None]:
    """The utility metrics of the module docstring for one mechanism's output laws.

    Args:
        output_laws: (Q, V) the mechanism's output law at each query; each row sums to 1 (within 1e-6).
        reference_laws: (Q, V) the non-private reference law at each query (the teachers' mean).
        targets: (Q,) the true next token at each query, in [0, V); None when unknown.

    Returns:
        {"tv_to_reference", "reference_top1_mass", "target_probability", "target_cross_entropy"}: floats,
        the last two None without targets; the cross-entropy is +inf when a law gives a true token 0.

    Raises:
        ValueError: if a law is not a (Q, V) array of finite nonnegative rows summing to 1, the two shapes
            differ, or a target is out of range.
    """
    output = _laws("output_laws", output_laws)
    reference = _laws("reference_laws", reference_laws)
    require(output.shape == reference.shape,
            f"output_laws and reference_laws must have one shape, got {output.shape} and {reference.shape}")
    rows = np.arange(output.shape[0])
    metrics: dict[str, float | None] = {
        "tv_to_reference": float(0.5 * np.abs(output - reference).sum(axis=1).mean()),
        "reference_top1_mass": float(output[rows, reference.argmax(axis=1)].mean()),
        "target_probability": None, "target_cross_entropy": None}
    if targets is not None:
        tokens = np.asarray(targets)
        require(tokens.shape == (output.shape[0],) and np.issubdtype(tokens.dtype, np.integer),
                f"targets must be {output.shape[0]} integer token ids, got shape {tokens.shape} of {tokens.dtype}")
        outside = tokens[(tokens < 0) | (tokens >= output.shape[1])]
        require(outside.size == 0, f"targets must be in [0, {output.shape[1]}), got {outside[0] if outside.size else ''}")
        probabilities = output[rows, tokens]
        metrics["target_probability"] = float(probabilities.mean())
        with np.errstate(divide="ignore"):
            losses = -np.log(probabilities)
        metrics["target_cross_entropy"] = float(losses.mean()) if np.isfinite(losses).all() else math.inf
    return metrics


def finite_utility(metrics: dict[str, float | None]) -> dict[str, Any]:
    """`metrics` for strict JSON: a +inf cross-entropy (some query's law gives its true token probability 0)
    becomes None beside a note saying so, never the JSON layer's privacy wording for +inf.

    Args:
        metrics: output_law_utility's (or pooled_utility's) result.

    Returns:
        The same keys, each non-finite value None, and "<key>_note" for each one replaced.
    """
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if value is not None and not math.isfinite(value):
            out[key] = None
            out[key + "_note"] = "+inf: some query's law gives its true next token probability 0"
        else:
            out[key] = value
    return out
