"""ModernBERT's encoder (Warner et al. 2024) in plain torch: pre-norm blocks with LayerNorms and
linear layers without biases, a GeGLU feed-forward, rotary positions (one base for the global
layers, another for the local ones), attention that alternates a sliding window with a global
layer every `global_every` layers, and a final norm. No learned positions, no segment embeddings.

Parameter layout: one to one onto transformers' ModernBertModel (model/hf_modern.py renames).
model/arch.py's `modern` is made of these parts.
Documents packed into one row (position ids that restart at 0) attend only within themselves,
the block-diagonal mask of ModernBERT's unpadded training (model/attention_mask.py), through SDPA.

Shapes: B batch, T sequence length, H hidden, D head size (H / heads).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from components.model.attention_mask import attention_allowed, probabilities, windowed
from components.model.config import BertConfig


def _norm(cfg: BertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps, bias=False)


class Rotary(nn.Module):
    """cos and sin of rotary position embeddings (the rotate-half form, as transformers')."""

    def __init__(self, head_dim: int, base: float):
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (D/2,)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # fp32 whatever the module's precision: bf16 angles lose the far positions.
        angles = positions[..., None].float() * self.inv_freq.float()  # (B or 1, T, D/2)
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # (B or 1, 1, T, D)
        return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, heads, T, D) turned by its positions' angles, in fp32 (as transformers) then back."""
    full = x.float()
    x1, x2 = full.chunk(2, dim=-1)
    return (full * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


class Attention(nn.Module):
    """Bidirectional multi-head attention through SDPA, q and k rotated, no biases."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=False)
        self.out = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.p = cfg.dropout

    def _qkv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        B, T, H = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)
        return rotate(q, *rope), rotate(k, *rope), v  # (B, heads, T, D) each

    def probabilities(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                      mask: torch.Tensor | None) -> torch.Tensor:
        """The attention weights (B, heads, T, T) that forward's SDPA applies without returning."""
        q, k, _ = self._qkv(x, rope)
        return probabilities(q, k, mask)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None) -> torch.Tensor:
        B, T, H = x.shape
        q, k, v = self._qkv(x, rope)
        p = self.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return F.dropout(self.out(y.transpose(1, 2).reshape(B, T, H)), p, self.training)


class Block(nn.Module):
    """Pre-norm attention and GeGLU feed-forward with residuals; the first block's input is the
    already normalised embedding, so it has no attention norm (as ModernBERT)."""

    def __init__(self, cfg: BertConfig, index: int):
        super().__init__()
        self.attn_norm = _norm(cfg) if index else nn.Identity()
        self.attn = Attention(cfg)
        self.ff_norm = _norm(cfg)
        self.ff_in = nn.Linear(cfg.hidden, 2 * cfg.intermediate, bias=False)  # value and gate
        self.ff_out = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)
        self.p = cfg.dropout
        self.is_global = index % cfg.global_every == 0

    def _ff(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.ff_in(x).chunk(2, dim=-1)  # (B, T, I) each
        return self.ff_out(F.dropout(F.gelu(value) * gate, self.p, self.training))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, mask)
        return x + self._ff(self.ff_norm(x))


class Embeddings(nn.Module):
    """Token embeddings, LayerNorm, dropout: positions enter attention as rotations."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden, padding_idx=cfg.pad_id)
        self.norm = _norm(cfg)
        self.p = cfg.dropout

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.norm(self.word(input_ids)), self.p, self.training)  # (B, T, H)


class ModernEncoder(nn.Module):
    """Embeddings, the blocks and the final norm: token ids in, contextual vectors out."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.layers))
        self.final_norm = _norm(cfg)
        head_dim = cfg.hidden // cfg.heads
        self.rope_global = Rotary(head_dim, cfg.rope_base_global)
        self.rope_local = Rotary(head_dim, cfg.rope_base_local)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        # token_type_ids: accepted for the common interface; ModernBERT has no segments.
        T, device = input_ids.shape[1], input_ids.device
        global_mask = attention_allowed(T, device, attention_mask, position_ids)
        local_mask = windowed(global_mask, self.cfg.local_window, T, device)
        positions = torch.arange(T, device=device)[None] if position_ids is None else position_ids
        rope_global, rope_local = self.rope_global(positions), self.rope_local(positions)
        x = self.embeddings(input_ids)
        for block in self.blocks:
            if block.is_global:
                x = block(x, rope_global, global_mask)
            else:
                x = block(x, rope_local, local_mask)
        return self.final_norm(x)  # (B, T, H)


class PredictionHead(nn.Module):
    """dense + GELU + LayerNorm without biases: ModernBERT's head under the MLM decoder, the
    [CLS] pooler of sentence tasks and the per-token transform of token tasks."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.norm = _norm(cfg)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.dense(h)))


class Pooler(PredictionHead):
    """ModernBERT's [CLS] summary for sentence tasks (transformers' classifier_pooling `cls`)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().forward(hidden[:, 0])  # (B, T, H) -> (B, H)


def init_modern(model: nn.Module, cfg: BertConfig) -> None:
    """ModernBERT's initialisation: normal(0, std) truncated at 2 std; the layers that write into
    the residual stream (attention out, feed-forward out) and the heads' dense layers at
    std / sqrt(2 layers), so the stream's variance does not grow with depth; task classifiers at
    hidden^-1/2 (transformers' ModernBertPreTrainedModel._init_weights); zero biases (heads)."""
    out = cfg.init_std / math.sqrt(2.0 * cfg.layers)
    for name, m in model.named_modules():
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if not isinstance(m, (nn.Linear, nn.Embedding)):
            continue
        std = cfg.init_std
        if name.endswith(("attn.out", "ff_out", "pooler.dense", "mlm.dense", "head.dense")):
            std = out
        elif name == "classifier" or name == "classifier.3":
            std = cfg.hidden ** -0.5
        nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
        if isinstance(m, nn.Embedding) and m.padding_idx is not None:
            with torch.no_grad():
                m.weight[m.padding_idx].zero_()


def heads_from_pretraining(model: nn.Module, pretrained: nn.Module) -> None:
    """ModernBERT exports no pooler: a task model's sentence and token heads start from the MLM
    head's transform (dense, norm), as transformers' ModernBertFor*Classification load it."""
    transform = {k: v for k, v in pretrained.mlm.state_dict().items() if k.startswith(("dense.", "norm."))}
    for name in ("pooler", "head"):
        if isinstance(getattr(model, name, None), PredictionHead):
            getattr(model, name).load_state_dict(transform)
