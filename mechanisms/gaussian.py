"""The Gaussian mechanism and its Poisson-subsampled form."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accounting.errors import require, require_in_closed, require_positive
from accounting.relation import NeighbouringRelation
from mechanisms.base import Mechanism, require_relation, set_validated


@dataclass(frozen=True)
class GaussianMechanism(Mechanism):
    """Adds N(0, (noise_multiplier * l2_sensitivity)^2) to a query of L2 sensitivity l2_sensitivity.

    RDP: alpha / (2 noise_multiplier^2) at every order (Mironov 2017, Corollary 3).
    """

    noise_multiplier: float
    l2_sensitivity: float = 1.0
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE

    def __post_init__(self) -> None:
        set_validated(self, noise_multiplier=require_positive("noise_multiplier", self.noise_multiplier),
                      l2_sensitivity=require_positive("l2_sensitivity", self.l2_sensitivity),
                      relation=require_relation(self.relation))

    def rdp_values(self, orders: np.ndarray) -> np.ndarray:
        # float64 division: a tiny noise multiplier gives +inf ("no guarantee"), never OverflowError
        return orders / (2.0 * np.float64(self.noise_multiplier) ** 2)


@dataclass(frozen=True)
class PoissonSubsampledGaussian(Mechanism):
    """Gaussian mechanism on a Poisson subsample of rate `sampling_probability` (add/remove-one).

    RDP from Mironov, Talwar & Zhang 2019, Sections 3.3 (integer orders) and 3.4 (fractional),
    computed by dp-accounting rather than rewritten here. Each order is charged the smallest of
    three sound values: dp-accounting's at the order itself; its exact integer-order value at
    ceil(order) (RDP is non-decreasing in the order, van Erven & Harremoes 2014 Theorem 3); and
    the unsampled Gaussian's order / (2 sigma^2) (subsampling never costs more: joint
    quasi-convexity, ibid. Theorem 13). dp-accounting's fractional-order series gives +inf where
    it fails to converge (q=0.5, sigma=2, order 1.875) and can exceed the next integer order's
    value (q=0.5, sigma=10: 0.0117 at order 2.5 against 0.0038 at order 3).
    """

    noise_multiplier: float
    sampling_probability: float

    def __post_init__(self) -> None:
        set_validated(self, noise_multiplier=require_positive("noise_multiplier", self.noise_multiplier),
                      sampling_probability=require_in_closed("sampling_probability", self.sampling_probability, 0.0, 1.0))

    def rdp_values(self, orders: np.ndarray) -> np.ndarray:
        from dp_accounting.rdp import rdp_privacy_accountant

        orders = np.asarray(orders, dtype=np.float64)
        require(bool(np.all(np.isfinite(orders) & (orders > 1))), f"every Renyi order must be finite and > 1, got {orders}")

        def dp_accounting_rdp(at: np.ndarray) -> np.ndarray:
            values = rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(
                self.sampling_probability, self.noise_multiplier, at)
            values = np.atleast_1d(np.asarray(values, dtype=np.float64))
            require(not bool(np.any(np.isnan(values))), "dp-accounting returned a NaN RDP value")
            # RDP is >= 0; dp-accounting's log-space sums can round to -1e-313 (q = 1e-300)
            return np.maximum(values, 0.0)

        at_order = dp_accounting_rdp(orders)
        at_ceiling = dp_accounting_rdp(np.ceil(orders))
        unsampled = orders / (2.0 * np.float64(self.noise_multiplier) ** 2)
        return np.minimum(np.minimum(at_order, at_ceiling), unsampled)
