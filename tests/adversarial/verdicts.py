"""What counts as a clean answer to an attack, for every CLI call of tests/adversarial: dpledger's
CLI run in-process under a deadline, with what a terminal would show (stdout, stderr and the
warnings a fresh interpreter prints), judged as the adversarial harness judged it:

* never a traceback, an internal error (exit 4) or a hang;
* exit 2 ("unusable input") with exactly one stderr line;
* the exit status the case expects (FAIL = 1, unusable = 2, UNVERIFIED = 3; PASS = 0 only for an
  untouched run or a change that leaves every value the same);
* a report of the attacked run that exits 0 or 2 and never prints a PASS verdict beside files the
  audit did not pass."""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

from dpledger.cli import main
from tests.deadline import deadline

AUDIT_FLAGS = ("--no-game", "--mc-samples", "10")
GAME_FLAGS = ("--mc-samples", "10", "--trials", "200")
VERDICTS = {0: "PASS", 1: "FAIL", 2: "unusable", 3: "UNVERIFIED", 4: "internal error"}


@dataclass
class Outcome:
    rc: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        """stderr's non-blank lines."""
        return [line for line in self.err.splitlines() if line.strip()]

    def __str__(self) -> str:
        """One line describing the outcome (what a failed assertion shows)."""
        line = ""
        if self.rc == 1:
            line = next((l for l in self.out.splitlines() if l.startswith("audit of")), "")
            line = line[line.find("(failed:"):] if "(failed:" in line else ""
            line += " " + " | ".join(l.strip()[:300] for l in self.out.splitlines() if l.strip().startswith("[FAIL"))[:900]
        elif self.lines:
            line = " | ".join(self.lines)[:900]
        return f"exit {self.rc} ({VERDICTS.get(self.rc, '?')}) {line}".strip()


def run_cli(capfd, *argv, seconds: int = 60) -> Outcome:
    """`dpledger *argv` in this process, with what its file descriptors 1 and 2 received; the
    warnings a fresh interpreter would print are added to stderr (pytest records them instead)."""
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        with deadline(seconds):
            try:
                rc = main([str(a) for a in argv])
            except SystemExit as error:  # argparse's own exits
                rc = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
    captured = capfd.readouterr()
    shown = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught)
    return Outcome(rc, captured.out, captured.err + shown)


def problem_of(outcome: Outcome) -> str | None:
    """What is wrong with a CLI answer whatever the case expects: a traceback, exit 4, or exit 2
    without exactly one stderr line (a hang raises Hang, a crash ends the test)."""
    if "Traceback (most recent call last)" in outcome.err:
        return "traceback on stderr: " + outcome.lines[-1][:300]
    if outcome.rc == 4:
        return "exit 4 (internal error): " + " | ".join(outcome.lines)[:600]
    if outcome.rc == 2 and len(outcome.lines) != 1:
        return f"exit 2 with {len(outcome.lines)} stderr lines: " + " | ".join(outcome.lines)[:600]
    return None


def assert_clean(outcome: Outcome, expect, what: str = "") -> None:
    """No problem_of, and an exit status in `expect` (a PASS on a changed run is named as such)."""
    problem = problem_of(outcome)
    assert problem is None, f"{what}{problem}"
    if outcome.rc not in expect:
        kind = "PASS (exit 0) on a changed run" if outcome.rc == 0 else f"exit {outcome.rc}"
        raise AssertionError(f"{what}{kind}, expected exit {'/'.join(map(str, sorted(expect)))}: {outcome}")


def report_verdicts(markdown: str) -> list[str]:
    """The audit verdicts a Markdown report prints: "Verdict: X", "Audit verdict: X" and the first
    word of the comparison table's audit column (per-check PASS rows are not verdicts)."""
    verdicts = re.findall(r"(?:Audit verdict|Verdict): ([A-Z]+)", markdown)
    lines = markdown.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("|") and line.rstrip().endswith("| audit |"):
            for row in lines[index + 2:]:
                if not row.startswith("|"):
                    break
                cell = row.rstrip().rstrip("|").split("|")[-1].strip()
                verdicts.append(cell.split(" ")[0] if cell else "")
    return verdicts


def assert_report_honest(report: Outcome, audit: Outcome) -> None:
    """`dpledger report` of an attacked run: exit 0 or 2 without a problem, and no PASS verdict
    unless the audit of these very files passed."""
    assert_clean(report, (0, 2), "report: ")
    if report.rc == 0 and audit.rc != 0:
        assert "PASS" not in report_verdicts(report.out), \
            f"the report prints a PASS verdict although the audit of these files did not pass ({audit})"

