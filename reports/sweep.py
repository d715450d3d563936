"""`dpledger sweep`: the AdaPMixED paper's Figure 2 ablations on the embedded default.

One parameter varies at a time around the paper's defaults (Flemings et al. 2024, Table 4): threshold T, top-k,
beta, the ensemble size N (the first N of the cached teachers: shards are disjoint, so a prefix is a
smaller ensemble of the same recipe, nothing is retrained), (lambda, sigma), and alpha. Each point
is a full decoding run with its trace; one privacy-loss vs perplexity plot per parameter.
"""
from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from decoding.config import DataConfig, ModelsConfig, RunConfig  # noqa: E402
from decoding.run import run_decode  # noqa: E402

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
    from decoding.embedded import build_or_load

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    embedded = build_or_load(teachers=teachers)
    text = out / "heldout.txt"
    text.write_text(embedded.corpus.private_heldout)
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
    table.to_csv(out / "sweep.csv", index=False)
    for parameter, group in table.groupby("parameter", sort=False):
        (out / f"sweep_{parameter}.png").write_bytes(sweep_plot(parameter, group))
    (out / "sweep.json").write_text(json.dumps(rows, indent=2))
    return table


def sweep_plot(parameter: str, group: pd.DataFrame) -> bytes:
    figure, axis = plt.subplots(figsize=(5.5, 3.8))
    axis.plot(group["perplexity"], group["epsilon"], marker="o")
    for _, row in group.iterrows():
        axis.annotate(row["point"], (row["perplexity"], row["epsilon"]), fontsize=7, xytext=(4, 4),
                      textcoords="offset points")
    axis.set_xlabel("perplexity")
    axis.set_ylabel("data-dependent privacy loss (epsilon, delta=1e-5)")
    axis.set_title(f"AdaPMixED: varying {parameter}")
    axis.grid(alpha=0.3)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()
