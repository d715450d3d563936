"""In-context-learning teachers (Hot PATE, Cohen et al. 2023): one public causal LM, prompted with
each teacher's disjoint private examples, stands in for N fine-tuned teachers.

Teacher i's next-token logits at a query position are the public model's on [prompt_i + query];
the public row (index 0) is the same model on the query alone. Nothing is trained, and all N+1
sequences go through the model in one batched forward, so ensembles of hundreds of teachers cost
one forward over N x B short sequences instead of N models. The prompts are left-padded to the
prompt budget (public), with an attention mask and explicit position ids: every row computes what
the model computes on its own unpadded sequence (tests compare the two), and the query positions
line up at the end of every row. The public row runs alone, so the fallback reads nothing private.

A teacher's identity in the manifest hashes the public model's content hash with its prompt token
ids, so a trace binds the private examples each teacher was shown.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from dpledger.accounting.errors import require
from dpledger.accounting.strict_json import parse_json
from dpledger.decoding.config import read_text_file
from dpledger.decoding.corpus import EmbeddedCorpus
from dpledger.decoding.ensemble import Ensemble, ModelIdentity, load_causal_lm, model_identity
from dpledger.decoding.recipe import encode_documents
from dpledger.decoding.corpus import generate_corpus
from dpledger.decoding.embedded import EmbeddedDefault, build_or_load

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

TOKENS_PER_FORWARD = 2 ** 12
"""At most this many tokens (rows x padded length) per forward: bounds the activations and logits a
chunk holds when B x (N+1) is large, and keeps them in cache (on 1 CPU thread, N = 256, L = 64:
600 ms per call at 2**12 tokens, 1.1 s at 2**15)."""


def _fitting_examples(examples: Sequence[str], tokenizer: PreTrainedTokenizerBase,
                      budget: int) -> tuple[int, list[int]]:
    """How many leading examples fit `budget` tokens whole, and the prompt's token ids: each
    example followed by the tokenizer's document separator (its own end-of-sequence token, ...,
    never its unknown token: dpledger.decoding.recipe.encode_documents). When not even the first fits, it is cut at the budget
    (count 1), so a prompt is never empty."""
    ids: list[int] = []
    for count, example in enumerate(examples):
        encoded = encode_documents(tokenizer, example).tolist()
        if len(ids) + len(encoded) > budget:
            return (count, ids) if count else (1, encoded[:budget])
        ids.extend(encoded)
    return len(examples), ids


def prompt_text(examples: Sequence[str], tokenizer: PreTrainedTokenizerBase, prompt_tokens: int) -> str:
    """The longest run of leading examples that fits the token budget whole (at least the first,
    which prompt_token_ids cuts at the budget), each followed by a blank line.

    Args:
        examples: a teacher's private examples, in order.
        tokenizer: the public model's tokenizer (each example is encoded with its document separator).
        prompt_tokens: the prompt budget in tokens (models.icl_prompt_tokens).

    Returns:
        The prompt's text: the fitting examples, each followed by a blank line.
    """
    count, _ = _fitting_examples(examples, tokenizer, prompt_tokens)
    return "".join(example + "\n\n" for example in examples[:count])


def prompt_token_ids(tokenizer: PreTrainedTokenizerBase, prompt: str, prompt_tokens: int) -> list[int]:
    """A prompt's token ids: its blank-line separated examples, whole while they fit the budget.

    Args:
        tokenizer: the public model's tokenizer.
        prompt: blank-line separated examples (prompt_text's output).
        prompt_tokens: the prompt budget in tokens.

    Returns:
        At most `prompt_tokens` ids: whole examples, each ending with the tokenizer's document separator (the
        first example cut at the budget when even it does not fit).
    """
    return _fitting_examples(prompt.removesuffix("\n\n").split("\n\n"), tokenizer, prompt_tokens)[1]


def partition_records(corpus: EmbeddedCorpus, teachers: int) -> list[list[str]]:
    """Every private record of the corpus's shards in exactly one of `teachers` groups: record j of
    shard s goes to group (j * S + s) mod teachers, round-robin over the records interleaved across
    the S shards. With teachers == S (the embedded ICL default) group i is shard i, so a planted
    canary's recorded teacher (its shard) is the teacher whose examples hold it.

    Args:
        corpus: the embedded corpus; each shard's records are separated by blank lines.
        teachers: the number of teachers N (an integer >= 1).

    Returns:
        N lists of records, teacher i's examples in list i.

    Raises:
        ValueError: if `teachers` is not an integer >= 1, or a teacher would get no record.
    """
    require(isinstance(teachers, int) and not isinstance(teachers, bool) and teachers >= 1,
            f"models.teachers must be an integer >= 1, got {teachers!r}")
    groups: list[list[str]] = [[] for _ in range(teachers)]
    shards = len(corpus.shards)
    for s, shard in enumerate(corpus.shards):
        for j, record in enumerate(shard.split("\n\n")):
            groups[(j * shards + s) % teachers].append(record)
    empty = [i for i, group in enumerate(groups) if not group]
    if empty:
        raise ValueError(f"models.teachers = {teachers} exceeds what the corpus's private records can fill: "
                         f"teacher {empty[0]} gets no example")
    return groups


def icl_teacher_prompts(corpus: EmbeddedCorpus, teachers: int, prompt_tokens: int,
                        tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Teacher i's prompt: its disjoint group of private records (partition_records), as many
    whole records as fit `prompt_tokens`, each followed by a blank line.

    Args:
        corpus: the embedded corpus.
        teachers: the number of teachers N.
        prompt_tokens: the prompt budget in tokens.
        tokenizer: the public model's tokenizer.

    Returns:
        N prompt texts (prompt_text).

    Raises:
        ValueError: if `teachers` is invalid or exceeds what the records can fill (partition_records).
    """
    return [prompt_text(group, tokenizer, prompt_tokens) for group in partition_records(corpus, teachers)]


def embedded_icl_default(teachers: int, verbose: bool = True) -> EmbeddedDefault:
    """The embedded ICL default: the 8-teacher embedded default's cached public model and
    tokenizer, with the corpus generated for `teachers` shards. generate_corpus draws the public
    text before any private record, so that corpus's public part is the very text the model was
    trained on, and its held-out text and canaries are the ones the audit regenerates for N.

    Args:
        teachers: the number of in-context teachers N (the corpus's shards).
        verbose: report training or cache use of the embedded default.

    Returns:
        The 8-teacher embedded default with its corpus replaced by the N-shard corpus of the same seed.
    """
    base = build_or_load(teachers=8, verbose=verbose)
    return dataclasses.replace(base, corpus=generate_corpus(seed=base.corpus.seed, teachers=teachers))


def read_icl_examples(path: str | Path, teachers: int) -> list[list[str]]:
    """models.icl_examples: a JSON list of `teachers` non-empty lists of strings, teacher i's
    private examples.

    Args:
        path: the JSON file.
        teachers: the number of teachers N the config names.

    Returns:
        The N lists of examples.

    Raises:
        ValueError: if the file cannot be read, is not JSON (or nested too deeply, or names a key
            twice), is not a list of lists of strings, holds another number of lists than N, or a
            list is empty or holds an empty example.
    """
    text = read_text_file(path, "models.icl_examples")
    try:  # depth and duplicate keys refused: a file somebody else wrote
        examples = parse_json(text, f"models.icl_examples {path}")
    except json.JSONDecodeError as error:
        raise ValueError(f"models.icl_examples {path} is not JSON ({error})") from None
    require(isinstance(examples, list) and all(isinstance(group, list) and all(isinstance(e, str) for e in group)
                                               for group in examples),
            f"models.icl_examples {path} must hold a list of lists of strings (teacher i's examples), "
            f"got {type(examples).__name__}")
    require(len(examples) == teachers,
            f"models.teachers = {teachers} does not match the {len(examples)} example lists in "
            f"models.icl_examples {path}")
    empty = [i for i, group in enumerate(examples) if not group or not all(group)]
    if empty:
        raise ValueError(f"models.icl_examples {path}: teacher {empty[0]}'s list is empty or holds an empty example")
    return examples


def load_icl_ensemble(public: str, tokenizer_path: str, teachers: int, prompt_tokens: int, *,
                      corpus: EmbeddedCorpus | None = None, examples_path: str | None = None,
                      device: str = "cpu") -> "InContextEnsemble":
    """The ensemble a run's config describes: prompts from the embedded corpus (`corpus`) or from
    the models.icl_examples JSON file; a run and its audit both build it here.

    Args:
        public: the public model's directory or hub name.
        tokenizer_path: the tokenizer's directory or hub name.
        teachers: the number of teachers N.
        prompt_tokens: the prompt budget in tokens (models.icl_prompt_tokens).
        corpus: the embedded corpus whose records are the examples; exactly one of it and `examples_path`.
        examples_path: the models.icl_examples JSON file.
        device: where the model runs.

    Returns:
        The in-context ensemble, each teacher's source recorded.

    Raises:
        ValueError: if both or neither of corpus and examples_path are given, or the examples,
            prompts or model are unusable.
    """
    from transformers import AutoTokenizer

    require((corpus is None) != (examples_path is None), "an ICL ensemble needs either a corpus or models.icl_examples")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    if corpus is not None:
        prompts = icl_teacher_prompts(corpus, teachers, prompt_tokens, tokenizer)
        sources = [f"embedded-corpus(seed={corpus.seed}, shards={len(corpus.shards)}):examples-{i}"
                   for i in range(teachers)]
    elif examples_path is not None:
        prompts = [prompt_text(group, tokenizer, prompt_tokens) for group in read_icl_examples(examples_path, teachers)]
        sources = [str(examples_path)] * teachers
    else:  # excluded by the check above
        raise ValueError("an ICL ensemble needs either a corpus or models.icl_examples")
    return InContextEnsemble.from_pretrained(public, prompts, tokenizer, prompt_tokens, device, sources)


class InContextEnsemble:
    """The public model (index 0) and N in-context teachers, with dpledger.decoding.ensemble.Ensemble's
    interface; n_positions is the room the prompt budget leaves for the query: the model's context
    (`context`) less the prompt budget (`prompt_budget`)."""

    split_distributions = staticmethod(Ensemble.split_distributions)

    def __init__(self, public_model: PreTrainedModel, prompts: Sequence[Sequence[int]],
                 identities: Sequence[ModelIdentity],
                 device: str = "cpu", prompt_budget: int | None = None):
        require(len(prompts) >= 1, "an in-context ensemble needs at least one teacher prompt")
        context = getattr(public_model.config, "n_positions", None) or public_model.config.max_position_embeddings
        longest = max(len(prompt) for prompt in prompts)
        # the padding and the query's room follow the public budget, never the private prompts' lengths
        budget = longest if prompt_budget is None else prompt_budget
        require(min(len(prompt) for prompt in prompts) >= 1, "every in-context teacher needs a non-empty prompt")
        require(longest <= budget, f"a teacher prompt has {longest} tokens, more than the budget {budget}")
        require(budget < context, f"the teacher prompts' budget is {budget} tokens, the model's context {context}: "
                                  "no room is left for the query")
        self.vocab_size = public_model.config.vocab_size
        self.n_teachers = len(prompts)
        self.context, self.prompt_budget = context, budget
        self.n_positions = context - budget
        self.identities = tuple(identities)
        self.device = torch.device(device)
        # transformers wraps PreTrainedModel.to in functools.wraps, whose type omits the bound self
        self._model = public_model.to(self.device).eval()  # type: ignore[arg-type]
        # teacher rows, each left-padded to the budget; the public row runs alone, unpadded, so that
        # nothing about the private prompts (not even their lengths) reaches the public fallback
        self._prompt_ids = torch.zeros(self.n_teachers, budget, dtype=torch.long)
        self._prompt_mask = torch.zeros(self.n_teachers, budget, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            self._prompt_ids[row, budget - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long)
            self._prompt_mask[row, budget - len(prompt):] = 1

    @classmethod
    def from_pretrained(cls, public: str, teacher_prompts: Sequence[str], tokenizer: PreTrainedTokenizerBase | str | Path,
                        prompt_tokens: int, device: str = "cpu",
                        sources: Sequence[str] | None = None) -> "InContextEnsemble":
        """Teacher i is the public model prompted with teacher_prompts[i] (blank-line separated
        examples), cut to its first `prompt_tokens` tokens keeping whole examples where they fit.
        `tokenizer` is a transformers tokenizer or its path; `sources` names each prompt's origin in
        the manifest.

        Args:
            public: the public model's directory or hub name.
            teacher_prompts: each teacher's prompt text (a list or tuple of non-empty strings).
            tokenizer: the public model's tokenizer, or its directory.
            prompt_tokens: the prompt budget in tokens, an integer in [1, the model's context).
            device: where the model runs.
            sources: each prompt's origin for the manifest; None: "in-context prompt i".

        Returns:
            The ensemble; teacher i's identity hashes the public weights' hash with its prompt's token ids.

        Raises:
            ValueError: if there is no prompt, a prompt is empty, `sources` has another length, the
                model cannot be loaded, or prompt_tokens is out of range.
        """
        require(isinstance(teacher_prompts, (list, tuple)) and len(teacher_prompts) >= 1,
                "an in-context ensemble needs at least one teacher prompt")
        empty = [i for i, prompt in enumerate(teacher_prompts) if not isinstance(prompt, str) or not prompt.strip()]
        if empty:
            raise ValueError(f"teacher prompt {empty[0]} is empty: every in-context teacher needs at least one "
                             "private example")
        require(sources is None or len(sources) == len(teacher_prompts),
                f"{len(sources or ())} prompt sources for {len(teacher_prompts)} teacher prompts")
        if isinstance(tokenizer, (str, Path)):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        public_model = load_causal_lm(public)
        context = getattr(public_model.config, "n_positions", None) or public_model.config.max_position_embeddings
        require(isinstance(prompt_tokens, int) and not isinstance(prompt_tokens, bool) and 1 <= prompt_tokens < context,
                f"models.icl_prompt_tokens must be an integer in [1, {context - 1}], got {prompt_tokens!r}")
        prompts = [prompt_token_ids(tokenizer, prompt, prompt_tokens) for prompt in teacher_prompts]
        public_identity = model_identity("public", public, public_model)
        identities = [public_identity]
        public_weights = public_identity.weights_sha256
        if public_weights is None:  # model_identity always hashes the weights
            raise ValueError(f"{public}: the public model's identity has no weights hash")
        for i, prompt in enumerate(prompts):  # the public weights and the prompt (its config: the public entry)
            digest = hashlib.sha256(public_weights.encode())
            digest.update(np.asarray(prompt, dtype=np.int64).tobytes())
            identities.append(ModelIdentity(f"teacher-{i}", sources[i] if sources else f"in-context prompt {i}",
                                            digest.hexdigest()))
        return cls(public_model, prompts, identities, device, prompt_tokens)

    def cast(self, dtype: torch.dtype) -> None:
        """Run the public model in `dtype` from now on (e.g. torch.bfloat16 on a GPU that has it); the
        logits still come back as float32 and the distributions as float64.

        Args:
            dtype: a floating torch dtype.

        Raises:
            ValueError: if `dtype` is not a floating dtype.
        """
        require(isinstance(dtype, torch.dtype) and dtype.is_floating_point,
                f"dtype must be a floating torch dtype, got {dtype!r}")
        self._model = self._model.to(dtype)

    @torch.no_grad()
    def public_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """float32 logits (B, L, V) of the public model alone (no teacher prompt) on `input_ids`.

        Args:
            input_ids: token ids (B, L), 1 <= L <= the model's context.

        Returns:
            The public model's logits at every position, on the CPU.

        Raises:
            ValueError: if input_ids is not 2-d or its length is outside [1, the model's context].
        """
        require(input_ids.ndim == 2 and 1 <= input_ids.shape[1] <= self.context,
                f"input_ids must be (batch, length) with length in [1, {self.context}], "
                f"got shape {tuple(input_ids.shape)}")
        return self._model(input_ids=input_ids.long().to(self.device), use_cache=False).logits.float().cpu()

    @property
    def context_description(self) -> str:
        """The query's room in words, for errors: the model's context, the prompt budget, what is left."""
        return (f"the {self.n_positions} tokens the in-context teachers leave for the query (the model's context, "
                f"n_positions = {self.context}, less the teacher prompts' budget, models.icl_prompt_tokens = "
                f"{self.prompt_budget})")

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """float32 logits (N+1, B, L, V) on the CPU at the query positions; index 0 is public.

        Args:
            input_ids: query token ids (B, L), 1 <= L <= n_positions.

        Returns:
            The public model's logits on the query alone (row 0), then teacher i's on its prompt
            followed by the query (row i + 1), at the query's positions.

        Raises:
            ValueError: if input_ids is not 2-d or its length is outside [1, n_positions].
        """
        require(input_ids.ndim == 2, f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
        batch, length = input_ids.shape
        require(1 <= length <= self.n_positions, f"query length {length} must be in [1, {self.n_positions}]: "
                                                 f"{self.context_description}")
        rows, longest = self._prompt_ids.shape
        input_ids = input_ids.cpu().long()
        public = self._model(input_ids=input_ids.to(self.device), use_cache=False).logits.float().cpu()
        ids = torch.cat([self._prompt_ids[:, None].expand(rows, batch, longest),
                         input_ids[None].expand(rows, batch, length)], dim=-1).reshape(rows * batch, -1)
        mask = torch.cat([self._prompt_mask[:, None].expand(rows, batch, longest),
                          torch.ones(rows, batch, length, dtype=torch.long)], dim=-1).reshape(rows * batch, -1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # each row's own positions, from 0 at its first real token
        out = torch.empty(rows * batch, length, self.vocab_size, dtype=torch.float32)
        chunk = max(1, TOKENS_PER_FORWARD // ids.shape[1])
        for start in range(0, rows * batch, chunk):
            part = slice(start, start + chunk)
            out[part] = self._model(input_ids=ids[part].to(self.device), attention_mask=mask[part].to(self.device),
                                    position_ids=positions[part].to(self.device), logits_to_keep=length,
                                    use_cache=False).logits.float().cpu()
        return torch.cat([public[None], out.reshape(rows, batch, length, self.vocab_size)])

    def distributions(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next-token distributions: split_distributions of `logits`.

        Args:
            input_ids: query token ids (B, L), 1 <= L <= n_positions.

        Returns:
            float64 (public (B, L, V), teachers (B, L, N, V)).

        Raises:
            ValueError: if input_ids is not 2-d or its length is out of range (logits).
        """
        return self.split_distributions(self.logits(input_ids))
