"""Build or load the embedded default: corpus, tokenizer, public model and N teachers.

Everything is derived deterministically from (corpus arguments, recipe) and cached under
`.dpledger-cache/` (or $DPLEDGER_CACHE) by the content hash of those inputs and the library
versions, so a second run starts at once. A cache entry is written to a temporary directory and
renamed into place, so an interrupted build never leaves an entry that looks complete.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
import torch

from dpledger.decoding.corpus import EmbeddedCorpus, generate_corpus
from dpledger.decoding.recipe import (TinyModelRecipe, encode_documents, end_of_text_id, new_gpt2, perplexity,
                                      set_single_thread, train_causal_lm, train_tokenizer)
from dpledger.decoding.teachers import train_teachers

CACHE_FORMAT = 1


def cache_root() -> Path:
    """Where embedded defaults are cached.

    Returns:
        $DPLEDGER_CACHE, or .dpledger-cache in the working directory.
    """
    return Path(os.environ.get("DPLEDGER_CACHE", ".dpledger-cache"))


@dataclass(frozen=True)
class EmbeddedDefault:
    """A cache entry of the embedded default: its directory (tokenizer/, public/, teachers/), the
    corpus and recipe it was built from, and info.json's training report."""

    directory: Path
    corpus: EmbeddedCorpus
    recipe: TinyModelRecipe
    info: dict

    @property
    def tokenizer_path(self) -> Path:
        return self.directory / "tokenizer"

    @property
    def public_path(self) -> Path:
        return self.directory / "public"

    @property
    def teacher_paths(self) -> list[Path]:
        return [self.directory / "teachers" / f"teacher-{i:03d}" for i in range(len(self.corpus.shards))]


def cache_key(corpus: EmbeddedCorpus, recipe: TinyModelRecipe) -> str:
    """The cache entry's key: everything the entry is derived from.

    Args:
        corpus: the corpus (its content hash).
        recipe: the training recipe.

    Returns:
        sha256 (64 hex digits) of the cache format, the corpus's hash, the recipe, and the torch,
        transformers and tokenizers versions.
    """
    import tokenizers
    import transformers

    payload = json.dumps({"format": CACHE_FORMAT, "corpus": corpus.content_hash(), "recipe": recipe.to_dict(),
                          "torch": torch.__version__, "transformers": transformers.__version__,
                          "tokenizers": tokenizers.__version__,
                          # LoRA teachers are seeded per teacher before the adapter is initialised (so each
                          # can be retrained alone); entries built before that differ in their bits
                          **({"lora_init": "per-teacher seed"} if recipe.teacher_kind == "lora" else {})},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def build_or_load(teachers: int = 8, recipe: TinyModelRecipe = TinyModelRecipe(), corpus_seed: int = 0,
                  verbose: bool = True, **corpus_kwargs: int) -> EmbeddedDefault:
    """The cached embedded default for `teachers` shards, training it first if absent.

    Args:
        teachers: the number of private shards and teachers N.
        recipe: how the tokenizer and models are trained.
        corpus_seed: the corpus's seed.
        verbose: print what is trained and how long it took.
        **corpus_kwargs: further generate_corpus arguments (public_paragraphs, dialogues_per_shard, ...).

    Returns:
        The cache entry (trained and renamed into place if it was absent).
    """
    corpus = generate_corpus(seed=corpus_seed, teachers=teachers, **corpus_kwargs)
    key = cache_key(corpus, recipe)
    final = cache_root() / f"embedded-{key[:16]}"
    if (final / "info.json").exists():
        _tokenizer_beside_public(final)
        return EmbeddedDefault(final, corpus, recipe, json.loads((final / "info.json").read_text()))
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".staging-{key[:16]}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    info = _train(corpus, recipe, staging, verbose)
    (staging / "info.json").write_text(json.dumps(info, indent=2))
    try:
        os.rename(staging, final)
    except OSError:  # another process finished the same entry first
        shutil.rmtree(staging, ignore_errors=True)
    _tokenizer_beside_public(final)
    return EmbeddedDefault(final, corpus, recipe, json.loads((final / "info.json").read_text()))


def _tokenizer_beside_public(entry: Path) -> None:
    """A copy of the tokenizer in public/, so `public/` alone is a complete model directory (for
    `dpledger teachers --public` and `[models] public` without a tokenizer key). Weights and their
    hashes are untouched; entries written before this are completed on first use."""
    public = entry / "public"
    for source in sorted((entry / "tokenizer").iterdir()):
        if not (public / source.name).exists():
            shutil.copy2(source, public / f".{source.name}.tmp-{os.getpid()}")
            os.replace(public / f".{source.name}.tmp-{os.getpid()}", public / source.name)


def _train(corpus: EmbeddedCorpus, recipe: TinyModelRecipe, directory: Path, verbose: bool) -> dict:
    set_single_thread()
    say = print if verbose else (lambda *a, **k: None)
    started = time.time()
    tokenizer = train_tokenizer(corpus.public_train, recipe.vocab_size, str(directory / "tokenizer"))
    eos = end_of_text_id(tokenizer)
    public_ids = encode_documents(tokenizer, corpus.public_train)
    private_heldout = encode_documents(tokenizer, corpus.private_heldout)
    say(f"[embedded] tokenizer: vocab {len(tokenizer)}, public text {public_ids.size} tokens")
    public = new_gpt2(recipe, eos, len(tokenizer))
    train_causal_lm(public, public_ids, recipe.public_steps, recipe.public_batch, recipe.n_positions, recipe.public_lr,
                    recipe.warmup_steps, recipe.seed, "public model", recipe.public_label_smoothing)
    public.save_pretrained(directory / "public")
    public_time = time.time() - started
    info: dict[str, object] = {
        "public_heldout_ppl": perplexity(public, encode_documents(tokenizer, corpus.public_heldout), recipe.n_positions),
        "public_on_private_ppl": perplexity(public, private_heldout, recipe.n_positions),
        "public_train_seconds": round(public_time, 1)}
    say(f"[embedded] public model: held-out ppl {info['public_heldout_ppl']:.1f}, "
        f"on private text {info['public_on_private_ppl']:.1f} ({public_time:.0f} s)")
    # the same library path as `dpledger teachers`: one teacher per shard (documents split on blank lines)
    manifest = train_teachers([shard.split("\n\n") for shard in corpus.shards], public, tokenizer,
                              recipe.teacher_training(), directory / "teachers", public_name="public",
                              tokenizer_name="tokenizer", heldout_ids=private_heldout, progress=verbose)
    teacher_ppl = [result["heldout_ppl"] for result in manifest["results"]]
    info.update(teacher_private_ppl=teacher_ppl, teacher_kind=recipe.teacher_kind,
                teachers_train_seconds=round(time.time() - started - public_time, 1))
    say(f"[embedded] {len(corpus.shards)} teachers: private held-out ppl "
        f"{min(teacher_ppl):.1f}..{max(teacher_ppl):.1f} ({info['teachers_train_seconds']:.0f} s)")
    return info
