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
from mechanisms.divergence import log_mean_with_one_exp

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


def max_divergence_symmetric(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """max(D_inf(P||Q), D_inf(Q||P)) with D_inf(P||Q) = log max_j P_j / Q_j over P's support
    (van Erven & Harremoes 2014, Theorem 6): shape broadcast(P, Q)[:-1]. +inf where one law has
    mass outside the other's support. Rounded up by a few ulps of the logs' magnitude."""
    p_zero, q_zero = torch.isneginf(log_p), torch.isneginf(log_q)
    # a token outside one law's support counts for the other direction only (log 0 - log 0 is masked)
    forward = torch.where(p_zero, -torch.inf, log_p - log_q)
    backward = torch.where(q_zero, -torch.inf, log_q - log_p)
    value = torch.maximum(forward.amax(dim=-1), backward.amax(dim=-1)).clamp_min(0.0)
    magnitude = (torch.where(p_zero, 0.0, log_p.abs()).amax(dim=-1)
                 + torch.where(q_zero, 0.0, log_q.abs()).amax(dim=-1) + 2.0)
    return torch.where(torch.isfinite(value), value + ROUNDING_ULPS * magnitude * 2.0, value)


def mixing_weights(teachers: torch.Tensor, public: torch.Tensor, order: float, radius: float,
                   max_iterations: int = 60, relative_tolerance: float = 1e-10) -> torch.Tensor:
    """Largest lambda in [0, 1] per teacher with D<->_order(lambda p_i + (1-lambda) p0, p0) <= radius.

    PMixED projection (Flemings et al. 2024, Algorithm 2 and Appendix C): the ball at one order.
    teachers: (..., N, V); public: (..., V). Returns lambdas (..., N) in float64.
    """
    return ball_mixing_weights(teachers, public, (order,), (radius,), None, max_iterations, relative_tolerance)


def ball_mixing_weights(teachers: torch.Tensor, public: torch.Tensor, orders, radii, max_radius: float | None = None,
                        max_iterations: int = 60, relative_tolerance: float = 1e-10) -> torch.Tensor:
    """Largest lambda in [0, 1] per teacher such that the mixed teacher lambda p_i + (1-lambda) p0
    satisfies D<->_k(., p0) <= radius_k at every order k of `orders` and, when `max_radius` is
    given, D<->_inf(., p0) <= max_radius.

    Each divergence is non-decreasing in lambda (quasi-convexity, van Erven & Harremoes 2014
    Theorem 13, with value 0 at lambda = 0), so the largest constraint excess is too, and its root
    is bracketed by [0, 1]. It is found by the Illinois variant of regula falsi (superlinear,
    bisection where the secant is undefined), for all teachers at once; only teachers infeasible at
    lambda = 1 are iterated. The returned value is always the feasible end of the bracket ("err on
    the small side"), within `relative_tolerance` * radius of the boundary, or within 1e-12 in lambda.

    teachers: (..., N, V); public: (..., V). Returns lambdas (..., N) in float64.
    """
    teachers = teachers.double()
    public = public.double()
    # aim 1e-12 inside the ball: the divergence of the mixed teacher, recomputed elsewhere from
    # rows renormalised to sum to 1, may differ from this evaluation by a few ulps
    radii_t = torch.tensor([float(r) * (1.0 - 1e-12) for r in radii], dtype=torch.float64, device=teachers.device)
    order_t = torch.tensor([float(o) for o in orders], dtype=torch.float64, device=teachers.device)
    max_radius = None if max_radius is None else float(max_radius) * (1.0 - 1e-12)
    smallest = min([float(radii_t.min())] + ([max_radius] if max_radius is not None else []))
    flat_teachers = teachers.reshape(-1, teachers.shape[-1])
    flat_public = public.unsqueeze(-2).expand(teachers.shape).reshape(-1, teachers.shape[-1])
    lambdas = torch.ones(flat_teachers.shape[0], dtype=torch.float64, device=teachers.device)

    def excess(p: torch.Tensor, q: torch.Tensor, log_q: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        mixed = lam.unsqueeze(-1) * p + (1.0 - lam.unsqueeze(-1)) * q
        log_mixed = _log(mixed)
        # the largest excess over the constraints: each is non-decreasing in lambda, so is their maximum
        worst = (symmetric_renyi_orders(log_mixed, log_q, order_t) - radii_t).amax(dim=-1)
        if max_radius is not None:
            worst = torch.maximum(worst, max_divergence_symmetric(log_mixed, log_q) - max_radius)
        return worst

    active = torch.nonzero(excess(flat_teachers, flat_public, _log(flat_public), lambdas) > 0).flatten()
    if active.numel() == 0:
        return lambdas.reshape(teachers.shape[:-1])
    p_active, q_active = flat_teachers[active], flat_public[active]   # gathered once
    log_q_active = _log(q_active)
    low = torch.zeros(active.numel(), dtype=torch.float64)
    high = torch.ones_like(low)
    true_low = torch.full_like(low, -smallest)          # f(low): the stopping test uses the true value
    weight_low, weight_high = true_low.clone(), excess(p_active, q_active, log_q_active, high)   # Illinois-weighted end values
    side = torch.zeros_like(low)
    for _ in range(max_iterations):
        done = (true_low >= -relative_tolerance * max(smallest, 1e-300)) | (high - low <= 1e-12)
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


def _knapsack_allocation(log_qmax: np.ndarray, log_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fractional-knapsack allocation of unit mass to tokens in decreasing order of log_t, each
    capped at qmax_j = exp(log_qmax_j): (log of each token's allocation, -inf where none; log_t in the
    same order). Rounded up: the mass placed is at least 1 (extra weight on the largest ratios only
    raises a bound built on it). A ball around a law has qmax_j >= p0_j, so the caps hold unit mass."""
    order = np.argsort(-log_t, axis=-1, kind="stable")
    caps = np.take_along_axis(np.exp(log_qmax), order, axis=-1)
    before = np.cumsum(caps, axis=-1) - caps
    allocation = np.minimum(caps, np.clip(1.0 - before, 0.0, None) * (1.0 + 4.0 * ROUNDING_ULPS * caps.shape[-1]))
    with np.errstate(divide="ignore"):
        return np.log(allocation), np.take_along_axis(log_t, order, axis=-1)


def _log_sum_exp(terms: np.ndarray) -> np.ndarray:
    """log(sum exp(terms)) over the last axis; -inf for all -inf, +inf as soon as one term is +inf."""
    shift = terms.max(axis=-1, keepdims=True)
    finite_shift = np.where(np.isfinite(shift), shift, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.log(np.exp(terms - finite_shift).sum(axis=-1)) + finite_shift[..., 0]
    return np.where(np.isposinf(shift[..., 0]), np.inf, value)


def add_one_divergence_bounds(output: torch.Tensor, public: torch.Tensor, teachers: int, orders: torch.Tensor,
                              alpha: float, radius: float, all_orders_beta: float | None = None) -> torch.Tensor:
    """Upper bound, per order k, on max(D_k(p_+ || p), D_k(p || p_+)) over every teacher an adversary
    can add: output (..., V) is p = mean of the N mixed teachers, public (..., V) is p0, and
    p_+ = (N p + q) / (N + 1) with q any law PMixED's projection can produce, i.e. any q in the ball
    B = {q : D<->_alpha(q, p0) <= radius} (q = lambda x + (1 - lambda) p0 lies in B whatever the
    added teacher x is, and every q in B is reachable with x = q). With `all_orders_beta` the ball
    also holds at every order (PMixED ball="all-orders"): D<->_k(q, p0) <= beta k for all k > 1.
    Returns (..., K). Derivation (each step's source in brackets):

    From the ball at order alpha, per token (each term of a sum is at most the sum), with
    R = exp((alpha-1) radius):
      q_j <= qmax_j = min(1, (R p0_j^(alpha-1))^(1/alpha))            [D_alpha(q || p0) <= radius]
      q_j >= qmin_j = (p0_j^alpha / R)^(1/(alpha-1))                   [D_alpha(p0 || q) <= radius]
    Forward, D_k(p_+ || p): (P, Q) -> sum_j P_j^k Q_j^(1-k) is jointly convex (perspective of x^k,
    as in the proof of Flemings et al. 2024, Theorem C.1), and (p_+, p) = N/(N+1) (p, p) + 1/(N+1) (q, p):
      exp((k-1) D_k(p_+ || p)) <= N/(N+1) + exp((k-1) D_k(q || p)) / (N+1),
    with D_k(q || p) <= U_k = min(U1_k, U2):
      U1_k = rho_k + max_j log(p0_j / p_j)     [q^k p^(1-k) = q^k p0^(1-k) (p0/p)^(k-1) termwise],
      rho_k >= D_k(q || p0): radius for k <= alpha (monotone in the order, van Erven & Harremoes
        2014, Theorem 3); ((alpha-1) radius + (k-alpha) log M) / (k-1) above, M = max_j qmax_j/p0_j
        [sum p0 (q/p0)^k <= M^(k-alpha) sum p0 (q/p0)^alpha]; and beta k with the all-orders ball;
      U2_k = log(sum_j qstar_j (qmax_j / p_j)^(k-1)) / (k-1): as q_j^k p_j^(1-k) = q_j (q_j/p_j)^(k-1)
        <= q_j (qmax_j/p_j)^(k-1), sum_j q_j^k p_j^(1-k) is at most the linear programme
        max {sum_j q_j c_j : 0 <= q_j <= qmax_j, sum_j q_j = 1}, c_j = (qmax_j/p_j)^(k-1), whose optimum
        (a fractional knapsack) fills tokens in decreasing order of qmax_j / p_j (the same order for
        every k) up to qmax_j until the mass reaches 1: that allocation is qstar.
    The forward bound is also min'ed with a direct one over the box {0 <= q_j <= qmax_j, sum q = 1},
    which contains the ball: sum_j p_j ((N + q_j/p_j)/(N+1))^k maximised through the chords of the
    convex summand and a fractional knapsack (the "chord" bound below); it is nearly exact for the box
    and much tighter than Jensen at low orders.
    Reverse, D_k(p || p_+): min(B1, B2_k) with
      B1 = log(1 + 1/N): p_+ >= N p / (N+1) termwise, so D_k <= D_inf(p || p_+) <= log((N+1)/N);
      B2_k = W_k / (N+1): D_k is convex in its second argument (ibid. Theorem 12) and
        D_k(p || p) = 0; W_k = log(sum_j p_j^k qmin_j^(1-k)) / (k-1) >= D_k(p || q) as 1-k < 0.
    Every value is rounded up (the Renyi kernel's slack, ROUNDING_ULPS on the rest).
    """
    output = output.detach().cpu().double()
    public = public.detach().cpu().double()
    orders_np = orders.detach().cpu().double().numpy().reshape(-1)
    n = float(teachers)
    log_p = _log(output).numpy()
    log_p0 = _log(public).numpy()
    on_public = np.isfinite(log_p0)
    log_r = (alpha - 1.0) * radius
    with np.errstate(invalid="ignore"):
        log_qmax = np.where(on_public, np.minimum(0.0, (log_r + (alpha - 1.0) * log_p0) / alpha), -np.inf)
        log_qmin = np.where(on_public, (alpha * log_p0 - log_r) / (alpha - 1.0), -np.inf)
        # tokens the public model never emits: every q in the ball is 0 there too (D_alpha(q||p0) finite)
        ratio_p0_p = np.where(on_public, log_p0 - log_p, -np.inf)          # +inf where p_j = 0 < p0_j
        log_m = np.where(on_public, log_qmax - log_p0, -np.inf).max(axis=-1)   # log M
        ratio_q_p = np.where(on_public, log_qmax - log_p, -np.inf)          # log(qmax_j / p_j)
    max_ratio = ratio_p0_p.max(axis=-1)
    slack = ROUNDING_ULPS * (np.abs(np.where(np.isfinite(log_p), log_p, 0.0)).max(axis=-1)
                             + np.abs(np.where(on_public, log_p0, 0.0)).max(axis=-1) + abs(log_r) + 4.0)
    orders_col = orders_np.reshape((1,) * max_ratio.ndim + (-1,))
    # One allocation serves U2 and the chord bound at every order: both fill tokens by decreasing
    # t_j = qmax_j / p_j (the chord's slope (phi_k(t) - phi_k(0)) / t grows with t, phi_k being convex).
    log_allocation, log_t = _knapsack_allocation(log_qmax, ratio_q_p)
    allocated = np.isfinite(log_allocation)[..., None, :]
    k = orders_np[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        above = ((alpha - 1.0) * radius + (orders_col - alpha) * log_m[..., None]) / (orders_col - 1.0)
        rho = np.where(orders_col <= alpha, radius, above)
        if all_orders_beta is not None:
            rho = np.minimum(rho, all_orders_beta * orders_col)
        u2 = _log_sum_exp(np.where(allocated, log_allocation[..., None, :] + (k - 1.0) * log_t[..., None, :],
                                   -np.inf)) / (orders_col - 1.0)
        u = np.minimum(rho + max_ratio[..., None], u2) + slack[..., None]
        jensen = log_mean_with_one_exp((orders_col - 1.0) * u, n + 1.0) / (orders_col - 1.0)
        # chord bound: c_j = p_j (phi_k(t_j) - phi_k(0)) / qmax_j = (phi_k(t_j) - phi_k(0)) / t_j, in logs
        log_phi0 = k[:, 0] * (np.log(n) - np.log(n + 1.0))
        log_phi = k * (np.logaddexp(np.log(n), log_t[..., None, :]) - np.log(n + 1.0))
        log_c = log_phi + np.log1p(-np.exp(log_phi0[:, None] - log_phi)) - log_t[..., None, :]
        log_c = np.where(np.isposinf(log_t)[..., None, :], np.inf, log_c)        # p_j = 0 < qmax_j
        chord_total = np.logaddexp(log_phi0, _log_sum_exp(np.where(allocated, log_allocation[..., None, :] + log_c,
                                                                   -np.inf)))
    magnitude = np.abs(np.where(np.isfinite(log_t), log_t, 0.0)).max(axis=-1)[..., None]
    chord = (chord_total + ROUNDING_ULPS * (np.abs(np.where(np.isfinite(chord_total), chord_total, 0.0))
                                            + orders_col * (magnitude + 4.0) + 2.0 * np.log2(log_t.shape[-1] + 1.0))
             ) / (orders_col - 1.0)
    forward = np.minimum(jensen, chord)
    w = renyi_divergence_orders(torch.from_numpy(log_p), torch.from_numpy(log_qmin), orders.cpu()).numpy()
    reverse = np.minimum(np.log1p(1.0 / n), w / (n + 1.0))
    bound = np.maximum(forward, reverse) * (1.0 + ROUNDING_ULPS)   # the last divisions' rounding
    if np.any(np.isnan(bound)):
        raise ValueError("add-one bound is NaN: an input distribution holds NaN or inf")
    return torch.from_numpy(bound)


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
