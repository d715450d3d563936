"""The add-one bound from the Lagrangian dual, and a primal adversary that nearly attains it.

An adversary who ADDS a teacher to PMixED's ensemble moves the output p (the mean of N mixed
teachers) to p_+ = (N p + q) / (N + 1), where q is the added teacher after PMixED's projection:
any law of the ball B = {q : D<->_a(q, p0) <= r_a for every constrained order a} around the public
law p0 (every q in B is reached by adding x = q). At each Renyi order k, with t_j = q_j / p_j,

    exp((k-1) D_k(p_+ || p)) = sum_j p_j h_k(t_j),        h_k(t) = ((N + t) / (N + 1))^k       (forward)
    exp((k-1) D_k(p || p_+)) = sum_j p_j h_{1-k}(t_j)                                          (reverse)

(van Erven & Harremoes 2014, Definition 2, written termwise). Both are sums of convex functions of
q_j, so their maximum over B is a non-convex problem (a convex function maximised over a convex
set). This module bounds it from above by Lagrangian duality and from below by an explicit q.

**The dual bound (weak duality; Boyd & Vandenberghe 2004, Section 5.1.3).** With s = k (forward)
or s = 1 - k (reverse), h = h_s, psi(t) = h(t) - 1 - h'(1) (t - 1) >= 0 (convex, psi(1) = 0) and
omega_c(y) = y^c - 1 - c (y - 1) >= 0, every q with sum_j q_j = 1 satisfies the identities

    sum_j p_j h(t_j) - 1 = C + sum_j f_j(q_j),   f_j(x) = p_j psi(x / p_j),   C = (P - 1)(1 - h'(1)),
    sum_j q_j^g p0_j^(1-g) = sum_j W1_j(q_j) + P0 + g (1 - P0),       W1_j(x) = p0_j omega_g(x / p0_j),
    sum_j p0_j^g q_j^(1-g) = sum_j W2_j(q_j) + P0 + (1-g)(1 - P0),    W2_j(x) = p0_j omega_(1-g)(x / p0_j),

(P = sum_j p_j, P0 = sum_j p0_j, 1 up to rounding; a token with p_j = 0 has f_j(x) = -h'(1) x, the
perspective's limit). The ball at one order g (its radius r_g), in both directions, is
sum_j W1_j(q_j) <= B1 and sum_j W2_j(q_j) <= B2 with B1 = R - 1 + (1 - g)(1 - P0),
B2 = R - 1 + g (1 - P0), R = exp((g - 1) r_g); each q_j also lies in a box [lo_j, hi_j] that
contains every law of B (each term of the two sums is at most the sum, and the box takes the
tightest such interval over every constraint of B). For any nu and any mu1, mu2 >= 0, a q of B
satisfies sum_j f_j(q_j) <= sum_j f_j(q_j) - nu (sum_j q_j - 1) - mu1 (sum_j W1_j - B1) - mu2 (sum_j W2_j - B2),
hence

    max_{q in B} sum_j p_j h(t_j) - 1  <=  G(nu, mu1, mu2) = C + nu + mu1 B1 + mu2 B2 + sum_j S_j,
    S_j = sup { f_j(x) - nu x - mu1 W1_j(x) - mu2 W2_j(x) : lo_j <= x <= hi_j }.

Dropping constraints only enlarges the set maximised over, so a ball with many constraints (the
all-orders ball) may dualise one order and keep the others in the box alone: the bound stays valid.
The multipliers are chosen numerically (a few Newton steps on G from the closed-form chi-square
approximation, see `_initial_multipliers`, and warm starts between orders); whatever they are, G
is an upper bound. Each S_j is bounded from above on a partition of [lo_j, hi_j]: on a piece
[s, t], f_j lies below its chord (f_j is convex), so f_j - g_j (g_j = nu x + mu1 W1_j + mu2 W2_j,
convex) lies below the concave chord - g_j, which lies below its tangents at s and at t; the
largest value of the smaller of two lines is closed-form (`_piece_bound`). The partition is refined
where a piece's bound exceeds the best value found (a branch and bound), so S_j is exact up to a
tolerance. Every float operation is accounted for by an error allowance (`_f_certified`,
`_ball_certified`, `_piece_bound`, the sum's n u bound of Higham 2002, eq. 4.4), so the value
returned is an upper bound on the exact G; then D_k <= log1p(G) / (k - 1).

**Orders between the dual's orders.** For a fixed q, (k - 1) D_k(P || Q) is convex in k (a log-sum-exp
of affine functions of k; van Erven & Harremoes 2014) and 0 at k = 1 (the log of the total mass:
at most max(P - 1, 0) when the float law p sums to P), so the maximum over q of (k - 1) D_k is
convex as well (a supremum of convex functions). Between two orders s < t where the dual is
certified, its chord bounds it; below the first, the chord from (1, max(P - 1, 0)). Above the last
order the dual says nothing (+inf). A multiplier that is not finite (or a mu < 0) certifies
nothing: that order's value is +inf.

**The adversary.** `add_one_adversary` returns, per step and order, a law q that PMixED's projection
produces from an added teacher x (q = lambda x + (1 - lambda) p0, lambda from
`dpledger.mechanisms.kernels.ball_mixing_weights` with the constraints the decode loop enforces, so q is in
the ball by construction), the best of a few candidates x: the dual's inner maximisers
(renormalised), their tilts x^t p0^(1-t) and point masses. Its divergence is a lower estimate of
the worst case (plain float64: it is a diagnostic, never charged); `add_one_gap` reports the
certified bounds beside it, so the gap between them brackets the bound's remaining slack.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, TypedDict

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpledger.accounting.rounding import ROUNDING_ULPS
from dpledger.mechanisms.fastmath import JitOptions, jit  # first: it sets numba's vector width
from dpledger.mechanisms.ball import ALL_ORDERS_BALL_GRID, all_orders_ball_constraints
from dpledger.mechanisms.kernels import (ADD_ONE_VERSION, _SLACK_ULPS, FloatArray, _log, _set_threads,
                                         ball_mixing_weights)
from dpledger.mechanisms.log_space import log_mean_with_one_exp
from dpledger.mechanisms.fused import (_LATTICE as LATTICE, add_one_forward_round, add_one_lattice_allowances,
                                       add_one_order_sums, add_one_power_bases, add_one_power_order_sums,
                                       add_one_shifts, add_one_weighted_order_sums,
                                       add_one_token_bounds, allocated_tokens_of, convex_sandwich,
                                       knapsack_allocation, renyi_log_moments)
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light

BoolArray = NDArray[np.bool_]
Laws = torch.Tensor | ArrayLike
"""Probabilities or orders as a torch tensor or anything numpy reads as an array (read as float64)."""

_U = 2.0 ** -53
"""Unit roundoff of float64 (a correctly rounded operation errs by at most _U relative)."""
_ALLOW = ROUNDING_ULPS / 2.0 ** -52 * _U
"""Error allowance per unit of magnitude: ROUNDING_ULPS ulps = 16 unit roundoffs. Each certified
quantity below has a derived first-order error of at most ~7 u per unit of its magnitude (libm's
exp, expm1, log and log1p err by at most 1 ulp = 2 u), so the allowance holds with a factor 2."""

_EXACT: JitOptions = dict(fastmath=False, error_model="numpy", cache=True, nogil=True)
"""IEEE semantics for everything certified (no reassociation: the error analysis assumes it)."""

DUAL_SUBGRID_RATIO = 1.35
"""The dual is computed at orders whose k - 1 grows by about this factor (chords in between)."""
MAX_DUAL_ORDERS = 24
"""At most this many orders get their own dual; a requested grid at most this long gets all."""


# ----------------------------------------------------------------------------- certified pieces

@jit(**_EXACT)
def _f_certified(x: float, p: float, n: float, s: float) -> tuple[float, float]:
    """(f(x), error bound) for f(x) = p psi(x / p), psi(t) = ((n + t)/(n + 1))^s - 1 - s (t - 1)/(n + 1),
    evaluated as p (expm1(s log1p(u)) - s u), u = (x - p) / (p (n + 1)) (no cancellation near t = 1).
    p = 0 (a reverse-direction token the output never emits): the perspective's limit -s x / (n + 1).
    Error: u errs by 3.1 u relative; log1p, expm1 by 2 u each; propagated to first order the total
    is below u p ((6.2 |s u| + 5 |z|) e^z + 4 |E| + 4.1 |s u| + 2 |E - s u|), within the allowance."""
    if p == 0.0:
        value = -s * x / (n + 1.0)
        return value, 4.0 * _U * abs(value)
    u = (x - p) / (p * (n + 1.0))
    z = s * math.log1p(u)
    e = math.expm1(z)
    su = s * u
    d = e - su
    value = p * d
    if not (value < np.inf):
        return np.inf, np.inf
    error = _ALLOW * p * ((abs(su) + abs(z)) * (abs(e) + 1.0) + abs(e) + abs(su) + abs(d))
    return value, error


@jit(**_EXACT)
def _ball_certified(x: float, p0: float, g: float) -> tuple[float, float, float, float, float, float, float, float]:
    """(W1, e1, W2, e2, D1, f1, D2, f2): W1 = p0 omega_g(y), W2 = p0 omega_(1-g)(y), y = x / p0, and
    their derivatives in x, D1 = g (y^(g-1) - 1), D2 = (1 - g)(y^(-g) - 1), each with an error bound.
    omega_c(y) = expm1(c log y) - c (y - 1): y errs by u, log y by u + 2 u |log y|, c log y by
    u (1.01 c + 3 |c log y|), expm1 by its argument's error times e^z plus 2 u |expm1|; the rest
    are a few products and one difference, all within the allowance. x = 0: W1 = p0 (g - 1),
    D1 = -g, and W2 = D2 magnitude +inf (y^(1-g) -> inf)."""
    if x == 0.0:
        return p0 * (g - 1.0), 4.0 * _U * p0 * g, np.inf, 0.0, -g, 2.0 * _U * g, -np.inf, 0.0
    ly = math.log(x / p0)
    d = (x - p0) / p0
    z1 = g * ly
    e1 = math.expm1(z1)
    w1 = p0 * (e1 - g * d)
    err1: float = _ALLOW * p0 * ((g + abs(z1)) * (abs(e1) + 1.0) + abs(e1) + abs(g * d) + abs(e1 - g * d))
    z2 = (1.0 - g) * ly
    e2 = math.expm1(z2)
    w2 = p0 * (e2 - (1.0 - g) * d)
    err2: float = _ALLOW * p0 * ((g + abs(z2)) * (abs(e2) + 1.0) + abs(e2) + abs((1.0 - g) * d) + abs(e2 - (1.0 - g) * d))
    z3 = (g - 1.0) * ly
    e3 = math.expm1(z3)
    d1 = g * e3
    errd1 = _ALLOW * g * ((g + abs(z3)) * (abs(e3) + 1.0) + abs(e3))
    z4 = -g * ly
    e4 = math.expm1(z4)
    d2 = (1.0 - g) * e4
    errd2 = _ALLOW * (g - 1.0) * ((g + abs(z4)) * (abs(e4) + 1.0) + abs(e4))
    if not (w1 < np.inf):
        err1 = np.inf
    if not (w2 < np.inf):
        err2 = np.inf
    return w1, err1, w2, err2, d1, errd1, d2, errd2


@jit(**_EXACT)
def _combine(nu: float, mu1: float, mu2: float, x: float, w1: float, e1: float, w2: float,
             e2: float) -> tuple[float, float]:
    """(g, error) for g = nu x + mu1 W1 + mu2 W2 (a zero multiplier drops its term, also an infinite one)."""
    value = nu * x
    magnitude = abs(value)
    error = 0.0
    if mu1 != 0.0:
        value += mu1 * w1
        magnitude += abs(mu1 * w1)
        error += mu1 * e1
    if mu2 != 0.0:
        value += mu2 * w2
        magnitude += abs(mu2 * w2)
        error += mu2 * e2
    if not (magnitude < np.inf):
        return value, np.inf
    return value, error + 4.0 * _U * magnitude


@jit(**_EXACT)
def _piece_bound(s: float, t: float, fs: float, efs: float, gs: float, egs: float, ds: float, eds: float, ft: float,
                 eft: float, gt: float, egt: float, dt: float, edt: float) -> tuple[float, float]:
    """(upper bound on max of f - g over [s, t], a point of (s, t) to split at). f convex with
    values fs, ft (errors efs, eft); g convex with values gs, gt and derivatives ds, dt (errors e..).
    With F+ = f + error at each end, the chord l of F+ lies above f on [s, t], so f - g <= k = l - g,
    which is concave and lies below its tangent at s, A + a (y - s), A = k(s), a = m - g'(s), and below
    its tangent at t, B + b (t - y), B = k(t), b = g'(t) - m, m = (F+(t) - F+(s)) / (t - s). The
    largest value on [s, t] of the smaller line is min(A + max(a, 0) D, B + max(b, 0) D,
    (b A + a B + a b D) / (a + b)) (the last when a, b > 0), D = t - s; it only grows with A, B,
    a, b and D, so each is rounded up. An end where g is +inf (W2 at x = 0) or has an infinite
    slope keeps the other end's tangent only. The split point is where the two tangents cross
    (kept 10% inside the piece), or the middle."""
    span = (t - s) * (1.0 + 2.0 * _U)
    middle = 0.5 * (s + t)
    fsu = fs + efs
    ftu = ft + eft
    if not (fsu < np.inf and ftu < np.inf):
        return np.inf, middle
    a_up = fsu - gs + egs + 2.0 * _U * (abs(fsu) + abs(gs))
    b_up = ftu - gt + egt + 2.0 * _U * (abs(ftu) + abs(gt))
    if span == 0.0:
        return min(a_up, b_up), middle
    slope = (ftu - fsu) / (t - s)
    slope_error = 4.0 * _U * (abs(ftu) + abs(fsu)) / (t - s) + _U * abs(slope)
    left_ok = gs < np.inf and egs < np.inf and ds > -np.inf and eds < np.inf
    right_ok = gt < np.inf and egt < np.inf and dt < np.inf and edt < np.inf
    ka, kb = 0.0, 0.0
    best = np.inf
    if left_ok:
        ka = slope + slope_error - ds + eds + 2.0 * _U * (abs(slope) + abs(ds))
        rise = max(ka, 0.0) * span
        v1 = a_up + rise
        best = min(best, v1 + 2.0 * _U * (abs(v1) + rise))
    if right_ok:
        kb = dt + edt - slope + slope_error + 2.0 * _U * (abs(slope) + abs(dt))
        rise = max(kb, 0.0) * span
        v2 = b_up + rise
        best = min(best, v2 + 2.0 * _U * (abs(v2) + rise))
    split = middle
    if left_ok and right_ok and ka > 0.0 and kb > 0.0:
        v3 = (kb * a_up + ka * b_up + ka * kb * span) / (ka + kb)
        best = min(best, v3 + 6.0 * _U * (abs(kb * a_up) + abs(ka * b_up) + ka * kb * span) / (ka + kb))
        cross = s + (b_up - a_up + kb * span) / (ka + kb)
        if cross == cross:
            split = min(max(cross, s + 0.1 * (t - s)), t - 0.1 * (t - s))
    if s > 0.0 and t > 8.0 * s:
        split = math.sqrt(s) * math.sqrt(t)      # a wide piece (in ratio): its geometric middle
    elif s == 0.0:
        split = t * 2.0 ** -20
    return best, split


# ----------------------------------------------------------------------------- approximate inner problems

@jit(**_EXACT)
def _phi_all(x: float, p: float, p0: float, n: float, s: float, g: float, nu: float, mu1: float,
             mu2: float) -> tuple[float, float, float, float, float, float, float]:
    """At x > 0, the Lagrangian term phi = f - nu x - mu1 W1 - mu2 W2, phi' and phi'' (plain float
    arithmetic: used to choose the multipliers, never as a bound), and W1, W2, W1', W2'."""
    ly = math.log(x / p0)
    d = (x - p0) / p0
    w1 = p0 * (math.expm1(g * ly) - g * d)
    w2 = p0 * (math.expm1((1.0 - g) * ly) - (1.0 - g) * d)
    d1 = g * math.expm1((g - 1.0) * ly)
    d2 = (1.0 - g) * math.expm1(-g * ly)
    c = g * (g - 1.0) / p0
    dd1 = c * math.exp((g - 2.0) * ly)
    dd2 = c * math.exp((-g - 1.0) * ly)
    if p == 0.0:
        f = -s * x / (n + 1.0)
        f1 = -s / (n + 1.0)
        f2 = 0.0
    else:
        u = (x - p) / (p * (n + 1.0))
        lb = math.log1p(u)
        f = p * (math.expm1(s * lb) - s * u)
        f1 = s / (n + 1.0) * math.expm1((s - 1.0) * lb)
        f2 = s * (s - 1.0) / ((n + 1.0) * (n + 1.0) * p) * math.exp((s - 2.0) * lb)
    phi = f - nu * x
    phi1 = f1 - nu
    phi2 = f2
    if mu1 != 0.0:
        phi -= mu1 * w1
        phi1 -= mu1 * d1
        phi2 -= mu1 * dd1
    if mu2 != 0.0:
        phi -= mu2 * w2
        phi1 -= mu2 * d2
        phi2 -= mu2 * dd2
    return phi, phi1, phi2, w1, w2, d1, d2


@jit(**_EXACT)
def _evaluate(nu: float, mu1: float, mu2: float, p: FloatArray, p0: FloatArray, n: float, s: float, g: float,
              xg: FloatArray, fg: FloatArray, w1g: FloatArray, w2g: FloatArray, newton: int, xs: FloatArray,
              hessian: FloatArray) -> tuple[float, float, float, float]:
    """Approximate dual value G - (C + nu + mu1 B1 + mu2 B2) = sum_j S_j, with the inner maximisers
    in xs, and sums of x, W1, W2 (the gradient's parts) and the Hessian of G in (nu, mu1, mu2)
    (interior maximisers: sum v v^T / -phi'', v = (1, W1', W2'), by the implicit function theorem).
    Each S_j: the best point of the token's grid, then `newton` safeguarded Newton steps within the
    grid interval around it."""
    m, points = xg.shape
    total, sx, s1, s2 = 0.0, 0.0, 0.0, 0.0
    for a in range(3):
        for b in range(3):
            hessian[a, b] = 0.0
    for j in range(m):
        best, at = -np.inf, 0
        for i in range(points):
            v = fg[j, i] - nu * xg[j, i]
            if mu1 != 0.0:
                v -= mu1 * w1g[j, i]
            if mu2 != 0.0:
                v -= mu2 * w2g[j, i]
            if v > best:
                best, at = v, i
        x = xg[j, at]
        w1, w2 = w1g[j, at], w2g[j, at]
        left = xg[j, at - 1] if at > 0 else x
        right = xg[j, at + 1] if at < points - 1 else x
        if left <= 0.0:
            left = x * 1e-3 if x > 0.0 else 0.0
        if x > 0.0 and right > left and newton > 0:
            y = x
            for _ in range(newton):
                phi, phi1, phi2, _, _, _, _ = _phi_all(y, p[j], p0[j], n, s, g, nu, mu1, mu2)
                if phi1 > 0.0:
                    left = y
                else:
                    right = y
                if phi2 < 0.0:
                    step = y - phi1 / phi2
                else:
                    step = right if phi1 > 0.0 else left
                if not (step > left and step < right):
                    step = 0.5 * (left + right)
                y = step
            phi, phi1, phi2, yw1, yw2, yd1, yd2 = _phi_all(y, p[j], p0[j], n, s, g, nu, mu1, mu2)
            if phi > best:
                best, x, w1, w2 = phi, y, yw1, yw2
                if phi2 < 0.0 and y > xg[j, 0] and y < xg[j, points - 1]:
                    h = -1.0 / phi2
                    v0, v1, v2 = 1.0, yd1, yd2
                    hessian[0, 0] += h * v0 * v0
                    hessian[0, 1] += h * v0 * v1
                    hessian[0, 2] += h * v0 * v2
                    hessian[1, 1] += h * v1 * v1
                    hessian[1, 2] += h * v1 * v2
                    hessian[2, 2] += h * v2 * v2
        xs[j] = x
        total += best
        sx += x
        s1 += w1
        s2 += w2
    hessian[1, 0] = hessian[0, 1]
    hessian[2, 0] = hessian[0, 2]
    hessian[2, 1] = hessian[1, 2]
    return total, sx, s1, s2


@jit(**_EXACT)
def _initial_multipliers(p: FloatArray, p0: FloatArray, n: float, s: float, g: float,
                         budget: float) -> tuple[float, float]:
    """Multipliers of the chi-square approximation: f_j(x) ~ a_j (x - p_j)^2 / 2, a_j = s (s - 1) /
    ((n + 1)^2 p_j), and W1_j ~ W2_j ~ c (x - p0_j)^2 / (2 p0_j), c = g (g - 1) (second-order Taylor
    at x = p_j and x = p0_j). The inner maximiser is then x_j = (mu c - a_j p_j - nu) / (mu c / p0_j - a_j)
    for mu = mu1 + mu2 above max_j a_j p0_j / c, nu makes sum_j x_j = 1 (linear), and mu solves the
    secular equation sum_j c (x_j - p0_j)^2 / (2 p0_j) = budget (monotone; bisection in log). Only a
    starting point: any multipliers give a valid bound."""
    m = p.size
    c = g * (g - 1.0)
    mu_min = 0.0
    for j in range(m):
        if p[j] > 0.0:
            a = s * (s - 1.0) / ((n + 1.0) * (n + 1.0) * p[j])
            mu_min = max(mu_min, a * p0[j] / c)
    if not (mu_min > 0.0 and mu_min < np.inf):
        return 0.0, 0.0
    low, high = -40.0, 40.0
    nu_found, mu_found = 0.0, mu_min * 2.0
    for _ in range(64):
        middle = 0.5 * (low + high)
        mu = mu_min * (1.0 + math.exp(middle))
        sum1, sum2 = 0.0, 0.0
        for j in range(m):
            a = s * (s - 1.0) / ((n + 1.0) * (n + 1.0) * p[j]) if p[j] > 0.0 else 0.0
            d = mu * c / p0[j] - a
            sum1 += (mu * c - a * p[j]) / d
            sum2 += 1.0 / d
        nu = (sum1 - 1.0) / sum2
        value = 0.0
        for j in range(m):
            a = s * (s - 1.0) / ((n + 1.0) * (n + 1.0) * p[j]) if p[j] > 0.0 else 0.0
            d = mu * c / p0[j] - a
            x = (mu * c - a * p[j] - nu) / d
            value += 0.5 * c * (x - p0[j]) * (x - p0[j]) / p0[j]
        nu_found, mu_found = nu, mu
        if value > budget:
            low = middle
        else:
            high = middle
    return nu_found, mu_found


@jit(**_EXACT)
def _linear(nu: float, mu1: float, mu2: float, b1: float, b2: float) -> float:
    """nu + mu1 b1 + mu2 b2, a zero multiplier dropping its term (whose budget may be +inf)."""
    value = nu
    if mu1 != 0.0:
        value += mu1 * b1
    if mu2 != 0.0:
        value += mu2 * b2
    return value


@jit(**_EXACT)
def _solve_small(h: FloatArray, grad: FloatArray, free: BoolArray, out: FloatArray) -> None:
    """out = -(h_ff + ridge)^-1 grad_f on the free coordinates (0 elsewhere): Gaussian elimination
    with partial pivoting on at most 3 unknowns; a ridge of 1e-9 of the diagonal keeps it solvable."""
    idx = np.empty(3, dtype=np.int64)
    k = 0
    for i in range(3):
        out[i] = 0.0
        if free[i]:
            idx[k] = i
            k += 1
    if k == 0:
        return
    a = np.zeros((k, k + 1))
    for r in range(k):
        for c in range(k):
            a[r, c] = h[idx[r], idx[c]]
        a[r, k] = -grad[idx[r]]
    for r in range(k):
        a[r, r] += 1e-9 * abs(a[r, r]) + 1e-300
    for c in range(k):
        pivot = c
        for r in range(c + 1, k):
            if abs(a[r, c]) > abs(a[pivot, c]):
                pivot = r
        if pivot != c:
            for q in range(k + 1):
                a[c, q], a[pivot, q] = a[pivot, q], a[c, q]
        if a[c, c] == 0.0:
            a[c, c] = 1e-300
        for r in range(c + 1, k):
            factor = a[r, c] / a[c, c]
            for q in range(c, k + 1):
                a[r, q] -= factor * a[c, q]
    for r in range(k - 1, -1, -1):
        total = a[r, k]
        for q in range(r + 1, k):
            total -= a[r, q] * out[idx[q]]
        out[idx[r]] = total / a[r, r]


@jit(**_EXACT)
def _min_over_nu(mu1: float, mu2: float, p: FloatArray, p0: FloatArray, n: float, s: float, g: float, base: float,
                 b1: float, b2: float, xg: FloatArray, fg: FloatArray, w1g: FloatArray, w2g: FloatArray, newton: int,
                 xs: FloatArray, h: FloatArray) -> tuple[float, float]:
    """(min over nu of the approximate G at (mu1, mu2), the nu attaining it): G is convex in nu with
    derivative 1 - sum_j x_j(nu), and its minimiser lies between the smallest and the largest slope
    of f_j - mu1 W1_j - mu2 W2_j between neighbouring grid points (beyond them every maximiser sits
    at one end of its box); bisection on the sign of the derivative."""
    m, points = xg.shape
    low, high = np.inf, -np.inf
    for j in range(m):
        for i in range(points - 1):
            width = xg[j, i + 1] - xg[j, i]
            if width > 0.0:
                rise = fg[j, i + 1] - fg[j, i]
                if mu1 != 0.0:
                    rise -= mu1 * (w1g[j, i + 1] - w1g[j, i])
                if mu2 != 0.0:
                    rise -= mu2 * (w2g[j, i + 1] - w2g[j, i])
                slope = rise / width
                if slope == slope:
                    low = min(low, slope)
                    high = max(high, slope)
    if not (low < np.inf and high > -np.inf):
        return np.inf, 0.0
    low -= 1e-9 * abs(low) + 1e-300
    high += 1e-9 * abs(high) + 1e-300
    best_value, best_nu = np.inf, 0.0
    for _ in range(56):
        middle = 0.5 * (low + high)
        total, sx, _, _ = _evaluate(middle, mu1, mu2, p, p0, n, s, g, xg, fg, w1g, w2g, newton, xs, h)
        value = base + _linear(middle, mu1, mu2, b1, b2) + total
        if value < best_value:
            best_value, best_nu = value, middle
        if 1.0 - sx > 0.0:
            high = middle
        else:
            low = middle
        if high - low <= 1e-15 * max(abs(low), abs(high)):
            break
    return best_value, best_nu


@jit(**_EXACT)
def _nm_value(z: FloatArray, p: FloatArray, p0: FloatArray, n: float, s: float, g: float, base: float, b1: float,
              b2: float, xg: FloatArray, fg: FloatArray, w1g: FloatArray, w2g: FloatArray, newton: int, xs: FloatArray,
              h: FloatArray) -> float:
    mu1 = math.exp(z[1]) if z[1] > -700.0 else 0.0
    mu2 = math.exp(z[2]) if z[2] > -700.0 else 0.0
    if not (b1 < np.inf):
        mu1 = 0.0
    if not (b2 < np.inf):
        mu2 = 0.0
    total, _, _, _ = _evaluate(z[0], mu1, mu2, p, p0, n, s, g, xg, fg, w1g, w2g, newton, xs, h)
    value = base + _linear(z[0], mu1, mu2, b1, b2) + total
    return value if value == value else np.inf


@jit(**_EXACT)
def _nelder_mead(start: FloatArray, width: float, budget: int, p: FloatArray, p0: FloatArray, n: float, s: float,
                 g: float, base: float, b1: float, b2: float, xg: FloatArray, fg: FloatArray, w1g: FloatArray,
                 w2g: FloatArray, newton: int, xs: FloatArray, h: FloatArray) -> tuple[float, float, float, float]:
    """Nelder & Mead 1965 (standard coefficients) on z = (nu, log mu1, log mu2): returns (value, nu,
    mu1, mu2) of the best vertex after `budget` evaluations (or a simplex of relative size 1e-10)."""
    simplex = np.empty((4, 3))
    values = np.empty(4)
    for r in range(4):
        for c in range(3):
            simplex[r, c] = start[c]
    simplex[1, 0] += width
    simplex[2, 1] += 1.0
    simplex[3, 2] += 1.0
    for r in range(4):
        values[r] = _nm_value(simplex[r], p, p0, n, s, g, base, b1, b2, xg, fg, w1g, w2g, newton, xs, h)
    spent = 4
    centroid = np.empty(3)
    trial = np.empty(3)
    trial2 = np.empty(3)
    while spent < budget:
        order = np.argsort(values)
        simplex = simplex[order].copy()
        values = values[order].copy()
        if abs(values[3] - values[0]) <= 1e-12 * abs(values[0]) and spent > 40:
            break
        for c in range(3):
            centroid[c] = (simplex[0, c] + simplex[1, c] + simplex[2, c]) / 3.0
        for c in range(3):
            trial[c] = centroid[c] + (centroid[c] - simplex[3, c])
        fr = _nm_value(trial, p, p0, n, s, g, base, b1, b2, xg, fg, w1g, w2g, newton, xs, h)
        spent += 1
        if fr < values[0]:
            for c in range(3):
                trial2[c] = centroid[c] + 2.0 * (centroid[c] - simplex[3, c])
            fe = _nm_value(trial2, p, p0, n, s, g, base, b1, b2, xg, fg, w1g, w2g, newton, xs, h)
            spent += 1
            if fe < fr:
                simplex[3, :] = trial2
                values[3] = fe
            else:
                simplex[3, :] = trial
                values[3] = fr
            continue
        if fr < values[2]:
            simplex[3, :] = trial
            values[3] = fr
            continue
        outside = fr < values[3]
        for c in range(3):
            trial2[c] = centroid[c] + 0.5 * ((trial[c] if outside else simplex[3, c]) - centroid[c])
        fc = _nm_value(trial2, p, p0, n, s, g, base, b1, b2, xg, fg, w1g, w2g, newton, xs, h)
        spent += 1
        if fc < min(fr, values[3]):
            simplex[3, :] = trial2
            values[3] = fc
            continue
        for r in range(1, 4):
            for c in range(3):
                simplex[r, c] = simplex[0, c] + 0.5 * (simplex[r, c] - simplex[0, c])
            values[r] = _nm_value(simplex[r], p, p0, n, s, g, base, b1, b2, xg, fg, w1g, w2g, newton, xs, h)
            spent += 1
    best = np.argmin(values)
    z = simplex[best]
    mu1 = math.exp(z[1]) if z[1] > -700.0 and b1 < np.inf else 0.0
    mu2 = math.exp(z[2]) if z[2] > -700.0 and b2 < np.inf else 0.0
    return values[best], z[0], mu1, mu2


@jit(**_EXACT)
def _optimise(p: FloatArray, p0: FloatArray, n: float, s: float, g: float, base: float, b1: float, b2: float,
              xg: FloatArray, fg: FloatArray, w1g: FloatArray, w2g: FloatArray, newton: int, lam: FloatArray,
              xs: FloatArray, iterations: int, search: int) -> float:
    """Multipliers (nu, mu1, mu2) that (nearly) minimise G over nu real and mu >= 0, from the better of
    `lam` (a warm start; NaN for none) and the chi-square start: damped Newton steps with a
    backtracking line search (mu moves by at most a factor 16 per step), then, for small
    vocabularies, a compass search. Returns the approximate G; lam and xs hold the result."""
    m = p.size
    trial_x = np.empty(m)
    hessian = np.empty((3, 3))
    trial_h = np.empty((3, 3))
    grad = np.empty(3)
    step = np.empty(3)
    free = np.zeros(3, dtype=np.bool_)
    nu0, mu0 = _initial_multipliers(p, p0, n, s, g, min(b1, b2))
    # starting points: the warm start, the chi-square multipliers (split between the two directions
    # of the ball, or on one), no ball multiplier; small vocabularies also try other scales of mu
    scales = np.array([1.0, 1e-4, 1e-2, 1e2])
    starts = np.empty((3 + 3 * scales.size, 3))
    starts[0, 0], starts[0, 1], starts[0, 2] = lam[0], lam[1], lam[2]
    starts[1, 0], starts[1, 1], starts[1, 2] = nu0, 0.0, 0.0
    starts[2, 0], starts[2, 1], starts[2, 2] = nu0, 0.0, 0.0
    for c in range(scales.size):
        mu = mu0 * scales[c]
        starts[3 + 3 * c, 0], starts[3 + 3 * c, 1], starts[3 + 3 * c, 2] = nu0, 0.5 * mu, 0.5 * mu
        starts[4 + 3 * c, 0], starts[4 + 3 * c, 1], starts[4 + 3 * c, 2] = nu0, mu, 0.0
        starts[5 + 3 * c, 0], starts[5 + 3 * c, 1], starts[5 + 3 * c, 2] = nu0, 0.0, mu
    if not (b1 < np.inf):
        for row in range(starts.shape[0]):
            starts[row, 1] = 0.0
    if not (b2 < np.inf):
        for row in range(starts.shape[0]):
            starts[row, 2] = 0.0
    best_value = np.inf
    best = np.zeros(3)
    first = 0 if lam[0] == lam[0] else 1
    for row in range(first, starts.shape[0]):
        if not (starts[row, 0] == starts[row, 0]) or starts[row, 1] < 0.0 or starts[row, 2] < 0.0:
            continue
        total, sx, s1, s2 = _evaluate(starts[row, 0], starts[row, 1], starts[row, 2], p, p0, n, s, g, xg, fg,
                                      w1g, w2g, newton, trial_x, trial_h)
        value = base + _linear(starts[row, 0], starts[row, 1], starts[row, 2], b1, b2) + total
        if value < best_value or not (best_value < np.inf):
            best_value = value
            for c in range(3):
                best[c] = starts[row, c]
    nu, mu1, mu2 = best[0], best[1], best[2]
    # a multiplier at 0 with no curvature would take an unbounded Newton step: from 0 it moves by at
    # most the chi-square start's value (or G / B), and from mu by at most a factor 16
    scale1 = max(mu0, abs(best_value) / max(b1, 1e-300), 1e-300)
    scale2 = max(mu0, abs(best_value) / max(b2, 1e-300), 1e-300)
    total, sx, s1, s2 = _evaluate(nu, mu1, mu2, p, p0, n, s, g, xg, fg, w1g, w2g, newton, xs, hessian)
    value = base + _linear(nu, mu1, mu2, b1, b2) + total
    for _ in range(iterations):
        grad[0], grad[1], grad[2] = 1.0 - sx, b1 - s1, b2 - s2
        free[0] = True
        free[1] = mu1 > 0.0 or grad[1] < 0.0
        free[2] = mu2 > 0.0 or grad[2] < 0.0
        _solve_small(hessian, grad, free, step)
        if not (step[0] == step[0] and step[1] == step[1] and step[2] == step[2]):
            break
        accepted = False
        t = 1.0
        for _ in range(12):
            cnu = nu + t * step[0]
            cm1 = mu1 + t * step[1]
            cm2 = mu2 + t * step[2]
            cm1 = min(max(cm1, mu1 / 16.0), max(mu1 * 16.0, scale1)) if mu1 > 0.0 else min(max(cm1, 0.0), scale1)
            cm2 = min(max(cm2, mu2 / 16.0), max(mu2 * 16.0, scale2)) if mu2 > 0.0 else min(max(cm2, 0.0), scale2)
            ctotal, csx, cs1, cs2 = _evaluate(cnu, cm1, cm2, p, p0, n, s, g, xg, fg, w1g, w2g, newton, trial_x,
                                              trial_h)
            cvalue = base + _linear(cnu, cm1, cm2, b1, b2) + ctotal
            if cvalue < value:
                accepted = True
                break
            t *= 0.25
        if not accepted:
            break
        improvement = value - cvalue
        nu, mu1, mu2, value, sx, s1, s2 = cnu, cm1, cm2, cvalue, csx, cs1, cs2
        for j in range(m):
            xs[j] = trial_x[j]
        for a in range(3):
            for b in range(3):
                hessian[a, b] = trial_h[a, b]
        if improvement <= 1e-9 * abs(value):
            break
    # small vocabularies, where G is far from smooth: a scan of mu (split between the two directions
    # of the ball, or on one) over scales around G / B, nu minimised exactly at each (G is convex in
    # nu), then Nelder-Mead on (nu, log mu1, log mu2) from the two best points
    if search > 0:
        v0, n0 = _min_over_nu(0.0, 0.0, p, p0, n, s, g, base, b1, b2, xg, fg, w1g, w2g, newton, trial_x, trial_h)
        if v0 < value:
            value, nu, mu1, mu2 = v0, n0, 0.0, 0.0
        scale = max(abs(value), 1e-300) / max(min(b1, b2), 1e-300)
        top = np.full((2, 4), np.inf)
        top[0, 0], top[0, 1], top[0, 2], top[0, 3] = value, nu, mu1, mu2
        for kind in range(3):
            if (kind != 2 and not (b1 < np.inf)) or (kind != 1 and not (b2 < np.inf)):
                continue
            for scan in range(10):
                mu = scale * math.exp(-13.5 + 1.5 * scan)
                cm1 = mu if kind == 1 else (0.5 * mu if kind == 0 else 0.0)
                cm2 = mu if kind == 2 else (0.5 * mu if kind == 0 else 0.0)
                cvalue, cnu = _min_over_nu(cm1, cm2, p, p0, n, s, g, base, b1, b2, xg, fg, w1g, w2g, newton, trial_x,
                                           trial_h)
                if cvalue < top[1, 0]:
                    if cvalue < top[0, 0]:
                        top[1, :] = top[0, :]
                        top[0, 0], top[0, 1], top[0, 2], top[0, 3] = cvalue, cnu, cm1, cm2
                    else:
                        top[1, 0], top[1, 1], top[1, 2], top[1, 3] = cvalue, cnu, cm1, cm2
        point = np.empty(3)
        for start in range(2):
            if not (top[start, 0] < np.inf):
                continue
            sn, sm1, sm2 = top[start, 1], top[start, 2], top[start, 3]
            if top[start, 0] < value:
                value, nu, mu1, mu2 = top[start, 0], sn, sm1, sm2
            point[0] = sn
            point[1] = math.log(sm1) if sm1 > 0.0 else math.log(scale) - 20.0
            point[2] = math.log(sm2) if sm2 > 0.0 else math.log(scale) - 20.0
            width = 0.1 * abs(sn) + 1e-3 * abs(top[start, 0]) + 1e-300
            found, fn, fm1, fm2 = _nelder_mead(point, width, search // 2, p, p0, n, s, g, base, b1, b2, xg, fg, w1g,
                                               w2g, newton, trial_x, trial_h)
            if found < value:
                value, nu, mu1, mu2 = found, fn, fm1, fm2
        _evaluate(nu, mu1, mu2, p, p0, n, s, g, xg, fg, w1g, w2g, newton, xs, trial_h)
    lam[0], lam[1], lam[2] = nu, mu1, mu2
    return value


# ----------------------------------------------------------------------------- certification

@jit(**_EXACT)
def _certify_token(nu: float, mu1: float, mu2: float, j: int, p: FloatArray, p0: FloatArray, lo: FloatArray,
                   hi: FloatArray, n: float, s: float, g: float, flo: float, eflo: float, fhi: float, efhi: float,
                   ball_lo: FloatArray, ball_hi: FloatArray, x_best: float, tol: float, max_points: int, px: FloatArray,
                   pv: FloatArray) -> tuple[float, float]:
    """Upper bound on S_j = sup over [lo_j, hi_j] of f - nu x - mu1 W1 - mu2 W2 (and the best value
    seen), by branch and bound on pieces bounded by _piece_bound: the piece of largest bound is split
    until it is within `tol` of the best value or max_points points are used. px (max_points,) and
    pv (max_points, 6) are work arrays: per point x, then f, e_f, g, e_g, g', e_g' (certified)."""
    count = 0
    # the two ends (f and the ball terms there are given: lo and hi are the same at every order)
    gl, egl = _combine(nu, mu1, mu2, lo[j], ball_lo[j, 0], ball_lo[j, 1], ball_lo[j, 2], ball_lo[j, 3])
    dl, edl = _combine(nu, mu1, mu2, 1.0, ball_lo[j, 4], ball_lo[j, 5], ball_lo[j, 6], ball_lo[j, 7])
    gh, egh = _combine(nu, mu1, mu2, hi[j], ball_hi[j, 0], ball_hi[j, 1], ball_hi[j, 2], ball_hi[j, 3])
    dh, edh = _combine(nu, mu1, mu2, 1.0, ball_hi[j, 4], ball_hi[j, 5], ball_hi[j, 6], ball_hi[j, 7])
    px[0] = lo[j]
    pv[0, 0], pv[0, 1], pv[0, 2], pv[0, 3], pv[0, 4], pv[0, 5] = flo, eflo, gl, egl, dl, edl
    count = 1
    if x_best > lo[j] and x_best < hi[j]:
        px[1] = x_best
        _certified_point(nu, mu1, mu2, x_best, p[j], p0[j], n, s, g, pv, 1)
        count = 2
    px[count] = hi[j]
    pv[count, 0], pv[count, 1], pv[count, 2], pv[count, 3], pv[count, 4], pv[count, 5] = fhi, efhi, gh, egh, dh, edh
    count += 1
    best_low = -np.inf
    for i in range(count):
        low = pv[i, 0] - pv[i, 2]
        if low > best_low:
            best_low = low
    while True:
        worst, at, split = -np.inf, 0, 0.0
        for i in range(count - 1):
            bound, cut = _piece_bound(px[i], px[i + 1], pv[i, 0], pv[i, 1], pv[i, 2], pv[i, 3], pv[i, 4], pv[i, 5],
                                      pv[i + 1, 0], pv[i + 1, 1], pv[i + 1, 2], pv[i + 1, 3], pv[i + 1, 4],
                                      pv[i + 1, 5])
            if not (bound <= worst):       # NaN counts as the worst: it is never accepted as a bound
                worst, at, split = bound, i, cut
        if not (worst == worst):
            return np.inf, best_low
        if worst <= best_low + tol or count >= max_points or not (worst < np.inf):
            return worst, best_low
        if not (split > px[at] and split < px[at + 1]):
            return worst, best_low
        for i in range(count, at + 1, -1):
            px[i] = px[i - 1]
            for c in range(6):
                pv[i, c] = pv[i - 1, c]
        px[at + 1] = split
        _certified_point(nu, mu1, mu2, split, p[j], p0[j], n, s, g, pv, at + 1)
        count += 1
        low = pv[at + 1, 0] - pv[at + 1, 2]
        if low > best_low:
            best_low = low


@jit(**_EXACT)
def _certified_point(nu: float, mu1: float, mu2: float, x: float, p: float, p0: float, n: float, s: float, g: float,
                     pv: FloatArray, row: int) -> None:
    f, ef = _f_certified(x, p, n, s)
    w1, e1, w2, e2, d1, f1, d2, f2 = _ball_certified(x, p0, g)
    gv, eg = _combine(nu, mu1, mu2, x, w1, e1, w2, e2)
    dv, ed = _combine(nu, mu1, mu2, 1.0, d1, f1, d2, f2)
    pv[row, 0], pv[row, 1], pv[row, 2], pv[row, 3], pv[row, 4], pv[row, 5] = f, ef, gv, eg, dv, ed


@jit(**_EXACT)
def _certify(nu: float, mu1: float, mu2: float, p: FloatArray, p0: FloatArray, lo: FloatArray, hi: FloatArray, n: float,
             s: float, g: float, flo: FloatArray, fhi: FloatArray, ball_lo: FloatArray, ball_hi: FloatArray,
             xs: FloatArray, target: float, max_points: int) -> tuple[float, int]:
    """(upper bound on sum_j S_j, its float error bound included, and the number of tokens refined).
    A first pass bounds every S_j on the pieces [lo, x*], [x*, hi] (x* the optimiser's maximiser);
    if the bounds exceed the best values found by more than `target` in total, the tokens with the
    largest gaps are refined (each to target / (2 R), R of them, the rest's gaps summing to at most
    target / 2)."""
    m = p.size
    upper = np.empty(m)
    gap = np.empty(m)
    px = np.empty(max_points)
    pv = np.empty((max_points, 6))
    total_gap = 0.0
    for j in range(m):
        u, low = _certify_token(nu, mu1, mu2, j, p, p0, lo, hi, n, s, g, flo[j, 0], flo[j, 1], fhi[j, 0], fhi[j, 1],
                                ball_lo, ball_hi, xs[j], np.inf, max_points, px, pv)
        upper[j] = u
        gap[j] = u - low if u - low > 0.0 else 0.0
        total_gap += gap[j]
    refined = 0
    if total_gap > target and total_gap < np.inf:
        order = np.argsort(gap)
        rest = 0.0
        count = m
        for i in range(m):               # the smallest gaps stay as they are while their sum fits target / 2
            if rest + gap[order[i]] > 0.5 * target:
                break
            rest += gap[order[i]]
            count = m - i - 1
        tol = 0.5 * target / max(count, 1)
        for i in range(m - count, m):
            j = order[i]
            u, low = _certify_token(nu, mu1, mu2, j, p, p0, lo, hi, n, s, g, flo[j, 0], flo[j, 1], fhi[j, 0],
                                    fhi[j, 1], ball_lo, ball_hi, xs[j], tol, max_points, px, pv)
            if u < upper[j]:
                upper[j] = u
            refined += 1
    total, magnitude = 0.0, 0.0
    for j in range(m):
        total += upper[j]
        magnitude += abs(upper[j])
    if not (magnitude < np.inf):
        return np.inf, refined
    # any order of summation errs by at most (m - 1) u sum |terms| (Higham 2002, eq. 4.4)
    return total + (m + 1.0) * _U * magnitude * 1.01, refined


# ----------------------------------------------------------------------------- one step, every dual order

@jit(**_EXACT)
def _grid(lo: FloatArray, hi: FloatArray, p: FloatArray, p0: FloatArray, points: int, xg: FloatArray) -> None:
    """Per token, `points` points from lo to hi, geometric in between (from hi 2^-40 when lo is
    tinier), with p and p0 put in place of the nearest inner points when they lie inside."""
    m = lo.size
    for j in range(m):
        start = max(lo[j], hi[j] * 2.0 ** -40)
        if not (start > 0.0):
            start = hi[j]
        ratio = (hi[j] / start) ** (1.0 / (points - 1)) if hi[j] > start else 1.0
        xg[j, 0] = lo[j]
        value = start
        for i in range(1, points - 1):
            value *= ratio
            xg[j, i] = min(value, hi[j])
        xg[j, points - 1] = hi[j]
        for special in (p[j], p0[j]):
            if special > lo[j] and special < hi[j] and points > 3:
                nearest, distance = 1, np.inf
                for i in range(1, points - 1):
                    if abs(math.log(xg[j, i] / special)) < distance:
                        nearest, distance = i, abs(math.log(xg[j, i] / special))
                xg[j, nearest] = special
        for i in range(1, points):          # keep the row sorted (the replacements can swap two)
            value = xg[j, i]
            q = i - 1
            while q >= 0 and xg[j, q] > value:
                xg[j, q + 1] = xg[j, q]
                q -= 1
            xg[j, q + 1] = value


@jit(**_EXACT)
def _row_duals(p: FloatArray, p0: FloatArray, lo: FloatArray, hi: FloatArray, n: float, orders: FloatArray,
               gs: FloatArray, budgets: FloatArray, p_dev: float, p_err: float, p0_dev: float, p0_err: float,
               outside: float, outside_err: float, forward_finite: bool, points: int, newton: int, iterations: int,
               search: int, tolerance: float, max_points: int, out_g: FloatArray, out_lam: FloatArray,
               out_x: FloatArray, out_approx: FloatArray) -> None:
    """For one step: at each order of `orders` (ascending) and each direction (0 forward, 1 reverse),
    a certified upper bound on max over the ball of sum_j p_j h(t_j) - 1 (out_g), the multipliers
    used (out_lam) and the inner maximisers (out_x, for the adversary). gs[i] is the order of the
    dualised ball constraint at orders[i], budgets[i] an upper bound on R - 1 = expm1((g - 1) r_g)."""
    m = p.size
    xg = np.empty((m, points))
    fg = np.empty((m, points))
    w1g = np.empty((m, points))
    w2g = np.empty((m, points))
    ball_lo = np.empty((m, 8))
    ball_hi = np.empty((m, 8))
    flo = np.empty((m, 2))
    fhi = np.empty((m, 2))
    xs = np.empty(m)
    lam = np.empty(3)
    _grid(lo, hi, p, p0, points, xg)
    current_g = -1.0
    for i in range(orders.size):
        k, g = orders[i], gs[i]
        if g != current_g:
            current_g = g
            for j in range(m):
                for c in range(points):
                    x = xg[j, c]
                    w1, _, w2, _, _, _, _, _ = _ball_certified(x, p0[j], g)
                    w1g[j, c], w2g[j, c] = w1, w2
                r = _ball_certified(lo[j], p0[j], g)
                for c in range(8):
                    ball_lo[j, c] = r[c]
                r = _ball_certified(hi[j], p0[j], g)
                for c in range(8):
                    ball_hi[j, c] = r[c]
        budget = budgets[i]
        # B1 = R - 1 + (1 - g)(1 - P0), B2 = R - 1 + g (1 - P0), rounded up (1 - P0 within p0_err)
        b1 = budget + (1.0 - g) * p0_dev + (g - 1.0) * p0_err
        b1 += 4.0 * _U * (abs(budget) + abs((1.0 - g) * p0_dev) + (g - 1.0) * p0_err)
        b2 = budget + g * p0_dev + g * p0_err
        b2 += 4.0 * _U * (abs(budget) + abs(g * p0_dev) + g * p0_err)
        for direction in range(2):
            if direction == 0 and not forward_finite:
                out_g[i, 0] = np.inf
                out_lam[i, 0, 0] = np.nan
                continue
            s = k if direction == 0 else 1.0 - k
            # C = (P - 1)(1 - h'(1)) + (mass outside p0's support) psi(0), rounded up
            h1 = s / (n + 1.0)
            psi0, epsi0 = _f_certified(0.0, 1.0, n, s)
            base = p_dev * (1.0 - h1) + abs(1.0 - h1) * p_err + (outside + outside_err) * (psi0 + epsi0)
            base += 4.0 * _U * (abs(p_dev * (1.0 - h1)) + abs(1.0 - h1) * p_err + abs((outside + outside_err) * psi0))
            for j in range(m):
                for c in range(points):
                    fg[j, c] = _f_certified(xg[j, c], p[j], n, s)[0]
                flo[j, 0], flo[j, 1] = _f_certified(lo[j], p[j], n, s)
                fhi[j, 0], fhi[j, 1] = _f_certified(hi[j], p[j], n, s)
            if i > 0 and out_lam[i - 1, direction, 0] == out_lam[i - 1, direction, 0]:
                lam[0], lam[1], lam[2] = out_lam[i - 1, direction, 0], out_lam[i - 1, direction, 1], \
                    out_lam[i - 1, direction, 2]
            else:
                lam[0], lam[1], lam[2] = np.nan, 0.0, 0.0
            approx = _optimise(p, p0, n, s, g, base, b1, b2, xg, fg, w1g, w2g, newton, lam, xs, iterations, search)
            nu, mu1, mu2 = lam[0], lam[1], lam[2]
            if not (nu == nu and abs(nu) < np.inf and mu1 >= 0.0 and mu1 < np.inf and mu2 >= 0.0 and mu2 < np.inf):
                # weak duality needs a finite nu and mu >= 0: anything else certifies nothing
                out_g[i, direction] = np.inf
                out_approx[i, direction] = approx
                out_lam[i, direction, 0] = np.nan
                continue
            target = tolerance * max(abs(approx), 1e-300)
            total, _ = _certify(nu, mu1, mu2, p, p0, lo, hi, n, s, g, flo, fhi, ball_lo, ball_hi, xs, target,
                                max_points)
            linear = _linear(nu, mu1, mu2, b1, b2)
            value = base + linear + total
            value += 4.0 * _U * (abs(base) + abs(nu) + abs(linear - nu) + abs(total))
            out_g[i, direction] = value if value == value else np.inf
            out_approx[i, direction] = approx
            out_lam[i, direction, 0], out_lam[i, direction, 1], out_lam[i, direction, 2] = nu, mu1, mu2
            for j in range(m):
                out_x[i, direction, j] = xs[j]


# ----------------------------------------------------------------------------- the closed-form add-one bound

def _knapsack_allocation(log_qmax: np.ndarray, log_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fractional-knapsack allocation of unit mass to tokens in decreasing order of log_t, each
    capped at qmax_j = exp(log_qmax_j): (log of each token's allocation, -inf where none; log_t in the
    same order). Rounded up: the mass placed is at least 1 (extra weight on the largest ratios only
    raises a bound built on it). A ball around a law has qmax_j >= p0_j, so the caps hold unit mass.
    Tokens keep their order (dpledger.mechanisms.fused.knapsack_allocation sorts only the tokens where
    the mass crosses 1); an input holding NaN is ranked by a full sort, NaN last."""
    inflate = 1.0 + 4.0 * ROUNDING_ULPS * log_t.shape[-1]
    if np.isnan(log_t).any() or np.isnan(log_qmax).any():   # (the bound then comes out NaN and is refused)
        order = np.argsort(-log_t, axis=-1, kind="stable")
        caps = np.take_along_axis(np.exp(log_qmax), order, axis=-1)
        before = np.cumsum(caps, axis=-1) - caps
        allocation = np.minimum(caps, np.clip(1.0 - before, 0.0, None) * inflate)
        with np.errstate(divide="ignore"):
            return np.log(allocation), np.take_along_axis(log_t, order, axis=-1)
    flat_caps = np.ascontiguousarray(log_qmax, dtype=np.float64).reshape(-1, log_t.shape[-1])
    flat_t = np.ascontiguousarray(log_t, dtype=np.float64).reshape(-1, log_t.shape[-1])
    out = np.empty(flat_t.shape)
    for row in range(flat_t.shape[0]):
        knapsack_allocation(flat_caps[row], flat_t[row], inflate, out[row])
    return out.reshape(log_t.shape), log_t


class _AllocatedTokens:
    """Per row of (..., V): the tokens the fractional knapsack allocates mass to (log a_j, log t_j and
    shift_j = log((N + t_j) / (N + 1)), compacted), found once per step for every order the sub-grid
    asks for; a row where a token with t_j = +inf (p_j = 0 < qmax_j) receives mass is marked infinite.
    `weighted` (records_version >= 7) also keeps log c_j = log a_j - log t_j and the log of the weight
    w0 on phi_k(0), rounded up (add_one_weighted_order_sums): w0 = max(0, P - C (1 - d)) (1 + 2u) + u with
    P an upper bound on the law's mass sum_j p_j (`masses`; the chord bound's phi_k(0) term is
    phi_k(0) sum_j p_j, which a float law may hold above 1), C the computed sum_j c_j and d a bound on
    its relative error (each exp within 1 ulp of its rounded argument, (M + 1) ulps for a sum of M
    nonnegative terms in any order); the factor and the u cover the subtraction's and the product's
    rounding, so w0 >= sum_j p_j - sum_j c_j. For every row, infinite or not, it also keeps how many tokens
    receive mass and the largest |log a_j| (allocated_counts, allocation_magnitudes: the allowances'
    scales)."""

    def __init__(self, log_allocation: np.ndarray, log_t: np.ndarray, teachers: float, weighted: bool = True,
                 masses: np.ndarray | None = None, powers: bool = False, vectorised_shifts: bool = False) -> None:
        self.batch = log_t.shape[:-1]
        self.teachers = teachers
        self.weighted = weighted
        self.powers = powers and weighted
        self.power_factors: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, float, float] | None] = []
        flat_allocation = log_allocation.reshape(-1, log_t.shape[-1])
        flat_t = log_t.reshape(-1, log_t.shape[-1])
        self.rows: list[tuple[np.ndarray, ...] | None] = []
        self.log_zero_weights: list[float] = []
        # per row: how many tokens receive mass, and the largest |log a_j| (the allowances scale with both)
        self.allocated_counts = np.zeros(flat_t.shape[0], dtype=np.int64)
        self.allocation_magnitudes = np.zeros(flat_t.shape[0])
        # per row: a bound on every shift's error (records version >= 10: dpledger.mechanisms.fused.add_one_shifts)
        self.shift_errors = np.zeros(flat_t.shape[0])
        for row in range(flat_t.shape[0]):
            la, lt, infinite, self.allocation_magnitudes[row] = allocated_tokens_of(
                np.ascontiguousarray(flat_allocation[row]), np.ascontiguousarray(flat_t[row]))
            self.allocated_counts[row] = la.size
            if infinite:
                self.rows.append(None)
                self.log_zero_weights.append(-np.inf)
                self.power_factors.append(None)
                continue
            if vectorised_shifts:
                shift = np.empty(lt.size)
                self.shift_errors[row] = add_one_shifts(lt, float(teachers), shift)
            else:
                shift = np.ascontiguousarray(np.logaddexp(np.log(teachers), lt) - np.log(teachers + 1.0))
            if not weighted:
                self.rows.append((la, lt, shift))
                self.power_factors.append(None)
                continue
            log_share = np.ascontiguousarray(la - lt)
            shares = np.exp(log_share)
            relative = _U * (2.0 * (np.abs(log_share).max(initial=0.0) + 2.0) + la.size + 1.0)
            mass = 1.0 if masses is None else float(masses.reshape(-1)[row])
            excess = mass - float(shares.sum()) * (1.0 - 2.0 * relative)
            # a NaN mass stays NaN (the bound is then NaN and refused), never a weight of 0
            zero_weight = max(excess, 0.0) * (1.0 + 2.0 * _U) + _U if excess == excess else np.nan
            self.rows.append((la, lt, log_share, shift))
            self.log_zero_weights.append(math.log(zero_weight))
            # the power path's analysis needs a_j, c_j <= 1 (the knapsack's allocations are) and a token
            if self.powers and la.size and la.max() <= 0.0 and log_share.max() <= 0.0:
                allocation, share, base_t, base_shift = (np.empty(la.size) for _ in range(4))
                top_t, top_shift, low_t = add_one_power_bases(la, lt, log_share, shift, allocation, share, base_t,
                                                              base_shift)
                self.power_factors.append((allocation, share, base_t, base_shift, top_t, top_shift, low_t))
            else:
                self.power_factors.append(None)
        # max - min log t of each row on the power path (0 elsewhere: no lattice allowance, the exp path there)
        self.log_t_spans = np.asarray([0.0 if factors is None else factors[4] - factors[6]
                                       for factors in self.power_factors])
        self._lattice_allowances: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    @staticmethod
    def _on_lattice(orders: np.ndarray) -> np.ndarray:
        """Which orders are > 1 and within 1e-9 of the lattice of tenths (and small enough for int64 steps):
        the orders add_one_lattice_allowances covers."""
        tenths = orders * LATTICE
        on: np.ndarray = (orders > 1.0) & (np.abs(tenths - np.rint(tenths)) <= 1e-9) & (tenths <= 2.0 ** 40)
        return on

    def lattice_allowances(self, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(..., K) each: what the power path adds to the u2 and chord sums' error at each order on the
        lattice (dpledger.mechanisms.fused.add_one_lattice_allowances, whether or not a given call took that
        path): e (6 + 0.3 span) u for a power of e factors and the lattice's gap times the log-t span; 0 off
        the lattice. Kept per set of orders (the sub-grid asks for the same ones several times a round);
        callers do not write into them."""
        shape = (*self.batch, orders.size)
        if not self.powers:
            return np.zeros(shape), np.zeros(shape)
        orders = np.ascontiguousarray(orders, dtype=np.float64)
        key = orders.tobytes()
        if key not in self._lattice_allowances:
            u2, chord = np.empty((len(self.rows), orders.size)), np.empty((len(self.rows), orders.size))
            add_one_lattice_allowances(orders, self._on_lattice(orders), self.log_t_spans, u2, chord)
            self._lattice_allowances[key] = (u2.reshape(shape), chord.reshape(shape))
        return self._lattice_allowances[key]

    def zero_weight_magnitude(self) -> np.ndarray:
        """(..., 1): |log w0| per row where w0 > 0, else 0 (the weight's exponent joins the chord's allowance)."""
        weights = np.asarray(self.log_zero_weights, dtype=np.float64)
        return np.where(np.isfinite(weights), np.abs(weights), 0.0).reshape(*self.batch, 1)

    def order_sums(self, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(log sum_j a_j t_j^(k-1), log of the chord bound's sum, and their derivatives in k) per row
        and order k, by the fused kernels over the allocated tokens only: (..., K) each; +inf (slopes 0)
        in an infinite row. With `powers` an order on the lattice of tenths takes the power path
        (dpledger.mechanisms.fused.add_one_power_order_sums) and any other the exp path
        (add_one_weighted_order_sums), order by order: each value depends on its order alone, never on
        the other orders asked for at once (the sub-grid's values equal computing every order's)."""
        orders = np.ascontiguousarray(orders, dtype=np.float64)
        u2, chord, u2_slope, chord_slope = (np.empty((len(self.rows), orders.size)) for _ in range(4))
        _set_threads()
        for row in range(len(self.rows)):
            self._row_sums(row, orders, (u2[row], chord[row], u2_slope[row], chord_slope[row]))
        shape = (*self.batch, orders.size)
        return u2.reshape(shape), chord.reshape(shape), u2_slope.reshape(shape), chord_slope.reshape(shape)

    def row_order_sums(self, row: int, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """order_sums for one row (its index in the flattened batch): (K,) each, the same values."""
        orders = np.ascontiguousarray(orders, dtype=np.float64)
        targets = (np.empty(orders.size), np.empty(orders.size), np.empty(orders.size), np.empty(orders.size))
        _set_threads()
        self._row_sums(row, orders, targets)
        return targets

    def _row_sums(self, row: int, orders: np.ndarray,
                  targets: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Writes order_sums' four values of one row at `orders` (float64, contiguous) into `targets`."""
        tokens = self.rows[row]
        if tokens is None:
            targets[0][:], targets[1][:], targets[2][:], targets[3][:] = np.inf, np.inf, 0.0, 0.0
            return
        exp_path = np.ones(orders.size, dtype=bool)
        if self.powers and (factors := self.power_factors[row]) is not None and (on := self._on_lattice(orders)).any():
            lattice = np.ascontiguousarray(orders[on])
            chord_steps = np.rint(lattice * LATTICE).astype(np.int64)
            powered = [np.empty(lattice.size) for _ in range(4)]
            underflow = np.zeros(lattice.size, dtype=bool)
            add_one_power_order_sums(factors[0], factors[1], factors[2], factors[3], tokens[1], tokens[3],
                                     factors[4], factors[5], self.log_zero_weights[row], lattice,
                                     chord_steps - LATTICE, chord_steps, float(self.teachers), powered[0],
                                     powered[1], powered[2], powered[3], underflow)
            for target, values in zip(targets, powered):
                target[on] = values
            exp_path = ~on
            exp_path[np.flatnonzero(on)[underflow]] = True   # lost digits to underflow: the exp path there
        if not exp_path.any():
            return
        outputs = [np.empty(int(exp_path.sum())) for _ in range(4)]
        subset = np.ascontiguousarray(orders[exp_path])
        if self.weighted:
            add_one_weighted_order_sums(tokens[0], tokens[1], tokens[2], tokens[3], self.log_zero_weights[row],
                                        subset, float(self.teachers), outputs[0], outputs[1], outputs[2],
                                        outputs[3])
        else:
            add_one_order_sums(tokens[0], tokens[1], tokens[2], subset, float(self.teachers), outputs[0],
                               outputs[1], outputs[2], outputs[3])
        for target, values in zip(targets, outputs):
            target[exp_path] = values


ADD_ONE_RELATIVE_TOLERANCE = 0.005
"""The add-one bound's sub-grid certificate: every order's value is within 0.5% of computing that order."""

ADD_ONE_SUBGRID_MIN_VOCABULARY = 8192
"""Below this vocabulary the add-one bound is computed at every order whatever the tolerance: the sub-grid's
bookkeeping (a few numpy passes a round) costs more than the orders it saves (V = 1,024: 1-1.5 ms every
order against 2-5 ms refined, per call; V = 50,257: 80 -> 30 ms at N = 8). A property of the row, so a
replay in windows of another size decides the same."""


def add_one_divergence_bounds(output: torch.Tensor, public: torch.Tensor, teachers: int, orders: torch.Tensor,
                              alpha: float, radius: float, all_orders_beta: float | None = None,
                              dual: bool = False, relative_tolerance: float | None = ADD_ONE_RELATIVE_TOLERANCE,
                              subgrid_from_vocabulary: int = ADD_ONE_SUBGRID_MIN_VOCABULARY,
                              version: int = ADD_ONE_VERSION) -> torch.Tensor:
    """max(forward, reverse) of add_one_direction_bounds (its docstring has the derivation): (..., K).

    dual=True takes, in each direction, the smaller of the closed-form bound and the Lagrangian dual
    bound of dual_add_one_bounds (Boyd & Vandenberghe 2004, Section 5.1.3, weak
    duality; certified in floating point). Both are upper bounds on the same maximum, so their minimum
    is one, and it is never above the closed-form value. The dual costs far more per step (about a
    thousand times the closed form at V = 1024: benchmarks/results/add_one_dual_cost.json), so it
    is an option; a run records it (manifest params "add_one_dual") and the audit recomputes what
    was charged.

    Args:
        output: the ensemble's output law p (the mean of the N mixed teachers), shape (..., V).
        public: the public model's law p0, shape (..., V).
        teachers: the ensemble size N >= 1.
        orders: the Renyi orders k > 1, shape (K,).
        alpha: the projection order of PMixED's ball (> 1).
        radius: the ball's radius in nats at order alpha (>= 0).
        all_orders_beta: beta of the all-orders ball (D<->_k <= beta k at every k > 1), or None for the
            ball at order alpha only.
        dual: also compute the certified Lagrangian dual bound and keep the smaller per direction.
        relative_tolerance: the closed form's sub-grid certificate (add_one_direction_bounds); None: every
            order computed.
        subgrid_from_vocabulary: the smallest vocabulary the sub-grid runs at (every order below it).
        version: the records version whose arithmetic to follow (add_one_direction_bounds).

    Returns:
        float64 tensor (..., K): an upper bound in nats on the add-one divergence at each order.

    Raises:
        ValueError: if the bound is NaN (an input distribution holds NaN or inf), or (dual=True) the
            inputs fail dual_add_one_bounds' checks.
    """
    # from records version 7 W only where the reverse can exceed the forward (without the dual, which may
    # lower the forward below B1 where the closed form was above it)
    forward, reverse = add_one_direction_bounds(output, public, teachers, orders, alpha, radius, all_orders_beta,
                                                relative_tolerance, subgrid_from_vocabulary, version,
                                                reverse_where_binding=version >= 7 and not dual)
    if dual:
        dual_forward, dual_reverse, _ = _dual_add_one(output, public, teachers, orders, alpha, radius, all_orders_beta)
        forward = np.minimum(forward, dual_forward.reshape(forward.shape))
        reverse = np.minimum(reverse, dual_reverse.reshape(reverse.shape))
    bound = np.maximum(forward, reverse)
    if np.any(np.isnan(bound)):
        raise ValueError("add-one bound is NaN: an input distribution holds NaN or inf")
    return torch.from_numpy(bound)


def add_one_direction_bounds(output: torch.Tensor, public: torch.Tensor, teachers: int, orders: torch.Tensor,
                             alpha: float, radius: float, all_orders_beta: float | None = None,
                             relative_tolerance: float | None = ADD_ONE_RELATIVE_TOLERANCE,
                             subgrid_from_vocabulary: int = ADD_ONE_SUBGRID_MIN_VOCABULARY,
                             version: int = ADD_ONE_VERSION, reverse_where_binding: bool = False
                             ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, reverse), numpy (..., K): upper bounds, per order k, on the max of D_k(p_+ || p)
    (forward) and of D_k(p || p_+) (reverse) over every teacher an adversary
    can add: output (..., V) is p = mean of the N mixed teachers, public (..., V) is p0, and
    p_+ = (N p + q) / (N + 1) with q any law PMixED's projection can produce, i.e. any q in the ball
    B = {q : D<->_alpha(q, p0) <= radius} (q = lambda x + (1 - lambda) p0 lies in B whatever the
    added teacher x is, and every q in B is reachable with x = q). With `all_orders_beta` the ball
    also holds at every order (PMixED ball="all-orders"): D<->_k(q, p0) <= beta k for all k > 1.
    Derivation (each step's source in brackets):

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

    Orders on a sub-grid (`relative_tolerance`): the three sums that cost V (or the knapsack's tokens)
    per order, (k-1) U2_k, the log of the chord bound's sum and (k-1) W_k, are each convex in k: each is
    the log of a nonnegative combination of exponentials of affine functions of k (for the chord sum,
    (1 - sum_j a_j / t_j) phi_k(0) + sum_j (a_j / t_j) phi_k(t_j), with sum_j a_j / t_j <= sum_j p_j as
    a_j <= qmax_j), hence convex (van Erven & Harremoes 2014, Corollary 2; Boyd & Vandenberghe 2004,
    Section 3.1.5). (A float law p may sum to 1 + e, e > 0: then the weight of phi_k(0) may be -e, and
    log S lies at most e below the log of the same sum with that weight raised to 0, which is convex and
    at least phi_k(0); e joins the chord sum's allowance. From records version 7 the weight of phi_k(0)
    is taken as what the chord bound gives for the float law, sum_j p_j - sum_j a_j / t_j (its phi_k(0)
    terms are p_j phi_k(0) summed), rounded up to w0 >= max(0, that): a larger weight raises the sum, so
    it stays an upper bound, and no weight is negative, so it is convex; the kernel then needs one exp
    per token, and each sum of M terms carries the worst case of its rounding in any order, (M + 2) unit
    roundoffs (Higham 2002, Section 4.2), in its allowance. Jensen's (p, p) term is likewise sum_j p_j,
    not 1: from version 7 log(1 + e) joins its moment, e the mass's excess over 1.) So each lies under
    its chord between two
    orders where it was computed, and above its tangents there (the kernel gives the derivatives of the
    first two) and the extensions of its neighbouring chords (`_sandwich`). Every formula above
    is nondecreasing in each sum, so the chords give an upper bound and the tangents and extensions a
    lower bound on what the sums give at that order. Each direction's sub-grid starts at every 8th
    order of the grid and its last, and bisects every interval where the direction's upper bound
    exceeds (1 + relative_tolerance) times its lower bound, so every value is within that factor of
    the all-orders computation and never below it (a chord carries the sums' rounding allowances,
    `_chord_values`). relative_tolerance=None computes every order. From records version 9 each row of a
    batch refines its own sub-grid (before, an interval failing in one row was bisected in all), so a
    row's values do not depend on the rows computed beside it.

    Args:
        output: the ensemble's output law p, shape (..., V).
        public: the public model's law p0, shape (..., V).
        teachers: the ensemble size N >= 1.
        orders: the Renyi orders k > 1, strictly increasing, shape (K,).
        alpha: the projection order of PMixED's ball (> 1).
        radius: the ball's radius in nats at order alpha (>= 0).
        all_orders_beta: beta of the all-orders ball, or None for the ball at order alpha only.
        relative_tolerance: the sub-grid's certificate, > 0 (0.005: within 0.5% of the all-orders
            computation); None: every order computed.
        subgrid_from_vocabulary: the smallest vocabulary the sub-grid runs at; below it every order is
            computed (ADD_ONE_SUBGRID_MIN_VOCABULARY: where the sub-grid saves time).
        version: the records version whose arithmetic to follow (dpledger.mechanisms.kernels.ADD_ONE_VERSION:
            from 7 the weighted chord sum; from 9 each row's own sub-grid; a trace's replay passes the version
            that wrote it).
        reverse_where_binding: compute W only at the orders where the forward bound is below
            B1 = log(1 + 1/N) (in some row of the batch before version 9, in the row itself from 9), and return
            B1 (itself a bound on the reverse) at the others:
            max(forward, reverse) is then what computing W everywhere gives at those orders (where the
            forward is at least B1, the reverse, at most B1, never exceeds it), for the cost of the orders
            where the reverse can matter.

    Returns:
        (forward, reverse), float64 numpy arrays (..., K): upper bounds in nats on D_k(p_+ || p) and
        D_k(p || p_+).

    Raises:
        ValueError: if a bound is NaN (an input distribution holds NaN or inf).
    """
    shape = np.broadcast_shapes(tuple(output.shape), tuple(public.shape))   # one public law may serve a batch
    output = output.detach().cpu().double().expand(shape)
    public = public.detach().cpu().double().expand(shape)
    orders_np = orders.detach().cpu().double().numpy().reshape(-1)
    n = float(teachers)
    log_p = _log(output).numpy()
    log_p0 = _log(public).numpy()
    log_r = (alpha - 1.0) * radius
    # qmax_j, qmin_j and qmax_j / p_j per token (logs; -inf on tokens the public model never emits: every q
    # in the ball is 0 there too, D_alpha(q||p0) being finite), log M = max_j log(qmax_j / p0_j), the largest
    # log(p0_j / p_j) (+inf where p_j = 0 < p0_j) and the magnitudes the allowances scale with, in one pass
    log_qmax, log_qmin, ratio_q_p = (np.empty(log_p.shape) for _ in range(3))
    maxima = np.empty((math.prod(log_p.shape[:-1]), 6))
    add_one_token_bounds(np.ascontiguousarray(log_p).reshape(-1, log_p.shape[-1]),
                         np.ascontiguousarray(log_p0).reshape(-1, log_p.shape[-1]), float(alpha), float(log_r),
                         log_qmax.reshape(-1, log_p.shape[-1]), log_qmin.reshape(-1, log_p.shape[-1]),
                         ratio_q_p.reshape(-1, log_p.shape[-1]), maxima)
    log_m, max_ratio, top_log_p, top_log_p0, top_log_qmin, top_log_t = (maxima[:, column].reshape(log_p.shape[:-1])
                                                                         for column in range(6))
    slack = ROUNDING_ULPS * (top_log_p + top_log_p0 + abs(log_r) + 4.0)
    # One allocation serves U2 and the chord bound at every order: both fill tokens by decreasing
    # t_j = qmax_j / p_j (the chord's slope (phi_k(t) - phi_k(0)) / t grows with t, phi_k being convex).
    log_allocation, log_t = _knapsack_allocation(log_qmax, ratio_q_p)
    weighted = version >= 7
    # an upper bound on each row's mass sum_j p_j (a float law may hold a few ulps above 1): the V-term
    # sum's worst case, (V + 2) u, on top of the computed sum
    masses = output.numpy().sum(axis=-1) * (1.0 + (log_p.shape[-1] + 2.0) * _U)
    allocated_tokens = _AllocatedTokens(log_allocation, log_t, n, weighted, masses, powers=version >= 8,
                                        vectorised_shifts=version >= 10)
    magnitude = top_log_t[..., None]   # (log_t holds ratio_q_p's values: the knapsack only reorders them)
    w_magnitude = (top_log_p + top_log_qmin + 2.0)[..., None]
    vocab = log_p.shape[-1]
    allocation_magnitude = allocated_tokens.allocation_magnitudes.reshape(log_p.shape[:-1])[..., None]
    mass_excess_up = np.maximum(masses - 1.0, 0.0) * (1.0 + 2.0 * _U)
    if weighted:   # a sum of M nonnegative terms in any order: within (M - 1) u relative; plus w0's term
        summation = (allocated_tokens.allocated_counts.reshape(log_p.shape[:-1])[..., None] + 2.0) * _U * (1.0 + 1e-6)
        w_summation = (vocab + 2.0) * _U * (1.0 + 1e-6)   # W's V-term sum, as the Renyi kernel adds it
        chord_magnitude = magnitude + allocated_tokens.zero_weight_magnitude()
    else:
        chord_magnitude = magnitude
        w_summation = 0.0
        # the chord sum is a nonnegative combination of exponentials only when sum_j a_j / t_j <= 1; as that
        # sum is at most sum_j p_j, a float law summing above 1 can make it slightly negative on e^(kz), which
        # moves log S below its chords by at most that excess (add_one_direction_bounds): it joins the allowance
        mass_excess = (np.maximum(output.numpy().sum(axis=-1) * (1.0 + vocab * _U) - 1.0, 0.0))[..., None]

    def u2_allowance(u2_moment: np.ndarray, grid: np.ndarray) -> np.ndarray:
        """A bound on the computed (k-1) U2_k's error: its exponents' rounding and the log of the sum's.
        Not proportional to k - 1 (slack, an allowance on U2_k itself, is), so needed near k = 1."""
        allowance: np.ndarray = ROUNDING_ULPS * (np.abs(np.where(np.isfinite(u2_moment), u2_moment, 0.0))
                                                 + allocation_magnitude + (grid - 1.0) * (magnitude + 4.0)
                                                 + 2.0 * np.log2(log_t.shape[-1] + 1.0))
        if allocated_tokens.powers:
            allowance = allowance + allocated_tokens.lattice_allowances(grid)[0]
        return allowance + summation if weighted else allowance

    def forward_sums(index: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        """(k-1) U2_k and the chord sum at orders_np[index] (computed, within their allowances of the
        exact values), with their derivatives in k."""
        u2_moment, chord_total, u2_slope, chord_slope = allocated_tokens.order_sums(orders_np[index])
        return [u2_moment, chord_total], [u2_slope, chord_slope]

    def chord_allowance(chord_total: np.ndarray, grid: np.ndarray) -> np.ndarray:
        """A bound on |computed - exact| of the chord sum at the orders `grid`."""
        chord_size = np.abs(np.where(np.isfinite(chord_total), chord_total, 0.0))
        chord = ROUNDING_ULPS * (chord_size + grid * (chord_magnitude + 4.0) + 2.0 * np.log2(log_t.shape[-1] + 1.0))
        if allocated_tokens.powers:
            chord = chord + allocated_tokens.lattice_allowances(grid)[1]
        allowance: np.ndarray = chord + summation if weighted else chord + 2.0 * mass_excess
        return allowance

    def forward_allowances(values: list[np.ndarray], grid: np.ndarray) -> list[np.ndarray]:
        """A bound on |computed - exact| of each forward sum at the orders `grid`."""
        return [(grid - 1.0) * slack[..., None] + u2_allowance(values[0], grid), chord_allowance(values[1], grid)]

    def forward_bound(values: list[np.ndarray], grid: np.ndarray) -> np.ndarray:
        """D_k(p_+ || p)'s bound at the orders `grid` from the two sums there (nondecreasing in each)."""
        u2_moment, chord_total = values
        with np.errstate(invalid="ignore", over="ignore"):
            above = ((alpha - 1.0) * radius + (grid - alpha) * log_m[..., None]) / (grid - 1.0)
            rho = np.where(grid <= alpha, radius, above)
            if all_orders_beta is not None:
                rho = np.minimum(rho, all_orders_beta * grid)
            u2 = (u2_moment + u2_allowance(u2_moment, grid)) / (grid - 1.0)
            u = np.minimum(rho + max_ratio[..., None], u2) + slack[..., None]
            jensen = log_mean_with_one_exp((grid - 1.0) * u, n + 1.0)
            if weighted:   # the (p, p) term of the convex combination is sum_j p_j, at most 1 + its excess
                jensen = jensen + np.log1p(mass_excess_up)[..., None] * (1.0 + 2.0 * _U)
            jensen = jensen / (grid - 1.0)
            chord = (chord_total + chord_allowance(chord_total, grid)) / (grid - 1.0)
        bound: np.ndarray = np.minimum(jensen, chord)
        return bound

    def reverse_sums_on(grid: np.ndarray) -> _Sums:
        return _reverse_sums_of(log_p, log_qmin, grid, w_summation)

    reverse_allowances = _reverse_allowances_of(w_magnitude, vocab, w_summation)

    def reverse_bound(values: list[np.ndarray], grid: np.ndarray) -> np.ndarray:
        """D_k(p || p_+)'s bound at the orders `grid` from (k-1) W_k there (nondecreasing in it)."""
        with np.errstate(invalid="ignore", over="ignore"):
            w = np.maximum(values[0] / (grid - 1.0), 0.0)
        bound: np.ndarray = np.minimum(np.log1p(1.0 / n), w / (n + 1.0))
        return bound

    batch = log_p.shape[:-1]
    if vocab < subgrid_from_vocabulary:
        relative_tolerance = None
    # from records version 9 each row refines its own sub-grid: a row's bound never depends on the other rows
    # of the batch, so a replay in windows of another length than the decode's blocks recomputes the same bits
    per_row = version >= 9 and relative_tolerance is not None and math.prod(batch) > 1
    curve = _order_curve_per_row if per_row else _order_curve_on_subgrid   # (one row: the same, with less bookkeeping)
    if version >= 10:   # the same rounds and bound, compiled (records version 10)
        rows = math.prod(batch)
        row_terms = np.stack(np.broadcast_arrays(
            log_m, max_ratio, slack, np.log1p(mass_excess_up) * (1.0 + 2.0 * _U), np.full(batch, n),
            allocation_magnitude[..., 0], magnitude[..., 0], chord_magnitude[..., 0], summation[..., 0],
            np.full(batch, 2.0 * np.log2(log_t.shape[-1] + 1.0)),
            allocated_tokens.shift_errors.reshape(batch)), axis=-1).reshape(rows, 11)
        ball = np.array([alpha, radius, 0.0 if all_orders_beta is None else all_orders_beta,
                         0.0 if all_orders_beta is None else 1.0], dtype=np.float64)
        forward = _forward_curve_by_rows(allocated_tokens, orders_np, ball, row_terms,
                                         relative_tolerance).reshape(*batch, orders_np.size)
    else:
        forward = curve(forward_sums, forward_allowances, forward_bound, [False, False], orders_np, batch,
                        relative_tolerance)
    if reverse_where_binding:
        # B1 = log(1 + 1/N) bounds the reverse at every order; where the forward bound is at least B1 the
        # larger of the two is the forward whatever W gives, so W is computed only at the other orders
        cap = np.log1p(1.0 / n)
        needed = ~(forward >= cap)   # (a NaN forward counts as needed, and is refused below)
        reverse = np.full(forward.shape, cap)
        if per_row:   # each row at its own orders, as the row alone
            rows = math.prod(batch)
            flat_needed, flat_reverse = needed.reshape(rows, orders_np.size), reverse.reshape(rows, orders_np.size)
            flat_log_p = log_p.reshape(-1, vocab)
            flat_log_qmin = np.broadcast_to(log_qmin, log_p.shape).reshape(-1, vocab)
            flat_w_magnitude = np.broadcast_to(w_magnitude, (*batch, 1)).reshape(-1, 1)
            for row in np.flatnonzero(flat_needed.any(axis=1)):
                columns = np.flatnonzero(flat_needed[row])
                flat_reverse[row, columns] = _order_curve_on_subgrid(
                    _reverse_sums_of(flat_log_p[row:row + 1], flat_log_qmin[row:row + 1], orders_np[columns],
                                     w_summation),
                    _reverse_allowances_of(flat_w_magnitude[row:row + 1], vocab, w_summation), reverse_bound, [True],
                    orders_np[columns], (1,), relative_tolerance)[0]
            reverse = flat_reverse.reshape(forward.shape)
        else:
            columns = np.flatnonzero(needed.reshape(math.prod(batch), orders_np.size).any(axis=0))
            if columns.size:
                reverse[..., columns] = _order_curve_on_subgrid(reverse_sums_on(orders_np[columns]),
                                                                reverse_allowances, reverse_bound, [True],
                                                                orders_np[columns], batch, relative_tolerance)
    else:
        reverse = curve(reverse_sums_on(orders_np), reverse_allowances, reverse_bound, [True], orders_np, batch,
                        relative_tolerance)
    if np.any(np.isnan(forward)) or np.any(np.isnan(reverse)):
        raise ValueError("add-one bound is NaN: an input distribution holds NaN or inf")
    # the last divisions' rounding
    return forward * (1.0 + ROUNDING_ULPS), reverse * (1.0 + ROUNDING_ULPS)


def _reverse_sums_of(log_p: np.ndarray, log_qmin: np.ndarray, grid: np.ndarray, summation: float) -> _Sums:
    """The reverse direction's sums for add_one_direction_bounds' sub-grid: (k-1) W_k at grid[index], rounded
    up by the Renyi kernel (no derivative: secants only)."""
    def reverse_sums(index: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        return [_log_moments(log_p, log_qmin, grid[index], summation)], None
    return reverse_sums


def _reverse_allowances_of(w_magnitude: np.ndarray, vocab: int, summation: float) -> _Allowances:
    """The Renyi kernel's slack on (k-1) W_k at the orders `grid` (which it adds to its value), for rows of
    magnitudes `w_magnitude` (..., 1)."""
    def reverse_allowances(values: list[np.ndarray], grid: np.ndarray) -> list[np.ndarray]:
        size = np.abs(np.where(np.isfinite(values[0]), values[0], 0.0))
        return [_SLACK_ULPS * ((grid + 1.0) * w_magnitude + np.log2(vocab) + 2.0 + size) + summation]
    return reverse_allowances


def _log_moments(log_p: np.ndarray, log_q: np.ndarray, orders: np.ndarray, summation: float) -> np.ndarray:
    """(k - 1) D_k(P || Q) rounded up by the Renyi kernel (dpledger.mechanisms.fused.renyi_log_moments),
    for rows of the same shape (..., V): (..., K). Unlike renyi_divergence_orders it keeps the moment,
    which a chord interpolates (dividing by k - 1 and multiplying back could round it down). `summation`
    joins the kernel's allowance for its V-term sum (renyi_log_moments)."""
    vocab = log_p.shape[-1]
    lp = np.ascontiguousarray(log_p.reshape(-1, vocab))
    lq = np.ascontiguousarray(log_q.reshape(-1, vocab))
    out = np.empty((lp.shape[0], orders.size))
    rows = np.arange(lp.shape[0], dtype=np.int64)
    _set_threads()
    renyi_log_moments(lp, lq, rows, rows, np.ascontiguousarray(orders, dtype=np.float64), _SLACK_ULPS, summation, out)
    return out.reshape(*log_p.shape[:-1], orders.size)


_Sums = Callable[[np.ndarray], tuple[list[np.ndarray], list[np.ndarray] | None]]
"""The convex sums at the orders grid[index], given index, and their derivatives in the order (or None)."""
_Allowances = Callable[[list[np.ndarray], np.ndarray], list[np.ndarray]]
"""Each sum's rounding allowance at the given orders, from the sums' values there."""
_Bound = Callable[[list[np.ndarray], np.ndarray], np.ndarray]
"""A direction's bound at the given orders from the sums there."""

ADD_ONE_SEED_SPACING = 8
"""The first sub-grid takes every 8th order of the grid (and its last): dense enough that two or three
refinement rounds certify the rest, as each round costs more Python than evaluating a few orders
(measured at V = 1,024 x 32 steps and V = 50,257 with N = 8 and 100: spacings 4, 8 and 16 within 20%)."""


def _seed_orders(grid: np.ndarray) -> np.ndarray:
    """The first sub-grid: every ADD_ONE_SEED_SPACING-th order of the grid and its last."""
    return np.unique(np.append(np.arange(0, grid.size, ADD_ONE_SEED_SPACING), grid.size - 1))


def _sandwich(grid: np.ndarray, done: np.ndarray, values: np.ndarray,
              slopes: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For a function convex in the order, known at each row's anchors `done` (values, and its derivatives
    there or None, given at every grid order and read at the anchors only; `done` bool, broadcast against
    values: (K,) for anchors shared by every row; each row needs at least two), at every grid order:
    (the chord between the enclosing anchors, a bound on that chord's rounding, a lower bound: the largest
    of the tangents at the two enclosing anchors and the extensions of the neighbouring chords), each of
    values' shape (..., K); both equal the value at an anchor. A convex function lies under its chords,
    above its tangents and, outside a chord's interval, above the chord's line (Boyd & Vandenberghe 2004,
    Section 3.1.3). +inf at an anchor makes the row +inf: (k-1) D_k is infinite at one order > 1 exactly
    when the support condition fails, at every order. Compiled (dpledger.mechanisms.fused.convex_sandwich:
    numpy's IEEE operations in numpy's order, element by element)."""
    shape = values.shape
    # (the kernel reads the grid and the slopes order for order and row for row, unchecked)
    if grid.shape != shape[-1:]:
        raise ValueError(f"the grid must hold one order per value, {shape[-1]}, got shape {grid.shape}")
    if slopes is not None and slopes.shape != shape:
        raise ValueError(f"slopes must have the values' shape {shape}, got {slopes.shape}")
    rows = np.ascontiguousarray(values, dtype=np.float64).reshape(-1, shape[-1])
    marks = np.ascontiguousarray(np.broadcast_to(done, shape)).reshape(-1, shape[-1])
    if not marks.sum(axis=1).min(initial=2) >= 2:
        raise ValueError("a convex sandwich needs at least two anchors in every row")
    tangents = rows if slopes is None else np.ascontiguousarray(slopes, dtype=np.float64).reshape(-1, shape[-1])
    chord, rounding, lower = np.empty(rows.shape), np.empty(rows.shape), np.empty(rows.shape)
    convex_sandwich(np.ascontiguousarray(grid, dtype=np.float64), marks, rows, tangents, slopes is not None,
                    ROUNDING_ULPS, chord, rounding, lower)
    return chord.reshape(shape), rounding.reshape(shape), lower.reshape(shape)


def _require_subgrid(grid: np.ndarray, relative_tolerance: float | None) -> None:
    """The sub-grid's arguments, one line each: a certificate > 0 (None: every order computed, any grid) and,
    with one, strictly increasing orders (the chords and the bisection read them in order)."""
    if relative_tolerance is None:
        return
    if not relative_tolerance > 0:
        raise ValueError(f"relative_tolerance must be > 0 or None, got {relative_tolerance!r}")
    if grid.size > 1 and not np.all(np.diff(grid) > 0):
        raise ValueError(f"the add-one bound's sub-grid needs strictly increasing orders, got {grid.tolist()!r}")


def _order_curve_on_subgrid(sums: _Sums, allowances: _Allowances, bound: _Bound, rounded_up: list[bool],
                            grid: np.ndarray, batch: tuple[int, ...], relative_tolerance: float | None) -> np.ndarray:
    """One direction of add_one_direction_bounds at every order of `grid` from sums convex in the order,
    computed on a sub-grid refined until the chord-based value is within (1 + relative_tolerance) of its
    lower bound (add_one_direction_bounds explains why it is sound). `sums(index)` gives the sums at
    grid[index] and their derivatives (or None); `allowances(values, orders)` bounds their rounding,
    `rounded_up` says which sums the kernel already rounded up; `bound(values, orders)` is the direction's
    bound, nondecreasing in each sum."""
    _require_subgrid(grid, relative_tolerance)
    if relative_tolerance is None or grid.size == 0:   # an empty grid has no sub-grid to seed
        return bound(sums(np.arange(grid.size))[0], grid)
    done = np.zeros(grid.size, dtype=bool)
    known = [np.full(batch + (grid.size,), np.nan) for _ in rounded_up]
    slopes = [np.full(batch + (grid.size,), np.nan) for _ in rounded_up]
    has_slopes = False

    def evaluate(index: np.ndarray) -> None:
        nonlocal has_slopes
        values, derivatives = sums(index)
        for store, value in zip(known, values):
            store[..., index] = value
        if derivatives is not None:
            has_slopes = True
            for store, value in zip(slopes, derivatives):
                store[..., index] = value
        done[index] = True

    evaluate(_seed_orders(grid))
    while not done.all():
        anchors = np.flatnonzero(done)
        sandwiches = [_sandwich(grid, done, store, slope if has_slopes else None) for store, slope in zip(known, slopes)]
        upper = bound(_chord_values(sandwiches, allowances, grid, anchors, known, rounded_up), grid)
        lower = bound([floor for _, _, floor in sandwiches], grid)
        with np.errstate(invalid="ignore"):
            loose = ~(upper <= (1.0 + relative_tolerance) * np.fmax(lower, 0.0) + 1e-300)
        failing = loose.reshape(-1, grid.size).any(axis=0) & ~done
        if not failing.any():
            return upper
        position = np.searchsorted(anchors, np.flatnonzero(failing)) - 1
        evaluate(np.unique((anchors[position] + anchors[position + 1]) // 2))
    return bound(known, grid)


def _order_curve_per_row(sums: _Sums, allowances: _Allowances, bound: _Bound, rounded_up: list[bool],
                         grid: np.ndarray, batch: tuple[int, ...], relative_tolerance: float | None) -> np.ndarray:
    """_order_curve_on_subgrid with each row on its own sub-grid (records version 9): the same seeds, the
    same certificate and bisection, and the same arithmetic element by element, but an interval is
    bisected only in the rows where it fails, and a row stops when its own certificate holds. So every
    row's values are bit for bit what the row gives alone (a batch of one), whatever rows sit beside it.
    `sums(index)` gives every row's sums at grid[index] (each order's value depends on that order alone);
    a row keeps only the orders its sub-grid asked for."""
    if relative_tolerance is None or not (relative_tolerance > 0) or grid.size == 0:   # (no sub-grid to seed)
        return _order_curve_on_subgrid(sums, allowances, bound, rounded_up, grid, batch, relative_tolerance)
    _require_subgrid(grid, relative_tolerance)
    rows, size = math.prod(batch), grid.size
    done = np.zeros((rows, size), dtype=bool)
    known = [np.full((rows, size), np.nan) for _ in rounded_up]
    slopes = [np.full((rows, size), np.nan) for _ in rounded_up]
    has_slopes = False

    def evaluate(wanted: np.ndarray) -> None:
        nonlocal has_slopes
        index = np.flatnonzero(wanted.any(axis=0))
        values, derivatives = sums(index)
        keep = wanted[:, index]
        for store, value in zip(known, values):
            store[:, index] = np.where(keep, value.reshape(rows, index.size), store[:, index])
        if derivatives is not None:
            has_slopes = True
            for store, value in zip(slopes, derivatives):
                store[:, index] = np.where(keep, value.reshape(rows, index.size), store[:, index])
        done[wanted] = True

    seeds = np.zeros((rows, size), dtype=bool)
    seeds[:, _seed_orders(grid)] = True
    evaluate(seeds)
    result = np.full((rows, size), np.nan)
    active = np.ones(rows, dtype=bool)
    by_upper = np.zeros(rows, dtype=bool)
    while True:
        active &= ~done.all(axis=1)
        if not active.any():
            break
        geometry = _row_geometry(done)
        sandwiches = [_sandwich(grid, done, store, slope if has_slopes else None) for store, slope in zip(known, slopes)]
        upper = bound([value.reshape(*batch, size) for value in
                       _row_chord_values(sandwiches, allowances, grid, geometry, known, rounded_up, batch, done)],
                      grid).reshape(rows, size)
        lower = bound([floor.reshape(*batch, size) for _, _, floor in sandwiches], grid).reshape(rows, size)
        with np.errstate(invalid="ignore"):
            loose = ~(upper <= (1.0 + relative_tolerance) * np.fmax(lower, 0.0) + 1e-300)
        failing = loose & ~done & active[:, None]
        finished = active & ~failing.any(axis=1)
        result[finished] = upper[finished]
        by_upper |= finished
        active &= ~finished
        if not active.any():
            break
        left, right = geometry[0], geometry[1]
        wanted = np.zeros((rows, size), dtype=bool)
        row_index, order_index = np.nonzero(failing)
        wanted[row_index, (left[row_index, order_index] + right[row_index, order_index]) // 2] = True
        evaluate(wanted)
    complete = ~by_upper   # (a row leaves the loop by its certificate or with every order computed)
    if complete.any():
        result[complete] = bound([store.reshape(*batch, size) for store in known], grid).reshape(rows, size)[complete]
    return result.reshape(*batch, size)


def _forward_curve_by_rows(allocated_tokens: _AllocatedTokens, grid: np.ndarray, ball: np.ndarray,
                           row_terms: np.ndarray, relative_tolerance: float | None) -> np.ndarray:
    """The forward add-one bound at every order of `grid`, row by row on each row's own sub-grid, with
    each round's certificate, bisection and bound compiled (records version >= 10:
    dpledger.mechanisms.fused.add_one_forward_round): the seeds, the certificate and the bisection of
    _order_curve_per_row, with the C library's transcendental functions in place of numpy's;
    relative_tolerance=None computes every order (one round). (R, K) for the R rows of `row_terms`
    (add_one_forward_round's `row`, one per row of the flattened batch)."""
    _require_subgrid(grid, relative_tolerance)
    rows, size = row_terms.shape[0], grid.size
    result = np.empty((rows, size))
    if size == 0:
        return result
    grid = np.ascontiguousarray(grid, dtype=np.float64)
    lattice_u2, lattice_chord = (np.ascontiguousarray(value).reshape(rows, size)
                                 for value in allocated_tokens.lattice_allowances(grid))
    seeds = np.arange(size, dtype=np.int64) if relative_tolerance is None else _seed_orders(grid).astype(np.int64)
    tolerance = np.inf if relative_tolerance is None else float(relative_tolerance)   # (no round follows the seeds)
    for row in range(rows):
        done = np.zeros((1, size), dtype=bool)
        known, slopes = np.full((2, size), np.nan), np.full((2, size), np.nan)
        index = seeds
        while index.size:
            sums = allocated_tokens.row_order_sums(row, grid[index])
            index = add_one_forward_round(grid, index, *sums, done, known, slopes, ball, row_terms[row],
                                          lattice_u2[row], lattice_chord[row], tolerance,
                                          ROUNDING_ULPS, result[row])
    return result


def _row_geometry(done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (its anchors: `done`, which always holds the first and last order) and order q, as
    _sandwich places q among the row's anchors: the enclosing anchors (left, right; for the last
    anchor the two last)."""
    rows, size = done.shape
    order = np.arange(size)
    at_or_before = np.maximum.accumulate(np.where(done, order, -1), axis=1)
    after = np.minimum.accumulate(np.where(done, order, size)[:, ::-1], axis=1)[:, ::-1]
    strictly_after = np.concatenate([after[:, 1:], np.full((rows, 1), size)], axis=1)
    strictly_before = np.concatenate([np.full((rows, 1), -1), at_or_before[:, :-1]], axis=1)
    last = order == size - 1
    return np.where(last, strictly_before[:, -1:], at_or_before), np.where(last, size - 1, strictly_after)


def _row_chord_values(sandwiches: list[tuple[np.ndarray, np.ndarray, np.ndarray]], allowances: _Allowances,
                      grid: np.ndarray, geometry: tuple[np.ndarray, np.ndarray],
                      known: list[np.ndarray], rounded_up: list[bool], batch: tuple[int, ...],
                      done: np.ndarray) -> list[np.ndarray]:
    """_chord_values for rows with their own anchors: the allowances at every computed order (the
    functions are element by element in the order), read at each order's enclosing anchors."""
    rows, size = done.shape
    left, right = geometry[0], geometry[1]
    chords = [chord + rounding for chord, rounding, _ in sandwiches]
    at_order = [value.reshape(rows, size) for value in allowances([c.reshape(*batch, size) for c in chords], grid)]
    at_anchors = [value.reshape(rows, size) for value in allowances([s.reshape(*batch, size) for s in known], grid)]
    values = []
    for chord, here, there, up in zip(chords, at_order, at_anchors, rounded_up):
        near = np.maximum(np.take_along_axis(there, left, axis=1), np.take_along_axis(there, right, axis=1))
        extra = 2.0 * here if up else here + near
        with np.errstate(invalid="ignore"):
            values.append(np.where(done, chord, chord + extra))
    return values


def _chord_values(sandwiches: list[tuple[np.ndarray, np.ndarray, np.ndarray]], allowances: _Allowances, grid: np.ndarray,
                  anchors: np.ndarray, known: list[np.ndarray], rounded_up: list[bool]) -> list[np.ndarray]:
    """The sums between sub-grid orders: each chord plus its rounding, plus the larger rounding
    allowance of its two anchors (the computed anchors may sit that far below the exact values, under
    whose chord the exact sum lies) and the allowance at the order itself (so the value is never below
    what computing that order would give). A sum the kernel rounds up (W) has anchors above the exact
    values already, and its value at an order is at most the exact one plus twice its slack: twice the
    slack at the order covers it. Exact at the anchors."""
    chords = [chord + rounding for chord, rounding, _ in sandwiches]
    at_order = allowances(chords, grid)
    at_anchors = allowances([store[..., anchors] for store in known], grid[anchors])
    position = np.clip(np.searchsorted(anchors, np.arange(grid.size), side="right") - 1, 0, anchors.size - 2)
    on_anchor = np.zeros(grid.size, dtype=bool)
    on_anchor[anchors] = True
    values = []
    for chord, here, there, up in zip(chords, at_order, at_anchors, rounded_up):
        near = np.maximum(there[..., position], there[..., position + 1])
        extra = 2.0 * here if up else here + near
        with np.errstate(invalid="ignore"):
            values.append(np.where(on_anchor, chord, chord + extra))
    return values


# ----------------------------------------------------------------------------- the ball, the box, the orders

def ball_constraints(alpha: float, radius: float, all_orders_beta: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(orders, radii) of the constraints D<->_a(q, p0) <= r_a that every q of the ball satisfies:
    (alpha, radius), and with `all_orders_beta` also (a, beta a) at every order a of
    dpledger.mechanisms.ball.ALL_ORDERS_BALL_GRID (the all-orders ball holds D<->_k <= beta k at every k > 1;
    any finite subset of its constraints describes a superset of it).

    Args:
        alpha: the projection order (> 1).
        radius: the radius in nats at order alpha.
        all_orders_beta: beta of the all-orders ball, or None.

    Returns:
        (orders, radii): float64 arrays of the same length (1, or 1 + len(ALL_ORDERS_BALL_GRID)).
    """
    orders, radii = [float(alpha)], [float(radius)]
    if all_orders_beta is not None:
        orders += [float(a) for a in ALL_ORDERS_BALL_GRID]
        radii += [float(all_orders_beta) * float(a) for a in ALL_ORDERS_BALL_GRID]
    return np.asarray(orders), np.asarray(radii)


@jit(**_EXACT)
def _merged_box(p0: FloatArray, rest: FloatArray, lo: FloatArray, hi: FloatArray, a: float, r: float,
                iterations: int) -> None:
    """Tighten [lo_j, hi_j] (in place) by the ball at order a seen through the two-cell partition
    {j, not j}: merging cells never increases a Renyi divergence (data processing, van Erven &
    Harremoes 2014, Theorem 9), so every q of the ball has A(q_j) <= R and B(q_j) <= R,
    A(x) = x^a p0_j^(1-a) + (1 - x)^a rest_j^(1-a), B(x) = p0_j^a x^(1-a) + rest_j^a (1 - x)^(1-a),
    R = exp((a - 1) r), rest_j = sum of the other p0_i (rest[j, 0] an upper and rest[j, 1] a lower
    bound: A uses the upper one, B the lower one, which only lowers A and B). A and B are convex on
    (0, 1): an iterate x replaces hi_j only when A(x) > R and A'(x) > 0, both beyond their rounding
    (then A > R on all of [x, 1], A being convex), and replaces lo_j only when B(x) > R and
    B'(x) < 0 (then B > R on (0, x]), so the box only loses points outside the ball. Newton's method
    from hi_j towards p0_j (and from lo_j on B) proposes the iterates; it converges to the root from
    outside when the monotone branch is reached, and otherwise the box is just not tightened."""
    log_r = (a - 1.0) * r
    for j in range(p0.size):
        if not (p0[j] > 0.0 and rest[j, 1] > 0.0):
            continue
        lp = math.log(p0[j])
        upper_rest, lower_rest = math.log(rest[j, 0]), math.log(rest[j, 1])
        x = hi[j]
        for _ in range(iterations):
            if not (x > p0[j] and x < 1.0):
                break
            lx, l1x = math.log(x), math.log1p(-x)
            t1 = a * lx + (1.0 - a) * lp
            t2 = a * l1x + (1.0 - a) * upper_rest
            value = math.exp(t1) + math.exp(t2)
            slope = a * (math.exp(t1 - lx) - math.exp(t2 - l1x))
            margin = 64.0 * _U * (a + 1.0) * (abs(lx) + abs(lp) + abs(l1x) + abs(upper_rest) + abs(log_r) + 2.0)
            # A convex: A(x) > R and A'(x) > 0 (beyond its rounding) give A > R on all of [x, 1]
            rising = slope > margin * a * (math.exp(t1 - lx) + math.exp(t2 - l1x))
            if value > math.exp(log_r) * (1.0 + margin) + 1e-300 and rising:
                hi[j] = x          # certified outside the ball on [x, 1]: the box ends here
                x = x - (value - math.exp(log_r)) / slope
            else:
                break
        x = lo[j]
        for _ in range(iterations):
            if not (x > 0.0 and x < p0[j]):
                break
            lx, l1x = math.log(x), math.log1p(-x)
            t1 = a * lp + (1.0 - a) * lx
            t2 = a * lower_rest + (1.0 - a) * l1x
            value = math.exp(t1) + math.exp(t2)
            slope = (1.0 - a) * (math.exp(t1 - lx) - math.exp(t2 - l1x))
            margin = 64.0 * _U * (a + 1.0) * (abs(lx) + abs(lp) + abs(l1x) + abs(lower_rest) + abs(log_r) + 2.0)
            # B convex: B(x) > R and B'(x) < 0 (beyond its rounding) give B > R on all of (0, x]
            falling = slope < -margin * (a - 1.0) * (math.exp(t1 - lx) + math.exp(t2 - l1x))
            if value > math.exp(log_r) * (1.0 + margin) + 1e-300 and falling:
                lo[j] = x          # certified outside the ball on (0, x]
                x = x - (value - math.exp(log_r)) / slope
            else:
                break


def token_box(public: np.ndarray, alpha: float, radius: float, all_orders_beta: float | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi), each (..., V): every q of the ball has lo_j <= q_j <= hi_j. From one constraint at
    order a and radius r: sum_j q_j^a p0_j^(1-a) <= R = exp((a-1) r) bounds each term, so
    q_j <= (R p0_j^(a-1))^(1/a); sum_j p0_j^a q_j^(1-a) <= R gives q_j >= (p0_j^a / R)^(1/(a-1));
    with several constraints the tightest of each. Computed in logs and rounded outwards (the
    box may only grow); q_j = 0 where p0_j = 0 (D_a(q || p0) is infinite otherwise), q_j <= 1.

    Args:
        public: the public law p0, shape (..., V).
        alpha: the projection order (> 1).
        radius: the radius in nats at order alpha.
        all_orders_beta: beta of the all-orders ball, or None.

    Returns:
        (lo, hi): float64 arrays of public's shape, 0 <= lo_j <= hi_j <= 1.
    """
    orders, radii = ball_constraints(alpha, radius, all_orders_beta)
    with np.errstate(divide="ignore"):
        log_p0 = np.log(public)
    on_public = public > 0
    finite_log = np.where(on_public, log_p0, 0.0)
    a = orders.reshape((1,) * public.ndim + (-1,))
    r = radii.reshape((1,) * public.ndim + (-1,))
    lp = finite_log[..., None]
    log_hi = ((a - 1.0) / a * lp + (a - 1.0) / a * r).min(axis=-1)
    log_lo = (a / (a - 1.0) * lp - r).max(axis=-1)
    slack = _ALLOW * (4.0 * np.abs(finite_log) + 4.0 * float(np.max(radii * orders)) + 4.0)
    hi = np.minimum(1.0, np.exp(log_hi + slack) * (1.0 + 8.0 * _U))
    lo = np.exp(log_lo - slack) * (1.0 - 8.0 * _U)
    hi = np.where(on_public, np.maximum(hi, public), 0.0)
    lo = np.where(on_public, np.minimum(lo, public), 0.0)
    # the ball at order alpha through the two-cell partition {j, not j} (_merged_box)
    vocab = public.shape[-1]
    total = public.sum(axis=-1, keepdims=True)
    rest_hi = (total - public) * (1.0 + (vocab + 4.0) * _U) + (vocab + 4.0) * _U * total
    rest_lo = np.maximum((total - public) * (1.0 - (vocab + 4.0) * _U) - (vocab + 4.0) * _U * total, 0.0)
    flat_lo, flat_hi = np.ascontiguousarray(lo.reshape(-1)), np.ascontiguousarray(hi.reshape(-1))
    _merged_box(np.ascontiguousarray(public.reshape(-1)), np.ascontiguousarray(
        np.stack([rest_hi.reshape(-1), rest_lo.reshape(-1)], axis=-1)), flat_lo, flat_hi, float(alpha), float(radius), 12)
    lo, hi = flat_lo.reshape(public.shape), flat_hi.reshape(public.shape)
    # sum_j q_j = 1 with every other q_i in its box: q_j <= 1 - sum_(i != j) lo_i, q_j >= 1 - sum_(i != j) hi_i
    # (the sums are rounded the safe way: (V + 1) u of their size, Higham 2002, eq. 4.4)
    for _ in range(2):
        vocab = public.shape[-1]
        lo_total = lo.sum(axis=-1, keepdims=True)
        hi_total = hi.sum(axis=-1, keepdims=True)
        others_lo = (lo_total - lo) * (1.0 - (vocab + 4.0) * _U)
        others_hi = (hi_total - hi) * (1.0 + (vocab + 4.0) * _U) + (vocab + 4.0) * _U * hi_total
        hi = np.where(on_public, np.minimum(hi, (1.0 - others_lo) * (1.0 + 4.0 * _U) + 4.0 * _U), 0.0)
        lo = np.where(on_public, np.maximum(lo, (1.0 - others_hi) * (1.0 - 4.0 * _U) - 4.0 * _U), 0.0)
        lo = np.maximum(lo, 0.0)
    return lo, hi


def dual_orders(orders: np.ndarray, ratio: float = DUAL_SUBGRID_RATIO, limit: int = MAX_DUAL_ORDERS) -> np.ndarray:
    """Indices into the sorted `orders` where the dual is computed: every order when there are at most
    `limit`, else the first, the last, and in between the largest order whose k - 1 is at most `ratio`
    times that of the previous one chosen (always at least the next order). Depends on the grid only.

    Args:
        orders: the sorted Renyi orders k > 1, shape (K,).
        ratio: the growth factor of k - 1 between chosen orders (> 1).
        limit: the grid size up to which every order is chosen.

    Returns:
        int array of increasing indices into `orders`, the first 0 and the last K - 1.
    """
    size = orders.size
    if size <= limit:
        return np.arange(size)
    chosen = [0]
    while chosen[-1] < size - 1:
        last = chosen[-1]
        reach = np.searchsorted(orders, 1.0 + (orders[last] - 1.0) * ratio, side="right") - 1
        chosen.append(int(min(max(reach, last + 1), size - 1)))
    return np.asarray(chosen)


def dualised_constraint(order: float, alpha: float, radius: float, all_orders_beta: float | None) -> tuple[float, float]:
    """(g, r_g): the ball constraint the dual at `order` puts a multiplier on (both directions). The
    order-alpha ball has one; the all-orders ball holds D<->_g <= beta g at every g, and the dual
    takes g = the order itself (the others enter through the box only).

    Args:
        order: the Renyi order k > 1 the dual bounds.
        alpha: the projection order (> 1).
        radius: the radius in nats at order alpha.
        all_orders_beta: beta of the all-orders ball, or None.

    Returns:
        (g, r_g): the constraint's order and its radius in nats.
    """
    if all_orders_beta is None:
        return float(alpha), float(radius)
    g = min(float(order), float(alpha))
    return g, float(all_orders_beta) * g


# ----------------------------------------------------------------------------- public entry point

class DualSettings(TypedDict):
    """The dual's effort (SETTINGS has the meaning of each entry)."""

    points: int
    newton: int
    iterations: int
    tolerance: float
    max_points: int
    small_vocabulary: int
    small_points: int
    small_search: int


class DualDetails(TypedDict):
    """What dual_add_one_bounds(..., details=True) reports beside its bounds (batch shape flattened to
    rows in `maximisers`)."""

    orders: FloatArray
    """The dual orders (sorted), (S,)."""
    constraints: list[tuple[float, float]]
    """Per dual order, the dualised ball constraint (g, r_g) (dualised_constraint)."""
    multipliers: FloatArray
    """(nu, mu1, mu2) per step, dual order and direction: (..., S, 2, 3); NaN where none certifies."""
    maximisers: list[FloatArray | None]
    """Per row of the flattened batch, the inner maximisers (S, 2, V), or None for a public law with no support."""
    g: FloatArray
    """The certified G per step, dual order and direction: (..., S, 2)."""
    approximate_g: FloatArray
    """The optimiser's approximate G, same shape."""


SETTINGS: DualSettings = {"points": 16, "newton": 3, "iterations": 12, "tolerance": 1e-4, "max_points": 24,
                          "small_vocabulary": 64, "small_points": 48, "small_search": 800}
"""Effort of the dual: grid points per token, Newton steps per inner problem, Newton steps on the
multipliers, the certified tolerance (relative to G) and the branch-and-bound cap per token; at most
`small_vocabulary` tokens, a denser grid and a compass search of `small_search` evaluations.
Above it the multipliers come from a few damped Newton steps only (from the best of the warm
start and the chi-square start at four scales), and with a wide ball (e.g. beta = 0.2 at
alpha = 18) they can be poor at some orders: the certified value is then valid but loose, the
lower convex hull across orders (_interpolated) replaces it by a chord of its neighbours where
that is smaller, and add_one_divergence_bounds keeps the closed form where that is.
Tiny changes of the input (its last bit) can move the chosen multipliers, and with them the
bound by up to a few percent (measured: 8% at V = 320): the value is a deterministic function of
the exact input bits, which is what the replay and the audit rely on."""


def dual_add_one_bounds(output: Laws, public: Laws, teachers: int, orders: Laws, alpha: float, radius: float,
                        all_orders_beta: float | None = None, details: bool = False
                        ) -> tuple[FloatArray, FloatArray] | tuple[FloatArray, FloatArray, DualDetails]:
    """Certified upper bounds, per order k, on max over the ball of D_k(p_+ || p) (forward) and of
    D_k(p || p_+) (reverse), p_+ = (N p + q) / (N + 1), from the Lagrangian dual (module docstring):
    output p (..., V), public p0 (..., V), teachers N, orders (K,), the ball (alpha, radius, and
    all_orders_beta for the all-orders ball). Returns (forward, reverse) numpy arrays (..., K); +inf
    where the dual gives no bound (above its last order, or a forward direction where p_j = 0 < p0_j:
    there the divergence itself is infinite). With details=True also a dict with the dual orders,
    the multipliers and the inner maximisers (the adversary starts from them).

    Args:
        output: the ensemble's output law p, shape (..., V) (a tensor or an array).
        public: the public model's law p0, shape (..., V).
        teachers: the ensemble size N, an integer >= 1.
        orders: the Renyi orders k > 1, finite, shape (K,).
        alpha: the projection order of PMixED's ball (> 1, finite).
        radius: the ball's radius in nats at order alpha (>= 0, finite).
        all_orders_beta: beta of the all-orders ball, or None for the ball at order alpha only.
        details: also return the DualDetails.

    Returns:
        (forward, reverse) float64 arrays (..., K) of upper bounds in nats, and with details=True
        (forward, reverse, DualDetails).

    Raises:
        ValueError: if output and public differ in shape, hold NaN, inf or a negative entry, an order
            is not finite and > 1, alpha or radius is out of range, or teachers is not an integer >= 1.
    """
    forward, reverse, found = _dual_add_one(output, public, teachers, orders, alpha, radius, all_orders_beta)
    return (forward, reverse, found) if details else (forward, reverse)


def _dual_add_one(output: Laws, public: Laws, teachers: int, orders: Laws, alpha: float, radius: float,
                  all_orders_beta: float | None) -> tuple[FloatArray, FloatArray, DualDetails]:
    """dual_add_one_bounds with its details (typed for the callers in this module)."""
    p_all = np.asarray(output.detach().cpu().double().numpy() if hasattr(output, "detach") else output, dtype=np.float64)
    p0_all = np.asarray(public.detach().cpu().double().numpy() if hasattr(public, "detach") else public,
                        dtype=np.float64)
    orders_np = np.asarray(orders.detach().cpu().double().numpy() if hasattr(orders, "detach") else orders,
                           dtype=np.float64).reshape(-1)
    if p_all.shape != p0_all.shape or p_all.ndim < 1:
        raise ValueError(f"output and public must have the same shape (..., V), got {p_all.shape} and {p0_all.shape}")
    if not (np.all(np.isfinite(p_all)) and np.all(np.isfinite(p0_all))):
        raise ValueError("add-one dual: an input distribution holds NaN or inf")
    if np.any(p_all < 0) or np.any(p0_all < 0):
        raise ValueError("add-one dual: an input distribution has a negative entry")
    if orders_np.size == 0 or not np.all(orders_np > 1) or not np.all(np.isfinite(orders_np)):
        raise ValueError(f"add-one dual: orders must be finite and > 1, got {orders_np.tolist()[:8]}")
    if not (alpha > 1 and math.isfinite(alpha)) or not (radius >= 0 and math.isfinite(radius)):
        raise ValueError(f"add-one dual: need alpha > 1 and a finite radius >= 0, got alpha={alpha!r}, radius={radius!r}")
    n = float(teachers)
    if not (n >= 1 and n.is_integer()):
        raise ValueError(f"add-one dual: teachers must be an integer >= 1, got {teachers!r}")
    batch = p_all.shape[:-1]
    vocab = p_all.shape[-1]
    p_rows = p_all.reshape(-1, vocab)
    p0_rows = p0_all.reshape(-1, vocab)
    order_sort = np.argsort(orders_np, kind="stable")
    sorted_orders = orders_np[order_sort]
    chosen = dual_orders(sorted_orders)
    sub = np.ascontiguousarray(sorted_orders[chosen])
    constraints = [dualised_constraint(k, alpha, radius, all_orders_beta) for k in sub]
    gs = np.asarray([c[0] for c in constraints])
    # R - 1 = expm1((g - 1) r) rounded up: the exponent rounded up first (its product errs by one
    # rounding, which expm1 would turn into a relative error of (g - 1) r u), then expm1's own ulp
    exponents = np.asarray([(g - 1.0) * r for g, r in constraints]) * (1.0 + 4.0 * _U)
    with np.errstate(over="ignore"):
        budgets = np.expm1(exponents)
    budgets = budgets * (1.0 + 16.0 * _U) + 4.0 * _U * np.abs(budgets)
    lo_all, hi_all = token_box(p0_rows, alpha, radius, all_orders_beta)
    rows = p_rows.shape[0]
    g_sub = np.full((rows, sub.size, 2), np.inf)
    lam_sub = np.full((rows, sub.size, 2, 3), np.nan)
    approx_sub = np.full((rows, sub.size, 2), np.nan)
    x_sub: list[FloatArray | None] = [None] * rows
    at_one = np.zeros(rows)
    _set_threads()
    for row in range(rows):
        p, p0 = p_rows[row], p0_rows[row]
        support = p0 > 0
        if not support.any():
            continue
        total_p, total_p0 = math.fsum(p), math.fsum(p0)
        # fsum is correctly rounded: the sums' own errors are at most one rounding each
        p_dev, p_err = total_p - 1.0, 2.0 * _U * (total_p + 1.0)
        p0_dev, p0_err = 1.0 - total_p0, 2.0 * _U * (total_p0 + 1.0)
        at_one[row] = max(p_dev + p_err, 0.0)   # log of the total mass at k = 1 (both directions)
        outside = math.fsum(p[~support])
        outside_err = 2.0 * _U * outside
        forward_finite = not bool(np.any((p == 0) & support))
        settings = SETTINGS.copy()
        small = int(support.sum()) <= settings["small_vocabulary"]
        out_g = np.full((sub.size, 2), np.inf)
        out_lam = np.full((sub.size, 2, 3), np.nan)
        out_x = np.full((sub.size, 2, int(support.sum())), np.nan)
        out_approx = np.full((sub.size, 2), np.nan)
        _row_duals(np.ascontiguousarray(p[support]), np.ascontiguousarray(p0[support]),
                   np.ascontiguousarray(lo_all[row][support]), np.ascontiguousarray(hi_all[row][support]), n, sub,
                   gs, budgets, p_dev, p_err, p0_dev, p0_err, outside, outside_err, forward_finite,
                   settings["small_points"] if small else settings["points"], settings["newton"],
                   settings["iterations"], settings["small_search"] if small else 0, settings["tolerance"],
                   settings["max_points"], out_g, out_lam, out_x, out_approx)
        g_sub[row] = out_g
        lam_sub[row] = out_lam
        approx_sub[row] = out_approx
        full = np.zeros((sub.size, 2, vocab))
        full[:, :, support] = out_x
        x_sub[row] = full
    forward, reverse = (_interpolated(g_sub[..., d], sub, sorted_orders, at_one) for d in range(2))
    unsort = np.empty_like(order_sort)
    unsort[order_sort] = np.arange(order_sort.size)
    forward = forward[:, unsort].reshape(*batch, orders_np.size)
    reverse = reverse[:, unsort].reshape(*batch, orders_np.size)
    return forward, reverse, {"orders": sub, "constraints": constraints, "multipliers": lam_sub.reshape(*batch, *lam_sub.shape[1:]),
                              "maximisers": x_sub, "g": g_sub.reshape(*batch, *g_sub.shape[1:]),
                              "approximate_g": approx_sub.reshape(*batch, *approx_sub.shape[1:])}


def _interpolated(g_values: np.ndarray, sub: np.ndarray, orders: np.ndarray, at_one: np.ndarray) -> np.ndarray:
    """D bounds at every (sorted) order from certified G at the dual orders `sub`: U = log1p(G) bounds
    F(k) = max over the ball of (k - 1) D_k there, and F is convex in k (for each q a log-sum-exp of
    functions affine in k, van Erven & Harremoes 2014; a supremum of convex functions is convex), so
    between any two certified points a < k < b, F(k) <= the chord of (a, U_a) and (b, U_b). The
    smallest such chord at every k is the lower convex hull of the certified points and of
    (1, at_one), at_one (rows,) bounding F(1) (the log of the laws' total mass: 0 for exact laws,
    max(P - 1, 0) covers a sum P off 1 by rounding). Each order's value is one chord between two
    certified points (or a certified point itself), so a hull misjudged in floating point only
    costs tightness; the chord's own float error is charged per term, then D_k = F / (k - 1) is
    rounded up. Above the last finite certified order: +inf. Never below 0."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        base = np.log1p(np.maximum(g_values, -1.0 + 2.0 ** -52))
        u = base + 8.0 * _U * np.abs(base)
    u = np.where(np.isnan(u), np.inf, np.maximum(u, 0.0))
    rows = g_values.shape[0]
    at_one = np.maximum(np.asarray(at_one, dtype=np.float64).reshape(rows), 0.0)
    result = np.full((rows, orders.size), np.inf)
    for row in range(rows):
        xs = [1.0] + [float(k) for k, value in zip(sub, u[row]) if np.isfinite(value)]
        ys = [float(at_one[row])] + [float(value) for value in u[row] if np.isfinite(value)]
        hull = [0]       # indices of the lower convex hull's vertices (Andrew's monotone chain)
        for i in range(1, len(xs)):
            while len(hull) >= 2:
                o, a = hull[-2], hull[-1]
                if (xs[a] - xs[o]) * (ys[i] - ys[o]) - (ys[a] - ys[o]) * (xs[i] - xs[o]) <= 0.0:
                    hull.pop()
                else:
                    break
            hull.append(i)
        vertices_x = np.asarray([xs[i] for i in hull])
        vertices_y = np.asarray([ys[i] for i in hull])
        for index, k in enumerate(orders):
            if k > vertices_x[-1]:
                break
            right = int(np.searchsorted(vertices_x, k, side="left"))
            if vertices_x[right] == k:
                value = vertices_y[right] / (k - 1.0)
            else:
                s_left, u_left = vertices_x[right - 1], vertices_y[right - 1]
                t_right, u_right = vertices_x[right], vertices_y[right]
                weight = (k - s_left) / (t_right - s_left)
                # weight and 1 - weight err by a few u each: 8 u of each end's value covers the chord
                chord = (1.0 - weight) * u_left + weight * u_right + 8.0 * _U * (u_left + u_right)
                value = chord / (k - 1.0)
            result[row, index] = max(value * (1.0 + 16.0 * _U), 0.0)
    return result


# ----------------------------------------------------------------------------- the primal adversary

ADVERSARY_TOKENS = 8
"""Point masses tried per direction by the adversary when the vocabulary is larger than this: on the
tokens of largest hi_j / p_j (forward) and of smallest p_j / p0_j (reverse); every token below it."""
ADVERSARY_TILTS = (0.5, 2.0, 4.0)
"""Tilts x^t p0^(1-t) (renormalised) of each dual maximiser, also tried by the adversary."""


def _as_rows(value: Laws) -> FloatArray:
    array = value.detach().cpu().double().numpy() if hasattr(value, "detach") else value
    return np.asarray(array, dtype=np.float64)


def _plain_divergences(log_p: np.ndarray, log_plus: np.ndarray, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(D_k(p_+ || p), D_k(p || p_+)) in plain float64 (no rounding allowance: the adversary's value is
    an estimate of a LOWER bound, checked at 40 digits by the tests): log_p (V,), log_plus (C, V),
    orders (K,) -> (C, K) each. van Erven & Harremoes 2014, Definition 2; 0 log 0 terms are 0."""
    p_on = np.isfinite(log_p)
    forward = np.empty((log_plus.shape[0], orders.size))
    reverse = np.empty_like(forward)
    for index, k in enumerate(orders):
        with np.errstate(invalid="ignore", over="ignore"):
            # forward: p_+^k p^(1-k); p_j = 0 < p_+j gives +inf (D infinite)
            terms = np.where(p_on, k * log_plus + (1.0 - k) * log_p, np.where(np.isfinite(log_plus), np.inf, -np.inf))
            top = terms.max(axis=-1, keepdims=True)
            safe = np.where(np.isfinite(top), top, 0.0)
            forward[:, index] = (np.log(np.exp(terms - safe).sum(axis=-1)) + safe[:, 0]) / (k - 1.0)
            forward[:, index] = np.where(np.isposinf(top[:, 0]), np.inf, forward[:, index])
            terms = np.where(p_on, k * log_p + (1.0 - k) * log_plus, -np.inf)
            top = terms.max(axis=-1, keepdims=True)
            safe = np.where(np.isfinite(top), top, 0.0)
            reverse[:, index] = (np.log(np.exp(terms - safe).sum(axis=-1)) + safe[:, 0]) / (k - 1.0)
    return forward, reverse


BallConstraints = tuple[tuple[float, ...], tuple[float, ...], "float | None"]
"""(orders, radii, D<->_inf radius or None): the finite constraints a PMixED ball enforces (PMixED.ball_constraints)."""


def _project(candidates: np.ndarray, p0: np.ndarray, alpha: float, radius: float,
             all_orders_beta: float | None, constraints: BallConstraints | None = None) -> np.ndarray:
    """PMixED's own projection of each candidate teacher x (C, V): q = lambda x + (1 - lambda) p0 with
    lambda the largest keeping q in the ball as the decode loop enforces it (Flemings et al. 2024,
    Algorithm 2; the all-orders ball through dpledger.mechanisms.pmixed.all_orders_ball_constraints;
    `constraints`, when given, are the ball's own (PMixED.ball_constraints), e.g. the proof-orders
    ball's two orders, which the one-order ball (alpha, radius) only contains)."""
    x = torch.from_numpy(np.ascontiguousarray(candidates))
    public = torch.from_numpy(np.ascontiguousarray(p0))
    if constraints is not None:
        lambdas = ball_mixing_weights(x, public, *constraints).numpy()
    elif all_orders_beta is None:
        lambdas = ball_mixing_weights(x, public, (float(alpha),), (float(radius),)).numpy()
    else:
        lambdas = ball_mixing_weights(x, public, *all_orders_ball_constraints(float(all_orders_beta))).numpy()
    projected: FloatArray = lambdas[:, None] * candidates + (1.0 - lambdas[:, None]) * p0[None, :]
    return projected


def _candidates(p: np.ndarray, p0: np.ndarray, hi: np.ndarray, maximisers: np.ndarray, direction: int) -> np.ndarray:
    """Candidate added teachers for one direction: the dual's inner maximisers at every dual order
    (renormalised), their tilts, and point masses (module constants)."""
    support = p0 > 0
    rows = []
    for x in maximisers[:, direction]:
        x = np.where(support & np.isfinite(x), np.maximum(x, 0.0), 0.0)
        if x.sum() > 0:
            x = x / x.sum()
            rows.append(x)
            ratio = np.where(support & (x > 0), np.log(np.where(x > 0, x, 1.0)) - np.log(np.where(support, p0, 1.0)),
                             -np.inf)
            for t in ADVERSARY_TILTS:
                with np.errstate(invalid="ignore", over="ignore"):
                    logits = np.where(support, np.log(np.where(support, p0, 1.0)) + t * ratio, -np.inf)
                top = logits.max()
                if np.isfinite(top):
                    tilted = np.exp(logits - top)
                    rows.append(tilted / tilted.sum())
    vocab = p.size
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.where(support, hi / p, -np.inf) if direction == 0 else np.where(support, -p / p0, -np.inf)
    tokens = np.flatnonzero(support) if support.sum() <= ADVERSARY_TOKENS else \
        np.argsort(-score, kind="stable")[:ADVERSARY_TOKENS]
    for j in tokens:
        point = np.zeros(vocab)
        point[j] = 1.0
        rows.append(point)
    rows.append(p0 / p0.sum())
    return np.stack(rows)


def add_one_adversary(output: Laws, public: Laws, teachers: int, orders: Laws, alpha: float, radius: float,
                      all_orders_beta: float | None = None, details: DualDetails | None = None,
                      constraints: BallConstraints | None = None) -> dict[str, FloatArray]:
    """A primal adversary for the add-one neighbour: per step and order, an explicit added teacher's
    projected law q (so q is in PMixED's ball by construction: the decode loop's own projection,
    dpledger.mechanisms.kernels.ball_mixing_weights, 1e-12 inside) and its divergences. Its value is a LOWER
    estimate of the worst case max over q of D_k (the bound's target): any q of the ball attains at
    most the maximum. Candidates: the dual's inner maximisers (dual_add_one_bounds, details) and
    their tilts, and point masses; the best per order and direction is kept (no further ascent).

    output, public (..., V); returns {"forward", "reverse": (..., K) plain-float64 divergences of the
    best candidate, "q_forward", "q_reverse": (..., K, V) those candidates}. `details` reuses a
    dual_add_one_bounds(..., details=True) result for the same inputs.

    Args:
        output: the ensemble's output law p, shape (..., V).
        public: the public model's law p0, shape (..., V).
        teachers: the ensemble size N >= 1.
        orders: the Renyi orders k > 1, shape (K,).
        alpha: the projection order of PMixED's ball (> 1).
        radius: the ball's radius in nats at order alpha (>= 0).
        all_orders_beta: beta of the all-orders ball, or None.
        details: a DualDetails for the same inputs, or None to compute it.
        constraints: (orders, radii, D<->_inf radius or None) of the ball the mechanism enforces
            (PMixED.ball_constraints) where it is smaller than the one-order ball (alpha, radius) the
            bounds use (the proof-orders ball): the candidates are projected onto it, so every q is a
            teacher the mechanism can produce. None: the ball (alpha, radius, all_orders_beta) itself.

    Returns:
        The dict described above: divergences in nats (..., K) and the laws q (..., K, V).

    Raises:
        ValueError: as dual_add_one_bounds, when `details` is computed here.
    """
    p_all, p0_all = _as_rows(output), _as_rows(public)
    orders_np = _as_rows(orders).reshape(-1)
    if details is None:
        _, _, details = _dual_add_one(p_all, p0_all, teachers, orders_np, alpha, radius, all_orders_beta)
    n = float(teachers)
    batch, vocab = p_all.shape[:-1], p_all.shape[-1]
    p_rows, p0_rows = p_all.reshape(-1, vocab), p0_all.reshape(-1, vocab)
    _, hi_rows = token_box(p0_rows, alpha, radius, all_orders_beta)
    size = orders_np.size
    best = np.full((p_rows.shape[0], 2, size), -np.inf)
    best_q = np.zeros((p_rows.shape[0], 2, size, vocab))
    for row in range(p_rows.shape[0]):
        p, p0 = p_rows[row], p0_rows[row]
        maximisers = details["maximisers"][row]
        if maximisers is None:     # a public law with no support: nothing to add
            continue
        with np.errstate(divide="ignore"):
            log_p = np.log(p)
        for direction in range(2):
            q = _project(_candidates(p, p0, hi_rows[row], maximisers, direction), p0, alpha, radius, all_orders_beta,
                         constraints)
            with np.errstate(divide="ignore"):
                log_plus = np.log((n * p[None, :] + q) / (n + 1.0))
            values = _plain_divergences(log_p, log_plus, orders_np)[direction]
            values = np.where(np.isnan(values), -np.inf, values)
            at = np.argmax(values, axis=0)
            best[row, direction] = values[at, np.arange(size)]
            best_q[row, direction] = q[at]
    return {"forward": best[:, 0].reshape(*batch, size), "reverse": best[:, 1].reshape(*batch, size),
            "q_forward": best_q[:, 0].reshape(*batch, size, vocab),
            "q_reverse": best_q[:, 1].reshape(*batch, size, vocab)}


def add_one_gap(output: Laws, public: Laws, teachers: int, orders: Laws, alpha: float, radius: float,
                all_orders_beta: float | None = None) -> dict[str, FloatArray]:
    """Per step and order, the certified bounds beside the adversary's value: how much of the bound
    is proven slack. {"closed_forward", "closed_reverse": the closed-form bounds
    (add_one_direction_bounds); "dual_forward", "dual_reverse": the dual's;
    "charged": max over directions of the smaller of the two (what add_one_divergence_bounds(dual=True)
    returns); "adversary_forward", "adversary_reverse", "adversary": max of the two (add_one_adversary);
    "ratio": charged / adversary (>= 1 up to the adversary's float rounding: the worst case lies
    between them)}, each (..., K).

    Args:
        output: the ensemble's output law p, shape (..., V).
        public: the public model's law p0, shape (..., V).
        teachers: the ensemble size N >= 1.
        orders: the Renyi orders k > 1, shape (K,).
        alpha: the projection order of PMixED's ball (> 1).
        radius: the ball's radius in nats at order alpha (>= 0).
        all_orders_beta: beta of the all-orders ball, or None.

    Returns:
        The dict described above, each value a float64 array (..., K) (divergences in nats; ratio unitless).

    Raises:
        ValueError: as dual_add_one_bounds and add_one_direction_bounds.
    """
    p_all, p0_all = _as_rows(output), _as_rows(public)
    orders_np = _as_rows(orders).reshape(-1)
    forward, reverse, details = _dual_add_one(p_all, p0_all, teachers, orders_np, alpha, radius, all_orders_beta)
    closed_forward, closed_reverse = add_one_direction_bounds(torch.from_numpy(p_all), torch.from_numpy(p0_all),
                                                              teachers, torch.from_numpy(orders_np), alpha, radius,
                                                              all_orders_beta)
    adversary = add_one_adversary(p_all, p0_all, teachers, orders_np, alpha, radius, all_orders_beta, details)
    charged = np.maximum(np.minimum(closed_forward, forward), np.minimum(closed_reverse, reverse))
    worst = np.maximum(adversary["forward"], adversary["reverse"])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = charged / worst
    return {"closed_forward": closed_forward, "closed_reverse": closed_reverse, "dual_forward": forward,
            "dual_reverse": reverse, "charged": charged, "adversary_forward": adversary["forward"],
            "adversary_reverse": adversary["reverse"], "adversary": worst, "ratio": ratio}
