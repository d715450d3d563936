"""Run configuration (TOML), validated before anything is written. Every key: docs/config.md;
runnable examples: examples/.

    [run]
    out = "runs/adapmixed"      # trace directory
    queries = 1024
    seed = 0
    replay_payload = true       # keep the logits seen (exact replay; small runs)
    replay_payload_format = "bounded"  # voting runs: each teacher's top-k race entries, not its logits
    replay_top_k = 4            # race entries kept per teacher and step (bounded voting payload)
    deltas = [1e-5]
    relation = "add_or_remove_one"  # the claimed neighbouring relation: add_or_remove_one | remove_one | add_one

    [mechanism]                 # type = public | ensemble | pmixed | adapmixed | voting, plus its parameters
                                # (voting: votes, aggregator, threshold, ...; docs/hotpate.md)
    type = "adapmixed"
    alpha = 18.0
    beta = 0.2
    ...

    [models]                    # either the embedded default ...
    embedded = true
    teachers = 8
    # ... or your own checkpoints (local directories or hub names):
    # public = "path/or/name"; teacher_paths = ["t0", "t1"]; teacher_kind = "full" | "lora"; tokenizer = "..."
    # ... or in-context teachers: teacher_kind = "icl" (embedded, or public + icl_examples = "examples.json")
    device = "cpu"              # or "cuda"

    [budget]                    # optional: a privacy filter (docs/config.md)
    epsilon = 8.0
    delta = 1e-5

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
from typing import Iterable

import math
import numpy as np
import numpy.typing as npt
import re

from dpledger.accounting.errors import require, require_in_open, require_int_at_least
from dpledger.accounting.orders import default_orders
from dpledger.accounting.relation import NeighbouringRelation, neighbouring_relation
from dpledger.accounting.safe_files import read_bytes
from dpledger.decoding.mechanism_types import MECHANISM_TYPES, unknown_type_message
from dpledger.mechanisms.calibration import MAX_QUERIES

SEED_LIMIT = 2 ** 63
"""run.seed is in [0, 2^63): TOML integers are signed 64-bit (TOML 1.0), and the trace records the
seed for the audit, which reads it back as one."""
MAX_ORDER = 1024.0
"""The largest Renyi order a run config may name (mechanism.alpha, budget.order): the largest order of
the default grid (dp-accounting's), and of the range in which the kernels' log-space divergences are
checked against mpmath (tests/test_differential.py). Far above it they lose every digit: measured,
AdaPMixED's leave-one-out divergences are NaN from alpha = 1e12, PMixED's from 1e20, and alpha = 1e308
overflowed the grid itself."""
PAYLOAD_FORMATS = ("bounded", "logits")
"""run.replay_payload_format's values: a voting run's bounded vote payload, or every model's logits."""
MAX_TEACHERS = 512
"""The largest ensemble a run config may name (models.teachers). The private-decoding literature uses
at most a few hundred teachers (Flemings et al. 2024, Table 4: N = 100), and every block holds N + 1
next-token distributions per position: (N + 1) x block_size x vocabulary floats, 13 GB at N = 512, 128
positions and GPT-2's 50,257 tokens. The embedded default trains one model per teacher and writes
nothing until all are trained (N = 100,000 ran 300 s at 1 GB before failing)."""

# [mechanism] numeric keys and their ranges, as docs/config.md states them: (low, high, low_open, high_open)
_MECHANISM_RANGES = {
    "alpha": (1.0, MAX_ORDER, True, False),
    "beta": (0.0, math.inf, True, True),
    "sample_rate": (0.0, 1.0, False, False),
    "lam": (0.0, 1.0, False, False),
    "sigma": (0.0, math.inf, True, True),
    "sigma_threshold": (0.0, math.inf, True, True),
    "threshold": (-math.inf, math.inf, True, True),
    "gamma": (1.0, math.inf, False, True),
    "top_k": (1.0, math.inf, False, True),
}


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    """The range as words: "a number > 1 and <= 1024", "a number in [0, 1]"."""
    if math.isinf(low) and math.isinf(high):
        return "a finite number"
    if math.isinf(high):
        return f"a finite number {'>' if low_open else '>='} {low:g}"
    return f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def _check_mechanism_values(mechanism: dict) -> None:
    """Every numeric [mechanism] value finite and in the range docs/config.md states (types are the
    runner's to check; a value of another type is left to it)."""
    for key, (low, high, low_open, high_open) in _MECHANISM_RANGES.items():
        value = mechanism.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        inside = (math.isfinite(value) and (low < value if low_open else low <= value)
                  and (value < high if high_open else value <= high))
        reason = " (the largest order the kernels are checked at: docs/config.md)" if key == "alpha" else ""
        require(inside, f"mechanism.{key} must be {_interval(low, high, low_open, high_open)}{reason}, got {value!r}")


def describe_orders(orders: Iterable[float]) -> str:
    """A grid of orders in few words: runs of 4 or more equally spaced orders as "a to b by s", e.g.
    "1.1 to 10.9 by 0.1, 11 to 63 by 1, 128, 256, 512, 1024".

    Args:
        orders: Renyi orders in increasing order.

    Returns:
        The description, the orders formatted with :g.
    """
    values = [float(v) for v in orders]
    parts, start = [], 0
    while start < len(values):
        end = start + 1
        if end < len(values):
            step = round(values[end] - values[start], 10)
            while end + 1 < len(values) and round(values[end + 1] - values[end], 10) == step:
                end += 1
        if end - start >= 3:
            parts.append(f"{values[start]:g} to {values[end]:g} by {step:g}")
            start = end + 1
        else:
            parts.append(f"{values[start]:g}")
            start += 1
    return ", ".join(parts)


def require_on_grid(name: str, order: float, orders: npt.ArrayLike) -> float:
    """The order of `orders` that `order` names (within 1e-9); ValueError naming the value, the grid
    (compactly) and the nearest orders otherwise.

    Args:
        name: the setting that gave the order, for the message ("budget.order").
        order: the order asked for.
        orders: the run's grid of orders, increasing.

    Returns:
        The grid's order within 1e-9 of `order` (the first such).

    Raises:
        ValueError: if no order of the grid is within 1e-9 of `order`.
    """
    grid = np.asarray(orders, dtype=np.float64)
    close = np.flatnonzero(np.isclose(grid, order, rtol=0, atol=1e-9))
    if close.size:
        return float(grid[close[0]])
    above = int(np.searchsorted(grid, order))
    nearest = [f"{grid[i]:g}" for i in (above - 1, above) if 0 <= i < grid.size]
    raise ValueError(f"{name} = {order:g} is not on the run's order grid ({describe_orders(grid)}); the nearest: "
                     f"{' and '.join(nearest)}")


@dataclass(frozen=True)
class ModelsConfig:
    """The [models] table: the embedded default, or a public model and teachers (full models, LoRA
    adapters or in-context prompts), the tokenizer and the device (docs/config.md)."""

    embedded: bool = True
    teachers: int = 8
    public: str | None = None
    teacher_paths: tuple[str, ...] = ()
    teacher_kind: str = "full"
    tokenizer: str | None = None
    device: str = "cpu"  # where the models run ("cuda" on a GPU machine); mechanisms run on the CPU
    icl_examples: str | None = None  # teacher_kind = "icl" with your own public model: JSON, N lists of examples
    icl_prompt_tokens: int = 48  # teacher_kind = "icl": each teacher prompt's token budget (dpledger.decoding.icl)


@dataclass(frozen=True)
class DataConfig:
    """The [data] table: teacher-forced decoding of a text in blocks, or free generation from
    prompts (docs/config.md)."""

    stream: str = "teacher-forced"
    text: str | None = None
    block_size: int = 128
    prompts: tuple[str, ...] = ()
    max_new_tokens: int = 64


@dataclass(frozen=True)
class BudgetConfig:
    """A privacy filter for the run (dpledger.accounting.budget.RenyiFilter): before each private answer,
    the step's charge at one order must fit the RDP budget of (epsilon, delta); a step that does not
    fit is answered by the public model at no cost."""

    epsilon: float
    delta: float = 1e-5
    order: float | None = None  # the filter's order; default: the order that affords the most steps
    data_dependent: bool = False  # charge the filter the data-dependent losses (leaks; Redberg et al. 2023)


@dataclass(frozen=True)
class RunConfig:
    """A run's configuration: the [run] table's keys, the [mechanism] table as given, and the
    [models], [data] and [budget] tables; every value is checked when it is built (docs/config.md)."""

    out: str
    mechanism: dict
    models: ModelsConfig = field(default_factory=ModelsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    queries: int = 1024
    seed: int = 0
    replay_payload: bool = True
    replay_payload_format: str = "bounded"
    """"bounded": a voting run keeps the public logits and each teacher's replay_top_k highest race
    entries (dpledger.decoding.vote_payload); "logits": every model's logits. Runs of the other
    mechanisms always keep the logits."""
    replay_top_k: int = 4
    deltas: tuple[float, ...] = (1e-5,)
    relation: str = "add_or_remove_one"
    """The neighbouring relation the run claims; the mechanism charges what covers it and the audit
    FAILs a total that does not (dpledger.accounting.relation)."""
    budget: BudgetConfig | None = None

    def __post_init__(self) -> None:
        # mixing mechanisms' bounds are for adding or removing a teacher; a vote histogram's bounds
        # cover any one vote moved, so voting runs may also claim replace-one
        voting = isinstance(self.mechanism, dict) and self.mechanism.get("type") == "voting"
        require(voting or neighbouring_relation(self.relation) is not NeighbouringRelation.REPLACE_ONE,
                f"relation must be one of ['add_or_remove_one', 'remove_one', 'add_one'] for a mixing mechanism "
                f"(replace_one is for type = \"voting\"), got {self.relation!r}")
        require(isinstance(self.mechanism, dict) and self.mechanism.get("type") in MECHANISM_TYPES,
                unknown_type_message(self.mechanism.get("type") if isinstance(self.mechanism, dict) else None))
        for name, value in (("run.queries", self.queries), ("run.seed", self.seed),
                            ("models.teachers", self.models.teachers), ("data.block_size", self.data.block_size),
                            ("data.max_new_tokens", self.data.max_new_tokens)):
            _check_type(name, value, int)
        _check_type("run.replay_payload", self.replay_payload, bool)
        _check_type("run.replay_payload_format", self.replay_payload_format, str)
        require(self.replay_payload_format in PAYLOAD_FORMATS,
                f"run.replay_payload_format must be one of {list(PAYLOAD_FORMATS)}, got {self.replay_payload_format!r}")
        _check_type("run.replay_top_k", self.replay_top_k, int)
        require(self.replay_top_k >= 2, f"run.replay_top_k must be an integer >= 2 (the vote and the runner-up that "
                                        f"certifies it), got {self.replay_top_k}")
        _check_type("models.embedded", self.models.embedded, bool)
        require_int_at_least("queries", self.queries, 1)
        require(self.queries <= MAX_QUERIES, f"run.queries must be at most 2^53 = {MAX_QUERIES} (exact in double "
                                             f"precision), got {self.queries}")
        require(0 <= self.seed < SEED_LIMIT, f"run.seed must be in [0, 2^63) (a signed 64-bit integer, as TOML and "
                                             f"the trace store it), got {self.seed}")
        require(1 <= self.models.teachers <= MAX_TEACHERS,
                f"models.teachers must be in [1, {MAX_TEACHERS}] (each block holds N + 1 next-token distributions per "
                f"position; docs/config.md), got {self.models.teachers}")
        if isinstance(self.mechanism, dict):
            _check_mechanism_values(self.mechanism)
        require(isinstance(self.deltas, (tuple, list)), f"run.deltas must be a list of numbers, got {self.deltas!r}")
        require(len(self.deltas) >= 1, "run.deltas must list at least one delta, got []")
        for delta in self.deltas:
            require_in_open("delta", delta, 0.0, 1.0)
        models = self.models
        _check_type("models.icl_prompt_tokens", models.icl_prompt_tokens, int)
        require_int_at_least("models.icl_prompt_tokens", models.icl_prompt_tokens, 1)
        require(models.teacher_kind in ("full", "lora", "icl"),
                f"teacher_kind must be 'full', 'lora' or 'icl', got {models.teacher_kind!r}")
        require(models.teacher_kind == "icl" or models.icl_examples is None,
                f"models.icl_examples is for teacher_kind = 'icl', got teacher_kind = {models.teacher_kind!r}")
        if models.teacher_kind == "icl":  # in-context teachers (Hot PATE): prompts to the public model, no weights
            require_int_at_least("models.teachers", models.teachers, 1)
            require(not models.teacher_paths, "models.teacher_paths must be empty with teacher_kind = 'icl' (the "
                                              "teachers are prompts to the public model)")
            if models.embedded:
                require(models.public is None and models.icl_examples is None,
                        "models.embedded = true cannot be combined with models.public / models.icl_examples "
                        "(the embedded corpus's private records are the examples)")
            else:
                require(models.public is not None, "models.public is required when models.embedded = false")
                require(models.icl_examples is not None,
                        "models.icl_examples (a JSON file: a list of N lists of examples) is required with "
                        "teacher_kind = 'icl' and models.embedded = false")
        elif models.embedded:
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
        require(data.text is None or isinstance(data.text, str), f"data.text must be a string, got {data.text!r}")
        require(_device_ok(models.device), f"models.device must be 'cpu', 'cuda' or 'cuda:N', got {models.device!r}")
        if self.budget is not None:
            budget = self.budget
            require(budget.epsilon > 0 and budget.epsilon != float("inf"),
                    f"budget.epsilon must be a finite number > 0, got {budget.epsilon!r}")
            require_in_open("budget.delta", budget.delta, 0.0, 1.0)
            require(budget.order is None or 1 < budget.order < float("inf"),
                    f"budget.order must be a finite number > 1, got {budget.order!r}")
            if budget.order is not None:
                alpha = self.mechanism.get("alpha")
                runs_at = [alpha] if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) else []
                require_on_grid("budget.order", budget.order, default_orders(*runs_at))

    def to_dict(self) -> dict:
        """The config as plain data; `budget` only when set (runs without one keep their manifests).

        Returns:
            The fields as nested dicts (dataclasses.asdict), without `budget` when it is None.
        """
        values = asdict(self)
        if values["budget"] is None:
            del values["budget"]
        return values

    def fingerprint(self) -> str:
        """Hash of everything that determines the run's output (not `out`): resume must match it.

        Returns:
            sha256 (64 hex digits) of the config's JSON without `out` (and, for teachers that are not
            in-context, without the in-context keys at their defaults).
        """
        payload = {k: v for k, v in self.to_dict().items() if k != "out"}
        # the payload's format changes what is kept beside the records, never the records: left out, so
        # runs written before these keys existed keep their hash (resume checks the manifest's format)
        payload.pop("replay_payload_format")
        payload.pop("replay_top_k")
        # the in-context keys at their defaults are left out, so runs written before they existed keep their hash
        defaults = {"icl_examples": None, "icl_prompt_tokens": 48}
        if self.models.teacher_kind != "icl":
            payload["models"] = {k: v for k, v in payload["models"].items() if defaults.get(k, ...) != v}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


_SCHEMA: dict[str, dict[str, type | list[type]]] = {
    "run": {"out": str, "queries": int, "seed": int, "replay_payload": bool, "replay_payload_format": str,
            "replay_top_k": int, "deltas": [float], "relation": str},
    "models": {"embedded": bool, "teachers": int, "public": str, "teacher_paths": [str], "teacher_kind": str,
               "tokenizer": str, "device": str, "icl_examples": str, "icl_prompt_tokens": int},
    "data": {"stream": str, "text": str, "block_size": int, "prompts": [str], "max_new_tokens": int},
    "budget": {"epsilon": float, "delta": float, "order": float, "data_dependent": bool},
}
_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", float: "a number"}
_LIST_NAMES = {str: "strings", int: "integers", bool: "true/false values", float: "numbers"}


def _check_type(where: str, value: object, kind: type | list[type]) -> None:
    """TOML values as the schema says, without coercion: 32.0 is not an integer, "0.2" not a
    number, a string not a list (it would be split into characters)."""
    if isinstance(kind, list):
        if not isinstance(value, list):
            raise ValueError(f"{where} must be a list of {_LIST_NAMES[kind[0]]}, got {value!r}")
        for index, item in enumerate(value):
            _check_type(f"{where}[{index}]", item, kind[0])
        return
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    require(ok, f"{where} must be {_TYPE_NAMES[kind]}, got {value!r}")


def _device_ok(device: object) -> bool:
    return isinstance(device, str) and re.fullmatch(r"cpu|cuda(:\d+)?", device) is not None


def _table(data: dict, name: str) -> dict:
    table = data.get(name, {})
    require(isinstance(table, dict), f"[{name}] must be a table, got {table!r}")
    require(all(isinstance(key, str) for key in table), f"[{name}] keys must be strings, got {list(table)!r}")
    schema = _SCHEMA[name]
    unknown = sorted(set(table) - set(schema))
    require(not unknown, f"unknown keys in [{name}]: {unknown}; known: {sorted(schema)}")
    for key, value in table.items():
        _check_type(f"{name}.{key}", value, schema[key])
    return {k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}


def config_from_dict(data: dict, out_override: str | None = None) -> RunConfig:
    """A RunConfig from parsed TOML; ValueError naming the table, key, value and rule.

    Args:
        data: the parsed TOML: the run, mechanism, models, data and budget tables.
        out_override: replaces [run] out (--out); None: the config's own.

    Returns:
        The checked configuration.

    Raises:
        ValueError: for an unknown table or key, a value of the wrong type, a missing required key,
            or a value the configuration's rules refuse.
    """
    require(isinstance(data, dict), f"a config must be a table of tables, got {data!r}")
    require(all(isinstance(key, str) for key in data), f"config table names must be strings, got {list(data)!r}")
    unknown = sorted(set(data) - {"run", "mechanism", "models", "data", "budget"})
    require(not unknown, f"unknown tables in config: {unknown}; known: run, mechanism, models, data, budget")
    run = _table(data, "run")
    if out_override is not None:
        _check_type("--out", out_override, str)
        run["out"] = out_override
    require("out" in run, "[run] needs `out` (the trace directory), or pass --out")
    if isinstance(run.get("relation"), str):  # reports spell relations with hyphens; both name the same one
        run["relation"] = run["relation"].replace("-", "_")
    require(len(run.get("deltas", (1e-5,))) >= 1, "run.deltas must list at least one delta, got []")
    require("mechanism" in data, "the config needs a [mechanism] table with a `type`")
    mechanism = data["mechanism"]
    require(isinstance(mechanism, dict), f"[mechanism] must be a table, got {mechanism!r}")
    require(all(isinstance(key, str) for key in mechanism), f"[mechanism] keys must be strings, got {list(mechanism)!r}")
    require(isinstance(mechanism.get("type"), str), f"mechanism.type must be a string, got {mechanism.get('type')!r}")
    for key, value in mechanism.items():  # TOML scalars: a nested value or a numpy scalar has no place here
        require(type(value) in (bool, int, float, str),
                f"mechanism.{key} must be a number, a string or true/false, got {value!r}")
    budget = None
    if "budget" in data:
        table = _table(data, "budget")
        require("epsilon" in table, "[budget] needs `epsilon` (and `delta`, default 1e-5)")
        budget = BudgetConfig(**table)
    return RunConfig(mechanism=dict(mechanism), models=ModelsConfig(**_table(data, "models")),
                     data=DataConfig(**_table(data, "data")), budget=budget, **run)


TEXT_FILE_LIMIT = 2 ** 31
"""The largest text file a run reads (its data text, examples): 2 GiB, held in memory."""
CONFIG_FILE_LIMIT = 2 ** 24
"""The largest run config read (16 MiB; a config is a few kB)."""


def read_text_file(path: str | Path, what: str, limit: int = TEXT_FILE_LIMIT) -> str:
    """A UTF-8 text file's content: a regular file (never a FIFO or a device, which would block) of
    at most `limit` bytes (dpledger.accounting.safe_files); ValueError naming `what`, the path and the problem.

    Args:
        path: the file (a link is followed).
        what: what the file is, for the messages ("data.text", "config").
        limit: the most bytes read.

    Returns:
        The decoded text.

    Raises:
        ValueError: if the file does not exist, is a directory or not a regular file, exceeds
            `limit`, cannot be read or is not UTF-8.
    """
    path = Path(path)
    require(path.exists(), f"{what} file does not exist: {path}")
    require(not path.is_dir(), f"{what} must be a file, got the directory {path}")
    try:
        data = read_bytes(path, limit, follow=True, what=what)
    except ValueError as error:  # not a regular file, or too large: the message names the file
        raise ValueError(f"{what}: {' '.join(str(error).split())}") from None
    except OSError as error:
        raise ValueError(f"{what} {path} cannot be read: {error.strerror or error}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{what} {path} is not UTF-8 text ({error.reason} at byte {error.start})") from None


def parse_override(text: str) -> tuple[str, str, object]:
    """`TABLE.KEY=VALUE` -> (table, key, value): VALUE is read as a TOML value (`0.05`, `true`,
    `[1e-5, 1e-6]`, `"lora"`), or taken as a string when it is not one (`--set models.public=gpt2`).

    Args:
        text: one --set argument.

    Returns:
        (table, key, value).

    Raises:
        ValueError: not of the form TABLE.KEY=VALUE.
    """
    name, separator, raw = text.partition("=")
    table, dot, key = name.strip().partition(".")
    if not separator or not dot or not table or not key or "." in key:
        raise ValueError(f"--set takes TABLE.KEY=VALUE (e.g. mechanism.beta=0.05), got {text!r}")
    try:
        value = tomllib.loads(f"value = {raw.strip()}")["value"]
    except (tomllib.TOMLDecodeError, RecursionError):
        value = raw.strip()
    return table, key, value


def load_config(path: str | Path, out_override: str | None = None, overrides: tuple[str, ...] = ()) -> RunConfig:
    """The run configuration in the TOML file at `path`, with [run] out replaced by `out_override` and
    each `TABLE.KEY=VALUE` of `overrides` applied (parse_override) before anything is checked.

    Args:
        path: the TOML file.
        out_override: replaces [run] out (--out); None: the config's own.
        overrides: --set arguments, applied in order.

    Returns:
        The checked configuration (config_from_dict).

    Raises:
        ValueError: an unreadable file, invalid TOML, a malformed override or an invalid configuration.
    """
    text = read_text_file(path, "config", CONFIG_FILE_LIMIT)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: invalid TOML ({error})") from None
    except RecursionError:  # tomllib recurses once per nested array or table; a config nests three deep
        raise ValueError(f"{path}: arrays or tables nest deeper than Python's recursion limit; a run config nests "
                         "three deep") from None
    for override in overrides:
        table, key, value = parse_override(override)
        section = data.setdefault(table, {})
        if not isinstance(section, dict):
            raise ValueError(f"--set {override}: {table} is not a table in {path}")
        section[key] = value
    return config_from_dict(data, out_override)
