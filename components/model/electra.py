"""ELECTRA's replaced-token detection (Clark et al. 2020): a small generator fills the masked
positions with its samples, and the discriminator, the encoder that fine-tuning uses, learns
from every token whether it was replaced, not only from the 15% that were masked.

The generator is a narrower encoder of the same depth (`generator_config`: a quarter of the
width, as in the paper) on the discriminator's embeddings: token, position and segment
embeddings are shared, projected down to its width, and its MLM head is tied to the shared
token embeddings. Replacements are sampled from its softmax without gradient; the loss is the
generator's MLM loss + `rtd_weight` (the paper's lambda, 50) x the discriminator's per-token
binary cross-entropy (+ the pair objective on the discriminator's pooler). The generator is
only a training aid: the export is the discriminator (model/folders.write_encoder).

Shapes: B batch, T sequence length, H discriminator hidden, G generator hidden, N selected
(masked) positions, V vocabulary.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from components.model.attention_mask import attention_allowed
from components.model.config import IGNORE, BertConfig
from components.model.encoder import Block, Encoder, init_weights
from components.model.pretraining import BertForPretraining


def generator_config(disc: BertConfig, fraction: float) -> BertConfig:
    """The generator's shape: `fraction` of the discriminator's width (heads of 64 dims, at
    least one), the same depth, a 4x feed-forward."""
    hidden = max(16, int(round(disc.hidden * fraction / 16)) * 16)
    heads = max(1, hidden // 64)
    return replace(disc, hidden=hidden, heads=heads, intermediate=4 * hidden, rtd=False, sbo=False)


class Generator(nn.Module):
    """Blocks of width G over the shared embeddings (projected from H), an MLM head back to H
    whose decoder is the shared token embedding matrix (passed in at each call)."""

    def __init__(self, cfg: BertConfig, embedding_dim: int):
        super().__init__()
        self.project = nn.Linear(embedding_dim, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.dense = nn.Linear(cfg.hidden, embedding_dim)
        self.norm = nn.LayerNorm(embedding_dim, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, embedded: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.project(embedded)  # (B, T, H) -> (B, T, G)
        for block in self.blocks:
            x = block(x, mask)
        return x

    def logits(self, h: torch.Tensor, decoder: torch.Tensor) -> torch.Tensor:
        # h: (N, G) at the selected positions only; decoder: the (V, H) token embeddings.
        return F.linear(self.norm(F.gelu(self.dense(h))), decoder, self.bias)  # (N, V)


class ElectraForPretraining(nn.Module):
    """Generator + discriminator: the same inputs and outputs as BertForPretraining (the MLM
    figures are the generator's), plus the discriminator's RTD loss and logits."""

    def __init__(self, disc: BertForPretraining, generator: BertConfig, rtd_weight: float):
        super().__init__()
        if not disc.cfg.rtd:
            raise ValueError("the discriminator needs an RTD head (BertConfig.rtd)")
        self.disc = disc
        self.disc.rtd_weight = rtd_weight
        self.gen = Generator(generator, disc.cfg.hidden)
        init_weights(self.gen, generator.init_std)

    @property
    def encoder(self) -> Encoder:
        """The discriminator's encoder: what is exported and fine-tuned."""
        return self.disc.encoder

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor, mlm_labels: torch.Tensor,
                next_sentence_label: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        embeddings = self.disc.encoder.embeddings
        # the discriminator's own mask: padding, and packed documents kept apart
        mask = attention_allowed(input_ids.shape[1], input_ids.device, attention_mask, position_ids)
        hidden = self.gen(embeddings(input_ids, token_type_ids, position_ids), mask)  # (B, T, G)
        selected = mlm_labels != IGNORE  # (B, T)
        targets = mlm_labels[selected]  # (N,)
        logits = self.gen.logits(hidden[selected], embeddings.word.weight)  # (N, V)
        mlm_loss = F.cross_entropy(logits, targets)
        with torch.no_grad():  # the samples carry no gradient back to the generator
            sampled = torch.multinomial(logits.float().softmax(-1), 1).squeeze(-1)  # (N,)
        original = input_ids.masked_scatter(selected, targets)  # the text before masking
        corrupted = original.masked_scatter(selected, sampled)
        out = self.disc(corrupted, token_type_ids, attention_mask, next_sentence_label=next_sentence_label,
                        position_ids=position_ids, rtd_labels=corrupted != original)
        out.update(mlm_loss=mlm_loss, mlm_logits=logits, mlm_targets=targets, loss=mlm_loss + out["loss"])
        return out
