"""make bench: the per-step benchmark (benchmarks/results.json and results.md), the model forward
benchmark (benchmarks/results/forward.json), and the scaling of the distributed audit and decode
on 1 and 2 Dask workers (benchmarks/results/distributed.json and distributed.png). The 1,000-step
ablation (bench_ablation.py) and the audit memory measurement (audit_memory.py) are long and run on
their own; the adversarial attacks on the audit are tests (tests/adversarial, make test / make test-slow)."""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
for script in ("bench_step.py", "bench_forward.py", "bench_distributed.py"):
    print(f"== {script}")
    subprocess.run([sys.executable, str(HERE / script)], check=True, cwd=HERE.parent)
