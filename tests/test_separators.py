"""Documents and in-context examples are separated by the tokenizer's own special tokens (its eos,
sep, bos or cls; never its unknown token), or a blank line where it has none: a tokenizer without
GPT-2's <|endoftext|> decodes and audits like any other (issue 28, item 5)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpledger.audit.audit import audit_run
from dpledger.decoding import trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.recipe import document_separator_ids, encode_documents
from dpledger.decoding.run import run_decode

TEXT = ("Customer: my parcel did not arrive.\n\nAgent: I am sorry, let me check the tracking number.\n\n"
        "Customer: it says delivered yesterday.\n\nAgent: I will open a claim with the carrier today.\n\n"
        "Customer: thank you, that helps.\n\nAgent: you are welcome, have a good day.")


def _tokenizer(directory: Path, special: list[str], **roles: str):
    """A byte-level BPE trained offline on TEXT with `special` tokens and the given roles
    (eos_token=..., unk_token=...), saved to `directory` as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    model = models.BPE(unk_token=roles["unk_token"]) if "unk_token" in roles else models.BPE()
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(TEXT.split("\n\n"), trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **roles)
    fast.save_pretrained(directory)
    return fast


def _tiny_gpt2(directory: Path, vocab_size: int) -> None:
    """A random 1-layer GPT-2 (64 positions) with the tokenizer's vocabulary, saved to `directory`."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_positions=64, n_embd=32, n_layer=1, n_head=2,
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).save_pretrained(directory)


def test_the_separator_is_the_tokenizers_own_eos_then_sep_then_bos_never_unk(tmp_path):
    llama = _tokenizer(tmp_path / "llama", ["<|end_of_text|>"], eos_token="<|end_of_text|>")
    assert document_separator_ids(llama) == [llama.convert_tokens_to_ids("<|end_of_text|>")]
    ids = encode_documents(llama, "a\n\nb")
    assert ids.tolist() == [*llama("a", add_special_tokens=False)["input_ids"], document_separator_ids(llama)[0],
                            *llama("b", add_special_tokens=False)["input_ids"], document_separator_ids(llama)[0]]
    sep_only = _tokenizer(tmp_path / "sep", ["<unk>", "[SEP]"], unk_token="<unk>", sep_token="[SEP]")
    assert document_separator_ids(sep_only) == [sep_only.convert_tokens_to_ids("[SEP]")]
    # an eos that is the unknown token, or names no token of the vocabulary, is passed over
    unk_eos = _tokenizer(tmp_path / "unk-eos", ["<unk>", "<s>"], unk_token="<unk>", eos_token="<unk>", bos_token="<s>")
    assert document_separator_ids(unk_eos) == [unk_eos.convert_tokens_to_ids("<s>")]


def test_an_unknown_only_tokenizer_falls_back_to_a_blank_line_and_one_without_errs_in_one_line(tmp_path):
    unknown_only = _tokenizer(tmp_path / "unk", ["<unk>"], unk_token="<unk>")
    newline = unknown_only("\n\n", add_special_tokens=False)["input_ids"]
    assert document_separator_ids(unknown_only) == newline and unknown_only.unk_token_id not in newline
    assert encode_documents(unknown_only, "Agent: hi").tolist()[-len(newline):] == newline
    # a word-level tokenizer that maps a blank line to nothing has no separator at all
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bare = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", name_or_path="words")
    with pytest.raises(ValueError, match=r"^tokenizer 'words' has no token to separate documents: no end-of-sequence, "
                                         r"separator, beginning-of-sequence or classifier token other than its unknown "
                                         r"token, and it encodes a blank line as \[\] \(unknown token id 0\)"):
        encode_documents(bare, "hello\n\nhello")


@pytest.mark.parametrize("kind", ["llama-3-eos", "unknown-only"])
def test_a_voting_run_with_in_context_teachers_on_a_non_gpt2_tokenizer_decodes_and_audits(tmp_path, kind):
    if kind == "llama-3-eos":
        tokenizer = _tokenizer(tmp_path / "tokenizer", ["<|end_of_text|>"], eos_token="<|end_of_text|>")
    else:
        tokenizer = _tokenizer(tmp_path / "tokenizer", ["<unk>"], unk_token="<unk>")
    assert tokenizer.convert_tokens_to_ids("<|endoftext|>") in (None, tokenizer.unk_token_id)
    _tiny_gpt2(tmp_path / "public", len(tokenizer))
    (tmp_path / "public" / "tokenizer.json").write_bytes((tmp_path / "tokenizer" / "tokenizer.json").read_bytes())
    records = TEXT.split("\n\n")
    examples = tmp_path / "examples.json"
    examples.write_text(json.dumps([records[i::3] for i in range(3)]))
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    config = config_from_dict({
        "run": {"out": str(tmp_path / "run"), "queries": 24, "seed": 11},
        "mechanism": {"type": "voting", "votes": "coordinated", "aggregator": "dpargmax", "threshold": 1.0,
                      "sigma": 1.0, "sigma_threshold": 1.0},
        "models": {"embedded": False, "public": str(tmp_path / "public"), "tokenizer": str(tmp_path / "tokenizer"),
                   "teacher_kind": "icl", "teachers": 3, "icl_examples": str(examples), "icl_prompt_tokens": 24},
        "data": {"stream": "teacher-forced", "text": str(data), "block_size": 12}})
    result = run_decode(config, progress=False, verbose=False)
    separator = document_separator_ids(tokenizer)
    contexts = [record["context_token"] for record in trace.read_records(result.directory)]
    assert separator[0] in contexts  # the stream crosses a document boundary, separated by the tokenizer's own ids
    assert tokenizer.unk_token_id is None or tokenizer.unk_token_id not in contexts
    report = audit_run(result.directory, play_game=False)
    statuses = {check.name: check.status.value for check in report.checks}
    assert statuses["replay"] == "PASS" and statuses["models"] == "PASS", statuses
    assert report.verdict != "FAIL", [(c.name, c.detail) for c in report.checks if c.status.value == "FAIL"]
    assert np.isfinite(result.summary["epsilon"][0]["epsilon"])
