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

import numpy as np
import torch
from tqdm.auto import tqdm

from accounting.errors import require, require_int_at_least

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
        return asdict(self)


def train_tokenizer(text: str, vocab_size: int, directory: str):
    """Byte-level BPE trained on `text`, saved as a transformers fast tokenizer in `directory`."""
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


def encode_documents(tokenizer, text: str) -> np.ndarray:
    """Token ids of `text`, documents (split on blank lines) joined by the end-of-text token."""
    eos = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    ids: list[int] = []
    for encoded in tokenizer(text.split("\n\n"), add_special_tokens=False)["input_ids"]:
        ids.extend(encoded)
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64)


def new_gpt2(recipe: TinyModelRecipe, eos_id: int, vocab_size: int):
    """A fresh GPT-2 sized by the recipe, with the tokenizer's real vocabulary size (BPE may exceed
    the requested size: the byte alphabet and special tokens always stay)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=vocab_size, n_positions=recipe.n_positions, n_embd=recipe.n_embd,
                        n_layer=recipe.n_layer, n_head=recipe.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=eos_id, eos_token_id=eos_id)
    torch.manual_seed(recipe.seed)
    return GPT2LMHeadModel(config)


def train_causal_lm(model, token_ids: np.ndarray, steps: int, batch: int, seq_len: int, lr: float, warmup: int,
                    seed: int, description: str, label_smoothing: float = 0.0) -> float:
    """AdamW on random windows of `token_ids` with linear warm-up and cosine decay to 10%.

    label_smoothing > 0 keeps every token's probability away from 0, as in a model pre-trained on
    broad data; a public model trained on a narrow corpus is otherwise so sure of itself that
    PMixED can move no mass towards the teachers (lambda ~ 1e-6 where p0 ~ 1e-8).

    Returns the mean training loss of the last 10 steps (nan when steps == 0).
    """
    if steps == 0:
        return math.nan
    require(token_ids.size > seq_len, f"{description}: need more than {seq_len} tokens, got {token_ids.size}")
    generator = np.random.default_rng(seed)
    data = torch.from_numpy(token_ids)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.1)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    losses = []
    for _ in tqdm(range(steps), desc=description, leave=False, disable=None):
        starts = generator.integers(0, token_ids.size - seq_len, size=batch)
        windows = torch.stack([data[s:s + seq_len] for s in starts])
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


def perplexity(model, token_ids: np.ndarray, seq_len: int, max_blocks: int = 16) -> float:
    """Held-out perplexity over up to `max_blocks` consecutive blocks."""
    data = torch.from_numpy(token_ids)
    blocks = min(max_blocks, (token_ids.size - 1) // seq_len)
    require(blocks > 0, "held-out text is shorter than one block")
    with torch.no_grad():
        inputs = torch.stack([data[i * seq_len:(i + 1) * seq_len] for i in range(blocks)])
        loss = model(input_ids=inputs, labels=inputs.clone()).loss
    return float(torch.exp(loss))


def fine_tune_teacher(public_model, recipe: TinyModelRecipe, shard_ids: np.ndarray, index: int):
    """A teacher from the public weights: a full fine-tune, or a LoRA adapter (peft)."""
    import copy

    teacher = copy.deepcopy(public_model)
    if recipe.teacher_kind == "lora":
        from peft import LoraConfig, get_peft_model

        teacher = get_peft_model(teacher, LoraConfig(r=recipe.lora_rank, lora_alpha=2 * recipe.lora_rank,
                                                     target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True,
                                                     lora_dropout=0.0))
    torch.manual_seed(recipe.seed + 1000 + index)
    train_causal_lm(teacher, shard_ids, recipe.teacher_steps, recipe.teacher_batch, recipe.n_positions,
                    recipe.teacher_lr, warmup=5, seed=recipe.seed + 1000 + index, description=f"teacher {index}")
    return teacher


def set_single_thread() -> None:
    """One torch thread: robust and deterministic on 2 shared cores (notes section 7); quiet saves."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if os.environ.get("DPLEDGER_THREADS"):
        torch.set_num_threads(int(os.environ["DPLEDGER_THREADS"]))
    else:
        torch.set_num_threads(1)
