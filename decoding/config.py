"""Run configuration (TOML), validated before anything is written.

    [run]
    out = "runs/adapmixed"      # trace directory
    queries = 1024
    seed = 0
    replay_payload = true       # keep the logits seen (exact replay; small runs)
    deltas = [1e-5]
    relation = "add_or_remove_one"  # the claimed neighbouring relation: add_or_remove_one | remove_one | add_one

    [mechanism]                 # type = public | ensemble | pmixed | adapmixed, plus its parameters
    type = "adapmixed"
    alpha = 18.0
    beta = 0.2
    ...

    [models]                    # either the embedded default ...
    embedded = true
    teachers = 8
    # ... or your own checkpoints (local directories or hub names):
    # public = "path/or/name"; teacher_paths = ["t0", "t1"]; teacher_kind = "full" | "lora"; tokenizer = "..."
    device = "cpu"              # or "cuda"

    [data]
    stream = "teacher-forced"   # or "generate"
    text = "heldout.txt"        # teacher-forced text (default: the embedded private held-out part)
    block_size = 128
    prompts = ["Customer: Hi"]  # generate
    max_new_tokens = 64
"""
from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accounting.errors import require, require_in_open, require_int_at_least
from accounting.relation import NeighbouringRelation, neighbouring_relation
from decoding.runners import MECHANISM_TYPES


@dataclass(frozen=True)
class ModelsConfig:
    embedded: bool = True
    teachers: int = 8
    public: str | None = None
    teacher_paths: tuple[str, ...] = ()
    teacher_kind: str = "full"
    tokenizer: str | None = None
    device: str = "cpu"  # where the models run ("cuda" on a GPU machine); mechanisms run on the CPU


@dataclass(frozen=True)
class DataConfig:
    stream: str = "teacher-forced"
    text: str | None = None
    block_size: int = 128
    prompts: tuple[str, ...] = ()
    max_new_tokens: int = 64


@dataclass(frozen=True)
class RunConfig:
    out: str
    mechanism: dict
    models: ModelsConfig = field(default_factory=ModelsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    queries: int = 1024
    seed: int = 0
    replay_payload: bool = True
    deltas: tuple[float, ...] = (1e-5,)
    relation: str = "add_or_remove_one"
    """The neighbouring relation the run claims; the mechanism charges what covers it and the audit
    FAILs a total that does not (accounting.relation)."""

    def __post_init__(self) -> None:
        # every decoding mechanism mixes or averages teachers: its bounds are for adding or removing one
        require(neighbouring_relation(self.relation) is not NeighbouringRelation.REPLACE_ONE,
                f"relation must be one of ['add_or_remove_one', 'remove_one', 'add_one'] for a decoding run, "
                f"got {self.relation!r}")
        require(isinstance(self.mechanism, dict) and self.mechanism.get("type") in MECHANISM_TYPES,
                f"unknown mechanism type {self.mechanism.get('type') if isinstance(self.mechanism, dict) else None!r}; "
                f"known: {', '.join(MECHANISM_TYPES)}")
        require_int_at_least("queries", self.queries, 1)
        for delta in self.deltas:
            require_in_open("delta", delta, 0.0, 1.0)
        models = self.models
        require(models.teacher_kind in ("full", "lora"), f"teacher_kind must be 'full' or 'lora', got {models.teacher_kind!r}")
        if models.embedded:
            require_int_at_least("models.teachers", models.teachers, 1)
            require(models.public is None and not models.teacher_paths,
                    "models.embedded = true cannot be combined with models.public / models.teacher_paths")
        else:
            require(models.public is not None, "models.public is required when models.embedded = false")
            require(len(models.teacher_paths) >= 1, "models.teacher_paths must list at least one teacher")
            require(len(models.teacher_paths) == models.teachers,
                    f"models.teachers = {models.teachers} does not match the {len(models.teacher_paths)} "
                    "teacher_paths given")
        data = self.data
        require(data.stream in ("teacher-forced", "generate"),
                f"data.stream must be 'teacher-forced' or 'generate', got {data.stream!r}")
        require_int_at_least("data.block_size", data.block_size, 2)
        if data.stream == "generate":
            require(len(data.prompts) >= 1, "data.prompts must list at least one prompt for data.stream = 'generate'")
            require_int_at_least("data.max_new_tokens", data.max_new_tokens, 1)
        elif not models.embedded:
            require(data.text is not None, "data.text (a text file) is required with your own models")
        if data.text is not None:
            require(Path(data.text).exists(), f"data.text file does not exist: {data.text}")

    def to_dict(self) -> dict:
        return asdict(self)

    def fingerprint(self) -> str:
        """Hash of everything that determines the run's output (not `out`): resume must match it."""
        payload = {k: v for k, v in self.to_dict().items() if k != "out"}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _table(data: dict, name: str, cls):
    table = data.get(name, {})
    require(isinstance(table, dict), f"[{name}] must be a table")
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(table) - known)
    require(not unknown, f"unknown keys in [{name}]: {unknown}; known: {sorted(known)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in table.items()})


def config_from_dict(data: dict, out_override: str | None = None) -> RunConfig:
    unknown = sorted(set(data) - {"run", "mechanism", "models", "data"})
    require(not unknown, f"unknown tables in config: {unknown}; known: run, mechanism, models, data")
    run = dict(data.get("run", {}))
    known_run = {"out", "queries", "seed", "replay_payload", "deltas", "relation"}
    require(not set(run) - known_run, f"unknown keys in [run]: {sorted(set(run) - known_run)}; known: {sorted(known_run)}")
    if out_override is not None:
        run["out"] = out_override
    require("out" in run, "[run] needs `out` (the trace directory), or pass --out")
    require("mechanism" in data, "the config needs a [mechanism] table with a `type`")
    if "deltas" in run:
        run["deltas"] = tuple(run["deltas"])
    return RunConfig(mechanism=dict(data["mechanism"]), models=_table(data, "models", ModelsConfig),
                     data=_table(data, "data", DataConfig), **run)


def load_config(path: str | Path, out_override: str | None = None) -> RunConfig:
    path = Path(path)
    require(path.exists(), f"config file does not exist: {path}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: invalid TOML ({error})") from None
    return config_from_dict(data, out_override)
