"""The bounded replay payload of a voting run: what the audit needs to replay every vote exactly.

A voting step's outcome depends on the teachers only through their votes (Cohen et al. 2023,
Framework 1.2): teacher i votes y_i = argmax_j log p_i[j] - log u_j, with u the step's public Exp(1)
draws (one vector shared by all teachers for coordinated votes, one per teacher for independent
ones; dpledger.mechanisms.voting.race_draws), and everything after the vote histogram (the
aggregator, the charges, the neighbour ablation) reads the histogram alone. So instead of the
(N+1) x L x V float32 logits, a block's payload keeps

  public_logits  (L, V) float32     the public model's logits: the fallback's distribution on fail
  token_ids      (L, N, k) int32    per teacher, the k tokens of highest race score, the vote first
  log_probs      (L, N, k) float64  log p_i at those tokens, the very values the race used

  size: L V 4 + N L k 12 bytes plus the container's headers (payload_bytes_bound), against
  (N+1) L V 4 for the logits: at N = 512, V = 131072, L = 64, k = 4, 35.1 MB instead of 17.2 GB.

The audit regenerates u from each step's public vote seed and checks an argmax certificate per
teacher (certify_votes): the stored ids are distinct tokens of the vocabulary, their log-probabilities
are those of a sub-distribution (each <= 0, total mass <= 1), their race scores are in non-increasing
order, and the first (the vote) beats the runner-up (ties go to the lower id, as torch.argmax). The
votes so certified give the histograms, which the replay compares with the records. Like the full
logits, the stored values are bound to the records by their sha256 and, where the run's models are
available, compared with the models' own (audit.replay).
"""
from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import numpy.typing as npt
import torch

from dpledger.accounting import safe_files
from dpledger.accounting.errors import require
from dpledger.decoding import trace
from dpledger.mechanisms.voting import VoteCoordination, log_draws, race_draws, race_scores

LOGITS_FORMAT, VOTE_FORMAT = trace.LOGITS_FORMAT, trace.VOTE_FORMAT
DEFAULT_TOP_K = 4
"""Race entries kept per teacher and step: the vote, the runner-up that certifies it, and two more
that make the order check meaningful; 12 bytes each."""
ARRAYS = ("public_logits", "token_ids", "log_probs")
CONTAINER_BYTES = 4096
"""Room for the .npz container: a zip entry and a .npy header per array (numpy writes ~128 bytes
of header and ~100 bytes of zip records per array)."""
MASS_SLACK = 1e-9
"""The stored probabilities of one teacher may sum to 1 + this (softmax in float64 rounds)."""


@dataclass(frozen=True)
class VotePayload:
    """One block's (or window's) bounded payload; see the module docstring for the arrays."""

    public_logits: npt.NDArray[np.float32]   # (L, V)
    token_ids: npt.NDArray[np.int32]         # (L, N, k)
    log_probs: npt.NDArray[np.float64]       # (L, N, k)

    @property
    def steps(self) -> int:
        """L, the number of steps held."""
        return int(self.public_logits.shape[0])

    def rows(self, start: int, stop: int) -> "VotePayload":
        """Steps start..stop of the payload.

        Args:
            start: the first step's row (0-based).
            stop: one past the last step's row.

        Returns:
            The VotePayload of those steps (views, not copies).
        """
        return VotePayload(self.public_logits[start:stop], self.token_ids[start:stop], self.log_probs[start:stop])


def kept_entries(top_k: int, vocabulary_size: int) -> int:
    """The race entries kept per teacher and step: top_k, or V where the vocabulary is smaller.

    Args:
        top_k: the run's replay_top_k.
        vocabulary_size: V.

    Returns:
        min(top_k, V).
    """
    return min(top_k, vocabulary_size)


def payload_bytes(steps: int, teachers: int, vocabulary_size: int, top_k: int) -> int:
    """The most bytes a block's bounded payload takes: L V 4 + N L k 12 + CONTAINER_BYTES.

    Args:
        steps: L.
        teachers: N.
        vocabulary_size: V.
        top_k: the run's replay_top_k (k = kept_entries(top_k, V)).

    Returns:
        The bound in bytes (Python integers: no overflow).
    """
    k = kept_entries(top_k, vocabulary_size)
    return CONTAINER_BYTES + 4 * steps * vocabulary_size + 12 * teachers * steps * k


def size_formula(top_k: int) -> str:
    """The payload's size in words, as the manifest records it.

    Args:
        top_k: the run's replay_top_k.

    Returns:
        The formula with k filled in.
    """
    return (f"per block of L steps: 4 L V (public float32 logits) + 12 N L k (int32 token id and float64 "
            f"log-probability of each teacher's k = min({top_k}, V) highest race scores) + at most "
            f"{CONTAINER_BYTES} bytes of .npz headers")


def top_race_entries(logits: torch.Tensor, seeds: Sequence[int], coordination: VoteCoordination,
                     top_k: int) -> VotePayload:
    """The bounded payload of L steps from their logits: the public row, and per teacher the k
    tokens of highest race score (its vote first, whatever a tie), with their log-probabilities.
    Computed one step at a time, so a step's (N, V) float64 work is all it holds.

    Args:
        logits: (N+1, L, V) float32 logits, the public model first.
        seeds: the steps' public vote seeds.
        coordination: the run's votes (COORDINATED or INDEPENDENT).
        top_k: entries per teacher (kept_entries(top_k, V) of them).

    Returns:
        The VotePayload of the L steps.

    Raises:
        ValueError: if logits is not (N+1, L, V) with one seed per step, or top_k < 2.
    """
    require(logits.ndim == 3 and logits.shape[1] == len(seeds),
            f"logits must be (N+1, steps, V) with one seed per step, got {tuple(logits.shape)} and {len(seeds)} seeds")
    require(isinstance(top_k, int) and top_k >= 2, f"top_k must be an integer >= 2, got {top_k!r}")
    models, steps, vocab = logits.shape
    k = kept_entries(top_k, vocab)
    ids = np.empty((steps, models - 1, k), dtype=np.int32)
    log_probs = np.empty((steps, models - 1, k), dtype=np.float64)
    for row in range(steps):
        teachers = torch.softmax(logits[1:, row].double(), dim=-1)   # as Ensemble.split_distributions computes them
        scores = race_scores(teachers[None], [seeds[row]], coordination)[0]
        chosen = torch.topk(scores, k, dim=-1, sorted=True).indices
        winners = torch.argmax(scores, dim=-1)
        for teacher in torch.nonzero(chosen[:, 0] != winners).flatten().tolist():
            # a tie the top-k ordered otherwise: the vote is torch.argmax's choice, forced first
            forced = scores[teacher].scatter(0, winners[teacher:teacher + 1], math.inf)
            chosen[teacher] = torch.topk(forced, k, sorted=True).indices
        ids[row] = chosen.numpy()
        log_probs[row] = torch.log(teachers.gather(-1, chosen)).numpy()   # the same float64 log the race took
    return VotePayload(np.ascontiguousarray(logits[0].numpy(), dtype=np.float32), ids, log_probs)


def certify_votes(payload: VotePayload, seeds: Sequence[int], coordination: VoteCoordination,
                  vocabulary_size: int) -> tuple[npt.NDArray[np.int64], list[tuple[int, str]]]:
    """Each teacher's vote from the bounded payload, and where its argmax certificate fails.

    Per step and teacher: the stored ids are distinct tokens in [0, V); the stored log-probabilities
    are not NaN, each <= 0 and their total mass <= 1 + MASS_SLACK; their race scores (with u
    regenerated from the step's public seed) are in non-increasing order; and the first beats the
    second, or ties it with the lower id (torch.argmax's rule). The vote is the first stored id.

    Args:
        payload: the window's bounded payload.
        seeds: the window's recorded vote seeds, one per step.
        coordination: the run's votes.
        vocabulary_size: V.

    Returns:
        (votes (L, N) int64, [(step row, what failed)] for every step with a failed certificate).

    Raises:
        ValueError: if there is not one seed per step.
    """
    require(len(seeds) == payload.steps, f"{payload.steps} payload steps, {len(seeds)} vote seeds")
    steps, teachers, k = payload.token_ids.shape
    votes = payload.token_ids[:, :, 0].astype(np.int64)
    problems: list[tuple[int, str]] = []
    for row in range(steps):
        ids, log_probs = payload.token_ids[row].astype(np.int64), payload.log_probs[row]
        if ids.min(initial=0) < 0 or ids.max(initial=0) >= vocabulary_size:
            problems.append((row, f"a stored token id is outside [0, {vocabulary_size})"))
            continue
        ordered = np.sort(ids, axis=1)
        if (ordered[:, 1:] == ordered[:, :-1]).any():
            problems.append((row, f"teacher {int(np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(1))[0])} "
                                  "stores a token twice"))
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            mass = np.exp(log_probs).sum(axis=1)
        bad = np.isnan(log_probs).any(axis=1) | (log_probs > 0).any(axis=1) | ~(mass <= 1 + MASS_SLACK)
        if bad.any():
            problems.append((row, f"teacher {int(np.flatnonzero(bad)[0])}'s stored probabilities are not a "
                                  "sub-distribution (NaN, above 1, or summing above 1)"))
            continue
        draws = race_draws([seeds[row]], teachers, vocabulary_size, coordination)[0].expand(teachers, -1)
        scores = (torch.from_numpy(log_probs) - log_draws(draws.gather(1, torch.from_numpy(ids)))).numpy()
        unordered = (scores[:, 1:] > scores[:, :-1]).any(axis=1)
        if unordered.any():
            problems.append((row, f"teacher {int(np.flatnonzero(unordered)[0])}'s stored race scores are not in "
                                  "decreasing order (a stored runner-up beats the vote)"))
            continue
        if k >= 2:
            tie_lost = (scores[:, 0] == scores[:, 1]) & (ids[:, 0] > ids[:, 1])
            if tie_lost.any():
                problems.append((row, f"teacher {int(np.flatnonzero(tie_lost)[0])}'s vote ties a lower token id, "
                                      "which argmax would have chosen"))
    return votes, problems


def write_vote_payload(run_dir: str | Path, index: int, payload: VotePayload) -> str:
    """Block `index`'s bounded payload as an uncompressed .npz, atomically; returns its sha256.

    Args:
        run_dir: the run directory; no link below it is written through.
        index: the block's index (0-based).
        payload: the block's VotePayload.

    Returns:
        The sha256 of the file's bytes, which each of the block's records holds.

    Raises:
        UnsafeFileError: if replay/ or the payload's path is a link or not a regular file.
        OSError: if the file cannot be written.
    """
    buffer = io.BytesIO()
    np.savez(buffer, public_logits=np.ascontiguousarray(payload.public_logits),
             token_ids=np.ascontiguousarray(payload.token_ids), log_probs=np.ascontiguousarray(payload.log_probs))
    data = buffer.getvalue()
    trace.atomic_write_bytes(trace.replay_path(run_dir, index, VOTE_FORMAT), data, run_dir)
    return hashlib.sha256(data).hexdigest()


def read_vote_payload(run_dir: str | Path, index: int, steps: int, teachers: int, vocabulary_size: int,
                      top_k: int) -> VotePayload:
    """Block `index`'s bounded payload, checked to hold exactly the arrays, dtypes and shapes a block
    of `steps` steps needs (never a pickle; never more than payload_bytes read).

    Args:
        run_dir: the run directory.
        index: the block's index.
        steps: L.
        teachers: N.
        vocabulary_size: V.
        top_k: the manifest's replay_top_k.

    Returns:
        The VotePayload.

    Raises:
        TraceError: if the file is missing, unsafe, oversized, not an .npz of exactly those arrays,
            or an array has another dtype or shape.
    """
    path = trace.replay_path(run_dir, index, VOTE_FORMAT)
    try:
        data = safe_files.read_bytes(path, payload_bytes(steps, teachers, vocabulary_size, top_k), root=run_dir,
                                     what="its block's bounded vote payload")
    except FileNotFoundError:
        raise trace.TraceError(f"{path}: missing") from None
    except (safe_files.UnsafeFileError, OSError) as error:
        raise trace.TraceError(str(error) if isinstance(error, ValueError) else f"{path}: {error}") from None
    k = kept_entries(top_k, vocabulary_size)
    expected = {"public_logits": (np.float32, (steps, vocabulary_size)), "token_ids": (np.int32, (steps, teachers, k)),
                "log_probs": (np.float64, (steps, teachers, k))}
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            names = sorted(archive.files)
            require(names == sorted(ARRAYS), f"holds arrays {names}, expected {sorted(ARRAYS)}")
            arrays = {name: archive[name] for name in ARRAYS}
    except Exception as error:  # numpy and zipfile raise several types for damaged files
        raise trace.TraceError(f"{path}: unreadable bounded vote payload ({type(error).__name__}: "
                               f"{str(error).splitlines()[0] if str(error) else ''})") from None
    for name, (dtype, shape) in expected.items():
        array = arrays[name]
        if array.dtype != dtype or array.shape != shape:
            raise trace.TraceError(f"{path}: {name} must be {np.dtype(dtype)} of shape {shape}, got {array.dtype} "
                                   f"{array.shape}")
    return VotePayload(arrays["public_logits"], arrays["token_ids"], arrays["log_probs"])


def payload_format_entry(requested: str, top_k: int, voting: bool) -> dict:
    """The manifest's replay_payload_format for a run: the bounded vote payload for a voting run
    that asks for it ("bounded"), every model's logits otherwise.

    Args:
        requested: run.replay_payload_format ("bounded" or "logits").
        top_k: run.replay_top_k.
        voting: whether the run's mechanism is voting.

    Returns:
        {"format": VOTE_FORMAT, "top_k": k, "bytes_per_block": size_formula(k)} or {"format": LOGITS_FORMAT,
        "bytes_per_block": the logits' size}.
    """
    if voting and requested == "bounded":
        return {"format": VOTE_FORMAT, "top_k": top_k, "bytes_per_block": size_formula(top_k)}
    return {"format": LOGITS_FORMAT, "bytes_per_block": f"per block of L steps: 4 (N+1) L V (float32 logits of the "
                                                        f"public model and N teachers) + at most "
                                                        f"{trace.NPY_HEADER_BYTES} bytes of .npy header"}


def block_payload_file(run_dir: str | Path, index: int, entry: dict, steps: int, teachers: int,
                       vocabulary_size: int) -> tuple[Path, int]:
    """Where block `index`'s payload of the format `entry` lies, and the most bytes it may take.

    Args:
        run_dir: the run directory.
        index: the block's index.
        entry: the manifest's replay_payload_format (trace.payload_format).
        steps: the block's L.
        teachers: N.
        vocabulary_size: V.

    Returns:
        (the payload's path, its size bound in bytes).
    """
    if entry["format"] == VOTE_FORMAT:
        return (trace.replay_path(run_dir, index, VOTE_FORMAT),
                payload_bytes(steps, teachers, vocabulary_size, entry["top_k"]))
    return trace.replay_path(run_dir, index), trace.payload_bytes_bound((teachers + 1, steps, vocabulary_size))
