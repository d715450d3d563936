"""A forger edits the per-step records of a correct AdaPMixED ("ada") and PMixED ("pm") run:
their charges, tokens, probabilities, mixing weights, screen decisions and hashes, or drops,
swaps and duplicates records; without re-chaining, re-chained, with ledger.json recomputed, or
fully forged (final.json re-issued: a self-consistent run with a new head). The audit must FAIL
(exit 1) or refuse the run in one line (exit 2), never PASS, and the report must not show a PASS."""
import pytest

from tests.forging import components, first_record, forge, scale_charges, set_charges

pytestmark = pytest.mark.adversarial
BOTH = ["ada", "pm"]


# -- per-step charges ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", BOTH)
def test_charges_halved_not_rechained(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_record=scale_charges(run, 0.5), level="none")
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_charges_halved_rechained(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_record=scale_charges(run, 0.5), level="chain")
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_charges_halved_rechained_ledger_recomputed(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_record=scale_charges(run, 0.5), level="ledger")
    attack.audit(run)


@pytest.mark.parametrize("kind", BOTH)
def test_charges_halved_full_forge(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_record=scale_charges(run, 0.5))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_charges_halved_full_forge_fails_against_the_published_head(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_record=scale_charges(run, 0.5))
    attack.audit(run, "--expect-head", attack.head(kind), expect=(1,))


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_charges_zeroed_full_forge(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_record=set_charges(run, 0.0))
    attack.audit(run)


@pytest.mark.slow
def test_charges_doubled_full_forge(attack):
    run = attack.copy("pm")
    forge(run, edit_record=scale_charges(run, 2.0))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_one_charge_lowered_by_a_relative_1e_6_full_forge(attack, kind):
    run = attack.copy(kind)
    name = components(run)[0]

    def edit(record):
        record[f"rdp_{name}"] = [v * (1 - 1e-6) for v in record[f"rdp_{name}"]]
    forge(run, edit_record=first_record(edit))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_one_step_charged_negative_rechained(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_record=first_record(scale_charges(run, -1.0)), level="chain")
    attack.audit(run)


@pytest.mark.slow
def test_one_step_charged_nan_rechained(attack):
    run = attack.copy("ada")
    forge(run, edit_record=first_record(set_charges(run, float("nan"))), level="chain")
    attack.audit(run)


@pytest.mark.slow
def test_a_charge_column_dropped_rechained(attack):
    run = attack.copy("ada")
    name = components(run)[0]
    forge(run, edit_record=lambda r: r.pop(f"rdp_{name}"), level="chain")
    attack.audit(run)


@pytest.mark.slow
def test_charges_as_their_repr_strings_rechained_read_the_same(attack):
    """Floats replaced by their repr strings hash the same (trace._canonical writes a float as its
    repr string), so the chain and the head do not change and numpy reads the same values back: a
    PASS against the published head is allowed here (nothing dpledger reads changed)."""
    run = attack.copy("pm")
    name = components(run)[0]

    def edit(record):
        record[f"rdp_{name}"] = [str(v) for v in record[f"rdp_{name}"]]
    forge(run, edit_record=edit, level="chain")
    attack.audit(run, "--expect-head", attack.head("pm"), expect=(0, 1, 2))


# -- records ---------------------------------------------------------------------------------------

def _drop_sixth(chunks):
    return [chunks[0][:5] + chunks[0][6:]] + chunks[1:]


def _swap_first_two(chunks):
    return [[chunks[0][1], chunks[0][0]] + chunks[0][2:]] + chunks[1:]


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_a_record_dropped_not_rechained(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_chunks=_drop_sixth, level="none")
    attack.audit(run)


@pytest.mark.parametrize("kind", BOTH)
def test_a_record_dropped_full_forge(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_chunks=_drop_sixth)
    attack.audit(run)


@pytest.mark.slow
def test_the_last_record_dropped_full_forge(attack):
    run = attack.copy("pm")
    forge(run, edit_chunks=lambda c: c[:-1] + [c[-1][:-1]])
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_two_records_swapped_not_rechained(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_chunks=_swap_first_two, level="none")
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_two_records_swapped_full_forge(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_chunks=_swap_first_two)
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_a_record_duplicated_full_forge(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_chunks=lambda c: [c[0][:3] + [dict(c[0][2])] + c[0][3:]] + c[1:])
    attack.audit(run)


@pytest.mark.parametrize("kind", BOTH)
def test_an_output_token_edited_full_forge(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_record=first_record(lambda r: r.update(output_token=(r["output_token"] + 1) % 300)))
    attack.audit(run)


@pytest.mark.slow
def test_true_and_context_tokens_edited_full_forge(attack):
    """A consistent token stream, just not the run's text."""
    run = attack.copy("pm")

    def edit(chunks):
        for record in chunks[0][3:6]:
            record["true_token"] = 7
        for record in chunks[0][4:7]:
            record["context_token"] = 7
        return chunks
    forge(run, edit_chunks=edit)
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_prob_true_token_edited_full_forge(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_record=first_record(lambda r: r.update(prob_true_token=min(1.0, r["prob_true_token"] * 3))))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_mixing_weights_edited_full_forge(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_record=first_record(lambda r: r.update(lambdas=[v * 0.5 for v in r["lambdas"]])))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_observed_data_dependent_losses_edited_full_forge(attack, kind):
    """AdaPMixED's recorded losses scaled down; PMixED, which records none (records_version 3), given
    a column of zero losses: its records then no longer fit the manifest."""
    run = attack.copy(kind)
    if kind == "ada":
        forge(run, edit_record=lambda r: r.update(observed_data_dependent=[v * 0.1 for v in r["observed_data_dependent"]]))
    else:
        forge(run, edit_record=lambda r: r.update(observed_data_dependent=[0.0] * len(r["data_independent"])))
    attack.audit(run)


@pytest.mark.slow
def test_a_screen_decision_flipped_full_forge(attack):
    run = attack.copy("ada")

    def edit(record):
        record.update(screen_passed=not record["screen_passed"],
                      answered_by="public" if record["screen_passed"] else "mechanism")
    forge(run, edit_record=first_record(edit))
    attack.audit(run)


@pytest.mark.slow
def test_a_screen_statistic_edited_full_forge(attack):
    run = attack.copy("ada")
    forge(run, edit_record=first_record(lambda r: r.update(screen_statistic=r["screen_statistic"] * 0.9)))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_the_payload_hash_field_edited_full_forge(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_record=lambda r: r.update(payload_sha256="0" * 64) if r["block"] == 0 else None)
    attack.audit(run)


@pytest.mark.slow
def test_step_numbers_as_strings_rechained(attack):
    run = attack.copy("pm")
    forge(run, edit_record=lambda r: r.update(step=str(r["step"])), level="chain")
    attack.audit(run)


@pytest.mark.slow
def test_mixing_weights_as_a_string_rechained(attack):
    run = attack.copy("ada")
    forge(run, edit_record=lambda r: r.update(lambdas="0.5"), level="chain")
    attack.audit(run)


@pytest.mark.slow
def test_an_extra_column_full_forge(attack):
    run = attack.copy("pm")
    forge(run, edit_record=lambda r: r.update(note="forged"))
    attack.audit(run)


@pytest.mark.slow
def test_record_hashes_as_ints_not_rechained(attack):
    run = attack.copy("pm")
    forge(run, edit_record=lambda r: r.update(record_hash=int(r["record_hash"][:12], 16)), level="none")
    attack.audit(run)
