"""Every TOML in examples/ is a valid config as shipped and decodes a few queries on the micro
models (its [models] swapped for micro ones of the same kind), so no example can rot."""
import json
import tomllib
from pathlib import Path

import pytest

from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.toml"))


def test_there_is_an_example_per_mechanism_and_stream():
    kinds = {tomllib.loads(path.read_text())["mechanism"]["type"] for path in EXAMPLES}
    assert kinds == {"public", "ensemble", "pmixed", "adapmixed", "voting"}
    texts = [path.read_text() for path in EXAMPLES]
    assert any('stream = "generate"' in t for t in texts) and any('teacher_kind = "lora"' in t for t in texts)


@pytest.fixture(scope="module")
def lora_adapters(micro_models, tmp_path_factory):
    from peft import LoraConfig, get_peft_model

    from dpledger.decoding.ensemble import load_causal_lm

    root = tmp_path_factory.mktemp("lora")
    paths = []
    for index in range(3):
        model = get_peft_model(load_causal_lm(str(micro_models.public)),
                               LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False))
        model.save_pretrained(root / f"teacher-{index}")
        paths.append(str(root / f"teacher-{index}"))
    return paths


def _on_micro_models(config: dict, micro_models, lora_adapters, out: Path) -> dict:
    kind = config["models"].get("teacher_kind", "full")
    base = {"embedded": False, "public": str(micro_models.public), "tokenizer": str(micro_models.tokenizer)}
    if kind == "icl":
        examples = out.parent / f"{out.name}-examples.json"
        examples.write_text(json.dumps([[f"Customer: Hi, I am guest {i}."] for i in range(6)]))
        models = {**base, "teacher_kind": "icl", "teachers": 6, "icl_examples": str(examples), "icl_prompt_tokens": 16}
    elif kind == "lora":
        models = {**base, "teacher_kind": "lora", "teachers": 3, "teacher_paths": lora_adapters}
    else:
        models = {**base, "teacher_kind": "full", "teachers": 3, "teacher_paths": [str(t) for t in micro_models.teachers]}
    data = dict(config.get("data", {}))
    data["block_size"] = 8
    if data.get("stream") == "generate":
        data["max_new_tokens"] = 4
    else:
        data["text"] = str(micro_models.heldout_text)
    run = {**config["run"], "out": str(out), "queries": 8}
    mechanism = dict(config["mechanism"])
    if mechanism["type"] == "voting":  # the same threshold as a fraction of the (smaller) ensemble
        scaled = mechanism["threshold"] * models["teachers"] / config["models"]["teachers"]
        mechanism["threshold"] = float(scaled) if isinstance(mechanism["threshold"], float) else max(1, round(scaled))
    return {**config, "run": run, "mechanism": mechanism, "models": models, "data": data}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_valid_and_decodes(path, micro_models, lora_adapters, tmp_path):
    config = tomllib.loads(path.read_text())
    config_from_dict(config)  # valid as shipped
    result = run_decode(config_from_dict(_on_micro_models(config, micro_models, lora_adapters, tmp_path / path.stem)),
                        progress=False, verbose=False)
    assert result.summary["steps"] == 8


def test_the_config_reference_documents_every_key():
    """docs/config.md names every key of every table and every mechanism's parameters."""
    import re

    from dpledger.decoding.config import _SCHEMA
    from dpledger.decoding.runners import _PARAMETERISED, runner_parameters

    text = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text()
    sections = dict(re.findall(r"^##+ (.+?)\n(.*?)(?=^##|\Z)", text, flags=re.S | re.M))

    def documented(section: str) -> set[str]:
        body = next(body for title, body in sections.items() if title.startswith(section))
        return set(re.findall(r"`([a-z_]+)`", body))

    for table, keys in _SCHEMA.items():
        missing = set(keys) - documented(f"[{table}]")
        assert not missing, f"[{table}] keys missing from docs/config.md: {sorted(missing)}"
    for kind in _PARAMETERISED:
        parameters = runner_parameters(kind)   # voting: its keys and every registered aggregator's parameters
        missing = parameters - documented(f'type = "{kind}"')
        assert not missing, f"[mechanism] type = {kind!r} parameters missing from docs/config.md: {sorted(missing)}"
