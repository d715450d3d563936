"""Neighbour-ensemble ablations: rebuild the mechanism's exact per-step output
distribution on each neighbouring ensemble, compute the Renyi divergences in both directions over
the order grid, compose over the run per direction, convert, and compare with the claimed epsilon.

Output distribution of one step, for an ensemble of mixed teachers pbar_i (i in the ensemble, size n):
  PMixED:            p = mean_i pbar_i (Flemings et al. 2024, Algorithm 2);
  Poisson rate q:    p = c_n mean_i pbar_i + (1 - c_n) p0, c_n = 1 - (1-q)^n: each teacher is in the
                     subsample with probability q and E[1{i in S} / |S|] = c_n / n; an empty subsample
                     answers with p0 (exact, no sampling needed);
  with screening:    the released pair (decision, token) has law [pi p, (1 - pi) p0] over 2V outcomes,
                     pi = Pr[screen passes], estimated by Monte Carlo with common random numbers across
                     neighbours, with a Clopper-Pearson interval (it has no closed form).
Two quantities are measured for screened mechanisms (dpledger.decoding.runners.adapmixed_runner has the analysis):
  released output:   D_a of the pair's law above, per step, composed: what an RDP bound on the released
                     output must cover, and what the ledger's "released-output" accounting charges;
  realised path:     D_a(Bernoulli(pi) || Bernoulli(pi')) + 1{the screen passed at this step} D_a(p || p'),
                     what the paper's Theorem 4.2 ("realised-path" accounting) bounds. It is not the
                     divergence of any released law; a realised-path claim is compared with it like with
                     like, and with the released output for the verdict.
The lambda of a teacher depends on p_i and p0 only, so neighbours keep the others' lambdas.
Neighbours: every teacher removed (or a seeded sample of them), and an added adversarial teacher:
a point mass on a token, chosen per step among the token the output likes least, the token the
public model likes least and the one it likes most (an added model may answer each context
differently, so a per-step choice is one fixed adversarial teacher).
"""
from __future__ import annotations

import hashlib
import math
import warnings
from dataclasses import dataclass
from typing import NotRequired, TypedDict

import numpy as np
import torch
from scipy.stats import beta as beta_distribution

from dpledger.accounting.conversion import epsilon_from_rdp
from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.errors import require
from dpledger.accounting.orders import canonical_orders
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.accounting.rounding import ROUNDING_ULPS
from dpledger.accounting.summation import UNIT_ROUNDOFF
from dpledger.audit.checks import CheckResult, failed, skipped, verdict
from dpledger.audit.loader import DATA_DEPENDENT_FILTER, LoadedTrace, OverWindows
from dpledger.decoding import trace as trace_files
from dpledger.mechanisms.kernels import renyi_divergence_orders, sums_without_each
from dpledger.mechanisms.leave_one_out import leave_one_out_direction_divergences
from dpledger.mechanisms.ball import Ball
from dpledger.mechanisms.pmixed import PMixED
from dpledger.mechanisms.screening import NoisyScreening

DEFAULT_AUDIT_ORDERS = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 18.0, 20.0, 24.0, 32.0,
                        48.0, 64.0)
"""Where the ablation evaluates divergences (about 8x cheaper than the ledger's whole grid): each is
replaced by the nearest order of the claim's own grid (`audit_orders`), and the claim's optimal
order at each delta is added, so a sound claim is compared like with like and can never fail
through the choice of orders (the tested pair's curve is at most the claim's at every order)."""


def audit_orders(claim_grid, optimal_orders, requested=DEFAULT_AUDIT_ORDERS) -> tuple[float, ...]:
    """The orders of `claim_grid` nearest each `requested` order, its smallest order and the claim's
    optimal orders (one per delta; None where the claim has none): a subset of the claim's grid.

    Args:
        claim_grid: the claim's order grid (increasing orders > 1).
        optimal_orders: the claim's optimal order at each delta, None where it has none.
        requested: the orders to approximate on the grid (default DEFAULT_AUDIT_ORDERS).

    Returns:
        The chosen orders of `claim_grid`, increasing and without duplicates (canonical_orders).
    """
    grid = np.asarray(claim_grid, dtype=np.float64)
    nearest = {float(grid[int(np.argmin(np.abs(grid - order)))]) for order in requested}
    chosen = nearest | {float(grid[0])} | {float(grid[int(np.argmin(np.abs(grid - o)))]) for o in optimal_orders
                                           if o is not None}
    return canonical_orders(sorted(chosen))

ADVERSARY_LABELS = ("add-one: point mass, output's rarest token",
                    "add-one: point mass, public's rarest token",
                    "add-one: point mass, public's top token")


@dataclass
class AblationResult:
    labels: list[str]                 # one per neighbour
    forward: np.ndarray               # (E, K) composed D(M(D) || M(D')) of the released output
    backward: np.ndarray              # (E, K) composed D(M(D') || M(D))
    orders: tuple[float, ...]
    epsilon: np.ndarray               # (E,) empirical epsilon at delta (released output)
    order: list[float | None]
    delta: float
    screen_probability_halfwidth: float | None
    sampled_teachers: list[int]
    realised_path_epsilon: np.ndarray | None = None   # (E,) the realised-path quantity (screened mechanisms)

    def relation_of(self, row: int) -> NeighbouringRelation:
        """REMOVE_ONE for a removed teacher, ADD_ONE for an added adversary.

        Args:
            row: the neighbour's row in `labels` (and in `forward`, `backward`, `epsilon`).

        Returns:
            The neighbouring relation that neighbour belongs to.
        """
        return NeighbouringRelation.REMOVE_ONE if self.labels[row].startswith("remove") else NeighbouringRelation.ADD_ONE


def subsample_coverage(size: torch.Tensor, rate: float | None) -> torch.Tensor:
    """c_n = Pr[a Poisson(q) subsample of n teachers is non-empty] (1 without subsampling, n >= 1).

    Args:
        size: ensemble sizes n (any shape; integers >= 0).
        rate: the Poisson sampling rate q in (0, 1]; None without subsampling.

    Returns:
        c_n per size, float64, the shape of `size` (0 for an empty ensemble without subsampling).
    """
    size = size.double()
    if rate is None:
        return (size > 0).double()
    return 1.0 - (1.0 - rate) ** size


def ensemble_output(total: torch.Tensor, size: torch.Tensor, public: torch.Tensor, rate: float | None) -> torch.Tensor:
    """Exact output law for an ensemble whose mixed teachers sum to `total` (..., V) with `size` members.

    Args:
        total: the sum of the ensemble's mixed teachers, (..., V).
        size: its number of members, (...), integers >= 0.
        public: the public model's law, broadcastable to `total`; it answers where the subsample is empty.
        rate: the Poisson sampling rate q; None without subsampling.

    Returns:
        The output law (..., V): c_n total / n + (1 - c_n) public, negative rounding clamped to 0.
    """
    size = size.double().unsqueeze(-1)
    law = total / size.clamp_min(1.0)
    if rate is not None or bool((size == 0).any()):
        coverage = subsample_coverage(size, rate)
        law.mul_(coverage).add_((1.0 - coverage) * public)
    return law.clamp_min_(0.0)


def screen_pass_counts(teacher_sums: torch.Tensor, sizes: torch.Tensor, public: torch.Tensor, params: dict,
                       samples: int, generator: torch.Generator) -> torch.Tensor:
    """Monte Carlo count of screen passes (out of `samples`) per step and ensemble: teacher_sums
    (L, E, V) are sums of the raw teacher distributions of each ensemble, sizes (L, E) their sizes.
    The same noise draws serve every ensemble of a step (common random numbers).

    Args:
        teacher_sums: (L, E, V) sums of each ensemble's raw teacher distributions.
        sizes: (L, E) the ensembles' sizes.
        public: (L, V) the public model's law.
        params: the run's mechanism parameters (lam, sigma, alpha, threshold, top_k).
        samples: Monte Carlo draws per step.
        generator: the source of the screening noise.

    Returns:
        (L, E) float64 counts of draws whose screening statistic passed (<= threshold).
    """
    top = screening_of(params).top_indices(public)                                    # (L, k)
    teacher_top = torch.gather(teacher_sums, -1, top.unsqueeze(1).expand(-1, teacher_sums.shape[1], -1))
    return screen_pass_counts_on_top(teacher_top, sizes, torch.gather(public, -1, top), params, samples, generator)


def screening_of(params: dict) -> NoisyScreening:
    """The run's noisy screen from its mechanism parameters (lam, sigma, alpha, threshold, top_k).

    Args:
        params: the run's mechanism parameters.

    Returns:
        The NoisyScreening (its N is irrelevant here: the ensembles' sizes are given apart).
    """
    return NoisyScreening(teachers=1, lam=params["lam"], sigma=params["sigma"], alpha=params["alpha"],
                          threshold=params["threshold"], top_k=int(params["top_k"]))


def screen_pass_counts_on_top(teacher_top: torch.Tensor, sizes: torch.Tensor, public_top: torch.Tensor, params: dict,
                              samples: int, generator: torch.Generator) -> torch.Tensor:
    """screen_pass_counts on the public model's top-k tokens already gathered: teacher_top (L, E, k)
    sums of each ensemble's raw teachers there, public_top (L, k) the public model's probabilities
    there, largest first (NoisyScreening.top_indices' order, which the noise draws follow).

    Args:
        teacher_top: (L, E, k) sums of each ensemble's raw teacher distributions on the top-k tokens.
        sizes: (L, E) the ensembles' sizes.
        public_top: (L, k) the public model's probabilities on its top-k tokens.
        params: the run's mechanism parameters (lam, sigma, alpha, threshold, top_k).
        samples: Monte Carlo draws per step.
        generator: the source of the screening noise.

    Returns:
        (L, E) float64 counts of draws whose screening statistic passed (<= threshold).
    """
    screening = screening_of(params)
    mean = screening.lam * teacher_top / sizes.double().unsqueeze(-1) + (1 - screening.lam) * public_top.unsqueeze(1)
    noise = screening.sigma * torch.randn((public_top.shape[0], samples, public_top.shape[-1]), generator=generator,
                                          dtype=torch.float64)
    return screening.pass_counts(mean, public_top, noise)


def smoothed_probability(successes: torch.Tensor, samples: int) -> torch.Tensor:
    """(k + 1/2) / (n + 1), the Jeffreys-prior mean: never exactly 0 or 1, so an estimate of 1 on one
    ensemble and 1 - 1/n on a neighbour cannot fake an infinite divergence; equal counts (common
    random numbers) still give equal estimates.

    Args:
        successes: pass counts k (any shape).
        samples: the number of draws n.

    Returns:
        (k + 1/2) / (n + 1), the shape of `successes`.
    """
    return (successes + 0.5) / (samples + 1.0)


def clopper_pearson(successes: np.ndarray, trials: int, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact binomial confidence interval (Clopper & Pearson 1934), two-sided at `confidence`.

    Args:
        successes: success counts in [0, trials] (any shape).
        trials: the number of trials.
        confidence: the two-sided confidence level in (0, 1); each tail holds (1 - confidence) / 2.

    Returns:
        (low, high) float64 arrays the shape of `successes` (low = 0 at 0 successes, high = 1 at `trials`).
    """
    tail = (1 - confidence) / 2
    successes = np.asarray(successes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        low = np.where(successes == 0, 0.0, beta_distribution.ppf(tail, successes, trials - successes + 1))
        high = np.where(successes == trials, 1.0, beta_distribution.ppf(1 - tail, successes + 1, trials - successes))
    return low, high


def point_mass_adversaries(output: torch.Tensor, public: torch.Tensor) -> torch.Tensor:
    """(L, 3) candidate tokens for an added point-mass teacher (see ADVERSARY_LABELS); ValueError
    where either law holds a NaN (argmin / argmax would pick it: torch ranks NaN above every number).

    Args:
        output: (L, V) the run's output law per step.
        public: (L, V) the public model's law per step.

    Returns:
        (L, 3) token ids: the output's least likely, the public model's least and most likely.

    Raises:
        ValueError: if either law holds a NaN (naming the first rows).
    """
    for name, law in (("output", output), ("public", public)):
        rows = torch.nonzero(law.isnan().any(dim=-1))[:, 0].tolist()
        require(not rows, f"point-mass adversaries: the {name} distribution holds NaN at rows {rows[:5]}")
    return torch.stack([output.argmin(-1), public.argmin(-1), public.argmax(-1)], dim=-1)


def block_divergences(trace: LoadedTrace, records: list[dict], logits: torch.Tensor, removed: list[int],
                      orders: torch.Tensor, mc_samples: int, generator: torch.Generator,
                      confidence: float) -> tuple[torch.Tensor, float | None, torch.Tensor | None]:
    """Per-step divergences (2, L, E, K) between the run's output law and each neighbour's, the
    halfwidth of the screening probabilities' interval, and the realised-path divergences.

    Args:
        trace: the loaded run (its mechanism type and parameters).
        records: the window's per-step records (their lambdas and screen decisions).
        logits: (N+1, L, V) the window's logits, public model first.
        removed: the teachers removed one at a time.
        orders: (K,) the Renyi orders.
        mc_samples: Monte Carlo draws per step for the screen's pass probabilities.
        generator: the Monte Carlo's source of randomness.
        confidence: the Clopper-Pearson level of the halfwidth.

    Returns:
        As neighbour_divergences: ((2, L, E, K) divergences, the halfwidth or None, the realised-path
        divergences or None).
    """
    # the decode loop's own inputs (as_ensemble renormalises each row): the laws the run released, and the
    # rows Eq. 3's check forms its leave-one-out ratios from, which the removals share below
    teachers, public = trace.window_ensemble(logits)
    if trace.mechanism_type == "ensemble":
        lambdas = torch.ones(teachers.shape[:-1], dtype=torch.float64)
    else:
        lambdas = torch.tensor([r["lambdas"] for r in records], dtype=torch.float64)
    passed = torch.tensor([bool(r.get("screen_passed", True)) for r in records])
    prepared = (trace.window_leave_one_out(logits, lambdas)
                if removals_through_kernel(teachers, trace.params.get("sample_rate")) else None)
    return neighbour_divergences(public, teachers, lambdas, trace.mechanism_type, trace.params, removed, orders,
                                 mc_samples, generator, confidence, passed, prepared)


def _added_neighbours(output: torch.Tensor, total: torch.Tensor, teachers: int, public: torch.Tensor, kind: str,
                      params: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The three add-one adversaries (point_mass_adversaries), projected on the run's ball like any
    teacher, and the output laws of the ensembles of `teachers` + 1 they join (total: the N mixed
    teachers' sum): ((L, 3, V) point masses, (L, 3, V) laws)."""
    tokens = point_mass_adversaries(output, public)                                         # (L, 3)
    point_masses = torch.nn.functional.one_hot(tokens, public.shape[-1]).double()            # (L, 3, V)
    if kind == "ensemble":
        adversary_lambdas = torch.ones(tokens.shape, dtype=torch.float64)
    else:
        # projected like any teacher, on the run's own ball
        projection = PMixED(params["alpha"], params["beta"], 1, ball=params.get("ball", Ball.PROJECTION_ORDER.value))
        adversary_lambdas = projection.mixing_weights_tensor(point_masses, public)
    adversaries = adversary_lambdas.unsqueeze(-1) * point_masses + (1 - adversary_lambdas.unsqueeze(-1)) * public.unsqueeze(-2)
    sizes = torch.full(tokens.shape, teachers + 1)
    return point_masses, ensemble_output(total.unsqueeze(1) + adversaries, sizes, public.unsqueeze(1),
                                         params.get("sample_rate"))


def removals_through_kernel(teachers: torch.Tensor, rate: float | None) -> bool:
    """Whether neighbour_divergences takes the removals through the leave-one-out kernel (no subsampling,
    N >= 2, CPU tensors), and so reads `prepared` rows; otherwise every neighbour's law is built in torch.

    Args:
        teachers: (L, N, V) the teachers' laws.
        rate: the Poisson subsampling rate, or None.

    Returns:
        True where the kernel path applies.
    """
    return rate is None and teachers.shape[-2] >= 2 and teachers.device.type == "cpu"


def neighbour_divergences(public: torch.Tensor, teachers: torch.Tensor, lambdas: torch.Tensor, kind: str,
                          params: dict, removed: list[int], orders: torch.Tensor, mc_samples: int = 400,
                          generator: torch.Generator | None = None, confidence: float = 0.95,
                          passed: torch.Tensor | None = None, prepared: list | None = None
                          ) -> tuple[torch.Tensor, float | None, torch.Tensor | None]:
    """Divergences (2, L, E, K) in both directions between the output law of the ensemble
    (public (L, V), teachers (L, N, V), lambdas (L, N)) and each neighbour's: the teachers in
    `removed` taken out one at a time, then the three add-one adversaries. Vectorised over steps,
    neighbours and the vocabulary. With screening, also the realised-path divergences (2, L, E, K):
    the decision's plus, where `passed` (L,) is true, the token's given that the screen passed
    (None without screening, where both quantities are the same).

    Args:
        public: (L, V) the public model's law.
        teachers: (L, N, V) the teachers' laws.
        lambdas: (L, N) the mixing weights in [0, 1].
        kind: the mechanism type ("pmixed", "adapmixed" or "ensemble").
        params: the mechanism's parameters (alpha, beta, ball, sample_rate, the screen's).
        removed: the teachers removed one at a time.
        orders: (K,) the Renyi orders.
        mc_samples: Monte Carlo draws per step for the screen's pass probabilities.
        generator: their source of randomness; None: seeded with 0.
        confidence: the Clopper-Pearson level of the returned halfwidth.
        passed: (L,) bool, where the screen passed (realised path); None: every step.
        prepared: each step's leave-one-out rows (dpledger.mechanisms.leave_one_out.prepared_leave_one_out) of
            exactly these laws and lambdas, where removals_through_kernel holds; None: formed here.

    Returns:
        ((2, L, E, K) forward and backward divergences with E = len(removed) + 3; the largest
        halfwidth of the pass probabilities' intervals, None without screening; the realised-path
        divergences (2, L, E, K), None without screening).

    Raises:
        ValueError: if the output or public law holds a NaN (point_mass_adversaries).
    """
    n = teachers.shape[-2]
    rate = params.get("sample_rate")
    length = public.shape[0]
    removed_t = torch.tensor(removed, dtype=torch.long)

    def divergences(log_output: torch.Tensor, log_neighbours: torch.Tensor) -> torch.Tensor:
        return torch.stack([renyi_divergence_orders(log_output, log_neighbours, orders, parallel=True),
                            renyi_divergence_orders(log_neighbours, log_output, orders, parallel=True)])

    # without subsampling on the CPU, the removals run through the leave-one-out kernel (both directions
    # from one exp pair per token), with no (L, N, V) temporaries; otherwise in torch, every neighbour's law built
    if removals_through_kernel(teachers, rate):
        output, removal = leave_one_out_direction_divergences(teachers, public, lambdas, removed, orders, prepared)
        total = output * n           # within an ulp of the mixed teachers' sum
        point_masses, added = _added_neighbours(output, total, n, public, kind, params)
        token_divergence = torch.cat([removal, divergences(torch.log(output).unsqueeze(1), torch.log(added))], dim=2)
    else:
        mixed = lambdas.unsqueeze(-1) * teachers + (1 - lambdas.unsqueeze(-1)) * public.unsqueeze(-2)
        total = mixed.sum(dim=-2)
        output = ensemble_output(total, torch.full((length,), n), public, rate)
        point_masses, added = _added_neighbours(output, total, n, public, kind, params)
        # sums without each removed teacher, never total - mixed[i] (that cancels: see sums_without_each)
        removal_laws = ensemble_output(sums_without_each(mixed)[:, removed_t],
                                       torch.full((length, len(removed)), n - 1), public.unsqueeze(1), rate)
        token_divergence = divergences(torch.log(output).unsqueeze(1), torch.log(torch.cat([removal_laws, added], dim=1)))
    neighbour_sizes = torch.cat([torch.full((len(removed),), n - 1), torch.full((3,), n + 1)])
    if not (kind == "adapmixed" and params.get("screening", True)):
        return token_divergence, None, None
    # the screen reads the public model's top-k tokens only: the raw sums are formed on those columns
    top = screening_of(params).top_indices(public)                                            # (L, k)
    teachers_top = torch.gather(teachers, -1, top.unsqueeze(1).expand(-1, n, -1))              # (L, N, k)
    raw_total = teachers_top.sum(dim=-2)
    raw_neighbours = torch.cat([sums_without_each(teachers_top)[:, removed_t],
                                raw_total.unsqueeze(1) + torch.gather(point_masses, -1, top.unsqueeze(1).expand(-1, 3, -1))],
                               dim=1)
    sums = torch.cat([raw_total.unsqueeze(1), raw_neighbours], dim=1)
    sizes = torch.cat([torch.tensor([n]), neighbour_sizes]).expand(length, -1)
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    passes = screen_pass_counts_on_top(sums, sizes, torch.gather(public, -1, top), params, mc_samples,
                                       generator)                                             # (L, 1+E) counts
    low, high = clopper_pearson(passes.numpy(), mc_samples, confidence)
    halfwidth = float(np.max(high - low) / 2)
    pass_probability = smoothed_probability(passes, mc_samples)
    decision = torch.stack([pass_probability, 1 - pass_probability], dim=-1)              # (L, 1+E, 2)
    log_decision = torch.log(decision)
    decision_divergence = torch.stack([
        renyi_divergence_orders(log_decision[:, :1], log_decision[:, 1:], orders),
        renyi_divergence_orders(log_decision[:, 1:], log_decision[:, :1], orders)])       # (2, L, E, K)
    answered = (passed if passed is not None else torch.ones(length, dtype=torch.bool)).double()
    realised = decision_divergence + answered[None, :, None, None] * token_divergence
    released = released_pair_divergences(token_divergence, pass_probability, public, orders)
    return released, halfwidth, realised


def released_pair_divergences(token: torch.Tensor, pass_probability: torch.Tensor, public: torch.Tensor,
                              orders: torch.Tensor) -> torch.Tensor:
    """D_a in both directions between the laws of the released pair (decision, token) of the ensemble and of
    each neighbour, from the token laws' divergences and the pass probabilities: the pair's law is
    L = [pi p, (1 - pi) p0] over 2V outcomes, so its moment splits into the two halves,

        sum L^a L'^(1-a) = pi^a pi'^(1-a) exp((a - 1) D_a(p || p')) + (1 - pi)^a (1 - pi')^(1-a) sum_j p0_j

    (van Erven & Harremoes 2014, Definition 2, summed over the two halves). No second pass over the
    vocabulary: the token divergences (rounded up) give the first half. Rounded up: sum_j p0_j by the
    float sum's error bound (Higham 2002, Eq. 4.4: (V - 1) u of the sum, the terms being >= 0), every
    other sum by ROUNDING_ULPS of its terms' magnitudes.

    Args:
        token: (2, L, E, K) D_a(p || p_e) (forward) and D_a(p_e || p) (backward), rounded up.
        pass_probability: (L, 1 + E) the screen's pass probability, the ensemble's first, in [0, 1].
        public: (L, V) the public model's law p0.
        orders: (K,) the Renyi orders a > 1.

    Returns:
        (2, L, E, K) float64: the pair laws' D_a, forward and backward, in nats, rounded up.
    """
    a = orders.double()
    a_minus_1 = a - 1.0
    # float64 throughout: float32 logs of the pass probabilities would err far beyond the allowance
    token, pass_probability = token.double(), pass_probability.double()
    moments = token * a_minus_1 * (1.0 + 4.0 * ROUNDING_ULPS)      # (a - 1) D, never below the kernel's moment
    vocab = public.shape[-1]
    sum_error = (vocab - 1) * UNIT_ROUNDOFF / (1.0 - (vocab - 1) * UNIT_ROUNDOFF)
    log_mass = (torch.log(public.double().sum(dim=-1)) + 2.0 * sum_error)[:, None, None]       # >= log sum_j p0_j
    ours, theirs = pass_probability[:, :1, None], pass_probability[:, 1:, None]                # (L, 1, 1), (L, E, 1)
    halves = []
    for moment, (first, second) in zip(moments, ((ours, theirs), (theirs, ours))):
        terms = [a * torch.log(first), (1.0 - a) * torch.log(second), moment,
                 a * torch.log1p(-first), (1.0 - a) * torch.log1p(-second), log_mass]
        passed, failed = terms[0] + terms[1] + terms[2], terms[3] + terms[4] + terms[5]
        # a half without mass under the first law (pi = 0; for the failed half pi = 1) adds 0 at a > 1,
        # whatever the second law and the token divergence are, not 0 * inf
        passed = torch.where(first == 0.0, -torch.inf, passed)
        failed = torch.where(first == 1.0, -torch.inf, failed)
        total = torch.logaddexp(passed, failed)
        # the finite terms' rounding (an infinite one leaves the others' allowance due); +inf stays +inf
        magnitude = sum(torch.where(torch.isfinite(term), term.abs(), 0.0) for term in [*terms, total]) + 1.0
        allowance = ROUNDING_ULPS * magnitude
        halves.append(torch.clamp((total + allowance) / a_minus_1 * (1.0 + ROUNDING_ULPS), min=0.0))
    return torch.stack(halves)


def monte_carlo_seed(seed: int, first_step: int) -> int:
    """The seed of the screening Monte Carlo of the payload window starting at `first_step`: a window's
    draws depend on (audit seed, step) only, not on which windows were computed before it or where.

    Args:
        seed: the audit's seed.
        first_step: the window's first step.

    Returns:
        A seed in [0, 2^63), from sha256 of both.
    """
    digest = hashlib.sha256(f"dpledger-audit-screen-mc:{seed}:{first_step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class _AblationPartial(TypedDict):
    forward: np.ndarray           # (E, K) the window's forward divergences summed over its steps
    backward: np.ndarray          # (E, K)
    realised: np.ndarray | None   # (2, E, K) the realised-path divergences (screened mechanisms)
    halfwidth: float | None


def _ablation_window(trace: LoadedTrace, records: list[dict], logits: torch.Tensor, removed: list[int],
                     grid: tuple[float, ...], mc_samples: int, confidence: float, seed: int,
                     labels: list[str]) -> _AblationPartial:
    """One window's divergences summed over its steps, per direction and neighbour (ValueError, naming
    the step, where one is NaN)."""
    orders_t = torch.tensor(grid, dtype=torch.float64)
    generator = torch.Generator().manual_seed(monte_carlo_seed(seed, records[0]["step"]))
    divergences, halfwidth, realised = block_divergences(trace, records, logits, removed, orders_t, mc_samples,
                                                         generator, confidence)
    refused = [row for row, record in enumerate(records) if record.get("budget_refused")]
    if refused:  # the data-independent filter answered these publicly: the same public law under every neighbour
        divergences[:, refused] = 0.0
        if realised is not None:
            realised[:, refused] = 0.0
    nan = torch.nonzero(divergences.isnan())
    if len(nan):  # a NaN is an undefined divergence, not "infinite leakage": name where it appears
        direction, row, neighbour, order = nan[0].tolist()
        divergence = ("D(M(D) || M(D'))", "D(M(D') || M(D))")[direction]
        raise ValueError(f"neighbour ablation: {divergence} is NaN at step {records[row]['step']}, neighbour "
                         f"'{labels[neighbour]}', order {grid[order]:g} ({len(nan)} NaN entries in this block)")
    return {"forward": divergences[0].sum(dim=0).numpy(), "backward": divergences[1].sum(dim=0).numpy(),
            "realised": None if realised is None else realised.sum(dim=1).numpy(), "halfwidth": halfwidth}


def run_ablation(trace: LoadedTrace, delta: float, teachers_sample: int | None = None, mc_samples: int = 400,
                 confidence: float = 0.95, orders=DEFAULT_AUDIT_ORDERS, seed: int = 0) -> AblationResult:
    """Compose every neighbour's per-step divergences over the run (per direction), then convert on
    a subset of the claim's grid holding the claim's optimal orders (audit_orders).

    Args:
        trace: the loaded run; its per-step distributions are read window by window.
        delta: the delta to convert at.
        teachers_sample: how many teachers to remove (a sample seeded by `seed`); None or >= N: all.
        mc_samples: Monte Carlo draws per step for a screened run's pass probabilities.
        confidence: the Clopper-Pearson level of the reported halfwidth.
        orders: the orders requested of audit_orders.
        seed: seeds the teacher sample and the Monte Carlo.

    Returns:
        The AblationResult: removed teachers then the three add-one adversaries, each with its
        composed divergences per direction and its empirical epsilon at `delta`.
    """
    return trace.run_check(ablation_over_windows(trace, delta, teachers_sample, mc_samples, confidence, orders, seed))


def ablation_over_windows(trace: LoadedTrace, delta: float, teachers_sample: int | None = None, mc_samples: int = 400,
                          confidence: float = 0.95, orders=DEFAULT_AUDIT_ORDERS,
                          seed: int = 0) -> OverWindows[AblationResult]:
    """run_ablation written over windows (dpledger.audit.loader.OverWindows).

    Args:
        trace: the loaded run.
        delta: the delta to convert at.
        teachers_sample: how many teachers to remove (a sample seeded by `seed`); None or >= N: all.
        mc_samples: Monte Carlo draws per step for a screened run's pass probabilities.
        confidence: the Clopper-Pearson level of the reported halfwidth.
        orders: the orders requested of audit_orders.
        seed: seeds the teacher sample and the Monte Carlo.

    Returns:
        A generator that yields its window request and returns run_ablation's AblationResult.
    """
    n = trace.n_teachers
    removed = list(range(n))
    if teachers_sample is not None and teachers_sample < n:
        removed = sorted(np.random.default_rng(seed).choice(n, size=teachers_sample, replace=False).tolist())
    extra = [trace.params["alpha"]] if "alpha" in trace.params else []
    optimal = [e.get("order") for e in trace.ledger.get("epsilon", []) if isinstance(e, dict)]
    grid = audit_orders(trace.orders, [*optimal, *extra], orders)
    forward = np.zeros((len(removed) + 3, len(grid)))
    backward = np.zeros_like(forward)
    realised_totals: np.ndarray | None = None
    halfwidths: list[float] = []
    labels = [f"remove teacher {i}" for i in removed] + list(ADVERSARY_LABELS)
    for _, window in (yield from trace.windows(_ablation_window, removed, grid, mc_samples, confidence, seed, labels,
                                               desc="neighbour ablation")):
        forward += window["forward"]
        backward += window["backward"]
        if window["realised"] is not None:
            realised_totals = window["realised"] if realised_totals is None else realised_totals + window["realised"]
        if window["halfwidth"] is not None:
            halfwidths.append(window["halfwidth"])
    epsilons: list[float] = []
    best_orders: list[float | None] = []
    realised_epsilons: list[float] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in range(len(labels)):
            values = np.maximum(forward[row], backward[row])
            result = epsilon_from_rdp(RdpCurve(grid, values, NeighbouringRelation.ADD_OR_REMOVE_ONE, True), delta)
            epsilons.append(result.epsilon)
            best_orders.append(result.order)
            if realised_totals is not None:
                path = np.maximum(realised_totals[0, row], realised_totals[1, row])
                realised_epsilons.append(epsilon_from_rdp(RdpCurve(grid, path, NeighbouringRelation.ADD_OR_REMOVE_ONE,
                                                                   True), delta).epsilon)
    return AblationResult(labels, forward, backward, grid, np.asarray(epsilons), best_orders, delta,
                          max(halfwidths) if halfwidths else None, removed,
                          np.asarray(realised_epsilons) if realised_totals is not None else None)


class RelationEntry(TypedDict):
    """The ablation's worst tested neighbour of one relation (check_ablation's evidence["relations"])."""

    relation: str                 # the relation's label
    claimed: bool                 # the run claims this relation
    charged_for: bool             # the run's charges cover it
    worst_neighbour: str
    empirical_epsilon: float
    within_claim: bool
    ratio: float                  # empirical epsilon / claimed epsilon
    realised_path_epsilon: NotRequired[float]   # screened mechanisms only


PER_TEACHER_LABEL = ("per-teacher data-dependent accounting: each teacher's own per-step losses composed over the run, "
                     "the maximum over teachers taken at the end (individual privacy accounting, Feldman & Zrnic "
                     "2021), where the ledger composes the per-step maximum (Flemings et al. 2024, Eq. 3); like Eq. 3 "
                     "it depends on the private data: an ex-post statement about this run, not a DP guarantee")


def per_teacher_accounting(trace: LoadedTrace, result: AblationResult, relations: dict[str, RelationEntry],
                           claimed_relation: NeighbouringRelation, delta: float) -> dict:
    """max over teachers i of epsilon(max(sum_t D(p_t || p_t,-i), sum_t D(p_t,-i || p_t))) for the
    removed teachers (each direction composed on its own: exact laws of the unscreened, unsampled
    output, on the audit's orders, never below the full grid's value) where the claim removes a
    teacher, and the add-one bound's total where it adds one (that part is the ledger's composition
    of per-step worst cases, not one teacher's losses: `attained_by` says which part gives the
    maximum); beside it the same relation's total of the per-step maximum from ledger.json.
    {"reason": ...} where it does not apply.

    Args:
        trace: the loaded run (its mechanism, parameters and ledger.json).
        result: the ablation's result (which teachers were removed).
        relations: check_ablation's worst neighbour per relation.
        claimed_relation: the run's claimed relation.
        delta: the delta of the epsilons.

    Returns:
        {"epsilon", "delta", "relation", "parts", "attained_by", "composed_max_epsilon",
        "composed_max_total", "orders", "label"}, or {"reason": ...}.
    """
    if trace.mechanism_type not in ("pmixed", "adapmixed"):
        return {"reason": f"mechanism {trace.mechanism_type} has no per-teacher losses"}
    if trace.params.get("sample_rate") is not None or trace.params.get("screening"):
        return {"reason": "the removed teachers' laws here include the screen's Monte Carlo or the subsample: "
                          "per-teacher totals are computed for unscreened, unsampled runs only"}
    if len(result.sampled_teachers) < trace.n_teachers:
        return {"reason": f"only {len(result.sampled_teachers)} of {trace.n_teachers} teachers were removed: the "
                          "maximum over teachers would be incomplete"}
    parts = {"remove_one": relations["remove_one"]["empirical_epsilon"]} if "remove" in claimed_relation.moves else {}
    composed_key = "eq3_remove_one_total"
    if "add" in claimed_relation.moves:
        added = trace.ledger.get("add_one_bound_total")
        if not isinstance(added, dict) or not isinstance(added.get("epsilon"), (int, float)):
            return {"reason": "ledger.json has no add-one bound total (a version 1 trace, or a run that does not "
                              "compute it)"}
        parts["add_one"] = float(added["epsilon"])
        composed_key = "observed_data_dependent_total"
    composed = trace.ledger.get(composed_key)
    if not isinstance(composed, dict) or not isinstance(composed.get("epsilon"), (int, float)):
        why = (" (a run charged by Theorem 3.1 records no Eq. 3 since records_version 3: the theorem_3_1 check "
               "computes it)" if not trace_files.records_losses(trace.manifest.get("records_version", 1),
                                                                 trace.components) else "")
        return {"reason": f"ledger.json has no {composed_key} to compare with{why}"}
    epsilon = max(parts.values())
    return {"epsilon": epsilon, "delta": delta, "relation": claimed_relation.value, "parts": parts,
            "attained_by": max(parts, key=lambda name: parts[name]),
            "composed_max_epsilon": float(composed["epsilon"]), "composed_max_total": composed_key,
            "orders": "the audit's orders (a subset of the claim's grid)", "label": PER_TEACHER_LABEL}


def check_ablation(trace: LoadedTrace, teachers_sample: int | None = None, mc_samples: int = 400,
                   seed: int = 0) -> tuple[CheckResult, AblationResult | None]:
    """The empirical epsilon of every tested neighbour against the claim, per neighbouring relation.

    Neighbours are grouped by relation: removed teachers are remove-one, added adversaries add-one.
    The run's claimed relation (manifest "relation") decides the verdict: every tested neighbour of
    a claimed move must stay within the claimed epsilon, and the charges must cover the claim
    (check_relation_coverage says so separately). Every other tested relation is reported as covered
    or not, with its empirical epsilon, so that a PASS never stands above an unreported exceedance.
    For screened mechanisms the released output's law decides (what a privacy claim is about); the
    realised-path quantity is reported beside it and, for a realised-path ledger, compared with the
    claim like with like.

    Args:
        trace: the loaded run; its per-step distributions are read window by window.
        teachers_sample: how many teachers to remove (a seeded sample); None: all.
        mc_samples: Monte Carlo draws per step for a screened run's pass probabilities.
        seed: seeds the teacher sample and the Monte Carlo.

    Returns:
        (the "neighbour_ablation" CheckResult, the AblationResult or None where the ablation did not
        run): SKIPPED for the public model, without the per-step distributions, with a data-dependent
        filter or records that do not fit; FAIL without a claim to test or where a neighbour of a
        claimed move exceeds the claimed epsilon (relative slack 1e-6); else PASS.

    Raises:
        ValueError: if the claimed epsilon in ledger.json is NaN, or a divergence is NaN.
    """
    return trace.run_check(neighbour_ablation_over_windows(trace, teachers_sample, mc_samples, seed))


def neighbour_ablation_over_windows(trace: LoadedTrace, teachers_sample: int | None = None, mc_samples: int = 400,
                   seed: int = 0) -> OverWindows[tuple[CheckResult, AblationResult | None]]:
    """check_ablation written over windows (dpledger.audit.loader.OverWindows): what dpledger.audit.audit
    runs beside the other checks over one pass of the windows.

    Args:
        trace: the loaded run; its per-step distributions are read window by window.
        teachers_sample: how many teachers to remove (a seeded sample); None: all.
        mc_samples: Monte Carlo draws per step for a screened run's pass probabilities.
        seed: seeds the teacher sample and the Monte Carlo.

    Returns:
        A generator that yields its window request and returns check_ablation's pair.
    """
    if trace.mechanism_type == "public":
        return skipped("neighbour_ablation", "the public model alone does not read the teachers: every neighbour "
                       "gives the same output (empirical epsilon 0)"), None
    if not trace.has_payload:
        return skipped("neighbour_ablation", "needs the per-step distributions (the exact-replay payload or the "
                       "run's models)"), None
    if trace.data_dependent_filter:
        return skipped("neighbour_ablation", DATA_DEPENDENT_FILTER), None
    if trace.totals is None:
        return skipped("neighbour_ablation", "the records do not fit the manifest (see records)"), None
    delta = trace.manifest["config"]["deltas"][0]
    claimed = next((e.get("epsilon") for e in trace.ledger.get("epsilon", []) if isinstance(e, dict)
                    and e.get("method") == "improved" and e.get("delta") == delta), None)
    if not isinstance(claimed, (int, float)) or isinstance(claimed, bool):
        return failed("neighbour_ablation", f"ledger.json states no improved epsilon at the run's delta = {delta:g} "
                      f"(found {claimed!r}): there is no claim to test"), None
    require(not math.isnan(claimed), f"neighbour ablation: the claimed epsilon in ledger.json at delta={delta:g} is NaN")
    result = yield from ablation_over_windows(trace, delta, teachers_sample, mc_samples, seed=seed)
    claimed_relation = NeighbouringRelation(trace.manifest["relation"])
    covered_relation = trace.totals.ledger.total_relation
    accounting = trace.params.get("accounting")
    finite_claim = claimed > 0 and math.isfinite(claimed)

    def ratio_of(value: float) -> float:
        return float(value / claimed) if finite_claim else (0.0 if math.isinf(claimed) else math.inf)

    def within(value: float) -> bool:
        return bool(value <= claimed * (1 + 1e-6) + 1e-12)

    table = [{"neighbour": label, "relation": result.relation_of(i).value, "empirical_epsilon": float(eps),
              "order": order, "claimed": claimed_relation.covers(result.relation_of(i)),
              "ratio_to_claimed": float(eps / claimed) if finite_claim else None,
              **({"realised_path_epsilon": float(result.realised_path_epsilon[i])}
                 if result.realised_path_epsilon is not None else {})}
             for i, (label, eps, order) in enumerate(zip(result.labels, result.epsilon, result.order))]
    relations: dict[str, RelationEntry] = {}
    for relation in (NeighbouringRelation.REMOVE_ONE, NeighbouringRelation.ADD_ONE):
        rows = [i for i in range(len(result.labels)) if result.relation_of(i) is relation]
        worst_row = max(rows, key=lambda i: float(result.epsilon[i]))
        realised_path = result.realised_path_epsilon
        relations[relation.value] = {
            "relation": relation.label, "claimed": claimed_relation.covers(relation),
            "charged_for": covered_relation.covers(relation),
            "worst_neighbour": result.labels[worst_row], "empirical_epsilon": float(result.epsilon[worst_row]),
            "within_claim": within(result.epsilon[worst_row]), "ratio": ratio_of(result.epsilon[worst_row])}
        if realised_path is not None:
            relations[relation.value]["realised_path_epsilon"] = float(max(realised_path[i] for i in rows))
    claimed_rows = [key for key, entry in relations.items() if entry["claimed"]]
    worst_key = max(claimed_rows, key=lambda key: relations[key]["empirical_epsilon"])
    worst = relations[worst_key]
    exceeded = [relations[key] for key in claimed_rows if not relations[key]["within_claim"]]
    uncovered = [entry for key, entry in relations.items() if not entry["claimed"]]
    ok = not exceeded
    others = "; ".join(f"{e['relation']} not claimed: empirical {e['empirical_epsilon']:.4g} "
                       f"{'<=' if e['within_claim'] else '>'} {claimed:.4g} "
                       f"({'within' if e['within_claim'] else 'NOT COVERED'})" for e in uncovered)
    path_note = ""
    if result.realised_path_epsilon is not None:
        path_worst = max(relations[key]["realised_path_epsilon"] for key in claimed_rows)
        path_note = (f"; realised-path quantity (Theorem 4.2) {path_worst:.4g}"
                     + (" <= claim, like with like" if within(path_worst) else " > claim")
                     if accounting == "realised-path" else f"; realised-path quantity {path_worst:.4g} (reported only)")
    per_teacher = per_teacher_accounting(trace, result, relations, claimed_relation, delta)
    evidence = {"claimed_epsilon": claimed, "delta": delta, "claimed_relation": claimed_relation.value,
                "per_teacher": per_teacher,
                "covered_relation": covered_relation.value, "relations": relations,
                "worst_neighbour": worst["worst_neighbour"], "worst_empirical_epsilon": worst["empirical_epsilon"],
                "ratio": worst["ratio"], "per_neighbour": table,
                "measured_quantity": ("the released output's law: (screen decision, token) per step"
                                      if result.realised_path_epsilon is not None else "the output token's law per step"),
                "accounting": accounting,
                "claimed_neighbours": claimed_relation.label,
                "claimed_direction": trace.ledger.get("direction", "both"),
                "measured_direction": "both: max(D(M(D) || M(D')), D(M(D') || M(D))) per order",
                "unclaimed_worst": max(uncovered, key=lambda e: e["empirical_epsilon"]) if uncovered else None,
                "teachers_removed": result.sampled_teachers,
                "teacher_sampling": ("all teachers" if len(result.sampled_teachers) == trace.n_teachers else
                                     f"{len(result.sampled_teachers)} of {trace.n_teachers} teachers, seed {seed}"),
                "audit_orders": list(result.orders),
                "screen_probability_ci_halfwidth": result.screen_probability_halfwidth,
                "mc_samples": mc_samples if result.screen_probability_halfwidth is not None else None}
    if per_teacher.get("epsilon") is not None:
        attained = ("each removed teacher's losses composed, max at the end" if per_teacher["attained_by"] ==
                    "remove_one" else "attained by the add-one bound's total, a composition of per-step worst cases")
        path_note += (f"; per-teacher data-dependent epsilon {per_teacher['epsilon']:.4g} ({attained}) vs "
                      f"{per_teacher['composed_max_epsilon']:.4g} composing the per-step max (not DP guarantees: "
                      "they depend on the data)")
    realised_claim = ("; the claim is realised-path accounting (Flemings et al. 2024, Theorem 4.2 as stated), which "
                      "does not bound the released output (docs/soundness.md)") if accounting == "realised-path" else ""
    return verdict("neighbour_ablation", ok,
                   f"{claimed_relation.label} (claimed): every tested neighbour's empirical epsilon <= claimed "
                   f"{claimed:.4g}; worst: {worst['worst_neighbour']} ({worst['empirical_epsilon']:.4g}, ratio "
                   f"{worst['ratio']:.3g}){'; ' + others if others else ''}{path_note}",
                   f"{claimed_relation.label} (claimed): " + "; ".join(
                       f"{e['worst_neighbour']} reaches empirical epsilon {e['empirical_epsilon']:.4g} > claimed "
                       f"{claimed:.4g}" for e in exceeded) + realised_claim
                   + (f"; {others}" if others else "") + path_note,
                   **evidence), result
