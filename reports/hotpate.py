"""Hot vs cold PATE on the embedded default: the main result of Cohen et al. 2023 (Hot PATE), reproduced.

N in-context teachers (dpledger.decoding.icl) answer teacher-forced queries on held-out private dialogues.
At each query both voting schemes run `samples` times: coordinated (one shared Exp(1) vector per
round) and independent. Against the threshold T (as a fraction T/N) we measure
- yield: the fraction of rounds in which some token has at least T votes (TARGMAX_T answers);
- coverage: the mean teacher distribution's mass on the transferred support, the tokens that reach
  T votes in at least one round (how much of the teachers' diversity can pass the threshold);
- support size: the number of those tokens;
(dpledger.mechanisms.diversity). Privacy cost at a matched utility: the DP counterpart DPARGMAX (Confident-GNMax, Papernot et al.
2018) with noise proportional to the threshold, s1 = s2 = T / 4 (a token with T/2 votes passes the
screen with probability Phi(-2) = 2.3% under either scheme); for each scheme, the largest T at which
DPARGMAX's expected yield (its screen's pass rate on the drawn histograms) still reaches the target,
charged with released-output accounting for `budget_queries` queries: epsilon at delta. A higher usable T
buys proportionally more noise, and the RDP cost falls as 1 / T^2.
"""
from __future__ import annotations

import base64
import io
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.stats import norm
import json
import torch

from dpledger.accounting.conversion import epsilon_from_rdp
from dpledger.accounting.errors import require, require_in_open, require_int_at_least
from dpledger.accounting.orders import default_orders
from dpledger.accounting.safe_files import write_atomic
from dpledger.mechanisms.diversity import DiversityCurve, mean_diversity_curve, query_seed, vote_draws
from dpledger.mechanisms.pate import ConfidentGNMax
from dpledger.reports.html_text import escaped
from dpledger.decoding.recipe import encode_documents, set_single_thread

NOISE_PER_THRESHOLD = 0.25
"""The calibration rule of the matched-utility comparison: s1 = s2 = T * 0.25."""
FRACTIONS = tuple(round(f, 4) for f in np.arange(0.05, 1.0001, 0.05))


@dataclass(frozen=True)
class HotPateResult:
    teachers: int
    queries: int
    samples: int
    seed: int
    thresholds: tuple
    hot: DiversityCurve
    cold: DiversityCurve
    target_yield: float
    budget_queries: int
    delta: float
    matched: dict
    seconds: float
    source: dict = field(default_factory=dict)

    @property
    def hot_coverage_higher_from_quarter(self) -> bool:
        """Hot coverage > cold coverage at every T >= N/4 (the paper's claim on this ensemble)."""
        return all(h > c for t, h, c in zip(self.thresholds, self.hot.coverage, self.cold.coverage)
                   if t >= self.teachers / 4)

    def to_dict(self) -> dict:
        """The result as the JSON object hotpate.json holds ("format": "dpledger-hotpate").

        Returns:
            A dict of JSON values: the parameters, the thresholds T and T/N, both curves, whether hot
            coverage is higher at every T >= N/4, the matched-utility costs, the run time in seconds
            (rounded to 0.1) and the source description.
        """
        return {"format": "dpledger-hotpate", "teachers": self.teachers, "queries": self.queries,
                "samples": self.samples, "seed": self.seed, "thresholds": list(self.thresholds),
                "threshold_fractions": [t / self.teachers for t in self.thresholds],
                "hot": self.hot.to_dict(), "cold": self.cold.to_dict(),
                "hot_coverage_higher_at_every_T_from_N_over_4": self.hot_coverage_higher_from_quarter,
                "matched_utility": self.matched, "seconds": round(self.seconds, 1), "source": self.source}


def dpargmax_yields(distributions: np.ndarray, thresholds: tuple, coordinated: bool, samples: int,
                    seed: int) -> tuple[float, ...]:
    """DPARGMAX's expected yield at each threshold: the mean over queries and voting rounds of
    Pr[max count + N(0, s1^2) >= T] = Phi((max count - T) / s1), s1 = NOISE_PER_THRESHOLD * T, on the
    rounds `mean_diversity_curve` draws (same seeds).

    Args:
        distributions: (Q, N, V) teacher next-token distributions (Q queries, N teachers, V tokens).
        thresholds: the vote thresholds T, each > 0.
        coordinated: True for hot (coordinated) votes, False for cold (independent) ones.
        samples: voting rounds per query (>= 1).
        seed: the seed `mean_diversity_curve` was given.

    Returns:
        The expected yield at each threshold, in [0, 1], in the order of `thresholds`.
    """
    levels = np.asarray(thresholds, dtype=np.float64)
    total = np.zeros(levels.size)
    for index, query in enumerate(distributions):
        votes = vote_draws(query, coordinated, samples, query_seed(seed, index))
        counts = np.zeros((votes.shape[0], query.shape[-1]), dtype=np.int64)
        np.add.at(counts, (np.arange(votes.shape[0])[:, None], votes), 1)
        maxima = counts.max(axis=1).astype(np.float64)
        total += norm.cdf((maxima[:, None] - levels[None, :]) / (NOISE_PER_THRESHOLD * levels[None, :])).mean(axis=0)
    return tuple(float(v) for v in total / len(distributions))


def matched_privacy_cost(thresholds: tuple, yields: tuple, teachers: int, target_yield: float, budget_queries: int,
                         delta: float) -> dict:
    """The largest threshold at which DPARGMAX's expected yield (`dpargmax_yields`) reaches
    `target_yield`, the yield reached there, and DPARGMAX's epsilon for `budget_queries` queries,
    noise s1 = s2 = NOISE_PER_THRESHOLD * T (module docstring).

    Args:
        thresholds: the vote thresholds T (votes), in the order of `yields`.
        yields: DPARGMAX's expected yield at each threshold, in [0, 1].
        teachers: the ensemble size N.
        target_yield: the yield to reach, in (0, 1).
        budget_queries: the queries charged (>= 1), composed with released-output accounting.
        delta: the delta of the (epsilon, delta) conversion, in (0, 1).

    Returns:
        {threshold, threshold_fraction (T/N), dpargmax_yield, at_ceiling (T = N), sigma_threshold,
        sigma (votes), epsilon, order, at_grid_edge}, or {threshold: None, epsilon: None, note} when no
        threshold reaches `target_yield`.
    """
    reached = [(t, y) for t, y in zip(thresholds, yields) if y >= target_yield]
    if not reached:
        return {"threshold": None, "epsilon": None, "note": f"no threshold reaches DPARGMAX yield {target_yield:g}"}
    threshold, reached_yield = max(reached)
    noise = NOISE_PER_THRESHOLD * threshold
    mechanism = ConfidentGNMax(threshold, noise, noise)
    with warnings.catch_warnings():  # the edge is recorded below
        warnings.simplefilter("ignore")
        conversion = epsilon_from_rdp(mechanism.rdp_curve(default_orders()).composed(budget_queries), delta)
    return {"threshold": int(threshold), "threshold_fraction": threshold / teachers, "dpargmax_yield": reached_yield,
            "at_ceiling": threshold >= teachers, "sigma_threshold": float(noise), "sigma": float(noise),
            "epsilon": float(conversion.epsilon), "order": conversion.order, "at_grid_edge": conversion.at_grid_edge}


def teacher_distributions(ensemble, token_ids: np.ndarray, queries: int, context: int = 16) -> np.ndarray:
    """(queries, N, V) teacher next-token distributions at consecutive positions of `token_ids`,
    each with at least `context` tokens before it, in windows the ensemble's context can hold.

    Args:
        ensemble: an in-context ensemble (dpledger.decoding.icl): `n_positions` and `distributions(ids)`
            giving (1, L, N, V) teacher distributions.
        token_ids: the token ids of the held-out text, 1-D.
        queries: the number of query positions (>= 1).
        context: the fewest tokens before a query position in its window.

    Returns:
        A (queries, N, V) array of next-token distributions.

    Raises:
        ValueError: if the ensemble's context is not longer than `context`, or the text has too few
            tokens for `queries` positions.
    """
    window = min(ensemble.n_positions, 64)
    require(window > context, f"the ensemble's context ({ensemble.n_positions} tokens) is too short for queries")
    rows: list[np.ndarray] = []
    start = 0
    while sum(r.shape[0] for r in rows) < queries:
        require(start + window <= token_ids.size, f"the text has too few tokens for {queries} queries")
        ids = torch.from_numpy(np.asarray(token_ids[start:start + window], dtype=np.int64)).unsqueeze(0)
        _, teachers = ensemble.distributions(ids)       # (1, L, N, V)
        rows.append(teachers[0, context:].numpy())
        start += window
    return np.concatenate(rows)[:queries]


def hot_vs_cold(distributions: np.ndarray, samples: int = 200, seed: int = 0, target_yield: float = 0.5,
                budget_queries: int = 1000, delta: float = 1e-5, source: dict | None = None,
                started: float | None = None) -> HotPateResult:
    """Both voting schemes on teacher distributions (Q, N, V), at T/N = 0.05, 0.10, ..., 1.

    Args:
        distributions: (Q, N, V) teacher next-token distributions.
        samples: voting rounds per query and scheme (>= 2).
        seed: the seed of the voting rounds.
        target_yield: the matched utility, DPARGMAX's expected yield, in (0, 1).
        budget_queries: the queries charged for the matched cost (>= 1).
        delta: the delta of the matched cost's epsilon, in (0, 1).
        source: a description of where the distributions came from, recorded in the result.
        started: the time.time() the run started (default: now), for the recorded run time.

    Returns:
        The HotPateResult: both diversity curves and the matched-utility costs of hot and cold.

    Raises:
        ValueError: if `samples`, `target_yield`, `budget_queries` or `delta` is out of range.
    """
    samples = require_int_at_least("samples", samples, 2)
    target_yield = require_in_open("target_yield", target_yield, 0.0, 1.0)
    budget_queries = require_int_at_least("budget_queries", budget_queries, 1)
    delta = require_in_open("delta", delta, 0.0, 1.0)
    started = time.time() if started is None else started
    queries, teachers = distributions.shape[:2]
    thresholds = tuple(sorted({max(1, round(f * teachers)) for f in FRACTIONS}))
    hot = mean_diversity_curve(distributions, thresholds, True, samples, seed)
    cold = mean_diversity_curve(distributions, thresholds, False, samples, seed)
    costs = {name: matched_privacy_cost(thresholds, dpargmax_yields(distributions, thresholds, name == "hot",
                                                                    samples, seed),
                                        teachers, target_yield, budget_queries, delta)
             for name in ("hot", "cold")}
    hot_eps, cold_eps = costs["hot"]["epsilon"], costs["cold"]["epsilon"]
    matched = {"target_yield": target_yield, "budget_queries": budget_queries, "delta": delta,
               "calibration": f"DPARGMAX with s1 = s2 = {NOISE_PER_THRESHOLD:g} T, released-output accounting; the "
                              "yield is DPARGMAX's expected pass rate of its noisy screen",
               **costs, "cold_over_hot": cold_eps / hot_eps if hot_eps and cold_eps is not None else None}
    return HotPateResult(teachers, queries, samples, seed, thresholds, hot, cold, target_yield, budget_queries, delta,
                         matched, time.time() - started, source or {})


def run_hotpate(teachers: int = 64, queries: int = 48, samples: int = 200, seed: int = 0, prompt_tokens: int = 48,
                target_yield: float = 0.5, budget_queries: int = 1000, delta: float = 1e-5,
                verbose: bool = True) -> HotPateResult:
    """Hot vs cold voting with `teachers` in-context teachers of the embedded default (module docstring).

    Args:
        teachers: the number N of in-context teachers (>= 2).
        queries: the teacher-forced query positions (>= 1).
        samples: voting rounds per query and scheme (>= 2).
        seed: the seed of the voting rounds (>= 0).
        prompt_tokens: each teacher's private prompt budget, in tokens.
        target_yield: the matched utility, DPARGMAX's expected yield, in (0, 1).
        budget_queries: the queries charged for the matched cost (>= 1).
        delta: the delta of the matched cost's epsilon, in (0, 1).
        verbose: whether building or loading the embedded default prints progress.

    Returns:
        The HotPateResult (`hot_vs_cold`), its source naming the ensemble and text.

    Raises:
        ValueError: if a parameter is out of range (checked before the teachers run).
    """
    from transformers import AutoTokenizer

    from dpledger.decoding.icl import embedded_icl_default, load_icl_ensemble

    teachers = require_int_at_least("teachers", teachers, 2)
    queries = require_int_at_least("queries", queries, 1)
    require_int_at_least("samples", samples, 2)
    require_in_open("target_yield", target_yield, 0.0, 1.0)
    require_int_at_least("budget_queries", budget_queries, 1)  # refused before the teachers run, not after
    require_in_open("delta", delta, 0.0, 1.0)
    require_int_at_least("seed", seed, 0)
    set_single_thread()
    started = time.time()
    embedded = embedded_icl_default(teachers, verbose=verbose)
    ensemble = load_icl_ensemble(str(embedded.public_path), str(embedded.tokenizer_path), teachers, prompt_tokens,
                                 corpus=embedded.corpus)
    tokens = encode_documents(AutoTokenizer.from_pretrained(str(embedded.tokenizer_path)), embedded.corpus.private_heldout)
    source = {"ensemble": "embedded default, in-context teachers (dpledger.decoding.icl)", "prompt_tokens": prompt_tokens,
              "text": "embedded private held-out dialogues", "public_model": str(embedded.public_path)}
    return hot_vs_cold(teacher_distributions(ensemble, tokens, queries), samples, seed, target_yield, budget_queries,
                       delta, source, started)


def hotpate_figure(result: HotPateResult) -> bytes:
    """Yield, coverage and transferred support size against T/N, hot and cold.

    Args:
        result: the hot vs cold result to plot.

    Returns:
        The three-panel figure as PNG bytes.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = np.asarray(result.thresholds) / result.teachers
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for curve, label, style in ((result.hot, "hot (coordinated)", "-o"), (result.cold, "cold (independent)", "--s")):
        axes[0].errorbar(fractions, curve.yield_, yerr=np.asarray(curve.yield_stderr) * 1.96, fmt=style, ms=3,
                         label=label, capsize=2)
        axes[1].plot(fractions, curve.coverage, style, ms=3, label=label)
        axes[2].plot(fractions, curve.support_size, style, ms=3, label=label)
    for axis, title in zip(axes, ("yield (some token >= T votes)", "coverage (mass of transferred support)",
                                  "transferred support size")):
        axis.set_xlabel("T / N")
        axis.set_title(title, fontsize=10)
        axis.axvline(0.25, color="#999", lw=0.8, ls=":", label="T = N/4 (hot's coverage should exceed cold's above it)")
        axis.grid(alpha=0.3)
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    figure.suptitle(f"Hot vs cold PATE: N = {result.teachers} in-context teachers, {result.queries} queries, "
                    f"{result.samples} voting rounds each", fontsize=11)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()


def hotpate_table(result: HotPateResult):
    """One row per threshold T: T, T/N and the yield, coverage and transferred support size of hot
    and cold voting.

    Args:
        result: the hot vs cold result.

    Returns:
        A pandas DataFrame with the columns T, T/N, yield hot, yield cold, coverage hot, coverage cold,
        support hot and support cold.
    """
    import pandas as pd

    return pd.DataFrame({"T": result.thresholds,
                         "T/N": [round(t / result.teachers, 3) for t in result.thresholds],
                         "yield hot": result.hot.yield_, "yield cold": result.cold.yield_,
                         "coverage hot": result.hot.coverage, "coverage cold": result.cold.coverage,
                         "support hot": result.hot.support_size, "support cold": result.cold.support_size})


def _matched_lines(result: HotPateResult) -> list[str]:
    matched = result.matched
    lines = [f"Privacy cost at a matched utility: the largest T at which DPARGMAX's expected yield is still >= "
             f"{matched['target_yield']:g} ({matched['calibration']}; {matched['budget_queries']} queries, "
             f"delta = {matched['delta']:g}):"]
    for name in ("hot", "cold"):
        entry = matched[name]
        lines.append(f"  {name}: " + (entry["note"] if entry["threshold"] is None else
                                       f"T = {entry['threshold']} (T/N = {entry['threshold_fraction']:.2f}"
                                       + (", the ceiling T = N: a larger T is impossible" if entry["at_ceiling"] else "")
                                       + f"), DPARGMAX yield {entry['dpargmax_yield']:.3f}, epsilon = "
                                       f"{entry['epsilon']:.4g}" + (" (at the edge of the order grid)"
                                                                    if entry["at_grid_edge"] else "")))
    if matched["cold_over_hot"] is not None:
        lines.append(f"  cold costs {matched['cold_over_hot']:.3g}x the epsilon of hot, each at a yield of at least "
                     f"{matched['target_yield']:g}")
    return lines


def hotpate_markdown(result: HotPateResult) -> str:
    """The hot vs cold section as Markdown: the setting, the table, whether hot coverage is higher
    at every T >= N/4, and the privacy cost at a matched utility.

    Args:
        result: the hot vs cold result.

    Returns:
        The Markdown text, ending in a newline.
    """
    from dpledger.reports.render import markdown_table

    verdict = "higher" if result.hot_coverage_higher_from_quarter else "NOT higher"
    return "\n".join(["## Hot vs cold PATE (Cohen et al. 2023)", "",
                      f"N = {result.teachers} in-context teachers, {result.queries} teacher-forced queries, "
                      f"{result.samples} voting rounds per query and scheme ({result.seconds:.0f} s).", "",
                      markdown_table(hotpate_table(result)), "",
                      f"Hot coverage is {verdict} than cold at every T >= N/4.", "", *_matched_lines(result), ""])


def hotpate_html(result: HotPateResult) -> str:
    """The hot vs cold section as HTML for a report's page: the setting, the figure inline, the
    privacy cost at a matched utility and the table; every line from the result is escaped.

    Args:
        result: the hot vs cold result.

    Returns:
        The HTML fragment.
    """
    from dpledger.reports.render import _html_table

    encoded = base64.b64encode(hotpate_figure(result)).decode()
    verdict = "higher" if result.hot_coverage_higher_from_quarter else "NOT higher"
    return "\n".join([
        "<h2 id='hot-pate'>Hot vs cold PATE (Cohen et al. 2023)</h2>",
        f"<p>N = {result.teachers} in-context teachers on held-out private dialogues, {result.queries} queries, "
        f"{result.samples} voting rounds per query and scheme. Hot coverage is <b>{verdict}</b> than cold at every "
        "T &ge; N/4.</p>",
        f"<figure><img alt='hot vs cold' src='data:image/png;base64,{encoded}'><figcaption>yield, coverage and "
        "transferred support size against T/N</figcaption></figure>",
        "<p>" + "<br>".join(escaped(line) for line in _matched_lines(result)) + "</p>",
        _html_table(hotpate_table(result).round(4), "hotpate")])


def write_hotpate(result: HotPateResult, out: str | Path) -> dict[str, Path]:
    """hotpate.json (strict), hotpate.png and hotpate.md under `out`, each written atomically and never
    through a link (dpledger.accounting.safe_files).

    Args:
        result: the hot vs cold result.
        out: the output directory (created if missing).

    Returns:
        "json", "png", "md" -> the path written.

    Raises:
        ValueError: if the result holds a NaN or an infinity (strict JSON).
        OSError: if a file cannot be written.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "hotpate.json", "png": out / "hotpate.png", "md": out / "hotpate.md"}
    contents = {"json": (json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n").encode(),
                "png": hotpate_figure(result), "md": hotpate_markdown(result).encode()}
    for kind, path in paths.items():
        write_atomic(path, contents[kind])
    return paths

