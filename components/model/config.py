"""The encoder's shape and regularisation (BertConfig), on its own so that the model records
(model/metadata.py) and the stages that only read them don't depend on the model's code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

IGNORE = -100  # label of positions that carry no loss


# SpanBERT's longest span, in words: where the masker clips a span's length and how far the SBO
# head's relative positions reach.
MAX_SPAN = 10

# ModernBERT's attention pattern and RoPE bases as transformers' ModernBertConfig sets them
# unless told: what a config.json that names none of them means, and what a classic encoder
# (a BERT config.json, a record from before model.arch) carries, unused.
MODERN_DEFAULTS = {"local_window": 128, "global_every": 3, "rope_base_global": 160_000.0,
                   "rope_base_local": 10_000.0}


@dataclass(kw_only=True)
class BertConfig:
    """Shape and regularisation of the encoder. No defaults for what params.yaml sets: the
    pretrain stage passes its values (training.pretrain.bert_config), a checkpoint's reader those
    of its config.json, a model folder's record its own."""

    vocab_size: int
    """Tokens in the vocabulary (the tokenizer's real size)."""
    hidden: int
    """Hidden size H."""
    layers: int
    """Transformer blocks."""
    heads: int
    """Attention heads; H must divide evenly."""
    intermediate: int
    """Feed-forward inner size."""
    max_position: int
    """Longest sequence: learned absolute positions (classic), RoPE's reach (modern)."""
    type_vocab: int = 2
    """Segment (token type) ids."""
    dropout: float
    """Dropout on embeddings, attention probabilities and block outputs."""
    norm: Literal["post", "pre"]
    """classic: LayerNorm after each residual (BERT) or before each sublayer (pre-norm)."""
    layer_norm_eps: float
    """LayerNorm epsilon: the arch's (model/arch.py), or the checkpoint's."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation."""
    position_init: Literal["random", "sinusoidal"]
    """Start the learned position embeddings random (BERT) or as sinusoids (they stay learned)."""
    pad_id: int = 0
    """Id of [PAD]."""
    sbo: bool
    """Add SpanBERT's span-boundary objective head."""
    max_span: int = MAX_SPAN
    """Longest span the SBO head's relative position embedding covers."""
    rtd: bool
    """Pretrained as ELECTRA's discriminator: a replaced-token detection head, no MLM head."""
    arch: Literal["classic", "modern"]
    """BERT's block (classic) or ModernBERT's (modern: pre-norm, GeGLU, RoPE, no biases,
    local/global attention); model/arch.py holds what each one is."""
    local_window: int
    """modern: the span of a local layer's attention window (each token sees +-local_window/2)."""
    global_every: int
    """modern: layers 0, n, 2n ... attend globally, the others locally."""
    rope_base_global: float
    """modern: RoPE base of the global layers."""
    rope_base_local: float
    """modern: RoPE base of the local layers."""

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}")


def shape_of(cfg: BertConfig) -> dict[str, int]:
    """The shape fields of a config, for messages and stats."""
    return {k: getattr(cfg, k) for k in ("vocab_size", "hidden", "layers", "heads", "intermediate")}
