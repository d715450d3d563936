"""Peak memory of `dpledger audit`: independent of the run's length (records stream chunk by chunk,
logits window by window). Each audit runs in a fresh subprocess and reports its peak resident set
(VmHWM of its own address space: ru_maxrss would include the parent's pages from before exec);
results go to benchmarks/results/audit_memory.json.

    python benchmarks/audit_memory.py [--steps 100000] [--teachers 100] [--demo runs/demo/adapmixed]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PMIXED = {"type": "pmixed", "alpha": 18.0, "beta": 0.2}


def _audit_peak(run_dir: Path, game: bool = False) -> dict:
    """Audit in a child process; its peak RSS (MiB), verdict and wall time."""
    code = ("import json, sys, time; from audit import audit_run; t = time.time(); "
            f"r = audit_run({str(run_dir)!r}, mc_samples=100, play_game={game}, write=False); "
            "print(json.dumps({'verdict': r.verdict, 'failed': [c.name for c in r.failed], 'seconds': time.time() - t, "
            "'peak_mib': [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')][0] / 1024}))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                 "PYTHONPATH": str(REPO)})
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def synthetic(root: Path, steps: int, teachers: int, vocab: int, block: int, payload: bool) -> dict:
    from tests.synthetic import write_synthetic_run

    started = time.time()
    run = write_synthetic_run(root / f"s{steps}-n{teachers}-v{vocab}-{payload}", teachers, vocab, steps, block, PMIXED,
                              payload=payload)
    written = time.time() - started
    return {"steps": steps, "teachers": teachers, "vocab": vocab, "block_size": block, "payload": payload,
            "write_seconds": round(written, 1), **_audit_peak(run)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--teachers", type=int, default=100)
    parser.add_argument("--payload-steps", type=int, nargs="*", default=[2_000, 20_000],
                        help="lengths of the runs with a replay payload (V = 32)")
    parser.add_argument("--demo", help="a demo run directory to audit too (e.g. runs/demo/adapmixed)")
    parser.add_argument("--paper-block", type=int, default=16, metavar="STEPS",
                        help="also audit STEPS steps of the paper's per-step shape (N=100 teachers, V=50,257, with "
                             "payload); the audit replays one step per window at that size, so its peak is that of a "
                             "128-step block (0 to skip)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "audit_memory.json"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    # a section not run this time (--steps 0, --payload-steps with no value, --paper-block 0) keeps its last result
    results = json.loads(out.read_text()) if out.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.steps:  # the same trace shape at 1x and 10x the length: peak memory must not follow the length
            results["records_only"] = [synthetic(root, steps, args.teachers, 16, 128, payload=False)
                                       for steps in (args.steps // 10, args.steps)]
            print(results["records_only"], flush=True)
        if args.payload_steps:
            results["with_payload"] = [synthetic(root, steps, args.teachers, 32, 128, payload=True)
                                       for steps in args.payload_steps]
            print(results["with_payload"], flush=True)
        if args.paper_block:
            results["paper_block"] = synthetic(root, args.paper_block, 100, 50_257, 128, payload=True)
            print(results["paper_block"], flush=True)
    if args.demo:
        results["demo"] = {"run": args.demo, **_audit_peak(Path(args.demo), game=True)}
        print(results["demo"])
    results.pop("runs", None)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
