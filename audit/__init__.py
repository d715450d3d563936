"""Audit a run trace: replay, bound checks, neighbour ablations, a sampled game, the pitfall lint.

The names below load their modules (and torch) on first use, so that `dpledger.audit.claims` (what
`dpledger verify` reads) imports without the replay machinery."""
from typing import TYPE_CHECKING

from dpledger.accounting.lazy_import import lazy_attributes

if TYPE_CHECKING:
    from dpledger.audit.audit import AuditReport, audit_run, render_summary
    from dpledger.audit.checks import CheckResult, Status
    from dpledger.audit.loader import LoadedTrace, load_trace

__all__ = ["AuditReport", "CheckResult", "LoadedTrace", "Status", "audit_run", "load_trace", "render_summary"]
__getattr__, __dir__ = lazy_attributes(__name__, {
    "AuditReport": "dpledger.audit.audit", "audit_run": "dpledger.audit.audit", "render_summary": "dpledger.audit.audit",
    "CheckResult": "dpledger.audit.checks", "Status": "dpledger.audit.checks",
    "LoadedTrace": "dpledger.audit.loader", "load_trace": "dpledger.audit.loader"})
