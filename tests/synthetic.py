"""Synthetic run traces for scale tests: random logits stand in for the models, everything else
(the mechanism, the records, the chain, the ledger, the final record) is the decode's own code."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from dpledger.decoding import trace
from dpledger.decoding.config import DataConfig, ModelsConfig, RunConfig
from dpledger.decoding.blocks import _outcome_records, build_manifest, replay_steps
from dpledger.decoding.totals import RunTotals, finish_run
from dpledger.decoding.runners import build_runner
from dpledger.mechanisms.randomness import StepGenerators
from dpledger.accounting.orders import default_orders


DISTINCT_BLOCKS = 4
"""Without a payload nothing can replay the steps, so a long synthetic run cycles through this
many blocks of random logits (the mechanism runs on each once; tokens are still drawn per step)."""


def write_synthetic_run(out: Path, teachers: int, vocab: int, steps: int, block_size: int, mechanism: dict,
                        payload: bool = False, seed: int = 0, relation: str = "add_or_remove_one",
                        step_spreads: tuple[float, ...] = ()) -> Path:
    """A finished run of `mechanism` over `steps` random teacher-forced queries. The manifest names
    models that do not exist, so without the payload an audit cannot recompute the charges.
    `step_spreads` (cycled over the steps): each teacher's logits are the public model's plus that
    spread times standard normal noise, so steps differ in how far the teachers sit from the public
    model; empty: every model's logits independent normal(0, 2.5)."""
    out = Path(out)
    text = out.parent / f"{out.name}.txt"  # stands in for the data: the tokens themselves are random
    text.write_text("synthetic\n")
    models = ModelsConfig(embedded=False, teachers=teachers, public="synthetic://public",
                          teacher_paths=tuple(f"synthetic://teacher-{i}" for i in range(teachers)))
    config = RunConfig(out=str(out), mechanism=mechanism, models=models, data=DataConfig(text=str(text),
                       block_size=block_size), queries=steps, replay_payload=payload, seed=seed, relation=relation,
                       replay_payload_format="logits")  # what this writer keeps, voting runs included
    runner = build_runner(config.mechanism, teachers, config.relation)
    orders = np.asarray(default_orders(*([runner.params["alpha"]] if "alpha" in runner.params else [])))
    models = [{"role": "public", "source": "synthetic://public", "content_hash": "0" * 64}]
    models += [{"role": f"teacher-{i}", "source": f"synthetic://teacher-{i}", "content_hash": f"{i + 1:064x}"}
               for i in range(teachers)]
    data = {"name": str(text), "sha256": hashlib.sha256(text.read_bytes()).hexdigest(), "stream": "teacher-forced",
            "tokens": None}
    manifest = build_manifest(config, runner, orders, models, vocab, data, "synthetic://tokenizer", [])
    lock = trace.create_run_directory(out, manifest, payload)
    rng = np.random.default_rng(seed)
    running, prev = RunTotals(manifest), trace.genesis_hash(manifest)
    blocks = -(-steps // block_size)
    cached = {}
    try:
        for block in range(blocks):
            first = block * block_size
            length = min(block_size, steps - first)
            key = (block % DISTINCT_BLOCKS, length)
            if payload or key not in cached:
                values = rng.normal(0.0, 2.5, (teachers + 1, length, vocab))
                if step_spreads:
                    spreads = np.resize(np.asarray(step_spreads, dtype=np.float64), steps)[first:first + length]
                    values[1:] = values[0] + spreads[None, :, None] * rng.standard_normal((teachers, length, vocab))
                logits = torch.from_numpy(values.astype(np.float32))
                outcome, tokens = replay_steps(runner, logits, seed, first, orders, sequential=False)
                cached[key] = outcome
            else:
                outcome = cached[key]
                tokens = StepGenerators.for_steps(seed, first, length).multinomial(outcome.output).numpy()
            stream = rng.integers(0, vocab, length + 1)
            digest = trace.write_replay(Path(out), block, logits.numpy()) if payload else ""
            records = _outcome_records(runner, block, first, outcome, tokens, stream[1:], stream[:-1], digest)
            prev = trace.chain_records(records, prev)
            running.add(records)
            trace.write_chunk(Path(out), block, records)
        finish_run(Path(out), manifest, running, blocks, prev)
    finally:
        lock.release()
    return Path(out)
