"""The pretraining model: the encoder with BERT's heads, masked LM (tied to the token
embeddings) and next-sentence prediction, plus SpanBERT's span-boundary objective as an option;
or, as ELECTRA's discriminator (`cfg.rtd`), a replaced-token detection head instead of the MLM
head (the generator that makes the replacements: model/electra.py).

Shapes: B batch, T sequence length, H hidden, N selected (masked) positions in the batch,
V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from components.model.arch import arch_of
from components.model.config import IGNORE, BertConfig


class MLMHead(nn.Module):
    """dense + GELU + LayerNorm (without biases in ModernBERT), then the decoder tied to the
    token embeddings, plus a bias."""

    def __init__(self, cfg: BertConfig, embeddings: nn.Embedding):
        super().__init__()
        bias = arch_of(cfg).biases
        self.dense = nn.Linear(cfg.hidden, cfg.hidden, bias=bias)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps, bias=bias)
        self.decoder = embeddings  # tied: the (V, H) weight is shared, not copied
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V) scores over the vocabulary."""
        return F.linear(self.norm(F.gelu(self.dense(h))), self.decoder.weight, self.bias)

    def forward(self, h: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # h: (N, H) at selected positions only; the (N, V) projection dominates the cost, so it
        # is never computed for the ~85% of positions that carry no label. Logits and loss in
        # one call: compiled (training/compiling.py), the log-softmax fuses into the loss.
        logits = self.logits(h)  # (N, V)
        return logits, F.cross_entropy(logits, targets)


class SpanBoundaryHead(nn.Module):
    """SpanBERT's SBO: predict a masked token from the span's two boundary vectors and its
    relative position inside the span, via a 2-layer GELU/LayerNorm network and the tied decoder."""

    def __init__(self, cfg: BertConfig, embeddings: nn.Embedding):
        super().__init__()
        self.rel = nn.Embedding(cfg.max_span, cfg.hidden)
        eps = cfg.layer_norm_eps
        self.mlp = nn.Sequential(
            nn.Linear(3 * cfg.hidden, cfg.hidden), nn.GELU(), nn.LayerNorm(cfg.hidden, eps=eps),
            nn.Linear(cfg.hidden, cfg.hidden), nn.GELU(), nn.LayerNorm(cfg.hidden, eps=eps),
        )
        self.decoder = embeddings
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, left: torch.Tensor, right: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
        # left, right: (N, H) outputs at the tokens just outside the span; rel: (N,) offsets.
        h = self.mlp(torch.cat([left, right, self.rel(rel)], dim=-1))
        return F.linear(h, self.decoder.weight, self.bias)  # (N, V)


class RTDHead(nn.Module):
    """ELECTRA's discriminator head (transformers' ElectraDiscriminatorPredictions): dense + GELU,
    then one logit per token, "was this token replaced?"."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.hidden)
        self.out = nn.Linear(cfg.hidden, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.dense(h))).squeeze(-1)  # (B, T, H) -> (B, T)


class BertForPretraining(nn.Module):
    """Encoder + pooler + MLM head or RTD head (+ NSP head, + SBO head): returns the losses and
    what the metrics need."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        arch = arch_of(cfg)
        self.encoder = arch.encoder(cfg)
        self.pooler = arch.pooler(cfg)
        self.mlm = None if cfg.rtd else MLMHead(cfg, self.encoder.embeddings.word)
        self.rtd = RTDHead(cfg) if cfg.rtd else None
        self.rtd_weight = 1.0  # ELECTRA's lambda; model/electra.py sets it
        self.nsp = nn.Linear(cfg.hidden, 2)
        self.sbo = SpanBoundaryHead(cfg, self.encoder.embeddings.word) if cfg.sbo else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor, mlm_labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None,
                sbo_left: torch.Tensor | None = None, sbo_right: torch.Tensor | None = None,
                sbo_rel: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                rtd_labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        hidden = self.encoder(input_ids, token_type_ids, attention_mask, position_ids)  # (B, T, H)
        out: dict[str, torch.Tensor] = {}
        loss = hidden.new_zeros(())
        if self.mlm is not None:
            selected = mlm_labels != IGNORE  # (B, T)
            targets = mlm_labels[selected]  # (N,)
            logits, mlm_loss = self.mlm(hidden[selected], targets)  # (N, V), ()
            out.update(mlm_loss=mlm_loss, mlm_logits=logits, mlm_targets=targets)
            loss = loss + out["mlm_loss"]
        if self.rtd is not None:
            # rtd_labels: (B, T) 1 where the generator replaced the token; padding carries no loss.
            real = attention_mask.bool()
            logits = self.rtd(hidden)[real]  # (M,) over the M real tokens of the batch
            out.update(rtd_loss=F.binary_cross_entropy_with_logits(logits, rtd_labels[real].float()),
                       rtd_logits=logits, rtd_targets=rtd_labels[real])
            loss = loss + self.rtd_weight * out["rtd_loss"]
        if next_sentence_label is not None:
            nsp_logits = self.nsp(self.pooler(hidden))  # (B, 2)
            if bool((next_sentence_label >= 0).any()):
                out["nsp_loss"] = F.cross_entropy(nsp_logits, next_sentence_label.long(), ignore_index=-1)
                out["nsp_logits"] = nsp_logits
                loss = loss + out["nsp_loss"]
            else:  # no pairs in this batch (packing, short-sequence phase): the pooler and NSP
                loss = loss + 0.0 * nsp_logits.sum()  # head stay in the graph, as DDP requires
        if self.sbo is not None and sbo_left is not None:
            selected, targets = mlm_labels != IGNORE, out["mlm_targets"]
            rows = selected.nonzero()[:, 0]  # (N,) batch row of each selected position
            sbo_logits = self.sbo(hidden[rows, sbo_left[selected]], hidden[rows, sbo_right[selected]],
                                  sbo_rel[selected])
            out["sbo_loss"] = F.cross_entropy(sbo_logits, targets)
            loss = loss + out["sbo_loss"]
        out["loss"] = loss
        return out


def count_flops_per_token(cfg: BertConfig, seq_len: int, predicted_fraction: float) -> float:
    """Training FLOPs per token (forward + backward = 3x forward) of matmuls and attention (a
    local layer's masked scores included: SDPA computes them)."""
    H, L, F_, V = cfg.hidden, cfg.layers, cfg.intermediate, cfg.vocab_size
    ff = arch_of(cfg).ff_matrices * H * F_
    per_layer = 2 * (3 * H * H + H * H + ff) + 2 * 2 * seq_len * H  # linears + QK^T, AV
    head = predicted_fraction * 2 * (H * H + H * V)  # sparse MLM head
    return 3 * (L * per_layer + head)
