"""Micro models for tests: built once per session in a temporary cache (a few seconds on CPU)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dpledger.decoding.recipe import TinyModelRecipe

MICRO_RECIPE = TinyModelRecipe(vocab_size=320, n_layer=1, n_embd=32, n_head=2, n_positions=64, public_steps=40,
                               public_batch=8, warmup_steps=5, teacher_steps=6, teacher_batch=8)
MICRO_CORPUS = dict(public_paragraphs=400, dialogues_per_shard=25, heldout_dialogues=120, canaries=1,
                    canary_repetitions=3)

# The mechanisms the tests decode and audit, defined once here and imported everywhere.
ADAPMIXED = {"type": "adapmixed", "alpha": 18.0, "beta": 0.002, "lam": 0.05, "sigma": 0.01, "threshold": 5.0, "top_k": 20}
"""AdaPMixED at micro scale: a screen that passes on the micro models, so every charge kind appears."""
PMIXED = {"type": "pmixed", "alpha": 6.0, "beta": 0.05}
PAPER_ADAPMIXED = {"type": "adapmixed", "alpha": 18.0, "beta": 0.2, "lam": 1e-4, "sigma": 1e-2, "threshold": 4.5,
                   "top_k": 60}
"""AdaPMixED with the paper's parameters (Flemings et al., the ones `dpledger demo` runs)."""


@dataclass(frozen=True)
class MicroModels:
    public: Path
    teachers: tuple[Path, ...]
    tokenizer: Path
    heldout_text: Path
    root: Path
    canaries: tuple[dict, ...]


def build_micro_models(root: Path, teachers: int = 3) -> MicroModels:
    from dpledger.decoding.embedded import build_or_load

    embedded = build_or_load(teachers=teachers, recipe=MICRO_RECIPE, verbose=False, **MICRO_CORPUS)
    text = root / "heldout.txt"
    text.write_text(embedded.corpus.private_heldout)
    canaries = tuple({"teacher": c.shard, "text": c.text, "secret": c.secret} for c in embedded.corpus.canaries)
    return MicroModels(embedded.public_path, tuple(embedded.teacher_paths), embedded.tokenizer_path, text, root,
                       canaries)


def make_run(models: MicroModels, out: Path, mechanism: dict, fault=None, queries: int = 64) -> Path:
    """A finished run of `mechanism` on the micro models, with their canaries recorded (optionally
    with a planted runner fault, dpledger.audit.selfcheck); returns its directory."""
    from dpledger.audit.selfcheck import faulty_runner
    from dpledger.decoding.config import config_from_dict
    from dpledger.decoding.blocks import prepare
    from dpledger.decoding.run import run_decode

    config = config_from_dict(micro_config(models, out, mechanism, queries=queries))
    prepared = prepare(config, verbose=False)
    prepared.canaries = list(models.canaries)
    if fault is not None:
        prepared.runner = faulty_runner(prepared.runner, fault)
    return run_decode(config, progress=False, verbose=False, prepared=prepared).directory


def micro_config(models: MicroModels, out: Path, mechanism: dict, queries: int = 96, block_size: int = 32,
                 **run) -> dict:
    return {
        "run": {"out": str(out), "queries": queries, "seed": 7, **run},
        "mechanism": mechanism,
        "models": {"embedded": False, "public": str(models.public), "teacher_paths": [str(t) for t in models.teachers],
                   "teachers": len(models.teachers), "tokenizer": str(models.tokenizer)},
        "data": {"stream": "teacher-forced", "text": str(models.heldout_text), "block_size": block_size},
    }


def write_toml(path: Path, config: dict) -> Path:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = []
    for table, entries in config.items():
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {value(v)}" for key, v in entries.items())
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def forked_decode(config: Path, log: Path) -> int:
    """Start `dpledger decode config --no-progress` in a forked copy of this process, its stdout and
    stderr written to `log`; returns the child's pid (reap it with os.waitpid).

    A fork, not a fresh interpreter: the same command-line code in another process (its own pid and
    locks, killable at any point) without 10 s of torch and transformers imports. Fresh `dpledger`
    processes are killed and raced in tests/adversarial (make test-slow). The decode must stay
    single-threaded for this (torch's and numba's OpenMP pools do not survive a fork)."""
    import contextlib
    import os

    from dpledger.cli import main

    child = os.fork()
    if child == 0:  # the child decodes, then leaves without ever returning into the test runner
        code = 1
        try:
            with open(log, "w") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                status = main(["decode", str(config), "--no-progress"])
                code = status if isinstance(status, int) else 1
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return child


def _tail(log: Path) -> str:
    return log.read_text()[-2000:] if log.exists() else ""


def wait_for_chunk(child: int, run: Path, chunk: int, log: Path) -> None:
    """Wait until chunk `chunk` of `run` is committed by the forked decode `child` (forked_decode),
    failing with its output if it ends first or takes over 120 s."""
    import os
    import time

    from dpledger.decoding import trace

    deadline = time.time() + 120
    while not trace.chunk_path(run, chunk).exists():
        ended, status = os.waitpid(child, os.WNOHANG)
        assert ended == 0, f"the decode ended (exit {os.waitstatus_to_exitcode(status)}) before chunk {chunk}: " \
                           + _tail(log)
        assert time.time() < deadline, f"the run never committed chunk {chunk}: " + _tail(log)
        time.sleep(0.01)


def reap(child: int, seconds: float = 300) -> int:
    """The exit code of the forked `child`, waiting at most `seconds` (then SIGKILL: -9)."""
    import os
    import signal
    import time

    deadline = time.time() + seconds
    while time.time() < deadline:
        ended, status = os.waitpid(child, os.WNOHANG)
        if ended:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    kill(child)
    return -signal.SIGKILL


def kill(child: int) -> None:
    """SIGKILL the forked `child` and reap it; nothing if it was reaped already (its pid may be another
    process's by now, so it is never signalled)."""
    import os
    import signal

    try:
        ended, _ = os.waitpid(child, os.WNOHANG)
    except ChildProcessError:
        return
    if ended == 0:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def cli_in_process(argv: list[str]):
    """`dpledger argv` run here, as a CompletedProcess (exit status, stdout, stderr)."""
    import contextlib
    import io
    import subprocess

    from dpledger.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    return subprocess.CompletedProcess(["dpledger", *argv], code, stdout.getvalue(), stderr.getvalue())


def kill_and_resume(reference_cfg: dict, tmp_path: Path, chunk: int = 3, fresh_resume: bool = False):
    """Decode `reference_cfg` into tmp_path/killed in a forked process (forked_decode), SIGKILL it
    once chunk `chunk` is committed (at an arbitrary point of the decode, a chunk half written
    included), then resume it through the command line: here, or with `fresh_resume` in a fresh
    interpreter (kernels loaded from numba's disk cache, another hash seed: what a user's resume
    is); returns (the resumed CompletedProcess, the killed run's directory, the records committed
    before the resume)."""
    import os
    import subprocess
    import sys

    from dpledger.decoding import trace

    killed = tmp_path / "killed"
    config = write_toml(tmp_path / "killed.toml", {**reference_cfg, "run": {**reference_cfg["run"], "out": str(killed)}})
    child = forked_decode(config, tmp_path / "killed.log")
    try:
        wait_for_chunk(child, killed, chunk, tmp_path / "killed.log")
    finally:
        kill(child)
    assert not (killed / trace.LEDGER).exists(), "the run finished before it could be killed"
    committed = len(trace.read_records(killed))
    argv = ["decode", str(config), "--no-progress", "--resume"]
    if not fresh_resume:
        return cli_in_process(argv), killed, committed
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "dpledger", *argv], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600), killed, committed
