"""The LaTeX tables a reviewer pastes into a paper: a caption and a unique label, numbers right-aligned
and text left, a missing value "--" with its note in the caption, and a label key that LaTeX accepts."""
import re

import pandas as pd
import pytest

from dpledger.reports.render import latex_label, latex_table


def table() -> pd.DataFrame:
    frame = pd.DataFrame({"method": ["PMixED", "AdaPMixED_remove"], "queries": [1024, 1024],
                          "epsilon@1e-05": [7.98, None], "data_dependent": [False, True]}, dtype=object)
    frame.attrs["reasons"] = [{}, {"epsilon@1e-05": "no epsilon at this delta"}]
    return frame


def test_numbers_are_right_aligned_text_left_and_the_caption_and_label_precede_the_tabular():
    latex = latex_table(table(), "Method comparison", "tab:dpledger-comparison")
    lines = latex.splitlines()
    assert lines[0] == r"\begin{table}[htbp]" and lines[-1] == r"\end{table}"
    assert r"\begin{tabular}{lrrl}" in lines  # a bool column is text, a column with a missing number numeric
    caption = next(i for i, line in enumerate(lines) if line.startswith(r"\caption{"))
    label = lines.index(r"\label{tab:dpledger-comparison}")
    assert caption < label < lines.index(r"\begin{tabular}{lrrl}")
    assert r"AdaPMixED\_remove" in latex and "--$^{1}$" in latex
    assert "1: no epsilon at this delta." in lines[caption]
    # every row has as many cells as the column specification has columns
    body = [line for line in lines if line.endswith(r" \\")]
    assert len(body) == 3 and all(line.count(" & ") == 3 for line in body)


def test_a_label_holding_other_characters_is_refused():
    with pytest.raises(ValueError, match=r"a LaTeX label must be made of a-z, 0-9, ':' and '-', got 'tab:a b'"):
        latex_table(table(), "caption", "tab:a b")


@pytest.mark.parametrize("text, key", [("AdaPMixED (remove_one)", "adapmixed-remove-one"), ("PMixED, eps=8", "pmixed-eps-8"),
                                       ("___", "table"), ("Hot PATE: DPARGMAX", "hot-pate-dpargmax")])
def test_labels_are_keys_latex_accepts(text, key):
    assert latex_label(text) == key
    assert re.fullmatch(r"[a-z0-9-]+", latex_label(text))
