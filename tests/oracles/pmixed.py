"""PMixED (Flemings, Razaviyayn & Annavaram 2024, "Differentially Private Next-Token Prediction of
Large Language Models") and AdaPMixED (Flemings et al. 2024, "Adaptively Private Next-Token
Prediction of Large Language Models"), whose appendix restates the PMixED theorems with the
numbers used here (Theorem 3.1, Lemma C.1)."""
from __future__ import annotations

import mpmath

from tests.oracles._mp import mp, order, precise, vector
from tests.oracles.renyi import symmetric_renyi_divergence


def _teacher_count(n) -> int:
    count = int(n)
    if count != n or count < 0:
        raise ValueError(f"ensemble size must be an integer >= 0, got {n!r}")
    return count


@precise
def theorem_3_1_epsilon(alpha, beta, teachers):
    """Per-query RDP of PMixED at the projection order alpha, as claimed by Flemings et al. 2024,
    Theorem 3.1 (Theorem C.1 in the appendix of the AdaPMixED paper):
        eps(alpha, beta, N) = log((N - 1 + exp(4 beta alpha (alpha-1))) / N) / (alpha - 1), N > 1;
        beta * alpha for N = 1 (the single teacher's ball radius, Lemma C.1's N = 1 case);
        0 for N = 0 (an empty ensemble answers with the public model alone).
    """
    a, b, n = order(alpha), mp(beta), _teacher_count(teachers)
    if b < 0:
        raise ValueError("beta must be >= 0")
    if n == 0:
        return mpmath.mpf(0)
    if n == 1:
        return b * a
    return mpmath.log((n - 1 + mpmath.exp(4 * b * a * (a - 1))) / n) / (a - 1)


@precise
def pmixed_epsilon(alpha, beta, teachers, moves=("add", "remove")):
    """Per-query RDP of PMixED with N teachers over the neighbours `moves` allows: removing one of
    its N teachers is Theorem 3.1 for an ensemble of N (at N = 1 the removal leaves the public model,
    the single teacher's ball), adding one to its N is Theorem 3.1 for an ensemble of N + 1 with one
    removed; the charge is the larger of those the relation holds."""
    n = _teacher_count(teachers)
    sizes = ([n] if "remove" in moves else []) + ([n + 1] if "add" in moves else [])
    if not sizes:
        raise ValueError("moves must include add or remove")
    return max(theorem_3_1_epsilon(alpha, beta, size) for size in sizes)


@precise
def beta_from_budget(epsilon_budget, queries, alpha, teachers, moves=None):
    """Largest beta with PMixED's per-query RDP <= eps_G / Q (Flemings et al. 2024, Lemma C.1):
        beta = log(N exp((alpha-1) eps_G / Q) + 1 - N) / (4 (alpha-1) alpha), N > 1;
        eps_G / (Q alpha), N = 1.
    With `moves` (e.g. ("add", "remove")), the largest beta whose `pmixed_epsilon` over those moves
    is at most eps_G / Q, found by bisection on beta (the value increases with beta) to 50 digits.
    """
    eps, a, n = mp(epsilon_budget), order(alpha), _teacher_count(teachers)
    q = int(queries)
    if not eps > 0 or q < 1 or n < 1:
        raise ValueError("need epsilon_budget > 0, queries >= 1, teachers >= 1")
    per_query = eps / q
    if moves is not None:
        low, high = mpmath.mpf(0), per_query / a  # at beta = eps/(Q a) the single ball alone spends it all
        while pmixed_epsilon(a, high, n, moves) <= per_query:
            high *= 2
        for _ in range(200):
            middle = (low + high) / 2
            low, high = (middle, high) if pmixed_epsilon(a, middle, n, moves) <= per_query else (low, middle)
        return low
    if n == 1:
        return per_query / a
    return mpmath.log(n * mpmath.exp((a - 1) * per_query) + 1 - n) / (4 * (a - 1) * a)


def _mix(lam, teacher, public):
    return [lam * pj + (1 - lam) * p0 for pj, p0 in zip(teacher, public)]


@precise
def ball_divergence(teacher, public, alpha, lam):
    """D<->_alpha(lam p_i + (1-lam) p0, p0): the quantity PMixED's projection bounds by beta*alpha
    (Flemings et al. 2024, Algorithm 2). The mixture is formed exactly from the given numbers."""
    lam = mp(lam)
    public = vector(public)
    return symmetric_renyi_divergence(_mix(lam, vector(teacher), public), public, alpha)


@precise
def mixing_weight_bracket(teacher, public, alpha, beta, tolerance=1e-15):
    """(low, high): low is feasible, high is not (or high == low == 1), high - low <= tolerance.

    PMixED's mixing weight is the largest lambda in [0, 1] with
    D<->_alpha(lambda p_i + (1-lambda) p0, p0) <= beta * alpha (Flemings et al. 2024, Algorithm 2).
    The divergence is 0 at lambda = 0 and quasi-convex along the segment (van Erven & Harremoes
    2014, Theorem 13, joint quasi-convexity), hence non-decreasing in lambda: bisection finds it.
    """
    radius = mp(beta) * order(alpha)
    teacher, public = vector(teacher), vector(public)

    def feasible(lam):
        return symmetric_renyi_divergence(_mix(lam, teacher, public), public, alpha) <= radius

    one = mpmath.mpf(1)
    if feasible(one):
        return one, one
    low, high = mpmath.mpf(0), one
    tolerance = mp(tolerance)
    while high - low > tolerance:
        middle = (low + high) / 2
        if feasible(middle):
            low = middle
        else:
            high = middle
    return low, high


def mixing_weight(teacher, public, alpha, beta, tolerance=1e-15):
    """The feasible end of mixing_weight_bracket: the largest feasible lambda to within `tolerance`."""
    return mixing_weight_bracket(teacher, public, alpha, beta, tolerance)[0]


@precise
def leave_one_out_losses(teachers, public, lambdas, alpha):
    """D<->_alpha(p, p_{-i}) for every teacher i (Flemings et al. 2024 (AdaPMixED), Eq. 3), with
    pbar_i = lambda_i p_i + (1-lambda_i) p0, p = mean_i pbar_i and
    p_{-i} = (N p - pbar_i)/(N-1), formed exactly as the mean of the other N-1 mixed teachers
    (each lambda depends on p_i and p0 only, so removing teacher i leaves the others unchanged)."""
    teachers = [vector(t) for t in teachers]
    public, lambdas = vector(public), vector(lambdas)
    n = len(teachers)
    if n < 2 or len(lambdas) != n:
        raise ValueError("need N >= 2 teachers and one lambda per teacher")
    mixed = [_mix(lam, t, public) for lam, t in zip(lambdas, teachers)]
    vocab = len(public)
    output = [mpmath.fsum(m[j] for m in mixed) / n for j in range(vocab)]
    losses = []
    for i in range(n):
        without = [mpmath.fsum(mixed[k][j] for k in range(n) if k != i) / (n - 1) for j in range(vocab)]
        losses.append(symmetric_renyi_divergence(output, without, alpha))
    return losses


@precise
def data_dependent_loss(teachers, public, lambdas, alpha):
    """max_i D<->_alpha(p, p_{-i}) (Flemings et al. 2024 (AdaPMixED), Eq. 3): one PMixED step's
    data-dependent RDP at order alpha (any order > 1, not only the projection order)."""
    return max(leave_one_out_losses(teachers, public, lambdas, alpha))


@precise
def noisy_screening_rdp(alpha, teachers, lam, sigma):
    """(lam / (N sigma))^2 * alpha (Flemings et al. 2024 (AdaPMixED), Theorem 4.1): the Gaussian mechanism
    (Mironov 2017, Corollary 3) on the lam-mixed ensemble mean, L2 sensitivity lam sqrt(2) / N."""
    a, n, lam, sigma = order(alpha), _teacher_count(teachers), mp(lam), mp(sigma)
    if n < 1 or not sigma > 0 or not 0 <= lam <= 1:
        raise ValueError("need N >= 1, sigma > 0, lam in [0, 1]")
    return (lam / (n * sigma)) ** 2 * a
