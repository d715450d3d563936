"""Typed, immutable mechanism specs that emit RDP curves and act on next-token distributions."""
from mechanisms.adapmixed import (AdaPMixED, add_one_bound_values, data_dependent_pmixed_curve,
                                  data_dependent_pmixed_values)
from mechanisms.base import ComposedMechanism, Mechanism, SelfComposedMechanism, compose, self_compose
from mechanisms.custom import CustomCurveMechanism
from mechanisms.divergence import renyi_divergence
from mechanisms.step import StepResult
from mechanisms.gaussian import GaussianMechanism, PoissonSubsampledGaussian
from mechanisms.hot_pate import DPWeightedSampler, Targmax, ThresholdWeightedSampler, cast_votes, vote_histogram
from mechanisms.pate import ConfidentGNMax, GNMax, data_dependent_gnmax_rdp, log_q_gnmax
from mechanisms.pmixed import (ALL_ORDERS_BALL_GRID, Ball, PMixED, SubsampledPMixED, all_orders_ball_constraints, SubsamplingVariant, beta_from_budget,
                               realised_subsample_sizes, subsampled_pmixed_curve, theorem_3_1_epsilon)
from mechanisms.screening import NoisyScreening, ScreeningOutcome
from mechanisms.subsampling import PoissonSubsampledMechanism, amplified_rdp, poisson_subsample

__all__ = [
    "ALL_ORDERS_BALL_GRID", "AdaPMixED", "Ball", "ComposedMechanism", "ConfidentGNMax", "CustomCurveMechanism", "DPWeightedSampler", "GNMax",
    "GaussianMechanism", "Mechanism", "NoisyScreening", "PMixED", "PoissonSubsampledGaussian",
    "PoissonSubsampledMechanism", "ScreeningOutcome", "SelfComposedMechanism", "SubsampledPMixED",
    "StepResult", "SubsamplingVariant", "Targmax", "ThresholdWeightedSampler", "add_one_bound_values", "all_orders_ball_constraints",
    "amplified_rdp", "beta_from_budget", "cast_votes",
    "compose", "data_dependent_gnmax_rdp", "data_dependent_pmixed_curve", "data_dependent_pmixed_values",
    "log_q_gnmax", "poisson_subsample", "realised_subsample_sizes", "renyi_divergence", "self_compose",
    "subsampled_pmixed_curve", "theorem_3_1_epsilon", "vote_histogram",
]
