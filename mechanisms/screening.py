"""AdaPMixED's noisy screening (Flemings et al. 2024, Section 4.1, Algorithm 1, Theorem 4.1)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from dpledger.accounting.errors import (require, require_bool, require_in_closed, require_int_at_least, require_non_negative,
                               require_not_nan, require_order, require_positive)
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.accounting.rounding import positive_floor
from dpledger.mechanisms.accountable import TEACHERS_HELP, AccountableMechanism, mechanism_parameter, register_mechanism
from dpledger.mechanisms.base import require_relation, set_validated
from dpledger.mechanisms.distributions import validated_ensemble
from dpledger.mechanisms.kernels import SCREEN_VERSION, _SLACK_ULPS, _set_threads, renyi_divergence_orders
from dpledger.mechanisms.randomness import StepGenerators, standard_normal
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:  # dp_accounting ships no type information: DpEvent is opaque to mypy
    import torch
    from dp_accounting.dp_event import DpEvent
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light


@dataclass(frozen=True)
class ScreeningOutcome:
    """One screening draw: the statistic D_alpha(noisy[K] || public[K]) and whether it passed (<= T)."""

    statistic: float
    passed: bool

    def __post_init__(self) -> None:
        set_validated(self, statistic=require_not_nan("statistic", self.statistic),
                      passed=require_bool("passed", self.passed))


BLIND_SCREEN_RATIO = 1e-2
"""lam / (N sigma) below this: the ensemble moves the screened statistic far less than the noise
does, so the screen's decisions are (almost) independent of the private data; the trace lint and
`dpledger verify` both flag it."""


@register_mechanism
@dataclass(frozen=True)
class NoisyScreening(AccountableMechanism):
    """Gaussian screening of the lam-mixed ensemble mean on the public model's top-k tokens.

    RDP (Flemings et al. 2024, Theorem 4.1): eps_screen(a) = (lam / (N sigma))^2 * a at every order.
    Why: pbar = (1/N) sum_i (lam p_i + (1-lam) p0). Replacing teacher i moves pbar by
    (lam/N)(p_i - p_i'); removing it moves pbar by (lam/N)(p_i - mean_{j != i} p_j) (the p0 terms
    cancel). Both have L2 norm <= lam sqrt(2) / N with N the larger ensemble's size, and top-k
    truncation can only shrink it. The Gaussian mechanism with sensitivity D and noise sigma is
    (a, a D^2 / (2 sigma^2))-RDP (Mironov 2017, Corollary 3), i.e. a (lam / (N sigma))^2.
    Clipping and renormalising the noisy vector is post-processing (Mironov 2017, Proposition 9).
    """

    name: ClassVar[str] = "screening"
    summary: ClassVar[str] = "AdaPMixED's noisy screening step alone (Flemings et al. 2024, Theorem 4.2's eps_screen)"
    has_dp_event: ClassVar[bool] = True
    calibrated: ClassVar[str | None] = "sigma"
    calibrate_summary: ClassVar[str] = "smallest sigma of AdaPMixED's noisy screening (Flemings et al. 2024, Theorem 4.1)"

    teachers: int = mechanism_parameter(metavar="N", type=int, unit="teachers", help=TEACHERS_HELP)
    lam: float = mechanism_parameter(metavar="LAMBDA", unit="unitless", help="screening mixing weight lambda, in (0, 1]")
    sigma: float = mechanism_parameter(
        metavar="SIGMA", unit="probability units",
        help="standard deviation of the Gaussian added to each probability of the mixed distribution "
             "(probability units, > 0)")
    alpha: float = 18.0
    threshold: float = 4.5
    top_k: int = 60
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE

    def __post_init__(self) -> None:
        set_validated(self, teachers=require_int_at_least("teachers", self.teachers, 1),
                      lam=require_in_closed("lam", self.lam, 0.0, 1.0), sigma=require_positive("sigma", self.sigma),
                      alpha=require_order("alpha", self.alpha),
                      threshold=require_non_negative("threshold", self.threshold),
                      top_k=require_int_at_least("top_k", self.top_k, 1), relation=require_relation(self.relation))

    @property
    def l2_sensitivity(self) -> float:
        return float(self.lam * np.sqrt(2.0) / self.teachers)

    def rdp_values(self, orders: NDArray[np.float64]) -> NDArray[np.float64]:
        # float64: sigma = 1e-300 gives +inf ("no guarantee"), never OverflowError
        values = (np.float64(self.lam) / (self.teachers * np.float64(self.sigma))) ** 2 * orders
        return positive_floor(values) if self.lam > 0 else values  # lam = 0 reads no teacher: exactly 0

    @property
    def noise_multiplier(self) -> float:
        """sigma / l2_sensitivity = N sigma / (lam sqrt 2): the Gaussian mechanism with this noise
        multiplier has RDP a / (2 z^2) = (lam / (N sigma))^2 a, Theorem 4.1's eps_screen (Flemings et
        al. 2024; Mironov 2017, Corollary 3). +inf for lam = 0 (the screen reads no teacher)."""
        return math.inf if self.lam == 0 else float(self.teachers * np.float64(self.sigma) / (self.lam * math.sqrt(2.0)))

    def dp_event(self) -> DpEvent:
        """GaussianDpEvent(N sigma / (lam sqrt 2)) (see noise_multiplier); NoOpDpEvent for lam = 0.

        Returns:
            The GaussianDpEvent, or a NoOpDpEvent.
        """
        import dp_accounting

        if self.lam == 0:
            return dp_accounting.NoOpDpEvent()
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

    def statistics(self, teachers: torch.Tensor | npt.ArrayLike, public: torch.Tensor | npt.ArrayLike,
                   generator: torch.Generator | StepGenerators, version: int = SCREEN_VERSION) -> torch.Tensor:
        """Screening statistics of L queries at once (Flemings et al. 2024, Algorithm 1): teachers
        (L, N, V), public (L, V) -> (L,) torch float64; `generator` is a torch.Generator or
        dpledger.mechanisms.randomness.StepGenerators (one per query).

        Per query: K = top-k of p0 (public, so free); mean = lam * mean_i p_i[K] + (1-lam) p0[K];
        add N(0, sigma^2) to each entry, clip at 0 and renormalise (post-processing); the statistic
        is D_alpha(noisy || p0[K] renormalised) (Flemings et al. 2024, Algorithm 1 writes the symmetric form;
        either is post-processing of the noisy vector). An all-zero noisy vector gives +inf. From records
        version 10 the statistic takes one compiled pass (dpledger.mechanisms.fused.screen_statistics); before,
        statistic_from_mean's torch operations, which a replay of an earlier trace follows.

        Args:
            teachers: (L, N, V) the teachers' distributions, N = self.teachers.
            public: (L, V) the public model's distributions.
            generator: a torch.Generator, or StepGenerators with one generator per query.
            version: the records version whose arithmetic to follow (dpledger.mechanisms.kernels.SCREEN_VERSION).

        Returns:
            (L,) float64 statistics.

        Raises:
            ValueError: if the teacher axis does not hold N distributions, the shapes do not match, or a
                statistic is NaN (an input holds NaN or inf).
        """
        ensemble = torch.as_tensor(teachers, dtype=torch.float64)
        reference = torch.as_tensor(public, dtype=torch.float64)
        # the charge uses N = self.teachers: a smaller ensemble would be under-charged
        require(ensemble.ndim >= 2 and ensemble.shape[-2] == self.teachers,
                f"teachers must hold N={self.teachers} distributions on axis -2, got shape {tuple(ensemble.shape)}")
        require(reference.shape[-1] == ensemble.shape[-1] and tuple(reference.shape[:-1]) == tuple(ensemble.shape[:-2]),
                f"public shape {tuple(reference.shape)} does not match teachers {tuple(ensemble.shape)}")
        # the top-k on the CPU (a GPU's topk may break ties otherwise, and the replay runs on the CPU), the
        # teachers' columns gathered where they are: only (..., N, k) values cross to the CPU, not (..., N, V)
        reference = reference.cpu()
        top = self.top_indices(reference)
        teacher_top = torch.gather(ensemble, -1, top.to(ensemble.device).unsqueeze(-2).expand(
            *ensemble.shape[:-1], top.shape[-1])).cpu()
        public_top = torch.gather(reference, -1, top)
        if version >= 10:
            return self._compiled_statistics(teacher_top, public_top, standard_normal(public_top.shape, generator))
        mean = self.lam * teacher_top.mean(dim=-2) + (1.0 - self.lam) * public_top
        noise = self.sigma * standard_normal(mean.shape, generator)
        return self.statistic_from_mean(mean, public_top, noise)

    def _compiled_statistics(self, teacher_top: torch.Tensor, public_top: torch.Tensor,
                             draws: torch.Tensor) -> torch.Tensor:
        """statistics from the gathered columns (..., N, k) and (..., k) and standard normal draws (..., k),
        in one compiled pass (records version >= 10); ValueError for a NaN statistic."""
        from dpledger.mechanisms.fused import screen_statistics   # deferred: numba kernels on first use

        batch, size = tuple(public_top.shape[:-1]), public_top.shape[-1]
        steps = math.prod(batch)
        out = np.empty(steps)
        if steps:
            _set_threads()
            teacher_rows, public_rows, draw_rows = (np.ascontiguousarray(values.detach().double().numpy())
                                                    for values in (teacher_top, public_top, draws))
            screen_statistics(teacher_rows.reshape(steps, self.teachers, size), public_rows.reshape(steps, size),
                              draw_rows.reshape(steps, size), float(self.lam), float(self.sigma), float(self.alpha),
                              _SLACK_ULPS, out)
        nan = np.isnan(out)
        if nan.any():
            raise ValueError(f"screening statistic is NaN in row {int(np.argmax(nan))}: an input distribution "
                             "holds NaN or inf")
        return torch.from_numpy(out.reshape(batch))

    def top_indices(self, public: torch.Tensor) -> torch.Tensor:
        """K: the public model's top-k tokens per query (public, so choosing them costs nothing).

        Args:
            public: (..., V) the public model's distributions.

        Returns:
            (..., min(top_k, V)) int64 token indices, largest probability first.
        """
        return torch.topk(public, min(self.top_k, public.shape[-1]), dim=-1).indices

    def statistic_from_mean(self, mean: torch.Tensor, public_top: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """D_alpha(clip(mean + noise, 0) renormalised || public_top renormalised), broadcast over
        leading axes; +inf where the clipped noisy vector is all zero.

        Args:
            mean: (..., K) the lam-mixed ensemble mean on the top-k tokens.
            public_top: (..., K) the public model's probabilities on them.
            noise: (..., K) the Gaussian noise, sigma included.

        Returns:
            (...,) float64 statistics at order alpha.
        """
        noisy = (mean + noise).clamp_min(0.0)
        total = noisy.sum(dim=-1, keepdim=True)
        order = torch.tensor([self.alpha], dtype=torch.float64)
        statistic = renyi_divergence_orders(torch.log(noisy / total.clamp_min(1e-300)),
                                            torch.log(public_top / public_top.sum(dim=-1, keepdim=True)), order)[..., 0]
        return torch.where(total[..., 0] > 0, statistic, torch.full_like(statistic, torch.inf))

    def pass_counts(self, mean: torch.Tensor, public_top: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """How many of S noise draws pass the screen, for E ensembles of each of L steps with the same
        draws for all of a step's ensembles (the audit's Monte Carlo): statistic_from_mean per draw,
        compared with the threshold. CPU tensors run one fused kernel
        (dpledger.mechanisms.fused.screen_pass_counts), others broadcast statistic_from_mean.

        Args:
            mean: (L, E, k) the lam-mixed ensemble means on the top-k tokens.
            public_top: (L, k) the public model's probabilities on them.
            noise: (L, S, k) the Gaussian noise, sigma included.

        Returns:
            (L, E) float64 counts of passing draws.

        Raises:
            ValueError: if the shapes disagree or an input holds NaN (a NaN statistic is no decision).
        """
        require(mean.ndim == 3 and public_top.ndim == 2 and noise.ndim == 3
                and public_top.shape == (mean.shape[0], mean.shape[2])
                and noise.shape[0] == mean.shape[0] and noise.shape[2] == mean.shape[2],
                f"pass_counts needs mean (L, E, k), public_top (L, k) and noise (L, S, k), got shapes "
                f"{tuple(mean.shape)}, {tuple(public_top.shape)} and {tuple(noise.shape)}")
        for name, values in (("mean", mean), ("public_top", public_top), ("noise", noise)):
            require(not bool(torch.isnan(values).any()), f"pass_counts: {name} holds NaN")
        if mean.device.type != "cpu":
            statistic = self.statistic_from_mean(mean.unsqueeze(2), public_top.unsqueeze(1).unsqueeze(1),
                                                 noise.unsqueeze(1))                    # (L, E, S)
            return (statistic <= self.threshold).double().sum(dim=2)
        from dpledger.mechanisms.fused import screen_pass_counts

        log_public = torch.log(public_top / public_top.sum(dim=-1, keepdim=True)).double().numpy()
        counts = np.empty(tuple(mean.shape[:2]))
        _set_threads()
        screen_pass_counts(np.ascontiguousarray(mean.double().numpy()), np.ascontiguousarray(log_public),
                           np.ascontiguousarray(noise.double().numpy()), float(self.alpha), float(self.threshold),
                           _SLACK_ULPS, counts)
        return torch.from_numpy(counts)

    def screen(self, teachers: npt.ArrayLike | torch.Tensor, public: npt.ArrayLike | torch.Tensor,
               generator: torch.Generator) -> ScreeningOutcome:
        """One query: teachers (N, V), public (V,).

        Args:
            teachers: (N, V) the teachers' distributions.
            public: (V,) the public model's distribution.
            generator: the torch generator of the noise.

        Returns:
            The statistic and whether it passed (statistic <= threshold).

        Raises:
            ValueError: if the distributions are invalid or do not match, or `generator` is not a torch.Generator.
        """
        teachers, public = validated_ensemble(teachers, public, self.teachers)
        require(isinstance(generator, torch.Generator), f"generator must be a torch.Generator, got {generator!r}")
        statistic = float(self.statistics(torch.from_numpy(teachers)[None], torch.from_numpy(public)[None], generator)[0])
        return ScreeningOutcome(statistic, statistic <= self.threshold)
