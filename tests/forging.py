"""What a forger with write access to a run directory does, shared by the tests that audit the
result (tests/test_run_integrity.py, tests/test_hostile_directory.py, tests/adversarial/): copy a
run, edit its records, chunks or manifest and re-chain everything with dpledger's own code
(`forge`, at the level of effort a forger chooses), re-issue final.json for an edited ledger
(`reissue_final`), edit ledger.json, final.json or the replay payload, and plant what a hostile
directory holds (links, FIFOs, sparse oversized files)."""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import numpy as np

from dpledger.decoding import trace
from dpledger.decoding.totals import RunTotals

LEVELS = ("none", "chain", "ledger", "full")
"""How far a forger goes after an edit: "none" writes the edited files as they are, "chain" also
re-chains every record from the manifest's genesis, "ledger" also recomputes ledger.json from the
records, "full" also re-issues final.json (a self-consistent run with a new head)."""


def copy(run_dir: Path, target: Path) -> Path:
    shutil.copytree(run_dir, target, symlinks=True)
    (target / "audit.json").unlink(missing_ok=True)
    return target


def read_json(path: Path):
    return trace.loads_json(Path(path).read_text())


def write_json(path: Path, value) -> None:
    Path(path).write_bytes(trace.json_bytes(value))


def replace_bytes(path: Path, data: bytes) -> None:
    Path(path).unlink()
    Path(path).write_bytes(data)


def components(run_dir: Path) -> list[str]:
    """The names of the run's privacy components (each record has an rdp_<name> column)."""
    return list(read_json(Path(run_dir) / trace.MANIFEST)["mechanism"]["components"])


# -- records, chunks and the chain -----------------------------------------------------------------

def chunk_files(run_dir: Path) -> list[Path]:
    return sorted((Path(run_dir) / trace.STEPS_DIR).glob("chunk-*.parquet"))


def load_chunks(run_dir: Path) -> list[list[dict]]:
    """Every chunk file's records, in file-name order, read as they are (nothing is checked)."""
    import pyarrow.parquet as pq

    return [pq.read_table(path).to_pylist() for path in chunk_files(run_dir)]


def save_chunks(run_dir: Path, chunks: list[list[dict]]) -> None:
    for path in chunk_files(run_dir):
        path.unlink()
    for index, records in enumerate(chunks):
        trace.write_chunk(run_dir, index, records)


def rechain(manifest: dict, chunks: list[list[dict]]) -> str:
    """Chain every record from the manifest's genesis (in place); returns the last record hash."""
    prev = trace.genesis_hash(manifest)
    for records in chunks:
        prev = trace.chain_records(records, prev)
    return prev


def ledger_of(manifest: dict, chunks: list[list[dict]]) -> dict:
    """ledger.json as decode computes it from these records."""
    totals = RunTotals(manifest)
    for records in chunks:
        totals.add(records)
    return totals.summary()


def write_ledger(run_dir: Path, summary: dict) -> None:
    (Path(run_dir) / trace.LEDGER).write_bytes(trace.json_bytes(summary))


def reissue_final(run_dir: Path, manifest: dict | None = None, chunks: list[list[dict]] | None = None) -> str:
    """final.json re-issued for the manifest, chunks and ledger.json bytes the run holds now (a
    forger who edited any of them); returns the new head."""
    run_dir = Path(run_dir)
    manifest = manifest if manifest is not None else read_json(run_dir / trace.MANIFEST)
    chunks = chunks if chunks is not None else load_chunks(run_dir)
    last = next((c[-1]["record_hash"] for c in reversed(chunks) if c), trace.genesis_hash(manifest))
    final = trace.final_record(manifest, sum(len(c) for c in chunks), len(chunks), last,
                               (run_dir / trace.LEDGER).read_bytes())
    write_json(run_dir / trace.FINAL, final)
    return final["head"]


def forge(run_dir: Path, edit_record=None, edit_manifest=None, keep_blocks=None, edit_chunks=None,
          level: str = "full") -> None:
    """Edit the manifest (`edit_manifest(manifest)`, in place), cut the run after `keep_blocks`
    blocks (their payload too), edit each record (`edit_record(record)`, in place) and/or the list
    of chunks (`edit_chunks(chunks)` returns the new list), then go as far as `level` (LEVELS): by
    default re-chain every record and recompute ledger.json and final.json with dpledger's own
    code, so that every internal hash agrees again."""
    assert level in LEVELS, level
    run_dir = Path(run_dir)
    manifest = read_json(run_dir / trace.MANIFEST)
    if edit_manifest is not None:
        edit_manifest(manifest)
        write_json(run_dir / trace.MANIFEST, manifest)
    chunks = load_chunks(run_dir)
    touched = False
    if keep_blocks is not None:
        for index in range(keep_blocks, len(chunks)):
            for payload_format in (trace.LOGITS_FORMAT, trace.VOTE_FORMAT):
                trace.replay_path(run_dir, index, payload_format).unlink(missing_ok=True)
        chunks, touched = chunks[:keep_blocks], True
    if edit_record is not None:
        for records in chunks:
            for record in records:
                edit_record(record)
        touched = True
    if edit_chunks is not None:
        chunks, touched = edit_chunks(chunks), True
    if level != "none":
        rechain(manifest, chunks)
        touched = True
    if touched:
        save_chunks(run_dir, chunks)
    if level in ("ledger", "full"):
        write_ledger(run_dir, ledger_of(manifest, chunks))
    if level == "full":
        reissue_final(run_dir, manifest, chunks)


def first_record(edit):
    """An edit_record that changes only the first record `edit` does not decline (returns False for)."""
    done = []

    def apply(record):
        if not done and edit(record) is not False:
            done.append(True)
    return apply


def scale_charges(run_dir: Path, factor: float):
    """An edit_record multiplying every per-step RDP charge of every component by `factor`."""
    names = components(run_dir)

    def edit(record):
        for name in names:
            record[f"rdp_{name}"] = [v * factor for v in record[f"rdp_{name}"]]
    return edit


def set_charges(run_dir: Path, value: float):
    names = components(run_dir)

    def edit(record):
        for name in names:
            record[f"rdp_{name}"] = [value for _ in record[f"rdp_{name}"]]
    return edit


# -- the manifest ----------------------------------------------------------------------------------

def edit_manifest(run_dir: Path, edit) -> None:
    """The manifest edited and written as it is: nothing re-chained."""
    forge(run_dir, edit_manifest=edit, level="none")


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


def point_models_nowhere(manifest: dict, config_too: bool = False) -> None:
    """Every recorded model source points at a path that does not exist; with `config_too` the
    config's model and tokenizer paths as well, and the rest of the manifest reconciled with it."""
    for model in manifest["models"]:
        model["source"] = "/nowhere/" + model["role"]
    if config_too:
        paths = manifest["config"]["models"]
        paths["public"] = manifest["models"][0]["source"]
        paths["teacher_paths"] = [m["source"] for m in manifest["models"][1:]]
        paths["tokenizer"] = "/nowhere/tokenizer"
        reconcile(manifest)


# -- ledger.json and final.json --------------------------------------------------------------------

def edit_ledger(run_dir: Path, edit, refinal: bool = True) -> None:
    """ledger.json edited (`edit(ledger)`, in place); with `refinal` final.json re-issued for it."""
    ledger = read_json(Path(run_dir) / trace.LEDGER)
    edit(ledger)
    write_json(Path(run_dir) / trace.LEDGER, ledger)
    if refinal:
        reissue_final(run_dir)


def lower_epsilons(ledger: dict, factor: float = 10.0) -> None:
    """An edit of ledger.json: every reported epsilon, and every breakdown row's, divided by `factor`."""
    for entry in ledger["epsilon"]:
        entry["epsilon"] = entry["epsilon"] / factor
    for row in ledger["breakdown"]["rows"]:
        row["epsilon"] = row["epsilon"] / factor


def edit_final(run_dir: Path, edit, rehead: bool = True) -> None:
    """final.json edited (`edit(final)`, in place); with `rehead` its head recomputed to match."""
    final = read_json(Path(run_dir) / trace.FINAL)
    edit(final)
    if rehead:
        final["head"] = trace.head_of(final)
    write_json(Path(run_dir) / trace.FINAL, final)


# -- the exact-replay payload ----------------------------------------------------------------------

def forge_payload(run_dir: Path, block: int, transform, recompute_records: bool) -> None:
    """Replace a block's logits by transform(logits) and chain the new payload hash; with
    recompute_records the block's records are recomputed from the new logits exactly as decode
    would have written them (a self-consistent forgery). Then re-chain, ledger, final."""
    import torch

    from dpledger.decoding.blocks import _outcome_records, replay_steps
    from dpledger.decoding.runners import build_runner

    run_dir = Path(run_dir)
    manifest = read_json(run_dir / trace.MANIFEST)
    logits = np.array(np.load(trace.replay_path(run_dir, block)))
    forged = np.ascontiguousarray(transform(logits.copy()))
    sha = trace.write_replay(run_dir, block, forged)
    chunks = load_chunks(run_dir)
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
    forge(run_dir, edit_chunks=lambda _: chunks)


def chain_payload_as_it_is(run_dir: Path, block: int) -> None:
    """Chain whatever bytes the block's payload file now holds (its sha256 into the block's records), full forge."""
    sha = trace.file_sha256(trace.replay_path(run_dir, block))
    forge(run_dir, edit_record=lambda r: r.update(payload_sha256=sha) if r["block"] == block else None)


# -- a hostile directory ---------------------------------------------------------------------------

def replace_with_link(path: Path, target: Path) -> Path:
    """`path` (a file or directory of a run) becomes a symbolic link to `target`; when `target` does
    not exist, the original is moved there first, so the link leads to the very content dpledger wrote."""
    if not os.path.lexists(target):
        shutil.move(path, target)
    elif os.path.lexists(path):
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    path.symlink_to(target)
    return path


def replace_with_fifo(path: Path) -> Path:
    if os.path.lexists(path):
        path.unlink()
    os.mkfifo(path)
    return path


def grow_sparse(path: Path, size: int) -> Path:
    """`path` with its apparent size raised to `size` bytes (a sparse tail: nothing is written to disk)."""
    os.truncate(path, size)
    return path
