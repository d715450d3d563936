"""Each test file's recorded seconds in `make test`, so that the suite can start the longest files first.

pytest-xdist's loadfile scheduling hands whole files to the workers in collection order (make test
passes --no-loadscope-reorder, which otherwise orders them by their number of tests). Ordered by
recorded time, longest first, the workers share the files greedily and the run ends close to the
total over the workers, not a long file later. The record only orders the files: a file it lacks
runs after the recorded ones, and a stale record costs time, never a test.

Refresh it from a junit report of make test:
    .venv/bin/python -m pytest -q -n auto --dist loadfile tests --junitxml=/tmp/junit.xml
    .venv/bin/python -m tests.durations /tmp/junit.xml
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

RECORD = Path(__file__).with_name("durations.json")


def recorded_seconds() -> dict[str, float]:
    """File path (as pytest names it, e.g. tests/test_audit.py) -> its recorded seconds; {} without a
    usable record."""
    try:
        recorded = json.loads(RECORD.read_text())
    except (OSError, ValueError):   # absent, unreadable or not JSON: the files keep their collection order
        return {}
    return {str(k): float(v) for k, v in recorded.items()} if isinstance(recorded, dict) else {}


def seconds_per_file(junit_xml: Path) -> dict[str, float]:
    """File path -> the seconds its test cases took, from a pytest junit report, longest first."""
    root = Path(__file__).resolve().parents[1]
    totals: Counter[str] = Counter()
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")   # tests.test_x, or tests.test_x.TestClass
        while parts and not (root / ("/".join(parts) + ".py")).is_file():
            parts.pop()
        if parts:
            totals["/".join(parts) + ".py"] += float(case.get("time", 0.0))
    return {path: round(seconds, 1) for path, seconds in totals.most_common()}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.durations JUNIT_XML")
    RECORD.write_text(json.dumps(seconds_per_file(Path(sys.argv[1])), indent=1) + "\n")
    print(f"wrote {RECORD}")
