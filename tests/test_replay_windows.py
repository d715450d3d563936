"""The audit's replay in windows shorter than the decode's blocks (one step per window at GPT-2 scale,
audit/loader.py `window_rows`): every step recomputes the bits it recorded, the add-one bound's sub-grid
included (records version 9 refines it row by row); a trace of versions 4 to 8, whose blocks shared the
sub-grid, is compared within the sub-grid's certificate there, and a value off by more still fails."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import dpledger.audit.replay as replay
import dpledger.mechanisms.add_one as add_one
from dpledger.audit.loader import load_trace
from dpledger.audit.replay import check_replay
from dpledger.decoding import trace as trace_files
from tests import synthetic
from tests.micro import PAPER_ADAPMIXED

VOCAB = add_one.ADD_ONE_SUBGRID_MIN_VOCABULARY   # the smallest vocabulary the sub-grid runs at
STEPS = 4
SPREADS = (0.1, 1.0, 3.0, 0.3)
"""How far each step's teachers sit from the public model: the steps' sub-grids refine differently."""


def _replayed_in_one_step_windows(run):
    loaded = load_trace(run)
    loaded._window_rows = 1
    return loaded, check_replay(loaded)


def _written_as_version(monkeypatch, version: int) -> None:
    monkeypatch.setattr(trace_files, "RECORDS_VERSION", version)
    monkeypatch.setattr(synthetic, "build_runner", functools.partial(synthetic.build_runner, records_version=version))


def test_a_block_replays_step_by_step_bit_for_bit(tmp_path):
    run = synthetic.write_synthetic_run(tmp_path / "run", 4, VOCAB, STEPS, STEPS, PAPER_ADAPMIXED, payload=True,
                                        step_spreads=SPREADS)
    loaded, result = _replayed_in_one_step_windows(run)
    assert loaded.manifest["records_version"] == trace_files.RECORDS_VERSION >= 9
    assert result.status.value == "PASS", result.detail
    assert result.evidence["add_one_within_certificate_steps"] == 0


def test_a_version_9_trace_replays_bit_for_bit_under_version_10s_code(tmp_path, monkeypatch):
    """A trace written before records version 10 (the add-one rounds and the screen statistic in numpy and
    torch) replays step by step with the arithmetic that wrote it: every step exact, none within the
    certificate."""
    from dpledger.mechanisms.screening import NoisyScreening

    _written_as_version(monkeypatch, 9)
    run = synthetic.write_synthetic_run(tmp_path / "run", 4, VOCAB, STEPS, STEPS, PAPER_ADAPMIXED, payload=True,
                                        step_spreads=SPREADS)
    monkeypatch.undo()
    # version 10's arithmetic would replay these steps within the replay's 1e-9 as well, so the versions the
    # replay asks for are what shows it follows the trace's
    versions: dict[str, set] = {"add_one": set(), "screen": set()}
    add_one_bounds, statistics = add_one.add_one_divergence_bounds, NoisyScreening.statistics

    def add_one_spy(*args, **kwargs):
        versions["add_one"].add(kwargs["version"])
        return add_one_bounds(*args, **kwargs)

    def screen_spy(self, *args, **kwargs):
        versions["screen"].add(args[3] if len(args) > 3 else kwargs["version"])
        return statistics(self, *args, **kwargs)

    monkeypatch.setattr(add_one, "add_one_divergence_bounds", add_one_spy)
    monkeypatch.setattr(NoisyScreening, "statistics", screen_spy)
    loaded, result = _replayed_in_one_step_windows(run)
    assert loaded.manifest["records_version"] == 9 < trace_files.RECORDS_VERSION
    assert result.status.value == "PASS", result.detail
    assert result.evidence["add_one_within_certificate_steps"] == 0
    assert versions == {"add_one": {9}, "screen": {9}}


def test_a_version_8_block_replays_within_the_subgrid_certificate(tmp_path, monkeypatch):
    _written_as_version(monkeypatch, 8)
    run = synthetic.write_synthetic_run(tmp_path / "run", 4, VOCAB, STEPS, STEPS, PAPER_ADAPMIXED, payload=True,
                                        step_spreads=SPREADS)
    monkeypatch.undo()
    loaded, result = _replayed_in_one_step_windows(run)
    assert loaded.manifest["records_version"] == 8
    assert result.status.value == "PASS", result.detail
    assert result.evidence["add_one_within_certificate_steps"] == STEPS
    assert "certificate" in result.detail
    # the certificate does work here: compared bit for bit, the steps' add-one values differ
    monkeypatch.setattr(replay, "_ADD_ONE_CERTIFICATE", 0.0)
    assert _replayed_in_one_step_windows(run)[1].status.value == "FAIL"
    monkeypatch.undo()
    # the same trace replayed in one window per block reproduces every bit, so no step needs the certificate
    whole = load_trace(run)
    whole._window_rows = STEPS
    assert check_replay(whole).evidence["add_one_within_certificate_steps"] == 0


@pytest.mark.parametrize("factor", [1.0 + 2 * add_one.ADD_ONE_RELATIVE_TOLERANCE, 1.0 - 2 * add_one.ADD_ONE_RELATIVE_TOLERANCE])
def test_a_version_8_add_one_bound_off_by_more_than_the_certificate_fails(tmp_path, monkeypatch, factor):
    _written_as_version(monkeypatch, 8)
    honest = add_one.add_one_divergence_bounds
    monkeypatch.setattr(add_one, "add_one_divergence_bounds", lambda *a, **k: honest(*a, **k) * factor)
    run = synthetic.write_synthetic_run(tmp_path / "run", 4, VOCAB, STEPS, STEPS, PAPER_ADAPMIXED, payload=True,
                                        step_spreads=SPREADS)
    monkeypatch.undo()
    _, result = _replayed_in_one_step_windows(run)
    assert result.status.value == "FAIL"
    assert any("add_one_bound differs" in m for m in result.evidence["mismatches"])
    assert result.evidence["add_one_within_certificate_steps"] == STEPS


def test_the_replay_compares_eq3_within_the_allowance_the_step_itself_derived(tmp_path):
    """The replayed step hands the replay its Eq. 3 rounding allowance (from its own ratios' magnitude,
    so the replay does not form the N x V ratios a second time): the same numbers as deriving it anew."""
    import torch

    from dpledger.decoding.blocks import replay_steps
    from dpledger.decoding.ensemble import Ensemble
    from dpledger.mechanisms.leave_one_out import leave_one_out_allowance
    from dpledger.mechanisms.step import as_ensemble

    run = synthetic.write_synthetic_run(tmp_path / "run", 5, 300, 3, 3, PAPER_ADAPMIXED, payload=True,
                                        step_spreads=SPREADS)
    loaded = load_trace(run)
    _, records, logits = next(iter(loaded.iter_payload()))
    outcome, _ = replay_steps(loaded.runner(), logits, loaded.manifest["config"]["seed"], 0, loaded.orders, False)
    public, teachers = Ensemble.split_distributions(logits)
    teachers, public = as_ensemble(teachers, public, loaded.n_teachers)
    derived = leave_one_out_allowance(teachers, public, torch.as_tensor(outcome.lambdas, dtype=torch.float64),
                                      loaded.orders, outcome.eq3_remove_one)
    assert outcome.eq3_allowance is not None and np.array_equal(outcome.eq3_allowance, derived)
    assert check_replay(loaded).status.value == "PASS"


def test_a_version_8_remove_one_run_is_compared_without_the_certificate(tmp_path, monkeypatch):
    """A remove-one run records no add-one bound: its Eq. 3 losses replay exactly, never within the
    add-one certificate (a review found the certificate applied to them)."""
    _written_as_version(monkeypatch, 8)
    run = synthetic.write_synthetic_run(tmp_path / "run", 4, VOCAB, STEPS, STEPS, PAPER_ADAPMIXED, payload=True,
                                        relation="remove_one", step_spreads=SPREADS)
    monkeypatch.undo()
    _, result = _replayed_in_one_step_windows(run)
    assert result.status.value == "PASS", result.detail
    assert result.evidence["add_one_within_certificate_steps"] == 0


def test_where_eq3_is_the_larger_part_the_version_8_loss_gets_no_certificate(tmp_path, monkeypatch):
    """In an add-or-remove-one run the charged loss is the larger of Eq. 3 and the add-one bound: at
    the orders where Eq. 3 is clearly the larger, a charge 0.4% low fails the replay though it is
    within the add-one certificate (two teachers: removing one moves the output more than adding one)."""
    _written_as_version(monkeypatch, 8)
    run = synthetic.write_synthetic_run(tmp_path / "run", 2, VOCAB, STEPS, STEPS, PAPER_ADAPMIXED, payload=True,
                                        step_spreads=SPREADS)
    monkeypatch.undo()
    honest_window = replay._replay_window
    lowered = []

    def lowered_where_eq3_binds(trace, records, *args):
        forged = []
        for record in records:
            eq3, added = np.asarray(record["eq3_remove_one"]), np.asarray(record["add_one_bound"])
            binds = eq3 > 1.02 * added
            lowered.append(int(binds.sum()))
            forged.append({**record, **{key: np.where(binds, 0.996, 1.0) * np.asarray(record[key])
                                        for key in ("rdp_pmixed_data_dependent", "observed_data_dependent")}})
        return honest_window(trace, forged, *args)

    monkeypatch.setattr(replay, "_replay_window", lowered_where_eq3_binds)
    _, result = _replayed_in_one_step_windows(run)
    assert sum(lowered) > 0, "no order where Eq. 3 binds: the test would prove nothing"
    assert result.status.value == "FAIL"
    assert any("pmixed_data_dependent differs" in m for m in result.evidence["mismatches"])
