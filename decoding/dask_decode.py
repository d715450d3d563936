"""Teacher-forced decoding on Dask workers: `dpledger decode RUN.toml --workers N | --scheduler ADDRESS`.

A teacher-forced block is independent of every other: its queries come from the text, and all its
randomness from (run seed, step) (dpledger.mechanisms.randomness). Workers therefore decode disjoint blocks:
each loads the run's models once (checking their content hashes against the manifest), computes its
block's logits and the mechanism's outcome, writes the block's replay payload into the run directory
(atomically, so a rerun of the task rewrites the same bytes) and returns the block's records. The
driver, which holds the run's lock, chains and commits the records in block order exactly as a
single-process run does (dpledger.decoding.run), so the trace, its hashes and the ledger are identical; a
worker that dies loses only uncommitted work, which Dask computes again elsewhere, and a killed
driver resumes with --resume like any run.

Sequential by nature, and so decoded in one process whatever the flags: free generation (each token
is the next step's context) and a data-dependent privacy filter (each step's decision depends on the
earlier steps' private charges). The default, data-independent filter is restored on the worker from
the step index alone (BudgetGate.restore_data_independent).
"""
from __future__ import annotations

import uuid
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Generator
import torch

from dpledger.decoding import trace
from dpledger.decoding.blocks import PreparedRun, block_records, prepare
from dpledger.decoding.vote_payload import block_payload_file
from dpledger.decoding.cluster import ClusterError, require_single_threaded_workers, result_of, worker_count
from dpledger.decoding.config import RunConfig
from dpledger.decoding.process_memory import retain_freed_memory
from dpledger.decoding.runners import build_runner

if TYPE_CHECKING:
    from distributed import Client, Future

IN_FLIGHT_PER_WORKER = 2
"""Blocks submitted ahead per worker: enough to keep every worker busy while the driver commits,
few enough that uncommitted results stay small."""

_WORKER_RUNS: dict[str, PreparedRun] = {}


def sequential_reason(config: RunConfig) -> str | None:
    """Why this run cannot be split over workers (None when it can).

    Args:
        config: the run's configuration.

    Returns:
        The reason in words (free generation, or a data-dependent or realised-path privacy filter), or None.
    """
    if config.data.stream != "teacher-forced":
        return "free generation is sequential (each token is the next step's context)"
    if config.budget is not None and config.budget.data_dependent:
        return "a data-dependent privacy filter decides each step from the earlier steps' private charges"
    if config.budget is not None:
        if build_runner(config.mechanism, config.models.teachers, config.relation).realised_path_bounds is not None:
            return "a realised-path privacy filter decides each step from the earlier steps' screen decisions"
    return None


def config_for_workers(config: RunConfig) -> RunConfig:
    """The config with its local paths made absolute: a worker may run in another directory.

    Args:
        config: the run's configuration.

    Returns:
        A copy whose `out` is absolute, and whose model, tokenizer, in-context examples and text
        paths are absolute where they exist here (a hub name is left as it is).
    """
    def absolute(path: str) -> str:
        return str(Path(path).resolve()) if Path(path).exists() else path

    def optional(path: str | None) -> str | None:
        return None if path is None else absolute(path)

    models = replace(config.models, public=optional(config.models.public), tokenizer=optional(config.models.tokenizer),
                     teacher_paths=tuple(absolute(p) for p in config.models.teacher_paths),
                     icl_examples=optional(config.models.icl_examples))
    return replace(config, out=str(Path(config.out).resolve()), models=models,
                   data=replace(config.data, text=optional(config.data.text)))


def _worker_run(config: RunConfig, model_hashes: list[str], data_sha256: str) -> PreparedRun:
    """This worker's prepared run: models loaded once per worker process and run. The key holds what
    the driver loaded (model hashes, the data's sha256), so changed files are never served stale."""
    key = f"{config.out}|{config.fingerprint()}|{','.join(model_hashes)}|{data_sha256}"
    prepared = _WORKER_RUNS.get(key)
    if prepared is None:
        _WORKER_RUNS.clear()  # one run at a time per worker
        prepared = prepare(config, verbose=False)
        found = [identity.content_hash for identity in prepared.ensemble.identities]
        if found != model_hashes:
            raise ClusterError("a worker loaded models with other content hashes than the driver (every worker must "
                               "see the same model files at the same paths)")
        if prepared.data_identity["sha256"] != data_sha256:
            raise ClusterError("a worker read other data than the driver (every worker must see the same data.text "
                               "at the same path)")
        _WORKER_RUNS[key] = prepared
    return prepared


def decode_block_task(config: RunConfig, model_hashes: list[str], data_sha256: str, block: int,
                      torch_threads: int) -> list[dict]:
    """On a worker: one block decoded, its payload written, its records (not yet chained) returned.

    Args:
        config: the run's configuration with absolute paths (config_for_workers).
        model_hashes: the content hashes of the models the driver loaded, public model first.
        data_sha256: the sha256 of the data the driver read.
        block: the block's index (0-based).
        torch_threads: the driver's torch thread count, which the worker uses too.

    Returns:
        The block's records, not yet chained.

    Raises:
        ClusterError: if the worker loads other models or data than the driver.
    """
    prepared = _worker_run(config, model_hashes, data_sha256)  # prepare() sets its own thread count: override it after
    torch.set_num_threads(torch_threads)  # the driver's: how torch splits a reduction must not differ
    retain_freed_memory()
    if prepared.budget is not None:
        prepared.budget.restore_data_independent(block * prepared.block_size)
    return block_records(prepared, block)


def distributed_blocks(prepared: PreparedRun, client: Client, first_block: int,
                       progress: bool) -> Generator[tuple[int, list[dict]], None, None]:
    """(block, records) for blocks first_block.. in order, decoded on the client's workers; each
    result's payload file is checked against the sha256 its records carry before it is yielded.

    Args:
        prepared: the driver's prepared run (its privacy filter restored to the committed steps).
        client: the Dask client; its workers must run one thread each.
        first_block: the first block to decode (the number of committed blocks).
        progress: unused here (the decode loop shows the progress).

    Yields:
        (block index, the block's records, not yet chained), in block order; closing the generator
        cancels the blocks still in flight.

    Raises:
        ClusterError: if a worker is multi-threaded, a task fails, or a worker loads other models or data.
        TraceError: if a payload a worker wrote is missing or differs from its records' hash.
        ValueError: if the workers' privacy-filter decisions differ from the driver's (BudgetGate.require_decisions).
    """
    require_single_threaded_workers(client)
    config, worker_config = prepared.config, config_for_workers(prepared.config)
    hashes = [identity.content_hash for identity in prepared.ensemble.identities]
    data_sha256 = prepared.data_identity["sha256"]
    in_flight = IN_FLIGHT_PER_WORKER * worker_count(client)
    threads, run = torch.get_num_threads(), uuid.uuid4().hex[:8]
    pending: deque[tuple[int, Future[list[dict]]]] = deque()
    next_block = first_block
    try:
        while pending or next_block < prepared.n_blocks:
            while next_block < prepared.n_blocks and len(pending) < in_flight:
                future = client.submit(decode_block_task, worker_config, hashes, data_sha256, next_block, threads,
                                       pure=False, key=f"dpledger-decode-{run}-block-{next_block}")
                pending.append((next_block, future))
                next_block += 1
            block, future = pending.popleft()
            records = result_of(future, f"decoding block {block}")
            future.release()
            if prepared.budget is not None:  # the driver's filter, restored from the committed steps, decides too
                prepared.budget.require_decisions(records)
            if config.replay_payload:
                path, _ = block_payload_file(config.out, block, trace.payload_format(trace.read_manifest(config.out)),
                                             len(records), prepared.ensemble.n_teachers, prepared.ensemble.vocab_size)
                if not path.is_file() or trace.file_sha256(path) != records[0]["payload_sha256"]:
                    raise trace.TraceError(f"{path}: the payload a worker wrote for block {block} is missing or differs "
                                           "from its records' hash (workers must write to the run directory the driver "
                                           "sees)")
            yield block, records
    finally:
        client.cancel([future for _, future in pending])
