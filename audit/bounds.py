"""Bound checks: the theorems of Flemings et al. 2024 (PMixED and AdaPMixED) as assertions, per step."""
from __future__ import annotations

from typing import TypedDict

import numpy as np
import numpy.typing as npt
import torch

from dpledger.accounting.relation import NeighbouringRelation
from dpledger.audit.checks import CheckResult, skipped, verdict
from dpledger.audit.loader import LoadedTrace, OverWindows
from dpledger.decoding import trace as trace_files
from dpledger.decoding.totals import component_relations
from dpledger.mechanisms.add_one import add_one_divergence_bounds
from dpledger.mechanisms.kernels import max_divergence_symmetric, mixed_teachers, symmetric_renyi_orders
from dpledger.mechanisms.leave_one_out import leave_one_out_curve, leave_one_out_divergences, leave_one_out_every_order
from dpledger.mechanisms.adapmixed import loss_covering
from dpledger.mechanisms.ball import Ball
from dpledger.mechanisms.pmixed import PMixED
from dpledger.mechanisms.screening import NoisyScreening

BALL_TOLERANCE = 1e-9
"""Slack on D<->(mixed, public) <= beta*alpha: the solver keeps the feasible end of its bracket."""
ADD_ONE_RTOL = 1e-9
"""Relative slack on a charge against the recomputed add-one bound (the tolerance this check had for
both parts); Eq. 3 is held to its derived rounding allowance instead."""


def _uses_pmixed(trace: LoadedTrace) -> bool:
    return trace.mechanism_type in ("pmixed", "adapmixed")


def _recorded_lambdas(records: list[dict]) -> torch.Tensor:
    return torch.tensor([r["lambdas"] for r in records], dtype=torch.float64)


def _ball(trace: LoadedTrace) -> Ball:
    return Ball(trace.params.get("ball", Ball.PROJECTION_ORDER.value))


def _pmixed(trace: LoadedTrace) -> PMixED:
    """The run's PMixED projection (alpha, beta, N, ball) from its manifest."""
    return PMixED(trace.params["alpha"], trace.params["beta"], trace.n_teachers, ball=_ball(trace))


class _BallPartial(TypedDict):
    worst: float
    outside: list[str]


def _mixing_ball_window(trace: LoadedTrace, records: list[dict], logits: torch.Tensor, grid: tuple[float, ...],
                        radii: tuple[float, ...], max_radius: float | None) -> _BallPartial:
    """The window's largest divergence as a fraction of its radius, and the mixed teachers outside."""
    public, teachers = trace.window_distributions(logits)
    mixed = mixed_teachers(teachers, public, _recorded_lambdas(records))
    log_mixed, log_public = torch.log(mixed), torch.log(public).unsqueeze(-2)
    limits = np.asarray(radii)
    # each constraint as a fraction of its radius: <= 1 inside
    ratio = (symmetric_renyi_orders(log_mixed, log_public, torch.tensor(grid, dtype=torch.float64)).numpy()
             / np.maximum(limits, 1e-300)).max(axis=-1)
    if max_radius is not None:
        ratio = np.maximum(ratio, max_divergence_symmetric(log_mixed, log_public).numpy() / max(max_radius, 1e-300))
    # `not <=` so that a NaN divergence counts as outside the ball
    outside = [f"step {records[row]['step']} teacher {teacher}: D<-> at {ratio[row, teacher]:.6g} of its radius"
               for row, teacher in zip(*np.nonzero(~(ratio <= 1 + BALL_TOLERANCE + 1e-12)))]
    return {"worst": float(ratio.max()), "outside": outside}


def check_mixing_ball(trace: LoadedTrace) -> CheckResult:
    """Every mixed teacher lambda p_i + (1-lambda) p0 lies in its Renyi ball, using the recorded
    lambdas and the replayed distributions: radius beta*alpha at order alpha (Flemings et al. 2024,
    Algorithm 2), for ball="proof-orders" D<->_{2a-1} <= beta (2a - 1) and D<->_{2a} <= 2 beta a
    (proof_orders_ball_constraints), for ball="all-orders" every grid constraint of
    all_orders_ball_constraints and D<->_inf <= beta k_max (PMixED.ball_constraints). A NaN divergence (e.g. from a NaN lambda) is outside.

    Args:
        trace: the loaded run (load_trace).
        Its per-step distributions are read window by window (payload or models).

    Returns:
        The "mixing_ball" CheckResult: SKIPPED for a mechanism that mixes no teachers or without the
        per-step distributions; FAIL naming the mixed teachers outside; else PASS with the largest
        divergence as a fraction of its radius.
    """
    return trace.run_check(mixing_ball_over_windows(trace))


def mixing_ball_over_windows(trace: LoadedTrace) -> OverWindows[CheckResult]:
    """check_mixing_ball written over windows (dpledger.audit.loader.OverWindows): what dpledger.audit.audit runs
    beside the other checks over one pass of the windows.

    Args:
        trace: the loaded run (load_trace).

    Returns:
        A generator that yields its window request and returns the CheckResult of check_mixing_ball.
    """
    if not _uses_pmixed(trace):
        return skipped("mixing_ball", f"mechanism {trace.mechanism_type} mixes no teachers")
    if not trace.has_payload:
        return skipped("mixing_ball", "needs the exact-replay payload")
    grid, radii, max_radius = _pmixed(trace).ball_constraints
    worst = 0.0
    outside: list[str] = []
    for _, window in (yield from trace.windows(_mixing_ball_window, grid, radii, max_radius, desc="mixing ball")):
        worst = float(np.maximum(worst, window["worst"]))  # not max(): it would skip a NaN
        outside += window["outside"]
    where = (" and ".join(f"D<->_{k:g} <= {r:g}" for k, r in zip(grid, radii)) if max_radius is None else
             f"D<->_k <= beta k at every order ({len(grid)} grid constraints and D<->_inf)")
    return verdict("mixing_ball", not outside,
                   f"every mixed teacher is within the ball ({where}): largest divergence {worst:.6g} of its radius",
                   f"{len(outside)} mixed teachers leave the ball or have a NaN divergence: " + "; ".join(outside[:5]),
                   max_fraction_of_radius=worst, ball=_ball(trace).value, outside=len(outside))


def check_screening_cost(trace: LoadedTrace) -> CheckResult:
    """Each step's screening charge equals (lam / (N sigma))^2 * alpha' at every order (Flemings et al.
    2024 (AdaPMixED), Theorem 4.1).

    Args:
        trace: the loaded run (load_trace).

    Returns:
        The "screening_cost" CheckResult: SKIPPED without screening; FAIL with the range of
        charged/formula (rtol 1e-12; steps the privacy filter refused are left out); else PASS.
    """
    if "screen" not in trace.components:
        return skipped("screening_cost", "the run has no screening step")
    p = trace.params
    expected = NoisyScreening(teachers=trace.n_teachers, lam=p["lam"], sigma=p["sigma"], alpha=p["alpha"]).rdp_values(trace.orders)
    low, high, ok, count = np.inf, -np.inf, True, 0
    with np.errstate(invalid="ignore", divide="ignore"):
        for _, records in trace.iter_blocks():
            records = [r for r in records if not r.get("budget_refused")]  # the filter charged nothing there
            if not records:
                continue
            charged = np.asarray([r["rdp_screen"] for r in records], dtype=np.float64)
            ratio = charged / expected
            low, high = float(np.fmin(low, np.min(ratio))), float(np.fmax(high, np.max(ratio)))
            ok = ok and bool(np.allclose(charged, expected, rtol=1e-12, atol=0))
            count += len(records)
    ratio = np.asarray([low, high])
    return verdict("screening_cost", ok, f"all {count} screening charges equal (lam/(N sigma))^2 * order",
                   f"screening charges differ from (lam/(N sigma))^2 * order: charged/formula ranges "
                   f"{ratio.min():.4g}..{ratio.max():.4g} (a wrong sensitivity or ensemble size, pitfall 8)",
                   ratio_min=float(ratio.min()), ratio_max=float(ratio.max()))


def check_relation_coverage(trace: LoadedTrace) -> CheckResult:
    """The run's claimed neighbouring relation (manifest "relation") is covered by what it charged:
    the composed total holds for the neighbours every component covers (NeighbouringRelation.
    composed_with), e.g. Flemings et al. 2024 Eq. 3 covers removing a teacher only.

    Args:
        trace: the loaded run (load_trace).

    Returns:
        The "relation_coverage" CheckResult: SKIPPED when the records do not fit the manifest; FAIL
        naming the moves (adding, removing a teacher) no charge covers; else PASS.

    Raises:
        ValueError: if the manifest's relation or a component's relation is not a known relation.
    """
    claimed = NeighbouringRelation(trace.manifest["relation"])
    relations = component_relations(trace.manifest)
    if trace.totals is None:
        return skipped("relation_coverage", "the records do not fit the manifest (see records)")
    covered = trace.totals.ledger.total_relation
    missing = sorted(claimed.moves - covered.moves)
    narrow = [f"{name} covers {relation.label}" for name, relation in relations.items() if not relation.covers(claimed)]
    return verdict("relation_coverage", not missing,
                   f"the run claims {claimed.label} and its charges cover {covered.label}",
                   f"the run claims {claimed.label} but its charged loss covers {covered.label} only "
                   f"({'; '.join(narrow)}): no bound is charged for {' or '.join(m + 'ing a teacher' for m in missing)}",
                   claimed_relation=claimed.value, covered_relation=covered.value,
                   component_relations={name: relation.value for name, relation in relations.items()})


class _ChargePartial(TypedDict):
    worst: float
    under: list[str]


def _data_dependent_window(trace: LoadedTrace, records: list[dict], logits: torch.Tensor,
                           relation: NeighbouringRelation, every_step: bool) -> _ChargePartial:
    """The window's largest relative shortfall of the charge below the loss covering `relation`, and
    the steps charged less (or holding a NaN)."""
    # the decode loop's own inputs: as_ensemble renormalises each row (its last bits), and a loss
    # recomputed from the softmax's rows instead differs from the charged one by more than the
    # relative tolerance at tiny values (~1e-14 absolute at values ~1e-9)
    teachers, public = trace.window_ensemble(logits)
    lambdas = _recorded_lambdas(records)
    charged = np.asarray([r["rdp_pmixed_data_dependent"] for r in records])
    answered = np.asarray([(every_step or r["screen_passed"]) and not r.get("budget_refused") for r in records])
    # every teacher at every order, in the decode loop's own arithmetic, but for a teacher whose chord between
    # fewer orders already lies under the charge (convexity: leave_one_out_every_order); no certificate of
    # the step's own sub-grid is taken, and the add-one bound's chords are recomputed order by order.
    # The kernels' values lie in [Eq. 3, Eq. 3 + 2 allowance] where evaluated: an honest charge is at least
    # Eq. 3, so at least the recomputed value less twice the allowance, however its sums ran; a chord lies
    # under the charge already. A step not compared (unanswered) is charged nothing here: +inf covers it.
    values, allowance, output = leave_one_out_every_order(teachers, public, lambdas, trace.orders,
                                                          charges=np.where(answered[:, None], charged, np.inf),
                                                          prepared=trace.window_leave_one_out(logits, lambdas))
    eq3_floor = np.where(np.isfinite(values), values - 2.0 * allowance, values)
    dual = bool(trace.params.get("add_one_dual", False))
    if dual:
        # the dual's multipliers are chosen numerically, so its value moves by far more than the last
        # bit of its input: it gets the output exactly as the decode loop formed it (the sub-grid curve's
        # mean of the mixed teachers; recorded lambdas, which the replay check holds to the mechanism's)
        _, _, output = leave_one_out_curve(teachers, public, lambdas, trace.orders)
    expected = loss_covering(
        relation, lambda: eq3_floor,
        lambda: add_one_divergence_bounds(output, public, trace.n_teachers, torch.from_numpy(trace.orders),
                                          *_pmixed(trace).one_order_ball, dual=dual, relative_tolerance=None,
                                          version=trace.manifest.get("records_version", 1)).numpy()
        * (1.0 - ADD_ONE_RTOL))
    with np.errstate(invalid="ignore"):   # inf - inf where both are +inf: no shortfall
        shortfall = np.where(expected == charged, 0.0, expected - charged)
    gap = np.where(answered[:, None], shortfall / np.maximum(np.abs(expected), 1e-300), 0.0)
    under = []
    for row in np.nonzero(np.any(~(gap <= 0.0), axis=1))[0]:  # `not <=`: a NaN gap fails too
        nan = [field for field, values in (("rdp_pmixed_data_dependent", charged[row]), ("Eq. 3", expected[row]))
               if np.isnan(values).any()]
        under.append(f"step {records[row]['step']}: " + (f"{' and '.join(nan)} NaN" if nan else
                     f"charged {charged[row].max():.6g} < Eq. 3 {expected[row].max():.6g}"))
    return {"worst": float(np.max(gap)), "under": under}


def check_data_dependent_charge(trace: LoadedTrace) -> CheckResult:
    """The charged data-dependent loss is at least what covers its relation, recomputed from the
    replayed distributions in both directions: Flemings et al. 2024 (AdaPMixED), Eq. 3,
    max_i max(D(p||p_-i), D(p_-i||p)), for removing a teacher, and the add-one bound
    (dpledger.mechanisms.add_one.add_one_divergence_bounds) for adding one; on every step (accounting
    "released-output") or every step PMixED answered ("realised-path"). A NaN fails.

    Args:
        trace: the loaded run (load_trace).
        Its per-step distributions are read window by window (payload or models).

    Returns:
        The "data_dependent_eq3" CheckResult: SKIPPED without a data-dependent charge or without the
        per-step distributions; FAIL naming the steps charged less or NaN (less than the recomputed Eq. 3
        minus twice the kernels' rounding allowance, dpledger.mechanisms.leave_one_out.leave_one_out_every_order,
        which no honest charge is; less than the add-one bound by ADD_ONE_RTOL relative); else PASS with
        the largest relative shortfall (below the charge: negative; where a teacher's chord showed the
        charge covers it, leave_one_out_every_order's chord stands in for its Eq. 3, an upper value).
    """
    return trace.run_check(data_dependent_charge_over_windows(trace))


def data_dependent_charge_over_windows(trace: LoadedTrace) -> OverWindows[CheckResult]:
    """check_data_dependent_charge written over windows (dpledger.audit.loader.OverWindows): what dpledger.audit.audit runs
    beside the other checks over one pass of the windows.

    Args:
        trace: the loaded run (load_trace).

    Returns:
        A generator that yields its window request and returns the CheckResult of check_data_dependent_charge.
    """
    if "pmixed_data_dependent" not in trace.components:
        return skipped("data_dependent_eq3", "the run charges no data-dependent loss")
    if not trace.has_payload:
        return skipped("data_dependent_eq3", "needs the exact-replay payload")
    relation = component_relations(trace.manifest)["pmixed_data_dependent"]
    every_step = trace.params.get("accounting", "realised-path") == "released-output"
    worst = 0.0
    under: list[str] = []
    for _, window in (yield from trace.windows(_data_dependent_window, relation, every_step,
                                               desc="data-dependent loss")):
        worst = float(np.maximum(worst, window["worst"]))  # not max(): it would skip a NaN
        under += window["under"]
    steps = "every step" if every_step else "every answered step"
    what = {"remove": "Eq. 3", "add": "the add-one bound"}
    covers = " and ".join(what[m] for m in ("remove", "add") if m in relation.moves)
    return verdict("data_dependent_eq3", not under, f"{steps} is charged at least {covers} in both directions "
                   f"({relation.label})",
                   f"{len(under)} answered steps are charged less than Eq. 3 or hold a NaN: " + "; ".join(under[:5]),
                   worst_relative_shortfall=worst, undercharged_steps=len(under))


class _Theorem31Partial(TypedDict):
    """One window of the theorem_3_1 check: what it found on its steps."""

    exceeding: int            # steps whose Eq. 3 exceeds Theorem 3.1 at an order it covers
    charged_there: list[int]  # of those, the steps charged Theorem 3.1
    ratio: float              # the largest Eq. 3 / Theorem 3.1 over the steps and orders
    nan_steps: dict[str, list[int]]
    disagreeing: list[int]    # steps whose recorded Eq. 3 (an old trace's) differs from the recomputation
    steps: int                # steps compared


def theorem_3_1_orders(trace: LoadedTrace) -> npt.NDArray[np.float64]:
    """The orders at which the theorem_3_1 check compares Eq. 3 with Theorem 3.1: those of the run's
    grid where Theorem 3.1 is claimed (Flemings et al. 2024, Theorem 3.1: orders <= alpha for the
    paper's one-order ball and the proof-orders ball, every order for the all-orders ball), the only
    orders where its charge rests on the comparison.

    Args:
        trace: the loaded run (its grid, alpha and ball).

    Returns:
        The orders, increasing (a subset of the run's grid).
    """
    limit = np.inf if _ball(trace) is Ball.ALL_ORDERS else trace.params["alpha"] + 1e-12
    return trace.orders[trace.orders <= limit]


def exact_eq3(teachers: torch.Tensor, public: torch.Tensor, lambdas: torch.Tensor, orders: torch.Tensor,
              mask: torch.Tensor | None = None) -> npt.NDArray[np.float64]:
    """Flemings et al. 2024, Eq. 3, exact at every order: max_i D<->_a(p, p_-i) over the teachers i of
    the ensemble (the Poisson-sampled ones under `mask`, removing the only sampled teacher leaving the
    public model), with one unsampled teacher D<->_a(pbar_1, p0), through
    dpledger.mechanisms.leave_one_out.leave_one_out_divergences.

    Args:
        teachers: (L, N, V) teacher distributions.
        public: (L, V) public distributions.
        lambdas: (L, N) the mixing weights.
        orders: (K,) Renyi orders > 1.
        mask: (L, N) bool, the sampled teachers of a subsampled run; None for all.

    Returns:
        (L, K) float64: Eq. 3 of each step at each order.

    Raises:
        ValueError: if a divergence is NaN (an input holds NaN).
    """
    mixed = mixed_teachers(teachers, public, lambdas)
    if mixed.shape[-2] == 1 and mask is None:
        return symmetric_renyi_orders(torch.log(mixed[..., 0, :]), torch.log(public), orders).numpy()
    return leave_one_out_divergences(mixed, orders, mask, None if mask is None else public).amax(dim=-2).numpy()


def _theorem_3_1_rows(records: list[dict], eq3: npt.NDArray[np.float64], within: npt.NDArray[np.bool_],
                      field_name: str, charged_names: list[str]) -> _Theorem31Partial:
    """The comparison on a window's steps: Eq. 3 (K' orders, those `within` of the grid) against each
    record's Theorem 3.1 value at the same orders."""
    bound = np.asarray([r["data_independent"] for r in records], dtype=np.float64)[:, within]
    nan_steps = {field: [int(r["step"]) for r, row in zip(records, values) if np.isnan(row).any()]
                 for field, values in ((field_name, eq3), ("data_independent", bound))}
    exceeds = np.any(eq3 > bound * (1 + 1e-9), axis=1)
    charged_there = [int(r["step"]) for r, e in zip(records, exceeds)
                     if e and any(np.any(np.asarray(r[f"rdp_{n}"]) > 0) for n in charged_names)]
    ratio = float(np.max(eq3 / np.maximum(bound, 1e-300), initial=0.0))
    return {"exceeding": int(exceeds.sum()), "charged_there": charged_there, "ratio": ratio, "nan_steps": nan_steps,
            "disagreeing": [], "steps": len(records)}


def _theorem_3_1_window(trace: LoadedTrace, records: list[dict], logits: torch.Tensor, orders: tuple[float, ...],
                        recorded_field: str | None, charged_names: list[str]) -> _Theorem31Partial:
    """The window's comparison with Eq. 3 recomputed from its distributions and recorded mixing weights
    (and sampled teachers) at `orders`; where an old trace recorded Eq. 3 (`recorded_field`), the
    steps whose recorded values differ from the recomputation."""
    public, teachers = trace.window_distributions(logits)
    mask = None
    if trace.params.get("sample_rate") is not None:
        mask = torch.zeros(teachers.shape[:-1], dtype=torch.bool)
        for row, record in enumerate(records):
            mask[row, record["sampled_teachers"]] = True
    within = np.isin(trace.orders, orders)
    eq3 = exact_eq3(teachers, public, _recorded_lambdas(records), torch.tensor(orders, dtype=torch.float64), mask)
    partial = _theorem_3_1_rows(records, eq3, within, "Eq. 3", charged_names)
    if recorded_field is not None:
        # a version 2 run charged by Theorem 3.1 recorded the same Eq. 3 as its observed loss too: the
        # replay no longer recomputes that field (the decode loop does not compute it), so it is held here
        fields = [recorded_field] + (["observed_data_dependent"] if recorded_field == "eq3_remove_one" else [])
        disagreeing: set[int] = set()
        for field in fields:
            recorded = np.asarray([r[field] for r in records], dtype=np.float64)[:, within]
            close = np.isclose(recorded, eq3, rtol=1e-9, atol=1e-300) | ((recorded == eq3) & np.isinf(eq3))
            disagreeing |= {int(r["step"]) for r, row in zip(records, close) if not row.all()}
        partial["disagreeing"] = sorted(disagreeing)
    return partial


def check_theorem_3_1(trace: LoadedTrace) -> CheckResult:
    """Steps where Eq. 3 (the data-dependent loss of a removed teacher, which Theorem 3.1 bounds)
    exceeds Theorem 3.1 (Flemings et al. 2024; not guaranteed: its proof's Theorem A.5 needs the ball
    at every order, the projection enforces one) at an order where Theorem 3.1 is claimed
    (theorem_3_1_orders) are counted; the run fails where it charged Theorem 3.1 at such a step, or
    where either loss is NaN.

    Where Eq. 3 comes from: a run charged by Theorem 3.1 does not record it (records_version 3), so the
    check computes it exactly from the per-step distributions (payload or models) and the recorded
    mixing weights, at theorem_3_1_orders only; an older trace's recorded values (version 2:
    eq3_remove_one and observed_data_dependent, the same Eq. 3) must agree with that recomputation
    (relative 1e-9). A data-dependent run records the Eq. 3 it charges (verified by the
    replay check) and the check reads it. Without the distributions, an older trace's recorded
    values are read (and the check says they are not recomputed); version 1 records hold only the loss
    covering the run's relation (with the add-one bound under add-or-remove-one): the check then says so.

    Args:
        trace: the loaded run (load_trace).
        Its per-step distributions are read window by window (payload or models) for a run charged by
        Theorem 3.1.

    Returns:
        The "theorem_3_1" CheckResult: SKIPPED for a mechanism without mixing, a grid without an
        order where Theorem 3.1 is claimed, or a version 3 run charged by Theorem 3.1 without its
        per-step distributions; FAIL where a step was charged Theorem 3.1 although its Eq. 3 exceeds
        it, where either is NaN, or where an old trace's recorded Eq. 3 differs from the recomputation;
        else PASS, counting the steps whose Eq. 3 exceeds Theorem 3.1 and the largest ratio. Its evidence says where Eq. 3 came from
        (`eq3_source`), at which orders it was compared (`orders`) and on how many steps (`steps_compared`).
    """
    return trace.run_check(theorem_3_1_over_windows(trace))


def theorem_3_1_over_windows(trace: LoadedTrace) -> OverWindows[CheckResult]:
    """check_theorem_3_1 written over windows (dpledger.audit.loader.OverWindows): what dpledger.audit.audit runs
    beside the other checks over one pass of the windows.

    Args:
        trace: the loaded run (load_trace).

    Returns:
        A generator that yields its window request and returns the CheckResult of check_theorem_3_1.
    """
    if not _uses_pmixed(trace):
        return skipped("theorem_3_1", f"mechanism {trace.mechanism_type} makes no Theorem 3.1 claim")
    orders = theorem_3_1_orders(trace)
    if not orders.size:
        return skipped("theorem_3_1", f"the run's grid has no order <= alpha = {trace.params['alpha']:g}, where "
                       "Theorem 3.1 is claimed")
    within = np.isin(trace.orders, orders)
    charged_names = [n for n in trace.components if n.startswith("pmixed_theorem_3_1") or n.startswith("pmixed_subsampled")]
    version = trace.manifest.get("records_version", 1)
    recorded_field = None if not trace_files.records_losses(version, trace.components) else (
        "eq3_remove_one" if version >= 2 else "observed_data_dependent")
    data_dependent = trace_files.DATA_DEPENDENT_COMPONENT in trace.components
    measured = "Eq. 3"
    if not data_dependent and trace.has_payload:
        source = "recomputed"
        partials = [window for _, window in (yield from trace.windows(
            _theorem_3_1_window, tuple(float(o) for o in orders), recorded_field, charged_names, desc="Theorem 3.1"))]
    elif recorded_field is not None:
        source = "recorded (the charged loss's remove-one part, which the replay check recomputes)" if data_dependent else \
            "recorded, not recomputed: the per-step distributions are not available"
        if recorded_field == "observed_data_dependent" and data_dependent:
            measured = ("the recorded data-dependent loss (this version 1 trace records Eq. 3 with the add-one bound "
                        "where the relation adds a teacher, which Theorem 3.1 does not bound)")
        partials = [_theorem_3_1_rows(records, np.asarray([r[recorded_field] for r in records],
                                                          dtype=np.float64)[:, within], within, recorded_field,
                                      charged_names)
                    for _, records in trace.iter_blocks()]
    else:
        return skipped("theorem_3_1", "the run charges Theorem 3.1 and does not record Eq. 3: comparing them needs "
                       "the per-step distributions (the exact-replay payload or the run's models)")
    exceeding = sum(p["exceeding"] for p in partials)
    charged_there = [step for p in partials for step in p["charged_there"]]
    disagreeing = [step for p in partials for step in p["disagreeing"]]
    ratio = 0.0
    nan_steps: dict[str, list[int]] = {}
    for p in partials:
        ratio = float(np.maximum(ratio, p["ratio"]))  # not max(): it would skip a NaN
        for field, steps in p["nan_steps"].items():
            nan_steps.setdefault(field, []).extend(steps)
    nan_causes = [f"{field} is NaN at steps {steps[:5]}" for field, steps in nan_steps.items() if steps]
    where = (f"at the {orders.size} orders where Theorem 3.1 is claimed ({orders[0]:g} to {orders[-1]:g}), Eq. 3 "
             f"{source}")
    if nan_causes:
        problem = "; ".join(nan_causes)
    elif disagreeing:
        fields = f"{recorded_field}{' or observed_data_dependent' if recorded_field == 'eq3_remove_one' else ''}"
        problem = (f"{len(disagreeing)} steps record an Eq. 3 ({fields}) that differs from its recomputation "
                   f"from the per-step distributions (first: {disagreeing[:5]})")
    else:
        problem = (f"{len(charged_there)} steps were charged Theorem 3.1 although their {measured} exceeds it "
                   f"(first: {charged_there[:5]}); Theorem 3.1 is not guaranteed")
    return verdict("theorem_3_1", not charged_there and not nan_causes and not disagreeing,
                   (f"no step's {measured} exceeds Theorem 3.1's value (largest ratio {ratio:.3g}; {where}), so no "
                    "Theorem 3.1 charge is below the step's measured loss" if not exceeding else
                    f"{exceeding} of {trace.steps} steps have {measured} above Theorem 3.1's value (largest ratio "
                    f"{ratio:.3g}; {where}); the run charged none of those steps Theorem 3.1"),
                   problem, exceeding_steps=exceeding, charged_exceeding_steps=len(charged_there), max_ratio=ratio,
                   eq3_source=source, orders=orders.tolist(),
                   steps_compared=sum(p["steps"] for p in partials))


class _UtilityPartial(TypedDict):
    nll_mixed: torch.Tensor
    nll_ensemble: torch.Tensor
    nan_steps: list[int]
    right: float


def _utility_window(trace: LoadedTrace, records: list[dict], logits: torch.Tensor) -> _UtilityPartial:
    """The window's per-step NLL of the mixture and of the all-lambda=1 ensemble, Theorem 4.3's
    largest term, and the steps where either holds a NaN."""
    public, teachers = trace.window_distributions(logits)
    lambdas = _recorded_lambdas(records)
    target = torch.tensor([r["true_token"] for r in records])
    rows = torch.arange(len(records))
    p_true = teachers[rows, :, target]  # (L, N): each teacher's probability of the true token
    p0_true = public[rows, target]
    mixed_true = lambdas * p_true + (1 - lambdas) * p0_true[:, None]
    # The term vanishes at lambda = 1 even where p_j(x_t) underflows to 0 (0 * -inf is NaN, not 0).
    term = torch.where(lambdas == 1, 0.0, (1 - lambdas) * torch.log(p_true / p0_true[:, None]))
    nan_rows = term.isnan().any(dim=1) | mixed_true.isnan().any(dim=1)
    return {"nll_mixed": -torch.log(mixed_true.mean(dim=1)), "nll_ensemble": -torch.log(p_true.mean(dim=1)),
            "nan_steps": [records[row]["step"] for row in torch.nonzero(nan_rows)[:, 0].tolist()],
            "right": float(term.max())}


def check_utility_bound(trace: LoadedTrace) -> CheckResult:
    """Flemings et al. 2024, Theorem 4.3: NLL(lambda) - NLL(all lambda = 1) <= max_t max_j (1 - lambda_jt)
    log(p_j(x_t) / p0(x_t)), on the recorded teacher-forced steps with the recorded lambdas; a NaN in
    either side fails, naming the steps.

    Args:
        trace: the loaded run (load_trace).
        Its per-step distributions are read window by window (payload or models).

    Returns:
        The "utility_theorem_4_3" CheckResult: SKIPPED for a mechanism without mixing weights, free
        generation, or without the per-step distributions; FAIL when the NLL gap exceeds the bound
        (+1e-9) or a term is NaN; else PASS with the gap (nats per token) and the bound.
    """
    return trace.run_check(utility_bound_over_windows(trace))


def utility_bound_over_windows(trace: LoadedTrace) -> OverWindows[CheckResult]:
    """check_utility_bound written over windows (dpledger.audit.loader.OverWindows): what dpledger.audit.audit runs
    beside the other checks over one pass of the windows.

    Args:
        trace: the loaded run (load_trace).

    Returns:
        A generator that yields its window request and returns the CheckResult of check_utility_bound.
    """
    if not _uses_pmixed(trace):
        return skipped("utility_theorem_4_3", f"mechanism {trace.mechanism_type} has no mixing weights")
    if trace.manifest["data"]["stream"] != "teacher-forced" or not trace.has_payload:
        return skipped("utility_theorem_4_3", "needs teacher-forced steps and the exact-replay payload")
    nll_mixed: list[torch.Tensor] = []
    nll_ensemble: list[torch.Tensor] = []
    nan_steps: list[int] = []
    right = -np.inf
    for _, window in (yield from trace.windows(_utility_window, desc="utility bound")):
        nll_mixed.append(window["nll_mixed"])
        nll_ensemble.append(window["nll_ensemble"])
        nan_steps += window["nan_steps"]
        right = float(np.maximum(right, window["right"]))  # not max(): it would skip a NaN
    gap = float(torch.cat(nll_mixed).mean() - torch.cat(nll_ensemble).mean())
    return verdict("utility_theorem_4_3", not nan_steps and gap <= right + 1e-9,
                   f"NLL gap to the all-lambda=1 ensemble {gap:.4g} <= Theorem 4.3's bound {right:.4g}",
                   f"NaN in the mixed probability of the true token or Theorem 4.3's terms at steps "
                   f"{nan_steps[:5]}" if nan_steps else
                   f"NLL gap {gap:.4g} exceeds Theorem 4.3's bound {right:.4g}: recorded lambdas are inconsistent",
                   nll_gap=gap, bound=right)
