"""What a model folder holds besides its record: weights (safetensors: loading can't run
code), the tokenizer it was trained with, and for an encoder transformers' config.json. Folders
are written whole or not at all; the record is model/metadata.py's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from components.core.errors import DataError
from components.core.io import atomic_dir, write_json
from components.data.tokenizer import PAD, TOKENIZER_FILES, load
from components.model.arch import arch_of
from components.model.config import BertConfig
from components.model.metadata import INFO_FILE, EncoderInfo, TaskModelInfo, write_info
from components.model.pretraining import BertForPretraining


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


def load_tokenizer(folder: Path, cfg: BertConfig):
    """The tokenizer saved with a model, checked against the model: a tokenizer from another
    training would index the wrong embeddings (or past the end of them) without a word."""
    tokenizer = load(folder)
    size, pad = tokenizer.get_vocab_size(), tokenizer.token_to_id(PAD)
    if size != cfg.vocab_size or pad != cfg.pad_id:
        raise DataError(f"{folder}: the tokenizer does not match the model: {size} tokens "
                        f"({PAD} = {pad}) against a vocabulary of {cfg.vocab_size} "
                        f"({PAD} = {cfg.pad_id}); the two were not trained together")
    return tokenizer


def copy_tokenizer(src: Path, dst: Path) -> None:
    """The tokenizer files of folder `src` (those it has) into folder `dst`."""
    for name in TOKENIZER_FILES:
        if (Path(src) / name).exists():
            shutil.copy(Path(src) / name, Path(dst) / name)


def write_encoder(model: BertForPretraining, info: EncoderInfo, tokenizer_dir: Path, out_dir: Path) -> None:
    """An encoder folder: safetensors + config.json in transformers' layout (BertForPreTraining,
    or ModernBertForMaskedLM for a modern encoder; a pre-norm BERT has no equivalent and keeps
    our names), tokenizer, record."""
    from safetensors.torch import save_file

    arch = arch_of(info.config)
    with atomic_dir(out_dir) as tmp:
        if arch.has_hf_layout(info.config):
            save_file(arch.hf_state_dict(model), tmp / "model.safetensors", metadata={"format": "pt"})
            write_json(tmp / "config.json", arch.hf_config(info.config))
        else:
            save_file({k: v.contiguous() for k, v in model.state_dict().items()
                       if k != "mlm.decoder.weight"}, tmp / "model.safetensors")
        for f in Path(tokenizer_dir).iterdir():
            if f.name not in ("model.safetensors", "config.json", INFO_FILE):  # tokenizer files only
                shutil.copy(f, tmp / f.name)
        write_info(tmp, info)


def load_pretraining_model(folder: Path, cfg: BertConfig) -> BertForPretraining:
    """An exported encoder (or imported checkpoint) with its pretraining heads, weights loaded;
    heads a checkpoint lacks stay as initialised (fine-tuning does not use them)."""
    state = read_weights(Path(folder) / "model.safetensors")
    model = BertForPretraining(cfg)
    if (Path(folder) / "config.json").exists():  # transformers' names
        arch_of(cfg).load_hf_state_dict(model, state)
    else:
        if not cfg.rtd:  # the tied decoder (an ELECTRA discriminator has no MLM head)
            state["mlm.decoder.weight"] = state["encoder.embeddings.word.weight"]
        model.load_state_dict(state)
    return model


def write_task_model(model: torch.nn.Module, info: TaskModelInfo, tokenizer_dir: Path, out: Path) -> None:
    """A task model folder (`out` must not exist yet; the stage writes inside its temp folder)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / "model.safetensors")
    copy_tokenizer(tokenizer_dir, out)
    write_info(out, info)
