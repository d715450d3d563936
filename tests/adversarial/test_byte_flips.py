"""Seeded single-byte flips of a random file (manifest, ledger, final record, a chunk, a payload
block) of a correct AdaPMixED or PMixED run: the audit never PASSes unless the flipped file reads
the same as before (as dpledger reads it), never says UNVERIFIED while the payload and the models
are there, and never answers with a traceback or exit 4. The default run tries FAST flips, the slow
run the rest of FLIPS."""
import io
import json
import random

import pytest

from dpledger.decoding import trace
from tests.forging import chunk_files

pytestmark = pytest.mark.adversarial
SEED = 20240601
FLIPS, FAST = 320, 8


def _canonical_json(data: bytes):
    try:
        return trace.canonical_digest("", json.loads(data.decode("utf-8")))
    except Exception:  # noqa: BLE001 - unreadable: not the same
        return None


def _canonical_parquet(data: bytes):
    import pyarrow.parquet as pq

    try:
        return trace.canonical_digest("", pq.read_table(io.BytesIO(data)).to_pylist())
    except Exception:  # noqa: BLE001
        return None


def reads_the_same(file_kind: str, original: bytes, flipped: bytes) -> bool:
    """The flipped file means the same as the original, as dpledger reads it (a payload's sha256 is
    chained: every byte of it matters)."""
    if file_kind in ("manifest", "ledger", "final"):
        a, b = _canonical_json(original), _canonical_json(flipped)
    elif file_kind == "chunk":
        a, b = _canonical_parquet(original), _canonical_parquet(flipped)
    else:
        return False
    return a is not None and a == b


@pytest.mark.parametrize("index", [pytest.param(i, marks=[] if i < FAST else [pytest.mark.slow]) for i in range(FLIPS)])
def test_a_flipped_byte_never_passes_unless_the_file_reads_the_same(attack, index):
    rng = random.Random(SEED * 1000 + index)
    kind = rng.choice(["ada", "pm"])
    run = attack.copy(kind)
    file_kind = rng.choice(["manifest", "ledger", "final", "chunk", "payload"])
    if file_kind in ("manifest", "ledger", "final"):
        path = run / f"{file_kind}.json"
    elif file_kind == "chunk":
        path = rng.choice(chunk_files(run))
    else:
        path = rng.choice(sorted((run / trace.REPLAY_DIR).glob("block-*.npy")))
    original = path.read_bytes()
    offset, mask = rng.randrange(len(original)), rng.randrange(1, 256)
    flipped = bytearray(original)
    flipped[offset] ^= mask
    path.write_bytes(bytes(flipped))
    expect = (0, 1, 2) if reads_the_same(file_kind, original, bytes(flipped)) else (1, 2)
    attack.audit(run, expect=expect, report=False)
