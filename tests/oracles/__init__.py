"""Slow, obviously-correct reference implementations ("oracles") of every privacy number the
package computes, written from the papers in plain Python + mpmath at 60 digits.

They share no code with the package (no accounting, mechanisms, dpledger or numpy imports) so
that tests/test_differential.py can compare the fast float64 code against an independent
reading of each theorem. One module per concept; each docstring names its source.
"""
from tests.oracles._mp import DPS
from tests.oracles.conversion import (classic_epsilon_at, delta_from_rdp, delta_improved, delta_tv,
                                      epsilon_classic, epsilon_improved, improved_delta_at,
                                      improved_epsilon_at, tv_delta_at)
from tests.oracles.gaussian import gaussian_rdp, subsampled_gaussian_rdp
from tests.oracles.gnmax import (data_dependent_gnmax_rdp, data_dependent_gnmax_rdp_both_directions, gaussian_tail,
                                 gnmax_data_independent_rdp, log_q_gnmax, log_q_gnmax_neighbours, theorem_6_rdp,
                                 two_class_neighbour_divergences, two_class_output_law)
from tests.oracles.pmixed import (ball_divergence, beta_from_budget, data_dependent_loss, leave_one_out_losses,
                                  mixing_weight, mixing_weight_bracket, noisy_screening_rdp, pmixed_epsilon,
                                  theorem_3_1_epsilon)
from tests.oracles.renyi import renyi_divergence, symmetric_renyi_divergence
from tests.oracles.subsampling import amplified_rdp, amplified_rdp_integer, subsampled_rdp

__all__ = [
    "DPS", "amplified_rdp", "amplified_rdp_integer", "ball_divergence", "beta_from_budget", "classic_epsilon_at",
    "data_dependent_gnmax_rdp", "data_dependent_gnmax_rdp_both_directions", "data_dependent_loss",
    "delta_from_rdp", "delta_improved", "delta_tv", "epsilon_classic", "epsilon_improved", "gaussian_rdp",
    "gaussian_tail", "gnmax_data_independent_rdp", "improved_delta_at", "improved_epsilon_at",
    "leave_one_out_losses", "log_q_gnmax", "log_q_gnmax_neighbours", "mixing_weight", "mixing_weight_bracket",
    "noisy_screening_rdp", "pmixed_epsilon", "renyi_divergence", "subsampled_gaussian_rdp", "subsampled_rdp",
    "symmetric_renyi_divergence", "theorem_3_1_epsilon", "theorem_6_rdp", "tv_delta_at",
    "two_class_neighbour_divergences", "two_class_output_law",
]
