"""Audits and teacher-forced decoding on a 2-worker Dask LocalCluster (dpledger.audit.dask_audit,
dpledger.decoding.dask_decode): the same audit.json, the same records, hashes and ledger as one process, and
a worker killed mid-run changes nothing."""
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from dpledger.audit import audit_run
from dpledger.decoding import trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode
from dpledger.demo import DEMO_TARGET, PAPER_ADAPMIXED, PAPER_PMIXED
from tests.micro import micro_config, write_toml

pytest.importorskip("distributed")

from dpledger.audit.dask_audit import DaskWindowExecutor  # noqa: E402
from dpledger.decoding.cluster import ClusterSpec, dask_client  # noqa: E402

# the demo's audited mechanisms (dpledger.demo), on the micro models; DPARGMAX scaled to 3 teachers
DEMO_MECHANISMS = {
    "pmixed": ({"type": "pmixed", **PAPER_PMIXED}, None),
    "adapmixed": ({"type": "adapmixed", **PAPER_ADAPMIXED}, None),
    "pmixed-with-a-budget": ({"type": "pmixed", **PAPER_PMIXED}, {"epsilon": 6.0, "delta": DEMO_TARGET.delta}),
    "hot-pate-dpargmax": ({"type": "voting", "votes": "coordinated", "aggregator": "dpargmax", "threshold": 2.0,
                           "sigma": 1.0, "sigma_threshold": 1.0}, None),
}
AUDIT = dict(mc_samples=40, game_trials=100)


@pytest.fixture(scope="module")
def client():
    with dask_client(ClusterSpec(workers=2), progress=False) as client:
        yield client


def config_for(micro_models, out: Path, name: str, queries: int = 48, block_size: int = 16) -> dict:
    mechanism, budget = DEMO_MECHANISMS[name]
    config = micro_config(micro_models, out, mechanism, queries=queries, block_size=block_size)
    if budget is not None:
        config["budget"] = budget
    return config


def without_time(report) -> bytes:
    payload = report.to_dict()
    for key in ("created_at", "seconds", "check_seconds", "run_dir", "digest"):  # the digest covers the time fields
        payload.pop(key)
    return trace.json_bytes(payload)


def record_bodies(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("prev_hash", "record_hash")} for r in trace.read_records(run_dir)]


def assert_same_run(reference: Path, other: Path) -> None:
    """Record for record the same, with the same hashes once chained from the same manifest, the
    same payload bytes and the same ledger.json (two runs' manifests differ in out and started_at)."""
    bodies = record_bodies(other)
    assert json.dumps(bodies, sort_keys=True) == json.dumps(record_bodies(reference), sort_keys=True)  # NaN == NaN
    head = trace.chain_records(bodies, trace.genesis_hash(trace.read_manifest(reference)))
    assert head == trace.read_final(reference)["last_record_hash"]
    assert [r["record_hash"] for r in bodies] == [r["record_hash"] for r in trace.read_records(reference)]
    assert (other / trace.LEDGER).read_bytes() == (reference / trace.LEDGER).read_bytes()
    payloads = sorted((reference / trace.REPLAY_DIR).iterdir())
    assert [p.name for p in payloads] == sorted(p.name for p in (other / trace.REPLAY_DIR).iterdir())
    for path in payloads:
        assert path.read_bytes() == (other / trace.REPLAY_DIR / path.name).read_bytes()


@pytest.mark.parametrize("name", sorted(DEMO_MECHANISMS))
def test_distributed_audit_and_decode_equal_one_process(micro_models, tmp_path, client, monkeypatch, name):
    single = run_decode(config_from_dict(config_for(micro_models, tmp_path / "single", name)), progress=False,
                        verbose=False).directory
    spread = run_decode(config_from_dict(config_for(micro_models, tmp_path / "spread", name)), progress=False,
                        verbose=False, client=client).directory
    assert_same_run(single, spread)
    if DEMO_MECHANISMS[name][1] is not None:  # the workers' restored filters answered and refused across blocks
        budget = trace.read_ledger(spread)["budget"]
        assert 16 < budget["first_refused_step"] < 48 and budget["refused_steps"] > 0, budget  # inside block 2
    # windows of 5 steps in blocks of 16: tasks that start and end inside blocks, and a filter state per window
    monkeypatch.setattr("dpledger.audit.loader.LoadedTrace.window_rows", lambda self: 5)
    local = audit_run(single, write=False, **AUDIT)
    executor = DaskWindowExecutor(client, progress=False, tasks_per_worker=3)
    distributed = audit_run(single, write=False, executor=executor, **AUDIT)
    assert local.verdict == "PASS", local.failed
    assert without_time(distributed) == without_time(local)


def test_a_worker_killed_mid_run_changes_nothing(micro_models, tmp_path, client):
    reference = run_decode(config_from_dict(config_for(micro_models, tmp_path / "reference", "pmixed-with-a-budget", queries=320,
                                                       block_size=8)), progress=False, verbose=False).directory
    out = tmp_path / "killed"
    config = config_from_dict(config_for(micro_models, out, "pmixed-with-a-budget", queries=320, block_size=8))
    result, errors = {}, []

    def decode():
        try:
            result["run"] = run_decode(config, progress=False, verbose=False, client=client)
        except BaseException as error:  # reported by the assertion below
            errors.append(error)

    pids_before = client.run(os.getpid)
    thread = threading.Thread(target=decode)
    thread.start()
    deadline = time.time() + 120
    busy = []
    while not busy:  # once blocks are committed, the first moment a worker holds a block
        assert thread.is_alive() and time.time() < deadline, errors or "the run ended before a worker was busy"
        if trace.chunk_path(out, 2).exists():
            busy = [address for address, tasks in client.processing().items() if tasks]
        time.sleep(0.002)
    os.kill(pids_before[busy[0]], signal.SIGKILL)
    killed_mid_run = not (out / trace.FINAL).exists()
    thread.join(180)
    assert not errors, errors
    assert killed_mid_run, "the run finished before a worker could be killed"
    assert client.run(os.getpid) != pids_before  # the nanny started a new worker process
    assert_same_run(reference, out)
    assert not [p for p in (out / trace.REPLAY_DIR).iterdir() if ".tmp-" in p.name]


def test_distributed_resume_continues_a_single_process_run(micro_models, tmp_path, client):
    """Chunks committed by one process, the rest by workers: the run is the uninterrupted one."""
    cfg = config_for(micro_models, tmp_path / "reference", "pmixed-with-a-budget", queries=96, block_size=16)
    reference = run_decode(config_from_dict(cfg), progress=False, verbose=False).directory
    out = tmp_path / "resumed"
    partial = config_from_dict({**cfg, "run": {**cfg["run"], "out": str(out)}})
    run_decode(partial, progress=False, verbose=False)
    for name in (trace.FINAL, trace.LEDGER):
        (out / name).unlink()
    for block in (3, 4, 5):  # as if the single-process run had stopped after block 2
        trace.chunk_path(out, block).unlink()
        trace.replay_path(out, block).unlink()
    run_decode(partial, resume=True, progress=False, verbose=False, client=client)
    assert_same_run(reference, out)


def test_a_later_audit_on_the_same_cluster_uses_no_state_of_an_earlier_one(micro_models, tmp_path, client):
    run = run_decode(config_from_dict(config_for(micro_models, tmp_path / "run", "pmixed", queries=48)),
                     progress=False, verbose=False).directory
    executor = DaskWindowExecutor(client, progress=False)
    assert audit_run(run, write=False, executor=executor, **AUDIT).verdict == "PASS"
    trace.replay_path(run, 1).unlink()  # now the logits come from the models, not the payload
    local = audit_run(run, write=False, **AUDIT)
    assert local.check("replay").evidence["source"] == "models"
    assert without_time(audit_run(run, write=False, executor=executor, **AUDIT)) == without_time(local)


def test_workers_running_several_tasks_at_once_are_refused(micro_models, tmp_path):
    from distributed import Client, LocalCluster

    from dpledger.decoding.cluster import ClusterError, require_single_threaded_workers

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as threaded:
        with pytest.raises(ClusterError, match="1 Dask workers run several tasks at once .* --nthreads 1"):
            require_single_threaded_workers(threaded)
        config = config_from_dict(config_for(micro_models, tmp_path / "run", "pmixed", queries=32))
        with pytest.raises(ClusterError, match="several tasks at once"):
            run_decode(config, progress=False, verbose=False, client=threaded)
        assert not trace.chunk_path(tmp_path / "run", 0).exists()


def test_cli_workers_flags(micro_models, tmp_path):
    from dpledger.cli import main

    run = run_decode(config_from_dict(config_for(micro_models, tmp_path / "run", "pmixed", queries=32)),
                     progress=False, verbose=False).directory
    assert main(["audit", str(run), "--workers", "0"]) == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", str(run), "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"])
    assert exit_info.value.code == 2
    generate = micro_config(micro_models, tmp_path / "generate", {"type": "pmixed", **PAPER_PMIXED}, queries=8)
    generate["data"] = {"stream": "generate", "prompts": ["hello"], "max_new_tokens": 4}
    assert main(["decode", str(write_toml(tmp_path / "generate.toml", generate)), "--workers", "2",
                 "--no-progress"]) == 0
    assert json.loads((tmp_path / "generate" / trace.LEDGER).read_text())["steps"] == 8


def test_without_dask_the_flags_name_the_extra(monkeypatch, tmp_path, capsys):
    import sys

    from dpledger.cli import main

    monkeypatch.setitem(sys.modules, "distributed", None)
    assert main(["audit", str(tmp_path), "--workers", "2"]) == 2
    assert "pip install 'dpledger[dask]'" in capsys.readouterr().err


def test_cluster_spec_rejects_bad_values():
    from dpledger.decoding.cluster import max_local_workers

    for workers, scheduler, message in ((0, None, "--workers must be an integer >= 1, got 0"),
                                        (None, " ", "--scheduler must be a Dask scheduler address"),
                                        (2, "tcp://h:1", "not both"),
                                        (100_000, None, f"--workers must be at most {max_local_workers()}, this "
                                                        "machine's cores .* got 100000")):
        with pytest.raises(ValueError, match=message):
            ClusterSpec(workers, scheduler)


def test_a_local_cluster_and_its_dashboard_listen_on_localhost_only(client):
    scheduler = client.cluster.scheduler
    assert {sock.getsockname()[0] for sock in scheduler.http_server._sockets.values()} == {"127.0.0.1"}
    assert client.dashboard_link.startswith("http://127.0.0.1:")
    assert client.cluster.scheduler_address.startswith("tcp://127.0.0.1:")
    assert all(address.startswith("tcp://127.0.0.1:") for address in client.scheduler_info()["workers"])


def test_the_resource_tracker_a_local_cluster_shares_prints_nothing(tmp_path):
    """A worker killed mid-run left the resource tracker (which the nanny's queues register their
    semaphores with) printing a KeyError traceback for a name it no longer held: the tracker
    dask_client starts writes to the null device. Here the tracker is sent such a name directly."""
    import subprocess
    import sys

    script = ("import sys\n"
              "from multiprocessing import resource_tracker\n"
              "from dpledger.decoding.cluster import quiet_resource_tracker\n"
              "quiet_resource_tracker()\n"
              "resource_tracker.unregister('/mp-dpledger-never-registered', 'semaphore')\n"
              "print('done', file=sys.stderr)\n")
    repo = Path(__file__).resolve().parents[1]
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=repo,
                              env={**os.environ, "PYTHONPATH": str(repo)})
    assert finished.returncode == 0 and finished.stderr == "done\n", finished.stderr  # not "KeyError: '/mp-..."
