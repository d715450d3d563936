"""The ablation's released-pair divergences (audit/ablation.py, `released_pair_divergences`) from the token
laws' divergences and the pass probabilities, against the pair laws [pi p, (1 - pi) p0] built over 2V
outcomes and measured with the public renyi_divergence, and against mpmath on the same laws: never
below (the result is rounded up) and within rounding of them, on generated laws with zeros."""
from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from dpledger.audit.ablation import released_pair_divergences
from dpledger.mechanisms import renyi_divergence

ORDERS = np.asarray([1.1, 1.5, 2.0, 4.0, 8.0, 18.0, 64.0])


def generated_laws(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(p (L, V), neighbours (L, E, V), p0 (L, V), pass probabilities (L, 1 + E))."""
    rng = np.random.default_rng(seed)
    length, neighbours, vocab = int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.choice([2, 5, 64]))
    def law(shape):
        x = np.exp(rng.uniform(0.5, 6) * rng.standard_normal(shape))
        if seed % 3 == 0:                       # zeros where the public model has mass too
            x[..., 0] = 0.0
        return x / x.sum(axis=-1, keepdims=True)
    p0 = law((length, vocab))
    p = 0.5 * law((length, vocab)) + 0.5 * p0
    others = 0.5 * law((length, neighbours, vocab)) + 0.5 * p0[:, None]
    samples = 400
    counts = rng.integers(0, samples + 1, (length, 1 + neighbours))
    return p, others, p0, (counts + 0.5) / (samples + 1.0)


def pair_law(pass_probability, law, public):
    """[pi p, (1 - pi) p0]: floats in numpy, or lists of mpmath numbers (exact products)."""
    if isinstance(law, np.ndarray):
        return np.concatenate([pass_probability * law, (1 - pass_probability) * public])
    return [pass_probability * x for x in law] + [(1 - pass_probability) * x for x in public]


@pytest.mark.parametrize("seed", range(24))
def test_released_pair_divergences_equal_the_pair_laws_divergences(seed):
    p, others, p0, passing = generated_laws(seed)
    token = torch.stack([torch.from_numpy(np.stack([[renyi_divergence(p[l], others[l, e], ORDERS)
                                                     for e in range(others.shape[1])] for l in range(p.shape[0])])),
                         torch.from_numpy(np.stack([[renyi_divergence(others[l, e], p[l], ORDERS)
                                                     for e in range(others.shape[1])] for l in range(p.shape[0])]))])
    got = released_pair_divergences(token, torch.from_numpy(passing), torch.from_numpy(p0),
                                    torch.from_numpy(ORDERS)).numpy()
    for l in range(p.shape[0]):
        mine = pair_law(passing[l, 0], p[l], p0[l])
        for e in range(others.shape[1]):
            theirs = pair_law(passing[l, 1 + e], others[l, e], p0[l])
            for direction, (first, second) in enumerate(((mine, theirs), (theirs, mine))):
                direct = renyi_divergence(first, second, ORDERS)   # the kernel on the 2V-outcome laws
                assert np.allclose(got[direction, l, e], direct, rtol=1e-9, atol=1e-12)
    mpmath.mp.dps = 50
    for l in range(p.shape[0]):
        for e in range(others.shape[1]):
            laws = [pair_law(mpmath.mpf(float(passing[l, 0])), [mpmath.mpf(float(x)) for x in p[l]],
                             [mpmath.mpf(float(x)) for x in p0[l]]),
                    pair_law(mpmath.mpf(float(passing[l, 1 + e])), [mpmath.mpf(float(x)) for x in others[l, e]],
                             [mpmath.mpf(float(x)) for x in p0[l]])]
            for direction, (first, second) in enumerate((laws, laws[::-1])):
                for k, order in enumerate(ORDERS):
                    a = mpmath.mpf(float(order))
                    total = mpmath.fsum(x ** a * y ** (1 - a) for x, y in zip(first, second) if x > 0)
                    exact = mpmath.log(total) / (a - 1)
                    assert mpmath.mpf(float(got[direction, l, e, k])) >= exact, (direction, l, e, order)
