"""The fused kernels equal the straightforward implementations: exp/log within 2 ulps, Renyi
divergences and the add-one bound within 1e-12 relative of the previous numpy code, lambdas within
1e-6 of the torch Illinois solver and feasible, the sub-grid curve never below the exact one and
within its tolerance, and the public step API consistent across input types and batching."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given, settings, strategies as st
from numba import njit

from dpledger.accounting.curve import RdpCurve, compose_curves
from dpledger.accounting.orders import DEFAULT_ORDERS
from dpledger.accounting.relation import NeighbouringRelation
from tests.conftest import lm_like
from dpledger.mechanisms.adapmixed import AdaPMixED
from dpledger.mechanisms.divergence import renyi_divergence
from dpledger.mechanisms.distributions import FUSED_FROM_VOCABULARY, as_float64_array
from dpledger.mechanisms.fastmath import PAIR_MAX_ULPS, vexp, vexp_pair, vexpm1, vlog
from dpledger.mechanisms.add_one import add_one_divergence_bounds
from dpledger.mechanisms.kernels import (ball_mixing_weights, ball_mixing_weights_torch, leave_one_out_divergences_torch,
                                mixed_teachers, mixing_weights, renyi_divergence_orders,
                                renyi_divergence_orders_torch)
from dpledger.mechanisms.leave_one_out import leave_one_out_curve, leave_one_out_divergences
from dpledger.mechanisms.ball import Ball, all_orders_ball_constraints
from dpledger.mechanisms.pmixed import PMixED
from tests.oracles.renyi import symmetric_renyi_divergence as oracle_symmetric_renyi
from tests.straightforward import reference_add_one_bounds, reference_renyi_orders

GRID = np.asarray(DEFAULT_ORDERS)


@njit
def _map(function_id, values, out):
    for j in range(values.size):
        x = values[j]
        out[j] = vexp(x) if function_id == 0 else (vlog(x) if function_id == 1 else vexpm1(x))


def _apply(function_id: int, values: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    _map(function_id, values, out)
    return out


def test_vectorised_exp_log_expm1_are_within_a_few_ulps_and_keep_special_values():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-708, 709.7, 200_000), rng.uniform(-1, 1, 100_000), rng.uniform(-1e-9, 1e-9, 10_000)])
    got, want = _apply(0, x), np.exp(x)
    assert np.max(np.abs(got - want) / np.spacing(want)) <= 2
    y = np.concatenate([np.exp(rng.uniform(-744, 709, 200_000)), 1 + rng.uniform(-1e-8, 1e-8, 10_000), [5e-324, 1e-310]])
    got, want = _apply(1, y), np.log(y)
    nonzero = want != 0
    assert np.max(np.abs(got - want)[nonzero] / np.spacing(np.abs(want[nonzero]))) <= 2
    z = np.concatenate([rng.uniform(-30, 0, 100_000), rng.uniform(-1e-12, 1e-12, 10_000), rng.uniform(-0.6, 0.6, 10_000),
                        rng.uniform(-700, 700, 10_000)])
    got, want = _apply(2, z), np.expm1(z)
    assert np.max(np.abs(got - want) / np.maximum(np.spacing(np.abs(want)), 1e-320)) <= 3   # 2 ulps + the C library's
    np.testing.assert_array_equal(_apply(2, np.array([-np.inf, np.inf, np.nan, 0.0, -800.0])),
                                  [-1.0, np.inf, np.nan, 0.0, -1.0])
    special = np.array([-np.inf, np.inf, np.nan, 0.0, -745.2, 710.0])
    np.testing.assert_array_equal(_apply(0, special), [0.0, np.inf, np.nan, 1.0, 0.0, np.inf])
    np.testing.assert_array_equal(_apply(1, np.array([0.0, np.inf, -1.0, np.nan, 1.0])),
                                  [-np.inf, np.inf, np.nan, np.nan, 0.0])


@njit
def _pairs(values, up, down):
    for j in range(values.size):
        up[j], down[j] = vexp_pair(values[j])


def test_the_exp_pair_is_within_its_stated_ulps_of_extended_precision_and_keeps_special_values():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-708, 708, 400_000), rng.uniform(-1, 1, 200_000), rng.uniform(-1e-9, 1e-9, 10_000),
                        np.arange(-1000, 1001) * np.log(2.0) / 2])   # both ends of the reduced range
    up, down = np.empty_like(x), np.empty_like(x)
    _pairs(x, up, down)
    extended = x.astype(np.longdouble)    # 64-bit mantissa: the reference's own error is 1/2048 ulp
    for got, want in ((up, np.exp(extended)), (down, np.exp(-extended))):
        ulps = np.abs(got.astype(np.longdouble) - want) / np.spacing(want.astype(np.float64)).astype(np.longdouble)
        assert float(ulps.max()) <= PAIR_MAX_ULPS
    special = np.array([-np.inf, np.inf, np.nan, 0.0, -745.2, 710.0, -709.0, 709.0])
    up, down = np.empty_like(special), np.empty_like(special)
    _pairs(special, up, down)
    np.testing.assert_array_equal(up, [0.0, np.inf, np.nan, 1.0, 0.0, np.inf, 0.0, np.exp(709.0)])
    np.testing.assert_array_equal(down, [np.inf, 0.0, np.nan, 1.0, np.inf, 0.0, np.exp(709.0), 0.0])


distributions = st.integers(0, 2**31 - 1).map(lambda seed: np.random.default_rng(seed))


@settings(max_examples=40, deadline=None)
@given(distributions, st.integers(2, 300), st.floats(0.3, 6.0), st.booleans())
def test_fused_renyi_equals_the_numpy_reference(rng, vocab, temperature, holes):
    p = lm_like(rng, vocab, (3,), temperature)
    q = lm_like(rng, vocab, (), temperature)
    if holes:       # zeros in P (terms that add 0) and in Q where P is also 0
        p[:, : vocab // 3] = 0.0
        q[: vocab // 6] = 0.0
        p /= p.sum(axis=-1, keepdims=True)
        q /= q.sum()
    log_p, log_q = torch.log(torch.from_numpy(p)), torch.log(torch.from_numpy(q))
    orders = torch.from_numpy(GRID)
    fused = renyi_divergence_orders(log_p, log_q, orders).numpy()
    reference = reference_renyi_orders(log_p, log_q, orders).numpy()
    torch_form = renyi_divergence_orders_torch(log_p, log_q, orders).numpy()
    # equal up to the rounding allowance both carry (8 ulps per unit of magnitude, over a - 1)
    allowance = 1e-12 * (GRID + 1.0) / (GRID - 1.0) * (np.abs(np.log(p[p > 0])).max() + 2)
    assert np.all(np.abs(fused - reference) <= 1e-9 * reference + allowance)
    assert np.all(np.abs(torch_form - reference) <= 1e-9 * reference + allowance)


def test_fused_renyi_special_cases():
    orders = torch.tensor([2.0, 8.0])
    p = torch.log(torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64))
    q = torch.log(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    out = renyi_divergence_orders(q.expand(2, 3), p, orders).numpy()
    assert np.all(out[0] == 0.0)                      # identical laws: exactly 0
    assert np.all(np.isinf(out[1]) == False)  # noqa: E712 - q has no mass where p is 0 here
    assert np.all(np.isinf(renyi_divergence_orders(p[1:], q, orders).numpy()))   # mass outside Q's support
    with pytest.raises(ValueError, match="NaN"):
        renyi_divergence_orders(torch.tensor([[float("nan"), 0.0]]), torch.tensor([-0.7, -0.7]), orders)


def _ensemble(seed: int, teachers: int, vocab: int, spread: float = 1.0):
    rng = np.random.default_rng(seed)
    public_logits = 4.5 * rng.standard_normal(vocab)
    logits = public_logits + spread * rng.standard_normal((teachers, vocab))
    softmax = lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)
    return torch.from_numpy(softmax(logits)), torch.from_numpy(softmax(public_logits))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 12), st.integers(3, 1000), st.sampled_from([2.0, 6.0, 18.0, 3.5]),
       st.floats(0.001, 0.5), st.floats(0.2, 3.0))
def test_newton_solver_matches_illinois_and_is_feasible(seed, teachers, vocab, alpha, beta, spread):
    ensemble, public = _ensemble(seed, teachers, vocab, spread)
    radius = alpha * beta
    fused = mixing_weights(ensemble, public, alpha, radius).numpy()
    straightforward = ball_mixing_weights_torch(ensemble, public, (alpha,), (radius,)).numpy()
    np.testing.assert_allclose(fused, straightforward, rtol=0, atol=1e-6)
    mixed = fused[:, None] * ensemble.numpy() + (1 - fused[:, None]) * public.numpy()
    assert np.all(renyi_divergence(mixed, public.numpy(), alpha, symmetric=True) <= radius)
    # the fitted steps and Newton alone (records version < 6) stop within 1e-10 of the radius from
    # inside: their lambdas agree far below the replay's 1e-9
    newton = mixing_weights(ensemble, public, alpha, radius, solver_version=5).numpy()
    np.testing.assert_allclose(fused, newton, rtol=0, atol=1e-9)
    for row in mixed[:2]:     # inside the ball by the definition, in mpmath (an oracle sharing no code)
        assert oracle_symmetric_renyi(row, public.numpy(), alpha) <= radius


@pytest.mark.parametrize("seed", range(3))
def test_all_orders_ball_solver_matches_illinois_and_is_feasible(seed):
    ensemble, public = _ensemble(seed, 4, 200, 1.5)
    constraints = all_orders_ball_constraints(0.05)
    fused = ball_mixing_weights(ensemble, public, *constraints).numpy()
    straightforward = ball_mixing_weights_torch(ensemble, public, *constraints).numpy()
    np.testing.assert_allclose(fused, straightforward, rtol=0, atol=1e-6)
    lambdas = PMixED(2.0, 0.05, 4, ball=Ball.ALL_ORDERS).mixing_weights(ensemble.numpy(), public.numpy())
    mixed = lambdas[:, None] * ensemble.numpy() + (1 - lambdas[:, None]) * public.numpy()
    orders, radii, _ = constraints
    assert np.all(renyi_divergence(mixed, public.numpy(), list(orders), symmetric=True) <= np.asarray(radii))


def test_solver_edge_cases():
    ensemble, public = _ensemble(1, 3, 50)
    assert np.all(mixing_weights(ensemble, public, 6.0, 0.0).numpy() == 0.0)     # radius 0: the public model
    same = public.expand(2, -1).clone()
    assert np.all(mixing_weights(same, public, 6.0, 0.3).numpy() == 1.0)          # already inside: 1
    outside = public.clone()
    outside[0] = 0.0
    outside /= outside.sum()
    teacher = torch.stack([torch.roll(outside, 1), outside])
    lambdas = mixing_weights(teacher, outside, 6.0, 0.3).numpy()                   # mass where p0 has none
    assert lambdas[0] == 0.0 and lambdas[1] == 1.0


def test_an_infinite_max_divergence_radius_bounds_nothing_in_every_solver():
    """max_radius = inf is no D<->_inf bound: the torch solver once read D<->_inf - inf = NaN as feasible and
    returned lambda = 1 for a teacher without mass on a public token (D_2 = +inf there)."""
    public = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    teacher = torch.tensor([[0.0, 0.5, 0.5]], dtype=torch.float64)
    for solver in (ball_mixing_weights, ball_mixing_weights_torch):
        unbounded = solver(teacher, public, (2.0,), (10.0,), math.inf)
        np.testing.assert_allclose(unbounded.numpy(), solver(teacher, public, (2.0,), (10.0,), None).numpy(),
                                   rtol=0, atol=1e-9)
        lam = float(unbounded[0])
        assert lam < 1.0
        mixed = lam * teacher[0].numpy() + (1 - lam) * public.numpy()
        assert oracle_symmetric_renyi(mixed, public.numpy(), 2.0) <= 10.0


@pytest.mark.parametrize("orders, radii, max_radius, message", [
    ((2.0,), (float("nan"),), None, "ball radii must be >= 0, got nan"),
    ((2.0,), (-1.0,), None, "ball radii must be >= 0, got -1.0"),
    ((2.0,), (0.5,), float("nan"), "max_radius must be None or >= 0, got nan"),
    ((2.0,), (0.5,), -1.0, "max_radius must be None or >= 0, got -1.0"),
    ((float("nan"),), (0.5,), None, "ball orders must be finite and > 1, got nan"),
    ((0.5,), (0.5,), None, "ball orders must be finite and > 1, got 0.5"),
    ((2.0, 3.0), (0.5,), None, "the ball needs one radius per order, got 2 orders and 1 radii"),
])
def test_a_ball_argument_out_of_range_is_refused_in_one_line_not_read_as_feasible(orders, radii, max_radius, message):
    """Once the CPU solver returned lambda = 1 for a teacher away from p0 under a NaN or negative radius, a
    NaN order or an order below 1, and the torch solver for an order below 1."""
    public = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    teachers = torch.tensor([[0.0, 0.5, 0.5], [0.4, 0.3, 0.3]], dtype=torch.float64)
    for solver in (ball_mixing_weights, ball_mixing_weights_torch):
        with pytest.raises(ValueError, match=re.escape(message)):
            solver(teachers, public, orders, radii, max_radius)


@pytest.mark.parametrize("batch", [(3,), (2, 2)])
def test_cpu_solver_shares_one_public_law_across_a_batch_as_the_torch_solver_does(batch):
    """A (V,) public law against (..., N, V) teachers: every step's lambdas are those of that step alone
    (bit for bit) and agree with the torch solver, which broadcasts the same way."""
    rng = np.random.default_rng(7)
    public = torch.from_numpy(rng.dirichlet(np.ones(40)))
    teachers = torch.from_numpy(rng.dirichlet(np.ones(40), size=(*batch, 3)))
    shared = ball_mixing_weights(teachers, public, (6.0,), (0.3,))
    assert shared.shape == (*batch, 3)
    for index in np.ndindex(*batch):
        alone = ball_mixing_weights(teachers[index], public, (6.0,), (0.3,))
        assert torch.equal(shared[index], alone)
    np.testing.assert_allclose(shared.numpy(), ball_mixing_weights_torch(teachers, public, (6.0,), (0.3,)).numpy(),
                               rtol=0, atol=1e-6)
    one_row = ball_mixing_weights(teachers[(0,) * len(batch)], public[None], (6.0,), (0.3,))   # (1, V) beside (N, V)
    assert torch.equal(one_row, shared[(0,) * len(batch)])
    for solver in (ball_mixing_weights, ball_mixing_weights_torch):   # one rule, one message, in every solver
        with pytest.raises(ValueError, match=r"public of shape \(5, 40\) does not broadcast to the teachers' steps"):
            solver(teachers, torch.from_numpy(rng.dirichlet(np.ones(40), size=5)), (6.0,), (0.3,))


def test_the_cpu_input_check_takes_a_tensor_that_requires_grad_without_a_warning():
    """Found in review: reading aminmax's ends as Python floats warned for a grad tensor (PyTorch's
    "Converting a tensor with requires_grad=True to a scalar"); the check reads them detached."""
    import warnings

    teachers = torch.softmax(torch.randn(3, 2, 10, dtype=torch.float64), -1).requires_grad_()
    public = torch.softmax(torch.randn(3, 10, dtype=torch.float64), -1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lambdas = ball_mixing_weights(teachers, public, (2.0,), (0.5,))
    assert lambdas.shape == (3, 2)


@pytest.mark.parametrize("bad, message", [(float("nan"), "holds NaN or inf"), (float("inf"), "holds NaN or inf"),
                                          (-0.1, "holds a negative probability")])
@pytest.mark.parametrize("where", ["teachers", "public"])
def test_every_cpu_solver_refuses_a_bad_probability_in_one_line(bad, message, where):
    """Once an inf public entry gave lambdas 0 and a negative entry ordinary lambdas on the CPU."""
    teachers = torch.full((2, 4), 0.25, dtype=torch.float64)
    public = torch.full((4,), 0.25, dtype=torch.float64)
    (teachers[1] if where == "teachers" else public)[2] = bad
    for solver in (ball_mixing_weights, ball_mixing_weights_torch):
        with pytest.raises(ValueError, match=f"mixing weights: an input distribution {message}"):
            solver(teachers, public, (6.0,), (0.3,))


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 10), st.integers(3, 300), st.floats(0.1, 2.0))
def test_leave_one_out_fused_equals_the_torch_form(seed, teachers, vocab, spread):
    ensemble, public = _ensemble(seed, teachers, vocab, spread)
    lambdas = torch.from_numpy(np.random.default_rng(seed).uniform(0, 1, teachers))
    mixed = mixed_teachers(ensemble, public, lambdas)
    orders = torch.from_numpy(GRID)
    fused = leave_one_out_divergences(mixed, orders).numpy()
    straightforward = leave_one_out_divergences_torch(mixed, orders).numpy()
    # the torch form takes log p - log p_-i (a difference of logs); the kernel logs the ratio itself
    slack = 1e-12 * (GRID + 1) / (GRID - 1) * (np.abs(np.log(mixed.mean(0).numpy())).max() + teachers + 2)
    assert np.all(np.abs(fused - straightforward) <= 1e-9 * straightforward + slack)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 12), st.integers(3, 500), st.floats(0.1, 2.5),
       st.sampled_from([0.001, 0.005, 0.02]))
@example(378522, 6, 272, 0.5, 0.001)
def test_sub_grid_curve_is_never_below_the_exact_curve_and_within_its_tolerance(seed, teachers, vocab, spread,
                                                                                 tolerance):
    ensemble, public = _ensemble(seed, teachers, vocab, spread)
    lambdas = mixing_weights(ensemble, public, 18.0, 3.6)
    bounded, exact_mask, output = leave_one_out_curve(ensemble, public, lambdas, GRID, tolerance)
    exact, all_exact, _ = leave_one_out_curve(ensemble, public, lambdas, GRID, None)
    assert all_exact.all() and exact_mask[[0, -1]].all()
    assert np.all(bounded >= exact)
    assert np.all(bounded <= exact * (1 + tolerance) + 1e-12)
    # at an order evaluated exactly the maximum may still be a stand-in's chord (a teacher not evaluated
    # there, above the evaluated ones by its rounding allowance: seed 378522, 7e-13 relative at order 128)
    np.testing.assert_allclose(bounded[exact_mask], exact[exact_mask], rtol=1e-11, atol=0)
    np.testing.assert_allclose(output.numpy(), mixed_teachers(ensemble, public, lambdas).mean(dim=-2).numpy(),
                               rtol=1e-13)
    # and the same machinery against the torch form, every teacher and order
    torch_form = leave_one_out_divergences_torch(mixed_teachers(ensemble, public, lambdas),
                                                 torch.from_numpy(GRID)).amax(dim=-2).numpy()
    np.testing.assert_allclose(exact, torch_form, rtol=1e-6, atol=1e-12)


def test_sub_grid_curve_is_infinite_or_zero_where_the_exact_one_is():
    ensemble, public = _ensemble(3, 3, 40)
    identical = public.expand(3, -1).clone()
    values, _, _ = leave_one_out_curve(identical, public, torch.ones(3), GRID)
    assert np.all(values == 0.0)
    holder = ensemble.clone()
    holder[0, 5], holder[1:, 5] = 0.3, 0.0          # teacher 0 alone holds token 5
    holder /= holder.sum(-1, keepdim=True)
    values, _, _ = leave_one_out_curve(holder, public, torch.ones(3), GRID)
    assert np.all(np.isinf(values))


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 20), st.integers(3, 300), st.sampled_from([2.0, 6.0, 18.0]),
       st.floats(0.01, 0.3), st.booleans())
def test_fused_add_one_bound_equals_the_numpy_reference(seed, teachers, vocab, alpha, beta, all_orders):
    ensemble, public = _ensemble(seed, teachers, vocab)
    lambdas = mixing_weights(ensemble, public, alpha, alpha * beta)
    output = mixed_teachers(ensemble, public, lambdas).mean(dim=-2)
    orders = torch.from_numpy(GRID)
    beta_all = beta if all_orders else None
    # every order computed: the fused sums against the reference's (the sub-grid: tests/test_add_one_subgrid.py)
    fused = add_one_divergence_bounds(output, public, teachers, orders, alpha, alpha * beta, beta_all,
                                      relative_tolerance=None).numpy()
    reference = reference_add_one_bounds(output, public, teachers, orders, alpha, alpha * beta, beta_all).numpy()
    # the reference sums the chord in the expm1 form with the mass-excess allowance (records version < 7),
    # the package the weighted form with the worst-case summation allowance: the same bound within the
    # replay's 1e-9 (both within their allowances of it)
    np.testing.assert_allclose(fused, reference, rtol=1e-9)


def test_step_api_takes_numpy_or_torch_batched_or_not_and_charges_what_the_runner_records():
    ensemble, public = _ensemble(5, 4, 300)
    mechanism = AdaPMixED(PMixED(18.0, 0.2, 4), AdaPMixED.paper_defaults(4).screening)
    batch_t, batch_p = torch.stack([ensemble, ensemble.roll(1, dims=-1)]), torch.stack([public, public.roll(1)])
    batched = mechanism.step(batch_t, batch_p, torch.Generator().manual_seed(3))
    from_numpy = mechanism.step(batch_t.numpy(), batch_p.numpy(), torch.Generator().manual_seed(3))
    for key in ("pmixed_data_dependent", "screen"):
        np.testing.assert_array_equal(batched.charged[key], from_numpy.charged[key])
    single = mechanism.step(ensemble, public, torch.Generator().manual_seed(3))
    np.testing.assert_allclose(single.lambdas.numpy(), batched.lambdas[0].numpy(), atol=0)
    np.testing.assert_allclose(single.charged["pmixed_data_dependent"], batched.charged["pmixed_data_dependent"][0])
    assert batched.output.shape == (2, 300) and batched.screen_passed.shape == (2,)
    assert batched.charged["pmixed_data_dependent"].shape == (2, len(DEFAULT_ORDERS))
    np.testing.assert_allclose(batched.total, batched.charged["screen"] + batched.charged["pmixed_data_dependent"])
    # the data-dependent charge covers add-or-remove: at least Eq. 3 and the add-one bound
    mixed = mixed_teachers(ensemble, public, single.lambdas)
    eq3 = leave_one_out_divergences(mixed, torch.from_numpy(GRID)).amax(dim=-2).numpy()
    added = add_one_divergence_bounds(mixed.mean(-2), public, 4, torch.from_numpy(GRID), 18.0, 3.6).numpy()
    assert np.all(single.charged["pmixed_data_dependent"] >= np.maximum(eq3, added) * (1 - 1e-12))
    plain = PMixED(6.0, 0.05, 4).step(ensemble.numpy(), public.numpy())
    np.testing.assert_allclose(plain.charged["pmixed_theorem_3_1"], PMixED(6.0, 0.05, 4).rdp_values(GRID))
    with pytest.raises(ValueError, match="screening draws"):
        mechanism.step(ensemble, public)
    with pytest.raises(ValueError, match="N=4"):
        mechanism.step(ensemble[:3], public, torch.Generator())


def test_compose_curves_equals_sequential_addition_and_the_grid_cache_is_not_fooled():
    rng = np.random.default_rng(0)
    values = rng.uniform(0, 1, (50, len(DEFAULT_ORDERS)))
    curves = [RdpCurve(DEFAULT_ORDERS, v) for v in values]
    total = compose_curves(curves)
    sequential = curves[0]
    for curve in curves[1:]:
        sequential = sequential + curve
    np.testing.assert_allclose(total.values, sequential.values, rtol=1e-14)
    shuffled = tuple(reversed(DEFAULT_ORDERS))          # same orders, another order: values move with them
    curve = RdpCurve(shuffled, np.arange(len(shuffled), dtype=float))
    assert curve.value_at(shuffled[0]) == 0.0 and curve.orders == DEFAULT_ORDERS
    with pytest.raises(ValueError, match="NaN"):
        RdpCurve(DEFAULT_ORDERS, np.full(len(DEFAULT_ORDERS), np.nan))
    with pytest.raises(ValueError, match=">= 0"):
        RdpCurve(DEFAULT_ORDERS, np.full(len(DEFAULT_ORDERS), -1.0))
    remove = RdpCurve(DEFAULT_ORDERS, values[0], NeighbouringRelation.REMOVE_ONE)
    assert compose_curves([curves[0], remove]).relation is NeighbouringRelation.REMOVE_ONE


def _run_epsilon_ratios(ensemble, public, lambdas):
    from dpledger.accounting.conversion import epsilon_from_rdp

    bounded, _, _ = leave_one_out_curve(ensemble, public, lambdas, GRID)
    exact, _, _ = leave_one_out_curve(ensemble, public, lambdas, GRID, None)
    ratios = []
    for steps in (1, 30, 1000, 100_000):
        ratios.append(epsilon_from_rdp(RdpCurve(DEFAULT_ORDERS, bounded * steps), 1e-5).epsilon
                      / epsilon_from_rdp(RdpCurve(DEFAULT_ORDERS, exact * steps), 1e-5).epsilon)
    return np.asarray(ratios)


def test_run_epsilon_from_the_sub_grid_is_within_one_percent_at_demo_scale():
    ensemble, public = _ensemble(0, 8, 1024)
    ratios = _run_epsilon_ratios(ensemble, public, mixing_weights(ensemble, public, 18.0, 3.6))
    assert np.all(ratios >= 1.0) and np.all(ratios <= 1.01)


@pytest.mark.slow
def test_run_epsilon_from_the_sub_grid_is_within_one_percent_at_paper_scale():
    ensemble, public = _ensemble(0, 100, 50257)
    ratios = _run_epsilon_ratios(ensemble, public, mixing_weights(ensemble, public, 18.0, 3.6))
    assert np.all(ratios >= 1.0) and np.all(ratios <= 1.01)
    assert math.isfinite(float(ratios.max()))


@pytest.mark.parametrize("orders", [[2.0], [2.0, 3.0], [1.5, 2.0, 4.0, 8.0, 16.0]])
def test_sub_grid_curve_on_grids_of_a_few_orders_is_exact(orders):
    ensemble, public = _ensemble(2, 4, 50)
    lambdas = mixing_weights(ensemble, public, 6.0, 0.3)
    with np.errstate(all="raise"):
        values, exact, _ = leave_one_out_curve(ensemble, public, lambdas, orders)
    reference, _, _ = leave_one_out_curve(ensemble, public, lambdas, orders, None)
    assert exact.all() or len(orders) > 4
    assert np.all(values >= reference) and np.all(values <= reference * 1.005)


_WIDTH_PROBE = """
import json, os, numpy as np, torch
from dpledger.mechanisms.kernels import mixing_weights
from dpledger.mechanisms.leave_one_out import leave_one_out_curve
rng = np.random.default_rng(0)
z = 4.5 * rng.standard_normal(300)
soft = lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)
teachers, public = torch.from_numpy(soft(z + rng.standard_normal((5, 300)))), torch.from_numpy(soft(z))
lambdas = mixing_weights(teachers, public, 18.0, 3.6)
exact = leave_one_out_curve(teachers, public, lambdas, [1.5, 2.0, 8.0, 64.0], None)[0]
print(json.dumps({"features": os.environ.get("NUMBA_CPU_FEATURES", ""), "lambdas": lambdas.tolist(),
                  "exact": exact.tolist()}))
"""


@pytest.mark.slow  # spawns fresh interpreters that compile the numba kernels twice: ~20 s
def test_wide_vectors_are_chosen_before_numba_loads_and_do_not_change_the_numbers():
    import json
    import os
    import subprocess
    import sys

    outputs = {}
    for bits in ("512", "256"):
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_CPU_FEATURES" and k != "NUMBA_CPU_NAME"}
        env["DPLEDGER_VECTOR_BITS"] = bits
        done = subprocess.run([sys.executable, "-c", _WIDTH_PROBE], env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[bits] = json.loads(done.stdout.strip().splitlines()[-1])
    assert "-prefer-256-bit" not in outputs["256"]["features"]
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    if "+avx512f" in llvm.get_host_cpu_features().flatten().split(","):
        assert outputs["512"]["features"].endswith("-prefer-256-bit")
    np.testing.assert_allclose(outputs["512"]["lambdas"], outputs["256"]["lambdas"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(outputs["512"]["exact"], outputs["256"]["exact"], rtol=1e-12)


def _mpmath_leave_one_out(mixed: np.ndarray, order: float) -> float:
    """max_i max(D_a(p || p_-i), D_a(p_-i || p)) at 60 digits, written from Eq. 3 directly."""
    import mpmath

    mpmath.mp.dps = 60
    rows = [[mpmath.mpf(float(v)) for v in row] for row in mixed]
    n, a = len(rows), mpmath.mpf(order)
    p = [sum(row[j] for row in rows) / n for j in range(len(rows[0]))]
    worst = mpmath.mpf(0)
    for i in range(n):
        q = [sum(rows[k][j] for k in range(n) if k != i) / (n - 1) for j in range(len(p))]
        for x, y in ((p, q), (q, p)):
            total = sum(xj ** a * yj ** (1 - a) for xj, yj in zip(x, y) if xj > 0)
            worst = max(worst, mpmath.log(total) / (a - 1))
    return worst


def test_review_cases_mixtures_subnormal_public_and_the_fast_path_boundary_are_not_under_stated():
    # 1. lam ~ 1 beside a large public probability: a regrouped mixture lost every digit (was 0)
    public = torch.tensor([0.5, 0.5], dtype=torch.float64)
    teachers = torch.tensor([[1e-20, 1 - 1e-20], [2e-20, 1 - 2e-20]], dtype=torch.float64)
    lambdas = mixing_weights(teachers, public, 6.0, 60.0)
    mixed = mixed_teachers(teachers, public, lambdas).numpy()
    grid = np.asarray([2.0, 64.0, 1024.0])
    fused = leave_one_out_curve(teachers, public, lambdas, grid, None)[0]
    assert all(fused[k] >= float(_mpmath_leave_one_out(mixed, a)) for k, a in enumerate(grid))
    # 2. a subnormal public probability: the float mixture must stay inside the ball
    public = torch.tensor([1.0, 5e-324], dtype=torch.float64)
    teachers = torch.tensor([[1.0, 0.0], [0.75, 0.25]], dtype=torch.float64)
    for order, radius in ((100.0, 1.0), (6.0, 1e-3)):
        lambdas = mixing_weights(teachers, public, order, radius)
        mixed = mixed_teachers(teachers, public, lambdas).numpy()
        assert np.all(renyi_divergence(mixed, public.numpy(), order, symmetric=True) <= radius)
    # 3. the one-exp fast path near its range limit (a * span of log rho ~ 560)
    for x in np.geomspace(1e-262, 1e-240, 8):
        mixed = torch.tensor([[1.0 - x, x], [2.7085e-06, 1 - 2.7085e-06]], dtype=torch.float64)
        value = leave_one_out_curve(mixed, torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64),
                                    [1.0001], None)[0][0]
        assert value >= float(_mpmath_leave_one_out(mixed.numpy(), 1.0001))


def _subnormal_ensemble(rng):
    """Teachers and a public model whose entries are often subnormal (below 2.2e-308): their ratios
    can leave the normal range, and sums of them keep only a few bits unless scaled."""
    teachers, vocab = int(rng.integers(2, 5)), int(rng.integers(3, 8))
    ensemble = rng.random((teachers, vocab))
    tiny = rng.random((teachers, vocab)) < 0.5
    ensemble[tiny] = 10.0 ** rng.uniform(-323, -300, size=int(tiny.sum()))
    public = rng.random(vocab)
    tiny = rng.random(vocab) < 0.5
    public[tiny] = 10.0 ** rng.uniform(-323, -300, size=int(tiny.sum()))
    lambdas = np.ones(teachers) if rng.random() < 0.5 else rng.random(teachers)
    return ensemble / ensemble.sum(axis=1, keepdims=True), public / public.sum(), lambdas


def test_eq3_with_subnormal_entries_is_never_below_the_exact_value():
    """Eq. 3 (exact everywhere, and the decode loop's sub-grid curve) at orders 1.1 to 1024 against
    the 50-digit oracle mixing the same float inputs exactly. Before the kernels scaled tiny inputs
    and took out-of-range ratios from logs, this came out up to 3e-6 relative below (an input with a
    subnormal ratio p_-i / p, whose float keeps a few bits)."""
    import mpmath

    from dpledger.mechanisms.adapmixed import data_dependent_pmixed_values
    from tests.oracles import leave_one_out_losses

    rng = np.random.default_rng(2024)
    orders = np.array([1.1, 2.0, 6.0, 32.0, 1024.0])
    for _ in range(120):
        ensemble, public, lambdas = _subnormal_ensemble(rng)
        exact_values = data_dependent_pmixed_values(ensemble, public, lambdas, orders)
        refined, _, _ = leave_one_out_curve(torch.from_numpy(ensemble), torch.from_numpy(public),
                                            torch.from_numpy(lambdas), orders)
        with mpmath.workdps(50):
            for order, value, charged in zip(orders, exact_values, refined):
                oracle = max(leave_one_out_losses(ensemble, public, lambdas, float(order)))
                assert mpmath.mpf(float(value)) >= oracle, (order, value, float(oracle))
                assert mpmath.mpf(float(charged)) >= oracle, (order, charged, float(oracle))


@pytest.mark.parametrize("vocab", [FUSED_FROM_VOCABULARY - 1, FUSED_FROM_VOCABULARY])
def test_validation_is_the_same_on_both_sides_of_the_fused_kernel(vocab):
    rng = np.random.default_rng(4)
    rows = lm_like(rng, vocab, (3,), 2.0) * (1 + 5e-5)          # sums off 1 within the tolerance
    normalised = as_float64_array("teachers", rows)
    np.testing.assert_allclose(normalised, rows / rows.sum(axis=-1, keepdims=True), rtol=4e-16 * np.log2(vocab), atol=0)
    for bad, message in ((np.nan, "must not contain NaN"), (np.inf, "must be finite"),
                         (-0.25, "must be non-negative, got entry -0.25")):
        broken = rows.copy()
        broken[1, 7] = bad
        with pytest.raises(ValueError, match=message):
            as_float64_array("teachers", broken)
    with pytest.raises(ValueError, match="must sum to 1 along the last axis within 0.0001, off by 0.01"):
        as_float64_array("teachers", rows / rows.sum(axis=-1, keepdims=True) * 1.01)


@pytest.mark.parametrize("kind", ["pmixed", "adapmixed"])
def test_a_trace_replays_with_the_solver_of_the_code_that_wrote_it(kind):
    from dpledger.decoding.runners import build_runner
    from dpledger.mechanisms.randomness import StepGenerators

    ensemble, public = _ensemble(4, 6, 3000, 1.0)
    table = dict(type=kind, alpha=18.0, beta=0.2)
    if kind == "adapmixed":
        table.update(lam=1e-4, sigma=1e-2, threshold=4.5, top_k=8, screening=False)
    from dpledger.mechanisms.step import as_ensemble

    checked_teachers, checked_public = as_ensemble(ensemble[None], public[None], 6)   # the step's own inputs
    replayed = {}
    for version in (5, 6, 7, 8):
        runner = build_runner(dict(table), 6, "add_or_remove_one", records_version=version)
        assert "solver_version" not in runner.params      # never a config key: the manifest check is unchanged
        replayed[version] = runner.process(public[None], ensemble[None], StepGenerators.for_steps(1, 0, 1), GRID).lambdas[0]
        assert np.array_equal(replayed[version], mixing_weights(checked_teachers, checked_public, 18.0, 3.6,
                                                                solver_version=min(version, 7)).numpy()[0])
    assert not np.array_equal(replayed[5], replayed[6])     # the solvers' last bits differ on this ensemble
    np.testing.assert_allclose(replayed[6], replayed[7], rtol=0, atol=1e-9)   # powers by products: same ball
    assert np.array_equal(replayed[7], replayed[8])         # a later version solves as the latest solver does


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 12), st.integers(2, 2000), st.floats(0.2, 3.0),
       st.sampled_from([0.005, 0.05, 1e-6]), st.sampled_from(["default", "short", "irregular"]))
def test_the_compiled_refinement_gives_the_numpy_refinement_bit_for_bit(seed, teachers, vocab, spread, tolerance,
                                                                        grid_kind):
    from dpledger.mechanisms.kernels import _LeaveOneOut
    from dpledger.mechanisms.leave_one_out import _refined_curve
    from tests.straightforward import reference_refined_curve

    ensemble, public = _ensemble(seed, teachers, vocab, spread)
    lambdas = np.random.default_rng(seed).uniform(0.0, 1.0, teachers)
    if seed % 5 == 0:
        lambdas[:] = 0.0          # every mixed teacher the public model: every divergence 0
    grid = {"default": GRID, "short": np.array([1.5, 2.0, 8.0]),
            "irregular": np.sort(np.random.default_rng(seed).uniform(1.01, 300.0, 40))}[grid_kind]
    ratios = _LeaveOneOut(ensemble.numpy(), public.numpy(), lambdas)
    compiled = _refined_curve(ratios, teachers, grid, tolerance)
    reference = reference_refined_curve(ratios, teachers, grid, tolerance)
    np.testing.assert_array_equal(compiled[1], reference[1])
    np.testing.assert_array_equal(compiled[0], reference[0])


def test_kernel_threads_follow_the_setting_on_every_call(monkeypatch):
    """_set_threads skips numba's call when this thread already has the count, yet still follows a
    changed $DPLEDGER_KERNEL_THREADS, per Python thread, and leaves torch's pool as it was."""
    import threading

    from numba import config, get_num_threads

    from dpledger.mechanisms.kernels import _set_threads

    torch_threads = torch.get_num_threads()
    most = min(2, config.NUMBA_NUM_THREADS)
    for wanted, expected in (("1", 1), ("2", most), ("2", most), ("1", 1)):
        monkeypatch.setenv("DPLEDGER_KERNEL_THREADS", wanted)
        _set_threads()
        assert get_num_threads() == expected
        assert torch.get_num_threads() == torch_threads
    from numba import set_num_threads

    set_num_threads(most)          # changed behind dpledger's back: the next kernel still gets the setting
    _set_threads()
    assert get_num_threads() == 1
    # a new thread starts at numba's default (every core): it must be given 1 although this thread has 1
    seen = []

    def other() -> None:
        _set_threads()
        seen.append(get_num_threads())

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    assert seen == [1]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 60), st.sampled_from([2, 3, 5, 17, 18, 33, 64, 100, 257, 1000, 4096]),
       st.floats(0.0, 1.0), st.floats(0.1, 4.0))
def test_integer_order_sums_are_within_their_stated_ulps_of_mpmath(seed, vocab, order, lam, spread):
    """The solver's power path (fused._integer_order_sums) against the four sums written out in mpmath
    from their definition (sharing no code): each within (6 a + V) ulps of the sum of its terms'
    magnitudes (the docstring's product bound plus a sum's rounding), wherever the caller lets it run
    ((r_min / r_max)^a a normal float)."""
    import mpmath
    from dpledger.mechanisms.fused import _integer_order_sums

    rng = np.random.default_rng(seed)
    public = rng.dirichlet(np.full(vocab, 0.5))
    ratio = np.exp(spread * rng.standard_normal(vocab))
    keep = 1.0 - lam
    mpmath.mp.prec = 120
    # r_j = fma(lam, ratio_j, keep): the exact value rounded once
    mixed = np.array([float(mpmath.mpf(lam) * mpmath.mpf(x) + mpmath.mpf(keep)) for x in ratio])
    high, low = mixed.max(), mixed.min()
    assume(low > 0.0 and order * (math.log(high) - math.log(low)) < 600.0)
    got = _integer_order_sums(order, lam, keep, high, low, ratio, public)
    t = [mpmath.mpf(m) / mpmath.mpf(high) for m in mixed]
    s = [mpmath.mpf(low) / mpmath.mpf(m) for m in mixed]
    weight = [mpmath.mpf(w) for w in public]
    excess = [w * (mpmath.mpf(x) - 1) for w, x in zip(weight, ratio)]
    terms = ([w * ti ** order for w, ti in zip(weight, t)], [e * ti ** (order - 1) for e, ti in zip(excess, t)],
             [w * si ** (order - 1) for w, si in zip(weight, s)], [e * si ** order for e, si in zip(excess, s)])
    ulps = (6 * order + vocab) * 2.0 ** -53
    for value, sum_terms in zip(got, terms):
        magnitude = mpmath.fsum(abs(term) for term in sum_terms)
        assert abs(mpmath.mpf(value) - mpmath.fsum(sum_terms)) <= ulps * magnitude + mpmath.mpf(1e-300)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(2, 8), st.integers(3, 3000), st.sampled_from([2.0, 6.0, 18.0, 64.0]),
       st.floats(0.001, 0.5), st.floats(0.2, 3.0))
def test_integer_powers_solve_the_ball_as_exp_and_log_do(seed, teachers, vocab, alpha, beta, spread):
    """Records version 7's solver (powers by products at integer orders) against version 6's (exp and
    log): both feasible in float64 and in mpmath, lambdas within the replay's 1e-9."""
    ensemble, public = _ensemble(seed, teachers, vocab, spread)
    radius = alpha * beta
    powers = mixing_weights(ensemble, public, alpha, radius, solver_version=7).numpy()
    logs = mixing_weights(ensemble, public, alpha, radius, solver_version=6).numpy()
    np.testing.assert_allclose(powers, logs, rtol=0, atol=1e-9)
    mixed = powers[:, None] * ensemble.numpy() + (1 - powers[:, None]) * public.numpy()
    assert np.all(renyi_divergence(mixed, public.numpy(), alpha, symmetric=True) <= radius)
    assert oracle_symmetric_renyi(mixed[0], public.numpy(), alpha) <= radius


@pytest.mark.parametrize("seed", range(20))
def test_finite_magnitude_equals_numpys_masks(seed):
    """dpledger.mechanisms.fused.finite_magnitude: the largest |x| over the finite entries (0 for none) and
    whether a NaN is present, as _LeaveOneOut formed them with numpy's masks."""
    from dpledger.mechanisms.fused import finite_magnitude

    rng = np.random.default_rng(seed)
    size = int(rng.choice([0, 1, 9, 5000]))
    values = rng.normal(0, 50, size)
    for special in (np.inf, -np.inf, np.nan):
        values[rng.random(size) < 0.05] = special
    checked = rng.random(size)
    if seed % 2:
        checked[rng.random(size) < 0.01] = np.nan
    finite = values[np.isfinite(values)]
    assert finite_magnitude(values, checked) == (float(np.abs(finite).max()) if finite.size else 0.0,
                                                 bool(np.isnan(checked).any()))
