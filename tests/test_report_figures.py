"""Figures a reviewer can publish: the cumulative privacy loss runs over every query with whole-number
ticks and says under its axes what each line is; every line drawn has a legend label; no histogram of
a single bar. Read from the matplotlib figures themselves, on synthetic runs (no models needed)."""
import matplotlib.pyplot as plt
import pytest

from dpledger.reports.plots import cumulative_epsilon_figure, cumulative_epsilon_lines, step_loss_figure
from dpledger.reports.run_data import load_run
from tests.micro import ADAPMIXED, PMIXED
from tests.synthetic import write_synthetic_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("figures")
    made = {name: write_synthetic_run(root / name, teachers=4, vocab=32, steps=40, block_size=10, mechanism=mechanism)
            for name, mechanism in {"pmixed": {"type": "pmixed", **PMIXED}, "adapmixed": ADAPMIXED}.items()}
    return {name: load_run(path) for name, path in made.items()}


def test_the_explanation_names_the_ball_theorem_3_1_holds_for(tmp_path):
    """Theorem 3.1 is proven for the all-orders ball and only as claimed for the paper's: the caption says which."""
    proven = load_run(write_synthetic_run(tmp_path / "proven", teachers=4, vocab=32, steps=24, block_size=8,
                                          mechanism={**ADAPMIXED, "ball": "all-orders"}))
    dashed = next(line for line in cumulative_epsilon_lines(proven) if line.startswith("Dashed"))
    assert "proven for this run's all-orders ball" in dashed and "not guaranteed" not in dashed
    figure = cumulative_epsilon_figure(proven)
    try:
        assert "data-independent bound (Theorem 3.1, proven: all-orders ball)" in [label for label, _ in
                                                                                   labelled_lines(figure)]
    finally:
        plt.close(figure)


def labelled_lines(figure):
    axis = figure.axes[0]
    return [(line.get_label(), line.get_linestyle()) for line in axis.get_lines()]


@pytest.mark.parametrize("name", ["pmixed", "adapmixed"])
def test_the_cumulative_figure_spans_every_query_and_explains_each_line(runs, name):
    run = runs[name]
    figure = cumulative_epsilon_figure(run)
    try:
        axis = figure.axes[0]
        assert axis.get_xlabel() == "query"
        lines = labelled_lines(figure)
        assert lines and all(not label.startswith("_") for label, _ in lines)  # every line in the legend
        solid = axis.get_lines()[0]
        assert solid.get_xdata()[-1] == len(run.records)  # the last query, not the last one answered
        ticks = [t for t in axis.get_xticks() if axis.get_xlim()[0] <= t <= axis.get_xlim()[1]]
        assert all(float(t).is_integer() for t in ticks)
        explained = " ".join(figure.get_supxlabel().split())  # as printed, line breaks aside
        sentences = cumulative_epsilon_lines(run)
        not_drawn = [sentence for sentence in sentences if sentence.startswith("Not drawn:")]
        assert len(sentences) - len(not_drawn) == len(lines)  # one sentence per line drawn
        if name == "pmixed":  # its records hold no Eq. 3 (records_version 3), and no audit is shown: it says both
            assert [label for label, _ in lines] == ["charged"] and len(not_drawn) == 1
            assert "data-dependent loss (Eq. 3)" in not_drawn[0] and "no audit of it is shown" in not_drawn[0]
        assert all(sentence.split()[0] in explained for sentence in sentences)
        if run.data_dependent:  # add-or-remove-one: the add-one bound covers the added teacher
            assert "add-one bound" in explained and "the charged loss may lie above it" in explained
    finally:
        plt.close(figure)


def test_a_constant_per_step_charge_draws_no_single_bar_histogram(runs):
    """PMixED charges Theorem 3.1 at every step alike: one bar says nothing a sentence does not."""
    assert step_loss_figure(runs["pmixed"]) is None


def test_a_varying_charge_draws_a_histogram_of_several_bars(runs):
    figure = step_loss_figure(runs["adapmixed"])
    try:
        assert figure is not None
        bars = [patch for patch in figure.axes[0].patches if patch.get_height() > 0]
        assert len(bars) >= 2
    finally:
        plt.close(figure)


def test_the_proof_orders_ball_is_named_proven(tmp_path):
    proven = load_run(write_synthetic_run(tmp_path / "proof", teachers=4, vocab=32, steps=24, block_size=8,
                                          mechanism={**ADAPMIXED, "ball": "proof-orders"}))
    dashed = next(line for line in cumulative_epsilon_lines(proven) if line.startswith("Dashed"))
    assert "proven for this run's proof-orders ball" in dashed
    figure = cumulative_epsilon_figure(proven)
    try:
        assert "data-independent bound (Theorem 3.1, proven: proof-orders ball)" in [
            label for label, _ in labelled_lines(figure)]
    finally:
        plt.close(figure)


def test_mixing_weights_in_one_bin_are_drawn_per_query_not_as_one_bar(runs, monkeypatch):
    import copy

    from dpledger.reports import plots

    run = copy.deepcopy(runs["pmixed"])   # the fixture is shared by the module
    for record in run.records:
        record["lambdas"] = [1.0] * len(record["lambdas"])
    captured = []
    monkeypatch.setattr(plots, "_png", lambda figure: captured.append(figure) or b"png")
    assert plots.plot_mixing_weights(run) == b"png"
    axis = captured[0].axes[0]
    assert not axis.patches                                   # no histogram bar
    assert [line.get_label() for line in axis.get_lines()] == [
        "smallest over the teachers", "mean over the teachers", "largest over the teachers"]
    assert axis.get_xlabel() == "query" and "range [1, 1]" in axis.get_title()
    plt.close(captured[0])
