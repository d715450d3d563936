"""What dpledger's PMixED and AdaPMixED steps are timed against: the public reference implementation's
own step functions when a copy is present, otherwise an in-repo baseline that follows them.

The reference is github.com/james-flemings/pmixed (Flemings et al. 2024). Its PMixED step is
`Ensemble.priv_pred` in ensemble.py on its main branch; its AdaPMixED step (noisy screening,
data-dependent accounting) is `PMixED.gen_priv_output_dist` in pmixed.py on its noisy-screening
branch. Set $DPLEDGER_REFERENCE to a checkout of that repository (a git checkout with both branches,
or a folder holding ensemble.py and/or pmixed.py): `reference_baselines()` imports both files from
there at run time. Only their model loading is replaced (the constructors load a GPT-2 and LoRA
adapters; the stand-in loads nothing); every line of arithmetic runs as published.

`InRepoPMixED` and `InRepoAdaPMixED` are this project's own code for the same two steps, used when
no copy is present. They follow the reference step for step: float32 torch, each divergence as its
branch writes it (main: sum p^a / q^(a-1); noisy-screening: sum (p/q)^a q; NaN falls back to
log max p/q), each mixing weight by scipy's bisect with the reference's arguments (one check at
lambda = 1, then the bracket [0, 1] with 20 halvings: 23 evaluations, the feasible end returned),
main's per-step bisection for beta, the noisy screen mixing all N teachers over the full
vocabulary before the public top-k filter, and the data-dependent loss at the one order alpha by a
loop over teachers.
"""
from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import bisect

REFERENCE_ENV = "DPLEDGER_REFERENCE"
REFERENCE_REPOSITORY = "github.com/james-flemings/pmixed"
PMIXED_SOURCE = ("main", "ensemble.py")             # (branch, file) of the reference's PMixED step
ADAPMIXED_SOURCE = ("noisy-screening", "pmixed.py")  # ... and of its AdaPMixED step


# ---- the in-repo baseline ----------------------------------------------------------------------------

def _renyi(p: torch.Tensor, q: torch.Tensor, alpha: float,
           moment: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]) -> torch.Tensor:
    """D_alpha(p || q) with a branch's finite-order sum `moment`: +inf order log max p/q, order 1 KL,
    a NaN falling back to log max p/q, as both reference branches write it."""
    if alpha == float("inf"):
        value = torch.log(torch.max(p / q))
    elif alpha == 1:
        value = torch.sum(p * torch.log(p / q))
    else:
        value = 1 / (alpha - 1) * torch.log(moment(p, q, alpha))
    return torch.log(torch.max(p / q)) if torch.isnan(value) else value


def renyi_main(p: torch.Tensor, q: torch.Tensor, alpha: float) -> torch.Tensor:
    """D_alpha(p || q) as the reference's main branch writes it: 1/(a - 1) * log(sum p^a / q^(a-1)), in
    the inputs' dtype; +inf order: log max p/q; order 1: KL; a NaN falls back to log max p/q.

    Args:
        p: a distribution (any shape).
        q: a distribution of the same shape.
        alpha: the order (> 0).

    Returns:
        A 0-d tensor.
    """
    return _renyi(p, q, alpha, lambda p, q, a: torch.sum(p ** a / q ** (a - 1)))


def renyi_noisy_screening(p: torch.Tensor, q: torch.Tensor, alpha: float) -> torch.Tensor:
    """D_alpha(p || q) as the reference's noisy-screening branch writes it: 1/(a - 1) * log(sum (p/q)^a q);
    otherwise as `renyi_main`.

    Args:
        p: a distribution (any shape).
        q: a distribution of the same shape.
        alpha: the order (> 0).

    Returns:
        A 0-d tensor.
    """
    return _renyi(p, q, alpha, lambda p, q, a: torch.sum((p / q) ** a * q))


def symmetric(renyi: Callable, p: torch.Tensor, q: torch.Tensor, alpha: float) -> float:
    """max(D_a(p||q), D_a(q||p)) as a Python float, the larger 0-d tensor picked by Python's max.

    Args:
        renyi: `renyi_main` or `renyi_noisy_screening`.
        p: a distribution.
        q: a distribution of the same shape.
        alpha: the order.

    Returns:
        The symmetric divergence.
    """
    return max(renyi(p, q, alpha), renyi(q, p, alpha)).item()


def feasible_mixing_weight(renyi: Callable, teacher: torch.Tensor, public: torch.Tensor, alpha: float,
                           radius: float) -> float:
    """The reference's mixing weight: 1 when the teacher is inside the ball, else scipy's bisect on
    [0, 1] with 20 halvings, which returns the end of its last bracket on the feasible side.

    Args:
        renyi: the branch's divergence.
        teacher: the teacher's distribution (V,).
        public: the public distribution (V,).
        alpha: the order.
        radius: the ball's radius beta * alpha.

    Returns:
        lambda in [0, 1].
    """
    def excess(lam: float) -> float:
        return symmetric(renyi, lam * teacher + (1 - lam) * public, public, alpha) - radius

    if excess(1) <= 0.0:
        return 1
    return bisect(excess, 0, 1, maxiter=20, disp=False)


def subsampled_ball_loss(alpha: int, sample_rate: float, size: int, beta: float) -> float:
    """The per-query RDP the reference's main branch solves beta from: Poisson subsampling at rate q
    (Mironov, Talwar and Zhang 2019, Theorem 9's integer-order binomial expansion) of PMixED's
    Theorem 3.1 loss log((m - 1)/m + exp(4 beta a (a-1))/m) / (a-1) (Flemings et al. 2024) for an
    ensemble of m = `size` teachers, beta * a for m <= 1, as that branch writes it.

    Args:
        alpha: the integer order a >= 2.
        sample_rate: q in [0, 1].
        size: the sampled ensemble size m.
        beta: the ball parameter.

    Returns:
        The per-query RDP at order alpha.
    """
    if size in (0, 1):
        loss_at = lambda order: beta * order  # noqa: E731
    else:
        def loss_at(order: int) -> float:
            return np.log((size - 1) / size + np.exp((order - 1) * 4 * beta * order) / size) / (order - 1)
    terms = [math.comb(alpha, k) * (1 - sample_rate) ** (alpha - k) * sample_rate ** k * np.exp((k - 1) * loss_at(k))
             for k in range(2, alpha + 1)]
    unsampled = (1 - sample_rate) ** (alpha - 1) * (1 + (alpha - 1) * sample_rate)
    return 1 / (alpha - 1) * np.log(unsampled + np.sum(terms))


class InRepoPMixED:
    """The reference's main-branch PMixED step (Flemings et al. 2024, Algorithm 2), as that branch runs
    it: Poisson-sample teachers (numpy's global-style RandomState: m ~ Binomial(N, q), then m
    indices drawn with replacement), solve beta for the per-query budget, mix each sampled teacher
    to the ball, average."""

    def __init__(self, teachers: int, alpha: int, per_query_budget: float, sample_rate: float = 1.0, seed: int = 0):
        """Args:
            teachers: N.
            alpha: the integer order.
            per_query_budget: eps / q_budget, what beta is solved for.
            sample_rate: the Poisson rate p.
            seed: the sampling RandomState's seed.
        """
        self.teachers, self.alpha, self.budget, self.sample_rate = teachers, alpha, per_query_budget, sample_rate
        self.random = np.random.RandomState(seed)

    def step(self, teacher_dists: list[torch.Tensor], public: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
        """One step.

        Args:
            teacher_dists: N float32 distributions (V,).
            public: the public float32 distribution (V,).

        Returns:
            (the output distribution, the lambdas of the sampled teachers).
        """
        sampled = self.random.choice(self.teachers, self.random.binomial(self.teachers, self.sample_rate))
        if len(sampled) == 0:
            return public, np.array([])
        beta = bisect(lambda b: subsampled_ball_loss(self.alpha, self.sample_rate, len(sampled), b) - self.budget,
                      0, 5, maxiter=20, disp=False)
        radius = beta * self.alpha
        lambdas = np.array([feasible_mixing_weight(renyi_main, teacher_dists[i], public, self.alpha, radius)
                            for i in sampled])
        mixed = [lambdas[j] * teacher_dists[i] + (1 - lambdas[j]) * public for j, i in enumerate(sampled)]
        return torch.stack(mixed).mean(dim=0), lambdas


class InRepoAdaPMixED:
    """The reference's noisy-screening-branch AdaPMixED step with data-dependent accounting (Flemings et
    al. 2024, Algorithm 1): every teacher; the noisy screen; if it passes, each teacher mixed to the
    ball, the data-dependent loss at order alpha (max over teachers of the symmetric divergence
    between the mean and the mean without that teacher), the output mean."""

    def __init__(self, alpha: int, beta: float, lam: float, sigma: float, threshold: float, top_k: int):
        """Args:
            alpha: the order.
            beta: the ball parameter (radius beta * alpha).
            lam: the screen's mixing weight.
            sigma: the screen's noise scale.
            threshold: the screen's threshold T.
            top_k: the screen's public top-k.
        """
        self.alpha, self.beta, self.lam, self.sigma = alpha, beta, lam, sigma
        self.threshold, self.top_k = threshold, top_k
        self.privacy_loss = 0.0

    def screen(self, public: torch.Tensor, teacher_dists: list[torch.Tensor], generator: torch.Generator) -> float:
        """The noisy screen's statistic: all teachers mixed at `lam` over the full vocabulary, averaged,
        both laws restricted (by -inf logits, then softmax) to the public top-k, Gaussian noise on the
        mixture's support, shifted by its smallest entry's magnitude and renormalised, then the
        symmetric divergence over the entries left non-zero.

        Args:
            public: (V,) float32.
            teacher_dists: N (V,) float32.
            generator: the noise's generator.

        Returns:
            The statistic.
        """
        public_logits = torch.log(public).view(1, -1)
        outside_top = public_logits < torch.topk(public_logits, self.top_k)[0][..., -1, None]
        public_logits[outside_top] = -float("inf")
        screened_mean = torch.stack([self.lam * t + (1 - self.lam) * public for t in teacher_dists]).mean(dim=0)
        mean_logits = torch.log(screened_mean).view(1, -1)
        mean_logits[outside_top] = -float("inf")
        public_top = F.softmax(public_logits[-1, :], dim=-1)
        noisy = F.softmax(mean_logits[-1, :], dim=-1)
        support = torch.nonzero(noisy, as_tuple=True)[0]
        noisy[support] += torch.normal(0, self.sigma, size=(len(support),), generator=generator)
        shift = torch.abs(torch.min(noisy[support]))
        noisy[support] = (noisy[support] + shift) / (noisy[support] + shift).sum()
        kept = torch.nonzero(noisy)
        return symmetric(renyi_noisy_screening, noisy[kept], public_top[kept], self.alpha)

    def data_dependent_loss(self, mixed: list[torch.Tensor]) -> float:
        """max_i D<->_alpha(mean, mean without teacher i), a loop over teachers.

        Args:
            mixed: N mixed distributions (V,).

        Returns:
            The loss at order alpha.
        """
        mean = torch.stack(mixed).mean(dim=0)
        stacked = torch.stack(mixed)
        worst = 0
        for i in range(stacked.size()[0]):
            without = torch.cat((stacked[:i, :], stacked[i + 1:, :])).mean(dim=0)
            worst = max(worst, symmetric(renyi_noisy_screening, mean, without, self.alpha))
        return worst

    def step(self, teacher_dists: list[torch.Tensor], public: torch.Tensor,
             generator: torch.Generator) -> tuple[torch.Tensor, np.ndarray | None, float]:
        """One step.

        Args:
            teacher_dists: N float32 distributions (V,).
            public: the public float32 distribution (V,).
            generator: the screen's noise generator.

        Returns:
            (the output distribution, the lambdas or None where the screen failed, the statistic).
        """
        size = len(teacher_dists)
        screen_loss = (self.lam / size) ** 2 * self.alpha / self.sigma ** 2
        statistic = self.screen(public, teacher_dists, generator)
        if statistic > self.threshold:
            self.privacy_loss += screen_loss
            return public, None, statistic
        radius = self.beta * self.alpha
        lambdas = np.array([feasible_mixing_weight(renyi_noisy_screening, t, public, self.alpha, radius)
                            for t in teacher_dists])
        mixed = [lambdas[i] * teacher_dists[i] + (1 - lambdas[i]) * public for i in range(size)]
        independent = (self.beta * self.alpha if size == 1 else
                       np.log((size - 1) / size + np.exp((self.alpha - 1) * 4 * self.beta * self.alpha) / size)
                       / (self.alpha - 1))
        self.privacy_loss += min(self.data_dependent_loss(mixed), independent) + screen_loss
        return torch.stack(mixed).mean(dim=0), lambdas, statistic


# ---- the reference, imported from $DPLEDGER_REFERENCE --------------------------------------------

class _NoModel:
    """Stands in for the GPT-2 and LoRA adapters the reference's constructors load."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs) -> "_NoModel":
        """Args:
            *args: ignored.
            **kwargs: ignored.

        Returns:
            A stand-in.
        """
        return cls()

    def to(self, device) -> "_NoModel":
        """Args:
            device: ignored.

        Returns:
            self.
        """
        return self

    def load_adapter(self, *args, **kwargs) -> None:
        """Loads nothing.

        Args:
            *args: ignored.
            **kwargs: ignored.
        """


@dataclass(frozen=True)
class ReferenceSource:
    """Where a reference file was read from."""

    path: Path      # the file imported
    commit: str     # the commit it came from ("unknown" outside git)
    branch: str     # the branch it came from (the working tree's when read from there)


def _git(folder: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _locate(folder: Path, branch: str, name: str, scratch: Path) -> ReferenceSource | None:
    """The reference file `name`: from the folder's working tree if there, else from `branch` (local or
    origin/) of the folder's git repository, written into `scratch`."""
    if (folder / name).is_file():
        head = _git(folder, "rev-parse", "HEAD") or "unknown"
        return ReferenceSource(folder / name, head, _git(folder, "rev-parse", "--abbrev-ref", "HEAD") or "unknown")
    for ref in (branch, f"origin/{branch}"):
        text = _git(folder, "show", f"{ref}:{name}")
        if text is not None:
            target = scratch / branch / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text + "\n")
            return ReferenceSource(target, _git(folder, "rev-parse", ref) or "unknown", branch)
    return None


def _import(source: ReferenceSource, module_name: str):
    os.environ.setdefault("MPLBACKEND", "Agg")   # the reference imports pyplot
    spec = importlib.util.spec_from_file_location(module_name, source.path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(source.path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(source.path.parent))
    for loader in ("PeftModel", "AutoModelForCausalLM"):   # its model loading, nothing else
        if hasattr(module, loader):
            setattr(module, loader, _NoModel)
    return module


class _Tokenizer:
    eos_token_id = 0


def reference_pmixed(module, teachers: int, alpha: int, per_query_budget: float, sample_rate: float = 1.0):
    """The reference's PMixED (main branch's Ensemble), built by its own constructor with models stubbed.

    Args:
        module: the imported ensemble.py.
        teachers: N.
        alpha: the integer order.
        per_query_budget: eps / q_budget.
        sample_rate: the Poisson rate p.

    Returns:
        The Ensemble; its step is `priv_pred(teacher dists + [public])`.
    """
    q_budget = 1024
    return module.Ensemble([f"teacher-{i}" for i in range(teachers)], "stub", _Tokenizer(), q_budget=q_budget,
                           alpha=alpha, eps=per_query_budget * q_budget, p=sample_rate)


def reference_adapmixed(module, teachers: int, alpha: int, beta: float, lam: float, sigma: float, threshold: float,
                        top_k: int):
    """The reference's AdaPMixED (noisy-screening branch's PMixED, data-dependent accounting), built by
    its own constructor with models stubbed.

    Args:
        module: the imported pmixed.py.
        teachers: N.
        alpha: the order.
        beta: the ball parameter.
        lam: the screen's mixing weight.
        sigma: the screen's noise scale.
        threshold: the screen's threshold.
        top_k: the screen's public top-k.

    Returns:
        The PMixED object; its step is `gen_priv_output_dist(public, teacher dists)`.
    """
    return module.PMixED(None, [f"teacher-{i}" for i in range(teachers)], "stub", _Tokenizer(),
                         alpha=alpha, beta=beta, lambd=lam, sigma=sigma, threshold=threshold, screen_top_k=top_k,
                         accounting_method="Dependent", p=1.0)


@dataclass
class Reference:
    """The reference's two modules and where they came from (None: that file was not found)."""

    folder: Path
    pmixed_module: object | None
    pmixed_source: ReferenceSource | None
    adapmixed_module: object | None
    adapmixed_source: ReferenceSource | None

    def describe(self, which: str) -> str:
        """Args:
            which: "pmixed" or "adapmixed".

        Returns:
            "reference <repo> <branch>:<file> at commit <sha>" or the in-repo baseline's name.
        """
        source = self.pmixed_source if which == "pmixed" else self.adapmixed_source
        if source is None:
            return IN_REPO
        return f"reference {REFERENCE_REPOSITORY} {source.branch}:{source.path.name} at commit {source.commit}"


IN_REPO = "in-repo baseline (benchmarks/baselines.py, follows the reference)"


def load_reference() -> Reference | None:
    """The reference from $DPLEDGER_REFERENCE, or None when the variable is unset.

    Returns:
        The Reference (a file missing there leaves its module None).

    Raises:
        ValueError: if the variable names no folder.
    """
    value = os.environ.get(REFERENCE_ENV)
    if not value:
        return None
    folder = Path(value).expanduser().resolve()
    if not folder.is_dir():
        raise ValueError(f"${REFERENCE_ENV} must name a folder holding the reference; got {value!r}")
    scratch = Path(tempfile.mkdtemp(prefix="dpledger-reference-"))
    pmixed_source = _locate(folder, *PMIXED_SOURCE, scratch)
    adapmixed_source = _locate(folder, *ADAPMIXED_SOURCE, scratch)
    return Reference(folder,
                     None if pmixed_source is None else _import(pmixed_source, "pmixed_reference_main"),
                     pmixed_source,
                     None if adapmixed_source is None else _import(adapmixed_source, "pmixed_reference_screening"),
                     adapmixed_source)
