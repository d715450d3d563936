"""Load a trace for auditing: manifest, verified records, ledger.json, replay payloads."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from decoding import trace
from decoding.runners import Runner, build_runner
from decoding.trace import TraceError


@dataclass
class LoadedTrace:
    directory: Path
    manifest: dict
    records: list[dict]
    ledger: dict
    chain_error: str | None
    _logits_source: str | None = "unknown"
    _ensemble: object = None

    @property
    def orders(self) -> np.ndarray:
        return np.asarray(self.manifest["orders"], dtype=np.float64)

    @property
    def mechanism_type(self) -> str:
        return self.manifest["mechanism"]["type"]

    @property
    def params(self) -> dict:
        return self.manifest["mechanism"]["params"]

    @property
    def components(self) -> dict[str, bool]:
        return self.manifest["mechanism"]["components"]

    @property
    def n_teachers(self) -> int:
        return int(self.manifest["n_teachers"])

    @property
    def has_payload(self) -> bool:
        """True when every block's logits can be had: the exact-replay payload, or (teacher-forced
        runs) the run's models, present with the same content hashes, to recompute them."""
        return self.logits_source is not None

    @property
    def logits_source(self) -> str | None:
        if self._logits_source == "unknown":
            self._logits_source = self._find_logits_source()
        return self._logits_source

    def _find_logits_source(self) -> str | None:
        if self.manifest.get("replay_payload") and all(trace.replay_path(self.directory, b).exists()
                                                       for b in self.blocks()):
            return "payload"
        if self.manifest["data"]["stream"] != "teacher-forced":
            return None
        models = self.manifest["models"]
        if not all(Path(m["source"]).exists() for m in models):
            return None
        from decoding.ensemble import Ensemble

        ensemble = Ensemble.from_pretrained(models[0]["source"], [m["source"] for m in models[1:]],
                                            self.manifest["config"]["models"]["teacher_kind"])
        if [i.content_hash for i in ensemble.identities] != [m["content_hash"] for m in models]:
            return None
        self._ensemble = ensemble
        return "models"

    def blocks(self) -> list[int]:
        return sorted({r["block"] for r in self.records})

    def block_records(self, block: int) -> list[dict]:
        return [r for r in self.records if r["block"] == block]

    def runner(self) -> Runner:
        return build_runner({"type": self.mechanism_type, **self.params}, self.n_teachers, self.manifest["relation"])

    def payload_logits(self, block: int) -> torch.Tensor:
        if self.logits_source == "models":  # the block's inputs are its recorded context tokens
            contexts = torch.tensor([[r["context_token"] for r in self.block_records(block)]])
            return self._ensemble.logits(contexts)[:, 0]
        path = trace.replay_path(self.directory, block)
        try:
            with np.load(path) as payload:
                logits = payload["logits"]
        except Exception as error:
            raise TraceError(f"{path}: unreadable replay payload ({type(error).__name__}: {error})") from None
        expected = (self.n_teachers + 1, len(self.block_records(block)), self.manifest["vocab_size"])
        if logits.shape != expected:
            raise TraceError(f"{path}: logits have shape {logits.shape}, expected {expected}")
        return torch.from_numpy(logits)

    def iter_payload(self) -> Iterator[tuple[int, list[dict], torch.Tensor]]:
        for block in self.blocks():
            yield block, self.block_records(block), self.payload_logits(block)


def load_trace(run_dir: str | Path) -> LoadedTrace:
    """TraceError (naming the file) for a foreign, truncated or corrupted directory; a broken hash
    chain is not raised here but recorded, so the audit can report it as a failed check."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TraceError(f"{run_dir}: not a directory")
    manifest = trace.read_manifest(run_dir)
    for key in ("mechanism", "orders", "n_teachers", "vocab_size", "config", "relation"):
        if key not in manifest:
            raise TraceError(f"{run_dir / trace.MANIFEST}: lacks the field {key!r}")
    ledger = trace.read_ledger(run_dir)
    chain_error = None
    try:
        records = trace.read_records(run_dir, verify=True)
    except TraceError as error:
        if "unreadable" in str(error) or "missing" in str(error):
            raise
        chain_error = str(error)
        records = trace.read_records(run_dir, verify=False)
    if not records:
        raise TraceError(f"{run_dir / trace.STEPS_DIR}: no committed step records")
    return LoadedTrace(run_dir, manifest, records, ledger, chain_error)
