"""Strict JSON (RFC 8259) in every file and --json output: no Infinity, no NaN; a non-finite value is
null, its JSON Pointer listed under `nulls` with the reason, and reading restores it exactly."""
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpledger.accounting.strict_json import NULLS, loads_json, strict_json_text
from dpledger.audit import audit_run
from dpledger.decoding import trace
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode
from dpledger.cli import main
from tests.micro import micro_config


def strict_loads(text: str):
    """json.loads that refuses NaN / Infinity, as strict parsers (browsers, jq, Go, Rust) do."""
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


def same(a, b) -> bool:
    """Equal, with NaN equal to NaN and tuples equal to lists."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b and type(a) is type(b)


keys = st.text(alphabet=st.sampled_from("ab/~0 _"), min_size=1, max_size=4)
leaves = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.text(max_size=3),
                   st.floats(allow_nan=True, allow_infinity=True))
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                      max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys.filter(lambda k: k != NULLS), values, max_size=5))
def test_any_payload_round_trips_exactly_through_strict_json(payload):
    text = strict_json_text(payload)
    parsed = strict_loads(text)  # a strict parser accepts it
    non_finite = parsed.get(NULLS, {})
    for reason in non_finite.values():
        assert reason.split(":")[0] in ("+inf", "-inf", "NaN")
    assert same(payload, loads_json(text))


def test_a_nulls_map_that_does_not_fit_the_file_is_refused():
    with pytest.raises(ValueError, match="names '/b', which is not in the file"):
        loads_json('{"a": null, "nulls": {"/b": "+inf: no guarantee (an unbounded privacy loss)"}}')
    with pytest.raises(ValueError, match="names '/a', which is not null"):
        loads_json('{"a": 3, "nulls": {"/a": "+inf: no guarantee (an unbounded privacy loss)"}}')
    with pytest.raises(ValueError, match="reserved key 'nulls'"):
        strict_json_text({"nulls": 1})


def test_files_written_before_strict_json_still_read_the_same():
    assert loads_json('{"epsilon": Infinity, "x": [1, NaN]}')["epsilon"] == math.inf


@pytest.mark.parametrize("mechanism", [
    {"type": "voting", "votes": "coordinated", "aggregator": "targmax", "threshold": 2},  # +inf per step
    {"type": "pmixed", "alpha": 3.0, "beta": 0.05},  # +inf above the projection order
])
def test_every_file_of_a_run_and_its_audit_is_strict_json(micro_models, tmp_path, mechanism, capsys):
    result = run_decode(config_from_dict(micro_config(micro_models, tmp_path / "run", mechanism, queries=16,
                                                      block_size=16)), progress=False, verbose=False)
    audit_run(result.directory, mc_samples=20, game_trials=50, play_game=False)
    files = sorted(Path(result.directory).glob("*.json"))
    assert {f.name for f in files} >= {"manifest.json", "ledger.json", "final.json", "audit.json"}
    for path in files:
        strict_loads(path.read_text())  # raises on a bare Infinity or NaN
    ledger_text = (Path(result.directory) / trace.LEDGER).read_text()
    if mechanism["type"] == "voting":  # TARGMAX: +inf at every order, epsilon +inf ("no guarantee")
        nulls = strict_loads(ledger_text)[NULLS]
        assert any(pointer.startswith("/epsilon/") for pointer in nulls)
    # the restored ledger is the in-memory summary, infinities included
    assert same(json.loads(json.dumps(result.summary, default=float)), trace.read_ledger(result.directory))
    assert main(["audit", str(result.directory), "--json", "--no-game", "--trials", "50", "--mc-samples", "20"]) == 0
    strict_loads(capsys.readouterr().out)


def test_duplicate_keys_and_deep_nesting_are_refused_naming_the_source():
    """A reader keeping the first of two values and one keeping the last would see different files;
    deep nesting would recurse until Python's limit (an internal error) instead of one line."""
    with pytest.raises(ValueError, match=r"ledger.json: the key 'epsilon' appears twice in one object"):
        loads_json('{"epsilon": 0.1, "steps": 3, "epsilon": 9.0}', "ledger.json")
    with pytest.raises(ValueError, match=r"x.json: the key 'b' appears twice"):
        loads_json('{"a": [{"b": 1, "b": 1}]}', "x.json")
    with pytest.raises(ValueError, match=r"x.json: arrays and objects nest 5000 deep, more than the 100"):
        loads_json("[" * 5000 + "]" * 5000, "x.json")
    nested = "[" * 99 + "]" * 99  # 100 deep inside the object
    assert loads_json('{"brackets in strings do not count": "' + "[" * 500 + '", "a": ' + nested + "}")["a"] == \
        json.loads(nested)
