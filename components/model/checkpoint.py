"""Stage `checkpoint`: bring an existing BERT checkpoint into the pipeline (`pretrain.init_from`).

Most encoders are not pretrained from nothing: a public BERT-family checkpoint is continued on
the user's text, then fine-tuned. `pretrain.init_from` names one: a packaged checkpoint
(model/packaged.py, installed like the data packages of docs/stages.md) or a folder in transformers'
layout (config.json, model.safetensors, tokenizer.json or vocab.txt). Weights are `BertModel`,
`BertForMaskedLM` or `BertForPreTraining`; heads it lacks start fresh in the pretrain stage.

Output folder (read by the tokenizer, pretrain and finetune stages), in the layout of the
pretrain stage's export: model.safetensors (the checkpoint's tensors under
BertForPreTraining's names), config.json, the tokenizer files, and bertflow.json
(model.metadata.CheckpointInfo). With `init_from` empty, only bertflow.json.

With a checkpoint, the tokenizer stage adopts its tokenizer (model/checkpoint_tokenizer.py)
instead of learning one: the checkpoint's embeddings index that vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from dataclasses import replace
from pathlib import Path

import torch

from components.core.errors import ConfigError, DataError
from components.core.io import atomic_dir, write_json
from components.data.tokenizer import (
    transformers_files,
    write_vocab,
)
from components.model import hf_layout, hf_modern
from components.model.arch import arch_of
from components.model.build import build_model
from components.model.checkpoint_tokenizer import checkpoint_tokenizer
from components.model.config import BertConfig
from components.model.folders import load_pretraining_model, read_weights
from components.model.metadata import CheckpointInfo, read_checkpoint_info, write_info
from components.model.packaged import source_dir

log = logging.getLogger(__name__)

LAYER = re.compile(r"(.*\.encoder\.layer\.)(\d+)(\..*)")  # BertForPreTraining's names of a block's tensors


def config_from_hf(path: Path) -> BertConfig:
    """Our BertConfig from a transformers config.json, BERT's or ModernBERT's (its model_type
    says which); anything our encoders can't be, refused."""
    try:
        hf = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: missing; a checkpoint folder needs config.json") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e})") from None
    modern = hf.get("model_type") == hf_modern.MODEL_TYPE
    try:
        return hf_modern.config_from_hf_modern(hf) if modern else hf_layout.config_from_bert(hf)
    except KeyError as e:
        family = "ModernBERT" if modern else "BERT"
        raise DataError(f"{path}: no {e.args[0]}; not a {family} config") from None
    except ValueError as e:
        raise DataError(f"{path}: {e}") from None


def normalize_hf_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A published checkpoint's tensors (transformers' base or pretraining model, BERT's or
    ModernBERT's) under the names of its pretraining model."""
    if hf_modern.is_modern_state(state):
        return hf_modern.normalize_modern_names(state)
    return hf_layout.normalize_bert_names(state)


def load_checkpoint(folder: Path, cfg: BertConfig):
    """A BertForPretraining of shape `cfg` with the checkpoint's weights (shapes checked) and
    the names of the heads it lacks, which keep their fresh initialisation."""
    weights, config = Path(folder) / "model.safetensors", Path(folder) / "config.json"
    if not config.exists():  # a pre-norm encoder of ours: our own names, every head present
        return load_pretraining_model(folder, cfg), []
    state = normalize_hf_names(read_weights(weights))
    model = build_model(cfg)  # the heads it lacks keep this initialisation (the arch's own)
    arch = arch_of(cfg)
    shapes = (f"hidden_size={cfg.hidden}, num_hidden_layers={cfg.layers}, "
              f"intermediate_size={cfg.intermediate}, vocab_size={cfg.vocab_size}, "
              f"max_position_embeddings={cfg.max_position}")
    expected = arch.hf_state_dict(model)
    for key, tensor in expected.items():
        if key in state and state[key].shape != tensor.shape:
            raise DataError(f"{weights}: {key} has shape {tuple(state[key].shape)}, but {config} "
                            f"({shapes}) needs {tuple(tensor.shape)}")
    unused = sorted(set(state) - set(expected))
    if unused:
        log.info("checkpoint %s: not used (not BERT's encoder or pretraining heads): %s",
                 folder, ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else ""))
    try:
        fresh = arch.load_hf_state_dict(model, state)
    except KeyError as e:
        raise DataError(f"{weights}: {e.args[0]}") from None
    return model, fresh


def import_checkpoint(init_from: str, root: Path, packages_dir: Path, out_dir: Path) -> dict:
    """Check the checkpoint `init_from` names and write it to `out_dir` in the pipeline's layout."""
    from safetensors.torch import save_file

    if not init_from:
        with atomic_dir(out_dir) as tmp:
            write_info(tmp, CheckpointInfo(init_from=""))
        return {"init_from": ""}
    src = source_dir(init_from, root, packages_dir)
    cfg = config_from_hf(src / "config.json")
    model, fresh = load_checkpoint(src, cfg)
    tok = checkpoint_tokenizer(src, cfg.vocab_size)
    info = CheckpointInfo(
        init_from=init_from, config=cfg,
        source=str(src.relative_to(root)) if src.is_relative_to(root) else str(src),
        source_sha256=hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest(),
        fresh_heads=fresh, parameters=sum(p.numel() for p in model.parameters()))
    with atomic_dir(out_dir) as tmp:
        save_file(arch_of(cfg).hf_state_dict(model, skip=tuple(fresh)), tmp / "model.safetensors",
                  metadata={"format": "pt"})
        write_json(tmp / "config.json", arch_of(cfg).hf_config(cfg))
        tok.save(str(tmp / "tokenizer.json"))
        write_vocab(tok, tmp)
        lowercase = (json.loads(tok.to_str())["normalizer"] or {}).get("lowercase", False)
        transformers_files("wordpiece", bool(lowercase), tmp,
                           cfg.max_position)
        write_info(tmp, info)
    log.info("checkpoint %s: %s parameters, %d layers x %d hidden, vocabulary %d; heads it lacks "
             "start fresh in pretraining: %s", init_from, f"{info.parameters:,}", cfg.layers,
             cfg.hidden, cfg.vocab_size, ", ".join(fresh) or "none")
    return {"init_from": init_from, "source": info.source, "source_sha256": info.source_sha256,
            "fresh_heads": fresh, "parameters": info.parameters, "layers": cfg.layers,
            "hidden": cfg.hidden, "heads": cfg.heads, "vocab_size": cfg.vocab_size,
            "max_position": cfg.max_position}


def cut_checkpoint(src: Path, layers: list[int], out_dir: Path) -> BertConfig:
    """The checkpoint in `src` (this stage's layout) with only the encoder blocks `layers`,
    renumbered in order, written to `out_dir`: a student that starts as a piece of its teacher,
    as DistilBERT's did. Returns the cut's shape."""
    from safetensors.torch import save_file

    info = read_checkpoint_info(src)
    cfg = info.config
    if not arch_of(cfg).cuts:
        raise ConfigError(f"distill.student_layers: {src} is a {cfg.arch} encoder; only a classic one is cut")
    if not layers or layers[-1] >= cfg.layers:
        raise ConfigError(f"distill.student_layers {layers}: {src} has layers 0 to {cfg.layers - 1}")
    kept = {}
    for key, tensor in read_weights(src / "model.safetensors").items():
        block = LAYER.fullmatch(key)
        if block is None:
            kept[key] = tensor
        elif int(block[2]) in layers:
            kept[f"{block[1]}{layers.index(int(block[2]))}{block[3]}"] = tensor
    cut = replace(cfg, layers=len(layers))
    with atomic_dir(out_dir) as tmp:
        for path in Path(src).glob("[!.]*"):  # the tokenizer's files (not the folder's marks)
            shutil.copy2(path, tmp / path.name)
        save_file(kept, tmp / "model.safetensors", metadata={"format": "pt"})
        write_json(tmp / "config.json", arch_of(cut).hf_config(cut))
        write_info(tmp, replace(info, config=cut, parameters=sum(t.numel() for t in kept.values())))
    return cut
