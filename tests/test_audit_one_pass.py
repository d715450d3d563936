"""dpledger.audit.audit runs the checks that read every window over one pass of the windows: each
window read, and its distributions formed, once for all of them. Each check's result must be the one
it gives alone (LoadedTrace.run_check, lazily over map_windows), errors of a window included."""
from __future__ import annotations

import pytest

from dpledger.audit import audit_run, bounds, loader, replay
from dpledger.audit.ablation import check_ablation
from dpledger.audit.loader import load_trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.ensemble import Ensemble
from dpledger.decoding.run import run_decode
from tests.micro import PAPER_ADAPMIXED, micro_config

KINDS = {
    "adapmixed": (PAPER_ADAPMIXED, True),
    "adapmixed-remove-one": ({**PAPER_ADAPMIXED, "screening": False, "relation": "remove_one"}, True),
    "pmixed-subsampled-from-models": ({"type": "pmixed", "alpha": 6.0, "beta": 0.05, "sample_rate": 0.6}, False),
    "hot-dpargmax": ({"type": "voting", "aggregator": "dpargmax", "threshold": 2.0, "sigma": 1.0,
                      "sigma_threshold": 1.0, "votes": "coordinated"}, True),
}
ALONE = {"replay": replay.check_replay, "mixing_ball": bounds.check_mixing_ball,
         "data_dependent_eq3": bounds.check_data_dependent_charge, "theorem_3_1": bounds.check_theorem_3_1,
         "utility_theorem_4_3": bounds.check_utility_bound,
         "neighbour_ablation": lambda trace: check_ablation(trace, None, 60, 0)[0]}


@pytest.fixture(scope="module")
def runs(micro_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("one-pass")
    for name, (mechanism, payload) in KINDS.items():
        mechanism = dict(mechanism)
        relation = mechanism.pop("relation", None)
        config = micro_config(micro_models, root / name, mechanism, queries=10, block_size=5,
                              replay_payload=payload, **({"relation": relation} if relation else {}))
        run_decode(config_from_dict(config), progress=False, verbose=False)
    return root


@pytest.fixture
def small_windows(monkeypatch):
    """Windows of about 2 steps at this vocabulary, so that a block holds several."""
    monkeypatch.setattr(loader, "PAYLOAD_WINDOW_BYTES", 1)
    monkeypatch.setattr(loader.LoadedTrace, "window_rows", lambda self: 2)


@pytest.mark.parametrize("name", list(KINDS))
def test_each_check_over_one_pass_gives_what_it_gives_alone(runs, name, small_windows, monkeypatch):
    calls = []
    split = Ensemble.split_distributions
    monkeypatch.setattr(Ensemble, "split_distributions", staticmethod(lambda logits: calls.append(1) or split(logits)))
    report = audit_run(runs / name, mc_samples=60, play_game=False, write=False)
    formed = len(calls)
    windows = 2 * 3  # two blocks of 5 steps, in windows of 2, 2 and 1
    together = {check.name: check.to_dict() for check in report.checks}
    trace = load_trace(runs / name)
    compared = 0
    for check, alone in ALONE.items():
        if check not in together or (check == "neighbour_ablation" and name == "hot-dpargmax"):
            continue
        assert together[check] == alone(trace).to_dict(), check
        compared += 1
    assert compared == (1 if name == "hot-dpargmax" else 6)   # a voting run: the replay (its ablation reads votes)
    if name != "hot-dpargmax":   # the one pass forms each window's distributions once; the bracket, after it, again
        assert report.verdict == "PASS" and formed <= 2 * windows, formed


def test_a_window_error_reaches_only_its_own_check(runs, small_windows, monkeypatch):
    """A window function failing on the second window fails its check, as alone, and no other."""
    utility = bounds._utility_window

    def failing(trace, records, logits):
        if records[0]["step"] >= 2:
            raise ValueError("a planted failure at step 2")
        return utility(trace, records, logits)

    monkeypatch.setattr(bounds, "_utility_window", failing)
    report = audit_run(runs / "adapmixed", mc_samples=60, play_game=False, write=False)
    check = report.check("utility_theorem_4_3")
    assert check.status.value == "FAIL" and "a planted failure at step 2" in check.detail
    assert [c.name for c in report.failed] == ["utility_theorem_4_3"]
    with pytest.raises(ValueError, match="a planted failure"):
        bounds.check_utility_bound(load_trace(runs / "adapmixed"))
