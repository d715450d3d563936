"""A PASS audit.json beside files it did not audit (a lowered ledger, a full forgery, a re-chained
manifest edit, another run's audit) and junk in audit.json's place: `dpledger report` must still
report the run (exit 0, no traceback), never print a PASS verdict, and call a PASS made for other
files STALE."""
import json
import shutil

import pytest

from dpledger.audit import audit_run
from tests.adversarial.verdicts import assert_clean, report_verdicts
from tests.forging import copy, edit_ledger, forge, lower_epsilons, scale_charges

pytestmark = pytest.mark.adversarial
BOTH = ["ada", "pm"]
OTHER = {"ada": "pm", "pm": "ada"}


@pytest.fixture(scope="module")
def passed(adversary, tmp_path_factory) -> dict:
    """kind -> the audit.json bytes of the correct run's PASS audit."""
    root = tmp_path_factory.mktemp("stale")
    audits = {}
    for kind, run in adversary.runs.items():
        audited = copy(run, root / kind)
        report = audit_run(audited, mc_samples=10, play_game=False)
        assert report.verdict == "PASS", [c.to_dict() for c in report.failed]
        audits[kind] = (audited / "audit.json").read_bytes()
        shutil.rmtree(audited)
    return audits


def _reported(attack, run, audit_json: bytes):
    (run / "audit.json").write_bytes(audit_json)
    report = attack.cli("report", run, "--format", "md")
    assert_clean(report, (0,), "report: ")
    assert "PASS" not in report_verdicts(report.out), "the report prints a PASS verdict beside files the audit did not see"
    return report


@pytest.mark.parametrize("kind", BOTH)
def test_a_pass_beside_a_lowered_ledger_is_stale(attack, passed, kind):
    run = attack.copy(kind)
    edit_ledger(run, lower_epsilons, refinal=False)
    assert "STALE" in _reported(attack, run, passed[kind]).out


@pytest.mark.parametrize("kind", BOTH)
def test_a_pass_beside_a_lowered_ledger_final_recomputed_is_stale(attack, passed, kind):
    run = attack.copy(kind)
    edit_ledger(run, lower_epsilons)
    assert "STALE" in _reported(attack, run, passed[kind]).out


@pytest.mark.parametrize("kind", BOTH)
def test_a_pass_beside_a_full_forge_is_stale(attack, passed, kind):
    run = attack.copy(kind)
    forge(run, edit_record=scale_charges(run, 0.5))
    assert "STALE" in _reported(attack, run, passed[kind]).out


@pytest.mark.parametrize("kind", BOTH)
def test_a_pass_beside_a_rechained_manifest_edit_is_stale(attack, passed, kind):
    run = attack.copy(kind)
    forge(run, edit_manifest=lambda m: m.update(started_at="2020-01-01T00:00:00+00:00"))
    assert "STALE" in _reported(attack, run, passed[kind]).out


@pytest.mark.parametrize("kind", BOTH)
def test_the_pass_of_the_other_run_is_stale(attack, passed, kind):
    run = attack.copy(kind)
    assert "STALE" in _reported(attack, run, passed[OTHER[kind]]).out


@pytest.mark.parametrize("kind", BOTH)
def test_a_garbage_audit_json(attack, kind):
    _reported(attack, attack.copy(kind), b"{garbage")


@pytest.mark.parametrize("kind", BOTH)
def test_an_audit_json_not_utf8(attack, passed, kind):
    assert b'"PASS"' in passed[kind]
    _reported(attack, attack.copy(kind), passed[kind].replace(b'"PASS"', b'"P\xc4SS"', 1))


@pytest.mark.parametrize("kind", BOTH)
def test_an_audit_json_whose_audited_files_are_a_string(attack, passed, kind):
    value = json.loads(passed[kind])
    value["audited"] = "everything"
    _reported(attack, attack.copy(kind), json.dumps(value).encode())


@pytest.mark.parametrize("kind", BOTH)
def test_an_audit_json_that_is_a_json_array(attack, kind):
    _reported(attack, attack.copy(kind), b"[]")
