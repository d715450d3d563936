"""RDP curves, composition, conversions, the ledger and budgets. numpy/scipy only (no torch)."""
from dpledger.accounting.budget import RdpBudget
from dpledger.accounting.conversion import (ConversionMethod, DeltaConversion, EpsilonConversion, GridEdgeWarning,
                                   conversion_terms, delta_from_rdp, epsilon_from_rdp)
from dpledger.accounting.curve import RdpCurve, compose_curves
from dpledger.accounting.ledger import Breakdown, BreakdownRow, PrivacyLedger
from dpledger.accounting.orders import DEFAULT_ORDERS, canonical_orders, default_orders
from dpledger.accounting.relation import DivergenceDirection, NeighbouringRelation

__all__ = [
    "Breakdown", "BreakdownRow", "ConversionMethod", "DEFAULT_ORDERS", "DeltaConversion", "DivergenceDirection", "EpsilonConversion",
    "GridEdgeWarning", "NeighbouringRelation", "PrivacyLedger", "RdpBudget", "RdpCurve", "canonical_orders",
    "compose_curves", "conversion_terms", "default_orders", "delta_from_rdp", "epsilon_from_rdp",
]
