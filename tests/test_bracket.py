"""Every audited run's epsilon between a certified lower bound and its claim (dpledger.audit.bracket).

The lower bound composes the exact per-step output laws of the strongest tested neighbours
(dpledger.accounting.loss_distribution): on honest runs it never exceeds the claim, and a claim below it FAILs.
"""
from __future__ import annotations

import copy

import pytest

from dpledger.audit import audit_run
from dpledger.audit.bracket import check_epsilon_bracket
from dpledger.audit.loader import load_trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode
from tests.micro import PAPER_ADAPMIXED, micro_config

DPARGMAX = {"type": "voting", "aggregator": "dpargmax", "threshold": 2.0, "sigma": 1.0, "sigma_threshold": 1.0}
SCREENED = PAPER_ADAPMIXED
KINDS = {
    "pmixed": {"type": "pmixed", "alpha": 6.0, "beta": 0.01},
    "pmixed-all-orders": {"type": "pmixed", "alpha": 6.0, "beta": 0.05, "ball": "all-orders"},
    "pmixed-subsampled": {"type": "pmixed", "alpha": 6.0, "beta": 0.05, "sample_rate": 0.6},
    "adapmixed": SCREENED,
    "adapmixed-no-screen": {**SCREENED, "screening": False},
    "adapmixed-remove-one": {**SCREENED, "screening": False, "relation": "remove_one"},
    "hot-dpargmax": {**DPARGMAX, "votes": "coordinated"},
    "cold-dpargmax": {**DPARGMAX, "votes": "independent"},
    "hot-dpargmax-replace-one": {**DPARGMAX, "votes": "coordinated", "relation": "replace_one"},
    "hot-dpws": {"type": "voting", "aggregator": "dpws", "threshold": 2.0, "sigma": 1.5, "votes": "coordinated"},
}


@pytest.fixture(scope="module")
def audited(micro_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("bracket")
    runs = {}
    for name, mechanism in KINDS.items():
        mechanism = dict(mechanism)
        relation = mechanism.pop("relation", None)
        # DPWS's Monte Carlo bounds cost ~0.3 s a step here: 16 steps check what the others check on 32
        config = micro_config(micro_models, root / name, mechanism, queries=16 if name == "hot-dpws" else 32,
                              block_size=16,
                              deltas=[1e-5, 1e-3], **({"relation": relation} if relation else {}))
        run_decode(config_from_dict(config), progress=False, verbose=False)
        runs[name] = (root / name, audit_run(root / name, mc_samples=200, play_game=False))
    return runs


@pytest.mark.parametrize("name", list(KINDS))
def test_the_bracket_is_printed_and_the_lower_bound_never_exceeds_the_claim(audited, name):
    directory, report = audited[name]
    bracket = report.bracket
    assert report.verdict == "PASS" and bracket is not None
    assert [row["delta"] for row in bracket["rows"]] == [1e-5, 1e-3]
    for row in bracket["rows"]:
        if name == "hot-dpws":
            # Monte Carlo law bounds, valid at 0.95. Here noise lets ~9% of the 320 unvoted tokens pass, so
            # one vote moves the law by less than the bounds' width: 0 is certified (the generated DPWS runs
            # below, with fewer passing tokens, certify a positive bound and catch an under-stated claim)
            assert 0 <= row["lower"] <= row["upper"] and bracket["confidence"] == 0.95
            continue
        assert 0 < row["lower"] <= row["upper"] and row["ratio"] == pytest.approx(row["upper"] / row["lower"])
        assert row["neighbour"] and f"[{row['lower']:.4g}, {row['upper']:.4g}]" in report.headline
    assert report.to_dict()["bracket"] == bracket
    if name == "adapmixed-remove-one":  # a remove-one claim is bracketed by removed teachers only
        assert all(row["neighbour"].startswith("remove teacher") for row in bracket["rows"])
    if name == "adapmixed":  # screened: added teachers that leave the screen as it was, at a stated confidence
        assert "screen unchanged" in bracket["rows"][0]["neighbour"] and bracket["confidence"] == 0.95
    if name == "hot-dpargmax-replace-one":
        assert all("replaced" in row["neighbour"] for row in bracket["rows"])


@pytest.mark.parametrize("name", ["pmixed", "adapmixed", "adapmixed-remove-one", "hot-dpargmax"])
def test_a_claim_below_the_certified_lower_bound_fails(audited, name):
    directory, report = audited[name]
    trace = load_trace(directory)
    honest = report.check("epsilon_bracket").evidence["rows"]
    doctored = copy.deepcopy(trace.ledger)
    for entry in doctored["epsilon"]:
        if entry["method"] == "improved":
            entry["epsilon"] = 0.5 * next(r["lower"] for r in honest if r["delta"] == entry["delta"])
    trace.ledger = doctored
    result = check_epsilon_bracket(trace, report.check("neighbour_ablation").evidence, mc_samples=200)
    assert result.status.value == "FAIL" and "the claim under-states" in result.detail


@pytest.mark.parametrize("case, expected", [
    ("generate", "free generation"),
    ("targmax", "T-threshold privacy only"),
    ("realised-path", "bounds no released law"),
])
def test_runs_without_a_bracket_say_why(micro_models, tmp_path, case, expected):
    mechanism = {"generate": KINDS["pmixed"], "targmax": {"type": "voting", "aggregator": "targmax", "threshold": 2.0,
                                                           "votes": "coordinated"},
                 "realised-path": {**DPARGMAX, "votes": "coordinated", "accounting": "realised-path"}}[case]
    config = micro_config(micro_models, tmp_path / case, mechanism, queries=16, block_size=8)
    if case == "generate":
        config["data"] = {"stream": "generate", "prompts": ["Customer: Hi"], "max_new_tokens": 4}
    run_decode(config_from_dict(config), progress=False, verbose=False)
    report = audit_run(tmp_path / case, mc_samples=50, play_game=False)
    check = report.check("epsilon_bracket")
    assert check.status.value == "SKIPPED" and expected in check.detail and report.bracket is None


def test_a_sound_claim_never_fails_through_the_choice_of_orders():
    """The ablation converts the tested pair's curve on a subset of the claim's grid that holds the
    claim's optimal order: a pair whose curve is at most the claim's at every order converts to at most
    the claimed epsilon, whatever the curves (before, the audit converted on its own grid from 1.25
    while the ledger minimised from 1.1, and an honest remove-one run FAILed, 1.332 > 1.318)."""
    import numpy as np

    from dpledger.accounting.conversion import epsilon_from_rdp
    from dpledger.accounting.curve import RdpCurve
    from dpledger.accounting.orders import DEFAULT_ORDERS
    from dpledger.audit.ablation import audit_orders

    rng = np.random.default_rng(4)
    grid = np.asarray(DEFAULT_ORDERS)
    for _ in range(300):
        scale, power = 10 ** rng.uniform(-4, 1), rng.uniform(0.5, 2.5)
        claim = scale * grid ** power * rng.uniform(1.0, 1.05, grid.size)
        pair = claim * rng.uniform(0.9, 1.0, grid.size)          # at most the claim at every order
        delta = 10 ** rng.uniform(-10, -2)
        claimed = epsilon_from_rdp(RdpCurve(DEFAULT_ORDERS, claim), delta)
        orders = audit_orders(DEFAULT_ORDERS, [claimed.order])
        assert set(orders) <= set(DEFAULT_ORDERS) and claimed.order in orders
        index = [DEFAULT_ORDERS.index(o) for o in orders]
        assert epsilon_from_rdp(RdpCurve(orders, pair[index]), delta).epsilon <= claimed.epsilon


def test_the_demo_prints_each_audited_runs_bracket(audited, tmp_path, capsys):
    from dpledger.demo import audit_and_report

    import shutil

    directory, report = audited["pmixed"]
    audited_name = tmp_path / "pmixed-proof-orders-ball"   # a name the demo audits (dpledger.demo.AUDITED)
    shutil.copytree(directory, audited_name)
    audit_and_report(tmp_path, [audited_name])
    out = capsys.readouterr().out
    row = report.bracket["rows"][0]
    assert (f"pmixed-proof-orders-ball PASS: epsilon(1e-05) in [{row['lower']:.4g}, {row['upper']:.4g}], "
            f"ratio {row['ratio']:.3g}") in out


def test_a_filtered_runs_claim_is_its_budget_where_that_is_smaller(micro_models, tmp_path):
    """AdaPMixED in a privacy filter charged the data-independent bound: the filter's (epsilon, delta) is
    the guarantee (Feldman & Zrnic 2021), so the bracket's upper end is the budget, not the larger
    data-dependent ledger epsilon; at a delta below the budget's it is the ledger's."""
    # a small beta at a low order: Theorem 3.1, which the filter charges, is far below the add-one bound
    config = micro_config(micro_models, tmp_path / "run",
                          {**PAPER_ADAPMIXED, "alpha": 4.0, "beta": 0.003, "ball": "proof-orders"},
                          queries=48, block_size=24, deltas=[1e-5, 1e-7])
    config["budget"] = {"epsilon": 6.0, "delta": 1e-5}
    run_decode(config_from_dict(config), progress=False, verbose=False)
    report = audit_run(tmp_path / "run", mc_samples=200, play_game=False)
    assert report.verdict == "PASS"
    at_budget, below = report.bracket["rows"]
    assert at_budget["claimed_by"] == "the privacy filter's budget" and at_budget["upper"] == 6.0
    assert below["claimed_by"] == "ledger.json's epsilon" and below["upper"] > 6.0
    assert 0 < at_budget["lower"] <= at_budget["upper"] and "the privacy filter's budget" in report.headline


def test_data_independent_claims_are_also_bracketed_by_constructed_datasets(audited):
    """A data-independent claim holds for every dataset: datasets built on the run's public laws are
    tested beside the run's own neighbours; a data-dependent claim is about the run's data only."""
    pairs = audited["pmixed"][1].check("epsilon_bracket").evidence["pairs"]
    built = [p for p in pairs if p.startswith("constructed dataset")]
    assert len(built) == 4 and any("removed" in p for p in built) and any("added" in p for p in built)
    for name in ("adapmixed-no-screen", "adapmixed"):
        assert not any(p.startswith("constructed") for p in audited[name][1].check("epsilon_bracket").evidence["pairs"])


def test_dpws_law_bounds_hold_and_tighten_with_draws():
    """DPWS's released law lies within its certified analytic bounds and, at the stated confidence, its
    Monte Carlo bounds; a regime where the threshold is far above the noise gives informative bounds."""
    import numpy as np
    import torch

    from dpledger.accounting.relation import NeighbouringRelation
    from dpledger.audit.bracket import dpws_law_bounds
    from dpledger.mechanisms.hot_pate import DPWeightedSampler

    sampler = DPWeightedSampler(4.0, 20.0, 1.0, NeighbouringRelation.ADD_OR_REMOVE_ONE, voters=48)
    histogram = np.zeros(40)
    histogram[[3, 7, 11]] = [30, 12, 6]
    rng = np.random.default_rng(3)
    draws = np.stack([sampler.probabilities_given_noise(histogram, rng.normal(0, 4.0, 40)) for _ in range(40000)])
    law = np.concatenate([[1 - draws.sum(1).mean()], draws.mean(0)])
    # (a token without votes passes once in ~3e6 draws: the reference resolves only the frequent outcomes)
    error = 5 * np.concatenate([[draws.sum(1).std()], draws.std(0)]) / np.sqrt(draws.shape[0]) + 1e-12
    seen = law > 1e-3
    analytic_low, analytic_high = sampler.output_law_bounds(histogram)
    assert np.all((analytic_low <= law + error)[seen]) and np.all((law - error <= analytic_high)[seen])
    assert np.all(analytic_low[~seen] <= 1e-3) and np.all(analytic_low <= analytic_high)
    widths = []
    for samples in (2000, 20000):
        low, high = dpws_law_bounds(sampler, histogram[None], torch.Generator().manual_seed(0), samples, 1e-6)
        assert np.all((low[0] <= law + error)[seen]) and np.all((law - error <= high[0])[seen])
        assert np.all(low[0][~seen] <= 1e-3) and np.all(low[0] <= high[0])
        widths.append(float(np.max(high[0] - low[0])))
    assert widths[1] < widths[0] and high[0][4] - low[0][4] < 0.02   # the top token's law, to 2%



@pytest.mark.parametrize("sigma, threshold, gamma, voters, histogram", [
    (1.5, 2.0, 1.0, 16, [8, 5, 3] + [0] * 60),            # most tokens pass now and then (Q(4/3) ~ 9%)
    (1.0, 0.5, 2.0, None, [0] * 30),                      # n = 0: the normaliser is the passing sum alone
    (2.0, 3.0, 1.0, 40, [30, 30, 12, 12, 6, 1, 1] + [0] * 25),   # counts far above T pass almost surely
])
def test_grouped_dpws_draws_bound_the_law_of_full_draws(sigma, threshold, gamma, voters, histogram):
    """dpws_law_bounds draws only each group's passing tokens; its bounds must hold for the law of
    drawing every token's noise (DPWeightedSampler.probabilities_given_noise over plain numpy normals)."""
    import numpy as np
    import torch

    from dpledger.accounting.relation import NeighbouringRelation
    from dpledger.audit.bracket import dpws_law_bounds
    from dpledger.mechanisms.hot_pate import DPWeightedSampler

    relation = NeighbouringRelation.REPLACE_ONE if voters is None else NeighbouringRelation.ADD_OR_REMOVE_ONE
    sampler = DPWeightedSampler(sigma, threshold, gamma, relation, voters=voters)
    histogram = np.asarray(histogram, dtype=np.float64)
    rng = np.random.default_rng(11)
    draws = np.stack([sampler.probabilities_given_noise(histogram, rng.normal(0, sigma, histogram.size))
                      for _ in range(30000)])
    law = np.concatenate([[1 - draws.sum(1).mean()], draws.mean(0)])
    error = 5 * np.concatenate([[draws.sum(1).std()], draws.std(0)]) / np.sqrt(draws.shape[0]) + 1e-12
    low, high = dpws_law_bounds(sampler, histogram[None], torch.Generator().manual_seed(5), 30000, 1e-6)
    assert np.all(low[0] <= law + error) and np.all(law - error <= high[0]) and np.all(low[0] <= high[0])
    for level in np.unique(histogram):   # exchangeable tokens share their bounds
        same = 1 + np.flatnonzero(histogram == level)
        assert np.ptp(low[0][same]) == 0 and np.ptp(high[0][same]) == 0
    assert np.max(high[0] - low[0]) < 0.05

GENERATED = {
    "pmixed": ({"type": "pmixed", "alpha": 6.0, "beta": 0.05}, "add_or_remove_one"),
    "adapmixed-add-or-remove": ({**SCREENED, "screening": False}, "add_or_remove_one"),
    "adapmixed-remove-one": ({**SCREENED, "screening": False}, "remove_one"),
    "adapmixed-add-one": ({**SCREENED, "screening": False}, "add_one"),
    "dpargmax": ({**DPARGMAX, "votes": "coordinated", "sigma": 2.0, "sigma_threshold": 2.0}, "add_or_remove_one"),
    "dpws": ({"type": "voting", "aggregator": "dpws", "votes": "coordinated", "sigma": 1.0}, "add_or_remove_one"),
}


@pytest.mark.parametrize("name, teachers", [(name, 4) for name in GENERATED]
                         + [("pmixed", 64), ("adapmixed-add-or-remove", 64), ("dpargmax", 16), ("dpws", 16)])
def test_generated_runs_are_bracketed_and_an_understated_claim_fails(tmp_path, name, teachers):
    """Random ensembles of 4 to 64 teachers: the lower bound stays below the claim, and half of it as a
    claim FAILs through the lower bound."""
    from dpledger.audit.ablation import check_ablation
    from dpledger.audit.voting import check_voting_ablation
    from tests.synthetic import write_synthetic_run

    mechanism, relation = GENERATED[name]
    if name in ("dpargmax", "dpws"):
        mechanism = {**mechanism, "threshold": teachers / 2}
    steps = 12 if name == "dpws" else 24   # DPWS's Monte Carlo law bounds: ~0.2 s a step, twice
    run = write_synthetic_run(tmp_path / "run", teachers, 48, steps, 12, dict(mechanism), payload=True, seed=teachers,
                              relation=relation)
    trace = load_trace(run)
    ablation = check_voting_ablation(trace) if name in ("dpargmax", "dpws") else check_ablation(trace, None, 100, 0)[0]
    result = check_epsilon_bracket(trace, ablation.evidence, mc_samples=100)
    assert result.status.value == "PASS", result.detail
    rows = result.evidence["rows"]
    assert all(0 < row["lower"] <= row["upper"] for row in rows), rows
    for entry in trace.ledger["epsilon"]:
        if entry["method"] == "improved":
            entry["epsilon"] = 0.5 * next(r["lower"] for r in rows if r["delta"] == entry["delta"])
    doctored = check_epsilon_bracket(trace, ablation.evidence, mc_samples=100)
    assert doctored.status.value == "FAIL" and "the claim under-states" in doctored.detail


def test_a_dual_run_is_bracketed_by_the_optimised_adversary(micro_models, tmp_path):
    """With add_one_dual the audit also adds, per step, the primal adversary of the add-one bound at
    the claim's order (an added teacher PMixED projects like any other): on a narrow ball the bracket
    closes to within a factor 2 (a claim below the lower bound would FAIL as everywhere else)."""
    mechanism = {**SCREENED, "screening": False, "beta": 0.01, "add_one_dual": True}
    config = micro_config(micro_models, tmp_path / "dual", mechanism, queries=2, block_size=2)  # the dual costs ~0.7 s a step
    run_decode(config_from_dict(config), progress=False, verbose=False)
    report = audit_run(tmp_path / "dual", mc_samples=50, play_game=False)
    evidence = report.check("epsilon_bracket").evidence
    assert report.verdict == "PASS" and any("optimised adversary" in p for p in evidence["pairs"])
    row = evidence["rows"][0]
    assert "optimised adversary" in row["neighbour"] and 0 < row["lower"] <= row["upper"] < 2 * row["lower"], row
