"""The audit's fused paths against the straightforward torch forms they replace: each removal's two
directions through the leave-one-out kernel, and the screen's Monte Carlo pass counts."""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dpledger.audit.ablation import neighbour_divergences
from dpledger.mechanisms.fused import screen_pass_counts
from dpledger.mechanisms.kernels import _SLACK_ULPS, mixed_teachers, renyi_divergence_orders_torch, sums_without_each
from dpledger.mechanisms.leave_one_out import leave_one_out_direction_divergences
from dpledger.mechanisms.screening import NoisyScreening
from tests.conftest import examples, lm_like

ORDERS = torch.tensor([1.01, 1.25, 2.0, 3.5, 18.0, 64.0, 512.0], dtype=torch.float64)
QUARTERS = torch.tensor([1.25, 1.5, 2.0, 2.75, 3.0, 6.0, 18.0, 64.0, 200.0, 2048.0], dtype=torch.float64)
"""Multiples of 1/4, as the audit's orders are: one exp pair per token for all of them, powers by products."""
TENTHS = torch.tensor([1.1, 1.2, 1.7, 2.0, 3.3, 9.9, 18.0, 63.0, 128.0, 512.0], dtype=torch.float64)
"""Multiples of 1/10 (the default grid's lattice; 1.1 is not 11/10 as a float): powers by products too."""


def straightforward_removals(teachers, public, lambdas, rows, orders):
    """Every p_-i built and both directions by one logsumexp per order (the torch form)."""
    mixed = mixed_teachers(teachers, public, lambdas)
    n = mixed.shape[-2]
    log_output = torch.log(mixed.sum(dim=-2) / n).unsqueeze(1)
    log_without = torch.log(sums_without_each(mixed)[:, rows] / (n - 1))
    return torch.stack([renyi_divergence_orders_torch(log_output, log_without, orders),
                        renyi_divergence_orders_torch(log_without, log_output, orders)])


def ensembles(rng, steps, teachers, vocab, kind):
    public = lm_like(rng, vocab, (steps,), 2.0)
    probs = lm_like(rng, vocab, (steps, teachers), 2.5)
    if kind == "holes":         # a teacher alone on a token: its removal leaves p_-i = 0 there (lambda 1)
        probs[:, 1:, 0] = 0.0
        public[:, 0] = 0.0
        probs /= probs.sum(axis=-1, keepdims=True)
        public /= public.sum(axis=-1, keepdims=True)
    if kind == "tiny":          # probabilities below the normal range: the kernel works scaled
        probs[:, 0, : vocab // 2] *= 1e-300
        probs /= probs.sum(axis=-1, keepdims=True)
    lambdas = rng.uniform(0.0, 1.0, (steps, teachers))
    if kind == "holes":
        lambdas[:, 0] = 1.0
    return torch.from_numpy(probs), torch.from_numpy(public), torch.from_numpy(lambdas)


@examples(30, 300)
@given(st.integers(0, 2**31 - 1), st.integers(2, 9), st.integers(2, 3000), st.sampled_from(["plain", "holes", "tiny"]),
       st.sampled_from([ORDERS, QUARTERS, TENTHS]))
def test_each_removal_in_both_directions_is_the_torch_value_rounded_up_within_its_allowance(seed, teachers, vocab,
                                                                                             kind, orders):
    rng = np.random.default_rng(seed)
    probs, public, lambdas = ensembles(rng, 2, teachers, vocab, kind)
    rows = sorted(rng.choice(teachers, size=max(1, teachers // 2), replace=False).tolist())
    output, fused = leave_one_out_direction_divergences(probs, public, lambdas, rows, orders)
    reference = straightforward_removals(probs, public, lambdas, rows, orders)
    np.testing.assert_allclose(output.numpy(), mixed_teachers(probs, public, lambdas).mean(dim=-2).numpy(),
                               rtol=1e-12, atol=0.0)
    both_infinite = torch.isinf(fused) & torch.isinf(reference)
    assert torch.equal(torch.isinf(fused), torch.isinf(reference))
    finite = ~both_infinite
    # both round up g = (a - 1) D by a few ulps per unit of magnitude: D within 1e-9 relative plus 1e-12 / (a - 1)
    allowed = 1e-9 * reference.abs() + 1e-12 / (orders - 1.0)
    assert torch.all((fused - reference).abs()[finite] <= allowed[finite])


def test_the_neighbour_ablation_through_the_kernel_equals_every_neighbour_built_in_torch():
    # (the three added neighbours run the same code on both paths; the removals differ)
    rng = np.random.default_rng(3)
    probs, public, lambdas = ensembles(rng, 3, 6, 300, "plain")
    params = {"alpha": 6.0, "beta": 0.3}
    removed = [0, 2, 5]
    fused, _, _ = neighbour_divergences(public, probs, lambdas, "pmixed", params, removed, ORDERS)
    # subsampling at rate 1 is the same law and takes the torch path, every neighbour built
    torch_path, _, _ = neighbour_divergences(public, probs, lambdas, "pmixed", {**params, "sample_rate": 1.0},
                                             removed, ORDERS)
    assert fused.shape == torch_path.shape == (2, 3, len(removed) + 3, ORDERS.numel())
    assert torch.all((fused - torch_path).abs() <= 1e-9 * torch_path.abs() + 1e-12 / (ORDERS - 1.0))


@pytest.mark.parametrize("quantile", [0.1, 0.5, 0.9])
def test_the_fused_screen_counts_are_the_broadcast_statistics_counted(quantile):
    generator = torch.Generator().manual_seed(1)
    steps, ensembles_per_step, samples, top = 3, 5, 300, 40
    public_top = torch.rand(steps, top, generator=generator, dtype=torch.float64)
    public_top = public_top / public_top.sum(-1, keepdim=True) * 0.7
    mean = public_top.unsqueeze(1) * (1 + torch.rand(steps, ensembles_per_step, top, generator=generator,
                                                     dtype=torch.float64))
    noise = 0.02 * torch.randn(steps, samples, top, generator=generator, dtype=torch.float64)
    noise[0, 0] = -1.0          # a draw that clips every entry to 0: +inf, never a pass
    probe = NoisyScreening(teachers=1, lam=1e-2, sigma=1e-2, alpha=18, threshold=1.0, top_k=top)
    statistic = probe.statistic_from_mean(mean.unsqueeze(2), public_top.unsqueeze(1).unsqueeze(1), noise.unsqueeze(1))
    threshold = float(torch.quantile(statistic[torch.isfinite(statistic)], quantile))   # some pass, some fail
    screen = NoisyScreening(teachers=1, lam=1e-2, sigma=1e-2, alpha=18, threshold=threshold, top_k=top)
    counts = screen.pass_counts(mean, public_top, noise)
    expected = (statistic <= threshold).double().sum(dim=2)
    assert torch.equal(counts, expected)
    assert 0 < float(counts.sum()) < steps * ensembles_per_step * samples


def _screen_case(rng, kind, top):
    """(mean (1, 1, k), public_top (1, k), noise (1, S, k)) for one kind of hard screen input."""
    public_top = rng.dirichlet(np.full(top, 0.3 if kind == "peaked" else 2.0))
    if kind == "zeros":          # tokens outside the public law: a draw that keeps them is +inf
        public_top[: top // 3] = 0.0
    if kind == "tiny":           # below the early decisions' range: the kernel decides alone
        public_top[0] = 1e-310
    public_top /= public_top.sum()
    mean = np.clip(public_top * rng.uniform(0.2, 3.0, top), 0.0, None)
    noise = rng.normal(0.0, float(rng.choice([1e-4, 1e-2, 0.1])), (200, top))
    if kind == "zeros":
        noise[::3, : top // 3] = -1.0          # a third of the draws clip the outside tokens to 0
    if kind == "clipped":
        noise[::5] = -10.0                     # every entry clipped: no statistic, never a pass
    return (torch.from_numpy(mean)[None, None], torch.from_numpy(public_top)[None],
            torch.from_numpy(noise)[None])


@pytest.mark.parametrize("seed", range(6))
def test_early_screen_decisions_are_the_kernels_decisions_at_and_beside_the_threshold(seed):
    """Thresholds a hair either side of computed statistics, just outside the margin, far away and +inf, orders below 2
    (no D_2 bound) to 10^4, zeros and sub-range values in the public law: every count equals the
    statistic the Renyi kernel computes, counted; a wrong margin or bound changes a count."""
    rng = np.random.default_rng(seed)
    for kind in ("plain", "peaked", "zeros", "tiny", "clipped"):
        top = int(rng.choice([1, 2, 7, 60]))
        mean, public_top, noise = _screen_case(rng, kind, top)
        for alpha in (1.5, 2.0, 18.0, 1e4):
            probe = NoisyScreening(teachers=1, lam=0.5, sigma=1e-2, alpha=alpha, threshold=1.0, top_k=top)
            statistic = probe.statistic_from_mean(mean.unsqueeze(2), public_top.unsqueeze(1).unsqueeze(1),
                                                  noise.unsqueeze(1))[0, 0]
            finite = statistic[torch.isfinite(statistic)]
            at = [float(x) for x in finite[:: max(1, finite.numel() // 6)]]
            # beside a statistic by far less than the margin (but more than torch's log and the kernel's
            # differ in: exact ties are the helper's test below), just outside the margin, and far away
            thresholds = [x * (1 + e) + e for x in at for e in (1e-11, -1e-11, 1e-7, -1e-7, 1.0, -0.5)]
            for threshold in [t for t in thresholds if t >= 0.0]:
                screen = NoisyScreening(teachers=1, lam=0.5, sigma=1e-2, alpha=alpha, threshold=threshold, top_k=top)
                counts = screen.pass_counts(mean, public_top, noise)
                expected = float((statistic <= threshold).sum())
                assert float(counts[0, 0]) == expected, (kind, top, alpha, threshold)
            # the spec keeps thresholds finite; at +inf the kernel passes every draw with a statistic, even
            # +inf (mass outside the public law), and none whose entries were all clipped to 0
            everything = np.empty((1, 1))
            log_public = torch.log(public_top / public_top.sum(dim=-1, keepdim=True)).numpy()
            screen_pass_counts(mean.numpy(), log_public, noise.numpy(), alpha, np.inf, _SLACK_ULPS, everything)
            drawn = (mean[0, 0] + noise[0]).clamp_min(0.0).sum(dim=-1) > 0
            assert everything[0, 0] == float(drawn.sum()), (kind, top, alpha)


@pytest.mark.parametrize("seed", range(3))
def test_an_early_screen_decision_is_never_against_the_statistic_even_at_a_tie(seed):
    """Draw by draw, at thresholds equal to each statistic and its neighbouring floats: the bounds
    settle a draw only on the side the statistic is."""
    from dpledger.mechanisms.fused import _public_for_bounds, _screen_decided, _screen_decision_margin

    rng = np.random.default_rng(100 + seed)
    settled = 0
    for kind in ("plain", "peaked", "zeros", "tiny", "clipped"):
        top = int(rng.choice([2, 7, 60]))
        mean, public_top, noise = _screen_case(rng, kind, top)
        public = np.empty(top)
        log_public = torch.log(public_top / public_top.sum(dim=-1, keepdim=True)).numpy()[0]
        usable = _public_for_bounds(log_public, public)
        for alpha in (1.5, 2.0, 18.0, 1e4):
            probe = NoisyScreening(teachers=1, lam=0.5, sigma=1e-2, alpha=alpha, threshold=1.0, top_k=top)
            statistic = probe.statistic_from_mean(mean.unsqueeze(2), public_top.unsqueeze(1).unsqueeze(1),
                                                  noise.unsqueeze(1))[0, 0].numpy()
            noisy = np.clip(mean.numpy()[0, 0] + noise.numpy()[0], 0.0, None)
            for draw in range(0, noisy.shape[0], 7):
                total = float(noisy[draw].sum())
                if not (usable and total > 0.0 and np.isfinite(statistic[draw])):
                    continue
                for threshold in (statistic[draw], np.nextafter(statistic[draw], np.inf),
                                  np.nextafter(statistic[draw], -np.inf), statistic[draw] * 1.001):
                    if threshold < 0.0:
                        continue
                    decided = _screen_decided(noisy[draw], total, public, alpha, float(threshold),
                                              _screen_decision_margin(alpha, float(threshold), top))
                    settled += decided != 0
                    assert decided == 0 or (decided > 0) == (statistic[draw] <= threshold), (kind, alpha, draw)
    assert settled > 0     # (at 1.001 times the statistic the bounds can settle a draw)


def test_early_screen_decisions_settle_the_draws_far_from_the_threshold():
    """The bounds do settle a draw (the kernel's speed comes from them) with the threshold far above or
    below its statistic, and not at the statistic itself (checked through the kernel's own helper)."""
    from dpledger.mechanisms.fused import _screen_decided, _screen_decision_margin

    rng = np.random.default_rng(11)
    public = rng.dirichlet(np.full(60, 2.0))
    noisy = np.clip(public + rng.normal(0.0, 1e-3, 60), 0.0, None)
    total = float(noisy.sum())
    statistic = float(NoisyScreening(teachers=1, lam=0.5, sigma=1e-2, alpha=18.0, threshold=1.0).statistic_from_mean(
        torch.from_numpy(noisy), torch.from_numpy(public), torch.zeros(60, dtype=torch.float64)))
    margin = _screen_decision_margin(18.0, 1.0, 60)
    assert 0.0 < margin < 1e-7 and statistic > 0.1
    for threshold, decided in ((statistic * 100 + 1.0, 1), (statistic / 100, -1), (statistic, 0)):
        assert _screen_decided(noisy, total, public, 18.0, threshold,
                               _screen_decision_margin(18.0, threshold, 60)) == decided, threshold
    # no early decision where the kernel's statistic is not within its allowance of D_alpha (found in review),
    # for a negative threshold (max(statistic, 0) <= it never holds) or an infinite one
    for alpha, threshold in ((1.0, 1.0), (1.0 + 2.0 ** -52, 1.0), (1.0 + 1e-9, 1.0), (3e17, 50.0), (2.0 ** 21, 1.0),
                             (18.0, -0.5), (18.0, float("inf")), (18.0, float("nan"))):
        assert _screen_decision_margin(alpha, threshold, 60) == float("inf"), (alpha, threshold)
    # the sums' rounding enters divided by alpha - 1 (found in review: 8e7 tokens at alpha = 1 + 2^-10)
    u = np.finfo(float).eps / 2
    for alpha in (1.0 + 2.0 ** -10, 1.01, 1.5, 2.0, 18.0, 2.0 ** 20):
        for size in (1, 60, 50257, 8e7):
            stated = (3.0 * (size + 2) * u + 1e-11) * (1.0 + 1.0 / (alpha - 1.0))
            assert _screen_decision_margin(alpha, 4.5, size) > stated, (alpha, size)
    tiny = np.array([1.6e-310])            # a sub-normal total: the kernel's own shares overflow
    assert _screen_decided(tiny, float(tiny.sum()), np.ones(1), 18.0, 1e3, margin) == 0


def test_leave_one_out_scratch_rows_are_reused_only_once_their_holder_is_gone():
    from dpledger.mechanisms.kernels import _LeaveOneOut

    rng = np.random.default_rng(7)
    probs, public, lambdas = (x.numpy() for x in ensembles(rng, 1, 4, 50, "plain"))
    first = _LeaveOneOut(probs[0], public[0], lambdas[0])
    kept = first.ratios.copy()
    second = _LeaveOneOut(probs[0][::-1].copy(), public[0], lambdas[0])   # while `first` lives: its own rows
    assert second.ratios is not first.ratios and np.array_equal(first.ratios, kept)
    rows = second.ratios
    del first, second
    third = _LeaveOneOut(probs[0], public[0], lambdas[0])                 # the last holder is gone: its rows
    assert third.ratios is rows and np.array_equal(third.ratios, kept)


@pytest.mark.parametrize("seed", range(4))
def test_the_power_path_never_falls_below_the_exact_divergence_in_mpmath(seed):
    import mpmath

    mpmath.mp.dps = 60
    rng = np.random.default_rng(seed)
    probs, public, lambdas = ensembles(rng, 1, 4, 40, "plain")
    _, fused = leave_one_out_direction_divergences(probs, public, lambdas, [0, 3], QUARTERS)
    mixed = [[mpmath.mpf(float(x)) for x in row] for row in mixed_teachers(probs, public, lambdas)[0].numpy()]
    n = len(mixed)
    output = [sum(row[j] for row in mixed) / n for j in range(40)]
    for position, removed in enumerate([0, 3]):
        without = [sum(row[j] for i, row in enumerate(mixed) if i != removed) / (n - 1) for j in range(40)]
        for k, order in enumerate(QUARTERS.tolist()):
            a = mpmath.mpf(order)
            for direction, (first, second) in enumerate(((output, without), (without, output))):
                exact = mpmath.log(mpmath.fsum(f ** a * s ** (1 - a) for f, s in zip(first, second))) / (a - 1)
                value = float(fused[direction, 0, position, k])
                assert value >= exact, (order, direction, value, exact)
                assert value <= exact * (1 + 1e-9) + 1e-13 / (order - 1)


def mpmath_eq3(probs, public, lambdas, grid) -> list:
    """Eq. 3 (Flemings et al. 2024), max_i D<->_a(p, p_-i), of the first step at each order, in mpmath at
    the working precision from the float inputs (the Renyi divergence written from its definition)."""
    import mpmath

    mixed = [[mpmath.mpf(float(x)) for x in row] for row in mixed_teachers(probs, public, lambdas)[0].numpy()]
    teachers, vocab = len(mixed), len(mixed[0])
    output = [sum(row[j] for row in mixed) / teachers for j in range(vocab)]
    withouts = [[sum(row[j] for i, row in enumerate(mixed) if i != removed) / (teachers - 1) for j in range(vocab)]
                for removed in range(teachers)]
    values = []
    for order in grid.tolist():
        a = mpmath.mpf(order)
        values.append(max(mpmath.log(mpmath.fsum(f ** a * s ** (1 - a) for f, s in zip(first, second))) / (a - 1)
                          for without in withouts for first, second in ((output, without), (without, output))))
    return values


@pytest.mark.parametrize("seed, teachers, orders", [(0, 2, TENTHS), (1, 5, TENTHS), (2, 3, QUARTERS), (3, 4, ORDERS),
                                                    (4, 2, torch.tensor([1.1, 2.5, 18.0], dtype=torch.float32))])
def test_eq3_at_every_order_lies_within_its_allowance_above_mpmath(seed, teachers, orders):
    """leave_one_out_every_order (the audit's data_dependent_eq3 recomputation): every value in
    [Eq. 3, Eq. 3 + 2 allowance], Eq. 3 in mpmath at 60 digits from the float inputs; on the lattices
    the power path (its products' and lattice-gap terms), elsewhere the exp path (float32 orders are off
    the lattice of tenths)."""
    import mpmath

    from dpledger.mechanisms.leave_one_out import leave_one_out_every_order

    mpmath.mp.dps = 60
    rng = np.random.default_rng(seed)
    probs, public, lambdas = ensembles(rng, 1, teachers, 30, "plain")
    grid = orders.double().numpy()
    values, allowance, _ = leave_one_out_every_order(probs[0], public, lambdas[0], grid)
    for k, (order, exact) in enumerate(zip(grid.tolist(), mpmath_eq3(probs, public, lambdas, grid))):
        assert values[k] >= exact, (order, values[k], exact)
        assert values[k] <= exact + 2 * allowance[k], (order, float(values[k] - exact), allowance[k])


@examples(10, 100)
@given(st.integers(0, 2**31 - 1), st.integers(2, 12), st.integers(2, 3000), st.sampled_from(["plain", "holes", "tiny"]))
def test_eq3_at_every_order_agrees_with_the_exp_path_within_both_allowances(seed, teachers, vocab, kind):
    """The power path against leave_one_out_curve's every-order exp path on the default grid: both lie in
    [Eq. 3, Eq. 3 + 2 allowance], so they differ by at most the sum of their allowances, and the output
    law is the same bits (the add-one bound is recomputed from it)."""
    from dpledger.accounting.orders import default_orders
    from dpledger.mechanisms.leave_one_out import (leave_one_out_allowance, leave_one_out_curve,
                                                   leave_one_out_every_order)

    rng = np.random.default_rng(seed)
    probs, public, lambdas = ensembles(rng, 2, teachers, vocab, kind)
    grid = np.asarray(default_orders(18.0), dtype=np.float64)
    values, allowance, output = leave_one_out_every_order(probs, public, lambdas, grid)
    reference, _, reference_output = leave_one_out_curve(probs, public, lambdas, grid, relative_tolerance=None)
    assert torch.equal(output, reference_output)
    assert np.array_equal(np.isinf(values), np.isinf(reference))
    finite = np.isfinite(values)
    both = allowance + leave_one_out_allowance(probs, public, lambdas, grid, reference)
    assert np.all(np.abs(values[finite] - reference[finite]) <= both[finite] * (1 + 1e-9))


@pytest.mark.parametrize("seed, teachers, orders", [(5, 3, TENTHS), (6, 4, QUARTERS), (7, 2, ORDERS)])
def test_chords_under_a_charge_bound_eq3_from_above_by_mpmath(seed, teachers, orders):
    """leave_one_out_every_order with charges: every value at least Eq. 3 (mpmath, 60 digits), where a
    chord stands in too; and where the value is not Eq. 3 within 2 allowance, it is at most the charge."""
    import mpmath

    from dpledger.mechanisms.leave_one_out import leave_one_out_every_order

    mpmath.mp.dps = 60
    rng = np.random.default_rng(seed)
    probs, public, lambdas = ensembles(rng, 1, teachers, 30, "plain")
    grid = orders.double().numpy()
    exact_values, _, _ = leave_one_out_every_order(probs[0], public, lambdas[0], grid)
    charges = exact_values * rng.uniform(0.9, 1.5, grid.size)    # covering some orders, not others
    values, allowance, _ = leave_one_out_every_order(probs[0], public, lambdas[0], grid, charges=charges)
    for k, (order, exact) in enumerate(zip(grid.tolist(), mpmath_eq3(probs, public, lambdas, grid))):
        assert values[k] >= exact, (order, values[k], exact)
        assert values[k] <= exact + 2 * allowance[k] or values[k] <= charges[k], (order, values[k], charges[k])


@examples(10, 100)
@given(st.integers(0, 2**31 - 1), st.integers(2, 12), st.integers(2, 3000), st.sampled_from(["plain", "holes", "tiny"]),
       st.sampled_from(["honest", "scaled", "random", "nan"]))
def test_a_charge_checked_through_chords_gets_the_verdict_of_every_order(seed, teachers, vocab, kind, charge):
    """The audit's comparison, charge >= value - 2 allowance, decides every step and order the same way with
    charges (chords where they show the charge covers a teacher) as without (every teacher at every order),
    for honest charges (the step's own certified curve), charges scaled below and above Eq. 3, charges at
    random, and NaN charges; and with charges no value is below Eq. 3's floor without them."""
    from dpledger.accounting.orders import default_orders
    from dpledger.mechanisms.leave_one_out import leave_one_out_curve, leave_one_out_every_order

    rng = np.random.default_rng(seed)
    probs, public, lambdas = ensembles(rng, 2, teachers, vocab, kind)
    grid = np.asarray(default_orders(18.0), dtype=np.float64)
    every, every_allowance, output = leave_one_out_every_order(probs, public, lambdas, grid)
    honest, _, _ = leave_one_out_curve(probs, public, lambdas, grid)
    charges = {"honest": honest, "scaled": honest * rng.choice([0.99, 0.9999999, 1.0000001, 1.5], honest.shape),
               "random": every * rng.uniform(0.0, 2.0, every.shape),
               "nan": np.where(rng.random(honest.shape) < 0.3, np.nan, honest)}[charge]
    values, allowance, chord_output = leave_one_out_every_order(probs, public, lambdas, grid, charges=charges)
    assert torch.equal(chord_output, output)
    with np.errstate(invalid="ignore"):
        floor_every = np.where(np.isfinite(every), every - 2 * every_allowance, every)
        floor = np.where(np.isfinite(values), values - 2 * allowance, values)
        # a verdict can differ only within the two computations' rounding: a charge between the floors
        undecided = np.abs(charges - floor_every) <= 2 * (every_allowance + allowance) + 1e-300
        assert np.array_equal((charges >= floor)[~undecided], (charges >= floor_every)[~undecided])
        assert np.all((values >= floor_every) | np.isinf(every))


@pytest.mark.parametrize("grid", [[2.0, 100.0, 3.0], [2.0, 3.0, 2.0], [3.0, 64.0, 2.0, 18.0]])
def test_a_grid_out_of_order_is_never_bounded_by_an_extrapolated_chord(grid):
    """A chord between neighbouring entries of a grid out of order would extrapolate, below the convex
    curve (found in review: grid [2, 100, 3] let a charge 0.72 nats under Eq. 3 pass): such a grid is
    evaluated at every order, so a charge under Eq. 3 stays under its floor."""
    from dpledger.mechanisms.leave_one_out import leave_one_out_every_order

    rng = np.random.default_rng(1)
    probs, public, lambdas = ensembles(rng, 1, 3, 20, "plain")
    grid = np.asarray(grid)
    every, every_allowance, _ = leave_one_out_every_order(probs[0], public, lambdas[0], grid)
    # the charge at entry 1: the straight line through its neighbours' (a - 1) D, as a chord would read it
    moments = every * (grid - 1.0)
    weight = (grid[1] - grid[0]) / (grid[2] - grid[0]) if grid[2] != grid[0] else 0.0
    line = moments[0] + weight * (moments[2] - moments[0])
    charges = every * (1 + 1e-9)
    charges[1] = max(line, 0.0) / (grid[1] - 1.0) * (1 + 1e-9) + 1e-300
    assert charges[1] < every[1] - 2 * every_allowance[1]           # an under-charge at entry 1
    values, allowance, _ = leave_one_out_every_order(probs[0], public, lambdas[0], grid, charges=charges)
    assert np.array_equal(values, every) and np.array_equal(allowance, every_allowance)
    assert not charges[1] >= values[1] - 2 * allowance[1]


def test_an_honest_charge_on_an_off_lattice_grid_stays_above_its_floor():
    """Off the lattice the whole grid takes the exp path, and so does every sub-grid (some of whose
    subsets are quarters): the allowance returned, the whole grid's, covers every value."""
    from dpledger.accounting.orders import default_orders
    from dpledger.mechanisms.leave_one_out import leave_one_out_every_order

    grid = np.asarray(default_orders(18.0), dtype=np.float64)
    grid = np.where(np.arange(grid.size) % 8 == 0, np.ceil(grid * 4) / 4, grid + 0.013)
    grid = np.unique(grid)
    for seed in range(4):
        probs, public, lambdas = ensembles(np.random.default_rng(seed), 2, 6, 500, "plain")
        every, _, _ = leave_one_out_every_order(probs, public, lambdas, grid)
        values, allowance, _ = leave_one_out_every_order(probs, public, lambdas, grid, charges=every)
        assert np.all(every >= values - 2 * allowance)


def test_bad_inputs_to_the_audit_kernels_get_one_line_naming_the_constraint():
    rng = np.random.default_rng(9)
    probs, public, lambdas = ensembles(rng, 2, 4, 30, "plain")
    with pytest.raises(ValueError, match=r"rows must be teacher indices in \[0, 4\), got \[0, 4\]"):
        leave_one_out_direction_divergences(probs, public, lambdas, [0, 4], ORDERS)
    with pytest.raises(ValueError, match="got shapes"):
        leave_one_out_direction_divergences(probs, public[:1], lambdas, [0], ORDERS)
    with pytest.raises(ValueError, match="> 1"):
        leave_one_out_direction_divergences(probs, public, lambdas, [0], torch.tensor([0.5, 2.0], dtype=torch.float64))
    screen = NoisyScreening(teachers=1, lam=1e-2, sigma=1e-2, alpha=18, threshold=1.0, top_k=5)
    mean, public_top, noise = torch.full((2, 3, 5), 0.1), torch.full((2, 5), 0.2), torch.zeros(2, 7, 5)
    assert screen.pass_counts(mean, public_top, noise).shape == (2, 3)
    with pytest.raises(ValueError, match="got shapes"):
        screen.pass_counts(mean, public_top[:, :4], noise)
    mean[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="mean holds NaN"):
        screen.pass_counts(mean, public_top, noise)


def test_magnitudes_of_the_wrong_shape_get_one_line_naming_the_constraint():
    from dpledger.mechanisms.leave_one_out import leave_one_out_curve

    probs, public, lambdas = ensembles(np.random.default_rng(0), 3, 4, 50, "plain")
    with pytest.raises(ValueError, match=r"magnitudes must hold one value per step of a CPU ensemble, shape \(3,\), "
                                         r"got \(2,\)"):
        leave_one_out_curve(probs, public, lambdas, [2.0, 3.0], magnitudes=np.empty(2))
    magnitudes = np.full(3, np.nan)
    leave_one_out_curve(probs, public, lambdas, [2.0, 3.0], magnitudes=magnitudes)
    assert np.all(np.isfinite(magnitudes)) and np.all(magnitudes > 0)
