"""Bound checks: the theorems as assertions, per step (SPEC section 7)."""
from __future__ import annotations

import numpy as np
import torch

from audit.checks import CheckResult, passed, skipped, verdict
from audit.loader import LoadedTrace
from decoding.ensemble import Ensemble
from mechanisms.kernels import leave_one_out_divergences, mixed_teachers, symmetric_renyi_orders
from mechanisms.screening import NoisyScreening

BALL_TOLERANCE = 1e-9
"""Slack on D<->(mixed, public) <= beta*alpha: the solver keeps the feasible end of its bracket."""


def _uses_pmixed(trace: LoadedTrace) -> bool:
    return trace.mechanism_type in ("pmixed", "adapmixed")


def _recorded_lambdas(records: list[dict]) -> torch.Tensor:
    return torch.tensor([r["lambdas"] for r in records], dtype=torch.float64)


def check_mixing_ball(trace: LoadedTrace) -> CheckResult:
    """Every mixed teacher lambda p_i + (1-lambda) p0 lies in the Renyi ball of radius beta*alpha
    (seed Algorithm 2), using the recorded lambdas and the replayed distributions."""
    if not _uses_pmixed(trace):
        return skipped("mixing_ball", f"mechanism {trace.mechanism_type} mixes no teachers")
    if not trace.has_payload:
        return skipped("mixing_ball", "needs the exact-replay payload")
    alpha, radius = trace.params["alpha"], trace.params["alpha"] * trace.params["beta"]
    order = torch.tensor([alpha], dtype=torch.float64)
    worst, outside = 0.0, []
    for _, records, logits in trace.iter_payload():
        public, teachers = Ensemble.split_distributions(logits)
        mixed = mixed_teachers(teachers, public, _recorded_lambdas(records))
        divergence = symmetric_renyi_orders(torch.log(mixed), torch.log(public).unsqueeze(-2), order)[..., 0]
        worst = max(worst, float(divergence.max()))
        for row, teacher in zip(*np.nonzero(divergence.numpy() > radius * (1 + BALL_TOLERANCE) + 1e-12)):
            outside.append(f"step {records[row]['step']} teacher {teacher}: D<-> = {float(divergence[row, teacher]):.6g}")
    return verdict("mixing_ball", not outside,
                   f"every mixed teacher is within the ball: max D<->_{alpha:g} = {worst:.6g} <= {radius:g}",
                   f"{len(outside)} mixed teachers leave the ball of radius {radius:g}: " + "; ".join(outside[:5]),
                   max_divergence=worst, radius=radius, outside=len(outside))


def check_screening_cost(trace: LoadedTrace) -> CheckResult:
    """Each step's screening charge equals (lam / (N sigma))^2 * alpha' at every order (seed Thm 4.1)."""
    if "screen" not in trace.components:
        return skipped("screening_cost", "the run has no screening step")
    p = trace.params
    expected = NoisyScreening(teachers=trace.n_teachers, lam=p["lam"], sigma=p["sigma"], alpha=p["alpha"]).rdp_values(trace.orders)
    charged = np.asarray([r["rdp_screen"] for r in trace.records])
    ratio = charged / expected
    ok = bool(np.allclose(charged, expected, rtol=1e-12, atol=0))
    return verdict("screening_cost", ok, f"all {len(charged)} screening charges equal (lam/(N sigma))^2 * order",
                   f"screening charges differ from (lam/(N sigma))^2 * order: charged/formula ranges "
                   f"{ratio.min():.4g}..{ratio.max():.4g} (a wrong sensitivity or ensemble size, pitfall 8)",
                   ratio_min=float(ratio.min()), ratio_max=float(ratio.max()))


def check_data_dependent_charge(trace: LoadedTrace) -> CheckResult:
    """The charged data-dependent loss equals seed Eq. 3, max_i max(D(p||p_-i), D(p_-i||p)), on every
    step that was answered by PMixED (both directions: pitfall of a one-direction loss)."""
    if "pmixed_data_dependent" not in trace.components:
        return skipped("data_dependent_eq3", "the run charges no data-dependent loss")
    if not trace.has_payload:
        return skipped("data_dependent_eq3", "needs the exact-replay payload")
    orders = torch.from_numpy(trace.orders)
    worst, under = 0.0, []
    for _, records, logits in trace.iter_payload():
        public, teachers = Ensemble.split_distributions(logits)
        mixed = mixed_teachers(teachers, public, _recorded_lambdas(records))
        expected = leave_one_out_divergences(mixed, orders).max(dim=-2).values.numpy()
        charged = np.asarray([r["rdp_pmixed_data_dependent"] for r in records])
        answered = np.asarray([r["screen_passed"] for r in records])
        gap = np.where(answered[:, None], (expected - charged) / np.maximum(expected, 1e-300), 0.0)
        worst = max(worst, float(np.max(gap)))
        for row in np.nonzero(np.any(gap > 1e-9, axis=1))[0]:
            under.append(f"step {records[row]['step']}: charged {charged[row].max():.6g} < Eq. 3 {expected[row].max():.6g}")
    return verdict("data_dependent_eq3", not under, "every answered step is charged at least seed Eq. 3 in both directions",
                   f"{len(under)} steps are charged less than seed Eq. 3: " + "; ".join(under[:5]),
                   worst_relative_shortfall=worst, undercharged_steps=len(under))


def check_theorem_3_1(trace: LoadedTrace) -> CheckResult:
    """Steps where the data-dependent loss exceeds Theorem 3.1 (not guaranteed, SPEC section 3) are
    counted; the run fails only where it charged Theorem 3.1 at such a step."""
    if not _uses_pmixed(trace):
        return skipped("theorem_3_1", f"mechanism {trace.mechanism_type} makes no Theorem 3.1 claim")
    alpha = trace.params["alpha"]
    within = trace.orders <= alpha + 1e-12
    observed = np.asarray([r["observed_data_dependent"] for r in trace.records])[:, within]
    bound = np.asarray([r["data_independent"] for r in trace.records])[:, within]
    exceeds = np.any(observed > bound * (1 + 1e-9), axis=1)
    charged_names = [n for n in trace.components if n.startswith("pmixed_theorem_3_1") or n.startswith("pmixed_subsampled")]
    charged_there = [int(r["step"]) for r, e in zip(trace.records, exceeds)
                     if e and any(np.any(np.asarray(r[f"rdp_{n}"]) > 0) for n in charged_names)]
    ratio = float(np.max(observed / np.maximum(bound, 1e-300)))
    return verdict("theorem_3_1", not charged_there,
                   f"{int(exceeds.sum())} of {len(exceeds)} steps have a data-dependent loss above Theorem 3.1's "
                   f"value (max ratio {ratio:.3g}); none of them was charged Theorem 3.1",
                   f"{len(charged_there)} steps were charged Theorem 3.1 although their data-dependent loss exceeds it "
                   f"(first: {charged_there[:5]}); Theorem 3.1 is not guaranteed (SPEC section 3)",
                   exceeding_steps=int(exceeds.sum()), charged_exceeding_steps=len(charged_there), max_ratio=ratio)


def check_utility_bound(trace: LoadedTrace) -> CheckResult:
    """seed Theorem 4.3: NLL(lambda) - NLL(all lambda = 1) <= max_t max_j (1 - lambda_jt) log(p_j(x_t) / p0(x_t)),
    on the recorded teacher-forced steps with the recorded lambdas."""
    if not _uses_pmixed(trace):
        return skipped("utility_theorem_4_3", f"mechanism {trace.mechanism_type} has no mixing weights")
    if trace.manifest["data"]["stream"] != "teacher-forced" or not trace.has_payload:
        return skipped("utility_theorem_4_3", "needs teacher-forced steps and the exact-replay payload")
    nll_mixed, nll_ensemble, right = [], [], -np.inf
    for _, records, logits in trace.iter_payload():
        public, teachers = Ensemble.split_distributions(logits)
        lambdas = _recorded_lambdas(records)
        target = torch.tensor([r["true_token"] for r in records])
        rows = torch.arange(len(records))
        p_true = teachers[rows, :, target]  # (L, N): each teacher's probability of the true token
        p0_true = public[rows, target]
        mixed_true = lambdas * p_true + (1 - lambdas) * p0_true[:, None]
        nll_mixed.append(-torch.log(mixed_true.mean(dim=1)))
        nll_ensemble.append(-torch.log(p_true.mean(dim=1)))
        right = max(right, float(((1 - lambdas) * torch.log(p_true / p0_true[:, None])).max()))
    gap = float(torch.cat(nll_mixed).mean() - torch.cat(nll_ensemble).mean())
    return verdict("utility_theorem_4_3", gap <= right + 1e-9,
                   f"NLL gap to the all-lambda=1 ensemble {gap:.4g} <= Theorem 4.3's bound {right:.4g}",
                   f"NLL gap {gap:.4g} exceeds Theorem 4.3's bound {right:.4g}: recorded lambdas are inconsistent",
                   nll_gap=gap, bound=right)
