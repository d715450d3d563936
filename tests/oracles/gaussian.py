"""The Gaussian mechanism and its Poisson-subsampled form."""
from __future__ import annotations

import mpmath

from tests.oracles._mp import mp, order, precise
from tests.oracles.subsampling import _sampling_probability


@precise
def gaussian_rdp(alpha, noise_multiplier, l2_sensitivity=1.0):
    """alpha * Delta^2 / (2 sigma^2) with sigma = noise_multiplier * Delta, i.e.
    alpha / (2 noise_multiplier^2) (Mironov 2017, Corollary 3)."""
    a, z = order(alpha), mp(noise_multiplier)
    if not z > 0:
        raise ValueError("noise multiplier must be > 0")
    return a / (2 * z ** 2)


@precise
def subsampled_gaussian_rdp(q, noise_multiplier, order_: int):
    """Poisson-subsampled Gaussian (sensitivity 1, noise multiplier sigma) at integer order a >= 2
    (Mironov, Talwar & Zhang 2019, Section 3.3, the binomial expansion of A_alpha):
        1/(a-1) log sum_{k=0..a} C(a,k) (1-q)^(a-k) q^k exp((k^2 - k) / (2 sigma^2)).
    q = 0 gives 0; q = 1 gives a / (2 sigma^2).
    """
    a = int(order_)
    if a != order_ or a < 2:
        raise ValueError(f"order must be an integer >= 2, got {order_!r}")
    q, z = _sampling_probability(q), mp(noise_multiplier)
    if not z > 0:
        raise ValueError("noise multiplier must be > 0")
    total = mpmath.mpf(0)
    for k in range(a + 1):
        total += mpmath.binomial(a, k) * (1 - q) ** (a - k) * q ** k * mpmath.exp(mpmath.mpf(k * k - k) / (2 * z ** 2))
    return mpmath.log(total) / (a - 1)
