"""dpledger.mechanisms.randomness.StepGenerators: the shared voting seeds need the run seed and the step numbers."""
from __future__ import annotations

import pytest
import torch

from dpledger.mechanisms.randomness import StepGenerators, vote_seed


def test_vote_seeds_follow_the_run_seed_and_the_steps():
    generators = StepGenerators.for_steps(7, 3, 4)
    assert generators.vote_seeds() == [vote_seed(7, step) for step in range(3, 7)]


@pytest.mark.parametrize("run_seed", [None, 7])
def test_vote_seeds_without_step_numbers_raise_a_value_error(run_seed):
    # a run seed without step numbers raised TypeError (None + int) before: the check covers both
    generators = StepGenerators([torch.Generator().manual_seed(1)], run_seed=run_seed)
    with pytest.raises(ValueError, match="StepGenerators.for_steps"):
        generators.vote_seeds()
