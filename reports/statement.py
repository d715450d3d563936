"""The plain-language privacy statement of a run."""
from __future__ import annotations

import math

from dpledger.accounting.errors import require
from dpledger.reports.run_data import RunData, fmt
from dpledger.reports.tables import direction_label
from dpledger.mechanisms.aggregators import aggregator_class
from dpledger.mechanisms.pmixed import SubsamplingVariant

_MECHANISMS = {
    "public": "The public model answers alone; the teachers are never read, so nothing private is used.",
    "ensemble": "The average of the teachers answers directly. This is not private: no guarantee is claimed.",
    "pmixed": ("PMixED (Flemings et al. 2024, Algorithm 2): each teacher's next-token distribution is mixed with the "
               "public model's until it lies in a Renyi ball around it (radius beta*alpha at order alpha), the mixtures "
               "are averaged and the token is sampled from the average."),
    "adapmixed": "AdaPMixED (Flemings et al. 2024, Algorithm 1).",
    "voting": ("PATE voting (Cohen et al. 2023): every teacher casts one vote from its next-token distribution, "
               "the histogram of votes goes to an aggregator, which releases a token or fails (then the public model "
               "answers)."),
}
_THEOREM_3_1 = {
    "all-orders": "Theorem 3.1 (Flemings et al. 2024), proven at every order: this run's ball holds at every order",
    "proof-orders": ("Theorem 3.1 (Flemings et al. 2024), proven at the projection order and below: this run's ball "
                     "holds at the two orders its proof reads (docs/soundness.md)"),
    "projection-order": ("Theorem 3.1 (Flemings et al. 2024) as the paper claims it; with the paper's one-order ball "
                         "that theorem is not guaranteed for every input (docs/soundness.md)"),
}


def _theorem_3_1(params: dict) -> str:
    return _THEOREM_3_1[params.get("ball", "projection-order")]


def _data_dependent_loss(relation: str) -> str:
    """What the data-dependent charge of a run claiming `relation` is (dpledger.mechanisms.step.data_dependent_step_curve)."""
    if relation == "remove_one":
        return "the data-dependent loss of removing a teacher (Flemings et al. 2024, Eq. 3)"
    if relation == "add_one":
        return "the data-dependent loss of adding a teacher (the add-one bound of docs/soundness.md)"
    return ("the data-dependent loss, the larger of removing a teacher's (Flemings et al. 2024, Eq. 3) and adding "
            "one's (the add-one bound of docs/soundness.md)")


def _adapmixed(params: dict, manifest: dict) -> str:
    """What an AdaPMixED run (or one of its Table 2a ablations) answers with and is charged, step by step
    (dpledger.mechanisms.step.adapmixed_step)."""
    screened, dependent = params.get("screening", True), params.get("data_dependent", True)
    realised = params.get("accounting") == "realised-path"
    answer = _data_dependent_loss(manifest["relation"])
    screen = (f"A noisy screening test (lam={params['lam']:g}, sigma={params['sigma']:g}, T={params['threshold']:g}, "
              f"top-{params['top_k']}) decides whether PMixED answers or the public model does. The screen is charged "
              "its RDP (Flemings et al. 2024, Theorem 4.1) at every step")
    if screened and dependent:
        text = (f" {screen}; PMixED's answer is charged {answer}, "
                + ("only at the steps where the screen passed (Flemings et al. 2024, Theorem 4.2 as stated)." if realised
                   else "at every step, the screen passed or not: a step releases the decision and the token, and "
                        "its loss is at most the screen's plus the answer's whichever branch was taken "
                        "(Mironov 2017, Proposition 1; docs/soundness.md)."))
    elif screened:
        text = (f" {screen}; PMixED's answer is charged Theorem 3.1's data-independent bound at every step, the "
                f"screen passed or not (this ablation charges it whatever the accounting). That bound is "
                f"{_theorem_3_1(params)}.")
    else:
        text = f" Without a screening step, PMixED answers every query and every step is charged {answer}."
    return text + f" Here: alpha={params['alpha']:g}, beta={params['beta']:g}, N={manifest['n_teachers']}."


def _pmixed(params: dict, manifest: dict) -> str:
    text = f" Here: alpha={params['alpha']:g}, beta={params['beta']:g}, N={manifest['n_teachers']}"
    if params.get("sample_rate") is None:
        return text + f". Every step is charged {_theorem_3_1(params)}."

    variant = SubsamplingVariant(params["subsampling_variant"])
    return (text + f", each teacher Poisson-subsampled at every step with rate q={params['sample_rate']:g}. Every step "
            f"is charged the subsampled bound of variant '{variant.value}' (Flemings et al. 2024, Theorem A.4; "
            f"Zhu & Wang 2019), which amplifies Theorem 3.1: {variant.soundness}"
            + ("" if variant.proven else " (docs/soundness.md)") + ".")


def _voting(params: dict, manifest: dict) -> str:
    """The votes, the registered aggregator's description and parameters, and what every step is charged
    (dpledger.mechanisms.aggregation.VoteAggregator.charge_statement)."""
    votes = ("coordinated (Hot PATE): one shared random vector per step, a function of the public seed and the step "
             "only" if params["votes"] == "coordinated" else "independent (cold PATE)")
    aggregator = aggregator_class(params["aggregator"])
    text = (f" Here: N={manifest['n_teachers']} teachers, votes {votes}; {aggregator.description} "
            f"({aggregator.statement_parameters(params)}).")
    return text + " " + aggregator.charge_statement(params)


_RELATIONS = {"add_or_remove_one": "adding or removing one teacher", "remove_one": "removing one teacher",
              "add_one": "adding one teacher", "replace_one": "replacing one teacher"}


def _realised_path_applies(kind: str, params: dict) -> bool:
    """Whether realised-path accounting changes what is charged: only where a screen decides whether
    a charged answer is made (AdaPMixED with both its screen and its data-dependent charge; DPARGMAX).
    The ablations and the other aggregators charge every step alike whatever the accounting."""
    if params.get("accounting") != "realised-path":
        return False
    if kind == "adapmixed":
        return params.get("screening", True) and params.get("data_dependent", True)
    return kind == "voting" and aggregator_class(params.get("aggregator")).supports_realised_path


def privacy_statement(run: RunData) -> list[str]:
    """Paragraphs: mechanism, neighbouring relation, unit of privacy, grid, conversion, delta, what is
    data-dependent, the audit verdict and its evidence.

    Args:
        run: the run to describe (its manifest, ledger.json and current audit.json).

    Returns:
        The paragraphs, each one string starting with its topic ("Mechanism.", "Unit of privacy.", ...).

    Raises:
        ValueError: if the run's epsilon at its first delta is NaN, or ledger.json has no improved
            epsilon there (`RunData.epsilon`).
    """
    manifest, ledger = run.manifest, run.ledger
    kind, params = manifest["mechanism"]["type"], manifest["mechanism"]["params"]
    epsilon = run.epsilon()
    require(not math.isnan(epsilon["epsilon"]),
            f"{run.directory}/ledger.json: epsilon at delta={epsilon['delta']:g} must be a number or inf, got NaN")
    orders = manifest["orders"]
    mechanism = _MECHANISMS[kind] + {"adapmixed": _adapmixed, "pmixed": _pmixed, "voting": _voting}.get(
        kind, lambda params, manifest: "")(params, manifest)
    if epsilon["order"] is None:
        outcome = ("epsilon = 0: the output does not depend on the teachers" if epsilon["epsilon"] == 0
                   else "epsilon = inf: no order gives a guarantee")
    else:
        outcome = f"epsilon = {fmt(epsilon['epsilon'])} at order {fmt(epsilon['order'])}"
    paragraphs = [
        f"Mechanism. {mechanism}",
        f"Unit of privacy. One teacher's shard of the private data (the N={manifest['n_teachers']} shards are disjoint). "
        f"Neighbouring relation claimed: {_RELATIONS.get(manifest['relation'], manifest['relation'])}; the charged "
        f"loss covers {_RELATIONS.get(ledger.get('relation', manifest['relation']), ledger.get('relation'))}"
        + (" of this ensemble (a data-dependent loss is anchored at the actual ensemble)." if run.data_dependent else ".")
        + ("" if not _realised_path_applies(kind, params) else
           " Screened steps are charged on the realised path (" + ("Papernot et al. 2018's convention for "
           "Confident-GNMax: a failed step costs only the screen" if kind == "voting" else
           "Flemings et al. 2024, Theorem 4.2 as stated") + "): that total does not bound the released output's law "
           "(docs/soundness.md)."),
        f"Accounting. Renyi DP composed over {ledger['steps']} queries on a grid of {len(orders)} orders "
        f"({fmt(orders[0])}..{fmt(orders[-1])}), converted with the improved conversion (Balle et al. 2020, Theorem 21) "
        f"at delta={epsilon['delta']:g}: {outcome}.",
    ]
    voting = ledger.get("voting")
    if voting is not None:
        released = (f"{voting['released_steps']} of {ledger['steps']} steps released a token "
                    f"(yield {fmt(voting['yield'], 3)})" + ("" if voting["token_accuracy"] is None else
                                                           f", token accuracy {fmt(voting['token_accuracy'], 3)}"))
        paragraphs.append(f"Guarantee. {voting['guarantee'][0].upper()}{voting['guarantee'][1:]}. {released}.")
    pld = ledger.get("pld")
    if pld is not None and pld["available"]:
        row = pld["epsilon"][0]
        paragraphs.append(
            f"PLD. dp-accounting's privacy-loss-distribution accountant (Doroshenko et al. 2022; pessimistic, an "
            f"upper bound) on the run's composed event (in ledger.json) gives epsilon = {fmt(row['pld_epsilon'])} at "
            f"delta = {row['delta']:g}, against RDP's {fmt(row['rdp_epsilon'])}: "
            + ("PLD is tighter, and both hold." if row["tighter"] == "pld" else "RDP is tighter, and both hold."
               if row["tighter"] == "rdp" else "they agree."))
    elif pld is not None and kind not in ("public", "ensemble"):
        paragraphs.append(f"PLD. Not available: {pld['reason']}.")
    budget = ledger.get("budget")
    if budget is not None:
        stop = ("it never stopped the mechanism" if budget["first_refused_step"] is None else
                f"from query {budget['first_refused_step'] + 1} on, the next answer would not have fitted, and "
                f"{budget['refused_steps']} of {ledger['steps']} queries were answered by the public model at no cost")
        paragraphs.append(
            f"Budget. A Renyi privacy filter at order {fmt(budget['order'])} (Feldman & Zrnic 2021, Theorem 3.1) held "
            f"the run to epsilon = {fmt(budget['epsilon'])} at delta = {budget['delta']:g}: {stop}. "
            f"{budget['guarantee'][0].upper()}{budget['guarantee'][1:]}.")
    if direction_label(run.ledger.get("direction")) != "both":
        paragraphs.append(
            "Direction. Part of this loss bounds only D(M(D) || M(D')) at the actual data D (Papernot et al. 2018, "
            "Theorem 6), not the reverse direction D(M(D') || M(D)), which can be far larger; the total covers no more.")
    if run.data_dependent:
        paragraphs.append(
            "Data-dependent. This epsilon is computed from the private data itself. It is not a differential-privacy "
            "guarantee that may be released: publishing it, or stopping when it crosses a budget, leaks information "
            "(Papernot et al. 2018; Redberg et al. 2023). Treat it as an internal measurement.")
    elif epsilon["epsilon"] == float("inf") and voting is None:
        paragraphs.append("No guarantee. The mechanism claims no privacy at all (epsilon is infinite).")
    if run.stale_audit:
        paragraphs.append(f"Audit. The directory's audit.json is not shown: {run.stale_audit}.")
    elif run.audit is None:
        paragraphs.append("Audit. This run has not been audited: no verdict is available (run `dpledger audit`).")
    else:
        audit = run.audit
        failed = ", ".join(audit["failed_checks"]) or "none"
        ablation = next((c for c in audit["checks"] if c["name"] == "neighbour_ablation"), None)
        evidence = ""
        if ablation and ablation["status"] != "SKIPPED" and "worst_neighbour" in ablation.get("evidence", {}):
            e = ablation["evidence"]
            evidence = (f" The leave-one-teacher-out ablation found the worst neighbour to be {e['worst_neighbour']} "
                        f"with empirical epsilon {fmt(e['worst_empirical_epsilon'])} against the claimed "
                        f"{fmt(e['claimed_epsilon'])}" + ("" if e["ratio"] is None else f" (ratio {fmt(e['ratio'], 3)})")
                        + ".")
        game = next((c for c in audit["checks"] if c["name"] == "canary_game"), None)
        if game and game["status"] != "SKIPPED" and "epsilon_lower_bound" in game.get("evidence", {}):
            evidence += (f" A distinguishing game on a planted canary gave a lower bound of "
                         f"{fmt(game['evidence']['epsilon_lower_bound'])} on epsilon.")
        applying = [f for f in audit["findings"] if f["applies"] and f["severity"] in ("medium", "high")]
        if applying:
            evidence += " Pitfalls that apply: " + "; ".join(f"#{f['pitfall']} {f['title']} ({f['severity']})"
                                                            for f in applying) + "."
        headline = audit.get("headline", audit["verdict"])
        paragraphs.append(f"Audit verdict: {headline} (failed checks: {failed}).{evidence}")
    return paragraphs
