"""A run charged by Theorem 3.1 (PMixED at every ball, subsampled PMixED, AdaPMixED without
data-dependence) records no Eq. 3 since records_version 3: the decode loop computes only what it
charges. The audit's theorem_3_1 check computes Eq. 3 itself from the replay payload at the orders
where Theorem 3.1 is claimed, and these tests hold it to that: the check ran on every step, at those
orders, and its largest Eq. 3 / Theorem 3.1 ratio is the one a straightforward Eq. 3
(tests/straightforward.py, no package kernel) gives; a forged run whose Eq. 3 exceeds Theorem 3.1
fails; an older trace's recorded Eq. 3 is still read and must agree with the recomputation.
"""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from dpledger.audit import audit_run
from dpledger.audit.bounds import check_theorem_3_1, exact_eq3
from dpledger.audit.loader import load_trace
from dpledger.decoding import trace as trace_files
from dpledger.decoding.ensemble import Ensemble
from tests.forging import forge
from tests.micro import ADAPMIXED, PMIXED
from tests.straightforward import reference_renyi_orders
from tests.synthetic import write_synthetic_run

LOSS_FIELDS = {"observed_data_dependent", "eq3_remove_one", "add_one_bound"}
CHARGED_BY_THEOREM_3_1 = {
    "projection-order": {"type": "pmixed", **PMIXED},
    "proof-orders": {"type": "pmixed", **PMIXED, "ball": "proof-orders"},
    "all-orders": {"type": "pmixed", **PMIXED, "ball": "all-orders"},
    "subsampled": {"type": "pmixed", **PMIXED, "sample_rate": 0.5},
    "adapmixed-theorem-3-1": {**ADAPMIXED, "data_dependent": False},
}
STEPS = 24


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("theorem_3_1")
    mechanisms = {**CHARGED_BY_THEOREM_3_1, "adapmixed-data-dependent": ADAPMIXED}
    return {name: write_synthetic_run(root / name, teachers=4, vocab=32, steps=STEPS, block_size=8,
                                      mechanism=mechanism, payload=True)
            for name, mechanism in mechanisms.items()}


def _reference_eq3(public: torch.Tensor, mixed: torch.Tensor, sampled: list[int] | None,
                   orders: torch.Tensor) -> torch.Tensor:
    """max over the ensemble's teachers i of max(D_a(p || p_-i), D_a(p_-i || p)), written from Eq. 3:
    p the mean of the (sampled) mixed teachers, the public model for an empty ensemble; removing the
    only one leaves the public model; removing an unsampled teacher changes nothing."""
    members = list(range(mixed.shape[0])) if sampled is None else sampled
    if not members:
        return torch.zeros(orders.numel(), dtype=torch.float64)
    output = mixed[members].mean(dim=0)
    worst = torch.zeros(orders.numel(), dtype=torch.float64)
    for i in members:
        rest = [j for j in members if j != i]
        without = mixed[rest].mean(dim=0) if rest else public
        forward = reference_renyi_orders(output.log(), without.log(), orders)
        backward = reference_renyi_orders(without.log(), output.log(), orders)
        worst = torch.maximum(worst, torch.maximum(forward, backward))
    return worst


def _reference_ratio(run) -> float:
    """The largest Eq. 3 / Theorem 3.1 (the record's data_independent) over the steps, at the orders
    the claim covers: <= alpha, or every order for the all-orders ball."""
    loaded = load_trace(run)
    alpha = loaded.params["alpha"]
    within = loaded.orders <= (np.inf if loaded.params.get("ball") == "all-orders" else alpha + 1e-12)
    orders = torch.as_tensor(loaded.orders[within], dtype=torch.float64)
    subsampled = loaded.params.get("sample_rate") is not None
    ratio = 0.0
    for _, records, logits in loaded.iter_payload():
        public, teachers = Ensemble.split_distributions(logits)
        for row, record in enumerate(records):
            lambdas = torch.tensor(record["lambdas"], dtype=torch.float64)[:, None]
            mixed = lambdas * teachers[row] + (1 - lambdas) * public[row]
            eq3 = _reference_eq3(public[row], mixed, record["sampled_teachers"] if subsampled else None, orders)
            bound = np.asarray(record["data_independent"])[within]
            ratio = max(ratio, float(np.max(eq3.numpy() / bound)))
    return ratio


@pytest.mark.parametrize("name", list(CHARGED_BY_THEOREM_3_1))
def test_a_run_charged_by_theorem_3_1_passes_with_eq3_recomputed_at_the_claimed_orders(runs, name):
    report = audit_run(runs[name], mc_samples=50, play_game=False, write=False)
    assert report.verdict == "PASS", [(c.name, c.detail) for c in report.failed]
    check = report.check("theorem_3_1")
    assert check.status.value == "PASS"
    evidence = check.evidence
    loaded = load_trace(runs[name])
    claimed = loaded.orders if name == "all-orders" else loaded.orders[loaded.orders <= loaded.params["alpha"]]
    assert evidence["eq3_source"] == "recomputed" and evidence["steps_compared"] == STEPS
    assert evidence["orders"] == claimed.tolist() and (name == "all-orders") == (claimed.size == loaded.orders.size)
    assert evidence["max_ratio"] == pytest.approx(_reference_ratio(runs[name]), rel=1e-9)
    assert 0 < evidence["max_ratio"] and evidence["charged_exceeding_steps"] == 0
    assert f"at the {claimed.size} orders where Theorem 3.1 is claimed" in check.detail


@pytest.mark.parametrize("name", list(CHARGED_BY_THEOREM_3_1))
def test_the_trace_holds_no_loss_it_does_not_charge(runs, name):
    manifest = trace_files.read_manifest(runs[name])
    assert manifest["records_version"] == trace_files.RECORDS_VERSION >= 4  # 5: voting payloads, 6: the solver only
    for chunk in sorted((runs[name] / trace_files.STEPS_DIR).glob("chunk-*.parquet")):
        assert not LOSS_FIELDS & set(pq.read_schema(chunk).names), chunk
    ledger = trace_files.read_ledger(runs[name])
    assert not {"observed_data_dependent_total", "eq3_remove_one_total", "min_data_dependent_theorem_3_1_total"} & set(
        ledger)


def test_a_data_dependent_run_still_records_the_loss_it_charges(runs):
    run = runs["adapmixed-data-dependent"]
    for chunk in sorted((run / trace_files.STEPS_DIR).glob("chunk-*.parquet")):
        assert LOSS_FIELDS <= set(pq.read_schema(chunk).names)
    check = check_theorem_3_1(load_trace(run))
    assert check.status.value == "PASS" and check.evidence["eq3_source"].startswith("recorded")


@pytest.mark.parametrize("name", ["projection-order", "adapmixed-theorem-3-1"])
def test_mixing_weights_forged_so_that_eq3_exceeds_theorem_3_1_fail(runs, tmp_path, name):
    """Every lambda set to 1 (the raw teachers, far outside the ball) and the run re-chained and
    re-issued: the recomputed Eq. 3 exceeds the Theorem 3.1 the run charged."""
    import shutil

    run = tmp_path / name
    shutil.copytree(runs[name], run)
    forge(run, edit_record=lambda record: record.update(lambdas=[1.0] * len(record["lambdas"])))
    check = check_theorem_3_1(load_trace(run))
    assert check.status.value == "FAIL", check.detail
    assert check.evidence["charged_exceeding_steps"] > 0 and check.evidence["max_ratio"] > 1
    assert "charged Theorem 3.1 although their Eq. 3 exceeds it" in check.detail
    assert audit_run(run, mc_samples=50, play_game=False, write=False).verdict == "FAIL"


def _as_version_2(loaded):
    """The run's trace as records_version 2 wrote it: Eq. 3 recorded on every step at every order by the
    package's leave-one-out kernel (as that version's decode loop did), held in memory and served to
    the checks."""
    orders = torch.as_tensor(loaded.orders, dtype=torch.float64)
    blocks = []
    for block, records, logits in loaded.iter_payload(window=10 ** 6):
        public, teachers = Ensemble.split_distributions(logits)
        lambdas = torch.tensor([r["lambdas"] for r in records], dtype=torch.float64)
        eq3 = exact_eq3(teachers, public, lambdas, orders)
        for row, record in enumerate(records):
            record.update(observed_data_dependent=eq3[row].tolist(), eq3_remove_one=eq3[row].tolist(), add_one_bound=[])
        blocks.append((block, records))
    loaded.iter_blocks = lambda: iter(blocks)
    loaded.manifest["records_version"] = 2
    return loaded, blocks


def test_an_older_traces_recorded_eq3_is_read_and_held_to_the_recomputation(runs):
    loaded, blocks = _as_version_2(load_trace(runs["projection-order"]))
    check = check_theorem_3_1(loaded)
    assert check.status.value == "PASS" and check.evidence["eq3_source"] == "recomputed", check.detail
    blocks[1][1][3]["eq3_remove_one"] = [v * 0.5 for v in blocks[1][1][3]["eq3_remove_one"]]
    check = check_theorem_3_1(loaded)
    step = blocks[1][1][3]["step"]
    assert check.status.value == "FAIL" and f"first: [{step}]" in check.detail and "differs from its recomputation" \
        in check.detail
    loaded._logits_source = None      # no payload and no models: the recorded values are all there is
    blocks[1][1][3]["eq3_remove_one"][0] = float("nan")
    check = check_theorem_3_1(loaded)
    assert check.evidence["eq3_source"].startswith("recorded, not recomputed")
    assert check.status.value == "FAIL" and check.detail == f"eq3_remove_one is NaN at steps [{step}]"


def test_a_version_3_run_without_its_distributions_skips_the_check(runs):
    loaded = load_trace(runs["projection-order"])
    loaded._logits_source = None
    check = check_theorem_3_1(loaded)
    assert check.status.value == "SKIPPED" and "needs the per-step distributions" in check.detail
