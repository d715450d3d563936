"""Fixtures of the adversarial suite: one correct AdaPMixED run and one correct PMixED run (built
once per session on a copy of the micro models that a case may move away), and `attack`, which
copies them, runs dpledger's CLI on the result and judges the answer (tests/adversarial/verdicts.py)."""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpledger.decoding import trace
from tests.forging import copy, read_json
from tests.micro import ADAPMIXED, PMIXED, MicroModels, make_run
from tests.adversarial.verdicts import AUDIT_FLAGS, GAME_FLAGS, Outcome, assert_clean, assert_report_honest, run_cli

OTHER = {"ada": "pm", "pm": "ada"}


@dataclass(frozen=True)
class Adversary:
    models: MicroModels
    """The micro models, copied under one directory so that a case can move them away."""
    assets: dict
    """What a case may move away: "models" (every model and the tokenizer), "text" (the run's data)."""
    runs: dict
    """kind ("ada", "pm") -> a correct run of AdaPMixED / PMixED on `models` (64 queries, 2 blocks)."""
    heads: dict
    """kind -> the run's published chain head."""


def movable_models(models: MicroModels, root: Path) -> tuple[MicroModels, dict]:
    target = root / "movable"
    shutil.copytree(models.public, target / "models" / "public")
    teachers = []
    for index, teacher in enumerate(models.teachers):
        teachers.append(target / "models" / f"teacher-{index}")
        shutil.copytree(teacher, teachers[-1])
    shutil.copytree(models.tokenizer, target / "models" / "tokenizer")
    (target / "text").mkdir()
    shutil.copy(models.heldout_text, target / "text" / "heldout.txt")
    movable = MicroModels(target / "models" / "public", tuple(teachers), target / "models" / "tokenizer",
                          target / "text" / "heldout.txt", target, models.canaries)
    return movable, {"models": target / "models", "text": target / "text"}


@pytest.fixture(scope="session")
def adversary(micro_models, tmp_path_factory) -> Adversary:
    root = tmp_path_factory.mktemp("adversary")
    models, assets = movable_models(micro_models, root)
    runs = {"ada": make_run(models, root / "base-ada", ADAPMIXED), "pm": make_run(models, root / "base-pm", PMIXED)}
    return Adversary(models, assets, runs, {kind: read_json(run / trace.FINAL)["head"] for kind, run in runs.items()})


class Attack:
    """One case's workbench: copies of the correct runs, the CLI and the judge."""

    def __init__(self, adversary: Adversary, capfd, tmp_path: Path):
        self.adversary, self.capfd, self.tmp_path = adversary, capfd, tmp_path

    def copy(self, kind: str, name: str = "run") -> Path:
        return copy(self.adversary.runs[kind], self.tmp_path / name)

    def other(self, kind: str) -> Path:
        """The correct run of the other mechanism (read it, never change it)."""
        return self.adversary.runs[OTHER[kind]]

    def head(self, kind: str) -> str:
        return self.adversary.heads[kind]

    def cli(self, *argv, seconds: int = 60) -> Outcome:
        return run_cli(self.capfd, *argv, seconds=seconds)

    def audit(self, run: Path, *extra, expect=(1, 2), game: bool = False, report: bool = True,
              seconds: int = 60) -> Outcome:
        """`dpledger audit` of the attacked run: a clean answer with an exit status in `expect`
        (default: FAIL, or one line and exit 2); then `dpledger report --format md` of it must not
        show a PASS the audit did not give."""
        if Path(run).is_dir():
            (Path(run) / "audit.json").unlink(missing_ok=True)
        audit = self.cli("audit", run, *(GAME_FLAGS if game else AUDIT_FLAGS), *extra, seconds=seconds)
        assert_clean(audit, expect, "audit: ")
        if report:
            assert_report_honest(self.cli("report", run, "--format", "md", seconds=seconds), audit)
        return audit

    @contextmanager
    def away(self, *assets: str):
        """The named assets ("models", "text") moved away for the duration."""
        moved = []
        try:
            for name in assets:
                source = self.adversary.assets[name]
                source.rename(source.with_name(source.name + ".away"))
                moved.append(source)
            yield
        finally:
            for source in moved:
                source.with_name(source.name + ".away").rename(source)


@pytest.fixture
def attack(adversary, capfd, tmp_path) -> Attack:
    return Attack(adversary, capfd, tmp_path)

