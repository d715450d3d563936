"""The add-one bound (mechanisms/add_one.py, `add_one_direction_bounds`) at orders close to 1, where
(k-1) U2_k is computed with an absolute rounding error of a few ulps (the log of its sum) that dividing
by k - 1 magnifies: the bound must still be at least its closed form evaluated exactly (mpmath, on the
same float allocation), and the sub-grid's chords at least computing every order."""
from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from dpledger.mechanisms.add_one import _knapsack_allocation, add_one_direction_bounds


def near_one_case(seed: int) -> dict:
    """Generated output and public laws (point-mass-like or perturbed) and orders from 1 + 1e-8 upwards."""
    rng = np.random.default_rng(seed)
    rows, vocab = int(rng.integers(1, 5)), int(rng.choice([2, 3, 5, 50]))
    logits = rng.uniform(1, 8) * rng.standard_normal((rows, vocab))
    p0 = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p0 /= p0.sum(axis=-1, keepdims=True)
    if seed % 2:
        p = np.full((rows, vocab), 1e-300)
        p[:, 0] = 1.0
    else:
        p = np.exp(logits + rng.standard_normal((rows, vocab)))
        p /= p.sum(axis=-1, keepdims=True)
    orders = 1.0 + (np.geomspace(1e-8, 1e4, int(rng.integers(40, 200))) if seed % 3 else
                    np.cumsum(rng.uniform(1e-9, 1e-6, int(rng.integers(5, 60)))))
    return dict(p=p, p0=p0, teachers=int(rng.choice([1, 10, 1000])), orders=orders,
                alpha=float(rng.choice([1.5, 8.0, 64.0, 1e4])), radius=float(rng.choice([1e-12, 1e-4, 0.1, 1.0])))


def exact_forward(case: dict, row: int, order: float) -> mpmath.mpf:
    """The forward closed form (add_one_direction_bounds' docstring: min of the Jensen step on
    min(U1, U2) and the chord bound) in mpmath, from the float allocation the code uses."""
    p, p0, n = case["p"][row], case["p0"][row], mpmath.mpf(case["teachers"])
    alpha, radius, k = mpmath.mpf(case["alpha"]), mpmath.mpf(case["radius"]), mpmath.mpf(order)
    log_p, log_p0 = np.log(p), np.log(p0)
    log_r = (case["alpha"] - 1.0) * case["radius"]
    log_qmax = np.minimum(0.0, (log_r + (case["alpha"] - 1.0) * log_p0) / case["alpha"])
    log_allocation, log_t = _knapsack_allocation(log_qmax, log_qmax - log_p)
    pairs = [(mpmath.exp(mpmath.mpf(a)), mpmath.exp(mpmath.mpf(t))) for a, t in zip(log_allocation, log_t)
             if np.isfinite(a)]
    log_m = max(mpmath.mpf(q) - mpmath.mpf(z) for q, z in zip(log_qmax, log_p0))
    rho = radius if k <= alpha else ((alpha - 1) * radius + (k - alpha) * log_m) / (k - 1)
    u1 = rho + max(mpmath.mpf(z) - mpmath.mpf(x) for z, x in zip(log_p0, log_p))
    u2 = mpmath.log(mpmath.fsum(a * t ** (k - 1) for a, t in pairs)) / (k - 1)
    jensen = mpmath.log((n + mpmath.exp((k - 1) * min(u1, u2))) / (n + 1)) / (k - 1)
    phi = lambda t: ((n + t) / (n + 1)) ** k  # noqa: E731
    chord = mpmath.log(phi(0) + mpmath.fsum(a * (phi(t) - phi(0)) / t for a, t in pairs)) / (k - 1)
    return min(jensen, chord)


@pytest.mark.parametrize("seed", range(8))
def test_near_order_one_the_bound_is_at_least_its_closed_form_in_mpmath(seed):
    mpmath.mp.dps = 50
    case = near_one_case(seed)
    forward, _ = add_one_direction_bounds(torch.from_numpy(case["p"]), torch.from_numpy(case["p0"]), case["teachers"],
                                          torch.from_numpy(case["orders"]), case["alpha"], case["radius"],
                                          relative_tolerance=None)
    for row in range(case["p"].shape[0]):
        for index in range(0, min(40, case["orders"].size), 3):
            exact = exact_forward(case, row, float(case["orders"][index]))
            assert mpmath.mpf(float(forward[row, index])) >= exact, (row, case["orders"][index])


@pytest.mark.parametrize("seed", range(64))
def test_near_order_one_the_subgrid_is_never_below_computing_every_order(seed):
    case = near_one_case(seed)
    args = (torch.from_numpy(case["p"]), torch.from_numpy(case["p0"]), case["teachers"],
            torch.from_numpy(case["orders"]), case["alpha"], case["radius"])
    for full, chord in zip(add_one_direction_bounds(*args, relative_tolerance=None),
                           add_one_direction_bounds(*args, subgrid_from_vocabulary=0)):
        assert np.all(chord >= full), f"below every-order value by {np.max(full - chord):.3g}"


def test_the_generated_case_that_went_below():
    """The fuzzed case that found it: p = (1, 1e-300), N = 10, alpha = 64, radius 1, 155 orders from
    1 + 1e-8 (0.46% below computing that order at k = 1 + 1.2e-8)."""
    p = torch.tensor([[1.0, 1e-300]] * 4, dtype=torch.float64)
    p0 = torch.tensor([[9.9999999944664886e-01, 5.5335121166787567e-10], [9.8246228115380296e-01, 1.7537718846196922e-02],
                       [8.2086884719741226e-04, 9.9917913115280255e-01], [1.5273735899884247e-02, 9.8472626410011577e-01]],
                      dtype=torch.float64)
    orders = torch.from_numpy(1.0 + np.geomspace(1e-8, 1e4, 155))
    full = add_one_direction_bounds(p, p0, 10, orders, 64.0, 1.0, relative_tolerance=None)
    sub = add_one_direction_bounds(p, p0, 10, orders, 64.0, 1.0, subgrid_from_vocabulary=0)
    for every, chord in zip(full, sub):
        assert np.all(chord >= every), f"below every-order value by {np.max(every - chord):.3g}"


def test_an_empty_grid_gives_empty_bounds_as_computing_every_order_does():
    p = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    p0 = torch.tensor([[0.4, 0.6]], dtype=torch.float64)
    for tolerance in (None, 0.005):
        forward, reverse = add_one_direction_bounds(p, p0, 3, torch.zeros(0, dtype=torch.float64), 2.0, 0.1,
                                                    relative_tolerance=tolerance, subgrid_from_vocabulary=0)
        assert forward.shape == reverse.shape == (1, 0)


def test_orders_out_of_order_are_refused_naming_them():
    p = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    p0 = torch.tensor([[0.4, 0.6]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"strictly increasing orders, got \[3.0, 2.0\]"):
        add_one_direction_bounds(p, p0, 3, torch.tensor([3.0, 2.0], dtype=torch.float64), 2.0, 0.1,
                                 subgrid_from_vocabulary=0)
