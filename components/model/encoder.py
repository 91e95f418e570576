"""The BERT encoder in plain torch (no Lightning, no I/O): embeddings, bidirectional attention
blocks, the pooler, BERT's initialisation; its shape is model/config.py's BertConfig, and
model/arch.py's `classic` is made of these parts.

Shapes in comments: B batch, T sequence length, H hidden. The parameter layout maps one to one
onto transformers' BERT (model/hf_layout.py), so an exported encoder loads there with no missing
or unexpected keys (post-norm).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from components.model.attention_mask import attention_allowed, probabilities
from components.model.config import BertConfig


class Embeddings(nn.Module):
    """Token + learned absolute position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden, padding_idx=cfg.pad_id)
        self.position = nn.Embedding(cfg.max_position, cfg.hidden)
        self.token_type = nn.Embedding(cfg.type_vocab, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        T = input_ids.shape[1]
        pos = self.position.weight[:T] if position_ids is None else self.position(position_ids)
        x = self.word(input_ids) + pos + self.token_type(token_type_ids)
        return self.drop(self.norm(x))  # (B, T, H)


class SelfAttention(nn.Module):
    """Bidirectional multi-head attention through SDPA, with a padding mask and no causal mask."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)  # one matmul for q, k and v
        self.out = nn.Linear(cfg.hidden, cfg.hidden)
        self.p = cfg.dropout

    def probabilities(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The attention weights (B, heads, T, T) that forward's SDPA applies without returning."""
        B, T, H = x.shape
        q, k, _ = self.qkv(x).view(B, T, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)
        return probabilities(q, k, mask)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, H = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)
        # q, k, v: (B, heads, T, H/heads); mask: (B, 1, 1, T) or (B, 1, T, T), True where attention may look.
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=self.p if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, H))


class Block(nn.Module):
    """Attention and feed-forward sublayers with residuals; post-norm (BERT) or pre-norm."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.attn_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.ff_in = nn.Linear(cfg.hidden, cfg.intermediate)
        self.ff_out = nn.Linear(cfg.intermediate, cfg.hidden)
        self.ff_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.pre = cfg.norm == "pre"

    def _ff(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff_out(F.gelu(self.ff_in(x)))  # exact (erf) GELU, as BERT

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.pre:
            x = x + self.drop(self.attn(self.attn_norm(x), mask))
            return x + self.drop(self._ff(self.ff_norm(x)))
        x = self.attn_norm(x + self.drop(self.attn(x, mask)))
        return self.ff_norm(x + self.drop(self._ff(x)))


class Encoder(nn.Module):
    """Embeddings and the stack of blocks: token ids in, contextual vectors out."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        # Pre-norm leaves the residual stream unnormalised: one LayerNorm at the top.
        self.final_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        # (B, 1, 1, T) padding, or (B, 1, T, T) with packed documents; None: all attend to all
        mask = attention_allowed(input_ids.shape[1], input_ids.device, attention_mask, position_ids)
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.final_norm(x) if self.final_norm is not None else x  # (B, T, H)


class Pooler(nn.Module):
    """tanh dense layer on the [CLS] vector."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))  # (B, H)


def init_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: normal(0, std) for weights, zeros for biases, ones for LayerNorm."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def sinusoids(positions: int, dim: int) -> torch.Tensor:
    """The Transformer's sinusoidal table (positions, dim): nearby positions have similar rows,
    and the dot product of two rows depends on their distance only."""
    pos = torch.arange(positions, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(positions, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table


def init_bert(model: nn.Module, cfg: BertConfig) -> None:
    """A new model (any head) initialised as BERT is, its positions optionally as sinusoids."""
    init_weights(model, cfg.init_std)
    if cfg.position_init == "sinusoidal":
        # Random positions give near-uniform attention: every token first sees a bag of words.
        # Sinusoids (at the scale of the token embeddings, so they don't drown them) hand
        # attention a distance signal from the first step.
        encoder = model.encoder if hasattr(model, "encoder") else model
        table = sinusoids(cfg.max_position, cfg.hidden)
        with torch.no_grad():
            encoder.embeddings.position.weight.copy_(table * (cfg.init_std / table.std()))


def pooler_from_pretraining(model: nn.Module, pretrained: nn.Module) -> None:
    """A task model's pooler (sentence tasks) from the pretraining model's, trained by NSP; a
    token model has none."""
    if hasattr(model, "pooler"):
        model.pooler.load_state_dict(pretrained.pooler.state_dict())
