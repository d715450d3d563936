"""The tiny-model recipe: byte-level BPE tokenizer, a small GPT-2 public model, N teachers.

Measured on 2 CPU cores (README, "Performance"): train the tokenizer on public
text only (so it does not leak the private corpus), pre-train the public model on the public part,
then fine-tune each teacher from the public weights on its own shard. Full fine-tuning learns the
new domain much faster than LoRA at this size; LoRA teachers (peft) are supported too.
Training is deterministic for a given seed on one thread.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch
from tqdm.auto import tqdm
import copy

from dpledger.accounting.errors import require, require_int_at_least

if TYPE_CHECKING:
    from typing import TypeAlias

    from peft import LoraConfig, PeftModel
    from transformers import GPT2LMHeadModel, PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

    Teacher: TypeAlias = PreTrainedModel | PeftModel

END_OF_TEXT = "<|endoftext|>"


@dataclass(frozen=True)
class TinyModelRecipe:
    """Hyper-parameters of the embedded default (all part of the cache key)."""

    vocab_size: int = 1024
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    n_positions: int = 128
    public_steps: int = 350
    public_batch: int = 32
    public_lr: float = 3e-3
    public_label_smoothing: float = 0.1
    warmup_steps: int = 30
    teacher_kind: str = "full"  # "full" fine-tune or "lora"
    teacher_steps: int = 60
    teacher_batch: int = 16
    teacher_lr: float = 2e-3
    lora_rank: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.teacher_kind in ("full", "lora"), f"teacher_kind must be 'full' or 'lora', got {self.teacher_kind!r}")
        for name in ("vocab_size", "n_layer", "n_embd", "n_head", "n_positions", "public_batch", "teacher_batch"):
            require_int_at_least(name, getattr(self, name), 1)
        require_int_at_least("public_steps", self.public_steps, 0)
        require_int_at_least("teacher_steps", self.teacher_steps, 0)

    def to_dict(self) -> dict:
        """The recipe as plain data (part of the embedded default's cache key).

        Returns:
            Each hyper-parameter by name.
        """
        return asdict(self)

    def teacher_training(self) -> "TeacherTraining":
        """The recipe's teacher hyper-parameters as the explicit ones `fine_tune_teacher` takes.

        Returns:
            The TeacherTraining: the recipe's teacher kind, steps, batch, learning rate and LoRA rank,
            sequences of n_positions tokens, 5 warm-up steps, LoRA alpha 2 r on GPT-2's Conv1D targets.
        """
        return TeacherTraining(kind=self.teacher_kind, steps=self.teacher_steps, batch=self.teacher_batch,
                               lr=self.teacher_lr, seq_len=self.n_positions, warmup=5, lora_rank=self.lora_rank,
                               lora_alpha=2.0 * self.lora_rank, target_modules=GPT2_LORA_TARGETS, seed=self.seed)


GPT2_LORA_TARGETS = ("c_attn", "c_proj", "c_fc")
# Linear-based architectures, first match wins: LLaMA/Mistral/Qwen/OPT/Phi/GPT-J ("q_proj", ...),
# GPT-NeoX/Falcon/BLOOM ("query_key_value", "dense"), MPT ("Wqkv", "out_proj"), T5-style ("q", "k", "v", "o").
LINEAR_LORA_TARGETS = (("q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "dense"),
                       ("query_key_value", "dense"), ("Wqkv", "out_proj"), ("c_attn", "c_proj"),
                       ("q", "k", "v", "o"))


@dataclass(frozen=True)
class TeacherTraining:
    """Explicit hyper-parameters of one teacher fine-tune (the embedded recipe's are
    `TinyModelRecipe.teacher_training()`). Teacher i's random state is seeded with seed + 1000 + i.

    steps: optimizer steps; batch: sequences per step; seq_len: tokens per sequence; lr: peak AdamW
    learning rate after `warmup` linear warm-up steps, then cosine decay to 10%; LoRA (Hu et al.
    2021): rank r, scaling alpha (the update is alpha / r * B A), dropout, and the target module
    names (None: detected from the architecture, see `lora_target_modules`).
    """

    kind: str = "lora"
    steps: int = 200
    batch: int = 8
    lr: float = 1e-3
    seq_len: int = 128
    warmup: int = 10
    weight_decay: float = 0.1
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.kind in ("full", "lora"), f"teacher kind must be 'full' or 'lora', got {self.kind!r}")
        require_int_at_least("steps", self.steps, 0)
        require_int_at_least("batch", self.batch, 1)
        require_int_at_least("seq_len", self.seq_len, 2)
        require_int_at_least("warmup", self.warmup, 0)
        require_int_at_least("lora_rank", self.lora_rank, 1)
        require(isinstance(self.seed, int) and not isinstance(self.seed, bool),
                f"seed must be an integer, got {self.seed!r}")
        for name in ("lr", "lora_alpha"):
            value = getattr(self, name)
            require(isinstance(value, (int, float)) and math.isfinite(value) and value > 0,
                    f"{name} must be a finite number > 0, got {value!r}")
        require(isinstance(self.weight_decay, (int, float)) and 0 <= self.weight_decay < math.inf,
                f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        require(isinstance(self.lora_dropout, (int, float)) and 0 <= self.lora_dropout < 1,
                f"lora_dropout must be in [0, 1), got {self.lora_dropout!r}")
        require(self.target_modules is None or (len(self.target_modules) >= 1 and all(
            isinstance(m, str) and m for m in self.target_modules)),
                f"target_modules must be None or a non-empty list of module names, got {self.target_modules!r}")

    def to_dict(self) -> dict:
        """The hyper-parameters as plain data (teachers.json records them).

        Returns:
            Each hyper-parameter by name, target_modules as a list (or None).
        """
        values = asdict(self)
        values["target_modules"] = None if self.target_modules is None else list(self.target_modules)
        return values


def train_tokenizer(text: str, vocab_size: int, directory: str) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on `text`, saved as a transformers fast tokenizer in `directory`.

    Args:
        text: the training text; blank lines separate documents.
        vocab_size: the vocabulary size asked for (the byte alphabet and END_OF_TEXT always stay).
        directory: where the tokenizer is saved.

    Returns:
        The tokenizer, END_OF_TEXT its end-of-text and beginning-of-text token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(text.split("\n\n"), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=END_OF_TEXT, bos_token=END_OF_TEXT)
    fast.save_pretrained(directory)
    return fast


def end_of_text_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id of END_OF_TEXT, the documents' separator.

    Args:
        tokenizer: the tokenizer.

    Returns:
        The token's id (the tokenizer's unknown-token id where it has no such token).

    Raises:
        ValueError: if the tokenizer gives no single id for it.
    """
    eos = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    if not isinstance(eos, int):
        raise ValueError(f"the tokenizer has no id for {END_OF_TEXT}, got {eos!r}")
    return eos


SEPARATOR_ROLES = ("eos_token", "sep_token", "bos_token", "cls_token")
"""The special tokens that may separate documents, in order of preference: the end of a sequence
first (what a causal LM is trained to see between documents), never the unknown token."""
NEWLINE_SEPARATOR = "\n\n"
"""The fallback separator of a tokenizer with none of SEPARATOR_ROLES: a blank line, as the
documents are written, when the tokenizer encodes it without its unknown token."""


def document_separator_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The ids that separate documents: the tokenizer's own end-of-sequence token, else its
    separator, beginning-of-sequence or classifier token (the first that maps to one known id, not
    the unknown token's), else the blank line NEWLINE_SEPARATOR encoded without special tokens when
    that needs no unknown token. The embedded tokenizer's is END_OF_TEXT (its eos), as before.

    Args:
        tokenizer: the tokenizer.

    Returns:
        One id (a special token) or the blank line's ids.

    Raises:
        ValueError: if the tokenizer has none of those special tokens and cannot encode a blank line
            without its unknown token.
    """
    unknown = tokenizer.unk_token_id
    vocabulary = len(tokenizer)
    for role in SEPARATOR_ROLES:
        token = getattr(tokenizer, role, None)
        if not isinstance(token, str) or token == tokenizer.unk_token:
            continue
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and 0 <= token_id < vocabulary and token_id != unknown:
            return [token_id]
    newline = list(tokenizer(NEWLINE_SEPARATOR, add_special_tokens=False)["input_ids"])
    if newline and (unknown is None or unknown not in newline):
        return newline
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    raise ValueError(f"tokenizer {name!r} has no token to separate documents: no end-of-sequence, separator, "
                     f"beginning-of-sequence or classifier token other than its unknown token, and it encodes a blank "
                     f"line as {newline} (unknown token id {unknown}); give it an eos_token")


def encode_documents(tokenizer: PreTrainedTokenizerBase, text: str) -> npt.NDArray[np.int64]:
    """Token ids of `text`, each document (split on blank lines) followed by the tokenizer's
    document separator (document_separator_ids: its eos, ..., never its unknown token).

    Args:
        tokenizer: the tokenizer.
        text: documents separated by blank lines.

    Returns:
        The int64 ids, each document's followed by the separator's ids.

    Raises:
        ValueError: if the tokenizer has no usable separator (document_separator_ids).
    """
    separator = document_separator_ids(tokenizer)
    ids: list[int] = []
    for encoded in tokenizer(text.split("\n\n"), add_special_tokens=False)["input_ids"]:
        ids.extend(encoded)
        ids.extend(separator)
    return np.asarray(ids, dtype=np.int64)


def new_gpt2(recipe: TinyModelRecipe, eos_id: int, vocab_size: int) -> GPT2LMHeadModel:
    """A fresh GPT-2 sized by the recipe, with the tokenizer's real vocabulary size (BPE may exceed
    the requested size: the byte alphabet and special tokens always stay).

    Args:
        recipe: its layer count, width, heads, context and seed are used.
        eos_id: the end-of-text token's id (also the beginning-of-text id).
        vocab_size: the tokenizer's vocabulary size.

    Returns:
        The model, initialised from torch's generator seeded with recipe.seed, without dropout.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab_size, n_positions=recipe.n_positions, n_embd=recipe.n_embd,
                        n_layer=recipe.n_layer, n_head=recipe.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=eos_id, eos_token_id=eos_id)
    torch.manual_seed(recipe.seed)
    return GPT2LMHeadModel(config)


def train_causal_lm(model: torch.nn.Module, token_ids: npt.NDArray[np.int64], steps: int, batch: int, seq_len: int, lr: float, warmup: int,
                    seed: int, description: str, label_smoothing: float = 0.0, weight_decay: float = 0.1,
                    progress: bool = True) -> float:
    """AdamW on random windows of `token_ids` with linear warm-up and cosine decay to 10%, on the
    model's device; gradients clipped to norm 1.

    label_smoothing > 0 keeps every token's probability away from 0, as in a model pre-trained on
    broad data; a public model trained on a narrow corpus is otherwise so sure of itself that
    PMixED can move no mass towards the teachers (lambda ~ 1e-6 where p0 ~ 1e-8).

    Args:
        model: the causal LM to train in place (left in eval mode).
        token_ids: the training text's ids.
        steps: optimizer steps (0: nothing is done).
        batch: windows per step.
        seq_len: tokens per window.
        lr: the peak learning rate.
        warmup: linear warm-up steps.
        seed: seeds the windows' positions.
        description: the progress bar's label, and the start of the error message.
        label_smoothing: cross-entropy label smoothing in [0, 1).
        weight_decay: AdamW's weight decay.
        progress: show a progress bar.

    Returns:
        The mean training loss of the last 10 steps (nan when steps == 0).

    Raises:
        ValueError: if token_ids holds no more than seq_len tokens.
    """
    if steps == 0:
        return math.nan
    require(token_ids.size > seq_len, f"{description}: need more than {seq_len} tokens, got {token_ids.size}")
    generator = np.random.default_rng(seed)
    data = torch.from_numpy(token_ids)
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    losses = []
    for _ in tqdm(range(steps), desc=description, leave=False, disable=None if progress else True, unit="step"):
        starts = generator.integers(0, token_ids.size - seq_len, size=batch)
        windows = torch.stack([data[s:s + seq_len] for s in starts]).to(device)
        logits = model(input_ids=windows).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1),
                                                 label_smoothing=label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    model.eval()
    return float(np.mean(losses[-10:]))


def perplexity(model: torch.nn.Module, token_ids: npt.NDArray[np.int64], seq_len: int, max_blocks: int = 16) -> float:
    """Held-out perplexity over up to `max_blocks` consecutive blocks.

    Args:
        model: a causal LM (called with labels, so it returns its mean loss).
        token_ids: the held-out text's ids.
        seq_len: tokens per block.
        max_blocks: the most blocks read from the start of the text.

    Returns:
        exp of the mean next-token cross-entropy over the blocks.

    Raises:
        ValueError: if the text is shorter than one block.
    """
    data = torch.from_numpy(token_ids)
    blocks = min(max_blocks, (token_ids.size - 1) // seq_len)
    require(blocks > 0, "held-out text is shorter than one block")
    with torch.no_grad():
        inputs = torch.stack([data[i * seq_len:(i + 1) * seq_len] for i in range(blocks)])
        inputs = inputs.to(next(model.parameters()).device)
        loss = model(input_ids=inputs, labels=inputs.clone()).loss
    return float(torch.exp(loss))


def lora_target_modules(model: PreTrainedModel) -> tuple[tuple[str, ...], bool]:
    """LoRA target module names for `model` and peft's fan_in_fan_out: GPT-2-style Conv1D layers
    (c_attn, c_proj, c_fc; weights stored transposed, so fan_in_fan_out=True) or the attention and
    projection nn.Linear layers of other architectures (q_proj, k_proj, v_proj, o_proj, ...).

    Args:
        model: the model the adapter will be applied to.

    Returns:
        (the target module names, fan_in_fan_out).

    Raises:
        ValueError: if no known group of layers is found (name them with --target-modules).
    """
    from transformers.pytorch_utils import Conv1D

    leaves: dict[str, set[str]] = {}
    for name, module in model.named_modules():
        if isinstance(module, (Conv1D, torch.nn.Linear)) and not name.endswith("lm_head"):
            leaves.setdefault(name.rsplit(".", 1)[-1], set()).add(type(module).__name__)
    conv = tuple(name for name in GPT2_LORA_TARGETS if leaves.get(name) == {"Conv1D"})
    if conv:
        return conv, True
    for group in LINEAR_LORA_TARGETS:
        found = tuple(name for name in group if leaves.get(name) == {"Linear"})
        if group[0] in found:
            return found, False
    raise ValueError(f"cannot detect LoRA target modules for model type {getattr(model.config, 'model_type', '?')!r} "
                     f"(its layers: {', '.join(sorted(leaves)[:12]) or 'none'}): name them (--target-modules)")


def lora_config(model: PreTrainedModel, training: TeacherTraining) -> LoraConfig:
    """peft's LoraConfig for `training` on `model` (targets detected unless named).

    Args:
        model: the model the adapter will be applied to.
        training: rank, alpha, dropout and the target modules (None: lora_target_modules).

    Returns:
        The LoraConfig.

    Raises:
        ValueError: if no target can be detected, the named targets match no layer, or they mix
            GPT-2 Conv1D and other layers.
    """
    from peft import LoraConfig
    from transformers.pytorch_utils import Conv1D

    if training.target_modules is None:
        targets, fan_in_fan_out = lora_target_modules(model)
    else:
        targets = training.target_modules
        kinds = {type(module) for name, module in model.named_modules() if name.rsplit(".", 1)[-1] in targets}
        require(bool(kinds), f"target modules {', '.join(targets)} match no layer of the model (--target-modules)")
        fan_in_fan_out = Conv1D in kinds
        require(not (fan_in_fan_out and len(kinds) > 1),
                f"target modules {', '.join(targets)} mix GPT-2 Conv1D and other layers: target one kind "
                "(--target-modules)")
    # peft annotates lora_alpha as int but scales by lora_alpha / r: a float alpha (--lora-alpha 0.5) is meant
    return LoraConfig(r=training.lora_rank, lora_alpha=training.lora_alpha,  # type: ignore[arg-type]
                      target_modules=list(targets), fan_in_fan_out=fan_in_fan_out, lora_dropout=training.lora_dropout)


def fine_tune_teacher(public_model: PreTrainedModel, training: "TeacherTraining | TinyModelRecipe",
                      shard_ids: npt.NDArray[np.int64], index: int, progress: bool = True,
                      return_loss: bool = False) -> Teacher | tuple[Teacher, float]:
    """Teacher `index` from the public weights: a full fine-tune, or a LoRA adapter (peft), trained on
    `shard_ids` with the explicit hyper-parameters `training`. Depends only on its arguments: the
    random state is seeded with training.seed + 1000 + index before the adapter is initialised and
    before training, so each teacher can be (re)trained alone. Returns the model (and the mean
    training loss of the last 10 steps with return_loss).

    Args:
        public_model: the public model (copied: it is not changed).
        training: the teacher's hyper-parameters (a recipe's teacher_training() when a TinyModelRecipe).
        shard_ids: the teacher's shard, as token ids.
        index: the teacher's index i.
        progress: show a progress bar.
        return_loss: return the final loss too.

    Returns:
        The trained model (a peft model with its adapter for LoRA), or (model, loss) with return_loss.

    Raises:
        ValueError: if the shard is too short to train on, or LoRA targets cannot be found.
    """
    if isinstance(training, TinyModelRecipe):
        training = training.teacher_training()
    seed = training.seed + 1000 + index
    model = copy.deepcopy(public_model)
    teacher: Teacher = model
    if training.kind == "lora":
        from peft import get_peft_model

        torch.manual_seed(seed)
        teacher = get_peft_model(model, lora_config(model, training))
    torch.manual_seed(seed)
    loss = train_causal_lm(teacher, shard_ids, training.steps, training.batch, training.seq_len, training.lr,
                           warmup=training.warmup, seed=seed, description=f"teacher {index}",
                           weight_decay=training.weight_decay, progress=progress)
    return (teacher, loss) if return_loss else teacher


def set_single_thread() -> None:
    """One torch thread: robust and deterministic on 2 shared cores; quiet saves."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if os.environ.get("DPLEDGER_THREADS"):
        torch.set_num_threads(int(os.environ["DPLEDGER_THREADS"]))
    else:
        torch.set_num_threads(1)
