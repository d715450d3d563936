"""The epsilon bracket of an audited run: a certified lower bound beside the claim (the upper bound).

For each tested neighbouring pair the trace gives the mechanism's exact per-step output law under
the actual ensemble and under the neighbour (the payload or the models hold the logits; the
mechanism's randomness is independent across steps and, teacher-forced, its queries are fixed), so
the pair's privacy loss distribution composes exactly (dpledger.accounting.loss_distribution): its
epsilon(delta) is a certified lower bound on any epsilon that covers the pair. The claim must be at
least every such bound; the ratio claim / lower bound is how tight the audit shows the claim to be.

Which pairs (the strongest the audit can build, chosen by the RDP ablation's ranking):
- PMixED (and AdaPMixED without screening): each removed teacher the ablation ranks highest, and
  added point-mass teachers (projected like any teacher, on the run's own ball);
- AdaPMixED with screening: added teachers that leave the screen's law unchanged (on the public
  model's top-k tokens K they equal the ensemble's raw mean, so the screened mean is the same) and
  put the rest of their mass where the adversary chooses. Then the released (decision, token) law is
  pi [p, p0] versus pi [p_+, p0] with the same pass probability pi, and replacing pi by a smaller
  pi_low is a post-processing of both laws (with probability 1 - pi_low / pi, relabel a pass as a
  fail with a fresh public token), so the pair with pi_low has a smaller profile (data processing).
  pi_low is a one-sided Clopper-Pearson bound at confidence 1 - (1 - confidence) / T per step
  (Bonferroni over the T steps): the bound holds with probability at least `confidence` over the
  audit's Monte Carlo. (The two screened means are equal in exact arithmetic, as the mechanism is
  defined; like every privacy analysis, the bound is for that mechanism, not for its floats.)
- Hot PATE DPARGMAX (released-output accounting): conditioned on the shared randomness (public in the
  analysis), each step's histogram is known, and the released law (fail, or a token) is exact up to
  the GNMax quadrature's estimated relative error (dpledger.mechanisms.voting.gnmax_log_output_law), which
  is allowed for ten times over: the first law's masses are lowered and the second's raised by it,
  which can only lower the profile. Neighbours: the teachers the ablation found leakiest removed or
  replaced (their vote moved, per step, to the token that moves the law most), and a teacher added
  (its vote, per step, on that token). DPWS's released law is a V-dimensional integral: not
  bracketed; realised-path accounting bounds no released law: not bracketed (the audit says so).
Only the pairs of the claimed relation count towards the bracket (a remove-one claim says nothing
about added teachers).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import torch

from dpledger.accounting.loss_distribution import LossDistribution, RunningComposition
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.audit.checks import CheckResult, failed, skipped, verdict
from dpledger.audit.loader import LoadedTrace, WindowData
from dpledger.audit.ablation import clopper_pearson, ensemble_output, monte_carlo_seed, screen_pass_counts
from dpledger.audit.voting import _candidates, _mechanism, window_votes
from dpledger.mechanisms.add_one import add_one_adversary
from dpledger.mechanisms.hot_pate import DPWS_MAX_SAMPLES, DPWS_SAMPLES, DPWS_WORK, dpws_draws, dpws_law_bounds  # noqa: F401
from dpledger.mechanisms.kernels import sums_without_each
from dpledger.mechanisms.ball import Ball
from dpledger.mechanisms.pmixed import PMixED
from dpledger.mechanisms.screening import NoisyScreening
from dpledger.mechanisms.voting import renyi_divergence_of_log_laws

VOTING_LAW_ALLOWANCE = 10.0
"""A voting law's stated relative numerical error is allowed for this many times over."""
PAIRS_TESTED = 3
"""How many of the ablation's strongest neighbours of each claimed move get an exact lower bound."""
CONFIDENCE = 0.95
"""Confidence of a screened run's lower bound (its pass probabilities are Monte Carlo estimates)."""
BIAS_FRACTION = 0.005
"""Rounding each step's loss down to the grid lowers the composed loss by at most steps * interval:
the interval is chosen so that this is at most this fraction of the pair's (RDP-converted) epsilon."""


@dataclass(frozen=True)
class Pair:
    """A neighbour of the actual ensemble: `move` "remove" or "replace" (teacher `index`), or "add"
    (rule `index`)."""

    move: str
    index: int
    label: str

    @property
    def relation(self) -> NeighbouringRelation:
        return {"remove": NeighbouringRelation.REMOVE_ONE, "add": NeighbouringRelation.ADD_ONE,
                "replace": NeighbouringRelation.REPLACE_ONE, "constructed-remove": NeighbouringRelation.REMOVE_ONE,
                "constructed-add": NeighbouringRelation.ADD_ONE}[self.move]


PairLosses = dict[Pair, tuple[LossDistribution | None, LossDistribution | None]]
"""A window's composed privacy loss distributions (forward, backward) per pair; None where no step of
the window was charged (every step refused by the privacy filter)."""


class _BracketRow(TypedDict):
    delta: float
    upper: float                  # the claimed epsilon at delta
    claimed_by: str               # what the claim is: ledger.json's epsilon or the privacy filter's budget
    lower: float                  # the certified lower bound
    ratio: float
    neighbour: str | None         # the pair attaining the lower bound
    relation: str | None
    discretisation: float         # how far rounding the losses down lowered the pair's composed loss


CONSTRUCTED_RULES = (1, 2)
"""The ADDED_RULES a constructed ensemble's one private teacher follows (the output-based rule is the
public-based one there: every other teacher is the public law)."""


def _mixed(public: torch.Tensor, teachers: torch.Tensor, lambdas: torch.Tensor) -> torch.Tensor:
    return lambdas.unsqueeze(-1) * teachers + (1 - lambdas.unsqueeze(-1)) * public.unsqueeze(-2)


def _projected(params: dict, laws: torch.Tensor, public: torch.Tensor) -> torch.Tensor:
    """Added teachers (L, A, V) projected as the mechanism projects any teacher (its own solver)."""
    projection = PMixED(params["alpha"], params["beta"], 1, ball=params.get("ball", Ball.PROJECTION_ORDER.value))
    lambdas = projection.mixing_weights_tensor(laws, public)
    return lambdas.unsqueeze(-1) * laws + (1 - lambdas.unsqueeze(-1)) * public.unsqueeze(-2)


ADDED_RULES = ("rest of the mass on the token the output likes least",
               "rest of the mass on the token the public model likes least",
               "rest of the mass on the public model's top token")


def _added_raw_teachers(output: torch.Tensor, public: torch.Tensor, keep: torch.Tensor | None,
                        kept_values: torch.Tensor | None) -> torch.Tensor:
    """(L, 3, V) raw added teachers: point masses by ADDED_RULES, or, with `keep` (L, V) bool and
    `kept_values` (L, V), the kept values on the kept tokens and the rest of the mass on the token
    the rule picks among the others."""
    length, vocab = public.shape
    allowed = torch.ones_like(public, dtype=torch.bool) if keep is None else ~keep
    big = torch.finfo(torch.float64).max
    tokens = torch.stack([torch.where(allowed, output, big).argmin(-1), torch.where(allowed, public, big).argmin(-1),
                          torch.where(allowed, public, -big).argmax(-1)], dim=-1)          # (L, 3)
    kept = None
    if keep is not None:
        if kept_values is None:
            raise RuntimeError("kept_values come with keep")
        kept = kept_values * keep
    rest = torch.ones(length, dtype=torch.float64) if kept is None else 1.0 - kept.sum(-1)
    laws = torch.zeros((length, 3, vocab), dtype=torch.float64)
    if kept is not None:
        laws += kept.unsqueeze(1)
    laws.scatter_add_(-1, tokens.unsqueeze(-1), rest.clamp_min(0.0).reshape(length, 1, 1).expand(-1, 3, 1))
    return laws


ADVERSARY_LABELS = ("add-one: optimised adversary for D(p_+ || p) at the claim's order (dpledger.mechanisms.add_one)",
                    "add-one: optimised adversary for D(p || p_+) at the claim's order (dpledger.mechanisms.add_one)")


def _adversary(params: dict, output: torch.Tensor, public: torch.Tensor, teachers: int, order: float) -> dict:
    """dpledger.mechanisms.add_one.add_one_adversary on the window's steps at one order (its cost is the
    dual's, which runs with add_one_dual = true charge anyway)."""
    pmixed = PMixED(params["alpha"], params["beta"], teachers, ball=params.get("ball", Ball.PROJECTION_ORDER.value))
    return add_one_adversary(output.numpy(), public.numpy(), teachers, np.asarray([order]), *pmixed.one_order_ball,
                             constraints=pmixed.ball_constraints)


def _log(law: torch.Tensor) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(law.clamp_min(0.0).numpy())


def bracket_window(trace: LoadedTrace, records: list[dict], logits: torch.Tensor, pairs: list[Pair],
                   intervals: list[float], mc_samples: int, seed: int, steps_total: int,
                   adversary_order: float | None = None) -> PairLosses:
    """One window's composed loss distributions (forward, backward) per pair: a small partial, combined
    in step order by the caller.

    Args:
        trace: the loaded run (its mechanism type and parameters).
        records: the window's per-step records.
        logits: (N+1, L, V) the window's logits, public model first, or its bounded vote payload.
        pairs: the neighbours to bracket (PMixED / AdaPMixED pairs).
        intervals: each pair's loss grid interval (losses are rounded down to it).
        mc_samples: Monte Carlo draws per step for a screened run's pass probability.
        seed: the audit's seed (monte_carlo_seed gives the window's).
        steps_total: the run's step count (the union bound over steps).
        adversary_order: the order the optimised add-one adversary targets; needed only for its pairs.

    Returns:
        PairLosses: per pair, (forward, backward) loss distributions composed over the window's
        charged steps, None where the privacy filter refused every step.

    Raises:
        RuntimeError: if the window's pairs and their values disagree (an internal invariant).
    """
    public, teachers = trace.window_distributions(logits)
    length, n = public.shape[0], teachers.shape[-2]
    lambdas = (torch.ones(teachers.shape[:-1], dtype=torch.float64) if trace.mechanism_type == "ensemble"
               else torch.tensor([r["lambdas"] for r in records], dtype=torch.float64))
    params, rate = trace.params, trace.params.get("sample_rate")
    mixed = _mixed(public, teachers, lambdas)
    total = mixed.sum(dim=-2)
    output = ensemble_output(total, torch.full((length,), n), public, rate)
    screened = trace.mechanism_type == "adapmixed" and params.get("screening", True)
    if screened:
        screening = NoisyScreening(teachers=1, lam=params["lam"], sigma=params["sigma"], alpha=params["alpha"],
                                   threshold=params["threshold"], top_k=int(params["top_k"]))
        top = screening.top_indices(public)
        keep = torch.zeros_like(public, dtype=torch.bool).scatter_(-1, top, True)
        raw_mean = teachers.mean(dim=-2)
        added_raw = _added_raw_teachers(output, public, keep, raw_mean)
        generator = torch.Generator().manual_seed(monte_carlo_seed(seed, records[0]["step"]))
        passes = screen_pass_counts(teachers.sum(dim=-2).unsqueeze(1), torch.full((length, 1), n), public, params,
                                    mc_samples, generator)[:, 0].numpy()
        # one-sided at 1 - (1 - CONFIDENCE) / T per step: a union bound over the run's T steps
        lows, _ = clopper_pearson(passes, mc_samples, 1.0 - 2.0 * (1.0 - CONFIDENCE) / steps_total)
        pass_low = np.asarray(lows, dtype=np.float64)
        neighbour_laws: dict[Pair, torch.Tensor] = {}
        for pair in pairs:
            added = _projected(params, added_raw[:, pair.index:pair.index + 1], public)[:, 0]
            neighbour_laws[pair] = ensemble_output(total + added, torch.full((length,), n + 1), public, rate)
    else:
        removed = [p.index for p in pairs if p.move == "remove"]
        without = sums_without_each(mixed)[:, torch.tensor(removed, dtype=torch.long)] if removed else None
        added_raw = _added_raw_teachers(output, public, None, None)
        neighbour_laws = {}
        actual_laws: dict[Pair, torch.Tensor] = {}
        adversary = None
        for pair in pairs:
            if pair.move == "remove":
                if without is None:
                    raise RuntimeError("a removed pair is among `removed`")
                neighbour_total = without[:, removed.index(pair.index)]
                neighbour_laws[pair] = ensemble_output(neighbour_total, torch.full((length,), n - 1), public, rate)
            elif pair.move == "add" and pair.index >= len(ADDED_RULES):
                # the primal adversary of the add-one bound at the claim's order (dpledger.mechanisms.add_one): its q
                # is PMixED's projection of an added teacher, so a legitimate neighbour
                direction = ("q_forward", "q_reverse")[pair.index - len(ADDED_RULES)]
                if adversary is None:
                    if adversary_order is None:
                        raise RuntimeError("the optimised adversary's pairs come with its order")
                    adversary = _adversary(params, output, public, n, adversary_order)
                added = torch.from_numpy(np.ascontiguousarray(adversary[direction][:, 0]))
                neighbour_laws[pair] = ensemble_output(total + added, torch.full((length,), n + 1), public, rate)
            elif pair.move.startswith("constructed"):
                # another dataset: N - 1 (resp. N) teachers at the public law, one teacher at the ball's edge
                edge = _projected(params, added_raw[:, pair.index:pair.index + 1], public)[:, 0]
                rest = (n - 1) * public if pair.move == "constructed-remove" else n * public
                with_edge = ensemble_output(rest + edge, torch.full((length,), n), public, rate) \
                    if pair.move == "constructed-remove" else \
                    ensemble_output(rest + edge, torch.full((length,), n + 1), public, rate)
                plain = ensemble_output(rest, torch.full((length,), n - 1 if pair.move == "constructed-remove"
                                                         else n), public, rate)
                actual_laws[pair], neighbour_laws[pair] = ((with_edge, plain) if pair.move == "constructed-remove"
                                                           else (plain, with_edge))
            else:
                added = (added_raw[:, pair.index] if trace.mechanism_type == "ensemble"
                         else _projected(params, added_raw[:, pair.index:pair.index + 1], public)[:, 0])
                neighbour_laws[pair] = ensemble_output(total + added, torch.full((length,), n + 1), public, rate)
    refused = np.asarray([bool(r.get("budget_refused")) for r in records])
    partial: PairLosses = {}
    for pair, interval in zip(pairs, intervals):
        forward, backward = RunningComposition(), RunningComposition()   # O(log steps) distributions alive
        neighbour = neighbour_laws[pair]
        first = output if screened else actual_laws.get(pair, output)
        for row in range(length):
            if refused[row]:  # answered publicly by the filter: the same law under every neighbour
                continue
            if screened:
                # (decision, token): pass_low [p, p0] and pass_low [p_+, p0] with a common fail mass
                low = float(pass_low[row])
                actual = np.concatenate([_log(output[row] * low), [math.log1p(-low) if low < 1 else -math.inf]])
                other = np.concatenate([_log(neighbour[row] * low), [math.log1p(-low) if low < 1 else -math.inf]])
            else:
                actual, other = _log(first[row]), _log(neighbour[row])
            forward.add(LossDistribution.from_log_laws(actual, other, interval))
            backward.add(LossDistribution.from_log_laws(other, actual, interval))
        partial[pair] = (forward.result(), backward.result())
    return partial


def voting_bracket_window(trace: LoadedTrace, records: list[dict], logits: WindowData, pairs: list[Pair],
                          intervals: list[float], seed: int, steps_total: int) -> PairLosses:
    """One window's composed loss distributions (forward, backward) per voting pair (DPARGMAX and
    DPWS, released output): removed and replaced teachers by index, an added vote. DPWS's laws are
    bounded by Monte Carlo over dpws_draws(...) draws a step.

    Args:
        trace: the loaded run (a voting run).
        records: the window's per-step records (their vote seeds).
        logits: (N+1, L, V) the window's logits, public model first, or its bounded vote payload.
        pairs: the neighbours to bracket ("remove", "replace" or "add").
        intervals: each pair's loss grid interval.
        seed: the audit's seed (monte_carlo_seed gives each step's, for DPWS).
        steps_total: the run's step count (the union bound over steps).

    Returns:
        PairLosses: per pair, (forward, backward) loss distributions composed over the window's
        charged steps, None where every step was refused.
    """
    mechanism = _mechanism(trace)
    votes, counts = window_votes(trace, records, logits)
    steps = {pair: (RunningComposition(), RunningComposition()) for pair in pairs}   # O(log steps) alive
    two = np.array([2.0])
    aggregator = mechanism.aggregator
    sampled = not aggregator.exact_law   # DPWS: its law bounded analytically and by Monte Carlo

    def bounds(histogram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(log lower, log upper) bounds on the released law: DPWS's analytic bounds (the neighbour's
        choice only), or DPARGMAX's law with its stated numerical error allowed for
        VOTING_LAW_ALLOWANCE times over."""
        if sampled:
            low, high = aggregator.output_law_bounds(histogram)
            return _log(torch.from_numpy(low)), _log(torch.from_numpy(high))
        log_fail, log_release, error = mechanism.log_output_law(histogram)
        allowance = math.log1p(VOTING_LAW_ALLOWANCE * error + 1e-12)
        central = np.concatenate([[log_fail], log_release])
        return central - allowance, np.minimum(central + allowance, 0.0)   # no probability exceeds 1

    def law(histogram: np.ndarray) -> np.ndarray:
        """The law a neighbour is chosen by (any choice gives a valid bound): DPWS's bounds' midpoint."""
        low, high = bounds(histogram)
        if not sampled:
            return 0.5 * (low + high)
        middle = 0.5 * (np.exp(low) + np.exp(high))
        with np.errstate(divide="ignore"):
            return np.log(middle / middle.sum())

    for row, record in enumerate(records):
        if record.get("budget_refused"):  # answered publicly by the filter: the same law under every neighbour
            continue
        actual = law(counts[row])

        def moved(histogram: np.ndarray, remove: int | None, actual: np.ndarray = actual) -> np.ndarray | None:
            """The law after adding a vote on the candidate token that moves it most (order 2, both
            directions) away from `actual`, with the vote of `remove` taken out first (a replacement), or not."""
            base = histogram.copy()
            if remove is not None:
                base[remove] -= 1
            best, best_histogram = -1.0, None
            for token in _candidates(histogram):
                if token == remove:
                    continue
                neighbour = base.copy()
                neighbour[token] += 1
                other = law(neighbour)
                score = float(max(renyi_divergence_of_log_laws(actual, other, two)[0],
                                  renyi_divergence_of_log_laws(other, actual, two)[0]))
                if score > best:
                    best, best_histogram = score, neighbour
            return best_histogram

        neighbours = []
        for pair in pairs:
            if pair.move == "remove":
                neighbour = counts[row].copy()
                neighbour[votes[row, pair.index]] -= 1
            elif pair.move == "replace":
                neighbour = moved(counts[row], int(votes[row, pair.index]))
            else:
                neighbour = moved(counts[row], None)
            neighbours.append(neighbour)
        if sampled:  # every law of the step bounded at once, each from its own draws
            histograms = np.stack([counts[row], *neighbours])
            generator = torch.Generator().manual_seed(monte_carlo_seed(seed, int(record["step"])))
            eta = (1.0 - CONFIDENCE) / (steps_total * histograms.shape[0] * (histograms.shape[1] + 1) * 2)
            low, high = aggregator.sampled_law_bounds(histograms, generator, eta)
            laws = [(_log(torch.from_numpy(lo)), _log(torch.from_numpy(hi))) for lo, hi in zip(low, high)]
        else:
            laws = [bounds(h) for h in [counts[row], *neighbours]]
        actual_low, actual_high = laws[0]
        for pair, interval, (other_low, other_high) in zip(pairs, intervals, laws[1:]):
            forward, backward = steps[pair]
            # the first law's lower bounds against the second's upper bounds: the profile only drops
            forward.add(LossDistribution.from_log_laws(actual_low, other_high, interval))
            backward.add(LossDistribution.from_log_laws(other_low, actual_high, interval))
    return {pair: (forward.result(), backward.result()) for pair, (forward, backward) in steps.items()}


def _voting_pairs(trace: LoadedTrace, evidence: dict, claimed: NeighbouringRelation) -> tuple[list[Pair], list[float]]:
    """The leakiest removed (or replaced) teachers and an added vote, with their ablation epsilons."""
    per_teacher = evidence.get("per_teacher_removed_epsilon") or []
    ranked = sorted(range(len(per_teacher)), key=lambda i: -per_teacher[i])[:PAIRS_TESTED]
    relations = evidence.get("relations", {})
    pairs, estimates = [], []
    if "remove" in claimed.moves:
        pairs += [Pair("remove", i, f"teacher {i} removed") for i in ranked]
        estimates += [per_teacher[i] for i in ranked]
    if "replace" in claimed.moves:
        pairs += [Pair("replace", i, f"teacher {i} replaced (its vote moved where it moves the law most)")
                  for i in ranked]
        estimates += [relations.get("replace_one", {}).get("empirical_epsilon", 1.0)] * len(ranked)
    if "add" in claimed.moves:
        pairs.append(Pair("add", 0, "a teacher added, voting where it moves the law most"))
        estimates.append(relations.get("add_one", {}).get("empirical_epsilon", 1.0))
    return pairs, estimates


def _filter_guarantee(trace: LoadedTrace, delta: float) -> float | None:
    """The epsilon a privacy filter guarantees at `delta`, where the run has one that is a guarantee:
    charged the data-independent step bound (not data-dependent losses, not realised-path charges),
    so every step's charge is fixed by the configuration (Feldman & Zrnic 2021, Theorem 3.1), and
    its delta is at most `delta`. None otherwise."""
    budget = trace.manifest.get("budget") or {}
    if (not budget or budget.get("data_dependent") or budget.get("charging") == "realised-path"
            or not delta >= float(budget.get("delta", math.inf))):
        return None
    return float(budget["epsilon"])


def _claimed_epsilons(trace: LoadedTrace) -> list[dict]:
    return [e for e in trace.ledger.get("epsilon", []) if isinstance(e, dict) and e.get("method") == "improved"]


def _constructed_pairs(trace: LoadedTrace, claimed: NeighbouringRelation, screened: bool) -> tuple[list[Pair],
                                                                                                   list[float]]:
    """For a data-independent claim (it must hold for every dataset, not only the run's): datasets
    built on the run's public laws, N - 1 teachers at the public law and one at the ball's edge, that
    one removed; or N at the public law and one added at the edge. A teacher is any function of its
    context, so each step may place it anew (PMixED projects it like any other). Sized by the claim."""
    if screened or trace.mechanism_type != "pmixed" or trace.ledger.get("data_dependent"):
        return [], []
    scale = max((float(c["epsilon"]) for c in _claimed_epsilons(trace)
                 if isinstance(c.get("epsilon"), (int, float)) and math.isfinite(c["epsilon"])), default=1.0)
    pairs = []
    for index in CONSTRUCTED_RULES:
        rule = ADDED_RULES[index].replace("rest of the mass", "all its mass")
        if "remove" in claimed.moves and trace.n_teachers >= 2:
            pairs.append(Pair("constructed-remove", index, f"constructed dataset: N - 1 teachers at the public law, "
                                                           f"one with {rule} (projected), that one removed"))
        if "add" in claimed.moves:
            pairs.append(Pair("constructed-add", index, f"constructed dataset: N teachers at the public law, one "
                                                        f"added with {rule} (projected)"))
    return pairs, [scale] * len(pairs)


def _adversary_order(trace: LoadedTrace, claims: list[dict], claimed: NeighbouringRelation,
                     screened: bool) -> float | None:
    """The order the optimised add-one adversary targets (the claim's optimal order at its first
    delta), where it is built: unscreened, unsampled runs that charged the dual (add_one_dual), whose
    cost it shares; None elsewhere."""
    if (screened or "add" not in claimed.moves or not trace.params.get("add_one_dual")
            or trace.params.get("sample_rate") is not None):
        return None
    order = claims[0].get("order") if claims else None
    return float(order) if isinstance(order, (int, float)) and math.isfinite(order) else None


def _mixture_pairs(evidence: dict, claimed: NeighbouringRelation, screened: bool) -> tuple[list[Pair], list[float]]:
    """PMixED / AdaPMixED: the removed teachers the ablation ranks highest and the added teachers,
    with the ablation's epsilons (to size the loss grid)."""
    ranked = sorted((row for row in evidence["per_neighbour"] if claimed.covers(NeighbouringRelation(row["relation"]))),
                    key=lambda row: -row["empirical_epsilon"])
    pairs, estimates = [], []
    if "remove" in claimed.moves and not screened:
        for row in [r for r in ranked if r["neighbour"].startswith("remove teacher ")][:PAIRS_TESTED]:
            pairs.append(Pair("remove", int(row["neighbour"].split()[-1]), row["neighbour"]))
            estimates.append(row["empirical_epsilon"])
    if "add" in claimed.moves:
        scale = max((r["empirical_epsilon"] for r in ranked if not r["neighbour"].startswith("remove")), default=1.0)
        prefix = "add-one, screen unchanged: " if screened else "add-one: "
        pairs += [Pair("add", index, prefix + rule) for index, rule in enumerate(ADDED_RULES)]
        estimates += [scale] * len(ADDED_RULES)
    return pairs, estimates


def check_epsilon_bracket(trace: LoadedTrace, ablation_evidence: dict, mc_samples: int = 400,
                          seed: int = 0) -> CheckResult:
    """For each requested delta: the claim (upper: ledger.json's epsilon, or a privacy filter's budget
    where that is smaller and a guarantee, `_filter_guarantee`), a certified lower bound on
    epsilon(delta) from the strongest tested neighbours of the claimed relation, their ratio and the
    neighbour attaining it.
    FAILs when a lower bound exceeds the claim (the claim under-states).

    Args:
        trace: the loaded run; its per-step distributions are read window by window.
        ablation_evidence: the neighbour ablation's evidence, whose ranking chooses the pairs.
        mc_samples: Monte Carlo draws per step for a screened run's pass probability.
        seed: seeds the Monte Carlo.

    Returns:
        The "epsilon_bracket" CheckResult: SKIPPED where no certified lower bound is built (the reason
        given); FAIL without an improved epsilon in ledger.json or where a lower bound exceeds the
        claim (relative slack 1e-9); else PASS with per delta [lower, upper] and their ratio.
    """
    kind = trace.mechanism_type
    if kind == "public":
        return skipped("epsilon_bracket", "the public model alone reads no teacher: its epsilon is 0 exactly")
    voting = kind == "voting"
    if voting and not _mechanism(trace).aggregator.differentially_private:
        return skipped("epsilon_bracket", f"no certified lower bound for {trace.params.get('aggregator')}: it claims "
                                          "no DP epsilon (T-threshold privacy only)")
    if trace.params.get("accounting") == "realised-path" and (voting or trace.params.get("screening", True)):
        if (trace.manifest.get("budget") or {}).get("charging") == "realised-path":
            return skipped("epsilon_bracket", "realised-path charges inside a privacy filter: the guarantee is the "
                                              "budget's, and where the filter stops depends on the released screen "
                                              "decisions, whose laws differ between neighbours; the budget is not "
                                              "bracketed (the steps' laws are not a fixed product)")
        return skipped("epsilon_bracket", "realised-path accounting is an ex-post statement that bounds no released "
                                          "law (docs/soundness.md): there is no epsilon(delta) claim to bracket")
    if kind not in ("pmixed", "adapmixed", "voting"):
        return skipped("epsilon_bracket", f"no certified lower bound is built for {kind} runs")
    if trace.manifest["data"]["stream"] != "teacher-forced":
        return skipped("epsilon_bracket", "free generation: each step's query depends on the earlier outputs, so "
                                          "the steps' laws are not a product and the composition is not exact")
    if not ablation_evidence or ("per_neighbour" not in ablation_evidence
                                 and "per_teacher_removed_epsilon" not in ablation_evidence):
        return skipped("epsilon_bracket", "the neighbour ablation did not run (its ranking chooses the pairs)")
    claims = _claimed_epsilons(trace)
    if not claims:
        return failed("epsilon_bracket", "ledger.json states no improved epsilon: there is no claim to bracket")
    claimed_relation = NeighbouringRelation(trace.manifest["relation"])
    screened = kind == "adapmixed" and trace.params.get("screening", True)
    if voting:
        pairs, estimates = _voting_pairs(trace, ablation_evidence, claimed_relation)
    else:
        pairs, estimates = _mixture_pairs(ablation_evidence, claimed_relation, screened)
        built, built_estimates = _constructed_pairs(trace, claimed_relation, screened)
        pairs, estimates = pairs + built, estimates + built_estimates
        adversary_order = _adversary_order(trace, claims, claimed_relation, screened)
        if adversary_order is not None:
            scale = max((e for p, e in zip(pairs, estimates) if p.move == "add"), default=1.0)
            pairs += [Pair("add", len(ADDED_RULES) + i, label) for i, label in enumerate(ADVERSARY_LABELS)]
            estimates += [scale, scale]
    if not pairs:
        return skipped("epsilon_bracket", f"a screened AdaPMixED run claimed for {claimed_relation.label}: removing a "
                                          "teacher changes the screen's pass probability, which has no closed form, "
                                          "so only added teachers that leave it unchanged are bracketed")
    steps = max(1, trace.steps)
    intervals = [float(np.clip(BIAS_FRACTION * max(estimate, 1.0) / steps, 1e-6, 1e-2))
                 if math.isfinite(estimate) else 1e-2 for estimate in estimates]
    composed = {pair: (RunningComposition(), RunningComposition()) for pair in pairs}  # memory: O(log windows)
    dpws = voting and not _mechanism(trace).aggregator.exact_law   # its law bounded by Monte Carlo
    windows = (trace.map_windows(voting_bracket_window, pairs, intervals, seed, steps,
                                 desc="epsilon bracket") if voting else
               trace.map_windows(bracket_window, pairs, intervals, mc_samples, seed, steps, adversary_order,
                                 desc="epsilon bracket"))
    for _, window in windows:
        for pair, (forward, backward) in window.items():
            if forward is not None and backward is not None:   # None together: no step of the window charged
                composed[pair][0].add(forward)
                composed[pair][1].add(backward)
    totals = {pair: (forward.result(), backward.result()) for pair, (forward, backward) in composed.items()}
    rows: list[_BracketRow] = []
    for claim in claims:
        delta = float(claim["delta"])
        best, best_pair, rounding = 0.0, None, 0.0
        for pair in pairs:
            forward, backward = totals[pair]
            if forward is None or backward is None:   # None together: no step was charged
                continue
            lower = max(forward.epsilon(delta), backward.epsilon(delta))
            if lower > best:
                best, best_pair, rounding = lower, pair, max(forward.rounding, backward.rounding)
        upper = float(claim["epsilon"]) if claim.get("epsilon") is not None else math.inf
        filtered = _filter_guarantee(trace, delta)
        claimed_by = "ledger.json's epsilon"
        if filtered is not None and filtered < upper:
            upper, claimed_by = filtered, "the privacy filter's budget"
        rows.append({"delta": delta, "upper": upper, "claimed_by": claimed_by, "lower": best,
                     "ratio": (upper / best) if best > 0 else math.inf,
                     "neighbour": best_pair.label if best_pair else None,
                     "relation": best_pair.relation.value if best_pair else None,
                     "discretisation": rounding})
    exceeded = [r for r in rows if r["lower"] > r["upper"] * (1 + 1e-9)]
    confidence = (f"; with probability >= {CONFIDENCE:g} over the audit's screening Monte Carlo ({mc_samples} draws "
                  "a step, Clopper-Pearson with a union bound over the steps)") if screened else \
        (f"; with probability >= {CONFIDENCE:g} over the audit's Monte Carlo of DPWS's law "
         f"({_mechanism(trace).aggregator.sampled_law_draws(len(pairs) + 1, int(trace.manifest['vocab_size']))} "
         "draws a step, empirical Bernstein "
         "with a union bound over steps, laws and outcomes)") if dpws else ""
    text = "; ".join(f"delta {r['delta']:g}: epsilon in [{r['lower']:.4g}, {r['upper']:.4g}] (ratio "
                     f"{r['ratio']:.3g}, lower bound from {r['neighbour'] or 'no pair'}"
                     + ("; upper: the privacy filter's budget" if r["claimed_by"] != "ledger.json's epsilon" else "")
                     + ")" for r in rows)
    evidence = {"rows": rows, "claimed_relation": claimed_relation.value, "pairs": [p.label for p in pairs],
                "confidence": CONFIDENCE if screened or dpws else 1.0,
                "method": "exact per-step output laws of each pair, privacy loss distributions composed with losses "
                          "rounded down (dpledger.accounting.loss_distribution): a certified lower bound on epsilon(delta); "
                          "`discretisation` bounds how far the rounding lowered the pair's composed loss"}
    return verdict("epsilon_bracket", not exceeded,
                   f"{claimed_relation.label}: {text}{confidence}",
                   "the claim under-states: " + "; ".join(
                       f"at delta {r['delta']:g} {r['neighbour']} has epsilon >= {r['lower']:.4g} > claimed "
                       f"{r['upper']:.4g}" for r in exceeded) + confidence, **evidence)

