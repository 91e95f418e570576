"""transformers' BERT layout, the classic encoder's (model/arch.py): config.json, parameter names
(q, k and v split where we fuse them), and the names of the checkpoints people publish
(BertModel, BertForMaskedLM, BertForPreTraining, TensorFlow-era LayerNorm gamma/beta). A modern
encoder's layout is ModernBERT's (model/hf_modern.py)."""

from __future__ import annotations

import torch
from torch import nn

from components.model.config import MODERN_DEFAULTS, BertConfig

MODEL_TYPE = "bert"


def has_bert_layout(cfg: BertConfig) -> bool:
    """Whether transformers has this classic encoder: post-norm BERT, not pre-norm."""
    return cfg.norm == "post"


def bert_hf_config(cfg: BertConfig) -> dict:
    """config.json of transformers' BertForPreTraining for this shape; an ELECTRA discriminator
    (no MLM head) is a BertModel to transformers, its RTD head stored under ElectraForPreTraining's
    names beside it."""
    return {
        "architectures": ["BertModel" if cfg.rtd else "BertForPreTraining"],
        "model_type": MODEL_TYPE,
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
    if cfg.rtd:  # ELECTRA's discriminator: its RTD head in place of the MLM head
        names = {k: v for k, v in names.items() if not k.startswith("mlm.")}
        names.update({f"rtd.{ours}.{p}": f"discriminator_predictions.{hf}.{p}"
                      for ours, hf in (("dense", "dense"), ("out", "dense_prediction"))
                      for p in ("weight", "bias")})
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


def bert_state_dict(model: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """A classic pretraining model's weights under transformers' BertForPreTraining names (q/k/v
    split), without the heads named in `skip` (pooler, mlm, nsp, rtd)."""
    if model.cfg.norm != "post":
        raise ValueError("only post-norm encoders have a BertForPreTraining equivalent")
    ours = model.state_dict()
    out = {hf: ours[name] for name, hf in _hf_names(model.cfg).items() if name.split(".")[0] not in skip}
    for i in range(model.cfg.layers):
        for kind in ("weight", "bias"):
            fused, split = _qkv(i, kind)
            out.update(zip(split, ours[fused].chunk(3, dim=0), strict=True))
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def load_bert_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Inverse of bert_state_dict: load transformers-named weights into our classic model.

    The encoder must be complete. A head the state lacks in whole or in part (pooler, mlm, nsp;
    sbo is never in transformers' layout) keeps its initialisation: the names of those heads
    are returned, so the caller can say so and train them.
    """
    names = _hf_names(model.cfg)
    for i in range(model.cfg.layers):
        for kind in ("weight", "bias"):
            fused, split = _qkv(i, kind)
            names.update({f"{fused}#{j}": hf for j, hf in enumerate(split)})
    require_encoder(names, state)
    fresh = sorted({ours.split(".")[0] for ours, hf in names.items() if hf not in state})
    new = {ours: state[hf] for ours, hf in names.items()
           if "#" not in ours and ours.split(".")[0] not in fresh}
    for i in range(model.cfg.layers):
        for kind in ("weight", "bias"):
            fused, split = _qkv(i, kind)
            new[fused] = torch.cat([state[k] for k in split], dim=0)
    if model.mlm is not None:
        new["mlm.decoder.weight"] = new["encoder.embeddings.word.weight"]  # the tied decoder
    _, unexpected = model.load_state_dict(new, strict=False)
    assert not unexpected, unexpected
    return fresh + (["sbo"] if model.sbo is not None else [])


def bert_task_state_dict(shell: nn.Module, ours: dict[str, torch.Tensor],
                         kind: str) -> dict[str, torch.Tensor]:
    """A task model's encoder and pooler (`ours`, its state) under BertForSequenceClassification's
    names, through `shell`, a pretraining model holding its encoder; a token model's without the
    pooler (BertForTokenClassification has none). The classifier is the caller's."""
    pooler = {k[len("pooler."):]: v for k, v in ours.items() if k.startswith("pooler.")}
    if pooler:
        shell.pooler.load_state_dict(pooler)
    keep = "bert." if kind != "token" else ("bert.embeddings.", "bert.encoder.")
    return {k: v for k, v in bert_state_dict(shell).items() if k.startswith(keep)}


def require_encoder(names: dict[str, str], state: dict[str, torch.Tensor]) -> None:
    """KeyError naming the first encoder tensors (ours -> transformers' `names`) `state` lacks."""
    missing = [hf for ours, hf in names.items() if ours.startswith("encoder.") and hf not in state]
    if missing:
        raise KeyError(f"the encoder is incomplete: no {', '.join(missing[:3])}"
                       f"{' ...' if len(missing) > 3 else ''}")


def config_from_bert(hf: dict) -> BertConfig:
    """Our classic BertConfig from a BERT config.json (KeyError: a missing shape key; ValueError:
    a BERT this encoder is not). A key it leaves out is transformers' BertConfig default; a BERT
    is post-norm, with no SBO or RTD head."""
    unsupported = {"model_type": (MODEL_TYPE,), "hidden_act": ("gelu",),
                   "position_embedding_type": ("absolute",)}
    for key, allowed in unsupported.items():
        if hf.get(key, allowed[0]) not in allowed:
            raise ValueError(f"{key} is {hf[key]!r}; this pipeline reads {key}: {' or '.join(allowed)}")
    return BertConfig(
        arch="classic", vocab_size=hf["vocab_size"], hidden=hf["hidden_size"],
        layers=hf["num_hidden_layers"], heads=hf["num_attention_heads"],
        intermediate=hf["intermediate_size"], max_position=hf["max_position_embeddings"],
        type_vocab=hf.get("type_vocab_size", 2), dropout=hf.get("hidden_dropout_prob", 0.1),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12), init_std=hf.get("initializer_range", 0.02),
        pad_id=hf.get("pad_token_id") or 0, norm="post", position_init="random", sbo=False, rtd=False,
        **MODERN_DEFAULTS)


def normalize_bert_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors of BertModel / BertForMaskedLM / BertForPreTraining under BertForPreTraining's names.

    Dropped: the position_ids buffer and the decoder weight, which BERT ties to the token
    embeddings (our MLM head always does).
    """
    out = {}
    for key, value in state.items():
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if not key.startswith(("bert.", "cls.")):
            key = "bert." + key  # BertModel: no prefix
        if key.endswith("position_ids") or key == "cls.predictions.decoder.weight":
            continue
        if key == "cls.predictions.decoder.bias":
            key = "cls.predictions.bias"
        out[key] = value
    return out
