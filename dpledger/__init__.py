"""dpledger: privacy accounting and auditing of private LLM decoding.

The public API: Renyi divergences, RDP curves and their composition, conversions to
(epsilon, delta), the ledger, budgets, and the mechanism specs; and `run_frontier`, the
privacy-utility frontier (dpledger.reports.frontier), imported when first called.
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
    "theorem_3_1_epsilon", "__version__", "run_frontier",
]



def run_frontier(out, budgets=((1.0, 1e-5), (2.0, 1e-5), (4.0, 1e-5), (8.0, 1e-5)), queries=1024, teachers=8,
                 variants=None, audit=True, progress=True, verbose=True, embedded=None):
    """The privacy-utility frontier on the embedded default (`dpledger frontier`; docs/frontier.md):
    every mechanism variant calibrated to each target (epsilon, delta) over `queries` before it runs,
    decoded on the same held-out queries, audited, tabulated and plotted. This is
    `dpledger.reports.frontier.run_frontier`, imported when first called (it loads pandas, matplotlib and
    the decode loop, which `import dpledger` does not); its variants are
    `dpledger.reports.frontier.FRONTIER_VARIANTS`.

    Args:
        out: the output directory; rerun with the same one to resume (finished runs and audits are reused).
        budgets: (epsilon, delta) targets; each epsilon in (0, 700], each delta in (0, 1).
        queries: teacher-forced queries per run, >= 1.
        teachers: the embedded default's ensemble size N, in [2, 512] (trained and cached if absent).
        variants: the variants to run (None: all).
        audit: whether to audit the runs.
        progress: whether a progress bar runs over the runs.
        verbose: whether each run's line is printed.
        embedded: other models and text (a dpledger.decoding.embedded.build_or_load entry with N teachers).

    Returns:
        The frontier table (a pandas DataFrame): one row per anchor and per (variant, budget); sound and
        as-claimed epsilons in separate columns, every missing value None with its reason in
        `frame.attrs["reasons"]`.

    Raises:
        ValueError: if a setting is out of range (before anything is built or written), `out` holds a
            frontier of other settings, or a run directory holds another run.
        OSError: if a file cannot be written.
    """
    from dpledger.reports import frontier  # deferred: pandas, matplotlib, transformers and the decode loop, on first call

    return frontier.run_frontier(out, budgets, queries, teachers, variants, audit, progress, verbose, embedded)
