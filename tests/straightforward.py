"""Straightforward references the fused kernels are held to: the numpy implementations dpledger
used before its fused kernels (one numpy pass per operation, C-library exp and log), kept here
unchanged apart from names. They share the formulas, not the code, with mechanisms/fused.py."""
from __future__ import annotations

import numpy as np
import torch

from dpledger.accounting.rounding import ROUNDING_ULPS
from dpledger.mechanisms.kernels import _SLACK_ULPS as SLACK_ULPS
from dpledger.mechanisms.kernels import _divergences_from_moments as divergences_from_moments
from dpledger.mechanisms.leave_one_out import _seed_indices as seed_indices
from dpledger.mechanisms.log_space import log_mean_with_one_exp

_CHUNK_ELEMENTS = 1 << 16


def _log(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x.clamp_min(0.0))


def _row_source(shape: tuple[int, ...], batch_shape: tuple[int, ...], rows: np.ndarray) -> np.ndarray:
    """Row numbers, in an array of batch shape `shape` (broadcastable to batch_shape), of flat rows."""
    full = np.unravel_index(rows, batch_shape) if batch_shape else ()
    offset = len(batch_shape) - len(shape)
    own = [full[offset + axis] if size > 1 else np.zeros_like(rows) for axis, size in enumerate(shape)]
    return np.ravel_multi_index(own, shape) if shape else np.zeros_like(rows)


def reference_renyi_orders(log_p: torch.Tensor, log_q: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
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
                slack = (ROUNDING_ULPS * ((order + 1.0) * magnitude + np.log2(vocab) + 2.0 + np.abs(log_sum))
                         + (vocab + 2.0) * 2.0 ** -53)   # the V-term sum's worst case in any order
                result[flat, k] = (log_sum + slack) / (order - 1.0)
            result[flat[np.all(chunk_p == chunk_q, axis=-1)]] = 0.0     # identical laws: exactly 0
            result[flat[np.any(~p_zero & q_zero, axis=-1)]] = np.inf   # P has mass outside Q's support

    run_chunks(range(0, rows, chunk))
    nan = np.isnan(result)
    if np.any(nan):  # a NaN input (e.g. a NaN logit) would otherwise pass np.maximum as NaN, or worse
        raise ValueError(f"Renyi divergence is NaN in row {int(np.argmax(nan.any(axis=-1)))}: an input "
                         "distribution holds NaN or inf")
    # Rounding can leave -1e-17 for identical inputs; divergences are >= 0 (Theorem 8, ibid.).
    np.maximum(result, 0.0, out=result)
    return torch.from_numpy(result.reshape(*batch_shape, orders_np.size)).to(device)


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


def reference_add_one_bounds(output: torch.Tensor, public: torch.Tensor, teachers: int, orders: torch.Tensor,
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
        u2_moment = _log_sum_exp(np.where(allocated, log_allocation[..., None, :] + (k - 1.0) * log_t[..., None, :],
                                          -np.inf))
        # the moment's own rounding (its exponents and the log of its sum), not proportional to k - 1
        u2_allowance = ROUNDING_ULPS * (
            np.abs(np.where(np.isfinite(u2_moment), u2_moment, 0.0))
            + np.abs(np.where(np.isfinite(log_allocation), log_allocation, 0.0)).max(axis=-1)[..., None]
            + (orders_col - 1.0) * (np.abs(np.where(np.isfinite(log_t), log_t, 0.0)).max(axis=-1)[..., None] + 4.0)
            + 2.0 * np.log2(log_t.shape[-1] + 1.0))
        u2 = (u2_moment + u2_allowance) / (orders_col - 1.0)
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
    # a float law p summing above 1 may give the chord sum a negative weight of at most that excess
    mass_excess = np.maximum(output.numpy().sum(axis=-1) * (1.0 + log_p.shape[-1] * 2.0 ** -53) - 1.0, 0.0)[..., None]
    chord = (chord_total + ROUNDING_ULPS * (np.abs(np.where(np.isfinite(chord_total), chord_total, 0.0))
                                            + orders_col * (magnitude + 4.0) + 2.0 * np.log2(log_t.shape[-1] + 1.0))
             + 2.0 * mass_excess) / (orders_col - 1.0)
    forward = np.minimum(jensen, chord)
    w = reference_renyi_orders(torch.from_numpy(log_p), torch.from_numpy(log_qmin), orders.cpu()).numpy()
    reverse = np.minimum(np.log1p(1.0 / n), w / (n + 1.0))
    bound = np.maximum(forward, reverse) * (1.0 + ROUNDING_ULPS)   # the last divisions' rounding
    if np.any(np.isnan(bound)):
        raise ValueError("add-one bound is NaN: an input distribution holds NaN or inf")
    return torch.from_numpy(bound)


def reference_refined_curve(ratios, n: int, grid: np.ndarray, tolerance: float) -> tuple[np.ndarray, np.ndarray]:
    """The sub-grid refinement of one step's Eq. 3 curve as dpledger ran it in numpy before it was
    compiled (dpledger.mechanisms.fused.refinement_round): (D values (K,), exact mask (K,)),
    from a dpledger.mechanisms.kernels._LeaveOneOut's moments."""
    size = grid.size
    upper = np.full((n, size), np.nan)        # g_i at evaluated orders, or its chord (an upper bound)
    slope = np.full((n, size), np.nan)        # g_i' where g_i was evaluated there
    done = np.zeros(size, dtype=bool)
    seeds = np.asarray(seed_indices(grid))
    upper[:, seeds], slope[:, seeds] = ratios.moments(np.arange(n), grid[seeds])   # each row read once
    done[seeds] = True
    if np.isinf(upper[:, done]).any():          # mass outside a neighbour's support: infinite at every order
        return np.full(size, np.inf), done.copy()
    while not done.all():                        # (a grid of one to four orders is all seeds)
        anchors = np.flatnonzero(done)
        chords, bound, floor = _chord_and_tangent_bounds(grid, anchors, upper, slope)
        failing = (bound - (1.0 + tolerance) * floor > 1e-300) & ~done
        if not failing.any():
            break
        position = np.searchsorted(anchors, np.flatnonzero(failing)) - 1
        new = np.unique((anchors[position] + anchors[position + 1]) // 2)   # the middle of each failing interval
        candidates = chords[:, new] > floor[new]     # a teacher whose chord is below the lower bound is not the max
        candidates[np.argmax(chords[:, new], axis=0), np.arange(new.size)] = True   # at least one per order
        rows = np.flatnonzero(candidates.any(axis=1))
        upper[:, new] = chords[:, new]               # stand-ins, still upper bounds
        wanted = candidates[rows]
        value, derivative = ratios.moments(rows, grid[new], wanted)
        block_upper, block_slope = upper[np.ix_(rows, new)], slope[np.ix_(rows, new)]
        upper[np.ix_(rows, new)] = np.where(wanted, value, block_upper)
        slope[np.ix_(rows, new)] = np.where(wanted, derivative, block_slope)
        done[new] = True
    if done.all():
        return divergences_from_moments(upper.max(axis=0)[None], grid)[0], done.copy()
    anchors = np.flatnonzero(done)
    _, bound, _ = _chord_and_tangent_bounds(grid, anchors, upper, slope)
    # between sub-grid orders the chord bounds the true value; twice the kernel's rounding allowance
    # on top keeps it above what the kernel itself would return there (which carries that allowance)
    allowance = (SLACK_ULPS * ((grid + 1.0) * ratios.magnitude + np.log2(ratios.output.size) + 2.0 + np.abs(bound))
                 + (ratios.output.size + 2.0) * 2.0 ** -53)
    # (a chord through zeros is exactly zero: g_i >= 0 is convex and vanishes at both ends)
    moments = np.where(done | (bound == 0.0), bound, bound + 2.0 * allowance)
    return divergences_from_moments(moments[None], grid)[0], done.copy()


def _chord_and_tangent_bounds(grid: np.ndarray, anchors: np.ndarray, upper: np.ndarray,
                              slope: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(every teacher's chord between the sub-grid orders enclosing each grid order (n, K), rounded
    up; their max over teachers (K,), the exact max at sub-grid orders; the max over evaluated
    teachers of their tangents at those two orders (K,), a lower bound, the max itself at sub-grid orders)."""
    size = grid.size
    position = np.clip(np.searchsorted(anchors, np.arange(size), side="right") - 1, 0, anchors.size - 2)
    left, right = anchors[position], anchors[position + 1]
    weight = (grid - grid[left]) / (grid[right] - grid[left])
    chords = ((1.0 - weight) * upper[:, left] + weight * upper[:, right]) * (1.0 + 4.0 * ROUNDING_ULPS)
    with np.errstate(invalid="ignore"):
        tangents = np.maximum(upper[:, left] + slope[:, left] * (grid - grid[left]),
                              upper[:, right] + slope[:, right] * (grid - grid[right]))
    on_anchor = np.zeros(size, dtype=bool)
    on_anchor[anchors] = True
    chords[:, on_anchor] = upper[:, on_anchor]
    bound = chords.max(axis=0)
    floor = np.where(on_anchor, bound, np.where(np.isnan(tangents), -np.inf, tangents).max(axis=0))
    return chords, bound, np.maximum(floor, 0.0)


def reference_convex_sandwich(grid: np.ndarray, anchors: np.ndarray, values: np.ndarray,
                     slopes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a function convex in the order, known at grid[anchors] (values (..., A), with its derivatives
    there or None), at every grid order: (the chord between the enclosing anchors (..., K), a bound on
    that chord's rounding (..., K), a lower bound (..., K): the largest of the tangents at the two
    enclosing anchors and the extensions of the neighbouring chords); both equal the value at an anchor.
    A convex function lies under its chords, above its tangents and, outside a chord's interval, above
    the chord's line (Boyd & Vandenberghe 2004, Section 3.1.3). +inf anywhere in a row makes the row
    +inf: (k-1) D_k is infinite at one order > 1 exactly when the support condition fails, at every order.
    (dpledger.mechanisms.add_one's numpy form before dpledger.mechanisms.fused.convex_sandwich.)"""
    size = grid.size
    position = np.clip(np.searchsorted(anchors, np.arange(size), side="right") - 1, 0, anchors.size - 2)
    left, right = anchors[position], anchors[position + 1]
    weight = (grid - grid[left]) / (grid[right] - grid[left])
    index = np.searchsorted(anchors, np.arange(size))
    on_anchor = np.zeros(size, dtype=bool)
    on_anchor[anchors] = True
    a_left, a_right = values[..., position], values[..., position + 1]
    with np.errstate(invalid="ignore", over="ignore"):
        chord = (1.0 - weight) * a_left + weight * a_right
        rounding = 4.0 * ROUNDING_ULPS * (np.abs((1.0 - weight) * a_left) + np.abs(weight * a_right))
        lower = np.full(values.shape[:-1] + (size,), -np.inf)
        for before, after in ((position - 1, position), (position + 1, position + 2)):
            valid = (before >= 0) & (after < anchors.size) & (before < after)
            b, c = np.clip(before, 0, anchors.size - 1), np.clip(after, 0, anchors.size - 1)
            run = np.where(valid, grid[anchors[c]] - grid[anchors[b]], 1.0)
            slope = (values[..., c] - values[..., b]) / run
            line = values[..., b] + slope * (grid - grid[anchors[b]])
            lower = np.where(valid, np.fmax(lower, line), lower)
        if slopes is not None:
            for end, at in ((position, left), (position + 1, right)):
                lower = np.fmax(lower, values[..., end] + slopes[..., end] * (grid - grid[at]))
        exact_here = values[..., np.clip(index, 0, anchors.size - 1)]
        chord = np.where(on_anchor, exact_here, chord)
        rounding = np.where(on_anchor, 0.0, rounding)
        lower = np.where(on_anchor, exact_here, lower)
    infinite = np.expand_dims(np.isposinf(values).any(axis=-1), -1)
    return (np.where(infinite, np.inf, chord), np.where(infinite, 0.0, rounding),
            np.where(infinite, np.inf, lower))


def reference_row_sandwich(grid: np.ndarray, geometry: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                           values: np.ndarray, slopes: np.ndarray | None, done: np.ndarray
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """reference_convex_sandwich for rows (R, K) with their own anchors (`done`, placed by row_geometry):
    the same operations on the same numbers, element by element."""
    left, right, before, beyond = geometry
    g_left, g_right = grid[left], grid[right]
    weight = (grid - g_left) / (g_right - g_left)
    a_left, a_right = np.take_along_axis(values, left, axis=1), np.take_along_axis(values, right, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        chord = (1.0 - weight) * a_left + weight * a_right
        rounding = 4.0 * ROUNDING_ULPS * (np.abs((1.0 - weight) * a_left) + np.abs(weight * a_right))
        lower = np.full(values.shape, -np.inf)
        for start, end in ((before, left), (right, beyond)):
            valid = (start >= 0) & (end >= 0)
            b, c = np.clip(start, 0, None), np.clip(end, 0, None)
            run = np.where(valid, grid[c] - grid[b], 1.0)
            slope = (np.take_along_axis(values, c, axis=1) - np.take_along_axis(values, b, axis=1)) / run
            line = np.take_along_axis(values, b, axis=1) + slope * (grid - grid[b])
            lower = np.where(valid, np.fmax(lower, line), lower)
        if slopes is not None:
            for at in (left, right):
                lower = np.fmax(lower, np.take_along_axis(values, at, axis=1)
                                + np.take_along_axis(slopes, at, axis=1) * (grid - grid[at]))
        chord = np.where(done, values, chord)
        rounding = np.where(done, 0.0, rounding)
        lower = np.where(done, values, lower)
    infinite = (np.isposinf(values) & done).any(axis=1, keepdims=True)
    return (np.where(infinite, np.inf, chord), np.where(infinite, 0.0, rounding),
            np.where(infinite, np.inf, lower))


def row_geometry(done: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row (its anchors: `done`, holding the first and last order) and order q: the enclosing anchors
    (left, right; for the last anchor the two last: dpledger.mechanisms.add_one._row_geometry), the anchor
    before `left` and the one after `right` (-1 where there is none), as reference_convex_sandwich places q
    among the anchors. Below the last order, _row_geometry's left at q is the last anchor at or before q and
    its right the first anchor after q, which places the anchors beside them too."""
    from dpledger.mechanisms.add_one import _row_geometry

    size = done.shape[1]
    left, right = _row_geometry(done)
    before = np.where(left >= 1, np.take_along_axis(left, np.clip(left - 1, 0, size - 1), axis=1), -1)
    beyond = np.where(right < size - 1, np.take_along_axis(right, np.clip(right, 0, size - 1), axis=1), -1)
    return left, right, before, beyond


def reference_token_bounds(log_p: np.ndarray, log_p0: np.ndarray, alpha: float, log_r: float) -> tuple[np.ndarray, ...]:
    """The numpy form of dpledger.mechanisms.fused.add_one_token_bounds (add_one_direction_bounds' before it):
    (log qmax, log qmin, log(qmax / p), log M, max log(p0 / p), max |finite log p|, max |log p0| on public
    tokens, max |finite log qmin|, max |finite log(qmax / p)|)."""
    on_public = np.isfinite(log_p0)
    with np.errstate(invalid="ignore"):
        log_qmax = np.where(on_public, np.minimum(0.0, (log_r + (alpha - 1.0) * log_p0) / alpha), -np.inf)
        log_qmin = np.where(on_public, (alpha * log_p0 - log_r) / (alpha - 1.0), -np.inf)
        ratio_p0_p = np.where(on_public, log_p0 - log_p, -np.inf)
        log_m = np.where(on_public, log_qmax - log_p0, -np.inf).max(axis=-1)
        ratio_q_p = np.where(on_public, log_qmax - log_p, -np.inf)
    return (log_qmax, log_qmin, ratio_q_p, log_m, ratio_p0_p.max(axis=-1),
            np.abs(np.where(np.isfinite(log_p), log_p, 0.0)).max(axis=-1),
            np.abs(np.where(on_public, log_p0, 0.0)).max(axis=-1),
            np.abs(np.where(np.isfinite(log_qmin), log_qmin, 0.0)).max(axis=-1),
            np.abs(np.where(np.isfinite(ratio_q_p), ratio_q_p, 0.0)).max(axis=-1))
