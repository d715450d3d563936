"""The Laplace noisy-max aggregator (dpledger.mechanisms.laplace_aggregator): its RDP curve and pure-DP epsilon
against mpmath oracles written from the papers (tests/oracles/laplace_noisy_max.py), its exact output law
against quadrature and Monte Carlo, its calibration, and the whole path: registry, account, calibrate,
verify, decode, audit (with the epsilon bracket) and report."""
import json
import math

import mpmath
import numpy as np
import pytest

from dpledger.accounting.orders import DEFAULT_ORDERS
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.cli import main
from dpledger.mechanisms.aggregators import aggregator_class, aggregator_names
from dpledger.mechanisms.laplace_aggregator import (LaplaceNoisyMaxAggregator, histogram_l1_sensitivity,
                                                    laplace_noisy_max_log_law)
from tests.oracles.laplace_noisy_max import (laplace_rdp_by_definition, laplace_rdp_closed_form, noisy_max_law,
                                             renyi_divergence)

RELATIONS = list(NeighbouringRelation)


def test_it_is_registered_and_every_command_lists_it():
    assert "laplace-noisy-max" in aggregator_names(differentially_private=True)
    assert aggregator_class("laplace-noisy-max") is LaplaceNoisyMaxAggregator
    assert histogram_l1_sensitivity(NeighbouringRelation.REPLACE_ONE) == 2
    assert {histogram_l1_sensitivity(r) for r in RELATIONS if r is not NeighbouringRelation.REPLACE_ONE} == {1}


# ---- the RDP curve and the pure-DP epsilon, against the papers ----

def test_the_oracle_closed_form_is_the_divergence_by_definition():
    """Mironov 2017, Proposition 6 against the defining integral (two independent readings)."""
    for alpha, ratio in ((1.5, 0.2), (2.0, 1.0), (7.3, 0.05), (33.0, 3.0), (1.05, 10.0), (400.0, 0.01)):
        closed, integral = laplace_rdp_closed_form(alpha, ratio), laplace_rdp_by_definition(alpha, ratio)
        assert abs(closed - integral) <= mpmath.mpf("1e-25") * abs(closed), (alpha, ratio)


def _generated_scales(rng):
    return np.concatenate([[1e-3, 0.02, 0.5, 1.0, 3.0, 50.0, 1e4, 1e7], 10.0 ** rng.uniform(-2.5, 4.0, 24)])


def _generated_orders(rng):
    grid = np.asarray(DEFAULT_ORDERS, dtype=np.float64)
    return np.unique(np.concatenate([grid[::7], rng.uniform(1.001, 3.0, 6), 10.0 ** rng.uniform(0.5, 5.5, 8),
                                     [1024.0, 1e6]]))


@pytest.mark.parametrize("relation", RELATIONS)
def test_rdp_is_the_papers_bound_rounded_up_and_never_below(relation):
    """rdp_values = min(Delta_1 f_a(1/b), Delta_1 / b) within 1e-12, and never below it, on generated scales and
    orders (f from Mironov 2017, Proposition 6 at 60 digits; Delta_1 the histogram's L1 sensitivity)."""
    rng = np.random.default_rng(20251)
    orders = _generated_orders(rng)
    delta_1 = 2 if relation is NeighbouringRelation.REPLACE_ONE else 1
    for scale in _generated_scales(rng):
        values = LaplaceNoisyMaxAggregator(scale=scale, relation=relation).rdp_values(orders)
        with mpmath.workdps(60):
            t = mpmath.mpf(1) / mpmath.mpf(float(scale))
            for alpha, value in zip(orders, values):
                bound = min(delta_1 * laplace_rdp_closed_form(alpha, t), delta_1 * t)
                assert mpmath.mpf(float(value)) >= bound, (scale, alpha, float(value), float(bound))
                assert mpmath.mpf(float(value)) <= bound * (1 + mpmath.mpf("1e-12")) + mpmath.mpf("1e-320"), \
                    (scale, alpha, float(value), float(bound))


def test_pure_epsilon_is_the_l1_sensitivity_over_the_scale_rounded_up():
    for scale in (0.3, 1.0, 7.0, 123.456):
        for relation in RELATIONS:
            aggregator = LaplaceNoisyMaxAggregator(scale=scale, relation=relation)
            exact = mpmath.mpf(histogram_l1_sensitivity(relation)) / mpmath.mpf(scale)
            assert exact <= aggregator.pure_epsilon <= exact * (1 + mpmath.mpf("1e-15"))


def test_extreme_scales_are_infinite_or_tiny_never_nan():
    orders = np.asarray([1.5, 2.0, 64.0, 1024.0])
    assert np.all(np.isinf(LaplaceNoisyMaxAggregator(scale=1e-320, relation=NeighbouringRelation.REPLACE_ONE)
                           .rdp_values(orders)))
    tiny = LaplaceNoisyMaxAggregator(scale=1e300).rdp_values(orders)
    assert np.all(tiny > 0) and np.all(tiny < 1e-290)


def _neighbours(counts, relation):
    """Every neighbouring histogram of `counts` under `relation` (one vote added, removed or moved)."""
    counts = list(counts)
    result = []
    for j in range(len(counts)):
        if "add" in relation.moves:
            result.append([c + (k == j) for k, c in enumerate(counts)])
        if "remove" in relation.moves and counts[j] > 0:
            result.append([c - (k == j) for k, c in enumerate(counts)])
        if "replace" in relation.moves and counts[j] > 0:
            for i in range(len(counts)):
                if i != j:
                    result.append([c - (k == j) + (k == i) for k, c in enumerate(counts)])
    return result


@pytest.mark.parametrize("relation", [NeighbouringRelation.ADD_OR_REMOVE_ONE, NeighbouringRelation.REPLACE_ONE])
def test_the_curve_and_the_pure_epsilon_bound_the_released_laws_divergence(relation):
    """On generated histograms, every neighbour's released law (the oracle's quadrature) is within the curve at
    every order, both directions, and within exp(+-Delta_1 / b) pointwise (pure DP)."""
    rng = np.random.default_rng(7)
    orders = [1.5, 2.0, 4.0, 16.0, 128.0]
    # 20 digits (the oracle's default is 30): the curve is a float64, and the quadrature errs far below its last bit
    for _ in range(5):
        counts = rng.integers(0, 5, size=int(rng.integers(2, 5))).tolist()
        scale = float(10.0 ** rng.uniform(-0.5, 0.7))
        aggregator = LaplaceNoisyMaxAggregator(scale=scale, relation=relation)
        curve = aggregator.rdp_values(np.asarray(orders))
        law = noisy_max_law(counts, scale, dps=20)
        for neighbour in _neighbours(counts, relation):
            other = noisy_max_law(neighbour, scale, dps=20)
            worst_ratio = max(abs(mpmath.log(p / q)) for p, q in zip(law, other))
            assert worst_ratio <= aggregator.pure_epsilon, (counts, neighbour, scale)
            for alpha, value in zip(orders, curve):
                measured = max(renyi_divergence(law, other, alpha, dps=20), renyi_divergence(other, law, alpha, dps=20))
                assert measured <= value, (counts, neighbour, scale, alpha)


# ---- the exact output law ----

def test_the_output_law_is_the_oracles_quadrature():
    rng = np.random.default_rng(11)
    cases = [([5, 3], 1.0), ([0, 0, 0], 0.7), ([6, 0, 2, 2, 1], 0.3), ([40, 0], 1.0), ([1, 0, 3, 3], 4.0)]
    cases += [(rng.integers(0, 7, size=int(rng.integers(2, 7))).tolist(), float(10.0 ** rng.uniform(-0.7, 0.8)))
              for _ in range(6)]
    for counts, scale in cases:
        law, error = laplace_noisy_max_log_law(np.asarray(counts, dtype=float), scale)
        reference = noisy_max_law(counts, scale)
        assert error < 1e-10
        for value, expected in zip(law, reference):
            assert abs(mpmath.exp(value) - expected) <= mpmath.mpf("1e-12") * expected + mpmath.mpf("1e-300"), \
                (counts, scale)


def test_the_output_law_matches_sampling_on_a_large_vocabulary():
    counts = np.array([9, 7, 7, 3, 1] + [0] * 59, dtype=float)
    law, error = laplace_noisy_max_log_law(counts, 1.5)
    assert error < 1e-10 and law[1] == law[2] and law[5] == law[63]
    draws = LaplaceNoisyMaxAggregator(scale=1.5).sample_outputs(counts, 200_000, np.random.default_rng(0))
    frequency = np.bincount(draws, minlength=counts.size) / draws.size
    standard_error = np.sqrt(np.exp(law) * (1 - np.exp(law)) / draws.size)
    assert np.all(np.abs(frequency - np.exp(law)) <= 5 * standard_error + 1e-12)


def test_decide_draws_laplace_noise_from_the_steps_generator():
    import torch

    aggregator = LaplaceNoisyMaxAggregator(scale=2.0, teachers=16)
    counts = np.array([6, 5, 5, 0], dtype=np.int64)
    tokens = [aggregator.decide(counts, torch.Generator().manual_seed(seed))[0] for seed in range(20000)]
    frequency = np.bincount(tokens, minlength=4) / len(tokens)
    law = np.exp(laplace_noisy_max_log_law(counts, 2.0)[0])
    assert np.all(np.abs(frequency - law) <= 5 * np.sqrt(law * (1 - law) / len(tokens)) + 1e-12)
    again = aggregator.decide(counts, torch.Generator().manual_seed(3))
    assert again == aggregator.decide(counts, torch.Generator().manual_seed(3)) and again[0] is not None


@pytest.mark.parametrize("parameters, message", [
    ({"scale": -1.0}, "scale must be > 0, got -1"),
    ({"scale": 0.0}, "scale must be > 0, got 0"),
    ({"scale": math.nan}, "scale must be"),
    ({}, "scale is required for aggregator laplace-noisy-max"),
    ({"scale": 1.0, "threshold": 3}, "threshold is not used for aggregator laplace-noisy-max, got 3"),
])
def test_bad_parameters_are_one_line_value_errors(parameters, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as error:
        aggregator_class("laplace-noisy-max").from_parameters(parameters, teachers=3)
    assert "\n" not in str(error.value)


# ---- calibration ----

@pytest.mark.parametrize("epsilon, delta, queries", [(2.0, 1e-5, 100), (0.5, 1e-6, 10), (8.0, 1e-5, 5000)])
def test_calibration_finds_the_smallest_scale_meeting_the_target(epsilon, delta, queries):
    result = LaplaceNoisyMaxAggregator.calibrate(epsilon, delta, queries, {}, accountant="rdp",
                                                 orders=DEFAULT_ORDERS)
    assert result.parameter == "scale" and result.mechanism.relation is NeighbouringRelation.REPLACE_ONE
    assert epsilon * 0.99 <= result.forward_epsilon <= epsilon

    def forward(scale):
        curve = LaplaceNoisyMaxAggregator(scale=scale, relation=NeighbouringRelation.REPLACE_ONE) \
            .rdp_curve(DEFAULT_ORDERS).composed(queries)
        from dpledger.accounting.conversion import epsilon_from_rdp

        return epsilon_from_rdp(curve, delta).epsilon

    assert forward(result.value) <= epsilon < forward(result.value * (1 - 1e-5))


# ---- the commands ----

def test_account_states_the_rdp_and_the_pure_epsilon(capsys):
    assert main(["account", "laplace-noisy-max", "--scale", "20", "--queries", "100", "--delta", "1e-5",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    curve = LaplaceNoisyMaxAggregator(scale=20.0, relation=NeighbouringRelation.REPLACE_ONE) \
        .rdp_curve(DEFAULT_ORDERS).composed(100)
    from dpledger.accounting.conversion import epsilon_from_rdp

    assert record["epsilon"] == epsilon_from_rdp(curve, 1e-5).epsilon
    assert record["relation"] == "replace_one" and record["l1_sensitivity"] == 2 and record["dp_guarantee"] is True
    assert record["pure_epsilon"] == pytest.approx(10.0, rel=1e-14) and record["pure_epsilon"] >= 10.0
    assert record["pld_epsilon"] is None and "RDP only" in record["pld_unavailable"]
    assert main(["account", "laplace-noisy-max", "--scale", "20", "--queries", "100", "--delta", "1e-5"]) == 0
    assert capsys.readouterr().out.startswith("laplace-noisy-max: 100 queries -> epsilon = ")


@pytest.mark.parametrize("argv, message", [
    (["account", "laplace-noisy-max", "--scale", "-2", "--queries", "5", "--delta", "1e-5"], "scale must be > 0"),
    (["account", "laplace-noisy-max", "--queries", "5", "--delta", "1e-5"], "needs --scale"),
    (["account", "laplace-noisy-max", "--scale", "2", "--queries", "5", "--delta", "1e-5", "--threshold", "3"],
     "does not use --threshold"),
    (["calibrate", "laplace-noisy-max", "--epsilon", "1", "--delta", "1e-5", "--queries", "5", "--accountant", "pld"],
     "calibrate with the rdp accountant"),
])
def test_bad_command_lines_exit_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and message in captured.err


def test_calibrate_prints_the_scale_and_its_forward_check(capsys):
    assert main(["calibrate", "laplace-noisy-max", "--epsilon", "2", "--delta", "1e-5", "--queries", "100",
                 "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["parameter"] == "scale" and record["forward_epsilon"] <= 2.0 and record["relation"] == "replace_one"


def _claim(tmp_path, epsilon, relation=None):
    path = tmp_path / "claim.toml"
    relation_line = f'relation = "{relation}"\n' if relation else ""
    path.write_text(f'[claim]\nepsilon = {epsilon}\ndelta = 1e-5\nqueries = 100\n{relation_line}'
                    '[mechanism]\ntype = "laplace-noisy-max"\nscale = 20.0\n')
    return path


def test_verify_reproduces_a_sound_claim_and_refuses_an_understated_one(tmp_path, capsys):
    curve = LaplaceNoisyMaxAggregator(scale=20.0, relation=NeighbouringRelation.REPLACE_ONE) \
        .rdp_curve(DEFAULT_ORDERS).composed(100)
    from dpledger.accounting.conversion import epsilon_from_rdp

    sound = math.ceil(epsilon_from_rdp(curve, 1e-5).epsilon * 1000) / 1000
    assert main(["verify", str(_claim(tmp_path, sound)), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["verdict"] == "reproduced-sound" and verdict["claim"]["relation"] == "replace-one"
    assert main(["verify", str(_claim(tmp_path, round(sound / 2, 3))), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "not-reproduced-unsound"
    # add-or-remove-one: one coordinate moves (Delta_1 = 1), a smaller sound epsilon
    assert main(["verify", str(_claim(tmp_path, sound, "add_or_remove_one")), "--json"]) == 1
    smaller = json.loads(capsys.readouterr().out)
    one_move = LaplaceNoisyMaxAggregator(scale=20.0).rdp_curve(DEFAULT_ORDERS).composed(100)
    assert smaller["sound"] is True and smaller["sound_epsilon"] == epsilon_from_rdp(one_move, 1e-5).epsilon < sound


def test_a_bad_claim_names_its_key(tmp_path, capsys):
    path = tmp_path / "claim.toml"
    path.write_text('[claim]\nepsilon = 1.0\ndelta = 1e-5\nqueries = 10\n[mechanism]\ntype = "laplace-noisy-max"\n'
                    'scale = -3.0\n')
    assert main(["verify", str(path)]) == 2
    assert "mechanism.scale must be > 0" in capsys.readouterr().err


# ---- decode, audit, report ----

def _decode(micro_models, out, relation="add_or_remove_one", queries=48):
    from dpledger.decoding.config import config_from_dict
    from dpledger.decoding.run import run_decode
    from tests.micro import micro_config

    mechanism = {"type": "voting", "votes": "coordinated", "aggregator": "laplace-noisy-max", "scale": 1.0}
    config = micro_config(micro_models, out, mechanism, queries=queries, block_size=16, relation=relation)
    return run_decode(config_from_dict(config), progress=False, verbose=False)


def test_a_voting_run_decodes_audits_passes_with_its_bracket_and_reports(micro_models, tmp_path, capsys):
    from dpledger.audit import audit_run
    from dpledger.decoding import trace
    from dpledger.reports import load_run
    from dpledger.reports.statement import privacy_statement

    result = _decode(micro_models, tmp_path / "laplace", queries=24)   # audited twice, ~0.2 s a step
    records = trace.read_records(result.directory)
    assert all(r["answered_by"] == "mechanism" and r["screen_passed"] for r in records)   # it never fails
    orders = np.asarray(json.loads((result.directory / trace.MANIFEST).read_text())["orders"])
    expected = LaplaceNoisyMaxAggregator(scale=1.0).rdp_values(orders)    # add-or-remove-one: Delta_1 = 1
    assert all(np.array_equal(r["rdp_laplace_noisy_max"], expected) for r in records)
    assert math.isfinite(result.summary["epsilon"][0]["epsilon"]) and result.summary["voting"]["dp_guarantee"]
    report = audit_run(result.directory, game_trials=0)
    assert report.verdict == "PASS", [c.to_dict() for c in report.failed]
    for name in ("replay", "voting_charges", "neighbour_ablation", "sampled_aggregator", "epsilon_bracket"):
        assert report.check(name).status.value == "PASS", (name, report.check(name).detail)
    assert report.check("vote_threshold").status.value == "SKIPPED"
    rows = report.check("epsilon_bracket").evidence["rows"]
    assert rows and all(0 < row["lower"] <= row["upper"] for row in rows)
    assert main(["audit", str(result.directory), "--no-game"]) == 0
    assert "epsilon in [" in capsys.readouterr().out
    statement = " ".join(privacy_statement(load_run(result.directory)))
    assert "report noisy max" in statement and "Mironov 2017, Proposition 6" in statement and "b=1" in statement
    assert main(["report", str(result.directory), "--format", "md"]) == 0
    assert "Laplace noisy max (b=1)" in capsys.readouterr().out


def test_a_replace_one_run_is_charged_twice_the_moved_counts_and_audited(micro_models, tmp_path):
    from dpledger.audit import audit_run
    from dpledger.decoding import trace

    result = _decode(micro_models, tmp_path / "replace", relation="replace_one", queries=16)
    orders = np.asarray(json.loads((result.directory / trace.MANIFEST).read_text())["orders"])
    charged = trace.read_records(result.directory)[0]["rdp_laplace_noisy_max"]
    assert np.array_equal(charged, LaplaceNoisyMaxAggregator(scale=1.0, relation=NeighbouringRelation.REPLACE_ONE)
                          .rdp_values(orders))
    report = audit_run(result.directory, play_game=False)
    assert report.verdict == "PASS", [c.to_dict() for c in report.failed]
    relations = report.check("neighbour_ablation").evidence["relations"]
    assert relations["replace_one"]["claimed"] and relations["replace_one"]["within_claim"]


@pytest.mark.parametrize("scale, queries, relation", [(20.0, 100, NeighbouringRelation.REPLACE_ONE),
                                                      (3.0, 50, NeighbouringRelation.ADD_OR_REMOVE_ONE),
                                                      (0.7, 10, NeighbouringRelation.REPLACE_ONE)])
def test_the_composed_curve_matches_dp_accountings_laplace_rdp(scale, queries, relation):
    """An independent reference: dp-accounting's RdpAccountant on Delta_1 x Q LaplaceDpEvent(b) (the
    noisy histogram's per-count Laplace mechanisms) gives the same epsilon as our curve, which
    therefore is not below it; its PLD, a tighter accounting of the same events, is never above ours."""
    import warnings

    import dp_accounting

    from dpledger.accounting.conversion import ConversionMethod, epsilon_from_rdp
    from dpledger.accounting.orders import DEFAULT_ORDERS

    moves = histogram_l1_sensitivity(relation)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(scale), moves * queries)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        accountant = dp_accounting.rdp.RdpAccountant(list(DEFAULT_ORDERS))
        accountant.compose(event)
        reference = accountant.get_epsilon(1e-5)
        pld = dp_accounting.pld.PLDAccountant()
        pld.compose(event)
        pld_epsilon = pld.get_epsilon(1e-5)
        ours = epsilon_from_rdp(LaplaceNoisyMaxAggregator(scale=scale, relation=relation)
                                .rdp_curve(DEFAULT_ORDERS).composed(queries), 1e-5, ConversionMethod.IMPROVED)
    assert ours.epsilon >= reference * (1 - 1e-9) and ours.epsilon <= reference * (1 + 1e-6)
    assert pld_epsilon <= ours.epsilon
