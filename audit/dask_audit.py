"""The audit on Dask workers: `dpledger audit RUN --workers N | --scheduler ADDRESS`.

The checks that read the per-step distributions (replay, the bound checks, the neighbour ablation,
the sampled aggregator) ask `LoadedTrace.map_windows` for one partial result per payload window
and combine them in block and window order. This executor computes those windows on workers: the
trace is cut into tasks of whole windows of one block; each worker loads what it needs once (the
run's models, when the driver found them; the runner; the re-encoded text) and reads its blocks'
chunks and payload from the run directory, checking each chunk still has the bytes the driver
loaded. Window functions depend on their arguments only (per-window seeds), so the partials, and
the check results built from them, are the ones a single-process audit computes: audit.json is
identical apart from its timestamp and duration. A task whose worker dies is recomputed elsewhere
by Dask.
"""
from __future__ import annotations

import math
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, TypeVar

from tqdm.auto import tqdm
import torch

from dpledger.audit.loader import LoadedTrace, WindowTask
from dpledger.decoding.cluster import require_single_threaded_workers, result_of, worker_count
from dpledger.decoding.process_memory import retain_freed_memory
from dpledger.decoding.trace import file_sha256

if TYPE_CHECKING:
    from distributed import Client  # the optional [dask] extra (docs/distributed.md)

TASKS_PER_WORKER = 4
"""Windows are grouped so that each worker gets about this many tasks per check: enough to balance
uneven blocks, few enough that scheduling costs nothing next to a window's work."""

_WORKER_TRACES: dict[str, LoadedTrace] = {}

_Partial = TypeVar("_Partial")


def _compute_task(spec: LoadedTrace, key: str, compute: Callable[..., _Partial], args: tuple[object, ...],
                  task: WindowTask, torch_threads: int) -> list[_Partial]:
    """On a worker: the partials of the task's windows. The trace (and what its window functions
    memoise: models, runner, text) is kept per worker process for this audit's later tasks, under the
    audit's id: a later audit starts afresh from the state its driver sends."""
    torch.set_num_threads(torch_threads)  # the driver's: how torch splits a reduction must not differ
    retain_freed_memory()
    trace = _WORKER_TRACES.get(key)
    if trace is None:
        spec.prepare_worker()
        _WORKER_TRACES.clear()  # one audit at a time per worker: keep one run's models, not every run's
        _WORKER_TRACES[key] = trace = spec
    partials = [compute(trace, records, logits, *args) for records, logits in trace.task_windows(task)]
    for name in ("model_logits", "model_logits_block"):  # a block's forward pass: not kept past its task
        trace.memo.pop(name, None)
    return partials


class DaskWindowExecutor:
    """Computes `map_windows` on a Dask client's workers, yielding the partials in order."""

    def __init__(self, client: Client, progress: bool = True, tasks_per_worker: int = TASKS_PER_WORKER):
        self.client, self.progress, self.tasks_per_worker = client, progress, tasks_per_worker
        # wall time spent on the workers' work (map_windows, file_digests); the rest of an audit is the
        # driver's own (benchmarks/bench_distributed.py separates the two)
        self.distributed_seconds = 0.0

    def file_digests(self, paths: list[Path]) -> list[str]:
        """sha256 of each file, computed on the workers (in order).

        Args:
            paths: the files to hash (resolved before they are sent).

        Returns:
            Each file's sha256 (hex), in the order of `paths`.

        Raises:
            ClusterError: if a task's workers died repeatedly, it was cancelled or the connection to the
                scheduler was lost (result_of names the file).
        """
        started = time.perf_counter()
        futures = self.client.map(file_sha256, [Path(p).resolve() for p in paths], pure=False,
                                  key=[f"dpledger-audit-sha256-{uuid.uuid4().hex[:8]}-{i}" for i in range(len(paths))])
        try:
            return [result_of(future, f"hashing {path}") for future, path in zip(futures, paths)]
        finally:
            self.client.cancel(futures)
            self.distributed_seconds += time.perf_counter() - started

    def tasks_for(self, trace: LoadedTrace) -> list[WindowTask]:
        """The trace's windows grouped into tasks: one per block when the logits come from the run's
        models (a block's forward pass serves all its windows), else about `tasks_per_worker` per worker.

        Args:
            trace: the loaded run.

        Returns:
            The WindowTasks, in block and row order.
        """
        window = trace.window_rows()
        windows = sum(math.ceil(info.length / window) for info in trace.blocks_info)
        if trace.logits_source == "models":  # a block's forward pass serves all its windows: one task per block
            per_task = max(math.ceil(info.length / window) for info in trace.blocks_info)
        else:
            per_task = max(1, math.ceil(windows / (self.tasks_per_worker * worker_count(self.client))))
        return trace.window_tasks(per_task)

    def map_windows(self, trace: LoadedTrace, compute: Callable[..., _Partial], args: tuple[object, ...],
                    desc: str) -> Iterator[tuple[int, _Partial]]:
        """`compute(trace, records, logits, *args)` for every payload window of `trace`, on the
        workers; the partials come back in block and window order whatever order the tasks finish in.

        Args:
            trace: the loaded run (a copy without its models and executor goes to the workers).
            compute: a module-level window function (LoadedTrace.map_windows).
            args: the further arguments passed to `compute` after the window.
            desc: names the check (progress bar, task keys).

        Returns:
            An iterator of (block, partial) for every window, in order.

        Raises:
            ClusterError: if a worker runs more than one thread at once, a task's workers died
                repeatedly, it was cancelled or the connection was lost. An error raised by `compute`
                itself (on a worker, or when a worker cannot load the run's models) passes through.
        """
        require_single_threaded_workers(self.client)
        spec, key = trace.for_workers(), trace.audit_id
        tasks = self.tasks_for(trace)
        run, threads = uuid.uuid4().hex[:8], torch.get_num_threads()
        futures = [self.client.submit(_compute_task, spec, key, compute, args, task, threads, pure=False,
                                      key=f"dpledger-audit-{desc.replace(' ', '-')}-{run}-{index}")
                   for index, task in enumerate(tasks)]
        bar = tqdm(total=len(tasks), desc=desc, unit="task", disable=not self.progress, dynamic_ncols=True)
        started = time.perf_counter()
        try:
            for task, future in zip(tasks, futures):
                partials = result_of(future, f"the audit's {desc} of block {task.block}")
                bar.update(1)
                future.release()
                for partial in partials:
                    yield task.block, partial
        finally:
            bar.close()
            self.client.cancel([f for f in futures if not f.done()])
            self.distributed_seconds += time.perf_counter() - started
