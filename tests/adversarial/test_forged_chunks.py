"""A forger (or a careless copy) changes the chunk files of steps/ of a correct AdaPMixED ("ada")
and PMixED ("pm") run: swaps, reorders, duplicates, deletes or truncates chunks, plants another
run's chunk, garbage, empty or zero-row files, links, stray copies and directories. The audit must
FAIL (exit 1) or refuse the run in one line (exit 2), never PASS, and the report must not show a
PASS; a consistently truncated run is a valid shorter run that only the published head tells apart."""
import copy as deepcopy
import os
import shutil

import pyarrow.parquet as pq
import pytest

from dpledger.decoding import trace
from tests.forging import (chunk_files, forge, ledger_of, load_chunks, read_json, reconcile, reissue_final,
                           replace_bytes, write_ledger)

pytestmark = pytest.mark.adversarial
BOTH = ["ada", "pm"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_two_chunk_files_swapped(attack, kind):
    run = attack.copy(kind)
    a, b = chunk_files(run)[:2]
    a.rename(a.with_name("swap.tmp"))
    b.rename(a)
    a.with_name("swap.tmp").rename(b)
    attack.audit(run)


@pytest.mark.slow
def test_chunks_reordered_full_forge(attack):
    run = attack.copy("pm")
    forge(run, edit_chunks=lambda c: [c[1], c[0]] + c[2:])
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_a_chunk_duplicated_as_a_new_chunk(attack, kind):
    run = attack.copy(kind)
    shutil.copy(chunk_files(run)[-1], trace.chunk_path(run, len(chunk_files(run))))
    attack.audit(run)


@pytest.mark.slow
def test_a_chunk_duplicated_full_forge(attack):
    run = attack.copy("pm")
    forge(run, edit_chunks=lambda c: c + [deepcopy.deepcopy(c[-1])])
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_the_first_chunk_deleted(attack, kind):
    run = attack.copy(kind)
    chunk_files(run)[0].unlink()
    attack.audit(run)


@pytest.mark.parametrize("kind", BOTH)
def test_the_last_chunk_deleted(attack, kind):
    run = attack.copy(kind)
    chunk_files(run)[-1].unlink()
    attack.audit(run)


def _truncate(run) -> None:
    """Delete the last chunk and its payload, shrink the config's queries to match, reconcile the
    manifest, re-chain, recompute ledger and final: a consistent shorter run."""
    last = len(chunk_files(run)) - 1
    kept = sum(len(c) for c in load_chunks(run)[:last])

    def edit(manifest):
        manifest["config"]["queries"] = kept
        reconcile(manifest)
    forge(run, keep_blocks=last, edit_manifest=edit)


@pytest.mark.parametrize("kind", BOTH)
def test_a_truncated_full_forge_fails_against_the_published_head(attack, kind):
    run = attack.copy(kind)
    _truncate(run)
    attack.audit(run, "--expect-head", attack.head(kind), expect=(1,))


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_a_truncated_full_forge_is_detected_by_the_published_head_only(attack, kind):
    """A known limit: a truncated, consistently re-chained run is a valid shorter run, so without
    the published head a PASS is allowed (never a traceback, exit 3 or exit 4); with it, FAIL."""
    run = attack.copy(kind)
    _truncate(run)
    attack.audit(run, expect=(0, 1, 2))
    attack.audit(run, "--expect-head", attack.head(kind), expect=(1,))


@pytest.mark.slow
def test_a_chunk_with_zero_rows(attack):
    run = attack.copy("pm")
    path = chunk_files(run)[-1]
    pq.write_table(pq.read_table(path).slice(0, 0), path)
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_an_empty_chunk_file(attack, kind):
    run = attack.copy(kind)
    replace_bytes(chunk_files(run)[0], b"")
    attack.audit(run)


@pytest.mark.slow
def test_a_chunk_of_garbage_bytes(attack):
    run = attack.copy("pm")
    replace_bytes(chunk_files(run)[0], os.urandom(5000))
    attack.audit(run)


@pytest.mark.slow
def test_a_truncated_chunk_file(attack):
    run = attack.copy("ada")
    data = chunk_files(run)[-1].read_bytes()
    replace_bytes(chunk_files(run)[-1], data[: len(data) // 2])
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_a_chunk_from_the_other_run(attack, kind):
    run = attack.copy(kind)
    shutil.copy(chunk_files(attack.other(kind))[0], chunk_files(run)[0])
    attack.audit(run)


@pytest.mark.slow
@pytest.mark.parametrize("kind", BOTH)
def test_a_chunk_from_the_other_run_full_forge(attack, kind):
    run = attack.copy(kind)
    other = load_chunks(attack.other(kind))
    forge(run, edit_chunks=lambda c: [other[0]] + c[1:], level="chain")
    try:  # the records do not fit this manifest: a forger may not be able to compute the ledger
        write_ledger(run, ledger_of(read_json(run / trace.MANIFEST), load_chunks(run)))
    except Exception:  # noqa: BLE001
        pass
    reissue_final(run)
    attack.audit(run)


@pytest.mark.slow
def test_a_chunk_replaced_by_a_link_to_the_other_run(attack):
    run = attack.copy("pm")
    chunk_files(run)[0].unlink()
    trace.chunk_path(run, 0).symlink_to(chunk_files(attack.other("pm"))[0])
    attack.audit(run)


@pytest.mark.parametrize("kind", BOTH)
def test_a_stray_copy_in_steps(attack, kind):
    run = attack.copy(kind)
    shutil.copy(chunk_files(run)[0], run / "steps" / "chunk-000001 (copy).parquet")
    attack.audit(run)


@pytest.mark.slow
def test_a_stray_directory_in_steps(attack):
    run = attack.copy("pm")
    (run / "steps" / "old").mkdir()
    attack.audit(run)


@pytest.mark.slow
def test_a_chunk_path_that_is_a_directory(attack):
    run = attack.copy("pm")
    trace.chunk_path(run, len(chunk_files(run))).mkdir()
    attack.audit(run)


@pytest.mark.slow
def test_a_stray_uncommitted_temporary_chunk_is_benign(attack):
    """An interrupted atomic write: never committed, ignored by design; any clean answer will do."""
    run = attack.copy("pm")
    shutil.copy(chunk_files(run)[0], run / "steps" / ".chunk-000009.parquet.tmp-4242")
    attack.audit(run, expect=(0, 1, 2, 3))


@pytest.mark.slow
def test_steps_is_a_file(attack):
    run = attack.copy("pm")
    shutil.rmtree(run / "steps")
    (run / "steps").write_text("not a directory")
    attack.audit(run)
