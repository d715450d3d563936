"""What a report reads from a run directory: the manifest, ledger.json, audit.json (if any) and the
per-step records. Every number a report prints comes from ledger.json or audit.json; the records
only feed the plots of per-step quantities."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from decoding import trace

AUDIT_FILE = "audit.json"


@dataclass
class RunData:
    directory: Path
    manifest: dict
    ledger: dict
    audit: dict | None
    records: list[dict]
    stale_audit: str | None = None
    """Why the directory's audit.json is not shown (made for other files, or unreadable); None when
    it is current or absent."""

    @property
    def label(self) -> str:
        mechanism = self.manifest["mechanism"]
        params = mechanism["params"]
        kind = mechanism["type"]
        if kind == "adapmixed":
            if not params.get("screening", True):
                return "AdaPMixED with only data-dependence"
            if not params.get("data_dependent", True):
                return "PMixED with noisy screening"
            return "AdaPMixED"
        if kind == "voting":
            return voting_label(params)
        return {"public": "Public model", "ensemble": "Non-private ensemble",
                "pmixed": "PMixED" + (f" (q={params['sample_rate']:g}, {params['subsampling_variant']})"
                                      if params.get("sample_rate") is not None else "")}[kind]

    @property
    def delta(self) -> float:
        return self.manifest["config"]["deltas"][0]

    def epsilon(self, method: str = "improved") -> dict:
        entry = next((e for e in self.ledger["epsilon"] if isinstance(e, dict) and e.get("method") == method
                      and e.get("delta") == self.delta), None)
        if entry is None:
            raise ValueError(f"{self.directory / trace.LEDGER}: no {method} epsilon at the run's delta {self.delta!r}")
        return entry

    @property
    def data_dependent(self) -> bool:
        return bool(self.ledger["data_dependent"])


_AGGREGATOR_NAMES = {"targmax": "TARGMAX_T", "tws": "TWS_{T,gamma}", "dpargmax": "DPARGMAX (Confident-GNMax)",
                     "dpws": "DPWS"}


def voting_label(params: dict) -> str:
    """"Hot PATE TARGMAX_T (T=32)" for coordinated votes, "Cold PATE ..." for independent ones."""
    temperature = "Hot" if params["votes"] == "coordinated" else "Cold"
    gamma = f", gamma={params['gamma']:g}" if params["aggregator"] in ("tws", "dpws") else ""
    return f"{temperature} PATE {_AGGREGATOR_NAMES[params['aggregator']]} (T={params['threshold']:g}{gamma})"


def load_run(run_dir: str | Path) -> RunData:
    run_dir = Path(run_dir)
    manifest = trace.read_manifest(run_dir)
    ledger = trace.read_ledger(run_dir)
    audit, stale = None, None
    if (run_dir / AUDIT_FILE).exists():
        from audit.audit import audit_binding

        try:
            audit = trace.read_json_file(run_dir / AUDIT_FILE, "the run's audit")
            stale = audit_binding(run_dir, audit)
        except trace.TraceError as error:
            stale = str(error)
        if stale is not None:
            audit = None  # never print a verdict beside numbers it was not made for
    return RunData(run_dir, manifest, ledger, audit, trace.read_records(run_dir, verify=False), stale)


def fmt(value, digits: int = 4, name: str = "a report value") -> str:
    """A number as a report prints it ("inf" for +inf), "n/a" for a missing value (None); ValueError
    naming `name` for a NaN, which would otherwise print as a number-like "nan"."""
    if value is None:
        return "n/a"
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{name} must be a number, inf or missing, got NaN")
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)
