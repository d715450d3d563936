"""Small log-space identities shared by the bounds (numpy, float64)."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


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
