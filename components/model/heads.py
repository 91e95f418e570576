"""Fine-tuning heads on the encoder, in plain torch: sequence (and pair) classification, token
labeling with an optional CRF, and span labeling.

Shapes: B batch, T subword positions, H hidden, C labels, W words, S enumerated spans.
The classification and token heads keep transformers' layout (pooler + dropout + linear;
dropout + linear per token), so their weights map onto BertFor{Sequence,Token}Classification.
"""

from __future__ import annotations

import torch
from torch import nn

from components.model.config import BertConfig
from components.model.encoder import Encoder, Pooler


class SequenceClassifier(nn.Module):
    """softmax over a linear layer on the pooled [CLS] vector; pairs come as [CLS] A [SEP] B [SEP]."""

    def __init__(self, cfg: BertConfig, num_labels: int):
        super().__init__()
        self.encoder = Encoder(cfg)
        self.pooler = Pooler(cfg)  # pretrained by NSP: the [CLS] summary BERT classifies from
        self.drop = nn.Dropout(cfg.dropout)
        self.classifier = nn.Linear(cfg.hidden, num_labels)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids, token_type_ids, attention_mask)  # (B, T, H)
        return self.classifier(self.drop(self.pooler(hidden)))  # (B, C)


class CRF(nn.Module):
    """Linear-chain CRF over word-level emissions: negative log-likelihood and Viterbi."""

    def __init__(self, num_tags: int):
        super().__init__()
        self.start = nn.Parameter(torch.zeros(num_tags))
        self.end = nn.Parameter(torch.zeros(num_tags))
        self.transitions = nn.Parameter(torch.zeros(num_tags, num_tags))  # [from, to]

    def nll(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean negative log-likelihood; emissions (B, W, C), tags (B, W), mask (B, W) with
        every sequence's words first (mask[:, 0] all True)."""
        B, W, _ = emissions.shape
        rows = torch.arange(B)
        score = self.start[tags[:, 0]] + emissions[rows, 0, tags[:, 0]]  # (B,)
        alpha = self.start + emissions[:, 0]  # (B, C): log-sum over paths ending in each tag
        for w in range(1, W):
            m = mask[:, w]
            step = self.transitions[tags[:, w - 1], tags[:, w]] + emissions[rows, w, tags[:, w]]
            score = score + step * m
            nxt = torch.logsumexp(alpha[:, :, None] + self.transitions + emissions[:, w, None, :], dim=1)
            alpha = torch.where(m[:, None], nxt, alpha)
        last = tags[rows, mask.sum(1) - 1]
        score = score + self.end[last]
        return (torch.logsumexp(alpha + self.end, dim=1) - score).mean()

    def viterbi(self, emissions: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
        """Best tag sequence of each row, of length mask.sum(1)."""
        B, W, _ = emissions.shape
        best = self.start + emissions[:, 0]  # (B, C)
        back = []
        for w in range(1, W):
            scores = best[:, :, None] + self.transitions  # (B, C from, C to)
            top, arg = scores.max(dim=1)
            back.append(arg)
            best = torch.where(mask[:, w, None], top + emissions[:, w], best)
        best = best + self.end
        paths = []
        for b in range(B):
            n = int(mask[b].sum())
            tag = int(best[b].argmax())
            path = [tag]
            for w in range(n - 1, 0, -1):
                tag = int(back[w - 1][b, tag])
                path.append(tag)
            paths.append(path[::-1])
        return paths


class TokenClassifier(nn.Module):
    """A linear layer per subword position; with `crf`, a CRF over the words' first subwords."""

    def __init__(self, cfg: BertConfig, num_labels: int, crf: bool = False):
        super().__init__()
        self.encoder = Encoder(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.classifier = nn.Linear(cfg.hidden, num_labels)
        self.crf = CRF(num_labels) if crf else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids, token_type_ids, attention_mask)  # (B, T, H)
        return self.classifier(self.drop(hidden))  # (B, T, C) emissions


class SpanClassifier(nn.Module):
    """Each enumerated word span (i, j) as [s_i; e_j; g_ij; width]: separate start and end
    feed-forward networks on the span's first and last subword, and g_ij an attention-pooled
    summary of its subwords; softmax over NULL (index 0) and the labels."""

    def __init__(self, cfg: BertConfig, num_labels: int, max_span_words: int):
        super().__init__()
        H = cfg.hidden
        self.encoder = Encoder(cfg)
        self.start = nn.Sequential(nn.Linear(H, H), nn.GELU(), nn.Dropout(cfg.dropout))
        self.end = nn.Sequential(nn.Linear(H, H), nn.GELU(), nn.Dropout(cfg.dropout))
        self.attend = nn.Linear(H, 1)  # a score per subword: which ones summarise the span
        self.width = nn.Embedding(max_span_words, 32)  # span length in words is a strong cue
        self.classifier = nn.Sequential(nn.Linear(3 * H + 32, H), nn.GELU(), nn.Dropout(cfg.dropout),
                                        nn.Linear(H, num_labels + 1))

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor, span_start: torch.Tensor, span_end: torch.Tensor,
                span_width: torch.Tensor) -> torch.Tensor:
        # span_start/span_end: (B, S) subword positions of the span's first/last subword
        # (inclusive); span_width: (B, S) words - 1. Padding spans point at position 0.
        hidden = self.encoder(input_ids, token_type_ids, attention_mask)  # (B, T, H)
        H, T = hidden.shape[-1], hidden.shape[1]
        # The classifier's first layer is linear in [s; e; g; width], so each part is projected
        # where it is cheapest: start and end per subword, then picked per span (S is ~5T, the
        # head cost as much as the encoder computed per span); the pooling commutes with the
        # projection; width per width. Same parameters, same function (dropout masks aside).
        first = self.classifier[0]
        w_s, w_e, w_g, w_w = first.weight.split([H, H, H, self.width.embedding_dim], dim=1)  # (H, .)
        rows = torch.arange(hidden.shape[0], device=hidden.device)[:, None]
        s = (self.start(hidden) @ w_s.T)[rows, span_start]  # (B, S, H)
        e = (self.end(hidden) @ w_e.T)[rows, span_end]  # (B, S, H)
        pos = torch.arange(T, device=hidden.device)
        inside = (pos >= span_start[..., None]) & (pos <= span_end[..., None])  # (B, S, T)
        scores = self.attend(hidden).squeeze(-1)[:, None, :]  # (B, 1, T)
        weights = torch.softmax(scores.masked_fill(~inside, float("-inf")), dim=-1)  # (B, S, T)
        g = weights @ (hidden @ w_g.T)  # (B, S, H)
        width = (self.width.weight @ w_w.T)[span_width]  # (B, S, H)
        return self.classifier[1:](s + e + g + width + first.bias)  # (B, S, C+1)
