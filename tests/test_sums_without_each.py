"""sums_without_each (mechanisms/kernels.py): the sum over the other rows for every row, never formed
by subtracting a row from the total. Held to the exclusive cumulative sums from both ends it replaced
(bitwise: the same additions in the same order) and to exact rational sums (within N ulps)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from dpledger.mechanisms.kernels import sums_without_each, sums_without_each_by_scans


def exclusive_sums_by_cumsum(values: torch.Tensor) -> torch.Tensor:
    zeros = torch.zeros_like(values[..., :1, :])
    before = torch.cat([zeros, torch.cumsum(values[..., :-1, :], dim=-2)], dim=-2)
    after = torch.flip(torch.cat([zeros, torch.cumsum(torch.flip(values, dims=(-2,))[..., :-1, :], dim=-2)],
                                 dim=-2), dims=(-2,))
    return before + after


@pytest.mark.parametrize("function", [sums_without_each, sums_without_each_by_scans])   # the CPU's and a GPU's form
@pytest.mark.parametrize("seed", range(12))
def test_the_sums_over_the_other_rows_are_exact_to_n_ulps_and_equal_the_cumulative_form(seed, function):
    rng = np.random.default_rng(seed)
    shape = tuple(int(x) for x in rng.integers(1, 6, size=int(rng.integers(0, 3)))) + (int(rng.integers(1, 9)),
                                                                                       int(rng.integers(1, 7)))
    values = torch.from_numpy(rng.uniform(0, 1, shape) ** rng.uniform(1, 60))
    values[..., 0, :] = torch.where(torch.rand(values[..., 0, :].shape) < 0.5, 1 - 1e-16, values[..., 0, :])
    got = function(values)
    assert torch.equal(got, exclusive_sums_by_cumsum(values))
    flat, result = values.reshape(-1, *values.shape[-2:]).numpy(), got.reshape(-1, *values.shape[-2:]).numpy()
    n = values.shape[-2]
    for block in range(flat.shape[0]):
        for i in range(n):
            for j in range(flat.shape[2]):
                exact = sum((Fraction(float(flat[block, k, j])) for k in range(n) if k != i), Fraction(0))
                assert abs(Fraction(float(result[block, i, j])) - exact) <= n * 2.0 ** -52 * exact
