"""The architecture, chosen here once: `model.arch` (BertConfig.arch) names one of ARCHS, and the
code that builds, initialises, converts and trains a model asks that entry, never the name
(cramming's construction). `classic` is the 2018 BERT block (model/encoder.py, transformers'
BERT layout in model/hf_layout.py); `modern` is ModernBERT's (model/modern.py, model/hf_modern.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from components.model import encoder, hf_layout, hf_modern, modern
from components.model.config import BertConfig


@dataclass(frozen=True)
class Arch:
    """One architecture: its parts, its conventions, and its layout in transformers."""

    encoder: Callable[[BertConfig], nn.Module]
    """Token ids in, contextual vectors (B, T, H) out."""
    pooler: Callable[[BertConfig], nn.Module]
    """The [CLS] summary (B, T, H) -> (B, H) that NSP and the sentence heads read."""
    token_transform: Callable[[BertConfig], nn.Module]
    """What a token head applies to each vector (B, T, H) before its classifier."""
    init: Callable[[nn.Module, BertConfig], None]
    """Initialises a new model, any head."""
    heads_from_pretraining: Callable[[nn.Module, nn.Module], None]
    """Starts a task model's heads from a pretraining model's (the encoder is copied apart)."""
    biases: bool
    """Whether the linear layers and LayerNorms carry biases (the MLM head's transform follows)."""
    ff_matrices: int
    """H x intermediate matrices of a block's feed-forward: 2 (in, out) or 3 (GeGLU's value,
    gate and out)."""
    layer_norm_eps: float
    """LayerNorm epsilon of an encoder pretrained here."""
    electra: bool
    """Whether ELECTRA's generator can share its embeddings (token, position and segment)."""
    cuts: bool
    """Whether a checkpoint's blocks can be cut out and renumbered (a modern encoder's global
    layers follow their index)."""
    hf_name: str
    """transformers' name of the family: `{hf_name}ForSequenceClassification` ..."""
    has_hf_layout: Callable[[BertConfig], bool]
    """Whether transformers has this encoder (pre-norm BERT it has not)."""
    hf_config: Callable[[BertConfig], dict]
    """config.json of transformers' pretraining model of this shape."""
    hf_state_dict: Callable[..., dict[str, torch.Tensor]]
    """(pretraining model, skip=heads) -> its weights under transformers' names."""
    load_hf_state_dict: Callable[[nn.Module, dict[str, torch.Tensor]], list[str]]
    """(pretraining model, transformers-named weights) -> the heads they lack, left fresh."""
    hf_task_state_dict: Callable[[nn.Module, dict[str, torch.Tensor], str], dict[str, torch.Tensor]]
    """(pretraining shell with the task's encoder, the task model's state, task kind) -> the
    encoder and head transform under transformers' task model's names."""


CLASSIC = Arch(
    encoder=encoder.Encoder, pooler=encoder.Pooler, token_transform=lambda cfg: nn.Identity(),
    init=encoder.init_bert, heads_from_pretraining=encoder.pooler_from_pretraining,
    biases=True, ff_matrices=2, layer_norm_eps=1e-12, electra=True, cuts=True,
    hf_name="Bert", has_hf_layout=hf_layout.has_bert_layout, hf_config=hf_layout.bert_hf_config,
    hf_state_dict=hf_layout.bert_state_dict, load_hf_state_dict=hf_layout.load_bert_state_dict,
    hf_task_state_dict=hf_layout.bert_task_state_dict)

MODERN = Arch(
    encoder=modern.ModernEncoder, pooler=modern.Pooler,
    # ModernBERT's token head transforms each vector first (ModernBertForTokenClassification).
    token_transform=modern.PredictionHead,
    init=modern.init_modern, heads_from_pretraining=modern.heads_from_pretraining,
    biases=False, ff_matrices=3, layer_norm_eps=1e-5,  # ModernBERT's norm_eps
    electra=False, cuts=False,
    hf_name="ModernBert", has_hf_layout=lambda cfg: True, hf_config=hf_modern.hf_modern_config,
    hf_state_dict=hf_modern.modern_state_dict, load_hf_state_dict=hf_modern.load_modern_state_dict,
    hf_task_state_dict=hf_modern.modern_task_state_dict)

ARCHS = {"classic": CLASSIC, "modern": MODERN}


def arch_of(cfg: BertConfig) -> Arch:
    """The architecture of an encoder's config."""
    return ARCHS[cfg.arch]
