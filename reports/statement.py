"""The plain-language privacy statement of a run."""
from __future__ import annotations

import math

from accounting.errors import require
from reports.run_data import RunData, fmt
from reports.tables import direction_label

_MECHANISMS = {
    "public": "The public model answers alone; the teachers are never read, so nothing private is used.",
    "ensemble": "The average of the teachers answers directly. This is not private: no guarantee is claimed.",
    "pmixed": ("PMixED (Flemings et al. 2024): each teacher's next-token distribution is projected onto a Renyi ball "
               "around the public model's, the projections are averaged and the token is sampled."),
    "adapmixed": "AdaPMixED (Flemings et al. 2024, Algorithm 1).",
    "voting": ("Hot PATE voting (Cohen et al. 2023): every teacher casts one vote from its next-token distribution, "
               "the histogram of votes goes to an aggregator, which releases a token or fails (then the public model "
               "answers)."),
}
_AGGREGATORS = {
    "targmax": "TARGMAX_T releases the plurality token if it has at least T votes",
    "tws": "TWS_{T,gamma} samples among the tokens with at least T votes in proportion to their counts",
    "dpargmax": ("DPARGMAX is Confident-GNMax (Papernot et al. 2018): a noisy check of the largest count against T, "
                 "then the noisy argmax"),
    "dpws": "DPWS adds Gaussian noise to every count, then samples TWS-style among the noisy counts at least T",
}


_RELATIONS = {"add_or_remove_one": "adding or removing one teacher", "remove_one": "removing one teacher",
              "add_one": "adding one teacher", "replace_one": "replacing one teacher"}


def privacy_statement(run: RunData) -> list[str]:
    """Paragraphs: mechanism, neighbouring relation, unit of privacy, grid, conversion, delta, what is
    data-dependent, the audit verdict and its evidence."""
    manifest, ledger = run.manifest, run.ledger
    kind, params = manifest["mechanism"]["type"], manifest["mechanism"]["params"]
    epsilon = run.epsilon()
    require(not math.isnan(epsilon["epsilon"]),
            f"{run.directory}/ledger.json: epsilon at delta={epsilon['delta']:g} must be a number or inf, got NaN")
    orders = manifest["orders"]
    mechanism = _MECHANISMS[kind]
    if kind == "adapmixed":
        screened, dependent = params.get("screening", True), params.get("data_dependent", True)
        answers = ("PMixED's answers are charged their data-dependent loss (Flemings et al. 2024, Eq. 3)" if dependent
                   else "PMixED's answers are charged Theorem 3.1's data-independent bound")
        mechanism += ((f" A noisy screening test (lam={params['lam']:g}, sigma={params['sigma']:g}, "
                       f"T={params['threshold']:g}, top-{params['top_k']}) decides whether PMixED answers or the public "
                       f"model does; {answers}." if screened else
                       f" Without a screening step, PMixED answers every query; {answers}.")
                      + f" Here: alpha={params['alpha']:g}, beta={params['beta']:g}, N={manifest['n_teachers']}.")
    elif kind == "pmixed":
        mechanism += f" Here: alpha={params['alpha']:g}, beta={params['beta']:g}, N={manifest['n_teachers']}"
        if params.get("sample_rate") is not None:
            mechanism += (f", teachers Poisson-subsampled with rate q={params['sample_rate']:g}, amplification variant "
                          f"'{params['subsampling_variant']}'")
        mechanism += (". Its per-query bound is Theorem 3.1, proven at every order: the ball holds at every order."
                      if params.get("ball") == "all-orders" else
                      ". Its per-query bound is Theorem 3.1 as claimed by the paper; that theorem is not guaranteed "
                      "for every input (docs/soundness.md).")
    elif kind == "voting":
        votes = ("coordinated: one shared random vector per step, a function of the public seed and the step only"
                 if params["votes"] == "coordinated" else "independent")
        noise = "".join(f", {name}={params[name]:g}" for name in ("gamma", "sigma", "sigma_threshold")
                        if params.get(name) is not None and (name != "gamma" or params["aggregator"] in ("tws", "dpws")))
        mechanism += (f" Here: N={manifest['n_teachers']} teachers, votes {votes}; {_AGGREGATORS[params['aggregator']]}"
                      f" (T={params['threshold']:g}{noise}).")
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
        + ("" if ledger.get("accounting") != "realised-path" else
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
