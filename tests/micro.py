"""Micro models for tests: built once per session in a temporary cache (a few seconds on CPU)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from decoding.recipe import TinyModelRecipe

MICRO_RECIPE = TinyModelRecipe(vocab_size=320, n_layer=1, n_embd=32, n_head=2, n_positions=64, public_steps=40,
                               public_batch=8, warmup_steps=5, teacher_steps=6, teacher_batch=8)
MICRO_CORPUS = dict(public_paragraphs=400, dialogues_per_shard=25, heldout_dialogues=120, canaries=1,
                    canary_repetitions=3)


@dataclass(frozen=True)
class MicroModels:
    public: Path
    teachers: tuple[Path, ...]
    tokenizer: Path
    heldout_text: Path
    root: Path
    canaries: tuple[dict, ...]


def build_micro_models(root: Path, teachers: int = 3) -> MicroModels:
    from decoding.embedded import build_or_load

    embedded = build_or_load(teachers=teachers, recipe=MICRO_RECIPE, verbose=False, **MICRO_CORPUS)
    text = root / "heldout.txt"
    text.write_text(embedded.corpus.private_heldout)
    canaries = tuple({"teacher": c.shard, "text": c.text, "secret": c.secret} for c in embedded.corpus.canaries)
    return MicroModels(embedded.public_path, tuple(embedded.teacher_paths), embedded.tokenizer_path, text, root,
                       canaries)


def micro_config(models: MicroModels, out: Path, mechanism: dict, queries: int = 96, block_size: int = 32,
                 **run) -> dict:
    return {
        "run": {"out": str(out), "queries": queries, "seed": 7, **run},
        "mechanism": mechanism,
        "models": {"embedded": False, "public": str(models.public), "teacher_paths": [str(t) for t in models.teachers],
                   "teachers": len(models.teachers), "tokenizer": str(models.tokenizer)},
        "data": {"stream": "teacher-forced", "text": str(models.heldout_text), "block_size": block_size},
    }


def write_toml(path: Path, config: dict) -> Path:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = []
    for table, entries in config.items():
        lines.append(f"[{table}]")
        lines.extend(f"{key} = {value(v)}" for key, v in entries.items())
        lines.append("")
    path.write_text("\n".join(lines))
    return path
