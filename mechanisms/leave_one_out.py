"""Flemings et al. 2024, Eq. 3: PMixED's data-dependent privacy loss max_i D<->_a(p, p_{-i}) of one
step (removing teacher i from the ensemble of mixed teachers), exact at every order
(`leave_one_out_divergences`), its curve over a grid of orders with chord certificates
(`leave_one_out_curve`: exact on a sub-grid, a certified upper bound in between), and each removal's two
directions apart (`leave_one_out_direction_divergences`, the audit's neighbours).

The numerics it runs on (the fused CPU kernels and their torch forms on a GPU, with the same rounding
up) are in dpledger.mechanisms.kernels.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpledger.accounting.errors import require
from dpledger.accounting.orders import validated_orders
from dpledger.accounting.rounding import ROUNDING_ULPS, UNIT_ROUNDOFF
from dpledger.mechanisms.kernels import (_SLACK_ULPS, FloatArray, IntArray, _divergences_from_moments, _LeaveOneOut, _power_lattice,
                                         leave_one_out_divergences_torch, mixed_teachers,
                                         renyi_divergence_orders, sums_without_each)
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light


def leave_one_out_divergences(mixed: torch.Tensor, orders: torch.Tensor, mask: torch.Tensor | None = None,
                              public: torch.Tensor | None = None) -> torch.Tensor:
    """D<->_a(p, p_{-i}) for every teacher i and order a, exact at every order: shape (..., N, K).

    p = mean_i pbar_i and p_{-i} = sum_{j != i} pbar_j / (N - 1) (Flemings et al. 2024, Eq. 3),
    summed without subtraction (`sums_without_each`). The other teachers' lambdas do not change
    when i is removed (each depends on p_i and p0 only).
    With `mask` (..., N), only the masked (e.g. Poisson-sampled) teachers form the ensemble:
    removing an unsampled teacher changes nothing (divergence 0), and removing the only sampled
    teacher leaves the public model `public` (..., V), PMixED's answer for an empty ensemble.
    Unmasked CPU input runs the fused kernels (dpledger.mechanisms.fused); the rest runs in torch.

    Args:
        mixed: the mixed teachers pbar_i, shape (..., N, V).
        orders: the Renyi orders a > 1, shape (K,).
        mask: which teachers are in the ensemble, bool shape (..., N), or None for all of them.
        public: the public model's probabilities, shape (..., V); required with a mask.

    Returns:
        float64 tensor (..., N, K): D<->_a(p, p_{-i}) in nats for every teacher i, rounded up.

    Raises:
        ValueError: if N < 2 without a mask, a mask comes without `public`, or a divergence is NaN
            (an input holds NaN).
    """
    n = mixed.shape[-2]
    if mask is None and mixed.device.type == "cpu":
        if n < 2:
            raise ValueError(f"leave-one-out needs an ensemble of at least 2 teachers, got {n}")
        orders_np = orders.detach().cpu().double().numpy().reshape(-1)
        flat = mixed.detach().double().reshape(-1, n, mixed.shape[-1]).numpy()
        out = np.empty((flat.shape[0], n, orders_np.size))
        for row in range(flat.shape[0]):
            ratios = _LeaveOneOut.of_mixed(flat[row])
            out[row] = _divergences_from_moments(ratios.moments(np.arange(n), orders_np)[0], orders_np)
        return torch.from_numpy(out.reshape(*mixed.shape[:-1], orders_np.size))
    return leave_one_out_divergences_torch(mixed, orders, mask, public)



def leave_one_out_direction_divergences(teachers: torch.Tensor, public: torch.Tensor, lambdas: torch.Tensor,
                                        rows: list[int], orders: torch.Tensor,
                                        prepared: Sequence[_LeaveOneOut] | None = None
                                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """D_a(p || p_-i) and D_a(p_-i || p) apart, for the teachers i in `rows` at every order, with p the
    mean of the mixed teachers lambda_i p_i + (1 - lambda_i) p0 and p_-i the mean without teacher i
    (Flemings et al. 2024, Eq. 3, before its maximum over i and the two directions): the audit's
    removal neighbours. CPU tensors; one exp pair per token, order and teacher, from the same kernel
    and rounding up as Eq. 3 (dpledger.mechanisms.fused.leave_one_out_log_moments). A step where some
    p_-i vanishes on a token p keeps (its forward divergence is +inf, its reverse finite) is computed
    directly in the Renyi kernel instead.

    Args:
        teachers: the teachers' probabilities p_i, shape (L, N, V), N >= 2, on the CPU.
        public: the public model's probabilities p0, shape (L, V).
        lambdas: the mixing weights, shape (L, N).
        rows: the teachers i to remove (indices into N).
        orders: the Renyi orders a > 1, shape (K,).
        prepared: each step's rows p_-i / p already formed (prepared_leave_one_out) from exactly these
            teachers, public model and lambdas; None: formed here.

    Returns:
        (p as a float64 tensor (L, V), float64 tensor (2, L, len(rows), K): forward D_a(p || p_-i) and
        reverse D_a(p_-i || p) in nats, rounded up).

    Raises:
        ValueError: if the shapes disagree, N < 2, a row is not a teacher's index, an order is not > 1,
            or a divergence is NaN (an input holds NaN).
    """
    require(teachers.ndim == 3 and tuple(public.shape) == (teachers.shape[0], teachers.shape[2])
            and tuple(lambdas.shape) == tuple(teachers.shape[:2]),
            f"leave-one-out needs teachers (L, N, V), public (L, V) and lambdas (L, N), got shapes "
            f"{tuple(teachers.shape)}, {tuple(public.shape)} and {tuple(lambdas.shape)}")
    length, n, vocab = teachers.shape
    if n < 2:
        raise ValueError(f"leave-one-out needs an ensemble of at least 2 teachers, got {n}")
    orders_np = validated_orders(orders.detach().cpu().double().numpy().reshape(-1))
    rows_np = np.asarray(rows, dtype=np.int64).reshape(-1)
    require(bool(np.all((rows_np >= 0) & (rows_np < n))), f"rows must be teacher indices in [0, {n}), got {rows!r}")
    flat_teachers, flat_public = teachers.detach().double().numpy(), public.detach().double().numpy()
    flat_lambdas = lambdas.detach().double().numpy()
    output = np.empty((length, vocab))
    divergences = np.empty((2, length, rows_np.size, orders_np.size))
    require(prepared is None or len(prepared) == length, f"prepared must hold one step's rows per step ({length}), "
            f"got {None if prepared is None else len(prepared)}")
    ratios = None
    for step in range(length):
        ratios = prepared[step] if prepared is not None else \
            _LeaveOneOut(flat_teachers[step], flat_public[step], flat_lambdas[step], ratios, parallel=True)
        output[step] = ratios.output
        if np.isneginf(ratios.spans[rows_np, 0]).any():   # a neighbour without mass where p has some
            mixed = mixed_teachers(teachers[step], public[step], lambdas[step])
            log_without = torch.log(sums_without_each(mixed)[rows_np] / (n - 1))
            log_output = torch.log(torch.from_numpy(ratios.output)).unsqueeze(0)
            orders_t = torch.from_numpy(orders_np)
            divergences[0, step] = renyi_divergence_orders(log_output, log_without, orders_t, parallel=True).numpy()
            divergences[1, step] = renyi_divergence_orders(log_without, log_output, orders_t, parallel=True).numpy()
            continue
        moments = ratios.direction_moments(rows_np, orders_np)
        divergences[:, step] = _divergences_from_moments(moments.reshape(-1, orders_np.size),
                                                         orders_np).reshape(moments.shape)
    return torch.from_numpy(output), torch.from_numpy(divergences)


def leave_one_out_curve(teachers: torch.Tensor, public: torch.Tensor, lambdas: torch.Tensor, orders: ArrayLike,
                        relative_tolerance: float | None = 0.005, magnitudes: FloatArray | None = None
                        ) -> tuple[FloatArray, NDArray[np.bool_], torch.Tensor]:
    """max_i D<->_a(p, p_{-i}) (Flemings et al. 2024, Eq. 3) at every order of the sorted grid
    `orders`, for the ensemble of mixed teachers lambda_i p_i + (1 - lambda_i) p0: exact on a
    sub-grid, a sound upper bound within `relative_tolerance` of the exact value everywhere else.
    teachers (..., N, V), public (..., V), lambdas (..., N) -> (values (..., K), exact (..., K) bool,
    p = the mixed teachers' mean (..., V)).

    Why it is sound: g_i(a) = (a - 1) D_a(P || Q) = log sum_j Q_j exp(a log(P_j / Q_j)) is the log
    of a sum of exponentials of affine functions of a, hence convex in a (Hoelder's inequality; van
    Erven & Harremoes 2014, Corollary 2), and so is the larger of the two directions. Between two
    sub-grid orders s < t, g_i lies under its chord; at s and t it lies above its tangents (the
    kernel gives the derivative). So max_i chord_i(a) >= max_i g_i(a) >= max_i tangent_i(a), and the
    sub-grid is refined (the interval with the widest gap is bisected) until
    max chord <= (1 + relative_tolerance) max tangent at every grid order. A teacher whose chord at
    a new order lies below the lower bound there cannot be the maximum and is not evaluated (its
    chord value stands in, still an upper bound). relative_tolerance=None evaluates every teacher at
    every order (exact everywhere, in the same arithmetic). Tensors on a GPU get exact values at
    every order (leave_one_out_divergences there), all marked exact.

    Args:
        teachers: the teachers' probabilities p_i, shape (..., N, V), N >= 2.
        public: the public model's probabilities p0, shape (..., V).
        lambdas: the mixing weights lambda_i in [0, 1], shape (..., N).
        orders: the Renyi orders a > 1, strictly increasing, shape (K,).
        relative_tolerance: the certificate's relative gap between the chord bound and the tangent
            lower bound (0.005: within 0.5%); None evaluates every teacher at every order.
        magnitudes: where given (CPU only), filled with each step's rounding scale M, shape (prod(...),):
            what eq3_allowance_of takes (the replay's comparison of two computations of the step).

    Returns:
        (values, exact, p): values float64 (..., K), max_i D<->_a(p, p_{-i}) in nats (exact or an
        upper bound); exact bool (..., K), True where the value was evaluated exactly; p the mixed
        teachers' mean, float64 tensor (..., V).

    Raises:
        ValueError: if the orders are not strictly increasing, N < 2, or a divergence is NaN (an
            input holds NaN).
    """
    grid = np.asarray(orders, dtype=np.float64).reshape(-1)
    if not np.all(np.diff(grid) > 0):
        raise ValueError("leave_one_out_curve needs strictly increasing orders")
    if relative_tolerance is not None and grid.size == 0:
        raise ValueError("leave_one_out_curve's sub-grid needs at least one order, got none")
    n = teachers.shape[-2]
    if n < 2:
        raise ValueError(f"leave-one-out needs an ensemble of at least 2 teachers, got {n}")
    if magnitudes is not None:
        steps = math.prod(teachers.shape[:-2])
        require(teachers.device.type == "cpu" and magnitudes.shape == (steps,),
                f"magnitudes must hold one value per step of a CPU ensemble, shape ({steps},), got "
                f"{magnitudes.shape} on {teachers.device.type}")
    if teachers.device.type != "cpu":
        mixed = mixed_teachers(teachers, public, lambdas)
        exact_values = leave_one_out_divergences(mixed, torch.from_numpy(grid).to(mixed.device)).amax(dim=-2)
        values = exact_values.cpu().numpy()
        return values, np.ones(values.shape, dtype=bool), mixed.mean(dim=-2)
    vocab = teachers.shape[-1]
    flat_teachers = teachers.detach().double().reshape(-1, n, vocab).numpy()
    flat_public = public.detach().double().reshape(-1, vocab).numpy()
    flat_lambdas = lambdas.detach().double().reshape(-1, n).numpy()
    values = np.empty((flat_teachers.shape[0], grid.size))
    exact = np.zeros((flat_teachers.shape[0], grid.size), dtype=bool)
    output = np.empty((flat_teachers.shape[0], vocab))
    ratios = None
    for row in range(flat_teachers.shape[0]):
        ratios = _LeaveOneOut(flat_teachers[row], flat_public[row], flat_lambdas[row], ratios)
        if relative_tolerance is None:
            values[row] = _divergences_from_moments(ratios.moments(np.arange(n), grid)[0].max(axis=0)[None], grid)[0]
            exact[row] = True
        else:
            values[row], exact[row] = _refined_curve(ratios, n, grid, relative_tolerance)
        output[row] = ratios.output
        if magnitudes is not None:
            magnitudes[row] = ratios.magnitude
    batch = tuple(teachers.shape[:-2])
    return (values.reshape(*batch, grid.size), exact.reshape(*batch, grid.size),
            torch.from_numpy(output.reshape(*batch, vocab)))


def leave_one_out_allowance(teachers: torch.Tensor, public: torch.Tensor, lambdas: torch.Tensor, orders: ArrayLike,
                            values: ArrayLike) -> FloatArray:
    """The rounding allowance, in nats, that the leave-one-out kernels add to each Eq. 3 value
    (dpledger.mechanisms.fused.leave_one_out_log_moments, at its largest over the teachers), the
    bound against which two computations of the same step are compared.

    Derivation: at order a the kernel computes g = (a - 1) D<->_a(p, p_-i) with an error below
    s(a) = _SLACK_ULPS ((a + 1) M + log2 V + 2 + |g|) + (V + 2) u, M = max_j |log p_j| + N + 2 + the
    widest row's log-ratio span (each exponent a log rho_j - a log rho_max carries ~(a + 1) ulps of its
    terms, the N-term sums behind rho N ulps, the final log |g|; the V-term sum (V + 2) u, its worst
    case in any order of addition, Higham 2002, Section 4.2, u = 2^-53; ROUNDING_ULPS
    is 8 ulps per unit, 4x the 2-ulp error of the vectorised exp and log and 3.2x the 2.5 ulps of the
    exp pair the fast path takes), and returns g + s(a).
    So every returned value lies in [exact, exact + 2 s(a)], whatever the order of its sums (vector
    width, thread count, cached or fresh code), and two returned values of one step differ by at most
    2 s(a) / (a - 1) in D; a charge below the exact Eq. 3 by more than that cannot come from the kernels.
    A chord bound between sub-grid orders (leave_one_out_curve) carries 2 s(a) on top and is never
    below a returned value.

    Args:
        teachers: the teachers' probabilities p_i, shape (..., N, V), N >= 2, on the CPU.
        public: the public model's probabilities p0, shape (..., V).
        lambdas: the mixing weights lambda_i in [0, 1], shape (..., N).
        orders: the Renyi orders a > 1, shape (K,).
        values: the Eq. 3 values D (nats) the allowance is for, shape (..., K) (|g| enters s(a)).

    Returns:
        float64 array (..., K): s(a) / (a - 1), the allowance on D at each step and order.

    Raises:
        ValueError: if N < 2 or an order is not > 1.
    """
    grid = np.asarray(orders, dtype=np.float64).reshape(-1)
    if not np.all(grid > 1.0):
        raise ValueError(f"Renyi orders must be > 1, got {float(grid.min())!r}")
    flat_teachers, flat_public, flat_lambdas = _flat_ensemble(teachers, public, lambdas)
    magnitude = np.empty(flat_teachers.shape[0])
    ratios = None
    for row in range(flat_teachers.shape[0]):
        ratios = _LeaveOneOut(flat_teachers[row], flat_public[row], flat_lambdas[row], ratios)
        magnitude[row] = ratios.magnitude
    allowance: FloatArray = eq3_allowance_of(magnitude, grid, teachers.shape[-1], values).reshape(
        *teachers.shape[:-2], grid.size)
    return allowance


def _flat_ensemble(teachers: torch.Tensor, public: torch.Tensor,
                   lambdas: torch.Tensor) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The ensemble as float64 numpy rows: teachers (S, N, V), public (S, V), lambdas (S, N); ValueError
    for N < 2 (a leave-one-out needs two teachers)."""
    n, vocab = teachers.shape[-2], teachers.shape[-1]
    if n < 2:
        raise ValueError(f"leave-one-out needs an ensemble of at least 2 teachers, got {n}")
    return (teachers.detach().double().reshape(-1, n, vocab).numpy(), public.detach().double().reshape(-1, vocab).numpy(),
            lambdas.detach().double().reshape(-1, n).numpy())


def prepared_leave_one_out(teachers: torch.Tensor, public: torch.Tensor, lambdas: torch.Tensor) -> list[_LeaveOneOut]:
    """Each step's rows p_-i / p and their logs (the leave-one-out kernel's parallel twin, as the audit's
    checks form them), for callers that read them more than once: leave_one_out_every_order and
    leave_one_out_direction_divergences take them as `prepared`.

    Args:
        teachers: the teachers' probabilities p_i, shape (..., N, V), N >= 2, on the CPU.
        public: the public model's probabilities p0, shape (..., V).
        lambdas: the mixing weights lambda_i in [0, 1], shape (..., N).

    Returns:
        One entry per step (the leading axes flattened), each holding its own arrays.

    Raises:
        ValueError: if N < 2, or an input holds NaN.
    """
    flat_teachers, flat_public, flat_lambdas = _flat_ensemble(teachers, public, lambdas)
    return [_LeaveOneOut(flat_teachers[row], flat_public[row], flat_lambdas[row], parallel=True)
            for row in range(flat_teachers.shape[0])]


def eq3_allowance_of(magnitudes: FloatArray, orders: ArrayLike, vocab: int, values: ArrayLike) -> FloatArray:
    """leave_one_out_allowance from each step's rounding scale M (leave_one_out_curve's `magnitudes`,
    which the decode loop's own computation fills, so a replay need not form the ratios again):
    s(a) / (a - 1) with s(a) = _SLACK_ULPS ((a + 1) M + log2 V + 2 + |g|) + (V + 2) u.

    Args:
        magnitudes: M per step, shape (S,).
        orders: the Renyi orders a > 1, shape (K,).
        vocab: the vocabulary size V.
        values: the Eq. 3 values D (nats), S x K values in any shape (|g| = (a - 1) |D| enters s(a)).

    Returns:
        float64 array (S, K): the allowance on D at each step and order.
    """
    grid = np.asarray(orders, dtype=np.float64).reshape(-1)
    moments = np.abs(np.asarray(values, dtype=np.float64).reshape(-1, grid.size)) * (grid - 1.0)
    slack = _SLACK_ULPS * ((grid + 1.0) * np.asarray(magnitudes, dtype=np.float64).reshape(-1, 1)
                           + np.log2(vocab) + 2.0 + moments) + (vocab + 2.0) * UNIT_ROUNDOFF
    allowance: FloatArray = slack / (grid - 1.0)
    return allowance


def leave_one_out_every_order(teachers: torch.Tensor, public: torch.Tensor, lambdas: torch.Tensor,
                              orders: ArrayLike, charges: ArrayLike | None = None,
                              prepared: Sequence[_LeaveOneOut] | None = None
                              ) -> tuple[FloatArray, FloatArray, torch.Tensor]:
    """Eq. 3 (Flemings et al. 2024), max_i D<->_a(p, p_-i), every teacher at every order of `orders`
    (no sub-grid, no chords), with each value's rounding allowance: what the audit holds a charge to.
    Each value lies in [Eq. 3, Eq. 3 + 2 allowance] (the kernel rounds up by the allowance, and errs by
    less). Orders on the lattice of quarters or tenths (the audit's, the default grid) take one exp pair
    per token for all orders together (dpledger.mechanisms.fused.leave_one_out_direction_power_moments),
    whose allowance adds the products' rounding, 6 d a u, and the float order's gap to its lattice point
    times the log-ratio span; other grids take the exp path (leave_one_out_allowance's allowance).

    With `charges` (what a charge must cover), a teacher is evaluated at every order only where that is
    needed to compare it with the charge: first at every COVER_STRIDES[0]-th order (and both ends), then
    more densely, and at every order last. g_i(a) = (a - 1) D<->_a(p, p_-i) is convex in a (as for
    leave_one_out_curve: van Erven & Harremoes 2014, Corollary 2), so its chord between two evaluated orders,
    from values rounded up, bounds it from above; a teacher whose chord (rounded up) lies at or below the
    charge's (a - 1) D at every order is covered there and evaluated no further. Where every teacher is
    covered so, an order's value is the largest chord: an upper bound of Eq. 3 at most the charge, not
    within 2 allowance of Eq. 3; everywhere else it is Eq. 3 as above. So `values <= charges` holds at an
    order exactly when it would without `charges`, within the allowance. A grid that is not strictly
    increasing is evaluated at every order (a chord between neighbouring entries would extrapolate).

    Args:
        teachers: the teachers' probabilities p_i, shape (..., N, V), N >= 2, on the CPU.
        public: the public model's probabilities p0, shape (..., V).
        lambdas: the mixing weights lambda_i in [0, 1], shape (..., N).
        orders: the Renyi orders a > 1, increasing, shape (K,).
        charges: the D values a charge holds at each order, shape (..., K) (NaN covers nothing); None:
            every teacher at every order.
        prepared: each step's rows p_-i / p already formed from exactly these inputs
            (prepared_leave_one_out); None: formed here.

    Returns:
        (values (..., K) in nats, rounded up; allowance (..., K) in nats; p = the mixed teachers' mean (..., V)).

    Raises:
        ValueError: if N < 2, an order is not > 1, or a value is NaN (an input holds NaN).
    """
    grid = validated_orders(np.asarray(orders, dtype=np.float64).reshape(-1))
    flat_teachers, flat_public, flat_lambdas = _flat_ensemble(teachers, public, lambdas)
    n, vocab = teachers.shape[-2], teachers.shape[-1]
    rows = np.arange(n)
    moments = np.empty((flat_teachers.shape[0], grid.size))
    magnitude = np.empty(flat_teachers.shape[0])
    spans = np.empty(flat_teachers.shape[0])
    output = np.empty((flat_teachers.shape[0], vocab))
    ratios = None
    if charges is not None and not np.all(np.diff(grid) > 0):
        charges = None   # a chord needs its orders in order: between two of them, never beyond (an extrapolation)
    if charges is not None:
        allowed = np.asarray(charges, dtype=np.float64).reshape(-1, grid.size)
        require(allowed.shape[0] == flat_teachers.shape[0], f"charges must hold one row of {grid.size} orders per "
                f"step ({flat_teachers.shape[0]}), got shape {np.shape(charges)}")
        # the moment each charge allows, rounded down (its D times a - 1, and a - 1, each rounded once)
        allowed = allowed * (grid - 1.0) * (1.0 - 4.0 * UNIT_ROUNDOFF)
    require(prepared is None or len(prepared) == flat_teachers.shape[0], f"prepared must hold one step's rows per "
            f"step ({flat_teachers.shape[0]}), got {None if prepared is None else len(prepared)}")
    for row in range(flat_teachers.shape[0]):
        ratios = prepared[row] if prepared is not None else \
            _LeaveOneOut(flat_teachers[row], flat_public[row], flat_lambdas[row], ratios, parallel=True)
        moments[row] = (ratios.direction_moments(rows, grid).max(axis=(0, 1)) if charges is None
                        else _covered_moments(ratios, n, grid, allowed[row], power=bool(_power_lattice(grid))))
        magnitude[row], output[row] = ratios.magnitude, ratios.output
        widths = ratios.spans[:, 1] - ratios.spans[:, 0]
        spans[row] = float(widths[np.isfinite(widths)].max(initial=0.0))
    values = _divergences_from_moments(moments, grid)
    # leave_one_out_allowance's s(a) / (a - 1), then the power path's products and lattice gap (fused)
    with np.errstate(invalid="ignore"):   # (inf - inf at an infinite value, whose allowance is set to 0 below)
        allowance = eq3_allowance_of(magnitude, grid, vocab, values)
    denominator = _power_lattice(grid)
    if denominator:
        points = np.round(denominator * grid) / denominator
        allowance = allowance + (6.0 * denominator * grid * UNIT_ROUNDOFF
                                 + np.abs(grid - points) * spans[:, None]) / (grid - 1.0)
    batch = tuple(teachers.shape[:-2])
    allowance = np.where(np.isfinite(moments), allowance, 0.0)
    return (values.reshape(*batch, grid.size), allowance.reshape(*batch, grid.size),
            torch.from_numpy(output.reshape(*batch, vocab)))


COVER_STRIDES = (8, 2, 1)
"""leave_one_out_every_order with charges: a teacher is evaluated at every 8th order (and both ends)
first, then at every 2nd, then at every order, each time only if its chord is not yet covered."""


def _covered_moments(ratios: _LeaveOneOut, n: int, grid: FloatArray, allowed: FloatArray, power: bool) -> FloatArray:
    """One step's max over teachers of g_i(a) (rounded up) at every order of the increasing `grid`, each
    teacher evaluated at every order unless its chord between fewer orders already lies at or below
    `allowed` (the moments the charge allows) everywhere: then its chord stands in
    (leave_one_out_every_order). power: whether the whole grid takes the power path; a sub-grid takes
    the whole grid's path, so that the whole grid's allowance covers its values."""
    if grid.size == 0:
        return np.zeros(0)
    values = np.full((n, grid.size), np.nan)
    evaluated = np.zeros(grid.size, dtype=bool)
    pending = np.arange(n)
    largest = np.full(grid.size, -np.inf)
    for stride in COVER_STRIDES:
        wanted = _lattice_closed(grid, np.union1d(np.arange(0, grid.size, stride), [grid.size - 1]).astype(np.int64))
        new = np.setdiff1d(wanted, np.flatnonzero(evaluated))
        if new.size:
            values[np.ix_(pending, new)] = ratios.direction_moments(pending, grid[new], power).max(axis=0)
        evaluated[wanted] = True
        chords = _chords_rounded_up(grid, np.flatnonzero(evaluated), values[pending])
        with np.errstate(invalid="ignore"):   # a NaN chord (an infinite end) covers nothing
            covered = np.all(chords <= allowed, axis=1) if stride > 1 else np.ones(pending.size, dtype=bool)
        if covered.any():
            largest = np.maximum(largest, chords[covered].max(axis=0))
        pending = pending[~covered]
        if pending.size == 0:
            break
    return largest


def _lattice_closed(grid: FloatArray, indices: IntArray) -> IntArray:
    """`indices` (increasing) with every order between two consecutive ones added where their step
    exceeds what the power path takes (fused._POWER_LEVELS: 2^13 lattice points, e.g. orders 128 -> 1024
    in tenths), when the whole grid is on its lattice: the sub-grid's kernel call stays on the power path."""
    denominator = _power_lattice(grid)
    if not denominator:
        return indices
    points = np.round(denominator * grid[indices])
    wide = np.flatnonzero(np.diff(points) >= 2 ** 13)
    filled = [np.arange(indices[k] + 1, indices[k + 1]) for k in wide]
    return np.union1d(indices, np.concatenate([np.zeros(0, dtype=np.int64), *filled])).astype(np.int64)


def _chords_rounded_up(grid: FloatArray, evaluated: IntArray, values: FloatArray) -> FloatArray:
    """Each row's chord between its evaluated orders at every order (its value at an evaluated one),
    rounded up by 8 u (|left| + |right|): the interpolation's rounding (the weight's, the difference's,
    the product's and the sum's, each at most u of a term no larger than |left| + |right|). NaN where an
    end is infinite (inf - inf)."""
    position = np.clip(np.searchsorted(evaluated, np.arange(grid.size), side="right") - 1, 0,
                       max(evaluated.size - 2, 0))
    left, right = evaluated[position], evaluated[np.minimum(position + 1, evaluated.size - 1)]
    span = grid[right] - grid[left]
    weight = np.divide(grid - grid[left], span, out=np.zeros(grid.size), where=span > 0)
    at_left, at_right = values[:, left], values[:, right]
    with np.errstate(invalid="ignore"):
        chords = at_left + weight * (at_right - at_left) + 8.0 * UNIT_ROUNDOFF * (np.abs(at_left) + np.abs(at_right))
    chords[:, evaluated] = values[:, evaluated]
    return chords


def _seed_indices(grid: FloatArray) -> list[int]:
    """The first sub-grid, where every teacher is evaluated: both ends and the orders nearest 4 and 32."""
    seeds = {0, grid.size - 1} | {int(np.argmin(np.abs(grid - a))) for a in (4.0, 32.0)}
    return sorted(seeds)


def _refined_curve(ratios: _LeaveOneOut, n: int, grid: FloatArray,
                   tolerance: float) -> tuple[FloatArray, NDArray[np.bool_]]:
    """leave_one_out_curve for one step: (D values (K,), exact mask (K,)). Each round bisects every
    interval whose certificate fails and evaluates the new orders in one kernel call; the rounds'
    bookkeeping runs compiled (dpledger.mechanisms.fused.refinement_round: numpy's cost several times
    the kernel's arithmetic at demo scale), the moments through _LeaveOneOut.moments."""
    from dpledger.mechanisms.fused import refinement_round

    n_orders = grid.size
    moments = np.empty(n_orders)
    exact = np.zeros(n_orders, dtype=bool)
    upper = np.full((n, n_orders), np.nan)
    slope = np.full((n, n_orders), np.nan)
    grid = np.ascontiguousarray(grid)
    picked, new = np.arange(n, dtype=np.int64), np.asarray(_seed_indices(grid), dtype=np.int64)
    wanted = np.ones((n, new.size), dtype=bool)
    seeding = True
    while new.size:
        value, derivative = ratios.moments(picked, grid[new], wanted)
        picked, new, wanted = refinement_round(grid, float(tolerance), 1.0 + 4.0 * ROUNDING_ULPS, _SLACK_ULPS,
                                               ratios.magnitude, ratios.output.size, seeding, picked, new, wanted,
                                               value, derivative, upper, slope, moments, exact)
        seeding = False
    return _divergences_from_moments(moments[None], grid)[0], exact

