"""The run trace: manifest, per-step Parquet chunks on a hash chain, ledger, final record.

Layout of a run directory:
  manifest.json                what ran: mechanism, grid, models, data, seeds, versions, start time
  steps/chunk-NNNNNN.parquet   per-step records, one chunk per block, each committed atomically
  replay/block-NNNNNN.npy      optional exact-replay payload: the logits (N+1, L, V) the mechanism saw
  ledger.json                  the composed curve, epsilons, breakdown, utility
  final.json                   written last: step count, last record hash, hashes of manifest and
                               ledger, and the head hash that binds them (`dpledger decode` prints it)
  .lock                        held (flock) by the one process writing the run

The chain starts from a genesis hash derived from the manifest, so the manifest (its mechanism,
parameters, queries, models, seeds) cannot change without re-chaining every record. Each record
carries `prev_hash`, `record_hash` = sha256(prev_hash + canonical JSON of its other fields) and the
sha256 of its block's replay payload. The final record fixes the chain's end: the head printed by
`decode` and published elsewhere detects truncation or re-chaining (`audit --expect-head`).
Chunks, payloads and JSON files are written to a temporary file, fsynced and renamed: a crash
loses at most the open block. A directory without final.json is an unfinished run.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from accounting.errors import require
from accounting.strict_json import NULLS, loads_json, strict_json_text  # noqa: F401 (re-exported)

SCHEMA_VERSION = 2
MANIFEST = "manifest.json"
LEDGER = "ledger.json"
FINAL = "final.json"
LOCK = ".lock"
STEPS_DIR = "steps"
REPLAY_DIR = "replay"
CHUNK_NAME = re.compile(r"chunk-(\d{6})\.parquet")
PAYLOAD_NAME = re.compile(r"block-(\d{6})\.npy")
_TEMPORARY = re.compile(r"\..+\.tmp-\d+")


class TraceError(ValueError):
    """A trace directory is truncated, corrupted or foreign; the message names the file and problem."""


class RunLockedError(ValueError):
    """Another process holds the run directory's lock."""


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write leaves nothing half-written behind
        raise


def atomic_write_json(path: Path, payload: dict) -> None:
    atomic_write_bytes(path, json_bytes(payload))


def json_bytes(payload: dict) -> bytes:
    """Strict JSON bytes of `payload`, sorted keys; non-finite floats become null, listed under
    NULLS with the reason (accounting.strict_json)."""
    return (strict_json_text(payload, default=_json_default) + "\n").encode()


def _json_default(value):
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _canonical(value):
    """Floats as repr strings (exact, and +inf / NaN stay distinguishable), containers recursively."""
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value


def canonical_digest(tag: str, value) -> str:
    """sha256 of `tag` and the canonical JSON of `value` (key order and float formatting fixed)."""
    return hashlib.sha256((tag + json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"))).encode()).hexdigest()


def genesis_hash(manifest: dict) -> str:
    """The chain's first prev_hash: binds every record to this manifest."""
    return canonical_digest("dpledger-genesis:", manifest)


def record_hash(prev_hash: str, record: dict) -> str:
    body = {key: value for key, value in record.items() if key not in ("record_hash", "prev_hash")}
    return canonical_digest(prev_hash, body)


def chain_records(records: list[dict], prev_hash: str) -> str:
    """Set prev_hash / record_hash on each record in order; returns the last hash."""
    for record in records:
        record["prev_hash"] = prev_hash
        record["record_hash"] = prev_hash = record_hash(prev_hash, record)
    return prev_hash


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for piece in iter(lambda: handle.read(1 << 22), b""):
            digest.update(piece)
    return digest.hexdigest()


def chunk_path(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / STEPS_DIR / f"chunk-{index:06d}.parquet"


def replay_path(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / REPLAY_DIR / f"block-{index:06d}.npy"


def write_chunk(run_dir: Path, index: int, records: list[dict]) -> None:
    table = pa.Table.from_pylist(records)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(chunk_path(run_dir, index), sink.getvalue().to_pybytes())


def write_replay(run_dir: Path, index: int, logits: np.ndarray) -> str:
    """The block's logits as an uncompressed .npy (memory-mappable); returns its sha256."""
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(logits), allow_pickle=False)
    data = buffer.getvalue()
    atomic_write_bytes(replay_path(run_dir, index), data)
    return hashlib.sha256(data).hexdigest()


class ReplayPayload:
    """One block's logits file, read a window of steps at a time: the (N+1, L, V) array is C-ordered,
    so steps start..stop of model m are one contiguous run of bytes; a window costs N+1 reads and
    its own size in memory, whatever the block's size."""

    def __init__(self, run_dir: Path, index: int):
        self.path = replay_path(run_dir, index)
        if not self.path.is_file():
            raise TraceError(f"{self.path}: missing or not a regular file")
        try:
            with open(self.path, "rb") as handle:
                version = np.lib.format.read_magic(handle)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read_header(handle)
                self.offset = handle.tell()
        except Exception as error:  # numpy raises several types for damaged files
            raise TraceError(f"{self.path}: unreadable replay payload ({type(error).__name__}: {_one_line(error)})") from None
        if len(shape) != 3 or fortran or dtype.kind != "f" or dtype.hasobject:
            raise TraceError(f"{self.path}: replay payload must be a C-ordered 3-d float array (N+1, L, V), got "
                             f"{dtype} {shape}")
        self.shape, self.dtype = tuple(int(v) for v in shape), dtype
        expected = self.offset + int(np.prod(self.shape)) * dtype.itemsize
        if self.path.stat().st_size != expected:
            raise TraceError(f"{self.path}: {self.path.stat().st_size} bytes, a {dtype} {self.shape} array needs "
                             f"{expected}")

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Logits (N+1, stop - start, V) of steps start..stop of the block."""
        models, length, vocab = self.shape
        out = np.empty((models, stop - start, vocab), dtype=self.dtype)
        with open(self.path, "rb") as handle:
            for model in range(models):
                handle.seek(self.offset + (model * length + start) * vocab * self.dtype.itemsize)
                out[model] = np.fromfile(handle, dtype=self.dtype, count=(stop - start) * vocab).reshape(-1, vocab)
        return out


def read_json_file(path: Path, what: str) -> dict:
    """A JSON object from `path`; TraceError naming the file for a missing, non-UTF-8, invalid or
    non-object file."""
    if Path(path).exists() and not Path(path).is_file():  # a FIFO or device would block or never end
        raise TraceError(f"{path}: not a regular file ({what})")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"{path}: missing ({what})") from None
    except UnicodeDecodeError as error:
        raise TraceError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except OSError as error:
        raise TraceError(f"{path}: cannot be read ({error.strerror or error})") from None
    try:
        value = loads_json(text, str(path))
    except json.JSONDecodeError as error:
        raise TraceError(f"{path}: not valid JSON ({error})") from None
    except ValueError as error:  # a `nulls` map that does not fit the file
        raise TraceError(str(error)) from None
    if not isinstance(value, dict):
        raise TraceError(f"{path}: must hold a JSON object, got {type(value).__name__}")
    return value


def read_manifest(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    path = run_dir / MANIFEST
    if not run_dir.is_dir():
        raise TraceError(f"{run_dir}: not a directory")
    if not path.exists():
        raise TraceError(f"{path}: missing; {run_dir} is not a dpledger run directory")
    manifest = read_json_file(path, "the run's manifest")
    if manifest.get("format") != "dpledger-trace":
        raise TraceError(f"{path}: not a dpledger trace manifest (format field is {manifest.get('format')!r})")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise TraceError(f"{path}: schema version {manifest.get('schema_version')!r}, this dpledger reads "
                         f"{SCHEMA_VERSION} (re-run the decode with this version)")
    return manifest


def run_directories(paths) -> list[Path]:
    """Run directories named by `paths`: a run directory (it holds manifest.json) stands for itself;
    another directory for every run directory below it, in sorted order; a path that is neither is
    kept, so that reading it reports what is wrong with it."""
    found = []
    for path in map(Path, paths):
        below = sorted(m.parent for m in path.rglob(MANIFEST)) if path.is_dir() and not (path / MANIFEST).exists() else []
        found += below or [path]
    return found


def read_ledger(run_dir: Path) -> dict:
    """ledger.json; TraceError when the run is unfinished (no final record yet) or a file is damaged."""
    run_dir = Path(run_dir)
    if not (run_dir / FINAL).exists():
        raise TraceError(f"{run_dir / FINAL}: missing; the run is unfinished (resume it with dpledger decode --resume)")
    return read_json_file(run_dir / LEDGER, "the run's ledger")


def committed_chunk_indices(run_dir: Path) -> list[int]:
    """Indices of committed chunks; TraceError for a file in steps/ that is not a chunk (a stray
    copy would otherwise be read or ignored silently) and for a gap (a chunk missing)."""
    steps = Path(run_dir) / STEPS_DIR
    if not steps.exists():
        return []
    indices = []
    for path in sorted(steps.iterdir()):
        if _TEMPORARY.fullmatch(path.name):
            continue  # an interrupted atomic write: never committed
        match = CHUNK_NAME.fullmatch(path.name)
        if match is None or not path.is_file():
            raise TraceError(f"{path}: not a chunk of this run (chunks are named chunk-NNNNNN.parquet); "
                             "move it out of steps/")
        indices.append(int(match.group(1)))
    for expected, found in enumerate(indices):
        if expected != found:
            raise TraceError(f"{chunk_path(Path(run_dir), expected)}: missing (chunks jump to {found})")
    return indices


def read_chunk(run_dir: Path, index: int, expected_sha256: str | None = None) -> list[dict]:
    """A chunk's records; with `expected_sha256`, TraceError unless the file still has those bytes
    (a worker re-reading a chunk the driver has checked)."""
    path = chunk_path(Path(run_dir), index)
    if expected_sha256 is not None:
        try:
            data = path.read_bytes()
        except OSError as error:
            raise TraceError(f"{path}: cannot be read again ({error.strerror or error})") from None
        if hashlib.sha256(data).hexdigest() != expected_sha256:
            raise TraceError(f"{path}: changed since the audit read it (its sha256 differs)")
    try:
        return pq.read_table(pa.BufferReader(data) if expected_sha256 is not None else path).to_pylist()
    except Exception as error:  # pyarrow raises several types for damaged files
        raise TraceError(f"{path}: unreadable Parquet chunk ({type(error).__name__}: {_one_line(error)})") from None


class ChainReader:
    """Streams a run's committed chunks in order, one block of records at a time, checking the
    hash chain from the manifest's genesis; after iterating, `head` is the last record hash and
    `steps` the record count. Memory is one chunk, whatever the run's length.

    With verify=True a break raises TraceError naming the chunk and step; with verify=False the
    first break is kept in `error` and reading goes on.
    """

    def __init__(self, run_dir: Path, manifest: dict, verify: bool = True):
        self.run_dir, self.manifest, self.verify = Path(run_dir), manifest, verify
        self.head, self.steps, self.error = genesis_hash(manifest), 0, None

    def __iter__(self) -> Iterator[tuple[int, list[dict]]]:
        self.head, self.steps, self.error = genesis_hash(self.manifest), 0, None
        for index in committed_chunk_indices(self.run_dir):
            chunk = read_chunk(self.run_dir, index)
            for record in chunk:
                problem = None
                if record.get("prev_hash") != self.head:
                    problem = (f"step {record.get('step')} breaks the hash chain (prev_hash does not match the previous "
                               "record: a record was dropped, reordered or comes from another run)")
                elif record.get("record_hash") != record_hash(self.head, record):
                    problem = (f"step {record.get('step')} was modified after it was committed (record_hash does not "
                               "match its contents)")
                if problem is not None and self.error is None:
                    self.error = f"{chunk_path(self.run_dir, index)}: {problem}"
                    if self.verify:
                        raise TraceError(self.error)
                self.head = record.get("record_hash") if isinstance(record.get("record_hash"), str) else ""
                self.steps += 1
            yield index, chunk


def read_records(run_dir: Path, verify: bool = True) -> list[dict]:
    """All committed records in order (the whole run in memory: for small runs and tests; the
    audit streams with ChainReader)."""
    manifest = read_manifest(run_dir)
    return [record for _, chunk in ChainReader(run_dir, manifest, verify) for record in chunk]


def final_record(manifest: dict, steps: int, blocks: int, last_record_hash: str, ledger_bytes: bytes) -> dict:
    """The chain's end: step and block counts, the last record hash, the manifest's and the
    ledger's hashes, and `head`, the hash of all of them (what `decode` prints and a user publishes)."""
    body = {"format": "dpledger-final", "schema_version": SCHEMA_VERSION, "steps": int(steps), "blocks": int(blocks),
            "last_record_hash": last_record_hash, "genesis_hash": genesis_hash(manifest),
            "ledger_sha256": hashlib.sha256(ledger_bytes).hexdigest()}
    return {**body, "head": canonical_digest("dpledger-head:", body)}


def head_of(final: dict) -> str:
    """The head hash recomputed from a final record's other fields."""
    return canonical_digest("dpledger-head:", {k: v for k, v in final.items() if k != "head"})


def read_final(run_dir: Path) -> dict:
    return read_json_file(Path(run_dir) / FINAL, "the run's final record: the run is unfinished")


class RunLock:
    """An exclusive advisory lock (flock) on `<run_dir>/.lock`, held by the one process writing the
    run; the OS releases it when the process exits, however it exits."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK
        self._handle = None

    def acquire(self) -> "RunLock":
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise RunLockedError(f"{self.path.parent} is being written by another dpledger process ({holder}); "
                                 "wait for it to finish or choose another --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def is_locked(directory: Path) -> bool:
    """True while another process holds the directory's lock."""
    path = Path(directory) / LOCK
    if not path.exists():
        return False
    with open(path, "r") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return False


def _remove_abandoned_creations(out: Path) -> None:
    """Directories left by a process killed while creating `out` (their lock is free)."""
    for candidate in out.parent.glob(f".{out.name}.creating-*"):
        if candidate.is_dir() and not is_locked(candidate):
            shutil.rmtree(candidate, ignore_errors=True)


def create_run_directory(out: Path, manifest: dict, payload: bool) -> RunLock:
    """Create `out` with its manifest atomically (built under a temporary name, locked, then
    renamed), and return the held lock: no kill leaves a directory without a manifest, and a second
    writer racing for the same `out` gets RunLockedError or the "already holds files" error."""
    out = Path(out)
    require(not out.exists() or out.is_dir(), f"output path {out} exists and is not a directory")
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_creations(out)
    staging = parent / f".{out.name}.creating-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    lock = None
    try:
        lock = RunLock(staging).acquire()
        (staging / STEPS_DIR).mkdir()
        if payload:
            (staging / REPLAY_DIR).mkdir()
        atomic_write_json(staging / MANIFEST, manifest)
        try:
            os.rename(staging, out)  # atomic; fails when `out` holds anything
        except OSError:
            if out.is_dir() and any(out.iterdir()):
                raise ValueError(f"output directory {out} already holds files: pass --resume to continue that run, "
                                 "or choose another --out") from None
            raise
        lock.path = out / LOCK
        return lock
    except BaseException:
        if lock is not None:
            lock.release()
        shutil.rmtree(staging, ignore_errors=True)
        raise


def remove_temporary_files(run_dir: Path) -> None:
    """Interrupted atomic writes (only ever called with the run's lock held)."""
    for sub in (Path(run_dir), Path(run_dir) / STEPS_DIR, Path(run_dir) / REPLAY_DIR):
        if sub.is_dir():
            for path in sub.iterdir():
                if _TEMPORARY.fullmatch(path.name):
                    path.unlink()


@contextmanager
def locked(run_dir: Path):
    lock = RunLock(run_dir).acquire()
    try:
        yield lock
    finally:
        lock.release()
