"""A forger edits the exact-replay payload (replay/block-*.npy) of a correct AdaPMixED ("ada") and
PMixED ("pm") run: edits the logits, chains the new bytes, recomputes the records from forged
logits, plants garbage, other shapes and dtypes, pickles, NaNs; or deletes the payload and moves
the models or the run's text away; or hands over a locked, empty or non-directory run. The audit
must FAIL (exit 1) or refuse the run in one line (exit 2), never PASS a changed run; where what
verification needs is gone (no payload and no models), UNVERIFIED (exit 3), never PASS."""
import fcntl
import shutil

import numpy as np
import pytest

from dpledger.decoding import trace
from tests.forging import (chain_payload_as_it_is, forge, forge_payload, point_models_nowhere, replace_bytes,
                           scale_charges)

pytestmark = pytest.mark.adversarial
BOTH = ["ada", "pm"]


def _teachers_like_public(logits):
    logits[1:] = logits[0:1] + 0.05 * (logits[1:] - logits[0:1])  # teachers agree: smaller losses
    return logits


def _models_nowhere(manifest):
    point_models_nowhere(manifest, config_too=True)


# -- the payload edited ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", BOTH)
def test_payload_logits_edited(attack, kind):
    run = attack.copy(kind)
    logits = np.load(trace.replay_path(run, 0))
    logits[1:, :, :] += 0.5 * (logits[0:1] - logits[1:])
    np.save(trace.replay_path(run, 0), logits)
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_payload_logits_edited_hash_rechained_full_forge(attack, kind):
    run = attack.copy(kind)
    forge_payload(run, 0, lambda l: l + 0.01 * (l[0:1] - l), recompute_records=False)
    attack.audit(run)


@pytest.mark.parametrize("kind", BOTH)
def test_payload_forged_records_recomputed_full_forge(attack, kind):
    """Forged logits, the records recomputed from them exactly as decode would: the models at the
    recorded paths give other logits."""
    run = attack.copy(kind)
    forge_payload(run, 0, _teachers_like_public, recompute_records=True)
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_payload_forged_records_recomputed_model_hash_edited_full_forge(attack, kind):
    """The models are present at the recorded paths, but the forger also edits one recorded model
    content hash, so that the audit stops cross-checking the payload against them."""
    run = attack.copy(kind)
    forge_payload(run, 0, _teachers_like_public, recompute_records=True)
    forge(run, edit_manifest=lambda m: m["models"][0].update(content_hash="0" * 64))
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_payload_forged_records_recomputed_models_nowhere_full_forge(attack, kind):
    """A known limit: forged logits in a consistently re-chained run whose recorded models are
    absent cannot be told from a genuine run without the published head."""
    run = attack.copy(kind)
    forge_payload(run, 0, _teachers_like_public, recompute_records=True)
    forge(run, edit_manifest=_models_nowhere)
    attack.audit(run, expect=(0, 1, 2))
    attack.audit(run, "--expect-head", attack.head(kind), expect=(1,))


@pytest.mark.slow
def test_payload_garbage_hash_rechained(attack):
    run = attack.copy("pm")
    path = trace.replay_path(run, 0)
    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))
    chain_payload_as_it_is(run, 0)
    attack.audit(run)


@pytest.mark.slow
def test_payload_of_the_wrong_shape_hash_rechained(attack):
    run = attack.copy("ada")
    np.save(trace.replay_path(run, 0), np.load(trace.replay_path(run, 0))[:, :5, :])
    chain_payload_as_it_is(run, 0)
    attack.audit(run)


@pytest.mark.slow
def test_payload_of_int_dtype_hash_rechained(attack):
    run = attack.copy("pm")
    np.save(trace.replay_path(run, 0), np.load(trace.replay_path(run, 0)).astype(np.int32))
    chain_payload_as_it_is(run, 0)
    attack.audit(run)


@pytest.mark.slow
def test_payload_of_two_dimensions_hash_rechained(attack):
    run = attack.copy("pm")
    np.save(trace.replay_path(run, 0), np.load(trace.replay_path(run, 0))[0])
    chain_payload_as_it_is(run, 0)
    attack.audit(run)


@pytest.mark.slow
def test_payload_a_pickled_object_hash_rechained(attack):
    """np.load would run the pickle: the audit must not."""
    run = attack.copy("ada")
    np.save(trace.replay_path(run, 0), np.array([{"a": 1}], dtype=object), allow_pickle=True)
    chain_payload_as_it_is(run, 0)
    attack.audit(run)


@pytest.mark.slow
def test_payload_nan_logits_hash_rechained(attack):
    run = attack.copy("pm")

    def nan(logits):
        logits[2, 3, :] = float("nan")
        return logits
    forge_payload(run, 0, nan, recompute_records=False)
    attack.audit(run)


@pytest.mark.slow
def test_payload_empty_file(attack):
    run = attack.copy("ada")
    replace_bytes(trace.replay_path(run, 1), b"")
    attack.audit(run)


@pytest.mark.slow
def test_payload_stray_file(attack):
    run = attack.copy("pm")
    shutil.copy(trace.replay_path(run, 0), run / "replay" / "block-000000 (copy).npy")
    attack.audit(run)


@pytest.mark.slow
def test_replay_is_a_file(attack):
    """As good as a deleted payload (the models are there to replay from): any clean answer."""
    run = attack.copy("pm")
    shutil.rmtree(run / "replay")
    (run / "replay").write_text("x")
    attack.audit(run, expect=(0, 1, 2, 3))


# -- the payload deleted, the models or the text moved away ----------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_payload_deleted_with_the_models_present_passes(attack, kind):
    """The control: users delete payloads; the replay then re-runs the models."""
    run = attack.copy(kind)
    shutil.rmtree(run / "replay")
    attack.audit(run, expect=(0,))


@pytest.mark.parametrize("kind", BOTH)
def test_payload_deleted_model_paths_nowhere_full_forge_is_unverified(attack, kind):
    run = attack.copy(kind)
    shutil.rmtree(run / "replay")
    forge(run, edit_manifest=_models_nowhere)
    attack.audit(run, expect=(3,))


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_payload_deleted_model_paths_nowhere_charges_halved_full_forge(attack, kind):
    run = attack.copy(kind)
    shutil.rmtree(run / "replay")
    forge(run, edit_manifest=_models_nowhere, edit_record=scale_charges(run, 0.5))
    attack.audit(run, expect=(1, 3))


@pytest.mark.parametrize("kind", BOTH)
def test_payload_deleted_models_moved_away_is_unverified(attack, kind):
    run = attack.copy(kind)
    shutil.rmtree(run / "replay")
    with attack.away("models"):
        attack.audit(run, expect=(3,))


@pytest.mark.slow
def test_one_payload_block_deleted_models_moved_away_is_unverified(attack):
    run = attack.copy("ada")
    trace.replay_path(run, 1).unlink()
    with attack.away("models"):
        attack.audit(run, expect=(3,))


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_payload_deleted_models_moved_away_charges_halved_full_forge(attack, kind):
    run = attack.copy(kind)
    shutil.rmtree(run / "replay")
    forge(run, edit_record=scale_charges(run, 0.5))
    with attack.away("models"):
        attack.audit(run, expect=(1, 3))


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_the_runs_text_moved_away_with_the_payload_present_passes(attack, kind):
    """The control: an auditor without the run's text file; nothing was changed."""
    run = attack.copy(kind)
    with attack.away("text"):
        attack.audit(run, expect=(0,))


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_payload_deleted_models_and_text_moved_away_is_unverified(attack, kind):
    run = attack.copy(kind)
    shutil.rmtree(run / "replay")
    with attack.away("models", "text"):
        attack.audit(run, expect=(3,))


# -- the whole directory ---------------------------------------------------------------------------

@pytest.mark.slow
def test_a_run_locked_by_a_writer_is_one_line(attack):
    run = attack.copy("pm")
    with open(run / ".lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        attack.audit(run, expect=(2,), report=False)


@pytest.mark.slow
def test_a_run_directory_that_is_a_file_is_one_line(attack):
    run = attack.copy("pm")
    shutil.rmtree(run)
    run.write_text("x")
    attack.audit(run, expect=(2,))


@pytest.mark.slow
def test_an_empty_run_directory_is_one_line(attack):
    run = attack.copy("pm")
    shutil.rmtree(run)
    run.mkdir()
    attack.audit(run, expect=(2,))
