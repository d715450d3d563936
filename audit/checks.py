"""Check results: each audit check has a name, a status and its evidence."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Status(enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIPPED = "SKIPPED"  # not applicable or not checkable from what the trace holds (reason given)


@dataclass
class CheckResult:
    name: str
    status: Status
    detail: str
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status.value, "detail": self.detail, "evidence": self.evidence}


def passed(name: str, detail: str, **evidence) -> CheckResult:
    return CheckResult(name, Status.PASS, detail, evidence)


def failed(name: str, detail: str, **evidence) -> CheckResult:
    return CheckResult(name, Status.FAIL, detail, evidence)


def skipped(name: str, detail: str, **evidence) -> CheckResult:
    return CheckResult(name, Status.SKIPPED, detail, evidence)


def verdict(name: str, ok: bool, detail_ok: str, detail_fail: str, **evidence) -> CheckResult:
    return passed(name, detail_ok, **evidence) if ok else failed(name, detail_fail, **evidence)
