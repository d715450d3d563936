"""RDP curves, composition, conversions, the ledger and budgets. numpy/scipy only (no torch)."""
from accounting.budget import RdpBudget
from accounting.conversion import (ConversionMethod, DeltaConversion, EpsilonConversion, GridEdgeWarning,
                                   conversion_terms, delta_from_rdp, epsilon_from_rdp)
from accounting.curve import RdpCurve, compose_curves
from accounting.ledger import Breakdown, BreakdownRow, PrivacyLedger
from accounting.orders import DEFAULT_ORDERS, canonical_orders, default_orders
from accounting.relation import DivergenceDirection, NeighbouringRelation

__all__ = [
    "Breakdown", "BreakdownRow", "ConversionMethod", "DEFAULT_ORDERS", "DeltaConversion", "DivergenceDirection", "EpsilonConversion",
    "GridEdgeWarning", "NeighbouringRelation", "PrivacyLedger", "RdpBudget", "RdpCurve", "canonical_orders",
    "compose_curves", "conversion_terms", "default_orders", "delta_from_rdp", "epsilon_from_rdp",
]
