"""Hot vs cold PATE (Cohen et al. 2023, "Hot PATE"): coordinated against independent votes of N
in-context teachers, compared the way the field compares private aggregators.

Teachers answer teacher-forced queries on held-out text (dpledger.decoding.icl); their next-token
distributions, the public model's and the true next tokens are kept side by side
(`TeacherDistributions`). At each query both voting schemes draw `samples` rounds (hot: one shared
Exp(1) vector per round; cold: independent draws), and the four aggregators of the paper run on every
round's histogram:

- TARGMAX_T and TWS_{T,gamma}: T-threshold private only, no DP guarantee ("none: threshold privacy");
  compared at each threshold T of the grid and at a matched coverage;
- DPARGMAX (Confident-GNMax, Papernot et al. 2018, Algorithm 1) and DPWS (Gaussian counts, then TWS):
  for each target epsilon, the noise that meets it over `budget_queries` queries
  (dpledger.mechanisms.calibration) and, among the thresholds, the one with the best utility there
  (smallest total variation to the non-private ensemble); compared at matched epsilon and at a
  matched coverage (the smallest epsilon of the grid that reaches it).

Every scheme's output law at a query is the mean over rounds of its released law, failed rounds
answered by the public model's law; its utility is `dpledger.reports.law_utility.output_law_utility`
(one metric set for every mechanism compared on these teachers). Coverage is the mean teacher's mass
on the tokens an aggregator released, with at least one teacher's vote, in at least one round (the
transferred support: a token a DP aggregator's noise picked without a vote is not transferred); its
non-private ceiling is the same statistic for `samples` draws from the mean teacher. Retries resample
the shared randomness on a failed round up to r times: each attempt is another screened query, so
DPARGMAX is charged (r + 1) screens and one answer per query, DPWS (r + 1) noisy histograms.

The heterogeneity knob h mixes each teacher with a distinct distribution of its own (`mixed_teachers`):
p_i = (1 - h) p_i^icl + h p_i^own, p_i^own the public model's next-token distribution at the same index
of teacher i's own private examples (its own sub-population: on the embedded corpus each shard is one
set of customers). Every p_i still depends only on teacher i's examples and the public query, so the
disjoint-partition privacy analysis is unchanged; h = 0 is the plain in-context ensemble (nearly
identical teachers on the embedded default), h = 1 teachers that share nothing but the model.
"""
from __future__ import annotations

import base64
import io
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch
from scipy.stats import norm

from dpledger.accounting.conversion import epsilon_from_rdp
from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.errors import require, require_in_closed, require_in_open, require_int_at_least
from dpledger.accounting.orders import default_orders
from dpledger.accounting.relation import NeighbouringRelation, neighbouring_relation
from dpledger.accounting.safe_files import write_atomic
from dpledger.accounting.strict_json import strict_json_text
from dpledger.decoding.config import read_text_file
from dpledger.decoding.recipe import encode_documents, set_single_thread
from dpledger.mechanisms.calibration import calibrate_confident_gnmax, calibrate_dpws
from dpledger.mechanisms.diversity import (DiversityCurve, diversity_preservation, largest_preserved_beta,
                                           mean_diversity_curve, mean_teacher, query_seed, validated_teachers,
                                           vote_draws, vote_statistics)
from dpledger.mechanisms.hot_pate import DPWeightedSampler
from dpledger.mechanisms.pate import ConfidentGNMax
from dpledger.reports.hotpate_baselines import baseline_rows
from dpledger.reports.html_text import escaped
from dpledger.reports.law_utility import finite_utility, output_law_utility
from dpledger.reports.text_diversity import distinct_n, self_bleu

FRACTIONS = tuple(round(f, 4) for f in np.arange(0.05, 1.0001, 0.05))
"""The default threshold grid, as fractions T/N."""
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
"""The default target epsilons of DPARGMAX and DPWS, over budget_queries queries at delta."""
MAX_TEACHERS = 512
SCHEMES = ("hot", "cold")
THRESHOLD_PRIVATE = ("TARGMAX", "TWS")
DIFFERENTIALLY_PRIVATE = ("DPARGMAX", "DPWS")
NO_DP = "none: threshold privacy"
DEFAULT_RELATION = NeighbouringRelation.ADD_OR_REMOVE_ONE
"""The relation the DP aggregators' epsilons hold for unless asked otherwise: a voting run's default, and the
one the baselines (DP-ICL, PMixED) are accounted for."""
RELATIONS = (NeighbouringRelation.ADD_OR_REMOVE_ONE, NeighbouringRelation.REPLACE_ONE)
"""The relations `dpledger hotpate` accounts for (the matched comparisons need one epsilon per setting)."""
TEXT_SEQUENCES = 40
"""At most this many rounds' released sequences enter distinct-n and self-BLEU (self-BLEU is quadratic)."""
Q_GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
"""The q values of the (tau, beta, gamma) check: a token is constrained when at least tau teachers give it
probability >= q, q from this grid (with q over every teacher probability each token of a softmax would be
constrained, and the output law, a mean over the drawn rounds, cannot resolve masses much below 1 / samples)."""
SELECTION = "tv_to_reference"
"""The utility that picks the threshold at each epsilon (smaller is better)."""


class TeacherDistributions(NamedTuple):
    """What every compared mechanism sees: teachers (Q, N, V), public (Q, V) and the true next tokens
    targets (Q,), int64."""

    teachers: np.ndarray
    public: np.ndarray
    targets: np.ndarray


# ----------------------------------------------------------------------------------------------
# teacher distributions


def tempered_distributions(logits: torch.Tensor | np.ndarray, temperature: float = 1.0,
                           top_p: float = 1.0) -> np.ndarray:
    """softmax(logits / temperature) restricted to the top-p nucleus (Holtzman et al. 2020, "The Curious
    Case of Neural Text Degeneration", Section 3.1: the smallest set of most likely tokens whose mass is
    at least top_p, renormalised), in float64 over the last axis.

    Args:
        logits: (..., V) logits, finite.
        temperature: the softmax temperature, > 0.
        top_p: the nucleus mass, in (0, 1]; 1 keeps every token.

    Returns:
        float64 (..., V) distributions, each row summing to 1.

    Raises:
        ValueError: if temperature is not > 0 and finite, top_p is outside (0, 1], or a logit is not finite.
    """
    temperature = require_in_open("temperature", temperature, 0.0, math.inf)
    top_p = require_in_closed("top_p", top_p, 0.0, 1.0)
    require(top_p > 0.0, f"top_p must be in (0, 1], got {top_p:g}")
    values = torch.as_tensor(logits).double()
    require(bool(torch.isfinite(values).all()), "logits must be finite (a NaN or inf logit has no distribution)")
    probs = torch.softmax(values / temperature, dim=-1)
    if top_p < 1.0:
        ordered, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(ordered, dim=-1) - ordered  # the mass strictly ahead of each token
        keep = torch.zeros_like(probs).scatter(-1, order, (before < top_p).double())
        probs = probs * keep
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs.numpy()


def _windows(token_ids: np.ndarray, queries: int, window: int, context: int) -> list[tuple[int, np.ndarray]]:
    """(start, ids) windows of `window` tokens covering `queries` query positions, each with `context`
    tokens before it and its true next token inside the text."""
    require(window > context, f"the model's context ({window} tokens) is too short for queries after {context}")
    windows, start, covered = [], 0, 0
    while covered < queries:
        require(start + window + 1 <= token_ids.size, f"the text has too few tokens for {queries} queries")
        windows.append((start, np.asarray(token_ids[start:start + window + 1], dtype=np.int64)))
        covered += window - context
        start += window
    return windows


def teacher_distributions(ensemble, token_ids: np.ndarray, queries: int, context: int = 16, temperature: float = 1.0,
                          top_p: float = 1.0) -> TeacherDistributions:
    """The teachers', the public model's and the true next tokens at `queries` consecutive positions of
    `token_ids`, each with at least `context` tokens before it, tempered (`tempered_distributions`).

    Args:
        ensemble: an in-context ensemble (dpledger.decoding.icl.InContextEnsemble): `n_positions` and
            `logits(ids)` giving (N+1, 1, L, V) logits, the public model first.
        token_ids: the token ids of the held-out text, 1-D.
        queries: the number of query positions (>= 1).
        context: the fewest tokens before a query position in its window.
        temperature: the softmax temperature applied to teacher and public logits, > 0.
        top_p: the nucleus mass applied to teacher and public distributions, in (0, 1].

    Returns:
        TeacherDistributions: teachers (queries, N, V), public (queries, V), targets (queries,).

    Raises:
        ValueError: if the ensemble's context is not longer than `context`, the text has too few tokens
            for `queries` positions, or temperature or top_p is out of range.
    """
    queries = require_int_at_least("queries", queries, 1)
    window = min(ensemble.n_positions, 64)
    teachers, public, targets = [], [], []
    for _, ids in _windows(np.asarray(token_ids), queries, window, context):
        logits = ensemble.logits(torch.from_numpy(ids[:window]).unsqueeze(0))[:, 0, context:]  # (N+1, L', V)
        probs = tempered_distributions(logits, temperature, top_p)
        public.append(probs[0])
        teachers.append(np.moveaxis(probs[1:], 0, 1))
        targets.append(ids[context + 1:window + 1])
    return TeacherDistributions(np.concatenate(teachers)[:queries], np.concatenate(public)[:queries],
                                np.concatenate(targets)[:queries].astype(np.int64))


def own_distributions(ensemble, own_streams: Sequence[np.ndarray], queries: int, context: int = 16,
                      temperature: float = 1.0, top_p: float = 1.0) -> np.ndarray:
    """(queries, N, V): teacher i's own distribution at query q, the public model's next-token
    distribution at position context + q of teacher i's own private text (its stream, repeated when
    short), tempered like the teachers.

    Args:
        ensemble: the in-context ensemble (its `public_logits` and `context`).
        own_streams: N 1-D token-id arrays, teacher i's own private examples.
        queries: the number of query positions (>= 1).
        context: the tokens before the first query position.
        temperature: the softmax temperature, > 0.
        top_p: the nucleus mass, in (0, 1].

    Returns:
        float64 (queries, N, V) distributions.

    Raises:
        ValueError: if a stream is empty or an argument is out of range.
    """
    queries = require_int_at_least("queries", queries, 1)
    require(all(np.asarray(s).size >= 1 for s in own_streams), "every teacher needs a non-empty own text")
    window = min(ensemble.context, 64)
    length = context + queries + window  # enough for the windows below
    streams = np.stack([np.resize(np.asarray(s, dtype=np.int64), length) for s in own_streams])
    rows = []
    for start, _ in _windows(streams[0], queries, window, context):
        logits = ensemble.public_logits(torch.from_numpy(streams[:, start:start + window]))[:, context:]  # (N, L', V)
        rows.append(np.moveaxis(tempered_distributions(logits, temperature, top_p), 0, 1))
    return np.concatenate(rows)[:queries]


def mixed_teachers(shared: np.ndarray, own: np.ndarray, heterogeneity: float) -> np.ndarray:
    """p_i = (1 - h) shared_i + h own_i: the heterogeneity knob (module docstring).

    Args:
        shared: (Q, N, V) the in-context teachers' distributions.
        own: (Q, N, V) each teacher's own distinct distributions.
        heterogeneity: h in [0, 1].

    Returns:
        float64 (Q, N, V) distributions (shared itself at h = 0, own at h = 1).

    Raises:
        ValueError: if h is outside [0, 1] or the shapes differ.
    """
    h = require_in_closed("heterogeneity", heterogeneity, 0.0, 1.0)
    require(shared.shape == own.shape, f"shared and own must have one shape, got {shared.shape} and {own.shape}")
    if h == 0.0:
        return np.asarray(shared, dtype=np.float64)
    if h == 1.0:
        return np.asarray(own, dtype=np.float64)
    return (1.0 - h) * np.asarray(shared, dtype=np.float64) + h * np.asarray(own, dtype=np.float64)


# ----------------------------------------------------------------------------------------------
# accounting of the DP aggregators, with retries


def dpargmax_epsilon(sigma_threshold: float, sigma: float, budget_queries: int, retries: int, delta: float,
                     relation: NeighbouringRelation | str = DEFAULT_RELATION) -> tuple[float, float | None]:
    """DPARGMAX's (epsilon, order) over `budget_queries` queries, each with up to `retries` retries:
    (retries + 1) screens a / (2 s1^2) and one GNMax answer per query at the histogram's L2 sensitivity
    under `relation`, a / (2 s2^2) adding or removing one teacher, a / s2^2 replacing one (Papernot et al.
    2018, Algorithm 1 and Proposition 8; Mironov 2017, Corollary 3), composed (Mironov 2017,
    Proposition 1) and converted at delta (Balle et al. 2020, Theorem 21). Charging the answer on every
    query, released or not, bounds the released (decisions, token) whichever branch is taken.

    Args:
        sigma_threshold: the screen's noise s1, > 0.
        sigma: the answer's noise s2, > 0.
        budget_queries: the queries charged (>= 1).
        retries: the retries per query (>= 0).
        delta: the delta of the conversion, in (0, 1).
        relation: the neighbouring relation the epsilon holds for (a NeighbouringRelation or its value).

    Returns:
        (epsilon, the order it was reached at).

    Raises:
        ValueError: if an argument is out of range.
    """
    budget_queries = require_int_at_least("budget_queries", budget_queries, 1)
    retries = require_int_at_least("retries", retries, 0)
    mechanism = ConfidentGNMax(0.0, sigma_threshold, sigma, neighbouring_relation(relation))
    orders = default_orders()
    grid = np.asarray(orders, dtype=np.float64)
    screen = RdpCurve(tuple(orders), mechanism.screen_rdp(grid), mechanism.relation)
    answer = RdpCurve(tuple(orders), mechanism.answer_rdp(grid), mechanism.relation)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conversion = epsilon_from_rdp(screen.composed(budget_queries * (retries + 1)) + answer.composed(budget_queries),
                                      delta)
    return float(conversion.epsilon), conversion.order


def dpws_epsilon(sigma: float, budget_queries: int, retries: int, delta: float, voters: int,
                 relation: NeighbouringRelation | str = DEFAULT_RELATION) -> tuple[float, float | None]:
    """DPWS's (epsilon, order): (retries + 1) Gaussian noisy histograms per query, a / (2 sigma^2) adding or
    removing one teacher, a / sigma^2 replacing one (the histogram's L2 sensitivity 1 or sqrt(2); Mironov 2017,
    Corollary 3; TWS on them with the public N as n is post-processing), composed over
    `budget_queries` queries and converted at delta (Balle et al. 2020, Theorem 21).

    Args:
        sigma: the count noise, > 0.
        budget_queries: the queries charged (>= 1).
        retries: the retries per query (>= 0).
        delta: the delta of the conversion, in (0, 1).
        voters: the public number of teachers N, TWS's normaliser n (public under every relation).
        relation: the neighbouring relation the epsilon holds for (a NeighbouringRelation or its value).

    Returns:
        (epsilon, the order it was reached at).

    Raises:
        ValueError: if an argument is out of range.
    """
    budget_queries = require_int_at_least("budget_queries", budget_queries, 1)
    retries = require_int_at_least("retries", retries, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conversion = epsilon_from_rdp(DPWeightedSampler(sigma, 1.0, 1.0, neighbouring_relation(relation), voters)
                                      .rdp_curve(default_orders())
                                      .composed(budget_queries * (retries + 1)), delta)
    return float(conversion.epsilon), conversion.order


def calibrated_noise(epsilons: Sequence[float], delta: float, budget_queries: int, retries: int, voters: int,
                     relation: NeighbouringRelation | str = DEFAULT_RELATION) -> dict[str, list[dict[str, Any]]]:
    """For each target epsilon, the smallest noise that meets it (dpledger.mechanisms.calibration):
    DPARGMAX with s1 = s2 per attempt ((r + 1) screens at s1 are one screen at s1 / sqrt(r + 1), so
    Confident-GNMax is calibrated with ratio 1 / sqrt(r + 1)), DPWS over budget_queries * (r + 1)
    noisy histograms; each with the epsilon its own accounting states (<= the target).

    Args:
        epsilons: the target epsilons, each > 0.
        delta: the delta, in (0, 1).
        budget_queries: the queries charged (>= 1).
        retries: the retries per query (>= 0).
        voters: the public number of teachers N (DPWS's normaliser).
        relation: the neighbouring relation every epsilon holds for.

    Returns:
        "DPARGMAX" and "DPWS" -> one dict per epsilon: target_epsilon, sigma, sigma_threshold (DPARGMAX),
        epsilon (the stated one) and order.

    Raises:
        ValueError: if an argument is out of range or a target cannot be met.
    """
    retries = require_int_at_least("retries", retries, 0)
    relation = neighbouring_relation(relation)
    out: dict[str, list[dict[str, Any]]] = {"DPARGMAX": [], "DPWS": []}
    for target in epsilons:
        s2 = calibrate_confident_gnmax(target, delta, budget_queries, ratio=1.0 / math.sqrt(retries + 1),
                                       relation=relation).value
        epsilon, order = dpargmax_epsilon(s2, s2, budget_queries, retries, delta, relation)
        out["DPARGMAX"].append({"target_epsilon": float(target), "sigma": s2, "sigma_threshold": s2,
                                "epsilon": epsilon, "order": order})
        sigma = calibrate_dpws(target, delta, budget_queries * (retries + 1), voters=voters, relation=relation).value
        epsilon, order = dpws_epsilon(sigma, budget_queries, retries, delta, voters, relation)
        out["DPWS"].append({"target_epsilon": float(target), "sigma": sigma, "sigma_threshold": None,
                            "epsilon": epsilon, "order": order})
    return out


# ----------------------------------------------------------------------------------------------
# the aggregators on the drawn rounds


def _first_release(attempts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rounds, A, V) per-attempt release laws -> the round's law (rounds, V) of the first attempt that
    releases, and the probability (rounds,) that every attempt fails."""
    law = np.zeros((attempts.shape[0], attempts.shape[2]))
    going = np.ones(attempts.shape[0])
    for attempt in range(attempts.shape[1]):
        law += going[:, None] * attempts[:, attempt]
        going = going * np.clip(1.0 - attempts[:, attempt].sum(axis=1), 0.0, 1.0)
    return law, going


def _point_masses(tokens: np.ndarray, weights: np.ndarray, vocabulary: int) -> np.ndarray:
    """(rounds, A) tokens released with probability (rounds, A) -> (rounds, A, V) laws."""
    laws = np.zeros((*tokens.shape, vocabulary))
    np.put_along_axis(laws, tokens[..., None], weights[..., None], axis=-1)
    return laws


def _tws_laws(counts: np.ndarray, threshold: float, gamma: float, voters: float) -> np.ndarray:
    """ThresholdWeightedSampler's (and DPWS's, on noisy counts with the public n) probabilities, batched:
    c_j / max(n / gamma, S) on the tokens with c_j >= T (Cohen et al. 2023, TWS)."""
    passing = np.where(counts >= threshold, counts, 0.0)
    normaliser = np.maximum(voters / gamma, passing.sum(axis=-1, keepdims=True))
    return np.divide(passing, normaliser, out=np.zeros_like(passing), where=normaliser > 0)


@dataclass
class _Config:
    """One aggregator setting on one scheme, and its per-query results."""

    scheme: str
    mechanism: str
    threshold: int
    noise: dict  # the DP aggregators' calibrated noise; empty for the threshold-private ones
    laws: list = field(default_factory=list)
    yields: list = field(default_factory=list)
    coverage: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    betas: list = field(default_factory=list)


def _sample_tokens(law: np.ndarray, fail: np.ndarray, public: np.ndarray, uniforms: np.ndarray) -> tuple[np.ndarray,
                                                                                                      np.ndarray]:
    """One outcome per round: a released token from `law`, or a fail answered by a draw from `public`.
    Returns (tokens (rounds,), released (rounds,) bool)."""
    cumulative = np.cumsum(law, axis=1)
    index = (cumulative < uniforms[:, :1]).sum(axis=1)
    released = index < law.shape[1]
    fallback = np.minimum(np.searchsorted(np.cumsum(public), uniforms[:, 1], side="right"), public.size - 1)
    return np.where(released, np.minimum(index, law.shape[1] - 1), fallback), released


def pooled_utility(per_query: Sequence[dict[str, float | None]]) -> dict[str, float | None]:
    """output_law_utility of Q queries from its Q one-query results: every metric is a mean over queries,
    so the pooled value is the mean of the one-query values (+inf cross-entropy when any is +inf).

    Args:
        per_query: output_law_utility's result for each query alone (at least one).

    Returns:
        The metrics output_law_utility returns for all the queries at once.

    Raises:
        ValueError: if `per_query` is empty.
    """
    require(len(per_query) >= 1, "pooled_utility needs at least one query")
    pooled: dict[str, float | None] = {}
    for key in per_query[0]:
        values = [entry[key] for entry in per_query]
        pooled[key] = None if any(v is None for v in values) else float(np.mean(np.asarray(values, dtype=np.float64)))
    return pooled


def _simulate(data: TeacherDistributions, thresholds: tuple[int, ...], gamma: float, noise: dict, samples: int,
              retries: int, seed: int, schemes: tuple[str, ...] = SCHEMES,
              threshold_private: bool = True) -> list[_Config]:
    """Every aggregator setting (the threshold-private ones when asked, the DP ones at each entry of
    `noise`) on `schemes`, query by query (module docstring). A query's votes and noise depend only on
    (seed, query, scheme), so a setting gives the same numbers whatever else is simulated with it."""
    teachers_all, public_all, targets = data
    queries, n, vocabulary = teachers_all.shape
    attempts = retries + 1
    configs: list[_Config] = []
    for scheme in schemes:
        for threshold in thresholds:
            if threshold_private:
                configs += [_Config(scheme, "TARGMAX", threshold, {}), _Config(scheme, "TWS", threshold, {})]
            configs += [_Config(scheme, name, threshold, entry) for name in DIFFERENTIALLY_PRIVATE
                        for entry in noise.get(name, [])]
    by_scheme = {scheme: [c for c in configs if c.scheme == scheme] for scheme in schemes}
    for q in range(queries):
        teachers, public, pbar = teachers_all[q], public_all[q], mean_teacher(teachers_all[q])
        for scheme_index, scheme in enumerate(SCHEMES):
            if scheme not in schemes:
                continue
            votes = vote_draws(teachers, scheme == "hot", samples * attempts, query_seed(seed, q))
            flat = np.zeros((samples * attempts, vocabulary), dtype=np.int64)
            np.add.at(flat, (np.arange(votes.shape[0])[:, None], votes), 1)
            counts = flat.reshape(samples, attempts, vocabulary).astype(np.float64)
            rng = np.random.default_rng([seed, q, scheme_index])
            answer_noise = rng.standard_normal(counts.shape)  # shared by every epsilon: paired comparisons
            count_noise = rng.standard_normal(counts.shape)
            uniforms = rng.random((samples, 2))
            top, plurality = counts.max(axis=-1), counts.argmax(axis=-1)
            answers = {id(entry): np.argmax(counts + entry["sigma"] * answer_noise, axis=-1)
                       for entry in noise.get("DPARGMAX", [])}
            noisy = {id(entry): np.maximum(counts + entry["sigma"] * count_noise, 0.0)
                     for entry in noise.get("DPWS", [])}
            for config in by_scheme[scheme]:
                t = config.threshold
                if config.mechanism == "TARGMAX":
                    per_attempt = _point_masses(plurality, (top >= t).astype(np.float64), vocabulary)
                elif config.mechanism == "TWS":
                    per_attempt = _tws_laws(counts, t, gamma, float(n))
                elif config.mechanism == "DPARGMAX":
                    screen = norm.cdf((top - t) / config.noise["sigma_threshold"])  # E over the screen's noise
                    per_attempt = _point_masses(answers[id(config.noise)], screen, vocabulary)
                else:
                    per_attempt = _tws_laws(noisy[id(config.noise)], t, gamma, float(n))
                law, fail = _first_release(per_attempt)
                output = law.mean(axis=0) + fail.mean() * public
                output = output / output.sum()  # removes float rounding only (the law sums to 1 exactly)
                config.laws.append(output_law_utility(output[None], pbar[None], targets[q:q + 1]))
                config.yields.append(1.0 - float(fail.mean()))
                tokens, released = _sample_tokens(law, fail, public, uniforms)
                # transferred: released, and voted for by some teacher in that round (not a token the noise made up)
                voted = counts[np.arange(samples), :, tokens].max(axis=1) > 0
                config.coverage.append(float(pbar[np.unique(tokens[released & voted])].sum()))
                config.tokens.append(tokens)
                if config.mechanism == "TWS":
                    config.betas.append(largest_preserved_beta(np.minimum(law.mean(axis=0), 1.0), teachers, t, Q_GRID))
    return configs


def _ceiling(data: TeacherDistributions, samples: int, seed: int) -> dict[str, Any]:
    """The non-private ensemble at the same number of rounds: `samples` draws from the mean teacher per query."""
    coverage, tokens, utility = [], [], []
    for q, teachers in enumerate(data.teachers):
        pbar = mean_teacher(teachers)
        rng = np.random.default_rng([seed, q, 7])
        draws = np.minimum(np.searchsorted(np.cumsum(pbar), rng.random(samples), side="right"), pbar.size - 1)
        coverage.append(float(pbar[np.unique(draws)].sum()))
        tokens.append(draws)
        # the empirical law of the draws: how far a law estimated from `samples` rounds sits from its own reference
        empirical = np.bincount(draws, minlength=pbar.size) / samples
        utility.append(output_law_utility(empirical[None], pbar[None], data.targets[q:q + 1]))
    return {"coverage": float(np.mean(coverage)), "yield": 1.0, **finite_utility(pooled_utility(utility)),
            **_text_diversity(np.stack(tokens))}


def _text_diversity(tokens: np.ndarray) -> dict[str, float | None]:
    """distinct-1, distinct-2 and self-BLEU of the rounds' teacher-forced sequences: round s's sequence is
    its outcome at each query in order (tokens: (Q, rounds))."""
    sequences = [list(map(int, row)) for row in tokens.T[:TEXT_SEQUENCES]]
    return {"distinct_1": distinct_n(sequences, 1), "distinct_2": distinct_n(sequences, 2),
            "self_bleu": self_bleu(sequences) if len(sequences) >= 2 else None}


def _row(config: _Config, data: TeacherDistributions, delta: float, budget_queries: int, gamma: float,
         retries: int, relation: NeighbouringRelation) -> dict[str, Any]:
    dp = config.mechanism in DIFFERENTIALLY_PRIVATE
    teachers = data.teachers.shape[1]
    row: dict[str, Any] = {
        "mechanism": config.mechanism, "scheme": config.scheme,
        "epsilon": config.noise["epsilon"] if dp else None, "epsilon_label": None if dp else NO_DP,
        "delta": delta if dp else None, "budget_queries": budget_queries, "relation": relation.value if dp else None,
        "target_epsilon": config.noise["target_epsilon"] if dp else None,
        "threshold": config.threshold, "threshold_fraction": config.threshold / teachers,
        "sigma": config.noise["sigma"] if dp else None,
        "sigma_threshold": config.noise["sigma_threshold"] if dp else None,
        "gamma": gamma if config.mechanism in ("TWS", "DPWS") else None, "retries": retries,
        **finite_utility(pooled_utility(config.laws)),
        "yield": float(np.mean(config.yields)), "coverage": float(np.mean(config.coverage))}
    if config.mechanism == "TWS":
        betas = [b for b in config.betas if b is not None]
        row["preserved_beta_mean"] = float(np.mean(betas)) if betas else None
        row["preserved_beta_min"] = float(np.min(betas)) if betas else None
    return row


def _best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The row of smallest SELECTION (ties: the larger threshold)."""
    return min(rows, key=lambda r: (r[SELECTION], -r["threshold"]))


# ----------------------------------------------------------------------------------------------
# the experiment


@dataclass(frozen=True)
class HotPateResult:
    """Everything `hot_vs_cold` measured (see its to_dict for the JSON layout)."""

    teachers: int
    queries: int
    samples: int
    seed: int
    thresholds: tuple
    hot: DiversityCurve
    cold: DiversityCurve
    budget_queries: int
    delta: float
    gamma: float
    retries: int
    ceiling: dict
    target_coverage: float
    grid: list
    frontier: list
    matched_coverage: dict
    matched_epsilon: dict
    vote_statistics: dict
    diversity_preservation: dict
    seconds: float
    source: dict = field(default_factory=dict)
    relation: NeighbouringRelation = DEFAULT_RELATION
    baselines: list = field(default_factory=list)

    @property
    def hot_coverage_higher_from_quarter(self) -> bool:
        """Hot coverage > cold coverage at every T >= N/4 (the paper's claim on this ensemble)."""
        return all(h > c for t, h, c in zip(self.thresholds, self.hot.coverage, self.cold.coverage)
                   if t >= self.teachers / 4)

    def to_dict(self) -> dict:
        """The result as the JSON object hotpate.json holds ("format": "dpledger-hotpate", version 2).

        Returns:
            A dict of JSON values: the parameters, the thresholds, both vote-level diversity curves, the
            non-private ceiling, the full grid and the frontier rows, the matched-coverage and
            matched-epsilon comparisons, the public implementation's vote statistics, the diversity
            preservation check, the run time and the source.
        """
        return {"format": "dpledger-hotpate", "version": 2, "teachers": self.teachers, "queries": self.queries,
                "samples": self.samples, "seed": self.seed, "thresholds": list(self.thresholds),
                "threshold_fractions": [t / self.teachers for t in self.thresholds],
                "budget_queries": self.budget_queries, "delta": self.delta, "gamma": self.gamma,
                "retries": self.retries, "relation": self.relation.value,
                "selection": f"the threshold of smallest {SELECTION} at each epsilon",
                "hot": self.hot.to_dict(), "cold": self.cold.to_dict(),
                "hot_coverage_higher_at_every_T_from_N_over_4": self.hot_coverage_higher_from_quarter,
                "non_private_ceiling": self.ceiling, "target_coverage": self.target_coverage,
                "matched_coverage": self.matched_coverage, "matched_epsilon": self.matched_epsilon,
                "vote_statistics": self.vote_statistics, "diversity_preservation": self.diversity_preservation,
                "frontier": self.frontier, "baselines": self.baselines, "grid": self.grid, "seconds": round(self.seconds, 1),
                "source": self.source}


def _validated_data(data: TeacherDistributions) -> TeacherDistributions:
    teachers = validated_teachers(data.teachers, name="teachers", ndim=3)
    queries, n, vocabulary = teachers.shape
    require(2 <= n <= MAX_TEACHERS, f"the number of teachers must be in [2, {MAX_TEACHERS}], got {n}")
    public = validated_teachers(data.public, name="public", ndim=2)
    require(public.shape == (queries, vocabulary), f"public must have shape {(queries, vocabulary)}, got {public.shape}")
    targets = np.asarray(data.targets)
    require(targets.shape == (queries,) and np.issubdtype(targets.dtype, np.integer),
            f"targets must be {queries} integer token ids, got shape {targets.shape} of {targets.dtype}")
    return TeacherDistributions(teachers, public, targets.astype(np.int64))


def _thresholds(thresholds: Sequence[int] | None, teachers: int) -> tuple[int, ...]:
    if thresholds is None:
        return tuple(sorted({max(1, round(f * teachers)) for f in FRACTIONS}))
    grid = tuple(int(t) for t in thresholds)
    require(len(grid) >= 1 and all(float(t) == float(s) for t, s in zip(grid, thresholds)),
            f"thresholds must be integers, got {list(thresholds)}")
    bad = [t for t in grid if not 1 <= t <= teachers]
    require(not bad, f"every threshold must be in [1, N = {teachers}], got {bad[0] if bad else ''}")
    return tuple(sorted(set(grid)))


REFINE_STEPS = 6
"""Bisection steps in log epsilon between the grid's last miss and first hit of the matched coverage."""


def _reaching(rows: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The best-utility row among those reaching the target coverage, or None."""
    reached = [r for r in rows if r["coverage"] >= target]
    return _best(reached) if reached else None


def _refined(run: Any, mechanism: str, scheme: str, low: float, high: float, hit: dict[str, Any],
             target: float) -> tuple[dict[str, Any], float]:
    """Bisect the target epsilon in log space between `low` (misses the coverage) and `high` (reaches it,
    row `hit`); returns the cheapest reaching row found and the last missing target epsilon."""
    for _ in range(REFINE_STEPS):
        middle = math.sqrt(low * high)
        found = _reaching(run(mechanism, scheme, middle), target)
        if found is None:
            low = middle
        else:
            high, hit = middle, found
    return hit, low


def _matched_coverage(grid: list[dict[str, Any]], target: float, run: Any) -> dict[str, Any]:
    """Per aggregator and scheme: threshold-private ones at the largest T reaching the target coverage,
    DP ones at the smallest target epsilon at which some T reaches it (its best-utility T), refined by
    bisection between grid points; `run(mechanism, scheme, target_epsilon)` simulates one more epsilon."""
    out: dict[str, Any] = {"target_coverage": target}
    for mechanism in THRESHOLD_PRIVATE + DIFFERENTIALLY_PRIVATE:
        entry: dict[str, Any] = {}
        for scheme in SCHEMES:
            rows = [r for r in grid if r["mechanism"] == mechanism and r["scheme"] == scheme]
            if mechanism in THRESHOLD_PRIVATE:
                reached = [r for r in rows if r["coverage"] >= target]
                entry[scheme] = max(reached, key=lambda r: r["threshold"]) if reached else None
                continue
            targets = sorted({r["target_epsilon"] for r in rows})
            hits = [(e, _reaching([r for r in rows if r["target_epsilon"] == e], target)) for e in targets]
            reached_at = [(index, row) for index, (_, row) in enumerate(hits) if row is not None]
            first, hit = reached_at[0] if reached_at else (None, None)
            if first is None or hit is None:
                entry[scheme] = None
                entry[f"{scheme}_note"] = f"no T reaches it at target epsilon <= {targets[-1]:g}"
            elif first == 0:
                entry[scheme] = hit
                entry[f"{scheme}_note"] = f"reached at the grid's smallest target epsilon {targets[0]:g}: an upper bound"
            else:
                entry[scheme], missed = _refined(run, mechanism, scheme, targets[first - 1], targets[first], hit,
                                                 target)
                entry[f"{scheme}_note"] = (f"refined by {REFINE_STEPS} bisection steps: target epsilon "
                                           f"{missed:.4g} misses it")
        hot, cold = entry["hot"], entry["cold"]
        if mechanism in DIFFERENTIALLY_PRIVATE:
            largest = max(r["epsilon"] for r in grid if r["mechanism"] == mechanism)
            entry["epsilon_cold_over_hot"] = cold["epsilon"] / hot["epsilon"] if hot and cold else None
            entry["epsilon_cold_over_hot_at_least"] = (largest / hot["epsilon"] if hot and not cold else None)
        else:
            entry["threshold_hot_over_cold"] = (hot["threshold"] / cold["threshold"] if hot and cold else None)
            entry["epsilon_label"] = NO_DP
        out[mechanism] = entry
    return out


def hot_vs_cold(data: TeacherDistributions, samples: int = 200, seed: int = 0, budget_queries: int = 1000,
                delta: float = 1e-5, thresholds: Sequence[int] | None = None, gamma: float = 1.0,
                epsilons: Sequence[float] = EPSILONS, retries: int = 0, target_coverage: float | None = None,
                beta: float = 0.1, source: dict | None = None, started: float | None = None,
                relation: NeighbouringRelation | str = DEFAULT_RELATION, baselines: bool = False,
                baseline_samples: int | None = None) -> HotPateResult:
    """Both voting schemes and the four aggregators on the same teachers (module docstring).

    Args:
        data: the teachers (Q, N, V), public (Q, V) and true next tokens (Q,); 2 <= N <= MAX_TEACHERS.
        samples: voting rounds per query and scheme (>= 2).
        seed: the seed of the voting rounds and the aggregators' noise (>= 0).
        budget_queries: the queries every epsilon is charged for (>= 1).
        delta: the delta of every epsilon, in (0, 1).
        thresholds: the vote thresholds T (integers in [1, N]); None: T/N = 0.05, 0.10, ..., 1.
        gamma: TWS's and DPWS's gamma (>= 1).
        epsilons: the target epsilons of DPARGMAX and DPWS, each > 0.
        retries: resample the shared randomness on a failed round up to this many times (>= 0).
        target_coverage: the matched coverage, in (0, 1]; None: half the non-private ceiling.
        beta: the beta of the (tau, beta, gamma) diversity-preservation check, in (0, 1].
        source: a description of where the distributions came from, recorded in the result.
        started: the time.time() the run started (default: now), for the recorded run time.
        relation: the neighbouring relation of the DP aggregators' epsilons, one of RELATIONS.
        baselines: also run DP-ICL and PMixED on the same teachers at the same epsilons, beside the public
            model and the non-private ensemble (dpledger.reports.hotpate_baselines.baseline_rows).
        baseline_samples: DP-ICL's law from this many Monte Carlo releases per query; None: by quadrature.

    Returns:
        The HotPateResult.

    Raises:
        ValueError: if an argument is out of range.
    """
    data = _validated_data(data)
    samples = require_int_at_least("samples", samples, 2)
    seed = require_int_at_least("seed", seed, 0)
    budget_queries = require_int_at_least("budget_queries", budget_queries, 1)
    delta = require_in_open("delta", delta, 0.0, 1.0)
    gamma = require_in_closed("gamma", gamma, 1.0, math.inf)
    retries = require_int_at_least("retries", retries, 0)
    beta = require_in_closed("beta", beta, 0.0, 1.0)
    require(beta > 0.0, f"beta must be in (0, 1], got {beta:g}")
    require(len(epsilons) >= 1, "epsilons must hold at least one target epsilon")
    epsilons = tuple(sorted({require_in_open("epsilon", e, 0.0, math.inf) for e in epsilons}))
    if target_coverage is not None:
        target_coverage = require_in_closed("target_coverage", target_coverage, 0.0, 1.0)
        require(target_coverage > 0.0, f"target_coverage must be in (0, 1], got {target_coverage:g}")
    relation = neighbouring_relation(relation)
    require(relation in RELATIONS, f"relation must be one of {', '.join(r.value for r in RELATIONS)}, got {relation.value}")
    if baseline_samples is not None:
        require_int_at_least("baseline_samples", baseline_samples, 1)
    started = time.time() if started is None else started
    queries, teachers, _ = data.teachers.shape
    levels = _thresholds(thresholds, teachers)
    hot = mean_diversity_curve(data.teachers, levels, True, samples, seed)
    cold = mean_diversity_curve(data.teachers, levels, False, samples, seed)
    noise = calibrated_noise(epsilons, delta, budget_queries, retries, teachers, relation)
    configs = _simulate(data, levels, gamma, noise, samples, retries, seed)
    grid = [_row(c, data, delta, budget_queries, gamma, retries, relation) for c in configs]
    for row, config in zip(grid, configs):
        row["_config"] = config
    ceiling = _ceiling(data, samples, seed)
    target = 0.5 * ceiling["coverage"] if target_coverage is None else target_coverage
    frontier = [r for r in grid if r["mechanism"] in THRESHOLD_PRIVATE]
    for mechanism in DIFFERENTIALLY_PRIVATE:
        for scheme in SCHEMES:
            for entry in noise[mechanism]:
                frontier.append(_best([r for r in grid if r["mechanism"] == mechanism and r["scheme"] == scheme
                                       and r["target_epsilon"] == entry["target_epsilon"]]))
    extra: list[tuple[dict[str, Any], _Config]] = []

    def run(mechanism: str, scheme: str, target_epsilon: float) -> list[dict[str, Any]]:
        entry = calibrated_noise([target_epsilon], delta, budget_queries, retries, teachers, relation)[mechanism]
        found = _simulate(data, levels, gamma, {mechanism: entry}, samples, retries, seed, (scheme,), False)
        rows = [_row(c, data, delta, budget_queries, gamma, retries, relation) for c in found]
        for row, config in zip(rows, found):
            row["_config"] = config
        extra.extend(zip(rows, found))
        return rows

    matched_coverage = _matched_coverage(grid, target, run)
    matched_epsilon: dict[str, Any] = {}
    for mechanism in DIFFERENTIALLY_PRIVATE:
        pairs = []
        for entry in noise[mechanism]:
            pair = {scheme: next(r for r in frontier if r["mechanism"] == mechanism and r["scheme"] == scheme
                                 and r["target_epsilon"] == entry["target_epsilon"]) for scheme in SCHEMES}
            pairs.append({"target_epsilon": entry["target_epsilon"], "epsilon": entry["epsilon"], **pair})
        matched_epsilon[mechanism] = pairs
    described = {id(r) for r in frontier}
    for entry in matched_coverage.values():
        if isinstance(entry, dict):
            described |= {id(entry[scheme]) for scheme in SCHEMES if entry.get(scheme)}
    for row in grid + [row for row, _ in extra]:  # text diversity where the comparisons read it (self-BLEU: quadratic)
        if id(row) in described:
            row.update(_text_diversity(np.stack(row["_config"].tokens)))
    preservation: dict[str, Any] = {"beta": beta, "gamma": gamma, "aggregator": "TWS", "tau": "T",
                                    "q_grid": list(Q_GRID)}
    for scheme in SCHEMES:
        chosen = matched_coverage["TWS"][scheme]
        if chosen is None:
            preservation[scheme] = None
            continue
        config = chosen["_config"]
        checks = [diversity_preservation(_tws_released_law(data.teachers[q], config, samples, retries, seed, q, gamma),
                                         data.teachers[q], config.threshold, beta, gamma, Q_GRID)
                  for q in range(queries)]
        betas = [b for b in config.betas if b is not None]
        preservation[scheme] = {
            "threshold": config.threshold,
            "transfer_holds_fraction": float(np.mean([c.transfer_holds for c in checks])),
            "preserved_beta_mean": float(np.mean(betas)) if betas else None,
            "preserved_beta_min": float(np.min(betas)) if betas else None,
            # TWS gives token j at most gamma c_j / n, whose mean over votes is gamma pbar_j: the condition holds
            # by construction, and a Monte Carlo law exceeds it only by sampling error, shown here
            "correlation_largest_excess": float(max(-c.correlation_slack for c in checks))}
    statistics: dict[str, Any] = {}
    for scheme in SCHEMES:
        per_query = [vote_statistics(_histograms(data.teachers[q], scheme == "hot", samples, seed, q), levels)
                     for q in range(queries)]
        statistics[scheme] = {"thresholds": list(levels),
                              "transferred_mass": [float(v) for v in np.mean([s.transferred_mass for s in per_query],
                                                                             axis=0)],
                              "max_passing_threshold": float(np.mean([s.max_passing_threshold for s in per_query])),
                              "margin": float(np.mean([s.margin for s in per_query]))}
    statistics["source"] = ("transferred mass as github.com/bencw99/hot-pate utils.estimate_transfer_mass (fraction "
                            "of votes on tokens with >= T votes); max passing threshold (largest count) and margin "
                            "(top count minus second) defined from the paper, that code publishes no function")
    for row in grid + [row for row, _ in extra]:
        row.pop("_config", None)
    rows = []
    if baselines:
        rows = baseline_rows(data.teachers, data.public, data.targets, epsilons, delta, budget_queries,
                             samples=baseline_samples, seed=seed, relation=relation)
    return HotPateResult(teachers, queries, samples, seed, levels, hot, cold, budget_queries, delta, gamma, retries,
                         ceiling, target, grid, frontier, matched_coverage, matched_epsilon, statistics, preservation,
                         time.time() - started, source or {}, relation, rows)


def _histograms(teachers: np.ndarray, coordinated: bool, samples: int, seed: int, q: int) -> np.ndarray:
    votes = vote_draws(teachers, coordinated, samples, query_seed(seed, q))
    counts = np.zeros((samples, teachers.shape[1]), dtype=np.int64)
    np.add.at(counts, (np.arange(samples)[:, None], votes), 1)
    return counts


def _tws_released_law(teachers: np.ndarray, config: _Config, samples: int, retries: int, seed: int, q: int,
                      gamma: float) -> np.ndarray:
    """TWS's released law (V,) at one query, the rounds `_simulate` drew (its sum is the yield)."""
    counts = _histograms(teachers, config.scheme == "hot", samples * (retries + 1), seed, q).astype(np.float64)
    per_attempt = _tws_laws(counts.reshape(samples, retries + 1, -1), config.threshold, gamma, float(teachers.shape[0]))
    law = _first_release(per_attempt)[0].mean(axis=0)
    return np.minimum(law, 1.0)


# ----------------------------------------------------------------------------------------------
# teachers from the embedded default, your examples or a partitioned dataset

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolved_dtype(dtype: str, device: str) -> torch.dtype:
    """The model's dtype: "auto" is bfloat16 on a CUDA device that supports it, float32 otherwise.

    Args:
        dtype: "auto", "float32", "bfloat16" or "float16".
        device: the device the model runs on ("cpu", "cuda", "cuda:0", ...).

    Returns:
        The torch dtype.

    Raises:
        ValueError: if dtype is not one of those names, or bfloat16 is asked for on a CUDA device without it.
    """
    require(dtype == "auto" or dtype in DTYPES, f"dtype must be auto, {', '.join(DTYPES)}, got {dtype!r}")
    cuda = str(device).startswith("cuda")
    if dtype == "auto":
        return torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    require(not (dtype == "bfloat16" and cuda and not torch.cuda.is_bf16_supported()),
            f"dtype bfloat16 is not supported on device {device}")
    return DTYPES[dtype]


def read_partitioned_dataset(path: str | Path, partition_key: str, teachers: int,
                             text_key: str = "text") -> list[list[str]]:
    """Teacher examples from a JSONL dataset: every record's `text_key` string goes to the teacher of its
    `partition_key` value, the k-th distinct value (in sorted order) to teacher k mod N, so all of one
    key's records (one user's, say) stay with one teacher.

    Args:
        path: the JSONL file, one JSON object per non-empty line.
        partition_key: the field naming each record's partition (any JSON scalar).
        teachers: the number of teachers N (>= 2).
        text_key: the field holding the record's text (a non-empty string).

    Returns:
        N lists of example strings.

    Raises:
        ValueError: if the file cannot be read, a line is not a JSON object with both fields, or there are
            fewer distinct partition values than teachers.
    """
    teachers = require_int_at_least("teachers", teachers, 2)
    groups: dict[str, list[str]] = {}
    for number, line in enumerate(read_text_file(path, "--dataset").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"--dataset {path} line {number} is not JSON ({error.msg})") from None
        require(isinstance(record, dict) and partition_key in record and isinstance(record.get(text_key), str)
                and record[text_key].strip() != "",
                f"--dataset {path} line {number} must be an object with {partition_key!r} and a non-empty string "
                f"{text_key!r}")
        groups.setdefault(json.dumps(record[partition_key], sort_keys=True, allow_nan=False), []).append(record[text_key].strip())
    require(len(groups) >= teachers, f"--dataset {path} has {len(groups)} distinct {partition_key!r} values, "
                                     f"fewer than the {teachers} teachers")
    examples: list[list[str]] = [[] for _ in range(teachers)]
    for index, key in enumerate(sorted(groups)):
        examples[index % teachers].extend(groups[key])
    return examples


def run_hotpate(teachers: int = 64, queries: int = 48, samples: int = 200, seed: int = 0, prompt_tokens: int = 48, *,
                budget_queries: int = 1000, delta: float = 1e-5, verbose: bool = True, model: str | None = None,
                tokenizer: str | None = None, examples: str | None = None, dataset: str | None = None,
                partition_key: str | None = None, text_key: str = "text", heldout: str | None = None,
                dtype: str = "auto", device: str = "auto", temperature: float = 1.0, top_p: float = 1.0,
                thresholds: Sequence[int] | None = None, gamma: float = 1.0, heterogeneity: float = 0.0,
                epsilons: Sequence[float] = EPSILONS, retries: int = 0, target_coverage: float | None = None,
                beta: float = 0.1, relation: NeighbouringRelation | str = DEFAULT_RELATION, baselines: bool = False,
                baseline_samples: int | None = None) -> HotPateResult:
    """Hot vs cold voting with N in-context teachers (module docstring): the embedded default unless a
    model, examples or a dataset are given.

    Args:
        teachers: the number N of in-context teachers, in [2, MAX_TEACHERS].
        queries: the teacher-forced query positions (>= 1).
        samples: voting rounds per query and scheme (>= 2).
        seed: the seed of the voting rounds and the aggregators' noise (>= 0).
        prompt_tokens: each teacher's private prompt budget, in tokens.
        budget_queries: the queries every epsilon is charged for (>= 1).
        delta: the delta of every epsilon, in (0, 1).
        verbose: whether building or loading the embedded default prints progress.
        model: the public model (local directory or hub name); None: the embedded default.
        tokenizer: its tokenizer (default: the model's own).
        examples: a JSON file of N lists of in-context examples (decoding.icl.read_icl_examples).
        dataset: a JSONL dataset partitioned over the teachers by `partition_key` (read_partitioned_dataset).
        partition_key: the dataset's partition field (required with `dataset`).
        text_key: the dataset's text field.
        heldout: a text file of held-out documents (blank-line separated) to query on; required with
            `model`, default the embedded held-out dialogues otherwise.
        dtype: "auto" (bfloat16 on a CUDA device that has it, float32 otherwise), "float32", "bfloat16"
            or "float16".
        device: "auto" (cuda when available), "cpu" or a CUDA device.
        temperature: the softmax temperature of teacher and public distributions, > 0.
        top_p: the nucleus mass of teacher and public distributions, in (0, 1].
        thresholds: the vote thresholds T; None: T/N = 0.05, ..., 1.
        gamma: TWS's and DPWS's gamma (>= 1).
        heterogeneity: h in [0, 1], the share of each teacher's own distinct distribution (mixed_teachers).
        epsilons: the target epsilons of DPARGMAX and DPWS.
        retries: retries of the shared randomness on a failed round (>= 0).
        target_coverage: the matched coverage; None: half the non-private ceiling.
        beta: the beta of the diversity-preservation check, in (0, 1].
        relation: the neighbouring relation of every epsilon, one of RELATIONS.
        baselines: also run DP-ICL and PMixED on the same teachers (hot_vs_cold).
        baseline_samples: DP-ICL's law from this many Monte Carlo releases per query; None: by quadrature.

    Returns:
        The HotPateResult (`hot_vs_cold`), its source naming the model, examples, text and settings.

    Raises:
        ValueError: if a parameter is out of range (checked before the teachers run) or an input is unusable.
    """
    from transformers import AutoTokenizer

    from dpledger.decoding.icl import InContextEnsemble, embedded_icl_default, partition_records, prompt_text, \
        read_icl_examples

    teachers = require_int_at_least("teachers", teachers, 2)
    require(teachers <= MAX_TEACHERS, f"teachers must be <= {MAX_TEACHERS}, got {teachers}")
    queries = require_int_at_least("queries", queries, 1)
    require_int_at_least("samples", samples, 2)
    require_int_at_least("budget_queries", budget_queries, 1)  # refused before the teachers run, not after
    require_in_open("delta", delta, 0.0, 1.0)
    require_int_at_least("seed", seed, 0)
    require_int_at_least("retries", retries, 0)
    require_in_closed("gamma", gamma, 1.0, math.inf)
    require_in_open("temperature", temperature, 0.0, math.inf)
    require(isinstance(top_p, (int, float)) and 0.0 < top_p <= 1.0, f"top_p must be in (0, 1], got {top_p!r}")
    heterogeneity = require_in_closed("heterogeneity", heterogeneity, 0.0, 1.0)
    relation = neighbouring_relation(relation)
    require(relation in RELATIONS, f"relation must be one of {', '.join(r.value for r in RELATIONS)}, got {relation.value}")
    if baseline_samples is not None:
        require_int_at_least("baseline_samples", baseline_samples, 1)
    require(examples is None or dataset is None, "give either --examples or --dataset, not both")
    require(dataset is None or partition_key is not None, "--dataset needs --partition-key")
    require(model is None or examples is not None or dataset is not None,
            "--model needs the teachers' examples: --examples or --dataset with --partition-key")
    require(model is None or heldout is not None, "--model needs --heldout, the held-out text to query on")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = resolved_dtype(dtype, device)
    set_single_thread()
    started = time.time()
    if model is None:
        embedded = embedded_icl_default(teachers, verbose=verbose)
        public, tokenizer_path = str(embedded.public_path), str(embedded.tokenizer_path)
        heldout_text = embedded.corpus.private_heldout
    else:
        public, tokenizer_path, heldout_text = model, tokenizer or model, ""
    if heldout is not None:
        heldout_text = read_text_file(heldout, "--heldout")
    if examples is not None:
        groups, origin = read_icl_examples(examples, teachers), f"examples {examples}"
    elif dataset is not None:
        groups = read_partitioned_dataset(dataset, str(partition_key), teachers, text_key)
        origin = f"dataset {dataset} partitioned by {partition_key!r}"
    else:
        groups, origin = partition_records(embedded.corpus, teachers), "embedded private records"
    loaded = AutoTokenizer.from_pretrained(tokenizer_path)
    prompts = [prompt_text(group, loaded, prompt_tokens) for group in groups]
    ensemble = InContextEnsemble.from_pretrained(public, prompts, loaded, prompt_tokens, device,
                                                 [f"{origin}: teacher {i}" for i in range(teachers)])
    ensemble.cast(torch_dtype)
    data = teacher_distributions(ensemble, encode_documents(loaded, heldout_text), queries, temperature=temperature,
                                 top_p=top_p)
    if heterogeneity > 0.0:
        streams = [encode_documents(loaded, "\n\n".join(group)) for group in groups]
        own = own_distributions(ensemble, streams, queries, temperature=temperature, top_p=top_p)
        data = TeacherDistributions(mixed_teachers(data.teachers, own, heterogeneity), data.public, data.targets)
    source = {"public_model": public if model is not None else "embedded default (dpledger.decoding.icl)",
              "teachers_from": origin, "prompt_tokens": prompt_tokens,
              "text": heldout if heldout is not None else "embedded private held-out dialogues",
              "dtype": str(torch_dtype).removeprefix("torch."), "device": device, "temperature": temperature,
              "top_p": top_p, "heterogeneity": heterogeneity,
              "heterogeneity_rule": "p_i = (1 - h) p_i^icl + h p_i^own, p_i^own the public model on teacher i's own "
                                    "examples at the same index (module docstring)"}
    return hot_vs_cold(data, samples, seed, budget_queries, delta, thresholds, gamma, epsilons, retries,
                       target_coverage, beta, source, started, relation, baselines, baseline_samples)


# ----------------------------------------------------------------------------------------------
# figure, tables and text


def hotpate_figure(result: HotPateResult) -> bytes:
    """Six panels: yield, coverage (with the non-private ceiling) and the public implementation's
    transferred mass against T/N; utility and coverage of DPARGMAX and DPWS against epsilon; the
    threshold-private aggregators' utility against T/N.

    Args:
        result: the hot vs cold result to plot.

    Returns:
        The figure as PNG bytes.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = np.asarray(result.thresholds) / result.teachers
    figure, axes = plt.subplots(2, 3, figsize=(15, 8))
    axes = axes.ravel()
    styles = {"hot": "-o", "cold": "--s"}
    for curve, scheme in ((result.hot, "hot"), (result.cold, "cold")):
        axes[0].errorbar(fractions, curve.yield_, yerr=np.asarray(curve.yield_stderr) * 1.96, fmt=styles[scheme], ms=3,
                         label=f"{scheme} votes", capsize=2)
        axes[1].plot(fractions, curve.coverage, styles[scheme], ms=3, label=f"{scheme} votes")
        axes[2].plot(fractions, result.vote_statistics[scheme]["transferred_mass"], styles[scheme], ms=3,
                     label=f"{scheme} votes")
    ceiling = result.ceiling["coverage"]
    axes[0].axhline(1.0, color="k", lw=0.8, ls=":", label="non-private ceiling (always answers)")
    axes[1].axhline(ceiling, color="k", lw=0.8, ls=":",
                    label=f"non-private ceiling: {result.samples} draws of the mean ({ceiling:.2f})")
    axes[1].axhline(result.target_coverage, color="#c33", lw=0.8, ls="-.",
                    label=f"matched coverage {result.target_coverage:.2f}")
    for axis, title in zip(axes[:3], ("yield (some token >= T votes)", "coverage (mass of tokens reaching T)",
                                      "transferred mass (votes on tokens >= T)")):
        axis.set_xlabel("T / N")
        axis.set_title(title, fontsize=10)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    markers = {"DPARGMAX": "o", "DPWS": "^", "TARGMAX": "o", "TWS": "^"}
    for mechanism in DIFFERENTIALLY_PRIVATE:
        for scheme in SCHEMES:
            rows = [r for r in result.frontier if r["mechanism"] == mechanism and r["scheme"] == scheme]
            eps = [r["epsilon"] for r in rows]
            line = "-" if scheme == "hot" else "--"
            axes[3].plot(eps, [r[SELECTION] for r in rows], line + markers[mechanism], ms=4, label=f"{mechanism} {scheme}")
            axes[4].plot(eps, [r["coverage"] for r in rows], line + markers[mechanism], ms=4,
                         label=f"{mechanism} {scheme}")
    for name, style in (("dp-icl", "s"), ("pmixed", "D")):  # each row says how its law was obtained (hotpate.json)
        rows = [r for r in result.baselines if r["mechanism"] == name and r["tv_to_reference"] is not None]
        if rows:
            axes[3].plot([r["epsilon"] for r in rows], [r["tv_to_reference"] for r in rows], ":" + style, ms=4,
                         color="grey" if name == "pmixed" else "k", label=f"{name} (same teachers)")
    axes[4].axhline(ceiling, color="k", lw=0.8, ls=":", label="non-private ceiling")
    for axis in (axes[3], axes[5]):  # a law estimated from `samples` rounds is this far from exact, even sampling pbar
        axis.axhline(result.ceiling["tv_to_reference"], color="k", lw=0.8, ls=":",
                     label=f"non-private ceiling's Monte Carlo TV ({result.samples} draws)")
    axes[4].axhline(result.target_coverage, color="#c33", lw=0.8, ls="-.", label="matched coverage")
    for mechanism in THRESHOLD_PRIVATE:
        for scheme in SCHEMES:
            rows = [r for r in result.grid if r["mechanism"] == mechanism and r["scheme"] == scheme]
            axes[5].plot([r["threshold_fraction"] for r in rows], [r[SELECTION] for r in rows],
                         ("-" if scheme == "hot" else "--") + markers[mechanism], ms=3, label=f"{mechanism} {scheme}")
    for axis, title, xlabel in ((axes[3], "DP aggregators: TV to the non-private ensemble (best T)", "epsilon"),
                                (axes[4], "DP aggregators: coverage of released tokens (best T)", "epsilon"),
                                (axes[5], f"threshold-private ({NO_DP}): TV to the ensemble", "T / N")):
        axis.set_xlabel(xlabel)
        axis.set_title(title, fontsize=10)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    axes[3].set_xscale("log")
    axes[4].set_xscale("log")
    regime = result.source.get("heterogeneity")
    figure.suptitle(f"Hot vs cold PATE: N = {result.teachers} teachers, {result.queries} queries, {result.samples} "
                    f"rounds" + ("" if regime is None else f", heterogeneity h = {regime:g}")
                    + f"; epsilons over {result.budget_queries} queries at delta = {result.delta:g}", fontsize=11)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


def hotpate_table(result: HotPateResult):
    """One row per threshold T: the vote-level yield, coverage and transferred support size of hot and
    cold voting, and the public implementation's transferred mass.

    Args:
        result: the hot vs cold result.

    Returns:
        A pandas DataFrame with the columns T, T/N, yield hot/cold, coverage hot/cold, support hot/cold and
        transferred mass hot/cold.
    """
    import pandas as pd

    return pd.DataFrame({"T": result.thresholds,
                         "T/N": [round(t / result.teachers, 3) for t in result.thresholds],
                         "yield hot": result.hot.yield_, "yield cold": result.cold.yield_,
                         "coverage hot": result.hot.coverage, "coverage cold": result.cold.coverage,
                         "support hot": result.hot.support_size, "support cold": result.cold.support_size,
                         "transferred mass hot": result.vote_statistics["hot"]["transferred_mass"],
                         "transferred mass cold": result.vote_statistics["cold"]["transferred_mass"]})


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.{digits}g}"
    return str(value)


def _describe(row: dict[str, Any] | None) -> str:
    if row is None:
        return "does not reach it"
    epsilon = row["epsilon_label"] if row["epsilon"] is None else f"epsilon {row['epsilon']:.3g}"
    text = (f"T = {row['threshold']} (T/N = {row['threshold_fraction']:.2f}), {epsilon}, coverage "
            f"{row['coverage']:.3f}, yield {row['yield']:.3f}, TV {row['tv_to_reference']:.3f}, "
            f"p(target) {_fmt(row['target_probability'])}")
    if row.get("distinct_2") is not None:
        text += (f", distinct-1 {_fmt(row['distinct_1'])}, distinct-2 {_fmt(row['distinct_2'])}, "
                 f"self-BLEU {_fmt(row['self_bleu'])}")
    return text


def summary_lines(result: HotPateResult) -> list[str]:
    """The comparisons in words: the ceiling, matched coverage, matched epsilon, vote statistics and the
    diversity-preservation check.

    Args:
        result: the hot vs cold result.

    Returns:
        The lines, without trailing newlines.
    """
    ceiling = result.ceiling
    lines = [f"Non-private ceiling ({result.samples} draws of the teachers' mean per query): coverage "
             f"{ceiling['coverage']:.3f}, yield 1, distinct-1 {_fmt(ceiling['distinct_1'])}, distinct-2 "
             f"{_fmt(ceiling['distinct_2'])}, self-BLEU {_fmt(ceiling['self_bleu'])}; the empirical law of those "
             f"draws is at TV {ceiling['tv_to_reference']:.3f} from the mean (Monte Carlo error: voting laws are "
             "estimated from as many rounds).",
             f"Matched coverage {result.target_coverage:.3f} (coverage of released tokens; DP epsilons over "
             f"{result.budget_queries} queries at delta = {result.delta:g}, {result.relation.value}, "
             f"{result.retries} retries):"]
    for mechanism in THRESHOLD_PRIVATE + DIFFERENTIALLY_PRIVATE:
        entry = result.matched_coverage[mechanism]
        for scheme in SCHEMES:
            lines.append(f"  {mechanism} {scheme}: {_describe(entry[scheme])}")
        if mechanism in DIFFERENTIALLY_PRIVATE:
            bound = entry["epsilon_cold_over_hot_at_least"]
            lines.append(f"  {mechanism}: epsilon cold / hot = {_fmt(entry['epsilon_cold_over_hot'])}"
                         + ("" if bound is None else f" (cold never reaches it: at least {bound:.3g})")
                         + "; " + "; ".join(f"{s}: {entry[s + '_note']}" for s in SCHEMES if entry.get(s + "_note")))
        else:
            lines.append(f"  {mechanism}: usable T hot / cold = {_fmt(entry['threshold_hot_over_cold'])} ({NO_DP})")
    lines.append(f"Matched epsilon (best T by {SELECTION}): epsilon: hot TV / cold TV, hot coverage / cold coverage, "
                 "hot / cold P(true next token) (TV is biased upward by the rounds' Monte Carlo error, as the ceiling's "
                 "is; the true token's probability is linear in the law, so unbiased)")
    for mechanism in DIFFERENTIALLY_PRIVATE:
        cells = [f"{p['epsilon']:.3g}: {p['hot'][SELECTION]:.3f}/{p['cold'][SELECTION]:.3f}, "
                 f"{p['hot']['coverage']:.3f}/{p['cold']['coverage']:.3f}, "
                 f"{_fmt(p['hot']['target_probability'])}/{_fmt(p['cold']['target_probability'])}"
                 for p in result.matched_epsilon[mechanism]]
        lines.append(f"  {mechanism}: " + "; ".join(cells))
    if result.baselines:
        lines.append("Baselines on the same teachers (exact or stated laws; epsilon: TV, P(true next token)):")
        for name in dict.fromkeys(row["mechanism"] for row in result.baselines):
            cells = [(f"{_fmt(row['epsilon'])}: " if row["target_epsilon"] is not None else "")
                     + (f"{_fmt(row['tv_to_reference'])}, {_fmt(row['target_probability'])}"
                        if row["tv_to_reference"] is not None else str(row["epsilon_label"]))
                     for row in result.baselines if row["mechanism"] == name]
            lines.append(f"  {name} ({result.baselines[0]['relation']}): " + "; ".join(cells))
    stats = result.vote_statistics
    lines.append(f"Votes (public Hot PATE code's quantities): max passing threshold hot "
                 f"{stats['hot']['max_passing_threshold']:.2f} / cold {stats['cold']['max_passing_threshold']:.2f} "
                 f"votes, margin hot {stats['hot']['margin']:.2f} / cold {stats['cold']['margin']:.2f}.")
    check = result.diversity_preservation
    for scheme in SCHEMES:
        entry = check[scheme]
        lines.append(f"(tau = T, beta = {check['beta']:g}, gamma = {check['gamma']:g}) diversity preservation of TWS "
                     f"{scheme} at its matched-coverage T: " + (
                         "no T reaches the matched coverage" if entry is None else
                         f"T = {entry['threshold']}, transfer holds on {entry['transfer_holds_fraction']:.0%} of "
                         f"queries, largest beta mean {_fmt(entry['preserved_beta_mean'])} min "
                         f"{_fmt(entry['preserved_beta_min'])}; correlation holds by construction (largest Monte "
                         f"Carlo excess {entry['correlation_largest_excess']:.2g})"))
    return lines


def hotpate_markdown(result: HotPateResult) -> str:
    """The hot vs cold section as Markdown: the setting, the vote-level table, the comparisons.

    Args:
        result: the hot vs cold result.

    Returns:
        The Markdown text, ending in a newline.
    """
    from dpledger.reports.render import markdown_table

    verdict = "higher" if result.hot_coverage_higher_from_quarter else "NOT higher"
    regime = result.source.get("heterogeneity")
    return "\n".join(["## Hot vs cold PATE (Cohen et al. 2023)", "",
                      f"N = {result.teachers} in-context teachers, {result.queries} teacher-forced queries, "
                      f"{result.samples} voting rounds per query and scheme"
                      + ("" if regime is None else f", heterogeneity h = {regime:g}")
                      + f" ({result.seconds:.0f} s).", "",
                      markdown_table(hotpate_table(result).round(4)), "",
                      f"Vote-level hot coverage is {verdict} than cold at every T >= N/4.", "",
                      *summary_lines(result), ""])


def hotpate_html(result: HotPateResult) -> str:
    """The hot vs cold section as HTML for a report's page: the setting, the figure inline, the
    comparisons and the table; every line from the result is escaped.

    Args:
        result: the hot vs cold result.

    Returns:
        The HTML fragment.
    """
    from dpledger.reports.render import _html_table

    encoded = base64.b64encode(hotpate_figure(result)).decode()
    verdict = "higher" if result.hot_coverage_higher_from_quarter else "NOT higher"
    return "\n".join([
        "<h2 id='hot-pate'>Hot vs cold PATE (Cohen et al. 2023)</h2>",
        f"<p>N = {result.teachers} in-context teachers, {result.queries} queries, {result.samples} voting rounds per "
        f"query and scheme. Vote-level hot coverage is <b>{verdict}</b> than cold at every T &ge; N/4.</p>",
        f"<figure><img alt='hot vs cold' src='data:image/png;base64,{encoded}'><figcaption>vote-level yield, coverage "
        "(dotted: the non-private ceiling) and transferred mass against T/N; the DP aggregators against epsilon; the "
        "threshold-private ones against T/N</figcaption></figure>",
        "<p>" + "<br>".join(escaped(line) for line in summary_lines(result)) + "</p>",
        _html_table(hotpate_table(result).round(4), "hotpate")])


def write_hotpate(result: HotPateResult, out: str | Path) -> dict[str, Path]:
    """hotpate.json (strict: a +inf cross-entropy is written as null and listed under "nulls",
    dpledger.accounting.strict_json), hotpate.png and hotpate.md under `out`, each written atomically and
    never through a link (dpledger.accounting.safe_files).

    Args:
        result: the hot vs cold result.
        out: the output directory (created if missing).

    Returns:
        "json", "png", "md" -> the path written.

    Raises:
        OSError: if a file cannot be written.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "hotpate.json", "png": out / "hotpate.png", "md": out / "hotpate.md"}
    contents = {"json": (strict_json_text(result.to_dict(), sort_keys=False) + "\n").encode(),
                "png": hotpate_figure(result), "md": hotpate_markdown(result).encode()}
    for kind, path in paths.items():
        write_atomic(path, contents[kind])
    return paths
