"""What a report reads from a run directory: the manifest, ledger.json, audit.json (if any) and the
per-step records. Every number a report prints comes from ledger.json or audit.json; the records
only feed the plots of per-step quantities."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from dpledger.decoding import trace
from dpledger.audit.audit import audit_binding, audit_integrity
from dpledger.mechanisms.aggregators import aggregator_class

AUDIT_FILE = "audit.json"


@dataclass
class RunData:
    directory: Path
    manifest: dict
    ledger: dict
    audit: dict | None
    records: list[dict]
    stale_audit: str | None = None
    """Why the directory's audit.json is not shown (made for other files, changed after the audit, or
    unreadable); None when it is current or absent."""
    audit_withheld: str = "STALE"
    """How a report names an audit it does not show: STALE (made for other files, by an older
    dpledger, or unreadable) or TAMPERED (changed after the audit: dpledger.audit.audit.audit_integrity)."""

    @property
    def label(self) -> str:
        """The method's name, as in the paper's tables; ", free generation" for a run of stream "generate"."""
        generated = self.manifest.get("data", {}).get("stream", "teacher-forced") != "teacher-forced"
        return self._method_label + (", free generation" if generated else "")

    @property
    def _method_label(self) -> str:
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
        """The ledger's epsilon entry for `method` at the run's first delta (manifest config.deltas[0]).

        Args:
            method: the RDP-to-DP conversion: "improved" (Balle et al. 2020, Theorem 21) or "classic"
                (Mironov 2017, Proposition 3).

        Returns:
            The ledger.json entry: a dict with epsilon, delta, order (None when no order gives a finite,
            nonzero bound) and method.

        Raises:
            ValueError: if ledger.json has no `method` epsilon at the run's delta.
        """
        entry = next((e for e in self.ledger["epsilon"] if isinstance(e, dict) and e.get("method") == method
                      and e.get("delta") == self.delta), None)
        if entry is None:
            raise ValueError(f"{self.directory / trace.LEDGER}: no {method} epsilon at the run's delta {self.delta!r}")
        return entry

    @property
    def data_dependent(self) -> bool:
        return bool(self.ledger["data_dependent"])


def voting_label(params: dict) -> str:
    """"Hot PATE TARGMAX_T (T=32)" for coordinated votes, "Cold PATE ..." for independent ones: the
    registered aggregator's title and its label (dpledger.mechanisms.aggregation.VoteAggregator.label).

    Args:
        params: the manifest's mechanism params of a voting run (votes, aggregator and its parameters).

    Returns:
        The label, e.g. "Hot PATE TARGMAX_T (T=32)".

    Raises:
        ValueError: if params names no registered aggregator (`aggregator_class`).
    """
    temperature = "Hot" if params["votes"] == "coordinated" else "Cold"
    aggregator = aggregator_class(params["aggregator"])
    return f"{temperature} PATE {aggregator.title} ({aggregator.label(params)})"


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory: its manifest, ledger.json, per-step records and, if present and current,
    audit.json. An audit made for other files, changed after it was made (dpledger.audit.audit.audit_integrity)
    or unreadable is withheld: `audit` is None and `stale_audit` says why.

    Args:
        run_dir: the run directory (written by `dpledger decode`).

    Returns:
        The RunData; its records are read without verifying the hash chain (`dpledger audit` does that).

    Raises:
        dpledger.decoding.trace.UnusableRunError: if `run_dir` is not a dpledger run directory.
        dpledger.decoding.trace.TraceError: (a ValueError) if the manifest, ledger.json or records cannot
            be read: the run is unfinished, or a file is damaged, a link or too large.
    """
    run_dir = Path(run_dir)
    manifest = trace.read_manifest(run_dir)
    ledger = trace.read_ledger(run_dir)
    audit, stale, withheld = None, None, "STALE"
    if (run_dir / AUDIT_FILE).exists():
        try:
            audit = trace.read_json_file(run_dir / AUDIT_FILE, "the run's audit")
            problem = audit_integrity(audit)
            withheld, stale = problem if problem is not None else ("STALE", audit_binding(run_dir, audit))
        except trace.TraceError as error:
            stale = str(error)
        if stale is not None:
            audit = None  # never print a verdict beside numbers it was not made for, or that was edited
    return RunData(run_dir, manifest, ledger, audit, trace.read_records(run_dir, verify=False), stale, withheld)


def fmt(value: object, digits: int = 4, name: str = "a report value") -> str:
    """A number as a report prints it ("inf" for +inf), "n/a" for a missing value (None); ValueError
    naming `name` for a NaN, which would otherwise print as a number-like "nan".

    Args:
        value: a number, or None for a missing value.
        digits: significant digits of a float (%g format).
        name: what the value is, for the error message.

    Returns:
        The text: "n/a", the float to `digits` significant digits ("inf" for +inf), or str(value).

    Raises:
        ValueError: if `value` is a float NaN.
    """
    if value is None:
        return "n/a"
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{name} must be a number, inf or missing, got NaN")
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Generation:
    """One block of a free-generation run: the prompt it continued and the tokens it released."""
    block: int
    first_step: int
    prompt_index: int
    prompt: str
    tokens: tuple[int, ...]
    text: str | None
    """The tokens decoded with the run's tokenizer; None when that tokenizer cannot be loaded."""
    answered_by_public: int


def generations(run: RunData) -> tuple[list[Generation], str | None]:
    """The prompts and generated continuations of a free-generation run (`[data] stream =
    "generate"`), block by block, and a note on how the text was recovered (or why it was not);
    ([], None) for a teacher-forced run, whose contexts are private held-out text and are not shown.

    Block b continues prompt b mod (number of prompts) (dpledger.decoding.blocks.run_block); the prompts are
    manifest.json's config.data.prompts, the tokens each record's output_token. The manifest names
    the tokenizer by path only (no content hash), so the text is decoded with whatever is at that
    path now; without a loadable tokenizer the token ids are given instead.

    Args:
        run: the run whose manifest and records are read.

    Returns:
        (one Generation per block in block order, the note), or ([], None) for a teacher-forced run.
    """
    if run.manifest["data"].get("stream", "teacher-forced") == "teacher-forced":
        return [], None
    prompts = run.manifest["config"]["data"]["prompts"]
    blocks: dict[int, list[dict]] = {}
    for record in sorted(run.records, key=lambda r: r["step"]):
        blocks.setdefault(record["block"], []).append(record)
    tokenizer, note = _tokenizer(run.manifest.get("tokenizer"))
    made = []
    for block, records in sorted(blocks.items()):
        tokens = tuple(int(r["output_token"]) for r in records)
        made.append(Generation(block, records[0]["step"], block % len(prompts), prompts[block % len(prompts)], tokens,
                               None if tokenizer is None else tokenizer.decode(list(tokens)),
                               sum(r["answered_by"] == "public" for r in records)))
    return made, note


_TOKENIZERS: dict[str, object] = {}


def _tokenizer(path: str | None):
    """(tokenizer, note): the tokenizer at `path` (a local directory, or a name already in the
    Hugging Face cache: a report never downloads), or (None, why not)."""
    if not path:
        return None, "manifest.json names no tokenizer: token ids are shown instead of text"
    if path not in _TOKENIZERS:
        try:
            from transformers import AutoTokenizer

            _TOKENIZERS[path] = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as error:  # noqa: BLE001 - any failure to load means: show token ids
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return None, (f"the run's tokenizer {path!r} (manifest.json's path, relative to the directory decode "
                          f"ran in) cannot be loaded here ({first[:200]}): token ids are shown instead of text")
    return _TOKENIZERS[path], (f"Text decoded with the tokenizer at {path} (manifest.json records its path, not its "
                               "content hash: the text is right if that tokenizer is unchanged).")


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0, 9), *range(11, 32), 127)}


def printable(text: str) -> str:
    """`text` with control characters other than newline and tab written as \\xNN,
    so a report shows them instead of dropping or interpreting them.

    Args:
        text: any text.

    Returns:
        The text with characters 0-8, 11-31 and 127 replaced by their \\xNN escapes.
    """
    return text.translate(_CONTROL)


def truncated(text: str, limit: int) -> tuple[str, int]:
    """(the first `limit` characters of `text`, the number of characters left out).

    Args:
        text: any text.
        limit: the most characters kept (>= 0).

    Returns:
        (`text` or its first `limit` characters, how many characters were cut: 0 when none).
    """
    return (text, 0) if len(text) <= limit else (text[:limit], len(text) - limit)
