"""The bounded replay payload of a voting run (dpledger.decoding.vote_payload): each teacher's top-k
race entries certify its vote exactly; a forged payload FAILs the audit; the full logits stay an
option, and traces that kept them still replay."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dpledger.audit.audit import audit_run
from dpledger.decoding import trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode
from dpledger.decoding.vote_payload import (VotePayload, certify_votes, payload_bytes, read_vote_payload,
                                            top_race_entries, write_vote_payload)
from dpledger.mechanisms.voting import VoteCoordination, votes_from_seeds
from tests.forging import forge, load_chunks
from tests.micro import micro_config

DPARGMAX = {"type": "voting", "votes": "coordinated", "aggregator": "dpargmax", "threshold": 2.0, "sigma": 1.0,
            "sigma_threshold": 1.0}


def _logits(rng, teachers: int, steps: int, vocab: int) -> torch.Tensor:
    """LM-like logits, some teachers so peaked that most of their tokens have probability 0 in float64."""
    logits = rng.normal(0.0, 2.5, (teachers + 1, steps, vocab))
    logits[1, :, :] *= 400.0   # softmax underflows: log p = -inf on most tokens, the race must still certify
    return torch.from_numpy(logits.astype(np.float32))


@pytest.mark.parametrize("coordination", list(VoteCoordination))
@pytest.mark.parametrize("top_k", [2, 3, 8])
def test_certified_votes_are_the_votes_of_the_full_distributions(rng, coordination, top_k):
    for trial in range(4):
        teachers, steps, vocab = int(rng.integers(1, 9)), int(rng.integers(1, 6)), int(rng.integers(2, 300))
        logits = _logits(rng, teachers, steps, vocab)
        seeds = rng.integers(0, 2 ** 62, steps).tolist()
        full = torch.softmax(logits.double(), dim=-1)[1:].movedim(0, -2)   # (L, N, V), as the decode computes it
        payload = top_race_entries(logits, seeds, coordination, top_k)
        assert payload.token_ids.shape == (steps, teachers, min(top_k, vocab))
        votes, problems = certify_votes(payload, seeds, coordination, vocab)
        assert problems == [] and np.array_equal(votes, votes_from_seeds(full, seeds, coordination)), trial
        np.testing.assert_array_equal(payload.public_logits, logits[0].numpy())


def _forged(payload: VotePayload, row: int, teacher: int, edit) -> VotePayload:
    ids, log_probs = payload.token_ids.copy(), payload.log_probs.copy()
    edit(ids[row, teacher], log_probs[row, teacher])
    return VotePayload(payload.public_logits, ids, log_probs)


def test_each_broken_certificate_is_named(rng):
    logits = _logits(rng, 4, 3, 50)
    seeds = [11, 12, 13]
    payload = top_race_entries(logits, seeds, VoteCoordination.COORDINATED, 4)

    def swap(ids, log_probs):  # the runner-up recorded as the vote
        ids[[0, 1]], log_probs[[0, 1]] = ids[[1, 0]], log_probs[[1, 0]]

    def inflate(ids, log_probs):  # the vote's mass moved to the runner-up (the total stays <= 1)
        log_probs[1], log_probs[0] = np.logaddexp(log_probs[0], log_probs[1]), -700.0

    cases = {"are not in decreasing order": swap, "are not in decreasing order (a stored runner-up": inflate,
             "stores a token twice": lambda ids, lp: ids.__setitem__(1, ids[0]),
             "outside [0, 50)": lambda ids, lp: ids.__setitem__(2, 50),
             "not a sub-distribution": lambda ids, lp: lp.__setitem__(slice(None), np.log(0.6))}
    for message, edit in cases.items():
        _, problems = certify_votes(_forged(payload, 1, 2, edit), seeds, VoteCoordination.COORDINATED, 50)
        assert [row for row, _ in problems] == [1] and message in problems[0][1], (message, problems)


def _decode(micro_models, out: Path, **run):
    config = micro_config(micro_models, out, DPARGMAX, queries=32, block_size=16, **run)
    return run_decode(config_from_dict(config), progress=False, verbose=False)


def test_a_voting_run_keeps_the_bounded_payload_of_the_stated_size_and_audits(micro_models, tmp_path):
    result = _decode(micro_models, tmp_path / "run")
    manifest = trace.read_manifest(result.directory)
    entry = manifest["replay_payload_format"]
    assert entry["format"] == "vote-top-k" and entry["top_k"] == 4 and "12 N L k" in entry["bytes_per_block"]
    assert manifest["records_version"] == trace.RECORDS_VERSION >= 5   # 5: the bounded payload
    vocab, teachers = manifest["vocab_size"], manifest["n_teachers"]
    files = sorted((result.directory / "replay").iterdir())
    assert [f.name for f in files] == ["block-000000.npz", "block-000001.npz"]
    for file in files:
        size = file.stat().st_size
        body = 4 * 16 * vocab + 12 * teachers * 16 * 4
        assert body < size <= payload_bytes(16, teachers, vocab, 4) and size - body < 1200
    report = audit_run(result.directory, play_game=True, game_trials=0)
    assert report.verdict == "PASS", [c.to_dict() for c in report.failed]
    replay = report.check("replay")
    assert replay.evidence["cross_checked_with_models"] and replay.evidence["max_deviation"]["logits_vs_models"] < 1e-4
    assert report.check("neighbour_ablation").status.value == "PASS"


def _rewrite_payload(run_dir: Path, block: int, payload: VotePayload, records_too=None) -> None:
    sha = write_vote_payload(run_dir, block, payload)

    def edit(chunks):
        for record in chunks[block]:
            record["payload_sha256"] = sha
        return records_too(chunks) if records_too else chunks
    forge(run_dir, edit_chunks=edit)


def _read(run_dir: Path, block: int = 0) -> VotePayload:
    manifest = trace.read_manifest(run_dir)
    return read_vote_payload(run_dir, block, 16, manifest["n_teachers"], manifest["vocab_size"], 4)


def test_a_forged_bounded_payload_fails_the_audit(micro_models, tmp_path):
    honest = _decode(micro_models, tmp_path / "honest").directory
    payload = _read(honest)
    # a vote changed in the payload (its runner-up now stored first): the certificate and the histogram fail
    swapped = tmp_path / "swapped"
    shutil.copytree(honest, swapped)

    def swap(ids, log_probs):
        ids[[0, 1]], log_probs[[0, 1]] = ids[[1, 0]], log_probs[[1, 0]]
    _rewrite_payload(swapped, 0, _forged(payload, 3, 1, swap))
    report = audit_run(swapped, play_game=False)
    assert report.check("replay").status.value == "FAIL"
    assert "step 3: the bounded payload does not certify its votes" in report.check("replay").detail
    # the runner-up's probability inflated past the vote's: the argmax certificate fails
    inflated = tmp_path / "inflated"
    shutil.copytree(honest, inflated)

    def inflate(ids, log_probs):  # the vote's mass moved to the runner-up (the total stays <= 1)
        log_probs[1], log_probs[0] = np.logaddexp(log_probs[0], log_probs[1]), -700.0
    _rewrite_payload(inflated, 0, _forged(payload, 5, 0, inflate))
    detail = audit_run(inflated, play_game=False).check("replay").detail
    assert "step 5: the bounded payload does not certify its votes: teacher 0's stored race scores" in detail
    # a self-consistent forgery (the vote moved to another token, which is stored as the likeliest,
    # and the records recomputed): the certificate holds, the run's models expose it
    moved = tmp_path / "moved"
    shutil.copytree(honest, moved)

    def move(ids, log_probs):  # the runner-up stored as the vote, nearly certain; the other entries impossible
        ids[[0, 1]] = ids[[1, 0]]
        log_probs[0], log_probs[1:] = np.log(0.999), -np.inf
    forged = _forged(payload, 2, 0, move)
    votes, problems = certify_votes(forged, [r["vote_seed"] for r in load_chunks(moved)[0]],
                                    VoteCoordination.COORDINATED, trace.read_manifest(moved)["vocab_size"])
    assert problems == []

    def recount(chunks):
        record = chunks[0][2]
        tokens, counts = np.unique(votes[2], return_counts=True)
        record["vote_tokens"], record["vote_counts"] = tokens.tolist(), counts.tolist()
        return chunks
    _rewrite_payload(moved, 0, forged, recount)
    replay = audit_run(moved, play_game=False).check("replay")
    assert replay.status.value == "FAIL" and "payload logits differ from the models'" in replay.detail


def test_the_full_logits_stay_an_option_and_old_traces_replay(micro_models, tmp_path):
    result = _decode(micro_models, tmp_path / "logits", replay_payload_format="logits")
    assert sorted(p.name for p in (result.directory / "replay").iterdir()) == ["block-000000.npy", "block-000001.npy"]
    assert trace.read_manifest(result.directory)["replay_payload_format"]["format"] == "logits"
    assert audit_run(result.directory, play_game=False).verdict == "PASS"
    # a trace written before records version 5: no replay_payload_format, logits
    old = tmp_path / "old"
    shutil.copytree(result.directory, old)

    def version_4(manifest):
        manifest.pop("replay_payload_format")
        manifest["records_version"] = 4
        for key in ("replay_payload_format", "replay_top_k"):
            manifest["config"].pop(key)
    forge(old, edit_manifest=version_4)
    report = audit_run(old, play_game=False)
    assert report.verdict == "PASS", [c.to_dict() for c in report.failed]
    # resuming asks for the format the directory keeps
    with pytest.raises(ValueError, match=r"keeps a logits replay payload, this config asks for vote-top-k: resume it "
                                         r"with run.replay_payload_format = \"logits\""):
        run_decode(config_from_dict(micro_config(micro_models, result.directory, DPARGMAX, queries=32, block_size=16)),
                   resume=True, progress=False, verbose=False)


@pytest.mark.parametrize("run, message", [
    ({"replay_payload_format": "votes"}, "run.replay_payload_format must be one of ['bounded', 'logits'], got 'votes'"),
    ({"replay_top_k": 1}, "run.replay_top_k must be an integer >= 2 (the vote and the runner-up that certifies it), "
                          "got 1"),
    ({"replay_top_k": 2.0}, "run.replay_top_k must be an integer, got 2.0")])
def test_payload_options_are_checked(micro_models, tmp_path, run, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        config_from_dict(micro_config(micro_models, tmp_path / "x", DPARGMAX, **run))


def test_a_tied_race_stores_argmaxs_choice_first(monkeypatch):
    """Where two tokens tie for the highest score, the vote (torch.argmax: the lower id) is stored
    first, whatever order the top-k gives them, and the certificate's tie rule accepts exactly that."""
    import dpledger.decoding.vote_payload as vote_payload

    tied = torch.ones(1, 1, 4, dtype=torch.float64)   # torch.topk orders these 2, 3, 0; argmax takes 0
    assert torch.topk(tied[0, 0], 3).indices[0] != 0
    monkeypatch.setattr(vote_payload, "race_scores", lambda teachers, seeds, coordination: tied.clone())
    payload = top_race_entries(torch.zeros(2, 1, 4), [3], VoteCoordination.COORDINATED, 3)
    stored = payload.token_ids[0, 0].tolist()
    assert stored[0] == 0 and len(set(stored)) == 3
