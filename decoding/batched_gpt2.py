"""A GPT-2 forward pass over M models at once (the public model and N teachers), on shared inputs.

Each parameter is stacked across models (shape (M, ...)) and every matmul is one batched matmul,
so the hot path has no Python loop over teachers. It computes exactly what transformers'
GPT2LMHeadModel computes (tests compare the two) for the default GPT-2 settings: learned
positions, pre-LayerNorm blocks, gelu_new, tied LM head, attention scaled by 1/sqrt(head_dim).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from accounting.errors import require

_ACTIVATIONS = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
}


class StackedGPT2:
    """Stacked weights of M GPT-2 models with one configuration; `logits(input_ids)` -> (M, B, L, V)."""

    def __init__(self, models, device: str | torch.device = "cpu"):
        require(len(models) > 0, "need at least one model to stack")
        config = models[0].config
        for model in models[1:]:
            require(model.config.to_dict().get("n_embd") == config.n_embd and model.config.n_layer == config.n_layer
                    and model.config.vocab_size == config.vocab_size,
                    "every stacked model must share the GPT-2 shape (n_embd, n_layer, vocab_size)")
        require(config.model_type == "gpt2", f"the batched kernel supports GPT-2 models, got {config.model_type}")
        require(config.activation_function in _ACTIVATIONS, f"unsupported activation {config.activation_function}")
        require(not getattr(config, "scale_attn_by_inverse_layer_idx", False) and
                not getattr(config, "reorder_and_upcast_attn", False), "unsupported GPT-2 attention options")
        self.config = config
        self.n_models = len(models)
        self.activation = _ACTIVATIONS[config.activation_function]
        states = [{k: v.detach() for k, v in model.state_dict().items()} for model in models]
        self.device = torch.device(device)
        self.params = {name: torch.stack([state[name] for state in states]).float().contiguous().to(self.device)
                       for name in states[0] if not name.endswith(".attn.bias") and not name.endswith(".attn.masked_bias")
                       and name != "lm_head.weight"}

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

    @torch.no_grad()
    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
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
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            attended = attended.transpose(1, 2).reshape(self.n_models, batch, length, self.config.n_embd)
            h = h + self._conv1d(attended, prefix + ".attn.c_proj")
            mlp = self.activation(self._conv1d(self._layer_norm(h, prefix + ".ln_2"), prefix + ".mlp.c_fc"))
            h = h + self._conv1d(mlp, prefix + ".mlp.c_proj")
        return self._layer_norm(h, "transformer.ln_f")

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Next-token logits (M, B, L, V), or (M, B, V) for the last position when last_only."""
        h = self.hidden_states(input_ids)
        if last_only:
            h = h[:, :, -1:]
        m, b, length, width = h.shape
        wte = self.params["transformer.wte.weight"]  # tied LM head
        logits = torch.bmm(h.reshape(m, b * length, width), wte.transpose(1, 2)).reshape(m, b, length, -1)
        return logits[:, :, 0] if last_only else logits
