"""The run trace (SPEC section 6): manifest, per-step Parquet chunks with a hash chain, ledger.

Layout of a run directory:
  manifest.json           what ran: mechanism, grid, models, data, seeds, versions, start time
  steps/chunk-NNNNNN.parquet   per-step records, one chunk per block, each committed atomically
  replay/block-NNNNNN.npz      optional exact-replay payload (the logits the mechanism saw)
  ledger.json             written last: the composed curve, epsilons, breakdown, utility

Each record carries `prev_hash` and `record_hash` = sha256(prev_hash + canonical JSON of the
record's other fields), so editing, dropping or reordering a committed record breaks the chain.
A chunk is written to a temporary file, fsynced and renamed: a crash loses at most the open chunk.
A directory without ledger.json is an unfinished run, never a complete one.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from accounting.errors import require

SCHEMA_VERSION = 1
GENESIS_HASH = "0" * 64
MANIFEST = "manifest.json"
LEDGER = "ledger.json"
STEPS_DIR = "steps"
REPLAY_DIR = "replay"


class TraceError(ValueError):
    """A trace directory is truncated, corrupted or foreign; the message names the file and problem."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, payload: dict) -> None:
    atomic_write_bytes(path, (json.dumps(payload, indent=2, sort_keys=True, default=_json_default) + "\n").encode())


def _json_default(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _canonical(value):
    """Floats as repr strings (exact, and +inf / NaN stay distinguishable), lists recursively."""
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_canonical(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value


def record_hash(prev_hash: str, record: dict) -> str:
    body = {key: _canonical(value) for key, value in record.items() if key not in ("record_hash", "prev_hash")}
    payload = prev_hash + json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def chain_records(records: list[dict], prev_hash: str) -> str:
    """Set prev_hash / record_hash on each record in order; returns the last hash."""
    for record in records:
        record["prev_hash"] = prev_hash
        record["record_hash"] = prev_hash = record_hash(prev_hash, record)
    return prev_hash


def chunk_path(run_dir: Path, index: int) -> Path:
    return run_dir / STEPS_DIR / f"chunk-{index:06d}.parquet"


def replay_path(run_dir: Path, index: int) -> Path:
    return run_dir / REPLAY_DIR / f"block-{index:06d}.npz"


def write_chunk(run_dir: Path, index: int, records: list[dict]) -> None:
    table = pa.Table.from_pylist(records)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(chunk_path(run_dir, index), sink.getvalue().to_pybytes())


def write_replay(run_dir: Path, index: int, **arrays: np.ndarray) -> None:
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write_bytes(replay_path(run_dir, index), buffer.getvalue())


def read_manifest(run_dir: Path) -> dict:
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        raise TraceError(f"{path}: missing; {run_dir} is not a dpledger run directory")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise TraceError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "dpledger-trace":
        raise TraceError(f"{path}: not a dpledger trace manifest (format field is {manifest.get('format')!r})"
                         if isinstance(manifest, dict) else f"{path}: not a JSON object")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise TraceError(f"{path}: schema version {manifest.get('schema_version')!r}, this dpledger reads {SCHEMA_VERSION}")
    return manifest


def read_ledger(run_dir: Path) -> dict:
    """ledger.json; TraceError when the run is unfinished (no ledger yet) or the file is damaged."""
    path = Path(run_dir) / LEDGER
    if not path.exists():
        raise TraceError(f"{path}: missing; the run is unfinished (resume it with dpledger decode --resume)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise TraceError(f"{path}: not valid JSON ({error})") from None


def committed_chunk_indices(run_dir: Path) -> list[int]:
    """Indices of committed chunks; TraceError when they are not 0..k-1 (a chunk missing)."""
    steps = Path(run_dir) / STEPS_DIR
    if not steps.exists():
        return []
    indices = sorted(int(p.stem.split("-")[1]) for p in steps.glob("chunk-*.parquet"))
    for expected, found in enumerate(indices):
        if expected != found:
            raise TraceError(f"{chunk_path(Path(run_dir), expected)}: missing (chunks jump to {found})")
    return indices


def read_chunk(run_dir: Path, index: int) -> list[dict]:
    path = chunk_path(Path(run_dir), index)
    try:
        return pq.read_table(path).to_pylist()
    except Exception as error:  # pyarrow raises several types for damaged files
        raise TraceError(f"{path}: unreadable Parquet chunk ({type(error).__name__}: {error})") from None


def read_records(run_dir: Path, verify: bool = True) -> list[dict]:
    """All committed records in order; with verify, the hash chain is checked (TraceError names the
    first broken record and its chunk file)."""
    records: list[dict] = []
    prev = GENESIS_HASH
    for index in committed_chunk_indices(run_dir):
        chunk = read_chunk(run_dir, index)
        if verify:
            for record in chunk:
                if record.get("prev_hash") != prev:
                    raise TraceError(f"{chunk_path(Path(run_dir), index)}: step {record.get('step')} breaks the hash "
                                     "chain (prev_hash does not match the previous record: a record was dropped or reordered)")
                expected = record_hash(prev, record)
                if record.get("record_hash") != expected:
                    raise TraceError(f"{chunk_path(Path(run_dir), index)}: step {record.get('step')} was modified "
                                     "after it was committed (record_hash does not match its contents)")
                prev = expected
        records.extend(chunk)
    return records


def last_hash(records: list[dict]) -> str:
    return records[-1]["record_hash"] if records else GENESIS_HASH
