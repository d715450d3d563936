"""Dask clusters for dpledger's distributed work: the optional extra `pip install 'dpledger[dask]'`.

`--workers N` starts a `distributed.LocalCluster` of N worker processes on this machine, one thread
each; `--scheduler ADDRESS` connects to a running Dask cluster. Dask, not a process pool of our own:
it reschedules the tasks of a worker that dies, shows every worker on its dashboard, and the same
command runs on a laptop or a cluster. Workers read the run directory and the models at the paths
the driver sees, so on a cluster they must be on a shared filesystem.

A local cluster's scheduler, workers and dashboard listen on 127.0.0.1 only (ClusterSpec.host): the
dashboard shows task names and the scheduler accepts tasks, neither of which should reach the network
unless asked for (ClusterSpec(workers=N, host="0.0.0.0")).

Work sent to workers is computed with one torch thread per process (OMP_NUM_THREADS=1 on a local
cluster): results are then bit-identical to a single-process run with one thread (`make` sets
OMP_NUM_THREADS=1), since floating-point reductions may be split differently with more threads.
"""
from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, TypeVar
from multiprocessing import resource_tracker
import asyncio
import concurrent.futures
import os
import signal
import threading

from dpledger.accounting.errors import require

if TYPE_CHECKING:
    from distributed import Client, Future
    from distributed.diagnostics.plugin import WorkerPlugin

T = TypeVar("T")

DASK_MISSING = "needs Dask, an optional extra: pip install 'dpledger[dask]'"
WORKER_WAIT_SECONDS = 60
LOCAL_HOST = "127.0.0.1"


def max_local_workers() -> int:
    """The most local workers --workers starts: this machine's cores, at least 2.

    Returns:
        max(2, os.cpu_count()).
    """
    return max(2, os.cpu_count() or 1)


class ClusterError(OSError):
    """The cluster failed (unreachable scheduler, no workers, workers dying on a task again and again,
    a worker that cannot see the run's files): not a property of the run or its trace, so never an
    audit verdict (the command stops with one line, exit 2)."""


@dataclass(frozen=True)
class ClusterSpec:
    """Where distributed work runs: `workers` local processes, or the Dask scheduler at `scheduler`."""

    workers: int | None = None
    scheduler: str | None = None
    host: str = LOCAL_HOST
    """The interface a local cluster's scheduler, workers and dashboard listen on."""

    def __post_init__(self) -> None:
        require((self.workers is None) != (self.scheduler is None),
                "give either --workers N (a local cluster) or --scheduler ADDRESS (a running Dask cluster), not both")
        if self.workers is not None:
            require(isinstance(self.workers, int) and not isinstance(self.workers, bool) and self.workers >= 1,
                    f"--workers must be an integer >= 1, got {self.workers!r}")
            limit = max_local_workers()
            require(self.workers <= limit,
                    f"--workers must be at most {limit}, this machine's cores (each worker is a single-threaded process "
                    f"with its own copy of the models: more only compete for the cores), got {self.workers}")
        else:
            require(isinstance(self.scheduler, str) and self.scheduler.strip() != "",
                    f"--scheduler must be a Dask scheduler address such as tcp://host:8786, got {self.scheduler!r}")
        require(isinstance(self.host, str) and self.host.strip() != "",
                f"host must be an interface address such as 127.0.0.1, got {self.host!r}")

    @classmethod
    def from_flags(cls, workers: int | None, scheduler: str | None) -> "ClusterSpec | None":
        """None when neither flag was given (work in this process).

        Args:
            workers: --workers: the number of local worker processes, or None.
            scheduler: --scheduler: a running Dask scheduler's address, or None.

        Returns:
            The spec, or None when both are None.

        Raises:
            ValueError: if both are given, or either is invalid (ClusterSpec's checks).
        """
        return None if workers is None and scheduler is None else cls(workers, scheduler)

    def describe(self) -> str:
        """Where the work runs, in words ("4 local worker processes", "the Dask cluster at ...").

        Returns:
            The description, for progress and error messages.
        """
        return f"{self.workers} local worker processes" if self.workers is not None else f"the Dask cluster at {self.scheduler}"


def require_dask(what: str) -> None:
    """ValueError naming the extra when Dask is not installed.

    Args:
        what: what needs Dask (the flags or command), the start of the message.

    Raises:
        ValueError: if `distributed` cannot be imported.
    """
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise ValueError(f"{what} {DASK_MISSING}") from None


def _check_address(address: str) -> None:
    """ValueError for an address that is not tcp://host:port (or host:port), before a Client is built
    (a Client built on a malformed one waits out its timeout, then fails again in its finaliser)."""
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, location = parse_address(address)
        host, port = parse_host_port(location) if scheme == "tcp" else (None, None)
    except (ValueError, TypeError) as error:
        raise ValueError(f"--scheduler must be a Dask scheduler address such as tcp://host:8786, got {address!r} "
                         f"({error})") from None
    require(scheme == "tcp" and bool(host) and bool(port),
            f"--scheduler must be a Dask scheduler address such as tcp://host:8786 (tcp, with a host and a port), "
            f"got {address!r}")


def require_single_threaded_workers(client: Client) -> None:
    """ClusterError unless every worker runs one task at a time: a worker's models, its prepared run
    and its privacy-filter state are per process (`dask worker ADDRESS --nthreads 1`).

    Args:
        client: the Dask client; its scheduler lists the workers.

    Raises:
        ClusterError: if a worker runs more than one thread.
    """
    workers = client.scheduler_info().get("workers", {})
    threaded = {address: info.get("nthreads") for address, info in workers.items() if info.get("nthreads") != 1}
    if threaded:
        address, threads = next(iter(threaded.items()))
        raise ClusterError(f"{len(threaded)} Dask workers run several tasks at once (e.g. {address}: {threads} threads); "
                           "dpledger needs one thread per worker process: start them with "
                           "`dask worker ADDRESS --nthreads 1 --nworkers N`")


def _ignore_interrupt_plugin() -> WorkerPlugin:
    """A worker plugin for local clusters: Ctrl-C reaches the driver, which stops the run and closes
    the cluster; the workers, in the same terminal's process group, would each print a traceback."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class IgnoreInterrupt(WorkerPlugin):
        name = "dpledger-ignore-interrupt"

        def setup(self, worker: object) -> None:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.SIG_IGN)

    return IgnoreInterrupt()


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker, if it is not running yet, with its stderr on the null
    device. A local cluster's nanny processes create their queues' named semaphores through it, and
    it prints what it cannot match (a KeyError traceback for a name it no longer holds, "leaked
    semaphore" warnings) when a worker dies mid-run, although Dask has replaced the worker and the
    result is unchanged; it still unlinks whatever is left when the last process exits. A tracker
    started earlier keeps its stderr (this process already shares it with its children)."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        resource_tracker.ensure_running()  # spawned with fds 0-2 as they are now: its stderr is the null device
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextmanager
def dask_client(spec: ClusterSpec, progress: bool = True) -> Iterator[Client]:
    """A `distributed.Client` for `spec`, closed (with its local cluster) on exit; the dashboard's
    link is printed to stderr when `progress`.

    Args:
        spec: local workers or a scheduler's address.
        progress: print the dashboard's link to stderr.

    Yields:
        The client (not the default client), its workers checked to run one thread each.

    Raises:
        ValueError: if Dask is not installed or the scheduler's address is malformed.
        ClusterError: if the scheduler cannot be reached, the local cluster cannot start, the
            scheduler has no workers within WORKER_WAIT_SECONDS, or a worker runs several threads.
    """
    require_dask("--workers / --scheduler")
    import distributed

    cluster = None
    if spec.scheduler is not None:
        _check_address(spec.scheduler)
    try:
        if spec.scheduler is not None:
            client = distributed.Client(spec.scheduler, timeout="10s", set_as_default=False)
        else:
            quiet_resource_tracker()
            # CRITICAL: a worker's routine shutdown messages (a heartbeat cut by close) are not the user's
            # concern, and a task's error reaches the driver as the task's exception anyway
            cluster = distributed.LocalCluster(n_workers=spec.workers, threads_per_worker=1, processes=True,
                                               host=spec.host, dashboard_address=f"{spec.host}:0",
                                               silence_logs=logging.CRITICAL,
                                               env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                                                    "TOKENIZERS_PARALLELISM": "false"})
            client = distributed.Client(cluster, set_as_default=False)
            client.register_plugin(_ignore_interrupt_plugin())
    except (OSError, TimeoutError) as error:
        if cluster is not None:
            cluster.close()
        where = (f"cannot reach the Dask scheduler at {spec.scheduler}" if spec.scheduler is not None
                 else f"cannot start a local Dask cluster of {spec.workers} workers")
        raise ClusterError(f"{where}: {' '.join(str(error).split())}") from None
    try:
        if spec.scheduler is not None:
            try:
                client.wait_for_workers(1, timeout=WORKER_WAIT_SECONDS)
            except (TimeoutError, OSError):
                raise ClusterError(f"the Dask scheduler at {spec.scheduler} has no workers (waited "
                                   f"{WORKER_WAIT_SECONDS} s): start some with `dask worker {spec.scheduler} "
                                   "--nthreads 1`") from None
        require_single_threaded_workers(client)
        if progress:
            print(f"dask: {spec.describe()}; dashboard {client.dashboard_link}", file=sys.stderr)
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def worker_count(client: Client) -> int:
    """How many workers the client's scheduler has now.

    Args:
        client: the Dask client.

    Returns:
        The number of workers, at least 1.
    """
    return max(1, len(client.scheduler_info().get("workers", {})))


def result_of(future: Future[T], what: str) -> T:
    """The future's result. A task whose worker died once is simply computed again elsewhere, by Dask;
    a task that kept killing its workers, a cancelled one (the scheduler lost) or a lost connection
    is a ClusterError.

    Args:
        future: a submitted task.
        what: what the task does, the start of the error message ("decoding block 3").

    Returns:
        The task's result (waiting for it).

    Raises:
        ClusterError: if the task's workers died repeatedly, it was cancelled, or the connection was lost.
        Exception: whatever the task itself raised, unchanged.
    """
    import distributed
    from distributed.comm.core import CommClosedError

    try:
        return future.result()
    except distributed.KilledWorker as error:
        raise ClusterError(f"{what}: the workers running it died repeatedly ({error}); nothing was committed for it") \
            from None
    except (asyncio.CancelledError, concurrent.futures.CancelledError, CommClosedError, TimeoutError) as error:
        raise ClusterError(f"{what}: the Dask cluster stopped answering ({type(error).__name__}: "
                           f"{' '.join(str(error).split())}); nothing was committed for it") from None
