"""Models as themselves: every teacher runs with its own config.json; a model's identity is the
sha256 of its weights, config and tokenizer files, recorded in the manifest and checked by the
audit; malformed models are one line at decode (exit 2, nothing written) and a FAIL of the audit's
models check naming the file (never exit 4); adapters declared full and full models declared lora
are refused in one line; local paths are never looked up on the model hub."""
import json
import os
import pickle
import re
import shutil
import signal
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dpledger.audit import Status, audit_run, load_trace
from dpledger.audit.consistency import check_models
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.ensemble import (Ensemble, ModelIdentity, _is_hub_name, identity_problems, load_causal_lm,
                                       model_files, model_identity, tokenizer_files)
from dpledger.decoding.run import run_decode
from dpledger.cli import main
from tests.micro import PMIXED, make_run, micro_config, write_toml
from tests.test_run_integrity import forge

LIMIT_S = 90


@pytest.fixture(autouse=True)
def time_limit():
    """Each test (not its module fixtures) ends within LIMIT_S seconds, or fails."""
    def expired(signum, frame):
        raise TimeoutError(f"the test ran past its limit of {LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# -- every teacher runs as itself ---------------------------------------------------------------

VOCAB = 48
BASE = dict(vocab_size=VOCAB, n_positions=24, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, initializer_range=0.4)  # large weights: a config's effect on the logits is large


def tiny_gpt2(path: Path, seed: int, **changes) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    GPT2LMHeadModel(GPT2Config(**{**BASE, **changes})).save_pretrained(path)
    return path


def own_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return load_causal_lm(str(path))(input_ids=ids).logits.float()


def logits_under_public_config(path: Path, ids: torch.Tensor) -> torch.Tensor:
    """What the batched forward computed before this fix: the teacher's weights, the public config."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(**BASE)).eval()
    model.load_state_dict(load_causal_lm(str(path)).state_dict())
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("changes, matters", [
    ({"layer_norm_epsilon": 0.5}, True),
    ({"activation_function": "relu"}, True),
    ({"activation_function": "silu"}, True),
    ({"n_head": 4}, True),
    ({"scale_attn_weights": False}, True),
    ({"scale_attn_by_inverse_layer_idx": True}, True),
    ({"reorder_and_upcast_attn": True}, False),  # the same product in float32: grouped, and equal
    ({"tie_word_embeddings": False}, False),  # its own LM head (other weights: not comparable)
    ({"n_inner": 24}, False),  # another MLP width (other shapes)
])
def test_a_teacher_with_its_own_config_decodes_as_its_own_forward_pass(tmp_path, changes, matters):
    public = tiny_gpt2(tmp_path / "public", 0)
    teachers = [tiny_gpt2(tmp_path / "same", 1), tiny_gpt2(tmp_path / "own-a", 2, **changes),
                tiny_gpt2(tmp_path / "own-b", 3, **changes)]
    ids = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(0))
    ensemble = Ensemble.from_pretrained(str(public), [str(t) for t in teachers])
    assert len(ensemble._forwards) == 2  # the public config's models, then the two teachers sharing theirs
    logits = ensemble.logits(ids)
    for index, path in enumerate([public, *teachers]):
        torch.testing.assert_close(logits[index], own_logits(path, ids), atol=1e-5, rtol=0)
    if matters:  # not vacuous: under the public model's config the teacher's logits are far off
        assert (logits_under_public_config(teachers[1], ids) - logits[2]).abs().max() > 0.05


def test_a_model_the_kernel_does_not_compute_runs_alone_through_transformers(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    public = tiny_gpt2(tmp_path / "public", 0)
    torch.manual_seed(4)
    LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=20)
                     ).save_pretrained(tmp_path / "llama")
    teachers = [tiny_gpt2(tmp_path / "gpt2", 1), tmp_path / "llama"]
    ensemble = Ensemble.from_pretrained(str(public), [str(t) for t in teachers])
    assert len(ensemble._forwards) == 2 and ensemble.n_positions == 20  # a context must fit every model
    ids = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(1))
    logits = ensemble.logits(ids)
    for index, path in enumerate([public, *teachers]):
        torch.testing.assert_close(logits[index], own_logits(path, ids), atol=1e-5, rtol=0)


# -- identity -----------------------------------------------------------------------------------

def test_identity_covers_weights_config_and_tokenizer_files_and_nothing_else(tmp_path):
    path = tiny_gpt2(tmp_path / "model", 0)
    (path / "tokenizer.json").write_text("{}")
    model = load_causal_lm(str(path))
    first = model_identity("public", str(path), model)
    assert set(first.files) == {"config.json", "generation_config.json", "tokenizer.json"}
    (path / "README.md").write_text("notes")  # changes nothing that runs
    assert model_identity("public", str(path), model) == first
    entry = first.manifest_entry()
    for name, edit in (("config.json", lambda: (path / "config.json").write_text(
            (path / "config.json").read_text().replace('"layer_norm_epsilon": 1e-05', '"layer_norm_epsilon": 0.001'))),
                       ("tokenizer.json", lambda: (path / "tokenizer.json").write_text('{"a": 1}'))):
        saved = (path / name).read_bytes()
        edit()
        found = model_identity("public", str(path), model)
        assert found.content_hash != first.content_hash and found.weights_sha256 == first.weights_sha256
        assert identity_problems(entry, found) == [f"{path}/{name}: differs from the run's (sha256)"]
        (path / name).write_bytes(saved)
    (path / "vocab.json").write_text("{}")
    assert identity_problems(entry, model_identity("public", str(path), model)) == [
        f"{path}/vocab.json: not one of the run's files (added since)"]
    # an older trace's entry: content_hash was the weights' hash, and only the weights are compared
    old = {"role": "public", "source": str(path), "content_hash": first.weights_sha256}
    assert identity_problems(old, model_identity("public", str(path), model)) == []
    with torch.no_grad():
        model.transformer.ln_f.bias += 1
    assert identity_problems(old, model_identity("public", str(path), model)) == [
        f"{path}: its weights differ from the run's (sha256 of the tensors)"]


def test_a_hub_models_identity_files_come_from_its_snapshot_in_the_hub_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    snapshot = tmp_path / "hub" / "models--owner--tiny" / "snapshots" / ("0" * 40)
    tiny_gpt2(snapshot, 0)
    (snapshot / "tokenizer.json").write_text("{}")
    (tmp_path / "hub" / "models--owner--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--owner--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    # a hub model's tokenizer files are the run tokenizer's (the cache holds them once it is loaded)
    assert set(model_files("owner/tiny")) == {"config.json", "generation_config.json"}
    assert set(tokenizer_files("owner/tiny")) == {"tokenizer.json"}
    assert model_files("owner/absent") == {}


# -- hub names ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, hub", [
    ("gpt2", True), ("openai-community/gpt2", True), ("./public", False), ("/abs/public", False),
    ("~/public", False), ("runs/teachers/public", False), ("public/", False), ("my model", False),
    ("C:\\models\\public", False), ("a--b", False), ("here/missing", False),
])
def test_only_a_valid_hub_id_that_names_nothing_here_goes_to_the_hub(tmp_path, monkeypatch, name, hub):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here").mkdir()  # here/missing is a path into a directory that exists
    assert _is_hub_name(name) is hub


def test_a_missing_local_path_fails_at_once_without_the_hub(tmp_path, monkeypatch):
    import transformers

    def hub(*args, **kwargs):
        raise AssertionError("sent to the model hub")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", hub)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", hub)
    monkeypatch.chdir(tmp_path)
    for name in ("runs/teachers/public", "./public", "public/"):
        with pytest.raises(ValueError, match=f"model path does not exist: {name}"):
            load_causal_lm(name)
    from dpledger.decoding.ensemble import load_tokenizer

    with pytest.raises(ValueError, match="models.tokenizer runs/tok/x: not a directory"):
        load_tokenizer("runs/tok/x", "models.tokenizer")


# -- malformed models: one line naming the file -------------------------------------------------

def _truncate(path: Path) -> str:
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # the tensors cut short; the header intact
    return f"{weights}: not a readable safetensors file (SafetensorError: incomplete metadata, file not fully covered)"


def _pickle(path: Path) -> str:
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {path / 'executed'}",))

    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    return f"{path / 'pytorch_model.bin'}: refused by weights-only loading, which never runs pickled code"


def _bad_config(path: Path) -> str:
    (path / "config.json").write_text('{"model_type": "gpt2",')
    return f"{path / 'config.json'}: not a readable JSON file (JSONDecodeError"


def _no_config(path: Path) -> str:
    (path / "config.json").unlink()
    return f"{path / 'config.json'}: missing"


def _missing_tensor(path: Path) -> str:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k != "transformer.ln_f.bias"}, path / "model.safetensors",
              metadata={"format": "pt"})
    return f"{path / 'model.safetensors'}: holds no tensor of the right shape for transformer.ln_f.bias"


def _bad_architecture(path: Path) -> str:
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "activation_function": "no-such-activation"}))
    return f"{path / 'config.json'}: transformers cannot build a model from it (KeyError: 'no-such-activation')"


MALFORMED = {"truncated safetensors": _truncate, "pickled bin": _pickle, "config.json does not parse": _bad_config,
             "no config.json": _no_config, "a tensor missing": _missing_tensor, "unknown activation": _bad_architecture}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_teacher_is_refused_in_one_line_naming_the_file(tmp_path, case):
    public, teacher = tiny_gpt2(tmp_path / "public", 0), tiny_gpt2(tmp_path / "teacher", 1)
    expected = MALFORMED[case](teacher)
    with pytest.raises(ValueError) as error:
        Ensemble.from_pretrained(str(public), [str(teacher)])
    assert str(error.value).startswith(expected) and "\n" not in str(error.value)
    assert not (teacher / "executed").exists()  # weights-only loading never ran the pickle


def _lora_adapter(public: Path, path: Path) -> Path:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(5)
    adapter = get_peft_model(load_causal_lm(str(public)), LoraConfig(r=2, target_modules=["c_attn"],
                                                                      fan_in_fan_out=True, init_lora_weights=False))
    adapter.save_pretrained(path)
    return path


def test_teacher_kind_must_match_what_the_directory_holds(tmp_path):
    public, full = tiny_gpt2(tmp_path / "public", 0), tiny_gpt2(tmp_path / "full", 1)
    adapter = _lora_adapter(public, tmp_path / "adapter")
    with pytest.raises(ValueError, match=r'^teacher 1 \(.*adapter\) is a LoRA adapter \(adapter_config.json, no '
                                         r'config.json\) but teacher_kind is "full": set teacher_kind = "lora"'):
        Ensemble.from_pretrained(str(public), [str(full), str(adapter)], "full")
    with pytest.raises(ValueError, match=r'^teacher 0 \(.*full\) is a full model \(config.json, no '
                                         r'adapter_config.json\) but teacher_kind is "lora": set teacher_kind = "full"'):
        Ensemble.from_pretrained(str(public), [str(full), str(adapter)], "lora")
    with pytest.raises(ValueError, match=r"adapter is a LoRA adapter .*, not a full model"):
        Ensemble.from_pretrained(str(adapter), [str(full)], "full")
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=f"^{weights}: not a readable safetensors file"):
        Ensemble.from_pretrained(str(public), [str(adapter)], "lora")


# -- decode and audit with micro models -----------------------------------------------------------

@pytest.fixture(scope="module")
def own_models(micro_models, tmp_path_factory):
    """Copies of the micro models (the tests below change them and put them back)."""
    root = tmp_path_factory.mktemp("own-models")
    public, tokenizer = root / "public", root / "tokenizer"
    shutil.copytree(micro_models.public, public)
    shutil.copytree(micro_models.tokenizer, tokenizer)
    teachers = []
    for index, path in enumerate(micro_models.teachers):
        teachers.append(root / f"teacher-{index}")
        shutil.copytree(path, teachers[-1])
    return replace(micro_models, public=public, teachers=tuple(teachers), tokenizer=tokenizer, root=root)


@pytest.fixture(scope="module")
def own_runs(own_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("own-runs")
    with_payload = make_run(own_models, root / "payload", PMIXED)
    config = config_from_dict(micro_config(own_models, root / "no-payload", PMIXED, queries=64,
                                           replay_payload=False))
    return {"payload": with_payload, "no-payload": run_decode(config, progress=False, verbose=False).directory}


@pytest.fixture
def changed(own_models):
    """Yields a function that applies a change to one of the run's model files; restores them after."""
    saved = {}

    def change(directory: Path, edit) -> str:
        for file in directory.iterdir():
            saved.setdefault(file, file.read_bytes())
        return edit(directory)

    yield change
    for directory in {file.parent for file in saved}:
        for file in list(directory.iterdir()):
            if file not in saved:
                file.unlink()
    for file, data in saved.items():
        file.write_bytes(data)


def _edit_config(path: Path) -> str:
    config = path / "config.json"
    config.write_text(config.read_text().replace('"layer_norm_epsilon": 1e-05', '"layer_norm_epsilon": 0.5'))
    return f"{config}: differs from the run's (sha256)"


def _edit_tokenizer(path: Path) -> str:
    tokenizer = path / "tokenizer_config.json"
    tokenizer.write_text(tokenizer.read_text().replace('"eos_token"', '"unk_token": "<|endoftext|>", "eos_token"'))
    return f"{tokenizer}: differs from the run's (sha256)"


def _delete_tokenizer(path: Path) -> str:
    for file in path.iterdir():
        file.unlink()
    return f"{path / 'tokenizer.json'}: missing"


@pytest.mark.parametrize("which, edit", [("teacher", _truncate), ("teacher", _pickle), ("teacher", _bad_config),
                                         ("tokenizer", _delete_tokenizer)])
def test_decode_refuses_a_malformed_model_in_one_line_and_writes_nothing(own_models, changed, tmp_path, capsys,
                                                                         which, edit):
    directory = own_models.teachers[1] if which == "teacher" else own_models.tokenizer
    expected = changed(directory, edit)
    out = tmp_path / "run"
    config = write_toml(tmp_path / "run.toml", micro_config(own_models, out, PMIXED))
    assert main(["decode", str(config), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    if which == "teacher":
        assert err.startswith(f"dpledger decode: error: {expected}"), err
    else:  # no tokenizer files: transformers' reason, after the key that names the directory
        assert err.startswith(f"dpledger decode: error: models.tokenizer {directory}: cannot load a tokenizer"), err
    assert not out.exists() and not (directory / "executed").exists()


@pytest.mark.parametrize("which, edit", [
    ("teacher", _truncate), ("teacher", _pickle), ("teacher", _bad_config), ("teacher", _edit_config),
    ("public", _edit_config), ("tokenizer", _edit_tokenizer), ("tokenizer", _delete_tokenizer),
])
def test_a_changed_or_malformed_model_fails_the_models_check_naming_the_file(own_models, own_runs, changed, which,
                                                                             edit):
    directory = {"teacher": own_models.teachers[1], "public": own_models.public,
                 "tokenizer": own_models.tokenizer}[which]
    for run in own_runs.values():
        before = check_models(load_trace(run))
        assert before.status is Status.PASS and before.evidence["unchecked"] == [], before.detail
        assert f"and so is the tokenizer at {own_models.tokenizer}" in before.detail
    expected = changed(directory, edit)
    for run in own_runs.values():
        loaded = load_trace(run)
        result = check_models(loaded)
        assert result.status is Status.FAIL and expected in result.detail, result.detail
        assert not loaded.models_available  # the replay never runs on models that are not the run's


def test_the_audit_fails_and_never_exits_4(own_models, own_runs, changed, capsys):
    changed(own_models.teachers[1], _edit_config)  # a config-only edit, no payload: the replay cannot tell
    assert main(["audit", str(own_runs["no-payload"]), "--no-game", "--mc-samples", "20"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out.splitlines()[0] and f"{own_models.teachers[1]}/config.json: differs" in out
    changed(own_models.teachers[1], _truncate)
    assert main(["audit", str(own_runs["payload"]), "--no-game", "--mc-samples", "20"]) == 1
    assert f"{own_models.teachers[1]}/model.safetensors: not a readable safetensors file" in capsys.readouterr().out


def test_resume_refuses_models_that_changed_since_the_run(own_models, own_runs, changed):
    config = config_from_dict(micro_config(own_models, own_runs["no-payload"], PMIXED, queries=64,
                                           replay_payload=False))
    expected = changed(own_models.teachers[1], _edit_config)
    with pytest.raises(ValueError, match=re.escape(f"was written with other models: {expected}")):
        run_decode(config, resume=True, progress=False, verbose=False)


def _as_older_trace(manifest: dict) -> None:
    """The manifest an older dpledger wrote: a model's content_hash is its weights' hash alone."""
    manifest.pop("tokenizer_files")
    for model in manifest["models"]:
        model["content_hash"] = model.pop("weights_sha256")
        model.pop("files")


def test_an_older_trace_is_audited_on_what_it_records_and_says_what_it_could_not_check(own_runs, own_models,
                                                                                      changed, tmp_path):
    older = tmp_path / "older"
    shutil.copytree(own_runs["payload"], older)
    forge(older, edit_manifest=_as_older_trace)
    report = audit_run(older, mc_samples=50, game_trials=200, write=False)
    models = report.check("models")
    assert report.verdict == "PASS", [c.to_dict() for c in report.failed]
    assert report.check("canary_game").status is Status.PASS  # compared on the weights the trace records
    assert models.status is Status.PASS and "have the weights the manifest records; not checked: the config and " \
        "tokenizer files of public, teacher-0, teacher-1, teacher-2 (this trace, written by an older dpledger, " \
        "records their weights only); the files of the tokenizer" in models.detail
    assert models.evidence["unchecked"]
    # a config edit that changes the logits: the teacher now runs with it, and the replay's
    # comparison of the payload with the models' logits catches it
    changed(own_models.teachers[1], _edit_config)
    report = audit_run(older, mc_samples=50, play_game=False, write=False)
    assert report.check("models").status is Status.PASS and report.check("replay").status is Status.FAIL
    assert "logits" in report.check("replay").detail, report.check("replay").detail
    without_payload = tmp_path / "older-without-payload"  # the steps recomputed from the models differ
    shutil.copytree(own_runs["no-payload"], without_payload)
    forge(without_payload, edit_manifest=_as_older_trace)
    report = audit_run(without_payload, mc_samples=50, play_game=False, write=False)
    assert report.check("models").status is Status.PASS and report.check("replay").status is Status.FAIL
    changed(own_models.teachers[1], _truncate)
    assert check_models(load_trace(older)).status is Status.FAIL


def test_weights_hashed_without_file_hashes_are_named_as_such_not_as_missing_files():
    """A recorded entry with file hashes, against a model identity that hashed its weights only: one
    line saying the files were not hashed (it raised TypeError once, then listed every file missing)."""
    entry = {"source": "m", "weights_sha256": "ab", "files": {"config.json": "cd"}, "content_hash": "ef"}
    found = ModelIdentity("public", "m", "ef", weights_sha256="ab", files=None)
    assert identity_problems(entry, found) == ["m: its files were not hashed, so the manifest's file hashes cannot be "
                                              "checked"]
