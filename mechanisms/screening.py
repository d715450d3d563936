"""AdaPMixED's noisy screening (seed section 4.1, Algorithm 1, Theorem 4.1; SPEC section 4)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accounting.errors import require_in_closed, require_int_at_least, require_non_negative, require_order, require_positive
from accounting.relation import NeighbouringRelation
from mechanisms.base import Mechanism


@dataclass(frozen=True)
class ScreeningOutcome:
    """One screening draw: the statistic D_alpha(noisy[K] || public[K]) and whether it passed (<= T)."""

    statistic: float
    passed: bool


@dataclass(frozen=True)
class NoisyScreening(Mechanism):
    """Gaussian screening of the lam-mixed ensemble mean on the public model's top-k tokens.

    RDP (seed Theorem 4.1): eps_screen(a) = (lam / (N sigma))^2 * a at every order.
    Why: pbar = (1/N) sum_i (lam p_i + (1-lam) p0). Replacing teacher i moves pbar by
    (lam/N)(p_i - p_i'); removing it moves pbar by (lam/N)(p_i - mean_{j != i} p_j) (the p0 terms
    cancel). Both have L2 norm <= lam sqrt(2) / N with N the larger ensemble's size, and top-k
    truncation can only shrink it. The Gaussian mechanism with sensitivity D and noise sigma is
    (a, a D^2 / (2 sigma^2))-RDP (Mironov 2017, Corollary 3), i.e. a (lam / (N sigma))^2.
    Clipping and renormalising the noisy vector is post-processing (seed Theorem A.1).
    """

    teachers: int
    lam: float
    sigma: float
    alpha: float = 18.0
    threshold: float = 4.5
    top_k: int = 60
    relation: NeighbouringRelation = NeighbouringRelation.ADD_OR_REMOVE_ONE

    def __post_init__(self) -> None:
        require_int_at_least("teachers", self.teachers, 1)
        require_in_closed("lam", self.lam, 0.0, 1.0)
        require_positive("sigma", self.sigma)
        require_order("alpha", self.alpha)
        require_non_negative("threshold", self.threshold)
        require_int_at_least("top_k", self.top_k, 1)

    @property
    def l2_sensitivity(self) -> float:
        return self.lam * np.sqrt(2.0) / self.teachers

    def rdp_values(self, orders: np.ndarray) -> np.ndarray:
        return (self.lam / (self.teachers * self.sigma)) ** 2 * orders

    def screen(self, teachers, public, generator) -> ScreeningOutcome:
        """Run the screening test once; `generator` is a torch.Generator for the Gaussian noise.

        teachers (N, V) and public (V,) torch or numpy arrays. The statistic is
        D_alpha(noisy[K] || public[K]) on the renormalised top-k (SPEC section 4; the seed's
        Algorithm 1 writes the symmetric form; either is post-processing of the noisy vector).
        """
        import torch

        from mechanisms.kernels import renyi_divergence_orders

        teachers_t = torch.as_tensor(teachers, dtype=torch.float64)
        public_t = torch.as_tensor(public, dtype=torch.float64)
        k = min(self.top_k, public_t.shape[-1])
        top = torch.topk(public_t, k).indices
        mean = self.lam * teachers_t[:, top].mean(dim=0) + (1.0 - self.lam) * public_t[top]
        noise = torch.randn(k, dtype=torch.float64, generator=generator) * self.sigma
        noisy = (mean + noise).clamp_min(0.0)
        public_k = public_t[top] / public_t[top].sum()
        total = noisy.sum()
        if total <= 0:
            return ScreeningOutcome(float("inf"), False)
        noisy = noisy / total
        statistic = float(renyi_divergence_orders(torch.log(noisy), torch.log(public_k),
                                                  torch.tensor([self.alpha], dtype=torch.float64))[0])
        return ScreeningOutcome(statistic, statistic <= self.threshold)
