"""dpledger.mechanisms.add_one (the Lagrangian dual add-one bound and the primal adversary) against the
brute-force worst case of tests/oracles/add_one_worst_case.py (which shares no code with the package).

What must hold, on generated PMixED ensembles (V = 2..6, N = 1..8, alpha in {1.5, 2, 4, 18}, both
balls; tests.test_add_one_bound draws them):
  (a) the dual bound, in EACH direction, is never below the oracle's worst case of that direction
      (weak duality, Boyd & Vandenberghe 2004, Section 5.1.3; the oracle's q are verified in the ball
      at 40 digits), also at orders reached by the chord between dual orders;
  (b) what is charged, add_one_divergence_bounds(dual=True), is never above the closed form
      (dual=False) and never below the oracle;
  (c) the adversary's q lies in the ball (checked by the oracle at 40 digits) and its exact
      divergence (40 digits) is at most the dual bound;
  (d) bad input (NaN, negative entries, orders <= 1) is a ValueError.
The certified primitives' error allowances are checked against mpmath at random points.
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

from dpledger.accounting.orders import DEFAULT_ORDERS
from dpledger.mechanisms.add_one import (_ball_certified, _f_certified, add_one_adversary, add_one_gap, dual_add_one_bounds,
                                dual_orders, token_box)
from dpledger.mechanisms.add_one import add_one_direction_bounds, add_one_divergence_bounds
from dpledger.mechanisms.pmixed import Ball
from tests.oracles.add_one_worst_case import divergences_at, in_ball, worst_cases
from tests.test_add_one_bound import (ABSOLUTE_SLACK, FAST_EFFORT, RELATIVE_SLACK, Case, evaluated_seeded, make_case,
                                      seeded_case)

DUAL_CASES = {Ball.PROJECTION_ORDER: 10, Ball.ALL_ORDERS: 4}
"""Seeded cases (tests.test_add_one_bound's sweep, oracle results cached across both files)."""
SLOW_DUAL_CASES = {Ball.PROJECTION_ORDER: 300, Ball.ALL_ORDERS: 80}


def beta_of(case: Case):
    return case.beta if case.ball is Ball.ALL_ORDERS else None


def dual_of(case: Case, orders=None):
    orders = case.orders if orders is None else orders
    return dual_add_one_bounds(case.output, case.public, case.teachers, np.asarray(orders, dtype=np.float64),
                               case.alpha, case.radius, beta_of(case), details=True)


def below(bound: float, worst: float) -> bool:
    """The bound is below the oracle beyond the oracle's own float error (tests.test_add_one_bound)."""
    return bound < worst * (1.0 - RELATIVE_SLACK) - ABSOLUTE_SLACK


def check_case(case: Case, forward_worst, reverse_worst) -> None:
    forward, reverse, details = dual_of(case)
    orders_t = torch.tensor(case.orders, dtype=torch.float64)
    closed = add_one_divergence_bounds(torch.from_numpy(case.output), torch.from_numpy(case.public), case.teachers,
                                       orders_t, case.alpha, case.radius, beta_of(case)).numpy()
    charged = add_one_divergence_bounds(torch.from_numpy(case.output), torch.from_numpy(case.public), case.teachers,
                                        orders_t, case.alpha, case.radius, beta_of(case), dual=True).numpy()
    adversary = add_one_adversary(case.output, case.public, case.teachers, case.orders, case.alpha, case.radius,
                                  beta_of(case), details)
    problems = []
    for j, k in enumerate(case.orders):
        # (a) each direction on its own
        if below(forward[j], forward_worst[j]):
            problems.append(f"order {k}: dual forward {forward[j]!r} < oracle {forward_worst[j]!r}")
        if below(reverse[j], reverse_worst[j]):
            problems.append(f"order {k}: dual reverse {reverse[j]!r} < oracle {reverse_worst[j]!r}")
        # (b) the charge: min of two upper bounds per direction
        if charged[j] > closed[j]:
            problems.append(f"order {k}: charged {charged[j]!r} > closed form {closed[j]!r}")
        if below(charged[j], max(forward_worst[j], reverse_worst[j])):
            problems.append(f"order {k}: charged {charged[j]!r} < oracle {max(forward_worst[j], reverse_worst[j])!r}")
        # (c) the adversary: inside the ball at 40 digits, its exact value at most the bound
        for direction, (name, bound) in enumerate((("forward", forward[j]), ("reverse", reverse[j]))):
            q = adversary[f"q_{name}"][j]
            if not in_ball(q, case.public, case.alpha, case.radius, **case.constraints()):
                problems.append(f"order {k}: adversary's {name} q is outside the ball: {q.tolist()}")
            exact = divergences_at(q, case.output, case.teachers, k)[direction]
            if below(bound, exact):
                problems.append(f"order {k}: dual {name} {bound!r} < adversary's exact value {exact!r}")
            if not math.isclose(adversary[name][j], exact, rel_tol=1e-9, abs_tol=1e-13):
                problems.append(f"order {k}: adversary reports {adversary[name][j]!r}, its q attains {exact!r}")
    assert not problems, case.describe() + "\n" + "\n".join(problems)


def seeded(cases):
    return [(ball, index) for ball in (Ball.PROJECTION_ORDER, Ball.ALL_ORDERS) for index in range(cases[ball])]


@pytest.mark.parametrize("ball, index", seeded(DUAL_CASES))
def test_dual_dominates_worst_case_and_adversary(ball, index):
    result = evaluated_seeded(ball, index, FAST_EFFORT)
    check_case(result.case, result.forward, result.reverse)


@pytest.mark.slow
@pytest.mark.parametrize("ball, index", seeded(SLOW_DUAL_CASES))
def test_dual_dominates_worst_case_and_adversary_slow(ball, index):
    result = evaluated_seeded(ball, index, 1.0)
    check_case(result.case, result.forward, result.reverse)


def test_the_dual_is_tighter_than_the_closed_form_on_the_sweep():
    """Not a soundness property: the point of the dual. Over the seeded cases the charged reverse
    direction drops below log(1 + 1/N) and the charge is strictly smaller at most orders."""
    smaller, total = 0, 0
    for ball, index in seeded(DUAL_CASES):
        case = seeded_case(ball, index)
        orders_t = torch.tensor(case.orders, dtype=torch.float64)
        args = (torch.from_numpy(case.output), torch.from_numpy(case.public), case.teachers, orders_t, case.alpha,
                case.radius, beta_of(case))
        closed = add_one_divergence_bounds(*args).numpy()
        charged = add_one_divergence_bounds(*args, dual=True).numpy()
        smaller += int(np.sum(charged < closed))
        total += closed.size
    assert smaller >= total // 2, (smaller, total)


def test_chords_between_dual_orders_dominate_the_worst_case():
    """More orders than MAX_DUAL_ORDERS: the dual runs on a sub-grid and the orders between are chords
    of the convex (k - 1) D_k; the oracle at orders off the sub-grid checks them."""
    grid = np.asarray(DEFAULT_ORDERS, dtype=np.float64)
    chosen = dual_orders(grid)
    assert chosen.size < grid.size
    off = np.setdiff1d(np.arange(grid.size), chosen)
    picks = off[np.linspace(0, off.size - 1, 5).astype(int)]
    for seed, ball in ((401, Ball.PROJECTION_ORDER), (402, Ball.ALL_ORDERS)):
        case = make_case(seed, ball, 4, 3, 4.0, 0.8, "dirichlet")
        forward, reverse = dual_add_one_bounds(case.output, case.public, case.teachers, grid, case.alpha, case.radius,
                                               beta_of(case))
        assert np.all(np.isfinite(reverse))
        results = worst_cases(case.output, case.public, case.teachers, case.alpha, case.radius, grid[picks],
                              effort=FAST_EFFORT, seed=seed, **case.constraints())
        for index, result in zip(picks, results):
            assert not below(forward[index], result.forward), (case.describe(), grid[index], forward[index], result)
            assert not below(reverse[index], result.reverse), (case.describe(), grid[index], reverse[index], result)


def test_zero_entries():
    """p_j = 0 < p0_j: the forward divergence is infinite (an added q puts mass there) and the dual says
    +inf; the reverse is finite and still dominates the oracle. p0_j = 0: every q of the ball is 0 there."""
    public = np.array([0.3, 0.3, 0.25, 0.15])
    output = np.array([0.5, 0.0, 0.3, 0.2])
    orders = np.array([1.5, 2.0, 4.0, 16.0])
    forward, reverse = dual_add_one_bounds(output, public, 3, orders, 2.0, 0.6)
    assert np.all(np.isposinf(forward)) and np.all(np.isfinite(reverse))
    for k, result in zip(orders, worst_cases(output, public, 3, 2.0, 0.6, orders, effort=FAST_EFFORT)):
        assert not below(reverse[list(orders).index(k)], result.reverse), (k, reverse, result)
    public = np.array([0.4, 0.0, 0.35, 0.25])
    output = np.array([0.5, 0.0, 0.3, 0.2])
    forward, reverse = dual_add_one_bounds(output, public, 2, orders, 4.0, 1.0)
    lo, hi = token_box(public[None], 4.0, 1.0)
    assert lo[0, 1] == 0.0 and hi[0, 1] == 0.0
    assert np.all(np.isfinite(forward)) and np.all(np.isfinite(reverse))
    for index, result in enumerate(worst_cases(output, public, 2, 4.0, 1.0, orders, effort=FAST_EFFORT)):
        assert not below(forward[index], result.forward) and not below(reverse[index], result.reverse)


def test_token_box_contains_the_oracles_worst_q():
    """Every q the oracle certifies in the ball lies in the box [lo, hi] the dual maximises over."""
    for ball, index in seeded(DUAL_CASES)[:8]:
        result = evaluated_seeded(ball, index, FAST_EFFORT)
        case = result.case
        lo, hi = token_box(case.public[None], case.alpha, case.radius, beta_of(case))
        for q in list(result.q_forward) + list(result.q_reverse):
            q = np.asarray(q, dtype=np.float64) / math.fsum(q)
            assert np.all(q >= lo[0] * (1 - 1e-12)) and np.all(q <= hi[0] * (1 + 1e-12)), (case.describe(), q, lo, hi)


def test_gap_report_brackets_the_worst_case():
    case = seeded_case(Ball.PROJECTION_ORDER, 2)
    gap = add_one_gap(case.output, case.public, case.teachers, case.orders, case.alpha, case.radius)
    assert np.all(gap["charged"] <= np.maximum(gap["closed_forward"], gap["closed_reverse"]))
    assert np.all(gap["adversary"] <= gap["charged"] * (1 + 1e-9) + 1e-13)
    assert np.all(gap["ratio"] >= 1 - 1e-9)


@pytest.mark.parametrize("bad, match", [
    ({"output": [0.5, float("nan"), 0.5]}, "NaN"),
    ({"public": [0.2, float("nan"), 0.8]}, "NaN"),
    ({"output": [0.6, -0.1, 0.5]}, "negative"),
    ({"orders": [1.0, 2.0]}, "orders"),
    ({"teachers": 2.5}, "teachers"),
    ({"alpha": 1.0}, "alpha"),
])
def test_bad_input_is_a_value_error(bad, match):
    args = {"output": [0.5, 0.25, 0.25], "public": [0.2, 0.3, 0.5], "teachers": 3, "orders": [2.0], "alpha": 2.0}
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        dual_add_one_bounds(np.asarray(args["output"]), np.asarray(args["public"]), args["teachers"],
                            np.asarray(args["orders"]), args["alpha"], 0.5)
    if "output" in bad or "public" in bad:
        with pytest.raises(ValueError, match=match):
            add_one_adversary(np.asarray(args["output"]), np.asarray(args["public"]), 3, np.asarray([2.0]), 2.0, 0.5)
        with pytest.raises(ValueError, match="NaN|negative"):
            add_one_divergence_bounds(torch.tensor([args["output"]], dtype=torch.float64),
                                      torch.tensor([args["public"]], dtype=torch.float64), 3,
                                      torch.tensor([2.0], dtype=torch.float64), 2.0, 0.5, dual=True)


def test_certified_primitives_hold_their_error_bounds():
    """_f_certified and _ball_certified: |float value - exact| <= the error bound they return, against
    mpmath at 50 digits, at random points (x spread over 1e-12..1, several N, orders and directions)."""
    rng = np.random.default_rng(7)
    with mpmath.workdps(50):
        for _ in range(400):
            p = float(10.0 ** rng.uniform(-12, 0))
            p0 = float(10.0 ** rng.uniform(-12, 0))
            x = float(10.0 ** rng.uniform(-12, 0))
            n = float(rng.integers(1, 101))
            k = float(rng.choice([1.1, 1.5, 2.0, 4.0, 18.0, 64.0, 256.0]))
            s = k if rng.random() < 0.5 else 1.0 - k
            g = float(rng.choice([1.2, 1.5, 2.0, 4.0, 18.0]))
            value, error = _f_certified(x, p, n, s)
            mx, mp_, mn, ms = mpmath.mpf(x), mpmath.mpf(p), mpmath.mpf(n), mpmath.mpf(s)
            exact = mp_ * (((mn + mx / mp_) / (mn + 1)) ** ms - 1 - ms * (mx / mp_ - 1) / (mn + 1))
            if math.isfinite(value):
                assert abs(mpmath.mpf(value) - exact) <= mpmath.mpf(error), (x, p, n, s, value, error, exact)
            w1, e1, w2, e2, d1, f1, d2, f2 = _ball_certified(x, p0, g)
            y, mg = mx / mpmath.mpf(p0), mpmath.mpf(g)
            exact_values = (mpmath.mpf(p0) * (y ** mg - 1 - mg * (y - 1)),
                            mpmath.mpf(p0) * (y ** (1 - mg) - 1 - (1 - mg) * (y - 1)),
                            mg * (y ** (mg - 1) - 1), (1 - mg) * (y ** (-mg) - 1))
            for got, allowed, want in zip((w1, w2, d1, d2), (e1, e2, f1, f2), exact_values):
                if math.isfinite(got) and math.isfinite(allowed):
                    assert abs(mpmath.mpf(got) - want) <= mpmath.mpf(allowed), (x, p0, g, got, allowed, want)


def test_runner_records_and_threads_the_option():
    """add_one_dual reaches the charge, is recorded in the params (absent when false: old manifests are
    unchanged) and a non-boolean is refused."""
    from dpledger.decoding.runners import adapmixed_runner, build_runner
    from dpledger.mechanisms.step import as_ensemble

    common = dict(alpha=2.0, beta=0.3, teachers=3, lam=0.5, sigma=0.05, threshold=0.02, top_k=3, screening=False)
    rng = np.random.default_rng(3)
    public = torch.from_numpy(rng.dirichlet(np.ones(6), size=2))
    teachers = torch.from_numpy(rng.dirichlet(np.ones(6) * 0.5, size=(2, 3)))
    orders = np.asarray([1.5, 2.0, 4.0, 32.0])
    plain = adapmixed_runner(**common)
    dual = adapmixed_runner(**common, add_one_dual=True)
    assert "add_one_dual" not in plain.params and dual.params["add_one_dual"] is True
    closed = plain.process(public, teachers, torch.Generator().manual_seed(1), orders)
    tight = dual.process(public, teachers, torch.Generator().manual_seed(1), orders)
    assert np.all(tight.add_one_bound <= closed.add_one_bound) and np.any(tight.add_one_bound < closed.add_one_bound)
    # the same inputs as the step (as_ensemble's checked copy of public): the same value, bit for bit
    _, checked_public = as_ensemble(teachers, public, 3)
    expected = add_one_divergence_bounds(torch.as_tensor(tight.output), checked_public, 3, torch.from_numpy(orders),
                                         2.0, 0.6, dual=True).numpy()
    assert np.array_equal(tight.add_one_bound, expected)
    rebuilt = build_runner({"type": "adapmixed", **dual.params}, 3)
    assert rebuilt.params == dual.params
    with pytest.raises(ValueError, match="add_one_dual"):
        build_runner({"type": "adapmixed", **common, "add_one_dual": "yes"}, 3)


def test_direction_bounds_agree_with_the_combined_bound():
    """add_one_divergence_bounds(dual=False) is max of add_one_direction_bounds, bit for bit (old traces replay)."""
    case = seeded_case(Ball.PROJECTION_ORDER, 1)
    args = (torch.from_numpy(case.output), torch.from_numpy(case.public), case.teachers,
            torch.tensor(case.orders, dtype=torch.float64), case.alpha, case.radius)
    forward, reverse = add_one_direction_bounds(*args)
    assert np.array_equal(add_one_divergence_bounds(*args).numpy(), np.maximum(forward, reverse))


@pytest.mark.slow
def test_a_dual_run_replays_and_passes_the_audit(micro_models, tmp_path):
    """End to end: a decode with add_one_dual = true records it in the manifest, and the audit's
    replay and data-dependent check recompute the same charge (the dual is deterministic per row)."""
    import json

    from dpledger.audit import Status, audit_run
    from tests.micro import ADAPMIXED, make_run

    run_dir = make_run(micro_models, tmp_path / "dual", {**ADAPMIXED, "add_one_dual": True}, queries=16)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["mechanism"]["params"]["add_one_dual"] is True
    report = audit_run(run_dir, mc_samples=200, game_trials=600)
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["replay"] is Status.PASS and statuses["data_dependent_eq3"] is Status.PASS, \
        [c.to_dict() for c in report.failed]
    assert report.verdict == "PASS", [c.to_dict() for c in report.failed]
