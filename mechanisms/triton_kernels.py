"""The Triton kernels behind dpledger.mechanisms.device_kernels (which says what each computes and why its
rounding allowance covers it). Importing this module imports Triton: only tensors on a CUDA device (or
Triton's interpreter, TRITON_INTERPRET=1) come here.
"""
import triton
import triton.language as tl


@triton.jit
def log_moments_kernel(base_ptr, ratio_ptr, orders_ptr, out_ptr, orders_count,
                       vocab: tl.constexpr, block_orders: tl.constexpr, block_tokens: tl.constexpr):
    """out[row, k] = log sum_j exp(base[row, j] + orders[k] ratio[row, j]) (device_kernels.log_moments):
    one program per row and block of orders, two walks along the row (the maximum, then the shifted sum).

    Args:
        base_ptr: float64 (rows, vocab), finite.
        ratio_ptr: float64 (rows, vocab), finite or +-inf (+inf: the row's value is +inf).
        orders_ptr: float64 (orders_count,).
        out_ptr: float64 (rows, orders_count), written.
        orders_count: the number of orders.
        vocab: the row length.
        block_orders: orders per program.
        block_tokens: tokens per step of the walk.

    Returns:
        None: the values are stored at out_ptr.
    """
    row = tl.program_id(0)
    ks = tl.program_id(1) * block_orders + tl.arange(0, block_orders)
    in_grid = ks < orders_count
    order = tl.load(orders_ptr + ks, mask=in_grid, other=2.0)[:, None]
    start_of_row = row.to(tl.int64) * vocab
    # first pass: the maximum exponent per order (no rounding: a maximum of computed values)
    top = tl.full([block_orders, block_tokens], float("-inf"), tl.float64)
    for start in tl.range(0, vocab, block_tokens):
        js = start + tl.arange(0, block_tokens)
        in_row = js < vocab
        b = tl.load(base_ptr + start_of_row + js, mask=in_row, other=0.0)[None, :]
        r = tl.load(ratio_ptr + start_of_row + js, mask=in_row, other=float("-inf"))[None, :]
        top = tl.maximum(top, b + order * r)
    peak = tl.max(top, axis=1)
    shift = tl.where(peak == float("-inf"), 0.0, peak)   # every term 0: log 0 = -inf, as logsumexp
    # second pass: the same exponents (the same operations on the same values), shifted, summed
    total = tl.zeros([block_orders, block_tokens], tl.float64)
    for start in tl.range(0, vocab, block_tokens):
        js = start + tl.arange(0, block_tokens)
        in_row = js < vocab
        b = tl.load(base_ptr + start_of_row + js, mask=in_row, other=0.0)[None, :]
        r = tl.load(ratio_ptr + start_of_row + js, mask=in_row, other=float("-inf"))[None, :]
        total += tl.exp(b + order * r - shift[:, None])
    # a +inf exponent (P_j > 0 = Q_j) makes the sum +inf, as torch's logsumexp (exp(inf - inf) would be NaN)
    value = tl.where(peak == float("inf"), float("inf"), shift + tl.log(tl.sum(total, axis=1)))
    tl.store(out_ptr + row.to(tl.int64) * orders_count + ks, value, mask=in_grid)


@triton.jit
def exponents_at(p_row, q_row, lam, order, js, in_row):
    """The mixed teacher m = lam p + (1 - lam) q at tokens js, and the exponents of both directions'
    Renyi moments at the ball's orders, with renyi_divergence_orders_torch's special cases (a zero
    probability's log is -inf; its ratio -inf where the first law is 0; the base 0 where only the second is).

    Args:
        p_row: the teacher's probabilities.
        q_row: the public model's probabilities.
        lam: the mixing weight, float64.
        order: the ball's orders, (block_constraints, 1).
        js: the token indices, (block_tokens,).
        in_row: js < vocab.

    Returns:
        (log m, log q, m == 0, q == 0, the ratio of D(m || q), the ratio of D(q || m), the exponents of
        D(m || q) and of D(q || m) (block_constraints, block_tokens)).
    """
    p = tl.load(p_row + js, mask=in_row, other=1.0)
    q = tl.load(q_row + js, mask=in_row, other=1.0)
    m = lam * p + (1.0 - lam) * q
    log_m = tl.log(tl.maximum(m, 0.0))
    log_q = tl.log(tl.maximum(q, 0.0))
    m_zero = log_m == float("-inf")
    q_zero = log_q == float("-inf")
    forward_ratio = tl.where(m_zero, float("-inf"), log_m - log_q)
    reverse_ratio = tl.where(q_zero, float("-inf"), log_q - log_m)
    forward = tl.where(q_zero & ~m_zero, 0.0, log_q)[None, :] + order * forward_ratio[None, :]
    reverse = tl.where(m_zero & ~q_zero, 0.0, log_m)[None, :] + order * reverse_ratio[None, :]
    return log_m, log_q, m_zero, q_zero, forward_ratio, reverse_ratio, forward, reverse


@triton.jit
def excess_at(p_row, q_row, lam, order, radius, in_ball, max_radius, has_max, slack_ulps, rounding_ulps,
              log2_vocab_plus_2, sum_roundoff, vocab: tl.constexpr, block_constraints: tl.constexpr,
              block_tokens: tl.constexpr):
    """The largest excess over the ball's radii of the mixed teacher lam p + (1 - lam) q: at each ball
    order both directions of renyi_divergence_orders_torch (its special cases and rounding allowance),
    and D<->_inf as max_divergence_symmetric where the ball has it.

    Args:
        p_row: the teacher's probabilities (vocab,).
        q_row: the public model's probabilities (vocab,).
        lam: the mixing weight, float64.
        order: the ball's orders, (block_constraints, 1).
        radius: the radii aimed at, (block_constraints,).
        in_ball: which of the block's orders are the ball's.
        max_radius: D<->_inf's radius aimed at (used where has_max).
        has_max: 1 where the ball bounds D<->_inf.
        slack_ulps: the allowance per unit of magnitude.
        rounding_ulps: D<->_inf's allowance per unit of magnitude.
        log2_vocab_plus_2: log2(vocab) + 2.
        sum_roundoff: (vocab + 2) u.
        vocab: the row length.
        block_constraints: the block of orders (a power of 2).
        block_tokens: tokens per step of the walk.

    Returns:
        The excess, float64: <= 0 inside the ball as evaluated, rounded up.
    """
    # renyi_divergence_orders_torch in both directions between m = lam p + (1 - lam) q and q, at every
    # ball order, rounded up as there; then the largest excess over the radii (and D<->_inf's)
    top_f = tl.full([block_constraints, block_tokens], float("-inf"), tl.float64)
    top_r = tl.full([block_constraints, block_tokens], float("-inf"), tl.float64)
    size_m = tl.zeros([block_tokens], tl.float64)
    size_q = tl.zeros([block_tokens], tl.float64)
    unequal = tl.zeros([block_tokens], tl.int32)
    ratio_top = tl.full([block_tokens], float("-inf"), tl.float64)
    for start in tl.range(0, vocab, block_tokens):
        js = start + tl.arange(0, block_tokens)
        in_row = js < vocab
        log_m, log_q, m_zero, q_zero, forward_ratio, reverse_ratio, forward, reverse = exponents_at(
            p_row, q_row, lam, order, js, in_row)
        size_m = tl.maximum(size_m, tl.where(m_zero | ~in_row, 0.0, tl.abs(log_m)))
        size_q = tl.maximum(size_q, tl.where(q_zero | ~in_row, 0.0, tl.abs(log_q)))
        unequal = tl.maximum(unequal, tl.where(in_row & (log_m != log_q), 1, 0))
        ratio_top = tl.maximum(ratio_top, tl.where(in_row, tl.maximum(forward_ratio, reverse_ratio), float("-inf")))
        top_f = tl.maximum(top_f, tl.where(in_row[None, :], forward, float("-inf")))
        top_r = tl.maximum(top_r, tl.where(in_row[None, :], reverse, float("-inf")))
    peak_f = tl.max(top_f, axis=1)
    peak_r = tl.max(top_r, axis=1)
    shift_f = tl.where(peak_f == float("-inf"), 0.0, peak_f)
    shift_r = tl.where(peak_r == float("-inf"), 0.0, peak_r)
    total_f = tl.zeros([block_constraints, block_tokens], tl.float64)
    total_r = tl.zeros([block_constraints, block_tokens], tl.float64)
    for start in tl.range(0, vocab, block_tokens):
        js = start + tl.arange(0, block_tokens)
        in_row = js < vocab
        # the same exponents as the first walk: the same operations on the same values
        _, _, _, _, _, _, forward, reverse = exponents_at(p_row, q_row, lam, order, js, in_row)
        total_f += tl.where(in_row[None, :], tl.exp(forward - shift_f[:, None]), 0.0)
        total_r += tl.where(in_row[None, :], tl.exp(reverse - shift_r[:, None]), 0.0)
    magnitude = tl.max(size_m, axis=0) + tl.max(size_q, axis=0) + 2.0
    # a +inf exponent (m_j > 0 = q_j forward, q_j > 0 = m_j reverse) is an infinite divergence, as in the torch
    # form; exp(inf - inf) would make it NaN, which a maximum on the device drops
    value_f = tl.where(peak_f == float("inf"), float("inf"), shift_f + tl.log(tl.sum(total_f, axis=1)))
    value_r = tl.where(peak_r == float("inf"), float("inf"), shift_r + tl.log(tl.sum(total_r, axis=1)))
    order_k = tl.reshape(order, [block_constraints])
    moment_f = value_f + (slack_ulps * ((order_k + 1.0) * magnitude + log2_vocab_plus_2 + tl.abs(value_f))
                          + sum_roundoff)
    moment_r = value_r + (slack_ulps * ((order_k + 1.0) * magnitude + log2_vocab_plus_2 + tl.abs(value_r))
                          + sum_roundoff)
    # every maximum keeps a NaN (the device's default drops it): a NaN excess is neither feasible nor
    # infeasible, so the iteration never moves its feasible end off it
    equal = tl.max(unequal, axis=0) == 0
    moment_f = tl.where(equal, 0.0, tl.maximum(moment_f, 0.0, propagate_nan=tl.PropagateNan.ALL))
    moment_r = tl.where(equal, 0.0, tl.maximum(moment_r, 0.0, propagate_nan=tl.PropagateNan.ALL))
    forward_d = tl.maximum(moment_f / (order_k - 1.0), 0.0, propagate_nan=tl.PropagateNan.ALL)
    reverse_d = tl.maximum(moment_r / (order_k - 1.0), 0.0, propagate_nan=tl.PropagateNan.ALL)
    symmetric = tl.maximum(forward_d, reverse_d, propagate_nan=tl.PropagateNan.ALL)
    excess = tl.where(in_ball, symmetric - radius, float("-inf"))
    worst = tl.where(tl.max(tl.where(excess != excess, 1, 0), axis=0) > 0, float("nan"), tl.max(excess, axis=0))
    # D<->_inf = max_j |log m_j - log q_j| over the supports, rounded up as max_divergence_symmetric
    largest = tl.maximum(tl.max(ratio_top, axis=0), 0.0)
    largest = tl.where(largest < float("inf"), largest + rounding_ulps * magnitude * 2.0, largest)
    return tl.where(has_max != 0, tl.maximum(worst, largest - max_radius, propagate_nan=tl.PropagateNan.ALL), worst)

@triton.jit
def solve_kernel(teachers_ptr, public_ptr, orders_ptr, radii_ptr, scalars_ptr, out_ptr, teachers_per_step,
                 constraint_count, has_max, max_iterations, vocab: tl.constexpr, block_constraints: tl.constexpr,
                 block_tokens: tl.constexpr):
    """One teacher's lambda per program (device_kernels.ball_mixing_weights_device): 1 where the teacher
    is inside the ball, else the feasible end of ball_mixing_weights_torch's Illinois bracket.

    Args:
        teachers_ptr: float64 (steps * teachers_per_step, vocab).
        public_ptr: float64 (steps, vocab).
        orders_ptr: float64 (constraint_count,), the ball's orders.
        radii_ptr: float64 (constraint_count,), the radii aimed at.
        scalars_ptr: float64 (9,): D<->_inf's radius, the smallest radius, the stopping tolerance, the
            two allowances per unit of magnitude, log2(vocab) + 2, (vocab + 2) u, 1, and the bracket width
            at which the iteration stops (1e-12).
        out_ptr: float64 (steps * teachers_per_step,), written.
        teachers_per_step: N.
        constraint_count: the ball's number of orders.
        has_max: 1 where the ball bounds D<->_inf.
        max_iterations: the most Illinois steps.
        vocab: the row length.
        block_constraints: the block of orders (a power of 2 >= constraint_count).
        block_tokens: tokens per step of the walk.

    Returns:
        None: the lambdas are stored at out_ptr.
    """
    # float64 scalars come from memory: Triton would pass a Python float as float32
    max_radius = tl.load(scalars_ptr)
    smallest = tl.load(scalars_ptr + 1)
    tolerance = tl.load(scalars_ptr + 2)
    slack_ulps = tl.load(scalars_ptr + 3)
    rounding_ulps = tl.load(scalars_ptr + 4)
    log2_vocab_plus_2 = tl.load(scalars_ptr + 5)
    sum_roundoff = tl.load(scalars_ptr + 6)
    one = tl.load(scalars_ptr + 7)
    narrowest = tl.load(scalars_ptr + 8)   # the bracket width at which the iteration stops (1e-12)
    zero = one - one
    row = tl.program_id(0)
    p_row = teachers_ptr + row.to(tl.int64) * vocab
    q_row = public_ptr + (row // teachers_per_step).to(tl.int64) * vocab
    ks = tl.arange(0, block_constraints)
    in_ball = ks < constraint_count
    order = tl.load(orders_ptr + ks, mask=in_ball, other=2.0)[:, None]
    radius = tl.load(radii_ptr + ks, mask=in_ball, other=0.0)
    at_one = excess_at(p_row, q_row, one, order, radius, in_ball, max_radius, has_max, slack_ulps, rounding_ulps,
                       log2_vocab_plus_2, sum_roundoff, vocab, block_constraints, block_tokens)
    # ball_mixing_weights_torch's Illinois iteration for this one teacher: the feasible end returned
    low = zero
    high = one
    true_low = -smallest
    weight_low = -smallest
    weight_high = at_one
    side = zero
    iteration = 0
    done = at_one <= 0.0
    while (iteration < max_iterations) & ~done:
        secant = (low * weight_high - high * weight_low) / (weight_high - weight_low)
        usable = (weight_high < float("inf")) & (secant > low) & (secant < high)
        trial = tl.where(usable, secant, 0.5 * (low + high))
        value = excess_at(p_row, q_row, trial, order, radius, in_ball, max_radius, has_max, slack_ulps,
                          rounding_ulps, log2_vocab_plus_2, sum_roundoff, vocab, block_constraints, block_tokens)
        feasible = value <= 0.0
        infeasible = value > 0.0
        weight_high = tl.where(feasible & (side < 0.0), 0.5 * weight_high, weight_high)
        weight_low = tl.where(infeasible & (side > 0.0), 0.5 * weight_low, weight_low)
        low = tl.where(feasible, trial, low)
        true_low = tl.where(feasible, value, true_low)
        weight_low = tl.where(feasible, value, weight_low)
        high = tl.where(infeasible, trial, high)
        weight_high = tl.where(infeasible, value, weight_high)
        side = tl.where(feasible, -one, tl.where(infeasible, one, side))
        iteration += 1
        done = (true_low >= -tolerance) | (high - low <= narrowest)
    tl.store(out_ptr + row, tl.where(at_one <= 0.0, one, low))
