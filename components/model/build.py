"""The one factory: `build_model(cfg, head=...)` builds the encoder for pretraining and for every
fine-tuning head alike (cramming's pattern), of the arch model/arch.py names, initialised as
that arch is."""

from __future__ import annotations

from torch import nn

from components.model import heads
from components.model.arch import arch_of
from components.model.config import BertConfig
from components.model.pretraining import BertForPretraining


def build_model(cfg: BertConfig, head: str = "pretraining", num_labels: int = 0, crf: bool = False,
                max_span_words: int = 8) -> nn.Module:
    """The one factory: the encoder with the requested head, initialised as its arch is.

    Heads: `pretraining` (MLM + NSP), `encoder` (none), and the fine-tuning heads
    `classification` (also pairs), `token` (optionally with a CRF) and `span`.
    """
    arch = arch_of(cfg)
    builders = {
        "pretraining": lambda: BertForPretraining(cfg),
        "encoder": lambda: arch.encoder(cfg),
        "classification": lambda: heads.SequenceClassifier(cfg, num_labels),
        "token": lambda: heads.TokenClassifier(cfg, num_labels, crf),
        "span": lambda: heads.SpanClassifier(cfg, num_labels, max_span_words),
    }
    if head not in builders:
        raise ValueError(f"unknown head {head!r} (heads: {', '.join(builders)})")
    model = builders[head]()
    arch.init(model, cfg)
    return model


def task_model(bert: BertConfig, kind: str, space: list[str], crf: bool = False,
               max_span_words: int = 8) -> nn.Module:
    """The head for a task kind over `space` (model.inputs.label_space), randomly initialised."""
    head = "classification" if kind == "pair" else kind  # a pair is one [CLS] A [SEP] B [SEP] text
    # The span head adds NULL itself: `space` is NULL + labels.
    return build_model(bert, head, num_labels=len(space) - (kind == "span"), crf=crf,
                       max_span_words=max_span_words)
