"""`dpledger sweep`: the AdaPMixED paper's Figure 2 ablations on the embedded default.

One parameter varies at a time around the paper's defaults (Flemings et al. 2024, Table 4): threshold T, top-k,
beta, the ensemble size N (the first N of the cached teachers: shards are disjoint, so a prefix is a
smaller ensemble of the same recipe, nothing is retrained), (lambda, sigma), and alpha. Each point
is a full decoding run with its trace; one privacy-loss vs perplexity plot per parameter.
"""
from __future__ import annotations

import io
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from dpledger.accounting.safe_files import write_atomic  # noqa: E402
from dpledger.decoding.config import DataConfig, ModelsConfig, RunConfig  # noqa: E402
from dpledger.decoding.run import run_decode  # noqa: E402
from dpledger.decoding.embedded import build_or_load
from dpledger.reports.render import strict_json

PAPER_DEFAULTS = dict(alpha=18.0, beta=0.2, lam=1e-4, sigma=1e-2, threshold=4.5, top_k=60)
SWEEPS: dict[str, list[dict]] = {
    "threshold": [{"threshold": t} for t in (1.0, 2.5, 4.5, 8.0)],
    "top_k": [{"top_k": k} for k in (10, 30, 60, 200)],
    "beta": [{"beta": b} for b in (0.05, 0.1, 0.2, 0.5)],
    "teachers": [{"teachers": n} for n in (2, 4, 8)],
    "lam_sigma": [{"lam": lam, "sigma": sigma} for lam, sigma in ((1e-4, 1e-2), (1e-3, 1e-2), (1e-2, 1e-2), (1e-2, 1e-3))],
    "alpha": [{"alpha": a} for a in (6.0, 12.0, 18.0, 32.0)],
}


def _point_label(change: dict) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in change.items())


def run_sweep(out: str | Path, queries: int = 256, teachers: int = 8, parameters: list[str] | None = None,
              progress: bool = False) -> pd.DataFrame:
    """Decode one AdaPMixED run per sweep point (the others at PAPER_DEFAULTS) on the embedded
    default's held-out text, and write sweep.csv, sweep.json and one sweep_<parameter>.png per parameter
    under `out`. Points already finished are resumed, not rerun.

    Args:
        out: the output directory (created if missing); each point's trace is in out/<parameter>/<point>.
        queries: teacher-forced queries per run (>= 1).
        teachers: the embedded default's ensemble size N; the `teachers` sweep uses its first n teachers.
        parameters: the sweeps to run, a subset of SWEEPS's keys (default: all, in SWEEPS's order).
        progress: whether each run shows a progress bar.

    Returns:
        One row per point: parameter, point, epsilon (data-dependent, at the run's first delta), its
        order, perplexity, answered_by_public and the trace directory.

    Raises:
        ValueError: if `parameters` names an unknown sweep.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    embedded = build_or_load(teachers=teachers)
    text = out / "heldout.txt"
    write_atomic(text, embedded.corpus.private_heldout.encode())
    rows = []
    for parameter in parameters or list(SWEEPS):
        if parameter not in SWEEPS:
            raise ValueError(f"unknown sweep parameter {parameter!r}; known: {', '.join(SWEEPS)}")
        for change in SWEEPS[parameter]:
            n = int(change.get("teachers", teachers))
            mechanism = {"type": "adapmixed", **PAPER_DEFAULTS, **{k: v for k, v in change.items() if k != "teachers"}}
            models = ModelsConfig(embedded=False, teachers=n, public=str(embedded.public_path),
                                  teacher_paths=tuple(str(p) for p in embedded.teacher_paths[:n]),
                                  tokenizer=str(embedded.tokenizer_path))
            directory = out / parameter / _point_label(change).replace(", ", "_").replace("=", "-")
            config = RunConfig(out=str(directory), mechanism=mechanism, models=models,
                               data=DataConfig(text=str(text)), queries=queries, replay_payload=False)
            summary = run_decode(config, resume=True, progress=progress, verbose=False).summary
            first = summary["epsilon"][0]
            rows.append({"parameter": parameter, "point": _point_label(change), "epsilon": first["epsilon"],
                         "order": first["order"], "perplexity": summary["perplexity"],
                         "answered_by_public": summary["answered_by_public"], "trace": str(directory)})
            print(f"  {parameter:<10} {_point_label(change):<24} eps*={first['epsilon']:9.4f}  "
                  f"ppl={summary['perplexity']:8.3f}  public answers={summary['answered_by_public']}")
    table = pd.DataFrame(rows)
    write_atomic(out / "sweep.csv", table.to_csv(index=False).encode())
    for parameter, group in table.groupby("parameter", sort=False):
        write_atomic(out / f"sweep_{parameter}.png", sweep_plot(parameter, group))

    write_atomic(out / "sweep.json", (strict_json(rows, "sweep.json", "no guarantee at any order") + "\n").encode())
    return table


def point_values(point: str) -> dict[str, float]:
    """{"lam": 0.001, "sigma": 0.01} from a point label "lam=0.001, sigma=0.01" (`_point_label`).

    Args:
        point: a point label, "key=value" pairs joined by ", ".

    Returns:
        Parameter name -> value, in the label's order.
    """
    return {key: float(value) for key, value in (part.split("=", 1) for part in point.split(", "))}


def sweep_series(group: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The lines of one parameter's plot: (legend label, rows sorted by the varied parameter).

    One parameter: one line through every point, in the parameter's order. Several (lam and
    sigma): the first one varies along a line and each value of the others gets its own line, so a
    line never joins points that differ in two parameters.

    Args:
        group: the sweep rows of one parameter (`run_sweep`'s table), with their `point` labels.

    Returns:
        (legend label: "" for one parameter, else the fixed values; the rows, with value_<key> columns
        added, sorted by the varied parameter), one per line.
    """
    values = pd.DataFrame([point_values(p) for p in group["point"]], index=group.index)
    keys = list(values.columns)
    frame = pd.concat([group, values.add_prefix("value_")], axis=1)
    varied, rest = keys[0], keys[1:]
    if not rest:
        return [("", frame.sort_values(f"value_{varied}", kind="stable"))]
    lines = []
    for fixed, rows in frame.groupby([f"value_{k}" for k in rest], sort=True):
        fixed = fixed if isinstance(fixed, tuple) else (fixed,)
        label = ", ".join(f"{k}={v:g}" for k, v in zip(rest, fixed))
        lines.append((label, rows.sort_values(f"value_{varied}", kind="stable")))
    return lines


def sweep_plot(parameter: str, group: pd.DataFrame) -> bytes:
    """Privacy loss against perplexity, one marker per point joined in the order of the varied
    parameter; the points are told apart by the legend (marker colour and shape), never by text
    written beside them, which overlaps when points lie close.

    Args:
        parameter: the swept parameter's name (its "_" shown as " and ").
        group: the sweep rows of that parameter, with epsilon, perplexity and point columns.

    Returns:
        The figure as PNG bytes.
    """
    figure, axis = plt.subplots(figsize=(7.2, 4.0), layout="constrained")
    markers = "osD^v<>pPX*h"
    cmap = plt.get_cmap("viridis")
    series = sweep_series(group)
    varied = next(iter(point_values(group["point"].iloc[0])))
    count = sum(len(rows) for _, rows in series)
    index = 0
    for line, (label, rows) in enumerate(series):
        if len(rows) > 1:
            axis.plot(rows["perplexity"], rows["epsilon"], color="0.6", linewidth=1, zorder=1,
                      linestyle=("-", "--", ":", "-.")[line % 4],
                      label=f"joined by increasing {varied}" + (f" ({label})" if label else ""))
        for _, row in rows.iterrows():
            axis.scatter([row["perplexity"]], [row["epsilon"]], s=42, zorder=2, marker=markers[index % len(markers)],
                         color=cmap(index / max(1, count - 1) * 0.9), edgecolors="black", linewidths=0.5,
                         label=row["point"])
            index += 1
    axis.set_xlabel("perplexity")
    axis.set_ylabel("data-dependent privacy loss\n(epsilon, delta=1e-5)")
    axis.set_title(f"AdaPMixED: varying {parameter.replace('_', ' and ')}", fontsize=11)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()
