"""A public causal LM and N teachers, loaded with transformers, answering next-token queries.

Models load from a local directory or a hub name (`from_pretrained`; set HF_HUB_OFFLINE=1 where
no hub is reachable); teachers are full models or LoRA adapters (peft) on the public base, merged
for inference. GPT-2 models are evaluated together by decoding.batched_gpt2 (one batched forward
for all N+1 models); other architectures fall back to one forward per model.
"""
from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from accounting.errors import require


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).exists() or "\\" in name


HUB_HINT = ("no local directory has that name, so it was looked up on the model hub; offline, pass a local "
            "directory (set HF_HUB_OFFLINE=1 to fail at once instead of retrying)")


def load_causal_lm(name_or_path: str):
    """AutoModelForCausalLM.from_pretrained with a clear error for missing local paths."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per teacher drowns the run's own progress bar

    path = Path(str(name_or_path)).expanduser()
    if _looks_local(str(name_or_path)) and not path.exists():
        raise ValueError(f"model path does not exist: {name_or_path}")
    try:
        return AutoModelForCausalLM.from_pretrained(str(path) if path.exists() else str(name_or_path)).eval()
    except OSError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        hint = "" if path.exists() else f"; {HUB_HINT}"
        raise ValueError(f"cannot load model {name_or_path!r}: {first}{hint}") from None


def load_tokenizer(name_or_path: str, what: str = "tokenizer"):
    """AutoTokenizer.from_pretrained with a one-line error naming `what` (the flag or key)."""
    from transformers import AutoTokenizer

    path = Path(str(name_or_path)).expanduser()
    if _looks_local(str(name_or_path)) and not path.exists():
        raise ValueError(f"{what} {name_or_path}: not a directory")
    try:
        return AutoTokenizer.from_pretrained(str(path) if path.exists() else str(name_or_path))
    except (OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        hint = "" if path.exists() else f"; {HUB_HINT}"
        raise ValueError(f"{what} {name_or_path}: cannot load a tokenizer ({first}){hint}") from None


def require_matching_tokenizer(tokenizer, vocab_size: int, what: str) -> None:
    """The tokenizer is the model's: at most its vocabulary, and not a near-empty stand-in (a model
    directory without tokenizer files can load as a tokenizer of a handful of tokens that encodes
    text to almost nothing, and teachers trained on that learn nothing)."""
    size = len(tokenizer)
    require(size <= vocab_size, f"{what}: {size} tokens, more than the model's vocabulary of {vocab_size}: the model "
                                "and the tokenizer must match")
    require(size >= vocab_size // 2,
            f"{what}: {size} tokens but the model's vocabulary is {vocab_size}: not this model's tokenizer (a model "
            "directory without tokenizer files loads as a near-empty one); pass the tokenizer's directory")


def load_lora_teacher(public_model, adapter_path: str):
    """A LoRA adapter (peft) on a copy of the public model, merged into plain weights."""
    from peft import PeftModel

    path = Path(adapter_path).expanduser()
    if not path.exists():
        raise ValueError(f"LoRA adapter path does not exist: {adapter_path}")
    merged = PeftModel.from_pretrained(copy.deepcopy(public_model), str(path)).merge_and_unload()
    return merged.eval()


def model_content_hash(model) -> str:
    """sha256 over the model's parameter names and bytes: the model's identity in a trace."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class ModelIdentity:
    role: str
    source: str
    content_hash: str


class Ensemble:
    """The public model (index 0) and N teachers; `distributions` answers a block of contexts."""

    def __init__(self, public_model, teacher_models: Sequence, identities: Sequence[ModelIdentity],
                 device: str = "cpu"):
        require(len(teacher_models) >= 1, "an ensemble needs at least one teacher")
        vocab = public_model.config.vocab_size
        for index, teacher in enumerate(teacher_models):
            require(teacher.config.vocab_size == vocab,
                    f"teacher {index} has vocabulary size {teacher.config.vocab_size}, the public model {vocab}: "
                    "public and teachers must share one vocabulary")
        self.vocab_size = vocab
        self.n_teachers = len(teacher_models)
        self.n_positions = getattr(public_model.config, "n_positions", None) or public_model.config.max_position_embeddings
        self.identities = tuple(identities)
        models = [public_model, *teacher_models]
        self.device = torch.device(device)
        try:
            from decoding.batched_gpt2 import StackedGPT2

            self._stacked = StackedGPT2(models, self.device)
            self._models = None
        except ValueError:
            self._stacked = None
            self._models = [model.to(self.device) for model in models]

    @classmethod
    def from_pretrained(cls, public: str, teachers: Sequence[str], teacher_kind: str = "full",
                        device: str = "cpu") -> "Ensemble":
        require(teacher_kind in ("full", "lora"), f"teacher_kind must be 'full' or 'lora', got {teacher_kind!r}")
        require(len(teachers) >= 1, "at least one teacher path is needed")
        public_model = load_causal_lm(public)
        if teacher_kind == "full":
            teacher_models = [load_causal_lm(path) for path in teachers]
        else:
            teacher_models = [load_lora_teacher(public_model, path) for path in teachers]
        identities = [ModelIdentity("public", str(public), model_content_hash(public_model))]
        identities += [ModelIdentity(f"teacher-{i}", str(path), model_content_hash(model))
                       for i, (path, model) in enumerate(zip(teachers, teacher_models))]
        return cls(public_model, teacher_models, identities, device)

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """float32 logits (N+1, B, L, V) on the CPU (the mechanisms run there); index 0 is public."""
        if self._stacked is not None:
            return self._stacked.logits(input_ids).cpu()
        input_ids = input_ids.to(self.device)
        return torch.stack([model(input_ids=input_ids).logits.float() for model in self._models]).cpu()

    @staticmethod
    def split_distributions(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float64 probabilities from (N+1, ..., V) logits: public (..., V), teachers (..., N, V)."""
        probs = torch.softmax(logits.double(), dim=-1)
        return probs[0], probs[1:].movedim(0, -2)

    def distributions(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split_distributions(self.logits(input_ids))
