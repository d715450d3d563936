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
from typing import TypeVar

import numpy as np
import numpy.typing as npt
import torch

from dpledger.accounting.errors import require
from dpledger.accounting.orders import default_orders
from dpledger.decoding import trace
from dpledger.decoding.budget import BudgetGate
from dpledger.decoding.config import RunConfig, read_text_file
from dpledger.decoding.ensemble import Ensemble, TeacherEnsemble, load_tokenizer, require_matching_tokenizer
from dpledger.decoding.runners import BlockOutcome, Runner, build_runner
from dpledger.mechanisms.randomness import StepGenerators
from dpledger.version import __version__
from dpledger.decoding.embedded import build_or_load
from dpledger.decoding.icl import embedded_icl_default, load_icl_ensemble
from dpledger.decoding.recipe import TinyModelRecipe
from dpledger.decoding.recipe import encode_documents, set_single_thread
from dpledger.decoding.vote_payload import (VotePayload, certify_votes, payload_format_entry, top_race_entries,
                                            write_vote_payload)
from dpledger.mechanisms.voting import VoteCoordination


PACKAGE_VERSION = __version__
T = TypeVar("T")


def _present(value: T | None, what: str) -> T:
    """`value`, which the run's configuration guarantees is there; ValueError naming it otherwise."""
    if value is None:
        raise ValueError(f"{what} is missing")
    return value


@dataclass
class PreparedRun:
    """A run ready to decode: its configuration, the loaded models and tokenizer, the mechanism, the
    Renyi orders, the data (the token stream of a teacher-forced run, or the prompts of free
    generation), the data's and tokenizer's identity, the embedded corpus's canaries, and the privacy
    filter (None without a budget)."""

    config: RunConfig
    ensemble: TeacherEnsemble
    tokenizer: object
    runner: Runner
    orders: npt.NDArray[np.float64]
    token_ids: npt.NDArray[np.int64] | None
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
        """How many steps block `block` has: the block size, less for the last block.

        Args:
            block: the block's index (0-based, below n_blocks).

        Returns:
            min(block_size, queries - block * block_size).
        """
        return min(self.block_size, self.config.queries - block * self.block_size)


def prepare(config: RunConfig, verbose: bool = True) -> PreparedRun:
    """Load models, tokenizer and data, and build the mechanism; every check before any write.

    Args:
        config: the run's configuration.
        verbose: let the embedded default report its training or cache use.

    Returns:
        The prepared run; nothing has been written to the run directory.

    Raises:
        ValueError: if the mechanism's parameters, the device, the output path, the models, the
            tokenizer, the data or the budget do not fit the configuration (one line naming what).
    """
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
        public_path = str(embedded.public_path) if embedded else _present(models.public, "models.public")
        tokenizer_path = str(embedded.tokenizer_path) if embedded else models.tokenizer or public_path
        ensemble: TeacherEnsemble = load_icl_ensemble(public_path, tokenizer_path, models.teachers, models.icl_prompt_tokens,
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
            public_path, teacher_paths = _present(models.public, "models.public"), list(models.teacher_paths)
            tokenizer_path, teacher_kind = models.tokenizer or public_path, models.teacher_kind
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
            corpus = _present(embedded, "data.text (the models are not the embedded default)").corpus
            text, name = corpus.private_heldout, f"embedded-private-heldout(seed={corpus.seed})"
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
        step_bound = _present(runner.step_bound, f"mechanism {runner.kind}'s data-independent step bound")
        gate = BudgetGate.plan(asdict(config.budget), step_bound(orders), orders, runner.realised_path_bounds)
    return PreparedRun(config, ensemble, tokenizer, runner, orders, token_ids, prompts, data_identity,
                       str(tokenizer_path), canaries, gate)


def build_manifest(config: RunConfig, runner: Runner, orders: npt.NDArray[np.float64], models: list[dict],
                   vocab_size: int, data_identity: dict, tokenizer_path: str, canaries: list[dict],
                   budget: BudgetGate | None = None, tokenizer_files: dict | None = None) -> dict:
    """manifest.json's content: what ran (the chain's genesis hash binds all of it). `models` holds
    each model's identity (dpledger.decoding.ensemble.ModelIdentity.manifest_entry) and `tokenizer_files` the
    sha256 of each of the tokenizer's files.

    Args:
        config: the run's configuration (recorded with its fingerprint).
        runner: the mechanism (its kind, parameters, components and their relations are recorded).
        orders: the Renyi orders of the ledger.
        models: each model's identity entry, the public model first.
        vocab_size: the models' shared vocabulary size V.
        data_identity: the data's name, sha256, stream and token count.
        tokenizer_path: where the tokenizer was loaded from.
        canaries: the embedded corpus's canaries (teacher, text, secret); empty otherwise.
        budget: the privacy filter, whose plan is recorded; None without a budget.
        tokenizer_files: the sha256 of each tokenizer file, by name; None: not recorded.

    Returns:
        The manifest: format and schema and records versions, package and library versions, the
        start time, and everything above.
    """
    import transformers

    size = config.data.block_size if config.data.stream == "teacher-forced" else config.data.max_new_tokens
    return {**({"budget": budget.manifest_entry()} if budget is not None else {}),
        **({"tokenizer_files": tokenizer_files} if tokenizer_files is not None else {}),
        "format": "dpledger-trace", "schema_version": trace.SCHEMA_VERSION, "package_version": PACKAGE_VERSION,
        "records_version": trace.RECORDS_VERSION,
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
        "replay_payload_format": payload_format_entry(config.replay_payload_format, config.replay_top_k,
                                                      runner.kind == "voting"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


def _row(values: npt.NDArray[np.float64] | None, row: int) -> list[float]:
    """Row `row` of a per-step array as a list; [] where the mechanism does not compute it."""
    return [] if values is None else values[row].tolist()


def _outcome_records(runner: Runner, block: int, first_step: int, outcome: BlockOutcome,
                     output_tokens: npt.NDArray[np.int64], true_tokens: npt.NDArray[np.int64],
                     context_tokens: npt.NDArray[np.int64], payload_sha256: str) -> list[dict]:
    output = outcome.output.numpy()
    length = output.shape[0]
    losses = trace.records_losses(trace.RECORDS_VERSION, runner.components)
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
            "data_independent": [] if outcome.data_independent is None else outcome.data_independent[row].tolist(),
            "payload_sha256": payload_sha256,
        }
        if losses:
            record.update(observed_data_dependent=_row(outcome.observed_data_dependent, row),
                          eq3_remove_one=_row(outcome.eq3_remove_one, row), add_one_bound=_row(outcome.add_one_bound, row))
        for name in runner.components:
            record[f"rdp_{name}"] = outcome.charged[name][row].tolist()
        if outcome.budget_refused is not None:
            record.update(budget_refused=bool(outcome.budget_refused[row]),
                          budget_charge=float(_present(outcome.budget_charge, "budget_charge")[row]))
        if outcome.vote_counts is not None:
            voted = np.flatnonzero(outcome.vote_counts[row])
            noise = _present(outcome.aggregator_noise, "aggregator_noise")
            record.update(vote_seed=int(_present(outcome.vote_seeds, "vote_seeds")[row]), vote_tokens=voted.tolist(),
                          vote_counts=outcome.vote_counts[row, voted].tolist(),
                          aggregator_noise=[float(v) for v in noise[row]])
        records.append(record)
    return records


def _concat_outcomes(outcomes: list[BlockOutcome]) -> BlockOutcome:
    def cat(name: str) -> np.ndarray | None:
        parts = [getattr(o, name) for o in outcomes]
        return None if parts[0] is None else np.concatenate(parts)

    return BlockOutcome(output=torch.cat([o.output for o in outcomes]),
                        charged={k: np.concatenate([o.charged[k] for o in outcomes]) for k in outcomes[0].charged},
                        lambdas=cat("lambdas"), sampled=cat("sampled"), screen_statistic=cat("screen_statistic"),
                        screen_passed=cat("screen_passed"), observed_data_dependent=cat("observed_data_dependent"),
                        data_independent=cat("data_independent"), eq3_remove_one=cat("eq3_remove_one"),
                        add_one_bound=cat("add_one_bound"), eq3_allowance=cat("eq3_allowance"), vote_seeds=cat("vote_seeds"),
                        vote_counts=cat("vote_counts"), budget_refused=cat("budget_refused"),
                        budget_charge=cat("budget_charge"),
                        aggregator_noise=None if outcomes[0].aggregator_noise is None
                        else [noise for o in outcomes for noise in _present(o.aggregator_noise, "aggregator_noise")])


def _mechanism_step(runner: Runner, logits: torch.Tensor, randomness: StepGenerators, orders: npt.NDArray[np.float64],
                    budget: BudgetGate | None = None,
                    distributions: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[BlockOutcome, npt.NDArray[np.int64]]:
    """One call of the mechanism on (N+1, L, V) logits, then one sampled token per row; row i draws
    from randomness' generator i in this order (replay depends on it). With a budget, the filter
    then decides the rows in order (dpledger.decoding.budget). `distributions`: the logits'
    Ensemble.split_distributions, where the caller has them already."""
    public, teachers = distributions if distributions is not None else Ensemble.split_distributions(logits)
    outcome = runner.process(public, teachers, randomness, orders)
    tokens = randomness.multinomial(outcome.output).numpy()
    if budget is not None:
        tokens = budget.apply(outcome, tokens, public, _present(randomness.run_seed, "the run seed"),
                              _present(randomness.first_step, "the block's first step"))
    return outcome, tokens


def replay_steps(runner: Runner, logits: torch.Tensor, seed: int, first_step: int, orders: npt.NDArray[np.float64],
                 sequential: bool, budget: BudgetGate | None = None,
                 distributions: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[BlockOutcome, npt.NDArray[np.int64]]:
    """Recompute consecutive steps from their recorded logits (N+1, L, V): the outcome and the
    sampled tokens. Any window of a block replays exactly (per-step randomness); with a budget, the
    gate must hold the filter's state before `first_step`.

    sequential=True replays a free-generation block step by step, as it ran.

    Args:
        runner: the run's mechanism.
        logits: the recorded float32 logits (N+1, L, V) of L consecutive steps, the public model first.
        seed: the run's seed.
        first_step: the run-wide index of the first of the L steps.
        orders: the ledger's Renyi orders.
        sequential: replay one step at a time (free generation) rather than the L steps at once.
        budget: the run's privacy filter, in its state before `first_step`; None without a budget.
        distributions: Ensemble.split_distributions(logits), where the caller has formed them (the
            audit's one pass over the windows); None: formed here. Not used step by step (sequential).

    Returns:
        (the mechanism's outcome on the L steps, the L sampled tokens).
    """
    length = logits.shape[1]
    if not sequential:
        return _mechanism_step(runner, logits, StepGenerators.for_steps(seed, first_step, length), orders, budget,
                               distributions)
    steps = [_mechanism_step(runner, logits[:, i:i + 1], StepGenerators.for_steps(seed, first_step + i, 1), orders,
                             budget)
             for i in range(length)]
    return _concat_outcomes([o for o, _ in steps]), np.concatenate([t for _, t in steps])


def replay_vote_steps(runner: Runner, payload: VotePayload, seed: int, first_step: int,
                      orders: npt.NDArray[np.float64], sequential: bool, vocabulary_size: int,
                      budget: BudgetGate | None = None) -> tuple[BlockOutcome, npt.NDArray[np.int64],
                                                                  list[tuple[int, str]]]:
    """Recompute consecutive voting steps from their bounded payload (dpledger.decoding.vote_payload):
    the votes certified from the stored race entries, then the runner on the public distributions
    and those votes, as replay_steps does on the logits.

    Args:
        runner: the run's voting mechanism (with process_votes).
        payload: the steps' bounded payload.
        seed: the run's seed.
        first_step: the run-wide index of the first step.
        orders: the ledger's Renyi orders.
        sequential: replay one step at a time (free generation) rather than the L steps at once.
        vocabulary_size: V.
        budget: the run's privacy filter, in its state before `first_step`; None without a budget.

    Returns:
        (the outcome, the L sampled tokens, the steps whose argmax certificate failed (certify_votes)).

    Raises:
        ValueError: if the runner is not a voting runner.
    """
    process_votes = _present(runner.process_votes, "a voting runner's process_votes")
    length = payload.steps
    generators = StepGenerators.for_steps(seed, first_step, length)
    votes, problems = certify_votes(payload, generators.vote_seeds(), VoteCoordination(runner.params["votes"]),
                                    vocabulary_size)
    public = torch.softmax(torch.from_numpy(payload.public_logits).double(), dim=-1)

    def step(rows: slice, randomness: StepGenerators) -> tuple[BlockOutcome, npt.NDArray[np.int64]]:
        outcome = process_votes(public[rows], votes[rows], randomness, orders)
        tokens = randomness.multinomial(outcome.output).numpy()
        if budget is not None:
            tokens = budget.apply(outcome, tokens, public[rows], seed,
                                  _present(randomness.first_step, "the window's first step"))
        return outcome, tokens

    if not sequential:
        outcome, tokens = step(slice(0, length), generators)
        return outcome, tokens, problems
    steps = [step(slice(i, i + 1), StepGenerators.for_steps(seed, first_step + i, 1)) for i in range(length)]
    return _concat_outcomes([o for o, _ in steps]), np.concatenate([t for _, t in steps]), problems


def run_block(prepared: PreparedRun, block: int) -> tuple[BlockOutcome, npt.NDArray[np.int64], npt.NDArray[np.int64],
                                                         npt.NDArray[np.int64], torch.Tensor]:
    """Process one block; returns (outcome, output tokens, true tokens, context tokens, logits (N+1, L, V)).

    Args:
        prepared: the prepared run; its privacy filter must hold its state before the block.
        block: the block's index (0-based).

    Returns:
        The mechanism's outcome on the block's L steps, the L sampled tokens, the L true next tokens
        (-1 in free generation), the L context tokens each step followed, and the float32 logits
        (N+1, L, V) the mechanism saw.
    """
    length = prepared.block_length(block)
    first_step = block * prepared.block_size
    seed, orders = prepared.config.seed, prepared.orders
    if prepared.config.data.stream == "teacher-forced":
        window = torch.from_numpy(_present(prepared.token_ids, "the teacher-forced token stream")[
            first_step:first_step + length + 1])
        logits = prepared.ensemble.logits(window[:length].unsqueeze(0))[:, 0]
        outcome, tokens = _mechanism_step(prepared.runner, logits, StepGenerators.for_steps(seed, first_step, length),
                                          orders, prepared.budget)
        return outcome, tokens, window[1:].numpy(), window[:length].numpy(), logits
    context = list(prepared.prompts[block % len(prepared.prompts)])
    outcomes: list[BlockOutcome] = []
    generated: list[int] = []
    step_logits: list[torch.Tensor] = []
    contexts: list[int] = []
    for i in range(length):
        ids = torch.tensor(context[-prepared.ensemble.n_positions:]).unsqueeze(0)
        current = prepared.ensemble.logits(ids)[:, 0, -1:]
        outcome, token = _mechanism_step(prepared.runner, current, StepGenerators.for_steps(seed, first_step + i, 1),
                                         orders, prepared.budget)
        outcomes.append(outcome)
        generated.append(int(token[0]))
        step_logits.append(current[:, 0])
        contexts.append(context[-1])
        context.append(int(token[0]))
    return (_concat_outcomes(outcomes), np.asarray(generated), np.full(length, -1), np.asarray(contexts),
            torch.stack(step_logits, dim=1))


def block_records(prepared: PreparedRun, block: int) -> list[dict]:
    """One block decoded: its replay payload written (when the run keeps one) and its records, not
    yet chained. The prepared run's privacy filter must hold its state before the block.

    Args:
        prepared: the prepared run.
        block: the block's index (0-based).

    Returns:
        The block's per-step records (fields of trace.RECORDS_VERSION), without prev_hash and record_hash.

    Raises:
        UnsafeFileError: if the replay payload's path is a link or not a regular file.
        OSError: if the replay payload cannot be written.
    """
    outcome, tokens, true_tokens, contexts, logits = run_block(prepared, block)
    payload = ""
    if prepared.config.replay_payload:
        entry = payload_format_entry(prepared.config.replay_payload_format, prepared.config.replay_top_k,
                                     prepared.runner.kind == "voting")
        if entry["format"] == trace.VOTE_FORMAT:
            seeds = _present(outcome.vote_seeds, "a voting step's vote seed").tolist()
            coordination = VoteCoordination(prepared.runner.params["votes"])
            payload = write_vote_payload(prepared.config.out, block,
                                         top_race_entries(logits, seeds, coordination, entry["top_k"]))
        else:
            payload = trace.write_replay(prepared.config.out, block, logits.numpy())
    return _outcome_records(prepared.runner, block, block * prepared.block_size, outcome, tokens, true_tokens,
                            contexts, payload)
