"""dpledger: privacy accounting and auditing of private LLM decoding.

The public API: Renyi divergences, RDP curves and their composition, conversions to
(epsilon, delta), the ledger, budgets, and the mechanism specs; and `run_frontier`, the
privacy-utility frontier (dpledger.reports.frontier), loaded when first used.
"""
import importlib

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
    "theorem_3_1_epsilon", "__version__", "FRONTIER_VARIANTS", "run_frontier",
]

_LAZY = {"FRONTIER_VARIANTS": "dpledger.reports.frontier", "run_frontier": "dpledger.reports.frontier"}
"""Names loaded on first use: their module imports pandas, matplotlib, transformers and the decode loop,
which `import dpledger` (and every command's start-up) should not pay for."""


def __getattr__(name: str) -> object:
    """The lazily loaded names of `_LAZY` (PEP 562).

    Args:
        name: the attribute asked for.

    Returns:
        The attribute.

    Raises:
        AttributeError: if `name` is not one of them.
    """
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dpledger' has no attribute {name!r}")
