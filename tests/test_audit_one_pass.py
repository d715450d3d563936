"""dpledger.audit.audit runs the checks that read every window over one pass of the windows: each
window read, and its distributions formed, once for all of them. Each check's result must be the one
it gives alone (LoadedTrace.run_check, lazily over map_windows), errors of a window included."""
from __future__ import annotations

from functools import partial

import pytest

from dpledger.audit import audit_run, bounds, loader, replay
from dpledger.audit.ablation import check_ablation
from dpledger.audit.audit import _guarded
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


@pytest.mark.parametrize("name", ["adapmixed", "adapmixed-remove-one"])
def test_eq3_and_the_ablation_read_one_set_of_leave_one_out_rows_per_window(runs, name, small_windows, monkeypatch):
    """The one pass forms each window's leave-one-out rows once, for data_dependent_eq3 and the neighbour
    ablation both (each formed its own: ~55 ms a paper-scale step); other lambdas for the same logits
    form their own rows."""
    from dpledger.mechanisms.kernels import _LeaveOneOut

    formed = []
    construct = _LeaveOneOut.__init__

    def counted(self, *args, parallel=False, **kwargs):
        formed.append(parallel)
        construct(self, *args, parallel=parallel, **kwargs)

    monkeypatch.setattr(_LeaveOneOut, "__init__", counted)
    report = audit_run(runs / name, mc_samples=60, play_game=False, write=False)
    # the audit's rows (the parallel twin's) once per step of the two blocks of 5; the replay's step forms its own
    assert report.verdict == "PASS" and formed.count(True) == 10, formed
    trace = load_trace(runs / name)
    records = next(trace.iter_blocks())[1][:2]
    logits = next(trace.iter_payload(2))[2]
    lambdas = bounds._recorded_lambdas(records)
    first = trace.window_leave_one_out(logits, lambdas)
    assert trace.window_leave_one_out(logits, lambdas) is first and len(first) == 2
    other = trace.window_leave_one_out(logits, lambdas * 0.5)
    assert other is not first and not (other[0].ratios == first[0].ratios).all()


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


def test_a_window_that_cannot_be_read_fails_each_check_reading_it_as_alone(runs, small_windows, monkeypatch):
    """Reading block 1's payload fails (found in review: before this, a damaged payload raised out of the
    one pass and the audit exited as unusable): every check that reads it fails, as alone, and the
    audit still gives its verdict."""
    from dpledger.decoding import trace as trace_files

    rows = trace_files.ReplayPayload.rows

    def damaged(self, start, stop):
        if self.path.name == "block-000001.npy":
            raise trace_files.TraceError("block-000001.npy: a planted unreadable payload")
        return rows(self, start, stop)

    monkeypatch.setattr(trace_files.ReplayPayload, "rows", damaged)
    report = audit_run(runs / "adapmixed", mc_samples=60, play_game=False, write=False)
    together = {check.name: check.to_dict() for check in report.checks}
    trace = load_trace(runs / "adapmixed")
    for check, alone in ALONE.items():   # alone, as audit_run ran each check before: through _guarded
        assert together[check] == _guarded(check, partial(alone, trace), trace).to_dict(), check
    # theorem_3_1 of a data-dependent run reads the recorded Eq. 3, not the windows
    reading = [check for check in ALONE if "a planted unreadable payload" in together[check]["detail"]]
    assert reading == [check for check in ALONE if check != "theorem_3_1"] and report.verdict == "FAIL"


def test_a_check_that_stops_reading_never_meets_a_later_windows_error(runs, small_windows, monkeypatch):
    """The replay stops reading after 50 mismatches; an error of a later window (even one no check
    turns into a FAIL) must not reach it (found in review: it replaced the mismatches, or ended the audit)."""
    def replayed(trace, records, logits, *args):
        if records[0]["step"] > 0:
            raise RuntimeError("a later window's planted error")
        return {"mismatches": [f"planted mismatch {i}" for i in range(51)], "count": 51, "worst": {"lambdas": 0.0},
                "certificate_steps": 0}

    monkeypatch.setattr(replay, "_replay_window", replayed)
    report = audit_run(runs / "adapmixed", mc_samples=60, play_game=False, write=False)
    check = report.check("replay")
    assert check.status.value == "FAIL" and check.detail.startswith("51 replay mismatches")
    assert check.to_dict() == replay.check_replay(load_trace(runs / "adapmixed")).to_dict()
