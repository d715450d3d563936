"""The decode loop: run a mechanism over a query stream, charge the ledger, write the trace.

Blocks of queries are processed in order; block b uses a torch generator seeded from
(run seed, b) for every random draw (screening noise, Poisson masks, the sampled token), so a
resumed run reproduces an uninterrupted one exactly. After each block its records are chained and
committed atomically (trace.py). ledger.json is computed from the committed records alone.
"""
from __future__ import annotations

import hashlib
import math
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from accounting.conversion import ConversionMethod, epsilon_from_rdp
from accounting.errors import require
from accounting.ledger import PrivacyLedger
from accounting.orders import default_orders
from accounting.relation import NeighbouringRelation
from decoding import trace
from decoding.config import RunConfig
from decoding.ensemble import Ensemble
from decoding.runners import BlockOutcome, Runner, build_runner

PACKAGE_VERSION = "0.1.0"


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

    @property
    def n_blocks(self) -> int:
        if self.config.data.stream == "teacher-forced":
            return math.ceil(self.config.queries / self.config.data.block_size)
        return math.ceil(self.config.queries / self.config.data.max_new_tokens)

    def block_length(self, block: int) -> int:
        size = self.config.data.block_size if self.config.data.stream == "teacher-forced" else self.config.data.max_new_tokens
        return min(size, self.config.queries - block * size)


def block_generator(seed: int, block: int) -> torch.Generator:
    digest = hashlib.sha256(f"dpledger-block:{seed}:{block}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def prepare(config: RunConfig, verbose: bool = True) -> PreparedRun:
    """Load models, tokenizer and data, and build the mechanism; every check before any write."""
    from decoding.recipe import encode_documents, set_single_thread

    set_single_thread()
    runner = build_runner(config.mechanism, config.models.teachers, config.relation)
    models = config.models
    if models.embedded:
        from decoding.embedded import build_or_load

        embedded = build_or_load(teachers=models.teachers, verbose=verbose)
        public_path, teacher_paths = str(embedded.public_path), [str(p) for p in embedded.teacher_paths]
        tokenizer_path, teacher_kind = str(embedded.tokenizer_path), embedded.recipe.teacher_kind
    else:
        public_path, teacher_paths = models.public, list(models.teacher_paths)
        tokenizer_path, teacher_kind = models.tokenizer or models.public, models.teacher_kind
        embedded = None
    ensemble = Ensemble.from_pretrained(public_path, teacher_paths, teacher_kind, models.device)
    require(ensemble.n_teachers == models.teachers,
            f"models.teachers = {models.teachers} does not match the {ensemble.n_teachers} teachers loaded")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    require(len(tokenizer) <= ensemble.vocab_size,
            f"tokenizer has {len(tokenizer)} tokens but the models' vocabulary is {ensemble.vocab_size}")
    orders = np.asarray(default_orders(*([runner.params["alpha"]] if "alpha" in runner.params else [])))
    data = config.data
    token_ids, prompts = None, []
    if data.stream == "teacher-forced":
        require(data.block_size <= ensemble.n_positions,
                f"data.block_size {data.block_size} exceeds the models' n_positions {ensemble.n_positions}")
        if data.text is not None:
            text, name = Path(data.text).read_text(), str(data.text)
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
    return PreparedRun(config, ensemble, tokenizer, runner, orders, token_ids, prompts, data_identity,
                       str(tokenizer_path), canaries)


def _manifest(prepared: PreparedRun) -> dict:
    import transformers

    config = prepared.config
    return {
        "format": "dpledger-trace", "schema_version": trace.SCHEMA_VERSION, "package_version": PACKAGE_VERSION,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config.to_dict(), "config_fingerprint": config.fingerprint(),
        "mechanism": {"type": prepared.runner.kind, "params": prepared.runner.params,
                      "components": prepared.runner.components,
                      "component_relations": {name: prepared.runner.relation_of(name).value
                                              for name in prepared.runner.components}},
        "relation": config.relation,
        "orders": prepared.orders.tolist(),
        "models": [vars(identity) for identity in prepared.ensemble.identities],
        "vocab_size": prepared.ensemble.vocab_size, "n_teachers": prepared.ensemble.n_teachers,
        "data": prepared.data_identity, "tokenizer": prepared.tokenizer_path, "canaries": prepared.canaries,
        "seeds": {"run": config.seed}, "queries": config.queries, "n_blocks": prepared.n_blocks,
        "replay_payload": config.replay_payload,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


def _open_run_dir(prepared: PreparedRun, resume: bool) -> Path:
    out = Path(prepared.config.out)
    if out.exists() and any(out.iterdir()):
        if not resume:
            raise ValueError(f"output directory {out} already holds files: pass --resume to continue that run, "
                             "or choose another --out")
        manifest = trace.read_manifest(out)
        if manifest.get("config_fingerprint") != prepared.config.fingerprint():
            raise ValueError(f"output directory {out} holds another run (its config differs from this one)")
        if [m["content_hash"] for m in manifest["models"]] != [i.content_hash for i in prepared.ensemble.identities]:
            raise ValueError(f"output directory {out} was written with different model weights")
        for stale in out.rglob(".*.tmp-*"):
            stale.unlink()
        return out
    out.mkdir(parents=True, exist_ok=True)
    (out / trace.STEPS_DIR).mkdir()
    if prepared.config.replay_payload:
        (out / trace.REPLAY_DIR).mkdir()
    trace.atomic_write_json(out / trace.MANIFEST, _manifest(prepared))
    return out


def _outcome_records(prepared: PreparedRun, block: int, first_step: int, outcome: BlockOutcome,
                     output_tokens: np.ndarray, true_tokens: np.ndarray, context_tokens: np.ndarray) -> list[dict]:
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
            "data_independent": [] if outcome.data_independent is None else outcome.data_independent[row].tolist(),
        }
        for name in prepared.runner.components:
            record[f"rdp_{name}"] = outcome.charged[name][row].tolist()
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
                        data_independent=cat("data_independent"))


def _mechanism_step(runner: Runner, logits: torch.Tensor, generator: torch.Generator, orders: np.ndarray):
    """One call of the mechanism on (N+1, L, V) logits, then one sampled token per row, in this order
    of generator use (replay depends on it)."""
    public, teachers = Ensemble.split_distributions(logits)
    outcome = runner.process(public, teachers, generator, orders)
    tokens = torch.multinomial(outcome.output, 1, generator=generator)[:, 0].numpy()
    return outcome, tokens


def replay_block(runner: Runner, logits: torch.Tensor, seed: int, block: int, orders: np.ndarray,
                 sequential: bool) -> tuple[BlockOutcome, np.ndarray]:
    """Recompute a block from its recorded logits (N+1, L, V): the outcome and the sampled tokens.

    sequential=True replays a free-generation block step by step, as it ran.
    """
    generator = block_generator(seed, block)
    if not sequential:
        return _mechanism_step(runner, logits, generator, orders)
    steps = [_mechanism_step(runner, logits[:, i:i + 1], generator, orders) for i in range(logits.shape[1])]
    return _concat_outcomes([o for o, _ in steps]), np.concatenate([t for _, t in steps])


def run_block(prepared: PreparedRun, block: int):
    """Process one block; returns (outcome, output tokens, true tokens, context tokens, logits (N+1, L, V))."""
    generator = block_generator(prepared.config.seed, block)
    length = prepared.block_length(block)
    orders = prepared.orders
    if prepared.config.data.stream == "teacher-forced":
        start = block * prepared.config.data.block_size
        window = torch.from_numpy(prepared.token_ids[start:start + length + 1])
        logits = prepared.ensemble.logits(window[:length].unsqueeze(0))[:, 0]
        outcome, tokens = _mechanism_step(prepared.runner, logits, generator, orders)
        return outcome, tokens, window[1:].numpy(), window[:length].numpy(), logits
    context = list(prepared.prompts[block % len(prepared.prompts)])
    outcomes, tokens, step_logits, contexts = [], [], [], []
    for _ in range(length):
        ids = torch.tensor(context[-prepared.ensemble.n_positions:]).unsqueeze(0)
        current = prepared.ensemble.logits(ids)[:, 0, -1:]
        outcome, token = _mechanism_step(prepared.runner, current, generator, orders)
        outcomes.append(outcome)
        tokens.append(int(token[0]))
        step_logits.append(current[:, 0])
        contexts.append(context[-1])
        context.append(int(token[0]))
    return (_concat_outcomes(outcomes), np.asarray(tokens), np.full(length, -1), np.asarray(contexts),
            torch.stack(step_logits, dim=1))


def component_relations(manifest: dict) -> dict[str, NeighbouringRelation]:
    """The neighbouring relation each charged component holds for. A trace written before components
    carried one labelled everything add-or-remove; its data-dependent components are Flemings et al.
    2024, Eq. 3, which covers removing a teacher only, so they are read as remove-one."""
    components = manifest["mechanism"]["components"]
    recorded = manifest["mechanism"].get("component_relations")
    if recorded is not None:
        return {name: NeighbouringRelation(recorded[name]) for name in components}
    return {name: NeighbouringRelation.REMOVE_ONE if dependent else NeighbouringRelation.ADD_OR_REMOVE_ONE
            for name, dependent in components.items()}


def ledger_from_records(records: list[dict], manifest: dict) -> PrivacyLedger:
    """The ledger recomputed from committed per-step records (what the audit recomputes too). Its
    total holds for the neighbours every component covers (`total_relation`), whatever the run claims."""
    ledger = PrivacyLedger(manifest["orders"], NeighbouringRelation.ADD_OR_REMOVE_ONE)
    components = manifest["mechanism"]["components"]
    relations = component_relations(manifest)
    if records:
        ledger.charge_many({name: (np.asarray([r[f"rdp_{name}"] for r in records], dtype=np.float64), dependent,
                                   relations[name])
                            for name, dependent in components.items()})
    return ledger


def ledger_summary(records: list[dict], manifest: dict) -> dict:
    """ledger.json's content: composed curve, epsilon per delta and conversion, breakdown, utility."""
    ledger = ledger_from_records(records, manifest)
    deltas = manifest["config"]["deltas"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        epsilons = [{"delta": d, "method": m.value, **_conversion_dict(ledger.epsilon(d, m))}
                    for d in deltas for m in ConversionMethod]
        breakdown = ledger.breakdown(deltas[0]).to_dict()
    probs = np.asarray([r["prob_true_token"] for r in records], dtype=np.float64)
    teacher_forced = manifest["data"]["stream"] == "teacher-forced"
    with np.errstate(divide="ignore"):
        ppl = float(np.exp(-np.mean(np.log(probs)))) if teacher_forced and records else None
    observed = [r["observed_data_dependent"] for r in records if r["observed_data_dependent"]]
    summary = {
        "steps": ledger.steps, "data_dependent": ledger.total_curve().data_dependent,
        "direction": ledger.total_curve().direction.value,
        "relation": ledger.total_relation.value, "claimed_relation": manifest["relation"],
        "accounting": manifest["mechanism"]["params"].get("accounting"),
        "ledger": ledger.to_dict(), "epsilon": epsilons, "breakdown": breakdown,
        "perplexity": ppl, "answered_by_public": int(sum(r["answered_by"] == "public" for r in records)),
        "warnings": sorted({str(w.message) for w in caught}),
    }
    if observed:
        from accounting.curve import RdpCurve

        relation = NeighbouringRelation.REMOVE_ONE  # Eq. 3 covers removing a teacher only
        answered = np.asarray([r["answered_by"] == "mechanism" for r in records if r["observed_data_dependent"]])[:, None]
        observed = np.where(answered, np.asarray(observed, dtype=np.float64), 0.0)
        bound = np.where(answered, np.asarray([r["data_independent"] for r in records if r["observed_data_dependent"]],
                                              dtype=np.float64), 0.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for key, per_step, note in (
                    ("observed_data_dependent_total", observed, "seed Eq. 3 on the answered steps; not charged "
                     "unless the mechanism charges it"),
                    ("min_data_dependent_theorem_3_1_total", np.minimum(observed, bound),
                     "min(data-dependent, Theorem 3.1) per step: NOT a valid charge, Theorem 3.1 is not guaranteed "
                     "(SPEC section 3); recorded for comparison only")):
                curve = RdpCurve(manifest["orders"], per_step.sum(axis=0), relation, True)
                summary[key] = {**curve.to_dict(), **_conversion_dict(epsilon_from_rdp(curve, deltas[0])), "note": note}
    return summary


def _conversion_dict(result) -> dict:
    return {"epsilon": result.epsilon, "order": result.order, "rdp_at_order": result.rdp_at_order,
            "conversion_term": result.conversion_term, "at_grid_edge": result.at_grid_edge,
            "data_dependent": result.data_dependent, "direction": result.direction.value}


@dataclass
class RunResult:
    directory: Path
    summary: dict
    resumed_from_step: int


def run_decode(config: RunConfig, resume: bool = False, progress: bool = True, verbose: bool = True,
               prepared: PreparedRun | None = None) -> RunResult:
    """Run (or resume) a decoding job and return its directory and ledger summary."""
    prepared = prepared or prepare(config, verbose=verbose)
    out = _open_run_dir(prepared, resume)
    manifest = trace.read_manifest(out)
    if (out / trace.LEDGER).exists():
        return RunResult(out, trace.read_ledger(out), prepared.config.queries)
    records = trace.read_records(out)
    done_blocks = len(trace.committed_chunk_indices(out))
    prev_hash = trace.last_hash(records)
    step = len(records)
    running = ledger_from_records(records, manifest)
    first_delta = config.deltas[0]
    bar = tqdm(total=config.queries, initial=step, unit="q", desc=f"{prepared.runner.kind}", disable=not progress,
               dynamic_ncols=True)
    started = time.time()
    try:
        for block in range(done_blocks, prepared.n_blocks):
            outcome, tokens, true_tokens, contexts, logits = run_block(prepared, block)
            block_records = _outcome_records(prepared, block, step, outcome, tokens, true_tokens, contexts)
            prev_hash = trace.chain_records(block_records, prev_hash)
            if config.replay_payload:
                trace.write_replay(out, block, logits=logits.numpy(), context=contexts)
            # charged (and so validated: no NaN, no negative value) before the commit point, so a bad
            # charge never reaches the trace
            running.charge_many({name: (outcome.charged[name], dep) for name, dep in prepared.runner.components.items()})
            trace.write_chunk(out, block, block_records)  # the commit point
            step += len(block_records)
            bar.update(len(block_records))
            with np.errstate(all="ignore"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    eps = running.epsilon(first_delta).epsilon
            bar.set_postfix(eps=f"{eps:.3g}", qps=f"{(step - len(records)) / max(time.time() - started, 1e-9):.0f}")
    finally:
        bar.close()
    all_records = trace.read_records(out)
    summary = ledger_summary(all_records, manifest)
    trace.atomic_write_json(out / trace.LEDGER, summary)
    return RunResult(out, summary, len(records))
