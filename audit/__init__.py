"""Audit a run trace: replay, bound checks, neighbour ablations, a sampled game, the pitfall lint."""
from dpledger.audit.audit import AuditReport, audit_run, render_summary
from dpledger.audit.checks import CheckResult, Status
from dpledger.audit.loader import LoadedTrace, load_trace

__all__ = ["AuditReport", "CheckResult", "LoadedTrace", "Status", "audit_run", "load_trace", "render_summary"]
