"""The audit of one run: every check, the findings, and a verdict written to audit.json.

Verdicts: PASS (the claimed charges were recomputed from the run's models or its replay payload and
every check passed), FAIL (a check failed), UNVERIFIED (nothing failed, but the charges could not
be recomputed: only the trace's integrity and internal consistency were checked). The command
line exits 0, 1 and 3 for them, and 2 for input it cannot use.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from tqdm.auto import tqdm

from dpledger.audit import bounds, consistency, replay, voting
from dpledger.audit.ablation import neighbour_ablation_over_windows
from dpledger.audit.bracket import check_epsilon_bracket
from dpledger.audit.budget import check_budget_filter
from dpledger.audit.checks import CheckResult, Status, failed, skipped
from dpledger.audit.lint import Finding, lint
from dpledger.audit.loader import LoadedTrace, OverWindows, WindowRequest, load_trace
from dpledger.audit.sampled import check_canary_game
from dpledger.decoding import trace as trace_files
from dpledger.decoding.process_memory import retain_freed_memory

AUDIT_FILE = "audit.json"
DATA_DEPENDENT_CAVEAT = ("The claimed epsilon is a data-dependent loss (Papernot et al. 2018, Section 3): it is "
                         "computed from the private data, covers the neighbours of this ensemble named by its relation, "
                         "and is not a differential-privacy guarantee that may be released; releasing or thresholding "
                         "it leaks information.")


@dataclass
class AuditReport:
    """What `audit_run` found for one run: every check's result, the pitfall findings, whether the
    claimed loss is data-dependent, and the verdict they give (PASS, FAIL or UNVERIFIED)."""

    run_dir: Path
    checks: list[CheckResult]
    findings: list[Finding]
    data_dependent: bool
    seconds: float
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status is Status.FAIL]

    audited: dict = field(default_factory=dict)
    check_seconds: dict[str, float] = field(default_factory=dict)
    """Each check's wall time (seconds), in the order of `checks`: where an audit spends its time. The checks
    that read every window run over one pass of them; each is timed on its own windows' work and its own."""
    not_written: str | None = None
    """Why audit.json could not be written (a read-only run, say), in one line; the verdict stands."""

    @property
    def verified(self) -> bool:
        """The claimed charges were recomputed (the replay check ran and passed)."""
        replayed = next((c for c in self.checks if c.name == "replay"), None)
        return replayed is not None and replayed.status is Status.PASS

    @property
    def verdict(self) -> str:
        if self.failed:
            return "FAIL"
        return "PASS" if self.verified else "UNVERIFIED"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def verification(self) -> dict:
        """What the verdict rests on: where the charges were recomputed from (or why not), and
        which checks passed, failed or were skipped."""
        replayed = next((c for c in self.checks if c.name == "replay"), None)
        final = next((c for c in self.checks if c.name == "final_record"), None)
        return {"charges_recomputed_from": replayed.evidence.get("source") if self.verified and replayed is not None
                                           else None,
                "cross_checked_with_models": bool(replayed and replayed.evidence.get("cross_checked_with_models")),
                "not_recomputed_because": None if self.verified or replayed is None else replayed.detail,
                "head_anchored": bool(final and final.evidence.get("anchored")),
                "passed": [c.name for c in self.checks if c.status is Status.PASS],
                "failed": [c.name for c in self.failed],
                "skipped": [c.name for c in self.checks if c.status is Status.SKIPPED]}

    def check(self, name: str) -> CheckResult:
        """One check's result by name.

        Args:
            name: the check's name, e.g. "replay" or "neighbour_ablation".

        Returns:
            The first check of that name in the report.

        Raises:
            StopIteration: if the report holds no check of that name.
        """
        return next(c for c in self.checks if c.name == name)

    @property
    def relations(self) -> dict:
        """Per neighbouring relation tested by the ablation: claimed or not, charged for or not, the
        worst empirical epsilon and whether it is within the claim ({} when no ablation ran)."""
        ablation = next((c for c in self.checks if c.name == "neighbour_ablation"), None)
        return {} if ablation is None else dict(ablation.evidence.get("relations", {}))

    @property
    def bracket(self) -> dict | None:
        """The epsilon bracket (dpledger.audit.bracket): per requested delta the claim (upper), the certified
        lower bound, their ratio and the neighbour attaining it; None when none was built."""
        check = next((c for c in self.checks if c.name == "epsilon_bracket"), None)
        if check is None or check.status is Status.SKIPPED or "rows" not in check.evidence:
            return None
        return {key: check.evidence[key] for key in ("rows", "claimed_relation", "confidence")}

    @property
    def headline(self) -> str:
        """The verdict with the relation it is for and every other relation tested, e.g.
        "PASS for remove-one; add-one NOT COVERED (empirical 25.6 > claimed 7.77)"."""
        coverage = next((c for c in self.checks if c.name == "relation_coverage"), None)
        claimed = coverage.evidence.get("claimed_relation", "").replace("_", "-") if coverage else ""
        parts = [f"{self.verdict} for {claimed}" if claimed else self.verdict]
        if self.verdict == "PASS" and self.verification["charges_recomputed_from"] == "payload" \
                and not self.verification["cross_checked_with_models"]:
            models = next((c for c in self.checks if c.name == "models"), None)
            why = (models.detail if models is not None and models.status is Status.SKIPPED
                   else "the run's models were not there to check it against")
            parts.append(f"charges recomputed from the replay payload alone ({why})"
                         + ("" if self.verification["head_anchored"] else
                            "; without --expect-head a rewritten payload cannot be ruled out"))
        if self.verdict == "UNVERIFIED":
            parts.append("the charges were not recomputed (" + (self.verification["not_recomputed_because"] or "")
                         .removeprefix("the charges cannot be recomputed: ") + "); only the trace's integrity and "
                         "internal consistency were checked")
        threshold = next((c for c in self.checks if c.name == "vote_threshold"), None)
        if threshold is not None and threshold.status is Status.PASS:
            parts.append("no DP guarantee (epsilon +inf); " + (
                "T-threshold privacy verified: " if self.verified else
                "T-threshold privacy holds on the recorded histograms, which were not recomputed: ") + threshold.detail)
        ablation = next((c for c in self.checks if c.name == "neighbour_ablation"), None)
        if ablation is None or ablation.status is Status.SKIPPED:  # the verdict then rests on no neighbour
            parts.append("no neighbour was tested")
        if self.bracket is not None:
            for row in self.bracket["rows"]:
                by = " (the privacy filter's budget)" if row.get("claimed_by") == "the privacy filter's budget" else ""
                parts.append(f"epsilon(delta={row['delta']:g}) in [{row['lower']:.4g}, {row['upper']:.4g}] (certified "
                             f"lower bound, claim{by}; claim / lower bound = {row['ratio']:.3g})")
        claim = ablation.evidence.get("claimed_epsilon") if ablation is not None else None
        for entry in self.relations.values():
            if not entry["claimed"]:
                state = "within the claim" if entry["within_claim"] else "NOT COVERED"
                sign = "<=" if entry["within_claim"] else ">"
                parts.append(f"{entry['relation']} {state} (empirical {entry['empirical_epsilon']:.4g} {sign} "
                             f"claimed {claim:.4g})")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        """audit.json's content, ending with `digest` (audit_digest) over everything else.

        Returns:
            A JSON-serialisable dict: format, run_dir, verdict, headline, exit_code, verification,
            audited (the hashes audited), failed_checks, created_at, seconds, check_seconds (each check's wall
            time), data_dependent, caveat, relations, bracket, checks, findings, digest.
        """
        content = {"format": "dpledger-audit", "run_dir": str(self.run_dir), "verdict": self.verdict,
                   "headline": self.headline, "exit_code": self.exit_code, "verification": self.verification,
                   "audited": self.audited,
                   "failed_checks": [c.name for c in self.failed], "created_at": self.created_at,
                   "seconds": round(self.seconds, 2),
                   "check_seconds": {name: round(value, 3) for name, value in self.check_seconds.items()},
                   "data_dependent": self.data_dependent,
                   "caveat": DATA_DEPENDENT_CAVEAT if self.data_dependent else None,
                   "relations": self.relations, "bracket": self.bracket,
                   "checks": [c.to_dict() for c in self.checks], "findings": [f.to_dict() for f in self.findings]}
        # the digest is over what a reader parses back (strict JSON: +inf round-trips through `nulls`)
        content["digest"] = audit_digest(trace_files.loads_json(trace_files.json_bytes(content).decode()))
        return content


AUDIT_DIGEST_TAG = "dpledger-audit-v1:"


def audit_digest(content: dict) -> str:
    """sha256 over the canonical form of audit.json's content without its `digest` field. The
    content holds the hashes of the manifest, ledger.json and chain head it audited, so the digest
    binds the verdict to them. Not a signature: anyone who can write the file can recompute it (or
    re-run the audit); it makes an edited verdict visible, and the published chain head
    (audit --expect-head) is what anchors a run.

    Args:
        content: audit.json's content as parsed back (a `digest` field, if present, is left out).

    Returns:
        The digest, a hex sha256 over the canonical JSON of the content under the tag AUDIT_DIGEST_TAG.
    """
    return trace_files.canonical_digest(AUDIT_DIGEST_TAG, {k: v for k, v in content.items() if k != "digest"})


def audit_integrity(audit: object) -> tuple[str, str] | None:
    """None when audit.json's content is what `dpledger audit` wrote: its digest matches and its
    verdict follows from its checks. Otherwise (state, reason): "TAMPERED" when the content was
    changed after it was written (digest mismatch, or a verdict its checks do not give), "STALE"
    when it carries no digest (an older dpledger). A report shows no verdict in either case.

    Args:
        audit: audit.json's parsed content (any JSON value: a non-object is TAMPERED).

    Returns:
        None when intact; otherwise (state, reason): state "TAMPERED" or "STALE", reason one line.
    """
    if not isinstance(audit, dict):
        return "TAMPERED", f"audit.json is not an object but {type(audit).__name__}"
    digest = audit.get("digest")
    if digest is None:
        return "STALE", "audit.json carries no digest (made by an older dpledger); re-run dpledger audit"
    if digest != audit_digest(audit):
        return "TAMPERED", "audit.json's content does not match its digest: it was changed after the audit"
    checks = audit.get("checks")
    statuses = {c.get("name"): c.get("status") for c in checks if isinstance(c, dict)} if isinstance(checks, list) else {}
    expected = ("FAIL" if "FAIL" in statuses.values() else "PASS" if statuses.get("replay") == "PASS"
                else "UNVERIFIED")
    if audit.get("verdict") != expected:
        return "TAMPERED", f"audit.json's verdict {audit.get('verdict')!r} does not follow from its checks ({expected})"
    return None


EXIT_CODES = {"PASS": 0, "FAIL": 1, "UNVERIFIED": 3}
EXIT_UNUSABLE = 2

_RECORD_READERS = ("relation_coverage", "mixing_ball", "screening_cost", "data_dependent_eq3", "theorem_3_1",
                   "utility_theorem_4_3", "neighbour_ablation", "epsilon_bracket", "canary_game", "shared_randomness", "vote_threshold",
                   "voting_charges", "sampled_aggregator")


_UNEVALUABLE = (ValueError, KeyError, TypeError, IndexError, AttributeError, ZeroDivisionError)
"""What a check raises on content it cannot evaluate (a field of the wrong type, a value out of range)."""


def _unevaluable(name: str, error: Exception) -> CheckResult:
    detail = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
    return failed(name, f"could not be evaluated on this trace: {detail}")


def _unreadable_records(name: str, loaded: LoadedTrace) -> CheckResult | None:
    if name in _RECORD_READERS and not loaded.consistent:
        return skipped(name, "the records do not fit the manifest (see records), so this check cannot read them")
    return None


def _guarded(name: str, check, loaded) -> CheckResult:
    """A check on untrusted files: content it cannot evaluate (a field of the wrong type, a value out
    of range) is a failed check naming the problem, never a traceback and never a pass."""
    unreadable = _unreadable_records(name, loaded)
    if unreadable is not None:
        return unreadable
    try:
        return check()
    except _UNEVALUABLE as error:
        return _unevaluable(name, error)


def _resumed(name: str, check: OverWindows[CheckResult],
             answer: Iterable[tuple[int, object]] | None = None) -> tuple[WindowRequest | None, CheckResult | None]:
    """The check started (no answer) or sent its answer: (its next window request, None), or (None, its
    result) once it returns or fails as _guarded says."""
    try:
        return (next(check) if answer is None else check.send(answer)), None
    except StopIteration as finished:
        return None, finished.value
    except _UNEVALUABLE as failure:
        return None, _unevaluable(name, failure)


def _as_read(pairs: list[tuple[int, object]], error: Exception | None) -> Iterator[tuple[int, object]]:
    """The pairs one check was computed, then the error met at the next window (its own window function's,
    or reading the window), raised where the check reads that window, as map_windows raises it: a check
    that stops reading before it never meets it."""
    yield from pairs
    if error is not None:
        raise error


def _over_one_pass(loaded: LoadedTrace, checks: dict[str, OverWindows[CheckResult]],
                   seconds: dict[str, float]) -> dict[str, CheckResult]:
    """Checks written over windows (dpledger.audit.loader.OverWindows), run over one pass of the payload:
    each window is read, and its distributions formed (LoadedTrace.window_distributions), once for all
    of them. Each check is then given its window function's (block, partial) pairs in block and window
    order, lazily, with an error met computing or reading a window raised where the check reads that
    window (_as_read): what map_windows gives it alone, so each result is the one the check gives alone.
    With an executor (Dask), or for a check's later requests, each request is answered by map_windows.
    `seconds` gets each check's time (its windows' and its own)."""
    results: dict[str, CheckResult] = {}
    waiting: dict[str, tuple[OverWindows[CheckResult], WindowRequest]] = {}
    for name, check in checks.items():
        started = time.perf_counter()
        first: WindowRequest | None = None
        result = _unreadable_records(name, loaded)
        if result is None:
            first, result = _resumed(name, check)
        if first is not None:
            waiting[name] = (check, first)
        elif result is not None:
            results[name] = result
        seconds[name] = time.perf_counter() - started
    pairs: dict[str, list[tuple[int, object]]] = {name: [] for name in waiting}
    errors: dict[str, Exception] = {}
    if waiting and loaded.executor is None:
        window = loaded.window_rows()
        windows = sum(-(-info.length // window) for info in loaded.blocks_info)
        with tqdm(total=windows, desc="  windows (" + ", ".join(waiting) + ")", unit="window", leave=False,
                  disable=None if loaded.progress else True) as bar:  # None: only on a terminal
            read = loaded.iter_payload(window)
            while len(errors) < len(waiting):
                try:
                    block, records, logits = next(read)
                except StopIteration:
                    break
                except Exception as error:  # noqa: BLE001 (reading the window: every check still reading meets it)
                    errors.update({name: error for name in waiting if name not in errors})
                    break
                for name, (_, asked) in waiting.items():
                    if name in errors:
                        continue
                    started = time.perf_counter()
                    try:
                        pairs[name].append((block, asked.compute(loaded, records, logits, *asked.args)))
                    except Exception as error:  # noqa: BLE001 (handed to the check where it reads its windows)
                        errors[name] = error
                    seconds[name] += time.perf_counter() - started
                bar.update(1)
    for name, (check, first) in waiting.items():
        started = time.perf_counter()
        answer = (loaded.map_windows(first.compute, *first.args, desc=first.desc) if loaded.executor is not None
                  else _as_read(pairs[name], errors.get(name)))
        request, result = _resumed(name, check, answer)
        while request is not None:   # a later request: answered alone
            request, result = _resumed(name, check, loaded.map_windows(request.compute, *request.args,
                                                                       desc=request.desc))
        if result is None:
            raise RuntimeError(f"the check {name} ended without a result")
        results[name] = result
        seconds[name] += time.perf_counter() - started
    return results


def _first_of(pair_check: OverWindows[tuple[CheckResult, object]]) -> OverWindows[CheckResult]:
    result = yield from pair_check
    return result[0]


def audit_run(run_dir: str | Path, teachers_sample: int | None = None, mc_samples: int = 400,
              game_trials: int = 2000, play_game: bool = True, seed: int = 0, write: bool = True,
              expect_head: str | None = None, executor=None, audit_out: str | Path | None = None,
              progress: bool = False) -> AuditReport:
    """Audit a finished run directory; writes audit.json there (unless write=False; to `audit_out`
    instead when given), bound to the hashes of the manifest, ledger.json and the chain head it
    audited. A write that fails (a read-only run) leaves the report's verdict as it is and says why
    in `not_written`. UnusableRunError (a ValueError) for a directory that is not a dpledger run or
    is being written; a run whose files cannot be read (damaged, planted links or FIFOs, malformed
    or duplicate-key JSON, chunks missing or unreadable) FAILs the `files` check, naming the file.

    `executor` (dpledger.audit.dask_audit.DaskWindowExecutor) computes the checks' per-window work on Dask
    workers; the report is the same as without it (dpledger.audit.loader explains why).

    Args:
        run_dir: the finished run's directory.
        teachers_sample: how many teachers the neighbour ablation removes (a seeded sample); None: all.
        mc_samples: Monte Carlo draws per step for a screened run's pass probabilities (ablation and bracket).
        game_trials: draws per world of the canary game.
        play_game: whether to play the sampled game (canary_game, or sampled_aggregator for voting runs).
        seed: seeds the audit's own randomness (teacher sample, Monte Carlo, games).
        write: whether to write audit.json.
        expect_head: the published chain head (64 lowercase hex digits) the final record must have;
            None: not anchored.
        executor: computes the per-window work elsewhere (dpledger.audit.dask_audit.DaskWindowExecutor);
            None: in this process.
        audit_out: where to write audit.json instead of the run directory.
        progress: whether progress bars show the check running and its windows of steps (on stderr, when it
            is a terminal).

    Returns:
        The AuditReport; its `not_written` says why audit.json could not be written, if so.

    Raises:
        ValueError: if expect_head is not a 64-character lowercase hex string.
        UnusableRunError: (a ValueError) if the directory is being written by a dpledger process or
            is not a dpledger run.
    """
    started = time.time()
    retain_freed_memory()
    if expect_head is not None and not (isinstance(expect_head, str) and len(expect_head) == 64
                                        and all(c in "0123456789abcdef" for c in expect_head)):
        raise ValueError(f"--expect-head must be a 64-character lowercase hex sha256, got {expect_head!r}")
    if trace_files.is_locked(Path(run_dir)):
        raise trace_files.UnusableRunError(f"{run_dir} is being written by a dpledger process; audit it when the run "
                                           "has finished")
    try:
        loaded = load_trace(run_dir)
    except trace_files.UnusableRunError:
        raise
    except trace_files.TraceError as error:  # a dpledger run whose files cannot be read: a finding, not bad input
        report = AuditReport(Path(run_dir), [failed("files", f"{error} (so no other check could run)")], [], False,
                             time.time() - started)
        if write:
            _write_audit(report, audit_out)
        return report
    loaded.executor = executor
    loaded.progress = progress
    plan = [("files", lambda: consistency.check_files(loaded)),
            ("hash_chain", lambda: replay.check_hash_chain(loaded)),
            ("final_record", lambda: consistency.check_final_record(loaded, expect_head)),
            ("manifest", lambda: consistency.check_manifest(loaded)),
            ("records", lambda: consistency.check_records(loaded)),
            ("payload", lambda: consistency.check_payload(loaded)),
            ("models", lambda: consistency.check_models(loaded)),
            ("ledger_recompute", lambda: replay.check_ledger_recompute(loaded)),
            ("conversion", lambda: replay.check_conversion(loaded)),
            ("replay", lambda: replay.check_replay(loaded)),
            ("relation_coverage", lambda: bounds.check_relation_coverage(loaded)),
            ("mixing_ball", lambda: bounds.check_mixing_ball(loaded)),
            ("screening_cost", lambda: bounds.check_screening_cost(loaded)),
            ("data_dependent_eq3", lambda: bounds.check_data_dependent_charge(loaded)),
            ("theorem_3_1", lambda: bounds.check_theorem_3_1(loaded)),
            ("utility_theorem_4_3", lambda: bounds.check_utility_bound(loaded))]
    if loaded.mechanism_type == "voting":  # Hot PATE: votes, not mixtures (dpledger.audit.voting)
        plan = plan[:11] + [("shared_randomness", lambda: voting.check_shared_randomness(loaded)),
                            ("vote_threshold", lambda: voting.check_vote_threshold(loaded)),
                            ("voting_charges", lambda: voting.check_voting_charges(loaded))]
    if loaded.manifest.get("budget") is not None:
        plan.append(("budget_filter", lambda: check_budget_filter(loaded)))
    voting_run = loaded.mechanism_type == "voting"
    evidence: dict = {}  # the ablation's, read by the bracket and the lint
    plan.append(("neighbour_ablation", lambda: voting.check_voting_ablation(loaded)))  # other runs: over windows
    plan.append(("epsilon_bracket", lambda: check_epsilon_bracket(loaded, evidence, mc_samples, seed)))
    if play_game:
        plan.append(("sampled_aggregator", lambda: voting.check_sampled_aggregator(loaded, seed=seed)) if voting_run
                    else ("canary_game", lambda: check_canary_game(loaded, game_trials, seed=seed)[0]))
    # the checks that read every window, over one pass of them (_over_one_pass), at the first one's turn
    over_windows: dict[str, Callable[[], OverWindows[CheckResult]]] = {
        "replay": lambda: replay.replay_over_windows(loaded),
        "mixing_ball": lambda: bounds.mixing_ball_over_windows(loaded),
        "data_dependent_eq3": lambda: bounds.data_dependent_charge_over_windows(loaded),
        "theorem_3_1": lambda: bounds.theorem_3_1_over_windows(loaded),
        "utility_theorem_4_3": lambda: bounds.utility_bound_over_windows(loaded)}
    if not voting_run:
        over_windows["neighbour_ablation"] = lambda: _first_of(
            neighbour_ablation_over_windows(loaded, teachers_sample, mc_samples, seed))
    planned = [name for name, _ in plan if name in over_windows]
    one_pass: dict[str, CheckResult] = {}
    checks = []
    check_seconds: dict[str, float] = {}
    with tqdm(plan, desc="audit", unit="check", leave=False, disable=None if progress else True) as bar:  # None: only on a terminal
        for name, check in bar:
            bar.set_postfix_str(name)
            check_started = time.perf_counter()
            if name in planned:
                if not one_pass:
                    one_pass = _over_one_pass(loaded, {n: over_windows[n]() for n in planned}, check_seconds)
                checks.append(one_pass[name])
            else:
                checks.append(_guarded(name, check, loaded))
                check_seconds[name] = time.perf_counter() - check_started
            if name == "neighbour_ablation":
                evidence = checks[-1].evidence
    check_seconds = {check.name: check_seconds[check.name] for check in checks if check.name in check_seconds}
    ablation = next(check for check in checks if check.name == "neighbour_ablation")
    try:
        findings = lint(loaded, ablation.evidence) if loaded.consistent else []
    except (ValueError, KeyError, TypeError, IndexError) as error:
        checks.append(failed("lint", f"the pitfall lint could not read this trace: {error}"))
        findings = []
    report = AuditReport(Path(run_dir), checks, findings, any(loaded.components.values()), time.time() - started,
                         audited={"manifest_sha256": loaded.manifest_sha256, "ledger_sha256": loaded.ledger_sha256,
                                  "head": loaded.final.get("head")}, check_seconds=check_seconds)
    if write:
        _write_audit(report, audit_out)
    return report


def _write_audit(report: AuditReport, audit_out: str | Path | None) -> None:
    """audit.json in the run (never through a link there) or at `audit_out`; a failure is noted on
    the report, never raised: the verdict must reach the user even from a read-only run."""
    target = Path(audit_out) if audit_out is not None else report.run_dir / AUDIT_FILE
    try:
        trace_files.atomic_write_json(target, report.to_dict())
    except OSError as error:
        report.not_written = f"cannot write {target}: {error.strerror or error}"
    except ValueError as error:  # refused by dpledger.accounting.safe_files
        report.not_written = f"cannot write {target}: {' '.join(str(error).split())}"


def audit_binding(run_dir: str | Path, audit: dict) -> str | None:
    """None when audit.json was made for the run's current manifest, ledger.json and chain head;
    otherwise why it is stale (a report must not print its verdict beside other numbers).

    Args:
        run_dir: the run's directory.
        audit: audit.json's parsed content.

    Returns:
        None when bound to the run as it is now; otherwise one line saying what changed (or why the
        run's files cannot be hashed).
    """
    run_dir = Path(run_dir)
    audited = audit.get("audited") if isinstance(audit, dict) else None
    if not isinstance(audited, dict):
        return "audit.json records no hashes of what it audited (made by an older dpledger)"
    try:
        bound = trace_files.MAX_JSON_BYTES
        current = {"manifest_sha256": trace_files.file_sha256(run_dir / trace_files.MANIFEST, bound),
                   "ledger_sha256": trace_files.file_sha256(run_dir / trace_files.LEDGER, bound),
                   "head": trace_files.read_final(run_dir).get("head")}
    except (OSError, ValueError) as error:
        return f"the run's files cannot be hashed ({error})"
    changed = [name.removesuffix("_sha256") for name, value in current.items() if audited.get(name) != value]
    return None if not changed else (f"audit.json was made for another {' and '.join(changed)} than the run holds now "
                                     "(re-run dpledger audit)")


def render_summary(report: AuditReport) -> str:
    """A readable summary: verdict, every check with its evidence line, findings that apply.

    Args:
        report: the audit's report.

    Returns:
        The summary, one line per check and per applying finding, newline-separated.
    """
    verdict, _, rest = report.headline.partition("; ")  # the failed checks right beside the verdict
    lines = [f"audit of {report.run_dir}: {verdict}"
             + (f" (failed: {', '.join(c.name for c in report.failed)})" if report.failed else "")
             + (f"; {rest}" if rest else "")]
    for check in report.checks:
        lines.append(f"  [{check.status.value:<7}] {check.name}: {check.detail}")
    applying = [f for f in report.findings if f.applies]
    if applying:
        lines.append("  pitfalls that apply (audit/lint.py):")
        for finding in applying:
            lines.append(f"    #{finding.pitfall} {finding.title} [{finding.severity}]: {finding.reason}")
    if report.data_dependent:
        lines.append(f"  caveat: {DATA_DEPENDENT_CAVEAT}")
    lines.append(f"  ({report.seconds:.1f} s)")
    return "\n".join(lines)


