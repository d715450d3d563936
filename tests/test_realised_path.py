"""Realised-path accounting (Flemings et al. 2024, Theorem 4.2 as stated) against the released output.

A screened step releases the pair (decision, token). Its law is [pi p, (1 - pi) p0] over 2V outcomes.
The paper's accounting charges the screen plus Eq. 3 only when the screen passed; these tests pin
the counterexample in dpledger.decoding.runners.adapmixed_runner's docstring: with lam = 0 the screen reads
no teacher, costs exactly 0, and a failed step is charged 0, yet the released pair's law differs
between neighbours. The default accounting ("released-output") charges Eq. 3 at every step.
"""
import numpy as np
import pytest
import torch

from dpledger.decoding.runners import adapmixed_runner
from dpledger.mechanisms import NoisyScreening, renyi_divergence
from dpledger.mechanisms.kernels import mixed_teachers
from dpledger.mechanisms.leave_one_out import leave_one_out_divergences

ORDERS = np.array([1.5, 2.0, 4.0, 8.0, 18.0])


def released_pair_divergence(pi, pi_neighbour, p, p_neighbour, p0, order):
    """D_order of the (decision, token) laws, from the definition over the 2V outcomes."""
    law = np.concatenate([pi * p, (1 - pi) * p0])
    neighbour = np.concatenate([pi_neighbour * p_neighbour, (1 - pi_neighbour) * p0])
    return renyi_divergence(law, neighbour, order)


def test_blind_screen_costs_nothing_yet_the_released_pair_leaks():
    screen = NoisyScreening(teachers=2, lam=0.0, sigma=0.01)
    assert np.all(screen.rdp_values(ORDERS) == 0.0)  # reads no teacher: the decision law is the same everywhere
    p0 = np.array([0.5, 0.3, 0.2])
    p, p_without = np.array([0.2, 0.3, 0.5]), np.array([0.45, 0.3, 0.25])
    for pi in (0.01, 0.5, 0.99):
        for order in ORDERS:
            # the realised path charges 0 when the screen failed; the released output's divergence is positive
            value = released_pair_divergence(pi, pi, p, p_without, p0, order)
            exact = np.log1p(pi * np.expm1((order - 1) * renyi_divergence(p, p_without, order))) / (order - 1)
            assert value == pytest.approx(exact, rel=1e-9)
            assert value > 0.0
            # ... and never more than the released-output charge, screen (0) + D(p || p')
            assert value <= renyi_divergence(p, p_without, order) * (1 + 1e-12)


def _ensemble(seed: int, length: int = 6, teachers: int = 3, vocab: int = 40):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn((length, teachers + 1, vocab), generator=generator, dtype=torch.float64) * 2
    probs = torch.softmax(logits, dim=-1)
    return probs[:, 0], probs[:, 1:]


@pytest.mark.parametrize("seed", range(3))
def test_released_output_charges_every_step_realised_path_only_passed_steps(seed):
    public, teachers = _ensemble(seed)
    orders = np.asarray(ORDERS)
    common = dict(alpha=2.0, beta=0.5, teachers=3, lam=0.5, sigma=0.05, threshold=0.02, top_k=10,
                  relation="remove_one")
    released = adapmixed_runner(**common).process(public, teachers, torch.Generator().manual_seed(1), orders)
    realised = adapmixed_runner(**common, accounting="realised-path").process(public, teachers,
                                                                              torch.Generator().manual_seed(1), orders)
    np.testing.assert_array_equal(released.screen_passed, realised.screen_passed)
    mixed = mixed_teachers(teachers, public, torch.from_numpy(released.lambdas))
    eq3 = leave_one_out_divergences(mixed, torch.from_numpy(orders)).max(dim=-2).values.numpy()
    # the charged curve is exact on a sub-grid and a chord bound within 0.5% of Eq. 3 between
    charged = released.charged["pmixed_data_dependent"]
    assert np.all(charged >= eq3 * (1 - 1e-12)) and np.all(charged <= eq3 * 1.006 + 1e-300)
    passed = realised.screen_passed[:, None]
    np.testing.assert_array_equal(realised.charged["pmixed_data_dependent"], np.where(passed, charged, 0.0))


def test_accounting_choice_is_validated():
    with pytest.raises(ValueError, match=r"accounting must be one of \['released-output', 'realised-path'\], got 'x'"):
        adapmixed_runner(alpha=2.0, beta=0.5, teachers=3, lam=0.5, sigma=0.05, threshold=0.02, top_k=10,
                         accounting="x")


def test_ablation_realised_path_is_the_decision_plus_the_answered_token_divergence():
    """dpledger.audit.ablation's realised-path quantity: the token term appears exactly on answered steps and
    equals D(p || p_-i), checked against the mpmath oracle (independent of the package's kernel)."""
    import mpmath

    from dpledger.audit.ablation import neighbour_divergences
    from tests import oracles as O

    public, teachers = _ensemble(5, length=4, teachers=3, vocab=12)
    lambdas = torch.full((4, 3), 0.7, dtype=torch.float64)
    params = dict(alpha=2.0, beta=0.5, lam=0.5, sigma=0.05, threshold=0.05, top_k=6)
    orders = torch.tensor([2.0, 4.0], dtype=torch.float64)
    results = {}
    for answered in (False, True):
        _, _, realised = neighbour_divergences(public, teachers, lambdas, "adapmixed", params, [0], orders, 200,
                                               torch.Generator().manual_seed(3), 0.95,
                                               torch.full((4,), answered))
        results[answered] = realised.numpy()
    token = results[True] - results[False]                         # (2 directions, L, E, K)
    mixed = (lambdas[..., None] * teachers + (1 - lambdas[..., None]) * public[:, None]).numpy()
    for step in range(4):
        p, without = mixed[step].mean(axis=0), mixed[step, 1:].mean(axis=0)
        for k, order in enumerate((2.0, 4.0)):
            forward = float(O.renyi_divergence([mpmath.mpf(x) for x in p], [mpmath.mpf(x) for x in without], order))
            backward = float(O.renyi_divergence([mpmath.mpf(x) for x in without], [mpmath.mpf(x) for x in p], order))
            assert token[0, step, 0, k] == pytest.approx(forward, rel=1e-9, abs=1e-13)
            assert token[1, step, 0, k] == pytest.approx(backward, rel=1e-9, abs=1e-13)
    assert np.all(results[False] >= 0)
