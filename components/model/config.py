"""The encoder's shape and regularisation (BertConfig), on its own so that the model records
(model/metadata.py) and the stages that only read them don't depend on the model's code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

IGNORE = -100  # label of positions that carry no loss


@dataclass
class BertConfig:
    """Shape and regularisation of the encoder."""

    vocab_size: int
    """Tokens in the vocabulary (the tokenizer's real size)."""
    hidden: int = 256
    """Hidden size H."""
    layers: int = 4
    """Transformer blocks."""
    heads: int = 4
    """Attention heads; H must divide evenly."""
    intermediate: int = 1024
    """Feed-forward inner size."""
    max_position: int = 512
    """Learned absolute positions."""
    type_vocab: int = 2
    """Segment (token type) ids."""
    dropout: float = 0.1
    """Dropout on embeddings, attention probabilities and block outputs."""
    norm: Literal["post", "pre"] = "post"
    """LayerNorm after each residual (BERT) or before each sublayer (pre-norm)."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon (BERT's value)."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation."""
    position_init: Literal["random", "sinusoidal"] = "random"
    """Start the learned position embeddings random (BERT) or as sinusoids (they stay learned)."""
    pad_id: int = 0
    """Id of [PAD]."""
    sbo: bool = False
    """Add SpanBERT's span-boundary objective head."""
    max_span: int = 10
    """Longest span the SBO head's relative position embedding covers."""
    rtd: bool = False
    """Pretrained as ELECTRA's discriminator: a replaced-token detection head, no MLM head."""
    arch: Literal["classic", "modern"] = "classic"
    """BERT's block (classic) or ModernBERT's (modern: pre-norm, GeGLU, RoPE, no biases,
    local/global attention; model/modern.py). Records written before modern existed are classic."""
    local_window: int = 128
    """modern: the span of a local layer's attention window (each token sees +-local_window/2)."""
    global_every: int = 3
    """modern: layers 0, n, 2n ... attend globally, the others locally."""
    rope_base_global: float = 160_000.0
    """modern: RoPE base of the global layers."""
    rope_base_local: float = 10_000.0
    """modern: RoPE base of the local layers."""

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.arch == "modern" and (self.hidden // self.heads) % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions: the head size hidden/heads = "
                             f"{self.hidden // self.heads} must be even")


def shape_of(cfg: BertConfig) -> dict[str, int]:
    """The shape fields of a config, for messages and stats."""
    return {k: getattr(cfg, k) for k in ("vocab_size", "hidden", "layers", "heads", "intermediate")}
