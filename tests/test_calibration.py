"""Calibration (mechanisms/calibration.py, `dpledger calibrate`): every answer accounts forward to
at most the target epsilon and within 1% of it, re-checked here with dpledger's own accounting."""
import json
import math
import warnings

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dpledger.accounting.conversion import GridEdgeWarning, epsilon_from_rdp
from dpledger.accounting.orders import DEFAULT_ORDERS, default_orders
from dpledger.cli import main
from dpledger.mechanisms import (CALIBRATION_TOLERANCE, calibrate_confident_gnmax, calibrate_dpws, calibrate_gaussian,
                        calibrate_gnmax, calibrate_pmixed, calibrate_screening, calibrate_subsampled_gaussian,
                        compare_rdp_pld, subsampled_pmixed_curve)
from tests.conftest import examples

targets = dict(epsilon=st.floats(0.2, 30.0), delta=st.floats(1e-10, 1e-2), queries=st.integers(1, 100_000))
CALIBRATIONS = examples(25, 250)
"""The generated calibrations: 25 targets each in the default run, 250 in the slow run (tests/conftest.py)."""


def rdp_epsilon(mechanism, queries, delta, orders=DEFAULT_ORDERS):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)
        return epsilon_from_rdp(mechanism.rdp_curve(orders).composed(queries), delta).epsilon


def assert_at_most_and_within(result, forward):
    assert forward <= result.target_epsilon
    assert forward >= (1.0 - CALIBRATION_TOLERANCE) * result.target_epsilon
    assert result.forward_epsilon == pytest.approx(forward, rel=1e-12)
    assert result.slack >= 0


def reachable(call):
    """The calibration, or None when it says the target is out of reach (checked separately)."""
    try:
        return call()
    except ValueError as error:
        assert "out of reach" in str(error)
        return None


@CALIBRATIONS
@given(**targets, kind=st.sampled_from(["gaussian", "gnmax", "dpws", "confident", "screening"]),
       ratio=st.floats(0.25, 4.0), teachers=st.integers(1, 2048), lam=st.floats(1e-3, 1.0))
def test_noise_calibration_accounts_to_at_most_the_target_and_within_one_percent(epsilon, delta, queries, kind, ratio,
                                                                                teachers, lam):
    call = {"gaussian": lambda epsilon=epsilon: calibrate_gaussian(epsilon, delta, queries),
            "gnmax": lambda: calibrate_gnmax(epsilon, delta, queries),
            "dpws": lambda: calibrate_dpws(epsilon, delta, queries, threshold=3.0),
            "confident": lambda: calibrate_confident_gnmax(epsilon, delta, queries, ratio=ratio),
            "screening": lambda epsilon=epsilon: calibrate_screening(epsilon, delta, queries, teachers, lam)}[kind]
    result = reachable(call)
    assume(result is not None)
    assert_at_most_and_within(result, rdp_epsilon(result.mechanism, queries, delta))
    if kind == "confident":
        assert result.mechanism.sigma_threshold == pytest.approx(ratio * result.mechanism.sigma, rel=1e-12)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(epsilon=st.floats(0.5, 20.0), delta=st.floats(1e-9, 1e-3), queries=st.integers(1, 20_000),
       q=st.floats(1e-3, 1.0))
def test_subsampled_gaussian_calibration(epsilon, delta, queries, q):
    result = reachable(lambda: calibrate_subsampled_gaussian(epsilon, delta, queries, q))
    assume(result is not None)
    assert_at_most_and_within(result, rdp_epsilon(result.mechanism, queries, delta))


@CALIBRATIONS
@given(**targets, alpha=st.floats(1.5, 40.0), teachers=st.integers(1, 512), ball=st.sampled_from(["projection-order",
                                                                                                   "all-orders"]))
def test_pmixed_beta_is_the_largest_within_the_target(epsilon, delta, queries, alpha, teachers, ball):
    result = reachable(lambda: calibrate_pmixed(epsilon, delta, queries, alpha, teachers, ball=ball))
    assume(result is not None)
    assert_at_most_and_within(result, rdp_epsilon(result.mechanism, queries, delta, default_orders(alpha)))
    assert result.parameter == "beta" and result.mechanism.ball.value == ball


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(epsilon=st.floats(1.0, 20.0), queries=st.integers(1, 5000), q=st.floats(0.01, 1.0), teachers=st.integers(2, 64))
def test_subsampled_pmixed_defaults_to_the_proven_variant(epsilon, queries, q, teachers):
    result = reachable(lambda: calibrate_pmixed(epsilon, 1e-5, queries, 6.0, teachers, sampling_probability=q))
    assume(result is not None)
    assert result.fixed["variant"] == "all-orders-ball" and result.fixed["ball"] == "all-orders" and not result.notes
    curve = subsampled_pmixed_curve(result.mechanism, q, "all-orders-ball", queries, 0, default_orders(6.0))
    assert_at_most_and_within(result, epsilon_from_rdp(curve, 1e-5).epsilon)


def test_pmixed_without_subsampling_starts_from_lemma_c1_and_the_conversion_lowers_beta():
    from dpledger.mechanisms import beta_from_budget

    result = calibrate_pmixed(8.0, 1e-5, 1000, 6.0, 16)
    assert result.value < beta_from_budget(8.0, 1000, 6.0, 16)  # the (epsilon, delta) conversion adds a term
    assert "as claimed" in result.notes[0]


def test_pld_calibration_is_checked_with_pld_and_its_rdp_statement_is_larger():
    result = calibrate_gnmax(2.0, 1e-5, 100, accountant="pld")
    pld = compare_rdp_pld(result.mechanism, 100, 1e-5).pld_epsilon
    assert_at_most_and_within(result, pld)
    assert result.rdp_epsilon > 2.0 and "only as good as the PLD accounting" in result.notes[0]
    assert calibrate_gnmax(2.0, 1e-5, 100).value > result.value


@pytest.mark.parametrize("call, message", [
    (lambda: calibrate_gaussian(0.0, 1e-5, 10), "epsilon must be > 0, got 0"),
    (lambda: calibrate_gaussian(-1.0, 1e-5, 10), "epsilon must be > 0, got -1"),
    (lambda: calibrate_gaussian(math.nan, 1e-5, 10), "epsilon"),
    (lambda: calibrate_gaussian(1.0, 0.0, 10), r"delta must be in \(0, 1\), got 0"),
    (lambda: calibrate_gaussian(1.0, 1.5, 10), r"delta must be in \(0, 1\), got 1.5"),
    (lambda: calibrate_gnmax(1.0, 1e-5, 0), "queries"),
    (lambda: calibrate_gnmax(0.001, 1e-5, 10), "epsilon = 0.001 is out of reach"),
    (lambda: calibrate_pmixed(1.0, 1e-5, 10, 6.0, 16), "epsilon = 1 is out of reach for PMixED: even beta -> 0"),
    (lambda: calibrate_pmixed(8.0, 1e-5, 10, 6.0, 16, accountant="pld"), "RDP only"),
    (lambda: calibrate_gaussian(1.0, 1e-5, 10, accountant="moments"), "accountant must be one of"),
    (lambda: calibrate_subsampled_gaussian(1.0, 1e-5, 10, 0.0), r"sampling_probability must be in \(0, 1\]"),
    (lambda: calibrate_screening(1.0, 1e-5, 10, 16, 0.0), "lam must be > 0"),
])
def test_bad_targets_name_the_constraint_and_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_calibrate_cli_json_and_text(capsys):
    assert main(["calibrate", "gaussian", "--epsilon", "8", "--delta", "1e-5", "--queries", "10000", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["parameter"] == "noise_multiplier" and record["accountant"] == "rdp"
    assert 0 <= record["slack"] <= 0.01 * 8 and record["forward_epsilon"] <= 8
    assert record["pld_epsilon"] < record["rdp_epsilon"]
    assert main(["calibrate", "pmixed", "--epsilon", "8", "--delta", "1e-5", "--queries", "1000", "--alpha", "6",
                 "--teachers", "16"]) == 0
    out = capsys.readouterr().out
    assert "beta = " in out and "accounts forward to epsilon" in out and "slack" in out
    assert main(["calibrate", "dpargmax", "--epsilon", "2", "--delta", "1e-5", "--queries", "100", "--ratio", "2"]) == 0
    assert "screen noise s1" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["gnmax", "--epsilon", "0", "--delta", "1e-5", "--queries", "5"], "epsilon must be > 0, got 0"),
    (["pmixed", "--epsilon", "1", "--delta", "1e-5", "--queries", "10", "--alpha", "6", "--teachers", "16"],
     "out of reach for PMixED"),
])
def test_calibrate_cli_refuses_bad_targets_on_one_line(capsys, argv, message):
    assert main(["calibrate", *argv]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_calibrate_cli_refuses_a_flag_its_mechanism_does_not_read(capsys):
    assert main(["calibrate", "gnmax", "--epsilon", "1", "--delta", "1e-5", "--queries", "5", "--alpha", "6"]) == 2
    assert "does not use --alpha" in capsys.readouterr().err


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**targets, kind=st.sampled_from(["gaussian", "subsampled", "pmixed", "pmixed-subsampled"]),
       q=st.floats(1e-3, 1.0), teachers=st.integers(1, 256))
def test_calibration_sweep(epsilon, delta, queries, kind, q, teachers):
    call = {"gaussian": lambda epsilon=epsilon: calibrate_gaussian(epsilon, delta, queries),
            "subsampled": lambda: calibrate_subsampled_gaussian(epsilon, delta, queries, q),
            "pmixed": lambda: calibrate_pmixed(epsilon, delta, queries, 6.0, teachers),
            "pmixed-subsampled": lambda: calibrate_pmixed(epsilon, delta, queries, 6.0, teachers,
                                                          sampling_probability=q)}[kind]
    result = reachable(call)
    assume(result is not None)
    assert result.target_epsilon * (1 - CALIBRATION_TOLERANCE) <= result.forward_epsilon <= result.target_epsilon


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gaussian", "subsampled-gaussian", "screening", "confident-gnmax"])
def test_pld_calibration_sweep(kind):
    for epsilon in (0.5, 2.0, 8.0):
        call = {"gaussian": lambda epsilon=epsilon: calibrate_gaussian(epsilon, 1e-5, 1000, accountant="pld"),
                "subsampled-gaussian": lambda epsilon=epsilon: calibrate_subsampled_gaussian(epsilon, 1e-5, 1000, 0.01,
                                                                             accountant="pld"),
                "screening": lambda epsilon=epsilon: calibrate_screening(epsilon, 1e-5, 1000, 16, 0.3, accountant="pld"),
                "confident-gnmax": lambda epsilon=epsilon: calibrate_confident_gnmax(epsilon, 1e-5, 1000, accountant="pld")}[kind]
        result = call()
        assert_at_most_and_within(result, compare_rdp_pld(result.mechanism, 1000, 1e-5).pld_epsilon)


@pytest.mark.parametrize("epsilon, queries", [(12.0, 10), (2.0, 1), (8.0, 10000), (0.5, 3)])
def test_the_printed_noise_still_accounts_to_at_most_the_target(capsys, epsilon, queries):
    # the text output rounds to 8 digits towards privacy (noise up), so a value copied from it never overspends
    from dpledger.accounting.conversion import epsilon_from_rdp
    from dpledger.cli import main
    from dpledger.mechanisms import GaussianMechanism

    assert main(["calibrate", "gaussian", "--epsilon", str(epsilon), "--delta", "1e-5", "--queries", str(queries)]) == 0
    printed = float(capsys.readouterr().out.split("noise_multiplier = ")[1].split()[0])
    assert epsilon_from_rdp(GaussianMechanism(printed).rdp_curve().composed(queries), 1e-5).epsilon <= epsilon


@pytest.mark.parametrize("epsilon, message", [(500.0, "epsilon = 500 is above the PLD accountant's limit 100"),
                                              (60.0, "needs a composed noise multiplier of about")])
def test_pld_calibration_refuses_targets_beyond_its_grid_in_one_line(epsilon, message):
    from dpledger.mechanisms.calibration import calibrate_noise
    from dpledger.mechanisms.gaussian import GaussianMechanism

    with pytest.raises(ValueError, match=message):
        calibrate_noise(lambda sigma: GaussianMechanism(sigma), epsilon, 1e-5, 1, mechanism_name="gaussian",
                        parameter="noise", accountant="pld")


# ---- bounded work: ordinary PLD targets answer, absurd targets and counts are refused early ----

# 10,000 compositions (about 20 s of dp_accounting's PLD per calibration) run in make test-slow
@pytest.mark.parametrize("epsilon, queries, q", [(1.0, 1000, 0.01), (2.0, 100, 0.1),
                                                 pytest.param(8.0, 10_000, 0.01, marks=pytest.mark.slow)])
def test_pld_calibration_of_the_subsampled_gaussian_answers_ordinary_targets(epsilon, queries, q):
    # a None composed noise multiplier (the event is not one Gaussian) was formatted into a message
    # that was never shown: TypeError for every target
    result = calibrate_subsampled_gaussian(epsilon, 1e-5, queries, q, accountant="pld", compare_pld=True)
    assert_at_most_and_within(result, compare_rdp_pld(result.mechanism, queries, 1e-5).pld_epsilon)
    assert result.rdp_epsilon > result.forward_epsilon  # the PLD noise is smaller than RDP's


def run_cli_within(capsys, argv, seconds=10.0):
    """(exit status, stdout, stderr lines) of `dpledger calibrate|account ...`, asserting it took < seconds."""
    import time

    started = time.monotonic()
    status = main(argv)
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    assert elapsed < seconds, f"{argv} took {elapsed:.1f} s"
    return status, captured.out, captured.err.splitlines()


TARGET = ["--delta", "1e-5"]
CALIBRATE = {
    "gaussian": [], "subsampled-gaussian": ["--sample-rate", "0.01"], "pmixed": ["--alpha", "6", "--teachers", "16"],
    "screening": ["--teachers", "16", "--lam", "0.3"], "gnmax": [], "confident-gnmax": [], "dpargmax": [], "dpws": [],
}


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a warning would be a second line on stderr
@pytest.mark.parametrize("mechanism", sorted(CALIBRATE))
@pytest.mark.parametrize("epsilon, queries, message", [
    ("1e308", "1000", "epsilon must be <= 700 (a guarantee bounds probabilities by a factor e^epsilon"),
    ("nan", "1000", "epsilon must be finite, got nan"),
    ("8", "99999999999999999999999", "--queries must be in [1, 2^53 = 9007199254740992] (a larger count is not "
                                     "exact in double precision and could be rounded down), got 99999999999999999999999"),
    ("8", "-1", "--queries must be in [1, 2^53 = 9007199254740992]"),
])
def test_absurd_targets_and_counts_are_refused_in_one_line_within_seconds(capsys, mechanism, epsilon, queries, message):
    status, out, err = run_cli_within(capsys, ["calibrate", mechanism, "--epsilon", epsilon, "--queries", queries,
                                               *TARGET, *CALIBRATE[mechanism]])
    assert status == 2 and out == "" and len(err) == 1 and message in err[0], err


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a warning would be a second line on stderr
@pytest.mark.parametrize("argv, message", [
    # the PLD grid: a delta below its tail truncation, a count of subsampled steps it cannot compose, a target it
    # cannot resolve
    (["subsampled-gaussian", "--epsilon", "8", "--delta", "1e-308", "--queries", "1000", "--sample-rate", "0.01",
      "--accountant", "pld"], "delta = 1e-308 is below the PLD accountant's limit 1e-12"),
    (["subsampled-gaussian", "--epsilon", "8", "--delta", "1e-5", "--queries", "1000000000", "--sample-rate", "0.01",
      "--accountant", "pld"], "queries = 1000000000 is more than the 1,000,000 Poisson-subsampled steps"),
    (["subsampled-gaussian", "--epsilon", "100", "--delta", "1e-5", "--queries", "1", "--sample-rate", "0.01",
      "--accountant", "pld"], "needs a noise multiplier per step of about 0.0987: too little noise for the PLD"),
    (["gaussian", "--epsilon", "1e-308", "--delta", "1e-5", "--queries", "1000", "--accountant", "pld"],
     "the accounting drops from above it to exactly 0"),
    # fixed parameters whose noise per unit leaves double range, or makes one part immaterial
    (["screening", "--epsilon", "8", "--delta", "1e-5", "--queries", "10", "--teachers", "16", "--lam", "1e-308"],
     "screening with teachers = 16, lam = 1e-308 adds a noise multiplier of inf per unit of sigma"),
    (["confident-gnmax", "--epsilon", "8", "--delta", "1e-5", "--queries", "10", "--ratio", "1e308"],
     "ratio must be in [1e-06, 1e+06] (s1 = ratio * s2"),
    # PMixED with subsampling: the N x order array, and the realised sizes drawn per query
    (["pmixed", "--epsilon", "8", "--delta", "1e-5", "--queries", "10", "--alpha", "6", "--teachers", "100000",
      "--sample-rate", "0.5"], "teachers must be at most 4096 with Poisson subsampling of teachers"),
    (["pmixed", "--epsilon", "8", "--delta", "1e-5", "--queries", "100000000", "--alpha", "6", "--teachers", "16",
      "--sample-rate", "0.5", "--variant", "realised-size"], "queries must be at most 10,000,000 for the realised-size"),
    (["gaussian", "--epsilon", "8", "--delta", "1e-5", "--queries", "10", "--orders", "2,1e308"],
     "every order must be a number in (1, 1e+06]"),
])
def test_targets_beyond_what_the_accounting_evaluates_are_refused_in_one_line(capsys, argv, message):
    try:
        status, out, err = run_cli_within(capsys, ["calibrate", *argv])
    except SystemExit as exit_info:  # argparse's own refusals
        status, err = exit_info.code, capsys.readouterr().err.splitlines()
    assert status == 2 and len(err) == 1 and message in err[0], err


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a warning would be a second line on stderr
@pytest.mark.parametrize("argv", [
    ["subsampled-gaussian", "--epsilon", "8", "--delta", "1e-5", "--queries", "1000000000", "--sample-rate", "0.01"],
    ["subsampled-gaussian", "--epsilon", "8", "--delta", "1e-5", "--queries", str(2 ** 53), "--sample-rate", "0.01"],
    ["subsampled-gaussian", "--epsilon", "700", "--delta", "1e-5", "--queries", "1000", "--sample-rate", "0.01"],
    ["pmixed", "--epsilon", "700", "--delta", "1e-5", "--queries", "1", "--alpha", "6", "--teachers", "16"],
])
def test_extreme_but_valid_targets_are_answered_within_seconds(capsys, argv):
    # 10^9 queries ran past 10 minutes (the PLD comparison composed 10^9 subsampled steps)
    status, out, err = run_cli_within(capsys, ["calibrate", *argv])
    assert status == 0 and not err, err
    if "--sample-rate" in argv and argv[argv.index("--queries") + 1] != "1000":
        assert "no PLD epsilon beside the RDP one" in out
