"""A forger edits ledger.json (every field a report shows, with or without re-issuing final.json
for the new bytes), writes junk, non-UTF-8 text, JSON literals dpledger does not write, a BOM, a
directory or a FIFO in its place; or edits final.json (its head, its counts, with or without the
head recomputed), or takes another run's, or audits against another run's or a malformed head.
On a correct AdaPMixED ("ada") and PMixED ("pm") run the audit must FAIL (exit 1) or refuse the
run in one line (exit 2), never PASS, and the report must not show a PASS."""
import os
import shutil

import pytest

from dpledger.decoding import trace
from tests.forging import (edit_final, edit_ledger, lower_epsilons, read_json, reissue_final, replace_bytes,
                           replace_with_fifo)

pytestmark = pytest.mark.adversarial
BOTH = ["ada", "pm"]


# -- ledger.json -----------------------------------------------------------------------------------

def _edited_text(path, *replacements) -> bytes:
    """The file's text with each (old, new) replaced once; each `old` must be there."""
    text = path.read_text()
    for old, new in replacements:
        assert old in text, f"{path.name} has no {old!r} to replace"
        text = text.replace(old, new, 1)
    return text.encode()


@pytest.mark.parametrize("kind", BOTH)
def test_ledger_epsilons_lowered(attack, kind):
    run = attack.copy(kind)
    edit_ledger(run, lower_epsilons, refinal=False)
    attack.audit(run)


@pytest.mark.parametrize("kind", BOTH)
def test_ledger_epsilons_lowered_final_recomputed(attack, kind):
    run = attack.copy(kind)
    edit_ledger(run, lower_epsilons)
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_ledger_curve_values_lowered_final_recomputed(attack, kind):
    run = attack.copy(kind)

    def edit(ledger):
        for component in ledger["ledger"]["components"].values():
            component["values"] = [v / 2 if isinstance(v, float) else v for v in component["values"]]
    edit_ledger(run, edit)
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_ledger_data_dependent_flag_flipped_final_recomputed(attack, kind):
    run = attack.copy(kind)
    edit_ledger(run, lambda l: l.update(data_dependent=not l["data_dependent"]))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_ledger_perplexity_edited_final_recomputed(attack, kind):
    run = attack.copy(kind)
    edit_ledger(run, lambda l: l.update(perplexity=l["perplexity"] * 0.8))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_ledger_answered_by_public_edited_final_recomputed(attack, kind):
    run = attack.copy(kind)
    edit_ledger(run, lambda l: l.update(answered_by_public=l["answered_by_public"] + 3))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_ledger_orders_edited_final_recomputed(attack, kind):
    run = attack.copy(kind)

    def edit(ledger):
        for entry in ledger["epsilon"]:
            entry["order"] = 2.0
    edit_ledger(run, edit)
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_ledger_relation_edited_final_recomputed(attack, kind):
    run = attack.copy(kind)
    edit_ledger(run, lambda l: l.update(relation="remove_one" if l["relation"] != "remove_one" else "add_one"))
    attack.audit(run)


@pytest.mark.slow
def test_ledger_claimed_relation_edited_final_recomputed(attack):
    run = attack.copy("ada")
    edit_ledger(run, lambda l: l.update(claimed_relation="remove_one"))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_ledger_accounting_edited_final_recomputed(attack, kind):
    run = attack.copy(kind)
    edit_ledger(run, lambda l: l.update(accounting="realised-path"))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_ledger_deltas_edited_final_recomputed(attack, kind):
    run = attack.copy(kind)

    def edit(ledger):
        for entry in ledger["epsilon"]:
            entry["delta"] = 1e-3
        ledger["breakdown"]["delta"] = 1e-3
    edit_ledger(run, edit)
    attack.audit(run)


@pytest.mark.slow
def test_ledger_key_removed_final_recomputed(attack):
    run = attack.copy("pm")
    edit_ledger(run, lambda l: l.pop("warnings"))
    attack.audit(run)


@pytest.mark.slow
def test_ledger_extra_key_final_recomputed(attack):
    run = attack.copy("pm")
    edit_ledger(run, lambda l: l.update(certified=True))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_ledger_epsilon_nan_final_recomputed(attack, kind):
    run = attack.copy(kind)
    edit_ledger(run, lambda l: l["epsilon"][0].update(epsilon=float("nan")))
    attack.audit(run)


@pytest.mark.slow
def test_ledger_epsilon_infinity_final_recomputed(attack):
    run = attack.copy("pm")
    edit_ledger(run, lambda l: l["epsilon"][0].update(epsilon=float("inf")))
    attack.audit(run)


@pytest.mark.slow
def test_ledger_epsilon_list_as_a_string_final_recomputed(attack):
    run = attack.copy("pm")
    edit_ledger(run, lambda l: l.update(epsilon="0.1"))
    attack.audit(run)


@pytest.mark.slow
def test_ledger_epsilon_value_as_a_string_final_recomputed(attack):
    run = attack.copy("pm")
    edit_ledger(run, lambda l: l["epsilon"][0].update(epsilon="0.1"))
    attack.audit(run)


@pytest.mark.slow
def test_ledger_breakdown_as_a_list_final_recomputed(attack):
    run = attack.copy("pm")
    edit_ledger(run, lambda l: l.update(breakdown=[1, 2]))
    attack.audit(run)


@pytest.mark.slow
def test_ledger_breakdown_rows_junk_final_recomputed(attack):
    run = attack.copy("ada")
    edit_ledger(run, lambda l: l["breakdown"].update(rows=[{"epsilon": "x"}, 5]))
    attack.audit(run)


@pytest.mark.slow
def test_ledger_steps_as_a_string_final_recomputed(attack):
    run = attack.copy("pm")
    edit_ledger(run, lambda l: l.update(steps=str(l["steps"])))
    attack.audit(run)


@pytest.mark.slow
def test_ledger_inner_ledger_as_a_list_final_recomputed(attack):
    run = attack.copy("ada")
    edit_ledger(run, lambda l: l.update(ledger=[]))
    attack.audit(run)


@pytest.mark.slow
def test_ledger_not_utf8(attack):
    run = attack.copy("pm")
    data = (run / trace.LEDGER).read_bytes()
    replace_bytes(run / trace.LEDGER, data[:10] + b"\xff\xfe" + data[12:])
    attack.audit(run)


@pytest.mark.slow
def test_ledger_not_utf8_final_recomputed(attack):
    run = attack.copy("ada")
    data = (run / trace.LEDGER).read_bytes()
    assert b'"accounting"' in data
    replace_bytes(run / trace.LEDGER, data.replace(b'"accounting"', b'"acc\xe9unting"'))
    reissue_final(run)
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_ledger_empty(attack, kind):
    run = attack.copy(kind)
    replace_bytes(run / trace.LEDGER, b"")
    attack.audit(run)


@pytest.mark.slow
def test_ledger_a_json_array_final_recomputed(attack):
    run = attack.copy("pm")
    replace_bytes(run / trace.LEDGER, b"[1, 2, 3]\n")
    reissue_final(run)
    attack.audit(run)


@pytest.mark.slow
def test_ledger_literal_nan_and_infinity_final_recomputed(attack):
    run = attack.copy("ada")
    replace_bytes(run / trace.LEDGER, _edited_text(run / trace.LEDGER, ('"answered_by_public": 0', '"answered_by_public": NaN'),
                                                   ('"perplexity": ', '"perplexity": Infinity, "x_perplexity": ')))
    reissue_final(run)
    attack.audit(run)


@pytest.mark.slow
def test_ledger_with_a_utf8_bom_final_recomputed(attack):
    run = attack.copy("pm")
    replace_bytes(run / trace.LEDGER, b"\xef\xbb\xbf" + (run / trace.LEDGER).read_bytes())
    reissue_final(run)
    attack.audit(run)


@pytest.mark.slow
def test_ledger_is_a_directory(attack):
    run = attack.copy("pm")
    (run / trace.LEDGER).unlink()
    (run / trace.LEDGER).mkdir()
    attack.audit(run)


@pytest.mark.slow
def test_ledger_is_a_fifo(attack):
    """Opening a FIFO for reading blocks until a writer comes: the audit and the report must not."""
    run = attack.copy("pm")
    replace_with_fifo(run / trace.LEDGER)
    attack.audit(run, seconds=15)


@pytest.mark.slow
def test_ledger_deleted(attack):
    run = attack.copy("ada")
    (run / trace.LEDGER).unlink()
    attack.audit(run)


# -- final.json ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", BOTH)
def test_final_head_edited(attack, kind):
    run = attack.copy(kind)
    edit_final(run, lambda f: f.update(head="f" * 64), rehead=False)
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_final_steps_edited_head_recomputed(attack, kind):
    run = attack.copy(kind)
    edit_final(run, lambda f: f.update(steps=f["steps"] - 1))
    attack.audit(run)


@pytest.mark.slow
def test_final_extra_field_head_recomputed(attack):
    run = attack.copy("pm")
    edit_final(run, lambda f: f.update(verified=True))
    attack.audit(run)


@pytest.mark.slow
def test_final_steps_as_a_string_head_recomputed(attack):
    run = attack.copy("ada")
    edit_final(run, lambda f: f.update(steps=str(f["steps"])))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_final_from_the_other_run(attack, kind):
    run = attack.copy(kind)
    shutil.copy(attack.other(kind) / trace.FINAL, run / trace.FINAL)
    attack.audit(run)


@pytest.mark.slow
def test_final_deleted(attack):
    run = attack.copy("pm")
    (run / trace.FINAL).unlink()
    attack.audit(run)


@pytest.mark.slow
def test_final_empty(attack):
    run = attack.copy("ada")
    replace_bytes(run / trace.FINAL, b"")
    attack.audit(run)


@pytest.mark.slow
def test_final_not_utf8(attack):
    run = attack.copy("pm")
    replace_bytes(run / trace.FINAL, b"\x80" + (run / trace.FINAL).read_bytes())
    attack.audit(run)


@pytest.mark.slow
def test_final_literal_nan(attack):
    run = attack.copy("pm")
    replace_bytes(run / trace.FINAL, _edited_text(run / trace.FINAL, ('"blocks": 2', '"blocks": NaN')))
    attack.audit(run)


@pytest.mark.slow
def test_final_a_json_array(attack):
    run = attack.copy("pm")
    replace_bytes(run / trace.FINAL, b'["head"]')
    attack.audit(run)


@pytest.mark.slow
def test_final_head_as_a_list(attack):
    run = attack.copy("ada")
    edit_final(run, lambda f: f.update(head=[f["head"]]), rehead=False)
    attack.audit(run)


@pytest.mark.parametrize("kind", BOTH)
def test_an_untouched_run_against_the_other_runs_head_fails(attack, kind):
    run = attack.copy(kind)
    attack.audit(run, "--expect-head", read_json(attack.other(kind) / trace.FINAL)["head"], expect=(1,))


@pytest.mark.slow
def test_a_malformed_expected_head_is_one_line(attack):
    run = attack.copy("pm")
    attack.audit(run, "--expect-head", "XYZ", expect=(2,))


@pytest.mark.parametrize("kind", BOTH)
def test_an_untouched_copy_passes_against_its_published_head(attack, kind):
    """The control: without it every FAIL above could be a broken harness."""
    run = attack.copy(kind)
    attack.audit(run, "--expect-head", attack.head(kind), expect=(0,))
    assert os.path.exists(run / "audit.json")
