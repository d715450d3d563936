"""The add-one bound on a sub-grid of orders (mechanisms/add_one.py, `add_one_direction_bounds` with
`relative_tolerance`): its three sums are convex in the order, so chords between computed orders bound
them from above. Checked on generated inputs against computing every order: never below it (the
chords carry the sums' rounding allowances), within the certificate's factor of it, equal to it where
an order was computed; and the convexity the proof rests on, in mpmath, on the same sums."""
from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from dpledger.accounting import DEFAULT_ORDERS
from dpledger.mechanisms.add_one import (ADD_ONE_RELATIVE_TOLERANCE, ADD_ONE_SUBGRID_MIN_VOCABULARY, _sandwich,
                                         add_one_direction_bounds, add_one_divergence_bounds)

ORDERS = torch.tensor(DEFAULT_ORDERS)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def generated_case(seed: int) -> dict:
    """An output law p (a mix of teachers and the public law, batch of 1 to 4 steps), the public law p0,
    N, the ball; with zeros, near-identical laws and spiky laws among them."""
    rng = np.random.default_rng(seed)
    vocab = int(rng.choice([2, 3, 17, 256, 1024]))
    rows = int(rng.integers(1, 5))
    teachers = int(rng.choice([1, 2, 8, 100]))
    public_logits = rng.uniform(0.5, 8.0) * rng.standard_normal((rows, vocab))
    p0 = _softmax(public_logits)
    kind = seed % 4
    if kind == 0:     # teachers near the public model
        p = _softmax(public_logits + 0.05 * rng.standard_normal((rows, vocab)))
    elif kind == 1:   # far from it
        p = _softmax(public_logits + rng.uniform(1, 4) * rng.standard_normal((rows, vocab)))
    elif kind == 2:   # zeros in both laws (the public model never emits some tokens)
        p0[:, : max(1, vocab // 5)] = 0.0
        p0 /= p0.sum(axis=-1, keepdims=True)
        lam = rng.uniform(0, 1)
        p = lam * _softmax(public_logits + rng.standard_normal((rows, vocab))) + (1 - lam) * p0
        p[:, : max(1, vocab // 5)] = 0.0
        p /= p.sum(axis=-1, keepdims=True)
    else:             # the output equals the public law
        p = p0.copy()
    alpha = float(rng.choice([1.5, 2.0, 4.0, 6.0, 18.0]))
    radius = float(10 ** rng.uniform(-4, 0.5))
    beta = float(radius / alpha) if rng.random() < 0.3 else None
    return dict(output=torch.from_numpy(p), public=torch.from_numpy(p0), teachers=teachers, alpha=alpha,
                radius=radius, all_orders_beta=beta)


@pytest.mark.parametrize("seed", range(48))
def test_the_subgrid_is_never_below_computing_every_order_and_within_its_certificate(seed):
    case = generated_case(seed)
    every = add_one_direction_bounds(case["output"], case["public"], case["teachers"], ORDERS, case["alpha"],
                                     case["radius"], case["all_orders_beta"], relative_tolerance=None)
    sub = add_one_direction_bounds(case["output"], case["public"], case["teachers"], ORDERS, case["alpha"],
                                   case["radius"], case["all_orders_beta"], subgrid_from_vocabulary=0)
    for full, chord in zip(every, sub):
        assert chord.shape == full.shape
        assert not np.isnan(chord).any()
        assert np.all(chord >= full), f"below every-order value by {np.max(full - chord):.3g}"
        finite = np.isfinite(full)
        assert np.array_equal(np.isfinite(chord), finite)
        assert np.all(chord[finite] <= (1.0 + ADD_ONE_RELATIVE_TOLERANCE) * full[finite] + 1e-12)


def test_the_charged_maximum_follows_the_same_rule():
    case = generated_case(5)
    args = (case["output"], case["public"], case["teachers"], ORDERS, case["alpha"], case["radius"])
    every = add_one_divergence_bounds(*args, relative_tolerance=None).numpy()
    sub = add_one_divergence_bounds(*args, subgrid_from_vocabulary=0).numpy()
    assert np.all(sub >= every) and np.all(sub <= (1 + ADD_ONE_RELATIVE_TOLERANCE) * every + 1e-12)


def test_a_tolerance_that_is_not_positive_is_refused():
    case = generated_case(1)
    with pytest.raises(ValueError, match="relative_tolerance must be > 0"):
        add_one_direction_bounds(case["output"], case["public"], case["teachers"], ORDERS, case["alpha"],
                                 case["radius"], relative_tolerance=0.0, subgrid_from_vocabulary=0)


def _log_sum_exp_affine(weights: np.ndarray, slopes: np.ndarray, order: float) -> mpmath.mpf:
    """log sum_j w_j exp(k s_j) in mpmath, the shape of each of the bound's three sums."""
    return mpmath.log(mpmath.fsum(mpmath.mpf(float(w)) * mpmath.exp(order * mpmath.mpf(float(s)))
                                  for w, s in zip(weights, slopes)))


@pytest.mark.parametrize("seed", range(6))
def test_the_sandwich_brackets_a_convex_sum_computed_in_mpmath(seed):
    """_sandwich's chord is above and its extended chords below a log-sum-exp of affine functions
    of the order (the form of every sum the sub-grid interpolates), evaluated exactly in mpmath."""
    mpmath.mp.dps = 40
    rng = np.random.default_rng(seed)
    weights, slopes = rng.uniform(0, 1, 12), rng.normal(0, 3, 12)
    grid = np.asarray(DEFAULT_ORDERS[:60])
    anchors = np.unique(np.append(np.arange(0, grid.size, 7), grid.size - 1))
    exact = np.asarray([float(_log_sum_exp_affine(weights, slopes, k)) for k in grid])
    done = np.zeros(grid.size, dtype=bool)
    done[anchors] = True
    chord, rounding, lower = _sandwich(grid, done, np.where(done, exact, np.nan)[None], None)
    assert np.all(chord[0] + rounding[0] >= exact - 1e-15 * np.abs(exact))
    assert np.all(lower[0] <= exact + 1e-12 * np.abs(exact))
    assert np.array_equal(chord[0][anchors], exact[anchors])


def _unscreened_block(seed: int, records_version: int):
    """A block of 2 steps of 4 teachers at the sub-grid's smallest vocabulary in the decode loop, run by an
    unscreened AdaPMixED runner built as for a trace of `records_version`: (its outcome, the public laws)."""
    from dpledger.decoding.runners import build_runner
    from dpledger.mechanisms.randomness import StepGenerators

    rng = np.random.default_rng(seed)
    vocab = ADD_ONE_SUBGRID_MIN_VOCABULARY
    teachers = torch.from_numpy(_softmax(rng.normal(0, 2, (2, 4, vocab))))
    public = torch.from_numpy(_softmax(rng.normal(0, 2, (2, vocab))))
    table = dict(type="adapmixed", alpha=6.0, beta=0.05, lam=1e-4, sigma=1e-2, threshold=4.5, top_k=8,
                 screening=False)
    runner = build_runner(table, 4, "add_or_remove_one", records_version=records_version)
    assert "add_one_version" not in runner.params   # never a config key: the manifest check is unchanged
    return runner.process(public, teachers, StepGenerators.for_steps(1, 0, 2), np.asarray(DEFAULT_ORDERS)), public


def test_a_trace_follows_the_arithmetic_of_the_code_that_wrote_it():
    """build_runner with records_version < 4 charges the add-one bound at every order, as the code that
    wrote such traces did (their replay must reproduce it); version 4 on the sub-grid, never below."""
    from dpledger.mechanisms import PMixED

    (every_order_outcome, public), (subgrid_outcome, _) = (_unscreened_block(3, version) for version in (3, 4))
    outcomes = {3: every_order_outcome, 4: subgrid_outcome}
    every_order = add_one_divergence_bounds(outcomes[3].output, public, 4, ORDERS, *PMixED(6.0, 0.05, 4).one_order_ball,
                                            relative_tolerance=None).numpy()
    np.testing.assert_allclose(outcomes[3].add_one_bound, every_order, rtol=1e-6)   # (from the step's own output law)
    new_bound = outcomes[4].add_one_bound
    assert np.all(new_bound >= outcomes[3].add_one_bound)
    assert np.all(new_bound <= (1 + ADD_ONE_RELATIVE_TOLERANCE) * outcomes[3].add_one_bound + 1e-12)
    assert np.all(outcomes[4].charged["pmixed_data_dependent"] >= outcomes[3].charged["pmixed_data_dependent"])
    assert not np.array_equal(new_bound, outcomes[3].add_one_bound)    # the sub-grid did run


def test_below_the_smallest_vocabulary_every_order_is_computed():
    case = generated_case(5)     # V < ADD_ONE_SUBGRID_MIN_VOCABULARY
    assert case["output"].shape[-1] < ADD_ONE_SUBGRID_MIN_VOCABULARY
    args = (case["output"], case["public"], case["teachers"], ORDERS, case["alpha"], case["radius"])
    every = add_one_divergence_bounds(*args, relative_tolerance=None).numpy()
    assert np.array_equal(add_one_divergence_bounds(*args).numpy(), every)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 400), st.integers(1, 120), st.floats(0.05, 3.0), st.booleans(),
       st.sampled_from([0.0, -300.0, -700.0]))
def test_the_weighted_chord_sums_are_within_their_allowance_of_mpmath(seed, tokens, teachers, spread, powers, scale):
    """Records version 7's add-one sums (fused.add_one_weighted_order_sums, through _AllocatedTokens) and
    version 8's (fused.add_one_power_order_sums: products on the lattice of tenths, `powers`) against the
    sums written out in mpmath from their definition: the weight w0 of phi_k(0) is at least
    1 - sum_j a_j / t_j exactly, and each computed log-sum is within the allowance add_one_direction_bounds
    gives it (its exponents' rounding plus (M + 2) unit roundoffs for the sum, and version 8's lattice
    allowance) of the exact value. `scale` shrinks the allocation (at -700 the power sums underflow and the
    exp path takes over); the orders are on the lattice but for 1.25 and 2.718, which take the exp path."""
    import mpmath
    from dpledger.accounting.rounding import ROUNDING_ULPS
    from dpledger.mechanisms.add_one import _AllocatedTokens, _U

    rng = np.random.default_rng(seed)
    allocation = rng.dirichlet(np.full(tokens, 0.7))
    log_t = np.sort(spread * np.abs(rng.standard_normal(tokens)) + rng.uniform(-0.5, 0.5))[::-1].copy()
    log_allocation = np.log(allocation) + scale
    allocated = _AllocatedTokens(log_allocation[None], log_t[None], float(teachers), powers=powers)
    la, lt, log_share, shift = allocated.rows[0]
    orders = np.asarray([1.1, 1.5, 2.0, 7.3, 33.0, 256.0, 1024.0])
    u2, chord, _, _ = allocated.order_sums(orders)
    lattice_u2, lattice_chord = allocated.lattice_allowances(orders)
    off = np.asarray([1.25, 2.718])
    off_u2, off_chord, _, _ = allocated.order_sums(off)
    assert not allocated.lattice_allowances(off)[0].any()
    orders, u2, chord = np.append(orders, off), np.append(u2, off_u2, axis=1), np.append(chord, off_chord, axis=1)
    lattice_u2, lattice_chord = np.append(lattice_u2, [[0.0, 0.0]], axis=1), np.append(lattice_chord, [[0.0, 0.0]], axis=1)
    mpmath.mp.prec = 140
    shares = [mpmath.exp(mpmath.mpf(a) - mpmath.mpf(t)) for a, t in zip(la, lt)]
    zero_weight = mpmath.exp(allocated.log_zero_weights[0]) if np.isfinite(allocated.log_zero_weights[0]) else 0
    assert zero_weight >= 1 - mpmath.fsum(shares)
    # a float law a few ulps (or more) above mass 1: the weight holds that mass less sum c
    for mass in (1.0 + 8 * 2.0 ** -53, 1.0 + 1e-12):
        heavier = _AllocatedTokens(log_allocation[None], log_t[None], float(teachers), masses=np.array([mass]))
        weight = mpmath.exp(heavier.log_zero_weights[0]) if np.isfinite(heavier.log_zero_weights[0]) else 0
        assert weight >= mpmath.mpf(mass) - mpmath.fsum(shares)
    n = mpmath.mpf(teachers)
    z = mpmath.log(n / (n + 1))
    magnitude = float(np.abs(lt).max()) + float(allocated.zero_weight_magnitude().max())
    summation = (la.size + 2.0) * _U
    for index, k in enumerate(orders):
        k_exact = mpmath.mpf(k)
        exact_u2 = mpmath.log(mpmath.fsum(mpmath.exp(mpmath.mpf(a) + (k_exact - 1) * mpmath.mpf(t)) for a, t in zip(la, lt)))
        # shift_j as given (its own rounding is the caller's, covered by the exponent term below)
        exact_chord = mpmath.log(zero_weight * mpmath.exp(k_exact * z) + mpmath.fsum(
            c * mpmath.exp(k_exact * mpmath.mpf(s)) for c, s in zip(shares, shift)))
        u2_allowance = ROUNDING_ULPS * (abs(float(exact_u2)) + float(np.abs(la).max()) + (k - 1.0) * (magnitude + 4.0)
                                        + 2.0 * np.log2(la.size + 1.0)) + summation + lattice_u2[0, index]
        chord_allowance = ROUNDING_ULPS * (abs(float(exact_chord)) + k * (magnitude + 4.0)
                                           + 2.0 * np.log2(la.size + 1.0)) + summation + lattice_chord[0, index]
        assert abs(mpmath.mpf(u2[0, index]) - exact_u2) <= u2_allowance
        assert abs(mpmath.mpf(chord[0, index]) - exact_chord) <= chord_allowance


@pytest.mark.parametrize("version, previous", [(10, 9), (9, 8), (8, 7), (7, 6)])
@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 12), st.integers(3, 400), st.sampled_from([2.0, 6.0, 18.0]),
       st.floats(0.01, 0.3), st.booleans())
def test_each_records_version_add_one_bound_agrees_with_the_previous(version, previous, seed, teachers, vocab,
                                                                     alpha, beta, all_orders):
    """Version 10's compiled forward rounds against version 9's numpy ones (the C library's exp, expm1, log
    and log1p in place of numpy's), version 9's per-row sub-grid against version 8's shared one (one row:
    the same bits), version 8's
    products on the lattice of tenths against version 7's one exp per token and order, and
    version 7's weighted chord sum against the expm1 form (versions 4 to 6): the same bound within their
    allowances: within 1e-9 relative at every order computed. On the sub-grid both are never below their
    every-order values and within the certificate above them; they agree within 1e-9 except where a
    bisection's test (a chord against 1.005 times a floor) falls on the other side of its line by a last
    bit, which refines other anchors (a rare case hypothesis once found for 7 against 6). The grid is
    float64 (float32 orders such as 1.100000023841858 are off the lattice: version 8 would take the exp path)."""
    rng = np.random.default_rng(seed)
    teachers_t = torch.from_numpy(_softmax(rng.normal(0, 2, (teachers, vocab))))
    public = torch.from_numpy(_softmax(rng.normal(0, 2, vocab)))
    from dpledger.mechanisms.kernels import mixed_teachers, mixing_weights
    lambdas = mixing_weights(teachers_t, public, alpha, alpha * beta)
    output = mixed_teachers(teachers_t, public, lambdas).mean(dim=-2)
    beta_all = beta if all_orders else None
    grid = torch.tensor(DEFAULT_ORDERS, dtype=torch.float64)
    every, sub = ([add_one_divergence_bounds(output, public, teachers, grid, alpha, alpha * beta, beta_all,
                                             relative_tolerance=tolerance, subgrid_from_vocabulary=0,
                                             version=v).numpy() for v in (version, previous)]
                  for tolerance in (None, ADD_ONE_RELATIVE_TOLERANCE))
    np.testing.assert_allclose(every[0], every[1], rtol=1e-9)
    for chord, exact in zip(sub, every):
        assert np.all(chord >= exact) and np.all(chord <= (1.0 + ADD_ONE_RELATIVE_TOLERANCE) * exact * (1.0 + 1e-12))
    apart = ~np.isclose(sub[0], sub[1], rtol=1e-9, atol=0.0)
    assert apart.sum() <= grid.numel() // 4, f"{apart.sum()} orders apart on the sub-grid"


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([1, 2, 8, 30, 100]), st.sampled_from([64, 1000, 9000]),
       st.sampled_from([2.0, 6.0, 18.0]), st.floats(0.005, 0.3), st.floats(0.3, 3.0))
def test_w_only_where_the_reverse_can_bind_leaves_the_bound_as_computing_it_everywhere(seed, teachers, vocab, alpha,
                                                                                       beta, spread):
    """reverse_where_binding (records version 7's default without the dual) computes W only where the
    forward bound is below log(1 + 1/N): the reverse it returns is still a bound (B1 elsewhere, at least
    the W-based one), and the larger of the two directions is bit for bit the every-order computation's
    (every order computed) or within the sub-grid's tolerance above it and never below (on the sub-grid,
    whose anchors then follow the orders computed)."""
    rng = np.random.default_rng(seed)
    public = torch.from_numpy(_softmax(4.5 * rng.standard_normal(vocab)))
    teachers_t = torch.from_numpy(_softmax(4.5 * rng.standard_normal(vocab) + spread * rng.standard_normal((teachers, vocab))))
    from dpledger.mechanisms.kernels import mixed_teachers, mixing_weights
    output = mixed_teachers(teachers_t, public, mixing_weights(teachers_t, public, alpha, alpha * beta)).mean(dim=-2)
    for tolerance in (None, ADD_ONE_RELATIVE_TOLERANCE):
        args = (output, public, teachers, ORDERS, alpha, alpha * beta, None, tolerance)
        forward, reverse = add_one_direction_bounds(*args)
        pruned_forward, pruned_reverse = add_one_direction_bounds(*args, reverse_where_binding=True)
        assert np.array_equal(forward, pruned_forward)
        assert np.all(pruned_reverse >= reverse) or tolerance is not None and vocab >= ADD_ONE_SUBGRID_MIN_VOCABULARY
        full, pruned = np.maximum(forward, reverse), np.maximum(pruned_forward, pruned_reverse)
        if tolerance is None or vocab < ADD_ONE_SUBGRID_MIN_VOCABULARY:
            assert np.array_equal(full, pruned)
        else:
            every = add_one_divergence_bounds(output, public, teachers, ORDERS, alpha, alpha * beta,
                                              relative_tolerance=None).numpy()
            assert np.all(pruned >= every) and np.all(pruned <= (1.0 + tolerance) * every * (1.0 + 1e-12))
    default = add_one_divergence_bounds(output, public, teachers, ORDERS, alpha, alpha * beta).numpy()
    assert np.array_equal(default, np.maximum(*add_one_direction_bounds(
        output, public, teachers, ORDERS, alpha, alpha * beta, reverse_where_binding=True)))


def _forward_bound_in_mpmath(p, p0, n, orders, alpha, radius):
    """The forward add-one bound of add_one_direction_bounds' docstring, min(Jensen with U = min(U1, U2),
    the chord bound), written out in mpmath for the float vector p as given (its mass sum_j p_j, not 1,
    in Jensen's (p, p) term and on phi_k(0)); full-support laws. Shares no code with the package."""
    import mpmath
    mpmath.mp.prec = 160
    a, N = mpmath.mpf(alpha), mpmath.mpf(n)
    log_r = (a - 1) * mpmath.mpf(radius)
    P, P0 = [mpmath.mpf(float(x)) for x in p], [mpmath.mpf(float(x)) for x in p0]
    mass = mpmath.fsum(P)
    qmax = [min(mpmath.mpf(1), mpmath.exp((log_r + (a - 1) * mpmath.log(q)) / a)) for q in P0]
    t = [q / x for q, x in zip(qmax, P)]
    allocation, left = {}, mpmath.mpf(1)
    for j in sorted(range(len(P)), key=lambda j: -t[j]):   # the fractional knapsack, in exact arithmetic
        if left <= 0:
            break
        allocation[j] = min(qmax[j], left)
        left -= allocation[j]
    largest = max(mpmath.log(q / x) for q, x in zip(P0, P))
    log_m = max(mpmath.log(q / x) for q, x in zip(qmax, P0))
    values = []
    for k in orders:
        k = mpmath.mpf(float(k))
        rho = mpmath.mpf(radius) if k <= a else ((a - 1) * mpmath.mpf(radius) + (k - a) * log_m) / (k - 1)
        u2 = mpmath.log(mpmath.fsum(w * t[j] ** (k - 1) for j, w in allocation.items())) / (k - 1)
        jensen = mpmath.log(N / (N + 1) * mass + mpmath.exp((k - 1) * min(rho + largest, u2)) / (N + 1)) / (k - 1)
        phi = lambda x, k=k: ((N + x) / (N + 1)) ** k
        shares = {j: w / t[j] for j, w in allocation.items()}
        chord = mpmath.log((mass - mpmath.fsum(shares.values())) * phi(0)
                           + mpmath.fsum(c * phi(t[j]) for j, c in shares.items())) / (k - 1)
        values.append(min(jensen, chord))
    return values


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 40), st.sampled_from([1, 3, 8, 100]), st.sampled_from([2.0, 18.0]),
       st.sampled_from([1e-4, 0.01, 0.5]), st.sampled_from([0.0, 8 * 2.0 ** -53, 1e-12, 1e-9]))
def test_the_forward_bound_holds_for_a_float_law_above_mass_one(seed, vocab, teachers, alpha, radius, excess):
    """Records version 7's forward add-one bound is never below the mpmath value of its formula for the
    float law it is given, whose mass may exceed 1 (a float mean of teachers does by a few ulps): near
    order 1 the (p, p) term's mass and phi_k(0)'s weight matter most."""
    import mpmath
    rng = np.random.default_rng(seed)
    public = rng.dirichlet(np.full(vocab, 0.8))
    output = rng.dirichlet(np.full(vocab, 0.8)) * (1.0 + excess)
    orders = [1.01, 1.1, 1.5, 2.0, 7.0, 64.0]
    forward, _ = add_one_direction_bounds(torch.from_numpy(output), torch.from_numpy(public), teachers,
                                          torch.tensor(orders, dtype=torch.float64), alpha, radius, None, None)
    exact = _forward_bound_in_mpmath(output, public, teachers, orders, alpha, radius)
    for value, reference in zip(forward, exact):
        assert mpmath.mpf(float(value)) >= reference


def test_the_forward_bound_holds_for_the_reviewed_float_law():
    """The case an independent review found below its formula before the law's mass entered the weight
    of phi_k(0): p = (0.35, 0.15, 0.5) (1 + 1e-12), N = 100, alpha 2, radius 1e-4, k = 1.01."""
    import mpmath
    output, public = np.array([0.35, 0.15, 0.5]) * (1.0 + 1e-12), np.array([0.3, 0.2, 0.5])
    orders = [1.01, 1.1, 2.0]
    forward, _ = add_one_direction_bounds(torch.from_numpy(output), torch.from_numpy(public), 100,
                                          torch.tensor(orders, dtype=torch.float64), 2.0, 1e-4, None, None)
    for value, reference in zip(forward, _forward_bound_in_mpmath(output, public, 100, orders, 2.0, 1e-4)):
        assert mpmath.mpf(float(value)) >= reference


@pytest.mark.parametrize("log_t_range", [(-5.0, 0.0), (0.0, 3.0)])
def test_the_power_path_leaves_rows_and_orders_outside_its_analysis_to_the_exp_path(log_t_range):
    """Version 8's products need a_j, c_j <= 1 and orders k > 1 (fused.add_one_power_order_sums): a row
    with c_j = a_j / t_j > 1 (t_j < 1) and orders at or below 1 take version 7's exp path and agree with it
    bit for bit; on a row within the analysis, the orders above 1 on the lattice take the power path."""
    from dpledger.mechanisms.add_one import _AllocatedTokens

    rng = np.random.default_rng(1)
    log_allocation = np.log(rng.dirichlet(np.ones(20)))[None]
    log_t = np.sort(rng.uniform(*log_t_range, (1, 20)))[:, ::-1].copy()
    orders = np.array([0.5, 0.9, 1.0, 1.5, 2.0, 18.0])
    powers = _AllocatedTokens(log_allocation, log_t, 8.0, powers=True).order_sums(orders)
    exps = _AllocatedTokens(log_allocation, log_t, 8.0, powers=False).order_sums(orders)
    for with_powers, with_exps in zip(powers, exps):
        assert np.all(np.isfinite(with_powers))
        assert np.array_equal(with_powers[:, :3], with_exps[:, :3])
        if log_t_range[0] < 0:   # some c_j > 1: the whole row on the exp path
            assert np.array_equal(with_powers, with_exps)
        else:
            np.testing.assert_allclose(with_powers, with_exps, rtol=1e-12, atol=1e-13)


def _batch_of_ensembles(seed: int, rows: int, teachers: int, vocab: int, alpha: float, beta: float
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(outputs (rows, V), publics (rows, V)): each row an ensemble of its own spread around its public law,
    so the rows' sub-grids refine differently."""
    from dpledger.mechanisms.kernels import mixed_teachers, mixing_weights

    rng = np.random.default_rng(seed)
    public = torch.from_numpy(_softmax(4.5 * rng.standard_normal((rows, vocab))))
    outputs = []
    for row in range(rows):
        spread = rng.uniform(0.05, 3.0)
        laws = torch.from_numpy(_softmax(np.log(public[row].numpy()) + spread * rng.standard_normal((teachers, vocab))))
        lambdas = mixing_weights(laws, public[row], alpha, alpha * beta)
        outputs.append(mixed_teachers(laws, public[row], lambdas).mean(dim=-2))
    return torch.stack(outputs), public


@pytest.mark.parametrize("version", [9, 10])
@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 5), st.sampled_from([1, 2, 8, 100]), st.sampled_from([40, 700]),
       st.sampled_from([2.0, 6.0, 18.0]), st.floats(0.01, 0.3), st.booleans(), st.booleans())
def test_each_row_of_a_batch_gets_the_bound_it_gets_alone(version, seed, rows, teachers, vocab, alpha, beta, all_orders,
                                                           where_binding):
    """From records version 9 every row refines its own sub-grid: a decode block of steps gives each
    step bit for bit what the step gives alone (the audit replays one step per window at GPT-2 scale),
    whatever the rows beside it, in both directions and with W computed only where it can bind; version
    10's compiled rounds likewise."""
    output, public = _batch_of_ensembles(seed, rows, teachers, vocab, alpha, beta)
    args = (teachers, ORDERS.double(), alpha, alpha * beta, beta if all_orders else None, ADD_ONE_RELATIVE_TOLERANCE, 0)
    together = add_one_direction_bounds(output, public, *args, version=version, reverse_where_binding=where_binding)
    for row in range(rows):
        alone = add_one_direction_bounds(output[row], public[row], *args, version=version, reverse_where_binding=where_binding)
        for direction in range(2):
            assert np.array_equal(together[direction][row], alone[direction])
    # one public law (V,) for the whole batch: broadcast, each row as alone
    shared = add_one_direction_bounds(output, public[0], *args, version=version, reverse_where_binding=where_binding)
    for row in range(rows):
        alone = add_one_direction_bounds(output[row], public[0], *args, version=version, reverse_where_binding=where_binding)
        assert np.array_equal(shared[0][row], alone[0]) and np.array_equal(shared[1][row], alone[1])
    # a batch shaped (2, rows/2, V) too: rows are rows, whatever the batch's shape
    if rows % 2 == 0:
        shaped = add_one_direction_bounds(output.reshape(2, rows // 2, -1), public.reshape(2, rows // 2, -1), *args,
                                          version=version, reverse_where_binding=where_binding)
        assert np.array_equal(shaped[0].reshape(rows, -1), together[0])


def test_before_version_9_a_batch_shared_its_subgrid():
    """Versions 4 to 8 bisected an interval in every row where it failed in one, so a row's bound
    depended on its block (the audit's replay compares those traces' add-one values within the sub-grid's
    certificate where it replays a window shorter than the block: tests/test_replay_windows.py)."""
    output, public = _batch_of_ensembles(0, 4, 8, 700, 18.0, 0.2)
    args = (8, ORDERS.double(), 18.0, 3.6, None, ADD_ONE_RELATIVE_TOLERANCE, 0)
    together = add_one_direction_bounds(output, public, *args, version=8, reverse_where_binding=True)
    alone = np.stack([add_one_direction_bounds(output[r], public[r], *args, version=8, reverse_where_binding=True)[0]
                      for r in range(4)])
    assert not np.array_equal(together[0], alone)
    assert np.all(np.abs(together[0] - alone) <= ADD_ONE_RELATIVE_TOLERANCE * np.minimum(together[0], alone) * (1 + 1e-9))


def _sandwich_case(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Increasing orders, per-row anchors (first and last always), values and slopes at them: convex-like
    rows, rows with a +inf or NaN anchor, zeros, negative values, and rows sharing one set of anchors."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(2, 160))
    grid = np.cumsum(rng.uniform(0.01, 3.0, size)) + 1.0
    rows = int(rng.integers(1, 6))
    done = rng.random((rows, size)) < rng.uniform(0.05, 0.9)
    if seed % 3 == 0:
        done[:] = done[0]
    done[:, 0] = done[:, -1] = True
    values = np.log1p(grid)[None] * rng.uniform(0, 5, (rows, 1)) + rng.normal(0, 0.3, (rows, size))
    slopes = rng.normal(0, 2, (rows, size))
    values[rng.random((rows, size)) < 0.05] = 0.0
    values[rng.random((rows, size)) < 0.03] = np.inf
    values[rng.random((rows, size)) < 0.03] = np.nan
    slopes[rng.random((rows, size)) < 0.03] = np.nan
    return grid, done, np.where(done, values, np.nan), np.where(done, slopes, np.nan)


@pytest.mark.parametrize("seed", range(60))
def test_the_compiled_sandwich_equals_its_numpy_form(seed):
    """_sandwich (dpledger.mechanisms.fused.convex_sandwich) gives the numpy forms' numbers, element by element
    (NaN where they give NaN), for rows on their own anchors and on shared ones, with and without slopes."""
    from tests.straightforward import reference_convex_sandwich, reference_row_sandwich, row_geometry

    grid, done, values, slopes = _sandwich_case(seed)
    for tangents in (None, slopes):
        expected = reference_row_sandwich(grid, row_geometry(done), values, tangents, done)
        for got, want in zip(_sandwich(grid, done, values, tangents), expected):
            assert np.array_equal(got, want, equal_nan=True)
        if (done == done[0]).all():   # shared anchors: the sub-grid's form, `done` of shape (K,)
            anchors = np.flatnonzero(done[0])
            shared = reference_convex_sandwich(grid, anchors, values[:, anchors],
                                               None if tangents is None else tangents[:, anchors])
            for got, want in zip(_sandwich(grid, done[0], values, tangents), shared):
                assert np.array_equal(got, want, equal_nan=True)


def test_a_sandwich_row_needs_two_anchors():
    """A row with one anchor has no chord: refused in one line, never read past its anchors."""
    done = np.zeros((2, 5), dtype=bool)
    done[:, [0, 4]] = True
    done[1, 4] = False
    with pytest.raises(ValueError, match="at least two anchors"):
        _sandwich(np.arange(2.0, 7.0), done, np.zeros((2, 5)), None)


@pytest.mark.parametrize("seed", range(40))
def test_the_compiled_token_bounds_equal_their_numpy_form(seed):
    """dpledger.mechanisms.fused.add_one_token_bounds gives the numpy form's numbers byte for byte (its row
    maxima NaN where numpy's are), on laws with zeros on either side (-inf logs), a NaN, one-token laws and
    radii from 0 up."""
    from dpledger.mechanisms.fused import add_one_token_bounds
    from tests.straightforward import reference_token_bounds

    rng = np.random.default_rng(seed)
    rows, vocab = int(rng.integers(1, 4)), int(rng.choice([1, 2, 7, 300, 5000]))
    with np.errstate(divide="ignore"):
        log_p = np.log(_softmax(rng.normal(0, rng.uniform(0.1, 9), (rows, vocab))) * (rng.random((rows, vocab)) > 0.1))
        log_p0 = np.log(_softmax(rng.normal(0, rng.uniform(0.1, 9), (rows, vocab))) * (rng.random((rows, vocab)) > 0.1))
    if seed % 5 == 0:
        log_p[0, rng.integers(vocab)] = np.nan
    alpha = float(rng.choice([1.5, 2.0, 18.0, 64.0]))
    log_r = (alpha - 1.0) * float(rng.choice([0.0, 0.01, 3.6, 50.0]))
    outputs = [np.empty((rows, vocab)) for _ in range(3)] + [np.empty((rows, 6))]
    add_one_token_bounds(log_p, log_p0, alpha, log_r, *outputs)
    expected = reference_token_bounds(log_p, log_p0, alpha, log_r)
    for got, want in zip(outputs[:3], expected[:3]):
        assert got.tobytes() == want.tobytes()
    for column, want in enumerate(expected[3:]):
        assert np.array_equal(outputs[3][:, column], want, equal_nan=True)


@pytest.mark.parametrize("seed", range(30))
def test_the_compiled_compaction_equals_numpys_masks(seed):
    """dpledger.mechanisms.fused.allocated_tokens_of compacts a row as numpy's masks did: the tokens with a
    finite allocation, in order, byte for byte; whether one of their t is +inf; the largest |log a|."""
    from dpledger.mechanisms.fused import allocated_tokens_of

    rng = np.random.default_rng(seed)
    vocab = int(rng.choice([1, 5, 300, 4000]))
    log_a = np.where(rng.random(vocab) < rng.uniform(0, 1), np.log(rng.random(vocab)), -np.inf)
    log_a[rng.random(vocab) < 0.02] = np.nan
    log_t = rng.normal(0, 5, vocab)
    log_t[rng.random(vocab) < (0.02 if seed % 3 else 0.0)] = np.inf
    allocated = np.isfinite(log_a)
    la, lt, infinite, magnitude = allocated_tokens_of(log_a, log_t)
    assert la.tobytes() == log_a[allocated].tobytes() and lt.tobytes() == log_t[allocated].tobytes()
    assert infinite == bool(np.isposinf(log_t[allocated]).any())
    assert magnitude == np.abs(np.where(allocated, log_a, 0.0)).max()


def test_a_ball_limit_that_is_nan_stays_nan_and_the_bound_is_refused():
    """At an order alpha so large that (alpha - 1) radius and (alpha - 1) log p0 overflow to +inf and
    -inf, log qmax is NaN (as np.minimum keeps it), and the add-one bound refuses the NaN, as the numpy
    form did; a slope array of another shape than the values is refused, never read past its end."""
    from dpledger.mechanisms.fused import add_one_token_bounds
    from tests.straightforward import reference_token_bounds

    log_p, log_p0 = np.log([[0.03, 0.07, 0.34, 0.56]]), np.log([[0.33, 0.17, 0.28, 0.22]])
    alpha = 1.7e308
    outputs = [np.empty((1, 4)) for _ in range(3)] + [np.empty((1, 6))]
    add_one_token_bounds(log_p, log_p0, alpha, (alpha - 1.0) * 2.0, *outputs)
    expected = reference_token_bounds(log_p, log_p0, alpha, (alpha - 1.0) * 2.0)
    assert np.isnan(expected[0]).all() and np.array_equal(outputs[0], expected[0], equal_nan=True)
    with pytest.raises(ValueError, match="NaN"):
        add_one_direction_bounds(torch.tensor(np.exp(log_p[0])), torch.tensor(np.exp(log_p0[0])), 8,
                                 torch.tensor([2.0, 4.0]), alpha, 2.0)
    done = np.zeros(5, dtype=bool)
    done[[0, 4]] = True
    with pytest.raises(ValueError, match="slopes must have the values' shape"):
        _sandwich(np.arange(2.0, 7.0), done, np.zeros((3, 5)), np.zeros((1, 5)))
    with pytest.raises(ValueError, match="one order per value"):
        _sandwich(np.arange(2.0, 6.0), done, np.zeros((3, 5)), None)


@pytest.mark.parametrize("x", [-np.inf, -800.0, -40.0, -1e-300, 0.0, 1e-300, 1e-12, 0.3, 1.0, 35.0, 699.9, 700.0,
                               700.1, 1e4, np.inf, np.nan])
@pytest.mark.parametrize("n", [2.0, 9.0, 101.0])
def test_the_compiled_log_mean_agrees_with_the_numpy_form(x, n):
    """Version 10's log((n - 1 + e^x) / n), n = N + 1 >= 2 (the C library's functions), against the numpy
    form that version 9 takes and mpmath: within 4 ulps of the exact value (both sides of x = 700, where expm1 would overflow),
    exact 0 at x = 0, +inf at +inf, NaN at NaN."""
    from dpledger.mechanisms.fused import _log_mean_with_one_exp
    from dpledger.mechanisms.log_space import log_mean_with_one_exp

    compiled, numpy_form = _log_mean_with_one_exp(x, n), float(log_mean_with_one_exp(x, n))
    if np.isnan(x):
        assert np.isnan(compiled) and np.isnan(numpy_form)
        return
    mpmath.mp.dps = 50
    exact = float(mpmath.log1p(mpmath.expm1(mpmath.mpf(x)) / n)) if np.isfinite(x) else (
        np.inf if x > 0 else float(mpmath.log(mpmath.mpf(n - 1) / n)))
    for value in (compiled, numpy_form):
        if np.isfinite(exact):
            assert abs(value - exact) <= 4 * np.spacing(abs(exact)) + 1e-320
        else:
            assert value == exact
    if x == 0.0:
        assert compiled == 0.0


def test_a_trace_of_version_9_replays_with_version_9s_rounds(monkeypatch):
    """build_runner follows the records version that wrote a trace: the step asks the add-one bound for
    version 9's numpy rounds or version 10's compiled ones, and charges what that version gives."""
    import dpledger.mechanisms.add_one as add_one

    calls = []

    def recorded(*args, **kwargs):
        bound = add_one_divergence_bounds(*args, **kwargs)
        calls.append((args, kwargs, bound))
        return bound

    monkeypatch.setattr(add_one, "add_one_divergence_bounds", recorded)
    bounds = {}
    for version in (9, 10):
        calls.clear()
        outcome = _unscreened_block(11, version)[0]
        (args, kwargs, bound), = calls
        assert kwargs["version"] == version
        assert np.array_equal(outcome.add_one_bound, bound.numpy())
        bounds[version] = (args, kwargs, bound.numpy())
    args, kwargs, _ = bounds[9]   # the same law under the other version: within the certificate, never NaN
    other = add_one_divergence_bounds(*args, **{**kwargs, "version": 10}).numpy()
    assert np.all(np.abs(other - bounds[9][2]) <= ADD_ONE_RELATIVE_TOLERANCE * bounds[9][2])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([1, 2, 8, 100, 10**4, 10**6]), st.floats(0.1, 400.0))
def test_the_vectorised_shifts_are_within_their_stated_error_of_mpmath(seed, teachers, spread):
    """Version 10's shift_j = log((N + t_j) / (N + 1)) (dpledger.mechanisms.fused.add_one_shifts, vexp and
    vlog) against mpmath at 50 digits: every value within the bound the kernel returns, which is small
    (a few hundred unit roundoffs at most); and within 1e-14 absolute of version 9's numpy logaddexp."""
    from dpledger.mechanisms.fused import add_one_shifts

    mpmath.mp.dps = 50
    rng = np.random.default_rng(seed)
    log_t = np.concatenate([rng.normal(0.0, spread, 300), [0.0, np.log(teachers), -745.0, 709.0, -1e-300, 1e-300]])
    shifts = np.empty(log_t.size)
    bound = add_one_shifts(log_t, float(teachers), shifts)
    assert 0.0 < bound < 400 * 2.0 ** -53 * (1.0 + np.abs(log_t).max())
    n = mpmath.mpf(teachers)
    for x, value in zip(log_t, shifts):
        exact = mpmath.log((n + mpmath.exp(mpmath.mpf(float(x)))) / (n + 1))
        assert abs(mpmath.mpf(float(value)) - exact) <= bound, (x, value, float(exact))
    numpy_form = np.logaddexp(np.log(teachers), log_t) - np.log(teachers + 1.0)
    assert np.all(np.abs(shifts - numpy_form) <= 1e-14 * (1.0 + np.abs(log_t)))


@pytest.mark.parametrize("version", [9, 10])
def test_a_nan_all_orders_beta_is_refused(version):
    """Found in review: version 10 passed beta as NaN to mean "no all-orders ball", so a NaN beta gave the
    order-alpha ball's bound (an upper bound, but a NaN input must be refused, as version 9 refuses it)."""
    case = generated_case(5)
    with pytest.raises(ValueError, match="NaN"):
        add_one_direction_bounds(case["output"], case["public"], case["teachers"], ORDERS.double(), 6.0, 0.3,
                                 float("nan"), ADD_ONE_RELATIVE_TOLERANCE, 0, version)
