"""Fine-tuning heads on the encoder, in plain torch: sequence (and pair) classification, token
labeling with an optional CRF, and span labeling.

Shapes: B batch, T subword positions, H hidden, C labels, W words, S enumerated spans.
The classification and token heads keep transformers' layout (pooler + dropout + linear;
dropout + linear per token), so their weights map onto BertFor{Sequence,Token}Classification.
"""

from __future__ import annotations

import torch
from torch import nn

from components.model.arch import arch_of
from components.model.config import BertConfig


class SequenceClassifier(nn.Module):
    """softmax over a linear layer on the pooled [CLS] vector; pairs come as [CLS] A [SEP] B [SEP]."""

    def __init__(self, cfg: BertConfig, num_labels: int):
        super().__init__()
        arch = arch_of(cfg)
        self.encoder = arch.encoder(cfg)
        self.pooler = arch.pooler(cfg)  # pretrained by NSP: the [CLS] summary BERT classifies from
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
        rows, m = torch.arange(B), mask.to(emissions.dtype)
        # The gold path's score, every word at once: start, emissions, transitions, end.
        emitted = emissions.gather(2, tags[:, :, None]).squeeze(2) * m  # (B, W)
        moved = self.transitions[tags[:, :-1], tags[:, 1:]] * m[:, 1:]  # (B, W - 1)
        last = tags[rows, mask.sum(1) - 1]
        score = self.start[tags[:, 0]] + emitted.sum(1) + moved.sum(1) + self.end[last]  # (B,)
        # The partition function: a recursion over the words (the only loop).
        alpha = self.start + emissions[:, 0]  # (B, C): log-sum over paths ending in each tag
        for w in range(1, W):
            nxt = torch.logsumexp(alpha[:, :, None] + self.transitions + emissions[:, w, None, :], dim=1)
            alpha = torch.where(mask[:, w, None], nxt, alpha)
        return (torch.logsumexp(alpha + self.end, dim=1) - score).mean()

    def log_marginals(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log P(word w has tag c | sentence) under the CRF, (B, W, C) (differentiable; rows
        past a sentence's end are meaningless): forward and backward recursions, then
        alpha + beta - log Z. Distillation's per-word distributions."""
        B, W, C = emissions.shape
        alphas = [self.start + emissions[:, 0]]  # (B, C) each: paths ending in a tag at w
        for w in range(1, W):
            nxt = torch.logsumexp(alphas[-1][:, :, None] + self.transitions + emissions[:, w, None, :], dim=1)
            alphas.append(torch.where(mask[:, w, None], nxt, alphas[-1]))
        # beta at a sentence's last word is `end`; before it, the paths from each tag to the end.
        lengths = mask.sum(1)  # (B,)
        betas = [self.end.expand(B, C)]
        for w in range(W - 2, -1, -1):
            nxt = torch.logsumexp(self.transitions + (emissions[:, w + 1] + betas[0])[:, None, :], dim=2)
            betas.insert(0, torch.where((lengths > w + 1)[:, None], nxt, self.end.expand(B, C)))
        alpha, beta = torch.stack(alphas, 1), torch.stack(betas, 1)  # (B, W, C)
        log_z = torch.logsumexp(alphas[-1] + self.end, dim=1)  # (B,)
        return alpha + beta - log_z[:, None, None]

    def viterbi(self, emissions: torch.Tensor, mask: torch.Tensor,
                forbidden: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[list[int]]:
        """Best tag sequence of each row, of length mask.sum(1); `forbidden` (start (C,),
        transitions (C, C)), -inf where a tag may not start or follow, 0 elsewhere."""
        start, transitions, end = (p.detach().to(emissions.device)
                                   for p in (self.start, self.transitions, self.end))
        if forbidden is not None:
            start, transitions = start + forbidden[0], transitions + forbidden[1]
        return viterbi(emissions, mask, start, transitions, end)


def viterbi(emissions: torch.Tensor, mask: torch.Tensor, start: torch.Tensor, transitions: torch.Tensor,
            end: torch.Tensor) -> list[list[int]]:
    """The highest-scoring tag sequence of each row (length mask.sum(1)) under per-word scores
    `emissions` (B, W, C), `start` and `end` scores (C,) and `transitions` (C from, C to)."""
    B, W, _ = emissions.shape
    best = start + emissions[:, 0]  # (B, C)
    back = []  # per word w >= 1: (B, C) the best previous tag for each tag at w
    for w in range(1, W):
        top, arg = (best[:, :, None] + transitions).max(dim=1)  # over (B, C from, C to)
        back.append(arg)
        best = torch.where(mask[:, w, None], top + emissions[:, w], best)
    # Backtrack all rows at once from each row's last word (a row past its end keeps its tag).
    lengths, rows = mask.sum(1), torch.arange(B)
    tag = (best + end).argmax(1)  # (B,)
    path = torch.empty(B, W, dtype=torch.long)
    path[:, W - 1] = tag
    for w in range(W - 1, 0, -1):
        tag = torch.where(lengths > w, back[w - 1][rows, tag], tag)
        path[:, w - 1] = tag
    return [row[:n] for row, n in zip(path.tolist(), lengths.tolist(), strict=True)]


class TokenClassifier(nn.Module):
    """A linear layer per subword position; with `crf`, a CRF over the words' first subwords."""

    def __init__(self, cfg: BertConfig, num_labels: int, crf: bool = False):
        super().__init__()
        arch = arch_of(cfg)
        self.encoder = arch.encoder(cfg)
        self.head = arch.token_transform(cfg)  # ModernBERT's head transform; none in BERT
        self.drop = nn.Dropout(cfg.dropout)
        self.classifier = nn.Linear(cfg.hidden, num_labels)
        self.crf = CRF(num_labels) if crf else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids, token_type_ids, attention_mask)  # (B, T, H)
        return self.classifier(self.drop(self.head(hidden)))  # (B, T, C) emissions


class SpanClassifier(nn.Module):
    """Each enumerated word span (i, j) as [s_i; e_j; g_ij; width]: separate start and end
    feed-forward networks on the span's first and last subword, and g_ij an attention-pooled
    summary of its subwords; softmax over NULL (index 0) and the labels."""

    def __init__(self, cfg: BertConfig, num_labels: int, max_span_words: int):
        super().__init__()
        H = cfg.hidden
        self.encoder = arch_of(cfg).encoder(cfg)
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
