"""Scaling of the distributed audit and teacher-forced decode (Dask LocalCluster, 1 and 2 workers).

Measured on this machine, side by side in one run:
  * demo scale (the embedded default, N = 8): a teacher-forced AdaPMixED decode of `--queries`
    queries and its audit, in one process and on 1 and 2 local workers (the decodes must give the
    same ledger, the audits the same audit.json: checked, not assumed);
  * paper scale (N = 100, V = 50,257): the audit of a synthetic AdaPMixED trace with its replay
    payload (random logits stand in for the models: the audit's cost does not depend on where they
    come from), in one process and on 2 workers: the per-step cost of everything the workers do.
From the paper-scale per-step cost and the measured parallel efficiency, it projects the audit of
the paper's 9,728-query run and of a 100,000-step trace on 32 workers. Writes
benchmarks/results/distributed.json and the figure benchmarks/results/distributed.png.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAPER_QUERIES = 9_728
LONG_TRACE = 100_000
CLUSTER_WORKERS = 32


def timed(function, *args, **kwargs):
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def audit_bytes(report) -> bytes:
    from dpledger.decoding.trace import json_bytes

    payload = report.to_dict()
    for key in ("created_at", "seconds", "run_dir"):
        payload.pop(key)
    return json_bytes(payload)


def demo_scale(root: Path, queries: int, block: int, worker_counts: list[int]) -> dict:
    from dpledger.audit import audit_run
    from dpledger.audit.dask_audit import DaskWindowExecutor
    from dpledger.decoding.cluster import ClusterSpec, dask_client
    from dpledger.decoding.config import DataConfig, ModelsConfig, RunConfig
    from dpledger.decoding.blocks import prepare
    from dpledger.decoding.run import run_decode
    from dpledger.demo import PAPER_ADAPMIXED

    def config(name: str) -> RunConfig:
        return RunConfig(out=str(root / name), mechanism={"type": "adapmixed", **PAPER_ADAPMIXED},
                         models=ModelsConfig(teachers=8), data=DataConfig(block_size=block), queries=queries, seed=0)

    audit_options = dict(mc_samples=200, play_game=False, write=False)

    def decode_twice(name: str, client=None) -> tuple[object, float, float]:
        """A cold decode (the process or its workers load the models and compile numba's kernels) and a
        warm one (into another directory: the models are loaded again, the kernels are compiled)."""
        first, cold = timed(run_decode, config(f"{name}-cold"), progress=False, verbose=False,
                            prepared=prepare(config(f"{name}-cold"), verbose=False), client=client)
        _, warm = timed(run_decode, config(f"{name}-warm"), progress=False, verbose=False,
                        prepared=prepare(config(f"{name}-warm"), verbose=False), client=client)
        return first, cold, warm

    single, cold, warm = decode_twice("single")
    reference_audit, audit_seconds = timed(audit_run, single.directory, **audit_options)
    rows = [{"workers": 0, "label": "one process", "decode_cold_seconds": cold, "decode_seconds": warm,
             "audit_seconds": audit_seconds, "cluster_start_seconds": 0.0}]
    ledger = (single.directory / "ledger.json").read_bytes()
    for workers in worker_counts:
        started = time.perf_counter()
        with dask_client(ClusterSpec(workers=workers), progress=False) as client:
            client.wait_for_workers(workers)
            start = time.perf_counter() - started
            spread, cold, warm = decode_twice(f"workers-{workers}", client)
            if (spread.directory / "ledger.json").read_bytes() != ledger:
                raise SystemExit(f"{workers} workers: the decode's ledger differs from one process's")
            report, audit_time = timed(audit_run, single.directory, executor=DaskWindowExecutor(client, progress=False),
                                       **audit_options)
            if audit_bytes(report) != audit_bytes(reference_audit):
                raise SystemExit(f"{workers} workers: audit.json differs from one process's")
        rows.append({"workers": workers, "label": f"{workers} worker{'s' if workers > 1 else ''}",
                     "decode_cold_seconds": cold, "decode_seconds": warm, "audit_seconds": audit_time,
                     "cluster_start_seconds": start})
    for row in rows:
        row["decode_queries_per_second"] = queries / row["decode_seconds"]
        row["audit_steps_per_second"] = queries / row["audit_seconds"]
    return {"queries": queries, "block_size": block, "blocks": -(-queries // block), "teachers": 8,
            "mechanism": "adapmixed (paper parameters)", "audit_options": {"mc_samples": 200, "canary_game": False},
            "identical_to_one_process": True, "rows": rows}


def paper_scale(root: Path, steps: int, block: int, workers: int) -> dict:
    from dpledger.audit import audit_run
    from dpledger.audit.dask_audit import DaskWindowExecutor
    from dpledger.decoding.cluster import ClusterSpec, dask_client
    from dpledger.demo import PAPER_ADAPMIXED
    from tests.synthetic import write_synthetic_run

    run, write_seconds = timed(write_synthetic_run, root / "paper", 100, 50_257, steps, block,
                               {"type": "adapmixed", **PAPER_ADAPMIXED}, payload=True)
    options = dict(mc_samples=200, play_game=False, write=False)
    audit_run(run, **options)  # numba's compile (about 10 s per process) out of the single-process timing
    reference, single_seconds = timed(audit_run, run, **options)
    started = time.perf_counter()
    with dask_client(ClusterSpec(workers=workers), progress=False) as client:
        client.wait_for_workers(workers)
        start = time.perf_counter() - started
        executor = DaskWindowExecutor(client, progress=False)
        _, cold_seconds = timed(audit_run, run, executor=executor, **options)  # workers compile numba here
        executor.distributed_seconds = 0.0
        report, warm_seconds = timed(audit_run, run, executor=executor, **options)
        on_workers = executor.distributed_seconds
    if audit_bytes(report) != audit_bytes(reference):
        raise SystemExit("paper scale: the distributed audit.json differs from one process's")
    driver = warm_seconds - on_workers  # the driver's own work: the same in one process
    parallel_part = single_seconds - driver  # what one process spends on what the workers do
    return {"steps": steps, "block_size": block, "teachers": 100, "vocab": 50_257,
            "mechanism": "adapmixed (paper parameters), synthetic logits with replay payload",
            "write_seconds": write_seconds, "single_process_seconds": single_seconds,
            "single_process_seconds_per_step": single_seconds / steps, "workers": workers,
            "cluster_start_seconds": start, "first_distributed_audit_seconds": cold_seconds,
            "distributed_seconds": warm_seconds, "speedup": single_seconds / warm_seconds,
            "driver_seconds": driver, "distributed_part_seconds": on_workers,
            "distributed_part_single_process_seconds": parallel_part,
            "parallel_efficiency": parallel_part / on_workers / workers,
            "worker_warm_up_seconds": max(cold_seconds - warm_seconds, 0.0), "verdict": report.verdict,
            "identical_to_one_process": True}


def projection(paper: dict) -> dict:
    """Audit time on CLUSTER_WORKERS workers from the paper-scale measurement: the driver's own work
    per step (serial) plus the workers' per-step work divided over the workers at the measured
    efficiency, plus the workers' one-off warm-up. The efficiency measured here (2 workers and the
    driver sharing 2 cores) stands in for a cluster's; the driver's per-step cost is measured on a
    short trace, where its fixed costs weigh most, so the projection errs on the long side."""
    steps = paper["steps"]
    driver, parallel = paper["driver_seconds"] / steps, paper["distributed_part_single_process_seconds"] / steps
    efficiency = min(paper["parallel_efficiency"], 1.0)
    out = {"workers": CLUSTER_WORKERS, "driver_seconds_per_step": driver, "worker_seconds_per_step": parallel,
           "parallel_efficiency_assumed": efficiency,
           "warm_up_seconds": paper["worker_warm_up_seconds"] + paper["cluster_start_seconds"]}
    for name, length in (("paper_run_9728_queries", PAPER_QUERIES), ("trace_100000_steps", LONG_TRACE)):
        one = length * (driver + parallel)
        cluster = out["warm_up_seconds"] + length * driver + length * parallel / (CLUSTER_WORKERS * efficiency)
        out[name] = {"steps": length, "one_process_hours": one / 3600, "cluster_hours": cluster / 3600}
    return out


def figure(demo: dict, paper: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = demo["rows"]
    labels = [row["label"] for row in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for axis, key, title in ((axes[0], "decode_queries_per_second", "teacher-forced decode (demo scale, warm)"),
                             (axes[1], "audit_steps_per_second", "audit (demo scale, warm)")):
        values = [row[key] for row in rows]
        axis.bar(labels, values, color=["#999999"] + ["#3b75af"] * (len(rows) - 1))
        for x, value in enumerate(values):
            axis.text(x, value, f"{value:.1f}\n({value / values[0]:.2f}x)", ha="center", va="bottom", fontsize=8)
        axis.set_title(title, fontsize=10)
        axis.set_ylabel("steps per second")
        axis.set_ylim(0, max(values) * 1.35)
    paper_values = [1 / paper["single_process_seconds_per_step"], paper["steps"] / paper["distributed_seconds"]]
    axes[2].bar(["one process", f"{paper['workers']} workers"], paper_values, color=["#999999", "#3b75af"])
    for x, value in enumerate(paper_values):
        axes[2].text(x, value, f"{value:.3f}\n({value / paper_values[0]:.2f}x)", ha="center", va="bottom", fontsize=8)
    axes[2].set_title("audit (paper scale: N = 100, V = 50,257, warm)", fontsize=10)
    axes[2].set_ylabel("steps per second")
    axes[2].set_ylim(0, max(paper_values) * 1.35)
    fig.suptitle(f"dpledger on a Dask LocalCluster, {os.cpu_count()} cores (results identical to one process)",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queries", type=int, default=1024, help="demo-scale queries (default 1024, as the demo)")
    parser.add_argument("--block", type=int, default=32, help="demo-scale block size (default 32)")
    parser.add_argument("--paper-steps", type=int, default=8, help="paper-scale synthetic steps (default 8)")
    parser.add_argument("--paper-block", type=int, default=2, help="paper-scale block size (default 2)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "distributed.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from dpledger.decoding.recipe import set_single_thread

    set_single_thread()
    root = Path(tempfile.mkdtemp(prefix="dpledger-bench-distributed-"))
    try:
        print(f"demo scale: {args.queries} queries, one process and 1, 2 workers", flush=True)
        demo = demo_scale(root, args.queries, args.block, [1, 2])
        print(f"paper scale: {args.paper_steps} synthetic steps, one process and 2 workers", flush=True)
        paper = paper_scale(root, args.paper_steps, args.paper_block, 2)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {"benchmark": "distributed audit and teacher-forced decode (Dask LocalCluster)",
              "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
              "demo_scale": demo, "paper_scale": paper, "projection_32_workers": projection(paper)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    figure(demo, paper, out.with_suffix(".png"))
    for row in demo["rows"]:
        print(f"  {row['label']:<12} decode {row['decode_seconds']:7.1f} s ({row['decode_queries_per_second']:.1f} q/s; "
              f"cold {row['decode_cold_seconds']:.1f} s)"
              f"  audit {row['audit_seconds']:7.1f} s ({row['audit_steps_per_second']:.1f} steps/s)")
    print(f"  paper scale: {paper['single_process_seconds_per_step']:.2f} s per step in one process, "
          f"{paper['distributed_seconds'] / paper['steps']:.2f} s on {paper['workers']} workers "
          f"({paper['speedup']:.2f}x)")
    for name, value in result["projection_32_workers"].items():
        if isinstance(value, dict):
            print(f"  projected on {CLUSTER_WORKERS} workers, {name}: {value['cluster_hours']:.2f} h "
                  f"(one process {value['one_process_hours']:.1f} h)")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
