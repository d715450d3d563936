"""Check results: each audit check has a name, a status and its evidence."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Status(enum.Enum):
    """A check's outcome."""

    PASS = "PASS"
    FAIL = "FAIL"
    SKIPPED = "SKIPPED"  # not applicable or not checkable from what the trace holds (reason given)


@dataclass
class CheckResult:
    """One audit check's outcome: its `name`, `status`, a one-line `detail` and the `evidence` behind
    it (JSON-serialisable values, written to audit.json)."""

    name: str
    status: Status
    detail: str
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The result as audit.json records it.

        Returns:
            {"name", "status" (the Status value, e.g. "PASS"), "detail", "evidence"}.
        """
        return {"name": self.name, "status": self.status.value, "detail": self.detail, "evidence": self.evidence}


def passed(name: str, detail: str, **evidence: object) -> CheckResult:
    """A passed check.

    Args:
        name: the check's name (e.g. "replay").
        detail: one line saying what was found.
        **evidence: what the verdict rests on (JSON-serialisable values).

    Returns:
        A CheckResult with status PASS.
    """
    return CheckResult(name, Status.PASS, detail, evidence)


def failed(name: str, detail: str, **evidence: object) -> CheckResult:
    """A failed check.

    Args:
        name: the check's name (e.g. "replay").
        detail: one line saying what is wrong.
        **evidence: what the verdict rests on (JSON-serialisable values).

    Returns:
        A CheckResult with status FAIL.
    """
    return CheckResult(name, Status.FAIL, detail, evidence)


def skipped(name: str, detail: str, **evidence: object) -> CheckResult:
    """A check that does not apply or cannot be made from what the trace holds.

    Args:
        name: the check's name (e.g. "replay").
        detail: one line giving the reason.
        **evidence: anything the reason rests on (JSON-serialisable values).

    Returns:
        A CheckResult with status SKIPPED.
    """
    return CheckResult(name, Status.SKIPPED, detail, evidence)


def verdict(name: str, ok: bool, detail_ok: str, detail_fail: str, **evidence: object) -> CheckResult:
    """A passed or failed check, as `ok` decides.

    Args:
        name: the check's name (e.g. "replay").
        ok: whether the check passed.
        detail_ok: the detail line when it passed.
        detail_fail: the detail line when it failed.
        **evidence: what the verdict rests on (JSON-serialisable values), recorded either way.

    Returns:
        A CheckResult with status PASS and `detail_ok` if `ok`, else FAIL and `detail_fail`.
    """
    return passed(name, detail_ok, **evidence) if ok else failed(name, detail_fail, **evidence)
