"""Small log-space identities shared by the bounds (numpy, float64)."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def log_sum_exp(values: ArrayLike, axis: int = -1, weights: ArrayLike | None = None) -> NDArray[np.float64]:
    """log sum_j w_j exp(x_j) along `axis`: the audit's laws and divergences call it thousands of times
    a run on small arrays, where scipy.special.logsumexp's generality costs a measurable share. Each
    term is taken as exp(y_j), y_j = x_j + log w_j; the largest, y_m, is factored out and the others
    enter through log1p: y_m + log1p(sum_{j != m} exp(y_j - y_m)), so a result near 0 (a probability
    near 1) keeps its relative accuracy (log(1 + 2.7e-176) stays 2.7e-176, not 0) and no weight, however
    small or large, overflows a quotient. Its rounding, for M terms: each exponent within u |y_j| of
    its exact value, each exp and the shift within a few u, and the sum of the other M - 1 terms
    (each at most 1) within M - 1 unit roundoffs relative (Higham 2002, Section 4.2): the result is
    within (M + 3) u max(1, |y_m|) of the exact value (tests/test_log_sum_exp.py holds it to a
    60-digit mpmath oracle, weights over 60 decades included). A term of weight 0 adds nothing; an
    empty axis or all -inf gives -inf; +inf gives +inf; NaN (a value or a weight) stays NaN; a negative
    weight gives NaN (weights must be nonnegative).

    Args:
        values: the exponents x (any shape, 0-d taken as one term; float64 arithmetic).
        axis: the axis summed over.
        weights: nonnegative weights w broadcast to `values`' shape, or None for 1.

    Returns:
        float64 array of `values`' shape without `axis` (a 0-d array for 1-d input).
    """
    x = np.atleast_1d(np.asarray(values, dtype=np.float64))
    if weights is not None:
        w = np.broadcast_to(np.asarray(weights, dtype=np.float64), x.shape)
        with np.errstate(divide="ignore", invalid="ignore"):   # log 0 = -inf: the term drops; log(-1) = NaN
            x = np.where((w == 0.0) & ~np.isnan(x), -np.inf, x + np.log(w))   # a NaN value stays NaN
    if x.shape[axis] == 0:
        return np.full(np.delete(x.shape, axis % x.ndim), -np.inf)
    largest = np.argmax(x, axis=axis, keepdims=True)
    top = np.take_along_axis(x, largest, axis=axis)
    shift = np.where(np.isfinite(top), top, 0.0)   # all -inf: exp(-inf) = 0; +inf and NaN pass through the sum
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        terms = np.exp(x - shift)
        np.put_along_axis(terms, largest, 0.0, axis=axis)
        others = np.sum(terms, axis=axis, keepdims=True)
        # a finite top's own term is exactly 1 (log1p keeps a result near 0 accurate); otherwise it is 0, inf or NaN
        total = np.where(np.isfinite(top), np.log1p(others), np.log(np.exp(top - shift) + others))
    result: NDArray[np.float64] = np.squeeze(shift + total, axis=axis)
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
