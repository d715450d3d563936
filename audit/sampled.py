"""Sampled audits: a distinguishing game between neighbouring ensembles gives a Clopper-Pearson
lower bound on epsilon (Jagielski et al. 2020), which must stay at or below the claimed epsilon.

For an (epsilon, delta)-DP mechanism and any test S: Pr[S | D] <= e^eps Pr[S | D'] + delta and
Pr[not S | D'] <= e^eps Pr[not S | D] + delta (Kairouz et al. 2015; Jagielski et al. 2020). With
one-sided Clopper-Pearson bounds on both rates (each at (1 - confidence)/2, a union bound gives
the stated confidence), eps >= max(log((TPR_lo - delta) / FPR_hi), log((1 - FPR_hi - delta) / (1 - TPR_lo))).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from dpledger.accounting.conversion import epsilon_from_rdp
from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.errors import require, require_in_open, require_int_at_least
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.audit.ablation import clopper_pearson
from dpledger.audit.checks import CheckResult, skipped, verdict
from dpledger.audit.loader import LoadedTrace
from dpledger.decoding.ensemble import Ensemble, identity_problems
from dpledger.decoding.runners import build_runner


@dataclass(frozen=True)
class GameResult:
    """A distinguishing game's outcome: the hit counts in each world and the epsilon lower bound they give."""

    trials: int
    hits_in: int       # test positive in the world with the neighbour present (D)
    hits_out: int      # test positive in the world without it (D')
    delta: float
    confidence: float
    epsilon_lower_bound: float

    def to_dict(self) -> dict:
        """The result as audit.json's evidence records it.

        Returns:
            {"trials", "hits_in", "hits_out", "delta", "confidence", "epsilon_lower_bound"}.
        """
        return dict(vars(self))


def epsilon_lower_bound(hits_in: int, hits_out: int, trials: int, delta: float, confidence: float = 0.95) -> float:
    """Clopper-Pearson lower bound on epsilon from a distinguishing game (module docstring).
    ValueError unless trials >= 1, 0 <= hits_in, hits_out <= trials, and delta, confidence in (0, 1).

    Args:
        hits_in: positive tests in the world with the neighbour present (D), in [0, trials].
        hits_out: positive tests in the world without it (D'), in [0, trials].
        trials: draws per world, >= 1.
        delta: the delta of the (epsilon, delta) claim, in (0, 1).
        confidence: the confidence of the bound, in (0, 1).

    Returns:
        The lower bound on epsilon (>= 0) holding with probability >= `confidence`.

    Raises:
        ValueError: if an argument is outside the ranges above.
    """
    trials = require_int_at_least("trials", trials, 1)
    for name, hits in (("hits_in", hits_in), ("hits_out", hits_out)):
        require(require_int_at_least(name, hits, 0) <= trials, f"{name} must be <= trials ({trials}), got {hits}")
    require_in_open("delta", delta, 0.0, 1.0)
    require_in_open("confidence", confidence, 0.0, 1.0)
    # a two-sided interval at `confidence` leaves (1 - confidence) / 2 in each tail; we use one tail of each
    tpr_lows, _ = clopper_pearson(np.array([hits_in]), trials, confidence)
    _, fpr_highs = clopper_pearson(np.array([hits_out]), trials, confidence)
    tpr_low, fpr_high = float(tpr_lows[0]), float(fpr_highs[0])
    candidates = [0.0]
    if tpr_low - delta > 0 and fpr_high > 0:
        candidates.append(math.log((tpr_low - delta) / fpr_high))
    if 1 - fpr_high - delta > 0 and 1 - tpr_low > 0:
        candidates.append(math.log((1 - fpr_high - delta) / (1 - tpr_low)))
    return max(candidates)


def distinguishing_game(sample_in: Callable[[int, np.random.Generator], np.ndarray],
                        sample_out: Callable[[int, np.random.Generator], np.ndarray],
                        test: Callable[[np.ndarray], np.ndarray], trials: int, delta: float,
                        confidence: float = 0.95, seed: int = 0) -> GameResult:
    """Run `trials` draws in each world and bound epsilon from the test's hit counts.

    Args:
        sample_in: draws `trials` outputs of the world with the neighbour (D) from a generator.
        sample_out: draws `trials` outputs of the world without it (D').
        test: maps outputs to a boolean array, True where the test is positive.
        trials: draws per world, >= 1.
        delta: the delta of the (epsilon, delta) claim, in (0, 1).
        confidence: the confidence of the bound, in (0, 1).
        seed: seeds the generator both worlds draw from (D first).

    Returns:
        The GameResult with both hit counts and epsilon_lower_bound's bound.

    Raises:
        ValueError: if trials, delta or confidence is out of range (epsilon_lower_bound).
    """
    rng = np.random.default_rng(seed)
    hits_in = int(np.sum(test(sample_in(trials, rng))))
    hits_out = int(np.sum(test(sample_out(trials, rng))))
    return GameResult(trials, hits_in, hits_out, delta, confidence,
                      epsilon_lower_bound(hits_in, hits_out, trials, delta, confidence))


def one_query_claim(outcome) -> np.ndarray:
    """The curve one query is charged when the mechanism answers (the worst case over the screening
    decision): the decoding component as if the screen passed, plus every other charge.

    Args:
        outcome: a BlockOutcome of the mechanism on the query (its first row is read for the
            data-dependent and Theorem 3.1 components, the largest row for the others).

    Returns:
        The per-order RDP curve (K,) of one answered query.
    """
    total = np.zeros(next(iter(outcome.charged.values())).shape[-1])
    for name, values in outcome.charged.items():
        if name == "pmixed_data_dependent":
            total = total + outcome.observed_data_dependent[0]
        elif name == "pmixed_theorem_3_1":
            total = total + outcome.data_independent[0]
        else:
            total = total + values.max(axis=0)
    return total


def canary_query(tokenizer, ensemble, canary: dict) -> tuple[list[int], int]:
    """The most revealing query inside the canary's secret: the context (token ids) and the true next
    token at the position where the canary's teacher favours it most over the public model and the
    other teachers (the auditor, as adversary, may choose any query; the claim covers every one).

    Args:
        tokenizer: the run's tokenizer (a transformers tokenizer: called on text, returns input_ids).
        ensemble: the run's ensemble (Ensemble or InContextEnsemble: n_positions and distributions).
        canary: the manifest's canary entry: {"teacher", "text", "secret"}.

    Returns:
        (the context's token ids, the true next token's id).

    Raises:
        ValueError: if the prefix does not tokenise as a prefix of the text, or the teacher-vs-baseline
            log ratio is NaN at some position.
    """
    text, secret = canary["text"], canary["secret"]
    cut = text.index(secret)
    prefix = tokenizer(text[:cut].rstrip(" "), add_special_tokens=False)["input_ids"]
    full = tokenizer(text[:cut + len(secret)], add_special_tokens=False)["input_ids"]
    require(full[:len(prefix)] == prefix, "the canary's prefix does not tokenise as a prefix")
    window = full[-ensemble.n_positions:]
    offset = len(full) - len(window)
    public, teachers = ensemble.distributions(torch.tensor([window[:-1]]))       # (1, L, V), (1, L, N, V)
    positions = torch.arange(max(len(prefix), offset + 1) - offset - 1, len(window) - 1)
    targets = torch.tensor(window)[positions + 1]
    owner = teachers[0, positions, canary["teacher"], targets]
    others = torch.cat([teachers[0, positions, :canary["teacher"]], teachers[0, positions, canary["teacher"] + 1:]],
                       dim=1)[torch.arange(len(positions)), :, targets].mean(dim=1)
    baseline = torch.maximum(public[0, positions, targets], others)
    score = torch.log(owner) - torch.log(baseline)
    # argmax would pick a NaN (torch ranks it above every number)
    require(not score.isnan().any(), f"canary query: the teacher-vs-baseline log ratio is NaN at context positions "
            f"{(positions[score.isnan()] + offset).tolist()} (a NaN, or a zero probability on both sides)")
    best = int(torch.argmax(score))
    position = int(positions[best])
    return window[:position + 1], int(targets[best])


def check_canary_game(trace: LoadedTrace, trials: int = 2000, confidence: float = 0.95, seed: int = 0,
                      chunk: int = 250) -> tuple[CheckResult, GameResult | None]:
    """The planted canary's teacher present vs removed, on the canary's own prefix: does the
    mechanism emit the secret's first token more often with the teacher than without it?

    Args:
        trace: the loaded run; the run's models are loaded (they must be at the recorded paths).
        trials: draws per world.
        confidence: the confidence of the lower bound.
        seed: seeds the game's draws.
        chunk: draws per call of the mechanism (memory: chunk x V per world).

    Returns:
        (the "canary_game" CheckResult, the GameResult or None where it was not played): SKIPPED for
        the public model, without a planted canary or without the in-context teachers; FAIL when the
        lower bound exceeds the smaller of the claimed one-query and run epsilons (+1e-12); else
        PASS.

    Raises:
        ValueError: if the models at the recorded paths are not the run's, or the claimed epsilon is NaN.
    """
    from transformers import AutoTokenizer

    canaries = trace.manifest.get("canaries") or []
    if trace.mechanism_type == "public":
        return skipped("canary_game", "the public model alone does not read the teachers"), None
    if not canaries:
        return skipped("canary_game", "the trace names no planted canary (only the embedded default plants them)"), None
    models = trace.manifest["models"]
    if trace.manifest["config"]["models"]["teacher_kind"] == "icl":  # the loader rebuilds in-context teachers
        if not trace.models_available:
            return skipped("canary_game", "the in-context teachers cannot be rebuilt: "
                           + trace.model_unavailability()), None
        ensemble = trace._ensemble
        if ensemble is None:
            raise RuntimeError("models_available: the loader kept the in-context ensemble")
    else:
        ensemble = Ensemble.from_pretrained(models[0]["source"], [m["source"] for m in models[1:]],
                                            trace.manifest["config"]["models"]["teacher_kind"])
    changes = [change for identity, found in zip(models, ensemble.identities)
               for change in identity_problems(identity, found)]
    if changes:
        raise ValueError(f"the run's models changed since the run: {changes[0]}")
    canary = canaries[0]
    tokenizer = AutoTokenizer.from_pretrained(trace.manifest["tokenizer"])
    context, target = canary_query(tokenizer, ensemble, canary)
    logits = ensemble.logits(torch.tensor([context]))[:, 0, -1:]                # (N+1, 1, V)
    delta = trace.manifest["config"]["deltas"][0]
    run_claim = next(e["epsilon"] for e in trace.ledger["epsilon"] if e["method"] == "improved" and e["delta"] == delta)
    # min(one_query, NaN) below would silently ignore a NaN claim
    require(not math.isnan(run_claim), f"canary game: the claimed epsilon in ledger.json at delta={delta:g} is NaN")
    keep = [i for i in range(trace.n_teachers) if i != canary["teacher"]]
    runner_in = trace.runner()
    runner_out = build_runner({"type": trace.mechanism_type,
                               **{**trace.params, **({"teachers": len(keep)} if "teachers" in trace.params else {})}},
                              len(keep), trace.manifest["relation"], trace.manifest.get("records_version", 1))
    logits_out = torch.cat([logits[:1], logits[1:][keep]])
    claimed_one = {}

    def sampler(runner, world_logits):
        def sample(n, rng):
            generator = torch.Generator().manual_seed(int(rng.integers(2 ** 62)))
            tokens, start = [], 0
            while start < n:
                # The output does not depend on the order grid; only the first draw of the world with
                # the canary needs the full grid, for the one-query claim: one row, so that the
                # per-order kernels hold one step's (orders x V) arrays, not a chunk's.
                first = runner is runner_in and "curve" not in claimed_one
                rows = 1 if first else min(chunk, n - start)
                start += rows
                public, teachers = Ensemble.split_distributions(world_logits.expand(-1, rows, -1))
                orders = trace.orders if first else trace.orders[:1]
                outcome = runner.process(public, teachers, generator, orders)
                tokens.append(torch.multinomial(outcome.output, 1, generator=generator)[:, 0].numpy())
                if first:
                    claimed_one["curve"] = one_query_claim(outcome)
            return np.concatenate(tokens)
        return sample

    result = distinguishing_game(sampler(runner_in, logits), sampler(runner_out, logits_out),
                                 lambda tokens: tokens == target, trials, delta, confidence, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one_query = epsilon_from_rdp(RdpCurve(trace.manifest["orders"], claimed_one["curve"],
                                              NeighbouringRelation(trace.manifest["relation"]),
                                              any(trace.components.values())), delta).epsilon
    ok = result.epsilon_lower_bound <= min(one_query, run_claim) + 1e-12
    evidence = {**result.to_dict(), "canary_teacher": canary["teacher"], "target_token": int(target),
                "claimed_one_query_epsilon": one_query, "claimed_run_epsilon": run_claim}
    return verdict("canary_game", ok,
                   f"lower bound {result.epsilon_lower_bound:.4g} (CP, {confidence:.0%}, {trials} trials per world; "
                   f"secret-token rate {result.hits_in / trials:.3f} with the canary teacher vs "
                   f"{result.hits_out / trials:.3f} without) <= claimed one-query epsilon {one_query:.4g}",
                   f"lower bound {result.epsilon_lower_bound:.4g} exceeds the claimed one-query epsilon {one_query:.4g}",
                   **evidence), result
