"""`dpledger decode` with a config a careless or hostile user wrote: wrong types, values out of
range, unknown keys and tables, missing tables, paths that are directories, missing, not UTF-8 or
not writable, invalid TOML. Each must end with exit 2 and exactly one stderr line that names the key
or the value, and write nothing (no run directory, no overwritten file)."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.adversarial.verdicts import run_cli
from tests.micro import ADAPMIXED, PMIXED, micro_config

pytestmark = pytest.mark.adversarial


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
    return repr(value)


def toml_text(config: dict) -> str:
    lines = [f"{key} = {toml_value(value)}" for key, value in config.items() if not isinstance(value, dict)]
    for table, entries in config.items():
        if isinstance(entries, dict):
            lines.append(f"[{table}]")
            lines.extend(f"{k} = {toml_value(v)}" for k, v in entries.items())
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Bad:
    """A bad config: `edit(config, root)` changes a correct PMixED config (AdaPMixED's with `ada`),
    or `text(config, root)` is the whole file; `config_path` / `out` (with {root}) replace the
    written config's path / the --out given; the one error line must name one of `tokens`."""
    name: str
    tokens: tuple
    edit: object = None
    ada: bool = False
    text: object = None
    config_path: str | None = None
    out: str | None = None


def put(table: str, key: str, value):
    return lambda config, root: config.setdefault(table, {}).__setitem__(key, value)


def put_path(table: str, key: str, path: str):
    return lambda config, root: config.setdefault(table, {}).__setitem__(key, path.format(root=root))


BAD = [
    Bad('mechanism.beta = "0.2"', ("beta", "0.2"), put("mechanism", "beta", "0.2")),
    Bad("data.block_size = 32.0", ("block_size", "32.0"), put("data", "block_size", 32.0)),
    Bad("run = 5 (not a table)", ("run", "5"), lambda c, r: c.update(run=5)),
    Bad('mechanism = "pmixed" (not a table)', ("mechanism", "pmixed"), lambda c, r: c.update(mechanism="pmixed")),
    Bad('data.prompts = "abc"', ("prompts", "abc"), lambda c, r: c["data"].update(stream="generate", prompts="abc")),
    Bad('run.replay_payload = "no"', ("replay_payload", "no"), put("run", "replay_payload", "no")),
    Bad("run.queries = true", ("queries", "true", "True"), put("run", "queries", True)),
    Bad("run.deltas = []", ("deltas", "[]"), put("run", "deltas", [])),
    Bad("run.deltas = 1e-5", ("deltas", "1e-05"), put("run", "deltas", 1e-5)),
    Bad('run.deltas = ["1e-5"]', ("deltas", "1e-5"), put("run", "deltas", ["1e-5"])),
    Bad("run.deltas = [0.0]", ("delta", "0.0"), put("run", "deltas", [0.0])),
    Bad("run.deltas = [1.0]", ("delta", "1.0"), put("run", "deltas", [1.0])),
    Bad("run.deltas = [nan]", ("delta", "nan"), put("run", "deltas", [float("nan")])),
    Bad("run.relation = 5", ("relation", "5"), put("run", "relation", 5)),
    Bad('run.relation = "replace_one"', ("relation", "replace_one"), put("run", "relation", "replace_one")),
    Bad('run.relation = "banana"', ("relation", "banana"), put("run", "relation", "banana")),
    Bad('models.teachers = "8"', ("teachers", "8"), put("models", "teachers", "8")),
    Bad("models.teachers = 2 (3 teacher_paths)", ("teachers", "2"), put("models", "teachers", 2)),
    Bad("mechanism.teachers = 5", ("teachers", "5"), put("mechanism", "teachers", 5)),
    Bad("mechanism.sigma = 1e-300 (adapmixed)", ("sigma", "1e-300"), put("mechanism", "sigma", 1e-300), ada=True),
    Bad("mechanism.sigma = 0", ("sigma", "0"), put("mechanism", "sigma", 0.0), ada=True),
    Bad("mechanism.sigma = inf", ("sigma", "inf"), put("mechanism", "sigma", float("inf")), ada=True),
    Bad("mechanism.lam = -1", ("lam", "-1"), put("mechanism", "lam", -1.0), ada=True),
    Bad("mechanism.threshold = nan", ("threshold", "nan"), put("mechanism", "threshold", float("nan")), ada=True),
    Bad("mechanism.top_k = 0", ("top_k", "0"), put("mechanism", "top_k", 0), ada=True),
    Bad('mechanism.accounting = "banana"', ("accounting", "banana"), put("mechanism", "accounting", "banana"), ada=True),
    Bad("mechanism.screening = 1", ("screening", "1"), put("mechanism", "screening", 1), ada=True),
    Bad("mechanism.beta = -0.1", ("beta", "-0.1"), put("mechanism", "beta", -0.1)),
    Bad("mechanism.beta = nan", ("beta", "nan"), put("mechanism", "beta", float("nan"))),
    Bad("mechanism.alpha = 1.0", ("alpha", "1.0"), put("mechanism", "alpha", 1.0)),
    Bad("mechanism.alpha = inf", ("alpha", "inf"), put("mechanism", "alpha", float("inf"))),
    Bad("mechanism.sample_rate = 1.5", ("sample_rate", "1.5"), put("mechanism", "sample_rate", 1.5)),
    Bad('mechanism.ball = "banana"', ("ball", "banana"), put("mechanism", "ball", "banana")),
    Bad("mechanism.gamma = 1 (unknown parameter)", ("gamma",), put("mechanism", "gamma", 1)),
    Bad('mechanism.type = "PMixED"', ("type", "PMixED"), put("mechanism", "type", "PMixED")),
    Bad("mechanism.type = 5", ("type", "5"), put("mechanism", "type", 5)),
    Bad("mechanism.type missing", ("type",), lambda c, r: c["mechanism"].pop("type")),
    Bad("no [mechanism] table", ("mechanism",), lambda c, r: c.pop("mechanism")),
    Bad("run.queries = 0", ("queries", "0"), put("run", "queries", 0)),
    Bad("run.queries = -5", ("queries", "-5"), put("run", "queries", -5)),
    Bad("run.queries = 10000000 (more than the text)", ("queries", "10000000", "10000001", "tokens"),
        put("run", "queries", 10_000_000)),
    Bad("data.block_size = 0", ("block_size", "0"), put("data", "block_size", 0)),
    Bad("data.block_size = 1", ("block_size", "1"), put("data", "block_size", 1)),
    Bad("data.block_size = 1000 (> n_positions)", ("block_size", "1000"), put("data", "block_size", 1000)),
    Bad('data.stream = "banana"', ("stream", "banana"), put("data", "stream", "banana")),
    Bad("data.max_new_tokens = 0 (generate)", ("max_new_tokens", "0"),
        lambda c, r: c["data"].update(stream="generate", prompts=["Hi"], max_new_tokens=0)),
    Bad('data.prompts = [""] (generate)', ("prompt",), lambda c, r: c["data"].update(stream="generate", prompts=[""])),
    Bad('models.device = "cuda" (no CUDA)', ("cuda", "device"), put("models", "device", "cuda")),
    Bad('models.device = "banana"', ("device", "banana"), put("models", "device", "banana")),
    Bad('models.teacher_kind = "lora" (full checkpoints)', ("lora", "teacher", "adapter"),
        put("models", "teacher_kind", "lora")),
    Bad("models.public = a path that does not exist", ("/nonexistent/public", "public"),
        put("models", "public", "/nonexistent/public")),
    Bad("models.tokenizer = a path that does not exist", ("/nonexistent/tok", "tokenizer"),
        put("models", "tokenizer", "/nonexistent/tok")),
    Bad('models.embedded = "yes"', ("embedded", "yes"), put("models", "embedded", "yes")),
    Bad("unknown key run.queriez", ("queriez",), put("run", "queriez", 10)),
    Bad("unknown table [extra]", ("extra",), lambda c, r: c.update(extra={"a": 1})),
    Bad('run.out = "" (and --out "")', ("out", "''", '""'), put("run", "out", ""), out=""),
    Bad("data.text is a directory", ("text", "{root}/a_directory"), put_path("data", "text", "{root}/a_directory")),
    Bad("data.text is not UTF-8", ("text", "{root}/latin1.txt", "UTF-8"), put_path("data", "text", "{root}/latin1.txt")),
    Bad("data.text does not exist", ("text", "/nonexistent/heldout.txt"), put("data", "text", "/nonexistent/heldout.txt")),
    Bad("the config is not UTF-8", ("config", "UTF-8"), text=lambda c, r: toml_text(c).encode() + b"\n# caf\xe9\n"),
    Bad("the config is invalid TOML", ("TOML",), text=lambda c, r: "[run\nqueries = 5\n"),
    Bad("the config has a duplicate key", ("TOML", "queries"), text=lambda c, r: toml_text(c) + "[run]\nqueries = 5\n"),
    Bad("the config is empty", ("out", "mechanism", "run"), text=lambda c, r: ""),
    Bad("the config path is a directory", ("config", "{root}/a_directory"), config_path="{root}/a_directory"),
    Bad("the config path does not exist", ("config", "/nonexistent/config.toml"), config_path="/nonexistent/config.toml"),
    Bad("--out is an existing file", ("out", "{root}/existing_file"), out="{root}/existing_file"),
    Bad("--out under /proc/sys (not writable)", ("/proc/sys", "writable", "Permission", "No such file"),
        out="/proc/sys/dpledger-adversary/run"),
    Bad("--out under /sys (mkdir not permitted)", ("/sys", "permitted", "writable"), out="/sys/dpledger-adversary-run"),
]


def _listing(directory: Path):
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else None


@pytest.mark.parametrize("bad", BAD, ids=[bad.name for bad in BAD])
def test_a_bad_config_is_one_line_naming_it_and_writes_nothing(micro_models, tmp_path, monkeypatch, capfd, bad):
    if "CUDA" in bad.name:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    root = tmp_path / "configs"
    root.mkdir()
    (root / "a_directory").mkdir()
    (root / "latin1.txt").write_bytes("Customer: caf\xe9 na\xefve \xff\xfe".encode("latin-1") * 200)
    (root / "existing_file").write_text("keep me")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # where a run without an --out would go
    config = copy.deepcopy(micro_config(micro_models, root / "unused", ADAPMIXED if bad.ada else PMIXED, queries=64))
    if bad.edit is not None:
        bad.edit(config, root)
    if bad.config_path is not None:
        config_path = Path(bad.config_path.format(root=root))
    else:
        config_path = root / "config.toml"
        text = bad.text(config, root) if bad.text is not None else toml_text(config)
        config_path.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = str(root / "out") if bad.out is None else bad.out.format(root=root)
    watched = Path(out).parent if out else cwd
    before = _listing(watched)
    existing = Path(out).read_bytes() if out and Path(out).is_file() else None

    answer = run_cli(capfd, "decode", config_path, "--out", out, "--no-progress", seconds=120)
    assert answer.rc == 2 and len(answer.lines) == 1, answer
    tokens = [token.format(root=root) for token in bad.tokens]
    assert any(token.lower() in answer.lines[0].lower() for token in tokens), f"names none of {tokens}: {answer}"
    assert _listing(watched) == before, "it wrote something"
    if existing is not None:
        assert Path(out).read_bytes() == existing, f"it overwrote {out}"
    elif out:
        assert not Path(out).exists(), f"it wrote {out}"
