"""In-context teachers (Hot PATE, Cohen et al. 2023): one public model prompted with each
teacher's disjoint private examples, in one batched forward, as a drop-in for Ensemble."""
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from dpledger.audit.audit import audit_run
from dpledger.audit.loader import load_trace
from dpledger.decoding import icl, trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.corpus import generate_corpus
from dpledger.decoding.ensemble import load_causal_lm, model_content_hash
from dpledger.decoding.icl import (InContextEnsemble, icl_teacher_prompts, partition_records, prompt_token_ids,
                          read_icl_examples)
from dpledger.decoding.run import run_decode
from tests.micro import MICRO_CORPUS, micro_config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer(micro_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(micro_models.tokenizer))


@pytest.fixture(scope="module")
def micro_corpus():
    return generate_corpus(teachers=3, **MICRO_CORPUS)


def test_batched_teacher_logits_equal_each_unpadded_sequence(micro_models, micro_corpus, tokenizer, monkeypatch):
    # prompts of different lengths: whole short examples, and a long one cut at the budget
    prompts = ["Hi\n\n", "Customer: Hi\n\n", "Agent: Sure.\n\nCustomer: Thanks.\n\nAgent: Bye.\n\n",
               *icl_teacher_prompts(micro_corpus, 3, 20, tokenizer)]
    ensemble = InContextEnsemble.from_pretrained(str(micro_models.public), prompts, tokenizer, 20)
    ids = [prompt_token_ids(tokenizer, p, 20) for p in prompts]
    assert len({len(i) for i in ids}) >= 3 and max(len(i) for i in ids) == 20
    assert ensemble.n_positions == 64 - 20 and ensemble.n_teachers == 6 and ensemble.vocab_size == 320
    query = torch.randint(0, 320, (2, 30), generator=torch.Generator().manual_seed(0))
    logits = ensemble.logits(query)
    assert logits.shape == (7, 2, 30, 320) and logits.dtype == torch.float32
    model = load_causal_lm(str(micro_models.public))
    with torch.no_grad():
        torch.testing.assert_close(logits[0], model(input_ids=query).logits, atol=1e-5, rtol=0)
        for row, prompt in enumerate(ids, start=1):
            alone = torch.cat([torch.tensor(prompt)[None].expand(2, -1), query], dim=1)
            torch.testing.assert_close(logits[row], model(input_ids=alone).logits[:, -30:], atol=1e-5, rtol=0)
    monkeypatch.setattr(icl, "TOKENS_PER_FORWARD", 100)  # one row per forward: chunking changes nothing
    torch.testing.assert_close(ensemble.logits(query), logits, atol=1e-5, rtol=0)
    public, teachers = ensemble.distributions(query)
    assert public.shape == (2, 30, 320) and teachers.shape == (2, 30, 6, 320)
    with pytest.raises(ValueError, match=r"query length 45 must be in \[1, 44\]"):
        ensemble.logits(torch.zeros(1, 45, dtype=torch.long))


def test_the_public_fallback_reads_nothing_private(micro_models, tokenizer):
    """The public row and the query's room depend on the public budget only: ensembles that differ
    in one teacher's prompt (and in its length) give bit-identical public logits and n_positions."""
    short = InContextEnsemble.from_pretrained(str(micro_models.public), ["Hi\n\n", "Customer: Hi\n\n"], tokenizer, 20)
    long = InContextEnsemble.from_pretrained(str(micro_models.public), ["Hi\n\n", "Agent: Sure.\n\nCustomer: Thanks "
                                             "a lot, that is all for today.\n\n"], tokenizer, 20)
    assert short.n_positions == long.n_positions == 64 - 20
    query = torch.randint(0, 320, (1, 12), generator=torch.Generator().manual_seed(1))
    assert torch.equal(short.logits(query)[0], long.logits(query)[0])
    assert not torch.equal(short.logits(query)[2], long.logits(query)[2])


def test_private_records_partition_into_disjoint_teacher_groups(micro_corpus, tokenizer):
    records = [r for shard in micro_corpus.shards for r in shard.split("\n\n")]
    for teachers in (1, 3, 16, 64):
        groups = partition_records(micro_corpus, teachers)
        assert len(groups) == teachers and all(groups)
        assert Counter(r for g in groups for r in g) == Counter(records)  # every record in exactly one group
        assert max(map(len, groups)) - min(map(len, groups)) <= 1 + len(micro_corpus.shards)
    # one group per shard when N = S: a planted canary's recorded teacher (its shard) holds it
    assert partition_records(micro_corpus, 3) == [s.split("\n\n") for s in micro_corpus.shards]
    canary_copies = {c.text for c in micro_corpus.canaries}
    prompts = icl_teacher_prompts(micro_corpus, 16, 200, tokenizer)
    shown = [set(p.removesuffix("\n\n").split("\n\n")) for p in prompts]
    for i, group in enumerate(partition_records(micro_corpus, 16)):
        assert shown[i] <= set(group)
        for j in range(i):
            assert not (shown[i] & shown[j]) - canary_copies
    with pytest.raises(ValueError, match="models.teachers = 100 exceeds"):
        partition_records(micro_corpus, 100)


def test_embedded_icl_corpus_shares_the_public_text_the_model_was_trained_on():
    # generate_corpus draws the public text first: the 8-teacher default's public model fits any N
    eight, sixty_four = generate_corpus(teachers=8), generate_corpus(teachers=64)
    assert eight.public_train == sixty_four.public_train and eight.public_heldout == sixty_four.public_heldout


def test_identities_bind_the_public_model_and_each_prompt(micro_models, tokenizer):
    public = str(micro_models.public)
    prompts = ["Customer: Hi, I am Ana.\n\n", "Customer: Hello, I am Bo.\n\n"]
    first = InContextEnsemble.from_pretrained(public, prompts, tokenizer, 12, sources=["a.json", "b.json"])
    assert [(i.role, i.source) for i in first.identities] == [("public", public), ("teacher-0", "a.json"),
                                                               ("teacher-1", "b.json")]
    assert first.identities[0].weights_sha256 == model_content_hash(load_causal_lm(public))
    again = InContextEnsemble.from_pretrained(public, prompts, tokenizer, 12)
    assert [i.content_hash for i in again.identities] == [i.content_hash for i in first.identities]
    changed = InContextEnsemble.from_pretrained(public, [prompts[0], "Customer: Hello, I am Cy.\n\n"], tokenizer, 12)
    hashes = [i.content_hash for i in changed.identities]
    assert hashes[:2] == [i.content_hash for i in first.identities[:2]]
    assert hashes[2] != first.identities[2].content_hash
    cut = InContextEnsemble.from_pretrained(public, prompts, tokenizer, 3)  # the budget changes what is shown
    assert cut.identities[1].content_hash != first.identities[1].content_hash


def test_from_pretrained_rejects_bad_prompts_and_budgets(micro_models, tokenizer):
    public = str(micro_models.public)
    with pytest.raises(ValueError, match=r"models.icl_prompt_tokens must be an integer in \[1, 63\], got 200"):
        InContextEnsemble.from_pretrained(public, ["Customer: Hi\n\n"], tokenizer, 200)
    with pytest.raises(ValueError, match=r"models.icl_prompt_tokens must be an integer in \[1, 63\], got 0"):
        InContextEnsemble.from_pretrained(public, ["Customer: Hi\n\n"], tokenizer, 0)
    with pytest.raises(ValueError, match="teacher prompt 1 is empty"):
        InContextEnsemble.from_pretrained(public, ["Customer: Hi\n\n", "  "], tokenizer, 10)
    with pytest.raises(ValueError, match="at least one teacher prompt"):
        InContextEnsemble.from_pretrained(public, [], tokenizer, 10)


def test_examples_file_is_checked(tmp_path):
    path = tmp_path / "examples.json"
    path.write_text(json.dumps([["a", "b"], ["c"]]))
    assert read_icl_examples(path, 2) == [["a", "b"], ["c"]]
    with pytest.raises(ValueError, match="models.teachers = 3 does not match the 2 example lists"):
        read_icl_examples(path, 3)
    path.write_text(json.dumps([["a"], []]))
    with pytest.raises(ValueError, match="teacher 1's list is empty"):
        read_icl_examples(path, 2)
    path.write_text(json.dumps({"a": 1}))
    with pytest.raises(ValueError, match="must hold a list of lists of strings"):
        read_icl_examples(path, 1)
    path.write_text("[[")
    with pytest.raises(ValueError, match="is not JSON"):
        read_icl_examples(path, 1)
    with pytest.raises(ValueError, match="models.icl_examples file does not exist"):
        read_icl_examples(tmp_path / "missing.json", 1)


def _icl_config(micro_models, out, examples, teachers=16, **models):
    config = micro_config(micro_models, out, {"type": "pmixed", "alpha": 18.0, "beta": 0.2}, queries=40, block_size=20)
    config["models"] = {"embedded": False, "public": str(micro_models.public), "tokenizer": str(micro_models.tokenizer),
                        "teacher_kind": "icl", "teachers": teachers, "icl_examples": str(examples),
                        "icl_prompt_tokens": 16, **models}
    return config


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(teacher_paths=["t0"]), "models.teacher_paths must be empty with teacher_kind = 'icl'"),
    (lambda m: m.pop("icl_examples"), "models.icl_examples (a JSON file: a list of N lists of examples) is required"),
    (lambda m: m.update(icl_prompt_tokens=0), "models.icl_prompt_tokens must be an integer >= 1, got 0"),
    (lambda m: m.update(icl_prompt_tokens=16.0), "models.icl_prompt_tokens must be an integer, got 16.0"),
    (lambda m: m.update(icl_examples=["a"]), "models.icl_examples must be a string, got ['a']"),
    (lambda m: m.update(teacher_kind="lora", teacher_paths=["t"] * 16),
     "models.icl_examples is for teacher_kind = 'icl', got teacher_kind = 'lora'"),
    (lambda m: m.update(teacher_kind="prompted"), "teacher_kind must be 'full', 'lora' or 'icl', got 'prompted'"),
    (lambda m: m.update(embedded=True, public=None) or m.pop("public"),
     "models.embedded = true cannot be combined with models.public / models.icl_examples"),
])
def test_icl_config_errors(micro_models, tmp_path, change, message):
    config = _icl_config(micro_models, tmp_path / "run", tmp_path / "examples.json")
    change(config["models"])
    with pytest.raises(ValueError) as error:
        config_from_dict(config)
    assert message in str(error.value)


def test_embedded_icl_config_takes_any_number_of_teachers(tmp_path):
    for teachers in (1, 64, 512):
        config = config_from_dict({"run": {"out": str(tmp_path / "run")}, "mechanism": {"type": "public"},
                                   "models": {"teacher_kind": "icl", "teachers": teachers}})
        assert config.models.embedded and config.models.icl_prompt_tokens == 48


def test_pmixed_decode_with_16_in_context_teachers_is_audited_from_the_public_model(micro_models, micro_corpus,
                                                                                     tokenizer, tmp_path):
    groups = partition_records(micro_corpus, 16)
    examples = tmp_path / "examples.json"
    examples.write_text(json.dumps(groups))
    # the message states the model's context (64), the prompt budget (16) and what is left (48)
    with pytest.raises(ValueError, match=r"data.block_size 60 exceeds the 48 tokens the in-context teachers leave for "
                                         r"the query \(the model's context, n_positions = 64, less the teacher "
                                         r"prompts' budget, models.icl_prompt_tokens = 16\)"):
        config = _icl_config(micro_models, tmp_path / "too-long", examples)
        config["data"]["block_size"] = 60
        run_decode(config_from_dict(config), progress=False, verbose=False)
    config = config_from_dict(_icl_config(micro_models, tmp_path / "run", examples))
    result = run_decode(config, progress=False, verbose=False)
    manifest = trace.read_manifest(result.directory)
    assert [m["role"] for m in manifest["models"]] == ["public", *[f"teacher-{i}" for i in range(16)]]
    assert {m["source"] for m in manifest["models"][1:]} == {str(examples)}
    # 16 tokens show the dialogues' common opening: equal prompts, equal hashes, and only those
    shown = [tuple(prompt_token_ids(tokenizer, icl.prompt_text(g, tokenizer, 16), 16)) for g in groups]
    hashes = [m["content_hash"] for m in manifest["models"][1:]]
    assert len(set(zip(shown, hashes))) == len(set(shown)) == len(set(hashes)) > 1
    assert manifest["models"][0]["content_hash"] not in hashes
    records = trace.read_records(result.directory)
    assert len(records) == 40 and all(len(r["lambdas"]) == 16 for r in records)
    loaded = load_trace(result.directory)
    assert loaded.consistent and loaded.models_available
    # the audit recomputes the logits from the public model and the re-read prompts: the payload's
    assert loaded.logits_source == "payload"
    payload = np.load(result.directory / "replay" / "block-000001.npy")
    np.testing.assert_allclose(loaded._model_logits(trace.read_chunk(result.directory, 1)).numpy(), payload,
                               atol=1e-5, rtol=0)
    # a changed example changes teacher 0's prompt: the models are there, with another hash
    groups[0][0] = "Customer: something else entirely."
    examples.write_text(json.dumps(groups))
    assert load_trace(result.directory).model_state == "different"
    examples.unlink()
    assert load_trace(result.directory).model_state == "absent"


@pytest.mark.slow
def test_embedded_icl_default_with_64_teachers(tmp_path, monkeypatch):
    """Needs the 8-teacher embedded default (cached in .dpledger-cache, ~3 minutes to build)."""
    monkeypatch.setenv("DPLEDGER_CACHE", str(REPO / ".dpledger-cache"))  # not the micro models' cache
    config = config_from_dict({"run": {"out": str(tmp_path / "run"), "queries": 32},
                               "mechanism": {"type": "pmixed", "alpha": 18.0, "beta": 0.2},
                               "models": {"teacher_kind": "icl", "teachers": 64},
                               "data": {"block_size": 32}})
    result = run_decode(config, progress=False, verbose=False)
    loaded = load_trace(result.directory)
    assert loaded.consistent and loaded.models_available and loaded.n_teachers == 64
    checks = {check.name: check for check in audit_run(result.directory, play_game=False, write=False).checks}
    assert checks["manifest"].status.value == "PASS" and checks["models"].status.value == "PASS", checks
