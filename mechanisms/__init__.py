"""Typed, immutable mechanism specs that emit RDP curves and act on next-token distributions."""
from dpledger.mechanisms.adapmixed import (AdaPMixED, add_one_bound_values, data_dependent_pmixed_curve,
                                  data_dependent_pmixed_values)
from dpledger.mechanisms.base import ComposedMechanism, Mechanism, SelfComposedMechanism, compose, self_compose
from dpledger.mechanisms.custom import CustomCurveMechanism
from dpledger.mechanisms.divergence import renyi_divergence
from dpledger.mechanisms.step import StepResult
from dpledger.mechanisms.gaussian import GaussianMechanism, PoissonSubsampledGaussian
from dpledger.mechanisms.hot_pate import DPWeightedSampler, Targmax, ThresholdWeightedSampler, cast_votes, vote_histogram
from dpledger.mechanisms.pate import ConfidentGNMax, GNMax, data_dependent_gnmax_rdp, log_q_gnmax
from dpledger.mechanisms.ball import ALL_ORDERS_BALL_GRID, Ball, all_orders_ball_constraints, proof_orders_ball_constraints
from dpledger.mechanisms.pmixed import (PMixED, SubsampledPMixED, SubsamplingVariant, beta_from_budget,
                                        realised_subsample_sizes, subsampled_pmixed_curve, theorem_3_1_epsilon,
                                        proof_orders_epsilon)
from dpledger.mechanisms.screening import NoisyScreening, ScreeningOutcome
from dpledger.mechanisms.subsampling import PoissonSubsampledMechanism, amplified_rdp, poisson_subsample
from dpledger.mechanisms.dp_events import (dp_accounting_relation, dp_event_from_dict, dp_event_from_json, dp_event_to_dict,
                                  dp_event_to_json, mechanism_from_dp_event, read_dp_event_json)
from dpledger.mechanisms.pld import (PLD_VALUE_DISCRETIZATION_INTERVAL, RdpPldComparison, compare_rdp_pld, pld_epsilon,
                                     pld_unavailable_reason)
from dpledger.mechanisms.calibration import (CALIBRATION_TOLERANCE, Calibration, calibrate_confident_gnmax, calibrate_dpws,
                                    calibrate_gaussian, calibrate_gnmax, calibrate_noise, calibrate_pmixed,
                                    calibrate_pmixed_order,
                                    calibrate_screening, calibrate_subsampled_gaussian)

__all__ = [
    "ALL_ORDERS_BALL_GRID", "AdaPMixED", "Ball", "ComposedMechanism", "ConfidentGNMax", "CustomCurveMechanism",
    "DPWeightedSampler", "GNMax",
    "GaussianMechanism", "Mechanism", "NoisyScreening", "PMixED", "PoissonSubsampledGaussian",
    "PoissonSubsampledMechanism", "ScreeningOutcome", "SelfComposedMechanism", "SubsampledPMixED",
    "StepResult", "SubsamplingVariant", "Targmax", "ThresholdWeightedSampler", "add_one_bound_values", "all_orders_ball_constraints",
    "amplified_rdp", "beta_from_budget", "cast_votes",
    "compose", "data_dependent_gnmax_rdp", "data_dependent_pmixed_curve", "data_dependent_pmixed_values",
    "log_q_gnmax", "poisson_subsample", "realised_subsample_sizes", "renyi_divergence", "self_compose",
    "subsampled_pmixed_curve", "theorem_3_1_epsilon", "vote_histogram", "proof_orders_ball_constraints",
    "proof_orders_epsilon",
    "dp_accounting_relation", "dp_event_from_dict", "dp_event_from_json", "dp_event_to_dict", "dp_event_to_json",
    "mechanism_from_dp_event", "read_dp_event_json", "PLD_VALUE_DISCRETIZATION_INTERVAL", "RdpPldComparison",
    "compare_rdp_pld", "pld_epsilon", "pld_unavailable_reason", "CALIBRATION_TOLERANCE", "Calibration", "calibrate_confident_gnmax",
    "calibrate_dpws", "calibrate_gaussian", "calibrate_gnmax", "calibrate_noise", "calibrate_pmixed", "calibrate_pmixed_order",
    "calibrate_screening", "calibrate_subsampled_gaussian",
]
