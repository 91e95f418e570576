"""A fine-tuned classification, pair or token model in transformers' layout:
`BertForSequenceClassification` / `BertForTokenClassification` (a modern encoder:
`ModernBertFor...`) with `id2label`, loadable with `from_pretrained(dir)` and `pipeline(...)`
offline. Span models (and token models with a CRF) have no transformers equivalent.
"""

from __future__ import annotations

from pathlib import Path

from components.core.errors import DataError
from components.core.io import atomic_dir, write_json
from components.model.arch import arch_of
from components.model.folders import copy_tokenizer, read_weights
from components.model.metadata import read_task_model_info
from components.model.pretraining import BertForPretraining

# transformers' task model of each kind, after the family's name (Bert, ModernBert)
HEADS = {"classification": "ForSequenceClassification", "pair": "ForSequenceClassification",
         "token": "ForTokenClassification"}


def export_hf(model_dir: Path, out_dir: Path, name: str | None = None) -> dict:
    """Write the exported task model at `model_dir` to `out_dir` in transformers' layout;
    errors name the model as `name` (default: its folder)."""
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    name = name or str(model_dir)
    info = read_task_model_info(model_dir)
    kind, cfg = info.task.kind, info.config
    arch = arch_of(cfg)
    if kind not in HEADS:
        raise DataError(f"{name}: a {kind} model has no transformers equivalent")
    if info.crf:
        raise DataError(f"{name}: a token model with a CRF has no transformers equivalent "
                        "(its decoding is not a per-token argmax)")
    if not arch.has_hf_layout(cfg):
        raise DataError(f"{name}: a pre-norm BERT encoder has no transformers equivalent")
    ours = read_weights(model_dir / "model.safetensors")
    # Our encoder (and pooler) go through a pretraining model to get transformers' names.
    shell = BertForPretraining(cfg)
    shell.encoder.load_state_dict({k.removeprefix("encoder."): v for k, v in ours.items()
                                   if k.startswith("encoder.")})
    state = arch.hf_task_state_dict(shell, ours, kind)
    state.update({k: ours[k].contiguous() for k in ("classifier.weight", "classifier.bias")})
    id2label = dict(enumerate(info.space))
    architecture = arch.hf_name + HEADS[kind]
    config = {**arch.hf_config(cfg), "architectures": [architecture], "id2label": id2label,
              "label2id": {label: i for i, label in id2label.items()}}
    with atomic_dir(out_dir) as tmp:
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        write_json(tmp / "config.json", config)
        copy_tokenizer(model_dir, tmp)
    return {"kind": kind, "architecture": architecture, "labels": len(id2label)}
