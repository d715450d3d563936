"""A forger edits manifest.json of a correct AdaPMixED ("ada") and PMixED ("pm") run: mechanism
parameters, model hashes, counts, seeds, canaries, deltas, relations, orders, components, with the
config and the rest of the manifest reconciled as a forger who read audit/consistency.py would,
with or without re-chaining and re-issuing final.json; or puts junk, another run's manifest,
non-UTF-8 text or JSON literals dpledger does not write in its place. The audit must FAIL (exit 1)
or refuse the run in one line (exit 2), never PASS, and the report must not show a PASS. Where a
consistent rewrite changes only what the audit cannot check without the published head (a known
limit), a PASS without --expect-head is allowed and the published head must FAIL it."""
import shutil

import pytest

from dpledger.decoding import trace
from tests.forging import (edit_manifest, forge, ledger_of, load_chunks, read_json, reconcile, reissue_final,
                           replace_bytes, write_ledger)
from tests.micro import PMIXED

pytestmark = pytest.mark.adversarial
BOTH = ["ada", "pm"]


def _config_edit(change):
    """A manifest edit that changes manifest["config"] and reconciles the rest with it."""
    def edit(manifest):
        change(manifest["config"])
        reconcile(manifest)
    return edit


def _fails_with_the_published_head_only(attack, kind, run, game=False):
    """A known limit: without the published head a PASS is allowed (never a traceback, exit 3 or
    4); with it, the audit must FAIL."""
    attack.audit(run, expect=(0, 1, 2), game=game)
    attack.audit(run, "--expect-head", attack.head(kind), expect=(1,), game=game)


# -- the mechanism ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", BOTH)
def test_beta_edited_not_rechained(attack, kind):
    run = attack.copy(kind)
    edit_manifest(run, lambda m: m["mechanism"]["params"].update(beta=m["mechanism"]["params"]["beta"] * 2))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_beta_edited_full_forge(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_manifest=_config_edit(lambda c: c["mechanism"].update(beta=c["mechanism"]["beta"] * 2)))
    attack.audit(run)


@pytest.mark.slow
def test_alpha_edited_full_forge(attack):
    run = attack.copy("pm")
    forge(run, edit_manifest=_config_edit(lambda c: c["mechanism"].update(alpha=8.0)))
    attack.audit(run)


@pytest.mark.slow
def test_sigma_raised_full_forge(attack):
    """A larger sigma claims a cheaper screen."""
    run = attack.copy("ada")
    forge(run, edit_manifest=_config_edit(lambda c: c["mechanism"].update(sigma=1.0)))
    attack.audit(run)


@pytest.mark.slow
def test_accounting_relabelled_realised_path_full_forge(attack):
    """Relabelling the accounting is honest when no screen failed (both accountings charge every
    step the same): only the published head detects it."""
    run = attack.copy("ada")
    forge(run, edit_manifest=_config_edit(lambda c: c["mechanism"].update(accounting="realised-path")))
    _fails_with_the_published_head_only(attack, "ada", run)


@pytest.mark.slow
def test_mechanism_params_edited_without_the_config_full_forge(attack):
    """mechanism.params disagree with config.mechanism."""
    run = attack.copy("ada")
    forge(run, edit_manifest=lambda m: m["mechanism"]["params"].update(sigma=1.0))
    attack.audit(run)


@pytest.mark.slow
def test_mechanism_swapped_for_pmixed_full_forge(attack):
    run = attack.copy("ada")
    forge(run, edit_manifest=_config_edit(lambda c: c.update(mechanism=dict(PMIXED))), level="chain")
    try:  # the records do not fit this manifest: a forger may not be able to compute the ledger
        write_ledger(run, ledger_of(read_json(run / trace.MANIFEST), load_chunks(run)))
    except Exception:  # noqa: BLE001
        pass
    reissue_final(run)
    attack.audit(run)


@pytest.mark.slow
def test_beta_nan_not_rechained(attack):
    run = attack.copy("pm")
    edit_manifest(run, lambda m: (m["mechanism"]["params"].update(beta=float("nan")),
                                  m["config"]["mechanism"].update(beta=float("nan"))))
    attack.audit(run)


@pytest.mark.slow
def test_beta_infinity_full_forge(attack):
    run = attack.copy("pm")

    def edit(manifest):
        manifest["config"]["mechanism"]["beta"] = float("inf")
        manifest["mechanism"]["params"]["beta"] = float("inf")
    forge(run, edit_manifest=edit)
    attack.audit(run)


@pytest.mark.slow
def test_literal_nan_beta_not_rechained(attack):
    run = attack.copy("ada")
    text = (run / trace.MANIFEST).read_text()
    assert '"beta": 0.002' in text
    replace_bytes(run / trace.MANIFEST, text.replace('"beta": 0.002', '"beta": NaN').encode())
    attack.audit(run)


@pytest.mark.slow
def test_component_relations_as_a_list(attack):
    run = attack.copy("ada")
    edit_manifest(run, lambda m: m["mechanism"].update(component_relations=["add_or_remove_one"]))
    attack.audit(run)


@pytest.mark.slow
def test_component_relations_junk_values(attack):
    run = attack.copy("pm")
    edit_manifest(run, lambda m: m["mechanism"].update(
        component_relations={k: "banana" for k in m["mechanism"]["components"]}))
    attack.audit(run)


@pytest.mark.slow
def test_components_edited_not_rechained(attack):
    run = attack.copy("ada")
    edit_manifest(run, lambda m: m["mechanism"].update(components={"screen": False}))
    attack.audit(run)


@pytest.mark.slow
def test_components_as_a_list(attack):
    run = attack.copy("pm")
    edit_manifest(run, lambda m: m["mechanism"].update(components=["pmixed_theorem_3_1"]))
    attack.audit(run)


# -- models ----------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_a_model_hash_edited_not_rechained(attack, kind):
    run = attack.copy(kind)
    edit_manifest(run, lambda m: m["models"][1].update(content_hash="0" * 64))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_a_model_hash_edited_full_forge(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_manifest=lambda m: m["models"][1].update(content_hash="0" * 64))
    attack.audit(run)


@pytest.mark.slow
def test_models_dropped_full_forge(attack):
    run = attack.copy("pm")
    forge(run, edit_manifest=lambda m: m.update(models=[]))
    attack.audit(run)


# -- counts, seeds, relation, deltas, orders -------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_queries_edited_not_rechained(attack, kind):
    run = attack.copy(kind)
    edit_manifest(run, lambda m: m.update(queries=m["queries"] * 2))
    attack.audit(run)


@pytest.mark.slow
def test_queries_edited_full_forge(attack):
    run = attack.copy("pm")
    forge(run, edit_manifest=_config_edit(lambda c: c.update(queries=c["queries"] * 2)))
    attack.audit(run)


@pytest.mark.slow
def test_seed_edited_not_rechained(attack):
    run = attack.copy("pm")
    edit_manifest(run, lambda m: m.update(seeds={"run": 8}))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_seed_edited_full_forge(attack, kind):
    run = attack.copy(kind)
    forge(run, edit_manifest=_config_edit(lambda c: c.update(seed=c["seed"] + 1)))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_delta_edited_not_rechained(attack, kind):
    run = attack.copy(kind)
    edit_manifest(run, lambda m: m["config"].update(deltas=[1e-3]))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_delta_edited_full_forge(attack, kind):
    """The same charges reported at a weaker delta are honest numbers for that delta: only the
    published head detects the change."""
    run = attack.copy(kind)
    forge(run, edit_manifest=_config_edit(lambda c: c.update(deltas=[1e-3])))
    _fails_with_the_published_head_only(attack, kind, run)


@pytest.mark.slow
def test_config_deltas_as_a_string_rechained_final_recomputed(attack):
    run = attack.copy("pm")
    forge(run, edit_manifest=lambda m: m["config"].update(deltas="1e-5"), level="chain")
    reissue_final(run)
    attack.audit(run)


@pytest.mark.slow
def test_relation_edited_not_rechained(attack):
    run = attack.copy("pm")
    edit_manifest(run, lambda m: m.update(relation="remove_one"))
    attack.audit(run)


@pytest.mark.slow
def test_relation_remove_one_full_forge(attack):
    run = attack.copy("ada")
    forge(run, edit_manifest=_config_edit(lambda c: c.update(relation="remove_one")))
    attack.audit(run)


@pytest.mark.slow
def test_n_teachers_edited_not_rechained(attack):
    run = attack.copy("pm")
    edit_manifest(run, lambda m: m.update(n_teachers=2))
    attack.audit(run)


@pytest.mark.slow
def test_n_teachers_as_a_string(attack):
    run = attack.copy("ada")
    edit_manifest(run, lambda m: m.update(n_teachers="3"))
    attack.audit(run)


@pytest.mark.slow
def test_orders_trimmed_rechained_final_recomputed(attack):
    run = attack.copy("pm")
    forge(run, edit_manifest=lambda m: m.update(orders=m["orders"][:5]), level="chain")
    reissue_final(run)
    attack.audit(run)


@pytest.mark.slow
def test_orders_as_strings(attack):
    run = attack.copy("pm")
    edit_manifest(run, lambda m: m.update(orders=[str(v) for v in m["orders"]]))
    attack.audit(run)


@pytest.mark.slow
def test_vocab_size_zero_full_forge(attack):
    run = attack.copy("pm")
    forge(run, edit_manifest=lambda m: m.update(vocab_size=0))
    attack.audit(run)


@pytest.mark.slow
def test_vocab_size_huge_full_forge(attack):
    run = attack.copy("ada")
    forge(run, edit_manifest=lambda m: m.update(vocab_size=10 ** 12))
    attack.audit(run)


@pytest.mark.slow
def test_data_as_a_list(attack):
    run = attack.copy("pm")
    edit_manifest(run, lambda m: m.update(data=[]))
    attack.audit(run)


@pytest.mark.slow
def test_config_data_as_a_list(attack):
    run = attack.copy("pm")
    edit_manifest(run, lambda m: m["config"].update(data=[1]))
    attack.audit(run)


# -- canaries and metadata -------------------------------------------------------------------------

@pytest.mark.slow
def test_a_canary_edited_not_rechained(attack):
    run = attack.copy("ada")
    edit_manifest(run, lambda m: m["canaries"][0].update(secret="AAAA0000"))
    attack.audit(run, game=True)


@pytest.mark.slow
def test_canaries_removed_full_forge(attack):
    """The canaries are metadata for the sampled game: a consistent re-chain is detected by the head only."""
    run = attack.copy("ada")
    forge(run, edit_manifest=lambda m: m.update(canaries=[]))
    _fails_with_the_published_head_only(attack, "ada", run, game=True)


@pytest.mark.slow
def test_started_at_edited_full_forge(attack):
    """Start time and versions are metadata: a consistent re-chain is detected by the head only."""
    run = attack.copy("pm")
    forge(run, edit_manifest=lambda m: m.update(started_at="2020-01-01T00:00:00+00:00"))
    _fails_with_the_published_head_only(attack, "pm", run)


@pytest.mark.slow
def test_schema_version_1(attack):
    run = attack.copy("pm")
    edit_manifest(run, lambda m: m.update(schema_version=1))
    attack.audit(run)


# -- the whole file --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", BOTH)
def test_the_manifest_of_the_other_run(attack, kind):
    run = attack.copy(kind)
    shutil.copy(attack.other(kind) / trace.MANIFEST, run / trace.MANIFEST)
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_the_manifest_of_the_other_run_rechained_final_recomputed(attack, kind):
    run = attack.copy(kind)
    shutil.copy(attack.other(kind) / trace.MANIFEST, run / trace.MANIFEST)
    forge(run, level="chain")
    reissue_final(run)
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_the_manifest_not_utf8(attack, kind):
    run = attack.copy(kind)
    data = (run / trace.MANIFEST).read_bytes()
    assert b'"format"' in data
    replace_bytes(run / trace.MANIFEST, data.replace(b'"format"', b'"f\xf6rmat"'))
    attack.audit(run)


@pytest.mark.slow
def test_the_manifest_empty(attack):
    run = attack.copy("pm")
    replace_bytes(run / trace.MANIFEST, b"")
    attack.audit(run)


@pytest.mark.slow
def test_the_manifest_a_json_array(attack):
    run = attack.copy("ada")
    replace_bytes(run / trace.MANIFEST, b"[]")
    attack.audit(run)


@pytest.mark.slow
def test_the_manifest_deleted(attack):
    run = attack.copy("pm")
    (run / trace.MANIFEST).unlink()
    attack.audit(run)
