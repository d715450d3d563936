"""Report figures (matplotlib, Agg), each returned as PNG bytes."""
from __future__ import annotations

import io
import textwrap
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from dpledger.accounting.conversion import epsilon_from_rdp  # noqa: E402
from dpledger.accounting.curve import RdpCurve  # noqa: E402
from dpledger.accounting.errors import require  # noqa: E402
from dpledger.accounting.relation import NeighbouringRelation  # noqa: E402
from dpledger.reports.run_data import RunData  # noqa: E402
from dpledger.reports.tables import leakage_table


TITLE_WIDTH = 58
"""Characters per title line: a longer title wraps (never clipped at the figure's edge)."""


def _figure(width: float, height: float):
    """A figure with constrained layout: titles, labels and legends are kept inside it."""
    return plt.subplots(figsize=(width, height), layout="constrained")


def wrapped(title: str, width: int = TITLE_WIDTH) -> str:
    """A figure title wrapped into lines of at most `width` characters (never broken at a hyphen).

    Args:
        title: the title text.
        width: the most characters per line (>= 1).

    Returns:
        The wrapped title, lines joined by newlines; `title` itself when it has no words to wrap.
    """
    return "\n".join(textwrap.wrap(title, width, break_on_hyphens=False)) or title


def _title(axis, title: str) -> None:
    axis.set_title(wrapped(title), fontsize=11)


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()


def _charged(run: RunData) -> np.ndarray:
    """Per-step charged curves (steps, orders), all components summed; ValueError naming the steps
    where a charge is NaN (a histogram would drop it)."""
    charged = np.sum([np.asarray([r[f"rdp_{name}"] for r in run.records], dtype=np.float64)
                      for name in run.manifest["mechanism"]["components"]], axis=0)
    nan_steps = [r["step"] for r, row in zip(run.records, charged) if np.isnan(row).any()]
    require(not nan_steps, f"{run.directory}: the charged RDP is NaN at steps {nan_steps[:5]}")
    return charged


def cumulative_epsilon_series(run: RunData, per_step: np.ndarray, points: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """epsilon (improved, at the run's delta) of the running sum of per-step curves, at `points` steps.

    Args:
        run: the run (its manifest's orders and relation, and its first delta, are read).
        per_step: (steps, orders) per-step RDP values in nats, on the manifest's order grid.
        points: the most steps evaluated, evenly spaced from the first to the last (>= 1).

    Returns:
        (steps, epsilons): the 1-based step numbers evaluated, increasing, and epsilon after each of
        those steps (improved conversion, Balle et al. 2020, Theorem 21; +inf where no order is finite).
    """
    orders = run.manifest["orders"]
    relation = NeighbouringRelation(run.manifest["relation"])
    running = np.cumsum(per_step, axis=0)
    steps = np.unique(np.linspace(1, len(per_step), min(points, len(per_step))).astype(int))
    epsilons = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in steps:
            epsilons.append(epsilon_from_rdp(RdpCurve(orders, running[step - 1], relation), run.delta).epsilon)
    return steps, np.asarray(epsilons)


def comparison_series(run: RunData) -> tuple[str, np.ndarray] | None:
    """The other bound to draw beside the charged one: the data-independent bound (Theorem 3.1, proven
    for the proof-orders and all-orders balls and as claimed for the paper's, plus screening) for a data-dependent run,
    the data-dependent loss (Eq. 3) otherwise, where the records hold it (traces before records_version 3:
    a newer run charged by Theorem 3.1 does not compute it, and the figure says so: `eq3_not_drawn`).

    Args:
        run: the run whose per-step records are read.

    Returns:
        (legend label, (steps, orders) per-step RDP values in nats, the screen's charge included), or
        None when the records carry no data-independent bound, or no Eq. 3 beside a Theorem 3.1 charge.
    """
    components = run.manifest["mechanism"]["components"]
    if not run.records or not run.records[0]["data_independent"]:
        return None
    if not run.data_dependent and "observed_data_dependent" not in run.records[0]:
        return None
    screen = (np.asarray([r["rdp_screen"] for r in run.records], dtype=np.float64)
              if "screen" in components else 0.0)
    answered = np.asarray([r["answered_by"] == "mechanism" for r in run.records])[:, None]
    if run.data_dependent:
        bound = np.asarray([r["data_independent"] for r in run.records], dtype=np.float64)
        ball = run.manifest["mechanism"]["params"].get("ball", "projection-order")
        label = ("data-independent bound (Theorem 3.1, "
                 f"{'as claimed' if ball == 'projection-order' else f'proven: {ball} ball'})")
        return label, screen + np.where(answered, bound, 0.0)
    observed = np.asarray([r["observed_data_dependent"] for r in run.records], dtype=np.float64)
    return "data-dependent loss (Flemings et al. 2024, Eq. 3, observed)", screen + np.where(answered, observed, 0.0)


def eq3_not_drawn(run: RunData) -> str | None:
    """Why a run charged by Theorem 3.1 draws no Eq. 3 line, with what the audit found comparing the
    two (its theorem_3_1 check, where audit.json is shown).

    Args:
        run: the run plotted.

    Returns:
        One sentence starting "Not drawn:", or None where the figure draws the comparison line or the
        run makes no Theorem 3.1 comparison.
    """
    if run.data_dependent or not run.records or not run.records[0]["data_independent"] \
            or "observed_data_dependent" in run.records[0]:
        return None
    sentence = ("Not drawn: the data-dependent loss (Eq. 3), which this run neither charges nor records (the decode "
                "loop computes only what it charges); the audit compares it with Theorem 3.1 at every step, at the "
                "orders where Theorem 3.1 is claimed")
    check = next((c for c in (run.audit or {}).get("checks", []) if c.get("name") == "theorem_3_1"), None)
    evidence = (check or {}).get("evidence") or {}
    if check is None or check.get("status") == "SKIPPED" or "exceeding_steps" not in evidence:
        return sentence + " (no audit of it is shown here)."
    return (sentence + f": Eq. 3 above Theorem 3.1 at {evidence['exceeding_steps']} of {len(run.records)} queries, "
            f"largest ratio {evidence['max_ratio']:.3g} (audit check theorem_3_1, {check['status']}).")


def cumulative_epsilon_lines(run: RunData) -> list[str]:
    """What each line of the cumulative privacy-loss figure is, one sentence each (the figure prints
    them under its axes; a reader must not guess why one line crosses another), and why a line is not
    drawn where one is missing.

    Args:
        run: the run plotted.

    Returns:
        One sentence per line drawn: the charged loss, the other bound where the records hold one, and
        the budget's lines where the run has a budget; then, for a run charged by Theorem 3.1 whose
        records hold no Eq. 3, the "Not drawn:" sentence (eq3_not_drawn).
    """
    relation = run.manifest["relation"]
    adds = relation in ("add_or_remove_one", "add_one")   # neighbours with one more teacher
    if run.data_dependent:
        charged = (f"Solid: the data-dependent loss charged to this run, covering {relation.replace('_', '-')} "
                   "neighbours (Eq. 3 of Flemings et al. 2024 for a removed teacher"
                   + ("; for an added one the add-one bound, an upper bound looser than Eq. 3, docs/soundness.md"
                      if adds else "") + "), plus the screen's charge.")
    else:
        charged = f"Solid: the data-independent bound charged to this run, covering {relation.replace('_', '-')} neighbours."
    lines = [charged]
    if comparison_series(run) is not None:
        ball = run.manifest["mechanism"]["params"].get("ball", "projection-order")
        lines.append("Dashed: Theorem 3.1 of Flemings et al. 2024 (data-independent; "
                     + (f"proven for this run's {ball} ball" if ball != "projection-order" else "as claimed, not "
                        "guaranteed for the paper's ball") + ", docs/soundness.md), for comparison, not charged"
                     + (": the charged loss may lie above it, as the add-one bound is looser than Eq. 3." if adds else ".")
                     if run.data_dependent else
                     "Dashed: the data-dependent loss observed on this run's data (Eq. 3), for comparison: not charged.")
    budget = run.ledger.get("budget")
    if budget is not None:
        lines.append("Dotted: the budget's epsilon; grey: the query from which the filter lets the public model answer.")
    missing = eq3_not_drawn(run)
    return lines + ([missing] if missing else [])


def cumulative_epsilon_figure(run: RunData) -> Figure | None:
    """Cumulative epsilon over every query (1 to Q, so the curves flatten where the public model
    answers) of the charged curve and of the other bound, each line explained under the axes.

    Args:
        run: the run to plot (its ledger.json, records and, if set, its budget).

    Returns:
        The matplotlib figure (the caller closes it), or None when epsilon is 0 or +inf at every order.

    Raises:
        ValueError: if a per-step charge is NaN.
    """
    if run.ledger["breakdown"]["order"] is None:
        return None
    figure, axis = _figure(6.4, 4.4)
    budget = run.ledger.get("budget")
    steps, charged = cumulative_epsilon_series(run, _charged(run))
    label = "charged: data-dependent loss" if run.data_dependent else "charged"
    axis.plot(steps, charged, label=label, color="tab:blue")
    other = comparison_series(run)
    if other is not None:
        steps2, values = cumulative_epsilon_series(run, other[1])
        axis.plot(steps2, values, label=other[0], color="tab:orange", linestyle="--")
    public = sum(r["answered_by"] != "mechanism" for r in run.records)
    title = f"{run.label}: cumulative privacy loss ({public} of {len(run.records)} queries answered publicly)"
    if budget is not None:
        axis.axhline(budget["epsilon"], color="tab:red", linestyle=":",
                     label=f"budget epsilon {budget['epsilon']:g} (filter at order {budget['order']:g})")
        if budget["first_refused_step"] is not None:
            axis.axvline(budget["first_refused_step"] + 1, color="grey", linestyle="--", linewidth=0.8,
                         label=f"budget reached: the public model answers from query {budget['first_refused_step'] + 1}")
    axis.set_xlabel("query")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_ylabel(f"epsilon at delta={run.delta:g}")
    axis.set_yscale("log")
    _title(axis, title)
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    figure.supxlabel("\n".join(wrapped(line, 95) for line in cumulative_epsilon_lines(run)), fontsize=7, x=0.01,
                     ha="left")
    return figure


def plot_cumulative_epsilon(run: RunData) -> bytes | None:
    """The cumulative privacy-loss figure (`cumulative_epsilon_figure`) as PNG bytes.

    Args:
        run: the run to plot.

    Returns:
        The figure as PNG bytes, or None when epsilon is 0 or +inf at every order.

    Raises:
        ValueError: if a per-step charge is NaN.
    """
    figure = cumulative_epsilon_figure(run)
    return None if figure is None else _png(figure)


def step_loss_figure(run: RunData) -> Figure | None:
    """Histogram of per-step charges at the optimal order; None when there is no optimal order, or
    when every finite charge is the same (a data-independent charge: one bar says nothing a sentence
    does not, and the report's breakdown states the value).

    Args:
        run: the run to plot (ledger.json's optimal order, the per-step records).

    Returns:
        The matplotlib figure (the caller closes it), or None.

    Raises:
        ValueError: if a per-step charge is NaN.
    """
    order = run.ledger["breakdown"]["order"]
    if order is None:
        return None
    values = _charged(run)[:, run.manifest["orders"].index(order)]
    finite = values[np.isfinite(values)]
    if finite.size == 0 or np.ptp(finite) == 0:
        return None
    figure, axis = _figure(6.4, 3.2)
    axis.hist(finite, bins=min(40, max(2, np.unique(finite).size)), color="tab:blue", alpha=0.8)
    axis.set_xlabel(f"per-step charged RDP at order {order:g}")
    axis.set_ylabel("steps")
    axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    _title(axis, f"{run.label}: per-step loss ({len(values) - len(finite)} steps with no guarantee)")
    return figure


def plot_step_loss_distribution(run: RunData) -> bytes | None:
    """The per-step loss histogram (`step_loss_figure`) as PNG bytes.

    Args:
        run: the run to plot.

    Returns:
        The figure as PNG bytes, or None (see `step_loss_figure`).

    Raises:
        ValueError: if a per-step charge is NaN.
    """
    figure = step_loss_figure(run)
    return None if figure is None else _png(figure)


def plot_mixing_weights(run: RunData) -> bytes | None:
    """Histogram of PMixED's per-teacher mixing weights lambda over every step, in [0, 1].

    Args:
        run: the run whose per-step records' `lambdas` are plotted.

    Returns:
        The figure as PNG bytes, or None when the records hold no mixing weight. When every weight
        falls in one of the histogram's 50 bins, the smallest, mean and largest weight per query are
        drawn instead (a one-bar histogram shows nothing).

    Raises:
        ValueError: if a mixing weight is NaN (naming the first steps where one is).
    """
    nan_steps = [r["step"] for r in run.records if np.isnan(np.asarray(r["lambdas"], dtype=np.float64)).any()]
    require(not nan_steps, f"{run.directory}: the mixing weights are NaN at steps {nan_steps[:5]}")
    lambdas = np.concatenate([np.asarray(r["lambdas"], dtype=np.float64) for r in run.records])
    if lambdas.size == 0:
        return None
    figure, axis = _figure(6.4, 3.2)
    if np.count_nonzero(np.histogram(lambdas, bins=50, range=(0, 1))[0]) >= 2:
        axis.hist(lambdas, bins=50, range=(0, 1), color="tab:green", alpha=0.8)
        axis.set_xlabel("mixing weight lambda")
        axis.set_ylabel("teacher-steps")
        axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        per_query = [np.asarray(r["lambdas"], dtype=np.float64) for r in run.records]
        queries = np.arange(1, len(per_query) + 1)
        for values, label, style in (([v.min() for v in per_query], "smallest", ":"),
                                     ([v.mean() for v in per_query], "mean", "-"),
                                     ([v.max() for v in per_query], "largest", "--")):
            axis.plot(queries, values, style, color="tab:green", label=f"{label} over the teachers")
        axis.set_xlabel("query")
        axis.set_ylabel("mixing weight lambda")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.legend(fontsize=7)
    _title(axis, f"{run.label}: mixing weights (mean {lambdas.mean():.3f}, range [{lambdas.min():.3g}, "
                 f"{lambdas.max():.3g}])")
    return _png(figure)


def plot_screening_pass_rate(run: RunData, window: int = 64) -> bytes | None:
    """The rolling fraction of queries that passed AdaPMixED's noisy screen (Flemings et al. 2024).

    Args:
        run: the run whose per-step `screen_passed` records are plotted.
        window: the rolling window in queries (>= 1), shrunk so that a run has at least four windows.

    Returns:
        The figure as PNG bytes, or None when the mechanism has no screen.
    """
    if "screen" not in run.manifest["mechanism"]["components"]:
        return None
    passed = np.asarray([r["screen_passed"] for r in run.records], dtype=np.float64)
    window = max(1, min(window, len(passed) // 4))  # at least four windows, so a short run still shows a trend
    rolling = np.convolve(passed, np.ones(window) / window, mode="valid")
    figure, axis = _figure(6.4, 3.2)
    axis.plot(np.arange(window, len(passed) + 1), rolling, color="tab:purple", marker="." if rolling.size < 64 else None)
    axis.set_ylim(-0.02, 1.02)
    axis.set_xlabel("query")
    axis.set_ylabel(f"pass rate (window {window})")
    _title(axis, f"{run.label}: screening pass rate (overall {passed.mean():.3f})")
    return _png(figure)


def infinite_orders_label(orders: np.ndarray, infinite: np.ndarray) -> str:
    """The legend entry for the orders where the composed curve is +inf.

    Args:
        orders: the Renyi orders of the curve, increasing.
        infinite: a boolean mask over `orders`, True where the curve is +inf.

    Returns:
        "+inf: no guarantee at orders >= A" when every order from the first infinite one up is
        infinite, else the number of infinite orders.
    """
    if infinite.any() and infinite[np.argmax(infinite):].all():  # every order from the first +inf one up
        return f"+inf: no guarantee at orders >= {orders[infinite][0]:g}"
    return f"+inf: no guarantee at {int(infinite.sum())} orders (marked)"


def plot_rdp_curve(run: RunData) -> bytes | None:
    """The composed curve from ledger.json, with the orders where it is +inf shaded and marked at the
    top of the plot; None when it is 0 or +inf everywhere (nothing finite to draw).

    Args:
        run: the run whose manifest's order grid and ledger.json's components are plotted.

    Returns:
        The figure as PNG bytes, or None.

    Raises:
        ValueError: if the composed curve is NaN at some order.
    """
    orders = np.asarray(run.manifest["orders"], dtype=np.float64)
    components = run.ledger["ledger"]["components"]
    total = np.sum([[np.inf if v == "inf" else v for v in c["values"]] for c in components.values()], axis=0)
    require(not np.isnan(total).any(),
            f"{run.directory}/ledger.json: the composed RDP curve is NaN at orders {orders[np.isnan(total)][:5].tolist()}")
    finite = np.isfinite(total) & (total > 0)
    if not finite.any():
        return None
    infinite = np.isinf(total)
    figure, axis = _figure(6.4, 3.8)
    axis.plot(orders[finite], total[finite], marker=".", color="tab:blue", label="composed RDP")
    order = run.ledger["breakdown"]["order"]
    if order is not None:
        axis.axvline(order, color="tab:red", linestyle=":", label=f"optimal order {order:g}")
    axis.set_xscale("log")
    shown = total[finite]
    if shown.max() > 10 * shown.min():  # a log axis over less than a decade prints unreadable ticks
        axis.set_yscale("log")
    if infinite.any():
        # a band over each run of consecutive +inf orders, and a marker per order at the top edge
        edges = np.flatnonzero(np.diff(np.concatenate([[0], infinite.astype(int), [0]])))
        for first, stop in zip(edges[::2], edges[1::2]):
            low = orders[first - 1] if first > 0 else orders[first]
            axis.axvspan(np.sqrt(low * orders[first]) if first > 0 else orders[first], orders[stop - 1],
                         color="tab:red", alpha=0.12, linewidth=0)
            middle = np.sqrt(orders[first] * orders[stop - 1])
            axis.text(middle, 0.5, "+inf", transform=axis.get_xaxis_transform(), color="tab:red", ha="center",
                      va="center", fontsize=10, fontweight="bold")
        # markers on the top spine, outside the data area: no finite value is drawn at those orders
        axis.plot(orders[infinite], np.full(int(infinite.sum()), 1.0), transform=axis.get_xaxis_transform(),
                  linestyle="none", marker="^", markersize=4, color="tab:red", clip_on=False,
                  label=infinite_orders_label(orders, infinite))
        axis.set_xlim(orders[0] / 1.1, orders[-1] * 1.1)
    axis.set_xlabel("Renyi order")
    axis.set_ylabel("RDP epsilon")
    _title(axis, f"{run.label}: RDP curve")
    axis.legend(fontsize=8, loc="lower right" if infinite.any() else "best")
    axis.grid(alpha=0.3, which="both")
    return _png(figure)


def plot_leakage(run: RunData) -> bytes | None:
    """The audit's empirical epsilon per neighbour (dpledger.audit's neighbour ablation), the claimed
    epsilon as a line; neighbours the claim does not cover in grey.

    Args:
        run: the run whose current audit.json is read.

    Returns:
        The figure as PNG bytes, or None when no audit is shown or it has no per-neighbour ablation.
    """
    table = leakage_table(run)
    if table is None or run.audit is None:  # a leakage table comes from an audit: never the second
        return None
    figure, axis = _figure(7.5, 0.35 * len(table) + 1.6)
    colours = ["tab:blue" if claimed else "tab:gray" for claimed in table["claimed"]]
    axis.barh(table["neighbour"], table["empirical_epsilon"], color=colours)
    claimed = next(c for c in run.audit["checks"] if c["name"] == "neighbour_ablation")["evidence"]["claimed_epsilon"]
    if np.isfinite(claimed):
        axis.axvline(claimed, color="tab:red", linestyle="--", label=f"claimed {claimed:.3g}")
        axis.legend(fontsize=8)
    axis.set_xscale("symlog")
    axis.set_xlabel("empirical epsilon (grey: not covered by the claim)")
    _title(axis, f"{run.label}: leakage per neighbour (audit)")
    axis.tick_params(axis="y", labelsize=7)
    return _png(figure)


def run_figures(run: RunData) -> dict[str, bytes]:
    """Every figure a report shows for one run; a figure that does not apply is left out.

    Args:
        run: the run to plot.

    Returns:
        Caption -> PNG bytes, in the report's order: cumulative privacy loss, per-step loss
        distribution, mixing weights, screening pass rate, RDP curve over orders, audit leakage per
        neighbour.

    Raises:
        ValueError: if a charge, a mixing weight or the composed curve is NaN.
    """
    figures = {"cumulative privacy loss": plot_cumulative_epsilon(run),
               "per-step loss distribution": plot_step_loss_distribution(run),
               "mixing weights": plot_mixing_weights(run),
               "screening pass rate": plot_screening_pass_rate(run),
               "RDP curve over orders": plot_rdp_curve(run),
               "audit: leakage per neighbour": plot_leakage(run)}
    return {name: png for name, png in figures.items() if png is not None}
