"""The ablation's released-pair divergences (audit/ablation.py, `released_pair_divergences`) at the edges:
pass probabilities at or near 0 and 1 (equal endpoints once gave NaN: 0 * inf in a half without mass),
float32 pass probabilities (their float32 logs once put the result below the exact value), zeros in the
laws and infinite token divergences. Each result is compared with the pair laws [pi p, (1 - pi) p0]
measured in mpmath from the definition (van Erven & Harremoes 2014, Definition 2)."""
from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from dpledger.audit.ablation import released_pair_divergences
from dpledger.mechanisms import renyi_divergence

ORDERS = np.asarray([1.01, 1.5, 2.0, 8.0, 64.0])
EDGES = [0.0, 1e-300, 2.0 ** -60, 0.5, 1.0 - 2.0 ** -53, 1.0]


def pair_divergence(first: tuple[float, np.ndarray], second: tuple[float, np.ndarray], public: np.ndarray,
                    order: float) -> mpmath.mpf:
    """D_order between [pi p, (1 - pi) p0] and [pi' p', (1 - pi') p0], exactly (0 mass terms add 0)."""
    def law(pi, p):
        pi = mpmath.mpf(float(pi))
        return [pi * mpmath.mpf(float(x)) for x in p] + [(1 - pi) * mpmath.mpf(float(x)) for x in public]
    a = mpmath.mpf(float(order))
    terms = [x ** a * y ** (1 - a) if y > 0 else mpmath.inf for x, y in zip(law(*first), law(*second)) if x > 0]
    return mpmath.log(mpmath.fsum(terms)) / (a - 1)


def generated(seed: int):
    rng = np.random.default_rng(seed)
    vocab = int(rng.choice([2, 3, 7]))
    p, q, p0 = (rng.dirichlet(np.full(vocab, 0.5)) for _ in range(3))
    if seed % 3 == 0:
        q[0] = 0.0        # D(p || q) infinite where p has mass there
        q /= q.sum()
    if seed % 4 == 1:
        p0[-1] = 0.0
        p0 /= p0.sum()
    if seed % 5 == 2:   # a token the ensemble never emits (D(q || p) infinite where q has mass)
        p[-1] = 0.0
        p /= p.sum()
    return p, q, p0


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("ours", EDGES)
@pytest.mark.parametrize("theirs", EDGES)
def test_pass_probabilities_at_and_near_the_ends_are_never_below_the_exact_value(seed, ours, theirs):
    mpmath.mp.dps = 60
    p, q, p0 = generated(seed)
    token = torch.from_numpy(np.stack([renyi_divergence(p, q, ORDERS), renyi_divergence(q, p, ORDERS)]))[:, None, None]
    got = released_pair_divergences(token, torch.tensor([[ours, theirs]], dtype=torch.float64),
                                    torch.from_numpy(p0[None]), torch.from_numpy(ORDERS)).numpy()[:, 0, 0]
    assert not np.isnan(got).any()
    for direction, (first, second) in enumerate((((ours, p), (theirs, q)), ((theirs, q), (ours, p)))):
        for k, order in enumerate(ORDERS):
            exact = pair_divergence(first, second, p0, order)
            if exact == mpmath.inf:
                assert got[direction, k] == np.inf
            else:
                assert mpmath.mpf(float(got[direction, k])) >= exact, (direction, order)


@pytest.mark.parametrize("seed", range(20))
def test_float32_pass_probabilities_are_never_below_the_exact_value(seed):
    mpmath.mp.dps = 50
    p, q, p0 = generated(3 * seed + 1)
    rng = np.random.default_rng(seed)
    passing = rng.uniform(0.01, 0.99, (1, 2)).astype(np.float32)
    token = torch.from_numpy(np.stack([renyi_divergence(p, q, ORDERS), renyi_divergence(q, p, ORDERS)]))[:, None, None]
    got = released_pair_divergences(token, torch.from_numpy(passing), torch.from_numpy(p0[None]),
                                    torch.from_numpy(ORDERS)).numpy()[:, 0, 0]
    ours, theirs = float(passing[0, 0]), float(passing[0, 1])
    for direction, (first, second) in enumerate((((ours, p), (theirs, q)), ((theirs, q), (ours, p)))):
        for k, order in enumerate(ORDERS):
            assert mpmath.mpf(float(got[direction, k])) >= pair_divergence(first, second, p0, order), (direction, order)
