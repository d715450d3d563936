"""Your own teachers: read private text, split it into N disjoint shards, fine-tune one teacher per
shard from a public base model (full fine-tune or LoRA adapters), resumably.

The privacy unit. PATE-style ensembles (Papernot et al. 2017) and PMixED (Flemings et al. 2024)
bound what one *teacher* changes: replacing one shard changes one teacher. A guarantee about a
person therefore needs all of that person's records in one shard. The shards here are made of
*units*, each of which lies wholly in one shard:

* a directory of .txt files: each file is one unit (its documents are split on blank lines);
* one text file: each document (split on blank lines, or on `separator`) is one unit;
* JSONL: each record is one unit, or, with `partition_key`, all records with the same key value
  are one unit (`--partition-key user_id`: a user's data is in exactly one teacher, so the
  per-teacher guarantee is a per-user guarantee).

Units are ordered by sha256(seed, key) and dealt round-robin to the shards: deterministic for a
seed, balanced in units, never an empty shard (N larger than the number of units is refused).

`train_teachers` writes OUT/teacher-000 ... OUT/teacher-(N-1) in the layout `decode` loads
(`teacher_kind = "full"`: a saved model; "lora": a peft adapter directory) and OUT/teachers.json.
Each teacher is trained in a temporary directory and renamed into place when complete, so a re-run
skips the teachers already done and an interrupted run never leaves one that looks complete. The
manifest's fingerprint covers the shards, their token ids (hence the tokenizer), the public
weights and the hyper-parameters; a re-run into the same OUT with any of them changed is refused
unless `overwrite`.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import numpy.typing as npt
import torch
from tqdm.auto import tqdm

from dpledger.accounting import safe_files
from dpledger.accounting.errors import require
from dpledger.accounting.strict_json import MAX_BYTES, loads_json, parse_json
from dpledger.decoding.recipe import TeacherTraining, fine_tune_teacher, perplexity
from dpledger.decoding.trace import atomic_write_json
from dpledger.decoding.ensemble import load_causal_lm, load_tokenizer, require_matching_tokenizer
from dpledger.decoding.recipe import lora_config

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MANIFEST = "teachers.json"
TEACHER_INFO = "dpledger-teacher.json"  # inside each teacher directory, written before the rename
MANIFEST_FORMAT = 1
_TEACHER_DIR = re.compile(r"^(teacher-\d{3,}|\.teacher-\d{3,}\.partial)$")


def teacher_dir_name(index: int) -> str:
    """Teacher `index`'s directory name in OUT.

    Args:
        index: the teacher's index (0-based).

    Returns:
        "teacher-NNN" (at least three digits).
    """
    return f"teacher-{index:03d}"


@dataclass(frozen=True)
class Unit:
    """The privacy unit: documents that always go to the same shard."""

    key: str
    documents: tuple[str, ...]


# ---------------------------------------------------------------------------------------------- reading


def split_documents(text: str, separator: str | None = None) -> list[str]:
    """Documents of `text`: split on blank lines (separator None) or on the literal `separator`;
    surrounding whitespace stripped, empty documents dropped.

    Args:
        text: the input text.
        separator: a literal separator; None: blank lines (lines of whitespace only count as blank).

    Returns:
        The documents, in order.
    """
    parts = re.split(r"\n[ \t\r\f\v]*\n", text) if separator is None else text.split(separator)
    return [part.strip() for part in parts if part.strip()]


PRIVATE_TEXT_LIMIT = 2 ** 31
"""The largest private input file `dpledger teachers` reads (2 GiB): the shards are held in memory."""


def read_input_text(path: Path, flag: str) -> str:
    """A file the user named as input: a regular file (never a FIFO or a device, which would block)
    of at most PRIVATE_TEXT_LIMIT bytes, UTF-8; one-line ValueError naming `flag` otherwise.

    Args:
        path: the file (a link is followed).
        flag: the flag or argument that named it, the start of the message ("INPUT", "--heldout").

    Returns:
        The file's text.

    Raises:
        ValueError: if the file is not a regular file, is too large or is not UTF-8.
    """
    try:
        return safe_files.read_text(path, PRIVATE_TEXT_LIMIT, follow=True, what="a private input file")
    except ValueError as error:  # UnsafeFileError, or not UTF-8: the message names the file
        raise ValueError(f"{flag} {' '.join(str(error).split())}") from None


def read_units(path: str | Path, fmt: str = "auto", separator: str | None = None, text_field: str = "text",
               partition_key: str | None = None) -> tuple[list[Unit], dict]:
    """The units of the private input at `path` and a description of how they were read.

    fmt: "dir" (a directory of .txt files, searched recursively; one unit per file), "text" (one
    file; one unit per document), "jsonl" (one record per line; one unit per record, or per value of
    `partition_key`), or "auto" (a directory, else .jsonl/.ndjson, else text).

    Args:
        path: the private input: a directory or a file.
        fmt: "auto", "dir", "text" or "jsonl", as above.
        separator: the documents' separator in text files; None: blank lines.
        text_field: the JSONL records' text field.
        partition_key: a JSONL field whose value groups records into one unit; None: one unit per record.

    Returns:
        (the non-empty units in input order, a description: path, format, separator, unit, counts
        and for JSONL the text field and partition key).

    Raises:
        ValueError: if the input does not exist or fits not its format, a flag is invalid, a JSONL
            line is not an object with a string text field (or lacks the partition key), or no
            document is left.
    """
    path = Path(path).expanduser()
    require(path.exists(), f"INPUT {path} does not exist")
    require(fmt in ("auto", "dir", "text", "jsonl"), f"--format {fmt!r}: must be auto, dir, text or jsonl")
    if fmt == "auto":
        fmt = "dir" if path.is_dir() else "jsonl" if path.suffix.lower() in (".jsonl", ".ndjson") else "text"
    require(separator is None or separator != "", "--separator '': must be a non-empty string")
    require(partition_key is None or fmt == "jsonl",
            f"--partition-key {partition_key!r}: only for JSONL input (INPUT {path} is read as {fmt})")
    if fmt == "dir":
        require(path.is_dir(), f"INPUT {path}: --format dir needs a directory")
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        require(bool(files), f"INPUT {path}: the directory holds no .txt files")
        units = [Unit(f"file:{p.relative_to(path).as_posix()}",
                      tuple(split_documents(read_input_text(p, "INPUT"), separator))) for p in files]
        units = [u for u in units if u.documents]
        unit_name = "file"
    elif fmt == "text":
        require(path.is_file(), f"INPUT {path}: --format text needs a file")
        documents = split_documents(read_input_text(path, "INPUT"), separator)
        units = [Unit(f"document:{i}", (doc,)) for i, doc in enumerate(documents)]
        unit_name = "document"
    else:
        require(path.is_file(), f"INPUT {path}: --format jsonl needs a file")
        groups: dict[str, list[str]] = {}
        order: list[str] = []
        for number, line in enumerate(read_input_text(path, "INPUT").splitlines(), start=1):
            if not line.strip():
                continue
            try:  # a duplicate key would put the record in the shard one reader sees and not another's
                record = parse_json(line, f"INPUT {path} line {number}")
            except json.JSONDecodeError as error:
                raise ValueError(f"INPUT {path} line {number}: not JSON ({error.msg})") from None
            require(isinstance(record, dict), f"INPUT {path} line {number}: a JSONL record must be an object")
            require(text_field in record, f"INPUT {path} line {number}: no {text_field!r} field (--text-field)")
            text = record[text_field]
            require(isinstance(text, str), f"INPUT {path} line {number}: field {text_field!r} must be a string, "
                                           f"got {type(text).__name__} (--text-field)")
            if partition_key is None:
                key = f"record:{number}"
            else:
                require(partition_key in record,
                        f"INPUT {path} line {number}: no {partition_key!r} field (--partition-key)")
                value = record[partition_key]
                require(value is not None and not isinstance(value, (dict, list)),
                        f"INPUT {path} line {number}: --partition-key {partition_key!r} must be a string or number, "
                        f"got {json.dumps(value)}")
                key = f"{partition_key}:{json.dumps(value)}"
            if key not in groups:
                groups[key] = []
                order.append(key)
            if text.strip():
                groups[key].append(text.strip())
        units = [Unit(key, tuple(groups[key])) for key in order if groups[key]]
        unit_name = "record" if partition_key is None else f"value of {partition_key!r}"
    require(bool(units), f"INPUT {path}: no non-empty documents")
    description = {"path": str(path), "format": fmt, "separator": separator or "blank lines", "unit": unit_name,
                   "units": len(units), "documents": sum(len(u.documents) for u in units)}
    if fmt == "jsonl":
        description.update(text_field=text_field, partition_key=partition_key)
    return units, description


def assign_shards(units: Sequence[Unit], teachers: int, seed: int = 0) -> list[list[Unit]]:
    """N disjoint shards covering `units`: units ordered by sha256(seed, key), dealt round-robin.

    Args:
        units: the privacy units, with distinct keys.
        teachers: the number of shards N, from 1 to the number of units.
        seed: seeds the order.

    Returns:
        N lists of units; shard i holds the units ranked i, i + N, i + 2N, ...

    Raises:
        ValueError: if N is out of range or two units share a key.
    """
    require(isinstance(teachers, int) and teachers >= 1, f"--teachers {teachers!r}: must be an integer >= 1")
    require(teachers <= len(units),
            f"--teachers {teachers}: must be at most the number of units ({len(units)}); every teacher needs at "
            "least one unit of its own")
    keys = [unit.key for unit in units]
    require(len(set(keys)) == len(keys), "unit keys must be distinct")
    ranked = sorted(units, key=lambda u: hashlib.sha256(f"{seed}\x00{u.key}".encode()).hexdigest())
    return [ranked[i::teachers] for i in range(teachers)]


# ---------------------------------------------------------------------------------------------- hashing


def documents_sha256(documents: Sequence[str]) -> str:
    """The sha256 of a shard's documents: each document's UTF-8 length (8 bytes) and bytes, in order.

    Args:
        documents: the shard's documents.

    Returns:
        The sha256 (64 hex digits).
    """
    digest = hashlib.sha256()
    for document in documents:
        data = document.encode()
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def state_sha256(model: torch.nn.Module) -> str:
    """sha256 over parameter names and raw bytes (any dtype).

    Args:
        model: the model; its state dict is read in name order, each tensor's dtype hashed too.

    Returns:
        The sha256 (64 hex digits).
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def encode_shard(tokenizer: PreTrainedTokenizerBase, documents: Sequence[str]) -> npt.NDArray[np.int64]:
    """Token ids of `documents`, each followed by the tokenizer's end-of-sequence token (if any); for
    the embedded tokenizer the same ids as dpledger.decoding.recipe.encode_documents.

    Args:
        tokenizer: the public model's tokenizer.
        documents: the shard's documents.

    Returns:
        The int64 ids.
    """
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for encoded in tokenizer(list(documents), add_special_tokens=False)["input_ids"]:
        ids.extend(encoded)
        if eos is not None:
            ids.append(eos)
    return np.asarray(ids, dtype=np.int64)


# ---------------------------------------------------------------------------------------------- training


def _fingerprint_parts(shards_sha: list[str], tokens_sha: str, public_sha: str, training: TeacherTraining) -> dict:
    return {"format": MANIFEST_FORMAT, "teachers": len(shards_sha), "shards": shards_sha, "tokens": tokens_sha,
            "public": public_sha, "hyper_parameters": training.to_dict()}


def _fingerprint(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _what_changed(old: dict, new: dict) -> str:
    old_parts = old.get("fingerprint_parts") or {}
    changed = []
    if old_parts.get("teachers") != new["teachers"]:
        changed.append(f"teachers {old_parts.get('teachers')} -> {new['teachers']}")
    elif old_parts.get("shards") != new["shards"]:
        changed.append("data")
    elif old_parts.get("tokens") != new["tokens"]:
        changed.append("tokenizer")
    if old_parts.get("public") != new["public"]:
        changed.append("public model")
    old_hyper = old_parts.get("hyper_parameters") or {}
    changed += [f"{k} {old_hyper.get(k)!r} -> {v!r}" for k, v in new["hyper_parameters"].items()
                if old_hyper.get(k) != v]
    return ", ".join(changed) or "manifest format"


def _clear(out: Path) -> None:
    """Remove what train_teachers wrote in `out` (teacher directories, manifest, decode.toml); an
    entry under a teacher directory's name that is a link is removed, never followed."""
    for entry in out.iterdir():
        if _TEACHER_DIR.match(entry.name):
            safe_files.remove_entry(entry)
    for name in (MANIFEST, "decode.toml"):
        (out / name).unlink(missing_ok=True)


def train_teachers(shards: Sequence[Sequence[str]], public_model: PreTrainedModel | str | Path,
                   tokenizer: PreTrainedTokenizerBase | str | Path, training: TeacherTraining, out: str | Path, *,
                   public_name: str, tokenizer_name: str, heldout_ids: npt.NDArray[np.int64] | None = None,
                   overwrite: bool = False, progress: bool = True, device: str | None = None,
                   input_description: dict | None = None, shard_units: Sequence[int] | None = None,
                   log: Callable[[str], None] | None = None) -> dict:
    """Fine-tune one teacher per shard (a list of documents) from `public_model` into OUT/teacher-NNN.

    public_model: a loaded causal LM (left unchanged) or a path / hub name; tokenizer: a tokenizer or
    a path. Every check runs before anything is written. Teachers already complete in `out` with the
    same fingerprint are kept (resume); a different fingerprint is refused unless `overwrite`.
    heldout_ids: token ids for each teacher's held-out perplexity (else only the training loss).
    Returns the manifest (also written to OUT/teachers.json).

    Args:
        shards: one list of documents per teacher.
        public_model: the public model, or its directory or hub name.
        tokenizer: the public model's tokenizer, or its directory or hub name.
        training: the teachers' hyper-parameters.
        out: the output directory (created).
        public_name: how the manifest names the public model.
        tokenizer_name: how the manifest names the tokenizer.
        heldout_ids: see above; None: no held-out perplexity.
        overwrite: replace teachers trained with other inputs.
        progress: show progress bars.
        device: move the public model there first; None: where it is.
        input_description: how the shards were read (read_units), recorded in the manifest.
        shard_units: each shard's number of units, recorded in the manifest.
        log: called with one line per teacher trained.

    Returns:
        The manifest: inputs, hashes, fingerprint, hyper-parameters, versions, each teacher's result
        (training loss and perplexity, held-out perplexity, seconds, whether resumed) and timings.

    Raises:
        ValueError: if a check fails before anything is written: no shard or an empty one, a model or
            tokenizer that cannot be loaded or do not match, seq_len beyond the context or a shard,
            LoRA targets not found, or OUT holding other teachers without `overwrite`.
        TypeError: if fine_tune_teacher does not return (model, loss).
    """
    say = log or (lambda message: None)
    started = time.time()
    out = Path(out)
    n = len(shards)
    require(n >= 1, "at least one shard is needed")
    require(all(len(shard) >= 1 for shard in shards), "every shard needs at least one document")
    if isinstance(tokenizer, (str, Path)):
        tokenizer = load_tokenizer(str(tokenizer), "--tokenizer")
    model = load_causal_lm(str(public_model)) if isinstance(public_model, (str, Path)) else public_model
    if device is not None:
        # transformers wraps PreTrainedModel.to in functools.wraps, whose type omits the bound self
        model = model.to(device)  # type: ignore[arg-type]
    positions = (getattr(model.config, "n_positions", None)
                 or getattr(model.config, "max_position_embeddings", None))
    require(positions is None or training.seq_len <= positions,
            f"--seq-len {training.seq_len}: must be at most the public model's context length {positions}")
    vocab = model.config.vocab_size
    require_matching_tokenizer(tokenizer, vocab, f"tokenizer {tokenizer_name}")

    if training.kind == "lora":
        lora_config(model, training)  # the target modules exist (checked before anything is written)
    shard_ids = [encode_shard(tokenizer, shard) for shard in shards]
    for index, ids in enumerate(shard_ids):
        require(ids.size > training.seq_len,
                f"--seq-len {training.seq_len}: shard {index} has only {ids.size} tokens, it needs more than "
                f"{training.seq_len}: use fewer teachers (--teachers) or a shorter --seq-len")
    if heldout_ids is not None:
        require(heldout_ids.size > training.seq_len,
                f"--heldout: {heldout_ids.size} tokens, it needs more than --seq-len {training.seq_len}")
    shards_sha = [documents_sha256(shard) for shard in shards]
    tokens = hashlib.sha256()
    for ids in shard_ids:
        tokens.update(len(ids).to_bytes(8, "little"))
        tokens.update(ids.tobytes())
    parts = _fingerprint_parts(shards_sha, tokens.hexdigest(), state_sha256(model), training)
    fingerprint = _fingerprint(parts)

    # resume, refuse, or overwrite: decided before anything is written
    manifest_path = out / MANIFEST
    require(not out.exists() or out.is_dir(), f"--out {out}: exists and is not a directory")
    if manifest_path.exists():
        try:
            old = loads_json(safe_files.read_text(manifest_path, MAX_BYTES, what="a teachers manifest"),
                             str(manifest_path))
        except ValueError:  # not JSON, a link, a FIFO, a nulls map that does not fit: not our manifest
            old = {}
        if old.get("fingerprint") != fingerprint:
            require(overwrite, f"--out {out} holds teachers trained with other inputs (changed: "
                               f"{_what_changed(old, parts)}); use another --out, or --overwrite to replace them")
            _clear(out)
    elif out.exists() and any(_TEACHER_DIR.match(entry.name) for entry in out.iterdir()):
        require(overwrite, f"--out {out} holds teacher directories but no {MANIFEST}; use another --out, or "
                           "--overwrite to replace them")
        _clear(out)
    out.mkdir(parents=True, exist_ok=True)

    import peft
    import transformers

    shard_summary = [{"index": i, "documents": len(shard), "characters": sum(len(d) for d in shard),
                      "tokens": int(ids.size), "sha256": sha}
                     for i, (shard, ids, sha) in enumerate(zip(shards, shard_ids, shards_sha))]
    if shard_units is not None:
        for summary, units in zip(shard_summary, shard_units):
            summary["units"] = int(units)
    data_sha = hashlib.sha256("\n".join(shards_sha).encode()).hexdigest()
    manifest = {
        "format": MANIFEST_FORMAT, "status": "training", "teachers": n, "kind": training.kind,
        "public": public_name, "public_sha256": parts["public"], "tokenizer": tokenizer_name,
        "vocab_size": vocab, "input": input_description, "shards": shard_summary, "data_sha256": data_sha,
        "tokens_sha256": parts["tokens"], "hyper_parameters": training.to_dict(), "seed": training.seed,
        "teacher_seeds": "teacher i: seed + 1000 + i (adapter initialisation, dropout, batch sampling)",
        "fingerprint": fingerprint, "fingerprint_parts": parts,
        "teacher_paths": [teacher_dir_name(i) for i in range(n)],
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
    }
    atomic_write_json(manifest_path, manifest)

    results = []
    bar = tqdm(range(n), desc="teachers", unit="teacher", disable=None if progress else True)
    for index in bar:
        final = out / teacher_dir_name(index)
        info = _teacher_info(out, final / TEACHER_INFO)
        if info.get("fingerprint") == fingerprint and isinstance(info.get("result"), dict):
            results.append({**info["result"], "resumed": True})
            continue
        safe_files.remove_entry(final)  # a stale or foreign entry under our name (a link: removed, not followed)
        staging = out / f".{teacher_dir_name(index)}.partial"
        begun = time.time()
        trained = fine_tune_teacher(model, training, shard_ids[index], index, progress=progress,
                                    return_loss=True)
        if not isinstance(trained, tuple):
            raise TypeError(f"teacher {index}: fine_tune_teacher(return_loss=True) returned no (model, loss) pair")
        teacher, loss = trained
        result = {"index": index, "path": final.name, "train_loss": loss,
                  "train_ppl": math.exp(loss) if math.isfinite(loss) else None}
        if heldout_ids is not None:
            result["heldout_ppl"] = perplexity(teacher, heldout_ids, training.seq_len)
        safe_files.fresh_directory(staging)  # save_pretrained writes into it: never into a planted link's target
        teacher.save_pretrained(str(staging))
        result["seconds"] = round(time.time() - begun, 2)
        atomic_write_json(staging / TEACHER_INFO, {"fingerprint": fingerprint, "shard_sha256": shards_sha[index],
                                                   "result": result})
        os.rename(staging, final)
        results.append({**result, "resumed": False})
        del teacher
        say(f"teacher {index}: train loss {loss:.3f}"
            + (f", held-out ppl {result['heldout_ppl']:.2f}" if "heldout_ppl" in result else "")
            + f" ({result['seconds']:.1f} s)")
    bar.close()
    manifest.update(status="complete", results=results,
                    timings={"seconds": round(time.time() - started, 2),
                             "trained_seconds": round(sum(r["seconds"] for r in results if not r["resumed"]), 2),
                             "trained": sum(not r["resumed"] for r in results),
                             "resumed": sum(r["resumed"] for r in results)})
    atomic_write_json(manifest_path, manifest)
    return manifest


def _teacher_info(out: Path, path: Path) -> dict:
    """A complete teacher's record ({} when there is none, or the entry is a link, a FIFO or not ours)."""
    try:
        info = loads_json(safe_files.read_text(path, MAX_BYTES, root=out, what="a teacher's record"), str(path))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def models_block(out: str | Path, manifest: dict, public: str, tokenizer: str, device: str = "cpu") -> str:
    """The `[models]` table of a decode config for the teachers in `out`.

    Args:
        out: the teachers' directory.
        manifest: its teachers.json (teacher_paths, teachers, kind).
        public: the public model's path or hub name.
        tokenizer: the tokenizer's path or hub name.
        device: the models.device to write.

    Returns:
        The TOML text of the [models] table, every teacher path absolute.
    """
    out = Path(out).resolve()

    def quoted(value: str | Path) -> str:
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'

    paths = ",\n    ".join(quoted(out / p) for p in manifest["teacher_paths"])
    return (f"[models]\nembedded = false\npublic = {quoted(public)}\nteacher_paths = [\n    {paths},\n]\n"
            f"teachers = {manifest['teachers']}\nteacher_kind = {quoted(manifest['kind'])}\n"
            f"tokenizer = {quoted(tokenizer)}\ndevice = {quoted(device)}\n")
