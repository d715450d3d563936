"""Vectorised torch kernels: log-space Renyi divergences, PMixED mixing weights, leave-one-out losses.

All arithmetic is float64 in log space (SPEC section 1; pitfall 10): D_a(P||Q) is
1/(a-1) * logsumexp_j(log Q_j + a (log P_j - log Q_j)); P_j^a is never formed. Terms with
P_j = Q_j = 0 contribute 0; P_j > 0 = Q_j gives +inf (pitfall 9: never NaN -> 0).
"""
from __future__ import annotations

import torch

_CHUNK_ELEMENTS = 1 << 20  # 8 MB of float64 per pass: large buffers made the kernel memory-bound (3.5x slower)


def _log(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x.clamp_min(0.0))


def renyi_divergence_orders(log_p: torch.Tensor, log_q: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
    """D_a(P||Q) for every order a in `orders` (shape (K,)): result shape broadcast(P, Q)[:-1] + (K,).

    van Erven & Harremoes 2014, Definition 2 (the Renyi divergence of order a > 1).
    """
    log_p, log_q = torch.broadcast_tensors(log_p.double(), log_q.double())
    p_zero = torch.isneginf(log_p)
    q_zero = torch.isneginf(log_q)
    # Where both are zero the term is 0 (contributes nothing); avoid -inf - -inf = NaN.
    log_ratio = torch.where(p_zero, torch.full_like(log_p, -torch.inf), log_p - log_q)
    log_ratio = torch.where(p_zero & q_zero, torch.full_like(log_p, -torch.inf), log_ratio)
    safe_log_q = torch.where(q_zero & ~p_zero, torch.zeros_like(log_q), log_q)
    support_violation = torch.any(~p_zero & q_zero, dim=-1)
    orders = orders.double().to(log_p.device)
    batch_elements = max(1, log_p.numel())
    chunk = max(1, _CHUNK_ELEMENTS // batch_elements)
    results = []
    for start in range(0, orders.numel(), chunk):
        block = orders[start:start + chunk]
        terms = safe_log_q.unsqueeze(-2) + block.view(-1, 1) * log_ratio.unsqueeze(-2)
        results.append(torch.logsumexp(terms, dim=-1) / (block - 1.0))
    divergence = torch.cat(results, dim=-1)
    divergence = torch.where(support_violation.unsqueeze(-1), torch.full_like(divergence, torch.inf), divergence)
    # Rounding can leave -1e-17 for identical inputs; divergences are >= 0 (Theorem 8, ibid.).
    return divergence.clamp_min(0.0)


def symmetric_renyi_orders(log_p: torch.Tensor, log_q: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
    """max(D_a(P||Q), D_a(Q||P)) per order (seed Definition of D<->, SPEC section 1)."""
    return torch.maximum(renyi_divergence_orders(log_p, log_q, orders), renyi_divergence_orders(log_q, log_p, orders))


def mixing_weights(teachers: torch.Tensor, public: torch.Tensor, order: float, radius: float,
                   iterations: int = 40) -> torch.Tensor:
    """Largest lambda in [0, 1] per teacher with D<->_order(lambda p_i + (1-lambda) p0, p0) <= radius.

    PMixED projection (Flemings et al. 2024, Algorithm 2; seed Algorithm 2 / Appendix C). The
    divergence is non-decreasing in lambda (quasi-convexity, van Erven & Harremoes 2014 Theorem 13,
    with value 0 at lambda = 0), so bisection over all teachers at once; the returned value is the
    lower end of the final bracket, hence always feasible ("err on the small side").

    teachers: (..., N, V); public: (..., V). Returns lambdas (..., N) in float64.
    """
    teachers = teachers.double()
    public = public.double().unsqueeze(-2)
    order_t = torch.tensor([order], dtype=torch.float64, device=teachers.device)
    log_public = _log(public)

    def divergence_at(lam: torch.Tensor) -> torch.Tensor:
        mixed = lam.unsqueeze(-1) * teachers + (1.0 - lam.unsqueeze(-1)) * public
        return symmetric_renyi_orders(_log(mixed), log_public, order_t)[..., 0]

    ones = torch.ones(teachers.shape[:-1], dtype=torch.float64, device=teachers.device)
    feasible_at_one = divergence_at(ones) <= radius
    low = torch.where(feasible_at_one, ones, torch.zeros_like(ones))
    high = ones.clone()
    if bool(feasible_at_one.all()):
        return low
    for _ in range(iterations):
        mid = 0.5 * (low + high)
        ok = divergence_at(mid) <= radius
        low = torch.where(ok, mid, low)  # teachers feasible at 1 have low = high = mid = 1
        high = torch.where(ok, high, mid)
    return low


def mixed_teachers(teachers: torch.Tensor, public: torch.Tensor, lambdas: torch.Tensor) -> torch.Tensor:
    """pbar_i = lambda_i p_i + (1 - lambda_i) p0, shape (..., N, V)."""
    lam = lambdas.double().unsqueeze(-1)
    return lam * teachers.double() + (1.0 - lam) * public.double().unsqueeze(-2)


def leave_one_out_divergences(mixed: torch.Tensor, orders: torch.Tensor, mask: torch.Tensor | None = None,
                              public: torch.Tensor | None = None) -> torch.Tensor:
    """D<->_a(p, p_{-i}) for every teacher i and order a: shape (..., N, K).

    p = mean_i pbar_i and p_{-i} = (N p - pbar_i) / (N - 1) (seed Eq. 3). The other teachers'
    lambdas do not change when i is removed (each depends on p_i and p0 only).
    With `mask` (..., N), only the masked (e.g. Poisson-sampled) teachers form the ensemble:
    removing an unsampled teacher changes nothing (divergence 0), and removing the only sampled
    teacher leaves the public model `public` (..., V), PMixED's answer for an empty ensemble.
    """
    n = mixed.shape[-2]
    if mask is None:
        if n < 2:
            raise ValueError(f"leave-one-out needs an ensemble of at least 2 teachers, got {n}")
        total = mixed.sum(dim=-2, keepdim=True)
        output = total / n
        without = ((total - mixed) / (n - 1)).clamp_min(0.0)
        return symmetric_renyi_orders(_log(output), _log(without), orders)
    if public is None:
        raise ValueError("a masked leave-one-out needs the public distribution for empty ensembles")
    weights = mask.double().unsqueeze(-1)
    size = weights.sum(dim=-2, keepdim=True)
    total = (weights * mixed).sum(dim=-2, keepdim=True)
    output = torch.where(size > 0, total / size.clamp_min(1.0), public.double().unsqueeze(-2))
    without = ((total - mixed) / (size - 1.0).clamp_min(1.0)).clamp_min(0.0)
    without = torch.where(size == 1, public.double().unsqueeze(-2).expand_as(mixed), without)
    divergences = symmetric_renyi_orders(_log(output), _log(without), orders)
    return torch.where(mask.unsqueeze(-1), divergences, torch.zeros_like(divergences))


def coordinated_votes(teachers: torch.Tensor, generator: torch.Generator | None = None,
                      log_uniform_exp: torch.Tensor | None = None) -> torch.Tensor:
    """Hot PATE coordinated votes: y_i = argmax_j p_i[j] / u_j with one shared u_j ~ Exp(1).

    Hot PATE (Cohen et al. 2023), coordinated ensembles: the shared exponential draws make each
    vote's marginal exactly p_i (exponential race) while teachers that agree on the support vote
    alike. teachers: (..., N, V); returns votes (..., N) as token indices. `log_uniform_exp` may
    pass log u explicitly (shape (..., V)) for replay.
    """
    if log_uniform_exp is None:
        shape = teachers.shape[:-2] + teachers.shape[-1:]
        exp_draws = torch.empty(shape, dtype=torch.float64, device=teachers.device).exponential_(generator=generator)
        log_uniform_exp = torch.log(exp_draws)
    scores = _log(teachers.double()) - log_uniform_exp.unsqueeze(-2)
    return torch.argmax(scores, dim=-1)
