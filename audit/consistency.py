"""Integrity checks: the files of a run agree with one another and with the chain's head.

The manifest is bound to the chain (its genesis hash), the records to one another (the chain), the
replay payload to its records (hashes chained in them), ledger.json and the chain's end to the
final record, and the final record to its head hash, which `decode` prints for publication. These
checks say the files are what one run wrote and are mutually consistent; they do not say the
charges are right (that needs the replay, dpledger.audit.replay.check_replay).
"""
from __future__ import annotations

import math
import hashlib

from dpledger.accounting import safe_files
from dpledger.accounting.orders import default_orders
from dpledger.audit.checks import CheckResult, failed, passed, skipped, verdict
from dpledger.audit.loader import LoadedTrace
from dpledger.decoding.vote_payload import payload_format_entry
from dpledger.decoding import trace
from dpledger.decoding.config import BudgetConfig, DataConfig, ModelsConfig, RunConfig
from dpledger.decoding.totals import component_relations
from dpledger.decoding.runners import build_runner
from dpledger.decoding.corpus import generate_corpus


def check_files(loaded: LoadedTrace) -> CheckResult:
    """Every entry of the run directory is a regular file or a directory: dpledger writes nothing
    else, and a link, FIFO, device or socket in a run is planted (a link to make whoever writes
    there write elsewhere, a FIFO or a device to make a reader hang). Nothing is opened or followed.

    Args:
        loaded: the loaded run (load_trace).

    Returns:
        The "files" CheckResult: FAIL naming the first such entries (at most 50 in the evidence), else PASS.
    """
    found = safe_files.special_entries(loaded.directory)
    return verdict("files", not found, "every entry of the run directory is a regular file or a directory (no link, "
                   "FIFO, device or socket)",
                   f"{len(found)} entries of {loaded.directory} are not regular files or directories, which no "
                   "dpledger run holds: " + "; ".join(f"{name} is {kind}" for name, kind in found[:5]),
                   entries=[f"{name}: {kind}" for name, kind in found[:50]])


def check_final_record(loaded: LoadedTrace, expect_head: str | None = None) -> CheckResult:
    """final.json: its head recomputes, it names this manifest's genesis, the chain's last record,
    the step and block counts and ledger.json's hash; with expect_head, the head is the published one.

    Args:
        loaded: the loaded run (load_trace).
        expect_head: the published head (64 lowercase hex digits) to compare with; None: not compared
            (the evidence says the head is not anchored).

    Returns:
        The "final_record" CheckResult: FAIL listing every mismatch, else PASS with the head.
    """
    final = loaded.final
    problems = []
    expected = {"steps": loaded.steps, "blocks": len(loaded.blocks_info), "last_record_hash": loaded.chain_end,
                "genesis_hash": trace.genesis_hash(loaded.manifest), "ledger_sha256": loaded.ledger_sha256,
                "format": "dpledger-final", "schema_version": trace.SCHEMA_VERSION}
    for key, value in expected.items():
        if final.get(key) != value:
            problems.append(f"{key} is {final.get(key)!r}, the run's files give {value!r}")
    unknown = sorted(set(final) - set(expected) - {"head"})
    if unknown:
        problems.append(f"unexpected fields {unknown}")
    head = final.get("head")
    if head != trace.head_of(final):
        problems.append("its head does not hash its fields")
    if expect_head is not None and head != expect_head:
        problems.append(f"head {head} is not the expected (published) head {expect_head}")
    anchored = (f"equals the expected head {expect_head}" if expect_head is not None else
                "not compared with a published head (pass --expect-head to detect a consistently rewritten or "
                "truncated run)")
    return verdict("final_record", not problems,
                   f"final.json closes the chain after {loaded.steps} steps; head {head}: {anchored}",
                   f"{trace.FINAL} does not match the run: " + "; ".join(problems),
                   head=head, expected_head=expect_head, anchored=expect_head is not None and not problems,
                   problems=problems)


def _config_of(manifest: dict) -> RunConfig:
    config = dict(manifest["config"])
    models, data = config.pop("models"), config.pop("data")
    models = {k: tuple(v) if isinstance(v, list) else v for k, v in models.items()}
    data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    config["deltas"] = tuple(config.get("deltas", ()))
    budget = config.pop("budget", None)
    return RunConfig(models=ModelsConfig(**models), data=DataConfig(**data),
                     budget=None if budget is None else BudgetConfig(**budget), **config)


def check_manifest(loaded: LoadedTrace) -> CheckResult:
    """The manifest agrees with its own config: the config validates and has the recorded
    fingerprint; the mechanism rebuilt from it has the recorded type, parameters, components and
    relations; orders, teachers, models, queries, blocks, seeds, stream and payload setting match.

    Args:
        loaded: the loaded run (load_trace).

    Returns:
        The "manifest" CheckResult: FAIL where the config does not validate, its mechanism cannot be
        built, or any recorded field contradicts it (all listed); else PASS.
    """
    manifest = loaded.manifest
    problems = []
    try:
        config = _config_of(manifest)
    except (ValueError, TypeError, KeyError) as error:
        return failed("manifest", f"{trace.MANIFEST}: its config is not a valid run config ({error})")
    if config.fingerprint() != manifest.get("config_fingerprint"):
        problems.append("config_fingerprint is not the hash of its config")
    try:
        runner = build_runner(config.mechanism, config.models.teachers, config.relation)
    except ValueError as error:
        return failed("manifest", f"{trace.MANIFEST}: its config's mechanism cannot be built ({error})")
    mechanism = manifest["mechanism"]
    recorded_relations = mechanism.get("component_relations", {})
    rebuilt: dict[str, object] = {"type": runner.kind, "params": runner.params, "components": runner.components,
                                  "component_relations": {name: runner.relation_of(name).value for name in runner.components}}
    for key, value in rebuilt.items():
        recorded = recorded_relations if key == "component_relations" else mechanism.get(key)
        if recorded != value:
            problems.append(f"mechanism.{key} is {recorded!r}, the config gives {value!r}")
    block_size = config.data.block_size if config.data.stream == "teacher-forced" else config.data.max_new_tokens
    orders = [float(v) for v in default_orders(*([runner.params["alpha"]] if "alpha" in runner.params else []))]
    expected = {"relation": config.relation, "orders": orders, "n_teachers": config.models.teachers,
                "queries": config.queries, "n_blocks": math.ceil(config.queries / block_size),
                "replay_payload": config.replay_payload, "seeds": {"run": config.seed}}
    if "replay_payload_format" in manifest:  # records version 5 on; earlier traces kept the logits
        expected["replay_payload_format"] = payload_format_entry(config.replay_payload_format, config.replay_top_k,
                                                                 runner.kind == "voting")
    for key, value in expected.items():
        if manifest.get(key) != value:
            problems.append(f"{key} is {manifest.get(key)!r}, the config gives {value!r}")
    if manifest["data"].get("stream") != config.data.stream:
        problems.append(f"data.stream is {manifest['data'].get('stream')!r}, the config gives {config.data.stream!r}")
    roles = [m.get("role") for m in manifest["models"]]
    if roles != ["public"] + [f"teacher-{i}" for i in range(config.models.teachers)]:
        problems.append(f"models lists roles {roles}, expected public and {config.models.teachers} teachers")
    if config.models.embedded:
        problems += _embedded_data_problems(manifest, config)
    try:
        component_relations(manifest)
    except (ValueError, KeyError) as error:
        problems.append(f"mechanism.component_relations unreadable ({error})")
    return verdict("manifest", not problems,
                   f"the manifest agrees with its config (fingerprint, mechanism {runner.kind} and its parameters, "
                   f"{len(orders)} orders, {config.models.teachers} teachers, {config.queries} queries, seed, stream)",
                   f"{trace.MANIFEST} contradicts itself: " + "; ".join(problems), problems=problems)


def _embedded_data_problems(manifest: dict, config: RunConfig) -> list[str]:
    """The embedded default's corpus is regenerated from its seed: the planted canaries and the
    held-out text (teacher-forced data) the manifest records must be its own."""
    corpus = generate_corpus(teachers=config.models.teachers)
    problems = []
    canaries = [{"teacher": c.shard, "text": c.text, "secret": c.secret} for c in corpus.canaries]
    if manifest.get("canaries") != canaries:
        problems.append("canaries are not the embedded corpus's planted canaries")
    if config.data.stream == "teacher-forced" and config.data.text is None and \
            manifest["data"].get("sha256") != hashlib.sha256(corpus.private_heldout.encode()).hexdigest():
        problems.append("data.sha256 is not the embedded held-out text's")
    return problems


def check_records(loaded: LoadedTrace) -> CheckResult:
    """Every record fits the manifest (fields, numbering, lengths, ranges, decisions, contexts) and
    there are exactly `queries` of them, numbered 0.. without a gap.

    Args:
        loaded: the loaded run (load_trace).

    Returns:
        The "records" CheckResult: FAIL with the problems load_trace recorded (the first 50) and any
        step-count or composition problem; else PASS.
    """
    problems = list(loaded.problems)
    queries = loaded.manifest["queries"]
    if loaded.steps != queries:
        problems.insert(0, f"the manifest says {queries} queries, the chunks hold {loaded.steps} records")
    if loaded.totals_error:
        problems.append(f"the per-step charges cannot be composed: {loaded.totals_error}")
    more = loaded.problem_count - len(loaded.problems)
    return verdict("records", not problems,
                   f"all {loaded.steps} records fit the manifest (fields, step numbering, array lengths, token ranges, "
                   "screen decisions, context chain, one payload hash per block)",
                   f"{len(problems) + max(more, 0)} record problems, first: " + "; ".join(problems[:5]),
                   problems=problems, records=loaded.steps, manifest_queries=queries)


def check_payload(loaded: LoadedTrace) -> CheckResult:
    """The replay payload is what the run wrote: every block's file is a regular file of its block's
    size with the sha256 chained in its records, and replay/ holds nothing else. A changed, unsafe
    (a link, a FIFO, a device) or oversized file FAILs; a deleted payload is not an integrity
    failure (users delete large payloads) but leaves the replay to the models.

    Args:
        loaded: the loaded run (load_trace).

    Returns:
        The "payload" CheckResult: SKIPPED when the run kept no payload or blocks are missing; FAIL
        naming changed, unreadable or stray files; else PASS.
    """
    if not loaded.manifest.get("replay_payload"):
        return skipped("payload", "the run kept no exact-replay payload")
    def name(index: int) -> str:
        try:
            return loaded.payload_file(index)[0].name
        except trace.TraceError:  # a malformed replay_payload_format: named by the logits' file
            return trace.replay_path(loaded.directory, index).name

    named = {state: [name(index) for index, s in loaded.payload_states.items() if s == state]
             for state in ("changed", "missing", "unreadable")}
    changed, missing, unreadable = named["changed"], named["missing"], named["unreadable"]
    expected = {name(info.index) for info in loaded.blocks_info}
    try:
        listing = safe_files.entries(loaded.directory / trace.REPLAY_DIR, root=loaded.directory)
    except (FileNotFoundError, safe_files.UnsafeFileError):  # absent, or a link: the blocks say so already
        listing = []
    stray = [name for name, _ in listing if name not in expected]
    if changed or unreadable or stray:
        reasons = [loaded.payload_reasons[index] for index, s in loaded.payload_states.items() if s == "unreadable"]
        return failed("payload", "the replay payload is not what the run wrote: "
                      + "; ".join(([f"{', '.join(changed[:5])}: sha256 differs from the hash chained in its records"]
                                   if changed else []) + reasons[:5]
                                  + ([f"unexpected files in replay/: {stray[:5]}"] if stray else [])),
                      changed=changed, unreadable=unreadable, stray=stray, missing=missing)
    if missing:
        return skipped("payload", f"{len(missing)} of {len(loaded.blocks_info)} payload blocks are missing (first: "
                       f"{missing[0]}); the replay needs the run's models instead", missing=missing)
    return passed("payload", f"all {len(loaded.blocks_info)} payload blocks have the sha256 chained in their records")


def check_models(loaded: LoadedTrace) -> CheckResult:
    """The models at the manifest's paths are the ones it names: the sha256 of their weights and of
    their config and tokenizer files, and of the run's tokenizer files. Models that are there but
    differ, or cannot be loaded (a truncated weights file, a config.json that does not parse), FAIL,
    naming the file: either they changed since the run or the manifest was rewritten, and in both
    cases nothing can check the payload against the run's models. Absent models are not a failure
    (the replay then rests on the payload alone, and says so). A trace written before identities
    covered config and tokenizer files is checked on what it records, and the check says what it
    could not check.

    Args:
        loaded: the loaded run (load_trace).

    Returns:
        The "models" CheckResult: PASS (naming what was not checked), FAIL for models that differ or
        cannot be loaded, SKIPPED (with the reason) when they are absent or not used.
    """
    state, manifest = loaded.model_state, loaded.manifest
    if state == "available":
        n, tokenizer, recorded_tokenizer = len(manifest["models"]), manifest.get("tokenizer"), manifest.get(
            "tokenizer_files")
        settings = manifest["config"].get("models") or {}
        from_files = manifest["models"][:1] if settings.get("teacher_kind") == "icl" else manifest["models"]
        weights_only = [m.get("role") for m in from_files if "files" not in m]  # in-context teachers are prompts
        unchecked = [f"the config and tokenizer files of {', '.join(weights_only)} (this trace, written by an older "
                     "dpledger, records their weights only)"] if weights_only else []
        if not isinstance(recorded_tokenizer, dict):
            unchecked.append(f"the files of the tokenizer {tokenizer} (this trace, written by an older dpledger, "
                             "records its path only)")
        elif not recorded_tokenizer:
            unchecked.append(f"the files of the tokenizer {tokenizer} (the run found none to record)")
        checked = (f"the {n} models at the recorded paths " + ("have the weights the manifest records" if weights_only
                   else "are the ones the manifest records (sha256 of their weights, config and tokenizer files)")
                   + ("" if not isinstance(recorded_tokenizer, dict) or not recorded_tokenizer
                      else f", and so is the tokenizer at {tokenizer}"))
        return passed("models", checked + (f"; not checked: {'; '.join(unchecked)}" if unchecked else ""),
                      unchecked=unchecked)
    if state == "different":
        return failed("models", f"the models at the recorded paths are not the ones the manifest names: "
                      f"{'; '.join(loaded.model_problems[:5])}: they changed since the run, or the manifest was rewritten",
                      problems=loaded.model_problems)
    if state == "malformed":
        return failed("models", f"the model files at the recorded paths cannot be loaded: {loaded.model_problems[0]}: "
                      "the run loaded them, so they changed since the run, or the manifest names other files",
                      problems=loaded.model_problems)
    return skipped("models", loaded.model_unavailability())
