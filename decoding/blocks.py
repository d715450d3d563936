"""A decoding run's blocks: the prepared run (models, tokenizer, data, mechanism; every check before
any write), its manifest, and one block decoded into its per-step records. The decode loop
(dpledger.decoding.run) commits blocks in order; Dask workers (dpledger.decoding.dask_decode) decode
them elsewhere; the audit replays steps with replay_steps."""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from dpledger.accounting.errors import require
from dpledger.accounting.orders import default_orders
from dpledger.decoding import trace
from dpledger.decoding.budget import BudgetGate
from dpledger.decoding.config import RunConfig, read_text_file
from dpledger.decoding.ensemble import (Ensemble, load_tokenizer, require_matching_tokenizer)
from dpledger.decoding.runners import BlockOutcome, Runner, build_runner
from dpledger.mechanisms.randomness import StepGenerators
from dpledger.version import __version__
from dpledger.decoding.embedded import build_or_load
from dpledger.decoding.icl import embedded_icl_default, load_icl_ensemble
from dpledger.decoding.recipe import TinyModelRecipe
from dpledger.decoding.recipe import encode_documents, set_single_thread


PACKAGE_VERSION = __version__


@dataclass
class PreparedRun:
    config: RunConfig
    ensemble: Ensemble
    tokenizer: object
    runner: Runner
    orders: np.ndarray
    token_ids: np.ndarray | None
    prompts: list[list[int]]
    data_identity: dict
    tokenizer_path: str
    canaries: list[dict]
    budget: BudgetGate | None = None

    @property
    def n_blocks(self) -> int:
        if self.config.data.stream == "teacher-forced":
            return math.ceil(self.config.queries / self.config.data.block_size)
        return math.ceil(self.config.queries / self.config.data.max_new_tokens)

    @property
    def block_size(self) -> int:
        return self.config.data.block_size if self.config.data.stream == "teacher-forced" else self.config.data.max_new_tokens

    def block_length(self, block: int) -> int:
        return min(self.block_size, self.config.queries - block * self.block_size)


def prepare(config: RunConfig, verbose: bool = True) -> PreparedRun:
    """Load models, tokenizer and data, and build the mechanism; every check before any write."""
    set_single_thread()
    runner = build_runner(config.mechanism, config.models.teachers, config.relation)
    models = config.models
    require(not models.device.startswith("cuda") or torch.cuda.is_available(),
            f"models.device = {models.device!r} but CUDA is not available on this machine (use \"cpu\")")
    out = Path(config.out)
    require(not out.exists() or out.is_dir(), f"run.out {out} exists and is not a directory")
    existing = next(parent for parent in (out, *out.parents) if parent.exists())
    require(os.access(existing, os.W_OK | os.X_OK), f"run.out {out}: {existing} is not writable")
    if models.teacher_kind == "icl":  # in-context teachers (Hot PATE): the public model prompted with private examples

        embedded = embedded_icl_default(models.teachers, verbose) if models.embedded else None
        public_path = str(embedded.public_path) if embedded else models.public
        tokenizer_path = str(embedded.tokenizer_path) if embedded else models.tokenizer or models.public
        ensemble = load_icl_ensemble(public_path, tokenizer_path, models.teachers, models.icl_prompt_tokens,
                                     corpus=embedded.corpus if embedded else None, examples_path=models.icl_examples,
                                     device=models.device)
    else:
        if models.embedded:
            # the embedded recipe trains the teachers the config names (full copies or LoRA adapters)
            embedded = build_or_load(teachers=models.teachers, recipe=TinyModelRecipe(teacher_kind=models.teacher_kind),
                                     verbose=verbose)
            public_path, teacher_paths = str(embedded.public_path), [str(p) for p in embedded.teacher_paths]
            tokenizer_path, teacher_kind = str(embedded.tokenizer_path), embedded.recipe.teacher_kind
        else:
            public_path, teacher_paths = models.public, list(models.teacher_paths)
            tokenizer_path, teacher_kind = models.tokenizer or models.public, models.teacher_kind
            embedded = None
        ensemble = Ensemble.from_pretrained(public_path, teacher_paths, teacher_kind, models.device)
    require(ensemble.n_teachers == models.teachers,
            f"models.teachers = {models.teachers} does not match the {ensemble.n_teachers} teachers loaded")
    tokenizer = load_tokenizer(tokenizer_path, "models.tokenizer" if models.tokenizer else
                               "models.public (also the tokenizer unless models.tokenizer is set)")
    require_matching_tokenizer(tokenizer, ensemble.vocab_size, f"tokenizer {tokenizer_path}")
    orders = np.asarray(default_orders(*([runner.params["alpha"]] if "alpha" in runner.params else [])))
    data = config.data
    token_ids, prompts = None, []
    if data.stream == "teacher-forced":
        # in-context teachers describe their room themselves: the model's context less the prompt budget
        room = getattr(ensemble, "context_description", f"the models' n_positions {ensemble.n_positions}")
        require(data.block_size <= ensemble.n_positions, f"data.block_size {data.block_size} exceeds {room}")
        if data.text is not None:
            text, name = read_text_file(data.text, "data.text"), str(data.text)
        else:
            text, name = embedded.corpus.private_heldout, f"embedded-private-heldout(seed={embedded.corpus.seed})"
        token_ids = encode_documents(tokenizer, text)
        require(token_ids.size >= config.queries + 1,
                f"the text has {token_ids.size} tokens, fewer than queries + 1 = {config.queries + 1}")
        digest = hashlib.sha256(text.encode()).hexdigest()
    else:
        prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in data.prompts]
        require(all(len(p) >= 1 for p in prompts), "every prompt must encode to at least one token")
        name, digest = "prompts", hashlib.sha256("\x00".join(data.prompts).encode()).hexdigest()
    data_identity = {"name": name, "sha256": digest, "stream": data.stream,
                     "tokens": int(token_ids.size) if token_ids is not None else None}
    canaries = ([{"teacher": c.shard, "text": c.text, "secret": c.secret} for c in embedded.corpus.canaries]
                if embedded is not None else [])
    gate = None
    if config.budget is not None:
        gate = BudgetGate.plan(asdict(config.budget), runner.step_bound(orders), orders, runner.realised_path_bounds)
    return PreparedRun(config, ensemble, tokenizer, runner, orders, token_ids, prompts, data_identity,
                       str(tokenizer_path), canaries, gate)


def build_manifest(config: RunConfig, runner: Runner, orders: np.ndarray, models: list[dict], vocab_size: int,
                   data_identity: dict, tokenizer_path: str, canaries: list[dict],
                   budget: BudgetGate | None = None, tokenizer_files: dict | None = None) -> dict:
    """manifest.json's content: what ran (the chain's genesis hash binds all of it). `models` holds
    each model's identity (dpledger.decoding.ensemble.ModelIdentity.manifest_entry) and `tokenizer_files` the
    sha256 of each of the tokenizer's files."""
    import transformers

    size = config.data.block_size if config.data.stream == "teacher-forced" else config.data.max_new_tokens
    return {**({"budget": budget.manifest_entry()} if budget is not None else {}),
        **({"tokenizer_files": tokenizer_files} if tokenizer_files is not None else {}),
        "format": "dpledger-trace", "schema_version": trace.SCHEMA_VERSION, "package_version": PACKAGE_VERSION,
        "records_version": RECORDS_VERSION,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config.to_dict(), "config_fingerprint": config.fingerprint(),
        "mechanism": {"type": runner.kind, "params": runner.params, "components": runner.components,
                      "component_relations": {name: runner.relation_of(name).value for name in runner.components}},
        "relation": config.relation,
        "orders": np.asarray(orders).tolist(),
        "models": models, "vocab_size": int(vocab_size), "n_teachers": config.models.teachers,
        "data": data_identity, "tokenizer": tokenizer_path, "canaries": canaries,
        "seeds": {"run": config.seed}, "queries": config.queries, "n_blocks": math.ceil(config.queries / size),
        "replay_payload": config.replay_payload,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


def _outcome_records(runner: Runner, block: int, first_step: int, outcome: BlockOutcome, output_tokens: np.ndarray,
                     true_tokens: np.ndarray, context_tokens: np.ndarray, payload_sha256: str) -> list[dict]:
    output = outcome.output.numpy()
    length = output.shape[0]
    records = []
    for row in range(length):
        true = int(true_tokens[row])
        prob_true = float(output[row, true]) if true >= 0 else math.nan
        passed = True if outcome.screen_passed is None else bool(outcome.screen_passed[row])
        record = {
            "step": first_step + row, "block": block, "position": row, "query_id": f"b{block}-p{row}",
            "context_token": int(context_tokens[row]), "true_token": true, "output_token": int(output_tokens[row]),
            "prob_true_token": prob_true,
            "screen_statistic": math.nan if outcome.screen_statistic is None else float(outcome.screen_statistic[row]),
            "screen_passed": passed, "answered_by": "mechanism" if passed else "public",
            "lambdas": [] if outcome.lambdas is None else outcome.lambdas[row].tolist(),
            "sampled_teachers": [] if outcome.sampled is None else np.flatnonzero(outcome.sampled[row]).tolist(),
            "observed_data_dependent": ([] if outcome.observed_data_dependent is None
                                        else outcome.observed_data_dependent[row].tolist()),
            "eq3_remove_one": [] if outcome.eq3_remove_one is None else outcome.eq3_remove_one[row].tolist(),
            "add_one_bound": [] if outcome.add_one_bound is None else outcome.add_one_bound[row].tolist(),
            "data_independent": [] if outcome.data_independent is None else outcome.data_independent[row].tolist(),
            "payload_sha256": payload_sha256,
        }
        for name in runner.components:
            record[f"rdp_{name}"] = outcome.charged[name][row].tolist()
        if outcome.budget_refused is not None:
            record.update(budget_refused=bool(outcome.budget_refused[row]),
                          budget_charge=float(outcome.budget_charge[row]))
        if outcome.vote_counts is not None:
            voted = np.flatnonzero(outcome.vote_counts[row])
            record.update(vote_seed=int(outcome.vote_seeds[row]), vote_tokens=voted.tolist(),
                          vote_counts=outcome.vote_counts[row, voted].tolist(),
                          aggregator_noise=[float(v) for v in outcome.aggregator_noise[row]])
        records.append(record)
    return records


def _concat_outcomes(outcomes: list[BlockOutcome]) -> BlockOutcome:
    def cat(name):
        parts = [getattr(o, name) for o in outcomes]
        return None if parts[0] is None else np.concatenate(parts)

    return BlockOutcome(output=torch.cat([o.output for o in outcomes]),
                        charged={k: np.concatenate([o.charged[k] for o in outcomes]) for k in outcomes[0].charged},
                        lambdas=cat("lambdas"), sampled=cat("sampled"), screen_statistic=cat("screen_statistic"),
                        screen_passed=cat("screen_passed"), observed_data_dependent=cat("observed_data_dependent"),
                        data_independent=cat("data_independent"), eq3_remove_one=cat("eq3_remove_one"),
                        add_one_bound=cat("add_one_bound"), vote_seeds=cat("vote_seeds"),
                        vote_counts=cat("vote_counts"), budget_refused=cat("budget_refused"),
                        budget_charge=cat("budget_charge"),
                        aggregator_noise=None if outcomes[0].aggregator_noise is None
                        else [noise for o in outcomes for noise in o.aggregator_noise])


def _mechanism_step(runner: Runner, logits: torch.Tensor, randomness: StepGenerators, orders: np.ndarray,
                    budget: BudgetGate | None = None):
    """One call of the mechanism on (N+1, L, V) logits, then one sampled token per row; row i draws
    from randomness' generator i in this order (replay depends on it). With a budget, the filter
    then decides the rows in order (dpledger.decoding.budget)."""
    public, teachers = Ensemble.split_distributions(logits)
    outcome = runner.process(public, teachers, randomness, orders)
    tokens = randomness.multinomial(outcome.output).numpy()
    if budget is not None:
        tokens = budget.apply(outcome, tokens, public, randomness.run_seed, randomness.first_step)
    return outcome, tokens


def replay_steps(runner: Runner, logits: torch.Tensor, seed: int, first_step: int, orders: np.ndarray,
                 sequential: bool, budget: BudgetGate | None = None) -> tuple[BlockOutcome, np.ndarray]:
    """Recompute consecutive steps from their recorded logits (N+1, L, V): the outcome and the
    sampled tokens. Any window of a block replays exactly (per-step randomness); with a budget, the
    gate must hold the filter's state before `first_step`.

    sequential=True replays a free-generation block step by step, as it ran.
    """
    length = logits.shape[1]
    if not sequential:
        return _mechanism_step(runner, logits, StepGenerators.for_steps(seed, first_step, length), orders, budget)
    steps = [_mechanism_step(runner, logits[:, i:i + 1], StepGenerators.for_steps(seed, first_step + i, 1), orders,
                             budget)
             for i in range(length)]
    return _concat_outcomes([o for o, _ in steps]), np.concatenate([t for _, t in steps])


def run_block(prepared: PreparedRun, block: int):
    """Process one block; returns (outcome, output tokens, true tokens, context tokens, logits (N+1, L, V))."""
    length = prepared.block_length(block)
    first_step = block * prepared.block_size
    seed, orders = prepared.config.seed, prepared.orders
    if prepared.config.data.stream == "teacher-forced":
        window = torch.from_numpy(prepared.token_ids[first_step:first_step + length + 1])
        logits = prepared.ensemble.logits(window[:length].unsqueeze(0))[:, 0]
        outcome, tokens = _mechanism_step(prepared.runner, logits, StepGenerators.for_steps(seed, first_step, length),
                                          orders, prepared.budget)
        return outcome, tokens, window[1:].numpy(), window[:length].numpy(), logits
    context = list(prepared.prompts[block % len(prepared.prompts)])
    outcomes, tokens, step_logits, contexts = [], [], [], []
    for i in range(length):
        ids = torch.tensor(context[-prepared.ensemble.n_positions:]).unsqueeze(0)
        current = prepared.ensemble.logits(ids)[:, 0, -1:]
        outcome, token = _mechanism_step(prepared.runner, current, StepGenerators.for_steps(seed, first_step + i, 1),
                                         orders, prepared.budget)
        outcomes.append(outcome)
        tokens.append(int(token[0]))
        step_logits.append(current[:, 0])
        contexts.append(context[-1])
        context.append(int(token[0]))
    return (_concat_outcomes(outcomes), np.asarray(tokens), np.full(length, -1), np.asarray(contexts),
            torch.stack(step_logits, dim=1))


def block_records(prepared: PreparedRun, block: int) -> list[dict]:
    """One block decoded: its replay payload written (when the run keeps one) and its records, not
    yet chained. The prepared run's privacy filter must hold its state before the block."""
    outcome, tokens, true_tokens, contexts, logits = run_block(prepared, block)
    payload = trace.write_replay(prepared.config.out, block, logits.numpy()) if prepared.config.replay_payload else ""
    return _outcome_records(prepared.runner, block, block * prepared.block_size, outcome, tokens, true_tokens,
                            contexts, payload)


RECORDS_VERSION = 2
"""Version 2 records hold Eq. 3 (`eq3_remove_one`) and the add-one bound (`add_one_bound`) apart
from the loss covering the run's relation (`observed_data_dependent`); a trace without the key is
version 1 (that loss only)."""
