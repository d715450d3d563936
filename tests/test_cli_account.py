"""`dpledger account` on the command line."""
import json
import subprocess
import sys

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
