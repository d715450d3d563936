"""`dpledger account` on the command line."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from dpledger.cli import main


def run_json(capsys, *args):
    assert main(["account", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_pmixed_with_sample_rate_lists_every_variant(capsys):
    record = run_json(capsys, "pmixed", "--alpha", "6", "--beta", "0.01", "--teachers", "100", "--sample-rate", "0.03",
                      "--queries", "9728", "--delta", "1e-5", "--seed", "3")
    assert {"epsilon", "delta", "order", "method", "variants"} <= set(record)
    names = {v["name"] for v in record["variants"]}
    assert names == {"realised-size", "per-order-radius", "worst-case-size", "realised-size-general",
                     "worst-case-size-general", "all-orders-ball"}
    sound = next(v for v in record["variants"] if v["name"] == "all-orders-ball")
    assert "sound" in sound["soundness"] and 4.5 < sound["epsilon"] < 4.7
    realised = next(v for v in record["variants"] if v["name"] == "realised-size")
    assert 4.3 < realised["epsilon"] < 4.45
    assert record["epsilon"] == next(v["epsilon"] for v in record["variants"] if v["name"] == "worst-case-size-general")
    assert record["label"].startswith("worst-case-size-general: conditional on Theorem 3.1 (Flemings et al. 2024) "
                                      "for the paper's ball")


@pytest.mark.parametrize("sampled", [[], ["--sample-rate", "0.1"]])
@pytest.mark.parametrize("ball, basis", [("projection-order", "conditional on Theorem 3.1"), ("all-orders", "proven")])
def test_the_pmixed_headline_says_whether_it_is_proven_or_conditional(capsys, sampled, ball, basis):
    args = ["pmixed", "--alpha", "6", "--beta", "0.01", "--teachers", "16", "--queries", "100", "--delta", "1e-5",
            "--ball", ball, *sampled]
    assert basis in run_json(capsys, *args)["label"]
    assert main(["account", *args]) == 0
    headline, label = capsys.readouterr().out.splitlines()[:2]
    assert headline.startswith("pmixed: 100 queries -> epsilon = ") and basis in label


def test_gaussian_matches_dp_accounting(capsys):
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    record = run_json(capsys, "gaussian", "--noise-multiplier", "2.0", "--queries", "50", "--delta", "1e-6")
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(2.0), 50)
    assert record["epsilon"] == pytest.approx(accountant.get_epsilon(1e-6), rel=1e-9)


def test_subsampled_gaussian_matches_dp_accounting(capsys):
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    record = run_json(capsys, "subsampled-gaussian", "--noise-multiplier", "1.1", "--sample-rate", "0.01",
                      "--queries", "1000", "--delta", "1e-5")
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 1000)
    reference = accountant.get_epsilon(1e-5)
    # equal up to the 1e-6 margin on dp-accounting's fractional-order series, and never below it
    assert reference * (1 - 1e-12) <= record["epsilon"] <= reference * (1 + 2e-6)


@pytest.mark.parametrize("mechanism, flags", [
    ("screening", ["--teachers", "100", "--lam", "1e-4", "--sigma", "1e-2"]),
    ("gnmax", ["--sigma", "40"]),
    ("confident-gnmax", ["--sigma", "40", "--sigma-threshold", "150"]),
    ("pmixed", ["--alpha", "18", "--beta", "0.2", "--teachers", "100"]),
])
def test_other_mechanisms_print_the_documented_fields(capsys, mechanism, flags):
    record = run_json(capsys, mechanism, *flags, "--queries", "100", "--delta", "1e-5")
    assert record["epsilon"] > 0 and record["method"] == "improved" and record["order"] > 1


def test_bad_parameters_exit_2_with_the_constraint(capsys):
    assert main(["account", "pmixed", "--alpha", "1", "--beta", "0.1", "--teachers", "3", "--queries", "5",
                 "--delta", "1e-5"]) == 2
    assert "must be > 1, got 1" in capsys.readouterr().err
    assert main(["account", "gnmax", "--queries", "5", "--delta", "1e-5"]) == 2
    assert "needs --sigma" in capsys.readouterr().err
    assert main(["account", "gaussian", "--noise-multiplier", "1", "--queries", "5", "--delta", "1.5"]) == 2
    assert "delta must be in (0, 1), got 1.5" in capsys.readouterr().err


def test_console_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "dpledger", "account", "screening", "--teachers", "100", "--lam",
                             "1e-4", "--sigma", "1e-2", "--queries", "9728", "--delta", "1e-5"],
                            capture_output=True, text=True, check=True)
    assert "screening: 9728 queries -> epsilon" in result.stdout


# ---- Hot PATE's aggregators (Cohen et al. 2023) ----

def strict_loads(text):
    """json.loads that refuses NaN / Infinity (strict JSON)."""
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


def run_strict_json(capsys, *args):
    assert main(["account", *args, "--json"]) == 0
    return strict_loads(capsys.readouterr().out)


def gaussian_reference(events, delta):
    """dp-accounting's RDP epsilon of the composition of (noise multiplier, count) Gaussian events."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant()
    for noise_multiplier, count in events:
        if count:
            accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier), count)
    return accountant.get_epsilon(delta)


DPARGMAX = ["dpargmax", "--sigma", "40", "--sigma-threshold", "150", "--threshold", "300", "--queries", "200",
            "--delta", "1e-6"]


def test_dpargmax_released_output_matches_dp_accounting(capsys):
    # screen alpha/(2 s1^2) = Gaussian with multiplier s1; GNMax alpha/s2^2 = multiplier s2/sqrt(2)
    record = run_strict_json(capsys, *DPARGMAX)
    reference = gaussian_reference([(150.0, 200), (40.0 / math.sqrt(2.0), 200)], 1e-6)
    assert record["epsilon"] == pytest.approx(reference, rel=1e-9)
    assert record["accounting"] == "released-output" and record["dp_guarantee"] is True
    assert record["charged"] == {"screen_queries": 200, "gnmax_queries": 200}
    assert record["threshold"] == 300 and "label" not in record


def test_dpargmax_released_output_is_the_default_and_equals_confident_gnmax(capsys):
    explicit = run_strict_json(capsys, *DPARGMAX, "--accounting", "released-output")
    default = run_strict_json(capsys, *DPARGMAX)
    confident = run_json(capsys, "confident-gnmax", "--sigma", "40", "--sigma-threshold", "150", "--queries", "200",
                         "--delta", "1e-6")
    assert explicit["epsilon"] == default["epsilon"] == confident["epsilon"]


@pytest.mark.parametrize("answered", [0, 37, 200])
def test_dpargmax_realised_path_charges_gnmax_on_answered_queries_only(capsys, answered):
    record = run_strict_json(capsys, *DPARGMAX, "--accounting", "realised-path", "--answered", str(answered))
    reference = gaussian_reference([(150.0, 200), (40.0 / math.sqrt(2.0), answered)], 1e-6)
    assert record["epsilon"] == pytest.approx(reference, rel=1e-9)
    assert record["charged"] == {"screen_queries": 200, "gnmax_queries": answered}
    assert record["dp_guarantee"] is False and record["data_dependent"] is True and record["answered"] == answered
    assert record["label"] == (f"realised-path: an ex-post statement about one run with {answered} answered "
                               "queries, not an RDP guarantee of the mechanism")


def test_dpargmax_realised_path_is_labelled_in_the_printed_result(capsys):
    assert main(["account", *DPARGMAX, "--accounting", "realised-path", "--answered", "37"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("dpargmax: 200 queries -> epsilon = ")
    assert ("realised-path: an ex-post statement about one run with 37 answered queries, not an RDP guarantee "
            "of the mechanism") in out
    realised = float(out.split("epsilon = ")[1].split()[0])
    assert main(["account", *DPARGMAX]) == 0
    released = float(capsys.readouterr().out.split("epsilon = ")[1].split()[0])
    assert realised < released


@pytest.mark.parametrize("extra, message", [
    (["--accounting", "realised-path", "--answered", "201"], "--answered must be in [0, --queries = 200], got 201"),
    (["--accounting", "realised-path", "--answered", "-1"], "--answered must be in [0, --queries = 200], got -1"),
    (["--accounting", "realised-path"], "mechanism dpargmax with --accounting realised-path needs --answered"),
    (["--answered", "3"], "--answered applies only with --accounting realised-path"),
])
def test_dpargmax_bad_answered_exits_2_with_one_line(capsys, extra, message):
    assert main(["account", *DPARGMAX, *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and message in lines[0]


@pytest.mark.parametrize("argv, flag", [
    (["dpargmax", "--sigma", "40", "--queries", "5", "--delta", "1e-5"], "--sigma-threshold"),
    (["dpargmax", "--sigma-threshold", "40", "--queries", "5", "--delta", "1e-5"], "--sigma"),
    (["dpws", "--sigma", "4", "--queries", "5", "--delta", "1e-5"], "--threshold"),
    (["dpws", "--threshold", "4", "--queries", "5", "--delta", "1e-5"], "--sigma"),
    (["dpws", "--sigma", "4", "--threshold", "4", "--delta", "1e-5"], "--queries"),
    (["dpargmax", "--sigma", "4", "--sigma-threshold", "4", "--queries", "5"], "--delta"),
    (["targmax"], "--threshold"),
    (["tws", "--gamma", "2"], "--threshold"),
    (["gnmax", "--sigma", "40", "--queries", "5", "--delta", "1e-5", "--accounting", "realised-path",
      "--answered", "1"], "mechanism gnmax does not use --accounting, --answered"),
    (["gaussian", "--noise-multiplier", "1", "--queries", "5", "--delta", "1e-5", "--sample-rate", "0.1"],
     "mechanism gaussian does not use --sample-rate"),
    (["pmixed", "--queries", "5"], "mechanism pmixed needs --delta, --alpha, --beta, --teachers"),
])
def test_hot_pate_missing_flags_are_refused_by_name(capsys, argv, flag):
    assert main(["account", *argv]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and flag in lines[0]


def test_dpws_matches_dp_accounting(capsys):
    # N(0, sigma^2) on counts with L2 sensitivity sqrt(2): the Gaussian with multiplier sigma / sqrt(2)
    record = run_strict_json(capsys, "dpws", "--sigma", "20", "--threshold", "30", "--gamma", "1.5", "--queries", "100",
                             "--delta", "1e-5")
    assert record["epsilon"] == pytest.approx(gaussian_reference([(20.0 / math.sqrt(2.0), 100)], 1e-5), rel=1e-9)
    assert record["dp_guarantee"] is True and record["gamma"] == 1.5 and record["threshold"] == 30
    default_gamma = run_strict_json(capsys, "dpws", "--sigma", "20", "--threshold", "30", "--queries", "100",
                                    "--delta", "1e-5")
    assert default_gamma["gamma"] == 1.0 and default_gamma["epsilon"] == record["epsilon"]


NO_DP = ("no DP guarantee: {} releases only tokens with at least T votes (T-threshold privacy, a robustness "
         "notion; Cohen et al. 2023)")


@pytest.mark.parametrize("mechanism, flags, name", [
    ("targmax", ["--threshold", "50"], "TARGMAX_T"),
    ("tws", ["--threshold", "50", "--gamma", "2"], "TWS_{T,gamma}"),
    ("targmax", ["--threshold", "50", "--queries", "100"], "TARGMAX_T"),
])
def test_threshold_private_aggregators_state_no_dp_and_print_no_epsilon(capsys, mechanism, flags, name):
    assert main(["account", mechanism, *flags]) == 0
    out = capsys.readouterr().out
    assert NO_DP.format(name) in out
    assert "epsilon" not in out.lower() and "inf" not in out.split()
    record = run_strict_json(capsys, mechanism, *flags)
    assert record["dp_guarantee"] is False and record["epsilon"] is None
    assert record["guarantee"].startswith("T-threshold privacy") and record["statement"] == NO_DP.format(name)
    assert record["threshold"] == 50


@pytest.mark.parametrize("mechanism", ["targmax", "tws"])
@pytest.mark.parametrize("delta", ["nan", "-1", "1e400", "1e-5"])
def test_threshold_private_aggregators_refuse_a_delta(capsys, mechanism, delta):
    # T-threshold privacy has no delta: a given one was accepted and dropped (nan and -1 included)
    assert main(["account", mechanism, "--threshold", "5", "--delta", delta]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1
    assert f"mechanism {mechanism} does not use --delta; it reads --threshold, --queries" in lines[0]


def test_threshold_private_aggregators_validate_their_parameters(capsys):
    assert main(["account", "targmax", "--threshold", "2.5"]) == 2
    assert "threshold must be an integer >= 1, got 2.5" in capsys.readouterr().err
    assert main(["account", "tws", "--threshold", "5", "--gamma", "0.5"]) == 2
    assert "gamma must be >= 1, got 0.5" in capsys.readouterr().err


def test_hot_pate_json_is_strict_and_maps_inf_to_null(capsys):
    # a vanishing noise scale: RDP +inf at every order, epsilon +inf -> null with a note
    with np.errstate(divide="ignore", over="ignore"):
        assert main(["account", "dpws", "--sigma", "1e-200", "--threshold", "3", "--queries", "10", "--delta", "1e-5",
                     "--json"]) == 0
    text = capsys.readouterr().out
    record = strict_loads(text)
    assert "Infinity" not in text and "NaN" not in text
    assert record["epsilon"] is None and record["dp_guarantee"] is False
    assert record["nulls"]["/epsilon"].startswith("+inf: no guarantee")
    for argv in (DPARGMAX, [*DPARGMAX, "--accounting", "realised-path", "--answered", "5"],
                 ["targmax", "--threshold", "3"], ["tws", "--threshold", "3"]):
        assert main(["account", *argv, "--json"]) == 0
        assert isinstance(strict_loads(capsys.readouterr().out), dict)


# ---- one subcommand per mechanism ----

from dpledger.account_cli import MECHANISMS, accepted_flags  # noqa: E402
from dpledger.cli import build_parser  # noqa: E402


def subcommand_parser(mechanism):
    """The parser of `dpledger account MECHANISM`."""
    import argparse

    def subcommands(parser):
        return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices
    return subcommands(subcommands(build_parser())["account"])[mechanism]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_each_subcommand_lists_only_its_own_flags_each_with_help(mechanism):
    parser = subcommand_parser(mechanism)
    options = {action.option_strings[-1]: action for action in parser._actions if action.option_strings}
    options.pop("--help")
    assert set(options) == set(accepted_flags(mechanism))
    for flag, action in options.items():
        assert action.help and len(action.help) > 10, f"{mechanism} {flag} has no help"
        if action.default not in (None, False):
            assert "default" in action.help, f"{mechanism} {flag}: the default {action.default} is not in its help"


@pytest.mark.parametrize("argv, flags", [
    (["gaussian", "--noise-multiplier", "1", "--queries", "5", "--delta", "1e-5", "--sample-rate", "0.1",
      "--teachers", "4"], "--sample-rate, --teachers"),
    (["targmax", "--threshold", "3", "--method", "classic"], "--method"),
    (["pmixed", "--alpha", "6", "--beta", "0.1", "--teachers", "4", "--queries", "5", "--delta", "1e-5",
      "--sigma=3"], "--sigma"),
])
def test_a_flag_the_mechanism_does_not_read_is_refused_on_one_line_with_what_it_reads(capsys, argv, flags):
    assert main(["account", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1
    assert f"mechanism {argv[0]} does not use {flags}; it reads " in lines[0]
    assert ", ".join(accepted_flags(argv[0])) in lines[0]


@pytest.mark.parametrize("argv, message", [
    (["gaussian", "--noise-multiplier", "many", "--queries", "5", "--delta", "1e-5"],
     "argument --noise-multiplier: invalid float value: 'many'"),
    (["gaussian", "--noise-multiplier", "1", "--queries", "5.5", "--delta", "1e-5"],
     "argument --queries: invalid int value: '5.5'"),
    (["gaussian", "--noise-multiplier", "1", "--queries", "5", "--delta", "1e-5", "--orders", "2,0.5"],
     "argument --orders: every order must be a number in (1, 1e+06] (a larger one lowers epsilon by less than 7.3e-4 "
     "more), got 0.5"),
    (["gaussian", "--noise-multiplier", "1", "--queries", "5", "--delta", "1e-5", "--orders", "2,1e308"],
     "argument --orders: every order must be a number in (1, 1e+06]"),
    (["laplace"], "argument MECHANISM: invalid choice: 'laplace'"),
])
def test_argument_type_errors_are_one_line_with_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["account", *argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and message in lines[0] and "--help" in lines[0]


def test_orders_extend_the_grid_past_its_edge(capsys):
    argv = ["gaussian", "--noise-multiplier", "1000", "--queries", "1", "--delta", "1e-5"]
    at_edge = run_strict_json(capsys, *argv)
    assert at_edge["order"] == 1024 and at_edge["at_grid_edge"] and "--orders" in at_edge["warnings"][0]
    extended = run_strict_json(capsys, *argv, "--orders", "2048,4096,8192,16384,32768")
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    reference = RdpAccountant(orders=[2048, 4096, 8192, 16384, 32768])
    reference.compose(dp_accounting.GaussianDpEvent(1000.0))
    assert extended["epsilon"] < at_edge["epsilon"] and not extended["at_grid_edge"]
    assert extended["epsilon"] == pytest.approx(reference.get_epsilon(1e-5), rel=1e-9)


@pytest.mark.parametrize("argv", [
    ["subsampled-gaussian", "--noise-multiplier", "1e-200", "--sample-rate", "0.5"],
    ["gnmax", "--sigma", "1e-200"],
    ["screening", "--teachers", "2", "--lam", "1", "--sigma", "1e-200"],
    ["gaussian", "--noise-multiplier", "1e-200"],
])
def test_every_mechanism_json_is_strict_with_a_reason_for_each_null(capsys, argv):
    with np.errstate(all="ignore"):
        record = run_strict_json(capsys, *argv, "--queries", "3", "--delta", "1e-5")
    assert record["epsilon"] is None and record["nulls"]["/epsilon"].startswith("+inf: no guarantee")


@pytest.mark.parametrize("argv, message", [
    (["audit", "run", "--trials", "many"], "dpledger audit: error: argument --trials: invalid int value: 'many'"),
    (["report", "run", "--format", "pdf"], "dpledger report: error: argument --format: invalid choice: 'pdf'"),
    (["decode"], "dpledger decode: error: the following arguments are required"),
    (["audit", "run", "--frobnicate"], "dpledger audit: error: unrecognized arguments: --frobnicate"),
    (["unknown-command"], "dpledger: error: argument command: invalid choice: 'unknown-command'"),
])
def test_usage_errors_of_every_command_are_one_line_with_exit_2(capsys, argv, message):
    try:
        status = main(argv)
    except SystemExit as exit_info:
        status = exit_info.code
    assert status == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), lines


# ---- PLD beside RDP, DpEvent files (dp-accounting interop) ----

def test_pld_epsilon_beside_rdp_the_issues_check_number(capsys):
    record = run_strict_json(capsys, "gaussian", "--noise-multiplier", "10", "--queries", "100", "--delta", "1e-5")
    assert record["epsilon"] == pytest.approx(4.7285, abs=5e-4)
    assert record["pld_epsilon"] == pytest.approx(4.3772, abs=5e-4) and record["tighter"] == "pld"
    assert record["pld"]["value_discretization_interval"] == 1e-4


def test_pmixed_and_realised_path_say_why_there_is_no_pld(capsys):
    record = run_strict_json(capsys, "pmixed", "--alpha", "6", "--beta", "0.01", "--teachers", "4", "--queries", "5",
                             "--delta", "1e-5")
    assert record["pld_epsilon"] is None and record["tighter"] == "rdp" and "RDP only" in record["pld_unavailable"]
    record = run_strict_json(capsys, "dpargmax", "--sigma", "3", "--sigma-threshold", "3", "--queries", "5",
                             "--delta", "1e-5", "--accounting", "realised-path", "--answered", "2")
    assert record["pld_epsilon"] is None and "RDP only" in record["pld_unavailable"]


@pytest.mark.parametrize("argv", [
    ["gaussian", "--noise-multiplier", "3"],
    ["subsampled-gaussian", "--noise-multiplier", "1.1", "--sample-rate", "0.05"],
    ["screening", "--teachers", "8", "--lam", "0.3", "--sigma", "0.5"],
    ["gnmax", "--sigma", "6"],
    ["dpargmax", "--sigma", "6", "--sigma-threshold", "4"],
    ["dpws", "--sigma", "6", "--threshold", "2"],
])
def test_dp_event_out_then_from_event_gives_the_same_epsilons(capsys, tmp_path, argv):
    path = tmp_path / "event.json"
    record = run_strict_json(capsys, *argv, "--queries", "20", "--delta", "1e-6", "--dp-event-out", str(path))
    assert record["dp_event_out"] == str(path)
    assert main(["account", "from-event", str(path), "--delta", "1e-6", "--json"]) == 0
    again = strict_loads(capsys.readouterr().out)
    assert again["epsilon"] == pytest.approx(record["epsilon"], rel=1e-12)
    assert again["pld_epsilon"] == pytest.approx(record["pld_epsilon"], rel=1e-9)
    assert again["relation"] == record["relation"] and again["tighter"] == record["tighter"]


def test_from_event_reads_a_bare_dp_accounting_event(capsys, tmp_path):
    import dp_accounting

    from dpledger.mechanisms import dp_event_to_json

    path = tmp_path / "bare.json"
    path.write_text(dp_event_to_json(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(10.0), 100)))
    assert main(["account", "from-event", str(path), "--delta", "1e-5"]) == 0
    out = capsys.readouterr().out
    assert "epsilon = 4.72851" in out and "epsilon = 4.37718; tighter: pld" in out


@pytest.mark.parametrize("payload, message", [
    ('{"class_name": "LaplaceDpEvent", "noise_multiplier": 1.0}', "no dpledger mechanism for LaplaceDpEvent"),
    ('{"class_name": "os.system"}', "must name a DpEvent class"),
    ("not json", "not JSON"),
])
def test_from_event_refuses_what_it_cannot_account_on_one_line(capsys, tmp_path, payload, message):
    path = tmp_path / "event.json"
    path.write_text(payload)
    assert main(["account", "from-event", str(path), "--delta", "1e-5"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_from_event_lists_only_its_own_flags_each_with_help():
    from dpledger.account_cli import FROM_EVENT

    parser = subcommand_parser(FROM_EVENT)
    options = {action.option_strings[-1]: action for action in parser._actions if action.option_strings}
    options.pop("--help")
    assert set(options) == set(accepted_flags(FROM_EVENT))
    assert all(action.help and len(action.help) > 10 for action in options.values())


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a warning would be a second line on stderr
@pytest.mark.parametrize("argv, message", [
    (["gaussian", "--noise-multiplier", "1", "--queries", "99999999999999999999999", "--delta", "1e-5"],
     "--queries must be in [1, 2^53 = 9007199254740992] (a larger count is not exact in double precision and could "
     "be rounded down), got 99999999999999999999999"),
    (["targmax", "--threshold", "5", "--queries", "0"], "--queries must be in [1, 2^53 = 9007199254740992]"),
    (["pmixed", "--alpha", "6", "--beta", "0.01", "--teachers", "1000000", "--queries", "1000", "--delta", "1e-5",
      "--sample-rate", "0.5"], "--teachers must be at most 4096 with Poisson subsampling of teachers"),
    (["pmixed", "--alpha", "6", "--beta", "0.01", "--teachers", "99999999999999999999999", "--queries", "1000",
      "--delta", "1e-5", "--sample-rate", "0.5"], "--teachers must be at most 4096"),
    (["pmixed", "--alpha", "6", "--beta", "0.01", "--teachers", "100", "--queries", "100000000", "--delta", "1e-5",
      "--sample-rate", "0.5"], "--queries must be at most 10,000,000 for the realised-size variants"),
])
def test_counts_beyond_what_the_accounting_evaluates_are_refused_in_one_line_within_seconds(capsys, argv, message):
    import time

    started = time.monotonic()
    assert main(["account", *argv]) == 2
    assert time.monotonic() - started < 10
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and message in lines[0], lines


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a warning would be a second line on stderr
def test_the_pld_beside_rdp_is_skipped_with_a_reason_where_it_would_take_minutes(capsys):
    import time

    # 10^9 Poisson-subsampled steps: dp-accounting's PLD ran 93 s and more; 1,000 are computed
    started = time.monotonic()
    record = run_json(capsys, "subsampled-gaussian", "--noise-multiplier", "1", "--sample-rate", "0.01",
                      "--queries", "1000000000", "--delta", "1e-5")
    assert time.monotonic() - started < 10
    assert record["pld_epsilon"] is None and "1000000000 Poisson-subsampled steps are more than the 1,000,000" in \
        record["pld_unavailable"]
    assert record["epsilon"] > 0
    few = run_json(capsys, "subsampled-gaussian", "--noise-multiplier", "1", "--sample-rate", "0.01", "--queries",
                   "1000", "--delta", "1e-5")
    assert few["pld_epsilon"] is not None and few["pld_epsilon"] < few["epsilon"]
    # a noise whose inverse square overflows was quoted as "the composed noise multiplier 0"
    tiny = run_json(capsys, "gaussian", "--noise-multiplier", "1e-308", "--queries", "1000", "--delta", "1e-5")
    assert tiny["epsilon"] is None and "composed noise multiplier (below 1e-154" in tiny["pld_unavailable"]


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a warning would be a second line on stderr
def test_an_order_past_the_double_range_of_the_grid_is_accounted_not_misquoted(capsys):
    # alpha = 1e308 was refused as "got inf" (the grid's rounding overflowed); the ball's bound is +inf there
    record = run_json(capsys, "pmixed", "--alpha", "1e308", "--beta", "0.01", "--teachers", "100", "--queries", "10",
                      "--delta", "1e-5")
    assert record["epsilon"] == math.inf or record["epsilon"] is None


# ---- a mechanism registered by its class is a subcommand ----

def test_a_registered_mechanism_is_an_account_subcommand_with_its_flags(capsys, monkeypatch):
    """A class that declares its name, summary and one parameter (dpledger.mechanisms.accountable) and is
    registered becomes `dpledger account NAME`, its parameter a required flag with the declared help; without
    a DpEvent it is accounted by RDP only and refuses --dp-event-out."""
    from dataclasses import dataclass
    from typing import ClassVar

    from dpledger.accounting.errors import require_positive
    from dpledger.mechanisms import accountable
    from dpledger.mechanisms.registry import accountable_mechanisms

    @dataclass(frozen=True)
    class TwiceGaussian(accountable.AccountableMechanism):
        name: ClassVar[str] = "twice-gaussian-test"
        summary: ClassVar[str] = "two Gaussian releases of one query (a test's mechanism)"

        scale: float = accountable.mechanism_parameter(metavar="S", unit="unitless",
                                                       help="noise multiplier of each Gaussian (unitless, > 0)")

        def __post_init__(self):
            require_positive("scale", self.scale)

        def rdp_values(self, orders):
            return orders / self.scale ** 2

    monkeypatch.setitem(accountable._REGISTERED, TwiceGaussian.name, TwiceGaussian)  # removed after the test
    assert accountable.register_mechanism(TwiceGaussian) is TwiceGaussian
    assert list(accountable_mechanisms())[-1] == TwiceGaussian.name

    parser = subcommand_parser(TwiceGaussian.name)
    assert parser.description == TwiceGaussian.summary + "."
    options = {action.option_strings[-1]: action for action in parser._actions if action.option_strings}
    assert options["--scale"].metavar == "S" and options["--scale"].help.startswith("noise multiplier of each")
    assert set(options) - {"--help"} == set(accepted_flags(TwiceGaussian.name))
    assert "--dp-event-out" not in options

    argv = ["account", TwiceGaussian.name, "--queries", "10", "--delta", "1e-5"]
    assert main(argv) == 2
    assert "needs --scale" in capsys.readouterr().err
    assert main([*argv, "--scale", "0"]) == 2  # the class validates its own parameters
    assert "scale must be > 0, got 0" in capsys.readouterr().err
    assert main([*argv, "--scale", "4", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    twice = main(["account", "gaussian", "--queries", "20", "--delta", "1e-5", "--noise-multiplier", "4", "--json"])
    assert twice == 0
    gaussian = json.loads(capsys.readouterr().out)
    assert record["mechanism"] == TwiceGaussian.name and record["epsilon"] == pytest.approx(gaussian["epsilon"])
    assert record["pld_epsilon"] is None and "no DpEvent" in record["pld_unavailable"]


def test_register_mechanism_refuses_a_class_without_its_own_name_or_a_taken_name():
    from dataclasses import dataclass

    from dpledger.mechanisms import accountable
    from dpledger.mechanisms.gaussian import GaussianMechanism

    @dataclass(frozen=True)
    class Nameless(accountable.AccountableMechanism):
        def rdp_values(self, orders):
            return orders

    with pytest.raises(ValueError, match="must declare its own name"):
        accountable.register_mechanism(Nameless)

    @dataclass(frozen=True)
    class Impostor(GaussianMechanism):
        name = "gaussian"
        summary = "not the Gaussian mechanism"

    with pytest.raises(ValueError, match="already registered"):
        accountable.register_mechanism(Impostor)
