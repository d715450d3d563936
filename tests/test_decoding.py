"""Decoding runs: model loading, batched forward, traces, resume after a kill, hash chain, bad configs."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dpledger.decoding import trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.ensemble import Ensemble, load_causal_lm
from dpledger.decoding.run import run_decode
from dpledger.mechanisms import NoisyScreening, PMixED, data_dependent_pmixed_curve
from tests.micro import kill_and_resume, micro_config

ADAPMIXED = {"type": "adapmixed", "alpha": 18.0, "beta": 0.2, "lam": 0.05, "sigma": 0.01, "threshold": 0.3, "top_k": 20}


def test_batched_forward_matches_transformers_per_model(micro_models):
    ensemble = Ensemble.from_pretrained(str(micro_models.public), [str(t) for t in micro_models.teachers])
    ids = torch.randint(0, ensemble.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    batched = ensemble.logits(ids)
    for index, path in enumerate([micro_models.public, *micro_models.teachers]):
        reference = load_causal_lm(str(path))(input_ids=ids).logits
        torch.testing.assert_close(batched[index], reference, atol=2e-5, rtol=1e-5)


def test_saved_full_and_lora_teachers_load_by_path_with_identical_distributions(micro_models, tmp_path):
    from peft import LoraConfig, get_peft_model

    public = load_causal_lm(str(micro_models.public))
    public_dir = tmp_path / "public"
    public.save_pretrained(public_dir)
    lora = get_peft_model(load_causal_lm(str(micro_models.public)),
                          LoraConfig(r=4, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True, init_lora_weights=False))
    lora.eval()
    lora.save_pretrained(tmp_path / "lora")
    full = load_causal_lm(str(micro_models.teachers[0]))
    full.save_pretrained(tmp_path / "full")
    ids = torch.randint(0, public.config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected_public = torch.softmax(public(input_ids=ids).logits.double(), -1)
        expected_lora = torch.softmax(lora(input_ids=ids).logits.double(), -1)
        expected_full = torch.softmax(full(input_ids=ids).logits.double(), -1)
    lora_ensemble = Ensemble.from_pretrained(str(public_dir), [str(tmp_path / "lora")], teacher_kind="lora")
    public_probs, teacher_probs = lora_ensemble.distributions(ids)
    torch.testing.assert_close(public_probs, expected_public, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(teacher_probs[..., 0, :], expected_lora, atol=1e-6, rtol=1e-5)
    _, full_probs = Ensemble.from_pretrained(str(public_dir), [str(tmp_path / "full")]).distributions(ids)
    torch.testing.assert_close(full_probs[..., 0, :], expected_full, atol=1e-6, rtol=1e-5)


def test_trace_layout_ledger_and_recorded_step_match_pure_mechanism_code(micro_models, tmp_path):
    config = config_from_dict(micro_config(micro_models, tmp_path / "run", ADAPMIXED))
    result = run_decode(config, progress=False, verbose=False)
    run_dir = result.directory
    manifest = trace.read_manifest(run_dir)
    assert manifest["mechanism"]["components"] == {"screen": False, "pmixed_data_dependent": True}
    assert {m["role"] for m in manifest["models"]} == {"public", "teacher-0", "teacher-1", "teacher-2"}
    records = trace.read_records(run_dir)
    assert len(records) == 96 and [r["step"] for r in records] == list(range(96))
    ledger = json.loads((run_dir / trace.LEDGER).read_text())
    charged = np.sum([r["rdp_pmixed_data_dependent"] for r in records], axis=0)
    np.testing.assert_allclose(ledger["ledger"]["components"]["pmixed_data_dependent"]["values"], charged, rtol=1e-12)
    rows = ledger["breakdown"]["rows"]
    assert sum(r["epsilon"] for r in rows[:-1]) == pytest.approx(rows[-1]["epsilon"], abs=1e-12)
    minimum, observed = ledger["min_data_dependent_theorem_3_1_total"], ledger["observed_data_dependent_total"]
    assert "NOT a valid charge" in minimum["note"] and minimum["epsilon"] <= observed["epsilon"]
    # released-output accounting for add-or-remove: at least Eq. 3 on every step (the add-one bound may be larger)
    assert np.all(np.asarray(charged) >= np.asarray(observed["values"]) * (1 - 1e-12))

    # one recorded step, recomputed by mechanisms/ from the replay payload
    payload = np.load(run_dir / "replay" / "block-000001.npy")
    public, teachers = Ensemble.split_distributions(torch.from_numpy(payload))
    block = records[32:64]
    passed = [r["position"] for r in block if r["screen_passed"]]
    failed = [r["position"] for r in block if not r["screen_passed"]]
    assert passed and failed, "the test threshold should let some steps pass and others fail"
    pmixed = PMixED(18.0, 0.2, 3)
    row = passed[0]
    record = block[row]
    lambdas = pmixed.mixing_weights(teachers[row].numpy(), public[row].numpy())
    np.testing.assert_allclose(record["lambdas"], lambdas, rtol=0, atol=1e-12)
    # the run claims add-or-remove: Eq. 3 and the add-one bound, the larger at each order
    curve = data_dependent_pmixed_curve(pmixed, teachers[row].numpy(), public[row].numpy(), lambdas, manifest["orders"],
                                        relation="add_or_remove_one")
    assert manifest["mechanism"]["component_relations"]["pmixed_data_dependent"] == "add_or_remove_one"
    # charged: exact on a sub-grid, a chord bound within 0.5% between (dpledger.mechanisms.leave_one_out.leave_one_out_curve)
    charged = np.asarray(record["rdp_pmixed_data_dependent"])
    assert np.all(charged >= curve.values * (1 - 1e-12)) and np.all(charged <= curve.values * 1.006)
    output = pmixed.output_distribution(teachers[row].numpy(), public[row].numpy(), lambdas)
    assert record["prob_true_token"] == pytest.approx(output[record["true_token"]], rel=1e-9)
    screen = NoisyScreening(teachers=3, lam=0.05, sigma=0.01, alpha=18.0).rdp_values(np.asarray(manifest["orders"]))
    np.testing.assert_allclose(record["rdp_screen"], screen, rtol=1e-12)
    skipped = block[failed[0]]  # answered by the public model, still charged: released-output accounting
    assert skipped["answered_by"] == "public" and all(v > 0 for v in skipped["rdp_pmixed_data_dependent"])
    assert skipped["prob_true_token"] == pytest.approx(float(public[failed[0], skipped["true_token"]]), rel=1e-12)


def test_editing_a_committed_record_breaks_the_hash_chain(micro_models, tmp_path):
    config = config_from_dict(micro_config(micro_models, tmp_path / "run", {"type": "pmixed", "alpha": 6.0, "beta": 0.05},
                                           queries=64))
    run_dir = run_decode(config, progress=False, verbose=False).directory
    path = trace.chunk_path(run_dir, 1)
    table = pq.read_table(path).to_pylist()
    table[3]["prob_true_token"] = 0.99
    pq.write_table(pa.Table.from_pylist(table), path)
    with pytest.raises(trace.TraceError, match=r"chunk-000001.parquet: step 35 was modified"):
        trace.read_records(run_dir)
    os.remove(trace.chunk_path(run_dir, 0))
    with pytest.raises(trace.TraceError, match="chunk-000000.parquet: missing"):
        trace.read_records(run_dir)


def test_killed_run_resumes_to_the_same_ledger_as_an_uninterrupted_run(micro_models, tmp_path):
    mechanism = dict(ADAPMIXED)
    reference_cfg = micro_config(micro_models, tmp_path / "reference", mechanism, queries=150, block_size=10,
                                 replay_payload=False)
    reference = run_decode(config_from_dict(reference_cfg), progress=False, verbose=False)
    # resumed in a fresh interpreter, as a user resumes: kernels from numba's disk cache, another hash seed
    resumed, killed, committed = kill_and_resume(reference_cfg, tmp_path, fresh_resume=True)
    assert 0 < committed < 150
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    killed_ledger = json.loads((tmp_path / "killed" / trace.LEDGER).read_text())
    assert killed_ledger["ledger"] == reference.summary["ledger"]
    assert killed_ledger["epsilon"] == reference.summary["epsilon"]
    # the same records; their hashes differ only through the manifests (output path, start time),
    # which the chain's genesis binds
    def content(run_dir):
        return [{k: v for k, v in r.items() if k not in ("prev_hash", "record_hash")} for r in trace.read_records(run_dir)]

    assert content(tmp_path / "killed") == content(reference.directory)
    assert f"chain head {trace.read_final(tmp_path / 'killed')['head']}" in resumed.stdout


@pytest.mark.parametrize("change, message", [
    (lambda c: c["mechanism"].update(type="magic"), "unknown mechanism type 'magic'"),
    (lambda c: c["models"].update(teachers=5), "models.teachers = 5 does not match the 3 teacher_paths"),
    (lambda c: c["models"].update(public="/nonexistent/model"), "model path does not exist: /nonexistent/model"),
    (lambda c: c["mechanism"].update(beta=-1.0), "mechanism.beta must be a finite number > 0, got -1.0"),
    (lambda c: c["mechanism"].update(gamma=2.0), "unknown parameters for mechanism 'pmixed': ['gamma']"),
])
def test_bad_configs_fail_clearly_without_a_trace(micro_models, tmp_path, change, message):
    config = micro_config(micro_models, tmp_path / "run", {"type": "pmixed", "alpha": 6.0, "beta": 0.05})
    change(config)
    with pytest.raises(ValueError) as error:
        run_decode(config_from_dict(config), progress=False, verbose=False)
    assert message in str(error.value)
    assert not (tmp_path / "run").exists()


def test_vocabulary_mismatch_is_refused(micro_models, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    other = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=1, n_head=2))
    other.save_pretrained(tmp_path / "other")
    config = micro_config(micro_models, tmp_path / "run", {"type": "public"})
    config["models"]["teacher_paths"][1] = str(tmp_path / "other")
    with pytest.raises(ValueError, match="teacher 1 has vocabulary size 300, the public model 320"):
        run_decode(config_from_dict(config), progress=False, verbose=False)
    assert not (tmp_path / "run").exists()


def test_output_directory_holding_another_run_is_refused(micro_models, tmp_path):
    first = config_from_dict(micro_config(micro_models, tmp_path / "run", {"type": "public"}, queries=32))
    run_decode(first, progress=False, verbose=False)
    before = sorted(p.name for p in (tmp_path / "run").rglob("*"))
    second = config_from_dict(micro_config(micro_models, tmp_path / "run", {"type": "ensemble"}, queries=32))
    with pytest.raises(ValueError, match="already holds files: pass --resume"):
        run_decode(second, progress=False, verbose=False)
    with pytest.raises(ValueError, match="holds another run"):
        run_decode(second, resume=True, progress=False, verbose=False)
    assert sorted(p.name for p in (tmp_path / "run").rglob("*")) == before


def test_a_used_output_directory_is_refused_before_any_model_loads(micro_models, tmp_path, capsys):
    """dpledger decode checks --out first: with teacher paths that do not exist, the error is still the
    output directory's (the models were never opened), and the run there is unchanged."""
    from dpledger.cli import main
    from tests.micro import write_toml

    config = micro_config(micro_models, tmp_path / "run", {"type": "public"}, queries=8)
    run_decode(config_from_dict(config), progress=False, verbose=False)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    missing = {**config, "models": {**config["models"], "teacher_paths": [str(tmp_path / "absent")] * 3}}
    path = write_toml(tmp_path / "missing.toml", missing)
    other = write_toml(tmp_path / "other.toml", {**missing, "mechanism": {"type": "ensemble"}})
    expected = {(path, ()): "already holds files: pass --resume",
                (other, ("--resume",)): "holds another run (its config differs from this one)"}
    for (config_path, flags), message in expected.items():
        assert main(["decode", str(config_path), "--no-progress", *flags]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    holder = trace.RunLock(tmp_path / "run").acquire()   # another open file: the pre-flight sees it held
    try:
        resumed = write_toml(tmp_path / "same.toml", config)
        assert main(["decode", str(resumed), "--no-progress", "--resume"]) == 2
        err = capsys.readouterr().err
        assert f"is being written by another dpledger process (pid {os.getpid()})" in err and err.count("\n") == 1
    finally:
        holder.release()
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("not a run")
    with pytest.raises(trace.UnusableRunError, match="is not a dpledger run directory"):
        trace.check_output_directory(tmp_path / "plain", resume=True)
    with pytest.raises(ValueError, match="exists and is not a directory"):
        trace.check_output_directory(tmp_path / "plain" / "notes.txt", resume=False)
    trace.check_output_directory(tmp_path / "fresh", resume=False)   # absent: nothing to refuse
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()} == before


def test_a_run_swapped_in_after_the_early_check_is_refused_under_the_lock(micro_models, tmp_path, monkeypatch):
    """The early check runs before the lock: what the writer appends to is checked again under it."""
    ours = config_from_dict(micro_config(micro_models, tmp_path / "run", {"type": "public"}, queries=8))
    other = config_from_dict(micro_config(micro_models, tmp_path / "other", {"type": "ensemble"}, queries=8))
    run_decode(other, progress=False, verbose=False)
    real = trace.check_output_directory

    def then_swapped(out, resume, fingerprint=None):
        real(out, resume, fingerprint)
        if (tmp_path / "run").exists():
            (tmp_path / "run").rename(tmp_path / "ours-moved")
        (tmp_path / "other").rename(tmp_path / "run")

    monkeypatch.setattr(trace, "check_output_directory", then_swapped)
    with pytest.raises(ValueError, match="already holds files: pass --resume"):   # empty at the check
        run_decode(ours, progress=False, verbose=False)
    (tmp_path / "run").rename(tmp_path / "other")
    monkeypatch.setattr(trace, "check_output_directory", real)
    run_decode(ours, progress=False, verbose=False)
    monkeypatch.setattr(trace, "check_output_directory", then_swapped)
    before = {p.name: p.read_bytes() for p in (tmp_path / "other").rglob("*") if p.is_file() and p.name != trace.LOCK}
    with pytest.raises(ValueError, match="holds another run"):   # ours at the check, the other config's under the lock
        run_decode(ours, resume=True, progress=False, verbose=False)
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file() and p.name != trace.LOCK} == before


def test_a_lock_probe_never_refuses_a_writer(tmp_path):
    """lock_holder's probe (the audit's, decode's early check) holds a shared lock for an instant: a writer
    meeting it takes the lock a moment later instead of being refused under the prober's name."""
    import fcntl
    import threading

    (tmp_path / "run").mkdir()
    probe = os.open(tmp_path / "run" / trace.LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(probe, fcntl.LOCK_SH)
    threading.Timer(0.015, os.close, (probe,)).start()   # closing releases the probe's lock
    lock = trace.RunLock(tmp_path / "run").acquire()
    try:
        assert trace.lock_holder(tmp_path / "run") == f"pid {os.getpid()}"
    finally:
        lock.release()
    assert trace.lock_holder(tmp_path / "run") is None


def test_free_generation_stream_and_subsampled_pmixed(micro_models, tmp_path):
    config = micro_config(micro_models, tmp_path / "gen", {"type": "pmixed", "alpha": 6.0, "beta": 0.05,
                                                          "sample_rate": 0.5, "subsampling_variant": "realised-size"},
                          queries=12)
    config["data"] = {"stream": "generate", "prompts": ["Customer: Hi, I am", "Agent:"], "max_new_tokens": 6}
    result = run_decode(config_from_dict(config), progress=False, verbose=False)
    records = trace.read_records(result.directory)
    assert len(records) == 12 and all(r["true_token"] == -1 for r in records)
    assert result.summary["perplexity"] is None
    sizes = [len(r["sampled_teachers"]) for r in records]
    assert len(set(sizes)) > 1, "Poisson masks at q=0.5 should give varying subsample sizes"
    assert all(set(r["sampled_teachers"]) <= {0, 1, 2} for r in records)
    from dpledger.mechanisms import SubsampledPMixED

    pmixed = PMixED(6.0, 0.05, 3)
    orders = trace.read_manifest(result.directory)["orders"]
    for record, size in zip(records, sizes):  # realised-size: the charge follows the recorded subsample size
        expected = SubsampledPMixED(pmixed, 0.5, "realised-size", size).rdp_values(np.asarray(orders))
        np.testing.assert_allclose(record["rdp_pmixed_subsampled_realised-size"], expected, rtol=1e-12)


def test_the_light_list_of_mechanism_types_is_the_runners_registry():
    """decoding.mechanism_types (checked before torch loads) names exactly the types build_runner builds."""
    from dpledger.decoding import runners
    from dpledger.decoding.mechanism_types import MECHANISM_TYPES

    assert MECHANISM_TYPES == tuple(sorted([*runners._BUILDERS, *runners._PARAMETERISED]))
    with pytest.raises(ValueError, match="unknown mechanism type 'gnmax'.*aggregator"):
        runners.build_runner({"type": "gnmax"}, 3)


def test_a_small_model_loaded_again_is_a_fresh_copy_and_any_changed_file_loads_afresh(micro_models, tmp_path,
                                                                                         monkeypatch):
    """load_causal_lm keeps small models by the bytes of every file in their directory: a second load is
    an equal, separate model (changing it changes no later load), a file changed in place, its size
    kept, is loaded from disk again, and a checkpoint with a shard outside the directory is never kept."""
    import json
    import shutil
    from collections import OrderedDict

    import torch

    from dpledger.decoding import ensemble
    from dpledger.decoding.ensemble import load_causal_lm

    monkeypatch.setattr(ensemble, "_kept", OrderedDict())   # other tests kept these bytes' model already
    loads = []
    real = ensemble._load_local_causal_lm
    monkeypatch.setattr(ensemble, "_load_local_causal_lm", lambda directory: loads.append(directory) or real(directory))

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))

    directory = tmp_path / "teacher"
    shutil.copytree(micro_models.teachers[0], directory)
    first, second = load_causal_lm(str(directory)), load_causal_lm(str(directory))
    assert len(loads) == 1 and first is not second and not second.training and same(first, second)
    assert second.name_or_path == second.config.name_or_path == str(directory)
    assert second.lm_head.weight is second.transformer.wte.weight      # tied, as a load ties them
    with torch.no_grad():
        for parameter in second.parameters():
            parameter.add_(1.0)       # a caller's model is its own: changing it changes no later load
    third = load_causal_lm(str(directory))
    assert len(loads) == 1 and third is not second and same(third, first)
    weights = directory / "model.safetensors"
    other = tmp_path / "other"
    shutil.copytree(micro_models.public, other)   # the same architecture, other weights
    assert weights.stat().st_size == (other / "model.safetensors").stat().st_size
    weights.write_bytes((other / "model.safetensors").read_bytes())   # the same size, other bytes
    changed = load_causal_lm(str(directory))
    # (against the kept copy: `first` may map the weights file, rewritten in place above)
    assert len(loads) == 2 and same(changed, load_causal_lm(str(other))) and not same(changed, third)
    # a sharded checkpoint whose shard lies in a subdirectory: the digest would not cover it
    sharded = tmp_path / "sharded"
    shutil.copytree(micro_models.teachers[0], sharded)
    (sharded / "shards").mkdir()
    (sharded / "model.safetensors").rename(sharded / "shards" / "model.safetensors")
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {name: "shards/model.safetensors" for name in first.state_dict()}}))
    assert ensemble._small_directory_digest(sharded) is None
    assert ensemble._small_directory_digest(directory) is not None
