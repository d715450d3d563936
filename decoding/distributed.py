"""Teacher-forced decoding on Dask workers: `dpledger decode RUN.toml --workers N | --scheduler ADDRESS`.

A teacher-forced block is independent of every other: its queries come from the text, and all its
randomness from (run seed, step) (mechanisms.randomness). Workers therefore decode disjoint blocks:
each loads the run's models once (checking their content hashes against the manifest), computes its
block's logits and the mechanism's outcome, writes the block's replay payload into the run directory
(atomically, so a rerun of the task rewrites the same bytes) and returns the block's records. The
driver, which holds the run's lock, chains and commits the records in block order exactly as a
single-process run does (decoding.run), so the trace, its hashes and the ledger are identical; a
worker that dies loses only uncommitted work, which Dask computes again elsewhere, and a killed
driver resumes with --resume like any run.

Sequential by nature, and so decoded in one process whatever the flags: free generation (each token
is the next step's context) and a data-dependent privacy filter (each step's decision depends on the
earlier steps' private charges). The default, data-independent filter is restored on the worker from
the step index alone (BudgetGate.restore_data_independent).
"""
from __future__ import annotations

from collections import deque
from typing import Iterator

from decoding import trace
from decoding.cluster import result_of, worker_count
from decoding.config import RunConfig

IN_FLIGHT_PER_WORKER = 2
"""Blocks submitted ahead per worker: enough to keep every worker busy while the driver commits,
few enough that uncommitted results stay small."""

_WORKER_RUNS: dict[str, object] = {}


def sequential_reason(config: RunConfig) -> str | None:
    """Why this run cannot be split over workers (None when it can)."""
    if config.data.stream != "teacher-forced":
        return "free generation is sequential (each token is the next step's context)"
    if config.budget is not None and config.budget.data_dependent:
        return "a data-dependent privacy filter decides each step from the earlier steps' private charges"
    return None


def _worker_run(config: RunConfig, model_hashes: list[str]):
    """This worker's prepared run (models loaded once per worker process and run)."""
    from decoding.run import prepare

    key = f"{config.out}|{config.fingerprint()}"
    prepared = _WORKER_RUNS.get(key)
    if prepared is None:
        prepared = prepare(config, verbose=False)
        found = [identity.content_hash for identity in prepared.ensemble.identities]
        if found != model_hashes:
            raise trace.TraceError("a worker loaded models with other content hashes than the run's manifest records "
                                   "(every worker must see the same model files at the same paths)")
        _WORKER_RUNS.clear()  # one run at a time per worker
        _WORKER_RUNS[key] = prepared
    return prepared


def decode_block_task(config: RunConfig, model_hashes: list[str], block: int, torch_threads: int) -> list[dict]:
    """On a worker: one block decoded, its payload written, its records (not yet chained) returned."""
    import torch

    from decoding.run import block_records

    prepared = _worker_run(config, model_hashes)  # prepare() sets its own thread count: override it after
    torch.set_num_threads(torch_threads)  # the driver's: how torch splits a reduction must not differ
    if prepared.budget is not None:
        prepared.budget.restore_data_independent(block * prepared.block_size)
    return block_records(prepared, block)


def distributed_blocks(prepared, client, first_block: int, progress: bool) -> Iterator[tuple[int, list[dict]]]:
    """(block, records) for blocks first_block.. in order, decoded on the client's workers; each
    result's payload file is checked against the sha256 its records carry before it is yielded."""
    import torch

    config = prepared.config
    hashes = [identity.content_hash for identity in prepared.ensemble.identities]
    in_flight = IN_FLIGHT_PER_WORKER * worker_count(client)
    threads = torch.get_num_threads()
    pending: deque = deque()
    next_block = first_block
    try:
        while pending or next_block < prepared.n_blocks:
            while next_block < prepared.n_blocks and len(pending) < in_flight:
                future = client.submit(decode_block_task, config, hashes, next_block, threads, pure=False,
                                       key=f"dpledger-decode-{config.fingerprint()[:12]}-block-{next_block}")
                pending.append((next_block, future))
                next_block += 1
            block, future = pending.popleft()
            records = result_of(future, f"decoding block {block}")
            future.release()
            if config.replay_payload:
                path = trace.replay_path(config.out, block)
                if not path.is_file() or trace.file_sha256(path) != records[0]["payload_sha256"]:
                    raise trace.TraceError(f"{path}: the payload a worker wrote for block {block} is missing or differs "
                                           "from its records' hash (workers must write to the run directory the driver "
                                           "sees)")
            yield block, records
    finally:
        client.cancel([future for _, future in pending])
