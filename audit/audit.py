"""The audit of one run: every check, the findings, and a PASS / FAIL verdict written to audit.json."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from audit import bounds, replay
from audit.ablation import check_ablation
from audit.checks import CheckResult, Status
from audit.lint import Finding, lint
from audit.loader import load_trace
from audit.sampled import check_canary_game
from decoding import trace as trace_files

AUDIT_FILE = "audit.json"
DATA_DEPENDENT_CAVEAT = ("The claimed epsilon is a data-dependent loss (Papernot et al. 2018, Section 3): it is "
                         "computed from the private data, covers the neighbours of this ensemble named by its relation, "
                         "and is not a differential-privacy guarantee that may be released; releasing or thresholding "
                         "it leaks information.")


@dataclass
class AuditReport:
    run_dir: Path
    checks: list[CheckResult]
    findings: list[Finding]
    data_dependent: bool
    seconds: float
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status is Status.FAIL]

    @property
    def verdict(self) -> str:
        return "FAIL" if self.failed else "PASS"

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    @property
    def relations(self) -> dict:
        """Per neighbouring relation tested by the ablation: claimed or not, charged for or not, the
        worst empirical epsilon and whether it is within the claim ({} when no ablation ran)."""
        ablation = next((c for c in self.checks if c.name == "neighbour_ablation"), None)
        return {} if ablation is None else dict(ablation.evidence.get("relations", {}))

    @property
    def headline(self) -> str:
        """The verdict with the relation it is for and every other relation tested, e.g.
        "PASS for remove-one; add-one NOT COVERED (empirical 25.6 > claimed 7.77)"."""
        coverage = next((c for c in self.checks if c.name == "relation_coverage"), None)
        claimed = coverage.evidence.get("claimed_relation", "").replace("_", "-") if coverage else ""
        parts = [f"{self.verdict} for {claimed}" if claimed else self.verdict]
        ablation = next((c for c in self.checks if c.name == "neighbour_ablation"), None)
        if ablation is None or ablation.status is Status.SKIPPED:  # the verdict then rests on no neighbour
            parts.append("no neighbour was tested")
        claim = ablation.evidence.get("claimed_epsilon") if ablation is not None else None
        for entry in self.relations.values():
            if not entry["claimed"]:
                state = "within the claim" if entry["within_claim"] else "NOT COVERED"
                sign = "<=" if entry["within_claim"] else ">"
                parts.append(f"{entry['relation']} {state} (empirical {entry['empirical_epsilon']:.4g} {sign} "
                             f"claimed {claim:.4g})")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"format": "dpledger-audit", "run_dir": str(self.run_dir), "verdict": self.verdict,
                "headline": self.headline,
                "failed_checks": [c.name for c in self.failed], "created_at": self.created_at,
                "seconds": round(self.seconds, 2), "data_dependent": self.data_dependent,
                "caveat": DATA_DEPENDENT_CAVEAT if self.data_dependent else None,
                "relations": self.relations,
                "checks": [c.to_dict() for c in self.checks], "findings": [f.to_dict() for f in self.findings]}


def audit_run(run_dir: str | Path, teachers_sample: int | None = None, mc_samples: int = 400,
              game_trials: int = 2000, play_game: bool = True, seed: int = 0, write: bool = True) -> AuditReport:
    """Audit a finished run directory; writes audit.json there (unless write=False)."""
    started = time.time()
    loaded = load_trace(run_dir)
    checks = [replay.check_hash_chain(loaded), replay.check_step_count(loaded), replay.check_ledger_recompute(loaded),
              replay.check_conversion(loaded), replay.check_replay(loaded), bounds.check_relation_coverage(loaded),
              bounds.check_mixing_ball(loaded),
              bounds.check_screening_cost(loaded), bounds.check_data_dependent_charge(loaded),
              bounds.check_theorem_3_1(loaded), bounds.check_utility_bound(loaded)]
    ablation, _ = check_ablation(loaded, teachers_sample, mc_samples, seed)
    checks.append(ablation)
    if play_game:
        checks.append(check_canary_game(loaded, game_trials, seed=seed)[0])
    report = AuditReport(Path(run_dir), checks, lint(loaded, ablation.evidence), any(loaded.components.values()),
                         time.time() - started)
    if write:
        trace_files.atomic_write_json(Path(run_dir) / AUDIT_FILE, report.to_dict())
    return report


def render_summary(report: AuditReport) -> str:
    """A readable summary: verdict, every check with its evidence line, findings that apply."""
    lines = [f"audit of {report.run_dir}: {report.headline}"
             + (f" (failed: {', '.join(c.name for c in report.failed)})" if report.failed else "")]
    for check in report.checks:
        lines.append(f"  [{check.status.value:<7}] {check.name}: {check.detail}")
    applying = [f for f in report.findings if f.applies]
    if applying:
        lines.append("  pitfalls that apply (SPEC section 8):")
        for finding in applying:
            lines.append(f"    #{finding.pitfall} {finding.title} [{finding.severity}]: {finding.reason}")
    if report.data_dependent:
        lines.append(f"  caveat: {DATA_DEPENDENT_CAVEAT}")
    lines.append(f"  ({report.seconds:.1f} s)")
    return "\n".join(lines)


