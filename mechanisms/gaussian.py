"""The Gaussian mechanism and its Poisson-subsampled form."""
from __future__ import annotations

from dataclasses import dataclass

from typing import TYPE_CHECKING, ClassVar

import numpy as np
from numpy.typing import NDArray

from dpledger.accounting.errors import require, require_in_closed, require_positive
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.accounting.rounding import positive_floor
from dpledger.mechanisms.accountable import AccountableMechanism, mechanism_parameter, register_mechanism
from dpledger.mechanisms.base import require_relation, set_validated
from dpledger.mechanisms.subsampling import amplified_rdp

if TYPE_CHECKING:  # dp_accounting ships no type information: DpEvent is opaque to mypy
    from dp_accounting.dp_event import DpEvent


@register_mechanism
@dataclass(frozen=True)
class GaussianMechanism(AccountableMechanism):
    """Adds N(0, (noise_multiplier * l2_sensitivity)^2) to a query of L2 sensitivity l2_sensitivity.

    RDP: alpha / (2 noise_multiplier^2) at every order (Mironov 2017, Corollary 3).
    """

    name: ClassVar[str] = "gaussian"
    summary: ClassVar[str] = "Gaussian mechanism (Mironov 2017, Proposition 7)"
    has_dp_event: ClassVar[bool] = True
    calibrated: ClassVar[str | None] = "noise_multiplier"
    calibrate_summary: ClassVar[str] = "smallest Gaussian noise multiplier (Mironov 2017, Proposition 7)"

    noise_multiplier: float = mechanism_parameter(
        metavar="Z", unit="unitless",
        help="Gaussian noise standard deviation divided by the L2 sensitivity (unitless, > 0)")
    l2_sensitivity: float = 1.0
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE

    def __post_init__(self) -> None:
        set_validated(self, noise_multiplier=require_positive("noise_multiplier", self.noise_multiplier),
                      l2_sensitivity=require_positive("l2_sensitivity", self.l2_sensitivity),
                      relation=require_relation(self.relation))

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        # float64 division: a tiny noise multiplier gives +inf ("no guarantee"), never OverflowError
        return positive_floor(orders / (2.0 * np.float64(self.noise_multiplier) ** 2))

    def dp_event(self) -> DpEvent:
        """GaussianDpEvent(noise_multiplier): the noise is noise_multiplier * l2_sensitivity, so the
        unit-sensitivity event has RDP alpha / (2 noise_multiplier^2) (Mironov 2017, Corollary 3).

        Returns:
            dp_accounting.GaussianDpEvent(noise_multiplier).
        """
        import dp_accounting

        return dp_accounting.GaussianDpEvent(self.noise_multiplier)


FRACTIONAL_SERIES_MARGIN = 1e-6
"""Relative margin added to dp-accounting's fractional-order series, a float64 computation."""

FRACTIONAL_SERIES_MIN_RATE = 1e-6
"""Below this sampling rate the fractional series loses its digits (11% low at q = 1e-10, sigma 20,
order 1.1; 0 instead of 1.4e-17 at q = 1e-8, order 1.0000001): the integer value at ceil(order) is
charged instead."""


@register_mechanism
@dataclass(frozen=True)
class PoissonSubsampledGaussian(AccountableMechanism):
    """Gaussian mechanism on a Poisson subsample of rate `sampling_probability` (add/remove-one).

    RDP from Mironov, Talwar & Zhang 2019. At an integer order it is their Section 3.3 binomial
    sum, which is the tight Poisson amplification of the Gaussian's k / (2 sigma^2) (Zhu & Wang
    2019, Theorem 5; the Gaussian meets its condition), computed by `amplified_rdp` as log1p of
    non-negative terms: dp-accounting's sum of the same terms cancels at tiny q (3e-7 relative low
    at q = 1e-8). At a fractional order a the charge is the smallest of three sound values:
    dp-accounting's Section 3.4 series raised by FRACTIONAL_SERIES_MARGIN (it is a float64 series,
    seen 4e-10 relative low at q ~ 1e-3; not used below FRACTIONAL_SERIES_MIN_RATE, nor where it
    raises for extreme sigma or q), the integer value at ceil(a) (the divergence is
    non-decreasing in the order, van Erven & Harremoes 2014 Theorem 3), and the unsampled
    Gaussian's a / (2 sigma^2) (joint quasi-convexity, ibid. Theorem 13). The series gives +inf
    where it fails to converge (q=0.5, sigma=2, order 1.875) and can exceed the next integer
    order's value (q=0.5, sigma=10: 0.0117 at order 2.5 against 0.0038 at order 3).
    """

    name: ClassVar[str] = "subsampled-gaussian"
    summary: ClassVar[str] = "Poisson-subsampled Gaussian (Mironov, Talwar & Zhang 2019)"
    has_dp_event: ClassVar[bool] = True
    calibrated: ClassVar[str | None] = "noise_multiplier"
    calibrate_summary: ClassVar[str] = ("smallest noise multiplier of the Poisson-subsampled Gaussian, DP-SGD's "
                                        "(Mironov, Talwar & Zhang 2019)")

    noise_multiplier: float = mechanism_parameter(
        metavar="Z", unit="unitless",
        help="Gaussian noise standard deviation divided by the L2 sensitivity (unitless, > 0)")
    sampling_probability: float = mechanism_parameter(
        flag="sample_rate", metavar="Q_RATE", unit="probability", help="Poisson sampling probability q, in (0, 1]")

    def __post_init__(self) -> None:
        set_validated(self, noise_multiplier=require_positive("noise_multiplier", self.noise_multiplier),
                      sampling_probability=require_in_closed("sampling_probability", self.sampling_probability, 0.0, 1.0))

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        from dp_accounting.rdp import rdp_privacy_accountant

        gaussian = GaussianMechanism(self.noise_multiplier)
        at_ceiling = amplified_rdp(self.sampling_probability, gaussian.rdp_values, np.ceil(orders), general=False)
        fractional = orders != np.ceil(orders)
        if not np.any(fractional) or self.sampling_probability < FRACTIONAL_SERIES_MIN_RATE:
            return at_ceiling
        try:
            series = np.atleast_1d(np.asarray(rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(
                self.sampling_probability, self.noise_multiplier, orders[fractional]), dtype=np.float64))
        except (ZeroDivisionError, OverflowError, FloatingPointError):  # sigma 1e-300 or 1e160
            return at_ceiling
        require(not bool(np.any(np.isnan(series))), "dp-accounting returned a NaN RDP value")
        values = at_ceiling.copy()
        # RDP is >= 0; the series' log-space sums can round to -1e-313 (q = 1e-300)
        raised = np.maximum(series, 0.0) * (1.0 + FRACTIONAL_SERIES_MARGIN)
        values[fractional] = np.minimum(np.minimum(raised, at_ceiling[fractional]), gaussian.rdp_values(orders[fractional]))
        return values

    def dp_event(self) -> DpEvent:
        """PoissonSampledDpEvent(q, GaussianDpEvent(sigma)) (Mironov, Talwar & Zhang 2019). Its RDP in
        dp_accounting's RdpAccountant equals this class's at integer orders; at fractional orders this
        class charges at most the series * (1 + FRACTIONAL_SERIES_MARGIN), and less where the series
        exceeds the next integer order's value (see the class docstring).

        Returns:
            dp_accounting.PoissonSampledDpEvent(sampling_probability, GaussianDpEvent(noise_multiplier)).
        """
        import dp_accounting

        return dp_accounting.PoissonSampledDpEvent(self.sampling_probability,
                                                   dp_accounting.GaussianDpEvent(self.noise_multiplier))
