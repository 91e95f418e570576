"""transformers' ModernBERT layout (ModernBertForMaskedLM, ModernBertModel), the modern
encoder's (model/arch.py): config.json and parameter names. The encoder and MLM head map one to
one (q, k and v are fused in both); the pooler and NSP head of a modern pretraining model have
no place there and are not exported."""

from __future__ import annotations

import torch
from torch import nn

from components.model.config import MODERN_DEFAULTS, BertConfig
from components.model.hf_layout import require_encoder

MODEL_TYPE = "modernbert"


def hf_modern_config(cfg: BertConfig) -> dict:
    """config.json of transformers' ModernBERT for this shape (the per-layer-type RoPE bases as
    transformers >= 5 reads them, and the flat keys older versions read)."""
    layer_types = ["full_attention" if i % cfg.global_every == 0 else "sliding_attention"
                   for i in range(cfg.layers)]
    return {
        "architectures": ["ModernBertForMaskedLM"],
        "model_type": MODEL_TYPE,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "intermediate_size": cfg.intermediate,
        "hidden_activation": "gelu",
        "max_position_embeddings": cfg.max_position,
        "initializer_range": cfg.init_std,
        "norm_eps": cfg.layer_norm_eps,
        "norm_bias": False,
        "attention_bias": False,
        "mlp_bias": False,
        "decoder_bias": True,
        "classifier_bias": False,
        "classifier_activation": "gelu",
        "classifier_pooling": "cls",
        **dict.fromkeys(("attention_dropout", "embedding_dropout", "mlp_dropout",
                         "classifier_dropout"), cfg.dropout),
        "pad_token_id": cfg.pad_id,
        # transformers' defaults are ModernBERT's own vocabulary's ids; the tokenizer says ours.
        **dict.fromkeys(("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")),
        "local_attention": cfg.local_window,
        "global_attn_every_n_layers": cfg.global_every,
        "layer_types": layer_types,
        "global_rope_theta": cfg.rope_base_global,
        "local_rope_theta": cfg.rope_base_local,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_base_global},
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_base_local},
        },
        "tie_word_embeddings": True,
    }


# What our modern encoder is; a checkpoint that differs would load and compute something else.
FIXED = {"hidden_activation": "gelu", "attention_bias": False, "mlp_bias": False, "norm_bias": False}


def config_from_hf_modern(hf: dict) -> BertConfig:
    """Our modern BertConfig from a ModernBERT config.json (KeyError: a missing shape key;
    ValueError: a ModernBERT this encoder is not)."""
    for key, ours in FIXED.items():
        if hf.get(key, ours) != ours:
            raise ValueError(f"{key} is {hf[key]!r}; this pipeline's modern encoder has {key}: {ours}")
    rope = hf.get("rope_parameters") or {}
    if any(r.get("rope_type", "default") != "default" for r in rope.values()):
        raise ValueError("rope_parameters has a rope_type other than default (scaled RoPE)")
    if hf.get("head_dim") not in (None, hf["hidden_size"] // hf["num_attention_heads"]):
        raise ValueError(f"head_dim is {hf['head_dim']}, not hidden_size / num_attention_heads")
    heads = hf["num_attention_heads"]
    if (hf["hidden_size"] // heads) % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions: the head size hidden_size / "
                         f"num_attention_heads = {hf['hidden_size'] // heads} must be even")
    every = hf.get("global_attn_every_n_layers", MODERN_DEFAULTS["global_every"])
    if types := hf.get("layer_types"):  # transformers >= 5 writes the pattern out
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        every = full[1] - full[0] if len(full) > 1 else len(types)
        if [t == "full_attention" for t in types] != [i % every == 0 for i in range(len(types))]:
            raise ValueError("layer_types is not one global layer every n layers from the first")
    rope_global = hf.get("global_rope_theta", MODERN_DEFAULTS["rope_base_global"])
    rope_local = hf.get("local_rope_theta", MODERN_DEFAULTS["rope_base_local"])
    # norm, position_init: inert in a modern encoder (pre-norm, RoPE), recorded as BERT's
    return BertConfig(
        arch="modern", vocab_size=hf["vocab_size"], hidden=hf["hidden_size"],
        layers=hf["num_hidden_layers"], heads=heads,
        intermediate=hf["intermediate_size"], max_position=hf.get("max_position_embeddings", 8192),
        dropout=hf.get("mlp_dropout", 0.0), layer_norm_eps=hf.get("norm_eps", 1e-5),
        init_std=hf.get("initializer_range", 0.02), pad_id=hf.get("pad_token_id") or 0,
        norm="post", position_init="random", sbo=False, rtd=False,
        local_window=hf.get("local_attention", MODERN_DEFAULTS["local_window"]), global_every=every,
        rope_base_global=rope.get("full_attention", {}).get("rope_theta", rope_global),
        rope_base_local=rope.get("sliding_attention", {}).get("rope_theta", rope_local))


def modern_names(cfg: BertConfig) -> dict[str, str]:
    """Our parameter names -> ModernBertForMaskedLM's (encoder and MLM head)."""
    names = {
        "encoder.embeddings.word.weight": "model.embeddings.tok_embeddings.weight",
        "encoder.embeddings.norm.weight": "model.embeddings.norm.weight",
        "encoder.final_norm.weight": "model.final_norm.weight",
        "mlm.dense.weight": "head.dense.weight",
        "mlm.norm.weight": "head.norm.weight",
        "mlm.bias": "decoder.bias",
    }
    block = {"attn_norm": "attn_norm", "attn.qkv": "attn.Wqkv", "attn.out": "attn.Wo",
             "ff_norm": "mlp_norm", "ff_in": "mlp.Wi", "ff_out": "mlp.Wo"}
    for i in range(cfg.layers):
        for ours, hf in block.items():
            if i or ours != "attn_norm":  # the first block has no attention norm
                names[f"encoder.blocks.{i}.{ours}.weight"] = f"model.layers.{i}.{hf}.weight"
    return names


def modern_state_dict(model: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """A modern pretraining model's weights under ModernBertForMaskedLM's names, without the heads
    named in `skip` (the pooler and NSP head have no names there)."""
    ours = model.state_dict()
    return {hf: ours[name].detach().contiguous().clone()
            for name, hf in modern_names(model.cfg).items() if name.split(".")[0] not in skip}


def load_modern_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Inverse of modern_state_dict: load ModernBertForMaskedLM-named weights into our modern
    model; returns the heads that keep their initialisation, the pooler and NSP head always
    (fine-tuning starts its heads from the MLM head's transform, as transformers does)."""
    names = modern_names(model.cfg)
    require_encoder(names, state)
    fresh = sorted({"pooler", "nsp"} | {ours.split(".")[0] for ours, hf in names.items() if hf not in state})
    new = {ours: state[hf] for ours, hf in names.items() if ours.split(".")[0] not in fresh}
    if "mlm" not in fresh:
        new["mlm.decoder.weight"] = new["encoder.embeddings.word.weight"]  # the tied decoder
    _, unexpected = model.load_state_dict(new, strict=False)
    assert not unexpected, unexpected
    return fresh + (["sbo"] if model.sbo is not None else [])


def modern_task_state_dict(shell: nn.Module, ours: dict[str, torch.Tensor],
                           kind: str) -> dict[str, torch.Tensor]:
    """A task model's encoder (`ours`, its state, through `shell`, a pretraining model holding
    it) under ModernBertModel's names (`model.`), and its pooler or token head as
    ModernBertFor*Classification's head transform (`head.`). The classifier is the caller's."""
    state = {k: v for k, v in modern_state_dict(shell).items() if k.startswith("model.")}
    transform = "pooler." if kind != "token" else "head."
    state.update({"head." + k[len(transform):]: v.contiguous() for k, v in ours.items()
                  if k.startswith(transform)})
    return state


def normalize_modern_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors of ModernBertModel / ModernBertForMaskedLM under ModernBertForMaskedLM's names;
    the decoder weight (tied to the token embeddings) dropped."""
    out = {}
    for key, value in state.items():
        if key.startswith(("embeddings.", "layers.", "final_norm.")):
            key = "model." + key  # ModernBertModel: no prefix
        if key != "decoder.weight":
            out[key] = value
    return out


def is_modern_state(state: dict[str, torch.Tensor]) -> bool:
    """Whether a state dict holds ModernBERT's tensors."""
    return any(k.endswith("embeddings.tok_embeddings.weight") for k in state)
