"""Fused CPU kernels (numba): each makes one pass over N x V per solver evaluation or per exact
order, in float64 log space, with exp and log from dpledger.mechanisms.fastmath (vectorised).

Why numba: it installs from a wheel on every platform torch supports, needs no C compiler on the
user's machine (torch.compile's CPU backend does), and lets one loop fuse what torch would run as
ten passes with temporaries. The price is a compile on first use, once per machine: the compiled
code is cached on disk (dpledger.mechanisms.fastmath.configure_kernel_cache says where and how the
cache is keyed). Every kernel whose values a trace records gives the same bits in a process that
compiled it and in one that loaded it from the cache, whatever the process ran before and with any
number of threads: every fastmath helper is inlined into its kernel (_HELPER_FLAGS says why that
matters), no kernel calls a fastmath kernel from compiled code (refinement_round says why; what
compiled code does call without inlining, vexp, _chords_and_floor and convex_sandwich, has no fastmath
flags, so a re-optimised copy keeps its IEEE bits), and none runs parallel (_TRACE_FLAGS). What
does change the last bits of the reassociated sums is the vector width
(dpledger.mechanisms.fastmath.prefer_wide_vectors); every value stays within the kernels' rounding
allowance of the exact one either way, and the audit compares Eq. 3 within that allowance
(dpledger.mechanisms.leave_one_out.leave_one_out_allowance), lambdas within 1e-9.
Tensors on a GPU never come here: dpledger.mechanisms.kernels runs the torch form of the same arithmetic
on their device.
"""
from __future__ import annotations

import math
import types
from typing import Callable

import numpy as np
from numpy.typing import NDArray

from dpledger.mechanisms.fastmath import JitOptions, fma, jit, vexp, vexp_pair, vexpm1, vlog, vmax, vmin  # first: numba's vector width
from dpledger.accounting.rounding import UNIT_ROUNDOFF

from numba import prange  # noqa: E402,I001

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

def _renamed(function: Callable[..., object], name: str) -> Callable[..., object]:
    """A copy of `function` under another name: a second compiled form of one body (serial and parallel)
    needs its own name, which keys numba's on-disk cache."""
    copy = types.FunctionType(function.__code__, function.__globals__, name, function.__defaults__,
                              function.__closure__)
    copy.__qualname__, copy.__doc__ = name, function.__doc__
    return copy


# reassociation lets sums and maxima vectorise; no "nnan"/"ninf": infinities carry meaning here
_FLAGS: JitOptions = dict(fastmath={"reassoc", "contract", "arcp", "nsz"}, error_model="numpy", cache=True, nogil=True)
# Kernels whose values a trace records run on one thread: numba optimises a parallel kernel's body again
# when it loads it from the cache, and the reassociated sums then differ in their last bits from those of
# the process that compiled it (Eq. 3 moments 4e-16 apart at V = 4,096; tests/test_kernel_cache.py).
_TRACE_FLAGS = _FLAGS
# The audit's Monte Carlo and ablation kernels keep prange over rows: their values are compared
# within the kernels' rounding allowance, never replayed bit for bit.
_PARALLEL_FLAGS: JitOptions = {**_FLAGS, "parallel": True}
# Helpers are inlined into the kernels that call them (numba IR), so that every kernel runs one copy of
# its helpers, optimised once with it. Called as separate functions, numba links a copy of each helper
# into every caller and optimises it again there, and the process's linker binds the call to whichever
# copy it loaded first: the helper compiled alone in a process that compiles, the caller's own copy in
# one that loads the caller from the cache. Reassociated sums then differ in their last bits between the
# two (lambdas 4e-12 apart at V = 50257, N = 100) and with what the process happened to run before.
_HELPER_FLAGS: JitOptions = {**_FLAGS, "inline": "always"}


@jit(**_HELPER_FLAGS)
def _log_public(public: FloatArray, out: FloatArray) -> None:
    for j in range(public.size):
        out[j] = vlog(public[j])


@jit(**_HELPER_FLAGS)
def _ratios(teacher: FloatArray, public: FloatArray, ratio: FloatArray) -> tuple[float, float, float, bool]:
    """ratio_j = p_j / p0_j (1 where p0_j = 0 = p_j); returns (min, max, chi-square, outside):
    chi-square = sum_j p0_j (ratio_j - 1)^2, and `outside` says p puts mass where p0 has none
    (every lambda > 0 is then infinitely far from p0)."""
    outside = 0.0
    for j in range(public.size):
        ratio[j] = teacher[j] / public[j] if public[j] > 0.0 else 1.0
        outside += teacher[j] if public[j] == 0.0 else 0.0
    low, high, chi_square = np.inf, 0.0, 0.0
    for j in range(public.size):   # a separate pass: with the stores above the loop does not vectorise
        low = vmin(low, ratio[j])
        high = vmax(high, ratio[j])
        chi_square += public[j] * (ratio[j] - 1.0) * (ratio[j] - 1.0)
    return low, high, chi_square, outside > 0.0


NORMAL_PUBLIC = 2.0 ** -968
"""Where every positive p0_j is at least this, (1 - lam) p0_j is a normal float for every lam < 1
(1 - lam >= 2^-53): the solver forms the mixed ratio m_j / p0_j as lam (p_j / p0_j) + 1 - lam."""


_UNIT = UNIT_ROUNDOFF   # (a numba global: the kernels' n-term sums add (n + 2) of it to their allowance)

_FAST_RANGE = 600.0
"""Exponent span below which a sum is formed from one shifted exp per term (no term under- or
overflows: every shifted power lies in [e^-600, 1])."""


MAX_INTEGER_ORDER = 4096.0
"""The largest order the solver raises to a power by products (12 squarings): above it, exp and log."""


@jit(**_HELPER_FLAGS)
def _power_sums_of_bits(exponent: int, bits: int, lam: float, keep: float, high_r: float, low_r: float,
                        ratio: FloatArray, public: FloatArray) -> tuple[float, float, float, float]:
    """_integer_order_sums with `bits` (>= the bit length of `exponent` = a - 1) a constant where it is
    inlined: LLVM then unrolls the squarings and vectorises the token loop."""
    inverse_high = 1.0 / high_r
    sum_forward, slope_forward, sum_reverse, slope_reverse = 0.0, 0.0, 0.0, 0.0
    for j in range(ratio.size):
        r = fma(lam, ratio[j], keep)
        t = r * inverse_high
        s = low_r / r
        base_t, base_s, power_t, power_s = t, s, 1.0, 1.0
        for b in range(bits):
            odd = (exponent >> b) & 1
            power_t = power_t * base_t if odd else power_t
            power_s = power_s * base_s if odd else power_s
            base_t = base_t * base_t
            base_s = base_s * base_s
        weight = public[j]
        excess = weight * (ratio[j] - 1.0)
        sum_forward += weight * power_t * t
        slope_forward += excess * power_t
        sum_reverse += weight * power_s
        slope_reverse += excess * power_s * s
    return sum_forward, slope_forward, sum_reverse, slope_reverse


@jit(**_HELPER_FLAGS)
def _integer_order_sums(order: int, lam: float, keep: float, high_r: float, low_r: float, ratio: FloatArray,
                        public: FloatArray) -> tuple[float, float, float, float]:
    """The four sums of one integer order a in [2, MAX_INTEGER_ORDER] in _ball_residual without exp or
    log: with r_j = fma(lam, ratio_j, keep) (the mixed ratio as the normal-public path forms it),
    t_j = r_j / r_max and s_j = r_min / r_j in (0, 1], returns (sum_j p0_j t_j^a,
    sum_j p0_j (ratio_j - 1) t_j^(a-1), sum_j p0_j s_j^(a-1), sum_j p0_j (ratio_j - 1) s_j^a): the forward
    and reverse sums scaled by r_max^-a and r_min^(a-1), and their slope sums (the derivative's, scaled
    by r_max^(1-a) and r_min^a). t^(a-1) and s^(a-1) by binary powering (square and multiply) in
    registers, over a constant number of bits per branch below (so the token loop vectorises: 1.9 ns a
    token at a = 18 against 6-7 for the exp and log path on AVX2). A product of m factors, each within
    e of its value, is within m e + (m - 1) ulps (each rounding counted once per use of its result):
    about 5 a ulps here, far inside the residual's rounding allowance of 8 (a + 1) ulps per unit of
    magnitude. The caller checks that (r_min / r_max)^a stays a normal float."""
    exponent = order - 1
    if exponent < 4:
        return _power_sums_of_bits(exponent, 2, lam, keep, high_r, low_r, ratio, public)
    if exponent < 16:
        return _power_sums_of_bits(exponent, 4, lam, keep, high_r, low_r, ratio, public)
    if exponent < 32:
        return _power_sums_of_bits(exponent, 5, lam, keep, high_r, low_r, ratio, public)
    if exponent < 64:
        return _power_sums_of_bits(exponent, 6, lam, keep, high_r, low_r, ratio, public)
    if exponent < 256:
        return _power_sums_of_bits(exponent, 8, lam, keep, high_r, low_r, ratio, public)
    return _power_sums_of_bits(exponent, 12, lam, keep, high_r, low_r, ratio, public)


@jit(**_HELPER_FLAGS)
def _mixed_log_ratios(lam: float, teacher: FloatArray, public: FloatArray, ratio: FloatArray, log_r: FloatArray,
                      slope: FloatArray, mixed_ratio: FloatArray, normal_public: bool) -> tuple[float, float]:
    """_ball_residual's per-token rows at lam: the mixed ratio r_j, log r_j and (ratio_j - 1) / r_j;
    returns (max(0, max_j log r_j), min(0, min_j log r_j))."""
    size = ratio.size
    keep = 1.0 - lam
    if normal_public:
        # keep * p0_j is then a normal float (keep >= 2^-53 or 0), so m_j / p0_j = lam ratio_j + keep
        # to within 2 ulps, with no division and no underflow of m_j
        for j in range(size):
            r = fma(lam, ratio[j], keep) if public[j] > 0.0 else 1.0
            mixed_ratio[j] = r
            log_r[j] = vlog(r)
            slope[j] = (ratio[j] - 1.0) / r
    else:
        for j in range(size):
            # a division, not a product with 1 / p0_j: that is inf for a subnormal p0_j, and inf * 0 = NaN
            r = fma(lam, teacher[j], keep * public[j]) / public[j] if public[j] > 0.0 else 1.0
            mixed_ratio[j] = r
            log_r[j] = vlog(r)
            slope[j] = (ratio[j] - 1.0) / r
    top, bottom = 0.0, 0.0
    for j in range(size):   # a separate pass: with the stores above the loop does not vectorise
        top = vmax(top, log_r[j])
        bottom = vmin(bottom, log_r[j])
    return top, bottom


@jit(**_HELPER_FLAGS)
def _ball_residual(lam: float, teacher: FloatArray, public: FloatArray, log_public: FloatArray, ratio: FloatArray,
                   low: float, high: float, orders: FloatArray, log_targets: FloatArray, max_log_ratio: float,
                   log_r: FloatArray, slope: FloatArray, mixed_ratio: FloatArray, public_magnitude: float,
                   slack_ulps: float, normal_public: bool, version: int) -> tuple[float, float, float, float]:
    """The largest constraint residual of the mixed teacher m = lam p + (1 - lam) p0, its derivative
    in lam, and for an order constraint its exponent c and log target (else 0, 0): each residual is
    <= 0 exactly when its constraint holds. Order constraint k, both
    directions: sqrt(log sum_j p0_j r_j^c) - sqrt((a - 1) radius_k), r_j = m_j / p0_j with m_j
    formed as the decode loop forms it (one fma of two non-negative terms: no cancellation, and a
    mixture that underflows to 0 where p0_j > 0 counts as infinitely far), c = a forward and 1 - a
    reverse ((a - 1) D_a = the log-sum); `normal_public` (every positive p0_j >= NORMAL_PUBLIC) forms
    r_j as lam ratio_j + (1 - lam) instead, the same within 2 ulps. The square root makes the residual nearly linear in lam
    (D_a ~ lam^2 chi^2 a / 2 for small lam), so Newton needs few steps. Max-divergence constraint:
    (log max_j r_j - max_log_ratio) / (2 sqrt(max_log_ratio)) and the same with -log min_j r_j
    (low and high are the extreme ratios p_j / p0_j, where r is extreme too).

    When a times the span of log r is below _FAST_RANGE both sums come from one exp pair per token,
    y_j = r_j^a / r_max^a and 1 / y_j (vexp_pair): forward sum_j p0_j y_j, reverse sum_j p0_j r_j / y_j. Otherwise each
    sum is a two-pass log-sum-exp (maximum first). From solver `version` 7 (records_version 7), with a
    normal public law and every order an integer up to MAX_INTEGER_ORDER, an order in that range takes no exp
    or log per token (_integer_order_sums), and r_max and r_min come from the extreme ratios (r is
    nondecreasing in the ratio, the fma rounding monotonically): one pass, nothing stored; and each
    moment's rounding allowance holds the worst case of a sum of V terms in any order, (V + 2) unit
    roundoffs (Higham 2002, Section 4.2), where earlier versions assumed pairwise summation (log2 V)."""
    size = ratio.size
    keep = 1.0 - lam
    powers = version >= 7 and normal_public
    summation = (size + 2.0) * _UNIT if version >= 7 else 0.0
    for k in range(orders.size):
        powers = powers and orders[k] == math.floor(orders[k]) and orders[k] <= MAX_INTEGER_ORDER
    high_r, low_r = fma(lam, high, keep), fma(lam, low, keep)
    rows = not powers   # whether an order needs the rows of logs (one call site of the inlined _mixed_log_ratios)
    top, bottom = 0.0, 0.0
    if powers:
        # every r_j lies in [r_min, r_max] (the ratio 1 where p0_j = 0 too: low <= 1 <= high)
        top, bottom = max(0.0, math.log(high_r)), min(0.0, math.log(low_r))
        for k in range(orders.size):   # an order past the power path's range needs the rows of logs
            if not orders[k] * (top - bottom) + top + math.log(size) < _FAST_RANGE and bottom > -np.inf:
                rows = True
                break
    if rows:
        row_top, row_bottom = _mixed_log_ratios(lam, teacher, public, ratio, log_r, slope, mixed_ratio, normal_public)
        if not powers:
            top, bottom = row_top, row_bottom
    if bottom == -np.inf:   # the mixture vanishes where p0 does not: no finite divergence
        return np.inf, np.nan, 0.0, 0.0
    # |log m_j| <= |log p0_j| + |log r_j|: twice the public magnitude and the span bound the kernel's
    magnitude = 2.0 * public_magnitude + max(top, -bottom) + 2.0
    worst, derivative, exponent, target = -np.inf, 0.0, 0.0, 0.0
    for k in range(orders.size):
        a = orders[k]
        fast = a * (top - bottom) + top + math.log(size) < _FAST_RANGE
        if powers and fast:
            sum_forward, moment_forward, sum_reverse, moment_reverse = _integer_order_sums(
                int(a), lam, keep, high_r, low_r, ratio, public)
            forward = math.log(sum_forward) + a * math.log(high_r) - log_targets[k]
            reverse = math.log(sum_reverse) + (1.0 - a) * math.log(low_r) - log_targets[k]
            moment_forward, moment_reverse = moment_forward / high_r, moment_reverse / low_r
        elif fast:
            sum_forward, moment_forward, sum_reverse, moment_reverse = 0.0, 0.0, 0.0, 0.0
            for j in range(size):
                y, inverse = vexp_pair(a * (log_r[j] - top))
                u = public[j] * y
                w = public[j] * mixed_ratio[j] * inverse
                sum_forward += u
                sum_reverse += w
                moment_forward += u * slope[j]
                moment_reverse += w * slope[j]
            forward = math.log(sum_forward) + a * top - log_targets[k]
            reverse = math.log(sum_reverse) - a * top - log_targets[k]
        else:
            top_forward, top_reverse = -np.inf, -np.inf
            for j in range(size):
                top_forward = vmax(top_forward, log_public[j] + a * log_r[j])
                top_reverse = vmax(top_reverse, log_public[j] + (1.0 - a) * log_r[j])
            if top_forward == np.inf or top_reverse == np.inf:
                return np.inf, np.nan, 0.0, 0.0
            sum_forward, moment_forward, sum_reverse, moment_reverse = 0.0, 0.0, 0.0, 0.0
            for j in range(size):
                u = vexp(log_public[j] + a * log_r[j] - top_forward)
                w = vexp(log_public[j] + (1.0 - a) * log_r[j] - top_reverse)
                sum_forward += u
                sum_reverse += w
                moment_forward += u * slope[j]
                moment_reverse += w * slope[j]
            forward = math.log(sum_forward) + top_forward - log_targets[k]
            reverse = math.log(sum_reverse) + top_reverse - log_targets[k]
        for value, slope_sum, total, c in ((forward, moment_forward, sum_forward, a),
                                           (reverse, moment_reverse, sum_reverse, 1.0 - a)):
            moment = value + log_targets[k]             # log sum_j p0_j r_j^c >= 0
            # rounded up as dpledger.mechanisms.kernels.renyi_divergence_orders rounds: feasible as it would judge
            moment += slack_ulps * ((a + 1.0) * magnitude + math.log2(size) + 2.0 + abs(moment)) + summation
            root = math.sqrt(max(moment, 0.0))
            residual = root - math.sqrt(log_targets[k])
            if residual > worst:
                worst, exponent, target = residual, c, log_targets[k]
                derivative = c * slope_sum / total / (2.0 * root) if root > 0.0 else np.nan
    if max_log_ratio < np.inf:
        scale = 2.0 * math.sqrt(max_log_ratio)
        rounding = 2.0 * slack_ulps * magnitude       # as dpledger.mechanisms.kernels.max_divergence_symmetric rounds
        forward = (top + rounding - max_log_ratio) / scale
        reverse = (-bottom + rounding - max_log_ratio) / scale
        if forward > worst:
            worst, derivative, exponent = forward, (high - 1.0) / math.exp(top) / scale, 0.0
        if reverse > worst:
            worst, derivative, exponent = reverse, -(low - 1.0) / math.exp(bottom) / scale, 0.0
    return worst, derivative, exponent, target


@jit(**_HELPER_FLAGS)
def _secant_root(lo: float, residual_lo: float, hi: float, residual_hi: float) -> float:
    """Root of the line through (lo, residual_lo < 0) and (hi, residual_hi > 0): on the feasible
    side when the residual is convex in lam, nearly exact when it is nearly linear."""
    if not math.isfinite(residual_hi):
        return lo
    return lo + (-residual_lo) / (residual_hi - residual_lo) * (hi - lo)


@jit(**_HELPER_FLAGS)
def _fitted_root(lam: float, residual: float, derivative: float, exponent: float, target: float) -> float:
    """The next trial lambda from a two-parameter model of the worst order constraint's log-moment
    M(lam) = log sum_j p0_j r_j^c, fitted to its value and slope at `lam` (both from the residual
    sqrt(M) - sqrt(target) and its derivative): where one token's ratio dominates, M grows like
    c log(1 + B lam) forward (c = a > 0, the largest ratio) and like -(a - 1) log(1 - B lam) reverse
    (c = 1 - a < 0, the smallest), which Newton on sqrt(M) follows poorly. Forward where
    lam M' / M < 1.5, reverse where it exceeds 2.5 (sqrt(M) is nearly linear, M ~ lam^2, near 2);
    NaN where the model does not apply (the caller takes the Newton step). Only a proposal: the
    solver keeps it inside its bracket and judges every point by the exact residual."""
    root = residual + math.sqrt(target)
    moment, slope = root * root, 2.0 * root * derivative
    if not (moment > 0.0 and slope > 0.0):
        return np.nan
    growth = lam * slope / moment
    if exponent > 0.0 and growth < 1.5 and lam * slope < exponent:
        rate = slope / (exponent - lam * slope)
        return ((1.0 + rate * lam) * math.exp((target - moment) / exponent) - 1.0) / rate
    if exponent < 0.0 and growth > 2.5:
        rate = slope / (-exponent + lam * slope)
        return (1.0 - (1.0 - rate * lam) * math.exp((target - moment) / exponent)) / rate
    return np.nan


@jit(**_HELPER_FLAGS)
def _solve_teacher(teacher: FloatArray, public: FloatArray, log_public: FloatArray, orders: FloatArray,
                   log_targets: FloatArray, max_log_ratio: float, tolerance: float, max_evaluations: int,
                   slack_ulps: float, public_magnitude: float, smallest_target: float,
                   curvature: float, normal_public: bool, version: int) -> tuple[float, int]:
    """One teacher's lambda and the evaluations it took (solve_mixing_weights has the method)."""
    size = public.size
    ratio = np.empty(size)
    log_r = np.empty(size)
    slope = np.empty(size)
    mixed_ratio = np.empty(size)
    low, high, chi_square, outside = _ratios(teacher, public, ratio)
    if outside or (smallest_target <= 0.0 and (low < 1.0 or high > 1.0)):
        # a radius 0 admits the public model only: rounding must not let a tiny lambda through
        return 0.0, 0
    lo, residual_lo, hi, residual_hi, hi_known = 0.0, -smallest_target, 1.0, np.inf, False
    trial = min(1.0, 1.0 / math.sqrt(curvature * chi_square)) if curvature * chi_square > 1.0 else 1.0
    count, answer = 0, -1.0
    # one call site of _ball_residual: inlined, each call site is a copy of its loops (compile time)
    point, chord_step = trial, False   # chord_step: `point` is the chord root taken after an infeasible trial
    while True:
        residual, derivative, exponent, target = _ball_residual(point, teacher, public, log_public, ratio, low, high,
                                                                orders, log_targets, max_log_ratio, log_r, slope,
                                                                mixed_ratio, public_magnitude, slack_ulps, normal_public,
                                                                version)
        count += 1
        if chord_step:
            chord_step = False
            if residual <= 0.0:
                lo, residual_lo = point, residual
            else:
                hi, residual_hi = point, residual
                latest, residual_latest, derivative_latest = point, residual, derivative
                exponent_latest, target_latest = exponent, target
        else:
            latest, residual_latest, derivative_latest = point, residual, derivative
            exponent_latest, target_latest = exponent, target
            if residual <= 0.0:
                if point == 1.0:
                    answer = 1.0
                    break
                lo, residual_lo = point, residual
            else:
                hi, residual_hi, hi_known = point, residual, True
                chord = _secant_root(lo, residual_lo, hi, residual_hi)
                # far from the root the next Newton point gains more than the secant would
                close = math.isfinite(residual) and derivative > 0.0 and residual < 1e-3 * derivative * point
                if close and lo < chord < hi and count < max_evaluations:
                    point, chord_step = chord, True
                    continue
        if count >= max_evaluations or residual_lo >= -tolerance * smallest_target or hi - lo <= 1e-12:
            break
        if math.isfinite(residual_latest) and derivative_latest > 0.0:
            trial = latest - residual_latest / derivative_latest
            if version >= 6 and exponent_latest != 0.0:
                fitted = _fitted_root(latest, residual_latest, derivative_latest, exponent_latest, target_latest)
                trial = fitted if fitted == fitted else trial
        else:
            trial = 0.5 * (lo + hi)
        if not hi_known and trial >= 1.0:
            trial = 1.0
        elif not (lo < trial < hi):
            trial = 0.5 * (lo + hi)
        point = trial
    return (answer if answer >= 0.0 else lo), count


@jit(**_FLAGS)
def solve_mixing_weights(teachers: FloatArray, public: FloatArray, orders: FloatArray, log_targets: FloatArray,
                         max_log_ratio: float, tolerance: float, max_evaluations: int, slack_ulps: float,
                         version: int, lambdas: FloatArray, evaluations: IntArray) -> None:
    """Largest lam in [0, 1] per teacher with every residual of _ball_residual <= 0.

    Safeguarded Newton on the largest residual R(lam), inside the bracket [lo, hi] (R(lo) <= 0 < R(hi)),
    one teacher at a time while its rows are in cache. It starts where the second-order expansion
    (a - 1) D_a ~ a (a - 1) lam^2 chi^2 / 2 meets the tightest constraint (or at 1), then takes the
    Newton point from the latest evaluation (bisection when it leaves the bracket), or with
    (from `version` 6) the root of a log model fitted there where one token dominates (_fitted_root:
    524 -> 412 evaluations per paper-scale step); after an infeasible point it also takes the chord
    root of exp(R) - 1, which convexity puts on the feasible side, so the bracket closes from both
    ends. The answer is always the feasible end lo, as evaluated; it stops when
    R(lo) >= -tolerance * (smallest target) or hi - lo <= 1e-12. Writes lambdas (N,) and the
    evaluations made per teacher.

    Args:
        teachers: the teachers' next-token probabilities p_i, shape (N, V), float64, C-contiguous.
        public: the public model's probabilities p0, shape (V,).
        orders: the constrained Renyi orders a_k > 1, shape (K,).
        log_targets: per order, (a_k - 1) times its radius: the largest log sum_j p0_j r_j^c allowed, > 0, shape (K,).
        max_log_ratio: the max-divergence radius (a bound on |log r_j|), or +inf for no such constraint.
        tolerance: stop once R(lo) >= -tolerance * (smallest target): relative closeness to the boundary.
        max_evaluations: the most residual evaluations per teacher (>= 1).
        slack_ulps: the rounding-up allowance, in ulps per unit of magnitude (kernels._SLACK_ULPS).
        version: the records version whose solver arithmetic to follow: from 6 the fitted model's root
            where it applies (Newton's point only before: lambdas up to ~1e-10 apart); from 7 integer
            orders by products and the worst-case summation allowance (_ball_residual).
        lambdas: output, shape (N,): each teacher's lambda in [0, 1], the feasible end of its bracket.
        evaluations: output, int64 shape (N,): the residual evaluations each teacher took.
    """
    n, size = teachers.shape
    log_public = np.empty(size)
    _log_public(public, log_public)
    public_magnitude = 0.0
    for j in range(size):
        public_magnitude = vmax(public_magnitude, abs(log_public[j]) if public[j] > 0.0 else 0.0)
    smallest_public = np.inf
    for j in range(size):
        smallest_public = vmin(smallest_public, public[j] if public[j] > 0.0 else np.inf)
    normal_public = smallest_public >= NORMAL_PUBLIC
    smallest_target = 0.5 * math.sqrt(max_log_ratio) if max_log_ratio < np.inf else np.inf   # -residual at lam = 0
    curvature = 0.0   # the largest a (a - 1) / (2 target) over the order constraints
    for k in range(orders.size):
        smallest_target = min(smallest_target, math.sqrt(log_targets[k]))
        curvature = max(curvature, orders[k] * (orders[k] - 1.0) / (2.0 * log_targets[k]))
    for i in range(n):   # one thread: the decode loop's budget (a prange body here ran 20% slower)
        lambdas[i], evaluations[i] = _solve_teacher(teachers[i], public, log_public, orders, log_targets,
                                                    max_log_ratio, tolerance, max_evaluations, slack_ulps,
                                                    public_magnitude, smallest_target, curvature, normal_public,
                                                    version)


@jit(**_FLAGS)
def normalised_distributions(rows: FloatArray, out: FloatArray, sums: FloatArray) -> tuple[bool, bool, float]:
    """Each row divided by its sum, with what validating the rows as distributions needs, in two
    passes per row (dpledger.mechanisms.distributions.as_float64_array's checks, fused for large inputs).

    Args:
        rows: the rows, shape (R, V).
        out: output, shape (R, V): each row divided by its sum.
        sums: output, shape (R,): each row's sum.

    Returns:
        (whether some entry is NaN, whether every entry is finite, the smallest entry).
    """
    nan, infinite, smallest = 0.0, 0.0, np.inf
    for r in range(rows.shape[0]):
        row = rows[r]
        total = 0.0
        for j in range(row.size):
            value = row[j]
            total += value
            nan += 1.0 if value != value else 0.0
            infinite += 1.0 if abs(value) == np.inf else 0.0
            smallest = vmin(smallest, value)
        sums[r] = total
        target = out[r]
        for j in range(row.size):
            target[j] = row[j] / total
    return nan > 0.0, infinite == 0.0, smallest


def has_positive_below(values: FloatArray, below: float) -> bool:
    """Whether some entry of `values` (one-dimensional) lies in (0, below): one vectorised pass.

    Args:
        values: the numbers to scan, shape (M,).
        below: the bound.

    Returns:
        True where 0 < values_j < below for some j.
    """
    found = 0.0
    for j in prange(values.size):   # a count of ones: exact in any order, so the parallel twin agrees
        found += 1.0 if 0.0 < values[j] < below else 0.0
    return found > 0.0


has_positive_below_parallel = jit(**_PARALLEL_FLAGS)(_renamed(has_positive_below, "has_positive_below_parallel"))
has_positive_below = jit(**_FLAGS)(has_positive_below)
"""has_positive_below with the scan across threads, for the audit's ablation (_LeaveOneOut(parallel=True))."""


_CHUNK = 2048
"""Tokens per cache-resident chunk: every order's pass over a row reads the chunk from L1/L2, and the
leave-one-out ratios are formed chunk by chunk (in parallel)."""


def leave_one_out_log_ratios(teachers: FloatArray, public: FloatArray, lambdas: FloatArray, output: FloatArray,
                             log_output: FloatArray, ratios: FloatArray, log_ratios: FloatArray,
                             spans: FloatArray) -> bool:
    """The mixed teachers pbar_i = lambda_i p_i + (1 - lambda_i) p0 (never stored), their mean p and
    rho_ij = p_-i,j / p_j for every teacher i, p_-i = sum_{k != i} pbar_k / (N-1) formed from
    exclusive prefix and suffix sums (no subtraction: dpledger.mechanisms.kernels.sums_without_each says
    why). Tokens with p_j = 0 get rho = 1 and log p_j = -inf, so they add nothing; when every
    pbar_i is the same law (e.g. every lambda 0) every rho is exactly 1, although sum / N and
    sum / (N - 1) can differ in the last ulp. Writes output (V,) = p, log_output (V,), ratios and
    log_ratios (N, V) (ratios holds the sums first), and spans (N, 2): each row's smallest and
    largest log rho. Returns whether some positive rho lies outside RATIO_RANGE (its log was then
    taken from the logs).

    Args:
        teachers: the teachers' probabilities p_i, shape (N, V), N >= 2.
        public: the public model's probabilities p0, shape (V,).
        lambdas: each teacher's mixing weight lambda_i in [0, 1], shape (N,).
        output: output, shape (V,): the mean p of the mixed teachers.
        log_output: output, shape (V,): log p (-inf where p_j = 0).
        ratios: output, shape (N, V): rho_ij = p_-i,j / p_j.
        log_ratios: output, shape (N, V): log rho_ij.
        spans: output, shape (N, 2): each row's smallest and largest log rho.

    Returns:
        True where a positive ratio rho lies outside RATIO_RANGE.
    """
    n, size = teachers.shape
    chunks = (size + _CHUNK - 1) // _CHUNK
    # token chunks (across threads in the audit's parallel twin): every token's sums are formed within one chunk
    differs = np.zeros(chunks)
    for c in prange(chunks):
        start, stop = c * _CHUNK, min(size, (c + 1) * _CHUNK)
        chunk_public, chunk_output, chunk_log_output = public[start:stop], output[start:stop], log_output[start:stop]
        ratios[0, start:stop] = 0.0
        for i in range(1, n):
            _accumulate_mixed(ratios[i, start:stop], ratios[i - 1, start:stop], teachers[i - 1, start:stop],
                              chunk_public, lambdas[i - 1])
        suffix = np.zeros(stop - start)
        for i in range(n - 1, -1, -1):
            _add_into(ratios[i, start:stop], suffix)
            _accumulate_mixed(suffix, suffix, teachers[i, start:stop], chunk_public, lambdas[i])
        for j in range(stop - start):
            chunk_output[j] = suffix[j] / n
            chunk_log_output[j] = vlog(chunk_output[j])
        for i in range(1, n):
            if not _same_mixture(teachers[i, start:stop], lambdas[i], teachers[0, start:stop], lambdas[0], chunk_public):
                differs[c] = 1.0
                break
    identical = differs.sum() == 0.0
    extremes = np.zeros((chunks, n, 3))    # per chunk and row: smallest and largest log rho, outside RATIO_RANGE
    for c in prange(chunks):
        start, stop = c * _CHUNK, min(size, (c + 1) * _CHUNK)
        for i in range(n):
            if identical:
                ratios[i, start:stop] = 1.0
                log_ratios[i, start:stop] = 0.0
            else:
                low, high, row_outside = _ratio_row(ratios[i, start:stop], log_ratios[i, start:stop], output[start:stop],
                                                    log_output[start:stop], n - 1.0)
                extremes[c, i, 0], extremes[c, i, 1], extremes[c, i, 2] = low, high, 1.0 if row_outside else 0.0
    outside = False
    for i in range(n):
        low, high = 0.0, 0.0
        for c in range(chunks):
            low, high = min(low, extremes[c, i, 0]), max(high, extremes[c, i, 1])
            outside = outside or extremes[c, i, 2] > 0.0
        spans[i, 0], spans[i, 1] = low, high
    return outside

leave_one_out_log_ratios_parallel = jit(**_PARALLEL_FLAGS)(_renamed(leave_one_out_log_ratios,
                                                                     "leave_one_out_log_ratios_parallel"))
leave_one_out_log_ratios = jit(**_TRACE_FLAGS)(leave_one_out_log_ratios)
"""leave_one_out_log_ratios with its token chunks across threads, for the audit's ablation only (trace
kernels run serial: _TRACE_FLAGS)."""


@jit(**_HELPER_FLAGS)
def _accumulate_mixed(out: FloatArray, before: FloatArray, teacher: FloatArray, public: FloatArray,
                      lam: float) -> None:
    """out = before + lam * teacher + (1 - lam) * public, elementwise (out may be before)."""
    keep = 1.0 - lam
    for j in range(out.size):
        out[j] = before[j] + fma(lam, teacher[j], keep * public[j])


@jit(**_HELPER_FLAGS)
def _add_into(out: FloatArray, values: FloatArray) -> None:
    for j in range(out.size):
        out[j] += values[j]


@jit(**_HELPER_FLAGS)
def _same_mixture(teacher: FloatArray, lam: float, other: FloatArray, other_lam: float,
                  public: FloatArray) -> bool:
    for j in range(public.size):
        if fma(lam, teacher[j], (1.0 - lam) * public[j]) != fma(other_lam, other[j], (1.0 - other_lam) * public[j]):
            return False
    return True


RATIO_RANGE = (2.0 ** -1000, 2.0 ** 1000)
"""Ratios rho = p_-i / p inside this range are normal floats, accurate to an ulp; outside it a
ratio has lost digits (subnormal) or overflowed, and its log is taken as log p_-i - log p."""


@jit(**_HELPER_FLAGS)
def _ratio_row(sums: FloatArray, log_ratios: FloatArray, output: FloatArray, log_output: FloatArray,
               others: float) -> tuple[float, float, bool]:
    """sums (the other teachers' total) -> rho = (sums / others) / p in place, its logs; (min, max) log
    and whether a positive rho lies outside RATIO_RANGE."""
    low_ratio, high_ratio = RATIO_RANGE
    for j in range(sums.size):
        share = sums[j] / others
        ratio = share / output[j] if output[j] > 0.0 else 1.0
        sums[j] = ratio
        inside = low_ratio <= ratio <= high_ratio or ratio == 0.0 or output[j] == 0.0
        # one log either way (a select between two logs computes both)
        log_ratios[j] = vlog(ratio if inside else share) - (0.0 if inside else log_output[j])
    low, high, outside = 0.0, 0.0, 0.0
    for j in range(sums.size):   # a separate pass: with the stores above the loop does not vectorise
        low = vmin(low, log_ratios[j])
        high = vmax(high, log_ratios[j])
        outside += 1.0 if sums[j] > 0.0 and not (low_ratio <= sums[j] <= high_ratio) else 0.0
    return low, high, outside > 0.0


@jit(**_HELPER_FLAGS)
def _fast_moments(a: float, high: float, output: FloatArray, ratios: FloatArray, log_ratios: FloatArray,
                  sums: FloatArray) -> None:
    """One exp pair per token: y = (rho / rho_max)^a and 1 / y; reverse += p y, forward += p rho / y,
    and the a-derivative moments; sums = (forward, forward moment, reverse, reverse moment). The arrays
    are one chunk's slices, indexed from 0: a loop from a variable start keeps numba's negative-index
    wraparound and does not vectorise (2.7x slower)."""
    forward, forward_moment, reverse, reverse_moment = 0.0, 0.0, 0.0, 0.0
    for j in range(output.size):
        y, inverse = vexp_pair(a * (log_ratios[j] - high))
        v = output[j] * y
        w = output[j] * ratios[j] * inverse
        reverse += v
        forward += w
        reverse_moment += v * log_ratios[j]
        forward_moment -= w * log_ratios[j]
    sums[0] += forward
    sums[1] += forward_moment
    sums[2] += reverse
    sums[3] += reverse_moment


@jit(**_HELPER_FLAGS)
def _shifted_moments(a: float, top_forward: float, top_reverse: float, log_output: FloatArray,
                     log_ratios: FloatArray, sums: FloatArray) -> None:
    """Two exps per token, each shifted by its direction's largest exponent (one chunk's slices, as
    _fast_moments)."""
    forward, forward_moment, reverse, reverse_moment = 0.0, 0.0, 0.0, 0.0
    for j in range(log_output.size):
        w = vexp(log_output[j] + (1.0 - a) * log_ratios[j] - top_forward)
        v = vexp(log_output[j] + a * log_ratios[j] - top_reverse)
        forward += w
        reverse += v
        forward_moment -= w * log_ratios[j]
        reverse_moment += v * log_ratios[j]
    sums[0] += forward
    sums[1] += forward_moment
    sums[2] += reverse
    sums[3] += reverse_moment


@jit(**_HELPER_FLAGS)
def _largest_magnitude(values: FloatArray) -> float:
    """max_j |values_j| over the finite entries."""
    largest = 0.0
    for j in range(values.size):
        largest = vmax(largest, abs(values[j]) if values[j] > -np.inf else 0.0)
    return largest


@jit(**_HELPER_FLAGS)
def _largest_exponents(a: float, log_output: FloatArray, log_ratios: FloatArray) -> tuple[float, float]:
    top_forward, top_reverse = -np.inf, -np.inf
    for j in range(log_ratios.size):
        top_forward = vmax(top_forward, log_output[j] + (1.0 - a) * log_ratios[j])
        top_reverse = vmax(top_reverse, log_output[j] + a * log_ratios[j])
    return top_forward, top_reverse


@jit(**_TRACE_FLAGS)
def leave_one_out_log_moments(output: FloatArray, log_output: FloatArray, ratios: FloatArray, log_ratios: FloatArray,
                              spans: FloatArray, rows: IntArray, orders: FloatArray, wanted: BoolArray,
                              shifted_only: bool, slack_ulps: float, moments: FloatArray, slopes: FloatArray,
                              directions: FloatArray) -> None:
    """For each teacher in `rows` and order a: max over the two directions of
    g = log sum_j p_j^a q_j^(1-a) and log sum_j q_j^a p_j^(1-a) (q = p_-i), i.e. (a - 1) D<->_a(p, p_-i),
    rounded up, and the derivative in a of the larger one (a subgradient of the convex max).
    In terms of rho_j = q_j / p_j: forward sum_j p_j rho_j^(1-a), reverse sum_j p_j rho_j^a; when
    a times the row's log rho span is below _FAST_RANGE, both come from one exp pair per token (vexp_pair),
    y_j = (rho_j / rho_max)^a: reverse sum_j p_j y_j, forward sum_j p_j rho_j / y_j; otherwise from
    two-pass log-sum-exps. Every order is summed chunk by chunk, so a row is read from memory once.
    +inf where q_j = 0 < p_j (teacher i holds all of token j's mass); exactly 0 for q = p. Rounded up
    by slack_ulps * ((a + 1) (max_j |log p_j| + N + 2) + log2 V + 2 + |g|) + (V + 2) u: each exponent is off by
    ~(a + 1) ulps of its terms, the N-term sums behind rho by N ulps. Only the (row, order) pairs
    marked in `wanted` (rows x orders) are computed; the others are left as they are. With
    `shifted_only` every order takes the log-sum-exp path, which reads log p only (for inputs whose
    p itself is not accurate as a float: dpledger.mechanisms.kernels._LeaveOneOut).

    Args:
        output: the ensemble's output law p, shape (V,) (leave_one_out_log_ratios' `output`).
        log_output: log p, shape (V,).
        ratios: rho = p_-i / p, shape (N, V).
        log_ratios: log rho, shape (N, V).
        spans: each row's smallest and largest log rho, shape (N, 2).
        rows: the teachers i to compute, int64 indices into the N rows, shape (R,).
        orders: Renyi orders a > 1, shape (K,).
        wanted: which (row, order) pairs to compute, bool shape (R, K).
        shifted_only: take the log-sum-exp path at every order (reads log p and log rho only).
        slack_ulps: the rounding-up allowance, in ulps per unit of magnitude (kernels._SLACK_ULPS).
        moments: output, shape (R, K): g = (a - 1) D<->_a(p, p_-i), rounded up, >= 0 (+inf where
            q_j = 0 < p_j).
        slopes: output, shape (R, K): dg/da of the larger direction.
        directions: output, shape (R, K, 2), or (0, K, 2) for none: each direction's g apart, rounded
            up as `moments` (forward: (a - 1) D_a(p || p_-i), reverse: (a - 1) D_a(p_-i || p)); both
            +inf where q_j = 0 < p_j (the reverse is finite there: a caller that needs it alone
            computes it another way).
    """
    n, size = log_ratios.shape
    count = orders.size
    separate = directions.shape[0] == rows.size
    magnitude = _largest_magnitude(log_output) + n + 2.0
    for r in range(rows.size):
        i = rows[r]
        low, high = spans[i, 0], spans[i, 1]
        if low == 0.0 and high == 0.0:            # q = p: every neighbour's law is p itself
            for k in range(count):
                if wanted[r, k]:
                    moments[r, k], slopes[r, k] = 0.0, 0.0
                    if separate:
                        directions[r, k, 0], directions[r, k, 1] = 0.0, 0.0
            continue
        if low == -np.inf:                        # q_j = 0 < p_j
            for k in range(count):
                if wanted[r, k]:
                    moments[r, k], slopes[r, k] = np.inf, 0.0
                    if separate:
                        directions[r, k, 0], directions[r, k, 1] = np.inf, np.inf
            continue
        fast = np.empty(count, dtype=np.bool_)
        tops = np.zeros((count, 2))
        for k in range(count):
            a = orders[k]
            fast[k] = not shifted_only and a * (high - low) + abs(high) + math.log(size) < _FAST_RANGE
            if not fast[k] and wanted[r, k]:
                tops[k, 0], tops[k, 1] = _largest_exponents(a, log_output, log_ratios[i])
        sums = np.zeros((count, 4))
        for start in range(0, size, _CHUNK):
            stop = min(size, start + _CHUNK)
            chunk_output, chunk_log_output = output[start:stop], log_output[start:stop]
            chunk_ratios, chunk_log_ratios = ratios[i, start:stop], log_ratios[i, start:stop]
            for k in range(count):
                if not wanted[r, k]:
                    continue
                if fast[k]:
                    _fast_moments(orders[k], high, chunk_output, chunk_ratios, chunk_log_ratios, sums[k])
                else:
                    _shifted_moments(orders[k], tops[k, 0], tops[k, 1], chunk_log_output, chunk_log_ratios, sums[k])
        for k in range(count):
            a = orders[k]
            if not wanted[r, k]:
                continue
            if fast[k]:
                forward = math.log(sums[k, 0]) - a * high
                reverse = math.log(sums[k, 2]) + a * high
            else:
                forward = math.log(sums[k, 0]) + tops[k, 0]
                reverse = math.log(sums[k, 2]) + tops[k, 1]
            value = max(forward, reverse)
            slopes[r, k] = sums[k, 1] / sums[k, 0] if forward >= reverse else sums[k, 3] / sums[k, 2]
            # the row's log-rho span joins the magnitude: the shifted exponents a (log rho - max) reach it
            common = slack_ulps * ((a + 1.0) * (magnitude + high - low) + math.log2(size) + 2.0) + (size + 2.0) * _UNIT
            moments[r, k] = max(value + common + slack_ulps * abs(value), 0.0)
            if separate:
                directions[r, k, 0] = max(forward + common + slack_ulps * abs(forward), 0.0)
                directions[r, k, 1] = max(reverse + common + slack_ulps * abs(reverse), 0.0)


_POWER_CHUNK = 512
"""Tokens per chunk of _power_sums: its rows of powers stay in L1/L2 across the orders."""

_POWER_LEVELS = 13
"""y^(2^b) for b < 13: steps between consecutive quarter multiples up to 8191 (orders 2,048 apart)."""


@jit(**_HELPER_FLAGS)
def _power_sums(quarters: IntArray, inverse_denominator: float, high: float, output: FloatArray, ratios: FloatArray,
                log_ratios: FloatArray, ups: FloatArray, downs: FloatArray, power: FloatArray, inverse: FloatArray,
                sums: FloatArray) -> None:
    """One chunk's forward and reverse sums at the orders a_k = quarters_k / d (increasing; d the lattice's
    denominator, 4 for quarters, 10 for tenths, inverse_denominator = 1 / d) from one exp pair per token:
    y = (rho / rho_max)^(1/d) and 1 / y, their squarings y^(2^b), and then y^(d a) and y^(-d a) by
    products, each order's from the previous one's times y^(quarters_k - quarters_(k-1)), one multiply per
    set bit of the step. sums[k] = (forward sum p rho y^(-d a), reverse sum p y^(d a)). ups and downs hold
    _POWER_LEVELS rows of the chunk's width back to back; power and inverse one each."""
    size = output.size
    levels = 1
    previous = 0
    for k in range(quarters.size):
        difference = quarters[k] - previous
        previous = quarters[k]
        while (1 << levels) <= difference:
            levels += 1
    for j in range(size):
        y, z = vexp_pair(inverse_denominator * (log_ratios[j] - high))
        ups[j], downs[j], power[j], inverse[j] = y, z, 1.0, 1.0
    for b in range(1, levels):
        below_up, below_down = ups[(b - 1) * size:b * size], downs[(b - 1) * size:b * size]
        level_up, level_down = ups[b * size:(b + 1) * size], downs[b * size:(b + 1) * size]
        for j in range(size):
            level_up[j] = below_up[j] * below_up[j]
            level_down[j] = below_down[j] * below_down[j]
    previous = 0
    for k in range(quarters.size):
        difference = quarters[k] - previous
        previous = quarters[k]
        last = 0
        for b in range(levels):
            if difference >> b & 1:
                last = b
        for b in range(last):          # every set bit but the highest: a multiply pass
            if difference >> b & 1:
                level_up, level_down = ups[b * size:(b + 1) * size], downs[b * size:(b + 1) * size]
                for j in range(size):
                    power[j] *= level_up[j]
                    inverse[j] *= level_down[j]
        level_up, level_down = ups[last * size:(last + 1) * size], downs[last * size:(last + 1) * size]
        forward, reverse = 0.0, 0.0
        for j in range(size):          # the highest bit's multiply and the sums in one pass
            power[j] *= level_up[j]
            inverse[j] *= level_down[j]
            reverse += output[j] * power[j]
            forward += output[j] * ratios[j] * inverse[j]
        sums[k, 0] += forward
        sums[k, 1] += reverse


@jit(**_PARALLEL_FLAGS)
def leave_one_out_direction_power_moments(output: FloatArray, log_output: FloatArray, ratios: FloatArray,
                                          log_ratios: FloatArray, spans: FloatArray, rows: IntArray, orders: FloatArray,
                                          shifted_only: bool, slack_ulps: float, denominator: float,
                                          directions: FloatArray) -> None:
    """leave_one_out_log_moments' `directions` alone, for increasing orders on the lattice of multiples
    of 1/d (the audit's orders: quarters, d = 4; the default grid: tenths, d = 10): where a row's order is
    in the fast range, its two sums come from one exp pair per token for all such orders together
    (_power_sums: y^(d a) by products), elsewhere from the two-pass log-sum-exp as there. Rounded up by
    leave_one_out_log_moments' allowance plus the products' rounding, stated apart: y = exp(x / d) (x =
    log rho - log rho_max) is within 3 (|x| / d) u + 4u of its value (x's rounding, 1/d's and the multiply's,
    each relative to x / d, and vexp's 2 ulps), and a product of factors whose exponents sum to e, each
    within e_i of its value, is within sum_i e_i + (e - 1) u (by induction over the products and squarings,
    each rounding u), so y^(d a) is within 3 a |x| u + 4 d a u + (d a - 1) u: the 3 a |x| u is within the
    allowance's (a + 1) (M + span) term (8 ulps per unit, as for the exp path's exponent), and 6 d a u
    more is added to each direction's log (a relative error e of every term moves log sum by at most
    -log(1 - e) < 1.01 e while e < 0.01). The powers are those of the lattice point e / d nearest the
    float order a (1.1 is not 11/10), which moves each shifted exponent by at most |a - e/d| times the
    row's log-rho span: added too.

    Args:
        output, log_output, ratios, log_ratios, spans, rows: as leave_one_out_log_moments.
        orders: Renyi orders a > 1, increasing, each a multiple of 1 / denominator, shape (K,).
        shifted_only: take the log-sum-exp path at every order.
        slack_ulps: the rounding-up allowance, in ulps per unit of magnitude (kernels._SLACK_ULPS).
        denominator: d, the lattice's (4 or 10; a positive integer).
        directions: output, shape (R, K, 2): forward (a - 1) D_a(p || p_-i) and reverse
            (a - 1) D_a(p_-i || p), rounded up; both +inf where q_j = 0 < p_j.
    """
    n, size = log_ratios.shape
    count = orders.size
    magnitude = _largest_magnitude(log_output) + n + 2.0
    quarters_all = np.empty(count, dtype=np.int64)
    for k in range(count):
        quarters_all[k] = int(round(denominator * orders[k]))
    for r in prange(rows.size):
        i = rows[r]
        low, high = spans[i, 0], spans[i, 1]
        if low == 0.0 and high == 0.0:            # q = p
            for k in range(count):
                directions[r, k, 0], directions[r, k, 1] = 0.0, 0.0
            continue
        if low == -np.inf:                        # q_j = 0 < p_j
            for k in range(count):
                directions[r, k, 0], directions[r, k, 1] = np.inf, np.inf
            continue
        fast_count = 0                             # the fast orders are the smallest ones: a prefix
        for k in range(count):
            if not shifted_only and orders[k] * (high - low) + abs(high) + math.log(size) < _FAST_RANGE:
                fast_count = k + 1
        tops = np.zeros((count, 2))
        for k in range(fast_count, count):
            tops[k, 0], tops[k, 1] = _largest_exponents(orders[k], log_output, log_ratios[i])
        fast_sums = np.zeros((count, 2))
        slow_sums = np.zeros((count, 4))
        ups, downs = np.empty(_POWER_LEVELS * _POWER_CHUNK), np.empty(_POWER_LEVELS * _POWER_CHUNK)
        power, inverse = np.empty(_POWER_CHUNK), np.empty(_POWER_CHUNK)
        for start in range(0, size, _POWER_CHUNK):
            stop = min(size, start + _POWER_CHUNK)
            chunk_output, chunk_log_output = output[start:stop], log_output[start:stop]
            chunk_ratios, chunk_log_ratios = ratios[i, start:stop], log_ratios[i, start:stop]
            if fast_count > 0:
                width = stop - start
                _power_sums(quarters_all[:fast_count], 1.0 / denominator, high, chunk_output, chunk_ratios,
                            chunk_log_ratios,
                            ups[:_POWER_LEVELS * width], downs[:_POWER_LEVELS * width], power[:width], inverse[:width],
                            fast_sums)
            for k in range(fast_count, count):
                _shifted_moments(orders[k], tops[k, 0], tops[k, 1], chunk_log_output, chunk_log_ratios, slow_sums[k])
        for k in range(count):
            a = orders[k]
            if k < fast_count:
                forward = math.log(fast_sums[k, 0]) - a * high
                reverse = math.log(fast_sums[k, 1]) + a * high
            else:
                forward = math.log(slow_sums[k, 0]) + tops[k, 0]
                reverse = math.log(slow_sums[k, 2]) + tops[k, 1]
            common = slack_ulps * ((a + 1.0) * (magnitude + high - low) + math.log2(size) + 2.0) + (size + 2.0) * _UNIT
            if k < fast_count:   # the products' rounding, and the float order's gap to its lattice point
                common += 6.0 * denominator * a * _UNIT + abs(a - quarters_all[k] / denominator) * (high - low)
            directions[r, k, 0] = max(forward + common + slack_ulps * abs(forward), 0.0)
            directions[r, k, 1] = max(reverse + common + slack_ulps * abs(reverse), 0.0)


_EXACT_FLAGS: JitOptions = dict(error_model="numpy", cache=True, nogil=True)
"""No fastmath: the sub-grid's bookkeeping performs numpy's IEEE operations in numpy's order."""
_EXACT_HELPER_FLAGS: JitOptions = {**_EXACT_FLAGS, "inline": "always"}


@jit(**_EXACT_FLAGS)
def _chords_and_floor(grid: FloatArray, done: BoolArray, upper: FloatArray, slope: FloatArray, chord_factor: float,
                      chords: FloatArray, bound: FloatArray, floor: FloatArray) -> None:
    """Every teacher's chord between the sub-grid orders (`done`) enclosing each grid order, times
    chord_factor (the value itself at a sub-grid order): chords (n, K); their max over teachers:
    bound (K,); the max over evaluated teachers of their tangents at the two enclosing orders, at
    least 0 (the bound itself at a sub-grid order): floor (K,). NaN tangents (unevaluated) count as -inf."""
    n, size = upper.shape
    anchors = np.flatnonzero(done)
    for q in range(size):
        position = int(np.searchsorted(anchors, q, side="right")) - 1
        position = min(max(position, 0), anchors.size - 2)
        left, right = anchors[position], anchors[position + 1]
        weight = (grid[q] - grid[left]) / (grid[right] - grid[left])
        best, tangent_best = -np.inf, -np.inf
        for i in range(n):
            if done[q]:
                chord = upper[i, q]
            else:
                chord = ((1.0 - weight) * upper[i, left] + weight * upper[i, right]) * chord_factor
            chords[i, q] = chord
            best = chord if (chord > best or chord != chord) else best
            if best != best:
                best = np.nan
            at_left = upper[i, left] + slope[i, left] * (grid[q] - grid[left])
            at_right = upper[i, right] + slope[i, right] * (grid[q] - grid[right])
            tangent = np.nan if (at_left != at_left or at_right != at_right) else max(at_left, at_right)
            if tangent == tangent and tangent > tangent_best:
                tangent_best = tangent
        bound[q] = best
        value = best if done[q] else tangent_best
        floor[q] = value if (value != value or value > 0.0) else 0.0


@jit(**_EXACT_HELPER_FLAGS)
def _fmax(x: float, y: float) -> float:
    """numpy's fmax: the larger, ignoring a NaN (NaN only where both are)."""
    if y != y:
        return x
    if x != x:
        return y
    return x if x >= y else y


@jit(**_EXACT_FLAGS)
def convex_sandwich(grid: FloatArray, done: BoolArray, values: FloatArray, slopes: FloatArray, has_slopes: bool,
                    rounding_ulps: float, chord: FloatArray, rounding: FloatArray, lower: FloatArray) -> None:
    """dpledger.mechanisms.add_one's sandwich of a function convex in the order, each row on its own anchors,
    compiled: the numpy form's operations (tests/straightforward.py keeps it) on the same numbers in the
    same order, element by element (no fastmath: IEEE operations, no fused multiply-adds). Per row r and
    grid order q, with `done[r]` the row's anchors (at least two) and left, right the anchors enclosing q
    (for the last anchor, the two last): the chord between them, its rounding bound
    4 rounding_ulps (|(1 - w) v_left| + |w v_right|), and the lower bound, the largest (NaN ignored) of the
    neighbouring chords' extensions and, with `has_slopes`, the tangents at left and right. At an anchor
    all three are its value (rounding 0); a row holding +inf at an anchor is +inf (rounding 0) throughout.

    Args:
        grid: the orders, increasing, shape (K,).
        done: each row's anchors, bool (R, K).
        values: the function at the anchors, (R, K) (read at anchors only).
        slopes: its derivatives there, (R, K) (read only with has_slopes).
        has_slopes: whether the tangents join the lower bound.
        rounding_ulps: dpledger.accounting.rounding.ROUNDING_ULPS.
        chord, rounding, lower: outputs, (R, K).
    """
    rows, size = values.shape
    anchors = np.empty(size, dtype=np.int64)
    for r in range(rows):
        count = 0
        infinite = False
        for q in range(size):
            if done[r, q]:
                anchors[count] = q
                count += 1
                infinite = infinite or values[r, q] == np.inf
        position = 0
        for q in range(size):
            while position + 1 < count and anchors[position + 1] <= q:
                position += 1
            at = min(position, count - 2)
            left, right = anchors[at], anchors[at + 1]
            if infinite:
                chord[r, q], rounding[r, q], lower[r, q] = np.inf, 0.0, np.inf
                continue
            if done[r, q]:
                chord[r, q], rounding[r, q], lower[r, q] = values[r, q], 0.0, values[r, q]
                continue
            weight = (grid[q] - grid[left]) / (grid[right] - grid[left])
            a_left, a_right = values[r, left], values[r, right]
            chord[r, q] = (1.0 - weight) * a_left + weight * a_right
            rounding[r, q] = 4.0 * rounding_ulps * (abs((1.0 - weight) * a_left) + abs(weight * a_right))
            floor = -np.inf
            if at >= 1:   # the chord before, extended
                b = anchors[at - 1]
                slope = (values[r, left] - values[r, b]) / (grid[left] - grid[b])
                floor = _fmax(floor, values[r, b] + slope * (grid[q] - grid[b]))
            if at + 2 < count:   # the chord after, extended
                c = anchors[at + 2]
                slope = (values[r, c] - values[r, right]) / (grid[c] - grid[right])
                floor = _fmax(floor, values[r, right] + slope * (grid[q] - grid[right]))
            if has_slopes:
                floor = _fmax(floor, values[r, left] + slopes[r, left] * (grid[q] - grid[left]))
                floor = _fmax(floor, values[r, right] + slopes[r, right] * (grid[q] - grid[right]))
            lower[r, q] = floor


@jit(**_EXACT_HELPER_FLAGS)
def _nan_min(x: float, y: float) -> float:
    """numpy's minimum of two: NaN if either is."""
    if x != x or y != y:
        return np.nan
    return x if x <= y else y


@jit(**_EXACT_HELPER_FLAGS)
def _log_mean_with_one_exp(x: float, n: float) -> float:
    """dpledger.mechanisms.log_space.log_mean_with_one_exp for one value, with the C library's expm1,
    log1p, exp and log: log1p(expm1(x) / n) for x <= 700, x - log n + log1p((n - 1) e^-x) above (NaN
    stays NaN, +inf stays +inf)."""
    if x <= 700.0:
        return math.log1p(math.expm1(x) / n)
    return x - math.log(n) + math.log1p((n - 1.0) * math.exp(-x))


@jit(**_EXACT_HELPER_FLAGS)
def _add_one_forward_allowances(u2: float, chord: float, k: float, q: int, lattice_u2: FloatArray,
                                lattice_chord: FloatArray, slack: float, allocation_magnitude: float,
                                magnitude: float, chord_magnitude: float, summation: float, log_size: float,
                                shift_error: float, rounding_ulps: float) -> tuple[float, float]:
    """The rounding allowances of (k - 1) U2_k's computed sum (with (k - 1) slack) and of the chord sum's
    at order k = grid[q], as dpledger.mechanisms.add_one.add_one_direction_bounds states them (a nonfinite
    sum contributes 0 to its own term), the chord's with k times the shifts' error bound (add_one_shifts:
    each of its terms is exp of its shift times k)."""
    u2_size = abs(u2) if math.isfinite(u2) else 0.0
    chord_size = abs(chord) if math.isfinite(chord) else 0.0
    u2_allowance = (rounding_ulps * (u2_size + allocation_magnitude + (k - 1.0) * (magnitude + 4.0) + log_size)
                    + lattice_u2[q] + summation)
    chord_allowance = (rounding_ulps * (chord_size + k * (chord_magnitude + 4.0) + log_size)
                       + lattice_chord[q] + summation + k * shift_error)
    return (k - 1.0) * slack + u2_allowance, chord_allowance


@jit(**_EXACT_HELPER_FLAGS)
def _add_one_forward_bound(u2: float, chord: float, k: float, q: int, ball: FloatArray, row: FloatArray,
                           lattice_u2: FloatArray, lattice_chord: FloatArray, rounding_ulps: float) -> float:
    """The forward add-one bound at order k = grid[q] from the two sums there (nondecreasing in each):
    min(Jensen's bound through min(U1_k, U2_k), the chord bound), add_one_direction_bounds' formula.
    ball = (alpha, radius, beta, 1 where beta bounds the ball at every order else 0); row as add_one_forward_round."""
    alpha, radius, beta = ball[0], ball[1], ball[2]
    log_m, max_ratio, slack, mass_term, teachers = row[0], row[1], row[2], row[3], row[4]
    u2_allowance, chord_allowance = _add_one_forward_allowances(u2, chord, k, q, lattice_u2, lattice_chord, 0.0,
                                                                row[5], row[6], row[7], row[8], row[9],
                                                                row[10], rounding_ulps)
    rho = radius if k <= alpha else ((alpha - 1.0) * radius + (k - alpha) * log_m) / (k - 1.0)
    if ball[3] > 0.0:   # (a NaN beta makes the bound NaN, which the caller refuses)
        rho = _nan_min(rho, beta * k)
    u = _nan_min(rho + max_ratio, (u2 + u2_allowance) / (k - 1.0)) + slack
    jensen = (_log_mean_with_one_exp((k - 1.0) * u, teachers + 1.0) + mass_term) / (k - 1.0)
    return _nan_min(jensen, (chord + chord_allowance) / (k - 1.0))


@jit(**_EXACT_FLAGS)
def add_one_forward_round(grid: FloatArray, index: IntArray, u2: FloatArray, chord: FloatArray, u2_slope: FloatArray,
                          chord_slope: FloatArray, done: BoolArray, known: FloatArray, slopes: FloatArray,
                          ball: FloatArray, row: FloatArray, lattice_u2: FloatArray, lattice_chord: FloatArray,
                          tolerance: float, rounding_ulps: float, out: FloatArray) -> IntArray:
    """One round of the forward add-one bound's sub-grid for one row (records version >= 10), compiled:
    dpledger.mechanisms.add_one.add_one_direction_bounds' certificate and bisection, as the numpy form of
    version 9 runs them (_order_curve_on_subgrid), with the C library's exp, expm1, log and log1p in place
    of numpy's (whose vectorised forms may differ in the last bits: hence a records version). It takes in
    the two sums and their slopes at the orders grid[index] (the last evaluation) and then either finishes,
    writing the bound at every order into `out` and returning an empty array, or returns the orders to
    evaluate next: the midpoint of every interval of anchors holding an order whose value from the chords
    (each plus its rounding, the larger allowance of its two anchors and the allowance at the order) is
    above (1 + tolerance) times its value from the lower sandwich (tangents and neighbouring chords,
    dpledger.mechanisms.add_one._sandwich). The forward bound is nondecreasing in each sum, so the first is
    an upper bound on computing that order, the second a lower bound on it. The caller evaluates the sums
    with the fused kernels from Python (refinement_round says why not from here).

    Args:
        grid: the Renyi orders k > 1, strictly increasing, shape (K,).
        index: the grid indices evaluated last, int64 (M,).
        u2, chord, u2_slope, chord_slope: (k - 1) U2_k, the chord sum and their derivatives in k there, (M,).
        done: state, bool (1, K), all False at the start: the anchors.
        known, slopes: state, (2, K): the sums (u2, chord) and their slopes at the anchors.
        ball: (alpha, radius, beta of the all-orders ball, 1 with that ball else 0), shape (4,).
        row: the row's terms, shape (11,): log M, max_j log(p0_j / p_j), slack (a rounding allowance on
            U_k), the Jensen step's mass term log1p(e) (1 + 2u), N, and the allowances' scales: the largest
            |log a_j|, the largest log t_j, that plus |log w0|, the sums' worst-case summation error
            ((M + 2) u), 2 log2(V + 1) and the shifts' error bound (add_one_shifts).
        lattice_u2, lattice_chord: the power path's allowances at every grid order (add_one_lattice_allowances), (K,).
        tolerance: the certificate's relative gap (> 0).
        rounding_ulps: dpledger.accounting.rounding.ROUNDING_ULPS.
        out: output, shape (K,): the bound at every order, when the round finishes.

    Returns:
        The next grid indices to evaluate, increasing; empty when `out` holds the curve.
    """
    size = grid.size
    for m in range(index.size):
        q = index[m]
        known[0, q], known[1, q], slopes[0, q], slopes[1, q] = u2[m], chord[m], u2_slope[m], chord_slope[m]
        done[0, q] = True
    slack = row[2]
    allocation_magnitude, magnitude, chord_magnitude, summation, log_size = row[5], row[6], row[7], row[8], row[9]
    shift_error = row[10]
    count = 0
    for q in range(size):
        count += done[0, q]
    if count == size:
        for q in range(size):
            out[q] = _add_one_forward_bound(known[0, q], known[1, q], grid[q], q, ball, row, lattice_u2,
                                            lattice_chord, rounding_ulps)
        return np.empty(0, dtype=np.int64)
    chords, rounding, lower = np.empty((2, size)), np.empty((2, size)), np.empty((2, size))
    for s in range(2):
        convex_sandwich(grid, done, known[s:s + 1], slopes[s:s + 1], True, rounding_ulps, chords[s:s + 1],
                        rounding[s:s + 1], lower[s:s + 1])
    anchors = np.flatnonzero(done[0])
    midpoints = np.zeros(size, dtype=np.bool_)
    failing = False
    position = 0
    for q in range(size):
        k = grid[q]
        while position + 2 < anchors.size and anchors[position + 1] <= q:
            position += 1
        left, right = anchors[position], anchors[position + 1]
        u2_chord, chord_chord = chords[0, q] + rounding[0, q], chords[1, q] + rounding[1, q]
        if not done[0, q]:   # the chords' own allowance and the larger of their anchors'
            u2_here, chord_here = _add_one_forward_allowances(u2_chord, chord_chord, k, q, lattice_u2, lattice_chord,
                                                              slack, allocation_magnitude, magnitude, chord_magnitude,
                                                              summation, log_size, shift_error, rounding_ulps)
            u2_left, chord_left = _add_one_forward_allowances(known[0, left], known[1, left], grid[left], left,
                                                              lattice_u2, lattice_chord, slack, allocation_magnitude,
                                                              magnitude, chord_magnitude, summation, log_size,
                                                              shift_error, rounding_ulps)
            u2_right, chord_right = _add_one_forward_allowances(known[0, right], known[1, right], grid[right], right,
                                                                lattice_u2, lattice_chord, slack, allocation_magnitude,
                                                                magnitude, chord_magnitude, summation, log_size,
                                                                shift_error, rounding_ulps)
            u2_chord = u2_chord + (u2_here + _nan_max(u2_left, u2_right))
            chord_chord = chord_chord + (chord_here + _nan_max(chord_left, chord_right))
        upper = _add_one_forward_bound(u2_chord, chord_chord, k, q, ball, row, lattice_u2, lattice_chord,
                                       rounding_ulps)
        floor = _add_one_forward_bound(lower[0, q], lower[1, q], k, q, ball, row, lattice_u2, lattice_chord,
                                       rounding_ulps)
        out[q] = upper
        if not done[0, q] and not upper <= (1.0 + tolerance) * _fmax(floor, 0.0) + 1e-300:
            failing = True
            middle = anchors[position] + anchors[position + 1]
            midpoints[middle // 2] = True
    if not failing:
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero(midpoints).astype(np.int64)



@jit(**_EXACT_FLAGS)
def add_one_token_bounds(log_p: FloatArray, log_p0: FloatArray, alpha: float, log_r: float, log_qmax: FloatArray,
                         log_qmin: FloatArray, ratio_q_p: FloatArray, row_maxima: FloatArray) -> None:
    """dpledger.mechanisms.add_one.add_one_direction_bounds' per-token ball limits and their row maxima in
    one pass, compiled with numpy's IEEE operations in numpy's order (no fastmath; the numpy form is kept in
    tests/straightforward.py). Per row and token j, with public tokens those where log p0_j is finite
    (elsewhere the three outputs are -inf):
    log qmax_j = min(0, (log_r + (alpha - 1) log p0_j) / alpha) (NaN where that is, as np.minimum keeps it),
    log qmin_j = (alpha log p0_j - log_r) / (alpha - 1), log(qmax_j / p_j) = log qmax_j - log p_j.
    row_maxima (R, 6): max_j log(qmax_j / p0_j)
    (log M), max_j log(p0_j / p_j), max |log p_j| over finite log p_j, max |log p0_j| over public tokens,
    max |log qmin_j| over finite values, max |log(qmax_j / p_j)| over finite values; a maximum over no
    token is -inf (the first two) or 0, and a NaN among the first two's terms makes it NaN (as numpy's max).

    Args:
        log_p: log p, (R, V).
        log_p0: log p0, (R, V).
        alpha: the ball's order (> 1).
        log_r: (alpha - 1) radius.
        log_qmax, log_qmin, ratio_q_p: outputs, (R, V).
        row_maxima: output, (R, 6).
    """
    rows, size = log_p.shape
    for r in range(rows):
        log_m, max_ratio, top_p, top_p0, top_qmin, top_t = -np.inf, -np.inf, 0.0, 0.0, 0.0, 0.0
        for j in range(size):
            p, p0 = log_p[r, j], log_p0[r, j]
            if p - p == 0.0:   # finite (neither inf nor NaN)
                top_p = max(top_p, abs(p))
            if not (p0 - p0 == 0.0):
                log_qmax[r, j], log_qmin[r, j], ratio_q_p[r, j] = -np.inf, -np.inf, -np.inf
                continue
            cap = (log_r + (alpha - 1.0) * p0) / alpha
            cap = cap if (cap < 0.0 or cap != cap) else 0.0   # np.minimum(0, cap): a NaN stays NaN
            floor = (alpha * p0 - log_r) / (alpha - 1.0)
            log_qmax[r, j], log_qmin[r, j] = cap, floor
            ratio_q_p[r, j] = cap - p
            log_m = _nan_max(log_m, cap - p0)
            max_ratio = _nan_max(max_ratio, p0 - p)
            top_p0 = max(top_p0, abs(p0))
            if floor - floor == 0.0:
                top_qmin = max(top_qmin, abs(floor))
            if ratio_q_p[r, j] - ratio_q_p[r, j] == 0.0:
                top_t = max(top_t, abs(ratio_q_p[r, j]))
        row_maxima[r, 0], row_maxima[r, 1], row_maxima[r, 2] = log_m, max_ratio, top_p
        row_maxima[r, 3], row_maxima[r, 4], row_maxima[r, 5] = top_p0, top_qmin, top_t


@jit(**_EXACT_FLAGS)
def allocated_tokens_of(log_allocation: FloatArray, log_t: FloatArray) -> tuple[FloatArray, FloatArray, bool, float]:
    """One row's tokens the fractional knapsack allocates mass to (finite log a_j), compacted in their
    order: (log a_j, log t_j, whether some such t_j is +inf, max_j |log a_j| (0 for none)); what
    dpledger.mechanisms.add_one._AllocatedTokens formed with numpy's masks (exact: copies and a maximum).

    Args:
        log_allocation: log a_j per token, -inf where none, shape (V,).
        log_t: log t_j per token, shape (V,).

    Returns:
        (log a (M,), log t (M,), whether a log t there is +inf, the largest |log a|).
    """
    count = 0
    for j in range(log_allocation.size):
        if log_allocation[j] - log_allocation[j] == 0.0:   # finite
            count += 1
    allocation, ratios = np.empty(count), np.empty(count)
    infinite, magnitude, m = False, 0.0, 0
    for j in range(log_allocation.size):
        if log_allocation[j] - log_allocation[j] == 0.0:
            allocation[m], ratios[m] = log_allocation[j], log_t[j]
            infinite = infinite or log_t[j] == np.inf
            magnitude = max(magnitude, abs(log_allocation[j]))
            m += 1
    return allocation, ratios, infinite, magnitude


@jit(**_EXACT_FLAGS)
def finite_magnitude(values: FloatArray, checked: FloatArray) -> tuple[float, bool]:
    """(max_j |values_j| over the finite entries, 0 for none; whether `checked` holds a NaN), in one pass
    each (exact: a maximum and comparisons).

    Args:
        values: any float64 array, shape (V,).
        checked: any float64 array, shape (M,).

    Returns:
        (the largest finite magnitude, whether a NaN is in `checked`).
    """
    largest = 0.0
    for j in range(values.size):
        if values[j] - values[j] == 0.0:
            largest = max(largest, abs(values[j]))
    nan = False
    for j in range(checked.size):
        nan = nan or checked[j] != checked[j]
    return largest, nan


@jit(**_EXACT_HELPER_FLAGS)
def _nan_max(x: float, y: float) -> float:
    """numpy's max of two: NaN if either is."""
    if x != x or y != y:
        return np.nan
    return x if x >= y else y


@jit(**_EXACT_FLAGS)
def refinement_round(grid: FloatArray, tolerance: float, chord_factor: float, slack_ulps: float, magnitude: float,
                     vocabulary: int, seeding: bool, picked: IntArray, new: IntArray, wanted: BoolArray,
                     value: FloatArray, derivative: FloatArray, upper: FloatArray, slope: FloatArray,
                     values: FloatArray, exact: BoolArray) -> tuple[IntArray, IntArray, BoolArray]:
    """One round of dpledger.mechanisms.leave_one_out.leave_one_out_curve's refinement, compiled: it
    takes in the moments the previous round asked for (rows `picked` x orders `new`, where `wanted`;
    with `seeding`, the seed orders for every teacher, and then +inf everywhere where one is +inf),
    then either finishes, writing the curve's moments g = (a - 1) D into `values` (exact on the
    sub-grid, chords plus twice the kernel's allowance between) and returning empty arrays, or
    returns the next (picked, new, wanted): every interval whose certificate fails (chord bound above
    (1 + tolerance) times the tangent floor) is bisected, and its new order is evaluated for the
    teachers whose chord there is above the floor (and the largest chord's). The caller evaluates them
    with leave_one_out_log_moments from Python: called from compiled code, that fused kernel would be
    linked into this one and optimised again, giving other last bits in a process that loads this
    kernel from the cache than in one that compiles it (dpledger.mechanisms.fused, _HELPER_FLAGS).
    The same operations, in the same order, as the numpy form it replaces (tests/straightforward.py
    keeps that form; tests hold the two equal).

    Args:
        grid: the Renyi orders a > 1, increasing, shape (K,).
        tolerance: the certificate's relative gap between the chord bound and the tangent floor.
        chord_factor: the factor rounding a chord up (1 + 4 ROUNDING_ULPS).
        slack_ulps: the rounding-up allowance, in ulps per unit of magnitude (kernels._SLACK_ULPS).
        magnitude: the kernel's rounding scale (_LeaveOneOut.magnitude).
        vocabulary: V, the number of tokens the moments sum over.
        seeding: this round takes in the seed orders (the first sub-grid).
        picked: the teachers evaluated last, int64 (R,).
        new: the grid indices evaluated last, int64 (M,), increasing.
        wanted: which (teacher, order) pairs were evaluated, bool (R, M).
        value, derivative: their moments and slopes (leave_one_out_log_moments' outputs), (R, M).
        upper, slope: state across rounds, (N, K), NaN at the start: each teacher's moment (or chord)
            and slope at every order.
        values: output, shape (K,): the moments g when the refinement finishes.
        exact: state and output, shape (K,), all False at the start: the sub-grid.

    Returns:
        The next round's (picked, new, wanted); new is empty when `values` holds the curve.
    """
    n, size = upper.shape
    none = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty((0, 0), dtype=np.bool_))
    for r in range(picked.size):
        for m in range(new.size):
            if wanted[r, m]:
                upper[picked[r], new[m]], slope[picked[r], new[m]] = value[r, m], derivative[r, m]
    for m in range(new.size):
        exact[new[m]] = True
    if seeding:
        infinite = False
        for r in range(picked.size):
            for m in range(new.size):
                infinite = infinite or value[r, m] == np.inf
        if infinite:
            for q in range(size):
                values[q] = np.inf
            return none
    chords = np.empty((n, size))
    bound = np.empty(size)
    floor = np.empty(size)
    if not exact.all():
        _chords_and_floor(grid, exact, upper, slope, chord_factor, chords, bound, floor)
        anchors = np.flatnonzero(exact)
        new_flags = np.zeros(size, dtype=np.bool_)
        failing = False
        for q in range(size):
            if not exact[q] and bound[q] - (1.0 + tolerance) * floor[q] > 1e-300:
                failing = True
                position = np.searchsorted(anchors, q) - 1
                new_flags[(anchors[position] + anchors[position + 1]) // 2] = True
        if failing:
            following = np.flatnonzero(new_flags)
            candidates = np.zeros((n, following.size), dtype=np.bool_)
            for m in range(following.size):
                q = following[m]
                top = 0
                for i in range(n):
                    candidates[i, m] = chords[i, q] > floor[q]
                    if chords[i, q] > chords[top, q]:
                        top = i
                candidates[top, m] = True
            chosen = np.zeros(n, dtype=np.bool_)
            for i in range(n):
                for m in range(following.size):
                    chosen[i] = chosen[i] or candidates[i, m]
            next_picked = np.flatnonzero(chosen)
            for i in range(n):
                for m in range(following.size):
                    upper[i, following[m]] = chords[i, following[m]]
            next_wanted = np.empty((next_picked.size, following.size), dtype=np.bool_)
            for r in range(next_picked.size):
                for m in range(following.size):
                    next_wanted[r, m] = candidates[next_picked[r], m]
            return next_picked.astype(np.int64), following.astype(np.int64), next_wanted
    if exact.all():
        for q in range(size):
            largest = upper[0, q]
            for i in range(1, n):
                largest = upper[i, q] if (upper[i, q] > largest or upper[i, q] != upper[i, q]) else largest
            values[q] = largest
        return none
    _chords_and_floor(grid, exact, upper, slope, chord_factor, chords, bound, floor)
    log_size = math.log2(vocabulary)
    summation = (vocabulary + 2.0) * _UNIT
    for q in range(size):
        allowance = slack_ulps * ((grid[q] + 1.0) * magnitude + log_size + 2.0 + abs(bound[q])) + summation
        values[q] = bound[q] if (exact[q] or bound[q] == 0.0) else bound[q] + 2.0 * allowance
    return none


@jit(**_TRACE_FLAGS)
def renyi_log_moments(log_p: FloatArray, log_q: FloatArray, p_rows: IntArray, q_rows: IntArray, orders: FloatArray,
                      slack_ulps: float, summation: float, out: FloatArray) -> None:
    """(a - 1) D_a(P || Q) = log sum_j Q_j exp(a (log P_j - log Q_j)) for row pairs (p_rows[r], q_rows[r])
    and every order (van Erven & Harremoes 2014, Definition 2), rounded up by
    slack_ulps * ((a + 1) (max_j |log P_j| + max_j |log Q_j| + 2) + log2 V + 2 + |g|): each exponent
    is off by ~(a + 1) ulps of its terms. Terms with P_j = 0 add 0; P_j > 0 = Q_j gives +inf;
    identical rows give exactly 0; a NaN input gives NaN.

    Args:
        log_p: log P, one law per row, shape (Rp, V).
        log_q: log Q, one law per row, shape (Rq, V).
        p_rows: for each output row r, the row of log_p to read, int64 shape (R,).
        q_rows: for each output row r, the row of log_q to read, int64 shape (R,).
        orders: Renyi orders a > 1, shape (K,).
        slack_ulps: the rounding-up allowance, in ulps per unit of magnitude (kernels._SLACK_ULPS).
        summation: added to that allowance for the V-term sum: (V + 2) unit roundoffs holds its worst case
            in any order (Higham 2002, Section 4.2), which log2 V alone (pairwise summation) does not; 0
            where a caller reproduces values computed before that (the add-one bound of records_version < 7).
        out: output, shape (R, K): (a - 1) D_a(P || Q) rounded up, >= 0 (+inf or NaN as above).
    """
    for r in range(p_rows.size):
        _renyi_row(log_p[p_rows[r]], log_q[q_rows[r]], orders, slack_ulps, summation, out[r])


@jit(**_PARALLEL_FLAGS)
def renyi_log_moments_parallel(log_p: FloatArray, log_q: FloatArray, p_rows: IntArray, q_rows: IntArray,
                               orders: FloatArray, slack_ulps: float, summation: float, out: FloatArray) -> None:
    """renyi_log_moments with its row pairs across threads, for the audit's ablation only: each row is
    summed by one thread in the same way, so it is rounded up by the same allowance (trace kernels run
    serial: _TRACE_FLAGS).

    Args:
        log_p, log_q, p_rows, q_rows, orders, slack_ulps, summation: as renyi_log_moments.
        out: output, shape (R, K), as renyi_log_moments.
    """
    for r in prange(p_rows.size):
        _renyi_row(log_p[p_rows[r]], log_q[q_rows[r]], orders, slack_ulps, summation, out[r])


@jit(**_PARALLEL_FLAGS)
def screen_pass_counts(mean: FloatArray, log_public: FloatArray, noise: FloatArray, alpha: float, threshold: float,
                       slack_ulps: float, counts: FloatArray) -> None:
    """Monte Carlo counts of AdaPMixED's noisy screen passing (Flemings et al. 2024, Algorithm 1) for
    E ensembles of each of L steps, S noise draws each (the same draws for every ensemble of a step):
    the statistic D_alpha(clip(mean + noise, 0) renormalised || p0 on the top-k renormalised) is
    computed as dpledger.mechanisms.screening.NoisyScreening.statistic_from_mean computes it (the Renyi
    kernel's rounding up; +inf where every clipped entry is 0) and compared with the threshold. A draw
    whose statistic's bounds D_2 <= D_alpha <= D_inf clear the threshold by a margin above every rounding
    is decided from them, with no log or exp per token (_screen_decided): the same decision.

    Args:
        mean: the lam-mixed ensemble means on the public model's top-k tokens, shape (L, E, k).
        log_public: log of the public model's renormalised top-k probabilities, shape (L, k).
        noise: the Gaussian noise, sigma included, shape (L, S, k).
        alpha: the statistic's Renyi order (> 1).
        threshold: the screen passes where the statistic is <= threshold.
        slack_ulps: the Renyi kernel's rounding-up allowance (kernels._SLACK_ULPS).
        counts: output, shape (L, E): how many of the S draws passed.
    """
    steps, ensembles, size = mean.shape
    samples = noise.shape[1]
    order = np.array([alpha])
    margin = _screen_decision_margin(alpha, threshold, size)
    for row in prange(steps * ensembles):
        step, ensemble = row // ensembles, row % ensembles
        noisy = np.empty(size)
        log_noisy = np.empty(size)
        value = np.empty(1)
        public = np.empty(size)
        bounded = margin < np.inf and _public_for_bounds(log_public[step], public)
        passed = 0.0
        for sample in range(samples):
            total = 0.0
            for j in range(size):
                noisy[j] = max(mean[step, ensemble, j] + noise[step, sample, j], 0.0)
                total += noisy[j]
            if not total > 0.0:
                continue
            decided = _screen_decided(noisy, total, public, alpha, threshold, margin) if bounded else 0
            if decided != 0:
                passed += 1.0 if decided > 0 else 0.0
                continue
            for j in range(size):
                log_noisy[j] = vlog(noisy[j] / total)
            _renyi_row(log_noisy, log_public[step], order, slack_ulps, 0.0, value)
            passed += 1.0 if max(value[0] / (alpha - 1.0), 0.0) <= threshold else 0.0
        counts[step, ensemble] = passed



@jit(**_TRACE_FLAGS)
def screen_statistics(teacher_top: FloatArray, public_top: FloatArray, noise: FloatArray, lam: float, sigma: float,
                      alpha: float, slack_ulps: float, out: FloatArray) -> None:
    """AdaPMixED's screening statistics (Flemings et al. 2024, Algorithm 1) for L steps in one pass
    (records version >= 10; earlier versions ran the same formula as some twenty torch operations,
    dpledger.mechanisms.screening.NoisyScreening.statistic_from_mean): per step, on the public model's
    top-k tokens, the mean m = lam mean_i p_i + (1 - lam) p0, the noisy vector clip(m + sigma z, 0)
    renormalised, and D_alpha of it from p0 renormalised, by the Renyi kernel's arithmetic and its
    rounding up (renyi_log_moments, with the k-term sum's worst case); +inf where every clipped entry is
    0, NaN where an input is. The statistic is post-processing of the noisy vector: its arithmetic
    decides nothing a guarantee rests on, only what the replay reproduces.

    Args:
        teacher_top: the teachers' probabilities on the top-k tokens, shape (L, N, k).
        public_top: the public model's probabilities on them, shape (L, k).
        noise: standard normal draws, shape (L, k) (sigma not applied).
        lam: the screen's mixing weight lam in [0, 1].
        sigma: the noise's standard deviation.
        alpha: the statistic's Renyi order (> 1).
        slack_ulps: the Renyi kernel's rounding-up allowance (kernels._SLACK_ULPS).
        out: output, shape (L,): the statistics.
    """
    steps, n, size = teacher_top.shape
    order = np.array([alpha])
    value = np.empty(1)
    noisy, log_noisy, log_public = np.empty(size), np.empty(size), np.empty(size)
    summation = (size + 2.0) * _UNIT
    keep = 1.0 - lam
    for step in range(steps):
        total, public_total, nan = 0.0, 0.0, 0.0
        for j in range(size):
            teachers_sum = 0.0
            for i in range(n):
                teachers_sum += teacher_top[step, i, j]
            raw = fma(sigma, noise[step, j], fma(lam, teachers_sum / n, keep * public_top[step, j]))
            nan += 1.0 if raw != raw else 0.0   # (clipping at 0 below would turn a NaN into a number)
            noisy[j] = raw if raw > 0.0 else 0.0
            total += noisy[j]
            public_total += public_top[step, j]
        if nan > 0.0 or public_total != public_total:
            out[step] = np.nan
            continue
        if not total > 0.0:
            out[step] = np.inf
            continue
        for j in range(size):
            log_noisy[j] = vlog(noisy[j] / total)
            log_public[j] = vlog(public_top[step, j] / public_total)
        _renyi_row(log_noisy, log_public, order, slack_ulps, summation, value)
        out[step] = value[0] / (alpha - 1.0) if value[0] == value[0] else np.nan


_BOUNDED_BELOW = 2.0 ** -1000
"""The early screen decisions read only positive probabilities at least this (|log| <= 694): exp and
log are then within their stated ulps, and no quotient or square under- or overflows unnoticed."""


_EARLY_ORDERS = (1.0 + 2.0 ** -10, 2.0 ** 20)
"""The screen orders at which _screen_decided may decide a draw. Outside them the statistic the kernel
computes is not within its allowance of D_alpha, so bounds of D_alpha could decide against it: near 1 the
division by alpha - 1 multiplies the sum's rounding (found in review: at alpha = 1 + 2^-52 two compiles
of the same kernel disagree), and from about 10^12 on, alpha |log x - log q| loses every unit
(at 3e17 the kernel failed draws whose D_inf was 50)."""


@jit(**_HELPER_FLAGS)
def _screen_decision_margin(alpha: float, threshold: float, size: int) -> float:
    """How far (in nats) a bound of the screen statistic must clear the threshold for _screen_decided
    to take the decision the Renyi kernel would take: 1e-9 (1 + threshold + 1 / (alpha - 1)) plus
    4 (size + 2) u (1 + 1 / (alpha - 1)). The errors _screen_decided's docstring counts are below
    1e-11 (1 + 1 / (alpha - 1)) and 3 (size + 2) u (1 + 1 / (alpha - 1)): the sums' rounding enters
    divided by alpha - 1 (found in review: at alpha = 1 + 2^-10 and 8e7 tokens a size term without that
    division let a bound decide 3e-7 from the kernel's statistic). +inf (no early decision)
    outside _EARLY_ORDERS or unless 0 <= threshold < inf (a negative one passes nothing, as
    max(statistic, 0) <= threshold never holds; an infinite one passes even the kernel's +inf)."""
    if not (_EARLY_ORDERS[0] <= alpha <= _EARLY_ORDERS[1] and 0.0 <= threshold < np.inf):
        return np.inf
    inverse = 1.0 / (alpha - 1.0)
    return 1e-9 * (1.0 + threshold + inverse) + 4.0 * (size + 2.0) * _UNIT * (1.0 + inverse)


@jit(**_HELPER_FLAGS)
def _public_for_bounds(log_public: FloatArray, public: FloatArray) -> bool:
    """public_j = exp(log_public_j); whether every log is -inf (q_j = 0) or in [-690, 1] (q_j between
    e^-690, above _BOUNDED_BELOW, and e: an unnormalised law may hold a log slightly above 0), none NaN:
    the condition for _screen_decided's bounds."""
    usable = 0.0
    for j in range(log_public.size):
        lq = log_public[j]
        public[j] = math.exp(lq) if lq > -np.inf else 0.0
        usable += 0.0 if (lq == -np.inf or (lq >= -690.0 and lq <= 1.0)) else 1.0
    return usable == 0.0


@jit(**_HELPER_FLAGS)
def _screen_decided(noisy: FloatArray, total: float, public: FloatArray, alpha: float, threshold: float,
                    margin: float) -> int:
    """The screen's decision for one noisy draw where bounds of its statistic settle it, without a log or
    exp per token: +1 pass, -1 fail, 0 unsettled (the caller then computes the statistic). With
    x = noisy / total, q = the public top-k law and S the statistic as the Renyi kernel computes it
    (rounded up: D <= S <= D + its allowance, D = D_alpha of the laws its logs stand for):

    - D <= D_inf = log max_j x_j / q_j (van Erven & Harremoes 2014, Theorem 3: D_alpha increases with
      alpha): pass where log max x / q + margin <= threshold;
    - for alpha >= 2, D >= D_2 = log sum_j x_j^2 / q_j (the same theorem): fail where
      log sum x^2 / q - margin > threshold;
    - x_j > 0 = q_j: the kernel's +inf, a fail.

    The laws differ from x and q by their logs' rounding (vlog and exp within 2 ulps at |log| <= 694:
    4e-13 relative) and their sums from 1 by (size + 2) u, which moves log max x / q and log sum x^2 / q
    by less than 1e-12 + 2 (size + 2) u and the normalisation terms ((2 - alpha) / (alpha - 1) log sum P
    in D_2's inequality, log sum P / (alpha - 1) in D_inf's) by (4e-13 + 2 (size + 2) u) / (alpha - 1) at
    most; the kernel's statistic adds its allowance (at most 1e-11 at |log| <= 1400) and its V-term sum's
    rounding, (size + 2) u / (alpha - 1) (the kernel calls the Renyi row without a summation term).
    _screen_decision_margin covers their sum.
    Anything outside those conditions (a total, a positive x or a positive q below _BOUNDED_BELOW, a NaN,
    an order outside _EARLY_ORDERS) is left unsettled."""
    if not total >= _BOUNDED_BELOW:   # (1 / total overflows for a sub-normal total: the kernel's shares differ)
        return 0
    largest, chi_square, outside, unusable = 0.0, 0.0, 0.0, 0.0
    for j in range(noisy.size):
        x = noisy[j] / total
        q = public[j]
        # a positive entry whose share is tiny (or rounds to 0: its log would differ) is left to the kernel
        unusable += 1.0 if (x != x or (noisy[j] > 0.0 and x < _BOUNDED_BELOW)) else 0.0
        outside += 1.0 if (x > 0.0 and q == 0.0) else 0.0
        ratio = x / q if q > 0.0 else 0.0
        largest = vmax(largest, ratio)
        chi_square += ratio * x
    if unusable > 0.0:
        return 0
    if outside > 0.0:
        return -1
    if largest > 0.0 and math.log(largest) + margin <= threshold:
        return 1
    if alpha >= 2.0 and chi_square > 0.0 and math.log(chi_square) - margin > threshold:
        return -1
    return 0


@jit(**_HELPER_FLAGS)
def _renyi_row(lp: FloatArray, lq: FloatArray, orders: FloatArray, slack_ulps: float, summation: float,
               out: FloatArray) -> None:
    size = lp.size
    nan, identical, outside = False, True, False
    for j in range(size):
        if lp[j] != lp[j] or lq[j] != lq[j]:
            nan = True
        if lp[j] != lq[j]:
            identical = False
        if lp[j] > -np.inf and lq[j] == -np.inf:
            outside = True
    if nan:
        out[:] = np.nan
        return
    if identical:
        out[:] = 0.0
        return
    if outside:
        out[:] = np.inf
        return
    top_p, top_q = 0.0, 0.0
    for j in range(size):
        top_p = vmax(top_p, abs(lp[j]) if lp[j] > -np.inf else 0.0)
        top_q = vmax(top_q, abs(lq[j]) if lq[j] > -np.inf else 0.0)
    magnitude = top_p + top_q + 2.0
    for k in range(orders.size):
        a = orders[k]
        top = -np.inf
        for j in range(size):
            top = vmax(top, lq[j] + a * (lp[j] - lq[j]) if lp[j] > -np.inf else -np.inf)
        if top == -np.inf:     # P has no mass at all (a zeroed row): nothing to sum
            out[k] = 0.0
            continue
        total = 0.0
        for j in range(size):
            total += vexp(lq[j] + a * (lp[j] - lq[j]) - top) if lp[j] > -np.inf else 0.0
        value = math.log(total) + top
        slack = slack_ulps * ((a + 1.0) * magnitude + math.log2(size) + 2.0 + abs(value)) + summation
        out[k] = max(value + slack, 0.0)


_KNAPSACK_BUCKETS = 4096
"""Value buckets of knapsack_allocation: only the bucket where the mass crosses 1 is sorted."""


@jit(**_FLAGS)
def knapsack_allocation(log_caps: FloatArray, log_t: FloatArray, inflate: float, out: FloatArray) -> None:
    """The fractional knapsack of unit mass over tokens in decreasing order of log_t (ties: the
    lower index first), each capped at exp(log_caps_j): out_j = log of token j's allocation
    min(cap_j, max(1 - before_j, 0) inflate) (-inf where none), before_j the caps of the tokens ranked
    above it. Without a full sort: the finite log_t are bucketed by value (monotone, so the buckets
    keep the order), whole buckets above the one where the mass crosses 1 are filled, and only that
    bucket's tokens are sorted. log_t = +inf ranks first, -inf last; no NaN (the caller checks).

    Args:
        log_caps: log qmax_j, shape (V,).
        log_t: the ranking key log t_j, shape (V,), no NaN.
        inflate: the factor on the last token's share (>= 1): rounding up the mass placed.
        out: output, shape (V,): log of each token's allocation, -inf where none.
    """
    size = log_t.size
    low, high = np.inf, -np.inf
    for j in range(size):
        if math.isfinite(log_t[j]):
            low, high = min(low, log_t[j]), max(high, log_t[j])
    top = _KNAPSACK_BUCKETS + 1                 # bucket of +inf; 0 holds -inf; finite ones 1.._KNAPSACK_BUCKETS
    width = (high - low) / (_KNAPSACK_BUCKETS - 1) if high > low else 1.0
    bucket = np.empty(size, dtype=np.int64)
    mass = np.zeros(top + 1)
    for j in range(size):
        t = log_t[j]
        index = top if t == np.inf else (0 if t == -np.inf else 1 + int(math.floor((t - low) / width)))
        bucket[j] = index
        mass[index] += math.exp(log_caps[j])
    above = 0.0                                 # the caps of every bucket above the current one
    crossing = -1
    for index in range(top, -1, -1):
        if above + mass[index] >= 1.0:
            crossing = index
            break
        above += mass[index]
    for j in range(size):
        if bucket[j] > crossing:
            out[j] = log_caps[j]                # before_j + cap_j <= the mass above the crossing bucket < 1
        elif bucket[j] < crossing:
            out[j] = -np.inf
    if crossing < 0:                            # the caps hold less than unit mass: every token is full
        return
    members = np.flatnonzero(bucket == crossing)
    keys = np.empty(members.size)
    for m in range(members.size):
        keys[m] = -log_t[members[m]]
    order = np.argsort(keys, kind="mergesort")  # stable: ties keep the lower index first
    before = above
    for m in range(order.size):
        j = members[order[m]]
        cap = math.exp(log_caps[j])
        share = min(cap, max(1.0 - before, 0.0) * inflate)
        out[j] = math.log(share) if share > 0.0 else -np.inf
        before += cap


@jit(**_FLAGS)
def add_one_weighted_order_sums(log_allocation: FloatArray, log_t: FloatArray, log_share: FloatArray,
                                shift: FloatArray, log_zero_weight: float, orders: FloatArray, teachers: float,
                                out_u2: FloatArray, out_chord: FloatArray, out_u2_slope: FloatArray,
                                out_chord_slope: FloatArray) -> None:
    """add_one_order_sums with the chord sum written as a nonnegative combination (records_version >= 7):
      out_chord = log(w0 phi_k(0) + sum_j c_j phi_k(t_j)),  c_j = a_j / t_j = exp(log_share_j),
    w0 = exp(log_zero_weight) >= 1 - sum_j c_j (the caller rounds it up), phi_k(t) = ((N + t)/(N + 1))^k:
    the chord sum phi_k(0) + sum_j c_j (phi_k(t_j) - phi_k(0)) with its phi_k(0) terms gathered, so one exp
    per token and no expm1 (every term is nonnegative: no cancellation to guard against). out_u2 and the
    slopes as add_one_order_sums; the chord slope is (w0 z phi_k(0) + sum_j c_j shift_j phi_k(t_j)) / S,
    z = log(N / (N + 1)). One pass finds both maxima, one forms both sums.

    Args:
        log_allocation: log a_j of the allocated tokens (all finite), shape (M,).
        log_t: log t_j of the same tokens (all finite), shape (M,).
        log_share: log c_j = log a_j - log t_j, shape (M,).
        shift: log((N + t_j) / (N + 1)), shape (M,).
        log_zero_weight: log w0 (-inf for w0 = 0).
        orders: Renyi orders k > 1, shape (K,).
        teachers: the ensemble size N (> 0), as a float.
        out_u2: output, shape (K,): log sum_j a_j t_j^(k-1).
        out_chord: output, shape (K,): the log of the chord bound's sum.
        out_u2_slope: output, shape (K,): d out_u2 / dk.
        out_chord_slope: output, shape (K,): d out_chord / dk.
    """
    zero_shift = math.log(teachers) - math.log(teachers + 1.0)
    size = log_t.size
    for index in range(orders.size):
        k = orders[index]
        top_u2, top_chord = -np.inf, log_zero_weight + k * zero_shift
        for j in range(size):
            top_u2 = vmax(top_u2, log_allocation[j] + (k - 1.0) * log_t[j])
            top_chord = vmax(top_chord, log_share[j] + k * shift[j])
        total_u2, weighted_u2, total_chord, weighted_chord = 0.0, 0.0, 0.0, 0.0
        for j in range(size):
            term = vexp(log_allocation[j] + (k - 1.0) * log_t[j] - top_u2)
            total_u2 += term
            weighted_u2 += term * log_t[j]
            share = vexp(log_share[j] + k * shift[j] - top_chord)
            total_chord += share
            weighted_chord += share * shift[j]
        zero = math.exp(log_zero_weight + k * zero_shift - top_chord)
        total_chord += zero
        weighted_chord += zero * zero_shift
        out_u2[index] = math.log(total_u2) + top_u2
        out_u2_slope[index] = weighted_u2 / total_u2
        out_chord[index] = math.log(total_chord) + top_chord
        out_chord_slope[index] = weighted_chord / total_chord


_LATTICE = 10
"""add_one_power_order_sums raises bases to multiples of 1/_LATTICE: the default grid's orders are tenths."""

_POWER_FLOOR = 1e-250
"""Below this a power sum may have lost relative digits to gradual underflow: that order takes the exp path."""


@jit(**_EXACT_FLAGS)
def add_one_lattice_allowances(orders: FloatArray, on_lattice: BoolArray, spans: FloatArray, out_u2: FloatArray,
                               out_chord: FloatArray) -> None:
    """What add_one_power_order_sums adds to the error of the u2 and chord sums at each order marked
    `on_lattice` (k > 1 within 1e-9 of a tenth: dpledger.mechanisms.add_one._AllocatedTokens decides; 0 at
    the others), for rows whose log t spans `spans`: e (6 + 0.3 span) u for a power of e
    factors (add_one_power_order_sums has the derivation), and the lattice's gap |e / 10 - (k - 1)| times
    span, the gap bounded by |fl(10 (k - 1)) - e| / 10 + 2 (k - 1) u (fl's error is 10 (k - 1) u); likewise
    with k and e' = round(10 k) for the chord, whose shifts span less than log t (shift is 1-Lipschitz in
    log t).

    Args:
        orders: Renyi orders, shape (K,).
        on_lattice: which orders the power path may take, bool shape (K,).
        spans: max - min log t of each row's allocated tokens, shape (R,) (0 for a row without powers).
        out_u2, out_chord: outputs, shape (R, K).
    """
    for i in range(orders.size):
        k = orders[i]
        tenths = k * _LATTICE
        steps = math.floor(tenths + 0.5)
        on = on_lattice[i]
        u2_steps = steps - _LATTICE
        u2_gap = abs(_LATTICE * (k - 1.0) - u2_steps) / _LATTICE + 2.0 * (k - 1.0) * _UNIT
        chord_gap = abs(tenths - steps) / _LATTICE + 2.0 * k * _UNIT
        for r in range(spans.size):
            span = spans[r]
            out_u2[r, i] = u2_steps * (6.0 + 0.3 * span) * _UNIT + u2_gap * span if on else 0.0
            out_chord[r, i] = steps * (6.0 + 0.3 * span) * _UNIT + chord_gap * span if on else 0.0


@jit(**_FLAGS)
def add_one_shifts(log_t: FloatArray, teachers: float, out: FloatArray) -> float:
    """shift_j = log((N + t_j) / (N + 1)) for each token (records version >= 10; version 9 took numpy's
    logaddexp, one scalar exp and log1p per token), vectorised: h_j + log(1 + exp(-|log t_j - log N|)) -
    log(N + 1) with h_j = max(log t_j, log N), by vexp and vlog (2 ulps = 4u each, fastmath.MAX_ULPS).
    Returns d >= max_j |computed - exact shift_j|. Its derivation, first order in u (each libm log within
    1 ulp = 2u; a sum of three terms in any association within 2u times their magnitudes):
    log N and log(N + 1) err by 2u log N and 2u log(N + 1); with x = -|log t_j - log N| <= 0, the error
    of log N moves h_j by at most 2u |log N| and x by as much plus x's rounding u |x|, which moves
    L = log(1 + e^x) by at most half of it (L' = e^x / (1 + e^x) <= 1/2; |x| e^x <= 1/e); vexp's 4u
    relative error and the rounding of 1 + e^x give 1 + e^x within 3u relative, so L within 3u, and vlog
    adds 4u L <= 2.8u (L <= log 2); the two additions add 2u (|h_j| + log 2 + log(N + 1)). In all
    (7.7 + 3 |log N| + 2 |h_j| + 4 log(N + 1)) u; the kernel returns 10 in place of 7.7. A flushed
    vexp (x < -708) loses L <= e^-708, far below d. The add-one chord sum's terms carry their shift
    times the order, so k d joins its allowance (dpledger.mechanisms.fused.add_one_forward_round).

    Args:
        log_t: log t_j, all finite, shape (M,).
        teachers: the ensemble size N (> 0), as a float.
        out: output, shape (M,): shift_j.

    Returns:
        The bound d on every shift's error (0 for M = 0).
    """
    log_n = math.log(teachers)
    log_n1 = math.log(teachers + 1.0)
    for j in range(log_t.size):
        out[j] = vmax(log_t[j], log_n) + vlog(1.0 + vexp(-abs(log_t[j] - log_n))) - log_n1
    if log_t.size == 0:
        return 0.0
    largest = abs(log_n)   # >= every |h_j| (a loop of its own: beside the values, the maximum stops vectorising)
    for j in range(log_t.size):
        largest = vmax(largest, abs(log_t[j]))
    return (10.0 + 3.0 * abs(log_n) + 2.0 * largest + 4.0 * log_n1) * _UNIT


@jit(**_FLAGS)
def add_one_power_bases(log_allocation: FloatArray, log_t: FloatArray, log_share: FloatArray, shift: FloatArray,
                        out_allocation: FloatArray, out_share: FloatArray, out_base_t: FloatArray,
                        out_base_shift: FloatArray) -> tuple[float, float, float]:
    """The per-token factors of add_one_power_order_sums, once per row: a_j = exp(log a_j), c_j = exp(log c_j),
    and the bases (t_j / t_max)^(1/10) and ((N + t_j) / (N + t_max))^(1/10), exp((log t_j - max) / 10) and
    exp((shift_j - max) / 10), each in (0, 1].

    Args:
        log_allocation, log_t, log_share, shift: as add_one_weighted_order_sums, shape (M,), M >= 1.
        out_allocation, out_share, out_base_t, out_base_shift: outputs, shape (M,): a_j, c_j and the bases.

    Returns:
        (max log t, max shift, min log t) over the tokens.
    """
    top_t, top_shift, low_t = -np.inf, -np.inf, np.inf
    for j in range(log_t.size):
        top_t = vmax(top_t, log_t[j])
        top_shift = vmax(top_shift, shift[j])
        low_t = vmin(low_t, log_t[j])
    for j in range(log_t.size):
        out_allocation[j] = vexp(log_allocation[j])
        out_share[j] = vexp(log_share[j])
        out_base_t[j] = vexp((log_t[j] - top_t) / _LATTICE)
        out_base_shift[j] = vexp((shift[j] - top_shift) / _LATTICE)
    return top_t, top_shift, low_t


@jit(**_HELPER_FLAGS)
def _power_levels(base: FloatArray, levels: int, out: FloatArray) -> None:
    """out holds `levels` rows of base's width back to back: base^(2^b) by repeated squaring."""
    size = base.size
    for j in range(size):
        out[j] = base[j]
    for b in range(1, levels):
        below, level = out[(b - 1) * size:b * size], out[b * size:(b + 1) * size]
        for j in range(size):
            level[j] = below[j] * below[j]


@jit(**_HELPER_FLAGS)
def _power_of(levels: FloatArray, exponent: int, size: int, out: FloatArray) -> None:
    """out = base^exponent, the product of the squarings (levels from _power_levels) at the exponent's set
    bits, in increasing order: a function of the exponent alone, whatever else the caller computes."""
    for j in range(size):
        out[j] = 1.0
    b = 0
    while exponent > 0:
        if exponent & 1:
            level = levels[b * size:(b + 1) * size]
            for j in range(size):
                out[j] *= level[j]
        exponent >>= 1
        b += 1


@jit(**_FLAGS)
def add_one_power_order_sums(allocation: FloatArray, share: FloatArray, base_t: FloatArray, base_shift: FloatArray,
                             log_t: FloatArray, shift: FloatArray, top_t: float, top_shift: float,
                             log_zero_weight: float, orders: FloatArray, u2_steps: IntArray, chord_steps: IntArray,
                             teachers: float, out_u2: FloatArray, out_chord: FloatArray, out_u2_slope: FloatArray,
                             out_chord_slope: FloatArray, underflow: BoolArray) -> None:
    """add_one_weighted_order_sums (records_version >= 8) at orders k whose k - 1 and k lie on the lattice of
    tenths, with no exp per token and order: t_j^(k-1) = t_max^(k-1) (base_t_j)^(e), e = u2_steps[i] the
    integer nearest 10 (k - 1), and ((N + t_j)/(N + 1))^k = e^(k max shift) (base_shift_j)^(e'), e' = chord_steps[i]
    the integer nearest 10 k, the powers by products: one multiply pass per set bit of e over the
    base's squarings, so that an order's value does not depend on the other orders of the call (a
    sub-grid's value at an order equals computing every order's there). Tokens go in chunks of
    _POWER_CHUNK, whose squarings stay in cache.
      out_u2 = log(sum_j a_j base_t_j^e) + (k - 1) max log t,
      out_chord = log(w0 e^(k z) + e^(k max shift) sum_j c_j base_shift_j^e'),  z = log(N / (N + 1)),
    and the slopes as add_one_weighted_order_sums. The error of a power b^e, b within r of its value, is
    within e (r + 2u) (each squaring doubles a relative error and adds u; the products add one u per
    factor). With b = vexp(x), within 2 ulps (4u relative, fastmath.MAX_ULPS) of exp of its argument, and
    x = (log t_j - max) / 10 within 3u |x| (a subtraction, and the division, which fastmath's arcp turns
    into a product by 0.1), r <= 4u + 3u |x|, |x| <= span / 10 (span = max - min log t): a term is within
    e (6 + 0.3 span) u of a_j t_j^(e/10) / t_max^(e/10), and the lattice's gap |e / 10 - (k - 1)| times
    span of a_j t_j^(k-1) / t_max^(k-1) (add_one_lattice_allowances gives both to the caller's allowance;
    likewise with e' and the shifts' span, at most log t's, for the chord). The factors a_j and c_j must be
    at most 1 (the knapsack's allocations are: a_j <= qmax_j <= 1 and c_j = a_j / t_j <= p_j): then a power
    that underflows, or a factor vexp flushes to 0 (below exp(-708.4)), loses at most 2^-1022 of a term,
    and an order whose sum falls below _POWER_FLOOR is marked in `underflow` (its outputs unset) for the
    exp path to compute; above it, M such losses are under 1e-50 of the sum.

    Args:
        allocation, share, base_t, base_shift: a_j, c_j and the bases (add_one_power_bases), shape (M,).
        log_t, shift: log t_j and shift_j, shape (M,) (the slopes' weights).
        top_t, top_shift: max log t and max shift (add_one_power_bases).
        log_zero_weight: log w0 (-inf for w0 = 0).
        orders: Renyi orders k > 1, shape (K,).
        u2_steps, chord_steps: round(10 (k - 1)) and round(10 k), int64, shape (K,).
        teachers: the ensemble size N (> 0), as a float.
        out_u2, out_chord, out_u2_slope, out_chord_slope: outputs, shape (K,), as add_one_weighted_order_sums.
        underflow: output, shape (K,): the orders left to the exp path.
    """
    size = allocation.size
    count = orders.size
    zero_shift = math.log(teachers) - math.log(teachers + 1.0)
    largest = 1
    for i in range(count):
        largest = max(largest, u2_steps[i], chord_steps[i])
    levels = 1
    while (1 << levels) <= largest:
        levels += 1
    sums = np.zeros((count, 4))
    width = min(size, _POWER_CHUNK)
    levels_t, levels_shift = np.empty(levels * width), np.empty(levels * width)
    power_t, power_shift = np.empty(width), np.empty(width)
    for start in range(0, size, _POWER_CHUNK):
        stop = min(size, start + _POWER_CHUNK)
        chunk = stop - start
        _power_levels(base_t[start:stop], levels, levels_t[:levels * chunk])
        _power_levels(base_shift[start:stop], levels, levels_shift[:levels * chunk])
        powers_t, powers_shift = power_t[:chunk], power_shift[:chunk]
        chunk_allocation, chunk_share = allocation[start:stop], share[start:stop]
        chunk_log_t, chunk_shift = log_t[start:stop], shift[start:stop]
        for i in range(count):
            _power_of(levels_t[:levels * chunk], u2_steps[i], chunk, powers_t)
            _power_of(levels_shift[:levels * chunk], chord_steps[i], chunk, powers_shift)
            total_u2, weighted_u2, total_chord, weighted_chord = 0.0, 0.0, 0.0, 0.0
            for j in range(chunk):
                term = chunk_allocation[j] * powers_t[j]
                total_u2 += term
                weighted_u2 += term * chunk_log_t[j]
                piece = chunk_share[j] * powers_shift[j]
                total_chord += piece
                weighted_chord += piece * chunk_shift[j]
            sums[i, 0] += total_u2
            sums[i, 1] += weighted_u2
            sums[i, 2] += total_chord
            sums[i, 3] += weighted_chord
    for i in range(count):
        k = orders[i]
        underflow[i] = not (sums[i, 0] >= _POWER_FLOOR and sums[i, 2] >= _POWER_FLOOR)
        if underflow[i]:
            continue
        out_u2[i] = math.log(sums[i, 0]) + (k - 1.0) * top_t
        out_u2_slope[i] = sums[i, 1] / sums[i, 0]
        zero = log_zero_weight + k * zero_shift
        tokens = math.log(sums[i, 2]) + k * top_shift
        high, low = max(zero, tokens), min(zero, tokens)
        out_chord[i] = high + math.log1p(math.exp(low - high)) if low > -np.inf else high
        zero_part = zero_shift * math.exp(zero - out_chord[i]) if zero > -np.inf else 0.0
        out_chord_slope[i] = zero_part + sums[i, 3] / sums[i, 2] * math.exp(tokens - out_chord[i])


@jit(**_FLAGS)
def add_one_order_sums(log_allocation: FloatArray, log_t: FloatArray, shift: FloatArray, orders: FloatArray,
                       teachers: float, out_u2: FloatArray, out_chord: FloatArray, out_u2_slope: FloatArray,
                       out_chord_slope: FloatArray) -> None:
    """The two order-dependent sums of the add-one bound (dpledger.mechanisms.add_one.add_one_divergence_bounds)
    over the allocated tokens of the fractional knapsack (log allocation a_j, log t_j, all finite),
    for every order k:
      out_u2 = log sum_j a_j t_j^(k-1)                                   (the U2 bound, times k - 1)
      out_chord = log(phi_k(0) + sum_j a_j (phi_k(t_j) - phi_k(0)) / t_j),  phi_k(t) = ((N + t)/(N + 1))^k,
    with shift_j = log((N + t_j) / (N + 1)) given, log phi_k(0) = k log(N / (N + 1)); the difference
    phi_k(t) - phi_k(0) = phi_k(t) (1 - exp(k (log phi(0) - shift_j))) uses vexpm1 (no cancellation).
    With them their derivatives in k, from the same exps (the sub-grid's tangents): the u2 sum's is the
    mean of log t_j under the weights a_j t_j^(k-1); with c_j = a_j / t_j, z = log(N / (N + 1)) and the
    chord sum S = e^(kz) + sum_j c_j (e^(k shift_j) - e^(kz)), dS/dk = z S + sum_j c_j (shift_j - z) e^(k shift_j).

    Args:
        log_allocation: log a_j of the allocated tokens (all finite), shape (M,).
        log_t: log t_j = log(qmax_j / p_j) of the same tokens (all finite), shape (M,).
        shift: log((N + t_j) / (N + 1)), shape (M,).
        orders: Renyi orders k > 1, shape (K,).
        teachers: the ensemble size N (> 0), as a float.
        out_u2: output, shape (K,): log sum_j a_j t_j^(k-1).
        out_chord: output, shape (K,): the log of the chord bound's sum.
        out_u2_slope: output, shape (K,): d out_u2 / dk.
        out_chord_slope: output, shape (K,): d out_chord / dk.
    """
    zero_shift = math.log(teachers) - math.log(teachers + 1.0)
    size = log_t.size
    for index in range(orders.size):
        k = orders[index]
        top = -np.inf
        for j in range(size):
            top = vmax(top, log_allocation[j] + (k - 1.0) * log_t[j])
        total = 0.0
        weighted = 0.0
        for j in range(size):
            term = vexp(log_allocation[j] + (k - 1.0) * log_t[j] - top)
            total += term
            weighted += term * log_t[j]
        out_u2[index] = math.log(total) + top
        out_u2_slope[index] = weighted / total
        top = -np.inf
        for j in range(size):
            top = vmax(top, log_allocation[j] - log_t[j] + k * shift[j])
        total = 0.0
        weighted = 0.0
        for j in range(size):
            term = vexp(log_allocation[j] - log_t[j] + k * shift[j] - top)
            total += term * -vexpm1(k * (zero_shift - shift[j]))
            weighted += term * (shift[j] - zero_shift)
        chord = math.log(total) + top if total > 0.0 else -np.inf
        phi_zero = k * zero_shift
        high, low = max(chord, phi_zero), min(chord, phi_zero)
        out_chord[index] = high + math.log1p(math.exp(low - high))
        out_chord_slope[index] = zero_shift + (math.exp(math.log(weighted) + top - out_chord[index])
                                               if weighted > 0.0 else 0.0)
