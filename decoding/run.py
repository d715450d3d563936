"""The decode loop: run a mechanism over a query stream, charge the ledger, write the trace.

Blocks of queries are processed in order; step t draws everything random (Poisson mask,
screening noise, the sampled token) from its own generator seeded from (run seed, t)
(dpledger.mechanisms.randomness), so a resumed run reproduces an uninterrupted one exactly and a block can be
replayed in windows of rows. One process writes a run: it holds the directory's lock
(trace.RunLock) from creation or resume to exit. After each block its records are chained and
committed atomically (trace.py); ledger.json and then the final record (the chain's head) are
computed from the committed records alone (dpledger.decoding.totals, which the audit uses too).
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generator

import numpy as np
from tqdm.auto import tqdm

from dpledger.decoding import trace
from dpledger.decoding.blocks import PreparedRun, block_records, build_manifest, prepare
from dpledger.decoding.cluster import ClusterError
from dpledger.decoding.config import RunConfig
from dpledger.decoding.dask_decode import distributed_blocks, sequential_reason
from dpledger.decoding.ensemble import file_problems, identity_problems, tokenizer_files
from dpledger.decoding.process_memory import retain_freed_memory
from dpledger.decoding.totals import RunTotals, finish_run
from dpledger.decoding.vote_payload import block_payload_file, payload_format_entry

if TYPE_CHECKING:
    from distributed import Client


def _manifest(prepared: PreparedRun) -> dict:
    return build_manifest(prepared.config, prepared.runner, prepared.orders,
                          [identity.manifest_entry() for identity in prepared.ensemble.identities],
                          prepared.ensemble.vocab_size, prepared.data_identity, prepared.tokenizer_path,
                          prepared.canaries, prepared.budget, tokenizer_files(prepared.tokenizer_path))


def _payload_entry(prepared: PreparedRun) -> dict:
    """The replay_payload_format this run's config gives (vote_payload.payload_format_entry)."""
    return payload_format_entry(prepared.config.replay_payload_format, prepared.config.replay_top_k,
                                prepared.runner.kind == "voting")


def _model_changes(manifest: dict, prepared: PreparedRun) -> list[str]:
    """How the models and tokenizer loaded now differ from the ones a run's manifest records."""
    recorded = manifest.get("models", [])
    if len(recorded) != len(prepared.ensemble.identities):
        return [f"the manifest records {len(recorded)} models, {len(prepared.ensemble.identities)} are loaded"]
    changes = [problem for entry, found in zip(recorded, prepared.ensemble.identities)
               for problem in identity_problems(entry, found)]
    if "tokenizer_files" in manifest:
        changes += file_problems(manifest["tokenizer_files"], tokenizer_files(prepared.tokenizer_path),
                                 prepared.tokenizer_path)
    return changes


def _open_run_dir(prepared: PreparedRun, resume: bool) -> trace.RunLock:
    """The run directory, created with its manifest (a fresh run) or checked for resuming, and its
    lock, held until the caller releases it. Nothing is written when a check fails."""
    out = Path(prepared.config.out)
    fingerprint = prepared.config.fingerprint()
    trace.check_output_directory(out, resume, fingerprint)
    if out.is_dir() and any(p.name != trace.LOCK for p in out.iterdir()):
        lock = trace.RunLock(out).acquire()
        try:
            # again under the lock: the directory at `out` may have been replaced since the check above
            manifest = trace.resumed_run_manifest(out, resume, fingerprint)
            changes = _model_changes(manifest, prepared)
            if changes:
                raise ValueError(f"output directory {out} was written with other models: {changes[0]}")
            kept, asked = trace.payload_format(manifest), _payload_entry(prepared)
            if prepared.config.replay_payload and kept["format"] != asked["format"]:
                raise ValueError(f"output directory {out} keeps a {kept['format']} replay payload, this config asks for "
                                 f"{asked['format']}: resume it with run.replay_payload_format = "
                                 f"\"{'logits' if kept['format'] == trace.LOGITS_FORMAT else 'bounded'}\"")
            if prepared.config.replay_payload and kept.get("top_k") != asked.get("top_k"):
                raise ValueError(f"output directory {out} keeps {kept.get('top_k')} race entries per teacher, this "
                                 f"config asks for {asked.get('top_k')}: resume it with run.replay_top_k = "
                                 f"{kept.get('top_k')}")
            trace.remove_temporary_files(out)
        except BaseException:
            lock.release()
            raise
        return lock
    return trace.create_run_directory(out, _manifest(prepared), prepared.config.replay_payload)


@dataclass
class RunResult:
    """What run_decode returns: the run directory, ledger.json's content, the step the run resumed
    from (0 for a fresh run) and the chain's head (final.json's `head`, what `decode` prints)."""

    directory: Path
    summary: dict
    resumed_from_step: int
    head: str


class RunWriteError(ValueError):
    """Writing the trace failed (disk full, file-size limit, permissions): what was committed stays."""


def run_decode(config: RunConfig, resume: bool = False, progress: bool = True, verbose: bool = True,
               prepared: PreparedRun | None = None, client: Client | None = None) -> RunResult:
    """Run (or resume) a decoding job and return its directory, ledger summary and chain head.

    Every check runs before anything is written; the run directory's lock is held throughout, so a
    second writer (another decode or resume of the same directory) fails with one line and changes
    nothing. A write failure (OSError) leaves the committed blocks for --resume.

    With a Dask `client`, a teacher-forced run's blocks are decoded on its workers and committed here
    in block order (dpledger.decoding.dask_decode): the trace is the one this process would write.

    Args:
        config: the run's configuration (its `out` is the run directory).
        resume: continue the run in `config.out` from its committed blocks; without it the directory
            must not hold files.
        progress: show a progress bar.
        verbose: let model loading report what it does (prepare).
        prepared: the run already prepared from this `config` (models loaded); None: prepared here.
        client: a Dask client whose workers decode the blocks; ignored, with a warning, for a run
            that is sequential by nature (dask_decode.sequential_reason).

    Returns:
        The run directory, ledger.json's content, the step the run resumed from (0 for a fresh run,
        `config.queries` for a finished one) and the chain's head.

    Raises:
        ValueError: if a check fails before anything is written: the directory holds another run or
            files without --resume, or was written with other models.
        RunLockedError: if another process is writing the run directory.
        TraceError: if the committed trace is damaged, or its replay payloads are incomplete.
        ClusterError: if the Dask workers fail or disagree with this process.
        RunWriteError: if creating the directory or writing the trace fails (the committed blocks stay).
    """
    if client is not None:
        reason = sequential_reason(config)
        if reason is not None:
            warnings.warn(f"{reason}: decoding in this process, not on the Dask workers", stacklevel=2)
            client = None
    retain_freed_memory()
    prepared = prepared or prepare(config, verbose=verbose)
    out = Path(config.out)
    try:
        lock = _open_run_dir(prepared, resume)
    except OSError as error:
        raise RunWriteError(f"cannot create the run directory {out}: {error.strerror or error}") from None
    try:
        return _decode_locked(prepared, out, progress, client)
    except ClusterError:
        raise
    except OSError as error:
        where = f" ({error.filename})" if getattr(error, "filename", None) else ""
        committed = len(trace.committed_chunk_indices(out)) if out.is_dir() else 0
        raise RunWriteError(f"writing the trace failed{where}: {error.strerror or error}; {committed} blocks are "
                            f"committed in {out}; continue with --resume once the cause is fixed") from None
    finally:
        lock.release()


def _local_blocks(prepared: PreparedRun, first_block: int) -> Generator[tuple[int, list[dict]], None, None]:
    """(block, records) decoded in this process, in order."""
    for block in range(first_block, prepared.n_blocks):
        yield block, block_records(prepared, block)


def _decode_locked(prepared: PreparedRun, out: Path, progress: bool, client: Client | None = None) -> RunResult:
    config = prepared.config
    manifest = trace.read_manifest(out)
    if (out / trace.FINAL).exists():
        return RunResult(out, trace.read_ledger(out), config.queries, trace.read_final(out)["head"])
    running = RunTotals(manifest)
    reader = trace.ChainReader(out, manifest)
    committed_charges: list[float] = []
    for block, records in reader:
        committed_charges += [record.get("budget_charge", 0.0) for record in records]
        if config.replay_payload:
            path, bound = block_payload_file(out, block, trace.payload_format(manifest), len(records),
                                             prepared.ensemble.n_teachers, prepared.ensemble.vocab_size)
            try:
                problem = (None if trace.file_sha256(path, bound, root=out)
                           == records[0].get("payload_sha256") else "differs from the hash in its chunk")
            except FileNotFoundError:
                problem = "missing"
            except trace.UnsafeFileError as error:  # a link, a FIFO, a device, an oversized file: never read
                problem = str(error).removeprefix(f"{path}: ")
            if problem is not None:
                raise trace.TraceError(f"{path}: {problem}; the run's exact-replay payload is incomplete, so it cannot "
                                       "be resumed (start it again in a new directory)")
        running.add(records)
    if prepared.budget is not None:  # the filter continues from the committed steps' charges, bit for bit
        prepared.budget.restore(committed_charges)
    done_blocks, step, prev_hash = len(trace.committed_chunk_indices(out)), reader.steps, reader.head
    resumed_from = step
    first_delta = config.deltas[0]
    bar = tqdm(total=config.queries, initial=step, unit="q", desc=f"{prepared.runner.kind}", disable=not progress,
               dynamic_ncols=True)
    started = time.time()
    if client is not None:
        blocks = distributed_blocks(prepared, client, done_blocks, progress)
    else:
        blocks = _local_blocks(prepared, done_blocks)
    try:
        for block, records in blocks:
            prev_hash = trace.chain_records(records, prev_hash)
            # charged (and so validated: no NaN, no negative value) before the commit point, so a bad
            # charge never reaches the trace
            running.add(records)
            trace.write_chunk(out, block, records)  # the commit point
            step += len(records)
            bar.update(len(records))
            with np.errstate(all="ignore"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    eps = running.ledger.epsilon(first_delta).epsilon
            bar.set_postfix(eps=f"{eps:.3g}", qps=f"{(step - resumed_from) / max(time.time() - started, 1e-9):.0f}")
    finally:
        bar.close()
        blocks.close()  # stops a distributed producer's outstanding tasks
    if client is not None:
        trace.remove_temporary_files(out)  # a worker killed while writing a payload leaves its temporary file
    summary, final = finish_run(out, manifest, running, prepared.n_blocks, prev_hash)
    return RunResult(out, summary, resumed_from, final["head"])

