"""Strict JSON (RFC 8259) for every file and --json output dpledger writes.

JSON has no Infinity or NaN, and dpledger's numbers use +inf for "no guarantee". A non-finite
float is written as null, and its JSON Pointer (RFC 6901) is listed in the object's top-level
`nulls` map with the reason ("+inf: no guarantee (an unbounded privacy loss)"), so any strict
parser reads the file and `loads_json` restores the exact value.
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable, TypeAlias

import numpy as np

from dpledger.accounting.errors import require

JsonObject: TypeAlias = dict[str, Any]
"""A JSON object as json.loads returns it (its values are whatever the text held): the functions that
read one check each field's type where they read it, and refuse a malformed record with ValueError."""
NULLS = "nulls"
MAX_BYTES = 64 * 2 ** 20
"""A JSON file dpledger reads (a run's manifest, ledger, final record and audit, an event file) is
read up to this size; dpledger's own are a few kB to a few MB."""
MAX_DEPTH = 100
"""Arrays and objects nest at most this deep in a file dpledger reads (its own files nest under 10): a
deeper file is refused before parsing, which would otherwise recurse until Python's limit."""
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_NON_FINITE_REASONS = {"+inf": "+inf: no guarantee (an unbounded privacy loss)", "-inf": "-inf", "nan": "NaN: undefined"}


def _pointer_token(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _nulled(value: object, pointer: str, nulls: dict[str, str]) -> object:
    """value with every non-finite float replaced by None, each recorded in `nulls` by pointer."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, dict):
        return {key: _nulled(item, f"{pointer}/{_pointer_token(key)}", nulls) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nulled(item, f"{pointer}/{index}", nulls) for index, item in enumerate(value)]
    if isinstance(value, (float, np.floating)) and not np.isfinite(value):
        nulls[pointer] = _NON_FINITE_REASONS["nan" if np.isnan(value) else "+inf" if value > 0 else "-inf"]
        return None
    return value


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _restored(value: JsonObject, nulls: JsonObject, where: str) -> JsonObject:
    """`value` with the non-finite floats its NULLS map names put back (the inverse of strict_json_text)."""
    values = {reason: number for reason, number in
              zip(_NON_FINITE_REASONS.values(), (float("inf"), float("-inf"), float("nan")))}
    for pointer, reason in nulls.items():
        tokens = [_unescape(token) for token in str(pointer).split("/")[1:]]
        require(bool(tokens) and reason in values, f"{where}: bad {NULLS} entry {pointer!r}: {reason!r}")
        parent: Any = value  # any JSON value: the lookups below refuse what it cannot index
        try:
            for token in tokens[:-1]:
                parent = parent[int(token)] if isinstance(parent, list) else parent[token]
            last = int(tokens[-1]) if isinstance(parent, list) else tokens[-1]
            current = parent[last]
        except (KeyError, IndexError, ValueError, TypeError):
            raise ValueError(f"{where}: {NULLS} names {pointer!r}, which is not in the file") from None
        require(current is None, f"{where}: {NULLS} names {pointer!r}, which is not null")
        parent[last] = values[reason]
    return value


def _nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in `text` (brackets inside strings do not count), counted
    without recursion, a slice at a time (memory stays small for a large file)."""
    skeleton = np.frombuffer(_STRING.sub("", text).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    opening, closing = np.frombuffer(b"[{", dtype=np.uint8), np.frombuffer(b"]}", dtype=np.uint8)
    depth = deepest = 0
    for start in range(0, skeleton.size, 1 << 22):
        piece = skeleton[start:start + (1 << 22)]
        steps = np.isin(piece, opening).astype(np.int64) - np.isin(piece, closing)
        running = depth + np.cumsum(steps)
        deepest = max(deepest, int(running.max(initial=0)))
        depth = int(running[-1]) if running.size else depth
    return deepest


def _unique_keys(where: str) -> Callable[[list[tuple[str, Any]]], JsonObject]:
    """An object_pairs_hook refusing an object that names a key twice: readers that keep the first
    value and readers that keep the last would see different files."""
    def build(pairs: list[tuple[str, Any]]) -> JsonObject:
        value = dict(pairs)
        if len(value) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:  # stops at the first key named twice
                if key in seen:
                    break
                seen.add(key)
            raise ValueError(f"{where}: the key {key!r} appears twice in one object (readers that keep the first "
                             "value and readers that keep the last would disagree)")
        return value
    return build


def parse_json(text: str, where: str = "JSON text") -> Any:  # as json.loads: any JSON value
    """The value `text` holds, as json.loads reads it, but ValueError naming `where` for text nested
    deeper than MAX_DEPTH or an object with a duplicate key (json.JSONDecodeError, a ValueError, for
    text that is not JSON). For JSON somebody else wrote (user input: JSONL records, examples).

    Args:
        text: the JSON text.
        where: what the text is (a file name, "line 3 of events.jsonl"), for the error messages.

    Returns:
        The parsed value: a dict, list, str, int, float, bool or None (Infinity and NaN literals read
        as floats, as json.loads reads them).

    Raises:
        ValueError: nesting deeper than MAX_DEPTH, a key repeated in one object, or text that is not
            JSON (json.JSONDecodeError).
    """
    depth = _nesting_depth(text)
    if depth > MAX_DEPTH:
        raise ValueError(f"{where}: arrays and objects nest {depth} deep, more than the {MAX_DEPTH} a file dpledger "
                         "reads may")
    return json.loads(text, object_pairs_hook=_unique_keys(where))


def loads_json(text: str, where: str = "JSON text") -> Any:  # as json.loads: any JSON value
    """A value parsed from `text` (parse_json's checks), non-finite floats restored from its NULLS map
    (strict_json_text's inverse). Files written before strict JSON (with Infinity literals) read the
    same.

    Args:
        text: the JSON text, as strict_json_text writes it.
        where: what the text is, for the error messages.

    Returns:
        The parsed value; for an object with a NULLS map, the object without it, each null it names
        replaced by +inf, -inf or NaN.

    Raises:
        ValueError: parse_json refuses the text, or the NULLS map names an entry that is not there,
            is not null, or gives an unknown reason.
    """
    value = parse_json(text, where)
    if isinstance(value, dict) and isinstance(value.get(NULLS), dict):
        value = _restored(value, value.pop(NULLS), where)
    return value


def strict_json_text(payload: JsonObject, default: Callable[[Any], Any] | None = None, sort_keys: bool = True,
                     indent: int | None = 2) -> str:
    """Strict JSON text of `payload`: non-finite floats become null, each listed under NULLS with
    its reason; `default` serialises other types as in json.dumps.

    Args:
        payload: the object to write; numpy arrays in it are written as lists.
        default: called on a value json cannot serialise, returns one it can (as json.dumps' default).
        sort_keys: write each object's keys sorted.
        indent: spaces per nesting level; None for one line.

    Returns:
        JSON text with no NaN or Infinity literal, readable by any strict parser.

    Raises:
        ValueError: payload is not a dict, or already uses the reserved key NULLS.
        TypeError: a value that neither json nor `default` can serialise.
    """
    require(isinstance(payload, dict), f"a JSON payload must be a dict, got {type(payload).__name__}")
    require(NULLS not in payload, f"a JSON payload may not use the reserved key {NULLS!r}")
    nulls: dict[str, str] = {}
    # what _nulled(payload, "", nulls) gives, built here so that its type is a dict (_nulled's is object)
    body = {key: _nulled(item, f"/{_pointer_token(key)}", nulls) for key, item in payload.items()}
    if nulls:
        body[NULLS] = nulls
    return json.dumps(body, indent=indent, sort_keys=sort_keys, default=default, allow_nan=False)
