"""make bench: the per-step benchmark (benchmarks/results.json and results.md), the model forward
benchmark (benchmarks/results/forward.json), and the scaling of the distributed audit and decode
on 1 and 2 Dask workers (benchmarks/results/distributed.json and distributed.png). The 1,000-step
ablation (bench_ablation.py), the audit memory and adversarial harnesses are long and run on their own."""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
for script in ("bench_step.py", "bench_forward.py", "bench_distributed.py"):
    print(f"== {script}")
    subprocess.run([sys.executable, str(HERE / script)], check=True, cwd=HERE.parent)
