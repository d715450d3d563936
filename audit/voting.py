"""Audit checks of a voting (Hot PATE) run.

Conditioned on the public shared randomness, a step's vote histogram is a deterministic function of
the teachers' distributions (Cohen et al. 2023), so for every neighbouring ensemble the audit can
rebuild the neighbouring histogram and the aggregator's exact output law on it:
- remove teacher i: its vote leaves the histogram; add a teacher: one vote for a token of the
  adversary's choosing (the worst one, every step); replace teacher i: its vote moves to the worst
  token. Candidate tokens are the voted ones and the lowest-index unvoted one (every unvoted token
  is alike to the aggregators, except TARGMAX's tie-break towards the lowest index).
- every aggregator with an exact law (VoteAggregator.exact_law) gives it on any histogram: TARGMAX and
  TWS in closed form, DPARGMAX's answer law is GNMax's, a one-dimensional integral
  (dpledger.mechanisms.pate.gnmax_log_output_law, error stated); one without (DPWS's is a V-dimensional
  integral) is measured on what it post-processes (VoteAggregator.surrogate_divergence, an upper bound
  on the released law's divergence), and the sampled audit estimates the released law.
Per-step divergences (both directions) are composed per neighbour and converted like the claim.
"""
from __future__ import annotations

import math
import warnings
from typing import TypedDict

import numpy as np
from scipy.stats import beta as beta_distribution

from dpledger.accounting.conversion import epsilon_from_rdp
from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.audit.checks import CheckResult, failed, skipped, verdict
from dpledger.audit.loader import DATA_DEPENDENT_FILTER, LoadedTrace, WindowData
from dpledger.decoding.ensemble import Ensemble
from dpledger.decoding.runners import voting_mechanism
from dpledger.decoding.vote_payload import VotePayload, certify_votes
from dpledger.mechanisms.randomness import seed_commitment, vote_seed
from dpledger.accounting.relation import PathAccounting
from dpledger.mechanisms.voting import VotingMechanism, histograms, renyi_divergence_of_log_laws

def _mechanism(trace: LoadedTrace) -> VotingMechanism:
    return voting_mechanism(trace.params, trace.n_teachers, trace.manifest["relation"])


def window_votes(trace: LoadedTrace, records: list[dict], window: WindowData) -> tuple[np.ndarray, np.ndarray]:
    """The window's votes (W, N) and histograms (W, V): recomputed from the teachers' distributions
    with the recorded vote seeds, or read from a bounded payload's certified race entries
    (dpledger.decoding.vote_payload.certify_votes; the replay check FAILs a step whose certificate fails).

    Args:
        trace: the loaded run (a voting run).
        records: the window's records (their vote seeds).
        window: the window's logits (N+1, W, V) or its bounded vote payload.

    Returns:
        (votes (W, N), counts (W, V)), int64.
    """
    mechanism = _mechanism(trace)
    seeds = [record["vote_seed"] for record in records]
    if isinstance(window, VotePayload):
        votes, _ = certify_votes(window, seeds, mechanism.coordination, int(trace.manifest["vocab_size"]))
        return votes, histograms(votes, int(trace.manifest["vocab_size"]))
    _, teachers = Ensemble.split_distributions(window)
    return mechanism.histograms(teachers, seeds)


def check_shared_randomness(trace: LoadedTrace) -> CheckResult:
    """Every step's recorded vote seed is the public function of (run seed, step)
    (dpledger.mechanisms.randomness.vote_seed): shared randomness that depended on a teacher's output would
    break the analysis, which treats it as public. The replay check then recomputes every histogram
    from the teachers with these seeds.

    Args:
        trace: the loaded run (load_trace).

    Returns:
        The "shared_randomness" CheckResult: FAIL naming the steps with another seed (at most 50 in
        the evidence), else PASS; the run seed appears only as its commitment.
    """
    run_seed = trace.manifest["config"]["seed"]
    wrong = [record["step"] for record in trace.iter_records() if record["vote_seed"] != vote_seed(run_seed, record["step"])]
    # the seed is secret and this line is published: name it by its commitment
    return verdict("shared_randomness", not wrong,
                   f"all {trace.steps} vote seeds are the public function of (the run seed, committed as "
                   f"{seed_commitment(run_seed)}, and the step)",
                   f"{len(wrong)} steps record a vote seed that is not the public function of (run seed, step), first "
                   f"at step {wrong[0] if wrong else None}: the shared randomness may depend on private data",
                   steps_with_foreign_seed=wrong[:50])


def check_vote_threshold(trace: LoadedTrace) -> CheckResult:
    """TARGMAX and TWS (every aggregator with a vote floor, VoteAggregator.vote_floor): every released token
    had at least T votes in its step's histogram (T-threshold privacy, Cohen et al. 2023); the replay check
    verifies the histograms themselves.

    Args:
        trace: the loaded run (load_trace).

    Returns:
        The "vote_threshold" CheckResult: SKIPPED for a DP aggregator (no vote floor); FAIL naming the
        released tokens below T (at most 50 in the evidence); else PASS.
    """
    params = trace.params
    threshold = _mechanism(trace).aggregator.vote_floor()
    if threshold is None:
        return skipped("vote_threshold", f"{params['aggregator']} is differentially private: its noise may release "
                                         "a token below the threshold, and its guarantee is the charged curve")
    below, released = [], 0
    for record in trace.iter_records():
        if record["answered_by"] != "mechanism":
            continue
        released += 1
        votes = dict(zip(record["vote_tokens"], record["vote_counts"])).get(record["output_token"], 0)
        if votes < threshold:
            below.append((record["step"], votes))
    return verdict("vote_threshold", not below,
                   f"all {released} released tokens had >= T = {threshold:g} votes (T-threshold privacy holds; "
                   "no DP guarantee)",
                   f"{len(below)} released tokens had fewer than T = {threshold:g} votes, first at step "
                   f"{below[0][0] if below else None} ({below[0][1] if below else None} votes)",
                   released=released, below_threshold=below[:50])


def check_voting_charges(trace: LoadedTrace) -> CheckResult:
    """Each step's charges against their formulas at its recorded histogram: +inf for TARGMAX/TWS,
    alpha/(2 s1^2) for the screen, alpha/s2^2 for GNMax or Papernot et al. 2018 Theorem 6 at the
    counts (both directions), alpha/sigma^2 for DPWS; under realised-path accounting the answer only
    where the screen passed.

    Args:
        trace: the loaded run (load_trace).

    Returns:
        The "voting_charges" CheckResult: FAIL naming the steps whose charge differs (rtol 1e-9; at
        most 5 per component and block, 50 in the evidence), else PASS.
    """
    mechanism, orders = _mechanism(trace), trace.orders
    mismatched = []
    for _, records in trace.iter_blocks():
        counts = np.zeros((len(records), int(trace.manifest["vocab_size"])), dtype=np.int64)
        for row, record in enumerate(records):
            counts[row, record["vote_tokens"]] = record["vote_counts"]
        passed_screen = np.asarray([record["screen_passed"] for record in records], dtype=bool)
        expected = mechanism.charges(counts, passed_screen, orders)
        refused = np.asarray([bool(record.get("budget_refused")) for record in records])
        for name, values in expected.items():
            recorded = np.asarray([record[f"rdp_{name}"] for record in records], dtype=np.float64)
            values = np.where(refused[:, None], 0.0, values)  # the privacy filter answered those publicly, free
            same = (recorded == values) | np.isclose(recorded, values, rtol=1e-9, atol=0.0)
            for row in np.flatnonzero(~same.all(axis=1))[:5]:
                mismatched.append(f"step {records[row]['step']}: {name} is not its formula at the recorded histogram")
    return verdict("voting_charges", not mismatched,
                   f"every step's charges equal their formulas at its recorded histogram ({', '.join(trace.components)})",
                   f"{len(mismatched)} charges differ from their formulas, first: " + "; ".join(mismatched[:3]),
                   mismatched=mismatched[:50])


class _StepLaws:
    """A step's output laws on its histogram and its neighbours, cached by histogram."""

    def __init__(self, mechanism: VotingMechanism, counts: np.ndarray, orders: np.ndarray, realised_path: bool):
        self.mechanism, self.counts, self.orders, self.realised_path = mechanism, counts, orders, realised_path
        self.cache: dict[bytes, tuple] = {}
        self.error = 0.0
        self.actual = self.law(counts)

    def law(self, counts: np.ndarray) -> tuple:
        key = counts.tobytes()
        if key not in self.cache:
            aggregator = self.mechanism.aggregator
            if not aggregator.exact_law:
                self.cache[key] = (counts,)
            elif self.realised_path:  # the decision's law, then the answer's law given a pass
                log_fail, log_pass = aggregator.log_screen_law(counts)
                answer, error = aggregator.log_answer_law(counts)
                self.error = max(self.error, error)
                self.cache[key] = (np.array([log_fail, log_pass]), answer)
            else:
                log_fail, log_release, error = aggregator.log_output_law(counts)
                self.error = max(self.error, error)
                self.cache[key] = (np.concatenate([[log_fail], log_release]),)
        return self.cache[key]

    def divergence(self, neighbour: np.ndarray, passed_screen: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(the measured per-step divergence at every order, max of both directions; for realised-path
        claims also the released law's divergence, reported beside it)."""
        other, mine = self.law(neighbour), self.actual
        if not self.mechanism.aggregator.exact_law:
            return self.mechanism.aggregator.surrogate_divergence(self.counts, neighbour, self.orders), None
        both = lambda p, q: np.maximum(renyi_divergence_of_log_laws(p, q, self.orders),  # noqa: E731
                                       renyi_divergence_of_log_laws(q, p, self.orders))
        if not self.realised_path:
            return both(mine[0], other[0]), None
        decision, answer = both(mine[0], other[0]), both(mine[1], other[1])
        released = both(*(np.concatenate([[law[0][0]], law[0][1] + law[1]]) for law in (mine, other)))
        return decision + (answer if passed_screen else 0.0), released


def _candidates(counts: np.ndarray) -> list[int]:
    voted = np.flatnonzero(counts).tolist()
    unvoted = np.flatnonzero(counts == 0)
    return voted + ([int(unvoted[0])] if unvoted.size else [])


class VotingWindowPartial(TypedDict):
    """One window's voting-ablation divergences (K orders), summed over windows into a VotingAblation."""

    removed: np.ndarray                   # (N, K) per removed teacher
    added: np.ndarray                     # (K,) the worst added teacher
    replaced: np.ndarray | None           # (N, K) per replaced teacher, where the relation replaces one
    released_removed: np.ndarray | None   # (N, K) the released law's, for realised-path claims
    error: float                          # the largest numerical error of the laws


class VotingAblation(TypedDict):
    """run_voting_ablation's totals over the run (a VotingWindowPartial's fields summed over windows),
    and whether the claim is realised-path accounting."""

    # the fields are declared again, not inherited: pdoc cannot place a TypedDict's inherited fields
    removed: np.ndarray
    added: np.ndarray
    replaced: np.ndarray | None
    released_removed: np.ndarray | None
    error: float
    realised_path: bool


def _sum_of(total: np.ndarray | None, part: np.ndarray | None) -> np.ndarray | None:
    """total + part, where both windows hold the quantity (None where the run's windows have none)."""
    if total is None:
        return None
    if part is None:
        raise RuntimeError("every window of a run holds the same quantities")
    return total + part


def _voting_ablation_window(trace: LoadedTrace, records: list[dict], logits: WindowData, realised_path: bool,
                            replace: bool) -> VotingWindowPartial:
    """One window's per-neighbour divergences summed over its steps, and its largest numerical error."""
    mechanism, orders = _mechanism(trace), np.asarray(trace.orders, dtype=np.float64)
    n = trace.n_teachers
    removed = np.zeros((n, orders.size))
    replaced = np.zeros((n, orders.size)) if replace else None
    added = np.zeros(orders.size)
    released_total = np.zeros((n, orders.size)) if realised_path else None
    error = 0.0
    votes, counts = window_votes(trace, records, logits)
    for row, record in enumerate(records):
        if record.get("budget_refused"):  # answered publicly by the privacy filter: the same law under every neighbour
            continue
        laws = _StepLaws(mechanism, counts[row], orders, realised_path)
        passed_screen = bool(record["screen_passed"])
        per_token: dict[int, np.ndarray] = {}
        per_token_released: dict[int, np.ndarray] = {}  # realised-path claims (an aggregator with an exact law)
        for token in np.unique(votes[row]):
            neighbour = counts[row].copy()
            neighbour[token] -= 1
            per_token[token], released = laws.divergence(neighbour, passed_screen)
            if released is not None:
                per_token_released[token] = released
        removed += np.stack([per_token[token] for token in votes[row]])
        if released_total is not None:
            released_total += np.stack([per_token_released[token] for token in votes[row]])
        worst_added = np.zeros(orders.size)
        for token in _candidates(counts[row]):
            neighbour = counts[row].copy()
            neighbour[token] += 1
            worst_added = np.maximum(worst_added, laws.divergence(neighbour, passed_screen)[0])
        added += worst_added
        if replaced is not None:
            for token in np.unique(votes[row]):
                worst = np.zeros(orders.size)
                for target in _candidates(counts[row]):
                    if target != token:
                        neighbour = counts[row].copy()
                        neighbour[token] -= 1
                        neighbour[target] += 1
                        worst = np.maximum(worst, laws.divergence(neighbour, passed_screen)[0])
                replaced[votes[row] == token] += worst
        error = max(error, laws.error)
    return {"removed": removed, "added": added, "replaced": replaced, "released_removed": released_total,
            "error": error}


def run_voting_ablation(trace: LoadedTrace, delta: float) -> VotingAblation:
    """Per-neighbour composed divergences (K orders) for every relation tested, the leakiest
    teacher, and the numerical error; needs the payload or the models. Each window's sums are added
    in window order.

    Args:
        trace: the loaded run; its per-step distributions are read window by window.
        delta: the delta the caller converts at (the totals themselves do not depend on it).

    Returns:
        The VotingAblation: per removed teacher (N, K), the worst added teacher (K,), per replaced
        teacher (N, K) where the relation replaces one, the released law's per removed teacher for
        realised-path claims, the largest numerical error, and whether the claim is realised-path.

    Raises:
        RuntimeError: if the trace yields no window (a loaded trace has at least one step).
    """
    mechanism = _mechanism(trace)
    realised_path = mechanism.accounting is PathAccounting.REALISED_PATH
    replace = "replace" in NeighbouringRelation(trace.manifest["relation"]).moves
    totals: VotingWindowPartial | None = None
    for _, window in trace.map_windows(_voting_ablation_window, realised_path, replace, desc="neighbour ablation"):
        if totals is None:
            totals = window
            continue
        totals["removed"] = totals["removed"] + window["removed"]
        totals["added"] = totals["added"] + window["added"]
        totals["replaced"] = _sum_of(totals["replaced"], window["replaced"])
        totals["released_removed"] = _sum_of(totals["released_removed"], window["released_removed"])
        totals["error"] = max(totals["error"], window["error"])
    if totals is None:
        raise RuntimeError("a loaded trace has at least one step, so one window")
    return VotingAblation(removed=totals["removed"], added=totals["added"], replaced=totals["replaced"],
                          released_removed=totals["released_removed"], error=totals["error"],
                          realised_path=realised_path)


def _epsilon(values: np.ndarray, orders, delta: float) -> tuple[float, float | None]:
    """(epsilon, its order; None when no order is optimal: all 0 or all +inf) of a composed curve."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = epsilon_from_rdp(RdpCurve(orders, np.asarray(values, dtype=np.float64),
                                           NeighbouringRelation.ADD_OR_REMOVE_ONE), delta)
    return float(result.epsilon), result.order


def check_voting_ablation(trace: LoadedTrace) -> CheckResult:
    """Neighbour ablation of a voting run: the exact per-step output laws on every neighbouring
    histogram, composed per neighbour and converted at the run's delta, against the claimed epsilon.

    Args:
        trace: the loaded run (load_trace).
        Its per-step distributions are read window by window.

    Returns:
        The "neighbour_ablation" CheckResult: SKIPPED without the per-step distributions or with a
        data-dependent filter; FAIL without a claim to test or where a claimed relation's worst
        neighbour exceeds the claim (with the laws' numerical error allowed for); else PASS.
    """
    if not trace.has_payload:
        return skipped("neighbour_ablation", "needs the per-step distributions (the exact-replay payload or the "
                                             "run's models)")
    if trace.data_dependent_filter:
        return skipped("neighbour_ablation", DATA_DEPENDENT_FILTER)
    delta = trace.manifest["config"]["deltas"][0]
    claimed = next((e.get("epsilon") for e in trace.ledger.get("epsilon", []) if isinstance(e, dict)
                    and e.get("method") == "improved" and e.get("delta") == delta), None)
    if not isinstance(claimed, (int, float)) or isinstance(claimed, bool) or math.isnan(claimed):
        return failed("neighbour_ablation", f"ledger.json states no improved epsilon at the run's delta = {delta:g} "
                                            f"(found {claimed!r}): there is no claim to test")
    result = run_voting_ablation(trace, delta)
    orders = trace.orders
    claimed_relation = NeighbouringRelation(trace.manifest["relation"])
    # a relative error e in the laws moves a step's divergence at order a by at most (2a - 1) / (a - 1) e
    smallest = float(np.min(orders))
    tolerance = claimed * (1 + 1e-6) + (2 * smallest - 1) / (smallest - 1) * result["error"] * trace.steps + 1e-12

    def entry(relation: NeighbouringRelation, label: str, values: np.ndarray) -> dict:
        eps, order = _epsilon(values, orders, delta)
        return {"relation": relation.label, "claimed": claimed_relation.covers(relation), "worst_neighbour": label,
                "empirical_epsilon": eps, "order": order, "within_claim": bool(eps <= tolerance),
                "ratio": eps / claimed if 0 < claimed < math.inf else None}  # None: no finite claim to compare

    per_teacher = [_epsilon(values, orders, delta)[0] for values in result["removed"]]
    leakiest = int(np.argmax(per_teacher))
    relations = {NeighbouringRelation.REMOVE_ONE.value:
                 entry(NeighbouringRelation.REMOVE_ONE, f"teacher {leakiest} removed", result["removed"][leakiest]),
                 NeighbouringRelation.ADD_ONE.value:
                 entry(NeighbouringRelation.ADD_ONE, "a teacher added, voting the worst token every step",
                       result["added"])}
    if result["replaced"] is not None:
        replaced = [_epsilon(values, orders, delta)[0] for values in result["replaced"]]
        worst_teacher = int(np.argmax(replaced))
        relations[NeighbouringRelation.REPLACE_ONE.value] = entry(
            NeighbouringRelation.REPLACE_ONE, f"teacher {worst_teacher} replaced (its vote moved to the worst token)",
            result["replaced"][worst_teacher])
    claimed_rows = [e for e in relations.values() if e["claimed"]]
    exceeded = [e for e in claimed_rows if not e["within_claim"]]
    worst = max(claimed_rows, key=lambda e: e["empirical_epsilon"])
    aggregator = _mechanism(trace).aggregator
    measured = (aggregator.surrogate_measured if not aggregator.exact_law else
                "the screen decision's divergence plus, where it passed, the answer's given the decision (like the "
                "realised-path claim)" if result["realised_path"] else
                "the released output's law per step: fail (then the public model answers, alike on both sides) or "
                "the released token")
    evidence = {"claimed_epsilon": claimed, "delta": delta, "claimed_relation": claimed_relation.value,
                "relations": relations, "worst_neighbour": worst["worst_neighbour"],
                "worst_empirical_epsilon": worst["empirical_epsilon"], "ratio": worst["ratio"],
                "leakiest_teacher": leakiest, "per_teacher_removed_epsilon": per_teacher,
                "measured_quantity": measured, "measured_direction": "both: max(D(M(D) || M(D')), D(M(D') || M(D)))",
                "numerical_error": result["error"], "teachers_removed": list(range(trace.n_teachers)),
                "teacher_sampling": "all teachers", "accounting": trace.params.get("accounting")}
    if result["released_removed"] is not None:
        evidence["released_output_epsilon"] = max(_epsilon(v, orders, delta)[0] for v in result["released_removed"])
    no_dp = math.isinf(claimed)
    bound_only = f" ({aggregator.surrogate_note})" if not aggregator.exact_law else ""
    summary = (f"teacher {leakiest} leaks most when removed ({per_teacher[leakiest]:.4g}); "
               + "; ".join(f"{e['relation']}{'' if e['claimed'] else ' (not claimed)'}: {e['empirical_epsilon']:.4g}"
                           for e in relations.values()) + bound_only)
    return verdict("neighbour_ablation", not exceeded,
                   (f"no DP claim (epsilon +inf: threshold privacy only); measured {summary}" if no_dp else
                    f"{claimed_relation.label} (claimed): every neighbour's empirical epsilon <= claimed {claimed:.4g}; "
                    + summary),
                   f"{claimed_relation.label} (claimed): " + "; ".join(
                       f"{e['worst_neighbour']} reaches empirical epsilon {e['empirical_epsilon']:.4g} > claimed "
                       f"{claimed:.4g}" for e in exceeded), **evidence)


def _clopper_pearson(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if successes == 0 else float(beta_distribution.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(beta_distribution.ppf(1 - tail, successes + 1, trials - successes))
    return low, high


def _narrowest_margin_window(trace: LoadedTrace, records: list[dict],
                             logits: WindowData) -> tuple[int, int, np.ndarray, int, np.ndarray | int] | None:
    """The window's step whose plurality margin is narrowest (the first of equals), as (score, step,
    histogram, plurality token, charged curve); None when no step in it was charged an answer."""
    mechanism = _mechanism(trace)
    best: tuple[int, int, np.ndarray, int, np.ndarray | int] | None = None
    votes, counts = window_votes(trace, records, logits)
    for row, record in enumerate(records):
        if (mechanism.accounting is PathAccounting.REALISED_PATH and not record["screen_passed"]) \
                or record.get("budget_refused"):
            continue
        top = int(np.argmax(counts[row]))
        runner_up = int(np.sort(counts[row])[-2])
        # removing a vote from the plurality token of the narrowest margin moves the output most
        score = -(int(counts[row, top]) - runner_up)
        if best is None or score > best[0]:
            charge = sum(np.asarray(record[f"rdp_{name}"], dtype=np.float64) for name in trace.components)
            best = (score, record["step"], counts[row].copy(), top, charge)
    return best


def check_sampled_aggregator(trace: LoadedTrace, draws: int = 20000, seed: int = 0,
                             confidence: float = 0.999) -> CheckResult:
    """A sampled audit of a DP aggregator (DPARGMAX, DPWS): at the step and removed teacher whose
    histograms differ most, run the aggregator `draws` times on both histograms, pick the output
    whose frequency ratio is largest on the first half of the draws, and bound the ratio of its
    probabilities from below with Clopper-Pearson intervals on the second half. A sound claim
    satisfies p <= e^eps p' + delta for the step's own (eps, delta), so the lower bound must not
    exceed the step's charged epsilon at the run's delta. Under realised-path accounting only steps
    whose screen passed are sampled (a failed step's charge is the screen's alone).

    Args:
        trace: the loaded run (load_trace).
        draws: aggregator draws in all, half to choose the output, half to bound it.
        seed: seeds the draws.
        confidence: the Clopper-Pearson level of each interval.

    Returns:
        The "sampled_aggregator" CheckResult: SKIPPED for an aggregator with no DP claim, without the
        per-step distributions, or with no charged answer; FAIL when the lower bound exceeds the
        step's charged epsilon (relative slack 1e-9); else PASS.
    """
    mechanism = _mechanism(trace)
    if not mechanism.aggregator.differentially_private:
        return skipped("sampled_aggregator", f"{mechanism.aggregator.name} makes no DP claim to sample")
    if not trace.has_payload:
        return skipped("sampled_aggregator", "needs the per-step distributions (the exact-replay payload or the models)")
    delta, orders = trace.manifest["config"]["deltas"][0], trace.orders
    best = None
    for _, window in trace.map_windows(_narrowest_margin_window, desc="sampled aggregator"):
        if window is not None and (best is None or window[0] > best[0]):  # the first of equal scores, as in one pass
            best = window
    if best is None:
        return skipped("sampled_aggregator", "no step's screen passed: a realised-path run charged no answer to sample")
    _, step, counts, top, charge = best
    neighbour = counts.copy()
    neighbour[top] -= 1
    rng = np.random.default_rng(seed)
    half = draws // 2
    first = [mechanism.aggregator.sample_outputs(c, half, rng) for c in (counts, neighbour)]
    second = [mechanism.aggregator.sample_outputs(c, half, rng) for c in (counts, neighbour)]
    best_bound, event = -math.inf, None
    for forward in (True, False):
        a, b = (0, 1) if forward else (1, 0)
        outcomes, frequency = np.unique(first[a], return_counts=True)
        other = {o: c for o, c in zip(*np.unique(first[b], return_counts=True))}
        ratios = [(f + 1) / (other.get(o, 0) + 1) for o, f in zip(outcomes, frequency)]
        chosen = int(outcomes[int(np.argmax(ratios))])
        low, _ = _clopper_pearson(int(np.sum(second[a] == chosen)), half, confidence)
        _, high = _clopper_pearson(int(np.sum(second[b] == chosen)), half, confidence)
        bound = max(0.0, math.log((low - delta) / high)) if low > delta else 0.0  # below 0 says nothing
        if bound > best_bound:
            best_bound, event = bound, chosen
    step_epsilon = _epsilon(np.asarray(charge), orders, delta)[0]
    ok = best_bound <= step_epsilon * (1 + 1e-9)
    label = "fail" if event == -1 else f"token {event}"
    return verdict("sampled_aggregator", ok,
                   f"step {step}, plurality vote removed: lower bound {best_bound:.4g} on the step's epsilon (event "
                   f"{label}, {half} draws per side, Clopper-Pearson {confidence:.1%}) <= its charge {step_epsilon:.4g} "
                   f"at delta {delta:g}",
                   f"step {step}: the sampled lower bound {best_bound:.4g} exceeds the step's charged epsilon "
                   f"{step_epsilon:.4g}: the charge under-states this aggregator",
                   step=step, epsilon_lower_bound=best_bound, step_epsilon=step_epsilon, event=label, draws=draws,
                   confidence=confidence)
