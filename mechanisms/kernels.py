"""Vectorised kernels (torch interfaces; the divergence's inner loop runs in numpy on the CPU):
log-space Renyi divergences, PMixED mixing weights, leave-one-out losses, coordinated votes.

All arithmetic is float64 in log space (float32 underflows at high orders): D_a(P||Q) is
1/(a-1) * logsumexp_j(log Q_j + a (log P_j - log Q_j)); P_j^a is never formed. Terms with
P_j = Q_j = 0 contribute 0; P_j > 0 = Q_j gives +inf (pitfall 9: never NaN -> 0).
"""
from __future__ import annotations

import os

import numpy as np
import torch

from accounting.rounding import ROUNDING_ULPS

_CHUNK_ELEMENTS = 1 << 16  # 512 KB of float64 per buffer: stays in cache


def _log(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x.clamp_min(0.0))


def kernel_threads() -> int:
    """Worker threads for the divergence kernel: $DPLEDGER_KERNEL_THREADS, default 1 (robust on
    shared 2-core machines; set 2 for long audits on an otherwise idle machine)."""
    return max(1, int(os.environ.get("DPLEDGER_KERNEL_THREADS", "1")))


def _row_source(shape: tuple[int, ...], batch_shape: tuple[int, ...], rows: np.ndarray) -> np.ndarray:
    """Row numbers, in an array of batch shape `shape` (broadcastable to batch_shape), of flat rows."""
    full = np.unravel_index(rows, batch_shape) if batch_shape else ()
    offset = len(batch_shape) - len(shape)
    own = [full[offset + axis] if size > 1 else np.zeros_like(rows) for axis, size in enumerate(shape)]
    return np.ravel_multi_index(own, shape) if shape else np.zeros_like(rows)


def renyi_divergence_orders(log_p: torch.Tensor, log_q: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
    """D_a(P||Q) for every order a in `orders` (shape (K,)): result shape broadcast(P, Q)[:-1] + (K,).

    van Erven & Harremoes 2014, Definition 2 (the Renyi divergence of order a > 1). The loop runs
    in numpy over cache-sized chunks of rows, gathered from the (broadcast) inputs without
    materialising the broadcast, in place on one buffer: on CPU ~5x faster than the same loop in
    torch. Tensors on another device are brought to the CPU.
    """
    device = log_p.device
    batch_shape = tuple(np.broadcast_shapes(tuple(log_p.shape[:-1]), tuple(log_q.shape[:-1])))
    vocab = log_p.shape[-1]
    if log_q.shape[-1] != vocab:
        raise ValueError(f"P and Q must share the vocabulary axis, got {vocab} and {log_q.shape[-1]}")
    lp = log_p.detach().cpu().double().numpy().reshape(-1, vocab)
    lq = log_q.detach().cpu().double().numpy().reshape(-1, vocab)
    orders_np = orders.detach().cpu().double().numpy().reshape(-1)
    rows = int(np.prod(batch_shape)) if batch_shape else 1
    result = np.empty((rows, orders_np.size))
    chunk = max(1, _CHUNK_ELEMENTS // vocab)
    p_shape, q_shape = tuple(log_p.shape[:-1]), tuple(log_q.shape[:-1])

    def run_chunks(starts: range) -> None:
        buffer = np.empty((min(chunk, rows), vocab))
        for start in starts:
            flat = np.arange(start, min(start + chunk, rows))
            chunk_p = lp[_row_source(p_shape, batch_shape, flat)]
            chunk_q = lq[_row_source(q_shape, batch_shape, flat)]
            p_zero, q_zero = np.isneginf(chunk_p), np.isneginf(chunk_q)
            with np.errstate(invalid="ignore"):
                # Terms with P_j = 0 contribute 0 (also when Q_j = 0: never -inf - -inf = NaN).
                ratio = np.where(p_zero, -np.inf, chunk_p - chunk_q)
            base = np.where(q_zero & ~p_zero, 0.0, chunk_q)
            # max_j |log P_j| + max_j |log Q_j| (+2 ulps for the rounding of the probabilities
            # themselves): the scale of every exponent's rounding error, per row
            magnitude = (np.abs(np.where(p_zero, 0.0, chunk_p)).max(axis=-1)
                         + np.abs(np.where(q_zero, 0.0, chunk_q)).max(axis=-1) + 2.0)
            work = buffer[:flat.size]
            for k, order in enumerate(orders_np):
                np.multiply(ratio, order, out=work)
                work += base                                    # log Q_j + a log(P_j / Q_j)
                shift = work.max(axis=-1, keepdims=True)
                shift[~np.isfinite(shift)] = 0.0
                work -= shift
                # exp below e^-700 relative to the largest term changes the sum by < 1e-299 relative,
                # and subnormal results take a slow microcode path on x86 (3x slower overall)
                np.maximum(work, -700.0, out=work)
                with np.errstate(over="ignore"):  # +inf only in rows with P_j > 0 = Q_j, set to inf below
                    np.exp(work, out=work)
                total = work.sum(axis=-1)
                log_sum = np.log(total) + shift[:, 0]
                # Rounded up by a bound on the floating-point error: each exponent a (log P - log Q)
                # + log Q is off by at most ~(a+1) ulps of `magnitude` (the logs of rounded,
                # renormalised probabilities are off by an ulp even near log 1 = 0); the sum and the
                # log add a few ulps. Without this, two different laws can come out at exactly 0
                # (D_2 of (1/2 + 2^-30, 1/2 - 2^-30) against uniform is 3.5e-18), and a zero makes
                # delta 0 at every epsilon. For LM-like rows (tails at 1e-30) it is ~3e-13 (a+1)/(a-1).
                slack = ROUNDING_ULPS * ((order + 1.0) * magnitude + np.log2(vocab) + 2.0 + np.abs(log_sum))
                result[flat, k] = (log_sum + slack) / (order - 1.0)
            result[flat[np.all(chunk_p == chunk_q, axis=-1)]] = 0.0     # identical laws: exactly 0
            result[flat[np.any(~p_zero & q_zero, axis=-1)]] = np.inf   # P has mass outside Q's support

    starts = range(0, rows, chunk)
    workers = min(kernel_threads(), len(starts))
    if workers <= 1:
        run_chunks(starts)
    else:  # numpy releases the GIL inside ufuncs, so threads over disjoint chunks run in parallel
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(run_chunks, [starts[i::workers] for i in range(workers)]))
    nan = np.isnan(result)
    if np.any(nan):  # a NaN input (e.g. a NaN logit) would otherwise pass np.maximum as NaN, or worse
        raise ValueError(f"Renyi divergence is NaN in row {int(np.argmax(nan.any(axis=-1)))}: an input "
                         "distribution holds NaN or inf")
    # Rounding can leave -1e-17 for identical inputs; divergences are >= 0 (Theorem 8, ibid.).
    np.maximum(result, 0.0, out=result)
    return torch.from_numpy(result.reshape(*batch_shape, orders_np.size)).to(device)


def symmetric_renyi_orders(log_p: torch.Tensor, log_q: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
    """max(D_a(P||Q), D_a(Q||P)) per order (the symmetric divergence of Flemings et al. 2024)."""
    return torch.maximum(renyi_divergence_orders(log_p, log_q, orders), renyi_divergence_orders(log_q, log_p, orders))


def mixing_weights(teachers: torch.Tensor, public: torch.Tensor, order: float, radius: float,
                   max_iterations: int = 60, relative_tolerance: float = 1e-10) -> torch.Tensor:
    """Largest lambda in [0, 1] per teacher with D<->_order(lambda p_i + (1-lambda) p0, p0) <= radius.

    PMixED projection (Flemings et al. 2024, Algorithm 2 and Appendix C). The
    divergence is non-decreasing in lambda (quasi-convexity, van Erven & Harremoes 2014 Theorem 13,
    with value 0 at lambda = 0), so the root of f(lambda) = D(lambda) - radius is bracketed by
    [0, 1] and found by the Illinois variant of regula falsi (superlinear, bisection where the secant
    is undefined), for all teachers at once; only teachers infeasible at lambda = 1 are iterated.
    The returned value is always the feasible end of the bracket ("err on the small side"), within
    `relative_tolerance` * radius of the boundary, or within 1e-12 in lambda.

    teachers: (..., N, V); public: (..., V). Returns lambdas (..., N) in float64.
    """
    teachers = teachers.double()
    public = public.double()
    # aim 1e-12 inside the ball: the divergence of the mixed teacher, recomputed elsewhere from
    # rows renormalised to sum to 1, may differ from this evaluation by a few ulps
    radius = radius * (1.0 - 1e-12)
    order_t = torch.tensor([order], dtype=torch.float64, device=teachers.device)
    flat_teachers = teachers.reshape(-1, teachers.shape[-1])
    flat_public = public.unsqueeze(-2).expand(teachers.shape).reshape(-1, teachers.shape[-1])
    lambdas = torch.ones(flat_teachers.shape[0], dtype=torch.float64, device=teachers.device)

    def excess(p: torch.Tensor, q: torch.Tensor, log_q: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        mixed = lam.unsqueeze(-1) * p + (1.0 - lam.unsqueeze(-1)) * q
        return symmetric_renyi_orders(_log(mixed), log_q, order_t)[..., 0] - radius

    active = torch.nonzero(excess(flat_teachers, flat_public, _log(flat_public), lambdas) > 0).flatten()
    if active.numel() == 0:
        return lambdas.reshape(teachers.shape[:-1])
    p_active, q_active = flat_teachers[active], flat_public[active]   # gathered once
    log_q_active = _log(q_active)
    low = torch.zeros(active.numel(), dtype=torch.float64)
    high = torch.ones_like(low)
    true_low = torch.full_like(low, -radius)            # f(low): the stopping test uses the true value
    weight_low, weight_high = true_low.clone(), excess(p_active, q_active, log_q_active, high)   # Illinois-weighted end values
    side = torch.zeros_like(low)
    for _ in range(max_iterations):
        done = (true_low >= -relative_tolerance * max(radius, 1e-300)) | (high - low <= 1e-12)
        if bool(done.all()):
            break
        secant = (low * weight_high - high * weight_low) / (weight_high - weight_low)
        usable = torch.isfinite(weight_high) & (secant > low) & (secant < high)
        trial = torch.where(usable, secant, 0.5 * (low + high))
        f_trial = excess(p_active, q_active, log_q_active, trial)
        feasible = (f_trial <= 0) & ~done
        infeasible = (f_trial > 0) & ~done
        # Illinois: halve the stale end's weight when the same end moves twice, so both ends converge
        weight_high = torch.where(feasible & (side < 0), 0.5 * weight_high, weight_high)
        weight_low = torch.where(infeasible & (side > 0), 0.5 * weight_low, weight_low)
        low, true_low = torch.where(feasible, trial, low), torch.where(feasible, f_trial, true_low)
        weight_low = torch.where(feasible, f_trial, weight_low)
        high, weight_high = torch.where(infeasible, trial, high), torch.where(infeasible, f_trial, weight_high)
        side = torch.where(feasible, -1.0, torch.where(infeasible, 1.0, side))
    lambdas[active] = low
    return lambdas.reshape(teachers.shape[:-1])


def mixed_teachers(teachers: torch.Tensor, public: torch.Tensor, lambdas: torch.Tensor) -> torch.Tensor:
    """pbar_i = lambda_i p_i + (1 - lambda_i) p0, shape (..., N, V)."""
    lam = lambdas.double().unsqueeze(-1)
    return lam * teachers.double() + (1.0 - lam) * public.double().unsqueeze(-2)


def sums_without_each(values: torch.Tensor) -> torch.Tensor:
    """sum_{j != i} values[..., j, :] for every i along axis -2: shape (..., N, V).

    Formed from exclusive prefix and suffix sums, so no term is ever subtracted: `total - values[i]`
    loses every digit when teacher i holds almost all of a token's mass (1 - 0.9999999999999999),
    which under-stated Eq. 3 (33.96 against 34.58 for teachers (0.5, 0.5) and (1 - 1e-16, 6e-17)).
    All terms are non-negative, so the sums are accurate to N ulps relative.
    """
    zeros = torch.zeros_like(values[..., :1, :])
    before = torch.cat([zeros, torch.cumsum(values[..., :-1, :], dim=-2)], dim=-2)
    after = torch.flip(torch.cat([zeros, torch.cumsum(torch.flip(values, dims=(-2,))[..., :-1, :], dim=-2)], dim=-2),
                       dims=(-2,))
    return before + after


def leave_one_out_divergences(mixed: torch.Tensor, orders: torch.Tensor, mask: torch.Tensor | None = None,
                              public: torch.Tensor | None = None) -> torch.Tensor:
    """D<->_a(p, p_{-i}) for every teacher i and order a: shape (..., N, K).

    p = mean_i pbar_i and p_{-i} = sum_{j != i} pbar_j / (N - 1) (Flemings et al. 2024, Eq. 3),
    summed without subtraction (`sums_without_each`). The other teachers' lambdas do not change
    when i is removed (each depends on p_i and p0 only).
    With `mask` (..., N), only the masked (e.g. Poisson-sampled) teachers form the ensemble:
    removing an unsampled teacher changes nothing (divergence 0), and removing the only sampled
    teacher leaves the public model `public` (..., V), PMixED's answer for an empty ensemble.
    """
    n = mixed.shape[-2]
    if mask is None:
        if n < 2:
            raise ValueError(f"leave-one-out needs an ensemble of at least 2 teachers, got {n}")
        output = mixed.sum(dim=-2, keepdim=True) / n
        without = sums_without_each(mixed) / (n - 1)
        divergences = symmetric_renyi_orders(_log(output), _log(without), orders)
        # all mixed teachers equal (e.g. every lambda 0): every neighbour's law is the same, exactly
        # 0, although sum/N and sum/(N-1) can differ in the last ulp and draw the rounding-up
        identical = (mixed == mixed[..., :1, :]).all(dim=-1).all(dim=-1)
        return torch.where(identical[..., None, None], torch.zeros_like(divergences), divergences)
    if public is None:
        raise ValueError("a masked leave-one-out needs the public distribution for empty ensembles")
    weights = mask.double().unsqueeze(-1)
    size = weights.sum(dim=-2, keepdim=True)
    total = (weights * mixed).sum(dim=-2, keepdim=True)
    output = torch.where(size > 0, total / size.clamp_min(1.0), public.double().unsqueeze(-2))
    without = sums_without_each(weights * mixed) / (size - 1.0).clamp_min(1.0)
    without = torch.where(size == 1, public.double().unsqueeze(-2).expand_as(mixed), without)
    divergences = symmetric_renyi_orders(_log(output), _log(without), orders)
    # every mixed teacher equal to the public model: each neighbour's law is the public model
    identical = (mixed == public.double().unsqueeze(-2)).all(dim=-1).all(dim=-1)
    zero = ~mask.unsqueeze(-1) | identical[..., None, None]
    return torch.where(zero, torch.zeros_like(divergences), divergences)


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
