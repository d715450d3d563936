"""Small log-space identities shared by the bounds (numpy, float64)."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def log_sum_exp(values: ArrayLike, axis: int = -1, weights: ArrayLike | None = None) -> NDArray[np.float64]:
    """log sum_j w_j exp(x_j) along `axis`: the audit's laws and divergences call it thousands of times
    a run on small arrays, where scipy.special.logsumexp's generality costs about 0.5 ms a call (most
    of a voting audit's time). The largest term x_m is factored out (no overflow) and the others enter
    through log1p: x_m + log w_m + log1p(sum_{j != m} w_j exp(x_j - x_m) / w_m), so a result near 0
    (a probability near 1) keeps its relative accuracy (log(1 + 2.7e-176) is -2.7e-176's
    complement, not 0). The sum of the other M - 1 terms holds its worst case, M unit roundoffs
    relative (Higham 2002, Section 4.2): the result is within about (M + 3) u of the exact value
    (1.1e-13 at M = 1,025). A term of weight 0 adds nothing; rows of -inf give -inf; +inf gives +inf;
    NaN stays NaN.

    Args:
        values: the exponents x (any shape; float64 arithmetic).
        axis: the axis summed over.
        weights: nonnegative weights w broadcast against `values`, or None for 1.

    Returns:
        float64 array of `values`' shape without `axis` (a 0-d array for 1-d input).
    """
    x = np.asarray(values, dtype=np.float64)
    w = np.ones_like(x) if weights is None else np.broadcast_to(np.asarray(weights, dtype=np.float64), x.shape)
    x = x if weights is None else np.where(w == 0.0, -np.inf, x)   # a term of weight 0 adds nothing (NaN stays)
    largest = np.argmax(x, axis=axis, keepdims=True)
    top = np.take_along_axis(x, largest, axis=axis)
    shift = np.where(np.isfinite(top), top, 0.0)   # all -inf: exp(-inf) = 0; +inf and NaN pass through the sum
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.exp(x - shift) * w
        plain = np.log(np.sum(terms, axis=axis, keepdims=True)) + shift
        top_weight = np.take_along_axis(w, largest, axis=axis)
        np.put_along_axis(terms, largest, 0.0, axis=axis)
        others = np.sum(terms, axis=axis, keepdims=True)
        factored = shift + np.log(top_weight) + np.log1p(others / top_weight)
    result: NDArray[np.float64] = np.squeeze(np.where(np.isfinite(top), factored, plain), axis=axis)
    return result


def log_mean_with_one_exp(x: ArrayLike, n: ArrayLike) -> NDArray[np.float64]:
    """log((n - 1 + e^x) / n) = log1p(expm1(x) / n), elementwise: exact 0 at x = 0 and no cancellation
    for small x; for x > 700, where expm1 overflows, x - log n + log1p((n - 1) e^-x). The mean of
    n - 1 ones and one e^x, in log space (Theorem 3.1's and the add-one bound's Jensen step).

    Args:
        x: the log of the one term that is not 1 (any float; arrays broadcast with n).
        n: the number of terms n >= 1 (arrays broadcast with x).

    Returns:
        float64 array of the broadcast shape: log((n - 1 + e^x) / n).
    """
    x = np.asarray(x, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        small = np.log1p(np.expm1(np.minimum(x, 700.0)) / n)
        large = x - np.log(n) + np.log1p((n - 1.0) * np.exp(-np.maximum(x, 700.0)))
    result: NDArray[np.float64] = np.where(x <= 700.0, small, large)
    return result
