"""Scaling of the distributed audit and teacher-forced decode (Dask LocalCluster) against ONE PLAIN
PROCESS (no Dask at all), cold and warm.

Every setting runs in its own fresh Python process, so that "cold" means the same thing for each:
the first run in that process (models loaded, numba's kernels compiled; for a cluster also its start
and each worker's imports, model loading and compile), and "warm" the second run there. Speed-ups
are the one plain process's time over the setting's, cold over cold (the cluster's start included)
and warm over warm; a 1-worker cluster is shown as a setting, never as the baseline. Measured:
  * demo scale (the embedded default, N = 8): a teacher-forced AdaPMixED decode of `--queries`
    queries and the audit of the one plain process's run, in one plain process and on 1 and 2 local
    workers (the decodes must give the same ledger, the audits the same audit.json: checked, not
    assumed);
  * paper scale (N = 100, V = 50,257): the audit of a synthetic AdaPMixED trace with its replay
    payload (random logits stand in for the models: the audit's cost does not depend on where they
    come from), in one plain process and on 2 workers.
From the paper-scale per-step cost and the measured parallel efficiency, it projects the audit of
the paper's 9,728-query run and of a 100,000-step trace on 32 workers. Writes
benchmarks/results/distributed.json and the figure benchmarks/results/distributed.png.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAPER_QUERIES = 9_728
LONG_TRACE = 100_000
CLUSTER_WORKERS = 32
AUDIT_OPTIONS = dict(mc_samples=200, play_game=False, write=False)
ONE_PROCESS = "one-process"   # the run directory every setting audits at demo scale


def timed(function, *args, **kwargs):
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def audit_bytes(report) -> bytes:
    from dpledger.decoding.trace import json_bytes

    payload = report.to_dict()
    for key in ("created_at", "seconds", "run_dir", "digest"):   # the digest covers the first three
        payload.pop(key)
    return json_bytes(payload)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@contextlib.contextmanager
def setting(workers: int):
    """(client or None, seconds to start it): no Dask at all for workers = 0."""
    if workers == 0:
        yield None, 0.0
        return
    from dpledger.decoding.cluster import ClusterSpec, dask_client

    started = time.perf_counter()
    with dask_client(ClusterSpec(workers=workers), progress=False) as client:
        client.wait_for_workers(workers)
        yield client, time.perf_counter() - started


def measure_decode(root: Path, queries: int, block: int, workers: int) -> dict:
    """In a fresh process: decode twice (cold, warm)."""
    from dpledger.decoding.blocks import prepare
    from dpledger.decoding.config import DataConfig, ModelsConfig, RunConfig
    from dpledger.decoding.run import run_decode
    from dpledger.demo import PAPER_ADAPMIXED

    def config(name: str) -> RunConfig:
        return RunConfig(out=str(root / name), mechanism={"type": "adapmixed", **PAPER_ADAPMIXED},
                         models=ModelsConfig(teachers=8), data=DataConfig(block_size=block), queries=queries, seed=0)

    label = ONE_PROCESS if workers == 0 else f"workers-{workers}"
    before = load()
    with setting(workers) as (client, start):
        decoded, cold = timed(run_decode, config(label), progress=False, verbose=False,
                              prepared=prepare(config(label), verbose=False), client=client)
        _, warm = timed(run_decode, config(f"{label}-warm"), progress=False, verbose=False,
                        prepared=prepare(config(f"{label}-warm"), verbose=False), client=client)
    (root / f"decode-{workers}.out").write_bytes((decoded.directory / "ledger.json").read_bytes())
    return {"workers": workers, "cluster_start_seconds": start, "cold_seconds": cold, "warm_seconds": warm,
            "load_before": before, "load_after": load()}


def measure_audit(run: Path, workers: int, tag: str) -> dict:
    """In a fresh process: audit `run` twice (cold: numba compiles here, on each worker; warm)."""
    from dpledger.audit import audit_run
    from dpledger.audit.dask_audit import DaskWindowExecutor

    before = load()
    with setting(workers) as (client, start):
        executor = None if client is None else DaskWindowExecutor(client, progress=False)
        _, cold = timed(audit_run, run, executor=executor, **AUDIT_OPTIONS)
        if executor is not None:
            executor.distributed_seconds = 0.0
        report, warm = timed(audit_run, run, executor=executor, **AUDIT_OPTIONS)
    (run.parent / f"{tag}-{workers}.out").write_bytes(audit_bytes(report))
    return {"workers": workers, "cluster_start_seconds": start, "cold_seconds": cold, "warm_seconds": warm,
            "verdict": report.verdict,
            "distributed_part_seconds": 0.0 if executor is None else executor.distributed_seconds,
            "load_before": before, "load_after": load()}


def in_fresh_process(task: str, workers: int, root: Path, args: argparse.Namespace) -> dict:
    """One setting's measurement in a fresh Python process (task: decode, demo-audit or paper-audit)."""
    subprocess.run([sys.executable, __file__, "--measure", task, "--workers", str(workers), "--root", str(root),
                    "--queries", str(args.queries), "--block", str(args.block)], check=True, cwd=REPO)
    return json.loads((root / f"{task}-{workers}.json").read_text())


def compared(task: str, rows: list[dict], root: Path) -> list[dict]:
    """Each setting's output checked equal to the plain process's; speed-ups over it, cold and warm."""
    plain = rows[0]
    for row in rows:
        ours, plains = (root / f"{task}-{row['workers']}.out").read_bytes(), (root / f"{task}-0.out").read_bytes()
        if ours != plains:
            ours_json, plain_json = json.loads(ours), json.loads(plains)
            keys = sorted(k for k in set(ours_json) | set(plain_json) if ours_json.get(k) != plain_json.get(k))
            raise SystemExit(f"{task} on {row['workers']} workers: the result differs from one plain process's "
                             f"in {keys} (kept in {root})")
        row["label"] = "one plain process" if row["workers"] == 0 else \
            f"{row['workers']} worker{'s' if row['workers'] > 1 else ''}"
        row["speedup_cold"] = plain["cold_seconds"] / (row["cluster_start_seconds"] + row["cold_seconds"])
        row["speedup_warm"] = plain["warm_seconds"] / row["warm_seconds"]
    return rows


SPEEDUP_DEFINITION = ("over one plain process (no Dask), every setting in a fresh Python process; cold: the plain "
                      "process's first run / (the cluster's start + the setting's first run, in which the workers load "
                      "the models and compile the kernels); warm: second run / second run")


def demo_scale(root: Path, args: argparse.Namespace, worker_counts: list[int]) -> dict:
    decode = compared("decode", [in_fresh_process("decode", w, root, args) for w in [0, *worker_counts]], root)
    audit = compared("demo-audit", [in_fresh_process("demo-audit", w, root, args) for w in [0, *worker_counts]], root)
    for row in decode:
        row["queries_per_second_warm"] = args.queries / row["warm_seconds"]
    for row in audit:
        row["steps_per_second_warm"] = args.queries / row["warm_seconds"]
    return {"queries": args.queries, "block_size": args.block, "blocks": -(-args.queries // args.block), "teachers": 8,
            "mechanism": "adapmixed (paper parameters)", "audit_options": {"mc_samples": 200, "canary_game": False},
            "audited_run": "the one plain process's decode", "speedup": SPEEDUP_DEFINITION,
            "identical_to_one_process": True, "decode": decode, "audit": audit}


def paper_scale(root: Path, args: argparse.Namespace, workers: int) -> dict:
    from dpledger.demo import PAPER_ADAPMIXED
    from tests.synthetic import write_synthetic_run

    run, write_seconds = timed(write_synthetic_run, root / "paper", 100, 50_257, args.paper_steps, args.paper_block,
                               {"type": "adapmixed", **PAPER_ADAPMIXED}, payload=True)
    rows = compared("paper-audit", [in_fresh_process("paper-audit", w, root, args) for w in (0, workers)], root)
    plain, spread = rows
    steps = args.paper_steps
    driver = spread["warm_seconds"] - spread["distributed_part_seconds"]  # the driver's own work
    parallel_part = plain["warm_seconds"] - driver  # what one process spends on what the workers do
    return {"steps": steps, "block_size": args.paper_block, "teachers": 100, "vocab": 50_257,
            "mechanism": "adapmixed (paper parameters), synthetic logits with replay payload",
            "speedup": SPEEDUP_DEFINITION, "write_seconds": write_seconds, "rows": rows,
            "single_process_cold_seconds": plain["cold_seconds"], "single_process_seconds": plain["warm_seconds"],
            "single_process_seconds_per_step": plain["warm_seconds"] / steps, "workers": workers,
            "cluster_start_seconds": spread["cluster_start_seconds"],
            "first_distributed_audit_seconds": spread["cold_seconds"], "distributed_seconds": spread["warm_seconds"],
            "speedup_cold": spread["speedup_cold"], "speedup_warm": spread["speedup_warm"],
            "driver_seconds": driver, "distributed_part_seconds": spread["distributed_part_seconds"],
            "distributed_part_single_process_seconds": parallel_part,
            "parallel_efficiency": parallel_part / spread["distributed_part_seconds"] / workers,
            "worker_warm_up_seconds": max(spread["cold_seconds"] - spread["warm_seconds"], 0.0),
            "verdict": spread["verdict"], "identical_to_one_process": True}


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

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = [(axes[0], demo["decode"], f"teacher-forced decode, demo scale ({demo['queries']} queries)"),
              (axes[1], demo["audit"], "audit, demo scale"),
              (axes[2], paper["rows"], f"audit, paper scale (N = 100, V = 50,257, {paper['steps']} steps)")]
    for axis, rows, title in panels:
        names = [row["label"] for row in rows]
        cold, warm = [row["speedup_cold"] for row in rows], [row["speedup_warm"] for row in rows]
        x = range(len(names))
        axis.bar([i - 0.2 for i in x], cold, width=0.4, color="#bbbbbb", label="cold (first run, start included)")
        axis.bar([i + 0.2 for i in x], warm, width=0.4, color="#3b75af", label="warm (second run)")
        for i in x:
            axis.text(i - 0.2, cold[i], f"{cold[i]:.2f}x", ha="center", va="bottom", fontsize=8)
            axis.text(i + 0.2, warm[i], f"{warm[i]:.2f}x", ha="center", va="bottom", fontsize=8)
        axis.set_xticks(list(x), names)
        axis.axhline(1.0, color="black", linewidth=0.6)
        axis.set_title(title, fontsize=10)
        axis.set_ylabel("speed-up over one plain process")
        axis.set_ylim(0, max(max(cold), max(warm)) * 1.3)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"dpledger on a Dask LocalCluster against one plain process, {os.cpu_count()} cores shared "
                 "(results identical to one process)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=1024, help="demo-scale queries (default 1024, as the demo)")
    parser.add_argument("--block", type=int, default=32, help="demo-scale block size (default 32)")
    parser.add_argument("--paper-steps", type=int, default=8, help="paper-scale synthetic steps (default 8)")
    parser.add_argument("--paper-block", type=int, default=2, help="paper-scale block size (default 2)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "distributed.json"))
    parser.add_argument("--measure", choices=("decode", "demo-audit", "paper-audit"), help=argparse.SUPPRESS)   # one setting, in a child
    parser.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    if args.measure:
        from dpledger.decoding.recipe import set_single_thread

        set_single_thread()
        root = Path(args.root)
        if args.measure == "decode":
            result = measure_decode(root, args.queries, args.block, args.workers)
        else:
            run = root / (ONE_PROCESS if args.measure == "demo-audit" else "paper")
            result = measure_audit(run, args.workers, args.measure)
        (root / f"{args.measure}-{args.workers}.json").write_text(json.dumps(result))
        return 0
    root = Path(tempfile.mkdtemp(prefix="dpledger-bench-distributed-"))
    started_load = load()
    print(f"working in {root}", flush=True)
    print(f"demo scale: {args.queries} queries, one plain process and 1, 2 workers (each a fresh process)", flush=True)
    demo = demo_scale(root, args, [1, 2])
    print(f"paper scale: {args.paper_steps} synthetic steps, one plain process and 2 workers", flush=True)
    paper = paper_scale(root, args, 2)
    shutil.rmtree(root, ignore_errors=True)   # kept when a check fails, to see why
    result = {"benchmark": "distributed audit and teacher-forced decode (Dask LocalCluster) against one plain process",
              "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                          "load_1_5_15_start": started_load, "load_1_5_15_end": load(),
                          "note": "2 cores shared with other jobs: the load averages are the machine's"},
              "demo_scale": demo, "paper_scale": paper, "projection_32_workers": projection(paper)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
    figure(demo, paper, out.with_suffix(".png"))
    for task, rows in (("demo decode", demo["decode"]), ("demo audit", demo["audit"]),
                       ("paper-scale audit", paper["rows"])):
        for row in rows:
            print(f"  {task:<18} {row['label']:<17} cold {row['cluster_start_seconds'] + row['cold_seconds']:7.1f} s "
                  f"({row['speedup_cold']:.2f}x)   warm {row['warm_seconds']:7.1f} s ({row['speedup_warm']:.2f}x)")
    for name, value in result["projection_32_workers"].items():
        if isinstance(value, dict):
            print(f"  projected on {CLUSTER_WORKERS} workers, {name}: {value['cluster_hours']:.2f} h "
                  f"(one process {value['one_process_hours']:.1f} h)")
    print("  speed-ups are over one plain process (no Dask); cold includes the cluster's start")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
