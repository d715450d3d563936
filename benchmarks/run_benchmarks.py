"""Run every benchmark; each writes its JSON to benchmarks/results/."""
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
for script in ("bench_forward.py", "bench_ablation.py"):
    print(f"== {script}")
    subprocess.run([sys.executable, str(HERE / script)], check=True, cwd=HERE.parent)
