"""make bench: the per-step benchmark (benchmarks/results.json and results.md), then the model
forward benchmark (benchmarks/results/forward.json). The 1,000-step ablation (bench_ablation.py),
the audit memory and adversarial harnesses are long and run on their own."""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
for script in ("bench_step.py", "bench_forward.py"):
    print(f"== {script}")
    subprocess.run([sys.executable, str(HERE / script)], check=True, cwd=HERE.parent)
