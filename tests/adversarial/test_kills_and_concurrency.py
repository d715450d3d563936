"""Real processes at the worst moments: second writers (a resume, a fresh decode, an audit) while a
run is being written are refused in one line and change nothing; a decode SIGKILLed at any moment
(before anything exists, while its directory is created, right after the manifest, at the first
chunk, after k chunks, between ledger.json and final.json), and sometimes its resume killed too,
resumes to the very ledger of an uninterrupted run and leaves nothing behind; directories left by a
process killed while creating its run directory do not block the next decode (unless a live process
holds them); two fresh decodes racing for one --out give one run and one one-line refusal."""
from __future__ import annotations

import fcntl
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpledger.decoding import trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode
from tests.adversarial.verdicts import assert_clean, run_cli
from tests.forging import read_json
from tests.micro import ADAPMIXED, PMIXED, micro_config, write_toml

pytestmark = pytest.mark.adversarial
REPO = Path(__file__).resolve().parents[2]
SEED = 20240601
KILL_QUERIES, KILL_BLOCK = 400, 10


def env() -> dict:
    """The environment of the subprocesses (tests/test_run_integrity.py's pattern, read when called)."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    environment.pop("DPLEDGER_DEBUG", None)
    return environment


def spawn(cwd: Path, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dpledger", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=cwd, env=env(), start_new_session=True)


def finish(process: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise AssertionError(f"{' '.join(map(str, process.args))} still running after {timeout} s") from None
    return subprocess.CompletedProcess(process.args, process.returncode, out.decode(errors="replace"),
                                       err.decode(errors="replace"))


def wait_for(predicate, timeout: float, process: subprocess.Popen | None = None, step: float = 0.005) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        if process is not None and process.poll() is not None:
            return predicate()
        time.sleep(step)
    return False


def chunks_of(run: Path) -> int:
    return len(list((run / "steps").glob("chunk-*.parquet"))) if (run / "steps").is_dir() else 0


def state_of(run: Path) -> str:
    if not run.exists():
        staging = list(run.parent.glob(f".{run.name}.creating-*"))
        return "nothing yet" + (f" ({len(staging)} creation directory)" if staging else "")
    return f"{chunks_of(run)} chunks" + (", final written" if (run / trace.FINAL).exists() else "")


# -- second writers --------------------------------------------------------------------------------

@pytest.mark.slow
def test_second_writers_are_refused_in_one_line_while_a_run_is_written(micro_models, tmp_path, capfd):
    config = write_toml(tmp_path / "long.toml", micro_config(micro_models, tmp_path / "unused", ADAPMIXED, queries=1500,
                                                             block_size=10, replay_payload=False))
    run = tmp_path / "long-run"
    first = spawn(tmp_path, "decode", config, "--out", run, "--no-progress")
    try:
        assert wait_for(lambda: (run / trace.MANIFEST).exists(), 120, first), finish(first).stderr[-2000:]
        os.kill(first.pid, signal.SIGSTOP)  # the writer holds its lock for as long as the second writers take
        try:
            second_writers = {
                "a resume": (["decode", config, "--out", run, "--resume", "--no-progress"],
                             "being written by another dpledger process"),
                "a fresh decode": (["decode", config, "--out", run, "--no-progress"], "already holds files"),
                "an audit": (["audit", run, "--no-game"], "being written"),
            }
            for what, (argv, phrase) in second_writers.items():
                answer = run_cli(capfd, *argv, seconds=120)
                assert_clean(answer, (2,), f"{what} while the run is written: ")
                assert phrase in answer.lines[0], f"{what}: {answer}"
            assert first.poll() is None, "the first run was not running while the second writers tried"
        finally:
            os.kill(first.pid, signal.SIGCONT)
        done = finish(first, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate()
    audit = run_cli(capfd, "audit", run, "--no-game", "--mc-samples", "5", seconds=900)
    assert_clean(audit, (0,), "the first run's audit: ")


# -- SIGKILL at any moment, then --resume ----------------------------------------------------------

def _moments() -> list:
    """(name, condition on the run directory or None for at once), as the adversarial harness drew them."""
    blocks = math.ceil(KILL_QUERIES / KILL_BLOCK)
    moments = [("immediately", None),
               ("the staging directory appears",
                lambda run: any(run.parent.glob(f".{run.name}.creating-*")) or run.exists()),
               ("the manifest appears", lambda run: (run / trace.MANIFEST).exists()),
               ("the first chunk appears", lambda run: chunks_of(run) >= 1),
               ("ledger.json is written, final.json not yet", lambda run: (run / trace.LEDGER).exists())]
    rng = random.Random(SEED + 1)
    while len(moments) < 14:
        k = rng.randrange(2, blocks)
        moments.append((f"after {k} chunks", lambda run, k=k: chunks_of(run) >= k))
    return moments


MOMENTS = _moments()


@pytest.fixture(scope="module")
def kill_config(micro_models, tmp_path_factory) -> tuple[Path, bytes]:
    """The config every kill decodes and the ledger.json of its uninterrupted run."""
    root = tmp_path_factory.mktemp("kills")
    config = micro_config(micro_models, root / "reference", PMIXED, queries=KILL_QUERIES, block_size=KILL_BLOCK,
                          replay_payload=False)
    path = write_toml(root / "kill.toml", config)
    result = run_decode(config_from_dict(config), progress=False, verbose=False)
    return path, (result.directory / trace.LEDGER).read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(MOMENTS)), ids=[f"{i:02d}-{m[0]}" for i, m in enumerate(MOMENTS)])
def test_a_decode_killed_at_any_moment_resumes_to_the_uninterrupted_ledger(kill_config, tmp_path, capfd, index):
    """Every third case kills the resume too, once it has committed another chunk; the last one also
    audits the resumed run (it replays every step from the models: PASS)."""
    config, reference_ledger = kill_config
    moment, condition = MOMENTS[index]
    run = tmp_path / f"killed-{index:02d}"
    process = spawn(tmp_path, "decode", config, "--out", run, "--no-progress")
    if condition is not None:
        wait_for(lambda: condition(run), 120, process, step=0.0005)
        if moment.startswith("after"):
            time.sleep(random.Random(SEED + index).uniform(0, 0.02))
    process.send_signal(signal.SIGKILL)
    process.communicate()
    state = f"killed at {moment} ({state_of(run)})"
    if index % 3 == 2:
        before = chunks_of(run)
        second = spawn(tmp_path, "decode", config, "--out", run, "--resume", "--no-progress")
        wait_for(lambda: chunks_of(run) > before or (run / trace.FINAL).exists(), 120, second, step=0.0005)
        second.send_signal(signal.SIGKILL)
        second.communicate()
        state += f"; the resume killed at {state_of(run)}"
    resumed = run_cli(capfd, "decode", config, "--out", run, "--resume", "--no-progress", seconds=300)
    assert_clean(resumed, (0,), f"{state}; --resume: ")
    assert (run / trace.LEDGER).read_bytes() == reference_ledger, f"{state}: ledger.json differs from the uninterrupted run's"
    assert read_json(run / trace.FINAL)["steps"] == KILL_QUERIES, state
    leftovers = [p.name for p in tmp_path.glob(f".{run.name}.creating-*")]
    leftovers += [p.name for p in (run / "steps").iterdir() if not p.name.startswith("chunk-")]
    assert not leftovers, f"{state}: left behind {leftovers}"
    if index == len(MOMENTS) - 1:
        audit = run_cli(capfd, "audit", run, "--no-game", "--mc-samples", "5", seconds=300)
        assert_clean(audit, (0,), f"{state}; the resumed run's audit: ")


# -- abandoned creation directories ----------------------------------------------------------------

@pytest.mark.parametrize("variant", ["abandoned with a partial manifest", "abandoned and empty",
                                     "held by a live process", "its name used by a file"])
def test_a_creation_directory_left_by_a_kill_does_not_block_the_next_decode(micro_models, tmp_path, capfd, variant):
    config = write_toml(tmp_path / "small.toml", micro_config(micro_models, tmp_path / "unused", PMIXED, queries=32,
                                                              block_size=16))
    target = tmp_path / "created"
    staging = tmp_path / f".{target.name}.creating-123-abc"
    holder = None
    if variant == "its name used by a file":
        staging.write_text("x")
    else:
        staging.mkdir()
        if variant != "abandoned and empty":
            (staging / "steps").mkdir()
            (staging / trace.MANIFEST).write_text('{"format": "dpledger-tr')
            (staging / ".lock").write_text("pid 123")
        if variant == "held by a live process":
            holder = open(staging / ".lock", "a+")
            fcntl.flock(holder.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        answer = run_cli(capfd, "decode", config, "--out", target, "--no-progress", seconds=120)
    finally:
        if holder is not None:
            holder.close()
    assert_clean(answer, (0,), "decode: ")
    if variant.startswith("abandoned"):
        assert not staging.exists(), "the abandoned creation directory was not removed"
    if variant == "held by a live process":
        assert staging.exists(), "it removed a creation directory whose lock a live process holds"


@pytest.mark.slow
def test_two_fresh_decodes_racing_for_one_out_give_one_run_and_one_refusal(micro_models, tmp_path):
    config = write_toml(tmp_path / "small.toml", micro_config(micro_models, tmp_path / "unused", PMIXED, queries=32,
                                                              block_size=16))
    race = tmp_path / "race"
    answers = [finish(p) for p in [spawn(tmp_path, "decode", config, "--out", race, "--no-progress") for _ in range(2)]]
    codes = sorted(a.returncode for a in answers)
    assert codes == [0, 2], [a.stderr[-1000:] for a in answers]
    loser = next(a for a in answers if a.returncode == 2)
    assert len([line for line in loser.stderr.splitlines() if line.strip()]) == 1, loser.stderr
    assert "Traceback" not in loser.stderr
    assert not list(tmp_path.glob(".race.creating-*")), "a creation directory was left behind"
