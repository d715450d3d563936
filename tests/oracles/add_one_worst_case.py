"""Brute-force worst case of PMixED's add-one neighbour, by direct optimisation over the ball.

What it computes. PMixED (Flemings et al. 2024, Algorithm 2) outputs p = mean_i pbar_i, each mixed
teacher pbar_i projected onto the Renyi ball around the public law p0. An adversary who ADDS one
teacher x gets it projected too, q = lambda x + (1 - lambda) p0, and q can be any law of the ball
    B = {q : D_a(q || p0) <= r_a and D_a(p0 || q) <= r_a for every constrained order a,
             and, optionally, D_inf(q || p0) <= r_inf and D_inf(p0 || q) <= r_inf}
(take x = q). The neighbour's output is p_+ = (N p + q) / (N + 1). For each Renyi order k this module
returns the largest value it can find of
    forward  D_k(p_+ || p)   and   reverse  D_k(p || p_+)   over q in B,
with D_k(P || Q) = log(sum_j P_j^k Q_j^(1-k)) / (k - 1) and D_inf(P || Q) = log max_j P_j / Q_j.
The order-alpha ball (radius r) is always a constraint; extra orders / radii and r_inf express the
all-orders ball (the caller passes the constraints the projection enforces).

How. Every value returned is attained by an explicit q that is VERIFIED to lie in B: q is
renormalised at DPS_VERIFY decimal digits with mpmath, every constraint is evaluated there and q is
rejected unless each is <= its radius (no tolerance on the outside), and the objective is then
evaluated at those digits. So the result is a certified LOWER estimate of the true maximum (up to
~1e-40 relative); the search only decides which q to certify. The search is plain float64 numpy /
scipy and shares no code with the package:
  * q lives on the support of p0 (outside it D_a(q || p0) = inf); it is parametrised by the centred
    log-ratio z = log(q / p0) - mean, q = softmax(log p0 + z). Along every "tilt" ray z = t u every
    constrained divergence (both directions, any order, and D_inf) is non-decreasing in t >= 0 (with
    L(s) = log sum_j p0_j e^(s u_j) convex, D_a(q_t || p0) = (L(a t) - a L(t)) / (a - 1) has
    derivative a (L'(a t) - L'(t)) / (a - 1) >= 0, and the reverse / D_inf cases alike), so each
    ray leaves B exactly once; that boundary point is found by root finding on t (batched Illinois
    regula falsi, ~1e-15 relative, feasible end kept). Linear rays q = lam x + (1 - lam) p0 likewise
    leave the convex B once (the constraints are convex in lam and 0 at lam = 0; same root finder).
  * Both objectives are convex in q (exp((k-1) D_k) is jointly convex in (P, Q) for k > 1 and p_+
    is affine in q), so the maximum over the convex set B sits on its boundary; interior points are
    still searched (grids, optimiser iterates) as a cross-check.
  * V = 2: B is an interval of q_1; its two ends are found exactly by scipy brentq on each side of
    p0_1 (and again along the two tilt rays), plus a dense 1-D grid (linear and logit) over the interval.
  * V = 3: a dense sweep of tilt directions around the circle, a dense barycentric grid on the
    simplex and a grid in z-space (both restricted to B), then local refinement of the best
    directions by successive zooming of the angle (1-D, so exhaustive).
  * V >= 4 (used up to 6): vertex, edge, log(p / p0), random and Dirichlet tilt directions and linear
    rays (point masses and random laws pushed into the ball), a batched random hill-climb on the
    sphere of directions, then multi-start scipy SLSQP (maximise the objective in z subject to every
    constraint) from the best boundary points, from random interior (feasible) points and from
    point masses pushed into the ball; an SLSQP result outside B is pulled back along its tilt ray.
Zero-probability conventions are van Erven & Harremoes 2014, Definition 2 (a term with P_j = 0 is 0;
D = inf when P_j > 0 = Q_j).
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import mpmath
import numpy as np
from scipy import optimize

DPS_VERIFY = 40
"""Decimal digits at which every returned q is checked against the ball and its value computed."""



@dataclasses.dataclass(frozen=True)
class WorstCase:
    """Best forward / reverse divergence found at one order, and the verified q attaining each."""

    order: float
    forward: float
    reverse: float
    q_forward: np.ndarray
    q_reverse: np.ndarray

    @property
    def value(self) -> float:
        """max(forward, reverse): the quantity add_one_divergence_bounds bounds."""
        return max(self.forward, self.reverse)


# ----------------------------------------------------------------------------- float64 search kernels

def _log(x):
    with np.errstate(divide="ignore"):
        return np.log(x)


def logsumexp(x, axis=-1, keepdims=False):
    """log sum exp along `axis` (+inf if any term is +inf, -inf if all are -inf)."""
    top = np.max(x, axis=axis, keepdims=True)
    shift = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.log(np.sum(np.exp(x - shift), axis=axis, keepdims=True)) + shift
    return out if keepdims else np.squeeze(out, axis=axis)


def _renyi(log_a, log_b, k):
    """D_k(A || B) from logs along the last axis (broadcast); k broadcasts against log_a[..., 0]."""
    k = np.asarray(k, dtype=np.float64)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        terms = np.where(np.isneginf(log_a), -np.inf, k * log_a + (1.0 - k) * log_b)
        return logsumexp(terms, axis=-1) / (k[..., 0] - 1.0)


class _Problem:
    """The ball B around p0, the outputs p and the orders; every method is batched over rows of q."""

    def __init__(self, output, public, teachers, alpha, radius, orders, extra_orders, extra_radii, max_radius):
        p = np.asarray(output, dtype=np.float64)
        p0 = np.asarray(public, dtype=np.float64)
        if p.ndim != 1 or p.shape != p0.shape or p.size < 2:
            raise ValueError("output and public must be 1-D of equal length >= 2")
        if not (np.all(np.isfinite(p)) and np.all(np.isfinite(p0)) and p.min() >= 0 and p0.min() >= 0):
            raise ValueError("output and public must be finite and non-negative")
        if abs(p.sum() - 1) > 1e-6 or abs(p0.sum() - 1) > 1e-6:
            raise ValueError("output and public must sum to 1")
        n = int(teachers)
        if n != teachers or n < 1:
            raise ValueError("teachers must be an integer >= 1")
        if not alpha > 1 or not radius >= 0:
            raise ValueError("need alpha > 1 and radius >= 0")
        if len(extra_orders) != len(extra_radii):
            raise ValueError("extra_orders and extra_radii must have equal lengths")
        self.p, self.p0, self.n, self.vocab = p / p.sum(), p0 / p0.sum(), n, p.size
        self.orders = np.asarray(orders, dtype=np.float64).reshape(-1)
        if self.orders.size == 0 or not np.all(self.orders > 1):
            raise ValueError("orders must be > 1")
        self.c_orders = np.array([float(alpha)] + [float(a) for a in extra_orders])
        self.c_radii = np.array([float(radius)] + [float(r) for r in extra_radii])
        if not np.all(self.c_orders > 1) or not np.all(self.c_radii >= 0):
            raise ValueError("constraint orders must be > 1 and radii >= 0")
        self.max_radius = None if max_radius is None else float(max_radius)
        self.support = np.flatnonzero(self.p0 > 0)
        self.m = self.support.size
        self.log_p0s = np.log(self.p0[self.support])
        self.log_p = _log(self.p)
        self.log_n = math.log(n)
        self.log_n1 = math.log(n + 1)
        radii = list(self.c_radii) + ([self.max_radius] if self.max_radius is not None else [])
        self.degenerate = self.m == 1 or min(radii) == 0.0      # B = {p0}
        if self.m > 1:
            centring = np.eye(self.m) - 1.0 / self.m
            basis, _, _ = np.linalg.svd(centring)
            self.basis = basis[:, : self.m - 1].T                   # (m-1, m) orthonormal, rows sum to 0
        self.evaluations = 0

    # q on the support, from the centred log-ratio z
    def log_q(self, z):
        a = self.log_p0s + z
        return a - logsumexp(a, axis=-1, keepdims=True)

    def z_of(self, q_support):
        z = _log(q_support) - self.log_p0s
        return z - z.mean(axis=-1, keepdims=True)

    def excess(self, log_q):
        """Largest relative constraint excess (D - r) / r over every constraint; <= 0 iff q in B."""
        self.evaluations += log_q.shape[0]
        lq = log_q[..., None, :]
        forward = _renyi(lq, self.log_p0s, self.c_orders)
        reverse = _renyi(self.log_p0s, lq, self.c_orders)
        worst = ((np.maximum(forward, reverse) - self.c_radii) / self.c_radii).max(axis=-1)
        if self.max_radius is not None:
            d_inf = np.maximum((log_q - self.log_p0s).max(axis=-1), (self.log_p0s - log_q).max(axis=-1))
            worst = np.maximum(worst, (d_inf - self.max_radius) / self.max_radius)
        return worst

    def full_log_q(self, log_q):
        full = np.full(log_q.shape[:-1] + (self.vocab,), -np.inf)
        full[..., self.support] = log_q
        return full

    def objectives(self, log_q):
        """(forward, reverse), each (rows, K): D_k(p_+ || p) and D_k(p || p_+) at every order."""
        log_plus = np.logaddexp(self.log_n + self.log_p, self.full_log_q(log_q)) - self.log_n1
        lp = log_plus[..., None, :]
        forward = _renyi(lp, self.log_p, self.orders)
        reverse = _renyi(self.log_p, lp, self.orders)
        return forward, reverse

    # boundary points
    def tilt_boundary(self, directions):
        """z = t* u on the boundary of B for each row u (centred, non-zero): t* by _last_inside."""
        u = directions - directions.mean(axis=-1, keepdims=True)
        u = u / np.linalg.norm(u, axis=-1, keepdims=True)

        def f(t, rows):
            return self.excess(self.log_q(t[:, None] * u[rows]))

        high = np.ones(u.shape[0])
        f_high = f(high, np.arange(u.shape[0]))
        for _ in range(80):
            grow = np.flatnonzero(f_high <= 0)
            if grow.size == 0:
                break
            high[grow] *= 2.0
            f_high[grow] = f(high[grow], grow)
        return _last_inside(f, high, f_high)[:, None] * u

    def linear_boundary(self, laws):
        """log q for q = lam* x + (1 - lam*) p0, lam* in [0, 1] the largest keeping q in B."""
        x = laws[..., self.support]
        x = x / x.sum(axis=-1, keepdims=True)
        p0 = self.p0[self.support]

        def mix(lam, rows):
            return _log(lam[:, None] * x[rows] + (1.0 - lam[:, None]) * p0)

        def f(lam, rows):
            return self.excess(mix(lam, rows))

        everything = np.arange(x.shape[0])
        high = np.ones(x.shape[0])
        f_high = f(high, everything)
        lam = np.where(f_high <= 0, 1.0, _last_inside(f, high, np.maximum(f_high, 0.0)))
        return mix(lam, everything)

    def pull_back(self, z):
        """The feasible end of the tilt ray through z: z itself if in B, else s* z, s* in [0, 1)."""
        f_one = self.excess(self.log_q(z[None]))
        if f_one[0] <= 0:
            return z

        def f(s, rows):
            return self.excess(self.log_q(s[:, None] * z[None]))

        return _last_inside(f, np.ones(1), f_one)[0] * z


def _last_inside(f, high, f_high, max_iterations=200):
    """Per row, the largest t in [0, high] with f(t, row) <= 0, for f non-decreasing in t with
    f(0) = -1 (every constraint relative excess at q = p0) and f(high) > 0. Batched Illinois
    regula falsi (bisection where the secant is unusable); only unfinished rows are evaluated.
    Returns the feasible end of each bracket (within ~1e-15 relative of the boundary)."""
    high = np.array(high, dtype=np.float64)
    w_high = np.array(f_high, dtype=np.float64)
    low = np.zeros_like(high)
    f_low = -np.ones_like(high)
    w_low = f_low.copy()
    side = np.zeros_like(high)
    active = np.arange(high.size)
    for _ in range(max_iterations):
        done = (high[active] - low[active] <= 4e-16 * high[active]) | (f_low[active] > -1e-15)
        active = active[~done]
        if active.size == 0:
            break
        lo, hi, wl, wh = low[active], high[active], w_low[active], w_high[active]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            secant = lo - wl * (hi - lo) / (wh - wl)
        usable = np.isfinite(secant) & (secant > lo) & (secant < hi)
        trial = np.where(usable, secant, 0.5 * (lo + hi))
        value = f(trial, active)
        inside = value <= 0
        # Illinois: when the same end moves twice running, halve the other end's weight
        w_high[active] = np.where(inside & (side[active] < 0), 0.5 * wh, wh)
        w_low[active] = np.where(~inside & (side[active] > 0), 0.5 * wl, wl)
        low[active] = np.where(inside, trial, lo)
        f_low[active] = np.where(inside, value, f_low[active])
        w_low[active] = np.where(inside, value, w_low[active])
        high[active] = np.where(inside, hi, trial)
        w_high[active] = np.where(inside, w_high[active], value)
        side[active] = np.where(inside, -1.0, 1.0)
    return low


# ----------------------------------------------------------------------------- candidate generation

class _Pool:
    """Feasible candidates (as z) with the best (forward, reverse) value per order seen so far."""

    def __init__(self, problem: _Problem, keep: int):
        self.problem, self.keep = problem, keep
        k = problem.orders.size
        self.z = np.zeros((0, problem.m))
        self.values = np.zeros((0, 2, k))        # (rows, direction, order)

    def add(self, z):
        z = np.atleast_2d(z)
        if z.shape[0] == 0:
            return
        log_q = self.problem.log_q(z)
        feasible = self.problem.excess(log_q) <= 0
        z, log_q = z[feasible], log_q[feasible]
        if z.shape[0] == 0:
            return
        forward, reverse = self.problem.objectives(log_q)
        values = np.stack([forward, reverse], axis=1)
        values = np.where(np.isnan(values), -np.inf, values)
        self.z = np.concatenate([self.z, z])
        self.values = np.concatenate([self.values, values])
        # keep, for every (direction, order), its `keep` best rows
        best = np.argsort(-self.values, axis=0)[: self.keep].reshape(-1)
        rows = np.unique(best)
        self.z, self.values = self.z[rows], self.values[rows]

    def top(self, direction, order_index, count):
        order = np.argsort(-self.values[:, direction, order_index])[:count]
        return self.z[order]


def _seed_directions(problem: _Problem, rng, random_count):
    m = problem.m
    eye = np.eye(m)
    rows = [eye, -eye]
    for i, j in itertools.combinations(range(m), 2):
        rows.append((eye[i] - eye[j])[None])
        rows.append((eye[j] - eye[i])[None])
    p_support = problem.p[problem.support]
    with np.errstate(divide="ignore"):
        towards_p = np.maximum(np.log(np.maximum(p_support, 1e-300)) - problem.log_p0s, -700.0)
    if np.ptp(towards_p) > 0:
        rows.extend([towards_p[None], -towards_p[None]])
    rows.append(rng.standard_normal((random_count, m)))
    for concentration in (0.1, 1.0):
        x = rng.dirichlet(np.full(m, concentration), size=max(random_count // 4, 1))
        rows.append(np.maximum(np.log(np.maximum(x, 1e-300)) - problem.log_p0s, -700.0))
    directions = np.concatenate(rows)
    directions = directions - directions.mean(axis=-1, keepdims=True)
    return directions[np.linalg.norm(directions, axis=-1) > 1e-12]


def _seed_laws(problem: _Problem, rng, random_count):
    v = problem.vocab
    laws = [np.eye(v)[problem.support], problem.p[None]]
    for concentration in (0.05, 0.5, 5.0):
        laws.append(rng.dirichlet(np.full(v, concentration), size=max(random_count // 4, 1)))
    laws = np.concatenate(laws)
    keep = laws[:, problem.support].sum(axis=-1) > 0
    return laws[keep]


def _search_two(problem: _Problem, pool: _Pool, grid: int):
    """V on-support = 2: the interval of q_1, its exact ends by brentq, plus a dense grid."""
    i = 0   # the first support coordinate; q_1 = s, q_2 = 1 - s

    def excess_at(s):
        s = np.atleast_1d(np.asarray(s, dtype=np.float64))
        log_q = np.stack([_log(s), _log1m(s)], axis=-1)
        return problem.excess(log_q)

    p01 = problem.p0[problem.support[i]]
    ends = []
    for lo, hi in ((p01, 1.0), (p01, 0.0)):
        if excess_at(hi)[0] <= 0:
            ends.append(hi)
            continue
        try:        # excess is +inf at s = 0 or 1 (a zero q_j against p0_j > 0): clipped for brentq
            root = optimize.brentq(lambda s: min(float(excess_at(s)[0]), 1e300), lo, hi, xtol=1e-300,
                                   rtol=4 * np.finfo(float).eps, maxiter=500)
        except (ValueError, RuntimeError):
            continue        # the tilt rays below still find this end
        # step to the inside until the float check accepts it
        toward = lo
        for _ in range(64):
            if excess_at(root)[0] <= 0:
                break
            root = np.nextafter(root, toward)
        ends.append(root)
    if not ends:
        ends = [p01]
    s_lo, s_hi = min(ends + [p01]), max(ends + [p01])
    s = np.concatenate([np.linspace(s_lo, s_hi, grid), np.array([s_lo, s_hi, p01])])
    logit_lo, logit_hi = _logit(max(s_lo, 1e-300)), _logit(min(s_hi, 1 - 1e-16))
    s = np.concatenate([s, _expit(np.linspace(logit_lo, logit_hi, grid))])
    s = s[(s > 0) & (s < 1)]
    log_q = np.stack([_log(s), _log1m(s)], axis=-1)
    pool.add(_centred(log_q - problem.log_p0s))
    pool.add(problem.tilt_boundary(np.array([[1.0, -1.0], [-1.0, 1.0]])))


def _log1m(s):
    with np.errstate(divide="ignore"):
        return np.log1p(-s)


def _logit(s):
    return math.log(s) - math.log1p(-s)


def _expit(x):
    return np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


def _centred(x):
    return x - x.mean(axis=-1, keepdims=True)


def _search_three(problem: _Problem, pool: _Pool, rng, sweep: int, grid: int):
    """V on-support = 3: circle sweep of tilt directions, simplex and z grids, angular zoom."""
    b1, b2 = problem.basis

    def on_circle(theta):
        return problem.tilt_boundary(np.cos(theta)[:, None] * b1 + np.sin(theta)[:, None] * b2)

    theta = np.linspace(0.0, 2 * np.pi, sweep, endpoint=False)
    boundary = on_circle(theta)
    pool.add(boundary)
    # barycentric grid on the simplex, restricted to B
    a, b = np.meshgrid(np.arange(grid + 1), np.arange(grid + 1), indexing="ij")
    keep = a + b <= grid
    q = np.stack([a[keep], b[keep], grid - a[keep] - b[keep]], axis=-1) / grid
    q = q[(q > 0).all(axis=-1)]
    pool.add(problem.z_of(q))
    # grid in z coordinates over the box holding the boundary
    reach = np.abs(boundary @ problem.basis.T).max() * 1.01
    c = np.linspace(-reach, reach, grid)
    x, y = np.meshgrid(c, c, indexing="ij")
    pool.add(x.reshape(-1, 1) * b1 + y.reshape(-1, 1) * b2)
    _seed_and_linear(problem, pool, rng, random_count=64)
    # angular zoom around each (direction, order)'s best candidates, all batched
    k = problem.orders.size
    width = 4 * np.pi / sweep
    centres = np.concatenate([np.arctan2(pool.top(d, j, 3) @ b2, pool.top(d, j, 3) @ b1)
                              for d in range(2) for j in range(k)])
    for _ in range(14):
        offsets = np.linspace(-width, width, 33)
        trial = (centres[:, None] + offsets[None]).reshape(-1)
        pool.add(on_circle(trial))
        centres = np.concatenate([np.arctan2(pool.top(d, j, 3) @ b2, pool.top(d, j, 3) @ b1)
                                  for d in range(2) for j in range(k)])
        width /= 12.0


def _seed_and_linear(problem: _Problem, pool: _Pool, rng, random_count: int):
    pool.add(problem.tilt_boundary(_seed_directions(problem, rng, random_count)))
    pool.add(problem.z_of(np.exp(problem.linear_boundary(_seed_laws(problem, rng, random_count)))))


def _hill_climb(problem: _Problem, pool: _Pool, rng, levels: int, tops: int, perturbations: int):
    """Batched random search on the sphere of tilt directions around the best candidates."""
    k = problem.orders.size
    scale = 0.5
    for _ in range(levels):
        parents = np.concatenate([pool.top(d, j, tops) for d in range(2) for j in range(k)])
        norms = np.linalg.norm(parents, axis=-1, keepdims=True)
        parents = parents[norms[:, 0] > 0] / norms[norms[:, 0] > 0]
        if parents.shape[0] == 0:
            return
        noise = rng.standard_normal((parents.shape[0], perturbations, problem.m)) * scale
        trial = (parents[:, None, :] + noise).reshape(-1, problem.m)
        pool.add(problem.tilt_boundary(trial))
        scale *= 0.6


class _OutOfBudget(Exception):
    pass


def _slsqp(problem: _Problem, pool: _Pool, direction: int, order_index: int, start, budget: int = 300):
    """Maximise one objective from z = start subject to every constraint (analytic gradients in the
    coordinates y of z = y @ basis); add the result, pulled back along its tilt ray if outside B."""
    basis, log_p0, k = problem.basis, problem.log_p0s, problem.orders[order_index]
    support = problem.support
    a, r = problem.c_orders[:, None], problem.c_radii[:, None]

    def softmax(v):
        w = log_p0 + v
        return np.exp(w - logsumexp(w, axis=-1, keepdims=True))

    def value_and_gradient(y):
        z = y @ basis
        log_q = problem.log_q(z[None])[0]
        q = np.exp(log_q)
        log_plus = np.logaddexp(problem.log_n + problem.log_p, problem.full_log_q(log_q)) - problem.log_n1
        lp, lpp = problem.log_p[support], log_plus[support]
        if direction == 0:      # D_k(p_+ || p)
            terms = np.where(np.isneginf(log_plus), -np.inf, k * log_plus + (1 - k) * problem.log_p)
            log_total = logsumexp(terms)
            g = k / ((k - 1) * (problem.n + 1)) * np.exp(k * lpp + (1 - k) * lp - lpp - log_total)
        else:                   # D_k(p || p_+)
            terms = np.where(np.isneginf(problem.log_p), -np.inf, k * problem.log_p + (1 - k) * log_plus)
            log_total = logsumexp(terms)
            g = -np.exp(np.where(np.isneginf(lp), -np.inf, k * lp + (1 - k) * lpp) - lpp - log_total) / (problem.n + 1)
        value = log_total / (k - 1)
        grad_z = q * g - q * np.dot(q, g)
        return value, basis @ grad_z

    start_value = value_and_gradient(basis @ start)[0]
    scale = 1.0 / max(abs(start_value), 1e-12) if np.isfinite(start_value) else 1.0

    evaluations = [0]
    last = [basis @ start]

    def spend(y):
        evaluations[0] += 1
        if evaluations[0] > budget:       # ill-conditioned: stop, keep the last iterate
            raise _OutOfBudget
        last[0] = y.copy()

    def objective(y):
        spend(y)
        value, grad = value_and_gradient(y)
        if not np.isfinite(value) or not np.all(np.isfinite(grad)):
            return 1e300, np.zeros_like(y)
        return -scale * value, -scale * grad

    def constraint_parts(y):
        z = y @ basis
        log_lz = logsumexp(log_p0 + z)
        q = softmax(z)
        # D_a(q || p0) = (L(a z) - a L(z)) / (a - 1), D_a(p0 || q) = (L((1-a) z) + (a-1) L(z)) / (a - 1),
        # L(v) = log sum p0 e^v, dL/dv = softmax(log p0 + v)
        az, bz = a * z, (1 - a) * z
        forward = (logsumexp(log_p0 + az, axis=-1) - a[:, 0] * log_lz) / (a[:, 0] - 1)
        reverse = (logsumexp(log_p0 + bz, axis=-1) + (a[:, 0] - 1) * log_lz) / (a[:, 0] - 1)
        d_forward = a * (softmax(az) - q) / (a - 1)
        d_reverse = q - softmax(bz)
        values = [1 - forward / r[:, 0], 1 - reverse / r[:, 0]]
        grads = [-d_forward / r, -d_reverse / r]
        if problem.max_radius is not None:
            top, bottom = np.argmax(z), np.argmin(z)
            values.append(np.array([1 - (z[top] - log_lz + 0.0) / problem.max_radius,
                                    1 - (log_lz - z[bottom]) / problem.max_radius]))
            e_top, e_bottom = np.eye(problem.m)[top], np.eye(problem.m)[bottom]
            grads.append(-np.stack([e_top - q, q - e_bottom]) / problem.max_radius)
        # z - mean(z) = z as basis rows are centred; L(z) here is log sum p0 e^z (no renormalisation)
        return np.concatenate(values), np.concatenate(grads) @ basis.T

    cache = {}

    def cached_constraints(y):
        key = y.tobytes()
        if key not in cache:
            spend(y)
            cache.clear()
            cache[key] = constraint_parts(y)
        return cache[key]

    try:
        result = optimize.minimize(objective, basis @ start, jac=True, method="SLSQP",
                                   constraints=[{"type": "ineq", "fun": lambda y: cached_constraints(y)[0],
                                                 "jac": lambda y: cached_constraints(y)[1]}],
                                   options={"maxiter": 100, "ftol": 1e-13})
        y = result.x
    except _OutOfBudget:
        y = last[0]
    except (ValueError, FloatingPointError, np.linalg.LinAlgError):
        return
    if np.all(np.isfinite(y)):
        pool.add(problem.pull_back(y @ basis)[None])


def _search_general(problem: _Problem, pool: _Pool, rng, effort: float):
    random_count = int(400 * effort)
    _seed_and_linear(problem, pool, rng, random_count)
    _hill_climb(problem, pool, rng, levels=max(int(12 * effort), 4), tops=3, perturbations=max(int(12 * effort), 6))
    # multi-start SLSQP per (direction, order): best boundary points, random interior points and
    # point masses pushed into the ball
    k = problem.orders.size
    interior = problem.tilt_boundary(rng.standard_normal((max(int(3 * effort), 1) * 2 * k, problem.m)))
    interior = interior * rng.uniform(0.3, 1.0, size=(interior.shape[0], 1))
    vertices = problem.z_of(np.exp(problem.linear_boundary(np.eye(problem.vocab)[problem.support])))
    starts_per = max(int(2 * effort), 1)
    for d in range(2):
        for j in range(k):
            starts = [pool.top(d, j, starts_per)]
            pick = rng.choice(interior.shape[0], size=min(max(int(effort), 1), interior.shape[0]), replace=False)
            starts.append(interior[pick])
            best_vertex = np.argmax(problem.objectives(problem.log_q(vertices))[d][:, j])
            starts.append(vertices[best_vertex][None])
            for start in np.concatenate(starts):
                _slsqp(problem, pool, d, j, start)


# ----------------------------------------------------------------------------- mpmath verification

def _mp_renyi(a, b, k):
    total = mpmath.mpf(0)
    for aj, bj in zip(a, b):
        if aj == 0:
            continue
        if bj == 0:
            return mpmath.inf
        total += aj ** k * bj ** (1 - k)
    return mpmath.log(total) / (k - 1)


def _mp_normalised(x):
    values = [mpmath.mpf(float(v)) for v in x]
    total = mpmath.fsum(values)
    return [v / total for v in values]


def _mp_in_ball(q, p0, c_orders, c_radii, max_radius):
    for a, r in zip(c_orders, c_radii):
        a, r = mpmath.mpf(float(a)), mpmath.mpf(float(r))
        if _mp_renyi(q, p0, a) > r or _mp_renyi(p0, q, a) > r:
            return False
    if max_radius is not None:
        worst = mpmath.mpf(0)
        for qj, pj in zip(q, p0):
            if (qj == 0) != (pj == 0):
                return False
            if qj > 0:
                worst = max(worst, abs(mpmath.log(qj / pj)))
        if worst > mpmath.mpf(float(max_radius)):
            return False
    return True


def in_ball(q, public, alpha, radius, extra_orders=(), extra_radii=(), max_radius=None) -> bool:
    """Whether q (renormalised at DPS_VERIFY digits) lies in B, with no tolerance on the outside."""
    with mpmath.workdps(DPS_VERIFY):
        return _mp_in_ball(_mp_normalised(q), _mp_normalised(public), [alpha, *extra_orders], [radius, *extra_radii],
                           max_radius)


def divergences_at(q, output, teachers, order):
    """(D_k(p_+ || p), D_k(p || p_+)) for one explicit q at DPS_VERIFY digits, p_+ = (N p + q) / (N+1)."""
    with mpmath.workdps(DPS_VERIFY):
        qq, pp = _mp_normalised(q), _mp_normalised(output)
        n, k = mpmath.mpf(int(teachers)), mpmath.mpf(float(order))
        plus = [(n * pj + qj) / (n + 1) for pj, qj in zip(pp, qq)]
        return float(_mp_renyi(plus, pp, k)), float(_mp_renyi(pp, plus, k))


def _certify(problem: _Problem, z):
    """q (full vocabulary, float) for z, shrunk along its tilt ray until it verifies in B at mp digits."""
    with mpmath.workdps(DPS_VERIFY):
        p0 = _mp_normalised(problem.p0)
        # the float search stops within ~1e-15 of the boundary, on the side float arithmetic calls
        # inside; a q mp calls outside is moved inwards by 1e-15, 4e-15, 1.6e-14, ... of its z
        for attempt in range(40):
            shrink = 1.0 - (0.0 if attempt == 0 else 1e-15 * 4.0 ** (attempt - 1))
            if shrink <= 0:
                break
            q = np.zeros(problem.vocab)
            q[problem.support] = np.exp(problem.log_q((shrink * z)[None])[0])
            if _mp_in_ball(_mp_normalised(q), p0, problem.c_orders, problem.c_radii, problem.max_radius):
                return q
    return None


# ----------------------------------------------------------------------------- entry points

def worst_cases(output, public, teachers, alpha, radius, orders, *, extra_orders=(), extra_radii=(),
                max_radius=None, effort: float = 1.0, seed: int = 0, certify_top: int = 3) -> list[WorstCase]:
    """Worst case over q in B of D_k(p_+ || p) and D_k(p || p_+) at every order k of `orders`.

    output: p (V,), public: p0 (V,), teachers: N, the ball: D<->_alpha(q, p0) <= radius, plus
    D<->_a(q, p0) <= r at each (a, r) of zip(extra_orders, extra_radii) and D<->_inf(q, p0) <=
    max_radius when given. `effort` scales the number of directions, starts and refinement steps.
    Every returned value is attained by the returned q, which is verified in B at DPS_VERIFY digits,
    so it is a lower estimate of the maximum. One WorstCase per order, in the given order.
    """
    problem = _Problem(output, public, teachers, alpha, radius, orders, extra_orders, extra_radii, max_radius)
    rng = np.random.default_rng(seed)
    pool = _Pool(problem, keep=max(certify_top, 4))
    pool.add(np.zeros((1, problem.m)))                  # q = p0 is always in B
    if not problem.degenerate:
        if problem.m == 2:
            _search_two(problem, pool, grid=int(20000 * effort) + 2)
        elif problem.m == 3:
            _search_three(problem, pool, rng, sweep=int(2048 * effort) + 8, grid=int(160 * effort) + 8)
        else:
            _search_general(problem, pool, rng, effort)
    results = []
    with mpmath.workdps(DPS_VERIFY):
        pp = _mp_normalised(problem.p)
        n = mpmath.mpf(problem.n)
        certified = {}

        def evaluate(q, k):
            key = (q.tobytes(), k)
            if key not in certified:
                qq = _mp_normalised(q)
                plus = [(n * pj + qj) / (n + 1) for pj, qj in zip(pp, qq)]
                kk = mpmath.mpf(float(k))
                certified[key] = (float(_mp_renyi(plus, pp, kk)), float(_mp_renyi(pp, plus, kk)))
            return certified[key]

        verified = {}
        for j, k in enumerate(problem.orders):
            best = [(-np.inf, None), (-np.inf, None)]
            for d in range(2):
                # best float candidate first; the first one that verifies in B is kept
                for z in pool.top(d, j, certify_top):
                    key = z.tobytes()
                    if key not in verified:
                        verified[key] = _certify(problem, z)
                    q = verified[key]
                    if q is not None:
                        best[d] = (evaluate(q, k)[d], q)
                        break
            for d in range(2):
                if best[d][1] is None:      # nothing certified: fall back to q = p0 (always in B)
                    q = problem.p0.copy()
                    best[d] = (evaluate(q, k)[d], q)
            results.append(WorstCase(order=float(k), forward=best[0][0], reverse=best[1][0],
                                     q_forward=best[0][1], q_reverse=best[1][1]))
    return results


def worst_case(output, public, teachers, alpha, radius, order, **options) -> WorstCase:
    """worst_cases at one order."""
    return worst_cases(output, public, teachers, alpha, radius, [order], **options)[0]
