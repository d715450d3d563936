"""Every per-step field and ledger total named for the quantity it holds, read against that
quantity's own computation (tests/straightforward.py, which shares no code with the package).

- `eq3_remove_one`: Flemings et al. 2024, Eq. 3, max over removed teachers i of D<->(p, p_-i), exact
  or a certified upper bound within leave_one_out_curve's 0.5% (data-dependent runs charge it on a
  sub-grid with chords between);
- `add_one_bound`: an upper bound for any added teacher, never looser than the straightforward form
  of the add-one theorem (dpledger.mechanisms.add_one.add_one_divergence_bounds' derivation);
- `observed_data_dependent`: the loss covering the run's relation (the larger of the two under
  add-or-remove-one, Eq. 3 alone under remove-one); a run charged by Theorem 3.1 records none of the
  three (records_version 3);
- ledger.json's totals sum each field over the answered steps and say what they hold;
- theorem_3_1 compares Eq. 3 with Theorem 3.1 (recomputing Eq. 3 where the run does not record it), and says so.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dpledger.accounting.relation import NeighbouringRelation
from dpledger.audit import audit_run
from dpledger.audit.bounds import check_theorem_3_1
from dpledger.audit.loader import load_trace
from dpledger.decoding import trace as trace_files
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.ensemble import Ensemble
from dpledger.decoding.run import run_decode
from dpledger.mechanisms.pmixed import PMixED
from tests.micro import PAPER_ADAPMIXED, micro_config
from tests.straightforward import reference_add_one_bounds, reference_renyi_orders

DATA_DEPENDENT = {**PAPER_ADAPMIXED, "screening": False}
KINDS = {
    "add-or-remove": (DATA_DEPENDENT, None),
    "remove-one": (DATA_DEPENDENT, "remove_one"),
    "pmixed": ({"type": "pmixed", "alpha": 6.0, "beta": 0.05}, None),
}
EQ3_TOLERANCE = 0.005
"""leave_one_out_curve's relative tolerance between the orders it evaluates exactly."""


@pytest.fixture(scope="module")
def runs(micro_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("labels")
    made = {}
    for name, (mechanism, relation) in KINDS.items():
        config = micro_config(micro_models, root / name, dict(mechanism), queries=24, block_size=24,
                              **({"relation": relation} if relation else {}))
        run_decode(config_from_dict(config), progress=False, verbose=False)
        made[name] = root / name
    return made


def _steps(trace):
    """(record, public (V,), mixed teachers (N, V)) for every step, from the exact-replay payload."""
    def window(loaded, records, logits):
        public, teachers = Ensemble.split_distributions(logits)
        lambdas = torch.tensor([r["lambdas"] for r in records], dtype=torch.float64)
        mixed = lambdas[..., None] * teachers + (1.0 - lambdas[..., None]) * public[:, None, :]
        return list(zip(records, public, mixed))
    return [step for _, rows in trace.map_windows(window) for step in rows]


def _exact_eq3(mixed: torch.Tensor, orders: torch.Tensor) -> np.ndarray:
    """max_i max(D_a(p || p_-i), D_a(p_-i || p)) with p the mean of the mixed teachers."""
    n = mixed.shape[0]
    output = mixed.mean(dim=0)
    worst = torch.zeros(orders.numel(), dtype=torch.float64)
    for i in range(n):
        without = torch.cat([mixed[:i], mixed[i + 1:]]).mean(dim=0)
        forward = reference_renyi_orders(output.log(), without.log(), orders)
        backward = reference_renyi_orders(without.log(), output.log(), orders)
        worst = torch.maximum(worst, torch.maximum(forward, backward))
    return worst.numpy()


@pytest.mark.parametrize("name", list(KINDS))
def test_each_per_step_field_holds_what_it_is_named_for(runs, name):
    trace = load_trace(runs[name])
    assert trace.manifest["records_version"] >= 4  # 5 changed voting payloads, 6 the solver only
    relation = NeighbouringRelation(trace.manifest["relation"])
    params = trace.params
    orders = torch.as_tensor(trace.orders, dtype=torch.float64)
    pmixed = PMixED(params["alpha"], params["beta"], params["teachers"], ball=params.get("ball", "projection-order"))
    for record, public, mixed in _steps(trace):
        if name == "pmixed":  # charged by Theorem 3.1: the decode loop computes and records no loss
            assert not {"eq3_remove_one", "observed_data_dependent", "add_one_bound"} & set(record), record["step"]
            continue
        exact = _exact_eq3(mixed, orders)
        eq3 = np.asarray(record["eq3_remove_one"])
        assert np.all(eq3 >= exact * (1 - 1e-9) - 1e-15), record["step"]
        assert np.all(eq3 <= exact * (1 + EQ3_TOLERANCE) + 1e-12), record["step"]
        observed = np.asarray(record["observed_data_dependent"])
        if "add" not in relation.moves:
            assert not record["add_one_bound"] and np.array_equal(observed, eq3)
            continue
        added = np.asarray(record["add_one_bound"])
        reference = reference_add_one_bounds(mixed.mean(dim=0), public, mixed.shape[0], orders, pmixed.alpha,
                                             pmixed.radius).numpy()
        assert np.all(added <= reference * (1 + EQ3_TOLERANCE) + 1e-12), record["step"]
        assert np.all(added >= 0), record["step"]
        assert np.array_equal(observed, np.maximum(eq3, added)), record["step"]


@pytest.mark.parametrize("name", list(KINDS))
def test_ledger_totals_sum_their_fields_and_say_what_they_hold(runs, name):
    ledger = trace_files.read_ledger(runs[name])
    records = trace_files.read_records(runs[name])
    answered = [r for r in records if r["answered_by"] == "mechanism"]
    relation = trace_files.read_manifest(runs[name])["relation"]
    if name == "pmixed":  # its records hold no data-dependent loss, so its ledger sums none
        assert not {"eq3_remove_one_total", "observed_data_dependent_total", "add_one_bound_total",
                    "min_data_dependent_theorem_3_1_total"} & set(ledger)
        return
    expected = {"eq3_remove_one_total": ("eq3_remove_one", "remove_one", "Eq. 3"),
                "observed_data_dependent_total": ("observed_data_dependent", relation, "Eq. 3")}
    if name == "add-or-remove":
        expected["add_one_bound_total"] = ("add_one_bound", "add_one", "an upper bound for any added teacher")
    else:
        assert "add_one_bound_total" not in ledger
    for key, (field, covered, words) in expected.items():
        total = ledger[key]
        values = np.sum([r[field] for r in answered], axis=0)
        np.testing.assert_allclose(total["values"], values, rtol=1e-12)
        assert np.all(np.asarray(total["values"]) >= values * (1 - 1e-15))  # rounded up, never down
        assert total["relation"] == covered and words in total["note"], (key, total["relation"], total["note"])


@pytest.mark.parametrize("name", ["add-or-remove", "pmixed"])
def test_theorem_3_1_compares_eq3_and_says_so(runs, name):
    trace = load_trace(runs[name])
    result = check_theorem_3_1(trace)
    assert "Eq. 3" in result.detail and "add-one" not in result.detail
    within = trace.orders <= trace.params["alpha"]
    assert result.evidence["orders"] == trace.orders[within].tolist()
    if name == "pmixed":  # the decoded PMixED run records no Eq. 3: the check computed it, on every step
        orders = torch.as_tensor(trace.orders[within], dtype=torch.float64)
        ratio = max(float(np.max(_exact_eq3(mixed, orders) / np.asarray(record["data_independent"])[within]))
                    for record, _, mixed in _steps(trace))
        assert result.status.value == "PASS" and result.evidence["eq3_source"] == "recomputed"
        assert result.evidence["steps_compared"] == trace.steps and result.evidence["max_ratio"] == pytest.approx(
            ratio, rel=1e-9)
    if name == "add-or-remove":  # the add-one bound exceeds Theorem 3.1 at N = 3; Eq. 3 must not be blamed for it
        report = audit_run(runs[name], mc_samples=100, play_game=False)
        assert report.check("theorem_3_1").status.value == "PASS"


@pytest.mark.parametrize("name", ["add-or-remove", "remove-one", "pmixed"])
def test_per_teacher_accounting_composes_each_teachers_own_losses(runs, name):
    """max_i epsilon(sum_t D(p_t || p_t,-i)) over both directions, recomputed straightforwardly on the
    audit's orders: at most the ledger's composition of the per-step maximum."""
    from dpledger.accounting.conversion import epsilon_from_rdp
    from dpledger.accounting.curve import RdpCurve

    report = audit_run(runs[name], mc_samples=100, play_game=False)
    evidence = report.check("neighbour_ablation").evidence
    per_teacher = evidence["per_teacher"]
    if name == "pmixed":  # the default add-or-remove claim: PMixED's runs compute no add-one bound
        assert "no add-one bound total" in per_teacher["reason"]
        return
    trace = load_trace(runs[name])
    orders = torch.as_tensor(evidence["audit_orders"], dtype=torch.float64)
    forward = backward = None
    for _, _, mixed in _steps(trace):
        output = mixed.mean(dim=0)
        without = torch.stack([torch.cat([mixed[:i], mixed[i + 1:]]).mean(dim=0) for i in range(mixed.shape[0])])
        f = reference_renyi_orders(output.log().expand_as(without), without.log(), orders)
        b = reference_renyi_orders(without.log(), output.log().expand_as(without), orders)
        forward, backward = (f, b) if forward is None else (forward + f, backward + b)
    delta = evidence["delta"]
    expected = max(epsilon_from_rdp(RdpCurve(orders.numpy(), torch.maximum(forward[i], backward[i]).numpy()),
                                    delta).epsilon for i in range(forward.shape[0]))
    assert per_teacher["parts"]["remove_one"] == pytest.approx(expected, rel=1e-9)
    assert per_teacher["epsilon"] <= per_teacher["composed_max_epsilon"] * (1 + 1e-9)
    assert per_teacher["epsilon"] == per_teacher["parts"][per_teacher["attained_by"]]
    assert "Feldman & Zrnic 2021" in per_teacher["label"] and "not a DP guarantee" in per_teacher["label"]
    if name == "add-or-remove":
        assert per_teacher["parts"]["add_one"] == trace.ledger["add_one_bound_total"]["epsilon"]
    assert "per-teacher data-dependent epsilon" in report.check("neighbour_ablation").detail
