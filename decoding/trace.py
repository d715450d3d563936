"""The run trace: manifest, per-step Parquet chunks on a hash chain, ledger, final record.

Layout of a run directory:
  manifest.json                what ran: mechanism, grid, models, data, seeds, versions, start time
  steps/chunk-NNNNNN.parquet   per-step records, one chunk per block, each committed atomically
  replay/block-NNNNNN.npy      optional exact-replay payload: the logits (N+1, L, V) the mechanism saw,
  replay/block-NNNNNN.npz      or, for a voting run, the bounded payload: the public logits and each
                               teacher's top-k race entries (dpledger.decoding.vote_payload)
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

A run directory may have been written by someone else, to attack whoever reads it: every file here
is read and written through dpledger.accounting.safe_files (no link below the run directory is followed,
only regular files within a size bound are read, never a FIFO or a device).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
import io

from dpledger.accounting import safe_files
from dpledger.accounting.errors import require
from dpledger.accounting.safe_files import UnsafeFileError, file_sha256  # noqa: F401 (re-exported)
from dpledger.accounting.strict_json import MAX_BYTES as MAX_JSON_BYTES
from dpledger.accounting.strict_json import NULLS, loads_json, strict_json_text  # noqa: F401 (re-exported)

SCHEMA_VERSION = 2
RECORDS_VERSION = 10
"""Version 2 records hold Eq. 3 (`eq3_remove_one`) and the add-one bound (`add_one_bound`) apart
from the loss covering the run's relation (`observed_data_dependent`); a trace without the key is
version 1 (that loss only). Version 3 records hold these three losses only where a component charges
them (`records_losses`): a run charged by Theorem 3.1 no longer records Eq. 3 beside it (the audit's
theorem_3_1 check computes it from the replay payload). Version 4 records charge AdaPMixED's add-one
bound on its certified sub-grid of orders where V >= 8192 (dpledger.mechanisms.add_one); earlier
ones at every order, which the replay follows (dpledger.decoding.runners.build_runner). Version 5
voting runs may keep the bounded payload (the manifest's `replay_payload_format`,
dpledger.decoding.vote_payload) instead of the logits; a manifest without that key (every earlier
trace) kept the logits. Version 6 solves PMixED's and AdaPMixED's mixing weights with fitted steps
(dpledger.mechanisms.fused.solve_mixing_weights): the same ball and tolerance, lambdas within ~1e-10
of version 5's, which the replay of an earlier trace reproduces by solving as it did (build_runner).
Version 7 raises the mixed ratios to integer orders (the paper's alpha = 18) by products instead of exp
and log in that solver (dpledger.mechanisms.kernels.SOLVER_VERSION), and sums the add-one bound's chord
term with one exp per token (dpledger.mechanisms.add_one); the records' fields are unchanged.
Version 8 sums the add-one bound at orders on the lattice of tenths (the default grid's) by products of
per-token powers, without an exp per token and order (dpledger.mechanisms.fused.add_one_power_order_sums),
with their own rounding allowance; values within ~1e-13 of version 7's. Version 9 refines the add-one
bound's sub-grid row by row: versions 4 to 8 shared it across a decode block's steps, so a replay in windows
shorter than the block (one step at GPT-2 scale) could not reproduce the recorded bits (the audit's replay
then compares those steps' add-one values within the sub-grid's certificate, audit.replay). Version 10
runs the add-one bound's forward sub-grid rounds compiled (dpledger.mechanisms.fused.add_one_forward_round):
the same certificate, bisection and bound, with the C library's exp, expm1, log and log1p in place of
numpy's vectorised ones, and the chord sum's shifts vectorised with their error bound in its allowance
(dpledger.mechanisms.fused.add_one_shifts): values at most 9.5e-13 nats above version 9's in a review's
search of generated and edge cases (up to 8.3e-6 relative where the bound is near 1e-7, at orders near 1)
and below them only by last bits (4.3e-16 relative, inside the final rounding up), but for a bisection
decided the other way, within the sub-grid's certificate. It also computes the screening statistic in one
compiled pass (dpledger.mechanisms.fused.screen_statistics; the same formula, other last bits). The replay
of an earlier trace follows version 9 in both. The manifest records the version;
dpledger.decoding.blocks writes the records."""
MANIFEST = "manifest.json"
LEDGER = "ledger.json"
FINAL = "final.json"
LOCK = ".lock"
STEPS_DIR = "steps"
REPLAY_DIR = "replay"
CHUNK_NAME = re.compile(r"chunk-(\d{6})\.parquet")
PAYLOAD_NAME = re.compile(r"block-(\d{6})\.np[yz]")
LOGITS_FORMAT = "logits"
"""The payload of every model's logits (N+1, L, V) float32: replays any mechanism; every trace
before records version 5 holds it."""
VOTE_FORMAT = "vote-top-k"
"""A voting run's bounded payload (dpledger.decoding.vote_payload)."""
# The fields of one step's record (the decoder writes them in dpledger.decoding.blocks; the audit
# refuses a record with any other set): every run's, then those of voting runs, of runs under a privacy
# filter and the data-dependent losses (records_losses); plus one rdp_<component> per mechanism component.
BASE_FIELDS = frozenset({"step", "block", "position", "query_id", "context_token", "true_token", "output_token",
                         "prob_true_token", "screen_statistic", "screen_passed", "answered_by", "lambdas",
                         "sampled_teachers", "data_independent", "payload_sha256", "prev_hash", "record_hash"})
VOTING_FIELDS = frozenset({"vote_seed", "vote_tokens", "vote_counts", "aggregator_noise"})
BUDGET_FIELDS = frozenset({"budget_refused", "budget_charge"})  # runs with a privacy filter (dpledger.decoding.budget)
LOSS_FIELD = "observed_data_dependent"  # records_version 1 and 2: every record; 3: where records_losses
SPLIT_LOSS_FIELDS = frozenset({"eq3_remove_one", "add_one_bound"})  # records_version 2; 3: where records_losses
DATA_DEPENDENT_COMPONENT = "pmixed_data_dependent"
"""The component that charges the data-dependent loss (AdaPMixED's, dpledger.decoding.runners)."""


def records_losses(records_version: int, components: Iterable[str]) -> bool:
    """Whether a run's step records hold the data-dependent losses (`observed_data_dependent`, and from
    version 2 `eq3_remove_one` and `add_one_bound`): every record up to version 2; from version 3 only
    where a component charges them, since the decode loop computes nothing it does not charge.

    Args:
        records_version: the manifest's records_version (1 when absent).
        components: the run's mechanism components.

    Returns:
        True when the records hold the losses.
    """
    return records_version < 3 or DATA_DEPENDENT_COMPONENT in components


def record_fields(manifest: dict) -> set[str]:
    """The fields every step record of the run `manifest` describes holds, no more and no fewer.

    Args:
        manifest: the run's manifest (its mechanism type and components, budget and records_version).

    Returns:
        The field names: the base fields, voting, budget and data-dependent loss fields where they
        apply, and rdp_<name> for each mechanism component.

    Raises:
        KeyError: if the manifest has no mechanism type or components (the loader checks both first).
    """
    voting = VOTING_FIELDS if manifest["mechanism"]["type"] == "voting" else frozenset()
    budget = BUDGET_FIELDS if manifest.get("budget") is not None else frozenset()
    version = manifest.get("records_version", 1)
    losses = ({LOSS_FIELD} | (SPLIT_LOSS_FIELDS if version >= 2 else frozenset())
              if records_losses(version, manifest["mechanism"]["components"]) else frozenset())
    return (set(BASE_FIELDS) | voting | budget | losses
            | {f"rdp_{name}" for name in manifest["mechanism"]["components"]})


MAX_CHUNK_BYTES = 256 * 2 ** 20
"""A chunk (one block's records, Parquet) is read up to this size (a block of 1,024 steps with 100
teachers takes a few MB)."""
NPY_HEADER_BYTES = 4096
"""Room for a payload's .npy header (numpy writes 128 bytes for a 3-d array)."""


class TraceError(ValueError):
    """A trace directory is truncated, corrupted or foreign; the message names the file and problem."""


class UnusableRunError(TraceError):
    """Not a dpledger run at all (no manifest, another format or schema version) or one being written:
    the audit cannot use it (exit 2). Anything else wrong with a run's files is an audit finding."""


class RunLockedError(ValueError):
    """Another process holds the run directory's lock."""


def _one_line(error: BaseException | str) -> str:
    return " ".join(str(error).split())


def atomic_write_bytes(path: str | Path, data: bytes, root: str | Path | None = None) -> None:
    """Write-then-rename (dpledger.accounting.safe_files.write_atomic): no link at `path`, or below `root`
    (default: its directory), is written through; a failed write leaves nothing half-written.

    Args:
        path: the file to write; replaced whole if it exists.
        data: its new content.
        root: the directory below which no path component may be a link (default: `path`'s directory).

    Raises:
        UnsafeFileError: if a component below `root`, or `path` itself, is a link or not a regular file.
        OSError: if the temporary file cannot be written, synced or renamed (nothing half-written stays).
    """
    safe_files.write_atomic(path, data, root=root)


def atomic_write_json(path: str | Path, payload: dict) -> None:
    """Write `payload` as strict JSON (json_bytes) with atomic_write_bytes.

    Args:
        path: the JSON file to write; replaced whole if it exists.
        payload: a JSON object; numpy scalars and arrays and paths are converted, non-finite floats
            become null and are listed under NULLS.

    Raises:
        UnsafeFileError: if `path` is a link or not a regular file (atomic_write_bytes).
        OSError: if the file cannot be written.
        TypeError: if `payload` holds a value JSON cannot represent.
    """
    atomic_write_bytes(path, json_bytes(payload))


def json_bytes(payload: dict) -> bytes:
    """Strict JSON bytes of `payload`, sorted keys; non-finite floats become null, listed under
    NULLS with the reason (dpledger.accounting.strict_json).

    Args:
        payload: a JSON object; numpy scalars and arrays become numbers and lists, paths strings.

    Returns:
        The UTF-8 text, indented, ending with a newline: the very bytes written to a run's JSON files.

    Raises:
        TypeError: if `payload` holds a value that is none of the above nor JSON-native.
    """
    return (strict_json_text(payload, default=_json_default) + "\n").encode()


def _json_default(value: object) -> object:
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _canonical(value: object) -> object:
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


def canonical_digest(tag: str, value: object) -> str:
    """sha256 of `tag` and the canonical JSON of `value` (key order and float formatting fixed).

    Args:
        tag: a prefix hashed before the JSON (a domain tag, or the previous record's hash).
        value: JSON-like data; floats are hashed as their repr, so +inf, NaN and every bit of a
            float count, and numpy scalars and arrays as the Python values they hold.

    Returns:
        The sha256 as 64 lowercase hex digits.
    """
    return hashlib.sha256((tag + json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"))).encode()).hexdigest()


def genesis_hash(manifest: dict) -> str:
    """The chain's first prev_hash: binds every record to this manifest.

    Args:
        manifest: the run's manifest.json content.

    Returns:
        canonical_digest of the manifest under the tag "dpledger-genesis:" (64 hex digits).
    """
    return canonical_digest("dpledger-genesis:", manifest)


def record_hash(prev_hash: str, record: dict) -> str:
    """A record's hash on the chain: the canonical digest of its fields after the previous hash.

    Args:
        prev_hash: the previous record's hash (the genesis hash for a run's first record).
        record: one per-step record; its own `prev_hash` and `record_hash` fields are left out.

    Returns:
        The hash as 64 hex digits.
    """
    body = {key: value for key, value in record.items() if key not in ("record_hash", "prev_hash")}
    return canonical_digest(prev_hash, body)


def chain_records(records: list[dict], prev_hash: str) -> str:
    """Set prev_hash / record_hash on each record in order; returns the last hash.

    Args:
        records: per-step records in step order; changed in place.
        prev_hash: the hash the first of them follows (the previous block's last hash, or the genesis hash).

    Returns:
        The last record's hash (`prev_hash` itself when `records` is empty).
    """
    for record in records:
        record["prev_hash"] = prev_hash
        record["record_hash"] = prev_hash = record_hash(prev_hash, record)
    return prev_hash


def chunk_path(run_dir: str | Path, index: int) -> Path:
    """Where block `index`'s records are committed.

    Args:
        run_dir: the run directory.
        index: the block's index (0-based).

    Returns:
        run_dir/steps/chunk-NNNNNN.parquet.
    """
    return Path(run_dir) / STEPS_DIR / f"chunk-{index:06d}.parquet"


def replay_path(run_dir: str | Path, index: int, payload_format: str = LOGITS_FORMAT) -> Path:
    """Where block `index`'s exact-replay payload is written.

    Args:
        run_dir: the run directory.
        index: the block's index (0-based).
        payload_format: LOGITS_FORMAT (.npy) or VOTE_FORMAT (.npz).

    Returns:
        run_dir/replay/block-NNNNNN.npy, or .npz for the bounded vote payload.
    """
    suffix = ".npz" if payload_format == VOTE_FORMAT else ".npy"
    return Path(run_dir) / REPLAY_DIR / f"block-{index:06d}{suffix}"


def payload_format(manifest: dict) -> dict:
    """The run's payload format as its manifest records it ({"format": LOGITS_FORMAT} when it does
    not: a trace before records version 5).

    Args:
        manifest: the run's manifest.

    Returns:
        {"format": ..., and for VOTE_FORMAT "top_k": k and "bytes_per_block": the size formula}.

    Raises:
        TraceError: if the entry is not one of the two formats, or a bounded one has no integer top_k >= 2.
    """
    entry = manifest.get("replay_payload_format", {"format": LOGITS_FORMAT})
    if not isinstance(entry, dict) or entry.get("format") not in (LOGITS_FORMAT, VOTE_FORMAT):
        raise TraceError(f"manifest: replay_payload_format must name {LOGITS_FORMAT!r} or {VOTE_FORMAT!r}, got {entry!r}")
    top_k = entry.get("top_k")
    if entry["format"] == VOTE_FORMAT and not (isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 2):
        raise TraceError(f"manifest: a {VOTE_FORMAT} payload needs an integer top_k >= 2, got {top_k!r}")
    return entry


def write_chunk(run_dir: str | Path, index: int, records: list[dict]) -> None:
    """Commit one block's records as a Parquet chunk, atomically (the decode loop's commit point).

    Args:
        run_dir: the run directory; no link below it is written through.
        index: the block's index (0-based).
        records: the block's chained records (chain_records), in step order.

    Raises:
        UnsafeFileError: if steps/ or the chunk's path is a link or not a regular file.
        OSError: if the chunk cannot be written (nothing half-written stays).
    """
    table = pa.Table.from_pylist(records)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomic_write_bytes(chunk_path(run_dir, index), sink.getvalue().to_pybytes(), run_dir)


def write_replay(run_dir: str | Path, index: int, logits: npt.NDArray[np.float32]) -> str:
    """The block's logits as an uncompressed .npy (memory-mappable); returns its sha256.

    Args:
        run_dir: the run directory; no link below it is written through.
        index: the block's index (0-based).
        logits: the (N+1, L, V) float32 logits the mechanism saw: the public model first, then the N teachers.

    Returns:
        The sha256 of the file's bytes (64 hex digits), which each of the block's records holds.

    Raises:
        UnsafeFileError: if replay/ or the payload's path is a link or not a regular file.
        OSError: if the file cannot be written.
    """
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(logits), allow_pickle=False)
    data = buffer.getvalue()
    atomic_write_bytes(replay_path(run_dir, index), data, run_dir)
    return hashlib.sha256(data).hexdigest()


def payload_bytes_bound(shape: tuple[int, int, int]) -> int:
    """The most bytes the payload of a block of logits `shape` (N+1, L, V), float32, can take.

    Args:
        shape: (models N+1, steps L, vocabulary V).

    Returns:
        NPY_HEADER_BYTES plus 4 bytes per entry, computed without overflow.
    """
    return NPY_HEADER_BYTES + 4 * int(np.prod(shape, dtype=object))


class ReplayPayload:
    """One block's logits file, read a window of steps at a time: the (N+1, L, V) array is C-ordered,
    so steps start..stop of model m are one contiguous run of bytes; a window costs N+1 reads and
    its own size in memory, whatever the block's size. TraceError unless the file is a regular
    float32 .npy of exactly the `shape` (N+1, L, V) its manifest and records give."""

    def __init__(self, run_dir: str | Path, index: int, shape: tuple[int, int, int]):
        self.run_dir, self.path = Path(run_dir), replay_path(run_dir, index)
        with self._open(payload_bytes_bound(shape)) as handle:
            try:
                version = np.lib.format.read_magic(handle)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                found, fortran, dtype = read_header(handle)
                self.offset = handle.tell()
            except Exception as error:  # numpy raises several types for damaged files
                raise TraceError(f"{self.path}: unreadable replay payload ({type(error).__name__}: "
                                 f"{_one_line(error)})") from None
            size = os.fstat(handle.fileno()).st_size
        found = tuple(int(v) for v in found)
        if fortran or dtype != np.float32 or found != tuple(shape):
            raise TraceError(f"{self.path}: replay payload must be a C-ordered float32 array of shape {tuple(shape)} "
                             f"(N+1, L, V), got {'Fortran-ordered ' if fortran else ''}{dtype} {found}")
        self.shape, self.dtype = found, dtype
        self.size = self.offset + int(np.prod(self.shape)) * dtype.itemsize
        if size != self.size:
            raise TraceError(f"{self.path}: {size} bytes, a {dtype} {self.shape} array needs {self.size}")

    def _open(self, limit: int) -> io.BufferedReader:
        try:
            return os.fdopen(safe_files.open_regular(self.path, limit, root=self.run_dir,
                                                     what="a float32 (N+1, L, V) block of logits"), "rb")
        except FileNotFoundError:
            raise TraceError(f"{self.path}: missing") from None
        except UnsafeFileError as error:
            raise TraceError(str(error)) from None

    def rows(self, start: int, stop: int) -> npt.NDArray[np.float32]:
        """Logits (N+1, stop - start, V) of steps start..stop of the block.

        Args:
            start: the first step's row in the block (0-based).
            stop: one past the last step's row; 0 <= start <= stop <= L.

        Returns:
            The float32 logits (N+1, stop - start, V), the public model first, read from the file
            model by model (N+1 reads).

        Raises:
            TraceError: if the file has gone missing or become unsafe since it was checked.
        """
        models, length, vocab = self.shape
        out = np.empty((models, stop - start, vocab), dtype=self.dtype)
        with self._open(self.size) as handle:
            for model in range(models):
                handle.seek(self.offset + (model * length + start) * vocab * self.dtype.itemsize)
                out[model] = np.fromfile(handle, dtype=self.dtype, count=(stop - start) * vocab).reshape(-1, vocab)
        return out


def read_json_file(path: Path, what: str) -> dict:
    """A JSON object from `path` (a regular file of at most MAX_JSON_BYTES, not a link); TraceError
    naming the file for a missing, unsafe, non-UTF-8, invalid, too deeply nested or non-object
    file, or one naming a key twice.

    Args:
        path: the JSON file.
        what: what the file is, for the messages ("the run's manifest").

    Returns:
        The object, with the non-finite floats its NULLS map names restored (dpledger.accounting.strict_json).

    Raises:
        TraceError: if the file is missing, unsafe (a link, not a regular file, over MAX_JSON_BYTES),
            unreadable, not UTF-8, not valid JSON, nested too deeply, names a key twice or holds no object.
    """
    try:
        text = safe_files.read_text(path, MAX_JSON_BYTES, what=what)
        value = loads_json(text, str(path))
    except FileNotFoundError:
        raise TraceError(f"{path}: missing ({what})") from None
    except json.JSONDecodeError as error:
        raise TraceError(f"{path}: not valid JSON ({error})") from None
    except ValueError as error:  # unsafe, not UTF-8, nested too deep, a duplicate key, a bad `nulls` map
        raise TraceError(str(error)) from None
    except OSError as error:
        raise TraceError(f"{path}: cannot be read ({error.strerror or error})") from None
    if not isinstance(value, dict):
        raise TraceError(f"{path}: must hold a JSON object, got {type(value).__name__}")
    return value


def read_manifest(run_dir: str | Path) -> dict:
    """The run's manifest; UnusableRunError for a directory that is not a dpledger run (none, or
    another format or schema version), TraceError for a manifest that cannot be read.

    Args:
        run_dir: the run directory.

    Returns:
        manifest.json's object.

    Raises:
        UnusableRunError: if `run_dir` is not a directory, has no manifest, or its manifest is of
            another format or schema version than SCHEMA_VERSION.
        TraceError: if the manifest cannot be read (read_json_file).
    """
    run_dir = Path(run_dir)
    path = run_dir / MANIFEST
    if not run_dir.is_dir():
        raise UnusableRunError(f"{run_dir}: not a directory")
    if not os.path.lexists(path):
        raise UnusableRunError(f"{path}: missing; {run_dir} is not a dpledger run directory")
    manifest = read_json_file(path, "the run's manifest")
    if manifest.get("format") != "dpledger-trace":
        raise UnusableRunError(f"{path}: not a dpledger trace manifest (format field is {manifest.get('format')!r})")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise UnusableRunError(f"{path}: schema version {manifest.get('schema_version')!r}, this dpledger reads "
                               f"{SCHEMA_VERSION} (re-run the decode with this version)")
    return manifest


def run_directories(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories named by `paths`: a run directory (it holds manifest.json) stands for itself;
    another directory for every run directory below it, in sorted order; a path that is neither is
    kept, so that reading it reports what is wrong with it.

    Args:
        paths: run directories, folders holding run directories, or other paths.

    Returns:
        The paths, each folder replaced by the run directories below it (when it holds any), in the given order.
    """
    found = []
    for path in map(Path, paths):
        folder = path.is_dir() and not os.path.lexists(path / MANIFEST)
        below = sorted(m.parent for m in path.rglob(MANIFEST)) if folder else []
        found += below or [path]
    return found


def read_ledger(run_dir: str | Path) -> dict:
    """ledger.json; TraceError when the run is unfinished (no final record yet) or a file is damaged.

    Args:
        run_dir: the run directory.

    Returns:
        ledger.json's object (dpledger.decoding.totals.RunTotals.summary wrote it).

    Raises:
        TraceError: if final.json is missing (the run is unfinished) or ledger.json cannot be read (read_json_file).
    """
    run_dir = Path(run_dir)
    if not os.path.lexists(run_dir / FINAL):
        raise TraceError(f"{run_dir / FINAL}: missing; the run is unfinished (resume it with dpledger decode --resume)")
    return read_json_file(run_dir / LEDGER, "the run's ledger")


def committed_chunk_indices(run_dir: str | Path) -> list[int]:
    """Indices of committed chunks; TraceError for anything in steps/ that is not a chunk file (a
    stray copy would otherwise be read or ignored silently; a link or a FIFO is never opened), for a
    steps/ that is a link, and for a gap (a chunk missing).

    Args:
        run_dir: the run directory.

    Returns:
        0, 1, ..., K-1 for K committed chunks; empty when there is no steps/ directory. Temporary
        files of interrupted writes are skipped.

    Raises:
        TraceError: if steps/ is a link, holds an entry that is not a chunk or not a regular file,
            or a chunk is missing before the last one.
    """
    steps = Path(run_dir) / STEPS_DIR
    try:
        listing = safe_files.entries(steps, root=run_dir)
    except FileNotFoundError:
        return []
    except UnsafeFileError as error:
        raise TraceError(str(error)) from None
    indices = []
    for name, mode in listing:
        if safe_files.TEMPORARY_NAME.fullmatch(name):
            continue  # an interrupted atomic write: never committed
        match = CHUNK_NAME.fullmatch(name)
        if match is None:
            raise TraceError(f"{steps / name}: not a chunk of this run (chunks are named chunk-NNNNNN.parquet); "
                             "move it out of steps/")
        if not stat.S_ISREG(mode):
            raise TraceError(f"{steps / name}: {safe_files.kind_of(mode)}, not a regular file"
                             + (f" ({safe_files.LINK_RULE})" if stat.S_ISLNK(mode) else ""))
        indices.append(int(match.group(1)))
    for expected, found in enumerate(indices):
        if expected != found:
            raise TraceError(f"{chunk_path(Path(run_dir), expected)}: missing (chunks jump to {found})")
    return indices


def _chunk_bytes(run_dir: str | Path, index: int) -> bytes:
    path = chunk_path(Path(run_dir), index)
    try:
        return safe_files.read_bytes(path, MAX_CHUNK_BYTES, root=run_dir, what="a chunk")
    except FileNotFoundError:
        raise TraceError(f"{path}: missing") from None
    except UnsafeFileError as error:
        raise TraceError(str(error)) from None
    except OSError as error:
        raise TraceError(f"{path}: cannot be read ({error.strerror or error})") from None


def _parsed_chunk(path: Path, data: bytes) -> list[dict]:
    try:
        return pq.read_table(pa.BufferReader(data)).to_pylist()
    except Exception as error:  # pyarrow raises several types for damaged files
        raise TraceError(f"{path}: unreadable Parquet chunk ({type(error).__name__}: {_one_line(error)})") from None


def read_chunk(run_dir: str | Path, index: int, expected_sha256: str | None = None) -> list[dict]:
    """A chunk's records; with `expected_sha256`, TraceError unless the file still has those bytes
    (a worker re-reading a chunk the driver has checked).

    Args:
        run_dir: the run directory.
        index: the block's index (0-based).
        expected_sha256: the sha256 (hex) the chunk's bytes must have; None: not checked.

    Returns:
        The block's records in step order, as Parquet stored them (the hash chain is not checked: ChainReader does).

    Raises:
        TraceError: if the chunk is missing, unsafe, unreadable, not valid Parquet, or its bytes differ
            from `expected_sha256`.
    """
    data = _chunk_bytes(run_dir, index)
    path = chunk_path(Path(run_dir), index)
    if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
        raise TraceError(f"{path}: changed since the audit read it (its sha256 differs)")
    return _parsed_chunk(path, data)


class ChainReader:
    """Streams a run's committed chunks in order, one block of records at a time, checking the
    hash chain from the manifest's genesis; after iterating, `head` is the last record hash and
    `steps` the record count. Memory is one chunk, whatever the run's length.

    With verify=True a break raises TraceError naming the chunk and step; with verify=False the
    first break is kept in `error` and reading goes on.
    """

    def __init__(self, run_dir: str | Path, manifest: dict, verify: bool = True):
        self.run_dir, self.manifest, self.verify = Path(run_dir), manifest, verify
        self.head: str = genesis_hash(manifest)
        self.steps = 0
        self.error: str | None = None
        self.chunk_sha256: dict[int, str] = {}  # of the very bytes each chunk's records were read from

    def __iter__(self) -> Iterator[tuple[int, list[dict]]]:
        self.head, self.steps, self.error = genesis_hash(self.manifest), 0, None
        for index in committed_chunk_indices(self.run_dir):
            data = _chunk_bytes(self.run_dir, index)
            self.chunk_sha256[index] = hashlib.sha256(data).hexdigest()
            chunk = _parsed_chunk(chunk_path(self.run_dir, index), data)
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
                recorded = record.get("record_hash")
                self.head = recorded if isinstance(recorded, str) else ""
                self.steps += 1
            yield index, chunk


def read_records(run_dir: str | Path, verify: bool = True) -> list[dict]:
    """All committed records in order (the whole run in memory: for small runs and tests; the
    audit streams with ChainReader).

    Args:
        run_dir: the run directory.
        verify: whether a break in the hash chain raises (True) or is passed over (False).

    Returns:
        Every committed record, in step order.

    Raises:
        UnusableRunError: if `run_dir` is not a dpledger run (read_manifest).
        TraceError: if a file cannot be read or, with `verify`, the chain is broken.
    """
    manifest = read_manifest(run_dir)
    return [record for _, chunk in ChainReader(run_dir, manifest, verify) for record in chunk]


def final_record(manifest: dict, steps: int, blocks: int, last_record_hash: str, ledger_bytes: bytes) -> dict:
    """The chain's end: step and block counts, the last record hash, the manifest's and the
    ledger's hashes, and `head`, the hash of all of them (what `decode` prints and a user publishes).

    Args:
        manifest: the run's manifest (its genesis hash is recorded).
        steps: the number of committed records.
        blocks: the number of committed chunks.
        last_record_hash: the chain's last record hash (the genesis hash for a run of no steps).
        ledger_bytes: ledger.json's exact bytes (their sha256 is recorded).

    Returns:
        final.json's object: format, schema_version, steps, blocks, last_record_hash, genesis_hash,
        ledger_sha256 and `head`.
    """
    body = {"format": "dpledger-final", "schema_version": SCHEMA_VERSION, "steps": int(steps), "blocks": int(blocks),
            "last_record_hash": last_record_hash, "genesis_hash": genesis_hash(manifest),
            "ledger_sha256": hashlib.sha256(ledger_bytes).hexdigest()}
    return {**body, "head": canonical_digest("dpledger-head:", body)}


def head_of(final: dict) -> str:
    """The head hash recomputed from a final record's other fields.

    Args:
        final: final.json's object.

    Returns:
        The head (64 hex digits); equal to final["head"] for an untouched final record.
    """
    return canonical_digest("dpledger-head:", {k: v for k, v in final.items() if k != "head"})


def read_final(run_dir: str | Path) -> dict:
    """final.json, the record that closes a finished run's chain.

    Args:
        run_dir: the run directory.

    Returns:
        final.json's object (final_record's fields).

    Raises:
        TraceError: if final.json is missing (the run is unfinished) or cannot be read (read_json_file).
    """
    return read_json_file(Path(run_dir) / FINAL, "the run's final record: the run is unfinished")


class RunLock:
    """An exclusive advisory lock (flock) on `<run_dir>/.lock`, held by the one process writing the
    run; the OS releases it when the process exits, however it exits. The lock file is opened
    without following a link or blocking (dpledger.accounting.safe_files.open_lock): a .lock planted as a
    link, a FIFO or a hard link is refused in one line, and nothing is written through it."""

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / LOCK
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        """Take the lock without waiting, and write this process's id into the lock file.

        Returns:
            This lock, now held (release it with `release`).

        Raises:
            RunLockedError: if another process holds the lock.
            UnsafeFileError: if .lock is a link, a FIFO, a hard link or not a regular file (open_lock).
            OSError: if the lock file cannot be opened or written.
        """
        fd = safe_files.open_lock(self.path)
        try:
            _take_exclusive(fd)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise _locked_error(self.path.parent, holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Release the lock and close its file; does nothing when it is not held."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


_PROBE_RETRIES = 5
"""Tries of a writer's non-blocking exclusive lock, 10 ms apart: lock_holder's probe (the audit's, and
check_output_directory's) holds a shared lock for microseconds, a writer for its whole run; a writer that
met a probe takes the lock on the next try instead of being refused under the prober's name."""


def _take_exclusive(fd: int) -> None:
    """flock(LOCK_EX | LOCK_NB), retried _PROBE_RETRIES times 10 ms apart; BlockingIOError if still held."""
    for attempt in range(_PROBE_RETRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == _PROBE_RETRIES - 1:
                raise
            time.sleep(0.01)


def _holder(fd: int) -> str:
    """The holder a lock file names (RunLock.acquire writes "pid N" into it), or "unknown"."""
    return os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"


def _locked_error(directory: Path, holder: str) -> RunLockedError:
    return RunLockedError(f"{directory} is being written by another dpledger process ({_one_line(holder)}); "
                          "wait for it to finish or choose another --out")


def _holds_files_error(out: Path) -> ValueError:
    return ValueError(f"output directory {out} already holds files: pass --resume to continue that run, "
                      "or choose another --out")


def lock_holder(directory: str | Path) -> str | None:
    """Who holds the directory's lock now ("pid N", as the holder wrote it), or None when nobody does.
    A .lock that is not a regular file (a link, a FIFO) is not dpledger's lock, so nobody holds it (the
    audit reports it).

    Args:
        directory: the run directory.

    Returns:
        The holder's text ("unknown" if it wrote none) while a process holds an exclusive lock on
        directory/.lock (tested with a non-blocking shared lock), else None.
    """
    try:
        fd = safe_files.open_regular(Path(directory) / LOCK, None)
    except (FileNotFoundError, NotADirectoryError, UnsafeFileError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)  # closing releases the shared lock
    return None


def is_locked(directory: str | Path) -> bool:
    """True while another process holds the directory's lock (lock_holder is not None).

    Args:
        directory: the run directory.

    Returns:
        Whether a process holds an exclusive lock on directory/.lock now.
    """
    return lock_holder(directory) is not None


def check_output_directory(out: str | Path, resume: bool, fingerprint: str | None = None) -> None:
    """What decoding into `out` refuses that needs no model, checked before anything is loaded or
    written (`dpledger decode` runs it before loading the models, so a used --out fails in under a
    second, not after the model stack loads): `out` must be a directory or absent; one holding files
    needs `resume`, must hold a dpledger run written with the same config (`fingerprint`, when given;
    resumed_run_manifest), and no other process may be writing it. The writer checks the run again
    under its lock (the directory may change in between), and taking the lock is what refuses a
    second writer (RunLock.acquire).

    Args:
        out: the run directory.
        resume: whether the decode continues the run in `out`.
        fingerprint: the config's fingerprint (RunConfig.fingerprint), or None not to compare it.

    Raises:
        ValueError: if `out` exists and is not a directory, or holds files and `resume` is False, or
            holds another run (its config's fingerprint differs).
        UnusableRunError: if `resume` and `out` holds files but no dpledger run (read_manifest).
        TraceError: if its manifest cannot be read.
        RunLockedError: if `resume` and another process holds the run's lock.
    """
    out = Path(out)
    require(not out.exists() or out.is_dir(), f"output path {out} exists and is not a directory")
    if out.is_dir() and any(p.name != LOCK for p in out.iterdir()):
        try:
            holder = lock_holder(out) if resume else None
        except OSError:   # an unreadable .lock: taking it later names the directory and the failure
            holder = None
        if holder is not None:
            raise _locked_error(out, holder)
        resumed_run_manifest(out, resume, fingerprint)


def resumed_run_manifest(out: str | Path, resume: bool, fingerprint: str | None) -> dict:
    """The manifest of the run in `out`, a directory that holds files, which a decode may continue:
    only with `resume`, and only a dpledger run of the same config. The writer calls it under the
    run's lock (what it then appends to), check_output_directory before loading any model.

    Args:
        out: the run directory (holding files).
        resume: whether the decode continues the run in `out`.
        fingerprint: the config's fingerprint (RunConfig.fingerprint), or None not to compare it.

    Returns:
        manifest.json's object.

    Raises:
        ValueError: if `resume` is False (the directory already holds files), or the run's config
            fingerprint differs from `fingerprint`.
        UnusableRunError: if `out` holds no dpledger run (read_manifest).
        TraceError: if its manifest cannot be read.
    """
    out = Path(out)
    if not resume:
        raise _holds_files_error(out)
    manifest = read_manifest(out)
    if fingerprint is not None and manifest.get("config_fingerprint") != fingerprint:
        raise ValueError(f"output directory {out} holds another run (its config differs from this one)")
    return manifest


def _remove_abandoned_creations(out: Path) -> None:
    """Directories left by a process killed while creating `out` (their lock is free); a link
    with such a name is not one of them and is left alone."""
    for candidate in out.parent.glob(f".{out.name}.creating-*"):
        if stat.S_ISDIR(os.lstat(candidate).st_mode) and not is_locked(candidate):
            shutil.rmtree(candidate, ignore_errors=True)


def create_run_directory(out: str | Path, manifest: dict, payload: bool) -> RunLock:
    """Create `out` with its manifest atomically (built under a temporary name, locked, then
    renamed), and return the held lock: no kill leaves a directory without a manifest, and a second
    writer racing for the same `out` gets RunLockedError or the "already holds files" error.

    Args:
        out: the run directory to create; it may exist only as an empty directory.
        manifest: manifest.json's content.
        payload: whether to create replay/ for the exact-replay payloads.

    Returns:
        The run directory's lock, held by this process.

    Raises:
        ValueError: if `out` exists and is not a directory, or already holds files.
        RunLockedError: if another process holds the new directory's lock.
        OSError: if a directory or the manifest cannot be created (the temporary directory is removed).
    """
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
                raise _holds_files_error(out) from None
            raise
        lock.path = out / LOCK
        return lock
    except BaseException:
        if lock is not None:
            lock.release()
        shutil.rmtree(staging, ignore_errors=True)
        raise


def remove_temporary_files(run_dir: str | Path) -> None:
    """Interrupted atomic writes (only ever called with the run's lock held); TraceError for a
    steps/ or replay/ that is a link (never followed).

    Args:
        run_dir: the run directory: its temporary files and those in steps/ and replay/ are removed.

    Raises:
        TraceError: if steps/ or replay/ is a link or not a directory.
    """
    for sub in (Path(run_dir), Path(run_dir) / STEPS_DIR, Path(run_dir) / REPLAY_DIR):
        try:
            listing = safe_files.entries(sub, root=run_dir)
        except FileNotFoundError:
            continue
        except UnsafeFileError as error:
            raise TraceError(str(error)) from None
        for name, _ in listing:
            if safe_files.TEMPORARY_NAME.fullmatch(name):
                safe_files.unlink(sub / name, root=run_dir)


@contextmanager
def locked(run_dir: str | Path) -> Iterator[RunLock]:
    """The run directory's lock, held for the `with` block and released however it ends.

    Args:
        run_dir: the run directory.

    Yields:
        The held RunLock.

    Raises:
        RunLockedError: if another process holds the lock (RunLock.acquire).
    """
    lock = RunLock(run_dir).acquire()
    try:
        yield lock
    finally:
        lock.release()
