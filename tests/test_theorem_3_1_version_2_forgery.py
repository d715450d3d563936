"""A version 2 trace of a run charged by Theorem 3.1 recorded the same exact Eq. 3 in two fields,
`eq3_remove_one` and `observed_data_dependent`. Since records_version 3 the decode loop computes neither,
so the replay check no longer recomputes them; the theorem_3_1 check recomputes Eq. 3 and must hold both
fields to it. A forger who relabels a run as version 2 and records zero observed losses beside the true
Eq. 3 (re-chained, ledger and final.json re-issued) once passed the whole audit."""
from __future__ import annotations

import shutil

import pytest
import torch

from dpledger.audit import audit_run
from dpledger.audit.bounds import check_theorem_3_1, exact_eq3
from dpledger.audit.loader import load_trace
from dpledger.decoding.ensemble import Ensemble
from tests.forging import forge
from tests.micro import PMIXED
from tests.synthetic import write_synthetic_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("v2_forgery") / "run", teachers=4, vocab=32, steps=16,
                               block_size=8, mechanism={"type": "pmixed", **PMIXED}, payload=True)


def _true_eq3(run) -> dict[int, list[float]]:
    loaded = load_trace(run)
    orders = torch.as_tensor(loaded.orders, dtype=torch.float64)
    eq3 = {}
    for _, records, logits in loaded.iter_payload():
        public, teachers = Ensemble.split_distributions(logits)
        lambdas = torch.tensor([r["lambdas"] for r in records], dtype=torch.float64)
        for record, row in zip(records, exact_eq3(teachers, public, lambdas, orders)):
            eq3[record["step"]] = row.tolist()
    return eq3


@pytest.mark.parametrize("observed_scale", [0.0, 0.5])
def test_a_version_2_relabel_with_forged_observed_losses_fails(run, tmp_path, observed_scale):
    eq3 = _true_eq3(run)
    forged = tmp_path / "forged"
    shutil.copytree(run, forged)

    def as_version_2(manifest):
        manifest["records_version"] = 2

    forge(forged, edit_manifest=as_version_2, edit_record=lambda r: r.update(
        eq3_remove_one=eq3[r["step"]], observed_data_dependent=[v * observed_scale for v in eq3[r["step"]]],
        add_one_bound=[]))
    check = check_theorem_3_1(load_trace(forged))
    assert check.status.value == "FAIL" and "differs from its recomputation" in check.detail, check.detail
    assert audit_run(forged, mc_samples=50, play_game=False, write=False).verdict == "FAIL"


def test_a_version_2_relabel_with_honest_fields_passes_the_check(run, tmp_path):
    eq3 = _true_eq3(run)
    honest = tmp_path / "honest"
    shutil.copytree(run, honest)

    def as_version_2(manifest):
        manifest["records_version"] = 2

    forge(honest, edit_manifest=as_version_2, edit_record=lambda r: r.update(
        eq3_remove_one=eq3[r["step"]], observed_data_dependent=eq3[r["step"]], add_one_bound=[]))
    check = check_theorem_3_1(load_trace(honest))
    assert check.status.value == "PASS" and check.evidence["eq3_source"] == "recomputed", check.detail
