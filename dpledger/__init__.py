"""dpledger: privacy accounting and auditing of private LLM decoding.

The public API: Renyi divergences, RDP curves and their composition, conversions to
(epsilon, delta), the ledger, budgets, and the mechanism specs.
"""
from dpledger.version import __version__
from dpledger.accounting import (Breakdown, ConversionMethod, DEFAULT_ORDERS, DeltaConversion, DivergenceDirection,
                        EpsilonConversion, GridEdgeWarning,
                        NeighbouringRelation, PrivacyLedger, RdpBudget, RdpCurve, compose_curves, default_orders,
                        delta_from_rdp, epsilon_from_rdp)
from dpledger.mechanisms import (AdaPMixED, Ball, ConfidentGNMax, CustomCurveMechanism, DPWeightedSampler, GaussianMechanism, GNMax,
                        Mechanism, NoisyScreening, PMixED, PoissonSubsampledGaussian, StepResult, SubsampledPMixED,
                        SubsamplingVariant, Targmax, ThresholdWeightedSampler, add_one_bound_values, beta_from_budget, compose,
                        data_dependent_pmixed_curve, poisson_subsample, renyi_divergence, self_compose,
                        subsampled_pmixed_curve, theorem_3_1_epsilon)

__all__ = [
    "AdaPMixED", "Ball", "Breakdown", "ConfidentGNMax", "ConversionMethod", "CustomCurveMechanism", "DEFAULT_ORDERS",
    "DPWeightedSampler", "DeltaConversion", "DivergenceDirection", "EpsilonConversion", "GNMax", "GaussianMechanism",
    "GridEdgeWarning", "Mechanism", "StepResult",
    "NeighbouringRelation", "NoisyScreening", "PMixED", "PoissonSubsampledGaussian", "PrivacyLedger", "RdpBudget",
    "RdpCurve", "SubsampledPMixED", "SubsamplingVariant", "Targmax", "ThresholdWeightedSampler", "add_one_bound_values",
    "beta_from_budget",
    "compose", "compose_curves", "data_dependent_pmixed_curve", "default_orders", "delta_from_rdp",
    "epsilon_from_rdp", "poisson_subsample", "renyi_divergence", "self_compose", "subsampled_pmixed_curve",
    "theorem_3_1_epsilon", "__version__",
]
