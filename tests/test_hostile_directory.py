"""A run directory somebody else wrote is hostile input. Whatever it holds (links out of the run
for any of its files, FIFOs, /dev/zero, oversized files, garbage or missing chunks, stray files,
duplicate JSON keys, JSON nested 10,000 deep) and wherever it lives (read-only media), dpledger
answers in bounded time with a verdict naming the file and the reason (a damaged or planted run
FAILs: exit 1), or with one line and exit 2 for input it cannot use at all, and never writes
outside the directory it was told to write to.

Every command that could block runs under a deadline (in-process: SIGALRM; subprocesses: a
timeout), so a hang fails the test instead of stalling the suite."""
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dpledger.accounting import safe_files
from dpledger.accounting.strict_json import MAX_DEPTH
from dpledger.decoding import trace
from dpledger.cli import main
from tests.deadline import deadline
from tests.forging import copy, grow_sparse, reissue_final, replace_with_fifo, replace_with_link
from tests.micro import PMIXED, micro_config, write_toml
from tests.synthetic import write_synthetic_run

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
DEADLINE = 60
"""Seconds any one command may take here (an audit of the test run takes about 2 s)."""


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    with deadline(DEADLINE):
        status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def audit(capsys, run: Path, *flags: str) -> tuple[int, str, str]:
    return cli(capsys, "audit", str(run), "--no-game", "--mc-samples", "20", *flags)


def snapshot(directory: Path) -> dict:
    """Every entry below `directory` (links not followed): its type, content and modification time."""
    found = {}
    for path in sorted(directory.rglob("*")):
        status = os.lstat(path)
        content = path.read_bytes() if stat.S_ISREG(status.st_mode) else os.readlink(path) \
            if stat.S_ISLNK(status.st_mode) else None
        found[str(path.relative_to(directory))] = (stat.S_IFMT(status.st_mode), content, status.st_mtime_ns)
    return found


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> Path:
    """A finished synthetic run (3 blocks with their payload) that audits PASS in about 2 s."""
    return write_synthetic_run(tmp_path_factory.mktemp("hostile") / "run", 3, 16, 96, 32, dict(PMIXED), payload=True)


@pytest.fixture
def run(honest, tmp_path) -> Path:
    return copy(honest, tmp_path / "run")


@pytest.fixture
def victims(tmp_path) -> Path:
    """Files and a directory outside every run, which no command here may change."""
    directory = tmp_path / "victims"
    (directory / "folder").mkdir(parents=True)
    for name in ("audit", "report", "lock", "ledger", "final", "manifest", "temporary", "decode.toml", "teachers"):
        (directory / name).write_text(f"victim {name}\n")
    return directory


def test_the_honest_run_passes(run, capsys):
    status, out, err = audit(capsys, run)
    assert status == 0 and "PASS" in out.splitlines()[0] and not err


# -- reads -----------------------------------------------------------------------------------------

LINKED = {  # a file (or directory) of the run -> what the audit says about it, when it is a link out of the run
    "manifest.json": "manifest.json: a symbolic link, not a regular file",
    "ledger.json": "ledger.json: a symbolic link, not a regular file",
    "final.json": "final.json: a symbolic link, not a regular file",
    "steps/chunk-000001.parquet": "chunk-000001.parquet: a symbolic link, not a regular file",
    "steps": "steps: a symbolic link, not a directory",
    "replay/block-000001.npy": "block-000001.npy: a symbolic link, not a regular file",
    "replay": "replay: a symbolic link, not a directory",
    ".lock": ".lock is a symbolic link",
    "audit.json": "audit.json is a symbolic link",
    "report.html": "report.html is a symbolic link",
}


@pytest.mark.parametrize("name", LINKED)
def test_a_link_out_of_the_run_fails_naming_the_file_and_its_target_is_untouched(run, tmp_path, capsys, name):
    """Even a link to the very bytes dpledger wrote is refused: nothing below the run directory is
    followed. The audit writes audit.json by rename, so a link there is replaced, never written through."""
    outside = tmp_path / "outside"
    outside.mkdir()
    if not os.path.lexists(run / name):
        (run / name).write_text("planted\n")
    replace_with_link(run / name, outside / Path(name).name)
    before = snapshot(outside)
    status, out, err = audit(capsys, run)
    assert status == 1 and out.startswith(f"audit of {run}: FAIL") and not err, out + err
    assert LINKED[name] in out
    assert snapshot(outside) == before
    assert stat.S_ISREG(os.lstat(run / "audit.json").st_mode)


@pytest.mark.parametrize("plant, message", [
    (lambda run: replace_with_fifo(run / ".lock"), ".lock is a FIFO"),
    (lambda run: replace_with_fifo(trace.replay_path(run, 1)), "block-000001.npy: a FIFO, not a regular file"),
    (lambda run: replace_with_link(trace.replay_path(run, 1), Path("/dev/zero")),
     "block-000001.npy: a symbolic link, not a regular file"),
    (lambda run: replace_with_fifo(trace.chunk_path(run, 1)), "chunk-000001.parquet: a FIFO, not a regular file"),
    (lambda run: replace_with_fifo(run / trace.LEDGER), "ledger.json: a FIFO, not a regular file"),
    (lambda run: replace_with_fifo(run / trace.MANIFEST), "manifest.json: a FIFO, not a regular file"),
], ids=["lock-fifo", "payload-fifo", "payload-dev-zero", "chunk-fifo", "ledger-fifo", "manifest-fifo"])
def test_fifos_and_devices_fail_without_blocking(run, capsys, plant, message):
    plant(run)
    status, out, err = audit(capsys, run)
    assert status == 1 and out.startswith(f"audit of {run}: FAIL") and message in out and not err, out + err


def test_the_command_line_audit_of_a_fifo_lock_and_a_dev_zero_payload_ends(run):
    """The battery's hang, end to end: the process ends, with the verdict."""
    replace_with_fifo(run / ".lock")
    replace_with_link(trace.replay_path(run, 0), Path("/dev/zero"))
    result = subprocess.run([sys.executable, "-m", "dpledger", "audit", str(run), "--no-game", "--mc-samples", "20"],
                            env=ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "FAIL" in result.stdout.splitlines()[0] and not result.stderr, result.stderr
    assert ".lock is a FIFO" in result.stdout and "block-000000.npy: a symbolic link" in result.stdout


@pytest.mark.parametrize("grow, message", [
    (lambda run: grow_sparse(run / trace.LEDGER, trace.MAX_JSON_BYTES + 1),
     f"ledger.json: {trace.MAX_JSON_BYTES + 1} bytes, more than the {trace.MAX_JSON_BYTES} bytes"),
    (lambda run: grow_sparse(run / trace.MANIFEST, trace.MAX_JSON_BYTES + 1), "manifest.json: 67108865 bytes"),
    (lambda run: grow_sparse(trace.chunk_path(run, 1), trace.MAX_CHUNK_BYTES + 1),
     f"chunk-000001.parquet: {trace.MAX_CHUNK_BYTES + 1} bytes, more than the {trace.MAX_CHUNK_BYTES} bytes a chunk"),
    (lambda run: grow_sparse(trace.replay_path(run, 1), trace.payload_bytes_bound((4, 32, 16)) + 1),
     "block-000001.npy: 12289 bytes, more than the 12288 bytes its block of logits can hold"),
], ids=["ledger", "manifest", "chunk", "payload"])
def test_oversized_files_fail_unread(run, capsys, grow, message):
    """Sparse files: their size is refused on the opened descriptor before a byte is read."""
    grow(run)
    status, out, err = audit(capsys, run)
    assert status == 1 and message in out and not err, out + err


@pytest.mark.parametrize("damage, message", [
    (lambda run: trace.chunk_path(run, 1).unlink(), "chunk-000001.parquet: missing (chunks jump to 2)"),
    (lambda run: trace.chunk_path(run, 1).write_bytes(b"PAR1 garbage PAR1"),
     "chunk-000001.parquet: unreadable Parquet chunk"),
    (lambda run: (run / "steps" / "notes.txt").write_text("stray"), "notes.txt: not a chunk of this run"),
    (lambda run: (run / "replay" / "notes.txt").write_text("stray"), "unexpected files in replay/: ['notes.txt']"),
    (lambda run: trace.chunk_path(run, 2).unlink(), "final.json does not match the run"),
], ids=["middle-chunk-missing", "garbage-chunk", "stray-in-steps", "stray-in-replay", "last-chunk-missing"])
def test_missing_garbage_and_stray_chunks_fail_like_a_missing_last_one(run, capsys, damage, message):
    damage(run)
    status, out, err = audit(capsys, run)
    assert status == 1 and message in out and not err, out + err


def _with_a_first_duplicate(text: str, key: str, value) -> str:
    """JSON object text with `"key": value` inserted before its first key: a reader that keeps the
    first of two values sees `value`, one that keeps the last (Python's json) the original."""
    assert text.startswith("{")
    return "{" + json.dumps(key) + ": " + json.dumps(value) + ", " + text[1:]


def test_a_duplicate_key_in_a_run_file_fails_naming_the_file_and_the_key(honest, run, tmp_path, capsys):
    """The battery's forgery: a fake first "epsilon" in ledger.json and final.json re-issued for those
    bytes PASSed unanchored (dpledger read the last value while another reader shows the first)."""
    ledger = run / trace.LEDGER
    ledger.write_text(_with_a_first_duplicate(ledger.read_text(), "epsilon", [{"epsilon": 0.01}]))
    reissue_final(run)
    status, out, err = audit(capsys, run)
    assert status == 1 and "ledger.json: the key 'epsilon' appears twice in one object" in out and not err, out + err
    for name, key in ((trace.MANIFEST, "seeds"), (trace.FINAL, "head")):
        other = copy(honest, tmp_path / f"duplicate-{key}")
        (other / name).write_text(_with_a_first_duplicate((other / name).read_text(), key, "forged"))
        status, out, err = audit(capsys, other)
        assert status == 1 and f"{name}: the key {key!r} appears twice in one object" in out and not err, out + err


def test_json_nested_too_deep_fails_in_a_run_and_is_one_line_on_the_command_line(run, tmp_path, capsys):
    deep = "[" * 10_000 + "]" * 10_000
    (run / trace.LEDGER).write_text('{"epsilon": ' + deep + "}")
    status, out, err = audit(capsys, run)
    assert status == 1 and f"ledger.json: arrays and objects nest 10001 deep, more than the {MAX_DEPTH}" in out, err
    for text in ('{"a": ' + deep + "}", deep):
        (tmp_path / "deep.json").write_text(text)
        status, out, err = cli(capsys, "account", "from-event", str(tmp_path / "deep.json"), "--delta", "1e-5")
        assert status == 2 and err.count("\n") == 1 and ("nest 10001 deep" in err or "nest 10000 deep" in err), err
        assert "internal error" not in err
    (tmp_path / "deep.toml").write_text("[claim]\nepsilon = " + "[" * 10_000 + "1" + "]" * 10_000 + "\n")
    status, out, err = cli(capsys, "verify", str(tmp_path / "deep.toml"))
    assert status == 2 and err.count("\n") == 1 and "nest deeper than Python's recursion limit" in err, err


def test_command_line_files_that_are_fifos_devices_or_duplicate_keyed_are_one_line(tmp_path, capsys):
    fifo = replace_with_fifo(tmp_path / "event.json")
    for argv in (["account", "from-event", str(fifo), "--delta", "1e-5"], ["verify", str(fifo)],
                 ["account", "from-event", "/dev/zero", "--delta", "1e-5"]):
        status, out, err = cli(capsys, *argv)
        assert status == 2 and err.count("\n") == 1 and ("a FIFO, not a regular file" in err
                                                         or "/dev/zero: a character device" in err), err
    (tmp_path / "twice.json").write_text('{"event_name": "gaussian", "event_name": "laplace"}')
    status, out, err = cli(capsys, "account", "from-event", str(tmp_path / "twice.json"), "--delta", "1e-5")
    assert status == 2 and err.count("\n") == 1 and "the key 'event_name' appears twice" in err, err
    result = subprocess.run([sys.executable, "-m", "dpledger", "account", "from-event", str(fifo), "--delta", "1e-5"],
                            env=ENV, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "a FIFO" in result.stderr


def test_a_report_of_a_hostile_run_ends_in_one_line_or_hides_the_audit(run, capsys):
    replace_with_fifo(run / "audit.json")
    status, out, err = cli(capsys, "report", str(run), "--format", "md")
    assert status == 0 and "STALE audit, not shown" in out and "audit.json: a FIFO, not a regular file" in out, err
    replace_with_fifo(run / trace.LEDGER)
    status, out, err = cli(capsys, "report", str(run), "--format", "md")
    assert status == 2 and err.count("\n") == 1 and "ledger.json: a FIFO, not a regular file" in err, err


# -- read-only media: the verdict is never lost -------------------------------------------------------

def test_an_unwritable_run_still_prints_its_verdict_and_writes_audit_json_where_told(run, tmp_path, capsys,
                                                                                        monkeypatch):
    """Simulated in-process: every write into the run fails as on a read-only file system (the
    real mount is the next test)."""
    real = safe_files.write_atomic

    def read_only(path, data, *, root=None):
        if Path(os.path.abspath(path)).is_relative_to(run):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        real(path, data, root=root)
    monkeypatch.setattr(safe_files, "write_atomic", read_only)
    status, out, err = audit(capsys, run)
    assert status == 0 and out.startswith(f"audit of {run}: PASS"), out + err
    assert err.count("\n") == 1
    assert f"audit.json not written (cannot write {run}/audit.json: Read-only file system)" in err
    assert not (run / "audit.json").exists()
    status, out, err = audit(capsys, run, "--audit-out", str(tmp_path / "kept.json"))
    assert status == 0 and not err and json.loads((tmp_path / "kept.json").read_text())["verdict"] == "PASS"
    trace.chunk_path(run, 1).unlink()  # a FAIL's exit status is the verdict's too
    status, out, err = audit(capsys, run)
    assert status == 1 and "FAIL" in out and err.count("\n") == 1 and "audit.json not written" in err
    status, out, err = audit(capsys, run, "--audit-out", str(tmp_path / "nowhere" / "audit.json"))
    assert status == 2 and err.count("\n") == 1 and "--audit-out" in err and "does not exist" in err


def _read_only_command(run: Path, command: str) -> list[str] | None:
    """`command` (a shell line) run where `run` is read-only: as a user other than root, after
    chmod; as root (whom chmod does not stop), inside a private mount namespace where `run` is
    bind-mounted read-only on itself (nothing outside the command sees the mount). None when
    neither is possible here."""
    if os.geteuid() != 0:
        for path in [run, *run.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        return ["sh", "-c", command]
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--mount", "true"],
                                                         capture_output=True).returncode != 0:
        return None
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f"mount --bind '{run}' '{run}' && mount -o remount,ro,bind '{run}' && {command}"]


def test_a_run_on_a_read_only_file_system_prints_its_verdict(run, tmp_path):
    code = ("from dpledger.cli import main; import sys; "
            f"flags = ['--no-game', '--mc-samples', '20']; "
            f"first = main(['audit', {str(run)!r}, *flags]); "
            f"second = main(['audit', {str(run)!r}, *flags, '--audit-out', {str(tmp_path / 'kept.json')!r}]); "
            "print('STATUSES', first, second)")
    command = _read_only_command(run, f"exec '{sys.executable}' -c \"{code}\"")
    if command is None:
        pytest.skip("neither a non-root user (chmod) nor a private mount namespace (unshare) is available here")
    result = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip().endswith("STATUSES 0 0"), result.stdout + result.stderr
    assert result.stdout.startswith(f"audit of {run}: PASS")
    assert result.stderr.count("\n") == 1 and "audit.json not written (cannot write" in result.stderr
    assert ("Read-only file system" if os.geteuid() == 0 else "Permission denied") in result.stderr
    assert not (run / "audit.json").exists() and json.loads((tmp_path / "kept.json").read_text())["verdict"] == "PASS"


# -- writes: never outside the directory a command was told to write to ------------------------------

def test_audit_and_report_never_write_through_links_in_the_run(run, victims, capsys):
    plants = {"audit.json": "audit", "report.html": "report", f".audit.json.tmp-{os.getpid()}": "temporary",
              f".report.html.tmp-{os.getpid()}": "temporary", ".lock": "lock"}
    for name, victim in plants.items():
        replace_with_link(run / name, victims / victim)
    before = snapshot(victims)
    status, out, err = audit(capsys, run)
    assert status == 1 and "audit.json is a symbolic link" in out  # planted links are a finding
    status, out, err = cli(capsys, "report", str(run))
    assert status == 0 and out.strip() == f"wrote {run / 'report.html'}", err
    assert snapshot(victims) == before
    for name in ("audit.json", "report.html"):
        assert stat.S_ISREG(os.lstat(run / name).st_mode)
    status, out, err = cli(capsys, "report", str(run), "--format", "md", "--out", str(run / "report.html"))
    assert status == 0 and snapshot(victims) == before


@pytest.fixture(scope="module")
def unfinished_run(micro_models, tmp_path_factory) -> tuple[Path, Path]:
    """An unfinished micro run (block 0 of 2 committed, no ledger or final) and its config file."""
    root = tmp_path_factory.mktemp("unfinished")
    out = root / "run"
    config = write_toml(root / "run.toml", micro_config(micro_models, out, dict(PMIXED), queries=64))
    assert main(["decode", str(config), "--no-progress"]) == 0
    for path in (out / trace.FINAL, out / trace.LEDGER, trace.chunk_path(out, 1), trace.replay_path(out, 1)):
        path.unlink()
    return out, config


@pytest.fixture
def unfinished(unfinished_run, tmp_path) -> tuple[Path, Path]:
    """A copy of the unfinished run (resumed with --out) and the config."""
    out, config = unfinished_run
    return copy(out, tmp_path / "unfinished"), config


@pytest.mark.parametrize("plant, message", [
    (lambda run, victims: replace_with_link(run / ".lock", victims / "lock"),
     ".lock: a symbolic link, not a regular file (dpledger never follows a link inside a run directory)"),
    (lambda run, victims: replace_with_fifo(run / ".lock"), ".lock: a FIFO, not a regular file"),
    (lambda run, victims: ((run / ".lock").unlink(), os.link(victims / "lock", run / ".lock")),
     ".lock: a regular file with 2 hard links; the lock dpledger writes has one"),
    (lambda run, victims: replace_with_link(run / "steps", victims / "folder" / "steps"),
     "steps: a symbolic link, not a directory"),
    (lambda run, victims: replace_with_link(run / "replay", victims / "folder" / "replay"),
     "replay: a symbolic link, not a directory"),
    (lambda run, victims: replace_with_fifo(trace.replay_path(run, 0)),
     "block-000000.npy: a FIFO, not a regular file; the run's exact-replay payload is incomplete"),
], ids=["lock-link", "lock-fifo", "lock-hard-link", "steps-link", "replay-link", "payload-fifo"])
def test_resume_refuses_planted_locks_and_links_in_one_line(unfinished, victims, capsys, plant, message):
    """The lock is taken before the manifest is read: a planted .lock was truncated to "pid N"
    through its link whatever the directory held."""
    out, config = unfinished
    plant(out, victims)
    before = snapshot(victims)
    status, _, err = cli(capsys, "decode", str(config), "--out", str(out), "--resume", "--no-progress")
    assert status == 2 and err.count("\n") == 1 and message in err, err
    assert snapshot(victims) == before


def test_decode_and_resume_never_write_through_links(unfinished, victims, capsys):
    """Every file the resume writes is a link to a victim (final.json a dangling one: writing through
    it would create the victim); interrupted-write names and abandoned creations are links too."""
    out, config = unfinished
    (out / trace.FINAL).symlink_to(victims / "created-through-a-dangling-link")
    plants = {out / trace.LEDGER: "ledger", trace.replay_path(out, 1): "temporary",
              out / f".{trace.LEDGER}.tmp-{os.getpid()}": "temporary",
              out.parent / f".{out.name}.creating-1-deadbeef": "folder",
              out.parent / ".fresh.creating-1-deadbeef": "folder"}
    for path, victim in plants.items():
        replace_with_link(path, victims / victim)
    before = snapshot(victims)
    status, stdout, err = cli(capsys, "decode", str(config), "--out", str(out), "--resume", "--no-progress")
    assert status == 0 and "chain head" in stdout, err
    status, stdout, err = cli(capsys, "decode", str(config), "--out", str(out.parent / "fresh"), "--no-progress")
    assert status == 0 and "chain head" in stdout, err
    assert snapshot(victims) == before
    for path in (out / trace.LEDGER, out / trace.FINAL, trace.replay_path(out, 1)):
        assert stat.S_ISREG(os.lstat(path).st_mode)
    assert safe_files.special_entries(out) == []  # the planted temporary name went with the interrupted writes
    assert audit(capsys, out)[0] == 0


def test_teachers_never_write_through_links_in_their_output_directory(micro_models, tmp_path, victims, capsys):
    """First --overwrite over an output directory of links (each removed, never followed), then a
    resume where the teacher to retrain and its staging directory are links to directories elsewhere
    (save_pretrained wrote into the staging link's target) and decode.toml is a link."""
    from dpledger.decoding.corpus import generate_corpus
    from tests.micro import MICRO_CORPUS
    from tests.test_teachers import FAST

    corpus = generate_corpus(seed=0, teachers=3, **MICRO_CORPUS)
    private = tmp_path / "private.txt"
    private.write_text("\n\n".join(doc for shard in corpus.shards for doc in shard.split("\n\n")[:20]) + "\n")
    out = tmp_path / "teachers"
    out.mkdir()
    (victims / "folder" / "kept").write_text("victim folder\n")
    (victims / "staging").mkdir()
    for name, victim in {"teachers.json": "teachers", "decode.toml": "decode.toml", ".teacher-000.partial": "folder",
                         "teacher-001": "folder"}.items():
        (out / name).symlink_to(victims / victim)
    before = snapshot(victims)
    argv = ["teachers", str(private), "--public", str(micro_models.public), "--tokenizer", str(micro_models.tokenizer),
            "--teachers", "3", "--out", str(out), *FAST]
    status, stdout, err = cli(capsys, *argv, "--overwrite")
    assert status == 0 and snapshot(victims) == before, err
    shutil.rmtree(out / "teacher-001")
    for name, victim in (("teacher-001", "folder"), (".teacher-001.partial", "staging"),
                         ("decode.toml", "decode.toml")):
        replace_with_link(out / name, victims / victim)
    status, stdout, err = cli(capsys, *argv)
    assert status == 0 and stdout.count("(kept from an earlier run)") == 2, err
    assert snapshot(victims) == before
    for name in ("teachers.json", "decode.toml", "teacher-000", "teacher-001"):
        assert not (out / name).is_symlink() and (out / name).exists()


def test_user_named_inputs_that_would_block_or_nest_too_deep_are_one_line(tmp_path, capsys, micro_models):
    """A run config or data text that is a FIFO, a config nested past Python's recursion limit, and
    in-context examples naming a key twice: one line, exit 2, within the deadline, nothing written."""
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    data_fifo = tmp_path / "data.fifo"
    os.mkfifo(data_fifo)
    config = micro_config(micro_models, tmp_path / "out", PMIXED, queries=8)
    config["data"]["text"] = str(data_fifo)
    cases = [(fifo, "a FIFO, not a regular file"), (deep, "nest deeper than Python's recursion limit"),
             (write_toml(tmp_path / "data.toml", config), "a FIFO, not a regular file")]
    for path, message in cases:
        status, _, err = cli(capsys, "decode", str(path))
        assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "out").exists()
    from dpledger.decoding.icl import read_icl_examples

    examples = tmp_path / "examples.json"
    examples.write_text('[{"a": 1, "a": 2}]')
    with pytest.raises(ValueError, match="appears twice"):
        read_icl_examples(examples, 1)


def test_the_dp_event_file_is_written_beside_a_link_never_through_it(tmp_path, capsys):
    target = tmp_path / "victim.txt"
    target.write_text("untouched")
    link = tmp_path / "event.json"
    link.symlink_to(target)
    status, _, err = cli(capsys, "account", "gaussian", "--noise-multiplier", "4", "--queries", "10", "--delta",
                         "1e-5", "--dp-event-out", str(link))
    assert status == 0, err
    assert target.read_text() == "untouched" and not link.is_symlink() and "GaussianDpEvent" in link.read_text()
