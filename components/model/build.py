"""The one factory: `build_model(cfg, head=...)` builds the encoder for pretraining and for every
fine-tuning head alike (cramming's pattern), initialised as BERT is."""

from __future__ import annotations

import math

import torch
from torch import nn

from components.model import heads
from components.model.config import BertConfig
from components.model.encoder import make_encoder
from components.model.pretraining import BertForPretraining


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


def sinusoids(positions: int, dim: int) -> torch.Tensor:
    """The Transformer's sinusoidal table (positions, dim): nearby positions have similar rows,
    and the dot product of two rows depends on their distance only."""
    pos = torch.arange(positions, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(positions, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table


def build_model(cfg: BertConfig, head: str = "pretraining", num_labels: int = 0, crf: bool = False,
                max_span_words: int = 8) -> nn.Module:
    """The one factory: the encoder with the requested head, initialised as BERT is.

    Heads: `pretraining` (MLM + NSP), `encoder` (none), and the fine-tuning heads
    `classification` (also pairs), `token` (optionally with a CRF) and `span`.
    """
    builders = {
        "pretraining": lambda: BertForPretraining(cfg),
        "encoder": lambda: make_encoder(cfg),
        "classification": lambda: heads.SequenceClassifier(cfg, num_labels),
        "token": lambda: heads.TokenClassifier(cfg, num_labels, crf),
        "span": lambda: heads.SpanClassifier(cfg, num_labels, max_span_words),
    }
    if head not in builders:
        raise ValueError(f"unknown head {head!r} (heads: {', '.join(builders)})")
    model = builders[head]()
    if cfg.arch == "modern":
        init_modern(model, cfg)
        return model
    init_weights(model, cfg.init_std)
    if cfg.position_init == "sinusoidal":
        # Random positions give near-uniform attention: every token first sees a bag of words.
        # Sinusoids (at the scale of the token embeddings, so they don't drown them) hand
        # attention a distance signal from the first step.
        encoder = model.encoder if hasattr(model, "encoder") else model
        table = sinusoids(cfg.max_position, cfg.hidden)
        with torch.no_grad():
            encoder.embeddings.position.weight.copy_(table * (cfg.init_std / table.std()))
    return model


def task_model(bert: BertConfig, kind: str, space: list[str], crf: bool = False,
               max_span_words: int = 8) -> nn.Module:
    """The head for a task kind over `space` (model.inputs.label_space), randomly initialised."""
    head = "classification" if kind == "pair" else kind  # a pair is one [CLS] A [SEP] B [SEP] text
    # The span head adds NULL itself: `space` is NULL + labels.
    return build_model(bert, head, num_labels=len(space) - (kind == "span"), crf=crf,
                       max_span_words=max_span_words)
