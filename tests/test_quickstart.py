"""The Python quickstart (examples/quickstart.py and its notebook) runs end to end through the public
API, and `dpledger decode` takes --queries and --set overrides."""
import json
import runpy
from pathlib import Path

import pytest

from dpledger.decoding.config import load_config, parse_override

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_the_quickstart_runs_jsonl_to_teachers_to_audit_to_report(micro_models, tmp_path):
    quickstart = runpy.run_path(str(EXAMPLES / "quickstart.py"))
    outcome = quickstart["main"](["--public", str(micro_models.public), "--tokenizer", str(micro_models.tokenizer),
                                  "--out", str(tmp_path / "q"), "--teachers", "2", "--train-steps", "2",
                                  "--queries", "8"])
    assert outcome["result"].summary["steps"] == 8
    assert outcome["audit"].verdict == "PASS" and outcome["audit"].bracket is not None
    text = outcome["report"].read_text()
    assert text.startswith("# dpledger privacy report") and "pmixed" in text.lower()
    assert (tmp_path / "q" / "teachers" / "teachers.json").exists()


def test_the_notebook_holds_the_quickstart_and_runs(micro_models, tmp_path):
    notebook = json.loads((EXAMPLES / "quickstart.ipynb").read_text())
    cells = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    assert "PARAMETERS" in cells[0]
    namespace = {}
    exec(cells[0], namespace)
    namespace.update(PUBLIC=str(micro_models.public), TOKENIZER=str(micro_models.tokenizer), OUT=str(tmp_path / "nb"),
                     TEACHERS=2, TRAIN_STEPS=2, QUERIES=8)
    for cell in cells[1:]:
        exec(cell, namespace)
    assert namespace["report"].verdict == "PASS" and (tmp_path / "nb" / "report.md").exists()


@pytest.mark.parametrize("text, expected", [
    ("mechanism.beta=0.05", ("mechanism", "beta", 0.05)),
    ("run.deltas=[1e-5, 1e-6]", ("run", "deltas", [1e-5, 1e-6])),
    ("models.teacher_kind=lora", ("models", "teacher_kind", "lora")),
    ('models.public="gpt2"', ("models", "public", "gpt2")),
    ("mechanism.screening=false", ("mechanism", "screening", False)),
])
def test_an_override_reads_its_value_as_toml(text, expected):
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["beta=0.05", "mechanism.beta", "mechanism.=1", ".beta=1", "a.b.c=1"])
def test_a_malformed_override_is_one_line(text):
    with pytest.raises(ValueError, match=r"--set takes TABLE.KEY=VALUE"):
        parse_override(text)


def test_overrides_apply_before_the_config_is_checked(tmp_path):
    config = load_config(EXAMPLES / "pmixed.toml", str(tmp_path / "r"),
                         ("mechanism.beta=0.05", "run.queries=12", "models.teachers=3"))
    assert config.mechanism["beta"] == 0.05 and config.queries == 12 and config.models.teachers == 3
    with pytest.raises(ValueError, match="beta"):
        load_config(EXAMPLES / "pmixed.toml", None, ("mechanism.beta=-1",))
    with pytest.raises(ValueError, match="run is not a table"):
        (tmp_path / "c.toml").write_text('run = 3\n')
        load_config(tmp_path / "c.toml", None, ("run.queries=3",))


def test_decode_takes_queries_and_set_at_the_command_line(micro_models, tmp_path, capsys):
    from dpledger.cli import main
    from tests.micro import micro_config, write_toml

    path = write_toml(tmp_path / "c.toml", micro_config(micro_models, tmp_path / "run", {"type": "pmixed",
                                                                                          "alpha": 6.0, "beta": 0.01}))
    assert main(["decode", str(path), "--queries", "6", "--set", "mechanism.beta=0.02", "--no-progress"]) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["queries"] == 6 and manifest["mechanism"]["params"]["beta"] == 0.02
    assert main(["decode", str(path), "--set", "beta=1", "--out", str(tmp_path / "bad")]) == 2
    assert "--set takes TABLE.KEY=VALUE" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_the_readme_step_api_snippet_runs_as_written():
    """The README's Python block is self-contained: it runs in a fresh namespace and prints an epsilon."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    start = readme.index("```python", readme.index("## Your own generation loop")) + len("```python\n")
    namespace = {}
    exec(readme[start:readme.index("```", start)], namespace)
    assert namespace["ledger"].epsilon(1e-5).epsilon > 0
