"""A public causal LM and N teachers, loaded with transformers, answering next-token queries.

Models load from a local directory or a hub name (`from_pretrained`; set HF_HUB_OFFLINE=1 where
no hub is reachable; a local path is never looked up on the hub); teachers are full models or LoRA
adapters (peft) on the public base, merged for inference. Model files are untrusted input: a file
that cannot be loaded (truncated, pickled objects other than tensors, a config.json that does not
parse, tensors missing) is a ValueError of one line naming it. Every model runs with its own
config: GPT-2 models are evaluated by dpledger.decoding.batched_gpt2, one batched forward per group of equal
forward configurations (usually one for all N+1 models); other architectures run one forward each.
A model's identity in a trace (ModelIdentity) is the sha256 of its weights and of its config and
tokenizer files.
"""
from __future__ import annotations

import copy
import fnmatch
import hashlib
import json
import os
import pickle
import threading
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Protocol, Sequence, cast

import torch

from dpledger.accounting.errors import require
from dpledger.decoding.batched_gpt2 import ForwardSignature, StackedGPT2, forward_signature

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CONFIG, ADAPTER_CONFIG = "config.json", "adapter_config.json"
MODEL_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # in from_pretrained's order of preference
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
CONFIG_FILES = (CONFIG, "generation_config.json", ADAPTER_CONFIG)
TOKENIZER_FILES = ("tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json", "*.model",
                   "*.tiktoken", "chat_template*")
"""Beside its weights, a model's identity covers these files of its directory (fnmatch patterns):
what transformers reads to build the model and its tokenizer. Weights files are covered by the
hash of the tensors loaded from them; other files (READMEs, dpledger-teacher.json) change nothing
that runs."""


def _is_hub_name(name: str) -> bool:
    """Whether `name` is sent to the model hub: only a valid hub repo id ("name" or "owner/name")
    that names nothing here and is not a path into a directory that exists here. Paths (starting with
    . / ~, a backslash, more than one /, a trailing /, characters a repo id cannot hold) never are:
    offline, the hub is retried for about a minute before it fails."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.startswith((".", "/", "~")) or "\\" in name or Path(name).exists():
        return False
    if "/" in name and Path(name.split("/")[0]).is_dir():
        return False  # owner/ exists here: a path into it, not a hub id
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


HUB_HINT = ("no local directory has that name, so it was looked up on the model hub; offline, pass a local "
            "directory (set HF_HUB_OFFLINE=1 to fail at once instead of retrying)")


def _local_directory(name_or_path: str, missing: str) -> Path | None:
    """The directory `name_or_path` names here; None for a hub name; ValueError(`missing`) at once
    (never a hub lookup) for a local path that does not exist."""
    path = Path(str(name_or_path)).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ValueError(f"{name_or_path}: not a directory (a model or tokenizer is a directory of files)")
    if _is_hub_name(str(name_or_path)):
        return None
    raise ValueError(missing)


def _first_line(error: BaseException) -> str:
    """The informative first line of a third-party error (torch's weights-only refusal opens with a
    paragraph about its defaults; the reason comes after it)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reasons = [line for line in lines if not line.startswith(("Weights only load failed", "Please file an issue",
                                                               "Check the documentation"))]
    reasons = reasons or lines or [""]
    text = reasons[0].removeprefix("Error while deserializing header: ")
    if text.endswith(":") and len(reasons) > 1:  # "Validation error for field 'n_head':" and the reason
        text = f"{text} {reasons[1]}"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _read_json_object(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a readable JSON file ({_first_line(error)})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: must hold a JSON object, got {type(value).__name__}")
    return value


def is_lora_adapter(path: Path) -> bool:
    """A peft adapter directory (adapter_config.json, no config.json of its own).

    Args:
        path: a directory.

    Returns:
        Whether it holds adapter_config.json and no config.json.
    """
    return (path / ADAPTER_CONFIG).is_file() and not (path / CONFIG).is_file()


def _weights_files(directory: Path, names: tuple[str, ...]) -> list[Path]:
    """The weights files from_pretrained reads, in its order of preference (`names`): one file, or
    a sharded checkpoint's shards by its index; ValueError when there are none."""
    for name in names:
        single = directory / name
        if single.is_file():
            return [single]
        index = directory / f"{name}.index.json"
        if index.is_file():
            weight_map = _read_json_object(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index}: holds no weight_map of tensor names to shard files")
            shards = [directory / shard for shard in sorted(set(map(str, weight_map.values())))]
            missing = [shard for shard in shards if not shard.is_file()]
            if missing:
                raise ValueError(f"{missing[0]}: missing (named by {index.name})")
            return shards
    raise ValueError(f"{directory}: no weights file ({' or '.join(names)}, or a sharded index of either)")


def _check_safetensors(files: list[Path]) -> None:
    """Every safetensors file's header parses and covers the file exactly (a truncated file fails)."""
    from safetensors import SafetensorError, safe_open

    for file in files:
        if file.suffix == ".safetensors":
            try:
                with safe_open(str(file), "pt"):
                    pass
            except (SafetensorError, OSError) as error:
                raise ValueError(f"{file}: not a readable safetensors file ({_first_line(error)}): it is truncated "
                                 "or corrupt") from None


def _weights_error(files: list[Path], error: BaseException) -> ValueError:
    named = str(files[0]) if len(files) == 1 else f"{files[0].parent} (weights {', '.join(f.name for f in files[:3])})"
    if isinstance(error, pickle.UnpicklingError):
        return ValueError(f"{named}: refused by weights-only loading, which never runs pickled code: it is not "
                          f"a pickle of tensors alone ({_first_line(error)}); save the model as safetensors")
    return ValueError(f"{named}: cannot load the weights ({_first_line(error)}): truncated, corrupt, or not this "
                      "model's checkpoint")


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """Without transformers' load report and torch's pickle-protocol warning: what they find is
    raised in one line by the loaders."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)


KEPT_MODEL_BYTES = 64 * 2 ** 20
"""A local model directory whose files total at most this many bytes, weights all among them, is kept
loaded in the process by content (load_causal_lm): tests, the demo and an audit after its decode load
the same small models again and again (~28 ms a load against ~4 ms a copy for the embedded default's
size). A larger model, or one with shards elsewhere, is loaded from its files every time, as before."""
KEPT_MODELS = 16
"""The most small models kept loaded (the least recently used is dropped)."""
_kept: OrderedDict[str, PreTrainedModel] = OrderedDict()
_kept_lock = threading.Lock()


def _small_directory_digest(directory: Path) -> str | None:
    """sha256 over the name, length and bytes of every file directly in `directory`: what
    load_causal_lm keeps a loaded model under, so that a change to any of them loads it afresh. None
    (never kept) when they total more than KEPT_MODEL_BYTES, one cannot be read, or a weights file the
    loader would read is not among them (a sharded index naming a shard in a subdirectory or
    elsewhere: the digest would not cover it)."""
    try:
        files = sorted(path for path in directory.iterdir() if path.is_file())
        names = {path.name for path in files}
        if any(shard.parent != directory or shard.name not in names
               for shard in _weights_files(directory, MODEL_WEIGHTS)):
            return None
        digest, left = hashlib.sha256(), KEPT_MODEL_BYTES
        for path in files:
            with open(path, "rb") as handle:       # at most what is left: a file may be larger than stat said
                data = handle.read(left + 1)
            if len(data) > left:
                return None
            left -= len(data)
            digest.update(os.fsencode(path.name) + b"\0" + len(data).to_bytes(8, "little") + data)
    except (OSError, ValueError):   # the loader names the fault; an unkept load meets it
        return None
    return digest.hexdigest()


def load_causal_lm(name_or_path: str) -> PreTrainedModel:
    """AutoModelForCausalLM.from_pretrained, in eval mode, or ValueError in one line naming the file
    at fault: a local path that does not exist (never looked up on the hub), a LoRA adapter, a
    config.json that does not parse or describes no model transformers can build, weights that are
    truncated, pickled objects other than tensors (weights-only loading refuses them), or tensors
    the model needs but the checkpoint lacks (transformers would initialise them at random).

    Args:
        name_or_path: a local model directory, or a hub name (never for a path that does not exist).

    Returns:
        The model, in eval mode.

    Raises:
        ValueError: for any of the problems above, or a hub model that cannot be loaded.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per teacher drowns the run's own progress bar
    directory = _local_directory(name_or_path, f"model path does not exist: {name_or_path}")
    if directory is None:
        try:
            return AutoModelForCausalLM.from_pretrained(str(name_or_path)).eval()
        except OSError as error:
            raise ValueError(f"cannot load model {name_or_path!r}: {_first_line(error)}; {HUB_HINT}") from None
    # a small directory whose every file has bytes loaded before gets a copy of that model: the kept
    # one never leaves the cache, so nothing a caller does to its model (training, dtype) reaches another
    digest = _small_directory_digest(directory)
    if digest is not None:
        with _kept_lock:
            kept = _kept.get(digest)
            if kept is not None:
                _kept.move_to_end(digest)
                model = copy.deepcopy(kept)
                model.config.name_or_path = model.name_or_path = str(directory)  # as a load from here names it
                return model
    model = _load_local_causal_lm(directory)
    if digest is None:
        return model
    try:
        kept = copy.deepcopy(model)   # before the second look: the loaded tensors may map the weights file
    except Exception:  # a model that cannot be copied (non-leaf tensors, quantised weights) is not kept
        return model
    # kept only if the files are as they were before the load (a change that lasts is seen; one undone
    # while transformers read the files is not: the kept model is what the files held when both looked)
    if _small_directory_digest(directory) == digest:
        with _kept_lock:
            _kept[digest] = kept
            while len(_kept) > KEPT_MODELS:
                _kept.popitem(last=False)
    return model


def _load_local_causal_lm(directory: Path) -> PreTrainedModel:
    """load_causal_lm's loading of a local model directory, with its checks."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if is_lora_adapter(directory):
        raise ValueError(f"{directory} is a LoRA adapter ({ADAPTER_CONFIG}, no {CONFIG}), not a full model")
    config_file = directory / CONFIG
    if not config_file.is_file():
        raise ValueError(f"{config_file}: missing (a model directory holds config.json and its weights)")
    _read_json_object(config_file)
    files = _weights_files(directory, MODEL_WEIGHTS)
    _check_safetensors(files)
    # The files are untrusted input parsed by transformers, torch and safetensors, whose errors have
    # many types: each stage's failure is reported as the file it read.
    try:
        config = AutoConfig.from_pretrained(str(directory))
    except Exception as error:  # see above
        raise ValueError(f"{config_file}: transformers cannot build a model from it ({_first_line(error)})") from None
    try:
        with _quiet_loading():
            # transformers types from_pretrained as returning the model; output_loading_info=True returns (model, info)
            model, info = cast("tuple[PreTrainedModel, dict[str, list]]", AutoModelForCausalLM.from_pretrained(
                str(directory), config=config, output_loading_info=True, ignore_mismatched_sizes=True))
    except Exception as error:  # see above
        try:
            # only on failure (the build costs more than a small model's load): is config.json at fault?
            with torch.device("meta"):
                AutoModelForCausalLM.from_config(config)
        except Exception as config_error:  # see above
            raise ValueError(f"{config_file}: transformers cannot build a model from it "
                             f"({_first_line(config_error)})") from None
        raise _weights_error(files, error) from None
    mismatched = {key[0] if isinstance(key, tuple) else key for key in info.get("mismatched_keys") or ()}
    lacking = sorted(set(info.get("missing_keys") or ()) | mismatched)
    if lacking:
        named = files[0] if len(files) == 1 else directory
        raise ValueError(f"{named}: holds no tensor of the right shape for {', '.join(lacking[:3])}"
                         f"{f' (and {len(lacking) - 3} more)' if len(lacking) > 3 else ''}: transformers would "
                         "initialise them at random, a different model on every load")
    return model.eval()


def load_tokenizer(name_or_path: str, what: str = "tokenizer") -> PreTrainedTokenizerBase:
    """AutoTokenizer.from_pretrained with a one-line error naming `what` (the flag or key).

    Args:
        name_or_path: a local tokenizer (or model) directory, or a hub name.
        what: the flag or config key that named it, for the message.

    Returns:
        The tokenizer.

    Raises:
        ValueError: if a local path is not a directory, or no tokenizer loads from it.
    """
    from transformers import AutoTokenizer

    directory = _local_directory(name_or_path, f"{what} {name_or_path}: not a directory")
    try:
        return AutoTokenizer.from_pretrained(str(directory or name_or_path))
    except Exception as error:  # tokenizers' errors for damaged files have many types
        hint = "" if directory is not None else f"; {HUB_HINT}"
        raise ValueError(f"{what} {name_or_path}: cannot load a tokenizer ({_first_line(error)}){hint}") from None


def require_matching_tokenizer(tokenizer: PreTrainedTokenizerBase, vocab_size: int, what: str) -> None:
    """The tokenizer is the model's: at most its vocabulary, and not a near-empty stand-in (a model
    directory without tokenizer files can load as a tokenizer of a handful of tokens that encodes
    text to almost nothing, and teachers trained on that learn nothing).

    Args:
        tokenizer: the tokenizer (its length is its number of tokens).
        vocab_size: the models' vocabulary size V.
        what: the tokenizer's origin, for the message.

    Raises:
        ValueError: if it has more than V tokens or fewer than V // 2.
    """
    size = len(tokenizer)
    require(size <= vocab_size, f"{what}: {size} tokens, more than the model's vocabulary of {vocab_size}: the model "
                                "and the tokenizer must match")
    require(size >= vocab_size // 2,
            f"{what}: {size} tokens but the model's vocabulary is {vocab_size}: not this model's tokenizer (a model "
            "directory without tokenizer files loads as a near-empty one); pass the tokenizer's directory")


def load_lora_teacher(public_model: PreTrainedModel, adapter_path: str) -> PreTrainedModel:
    """A LoRA adapter (peft) on a copy of the public model, merged into plain weights; ValueError in
    one line naming the file at fault (as load_causal_lm).

    Args:
        public_model: the base model (copied: it is not changed).
        adapter_path: the adapter's directory (adapter_config.json and its weights).

    Returns:
        The merged model, in eval mode.

    Raises:
        ValueError: if the path is missing, a full model, lacks its config or weights, holds damaged
            or pickled weights, or the adapter does not apply to the public model.
    """
    from peft import PeftModel

    path = Path(str(adapter_path)).expanduser()
    if not path.is_dir():
        raise ValueError(f"LoRA adapter path does not exist: {adapter_path}")
    if (path / CONFIG).is_file() and not (path / ADAPTER_CONFIG).is_file():
        raise ValueError(f"{path} is a full model ({CONFIG}, no {ADAPTER_CONFIG}), not a LoRA adapter")
    config_file = path / ADAPTER_CONFIG
    if not config_file.is_file():
        raise ValueError(f"{config_file}: missing (a LoRA adapter directory holds {ADAPTER_CONFIG} and its weights)")
    _read_json_object(config_file)
    files = _weights_files(path, ADAPTER_WEIGHTS)
    _check_safetensors(files)
    try:
        with _quiet_loading():
            merged = PeftModel.from_pretrained(copy.deepcopy(public_model), str(path)).merge_and_unload()
    except pickle.UnpicklingError as error:
        raise _weights_error(files, error) from None
    except Exception as error:  # peft's and transformers' errors for damaged files have many types
        raise ValueError(f"{path}: cannot apply the LoRA adapter to the public model ({_first_line(error)})") from None
    return merged.eval()


def model_content_hash(model: torch.nn.Module) -> str:
    """sha256 over the model's parameter names and bytes (whatever file format held them): its weights' identity.

    Args:
        model: the model; its state dict is read in name order.

    Returns:
        The sha256 (64 hex digits).
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _identity_files(name_or_path: str, patterns: tuple[str, ...]) -> dict[str, str]:
    """sha256 of each file of the directory `name_or_path` names (a hub name: its snapshot in the
    local hub cache) whose name matches `patterns`."""
    path = Path(str(name_or_path)).expanduser()
    directory = path if path.is_dir() else _hub_snapshot(str(name_or_path)) if _is_hub_name(str(name_or_path)) else None
    if directory is None:
        return {}
    files = {}
    for file in sorted(directory.iterdir()):
        if file.is_file() and any(fnmatch.fnmatchcase(file.name, pattern) for pattern in patterns):
            with open(file, "rb") as handle:
                files[file.name] = hashlib.file_digest(handle, "sha256").hexdigest()
    return files


def _hub_snapshot(name: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    for filename in (CONFIG, ADAPTER_CONFIG, "tokenizer_config.json"):
        found = try_to_load_from_cache(name, filename)
        if isinstance(found, str):
            return Path(found).parent
    return None


def model_files(name_or_path: str) -> dict[str, str]:
    """The config and tokenizer files of a model directory, by name, with their sha256. A hub
    model's are its config files only: the hub cache holds its tokenizer files only once the
    tokenizer is loaded, and the run's tokenizer has an identity of its own (tokenizer_files).

    Args:
        name_or_path: a model directory or hub name.

    Returns:
        File name -> sha256 of its CONFIG_FILES (and TOKENIZER_FILES for a local directory); empty
        when nothing is found.
    """
    local = Path(str(name_or_path)).expanduser().is_dir()
    return _identity_files(name_or_path, CONFIG_FILES + (TOKENIZER_FILES if local else ()))


def tokenizer_files(name_or_path: str) -> dict[str, str]:
    """The tokenizer files of a tokenizer directory (or hub name), by name, with their sha256.

    Args:
        name_or_path: a tokenizer directory or hub name (a hub name: its snapshot in the local cache).

    Returns:
        File name -> sha256 of the files matching TOKENIZER_FILES; empty when nothing is found.
    """
    return _identity_files(name_or_path, TOKENIZER_FILES)


def identity_hash(weights_sha256: str, files: dict[str, str]) -> str:
    """A model's content hash: its weights' hash and its files' hashes together.

    Args:
        weights_sha256: model_content_hash of the model.
        files: file name -> sha256 of its config and tokenizer files.

    Returns:
        sha256 (64 hex digits) of "dpledger-model:" and the canonical JSON of both.
    """
    payload = json.dumps({"weights": weights_sha256, "files": files}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(("dpledger-model:" + payload).encode()).hexdigest()


@dataclass(frozen=True)
class ModelIdentity:
    """A model's identity in a trace. For a model loaded from files, content_hash is the sha256 of
    its weights' hash (model_content_hash) and of the sha256 of each of its config and tokenizer
    files (`files`), so that a changed config.json is another model, as a changed tensor is. An
    in-context teacher (dpledger.decoding.icl) is a prompt to the public model: a content hash alone."""

    role: str
    source: str
    content_hash: str
    weights_sha256: str | None = None
    files: dict | None = None

    def manifest_entry(self) -> dict:
        """The manifest's entry for this model.

        Returns:
            The identity's fields, those that are None left out.
        """
        return {key: value for key, value in vars(self).items() if value is not None}


def model_identity(role: str, source: str, model: torch.nn.Module) -> ModelIdentity:
    """The identity of a model loaded from `source`: its weights' hash and its files' hashes.

    Args:
        role: "public" or "teacher-i".
        source: the directory or hub name it was loaded from.
        model: the loaded model.

    Returns:
        Its ModelIdentity (content_hash = identity_hash of the two).
    """
    weights, files = model_content_hash(model), model_files(source)
    return ModelIdentity(role, str(source), identity_hash(weights, files), weights, files)


def file_problems(recorded: dict, found: dict, directory: str) -> list[str]:
    """How the files found in `directory` differ from the recorded ones (name -> sha256), each named.

    Args:
        recorded: file name -> sha256, as the manifest records them.
        found: file name -> sha256, as found now.
        directory: where the files are, to name them.

    Returns:
        One line per file missing, added or changed, in file-name order; empty when they agree.
    """
    problems = []
    for name in sorted(set(recorded) | set(found)):
        where = f"{directory.rstrip('/')}/{name}"
        if name not in found:
            problems.append(f"{where}: missing")
        elif name not in recorded:
            problems.append(f"{where}: not one of the run's files (added since)")
        elif found[name] != recorded[name]:
            problems.append(f"{where}: differs from the run's (sha256)")
    return problems


def identity_problems(recorded: dict, found: ModelIdentity) -> list[str]:
    """How the model found differs from the manifest's entry for it, each naming the file ([] when
    it is the run's model). An entry without `files` comes from a trace written before identities
    covered config and tokenizer files: its content_hash is the weights' hash, and only the weights
    can be compared (the audit's models check says so).

    Args:
        recorded: the manifest's entry for the model (ModelIdentity.manifest_entry).
        found: the identity of the model loaded now.

    Returns:
        One line per difference, each naming the model's source or file.
    """
    source = str(recorded.get("source"))
    if found.weights_sha256 is None:  # an in-context teacher: its prompt and the public weights
        return [] if recorded.get("content_hash") == found.content_hash else [f"{source}: its content hash differs"]
    if "files" not in recorded:
        weights_differ = recorded.get("content_hash") != found.weights_sha256
        return [f"{source}: its weights differ from the run's (sha256 of the tensors)"] if weights_differ else []
    problems = [] if recorded.get("weights_sha256") == found.weights_sha256 else [
        f"{source}: its weights differ from the run's (sha256 of the tensors)"]
    recorded_files = recorded.get("files")
    if not isinstance(recorded_files, dict):
        return problems + [f"{source}: the manifest's files entry is not a map of file names to sha256"]
    if found.files is None:   # weights hashed but no file hashes: nothing to compare the recorded files with
        return problems + [f"{source}: its files were not hashed, so the manifest's file hashes cannot be checked"]
    problems += file_problems(recorded_files, found.files, source)
    if not problems and recorded.get("content_hash") != found.content_hash:
        problems.append(f"{source}: the manifest's content_hash is not the hash of its weights and files (the "
                        "manifest was edited)")
    return problems


class TeacherEnsemble(Protocol):
    """What a run needs of its models, which Ensemble (full or LoRA teachers) and
    dpledger.decoding.icl.InContextEnsemble (in-context teachers) both provide: the public model at
    index 0 and N teachers answering next-token queries."""

    vocab_size: int
    n_teachers: int
    n_positions: int
    """The longest query context every model accepts."""
    identities: tuple[ModelIdentity, ...]
    """Each model's identity, the public model first."""

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits of every model.

        Args:
            input_ids: token ids (B, L), L at most n_positions.

        Returns:
            float32 logits (N+1, B, L, V) on the CPU; index 0 is the public model.
        """
        ...

    def distributions(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token distributions of every model (Ensemble.split_distributions of `logits`).

        Args:
            input_ids: token ids (B, L), L at most n_positions.

        Returns:
            float64 (public (B, L, V), teachers (B, L, N, V)).
        """
        ...


class Ensemble:
    """The public model (index 0) and N teachers; `distributions` answers a block of contexts.

    Each model runs as itself: GPT-2 models are stacked in one batched forward per group of equal
    forward configurations (dpledger.decoding.batched_gpt2.forward_signature; usually one group), any other
    model runs alone through transformers."""

    def __init__(self, public_model: PreTrainedModel, teacher_models: Sequence[PreTrainedModel],
                 identities: Sequence[ModelIdentity], device: str = "cpu"):
        require(len(teacher_models) >= 1, "an ensemble needs at least one teacher")
        vocab = public_model.config.vocab_size
        for index, teacher in enumerate(teacher_models):
            require(teacher.config.vocab_size == vocab,
                    f"teacher {index} has vocabulary size {teacher.config.vocab_size}, the public model {vocab}: "
                    "public and teachers must share one vocabulary")
        models = [public_model, *teacher_models]
        self.vocab_size = vocab
        self.n_teachers = len(teacher_models)
        # a query's context must fit every model
        self.n_positions = min(getattr(m.config, "n_positions", None) or m.config.max_position_embeddings
                               for m in models)
        self.identities = tuple(identities)
        self.device = torch.device(device)
        stacks: dict[ForwardSignature, list[int]] = {}
        self._forwards: list[tuple[list[int], StackedGPT2 | PreTrainedModel]] = []  # a StackedGPT2 or a model alone
        for index, model in enumerate(models):
            signature = forward_signature(model)
            if signature is None:
                # transformers wraps PreTrainedModel.to in functools.wraps, whose type omits the bound self
                self._forwards.append(([index], model.to(self.device)))  # type: ignore[arg-type]
            else:
                stacks.setdefault(signature, []).append(index)
        self._forwards += [(indices, StackedGPT2([models[i] for i in indices], self.device))
                           for indices in stacks.values()]

    @classmethod
    def from_pretrained(cls, public: str, teachers: Sequence[str], teacher_kind: str = "full",
                        device: str = "cpu") -> "Ensemble":
        """Load the public model and the teachers (load_causal_lm, load_lora_teacher) with their identities.

        Args:
            public: the public model's directory or hub name.
            teachers: each teacher's directory (a full model, or a LoRA adapter on the public model).
            teacher_kind: "full" or "lora".
            device: where the models run ("cpu", "cuda", ...).

        Returns:
            The ensemble, its identities recorded (public first).

        Raises:
            ValueError: if teacher_kind is unknown, no teacher is given, a teacher's directory is
                of the other kind, a model cannot be loaded, or the vocabularies differ.
        """
        require(teacher_kind in ("full", "lora"), f"teacher_kind must be 'full' or 'lora', got {teacher_kind!r}")
        require(len(teachers) >= 1, "at least one teacher path is needed")
        for index, path in enumerate(teachers):
            directory = Path(str(path)).expanduser()
            if teacher_kind == "full" and is_lora_adapter(directory):
                raise ValueError(f"teacher {index} ({path}) is a LoRA adapter ({ADAPTER_CONFIG}, no {CONFIG}) but "
                                 'teacher_kind is "full": set teacher_kind = "lora" to apply it to the public model')
            if teacher_kind == "lora" and (directory / CONFIG).is_file() and not (directory / ADAPTER_CONFIG).is_file():
                raise ValueError(f"teacher {index} ({path}) is a full model ({CONFIG}, no {ADAPTER_CONFIG}) but "
                                 'teacher_kind is "lora": set teacher_kind = "full"')
        public_model = load_causal_lm(public)
        if teacher_kind == "full":
            teacher_models = [load_causal_lm(path) for path in teachers]
        else:
            teacher_models = [load_lora_teacher(public_model, path) for path in teachers]
        identities = [model_identity("public", public, public_model)]
        identities += [model_identity(f"teacher-{i}", path, model)
                       for i, (path, model) in enumerate(zip(teachers, teacher_models))]
        return cls(public_model, teacher_models, identities, device)

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """float32 logits (N+1, B, L, V) on the CPU (the mechanisms run there); index 0 is public.

        Args:
            input_ids: token ids (B, L), L at most n_positions.

        Returns:
            The logits, model m in row m (public first, then the teachers in order).
        """
        if len(self._forwards) == 1 and isinstance(self._forwards[0][1], StackedGPT2):
            return self._forwards[0][1].logits(input_ids).cpu()  # one group, in order: no copy
        out = torch.empty((self.n_teachers + 1, *input_ids.shape, self.vocab_size), dtype=torch.float32)
        for indices, forward in self._forwards:
            part = (forward.logits(input_ids) if isinstance(forward, StackedGPT2)
                    else forward(input_ids=input_ids.to(self.device)).logits.float()[None])
            out[indices] = part.cpu()
        return out

    @staticmethod
    def split_distributions(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float64 probabilities from (N+1, ..., V) logits: public (..., V), teachers (..., N, V).

        Args:
            logits: (N+1, ..., V) logits, the public model first.

        Returns:
            (public probabilities (..., V), teacher probabilities (..., N, V)), softmax in float64.
        """
        probs = torch.softmax(logits.double(), dim=-1)
        return probs[0], probs[1:].movedim(0, -2)

    def distributions(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token distributions: split_distributions of `logits`.

        Args:
            input_ids: token ids (B, L), L at most n_positions.

        Returns:
            float64 (public (B, L, V), teachers (B, L, N, V)).
        """
        return self.split_distributions(self.logits(input_ids))
