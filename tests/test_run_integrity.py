"""Runs that cannot be broken and an audit that cannot be fooled: the run lock (two real
processes), atomic creation, every tampering class a forger can try (with the chain, ledger and
final record recomputed as a forger would), verdicts that say what was verified, audit.json bound
to what it audited, and one clean error line for bad configs and bad trace directories."""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dpledger.audit import Status, audit_run, load_trace
from dpledger.decoding import trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode
from dpledger.cli import main
from dpledger.reports import load_run, render
from tests.forging import copy, forge, point_models_nowhere, reissue_final
from tests.micro import (ADAPMIXED, PMIXED, cli_in_process, forked_decode, kill, make_run, micro_config, reap,
                         wait_for_chunk, write_toml)

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
AUDIT = dict(mc_samples=50, play_game=False)


@pytest.fixture(scope="module")
def runs(micro_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    return {"adapmixed": make_run(micro_models, root / "adapmixed", ADAPMIXED),
            "pmixed": make_run(micro_models, root / "pmixed", PMIXED)}


def audit_cli(run_dir: Path, *flags: str, capsys=None) -> tuple[int, str]:
    status = main(["audit", str(run_dir), "--no-game", "--mc-samples", "50", *flags])
    return status, capsys.readouterr() if capsys else ""


# -- verdicts that say what was verified ---------------------------------------------------------

def test_doctored_charges_without_payload_or_models_are_unverified_never_pass(runs, tmp_path, capsys):
    """The review's case: every data-dependent charge x 0.1, chain and ledger recomputed, replay/
    deleted, model paths pointing nowhere. Nothing can recompute the charges: UNVERIFIED, exit 3."""
    honest = load_trace(runs["adapmixed"]).ledger["epsilon"][0]["epsilon"]
    doctored = copy(runs["adapmixed"], tmp_path / "doctored")
    shutil.rmtree(doctored / "replay")

    def lower(record):
        record["rdp_pmixed_data_dependent"] = [v * 0.1 for v in record["rdp_pmixed_data_dependent"]]
    forge(doctored, edit_record=lower, edit_manifest=point_models_nowhere)
    report = audit_run(doctored, **AUDIT)
    assert load_trace(doctored).ledger["epsilon"][0]["epsilon"] < honest
    assert report.verdict == "UNVERIFIED" and not report.failed
    assert report.check("replay").status is Status.SKIPPED
    assert "the charges were not recomputed" in report.headline and "/nowhere/public" in report.headline
    assert report.to_dict()["verification"]["charges_recomputed_from"] is None
    status, _ = audit_cli(doctored, capsys=capsys)
    assert status == 3
    # the same doctoring with the payload kept is caught by the replay
    kept = copy(runs["adapmixed"], tmp_path / "kept")
    forge(kept, edit_record=lower, edit_manifest=point_models_nowhere)
    report = audit_run(kept, **AUDIT)
    assert report.verdict == "FAIL" and report.check("replay").status is Status.FAIL
    assert "charged pmixed_data_dependent differs" in report.check("replay").detail


def test_an_honest_run_without_payload_or_models_is_unverified_and_with_models_passes(runs, tmp_path):
    bare = copy(runs["pmixed"], tmp_path / "bare")
    shutil.rmtree(bare / "replay")
    report = audit_run(bare, **AUDIT)  # the models are still where the manifest says
    assert report.verdict == "PASS" and report.check("replay").evidence["source"] == "models"
    assert report.check("payload").status is Status.SKIPPED
    forge(bare, edit_manifest=point_models_nowhere)
    report = audit_run(bare, **AUDIT)
    assert report.verdict == "UNVERIFIED" and report.exit_code == 3
    assert report.check("neighbour_ablation").status is Status.SKIPPED


def test_payload_edited_and_rechained_is_caught_by_the_models(runs, tmp_path):
    """A forger who edits the payload logits (to lower the data-dependent charges), recomputes
    the charges from them and re-chains: the models' logits differ from the payload's."""
    forged = copy(runs["adapmixed"], tmp_path / "payload")
    logits = np.load(trace.replay_path(forged, 0)).copy()
    logits[1:] = logits[0]  # every teacher = the public model: charges near 0
    digest = trace.write_replay(forged, 0, logits)
    forge(forged, edit_record=lambda r: r.update(payload_sha256=digest) if r["block"] == 0 else None)
    report = audit_run(forged, **AUDIT)
    assert report.verdict == "FAIL"
    assert "payload logits differ from the models'" in report.check("replay").detail


def test_truncation_is_caught_and_a_consistent_rewrite_needs_the_published_head(runs, tmp_path, capsys):
    original_head = trace.read_final(runs["pmixed"])["head"]
    naive = copy(runs["pmixed"], tmp_path / "naive")
    forge(naive, keep_blocks=1, edit_manifest=lambda m: m.update(queries=32))
    report = audit_run(naive, **AUDIT)
    assert report.verdict == "FAIL" and report.check("manifest").status is Status.FAIL
    assert "queries is 32, the config gives 64" in report.check("manifest").detail
    consistent = copy(runs["pmixed"], tmp_path / "consistent")

    def shorten(manifest):
        manifest.update(queries=32, n_blocks=1)
        manifest["config"]["queries"] = 32
        from dpledger.audit.consistency import _config_of
        manifest["config_fingerprint"] = _config_of(manifest).fingerprint()
    forge(consistent, keep_blocks=1, edit_manifest=shorten)
    # a consistent rewrite of a shorter run is a valid shorter run; only the published head tells
    assert audit_run(consistent, **AUDIT).verdict == "PASS"
    report = audit_run(consistent, expect_head=original_head, **AUDIT)
    assert report.verdict == "FAIL" and report.check("final_record").status is Status.FAIL
    assert f"is not the expected (published) head {original_head}" in report.check("final_record").detail
    status, _ = audit_cli(runs["pmixed"], "--expect-head", original_head, capsys=capsys)
    assert status == 0


@pytest.mark.parametrize("edit", [
    lambda l: l["ledger"]["components"]["pmixed_data_dependent"].update(data_dependent=False),
    lambda l: l.update(data_dependent=False),
    lambda l: l["breakdown"]["rows"][0].update(data_dependent=False),
    lambda l: l.update(perplexity=l["perplexity"] / 2),
    lambda l: l.update(answered_by_public=l["answered_by_public"] + 1),
    lambda l: l["ledger"].update(orders=l["ledger"]["orders"][::-1]),
    lambda l: l.update(relation="add_or_remove_one", claimed_relation="remove_one"),
    lambda l: l.update(accounting="realised-path"),
    lambda l: l["epsilon"][0].update(delta=1e-3),
    lambda l: l.pop("observed_data_dependent_total"),
    lambda l: l.update(note="extra field"),
], ids=["component-flag", "total-flag", "breakdown-flag", "perplexity", "public-answers", "orders", "relation",
        "accounting", "delta", "dropped-field", "extra-field"])
def test_every_ledger_field_is_recomputed(runs, tmp_path, edit):
    """A ledger.json edit FAILs ledger_recompute, whether or not the forger re-issues final.json."""
    for rehash in (False, True):
        run = copy(runs["adapmixed"], tmp_path / f"ledger-{rehash}")
        ledger = json.loads((run / trace.LEDGER).read_text())
        edit(ledger)
        trace.atomic_write_json(run / trace.LEDGER, ledger)
        if rehash:
            reissue_final(run)
        report = audit_run(run, **AUDIT)
        assert report.verdict == "FAIL" and report.check("ledger_recompute").status is Status.FAIL, rehash
        assert (report.check("final_record").status is Status.FAIL) is not rehash
        shutil.rmtree(run)


def test_manifest_edits_break_the_chain_or_contradict_the_config(runs, tmp_path):
    edited = copy(runs["adapmixed"], tmp_path / "edited")
    manifest = trace.read_manifest(edited)
    manifest["mechanism"]["params"]["sigma"] = 1.0  # a 10^4 times smaller screening charge
    trace.atomic_write_json(edited / trace.MANIFEST, manifest)
    report = audit_run(edited, **AUDIT)
    assert report.verdict == "FAIL" and report.check("hash_chain").status is Status.FAIL
    rechained = copy(runs["adapmixed"], tmp_path / "rechained")
    forge(rechained, edit_manifest=lambda m: m["mechanism"]["params"].update(sigma=1.0))
    report = audit_run(rechained, **AUDIT)
    assert report.check("manifest").status is Status.FAIL and "mechanism.params" in report.check("manifest").detail
    for field, value in (("seeds", {"run": 8}), ("n_teachers", 2), ("queries", 63)):
        run = copy(runs["pmixed"], tmp_path / f"m-{field}")
        forge(run, edit_manifest=lambda m, field=field, value=value: m.update({field: value}))
        assert audit_run(run, **AUDIT).verdict == "FAIL", field
    # canaries and model hashes of your own models have no other source: the genesis binds them
    for field, value in (("canaries", []), ("models", [])):
        run = copy(runs["pmixed"], tmp_path / f"c-{field}")
        manifest = trace.read_manifest(run)
        manifest[field] = value
        trace.atomic_write_json(run / trace.MANIFEST, manifest)
        assert audit_run(run, **AUDIT).check("hash_chain").status is Status.FAIL, field


def test_foreign_chunks_manifests_and_deltas_are_findings_not_tracebacks(runs, tmp_path):
    mixed = copy(runs["pmixed"], tmp_path / "chunk")
    shutil.copy(trace.chunk_path(runs["adapmixed"], 1), trace.chunk_path(mixed, 1))
    report = audit_run(mixed, **AUDIT)
    assert report.verdict == "FAIL" and report.check("hash_chain").status is Status.FAIL
    assert report.check("records").status is Status.FAIL  # another mechanism's fields
    swapped = copy(runs["pmixed"], tmp_path / "manifest")
    shutil.copy(runs["adapmixed"] / trace.MANIFEST, swapped / trace.MANIFEST)
    assert audit_run(swapped, **AUDIT).verdict == "FAIL"
    delta = copy(runs["adapmixed"], tmp_path / "delta")
    manifest = trace.read_manifest(delta)
    manifest["config"]["deltas"] = [1e-3]
    trace.atomic_write_json(delta / trace.MANIFEST, manifest)
    report = audit_run(delta, **AUDIT)
    assert report.verdict == "FAIL" and report.check("neighbour_ablation").status is not Status.PASS


def test_stray_and_damaged_files_fail_naming_the_file(runs, tmp_path, capsys):
    """A damaged run is a finding (FAIL, exit 1), not unusable input (exit 2, which a pipeline may retry)."""
    stray = copy(runs["pmixed"], tmp_path / "stray")
    shutil.copy(trace.chunk_path(stray, 1), stray / "steps" / "chunk-000001 (copy).parquet")
    status = main(["audit", str(stray), "--no-game"])
    captured = capsys.readouterr()
    assert status == 1 and not captured.err and "[FAIL   ] files: " in captured.out
    assert "chunk-000001 (copy).parquet: not a chunk of this run" in captured.out
    bad_utf8 = copy(runs["pmixed"], tmp_path / "utf8")
    (bad_utf8 / trace.LEDGER).write_bytes(b"\xff\xfe{")
    status = main(["audit", str(bad_utf8), "--no-game"])
    captured = capsys.readouterr()
    assert status == 1 and not captured.err and "ledger.json: not UTF-8 text" in captured.out


def test_random_byte_flips_never_pass(runs, tmp_path):
    rng = np.random.default_rng(2026)
    source = runs["adapmixed"]
    files = [p.relative_to(source) for p in sorted(source.rglob("*")) if p.is_file() and p.name not in (".lock",
                                                                                                          "audit.json")]
    outcomes = {}
    for trial in range(12):
        run = copy(source, tmp_path / f"flip-{trial}")
        target = run / files[rng.integers(len(files))]
        data = bytearray(target.read_bytes())
        offset = int(rng.integers(len(data)))
        data[offset] ^= int(rng.integers(1, 256))
        target.write_bytes(bytes(data))
        try:
            verdict = audit_run(run, **AUDIT).verdict
        except ValueError:
            verdict = "unusable"
        outcomes[f"{target.name}@{offset}"] = verdict
        assert verdict in ("FAIL", "unusable"), outcomes
        shutil.rmtree(run)


def test_the_report_refuses_an_audit_made_for_other_files(runs, tmp_path):
    run = copy(runs["adapmixed"], tmp_path / "stale")
    audit_run(run, **AUDIT)
    assert "Audit verdict: PASS" in render([load_run(run)], "md")
    shutil.copy(run / "audit.json", tmp_path / "audit.json")
    forge(run, edit_record=lambda r: r.update(rdp_screen=[v / 2 for v in r["rdp_screen"]]))
    shutil.copy(tmp_path / "audit.json", run / "audit.json")  # a PASS copied beside a lowered ledger
    text = render([load_run(run)], "md")
    assert "PASS" not in text and "STALE audit, not shown" in text and "another ledger and head" in text


# -- runs that cannot be broken ------------------------------------------------------------------

def test_a_second_writer_is_locked_out_and_changes_nothing(micro_models, tmp_path):
    config = micro_config(micro_models, tmp_path / "run", ADAPMIXED, queries=80, block_size=10, replay_payload=False)
    path, log = write_toml(tmp_path / "run.toml", config), tmp_path / "first.log"
    first = forked_decode(path, log)
    try:
        wait_for_chunk(first, tmp_path / "run", 1, log)
        # paused, the first writer holds its lock while the second ones try (fresh processes racing each
        # other are tests/adversarial/test_kills_and_concurrency.py, make test-slow)
        os.kill(first, signal.SIGSTOP)
        try:
            command = ["decode", str(path), "--no-progress"]
            resumed, fresh = cli_in_process(command + ["--resume"]), cli_in_process(command)
            assert os.waitpid(first, os.WNOHANG)[0] == 0, "the first run finished before the second writer started"
        finally:
            with contextlib.suppress(ProcessLookupError):   # ended already: the assertion above says so
                os.kill(first, signal.SIGCONT)
        assert resumed.returncode == 2 and resumed.stderr.count("\n") == 1
        assert "is being written by another dpledger process (pid" in resumed.stderr
        assert fresh.returncode == 2 and "already holds files" in fresh.stderr and fresh.stderr.count("\n") == 1
        assert reap(first) == 0, log.read_text()[-2000:]
    finally:
        kill(first)
    report = audit_run(tmp_path / "run", **AUDIT)
    assert report.verdict == "PASS" and report.check("hash_chain").status is Status.PASS
    assert f"chain head {trace.read_final(tmp_path / 'run')['head']}" in log.read_text()


def test_creation_is_atomic_and_abandoned_creations_are_cleared(micro_models, tmp_path, monkeypatch):
    config = config_from_dict(micro_config(micro_models, tmp_path / "run", PMIXED, queries=32))
    real = trace.atomic_write_json

    def killed(path, payload):  # the process dies while writing the manifest
        raise KeyboardInterrupt
    monkeypatch.setattr(trace, "atomic_write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        run_decode(config, progress=False, verbose=False)
    assert not (tmp_path / "run").exists() and not list(tmp_path.glob(".run.creating-*"))
    monkeypatch.setattr(trace, "atomic_write_json", real)
    abandoned = tmp_path / ".run.creating-999999-deadbeef"  # left by a SIGKILL mid-creation
    (abandoned / "steps").mkdir(parents=True)
    result = run_decode(config, progress=False, verbose=False)
    assert not abandoned.exists() and (result.directory / trace.FINAL).exists()


def test_resume_with_a_deleted_payload_is_one_clear_error(micro_models, tmp_path):
    config = config_from_dict(micro_config(micro_models, tmp_path / "run", PMIXED, queries=64))
    run_decode(config, progress=False, verbose=False)
    (tmp_path / "run" / trace.FINAL).unlink()
    shutil.rmtree(tmp_path / "run" / "replay")
    with pytest.raises(trace.TraceError, match=r"replay/block-000000.npy: missing; the run's exact-replay payload is "
                                               "incomplete"):
        run_decode(config, resume=True, progress=False, verbose=False)


def test_a_failed_write_keeps_the_committed_blocks(micro_models, tmp_path, monkeypatch):
    config = config_from_dict(micro_config(micro_models, tmp_path / "run", PMIXED, queries=96))
    real, calls = trace.write_chunk, []

    def full_disk(run_dir, index, records):
        if index == 2:
            raise OSError(27, "File too large", str(trace.chunk_path(run_dir, index)))
        calls.append(index)
        real(run_dir, index, records)
    monkeypatch.setattr(trace, "write_chunk", full_disk)
    with pytest.raises(ValueError, match=r"writing the trace failed \(.*chunk-000002.parquet\): File too large; 2 "
                                         "blocks are committed"):
        run_decode(config, progress=False, verbose=False)
    monkeypatch.setattr(trace, "write_chunk", real)
    result = run_decode(config, resume=True, progress=False, verbose=False)
    assert result.resumed_from_step == 64 and result.summary["steps"] == 96


# -- one error path: bad configs -----------------------------------------------------------------

BAD_CONFIGS = [
    (lambda c: c["mechanism"].update(beta="0.2"), "mechanism.beta (pmixed) must be a number, got '0.2'"),
    (lambda c: c["data"].update(block_size=32.0), "data.block_size must be an integer, got 32.0"),
    (lambda c: c.update(run=5), "[run] must be a table, got 5"),
    (lambda c: c.update(mechanism="pmixed"), "[mechanism] must be a table, got 'pmixed'"),
    (lambda c: c["data"].update(stream="generate", prompts="Customer: hi"),
     "data.prompts must be a list of strings, got 'Customer: hi'"),
    (lambda c: c["run"].update(replay_payload="no"), "run.replay_payload must be true or false, got 'no'"),
    (lambda c: c["run"].update(queries=True), "run.queries must be an integer, got True"),
    (lambda c: c["run"].update(deltas=[]), "run.deltas must list at least one delta, got []"),
    (lambda c: c["run"].update(deltas=1e-5), "run.deltas must be a list of numbers, got 1e-05"),
    (lambda c: c["run"].update(deltas=[1e-5, "x"]), "run.deltas[1] must be a number, got 'x'"),
    (lambda c: c["run"].update(relation=5), "run.relation must be a string, got 5"),
    (lambda c: c["run"].update(seed=1.5), "run.seed must be an integer, got 1.5"),
    (lambda c: c["models"].update(teachers="3"), "models.teachers must be an integer, got '3'"),
    (lambda c: c["models"].update(device="banana"), "models.device must be 'cpu', 'cuda' or 'cuda:N', got 'banana'"),
    (lambda c: c["models"].update(device="cuda"), "models.device = 'cuda' but CUDA is not available"),
    (lambda c: c["mechanism"].update(type="adapmixed", lam=0.05, sigma=1e-300, threshold=5.0, top_k=20),
     "mechanism.sigma = 1e-300 makes the screening charge (lam / (N sigma))^2 * order overflow to +inf"),
    (lambda c: c["mechanism"].update(alpha=True), "mechanism.alpha (pmixed) must be a number, got True"),
    (lambda c: c["mechanism"].update(type=3), "mechanism.type must be a string, got 3"),
    (lambda c: c["data"].update(text="{tmp}"), "data.text must be a file"),
    (lambda c: c["data"].update(text="{tmp}/latin1.txt"), "data.text {tmp}/latin1.txt is not UTF-8 text"),
    (lambda c: c["run"].update(out="{tmp}/afile"), "exists and is not a directory"),
    (lambda c: c["models"].update(extra=1), "unknown keys in [models]: ['extra']"),
    (lambda c: c["run"].update(queries=0), "queries must be an integer >= 1, got 0"),
    # the ranges docs/config.md states, checked before anything is written
    (lambda c: c["mechanism"].update(beta=0.0), "mechanism.beta must be a finite number > 0, got 0.0"),
    (lambda c: c["mechanism"].update(alpha=1e308),
     "mechanism.alpha must be a number in (1, 1024] (the largest order the kernels are checked at: docs/config.md), "
     "got 1e+308"),
    (lambda c: c["mechanism"].update(alpha=float("nan")), "mechanism.alpha must be a number in (1, 1024]"),
    (lambda c: c["mechanism"].update(type="adapmixed", lam=2.0, sigma=0.1, threshold=5.0, top_k=20),
     "mechanism.lam must be a number in [0, 1], got 2.0"),
    (lambda c: c["run"].update(seed=-1), "run.seed must be in [0, 2^63) (a signed 64-bit integer, as TOML and the "
                                         "trace store it), got -1"),
    (lambda c: c["run"].update(seed=2 ** 64), "run.seed must be in [0, 2^63)"),
    (lambda c: c["run"].update(queries=2 ** 53 + 1), "run.queries must be at most 2^53 = 9007199254740992"),
    (lambda c: c.update(models={"embedded": True, "teachers": 100000}, data={}),
     "models.teachers must be in [1, 512] (each block holds N + 1 next-token distributions per position; "
     "docs/config.md), got 100000"),
    (lambda c: c.update(budget={"epsilon": 8.0, "order": 6.05}),
     "budget.order = 6.05 is not on the run's order grid (1.1 to 11 by 0.1, 12 to 63 by 1, 128, 256, 512, 1024); "
     "the nearest: 6 and 6.1"),
]


def _fill(config: dict, tmp: Path) -> dict:
    text = json.dumps(config).replace("{tmp}", str(tmp))
    return json.loads(text)


@pytest.mark.parametrize("change, message", BAD_CONFIGS, ids=[m[:40] for _, m in BAD_CONFIGS])
def test_bad_configs_are_one_line_errors_and_write_nothing(micro_models, tmp_path, capsys, change, message):
    if "CUDA is not available" in message:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 100)
    (tmp_path / "afile").write_text("not a directory")
    config = micro_config(micro_models, tmp_path / "run", dict(PMIXED), queries=32)
    change(config)
    config = _fill(config, tmp_path)
    path = write_toml(tmp_path / "bad.toml", {k: v for k, v in config.items() if isinstance(v, dict)})
    scalars = [f"{k} = {json.dumps(v)}" for k, v in config.items() if not isinstance(v, dict)]
    path.write_text("\n".join(scalars) + "\n" + path.read_text())  # top-level keys come before the tables
    before = sorted(p.name for p in tmp_path.iterdir())
    started = time.monotonic()
    status = main(["decode", str(path), "--no-progress"])
    err = capsys.readouterr().err
    assert time.monotonic() - started < 10, "refused, but not within 10 s"
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("dpledger decode: error: ") and message.replace("{tmp}", str(tmp_path)) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_config_paths_that_are_not_text_files(tmp_path, capsys):
    (tmp_path / "dir.toml").mkdir()
    assert main(["decode", str(tmp_path / "dir.toml")]) == 2
    assert "config must be a file, got the directory" in capsys.readouterr().err
    (tmp_path / "bytes.toml").write_bytes(b"[run]\nout = \"\xff\"\n")
    assert main(["decode", str(tmp_path / "bytes.toml")]) == 2
    assert "bytes.toml is not UTF-8 text (invalid start byte at byte 13)" in capsys.readouterr().err


def test_fuzzed_configs_give_a_config_or_a_value_error():
    """config_from_dict on generated junk: a RunConfig or ValueError, never another exception."""
    from hypothesis import given, settings, strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10 ** 6), st.floats(allow_nan=True),
                        st.text(max_size=8), st.sampled_from(["pmixed", "adapmixed", "public", "ensemble", "cpu",
                                                              "teacher-forced", "generate", "remove_one"]))
    values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                          max_leaves=6)
    keys = {"run": ["out", "queries", "seed", "replay_payload", "deltas", "relation"],
            "mechanism": ["type", "alpha", "beta", "sample_rate", "lam", "sigma", "threshold", "top_k", "ball"],
            "models": ["embedded", "teachers", "public", "teacher_paths", "device"],
            "data": ["stream", "text", "block_size", "prompts", "max_new_tokens"]}
    tables = st.fixed_dictionaries({}, optional={name: st.one_of(values, st.dictionaries(st.sampled_from(names), values,
                                                                                             max_size=5))
                                                 for name, names in keys.items()})

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(tables)
    def check(data):
        try:
            config_from_dict(data)
        except ValueError:
            pass

    check()


# -- bounded memory ------------------------------------------------------------------------------

def _audit_peak_mib(run_dir: Path) -> tuple[str, float]:
    code = ("import json; from audit import audit_run; "  # VmHWM: this process's own peak (ru_maxrss counts the parent's)
            f"r = audit_run({str(run_dir)!r}, mc_samples=20, play_game=False, write=False); "
            "print(json.dumps([r.verdict, [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')][0] / 1024]))")
    result = subprocess.run([sys.executable, "-c", code], env=ENV, cwd=REPO, capture_output=True, text=True, timeout=3000)
    assert result.returncode == 0, result.stderr[-2000:]
    verdict, peak = json.loads(result.stdout.strip().splitlines()[-1])
    return verdict, peak


@pytest.mark.slow  # a scale test (two synthetic runs of different lengths): ~50 s; make test-slow runs it
def test_audit_memory_does_not_follow_the_run_length(tmp_path):
    """The same trace shape at 1x and 8x the length: the audit's peak memory stays put (records
    stream chunk by chunk, logits window by window)."""
    from tests.synthetic import write_synthetic_run

    peaks = {}
    for steps in (128, 1024):
        run = write_synthetic_run(tmp_path / f"s{steps}", 12, 64, steps, 64, dict(PMIXED), payload=True)
        verdict, peaks[steps] = _audit_peak_mib(run)
        assert verdict == "PASS"
    assert peaks[1024] - peaks[128] < 40, peaks


@pytest.mark.slow
def test_audit_of_a_100000_step_trace_with_100_teachers_streams(tmp_path):
    from tests.synthetic import write_synthetic_run

    run = write_synthetic_run(tmp_path / "long", 100, 16, 100_000, 128, dict(PMIXED), payload=False)
    verdict, peak = _audit_peak_mib(run)
    print(f"audit of 100,000 steps, N = 100: {verdict}, peak resident memory {peak:.0f} MiB")
    assert verdict == "UNVERIFIED"  # no payload and no models: integrity and consistency only
    assert peak < 1024



# -- regressions found by the adversarial harness (now tests/adversarial/) -------------------------

def test_models_with_other_hashes_fail_so_a_forged_payload_cannot_hide_from_them(runs, tmp_path):
    """A forger sets a model's recorded hash to something else so that the payload is no longer
    compared with the models: the models are there with other hashes, and that FAILs."""
    forged = copy(runs["pmixed"], tmp_path / "hash")
    forge(forged, edit_manifest=lambda m: m["models"][1].update(content_hash="0" * 64))
    report = audit_run(forged, **AUDIT)
    assert report.verdict == "FAIL" and report.check("models").status is Status.FAIL
    assert "teacher-0: " in report.check("models").detail
    assert "the manifest's content_hash is not the hash of its weights and files" in report.check("models").detail


def test_a_missing_data_text_does_not_fail_an_honest_run(runs, tmp_path):
    run = copy(runs["pmixed"], tmp_path / "text")
    text = Path(trace.read_manifest(run)["config"]["data"]["text"])
    moved = text.with_suffix(".moved")
    text.rename(moved)
    try:
        assert audit_run(run, **AUDIT).verdict == "PASS"
    finally:
        moved.rename(text)


def test_malformed_relations_and_fifos_fail_and_hand_edited_reports_are_one_line_errors(runs, tmp_path, capsys):
    relations = copy(runs["pmixed"], tmp_path / "relations")
    manifest = trace.read_manifest(relations)
    manifest["mechanism"]["component_relations"] = ["add_or_remove_one"]
    trace.atomic_write_json(relations / trace.MANIFEST, manifest)
    assert main(["audit", str(relations), "--no-game"]) == 1
    assert "components or their relations are malformed" in capsys.readouterr().out
    fifo = copy(runs["pmixed"], tmp_path / "fifo")
    (fifo / trace.LEDGER).unlink()
    os.mkfifo(fifo / trace.LEDGER)
    assert main(["audit", str(fifo), "--no-game"]) == 1
    assert "ledger.json: a FIFO, not a regular file" in capsys.readouterr().out
    junk = copy(runs["pmixed"], tmp_path / "junk")
    ledger = json.loads((junk / trace.LEDGER).read_text())
    ledger["breakdown"] = [1, 2]
    (junk / trace.LEDGER).write_text(json.dumps(ledger))
    assert main(["report", str(junk), "--format", "md"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not have the fields a report reads" in err
    delta = copy(runs["pmixed"], tmp_path / "delta")
    manifest = trace.read_manifest(delta)
    manifest["config"]["deltas"] = [1e-3]
    trace.atomic_write_json(delta / trace.MANIFEST, manifest)
    assert main(["report", str(delta), "--format", "md"]) == 2
    assert "no improved epsilon at the run's delta 0.001" in capsys.readouterr().err


def test_api_junk_is_a_value_error():
    import numpy as np

    from dpledger.accounting import PrivacyLedger, RdpCurve
    from dpledger.mechanisms import PMixED

    for call in (lambda: PrivacyLedger.from_dict(0),
                 lambda: PrivacyLedger.from_dict({"orders": [1.5], "relation": "add_one", "components": []}),
                 lambda: PrivacyLedger.from_dict(np.array([1.0, np.nan])),
                 lambda: RdpCurve.from_dict(np.array(["a"])),
                 lambda: PMixED(3.0, 0.3, 3).mixing_weights({"a": 1}, np.array([0.5, 0.5])),
                 lambda: config_from_dict({1: [], None: {}}),
                 lambda: config_from_dict({"run": {"out": "x"}, "mechanism": {"type": "pmixed", "alpha": 3.0,
                                                                              "beta": {1: [], None: []}}})):
        with pytest.raises(ValueError):
            call()
