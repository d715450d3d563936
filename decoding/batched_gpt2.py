"""A GPT-2 forward pass over M models at once (the public model and N teachers), on shared inputs.

Each parameter is stacked across models (shape (M, ...)) and every matmul is one batched matmul,
so the hot path has no Python loop over teachers. Only models with one forward configuration are
stacked (`forward_signature`: every GPT-2 setting that changes the eval forward pass); the ensemble
stacks each group of equal signatures (dpledger.decoding.ensemble), so every model runs with its own
config.json. It computes what transformers' GPT2LMHeadModel computes (tests compare the two):
learned positions, pre-LayerNorm blocks, the configured activation (transformers' own function),
attention scaled by 1/sqrt(head_dim) or not, and by 1/(layer + 1) or not, a tied or separate LM head.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
import torch.nn.functional as F

from dpledger.accounting.errors import require

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ForwardSignature = tuple[tuple[str, object], ...]
"""(setting, value) pairs: FORWARD_KEYS' values and whether the LM head is tied to the embeddings."""

FORWARD_KEYS = ("n_embd", "n_layer", "n_head", "n_inner", "n_positions", "vocab_size", "layer_norm_epsilon",
                "activation_function", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
                "reorder_and_upcast_attn", "add_cross_attention")
"""The GPT-2 settings that GPT2LMHeadModel's forward reads on a causal LM query. The others do not
change eval logits: dropout probabilities (eval mode), token ids (no padding mask here), the
summary_* settings (other heads), initializer_range, use_cache. reorder_and_upcast_attn computes
the same scaled product in float32, which the kernel always uses; add_cross_attention adds weights
that a query without encoder states never reads, but it changes the weights that exist."""


def forward_signature(model: PreTrainedModel) -> ForwardSignature | None:
    """What determines `model`'s forward pass beside its weights, or None when the kernel does not
    compute it (not a GPT-2 causal LM): such a model runs through transformers on its own.

    Args:
        model: a transformers causal LM.

    Returns:
        (setting, value) for each of FORWARD_KEYS (None where the config lacks it), then
        ("tied_lm_head", whether the LM head shares the input embeddings); None for a model other
        than a GPT2LMHeadModel.
    """
    config = model.config
    if config.model_type != "gpt2" or type(model).__name__ != "GPT2LMHeadModel":
        return None
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return tuple((key, getattr(config, key, None)) for key in FORWARD_KEYS) + (("tied_lm_head", tied),)


class StackedGPT2:
    """Stacked weights of M GPT-2 models with one forward signature; `logits(input_ids)` -> (M, B, L, V)."""

    def __init__(self, models: Sequence[PreTrainedModel], device: str | torch.device = "cpu"):
        from transformers.activations import ACT2FN

        require(len(models) > 0, "need at least one model to stack")
        signature = forward_signature(models[0])
        if signature is None:
            raise ValueError(f"the batched kernel computes GPT-2 causal LMs, got {type(models[0]).__name__}")
        for model in models[1:]:
            other = forward_signature(model)
            if other != signature:
                differing = [key for (key, value), (_, theirs) in zip(signature, other or ()) if value != theirs]
                raise ValueError("models stacked in one forward must share its configuration; these differ in "
                                 f"{differing or 'architecture'}")
        config = models[0].config
        self.config = config
        self.n_models = len(models)
        self.activation = ACT2FN[config.activation_function]
        self.tied = dict(signature)["tied_lm_head"]
        states = [{k: v.detach() for k, v in model.state_dict().items()} for model in models]
        self.device = torch.device(device)
        self.params = {name: torch.stack([state[name] for state in states]).float().contiguous().to(self.device)
                       for name in states[0] if not name.endswith(".attn.bias") and not name.endswith(".attn.masked_bias")
                       and not (self.tied and name == "lm_head.weight")}

    def _layer_norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        weight = self.params[prefix + ".weight"][:, None, None, :]
        bias = self.params[prefix + ".bias"][:, None, None, :]
        normalised = F.layer_norm(x, x.shape[-1:], eps=self.config.layer_norm_epsilon)
        return normalised * weight + bias

    def _conv1d(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        """Conv1D (x @ W + b) for every model: x (M, B, L, in), W (M, in, out)."""
        m, b, length, width = x.shape
        weight, bias = self.params[prefix + ".weight"], self.params[prefix + ".bias"]
        out = torch.baddbmm(bias[:, None, :], x.reshape(m, b * length, width), weight)
        return out.reshape(m, b, length, -1)

    def _attention_scale(self, layer: int) -> float:
        """GPT2Attention's scaling of q.k for this layer."""
        scale = (self.config.n_embd // self.config.n_head) ** -0.5 if self.config.scale_attn_weights else 1.0
        return scale / (layer + 1) if self.config.scale_attn_by_inverse_layer_idx else scale

    @torch.no_grad()
    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The final LayerNorm's output for every model: GPT2Model's last hidden state.

        Args:
            input_ids: token ids (B, L), L at most the models' n_positions.

        Returns:
            float32 hidden states (M, B, L, n_embd) on the stack's device.

        Raises:
            ValueError: if input_ids is not 2-d or longer than n_positions.
        """
        require(input_ids.ndim == 2, f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
        batch, length = input_ids.shape
        require(length <= self.config.n_positions,
                f"context length {length} exceeds the model's n_positions {self.config.n_positions}")
        heads = self.config.n_head
        input_ids = input_ids.to(self.device)
        wte, wpe = self.params["transformer.wte.weight"], self.params["transformer.wpe.weight"]
        positions = torch.arange(length, device=self.device)
        h = wte[:, input_ids] + wpe[:, positions][:, None]
        for layer in range(self.config.n_layer):
            prefix = f"transformer.h.{layer}"
            qkv = self._conv1d(self._layer_norm(h, prefix + ".ln_1"), prefix + ".attn.c_attn")
            q, k, v = qkv.split(self.config.n_embd, dim=-1)
            shape = (self.n_models * batch, length, heads, self.config.n_embd // heads)
            q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self._attention_scale(layer))
            attended = attended.transpose(1, 2).reshape(self.n_models, batch, length, self.config.n_embd)
            h = h + self._conv1d(attended, prefix + ".attn.c_proj")
            mlp = self.activation(self._conv1d(self._layer_norm(h, prefix + ".ln_2"), prefix + ".mlp.c_fc"))
            h = h + self._conv1d(mlp, prefix + ".mlp.c_proj")
        return self._layer_norm(h, "transformer.ln_f")

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Next-token logits (M, B, L, V), or (M, B, V) for the last position when last_only.

        Args:
            input_ids: token ids (B, L), L at most the models' n_positions.
            last_only: compute the last position's logits only.

        Returns:
            float32 logits on the stack's device, model m in row m (the order `models` were given).

        Raises:
            ValueError: if input_ids is not 2-d or longer than n_positions (hidden_states).
        """
        h = self.hidden_states(input_ids)
        if last_only:
            h = h[:, :, -1:]
        m, b, length, width = h.shape
        head = self.params["transformer.wte.weight" if self.tied else "lm_head.weight"]
        logits = torch.bmm(h.reshape(m, b * length, width), head.transpose(1, 2)).reshape(m, b, length, -1)
        return logits[:, :, 0] if last_only else logits
