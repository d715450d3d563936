"""Instant start: the commands that only account (`--version`, `--help`, `account`, `calibrate`, `verify`)
and `import dpledger` / `dpledger.accounting` / `dpledger.mechanisms` load neither torch nor numba (nor
the model, table and plot libraries); the first step on a distribution loads them (accounting/lazy_import.py).
Each case runs in a fresh interpreter, so that nothing another test imported hides a heavy import."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpledger.accounting.lazy_import import LazyModule, lazy_module

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numba", "llvmlite", "transformers", "pandas", "matplotlib", "scipy.stats")
"""scipy.stats (~0.5 s) counts for the imports only: the PLD comparison a command prints loads it through
dp-accounting's own imports (scipy.signal), which is work the command does."""

_PROBE = """
import json, sys
{body}
print(json.dumps([name for name in {heavy!r} if name in sys.modules]))
"""

_CLI = """
from dpledger.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
"""

README_ACCOUNT = ["account", "pmixed", "--alpha", "6", "--beta", "0.01", "--teachers", "100", "--sample-rate", "0.03",
                  "--queries", "9728", "--delta", "1e-5"]
README_CALIBRATE = ["calibrate", "pmixed", "--epsilon", "8", "--delta", "1e-5", "--queries", "1000", "--alpha", "6",
                    "--teachers", "16"]


def heavy_modules_loaded(body: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running `body` (its output discarded)."""
    done = subprocess.run([sys.executable, "-c", _PROBE.format(body=body, heavy=HEAVY)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("statement", ["import dpledger", "import dpledger.accounting", "import dpledger.mechanisms",
                                       "from dpledger import PMixED, AdaPMixED, GNMax, Targmax, PrivacyLedger",
                                       "import dpledger.audit.claims", "import dpledger.decoding.config"])
def test_imports_stay_light(statement):
    assert heavy_modules_loaded(statement) == []


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["account", "--help"], ["account", "pmixed", "--help"],
                                  README_ACCOUNT, ["account", "gnmax", "--sigma", "40", "--queries", "100",
                                                   "--delta", "1e-5"],
                                  README_CALIBRATE, ["calibrate", "gaussian", "--epsilon", "1", "--delta", "1e-5",
                                                     "--queries", "10"]]
                         + [["verify", str(path)] for path in sorted((ROOT / "examples" / "claims").glob("*.toml"))],
                         ids=lambda argv: " ".join(argv[:2]) if argv[0] != "verify" else "verify " + Path(argv[1]).stem)
def test_accounting_commands_load_neither_torch_nor_numba(argv):
    body = ("import contextlib, io\nwith contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            + "\n".join("    " + line for line in _CLI.format(argv=argv).strip().splitlines()))
    assert [name for name in heavy_modules_loaded(body) if name != "scipy.stats"] == []


def test_the_first_step_loads_torch_and_gives_the_eager_result():
    body = ("import numpy as np\nfrom dpledger import PMixED\n"
            "rng = np.random.default_rng(0)\nt = rng.dirichlet(np.ones(16), size=4)\np = rng.dirichlet(np.ones(16))\n"
            "m = PMixED(alpha=4.0, beta=0.05, teachers=4)\n"
            "w = m.mixing_weights(t, p)\nassert np.all((w >= 0) & (w <= 1)), w\n")
    assert "torch" in heavy_modules_loaded(body)


def test_a_lazy_module_imports_on_first_read_and_then_reads_like_the_module():
    stand_in = LazyModule("json")
    assert "dumps" not in vars(stand_in)
    assert stand_in.dumps({"a": 1}) == json.dumps({"a": 1})
    assert vars(stand_in)["dumps"] is json.dumps   # copied in: later reads are plain lookups
    with pytest.raises(AttributeError):
        _ = stand_in.no_such_attribute
    assert lazy_module("json") is json             # already imported: nothing to defer


def test_a_decode_refused_for_its_config_or_its_output_directory_loads_neither_torch_nor_numba(tmp_path):
    """`dpledger decode` checks the configuration and --out before the decoding stack loads: a mistake
    there is one line in well under a second, not after torch, transformers and the models."""
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("not a run\n")
    misspelt = tmp_path / "misspelt.toml"
    misspelt.write_text(f'[run]\nout = "{tmp_path / "out"}"\n[mechanism]\ntype = "pmixxed"\n')
    for argv, refusal in ((["decode", str(ROOT / "examples" / "pmixed.toml"), "--out", str(used)], "already holds files"),
                          (["decode", str(misspelt)], "unknown mechanism type 'pmixxed'")):
        body = ("import contextlib, io\nfrom dpledger.cli import main\nerr = io.StringIO()\n"
                "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):\n"
                f"    status = main({argv!r})\n"
                f"assert status == 2 and {refusal!r} in err.getvalue(), (status, err.getvalue())")
        assert [name for name in heavy_modules_loaded(body) if name != "scipy.stats"] == [], argv
    assert list(used.iterdir()) == [used / "notes.txt"] and not (tmp_path / "out").exists()
