"""dpledger's AdaPMixED step against an earlier dpledger: two checkouts side by side, in fresh processes
taking turns, one thread each. Writes benchmarks/results/versions.json.

What it answers: did a change make the step faster, and by how much, with the machine's noise in the
range. Within one process two versions of the package cannot be loaded, so each sample is a child
process that maps the `dpledger` packages to one checkout (the editable install's finder, pointed at
that checkout's folders), builds the benchmark's synthetic inputs (benchmarks/step_timing.py), warms up
(its numba kernels compile, or load from their own cache: a checkout's kernel sources key its cache
folder), and times `steps` AdaPMixED steps. Pairs alternate which checkout runs first; the speed-up
is the per-pair ratio of medians (baseline / current), reported as median and range, with the
ratio of minima beside it.

Usage, e.g. against the commit before a change:
    git worktree add /tmp/baseline <commit>
    python benchmarks/bench_versions.py --baseline /tmp/baseline
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_step import ratios  # noqa: E402  (the per-pair ratio, median and range, as bench_step reports it)
SCALES = {"paper": (50257, 100, 20), "n8_full_vocab": (50257, 8, 150), "demo": (1024, 8, 1500)}
"""name -> (vocabulary, teachers, steps per sample), the scales of benchmarks/bench_step.py."""

_CHILD = r'''
import sys
root, vocab, teachers, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
finder = sys.modules.get("__editable___dpledger_0_1_0_finder")
if finder is None:
    raise SystemExit("bench_versions needs dpledger installed in editable mode (make install)")
for name in list(finder.MAPPING):
    finder.MAPPING[name] = finder.MAPPING[name].replace(sys.argv[5], root)
sys.path.insert(0, root)
import numpy as np, torch
torch.set_num_threads(1)
import dpledger
if not dpledger.__file__.startswith(root):
    raise SystemExit(f"dpledger loaded from {dpledger.__file__}, not from {root}")
sys.path.insert(0, sys.argv[5])   # then this checkout's benchmarks: the same inputs and timing on both sides
from benchmarks.step_timing import timed_adapmixed_steps   # numpy, torch and AdaPMixED only: any checkout runs it
_, seconds = timed_adapmixed_steps(vocab, teachers, steps)
print(float(np.median(seconds)), min(seconds))
'''


def sample(root: Path, vocab: int, teachers: int, steps: int) -> tuple[float, float]:
    """(median, min) seconds per step of the checkout at `root`, in a fresh child process."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "DPLEDGER_KERNEL_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(root), str(vocab), str(teachers), str(steps), str(ROOT)],
                          capture_output=True, text=True, env=environment, cwd=root)
    if done.returncode != 0:
        raise SystemExit(f"the step at {root} failed: {done.stderr.strip().splitlines()[-1:]}")
    median, least = (float(value) for value in done.stdout.split())
    return median, least


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of dpledger to compare with")
    parser.add_argument("--scales", nargs="*", default=list(SCALES), choices=list(SCALES))
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "versions.json")
    arguments = parser.parse_args()
    baseline = arguments.baseline.resolve()
    if not (baseline / "mechanisms" / "adapmixed.py").is_file():
        raise SystemExit(f"--baseline must be a dpledger checkout, got {baseline}")

    def commit(root: Path) -> str:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or "unknown"

    results = {"benchmark": __doc__.split("\n\n")[0], "baseline": {"path": str(baseline), "commit": commit(baseline)},
               "current": {"path": str(ROOT), "commit": commit(ROOT),
                           "uncommitted_changes": bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                                                                       "--untracked-files=no"], capture_output=True,
                                                                      text=True).stdout.strip())},
               "machine": {"platform": platform.platform(), "cores": os.cpu_count(), "python": platform.python_version(),
                           "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
               "scales": {}}
    for name in arguments.scales:
        vocab, teachers, steps = SCALES[name]
        for root in (baseline, ROOT):
            sample(root, vocab, teachers, 2)   # compile or load each side's kernels outside the timing
        pairs: list[dict[str, tuple[float, float]]] = []
        for pair in range(arguments.pairs):
            order = (baseline, ROOT) if pair % 2 == 0 else (ROOT, baseline)
            measured = {("baseline" if root == baseline else "current"): sample(root, vocab, teachers, steps)
                        for root in order}
            pairs.append(measured)
            print(f"{name} pair {pair + 1}: baseline {measured['baseline'][0] * 1e3:.3f} ms, "
                  f"current {measured['current'][0] * 1e3:.3f} ms", flush=True)
        sides = ("baseline", "current")
        results["scales"][name] = {
            "vocab": vocab, "teachers": teachers, "steps_per_sample": steps,
            "seconds_per_step_median": {side: [round(p[side][0], 6) for p in pairs] for side in sides},
            "speedup_of_medians": ratios({side: [p[side][0] for p in pairs] for side in sides}, "baseline", "current"),
            "speedup_of_minima": ratios({side: [p[side][1] for p in pairs] for side in sides}, "baseline", "current")}
    results["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    arguments.out.write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
    print(json.dumps({name: scale["speedup_of_medians"] for name, scale in results["scales"].items()}))


if __name__ == "__main__":
    main()
