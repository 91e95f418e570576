"""The BERT encoder and its heads, in plain torch (no Lightning, no I/O).

One factory, `build_model(cfg, head=...)`, builds the encoder for pretraining and for every
fine-tuning head. Shapes in comments: B batch, T sequence length, H hidden, N selected (masked)
positions in the batch, V vocabulary.

The parameter layout maps one to one onto Hugging Face's BertForPreTraining (`hf_state_dict`),
so an exported encoder loads in `transformers` with no missing or unexpected keys (post-norm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

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

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}")


class Embeddings(nn.Module):
    """Token + learned absolute position + segment embeddings, then LayerNorm and dropout."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden, padding_idx=cfg.pad_id)
        self.position = nn.Embedding(cfg.max_position, cfg.hidden)
        self.token_type = nn.Embedding(cfg.type_vocab, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        T = input_ids.shape[1]
        pos = self.position.weight[:T] if position_ids is None else self.position(position_ids)
        x = self.word(input_ids) + pos + self.token_type(token_type_ids)
        return self.drop(self.norm(x))  # (B, T, H)


class SelfAttention(nn.Module):
    """Bidirectional multi-head attention through SDPA, with a padding mask and no causal mask."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)  # one matmul for q, k and v
        self.out = nn.Linear(cfg.hidden, cfg.hidden)
        self.p = cfg.dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, H = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)
        # q, k, v: (B, heads, T, H/heads); mask: (B, 1, 1, T), True where attention may look.
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=self.p if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, H))


class Block(nn.Module):
    """Attention and feed-forward sublayers with residuals; post-norm (BERT) or pre-norm."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.attn_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.ff_in = nn.Linear(cfg.hidden, cfg.intermediate)
        self.ff_out = nn.Linear(cfg.intermediate, cfg.hidden)
        self.ff_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.pre = cfg.norm == "pre"

    def _ff(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff_out(F.gelu(self.ff_in(x)))  # exact (erf) GELU, as BERT

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.pre:
            x = x + self.drop(self.attn(self.attn_norm(x), mask))
            return x + self.drop(self._ff(self.ff_norm(x)))
        x = self.attn_norm(x + self.drop(self.attn(x, mask)))
        return self.ff_norm(x + self.drop(self._ff(x)))


class Encoder(nn.Module):
    """Embeddings and the stack of blocks: token ids in, contextual vectors out."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        # Pre-norm leaves the residual stream unnormalised: one LayerNorm at the top.
        self.final_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.final_norm(x) if self.final_norm is not None else x  # (B, T, H)


class Pooler(nn.Module):
    """tanh dense layer on the [CLS] vector."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))  # (B, H)


class MLMHead(nn.Module):
    """dense + GELU + LayerNorm, then the decoder tied to the token embeddings, plus a bias."""

    def __init__(self, cfg: BertConfig, embeddings: nn.Embedding):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.decoder = embeddings  # tied: the (V, H) weight is shared, not copied
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # h: (N, H) at selected positions only; the (N, V) projection dominates the cost, so it
        # is never computed for the ~85% of positions that carry no label.
        return F.linear(self.norm(F.gelu(self.dense(h))), self.decoder.weight, self.bias)


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


class BertForPretraining(nn.Module):
    """Encoder + pooler + MLM head (+ NSP head, + SBO head): returns the losses and what
    the metrics need."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.pooler = Pooler(cfg)
        self.mlm = MLMHead(cfg, self.encoder.embeddings.word)
        self.nsp = nn.Linear(cfg.hidden, 2)
        self.sbo = SpanBoundaryHead(cfg, self.encoder.embeddings.word) if cfg.sbo else None

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor, mlm_labels: torch.Tensor,
                next_sentence_label: torch.Tensor | None = None,
                sbo_left: torch.Tensor | None = None, sbo_right: torch.Tensor | None = None,
                sbo_rel: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        hidden = self.encoder(input_ids, token_type_ids, attention_mask, position_ids)  # (B, T, H)
        selected = mlm_labels != IGNORE  # (B, T)
        targets = mlm_labels[selected]  # (N,)
        logits = self.mlm(hidden[selected])  # (N, V)
        out = {"mlm_loss": F.cross_entropy(logits, targets), "mlm_logits": logits,
               "mlm_targets": targets}
        loss = out["mlm_loss"]
        if next_sentence_label is not None:
            nsp_logits = self.nsp(self.pooler(hidden))  # (B, 2)
            if bool((next_sentence_label >= 0).any()):
                out["nsp_loss"] = F.cross_entropy(nsp_logits, next_sentence_label.long(), ignore_index=-1)
                out["nsp_logits"] = nsp_logits
                loss = loss + out["nsp_loss"]
            else:  # no pairs in this batch (packing, short-sequence phase): the pooler and NSP
                loss = loss + 0.0 * nsp_logits.sum()  # head stay in the graph, as DDP requires
        if self.sbo is not None and sbo_left is not None:
            rows = selected.nonzero()[:, 0]  # (N,) batch row of each selected position
            sbo_logits = self.sbo(hidden[rows, sbo_left[selected]], hidden[rows, sbo_right[selected]],
                                  sbo_rel[selected])
            out["sbo_loss"] = F.cross_entropy(sbo_logits, targets)
            loss = loss + out["sbo_loss"]
        out["loss"] = loss
        return out


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
            nn.init.zeros_(m.bias)


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
    from components import heads

    builders = {
        "pretraining": lambda: BertForPretraining(cfg),
        "encoder": lambda: Encoder(cfg),
        "classification": lambda: heads.SequenceClassifier(cfg, num_labels),
        "token": lambda: heads.TokenClassifier(cfg, num_labels, crf),
        "span": lambda: heads.SpanClassifier(cfg, num_labels, max_span_words),
    }
    if head not in builders:
        raise ValueError(f"unknown head {head!r} (heads: {', '.join(builders)})")
    model = builders[head]()
    init_weights(model, cfg.init_std)
    if cfg.position_init == "sinusoidal":
        # Random positions give near-uniform attention: every token first sees a bag of words.
        # Sinusoids (at the scale of the token embeddings, so they don't drown them) hand
        # attention a distance signal from the first step.
        encoder = model if isinstance(model, Encoder) else model.encoder
        table = sinusoids(cfg.max_position, cfg.hidden)
        with torch.no_grad():
            encoder.embeddings.position.weight.copy_(table * (cfg.init_std / table.std()))
    return model


# --------------------------------------------------------------------- Hugging Face layout

def hf_config(cfg: BertConfig) -> dict:
    """config.json of transformers' BertForPreTraining for this shape."""
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "intermediate_size": cfg.intermediate,
        "hidden_act": "gelu",
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.dropout,
        "max_position_embeddings": cfg.max_position,
        "type_vocab_size": cfg.type_vocab,
        "initializer_range": cfg.init_std,
        "layer_norm_eps": cfg.layer_norm_eps,
        "pad_token_id": cfg.pad_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


def _hf_names(cfg: BertConfig) -> dict[str, str]:
    """Our parameter names -> transformers' BertForPreTraining names (q/k/v handled apart)."""
    names = {
        "encoder.embeddings.word.weight": "bert.embeddings.word_embeddings.weight",
        "encoder.embeddings.position.weight": "bert.embeddings.position_embeddings.weight",
        "encoder.embeddings.token_type.weight": "bert.embeddings.token_type_embeddings.weight",
        "encoder.embeddings.norm.weight": "bert.embeddings.LayerNorm.weight",
        "encoder.embeddings.norm.bias": "bert.embeddings.LayerNorm.bias",
        "pooler.dense.weight": "bert.pooler.dense.weight",
        "pooler.dense.bias": "bert.pooler.dense.bias",
        "mlm.dense.weight": "cls.predictions.transform.dense.weight",
        "mlm.dense.bias": "cls.predictions.transform.dense.bias",
        "mlm.norm.weight": "cls.predictions.transform.LayerNorm.weight",
        "mlm.norm.bias": "cls.predictions.transform.LayerNorm.bias",
        "mlm.bias": "cls.predictions.bias",
        "nsp.weight": "cls.seq_relationship.weight",
        "nsp.bias": "cls.seq_relationship.bias",
    }
    block = {"attn.out": "attention.output.dense", "attn_norm": "attention.output.LayerNorm",
             "ff_in": "intermediate.dense", "ff_out": "output.dense", "ff_norm": "output.LayerNorm"}
    for i in range(cfg.layers):
        for ours, hf in block.items():
            for p in ("weight", "bias"):
                names[f"encoder.blocks.{i}.{ours}.{p}"] = f"bert.encoder.layer.{i}.{hf}.{p}"
    return names


def _qkv(i: int, kind: str) -> tuple[str, list[str]]:
    prefix = f"bert.encoder.layer.{i}.attention.self."
    return f"encoder.blocks.{i}.attn.qkv.{kind}", [f"{prefix}{n}.{kind}" for n in ("query", "key", "value")]


def hf_state_dict(model: BertForPretraining, skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Our pretraining weights under transformers' BertForPreTraining names (q/k/v split),
    without the heads named in `skip` (pooler, mlm, nsp)."""
    if model.cfg.norm != "post":
        raise ValueError("only post-norm encoders have a BertForPreTraining equivalent")
    ours = model.state_dict()
    out = {hf: ours[name] for name, hf in _hf_names(model.cfg).items() if name.split(".")[0] not in skip}
    for i in range(model.cfg.layers):
        for kind in ("weight", "bias"):
            fused, split = _qkv(i, kind)
            out.update(zip(split, ours[fused].chunk(3, dim=0), strict=True))
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def load_hf_state_dict(model: BertForPretraining, state: dict[str, torch.Tensor]) -> list[str]:
    """Inverse of hf_state_dict: load transformers-named weights into our model.

    The encoder must be complete. A head the state lacks in whole or in part (pooler, mlm, nsp;
    sbo is never in transformers' layout) keeps its initialisation: the names of those heads
    are returned, so the caller can say so and train them.
    """
    names = _hf_names(model.cfg)
    for i in range(model.cfg.layers):
        for kind in ("weight", "bias"):
            fused, split = _qkv(i, kind)
            names.update({f"{fused}#{j}": hf for j, hf in enumerate(split)})
    missing = [hf for ours, hf in names.items() if ours.startswith("encoder.") and hf not in state]
    if missing:
        raise KeyError(f"the encoder is incomplete: no {', '.join(missing[:3])}"
                       f"{' ...' if len(missing) > 3 else ''}")
    fresh = sorted({ours.split(".")[0] for ours, hf in names.items() if hf not in state})
    new = {ours: state[hf] for ours, hf in names.items()
           if "#" not in ours and ours.split(".")[0] not in fresh}
    for i in range(model.cfg.layers):
        for kind in ("weight", "bias"):
            fused, split = _qkv(i, kind)
            new[fused] = torch.cat([state[k] for k in split], dim=0)
    new["mlm.decoder.weight"] = new["encoder.embeddings.word.weight"]  # the tied decoder
    _, unexpected = model.load_state_dict(new, strict=False)
    assert not unexpected, unexpected
    return fresh + (["sbo"] if model.sbo is not None else [])


def count_flops_per_token(cfg: BertConfig, seq_len: int, predicted_fraction: float) -> float:
    """Training FLOPs per token (forward + backward = 3x forward) of matmuls and attention."""
    H, L, F_, V = cfg.hidden, cfg.layers, cfg.intermediate, cfg.vocab_size
    per_layer = 2 * (3 * H * H + H * H + 2 * H * F_) + 2 * 2 * seq_len * H  # linears + QK^T, AV
    head = predicted_fraction * 2 * (H * H + H * V)  # sparse MLM head
    return 3 * (L * per_layer + head)

