"""What a forger with write access to a run directory does, shared by the tests that audit the
result: copy a run, edit its records or manifest and re-chain everything with dpledger's own code
(`forge`), re-issue final.json for an edited ledger (`reissue_final`), and plant what a hostile
directory holds (links, FIFOs, sparse oversized files)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from dpledger.decoding import trace
from dpledger.decoding.run import RunTotals, finish_run, records_by_block


def copy(run_dir: Path, target: Path) -> Path:
    shutil.copytree(run_dir, target)
    (target / "audit.json").unlink(missing_ok=True)
    return target


def forge(run_dir: Path, edit_record=None, edit_manifest=None, keep_blocks=None) -> None:
    """Edit records and/or the manifest, optionally cut the run after `keep_blocks` blocks, then
    re-chain every record and recompute ledger.json and final.json with dpledger's own code, so
    that every internal hash agrees again."""
    manifest = trace.read_manifest(run_dir)
    blocks = records_by_block(trace.read_records(run_dir, verify=False))
    if edit_manifest is not None:
        edit_manifest(manifest)
        trace.atomic_write_json(run_dir / trace.MANIFEST, manifest)
    if keep_blocks is not None:
        for index in range(keep_blocks, len(blocks)):
            trace.chunk_path(run_dir, index).unlink()
            trace.replay_path(run_dir, index).unlink(missing_ok=True)
        blocks = blocks[:keep_blocks]
    prev, totals = trace.genesis_hash(manifest), RunTotals(manifest)
    for index, records in enumerate(blocks):
        for record in records:
            if edit_record is not None:
                edit_record(record)
        prev = trace.chain_records(records, prev)
        totals.add(records)
        trace.write_chunk(run_dir, index, records)
    finish_run(run_dir, manifest, totals, len(blocks), prev)


def reissue_final(run_dir: Path) -> None:
    """final.json re-issued for the ledger.json bytes the run holds now (a forger who edited the ledger)."""
    final, manifest = trace.read_final(run_dir), trace.read_manifest(run_dir)
    trace.atomic_write_json(run_dir / trace.FINAL, trace.final_record(
        manifest, final["steps"], final["blocks"], final["last_record_hash"], (run_dir / trace.LEDGER).read_bytes()))


def point_models_nowhere(manifest: dict) -> None:
    for model in manifest["models"]:
        model["source"] = "/nowhere/" + model["role"]


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
