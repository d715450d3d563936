"""Diversity transfer of Hot PATE voting (Cohen et al. 2023, "Hot PATE: Private Aggregation of
Distributions for Diverse Tasks").

N teachers each hold a next-token distribution p_i over V tokens and cast one vote y_i ~ p_i; the
histogram is c_j = #{i : y_i = j}. Cold votes are independent; coordinated (hot) votes share one
Exp(1) vector u per draw and vote y_i = argmax_j p_i[j] / u_j (the exponential race: each marginal
is exactly p_i, while teachers with overlapping support agree with probability at least
(1 - TV) / (1 + TV)). A token can be released only when its count clears a threshold T, so what
matters for diversity is how much of the teachers' common mass ever clears it:

* `diversity_curve` / `mean_diversity_curve`: Monte Carlo yield (Pr[max_j c_j >= T]), coverage
  (the mass under the mean teacher distribution pbar of the tokens that reach T in at least one
  draw: the transferred support), and the expected passing mass per draw, at several thresholds.
* `diversity_preservation`: the (tau, beta, gamma)-diversity-preservation conditions of Hot PATE
  (Cohen et al. 2023, Definition of diversity preservation) checked on an output law.
* `aggregator_output_law`: the output law of a histogram aggregator (TWS, TARGMAX) averaged over
  the votes' randomness.

Everything here is a property of the voting scheme and the aggregator, not a privacy bound.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpledger.accounting.errors import require, require_bool, require_finite, require_in_closed, require_int_at_least
from dpledger.mechanisms.hot_pate import Targmax, coordinated_votes
from dpledger.accounting.lazy_import import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")  # imported on first use: `import dpledger` stays light

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

TEACHER_SUM_TOLERANCE = 1e-6
"""|sum_j p_i[j] - 1| allowed per teacher."""

CHUNK_BYTES = 64 * 2 ** 20
"""Bound on one chunk's float64 score tensor (samples x N x V for cold votes, the largest
intermediate); a few such tensors are alive at once, so peak memory stays below ~200 MB."""

MAX_OFFENDING = 10
"""How many offending tokens a DiversityPreservation lists (the first ones by token id)."""


# ----------------------------------------------------------------------------------------------
# validation


def validated_teachers(teachers: torch.Tensor | ArrayLike, name: str = "teachers", ndim: int = 2) -> FloatArray:
    """teachers as float64 of exactly `ndim` axes (last = vocabulary), finite, >= 0, each row
    summing to 1 within TEACHER_SUM_TOLERANCE (rows are not renormalised).

    Args:
        teachers: teacher distributions (numpy, torch or nested lists), `ndim` axes, last = vocabulary.
        name: the argument's name, for the messages.
        ndim: the exact number of axes required.

    Returns:
        float64 array of the same values (not renormalised).

    Raises:
        ValueError: if `teachers` is not numeric, has another number of axes, is empty, holds NaN,
            inf or a negative entry, or a row's sum is off 1 by more than TEACHER_SUM_TOLERANCE.
    """
    if hasattr(teachers, "detach"):
        teachers = teachers.detach().cpu().double().numpy()
    try:
        array = np.asarray(teachers, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of probabilities, got {type(teachers).__name__}") from None
    require(array.ndim == ndim, f"{name} must have {ndim} axes (last = vocabulary), got shape {array.shape}")
    require(array.size > 0, f"{name} must not be empty, got shape {array.shape}")
    require(bool(np.all(np.isfinite(array))), f"{name} must be finite (no NaN or inf)")
    smallest = float(array.min())
    require(smallest >= 0.0, f"{name} must be non-negative, got entry {smallest:g}")
    worst = float(np.max(np.abs(array.sum(axis=-1) - 1.0)))
    require(worst <= TEACHER_SUM_TOLERANCE,
            f"{name} rows must sum to 1 within {TEACHER_SUM_TOLERANCE:g}, off by {worst:g}")
    return array


def _validated_seed(seed: object) -> int:
    value: int = require_int_at_least("seed", seed, 0)
    require(value < 2 ** 63, f"seed must be < 2**63, got {value}")
    return value


def _validated_thresholds(thresholds: Iterable[int]) -> tuple[int, ...]:
    if isinstance(thresholds, (str, bytes)) or not hasattr(thresholds, "__iter__"):
        raise ValueError(f"thresholds must be a non-empty sequence of integers >= 1, got {thresholds!r}")
    values = tuple(require_int_at_least("threshold", t, 1) for t in np.asarray(list(thresholds), dtype=object).ravel())
    require(len(values) > 0, "thresholds must be a non-empty sequence of integers >= 1, got an empty one")
    require(all(a < b for a, b in zip(values, values[1:])), f"thresholds must be strictly increasing, got {list(values)}")
    return values


def mean_teacher(teachers: FloatArray) -> FloatArray:
    """pbar = (1/N) sum_i p_i, summed over each token's sorted column: bit-for-bit the same for any
    order of the teachers (so permuting teachers leaves every metric exactly unchanged).

    Args:
        teachers: teacher distributions (N, V), float64.

    Returns:
        pbar, float64 (V,).
    """
    mean: FloatArray = np.sort(teachers, axis=0).sum(axis=0) / teachers.shape[0]
    return mean


def query_seed(seed: int, index: int) -> int:
    """The voting seed of query `index` in `mean_diversity_curve` (a hash of the public seed and
    the index; the same for hot and cold curves, so their comparisons are paired).

    Args:
        seed: the public seed, in [0, 2^63).
        index: the query's index (>= 0).

    Returns:
        A seed in [0, 2^63): the first 8 bytes, little-endian, of SHA-256 of
        "dpledger-diversity:<seed>:<index>".

    Raises:
        ValueError: if seed or index is out of range.
    """
    seed = _validated_seed(seed)
    index = require_int_at_least("index", index, 0)
    digest = hashlib.sha256(f"dpledger-diversity:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


# ----------------------------------------------------------------------------------------------
# votes and histograms


def _chunk_rows(teachers: int, vocabulary: int) -> int:
    return max(1, CHUNK_BYTES // (8 * teachers * vocabulary))


def vote_draws(teachers: torch.Tensor | ArrayLike, coordinated: bool, samples: int, seed: int) -> IntArray:
    """`samples` independent rounds of voting: int64 votes of shape (samples, N).

    Coordinated (Cohen et al. 2023, coordinated ensembles): one shared u ~ Exp(1)^V per round and
    y_i = argmax_j p_i[j] / u_j (`dpledger.mechanisms.hot_pate.coordinated_votes`). Independent: an Exp(1)
    per teacher and token, y_i = argmax_j p_i[j] / u_ij, the exponential race, which samples
    p_i exactly. Draws come from one torch.Generator seeded by `seed`, in chunks of rounds that
    bound memory; the chunking depends on (N, V) only, so equal inputs give equal votes.

    Args:
        teachers: teacher distributions (N, V), rows summing to 1 (validated_teachers).
        coordinated: one shared Exp(1) vector per round (True) or independent draws (False).
        samples: the number of rounds (>= 1).
        seed: the torch.Generator's seed, in [0, 2^63).

    Returns:
        int64 array (samples, N): each teacher's vote (a token id) in each round.

    Raises:
        ValueError: if an argument fails its check (teachers as validated_teachers; thresholds not a
            strictly increasing non-empty sequence of integers >= 1; samples < 1; seed not in [0, 2^63)).
    """
    probs_np = validated_teachers(teachers)
    coordinated = require_bool("coordinated", coordinated)
    samples = require_int_at_least("samples", samples, 1)
    seed = _validated_seed(seed)
    n, vocabulary = probs_np.shape
    probs = torch.from_numpy(probs_np)
    log_probs = torch.log(probs)  # -inf at zero-probability tokens: they never win the race
    generator = torch.Generator().manual_seed(seed)
    tiny = float(np.finfo(np.float64).tiny)  # an Exp(1) draw of 0 would make log u = -inf
    rows = _chunk_rows(n, vocabulary)
    out = np.empty((samples, n), dtype=np.int64)
    for start in range(0, samples, rows):
        size = min(rows, samples - start)
        if coordinated:
            exp_draws = torch.empty((size, vocabulary), dtype=torch.float64).exponential_(generator=generator)
            log_u = torch.log(exp_draws.clamp_min(tiny))
            votes = coordinated_votes(probs, log_uniform_exp=log_u)  # (size, N) via broadcasting
        else:
            scores = torch.empty((size, n, vocabulary), dtype=torch.float64).exponential_(generator=generator)
            scores.clamp_min_(tiny).log_().neg_().add_(log_probs)  # log p_i[j] - log u_ij, in place
            votes = torch.argmax(scores, dim=-1)
        out[start:start + size] = votes.numpy()
    return out


def _histograms(votes: IntArray, vocabulary: int) -> IntArray:
    """(rows, N) votes -> (rows, V) int64 counts, by one bincount."""
    rows = votes.shape[0]
    flat = (np.arange(rows, dtype=np.int64)[:, None] * vocabulary + votes).ravel()
    return np.bincount(flat, minlength=rows * vocabulary).reshape(rows, vocabulary)


def _histogram_chunks(votes: IntArray, vocabulary: int) -> Iterator[IntArray]:
    rows = max(1, CHUNK_BYTES // (8 * vocabulary))
    for start in range(0, votes.shape[0], rows):
        yield _histograms(votes[start:start + rows], vocabulary)


# ----------------------------------------------------------------------------------------------
# diversity curves


def _json_float(value: float) -> float:
    value = float(value)
    require(math.isfinite(value), f"a diversity metric must be finite, got {value!r}")
    return value


@dataclass(frozen=True)
class DiversityCurve:
    """Monte Carlo diversity metrics of one voting scheme at several thresholds T.

    yield_[k]: fraction of draws with max_j c_j >= T_k (TARGMAX_T answers), with its binomial
    standard error yield_stderr[k]. coverage[k]: pbar-mass of the transferred support, the tokens
    with c_j >= T_k in at least one of the `samples` draws (Cohen et al. 2023's coverage; a set
    statistic, no standard error). support_size[k]: the size of that support. passing_mass[k]: the
    mean over draws of sum_{j : c_j >= T_k} pbar_j, with standard error passing_mass_stderr[k].
    Over several queries (`mean_diversity_curve`) every metric is the mean over queries, and the
    standard errors are Monte Carlo errors given the queries: sqrt(sum_q se_q^2) / Q.
    """

    coordinated: bool
    teachers: int
    samples: int
    thresholds: tuple[int, ...]
    yield_: tuple[float, ...]
    yield_stderr: tuple[float, ...]
    coverage: tuple[float, ...]
    support_size: tuple[float, ...]
    passing_mass: tuple[float, ...]
    passing_mass_stderr: tuple[float, ...]
    queries: int = 1

    def to_dict(self) -> dict[str, object]:
        """Strict JSON-safe dict: plain bools, ints, lists of floats (json.dumps(allow_nan=False) works).

        Returns:
            A dict of the fields: coordinated as a bool, counts as ints, thresholds as a list of ints,
            every metric as a list of floats.

        Raises:
            ValueError: if a metric is not finite.
        """
        return {
            "coordinated": bool(self.coordinated),
            "teachers": int(self.teachers),
            "samples": int(self.samples),
            "queries": int(self.queries),
            "thresholds": [int(t) for t in self.thresholds],
            **{name: [_json_float(v) for v in getattr(self, name)]
               for name in ("yield_", "yield_stderr", "coverage", "support_size", "passing_mass",
                            "passing_mass_stderr")},
        }


def _curve_arrays(teachers: FloatArray, thresholds: tuple[int, ...], coordinated: bool, samples: int,
                  seed: int) -> dict[str, FloatArray]:
    """Per-query metrics as float64 arrays over thresholds."""
    n, vocabulary = teachers.shape
    pbar = mean_teacher(teachers)
    votes = vote_draws(teachers, coordinated, samples, seed)
    levels = np.asarray(thresholds, dtype=np.int64)
    capped = np.minimum(levels, n + 1)  # a count never exceeds n: T > n passes nothing
    answered = np.zeros(levels.size, dtype=np.int64)
    token_max = np.zeros(vocabulary, dtype=np.int64)
    mass_sum = np.zeros(levels.size)
    mass_sq = np.zeros(levels.size)
    for counts in _histogram_chunks(votes, vocabulary):
        rows = counts.shape[0]
        answered += (counts.max(axis=1)[None, :] >= levels[:, None]).sum(axis=1)
        np.maximum(token_max, counts.max(axis=0), out=token_max)
        # mass_by_count[r, c] = sum of pbar_j over tokens with c_j = c in draw r; reverse cumsum
        # gives the mass of tokens with c_j >= c
        flat = (np.arange(rows, dtype=np.int64)[:, None] * (n + 2) + counts).ravel()
        by_count = np.bincount(flat, weights=np.broadcast_to(pbar, counts.shape).ravel(),
                               minlength=rows * (n + 2)).reshape(rows, n + 2)
        at_least = np.cumsum(by_count[:, ::-1], axis=1)[:, ::-1]
        passing = at_least[:, capped]  # (rows, K)
        mass_sum += passing.sum(axis=0)
        mass_sq += (passing ** 2).sum(axis=0)
    yield_ = answered / samples
    in_support = token_max[None, :] >= levels[:, None]  # (K, V)
    mass_mean = mass_sum / samples
    mass_var = np.maximum(mass_sq / samples - mass_mean ** 2, 0.0) * (samples / max(samples - 1, 1))
    return {
        "yield_": yield_,
        "yield_stderr": np.sqrt(yield_ * (1.0 - yield_) / samples),
        "coverage": np.minimum((in_support * pbar[None, :]).sum(axis=1), 1.0),
        "support_size": in_support.sum(axis=1).astype(np.float64),
        "passing_mass": np.minimum(mass_mean, 1.0),
        "passing_mass_stderr": np.sqrt(mass_var / samples),
    }


def diversity_curve(teachers: torch.Tensor | ArrayLike, thresholds: Iterable[int], coordinated: bool, samples: int = 200,
                    seed: int = 0) -> DiversityCurve:
    """Yield, coverage, transferred-support size and passing mass of one query's votes (teachers
    (N, V)) at each threshold, from `samples` rounds of voting seeded by `seed` (see DiversityCurve).

    Args:
        teachers: one query's teacher distributions (N, V).
        thresholds: the thresholds T_k, strictly increasing integers >= 1.
        coordinated: coordinated (hot) or independent (cold) votes.
        samples: the number of voting rounds (>= 1).
        seed: the votes' seed, in [0, 2^63).

    Returns:
        The DiversityCurve (queries = 1; support_size as integers).

    Raises:
        ValueError: if an argument fails its check (teachers as validated_teachers; thresholds not a
            strictly increasing non-empty sequence of integers >= 1; samples < 1; seed not in [0, 2^63)).
    """
    teachers_np = validated_teachers(teachers)
    levels = _validated_thresholds(thresholds)
    coordinated = require_bool("coordinated", coordinated)
    samples = require_int_at_least("samples", samples, 1)
    seed = _validated_seed(seed)
    arrays = _curve_arrays(teachers_np, levels, coordinated, samples, seed)

    def floats(name: str) -> tuple[float, ...]:
        return tuple(float(v) for v in arrays[name])

    return DiversityCurve(coordinated=coordinated, teachers=teachers_np.shape[0], samples=samples, thresholds=levels,
                          support_size=tuple(int(v) for v in arrays["support_size"]), yield_=floats("yield_"),
                          yield_stderr=floats("yield_stderr"), coverage=floats("coverage"),
                          passing_mass=floats("passing_mass"), passing_mass_stderr=floats("passing_mass_stderr"))


def mean_diversity_curve(queries: torch.Tensor | ArrayLike, thresholds: Iterable[int], coordinated: bool,
                         samples: int = 200, seed: int = 0) -> DiversityCurve:
    """`diversity_curve` averaged over queries (Q, N, V); query q votes with seed query_seed(seed, q)
    whether coordinated or not (paired hot/cold comparisons). support_size is the mean size.

    Args:
        queries: the queries' teacher distributions (Q, N, V).
        thresholds: the thresholds T_k, strictly increasing integers >= 1.
        coordinated: coordinated (hot) or independent (cold) votes.
        samples: the number of voting rounds per query (>= 1).
        seed: the public seed the per-query seeds derive from, in [0, 2^63).

    Returns:
        The DiversityCurve of the means over the Q queries (queries = Q).

    Raises:
        ValueError: if an argument fails its check (teachers as validated_teachers; thresholds not a
            strictly increasing non-empty sequence of integers >= 1; samples < 1; seed not in [0, 2^63)).
    """
    queries_np = validated_teachers(queries, name="queries", ndim=3)
    levels = _validated_thresholds(thresholds)
    coordinated = require_bool("coordinated", coordinated)
    samples = require_int_at_least("samples", samples, 1)
    seed = _validated_seed(seed)
    per_query = [_curve_arrays(query, levels, coordinated, samples, query_seed(seed, index))
                 for index, query in enumerate(queries_np)]
    count = len(per_query)

    def mean(name: str) -> tuple[float, ...]:
        return tuple(float(v) for v in np.mean([m[name] for m in per_query], axis=0))

    def pooled_stderr(name: str) -> tuple[float, ...]:
        return tuple(float(v) for v in np.sqrt(np.sum([m[name] ** 2 for m in per_query], axis=0)) / count)

    return DiversityCurve(coordinated=coordinated, teachers=queries_np.shape[1], samples=samples, thresholds=levels,
                          yield_=mean("yield_"), yield_stderr=pooled_stderr("yield_stderr"),
                          coverage=mean("coverage"), support_size=mean("support_size"),
                          passing_mass=mean("passing_mass"), passing_mass_stderr=pooled_stderr("passing_mass_stderr"),
                          queries=count)


# ----------------------------------------------------------------------------------------------
# (tau, beta, gamma)-diversity preservation


@dataclass(frozen=True)
class DiversityPreservation:
    """The (tau, beta, gamma)-diversity-preservation check of Hot PATE (Cohen et al. 2023).

    Transferability: for every token j and grid value q with c_{j,q} = #{i : p_i[j] >= q} >= tau,
    output_law[j] >= beta * (c_{j,q} / n) * q. Correlation: output_law[j] <= gamma * pbar_j for
    every j. transfer_slack = min over constrained (j, q) of output_law[j] - beta c_{j,q} q / n
    (None when no pair is constrained); correlation_slack = min_j gamma pbar_j - output_law[j].
    A condition holds when its slack is >= -tolerance. *_offending: the first MAX_OFFENDING
    violating token ids; *_violations: how many tokens violate.
    """

    tau: int
    beta: float
    gamma: float
    transfer_holds: bool
    correlation_holds: bool
    transfer_slack: float | None
    correlation_slack: float
    transfer_offending: tuple[int, ...]
    correlation_offending: tuple[int, ...]
    transfer_violations: int
    correlation_violations: int

    @property
    def holds(self) -> bool:
        return self.transfer_holds and self.correlation_holds

    def to_dict(self) -> dict[str, object]:
        """Strict JSON-safe dict of the check (json.dumps(allow_nan=False) works).

        Returns:
            The fields and `holds`; slacks as finite floats (transfer_slack None when nothing is
            constrained), offending token ids as lists.

        Raises:
            ValueError: if a slack is not finite.
        """
        return {"tau": self.tau, "beta": self.beta, "gamma": self.gamma, "holds": self.holds,
                "transfer_holds": self.transfer_holds, "correlation_holds": self.correlation_holds,
                "transfer_slack": None if self.transfer_slack is None else _json_float(self.transfer_slack),
                "correlation_slack": _json_float(self.correlation_slack),
                "transfer_offending": list(self.transfer_offending),
                "correlation_offending": list(self.correlation_offending),
                "transfer_violations": self.transfer_violations, "correlation_violations": self.correlation_violations}


def _validated_law(output_law: torch.Tensor | ArrayLike, vocabulary: int, name: str = "output_law") -> FloatArray:
    if hasattr(output_law, "detach"):
        output_law = output_law.detach().cpu().double().numpy()
    try:
        law = np.asarray(output_law, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of probabilities, got {type(output_law).__name__}") from None
    require(law.shape == (vocabulary,), f"{name} must have shape ({vocabulary},), got {law.shape}")
    require(bool(np.all(np.isfinite(law))), f"{name} must be finite (no NaN or inf)")
    require(float(law.min()) >= 0.0, f"{name} must be non-negative, got entry {float(law.min()):g}")
    total = float(law.sum())
    require(total <= 1.0 + TEACHER_SUM_TOLERANCE, f"{name} must sum to <= 1 (the rest is failure), got {total:g}")
    return law


def _required_transfer(teachers: FloatArray, tau: int, beta: float, q_grid: FloatArray | None) -> FloatArray:
    """max over grid q with c_{j,q} >= tau of beta * c_{j,q} / n * q, per token; -inf where none."""
    n, vocabulary = teachers.shape
    if q_grid is None:
        # the binding q for token j is one of its own teacher probabilities (between two of them
        # c_{j,q} is constant and the requirement grows with q), and at the k-th largest value
        # p_(k)[j] the count is >= k, with equality at the last of a tied run: so the maximum over
        # the distinct teacher probabilities is max_{k >= tau} k / n * p_(k)[j] (q = 0 is vacuous)
        if tau > n:
            return np.full(vocabulary, -np.inf)
        ordered = -np.sort(-teachers, axis=0)  # (n, V) descending per token
        ks = np.arange(1, n + 1, dtype=np.float64)[:, None]
        candidates = beta * ks / n * ordered
        candidates[ordered <= 0.0] = -np.inf  # q must be a (positive) teacher probability
        largest: FloatArray = candidates[tau - 1:].max(axis=0)
        return largest
    grid = np.unique(q_grid)  # ascending
    # idx[i, j] = number of grid values <= p_i[j]: teacher i counts towards c_{j, grid[k]} for k < idx
    idx = np.searchsorted(grid, teachers, side="right")
    required = np.full(vocabulary, -np.inf)
    columns = max(1, CHUNK_BYTES // (8 * (grid.size + 1)))
    for start in range(0, vocabulary, columns):
        block = idx[:, start:start + columns]
        width = block.shape[1]
        flat = (np.arange(width, dtype=np.int64)[None, :] * (grid.size + 1) + block).ravel()
        hist = np.bincount(flat, minlength=width * (grid.size + 1)).reshape(width, grid.size + 1)
        counts = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1][:, 1:]  # counts[j, k] = #{i : p_i[j] >= grid[k]}
        values = np.where(counts >= tau, beta * counts / n * grid[None, :], -np.inf)
        required[start:start + width] = values.max(axis=1)
    return required


def diversity_preservation(output_law: torch.Tensor | ArrayLike, teachers: torch.Tensor | ArrayLike, tau: int,
                           beta: float, gamma: float, q_grid: ArrayLike | None = None,
                           tolerance: float = 1e-12) -> DiversityPreservation:
    """Check (tau, beta, gamma)-diversity preservation (Cohen et al. 2023) of `output_law` (V,),
    the aggregator's output probabilities (they may sum to < 1: the rest is failure), for teachers
    (n, V). q ranges over `q_grid` (values in (0, 1]) or, by default, the distinct teacher
    probabilities. See DiversityPreservation for the conditions and the reported slacks.

    Args:
        output_law: the aggregator's output probabilities (V,), summing to <= 1 (within
            TEACHER_SUM_TOLERANCE).
        teachers: the teacher distributions (n, V).
        tau: the count threshold (an integer >= 1).
        beta: the transfer factor, in (0, 1].
        gamma: the correlation factor, >= 1.
        q_grid: the grid of q values, each in (0, 1], or None for the distinct teacher probabilities.
        tolerance: how far below 0 a slack may be and the condition still hold, in [0, 1].

    Returns:
        The DiversityPreservation with both conditions, their slacks and the offending tokens.

    Raises:
        ValueError: if an argument is out of range (teachers as validated_teachers; output_law of
            the wrong shape, not finite, negative or summing to more than 1).
    """
    teachers_np = validated_teachers(teachers)
    n, vocabulary = teachers_np.shape
    law = _validated_law(output_law, vocabulary)
    tau = require_int_at_least("tau", tau, 1)
    beta = require_finite("beta", beta)
    require(0.0 < beta <= 1.0, f"beta must be in (0, 1], got {beta:g}")
    gamma = require_finite("gamma", gamma)
    require(gamma >= 1.0, f"gamma must be >= 1, got {gamma:g}")
    tolerance = require_in_closed("tolerance", tolerance, 0.0, 1.0)
    grid: FloatArray | None = None
    if q_grid is not None:
        grid = np.asarray(q_grid, dtype=np.float64).ravel()
        require(grid.size > 0, "q_grid must be non-empty")
        require(bool(np.all(np.isfinite(grid) & (grid > 0.0) & (grid <= 1.0))), "q_grid values must be in (0, 1]")
    required = _required_transfer(teachers_np, tau, beta, grid)
    constrained = np.isfinite(required)
    transfer_gap = np.where(constrained, law - np.where(constrained, required, 0.0), np.inf)
    transfer_bad = np.flatnonzero(transfer_gap < -tolerance)
    correlation_gap = gamma * mean_teacher(teachers_np) - law
    correlation_bad = np.flatnonzero(correlation_gap < -tolerance)
    return DiversityPreservation(
        tau=tau, beta=beta, gamma=gamma,
        transfer_holds=transfer_bad.size == 0, correlation_holds=correlation_bad.size == 0,
        transfer_slack=float(transfer_gap.min()) if bool(constrained.any()) else None,
        correlation_slack=float(correlation_gap.min()),
        transfer_offending=tuple(int(j) for j in transfer_bad[:MAX_OFFENDING]),
        correlation_offending=tuple(int(j) for j in correlation_bad[:MAX_OFFENDING]),
        transfer_violations=int(transfer_bad.size), correlation_violations=int(correlation_bad.size))


# ----------------------------------------------------------------------------------------------
# aggregator output laws


def targmax_probabilities(counts: ArrayLike, threshold: int) -> FloatArray:
    """TARGMAX_T's output law on one histogram: one-hot at the plurality token (lowest id on ties,
    as `Targmax.aggregate`) when its count is >= T, all zeros (failure) otherwise.

    Args:
        counts: one vote histogram (V,), integer counts.
        threshold: TARGMAX's threshold T (an integer >= 1).

    Returns:
        float64 (V,): one-hot at the plurality token, or all zeros when its count is below T.

    Raises:
        ValueError: if the counts or the threshold fail Targmax's checks.
    """
    histogram = np.asarray(counts)
    token = Targmax(threshold).aggregate(histogram)
    out = np.zeros(histogram.shape[-1] if histogram.ndim else 0, dtype=np.float64)
    if token is not None:
        out[token] = 1.0
    return out


def aggregator_output_law(aggregate_probabilities: Callable[[IntArray], ArrayLike], teachers: torch.Tensor | ArrayLike,
                          coordinated: bool, samples: int, seed: int) -> tuple[FloatArray, FloatArray]:
    """The output law E_votes[aggregate_probabilities(c)] of a histogram aggregator over the votes'
    randomness, and its Monte Carlo standard errors, from `samples` rounds of `vote_draws`.

    aggregate_probabilities maps a histogram (V,) int64 to per-token output probabilities (V,)
    summing to <= 1 (e.g. ThresholdWeightedSampler(T, gamma).probabilities, or
    lambda c: targmax_probabilities(c, T)). Returns (law (V,), stderr (V,)), stderr the sample
    standard deviation / sqrt(samples) (zero when samples = 1).

    Args:
        aggregate_probabilities: maps a histogram (V,) int64 to output probabilities (V,) summing to <= 1.
        teachers: teacher distributions (N, V).
        coordinated: coordinated (hot) or independent (cold) votes.
        samples: the number of voting rounds (>= 1).
        seed: the votes' seed, in [0, 2^63).

    Returns:
        (law, stderr): float64 (V,) each.

    Raises:
        ValueError: if aggregate_probabilities is not callable or returns an invalid law, or an
            argument fails its check (as vote_draws).
    """
    require(callable(aggregate_probabilities), f"aggregate_probabilities must be callable, got {aggregate_probabilities!r}")
    teachers_np = validated_teachers(teachers)
    coordinated = require_bool("coordinated", coordinated)
    samples = require_int_at_least("samples", samples, 1)
    seed = _validated_seed(seed)
    vocabulary = teachers_np.shape[1]
    votes = vote_draws(teachers_np, coordinated, samples, seed)
    total = np.zeros(vocabulary)
    total_sq = np.zeros(vocabulary)
    for counts in _histogram_chunks(votes, vocabulary):
        for row in counts:
            probs = _validated_law(aggregate_probabilities(row), vocabulary, name="aggregate_probabilities(counts)")
            total += probs
            total_sq += probs * probs
    law = total / samples
    variance = np.maximum(total_sq / samples - law ** 2, 0.0) * (samples / (samples - 1) if samples > 1 else 0.0)
    return law, np.sqrt(variance / samples)


# ----------------------------------------------------------------------------------------------
# the public Hot PATE implementation's per-round quantities, and the largest preserved beta


@dataclass(frozen=True)
class VoteStatistics:
    """Per-round vote quantities of the public Hot PATE code (github.com/bencw99/hot-pate), averaged
    over rounds.

    transferred_mass[k]: the mean over rounds of sum_{j : c_j >= T_k} c_j / N, the fraction of votes
    on tokens that pass T_k (that code's `estimate_transfer_mass`; DiversityCurve.passing_mass weighs
    the passing tokens by pbar instead). max_passing_threshold: the mean of max_j c_j, the largest T
    at which a round still passes (what that code's max aggregator returns beside the token);
    margin: the mean of c_(1) - c_(2), the gap between the two largest counts (the quantity
    Papernot et al. 2018's data-dependent bounds depend on). The last two are defined here from the
    paper (Cohen et al. 2023) and that code's outputs: it publishes no function for them.
    """

    thresholds: tuple[int, ...]
    transferred_mass: tuple[float, ...]
    max_passing_threshold: float
    margin: float

    def to_dict(self) -> dict[str, object]:
        """Strict JSON-safe dict of the statistics.

        Returns:
            thresholds (ints), transferred_mass (floats), max_passing_threshold and margin (floats).
        """
        return {"thresholds": [int(t) for t in self.thresholds],
                "transferred_mass": [_json_float(v) for v in self.transferred_mass],
                "max_passing_threshold": _json_float(self.max_passing_threshold), "margin": _json_float(self.margin)}


def vote_statistics(histograms: ArrayLike, thresholds: Iterable[int]) -> VoteStatistics:
    """VoteStatistics of vote histograms (rounds, V), each summing to the same N >= 1.

    Args:
        histograms: (rounds, V) integer vote counts, rounds >= 1, V >= 2, every row summing to N.
        thresholds: the thresholds T_k, strictly increasing integers >= 1.

    Returns:
        The VoteStatistics, means over the rounds.

    Raises:
        ValueError: if the histograms are not a (rounds, V) array of non-negative integers with one
            common positive row sum, or the thresholds are invalid.
    """
    counts = np.asarray(histograms)
    require(counts.ndim == 2 and counts.shape[0] >= 1 and counts.shape[1] >= 2,
            f"histograms must be a (rounds, vocabulary) array with vocabulary >= 2, got shape {counts.shape}")
    require(np.issubdtype(counts.dtype, np.integer), f"histograms must hold integer counts, got {counts.dtype}")
    require(int(counts.min()) >= 0, f"histograms must be non-negative, got a count {int(counts.min())}")
    totals = counts.sum(axis=1)
    require(int(totals.min()) == int(totals.max()) >= 1,
            f"every histogram must count the same N >= 1 votes, got totals from {int(totals.min())} to {int(totals.max())}")
    levels = _validated_thresholds(thresholds)
    voters = float(totals[0])
    ordered = np.sort(counts, axis=1)
    transferred = [float(np.where(counts >= level, counts, 0).sum(axis=1).mean() / voters) for level in levels]
    return VoteStatistics(levels, tuple(transferred), float(ordered[:, -1].mean()),
                          float((ordered[:, -1] - ordered[:, -2]).mean()))


def largest_preserved_beta(output_law: torch.Tensor | ArrayLike, teachers: torch.Tensor | ArrayLike,
                           tau: int, q_grid: ArrayLike | None = None) -> float | None:
    """The largest beta in (0, 1] for which `output_law` meets the transfer condition of (tau, beta,
    gamma)-diversity preservation (Cohen et al. 2023; `diversity_preservation`): the minimum over
    constrained tokens j of output_law[j] / max_q (c_{j,q} / n * q), capped at 1.

    Args:
        output_law: the aggregator's output probabilities (V,), summing to <= 1.
        teachers: the teacher distributions (n, V).
        tau: the count threshold (an integer >= 1).
        q_grid: the grid of q values, each in (0, 1], or None for the distinct teacher probabilities
            (with full-support teachers every token is then constrained at a tiny q).

    Returns:
        The largest such beta (0.0 when some constrained token gets no mass), or None when no token is
        constrained (no tau teachers share a token).

    Raises:
        ValueError: if an argument is out of range (as `diversity_preservation`).
    """
    teachers_np = validated_teachers(teachers)
    law = _validated_law(output_law, teachers_np.shape[1])
    tau = require_int_at_least("tau", tau, 1)
    grid: FloatArray | None = None
    if q_grid is not None:
        grid = np.asarray(q_grid, dtype=np.float64).ravel()
        require(grid.size > 0 and bool(np.all(np.isfinite(grid) & (grid > 0.0) & (grid <= 1.0))),
                "q_grid must be non-empty with values in (0, 1]")
    required = _required_transfer(teachers_np, tau, 1.0, grid)
    constrained = np.isfinite(required)
    if not bool(constrained.any()):
        return None
    return float(min(1.0, float((law[constrained] / required[constrained]).min())))
