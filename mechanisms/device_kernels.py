"""The log-space Renyi moments log sum_j exp(b_j + a r_j) at many orders a, on a CUDA device in one
Triton kernel: the GPU's form of the order loop in dpledger.mechanisms.kernels.renyi_divergence_orders_torch
(which adds the rounding allowance and the special cases around it). Elsewhere, and where Triton is
not installed, the loop of torch.logsumexp calls runs, one per order.

Why one kernel: at the paper's scale (N = 100 teachers, V = 50,257 tokens, the 156 orders of
dpledger.accounting.orders.DEFAULT_ORDERS) Eq. 3 takes 2 x 156 logsumexps over a (100, 50257) tensor,
each of which torch runs as several passes over memory; the kernel reads each row's b and r once per
block of orders from cache and does one exp per token and order (benchmarks/bench_gpu.py measures
both on the device, side by side).

The arithmetic is logsumexp's, so the allowance that dpledger.mechanisms.kernels adds covers it: the
kernel takes the maximum m of x_j = b_j + a r_j over the row, then m + log sum_j exp(x_j - m).
Its x_j is rounded at most as the torch form's (Triton may fuse the product and the sum into one
fused multiply-add, one rounding instead of two); the sum of V non-negative terms is within (V - 1) u
of its value in any order of addition (Higham 2002, Section 4.2), which the allowance's (V + 2) u
covers; and CUDA's double-precision exp and log are within 1 ulp (CUDA C++ Programming Guide,
Appendix "Mathematical Functions", double-precision table), inside the 2 ulps the allowance assumes.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import TYPE_CHECKING, Any, Sequence

from dpledger.accounting.errors import require
from dpledger.accounting.lazy_import import lazy_module
from dpledger.accounting.rounding import ROUNDING_ULPS, UNIT_ROUNDOFF
from dpledger.mechanisms.distributions import public_per_step, require_probabilities

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light

_BLOCK_ORDERS = 4
"""Orders per program: the program's (orders x tokens) tile of float64 partial sums stays in registers."""
_BLOCK_TOKENS = 256
"""Tokens per step of a program's walk along its row."""
_SOLVER_BLOCK_TOKENS = 2048
"""Tokens per step of the solver's walk along its teacher's row."""
_SOLVER_WARPS = 8
"""Warps per solver program (one program per teacher)."""


def triton_moments_enabled(device: torch.device) -> bool:
    """Whether log_moments runs the Triton kernel for tensors on `device`: a CUDA device (not ROCm's,
    which torch names "cuda" too), Triton importable, and DPLEDGER_TRITON not set to 0
    (benchmarks/bench_gpu.py sets it to time the torch loop beside the kernel). TRITON_INTERPRET=1 runs
    the kernel on the CPU in Triton's interpreter (the tests' way to check it without a GPU).

    Args:
        device: where the tensors are.

    Returns:
        True where the kernel runs.
    """
    if os.environ.get("DPLEDGER_TRITON", "1") == "0":
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return _triton_kernels() is not None
    # ROCm's torch calls its devices "cuda" too; the rounding argument above is CUDA's math library's
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    return _triton_kernels() is not None


@functools.lru_cache(maxsize=1)
def _triton_kernels() -> Any:
    """dpledger.mechanisms.triton_kernels, or None where Triton cannot be imported."""
    try:
        from dpledger.mechanisms import triton_kernels  # deferred: imports Triton, optional, CUDA devices only
    except ImportError:
        return None
    return triton_kernels


def log_moments(base: torch.Tensor, ratio: torch.Tensor, orders: torch.Tensor) -> torch.Tensor:
    """log sum_j exp(base_j + a ratio_j) over the last axis, for each order a: the logsumexp the
    Renyi moments of dpledger.mechanisms.kernels.renyi_divergence_orders_torch take (base = log Q,
    ratio = log P - log Q, -inf where P_j = 0). Not rounded up: the caller adds the allowance.

    Args:
        base: float64 tensor (..., V): finite, or -inf where P_j = Q_j = 0 (with ratio -inf there too: the
            token adds nothing).
        ratio: float64 tensor (..., V) of the same shape, finite or +-inf (+inf where P_j > 0 = Q_j: the
            row's value is +inf, which the caller replaces by its own special case).
        orders: float64 tensor (K,) of orders on the same device.

    Returns:
        float64 tensor (..., K) on the inputs' device: each row's logsumexp at each order (-inf for a
        row whose ratio is -inf throughout); (..., 0) for no orders.
    """
    if orders.numel() == 0:
        return base.new_empty((*base.shape[:-1], 0))
    if not triton_moments_enabled(base.device) or base.numel() == 0:
        return torch.stack([torch.logsumexp(base + order * ratio, dim=-1) for order in orders], dim=-1)
    vocab = base.shape[-1]
    rows_base = base.reshape(-1, vocab).contiguous()
    rows_ratio = ratio.reshape(-1, vocab).contiguous()
    grid_orders = orders.contiguous()
    out = torch.empty((rows_base.shape[0], grid_orders.numel()), dtype=torch.float64, device=base.device)
    blocks = (grid_orders.numel() + _BLOCK_ORDERS - 1) // _BLOCK_ORDERS
    _launch(_triton_kernels().log_moments_kernel, (rows_base.shape[0], blocks), base.device,
            rows_base, rows_ratio, grid_orders, out, grid_orders.numel(),
            vocab=vocab, block_orders=_BLOCK_ORDERS, block_tokens=_BLOCK_TOKENS)
    return out.reshape(*base.shape[:-1], grid_orders.numel())


def _launch(kernel: Any, grid: tuple[int, ...], device: torch.device, *arguments: Any, **options: Any) -> None:
    """kernel[grid](*arguments, **options) on `device` (Triton launches on the current CUDA device; under
    TRITON_INTERPRET=1 the CPU's tensors need no device)."""
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        kernel[grid](*arguments, **options)


_MAX_DEVICE_CONSTRAINTS = 8
"""The most ball orders the device solver takes (the paper's ball has 1, the proof-orders ball 2); a
ball with more (the all-orders ball's grid) runs dpledger.mechanisms.kernels.ball_mixing_weights_torch."""


def device_solver_enabled(device: torch.device, constraint_count: int) -> bool:
    """Whether ball_mixing_weights_device runs for tensors on `device` with this many ball orders: as
    triton_moments_enabled, and at most _MAX_DEVICE_CONSTRAINTS orders.

    Args:
        device: where the tensors are.
        constraint_count: the number of constrained orders.

    Returns:
        True where the device solver runs.
    """
    return 1 <= constraint_count <= _MAX_DEVICE_CONSTRAINTS and triton_moments_enabled(device)


def ball_mixing_weights_device(teachers: torch.Tensor, public: torch.Tensor, orders: Sequence[float],
                               radii: Sequence[float], slack_ulps: float, max_radius: float | None = None,
                               max_iterations: int = 60, relative_tolerance: float = 1e-10) -> torch.Tensor:
    """dpledger.mechanisms.kernels.ball_mixing_weights_torch in one Triton launch: one program per teacher
    runs the same Illinois iteration, each evaluation one fused walk of its row (the mixed teacher,
    its logs, both directions' Renyi moments at every ball order, rounded up by the allowance of
    renyi_divergence_orders_torch, and D<->_inf's), where the torch form launches some sixty kernels
    per evaluation and synchronises at every iteration. The returned lambda is the feasible end of the
    bracket, as evaluated with that allowance: the mixed teacher is inside the ball (radii aimed
    1e-12 inside, as the torch form). The kernel forms lam p + (1 - lam) q as the compiler likes (a
    fused multiply-add may save a rounding), so its mixed teacher may differ from mixed_teachers' by an
    ulp per token; the 1e-12 aim and the allowance cover that, as they cover a renormalised row. The
    lambdas may differ from the torch form's in their last bits.

    Args:
        teachers: the teachers' probabilities, float64 (..., N, V) on a CUDA device (or the CPU under
            TRITON_INTERPRET=1), finite and non-negative.
        public: the public model's probabilities, float64 (..., V) on the same device, broadcastable to
            the teachers' steps (one law may serve a batch, as in the torch solver).
        orders: the constrained orders k > 1 (1 to _MAX_DEVICE_CONSTRAINTS of them).
        radii: the radius in nats at each order, > 0.
        slack_ulps: the allowance per unit of magnitude (dpledger.mechanisms.kernels' _SLACK_ULPS).
        max_radius: the radius of D<->_inf in nats (> 0; inf: no bound), or None.
        max_iterations: the most Illinois steps per teacher.
        relative_tolerance: as ball_mixing_weights_torch.

    Returns:
        float64 tensor (..., N) on the inputs' device: each teacher's lambda in [0, 1].

    Raises:
        ValueError: if an input holds NaN, inf or a negative value, the shapes or devices do not match, an
            order is not > 1, a radius not > 0, or the ball has no order or more than _MAX_DEVICE_CONSTRAINTS.
    """
    require(1 <= len(orders) <= _MAX_DEVICE_CONSTRAINTS and len(radii) == len(orders),
            f"the device solver takes 1 to {_MAX_DEVICE_CONSTRAINTS} ball orders with one radius each, "
            f"got {len(orders)} orders and {len(radii)} radii")
    for order, radius in zip(orders, radii):
        require(math.isfinite(float(order)) and float(order) > 1.0, f"ball orders must be finite and > 1, got {order}")
        require(math.isfinite(float(radius)) and float(radius) > 0.0, f"ball radii must be finite and > 0, got {radius}")
    require(max_radius is None or float(max_radius) > 0.0, f"max_radius must be None or > 0, got {max_radius}")
    if max_radius is not None and math.isinf(float(max_radius)):   # no bound on D<->_inf, as the CPU solver reads it
        max_radius = None
    require(public.device == teachers.device,
            f"public must be on the teachers' device {teachers.device}, got {public.device}")
    public = public_per_step(teachers, public).double()   # one law may serve a batch, as in the torch solver
    vocab = teachers.shape[-1]
    teachers = teachers.double()
    require_probabilities(teachers)
    require_probabilities(public)
    radii_aimed = [float(r) * (1.0 - 1e-12) for r in radii]
    limit = None if max_radius is None else float(max_radius) * (1.0 - 1e-12)
    smallest = min(radii_aimed + ([limit] if limit is not None else []))
    flat_teachers = teachers.reshape(-1, vocab).contiguous()
    flat_public = public.reshape(-1, vocab).contiguous()
    out = torch.empty(flat_teachers.shape[0], dtype=torch.float64, device=teachers.device)
    if out.numel() == 0:
        return out.reshape(teachers.shape[:-1])
    orders_t = torch.tensor([float(o) for o in orders], dtype=torch.float64, device=teachers.device)
    radii_t = torch.tensor(radii_aimed, dtype=torch.float64, device=teachers.device)
    scalars = torch.tensor([0.0 if limit is None else limit, smallest, relative_tolerance * smallest,
                            slack_ulps, ROUNDING_ULPS, math.log2(vocab) + 2.0, (vocab + 2.0) * UNIT_ROUNDOFF, 1.0,
                            1e-12],
                           dtype=torch.float64, device=teachers.device)
    arguments = (flat_teachers, flat_public, orders_t, radii_t, scalars, out, teachers.shape[-2], len(orders),
                 int(limit is not None), max_iterations)
    _launch(_triton_kernels().solve_kernel, (flat_teachers.shape[0],), teachers.device, *arguments, vocab=vocab,
            block_constraints=1 << (len(orders) - 1).bit_length(), block_tokens=_SOLVER_BLOCK_TOKENS,
            num_warps=_SOLVER_WARPS)
    return out.reshape(teachers.shape[:-1])
