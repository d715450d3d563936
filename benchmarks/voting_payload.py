"""The bounded replay payload of a voting run at scale: N = 512 teachers, V = 131072, one block of
64 steps, written and audited with dpledger's own decode and audit code (issue 28, item 5).

Synthetic teachers stand in for the models (as tests/synthetic.py does): at each step a shared
Gaussian logit vector (scale 2.5) plus each teacher's own Gaussian noise (scale `--spread`), so the
votes concentrate as an ensemble's do. The logits of one step at a time are generated, run through
the mechanism (Hot PATE votes, DPARGMAX) and reduced to the bounded payload, so the (N+1) x 64 x V
float32 logits (17.2 GB) never exist; their size is the formula's. The audit then replays the run
from the payload (no models): by default the checks that read the payload and the records (files,
records, payload, hash chain, replay, shared randomness, charges); --full-audit runs audit_run.
Results go to benchmarks/results/voting_payload.json. Takes a few minutes per coordination on 1 core.

    python benchmarks/voting_payload.py [--teachers 512] [--vocab 131072] [--steps 64] [--top-k 4]
                                        [--votes coordinated independent]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")   # the synthetic models' names must not be looked up on the hub

from dpledger.accounting.orders import default_orders  # noqa: E402
from dpledger.audit import consistency, replay, voting  # noqa: E402
from dpledger.audit.audit import audit_run  # noqa: E402
from dpledger.audit.loader import load_trace  # noqa: E402
from dpledger.decoding import trace  # noqa: E402
from dpledger.decoding.blocks import _concat_outcomes, _outcome_records, build_manifest, replay_steps  # noqa: E402
from dpledger.decoding.config import DataConfig, ModelsConfig, RunConfig  # noqa: E402
from dpledger.decoding.runners import build_runner  # noqa: E402
from dpledger.decoding.totals import RunTotals, finish_run  # noqa: E402
from dpledger.decoding.vote_payload import (VotePayload, payload_bytes, top_race_entries,  # noqa: E402
                                            write_vote_payload)
from dpledger.mechanisms.voting import VoteCoordination  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "voting_payload.json"


def write_run(out: Path, teachers: int, vocab: int, steps: int, top_k: int, votes: str, spread: float,
              seed: int = 0) -> dict:
    """A finished one-block voting run of `steps` synthetic steps with the bounded payload; its timings."""
    text = out.parent / f"{out.name}.txt"
    text.write_text("synthetic\n")
    mechanism = {"type": "voting", "votes": votes, "aggregator": "dpargmax", "threshold": teachers / 8,
                 "sigma": teachers / 16, "sigma_threshold": teachers / 16}
    models = ModelsConfig(embedded=False, teachers=teachers, public="synthetic://public",
                          teacher_paths=tuple(f"synthetic://teacher-{i}" for i in range(teachers)))
    config = RunConfig(out=str(out), mechanism=mechanism, models=models,
                       data=DataConfig(text=str(text), block_size=steps), queries=steps, seed=seed,
                       replay_top_k=top_k)
    runner = build_runner(config.mechanism, teachers, config.relation)
    orders = np.asarray(default_orders())
    identities = [{"role": "public", "source": "synthetic://public", "content_hash": "0" * 64}]
    identities += [{"role": f"teacher-{i}", "source": f"synthetic://teacher-{i}", "content_hash": f"{i + 1:064x}"}
                   for i in range(teachers)]
    data = {"name": str(text), "sha256": hashlib.sha256(text.read_bytes()).hexdigest(), "stream": "teacher-forced",
            "tokens": None}
    manifest = build_manifest(config, runner, orders, identities, vocab, data, "synthetic://tokenizer", [])
    lock = trace.create_run_directory(out, manifest, True)
    rng = np.random.default_rng(seed)
    outcomes, tokens, parts = [], [], []
    started, mechanism_seconds, payload_seconds = time.time(), 0.0, 0.0
    try:
        for step in range(steps):
            shared = rng.normal(0.0, 2.5, vocab)
            logits = np.empty((teachers + 1, 1, vocab), dtype=np.float32)
            logits[0, 0] = shared
            for row in range(1, teachers + 1):   # row by row: the float64 noise of one teacher at a time
                logits[row, 0] = shared + rng.normal(0.0, spread, vocab)
            tensor = torch.from_numpy(logits)
            tick = time.time()
            outcome, token = replay_steps(runner, tensor, seed, step, orders, sequential=False)
            mechanism_seconds += time.time() - tick
            tick = time.time()
            parts.append(top_race_entries(tensor, outcome.vote_seeds.tolist(), VoteCoordination(votes), top_k))
            payload_seconds += time.time() - tick
            outcomes.append(outcome)
            tokens.append(token)
            del logits, tensor
        payload = VotePayload(np.concatenate([p.public_logits for p in parts]),
                              np.concatenate([p.token_ids for p in parts]), np.concatenate([p.log_probs for p in parts]))
        digest = write_vote_payload(out, 0, payload)
        stream = rng.integers(0, vocab, steps + 1)
        records = _outcome_records(runner, 0, 0, _concat_outcomes(outcomes), np.concatenate(tokens), stream[1:],
                                   stream[:-1], digest)
        head = trace.chain_records(records, trace.genesis_hash(manifest))
        running = RunTotals(manifest)
        running.add(records)
        trace.write_chunk(out, 0, records)
        finish_run(out, manifest, running, 1, head)
    finally:
        lock.release()
    passed = sum(r["screen_passed"] for r in records)
    distinct = float(np.mean([len(r["vote_tokens"]) for r in records]))
    return {"decode_seconds": round(time.time() - started, 1), "mechanism_seconds": round(mechanism_seconds, 1),
            "payload_reduction_seconds": round(payload_seconds, 1), "screen_passed_steps": int(passed),
            "mean_distinct_votes_per_step": round(distinct, 2)}


def measure(teachers: int, vocab: int, steps: int, top_k: int, votes: str, spread: float, root: Path,
            full_audit: bool) -> dict:
    """Write the run, measure its payload file, audit it; everything as a JSON-ready dict."""
    out = root / f"voting-{votes}"
    timings = write_run(out, teachers, vocab, steps, top_k, votes, spread)
    payload_file = trace.replay_path(out, 0, trace.VOTE_FORMAT)
    size = payload_file.stat().st_size
    tick = time.time()
    if full_audit:
        report = audit_run(out, play_game=False, write=False)
        checks = {check.name: check.status.value for check in report.checks}
        verdict, replay_detail = report.verdict, report.check("replay").detail
    else:  # the checks that read the payload and the records, not the ablation's laws (slow at V = 131072)
        loaded = load_trace(out)
        results = [consistency.check_files(loaded), consistency.check_records(loaded),
                   consistency.check_payload(loaded), replay.check_hash_chain(loaded), replay.check_replay(loaded),
                   voting.check_shared_randomness(loaded), voting.check_voting_charges(loaded)]
        checks = {check.name: check.status.value for check in results}
        verdict = "PASS" if set(checks.values()) == {"PASS"} else "FAIL"
        replay_detail = results[4].detail
    audit_seconds = time.time() - tick
    logits_bytes = 128 + 4 * (teachers + 1) * steps * vocab   # the .npy the logits format writes: its header + data
    return {
        "votes": votes, "teachers": teachers, "vocab": vocab, "steps": steps, "top_k": top_k, "teacher_spread": spread,
        "payload_bytes": size, "payload_bound_bytes": payload_bytes(steps, teachers, vocab, top_k),
        "payload_formula_body_bytes": 4 * steps * vocab + 12 * teachers * steps * top_k,
        "full_logits_bytes": logits_bytes, "ratio_full_over_bounded": round(logits_bytes / size, 1),
        "manifest_size_formula": trace.read_manifest(out)["replay_payload_format"]["bytes_per_block"],
        **timings, "audit": "audit_run (every check)" if full_audit else "the payload, records and replay checks",
        "audit_seconds": round(audit_seconds, 1), "audit_verdict": verdict, "audit_checks": checks,
        "replay_detail": replay_detail,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teachers", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--spread", type=float, default=1.0, help="each teacher's own logit noise (std)")
    parser.add_argument("--votes", nargs="+", default=["coordinated", "independent"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--full-audit", action="store_true", help="every audit check, the neighbour ablation's "
                        "exact laws included (tens of minutes at V = 131072 on a shared core)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as root:
        for votes in args.votes:
            result = measure(args.teachers, args.vocab, args.steps, args.top_k, votes, args.spread, Path(root),
                             args.full_audit)
            print(json.dumps({k: v for k, v in result.items() if k != "audit_checks"}, indent=1), flush=True)
            results.append(result)
            # written after each coordination, so a long second one loses nothing of the first
            document = {"what": "bounded replay payload of a voting run (dpledger.decoding.vote_payload): bytes "
                                "written for one block, against the full float32 logits' size; the audit replaying it",
                        "how": "python benchmarks/voting_payload.py " + " ".join(sys.argv[1:]),
                        "machine": f"{platform.processor() or platform.machine()}, torch threads 1, 2 shared cores",
                        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                        "results": results}
            args.out.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
