"""Adversarial audit: attack dpledger as a forger and as a careless user would.

Categories (each reports cases tried, cases handled cleanly, and every failure):
  tampering      named edits of copies of a correct AdaPMixED and a correct PMixED run (with and
                 without re-chaining / recomputing ledger.json and final.json, as a forger using
                 dpledger.decoding.trace would); clean = FAIL (exit 1), or exit 2 with a one-line error, or
                 UNVERIFIED (exit 3) where the edit removed what verification needs; never PASS on a
                 changed run, never exit 4 or a traceback
  report         `dpledger report --format md` after each tampering case, and stale audit.json cases:
                 no exit 4 / traceback, never "PASS" beside a ledger the audit did not see
  byte_flips     seeded single-byte flips of random files; never PASS unless the flipped file is
                 semantically identical (recorded), never exit 4 or a traceback
  bad_configs    `dpledger decode` with bad configs: exit 2, exactly one stderr line naming the
                 key or value, and nothing written
  concurrency    a second writer (resume / fresh decode / audit) on a run being written, SIGKILL at
                 random moments then --resume (ledger identical to an uninterrupted run's), abandoned
                 creation directories
  api_fuzz       config_from_dict, build_runner (+ one process() call), audit_run on garbage
                 directories, the accounting API: random junk, only ValueError (and subclasses) allowed

Every CLI call except the concurrency ones runs in-process in a worker process (spawned, so a
crash or hang is caught and the worker restarted) with stdout and stderr captured at the file
descriptor level, as a terminal would see them.

    .venv/bin/python benchmarks/adversarial_audit.py            # full (~15 min on 2 cores)
    .venv/bin/python benchmarks/adversarial_audit.py --quick    # subset (< 2 min)

Writes benchmarks/results/adversarial_audit.json (--quick: adversarial_audit_quick.json).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ADAPMIXED = {"type": "adapmixed", "alpha": 18.0, "beta": 0.002, "lam": 0.05, "sigma": 0.01, "threshold": 5.0, "top_k": 20}
PMIXED = {"type": "pmixed", "alpha": 6.0, "beta": 0.05}
AUDIT_FLAGS = ["--no-game", "--mc-samples", "10"]
GAME_FLAGS = ["--mc-samples", "10", "--trials", "200"]


def log(*parts) -> None:
    print(*parts, flush=True)


# ==================================================================================================
# The worker: runs CLI calls and fuzz batches in-process, isolated from this process
# ==================================================================================================

class _CallTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise _CallTimeout()


def _capture_cli(argv: list[str]) -> dict:
    """dpledger.cli.main(argv) with fds 1 and 2 redirected to files (what a terminal would show)."""
    import warnings

    from dpledger.cli import main

    out_f, err_f = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(out_f.fileno(), 1)
    os.dup2(err_f.fileno(), 2)
    rc, tb = None, None
    started = time.time()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # as in a fresh interpreter: each warning shown again
            try:
                rc = main(argv)
            except SystemExit as error:
                rc = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
            except BaseException:  # noqa: BLE001 - a traceback is exactly what we look for
                tb = traceback.format_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
    out_f.seek(0)
    err_f.seek(0)
    stdout = out_f.read().decode("utf-8", "replace")
    stderr = err_f.read().decode("utf-8", "replace")
    return {"rc": rc, "stdout": stdout, "stderr": stderr, "traceback": tb, "seconds": round(time.time() - started, 2)}


def _worker_loop(conn, env: dict, memory_limit: int | None) -> None:
    os.environ.update(env)
    if env.get("ADV_CWD"):
        os.chdir(env["ADV_CWD"])
    sys.path.insert(0, str(ROOT))
    import torch  # noqa: F401 - imported before the memory limit

    import dpledger.cli  # noqa: F401
    if memory_limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    signal.signal(signal.SIGALRM, _alarm)
    if memory_limit:  # the fuzz worker: dp_accounting's convergence notes are not results
        import logging

        logging.getLogger("absl").setLevel(logging.ERROR)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        kind, payload = message
        try:
            if kind == "cli":
                result = _capture_cli(payload["argv"])
            elif kind == "fuzz":
                result = _fuzz_batch(**payload)
            else:
                result = {"worker_error": f"unknown task {kind}"}
        except BaseException:  # noqa: BLE001
            result = {"worker_error": traceback.format_exc()}
        conn.send(result)


class Worker:
    """A spawned process that runs tasks; a crash or a hang is reported and the worker restarted."""

    def __init__(self, env: dict, memory_limit: int | None = None):
        self.env, self.memory_limit = env, memory_limit
        self.context = mp.get_context("spawn")
        self._start()

    def _start(self) -> None:
        self.conn, child = self.context.Pipe()
        self.proc = self.context.Process(target=_worker_loop, args=(child, self.env, self.memory_limit), daemon=True)
        self.proc.start()
        child.close()

    def _restart(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self._start()

    def call(self, kind: str, timeout: float = 180, **payload) -> dict:
        self.conn.send((kind, payload))
        if not self.conn.poll(timeout):
            self._restart()
            return {"hang": timeout}
        try:
            return self.conn.recv()
        except (EOFError, ConnectionError):
            self.proc.join(5)
            code = self.proc.exitcode
            self._restart()
            return {"crashed": code}

    def cli(self, argv: list[str], timeout: float = 180) -> dict:
        return self.call("cli", timeout=timeout, argv=[str(a) for a in argv])

    def close(self) -> None:
        try:
            self.conn.send(None)
            self.proc.join(10)
        except (BrokenPipeError, OSError):
            pass
        if self.proc.is_alive():
            self.proc.kill()


def stderr_lines(result: dict) -> list[str]:
    return [line for line in result.get("stderr", "").splitlines() if line.strip()]


def problem_of(result: dict) -> str | None:
    """What is wrong with a CLI call whatever the case expects: a hang, a crash, a traceback, exit 4,
    or exit 2 without exactly one stderr line."""
    if "hang" in result:
        return f"hung (no answer within {result['hang']} s)"
    if "crashed" in result:
        return f"the process died (exit code {result['crashed']}, e.g. a segfault)"
    if "worker_error" in result:
        return "harness error: " + result["worker_error"].strip().splitlines()[-1]
    if result.get("traceback"):
        return "uncaught exception: " + result["traceback"].strip().splitlines()[-1]
    if "Traceback (most recent call last)" in result.get("stderr", ""):
        return "traceback on stderr: " + stderr_lines(result)[-1][:200]
    if result["rc"] == 4:
        return "exit 4 (internal error): " + " | ".join(stderr_lines(result))[:300]
    if result["rc"] == 2 and len(stderr_lines(result)) != 1:
        return f"exit 2 with {len(stderr_lines(result))} stderr lines: " + " | ".join(stderr_lines(result))[:300]
    return None


def short(result: dict) -> str:
    """One line describing a CLI result."""
    if "rc" not in result:
        return problem_of(result) or str(result)[:200]
    verdict = {0: "PASS", 1: "FAIL", 2: "unusable", 3: "UNVERIFIED", 4: "internal error"}.get(result["rc"], "?")
    line = ""
    if result["rc"] == 1:
        line = next((l for l in result["stdout"].splitlines() if l.startswith("audit of")), "")
        line = line[line.find("(failed:"):] if "(failed:" in line else ""
    elif stderr_lines(result):
        line = stderr_lines(result)[0]
    return f"exit {result['rc']} ({verdict}) {line}"[:400]


# ==================================================================================================
# Forger's toolkit: rewrite a run with dpledger's own trace functions
# ==================================================================================================

def read_json(path: Path):
    from dpledger.decoding import trace

    return trace.loads_json(Path(path).read_text())


def write_json(path: Path, value) -> None:
    from dpledger.decoding import trace

    Path(path).write_bytes(trace.json_bytes(value))


def chunk_files(run: Path) -> list[Path]:
    return sorted((run / "steps").glob("chunk-*.parquet"))


def load_chunks(run: Path) -> list[list[dict]]:
    import pyarrow.parquet as pq

    return [pq.read_table(path).to_pylist() for path in chunk_files(run)]


def save_chunks(run: Path, chunks: list[list[dict]]) -> None:
    from dpledger.decoding import trace

    for path in chunk_files(run):
        path.unlink()
    for index, records in enumerate(chunks):
        trace.write_chunk(run, index, records)


def rechain(manifest: dict, chunks: list[list[dict]]) -> str:
    from dpledger.decoding import trace

    prev = trace.genesis_hash(manifest)
    for records in chunks:
        prev = trace.chain_records(records, prev)
    return prev


def compute_ledger(manifest: dict, chunks: list[list[dict]]) -> dict:
    from dpledger.decoding.run import RunTotals

    totals = RunTotals(manifest)
    for records in chunks:
        totals.add(records)
    return totals.summary()


def write_ledger(run: Path, summary: dict) -> None:
    from dpledger.decoding import trace

    (run / "ledger.json").write_bytes(trace.json_bytes(summary))


def write_final(run: Path, manifest: dict | None = None, chunks: list[list[dict]] | None = None) -> str:
    """A final record matching the run's current manifest, chunks and ledger.json; returns the head."""
    from dpledger.decoding import trace

    manifest = manifest if manifest is not None else read_json(run / "manifest.json")
    chunks = chunks if chunks is not None else load_chunks(run)
    last = next((c[-1]["record_hash"] for c in reversed(chunks) if c), trace.genesis_hash(manifest))
    final = trace.final_record(manifest, sum(len(c) for c in chunks), len(chunks), last,
                               (run / "ledger.json").read_bytes())
    write_json(run / "final.json", final)
    return final["head"]


def forge(run: Path, level: str = "full", records=None, chunks_edit=None, manifest_edit=None) -> None:
    """Edit a run as a forger would. level: "none" (edited files written as they are), "chain"
    (records re-chained from the manifest's genesis), "ledger" (and ledger.json recomputed from the
    records), "full" (and final.json recomputed: a self-consistent run with a new head).
    records(record, manifest) edits each record in place; chunks_edit(chunks, manifest) returns new
    chunks; manifest_edit(manifest) edits the manifest in place."""
    manifest = read_json(run / "manifest.json")
    if manifest_edit is not None:
        manifest_edit(manifest)
        write_json(run / "manifest.json", manifest)
    chunks = load_chunks(run)
    touched = False
    if records is not None:
        for chunk in chunks:
            for record in chunk:
                records(record, manifest)
        touched = True
    if chunks_edit is not None:
        chunks = chunks_edit(chunks, manifest)
        touched = True
    if level != "none":
        rechain(manifest, chunks)
        touched = True
    if touched:
        save_chunks(run, chunks)
    if level in ("ledger", "full"):
        write_ledger(run, compute_ledger(manifest, chunks))
    if level == "full":
        write_final(run, manifest, chunks)


def reconcile(manifest: dict) -> None:
    """After editing manifest["config"]: make the rest of the manifest agree with it (mechanism
    block, orders, counts, seeds, fingerprint), as a forger who read audit/consistency.py would."""
    from dpledger.accounting.orders import default_orders
    from dpledger.audit.consistency import _config_of
    from dpledger.decoding.runners import build_runner

    config = _config_of(manifest)
    runner = build_runner(config.mechanism, config.models.teachers, config.relation)
    manifest["mechanism"] = {"type": runner.kind, "params": runner.params, "components": runner.components,
                             "component_relations": {n: runner.relation_of(n).value for n in runner.components}}
    manifest["orders"] = [float(v) for v in default_orders(*([runner.params["alpha"]] if "alpha" in runner.params
                                                             else []))]
    size = config.data.block_size if config.data.stream == "teacher-forced" else config.data.max_new_tokens
    manifest.update(relation=config.relation, n_teachers=config.models.teachers, queries=config.queries,
                    n_blocks=math.ceil(config.queries / size), replay_payload=config.replay_payload,
                    seeds={"run": config.seed}, config_fingerprint=config.fingerprint())


def forge_payload(run: Path, block: int, transform, recompute_records: bool) -> None:
    """Replace a block's logits by transform(logits) and chain the new payload hash; with
    recompute_records the block's records are recomputed from the new logits exactly as decode
    would have written them (a self-consistent forgery). Then re-chain, ledger, final."""
    import numpy as np
    import torch

    from dpledger.decoding import trace
    from dpledger.decoding.blocks import _outcome_records, replay_steps
    from dpledger.decoding.runners import build_runner

    manifest = read_json(run / "manifest.json")
    logits = np.array(np.load(trace.replay_path(run, block)))
    forged = np.ascontiguousarray(transform(logits.copy()))
    sha = trace.write_replay(run, block, forged)
    chunks = load_chunks(run)
    records = chunks[block]
    if recompute_records:
        runner = build_runner({"type": manifest["mechanism"]["type"], **manifest["mechanism"]["params"]},
                              manifest["n_teachers"], manifest["relation"])
        first = records[0]["step"]
        outcome, tokens = replay_steps(runner, torch.from_numpy(forged), manifest["config"]["seed"], first,
                                       np.asarray(manifest["orders"]), False)
        chunks[block] = _outcome_records(runner, block, first, outcome, tokens,
                                         np.asarray([r["true_token"] for r in records]),
                                         np.asarray([r["context_token"] for r in records]), sha)
    else:
        for record in records:
            record["payload_sha256"] = sha
    rechain(manifest, chunks)
    save_chunks(run, chunks)
    write_ledger(run, compute_ledger(manifest, chunks))
    write_final(run, manifest, chunks)


def edit_ledger(run: Path, edit, refinal: bool = True) -> None:
    ledger = read_json(run / "ledger.json")
    edit(ledger)
    write_json(run / "ledger.json", ledger)
    if refinal:
        write_final(run)


def edit_final(run: Path, edit, rehead: bool = True) -> None:
    from dpledger.decoding import trace

    final = read_json(run / "final.json")
    edit(final)
    if rehead:
        final["head"] = trace.head_of(final)
    write_json(run / "final.json", final)


def edit_manifest_raw(run: Path, edit) -> None:
    manifest = read_json(run / "manifest.json")
    edit(manifest)
    write_json(run / "manifest.json", manifest)


def scale_charges(factor):
    def edit(record, manifest):
        for name in manifest["mechanism"]["components"]:
            record[f"rdp_{name}"] = [v * factor for v in record[f"rdp_{name}"]]
    return edit


def set_charges(value):
    def edit(record, manifest):
        for name in manifest["mechanism"]["components"]:
            record[f"rdp_{name}"] = [value for _ in record[f"rdp_{name}"]]
    return edit


def first_record(edit):
    """A records= editor that changes only step 0's record (or the first matching step)."""
    state = {"done": False}

    def apply(record, manifest):
        if not state["done"] and edit(record, manifest) is not False:
            state["done"] = True
    return apply


def replace_bytes(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


# ==================================================================================================
# Category 1: tampering cases
# ==================================================================================================

CASES: list[dict] = []


def case(name: str, kinds=("ada", "pm"), expect=(1, 2), game: bool = False, quick: bool = False,
         anchored: bool = False, limit: str | None = None, extra: list | None = None, timeout: float = 60,
         identical: str | None = None):
    """Register a tampering case. expect: the exit codes that count as clean. anchored: audit with
    --expect-head ORIGINAL_HEAD. limit: the case is a self-consistent forgery of something the audit
    cannot verify without the published head; an unanchored PASS is then recorded as a limit, and
    the case is counted with --expect-head (which must FAIL it). identical: the edit leaves every
    value the same as dpledger reads it (a PASS is then clean and recorded as an observation)."""
    def register(function):
        CASES.append(dict(name=name, fn=function, kinds=kinds, expect=set(expect) | ({0} if identical else set()),
                          game=game, quick=quick, anchored=anchored, limit=limit, extra=extra or [], timeout=timeout,
                          identical=identical))
        return function
    return register


# -- per-step charges ------------------------------------------------------------------------------
@case("charges_halved_not_rechained", quick=True)
def _(run, ctx):
    forge(run, "none", records=scale_charges(0.5))


@case("charges_halved_rechained")
def _(run, ctx):
    forge(run, "chain", records=scale_charges(0.5))


@case("charges_halved_rechained_ledger_recomputed")
def _(run, ctx):
    forge(run, "ledger", records=scale_charges(0.5))


@case("charges_halved_full_forge", quick=True)
def _(run, ctx):
    forge(run, "full", records=scale_charges(0.5))


@case("charges_halved_full_forge_expect_head", expect=(1,), anchored=True)
def _(run, ctx):
    forge(run, "full", records=scale_charges(0.5))


@case("charges_zeroed_full_forge")
def _(run, ctx):
    forge(run, "full", records=set_charges(0.0))


@case("charges_doubled_full_forge", kinds=("pm",))
def _(run, ctx):
    forge(run, "full", records=scale_charges(2.0))


@case("one_charge_relative_1e-6_full_forge")
def _(run, ctx):
    def edit(record, manifest):
        name = next(iter(manifest["mechanism"]["components"]))
        record[f"rdp_{name}"] = [v * (1 - 1e-6) for v in record[f"rdp_{name}"]]
    forge(run, "full", records=first_record(edit))


@case("charges_negative_rechained")
def _(run, ctx):
    forge(run, "chain", records=first_record(lambda r, m: scale_charges(-1.0)(r, m)))


@case("charges_nan_rechained", kinds=("ada",))
def _(run, ctx):
    forge(run, "chain", records=first_record(lambda r, m: set_charges(float("nan"))(r, m)))


@case("charge_column_dropped_rechained", kinds=("ada",))
def _(run, ctx):
    forge(run, "chain", records=lambda r, m: r.pop(f"rdp_{next(iter(m['mechanism']['components']))}"))


@case("charges_as_their_repr_strings_rechained_expect_head", kinds=("pm",), anchored=True,
      identical="floats replaced by their repr strings hash the same (trace._canonical writes a float as its repr "
                "string), so the chain and the head do not change; numpy reads the same values back")
def _(run, ctx):
    def edit(record, manifest):
        name = next(iter(manifest["mechanism"]["components"]))
        record[f"rdp_{name}"] = [str(v) for v in record[f"rdp_{name}"]]
    forge(run, "chain", records=edit)


# -- records ---------------------------------------------------------------------------------------
@case("record_dropped_not_rechained")
def _(run, ctx):
    forge(run, "none", chunks_edit=lambda c, m: [c[0][:5] + c[0][6:]] + c[1:])


@case("record_dropped_full_forge", quick=True)
def _(run, ctx):
    forge(run, "full", chunks_edit=lambda c, m: [c[0][:5] + c[0][6:]] + c[1:])


@case("last_record_dropped_full_forge", kinds=("pm",))
def _(run, ctx):
    forge(run, "full", chunks_edit=lambda c, m: c[:-1] + [c[-1][:-1]])


@case("records_swapped_not_rechained")
def _(run, ctx):
    forge(run, "none", chunks_edit=lambda c, m: [[c[0][1], c[0][0]] + c[0][2:]] + c[1:])


@case("records_swapped_full_forge")
def _(run, ctx):
    forge(run, "full", chunks_edit=lambda c, m: [[c[0][1], c[0][0]] + c[0][2:]] + c[1:])


@case("record_duplicated_full_forge")
def _(run, ctx):
    forge(run, "full", chunks_edit=lambda c, m: [c[0][:3] + [dict(c[0][2])] + c[0][3:]] + c[1:])


@case("output_token_edited_full_forge", quick=True)
def _(run, ctx):
    forge(run, "full", records=first_record(lambda r, m: r.update(output_token=(r["output_token"] + 1) % 300)))


@case("true_and_context_tokens_edited_full_forge", kinds=("pm",))
def _(run, ctx):
    def edit(chunks, manifest):  # a consistent token stream, just not the run's text
        for record in chunks[0][3:6]:
            record["true_token"] = 7
        for record in chunks[0][4:7]:
            record["context_token"] = 7
        return chunks
    forge(run, "full", chunks_edit=edit)


@case("prob_true_token_edited_full_forge")
def _(run, ctx):
    forge(run, "full", records=first_record(lambda r, m: r.update(prob_true_token=min(1.0, r["prob_true_token"] * 3))))


@case("lambdas_edited_full_forge")
def _(run, ctx):
    forge(run, "full", records=first_record(lambda r, m: r.update(lambdas=[v * 0.5 for v in r["lambdas"]])))


@case("observed_data_dependent_edited_full_forge")
def _(run, ctx):
    forge(run, "full", records=lambda r, m: r.update(observed_data_dependent=[v * 0.1 for v in
                                                                              r["observed_data_dependent"]]))


@case("screen_decision_flipped_full_forge", kinds=("ada",))
def _(run, ctx):
    def edit(record, manifest):
        record.update(screen_passed=not record["screen_passed"],
                      answered_by="public" if record["screen_passed"] else "mechanism")
    forge(run, "full", records=first_record(edit))


@case("screen_statistic_edited_full_forge", kinds=("ada",))
def _(run, ctx):
    forge(run, "full", records=first_record(lambda r, m: r.update(screen_statistic=r["screen_statistic"] * 0.9)))


@case("payload_hash_field_edited_full_forge")
def _(run, ctx):
    forge(run, "full", records=lambda r, m: r.update(payload_sha256="0" * 64) if r["block"] == 0 else None)


@case("step_numbers_as_strings_rechained", kinds=("pm",))
def _(run, ctx):
    forge(run, "chain", records=lambda r, m: r.update(step=str(r["step"])))


@case("lambdas_as_string_rechained", kinds=("ada",))
def _(run, ctx):
    forge(run, "chain", records=lambda r, m: r.update(lambdas="0.5"))


@case("extra_column_full_forge", kinds=("pm",))
def _(run, ctx):
    forge(run, "full", records=lambda r, m: r.update(note="forged"))


@case("record_hashes_as_ints_not_rechained", kinds=("pm",))
def _(run, ctx):
    forge(run, "none", records=lambda r, m: r.update(record_hash=int(r["record_hash"][:12], 16)))


# -- chunks ----------------------------------------------------------------------------------------
@case("chunks_swapped_files")
def _(run, ctx):
    a, b = chunk_files(run)[:2]
    tmp = a.with_name("swap.tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


@case("chunks_reordered_full_forge", kinds=("pm",))
def _(run, ctx):
    forge(run, "full", chunks_edit=lambda c, m: [c[1], c[0]] + c[2:])


@case("chunk_duplicated_as_new_chunk")
def _(run, ctx):
    shutil.copy(chunk_files(run)[-1], run / "steps" / f"chunk-{len(chunk_files(run)):06d}.parquet")


@case("chunk_duplicated_full_forge", kinds=("pm",))
def _(run, ctx):
    import copy

    forge(run, "full", chunks_edit=lambda c, m: c + [copy.deepcopy(c[-1])])


@case("first_chunk_deleted")
def _(run, ctx):
    chunk_files(run)[0].unlink()


@case("last_chunk_deleted", quick=True)
def _(run, ctx):
    chunk_files(run)[-1].unlink()


def _truncate(run: Path) -> None:
    """Delete the last chunk and its payload, shrink the manifest's queries, re-chain, recompute
    ledger and final: a consistent shorter run."""
    last = len(chunk_files(run)) - 1
    kept = sum(len(c) for c in load_chunks(run)[:last])
    chunk_files(run)[-1].unlink()
    (run / "replay" / f"block-{last:06d}.npy").unlink(missing_ok=True)

    def edit(manifest):
        manifest["config"]["queries"] = kept
        reconcile(manifest)
    forge(run, "full", manifest_edit=edit)


@case("truncated_full_forge_expect_head", expect=(1,), anchored=True, quick=True)
def _(run, ctx):
    _truncate(run)


@case("truncated_full_forge", limit="a truncated, consistently re-chained run is a valid shorter run; "
                                    "only the published head detects it")
def _(run, ctx):
    _truncate(run)


@case("chunk_with_zero_rows", kinds=("pm",))
def _(run, ctx):
    import pyarrow.parquet as pq

    path = chunk_files(run)[-1]
    table = pq.read_table(path)
    pq.write_table(table.slice(0, 0), path)


@case("chunk_empty_file")
def _(run, ctx):
    replace_bytes(chunk_files(run)[0], b"")


@case("chunk_garbage_bytes", kinds=("pm",))
def _(run, ctx):
    replace_bytes(chunk_files(run)[0], os.urandom(5000))


@case("chunk_truncated_file", kinds=("ada",))
def _(run, ctx):
    data = chunk_files(run)[-1].read_bytes()
    replace_bytes(chunk_files(run)[-1], data[: len(data) // 2])


@case("chunk_from_other_run")
def _(run, ctx):
    shutil.copy(chunk_files(ctx["other"])[0], chunk_files(run)[0])


@case("chunk_from_other_run_full_forge")
def _(run, ctx):
    other = load_chunks(ctx["other"])
    forge(run, "chain", chunks_edit=lambda c, m: [other[0]] + c[1:])
    try:  # the records do not fit this manifest: the ledger may not be computable
        write_ledger(run, compute_ledger(read_json(run / "manifest.json"), load_chunks(run)))
    except Exception:  # noqa: BLE001
        pass
    write_final(run)


@case("chunk_symlink_to_other_run", kinds=("pm",))
def _(run, ctx):
    chunk_files(run)[0].unlink()
    (run / "steps" / "chunk-000000.parquet").symlink_to(chunk_files(ctx["other"])[0])


@case("stray_copy_in_steps", quick=True)
def _(run, ctx):
    shutil.copy(chunk_files(run)[0], run / "steps" / "chunk-000001 (copy).parquet")


@case("stray_directory_in_steps", kinds=("pm",))
def _(run, ctx):
    (run / "steps" / "old").mkdir()


@case("chunk_path_is_directory", kinds=("pm",))
def _(run, ctx):
    (run / "steps" / f"chunk-{len(chunk_files(run)):06d}.parquet").mkdir()


@case("stray_uncommitted_temp_chunk", kinds=("pm",), expect=(0, 1, 2, 3))
def _(run, ctx):  # an interrupted atomic write: never committed, ignored by design (benign)
    shutil.copy(chunk_files(run)[0], run / "steps" / ".chunk-000009.parquet.tmp-4242")


@case("steps_is_a_file", kinds=("pm",))
def _(run, ctx):
    shutil.rmtree(run / "steps")
    (run / "steps").write_text("not a directory")


# -- ledger.json -----------------------------------------------------------------------------------
def _lower_epsilons(ledger: dict) -> None:
    for entry in ledger["epsilon"]:
        entry["epsilon"] = entry["epsilon"] / 10
    for row in ledger["breakdown"]["rows"]:
        row["epsilon"] = row["epsilon"] / 10


@case("ledger_epsilon_lowered", quick=True)
def _(run, ctx):
    edit_ledger(run, _lower_epsilons, refinal=False)


@case("ledger_epsilon_lowered_final_recomputed", quick=True)
def _(run, ctx):
    edit_ledger(run, _lower_epsilons)


@case("ledger_curve_values_lowered_final_recomputed")
def _(run, ctx):
    def edit(ledger):
        for component in ledger["ledger"]["components"].values():
            component["values"] = [v / 2 if isinstance(v, float) else v for v in component["values"]]
    edit_ledger(run, edit)


@case("ledger_data_dependent_flipped_final_recomputed")
def _(run, ctx):
    edit_ledger(run, lambda l: l.update(data_dependent=not l["data_dependent"]))


@case("ledger_perplexity_edited_final_recomputed")
def _(run, ctx):
    edit_ledger(run, lambda l: l.update(perplexity=l["perplexity"] * 0.8))


@case("ledger_answered_by_public_edited_final_recomputed")
def _(run, ctx):
    edit_ledger(run, lambda l: l.update(answered_by_public=l["answered_by_public"] + 3))


@case("ledger_orders_edited_final_recomputed")
def _(run, ctx):
    def edit(ledger):
        for entry in ledger["epsilon"]:
            entry["order"] = 2.0
    edit_ledger(run, edit)


@case("ledger_relation_edited_final_recomputed")
def _(run, ctx):
    edit_ledger(run, lambda l: l.update(relation="remove_one" if l["relation"] != "remove_one" else "add_one"))


@case("ledger_claimed_relation_edited_final_recomputed", kinds=("ada",))
def _(run, ctx):
    edit_ledger(run, lambda l: l.update(claimed_relation="remove_one"))


@case("ledger_accounting_edited_final_recomputed")
def _(run, ctx):
    edit_ledger(run, lambda l: l.update(accounting="realised-path"))


@case("ledger_deltas_edited_final_recomputed")
def _(run, ctx):
    def edit(ledger):
        for entry in ledger["epsilon"]:
            entry["delta"] = 1e-3
        ledger["breakdown"]["delta"] = 1e-3
    edit_ledger(run, edit)


@case("ledger_key_removed_final_recomputed", kinds=("pm",))
def _(run, ctx):
    edit_ledger(run, lambda l: l.pop("warnings"))


@case("ledger_extra_key_final_recomputed", kinds=("pm",))
def _(run, ctx):
    edit_ledger(run, lambda l: l.update(certified=True))


@case("ledger_epsilon_nan_final_recomputed")
def _(run, ctx):
    edit_ledger(run, lambda l: l["epsilon"][0].update(epsilon=float("nan")))


@case("ledger_epsilon_infinity_final_recomputed", kinds=("pm",))
def _(run, ctx):
    edit_ledger(run, lambda l: l["epsilon"][0].update(epsilon=float("inf")))


@case("ledger_epsilon_as_string_final_recomputed", kinds=("pm",))
def _(run, ctx):
    edit_ledger(run, lambda l: l.update(epsilon="0.1"))


@case("ledger_epsilon_entry_value_string_final_recomputed", kinds=("pm",))
def _(run, ctx):
    edit_ledger(run, lambda l: l["epsilon"][0].update(epsilon="0.1"))


@case("ledger_breakdown_as_list_final_recomputed", kinds=("pm",))
def _(run, ctx):
    edit_ledger(run, lambda l: l.update(breakdown=[1, 2]))


@case("ledger_breakdown_rows_junk_final_recomputed", kinds=("ada",))
def _(run, ctx):
    edit_ledger(run, lambda l: l["breakdown"].update(rows=[{"epsilon": "x"}, 5]))


@case("ledger_steps_as_string_final_recomputed", kinds=("pm",))
def _(run, ctx):
    edit_ledger(run, lambda l: l.update(steps=str(l["steps"])))


@case("ledger_inner_ledger_as_list_final_recomputed", kinds=("ada",))
def _(run, ctx):
    edit_ledger(run, lambda l: l.update(ledger=[]))


@case("ledger_non_utf8", kinds=("pm",))
def _(run, ctx):
    data = (run / "ledger.json").read_bytes()
    replace_bytes(run / "ledger.json", data[:10] + b"\xff\xfe" + data[12:])


@case("ledger_non_utf8_final_recomputed", kinds=("ada",))
def _(run, ctx):
    data = (run / "ledger.json").read_bytes()
    replace_bytes(run / "ledger.json", data.replace(b'"accounting"', b'"acc\xe9unting"'))
    write_final(run)


@case("ledger_empty_file")
def _(run, ctx):
    replace_bytes(run / "ledger.json", b"")


@case("ledger_json_array_final_recomputed", kinds=("pm",))
def _(run, ctx):
    replace_bytes(run / "ledger.json", b"[1, 2, 3]\n")
    write_final(run)


@case("ledger_literal_NaN_and_Infinity_final_recomputed", kinds=("ada",))
def _(run, ctx):
    text = (run / "ledger.json").read_text()
    text = text.replace('"answered_by_public": 0', '"answered_by_public": NaN', 1)
    text = text.replace('"perplexity": ', '"perplexity": Infinity, "x_perplexity": ', 1)
    replace_bytes(run / "ledger.json", text.encode())
    write_final(run)


@case("ledger_utf8_bom", kinds=("pm",))
def _(run, ctx):
    replace_bytes(run / "ledger.json", b"\xef\xbb\xbf" + (run / "ledger.json").read_bytes())
    write_final(run)


@case("ledger_is_directory", kinds=("pm",))
def _(run, ctx):
    (run / "ledger.json").unlink()
    (run / "ledger.json").mkdir()


@case("ledger_is_fifo", kinds=("pm",), timeout=15)
def _(run, ctx):
    (run / "ledger.json").unlink()
    os.mkfifo(run / "ledger.json")


@case("ledger_deleted", kinds=("ada",))
def _(run, ctx):
    (run / "ledger.json").unlink()


# -- manifest.json ---------------------------------------------------------------------------------
@case("manifest_beta_edited_not_rechained", quick=True)
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m["mechanism"]["params"].update(beta=m["mechanism"]["params"]["beta"] * 2))


@case("manifest_beta_edited_full_forge")
def _(run, ctx):
    def edit(manifest):
        manifest["config"]["mechanism"]["beta"] *= 2
        reconcile(manifest)
    forge(run, "full", manifest_edit=edit)


@case("manifest_alpha_edited_full_forge", kinds=("pm",))
def _(run, ctx):
    def edit(manifest):
        manifest["config"]["mechanism"]["alpha"] = 8.0
        reconcile(manifest)
    forge(run, "full", manifest_edit=edit)


@case("manifest_sigma_raised_full_forge", kinds=("ada",))
def _(run, ctx):  # a larger sigma claims a cheaper screen
    def edit(manifest):
        manifest["config"]["mechanism"]["sigma"] = 1.0
        reconcile(manifest)
    forge(run, "full", manifest_edit=edit)


@case("manifest_accounting_realised_path_full_forge", kinds=("ada",),
      limit="relabelling the accounting is honest when no screen failed (both accountings charge every step the "
            "same); only the published head detects it")
def _(run, ctx):
    def edit(manifest):
        manifest["config"]["mechanism"]["accounting"] = "realised-path"
        reconcile(manifest)
    forge(run, "full", manifest_edit=edit)


@case("manifest_params_only_edited_full_forge", kinds=("ada",))
def _(run, ctx):  # mechanism.params disagree with config.mechanism
    forge(run, "full", manifest_edit=lambda m: m["mechanism"]["params"].update(sigma=1.0))


@case("manifest_model_hash_edited_not_rechained")
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m["models"][1].update(content_hash="0" * 64))


@case("manifest_model_hash_edited_full_forge")
def _(run, ctx):
    forge(run, "full", manifest_edit=lambda m: m["models"][1].update(content_hash="0" * 64))


@case("manifest_models_dropped_full_forge", kinds=("pm",))
def _(run, ctx):
    forge(run, "full", manifest_edit=lambda m: m.update(models=[]))


@case("manifest_queries_edited_not_rechained")
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m.update(queries=m["queries"] * 2))


@case("manifest_queries_edited_full_forge", kinds=("pm",))
def _(run, ctx):
    def edit(manifest):
        manifest["config"]["queries"] *= 2
        reconcile(manifest)
    forge(run, "full", manifest_edit=edit)


@case("manifest_seed_edited_not_rechained", kinds=("pm",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m.update(seeds={"run": 8}))


@case("manifest_seed_edited_full_forge")
def _(run, ctx):
    def edit(manifest):
        manifest["config"]["seed"] += 1
        reconcile(manifest)
    forge(run, "full", manifest_edit=edit)


@case("manifest_canary_edited_not_rechained", kinds=("ada",), game=True)
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m["canaries"][0].update(secret="AAAA0000"))


@case("manifest_canaries_removed_full_forge", kinds=("ada",), game=True,
      limit="the canaries are metadata for the sampled game; a consistent re-chain is detected by the head only")
def _(run, ctx):
    forge(run, "full", manifest_edit=lambda m: m.update(canaries=[]))


@case("manifest_from_other_run", quick=True)
def _(run, ctx):
    shutil.copy(ctx["other"] / "manifest.json", run / "manifest.json")


@case("manifest_from_other_run_full_forge")
def _(run, ctx):
    shutil.copy(ctx["other"] / "manifest.json", run / "manifest.json")
    forge(run, "chain")
    write_final(run)


@case("manifest_mechanism_swapped_full_forge", kinds=("ada",))
def _(run, ctx):
    def edit(manifest):
        manifest["config"]["mechanism"] = dict(PMIXED)
        reconcile(manifest)
    forge(run, "chain", manifest_edit=edit)
    try:
        write_ledger(run, compute_ledger(read_json(run / "manifest.json"), load_chunks(run)))
    except Exception:  # noqa: BLE001
        pass
    write_final(run)


@case("manifest_delta_edited_not_rechained")
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m["config"].update(deltas=[1e-3]))


def _delta_forge(run: Path) -> None:
    def edit(manifest):
        manifest["config"]["deltas"] = [1e-3]
        reconcile(manifest)
    forge(run, "full", manifest_edit=edit)


@case("manifest_delta_edited_full_forge", limit="the same charges reported at a weaker delta are honest numbers "
                                              "for that delta; only the published head detects the change")
def _(run, ctx):
    _delta_forge(run)


@case("manifest_relation_edited_not_rechained", kinds=("pm",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m.update(relation="remove_one"))


@case("manifest_relation_remove_one_full_forge", kinds=("ada",))
def _(run, ctx):
    def edit(manifest):
        manifest["config"]["relation"] = "remove_one"
        reconcile(manifest)
    forge(run, "full", manifest_edit=edit)


@case("manifest_n_teachers_edited_not_rechained", kinds=("pm",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m.update(n_teachers=2))


@case("manifest_orders_trimmed_full_forge", kinds=("pm",))
def _(run, ctx):
    forge(run, "chain", manifest_edit=lambda m: m.update(orders=m["orders"][:5]))
    write_final(run)


@case("manifest_component_relations_as_list", kinds=("ada",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m["mechanism"].update(component_relations=["add_or_remove_one"]))


@case("manifest_component_relations_junk_value", kinds=("pm",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m["mechanism"].update(
        component_relations={k: "banana" for k in m["mechanism"]["components"]}))


@case("manifest_components_edited_not_rechained", kinds=("ada",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m["mechanism"].update(components={"screen": False}))


@case("manifest_components_as_list", kinds=("pm",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m["mechanism"].update(components=["pmixed_theorem_3_1"]))


@case("manifest_orders_as_strings", kinds=("pm",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m.update(orders=[str(v) for v in m["orders"]]))


@case("manifest_data_as_list", kinds=("pm",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m.update(data=[]))


@case("manifest_config_data_as_list", kinds=("pm",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m["config"].update(data=[1]))


@case("manifest_config_deltas_as_string_full_forge", kinds=("pm",))
def _(run, ctx):
    forge(run, "chain", manifest_edit=lambda m: m["config"].update(deltas="1e-5"))
    write_final(run)


@case("manifest_beta_nan_not_rechained", kinds=("pm",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: (m["mechanism"]["params"].update(beta=float("nan")),
                                      m["config"]["mechanism"].update(beta=float("nan"))))


@case("manifest_beta_infinity_full_forge", kinds=("pm",))
def _(run, ctx):
    def edit(manifest):
        manifest["config"]["mechanism"]["beta"] = float("inf")
        manifest["mechanism"]["params"]["beta"] = float("inf")
    forge(run, "full", manifest_edit=edit)


@case("manifest_n_teachers_as_string", kinds=("ada",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m.update(n_teachers="3"))


@case("manifest_vocab_size_zero_full_forge", kinds=("pm",))
def _(run, ctx):
    forge(run, "full", manifest_edit=lambda m: m.update(vocab_size=0))


@case("manifest_vocab_size_huge_full_forge", kinds=("ada",))
def _(run, ctx):
    forge(run, "full", manifest_edit=lambda m: m.update(vocab_size=10 ** 12))


@case("manifest_schema_version_1", kinds=("pm",))
def _(run, ctx):
    edit_manifest_raw(run, lambda m: m.update(schema_version=1))


@case("manifest_non_utf8")
def _(run, ctx):
    replace_bytes(run / "manifest.json", (run / "manifest.json").read_bytes().replace(b'"format"', b'"f\xf6rmat"'))


@case("manifest_empty_file", kinds=("pm",))
def _(run, ctx):
    replace_bytes(run / "manifest.json", b"")


@case("manifest_json_array", kinds=("ada",))
def _(run, ctx):
    replace_bytes(run / "manifest.json", b"[]")


@case("manifest_literal_NaN_not_rechained", kinds=("ada",))
def _(run, ctx):
    text = (run / "manifest.json").read_text().replace('"beta": 0.002', '"beta": NaN')
    replace_bytes(run / "manifest.json", text.encode())


@case("manifest_deleted", kinds=("pm",))
def _(run, ctx):
    (run / "manifest.json").unlink()


@case("manifest_started_at_edited_full_forge", kinds=("pm",),
      limit="start time and versions are metadata; a consistent re-chain is detected by the head only")
def _(run, ctx):
    forge(run, "full", manifest_edit=lambda m: m.update(started_at="2020-01-01T00:00:00+00:00"))


# -- final.json ------------------------------------------------------------------------------------
@case("final_head_edited", quick=True)
def _(run, ctx):
    edit_final(run, lambda f: f.update(head="f" * 64), rehead=False)


@case("final_steps_edited_head_recomputed")
def _(run, ctx):
    edit_final(run, lambda f: f.update(steps=f["steps"] - 1))


@case("final_extra_field_head_recomputed", kinds=("pm",))
def _(run, ctx):
    edit_final(run, lambda f: f.update(verified=True))


@case("final_steps_as_string_head_recomputed", kinds=("ada",))
def _(run, ctx):
    edit_final(run, lambda f: f.update(steps=str(f["steps"])))


@case("final_from_other_run")
def _(run, ctx):
    shutil.copy(ctx["other"] / "final.json", run / "final.json")


@case("final_deleted", kinds=("pm",))
def _(run, ctx):
    (run / "final.json").unlink()


@case("final_empty_file", kinds=("ada",))
def _(run, ctx):
    replace_bytes(run / "final.json", b"")


@case("final_non_utf8", kinds=("pm",))
def _(run, ctx):
    replace_bytes(run / "final.json", b"\x80" + (run / "final.json").read_bytes())


@case("final_literal_NaN", kinds=("pm",))
def _(run, ctx):
    replace_bytes(run / "final.json", (run / "final.json").read_text().replace('"blocks": 2', '"blocks": NaN').encode())


@case("final_json_array", kinds=("pm",))
def _(run, ctx):
    replace_bytes(run / "final.json", b'["head"]')


@case("final_head_as_list", kinds=("ada",))
def _(run, ctx):
    edit_final(run, lambda f: f.update(head=[f["head"]]), rehead=False)


@case("expect_head_of_other_run", expect=(1,), quick=True)
def _(run, ctx):
    return ["--expect-head", read_json(ctx["other"] / "final.json")["head"]]


@case("expect_head_malformed", kinds=("pm",), expect=(2,))
def _(run, ctx):
    return ["--expect-head", "XYZ"]


# -- replay payload --------------------------------------------------------------------------------
def _payload(run: Path, index: int = 0) -> Path:
    return run / "replay" / f"block-{index:06d}.npy"


@case("payload_logits_edited", quick=True)
def _(run, ctx):
    import numpy as np

    logits = np.load(_payload(run))
    logits[1:, :, :] += 0.5 * (logits[0:1] - logits[1:])
    np.save(_payload(run), logits)


@case("payload_logits_edited_hash_rechained_full_forge")
def _(run, ctx):
    forge_payload(run, 0, lambda l: l + 0.01 * (l[0:1] - l), recompute_records=False)


def _teachers_like_public(logits):
    logits[1:] = logits[0:1] + 0.05 * (logits[1:] - logits[0:1])  # teachers agree: smaller losses
    return logits


@case("payload_forged_records_recomputed_full_forge", quick=True)
def _(run, ctx):
    forge_payload(run, 0, _teachers_like_public, recompute_records=True)


@case("payload_forged_records_recomputed_model_hash_edited_full_forge")
def _(run, ctx):
    """The models are present at the recorded paths, but the forger also edits one recorded model
    content hash, so the audit stops cross-checking the payload against them."""
    forge_payload(run, 0, _teachers_like_public, recompute_records=True)
    forge(run, "full", manifest_edit=lambda m: m["models"][0].update(content_hash="0" * 64))


@case("payload_forged_records_recomputed_models_nowhere_full_forge",
      limit="forged logits in a consistently re-chained run whose recorded models are absent cannot be told from "
            "a genuine run without the head")
def _(run, ctx):
    forge_payload(run, 0, _teachers_like_public, recompute_records=True)
    forge(run, "full", manifest_edit=_models_nowhere)


@case("payload_garbage_hash_rechained", kinds=("pm",))
def _(run, ctx):
    data = os.urandom(_payload(run).stat().st_size)
    _payload(run).write_bytes(data)
    forge_payload_hash(run, 0)


def forge_payload_hash(run: Path, block: int) -> None:
    """Chain whatever bytes the block's payload file now holds."""
    from dpledger.decoding import trace

    sha = trace.file_sha256(_payload(run, block))
    forge(run, "full", records=lambda r, m: r.update(payload_sha256=sha) if r["block"] == block else None)


@case("payload_wrong_shape_hash_rechained", kinds=("ada",))
def _(run, ctx):
    import numpy as np

    np.save(_payload(run), np.load(_payload(run))[:, :5, :])
    forge_payload_hash(run, 0)


@case("payload_int_dtype_hash_rechained", kinds=("pm",))
def _(run, ctx):
    import numpy as np

    np.save(_payload(run), np.load(_payload(run)).astype(np.int32))
    forge_payload_hash(run, 0)


@case("payload_2d_hash_rechained", kinds=("pm",))
def _(run, ctx):
    import numpy as np

    np.save(_payload(run), np.load(_payload(run))[0])
    forge_payload_hash(run, 0)


@case("payload_pickled_object_hash_rechained", kinds=("ada",))
def _(run, ctx):
    import numpy as np

    np.save(_payload(run), np.array([{"a": 1}], dtype=object), allow_pickle=True)
    forge_payload_hash(run, 0)


@case("payload_nan_logits_hash_rechained", kinds=("pm",))
def _(run, ctx):
    def nan(logits):
        logits[2, 3, :] = float("nan")
        return logits
    forge_payload(run, 0, nan, recompute_records=False)


@case("payload_empty_file", kinds=("ada",))
def _(run, ctx):
    replace_bytes(_payload(run, 1), b"")


@case("payload_stray_file", kinds=("pm",))
def _(run, ctx):
    shutil.copy(_payload(run), run / "replay" / "block-000000 (copy).npy")


@case("replay_dir_is_a_file", kinds=("pm",), expect=(0, 1, 2, 3))  # = payload deleted
def _(run, ctx):
    shutil.rmtree(run / "replay")
    (run / "replay").write_text("x")


def _models_nowhere(manifest: dict) -> None:
    for i, model in enumerate(manifest["models"]):
        model["source"] = f"/nonexistent/dpledger-adversary/model-{i}"
    manifest["config"]["models"]["public"] = manifest["models"][0]["source"]
    manifest["config"]["models"]["teacher_paths"] = [m["source"] for m in manifest["models"][1:]]
    manifest["config"]["models"]["tokenizer"] = "/nonexistent/dpledger-adversary/tokenizer"
    reconcile(manifest)


@case("payload_deleted_models_present", expect=(0,))
def _(run, ctx):  # control: users delete payloads; the replay then re-runs the models
    shutil.rmtree(run / "replay")


@case("payload_deleted_model_paths_nowhere_full_forge", expect=(3,), quick=True)
def _(run, ctx):
    shutil.rmtree(run / "replay")
    forge(run, "full", manifest_edit=_models_nowhere)


@case("payload_deleted_model_paths_nowhere_charges_halved_full_forge", expect=(1, 3))
def _(run, ctx):
    shutil.rmtree(run / "replay")
    forge(run, "full", manifest_edit=_models_nowhere, records=scale_charges(0.5))


@case("payload_deleted_models_moved_away", expect=(3,), quick=True)
def _(run, ctx):
    shutil.rmtree(run / "replay")
    return {"move": ["models"]}


@case("payload_block1_deleted_models_moved_away", kinds=("ada",), expect=(3,))
def _(run, ctx):
    _payload(run, 1).unlink()
    return {"move": ["models"]}


@case("payload_deleted_models_moved_charges_halved_full_forge", expect=(1, 3))
def _(run, ctx):
    shutil.rmtree(run / "replay")
    forge(run, "full", records=scale_charges(0.5))
    return {"move": ["models"]}


@case("data_text_moved_away_payload_present", expect=(0,))
def _(run, ctx):  # control: an auditor without the run's text file; nothing was changed
    return {"move": ["text"]}


@case("payload_deleted_models_and_text_moved_away", expect=(3,))
def _(run, ctx):
    shutil.rmtree(run / "replay")
    return {"move": ["models", "text"]}


# -- whole directory -------------------------------------------------------------------------------
@case("run_dir_locked_by_a_writer", kinds=("pm",), expect=(2,))
def _(run, ctx):
    return {"lock": True}


@case("run_dir_is_a_file", kinds=("pm",), expect=(2,))
def _(run, ctx):
    shutil.rmtree(run)
    run.write_text("x")


@case("run_dir_empty", kinds=("pm",), expect=(2,))
def _(run, ctx):
    shutil.rmtree(run)
    run.mkdir()


@case("untouched_copy_expect_head", expect=(0,), anchored=True, quick=True)
def _(run, ctx):  # control
    pass


def run_tampering(worker: Worker, bases: dict, assets: dict, work: Path, quick: bool) -> tuple[dict, dict]:
    results, report_results = [], []
    limits, observations = [], []
    cases = [c for c in CASES if c["quick"] or not quick]
    for spec in cases:
        for kind in spec["kinds"]:
            base = bases[kind]
            other = bases["pm" if kind == "ada" else "ada"]
            variants = [False] if spec["limit"] is None else [False, True]
            for anchored_variant in variants:
                name = f"{spec['name']}[{kind}]" + ("+expect_head" if anchored_variant else "")
                run = work / f"{spec['name']}-{kind}-{int(anchored_variant)}"
                shutil.rmtree(run, ignore_errors=True)
                shutil.copytree(base["dir"], run, symlinks=True)
                ctx = {"other": other["dir"], "head": base["head"]}
                entry = {"case": name}
                try:
                    extra = spec["fn"](run, ctx)
                except Exception:  # noqa: BLE001 - a harness problem, reported as such
                    entry.update(clean=False, what="harness could not apply the tampering: "
                                                   + traceback.format_exc().strip().splitlines()[-1])
                    results.append(entry)
                    continue
                options = extra if isinstance(extra, dict) else {}
                args = (extra if isinstance(extra, list) else [])
                if spec["anchored"] or anchored_variant:
                    args = args + ["--expect-head", base["head"]]
                flags = GAME_FLAGS if spec["game"] else AUDIT_FLAGS
                moved = []
                lock = None
                try:
                    for what in options.get("move", []):
                        source = assets[what]
                        source.rename(source.with_name(source.name + ".away"))
                        moved.append(source)
                    if options.get("lock"):
                        lock = open(run / ".lock", "a+")
                        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    result = worker.cli(["audit", str(run), *flags, *args], timeout=spec["timeout"])
                    if not options.get("lock"):
                        report = worker.cli(["report", str(run), "--format", "md"], timeout=spec["timeout"])
                    else:
                        report = None
                finally:
                    for source in moved:
                        source.with_name(source.name + ".away").rename(source)
                    if lock is not None:
                        lock.close()
                expect = {1} if anchored_variant else spec["expect"]
                problem = problem_of(result)
                entry.update(outcome=short(result), seconds=result.get("seconds"))
                if problem is None and result["rc"] == 0 and spec["identical"]:
                    observations.append({"case": name, "outcome": "PASS", "why": spec["identical"]})
                if problem is None and result["rc"] not in expect:
                    if result["rc"] == 0 and spec["limit"] and not anchored_variant:
                        limits.append({"case": name, "outcome": "PASS without --expect-head (FAIL with it: see "
                                                                "the +expect_head case)", "why": spec["limit"]})
                        entry.update(clean=True, limit=True)
                        results.append(entry)
                        continue
                    want = "/".join(str(c) for c in sorted(expect))
                    problem = ("PASS (exit 0) on a changed run" if result["rc"] == 0 and 0 not in expect
                               else f"exit {result['rc']}, expected exit {want}")
                    problem += ": " + short(result)
                entry.update(clean=problem is None, **({"what": problem} if problem else {}))
                if problem is not None and result.get("rc") == 1:
                    entry["failed_checks"] = [l.strip()[:400] for l in result["stdout"].splitlines()
                                              if l.strip().startswith("[FAIL")][:4]
                results.append(entry)
                if report is not None:
                    report_results.append(_judge_report(name, report, result))
    return _summarise(results, limits=limits, observations=observations), _summarise(report_results)


def report_verdicts(markdown: str) -> list[str]:
    """The audit verdicts a Markdown report prints: "Verdict: X", "Audit verdict: X" and the first
    word of the comparison table's audit column (per-check PASS rows are not verdicts)."""
    import re

    verdicts = re.findall(r"(?:Audit verdict|Verdict): ([A-Z]+)", markdown)
    lines = markdown.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("|") and line.rstrip().endswith("| audit |"):
            for row in lines[index + 2:]:
                if not row.startswith("|"):
                    break
                cell = row.rstrip().rstrip("|").split("|")[-1].strip()
                verdicts.append(cell.split(" ")[0] if cell else "")
    return verdicts


def _judge_report(name: str, report: dict, audit_result: dict) -> dict:
    problem = problem_of(report)
    if problem is None and report["rc"] not in (0, 2):
        problem = f"exit {report['rc']}: " + short(report)
    if problem is None and report["rc"] == 0 and "PASS" in report_verdicts(report["stdout"]) \
            and audit_result.get("rc") != 0:
        problem = "report prints a PASS verdict although the audit of these files did not pass"
    return {"case": name, "clean": problem is None, "outcome": short(report), **({"what": problem} if problem else {})}


def run_stale_reports(worker: Worker, bases: dict, work: Path, quick: bool) -> list[dict]:
    """A PASS audit.json beside files it did not audit: the report must say STALE and never PASS."""
    results = []
    cases = {
        "pass_audit_json_beside_lowered_ledger": lambda run, other: edit_ledger(run, _lower_epsilons, refinal=False),
        "pass_audit_json_beside_lowered_ledger_final_recomputed": lambda run, other: edit_ledger(run, _lower_epsilons),
        "pass_audit_json_beside_full_forge": lambda run, other: forge(run, "full", records=scale_charges(0.5)),
        "pass_audit_json_beside_rechained_manifest_edit": lambda run, other: forge(
            run, "full", manifest_edit=lambda m: m.update(started_at="2020-01-01T00:00:00+00:00")),
        "pass_audit_json_of_other_run": None,
        "audit_json_garbage": None,
        "audit_json_non_utf8": None,
        "audit_json_audited_as_string": None,
        "audit_json_array": None,
    }
    if quick:
        cases = {k: v for k, v in list(cases.items())[:2]}
    for kind in ("ada", "pm") if not quick else ("pm",):
        base = bases[kind]
        other = bases["pm" if kind == "ada" else "ada"]
        passed_dir = work / f"stale-pass-{kind}"
        shutil.rmtree(passed_dir, ignore_errors=True)
        shutil.copytree(base["dir"], passed_dir)
        first = worker.cli(["audit", str(passed_dir), *AUDIT_FLAGS], timeout=60)
        if first.get("rc") != 0:
            results.append({"case": f"stale_setup[{kind}]", "clean": False,
                            "what": "the untouched copy does not PASS: " + short(first)})
            continue
        audit_json = (passed_dir / "audit.json").read_bytes()
        other_dir = work / f"stale-other-{kind}"
        shutil.rmtree(other_dir, ignore_errors=True)
        shutil.copytree(other["dir"], other_dir)
        worker.cli(["audit", str(other_dir), *AUDIT_FLAGS], timeout=60)
        for name, tamper in cases.items():
            run = work / f"stale-{name}-{kind}"
            shutil.rmtree(run, ignore_errors=True)
            shutil.copytree(base["dir"], run)
            data = audit_json
            if tamper is not None:
                tamper(run, other["dir"])
            elif name == "pass_audit_json_of_other_run":
                data = (other_dir / "audit.json").read_bytes()
            elif name == "audit_json_garbage":
                data = b"{garbage"
            elif name == "audit_json_non_utf8":
                data = audit_json.replace(b'"PASS"', b'"P\xc4SS"', 1)
            elif name == "audit_json_audited_as_string":
                value = json.loads(audit_json)
                value["audited"] = "everything"
                data = json.dumps(value).encode()
            elif name == "audit_json_array":
                data = b"[]"
            (run / "audit.json").write_bytes(data)
            report = worker.cli(["report", str(run), "--format", "md"], timeout=60)
            problem = problem_of(report)
            if problem is None and report["rc"] != 0:
                problem = "report refused the run: " + short(report)
            if problem is None and "PASS" in report_verdicts(report["stdout"]):
                problem = "report prints a PASS verdict beside files the audit did not see"
            if problem is None and name.startswith("pass_audit") and "STALE" not in report["stdout"]:
                problem = "report does not say STALE"
            results.append({"case": f"{name}[{kind}]", "clean": problem is None, "outcome": short(report),
                            **({"what": problem} if problem else {})})
    return results


def _summarise(results: list[dict], **extra) -> dict:
    return {"tried": len(results), "clean": sum(1 for r in results if r.get("clean")),
            "failures": [{"case": r["case"], "what": r.get("what", "")} for r in results if not r.get("clean")],
            **extra, "cases": results}


# ==================================================================================================
# Category 2: random single-byte flips
# ==================================================================================================

def _canonical_json(data: bytes):
    from dpledger.decoding import trace

    try:
        return trace.canonical_digest("", json.loads(data.decode("utf-8")))
    except Exception:  # noqa: BLE001 - unreadable: not identical
        return None


def _canonical_parquet(data: bytes):
    import io

    import pyarrow.parquet as pq

    from dpledger.decoding import trace

    try:
        table = pq.read_table(io.BytesIO(data))
        return trace.canonical_digest("", table.to_pylist())
    except Exception:  # noqa: BLE001
        return None


def semantically_identical(kind: str, original: bytes, flipped: bytes) -> bool:
    """The flipped file means the same as the original (as dpledger reads it)."""
    if kind in ("manifest", "ledger", "final"):
        a, b = _canonical_json(original), _canonical_json(flipped)
    elif kind == "chunk":
        a, b = _canonical_parquet(original), _canonical_parquet(flipped)
    else:  # payload: its sha256 is chained, every byte matters
        return False
    return a is not None and a == b


def run_byte_flips(worker: Worker, bases: dict, work: Path, count: int, seed: int) -> dict:
    rng = random.Random(seed)
    copies = {}
    for kind in ("ada", "pm"):
        copy = work / f"flips-{kind}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(bases[kind]["dir"], copy)
        copies[kind] = copy
    results, identical_passes = [], []
    for index in range(count):
        kind = rng.choice(["ada", "pm"])
        run = copies[kind]
        file_kind = rng.choice(["manifest", "ledger", "final", "chunk", "payload"])
        if file_kind in ("manifest", "ledger", "final"):
            path = run / f"{file_kind}.json"
        elif file_kind == "chunk":
            path = rng.choice(chunk_files(run))
        else:
            path = rng.choice(sorted((run / "replay").glob("block-*.npy")))
        original = path.read_bytes()
        offset = rng.randrange(len(original))
        mask = rng.randrange(1, 256)
        flipped = bytearray(original)
        flipped[offset] ^= mask
        flipped = bytes(flipped)
        identical = semantically_identical(file_kind, original, flipped)
        name = f"flip{index:03d}[{kind}] {path.relative_to(run)} byte {offset} ^0x{mask:02x}"
        path.write_bytes(flipped)
        try:
            result = worker.cli(["audit", str(run), *AUDIT_FLAGS], timeout=60)
        finally:
            path.write_bytes(original)
            (run / "audit.json").unlink(missing_ok=True)
        problem = problem_of(result)
        if problem is None and result["rc"] == 0:
            if identical:
                identical_passes.append({"case": name, "note": f"{file_kind} reads the same after the flip "
                                         f"(0x{original[offset]:02x} -> 0x{flipped[offset]:02x})"})
            else:
                problem = "PASS (exit 0) on a changed file that does not read the same"
        if problem is None and result["rc"] == 3:
            problem = "UNVERIFIED although the payload and the models are present: " + short(result)
        results.append({"case": name, "clean": problem is None, "outcome": short(result),
                        "semantically_identical": identical, **({"what": problem} if problem else {})})
    summary = _summarise(results, semantically_identical_passes=identical_passes)
    summary["outcomes"] = {}
    for r in results:
        key = r["outcome"].split(" ")[1] if r["outcome"].startswith("exit") else "other"
        summary["outcomes"][key] = summary["outcomes"].get(key, 0) + 1
    return summary


# ==================================================================================================
# Category 3: bad configs
# ==================================================================================================

def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
    return repr(value)


def toml_text(config: dict) -> str:
    lines = []
    for key, value in config.items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {toml_value(value)}")
    for table, entries in config.items():
        if isinstance(entries, dict):
            lines.append(f"[{table}]")
            lines.extend(f"{k} = {toml_value(v)}" for k, v in entries.items())
    return "\n".join(lines) + "\n"


def bad_config_cases(models, root: Path) -> list[dict]:
    """(name, TOML text or bytes or a path, --out, tokens one of which the error must name)."""
    import copy

    from tests.micro import micro_config

    base = micro_config(models, root / "unused", PMIXED, queries=64)
    ada = micro_config(models, root / "unused", ADAPMIXED, queries=64)
    cases = []

    def add(name, tokens, edit=None, base_config=None, text=None, config_path=None, out=None):
        config = copy.deepcopy(base_config or base)
        if edit is not None:
            edit(config)
        cases.append(dict(name=name, tokens=tokens, text=text if text is not None else toml_text(config),
                          config_path=config_path, out=out))

    def put(table, key, value):
        return lambda c: c.setdefault(table, {}).__setitem__(key, value)

    add("mechanism.beta = \"0.2\"", ["beta", "0.2"], put("mechanism", "beta", "0.2"))
    add("data.block_size = 32.0", ["block_size", "32.0"], put("data", "block_size", 32.0))
    add("run = 5 (not a table)", ["run", "5"], lambda c: c.update(run=5))
    add("mechanism = \"pmixed\" (not a table)", ["mechanism", "pmixed"], lambda c: c.update(mechanism="pmixed"))
    add("data.prompts = \"abc\"", ["prompts", "abc"], lambda c: c["data"].update(stream="generate", prompts="abc"))
    add("run.replay_payload = \"no\"", ["replay_payload", "no"], put("run", "replay_payload", "no"))
    add("run.queries = true", ["queries", "true", "True"], put("run", "queries", True))
    add("run.deltas = []", ["deltas", "[]"], put("run", "deltas", []))
    add("run.deltas = 1e-5", ["deltas", "1e-05"], put("run", "deltas", 1e-5))
    add("run.deltas = [\"1e-5\"]", ["deltas", "1e-5"], put("run", "deltas", ["1e-5"]))
    add("run.deltas = [0.0]", ["delta", "0.0"], put("run", "deltas", [0.0]))
    add("run.deltas = [1.0]", ["delta", "1.0"], put("run", "deltas", [1.0]))
    add("run.deltas = [nan]", ["delta", "nan"], put("run", "deltas", [float("nan")]))
    add("run.relation = 5", ["relation", "5"], put("run", "relation", 5))
    add("run.relation = \"replace_one\"", ["relation", "replace_one"], put("run", "relation", "replace_one"))
    add("run.relation = \"banana\"", ["relation", "banana"], put("run", "relation", "banana"))
    add("models.teachers = \"8\"", ["teachers", "8"], put("models", "teachers", "8"))
    add("models.teachers = 2 (3 teacher_paths)", ["teachers", "2"], put("models", "teachers", 2))
    add("mechanism.teachers = 5", ["teachers", "5"], put("mechanism", "teachers", 5))
    add("mechanism.sigma = 1e-300 (adapmixed)", ["sigma", "1e-300"], put("mechanism", "sigma", 1e-300), ada)
    add("mechanism.sigma = 0", ["sigma", "0"], put("mechanism", "sigma", 0.0), ada)
    add("mechanism.sigma = inf", ["sigma", "inf"], put("mechanism", "sigma", float("inf")), ada)
    add("mechanism.lam = -1", ["lam", "-1"], put("mechanism", "lam", -1.0), ada)
    add("mechanism.threshold = nan", ["threshold", "nan"], put("mechanism", "threshold", float("nan")), ada)
    add("mechanism.top_k = 0", ["top_k", "0"], put("mechanism", "top_k", 0), ada)
    add("mechanism.accounting = \"banana\"", ["accounting", "banana"], put("mechanism", "accounting", "banana"), ada)
    add("mechanism.screening = 1", ["screening", "1"], put("mechanism", "screening", 1), ada)
    add("mechanism.beta = -0.1", ["beta", "-0.1"], put("mechanism", "beta", -0.1))
    add("mechanism.beta = nan", ["beta", "nan"], put("mechanism", "beta", float("nan")))
    add("mechanism.alpha = 1.0", ["alpha", "1.0"], put("mechanism", "alpha", 1.0))
    add("mechanism.alpha = inf", ["alpha", "inf"], put("mechanism", "alpha", float("inf")))
    add("mechanism.sample_rate = 1.5", ["sample_rate", "1.5"], put("mechanism", "sample_rate", 1.5))
    add("mechanism.ball = \"banana\"", ["ball", "banana"], put("mechanism", "ball", "banana"))
    add("mechanism.gamma = 1 (unknown parameter)", ["gamma"], put("mechanism", "gamma", 1))
    add("mechanism.type = \"PMixED\"", ["type", "PMixED"], put("mechanism", "type", "PMixED"))
    add("mechanism.type = 5", ["type", "5"], put("mechanism", "type", 5))
    add("mechanism.type missing", ["type"], lambda c: c["mechanism"].pop("type"))
    add("no [mechanism] table", ["mechanism"], lambda c: c.pop("mechanism"))
    add("run.queries = 0", ["queries", "0"], put("run", "queries", 0))
    add("run.queries = -5", ["queries", "-5"], put("run", "queries", -5))
    add("run.queries = 10000000 (more than the text)", ["queries", "10000000", "10000001", "tokens"],
        put("run", "queries", 10_000_000))
    add("data.block_size = 0", ["block_size", "0"], put("data", "block_size", 0))
    add("data.block_size = 1", ["block_size", "1"], put("data", "block_size", 1))
    add("data.block_size = 1000 (> n_positions)", ["block_size", "1000"], put("data", "block_size", 1000))
    add("data.stream = \"banana\"", ["stream", "banana"], put("data", "stream", "banana"))
    add("data.max_new_tokens = 0 (generate)", ["max_new_tokens", "0"],
        lambda c: c["data"].update(stream="generate", prompts=["Hi"], max_new_tokens=0))
    add("data.prompts = [\"\"] (generate)", ["prompt"],
        lambda c: c["data"].update(stream="generate", prompts=[""]))
    add("models.device = \"cuda\" (no CUDA)", ["cuda", "device"], put("models", "device", "cuda"))
    add("models.device = \"banana\"", ["device", "banana"], put("models", "device", "banana"))
    add("models.teacher_kind = \"lora\" (full checkpoints)", ["lora", "teacher", "adapter"],
        put("models", "teacher_kind", "lora"))
    add("models.public = nonexistent path", ["/nonexistent/public", "public"],
        put("models", "public", "/nonexistent/public"))
    add("models.tokenizer = nonexistent path", ["/nonexistent/tok", "tokenizer"],
        put("models", "tokenizer", "/nonexistent/tok"))
    add("models.embedded = \"yes\"", ["embedded", "yes"], put("models", "embedded", "yes"))
    add("unknown key run.queriez", ["queriez"], put("run", "queriez", 10))
    add("unknown table [extra]", ["extra"], lambda c: c.update(extra={"a": 1}))
    add("run.out = \"\" (no --out)", ["out", "''", "\"\""], put("run", "out", ""), out="")
    directory = root / "a_directory"
    directory.mkdir(exist_ok=True)
    add("data.text is a directory", ["text", str(directory)], put("data", "text", str(directory)))
    latin = root / "latin1.txt"
    latin.write_bytes("Customer: caf\xe9 na\xefve \xff\xfe".encode("latin-1") * 200)
    add("data.text is not UTF-8", ["text", str(latin), "UTF-8"], put("data", "text", str(latin)))
    add("data.text nonexistent", ["text", "/nonexistent/heldout.txt"], put("data", "text", "/nonexistent/heldout.txt"))
    add("config is not UTF-8", ["config", "UTF-8"], text=toml_text(base).encode() + b"\n# caf\xe9\n")
    add("config has invalid TOML", ["TOML"], text="[run\nqueries = 5\n")
    add("config has a duplicate key", ["TOML", "queries"], text=toml_text(base) + "[run]\nqueries = 5\n")
    add("config is empty", ["out", "mechanism", "run"], text="")
    add("config path is a directory", ["config", str(directory)], config_path=str(directory))
    add("config path does not exist", ["config", "/nonexistent/config.toml"], config_path="/nonexistent/config.toml")
    existing = root / "existing_file"
    existing.write_text("keep me")
    add("--out is an existing file", ["out", str(existing)], out=str(existing))
    add("--out under /proc/sys (not writable)", ["/proc/sys", "writable", "Permission", "No such file"],
        out="/proc/sys/dpledger-adversary/run")
    add("--out under /sys (mkdir not permitted)", ["/sys", "permitted", "writable"],
        out="/sys/dpledger-adversary-run")
    return cases


def run_bad_configs(worker: Worker, models, work: Path, quick: bool) -> dict:
    root = work / "configs"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    cases = bad_config_cases(models, root)
    if quick:
        cases = cases[::7]
    results, untestable = [], []
    if os.geteuid() == 0:
        untestable.append({"case": "--out under a chmod 555 parent directory",
                           "why": "running as root: chmod does not restrict root (os.access and mkdir succeed); "
                                  "tested with /proc/sys and /sys instead"})
    for index, spec in enumerate(cases):
        config_path = spec["config_path"]
        if config_path is None:
            config_path = root / f"config-{index:02d}.toml"
            Path(config_path).write_bytes(spec["text"] if isinstance(spec["text"], bytes) else spec["text"].encode())
        out = spec["out"] if spec["out"] is not None else str(root / f"out-{index:02d}")
        watched = Path(out).parent if out else Path(os.environ["ADV_CWD"])
        before = sorted(p.name for p in watched.iterdir()) if watched.is_dir() else None
        existing = Path(out).read_bytes() if out and Path(out).is_file() else None
        result = worker.cli(["decode", str(config_path), "--out", out, "--no-progress"], timeout=120)
        after = sorted(p.name for p in watched.iterdir()) if watched.is_dir() else None
        problem = problem_of(result)
        lines = stderr_lines(result)
        if problem is None and result["rc"] != 2:
            problem = f"exit {result['rc']} (expected 2): " + (" | ".join(lines)[:300] or result["stdout"][:300])
        if problem is None and len(lines) != 1:
            problem = f"{len(lines)} stderr lines (expected 1): " + " | ".join(lines)[:300]
        if problem is None and not any(t.lower() in lines[0].lower() for t in spec["tokens"]):
            problem = f"the error names none of {spec['tokens']}: {lines[0][:300]}"
        created = sorted(set(after or []) - set(before or []))
        if existing is not None and Path(out).read_bytes() != existing:
            created.append(f"{out} (overwritten)")
        if out and existing is None and Path(out).exists() and spec["out"] is None:
            created.append(out)
        if created:
            problem = (problem + "; " if problem else "") + f"wrote {created}"
            for name in set(after or []) - set(before or []):
                target = watched / name
                shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
        results.append({"case": spec["name"], "clean": problem is None,
                        "outcome": f"exit {result.get('rc')}: " + (lines[0][:300] if lines else ""),
                        **({"what": problem} if problem else {})})
    return _summarise(results, untestable=untestable)


# ==================================================================================================
# Category 4: concurrency and kills (real subprocesses)
# ==================================================================================================

def dpledger_command(*args) -> list[str]:
    return [sys.executable, "-m", "dpledger", *map(str, args)]


def spawn(*args) -> subprocess.Popen:
    return subprocess.Popen(dpledger_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env=os.environ.copy(), start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> dict:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return {"hang": timeout, "stdout": stdout.decode(errors="replace"), "stderr": stderr.decode(errors="replace")}
    return {"rc": proc.returncode, "stdout": stdout.decode(errors="replace"), "stderr": stderr.decode(errors="replace"),
            "traceback": None}


def wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None, step: float = 0.005) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            return predicate()
        time.sleep(step)
    return False


def dir_state(run: Path) -> str:
    if not run.exists():
        staging = list(run.parent.glob(f".{run.name}.creating-*"))
        return "nothing yet" + (f" ({len(staging)} creation directory)" if staging else "")
    chunks = len(list((run / "steps").glob("chunk-*.parquet"))) if (run / "steps").is_dir() else 0
    final = (run / "final.json").exists()
    return f"{chunks} chunks" + (", final written" if final else "")


def run_concurrency(worker: Worker, models, work: Path, quick: bool, seed: int) -> dict:
    from tests.micro import micro_config, write_toml

    rng = random.Random(seed + 1)
    root = work / "concurrency"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    results = []

    def record(name, problem, outcome=""):
        results.append({"case": name, "clean": problem is None, "outcome": outcome, **({"what": problem} if problem
                                                                                       else {})})

    def expect_refusal(name, result, phrase, first_running):
        problem = problem_of(result) if "rc" in result else f"hung: {result}"
        if problem is None and result["rc"] != 2:
            problem = f"exit {result['rc']} (expected 2): " + " | ".join(stderr_lines(result))[:300]
        if problem is None and phrase not in stderr_lines(result)[0]:
            problem = f"error does not say '{phrase}': {stderr_lines(result)[0][:300]}"
        if problem is not None and not first_running:
            problem = "inconclusive (the first run had finished): " + problem
        record(name, problem, short(result))

    # (a), (b): second writers while a long run is being written
    long_queries = 600 if quick else 1500
    long_config = write_toml(root / "long.toml", micro_config(models, root / "unused", PMIXED if quick else ADAPMIXED,
                                                              queries=long_queries, block_size=10,
                                                              replay_payload=False))
    first_dir = root / "long-run"
    first = spawn("decode", long_config, "--out", first_dir, "--no-progress")
    started = wait_for(lambda: (first_dir / "manifest.json").exists(), 120, first)
    if not started:
        record("first_run_started", "the first run wrote no manifest: " + str(finish(first))[:300])
    else:
        second_writers = {"resume_while_running": ["decode", long_config, "--out", first_dir, "--resume",
                                                   "--no-progress"],
                          "fresh_decode_while_running": ["decode", long_config, "--out", first_dir, "--no-progress"],
                          "audit_while_running": ["audit", first_dir, "--no-game"]}
        answers = {}
        if quick:  # the warm worker reaches the lock within a second (a new process needs ~5 s)
            for name, argv in second_writers.items():
                answers[name] = worker.cli([str(a) for a in argv], timeout=120)
                answers[name]["first_running"] = first.poll() is None
        else:  # new processes, as a user would start them
            checkers = {name: spawn(*argv) for name, argv in second_writers.items()}
            for name, proc in checkers.items():
                answers[name] = finish(proc)
                answers[name]["first_running"] = first.poll() is None
        expect_refusal("resume_while_running", answers["resume_while_running"],
                       "being written by another dpledger process", answers["resume_while_running"]["first_running"])
        expect_refusal("fresh_decode_while_running", answers["fresh_decode_while_running"], "already holds files",
                       answers["fresh_decode_while_running"]["first_running"])
        expect_refusal("audit_while_running", answers["audit_while_running"], "being written",
                       answers["audit_while_running"]["first_running"])
        done = finish(first)
        problem = problem_of(done) if done.get("rc") != 0 else None
        if done.get("rc") != 0 and problem is None:
            problem = f"exit {done.get('rc')}: " + " | ".join(stderr_lines(done))[:300]
        record("first_run_finishes_despite_second_writers", problem, f"exit {done.get('rc')}")
        audit = worker.cli(["audit", str(first_dir), "--no-game", "--mc-samples", "5"], timeout=400)
        record("first_run_audits_PASS", None if audit.get("rc") == 0 else "audit: " + short(audit), short(audit))

    # (c): SIGKILL at random moments, then --resume; the ledger must equal an uninterrupted run's
    kill_queries = 150 if quick else 400
    kill_config = write_toml(root / "kill.toml", micro_config(models, root / "unused", PMIXED, queries=kill_queries,
                                                              block_size=10, replay_payload=False))
    reference_dir = root / "reference"
    reference = finish(spawn("decode", kill_config, "--out", reference_dir, "--no-progress"))
    if reference.get("rc") != 0:
        record("reference_run", "the uninterrupted run failed: " + short(reference))
        return _summarise(results)
    reference_ledger = (reference_dir / "ledger.json").read_bytes()
    blocks = math.ceil(kill_queries / 10)

    def chunks_of(run):
        return len(list((run / "steps").glob("chunk-*.parquet"))) if (run / "steps").is_dir() else 0

    # moments: before anything exists, while the directory is created, right after the manifest, at
    # the first chunk, after k committed chunks (k random, plus a random few ms), between ledger.json
    # and final.json, and after the end
    moments = [("immediately", None), ("staging directory appears",
                                       lambda run: any(root.glob(f".{run.name}.creating-*")) or run.exists()),
               ("manifest appears", lambda run: (run / "manifest.json").exists()),
               ("first chunk appears", lambda run: chunks_of(run) >= 1),
               ("ledger.json written, final.json not yet", lambda run: (run / "ledger.json").exists())]
    count = 3 if quick else 14
    while len(moments) < count:
        k = rng.randrange(2, blocks)
        moments.append((f"after {k} chunks", lambda run, k=k: chunks_of(run) >= k))
    moments = moments[:count]
    for index, (moment, condition) in enumerate(moments):
        run = root / f"killed-{index:02d}"
        name = f"kill[{index:02d}] {moment}"
        proc = spawn("decode", kill_config, "--out", run, "--no-progress")
        if condition is not None:
            wait_for(lambda condition=condition, run=run: condition(run), 120, proc, step=0.0005)
            if moment.startswith("after"):
                time.sleep(rng.uniform(0, 0.02))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        state = dir_state(run)
        kills = 1
        if index % 3 == 2:  # kill the resume too, once it has committed another chunk
            before = chunks_of(run)
            second = spawn("decode", kill_config, "--out", run, "--resume", "--no-progress")
            wait_for(lambda run=run, before=before: chunks_of(run) > before or (run / "final.json").exists(), 120,
                     second, step=0.0005)
            second.send_signal(signal.SIGKILL)
            second.communicate()
            kills += 1
            state += f"; resume killed at {dir_state(run)}"
        resumed = worker.cli(["decode", str(kill_config), "--out", str(run), "--resume", "--no-progress"], timeout=300)
        problem = problem_of(resumed)
        if problem is None and resumed["rc"] != 0:
            problem = f"--resume after the kill: exit {resumed['rc']}: " + " | ".join(stderr_lines(resumed))[:300]
        if problem is None:
            ledger = (run / "ledger.json").read_bytes() if (run / "ledger.json").exists() else b""
            if ledger != reference_ledger:
                problem = "ledger.json differs from the uninterrupted run's"
            final = read_json(run / "final.json")
            if final.get("steps") != kill_queries:
                problem = f"final.json says {final.get('steps')} steps, expected {kill_queries}"
            leftovers = [p.name for p in root.glob(f".{run.name}.creating-*")]
            leftovers += [p.name for p in (run / "steps").iterdir() if not p.name.startswith("chunk-")]
            if leftovers:
                problem = f"left behind: {leftovers}"
        record(name, problem, f"killed {kills}x ({state}); resume: {short(resumed)}")
        results[-1]["kills"] = kills
    # audit a resumed run (replays every step from the models)
    resumed_dirs = sorted(root.glob("killed-*"))
    if resumed_dirs:
        audit = worker.cli(["audit", str(resumed_dirs[-1]), "--no-game", "--mc-samples", "5"], timeout=300)
        record("resumed_run_audits_PASS", None if audit.get("rc") == 0 else "audit: " + short(audit), short(audit))

    # (d): directories left by a process killed while creating the run directory
    small = write_toml(root / "small.toml", micro_config(models, root / "unused", PMIXED, queries=32, block_size=16))
    for variant in ("abandoned_creation_dir_with_partial_manifest", "abandoned_creation_dir_empty",
                    "creation_dir_held_by_a_live_process", "creation_name_used_by_a_file"):
        target = root / f"created-{variant}"
        staging = root / f".{target.name}.creating-123-abc"
        holder = None
        if variant == "creation_name_used_by_a_file":
            staging.write_text("x")
        else:
            staging.mkdir()
            if variant != "abandoned_creation_dir_empty":
                (staging / "steps").mkdir()
                (staging / "manifest.json").write_text('{"format": "dpledger-tr')
                (staging / ".lock").write_text("pid 123")
            if variant == "creation_dir_held_by_a_live_process":
                holder = open(staging / ".lock", "a+")
                fcntl.flock(holder.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = worker.cli(["decode", str(small), "--out", str(target), "--no-progress"], timeout=120)
        problem = problem_of(result)
        if problem is None and result["rc"] != 0:
            problem = f"decode blocked: exit {result['rc']}: " + " | ".join(stderr_lines(result))[:300]
        if problem is None and variant.startswith("abandoned") and staging.exists():
            problem = "the abandoned creation directory was not removed"
        if problem is None and variant == "creation_dir_held_by_a_live_process" and not staging.exists():
            problem = "removed a creation directory whose lock a live process holds"
        if holder is not None:
            holder.close()
        if staging.is_dir():
            shutil.rmtree(staging)
        elif staging.exists():
            staging.unlink()
        record(variant, problem, short(result))

    if not quick:  # two fresh decodes racing for the same --out
        race_dir = root / "race"
        procs = [spawn("decode", small, "--out", race_dir, "--no-progress") for _ in range(2)]
        answers = [finish(p) for p in procs]
        codes = sorted(a.get("rc") for a in answers)
        problem = None
        if codes != [0, 2]:
            problem = f"exit codes {codes}, expected one 0 and one 2: " + " || ".join(
                " | ".join(stderr_lines(a))[:200] for a in answers)
        else:
            loser = next(a for a in answers if a["rc"] == 2)
            problem = problem_of(loser)
        if problem is None and list(root.glob(".race.creating-*")):
            problem = "a creation directory was left behind"
        record("two_fresh_decodes_race_for_one_out", problem, f"exit codes {codes}")
    summary = _summarise(results)
    summary["kills"] = sum(r.get("kills", 0) for r in results)
    return summary


# ==================================================================================================
# Category 5: fuzzed API calls (run inside a worker)
# ==================================================================================================

def _junk(rng: random.Random, depth: int = 0):
    import numpy as np

    atoms = [None, True, False, 0, 1, -1, 2, 3, 7, 2 ** 31, 2 ** 63, -(2 ** 63), 10 ** 30, 0.0, -0.0, 0.5, 1.0, 1.5,
             1e-300, 5e-324, 1e-5, 1e300, -1e-5, -3.5, float("nan"), float("inf"), float("-inf"), "", "a", "0.2",
             "nan", "1e-5", "add_one", "remove_one", "add_or_remove_one", "replace_one", "improved", "classic",
             "pmixed", "adapmixed", "public", "both", "\udcff", "\x00", "caf\xe9", b"bytes", np.float64("nan"),
             np.int64(3), np.float32(0.5), np.bool_(True), np.array([]), np.array([1.0, float("nan")]),
             np.zeros((2, 0)), np.array(["a"]), complex(1, 1), object(), range(3), {1, 2}]
    roll = rng.random()
    if depth >= 3 or roll < 0.6:
        return rng.choice(atoms)
    if roll < 0.8:
        return [_junk(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    if roll < 0.9:
        return {rng.choice(["a", "type", "orders", "values", "beta", "", "relation", 1, None]): _junk(rng, depth + 1)
                for _ in range(rng.randrange(0, 4))}
    return tuple(_junk(rng, depth + 1) for _ in range(rng.randrange(0, 4)))


def _plausible(rng: random.Random, what: str):
    import numpy as np

    from dpledger.accounting.orders import default_orders
    if what == "float":
        return rng.choice([rng.uniform(0, 1), rng.uniform(1, 64), rng.uniform(1e-9, 1e-3), rng.uniform(-2, 0)])
    if what == "prob":
        return rng.uniform(0, 1)
    if what == "int":
        return rng.randrange(-2, 12)
    if what == "orders":
        return rng.choice([default_orders(), (2.0, 4.0, 8.0), (1.5,), tuple(sorted(rng.uniform(1.01, 100)
                                                                                for _ in range(rng.randrange(1, 6))))])
    if what == "relation":
        return rng.choice(["add_one", "remove_one", "add_or_remove_one", "replace_one"])
    if what == "dist":
        n = rng.randrange(1, 6)
        shape = rng.choice([(n,), (2, n), (3, 2, n)])
        values = np.asarray([rng.random() + 1e-3 for _ in range(int(np.prod(shape)))]).reshape(shape)
        return values / values.sum(axis=-1, keepdims=True)
    raise KeyError(what)


def _arg(rng: random.Random, what: str, junk_rate: float = 0.35):
    return _junk(rng) if rng.random() < junk_rate else _plausible(rng, what)


def _curve(rng):
    import numpy as np

    from dpledger.accounting.curve import RdpCurve
    orders = _plausible(rng, "orders")
    return RdpCurve(orders, np.asarray([rng.uniform(0, 5) for _ in orders]))


def _accounting_call(rng: random.Random):
    """(description, zero-argument callable) of one public-API call with partly junk arguments."""
    import numpy as np

    import dpledger as api
    P = lambda what: _arg(rng, what)  # noqa: E731
    pm = lambda: api.PMixED(rng.uniform(1.5, 20), rng.uniform(0.001, 1), rng.randrange(1, 6))  # noqa: E731
    mech = lambda: rng.choice([pm(), api.GaussianMechanism(rng.uniform(0.5, 5)), api.GNMax(rng.uniform(1, 10))])  # noqa
    options = {
        "RdpCurve": lambda: (P("orders"), _arg(rng, "float") if rng.random() < 0.5 else np.asarray(
            [rng.uniform(-1, 5) for _ in range(rng.randrange(0, 5))]), P("relation"), _junk(rng) if rng.random() < 0.3
            else rng.random() < 0.5),
        "RdpCurve.from_dict": lambda: (_junk(rng) if rng.random() < 0.5 else
                                       {"orders": P("orders"), "values": _junk(rng), "relation": P("relation"),
                                        "data_dependent": _junk(rng)},),
        "compose_curves": lambda: ([_curve(rng) if rng.random() < 0.6 else _junk(rng) for _ in range(rng.randrange(0, 4))],),
        "epsilon_from_rdp": lambda: (_curve(rng) if rng.random() < 0.7 else _junk(rng), P("prob"),
                                     rng.choice(["improved", "classic", _junk(rng)])),
        "delta_from_rdp": lambda: (_curve(rng) if rng.random() < 0.7 else _junk(rng), P("float")),
        "default_orders": lambda: tuple(P("float") for _ in range(rng.randrange(0, 3))),
        "renyi_divergence": lambda: (_arg(rng, "dist"), _arg(rng, "dist"), P("float"), _junk(rng)
                                     if rng.random() < 0.3 else False),
        "theorem_3_1_epsilon": lambda: (P("float"), P("prob"), P("int")),
        "beta_from_budget": lambda: (P("float"), P("int"), P("float"), P("int")),
        "PMixED.rdp_values": lambda: ("method", api.PMixED, (P("float"), P("prob"), P("int"), P("relation")),
                                      "rdp_values", (np.asarray(_plausible(rng, "orders")) if rng.random() < 0.7
                                                     else _junk(rng),)),
        "PMixED.mixing_weights": lambda: ("method", api.PMixED, (rng.uniform(1.5, 20), P("prob"), 3),
                                          "mixing_weights", (_arg(rng, "dist"), _arg(rng, "dist"))),
        "GaussianMechanism.rdp_curve": lambda: ("method", api.GaussianMechanism, (P("float"), P("float")),
                                                "rdp_curve", (P("orders"),)),
        "PoissonSubsampledGaussian.rdp_curve": lambda: ("method", api.PoissonSubsampledGaussian,
                                                        (P("float"), P("prob")), "rdp_curve", (P("orders"),)),
        "GNMax.data_dependent_rdp": lambda: ("method", api.GNMax, (P("float"),), "data_dependent_rdp",
                                             (_junk(rng) if rng.random() < 0.4 else np.asarray(
                                                 [rng.randrange(0, 10) for _ in range(rng.randrange(1, 5))]),
                                              np.asarray(_plausible(rng, "orders")))),
        "ConfidentGNMax.rdp_curve": lambda: ("method", api.ConfidentGNMax, (P("float"), P("float"), P("float")),
                                             "rdp_curve", (P("orders"),)),
        "NoisyScreening.rdp_values": lambda: ("method", api.NoisyScreening, (P("int"), P("prob"), P("float"),
                                                                             P("float"), P("float"), P("int")),
                                              "rdp_values", (np.asarray(_plausible(rng, "orders")),)),
        "SubsampledPMixED.rdp_curve": lambda: ("method", api.SubsampledPMixED, (pm() if rng.random() < 0.8 else
                                               _junk(rng), P("prob"), rng.choice(list(api.SubsamplingVariant)
                                                                                 + [_junk(rng)]),
                                               _junk(rng) if rng.random() < 0.3 else None), "rdp_curve", (P("orders"),)),
        "subsampled_pmixed_curve": lambda: (pm() if rng.random() < 0.8 else _junk(rng), P("prob"),
                                            rng.choice([v.value for v in api.SubsamplingVariant] + [_junk(rng)]),
                                            rng.randrange(-1, 50) if rng.random() < 0.8 else _junk(rng), P("int"),
                                            P("orders")),
        "data_dependent_pmixed_curve": lambda: (pm(), _arg(rng, "dist"), _arg(rng, "dist"), _junk(rng)
                                                if rng.random() < 0.3 else None, P("orders"), P("relation")),
        "add_one_bound_values": lambda: (pm(), _arg(rng, "dist"), _arg(rng, "dist"), _arg(rng, "dist"), P("orders")),
        "PrivacyLedger.charge+epsilon": lambda: ("ledger", P("orders"), P("relation")),
        "PrivacyLedger.from_dict": lambda: (_junk(rng) if rng.random() < 0.5 else
                                            {"orders": P("orders"), "relation": P("relation"),
                                             "components": _junk(rng), "steps": _junk(rng)},),
        "RdpBudget.spend": lambda: ("method", api.RdpBudget, (P("float"), P("prob"), P("orders"), P("relation")),
                                    "spend", (_curve(rng) if rng.random() < 0.7 else _junk(rng),)),
        "poisson_subsample": lambda: (mech() if rng.random() < 0.8 else _junk(rng), P("prob"), _junk(rng)),
        "self_compose": lambda: (mech() if rng.random() < 0.8 else _junk(rng), P("int") if rng.random() < 0.7
                                 else _junk(rng)),
        "compose": lambda: tuple(mech() if rng.random() < 0.7 else _junk(rng) for _ in range(rng.randrange(0, 3))),
        "CustomCurveMechanism": lambda: (_curve(rng) if rng.random() < 0.6 else _junk(rng), _junk(rng)),
        "Targmax.aggregate": lambda: ("method", api.Targmax, (P("int"),), "aggregate",
                                      (_junk(rng) if rng.random() < 0.4 else np.asarray(
                                          [rng.randrange(0, 10) for _ in range(rng.randrange(0, 5))]),)),
        "ThresholdWeightedSampler.aggregate": lambda: ("method", api.ThresholdWeightedSampler, (P("int"), P("float")),
                                                       "aggregate", (_junk(rng) if rng.random() < 0.4 else np.asarray(
                                                           [rng.randrange(0, 10) for _ in range(rng.randrange(0, 5))]),
                                                                     np.random.default_rng(0))),
        "DPWeightedSampler.aggregate": lambda: ("method", api.DPWeightedSampler, (P("float"), P("float"), P("float")),
                                                "aggregate", (np.asarray([rng.randrange(0, 10) for _ in range(4)]),
                                                              np.random.default_rng(0))),
        "NeighbouringRelation": lambda: (_junk(rng),),
        "ConversionMethod": lambda: (_junk(rng),),
    }
    name = rng.choice(sorted(options))
    args = options[name]()

    def call():
        if name == "PrivacyLedger.charge+epsilon":
            ledger = api.PrivacyLedger(args[1], args[2])
            for _ in range(rng.randrange(1, 3)):
                curve = _curve(rng) if rng.random() < 0.6 else _junk(rng)
                ledger.charge({rng.choice(["a", "b", "", 5]): curve})
            ledger.epsilon(_arg(rng, "prob"), rng.choice(["improved", "classic", _junk(rng)]))
            ledger.breakdown(_arg(rng, "prob"))
            return
        if args and isinstance(args[0], str) and args[0] == "method":
            _, cls, ctor_args, method, method_args = args
            return getattr(cls(*ctor_args), method)(*method_args)
        target = {"RdpCurve.from_dict": api.RdpCurve.from_dict,
                  "PrivacyLedger.from_dict": api.PrivacyLedger.from_dict}.get(name) or getattr(api, name)
        return target(*args)
    return name, args, call


def _config_call(rng: random.Random, models: dict):
    import copy

    from dpledger.decoding.config import config_from_dict
    base = {"run": {"out": "/tmp/x", "queries": 64, "seed": 7},
            "mechanism": dict(rng.choice([PMIXED, ADAPMIXED, {"type": "public"}])),
            "models": {"embedded": False, "public": models["public"], "teacher_paths": models["teachers"],
                       "teachers": len(models["teachers"]), "tokenizer": models["tokenizer"]},
            "data": {"stream": "teacher-forced", "text": models["text"], "block_size": 32}}
    config = copy.deepcopy(base)
    if rng.random() < 0.1:
        config = _junk(rng)
    else:
        for _ in range(rng.randrange(1, 4)):
            table = rng.choice(["run", "mechanism", "models", "data", "extra"])
            keys = {"run": ["out", "queries", "seed", "replay_payload", "deltas", "relation"],
                    "mechanism": ["type", "alpha", "beta", "lam", "sigma", "threshold", "top_k", "sample_rate",
                                  "subsampling_variant", "ball", "accounting", "screening", "data_dependent", "teachers"],
                    "models": ["embedded", "teachers", "public", "teacher_paths", "teacher_kind", "tokenizer", "device"],
                    "data": ["stream", "text", "block_size", "prompts", "max_new_tokens"], "extra": ["x"]}[table]
            roll = rng.random()
            if roll < 0.1:
                config[table] = _junk(rng)
            elif roll < 0.2 and isinstance(config.get(table), dict) and config[table]:
                config[table].pop(rng.choice(sorted(config[table], key=str)))
            else:
                if not isinstance(config.get(table), dict):
                    config[table] = {}
                config[table][rng.choice(keys)] = _junk(rng)
    override = _junk(rng) if rng.random() < 0.15 else None

    def call():
        result = config_from_dict(config, override)
        result.fingerprint()
    return "config_from_dict", (config, override), call


def _runner_call(rng: random.Random):
    import numpy as np
    import torch

    from dpledger.decoding.runners import build_runner
    from dpledger.mechanisms.randomness import StepGenerators
    mechanism = dict(rng.choice([PMIXED, ADAPMIXED, {"type": "public"}, {"type": "ensemble"},
                                 {**PMIXED, "sample_rate": 0.5}]))
    if rng.random() < 0.1:
        mechanism = _junk(rng)
    else:
        for _ in range(rng.randrange(1, 3)):
            key = rng.choice(["type", "alpha", "beta", "lam", "sigma", "threshold", "top_k", "sample_rate",
                              "subsampling_variant", "ball", "accounting", "screening", "data_dependent", "teachers",
                              "junk"])
            mechanism[key] = _junk(rng) if rng.random() < 0.6 else _plausible(rng, rng.choice(["float", "int", "prob"]))
    teachers = _junk(rng) if rng.random() < 0.2 else rng.randrange(1, 5)
    relation = _junk(rng) if rng.random() < 0.2 else _plausible(rng, "relation")

    def call():
        runner = build_runner(mechanism, teachers, relation)
        if isinstance(teachers, int) and 1 <= teachers <= 8:  # accepted: it must also run
            from dpledger.accounting.orders import default_orders
            vocab, length = 30, 2
            public = torch.softmax(torch.randn(length, vocab, dtype=torch.float64), -1)
            teacher_probs = torch.softmax(torch.randn(length, teachers, vocab, dtype=torch.float64), -1)
            alpha = runner.params.get("alpha")
            orders = np.asarray(default_orders(*([alpha] if alpha is not None else [])))
            runner.process(public, teacher_probs, StepGenerators.for_steps(0, 0, length), orders)
    return "build_runner(+process)", (mechanism, teachers, relation), call


def _garbage_dir_call(rng: random.Random, base_runs: list[str], scratch: str, index: int):
    """A garbage directory: random files, or a copy of a real run with junk put into its JSON files or
    records (sometimes re-chained / re-finalised so that the junk reaches the checks)."""
    from dpledger.audit import audit_run
    run = Path(scratch) / f"garbage-{index:04d}"
    shutil.rmtree(run, ignore_errors=True)
    roll = rng.random()
    description = {}
    if roll < 0.2:
        run.mkdir(parents=True)
        for _ in range(rng.randrange(0, 5)):
            name = rng.choice(["manifest.json", "ledger.json", "final.json", "steps", "replay", "x"])
            target = run / name
            if name in ("steps", "replay"):
                target.mkdir(exist_ok=True)
                (target / rng.choice(["chunk-000000.parquet", "block-000000.npy", "y"])).write_bytes(
                    os.urandom(rng.randrange(0, 200)))
            elif not target.exists():
                target.write_bytes(json.dumps(_junk(rng), default=str).encode() if rng.random() < 0.6
                                   else os.urandom(rng.randrange(0, 200)))
        description["random_files"] = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    else:
        shutil.copytree(rng.choice(base_runs), run)
        target = rng.choice(["manifest.json", "ledger.json", "final.json", "records"])
        if target == "records":
            chunks = load_chunks(run)
            record = rng.choice(rng.choice(chunks))
            key = rng.choice(sorted(record))
            record[key] = _junk(rng)
            description.update(file="records", step=record.get("step"), key=key, value=repr(record[key])[:200])
            manifest = read_json(run / "manifest.json")
            try:
                if rng.random() < 0.7:
                    rechain(manifest, chunks)
                    description["rechained"] = True
                save_chunks(run, chunks)
            except Exception:  # noqa: BLE001 - pyarrow cannot store this junk: try another
                return None
        else:
            value = read_json(run / target)
            path = []
            node = value
            while isinstance(node, (dict, list)) and node and rng.random() < 0.7:
                key = rng.choice(sorted(node, key=str)) if isinstance(node, dict) else rng.randrange(len(node))
                if not isinstance(node[key], (dict, list)) and rng.random() < 0.5:
                    break
                path.append(key)
                node = node[key]
            junk = _junk(rng)
            if path:
                parent = value
                for key in path[:-1]:
                    parent = parent[key]
                parent[path[-1]] = junk
            else:
                value = junk if rng.random() < 0.3 else value
            try:
                (run / target).write_text(json.dumps(value, default=str))
            except (ValueError, TypeError):
                return None
            description.update(file=target, path=path, value=repr(junk)[:200])
            if target == "manifest.json" and rng.random() < 0.6 and isinstance(value, dict):
                try:
                    chunks = load_chunks(run)
                    rechain(value, chunks)
                    save_chunks(run, chunks)
                    write_final(run, value, chunks)
                    description["rechained_and_finalised"] = True
                except Exception:  # noqa: BLE001 - a forger could not: leave it
                    pass
            elif target == "ledger.json" and rng.random() < 0.7:
                try:
                    write_final(run)
                    description["finalised"] = True
                except Exception:  # noqa: BLE001
                    pass

    def call():
        try:
            audit_run(run, mc_samples=5, game_trials=50, play_game=False, write=False)
        finally:
            shutil.rmtree(run, ignore_errors=True)
    return "audit_run(garbage dir)", description, call


def _fuzz_batch(target: str, seed: int, n: int, context: dict, timeout_s: int = 20) -> dict:
    import warnings

    rng = random.Random(seed)
    failures: dict[str, dict] = {}
    tried = 0
    for index in range(n):
        try:  # building the arguments calls the API too (e.g. a PMixED with a plausible alpha)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if target == "accounting":
                    made = _accounting_call(rng)
                elif target == "config":
                    made = _config_call(rng, context["models"])
                elif target == "runner":
                    made = _runner_call(rng)
                else:
                    made = _garbage_dir_call(rng, context["base_runs"], context["scratch"], index)
        except ValueError:
            tried += 1
            continue
        except Exception as exc:  # noqa: BLE001
            tried += 1
            where = traceback.extract_tb(exc.__traceback__)[-1]
            raised_at = f"{Path(where.filename).name}:{where.lineno}"
            key = f"{target} (building arguments) | {type(exc).__name__} | {raised_at}"
            failures.setdefault(key, {"function": f"{target} (building arguments)", "exception": type(exc).__name__,
                                      "message": str(exc)[:200], "raised_at": raised_at,
                                      "input": f"_fuzz_batch({target!r}, seed={seed}), call {index}", "count": 0})
            failures[key]["count"] += 1
            continue
        if made is None:
            continue
        name, args, call = made
        tried += 1
        error = None
        signal.alarm(timeout_s)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
                    call()
        except ValueError:
            pass
        except _CallTimeout:
            error = ("hang", f"no answer within {timeout_s} s")
        except BaseException as exc:  # noqa: BLE001
            error = (type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
            where = traceback.extract_tb(exc.__traceback__)[-1]
            error = (*error, f"{Path(where.filename).name}:{where.lineno}")
        finally:
            signal.alarm(0)
        if error is not None:
            kind, message = error[0], error[1]
            key = f"{name} | {kind} | {error[2] if len(error) > 2 else ''}"
            if key not in failures:
                failures[key] = {"function": name, "exception": kind, "message": message,
                                 "raised_at": error[2] if len(error) > 2 else None,
                                 "input": _describe(args), "count": 0}
            failures[key]["count"] += 1
    return {"tried": tried, "failures": list(failures.values())}


def _describe(value) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 500 else text[:500] + "..."


def run_api_fuzz(bases: dict, models, work: Path, quick: bool, seed: int, env: dict) -> dict:
    scratch = work / "fuzz"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    context = {"models": {"public": str(models.public), "teachers": [str(t) for t in models.teachers],
                          "tokenizer": str(models.tokenizer), "text": str(models.heldout_text)},
               "base_runs": [str(bases["ada"]["dir"]), str(bases["pm"]["dir"])], "scratch": str(scratch)}
    plan = ({"accounting": 100, "config": 50, "runner": 40, "audit": 10} if quick else
            {"accounting": 700, "config": 350, "runner": 250, "audit": 120})
    worker = Worker(env, memory_limit=8 * 2 ** 30)
    by_target, failures, tried = {}, [], 0
    try:
        for target, n in plan.items():
            batch = 50 if target != "audit" else 10
            target_tried, target_failures = 0, {}
            for start in range(0, n, batch):
                answer = worker.call("fuzz", timeout=600, target=target, seed=seed * 1000 + start + sum(map(ord, target)),
                                     n=min(batch, n - start), context=context)
                if "tried" not in answer:
                    key = f"{target} | batch {start} | {problem_of(answer) or answer}"
                    target_failures[key] = {"function": target, "exception": "worker", "message": str(answer)[:300],
                                            "input": f"batch seed {seed * 1000 + start}", "count": 1}
                    target_tried += min(batch, n - start)
                    continue
                target_tried += answer["tried"]
                for failure in answer["failures"]:
                    key = f"{failure['function']} | {failure['exception']} | {failure.get('raised_at')}"
                    if key in target_failures:
                        target_failures[key]["count"] += failure["count"]
                    else:
                        target_failures[key] = failure
            failed_calls = sum(f["count"] for f in target_failures.values())
            by_target[target] = {"tried": target_tried, "clean": target_tried - failed_calls,
                                 "distinct_failures": len(target_failures)}
            failures.extend(target_failures.values())
            tried += target_tried
    finally:
        worker.close()
    failed = sum(f["count"] for f in failures)
    return {"tried": tried, "clean": tried - failed, "by_target": by_target,
            "failures": [{"case": f"{f['function']}: {f['exception']} at {f.get('raised_at')} (x{f['count']})",
                          "what": f"{f['exception']}: {f['message']}", "input": f["input"]} for f in failures]}


# ==================================================================================================
# Setup and main
# ==================================================================================================

def make_base_run(models, out: Path, mechanism: dict, queries: int, **run) -> dict:
    from dpledger.decoding.config import config_from_dict
    from dpledger.decoding.blocks import prepare
    from dpledger.decoding.run import run_decode
    from tests.micro import micro_config

    config = config_from_dict(micro_config(models, out, mechanism, queries=queries, **run))
    prepared = prepare(config, verbose=False)
    prepared.canaries = list(models.canaries)
    result = run_decode(config, progress=False, verbose=False, prepared=prepared)
    return {"dir": result.directory, "head": result.head}


def movable_models(models, root: Path):
    """A copy of the micro models and text under one directory, so a case can move them away."""
    from tests.micro import MicroModels

    target = root / "movable"
    shutil.copytree(models.public, target / "models" / "public")
    teachers = []
    for i, teacher in enumerate(models.teachers):
        shutil.copytree(teacher, target / "models" / f"teacher-{i}")
        teachers.append(target / "models" / f"teacher-{i}")
    shutil.copytree(models.tokenizer, target / "models" / "tokenizer")
    (target / "text").mkdir()
    shutil.copy(models.heldout_text, target / "text" / "heldout.txt")
    return MicroModels(target / "models" / "public", tuple(teachers), target / "models" / "tokenizer",
                       target / "text" / "heldout.txt", target, models.canaries), \
        {"models": target / "models", "text": target / "text"}


def source_identity() -> dict:
    """Which dpledger was attacked: the package sources' digest, and the git commit and whether the
    package files differ from it (another engineer may be editing the tree)."""
    import hashlib

    digest = hashlib.sha256()
    for package in ("accounting", "audit", "decoding", "dpledger", "mechanisms", "reports"):
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    identity = {"root": str(ROOT), "package_sources_sha256": digest.hexdigest()}
    try:
        identity["git_head"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "accounting", "audit",
                                "decoding", "dpledger", "mechanisms", "reports"], capture_output=True, text=True,
                               check=True).stdout.split("\n")
        identity["package_files_changed_since_head"] = [line[3:] for line in dirty if line.strip()]
    except (OSError, subprocess.CalledProcessError):
        identity["git_head"] = None
    return identity


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small subset (< 2 minutes)")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--out", help="result JSON (default benchmarks/results/adversarial_audit[_quick].json)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--only", help="comma-separated categories to run (tampering,report,byte_flips,"
                                       "bad_configs,concurrency,api_fuzz)")
    args = parser.parse_args()
    started = time.time()
    only = set(args.only.split(",")) if args.only else None
    work = Path(tempfile.mkdtemp(prefix="dpledger-adversarial-"))
    (work / "cwd").mkdir()
    (work / "cwd" / "README").write_text("the worker's working directory\n")
    env = {"DPLEDGER_CACHE": str(work / "cache"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "ADV_CWD": str(work / "cwd")}
    env.pop("DPLEDGER_DEBUG", None)
    os.environ.update(env)
    os.environ.pop("DPLEDGER_DEBUG", None)
    out_path = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / (
        "adversarial_audit_quick.json" if args.quick else "adversarial_audit.json")
    results: dict = {"generated_by": "benchmarks/adversarial_audit.py", "mode": "quick" if args.quick else "full",
                     "seed": args.seed, "euid": os.geteuid(), "source": source_identity(), "categories": {}}
    worker = None
    try:
        from tests.micro import build_micro_models

        log(f"scratch {work}; building micro models and base runs")
        models = build_micro_models(work)
        mobile, assets = movable_models(models, work)
        queries = 64
        bases = {"ada": make_base_run(mobile, work / "base-ada", ADAPMIXED, queries),
                 "pm": make_base_run(mobile, work / "base-pm", PMIXED, queries)}
        log(f"base runs ready ({time.time() - started:.0f} s)")
        worker = Worker(env)
        control = worker.cli(["audit", str(bases["ada"]["dir"]), *AUDIT_FLAGS], timeout=300)
        (bases["ada"]["dir"] / "audit.json").unlink(missing_ok=True)
        if control.get("rc") != 0:
            raise SystemExit(f"the untouched AdaPMixED run does not PASS: {short(control)}")

        def timed(name, function):
            if only is not None and name not in only:
                return
            began = time.time()
            log(f"== {name}")
            summary = function()
            summary["seconds"] = round(time.time() - began, 1)
            results["categories"][name] = summary
            log(f"   {name}: {summary['clean']}/{summary['tried']} clean, {len(summary['failures'])} failures "
                f"({summary['seconds']} s)")
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(results, indent=2, default=str) + "\n")

        tamper_work = work / "tamper"
        tamper_work.mkdir()
        report_holder = {}

        def tampering():
            tamper, report = run_tampering(worker, bases, assets, tamper_work, args.quick)
            report_holder["report"] = report
            shutil.rmtree(tamper_work, ignore_errors=True)
            tamper_work.mkdir()
            return tamper

        def reports():
            results_list = run_stale_reports(worker, bases, tamper_work, args.quick)
            earlier = report_holder.get("report", {"cases": []})["cases"]
            return _summarise(earlier + results_list)

        timed("tampering", tampering)
        timed("report", reports)
        timed("byte_flips", lambda: run_byte_flips(worker, bases, work, 24 if args.quick else 320, args.seed))
        timed("bad_configs", lambda: run_bad_configs(worker, models, work, args.quick))
        timed("concurrency", lambda: run_concurrency(worker, models, work, args.quick, args.seed))
        worker.close()
        worker = None
        timed("api_fuzz", lambda: run_api_fuzz(bases, models, work, args.quick, args.seed, env))
    finally:
        if worker is not None:
            worker.close()
        results["seconds"] = round(time.time() - started, 1)
        if source_identity()["package_sources_sha256"] != results["source"]["package_sources_sha256"]:
            results["source"]["warning"] = "the package sources changed while this ran: results may mix versions"
        results["summary"] = {name: {"tried": c["tried"], "clean": c["clean"], "failures": len(c["failures"])}
                              for name, c in results["categories"].items()}
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept {work}")
    log(f"wrote {out_path} ({results['seconds']} s)")
    for name, summary in results["summary"].items():
        log(f"  {name:<12} {summary['clean']}/{summary['tried']} clean, {summary['failures']} failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
