"""Load a trace for auditing, streaming: the manifest, ledger.json and the final record are read
whole; per-step records are read one chunk (block) at a time and replay logits one window of rows
at a time, so the audit's memory does not grow with the run's length.

`load_trace` makes one pass over the chunks: it checks the hash chain from the manifest's
genesis, recomputes everything ledger.json holds (dpledger.decoding.totals.RunTotals) and checks each record's
structure against the manifest (trace_consistency reports what it found).

The checks that read the per-step distributions do so through `LoadedTrace.map_windows`: a
function of one window (its records and logits) returns a small partial result, and the check
combines the partials in block and window order. Without an executor the windows are computed in
this process; with one (dpledger.audit.dask_audit) on Dask workers. Either way the check combines the same
partials in the same order, so its result does not depend on where they were computed.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Iterator, Protocol, TypeVar

import numpy as np
import torch
from dataclasses import replace
from tqdm.auto import tqdm

from dpledger.accounting import safe_files
from dpledger.accounting.errors import require
from dpledger.decoding import trace
from dpledger.decoding.totals import RunTotals
from dpledger.decoding.runners import Runner, build_runner
from dpledger.decoding.trace import TraceError
from dpledger.decoding.budget import BudgetGate
from dpledger.decoding.cluster import ClusterError
from dpledger.decoding.corpus import generate_corpus
from dpledger.decoding.ensemble import Ensemble, file_problems, identity_problems, tokenizer_files
from dpledger.decoding.icl import InContextEnsemble, load_icl_ensemble
from dpledger.decoding.vote_payload import VotePayload, block_payload_file, read_vote_payload
from dpledger.mechanisms.leave_one_out import prepared_leave_one_out
from dpledger.mechanisms.step import as_ensemble

WindowData = torch.Tensor | VotePayload
"""What a payload window holds: the logits (N+1, W, V), or a voting run's bounded vote payload."""

PAYLOAD_WINDOW_BYTES = 256 * 2 ** 20
"""Replay windows hold at most this much of a block's float64 work (N+1 distributions and the
per-order kernels' arrays, V wide, per step) at once; a larger block is replayed in windows of fewer steps (per-step randomness makes
every window exact)."""
MAX_PROBLEMS = 50
DATA_DEPENDENT_FILTER = ("the run's privacy filter was driven by data-dependent losses, so whether a step was answered "
                         "privately depends on the data: a neighbour's run may answer where this one refused, and "
                         "no per-step comparison of this run's laws measures that (Redberg et al. 2023); the run "
                         "claims no guarantee to test")

_Partial = TypeVar("_Partial")
"""What a window function of `LoadedTrace.map_windows` returns for one window."""
_Result = TypeVar("_Result")


@dataclass(frozen=True)
class WindowRequest:
    """What a check written over windows asks for (LoadedTrace.windows): compute(trace, records, logits,
    *args) on every payload window, its (block, partial) pairs in block and window order."""

    compute: Callable[..., Any]
    args: tuple[object, ...]
    desc: str


OverWindows = Generator[WindowRequest, Iterable[tuple[int, Any]], _Result]
"""A check written over windows: it yields WindowRequests and is sent, for each, the (block, partial)
pairs; it returns its result. LoadedTrace.run_check runs one alone; dpledger.audit.audit runs several
over one pass of the windows (each window read, and its distributions formed, once for all of them)."""


@dataclass
class BlockInfo:
    """One committed chunk of the trace: its block index, first step, length, the payload hash its
    records chain and the chunk file's own sha256."""

    index: int
    first_step: int
    length: int
    payload_sha256: str
    chunk_sha256: str = ""  # of the chunk file when the trace was loaded (a worker re-reads the same bytes)


@dataclass(frozen=True)
class WindowTask:
    """Rows start..stop of one block: whole payload windows, so that a task's windows are the very
    windows `iter_payload` yields."""

    block: int
    start: int
    stop: int


class WindowExecutor(Protocol):
    """Computes `LoadedTrace.map_windows` and the payload's digests elsewhere than in this process
    (dpledger.audit.dask_audit.DaskWindowExecutor)."""

    def file_digests(self, paths: list[Path]) -> list[str]:
        """The sha256 of each file.

        Args:
            paths: the files to hash.

        Returns:
            Each file's sha256 (hex), in the order of `paths`.
        """
        ...

    def map_windows(self, trace: LoadedTrace, compute: Callable[..., _Partial], args: tuple[object, ...],
                    desc: str) -> Iterator[tuple[int, _Partial]]:
        """`compute(trace, records, logits, *args)` for every payload window of `trace`.

        Args:
            trace: the loaded trace whose windows are computed.
            compute: a module-level window function, as `LoadedTrace.map_windows` takes it.
            args: the further arguments passed to `compute` after the window.
            desc: names the check (progress bars and task keys).

        Returns:
            (block, partial) for every window, in block and window order.
        """
        ...


@dataclass
class LoadedTrace:
    """A run loaded for auditing (load_trace): the manifest, ledger.json and final record whole, what
    one pass over the chunks found (hash chain, recomputed totals, structural problems), and access to
    the records and per-step logits block by block and window by window."""

    directory: Path
    manifest: dict
    ledger: dict
    final: dict
    chain_error: str | None
    chain_end: str
    steps: int
    blocks_info: list[BlockInfo]
    totals: RunTotals | None
    totals_error: str | None
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    manifest_sha256: str = ""
    ledger_sha256: str = ""
    _logits_source: str | None = "unknown"
    _ensemble: Ensemble | InContextEnsemble | None = None
    _payload_states: dict[int, str] | None = None
    payload_reasons: dict[int, str] = field(default_factory=dict)
    """Why each block that payload_states calls "unreadable" was not read, naming its file."""
    _model_state: str | None = None
    found_model_hashes: list[str] | None = None
    model_problems: list[str] = field(default_factory=list)
    """Why the models at the recorded paths are not the run's (model_state "different" or
    "malformed"), each naming the model's file."""
    _window_rows: int | None = None
    audit_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Names this load of the trace: a worker keeps what it loaded for it (models, memo) under this id,
    so a later audit of the same directory never reuses state decided for an earlier one."""
    executor: WindowExecutor | None = None
    """Computes `map_windows` elsewhere (dpledger.audit.dask_audit.DaskWindowExecutor); None: in this process."""
    memo: dict = field(default_factory=dict)
    """Per-process memo of what the window functions rebuild (the runner, the re-encoded text, a block's
    model logits): built once per process, not once per window."""
    progress: bool = False
    """Whether `map_windows` in this process shows a progress bar over the windows (on stderr, tqdm)."""
    _distributions: tuple[object, tuple[torch.Tensor, torch.Tensor]] | None = None
    """window_distributions' memo: the last window's logits and their distributions."""
    _ensemble_rows: tuple[object, tuple[torch.Tensor, torch.Tensor]] | None = None
    """window_ensemble's memo: the last window's logits and as_ensemble's rows of its distributions."""
    _leave_one_out: tuple[object, bytes, list] | None = None
    """window_leave_one_out's memo: the last window's logits, the lambdas' bytes and each step's rows."""

    @property
    def orders(self) -> np.ndarray:
        return np.asarray(self.manifest["orders"], dtype=np.float64)

    @property
    def mechanism_type(self) -> str:
        return self.manifest["mechanism"]["type"]

    @property
    def params(self) -> dict:
        return self.manifest["mechanism"]["params"]

    @property
    def components(self) -> dict[str, bool]:
        return self.manifest["mechanism"]["components"]

    @property
    def n_teachers(self) -> int:
        return int(self.manifest["n_teachers"])

    @property
    def consistent(self) -> bool:
        """No structural problem: the records fit the manifest, so the checks below can read them."""
        return not self.problems and self.totals is not None

    def note(self, problem: str) -> None:
        """Record a structural problem of the trace (the first MAX_PROBLEMS are kept, all are counted).

        Args:
            problem: one line naming the file and what is wrong.
        """
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)

    # -- what the per-step distributions can be had from -------------------------------------

    @property
    def has_payload(self) -> bool:
        """True when every block's logits can be had: the exact-replay payload (present, with the
        hashes its records hold), or (teacher-forced runs) the run's models, present with the same
        content hashes, to recompute them."""
        return self.logits_source is not None

    @property
    def logits_source(self) -> str | None:
        if self._logits_source == "unknown":
            self._logits_source = "payload" if self.payload_intact else ("models" if self.models_available else None)
        return self._logits_source

    @property
    def payload_problems(self) -> list[str]:
        """Why the replay payload cannot be used ([] when it can)."""
        if not self.manifest.get("replay_payload"):
            return ["the run kept no exact-replay payload (replay_payload = false)"]
        problems = [self.payload_reasons[index] if state == "unreadable" else
                    f"{self.payload_file(index)[0]}: " + ("missing" if state == "missing" else
                    f"its sha256 differs from the one chained in block {index}'s records (changed after the run)")
                    for index, state in self.payload_states.items() if state != "intact"]
        return problems[:5]

    def payload_shape(self, length: int) -> tuple[int, int, int]:
        """The logits (N+1, L, V) a block of `length` steps must hold.

        Args:
            length: the block's number of steps.

        Returns:
            (N + 1, length, V): the public model and N teachers, per step, over the vocabulary.
        """
        return self.n_teachers + 1, length, int(self.manifest["vocab_size"])

    @property
    def payload_entry(self) -> dict:
        """The run's replay_payload_format (trace.payload_format: the logits where the manifest names none).

        Raises:
            TraceError: if the manifest's entry is malformed.
        """
        return trace.payload_format(self.manifest)

    @property
    def bounded_payload(self) -> bool:
        """Whether the run keeps the bounded vote payload (dpledger.decoding.vote_payload), not the logits."""
        try:
            return bool(self.manifest.get("replay_payload")) and self.payload_entry["format"] == trace.VOTE_FORMAT
        except TraceError:
            return False

    def payload_file(self, index: int) -> tuple[Path, int]:
        """Block `index`'s payload file and the most bytes it may take (its format's bound).

        Args:
            index: the block's index.

        Returns:
            (its path, its size bound in bytes).

        Raises:
            TraceError: if the manifest's replay_payload_format is malformed.
        """
        length = next(info.length for info in self.blocks_info if info.index == index)
        return block_payload_file(self.directory, index, self.payload_entry, length, self.n_teachers,
                                  int(self.manifest["vocab_size"]))

    @property
    def payload_states(self) -> dict[int, str]:
        """Per block: "intact" (its file has the chained sha256), "missing", "changed", or "unreadable"
        (a link, not a regular file, or larger than a float32 block of its shape: the reason is in
        payload_problems; nothing of it is read); each file is hashed once per audit ({} when the
        run kept no payload)."""
        if self._payload_states is None:
            states, bounds = {}, {}
            for info in self.blocks_info if self.manifest.get("replay_payload") else []:
                try:
                    path, bounds[info.index] = self.payload_file(info.index)
                except TraceError as error:  # the manifest names no payload format this code knows
                    states[info.index] = "unreadable"
                    self.payload_reasons[info.index] = str(error)
                    continue
                try:
                    safe_files.regular_size(path, bounds[info.index], root=self.directory, what="its block of logits")
                except FileNotFoundError:
                    states[info.index] = "missing"
                except (safe_files.UnsafeFileError, OSError) as error:
                    states[info.index] = "unreadable"
                    self.payload_reasons[info.index] = _unreadable(path, error)
            present = [index for index in bounds if index not in states]
            paths = [self.payload_file(index)[0] for index in present]
            if self.executor is not None:  # at paper scale the payload is 20 MB a step: hashed on the workers
                digests = dict(zip(present, self.executor.file_digests(paths)))
            else:
                digests = {}
                for index, path in zip(present, paths):
                    try:
                        digests[index] = trace.file_sha256(path, bounds[index], root=self.directory,
                                                           what="its block of logits")
                    except (safe_files.UnsafeFileError, OSError) as error:  # changed since it was checked
                        states[index] = "unreadable"
                        self.payload_reasons[index] = _unreadable(path, error)
            for info in self.blocks_info:
                if info.index in digests:
                    states[info.index] = "intact" if digests[info.index] == info.payload_sha256 else "changed"
            self._payload_states = {index: states[index] for index in sorted(states)}
        return self._payload_states

    @property
    def payload_intact(self) -> bool:
        return not self.payload_problems

    @property
    def models_available(self) -> bool:
        """The run's models exist where the manifest says, with the content hashes it records
        (teacher-forced runs only: free generation needs the payload)."""
        return self.model_state == "available"

    @property
    def model_state(self) -> str:
        """"available"; "absent" (not at the recorded paths); "malformed" (there, but they cannot be
        loaded: a truncated or pickled weights file, a config.json that does not parse, ...);
        "different" (loaded, but their weights, config or tokenizer files, or the run's tokenizer,
        are not the ones the manifest records); or "not-used" (free generation, replayed from the
        payload only). model_problems names the files of the last two."""
        if self._model_state is None:
            self._model_state = self._load_models()
        return self._model_state

    def _load_models(self) -> str:
        if self.manifest["data"]["stream"] != "teacher-forced":
            return "not-used"
        models = self.manifest["models"]
        settings = self.manifest["config"].get("models")
        icl = isinstance(settings, dict) and settings.get("teacher_kind") == "icl"  # teachers are prompts, not files
        examples = settings.get("icl_examples") if icl else None
        if not models or not all(isinstance(m, dict) and Path(str(m.get("source"))).exists()
                                 for m in (models[:1] if icl else models)) or (examples and not Path(examples).exists()):
            return "absent"

        ensemble: Ensemble | InContextEnsemble
        try:
            if icl:  # the prompts again: from the regenerated embedded corpus, or the examples file re-read

                ensemble = load_icl_ensemble(
                    models[0]["source"], str(self.manifest.get("tokenizer")), settings.get("teachers"),
                    settings.get("icl_prompt_tokens"), examples_path=settings.get("icl_examples"),
                    corpus=generate_corpus(teachers=settings["teachers"]) if settings.get("embedded") else None)
            else:
                ensemble = Ensemble.from_pretrained(models[0]["source"], [m["source"] for m in models[1:]],
                                                    self.manifest["config"]["models"]["teacher_kind"])
        except (OSError, ValueError) as error:  # the loaders name the file at fault
            self.model_problems = [" ".join(str(error).split())]
            return "malformed"
        self.found_model_hashes = [i.content_hash for i in ensemble.identities]
        self.model_problems = [f"{entry.get('role')}: {problem}" for entry, found in zip(models, ensemble.identities)
                               for problem in identity_problems(entry, found)]
        recorded_tokenizer = self.manifest.get("tokenizer_files")
        if isinstance(recorded_tokenizer, dict):  # older traces record the tokenizer by path only
            tokenizer = str(self.manifest.get("tokenizer"))
            self.model_problems += [f"tokenizer: {problem}" for problem in
                                    file_problems(recorded_tokenizer, tokenizer_files(tokenizer), tokenizer)]
        if self.model_problems:
            return "different"
        self._ensemble = ensemble
        return "available"

    def model_unavailability(self) -> str:
        """Why the run's models cannot serve the audit (model_state other than "available").

        Returns:
            One line: free generation, models that differ or cannot be loaded (the first problem),
            or the first model missing from its recorded path.
        """
        if self.model_state == "not-used":
            return "free generation is replayed from the payload only"
        if self.model_state == "different":
            return f"the models at the recorded paths are not the run's ({self.model_problems[0]})"
        if self.model_state == "malformed":
            return f"the models at the recorded paths cannot be loaded ({self.model_problems[0]})"
        missing = [str(m.get("source")) for m in self.manifest["models"]
                   if not isinstance(m, dict) or not Path(str(m.get("source"))).exists()]
        if missing:
            return f"the run's models are not at the recorded paths (first missing: {missing[0]})"
        return "the run's models cannot be loaded from the recorded paths"

    # -- streaming ----------------------------------------------------------------------------

    def blocks(self) -> list[int]:
        """The committed blocks' indices.

        Returns:
            The block indices, in the order load_trace read them.
        """
        return [info.index for info in self.blocks_info]

    def iter_blocks(self) -> Iterator[tuple[int, list[dict]]]:
        """(block index, its records), one chunk at a time.

        Yields:
            (block index, its per-step records as dicts), for every committed chunk in order.
        """
        for index in trace.committed_chunk_indices(self.directory):
            yield index, trace.read_chunk(self.directory, index)

    def iter_records(self) -> Iterator[dict]:
        """Every per-step record, block by block.

        Yields:
            The records in step order, one chunk read at a time.
        """
        for _, records in self.iter_blocks():
            yield from records

    def runner(self) -> Runner:
        """The run's mechanism rebuilt from the manifest (type, parameters, teachers, relation).

        Returns:
            The Runner decode used (dpledger.decoding.runners.build_runner).
        """
        return build_runner({"type": self.mechanism_type, **self.params}, self.n_teachers, self.manifest["relation"],
                            self.manifest.get("records_version", 1))

    @property
    def data_dependent_filter(self) -> bool:
        """The run's privacy filter was driven by data-dependent losses (dpledger.decoding.budget)."""
        return bool((self.manifest.get("budget") or {}).get("data_dependent"))

    def budget_gate(self) -> BudgetGate | None:
        """The run's privacy filter rebuilt from its config (dpledger.decoding.budget), state zero; None
        without a [budget].

        Returns:
            The BudgetGate planned as the run planned it, or None.

        Raises:
            ValueError: if the run has a [budget] but its mechanism has no data-independent step bound.
        """
        budget = self.manifest["config"].get("budget")
        if budget is None:
            return None

        runner = self.runner()
        if runner.step_bound is None:
            raise ValueError(f"a run of {self.mechanism_type} has a [budget] but the mechanism has no step bound")
        return BudgetGate.plan(budget, runner.step_bound(self.orders), self.orders, runner.realised_path_bounds)

    def window_rows(self) -> int:
        """Steps per payload window: decided once, by the process that loaded the trace (workers get it).

        Returns:
            The window length in steps (>= 1), so that a window's float64 work stays within
            PAYLOAD_WINDOW_BYTES.
        """
        if self._window_rows is None:
            # a few float64 copies of a step's (N+1) x V distributions and of the kernels' (orders x V) work
            models = 1 if self.bounded_payload else self.n_teachers + 1   # the bounded payload: the public row
            per_step = (models + len(self.manifest["orders"])) * int(self.manifest["vocab_size"]) * 8 * 4
            self._window_rows = max(1, PAYLOAD_WINDOW_BYTES // max(per_step, 1))
        return self._window_rows

    def _model_logits(self, records: list[dict]) -> torch.Tensor:
        contexts = torch.tensor([[r["context_token"] for r in records]])
        if self._ensemble is None:
            raise RuntimeError("logits_source 'models' loaded the ensemble")
        return self._ensemble.logits(contexts)[:, 0]

    def iter_payload(self, window: int | None = None) -> Iterator[tuple[int, list[dict], WindowData]]:
        """(block, records of a window of consecutive steps, their logits (N+1, W, V)), block by
        block and within a block window by window (at most `window` steps, default window_rows()).
        A run with the bounded vote payload read from it gives the window's VotePayload instead of logits.

        Args:
            window: steps per window; None or 0: window_rows().

        Yields:
            (block, the window's records, their logits (N+1, W, V)) in block and row order.
        """
        window = window or self.window_rows()
        for block, records in self.iter_blocks():
            yield from self._block_windows(block, records, window, 0, len(records))

    def _block_windows(self, block: int, records: list[dict], window: int, first: int,
                       last: int) -> Iterator[tuple[int, list[dict], WindowData]]:
        """The windows of rows first..last of one block (`first` on a window boundary)."""
        window_of: Callable[[int, int], WindowData]
        if self.logits_source == "models":  # a forward pass needs the block's whole context
            logits = self._model_logits(records)
            window_of = lambda start, stop: logits[:, start:stop]  # noqa: E731
        elif self.bounded_payload:  # read whole (a few MB a block), windows are views of it
            votes = read_vote_payload(self.directory, block, len(records), self.n_teachers,
                                      int(self.manifest["vocab_size"]), self.payload_entry["top_k"])
            window_of = lambda start, stop: votes.rows(start, stop)  # noqa: E731
        else:
            payload = trace.ReplayPayload(self.directory, block, self.payload_shape(len(records)))
            window_of = lambda start, stop: torch.from_numpy(payload.rows(start, stop))  # noqa: E731
        for start in range(first, last, window):
            stop = min(start + window, last)
            yield block, records[start:stop], window_of(start, stop)

    def window_tasks(self, windows_per_task: int) -> list[WindowTask]:
        """The payload's windows grouped into tasks of at most `windows_per_task` consecutive windows
        of one block, in block and row order.

        Args:
            windows_per_task: how many consecutive windows of a block make one task (>= 1).

        Returns:
            The WindowTasks covering every block's rows, in block and row order.
        """
        span = self.window_rows() * windows_per_task
        return [WindowTask(info.index, start, min(start + span, info.length))
                for info in self.blocks_info for start in range(0, info.length, span)]

    def task_windows(self, task: WindowTask) -> Iterator[tuple[list[dict], WindowData]]:
        """(records, logits) of each window of `task`. The block's chunk is read again here (on a worker,
        from the shared run directory): its bytes must still be the ones read when the trace was loaded
        (sha256), or TraceError.

        Args:
            task: rows start..stop of one block, on window boundaries.

        Yields:
            (the window's records, their logits (N+1, W, V)) for each window of the task, in row order.
        """
        info = next(i for i in self.blocks_info if i.index == task.block)
        records = trace.read_chunk(self.directory, task.block, expected_sha256=info.chunk_sha256)
        for _, window_records, logits in self._block_windows(task.block, records, self.window_rows(), task.start,
                                                             task.stop):
            yield window_records, logits

    def map_windows(self, compute: Callable[..., _Partial], *args: object,
                    desc: str = "") -> Iterator[tuple[int, _Partial]]:
        """(block, compute(self, records, logits, *args)) for every payload window, in block and window
        order; on the executor's workers when there is one. `compute` must be a module-level function
        whose result depends on its arguments only (per-window seeds, no state carried between
        windows), so that where it runs cannot change the result.

        Args:
            compute: the window function, called as compute(self, records, logits, *args).
            *args: further arguments for `compute` (picklable, for the executor).
            desc: names the check (progress bars and task keys on the executor).

        Yields:
            (block, partial) for every window.
        """
        if self.executor is not None:
            yield from self.executor.map_windows(self, compute, args, desc)
            return
        window = self.window_rows()
        windows = sum(-(-info.length // window) for info in self.blocks_info)
        with tqdm(total=windows, desc=f"  {desc or 'windows'}", unit="window", leave=False,
                  disable=None if self.progress else True) as bar:  # None: only on a terminal
            for block, records, logits in self.iter_payload(window):
                yield block, compute(self, records, logits, *args)
                bar.update(1)

    @staticmethod
    def windows(compute: Callable[..., _Partial], *args: object,
                desc: str = "") -> Generator[WindowRequest, Iterable[tuple[int, _Partial]], Iterable[tuple[int, _Partial]]]:
        """In a check written over windows (OverWindows): `pairs = yield from trace.windows(compute, *args)`
        gives (block, compute(trace, records, logits, *args)) for every payload window, as map_windows does.

        Args:
            compute: the window function, as map_windows takes it.
            *args: further arguments for `compute`.
            desc: names the check (progress bars and task keys).

        Returns:
            The (block, partial) pairs, in block and window order.
        """
        pairs = yield WindowRequest(compute, args, desc)
        return pairs

    def run_check(self, check: OverWindows[_Result]) -> _Result:
        """A check written over windows, run alone: each request is answered by map_windows (lazily, as
        the check reads it); an error of a window reaches the check where it reads it.

        Args:
            check: the check generator, not yet started.

        Returns:
            What the check returns.
        """
        try:
            request = next(check)
            while True:
                request = check.send(self.map_windows(request.compute, *request.args, desc=request.desc))
        except StopIteration as finished:
            return finished.value

    def window_distributions(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Ensemble.split_distributions(logits), formed once per window: the checks computed over one pass
        of the windows are each given the same logits object, and read the same distributions (which no
        check may change in place).

        Args:
            logits: a window's (N+1, W, V) logits.

        Returns:
            (public (W, V), teachers (W, N, V)) float64 probabilities.
        """
        if self._distributions is None or self._distributions[0] is not logits:
            self._distributions = (logits, Ensemble.split_distributions(logits))
        return self._distributions[1]

    def window_ensemble(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """as_ensemble's rows of window_distributions (each row renormalised, as the decode loop's step
        does), formed once per window.

        Args:
            logits: a window's (N+1, W, V) logits.

        Returns:
            (teachers (W, N, V), public (W, V)) float64, in as_ensemble's order.
        """
        if self._ensemble_rows is None or self._ensemble_rows[0] is not logits:
            public, teachers = self.window_distributions(logits)
            self._ensemble_rows = (logits, as_ensemble(teachers, public, self.n_teachers))
        return self._ensemble_rows[1]

    def window_leave_one_out(self, logits: torch.Tensor, lambdas: torch.Tensor) -> list:
        """Each step's leave-one-out rows p_-i / p (dpledger.mechanisms.leave_one_out.prepared_leave_one_out)
        from the decode loop's own inputs (window_ensemble: as_ensemble's renormalised rows) and `lambdas`,
        formed once per window: Eq. 3's check and the neighbour ablation read the same rows (each formed
        them apart: ~55 ms a paper-scale step). Held until the next window's, like the distributions (at
        most 2 N V float64 per step, within PAYLOAD_WINDOW_BYTES' per-step share).

        Args:
            logits: a window's (N+1, W, V) logits.
            lambdas: the window's mixing weights, (W, N).

        Returns:
            One entry per step of the window (read-only by convention, like the distributions).
        """
        key = lambdas.detach().double().contiguous().numpy().tobytes()
        if self._leave_one_out is None or self._leave_one_out[0] is not logits or self._leave_one_out[1] != key:
            self._leave_one_out = None   # the last window's rows go before this window's are formed
            self._leave_one_out = (logits, key, prepared_leave_one_out(*self.window_ensemble(logits), lambdas))
        return self._leave_one_out[2]

    def for_workers(self) -> "LoadedTrace":
        """A copy to send to workers: what the window functions read, without the recomputed totals,
        the loaded models (a worker loads its own, once) or the executor.

        Returns:
            A copy with the directory resolved and the window length and logits source decided here.
        """
        return replace(self, directory=self.directory.resolve(), totals=None, _ensemble=None, executor=None, memo={},
                       progress=False, problems=[], _window_rows=self.window_rows(), _logits_source=self.logits_source,
                       _distributions=None, _ensemble_rows=None, _leave_one_out=None)

    def prepare_worker(self) -> None:
        """On a worker, once: load the run's models where the driver found them (their content
        hashes are checked again here); ClusterError when this worker cannot (its environment, not
        the trace: never a verdict).

        Raises:
            ClusterError: if the models the driver found cannot be loaded on this worker.
        """
        if self._model_state == "available" and self._ensemble is None:
            self._model_state = None
            if self.model_state != "available":
                raise ClusterError(f"a worker cannot load the run's models: {self.model_unavailability()} (every "
                                   "worker must see the driver's files at the same paths)")

    def payload_logits(self, block: int) -> torch.Tensor:
        """One block's whole logits (N+1, L, V).

        Args:
            block: the block's index.

        Returns:
            Its windows' logits concatenated along the steps (every block is read to find it).

        Raises:
            ValueError: if the run keeps the bounded vote payload, which holds no teacher logits.
        """
        parts = [logits for b, _, logits in self.iter_payload() if b == block]
        require(all(isinstance(part, torch.Tensor) for part in parts),
                "a run with the bounded vote payload keeps no logits (run.replay_payload_format = \"bounded\")")
        return torch.cat([part for part in parts if isinstance(part, torch.Tensor)], dim=1)


def _unreadable(path: Path, error: safe_files.UnsafeFileError | OSError) -> str:
    """Why a file is not read, in one line naming it (an UnsafeFileError names it already)."""
    return str(error) if isinstance(error, ValueError) else f"{path}: cannot be read ({error.strerror or error})"


def _check_records(loaded: LoadedTrace, block: int, records: list[dict], first_step: int, block_size: int) -> None:
    """Each record's structure against the manifest: fields, step/block/position numbering, array
    lengths, value ranges, answered_by following the screen decision, the context chain, and one
    payload hash per block."""
    manifest = loaded.manifest
    expected = trace.record_fields(manifest)
    n, vocab, k = loaded.n_teachers, int(manifest["vocab_size"]), len(manifest["orders"])
    mixes = loaded.mechanism_type in ("pmixed", "adapmixed")
    teacher_forced = manifest["data"]["stream"] == "teacher-forced"
    payload = {r.get("payload_sha256") for r in records}
    if len(payload) != 1:
        loaded.note(f"block {block}: its records name {len(payload)} different payload hashes")
    elif bool(manifest.get("replay_payload")) != bool(next(iter(payload))):
        loaded.note(f"block {block}: payload hash {'missing' if manifest.get('replay_payload') else 'present'} although "
                    f"the manifest says replay_payload = {manifest.get('replay_payload')}")
    for row, record in enumerate(records):
        where = f"{trace.chunk_path(loaded.directory, block).name} row {row}"
        keys = set(record)
        if keys != expected:
            loaded.note(f"{where}: fields differ from the manifest's mechanism (missing {sorted(expected - keys)}, "
                        f"unexpected {sorted(keys - expected)})")
            continue
        step = first_step + row
        if (record["step"], record["block"], record["position"], record["query_id"]) != (step, block, row,
                                                                                          f"b{block}-p{row}"):
            loaded.note(f"{where}: numbered step {record['step']!r} block {record['block']!r} position "
                        f"{record['position']!r}, expected step {step} block {block} position {row}")
        if row >= block_size:
            loaded.note(f"{where}: block {block} holds more than the block size {block_size}")
        for name in ("context_token", "output_token"):
            if not (isinstance(record[name], int) and 0 <= record[name] < vocab):
                loaded.note(f"{where}: {name} {record[name]!r} outside the vocabulary [0, {vocab})")
        true = record["true_token"]
        if teacher_forced and not (isinstance(true, int) and 0 <= true < vocab):
            loaded.note(f"{where}: true_token {true!r} outside the vocabulary [0, {vocab})")
        if not teacher_forced and true != -1:
            loaded.note(f"{where}: free generation has no true token, got {true!r}")
        if teacher_forced and row > 0 and record["context_token"] != records[row - 1]["true_token"]:
            loaded.note(f"{where}: context token {record['context_token']} is not the previous step's true token")
        passed = record["screen_passed"]
        if not isinstance(passed, bool) or record["answered_by"] != ("mechanism" if passed else "public"):
            loaded.note(f"{where}: answered_by {record['answered_by']!r} does not follow screen_passed {passed!r}")
        voting = loaded.mechanism_type == "voting"
        refused = record.get("budget_refused") is True  # the filter answered publicly (dpledger.decoding.budget)
        if "budget_refused" in record and not (isinstance(record["budget_refused"], bool)
                                               and isinstance(record["budget_charge"], float)
                                               and record["budget_charge"] >= 0 and (not refused or not passed)):
            loaded.note(f"{where}: budget_refused {record['budget_refused']!r} / budget_charge "
                        f"{record['budget_charge']!r} are not a refusal flag and a charge >= 0 (a refused step is "
                        "answered publicly)")
        if "screen" not in manifest["mechanism"]["components"] and passed is not True and not voting and not refused:
            loaded.note(f"{where}: a run without screening records a failed screen")
        if voting:
            _check_votes(loaded, where, record, n, vocab)
        lambdas = record["lambdas"]
        if len(lambdas) != (n if mixes else 0):
            loaded.note(f"{where}: {len(lambdas)} mixing weights, expected {n if mixes else 0}")
        elif lambdas and not all(0.0 <= v <= 1.0 for v in lambdas):
            loaded.note(f"{where}: mixing weights outside [0, 1] (or NaN)")
        sampled = record["sampled_teachers"]
        if sampled and (sampled != sorted(set(sampled)) or sampled[0] < 0 or sampled[-1] >= n
                        or loaded.params.get("sample_rate") is None):
            loaded.note(f"{where}: sampled_teachers {sampled[:5]}... are not distinct teacher indices of a subsampled run")
        for name in ("observed_data_dependent", "data_independent", "eq3_remove_one"):
            if name in record and len(record[name]) not in ((k,) if mixes else (0,)):
                loaded.note(f"{where}: {name} has {len(record[name])} values, expected {k if mixes else 0}")
        if len(record.get("add_one_bound", [])) not in (0, k):
            loaded.note(f"{where}: add_one_bound has {len(record['add_one_bound'])} values, expected 0 or {k}")
        for name in manifest["mechanism"]["components"]:
            if len(record[f"rdp_{name}"]) != k:
                loaded.note(f"{where}: rdp_{name} has {len(record[f'rdp_{name}'])} values, the grid has {k} orders")


def _check_votes(loaded: LoadedTrace, where: str, record: dict, teachers: int, vocab: int) -> None:
    """A voting record's histogram: distinct increasing token ids in the vocabulary, positive
    integer counts summing to the N teachers, a seed that is a non-negative integer."""
    tokens, counts = record["vote_tokens"], record["vote_counts"]
    if not (isinstance(tokens, list) and isinstance(counts, list) and len(tokens) == len(counts)):
        loaded.note(f"{where}: vote_tokens and vote_counts must be lists of one length")
    elif not all(isinstance(t, int) and 0 <= t < vocab for t in tokens) or tokens != sorted(set(tokens)):
        loaded.note(f"{where}: vote_tokens must be distinct increasing token ids in [0, {vocab})")
    elif not all(isinstance(c, int) and c >= 1 for c in counts) or sum(counts) != teachers:
        loaded.note(f"{where}: vote_counts must be positive integers summing to the {teachers} teachers, got "
                    f"{sum(c for c in counts if isinstance(c, int))}")
    if not (isinstance(record["vote_seed"], int) and record["vote_seed"] >= 0):
        loaded.note(f"{where}: vote_seed must be a non-negative integer, got {record['vote_seed']!r}")


def load_trace(run_dir: str | Path) -> LoadedTrace:
    """TraceError (naming the file) for a directory that is not a finished run; a broken hash
    chain or records that do not fit the manifest are not raised here but recorded, so the audit
    reports them as failed checks.

    Args:
        run_dir: the run's directory.

    Returns:
        The LoadedTrace, with its chain error, structural problems and recomputed totals (None where
        the records do not fit the manifest).

    Raises:
        TraceError: if the directory is not a finished run (a file missing, unreadable or malformed,
            a manifest field of the wrong type, no valid block size, malformed components, no
            committed records); the message names the file.
    """
    run_dir = Path(run_dir)
    manifest = trace.read_manifest(run_dir)
    for key, kind in (("mechanism", dict), ("orders", list), ("n_teachers", int), ("vocab_size", int),
                      ("config", dict), ("relation", str), ("models", list), ("data", dict), ("queries", int)):
        if not isinstance(manifest.get(key), kind):
            raise TraceError(f"{run_dir / trace.MANIFEST}: field {key!r} must be a {kind.__name__}, got "
                             f"{manifest.get(key)!r}")
    mechanism = manifest["mechanism"]
    if not (isinstance(mechanism.get("type"), str) and isinstance(mechanism.get("params"), dict)
            and isinstance(mechanism.get("components"), dict)):
        raise TraceError(f"{run_dir / trace.MANIFEST}: mechanism must hold a type, params and components")
    ledger = trace.read_ledger(run_dir)
    final = trace.read_final(run_dir)
    loaded = LoadedTrace(run_dir, manifest, ledger, final, None, "", 0, [], None, None,
                         manifest_sha256=trace.file_sha256(run_dir / trace.MANIFEST, trace.MAX_JSON_BYTES),
                         ledger_sha256=trace.file_sha256(run_dir / trace.LEDGER, trace.MAX_JSON_BYTES))
    config = manifest["config"]
    stream = manifest["data"].get("stream")
    data = config.get("data", {}) if isinstance(config.get("data"), dict) else {}
    block_size = data.get("block_size") if stream == "teacher-forced" else data.get("max_new_tokens")
    if not (isinstance(block_size, int) and block_size >= 1):
        raise TraceError(f"{run_dir / trace.MANIFEST}: config.data has no valid block size for stream {stream!r}")
    try:
        totals = RunTotals(manifest)
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise TraceError(f"{run_dir / trace.MANIFEST}: its mechanism's components or their relations are malformed "
                         f"({error})") from None
    reader = trace.ChainReader(run_dir, manifest, verify=False)
    for block, records in reader:
        if not records:
            loaded.note(f"{trace.chunk_path(run_dir, block).name}: holds no records")
            continue
        first_step = reader.steps - len(records)
        loaded.blocks_info.append(BlockInfo(block, first_step, len(records), str(records[0].get("payload_sha256")),
                                            reader.chunk_sha256[block]))
        before = loaded.problem_count
        try:
            _check_records(loaded, block, records, first_step, block_size)
        except (TypeError, KeyError, AttributeError) as error:  # a value of the wrong type
            loaded.note(f"{trace.chunk_path(run_dir, block).name}: a record holds a value of the wrong type ({error})")
        if loaded.problem_count == before and loaded.totals_error is None:
            try:
                totals.add(records)
            except (ValueError, TypeError, KeyError) as error:
                loaded.totals_error = f"block {block}: {error}"
    if reader.steps == 0:
        raise TraceError(f"{run_dir / trace.STEPS_DIR}: no committed step records")
    loaded.chain_error, loaded.chain_end, loaded.steps = reader.error, reader.head, reader.steps
    loaded.totals = totals if loaded.totals_error is None and not loaded.problems else None
    return loaded
