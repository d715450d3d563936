"""Differential tests: every public function that returns a privacy number, against the slow
mpmath oracles of tests/oracles (written from the papers, sharing no code with the package), on
hypothesis-generated inputs that hypothesis shrinks to a minimal case on failure.

The rule, for a package value `got` and the oracle's exact value `ref`:
  never under-state:              got >= ref * (1 - under_rel) - under_abs
  over-state at most by tolerance: got <= ref * (1 + over_rel) + over_abs
+inf from the oracle must be +inf in the package. The under-statement allowance is float64
rounding noise only (stated per property below, UNDER_REL / UNDER_ABS by default); the
over-statement tolerance is stated per property, looser where the package sums many terms with a
float64 logsumexp. A few properties are one-sided (an exact divergence must not exceed a bound).

Inputs include extreme tails (probabilities down to 1e-300), point masses, disjoint supports,
vocabularies of size 2, orders from 1.01 to 1024, q in {0, 1e-6, 1e-3, 0.03, 0.5, 0.999, 1},
N in {1, 2, 3, 10, 100, 1000} and deltas in (1e-12 .. 0.5).

Runs are deterministic (derandomize=True, no example database). Examples per property, default run
/ slow run (`pytest -m slow` loads the "slow" hypothesis profile: tests/conftest.py). An explicit @example
runs first; while it fails (a defect still open) hypothesis reports it without generating more.

  renyi_divergence ................................  100 / 3000
  amplified_rdp ...................................   60 / 1500
  PoissonSubsampledMechanism(Gaussian) ............   30 / 1000
  PoissonSubsampledGaussian (dp-accounting) .......   30 / 1000
  GaussianMechanism, GNMax.rdp_values .............  100 / 1000
  theorem_3_1_epsilon .............................  200 / 3000
  beta_from_budget (+1 explicit example) ..........  200 / 3000
  NoisyScreening.rdp_values .......................  100 / 1000
  PMixED.mixing_weights ...........................   25 /  600
  data_dependent_pmixed_values (+1 explicit) ......   40 / 1000
  data_dependent_pmixed_curve (+1 explicit) .......   20 /  500
  SubsampledPMixED (5 variants) ...................   80 / 1500
  log_q_gnmax (+ neighbours) ......................  100 / 1500
  data_dependent_gnmax_rdp (given log q) ..........  150 / 3000
  GNMax.data_dependent_rdp (histogram) ............   80 / 1500
  GNMax two-class exact law .......................   60 / 1000
  epsilon_from_rdp (improved, classic) ............  150 / 2000
  delta_from_rdp ..................................  150 / 2000
  RdpCurve composition ............................   80 / 1000
  RdpCurve unsorted orders ........................   80 / 1000
  PrivacyLedger total .............................   60 / 1000
"""
from __future__ import annotations

import math
import warnings

import mpmath
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dpledger import accounting
from dpledger import mechanisms
from dpledger.accounting import (ConversionMethod, DivergenceDirection, GridEdgeWarning, NeighbouringRelation,
                        PrivacyLedger, RdpCurve)
from dpledger.mechanisms import SubsamplingVariant
from dpledger.mechanisms.calibration import quiet_dp_accounting
from tests import oracles as O
from tests.conftest import examples

INF = math.inf

# ------------------------------------------------------------------ comparison (example counts: tests/conftest.py examples)

UNDER_REL = 1e-12
"""Default float64 noise allowed below the oracle, relative."""
UNDER_ABS = 1e-15
"""Default float64 noise allowed below the oracle, absolute (values near 0)."""


def assert_bound(got, ref, *, over_rel, over_abs, under_rel=UNDER_REL, under_abs=UNDER_ABS, what=""):
    """got (package, float) against ref (oracle, mpf): never below, at most `over_*` above."""
    got = float(got)
    ref = mpmath.mpf(ref)
    assert not math.isnan(got), f"{what}: package returned NaN (oracle {mpmath.nstr(ref, 17)})"
    if ref == mpmath.inf:
        assert got == INF, f"UNDER-STATES {what}: package {got!r}, oracle +inf"
        return
    lower = ref * (1 - under_rel) - under_abs if ref >= 0 else ref * (1 + under_rel) - under_abs
    assert got >= lower, (f"UNDER-STATES {what}: package {got!r} < oracle {mpmath.nstr(ref, 20)} "
                          f"(shortfall {mpmath.nstr(ref - got, 5)})")
    upper = ref * (1 + over_rel) + over_abs
    assert got <= upper, (f"over-states beyond tolerance {what}: package {got!r} > oracle "
                          f"{mpmath.nstr(ref, 20)} (rel {over_rel:g}, abs {over_abs:g})")


def assert_not_above(exact, bound, *, rel=1e-12, abs_=1e-15, what=""):
    """A claimed upper bound (package, float) must be >= an exact divergence (oracle, mpf)."""
    bound = float(bound)
    exact = mpmath.mpf(exact)
    assert bound >= exact * (1 - rel) - abs_, (f"UNDER-STATES {what}: bound {bound!r} < exact divergence "
                                              f"{mpmath.nstr(exact, 20)}")


# ------------------------------------------------------------------ strategies

SPECIAL_ORDERS = [1.01, 1.1, 1.5, 2.0, 2.5, 3.0, 6.0, 10.9, 18.0, 32.0, 63.0, 128.0, 256.0, 512.0, 1024.0]
orders_st = st.one_of(st.sampled_from(SPECIAL_ORDERS), st.floats(1.01, 1024.0).map(lambda a: round(a, 2)))
small_orders_st = st.one_of(st.sampled_from([1.01, 1.5, 2.0, 3.0, 6.0, 18.0, 64.0]),
                            st.floats(1.01, 64.0).map(lambda a: round(a, 2)))
integer_orders_st = st.one_of(st.sampled_from([2, 3, 4, 6, 18, 32, 64, 256, 1024]), st.integers(2, 1024))
Q_VALUES = [0.0, 1e-6, 1e-3, 0.03, 0.5, 0.999, 1.0]
q_st = st.one_of(st.sampled_from(Q_VALUES), st.floats(0.0, 1.0))
N_VALUES = [1, 2, 3, 10, 100, 1000]
teachers_st = st.sampled_from(N_VALUES)
delta_st = st.one_of(st.sampled_from([1e-12, 1e-10, 1e-5, 1e-3, 0.1, 0.5]),
                     st.floats(-12.0, math.log10(0.5)).map(lambda e: 10.0 ** e))


def log_uniform(low: float, high: float):
    return st.floats(math.log10(low), math.log10(high)).map(lambda e: 10.0 ** e)


def sorted_unique(values):
    return sorted(set(values))


order_grid_st = st.lists(orders_st, min_size=1, max_size=6).map(sorted_unique)


@st.composite
def distributions(draw, vocab: int):
    """A float64 probability vector of length `vocab` (sums to 1 up to rounding): a point mass, or
    entries that are 0 (disjoint supports), O(1), 1e-4..1e-29, or 1e-30..1e-300 (extreme tails)."""
    if draw(st.integers(0, 5)) == 0:
        point = [0.0] * vocab
        point[draw(st.integers(0, vocab - 1))] = 1.0
        return point
    weights = []
    for _ in range(vocab):
        kind = draw(st.sampled_from(["big", "zero", "mid", "tiny"]))
        if kind == "big":
            weights.append(draw(st.floats(0.01, 1.0)))
        elif kind == "zero":
            weights.append(0.0)
        else:
            exponent = draw(st.integers(4, 29) if kind == "mid" else st.integers(30, 300))
            weights.append(draw(st.floats(1.0, 9.99)) * 10.0 ** -exponent)
    if not any(weights):
        weights[draw(st.integers(0, vocab - 1))] = 1.0
    total = math.fsum(weights)
    return [w / total for w in weights]


@st.composite
def distribution_pairs(draw, max_vocab: int = 10):
    """(p, q) on one vocabulary: independent, or q a small perturbation of p (tiny divergences)."""
    vocab = draw(st.one_of(st.just(2), st.integers(2, max_vocab)))
    p = draw(distributions(vocab))
    if draw(st.booleans()):
        q = draw(distributions(vocab))
    else:
        scale = draw(log_uniform(1e-12, 1e-2))
        factors = draw(st.lists(st.floats(-1.0, 1.0), min_size=vocab, max_size=vocab))
        raw = [pj * (1.0 + scale * f) for pj, f in zip(p, factors)]
        total = math.fsum(raw)
        q = [r / total for r in raw]
    return p, q


@st.composite
def ensembles(draw, teacher_counts=(2, 3, 4), max_vocab: int = 6):
    """(teachers (N lists), public) on one vocabulary."""
    vocab = draw(st.one_of(st.just(2), st.integers(2, max_vocab)))
    n = draw(st.sampled_from(teacher_counts))
    public = draw(distributions(vocab))
    teachers = [draw(distributions(vocab)) for _ in range(n)]
    return teachers, public


lambda_st = st.one_of(st.sampled_from([0.0, 1.0, 1e-12, 0.5]), st.floats(0.0, 1.0).filter(lambda x: x == 0 or x >= 1e-300))
"""Subnormal weights are left out: with lambda = 5e-324 the released float law's mass lambda/N
underflows to exactly 0 on both sides, so the implemented mechanism's divergence is 0 while the
oracle's exact average keeps 1.6e-324 and calls it +inf; neither reading is a defect."""


def vectorised(function):
    """A float function of one order as the package's base_epsilon (array of orders in, array out):
    both sides see exactly the same float values."""
    return lambda ks: np.array([function(float(k)) for k in np.asarray(ks)], dtype=np.float64)


@st.composite
def base_mechanisms(draw):
    """(description, f) with f a float function of the order giving a base mechanism's RDP:
    Gaussian-like linear, a finite value up to a projection order then +inf, or a table
    eps(ceil(a)) on 2..K and +inf above."""
    kind = draw(st.sampled_from(["linear", "step", "table"]))
    if kind == "linear":
        slope = draw(log_uniform(1e-6, 10.0))
        return f"linear {slope!r} * a", lambda a: slope * a
    if kind == "step":
        value = draw(st.one_of(st.just(0.0), log_uniform(1e-8, 50.0)))
        last = draw(st.one_of(st.sampled_from([2.0, 6.0, 18.0]), st.floats(2.0, 100.0).map(lambda a: round(a, 1))))
        return f"{value!r} up to order {last!r}, +inf above", lambda a: value if a <= last else INF
    table = draw(st.lists(st.one_of(st.just(0.0), log_uniform(1e-6, 30.0)), min_size=1, max_size=8))
    return (f"table {table!r} at ceil(a) = 2..{len(table) + 1}, +inf above",
            lambda a: table[math.ceil(a) - 2] if math.ceil(a) - 2 < len(table) else INF)


# ------------------------------------------------------------------ Renyi divergence

def input_rounding(vocab: int, alpha: float, p=None, q=None) -> float:
    """How far the oracle, which uses the given numbers exactly, can be from the divergence of the
    laws they stand for, which the package computes after renormalising: for P = cP', Q = dQ',
    D_a(P||Q) - D_a(P'||Q') = (a log c + (1-a) log d) / (a-1). Without the inputs, rows summing to
    1 +- vocab ulps bound it."""
    if p is None:
        return 4.5e-16 * vocab / (alpha - 1.0)
    with mpmath.workdps(60):
        c, d = mpmath.fsum(mpmath.mpf(x) for x in p), mpmath.fsum(mpmath.mpf(x) for x in q)
        largest = max(abs(mpmath.log(c)), abs(mpmath.log(d)))  # either direction (symmetric form)
        shift = (2.0 * alpha - 1.0) * largest / (alpha - 1.0)
    return float(shift) * (1 + 1e-9) + 1e-45  # 1e-45: the 60-digit oracle's own rounding


def kernel_rounding(p, q, alpha, ref):
    """The package's documented upward rounding of a divergence (mechanisms/kernels.py): 8 ulps of
    ((a+1) (max_j |log P_j| + max_j |log Q_j| + 2) + log2 V + 2 + (a-1) D) / (a-1)."""
    largest = max((abs(math.log(x)) for x in p if x > 0), default=0.0) + max(
        (abs(math.log(y)) for y in q if y > 0), default=0.0)
    scale = (alpha + 1.0) * (largest + 2.0) + math.log2(len(p)) + 2.0 + (alpha - 1.0) * float(ref)
    return 8.0 * 2.0 ** -52 * scale / (alpha - 1.0)


def _renyi_divergence(pair, alpha, symmetric):
    # tolerance: above, rel 1e-9 plus the package's documented rounding-up (kernel_rounding); below,
    # only the renormalisation of inputs that sum to 1 within float rounding (input_rounding): the
    # package rounds every divergence up by a bound on its error, so it must never be below.
    p, q = pair
    got = mechanisms.renyi_divergence(p, q, alpha, symmetric=symmetric)
    ref = O.symmetric_renyi_divergence(p, q, alpha) if symmetric else O.renyi_divergence(p, q, alpha)
    slack = input_rounding(len(p), alpha, p, q)
    # above: the error itself (at most the rounding bound) plus the rounding-up
    assert_bound(got, ref, over_rel=1e-9, over_abs=2 * kernel_rounding(p, q, alpha, ref) + slack, under_rel=0.0,
                 under_abs=slack, what=f"renyi_divergence(p={p!r}, q={q!r}, alpha={alpha!r}, symmetric={symmetric})")


test_renyi_divergence = examples(100, 3000)(given(
    pair=distribution_pairs(), alpha=orders_st, symmetric=st.booleans())(_renyi_divergence))


# ------------------------------------------------------------------ Poisson subsampling

def _amplified_rdp(base, q, orders, general):
    # tolerance: rel 1e-10, abs 1e-13 both ways: gammaln binomials and a float64 logsumexp of up to
    # 1024 terms near log(1) lose ~1e-13 absolute in the log of the sum.
    description, f = base
    got = mechanisms.amplified_rdp(q, vectorised(f), np.asarray(orders, dtype=np.float64), general)
    for order, value in zip(orders, got):
        ref = O.subsampled_rdp(q, f, order, general)
        assert_bound(value, ref, over_rel=1e-10, over_abs=1e-13, under_rel=1e-10, under_abs=1e-13,
                     what=f"amplified_rdp(q={q!r}, base={description}, order={order!r}, general={general})")


test_amplified_rdp = examples(60, 1500)(given(
    base=base_mechanisms(), q=q_st, general=st.booleans(),
    orders=st.lists(st.one_of(integer_orders_st.map(float), orders_st), min_size=1, max_size=3).map(sorted_unique))(_amplified_rdp))


def suffix_minima(values):
    """Each value lowered to the smallest at any later (larger) order of a sorted grid: the Renyi
    divergence is non-decreasing in the order (van Erven & Harremoes 2014, Theorem 3), so a bound
    at order b >= a bounds order a, and every Mechanism's curve applies exactly this."""
    return [min(values[i:]) for i in range(len(values))]


def _poisson_subsampled_gaussian_mechanism(sigma, q, orders, general):
    # PoissonSubsampledMechanism(GaussianMechanism): the same amplification with base a / (2 sigma^2);
    # tolerance as amplified_rdp.
    mechanism = mechanisms.PoissonSubsampledMechanism(mechanisms.GaussianMechanism(sigma), q, general)
    got = mechanism.rdp_values(np.asarray(orders, dtype=np.float64))
    refs = suffix_minima([O.subsampled_rdp(q, lambda a: a / (2.0 * sigma ** 2), order, general) for order in orders])
    for order, value, ref in zip(orders, got, refs):
        assert_bound(value, ref, over_rel=1e-10, over_abs=1e-13, under_rel=1e-10, under_abs=1e-13,
                     what=f"PoissonSubsampledMechanism(GaussianMechanism({sigma!r}), q={q!r}, general={general}) "
                          f"at order {order!r}")


test_poisson_subsampled_gaussian_mechanism = examples(30, 1000)(given(
    sigma=log_uniform(0.1, 1e3), q=q_st, general=st.booleans(),
    orders=st.lists(integer_orders_st.map(float), min_size=1, max_size=3).map(sorted_unique))(_poisson_subsampled_gaussian_mechanism))


quiet_absl = quiet_dp_accounting  # dp-accounting's absl warnings when its fractional-order series stops


def _poisson_subsampled_gaussian(sigma, q, orders):
    # dp-accounting's binomial expansion (Mironov, Talwar & Zhang 2019) at integer orders;
    # tolerance rel 1e-10, abs 1e-13 (sequential float64 log-add of up to 1025 terms).
    # At a fractional order a the exact value lies between the integer orders around it.
    with quiet_absl():
        got = mechanisms.PoissonSubsampledGaussian(sigma, q).rdp_values(np.asarray(orders, dtype=np.float64))
    for order, value in zip(orders, got):
        what = f"PoissonSubsampledGaussian({sigma!r}, {q!r}) at order {order!r}"
        if float(order).is_integer():
            assert_bound(value, O.subsampled_gaussian_rdp(q, sigma, int(order)), over_rel=1e-10, over_abs=1e-13,
                         under_rel=1e-10, under_abs=1e-13, what=what)
        elif math.floor(order) >= 2:  # the upper side is test_poisson_subsampled_gaussian_fractional_orders
            lower = O.subsampled_gaussian_rdp(q, sigma, math.floor(order))
            assert float(value) >= lower * (1 - 1e-10) - 1e-13, (
                f"UNDER-STATES {what}: {value!r} < value at floor(order) {lower}")


test_poisson_subsampled_gaussian = examples(30, 1000)(given(
    sigma=log_uniform(0.3, 1e3), q=q_st,
    orders=st.lists(st.one_of(integer_orders_st.map(float), small_orders_st), min_size=1, max_size=3)
    .map(sorted_unique))(_poisson_subsampled_gaussian))


@pytest.mark.parametrize("sigma,q,order", [(1.0, 0.5, 1.01), (1.0, 0.5, 1.5), (10.0, 0.5, 1.1), (1.0, 0.03, 1.5),
                                           (1.0, 0.999, 2.5)])
def test_poisson_subsampled_gaussian_fractional_orders(sigma, q, order):
    """Over-statement only (not a privacy risk): RDP is non-decreasing in the order, so the value
    at a fractional order is at most the exact value at ceil(order); dp-accounting's fractional
    series (Mironov, Talwar & Zhang 2019, Section 3.4) returns +inf where it does not converge
    (q = 0.5 at orders 1.01..1.5), a "no guarantee" where a finite bound exists."""
    with quiet_absl():
        got = mechanisms.PoissonSubsampledGaussian(sigma, q).rdp_values(np.asarray([order]))[0]
    upper = O.subsampled_gaussian_rdp(q, sigma, math.ceil(order))
    assert float(got) <= upper * (1 + 1e-9) + 1e-13, (
        f"over-states: PoissonSubsampledGaussian({sigma}, {q}) at order {order}: {got!r} > value at "
        f"ceil(order) {mpmath.nstr(upper, 17)}")


def _gaussian_mechanism(sigma, orders):
    # closed form alpha / (2 sigma^2): rel 1e-13
    got = mechanisms.GaussianMechanism(sigma).rdp_values(np.asarray(orders, dtype=np.float64))
    for order, value in zip(orders, got):
        assert_bound(value, O.gaussian_rdp(order, sigma), over_rel=1e-13, over_abs=0.0, under_rel=1e-13,
                     under_abs=0.0, what=f"GaussianMechanism({sigma!r}) at order {order!r}")
    got = mechanisms.GNMax(sigma).rdp_values(np.asarray(orders, dtype=np.float64))
    for order, value in zip(orders, got):
        assert_bound(value, O.gnmax_data_independent_rdp(order, sigma), over_rel=1e-13, over_abs=0.0,
                     under_rel=1e-13, under_abs=0.0, what=f"GNMax({sigma!r}).rdp_values at order {order!r}")


test_gaussian_mechanism = examples(100, 1000)(given(
    sigma=log_uniform(1e-3, 1e9), orders=order_grid_st)(_gaussian_mechanism))


# ------------------------------------------------------------------ PMixED closed forms

def _theorem_3_1_epsilon(alpha, beta, teachers):
    # closed form; tolerance rel 1e-12 and abs 1e-15 / (alpha - 1) both ways: for tiny beta the
    # value ~ 4 beta alpha / N is the difference of two logs ~ log N (absolute noise ~1e-16).
    got = mechanisms.theorem_3_1_epsilon(alpha, beta, teachers)
    slack = 1e-15 / (alpha - 1.0)
    assert_bound(got, O.theorem_3_1_epsilon(alpha, beta, teachers), over_rel=1e-12, over_abs=slack,
                 under_rel=1e-12, under_abs=slack,
                 what=f"theorem_3_1_epsilon({alpha!r}, {beta!r}, {teachers!r})")


test_theorem_3_1_epsilon = examples(200, 3000)(given(
    alpha=orders_st, beta=st.one_of(st.just(0.0), log_uniform(1e-8, 10.0)),
    teachers=st.one_of(st.just(0), teachers_st))(_theorem_3_1_epsilon))


def _beta_from_budget(epsilon_budget, queries, alpha, teachers, relation):
    # Lemma C.1: a beta ABOVE the exact one under-states the privacy loss (Theorem 3.1 then exceeds
    # eps_G / Q), so here the package must not exceed the oracle by more than rel 1e-10; it may be
    # smaller by rel 1e-6 (a smaller beta is safe, only less useful). Remove-one is the paper's
    # closed form; the other relations are checked against the oracle's bisection over the
    # neighbours they hold (one teacher under add: Theorem 3.1 at two).
    got = mechanisms.beta_from_budget(epsilon_budget, queries, alpha, teachers, relation)
    ref = (O.beta_from_budget(epsilon_budget, queries, alpha, teachers) if relation is NeighbouringRelation.REMOVE_ONE
           else O.beta_from_budget(epsilon_budget, queries, alpha, teachers, tuple(relation.moves)))
    what = f"beta_from_budget({epsilon_budget!r}, {queries!r}, {alpha!r}, {teachers!r}, {relation.label})"
    assert float(got) <= ref * (1 + mpmath.mpf(1e-10)), (
        f"UNDER-STATES {what}: beta {got!r} > exact {mpmath.nstr(ref, 20)} (Theorem 3.1 at this beta exceeds the "
        f"per-query budget by rel {mpmath.nstr(got / ref - 1, 3)})")
    assert float(got) >= ref * (1 - mpmath.mpf(1e-6)), f"{what}: beta {got!r} far below exact {mpmath.nstr(ref, 20)}"


# Defect found by this property, now fixed (precision): for N > 1 the package forms log(N e^x + 1 - N) as
# log N + x + log1p((1 - N) e^{-x} / N), which cancels when x = (alpha - 1) eps_G / Q is small:
# beta_from_budget(0.01, 10**6, 1.01, 1000) = 2.4752495982475913e-06 against the exact
# 2.4752474011138695e-06 (rel +8.9e-7), so Theorem 3.1 at that beta exceeds eps_G / Q by rel 8.9e-7.
_beta_from_budget = example(epsilon_budget=0.01, queries=10 ** 6, alpha=1.01, teachers=1000,
                            relation=NeighbouringRelation.REMOVE_ONE)(_beta_from_budget)
test_beta_from_budget = examples(200, 3000)(given(
    epsilon_budget=log_uniform(1e-2, 100.0),
    queries=st.one_of(st.sampled_from([1, 100, 1024, 9728, 100_000]), st.integers(1, 10 ** 6)),
    alpha=orders_st, teachers=st.one_of(st.just(1), teachers_st),
    relation=st.sampled_from([NeighbouringRelation.REMOVE_ONE, NeighbouringRelation.ADD_ONE,
                              NeighbouringRelation.ADD_OR_REMOVE_ONE]))(_beta_from_budget))


def _beta_from_budget_tiny(epsilon_budget, queries, alpha, teachers, relation):
    # budgets whose per-query share is subnormal or nearly so: float64 keeps few digits there, so the
    # beta must be proven (exact rational check), never above the exact one; it may be far below
    # (a subnormal beta has few digits) but not 0 unless it underflows
    try:
        got = mechanisms.beta_from_budget(epsilon_budget, queries, alpha, teachers, relation)
    except ValueError as refused:
        assert "underflows" in str(refused)
        return
    charged = O.pmixed_epsilon(alpha, got, teachers, tuple(relation.moves))
    budget = mpmath.mpf(epsilon_budget) / queries
    assert charged <= budget, (f"UNDER-STATES beta_from_budget({epsilon_budget!r}, {queries}, {alpha!r}, {teachers}, "
                               f"{relation.label}): Theorem 3.1 at beta {got!r} is {mpmath.nstr(charged, 20)} > "
                               f"{mpmath.nstr(budget, 20)}")


test_beta_from_budget_tiny = examples(200, 3000)(given(
    epsilon_budget=log_uniform(1e-323, 1e-280), queries=st.integers(1, 10 ** 6),
    alpha=st.one_of(orders_st, st.sampled_from([1.1, 2.0, 1024.0])), teachers=st.one_of(st.just(1), teachers_st),
    relation=st.sampled_from([NeighbouringRelation.REMOVE_ONE, NeighbouringRelation.ADD_ONE,
                              NeighbouringRelation.ADD_OR_REMOVE_ONE]))(_beta_from_budget_tiny))


def _noisy_screening(teachers, lam, sigma, orders):
    # closed form (lam / (N sigma))^2 * alpha: rel 1e-13
    screening = mechanisms.NoisyScreening(teachers=teachers, lam=lam, sigma=sigma)
    got = screening.rdp_values(np.asarray(orders, dtype=np.float64))
    for order, value in zip(orders, got):
        # a positive value that underflows is reported as the smallest float (5e-324), never 0
        assert_bound(value, O.noisy_screening_rdp(order, teachers, lam, sigma), over_rel=1e-13, over_abs=5e-324,
                     under_rel=1e-13, under_abs=0.0,
                     what=f"NoisyScreening(teachers={teachers}, lam={lam!r}, sigma={sigma!r}) at order {order!r}")


test_noisy_screening = examples(100, 1000)(given(
    teachers=teachers_st, lam=st.one_of(st.sampled_from([0.0, 1e-4, 1.0]), st.floats(0.0, 1.0)),
    sigma=log_uniform(1e-4, 10.0), orders=order_grid_st)(_noisy_screening))


# ------------------------------------------------------------------ PMixED mixing weights and Eq. 3

def _pmixed_mixing_weights(ensemble, alpha, beta):
    # Soundness: the package's lambda is <= the oracle's largest feasible lambda (+1e-12) and its
    # mixed teacher lies in the ball by the exact divergence (radius * (1 + 1e-9) + slack).
    # Utility: not much smaller than the oracle's lambda (within 1e-9, or its divergence within
    # 1e-8 relative of the radius: near a steep boundary lambda is not better determined).
    teachers, public = ensemble
    pmixed = mechanisms.PMixED(alpha=alpha, beta=beta, teachers=len(teachers))
    lambdas = pmixed.mixing_weights(np.asarray(teachers), np.asarray(public))
    radius = mpmath.mpf(beta) * mpmath.mpf(alpha)
    # The oracle takes the float inputs exactly, and they sum to 1 only up to rounding: D(p0 || p0)
    # is then log(sum p0)/(alpha-1), +-1e-14 at order 1.01, not 0. `slack` absorbs that, on the
    # radius the oracle's bisection uses and on both ball checks.
    slack = 1e-15 + input_rounding(len(public), alpha)
    for i, (teacher, lam) in enumerate(zip(teachers, lambdas)):
        what = f"PMixED({alpha!r}, {beta!r}).mixing_weights teacher {i}: p_i={teacher!r}, p0={public!r}"
        lam = float(lam)
        assert 0.0 <= lam <= 1.0, f"{what}: lambda {lam!r} outside [0, 1]"
        low, high = O.mixing_weight_bracket(teacher, public, alpha, (radius * (1 + mpmath.mpf(1e-9)) + slack) / alpha)
        divergence = O.ball_divergence(teacher, public, alpha, lam)
        assert lam <= high + 1e-12, f"UNDER-STATES {what}: lambda {lam!r} > largest feasible {mpmath.nstr(high, 17)}"
        assert divergence <= radius * (1 + mpmath.mpf(1e-9)) + slack, (
            f"UNDER-STATES {what}: lambda {lam!r} leaves the ball: divergence {mpmath.nstr(divergence, 17)} "
            f"> radius {mpmath.nstr(radius, 17)}")
        # the solver stops inside the ball by its rounding allowance (8 ulps per unit of log magnitude,
        # over alpha - 1: 1.4e-10 at order 1.01 beside p0 = 5e-82), which utility must not count
        magnitude = 2 * max(abs(math.log(p)) for p in public if p > 0) + abs(math.log1p(-min(lam, 0.5))) + 2
        allowance = 16 * 2.220446049250313e-16 * ((alpha + 1) * magnitude + math.log2(len(public)) + 4) / (alpha - 1)
        assert lam >= low - 1e-9 or divergence >= radius * (1 - mpmath.mpf(1e-8)) - slack - allowance, (
            f"{what}: lambda {lam!r} far below the largest feasible {mpmath.nstr(low, 17)}")


test_pmixed_mixing_weights = examples(25, 600)(given(
    ensemble=ensembles(teacher_counts=(1, 2, 3)), alpha=small_orders_st,
    beta=st.one_of(st.sampled_from([0.0, 0.01, 0.2]), log_uniform(1e-4, 2.0)))(_pmixed_mixing_weights))


def mixture_kernel_rounding(mixed, order, ref):
    """The package's documented upward rounding of each divergence (kernels.py) between mixtures
    of these rows, at its largest (compare kernel_rounding): its leave-one-out scale is max_j |log p_j|
    + N + 2 + the widest span of log(p_-i / p) over tokens (kernels._LeaveOneOut.magnitude), bounded
    here by twice the largest |log| of a mixed entry, N + 2 and the widest such span."""
    logs = [abs(math.log(x)) for row in mixed for x in row if x > 0]
    n = len(mixed)
    output = [sum(row[j] for row in mixed) / n for j in range(len(mixed[0]))]
    span = 0.0
    for i in range(n if n > 1 else 0):
        ratios = [math.log(sum(mixed[m][j] for m in range(n) if m != i) / (n - 1)) - math.log(output[j])
                  for j in range(len(output)) if output[j] > 0 and sum(mixed[m][j] for m in range(n) if m != i) > 0]
        if ratios:
            span = max(span, max(ratios) - min(ratios))
    scale = ((order + 1.0) * (2.0 * max(logs, default=0.0) + n + 2.0 + span) + math.log2(len(mixed[0])) + 2.0
             + (order - 1.0) * float(ref))
    return 8.0 * 2.0 ** -52 * scale / (order - 1.0)


def float_mixtures(teachers, public, lambdas):
    """pbar_i = lambda_i p_i + (1 - lambda_i) p0 in float64, the distributions the mechanism actually
    averages and samples from (an entry such as 1e-263 * 1e-62 underflows to 0 there, so the
    released output is that of the float mixture). The oracle's Eq. 3 is evaluated exactly on these
    (with lambda = 1, its mixture of pbar_i with p0 is pbar_i itself)."""
    return [[lam * t + (1.0 - lam) * p0 for t, p0 in zip(teacher, public)] for lam, teacher in zip(lambdas, teachers)]


def _data_dependent_pmixed_values(ensemble, lambdas, orders):
    # Eq. 3 at explicit lambdas; tolerance rel 1e-9, abs 1e-12 both ways (float64 divergences).
    teachers, public = ensemble
    lambdas = (lambdas * len(teachers))[: len(teachers)]
    got = mechanisms.data_dependent_pmixed_values(np.asarray(teachers), np.asarray(public), np.asarray(lambdas),
                                                  orders)
    assert_matches_eq3(got, orders, teachers, public, lambdas,
                       f"data_dependent_pmixed_values(teachers={teachers!r}, public={public!r}, lambdas={lambdas!r})")


def assert_matches_eq3(values, orders, teachers, public, lambdas, what):
    """Package Eq. 3 values against the oracle on the float mixtures: never below (rel 1e-9, abs
    1e-12), above by at most rel 1e-9 plus twice the kernel's documented rounding-up."""
    mixed, ones = float_mixtures(teachers, public, lambdas), [1.0] * len(teachers)
    for order, value in zip(orders, values):
        ref = O.data_dependent_loss(mixed, public, ones, order)
        assert_bound(value, ref, over_rel=1e-9, over_abs=1e-12 + 2 * mixture_kernel_rounding(mixed, order, ref),
                     under_rel=1e-9, under_abs=1e-12, what=f"{what} at order {order!r}")


# Defect found by this property, now fixed (minimal shrunk input, kept as an explicit example): p_{-i} is
# formed as (N p - pbar_i) / (N - 1) in float64, which cancels catastrophically where teacher i
# holds almost all of a token's mass: here total = 0.5 + 6e-17 rounds to 0.5 + 1.1e-16, so
# p_{-1}[1] = 1.1e-16 instead of 6e-17 and the order-2 loss is 33.964 against the exact 34.580.
_data_dependent_pmixed_values = example(
    ensemble=([[0.5, 0.5], [1.0 - 6e-17, 6e-17]], [0.5, 0.5]), lambdas=[1.0], orders=[2.0],
)(_data_dependent_pmixed_values)
# Found by a 1,000-example run: ten teachers at lambda 1e-12, order 1.01: the package's value (5.08e-12,
# true 5.6e-15) carries its documented allowance, which counts N in its scale; the tolerance's model did not.
_data_dependent_pmixed_values = example(
    ensemble=([[1.0, 0.0]] * 9 + [[0.0, 1.0]], [0.5, 0.5]), lambdas=[1e-12], orders=[1.01],
)(_data_dependent_pmixed_values)
test_data_dependent_pmixed_values = examples(40, 1000)(given(
    ensemble=ensembles(teacher_counts=(2, 3, 10)), lambdas=st.lists(lambda_st, min_size=1, max_size=10),
    orders=st.lists(orders_st, min_size=1, max_size=3).map(sorted_unique))(_data_dependent_pmixed_values))


def _data_dependent_pmixed_curve(ensemble, alpha, beta, orders):
    # Eq. 3 at the package's own mixing weights; tolerance as data_dependent_pmixed_values.
    teachers, public = ensemble
    pmixed = mechanisms.PMixED(alpha=alpha, beta=beta, teachers=len(teachers))
    curve = mechanisms.data_dependent_pmixed_curve(pmixed, np.asarray(teachers), np.asarray(public), orders=orders)
    lambdas = [float(x) for x in pmixed.mixing_weights(np.asarray(teachers), np.asarray(public))]
    assert curve.data_dependent
    assert tuple(curve.orders) == tuple(orders)
    assert_matches_eq3(curve.values, curve.orders, teachers, public, lambdas,
                       f"data_dependent_pmixed_curve(PMixED({alpha!r}, {beta!r}), teachers={teachers!r}, "
                       f"public={public!r}) [lambdas {lambdas!r}]")


# Defect (fixed), same cause as in data_dependent_pmixed_values, reached with the package's own mixing
# weights (shrunk by hypothesis): lambda = (0.0036243028398840913, 0.9999999999990905), teacher 2's
# mixed token-0 mass 9.094e-17 sits beside teacher 1's 0.0036, and (N p - pbar_1) returns 9.107e-17:
# order 1.01 loss 0.06489707387176924 against the exact 0.0649007576189987 (beta = 0.2 gives
# 0.7422976715463777 against 0.742078742463034, an over-statement beyond tolerance).
_data_dependent_pmixed_curve = example(
    ensemble=([[1.0, 0.0], [0.0, 1.0]], [9.999000099990002e-05, 0.9999000099990001]), alpha=1.01, beta=0.01,
    orders=[1.01],
)(_data_dependent_pmixed_curve)
test_data_dependent_pmixed_curve = examples(20, 500)(given(
    ensemble=ensembles(teacher_counts=(2, 3)), alpha=small_orders_st,
    beta=st.one_of(st.sampled_from([0.01, 0.2]), log_uniform(1e-4, 2.0)),
    orders=st.lists(orders_st, min_size=1, max_size=3).map(sorted_unique))(_data_dependent_pmixed_curve))


# ------------------------------------------------------------------ subsampled PMixED

def _oracle_subsampled_pmixed(alpha, beta, teachers, q, variant, size, order):
    """The curve SubsampledPMixED documents (add-or-remove-one): q = 1 is PMixED itself (its
    per-query bound over adding and removing a teacher up to alpha, +inf above; 0 everywhere when
    beta = 0, a ball of radius 0 forces every lambda to 0 and the output is the public model), q = 0
    costs 0; otherwise the amplification (tight, or general for the *-general variants) of the
    variant's base eps(k), capped by eps(order):
      per-order-radius: Theorem 3.1 at order k with the realised size;
      realised-size(-general): Theorem 3.1 at alpha with the realised size, k <= alpha, +inf above;
      worst-case-size(-general): max over m = 1..N+1 (a subsample of the ensemble with a teacher
        added has up to N+1) of Theorem 3.1 at alpha, k <= alpha, +inf above;
      all-orders-ball (PMixED with the ball at every order): max over m of Theorem 3.1 at order k, every k."""
    all_orders = variant is SubsamplingVariant.ALL_ORDERS_BALL
    if q == 1.0:
        if beta == 0.0:
            return mpmath.mpf(0)
        if all_orders:
            return O.pmixed_epsilon(order, beta, teachers)
        return O.pmixed_epsilon(alpha, beta, teachers) if order <= alpha else mpmath.inf
    if all_orders:
        def base(k):
            return max(O.theorem_3_1_epsilon(k, beta, m) for m in range(1, teachers + 2))
    elif variant is SubsamplingVariant.PER_ORDER_RADIUS:
        def base(k):
            return O.theorem_3_1_epsilon(k, beta, size)
    else:
        if variant.uses_realised_sizes:
            value = O.theorem_3_1_epsilon(alpha, beta, size)
        else:
            value = max(O.theorem_3_1_epsilon(alpha, beta, m) for m in range(1, teachers + 2))

        def base(k):
            return value if k <= alpha else mpmath.inf
    return O.subsampled_rdp(q, base, order, variant.general)


@st.composite
def subsampled_pmixed_cases(draw):
    teachers = draw(teachers_st)
    q = draw(q_st)
    variant = draw(st.sampled_from(list(SubsamplingVariant)))
    size = None
    if variant.uses_realised_sizes:
        size = 0 if q == 0.0 else teachers if q == 1.0 else draw(st.integers(0, teachers))
    return teachers, q, variant, size


def _subsampled_pmixed(case, alpha, beta, orders):
    # tolerance as amplified_rdp (rel 1e-10, abs 1e-13 both ways)
    teachers, q, variant, size = case
    ball = mechanisms.Ball.ALL_ORDERS if variant is SubsamplingVariant.ALL_ORDERS_BALL else mechanisms.Ball.PROJECTION_ORDER
    mechanism = mechanisms.SubsampledPMixED(mechanisms.PMixED(alpha=alpha, beta=beta, teachers=teachers, ball=ball), q,
                                            variant, size)
    got = mechanism.rdp_values(np.asarray(orders, dtype=np.float64))
    refs = suffix_minima([_oracle_subsampled_pmixed(alpha, beta, teachers, q, variant, size, order) for order in orders])
    for order, value, ref in zip(orders, got, refs):
        assert_bound(value, ref, over_rel=1e-10, over_abs=1e-13, under_rel=1e-10, under_abs=1e-13,
                     what=f"SubsampledPMixED(PMixED({alpha!r}, {beta!r}, {teachers}), q={q!r}, {variant}, "
                          f"realised_size={size}) at order {order!r}")


test_subsampled_pmixed = examples(80, 1500)(given(
    case=subsampled_pmixed_cases(),
    alpha=st.one_of(st.sampled_from([2.0, 6.0, 18.0]), st.floats(1.5, 40.0).map(lambda a: round(a, 1))),
    beta=st.one_of(st.sampled_from([0.0, 0.01, 0.2]), log_uniform(1e-5, 1.0)),
    orders=st.lists(st.one_of(st.sampled_from([2.0, 3.0, 5.5, 6.0, 7.0, 18.0, 19.0, 64.0]), small_orders_st),
                    min_size=1, max_size=3).map(sorted_unique))(_subsampled_pmixed))


# ------------------------------------------------------------------ GNMax

counts_st = st.lists(st.one_of(st.integers(0, 20), st.integers(0, 1000)), min_size=2, max_size=5)
gnmax_sigma_st = st.one_of(st.sampled_from([0.5, 1.0, 4.0, 40.0]), log_uniform(0.3, 200.0))


def _log_q_gnmax(counts, sigma):
    # log q~ (Proposition 7): q~ must not be below the exact union bound (log within 1e-12 relative
    # + 1e-15 absolute); the neighbours' bound likewise.
    got = mechanisms.log_q_gnmax(counts, sigma)
    ref = O.log_q_gnmax(counts, sigma)
    what = f"log_q_gnmax({counts!r}, {sigma!r})"
    assert float(got) >= ref - abs(ref) * 1e-12 - 1e-15, f"UNDER-STATES {what}: {got!r} < {mpmath.nstr(ref, 20)}"
    assert float(got) <= ref + abs(ref) * 1e-10 + 1e-13, f"{what}: {got!r} far above {mpmath.nstr(ref, 20)}"
    from dpledger.mechanisms.pate import log_q_gnmax_neighbours

    got = log_q_gnmax_neighbours(counts, sigma)
    ref = O.log_q_gnmax_neighbours(counts, sigma)
    what = f"log_q_gnmax_neighbours({counts!r}, {sigma!r})"
    assert float(got) >= ref - abs(ref) * 1e-12 - 1e-15, f"UNDER-STATES {what}: {got!r} < {mpmath.nstr(ref, 20)}"
    assert float(got) <= ref + abs(ref) * 1e-10 + 1e-13, f"{what}: {got!r} far above {mpmath.nstr(ref, 20)}"


test_log_q_gnmax = examples(100, 1500)(given(
    counts=counts_st, sigma=gnmax_sigma_st)(_log_q_gnmax))


def _data_dependent_gnmax_rdp(log_q, sigma, orders):
    # Theorem 6 at a given log q~; tolerance rel 1e-9, abs 1e-12 both ways (float64 logaddexp of
    # terms (a-1) log B that reach 1e5). log q~ = -inf (q~ = 0) is the limit 0.
    got = mechanisms.data_dependent_gnmax_rdp(log_q, sigma, np.asarray(orders, dtype=np.float64))
    for order, value in zip(orders, got):
        assert_bound(value, O.theorem_6_rdp(log_q, sigma, order), over_rel=1e-9, over_abs=1e-12, under_rel=1e-9,
                     under_abs=1e-12, what=f"data_dependent_gnmax_rdp({log_q!r}, {sigma!r}) at order {order!r}")


test_data_dependent_gnmax_rdp = examples(150, 3000)(given(
    log_q=st.one_of(st.sampled_from([0.0, -1e-12, -0.69, -1.0, -50.0, -1e4, -INF]), st.floats(-2e4, 0.0)),
    sigma=gnmax_sigma_st, orders=order_grid_st)(_data_dependent_gnmax_rdp))


def _gnmax_data_dependent_rdp(counts, sigma, orders):
    # GNMax.data_dependent_rdp at a histogram: FROM_ACTUAL is Theorem 6 with Proposition 7's q~;
    # BOTH adds Theorem 6 at the neighbours. Tolerance as data_dependent_gnmax_rdp.
    gnmax = mechanisms.GNMax(sigma)
    array = np.asarray(orders, dtype=np.float64)
    forward = gnmax.data_dependent_rdp(counts, array, DivergenceDirection.FROM_ACTUAL)
    both = gnmax.data_dependent_rdp(counts, array)
    for order, f_value, b_value in zip(orders, forward, both):
        what = f"GNMax({sigma!r}).data_dependent_rdp({counts!r}) at order {order!r}"
        assert_bound(f_value, O.data_dependent_gnmax_rdp(counts, sigma, order), over_rel=1e-9, over_abs=1e-12,
                     under_rel=1e-9, under_abs=1e-12, what=what + " FROM_ACTUAL")
        assert_bound(b_value, O.data_dependent_gnmax_rdp_both_directions(counts, sigma, order), over_rel=1e-9,
                     over_abs=1e-12, under_rel=1e-9, under_abs=1e-12, what=what + " BOTH")


test_gnmax_data_dependent_rdp = examples(80, 1500)(given(
    counts=counts_st, sigma=gnmax_sigma_st, orders=order_grid_st)(_gnmax_data_dependent_rdp))


def _gnmax_two_class_exact(counts, sigma, orders):
    # Exact two-class output law: Theorem 6 (FROM_ACTUAL) must bound D(M(D) || M(D')) for both
    # replace-one neighbours D', and the default (BOTH) must also bound D(M(D') || M(D)).
    c1, c2 = counts
    gnmax = mechanisms.GNMax(sigma)
    array = np.asarray(orders, dtype=np.float64)
    forward_bound = gnmax.data_dependent_rdp([c1, c2], array, DivergenceDirection.FROM_ACTUAL)
    both_bound = gnmax.data_dependent_rdp([c1, c2], array)
    for order, f_bound, b_bound in zip(orders, forward_bound, both_bound):
        forward, reverse = O.two_class_neighbour_divergences(c1, c2, sigma, order)
        what = f"GNMax({sigma!r}).data_dependent_rdp([{c1}, {c2}]) at order {order!r}"
        assert_not_above(forward, f_bound, rel=1e-9, abs_=1e-12, what=what + " FROM_ACTUAL vs exact forward")
        assert_not_above(max(forward, reverse), b_bound, rel=1e-9, abs_=1e-12, what=what + " BOTH vs exact")


test_gnmax_two_class_exact = examples(60, 1000)(given(
    counts=st.tuples(st.integers(0, 300), st.integers(0, 300)).filter(lambda c: sum(c) > 0),
    sigma=gnmax_sigma_st, orders=st.lists(small_orders_st, min_size=1, max_size=3).map(sorted_unique))(_gnmax_two_class_exact))


# ------------------------------------------------------------------ conversions, curves, ledger

@st.composite
def curves(draw, grid=None):
    """(orders, values): a Gaussian-like composed curve, a PMixED-like step (value up to an order,
    +inf above), or arbitrary values with zeros, +inf, tiny and large entries."""
    orders = grid if grid is not None else draw(order_grid_st)
    kind = draw(st.sampled_from(["gaussian", "step", "arbitrary"]))
    if kind == "gaussian":
        slope = draw(log_uniform(1e-20, 10.0))
        return orders, [slope * a for a in orders]
    if kind == "step":
        value = draw(log_uniform(1e-20, 50.0))
        last = draw(orders_st)
        return orders, [value if a <= last else INF for a in orders]
    value_st = st.one_of(st.just(0.0), st.just(INF), log_uniform(1e-300, 1e-10), log_uniform(1e-10, 1e4))
    return orders, [draw(value_st) for _ in orders]


def _epsilon_from_rdp(curve, delta, method):
    # improved (Balle et al. 2020, Thm 21) / classic (Mironov 2017, Prop 3), min over orders, >= 0;
    # tolerance rel 1e-12, abs 1e-13 both ways.
    orders, values = curve
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        got = accounting.epsilon_from_rdp(RdpCurve(tuple(orders), np.asarray(values)), delta, method)
    ref = (O.epsilon_improved if method == "improved" else O.epsilon_classic)(orders, values, delta)
    assert_bound(got.epsilon, ref, over_rel=1e-12, over_abs=1e-13, under_rel=1e-12, under_abs=1e-13,
                 what=f"epsilon_from_rdp(orders={orders!r}, values={values!r}, delta={delta!r}, {method})")


test_epsilon_from_rdp = examples(150, 2000)(given(
    curve=curves(), delta=delta_st, method=st.sampled_from(["improved", "classic"]))(_epsilon_from_rdp))


def _delta_from_rdp(curve, epsilon):
    # min over orders of the inverse improved conversion and the total-variation bound, capped at 1;
    # tolerance rel 1e-9 both ways (exp of a log that carries (a-1) r with a up to 1024), and
    # abs 1e-300 above (the package rounds an underflowing positive delta up to the smallest float).
    orders, values = curve
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        got = accounting.delta_from_rdp(RdpCurve(tuple(orders), np.asarray(values)), epsilon)
    assert_bound(got.delta, O.delta_from_rdp(orders, values, epsilon), over_rel=1e-9, over_abs=1e-300,
                 under_rel=1e-9, under_abs=0.0,
                 what=f"delta_from_rdp(orders={orders!r}, values={values!r}, epsilon={epsilon!r})")


test_delta_from_rdp = examples(150, 2000)(given(
    curve=curves(), epsilon=st.one_of(st.sampled_from([0.0, 1.0, 8.0]), st.floats(0.0, 30.0)))(_delta_from_rdp))


@st.composite
def curve_families(draw):
    """Several curves on one sorted grid, for composition."""
    orders = draw(order_grid_st)
    count = draw(st.integers(1, 5))
    return orders, [draw(curves(grid=orders))[1] for _ in range(count)]


def _rdp_curve_composition(family, times, delta):
    # composition adds order by order (Mironov 2017, Prop 1): +, compose_curves, composed(times);
    # sums rel 1e-12 both ways, then epsilon (improved) of the total as epsilon_from_rdp.
    orders, value_lists = family
    curve_objects = [RdpCurve(tuple(orders), np.asarray(v)) for v in value_lists]
    exact = [mpmath.fsum(mpmath.mpf(v[k]) for v in value_lists) for k in range(len(orders))]
    total = accounting.compose_curves(curve_objects)
    summed = curve_objects[0]
    for other in curve_objects[1:]:
        summed = summed + other
    repeated = curve_objects[0].composed(times)
    for k, order in enumerate(orders):
        what = f"composition of {value_lists!r} at order {order!r}"
        assert_bound(total.values[k], exact[k], over_rel=1e-12, over_abs=0.0, what="compose_curves: " + what)
        assert_bound(summed.values[k], exact[k], over_rel=1e-12, over_abs=0.0, what="+: " + what)
        assert_bound(total.value_at(order), exact[k], over_rel=1e-12, over_abs=0.0, what="value_at: " + what)
        single = mpmath.mpf(value_lists[0][k])
        ref = 0 if times == 0 else single * times
        assert_bound(repeated.values[k], ref, over_rel=1e-12, over_abs=0.0,
                     what=f"composed({times}) of {value_lists[0]!r} at order {order!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        got = accounting.epsilon_from_rdp(total, delta).epsilon
    assert_bound(got, O.epsilon_improved(orders, [float(x) for x in exact], delta), over_rel=1e-11, over_abs=1e-13,
                 under_rel=1e-11, under_abs=1e-13, what=f"epsilon of composed {value_lists!r} on {orders!r}")


test_rdp_curve_composition = examples(80, 1000)(given(
    family=curve_families(), times=st.one_of(st.sampled_from([0, 1, 9728]), st.integers(0, 10 ** 6)),
    delta=delta_st)(_rdp_curve_composition))


def _rdp_curve_unsorted_orders(pairs):
    # Known defect 1: RdpCurve(orders, values) with unsorted orders must keep each value with its
    # own order (or refuse the input); composition and conversion then follow.
    orders = [a for a, _ in pairs]
    values = [v for _, v in pairs]
    try:
        curve = RdpCurve(tuple(orders), np.asarray(values))
    except ValueError:
        return
    for order, value in pairs:
        assert curve.value_at(order) == value, (
            f"UNDER-STATES RdpCurve(orders={orders!r}, values={values!r}): value_at({order!r}) = "
            f"{curve.value_at(order)!r}, given {value!r}")
    ledger = PrivacyLedger(orders)
    ledger.charge_many({"part": (np.asarray([values, values]), False)})
    for order, value in pairs:
        assert_bound(ledger.total_curve().value_at(order), 2 * mpmath.mpf(value), over_rel=1e-15, over_abs=0.0,
                     what=f"PrivacyLedger(orders={orders!r}).charge_many(values={values!r}) x2 at order {order!r}")


test_rdp_curve_unsorted_orders = examples(80, 1000)(given(
    pairs=st.lists(st.tuples(orders_st, log_uniform(1e-6, 100.0)), min_size=2, max_size=6,
                             unique_by=lambda pair: pair[0]))(_rdp_curve_unsorted_orders))


@st.composite
def ledger_cases(draw):
    orders = draw(order_grid_st)
    names = ["screen", "pmixed_data_dependent", "gnmax"]
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
        steps.append({name: draw(curves(grid=orders))[1] for name in chosen})
    return orders, steps


def _privacy_ledger_total(case, delta, block):
    # PrivacyLedger: per-step charges (or one charge_many block per component) compose to the exact
    # order-by-order sum (rel 1e-12) and its epsilon is the oracle's (rel 1e-11, abs 1e-13).
    orders, steps = case
    ledger = PrivacyLedger(orders)
    if block:
        names = sorted({name for step in steps for name in step})
        ledger.charge_many({name: (np.asarray([step.get(name, [0.0] * len(orders)) for step in steps]), False)
                            for name in names})
    else:
        for step in steps:
            ledger.charge({name: RdpCurve(tuple(orders), np.asarray(values)) for name, values in step.items()})
    exact = [mpmath.fsum(mpmath.mpf(values[k]) for step in steps for values in step.values())
             for k in range(len(orders))]
    total = ledger.total_curve()
    for k, order in enumerate(orders):
        assert_bound(total.values[k], exact[k], over_rel=1e-12, over_abs=0.0,
                     what=f"PrivacyLedger total of {steps!r} at order {order!r} (block={block})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        got = ledger.epsilon(delta).epsilon
    assert_bound(got, O.epsilon_improved(orders, [float(x) for x in exact], delta), over_rel=1e-11, over_abs=1e-13,
                 under_rel=1e-11, under_abs=1e-13, what=f"PrivacyLedger epsilon of {steps!r} on {orders!r}")


test_privacy_ledger_total = examples(60, 1000)(given(
    case=ledger_cases(), delta=delta_st, block=st.booleans())(_privacy_ledger_total))


# ------------------------------------------------------------------ the known defects, pinned

def test_amplification_at_q_1_is_the_unsampled_mechanism_above_the_projection_order():
    """Known defect 2: with q = 1 the subsampled mechanism is the mechanism itself, +inf where it is."""
    orders = np.asarray([2.0, 6.0, 7.0, 18.0, 1024.0])

    def step(ks):
        return np.where(np.asarray(ks) <= 6.0, 0.3, np.inf)

    for general in (False, True):
        got = mechanisms.amplified_rdp(1.0, step, orders, general)
        assert np.all(got[:2] == 0.3) and np.all(np.isinf(got[2:])), f"general={general}: {got}"
    pmixed = mechanisms.PMixED(alpha=6.0, beta=0.01, teachers=100)
    for variant in SubsamplingVariant:
        size = 100 if variant.uses_realised_sizes else None
        if variant is SubsamplingVariant.ALL_ORDERS_BALL:  # its ball holds at every order: finite everywhere
            sound = mechanisms.PMixED(alpha=6.0, beta=0.01, teachers=100, ball=mechanisms.Ball.ALL_ORDERS)
            got = mechanisms.SubsampledPMixED(sound, 1.0, variant).rdp_values(orders)
            assert np.all(np.isfinite(got)) and got.tolist() == sound.rdp_values(orders).tolist(), got
            continue
        got = mechanisms.SubsampledPMixED(pmixed, 1.0, variant, size).rdp_values(orders)
        assert np.all(np.isinf(got[2:])), f"{variant}: {got}"


def test_gnmax_refuses_non_finite_histograms_and_log_q():
    """Known defect 3: a non-finite histogram or log q~ is an error, never a zero loss."""
    orders = np.asarray([2.0, 18.0])
    for counts in ([INF, 1.0], [1.0, INF], [INF, INF], [math.nan, 1.0], [-1.0, 3.0]):
        with pytest.raises(ValueError):
            mechanisms.GNMax(1.0).data_dependent_rdp(counts, orders)
        with pytest.raises(ValueError):
            mechanisms.log_q_gnmax(counts, 1.0)
    for log_q in (math.nan, INF, 0.5):
        with pytest.raises(ValueError):
            mechanisms.data_dependent_gnmax_rdp(log_q, 1.0, orders)


def test_delta_of_a_tiny_rdp_curve_keeps_its_digits():
    """Known defect 4: sqrt(1 - e^{-r}) for r ~ 5e-19 is ~7.4e-10, not 0."""
    curve = mechanisms.GaussianMechanism(1e9).rdp_curve()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        got = accounting.delta_from_rdp(curve, 0.0).delta
    ref = O.delta_from_rdp(curve.orders, list(curve.values), 0.0)
    assert float(ref) == pytest.approx(math.sqrt(1.1 / 2e18), rel=1e-6)
    assert_bound(got, ref, over_rel=1e-9, over_abs=0.0, under_rel=1e-9, under_abs=0.0,
                 what="delta_from_rdp(GaussianMechanism(1e9), epsilon=0)")


@pytest.mark.parametrize("call", [
    lambda: mechanisms.theorem_3_1_epsilon(6.0, -0.01, 10),
    lambda: mechanisms.theorem_3_1_epsilon(1.0, 0.01, 10),
    lambda: mechanisms.theorem_3_1_epsilon(0.5, 0.01, 10),
    lambda: mechanisms.theorem_3_1_epsilon(6.0, 0.01, -1),
    lambda: mechanisms.theorem_3_1_epsilon(6.0, math.nan, 10),
    lambda: mechanisms.data_dependent_pmixed_curve(mechanisms.PMixED(6.0, 0.01, 2), [[0.5, 0.5], [0.2, 0.8]],
                                                   [0.5, 0.5], lambdas=[1.5, 0.5]),
    lambda: mechanisms.data_dependent_pmixed_curve(mechanisms.PMixED(6.0, 0.01, 2), [[0.5, 0.5], [0.2, 0.8]],
                                                   [0.5, 0.5], lambdas=[-0.1, 0.5]),
    lambda: mechanisms.data_dependent_pmixed_curve(mechanisms.PMixED(6.0, 0.01, 2), [[0.5, 0.5], [0.2, 0.8]],
                                                   [0.5, 0.5], lambdas=[0.5]),
    lambda: mechanisms.data_dependent_pmixed_curve(mechanisms.PMixED(6.0, 0.01, 2), [[0.5, 0.5], [0.2, 0.8]],
                                                   [0.5, 0.5], lambdas=[0.5, 0.5, 0.5]),
    lambda: mechanisms.data_dependent_pmixed_curve(mechanisms.PMixED(6.0, 0.01, 2), [[0.5, 0.5], [0.2, 0.8]],
                                                   [0.5, 0.5], lambdas=[math.nan, 0.5]),
    lambda: mechanisms.ThresholdWeightedSampler(threshold=2, gamma=1.5).probabilities([3.0, math.nan, 1.0]),
    lambda: mechanisms.ThresholdWeightedSampler(threshold=2, gamma=1.5).probabilities([3.0, -1.0, 1.0]),
], ids=["negative-beta", "alpha-1", "alpha-below-1", "negative-N", "nan-beta", "lambda-above-1",
        "lambda-below-0", "too-few-lambdas", "too-many-lambdas", "nan-lambda", "tws-nan-count",
        "tws-negative-count"])
def test_unchecked_inputs_raise_value_error(call):
    """Known defect 5: inputs outside a function's domain raise ValueError, never a number."""
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("counts,sigma,order", [((9, 1), 1.0, 2.0), ((9, 1), 1.0, 3.0), ((30, 10), 4.0, 2.0)])
def test_gnmax_default_bound_covers_the_reverse_direction(counts, sigma, order):
    """Known defect 6: Theorem 6 bounds D(M(D) || M(D')) only; the curve the package charges by
    default must also cover D(M(D') || M(D)) (counts (9, 1), sigma 1, order 2: 0.0157 > 1.35e-4)."""
    forward, reverse = O.two_class_neighbour_divergences(*counts, sigma, order)
    got = mechanisms.GNMax(sigma).data_dependent_rdp(list(counts), np.asarray([order]))[0]
    assert_not_above(max(forward, reverse), got, rel=1e-9, abs_=1e-12,
                     what=f"GNMax({sigma}).data_dependent_rdp({counts}) at order {order}")
    curve = mechanisms.GNMax(sigma).data_dependent_curve(list(counts), [order], DivergenceDirection.FROM_ACTUAL)
    assert curve.direction is DivergenceDirection.FROM_ACTUAL and curve.data_dependent
    assert curve.relation is NeighbouringRelation.REPLACE_ONE


def test_conversion_method_enum_and_string_agree():
    curve = mechanisms.GaussianMechanism(2.0).rdp_curve()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        for method in ConversionMethod:
            assert (accounting.epsilon_from_rdp(curve, 1e-5, method).epsilon
                    == accounting.epsilon_from_rdp(curve, 1e-5, method.value).epsilon)
