"""Vectorised kernels (torch interfaces): log-space Renyi divergences, PMixED mixing weights (the
solver dispatch), the mixed teachers and their leave-one-out sums, and the numerics of the
leave-one-out losses. CPU tensors run the fused numba kernels of dpledger.mechanisms.fused; tensors on
a GPU run torch forms on their device. The bounds built on them are in modules of their own: Eq. 3
with its chord certificates in dpledger.mechanisms.leave_one_out, the add-one bound in
dpledger.mechanisms.add_one; Hot PATE's coordinated votes are in dpledger.mechanisms.hot_pate.

All arithmetic is float64 in log space (float32 underflows at high orders): D_a(P||Q) is
1/(a-1) * logsumexp_j(log Q_j + a (log P_j - log Q_j)); P_j^a is never formed. Terms with
P_j = Q_j = 0 contribute 0; P_j > 0 = Q_j gives +inf (pitfall 9: never NaN -> 0).
"""
from __future__ import annotations

import math
import os
import threading
import weakref
from typing import TYPE_CHECKING, Sequence

import numpy as np
from numpy.typing import NDArray

from dpledger.accounting.rounding import ROUNDING_ULPS, UNIT_ROUNDOFF
from dpledger.accounting.lazy_import import lazy_module
from dpledger.mechanisms.device_kernels import ball_mixing_weights_device, device_solver_enabled, log_moments
from dpledger.mechanisms.ball import require_ball
from dpledger.mechanisms.distributions import public_per_step, require_probabilities

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light

_SLACK_PER_ULP = 1.0
"""The rounding-up allowance is ROUNDING_ULPS * _SLACK_PER_ULP per unit of magnitude: 8 ulps,
which covers the fused kernels' exp and log (within dpledger.mechanisms.fastmath.MAX_ULPS = 2 ulps of the
true value, vexp_pair within PAIR_MAX_ULPS = 2.5) as it covered the C library's; tests/test_differential.py holds both to mpmath."""
_SLACK_ULPS = ROUNDING_ULPS * _SLACK_PER_ULP

FloatArray = NDArray[np.float64]
"""A float64 numpy array (the kernels' arithmetic is float64 throughout)."""
IntArray = NDArray[np.int64]
"""An int64 numpy array (row indices)."""


_THREADS_SET = threading.local()
"""The kernel thread count this Python thread last gave numba (numba's count is per calling thread)."""


def _set_threads() -> None:
    """Give numba kernel_threads() for this Python thread's next kernels; a no-op when it already has
    them (this runs before every kernel call: about 30 us a step at demo scale otherwise)."""
    from numba import get_num_threads, set_num_threads

    # numba's own count is read too (cheap once its pool runs): other code may have changed it; the setting
    # as last read is compared before kernel_threads() works it out again (its imports: ~7 us a kernel call)
    setting = os.environ.get("DPLEDGER_KERNEL_THREADS", "1")
    if getattr(_THREADS_SET, "setting", None) == setting and get_num_threads() == _THREADS_SET.threads:
        return
    threads = kernel_threads()
    if getattr(_THREADS_SET, "threads", None) == threads and get_num_threads() == threads:
        _THREADS_SET.setting = setting
        return

    torch_threads = torch.get_num_threads()
    set_num_threads(threads)
    # numba's OpenMP layer starts with one thread per core and torch shares its pool: without this, the
    # first fused kernel silently changes torch's thread count, and with it how torch splits a reduction
    # (the last bits of a sum), so a result would depend on whether a kernel had run before it
    if torch.get_num_threads() != torch_threads:
        torch.set_num_threads(torch_threads)
    _THREADS_SET.threads, _THREADS_SET.setting = threads, setting


def _log(x: torch.Tensor) -> torch.Tensor:
    return torch.log(x.clamp_min(0.0))


def kernel_threads() -> int:
    """Worker threads for the fused kernels: $DPLEDGER_KERNEL_THREADS, default 1 (robust on shared
    2-core machines; set 2 for long audits on an otherwise idle machine), at most the cores numba has.

    Returns:
        The number of threads, >= 1 and at most numba's NUMBA_NUM_THREADS.
    """
    from dpledger.mechanisms.fastmath import prefer_wide_vectors

    prefer_wide_vectors()   # before numba is first imported (a no-op after)
    from numba import config

    cores: int = config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # numba.config sets it at import, unannotated
    return max(1, min(int(os.environ.get("DPLEDGER_KERNEL_THREADS", "1")), cores))


def _row_source(shape: tuple[int, ...], batch_shape: tuple[int, ...], rows: IntArray) -> IntArray:
    """Row numbers, in an array of batch shape `shape` (broadcastable to batch_shape), of flat rows."""
    full = np.unravel_index(rows, batch_shape) if batch_shape else ()
    offset = len(batch_shape) - len(shape)
    own = [full[offset + axis] if size > 1 else np.zeros_like(rows) for axis, size in enumerate(shape)]
    return np.ravel_multi_index(own, shape) if shape else np.zeros_like(rows)


def renyi_divergence_orders(log_p: torch.Tensor, log_q: torch.Tensor, orders: torch.Tensor,
                            parallel: bool = False) -> torch.Tensor:
    """D_a(P||Q) for every order a in `orders` (shape (K,)): result shape broadcast(P, Q)[:-1] + (K,).

    van Erven & Harremoes 2014, Definition 2 (the Renyi divergence of order a > 1):
    D_a = log sum_j Q_j exp(a (log P_j - log Q_j)) / (a - 1). CPU tensors run the fused kernel
    (dpledger.mechanisms.fused.renyi_log_moments: one pass per order, rows gathered from the broadcast inputs
    without materialising the broadcast); tensors on another device run the same arithmetic in
    torch there (renyi_divergence_orders_torch). Both round up by the same bound.

    Args:
        log_p: log P, float (any dtype; computed in float64), shape (..., V); -inf marks P_j = 0.
        log_q: log Q, shape (..., V), broadcastable against log_p over the leading axes.
        orders: the Renyi orders a > 1, shape (K,) (any shape; flattened).
        parallel: on the CPU, sum the row pairs across kernel_threads() threads
            (dpledger.mechanisms.fused.renyi_log_moments_parallel): the audit's ablation only, never a value
            a trace records (those kernels run serial).

    Returns:
        float64 tensor of shape broadcast(P, Q)[:-1] + (K,): D_a(P||Q) in nats, rounded up, >= 0;
        +inf where P has mass outside Q's support.

    Raises:
        ValueError: if P and Q have vocabularies of different sizes or batch shapes that do not
            broadcast, or a divergence is NaN (an input holds NaN or inf).
    """
    # numpy's, not torch.broadcast_shapes: its first call imports sympy (0.6 s of a process's first step)
    batch_shape = tuple(np.broadcast_shapes(tuple(log_p.shape[:-1]), tuple(log_q.shape[:-1])))
    vocab = log_p.shape[-1]
    if log_q.shape[-1] != vocab:
        raise ValueError(f"P and Q must share the vocabulary axis, got {vocab} and {log_q.shape[-1]}")
    if log_p.device.type != "cpu" or log_q.device.type != "cpu":
        return renyi_divergence_orders_torch(log_p, log_q, orders)
    from dpledger.mechanisms.fused import renyi_log_moments, renyi_log_moments_parallel

    lp = np.ascontiguousarray(log_p.detach().double().numpy().reshape(-1, vocab))
    lq = np.ascontiguousarray(log_q.detach().double().numpy().reshape(-1, vocab))
    orders_np = np.ascontiguousarray(orders.detach().cpu().double().numpy().reshape(-1))
    rows = math.prod(batch_shape) if batch_shape else 1
    flat = np.arange(rows)
    p_shape, q_shape = tuple(log_p.shape[:-1]), tuple(log_q.shape[:-1])
    moments = np.empty((rows, orders_np.size))
    _set_threads()
    (renyi_log_moments_parallel if parallel else renyi_log_moments)(
        lp, lq, _row_source(p_shape, batch_shape, flat), _row_source(q_shape, batch_shape, flat), orders_np,
        _SLACK_ULPS, (vocab + 2.0) * UNIT_ROUNDOFF, moments)
    return torch.from_numpy(_divergences_from_moments(moments, orders_np).reshape(*batch_shape, orders_np.size))


def _divergences_from_moments(moments: FloatArray, orders: FloatArray) -> FloatArray:
    """D_a = g / (a - 1) from g = (a - 1) D_a, rounded up; ValueError for a NaN (a NaN or inf input)."""
    nan = np.isnan(moments)
    if np.any(nan):
        raise ValueError(f"Renyi divergence is NaN in row {int(np.argmax(nan.any(axis=-1)))}: an input "
                         "distribution holds NaN or inf")
    return np.maximum(moments / (orders - 1.0), 0.0)


def renyi_divergence_orders_torch(log_p: torch.Tensor, log_q: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
    """renyi_divergence_orders in torch on the inputs' device (a GPU's): one logsumexp per order,
    the same special cases and the same rounding up as the fused kernel. Also the straightforward
    form the tests hold the fused kernel to.

    Args:
        log_p: log P, shape (..., V); -inf marks P_j = 0.
        log_q: log Q, shape (..., V), broadcastable against log_p.
        orders: the Renyi orders a > 1 (flattened to (K,)).

    Returns:
        float64 tensor on the inputs' device, shape broadcast(P, Q)[:-1] + (K,): D_a(P||Q) in nats,
        rounded up, >= 0.

    Raises:
        ValueError: if a divergence is NaN (an input holds NaN or inf).
    """
    log_p, log_q = torch.broadcast_tensors(log_p.double(), log_q.double())  # type: ignore[no-untyped-call]  # unannotated
    orders = orders.to(log_p.device).double().reshape(-1)
    p_zero, q_zero = torch.isneginf(log_p), torch.isneginf(log_q)
    ratio = torch.where(p_zero, -torch.inf, log_p - log_q)
    base = torch.where(q_zero & ~p_zero, 0.0, log_q)
    magnitude = (torch.where(p_zero, 0.0, log_p.abs()).amax(dim=-1)
                 + torch.where(q_zero, 0.0, log_q.abs()).amax(dim=-1) + 2.0)
    values = log_moments(base, ratio, orders)   # one Triton kernel on a CUDA device, else one logsumexp per order
    slack = (ROUNDING_ULPS * _SLACK_PER_ULP * ((orders + 1.0) * magnitude.unsqueeze(-1) + math.log2(log_p.shape[-1])
                                              + 2.0 + values.abs()) + (log_p.shape[-1] + 2.0) * UNIT_ROUNDOFF)
    moments = (values + slack).clamp_min(0.0)
    # a NaN or +inf log (a NaN or inf probability) must raise, as in the fused kernel, before the special
    # cases below could turn its NaN into 0 or +inf
    invalid = (torch.isnan(moments).any() | torch.isnan(log_p).any() | torch.isnan(log_q).any()
               | torch.isposinf(log_p).any() | torch.isposinf(log_q).any())
    moments = torch.where((log_p == log_q).all(dim=-1, keepdim=True), 0.0, moments)
    moments = torch.where((~p_zero & q_zero).any(dim=-1, keepdim=True), torch.inf, moments)
    if bool(invalid):
        raise ValueError("Renyi divergence is NaN: an input distribution holds NaN or inf")
    return (moments / (orders - 1.0)).clamp_min(0.0)


def symmetric_renyi_orders(log_p: torch.Tensor, log_q: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
    """max(D_a(P||Q), D_a(Q||P)) per order (the symmetric divergence of Flemings et al. 2024).

    Args:
        log_p: log P, shape (..., V).
        log_q: log Q, shape (..., V), broadcastable against log_p.
        orders: the Renyi orders a > 1, shape (K,).

    Returns:
        float64 tensor of shape broadcast(P, Q)[:-1] + (K,): D<->_a(P, Q) in nats, rounded up.

    Raises:
        ValueError: as renyi_divergence_orders (different vocabularies, or NaN).
    """
    return torch.maximum(renyi_divergence_orders(log_p, log_q, orders), renyi_divergence_orders(log_q, log_p, orders))


def max_divergence_symmetric(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """max(D_inf(P||Q), D_inf(Q||P)) with D_inf(P||Q) = log max_j P_j / Q_j over P's support
    (van Erven & Harremoes 2014, Theorem 6): shape broadcast(P, Q)[:-1]. +inf where one law has
    mass outside the other's support. Rounded up by a few ulps of the logs' magnitude.

    Args:
        log_p: log P (float64), shape (..., V); -inf marks P_j = 0.
        log_q: log Q (float64), shape (..., V), broadcastable against log_p.

    Returns:
        Tensor of shape broadcast(P, Q)[:-1]: D<->_inf(P, Q) in nats, >= 0, rounded up; +inf where a
        law has mass outside the other's support.
    """
    p_zero, q_zero = torch.isneginf(log_p), torch.isneginf(log_q)
    # a token outside one law's support counts for the other direction only (log 0 - log 0 is masked)
    forward = torch.where(p_zero, -torch.inf, log_p - log_q)
    backward = torch.where(q_zero, -torch.inf, log_q - log_p)
    value = torch.maximum(forward.amax(dim=-1), backward.amax(dim=-1)).clamp_min(0.0)
    magnitude = (torch.where(p_zero, 0.0, log_p.abs()).amax(dim=-1)
                 + torch.where(q_zero, 0.0, log_q.abs()).amax(dim=-1) + 2.0)
    return torch.where(torch.isfinite(value), value + ROUNDING_ULPS * magnitude * 2.0, value)


SOLVER_VERSION = 7
"""The records version whose mixing-weight solver arithmetic the CPU solver follows by default
(dpledger.mechanisms.fused.solve_mixing_weights): below 6, Newton points only; from 6, fitted-model
roots too; from 7, integer orders raised to powers by products instead of exp and log (lambdas within
~1e-15 of version 6's on the benchmark's paper-scale ensemble), and each moment's rounding allowance
with the worst case of a V-term sum ((V + 2) unit roundoffs, where earlier versions assumed log2 V). The replay of a trace follows the
version that wrote it (dpledger.decoding.runners.build_runner)."""

ADD_ONE_VERSION = 10
"""The records version whose add-one bound arithmetic dpledger.mechanisms.add_one follows by default: below
4, every order computed; from 4, the certified sub-grid from ADD_ONE_SUBGRID_MIN_VOCABULARY tokens on;
from 7, the chord sum as a nonnegative combination (one exp per token, add_one_weighted_order_sums) and
each sum's rounding allowance with the worst case of a sum of M terms, (M + 2) unit roundoffs; from 8,
orders on the lattice of tenths by products of per-token powers (add_one_power_order_sums); from 9,
each row of a batch on its own sub-grid (before, the rows of a decode block shared theirs, so a replay in
shorter windows could not reproduce the bits); from 10, the forward direction's sub-grid rounds compiled
(dpledger.mechanisms.fused.add_one_forward_round: the same certificate and bisection, with the C library's
exp, expm1, log and log1p where version 9 took numpy's, whose vectorised forms may differ in the last
bits, and with them a bisection decision; and the chord sum's shifts by vectorised exp and log,
dpledger.mechanisms.fused.add_one_shifts, whose error bound joins the chord's allowance). The replay of a
trace follows the version that wrote it
(dpledger.decoding.runners.build_runner)."""

SCREEN_VERSION = 10
"""The records version whose screening-statistic arithmetic dpledger.mechanisms.screening follows by default:
below 10, some twenty torch operations on the top-k columns (NoisyScreening.statistic_from_mean); from 10,
one compiled pass (dpledger.mechanisms.fused.screen_statistics: the same formula with vlog for torch's log
and fused multiply-adds, so other last bits and, for a statistic within them of the threshold, another
decision). The replay of a trace follows the version that wrote it (dpledger.decoding.runners.build_runner)."""


def mixing_weights(teachers: torch.Tensor, public: torch.Tensor, order: float, radius: float,
                   relative_tolerance: float = 1e-10, solver_version: int = SOLVER_VERSION) -> torch.Tensor:
    """Largest lambda in [0, 1] per teacher with D<->_order(lambda p_i + (1-lambda) p0, p0) <= radius.

    PMixED projection (Flemings et al. 2024, Algorithm 2 and Appendix C): the ball at one order.
    teachers: (..., N, V); public: (..., V). Returns lambdas (..., N) in float64.

    Args:
        teachers: the teachers' next-token probabilities, shape (..., N, V).
        public: the public model's probabilities, shape (..., V).
        order: the Renyi order alpha > 1 of the ball.
        radius: the ball's radius in nats (beta alpha in the paper's notation), > 0.
        relative_tolerance: how close, relative to the radius, the returned lambda's divergence must
            come to the boundary before the solver stops.
        solver_version: whose CPU solver arithmetic to follow (ball_mixing_weights).

    Returns:
        float64 tensor (..., N): each teacher's lambda in [0, 1].

    Raises:
        ValueError: if an input distribution holds NaN (CPU tensors).
    """
    return ball_mixing_weights(teachers, public, (order,), (radius,), None, relative_tolerance, solver_version)


def ball_mixing_weights(teachers: torch.Tensor, public: torch.Tensor, orders: Sequence[float], radii: Sequence[float],
                        max_radius: float | None = None, relative_tolerance: float = 1e-10,
                        solver_version: int = SOLVER_VERSION) -> torch.Tensor:
    """Largest lambda in [0, 1] per teacher such that the mixed teacher lambda p_i + (1-lambda) p0
    satisfies D<->_k(., p0) <= radius_k at every order k of `orders` and, when `max_radius` is
    given, D<->_inf(., p0) <= max_radius (Flemings et al. 2024, Algorithm 2 and Appendix C).

    Each divergence is non-decreasing in lambda (quasi-convexity, van Erven & Harremoes 2014
    Theorem 13, with value 0 at lambda = 0), and exp((k-1) D_k) of the mixed teacher is convex in
    lambda (a sum of p0_j (1 + lambda delta_j)^c, c = k > 1 or c = 1 - k < 0). CPU tensors run the
    fused safeguarded Newton solver (dpledger.mechanisms.fused.solve_mixing_weights), one teacher at a time
    in cache; a CUDA device with Triton runs one launch for balls of 1 to 8 orders
    (dpledger.mechanisms.device_kernels.ball_mixing_weights_device), and other devices and balls run
    ball_mixing_weights_torch there. Every way the returned value is
    the feasible end of a bracket, as evaluated in float64, 1e-12 inside the ball and within
    `relative_tolerance` * radius of its boundary (or 1e-12 in lambda).

    teachers: (..., N, V); public: (..., V). Returns lambdas (..., N) in float64.

    Args:
        teachers: the teachers' next-token probabilities, shape (..., N, V).
        public: the public model's probabilities, shape (..., V).
        orders: the constrained Renyi orders k > 1.
        radii: the radius in nats at each order of `orders` (same length), > 0.
        max_radius: the radius of D<->_inf in nats, or None for no such constraint.
        relative_tolerance: how close, relative to the smallest radius, the returned lambda's
            constraint must come to the boundary before the solver stops.
        solver_version: the records version whose CPU solver arithmetic to follow (SOLVER_VERSION
            says what each changed): a trace's replay must reproduce its lambdas to 1e-9.

    Returns:
        float64 tensor (..., N): each teacher's lambda in [0, 1].

    Raises:
        ValueError: if an input distribution holds NaN, inf or a negative probability, the shapes do
            not match (dpledger.mechanisms.distributions.public_per_step), or an order, radius or max_radius
            is out of range (dpledger.mechanisms.ball.require_ball).
    """
    if teachers.device.type != "cpu":
        if device_solver_enabled(teachers.device, len(orders)):   # one Triton launch
            return ball_mixing_weights_device(teachers, public, orders, radii, _SLACK_ULPS, max_radius,
                                              relative_tolerance=relative_tolerance)
        return ball_mixing_weights_torch(teachers, public, orders, radii, max_radius, relative_tolerance=relative_tolerance)
    from dpledger.mechanisms.fused import solve_mixing_weights

    require_ball(orders, radii, max_radius)
    orders_np = np.asarray([float(o) for o in orders], dtype=np.float64)
    # aim 1e-12 inside the ball: the divergence of the mixed teacher, recomputed elsewhere from
    # rows renormalised to sum to 1, may differ from this evaluation by a few ulps
    log_targets = np.asarray([(o - 1.0) * float(r) * (1.0 - 1e-12) for o, r in zip(orders_np, radii)])
    max_log_ratio = np.inf if max_radius is None else float(max_radius) * (1.0 - 1e-12)
    vocab = teachers.shape[-1]
    public = public_per_step(teachers, public)
    require_probabilities(teachers)
    require_probabilities(public)
    flat_teachers = np.ascontiguousarray(teachers.detach().double().numpy().reshape(-1, teachers.shape[-2], vocab))
    flat_public = np.ascontiguousarray(public.detach().double().numpy().reshape(-1, vocab))
    lambdas = np.empty(flat_teachers.shape[:2])
    evaluations = np.empty(flat_teachers.shape[:2], dtype=np.int64)
    _set_threads()
    for row in range(flat_teachers.shape[0]):
        solve_mixing_weights(flat_teachers[row], flat_public[row], orders_np, log_targets, max_log_ratio,
                             relative_tolerance, 200, _SLACK_ULPS, solver_version, lambdas[row],
                             evaluations[row])
    return torch.from_numpy(lambdas.reshape(teachers.shape[:-1]))


def ball_mixing_weights_torch(teachers: torch.Tensor, public: torch.Tensor, orders: Sequence[float],
                              radii: Sequence[float], max_radius: float | None = None, max_iterations: int = 60,
                              relative_tolerance: float = 1e-10) -> torch.Tensor:
    """ball_mixing_weights by the Illinois variant of regula falsi in torch, on the inputs' device,
    for all teachers at once (only teachers infeasible at lambda = 1 are iterated): the form a GPU
    runs, and the straightforward one the tests hold the fused solver to. The largest constraint
    excess is non-decreasing in lambda, so its root is bracketed by [0, 1]; the returned value is
    the feasible end of the bracket ("err on the small side").

    Args:
        teachers: the teachers' next-token probabilities, shape (..., N, V).
        public: the public model's probabilities, shape (..., V).
        orders: the constrained Renyi orders k > 1.
        radii: the radius in nats at each order of `orders` (same length), > 0.
        max_radius: the radius of D<->_inf in nats, or None for no such constraint.
        max_iterations: the most regula falsi steps.
        relative_tolerance: how close, relative to the smallest radius, the returned lambda's
            constraint must come to the boundary before the iteration stops.

    Returns:
        float64 tensor (..., N) on the inputs' device: each teacher's lambda in [0, 1].

    Raises:
        ValueError: if an input holds NaN, inf or a negative probability, the shapes do not match
            (dpledger.mechanisms.distributions.public_per_step), or an order, radius or max_radius is out of
            range (dpledger.mechanisms.ball.require_ball).
    """
    require_ball(orders, radii, max_radius)
    public = public_per_step(teachers, public).double()
    teachers = teachers.double()
    require_probabilities(teachers)
    require_probabilities(public)
    # aim 1e-12 inside the ball: the divergence of the mixed teacher, recomputed elsewhere from
    # rows renormalised to sum to 1, may differ from this evaluation by a few ulps
    radii_t = torch.tensor([float(r) * (1.0 - 1e-12) for r in radii], dtype=torch.float64, device=teachers.device)
    order_t = torch.tensor([float(o) for o in orders], dtype=torch.float64, device=teachers.device)
    # an infinite D<->_inf radius bounds nothing (as the CPU and device solvers read it): inf - inf would be NaN
    max_radius = None if max_radius is None or math.isinf(float(max_radius)) else float(max_radius) * (1.0 - 1e-12)
    smallest = min([float(radii_t.min())] + ([max_radius] if max_radius is not None else []))
    flat_teachers = teachers.reshape(-1, teachers.shape[-1])
    flat_public = public.unsqueeze(-2).expand(teachers.shape).reshape(-1, teachers.shape[-1])   # one law per teacher
    lambdas = torch.ones(flat_teachers.shape[0], dtype=torch.float64, device=teachers.device)

    def excess(p: torch.Tensor, q: torch.Tensor, log_q: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        mixed = lam.unsqueeze(-1) * p + (1.0 - lam.unsqueeze(-1)) * q
        log_mixed = _log(mixed)
        # the largest excess over the constraints: each is non-decreasing in lambda, so is their maximum
        symmetric = torch.maximum(renyi_divergence_orders_torch(log_mixed, log_q, order_t),
                                  renyi_divergence_orders_torch(log_q, log_mixed, order_t))
        worst = (symmetric - radii_t).amax(dim=-1)
        if max_radius is not None:
            worst = torch.maximum(worst, max_divergence_symmetric(log_mixed, log_q) - max_radius)
        return worst

    # `not <= 0`: a NaN excess at lambda = 1 is not feasible; iterated, it keeps the bracket's low end
    active = torch.nonzero(~(excess(flat_teachers, flat_public, _log(flat_public), lambdas) <= 0)).flatten()
    if active.numel() == 0:
        return lambdas.reshape(teachers.shape[:-1])
    p_active, q_active = flat_teachers[active], flat_public[active]   # gathered once
    log_q_active = _log(q_active)
    low = torch.zeros(active.numel(), dtype=torch.float64, device=teachers.device)
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
    """pbar_i = lambda_i p_i + (1 - lambda_i) p0, shape (..., N, V).

    Args:
        teachers: the teachers' probabilities p_i, shape (..., N, V).
        public: the public model's probabilities p0, shape (..., V).
        lambdas: the mixing weights lambda_i in [0, 1], shape (..., N).

    Returns:
        float64 tensor (..., N, V): the mixed teachers pbar_i.
    """
    lam = lambdas.double().unsqueeze(-1)
    return lam * teachers.double() + (1.0 - lam) * public.double().unsqueeze(-2)


def sums_without_each(values: torch.Tensor) -> torch.Tensor:
    """sum_{j != i} values[..., j, :] for every i along axis -2: shape (..., N, V).

    Formed from exclusive prefix and suffix sums, so no term is ever subtracted: `total - values[i]`
    loses every digit when teacher i holds almost all of a token's mass (1 - 0.9999999999999999),
    which under-stated Eq. 3 (33.96 against 34.58 for teachers (0.5, 0.5) and (1 - 1e-16, 6e-17)).
    All terms are non-negative, so the sums are accurate to N ulps relative.

    Args:
        values: non-negative values, shape (..., N, V) (N along axis -2).

    Returns:
        Tensor of the same shape and dtype: entry i holds the sum over the other N - 1 rows.
    """
    if values.device.type != "cpu":   # a row at a time would be 2N launches on a GPU
        return sums_without_each_by_scans(values)
    return _sums_without_each_by_rows(values)


def _sums_without_each_by_rows(values: torch.Tensor) -> torch.Tensor:
    """sums_without_each a row at a time (the CPU's form; benchmarks/bench_gpu.py times it on a GPU)."""
    # running sums in place, one row at a time: the same additions in the same order as exclusive
    # cumsums from each end (bitwise the same result), without their flipped and concatenated copies
    out = torch.empty_like(values)
    running = torch.zeros_like(values[..., 0, :])
    for i in range(values.shape[-2]):
        out[..., i, :] = running
        running += values[..., i, :]
    running.zero_()
    for i in range(values.shape[-2] - 1, -1, -1):
        out[..., i, :] += running
        running += values[..., i, :]
    return out


def sums_without_each_by_scans(values: torch.Tensor) -> torch.Tensor:
    """sums_without_each by two exclusive scans (torch.cumsum from each end) and one addition: a few
    launches on a GPU where the row-at-a-time form takes 2N. The device orders a scan's additions as it
    likes, but a sum of N non-negative terms is within N ulps relative in any order (Higham 2002,
    Section 4.2), so the bound of sums_without_each holds; the bits may differ from it.

    Args:
        values: non-negative values, shape (..., N, V) (N along axis -2).

    Returns:
        Tensor of the same shape and dtype: entry i holds the sum over the other N - 1 rows.
    """
    edge = torch.zeros_like(values[..., :1, :])
    before = torch.cat([edge, torch.cumsum(values[..., :-1, :], dim=-2)], dim=-2)
    after = torch.cat([torch.cumsum(values[..., 1:, :].flip(-2), dim=-2).flip(-2), edge], dim=-2)
    return before + after


_SCALE_BELOW = 2.0 ** -900
"""An ensemble with a positive probability below this is mixed and summed at 2^_SCALE_BITS times
its size: below the normal range (2.2e-308) a float keeps only a few significant bits, and a
ratio of two such numbers can be off by far more than the kernels' rounding allowance (Eq. 3 came
out 3e-6 relative below the exact value with subnormal entries at order 1.1)."""
_SCALE_BITS = 600
_LN2_HIGH = 6.93147180369123816490e-01  # ln 2 split as in fdlibm: S * _LN2_HIGH is exact for |S| < 2^11
_LN2_LOW = 1.90821492927058770002e-10


_SCRATCH = threading.local()
"""Per thread: the last _LeaveOneOut's (N, V) ratio rows and a weak reference to it."""


def _scratch_rows(owner: object, shape: tuple[int, ...]) -> tuple[FloatArray, FloatArray]:
    """Two (N, V) arrays for a _LeaveOneOut's ratios and their logs: the previous instance's of this
    thread when it is gone and the shape is the same, else fresh ones. Mapping them afresh at every
    step costs page faults (160 MB at N = 100, V = 50,257: about 10 ms); a live instance never
    shares its rows (only `reuse` does that, on purpose)."""
    kept = getattr(_SCRATCH, "rows", None)
    holder = getattr(_SCRATCH, "owner", None)
    if kept is None or kept[0].shape != shape or (holder is not None and holder() is not None):
        kept = (np.empty(shape), np.empty(shape))
    _SCRATCH.rows, _SCRATCH.owner = kept, weakref.ref(owner)
    return kept


class _LeaveOneOut:
    """One step's rows p_-i / p and their logs (dpledger.mechanisms.fused.leave_one_out_log_ratios) from the
    teachers, the public model and the lambdas, ready for exact log-moments at any order for any
    subset of teachers. Every ratio is scale-free, so an ensemble with probabilities below
    _SCALE_BELOW is mixed and summed scaled by 2^_SCALE_BITS (exact: a power of two), where each
    operation errs by a relative ulp, and log p is taken from the scaled sums. A ratio outside the
    normal range (dpledger.mechanisms.fused.RATIO_RANGE) gets its log from log p_-i - log p. In either case
    the log-moments read logs only (`shifted_only`), never the unscaled p or such a ratio."""

    scaled: bool
    output: FloatArray
    log_output: FloatArray
    ratios: FloatArray
    log_ratios: FloatArray
    spans: FloatArray
    shifted_only: bool
    magnitude: float

    def __init__(self, teachers: FloatArray, public: FloatArray, lambdas: FloatArray,
                 reuse: "_LeaveOneOut | None" = None, parallel: bool = False) -> None:
        """`parallel`: form the rows with the kernel's parallel twin (the audit's ablation, whose values
        are never recorded: trace kernels run serial, dpledger.mechanisms.fused._TRACE_FLAGS)."""
        from dpledger.mechanisms.fused import finite_magnitude, leave_one_out_log_ratios, leave_one_out_log_ratios_parallel

        teachers = np.ascontiguousarray(teachers, dtype=np.float64)
        public = np.ascontiguousarray(public, dtype=np.float64)
        lambdas = np.ascontiguousarray(lambdas, dtype=np.float64)
        self.scaled = bool(_has_tiny_positive(teachers, parallel) or _has_tiny_positive(public))
        if self.scaled:
            teachers, public = np.ldexp(teachers, _SCALE_BITS), np.ldexp(public, _SCALE_BITS)
        if reuse is not None and reuse.ratios.shape == teachers.shape:   # a block's steps share the buffers
            self.output, self.log_output, self.ratios = reuse.output, reuse.log_output, reuse.ratios
            self.log_ratios, self.spans = reuse.log_ratios, reuse.spans
        else:
            self.output = np.empty(teachers.shape[1])
            self.log_output = np.empty(teachers.shape[1])
            self.ratios, self.log_ratios = _scratch_rows(self, teachers.shape)
            self.spans = np.empty((teachers.shape[0], 2))
        ratio_kernel = leave_one_out_log_ratios_parallel if parallel else leave_one_out_log_ratios
        outside = ratio_kernel(teachers, public, lambdas, self.output, self.log_output, self.ratios, self.log_ratios,
                               self.spans)
        self.shifted_only = self.scaled or bool(outside)   # a ratio outside RATIO_RANGE is not accurate as a float
        if self.scaled:   # back to the true scale: log p exactly shifted, p itself only for the output law
            self.log_output = (self.log_output - _SCALE_BITS * _LN2_HIGH) - _SCALE_BITS * _LN2_LOW
            self.output = np.ldexp(self.output, -_SCALE_BITS)
        # the kernel's largest rounding scale: max_j |log p_j| + N + 2 + the widest log-rho span
        # (dpledger.mechanisms.fused.leave_one_out_log_moments); and a NaN anywhere in the teachers, the public
        # model or the lambdas reaches the mean
        largest_log, nan_output = finite_magnitude(np.ascontiguousarray(self.log_output), np.ascontiguousarray(self.output))
        spans = self.spans[:, 1] - self.spans[:, 0]
        self.magnitude = (largest_log + teachers.shape[0] + 2.0 + float(spans[np.isfinite(spans)].max(initial=0.0)))
        if nan_output or np.isnan(self.spans).any():
            raise ValueError("Renyi divergence is NaN: a mixed teacher holds NaN")

    @classmethod
    def of_mixed(cls, mixed: FloatArray) -> "_LeaveOneOut":
        """From already mixed teachers (lambda 1 on each, so pbar_i = mixed_i)."""
        return cls(mixed, np.zeros(mixed.shape[1]), np.ones(mixed.shape[0]))

    def moments(self, rows: IntArray, orders: FloatArray,
                wanted: NDArray[np.bool_] | None = None) -> tuple[FloatArray, FloatArray]:
        """(g, dg/da) for teachers `rows` at `orders`: g = (a - 1) D<->_a(p, p_-i), rounded up; with
        `wanted` (rows x orders, bool) only those pairs are computed (the rest are NaN)."""
        from dpledger.mechanisms.fused import leave_one_out_log_moments

        rows = np.ascontiguousarray(rows, dtype=np.int64)
        orders = np.ascontiguousarray(orders, dtype=np.float64)
        wanted = np.ones((rows.size, orders.size), dtype=bool) if wanted is None else np.ascontiguousarray(wanted)
        values = np.full((rows.size, orders.size), np.nan)
        slopes = np.full((rows.size, orders.size), np.nan)
        _set_threads()
        leave_one_out_log_moments(self.output, self.log_output, self.ratios, self.log_ratios, self.spans, rows, orders,
                                  wanted, self.shifted_only, _SLACK_ULPS, values, slopes, np.empty((0, orders.size, 2)))
        return values, slopes

    def direction_moments(self, rows: IntArray, orders: FloatArray, power: bool = True) -> FloatArray:
        """(2, R, K): g = (a - 1) D_a(p || p_-i) (forward) and (a - 1) D_a(p_-i || p) (reverse) for
        teachers `rows` at every order, each rounded up as `moments` rounds the larger; both +inf for
        a row where p_-i vanishes on a token p keeps (`spans` says which: its smallest log ratio is -inf).
        Increasing orders that are all multiples of 1/4 (the audit's) or of 1/10 (the default grid) take one
        exp pair per token for all of them (dpledger.mechanisms.fused.leave_one_out_direction_power_moments,
        whose allowance adds the products' rounding), unless power=False (the exp path at every order)."""
        from dpledger.mechanisms.fused import leave_one_out_direction_power_moments, leave_one_out_log_moments

        rows = np.ascontiguousarray(rows, dtype=np.int64)
        orders = np.ascontiguousarray(orders, dtype=np.float64)
        directions = np.empty((rows.size, orders.size, 2))
        _set_threads()
        denominator = _power_lattice(orders) if power else 0
        if denominator:
            leave_one_out_direction_power_moments(self.output, self.log_output, self.ratios, self.log_ratios,
                                                  self.spans, rows, orders, self.shifted_only, _SLACK_ULPS,
                                                  float(denominator), directions)
        else:
            values = np.empty((rows.size, orders.size))
            slopes = np.empty((rows.size, orders.size))
            leave_one_out_log_moments(self.output, self.log_output, self.ratios, self.log_ratios, self.spans, rows,
                                      orders, np.ones((rows.size, orders.size), dtype=bool), self.shifted_only,
                                      _SLACK_ULPS, values, slopes, directions)
        return np.moveaxis(directions, -1, 0)


def _power_lattice(orders: FloatArray) -> int:
    """The denominator d (4, else 10) of a lattice of multiples of 1/d holding every order exactly, for
    increasing orders whose steps stay below 2^13 lattice points (fused._POWER_LEVELS); 0 otherwise."""
    if orders.size == 0 or not np.all(np.diff(orders) > 0):
        return 0
    for denominator in (4, 10):
        points = denominator * orders
        # exactly: k / 10 is not a float, so the order must be the float nearest k / 10
        if np.array_equal(np.round(points) / denominator, orders) and np.diff(np.round(points), prepend=0.0).max() < 2 ** 13:
            return denominator
    return 0


def _has_tiny_positive(values: FloatArray, parallel: bool = False) -> bool:
    from dpledger.mechanisms.fused import has_positive_below, has_positive_below_parallel

    scan = has_positive_below_parallel if parallel else has_positive_below
    return bool(scan(np.ascontiguousarray(values).reshape(-1), _SCALE_BELOW))


def leave_one_out_divergences_torch(mixed: torch.Tensor, orders: torch.Tensor, mask: torch.Tensor | None = None,
                                    public: torch.Tensor | None = None) -> torch.Tensor:
    """leave_one_out_divergences in torch on the inputs' device (and with a Poisson mask): the GPU
    form, and the straightforward one the tests hold the fused kernels to.

    Args:
        mixed: the mixed teachers pbar_i, shape (..., N, V).
        orders: the Renyi orders a > 1, shape (K,).
        mask: which teachers are in the ensemble, bool shape (..., N), or None for all of them.
        public: the public model's probabilities, shape (..., V); required with a mask.

    Returns:
        float64 tensor (..., N, K): D<->_a(p, p_{-i}) in nats, rounded up (0 for an unmasked teacher).

    Raises:
        ValueError: if N < 2 without a mask, a mask comes without `public`, or a divergence is NaN.
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
