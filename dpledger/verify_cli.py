"""`dpledger verify CLAIM.toml`: check a published privacy claim without a trace.

Recomputes the claimed epsilon under every accounting variant that applies to the mechanism, lints
the declared accounting against known pitfalls, and answers: reproduced? sound? and the sound
epsilon (the smallest bound for the mechanism as declared: proven, or for PMixED's paper's ball
the smallest resting on Theorem 3.1 alone, labelled conditional). Exit status 0: reproduced and
proven sound; 1: conditional, not sound, not reproduced, or not checkable without a trace (the
output says which); 2: bad input. The claim TOML schema is in docs/verify.md."""
from __future__ import annotations

import argparse
import json
import math


def add_parser(subparsers) -> None:
    """Add `dpledger verify` to the command line: the claim file and --json (the module docstring is
    its help).

    Args:
        subparsers: the `dpledger` parser's subcommands (ArgumentParser.add_subparsers' action).
    """
    parser = subparsers.add_parser("verify", help="check a published (epsilon, delta) claim without a trace",
                                   description=__doc__)
    parser.add_argument("claim", help="claim TOML file (docs/verify.md; examples in examples/claims/)")
    parser.add_argument("--json", action="store_true", help="print one strict JSON object")
    parser.set_defaults(handler=run)


def strict_json(record: dict) -> str:
    """One strict JSON object (json.dumps(allow_nan=False)): +inf is written as null and each such
    field is named in `null_reason`.

    Args:
        record: a verdict's JSON object (`ClaimVerdict.to_dict`): dicts, lists, numbers (numpy scalars
            too), strings, booleans and None.

    Returns:
        The JSON text, indented by 2; `null_reason` is added only when some value was infinite.

    Raises:
        ValueError: if `record` holds a NaN (json.dumps with allow_nan=False).
    """
    nulled = []

    def clean(value, path):
        if isinstance(value, dict):
            return {key: clean(item, f"{path}.{key}" if path else key) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(item, f"{path}[{i}]") for i, item in enumerate(value)]
        if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
            return value
        if hasattr(value, "item"):  # numpy scalars
            value = value.item()
        if isinstance(value, float) and math.isinf(value):
            nulled.append(path)
            return None
        return value

    cleaned = clean(record, "")
    if nulled:
        cleaned["null_reason"] = (f"{', '.join(nulled)}: +inf (no guarantee: no order of the grid gives a finite "
                                  "bound, or no variant is proven), written as null")
    return json.dumps(cleaned, indent=2, allow_nan=False)


def _format(value) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.4f}"


def render(verdict) -> str:
    """A short table of the variants, the lint findings and the three answers.

    Args:
        verdict: the claim's verdict (dpledger.audit.claims.ClaimVerdict).

    Returns:
        The text, one line per row, finding and note, ending with the reproduced, sound, sound epsilon
        and verdict lines (no trailing newline).
    """
    claim = verdict.claim
    lines = [f"claim: {claim.source or claim.kind}",
             f"  {claim.kind}, {claim.queries} queries, delta = {claim.delta:g}, claimed epsilon = {claim.epsilon:g}, "
             f"relation {verdict.relation.label}"]
    if verdict.variants:
        lines.append(f"  {'variant':<34} {'conv.':<9} {'epsilon':>10} {'order':>6}  {'soundness':<15} repro.")
        for row in verdict.variants:
            spread = (f"  [{_format(row.epsilon_range[0])}, {_format(row.epsilon_range[1])}]"
                      if row.epsilon_range else "")
            mark = "*" if row.declared else " "
            lines.append(f" {mark}{row.name:<34} {row.conversion:<9} {_format(row.epsilon):>10} "
                         f"{'-' if row.order is None else format(row.order, 'g'):>6}  "
                         f"{row.level + (' (part)' if row.component else ''):<15} {'yes' if row.reproduces else '-'}"
                         f"{spread}")
        lines.append("  (* = the accounting the claim declares; [min, max] over simulated sample-size seeds; repro. yes = "
                     "the claimed value is this value at the claim's printed precision, or lies in [min, max])")
        lines.append("  (soundness: proven = a proof covers this accounting (the paper's or docs/soundness.md); conditional = rests on a "
                     "condition not shown for this mechanism; unsound = does not bound the loss; docs/verify.md)")
    for finding in verdict.findings:
        lines.append(f"  lint [{finding.severity}] {finding.id}: {finding.message}")
    for note in verdict.notes:
        lines.append(f"  note: {note}")
    reproduced = {True: f"yes, by {verdict.reproduced_by}", False: "no",
                  None: "cannot be decided without a trace"}[verdict.reproduced]
    sound = {True: "yes", False: "no", None: "cannot be decided without a trace"}[verdict.sound]
    lines += [f"reproduced: {reproduced}", f"sound: {sound}",
              f"sound epsilon: {_format(verdict.sound_epsilon)}"
              + (f" ({verdict.sound_variant}; {verdict.sound_basis})" if verdict.sound_variant
                 else " (no variant is proven)"),
              f"verdict: {verdict.verdict}: {verdict.statement}"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """`dpledger verify CLAIM.toml`: verify the claim (dpledger.audit.claims.verify_file) and print the
    verdict's table, or one strict JSON object with --json.

    Args:
        args: the parsed flags of `dpledger verify`.

    Returns:
        The exit status of the verdict: 0 reproduced and proven sound; 1 conditional, not sound, not
        reproduced, or not checkable without a trace.

    Raises:
        ValueError: if the claim file is not a valid claim (docs/verify.md); `main` maps it to 2.
        OSError: if the claim file cannot be read.
    """
    from dpledger.audit.claims import verify_file

    verdict = verify_file(args.claim)
    print(strict_json(verdict.to_dict()) if args.json else render(verdict))
    return verdict.exit_code
