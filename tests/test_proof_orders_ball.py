"""Soundness and utility of PMixED's proof-orders ball (Ball.PROOF_ORDERS), against an mpmath oracle.

Ball.PROOF_ORDERS enforces D<->_k(pbar_i, p0) <= beta k at k = 2a - 1 and k = 2a only, the orders at
which the proof of Theorem 3.1 (Flemings et al. 2024) at order a reads the ball (Hoelder's inequality
with exponents (2a - 1)/a and (2a - 1)/(a - 1); docs/soundness.md). The claims checked here:

* every projected teacher satisfies both constraints, in both directions, by the oracle;
* the data-dependent loss max_i D<->_k(p, p_-i) (Eq. 3) is within Theorem 3.1 at every order
  k <= a on generated ensembles (LM-like, extreme tails, point masses, the counterexample's family),
  by the package and by mpmath: 0 violations;
* the single-teacher case (removal only) is within 2 beta a;
* the all-orders ball lies inside the proof-orders ball, so its lambdas are never larger, and on the
  counterexample the proof-orders ball keeps the teacher the paper's ball keeps (lambda ~ 1);
* the curve is the paper's (the same calibrated beta), and what the ball cannot account is refused.

The oracle (tests/test_all_orders_ball.py's mpmath divergences from the definition) shares no code
with the package; the package only supplies lambdas and its own float64 losses.
"""
from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from dpledger.accounting.relation import NeighbouringRelation
from dpledger.mechanisms.adapmixed import data_dependent_pmixed_values
from dpledger.mechanisms.ball import Ball, proof_orders_ball_constraints
from dpledger.mechanisms.calibration import calibrate_pmixed
from dpledger.mechanisms.pmixed import PROOF_ORDERS_MAX_ALPHA, PMixED, SubsampledPMixED, SubsamplingVariant
from tests.oracles import theorem_3_1_epsilon as oracle_theorem_3_1
from tests.test_all_orders_ball import (BETAS, DPS, _exceedance_configs, _law, _leave_one_out_loss, _mixture, _Pair,
                                        _spec_input, _within)

ALPHAS = (1.5, 2.0, 4.0, 6.0, 18.0)


def _constraint_orders(alpha: float) -> tuple[float, float]:
    return 2 * alpha - 1, 2 * alpha


def test_constraints_are_the_two_orders_the_proof_reads():
    for alpha in ALPHAS:
        for beta in BETAS:
            orders, radii, max_radius = proof_orders_ball_constraints(alpha, beta)
            assert orders == _constraint_orders(alpha)
            assert radii == (beta * (2 * alpha - 1), beta * 2 * alpha) and max_radius is None
            assert PMixED(alpha, beta, 4, ball=Ball.PROOF_ORDERS).ball_constraints == (orders, radii, None)


def test_hoelder_exponents_give_theorem_a5_at_order_a():
    """The derivation's arithmetic, exactly: with p = (2a-1)/a the forward order is p a = 2a - 1, the
    reverse order 1 + q (a - 1) = 2a, and (a - 1/p) beta (2a - 1) + (a - 1) 2 beta a = 4 beta a (a - 1)."""
    with mpmath.workdps(60):
        for alpha in (mpmath.mpf("1.01"), mpmath.mpf(2), mpmath.mpf("6.5"), mpmath.mpf(512)):
            p = (2 * alpha - 1) / alpha
            q = p / (p - 1)
            assert mpmath.almosteq(1 / p + 1 / q, 1, 1e-50)
            assert mpmath.almosteq(p * alpha, 2 * alpha - 1, 1e-50)
            assert mpmath.almosteq(1 + q * (alpha - 1), 2 * alpha, 1e-50)
            beta = mpmath.mpf("0.013")
            total = (alpha - 1 / p) * beta * (2 * alpha - 1) + (alpha - 1) * 2 * beta * alpha
            assert mpmath.almosteq(total, 4 * beta * alpha * (alpha - 1), 1e-45)


def _cases(count: int, seed: int, kinds=("lm", "tails", "point", "dinf", "spec")):
    for ensemble, public, alpha, beta, kind in _exceedance_configs(count, seed, kinds, batch=5):
        yield ensemble, public, alpha, beta, kind


def check_projected_teachers_meet_both_constraints(count: int, seed: int):
    checked = 0
    with mpmath.workdps(DPS):
        for ensemble, public, alpha, beta, kind in _cases(count, seed):
            mechanism = PMixED(alpha, beta, ensemble.shape[-2], ball=Ball.PROOF_ORDERS)
            lambdas = mechanism.mixing_weights(ensemble, public)
            assert np.all((lambdas >= 0) & (lambdas <= 1))
            for row in range(0, ensemble.shape[0], 2):
                public_law = _law(public[row])
                for lam, teacher in zip(lambdas[row], ensemble[row]):
                    pair = _Pair(_mixture(lam, _law(teacher), public_law), public_law)
                    for order, radius in zip(*mechanism.ball_constraints[:2]):
                        value = pair.divergence(order)
                        assert _within(value, radius), (kind, alpha, beta, order, value, radius)
                    checked += 1
    assert checked >= count // 2


def test_projected_teachers_meet_both_constraints():
    check_projected_teachers_meet_both_constraints(count=60, seed=3)


@pytest.mark.slow
def test_projected_teachers_meet_both_constraints_slow():
    check_projected_teachers_meet_both_constraints(count=1000, seed=4)


def check_loss_never_exceeds_theorem_3_1(count: int, seed: int) -> dict:
    """Eq. 3 at every order <= a against Theorem 3.1, by the package on every ensemble and by the oracle
    (leave-one-out and Theorem 3.1 in mpmath) on the first of each batch. Returns the counts."""
    counts = {"ensembles": 0, "pairs": 0, "package_violations": 0, "oracle_ensembles": 0, "oracle_violations": 0,
              "largest_ratio": 0.0}
    for ensemble, public, alpha, beta, _ in _cases(count, seed):
        teachers = ensemble.shape[-2]
        mechanism = PMixED(alpha, beta, teachers, ball=Ball.PROOF_ORDERS, relation=NeighbouringRelation.REMOVE_ONE)
        lambdas = mechanism.mixing_weights(ensemble, public)
        orders = np.unique(np.concatenate([np.linspace(1.01, alpha, 12), [alpha]]))
        losses = data_dependent_pmixed_values(ensemble, public, lambdas, orders)
        claimed = mechanism.rdp_values(orders)
        assert np.all(np.isfinite(claimed))
        counts["ensembles"] += ensemble.shape[0]
        counts["pairs"] += losses.size
        counts["package_violations"] += int((losses > claimed).sum())
        counts["largest_ratio"] = max(counts["largest_ratio"], float(np.max(losses / np.maximum(claimed, 1e-300))))
        with mpmath.workdps(DPS):
            theorem = oracle_theorem_3_1(float(alpha), beta, teachers)
            for loss in _leave_one_out_loss(ensemble[0], public[0], lambdas[0], orders):
                counts["oracle_violations"] += int(not _within(loss, theorem))
            counts["oracle_ensembles"] += 1
    print(f"\nproof-orders ball: {counts}")
    assert counts["package_violations"] == 0 and counts["oracle_violations"] == 0, counts
    assert counts["oracle_ensembles"] >= count // 5 // 2
    return counts


def test_loss_never_exceeds_theorem_3_1():
    check_loss_never_exceeds_theorem_3_1(count=150, seed=11)


@pytest.mark.slow
def test_loss_never_exceeds_theorem_3_1_slow():
    check_loss_never_exceeds_theorem_3_1(count=3000, seed=12)


def test_a_single_teacher_is_within_two_beta_alpha():
    rng = np.random.default_rng(5)
    with mpmath.workdps(DPS):
        for index in range(40):
            alpha, beta = float(rng.choice(ALPHAS)), float(BETAS[index % len(BETAS)])
            vocab = int(rng.integers(2, 12))
            public = rng.dirichlet(np.full(vocab, 0.3))
            teacher = rng.dirichlet(np.full(vocab, 0.2))[None]
            mechanism = PMixED(alpha, beta, 1, ball=Ball.PROOF_ORDERS, relation=NeighbouringRelation.REMOVE_ONE)
            assert mechanism.per_query_epsilon == pytest.approx(2 * beta * alpha, rel=1e-15)
            lam = mechanism.mixing_weights(teacher, public)[0]
            pair = _Pair(_mixture(lam, _law(teacher[0]), _law(public)), _law(public))
            for order in (1.01, (1 + alpha) / 2, alpha):
                assert _within(pair.divergence(order), 2 * beta * alpha)


def test_add_or_remove_with_one_teacher_charges_an_added_second_teacher():
    mechanism = PMixED(6.0, 0.01, 1, ball=Ball.PROOF_ORDERS)
    assert mechanism.per_query_epsilon == pytest.approx(float(oracle_theorem_3_1(6.0, 0.01, 2)), rel=1e-12)
    assert mechanism.per_query_epsilon >= 2 * 0.01 * 6.0


def test_counterexample_is_within_theorem_3_1_and_keeps_the_teacher_the_paper_keeps():
    teachers, public = _spec_input()
    alpha, beta = 2.0, 0.01
    paper = PMixED(alpha, beta, 2, ball=Ball.PROJECTION_ORDER).mixing_weights(teachers, public)
    proof = PMixED(alpha, beta, 2, ball=Ball.PROOF_ORDERS).mixing_weights(teachers, public)
    every = PMixED(alpha, beta, 2, ball=Ball.ALL_ORDERS).mixing_weights(teachers, public)
    with mpmath.workdps(DPS):
        theorem = oracle_theorem_3_1(alpha, beta, 2)
        loss_paper = _leave_one_out_loss(teachers, public, paper, [alpha])[0]
        loss_proof = _leave_one_out_loss(teachers, public, proof, [1.5, alpha])
    assert loss_paper > 100 * theorem                   # the paper's ball: 4.18 against 0.041
    assert all(_within(loss, theorem) for loss in loss_proof)
    # utility: the first teacher stays (nearly) whole, as with the paper's ball; the all-orders ball
    # shrinks it to 0.59
    assert proof[0] > 0.999 and paper[0] == pytest.approx(1.0) and every[0] < 0.6


def check_all_orders_lambdas_never_exceed_proof_orders(count: int, seed: int):
    """The all-orders ball implies the proof-orders ball (for k in (k_j, k_j+1] it enforces
    D_k <= beta k_j <= beta k), so its largest feasible lambda is never larger (up to the solvers'
    stopping tolerance)."""
    for ensemble, public, alpha, beta, _ in _cases(count, seed, kinds=("lm", "tails", "point")):
        if alpha > PROOF_ORDERS_MAX_ALPHA:
            continue
        proof = PMixED(alpha, beta, ensemble.shape[-2], ball=Ball.PROOF_ORDERS).mixing_weights(ensemble, public)
        every = PMixED(alpha, beta, ensemble.shape[-2], ball=Ball.ALL_ORDERS).mixing_weights(ensemble, public)
        assert np.all(every <= proof + 1e-9), float(np.max(every - proof))


def test_all_orders_lambdas_never_exceed_proof_orders():
    check_all_orders_lambdas_never_exceed_proof_orders(count=100, seed=21)


def test_curve_is_theorem_3_1_at_and_below_alpha_and_inf_above():
    mechanism = PMixED(6.0, 0.01, 8, ball=Ball.PROOF_ORDERS)
    orders = np.array([1.5, 3.0, 6.0, 6.5, 64.0])
    values = mechanism.rdp_values(orders)
    theorem = float(oracle_theorem_3_1(6.0, 0.01, 8))
    assert values[:3] == pytest.approx([theorem] * 3, rel=1e-12)
    assert np.all(np.isinf(values[3:]))
    assert mechanism.proven and not PMixED(6.0, 0.01, 8).proven


def test_calibration_allows_the_papers_beta():
    """Same curve as the paper's ball (N >= 2), so the same calibrated beta, now proven."""
    paper = calibrate_pmixed(8.0, 1e-5, 1024, 6.0, 8, ball="projection-order")
    proof = calibrate_pmixed(8.0, 1e-5, 1024, 6.0, 8, ball="proof-orders")
    assert proof.value == pytest.approx(paper.value, rel=1e-9)
    assert proof.forward_epsilon <= 8.0 and proof.forward_epsilon >= 8.0 * 0.99
    assert not proof.notes and paper.notes


def test_what_the_ball_cannot_account_is_refused():
    with pytest.raises(ValueError, match=r"alpha must be <= 512 with ball = proof-orders.*got 600"):
        PMixED(600.0, 0.01, 4, ball=Ball.PROOF_ORDERS)
    with pytest.raises(ValueError, match="Poisson subsampling of a PMixED with ball = proof-orders"):
        SubsampledPMixED(PMixED(6.0, 0.01, 4, ball=Ball.PROOF_ORDERS), 0.5, SubsamplingVariant.WORST_CASE_SIZE_GENERAL)


@pytest.mark.parametrize("mechanism", [{"type": "pmixed", "alpha": 6.0, "beta": 0.05, "ball": "proof-orders"},
                                       {"type": "adapmixed", "alpha": 6.0, "beta": 0.05, "lam": 1e-4, "sigma": 1e-2,
                                        "threshold": 4.5, "top_k": 60, "ball": "proof-orders"}])
def test_a_decoded_run_with_the_ball_passes_its_audit(micro_models, tmp_path, mechanism):
    from dpledger.audit import audit_run
    from dpledger.decoding.config import config_from_dict
    from dpledger.decoding.run import run_decode
    from tests.micro import micro_config

    config = micro_config(micro_models, tmp_path / "run", mechanism, queries=48, block_size=24)
    run_decode(config_from_dict(config), progress=False, verbose=False)
    report = audit_run(tmp_path / "run", mc_samples=200, play_game=False)
    checks = {check.name: check for check in report.checks}
    assert report.verdict == "PASS", [(c.name, c.status, c.detail) for c in report.checks if c.status.value == "FAIL"]
    assert checks["mixing_ball"].status.value == "PASS" and "D<->_11 <= 0.55 and D<->_12 <= 0.6" in checks["mixing_ball"].detail
    if mechanism["type"] == "pmixed":
        assert checks["theorem_3_1"].status.value == "PASS"
        assert report.bracket is not None and all(0 < row["lower"] <= row["upper"] for row in report.bracket["rows"])


def test_the_order_with_the_largest_beta_is_chosen_from_the_budget_alone():
    from dpledger.mechanisms.calibration import calibrate_pmixed_order

    chosen = calibrate_pmixed_order(8.0, 1e-5, 1024, 8, ball="proof-orders", alphas=(2.0, 4.0, 6.0, 64.0))
    # order 2 cannot reach epsilon 8 (its conversion term alone is 10.1): skipped
    each = {a: calibrate_pmixed(8.0, 1e-5, 1024, a, 8, ball="proof-orders").value for a in (4.0, 6.0, 64.0)}
    assert chosen.fixed["alpha"] == max(each, key=lambda a: each[a]) == 4.0
    assert chosen.value == max(each.values()) and chosen.forward_epsilon <= 8.0
    # a candidate whose conversion term alone exceeds the target is skipped, not fatal
    assert calibrate_pmixed_order(1.0, 1e-5, 1024, 8, ball="proof-orders", alphas=(2.0, 16.0)).fixed["alpha"] == 16.0
    with pytest.raises(ValueError, match=r"epsilon = 1 is out of reach for PMixED \(ball = proof-orders\) at every "
                                         r"candidate order \(2, 3\)"):
        calibrate_pmixed_order(1.0, 1e-5, 1024, 8, ball="proof-orders", alphas=(2.0, 3.0))
    with pytest.raises(ValueError, match="alphas must name at least one projection order"):
        calibrate_pmixed_order(8.0, 1e-5, 1024, 8, alphas=())


def test_the_brackets_add_one_adversary_is_a_teacher_the_ball_admits():
    """The audit's optimised added teacher (a lower bound's witness) must be one the mechanism can
    produce: projected onto the proof-orders ball itself, not the order-2a ball that contains it
    (found by review: there it reached D<->_3 of 1.33 times the radius and a per-step loss 2.4 times
    the true worst case)."""
    from dpledger.mechanisms.add_one import add_one_adversary

    teachers = np.array([[0.965062412242975, 0.034937587757025], [0.061144356616501166, 0.9388556433834988],
                         [0.0006838525191276714, 0.9993161474808723]])
    public = np.array([0.9809461509702123, 0.01905384902978771])
    pmixed = PMixED(2.0, 1.0, 3, ball=Ball.PROOF_ORDERS)
    lambdas = pmixed.mixing_weights(teachers, public)
    output = (lambdas[:, None] * teachers + (1 - lambdas[:, None]) * public).mean(0)
    found = add_one_adversary(output, public, 3, np.array([2.0]), *pmixed.one_order_ball,
                              constraints=pmixed.ball_constraints)
    with mpmath.workdps(DPS):
        for key in ("q_forward", "q_reverse"):
            pair = _Pair(_law(found[key][0]), _law(public))
            for order, radius in zip(*pmixed.ball_constraints[:2]):
                assert _within(pair.divergence(order), radius), (key, order)
    # the true worst case over every admitted added teacher, by a fine scan of the one free coordinate
    scan = np.linspace(0.0, 1.0, 20001)
    laws = np.stack([scan, 1 - scan], axis=1)
    lam = pmixed.mixing_weights_tensor(torch.from_numpy(laws)[:, None, :],
                                       torch.from_numpy(public).expand(len(scan), 2).contiguous()).numpy()[:, 0]
    added = lam[:, None] * laws + (1 - lam[:, None]) * public
    plus = (3 * output + added) / 4
    worst = float(np.max(np.maximum(np.log((plus ** 2 / output).sum(1)), np.log((output ** 2 / plus).sum(1)))))
    assert found["forward"][0] <= worst * (1 + 1e-9) + 1e-12
