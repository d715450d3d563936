"""`dpledger teachers`: sharding by unit and partition key, LoRA and full teachers from text, a
directory and JSONL, resume with identical weights, refusal of changed inputs, decode of the
output, the embedded default's LoRA path, and one-line errors for bad input."""
import json
import tomllib
from pathlib import Path

import pytest
import torch

from dpledger.decoding.corpus import generate_corpus
from dpledger.decoding.ensemble import load_causal_lm, load_lora_teacher, model_content_hash
from dpledger.decoding.teachers import MANIFEST, Unit, assign_shards, read_units, split_documents
from tests.micro import MICRO_CORPUS

FAST = ["--steps", "3", "--batch", "4", "--seq-len", "32", "--warmup", "1", "--no-progress"]


@pytest.fixture(scope="module")
def private(tmp_path_factory):
    """The micro corpus's private dialogues as a text file, a directory and JSONL with a user id."""
    corpus = generate_corpus(seed=0, teachers=3, **MICRO_CORPUS)
    documents = [doc for shard in corpus.shards for doc in shard.split("\n\n")][:60]
    root = tmp_path_factory.mktemp("private")
    (root / "private.txt").write_text("\n\n".join(documents) + "\n")
    (root / "dir" / "sub").mkdir(parents=True)
    for i in range(6):
        folder = root / "dir" / ("sub" if i % 2 else "")
        (folder / f"user-{i}.txt").write_text("\n\n".join(documents[i * 10:(i + 1) * 10]))
    (root / "dir" / "ignored.md").write_text("not a .txt file")
    with (root / "records.jsonl").open("w") as handle:
        for i, doc in enumerate(documents):
            handle.write(json.dumps({"user_id": f"u{i % 7}", "text": doc, "n": i}) + "\n")
    return root, documents


def run_cli(argv, capsys):
    from dpledger.cli import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def teachers_cmd(micro_models, source, out, *extra):
    return ["teachers", str(source), "--public", str(micro_models.public), "--tokenizer", str(micro_models.tokenizer),
            "--teachers", "3", "--out", str(out), *FAST, *extra]


def hashes(out: Path, micro_models, kind: str) -> list[str]:
    public = load_causal_lm(str(micro_models.public))
    paths = sorted(p for p in out.iterdir() if p.name.startswith("teacher-"))
    load = (lambda p: load_lora_teacher(public, str(p))) if kind == "lora" else (lambda p: load_causal_lm(str(p)))
    return [model_content_hash(load(p)) for p in paths]


# ------------------------------------------------------------------------------------------- sharding


def test_units_by_input_kind_and_shards_are_disjoint_and_cover(private):
    root, documents = private
    text_units, info = read_units(root / "private.txt")
    assert info["format"] == "text" and [u.documents[0] for u in text_units] == documents
    dir_units, info = read_units(root / "dir")
    assert info["format"] == "dir" and len(dir_units) == 6 and all(len(u.documents) == 10 for u in dir_units)
    assert {u.key for u in dir_units} == {f"file:{'sub/' if i % 2 else ''}user-{i}.txt" for i in range(6)}
    record_units, _ = read_units(root / "records.jsonl")
    assert len(record_units) == len(documents)
    for units in (text_units, dir_units, record_units):
        shards = assign_shards(units, 3, seed=0)
        keys = [u.key for shard in shards for u in shard]
        assert sorted(keys) == sorted(u.key for u in units)  # disjoint and covering
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
        assert assign_shards(units, 3, seed=0) == shards  # deterministic
    assert split_documents("a\n \nb\n\n\n\nc", None) == ["a", "b", "c"]
    assert split_documents("a---b", "---") == ["a", "b"]


def test_the_partition_key_keeps_each_users_records_in_one_shard(private):
    root, documents = private
    units, info = read_units(root / "records.jsonl", partition_key="user_id")
    assert info["units"] == 7 and info["documents"] == len(documents)
    for seed in range(5):
        shards = assign_shards(units, 3, seed=seed)
        owner = {}
        for index, shard in enumerate(shards):
            for unit in shard:
                owner.setdefault(unit.key, set()).add(index)
        assert len(owner) == 7 and all(len(s) == 1 for s in owner.values())
        covered = sorted(doc for shard in shards for unit in shard for doc in unit.documents)
        assert covered == sorted(documents)
    with pytest.raises(ValueError, match=r"--teachers 8: must be at most the number of units \(7\)"):
        assign_shards(units, 8)
    assert len(assign_shards([Unit("a", ("x",))], 1)) == 1


# ------------------------------------------------------------------------------------------- training


def test_lora_teachers_from_text_decode_and_resume_identically(micro_models, private, tmp_path, capsys, monkeypatch):
    root, _ = private
    reference = tmp_path / "reference"
    code, out, err = run_cli(teachers_cmd(micro_models, root / "private.txt", reference,
                                          "--heldout", str(micro_models.heldout_text)), capsys)
    assert code == 0, err
    manifest = json.loads((reference / MANIFEST).read_text())
    assert manifest["status"] == "complete" and manifest["kind"] == "lora" and manifest["teachers"] == 3
    assert [s["units"] for s in manifest["shards"]] == [20, 20, 20]
    assert all(r["heldout_ppl"] > 1 and not r["resumed"] for r in manifest["results"])
    assert manifest["hyper_parameters"]["target_modules"] is None and "[models]" in out
    config = json.loads((reference / "teacher-000" / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == ["c_attn", "c_fc", "c_proj"] and config["fan_in_fan_out"]
    expected = hashes(reference, micro_models, "lora")
    assert len(set(expected)) == 3

    # interrupted while training teacher 1 (after teacher 0 was renamed into place), then resumed
    from dpledger.decoding import teachers

    real = teachers.fine_tune_teacher
    calls = []

    def dies_on_the_second(*args, **kwargs):
        calls.append(args[3])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(teachers, "fine_tune_teacher", dies_on_the_second)
    resumed = tmp_path / "resumed"
    code, _, err = run_cli(teachers_cmd(micro_models, root / "private.txt", resumed,
                                        "--heldout", str(micro_models.heldout_text)), capsys)
    assert code == 130 and "1 of 3 teachers are complete" in err
    assert (resumed / "teacher-000").is_dir() and not (resumed / "teacher-001").exists()
    (resumed / ".teacher-001.partial").mkdir()  # what a kill during a save leaves
    (resumed / ".teacher-001.partial" / "adapter_model.safetensors").write_bytes(b"torn")
    monkeypatch.setattr(teachers, "fine_tune_teacher", real)
    code, out, err = run_cli(teachers_cmd(micro_models, root / "private.txt", resumed,
                                          "--heldout", str(micro_models.heldout_text)), capsys)
    assert code == 0, err
    results = json.loads((resumed / MANIFEST).read_text())["results"]
    assert [r["resumed"] for r in results] == [True, False, False] and "kept from an earlier run" in out
    assert not (resumed / ".teacher-001.partial").exists()
    assert hashes(resumed, micro_models, "lora") == expected

    # a third run with the same arguments trains nothing
    code, out, _ = run_cli(teachers_cmd(micro_models, root / "private.txt", resumed,
                                        "--heldout", str(micro_models.heldout_text)), capsys)
    assert code == 0 and "0 trained" in out

    # decode.toml is ready to use: a few queries through the decode loop
    from dpledger.decoding.config import config_from_dict
    from dpledger.decoding.run import run_decode

    decode = tomllib.loads((reference / "decode.toml").read_text())
    decode["run"].update(out=str(tmp_path / "decoded"), queries=24)
    decode["data"]["block_size"] = 8
    result = run_decode(config_from_dict(decode), progress=False, verbose=False)
    assert result.summary["steps"] == 24 and result.summary["perplexity"] > 1


def test_changed_data_or_hyper_parameters_are_refused_unless_overwrite(micro_models, private, tmp_path, capsys):
    root, _ = private
    out = tmp_path / "out"
    assert run_cli(teachers_cmd(micro_models, root / "private.txt", out), capsys)[0] == 0
    code, _, err = run_cli(teachers_cmd(micro_models, root / "private.txt", out, "--lr", "0.002"), capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "holds teachers trained with other inputs (changed: lr 0.001 -> 0.002)" in err and "--overwrite" in err
    code, _, err = run_cli(teachers_cmd(micro_models, root / "records.jsonl", out), capsys)
    assert code == 2 and "changed: data" in err
    code, _, err = run_cli(teachers_cmd(micro_models, root / "private.txt", out, "--lr", "0.002", "--overwrite"),
                           capsys)
    assert code == 0, err
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["hyper_parameters"]["lr"] == 0.002 and not any(r["resumed"] for r in manifest["results"])


def test_full_teachers_from_a_directory_load_in_decode(micro_models, private, tmp_path, capsys):
    root, _ = private
    out = tmp_path / "full"
    code, _, err = run_cli(teachers_cmd(micro_models, root / "dir", out, "--kind", "full", "--lr", "2e-3"), capsys)
    assert code == 0, err
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["input"]["format"] == "dir" and [s["units"] for s in manifest["shards"]] == [2, 2, 2]
    assert (out / "teacher-000" / "model.safetensors").exists()
    from dpledger.decoding.ensemble import Ensemble

    ensemble = Ensemble.from_pretrained(str(micro_models.public), [str(out / f"teacher-{i:03d}") for i in range(3)])
    public, teachers = ensemble.distributions(torch.tensor([[1, 2, 3, 4]]))
    assert teachers.shape[-2] == 3 and not torch.allclose(public, teachers[..., 0, :])


def test_jsonl_partition_key_end_to_end(micro_models, private, tmp_path, capsys):
    root, documents = private
    out = tmp_path / "jsonl"
    code, stdout, err = run_cli(teachers_cmd(micro_models, root / "records.jsonl", out, "--partition-key", "user_id"),
                                capsys)
    assert code == 0, err
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["input"]["partition_key"] == "user_id" and "7 units" in stdout
    assert sum(s["units"] for s in manifest["shards"]) == 7
    assert sum(s["documents"] for s in manifest["shards"]) == len(documents)


def test_lora_targets_are_detected_for_linear_models(micro_models, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from dpledger.decoding.recipe import TeacherTraining, lora_target_modules
    from dpledger.decoding.teachers import train_teachers

    assert lora_target_modules(load_causal_lm(str(micro_models.public))) == (("c_attn", "c_proj", "c_fc"), True)
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=400, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))
    assert lora_target_modules(llama) == (("q_proj", "k_proj", "v_proj", "o_proj"), False)
    corpus = generate_corpus(seed=0, teachers=2, **MICRO_CORPUS)
    training = TeacherTraining(kind="lora", steps=2, batch=2, seq_len=16, warmup=1, lora_rank=2)
    manifest = train_teachers([s.split("\n\n")[:10] for s in corpus.shards], llama, str(micro_models.tokenizer),
                              training, tmp_path / "llama", public_name="tiny-llama", tokenizer_name="micro",
                              progress=False)
    config = json.loads((tmp_path / "llama" / "teacher-001" / "adapter_config.json").read_text())
    assert manifest["status"] == "complete" and not config["fan_in_fan_out"]
    assert sorted(config["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]


def test_the_embedded_default_trains_lora_teachers_through_the_same_path(tmp_path, monkeypatch):
    from dataclasses import replace

    from dpledger.decoding.embedded import build_or_load, cache_key
    from dpledger.decoding.ensemble import Ensemble
    from tests.micro import MICRO_RECIPE

    monkeypatch.setenv("DPLEDGER_CACHE", str(tmp_path / "cache"))
    recipe = replace(MICRO_RECIPE, teacher_kind="lora", teacher_steps=2)
    corpus = generate_corpus(teachers=2, **MICRO_CORPUS)
    assert cache_key(corpus, recipe) != cache_key(corpus, replace(recipe, teacher_kind="full"))
    embedded = build_or_load(teachers=2, recipe=recipe, verbose=False, **MICRO_CORPUS)
    manifest = json.loads((embedded.directory / "teachers" / MANIFEST).read_text())
    assert manifest["kind"] == "lora" and manifest["hyper_parameters"]["target_modules"] == ["c_attn", "c_proj", "c_fc"]
    assert (embedded.teacher_paths[1] / "adapter_config.json").exists()
    ensemble = Ensemble.from_pretrained(str(embedded.public_path), [str(p) for p in embedded.teacher_paths], "lora")
    assert ensemble.n_teachers == 2


# ------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("extra, source, message", [
    (["--teachers", "0"], "private.txt", "--teachers 0: must be an integer >= 1"),
    (["--teachers", "61"], "private.txt", "--teachers 61: must be at most the number of units (60)"),
    (["--teachers", "100000"], "private.txt", "--teachers 100000: must be at most 512, the ensemble size a decode "
                                              "run takes (docs/config.md, models.teachers)"),
    (["--steps", "0"], "private.txt", "--steps 0: must be an integer >= 1"),
    (["--lr", "-1"], "private.txt", "--lr -1.0: must be a finite number > 0"),
    (["--lora-dropout", "1"], "private.txt", "--lora-dropout 1.0: must be in [0, 1)"),
    (["--seq-len", "4096"], "private.txt", "--seq-len 4096: must be at most the public model's context length 64"),
    (["--partition-key", "user_id"], "private.txt", "--partition-key 'user_id': only for JSONL input"),
    (["--partition-key", "account"], "records.jsonl", "line 1: no 'account' field (--partition-key)"),
    (["--text-field", "body"], "records.jsonl", "line 1: no 'body' field (--text-field)"),
    (["--target-modules", "nope"], "private.txt", "target modules nope match no layer of the model (--target-modules)"),
    (["--public", "/no/such/model"], "private.txt", "--public /no/such/model: model path does not exist"),
    ([], "missing.txt", "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(extra, source, message, micro_models, private, tmp_path, capsys):
    root, _ = private
    argv = teachers_cmd(micro_models, root / source, tmp_path / "out")
    for flag in ("--teachers", "--public"):  # the case's value replaces the default one
        if flag in extra:
            del argv[argv.index(flag):argv.index(flag) + 2]
    code, out, err = run_cli(argv + extra, capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("dpledger teachers: error: ") and message in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_a_model_directory_without_tokenizer_files_is_refused_not_trained_on(micro_models, private, tmp_path, capsys):
    # a public directory holding only weights loads as a near-empty tokenizer that encodes text to almost
    # nothing: the teachers would learn nothing and every later step would look fine
    import shutil

    root, _ = private
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(micro_models.public / name, bare / name)
    argv = ["teachers", str(root / "private.txt"), "--public", str(bare), "--teachers", "3", "--out",
            str(tmp_path / "out"), *FAST]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--public (also the tokenizer unless --tokenizer is given)" in err and not (tmp_path / "out").exists()


def test_the_embedded_public_model_directory_is_complete_with_its_tokenizer(micro_models):
    from transformers import AutoTokenizer

    assert len(AutoTokenizer.from_pretrained(str(micro_models.public))) == len(
        AutoTokenizer.from_pretrained(str(micro_models.tokenizer)))


def test_public_embedded_uses_the_embedded_default_without_a_hub(micro_models, private, tmp_path, capsys,
                                                                 monkeypatch):
    import dpledger.decoding.embedded as embedded
    from tests.micro import MICRO_CORPUS, MICRO_RECIPE

    built = embedded.build_or_load(teachers=len(micro_models.teachers), recipe=MICRO_RECIPE, verbose=False,
                                   **MICRO_CORPUS)
    monkeypatch.setattr(embedded, "build_or_load", lambda **kwargs: built)
    root, _ = private
    code, out, err = run_cli(["teachers", str(root / "private.txt"), "--public", "embedded", "--teachers", "3",
                              "--out", str(tmp_path / "out"), *FAST], capsys)
    assert code == 0, err
    assert f"public model: the embedded default's, {built.public_path}" in out
    manifest = json.loads((tmp_path / "out" / "teachers.json").read_text())
    assert manifest["public"] == str(built.public_path.resolve())
    assert manifest["tokenizer"] == str(built.tokenizer_path.resolve())
    assert "seed = " in (tmp_path / "out" / "decode.toml").read_text()


def test_private_input_that_would_block_or_is_ambiguous_is_refused_in_one_line(micro_models, private, tmp_path, capsys):
    """A FIFO as INPUT or --heldout would block the read forever; a JSONL record naming a key twice
    would go to the shard one JSON reader picks and not another's."""
    import os
    import time

    root, _ = private
    fifo = tmp_path / "private.fifo"
    os.mkfifo(fifo)
    duplicate = tmp_path / "records.jsonl"
    duplicate.write_text('{"text": "one", "user_id": 1, "user_id": 2}\n')
    cases = [(teachers_cmd(micro_models, fifo, tmp_path / "a"), "needs a file"),
             (teachers_cmd(micro_models, root / "private.txt", tmp_path / "b") + ["--heldout", str(fifo)],
              "--heldout"),
             (teachers_cmd(micro_models, duplicate, tmp_path / "c") + ["--partition-key", "user_id"],
              "the key 'user_id' appears twice")]
    for argv, message in cases:
        started = time.time()
        code, _, err = run_cli(argv, capsys)
        assert time.time() - started < 10
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
