"""ledger.json: what it holds and how it is computed from a run's per-step records.

RunTotals accumulates the records block by block into everything ledger.json holds (the composed
RDP curve, epsilons, breakdown, utility, the voting, budget, PLD and odometer summaries); finish_run
writes ledger.json and then the final record that closes the trace's chain (dpledger.decoding.trace).
The decode loop (dpledger.decoding.run) and the audit (dpledger.audit) both compute the ledger through
this module, so the audit recomputes it without importing the decode loop.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from dpledger.accounting.budget import RenyiFilter
from dpledger.accounting.conversion import ConversionMethod, EpsilonConversion, epsilon_from_rdp
from dpledger.accounting.curve import RdpCurve
from dpledger.accounting.ledger import PrivacyLedger
from dpledger.accounting.relation import NeighbouringRelation
from dpledger.accounting.strict_json import loads_json
from dpledger.accounting.summation import ExactSum, UpperSum, up_add
from dpledger.decoding import trace
from dpledger.decoding.budget import DATA_DEPENDENT_LABEL
from dpledger.decoding.runners import voting_mechanism
from dpledger.mechanisms.aggregators import aggregator_class
from dpledger.mechanisms.dp_events import dp_event_to_json, mechanism_from_dp_event
from dpledger.mechanisms.pld import (PLD_VALUE_DISCRETIZATION_INTERVAL, pld_epsilon, pld_out_of_range,
                                     pld_unavailable_reason)
from dpledger.mechanisms.pmixed import SubsamplingVariant


def component_relations(manifest: dict) -> dict[str, NeighbouringRelation]:
    """The neighbouring relation each charged component holds for. A trace written before components
    carried one labelled everything add-or-remove; its data-dependent components are Flemings et al.
    2024, Eq. 3, which covers removing a teacher only, so they are read as remove-one.

    Args:
        manifest: the run's manifest; its mechanism's `components` map each component's name to
            whether it is data-dependent, and `component_relations` (when recorded) name its relation.

    Returns:
        Each component's name mapped to the relation its charges hold for.

    Raises:
        KeyError: if the recorded component_relations lack a component.
        ValueError: if a recorded relation is not a NeighbouringRelation's value.
    """
    components = manifest["mechanism"]["components"]
    recorded = manifest["mechanism"].get("component_relations")
    if recorded is not None:
        return {name: NeighbouringRelation(recorded[name]) for name in components}
    return {name: NeighbouringRelation.REMOVE_ONE if dependent else NeighbouringRelation.ADD_OR_REMOVE_ONE
            for name, dependent in components.items()}


def step_bound_caveat(kind: str, params: dict) -> str:
    """What a filter's data-independent step bound rests on, where it is not proven outright.

    Args:
        kind: the mechanism type ("pmixed", "adapmixed", "voting", ...).
        params: the mechanism's parameters as the manifest records them.

    Returns:
        A clause to append to the budget's guarantee (starting ", which rests on ..."), or "" when
        the bound is proven (a mechanism other than PMixED and AdaPMixED, or the proof-orders or
        all-orders ball, with a proven subsampling variant where one is used).

    Raises:
        ValueError: if params' subsampling_variant is not a SubsamplingVariant's value.
    """
    if kind not in ("pmixed", "adapmixed"):
        return ""

    variant = params.get("subsampling_variant")
    if variant is not None and not SubsamplingVariant(variant).proven:
        return (f", which rests on the subsampling variant {variant}, not a proven bound (docs/soundness.md, "
                "docs/pitfalls.md)")
    if params.get("ball", "projection-order") == "projection-order":
        return (", which rests on Theorem 3.1 as claimed for the paper's one-order ball (not guaranteed: inputs "
                "exceed it, a two-token one by 22%; ball = \"proof-orders\" or \"all-orders\" is proven: docs/soundness.md)")
    return ""


LEGACY_OBSERVED_NOTE = "Flemings et al. 2024, Eq. 3 on the answered steps; not charged unless the mechanism charges it"
"""What a version 1 ledger wrote beside observed_data_dependent_total (which held the loss covering the
relation: Eq. 3 with the add-one bound under add-or-remove-one); kept so that its audit recomputes it."""


class RunTotals:
    """Everything ledger.json holds, accumulated block by block from per-step records (decode and
    audit feed the same blocks in the same order, so both get the same floats; memory is one block).

    The ledger's total holds for the neighbours every component covers (`total_relation`), whatever
    the run claims."""

    def __init__(self, manifest: dict):
        self.manifest = manifest
        # by name: the ledger (its breakdown's row order) must not depend on how the manifest's keys are ordered
        self.components = dict(sorted(manifest["mechanism"]["components"].items()))
        self.relations = component_relations(manifest)
        self.voting = manifest["mechanism"]["type"] == "voting"
        # a voting run's bounds may be for replace-one, which shares no pair with add-or-remove-one
        self.ledger = PrivacyLedger(manifest["orders"], NeighbouringRelation(manifest["relation"]) if self.voting
                                    else NeighbouringRelation.ADD_OR_REMOVE_ONE)
        self.log_prob_sum, self.scored, self.public = 0.0, 0, 0
        self.observed: dict[str, UpperSum] = {}  # record field -> its sum over the answered steps that record it
        self.released, self.correct, self.below_threshold = 0, 0, 0
        self.min_released_votes: int | None = None
        self.budget: dict | None = manifest.get("budget")
        self.budget_spent, self.budget_refused = ExactSum(), 0
        self.first_refused_step: int | None = None

    def add(self, records: list[dict]) -> None:
        """Charge one block's records (ValueError for a NaN or negative charge: nothing is added).

        Args:
            records: one block's per-step records in step order (a block's records, as committed); an
                empty list adds nothing.

        Raises:
            ValueError: if a charge is NaN or negative, or not of the ledger's orders' length
                (PrivacyLedger.charge_many); the totals are then unchanged.
        """
        if not records:
            return
        self.ledger.charge_many({name: (np.asarray([r[f"rdp_{name}"] for r in records], dtype=np.float64), dependent,
                                        self.relations[name])
                                 for name, dependent in self.components.items()})
        probs = np.asarray([r["prob_true_token"] for r in records], dtype=np.float64)
        with np.errstate(divide="ignore"):
            self.log_prob_sum += float(np.sum(np.log(probs)))
        self.scored += len(records)
        self.public += int(sum(r["answered_by"] == "public" for r in records))
        if self.voting:
            self._add_votes(records)
        if self.budget is not None:
            for record in records:  # summed exactly, as the filter spent them
                self.budget_spent.add(record["budget_charge"])
                if record["budget_refused"]:
                    self.budget_refused += 1
                    if self.first_refused_step is None:
                        self.first_refused_step = record["step"]
        # a version 3 run charged by Theorem 3.1 records no data-dependent loss (trace.records_losses)
        rows = [r for r in records if r.get("observed_data_dependent")]
        if rows:
            answered = np.asarray([r["answered_by"] == "mechanism" for r in rows])[:, None]
            bound = np.where(answered, np.asarray([r["data_independent"] for r in rows], dtype=np.float64), 0.0)
            for key in ("observed_data_dependent", "eq3_remove_one", "add_one_bound"):
                if not rows[0].get(key):  # a version 1 record, or a bound this run does not compute
                    continue
                values = np.where(answered, np.asarray([r[key] for r in rows], dtype=np.float64), 0.0)
                self.observed.setdefault(key, UpperSum(values.shape[1])).add_rows(values)
                if key == "eq3_remove_one" or (key == "observed_data_dependent" and not rows[0].get("eq3_remove_one")):
                    with np.errstate(invalid="ignore"):
                        self.observed.setdefault("min_theorem_3_1", UpperSum(values.shape[1])).add_rows(
                            np.minimum(values, bound))

    def _add_votes(self, records: list[dict]) -> None:
        """Released steps, the votes each released token had, and the teacher-forced accuracy."""
        threshold = self.manifest["mechanism"]["params"].get("threshold")   # None: the aggregator has no T
        for record in records:
            self.correct += record["output_token"] == record["true_token"]
            if record["answered_by"] != "mechanism":
                continue
            votes = dict(zip(record["vote_tokens"], record["vote_counts"])).get(record["output_token"], 0)
            self.released += 1
            self.below_threshold += threshold is not None and votes < threshold
            self.min_released_votes = votes if self.min_released_votes is None else min(self.min_released_votes, votes)

    def voting_summary(self) -> dict:
        """What a voting run released and the guarantee it has: T-threshold privacy for TARGMAX and
        TWS (Cohen et al. 2023; robustness, not DP: the ledger's epsilon is +inf), the RDP curve
        charged for the differentially private aggregators (DPARGMAX, DPWS, ...).

        Returns:
            ledger.json's "voting" object: the aggregator and its threshold T, released and failed
            steps, the yield, the fewest votes a released token had, the released tokens below T,
            the teacher-forced token accuracy (None in free generation), whether a DP guarantee
            holds, and the guarantee in words.
        """
        params, steps = self.manifest["mechanism"]["params"], self.ledger.steps
        threshold = params.get("threshold")
        threshold_private = not aggregator_class(params["aggregator"]).differentially_private
        filtered = (self.budget or {}).get("charging") == "realised-path"
        if params["accounting"] == "realised-path" and filtered:
            guarantee = ("differential privacy by the privacy filter: realised-path charges (a failed step is charged "
                         "the screen only) inside a Renyi filter are covered by fully adaptive composition (Feldman & "
                         "Zrnic 2021, Theorem 3.1): the guarantee is the budget's (epsilon, delta) (ledger budget); "
                         "the epsilons above are the realised-path odometer, not the guarantee")
        elif params["accounting"] == "realised-path":
            guarantee = ("realised-path accounting (Papernot et al. 2018's convention: a failed step is charged the "
                         "screen only): the epsilons above are an ex-post statement about this run's loss, not an RDP "
                         "guarantee of the released output (docs/soundness.md)")
        elif not threshold_private:
            guarantee = (f"differential privacy: the charged RDP curve ({params['aggregator']}, "
                         f"{params['accounting']} accounting) gives the epsilons above")
        elif self.below_threshold:
            guarantee = (f"no DP guarantee, and T-threshold privacy VIOLATED: {self.below_threshold} released tokens "
                         f"had fewer than T = {threshold:g} votes")
        else:
            guarantee = (f"no DP guarantee; every released token had at least T = {threshold:g} votes "
                         f"(T-threshold privacy, a robustness notion; Cohen et al. 2023)")
        teacher_forced = self.manifest["data"]["stream"] == "teacher-forced"
        return {"votes": params["votes"], "aggregator": params["aggregator"], "threshold": threshold,
                "teachers": self.manifest["n_teachers"], "threshold_private": threshold_private,
                "dp_guarantee": not threshold_private and (params["accounting"] == "released-output" or filtered),
                "released_steps": self.released,
                "failed_steps": steps - self.released, "yield": self.released / steps if steps else None,
                "min_votes_of_released_tokens": self.min_released_votes,
                "released_below_threshold": self.below_threshold,
                "token_accuracy": self.correct / steps if teacher_forced and steps else None,
                "guarantee": guarantee}

    def pld_summary(self, epsilons: list[dict]) -> dict:
        """PLD epsilons beside the RDP ones, where every charged component has a dp-accounting event:
        the run's steps as one composed DpEvent (exported, so the ledger can be checked in
        dp-accounting), accounted by its PLDAccountant (dpledger.mechanisms.pld). Otherwise why not.

        Args:
            epsilons: the summary's RDP epsilon rows (delta, method, epsilon, ...); the IMPROVED rows
                are compared with the PLD epsilons.

        Returns:
            ledger.json's "pld" object: `available`, and either the PLD and RDP epsilon per delta with
            the exported event (`dp_event_file`), or the `reason` there is none.
        """
        kind, params = self.manifest["mechanism"]["type"], self.manifest["mechanism"]["params"]
        reasons = {"public": "the public model alone charges nothing: there is no privacy loss to account",
                   "ensemble": "the non-private ensemble has no privacy guarantee",
                   "pmixed": "PMixED has no privacy loss distribution in dp-accounting: RDP only (Theorem 3.1)",
                   "adapmixed": "AdaPMixED's PMixED part has no privacy loss distribution in dp-accounting (only its "
                                "screen, a Gaussian, has one), and a composition is only as PLD-accountable as all "
                                "its parts: RDP only"}
        if kind != "voting":
            return {"available": False, "reason": reasons[kind]}

        mechanism = voting_mechanism(params, self.manifest["n_teachers"], self.manifest["relation"])
        step_event = mechanism.dp_event()
        if step_event is None:
            return {"available": False, "reason": pld_unavailable_reason(mechanism)}
        import dp_accounting

        charged = self.ledger.steps - self.budget_refused  # a step the filter refused charged nothing
        if charged == 0:
            return {"available": False, "reason": "no step was charged"}
        event = dp_accounting.SelfComposedDpEvent(step_event, charged)
        # the exported event must be exactly the ledger's curve, or it is not the ledger's event
        values = mechanism_from_dp_event(event, mechanism.relation).rdp_curve(self.ledger.orders).values
        total = self.ledger.total_curve().values
        if not np.allclose(values, total, rtol=1e-9, atol=0.0):
            return {"available": False, "reason": "the charges in the ledger are not the mechanism's own (the audit's "
                                                  "voting_charges check names the steps): no event reproduces them"}
        event_file = loads_json(dp_event_to_json(event, mechanism.relation))
        too_little_noise = pld_out_of_range(event)
        if too_little_noise is not None:  # the event is still exported, for dp-accounting's own use
            return {"available": False, "reason": too_little_noise, "dp_event_file": event_file}
        rows = []
        for entry in (e for e in epsilons if e["method"] == ConversionMethod.IMPROVED.value):
            pld, rdp = pld_epsilon(event, entry["delta"], mechanism.relation), entry["epsilon"]
            rows.append({"delta": entry["delta"], "pld_epsilon": pld, "rdp_epsilon": rdp,
                         "tighter": "pld" if pld < rdp else "rdp" if rdp < pld else "equal"})
        return {"available": True, "epsilon": rows, "dp_event_file": event_file,
                "relation": mechanism.relation.value, "charged_steps": charged,
                "value_discretization_interval": PLD_VALUE_DISCRETIZATION_INTERVAL,
                "note": "dp-accounting's PLDAccountant (pessimistic estimate, an upper bound; Doroshenko et al. "
                        "2022) on the run's composed event; `dpledger account from-event RUN/ledger.json` reads "
                        "the event back"}

    def odometer_summary(self, deltas: Sequence[float]) -> list[dict]:
        """A realised-path total read as an odometer (Feldman & Zrnic 2021; Whitehouse et al. 2023):
        exp((a-1)(L - C(a))) is a supermartingale, so Pr[L > C(a) + log(1/delta)/(a-1)] <= delta at an
        order a fixed before the run (the mechanism's alpha, else the grid's order nearest 2), and at
        the best of the K grid orders chosen afterwards with log(K/delta) (a union bound).

        Args:
            deltas: the run's deltas, each in (0, 1).

        Returns:
            One row per delta: the epsilon at the pre-chosen order and at the order chosen
            afterwards (both rounded up), those orders, and a note on what the numbers mean.
        """
        curve = self.ledger.total_curve()
        orders, values = np.asarray(curve.orders, dtype=np.float64), np.asarray(curve.values, dtype=np.float64)
        alpha = self.manifest["mechanism"]["params"].get("alpha", 2.0)
        fixed = int(np.argmin(np.abs(orders - alpha)))
        rows = []
        with np.errstate(over="ignore", invalid="ignore"):
            for delta in deltas:
                at_fixed = float(up_add(values[fixed], math.log(1.0 / delta) / (orders[fixed] - 1.0)))
                chosen = values + np.log(orders.size / delta) / (orders - 1.0)
                best = int(np.argmin(chosen))   # the curve holds no NaN (RdpCurve refuses it)
                rows.append({"delta": delta, "pre_chosen_order": float(orders[fixed]), "epsilon_at_pre_chosen_order":
                             at_fixed, "order_chosen_afterwards": float(orders[best]),
                             "epsilon_order_chosen_afterwards": float(up_add(values[best], float(
                                 np.log(orders.size / delta) / (orders[best] - 1.0))))})
        return [{**row, "note": "the realised loss exceeds these with probability at most delta (an ex-post "
                                "statement about this run, not an RDP guarantee; inside a filter the budget is "
                                "the guarantee)"} for row in rows]

    def budget_summary(self) -> dict:
        """The privacy filter's plan and what it did: spent, the steps it refused, and what holds.

        Returns:
            ledger.json's "budget" object: the manifest's plan plus `spent` (the exact sum of the
            charges, rounded up), epsilon_spent_at_order, private answers, refused steps, the first
            refused step and the guarantee in words.

        Raises:
            ValueError: if the run has no privacy filter (its manifest records no budget).
        """
        plan = self.budget
        if plan is None:
            raise ValueError("the run has no privacy filter: its manifest records no budget")
        spent = RenyiFilter(plan["epsilon"], plan["delta"], plan["order"])
        spent.set_state(self.budget_spent)
        if plan["data_dependent"]:
            guarantee = DATA_DEPENDENT_LABEL
        elif plan.get("charging") == "realised-path" and math.isfinite(plan["step_bound_at_order"]):
            guarantee = (f"(epsilon, delta) = ({plan['epsilon']:g}, {plan['delta']:g}) by the filter at order "
                         f"{plan['order']:g}: every answered step was charged the screen's data-independent bound "
                         f"{plan['screen_bound_at_order']:.6g}, plus the answer's {plan['answer_bound_at_order']:.6g} "
                         "where the screen passed; the decision is released before the answer is charged and each "
                         "step is admitted on its largest charge, so fully adaptive composition holds (Feldman & Zrnic "
                         "2021, Theorem 3.1; Whitehouse et al. 2023)"
                         + step_bound_caveat(self.manifest["mechanism"]["type"], self.manifest["mechanism"]["params"])
                         + "; the ledger's realised-path totals at other orders are an odometer reading, not the "
                           "guarantee")
        elif math.isfinite(plan["step_bound_at_order"]):
            guarantee = (f"(epsilon, delta) = ({plan['epsilon']:g}, {plan['delta']:g}) by the filter at order "
                         f"{plan['order']:g}: every answered step was charged the mechanism's data-independent bound "
                         f"{plan['step_bound_at_order']:.6g} there (Feldman & Zrnic 2021, Theorem 3.1)"
                         + step_bound_caveat(self.manifest["mechanism"]["type"], self.manifest["mechanism"]["params"]))
            if any(self.components.values()):
                guarantee += ("; the ledger's data-dependent loss is a separate measurement on the private data and "
                              "may exceed the budget (its add-one bound is loose): it is not the guarantee")
        else:
            guarantee = "the mechanism has no data-independent bound at any order: the filter answered every step publicly"
        return {**plan, "spent": self.budget_spent.upper(), "epsilon_spent_at_order": spent.epsilon_spent(),
                "private_answers": self.ledger.steps - self.budget_refused, "refused_steps": self.budget_refused,
                "first_refused_step": self.first_refused_step, "guarantee": guarantee}

    def summary(self) -> dict:
        """ledger.json's content: composed curve, epsilon per delta and conversion, breakdown, utility.

        Returns:
            ledger.json's object: steps, the composed ledger, epsilon per delta and conversion method,
            the breakdown at the first delta, perplexity (teacher-forced non-voting runs), the
            warnings the conversions raised, and the voting, budget, PLD, odometer and observed
            data-dependent summaries that apply to the run.
        """
        ledger, manifest = self.ledger, self.manifest
        deltas = manifest["config"]["deltas"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            epsilons = [{"delta": d, "method": m.value, **_conversion_dict(ledger.epsilon(d, m))}
                        for d in deltas for m in ConversionMethod]
            breakdown = ledger.breakdown(deltas[0]).to_dict()
        teacher_forced = manifest["data"]["stream"] == "teacher-forced"
        # a voting step releases a point mass: its utility is the accuracy (in "voting"), not a perplexity
        ppl = (float(np.exp(-self.log_prob_sum / self.scored)) if teacher_forced and self.scored and not self.voting
               else None)
        summary = {
            "steps": ledger.steps, "data_dependent": ledger.total_curve().data_dependent,
            "direction": ledger.total_curve().direction.value,
            "relation": ledger.total_relation.value, "claimed_relation": manifest["relation"],
            "accounting": manifest["mechanism"]["params"].get("accounting"),
            "ledger": ledger.to_dict(), "epsilon": epsilons, "breakdown": breakdown,
            "perplexity": ppl, "answered_by_public": self.public,
            "warnings": sorted({str(w.message) for w in caught}),
        }
        if self.voting:
            summary["voting"] = self.voting_summary()
        if self.budget is not None:
            summary["budget"] = self.budget_summary()
        summary["pld"] = self.pld_summary(epsilons)
        # (a version 1 ledger had no odometer: its audit recomputes what it wrote)
        if manifest["mechanism"]["params"].get("accounting") == "realised-path" and manifest.get("records_version",
                                                                                                1) >= 2:
            summary["odometer"] = self.odometer_summary(deltas)
        if self.observed:
            covering = NeighbouringRelation(manifest["relation"]) if self.components.get(
                "pmixed_data_dependent") else NeighbouringRelation.REMOVE_ONE
            version = manifest.get("records_version", 1)
            totals = {  # ledger key -> (record field, relation it covers, what it holds)
                "observed_data_dependent_total": (
                    "observed_data_dependent", covering if version > 1 else NeighbouringRelation.REMOVE_ONE,
                    "the data-dependent loss the run measures for its relation on the answered steps: Flemings et al. "
                    "2024, Eq. 3 (remove-one), with the add-one bound where the relation adds a teacher; charged "
                    "only when the mechanism charges it" if version > 1 else LEGACY_OBSERVED_NOTE),
                "eq3_remove_one_total": (
                    "eq3_remove_one", NeighbouringRelation.REMOVE_ONE,
                    "Flemings et al. 2024, Eq. 3 (the worst removed teacher) on the answered steps: remove-one only"),
                "add_one_bound_total": (
                    "add_one_bound", NeighbouringRelation.ADD_ONE,
                    "the add-one bound (dpledger.mechanisms.add_one.add_one_divergence_bounds) on the answered steps: an upper "
                    "bound for any added teacher, not an exact loss"),
                "min_data_dependent_theorem_3_1_total": (
                    "min_theorem_3_1", NeighbouringRelation.REMOVE_ONE,
                    ("min(Eq. 3, Theorem 3.1) per step" if version > 1 else "min(data-dependent, Theorem 3.1) per step")
                    + ": NOT a valid charge, Theorem 3.1 is not guaranteed (docs/soundness.md); recorded for "
                      "comparison only")}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for key, (field, relation, note) in totals.items():
                    if field in self.observed:
                        curve = RdpCurve(manifest["orders"], self.observed[field].upper(), relation, True)
                        summary[key] = {**curve.to_dict(), **_conversion_dict(epsilon_from_rdp(curve, deltas[0])),
                                        "note": note}
        return summary


def records_by_block(records: list[dict]) -> list[list[dict]]:
    """Records grouped by their `block` field, blocks in increasing order.

    Args:
        records: per-step records, each with a `block` index.

    Returns:
        One list per block, its records in the order given.
    """
    blocks: dict[int, list[dict]] = {}
    for record in records:
        blocks.setdefault(record["block"], []).append(record)
    return [blocks[b] for b in sorted(blocks)]


def run_totals(records: list[dict], manifest: dict) -> RunTotals:
    """RunTotals of in-memory records, fed block by block as decode feeds them.

    Args:
        records: a run's per-step records (any order of blocks; within a block, step order).
        manifest: the run's manifest.

    Returns:
        The totals after every block was added.

    Raises:
        ValueError: if a charge is NaN or negative (RunTotals.add).
    """
    totals = RunTotals(manifest)
    for block in records_by_block(records):
        totals.add(block)
    return totals


def ledger_from_records(records: list[dict], manifest: dict) -> PrivacyLedger:
    """The privacy ledger the records charge (run_totals' ledger).

    Args:
        records: a run's per-step records.
        manifest: the run's manifest.

    Returns:
        The ledger with every record's charges composed.

    Raises:
        ValueError: if a charge is NaN or negative (RunTotals.add).
    """
    return run_totals(records, manifest).ledger


def ledger_summary(records: list[dict], manifest: dict) -> dict:
    """ledger.json's content computed from in-memory records (run_totals, then RunTotals.summary).

    Args:
        records: a run's per-step records.
        manifest: the run's manifest.

    Returns:
        What ledger.json holds for these records.

    Raises:
        ValueError: if a charge is NaN or negative (RunTotals.add).
    """
    return run_totals(records, manifest).summary()


def _conversion_dict(result: EpsilonConversion) -> dict:
    return {"epsilon": result.epsilon, "order": result.order, "rdp_at_order": result.rdp_at_order,
            "conversion_term": result.conversion_term, "at_grid_edge": result.at_grid_edge,
            "data_dependent": result.data_dependent, "direction": result.direction.value}


def finish_run(out: Path, manifest: dict, running: RunTotals, blocks: int, last_record_hash: str) -> tuple[dict, dict]:
    """Write ledger.json, then the final record that closes the chain; returns both.

    Args:
        out: the run directory (its lock held by the caller).
        manifest: the run's manifest.
        running: the totals of every committed record.
        blocks: the number of committed chunks.
        last_record_hash: the chain's last record hash.

    Returns:
        (ledger.json's object, final.json's object).

    Raises:
        UnsafeFileError: if ledger.json or final.json is a link or not a regular file.
        OSError: if either file cannot be written (final.json is written only after ledger.json).
    """
    summary = running.summary()
    ledger_bytes = trace.json_bytes(summary)
    trace.atomic_write_bytes(out / trace.LEDGER, ledger_bytes)
    final = trace.final_record(manifest, running.ledger.steps, blocks, last_record_hash, ledger_bytes)
    trace.atomic_write_json(out / trace.FINAL, final)  # the run is complete from here on
    return summary, final
