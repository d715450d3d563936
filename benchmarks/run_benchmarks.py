"""make bench: the per-step benchmark against the public PMixED reference (benchmarks/results/step.json and
results.md), the step's kernels against the cost of their arithmetic (benchmarks/results/floor.json), the
model forward benchmark (benchmarks/results/forward.json), and the distributed audit and decode against
one plain process (benchmarks/results/distributed.json and distributed.png), and, on a machine with CUDA,
the paper-scale step on the device (benchmarks/results/gpu.json; elsewhere that script measures nothing).

$DPLEDGER_REFERENCE, when set, names a checkout of github.com/james-flemings/pmixed: the per-step
benchmark then runs the reference's own step functions beside dpledger's (benchmarks/baselines.py);
otherwise it runs the in-repo baseline that follows them. Both the JSON and the printed table say
which ran. The 1,000-step ablation (bench_ablation.py) and the audit memory measurement
(audit_memory.py) are long and run on their own; the adversarial attacks on the audit are tests
(tests/adversarial, make test / make test-slow)."""
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
reference = os.environ.get("DPLEDGER_REFERENCE")
print(f"comparator: {'the reference at ' + reference if reference else 'the in-repo baseline (DPLEDGER_REFERENCE unset)'}")
for script in ("bench_step.py", "bench_floor.py", "bench_forward.py", "bench_distributed.py", "bench_gpu.py"):
    print(f"== {script}", flush=True)
    subprocess.run([sys.executable, str(HERE / script)], check=True, cwd=HERE.parent)
